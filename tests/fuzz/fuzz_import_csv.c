/* libFuzzer harness for `moesim trace import --format csv` (traces/import.c, traces/text_scan.c):
 * see import_harness.h. Build and run: make fuzz (see tests/fuzz/README.md). */
#define FUZZ_IMPORT_FORMAT TRACE_TEXT_CSV
#include "import_harness.h"
