/* dynaexq: DynaExq, "Dynamic Expert Quantization for Scalable Mixture-of-Experts Inference"
 * (Chu et al.; [DynaExq-v1] first version, [DynaExq-v2] revised). Expert precision is a runtime
 * resource: every expert keeps a usable low-precision (LO) version, and a per-layer set of hot
 * experts runs at high precision (HI) within a fixed HBM budget.
 *
 * The loop, step by step (policy.h callbacks):
 *   warmup: the LO version of every expert is loaded (layer order); create checked it fits.
 *   begin_step: window boundary ([DynaExq-v2] §3.1 "visible at the next iteration"): completed
 * copies are published, the old versions evicted, the queues pumped. on_route: hotness observation
 * (accumulated over the step's sub-routes); the plan is the published version of each activated
 * expert, never a version in flight, so the forward pass never waits for a promotion ([DynaExq-v1]
 * §3.3, [DynaExq-v2] §3.2). on_transfer_done: a background copy finished: the version is marked
 * complete and the next queued transition starts (the migration stream stays busy up to
 * max_inflight). end_step: hotness update ([DynaExq-v1] Eq. 2 / Algorithm 1, after each forward
 * pass); at every interval (steps or ns) after the warm-up ([DynaExq-v1] §3.5): per-layer top-n_l
 * selection with hysteresis ([DynaExq-v2] §3.5), promotion and demotion queues rebuilt, pump.
 *
 * Memory ([DynaExq-v2] §3.3): a BudgetTracker per pool scope (one for all layers, or one per layer
 * when cache.experts_per_layer fixes per-layer pools) with M = the expert budget and M_hi = n_hi *
 * S_hi; pool_hi and pool_lo hand out fixed-size blocks (one expert version each). Every background
 * load is admitted by try_reserve first, then by the mechanism (policy_mem load may still refuse);
 * a refused promotion stays queued (backpressure). Demotions are pumped before promotions and
 * evictions before both, so a tight budget frees capacity first
 * ([DynaExq-v2] §3.4). Resource-aware initialization ([DynaExq-v1] §3.5): the largest n_hi with
 *     n_hi * S_hi + (N - n_hi) * S_lo + max_inflight * S_lo <= M
 * (the last term is [DynaExq-v1] §3.4's "small transient buffer": an expert holds both versions
 * while its transition is in flight), or n_hi * S_hi + N * S_lo <= M with keep_lo; split evenly
 * over the layers (remainder to the first layers). All sizes in bytes, times in ns. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "policies/dynaexq.h"

/* ---- knobs ---- */

static const char *const select_choices[] = {"topn", "threshold", NULL};
static const char *const hotness_choices[] = {"ema", "count", NULL};
static const char *const unit_choices[] = {"steps", "ns", NULL};
static const char *const hyst_choices[] = {"score", "rank", NULL};
/* in moesim_precision order (checked against precision_name at create) */
static const char *const prec_choices[] = {"bf16", "fp8", "int8", "int4", "int3", "int2", NULL};

/* clang-format off */
#define K(key, type, member, lo, hi, choices, def, help) \
    {"dynaexq", key, type, offsetof(dynaexq_knobs, member), 0, false, lo, hi, choices, def, help}
