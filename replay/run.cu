/* The `cuda` backend of the replay executor (replay/exec.h; replay_run): the executor's run
 * loop, memory system, pools and checks driven by real copies and kernels on a GPU. What lives
 * here is only what CUDA hardware has:
 *
 * Device memory, allocated once before the clock starts (no cudaMalloc on the hot path): the
 * non-expert weights of every layer (bf16: the checkpoint's, replay/weights.h, or random),
 * activations and a KV buffer, and one arena of the expert budget that the executor's pools
 * (sim/block_pool.h) carve into fixed-size blocks per precision (one block holds one part: gate, up
 * or down, in the kernels' block format). Host: the store of experts placed by memsys_place, in
 * pinned memory (cudaHostAlloc) and an SSD file: the checkpoint's in the kernels' formats, or
 * random bytes from a seeded xorshift stream.
 *
 * Copies: the host engine asks memsys for the next chunk (memsys_next_chunk) and keeps at most
 * COPY_WINDOW chunks in flight, one cudaMemcpyAsync per part the chunk spans (demand chunks on
 * the demand stream, the others on the background stream), each chunk ending with an event;
 * chunks retire in submission order (memsys_chunk_done, then memsys_deliver). The SSD engine
 * reads its chunks with pread (O_DIRECT) into pinned bounce slots, on the host thread. The
 * compute stream waits (cudaStreamWaitEvent) for the event of a part's last chunk right before
 * each expert op, and an event before every op lets the step's end check that no expert started
 * before its copy ended.
 *
 * Time: ops are enqueued, not done: the executor waits for the compute stream (wait_compute)
 * before every on_route, as an offloading engine waits for the router's output, and unpins the
 * route's experts only then. Op and copy times come from CUDA events (ns from the run's first
 * event, which the host clock starts with), resolved when the step ends. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <deque>
#include <vector>

/* The project's C headers spell two C11 keywords that C++ writes differently. */
#define _Noreturn [[noreturn]]
#define _Static_assert static_assert
extern "C" {
#include "common/alloc.h"
#include "common/check.h"
#include "kernels/quant.h"
#include "replay/exec.h"
#include "replay/replay.h"
#include "sim/future.h"
#include "sim/memsys.h"
#include "sim/route.h"
#include "sim/timeline.h"
}
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "replay/gemm.cuh"
#include "replay/store.cuh"

#define NONE          UINT32_MAX
#define COPY_WINDOW   2 /* chunks in flight: one running, one queued behind it */
#define GIB           1073741824.0
#define RESERVE_BYTES (512ull << 20) /* CUDA context and cuBLAS workspace headroom */
#define ATTN_Q_CHUNK  64 /* prefill queries per attention launch (bounds the probability buffer) */

extern "C" bool replay_built_with_cuda(void) { return true; }

extern "C" moesim_status replay_device_check(moesim_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        cudaGetLastError();
        /* without a driver the static runtime says "driver version is insufficient": name
         * both possibilities, and the way to run without a GPU */
        return moesim_fail(err, MOESIM_EINPUT,
                           "no CUDA GPU or driver on this machine (%s); --backend cpu runs "
                           "without one",
                           e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
    }
    return MOESIM_OK;
}

/* ---- the backend's state ---- */

/* A chunk of the H2D engine in flight: its part copies, between two events. */
typedef struct rp_chunk {
    memsys_chunk c;
    cudaEvent_t ev0, ev1;
    int32_t slot;       /* bounce slot its bytes came from (an SSD read), or -1 */
    uint8_t ends;       /* parts whose last bytes it carries */
    uint64_t dev_bytes; /* bytes copied (kernel format) */
    uint32_t layer, expert;
    uint8_t prec, cls; /* for the timeline */
} rp_chunk;

/* An SSD chunk read into a bounce slot, waiting for the H2D engine: where each of its pieces
 * (memsys_chunk_pieces) landed. */
typedef struct rp_staged {
    uint64_t offset, bytes;
    int32_t slot;
    const uint8_t *src[PART_COUNT];
} rp_staged;

/* What the cuda backend adds to the executor's state (x->be_state). */
struct cuda_backend {
    replay_exec *x;
    uint64_t dev_part_bytes[PREC_COUNT][PART_COUNT]; /* kernel format bytes (the blocks) */

    /* device arena: the pools' blocks (x->pool hands out offsets in it) */
    uint8_t *arena;
    cudaEvent_t *ready; /* [L*E*P*3] event after the part's last chunk, or NULL: landed */

    /* host store: borrowed from the inputs, or the run's own */
    const replay_store *store;
    replay_store *own_store;
    uint8_t *bounce;     /* [n_slots][slot_bytes] pinned: SSD chunks staged for the H2D engine */
    uint64_t slot_bytes; /* one chunk's pieces, each with its O_DIRECT alignment */
    std::vector<int32_t> free_slots;
    std::vector<std::deque<rp_staged>> staged; /* [transfer] SSD chunks not yet copied on */
    uint64_t ssd_busy_ns;
    bool ssd_running; /* the SSD engine's loop is on the stack */

    /* H2D engine */
    std::deque<rp_chunk> inflight;     /* submission order */
    std::vector<rp_chunk> done_chunks; /* retired, not yet accounted (busy time, timeline) */
    std::vector<cudaEvent_t> cev_all, cev_free; /* chunk events: reused once accounted */
    std::vector<cudaEvent_t> xfer_last;  /* [transfer] event of its last chunk in flight */
    std::vector<cudaStream_t> xfer_stream; /* [transfer] the stream that chunk went on */
    uint64_t h2d_busy_ns, copy_last_end_ns, h2d_dev_bytes;
    cudaStream_t s_demand, s_bg, s_comp;

