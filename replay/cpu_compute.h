/* The compute of the CPU replay (replay/exec_cpu.c) and of its calibration (replay/calib_cpu.c),
 * one function per op of sim/COST.md so what calibration times is exactly what the replay runs:
 * single-threaded fp32 activations over bf16 weights (the engine's CPU kernels), experts at their
 * planned precision from pool blocks. Weights are a checkpoint's (`moesim replay --model DIR`) or
 * seeded random bf16, each layer its own (matvecs stream from DRAM as a real model's do);
 * activations and the KV buffer are synthetic: what is timed is shapes and bytes. */
#ifndef MOESIM_REPLAY_CPU_COMPUTE_H
#define MOESIM_REPLAY_CPU_COMPUTE_H

#include <stdint.h>

#include "common/model.h"
#include "common/precision.h"
#include "replay/weights.h"

typedef struct cpu_compute {
    const model_geometry *m;          /* borrowed */
    uint16_t **w_qkv, **w_o;          /* [n_layers] q|k|v and o projections, bf16 */
    uint16_t **w_router, **w_shared;  /* [n_layers] MoE layers only, else NULL */
    uint16_t **w_dense;               /* [n_layers] dense FFN layers only, else NULL */
    uint16_t *w_lm;                   /* [vocab][hidden] */
    float *x, *q, *kv, *att, *probs, *h1, *h2, *y, *logits;
    uint64_t q_dim, kv_dim;
    uint32_t max_ctx; /* attention runs over at most this many positions */
} cpu_compute;

/* Allocates the weights and buffers of `m` for contexts up to `max_ctx` (caller-allocated
 * struct; cpu_compute_free): the non-expert matrices of checkpoint `w`, or with w = NULL seeded
 * random ones. */
void cpu_compute_init(cpu_compute *c, const model_geometry *m, uint32_t max_ctx, uint64_t seed,
                      const replay_weights *w);
void cpu_compute_free(cpu_compute *c); /* accepts a zeroed struct */

/* Model layer `ml` (0..n_layers-1) for tokens at `positions` ([n]): attention is its projections
 * (q/k/v, o; per token) plus its core (rotary, scores and values over each token's context). */
void cpu_compute_attention(cpu_compute *c, uint32_t ml, const uint32_t *positions, uint32_t n);
void cpu_compute_attention_proj(cpu_compute *c, uint32_t ml, uint32_t n);
void cpu_compute_attention_core(cpu_compute *c, const uint32_t *positions, uint32_t n);
void cpu_compute_router(cpu_compute *c, uint32_t ml, uint32_t n);
void cpu_compute_shared(cpu_compute *c, uint32_t ml, uint32_t n);
void cpu_compute_dense(cpu_compute *c, uint32_t ml, uint32_t n);
void cpu_compute_combine(cpu_compute *c, uint32_t n);
void cpu_compute_lm_head(cpu_compute *c, uint32_t n_emit);
/* An expert at precision p for `tokens` tokens: gate and up (from their blocks, then SwiGLU), or
 * down. */
void cpu_compute_expert_gate_up(cpu_compute *c, moesim_precision p, const void *gate,
                                const void *up, uint32_t tokens);
void cpu_compute_expert_down(cpu_compute *c, moesim_precision p, const void *down,
                             uint32_t tokens);

#endif
