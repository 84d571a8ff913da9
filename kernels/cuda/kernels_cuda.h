/* CUDA versions of the ops in kernels/kernels.h: same arguments and conventions (fp32
 * activations, row-major weights [rows][cols], quant.h block formats) plus the stream they are
 * queued on, and a few batched variants the references express as loops. Every pointer is a
 * device pointer unless its comment says otherwise; every launcher checks cudaGetLastError()
 * and aborts with file:line on a launch failure (a bug, not bad input). Launches are
 * asynchronous: results are ready when the stream says so.
 *
 * Callable from C (tests, benchmarks) and C++ (kernels/cuda/engine_cuda.cu). */
#ifndef MOESIM_KERNELS_CUDA_KERNELS_CUDA_H
#define MOESIM_KERNELS_CUDA_KERNELS_CUDA_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "common/precision.h"
#include "kernels/cuda/cublas_lazy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x / sqrt(mean(x^2) + eps) * w        x, y, w: [n] (y may alias x) */
void kern_rmsnorm_cuda(float *y, const float *x, const float *w, size_t n, float eps,
                       cudaStream_t s);
/* The same over n_rows independent rows sharing w (Qwen3's per-head QK-norm).
 * x, y: [n_rows][n], w: [n] */
void kern_rmsnorm_rows_cuda(float *y, const float *x, const float *w, size_t n_rows, size_t n,
                            float eps, cudaStream_t s);

/* y = W x. y: [rows], W: [rows][cols], x: [cols]. quant: p = PREC_INT8 / INT4 / INT2 and
 * cols % QUANT_GROUP == 0. One warp per output row; fp32 accumulation. */
void kern_matvec_f32_cuda(float *y, const float *w, const float *x, size_t rows, size_t cols,
                          cudaStream_t s);
void kern_matvec_bf16_cuda(float *y, const uint16_t *w, const float *x, size_t rows, size_t cols,
                           cudaStream_t s);
void kern_matvec_quant_cuda(float *y, moesim_precision p, const void *w, const float *x,
                            size_t rows, size_t cols, cudaStream_t s);

/* Small-batch products reading W once for every vector: Y[b] = W X[b] for b < n_batch.
 * Y: [n_batch][rows], X: [n_batch][cols]. Meant for n_batch up to ~16 (decode batches, short
 * prefills); larger batches are better served by cuBLAS (bf16) below. */
void kern_gemm_bf16_cuda(float *y, const uint16_t *w, const float *x, size_t rows, size_t cols,
                         size_t n_batch, cudaStream_t s);
void kern_gemm_quant_cuda(float *y, moesim_precision p, const void *w, const float *x, size_t rows,
                          size_t cols, size_t n_batch, cudaStream_t s);

/* Dense bf16 GEMM on cuBLAS (cublasGemmEx, fp32 compute and output): Y = X W^T with X rounded to
 * bf16 first (cuBLAS multiplies bf16 by bf16). Y: [n_batch][rows], W: [rows][cols],
 * X: [n_batch][cols], x_bf16: [n_batch][cols] scratch. The handle must be bound to stream s
 * (cublas_lazy_handle_init does) by the caller. Aborts with file:line on a cuBLAS error. */
void kern_gemm_bf16_cublas(const cublas_lazy_handle *b, float *y, const uint16_t *w, const float *x,
                           uint16_t *x_bf16, size_t rows, size_t cols, size_t n_batch,
                           cudaStream_t s);

/* Rotary embedding ("rotate half") in place on x: [n_heads][head_dim] at position pos. */
void kern_rope_cuda(float *x, size_t n_heads, size_t head_dim, uint32_t pos, double theta,
                    cudaStream_t s);

/* In-place softmax of x: [n]. */
void kern_softmax_cuda(float *x, size_t n, cudaStream_t s);

/* h = silu(gate) * up        h, gate, up: [n] (h may alias gate) */
void kern_swiglu_cuda(float *h, const float *gate, const float *up, size_t n, cudaStream_t s);

/* One query over a KV cache (decode), as kern_attention_cpu: q: [n_heads][head_dim];
 * k, v: [n_ctx][n_kv_heads][head_dim]; out: [n_heads][head_dim]; probs: [n_heads][n_ctx]. */
void kern_attention_cuda(float *out, float *probs, const float *q, const float *k, const float *v,
                         size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t n_ctx,
                         cudaStream_t s);
/* n_q causal queries at positions n_ctx - n_q .. n_ctx - 1 over a KV cache of n_ctx positions
 * that already holds their keys and values (prefill): query i sees positions [0, n_ctx - n_q + i].
 * q, out: [n_q][n_heads][head_dim]; k, v: [n_ctx][n_kv_heads][head_dim];
 * probs: [n_q][n_heads][n_ctx] (entries past a query's horizon are written 0). */
void kern_attention_prefill_cuda(float *out, float *probs, const float *q, const float *k,
                                 const float *v, size_t n_q, size_t n_heads, size_t n_kv_heads,
                                 size_t head_dim, size_t n_ctx, cudaStream_t s);

/* The k largest of x: [n], descending, ties lower index first. ids, vals: [k]; k <= n <= 4096. */
void kern_topk_cuda(const float *x, size_t n, size_t k, uint32_t *ids, float *vals, cudaStream_t s);
/* The router's step in one launch: probs = softmax(logits) and its top k.
 * logits, probs: [n] (may alias); ids, vals: [k]; k <= n <= 4096. */
void kern_router_topk_cuda(float *probs, const float *logits, size_t n, size_t k, uint32_t *ids,
                           float *vals, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
