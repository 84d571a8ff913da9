/* The loaded weights of an engine as other modules read them (the replay copies the checkpoint's
 * matrices into its own stores): a matrix in its stored format, the kinds of tensor an
 * architecture names, and the accessor. The matrices stay the engine's: they live as long as it. */
#ifndef MOESIM_ENGINE_WEIGHTS_H
#define MOESIM_ENGINE_WEIGHTS_H

#include <stdint.h>

#include "common/precision.h"
#include "engine/engine.h"

/* A weight matrix [rows][cols] (a vector when rows == 1) in one stored format. */
typedef enum mat_kind { MAT_F32 = 0, MAT_BF16, MAT_Q8, MAT_Q4, MAT_Q2 } mat_kind;
typedef struct engine_mat {
    mat_kind kind;
    const void *data; /* borrowed from the mapping (bf16) or owned by the engine */
    uint32_t rows, cols;
} engine_mat;

/* Tensors an architecture names; the forward pass asks for them by kind. */
typedef enum tensor_kind {
    T_EMBED, T_FINAL_NORM, T_LM_HEAD,
    T_ATTN_NORM, T_FFN_NORM, T_Q, T_K, T_V, T_O, T_Q_BIAS, T_K_BIAS, T_V_BIAS, T_O_BIAS, T_Q_NORM,
    T_K_NORM,
    T_ROUTER, T_EXP_GATE, T_EXP_UP, T_EXP_DOWN,
    T_SHARED_GATE, T_SHARED_UP, T_SHARED_DOWN, T_SHARED_EXPERT_GATE,
    T_DENSE_GATE, T_DENSE_UP, T_DENSE_DOWN,
    T_KIND_COUNT
} tensor_kind;

/* The loaded matrix of `kind` at model layer `layer` (`expert` and precision `p` for the routed
 * experts' kinds; ignored otherwise; `layer` ignored for T_EMBED and T_LM_HEAD, which is the
 * embedding when tied), or NULL where there is none: a router, expert or shared expert of a
 * dense layer, a dense FFN of an MoE layer, an expert precision not held, and the vector kinds
 * (norms, biases, the shared expert's gate). Borrowed from the engine (replay reads the
 * checkpoint's weights through it). */
const engine_mat *engine_weight(const engine *e, tensor_kind kind, uint32_t layer, uint32_t expert,
                                moesim_precision p);

/* Row r of a stored fp32 or bf16 matrix widened to fp32 (what the quantizer reads). out: [cols] */
void engine_mat_row_f32(const engine_mat *m, uint32_t r, float *out);

#endif
