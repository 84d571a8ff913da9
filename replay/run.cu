/* The GPU replay run (replay/replay.h): the policy API's memory system for real, and the run
 * loop that drives the same policy object as sim_run over the same schedule and routing.
 *
 * Device memory, allocated once before the clock starts (no cudaMalloc on the hot path): the
 * non-expert weights of every layer (bf16: the checkpoint's, replay/weights.h, or random),
 * activations and a KV buffer, and one arena of the expert budget carved into fixed-size blocks
 * per precision (one block holds one part: gate, up or down, in the kernels' block format). Host:
 * every expert at every stored precision in pinned memory (cudaHostAlloc): the checkpoint's in
 * the kernels' formats, or random bytes from a seeded xorshift stream.
 *
 * Copies: the host keeps the simulator's three priority queues (demand > prefetch > background)
 * and feeds at most COPY_WINDOW chunks of sim.chunk_kib at a time to the copy streams (demand
 * chunks on the demand stream, the others on the background stream), so a demand load overtakes
 * queued prefetches at the next chunk boundary. Every chunk ends with an event; a part is resident
 * when the event after its last chunk completed. The compute stream waits (cudaStreamWaitEvent)
 * for those events right before each expert op, and an event before every op lets the run check
 * afterwards that no expert started before its copy ended.
 *
 * Time: the policy sees now_ns from the host clock (CLOCK_MONOTONIC since the run started); the
 * host waits for the compute stream before every on_route, as an offloading engine waits for the
 * router's output. Figures and the timeline come from CUDA events (ns from the run's first
 * event). */
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include <gsl/gsl_statistics_double.h>

/* The project's C headers spell two C11 keywords that C++ writes differently. */
#define _Noreturn [[noreturn]]
#define _Static_assert static_assert
extern "C" {
#include "common/alloc.h"
#include "common/check.h"
#include "kernels/quant.h"
#include "replay/replay.h"
#include "sim/route.h"
#include "sim/timeline.h"
}
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "replay/gemm.cuh"

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
        return moesim_fail(err, MOESIM_EINPUT, "no CUDA device (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    return MOESIM_OK;
}

static uint64_t host_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fill_random(void *p, size_t bytes, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1, *w = (uint64_t *)p;
    for (size_t i = 0; i < bytes / 8; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        /* bf16 pairs and quant codes: keep exponents small so no value is inf or NaN */
        w[i] = (s * 0x2545f4914f6cdd1dull) & 0x3f7f3f7f3f7f3f7full;
    }
}

/* ---- the host store: pinned DRAM, and an SSD file for what does not fit ---- */

struct replay_store {
    model_geometry m;
    const replay_weights *weights; /* the checkpoint the experts come from, or NULL: random */
    moesim_precision primary;
    bool stored[PREC_COUNT];
    uint64_t dev_part_bytes[PREC_COUNT][PART_COUNT]; /* kernel format bytes of one part */
    uint64_t blob_bytes[PREC_COUNT];                 /* gate | up | down of one expert */
    uint64_t *host_off[PREC_COUNT];  /* [L*E] offset in host[p], or UINT64_MAX: on the SSD */
    uint8_t *host[PREC_COUNT];       /* pinned DRAM experts, blob_bytes each, packed */
    uint64_t ssd_stride[PREC_COUNT]; /* blob_bytes rounded up to SSD_ALIGN */
    uint64_t *ssd_off[PREC_COUNT];   /* [L*E] offset in the SSD file of p, or UINT64_MAX */
    int ssd_fd[PREC_COUNT];          /* O_DIRECT read descriptor, or -1 */
    char ssd_path[PREC_COUNT][600];
    uint64_t n_on_ssd;
};

#define FILL_TILE (64ull << 20) /* random bytes are made once per tile and repeated */
#define SSD_ALIGN 4096ull       /* O_DIRECT: offsets, sizes and buffers aligned to this */
#define SSD_SLOTS 8             /* bounce slots; ssd_read asserts one is free (<= 5 in use) */

/* Random weights: a seeded tile repeated over the buffer (timing depends on bytes, not values;
 * making 60 GB of fresh random numbers would dominate a validation run). */
static void fill_tiled(uint8_t *p, uint64_t bytes, uint64_t seed) {
    uint64_t tile = bytes < FILL_TILE ? bytes : FILL_TILE;
    fill_random(p, tile, seed);
    for (uint64_t o = tile; o < bytes; o += tile)
        memcpy(p + o, p, bytes - o < tile ? bytes - o : tile);
}

static moesim_status parse_host_precisions(const char *text, moesim_precision primary,
                                           bool stored[PREC_COUNT], moesim_error *err);

/* Writes the SSD file of precision p: n blobs at ssd_stride, the experts from index `le_first`
 * of the checkpoint (a batch of blobs at a time), or random bytes (one tile repeated); then
 * reopens it for O_DIRECT reads. */
static moesim_status ssd_file_make(replay_store *r, int p, uint64_t le_first, uint64_t n,
                                   const char *dir, uint64_t seed, moesim_error *err) {
    snprintf(r->ssd_path[p], sizeof r->ssd_path[p], "%s/moesim-replay-ssd-%d-%s.bin", dir,
             (int)getpid(), precision_name((moesim_precision)p));
    int fd = open(r->ssd_path[p], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot create the SSD store (%s)", r->ssd_path[p],
                           strerror(errno));
    uint64_t stride = r->ssd_stride[p], bytes = n * stride;
    /* a tile of whole blobs for checkpoint experts, so batch b is blobs [b * per, ...) */
    uint64_t per = FILL_TILE / stride ? FILL_TILE / stride : 1;
    uint64_t tile = r->weights ? per * stride : FILL_TILE;
    if (tile > bytes) tile = bytes;
    uint8_t *buf = (uint8_t *)moesim_xcalloc(1, tile);
    if (!r->weights) fill_random(buf, tile, seed);
    for (uint64_t o = 0; o < bytes;) {
        uint64_t want = bytes - o < tile ? bytes - o : tile;
        if (r->weights)
            replay_weights_experts(r->weights, (moesim_precision)p, le_first + o / stride,
                                   want / stride, buf, stride);
        for (uint64_t done = 0; done < want;) {
            ssize_t w = pwrite(fd, buf + done, want - done, (off_t)(o + done));
            if (w <= 0) {
                free(buf);
                close(fd);
                return moesim_fail(err, MOESIM_EIO, "%s: write failed after %" PRIu64 " bytes (%s)",
                                   r->ssd_path[p], o + done, strerror(errno));
            }
            done += (uint64_t)w;
        }
        o += want;
    }
    free(buf);
    if (fsync(fd) || close(fd))
        return moesim_fail(err, MOESIM_EIO, "%s: %s", r->ssd_path[p], strerror(errno));
    r->ssd_fd[p] = open(r->ssd_path[p], O_RDONLY | O_DIRECT);
    if (r->ssd_fd[p] < 0)
        return moesim_fail(err, MOESIM_EIO,
                           "%s: cannot open with O_DIRECT (%s); put the SSD store on a disk "
                           "file system (tmpfs may refuse O_DIRECT)",
                           r->ssd_path[p], strerror(errno));
    return MOESIM_OK;
}

/* replay_store_create and replay_store_create_checkpoint: experts from `w`, or random from
 * `seed` when w is NULL. */
static moesim_status store_make(const model_geometry *m, const quant_table *q,
                                const char *host_precisions, moesim_precision primary,
                                uint64_t dram_bytes, const char *ssd_dir, uint64_t seed,
                                const replay_weights *w, replay_store **out, moesim_error *err) {
    moesim_status st = replay_device_check(err);
    if (st) return st;
    replay_store *r = (replay_store *)moesim_xcalloc(1, sizeof *r);
    r->m = *m;
    r->weights = w;
    r->primary = primary;
    for (int p = 0; p < PREC_COUNT; p++) r->ssd_fd[p] = -1;
    if ((st = parse_host_precisions(host_precisions, primary, r->stored, err))) {
        free(r);
        return st;
    }
    size_t LE = (size_t)m->n_moe_layers * m->n_experts;
    uint64_t acct[PREC_COUNT] = {0}; /* the simulator's bytes of one expert (placement) */
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT && r->stored[p]; part++) {
            uint64_t cols = part == PART_DOWN ? m->expert_inter : m->hidden;
            if (p != PREC_BF16 && cols % QUANT_GROUP) {
                replay_store_destroy(r);
                return moesim_fail(err, MOESIM_EINPUT,
                                   "model '%s': width %" PRIu64 " is not a multiple of the %d-wide "
                                   "quantization groups of the %s kernels",
                                   m->name, cols, QUANT_GROUP, precision_name((moesim_precision)p));
            }
            r->dev_part_bytes[p][part] =
                replay_part_bytes(m, (moesim_precision)p, (expert_part)part);
            r->blob_bytes[p] += r->dev_part_bytes[p][part];
            acct[p] += model_expert_part_bytes(m, q, (expert_part)part, (moesim_precision)p);
        }
    /* sim.c's place_on_ssd: expert.precision first, then the smaller formats first; layers and
     * experts in order until DRAM is full */
    int order[PREC_COUNT], n_order = 0;
    order[n_order++] = primary;
    for (;;) {
        int best = -1;
        for (int p = 0; p < PREC_COUNT; p++) {
            bool used = false;
            for (int i = 0; i < n_order; i++) used |= order[i] == p;
            if (!used && r->stored[p] && (best < 0 || acct[p] < acct[best])) best = p;
        }
        if (best < 0) break;
        order[n_order++] = best;
    }
    uint64_t left = dram_bytes, host_bytes[PREC_COUNT] = {0}, n_ssd[PREC_COUNT] = {0};
    for (int i = 0; i < n_order; i++) {
        int p = order[i];
        r->host_off[p] = (uint64_t *)moesim_xmalloc(LE * sizeof(uint64_t));
        r->ssd_off[p] = (uint64_t *)moesim_xmalloc(LE * sizeof(uint64_t));
        r->ssd_stride[p] = (r->blob_bytes[p] + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
        for (size_t le = 0; le < LE; le++) {
            if (acct[p] <= left) {
                left -= acct[p];
                r->host_off[p][le] = host_bytes[p];
                r->ssd_off[p][le] = UINT64_MAX;
                host_bytes[p] += r->blob_bytes[p];
            } else {
                r->host_off[p][le] = UINT64_MAX;
                r->ssd_off[p][le] = n_ssd[p]++ * r->ssd_stride[p];
            }
        }
        /* DRAM only shrinks: the experts in DRAM are a prefix of (layer, expert) order, the
         * SSD file holds the rest in order (what filling them from a checkpoint relies on) */
        MOESIM_ASSERT(!n_ssd[p] || r->ssd_off[p][LE - n_ssd[p]] == 0);
        r->n_on_ssd += n_ssd[p];
    }
    for (int p = 0; p < PREC_COUNT; p++) {
        if (host_bytes[p]) {
            if (cudaHostAlloc((void **)&r->host[p], host_bytes[p], cudaHostAllocDefault) !=
                cudaSuccess) {
                cudaGetLastError();
                replay_store_destroy(r);
                return moesim_fail(err, MOESIM_ENOMEM,
                                   "cannot pin %.2f GiB of host memory for the %s experts (the "
                                   "profile's dram_gib decides how much is kept in DRAM)",
                                   host_bytes[p] / GIB, precision_name((moesim_precision)p));
            }
            if (w)
                replay_weights_experts(w, (moesim_precision)p, 0, LE - n_ssd[p], r->host[p],
                                       r->blob_bytes[p]);
            else
                fill_tiled(r->host[p], host_bytes[p], seed * 131 + (uint64_t)p);
        }
        if (n_ssd[p] && (st = ssd_file_make(r, p, LE - n_ssd[p], n_ssd[p],
                                            ssd_dir ? ssd_dir : "/var/tmp", seed * 131 + p, err))) {
            replay_store_destroy(r);
            return st;
        }
    }
    *out = r;
    return MOESIM_OK;
}

