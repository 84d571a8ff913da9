/* Check macros for CUDA runtime and cuBLAS calls in kernels/cuda (C++ only). A failing call there
 * is a library failure we cannot recover from in the middle of a forward pass: it is reported as
 * "file:line: call: error name (message)" on stderr and the process aborts (STYLE habit 7).
 * Calls whose failure is the user's to fix (allocating a pool too large for the GPU) return a
 * status instead; see engine_cuda.cu. */
#ifndef MOESIM_KERNELS_CUDA_CUDA_CHECK_H
#define MOESIM_KERNELS_CUDA_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cublas_lazy.h"

[[noreturn]] static inline void cuda_check_fail(const char *call, const char *what,
                                                const char *file, int line) {
    fprintf(stderr, "%s:%d: %s: %s\n", file, line, call, what);
    fflush(stderr);
    abort();
}

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t cuda_check_err_ = (call);                                                      \
        if (cuda_check_err_ != cudaSuccess) {                                                      \
            char cuda_check_msg_[256];                                                             \
            snprintf(cuda_check_msg_, sizeof cuda_check_msg_, "%s (%s)",                           \
                     cudaGetErrorName(cuda_check_err_), cudaGetErrorString(cuda_check_err_));      \
            cuda_check_fail(#call, cuda_check_msg_, __FILE__, __LINE__);                           \
        }                                                                                          \
    } while (0)

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t cublas_check_st_ = (call);                                                  \
        if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS) {                                           \
            char cublas_check_msg_[256];                                                           \
            snprintf(cublas_check_msg_, sizeof cublas_check_msg_, "%s (status %d)",                \
                     cublas_lazy_status_string(cublas_check_st_), (int)cublas_check_st_);          \
            cuda_check_fail(#call, cublas_check_msg_, __FILE__, __LINE__);                         \
        }                                                                                          \
    } while (0)

/* After every kernel launch: a bad configuration or a missing kernel image shows up here. */
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* An invariant of the caller's arguments (a bug when it fails, as MOESIM_ASSERT). */
#define CUDA_REQUIRE(expr)                                                                         \
    do {                                                                                           \
        if (!(expr)) cuda_check_fail("requirement", #expr, __FILE__, __LINE__);                    \
    } while (0)

#endif
