/* The per-route bookkeeping that the simulator (sim/sim.c) and the replay executor
 * (replay/exec.c) must agree on exactly, kept in one place so they cannot drift apart:
 *
 * - one (sub-)route's active set: the distinct experts its tokens route to, ascending, each with
 *   its token count and gate mass, and the plan reset to POLICY_RUN_SKIP before the policy fills
 *   it (policies/policy.h, policy_route);
 * - the prefetch accounting of FIRM-MoE Eq. 7-8: at the first sub-route of a layer, the
 *   prefetched set S of that layer against the activated set A of the whole step;
 * - the policy call itself and what follows it (sim_route_decide): the policy_route handed to
 *   on_route, the plan committed to the memory system, the accesses and gate mass tallied (the
 *   hits are counted by the execution order's pass, sim_route_execution_order), the
 *   layer's stale prefetches dropped after its last sub-route.
 *
 * Both work on route scratch arrays the host owns (sim_route_scratch borrows them). Units:
 * experts, tokens and slots are indices; gate mass is the sum of the routed gates. Invariants:
 * `active` is strictly ascending; `slot[active[a]] == a`. */
#ifndef MOESIM_CORE_ROUTE_H
#define MOESIM_CORE_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/precision.h"
#include "policies/policy.h"
#include "core/memsys.h"
#include "traces/trace.h"

/* The host's route scratch, borrowed: every array is [E] (experts per layer). */
typedef struct sim_route_scratch {
    uint32_t *stamp;         /* [E] generation an expert was last seen in (a pass's own) */
    uint32_t *stamp_gen;     /* the host's latest generation (bumped by a pass that stamps) */
    uint16_t *active;        /* [E] the route's distinct experts, ascending */
    uint32_t *slot;          /* [E] expert -> its index in active */
    uint32_t *active_tokens; /* [E] tokens routed to active[a] */
    float *active_gate;      /* [E] gate mass routed to active[a] */
    uint8_t *plan;           /* [E] the policy's plan per active expert */
    uint32_t *lep;           /* [E] active[a]'s lep at its planned precision, when it runs */
    uint64_t *seen;          /* [MODEL_MAX_EXPERTS / 64] a bitmap of expert ids, zero between
                                routes (sim_route_active_build clears what it set) */
} sim_route_scratch;

/* Builds the active set of one route so sim and replay hand the policy the same one: the
 * distinct experts of `experts` (skipping TRACE_NO_EXPERT) ascending into rs->active, their slot
 * map, token counts and gate mass (from `gates`, same layout), and the plan reset to
 * POLICY_RUN_SKIP. `experts` and `gates` are [n_slots] (tokens * top-k), borrowed; one_token:
 * they are one token's row, which names each expert at most once. Returns the number of active
 * experts. */
uint32_t sim_route_active_build(const sim_route_scratch *rs, const uint16_t *experts,
                                const float *gates, uint32_t n_slots, bool one_token);

/* Prefetch accounting (FIRM-MoE Eq. 7-8) at the first sub-route of a layer, so sim and replay
 * count prefetch hits the same way: when the layer has prefetched sets (*pf_count > 0), counts
 * the distinct experts of the whole step `step_experts` ([n_step_slots], borrowed) into
 * *pf_active, those also marked in `mark` ([E], the layer's prefetched set S) into *pf_hit, adds
 * *pf_count to *pf_issued_sets, then clears `mark` and *pf_count. Uses the scratch's stamps. */
void sim_route_prefetch_account(const sim_route_scratch *rs, const uint16_t *step_experts,
                                uint32_t n_step_slots, uint8_t *mark, uint32_t E,
                                uint32_t *pf_count, uint64_t *pf_hit, uint64_t *pf_active,
                                uint64_t *pf_issued_sets);

/* What one route's accesses did, for the run's totals (hit rate and precision mix). */
typedef struct sim_route_tally {
    uint64_t accesses; /* (token, slot) pairs whose expert ran */
    uint64_t hits;     /* of those, found resident (or served by an earlier access's fetch) */
    uint64_t skipped;  /* (token, slot) pairs whose expert the plan skipped */
    double gate_hi, gate_lo, gate_skip; /* gate mass run at >= hi_bits, below, skipped */
    double gate_bits; /* gate mass x effective bits per weight of the format run (skipped: 0) */
} sim_route_tally;

