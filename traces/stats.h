/* Statistics of a router trace: skew, reuse, the share of experts a batch touches, look-ahead
 * predictor accuracy, and LRU / OPT hit-rate curves for a per-layer expert cache of every
 * capacity (Mattson's stack algorithm for LRU, the priority-stack form for Belady's OPT).
 *
 * Conventions: one cache per layer; each of a token's top-k selections is one access, in
 * stored order; tokens in trace order (requests in execution order); caches persist across
 * requests; cold misses count as misses. Two rules for the caches (traces/STATS.md):
 *   - the simulator's (lru_hit_rate, opt_hit_rate; capacities top_k..E): a token's experts are
 *     resident together, so none of them is evicted to load another of the same token — the
 *     simulator's lru at batch 1 with one-token steps gives lru_hit_rate[c];
 *   - per slot (lru_slot_hit_rate; capacities 1..E): every access on its own, nothing pinned
 *     (a software cache fed the access sequence); trace_stats_hit_counts gives per-slot OPT. */
#ifndef MOESIM_TRACES_STATS_H
#define MOESIM_TRACES_STATS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/status.h"
#include "traces/trace.h"

#define STATS_N_BATCH 6
extern const uint32_t trace_stats_batch_sizes[STATS_N_BATCH]; /* 1, 2, 4, 8, 16, 32 */

typedef struct layer_stats {
    uint64_t tokens;            /* tokens with this layer recorded */
    uint64_t accesses;          /* tokens x top_k */
    uint64_t cold_misses;       /* first accesses of each expert: misses at every capacity */
    uint64_t reuse_pairs;       /* consecutive same-request token pairs, both rows recorded */
    uint64_t *expert_count;     /* [n_experts] activations of each expert */
    double gini;                /* Gini coefficient of expert_count */
    double top10_share;         /* share of activations on the busiest 10% of experts */
    double max_over_mean;       /* busiest expert / mean */
    double min_over_mean;       /* least used expert / mean */
    double reuse_top1;          /* consecutive tokens of a request share their top-1 expert */
    double reuse_any;           /* consecutive tokens of a request share any chosen expert */
    double mean_reuse_distance; /* mean LRU stack distance of re-accesses (cold excluded) */
    double active_share[STATS_N_BATCH]; /* mean share touched per decode iteration; NaN: absent */
    double *lookahead_top1;   /* [D] predicted top-1 == actual top-1 of layer l+d; NaN: absent */
    double *lookahead_recall; /* [D] share of layer l+d's top-k among the first k predicted */
    double *lru_hit_rate;      /* [n_experts + 1] by capacity, routes pinned; NaN below top_k */
    double *opt_hit_rate;      /* [n_experts + 1] Belady under the same rule; NaN below top_k */
    double *lru_slot_hit_rate; /* [n_experts + 1] LRU per slot; index 0 NaN */
} layer_stats;

typedef struct trace_stats {
    uint64_t tokens, prefill_tokens, decode_tokens;
    uint64_t accesses; /* over all layers */
    uint32_t requests, layers, experts, top_k, lookahead_depth, lookahead_k;
    uint32_t decode_requests; /* requests with at least one decode token */
    /* over all layers: skew = mean over layers that have accesses; reuse, reuse distance,
     * look-ahead, active share and hit rates pool the counts of every layer (traces/STATS.md) */
    double gini, top10_share, max_over_mean, min_over_mean;
    double reuse_top1, reuse_any, mean_reuse_distance;
    double active_share[STATS_N_BATCH];
    double *lookahead_top1;   /* [D] */
    double *lookahead_recall; /* [D] */
    double *lru_hit_rate;      /* [n_experts + 1] hits / accesses over all layers (as above) */
    double *opt_hit_rate;      /* [n_experts + 1] */
    double *lru_slot_hit_rate; /* [n_experts + 1] LRU per slot */
    layer_stats *per_layer;   /* [layers] */
    uint64_t *layer_hash; /* [layers] trace_stats_compute_stream only: each layer's hash as
                             trace_layer_twins computes it (traces/layer_twins.h), else NULL */
    arena mem;                /* owns every array above */
} trace_stats;

/* Computes everything in one call. `t` must satisfy trace_check (every reader and trace_finish
 * ensure it); a violated invariant is a bug and asserts. Caller owns the result;
 * trace_stats_destroy. Memory beyond the trace: O(L * E) stacks, a block of rows, the decode
 * tokens of 32 requests in flight (active share), and the next uses of OPT (4 bytes per access)
 * in an unlinked temporary file once they pass 64 MB (held in memory if none can be made). */
trace_stats *trace_stats_compute(const trace *t);
/* The same figures, bit for bit, from a trace read as a stream (trace_stream_open): two passes
 * over its blocks (next uses backward, then everything forward), memory as above whatever the
 * trace's length; and layer_hash, so that finding copied layers needs no pass of its own. Fails
 * (MOESIM_EIO) only when the temporary file cannot be made. */
moesim_status trace_stats_compute_stream(trace_stream *ts, trace_stats **out, moesim_error *err);
void trace_stats_destroy(trace_stats *s); /* accepts NULL */

/* Hit counts of one cache fed the access sequence `seq` (expert ids < n_experts) one access at a
 * time (the per-slot rule), for every capacity at once: lru_hits[c] and opt_hits[c] for
 * c = 0..n_experts (index 0 is 0). Either output may be NULL (that pass is skipped). For callers
 * that build their own sequences (calibration, tests). O(n * stack depth), allocates O(n +
 * n_experts) scratch once. */
void trace_stats_hit_counts(const uint16_t *seq, size_t n, uint32_t n_experts, uint64_t *lru_hits,
                            uint64_t *opt_hits);

/* The same under the simulator's rule: `seq` is cut into consecutive routes of route_len[r]
 * accesses (sum = n) whose experts are resident together (the simulator's (sub-)routes); a
 * route's later accesses of an expert are hits. LRU, and Belady's OPT under that constraint
 * (evict the expert outside the route used farthest in the future), for every capacity c at
 * least the widest route's distinct experts, which it returns; hits[c] is 0 below it. What
 * trace_stats_compute does per layer with one-token routes. */
uint32_t trace_stats_route_hit_counts(const uint16_t *seq, size_t n, const uint32_t *route_len,
                                      size_t n_routes, uint32_t n_experts, uint64_t *lru_hits,
                                      uint64_t *opt_hits);

/* The JSON of `moesim trace stats --json` (keys documented in traces/STATS.md). New reference.
 * Absent values (NaN) are written as null. */
json_t *trace_stats_to_json(const trace_stats *s);

#endif
