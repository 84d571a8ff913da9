/* libFuzzer harness for the trace reader (traces/trace_read.c, traces/h5_chunks.c): any byte
 * string is a trace file; trace_read must either return a trace that passes trace_check, or one
 * error line. The seeds are small traces written by `moesim trace synth`, so mutations reach the
 * attributes, dataset headers and deflated chunks of real files. No crash, leak, hang or
 * out-of-bounds read in our code (libhdf5 itself is not instrumented: its bugs show up only
 * when they crash). Build and run: make fuzz (see tests/fuzz/README.md). */
#include "fuzz_support.h"
#include "traces/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file_of(data, size);
    trace *t = NULL;
    moesim_error err = {0};
    long long ids = fuzz_h5_open_ids();
    moesim_status st = trace_read(path, &t, &err);
    /* (from the second read on: the first one registers libhdf5's own types) */
    static bool warm;
    if (warm && fuzz_h5_open_ids() != ids)
        fprintf(stderr, "trace_read left %lld HDF5 ids open\n", fuzz_h5_open_ids() - ids);
    MOESIM_ASSERT(!warm || fuzz_h5_open_ids() == ids);
    warm = true;
    fuzz_check_error(st, &err);
    MOESIM_ASSERT((st == MOESIM_OK) == (t != NULL));
    if (t) MOESIM_ASSERT(trace_check(t, "fuzz trace", &err) == MOESIM_OK);
    trace_destroy(t);
    return 0;
}