extern "C" moesim_status replay_store_create(const model_geometry *m, const quant_table *q,
                                             const char *host_precisions, moesim_precision primary,
                                             uint64_t dram_bytes, const char *ssd_dir,
                                             uint64_t seed, replay_store **out, moesim_error *err) {
    return store_make(m, q, host_precisions, primary, dram_bytes, ssd_dir, seed, NULL, out, err);
}

extern "C" moesim_status
replay_store_create_checkpoint(const model_geometry *m, const quant_table *q,
                               const char *host_precisions, moesim_precision primary,
                               uint64_t dram_bytes, const char *ssd_dir, const replay_weights *w,
                               replay_store **out, moesim_error *err) {
    MOESIM_ASSERT(w);
    return store_make(m, q, host_precisions, primary, dram_bytes, ssd_dir, 0, w, out, err);
}

extern "C" moesim_status replay_store_expert(const replay_store *r, uint32_t moe_layer,
                                             uint32_t expert, moesim_precision p, uint8_t *blob,
                                             moesim_error *err) {
    MOESIM_ASSERT(moe_layer < r->m.n_moe_layers && expert < r->m.n_experts);
    if ((unsigned)p >= PREC_COUNT || !r->stored[p])
        return moesim_fail(err, MOESIM_EINPUT, "the store holds no %s experts", precision_name(p));
    const size_t le = (size_t)moe_layer * r->m.n_experts + expert;
    if (r->host_off[p][le] != UINT64_MAX) {
        memcpy(blob, r->host[p] + r->host_off[p][le], r->blob_bytes[p]);
        return MOESIM_OK;
    }
    /* a plain descriptor: O_DIRECT would want an aligned buffer and length */
    int fd = open(r->ssd_path[p], O_RDONLY);
    uint64_t done = 0;
    while (fd >= 0 && done < r->blob_bytes[p]) {
        ssize_t n =
            pread(fd, blob + done, r->blob_bytes[p] - done, (off_t)(r->ssd_off[p][le] + done));
        if (n <= 0) break;
        done += (uint64_t)n;
    }
    int e = errno;
    if (fd >= 0) close(fd);
    if (done < r->blob_bytes[p])
        return moesim_fail(err, MOESIM_EIO, "%s: cannot read expert %u of MoE layer %u (%s)",
                           r->ssd_path[p], expert, moe_layer,
                           fd < 0 || e ? strerror(e) : "short file");
    return MOESIM_OK;
}

extern "C" void replay_store_destroy(replay_store *r) {
    if (!r) return;
    for (int p = 0; p < PREC_COUNT; p++) {
        if (r->host[p]) cudaFreeHost(r->host[p]);
        free(r->host_off[p]);
        free(r->ssd_off[p]);
        if (r->ssd_fd[p] >= 0) close(r->ssd_fd[p]);
        if (r->ssd_path[p][0]) unlink(r->ssd_path[p]);
    }
    free(r);
}

/* ---- state ---- */

typedef struct rp_xfer {
    uint32_t layer, expert;
    uint8_t prec, parts, cls, next_part; /* next_part: first part not fully submitted */
    bool started;
    uint64_t sent; /* bytes of next_part already submitted */
    uint64_t seq;
    uint64_t t_issue_ns;
    int32_t slot; /* bounce buffer slot holding the expert read from the SSD, or -1 */
} rp_xfer;

typedef struct rp_chunk {
    uint32_t xfer;
    int part; /* part this chunk ends, or -1 */
    cudaEvent_t ev0, ev1;
    uint64_t bytes;
} rp_chunk;

struct policy_mem {
    const trace *tr;
    const model_geometry *m;
    sim_settings set;
    replay_schedule sch;
    replay_budget bud;
    uint32_t L, E, K, P;
    moesim_precision prec;
    uint64_t part_bytes[PREC_COUNT][PART_COUNT];     /* accounting bytes (the simulator's) */
    uint64_t dev_part_bytes[PREC_COUNT][PART_COUNT]; /* kernel format bytes (the blocks) */
    uint64_t block_bytes[PREC_COUNT];
    uint64_t chunk_bytes;
    quant_table quant;

    /* memory system */
    uint8_t *state;     /* [L*E*P*3] policy_residency */
    uint32_t *block;    /* [L*E*P*3] device block index of the part, or NONE */
    uint32_t *xfer_of;  /* [L*E*P*3] */
    cudaEvent_t *ready; /* [L*E*P*3] event after the part's last chunk (NULL: warmup) */
    uint8_t *pinned;    /* [L*E*P] */
    uint64_t *pool_used;
    uint64_t prec_used[PREC_COUNT], experts_used, experts_peak;
    bool warmup;
    std::vector<uint32_t> warm_lep;
    std::vector<uint8_t> warm_parts;

    /* device arena: fixed blocks per precision carved from one allocation */
    uint8_t *arena;
    uint64_t arena_bytes, arena_top;
    std::vector<uint32_t> free_blocks[PREC_COUNT];
    std::vector<uint64_t> block_off[PREC_COUNT];
    uint64_t physical_refusals;

    /* host store: borrowed from the inputs, or the run's own */
    const replay_store *store;
    replay_store *own_store;
    uint8_t *bounce;     /* [SSD_SLOTS][slot_bytes] pinned: experts read from the SSD */
    uint64_t slot_bytes; /* the largest SSD stride */
    std::vector<int32_t> free_slots;
    uint64_t ssd_bytes, ssd_busy_ns;

    /* copies */
    std::vector<rp_xfer> xf;
    std::vector<uint32_t> q[3]; /* FIFO per class (indices into xf), head at q_head */
    size_t q_head[3];
    std::vector<rp_chunk> inflight;
    std::vector<rp_chunk> done_chunks; /* retired, not yet accounted (busy time, timeline) */
    std::vector<cudaEvent_t> cev_all, cev_free; /* chunk events: reused once accounted */
    uint64_t h2d_busy_ns, copy_last_end_ns;
    std::vector<uint32_t> pinned_lep; /* pinned by the last route until the stream is idle */
    cudaStream_t s_demand, s_bg, s_comp;
    uint64_t xfer_seq, h2d_bytes, prefetches, warmup_bytes;

    /* policy */
    const policy_methods *pm;
    policy *pol;
    policy_mem_view view;
    void *knobs;
    policy_params params;
    uint64_t t0_host;

    /* route scratch (as sim.c) */
    uint16_t *r_experts, *active, *r_la_ids;
    float *r_gates, *r_importance, *active_gate, *r_la_scores;
    uint32_t *active_tokens, *stamp, *slot, *order, stamp_gen;
    uint64_t *order_key;
    uint8_t *plan, *pf_mark;
    uint32_t *pf_count, la_depth, la_k;
    uint64_t pf_hit, pf_active, pf_issued_sets;
    sim_route_tally tally; /* accesses, hits, skips and gate mass by precision class (as sim.c) */
    uint64_t expert_ops, sub_routes;
    /* oracle support, as sim.c (built on first use) */
    std::vector<uint64_t> use_first, use_cur, use_pos; /* [L*E+1], [L*E], [accesses] */
    uint64_t access_pos, cur_step;
    int64_t cur_layer;

    /* compute */
    cublas_lazy_handle blas; /* on s_comp */
    uint16_t **w_attn;       /* [n_layers] q|k|v|o bf16 */
    uint16_t **w_router, **w_shared, **w_dense, *w_lm;
    float *x, *y, *h1, *h2, *kv, *attn_out, *probs, *logits, *gates_dev;
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
    cudaEvent_t ev_start;
    uint64_t order_checked, order_violations;
    uint64_t stall_ns;
    sim_timeline tl;
    const sim_hooks *hooks;
};
typedef struct policy_mem rp;

static size_t lep_of(const rp *s, uint32_t l, uint32_t e, uint32_t p) {
    return ((size_t)l * s->E + e) * s->P + p;
}

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

/* ---- blocks ---- */

static uint32_t block_take(rp *s, uint32_t p) {
    if (!s->free_blocks[p].empty()) {
        uint32_t b = s->free_blocks[p].back();
        s->free_blocks[p].pop_back();
        return b;
    }
    uint64_t need = s->block_bytes[p];
    if (s->arena_top + need > s->arena_bytes) return NONE;
    s->block_off[p].push_back(s->arena_top);
    s->arena_top += need;
    return (uint32_t)(s->block_off[p].size() - 1);
}

static void *block_ptr(rp *s, uint32_t p, uint32_t b) { return s->arena + s->block_off[p][b]; }

/* Where part `part` of (l, e, p) is on the host: its pinned DRAM blob, or the bounce slot an SSD
 * read filled (slot >= 0). */