static const config_field dynaexq_knob_fields[] = {
    K("hotness", CONFIG_ENUM, hotness, 1, 0, hotness_choices, "ema",
      "hotness estimator: ema = [DynaExq-v1] Eq. 2 / Algorithm 1 (router probabilities, per step, "
      "passive "
      "decay); count = [DynaExq-v2] Sec. 3.5 (selection counters per interval, EMA at interval "
      "end)"),
    K("alpha", CONFIG_F64, alpha, 0, 0.9999, NULL, "0.99",
      "EMA factor alpha of S = alpha*S + (1-alpha)*g ([DynaExq-v1] Eq. 2, [DynaExq-v2] Sec. 3.5); "
      "per step (ema) "
      "or per interval (count); papers give no value"),
    K("interval", CONFIG_U64, interval, 1, 1e18, NULL, "16",
      "update period T of the precision schedule ([DynaExq-v1] Algorithm 1 line 13; [DynaExq-v2] "
      "Sec. 3.5 uses "
      "time), in interval_unit"),
    K("interval_unit", CONFIG_ENUM, interval_unit, 1, 0, unit_choices, "steps",
      "unit of interval and warmup: steps ([DynaExq-v1] Algorithm 1) or ns of host time "
      "([DynaExq-v2] Sec. 3.5)"),
    K("warmup", CONFIG_U64, warmup, 0, 1e18, NULL, "16",
      "warm-up collecting hotness before the first top-n_hot selection ([DynaExq-v1] Sec. 3.5), in "
      "interval_unit"),
    K("select", CONFIG_ENUM, select, 1, 0, select_choices, "topn",
      "high-precision set: topn = [DynaExq-v2] Sec. 3.5 (per-layer top-n_l at every schedule, with "
      "hysteresis); threshold = [DynaExq-v1] Algorithm 1 line 15 and Sec. 3.5 (tau_h = the n_l-th "
      "score "
      "once the EMA has warmed up (tau_after), then fixed; the top n_l with S >= tau_h; no "
      "hysteresis)"),
    K("tau_after", CONFIG_U64, tau_after, 0, 1e18, NULL, "0",
      "select = threshold: EMA updates (steps with hotness = ema, intervals with count) before "
      "tau_h is fixed, [DynaExq-v1] Sec. 3.5's warm-up of the hotness scores; 0: the EMA horizon "
      "1/(1-alpha); tau_h is then bias-corrected to the steady scale (see README)"),
    K("hysteresis", CONFIG_F64, hysteresis, 0, 1e6, NULL, "0.25",
      "hysteresis margin ([DynaExq-v2] Sec. 3.5): score mode, in units of the uniform-routing "
      "score "
      "(1/E ema, k/E count); rank mode, the rank slack (an integer)"),
    K("hysteresis_mode", CONFIG_ENUM, hysteresis_mode, 1, 0, hyst_choices, "score",
      "score: additive margin on hotness; rank: rank slack ([DynaExq-v2] Sec. 3.5)"),
    K("hi", CONFIG_ENUM, hi, 1, 0, prec_choices, "bf16",
      "precision of hot experts ([DynaExq-v2] Sec. 5.1: FP16 usually, INT4 for Qwen3-80B)"),
    K("lo", CONFIG_ENUM, lo, 1, 0, prec_choices, "int4",
      "precision of the always-usable fallback ([DynaExq-v2] Sec. 5.1: INT4, or INT2 for "
      "Qwen3-80B)"),
    K("max_inflight", CONFIG_U32, max_inflight, 1, 4096, NULL, "4",
      "background transitions in flight at once: migration-stream backpressure ([DynaExq-v2] Sec. "
      "3.4) "
      "and the transient buffer of [DynaExq-v1] Sec. 3.4"),
    K("keep_lo", CONFIG_BOOL, keep_lo, 1, 0, NULL, "false",
      "keep the LO version resident under a HI one (papers: reclaimed after publish, [DynaExq-v1] "
      "Sec. "
      "3.3 / [DynaExq-v2] Sec. 3.1)"),
    K("prefetch", CONFIG_BOOL, prefetch, 1, 0, NULL, "false",
      "cross-layer prefetch ([DynaExq-v1] Sec. 3.3: \"prefetches experts predicted to become hot "
      "by "
      "leveraging cross-layer activation correlations\"): queued promotions of the experts the "
      "look-ahead predicts for layer l+1 go to the head of the migration queue; [DynaExq-v2] has "
      "none"),
};
#undef K
/* clang-format on */

/* ---- state ---- */

#define DX_REPORT_FIELDS 19

struct policy {
    policy_params params; /* copy; params.model borrowed */
    policy_mem_view mem;
    dynaexq_knobs knobs;
    uint32_t n_layers, n_experts;
    moesim_precision prec[2]; /* [dx_version] */
    uint64_t size_bytes[2];   /* [dx_version] one expert version, all parts */
    bool per_layer;           /* pools and budgets per layer (cache.experts_per_layer) */
    uint32_t n_scopes;        /* 1 or n_layers */
    dx_budget *budget;        /* [n_scopes] */
    dx_pool *pool;            /* [n_scopes][2] */
    uint32_t *cap;            /* [n_layers] n_l: high-precision slots of the layer */
    uint32_t hi_slots;        /* sum of cap */
    dx_hotness hot;
    dx_entry *entry;                /* [n_layers][n_experts] */
    bool *in_set;                   /* [n_layers][n_experts] the scheduler's target high set */
    double *tau;                    /* [n_layers] [DynaExq-v1]'s fixed tau_h (select = threshold) */
    bool tau_fixed;                 /* tau has been fixed (select = threshold) */
    uint64_t tau_fixed_step;        /* steps done when it was */
    uint32_t *promote_q, n_promote; /* [n_layers * n_experts] flat ids, hottest first */
    uint32_t *demote_q, n_demote;   /* coldest first */
    uint32_t *evict_q, n_evict;     /* entries whose eviction the mechanism refused */
    uint32_t *publish_q, n_publish; /* entries whose copy completed, awaiting the window */
    uint32_t *scratch;              /* [2 * max(n_experts, n_layers * n_experts)] */
    uint32_t *order;                /* [n_layers * n_experts] each layer's experts by score at
                                       the last schedule (dx_order_by_score) */
    double *sort_key;               /* [n_layers * n_experts] */
    uint8_t *deferred;              /* [n_layers * n_experts] refused admission since queued */
    uint8_t *blocked;               /* [n_scopes][2] a pump found no room for this version */
    uint8_t *predicted;             /* [n_experts] look-ahead flags of layer l+1 (prefetch) */
    uint32_t inflight;
    bool filled;  /* the LO versions were loaded */
    bool started; /* t0 recorded */
    bool warm;    /* the warm-up is over (first selection made) */
    uint64_t t0_ns, last_sched_ns, steps_done, last_sched_step;
    /* figures for policy_report */
    uint64_t schedules, promotions, promotions_published, demotions, demotions_published;
    uint64_t evictions, evict_refused, mech_refused, stale_runs, peak_inflight, set_changes;
    uint64_t n_deferred;              /* transitions admission deferred (once per queuing) */
    uint64_t prefetch_moved;          /* queued promotions moved ahead by a prediction */
    uint64_t hi_bytes, peak_hi_bytes; /* HI reservations over all scopes */
    double gate_hi, gate_all;
};

