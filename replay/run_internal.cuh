/* What the `cuda` backend's files share (replay/run.cu: compute, steps, setup and the backend
 * table; replay/run_copy.cu: the copy engines and the waits on them): the backend's state and
 * its small helpers. CUDA C++; included by those two files only. */
#ifndef MOESIM_REPLAY_RUN_INTERNAL_CUH
#define MOESIM_REPLAY_RUN_INTERNAL_CUH

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
#include "core/future.h"
#include "core/memsys.h"
#include "core/route.h"
#include "core/timeline.h"
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

static inline rp *be_of(const replay_exec *x) { return (rp *)x->be_state; }

static inline cudaEvent_t ev_get(rp *s) {
    if (s->ev_used == s->ev_pool.size()) {
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));
        s->ev_pool.push_back(e);
    }
    return s->ev_pool[s->ev_used++];
}

/* Chunk events live until the chunk retired and its times were read (chunks_account). */
static inline cudaEvent_t cev_get(rp *s) {
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

static inline uint64_t ev_ns(rp *s, cudaEvent_t e) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, s->ev_start, e));
    return ms <= 0 ? 0 : (uint64_t)llround((double)ms * 1e6);
}

static inline uint64_t run_ns(const rp *s) { return replay_exec_now(s->x); }

static inline uint8_t *block_ptr(const rp *s, size_t part_index) {
    return s->arena + block_pool_offset(&s->x->pool, part_index);
}

/* ---- the copy engines (replay/run_copy.cu) ---- */

uint64_t cuda_part_blob_offset(const rp *s, uint32_t p, int part);
const uint8_t *cuda_ssd_pread(rp *s, uint32_t p, size_t le, uint64_t lo, uint64_t n,
                                int32_t slot, uint64_t *used);
void cuda_pump(rp *s);
void cuda_wait_next_chunk(rp *s);
void cuda_wait_compute(replay_exec *x);
void cuda_copy_kick(replay_exec *x, int engine);
bool cuda_wait_copy(replay_exec *x);
void cuda_expert_wait(replay_exec *x, uint32_t layer, uint32_t e, moesim_precision p,
                             uint32_t mask);
void cuda_part_released(replay_exec *x, size_t part_index);

#endif
