/* Writers of `moesim calibrate`: the measured hardware profile (configs/hw/README.md keys, loaded
 * by hw_load) and the measured cost table (sim/COST.md format, loaded by cost_table_load). Each
 * written figure says where it came from: "derived: measured by moesim calibrate" for what was
 * measured, "derived: copied from" the base profile for what calibrate cannot measure (datasheet
 * peaks, DRAM, SSD), so tests/test_hw_config.c accepts the file in configs/hw/. Numbers are
 * printed with %.6g or %.17g: the same measurements give the same bytes. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/atomic_file.h"
#include "common/check.h"
#include "replay/replay.h"

#define GIB 1073741824.0

static double clamp01(double v) { return v < 0.01 ? 0.01 : v > 1 ? 1 : v; }

/* A slowdown beside the other thread (optional keys): measured, else the base's where it has one.
 */
static void write_slowdown(FILE *f, const char *key, bool measured, double value, const char *how,
                           double base_value, const char *base) {
    if (measured)
        fprintf(f, "%s = %.6g ; derived: measured by moesim calibrate (%s)\n", key, value, how);
    else if (base_value > 0)
        fprintf(f, "%s = %.6g ; derived: copied from %s\n", key, base_value, base);
}

moesim_status calib_write_profile(const calib_results *c, const hw_profile *base, const char *name,
                                  const char *path, moesim_error *err) {
    atomic_file af;
    if (atomic_file_open(&af, path, err)) return MOESIM_EIO;
    FILE *f = af.fp;
    const char *b = base->name;
    double hbm_peak = base->hbm_bytes_per_s / 1e9, bf16_peak = base->bf16_flops_per_s / 1e12;
    /* what was measured, in the words of the backend that measured it */
    bool cpu = !strcmp(c->backend, "cpu");
    const char *mem_how = cpu ? "copied from the base (the DRAM arena's size is the run's budget)"
                              : "measured by moesim calibrate (cudaMemGetInfo total)";
    const char *copy_how = cpu ? "memcpy in DRAM" : "device-to-device copy";
    const char *gemm_how = cpu ? "bf16 matvec of the CPU replay" : "best cuBLAS bf16 GEMM";
    const char *launch_how = cpu ? "ops are function calls" : "empty kernels back to back";
    const char *link_how = cpu ? "O_DIRECT reads of the expert file" : "pinned";
    fprintf(f,
            "; %s: measured by `moesim calibrate` on %s (median of %u repetitions per point).\n"
            "; Units: GiB, GB/s (1e9 bytes/s), TFLOPS/TOPS (1e12/s), microseconds.\n"
            "; Figures calibrate cannot measure are copied from profile %s with their source\n"
            "; there (configs/hw/%s.ini).\n\n",
            name, c->gpu, c->repeats, b, b);
    fprintf(f, "[profile]\nname = %s\n\n[gpu]\nname = %s\n", name, c->gpu);
    fprintf(f, "hbm_gib = %.6g ; derived: %s\n",
            cpu ? base->hbm_bytes / GIB : (double)c->hbm_bytes / GIB, mem_how);
    if (!cpu && c->hbm_gb_per_s > hbm_peak) { /* the base is another card (an H200 on h100-sxm) */
        fprintf(f,
                "hbm_gb_per_s = %.6g ; derived: measured by moesim calibrate (%s), above the "
                "%.6g GB/s peak of %s\n",
                c->hbm_gb_per_s, copy_how, hbm_peak, b);
        hbm_peak = c->hbm_gb_per_s;
    } else {
        fprintf(f, "hbm_gb_per_s = %.6g ; derived: copied from %s (peak)\n", hbm_peak, b);
    }
    fprintf(f, "bf16_tflops = %.6g ; derived: copied from %s (peak)\n", bf16_peak, b);
    fprintf(f, "int8_tops = %.6g ; derived: copied from %s (peak)\n", base->int8_ops_per_s / 1e12,
            b);
    fprintf(f,
            "hbm_efficiency = %.6g ; derived: measured by moesim calibrate, %s %.6g GB/s of the "
            "%.6g GB/s peak\n",
            clamp01(c->hbm_gb_per_s / hbm_peak), copy_how, c->hbm_gb_per_s, hbm_peak);
    fprintf(f,
            "compute_efficiency = %.6g ; derived: measured by moesim calibrate, %s %.6g TFLOPS "
            "of the %.6g peak\n",
            clamp01(c->bf16_tflops / bf16_peak), gemm_how, c->bf16_tflops, bf16_peak);
    fprintf(f, "kernel_launch_us = %.6g ; derived: measured by moesim calibrate (%s)\n",
            c->kernel_launch_us, launch_how);
    if (!cpu)
        fprintf(f,
                "op_issue_us = %.6g ; derived: measured by moesim calibrate (two timing events "
                "around each launch, as the replay brackets every op; its cost table times ops "
                "without them)\n",
                c->op_events_us);
    write_slowdown(f, "slowdown_beside_copy", c->contention_measured, c->op_slowdown_beside_copy,
                   "a decode step's ops while the copy thread reads, against alone",
                   base->op_slowdown_beside_copy, b);
    fprintf(f, "\n");
    fprintf(f, "[pcie]\n");
    fprintf(f,
            "h2d_gb_per_s = %.6g ; derived: measured by moesim calibrate (%s, %.6g MiB "
            "transfers)\n",
            c->h2d_peak_gb_per_s, link_how,
            c->n_sizes ? c->size_bytes[c->n_sizes - 1] / 1048576.0 : 0);
    fprintf(f, "d2h_gb_per_s = %.6g ; derived: measured by moesim calibrate (%s)\n",
            c->d2h_peak_gb_per_s, link_how);
    fprintf(f,
            "h2d_latency_us = %.6g ; derived: measured by moesim calibrate (intercept of time vs "
            "size)\n",
            c->h2d_latency_us);
    fprintf(f, "d2h_latency_us = %.6g ; derived: measured by moesim calibrate (intercept)\n",
            c->d2h_latency_us);
    fprintf(f, "copy_engines = %u ; derived: copied from %s\n", base->copy_engines, b);
    write_slowdown(f, "slowdown_beside_compute", c->contention_measured,
                   c->link_slowdown_beside_compute,
                   "1 MiB reads while the compute thread runs a decode step's ops, against alone",
                   base->h2d_slowdown_beside_compute, b);
    if (c->h2d_chunk_measured)
        fprintf(f,
                "latency_per_chunk = %s ; derived: measured by moesim calibrate (1 MiB chunks "
                "back to back, an event after each: %.6g us per chunk against %.6g us at the "
                "link's rate and %.6g us latency)\n\n",
                c->h2d_latency_per_chunk ? "true" : "false", c->h2d_chunk_us,
                1048576.0 / c->h2d_peak_gb_per_s / 1e3, c->h2d_latency_us);
    else
        fprintf(f, "latency_per_chunk = %s ; derived: copied from %s\n\n",
                base->h2d_latency_per_chunk ? "true" : "false", b);
    fprintf(f, "[host]\ndram_gib = %.6g ; derived: copied from %s\n", base->dram_bytes / GIB, b);
    fprintf(f, "dram_gb_per_s = %.6g ; derived: copied from %s\n\n", base->dram_bytes_per_s / 1e9,
            b);
    fprintf(f, "[ssd]\nread_gb_per_s = %.6g ; derived: copied from %s\n",
            base->ssd_read_bytes_per_s / 1e9, b);
    fprintf(f, "latency_us = %.6g ; derived: copied from %s\n", base->ssd_latency_ns / 1e3, b);
    fprintf(f, "gpu_direct_storage = false ; derived: %s\n",
            cpu ? "copied from the base (the CPU kind has no SSD tier beyond the expert file)"
                : "moesim replay reads SSD experts through a pinned DRAM bounce buffer (no "
                  "cuFile), so the profile it is validated against does too");
    if (ferror(f)) {
        atomic_file_abort(&af);
        return moesim_fail(err, MOESIM_EIO, "%s: write failed", path);
    }
    return atomic_file_commit(&af, err);
}

