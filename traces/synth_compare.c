/* A real trace next to a synthetic one (traces/synth_fit.h: synth_fit_compare): the rows of
 * `trace synth --fit --report`, of the tests and of traces/SYNTH.md's figures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/stats.h"
#include "traces/synth_fit.h"
#include "traces/synth_moments.h"

#define MATCH_TOLERANCE 0.02 /* hit rates, gini, reuse: 0.02; active share: 2 points */

static size_t put_row(synth_fit_row *rows, size_t n, size_t cap, const char *statistic,
                      const char *knob, double real, double synthetic, double tolerance) {
    if (n < cap) {
        synth_fit_row *r = &rows[n];
        snprintf(r->statistic, sizeof r->statistic, "%s", statistic);
        snprintf(r->knob, sizeof r->knob, "%s", knob);
        r->real = real, r->synthetic = synthetic, r->tolerance = tolerance;
    }
    return n + 1;
}

/* The worst gap between two traces' per-layer hit-rate curves, capacities k..E, all layers. */
static double worst_layer_gap(const trace_stats *a, const trace_stats *b, bool opt) {
    double worst = 0;
    for (uint32_t l = 0; l < a->layers; l++) {
        const layer_stats *x = &a->per_layer[l], *y = &b->per_layer[l];
        if (!x->accesses || !y->accesses) continue;
        for (uint32_t c = a->top_k; c <= a->experts; c++) {
            const double d = opt ? fabs(x->opt_hit_rate[c] - y->opt_hit_rate[c])
                                 : fabs(x->lru_hit_rate[c] - y->lru_hit_rate[c]);
            worst = d > worst ? d : worst;
        }
    }
    return worst;
}

/* Mean of x[0..L) over the layers where it is not NaN; NaN when none. */
static double layer_mean(const double *x, uint32_t L) {
    double sum = 0;
    uint32_t n = 0;
    for (uint32_t l = 0; l < L; l++)
        if (!isnan(x[l])) sum += x[l], n++;
    return n ? sum / n : NAN;
}

size_t synth_fit_compare(const trace *real, const trace *synthetic, synth_fit_row *rows,
                         size_t cap) {
    trace_stats *r = trace_stats_compute(real), *s = trace_stats_compute(synthetic);
    MOESIM_ASSERT(r->experts == s->experts && r->top_k == s->top_k && r->layers == s->layers);
    fit_moments rm, sm;
    fit_stats_compute(real, FIT_MOMENTS_ALL, NULL, &rm);
    fit_stats_compute(synthetic, FIT_MOMENTS_ALL, NULL, &sm);
    size_t n = 0;
    char what[48];
    n = put_row(rows, n, cap, "gini (mean over layers)", "popularity table", r->gini, s->gini,
                MATCH_TOLERANCE);
    n = put_row(rows, n, cap, "top-10% share", "popularity table", r->top10_share, s->top10_share,
                0);
    n = put_row(rows, n, cap, "gini of a request's own counts", "popularity_smoothing",
                rm.request_gini, sm.request_gini, 0);
    n = put_row(rows, n, cap, "decode tokens routed as before", "repeat_decode_token",
                rm.repeat_share, sm.repeat_share, 0);
    n = put_row(rows, n, cap, "shared with previous, prefill", "reuse_row_prefill_*",
                layer_mean(rm.shared[0], r->layers), layer_mean(sm.shared[0], s->layers), 0);
    n = put_row(rows, n, cap, "shared with previous, decode", "reuse_row_decode_*",
                layer_mean(rm.shared[1], r->layers), layer_mean(sm.shared[1], s->layers), 0);
    n = put_row(rows, n, cap, "reuse top-1", "reuse_top1_*", r->reuse_top1, s->reuse_top1, 0);
    n = put_row(rows, n, cap, "reuse any", "reuse_other_*", r->reuse_any, s->reuse_any,
                MATCH_TOLERANCE);
    for (uint32_t c = r->top_k; c <= r->experts; c++) {
        snprintf(what, sizeof what, "LRU hit rate, %u experts", c);
        n = put_row(rows, n, cap, what, "reuse_history_*", r->lru_hit_rate[c], s->lru_hit_rate[c],
                    MATCH_TOLERANCE);
    }
    for (uint32_t c = r->top_k; c <= r->experts; c++) {
        snprintf(what, sizeof what, "OPT hit rate, %u experts", c);
        n = put_row(rows, n, cap, what, "", r->opt_hit_rate[c], s->opt_hit_rate[c],
                    MATCH_TOLERANCE);
    }
    double rd[MODEL_MAX_LAYERS], sd[MODEL_MAX_LAYERS];
    fit_drift_compute(real, rd);
    fit_drift_compute(synthetic, sd);
    n = put_row(rows, n, cap, "drift within a request (32 rows)", "", layer_mean(rd, r->layers),
                layer_mean(sd, s->layers), 0);
    n = put_row(rows, n, cap, "LRU per layer: worst gap", "", 0, worst_layer_gap(r, s, false), 0);
    n = put_row(rows, n, cap, "OPT per layer: worst gap", "", 0, worst_layer_gap(r, s, true), 0);
    for (int b = 1; b < STATS_N_BATCH; b++) {
        if (isnan(r->active_share[b])) continue;
        snprintf(what, sizeof what, "active share, B = %u", trace_stats_batch_sizes[b]);
        n = put_row(rows, n, cap, what, "topic_persistence", r->active_share[b], s->active_share[b],
                    MATCH_TOLERANCE);
    }
    for (uint32_t d = 0; d < r->lookahead_depth; d++) {
        const bool has = d < s->lookahead_depth;
        snprintf(what, sizeof what, "look-ahead top-1, d = %u", d + 1);
        n = put_row(rows, n, cap, what, "lookahead_top1_*", r->lookahead_top1[d],
                    has ? s->lookahead_top1[d] : NAN, 0);
        snprintf(what, sizeof what, "look-ahead recall@k, d = %u", d + 1);
        n = put_row(rows, n, cap, what, "lookahead_recall_*", r->lookahead_recall[d],
                    has ? s->lookahead_recall[d] : NAN, 0);
    }
    n = put_row(rows, n, cap, "mean largest gate", "gate_logit_scale", rm.gate_top1, sm.gate_top1,
                0);
    n = put_row(rows, n, cap, "mean gate sum", "gate_tail_gap", rm.gate_sum, sm.gate_sum, 0);
    n = put_row(rows, n, cap, "importance: sink share", "importance_sink_share", rm.imp_sink,
                sm.imp_sink, 0);
    n = put_row(rows, n, cap, "importance: log spread", "importance_salience_sigma", rm.imp_sigma,
                sm.imp_sigma, 0);
    n = put_row(rows, n, cap, "importance: layer correlation", "importance_layer_correlation",
                rm.imp_rho, sm.imp_rho, 0);
    trace_stats_destroy(s);
    trace_stats_destroy(r);
    return n;
}
