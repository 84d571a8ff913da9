/* The GPU replay run (replay/replay.h): the memory system of sim/memsys.h driven by real copies,
 * and the run loop that drives the same policy object as sim_run over the same schedule and
 * routing.
 *
 * What lives in sim/memsys.c, shared with the simulator: residency states, pools, the three copy
 * classes (demand > prefetch > background), promotion, cancellation, the SSD bounce accounting,
 * host placement and the oracle's future (sim/future.h). What lives here is what only real
 * hardware has:
 *
 * Device memory, allocated once before the clock starts (no cudaMalloc on the hot path): the
 * non-expert weights of every layer (bf16: the checkpoint's, replay/weights.h, or random),
 * activations and a KV buffer, and one arena of the expert budget carved into fixed-size blocks
 * per precision (one block holds one part: gate, up or down, in the kernels' block format); the
 * memory system's reserve/release callbacks take and give back blocks. Host: the store of
 * experts placed by memsys_place, in pinned memory (cudaHostAlloc) and an SSD file: the
 * checkpoint's in the kernels' formats, or random bytes from a seeded xorshift stream.
 *
 * Copies: the host engine asks memsys for the next chunk (memsys_next_chunk) and keeps at most
 * COPY_WINDOW chunks in flight, one cudaMemcpyAsync per part the chunk spans (demand chunks on
 * the demand stream, the others on the background stream), each chunk ending with an event;
 * chunks retire in submission order (memsys_chunk_done, then memsys_deliver). The SSD engine
 * reads its chunks with pread (O_DIRECT) into pinned bounce slots, on the host thread. The
 * compute stream waits (cudaStreamWaitEvent) for the event of a part's last chunk right before
 * each expert op, and an event before every op lets the run check afterwards that no expert
 * started before its copy ended.
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

#include <deque>
#include <vector>

/* The project's C headers spell two C11 keywords that C++ writes differently. */
#define _Noreturn [[noreturn]]
#define _Static_assert static_assert
extern "C" {
#include "common/alloc.h"
#include "common/check.h"
#include "kernels/quant.h"
#include "replay/replay.h"
#include "sim/future.h"
#include "sim/memsys.h"
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
    bool held[PREC_COUNT];         /* precisions the store holds (the placement's order) */
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

/* Random weights: a seeded tile repeated over the buffer (timing depends on bytes, not values;
 * making 60 GB of fresh random numbers would dominate a validation run). */
static void fill_tiled(uint8_t *p, uint64_t bytes, uint64_t seed) {
    uint64_t tile = bytes < FILL_TILE ? bytes : FILL_TILE;
    fill_random(p, tile, seed);
    for (uint64_t o = tile; o < bytes; o += tile)
        memcpy(p + o, p, bytes - o < tile ? bytes - o : tile);
}

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

/* sim.host_precisions as memsys reads it (memsys_parse_host_precisions), limited to the formats
 * the GPU kernels have: 'policy' and 'all' store those, a list must name only those. */
static moesim_status kernel_host_precisions(const char *text, moesim_precision primary,
                                            bool stored[PREC_COUNT], bool *policy_only,
                                            moesim_error *err) {
    bool kernel_has[PREC_COUNT] = {false};
    kernel_has[PREC_BF16] = kernel_has[PREC_INT8] = kernel_has[PREC_INT4] = true;
    kernel_has[PREC_INT2] = true;
    if (!kernel_has[primary])
        return moesim_fail(err, MOESIM_EINPUT,
                           "expert.precision = %s: the GPU kernels have no such experts (bf16, "
                           "int8, int4, int2)",
                           precision_name(primary));
    moesim_status st = memsys_parse_host_precisions(text, stored, policy_only, err);
    if (st) return st;
    bool list = *policy_only ? false : strcmp(text, "all") != 0;
    for (int p = 0; p < PREC_COUNT; p++) {
        if (!stored[p] || kernel_has[p]) continue;
        if (list)
            return moesim_fail(err, MOESIM_EINPUT,
                               "sim.host_precisions: the GPU kernels have no %s experts (replay "
                               "stores bf16, int8, int4, int2)",
                               precision_name((moesim_precision)p));
        stored[p] = false;
    }
    return MOESIM_OK;
}

/* The simulator's bytes of one part at each stored precision (pools and placement count these). */
static void accounting_part_bytes(const model_geometry *m, const quant_table *q,
                                  const bool stored[PREC_COUNT],
                                  uint64_t out[PREC_COUNT][PART_COUNT]) {
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT; part++)
            out[p][part] = stored[p] ? model_expert_part_bytes(m, q, (expert_part)part,
                                                               (moesim_precision)p)
                                     : 0;
}

/* The precisions host placement orders for a policy (memsys_place_for_policy), which the store
 * must hold: those it declares it loads (`fallback`, expert.precision, when it declares none),
 * and unless `policy_only` every other stored one (bytes in `part_bytes`). */
