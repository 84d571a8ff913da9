/* DyMoE (Huang et al., "DyMoE: Dynamic Expert Orchestration with Mixed-Precision Quantization for
 * Efficient MoE Inference on Edge", [DyMoE]): the pure pieces of
 * the policy, exposed for unit tests. The policy table itself is `policy_dymoe` (dymoe.c).
 *
 *   importance      prefill: heavy-hitter token load (Eq. 1-2); decode: gate score (Eq. 3)
 *   schedule        depth-aware cosine retention r(l) (Eq. 4), t_l critical experts (Eq. 5)
 *   prefetch        look-ahead top-t: token frequency (Eq. 7, prefill), direct (Eq. 8, decode)
 *   cache           mixed-precision LRU, three rules (Sec. 4.4.2)
 *
 * Nothing here allocates, reads a clock or touches the memory system; every function is a plain
 * computation over the arrays it is given (shapes in the comments). */
#ifndef MOESIM_POLICIES_DYMOE_H
#define MOESIM_POLICIES_DYMOE_H

#include <stdbool.h>
#include <stdint.h>

#include "policies/policy.h"

extern const policy_methods policy_dymoe;

/* The knobs, read from section [dymoe] (table in dymoe.c; each field's help cites the paper). */
typedef struct dymoe_knobs {
    double lambda;               /* Eq. 4 */
    double retention;            /* 0: use lambda; else r in [0.5, 1], lambda = 2r - 1 */
    int hi;                      /* index into "bf16", "fp8", "int8", "int4", "int3", "int2" */
    int lo;                      /* same list, then "skip" (0-bit: the expert is not run) */
    bool dyquant;                /* off: every activated expert runs at hi (Table 3 rows 1-3) */
    bool cache;                  /* off: load on demand, nothing kept across layers (row 1) */
    bool prefetch;               /* look-ahead prefetcher (Sec. 4.4.1) */
    uint32_t prefetch_t;         /* Eq. 8's t (decode); 0: by prefetch_t_rule */
    int prefetch_t_rule;         /* dymoe_prefetch_t_rule: "critical" or "top_k" */
    uint32_t prefetch_t_prefill; /* Eq. 7's t (prefill); 0: every predicted expert */
    uint32_t heavy_hitter_k;     /* Eq. 2's k; 0: use heavy_hitter_share */
    double heavy_hitter_share;   /* k = ceil(share * tokens of the step) when heavy_hitter_k = 0 */
    int rounding;                /* dymoe_rounding: "carry" or "ceil" */
    int prefetch_insert;         /* dymoe_prefetch_insert: "cold" or "hot" */
} dymoe_knobs;

/* Where a prefetched expert enters the LRU list of Sec. 4.4.2. */
typedef enum dymoe_prefetch_insert {
    DYMOE_PREFETCH_COLD = 0, /* least recent until first used: recency is the last use, and a
                                prefetch is not a use, so a wrong guess is the next victim */
    DYMOE_PREFETCH_HOT,      /* most recent, as if used when issued */
} dymoe_prefetch_insert;

/* Eq. 8's decode t when prefetch_t = 0. */
typedef enum dymoe_prefetch_t_rule {
    DYMOE_PREFETCH_T_CRITICAL = 0, /* Eq. 5's critical count t_{l+1} over the predicted experts:
                                      the critical experts of layer l+1, at hi */
    DYMOE_PREFETCH_T_TOP_K,        /* the model's top_k, the sub-critical ones at lo */
} dymoe_prefetch_t_rule;

/* How Eq. 5's t_l = ceil(r(l) * M) is turned into an integer count. */
typedef enum dymoe_rounding {
    DYMOE_ROUND_CARRY = 0, /* round to nearest after adding the layer's carried remainder, so the
                              realized share of critical experts over steps equals r(l) */
    DYMOE_ROUND_CEIL,      /* Eq. 5 literally: ceil(r(l) * M) every time */
} dymoe_rounding;

/* Eq. 4: retention ratio r(l) of MoE layer `layer` of `n_layers` for the knob lambda in [0, 1].
 * r(0) = 1, r(L-1) = lambda. With one MoE layer (L - 1 = 0 in the denominator) returns the
 * schedule's average (1 + lambda) / 2 (policies/README.md, dymoe). */
double dymoe_retention_at(double lambda, uint32_t layer, uint32_t n_layers);

