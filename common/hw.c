/* Hardware profile files (configs/hw/<name>.ini): loading, unit conversion and validation.
 *
 * Units: the files hold what datasheets print (memory sizes in GiB, bandwidths in GB/s = 1e9
 * bytes/s, compute in TFLOPS / TOPS = 1e12 per second, latencies in microseconds); hw_profile
 * holds bytes, bytes/s, flops/s and nanoseconds. Conversion happens once, here. Invariants after
 * a successful load: every figure positive (latencies may be 0), efficiencies in (0, 1], and the
 * host link no faster than device memory in either direction. */
#include "common/hw.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/paths.h"

#define GIB       1073741824.0
#define GB_PER_S  1e9
#define TERA      1e12
#define NS_PER_US 1000.0

/* What the file holds, in the file's units. */
typedef struct hw_file {
    char name[64], gpu[64];
    double hbm_gib, hbm_gb_per_s, bf16_tflops, int8_tops, hbm_efficiency, compute_efficiency;
    double kernel_launch_us, op_issue_us, slowdown_beside_copy;
    double h2d_gb_per_s, d2h_gb_per_s, h2d_latency_us, d2h_latency_us;
    uint32_t copy_engines;
    bool latency_per_chunk;
    double slowdown_beside_compute;
    double dram_gib, dram_gb_per_s;
    double ssd_read_gb_per_s, ssd_latency_us;
    bool gpu_direct_storage;
} hw_file;

/* clang-format off */
#define F(sec, key, type, member, lo, hi, help)                                                   \
    {sec, key, type, offsetof(hw_file, member), sizeof(((hw_file *)0)->member), true, lo, hi,    \
     NULL, NULL, help}
/* clang-format on */

static const config_field hw_fields[] = {
    F("profile", "name", CONFIG_STR, name, 1, 0, "config name, e.g. rtx3090-pcie3"),
    F("gpu", "name", CONFIG_STR, gpu, 1, 0, "marketing name of the GPU"),
    F("gpu", "hbm_gib", CONFIG_F64, hbm_gib, 0.25, 4096, "device memory, GiB"),
    F("gpu", "hbm_gb_per_s", CONFIG_F64, hbm_gb_per_s, 1, 100000, "peak device memory GB/s"),
    /* from 0.001: the CPU kind (configs/hw/cpu-host.ini) computes at tens of GFLOPS */
    F("gpu", "bf16_tflops", CONFIG_F64, bf16_tflops, 0.001, 100000,
      "dense bf16 tensor TFLOPS, fp32 accumulate"),
    F("gpu", "int8_tops", CONFIG_F64, int8_tops, 0.001, 100000, "dense int8 tensor TOPS"),
    F("gpu", "hbm_efficiency", CONFIG_F64, hbm_efficiency, 0.01, 1,
      "achievable share of peak memory bandwidth"),
    F("gpu", "compute_efficiency", CONFIG_F64, compute_efficiency, 0.01, 1,
      "achievable share of peak FLOPs"),
    F("gpu", "kernel_launch_us", CONFIG_F64, kernel_launch_us, 0, 1000, "per kernel launch, us"),
    /* optional: what an engine's host does around each op beyond launching it (timing events,
     * bookkeeping); `moesim calibrate` measures the replay's */
    {"gpu", "op_issue_us", CONFIG_F64, offsetof(hw_file, op_issue_us),
     sizeof(((hw_file *)0)->op_issue_us), false, 0, 1000, NULL, "0",
     "host time per op beyond its launches, us (default 0)"},
    /* optional: what the link and the compute cost each other when they share a machine (the
     * CPU kind: disk reads and kernels on two cores and one memory); `moesim calibrate --backend
     * cpu` measures both */
    {"gpu", "slowdown_beside_copy", CONFIG_F64, offsetof(hw_file, slowdown_beside_copy),
     sizeof(((hw_file *)0)->slowdown_beside_copy), false, 0, 4, NULL, "0",
     "extra time of an op that starts while the host link copies, as a fraction (default 0)"},
    F("pcie", "h2d_gb_per_s", CONFIG_F64, h2d_gb_per_s, 0.1, 1000, "pinned host->device GB/s"),
    F("pcie", "d2h_gb_per_s", CONFIG_F64, d2h_gb_per_s, 0.1, 1000, "device->pinned host GB/s"),
    F("pcie", "h2d_latency_us", CONFIG_F64, h2d_latency_us, 0, 10000, "per transfer, us"),
    F("pcie", "d2h_latency_us", CONFIG_F64, d2h_latency_us, 0, 10000, "per transfer, us"),
    F("pcie", "copy_engines", CONFIG_U32, copy_engines, 1, 16, "DMA copy engines"),
    F("pcie", "latency_per_chunk", CONFIG_BOOL, latency_per_chunk, 1, 0,
      "true: every copy chunk pays h2d_latency_us (one request each, none overlapped)"),
    {"pcie", "slowdown_beside_compute", CONFIG_F64, offsetof(hw_file, slowdown_beside_compute),
     sizeof(((hw_file *)0)->slowdown_beside_compute), false, 0, 4, NULL, "0",
     "extra time of host->device copying while the compute stream runs, as a fraction (default "
     "0)"},
    F("host", "dram_gib", CONFIG_F64, dram_gib, 0.25, 65536, "host memory for experts, GiB"),
    F("host", "dram_gb_per_s", CONFIG_F64, dram_gb_per_s, 1, 100000, "host memory GB/s"),
    F("ssd", "read_gb_per_s", CONFIG_F64, ssd_read_gb_per_s, 0.01, 1000, "sequential read GB/s"),
    F("ssd", "latency_us", CONFIG_F64, ssd_latency_us, 0, 1e6, "per read, us"),
    F("ssd", "gpu_direct_storage", CONFIG_BOOL, gpu_direct_storage, 1, 0,
      "true: SSD -> GPU without a DRAM bounce"),
};