static size_t flat(const policy *p, uint32_t l, uint32_t e) { return (size_t)l * p->n_experts + e; }
static uint32_t scope_of(const policy *p, uint32_t l) { return p->per_layer ? l : 0; }
static dx_pool *pool_of(policy *p, uint32_t l, dx_version v) {
    return &p->pool[scope_of(p, l) * 2 + v];
}

static uint64_t version_bytes(const policy_params *pp, moesim_precision prec) {
    uint64_t s = 0;
    for (int part = 0; part < PART_COUNT; part++) {
        if (pp->part_bytes[prec][part] == 0) return 0; /* the host cannot store it */
        s += pp->part_bytes[prec][part];
    }
    return s;
}

/* The largest n_hi for a scope of `n` experts and `budget` bytes ([DynaExq-v1] §3.5). */
static uint64_t hot_capacity(uint64_t n, uint64_t budget, uint64_t s_hi, uint64_t s_lo,
                             uint64_t transient, bool keep_lo) {
    uint64_t lo_all = n * s_lo;
    if (budget < lo_all) return 0;
    if (keep_lo) {
        uint64_t k = (budget - lo_all) / s_hi;
        return k < n ? k : n;
    }
    if (budget - lo_all < transient) return 0;
    uint64_t k = (budget - lo_all - transient) / (s_hi - s_lo);
    return k < n ? k : n;
}