static const uint8_t *host_part(rp *s, uint32_t l, uint32_t e, uint32_t p, int part, int32_t slot) {
    uint64_t po = 0;
    for (int q = 0; q < part; q++) po += s->dev_part_bytes[p][q];
    if (slot >= 0) return s->bounce + (uint64_t)slot * s->slot_bytes + po;
    uint64_t off = s->store->host_off[p][(size_t)l * s->E + e];
    MOESIM_ASSERT(off != UINT64_MAX);
    return s->store->host[p] + off + po;
}

/* ---- copies ---- */

/* Reads the parts of x's expert from the SSD store (O_DIRECT, the aligned range covering them)
 * into a free bounce slot, on the host thread: SSD time then PCIe time, as the simulator models a
 * GPU without GPUDirect Storage. An I/O error mid-run cannot be recovered: reported, aborted. */
static void ssd_read(rp *s, rp_xfer *x) {
    MOESIM_ASSERT(!s->free_slots.empty()); /* at most 3 class heads + COPY_WINDOW transfers */
    x->slot = s->free_slots.back();
    s->free_slots.pop_back();
    const replay_store *st = s->store;
    size_t le = (size_t)x->layer * s->E + x->expert;
    uint64_t lo = UINT64_MAX, hi = 0, po = 0, bytes = 0;
    for (int part = 0; part < PART_COUNT; part++) {
        uint64_t n = s->dev_part_bytes[x->prec][part];
        if (x->parts & (1u << part)) {
            if (po < lo) lo = po;
            hi = po + n;
            bytes += n;
        }
        po += n;
    }
    lo = lo / SSD_ALIGN * SSD_ALIGN;
    hi = (hi + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
    uint8_t *dst = s->bounce + (uint64_t)x->slot * s->slot_bytes;
    uint64_t t0 = host_ns();
    for (uint64_t o = lo; o < hi;) {
        ssize_t r =
            pread(st->ssd_fd[x->prec], dst + o, hi - o, (off_t)(st->ssd_off[x->prec][le] + o));
        if (r <= 0) cuda_check_fail("pread", strerror(r < 0 ? errno : EIO), __FILE__, __LINE__);
        o += (uint64_t)r;
    }
    uint64_t t1 = host_ns();
    if (s->warmup) return; /* initial placement: before the clock starts */
    s->ssd_busy_ns += t1 - t0;
    s->ssd_bytes += bytes;
    if (s->tl.on) {
        char name[64];
        snprintf(name, sizeof name, "L%u e%u %s ssd", x->layer, x->expert,
                 precision_name((moesim_precision)x->prec));
        sim_timeline_slice(&s->tl, SIM_TRACK_SSD, "ssd", name, t0 - s->t0_host, t1 - s->t0_host);
    }
}

static bool on_ssd(const rp *s, uint32_t layer, uint32_t expert, uint32_t p) {
    return s->store->host_off[p][(size_t)layer * s->E + expert] == UINT64_MAX;
}

static void deliver(rp *s, uint32_t xi, uint64_t now_ns) {
    rp_xfer *x = &s->xf[xi];
    if (s->pm->on_transfer_done)
        s->pm->on_transfer_done(s->pol, x->layer, x->expert, (moesim_precision)x->prec, x->parts,
                                (policy_class)x->cls, now_ns);
}

/* Retires finished chunks in submission order: parts become resident and the policy hears of
 * completed loads. Never called from inside a policy callback (on_route may be issuing loads). */
static void retire(rp *s) {
    while (!s->inflight.empty()) {
        rp_chunk c = s->inflight.front();
        cudaError_t e = cudaEventQuery(c.ev1);
        if (e == cudaErrorNotReady) break;
        CUDA_CHECK(e);
        s->inflight.erase(s->inflight.begin());
        s->done_chunks.push_back(c);
        if (c.part < 0) continue;
        rp_xfer *x = &s->xf[c.xfer];
        size_t pi = lep_of(s, x->layer, x->expert, x->prec) * PART_COUNT + (size_t)c.part;
        if (s->state[pi] == POLICY_LOADING && s->xfer_of[pi] == c.xfer) {
            s->state[pi] = POLICY_RESIDENT;
            s->xfer_of[pi] = NONE;
            s->ready[pi] = NULL; /* landed: later ops need not wait (nor keep the event) */
        }
        bool all = true;
        for (int part = 0; part < PART_COUNT; part++)
            if (x->parts & (1u << part)) {
                size_t pj = lep_of(s, x->layer, x->expert, x->prec) * PART_COUNT + (size_t)part;
                all &= s->state[pj] != POLICY_LOADING || s->xfer_of[pj] != c.xfer;
            }
        if (all && x->parts && c.part == 31 - __builtin_clz(x->parts)) {
            if (x->slot >= 0) { /* its bytes have left the bounce buffer */
                s->free_slots.push_back(x->slot);
                x->slot = -1;
            }
            deliver(s, c.xfer, host_ns() - s->t0_host);
        }
    }
}

/* Keeps COPY_WINDOW chunks in flight, taking the next chunk of the highest non-empty class:
 * a demand load overtakes queued prefetches at the next chunk boundary. */
static void submit(rp *s) {
    while (s->inflight.size() < COPY_WINDOW) {
        int cls = -1;
        for (int k = 0; k < 3 && cls < 0; k++)
            while (s->q_head[k] < s->q[k].size()) {
                rp_xfer *x = &s->xf[s->q[k][s->q_head[k]]];
                if (x->parts && x->next_part < PART_COUNT) {
                    cls = k;
                    break;
                }
                s->q_head[k]++; /* finished or cancelled */
            }
        if (cls < 0) break;
        uint32_t xi = s->q[cls][s->q_head[cls]];
        rp_xfer *x = &s->xf[xi];
        while (x->next_part < PART_COUNT && !(x->parts & (1u << x->next_part))) x->next_part++;
        if (x->next_part >= PART_COUNT) continue;
        int part = x->next_part;
        if (!x->started && on_ssd(s, x->layer, x->expert, x->prec)) ssd_read(s, x);
        size_t pi = lep_of(s, x->layer, x->expert, x->prec) * PART_COUNT + (size_t)part;
        uint64_t total = s->dev_part_bytes[x->prec][part];
        uint64_t n = total - x->sent < s->chunk_bytes ? total - x->sent : s->chunk_bytes;
        cudaStream_t st = cls == POLICY_DEMAND ? s->s_demand : s->s_bg;
        rp_chunk c = {xi, -1, cev_get(s), cev_get(s), n};
        CUDA_CHECK(cudaEventRecord(c.ev0, st));
        CUDA_CHECK(
            cudaMemcpyAsync((uint8_t *)block_ptr(s, x->prec, s->block[pi]) + x->sent,
                            host_part(s, x->layer, x->expert, x->prec, part, x->slot) + x->sent, n,
                            cudaMemcpyHostToDevice, st));
        CUDA_CHECK(cudaEventRecord(c.ev1, st));
        x->started = true;
        x->sent += n;
        s->h2d_bytes += n;
        if (x->sent == total) {
            c.part = part;
            s->ready[pi] = c.ev1;
            x->next_part++;
            x->sent = 0;
        }
        s->inflight.push_back(c);
    }
}

static void pump(rp *s) {
    retire(s);
    submit(s);
}

/* ---- the memory system of the policy API ---- */

static policy_residency mem_state(const policy_mem *m, uint32_t layer, uint32_t expert,
                                  moesim_precision p, expert_part part) {
    MOESIM_ASSERT(layer < m->L && expert < m->E && (uint32_t)p < m->P && part < PART_COUNT);
    return (policy_residency)m->state[lep_of(m, layer, expert, p) * PART_COUNT + part];
}

static uint64_t *pool_of(rp *s, uint32_t layer) {
    return &s->pool_used[s->bud.per_layer ? layer : 0];
}

/* The HBM counter of the timeline (the simulator's "hbm" track: bytes of expert weights) and the
 * peak the result reports. */
static void hbm_note(rp *s) {
    if (s->experts_used > s->experts_peak) s->experts_peak = s->experts_used;
    if (s->tl.on && !s->warmup)
        sim_timeline_counter(&s->tl, "hbm", host_ns() - s->t0_host, (double)s->experts_used);
}

static void release_part(rp *s, uint32_t layer, uint32_t p, size_t pi, int part) {
    s->free_blocks[p].push_back(s->block[pi]);
    s->block[pi] = NONE;
    s->state[pi] = POLICY_ABSENT;
    s->ready[pi] = NULL;
    *pool_of(s, layer) -= s->part_bytes[p][part];
    s->prec_used[p] -= s->part_bytes[p][part];
    s->experts_used -= s->part_bytes[p][part];
    hbm_note(s);
}

static policy_mem_result mem_load(policy_mem *s, uint32_t layer, uint32_t expert,
                                  moesim_precision p, uint32_t parts_mask, policy_class cls) {
    MOESIM_ASSERT(layer < s->L && expert < s->E && (uint32_t)p < s->P);
    MOESIM_ASSERT(parts_mask && parts_mask <= POLICY_PARTS_ALL && (unsigned)cls < 3);
    size_t lep = lep_of(s, layer, expert, p);
    uint32_t need = 0;
    uint64_t bytes = 0;
    for (int part = 0; part < PART_COUNT; part++) {
        if (!(parts_mask & (1u << part))) continue;
        if (!s->part_bytes[p][part]) return POLICY_REFUSED;
        if (s->state[lep * PART_COUNT + part] != POLICY_ABSENT) continue;
        need |= 1u << part;
        bytes += s->part_bytes[p][part];
    }
    if (!need) return POLICY_ALREADY;
    if (*pool_of(s, layer) + bytes > s->bud.pool_cap_bytes) return POLICY_REFUSED;
    uint32_t got[PART_COUNT] = {NONE, NONE, NONE};
    for (int part = 0; part < PART_COUNT; part++)
        if (need & (1u << part) && (got[part] = block_take(s, p)) == NONE) {
            for (int q = 0; q < part; q++)
                if (got[q] != NONE) s->free_blocks[p].push_back(got[q]);
            s->physical_refusals++;
            return POLICY_REFUSED;
        }
    *pool_of(s, layer) += bytes;
    s->prec_used[p] += bytes;
    s->experts_used += bytes;
    hbm_note(s);
    uint32_t xi = (uint32_t)s->xf.size();
    rp_xfer x = {layer,         expert,    (uint8_t)p, (uint8_t)need, (uint8_t)cls, 0, false, 0,
                 s->xfer_seq++, host_ns(), -1};
    for (int part = 0; part < PART_COUNT; part++)
        if (need & (1u << part)) {
            size_t pi = lep * PART_COUNT + part;
            s->block[pi] = got[part];
            s->state[pi] = POLICY_LOADING;
            s->xfer_of[pi] = xi;
        }
    if (s->warmup) { /* initial placement: copied before the clock starts */
        if (on_ssd(s, layer, expert, p)) ssd_read(s, &x);
        for (int part = 0; part < PART_COUNT; part++)
            if (need & (1u << part)) {
                size_t pi = lep * PART_COUNT + part;
                CUDA_CHECK(cudaMemcpy(block_ptr(s, p, got[part]),
                                      host_part(s, layer, expert, p, part, x.slot),
                                      s->dev_part_bytes[p][part], cudaMemcpyHostToDevice));
                s->state[pi] = POLICY_RESIDENT;
                s->xfer_of[pi] = NONE;
            }
        if (x.slot >= 0) s->free_slots.push_back(x.slot);
        s->warmup_bytes += bytes;
        s->warm_lep.push_back((uint32_t)lep);
        s->warm_parts.push_back((uint8_t)(need | (uint32_t)cls << 4));
        return POLICY_ISSUED;
    }
    s->xf.push_back(x);
    s->q[cls].push_back(xi);
    if (cls == POLICY_PREFETCH) {
        s->prefetches++;
        size_t le = (size_t)layer * s->E + expert;
        if (!s->pf_mark[le]) {
            s->pf_mark[le] = 1;
            s->pf_count[layer]++;
        }
    }
    submit(s); /* not retire: the policy is inside a callback */
    return POLICY_ISSUED;
}

static policy_mem_result mem_evict(policy_mem *s, uint32_t layer, uint32_t expert,
                                   moesim_precision p, uint32_t parts_mask) {
    MOESIM_ASSERT(layer < s->L && expert < s->E && (uint32_t)p < s->P);
    size_t lep = lep_of(s, layer, expert, p);
    bool any = false;
    for (int part = 0; part < PART_COUNT; part++) {
        if (!(parts_mask & (1u << part))) continue;
        uint8_t st = s->state[lep * PART_COUNT + part];
        if (st == POLICY_ABSENT) continue;
        if (s->pinned[lep]) return POLICY_REFUSED;
        if (st == POLICY_LOADING && s->xf[s->xfer_of[lep * PART_COUNT + part]].started)
            return POLICY_REFUSED;
        any = true;
    }
    if (!any) return POLICY_ALREADY;
    for (int part = 0; part < PART_COUNT; part++) {
        size_t pi = lep * PART_COUNT + part;
        if (!(parts_mask & (1u << part)) || s->state[pi] == POLICY_ABSENT) continue;
        if (s->state[pi] == POLICY_LOADING) { /* cancel: not started */
            s->xf[s->xfer_of[pi]].parts &= (uint8_t) ~(1u << part);
            s->xfer_of[pi] = NONE;
        }
        /* the compute stream has finished every op that read this block: the host waited for it
         * before this route, and the block is not pinned by the route */
        release_part(s, layer, p, pi, part);
    }
    return POLICY_ISSUED;
}

static uint64_t mem_free_bytes(const policy_mem *s, uint32_t layer) {
    return s->bud.pool_cap_bytes - s->pool_used[s->bud.per_layer ? (layer < s->L ? layer : 0) : 0];
}

static uint64_t mem_used_bytes(const policy_mem *s, moesim_precision p) { return s->prec_used[p]; }

/* Oracle only: the trace's future, exactly as sim.c computes it (same schedule, same order). */
static void future_build(rp *s) {
    size_t LE = (size_t)s->L * s->E;
    s->use_first.assign(LE + 1, 0);
    for (uint64_t st = 0; st < s->sch.n_steps; st++)
        for (uint32_t l = 0; l < s->L; l++)
            for (uint32_t i = 0; i < s->sch.steps[st].n_tokens; i++) {
                const uint16_t *ex =
                    trace_experts(s->tr, s->sch.tokens[s->sch.steps[st].first + i], l);
                for (uint32_t k = 0; k < s->K; k++)
                    if (ex[k] != TRACE_NO_EXPERT) s->use_first[(size_t)l * s->E + ex[k] + 1]++;
            }
    for (size_t i = 0; i < LE; i++) s->use_first[i + 1] += s->use_first[i];
    s->use_pos.assign(s->use_first[LE] ? s->use_first[LE] : 1, 0);
    s->use_cur.assign(s->use_first.begin(), s->use_first.end() - 1);
    uint64_t pos = 0;
    for (uint64_t st = 0; st < s->sch.n_steps; st++)
        for (uint32_t l = 0; l < s->L; l++)
            for (uint32_t i = 0; i < s->sch.steps[st].n_tokens; i++) {
                const uint16_t *ex =
                    trace_experts(s->tr, s->sch.tokens[s->sch.steps[st].first + i], l);
                for (uint32_t k = 0; k < s->K; k++)
                    if (ex[k] != TRACE_NO_EXPERT)
                        s->use_pos[s->use_cur[(size_t)l * s->E + ex[k]]++] = pos++;
            }
    s->use_cur.assign(s->use_first.begin(), s->use_first.end() - 1);
}

static uint64_t mem_next_use(const policy_mem *cm, uint32_t layer, uint32_t expert) {
    rp *s = (rp *)cm; /* the cursor is a cache: logically const */
    MOESIM_ASSERT(layer < s->L && expert < s->E);
    if (s->use_first.empty()) future_build(s);
    size_t le = (size_t)layer * s->E + expert;
    uint64_t end = s->use_first[le + 1];
    while (s->use_cur[le] < end && s->use_pos[s->use_cur[le]] < s->access_pos) s->use_cur[le]++;
    if (s->use_cur[le] == end) return UINT64_MAX;
    return s->use_pos[s->use_cur[le]] - s->access_pos;
}

static uint32_t mem_future_active(const policy_mem *cm, uint32_t layer, uint16_t *ids,
                                  uint32_t cap) {
    rp *s = (rp *)cm;
    MOESIM_ASSERT(layer < s->L);
    uint64_t st = (int64_t)layer > s->cur_layer ? s->cur_step : s->cur_step + 1;
    if (st >= s->sch.n_steps) return 0;
    std::vector<uint8_t> seen(s->E, 0);
    for (uint32_t i = 0; i < s->sch.steps[st].n_tokens; i++) {
        const uint16_t *ex = trace_experts(s->tr, s->sch.tokens[s->sch.steps[st].first + i], layer);
        for (uint32_t k = 0; k < s->K; k++)
            if (ex[k] != TRACE_NO_EXPERT) seen[ex[k]] = 1;
    }
    uint32_t n = 0;
    for (uint32_t e = 0; e < s->E; e++)
        if (seen[e]) {
            if (n < cap) ids[n] = (uint16_t)e;
            n++;
        }
    return n;
}

static const policy_mem_ops rp_mem_ops = {mem_state,        mem_load,       mem_evict,
                                          mem_free_bytes,   mem_used_bytes, mem_next_use,
                                          mem_future_active};

/* ---- compute ---- */

/* An op on the compute stream between two events; `need` is a copy event it waited for. */
static void op_begin(rp *s, const char *cat, const char *name, int layer, cudaEvent_t need) {
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

static void op_end(rp *s) { CUDA_CHECK(cudaEventRecord(s->ops.back().ev1, s->s_comp)); }

static void gemm(rp *s, float *y, moesim_precision p, const void *w, const float *x, size_t rows,
                 size_t cols, size_t n) {
    replay_gemm(&s->blas, s->x_bf16, s->s_comp, y, p, w, x, rows, cols, n);
}

static void run_attention(rp *s, const replay_step *sd, uint32_t ml) {
    const model_geometry *m = s->m;
    uint32_t n = sd->n_tokens;
    uint64_t H = m->hidden;
    uint16_t *w = s->w_attn[ml];
    gemm(s, s->y, PREC_BF16, w, s->x, s->q_dim + 2 * s->kv_dim, H, n);
    /* one attention call per request's run of tokens in the step (causal over its context) */
    for (uint32_t i = 0; i < n;) {
        uint32_t tok = s->sch.tokens[sd->first + i];
        uint32_t r = s->tr->request_id[tok], j = i + 1;
        while (j < n && s->tr->request_id[s->sch.tokens[sd->first + j]] == r) j++;
        uint32_t last = s->tr->position[s->sch.tokens[sd->first + j - 1]];
        kern_attention_prefill_cuda(s->attn_out, s->probs, s->y, s->kv, s->kv + s->kv_dim, j - i,
                                    m->n_heads, m->n_kv_heads, m->head_dim, (size_t)last + 1,
                                    s->s_comp);
        i = j;
    }
    /* into y, not x: x stays the layers' fixed input, so values never grow layer over layer
     * (the activations are synthetic, whatever the weights; what is timed is the shapes) */
    gemm(s, s->y, PREC_BF16, w + (s->q_dim + 2 * s->kv_dim) * H, s->attn_out, H, s->q_dim, n);
}

static void run_expert(rp *s, uint32_t layer, uint32_t e, moesim_precision p, uint32_t tok,
                       uint32_t mask) {
    size_t base = lep_of(s, layer, e, p) * PART_COUNT;
    uint64_t H = s->m->hidden, I = s->m->expert_inter;
    for (int part = 0; part < PART_COUNT; part++)
        if (mask & (1u << part) && s->ready[base + part])
            CUDA_CHECK(cudaStreamWaitEvent(s->s_comp, s->ready[base + part], 0));
    cudaEvent_t need = NULL;
    for (int part = PART_COUNT - 1; part >= 0 && !need; part--)
        if (mask & (1u << part)) need = s->ready[base + part];
    char name[64];
    if (mask & (1u << PART_GATE)) {
        snprintf(name, sizeof name, "L%u e%u gate_up %s x%u", layer, e, precision_name(p), tok);
        op_begin(s, "expert", name, (int)layer, need);
        gemm(s, s->h1, p, block_ptr(s, p, s->block[base + PART_GATE]), s->x, I, H, tok);
        gemm(s, s->h2, p, block_ptr(s, p, s->block[base + PART_UP]), s->x, I, H, tok);
        kern_swiglu_cuda(s->h1, s->h1, s->h2, (size_t)I * tok, s->s_comp);
        op_end(s);
    }
    if (mask & (1u << PART_DOWN)) {
        snprintf(name, sizeof name, "L%u e%u down %s x%u", layer, e, precision_name(p), tok);
        op_begin(s, "expert", name, (int)layer, need);
        gemm(s, s->y, p, block_ptr(s, p, s->block[base + PART_DOWN]), s->h1, H, I, tok);
        op_end(s);
    }
    if (s->hooks && s->hooks->on_expert_start)
        s->hooks->on_expert_start(s->hooks->ctx, s->view, layer, e, p, mask,
                                  host_ns() - s->t0_host);
}

/* Unpins the last route's experts: call only when the compute stream is idle. */
static void unpin_all(rp *s) {
    for (uint32_t lep : s->pinned_lep) s->pinned[lep] = 0;
    s->pinned_lep.clear();
}

/* Waits until the compute stream is idle, feeding copies meanwhile. */
static void wait_compute(rp *s) {
    cudaEvent_t e = ev_get(s);
    CUDA_CHECK(cudaEventRecord(e, s->s_comp));
    for (;;) {
        pump(s);
        cudaError_t r = cudaEventQuery(e);
        if (r == cudaSuccess) break;
        if (r != cudaErrorNotReady) CUDA_CHECK(r);
    }
}

/* Waits until every part in mask has all its chunks submitted (its ready event exists). */
static void wait_submitted(rp *s, uint32_t layer, uint32_t e, moesim_precision p, uint32_t mask) {
    size_t base = lep_of(s, layer, e, p) * PART_COUNT;
    for (;;) {
        bool ok = true;
        for (int part = 0; part < PART_COUNT; part++)
            if (mask & (1u << part) && s->state[base + part] == POLICY_LOADING &&
                !s->ready[base + part])
                ok = false;
        if (ok) return;
        pump(s);
    }
}

/* Issue sequence of the copy loading part `part_index` of the layer being routed (the callback
 * of sim_route_execution_order). */
static uint64_t loading_seq(const void *host, size_t part_index) {
    const rp *s = (const rp *)host;
    size_t layer_parts = (size_t)s->cur_layer * s->E * s->P * PART_COUNT;
    return s->xf[s->xfer_of[layer_parts + part_index]].seq;
}

/* One (sub-)route, as sim.c's run_route: plan, hits, gate mass, then the experts in order. */
static void run_route(rp *s, uint64_t step, uint32_t layer, uint32_t i0, uint32_t i1,
                      bool first_of_layer) {
    const uint32_t K = s->K;
    uint32_t n = i1 - i0;
    const uint16_t *ex = s->r_experts + (size_t)i0 * K;
    const float *gs = s->r_gates + (size_t)i0 * K;
    sim_route_scratch rs = {s->stamp,         &s->stamp_gen,  s->active, s->slot,
                            s->active_tokens, s->active_gate, s->plan};
    uint32_t n_active = sim_route_active_build(&rs, ex, gs, n * K);
    if (first_of_layer)
        sim_route_prefetch_account(&rs, n_active, s->r_experts, s->sch.steps[step].n_tokens * K,
                                   s->pf_mark + (size_t)layer * s->E, s->E, &s->pf_count[layer],
                                   &s->pf_hit, &s->pf_active, &s->pf_issued_sets);
    wait_compute(s); /* the router's output is known: the host decides now */
    unpin_all(s);    /* the stream is idle: the last route's experts have run */
    policy_route route;
    memset(&route, 0, sizeof route);
    route.layer = layer;
    route.now_ns = host_ns() - s->t0_host;
    route.n_tokens = n;
    route.top_k = K;
    route.experts = ex;
    route.gates = gs;
    route.importance = s->r_importance ? s->r_importance + i0 : NULL;
    route.lookahead_ids = s->la_depth ? s->r_la_ids + (size_t)i0 * s->la_depth * s->la_k : NULL;
    route.lookahead_scores =
        s->la_depth ? s->r_la_scores + (size_t)i0 * s->la_depth * s->la_k : NULL;
    route.n_active = n_active;
    route.active = s->active;
    route.active_tokens = s->active_tokens;
    route.active_gate = s->active_gate;
    policy_plan plan = {s->plan};
    s->cur_layer = layer;
    s->cur_step = step;
    s->sub_routes++;
    s->pm->on_route(s->pol, &route, &plan);

    moesim_precision hi = s->pm->hi_precision ? s->pm->hi_precision(s->pol) : s->prec;
    uint8_t prim_bits = (uint8_t)s->quant.fmt[hi].weight_bits;
    for (uint32_t a = 0; a < n_active; a++) {
        uint8_t pr = s->plan[a];
        if (pr == POLICY_RUN_SKIP) continue;
        MOESIM_ASSERT(pr < PREC_COUNT && s->part_bytes[pr][0]);
        size_t lep = lep_of(s, layer, s->active[a], pr);
        for (int part = 0; part < PART_COUNT; part++)
            MOESIM_ASSERT(s->state[lep * PART_COUNT + part] != POLICY_ABSENT);
        if (!s->pinned[lep]) s->pinned_lep.push_back((uint32_t)lep);
        s->pinned[lep] = 1;
    }
    const size_t layer_parts = (size_t)layer * s->E * s->P * PART_COUNT;
    sim_route_tally_accesses(&rs, ex, gs, n * K, s->state + layer_parts, s->P, &s->quant, prim_bits,
                             &s->tally);
    uint32_t n_run = sim_route_execution_order(&rs, n_active, s->state + layer_parts, s->P,
                                               loading_seq, s, s->order, s->order_key);
    for (uint32_t r = 0; r < n_run; r++) {
        uint32_t a = s->order[r];
        uint16_t e = s->active[a];
        moesim_precision pr = (moesim_precision)s->plan[a];
        uint32_t tok = s->active_tokens[a];
        if (s->set.part_overlap) {
            wait_submitted(s, layer, e, pr, 1u << PART_GATE | 1u << PART_UP);
            run_expert(s, layer, e, pr, tok, 1u << PART_GATE | 1u << PART_UP);
            wait_submitted(s, layer, e, pr, 1u << PART_DOWN);
            run_expert(s, layer, e, pr, tok, 1u << PART_DOWN);
        } else {
            wait_submitted(s, layer, e, pr, POLICY_PARTS_ALL);
            run_expert(s, layer, e, pr, tok, POLICY_PARTS_ALL);
        }
        s->expert_ops++;
    }
}

static void gather_route(rp *s, uint64_t step, uint32_t layer) {
    const replay_step *sd = &s->sch.steps[step];
    const trace *t = s->tr;
    uint32_t K = s->K;
    size_t DK = (size_t)s->la_depth * s->la_k;
    bool emulated = !t->meta.lookahead_depth;
    for (uint32_t i = 0; i < sd->n_tokens; i++) {
        uint32_t tok = s->sch.tokens[sd->first + i];
        memcpy(s->r_experts + (size_t)i * K, trace_experts(t, tok, layer), K * sizeof(uint16_t));
        memcpy(s->r_gates + (size_t)i * K, trace_gates(t, tok, layer), K * sizeof(float));
        if (s->r_importance) s->r_importance[i] = t->importance[(size_t)tok * s->L + layer];
        if (!DK) continue;
        if (emulated) {
            sim_lookahead_emulate(s->tr, s->L, s->E, s->K, s->la_depth, s->la_k, s->set.seed,
                                  s->set.predictor_accuracy, tok, layer, s->r_la_ids + i * DK,
                                  s->r_la_scores + i * DK);
        } else {
            size_t src = trace_lookahead_index(t, tok, layer, 1);
            memcpy(s->r_la_ids + i * DK, t->lookahead_ids + src, DK * sizeof(uint16_t));
            memcpy(s->r_la_scores + i * DK, t->lookahead_scores + src, DK * sizeof(float));
        }
    }
}

/* sim.c's run_layer: sub-routes whose distinct experts fit one pool, in token order. */
static void run_layer(rp *s, uint64_t step, uint32_t layer) {
    uint32_t n = s->sch.steps[step].n_tokens, K = s->K;
    gather_route(s, step, layer);
    uint32_t i0 = 0;
    bool first = true;
    while (i0 < n) {
        uint32_t gen = ++s->stamp_gen, distinct = 0, i1 = i0;
        while (i1 < n) {
            uint32_t add = 0;
            const uint16_t *row = s->r_experts + (size_t)i1 * K;
            for (uint32_t k = 0; k < K; k++)
                if (row[k] != TRACE_NO_EXPERT && s->stamp[row[k]] != gen) add++;
            if (i1 > i0 && distinct + add > s->bud.route_capacity) break;
            for (uint32_t k = 0; k < K; k++)
                if (row[k] != TRACE_NO_EXPERT && s->stamp[row[k]] != gen) {
                    s->stamp[row[k]] = gen;
                    distinct++;
                }
            i1++;
        }
        run_route(s, step, layer, i0, i1, first);
        for (uint32_t i = i0 * K; i < i1 * K; i++)
            s->access_pos += s->r_experts[i] != TRACE_NO_EXPERT;
        first = false;
        i0 = i1;
    }
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
    fill_random(h, bytes, seed);
    CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* A non-expert weight buffer of kind k for model layer `layer` on the device: the checkpoint's
 * (replay_weights_nonexpert) or random bytes from `seed`. */
static uint16_t *dev_weights(rp *s, const replay_weights *w, replay_nonexpert k, uint32_t layer,
                             uint64_t seed) {
    uint64_t bytes = replay_nonexpert_elems(s->m, k) * 2;
    if (!w) return (uint16_t *)dev_random(s, bytes, seed);
    void *d = dev_alloc(s, bytes);
    uint16_t *h = (uint16_t *)moesim_xmalloc(bytes ? bytes : 16);
    replay_weights_nonexpert(w, k, layer, h);
    CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return (uint16_t *)d;
}

/* sim.c's reading of sim.host_precisions (expert.precision always stored), limited to the
 * formats the GPU kernels have. */
static moesim_status parse_host_precisions(const char *text, moesim_precision primary,
                                           bool stored[PREC_COUNT], moesim_error *err) {
    bool kernel_has[PREC_COUNT] = {false};
    kernel_has[PREC_BF16] = kernel_has[PREC_INT8] = kernel_has[PREC_INT4] = true;
    kernel_has[PREC_INT2] = true;
    if (!kernel_has[primary])
        return moesim_fail(err, MOESIM_EINPUT,
                           "expert.precision = %s: the GPU kernels have no such experts (bf16, "
                           "int8, int4, int2)",
                           precision_name(primary));
    for (int p = 0; p < PREC_COUNT; p++) stored[p] = false;
    stored[primary] = true;
    if (!strcmp(text, "all")) {
        for (int p = 0; p < PREC_COUNT; p++) stored[p] = kernel_has[p];
        return MOESIM_OK;
    }
    char buf[128];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *tok = strtok(buf, ", "); tok; tok = strtok(NULL, ", ")) {
        moesim_precision p;
        if (!precision_from_name(tok, &p))
            return moesim_fail(err, MOESIM_EINPUT, "sim.host_precisions: unknown precision '%s'",
                               tok);
        if (!kernel_has[p])
            return moesim_fail(err, MOESIM_EINPUT,
                               "sim.host_precisions: the GPU kernels have no %s experts (replay "
                               "stores bf16, int8, int4, int2)",
                               tok);
        stored[p] = true;
    }
    return MOESIM_OK;
}

static moesim_status rp_setup(rp *s, const replay_inputs *in, const char *policy_name,
                              config *settings, moesim_error *err) {
    moesim_status st;
    const trace *t = in->trace;
    const model_geometry *m = in->model;
    if (t->meta.n_layers != m->n_moe_layers || t->meta.n_experts != m->n_experts ||
        t->meta.top_k != m->top_k)
        return moesim_fail(err, MOESIM_EINPUT,
                           "trace (model '%s') does not match model '%s' (%u MoE layers, %u "
                           "experts, top-%u)",
                           t->meta.model, m->name, m->n_moe_layers, m->n_experts, m->top_k);
    if (!t->n_tokens) return moesim_fail(err, MOESIM_EINPUT, "trace has no tokens");
    if (in->weights) { /* the caller's contract: the checkpoint's own geometry */
        model_geometry g;
        replay_weights_geometry(in->weights, m->name, &g);
        MOESIM_ASSERT(!memcmp(&g, m, sizeof g));
    }
    if (!m->n_heads || !m->n_kv_heads || !m->head_dim || m->attention != ATTENTION_GQA)
        return moesim_fail(err, MOESIM_EINPUT,
                           "model '%s': replay times grouped-query attention only (n_heads, "
                           "n_kv_heads, head_dim); MLA and linear attention are not replayed",
                           m->name);
    s->pm = policy_lookup(policy_name);
    if (!s->pm)
        return moesim_fail(err, MOESIM_EINPUT, "unknown policy '%s' (known: %s)", policy_name,
                           policy_names());
    if (s->pm->api_version != POLICY_API_VERSION)
        return moesim_fail(err, MOESIM_EINPUT, "policy '%s' has API version %d, expected %d",
                           policy_name, s->pm->api_version, POLICY_API_VERSION);
    if ((st = sim_settings_read(settings, &s->set, err))) return st;
    if ((st = policy_read_knobs(s->pm, settings, &s->knobs, err))) return st;
    if ((st = config_check_unused(settings, err))) return st;
    s->tr = t;
    s->m = m;
    s->hooks = in->hooks;
    s->quant = *in->quant;
    s->L = t->meta.n_layers;
    s->E = t->meta.n_experts;
    s->K = t->meta.top_k;
    s->P = PREC_COUNT;
    s->prec = (moesim_precision)s->set.precision;
    s->chunk_bytes = s->set.chunk_kib * 1024;
    if (s->set.cost_table[0]) { /* sim reads it; replay only checks it loads, like sim would */
        cost_model c;
        cost_model_init(&c, in->hw, m, in->quant);
        if ((st = cost_table_load(&c, s->set.cost_table, err))) return st;
    }
    bool stored[PREC_COUNT];
    if ((st = parse_host_precisions(s->set.host_precisions, s->prec, stored, err))) return st;
    if (!stored[s->prec])
        return moesim_fail(err, MOESIM_EINPUT,
                           "expert.precision = %s: the GPU kernels have no such experts (bf16, "
                           "int8, int4, int2)",
                           precision_name(s->prec));
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT; part++)
            s->part_bytes[p][part] =
                stored[p]
                    ? model_expert_part_bytes(m, in->quant, (expert_part)part, (moesim_precision)p)
                    : 0;
    replay_schedule_build(&s->sch, t, m, s->set.batch_size);
    char bwhere[640], cwhere[640];
    if (config_get(settings, "memory", "budget_gb"))
        config_origin(settings, "memory", "budget_gb", bwhere, sizeof bwhere);
    else
        snprintf(bwhere, sizeof bwhere, "hardware profile %s (hbm_gib)", in->hw->name);
    config_origin(settings, "cache", "experts_per_layer", cwhere, sizeof cwhere);
    if ((st = replay_budget_plan(m, in->quant, in->hw, &s->set, s->sch.max_step_tokens,
                                 s->sch.kv_peak_bytes, bwhere, cwhere, &s->bud, err)))
        return st;

    /* host store: the caller's when it holds this run's formats of this run's weights placed
     * for this run's expert.precision (validate shares one over its runs), else the run's own */
    bool fits = in->store && in->store->primary == s->prec && in->store->weights == in->weights &&
                !memcmp(&in->store->m, m, sizeof *m);
    for (int p = 0; fits && p < PREC_COUNT; p++) fits = in->store->stored[p] == stored[p];
    if (fits) {
        s->store = in->store;
    } else {
        st = in->weights ? replay_store_create_checkpoint(m, in->quant, s->set.host_precisions,
                                                          s->prec, in->hw->dram_bytes, in->ssd_dir,
                                                          in->weights, &s->own_store, err)
                         : replay_store_create(m, in->quant, s->set.host_precisions, s->prec,
                                               in->hw->dram_bytes, in->ssd_dir, in->weight_seed,
                                               &s->own_store, err);
        if (st) return st;
        s->store = s->own_store;
    }
    if (s->store->n_on_ssd) { /* bounce slots: 3 class heads + COPY_WINDOW transfers at most */
        for (int p = 0; p < PREC_COUNT; p++)
            if (stored[p] && s->store->ssd_stride[p] > s->slot_bytes)
                s->slot_bytes = s->store->ssd_stride[p];
        if (cudaHostAlloc((void **)&s->bounce, SSD_SLOTS * s->slot_bytes, cudaHostAllocDefault) !=
            cudaSuccess) {
            cudaGetLastError();
            return moesim_fail(err, MOESIM_ENOMEM, "cannot pin the SSD bounce buffer");
        }
        for (int32_t i = SSD_SLOTS - 1; i >= 0; i--) s->free_slots.push_back(i);
    }
    for (int p = 0; p < PREC_COUNT; p++) /* blocks only for the formats this run stores */
        for (int part = 0; part < PART_COUNT; part++)
            s->dev_part_bytes[p][part] = stored[p] ? s->store->dev_part_bytes[p][part] : 0;
    for (int p = 0; p < PREC_COUNT; p++) {
        uint64_t b = 0;
        for (int part = 0; part < PART_COUNT; part++)
            if (s->dev_part_bytes[p][part] > b) b = s->dev_part_bytes[p][part];
        s->block_bytes[p] = (b + 255) / 256 * 256;
    }
    /* device: emulate the card, then allocate everything once */
    size_t dev_free = 0, dev_total = 0;
    CUDA_CHECK(cudaMemGetInfo(&dev_free, &dev_total));
    uint64_t H = m->hidden;
    s->q_dim = m->n_heads && m->head_dim ? (uint64_t)m->n_heads * m->head_dim : H;
    s->kv_dim = (uint64_t)m->n_kv_heads * m->head_dim;
    uint64_t attn_w = replay_nonexpert_elems(m, REPLAY_NX_ATTENTION) * 2;
    uint64_t S = (uint64_t)m->shared_inter * m->n_shared_experts, D = m->dense_inter;
    uint64_t shared_w = replay_nonexpert_elems(m, REPLAY_NX_SHARED) * 2;
    uint64_t dense_w = replay_nonexpert_elems(m, REPLAY_NX_DENSE) * 2;
    uint64_t router_w = replay_nonexpert_elems(m, REPLAY_NX_ROUTER) * 2;
    uint64_t lm_w = replay_nonexpert_elems(m, REPLAY_NX_LM_HEAD) * 2;
    uint64_t T = s->sch.max_step_tokens, B = s->set.batch_size;
    uint64_t wide = H > s->q_dim + 2 * s->kv_dim ? H : s->q_dim + 2 * s->kv_dim;
    if (m->n_experts > wide) wide = m->n_experts;
    uint64_t inter = m->expert_inter;
    if (S > inter) inter = S;
    if (D > inter) inter = D;
    uint64_t xcols = H > inter ? H : inter;
    if (s->q_dim > xcols) xcols = s->q_dim;
    uint32_t max_ctx = 1;
    for (uint64_t i = 0; i < t->n_tokens; i++)
        if (t->position[i] + 1 > max_ctx) max_ctx = t->position[i] + 1;
    s->max_ctx = max_ctx;
    /* every device allocation of the run, summed before any is made */
    const uint64_t sizes[] = {
        s->bud.expert_budget_bytes,                /* expert arena */
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
    if ((st = replay_budget_fit_device(&s->bud, planned, dev_free, RESERVE_BYTES, err))) return st;
    s->arena_bytes = s->bud.expert_budget_bytes;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->s_comp, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->s_demand, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->s_bg, cudaStreamNonBlocking));
    if ((st = cublas_lazy_handle_init(&s->blas, s->s_comp, err))) return st;
    s->arena = (uint8_t *)dev_alloc(s, s->arena_bytes);
    s->w_attn = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_attn);
    s->w_router = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_router);
    s->w_shared = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_shared);
    s->w_dense = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_dense);
    const replay_weights *w = in->weights;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        s->w_attn[l] = dev_weights(s, w, REPLAY_NX_ATTENTION, l, in->weight_seed * 977 + l);
        if (m->is_moe_layer[l]) {
            s->w_router[l] = dev_weights(s, w, REPLAY_NX_ROUTER, l, l + 7);
            if (shared_w) s->w_shared[l] = dev_weights(s, w, REPLAY_NX_SHARED, l, l + 11);
        } else if (dense_w) {
            s->w_dense[l] = dev_weights(s, w, REPLAY_NX_DENSE, l, l + 13);
        }
    }
    s->w_lm = dev_weights(s, w, REPLAY_NX_LM_HEAD, 0, 17);
    s->x = (float *)dev_random(s, T * H * 4, 19);
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

    size_t LEP = (size_t)s->L * s->E * s->P;
    s->state = (uint8_t *)moesim_xcalloc(LEP * PART_COUNT, 1);
    s->block = (uint32_t *)moesim_xmalloc(LEP * PART_COUNT * sizeof(uint32_t));
    s->xfer_of = (uint32_t *)moesim_xmalloc(LEP * PART_COUNT * sizeof(uint32_t));
    for (size_t i = 0; i < LEP * PART_COUNT; i++) s->block[i] = s->xfer_of[i] = NONE;
    s->ready = (cudaEvent_t *)moesim_xcalloc(LEP * PART_COUNT, sizeof(cudaEvent_t));
    s->pinned = (uint8_t *)moesim_xcalloc(LEP, 1);
    s->pool_used = (uint64_t *)moesim_xcalloc(s->bud.per_layer ? s->L : 1, sizeof(uint64_t));
    s->pf_mark = (uint8_t *)moesim_xcalloc((size_t)s->L * s->E, 1);
    s->pf_count = (uint32_t *)moesim_xcalloc(s->L, sizeof(uint32_t));
    if (t->meta.lookahead_depth) {
        s->la_depth = t->meta.lookahead_depth;
        s->la_k = t->meta.lookahead_k;
    } else {
        s->la_depth = s->set.predictor_depth;
        s->la_k = s->la_depth ? s->K : 0;
    }
    size_t MT = s->sch.max_step_tokens;
    s->r_experts = (uint16_t *)moesim_xcalloc(MT * s->K, sizeof(uint16_t));
    s->r_gates = (float *)moesim_xcalloc(MT * s->K, sizeof(float));
    if (t->importance) s->r_importance = (float *)moesim_xcalloc(MT, sizeof(float));
    if (s->la_depth) {
        s->r_la_ids = (uint16_t *)moesim_xcalloc(MT * s->la_depth * s->la_k, sizeof(uint16_t));
        s->r_la_scores = (float *)moesim_xcalloc(MT * s->la_depth * s->la_k, sizeof(float));
    }
    s->active = (uint16_t *)moesim_xcalloc(s->E, sizeof(uint16_t));
    s->active_tokens = (uint32_t *)moesim_xcalloc(s->E, sizeof(uint32_t));
    s->active_gate = (float *)moesim_xcalloc(s->E, sizeof(float));
    s->plan = (uint8_t *)moesim_xcalloc(s->E, 1);
    s->stamp = (uint32_t *)moesim_xcalloc(s->E, sizeof(uint32_t));
    s->slot = (uint32_t *)moesim_xcalloc(s->E, sizeof(uint32_t));
    s->order = (uint32_t *)moesim_xcalloc(s->E, sizeof(uint32_t));
    s->order_key = (uint64_t *)moesim_xcalloc(s->E, sizeof(uint64_t));
    s->view.ops = &rp_mem_ops;
    s->view.mem = s;
    if (in->timeline_path &&
        (st = sim_timeline_open_as(&s->tl, in->timeline_path, "moesim replay",
                                   &in->timeline_window, err)))
        return st;
    policy_params params;
    memset(&params, 0, sizeof params);
    params.model = m;
    params.n_layers = s->L;
    params.n_experts = s->E;
    params.top_k = s->K;
    params.expert_budget_bytes =
        s->bud.per_layer ? s->bud.pool_cap_bytes * s->L : s->bud.expert_budget_bytes;
    params.experts_per_layer = s->bud.per_layer ? s->set.experts_per_layer : 0;
    params.precision = s->prec;
    params.batch_size = s->set.batch_size;
    params.lookahead_depth = s->la_depth;
    params.lookahead_k = s->la_k;
    params.lookahead_emulated = !t->meta.lookahead_depth && s->la_depth > 0;
    params.seed = s->set.seed;
    memcpy(params.part_bytes, s->part_bytes, sizeof params.part_bytes);
    s->params = params;
    if ((st = s->pm->create(&s->params, s->knobs, s->view, &s->pol, err))) {
        moesim_error_prefix(err, "policy '%s'", s->pm->name);
        return st;
    }
    return MOESIM_OK;
}

