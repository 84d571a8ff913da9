/* The engine's CUDA forward pass and expert pool; design in engine_cuda.h.
 *
 * One token at a time, as engine/forward.c's engine_seq_forward: the host drives the layers and, at each
 * MoE layer, reads the router's top-k back (one stream synchronization per MoE layer), starts
 * the copies of missing experts on the copy stream, then queues every chosen expert's SwiGLU
 * FFN on the compute stream behind its block's "ready" event. The KV cache is written in place
 * by the K and V projections. Pool blocks form a doubly linked LRU list (front: most recent);
 * a pool has at least top_k blocks, so the tail is never an expert of the layer being run. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/engine_cuda.h"
#include "kernels/cuda/kernels_cuda.h"

namespace {

constexpr uint8_t PREC_SKIP = 0xff;
constexpr size_t POOL_ALIGN_BYTES = 256; /* device block stride: cudaMalloc's alignment */
constexpr int EW_THREADS = 256;          /* elementwise kernels */

/* Kernels of the forward pass that are not model ops (kernels.h has no CPU twin for them; the
 * CPU forward does them inline in engine/forward.c, in the same fp32 arithmetic). */

__global__ void add_kernel(float *x, const float *y, size_t n) { /* x += y */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void axpy_kernel(float *y, float a, const float *x, size_t n) { /* y += a x */
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

__global__ void clamp_kernel(float *x, size_t n, float c) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = fminf(fmaxf(x[i], -c), c);
}

/* y += sigmoid(dot(gate, h)) * eo, the dot in double as forward.c computes it. One block. */
__global__ void shared_gate_kernel(float *y, const float *gate, const float *h, const float *eo,
                                   size_t n) {
    __shared__ double part[EW_THREADS / 32];
    __shared__ float g;
    double d = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) d += (double)gate[i] * h[i];
    for (int o = 16; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = d;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0;
        for (int w = 0; w < EW_THREADS / 32; w++) s += part[w];
        g = (float)(1.0 / (1.0 + exp(-s)));
    }
    __syncthreads();
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) y[i] += g * eo[i];
}

/* imp[t] += mean over heads of probs[h][t], t < n_ctx (forward.c's DyMoE importance update). */
__global__ void importance_kernel(float *imp, const float *probs, unsigned n_heads, size_t n_ctx) {
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_ctx) return;
    float a = 0;
    for (unsigned h = 0; h < n_heads; h++) a += probs[(size_t)h * n_ctx + t];
    imp[t] += a / (float)n_heads;
}

unsigned ew_blocks(size_t n) { return (unsigned)((n + EW_THREADS - 1) / EW_THREADS); }

void add_into(float *x, const float *y, size_t n, cudaStream_t s) {
    add_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(x, y, n);
    CUDA_LAUNCH_CHECK();
}

size_t mat_bytes(const ecu_mat &m) {
    size_t rows = m.rows, cols = m.cols;
    switch (m.kind) {
    case ECU_F32:
        return rows * cols * 4;
    case ECU_BF16:
        return rows * cols * 2;
    case ECU_Q8:
        return rows * (cols / 64) * 68;
    case ECU_Q4:
        return rows * (cols / 64) * 36;
    case ECU_Q2:
        return rows * (cols / 64) * 20;
    }
    CUDA_REQUIRE(!"unknown matrix kind");
    return 0;
}

moesim_precision prec_of_kind(uint32_t kind) {
    switch (kind) {
    case ECU_Q8:
        return PREC_INT8;
    case ECU_Q4:
        return PREC_INT4;
    case ECU_Q2:
        return PREC_INT2;
    }
    CUDA_REQUIRE(!"not a quantized kind");
    return PREC_BF16;
}

/* A device matrix: kind and shape of its host twin, data on the device. */
struct dmat {
    uint32_t kind = ECU_F32;
    void *data = nullptr;
    uint32_t rows = 0, cols = 0;
};

/* y = W x on the device, dispatching on the storage kind. */
void dmat_matvec(float *y, const dmat &w, const float *x, cudaStream_t s) {
    switch (w.kind) {
    case ECU_F32:
        kern_matvec_f32_cuda(y, static_cast<const float *>(w.data), x, w.rows, w.cols, s);
        break;
    case ECU_BF16:
        kern_matvec_bf16_cuda(y, static_cast<const uint16_t *>(w.data), x, w.rows, w.cols, s);
        break;
    default:
        kern_matvec_quant_cuda(y, prec_of_kind(w.kind), w.data, x, w.rows, w.cols, s);
    }
}