static void placed_precisions(const policy_methods *pm, const policy *pol,
                              moesim_precision fallback, bool policy_only,
                              const uint64_t part_bytes[][PART_COUNT], bool held[PREC_COUNT]) {
    moesim_precision order[PREC_COUNT];
    uint32_t n = pm->load_precisions ? pm->load_precisions(pol, order) : 0;
    if (!n) order[n++] = fallback;
    for (int p = 0; p < PREC_COUNT; p++) held[p] = !policy_only && part_bytes[p][0] > 0;
    for (uint32_t i = 0; i < n; i++) held[order[i]] = part_bytes[order[i]][0] > 0;
}

/* Makes the store of a placement: the precisions in `held`, each expert in pinned DRAM or in the
 * SSD file as `on_ssd` ([L*E*PREC_COUNT], memsys's lep order) says; experts from `w`, or random
 * from `seed` when w is NULL. */
static moesim_status store_make(const model_geometry *m, const bool held[PREC_COUNT],
                                const uint8_t *on_ssd, const char *ssd_dir, uint64_t seed,
                                const replay_weights *w, replay_store **out, moesim_error *err) {
    moesim_status st = replay_device_check(err);
    if (st) return st;
    replay_store *r = (replay_store *)moesim_xcalloc(1, sizeof *r);
    r->m = *m;
    r->weights = w;
    for (int p = 0; p < PREC_COUNT; p++) r->ssd_fd[p] = -1;
    memcpy(r->held, held, sizeof r->held);
    size_t LE = (size_t)m->n_moe_layers * m->n_experts;
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT && r->held[p]; part++) {
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
        }
    uint64_t host_bytes[PREC_COUNT] = {0}, n_ssd[PREC_COUNT] = {0};
    for (int p = 0; p < PREC_COUNT; p++) {
        if (!r->held[p]) continue;
        r->host_off[p] = (uint64_t *)moesim_xmalloc(LE * sizeof(uint64_t));
        r->ssd_off[p] = (uint64_t *)moesim_xmalloc(LE * sizeof(uint64_t));
        r->ssd_stride[p] = (r->blob_bytes[p] + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
        for (size_t le = 0; le < LE; le++) {
            if (!on_ssd[le * PREC_COUNT + p]) {
                r->host_off[p][le] = host_bytes[p];
                r->ssd_off[p][le] = UINT64_MAX;
                host_bytes[p] += r->blob_bytes[p];
            } else {
                r->host_off[p][le] = UINT64_MAX;
                r->ssd_off[p][le] = n_ssd[p]++ * r->ssd_stride[p];
            }
        }
        /* placement fills DRAM in (layer, expert) order: the experts in DRAM are a prefix, the
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

/* The store sim.host_precisions gives a policy that loads `primary` alone (no load_precisions):
 * placed by memsys_place_for_policy in `dram_bytes`. */
static moesim_status store_for_settings(const model_geometry *m, const quant_table *q,
                                        const char *host_precisions, moesim_precision primary,
                                        uint64_t dram_bytes, const char *ssd_dir, uint64_t seed,
                                        const replay_weights *w, replay_store **out,
                                        moesim_error *err) {
    bool stored[PREC_COUNT], policy_only;
    moesim_status st = kernel_host_precisions(host_precisions, primary, stored, &policy_only, err);
    if (st) return st;
    memsys_config mc;
    memset(&mc, 0, sizeof mc);
    mc.n_layers = m->n_moe_layers;
    mc.n_experts = m->n_experts;
    accounting_part_bytes(m, q, stored, mc.part_bytes);
    memsys_host none;
    memset(&none, 0, sizeof none);
    memsys ms;
    memsys_init(&ms, &mc, &none);
    policy_methods primary_only; /* declares nothing: expert.precision alone */
    memset(&primary_only, 0, sizeof primary_only);
    memsys_place_for_policy(&ms, &primary_only, NULL, primary, policy_only, dram_bytes);
    bool held[PREC_COUNT];
    placed_precisions(&primary_only, NULL, primary, policy_only, mc.part_bytes, held);
    st = store_make(m, held, ms.on_ssd, ssd_dir, seed, w, out, err);
    memsys_free(&ms);
    return st;
}

extern "C" moesim_status replay_store_create(const model_geometry *m, const quant_table *q,
                                             const char *host_precisions, moesim_precision primary,
                                             uint64_t dram_bytes, const char *ssd_dir,
                                             uint64_t seed, replay_store **out, moesim_error *err) {
    return store_for_settings(m, q, host_precisions, primary, dram_bytes, ssd_dir, seed, NULL, out,
                              err);
}

extern "C" moesim_status
replay_store_create_checkpoint(const model_geometry *m, const quant_table *q,
                               const char *host_precisions, moesim_precision primary,
                               uint64_t dram_bytes, const char *ssd_dir, const replay_weights *w,
                               replay_store **out, moesim_error *err) {
    MOESIM_ASSERT(w);
    return store_for_settings(m, q, host_precisions, primary, dram_bytes, ssd_dir, 0, w, out, err);
}

extern "C" moesim_status replay_store_expert(const replay_store *r, uint32_t moe_layer,
                                             uint32_t expert, moesim_precision p, uint8_t *blob,
                                             moesim_error *err) {
    MOESIM_ASSERT(moe_layer < r->m.n_moe_layers && expert < r->m.n_experts);
    if ((unsigned)p >= PREC_COUNT || !r->held[p])
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

struct replay_state {
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
    quant_table quant;
    uint32_t route_capacity;     /* max distinct experts of one (sub-)route */
    uint64_t route_expert_bytes; /* one expert at the widest precision the policy loads */

    /* the memory system (sim/memsys.h) and the oracle's future */
    memsys ms;
    bool ms_live;
    sim_future future;
    uint64_t experts_peak;

    /* device arena: fixed blocks per precision carved from one allocation */
    uint32_t *block;    /* [L*E*P*3] device block of each part (memsys part index), or NONE */
    cudaEvent_t *ready; /* [L*E*P*3] event after the part's last chunk, or NULL: landed */
    uint8_t *arena;
    uint64_t arena_bytes, arena_top;
    std::vector<uint32_t> free_blocks[PREC_COUNT];
    std::vector<uint64_t> block_off[PREC_COUNT];
    uint64_t physical_refusals;

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
    std::vector<uint32_t> pinned_lep; /* pinned by the last route until the stream is idle */
    cudaStream_t s_demand, s_bg, s_comp;

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
    uint8_t *plan;
    uint32_t la_depth, la_k;
    sim_route_source src; /* the trace and the look-ahead the routes come from */
    uint64_t pf_hit, pf_active, pf_issued_sets;
    sim_route_tally tally; /* accesses, hits, skips and gate mass by precision class (as sim.c) */
    uint64_t expert_ops, sub_routes;

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
typedef struct replay_state rp;

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

static uint64_t run_ns(const rp *s) { return host_ns() - s->t0_host; }

/* ---- blocks: the memory system's physical room (memsys_host reserve / release) ---- */

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

/* A block for each part in `parts`, or none and a physical refusal: blocks are carved per
 * precision, so a multi-precision run can find no block of its size while the bytes fit. */
static bool on_reserve(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p,
                       uint32_t parts) {
    rp *s = (rp *)ctx;
    /* a policy loads only the precisions it declares (load_precisions): the store holds those */
    MOESIM_ASSERT(s->store->held[p]);
    size_t base = memsys_lep(&s->ms, layer, expert, p) * PART_COUNT;
    uint32_t got[PART_COUNT] = {NONE, NONE, NONE};
    for (int part = 0; part < PART_COUNT; part++)
        if (parts & (1u << part) && (got[part] = block_take(s, p)) == NONE) {
            for (int q = 0; q < part; q++)
                if (got[q] != NONE) s->free_blocks[p].push_back(got[q]);
            s->physical_refusals++;
            return false;
        }
    for (int part = 0; part < PART_COUNT; part++)
        if (parts & (1u << part)) s->block[base + part] = got[part];
    return true;
}

/* A part left HBM (evicted, or its not-started copy cancelled): no op reads its block any more
 * (the host waited for the compute stream before the route, and the route's experts are pinned),
 * and no copy writes it (a started copy cannot be evicted). */
static void on_release(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p, int part) {
    rp *s = (rp *)ctx;
    size_t pi = memsys_lep(&s->ms, layer, expert, p) * PART_COUNT + part;
    s->free_blocks[p].push_back(s->block[pi]);
    s->block[pi] = NONE;
    s->ready[pi] = NULL;
}

/* The HBM counter of the timeline (the simulator's "hbm" track: bytes of expert weights) and the
 * peak the result reports. */
static void on_hbm(void *ctx, uint64_t experts_used) {
    rp *s = (rp *)ctx;
    if (experts_used > s->experts_peak) s->experts_peak = experts_used;
    if (s->tl.on && s->t0_host) /* not before the clock starts (warm-up) */
        sim_timeline_counter(&s->tl, "hbm", run_ns(s), (double)experts_used);
}

/* ---- copies ---- */

/* Byte `acct` of part `part` at precision p (the memory system's units) in the kernel format:
 * chunks split parts in proportion, so a part's chunks cover its kernel bytes exactly. */
static uint64_t dev_offset(const rp *s, uint32_t p, int part, uint64_t acct) {
    return (uint64_t)((unsigned __int128)acct * s->dev_part_bytes[p][part] /
                      s->part_bytes[p][part]);
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

static void h2d_kick(rp *s);

/* The SSD engine: reads every chunk memsys hands it, synchronously on the host thread, into a
 * bounce slot, then reports it done so the H2D engine can copy it on (memsys stops handing out
 * chunks while its bounce buffer is full). */
static void ssd_kick(rp *s) {
    if (s->ssd_running) return; /* the loop below takes the new work */
    s->ssd_running = true;
    memsys_chunk c;
    while (memsys_next_chunk(&s->ms, MEMSYS_SSD, &c)) {
        const memsys_xfer *x = &s->ms.xf[c.xfer];
        MOESIM_ASSERT(!s->free_slots.empty()); /* sized from the bounce buffer (rp_setup) */
        rp_staged sg = {c.offset, c.bytes, s->free_slots.back(), {NULL, NULL, NULL}};
        s->free_slots.pop_back();
        memsys_piece pc[PART_COUNT];
        uint32_t n = memsys_chunk_pieces(&s->ms, &c, pc);
        size_t le = (size_t)x->layer * s->E + x->expert;
        uint64_t used = 0, t0 = host_ns();
        for (uint32_t i = 0; i < n; i++) {
            uint64_t a = dev_offset(s, x->prec, pc[i].part, pc[i].part_offset);
            uint64_t b = dev_offset(s, x->prec, pc[i].part, pc[i].part_offset + pc[i].bytes);
            sg.src[i] = ssd_pread(s, x->prec, le, part_blob_offset(s, x->prec, pc[i].part) + a,
                                  b - a, sg.slot, &used);
        }
        uint64_t t1 = host_ns();
        s->ssd_busy_ns += t1 - t0;
        if (s->tl.on) {
            char name[64];
            snprintf(name, sizeof name, "L%u e%u %s ssd", x->layer, x->expert,
                     precision_name((moesim_precision)x->prec));
            sim_timeline_slice(&s->tl, SIM_TRACK_SSD, "ssd", name, t0 - s->t0_host,
                               t1 - s->t0_host);
        }
        if (s->staged.size() <= c.xfer) s->staged.resize(c.xfer + 1);
        s->staged[c.xfer].push_back(sg);
        memsys_xfer fin;
        bool landed = memsys_chunk_done(&s->ms, &c, &fin); /* staged: the H2D engine goes on */
        MOESIM_ASSERT(!landed);
    }
    s->ssd_running = false;
}

/* The H2D engine: keeps COPY_WINDOW chunks in flight, each the chunk memsys hands out next (so a
 * demand load overtakes queued prefetches at the next chunk boundary), one cudaMemcpyAsync per
 * part it spans, from the pinned store or the bounce slot its SSD read filled. */
static void h2d_kick(rp *s) {
    memsys_chunk c;
    while (s->inflight.size() < COPY_WINDOW && memsys_next_chunk(&s->ms, MEMSYS_H2D, &c)) {
        const memsys_xfer *x = &s->ms.xf[c.xfer];
        uint32_t p = x->prec;
        memsys_piece pc[PART_COUNT];
        uint32_t n = memsys_chunk_pieces(&s->ms, &c, pc);
        rp_chunk rc = {c, cev_get(s), cev_get(s), -1, 0, 0, x->layer, x->expert, x->prec, x->cls};
        const uint8_t *src[PART_COUNT];
        size_t le = (size_t)x->layer * s->E + x->expert;
        if (x->via_ssd) { /* the SSD chunk of the same bytes (chunks of both engines align) */
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
        cudaStream_t st = x->cls == POLICY_DEMAND ? s->s_demand : s->s_bg;
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
        size_t base = memsys_lep(&s->ms, x->layer, x->expert, p) * PART_COUNT;
        for (uint32_t i = 0; i < n; i++) {
            int part = pc[i].part;
            uint64_t a = dev_offset(s, p, part, pc[i].part_offset);
            uint64_t b = dev_offset(s, p, part, pc[i].part_offset + pc[i].bytes);
            CUDA_CHECK(cudaMemcpyAsync((uint8_t *)block_ptr(s, p, s->block[base + part]) + a,
                                       src[i], b - a, cudaMemcpyHostToDevice, st));
            rc.dev_bytes += b - a;
            if (pc[i].part_offset + pc[i].bytes == s->part_bytes[p][part])
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

static void on_work(void *ctx, int engine) {
    if (engine == MEMSYS_SSD)
        ssd_kick((rp *)ctx);
    else
        h2d_kick((rp *)ctx);
}

/* Retires finished chunks in submission order: memsys makes their parts resident and the policy
 * hears of completed loads (memsys_deliver, after the engine restarted). Never called from inside
 * a policy callback (on_route may be issuing loads). */
static void retire(rp *s) {
    while (!s->inflight.empty()) {
        cudaError_t e = cudaEventQuery(s->inflight.front().ev1);
        if (e == cudaErrorNotReady) break;
        CUDA_CHECK(e);
        rp_chunk rc = s->inflight.front();
        s->inflight.pop_front();
        s->done_chunks.push_back(rc);
        if (s->xfer_last[rc.c.xfer] == rc.ev1) s->xfer_last[rc.c.xfer] = NULL;
        if (rc.slot >= 0) s->free_slots.push_back(rc.slot); /* its bytes left the bounce slot */
        size_t base = memsys_lep(&s->ms, rc.layer, rc.expert, rc.prec) * PART_COUNT;
        for (int part = 0; part < PART_COUNT; part++)
            if (rc.ends & (1u << part)) s->ready[base + part] = NULL; /* landed: ops need not wait */
        memsys_xfer fin;
        bool complete = memsys_chunk_done(&s->ms, &rc.c, &fin);
        h2d_kick(s);
        if (complete) memsys_deliver(&s->ms, &fin, run_ns(s));
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
    size_t base = memsys_lep(&s->ms, layer, e, p) * PART_COUNT;
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


/* Unpins the last route's experts: call only when the compute stream is idle (the replay's
 * memsys_unpin point: an op enqueued is not an op done). */
static void unpin_all(rp *s) {
    for (uint32_t lep : s->pinned_lep) {
        uint32_t p = lep % s->P, le = lep / s->P;
        memsys_unpin(&s->ms, le / s->E, le % s->E, (moesim_precision)p);
    }
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
    size_t base = memsys_lep(&s->ms, layer, e, p) * PART_COUNT;
    for (;;) {
        bool ok = true;
        for (int part = 0; part < PART_COUNT; part++)
            if (mask & (1u << part) && s->ms.state[base + part] == POLICY_LOADING &&
                !s->ready[base + part])
                ok = false;
        if (ok) return;
        pump(s);
    }
}

/* Before a route is planned, its pool must have room for the route's experts once everything
 * the policy may evict is evicted: copies already started cannot be (even those of the route's
 * own experts, which may be at another precision than planned), so the host waits for them to
 * land (sim.c's stream_wait_room). The compute stream is idle meanwhile:
 * an op of category "stall" between two events on it (step_resolve counts it as stall). */
static void wait_room(rp *s, uint32_t layer, uint32_t n_active) {
    uint64_t cap = s->bud.pool_cap_bytes;
    uint64_t need = (uint64_t)n_active * s->route_expert_bytes;
    if (need > cap) need = cap;
    if (s->ms.pool_used[s->ms.cfg.per_layer ? layer : 0] + need <= cap) return;
    if (memsys_unevictable_bytes(&s->ms, layer) + need <= cap) return;
    op_begin(s, "stall", "stall: room", (int)layer, NULL);
    do
        wait_next_chunk(s);
    while (memsys_unevictable_bytes(&s->ms, layer) + need > cap);
    op_end(s);
}

/* Issue sequence of the copy loading part `part_index` of the layer being routed (the callback
 * of sim_route_execution_order). */
static uint64_t loading_seq(const void *host, size_t part_index) {
    const rp *s = (const rp *)host;
    size_t layer_parts = (size_t)s->ms.cur_layer * s->E * s->P * PART_COUNT;
    return memsys_loading_seq(&s->ms, layer_parts + part_index);
}

/* One (sub-)route, as sim.c's run_route: plan, hits, gate mass, then the experts in order. */
static void run_route(rp *s, uint64_t step, uint32_t layer, uint32_t i0, uint32_t i1,
                      bool first_of_layer, bool last_of_layer) {
    const uint32_t K = s->K;
    uint32_t n = i1 - i0;
    const uint16_t *ex = s->r_experts + (size_t)i0 * K;
    const float *gs = s->r_gates + (size_t)i0 * K;
    sim_route_scratch rs = {s->stamp,         &s->stamp_gen,  s->active, s->slot,
                            s->active_tokens, s->active_gate, s->plan};
    uint32_t n_active = sim_route_active_build(&rs, ex, gs, n * K);
    if (first_of_layer)
        sim_route_prefetch_account(&rs, n_active, s->r_experts, s->sch.steps[step].n_tokens * K,
                                   s->ms.pf_mark + (size_t)layer * s->E, s->E,
                                   &s->ms.pf_count[layer], &s->pf_hit, &s->pf_active,
                                   &s->pf_issued_sets);
    wait_compute(s); /* the router's output is known: the host decides now */
    unpin_all(s);    /* the stream is idle: the last route's experts have run */
    wait_room(s, layer, n_active);
    policy_route route;
    memset(&route, 0, sizeof route);
    route.layer = layer;
    route.now_ns = run_ns(s);
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
    s->ms.cur_layer = layer;
    s->ms.cur_step = step;
    s->sub_routes++;
    s->pm->on_route(s->pol, &route, &plan);

    moesim_precision hi = s->pm->hi_precision ? s->pm->hi_precision(s->pol) : s->prec;
    uint8_t prim_bits = (uint8_t)s->quant.fmt[hi].weight_bits;
    for (uint32_t a = 0; a < n_active; a++) { /* pinned until the stream is idle (unpin_all) */
        uint8_t pr = s->plan[a];
        if (pr == POLICY_RUN_SKIP || pr >= PREC_COUNT) continue; /* memsys_run_plan asserts */
        size_t lep = memsys_lep(&s->ms, layer, s->active[a], pr);
        if (!s->ms.pinned[lep]) s->pinned_lep.push_back((uint32_t)lep);
    }
    memsys_run_plan(&s->ms, layer, s->active, s->plan, n_active);
    const size_t layer_parts = (size_t)layer * s->E * s->P * PART_COUNT;
    sim_route_tally_accesses(&rs, ex, gs, n * K, s->ms.state + layer_parts, s->P, &s->quant,
                             prim_bits, &s->tally);
    if (last_of_layer) memsys_end_layer(&s->ms, layer, run_ns(s));
    uint32_t n_run = sim_route_execution_order(&rs, n_active, s->ms.state + layer_parts, s->P,
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

/* sim.c's run_layer: sub-routes whose distinct experts fit one pool, in token order. */
static void run_layer(rp *s, uint64_t step, uint32_t layer) {
    const replay_step *sd = &s->sch.steps[step];
    uint32_t n = sd->n_tokens, K = s->K;
    sim_route_gather(&s->src, s->sch.tokens + sd->first, n, layer, s->r_experts, s->r_gates,
                     s->r_importance, s->r_la_ids, s->r_la_scores);
    memsys_begin_layer(&s->ms);
    sim_route_scratch rs = {s->stamp,         &s->stamp_gen,  s->active, s->slot,
                            s->active_tokens, s->active_gate, s->plan};
    uint32_t i0 = 0;
    bool first = true;
    while (i0 < n) {
        uint32_t i1 = sim_route_split(&rs, s->r_experts, K, i0, n, s->route_capacity);
        run_route(s, step, layer, i0, i1, first, i1 == n);
        for (uint32_t i = i0 * K; i < i1 * K; i++)
            s->ms.access_pos += s->r_experts[i] != TRACE_NO_EXPERT;
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

/* The run's store: the caller's when it holds exactly this run's placement (the same precisions,
 * each expert in DRAM or on the SSD alike) of this run's weights, else the run's own. */
static moesim_status store_choose(rp *s, const replay_inputs *in, const bool held[PREC_COUNT],
                                  moesim_error *err) {
    const replay_store *b = in->store;
    bool fits = b && b->weights == in->weights && !memcmp(&b->m, s->m, sizeof *s->m);
    size_t LE = (size_t)s->L * s->E;
    for (int p = 0; fits && p < PREC_COUNT; p++) {
        fits = b->held[p] == held[p];
        for (size_t le = 0; fits && held[p] && le < LE; le++)
            fits = (b->host_off[p][le] == UINT64_MAX) == (s->ms.on_ssd[le * s->P + p] != 0);
    }
    if (fits) {
        s->store = b;
        return MOESIM_OK;
    }
    moesim_status st = store_make(s->m, held, s->ms.on_ssd, in->ssd_dir, in->weight_seed,
                                  in->weights, &s->own_store, err);
    if (!st) s->store = s->own_store;
    return st;
}

/* Pinned bounce slots for SSD chunks waiting for the H2D engine, one chunk each. memsys hands out
 * an SSD chunk only while the bytes staged (read, not yet copied on) fit sim.bounce_mib, and
 * every chunk is at least the smallest chunk any transfer can have (a whole chunk, or the tail
 * of a transfer of some parts at a held precision), so that many slots never run out. */
static moesim_status bounce_alloc(rp *s, moesim_error *err) {
    if (!s->store->n_on_ssd) return MOESIM_OK;
    uint64_t chunk = s->ms.cfg.chunk_bytes, min_chunk = chunk, max_dev = 0;
    for (int p = 0; p < PREC_COUNT; p++) {
        if (!s->store->held[p]) continue;
        for (uint32_t mask = 1; mask <= POLICY_PARTS_ALL; mask++) {
            uint64_t bytes = 0;
            for (int part = 0; part < PART_COUNT; part++)
                if (mask & (1u << part)) bytes += s->part_bytes[p][part];
            uint64_t tail = bytes % chunk ? bytes % chunk : chunk;
            if (tail < min_chunk) min_chunk = tail;
        }
        for (int part = 0; part < PART_COUNT; part++) { /* a chunk's kernel bytes, at most */
            uint64_t d = (uint64_t)(((unsigned __int128)chunk * s->dev_part_bytes[p][part] +
                                     s->part_bytes[p][part] - 1) /
                                    s->part_bytes[p][part]);
            if (d > max_dev) max_dev = d;
        }
    }
    /* each piece (one per part, at most 3) rounds out to O_DIRECT alignment on both sides */
    s->slot_bytes =
        (max_dev + PART_COUNT + 2 * PART_COUNT * SSD_ALIGN + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
    uint64_t n_slots = s->ms.cfg.bounce_bytes / min_chunk;
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
    if (s->set.cost_table[0]) { /* sim reads it; replay only checks it loads, like sim would */
        cost_model c;
        cost_model_init(&c, in->hw, m, in->quant);
        if ((st = cost_table_load(&c, s->set.cost_table, err))) return st;
    }
    bool stored[PREC_COUNT], policy_only;
    if ((st = kernel_host_precisions(s->set.host_precisions, s->prec, stored, &policy_only, err)))
        return st;
    /* the SSD path always stages in DRAM here (pread into pinned slots, then PCIe) */
    if (s->set.bounce_mib * 1024 < s->set.chunk_kib)
        return moesim_fail(err, MOESIM_EINPUT,
                           "[sim] bounce_mib = %" PRIu64 ": expected at least one copy chunk "
                           "(sim.chunk_kib = %" PRIu64 ")",
                           s->set.bounce_mib, s->set.chunk_kib);
    accounting_part_bytes(m, in->quant, stored, s->part_bytes);
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

    /* the memory system: the simulator's pools, classes and placement (sim/memsys.h) */
    memsys_config mc;
    memset(&mc, 0, sizeof mc);
    mc.n_layers = s->L;
    mc.n_experts = s->E;
    memcpy(mc.part_bytes, s->part_bytes, sizeof mc.part_bytes);
    mc.per_layer = s->bud.per_layer;
    mc.pool_cap_bytes = s->bud.pool_cap_bytes;
    mc.chunk_bytes = s->set.chunk_kib * 1024;
    mc.bounce_bytes = s->set.bounce_mib * 1024 * 1024;
    mc.gpu_direct_storage = false;
    memsys_host mh = {s, on_work, on_hbm, on_reserve, on_release};
    memsys_init(&s->ms, &mc, &mh);
    s->ms_live = true;
    sim_future_init(&s->future, t, &s->sch);
    s->ms.future = &s->future;
    s->view.ops = &memsys_ops;
    s->view.mem = &s->ms;
    if (t->meta.lookahead_depth) {
        s->la_depth = t->meta.lookahead_depth;
        s->la_k = t->meta.lookahead_k;
    } else {
        s->la_depth = s->set.predictor_depth;
        s->la_k = s->la_depth ? s->K : 0;
    }
    s->src.tr = t;
    s->src.L = s->L;
    s->src.E = s->E;
    s->src.K = s->K;
    s->src.la_depth = s->la_depth;
    s->src.la_k = s->la_k;
    s->src.la_emulated = !t->meta.lookahead_depth && s->la_depth > 0;
    s->src.seed = s->set.seed;
    s->src.accuracy = s->set.predictor_accuracy;
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
    params.lookahead_emulated = s->src.la_emulated;
    params.seed = s->set.seed;
    memcpy(params.part_bytes, s->part_bytes, sizeof params.part_bytes);
    s->params = params;
    if ((st = s->pm->create(&s->params, s->knobs, s->view, &s->pol, err))) {
        moesim_error_prefix(err, "policy '%s'", s->pm->name);
        return st;
    }
    memsys_attach_policy(&s->ms, s->pm, s->pol);

    /* host placement (sim.c's): what the policy loads first, in DRAM less the bounce buffer;
     * routes are sized by the widest precision it loads */
    uint64_t dram = in->hw->dram_bytes;
    s->route_expert_bytes =
        memsys_place_for_policy(&s->ms, s->pm, s->pol, s->prec, policy_only,
                                dram > mc.bounce_bytes ? dram - mc.bounce_bytes : 0);
    s->route_capacity = s->bud.per_layer ? s->bud.route_capacity
                                         : sim_budget_route_capacity(s->bud.expert_budget_bytes,
                                                                     s->route_expert_bytes, s->K,
                                                                     s->E);

    /* host store: the caller's when it holds this placement of this run's weights (validate
     * shares one over its runs), else the run's own */
    bool held[PREC_COUNT];
    placed_precisions(s->pm, s->pol, s->prec, policy_only, s->part_bytes, held);
    if ((st = store_choose(s, in, held, err))) return st;
    if ((st = bounce_alloc(s, err))) return st;
    for (int p = 0; p < PREC_COUNT; p++) /* blocks only for the formats this run holds */
        for (int part = 0; part < PART_COUNT; part++)
            s->dev_part_bytes[p][part] =
                s->store->held[p] ? s->store->dev_part_bytes[p][part] : 0;
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
    s->block = (uint32_t *)moesim_xmalloc(LEP * PART_COUNT * sizeof(uint32_t));
    for (size_t i = 0; i < LEP * PART_COUNT; i++) s->block[i] = NONE;
    s->ready = (cudaEvent_t *)moesim_xcalloc(LEP * PART_COUNT, sizeof(cudaEvent_t));
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
    if (in->timeline_path &&
        (st = sim_timeline_open_as(&s->tl, in->timeline_path, "moesim replay",
                                   &in->timeline_window, err)))
        return st;
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
            char name[64];
            snprintf(name, sizeof name, "L%u e%u %s %s", c.layer, c.expert,
                     precision_name((moesim_precision)c.prec),
                     c.cls == POLICY_DEMAND     ? "demand"
                     : c.cls == POLICY_PREFETCH ? "prefetch"
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
        if (!strcmp(o->cat, "stall")) s->stall_ns += t1 - t0; /* the host waited for room */
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

/* Copies the loads the policy issued during warm-up (memsys.warm: they are resident in memsys
 * already) before the clock starts, part by part from DRAM or through a bounce slot. */
static void warm_copy(rp *s) {
    for (uint32_t i = 0; i < s->ms.n_warm; i++) {
        uint32_t lep = s->ms.warm[i], p = lep % s->P, le = lep / s->P;
        const replay_store *st = s->store;
        for (int part = 0; part < PART_COUNT; part++) {
            if (!(s->ms.warm_parts[i] & (1u << part))) continue;
            uint8_t *dst = (uint8_t *)block_ptr(s, p, s->block[(size_t)lep * PART_COUNT + part]);
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

static void rp_loop(rp *s, uint64_t *step_start, uint64_t *step_end) {
    const model_geometry *m = s->m;
    memsys_warmup_begin(&s->ms);
    if (s->pm->warmup) s->pm->warmup(s->pol, 0);
    warm_copy(s);
    memsys_warmup_end(&s->ms);
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
        ps.now_ns = run_ns(s);
        sim_timeline_step(&s->tl, st, ps.now_ns); /* the GPU is idle: host and event clocks agree */
        ps.n_tokens = sd->n_tokens;
        ps.is_prefill = sd->is_prefill;
        ps.request = req.data();
        ps.position = pos.data();
        s->ms.cur_step = st;
        s->ms.cur_layer = -1;
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
        if (s->pm->end_step) s->pm->end_step(s->pol, &ps, run_ns(s));
    }
    /* drain: copies still queued or in flight (prefetches nobody used) complete */
    pump(s);
    while (!s->inflight.empty()) wait_next_chunk(s);
    for (int e = 0; e < MEMSYS_ENGINES; e++)
        for (int c = 0; c < MEMSYS_CLASSES; c++) MOESIM_ASSERT(s->ms.head[e][c] == NONE);
    CUDA_CHECK(cudaDeviceSynchronize());
    memsys_finish(&s->ms);
}

static void rp_result(rp *s, const uint64_t *step_start, const uint64_t *step_end, sim_result *r,
                      replay_checks *ck) {
    memset(r, 0, sizeof *r);
    snprintf(r->policy, sizeof r->policy, "%s", s->pm->name);
    sim_result_set_latency(r, &s->sch, step_start, step_end, s->hooks);
    uint64_t makespan = s->sch.n_steps ? step_end[s->sch.n_steps - 1] : 0;
    r->tokens = s->tr->n_tokens;
    r->requests = s->sch.n_requests;
    r->makespan_ms = (double)makespan / 1e6;
    r->tokens_per_s = makespan ? (double)r->tokens * 1e9 / (double)makespan : 0;
    r->hit_rate = s->tally.accesses ? (double)s->tally.hits / (double)s->tally.accesses : 0;
    r->h2d_bytes = s->ms.n.h2d_bytes;
    r->stall_ms = (double)s->stall_ns / 1e6;
    r->budget_bytes = s->bud.budget_bytes;
    double mass = s->tally.gate_hi + s->tally.gate_lo + s->tally.gate_skip;
    r->precision_mix_hi = mass > 0 ? s->tally.gate_hi / mass : 0;
    r->precision_mix_lo = mass > 0 ? s->tally.gate_lo / mass : 0;
    r->precision_mix_skip = mass > 0 ? s->tally.gate_skip / mass : 0;
    r->bits_per_weight = sim_route_tally_bits_per_weight(&s->tally);
    r->prefetch_accuracy = s->pf_active ? (double)s->pf_hit / (double)s->pf_active : 0;
    r->prefetch_utilization = s->pf_issued_sets ? (double)s->pf_hit / (double)s->pf_issued_sets : 0;
    r->prefetches = s->ms.n.prefetches;
    r->prefetch_late = s->ms.n.late;
    r->prefetch_promoted = s->ms.n.promoted;
    r->prefetch_cancelled = s->ms.n.cancelled;
    r->prefetch_wasted_bytes = s->ms.n.wasted_bytes;
    r->predictor_emulated = s->params.lookahead_emulated;
    r->predictor_accuracy = s->set.predictor_accuracy;
    r->accesses = s->tally.accesses;
    r->hits = s->tally.hits;
    r->skipped_accesses = s->tally.skipped;
    r->expert_ops = s->expert_ops;
    r->steps = s->sch.n_steps;
    r->sub_routes = s->sub_routes;
    r->warmup_h2d_bytes = s->ms.n.warmup_bytes;
    r->expert_budget_bytes = s->bud.expert_budget_bytes;
    r->kv_peak_bytes = s->bud.kv_peak_bytes;
    chunks_account(s); /* the drained copies */
    uint64_t busy = s->h2d_busy_ns;
    r->h2d_busy_ms = (double)busy / 1e6;
    r->ssd_bytes = s->ms.n.ssd_bytes;
    r->ssd_busy_ms = (double)s->ssd_busy_ns / 1e6;
    /* as the simulator accounts it (its KV term follows the steps; this one is the reservation) */
    r->peak_hbm_bytes =
        s->bud.non_expert_bytes + s->bud.act_bytes + s->bud.kv_peak_bytes + s->experts_peak;
    if (s->pm->report) {
        const char *names[SIM_POLICY_REPORT_MAX];
        double values[SIM_POLICY_REPORT_MAX];
        size_t n = s->pm->report(s->pol, names, values, SIM_POLICY_REPORT_MAX);
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
        ck->h2d_gb_per_s = busy ? (double)s->h2d_dev_bytes / (double)busy : 0;
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
    free(s->block);
    free(s->ready);
    if (s->ms_live) memsys_free(&s->ms);
    sim_future_free(&s->future);
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
