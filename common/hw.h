/* A hardware profile: GPU, host link, DRAM and SSD figures from configs/hw/<name>.ini, each
 * citing its source (docs/CALIBRATION.md). Units are in the names. */
#ifndef MOESIM_COMMON_HW_H
#define MOESIM_COMMON_HW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct hw_profile {
    char name[64]; /* config stem, e.g. "rtx3090-pcie3" */
    char gpu[64];  /* marketing name, e.g. "NVIDIA GeForce RTX 3090" */

    uint64_t hbm_bytes;             /* device memory */
    double hbm_bytes_per_s;         /* peak device memory bandwidth */
    double bf16_flops_per_s;        /* dense tensor-core peak, fp32 accumulate */
    double int8_ops_per_s;          /* dense tensor-core peak for int8 */
    double hbm_efficiency;          /* achievable share of peak bandwidth (roofline) */
    double compute_efficiency;      /* achievable share of peak FLOPs (roofline) */
    uint64_t kernel_launch_ns;      /* per kernel launch overhead */
    uint64_t op_issue_ns;           /* host bookkeeping the stream waits for, per op */
    double op_slowdown_beside_copy; /* an op started while the host link copies takes
                                       (1 + this) times as long */

    double h2d_bytes_per_s;  /* pinned host -> device */
    double d2h_bytes_per_s;  /* device -> pinned host */
    uint64_t h2d_latency_ns; /* per transfer */
    uint64_t d2h_latency_ns;
    uint32_t copy_engines;              /* per direction count is what matters: see hw ini */
    bool h2d_latency_per_chunk;         /* every chunk pays h2d_latency_ns, not each transfer */
    double h2d_slowdown_beside_compute; /* host->device copying runs (1 + this) times as long
                                           while the compute stream runs an op */

    uint64_t dram_bytes; /* host memory available for expert storage */
    double dram_bytes_per_s;
    double ssd_read_bytes_per_s;
    uint64_t ssd_latency_ns;
    bool gpu_direct_storage; /* false: SSD reads bounce through DRAM */
} hw_profile;

typedef struct config config;

/* Loads and validates a hardware file (every key checked; see configs/hw/README.md). The file
 * holds GiB, GB/s, TFLOPS and microseconds; the struct holds bytes, bytes/s, flops/s and ns. */
moesim_status hw_load(const char *path, hw_profile *out, moesim_error *err);
/* Same, then applies `sets` ("section.key=value", the --set option) before validating. */
moesim_status hw_load_with_sets(const char *path, const char *const *sets, size_t n_sets,
                                hw_profile *out, moesim_error *err);
/* Reads and validates the hardware sections of an already loaded config; marks them used and
 * leaves config_check_unused to the caller. */
moesim_status hw_read_config(config *c, hw_profile *out, moesim_error *err);
moesim_status hw_load_by_name(const char *name, hw_profile *out, moesim_error *err);

#endif