/* ---- the run ---- */

static void simple_op(rp *s, const char *cat, const char *name) {
    op_begin(s, cat, name, -1, NULL);
}

/* Reads the retired chunks' times (copy engine busy time, h2d timeline track) and frees their
 * events for reuse. The chunks of one engine do not overlap: busy time counts each ns once. */
static void chunks_account(rp *s) {
    for (const rp_chunk &c : s->done_chunks) {
        uint64_t a = ev_ns(s, c.ev0), b = ev_ns(s, c.ev1);
        if (a < s->copy_last_end_ns) a = s->copy_last_end_ns;
        if (b > a) s->h2d_busy_ns += b - a;
        if (b > s->copy_last_end_ns) s->copy_last_end_ns = b;
        if (s->tl.on && b > a) {
            const rp_xfer *x = &s->xf[c.xfer];
            char name[64];
            snprintf(name, sizeof name, "L%u e%u %s %s", x->layer, x->expert,
                     precision_name((moesim_precision)x->prec),
                     x->cls == POLICY_DEMAND     ? "demand"
                     : x->cls == POLICY_PREFETCH ? "prefetch"
                                                 : "background");
            sim_timeline_slice(&s->tl, SIM_TRACK_H2D, "copy", name, a, b);
        }
        s->cev_free.push_back(c.ev0);
        s->cev_free.push_back(c.ev1);
    }
    s->done_chunks.clear();
}