    /* compute */
    cublas_lazy_handle blas; /* on s_comp */
    uint16_t **w_attn;       /* [n_layers] q|k|v|o bf16 */
    uint16_t **w_router, **w_shared, **w_dense, *w_lm; /* [n_layers] each, NULL where none */
    float *x_act, *y, *h1, *h2, *kv, *attn_out, *probs, *logits, *gates_dev;
    uint16_t *ys; /* [T][top_k][hidden] bf16 expert outputs the combine reads */
    uint32_t max_ctx;
    uint16_t *x_bf16;
    uint64_t q_dim, kv_dim, device_alloc;
    struct op_rec {
        cudaEvent_t ev0, ev1;
        char name[64];
        const char *cat;
        int layer;        /* MoE layer for on_layer_done bookkeeping, -1 otherwise */
        cudaEvent_t need; /* copy end this op waited for, or NULL */
    };
    std::vector<op_rec> ops;
    std::vector<cudaEvent_t> ev_pool;
    size_t ev_used;
    cudaEvent_t ev_start, ev_step; /* the run's first event; the current step's first */
};
typedef struct cuda_backend rp;

static rp *be_of(const replay_exec *x) { return (rp *)x->be_state; }

static cudaEvent_t ev_get(rp *s) {
    if (s->ev_used == s->ev_pool.size()) {
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));
        s->ev_pool.push_back(e);
    }
    return s->ev_pool[s->ev_used++];
}

/* Chunk events live until the chunk retired and its times were read (chunks_account). */
static cudaEvent_t cev_get(rp *s) {
    if (!s->cev_free.empty()) {
        cudaEvent_t e = s->cev_free.back();
        s->cev_free.pop_back();
        return e;
    }
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    s->cev_all.push_back(e);
    return e;
}

static uint64_t ev_ns(rp *s, cudaEvent_t e) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, s->ev_start, e));
    return ms <= 0 ? 0 : (uint64_t)llround((double)ms * 1e6);
}

static uint64_t run_ns(const rp *s) { return replay_exec_now(s->x); }

static uint8_t *block_ptr(const rp *s, size_t part_index) {
    return s->arena + block_pool_offset(&s->x->pool, part_index);
}

/* A part left HBM: no copy will mark it landed any more. */
static void cuda_part_released(replay_exec *x, size_t part_index) {
    be_of(x)->ready[part_index] = NULL;
}

/* ---- copies ---- */

/* Byte `acct` of part `part` at precision p (the memory system's units) in the kernel format:
 * chunks split parts in proportion, so a part's chunks cover its kernel bytes exactly. */
static uint64_t dev_offset(const rp *s, uint32_t p, int part, uint64_t acct) {
    return (uint64_t)((unsigned __int128)acct * s->dev_part_bytes[p][part] /
                      s->x->part_bytes[p][part]);
}

static uint64_t part_blob_offset(const rp *s, uint32_t p, int part) {
    uint64_t o = 0;
    for (int q = 0; q < part; q++) o += s->dev_part_bytes[p][q];
    return o;
}

/* Reads kernel bytes [lo, lo + n) of (layer, expert, p)'s blob from the SSD file into the bounce
 * slot `slot` after its first *used bytes (O_DIRECT: the aligned range covering them); returns
 * where byte lo landed and adds the bytes the read took to *used. An I/O error mid-run cannot be
 * recovered: reported, aborted. */
