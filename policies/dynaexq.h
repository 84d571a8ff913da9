/* DynaExq (Chu et al.; [DynaExq-v1] first version, [DynaExq-v2] revised): the pure pieces of the
 * policy, exposed for unit tests. policies/dynaexq.c wires them to the policy API.
 *
 *   dx_hotness   per-(layer, expert) hotness: the EMA of router probabilities with passive decay
 *                of inactive experts ([DynaExq-v1] Eq. 2, Algorithm 1 lines 4-11), or the revised
 *                per-interval selection counters folded into an EMA ([DynaExq-v2] §3.5 "Hotness
 *                Estimation"). Scores are plain doubles, no units; both modes keep them in [0, 1].
 *   dx_select    the budget-feasible per-layer high-precision set: top-n_l by hotness
 *                ([DynaExq-v2] §3.5 "Budget-feasible Selection", [DynaExq-v1] Algorithm 1 lines
 *                14-15) with the hysteresis margin ([DynaExq-v2] §3.5 "Hysteresis for
 *                Stability"), as a score margin or a rank slack.
 *   dx_budget    the BudgetTracker ([DynaExq-v2] §3.3): try_reserve / release against the expert
 *                budget M and the high-precision upper bound M_hi. Invariant: used_hi <= hi_cap
 *                and used_hi + used_lo <= total, always (bytes).
 *   dx_pool      a pool of fixed-size blocks with a constant-time free list ([DynaExq-v1] §3.4,
 *                [DynaExq-v2] §3.3 "Partitioned pools", "Fixed-granularity allocation"): pool_hi
 *                and pool_lo.
 *   dx_entry     one expert's Versioned Expert Residency entry ([DynaExq-v2] §3.2): the state
 *                machine
 *                Resident-Lo -> Promoting -> (publish) -> Evicting -> Resident-Hi and
 *                Resident-Hi -> Demoting -> (publish) -> Evicting -> Resident-Lo. Invariant: the
 *                published version (what the stable handle resolves to) is always one whose
 *                copy has completed, so the forward pass never waits for a transition.
 *
 * Nothing here reads a clock or does I/O; only the _init functions allocate (freed by the
 * matching _free / _free_all). */
#ifndef MOESIM_POLICIES_DYNAEXQ_H
#define MOESIM_POLICIES_DYNAEXQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policies/policy.h"

/* The policy table, registered under "dynaexq" in policies/registry.c. */
extern const policy_methods policy_dynaexq;

/* ---- knobs (section [dynaexq]; each field's help in dynaexq.c cites its paper source) ---- */

typedef enum dx_hotness_mode {
    DX_HOTNESS_EMA = 0, /* [DynaExq-v1] Eq. 2: per step, S = alpha*S + (1-alpha)*g, decay */
    DX_HOTNESS_COUNT,   /* [DynaExq-v2] §3.5: selection counters per interval, EMA at its end */
} dx_hotness_mode;

typedef enum dx_interval_unit { DX_UNIT_STEPS = 0, DX_UNIT_NS } dx_interval_unit;

typedef enum dx_hysteresis_mode {
    DX_HYST_SCORE = 0, /* additive margin on the score, in units of the uniform-routing score */
    DX_HYST_RANK,      /* rank slack: members stay while ranked < n_l + slack */
} dx_hysteresis_mode;

typedef enum dx_select_mode {
    DX_SELECT_TOPN = 0,  /* [DynaExq-v2] §3.5: per-layer top-n_l every schedule, hysteresis */
    DX_SELECT_THRESHOLD, /* [DynaExq-v1] Alg. 1 line 15 + §3.5: tau_h fixed once the EMA warmed */
} dx_select_mode;

typedef struct dynaexq_knobs {
    int select;        /* dx_select_mode */
    int hotness;       /* dx_hotness_mode */
    double alpha;      /* EMA factor ([DynaExq-v1] Eq. 2; [DynaExq-v2] §3.5) */
    uint64_t interval; /* update period T ([DynaExq-v1] Alg. 1 line 13; [DynaExq-v2] §3.5), in
                          interval_unit */
    int interval_unit; /* dx_interval_unit */
    uint64_t warmup;   /* warm-up before the first selection ([DynaExq-v1] §3.5), interval_unit */
    uint64_t tau_after; /* select = threshold: EMA updates before tau_h is fixed; 0: 1/(1-alpha) */
    double hysteresis; /* margin (score mode) or rank slack (rank mode), [DynaExq-v2] §3.5 */
    int hysteresis_mode;   /* dx_hysteresis_mode */
    int hi, lo;            /* moesim_precision of the two versions ([DynaExq-v2] §3: b_hi, b_lo) */
    uint32_t max_inflight; /* background transitions in flight ([DynaExq-v2] §3.4 backpressure) */
    bool keep_lo;          /* keep the LO version resident under a HI one (not the papers'
                              default, which reclaims it: [DynaExq-v1] §3.3, [DynaExq-v2] §3.1) */
    bool prefetch;         /* [DynaExq-v1] §3.3 cross-layer prefetch: queued promotions of the
                              experts the look-ahead predicts for the next layer start first */
} dynaexq_knobs;

