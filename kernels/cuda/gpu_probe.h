/* Is there a usable CUDA device? GPU tests call this first and report themselves skipped
 * (exit 77) when there is none, so `make test` stays green on machines without a GPU. */
#ifndef MOESIM_KERNELS_CUDA_GPU_PROBE_H
#define MOESIM_KERNELS_CUDA_GPU_PROBE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices the runtime can use (0 when no driver or device is present). */
int gpu_probe_device_count(void);
/* Name and memory of device 0 into `name`; returns 0 on success, -1 without a device. */
int gpu_probe_describe(char *name, size_t name_len, size_t *total_bytes);

#ifdef __cplusplus
}
#endif

#endif
