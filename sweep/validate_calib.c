/* Calibrations between a validation's rounds (sweep/validate_calib.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gsl/gsl_fit.h>
#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>

#include "common/alloc.h"
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

void validate_calib_figures(const validate_calibrator *c, const calib_results *r, double at_s,
                            validate_calibration *fig) {
    memset(fig, 0, sizeof *fig);
    fig->at_s = at_s;
    fig->disk_gb_per_s = r->h2d_peak_gb_per_s;
    fig->disk_latency_us = r->h2d_latency_us;
    fig->gate_up_us = first_point_us(r, COST_EXPERT_GATE_UP, c->precision);
    fig->attention_proj_us = first_point_us(r, COST_ATTENTION_PROJ, PREC_BF16);
    fig->lm_head_us = first_point_us(r, COST_LM_HEAD, PREC_BF16);
    fig->reads_beside_ops = r->contention_measured ? r->link_slowdown_beside_compute : NAN;
    fig->ops_beside_reads = r->contention_measured ? r->op_slowdown_beside_copy : NAN;
}

moesim_status validate_calib_take(const validate_calibrator *c, uint32_t repeats,
                                  calib_results *out, double *at_s, moesim_error *err) {
    *at_s = (double)(replay_exec_clock_ns() - c->start_ns) / 1e9;
    calib_options opt = {.model = c->model,
                         .repeats = repeats,
                         .max_tokens = c->max_tokens,
                         .max_context = c->max_context,
                         .precisions = c->precisions,
                         .cache = c->cache};
    return c->cpu ? calib_run_cpu(&opt, NULL, out, err) : calib_run(&opt, out, err);
}

void validate_calib_log(const validate_calibrator *c, const char *what,
                        const validate_calibration *fig) {
    if (!c->quiet)
        fprintf(stderr,
                "validate: %s at %.0f s: link %.3f GB/s (latency %.1f us), gate+up %.1f us, "
                "attention projections %.1f us, LM head %.1f us; beside each other reads %+.1f %%, "
                "ops %+.1f %%\n",
                what, fig->at_s, fig->disk_gb_per_s, fig->disk_latency_us, fig->gate_up_us,
                fig->attention_proj_us, fig->lm_head_us, 100 * fig->reads_beside_ops,
                100 * fig->ops_beside_reads);
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

/* Each point's median over the slices, times the slices' pooled stall overhead: the time of all
 * their calls over what the medians account for (as one calibration pools its repeats:
 * replay/calib_cpu.c), so slow spells count as often as the round met them. */
static void combine_curves(const calib_results *slices, size_t n, size_t stride,
                           calib_results *out) {
    double *v = moesim_xcalloc(n, sizeof *v), all = 0, typical = 0;
    for (int op = 0; op < COST_OP_COUNT; op++)
        for (int p = 0; p < PREC_COUNT; p++)
            for (uint32_t i = 0; i < out->curve[op][p].n; i++) {
                for (size_t k = 0; k < n; k++) {
                    const cost_curve *cv = &slices[k * stride].curve[op][p];
                    MOESIM_ASSERT(cv->n == out->curve[op][p].n);
                    v[k] = cv->t_ns[i];
                    all += v[k];
                }
                gsl_sort(v, 1, n);
                out->curve[op][p].t_ns[i] = gsl_stats_median_from_sorted_data(v, 1, n);
                typical += out->curve[op][p].t_ns[i] * (double)n;
            }
    out->stall_overhead = typical > 0 ? all / typical : 1;
    for (int op = 0; op < COST_OP_COUNT; op++)
        for (int p = 0; p < PREC_COUNT; p++)
            for (uint32_t i = 0; i < out->curve[op][p].n; i++)
                out->curve[op][p].t_ns[i] *= out->stall_overhead;
    free(v);
}

/* The link: each size's mean read time over the slices (the simulator charges every chunk the
 * same time, so the slow reads count), and the line through them as calibration fits it. */
static void combine_link(const calib_results *slices, size_t n, size_t stride, calib_results *out) {
    double xs[CALIB_MAX_SIZES], ys[CALIB_MAX_SIZES];
    for (uint32_t i = 0; i < out->n_sizes; i++) {
        double ns = 0;
        for (size_t k = 0; k < n; k++)
            ns += slices[k * stride].size_bytes[i] / slices[k * stride].h2d_gb_per_s[i];
        ns /= (double)n;
        xs[i] = out->size_bytes[i];
        ys[i] = ns;
        out->h2d_gb_per_s[i] = out->d2h_gb_per_s[i] = out->size_bytes[i] / ns;
    }
    double c0, c1, cov00, cov01, cov11, sumsq;
    gsl_fit_linear(xs, 1, ys, 1, out->n_sizes, &c0, &c1, &cov00, &cov01, &cov11, &sumsq);
    out->h2d_latency_us = out->d2h_latency_us = c0 > 0 ? c0 / 1e3 : 0;
    out->h2d_peak_gb_per_s = out->d2h_peak_gb_per_s =
        c1 > 0 ? 1.0 / c1 : out->h2d_gb_per_s[out->n_sizes - 1];
}

/* What the link and the compute cost each other: each the median over the slices (a slice's
 * figure is one short round: replay/calib_cpu.c, time_contention). */
static void combine_contention(const calib_results *slices, size_t n, size_t stride,
                               calib_results *out) {
    double *link = moesim_xcalloc(n, sizeof *link), *ops = moesim_xcalloc(n, sizeof *ops);
    for (size_t k = 0; k < n; k++) {
        MOESIM_ASSERT(slices[k * stride].contention_measured);
        link[k] = slices[k * stride].link_slowdown_beside_compute;
        ops[k] = slices[k * stride].op_slowdown_beside_copy;
    }
    gsl_sort(link, 1, n);
    gsl_sort(ops, 1, n);
    out->link_slowdown_beside_compute = gsl_stats_median_from_sorted_data(link, 1, n);
    out->op_slowdown_beside_copy = gsl_stats_median_from_sorted_data(ops, 1, n);
    free(link);
    free(ops);
}

void validate_calib_drift(const double halves[2], const double parity[2], double compared,
                          double *drift, double *noise) {
    double h = fabs(halves[1] - halves[0]), p = fabs(parity[1] - parity[0]);
    *noise = p / compared;
    *drift = fmax(0, h - p) / compared;
}

void validate_calib_combine(const calib_results *slices, size_t n, size_t stride,
                            calib_results *out) {
    MOESIM_ASSERT(n >= 1 && stride >= 1);
    *out = slices[0];
    for (size_t k = 1; k < n; k++) MOESIM_ASSERT(slices[k * stride].n_sizes == out->n_sizes);
    combine_curves(slices, n, stride, out);
    if (out->n_sizes >= 2) combine_link(slices, n, stride, out);
    double dram = 0, flops = 0;
    out->repeats = 0;
    for (size_t k = 0; k < n; k++) {
        const calib_results *sl = &slices[k * stride];
        dram += sl->hbm_gb_per_s;
        flops += sl->bf16_tflops;
        out->repeats += sl->repeats;
    }
    out->hbm_gb_per_s = dram / (double)n;
    out->bf16_tflops = flops / (double)n;
    if (out->contention_measured) combine_contention(slices, n, stride, out);
}
