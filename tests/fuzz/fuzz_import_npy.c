/* libFuzzer harness for `moesim trace import --format npy` (traces/import_npy.c: the .npy reader,
 * ids with weights, router logits, or ids alone): see import_harness.h. Build and run: make fuzz
 * (tests/fuzz/README.md). */
#define FUZZ_IMPORT_FORMAT TRACE_TEXT_NPY
#include "import_harness.h"
