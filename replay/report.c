/* The arithmetic of `moesim validate`: relative errors of a replay against the simulator on one
 * configuration (means, per request, per MoE layer), medians over a validation set, and whether
 * the two rank the policies the same way by TPOT. Errors are (sim - real) / real; medians are of
 * absolute errors. The targets: median |TPOT error| <= 5 %, median |TTFT error| <= 10 %,
 * and the same policy order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_cdf.h>
#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>

#include "common/alloc.h"
#include "common/check.h"
#include "replay/replay.h"

/* The validation's targets (replay/README.md): the simulator is worth believing when its median
 * error is a few % of what it predicts, below the gaps between the policies it ranks. */
#define TPOT_TARGET 0.05 /* median absolute TPOT error */
#define TTFT_TARGET 0.10 /* median absolute TTFT error (prompt steps are fewer: noisier) */

void validate_record_init(validate_record *v, uint32_t n_requests, uint32_t n_layers) {
    memset(v, 0, sizeof *v);
    v->n_requests = n_requests;
    v->n_layers = n_layers;
    v->ttft_ms = moesim_xcalloc(n_requests ? n_requests : 1, sizeof *v->ttft_ms);
    v->tpot_ms = moesim_xcalloc(n_requests ? n_requests : 1, sizeof *v->tpot_ms);
    v->layer_ms = moesim_xcalloc(n_layers ? n_layers : 1, sizeof *v->layer_ms);
    for (uint32_t i = 0; i < n_requests; i++) v->ttft_ms[i] = v->tpot_ms[i] = NAN;
}

void validate_record_free(validate_record *v) {
    if (!v) return;
    free(v->ttft_ms);
    free(v->tpot_ms);
    free(v->layer_ms);
    memset(v, 0, sizeof *v);
}

static void on_request(void *ctx, uint32_t request, double ttft_ms, double tpot_ms) {
    validate_record *v = ctx;
    MOESIM_ASSERT(request < v->n_requests);
    v->ttft_ms[request] = ttft_ms;
    v->tpot_ms[request] = tpot_ms;
}

static void on_layer(void *ctx, uint64_t step, uint32_t layer, uint64_t t0_ns, uint64_t t1_ns) {
    (void)step;
    validate_record *v = ctx;
    MOESIM_ASSERT(layer < v->n_layers && t1_ns >= t0_ns);
    v->layer_ms[layer] += (double)(t1_ns - t0_ns) / 1e6;
}

sim_hooks validate_record_hooks(validate_record *v) {
    return (sim_hooks){.ctx = v, .on_request_done = on_request, .on_layer_done = on_layer};
}

double validate_rel_err(double sim, double real) {
    if (isnan(sim) || isnan(real) || real == 0) return NAN;
    return (sim - real) / real;
}

double validate_median(double *v, size_t n) {
    if (!n) return NAN;
    gsl_sort(v, 1, n);
    return gsl_stats_median_from_sorted_data(v, 1, n);
}

/* Median of |rel err| over the pairs where both are defined. */
static double median_abs_err(const double *sim, const double *real, size_t n) {
    double *e = moesim_xmalloc((n ? n : 1) * sizeof *e);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        double x = validate_rel_err(sim[i], real[i]);
        if (!isnan(x)) e[m++] = fabs(x);
    }
    double med = validate_median(e, m);
    free(e);
    return med;
}

/* Bytes over the host->device link per second of its busy time (ms -> GB/s: bytes / ms / 1e6). */
static double link_gb_per_s(const sim_result *r) {
    return r->h2d_busy_ms > 0 ? (double)r->h2d_bytes / r->h2d_busy_ms / 1e6 : NAN;
}

