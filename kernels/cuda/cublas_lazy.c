/* cuBLAS loaded on first use (cublas_lazy.h): dlopen of the library, dlsym of the entry points
 * moesim calls, and the handle a GPU path creates before its first product.
 *
 * The process's table is the one piece of process-wide state here, as the loaded library itself
 * is: pthread_once writes it (the table or the load's error) exactly once, and it is only read
 * afterwards. MOESIM_CUBLAS_SONAME and MOESIM_CUBLAS_PATH come from kernels/cuda/CMakeLists.txt
 * (the toolkit's major version and library directory). */
#include "kernels/cuda/cublas_lazy.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/check.h"

/* The typedefs of cublas_lazy.h must stay the prototypes of cublas_api.h: _Generic does not
 * evaluate its operand, so this names the functions without linking them. */
#define CUBLAS_LAZY_SAME_TYPE(fn, type) _Generic(&(fn), type : 1, default : 0)
_Static_assert(CUBLAS_LAZY_SAME_TYPE(cublasCreate_v2, cublas_lazy_create_fn),
               "cublasCreate_v2 changed its prototype");
_Static_assert(CUBLAS_LAZY_SAME_TYPE(cublasDestroy_v2, cublas_lazy_destroy_fn),
               "cublasDestroy_v2 changed its prototype");
_Static_assert(CUBLAS_LAZY_SAME_TYPE(cublasSetStream_v2, cublas_lazy_set_stream_fn),
               "cublasSetStream_v2 changed its prototype");
_Static_assert(CUBLAS_LAZY_SAME_TYPE(cublasGemmEx, cublas_lazy_gemm_ex_fn),
               "cublasGemmEx changed its prototype");
_Static_assert(CUBLAS_LAZY_SAME_TYPE(cublasGetStatusString, cublas_lazy_status_string_fn),
               "cublasGetStatusString changed its prototype");

/* dlsym of `name`; when it is missing, records dlerror()'s reason in `why` (the first one only,
 * `why` starts empty) and returns NULL. */
static void *cublas_lazy_resolve(void *dl, const char *name, char *why, size_t why_size) {
    dlerror(); /* clear a stale error */
    void *sym = dlsym(dl, name);
    if (!sym && !why[0]) {
        const char *e = dlerror();
        snprintf(why, why_size, "%s", e ? e : name);
    }
    return sym;
}

moesim_status cublas_lazy_api_init(cublas_lazy_api *api, const char *soname, moesim_error *err) {
    MOESIM_ASSERT(api && soname);
    memset(api, 0, sizeof *api);
    void *dl = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        return moesim_fail(err, MOESIM_EIO, "cannot load cuBLAS from %s: %s", soname,
                           e ? e : "dlopen failed");
    }
    char why[256] = "";
    cublas_lazy_api a = {.dl = dl};
    a.create = (cublas_lazy_create_fn)cublas_lazy_resolve(dl, "cublasCreate_v2", why, sizeof why);
    a.destroy =
        (cublas_lazy_destroy_fn)cublas_lazy_resolve(dl, "cublasDestroy_v2", why, sizeof why);
    a.set_stream =
        (cublas_lazy_set_stream_fn)cublas_lazy_resolve(dl, "cublasSetStream_v2", why, sizeof why);
    a.gemm_ex = (cublas_lazy_gemm_ex_fn)cublas_lazy_resolve(dl, "cublasGemmEx", why, sizeof why);
    a.status_string = (cublas_lazy_status_string_fn)cublas_lazy_resolve(dl, "cublasGetStatusString",
                                                                        why, sizeof why);
    if (why[0]) {
        dlclose(dl);
        return moesim_fail(err, MOESIM_EIO, "cannot load cuBLAS from %s: %s", soname, why);
    }
    *api = a;
    return MOESIM_OK;
}

void cublas_lazy_api_free(cublas_lazy_api *api) {
    if (!api) return;
    if (api->dl) dlclose(api->dl);
    memset(api, 0, sizeof *api);
}

/* The process's table: written by process_cublas_load under `once`, read-only afterwards. */
static struct {
    pthread_once_t once;
    moesim_status status; /* of the load; MOESIM_OK when `api` is initialized */
    moesim_error err;     /* the load's one-line error when it failed */
    cublas_lazy_api api;
} process_cublas = {.once = PTHREAD_ONCE_INIT};

/* Tries the build's soname, then the toolkit's library directory, then the unversioned name; the
 * error of a failed load names the first and lists the others. */
static void process_cublas_load(void) {
    static const char *const names[] = {MOESIM_CUBLAS_SONAME, MOESIM_CUBLAS_PATH, "libcublas.so"};
    moesim_error first = {0}, e = {0};
    char others[MOESIM_ERROR_MAX] = "";
    size_t others_len = 0;
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(names); i++) {
        bool repeated = false;
        for (size_t j = 0; j < i; j++) repeated |= !strcmp(names[i], names[j]);
        if (repeated) continue;
        if (!cublas_lazy_api_init(&process_cublas.api, names[i], &e)) {
            process_cublas.status = MOESIM_OK;
            return;
        }
        if (!first.msg[0])
            first = e;
        else if (others_len < sizeof others)
            others_len += (size_t)snprintf(others + others_len, sizeof others - others_len, "%s%s",
                                           others_len ? ", " : "", names[i]);
    }
    process_cublas.status =
        others_len
            ? moesim_fail(&process_cublas.err, MOESIM_EIO, "%s (also tried %s)", first.msg, others)
            : moesim_fail(&process_cublas.err, MOESIM_EIO, "%s", first.msg);
}

moesim_status cublas_lazy_api_get(const cublas_lazy_api **out, moesim_error *err) {
    MOESIM_ASSERT(out);
    int rc = pthread_once(&process_cublas.once, process_cublas_load);
    MOESIM_ASSERT(rc == 0);
    if (process_cublas.status) {
        *out = NULL;
        return moesim_fail(err, process_cublas.status, "%s", process_cublas.err.msg);
    }
    *out = &process_cublas.api;
    return MOESIM_OK;
}

const char *cublas_lazy_status_string(cublasStatus_t status) {
    const cublas_lazy_api *api;
    if (cublas_lazy_api_get(&api, NULL)) return "unknown (cuBLAS is not loaded)";
    return api->status_string(status);
}

moesim_status cublas_lazy_handle_init(cublas_lazy_handle *b, cudaStream_t stream,
                                      moesim_error *err) {
    MOESIM_ASSERT(b);
    memset(b, 0, sizeof *b);
    const cublas_lazy_api *api;
    moesim_status st = cublas_lazy_api_get(&api, err);
    if (st) return st;
    cublasHandle_t h = NULL;
    const char *call = "cublasCreate";
    cublasStatus_t cs = api->create(&h);
    if (cs == CUBLAS_STATUS_SUCCESS) {
        call = "cublasSetStream";
        cs = api->set_stream(h, stream);
        if (cs != CUBLAS_STATUS_SUCCESS) api->destroy(h);
    }
    if (cs != CUBLAS_STATUS_SUCCESS)
        return moesim_fail(err, cs == CUBLAS_STATUS_ALLOC_FAILED ? MOESIM_ENOMEM : MOESIM_EIO,
                           "%s: %s (status %d)", call, api->status_string(cs), (int)cs);
    b->api = api;
    b->h = h;
    return MOESIM_OK;
}

void cublas_lazy_handle_free(cublas_lazy_handle *b) {
    if (!b) return;
    if (b->h) b->api->destroy(b->h);
    memset(b, 0, sizeof *b);
}