static const uint8_t *ssd_pread(rp *s, uint32_t p, size_t le, uint64_t lo, uint64_t n,
                                int32_t slot, uint64_t *used) {
    const replay_store *st = s->store;
    uint64_t a = lo / SSD_ALIGN * SSD_ALIGN, b = (lo + n + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
    MOESIM_ASSERT(b <= st->ssd_stride[p] && *used + (b - a) <= s->slot_bytes);
    uint8_t *dst = s->bounce + (uint64_t)slot * s->slot_bytes + *used;
    for (uint64_t o = a; o < b;) {
        ssize_t r = pread(st->ssd_fd[p], dst + (o - a), b - o, (off_t)(st->ssd_off[p][le] + o));
        if (r <= 0) cuda_check_fail("pread", strerror(r < 0 ? errno : EIO), __FILE__, __LINE__);
        o += (uint64_t)r;
    }
    *used += b - a;
    return dst + (lo - a);
}

/* The SSD engine: reads every chunk memsys hands it, synchronously on the host thread, into a
 * bounce slot, then reports it done so the H2D engine can copy it on (memsys stops handing out
 * chunks while its bounce buffer is full). */
static void ssd_kick(rp *s) {
    if (s->ssd_running) return; /* the loop below takes the new work */
    s->ssd_running = true;
    replay_exec *x = s->x;
    memsys_chunk c;
    while (memsys_next_chunk(&x->ms, MEMSYS_SSD, &c)) {
        const memsys_xfer *xf = &x->ms.xf[c.xfer];
        MOESIM_ASSERT(!s->free_slots.empty()); /* sized from the bounce buffer (bounce_alloc) */
        rp_staged sg = {c.offset, c.bytes, s->free_slots.back(), {NULL, NULL, NULL}};
        s->free_slots.pop_back();
        memsys_piece pc[PART_COUNT];
        uint32_t n = memsys_chunk_pieces(&x->ms, &c, pc);
        size_t le = (size_t)xf->layer * x->E + xf->expert;
        uint64_t used = 0, t0 = replay_exec_clock_ns();
        for (uint32_t i = 0; i < n; i++) {
            uint64_t a = dev_offset(s, xf->prec, pc[i].part, pc[i].part_offset);
            uint64_t b = dev_offset(s, xf->prec, pc[i].part, pc[i].part_offset + pc[i].bytes);
            sg.src[i] = ssd_pread(s, xf->prec, le, part_blob_offset(s, xf->prec, pc[i].part) + a,
                                  b - a, sg.slot, &used);
        }
        uint64_t t1 = replay_exec_clock_ns();
        s->ssd_busy_ns += t1 - t0;
        if (x->tl.on) {
            char name[64];
            snprintf(name, sizeof name, "L%u e%u %s ssd", xf->layer, xf->expert,
                     precision_name((moesim_precision)xf->prec));
            sim_timeline_slice(&x->tl, SIM_TRACK_SSD, "ssd", name, t0 - x->t0_ns, t1 - x->t0_ns);
        }
        if (s->staged.size() <= c.xfer) s->staged.resize(c.xfer + 1);
        s->staged[c.xfer].push_back(sg);
        memsys_xfer fin;
        bool landed = memsys_chunk_done(&x->ms, &c, &fin); /* staged: the H2D engine goes on */
        MOESIM_ASSERT(!landed);
    }
    s->ssd_running = false;
}

/* The H2D engine: keeps COPY_WINDOW chunks in flight, each the chunk memsys hands out next (so a
 * demand load overtakes queued prefetches at the next chunk boundary), one cudaMemcpyAsync per
 * part it spans, from the pinned store or the bounce slot its SSD read filled. */
static void h2d_kick(rp *s) {
    replay_exec *x = s->x;
    memsys_chunk c;
    while (s->inflight.size() < COPY_WINDOW && memsys_next_chunk(&x->ms, MEMSYS_H2D, &c)) {
        const memsys_xfer *xf = &x->ms.xf[c.xfer];
        uint32_t p = xf->prec;
        memsys_piece pc[PART_COUNT];
        uint32_t n = memsys_chunk_pieces(&x->ms, &c, pc);
        rp_chunk rc = {c,  cev_get(s), cev_get(s), -1,      0,
                       0,  xf->layer,  xf->expert, xf->prec, xf->cls};
        const uint8_t *src[PART_COUNT];
        size_t le = (size_t)xf->layer * x->E + xf->expert;
        if (xf->via_ssd) { /* the SSD chunk of the same bytes (chunks of both engines align) */
            MOESIM_ASSERT(s->staged.size() > c.xfer && !s->staged[c.xfer].empty());
            rp_staged sg = s->staged[c.xfer].front();
            s->staged[c.xfer].pop_front();
            MOESIM_ASSERT(sg.offset == c.offset && sg.bytes == c.bytes);
            rc.slot = sg.slot;
            memcpy(src, sg.src, sizeof src);
        } else {
            MOESIM_ASSERT(s->store->host_off[p][le] != UINT64_MAX);
            for (uint32_t i = 0; i < n; i++)
                src[i] = s->store->host[p] + s->store->host_off[p][le] +
                         part_blob_offset(s, p, pc[i].part) +
                         dev_offset(s, p, pc[i].part, pc[i].part_offset);
        }
        cudaStream_t st = xf->cls == POLICY_DEMAND ? s->s_demand : s->s_bg;
        if (s->xfer_last.size() <= c.xfer) {
            s->xfer_last.resize(c.xfer + 1, NULL);
            s->xfer_stream.resize(c.xfer + 1, NULL);
        }
        if (c.first) s->xfer_last[c.xfer] = NULL;
        /* promoted mid-copy: its earlier chunks went on the other stream; a part's last event
         * must mean the whole part landed */
        if (s->xfer_last[c.xfer] && s->xfer_stream[c.xfer] != st)
            CUDA_CHECK(cudaStreamWaitEvent(st, s->xfer_last[c.xfer], 0));
        CUDA_CHECK(cudaEventRecord(rc.ev0, st));
        size_t base = memsys_lep(&x->ms, xf->layer, xf->expert, p) * PART_COUNT;
        for (uint32_t i = 0; i < n; i++) {
            int part = pc[i].part;
            uint64_t a = dev_offset(s, p, part, pc[i].part_offset);
            uint64_t b = dev_offset(s, p, part, pc[i].part_offset + pc[i].bytes);
            CUDA_CHECK(cudaMemcpyAsync(block_ptr(s, base + part) + a, src[i], b - a,
                                       cudaMemcpyHostToDevice, st));
            rc.dev_bytes += b - a;
            if (pc[i].part_offset + pc[i].bytes == x->part_bytes[p][part])
                rc.ends |= (uint8_t)(1u << part);
        }
        CUDA_CHECK(cudaEventRecord(rc.ev1, st));
        for (int part = 0; part < PART_COUNT; part++)
            if (rc.ends & (1u << part)) s->ready[base + part] = rc.ev1;
        s->xfer_last[c.xfer] = rc.ev1;
        s->xfer_stream[c.xfer] = st;
        s->h2d_dev_bytes += rc.dev_bytes;
        s->inflight.push_back(rc);
    }
}

static void cuda_copy_kick(replay_exec *x, int engine) {
    if (engine == MEMSYS_SSD)
        ssd_kick(be_of(x));
    else
        h2d_kick(be_of(x));
}

/* Retires finished chunks in submission order: memsys makes their parts resident and the policy
 * hears of completed loads (memsys_deliver, after the engine restarted). Never called from inside
 * a policy callback (on_route may be issuing loads). */
static void retire(rp *s) {
    replay_exec *x = s->x;
    while (!s->inflight.empty()) {
        cudaError_t e = cudaEventQuery(s->inflight.front().ev1);
        if (e == cudaErrorNotReady) break;
        CUDA_CHECK(e);
        rp_chunk rc = s->inflight.front();
        s->inflight.pop_front();
        s->done_chunks.push_back(rc);
        if (s->xfer_last[rc.c.xfer] == rc.ev1) s->xfer_last[rc.c.xfer] = NULL;
        if (rc.slot >= 0) s->free_slots.push_back(rc.slot); /* its bytes left the bounce slot */
        size_t base = memsys_lep(&x->ms, rc.layer, rc.expert, rc.prec) * PART_COUNT;
        for (int part = 0; part < PART_COUNT; part++)
            if (rc.ends & (1u << part)) /* landed: ops need not wait */
                s->ready[base + part] = NULL;
        memsys_xfer fin;
        bool complete = memsys_chunk_done(&x->ms, &rc.c, &fin);
        h2d_kick(s);
        if (complete) memsys_deliver(&x->ms, &fin, run_ns(s));
    }
}

static void pump(rp *s) {
    retire(s);
    h2d_kick(s);
    ssd_kick(s);
}

/* Blocks until the oldest chunk in flight has landed, then retires what has. */
static void wait_next_chunk(rp *s) {
    if (s->inflight.empty()) pump(s);
    MOESIM_ASSERT(!s->inflight.empty()); /* the caller waits for a copy that has started */
    CUDA_CHECK(cudaEventSynchronize(s->inflight.front().ev1));
    pump(s);
}

static bool cuda_wait_copy(replay_exec *x) {
    wait_next_chunk(be_of(x));
    return true;
}

/* Waits until every part in mask has all its chunks submitted (its ready event exists): the
 * compute stream then waits for their events itself. */
static void cuda_expert_wait(replay_exec *x, uint32_t layer, uint32_t e, moesim_precision p,
                             uint32_t mask) {
    rp *s = be_of(x);
    size_t base = memsys_lep(&x->ms, layer, e, p) * PART_COUNT;
    for (;;) {
        bool ok = true;
        for (int part = 0; part < PART_COUNT; part++)
            if (mask & (1u << part) && x->ms.state[base + part] == POLICY_LOADING &&
                !s->ready[base + part])
                ok = false;
        if (ok) return;
        pump(s);
    }
}

/* Waits until the compute stream is idle, feeding copies meanwhile. */
static void cuda_wait_compute(replay_exec *x) {
    rp *s = be_of(x);
    cudaEvent_t e = ev_get(s);
    CUDA_CHECK(cudaEventRecord(e, s->s_comp));
    for (;;) {
        pump(s);
        cudaError_t r = cudaEventQuery(e);
        if (r == cudaSuccess) break;
        if (r != cudaErrorNotReady) CUDA_CHECK(r);
    }
}

/* ---- compute ---- */

/* An op on the compute stream between two events; `need` is a copy event it waited for. */
static void op_begin_need(rp *s, const char *cat, const char *name, int layer, cudaEvent_t need) {
    rp::op_rec o;
    o.ev0 = ev_get(s);
    o.ev1 = ev_get(s);
    o.cat = cat;
    o.layer = layer;
    o.need = need;
    snprintf(o.name, sizeof o.name, "%s", name);
    CUDA_CHECK(cudaEventRecord(o.ev0, s->s_comp));
    s->ops.push_back(o);
}

static void cuda_op_begin(replay_exec *x, const char *cat, const char *name, int layer) {
    op_begin_need(be_of(x), cat, name, layer, NULL);
}

static void cuda_op_end(replay_exec *x) {
    rp *s = be_of(x);
    CUDA_CHECK(cudaEventRecord(s->ops.back().ev1, s->s_comp));
}

static void gemm(rp *s, float *y, moesim_precision p, const void *w, const float *x, size_t rows,
                 size_t cols, size_t n) {
    replay_gemm(&s->blas, s->x_bf16, s->s_comp, y, p, w, x, rows, cols, n);
}

static void run_attention(rp *s, const sim_schedule_step *sd, uint32_t ml) {
    const replay_exec *x = s->x;
    const model_geometry *m = x->m;
    uint32_t n = sd->n_tokens;
    uint64_t H = m->hidden;
    uint16_t *w = s->w_attn[ml];
    gemm(s, s->y, PREC_BF16, w, s->x_act, s->q_dim + 2 * s->kv_dim, H, n);
    /* one attention call per request's run of tokens in the step (causal over its context) */
    for (uint32_t i = 0; i < n;) {
        uint32_t tok = x->sch.tokens[sd->first + i];
        uint32_t r = x->tr->request_id[tok], j = i + 1;
        while (j < n && x->tr->request_id[x->sch.tokens[sd->first + j]] == r) j++;
        uint32_t last = x->tr->position[x->sch.tokens[sd->first + j - 1]];
        kern_attention_prefill_cuda(s->attn_out, s->probs, s->y, s->kv, s->kv + s->kv_dim, j - i,
                                    m->n_heads, m->n_kv_heads, m->head_dim, (size_t)last + 1,
                                    s->s_comp);
        i = j;
    }
    /* into y, not x: x stays the layers' fixed input, so values never grow layer over layer
     * (the activations are synthetic, whatever the weights; what is timed is the shapes) */
    gemm(s, s->y, PREC_BF16, w + (s->q_dim + 2 * s->kv_dim) * H, s->attn_out, H, s->q_dim, n);
}

/* A SwiGLU FFN of width `inter` from bf16 weights [gate | up | down]. */
static void run_ffn(rp *s, const uint16_t *w, uint64_t inter, uint32_t n) {
    uint64_t H = s->x->m->hidden;
    gemm(s, s->h1, PREC_BF16, w, s->x_act, inter, H, n);
    gemm(s, s->h2, PREC_BF16, w + inter * H, s->x_act, inter, H, n);
    kern_swiglu_cuda(s->h1, s->h1, s->h2, inter * n, s->s_comp);
    gemm(s, s->y, PREC_BF16, w + 2 * inter * H, s->h1, H, inter, n);
}

static void cuda_run(replay_exec *x, const replay_op *op) {
    rp *s = be_of(x);
    const model_geometry *m = x->m;
    uint32_t ml = op->layer, n = op->n_tokens;
    switch (op->kind) {
    case REPLAY_OP_ATTENTION: run_attention(s, op->step, ml); break;
    case REPLAY_OP_DENSE: run_ffn(s, s->w_dense[ml], m->dense_inter, n); break;
    case REPLAY_OP_ROUTER:
        gemm(s, s->y, PREC_BF16, s->w_router[ml], s->x_act, m->n_experts, m->hidden, n);
        break;
    case REPLAY_OP_SHARED:
        run_ffn(s, s->w_shared[ml], (uint64_t)m->shared_inter * m->n_shared_experts, n);
        break;
    case REPLAY_OP_COMBINE:
        replay_combine(s->y, s->ys, s->gates_dev, n, m->top_k, m->hidden, s->s_comp);
        break;
    case REPLAY_OP_LM_HEAD:
        if (n) gemm(s, s->logits, PREC_BF16, s->w_lm, s->x_act, m->vocab, m->hidden, n);
        break;
    }
}

/* The expert's ops on the compute stream, after it waits for the events of the parts in mask
 * still in flight (the latest part's event is the copy the ops are checked against). */
static void cuda_expert(replay_exec *x, uint32_t layer, uint32_t e, moesim_precision p,
                        uint32_t tok, uint32_t mask) {
    rp *s = be_of(x);
    size_t base = memsys_lep(&x->ms, layer, e, p) * PART_COUNT;
    uint64_t H = x->m->hidden, I = x->m->expert_inter;
    for (int part = 0; part < PART_COUNT; part++)
        if (mask & (1u << part) && s->ready[base + part])
            CUDA_CHECK(cudaStreamWaitEvent(s->s_comp, s->ready[base + part], 0));
    cudaEvent_t need = NULL;
    for (int part = PART_COUNT - 1; part >= 0 && !need; part--)
        if (mask & (1u << part)) need = s->ready[base + part];
    char name[64];
    if (mask & (1u << PART_GATE)) {
        replay_exec_expert_name(name, sizeof name, layer, e, p, tok, PART_GATE);
        op_begin_need(s, "expert", name, (int)layer, need);
        gemm(s, s->h1, p, block_ptr(s, base + PART_GATE), s->x_act, I, H, tok);
        gemm(s, s->h2, p, block_ptr(s, base + PART_UP), s->x_act, I, H, tok);
        kern_swiglu_cuda(s->h1, s->h1, s->h2, (size_t)I * tok, s->s_comp);
        cuda_op_end(x);
    }
    if (mask & (1u << PART_DOWN)) {
        replay_exec_expert_name(name, sizeof name, layer, e, p, tok, PART_DOWN);
        op_begin_need(s, "expert", name, (int)layer, need);
        gemm(s, s->y, p, block_ptr(s, base + PART_DOWN), s->h1, H, I, tok);
        cuda_op_end(x);
    }
}

/* ---- steps and their times ---- */

static void cuda_step_begin(replay_exec *x, uint64_t step) {
    (void)step;
    rp *s = be_of(x);
    s->ev_used = 0;
    cuda_wait_compute(x);
    s->ev_step = ev_get(s);
    CUDA_CHECK(cudaEventRecord(s->ev_step, s->s_comp));
}

/* Reads the retired chunks' times (copy engine busy time, h2d timeline track) and frees their
 * events for reuse. The chunks of one engine do not overlap: busy time counts each ns once. */
static void chunks_account(rp *s) {
    replay_exec *x = s->x;
    for (const rp_chunk &c : s->done_chunks) {
        uint64_t a = ev_ns(s, c.ev0), b = ev_ns(s, c.ev1);
        if (a < s->copy_last_end_ns) a = s->copy_last_end_ns;
        if (b > a) s->h2d_busy_ns += b - a;
        if (b > s->copy_last_end_ns) s->copy_last_end_ns = b;
        if (x->tl.on && b > a) {
            char name[64];
            snprintf(name, sizeof name, "L%u e%u %s %s", c.layer, c.expert,
                     precision_name((moesim_precision)c.prec),
                     c.cls == POLICY_DEMAND     ? "demand"
                     : c.cls == POLICY_PREFETCH ? "prefetch"
                                                : "background");
            sim_timeline_slice(&x->tl, SIM_TRACK_H2D, "copy", name, a, b);
        }
        s->cev_free.push_back(c.ev0);
        s->cev_free.push_back(c.ev1);
    }
    s->done_chunks.clear();
}

/* The stream is idle: the step's op events resolve (times, order checks), then the chunks'. */
static void cuda_step_end(replay_exec *x, uint64_t step) {
    rp *s = be_of(x);
    x->step_start[step] = ev_ns(s, s->ev_step);
    x->step_end[step] = ev_ns(s, s->ops.back().ev1);
    for (const rp::op_rec &o : s->ops) {
        replay_op_times t = {ev_ns(s, o.ev0), ev_ns(s, o.ev1), REPLAY_NO_NEED, -1};
        if (o.need) { /* the expert must not start before its copy ended */
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, o.need, o.ev0));
            t.order = ms < 0;
            t.need_ns = ev_ns(s, o.need);
        }
        replay_exec_op_done(x, o.cat, o.name, o.layer, &t);
    }
    s->ops.clear();
    chunks_account(s);
}