/* Resolves the step's op events: timeline slices, layer times, order checks; recycles events. */
static void step_resolve(rp *s, uint64_t step, uint64_t *layer_t0, uint64_t *layer_t1) {
    for (size_t i = 0; i < s->ops.size(); i++) {
        rp::op_rec *o = &s->ops[i];
        uint64_t t0 = ev_ns(s, o->ev0), t1 = ev_ns(s, o->ev1);
        if (t1 < t0) t1 = t0;
        if (s->tl.on) sim_timeline_slice(&s->tl, SIM_TRACK_COMPUTE, o->cat, o->name, t0, t1);
        if (o->layer >= 0) {
            if (layer_t0[o->layer] == UINT64_MAX || t0 < layer_t0[o->layer])
                layer_t0[o->layer] = t0;
            if (t1 > layer_t1[o->layer]) layer_t1[o->layer] = t1;
        }
        if (o->need) { /* the expert must not start before its copy ended */
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, o->need, o->ev0));
            s->order_checked++;
            s->order_violations += ms < 0;
        }
        if (o->need && i > 0) { /* the stream idled from the last op until the copy landed */
            uint64_t prev = ev_ns(s, s->ops[i - 1].ev1), landed = ev_ns(s, o->need);
            if (landed > t0) landed = t0;
            if (landed > prev) s->stall_ns += landed - prev;
        }
    }
    for (uint32_t l = 0; l < s->L; l++) {
        if (layer_t0[l] != UINT64_MAX && s->hooks && s->hooks->on_layer_done)
            s->hooks->on_layer_done(s->hooks->ctx, step, l, layer_t0[l], layer_t1[l]);
        layer_t0[l] = UINT64_MAX;
        layer_t1[l] = 0;
    }
    s->ops.clear();
    chunks_account(s);
}