/* ---- hotness ---- */

typedef struct dx_hotness {
    dx_hotness_mode mode;
    double alpha;
    uint32_t n_layers, n_experts, top_k;
    double *score;     /* [n_layers][n_experts] S_i */
    uint64_t *count;   /* [n_layers][n_experts] selections in the current interval (count mode) */
    uint64_t *tokens;  /* [n_layers] tokens routed in the current interval (count mode) */
    double *step_gate; /* [n_layers][n_experts] gate mass routed in the current step (ema) */
    uint64_t *step_tokens; /* [n_layers] tokens routed in the current step (ema) */
} dx_hotness;

/* Allocates zeroed scores; free with dx_hotness_free. */
void dx_hotness_init(dx_hotness *h, dx_hotness_mode mode, double alpha, uint32_t n_layers,
                     uint32_t n_experts, uint32_t top_k);
void dx_hotness_free(dx_hotness *h);

/* One route of one layer (a step's layer may come in several sub-routes): `n_active` activated
 * experts (ascending ids) with the tokens and the gate mass routed to each, out of `n_tokens`
 * tokens. Only accumulates: the step's gate mass (EMA mode) and the interval's counters. */
void dx_hotness_observe(dx_hotness *h, uint32_t layer, uint32_t n_tokens, uint32_t n_active,
                        const uint16_t *active, const uint32_t *active_tokens,
                        const float *active_gate);

/* End of a forward pass (a step). EMA mode applies Eq. 2 to every expert routed to in the step
 * with g_i = its gate mass / the layer's tokens, and the passive decay S = alpha*S to every other
 * expert (Algorithm 1 lines 5-10); count mode has nothing to do per step. */
void dx_hotness_end_step(dx_hotness *h);

/* End of an update interval: count mode folds each counter into the score,
 * S = alpha*S + (1-alpha)*count/tokens, and resets the counters; EMA mode has nothing to fold. */
void dx_hotness_close_interval(dx_hotness *h);

/* The score one expert would hold if routing were uniform (1/E for gate probabilities, k/E for
 * selection shares): the unit of the score-mode hysteresis margin. */
double dx_hotness_uniform_score(const dx_hotness *h);

static inline double dx_hotness_score(const dx_hotness *h, uint32_t layer, uint32_t expert) {
    return h->score[(size_t)layer * h->n_experts + expert];
}

/* ---- selection ---- */

/* Updates `in_set` ([n] the layer's current high-precision set) to the next target of at most
 * `cap` experts: top-`cap` by score (only experts with a positive score are eligible), where a
 * challenger replaces a member only past the hysteresis (score mode: challenger's score >
 * member's + margin; rank mode: members stay while ranked < cap + rank_slack, challengers must
 * rank < cap). `order` ([n], dx_order_by_score) is re-sorted for these scores. Returns how
 * many memberships changed. */
uint32_t dx_select_layer(const double *score, uint32_t n, uint32_t cap, dx_hysteresis_mode mode,
                         double margin, uint32_t rank_slack, bool *in_set, uint32_t *order);

/* [DynaExq-v1] §3.5: "tau_h = top(n_hot, S_i)": the `cap`-th highest score of the layer ([n]
 * scores), +infinity when cap is 0. `scratch` holds 2*n entries. */
double dx_threshold_of(const double *score, uint32_t n, uint32_t cap, uint32_t *scratch);

/* [DynaExq-v1] Algorithm 1 line 15: sets `in_set` ([n]) to the top-`cap` experts with score >=
 * tau (and a positive score: an expert never routed to is not promoted). No hysteresis: in
 * [DynaExq-v1] the fixed threshold and the EMA are what keep the set stable. `order` ([n],
 * dx_order_by_score) is re-sorted for these scores. Returns how many memberships changed. */
uint32_t dx_select_threshold(const double *score, uint32_t n, uint32_t cap, double tau,
                             bool *in_set, uint32_t *order);

/* Re-sorts order[0, n), a permutation of 0..n-1 (the layer's experts; at first any, then the
 * previous schedule's), by score descending, ties by ascending id: cheap when it is nearly
 * sorted already. */