/* The average of Eq. 4 over l = 0..L-1 is exactly (1 + lambda) / 2 (the cosine term is symmetric
 * about the middle layer), so the paper's retention ratio r ("the average proportion of Critical
 * experts preserved across layers", Table 2) maps to lambda = 2r - 1. r must be in [0.5, 1]. */
double dymoe_lambda_for_retention(double retention);
double dymoe_retention_for_lambda(double lambda);

/* Eq. 5: the number of critical experts among `m` activated ones at retention r_l.
 * DYMOE_ROUND_CARRY reads and updates `*carry` (the layer's accumulated r_l*m - t, kept in
 * [-0.5, 0.5] unless clamping at 0 or m); DYMOE_ROUND_CEIL ignores it. Result in [0, m]. */
uint32_t dymoe_critical_count(double r_l, uint32_t m, dymoe_rounding rounding, double *carry);

/* The heavy-hitter set size k of Eq. 2 for a step of `n_tokens`: `k_abs` when non-zero, else
 * ceil(share * n_tokens); at most n_tokens. */
uint32_t dymoe_heavy_hitter_k(uint32_t n_tokens, uint32_t k_abs, double share);

/* Eq. 1-2: ranks the tokens by importance s_i (Eq. 1, precomputed in the trace), takes the top
 * `k_hh` (ties: lower token index first) and counts, per expert, the heavy-hitter tokens routed
 * to it. experts: [n_tokens][top_k] (POLICY_NO_EXPERT slots ignored); importance: [n_tokens];
 * counts: [n_experts], overwritten; scratch: [n_tokens]. Returns the number of tokens counted. */
uint32_t dymoe_heavy_hitter_count(uint32_t n_tokens, uint32_t top_k, const uint16_t *experts,
                                  const float *importance, uint32_t k_hh, uint32_t n_experts,
                                  uint32_t *counts, uint32_t *scratch);

/* Orders the activated experts by importance, most important first: key0 descending, then key1,
 * then key2, then the expert id ascending (a total, deterministic order). keys: [n] each (key2
 * may be NULL); ids: [n]; order: [n], receives indices into the arrays. */
void dymoe_rank(uint32_t n, const double *key0, const double *key1, const double *key2,
                const uint16_t *ids, uint32_t *order);

/* Eq. 6-8 at look-ahead distance 1: the experts to prefetch for the next layer, most important
 * first. Each token's first `k_use` predicted candidates for layer l+1 (lookahead_ids
 * [n_tokens][depth][k_pred], scores likewise, descending; distance 1 is index 0) form its s_i
 * (Eq. 6: TopK_k of the approximated gates; k_use = top_k in prefill, t in decode). Each s_i
 * votes once per expert (Eq. 7's c_e); the top `t` by c_e (ties: summed predicted score, then
 * lower id) are written to out [t]. With one token this is Eq. 8's direct top-t by score.
 * count, score, voted: [n_experts] scratch. Returns how many were written (experts with
 * c_e > 0). */
uint32_t dymoe_prefetch_select(uint32_t n_tokens, uint32_t depth, uint32_t k_pred, uint32_t k_use,
                               const uint16_t *lookahead_ids, const float *lookahead_scores,
                               uint32_t n_experts, uint32_t t, uint32_t *count, double *score,
                               uint16_t *voted, uint16_t *out);

/* What the mixed-precision cache holds of one expert: nothing, or exactly one copy (rule 1). */
typedef enum dymoe_tier { DYMOE_TIER_NONE = 0, DYMOE_TIER_HI, DYMOE_TIER_LO } dymoe_tier;

/* The cache's answer to a request for `wanted` (HI or LO) given what it holds (Sec. 4.4.2). */
typedef enum dymoe_cache_action {
    DYMOE_CACHE_HIT = 0,  /* the wanted precision is held: run it */
    DYMOE_CACHE_REUSE_HI, /* rule 3, conservative reuse: LO wanted, HI held: run HI, no I/O */
    DYMOE_CACHE_PROMOTE,  /* rule 2, precision promotion: HI wanted, LO held: a miss; evict the LO
                             copy (rule 1) and load HI */
    DYMOE_CACHE_MISS,     /* nothing held: load the wanted precision */
} dymoe_cache_action;

dymoe_cache_action dymoe_cache_decide(dymoe_tier held, dymoe_tier wanted);

#endif