struct dlayer {
    float *attn_norm = nullptr, *ffn_norm = nullptr;
    float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr, *o_bias = nullptr;
    uint32_t attn_window = 0; /* the last attn_window positions; 0: all */
    float *q_norm = nullptr, *k_norm = nullptr;
    dmat wq, wk, wv, wo, router;
    dmat shared[ECU_PARTS], dense[ECU_PARTS];
    float *shared_gate = nullptr;
};

/* One pool block: which (MoE layer, expert, precision) it holds, its LRU links, its events. */
struct pool_block {
    int64_t key = -1; /* (m * n_experts + j) * ECU_PRECS + p, -1: empty */
    int32_t prev = -1, next = -1;
    cudaEvent_t ready = nullptr; /* copy done (recorded on the copy stream) */
    cudaEvent_t done = nullptr;  /* last kernel reading it done (recorded on compute) */
};

/* Where an expert's three matrices sit inside its blob, and their kinds. */
struct blob_layout {
    bool held = false;
    uint32_t kind[ECU_PARTS];
    uint32_t rows[ECU_PARTS], cols[ECU_PARTS];
    size_t offset[ECU_PARTS];
    size_t bytes = 0;
};

} // namespace

struct engine_cuda {
    ecu_model cfg{};
    uint32_t moe_index[256] = {};
    cudaStream_t compute = nullptr, copy = nullptr;
    void *owned[8192] = {}; /* device allocations of the resident weights */
    size_t n_owned = 0;
    dlayer *layers = nullptr;
    float *final_norm = nullptr;
    dmat lm_head;
    /* experts */
    blob_layout layout[ECU_PRECS];
    uint8_t *host_experts[ECU_PRECS] = {}; /* pinned: [n_moe][n_experts][layout[p].bytes] */
    uint8_t *pool = nullptr;               /* device: [n_blocks][block_stride] */
    size_t block_stride = 0;
    uint32_t n_blocks = 0;
    pool_block *blocks = nullptr;
    int32_t *slot_of = nullptr; /* [n_moe][n_experts][ECU_PRECS] block index or -1 */
    int32_t lru_head = -1, lru_tail = -1;
    uint64_t hits = 0, misses = 0, h2d_bytes = 0;
    /* scratch */
    float *x = nullptr, *h = nullptr, *tmp = nullptr, *y = nullptr, *eo = nullptr;
    float *q = nullptr, *att = nullptr, *ff_gate = nullptr, *ff_up = nullptr;
    float *r_logits = nullptr, *r_probs = nullptr, *r_vals = nullptr, *logits = nullptr;
    uint32_t *r_ids = nullptr;
    float *h_x = nullptr, *h_vals = nullptr, *h_logits = nullptr; /* pinned staging */
    uint32_t *h_ids = nullptr;
};

struct engine_cuda_seq {
    engine_cuda *g;
    uint32_t max_ctx;
    float *k, *v;      /* [n_layers][max_ctx][kv_dim] */
    float *importance; /* [n_moe][max_ctx] */
    float *probs;      /* [n_heads][max_ctx] */
};