static void rp_loop(rp *s, uint64_t *step_start, uint64_t *step_end) {
    const model_geometry *m = s->m;
    s->warmup = true;
    s->cur_layer = -1;
    if (s->pm->warmup) s->pm->warmup(s->pol, 0);
    s->warmup = false;
    for (size_t i = 0; i < s->warm_lep.size(); i++) {
        uint32_t lep = s->warm_lep[i], p = lep % s->P, le = lep / s->P;
        if (s->pm->on_transfer_done)
            s->pm->on_transfer_done(s->pol, le / s->E, le % s->E, (moesim_precision)p,
                                    s->warm_parts[i] & 0xfu, (policy_class)(s->warm_parts[i] >> 4),
                                    0);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaEventRecord(s->ev_start, s->s_comp));
    CUDA_CHECK(cudaEventSynchronize(s->ev_start));
    s->t0_host = host_ns();
    std::vector<uint32_t> req(s->sch.max_step_tokens), pos(s->sch.max_step_tokens);
    std::vector<uint64_t> lt0(s->L, UINT64_MAX), lt1(s->L, 0);
    char name[64];
    for (uint64_t st = 0; st < s->sch.n_steps; st++) {
        const replay_step *sd = &s->sch.steps[st];
        s->ev_used = 0;
        uint32_t n_emit = 0;
        for (uint32_t i = 0; i < sd->n_tokens; i++) {
            uint32_t tok = s->sch.tokens[sd->first + i];
            req[i] = s->tr->request_id[tok];
            pos[i] = s->tr->position[tok];
            n_emit += s->sch.emit[sd->first + i];
        }
        wait_compute(s);
        policy_step ps;
        memset(&ps, 0, sizeof ps);
        ps.index = st;
        ps.now_ns = host_ns() - s->t0_host;
        sim_timeline_step(&s->tl, st, ps.now_ns); /* the GPU is idle: host and event clocks agree */
        ps.n_tokens = sd->n_tokens;
        ps.is_prefill = sd->is_prefill;
        ps.request = req.data();
        ps.position = pos.data();
        s->cur_step = st;
        s->cur_layer = -1;
        cudaEvent_t e0 = ev_get(s);
        CUDA_CHECK(cudaEventRecord(e0, s->s_comp));
        if (s->pm->begin_step) s->pm->begin_step(s->pol, &ps);
        uint32_t moe = 0;
        for (uint32_t ml = 0; ml < m->n_layers; ml++) {
            snprintf(name, sizeof name, "L%u attention", ml);
            simple_op(s, "attention", name);
            run_attention(s, sd, ml);
            op_end(s);
            if (!m->is_moe_layer[ml]) {
                if (s->w_dense[ml]) {
                    snprintf(name, sizeof name, "L%u dense ffn", ml);
                    simple_op(s, "ffn", name);
                    uint64_t H = m->hidden, D = m->dense_inter;
                    gemm(s, s->h1, PREC_BF16, s->w_dense[ml], s->x, D, H, sd->n_tokens);
                    gemm(s, s->h2, PREC_BF16, s->w_dense[ml] + D * H, s->x, D, H, sd->n_tokens);
                    kern_swiglu_cuda(s->h1, s->h1, s->h2, D * sd->n_tokens, s->s_comp);
                    gemm(s, s->y, PREC_BF16, s->w_dense[ml] + 2 * D * H, s->h1, H, D, sd->n_tokens);
                    op_end(s);
                }
                continue;
            }
            snprintf(name, sizeof name, "L%u router", moe);
            op_begin(s, "router", name, (int)moe, NULL);
            gemm(s, s->y, PREC_BF16, s->w_router[ml], s->x, m->n_experts, m->hidden, sd->n_tokens);
            op_end(s);
            run_layer(s, st, moe);
            if (s->w_shared[ml]) {
                snprintf(name, sizeof name, "L%u shared", moe);
                simple_op(s, "shared", name);
                uint64_t H = m->hidden, S = (uint64_t)m->shared_inter * m->n_shared_experts;
                gemm(s, s->h1, PREC_BF16, s->w_shared[ml], s->x, S, H, sd->n_tokens);
                gemm(s, s->h2, PREC_BF16, s->w_shared[ml] + S * H, s->x, S, H, sd->n_tokens);
                kern_swiglu_cuda(s->h1, s->h1, s->h2, S * sd->n_tokens, s->s_comp);
                gemm(s, s->y, PREC_BF16, s->w_shared[ml] + 2 * S * H, s->h1, H, S, sd->n_tokens);
                op_end(s);
            }
            snprintf(name, sizeof name, "L%u combine", moe);
            simple_op(s, "combine", name);
            replay_combine(s->y, s->ys, s->gates_dev, sd->n_tokens, m->top_k, m->hidden, s->s_comp);
            op_end(s);
            moe++;
        }
        simple_op(s, "lm_head", "lm head");
        if (n_emit) gemm(s, s->logits, PREC_BF16, s->w_lm, s->x, m->vocab, m->hidden, n_emit);
        op_end(s);
        wait_compute(s);
        unpin_all(s);
        step_start[st] = ev_ns(s, e0);
        step_end[st] = ev_ns(s, s->ops.back().ev1);
        step_resolve(s, st, lt0.data(), lt1.data());
        if (s->pm->end_step) s->pm->end_step(s->pol, &ps, host_ns() - s->t0_host);
    }
    /* drain: prefetches nobody used complete */
    while (!s->inflight.empty() || s->q_head[0] < s->q[0].size() || s->q_head[1] < s->q[1].size() ||
           s->q_head[2] < s->q[2].size()) {
        size_t before = s->inflight.size();
        pump(s);
        if (s->inflight.empty() && before == 0) break;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
}

static double quantile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return gsl_stats_quantile_from_sorted_data(v.data(), 1, v.size(), q);
}

