/* Statistics of a router trace: skew, reuse, the share of experts a batch touches, look-ahead
 * predictor accuracy, and LRU / OPT hit-rate curves for a per-layer expert cache of every
 * capacity 1..E (Mattson's stack algorithm for LRU, the priority-stack form for Belady's OPT:
 * one pass each).
 *
 * Conventions (shared with the simulator, whose LRU hit rate must equal lru_hit_rate[c]):
 * one cache per layer; each of a token's top-k selections is one access, in stored order;
 * tokens in trace order (requests in execution order); caches persist across requests; cold
 * misses count as misses. */
#ifndef MOESIM_TRACES_STATS_H
#define MOESIM_TRACES_STATS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "traces/trace.h"

#define STATS_N_BATCH 6
extern const uint32_t trace_stats_batch_sizes[STATS_N_BATCH]; /* 1, 2, 4, 8, 16, 32 */

typedef struct layer_stats {
    uint64_t accesses;          /* tokens x top_k */
    uint64_t *expert_count;     /* [n_experts] activations of each expert */
    double gini;                /* Gini coefficient of expert_count */
    double top10_share;         /* share of activations on the busiest 10% of experts */
    double max_over_mean;       /* busiest expert / mean */
    double min_over_mean;       /* least used expert / mean */
    double reuse_top1;          /* consecutive tokens of a request share their top-1 expert */
    double reuse_any;           /* consecutive tokens of a request share any chosen expert */
    double mean_reuse_distance; /* mean LRU stack distance of re-accesses (cold excluded) */
    double active_share[STATS_N_BATCH]; /* mean share touched per decode iteration; NaN: absent */
    double *lookahead_top1;     /* [D] predicted top-1 == actual top-1 of layer l+d; NaN: absent */
    double *lookahead_recall;   /* [D] share of layer l+d's top-k among the first k predicted */
    double *lru_hit_rate;       /* [n_experts + 1] by capacity; index 0 unused (0) */
    double *opt_hit_rate;       /* [n_experts + 1] */
} layer_stats;

typedef struct trace_stats {
    uint64_t tokens, prefill_tokens, decode_tokens;
    uint32_t requests, layers, experts, top_k, lookahead_depth;
    /* over all layers (activations pooled, or layer means where a rate is per layer) */
    double gini, top10_share, max_over_mean, reuse_top1, reuse_any, mean_reuse_distance;
    double active_share[STATS_N_BATCH];
    double *lookahead_top1;   /* [D] */
    double *lookahead_recall; /* [D] */
    double *lru_hit_rate;     /* [n_experts + 1] hits / accesses over all layers */
    double *opt_hit_rate;     /* [n_experts + 1] */
    layer_stats *per_layer;   /* [layers] */
} trace_stats;

/* Computes everything in one call. Caller owns the result; trace_stats_destroy. */
trace_stats *trace_stats_compute(const trace *t);
void trace_stats_destroy(trace_stats *s); /* accepts NULL */

/* The JSON of `moesim trace stats --json` (keys documented in traces/FORMAT.md). New reference. */
json_t *trace_stats_to_json(const trace_stats *s);

#endif
