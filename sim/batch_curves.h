/* Hit-rate curves of per-layer expert caches under the simulator's batched steps: what
 * `moesim trace stats --batch B` prints. A step of the simulator's schedule at batch B
 * (core/schedule.h: up to B requests in flight, a step is the admitted requests' pending prompt
 * tokens or one decode token of each) runs each layer as one route whose experts are resident
 * together (policies/policy.h), so the curves are trace_stats_route_hit_counts over the step
 * routes of every layer: LRU, and Belady's OPT that never evicts an expert of the route it
 * loads for. At B = 1 with one-token steps they are trace_stats' lru_hit_rate / opt_hit_rate.
 *
 * Valid from the widest route's distinct experts up (`from`): a smaller cache splits a step
 * into sub-routes, which depend on the pool, not on the trace alone. Conventions as
 * traces/STATS.md: one access per (token, slot), a route's repeats of an expert are hits, cold
 * misses count, caches persist across requests. */
#ifndef MOESIM_SIM_BATCH_CURVES_H
#define MOESIM_SIM_BATCH_CURVES_H

#include <stdint.h>

#include "traces/trace.h"

typedef struct sim_batch_curves {
    uint32_t batch;
    uint32_t n_experts;
    uint32_t from;     /* the widest step route of any layer (distinct experts) */
    uint64_t steps;    /* steps of the schedule */
    uint64_t accesses; /* (token, slot) accesses over all layers */
    double *lru;       /* [n_experts + 1] hits / accesses at capacity c; NaN below `from` */
    double *opt;       /* [n_experts + 1] the same for OPT */
} sim_batch_curves;

/* Computes the curves of `t` at batch size `batch` (>= 1); free with sim_batch_curves_free. */
void sim_batch_curves_compute(const trace *t, uint32_t batch, sim_batch_curves *out);
void sim_batch_curves_free(sim_batch_curves *c); /* accepts a zeroed struct */

#endif