/* ---- setup ---- */

static void *dev_alloc(rp *s, uint64_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    s->device_alloc += bytes;
    return p;
}

static void *dev_random(rp *s, uint64_t bytes, uint64_t seed) {
    void *d = dev_alloc(s, bytes);
    void *h = moesim_xmalloc(bytes ? bytes : 16);
    replay_fill_random(h, bytes, seed);
    CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* A non-expert weight buffer of kind k for model layer `layer` on the device: the checkpoint's
 * (replay_weights_nonexpert) or random bytes from `seed`. */
static uint16_t *dev_weights(rp *s, const replay_weights *w, replay_nonexpert k, uint32_t layer,
                             uint64_t seed) {
    uint64_t bytes = replay_nonexpert_elems(s->x->m, k) * 2;
    if (!w) return (uint16_t *)dev_random(s, bytes, seed);
    void *d = dev_alloc(s, bytes);
    uint16_t *h = (uint16_t *)moesim_xmalloc(bytes ? bytes : 16);
    replay_weights_nonexpert(w, k, layer, h);
    CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return (uint16_t *)d;
}

/* The run's store: the caller's when it holds exactly this run's placement (the same precisions,
 * each expert in DRAM or on the SSD alike) of this run's weights, else the run's own. */
static moesim_status store_choose(rp *s, const bool held[PREC_COUNT], moesim_error *err) {
    const replay_exec *x = s->x;
    const replay_inputs *in = x->in;
    const replay_store *b = in->store;
    bool fits = b && b->weights == in->weights && !memcmp(&b->m, x->m, sizeof *x->m);
    size_t LE = (size_t)x->L * x->E;
    for (int p = 0; fits && p < PREC_COUNT; p++) {
        fits = b->held[p] == held[p];
        for (size_t le = 0; fits && held[p] && le < LE; le++)
            fits = (b->host_off[p][le] == UINT64_MAX) == (x->ms.on_ssd[le * PREC_COUNT + p] != 0);
    }
    if (fits) {
        s->store = b;
        return MOESIM_OK;
    }
    moesim_status st = replay_store_make(x->m, held, x->ms.on_ssd, in->ssd_dir, in->weight_seed,
                                  in->weights, &s->own_store, err);
    if (!st) s->store = s->own_store;
    return st;
}

/* Pinned bounce slots for SSD chunks waiting for the H2D engine, one chunk each. memsys hands out
 * an SSD chunk only while the bytes staged (read, not yet copied on) fit sim.bounce_mib, and
 * every chunk is at least the smallest chunk any transfer can have (a whole chunk, or the tail
 * of a transfer of some parts at a held precision), so that many slots never run out. */
static moesim_status bounce_alloc(rp *s, moesim_error *err) {
    const replay_exec *x = s->x;
    if (!s->store->n_on_ssd) return MOESIM_OK;
    uint64_t chunk = x->ms.cfg.chunk_bytes, min_chunk = chunk, max_dev = 0;
    for (int p = 0; p < PREC_COUNT; p++) {
        if (!s->store->held[p]) continue;
        for (uint32_t mask = 1; mask <= POLICY_PARTS_ALL; mask++) {
            uint64_t bytes = 0;
            for (int part = 0; part < PART_COUNT; part++)
                if (mask & (1u << part)) bytes += x->part_bytes[p][part];
            uint64_t tail = bytes % chunk ? bytes % chunk : chunk;
            if (tail < min_chunk) min_chunk = tail;
        }
        for (int part = 0; part < PART_COUNT; part++) { /* a chunk's kernel bytes, at most */
            uint64_t d = (uint64_t)(((unsigned __int128)chunk * s->store->dev_part_bytes[p][part] +
                                     x->part_bytes[p][part] - 1) /
                                    x->part_bytes[p][part]);
            if (d > max_dev) max_dev = d;
        }
    }
    /* each piece (one per part, at most 3) rounds out to O_DIRECT alignment on both sides */
    s->slot_bytes =
        (max_dev + PART_COUNT + 2 * PART_COUNT * SSD_ALIGN + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
    uint64_t n_slots = x->ms.cfg.bounce_bytes / min_chunk;
    MOESIM_ASSERT(n_slots >= 1 && n_slots < INT32_MAX);
    if (cudaHostAlloc((void **)&s->bounce, n_slots * s->slot_bytes, cudaHostAllocDefault) !=
        cudaSuccess) {
        cudaGetLastError();
        return moesim_fail(err, MOESIM_ENOMEM,
                           "cannot pin %.2f GiB of SSD bounce slots (%" PRIu64 " chunks of up to "
                           "%" PRIu64 " bytes: sim.bounce_mib over the smallest copy chunk)",
                           (double)(n_slots * s->slot_bytes) / GIB, n_slots, s->slot_bytes);
    }
    for (int32_t i = (int32_t)n_slots - 1; i >= 0; i--) s->free_slots.push_back(i);
    return MOESIM_OK;
}

static moesim_status cuda_check(replay_exec *x, moesim_error *err) {
    const model_geometry *m = x->m;
    if (x->in->weights) { /* the caller's contract: the checkpoint's own geometry */
        model_geometry g;
        replay_weights_geometry(x->in->weights, m->name, &g);
        MOESIM_ASSERT(!memcmp(&g, m, sizeof g));
    }
    if (!m->n_heads || !m->n_kv_heads || !m->head_dim || m->attention != ATTENTION_GQA)
        return moesim_fail(err, MOESIM_EINPUT,
                           "model '%s': replay times grouped-query attention only (n_heads, "
                           "n_kv_heads, head_dim); MLA and linear attention are not replayed",
                           m->name);
    /* the SSD path always stages in DRAM here (pread into pinned slots, then PCIe) */
    if (x->set.bounce_mib * 1024 < x->set.chunk_kib)
        return moesim_fail(err, MOESIM_EINPUT,
                           "[sim] bounce_mib = %" PRIu64 ": expected at least one copy chunk "
                           "(sim.chunk_kib = %" PRIu64 ")",
                           x->set.bounce_mib, x->set.chunk_kib);
    return MOESIM_OK;
}

/* Host placement keeps the bounce buffer's DRAM free. */
static uint64_t cuda_placement_dram(const replay_exec *x) {
    uint64_t dram = x->in->hw->dram_bytes, bounce = x->ms.cfg.bounce_bytes;
    return dram > bounce ? dram - bounce : 0;
}

static moesim_status cuda_setup(replay_exec *x, moesim_error *err) {
    rp *s = new rp();
    s->x = x;
    x->be_state = s;
    moesim_status st;
    const model_geometry *m = x->m;
    size_t dev_free = 0, dev_total = 0;
    CUDA_CHECK(cudaMemGetInfo(&dev_free, &dev_total));
    x->device_used_before = dev_total - dev_free;

    /* host store: the caller's when it holds this placement of this run's weights (validate
     * shares one over its runs), else the run's own */
    bool held[PREC_COUNT];
    replay_placed_precisions(x->pm, x->pol, x->prec, x->policy_only, x->part_bytes, held);
    if ((st = store_choose(s, held, err))) return st;
    if ((st = bounce_alloc(s, err))) return st;
    for (int p = 0; p < PREC_COUNT; p++) /* blocks only for the formats this run holds */
        for (int part = 0; part < PART_COUNT; part++)
            s->dev_part_bytes[p][part] =
                s->store->held[p] ? s->store->dev_part_bytes[p][part] : 0;
    uint64_t block_bytes[PREC_COUNT];
    block_pool_block_bytes(s->dev_part_bytes, block_bytes);
    /* device: emulate the card, then allocate everything once */
    uint64_t H = m->hidden;
    s->q_dim = m->n_heads && m->head_dim ? (uint64_t)m->n_heads * m->head_dim : H;
    s->kv_dim = (uint64_t)m->n_kv_heads * m->head_dim;
    uint64_t attn_w = replay_nonexpert_elems(m, REPLAY_NX_ATTENTION) * 2;
    uint64_t S = (uint64_t)m->shared_inter * m->n_shared_experts, D = m->dense_inter;
    uint64_t shared_w = replay_nonexpert_elems(m, REPLAY_NX_SHARED) * 2;
    uint64_t dense_w = replay_nonexpert_elems(m, REPLAY_NX_DENSE) * 2;
    uint64_t router_w = replay_nonexpert_elems(m, REPLAY_NX_ROUTER) * 2;
    uint64_t lm_w = replay_nonexpert_elems(m, REPLAY_NX_LM_HEAD) * 2;
    uint64_t T = x->sch.max_step_tokens, B = x->set.batch_size;
    uint64_t wide = H > s->q_dim + 2 * s->kv_dim ? H : s->q_dim + 2 * s->kv_dim;
    if (m->n_experts > wide) wide = m->n_experts;
    uint64_t inter = m->expert_inter;
    if (S > inter) inter = S;
    if (D > inter) inter = D;
    uint64_t xcols = H > inter ? H : inter;
    if (s->q_dim > xcols) xcols = s->q_dim;
    uint32_t max_ctx = 1;
    for (uint64_t i = 0; i < x->tr->n_tokens; i++)
        if (x->tr->position[i] + 1 > max_ctx) max_ctx = x->tr->position[i] + 1;
    s->max_ctx = max_ctx;
    uint64_t arena_bytes = block_pool_arena_bytes(x->bud.per_layer, x->bud.pool_cap_bytes, x->L,
                                                  x->bud.expert_budget_bytes);
    /* every device allocation of the run, summed before any is made */
    const uint64_t sizes[] = {
        arena_bytes,                               /* expert arena */
        attn_w * m->n_layers,                      /* attention weights */
        router_w * m->n_moe_layers,                /* routers */
        shared_w * m->n_moe_layers,                /* shared experts */
        dense_w * (m->n_layers - m->n_moe_layers), /* dense FFNs */
        lm_w,                                      /* LM head */
        T * H * 4,
        T * wide * 4,
        2 * T * inter * 4,
        T * xcols * 2, /* x, y, h1, h2, x_bf16 */
        T * s->q_dim * 4,
        B * m->vocab * 4,                                    /* attention out, logits */
        ((uint64_t)max_ctx * s->kv_dim * 2 + s->kv_dim) * 4, /* KV (one layer's, reused) */
        (uint64_t)ATTN_Q_CHUNK * m->n_heads * max_ctx * 4,   /* attention probabilities */
    };
    uint64_t planned = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) planned += sizes[i];
    if ((st = replay_budget_fit_device(&x->bud, planned, dev_free, RESERVE_BYTES, err))) return st;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->s_comp, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->s_demand, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->s_bg, cudaStreamNonBlocking));
    if ((st = cublas_lazy_handle_init(&s->blas, s->s_comp, err))) return st;
    s->arena = (uint8_t *)dev_alloc(s, arena_bytes);
    size_t LEP = (size_t)x->L * x->E * PREC_COUNT;
    block_pool_init(&x->pool, arena_bytes, block_bytes, LEP * PART_COUNT);
    s->w_attn = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_attn);
    s->w_router = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_router);
    s->w_shared = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_shared);
    s->w_dense = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_dense);
    const replay_weights *w = x->in->weights;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        s->w_attn[l] = dev_weights(s, w, REPLAY_NX_ATTENTION, l, x->in->weight_seed * 977 + l);
        if (m->is_moe_layer[l]) {
            s->w_router[l] = dev_weights(s, w, REPLAY_NX_ROUTER, l, l + 7);
            if (shared_w) s->w_shared[l] = dev_weights(s, w, REPLAY_NX_SHARED, l, l + 11);
        } else if (dense_w) {
            s->w_dense[l] = dev_weights(s, w, REPLAY_NX_DENSE, l, l + 13);
        }
    }
    s->w_lm = dev_weights(s, w, REPLAY_NX_LM_HEAD, 0, 17);
    s->x_act = (float *)dev_random(s, T * H * 4, 19);
    s->y = (float *)dev_alloc(s, T * wide * 4);
    s->h1 = (float *)dev_alloc(s, T * inter * 4);
    s->h2 = (float *)dev_alloc(s, T * inter * 4);
    s->x_bf16 = (uint16_t *)dev_alloc(s, T * xcols * 2);
    s->attn_out = (float *)dev_alloc(s, T * s->q_dim * 4);
    s->logits = (float *)dev_alloc(s, B * m->vocab * 4);
    s->kv = (float *)dev_random(s, ((uint64_t)max_ctx * s->kv_dim * 2 + s->kv_dim) * 4, 23);
    s->probs = (float *)dev_alloc(s, (uint64_t)ATTN_Q_CHUNK * m->n_heads * max_ctx * 4);
    s->ys = (uint16_t *)dev_random(s, T * m->top_k * H * 2, 29);
    s->gates_dev = (float *)dev_alloc(s, T * m->top_k * 4);
    CUDA_CHECK(cudaMemset(s->gates_dev, 0, T * m->top_k * 4));
    MOESIM_ASSERT(s->device_alloc == planned);
    CUDA_CHECK(cudaEventCreate(&s->ev_start));
    s->ready = (cudaEvent_t *)moesim_xcalloc(LEP * PART_COUNT, sizeof(cudaEvent_t));
    return MOESIM_OK;
}