static moesim_status dx_create(const policy_params *pp, const void *knobs_v, policy_mem_view mem,
                               policy **out, moesim_error *err) {
    const dynaexq_knobs *k = knobs_v;
    *out = NULL;
    for (int i = 0; i < PREC_COUNT; i++)
        MOESIM_ASSERT(strcmp(prec_choices[i], precision_name((moesim_precision)i)) == 0);
    MOESIM_ASSERT(pp->n_layers > 0 && pp->n_experts > 0 && pp->n_experts <= MODEL_MAX_EXPERTS);
    moesim_precision hi = (moesim_precision)k->hi, lo = (moesim_precision)k->lo;
    uint64_t s_hi = version_bytes(pp, hi), s_lo = version_bytes(pp, lo);
    if (s_hi == 0)
        return moesim_fail(err, MOESIM_EINPUT,
                           "[dynaexq] hi: this run cannot store experts at %s; expected a "
                           "precision the quantization table and host support",
                           precision_name(hi));
    if (s_lo == 0)
        return moesim_fail(err, MOESIM_EINPUT,
                           "[dynaexq] lo: this run cannot store experts at %s; expected a "
                           "precision the quantization table and host support",
                           precision_name(lo));
    if (s_hi <= s_lo)
        return moesim_fail(err, MOESIM_EINPUT,
                           "[dynaexq] hi: expected a precision larger than lo (%s, %llu bytes per "
                           "expert), got %s (%llu bytes per expert)",
                           precision_name(lo), (unsigned long long)s_lo, precision_name(hi),
                           (unsigned long long)s_hi);
    if (k->hysteresis_mode == DX_HYST_RANK &&
        (k->hysteresis != (double)(uint32_t)k->hysteresis || k->hysteresis > pp->n_experts))
        return moesim_fail(err, MOESIM_EINPUT,
                           "[dynaexq] hysteresis: rank mode expects a whole number of ranks in "
                           "[0, %u], got %g",
                           pp->n_experts, k->hysteresis);

    if (k->prefetch && pp->lookahead_depth == 0)
        return moesim_fail(
            err, MOESIM_EINPUT,
            "[dynaexq] prefetch: needs look-ahead predictions ([DynaExq-v1] Sec. 3.3's "
            "cross-layer correlations) and the run has none; expected a trace "
            "with predictions, predictor.depth >= 1, or dynaexq.prefetch=off");

    bool per_layer = pp->experts_per_layer > 0;
    uint32_t L = pp->n_layers, E = pp->n_experts, n_scopes = per_layer ? L : 1;
    uint64_t scope_experts = per_layer ? E : (uint64_t)L * E;
    uint64_t scope_budget = pp->expert_budget_bytes;
    if (per_layer) {
        uint64_t s_pool = version_bytes(pp, pp->precision);
        MOESIM_ASSERT(s_pool > 0);
        scope_budget = (uint64_t)pp->experts_per_layer * s_pool;
    }
    /* Versioned Expert Residency needs a usable version of every expert at all times: the LO
     * version of every expert must fit ([DynaExq-v2] §3: "a low-precision fallback"). */
    if (scope_experts * s_lo > scope_budget)
        return moesim_fail(
            err, MOESIM_EINPUT,
            "[dynaexq] lo: the %s version of every expert must fit in HBM: %llu experts x %llu "
            "bytes = %llu bytes, but the expert budget is %llu bytes%s; expected a larger "
            "memory.budget_gb%s or a smaller dynaexq.lo",
            precision_name(lo), (unsigned long long)scope_experts, (unsigned long long)s_lo,
            (unsigned long long)(scope_experts * s_lo), (unsigned long long)scope_budget,
            per_layer ? " per layer" : "", per_layer ? " / cache.experts_per_layer" : "");

    policy *p = moesim_xcalloc(1, sizeof *p);
    p->params = *pp;
    p->mem = mem;
    p->knobs = *k;
    p->n_layers = L;
    p->n_experts = E;
    p->prec[DX_LO] = lo;
    p->prec[DX_HI] = hi;
    p->size_bytes[DX_LO] = s_lo;
    p->size_bytes[DX_HI] = s_hi;
    p->per_layer = per_layer;
    p->n_scopes = n_scopes;

    uint64_t transient = k->keep_lo ? 0 : (uint64_t)k->max_inflight * s_lo;
    uint64_t n_hot = hot_capacity(scope_experts, scope_budget, s_hi, s_lo, transient, k->keep_lo);
    p->cap = moesim_xcalloc(L, sizeof *p->cap);
    for (uint32_t l = 0; l < L; l++) {
        if (per_layer) {
            p->cap[l] = (uint32_t)n_hot;
        } else {
            uint64_t c = n_hot / L + (l < n_hot % L ? 1 : 0);
            p->cap[l] = (uint32_t)(c < E ? c : E);
        }
        p->hi_slots += p->cap[l];
    }
    p->budget = moesim_xcalloc(n_scopes, sizeof *p->budget);
    p->pool = moesim_xcalloc((size_t)n_scopes * 2, sizeof *p->pool);
    for (uint32_t s = 0; s < n_scopes; s++) {
        uint32_t hi_blocks = per_layer ? p->cap[s] : p->hi_slots;
        dx_budget_init(&p->budget[s], scope_budget, (uint64_t)hi_blocks * s_hi);
        dx_pool_init(&p->pool[s * 2 + DX_HI], hi_blocks, s_hi);
        dx_pool_init(&p->pool[s * 2 + DX_LO], (uint32_t)scope_experts, s_lo);
    }
    dx_hotness_init(&p->hot, (dx_hotness_mode)k->hotness, k->alpha, L, E, pp->top_k);
    size_t n = (size_t)L * E;
    p->entry = moesim_xcalloc(n, sizeof *p->entry);
    for (size_t i = 0; i < n; i++) dx_entry_init(&p->entry[i], DX_NO_BLOCK);
    p->in_set = moesim_xcalloc(n, sizeof *p->in_set);
    p->predicted = moesim_xcalloc(E, sizeof *p->predicted);
    p->tau = moesim_xcalloc(L, sizeof *p->tau);
    p->promote_q = moesim_xcalloc(n, sizeof *p->promote_q);
    p->demote_q = moesim_xcalloc(n, sizeof *p->demote_q);
    p->evict_q = moesim_xcalloc(n, sizeof *p->evict_q);
    p->publish_q = moesim_xcalloc(n, sizeof *p->publish_q);
    p->scratch = moesim_xcalloc(2 * n, sizeof *p->scratch);
    p->order = moesim_xmalloc(n * sizeof *p->order);
    for (size_t i = 0; i < n; i++) p->order[i] = (uint32_t)(i % E); /* each layer: 0..E-1 */
    p->sort_key = moesim_xcalloc(n, sizeof *p->sort_key);
    p->deferred = moesim_xcalloc(n, sizeof *p->deferred);
    p->blocked = moesim_xcalloc((size_t)n_scopes * 2, sizeof *p->blocked);
    *out = p;
    return MOESIM_OK;
}

static void dx_destroy(policy *p) {
    if (!p) return;
    for (uint32_t s = 0; s < p->n_scopes * 2; s++) dx_pool_free_all(&p->pool[s]);
    free(p->pool);
    free(p->budget);
    free(p->cap);
    dx_hotness_free(&p->hot);
    free(p->entry);
    free(p->in_set);
    free(p->tau);
    free(p->predicted);
    free(p->promote_q);
    free(p->demote_q);
    free(p->evict_q);
    free(p->publish_q);
    free(p->scratch);
    free(p->order);
    free(p->sort_key);
    free(p->deferred);
    free(p->blocked);
    free(p);
}

/* ---- memory actions ---- */