static sim_latency latency_of(const std::vector<double> &v) {
    sim_latency l = {0, 0, 0};
    if (v.empty()) return l;
    double sum = 0;
    for (double x : v) sum += x;
    l.mean_ms = sum / (double)v.size();
    l.p50_ms = quantile(v, 0.5);
    l.p99_ms = quantile(v, 0.99);
    return l;
}

static void rp_result(rp *s, const uint64_t *step_start, const uint64_t *step_end, sim_result *r,
                      replay_checks *ck) {
    memset(r, 0, sizeof *r);
    snprintf(r->policy, sizeof r->policy, "%s", s->pm->name);
    std::vector<double> ttft, tpot;
    for (uint32_t q = 0; q < s->sch.n_requests; q++) {
        uint64_t t0 = step_start[s->sch.req_admit[q]], t1 = step_end[s->sch.req_first[q]];
        double f = (double)(t1 - t0) / 1e6, p = NAN;
        ttft.push_back(f);
        if (s->sch.req_steps[q] > 1) {
            p = (double)(step_end[s->sch.req_last[q]] - t1) / 1e6 /
                (double)(s->sch.req_steps[q] - 1);
            tpot.push_back(p);
        }
        if (s->hooks && s->hooks->on_request_done)
            s->hooks->on_request_done(s->hooks->ctx, q, f, p);
    }
    r->ttft = latency_of(ttft);
    r->tpot = latency_of(tpot);
    uint64_t makespan = s->sch.n_steps ? step_end[s->sch.n_steps - 1] : 0;
    r->tokens = s->tr->n_tokens;
    r->requests = s->sch.n_requests;
    r->makespan_ms = (double)makespan / 1e6;
    r->tokens_per_s = makespan ? (double)r->tokens * 1e9 / (double)makespan : 0;
    r->hit_rate = s->tally.accesses ? (double)s->tally.hits / (double)s->tally.accesses : 0;
    r->h2d_bytes = s->h2d_bytes;
    r->stall_ms = (double)s->stall_ns / 1e6;
    r->budget_bytes = s->bud.budget_bytes;
    double mass = s->tally.gate_hi + s->tally.gate_lo + s->tally.gate_skip;
    r->precision_mix_hi = mass > 0 ? s->tally.gate_hi / mass : 0;
    r->precision_mix_lo = mass > 0 ? s->tally.gate_lo / mass : 0;
    r->precision_mix_skip = mass > 0 ? s->tally.gate_skip / mass : 0;
    r->prefetch_accuracy = s->pf_active ? (double)s->pf_hit / (double)s->pf_active : 0;
    r->prefetch_utilization = s->pf_issued_sets ? (double)s->pf_hit / (double)s->pf_issued_sets : 0;
    r->prefetches = s->prefetches;
    r->predictor_emulated = s->params.lookahead_emulated;
    r->predictor_accuracy = s->set.predictor_accuracy;
    r->accesses = s->tally.accesses;
    r->hits = s->tally.hits;
    r->skipped_accesses = s->tally.skipped;
    r->expert_ops = s->expert_ops;
    r->steps = s->sch.n_steps;
    r->sub_routes = s->sub_routes;
    r->warmup_h2d_bytes = s->warmup_bytes;
    r->expert_budget_bytes = s->bud.expert_budget_bytes;
    r->kv_peak_bytes = s->bud.kv_peak_bytes;
    chunks_account(s); /* the drained copies */
    uint64_t busy = s->h2d_busy_ns;
    r->h2d_busy_ms = (double)busy / 1e6;
    r->ssd_bytes = s->ssd_bytes;
    r->ssd_busy_ms = (double)s->ssd_busy_ns / 1e6;
    /* as the simulator accounts it (its KV term follows the steps; this one is the reservation) */
    r->peak_hbm_bytes =
        s->bud.non_expert_bytes + s->bud.act_bytes + s->bud.kv_peak_bytes + s->experts_peak;
    if (s->pm->report) {
        const char *names[16];
        double values[16];
        size_t n = s->pm->report(s->pol, names, values, 16);
        r->n_policy_report = n;
        for (size_t i = 0; i < n; i++) {
            snprintf(r->policy_report_names[i], sizeof r->policy_report_names[i], "%s", names[i]);
            r->policy_report_values[i] = values[i];
        }
    }
    if (ck) {
        ck->device_alloc_bytes = s->device_alloc;
        ck->order_checked = s->order_checked;
        ck->order_violations = s->order_violations;
        ck->physical_refusals = s->physical_refusals;
        ck->h2d_gb_per_s = busy ? (double)s->h2d_bytes / (double)busy : 0;
    }
}

