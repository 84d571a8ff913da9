/* cuBLAS loaded on first use (kernels/cuda/cublas_lazy.h). Runs without a GPU: loading the
 * library and resolving its entry points needs only the toolkit's libcublas (installed wherever
 * the CUDA build is), not a device. Built only with CUDA. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cublas_lazy.h"
#include "support/test_support.h"

TestSuite(cublas_lazy);

Test(cublas_lazy, the_process_table_resolves_every_entry_point_from_the_toolkits_cublas) {
    const cublas_lazy_api *api = NULL, *again = NULL;
    moesim_error err = {0};
    cr_assert_eq(cublas_lazy_api_get(&api, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_not_null(api->dl);
    cr_assert_not_null(api->create);
    cr_assert_not_null(api->destroy);
    cr_assert_not_null(api->set_stream);
    cr_assert_not_null(api->gemm_ex);
    cr_assert_not_null(api->status_string);
    /* status strings need no device: the resolved function is the library's */
    const char *ok = api->status_string(CUBLAS_STATUS_SUCCESS);
    const char *oom = api->status_string(CUBLAS_STATUS_ALLOC_FAILED);
    cr_assert(ok && oom && ok[0] && oom[0] && strcmp(ok, oom), "'%s' vs '%s'", ok, oom);
    cr_assert_str_eq(cublas_lazy_status_string(CUBLAS_STATUS_ALLOC_FAILED), oom);
    cr_assert_eq(cublas_lazy_api_get(&again, &err), MOESIM_OK);
    cr_assert_eq(again, api, "the library is loaded once per process");
}

typedef struct bad_library {
    const char *soname;
    const char *reason; /* what dlerror() says, in part */
} bad_library;

static const bad_library bad_libraries[] = {
    {.soname = "libcublas_missing.so.99", .reason = "cannot open shared object file"},
    {.soname = "libm.so.6", .reason = "cublasCreate_v2"}, /* loads, but is not cuBLAS */
};

Test(cublas_lazy, a_library_that_cannot_serve_gives_one_line_naming_it_and_dlerrors_reason) {
    for (size_t i = 0; i < sizeof bad_libraries / sizeof bad_libraries[0]; i++) {
        const bad_library *c = &bad_libraries[i];
        cublas_lazy_api api;
        moesim_error err = {0};
        cr_assert_eq(cublas_lazy_api_init(&api, c->soname, &err), MOESIM_EIO, "%s", c->soname);
        cr_assert(!strncmp(err.msg, "cannot load cuBLAS from ", 24), "%s", err.msg);
        cr_assert(strstr(err.msg, c->soname), "%s: %s", c->soname, err.msg);
        cr_assert(strstr(err.msg, c->reason), "%s: %s", c->soname, err.msg);
        cr_assert_null(strchr(err.msg, '\n'), "%s", err.msg);
        cr_assert(!api.dl && !api.create && !api.status_string, "%s: table left set", c->soname);
    }
}

Test(cublas_lazy, the_moesim_binary_does_not_load_cublas_at_startup) {
    /* the dynamic loader lists the libraries it maps and exits before main (what ldd does) */
    cr_assert_eq(setenv("LD_TRACE_LOADED_OBJECTS", "1", 1), 0);
    static char out[16384];
    cr_assert_eq(test_run_moesim(out, sizeof out, NULL, 0, "--help", NULL), 0);
    /* the CUDA runtime is linked statically (no run-time CUDA dependency): libc proves the list */
    cr_assert(strstr(out, "libc.so"), "no library list from the loader: %s", out);
    cr_assert_null(strstr(out, "libcublas"), "moesim maps cuBLAS at startup:\n%s", out);
}