/* Loads the LO version of every expert, layer by layer (the fallback every handle starts on). */
static void fill_lo(policy *p) {
    if (p->filled) return;
    p->filled = true;
    for (uint32_t l = 0; l < p->n_layers; l++) {
        for (uint32_t e = 0; e < p->n_experts; e++) {
            dx_entry *en = &p->entry[flat(p, l, e)];
            bool ok =
                dx_budget_try_reserve(&p->budget[scope_of(p, l)], DX_LO, p->size_bytes[DX_LO]);
            MOESIM_ASSERT(ok); /* create checked that every LO version fits */
            uint32_t b = dx_pool_alloc(pool_of(p, l, DX_LO));
            MOESIM_ASSERT(b != DX_NO_BLOCK);
            dx_entry_init(en, b);
            policy_mem_result r =
                p->mem.ops->load(p->mem.mem, l, e, p->prec[DX_LO], POLICY_PARTS_ALL, POLICY_DEMAND);
            MOESIM_ASSERT(r != POLICY_REFUSED); /* the mechanism has the same budget */
        }
    }
}

/* Reclaims the old version of an Evicting entry; false when the mechanism refuses (in use). */
static bool try_evict(policy *p, uint32_t l, uint32_t e) {
    dx_entry *en = &p->entry[flat(p, l, e)];
    MOESIM_ASSERT(en->state == DX_EVICTING);
    dx_version old = (dx_version)en->evicting;
    policy_mem_result r = p->mem.ops->evict(p->mem.mem, l, e, p->prec[old], POLICY_PARTS_ALL);
    if (r == POLICY_REFUSED) {
        p->evict_refused++;
        return false;
    }
    uint32_t block = dx_entry_evicted(en);
    dx_pool_release(pool_of(p, l, old), block);
    dx_budget_release(&p->budget[scope_of(p, l)], old, p->size_bytes[old]);
    if (old == DX_HI) p->hi_bytes -= p->size_bytes[DX_HI];
    p->evictions++;
    return true;
}

/* Starts a background copy of version v of (l, e) after admission; false when refused. */
static bool start_copy(policy *p, uint32_t l, uint32_t e, dx_version v) {
    dx_budget *b = &p->budget[scope_of(p, l)];
    if (!dx_budget_try_reserve(b, v, p->size_bytes[v]))
        return false; /* [DynaExq-v2] §3.3 try_reserve */
    uint32_t block = dx_pool_alloc(pool_of(p, l, v));
    MOESIM_ASSERT(block != DX_NO_BLOCK); /* pools are sized like the tracker's caps */
    policy_mem_result r =
        p->mem.ops->load(p->mem.mem, l, e, p->prec[v], POLICY_PARTS_ALL, POLICY_BACKGROUND);
    if (r == POLICY_REFUSED) { /* the mechanism's own admission */
        dx_pool_release(pool_of(p, l, v), block);
        dx_budget_release(b, v, p->size_bytes[v]);
        p->mech_refused++;
        return false;
    }
    dx_entry *en = &p->entry[flat(p, l, e)];
    if (v == DX_HI) {
        dx_entry_start_promote(en, block);
        p->promotions++;
        p->hi_bytes += p->size_bytes[DX_HI];
        if (p->hi_bytes > p->peak_hi_bytes) p->peak_hi_bytes = p->hi_bytes;
    } else {
        dx_entry_start_demote(en, block);
        p->demotions++;
    }
    if (r == POLICY_ALREADY) { /* resident already (cannot happen with our bookkeeping) */
        MOESIM_ASSERT(p->mem.ops->state(p->mem.mem, l, e, p->prec[v], PART_DOWN) != POLICY_ABSENT);
        dx_entry_copy_done(en);
        p->publish_q[p->n_publish++] = (uint32_t)flat(p, l, e);
        return true;
    }
    p->inflight++;
    if (p->inflight > p->peak_inflight) p->peak_inflight = p->inflight;
    return true;
}

/* Admission of one queued transition: the tracker (then the mechanism) must take version v.
 * Once a version found no room in a scope during this pump, the rest of that scope waits
 * without asking again (same block size, same answer). */
static bool admit(policy *p, uint32_t id, dx_version v) {
    uint32_t l = id / p->n_experts, e = id % p->n_experts;
    uint8_t *blocked = &p->blocked[scope_of(p, l) * 2 + v];
    if (!*blocked && start_copy(p, l, e, v)) return true;
    *blocked = 1;
    if (!p->deferred[id]) { /* counted once per time it was queued */
        p->deferred[id] = 1;
        p->n_deferred++;
    }
    return false;
}

/* The transition pipeline ([DynaExq-v2] §3.4): evictions first, then demotions (they free
 * high-precision capacity), then promotions, up to max_inflight copies on the migration stream.
 * Entries the budget does not admit stay queued in order (backpressure). */