moesim_status validate_compare(const validate_record *sim, const validate_record *real,
                               const char *label, validate_row *out, moesim_error *err) {
    if (sim->n_requests != real->n_requests || sim->n_layers != real->n_layers)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: the simulated run has %u requests and %u layers, the replay %u "
                           "and %u: not the same trace",
                           label, sim->n_requests, sim->n_layers, real->n_requests, real->n_layers);
    memset(out, 0, sizeof *out);
    snprintf(out->policy, sizeof out->policy, "%s", sim->r.policy);
    snprintf(out->label, sizeof out->label, "%s", label);
    snprintf(out->group, sizeof out->group, "%s", label);
    out->sim_tpot_ms = sim->r.tpot.mean_ms;
    out->real_tpot_ms = real->r.tpot.mean_ms;
    out->real_tpot_lo_ms = out->real_tpot_hi_ms = out->real_tpot_ms; /* one replay's range */
    out->sim_ttft_ms = sim->r.ttft.mean_ms;
    out->real_ttft_ms = real->r.ttft.mean_ms;
    out->sim_total_ms = sim->r.makespan_ms;
    out->real_total_ms = real->r.makespan_ms;
    out->tpot_err = validate_rel_err(out->sim_tpot_ms, out->real_tpot_ms);
    out->ttft_err = validate_rel_err(out->sim_ttft_ms, out->real_ttft_ms);
    out->total_err = validate_rel_err(out->sim_total_ms, out->real_total_ms);
    out->sim_tpot_drift = out->sim_tpot_slice_noise = NAN; /* --calibrate-rounds sets them */
    out->tpot_err_first_calib = NAN;
    out->req_tpot_err_median = median_abs_err(sim->tpot_ms, real->tpot_ms, sim->n_requests);
    out->req_ttft_err_median = median_abs_err(sim->ttft_ms, real->ttft_ms, sim->n_requests);
    out->layer_err_median = median_abs_err(sim->layer_ms, real->layer_ms, sim->n_layers);
    out->layer_err_max = NAN;
    out->layer_worst = -1;
    MOESIM_ASSERT(sim->n_layers <= MODEL_MAX_LAYERS);
    out->n_layers = sim->n_layers;
    for (uint32_t l = 0; l < sim->n_layers; l++) {
        out->sim_layer_ms[l] = (float)sim->layer_ms[l];
        out->real_layer_ms[l] = (float)real->layer_ms[l];
        double x = fabs(validate_rel_err(sim->layer_ms[l], real->layer_ms[l]));
        if (!isnan(x) && (isnan(out->layer_err_max) || x > out->layer_err_max)) {
            out->layer_err_max = x;
            out->layer_worst = (int32_t)l;
        }
    }
    double sim_in = 0, real_in = 0;
    for (uint32_t l = 0; l < sim->n_layers; l++)
        sim_in += sim->layer_ms[l], real_in += real->layer_ms[l];
    out->sim_outside_ms = out->sim_total_ms - sim_in;
    out->real_outside_ms = out->real_total_ms - real_in;
    out->outside_err = validate_rel_err(out->sim_outside_ms, out->real_outside_ms);
    out->sim_hit_rate = sim->r.hit_rate;
    out->real_hit_rate = real->r.hit_rate;
    out->sim_link_gb_per_s = link_gb_per_s(&sim->r);
    out->real_link_gb_per_s = link_gb_per_s(&real->r);
    return MOESIM_OK;
}

static int sign3(double a, double b) { return (a > b) - (a < b); }

/* Two compared rows of one group (ranked against each other). */
static bool same_group(const validate_row *a, const validate_row *b) {
    return !a->refused && !b->refused && !strcmp(a->group, b->group);
}

/* A pair the simulator ties claims no order (two policies that make the same decisions do the
 * same work): as Kendall's tau-b does, it is left out of the ranking, never concordant or
 * discordant, since a measured time can never tie. */
static bool sim_tied(const validate_row *a, const validate_row *b) {
    return a->sim_tpot_ms == b->sim_tpot_ms;
}

/* Ranked the same way by the simulator and the replay. */
static bool ordered_alike(const validate_row *a, const validate_row *b) {
    return sign3(a->sim_tpot_ms, b->sim_tpot_ms) == sign3(a->real_tpot_ms, b->real_tpot_ms);
}

uint32_t validate_rounds_faster(const validate_row *a, const validate_row *b, uint32_t *rounds) {
    uint32_t n = a->n_rounds < b->n_rounds ? a->n_rounds : b->n_rounds, faster = 0;
    *rounds = 0;
    for (uint32_t k = 0; k < n; k++) {
        double x = a->real_tpot_round_ms[k], y = b->real_tpot_round_ms[k];
        if (x == y || isnan(x) || isnan(y)) continue; /* no order in that round */
        ++*rounds;
        faster += x < y;
    }
    return faster;
}

int validate_replay_order(const validate_row *a, const validate_row *b) {
    if (a->n_rounds < VALIDATE_MIN_ROUNDS || b->n_rounds < VALIDATE_MIN_ROUNDS)
        return sign3(a->real_tpot_ms, b->real_tpot_ms);
    uint32_t rounds, faster = validate_rounds_faster(a, b, &rounds);
    if (!rounds) return 0;
    uint32_t most = faster > rounds - faster ? faster : rounds - faster;
    /* P(X >= most) for X ~ Binomial(rounds, 1/2), both tails */
    double p = 2 * gsl_cdf_binomial_Q(most - 1, 0.5, rounds);
    if (p >= 0.05) return 0;
    return faster > rounds - faster ? -1 : 1;
}

double validate_sim_gap(const validate_row *a, const validate_row *b) {
    double lo = fmin(a->sim_tpot_ms, b->sim_tpot_ms), hi = fmax(a->sim_tpot_ms, b->sim_tpot_ms);
    return lo > 0 ? hi / lo - 1 : 0;
}

size_t validate_sim_tied_pairs(const validate_row *rows, size_t n, size_t (*out)[2], size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            if (!same_group(&rows[i], &rows[j]) || !sim_tied(&rows[i], &rows[j])) continue;
            if (k < cap) out[k][0] = i, out[k][1] = j;
            k++;
        }
    return k;
}

