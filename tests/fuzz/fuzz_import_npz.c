/* libFuzzer harness for `moesim trace import --format npz` (traces/import_npy.c: the zip reader
 * and the .npy members): see import_harness.h. Build and run: make fuzz (tests/fuzz/README.md). */
#define FUZZ_IMPORT_FORMAT TRACE_TEXT_NPZ
#include "import_harness.h"