static void pump(policy *p) {
    memset(p->blocked, 0, (size_t)p->n_scopes * 2);
    uint32_t kept = 0;
    for (uint32_t i = 0; i < p->n_evict; i++) {
        uint32_t id = p->evict_q[i];
        if (!try_evict(p, id / p->n_experts, id % p->n_experts)) p->evict_q[kept++] = id;
    }
    p->n_evict = kept;

    kept = 0;
    for (uint32_t i = 0; i < p->n_demote; i++) {
        uint32_t id = p->demote_q[i];
        dx_entry *en = &p->entry[id];
        if (en->state != DX_RESIDENT_HI || p->in_set[id]) continue; /* stale: drop */
        if (p->knobs.keep_lo) {
            /* the LO version never left: the handle switches at the next window */
            dx_entry_start_demote(en, en->block[DX_LO]);
            dx_entry_copy_done(en);
            p->publish_q[p->n_publish++] = id;
            p->demotions++;
            continue;
        }
        if (p->inflight >= p->knobs.max_inflight || !admit(p, id, DX_LO)) p->demote_q[kept++] = id;
    }
    p->n_demote = kept;

    kept = 0;
    for (uint32_t i = 0; i < p->n_promote; i++) {
        uint32_t id = p->promote_q[i];
        dx_entry *en = &p->entry[id];
        if (en->state != DX_RESIDENT_LO || !p->in_set[id]) continue; /* stale: drop */
        if (p->inflight >= p->knobs.max_inflight || !admit(p, id, DX_HI)) p->promote_q[kept++] = id;
    }
    p->n_promote = kept;
}

/* Window boundary: publish every completed copy, then reclaim the old versions. */
static void publish_ready(policy *p) {
    for (uint32_t i = 0; i < p->n_publish; i++) {
        uint32_t id = p->publish_q[i], l = id / p->n_experts, e = id % p->n_experts;
        dx_entry *en = &p->entry[id];
        bool promoted = en->state == DX_PROMOTING;
        int old = dx_entry_publish(en, p->knobs.keep_lo);
        if (promoted)
            p->promotions_published++;
        else
            p->demotions_published++;
        if (old >= 0 && !try_evict(p, l, e)) p->evict_q[p->n_evict++] = id;
    }
    p->n_publish = 0;
}

/* ---- scheduling ([DynaExq-v1] Algorithm 1 PRECISIONSCHEDULE; [DynaExq-v2] §3.5) ---- */

/* Layer l's experts by score at the last schedule. */
static uint32_t *order_of(policy *p, uint32_t l) { return p->order + flat(p, l, 0); }

static void sort_ids_by_key(policy *p, uint32_t *ids, uint32_t n, bool ascending) {
    /* keys are hotness scores; ascending order sorts the negated keys */
    for (uint32_t i = 0; i < n; i++) {
        double s = dx_hotness_score(&p->hot, ids[i] / p->n_experts, ids[i] % p->n_experts);
        p->sort_key[ids[i]] = ascending ? -s : s;
    }
    dx_sort_by_score(p->sort_key, ids, n, p->scratch);
}

static void schedule(policy *p) {
    dx_hotness_close_interval(&p->hot);
    p->schedules++;
    double margin = p->knobs.hysteresis * dx_hotness_uniform_score(&p->hot);
    uint32_t slack = p->knobs.hysteresis_mode == DX_HYST_RANK ? (uint32_t)p->knobs.hysteresis : 0;
    /* select = threshold: an EMA from zero holds 1 - alpha^u of its steady value after u updates
     * (15 % after 16 steps at alpha 0.99): tau_h is fixed after tau_after updates (default the
     * horizon 1/(1 - alpha)) and divided by that share, so it is on the steady scale */
    uint64_t updates = p->knobs.hotness == DX_HOTNESS_COUNT ? p->schedules : p->steps_done;
    uint64_t after =
        p->knobs.tau_after ? p->knobs.tau_after : (uint64_t)ceil(1.0 / (1.0 - p->knobs.alpha));
    bool fix_tau = p->knobs.select == DX_SELECT_THRESHOLD && !p->tau_fixed && updates >= after;
    double tau_debias = 1.0 - pow(p->knobs.alpha, (double)updates);
    p->n_promote = p->n_demote = 0;
    for (uint32_t l = 0; l < p->n_layers; l++) {
        const double *s = p->hot.score + flat(p, l, 0);
        bool *set = p->in_set + flat(p, l, 0);
        if (p->knobs.select == DX_SELECT_THRESHOLD) {
            /* [DynaExq-v1] §3.5: tau_h = top(n_hot, S) once the warm-up has collected the scores,
             * then fixed; until then the set is the top n_l (the warm-up's initialization) */
            if (fix_tau)
                p->tau[l] = dx_threshold_of(s, p->n_experts, p->cap[l], p->scratch) / tau_debias;
            double tau = p->tau_fixed || fix_tau ? p->tau[l] : -INFINITY;
            p->set_changes +=
                dx_select_threshold(s, p->n_experts, p->cap[l], tau, set, order_of(p, l));
        } else {
            p->set_changes += dx_select_layer(s, p->n_experts, p->cap[l],
                                              (dx_hysteresis_mode)p->knobs.hysteresis_mode, margin,
                                              slack, set, order_of(p, l));
        }
        /* [DynaExq-v2] §3.5: promotion candidates H_target \ H_cur, demotion candidates H_cur
         * \ H_target; experts in a transition are left to finish and are reconsidered next
         * interval. */
        for (uint32_t e = 0; e < p->n_experts; e++) {
            const dx_entry *en = &p->entry[flat(p, l, e)];
            uint32_t id = (uint32_t)flat(p, l, e);
            p->deferred[id] = 0;
            if (set[e] && en->state == DX_RESIDENT_LO)
                p->promote_q[p->n_promote++] = id;
            else if (!set[e] && en->state == DX_RESIDENT_HI)
                p->demote_q[p->n_demote++] = id;
        }
    }
    if (fix_tau) p->tau_fixed = true, p->tau_fixed_step = p->steps_done;
    sort_ids_by_key(p, p->promote_q, p->n_promote, false); /* hottest first */
    sort_ids_by_key(p, p->demote_q, p->n_demote, true);    /* coldest first */
}