namespace {

int fail(char *msg, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* cudaMalloc that reports instead of aborting: running out of device memory is the user's
 * choice of model and pool size. */
int dev_alloc(engine_cuda *g, void **p, size_t bytes, const char *what, char *msg, size_t len) {
    *p = nullptr;
    if (!bytes) return 0;
    if (g->n_owned == sizeof g->owned / sizeof g->owned[0])
        return fail(msg, len, "GPU: more than %zu resident tensors", g->n_owned);
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *p = nullptr;
        return fail(msg, len, "GPU: cannot allocate %.1f MiB for %s: %s", bytes / 1048576.0, what,
                    cudaGetErrorString(e));
    }
    g->owned[g->n_owned++] = *p;
    return 0;
}

int upload(engine_cuda *g, void **dst, const void *src, size_t bytes, const char *what, char *msg,
           size_t len) {
    if (!src) {
        *dst = nullptr;
        return 0;
    }
    if (dev_alloc(g, dst, bytes, what, msg, len)) return -1;
    CUDA_CHECK(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
}

int upload_vec(engine_cuda *g, float **dst, const float *src, size_t n, char *msg, size_t len) {
    return upload(g, reinterpret_cast<void **>(dst), src, n * sizeof(float), "a weight vector", msg,
                  len);
}

int upload_mat(engine_cuda *g, dmat *d, const ecu_mat &m, char *msg, size_t len) {
    d->kind = m.kind;
    d->rows = m.rows;
    d->cols = m.cols;
    if (!m.data) return 0;
    return upload(g, &d->data, m.data, mat_bytes(m), "a weight matrix", msg, len);
}

/* LRU list: unlink / push to the front. */
void lru_unlink(engine_cuda *g, int32_t b) {
    pool_block &k = g->blocks[b];
    if (k.prev >= 0)
        g->blocks[k.prev].next = k.next;
    else
        g->lru_head = k.next;
    if (k.next >= 0)
        g->blocks[k.next].prev = k.prev;
    else
        g->lru_tail = k.prev;
    k.prev = k.next = -1;
}
void lru_push_front(engine_cuda *g, int32_t b) {
    pool_block &k = g->blocks[b];
    k.prev = -1;
    k.next = g->lru_head;
    if (g->lru_head >= 0) g->blocks[g->lru_head].prev = b;
    g->lru_head = b;
    if (g->lru_tail < 0) g->lru_tail = b;
}

const uint8_t *host_blob(const engine_cuda *g, uint32_t m, uint32_t j, uint32_t p) {
    return g->host_experts[p] + ((size_t)m * g->cfg.n_experts + j) * g->layout[p].bytes;
}

/* The block holding expert j of MoE layer m at precision p, starting its copy on the copy stream
 * when missing (*loaded true): the caller makes the compute stream wait for the block's `ready`
 * event right before the first kernel that reads it, so later copies overlap earlier compute. */
int32_t pool_acquire(engine_cuda *g, uint32_t m, uint32_t j, uint32_t p, bool *loaded) {
    size_t slot = ((size_t)m * g->cfg.n_experts + j) * ECU_PRECS + p;
    int32_t b = g->slot_of[slot];
    *loaded = b < 0;
    if (b >= 0) {
        g->hits++;
        lru_unlink(g, b);
        lru_push_front(g, b);
        return b;
    }
    g->misses++;
    b = g->lru_tail;
    pool_block &k = g->blocks[b];
    if (k.key >= 0) g->slot_of[k.key] = -1;
    lru_unlink(g, b);
    lru_push_front(g, b);
    k.key = (int64_t)slot;
    g->slot_of[slot] = b;
    /* the previous occupant's last reader must be done before the copy overwrites it */
    CUDA_CHECK(cudaStreamWaitEvent(g->copy, k.done, 0));
    size_t bytes = g->layout[p].bytes;
    CUDA_CHECK(cudaMemcpyAsync(g->pool + (size_t)b * g->block_stride, host_blob(g, m, j, p), bytes,
                               cudaMemcpyHostToDevice, g->copy));
    CUDA_CHECK(cudaEventRecord(k.ready, g->copy));
    g->h2d_bytes += bytes;
    return b;
}

dmat block_part(const engine_cuda *g, int32_t b, uint32_t p, int part) {
    const blob_layout &L = g->layout[p];
    dmat d;
    d.kind = L.kind[part];
    d.rows = L.rows[part];
    d.cols = L.cols[part];
    d.data = g->pool + (size_t)b * g->block_stride + L.offset[part];
    return d;
}

/* out = down(silu(gate h) * up h) */
void ffn(engine_cuda *g, const dmat *m, const float *h, float *out) {
    cudaStream_t s = g->compute;
    dmat_matvec(g->ff_gate, m[0], h, s);
    dmat_matvec(g->ff_up, m[1], h, s);
    kern_swiglu_cuda(g->ff_gate, g->ff_gate, g->ff_up, m[0].rows, s);
    dmat_matvec(out, m[2], g->ff_gate, s);
}

/* Router of MoE layer `layer` on h: top k of its softmax, read back to h_ids / h_vals. */
void route(engine_cuda *g, const dmat &router, const float *h, uint32_t k) {
    uint32_t E = g->cfg.n_experts;
    dmat_matvec(g->r_logits, router, h, g->compute);
    kern_router_topk_cuda(g->r_probs, g->r_logits, E, k, g->r_ids, g->r_vals, g->compute);
    CUDA_CHECK(cudaMemcpyAsync(g->h_ids, g->r_ids, k * sizeof(uint32_t), cudaMemcpyDeviceToHost,
                               g->compute));
    CUDA_CHECK(cudaMemcpyAsync(g->h_vals, g->r_vals, k * sizeof(float), cudaMemcpyDeviceToHost,
                               g->compute));
    CUDA_CHECK(cudaStreamSynchronize(g->compute));
}

void moe_block(engine_cuda *g, uint32_t l, uint32_t m, const uint8_t *prec, ecu_token_out *out) {
    const ecu_model &c = g->cfg;
    uint32_t E = c.n_experts, K = c.top_k, H = c.hidden;
    const dlayer &L = g->layers[l];
    cudaStream_t s = g->compute;
    route(g, L.router, g->h, K);
    uint32_t ids[64];
    float vals[64];
    for (uint32_t i = 0; i < K; i++) {
        ids[i] = g->h_ids[i];
        vals[i] = g->h_vals[i];
        CUDA_REQUIRE(ids[i] < E);
    }
    if (c.norm_topk_prob) { /* as forward.c: float sum in rank order */
        float sum = 0;
        for (uint32_t i = 0; i < K; i++) sum += vals[i];
        for (uint32_t i = 0; i < K; i++) vals[i] /= sum;
    }
    CUDA_CHECK(cudaMemsetAsync(g->y, 0, H * sizeof(float), s));
    /* start every missing expert's copy first so copies overlap the first experts' compute */
    int32_t blk[64];
    bool loaded[64];
    for (uint32_t i = 0; i < K; i++) {
        uint8_t p = prec ? prec[(size_t)m * E + ids[i]] : (uint8_t)PREC_BF16;
        blk[i] = -1;
        if (p == PREC_SKIP) continue;
        CUDA_REQUIRE(p < ECU_PRECS && g->layout[p].held);
        blk[i] = pool_acquire(g, m, ids[i], p, &loaded[i]);
    }
    for (uint32_t i = 0; i < K; i++) { /* rank order: y sums as the CPU backend's does */
        if (blk[i] < 0) continue;
        if (loaded[i]) CUDA_CHECK(cudaStreamWaitEvent(s, g->blocks[blk[i]].ready, 0));
        uint32_t p = (uint32_t)(g->blocks[blk[i]].key % ECU_PRECS);
        dmat parts[ECU_PARTS] = {block_part(g, blk[i], p, 0), block_part(g, blk[i], p, 1),
                                 block_part(g, blk[i], p, 2)};
        ffn(g, parts, g->h, g->eo);
        CUDA_CHECK(cudaEventRecord(g->blocks[blk[i]].done, s));
        axpy_kernel<<<ew_blocks(H), EW_THREADS, 0, s>>>(g->y, vals[i], g->eo, H);
        CUDA_LAUNCH_CHECK();
    }
    if (c.shared_inter) {
        ffn(g, L.shared, g->h, g->eo);
        if (L.shared_gate) {
            shared_gate_kernel<<<1, EW_THREADS, 0, s>>>(g->y, L.shared_gate, g->h, g->eo, H);
            CUDA_LAUNCH_CHECK();
        } else {
            add_into(g->y, g->eo, H, s);
        }
    }
    if (out->expert_ids)
        for (uint32_t i = 0; i < K; i++) {
            out->expert_ids[(size_t)m * K + i] = (uint16_t)ids[i];
            out->gate_weights[(size_t)m * K + i] = vals[i];
        }
    uint32_t D = out->la_depth, KP = out->la_k;
    if (!D || !out->la_ids) return;
    CUDA_REQUIRE(KP >= 1 && KP <= E);
    for (uint32_t d = 1; d <= D; d++) {
        size_t base = (((size_t)m * D) + (d - 1)) * KP;
        if (m + d >= c.n_moe_layers) {
            for (uint32_t i = 0; i < KP; i++) {
                out->la_ids[base + i] = UINT16_MAX;
                out->la_scores[base + i] = 0;
            }
            continue;
        }
        uint32_t fl = 0; /* model layer of MoE layer m + d */
        while (!(g->layers[fl].router.data && g->moe_index[fl] == m + d)) fl++;
        route(g, g->layers[fl].router, g->h, KP);
        for (uint32_t i = 0; i < KP; i++) {
            out->la_ids[base + i] = (uint16_t)g->h_ids[i];
            out->la_scores[base + i] = g->h_vals[i];
        }
    }
}

void engine_cuda_free(engine_cuda *g) {
    if (g->compute) cudaStreamSynchronize(g->compute);
    if (g->copy) cudaStreamSynchronize(g->copy);
    for (size_t i = 0; i < g->n_owned; i++) cudaFree(g->owned[i]);
    for (int p = 0; p < ECU_PRECS; p++) cudaFreeHost(g->host_experts[p]);
    if (g->blocks)
        for (uint32_t b = 0; b < g->n_blocks; b++) {
            if (g->blocks[b].ready) cudaEventDestroy(g->blocks[b].ready);
            if (g->blocks[b].done) cudaEventDestroy(g->blocks[b].done);
        }
    cudaFreeHost(g->h_x);
    cudaFreeHost(g->h_vals);
    cudaFreeHost(g->h_logits);
    cudaFreeHost(g->h_ids);
    if (g->compute) cudaStreamDestroy(g->compute);
    if (g->copy) cudaStreamDestroy(g->copy);
    delete[] g->blocks;
    delete[] g->layers;
    free(g->slot_of);
    delete g;
}

int pinned_alloc(void **p, size_t bytes, const char *what, char *msg, size_t len) {
    *p = nullptr;
    cudaError_t e = cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *p = nullptr;
        return fail(msg, len, "GPU: cannot pin %.1f MiB of host memory for %s: %s",
                    bytes / 1048576.0, what, cudaGetErrorString(e));
    }
    return 0;
}

/* Experts: pinned blobs per held precision, the pool, its blocks and events. */
int setup_experts(engine_cuda *g, const ecu_model *m, char *msg, size_t len) {
    uint32_t E = m->n_experts, M = m->n_moe_layers;
    const ecu_layer *first = nullptr;
    for (uint32_t l = 0; l < m->n_layers && !first; l++)
        if (m->layers[l].is_moe) first = &m->layers[l];
    CUDA_REQUIRE(first && M > 0);
    uint32_t n_held = 0;
    size_t max_bytes = 0;
    for (uint32_t p = 0; p < ECU_PRECS; p++) {
        const ecu_mat *x = &first->experts[p * ECU_PARTS];
        if (!(m->precision_mask & (1u << p)) || !x[0].data) continue;
        blob_layout &L = g->layout[p];
        L.held = true;
        size_t off = 0;
        for (int part = 0; part < ECU_PARTS; part++) {
            L.kind[part] = x[part].kind;
            L.rows[part] = x[part].rows;
            L.cols[part] = x[part].cols;
            L.offset[part] = off;
            off += (mat_bytes(x[part]) + 15) / 16 * 16; /* parts start 16-byte aligned */
        }
        L.bytes = off;
        if (off > max_bytes) max_bytes = off;
        n_held++;
        if (pinned_alloc(reinterpret_cast<void **>(&g->host_experts[p]), (size_t)M * E * off,
                         "the experts", msg, len))
            return -1;
        for (uint32_t l = 0; l < m->n_layers; l++) {
            if (!m->layers[l].is_moe) continue;
            uint32_t mi = m->moe_index[l];
            for (uint32_t j = 0; j < E; j++) {
                const ecu_mat *src = &m->layers[l].experts[((size_t)j * ECU_PRECS + p) * ECU_PARTS];
                uint8_t *dst = g->host_experts[p] + ((size_t)mi * E + j) * off;
                for (int part = 0; part < ECU_PARTS; part++) {
                    CUDA_REQUIRE(src[part].data && src[part].kind == L.kind[part] &&
                                 src[part].rows == L.rows[part] && src[part].cols == L.cols[part]);
                    memcpy(dst + L.offset[part], src[part].data, mat_bytes(src[part]));
                }
            }
        }
    }
    CUDA_REQUIRE(g->layout[PREC_BF16].held);
    uint64_t all = (uint64_t)M * E * n_held;
    bool resident = m->pool_experts == 0 || m->pool_experts >= all;
    g->n_blocks = resident ? (uint32_t)all : m->pool_experts;
    if (g->n_blocks < m->top_k)
        return fail(msg, len, "GPU expert pool: %u blocks, expected at least top_k = %u",
                    g->n_blocks, m->top_k);
    g->block_stride = (max_bytes + POOL_ALIGN_BYTES - 1) / POOL_ALIGN_BYTES * POOL_ALIGN_BYTES;
    if (dev_alloc(g, reinterpret_cast<void **>(&g->pool), (size_t)g->n_blocks * g->block_stride,
                  "the expert pool (lower the pool size)", msg, len))
        return -1;
    g->blocks = new pool_block[g->n_blocks];
    g->slot_of = static_cast<int32_t *>(malloc((size_t)M * E * ECU_PRECS * sizeof(int32_t)));
    CUDA_REQUIRE(g->slot_of);
    for (size_t i = 0; i < (size_t)M * E * ECU_PRECS; i++) g->slot_of[i] = -1;
    for (uint32_t b = 0; b < g->n_blocks; b++) {
        CUDA_CHECK(cudaEventCreateWithFlags(&g->blocks[b].ready, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&g->blocks[b].done, cudaEventDisableTiming));
        /* an empty block counts as read: the first copy into it waits for nothing */
        CUDA_CHECK(cudaEventRecord(g->blocks[b].done, g->compute));
        lru_push_front(g, (int32_t)b);
    }
    if (resident) { /* every expert at every held precision, loaded once */
        for (uint32_t mi = 0; mi < M; mi++)
            for (uint32_t j = 0; j < E; j++)
                for (uint32_t p = 0; p < ECU_PRECS; p++)
                    if (g->layout[p].held) {
                        bool loaded;
                        pool_acquire(g, mi, j, p, &loaded);
                    }
        CUDA_CHECK(cudaStreamSynchronize(g->copy));
        CUDA_CHECK(cudaStreamSynchronize(g->compute));
        g->hits = g->misses = g->h2d_bytes = 0;
    }
    return 0;
}

int create(engine_cuda *g, const ecu_model *m, char *msg, size_t len) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        cudaGetLastError();
        return fail(msg, len, "backend cuda: no CUDA device");
    }
    if (m->n_layers > 256 || m->top_k > 64 || m->n_experts > 4096)
        return fail(msg, len, "backend cuda: at most 256 layers, top_k 64 and 4096 experts");
    g->cfg = *m;
    g->cfg.layers = nullptr;
    g->cfg.moe_index = nullptr;
    for (uint32_t l = 0; l < m->n_layers; l++) g->moe_index[l] = m->moe_index[l];
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking));
    uint32_t H = m->hidden, qd = m->n_heads * m->head_dim, kvd = m->n_kv_heads * m->head_dim;
    g->layers = new dlayer[m->n_layers];
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const ecu_layer &s = m->layers[l];
        dlayer &d = g->layers[l];
        d.attn_window = s.attn_window;
        uint32_t qn = m->qk_norm_per_head ? m->head_dim : qd;
        uint32_t kn = m->qk_norm_per_head ? m->head_dim : kvd;
        if (upload_vec(g, &d.attn_norm, s.attn_norm, H, msg, len) ||
            upload_vec(g, &d.ffn_norm, s.ffn_norm, H, msg, len) ||
            upload_vec(g, &d.q_bias, s.q_bias, qd, msg, len) ||
            upload_vec(g, &d.k_bias, s.k_bias, kvd, msg, len) ||
            upload_vec(g, &d.v_bias, s.v_bias, kvd, msg, len) ||
            upload_vec(g, &d.o_bias, s.o_bias, H, msg, len) ||
            upload_vec(g, &d.q_norm, s.q_norm, qn, msg, len) ||
            upload_vec(g, &d.k_norm, s.k_norm, kn, msg, len) ||
            upload_mat(g, &d.wq, s.wq, msg, len) || upload_mat(g, &d.wk, s.wk, msg, len) ||
            upload_mat(g, &d.wv, s.wv, msg, len) || upload_mat(g, &d.wo, s.wo, msg, len))
            return -1;
        if (s.is_moe) {
            if (upload_mat(g, &d.router, s.router, msg, len)) return -1;
            if (m->shared_inter)
                for (int p = 0; p < ECU_PARTS; p++)
                    if (upload_mat(g, &d.shared[p], s.shared[p], msg, len)) return -1;
            if (upload_vec(g, &d.shared_gate, s.shared_gate, H, msg, len)) return -1;
        } else {
            for (int p = 0; p < ECU_PARTS; p++)
                if (upload_mat(g, &d.dense[p], s.dense[p], msg, len)) return -1;
        }
    }
    if (upload_vec(g, &g->final_norm, m->final_norm, H, msg, len) ||
        upload_mat(g, &g->lm_head, m->lm_head, msg, len))
        return -1;
    uint32_t inter = m->expert_inter;
    if (m->shared_inter > inter) inter = m->shared_inter;
    if (m->dense_inter > inter) inter = m->dense_inter;
    float **hbufs[] = {&g->x, &g->h, &g->tmp, &g->y, &g->eo};
    for (float **b : hbufs)
        if (dev_alloc(g, reinterpret_cast<void **>(b), H * sizeof(float), "scratch", msg, len))
            return -1;
    if (dev_alloc(g, reinterpret_cast<void **>(&g->q), qd * sizeof(float), "scratch", msg, len) ||
        dev_alloc(g, reinterpret_cast<void **>(&g->att), qd * sizeof(float), "scratch", msg, len) ||
        dev_alloc(g, reinterpret_cast<void **>(&g->ff_gate), inter * sizeof(float), "scratch", msg,
                  len) ||
        dev_alloc(g, reinterpret_cast<void **>(&g->ff_up), inter * sizeof(float), "scratch", msg,
                  len) ||
        dev_alloc(g, reinterpret_cast<void **>(&g->r_logits), m->n_experts * sizeof(float),
                  "scratch", msg, len) ||
        dev_alloc(g, reinterpret_cast<void **>(&g->r_probs), m->n_experts * sizeof(float),
                  "scratch", msg, len) ||
        dev_alloc(g, reinterpret_cast<void **>(&g->r_vals), m->n_experts * sizeof(float), "scratch",
                  msg, len) ||
        dev_alloc(g, reinterpret_cast<void **>(&g->r_ids), m->n_experts * sizeof(uint32_t),
                  "scratch", msg, len) ||
        dev_alloc(g, reinterpret_cast<void **>(&g->logits), (size_t)m->vocab * sizeof(float),
                  "scratch", msg, len))
        return -1;
    if (pinned_alloc(reinterpret_cast<void **>(&g->h_x), H * sizeof(float), "staging", msg, len) ||
        pinned_alloc(reinterpret_cast<void **>(&g->h_vals), m->n_experts * sizeof(float), "staging",
                     msg, len) ||
        pinned_alloc(reinterpret_cast<void **>(&g->h_ids), m->n_experts * sizeof(uint32_t),
                     "staging", msg, len) ||
        pinned_alloc(reinterpret_cast<void **>(&g->h_logits), (size_t)m->vocab * sizeof(float),
                     "staging", msg, len))
        return -1;
    return setup_experts(g, m, msg, len);
}

} // namespace

