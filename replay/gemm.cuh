/* The matrix products of the replay, shared by the run (run.cu) and the calibration
 * (calibrate.cu) so the measured cost table times exactly the kernels a replay launches:
 * Y[n][rows] = W X[n][cols] for a bf16 or quantized (kernels/quant.h blocks) matrix W.
 * bf16 batches above GEMM_SMALL go to cuBLAS; the others to kern_gemm_*_cuda, GEMM_SMALL
 * vectors per launch. Also the combine of the routed experts' outputs, which the simulator costs
 * as its `combine` op. */
#ifndef MOESIM_REPLAY_GEMM_CUH
#define MOESIM_REPLAY_GEMM_CUH

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels_cuda.h"

#define GEMM_SMALL 16 /* kern_gemm_*_cuda serve up to this many vectors per launch */

/* x_bf16: [n][cols] scratch for cuBLAS; the handle is bound to `s`. */
static inline void replay_gemm(const cublas_lazy_handle *b, uint16_t *x_bf16, cudaStream_t s,
                               float *y, moesim_precision p, const void *w, const float *x,
                               size_t rows, size_t cols, size_t n) {
    if (p == PREC_BF16 && n > GEMM_SMALL) {
        kern_gemm_bf16_cublas(b, y, (const uint16_t *)w, x, x_bf16, rows, cols, n, s);
        return;
    }
    for (size_t i = 0; i < n; i += GEMM_SMALL) {
        size_t b = n - i < GEMM_SMALL ? n - i : GEMM_SMALL;
        if (p == PREC_BF16)
            kern_gemm_bf16_cuda(y + i * rows, (const uint16_t *)w, x + i * cols, rows, cols, b, s);
        else
            kern_gemm_quant_cuda(y + i * rows, p, w, x + i * cols, rows, cols, b, s);
    }
}

/* The MoE combine: out[t][h] = sum_j gates[t][j] * ys[t][j][h] over the top_k expert outputs of
 * each token (bf16, as they leave the experts). One thread per (token, h).
 * out: [n][H], ys: [n][k][H], gates: [n][k] */
static __global__ void replay_combine_kernel(float *out, const __nv_bfloat16 *ys,
                                             const float *gates, size_t n, size_t k, size_t H) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * H) return;
    size_t t = i / H, h = i % H;
    float acc = 0;
    for (size_t j = 0; j < k; j++)
        acc += gates[t * k + j] * __bfloat162float(ys[(t * k + j) * H + h]);
    out[i] = acc;
}

static inline void replay_combine(float *out, const uint16_t *ys, const float *gates, size_t n,
                                  size_t k, size_t H, cudaStream_t s) {
    size_t total = n * H;
    unsigned blocks = (unsigned)((total + 255) / 256);
    replay_combine_kernel<<<blocks, 256, 0, s>>>(out, (const __nv_bfloat16 *)ys, gates, n, k, H);
    CUDA_LAUNCH_CHECK();
}

#endif