void dx_order_by_score(const double *score, uint32_t n, uint32_t *order);

/* Sorts ids [n] by score descending, ties by ascending id (deterministic). scratch: [n]. */
void dx_sort_by_score(const double *score, uint32_t *ids, uint32_t n, uint32_t *scratch);

/* ---- budget tracker ---- */

typedef enum dx_version { DX_LO = 0, DX_HI = 1 } dx_version;

typedef struct dx_budget {
    uint64_t total_bytes;   /* M: the expert budget of the scope */
    uint64_t hi_cap_bytes;  /* M_hi: upper bound of high-precision residency */
    uint64_t used_bytes[2]; /* [dx_version] reserved */
    uint64_t peak_hi_bytes, peak_total_bytes;
    uint64_t refusals;
} dx_budget;

void dx_budget_init(dx_budget *b, uint64_t total_bytes, uint64_t hi_cap_bytes);
/* Reserves `bytes` for a version: HI must fit both M_hi and M, LO must fit M. All or nothing;
 * false (and refusals + 1) when it does not fit. */
bool dx_budget_try_reserve(dx_budget *b, dx_version v, uint64_t bytes);
/* Returns a reservation (asserts it was held). */
void dx_budget_release(dx_budget *b, dx_version v, uint64_t bytes);

/* ---- fixed-size block pool ---- */

#define DX_NO_BLOCK UINT32_MAX

typedef struct dx_pool {
    uint64_t block_bytes;
    uint32_t n_blocks, n_free;
    uint32_t *free_list; /* [n_blocks] stack of free block ids; top at n_free - 1 */
    uint8_t *used;       /* [n_blocks] */
} dx_pool;

/* Allocates the index (no device memory: this is the CPU-side index of [DynaExq-v1] §3.4). */
void dx_pool_init(dx_pool *p, uint32_t n_blocks, uint64_t block_bytes);
void dx_pool_free_all(dx_pool *p); /* releases the index */
/* A free block in O(1) (lowest ids first on a fresh pool), or DX_NO_BLOCK when full. */
uint32_t dx_pool_alloc(dx_pool *p);
void dx_pool_release(dx_pool *p, uint32_t block); /* asserts the block was allocated */

/* ---- Versioned Expert Residency ---- */

typedef enum dx_state {
    DX_RESIDENT_LO = 0, /* LO present, handle -> LO */
    DX_RESIDENT_HI,     /* HI present (LO too when keep_lo), handle -> HI */
    DX_PROMOTING,       /* HI being copied on the migration stream, handle still -> LO */
    DX_DEMOTING,        /* LO being copied back (or already resident), handle still -> HI */
    DX_EVICTING,        /* handle switched; the old version's storage is being reclaimed */
    DX_STATE_COUNT
} dx_state;

typedef struct dx_entry {
    uint8_t state;     /* dx_state */
    uint8_t published; /* dx_version the stable handle resolves to */
    uint8_t copied;    /* Promoting/Demoting: the new version's copy completed (awaits publish) */
    uint8_t evicting;  /* Evicting: the dx_version being reclaimed */
    uint8_t landed;    /* Promoting/Demoting: parts (1 << expert_part) of the copy completed */
    uint32_t block[2]; /* [dx_version] pool block holding each version, DX_NO_BLOCK if none */
} dx_entry;

const char *dx_state_name(dx_state s); /* "resident-hi", "promoting", ... */

/* A fresh entry: Resident-Lo, published LO, holding LO block `lo_block`. */
void dx_entry_init(dx_entry *e, uint32_t lo_block);
/* Resident-Lo -> Promoting, the HI copy lands in `hi_block`; the handle stays on LO. */
void dx_entry_start_promote(dx_entry *e, uint32_t hi_block);
/* Resident-Hi -> Demoting; `lo_block` holds the LO version (being copied, or kept). */
void dx_entry_start_demote(dx_entry *e, uint32_t lo_block);
/* The copy started by the transition completed: the new version may be published. */
void dx_entry_copy_done(dx_entry *e);
/* Publication at a window boundary ([DynaExq-v2] §3.1, §3.4): the handle switches to the copied
 * version. The old version then goes to Evicting, except a LO version under `keep_lo` (-> Resident-Hi).
 * Returns the version to reclaim, or -1 when none. */
int dx_entry_publish(dx_entry *e, bool keep_lo);
/* The old version's storage was reclaimed: Evicting -> Resident-Hi / Resident-Lo. Returns the
 * block that held it (for the pool). */
uint32_t dx_entry_evicted(dx_entry *e);
/* True when the entry holds storage (resident or being copied) for version v. */
bool dx_entry_holds(const dx_entry *e, dx_version v);

#endif
