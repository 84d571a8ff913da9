// Device discovery for GPU tests and `moesim` diagnostics; see gpu_probe.h.
#include "kernels/cuda/gpu_probe.h"

#include <cuda_runtime.h>
#include <stdio.h>

extern "C" int gpu_probe_device_count(void) {
    int n = 0;
    // no driver or no device is an answer (0), not an error
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int gpu_probe_describe(char *name, size_t name_len, size_t *total_bytes) {
    if (gpu_probe_device_count() < 1) return -1;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return -1;
    snprintf(name, name_len, "%s", prop.name);
    *total_bytes = prop.totalGlobalMem;
    return 0;
}
