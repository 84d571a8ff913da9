/* Moments of a router trace that trace_stats does not compute, for the synthesizer's fit and
 * its comparison of a real trace with a synthetic one. Internal to traces/. */
#ifndef MOESIM_TRACES_SYNTH_MOMENTS_H
#define MOESIM_TRACES_SYNTH_MOMENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/model.h"
#include "traces/trace.h"

typedef struct fit_moments {
    double repeat_share; /* decode tokens routed exactly as their predecessor at every layer */
    /* [phase][L] mean share of a row's experts that its predecessor's row (same request) has,
     * by the row's phase (prefill, decode); NaN where no pair */
    double shared[2][MODEL_MAX_LAYERS];
    double request_gini; /* mean over (request, layer) of the gini of the request's own counts */
    double gate_top1;    /* mean largest gate of a row */
    double gate_sum;     /* mean sum of a row's gates */
    double imp_sink;     /* mean (importance of position 0 - 1) / (n - 1): the sink share */
    double imp_sigma;    /* std of log(importance / harmonic tail) over positions >= 1 */
    double imp_rho;      /* correlation of that between adjacent layers */
} fit_moments;

/* Whether a routing row was recorded (an unrecorded one is all TRACE_NO_EXPERT). */
static inline bool fit_row_recorded(const uint16_t *ids) { return ids[0] != TRACE_NO_EXPERT; }

/* Gini of counts x[0..E) (sorted in place), as STATS.md defines it; NaN when all zero. */
double fit_gini_of(uint32_t *x, uint32_t E);

/* Per-layer statistics the fit bisects on, as traces/STATS.md defines them and trace_stats
 * computes them (tests/test_synth_fit.c checks they agree), in a fraction of its time: no OPT
 * curve, no batch or look-ahead figures. NaN where a layer has nothing to measure. */
typedef struct fit_layer_stats {
    double gini[MODEL_MAX_LAYERS];
    double reuse_top1[MODEL_MAX_LAYERS], reuse_any[MODEL_MAX_LAYERS];
    double lru_mean[MODEL_MAX_LAYERS]; /* mean LRU hit rate over capacities k..E-1 */
} fit_layer_stats;

void fit_layer_stats_compute(const trace *t, fit_layer_stats *ls);

#define FIT_DRIFT_WINDOW 32 /* decode rows per window of the drift statistic */
/* Popularity drift within a request, per layer (drift[L]): the mean, over windows of
 * FIT_DRIFT_WINDOW consecutive decode rows of a request (of requests with two whole windows or
 * more), of the total variation distance between the window's expert shares and the request's
 * over its whole windows; NaN where no request has two windows. Informative (the report): no
 * knob is fitted to it. */
void fit_drift_compute(const trace *t, double *drift);

/* Some moments of routing only (the others are left as they were): a bisection computes what
 * its statistic needs. */
#define FIT_MOMENT_REQUEST_GINI 1u
#define FIT_MOMENT_REPEAT       2u
#define FIT_MOMENT_SHARED       4u
void fit_moments_compute_some(const trace *t, fit_moments *mo, unsigned which);

/* Every moment of `t`. */
void fit_moments_compute(const trace *t, fit_moments *mo);

#endif