static void cuda_teardown(replay_exec *x) {
    rp *s = be_of(x);
    if (!s) return;
    for (cudaEvent_t e : s->ev_pool) cudaEventDestroy(e);
    for (cudaEvent_t e : s->cev_all) cudaEventDestroy(e);
    if (s->ev_start) cudaEventDestroy(s->ev_start);
    replay_store_destroy(s->own_store);
    if (s->bounce) cudaFreeHost(s->bounce);
    void *dev[] = {s->arena,    s->w_lm, s->x_act, s->y,      s->h1, s->h2,       s->x_bf16,
                   s->attn_out, s->kv,   s->probs, s->logits, s->ys, s->gates_dev};
    for (void *d : dev)
        if (d) cudaFree(d);
    for (uint32_t l = 0; s->w_attn && l < x->m->n_layers; l++) {
        cudaFree(s->w_attn[l]);
        if (s->w_router[l]) cudaFree(s->w_router[l]);
        if (s->w_shared[l]) cudaFree(s->w_shared[l]);
        if (s->w_dense[l]) cudaFree(s->w_dense[l]);
    }
    free(s->w_attn);
    free(s->w_router);
    free(s->w_shared);
    free(s->w_dense);
    cublas_lazy_handle_free(&s->blas);
    if (s->s_comp) cudaStreamDestroy(s->s_comp);
    if (s->s_demand) cudaStreamDestroy(s->s_demand);
    if (s->s_bg) cudaStreamDestroy(s->s_bg);
    free(s->ready);
    delete s;
    x->be_state = NULL;
}