/* ---- callbacks ---- */

static void note_start(policy *p, uint64_t now_ns) {
    if (p->started) return;
    p->started = true;
    p->t0_ns = now_ns;
    p->last_sched_ns = now_ns;
}

static void dx_warmup(policy *p, uint64_t now_ns) {
    note_start(p, now_ns);
    fill_lo(p);
}

static void dx_begin_step(policy *p, const policy_step *step) {
    note_start(p, step->now_ns);
    fill_lo(p);
    publish_ready(p);
    pump(p);
}

/* [DynaExq-v1] §3.3 cross-layer prefetch: of the promotions still queued, those of experts the
 * look-ahead predicts for layer l+1 (distance 1, any of the step's tokens) move to the head of the
 * queue, keeping their hotness order, and the pump starts what the migration stream admits. An
 * expert outside the target set is never promoted by a prediction: the budget's set stays
 * the scheduler's. */
static void prefetch_predicted(policy *p, const policy_route *r) {
    uint32_t next = r->layer + 1;
    if (next >= p->n_layers || !r->lookahead_ids || p->n_promote == 0) return;
    uint32_t D = p->params.lookahead_depth, K = p->params.lookahead_k;
    uint8_t *predicted = p->predicted;
    memset(predicted, 0, p->n_experts);
    for (uint32_t t = 0; t < r->n_tokens; t++) {
        const uint16_t *ids = r->lookahead_ids + (size_t)t * D * K; /* distance 1 */
        for (uint32_t j = 0; j < K; j++)
            if (ids[j] < p->n_experts) predicted[ids[j]] = 1;
    }
    /* stable partition: predicted ones of layer l+1 first */
    uint32_t *rest = p->scratch;
    uint32_t n_first = 0, n_rest = 0;
    for (uint32_t i = 0; i < p->n_promote; i++) {
        uint32_t id = p->promote_q[i];
        if (id / p->n_experts == next && predicted[id % p->n_experts])
            p->promote_q[n_first++] = id;
        else
            rest[n_rest++] = id;
    }
    if (n_first == 0) return;
    memcpy(p->promote_q + n_first, rest, (size_t)n_rest * sizeof *rest);
    p->prefetch_moved += n_first;
    pump(p);
}

static void dx_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    MOESIM_ASSERT(r->layer < p->n_layers);
    dx_hotness_observe(&p->hot, r->layer, r->n_tokens, r->n_active, r->active, r->active_tokens,
                       r->active_gate);
    for (uint32_t i = 0; i < r->n_active; i++) {
        uint32_t e = r->active[i];
        MOESIM_ASSERT(e < p->n_experts);
        const dx_entry *en = &p->entry[flat(p, r->layer, e)];
        /* [DynaExq-v2] §3.2: the stable handle resolves to the published version, which is complete
         * (or, for the initial fill only, already queued); a promotion in flight is never waited
         * for */
        dx_version v = (dx_version)en->published;
        MOESIM_ASSERT(dx_entry_holds(en, v));
        for (int part = 0; part < PART_COUNT; part++)
            MOESIM_ASSERT(p->mem.ops->state(p->mem.mem, r->layer, e, p->prec[v],
                                            (expert_part)part) != POLICY_ABSENT);
        plan->run[i] = (uint8_t)p->prec[v];
        if (en->state == DX_PROMOTING) p->stale_runs++;
        double g = r->active_gate ? r->active_gate[i] : 0.0;
        p->gate_all += g;
        if (v == DX_HI) p->gate_hi += g;
    }
    if (p->knobs.prefetch) prefetch_predicted(p, r);
}

static void dx_on_transfer_done(policy *p, uint32_t layer, uint32_t expert, moesim_precision prec,
                                uint32_t parts_mask, policy_class cls, uint64_t now_ns) {
    (void)now_ns;
    if (cls != POLICY_BACKGROUND) return; /* the initial LO fill: usable as soon as resident */
    MOESIM_ASSERT(layer < p->n_layers && expert < p->n_experts);
    dx_entry *en = &p->entry[flat(p, layer, expert)];
    dx_version v = en->state == DX_PROMOTING ? DX_HI : DX_LO;
    MOESIM_ASSERT((en->state == DX_PROMOTING || en->state == DX_DEMOTING) && prec == p->prec[v]);
    if (en->copied) return; /* a repeated report of parts already counted */
    /* the copy may be reported part by part: complete once every part has landed */
    en->landed |= (uint8_t)(parts_mask & POLICY_PARTS_ALL);
    if (en->landed != POLICY_PARTS_ALL) return;
    dx_entry_copy_done(en);
    p->publish_q[p->n_publish++] = (uint32_t)flat(p, layer, expert);
    MOESIM_ASSERT(p->inflight > 0);
    p->inflight--;
    pump(p); /* keep the migration stream busy: start the next queued transition */
}

