/* libFuzzer harness for the experiment-file loader (sweep/sweep_experiment.c): any byte string is
 * an experiment file; sweep_experiment_load must either return one error line, or an experiment
 * whose every configuration is found by its own hash and whose resolved copy
 * (sweep_experiment_write_resolved) loads back to the same configurations and hashes, as
 * sweep.h promises. No crash, leak, hang or out-of-bounds read.
 * Build and run: make fuzz (see tests/fuzz/README.md). */
#include <stdlib.h>

#include "fuzz_support.h"
#include "sweep/sweep.h"

static void check_resolved_copy(const sweep_experiment *e) {
    moesim_error err = {0};
    /* a real file: the writer renames a temporary into place */
    const char *resolved_path = fuzz_temp_path("resolved.ini");
    MOESIM_ASSERT(sweep_experiment_write_resolved(e, "fuzz", resolved_path, &err) == MOESIM_OK);
    sweep_experiment *back = NULL;
    moesim_status st = sweep_experiment_load(resolved_path, &back, &err);
    if (st) fprintf(stderr, "resolved copy does not load: %s\n", err.msg);
    MOESIM_ASSERT(st == MOESIM_OK);
    size_t n = sweep_experiment_count(e);
    MOESIM_ASSERT(sweep_experiment_count(back) == n);
    for (size_t i = 0; i < n; i++)
        MOESIM_ASSERT(sweep_experiment_point(back, i)->hash == sweep_experiment_point(e, i)->hash);
    sweep_experiment_destroy(back);
    remove(resolved_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file_of(data, size);
    sweep_experiment *e = NULL;
    moesim_error err = {0};
    moesim_status st = sweep_experiment_load(path, &e, &err);
    fuzz_check_error(st, &err);
    MOESIM_ASSERT((st == MOESIM_OK) == (e != NULL));
    if (e) {
        size_t n = sweep_experiment_count(e);
        MOESIM_ASSERT(n >= 1 && n <= sweep_experiment_cross_size(e));
        for (size_t i = 0; i < n; i++) {
            const sweep_point *p = sweep_experiment_point(e, i);
            MOESIM_ASSERT(sweep_experiment_find(e, p->hash) == p);
        }
        check_resolved_copy(e);
    }
    sweep_experiment_destroy(e);
    return 0;
}
