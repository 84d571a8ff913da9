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
    /* the most requests whose decode is under way (begun and not finished) at any point of the
     * trace: the decode batch of its execution order (synth_fit_detect_interleave); 1 at least */
    uint32_t decode_batch;
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

#define FIT_DRIFT_WINDOW 32 /* decode rows per window of the drift statistic */
/* Popularity drift within a request, per layer (drift[L]): the mean, over windows of
 * FIT_DRIFT_WINDOW consecutive decode rows of a request (of requests with two whole windows or
 * more), of the total variation distance between the window's expert shares and the request's
 * over its whole windows; NaN where no request has two windows. Informative (the report): no
 * knob is fitted to it. */
void fit_drift_compute(const trace *t, double *drift);

/* What a pass computes (decode_batch always): some moments of routing only, where a bisection
 * needs no more; the others are left as they were. */
#define FIT_MOMENT_REQUEST_GINI 1u
#define FIT_MOMENT_REPEAT       2u
#define FIT_MOMENT_SHARED       4u
#define FIT_MOMENT_GATES        8u
#define FIT_MOMENT_IMPORTANCE   16u
#define FIT_MOMENTS_ALL         31u
#define FIT_LAYER_STATS         32u /* fit_layer_stats */

/* One pass over a trace's tokens in trace order, whatever holds them (a trace in memory, a
 * stream's blocks): fed token by token, it keeps per request in flight the previous token's rows
 * (and with FIT_MOMENT_REQUEST_GINI the request's own counts), and nothing per token, so its
 * memory is O(L * E) plus O(requests) whatever the trace's length. */
typedef struct fit_pass fit_pass;
/* Reads token `token`'s rows: the trace (block) holding them and its index there (*local). */
typedef const trace *(*fit_row_fn)(void *src, uint64_t token, uint64_t *local);
const trace *fit_row_in_memory(void *t, uint64_t token, uint64_t *local); /* src: the trace */
/* A pass computing `what` over `tokens` (meta and counts) with its requests `ix` (borrowed until
 * finish); with the importance moments it reads each request's last token through row(src) at
 * once. */
fit_pass *fit_pass_create(const trace *tokens, const trace_request_index *ix, fit_row_fn row,
                          void *src, unsigned what);
/* Token `local` of block `b`: the next token of the trace. */
void fit_pass_token(fit_pass *p, const trace *b, uint64_t local);
/* The figures (ls and mo may be NULL), after every token; frees the pass. */
void fit_pass_finish(fit_pass *p, fit_layer_stats *ls, fit_moments *mo);

/* The pass over a trace in memory. */
void fit_stats_compute(const trace *t, unsigned what, fit_layer_stats *ls, fit_moments *mo);

#endif