/* The gate-mass-weighted mean bits per weight a run's experts ran at (skipped ones at 0 bits):
 * one figure that compares policies whatever they call "hi" (sim/README.md). */
double sim_route_tally_bits_per_weight(const sim_route_tally *t);

/* Counts the route's accesses against the plan once the policy returned, so sim and replay
 * define the precision mix the same way (sim/README.md); a run counts as HI when its format has
 * at least `hi_bits` bits per weight in `q`. Adds to *t all but the hits, which
 * sim_route_execution_order counts. */
void sim_route_tally_accesses(const sim_route_scratch *rs, const uint16_t *experts,
                              const float *gates, uint32_t n_slots, const quant_table *q,
                              const double *bits_of, uint32_t hi_bits, sim_route_tally *t);
/* Effective bits per weight of each format of q (scales and zero points included): the tally's
 * bits_of[PREC_COUNT], computed once per run. */
void sim_route_bits_of(const quant_table *q, double bits_of[PREC_COUNT]);

/* The order the planned experts of the route run in (after sim_route_decide, whose plan check
 * wrote rs->lep), the same for both hosts: resident experts first, then by the issue order of
 * their latest-issued loading part (memsys_loading_seq). Writes the indices into `active` of the
 * experts that run to order ([n_active]), with order_key as scratch ([n_active]); returns their
 * count. Stable: ties keep ascending expert order. On the same pass adds the route's hits to
 * *hits (the tally's): an access is a hit when every part of its expert at the planned precision
 * is resident, or when an earlier access of the same route already counted its fetch. */
uint32_t sim_route_execution_order(const sim_route_scratch *rs, uint32_t n_active, const memsys *ms,
                                   uint32_t *order, uint64_t *order_key, uint64_t *hits);

/* The end of the next sub-route: tokens [i0, i1) of the step's `experts` ([n][K]) in order, as
 * many as keep the distinct experts within `capacity` (at least one token). Uses the scratch's
 * stamps. */
uint32_t sim_route_split(const sim_route_scratch *rs, const uint16_t *experts, uint32_t K,
                         uint32_t i0, uint32_t n, uint32_t capacity);

/* What sim_route_decide needs of its host, borrowed: the policy, the memory system, the step's
 * routing at the layer being routed (sim_route_gather's buffers) and the totals it adds to. */
typedef struct sim_route_host {
    const policy_methods *pm;
    policy *pol;
    memsys *ms;
    const quant_table *quant;
    const double *bits_of;               /* [PREC_COUNT] sim_route_bits_of(quant) */
    moesim_precision precision;          /* expert.precision: HI when the policy names none */
    uint64_t (*now_ns)(const void *ctx); /* the host's clock (virtual, or measured) */
    const void *clock_ctx;
    const uint16_t *experts;   /* [n][K] the step's experts at the layer */
    const float *gates;        /* [n][K] their gates */
    const float *importance;   /* [n] or NULL */
    const uint16_t *la_ids;    /* [n][la_depth][la_k] look-ahead, or NULL (la_depth 0) */
    const float *la_scores;    /* [n][la_depth][la_k], or NULL: ids alone */
    uint32_t top_k, la_depth, la_k;
    sim_route_tally *tally;    /* adds the route's accesses */
    uint64_t *sub_routes;      /* counts the route */
} sim_route_host;

/* Hands tokens [i0, i1) of step `step`'s routing at `layer` (its active set of `n_active` experts
 * built in rs by sim_route_active_build) to the policy's on_route at the host's now, then commits
 * the plan (memsys_run_plan: pins what runs, promotes what it waits for), tallies its accesses at
 * the policy's HI precision and, after the layer's last sub-route, drops the layer's stale
 * prefetches (memsys_end_layer). The plan is left in rs->plan for the host to run. */
void sim_route_decide(const sim_route_host *h, const sim_route_scratch *rs, uint64_t step,
                      uint32_t layer, uint32_t i0, uint32_t i1, uint32_t n_active,
                      bool last_of_layer);

#endif