moesim_status calib_write_table(const calib_results *c, const char *model_name, const char *path,
                                moesim_error *err) {
    atomic_file af;
    if (atomic_file_open(&af, path, err)) return MOESIM_EIO;
    FILE *f = af.fp;
    fprintf(f, "# moesim cost table v1\n");
    fprintf(f, "# measured by moesim calibrate on %s for model %s (median of %u repetitions)\n",
            c->gpu, model_name, c->repeats);
    fprintf(f, "# model %s\n", model_name); /* what the simulator checks its runs against */
    if (c->stall_overhead > 0)
        fprintf(f, "# times the stall overhead of the machine, %.4f (replay/calib_cpu.c)\n",
                c->stall_overhead);
    fprintf(f, "# op             precision  x      time_us\n");
    for (int op = 0; op < COST_OP_COUNT; op++)
        for (int p = 0; p < PREC_COUNT; p++) {
            const cost_curve *cv = &c->curve[op][p];
            for (uint32_t i = 0; i < cv->n; i++) {
                MOESIM_ASSERT(i == 0 || cv->x[i] > cv->x[i - 1]);
                fprintf(f, "%-16s %-10s %-6.17g %.6f\n", cost_op_name((cost_op)op),
                        precision_name((moesim_precision)p), cv->x[i], cv->t_ns[i] / 1e3);
            }
        }
    if (ferror(f)) {
        atomic_file_abort(&af);
        return moesim_fail(err, MOESIM_EIO, "%s: write failed", path);
    }
    return atomic_file_commit(&af, err);
}