static void rp_teardown(rp *s) {
    if (s->pm && s->pol) s->pm->destroy(s->pol);
    free(s->knobs);
    sim_timeline_abort(&s->tl);
    for (cudaEvent_t e : s->ev_pool) cudaEventDestroy(e);
    for (cudaEvent_t e : s->cev_all) cudaEventDestroy(e);
    if (s->ev_start) cudaEventDestroy(s->ev_start);
    replay_store_destroy(s->own_store);
    if (s->bounce) cudaFreeHost(s->bounce);
    void *dev[] = {s->arena,    s->w_lm, s->x,     s->y,      s->h1, s->h2,       s->x_bf16,
                   s->attn_out, s->kv,   s->probs, s->logits, s->ys, s->gates_dev};
    for (void *d : dev)
        if (d) cudaFree(d);
    for (uint32_t l = 0; s->w_attn && l < s->m->n_layers; l++) {
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
    free(s->state);
    free(s->block);
    free(s->xfer_of);
    free(s->ready);
    free(s->pinned);
    free(s->pool_used);
    free(s->pf_mark);
    free(s->pf_count);
    free(s->r_experts);
    free(s->r_gates);
    free(s->r_importance);
    free(s->r_la_ids);
    free(s->r_la_scores);
    free(s->active);
    free(s->active_tokens);
    free(s->active_gate);
    free(s->plan);
    free(s->stamp);
    free(s->slot);
    free(s->order);
    free(s->order_key);
    replay_schedule_free(&s->sch);
}

extern "C" moesim_status replay_run(const replay_inputs *in, const char *policy_name,
                                    config *settings, sim_result *out, replay_checks *checks,
                                    moesim_error *err) {
    MOESIM_ASSERT(in && in->trace && in->model && in->hw && in->quant && policy_name && out);
    moesim_status st = replay_device_check(err);
    if (st) return st;
    size_t free0 = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free0, &total));
    rp *s = new rp();
    st = rp_setup(s, in, policy_name, settings, err);
    if (!st) {
        std::vector<uint64_t> t0(s->sch.n_steps), t1(s->sch.n_steps);
        rp_loop(s, t0.data(), t1.data());
        size_t free1 = 0;
        CUDA_CHECK(cudaMemGetInfo(&free1, &total));
        rp_result(s, t0.data(), t1.data(), out, checks);
        if (checks) {
            checks->device_used_before = total - free0;
            checks->device_used_peak = total - free1;
        }
        st = sim_timeline_close(&s->tl, err);
    }
    rp_teardown(s);
    delete s;
    return st;
}
