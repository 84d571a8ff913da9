/* The CUDA forward pass of the engine, behind a plain C interface (no CUDA types) so that
 * the engine's "cuda" backend (engine/backend_cuda.c, selected with engine_options.backend =
 * "cuda") can drive it while every CUDA line stays under kernels/cuda (STYLE habit 1). The backend
 * describes the engine's loaded weights (host pointers) with the structs below; this module
 * copies what it needs and owns the device side.
 *
 * Memory: non-expert weights (attention, norms, router, shared expert, dense MLPs, LM head) are
 * resident on the device. Routed experts live in pinned host memory (cudaHostAlloc), one blob
 * [gate | up | down] per (MoE layer, expert, held precision), and are loaded on demand into a
 * fixed-block device pool (allocated once at create; no cudaMalloc on the hot path) on a copy
 * stream; CUDA events order each copy before the kernels that read the block and each block's
 * last read before the copy that overwrites it; the least recently used block is replaced. With
 * pool_experts = 0 the pool holds every expert at every held precision, preloaded (resident).
 *
 * Numerics follow the CPU backend op for op (same fp32 operations in the same order where the
 * order is observable; GEMV sums in a different order): see tests/test_gpu_engine.c. */
#ifndef MOESIM_KERNELS_CUDA_ENGINE_CUDA_H
#define MOESIM_KERNELS_CUDA_ENGINE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Storage kind of a matrix; same values as engine/weights.h's mat_kind. */
enum { ECU_F32 = 0, ECU_BF16, ECU_Q8, ECU_Q4, ECU_Q2 };

/* A host matrix [rows][cols] (a vector when rows == 1), borrowed for the duration of create. */
typedef struct ecu_mat {
    uint32_t kind;
    const void *data;
    uint32_t rows, cols;
} ecu_mat;

#define ECU_PARTS 3 /* gate, up, down (common/model.h's expert_part order) */
#define ECU_PRECS 6 /* moesim_precision values (PREC_COUNT) */

typedef struct ecu_layer {
    const float *attn_norm, *ffn_norm;     /* [hidden] */
    const float *q_bias, *k_bias, *v_bias; /* [q_dim], [kv_dim], [kv_dim] or NULL */
    const float *o_bias;                   /* [hidden] or NULL */
    uint32_t attn_window;                  /* the last attn_window positions; 0: all */
    const float *q_norm, *k_norm;          /* [head_dim] (per head) or [q_dim]/[kv_dim], or NULL */
    ecu_mat wq, wk, wv, wo;
    bool is_moe;
    ecu_mat router;            /* [n_experts][hidden] (MoE layers) */
    const ecu_mat *experts;    /* [n_experts][ECU_PRECS][ECU_PARTS]; data NULL where
                                  the precision is not held (MoE layers) */
    ecu_mat shared[ECU_PARTS]; /* when shared_inter > 0 */
    const float *shared_gate;  /* [hidden] or NULL */
    ecu_mat dense[ECU_PARTS];  /* non-MoE layers */
} ecu_layer;

typedef struct ecu_model {
    uint32_t n_layers, hidden, vocab, n_heads, n_kv_heads, head_dim;
    uint32_t n_experts, top_k, expert_inter, shared_inter, dense_inter, n_moe_layers;
    bool norm_topk_prob, qk_norm_per_head, qk_norm_full;
    float rms_eps, clip_qkv; /* q, k, v clamped to [-clip_qkv, clip_qkv] when clip_qkv_on */
    bool clip_qkv_on;
    double rope_theta;
    const uint32_t *moe_index; /* [n_layers] model layer -> MoE layer index */
    uint32_t precision_mask;   /* bit (1u << p) for each held precision */
    const ecu_layer *layers;   /* [n_layers] */
    const float *final_norm;   /* [hidden] */
    ecu_mat lm_head;           /* [vocab][hidden] */
    uint32_t pool_experts;     /* device pool blocks (one expert at one precision each); 0: all */
} ecu_model;

typedef struct engine_cuda engine_cuda;
typedef struct engine_cuda_seq engine_cuda_seq;

/* Uploads the model; 0 on success, else -1 with a one-line reason in msg (no device, the pool
 * or the weights do not fit, a pool smaller than top_k). Caller owns *out; engine_cuda_destroy. */
int engine_cuda_create(const ecu_model *m, engine_cuda **out, char *msg, size_t msg_len);
void engine_cuda_destroy(engine_cuda *g); /* accepts NULL */

/* A sequence's device KV cache of max_ctx positions and importance. Caller owns. */
engine_cuda_seq *engine_cuda_seq_create(engine_cuda *g, uint32_t max_ctx);
void engine_cuda_seq_destroy(engine_cuda_seq *s); /* accepts NULL */

/* What one token's forward returns to the host (NULL pointers: not wanted). */
typedef struct ecu_token_out {
    float *logits;           /* [vocab] */
    uint16_t *expert_ids;    /* [n_moe_layers][top_k] */
    float *gate_weights;     /* [n_moe_layers][top_k] */
    uint32_t la_depth, la_k; /* look-ahead D and K' */
    uint16_t *la_ids;        /* [n_moe_layers][D][K'] */
    float *la_scores;        /* [n_moe_layers][D][K'] */
    float *importance;       /* [n_moe_layers][max_ctx]: positions [start, pos] refreshed, start
                                the first position the widest attention window sees */
} ecu_token_out;

/* Runs the token whose embedding row is x: [hidden] (host) at position pos of s.
 * prec: [n_moe_layers][n_experts] moesim_precision per expert or 0xff (skip); NULL: bf16. */
void engine_cuda_forward(engine_cuda *g, engine_cuda_seq *s, const float *x, uint32_t pos,
                         const uint8_t *prec, ecu_token_out *out);

/* Expert pool counters since create (for benchmarks and `moesim record --json`). */
typedef struct ecu_pool_stats {
    uint64_t hits, misses, h2d_bytes;
    uint32_t blocks;
    uint64_t block_bytes;
} ecu_pool_stats;
void engine_cuda_pool_stats(const engine_cuda *g, ecu_pool_stats *out);

#ifdef __cplusplus
}
#endif

#endif