/* ---- warm-up, clock, drain ---- */

/* Copies the loads the policy issued during warm-up (memsys.warm: they are resident in memsys
 * already) before the clock starts, part by part from DRAM or through a bounce slot. */
static void cuda_warm_copy(replay_exec *x) {
    rp *s = be_of(x);
    for (uint32_t i = 0; i < x->ms.n_warm; i++) {
        uint32_t lep = x->ms.warm[i], p = lep % PREC_COUNT, le = lep / PREC_COUNT;
        const replay_store *st = s->store;
        for (int part = 0; part < PART_COUNT; part++) {
            if (!(x->ms.warm_parts[i] & (1u << part))) continue;
            uint8_t *dst = block_ptr(s, (size_t)lep * PART_COUNT + part);
            uint64_t off = part_blob_offset(s, p, part), n = s->dev_part_bytes[p][part];
            if (st->host_off[p][le] != UINT64_MAX) {
                CUDA_CHECK(cudaMemcpy(dst, st->host[p] + st->host_off[p][le] + off, n,
                                      cudaMemcpyHostToDevice));
                continue;
            }
            uint64_t piece = s->slot_bytes - 2 * SSD_ALIGN; /* what one slot reads at a time */
            for (uint64_t o = 0; o < n; o += piece) {
                uint64_t len = n - o < piece ? n - o : piece, used = 0;
                const uint8_t *src = ssd_pread(s, p, le, off + o, len, 0, &used);
                CUDA_CHECK(cudaMemcpy(dst + o, src, len, cudaMemcpyHostToDevice));
            }
        }
    }
}

