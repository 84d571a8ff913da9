/* Calibrations between a validation's rounds (sweep/validate_calib.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/paths.h"
#include "replay/exec.h"
#include "sweep/validate_calib.h"

/* An op's time at its first point (one token), us; NAN where the calibration has no curve. */
static double first_point_us(const calib_results *r, cost_op op, moesim_precision p) {
    const cost_curve *cv = &r->curve[op][p];
    return cv->n ? cv->t_ns[0] / 1e3 : NAN;
}

moesim_status validate_calib_dir_prepare(const char *dir, moesim_error *err) {
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/calibration-0.ini", dir);
    moesim_status st = moesim_path_make_parents(probe, err);
    if (!st && access(dir, W_OK))
        st = moesim_fail(err, MOESIM_EIO, "--calibrate-rounds %s: cannot write there (%s)", dir,
                         strerror(errno));
    return st;
}

moesim_status validate_calib_take(const validate_calibrator *c, calib_results *out,
                                  validate_calibration *fig, moesim_error *err) {
    memset(fig, 0, sizeof *fig);
    fig->at_s = (double)(replay_exec_clock_ns() - c->start_ns) / 1e9;
    calib_options opt = {.model = c->model,
                         .repeats = c->repeats,
                         .max_tokens = c->max_tokens,
                         .max_context = c->max_context,
                         .precisions = c->precisions,
                         .cache = c->cache};
    moesim_status st = c->cpu ? calib_run_cpu(&opt, NULL, out, err) : calib_run(&opt, out, err);
    if (st) return st;
    fig->disk_gb_per_s = out->h2d_peak_gb_per_s;
    fig->disk_latency_us = out->h2d_latency_us;
    fig->gate_up_us = first_point_us(out, COST_EXPERT_GATE_UP, c->precision);
    fig->attention_proj_us = first_point_us(out, COST_ATTENTION_PROJ, PREC_BF16);
    fig->lm_head_us = first_point_us(out, COST_LM_HEAD, PREC_BF16);
    if (!c->quiet)
        fprintf(stderr,
                "validate: calibrated at %.0f s: link %.3f GB/s (latency %.1f us), gate+up %.1f "
                "us, attention projections %.1f us, LM head %.1f us\n",
                fig->at_s, fig->disk_gb_per_s, fig->disk_latency_us, fig->gate_up_us,
                fig->attention_proj_us, fig->lm_head_us);
    return MOESIM_OK;
}

moesim_status validate_calib_publish(const validate_calibrator *c, const calib_results *r,
                                     const char *stem, hw_profile *hw, char *table,
                                     size_t table_len, moesim_error *err) {
    char profile[1024];
    if ((size_t)snprintf(profile, sizeof profile, "%s/%s.ini", c->dir, stem) >= sizeof profile ||
        (size_t)snprintf(table, table_len, "%s/%s-cost.txt", c->dir, stem) >= table_len)
        return moesim_fail(err, MOESIM_EINPUT, "--calibrate-rounds %s: the path is too long",
                           c->dir);
    moesim_status st = calib_write_profile(r, c->base, stem, profile, err);
    if (!st) st = calib_write_table(r, c->model->name, table, err);
    if (!st) st = hw_load(profile, hw, err);
    return st;
}

static double mean2(double a, double b) { return (a + b) / 2; }

void validate_calib_mean(const calib_results *a, const calib_results *b, calib_results *out) {
    *out = *a;
    MOESIM_ASSERT(a->n_sizes == b->n_sizes); /* the same plan: the same points */
    for (uint32_t i = 0; i < a->n_sizes; i++) {
        out->h2d_gb_per_s[i] = mean2(a->h2d_gb_per_s[i], b->h2d_gb_per_s[i]);
        out->d2h_gb_per_s[i] = mean2(a->d2h_gb_per_s[i], b->d2h_gb_per_s[i]);
    }
    out->h2d_latency_us = mean2(a->h2d_latency_us, b->h2d_latency_us);
    out->d2h_latency_us = mean2(a->d2h_latency_us, b->d2h_latency_us);
    out->h2d_peak_gb_per_s = mean2(a->h2d_peak_gb_per_s, b->h2d_peak_gb_per_s);
    out->d2h_peak_gb_per_s = mean2(a->d2h_peak_gb_per_s, b->d2h_peak_gb_per_s);
    out->hbm_gb_per_s = mean2(a->hbm_gb_per_s, b->hbm_gb_per_s);
    out->bf16_tflops = mean2(a->bf16_tflops, b->bf16_tflops);
    out->kernel_launch_us = mean2(a->kernel_launch_us, b->kernel_launch_us);
    out->stall_overhead = mean2(a->stall_overhead, b->stall_overhead);
    for (int op = 0; op < COST_OP_COUNT; op++)
        for (int p = 0; p < PREC_COUNT; p++) {
            const cost_curve *ca = &a->curve[op][p], *cb = &b->curve[op][p];
            MOESIM_ASSERT(ca->n == cb->n);
            for (uint32_t i = 0; i < ca->n; i++)
                out->curve[op][p].t_ns[i] = mean2(ca->t_ns[i], cb->t_ns[i]);
        }
}