static void dx_end_step(policy *p, const policy_step *step, uint64_t now_ns) {
    (void)step;
    dx_hotness_end_step(
        &p->hot); /* the forward pass is over: [DynaExq-v1] Algorithm 1 UPDATEHOTNESS */
    p->steps_done++;
    bool due;
    if (p->knobs.interval_unit == DX_UNIT_STEPS) {
        due = p->warm ? p->steps_done - p->last_sched_step >= p->knobs.interval
                      : p->steps_done >= p->knobs.warmup;
    } else {
        due = p->warm ? now_ns - p->last_sched_ns >= p->knobs.interval
                      : now_ns - p->t0_ns >= p->knobs.warmup;
    }
    if (due) {
        /* [DynaExq-v1] §3.5: the warm-up's scores initialize the high set (top-n_hot, no member to
         * beat); afterwards [DynaExq-v1] Algorithm 1 line 13 / [DynaExq-v2] §3.5: once per interval
         */
        p->warm = true;
        p->last_sched_step = p->steps_done;
        p->last_sched_ns = now_ns;
        schedule(p);
    }
    pump(p);
}

static size_t dx_report(const policy *p, const char **names, double *values, size_t cap) {
    double mean_cap = (double)p->hi_slots / p->n_layers;
    uint64_t members = 0;
    for (size_t i = 0; i < (size_t)p->n_layers * p->n_experts; i++) members += p->in_set[i];
    const struct {
        const char *name;
        double value;
    } rows[DX_REPORT_FIELDS] = {
        {"hi_slots_per_layer", mean_cap},
        {"hi_share_of_experts", mean_cap / p->n_experts},
        {"schedules", (double)p->schedules},
        {"promotions", (double)p->promotions},
        {"promotions_published", (double)p->promotions_published},
        {"demotions", (double)p->demotions},
        {"demotions_published", (double)p->demotions_published},
        {"evictions", (double)p->evictions},
        {"evictions_refused", (double)p->evict_refused},
        {"admission_deferred", (double)p->n_deferred},
        {"mechanism_refused", (double)p->mech_refused},
        {"peak_inflight", (double)p->peak_inflight},
        {"runs_during_promotion", (double)p->stale_runs},
        {"hi_gate_share", p->gate_all > 0 ? p->gate_hi / p->gate_all : 0.0},
        {"peak_hi_bytes", (double)p->peak_hi_bytes},
        {"selection_changes", (double)p->set_changes},
        {"hi_set_per_layer", (double)members / p->n_layers},
        {"prefetch_moved", (double)p->prefetch_moved},
        {"tau_fixed_at_step", p->tau_fixed ? (double)p->tau_fixed_step : -1.0},
    };
    size_t n = 0;
    for (; n < cap && n < DX_REPORT_FIELDS; n++) {
        names[n] = rows[n].name;
        values[n] = rows[n].value;
    }
    return n;
}

static moesim_precision dynaexq_hi_precision(const policy *p) { return p->prec[DX_HI]; }

/* DRAM keeps both versions: every expert is resident at lo and promoted to hi by migration. */
static uint32_t dynaexq_load_precisions(const policy *p, moesim_precision order[PREC_COUNT]) {
    order[0] = p->prec[DX_HI];
    order[1] = p->prec[DX_LO];
    return 2;
}

/* Only the prefetch knob ([DynaExq-v1] §3.3) reads the predictions. */
static bool dynaexq_ignores_lookahead_with(const void *knobs) {
    return !((const dynaexq_knobs *)knobs)->prefetch;
}

const policy_methods policy_dynaexq = {
    .api_version = POLICY_API_VERSION,
    .name = "dynaexq",
    .summary = "DynaExq: hotness-driven HI/LO expert precision under a fixed HBM budget, "
               "non-blocking versioned promotions (Chu et al.)",
    .knobs = dynaexq_knob_fields,
    .n_knobs = MOESIM_ARRAY_LEN(dynaexq_knob_fields),
    .knobs_size = sizeof(dynaexq_knobs),
    .create = dx_create,
    .warmup = dx_warmup,
    .begin_step = dx_begin_step,
    .on_route = dx_on_route,
    .on_transfer_done = dx_on_transfer_done,
    .end_step = dx_end_step,
    .report = dx_report,
    .destroy = dx_destroy,
    .hi_precision = dynaexq_hi_precision,
    .load_precisions = dynaexq_load_precisions,
    .ignores_lookahead_with = dynaexq_ignores_lookahead_with,
    .lookahead_distances = 1, /* the next layer's predicted experts (prefetch_predicted) */
};