/* The event clock and the host clock start together, the device idle. */
static void cuda_clock_start(replay_exec *x) {
    rp *s = be_of(x);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaEventRecord(s->ev_start, s->s_comp));
    CUDA_CHECK(cudaEventSynchronize(s->ev_start));
    x->t0_ns = replay_exec_clock_ns();
}

static void cuda_drain(replay_exec *x) {
    rp *s = be_of(x);
    pump(s);
    while (!s->inflight.empty()) wait_next_chunk(s);
    for (int e = 0; e < MEMSYS_ENGINES; e++)
        for (int c = 0; c < MEMSYS_CLASSES; c++) MOESIM_ASSERT(x->ms.head[e][c] == NONE);
    CUDA_CHECK(cudaDeviceSynchronize());
}

static void cuda_finish(replay_exec *x) {
    rp *s = be_of(x);
    chunks_account(s); /* the drained copies */
    x->h2d_busy_ns = s->h2d_busy_ns;
    x->ssd_busy_ns = s->ssd_busy_ns;
    x->h2d_copied_bytes = s->h2d_dev_bytes;
    x->device_alloc_bytes = s->device_alloc;
    size_t dev_free = 0, dev_total = 0; /* while the run holds everything */
    CUDA_CHECK(cudaMemGetInfo(&dev_free, &dev_total));
    x->device_used_peak = dev_total - dev_free;
}

extern "C" const replay_backend replay_backend_cuda = {
    "cuda",
    cuda_check,
    cuda_placement_dram,
    cuda_setup,
    cuda_teardown,
    cuda_copy_kick,
    cuda_part_released,
    cuda_warm_copy,
    cuda_clock_start,
    cuda_step_begin,
    cuda_step_end,
    cuda_wait_compute,
    cuda_wait_copy,
    cuda_expert_wait,
    cuda_op_begin,
    cuda_run,
    cuda_op_end,
    cuda_expert,
    cuda_drain,
    NULL, /* io_status: an SSD read error aborts (ssd_pread) */
    cuda_finish,
};

extern "C" moesim_status replay_run(const replay_inputs *in, const char *policy_name,
                                    config *settings, sim_result *out, replay_checks *checks,
                                    moesim_error *err) {
    moesim_status st = replay_device_check(err);
    if (st) return st;
    return replay_exec_run(&replay_backend_cuda, in, policy_name, settings, out, checks, err);
}