static moesim_status key_error(config *c, moesim_error *err, const char *section, const char *key,
                               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static moesim_status key_error(config *c, moesim_error *err, const char *section, const char *key,
                               const char *fmt, ...) {
    char where[600], what[400];
    config_origin(c, section, key, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return moesim_fail(err, MOESIM_EINPUT, "%s: [%s] %s: %s", where, section, key, what);
}

static uint64_t to_u64(double v) { return (uint64_t)llround(v); }

moesim_status hw_read_config(config *c, hw_profile *out, moesim_error *err) {
    hw_file f;
    memset(&f, 0, sizeof f);
    moesim_status st = config_read_fields(c, hw_fields, MOESIM_ARRAY_LEN(hw_fields), &f, err);
    if (st) return st;
    if (f.h2d_gb_per_s > f.hbm_gb_per_s)
        return key_error(c, err, "pcie", "h2d_gb_per_s",
                         "expected at most hbm_gb_per_s (%g), got %g", f.hbm_gb_per_s,
                         f.h2d_gb_per_s);
    if (f.d2h_gb_per_s > f.hbm_gb_per_s)
        return key_error(c, err, "pcie", "d2h_gb_per_s",
                         "expected at most hbm_gb_per_s (%g), got %g", f.hbm_gb_per_s,
                         f.d2h_gb_per_s);

    hw_profile h;
    memset(&h, 0, sizeof h);
    memcpy(h.name, f.name, sizeof h.name);
    memcpy(h.gpu, f.gpu, sizeof h.gpu);
    h.hbm_bytes = to_u64(f.hbm_gib * GIB);
    h.hbm_bytes_per_s = f.hbm_gb_per_s * GB_PER_S;
    h.bf16_flops_per_s = f.bf16_tflops * TERA;
    h.int8_ops_per_s = f.int8_tops * TERA;
    h.hbm_efficiency = f.hbm_efficiency;
    h.compute_efficiency = f.compute_efficiency;
    h.kernel_launch_ns = to_u64(f.kernel_launch_us * NS_PER_US);
    h.op_issue_ns = to_u64(f.op_issue_us * NS_PER_US);
    h.op_slowdown_beside_copy = f.slowdown_beside_copy;
    h.h2d_bytes_per_s = f.h2d_gb_per_s * GB_PER_S;
    h.d2h_bytes_per_s = f.d2h_gb_per_s * GB_PER_S;
    h.h2d_latency_ns = to_u64(f.h2d_latency_us * NS_PER_US);
    h.d2h_latency_ns = to_u64(f.d2h_latency_us * NS_PER_US);
    h.copy_engines = f.copy_engines;
    h.h2d_latency_per_chunk = f.latency_per_chunk;
    h.h2d_slowdown_beside_compute = f.slowdown_beside_compute;
    h.dram_bytes = to_u64(f.dram_gib * GIB);
    h.dram_bytes_per_s = f.dram_gb_per_s * GB_PER_S;
    h.ssd_read_bytes_per_s = f.ssd_read_gb_per_s * GB_PER_S;
    h.ssd_latency_ns = to_u64(f.ssd_latency_us * NS_PER_US);
    h.gpu_direct_storage = f.gpu_direct_storage;
    *out = h;
    return MOESIM_OK;
}

moesim_status hw_load_with_sets(const char *path, const char *const *sets, size_t n_sets,
                                hw_profile *out, moesim_error *err) {
    config *c = config_create();
    moesim_status st = config_load_file(c, path, err);
    for (size_t i = 0; !st && i < n_sets; i++) st = config_set(c, sets[i], err);
    if (!st) st = hw_read_config(c, out, err);
    if (!st) st = config_check_unused(c, err);
    config_destroy(c);
    return st;
}

moesim_status hw_load(const char *path, hw_profile *out, moesim_error *err) {
    return hw_load_with_sets(path, NULL, 0, out, err);
}

moesim_status hw_load_by_name(const char *name, hw_profile *out, moesim_error *err) {
    char path[4096];
    moesim_status st = moesim_config_path("hw", name, path, sizeof path, err);
    if (st) return st;
    return hw_load(path, out, err);
}
