/* Include once in a tests/test_gpu_*.c file: its main() exits 77 (CTest: skipped) before any
 * test runs when no CUDA device is present, and runs the Criterion tests otherwise. */
#ifndef MOESIM_TESTS_GPU_TEST_H
#define MOESIM_TESTS_GPU_TEST_H

#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels/cuda/gpu_probe.h"

int main(int argc, char *argv[]) {
    if (gpu_probe_device_count() < 1) {
        fprintf(stderr, "no CUDA device: gpu tests skipped\n");
        return 77;
    }
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    if (criterion_handle_args(argc, argv, true)) result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}

#endif
