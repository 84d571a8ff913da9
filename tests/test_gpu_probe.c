/* GPU presence: skipped (exit 77) without a device; with one, the probe describes it. */
#include <string.h>

#include "support/gpu_test.h"

Test(gpu_probe, device_zero_has_a_name_and_memory) {
    char name[256] = "";
    size_t bytes = 0;
    cr_assert_eq(gpu_probe_describe(name, sizeof name, &bytes), 0);
    cr_assert(strlen(name) > 0);
    cr_assert_gt(bytes, (size_t)1 << 30);
}