extern "C" {

int engine_cuda_create(const ecu_model *m, engine_cuda **out, char *msg, size_t msg_len) {
    *out = nullptr;
    engine_cuda *g = new engine_cuda();
    if (create(g, m, msg, msg_len)) {
        engine_cuda_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

void engine_cuda_destroy(engine_cuda *g) {
    if (g) engine_cuda_free(g);
}

engine_cuda_seq *engine_cuda_seq_create(engine_cuda *g, uint32_t max_ctx) {
    const ecu_model &c = g->cfg;
    engine_cuda_seq *s = new engine_cuda_seq();
    s->g = g;
    s->max_ctx = max_ctx ? max_ctx : 1;
    size_t kv = (size_t)c.n_layers * s->max_ctx * c.n_kv_heads * c.head_dim * sizeof(float);
    size_t imp = (size_t)c.n_moe_layers * s->max_ctx * sizeof(float);
    CUDA_CHECK(cudaMalloc(&s->k, kv));
    CUDA_CHECK(cudaMalloc(&s->v, kv));
    CUDA_CHECK(cudaMalloc(&s->importance, imp));
    CUDA_CHECK(cudaMalloc(&s->probs, (size_t)c.n_heads * s->max_ctx * sizeof(float)));
    CUDA_CHECK(cudaMemset(s->k, 0, kv));
    CUDA_CHECK(cudaMemset(s->v, 0, kv));
    CUDA_CHECK(cudaMemset(s->importance, 0, imp));
    return s;
}

void engine_cuda_seq_destroy(engine_cuda_seq *s) {
    if (!s) return;
    CUDA_CHECK(cudaStreamSynchronize(s->g->compute));
    cudaFree(s->k);
    cudaFree(s->v);
    cudaFree(s->importance);
    cudaFree(s->probs);
    delete s;
}

void engine_cuda_forward(engine_cuda *g, engine_cuda_seq *s, const float *x, uint32_t pos,
                         const uint8_t *prec, ecu_token_out *out) {
    const ecu_model &c = g->cfg;
    CUDA_REQUIRE(s->g == g && pos < s->max_ctx);
    cudaStream_t st = g->compute;
    uint32_t H = c.hidden, nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim;
    uint32_t qd = nh * hd, kvd = nkv * hd;
    memcpy(g->h_x, x, H * sizeof(float));
    CUDA_CHECK(cudaMemcpyAsync(g->x, g->h_x, H * sizeof(float), cudaMemcpyHostToDevice, st));
    uint32_t first = pos; /* the first position any layer's window sees */
    for (uint32_t l = 0; l < c.n_layers; l++) {
        const dlayer &L = g->layers[l];
        uint32_t w = L.attn_window, start = w && pos + 1 > w ? pos + 1 - w : 0;
        uint32_t n_ctx = pos + 1 - start;
        if (start < first) first = start;
        float *kc = s->k + (size_t)l * s->max_ctx * kvd, *vc = s->v + (size_t)l * s->max_ctx * kvd;
        float *k = kc + (size_t)pos * kvd, *v = vc + (size_t)pos * kvd; /* written in place */
        kern_rmsnorm_cuda(g->h, g->x, L.attn_norm, H, c.rms_eps, st);
        dmat_matvec(g->q, L.wq, g->h, st);
        dmat_matvec(k, L.wk, g->h, st);
        dmat_matvec(v, L.wv, g->h, st);
        if (L.q_bias) add_into(g->q, L.q_bias, qd, st);
        if (L.k_bias) add_into(k, L.k_bias, kvd, st);
        if (L.v_bias) add_into(v, L.v_bias, kvd, st);
        if (c.qk_norm_full) {
            kern_rmsnorm_cuda(g->q, g->q, L.q_norm, qd, c.rms_eps, st);
            kern_rmsnorm_cuda(k, k, L.k_norm, kvd, c.rms_eps, st);
        }
        if (c.clip_qkv_on) {
            clamp_kernel<<<ew_blocks(qd), EW_THREADS, 0, st>>>(g->q, qd, c.clip_qkv);
            CUDA_LAUNCH_CHECK();
            clamp_kernel<<<ew_blocks(kvd), EW_THREADS, 0, st>>>(k, kvd, c.clip_qkv);
            CUDA_LAUNCH_CHECK();
            clamp_kernel<<<ew_blocks(kvd), EW_THREADS, 0, st>>>(v, kvd, c.clip_qkv);
            CUDA_LAUNCH_CHECK();
        }
        if (c.qk_norm_per_head) {
            kern_rmsnorm_rows_cuda(g->q, g->q, L.q_norm, nh, hd, c.rms_eps, st);
            kern_rmsnorm_rows_cuda(k, k, L.k_norm, nkv, hd, c.rms_eps, st);
        }
        kern_rope_cuda(g->q, nh, hd, pos, c.rope_theta, st);
        kern_rope_cuda(k, nkv, hd, pos, c.rope_theta, st);
        kern_attention_cuda(g->att, s->probs, g->q, kc + (size_t)start * kvd,
                            vc + (size_t)start * kvd, nh, nkv, hd, n_ctx, st);
        if (L.router.data) {
            float *imp = s->importance + (size_t)g->moe_index[l] * s->max_ctx + start;
            importance_kernel<<<ew_blocks(n_ctx), EW_THREADS, 0, st>>>(imp, s->probs, nh, n_ctx);
            CUDA_LAUNCH_CHECK();
        }
        dmat_matvec(g->tmp, L.wo, g->att, st);
        if (L.o_bias) add_into(g->tmp, L.o_bias, H, st);
        add_into(g->x, g->tmp, H, st);
        kern_rmsnorm_cuda(g->h, g->x, L.ffn_norm, H, c.rms_eps, st);
        if (L.router.data) {
            moe_block(g, l, g->moe_index[l], prec, out);
        } else {
            dmat dense[ECU_PARTS] = {L.dense[0], L.dense[1], L.dense[2]};
            ffn(g, dense, g->h, g->y);
        }
        add_into(g->x, g->y, H, st);
    }
    if (out->logits) {
        kern_rmsnorm_cuda(g->h, g->x, g->final_norm, H, c.rms_eps, st);
        dmat_matvec(g->logits, g->lm_head, g->h, st);
        CUDA_CHECK(cudaMemcpyAsync(g->h_logits, g->logits, (size_t)c.vocab * sizeof(float),
                                   cudaMemcpyDeviceToHost, st));
    }
    if (out->importance) /* rows [first, pos] of every MoE layer */
        CUDA_CHECK(cudaMemcpy2DAsync(out->importance + first, s->max_ctx * sizeof(float),
                                     s->importance + first, s->max_ctx * sizeof(float),
                                     (pos + 1 - first) * sizeof(float), c.n_moe_layers,
                                     cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    if (out->logits) memcpy(out->logits, g->h_logits, (size_t)c.vocab * sizeof(float));
}

void engine_cuda_pool_stats(const engine_cuda *g, ecu_pool_stats *out) {
    out->hits = g->hits;
    out->misses = g->misses;
    out->h2d_bytes = g->h2d_bytes;
    out->blocks = g->n_blocks;
    out->block_bytes = g->block_stride;
}

} // extern "C"
