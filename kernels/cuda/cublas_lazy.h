/* cuBLAS, loaded when a GPU path first needs it instead of when the process starts.
 *
 * Linking libcublas makes the loader map libcublasLt too, whose static initializers cost every
 * run of the binary ~100 ms and ~200 MB of resident memory, `moesim --help` and CPU-only
 * simulations included. So nothing links it: the few entry points moesim calls are resolved with
 * dlopen/dlsym into a table (cublas_lazy_api) the first time a cuBLAS handle is made. The cuBLAS
 * headers still provide the types and enums.
 *
 * The library is looked up by the soname of the toolkit moesim was built with
 * (MOESIM_CUBLAS_SONAME, e.g. "libcublas.so.13", through the dynamic loader's search path:
 * LD_LIBRARY_PATH, ldconfig), then at that toolkit's library directory (MOESIM_CUBLAS_PATH), then
 * as "libcublas.so". A library that cannot be loaded is reported as one line naming it and
 * dlerror()'s reason.
 *
 * Callable from C (tests, benchmarks) and C++ (kernels/cuda, replay). */
#ifndef MOESIM_KERNELS_CUDA_CUBLAS_LAZY_H
#define MOESIM_KERNELS_CUDA_CUBLAS_LAZY_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common/status.h" /* a C header without its own extern "C" */

/* The prototypes of cublas_api.h for the entry points moesim calls (cublas_lazy.c checks at
 * compile time that they still match). */
typedef cublasStatus_t (*cublas_lazy_create_fn)(cublasHandle_t *handle);
typedef cublasStatus_t (*cublas_lazy_destroy_fn)(cublasHandle_t handle);
typedef cublasStatus_t (*cublas_lazy_set_stream_fn)(cublasHandle_t handle, cudaStream_t stream);
typedef cublasStatus_t (*cublas_lazy_gemm_ex_fn)(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *a, cudaDataType a_type, int lda, const void *b,
    cudaDataType b_type, int ldb, const void *beta, void *c, cudaDataType c_type, int ldc,
    cublasComputeType_t compute_type, cublasGemmAlgo_t algo);
typedef const char *(*cublas_lazy_status_string_fn)(cublasStatus_t status);

/* The entry points, resolved from one loaded library. Every pointer is non-NULL in a table that
 * was initialized. */
typedef struct cublas_lazy_api {
    void *dl;                                   /* dlopen handle of the library */
    cublas_lazy_create_fn create;               /* cublasCreate_v2 */
    cublas_lazy_destroy_fn destroy;             /* cublasDestroy_v2 */
    cublas_lazy_set_stream_fn set_stream;       /* cublasSetStream_v2 */
    cublas_lazy_gemm_ex_fn gemm_ex;             /* cublasGemmEx */
    cublas_lazy_status_string_fn status_string; /* cublasGetStatusString */
} cublas_lazy_api;

/* Loads the library `soname` (a name for the loader's search path, or a path) and resolves every
 * entry point into the caller's `api`. On failure fills `err` with one line naming the library
 * (and the missing function, if any) and dlerror()'s reason, leaves nothing loaded and returns
 * MOESIM_EIO. Release with cublas_lazy_api_free. Most callers want cublas_lazy_api_get. */
moesim_status cublas_lazy_api_init(cublas_lazy_api *api, const char *soname, moesim_error *err);
/* Unloads the library of an initialized table and zeroes it; accepts a zeroed table. */
void cublas_lazy_api_free(cublas_lazy_api *api);

/* The process's cuBLAS table, loaded on the first call (thread-safe) from the build's soname and
 * its fallbacks; it stays loaded until the process exits and the caller only borrows it. Every
 * call after a failed load fails the same way, with the same message in `err`. */
moesim_status cublas_lazy_api_get(const cublas_lazy_api **out, moesim_error *err);

/* cublasGetStatusString through the process's table, for messages about a failed cuBLAS call
 * (which means the table is loaded); a fixed text if it is not. */
const char *cublas_lazy_status_string(cublasStatus_t status);

/* A cuBLAS handle with the table its calls go through. */
typedef struct cublas_lazy_handle {
    const cublas_lazy_api *api; /* borrowed: cublas_lazy_api_get's table */
    cublasHandle_t h;
} cublas_lazy_handle;

/* Loads cuBLAS if needed, creates a handle and binds it to `stream`: the one step a GPU path
 * takes before its first cuBLAS call. On failure (library missing, cublasCreate or
 * cublasSetStream failing) fills `err` with one line, leaves `b` zeroed and returns a status
 * (MOESIM_ENOMEM when cuBLAS could not allocate, else MOESIM_EIO). Release with
 * cublas_lazy_handle_free. */
moesim_status cublas_lazy_handle_init(cublas_lazy_handle *b, cudaStream_t stream,
                                      moesim_error *err);
/* Destroys the handle and zeroes `b`; accepts a zeroed handle. */
void cublas_lazy_handle_free(cublas_lazy_handle *b);

#ifdef __cplusplus
}
#endif

#endif
