/* Every model op of the engine, as a plain C reference (kern_<op>_cpu, kernels/cpu/) whose
 * signature the CUDA version (kern_<op>_cuda(..., cudaStream_t), kernels/cuda/) will share.
 *
 * Conventions: activations are fp32; a weight matrix W of rows x cols is row-major, row r holding
 * the weights that produce output r (PyTorch's nn.Linear layout: [out_features][in_features]);
 * matvec computes y[r] = sum_c W[r][c] * x[c] over the given rows only, so callers may split rows
 * between threads and results do not depend on the split (each output is one fixed-order sum).
 * Shapes are given in the comments as [dim]...; sizes are element counts. */
#ifndef MOESIM_KERNELS_KERNELS_H
#define MOESIM_KERNELS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "common/precision.h"

/* y = x / sqrt(mean(x^2) + eps) * w          x, y, w: [n] (y may alias x) */
void kern_rmsnorm_cpu(float *y, const float *x, const float *w, size_t n, float eps);

/* y = W x for W in fp32, bf16 or a quant.h block format (p = INT8/INT4/INT2).
 * y: [rows], W: [rows][cols], x: [cols] */
void kern_matvec_f32_cpu(float *y, const float *w, const float *x, size_t rows, size_t cols);
void kern_matvec_bf16_cpu(float *y, const uint16_t *w, const float *x, size_t rows, size_t cols);
void kern_matvec_quant_cpu(float *y, moesim_precision p, const void *w, const float *x, size_t rows,
                           size_t cols);

/* Rotary embedding, "rotate half" (GPT-NeoX / Hugging Face Llama) form, in place on
 * x: [n_heads][head_dim] at position pos; inv_freq[i] = theta^(-2i/head_dim). */
void kern_rope_cpu(float *x, size_t n_heads, size_t head_dim, uint32_t pos, double theta);

/* In-place numerically stable softmax of x: [n]. */
void kern_softmax_cpu(float *x, size_t n);

/* h = silu(gate) * up        h, gate, up: [n] (h may alias gate) */
void kern_swiglu_cpu(float *h, const float *gate, const float *up, size_t n);

/* One query over a KV cache, grouped-query attention with causal order implied by n_ctx:
 * q: [n_heads][head_dim]; k, v: [n_ctx][n_kv_heads][head_dim]; out: [n_heads][head_dim];
 * probs: [n_heads][n_ctx] receives the attention probabilities (scratch and output).
 * Head h reads KV head h / (n_heads / n_kv_heads); scores are scaled by 1/sqrt(head_dim). */
void kern_attention_cpu(float *out, float *probs, const float *q, const float *k, const float *v,
                        size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t n_ctx);

/* The k largest of x: [n], in descending order (ties: lower index first).
 * ids, vals: [k]; k <= n. */
void kern_topk_cpu(const float *x, size_t n, size_t k, uint32_t *ids, float *vals);

#endif