size_t validate_discordant_pairs(const validate_row *rows, size_t n, size_t (*out)[2], size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            if (!same_group(&rows[i], &rows[j]) || sim_tied(&rows[i], &rows[j]) ||
                ordered_alike(&rows[i], &rows[j]))
                continue;
            if (k < cap) out[k][0] = i, out[k][1] = j;
            k++;
        }
    return k;
}

void validate_summarize(const validate_row *rows, size_t n, validate_summary *out) {
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < n; i++) out->n_rows += !rows[i].refused;
    double *tp = moesim_xmalloc((n ? n : 1) * sizeof *tp);
    double *tf = moesim_xmalloc((n ? n : 1) * sizeof *tf);
    double *tt = moesim_xmalloc((n ? n : 1) * sizeof *tt);
    double *td = moesim_xmalloc((n ? n : 1) * sizeof *td);
    double *t1 = moesim_xmalloc((n ? n : 1) * sizeof *t1);
    double *tn = moesim_xmalloc((n ? n : 1) * sizeof *tn);
    double *to = moesim_xmalloc((n ? n : 1) * sizeof *to);
    double *tl = moesim_xmalloc((n ? n : 1) * sizeof *tl);
    size_t a = 0, b = 0, c = 0, d = 0, e = 0, g = 0, o = 0, l = 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].refused) continue;
        if (!isnan(rows[i].tpot_err)) tp[a++] = fabs(rows[i].tpot_err);
        if (!isnan(rows[i].ttft_err)) tf[b++] = fabs(rows[i].ttft_err);
        if (!isnan(rows[i].total_err)) tt[c++] = fabs(rows[i].total_err);
        if (!isnan(rows[i].sim_tpot_drift)) td[d++] = rows[i].sim_tpot_drift;
        if (!isnan(rows[i].sim_tpot_slice_noise)) tn[g++] = rows[i].sim_tpot_slice_noise;
        if (!isnan(rows[i].tpot_err_first_calib)) t1[e++] = fabs(rows[i].tpot_err_first_calib);
        if (!isnan(rows[i].outside_err)) to[o++] = fabs(rows[i].outside_err);
        if (!isnan(rows[i].layer_err_median)) tl[l++] = rows[i].layer_err_median;
    }
    out->tpot_abs_err_median = validate_median(tp, a);
    out->ttft_abs_err_median = validate_median(tf, b);
    out->total_abs_err_median = validate_median(tt, c);
    out->drift_tpot_median = validate_median(td, d);
    out->slice_noise_tpot_median = validate_median(tn, g);
    out->tpot_abs_err_median_first_calib = validate_median(t1, e);
    out->outside_abs_err_median = validate_median(to, o);
    out->layer_abs_err_median = validate_median(tl, l);
    out->drift_exceeds_error = out->drift_tpot_median > out->tpot_abs_err_median;
    free(tp);
    free(tf);
    free(tt);
    free(td);
    free(t1);
    free(tn);
    free(to);
    free(tl);
    /* pairs of policies within a group: concordant when sim and replay order them alike */
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            if (!same_group(&rows[i], &rows[j])) continue;
            if (sim_tied(&rows[i], &rows[j])) {
                out->sim_ties++;
                continue;
            }
            out->pairs++;
            int measured = validate_replay_order(&rows[i], &rows[j]);
            if (measured) {
                out->replay_ordered++;
                out->replay_ordered_concordant +=
                    measured == sign3(rows[i].sim_tpot_ms, rows[j].sim_tpot_ms);
            }
            if (ordered_alike(&rows[i], &rows[j])) {
                out->concordant++;
            } else {
                double gap = validate_sim_gap(&rows[i], &rows[j]);
                if (gap > out->discordant_gap_max) out->discordant_gap_max = gap;
            }
        }
    out->same_order = out->concordant == out->pairs;
    out->meets_targets = out->n_rows > 0 && out->tpot_abs_err_median <= TPOT_TARGET &&
                         out->ttft_abs_err_median <= TTFT_TARGET &&
                         out->replay_ordered_concordant == out->replay_ordered &&
                         !out->drift_exceeds_error;
}

bool validate_order_beyond(const validate_row *rows, size_t n, double margin, uint64_t *pairs,
                           uint64_t *concordant) {
    *pairs = *concordant = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            const validate_row *a = &rows[i], *b = &rows[j];
            if (!same_group(a, b) || !(fmin(a->sim_tpot_ms, b->sim_tpot_ms) > 0)) continue;
            if (validate_sim_gap(a, b) <= margin) continue; /* too close for noise to keep */
            int measured = validate_replay_order(a, b);
            if (!measured) continue; /* the replay's own rounds split: no order to agree with */
            ++*pairs;
            *concordant += measured == sign3(a->sim_tpot_ms, b->sim_tpot_ms);
        }
    return *concordant == *pairs;
}
