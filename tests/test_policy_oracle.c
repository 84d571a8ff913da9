/* The oracle and the bound it does not give (policies/README.md, "oracle"): Belady's minimum loads
 * (policies/belady.h) checked against an exhaustive optimum on small cases, as a lower bound on
 * the loads of every single-precision whole-expert policy in the simulator; the counter-example
 * where lfu beats oracle's hit rate on prompt steps; and oracle running every expert (no skip)
 * over a grid of budgets on every configured model. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "policies/belady.h"
#include "policies/policy.h"
#include "sim/sim.h"
#include "sim_fixtures.h"
#include "traces/synth.h"

static quant_table quant;

static void setup(void) {
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
}

TestSuite(policy_oracle, .init = setup);

/* ---- the bound against an exhaustive optimum ---- */

/* Fewest loads that serve `routes` (bit masks over at most 8 ids) from a cold cache of
 * `capacity` ids when each route's ids must be resident together: every cache state after every
 * route is tried (any replacement, loading ahead included). */
static uint32_t exhaustive_min_loads(const uint8_t *routes, size_t n, uint32_t n_ids,
                                     uint32_t capacity) {
    uint32_t states = 1u << n_ids, best[256], next[256];
    for (uint32_t s = 0; s < states; s++) best[s] = s == 0 ? 0 : UINT32_MAX;
    for (size_t r = 0; r < n; r++) {
        for (uint32_t s = 0; s < states; s++) next[s] = UINT32_MAX;
        for (uint32_t from = 0; from < states; from++) {
            if (best[from] == UINT32_MAX) continue;
            for (uint32_t to = 0; to < states; to++) {
                if ((to & routes[r]) != routes[r] || (uint32_t)__builtin_popcount(to) > capacity)
                    continue;
                uint32_t cost = best[from] + (uint32_t)__builtin_popcount(to & ~from);
                if (cost < next[to]) next[to] = cost;
            }
        }
        memcpy(best, next, sizeof best);
    }
    uint32_t m = UINT32_MAX;
    for (uint32_t s = 0; s < states; s++)
        if (best[s] < m) m = best[s];
    return m;
}

Test(policy_oracle, belady_min_loads_equals_the_exhaustive_optimum_and_bounds_pinned_routes) {
    uint64_t st = 11;
    for (int trial = 0; trial < 300; trial++) {
        uint32_t n_ids = 3 + (uint32_t)(fixture_u01(&st) * 4); /* 3..6 */
        uint32_t capacity = 1 + (uint32_t)(fixture_u01(&st) * (n_ids - 1));
        size_t n_routes = 4 + (size_t)(fixture_u01(&st) * 8);
        uint8_t routes[16], singles[64];
        uint32_t seq[64];
        size_t n_seq = 0;
        for (size_t r = 0; r < n_routes; r++) {
            /* a route of 1..capacity distinct ids, skewed toward low ids */
            uint32_t want = 1 + (uint32_t)(fixture_u01(&st) * capacity);
            uint8_t mask = 0;
            while ((uint32_t)__builtin_popcount(mask) < want) {
                double u = fixture_u01(&st);
                mask |= (uint8_t)(1u << (uint32_t)(u * u * n_ids));
            }
            routes[r] = mask;
            for (uint32_t id = 0; id < n_ids; id++)
                if (mask & (1u << id)) {
                    singles[n_seq] = (uint8_t)(1u << id);
                    seq[n_seq++] = id;
                }
        }
        uint64_t belady = belady_min_loads(seq, n_seq, n_ids, capacity);
        /* one access at a time: Belady is the optimum of every schedule */
        cr_assert_eq(belady, exhaustive_min_loads(singles, n_seq, n_ids, capacity),
                     "trial %d: %u ids, capacity %u", trial, n_ids, capacity);
        /* routes pinned whole: the optimum can only need more loads */
        cr_assert_geq(exhaustive_min_loads(routes, n_routes, n_ids, capacity), belady, "trial %d",
                      trial);
    }
}

/* ---- the bound in the simulator ---- */

/* Records the access sequence a policy is handed (layer * E + expert, in execution order) and
 * passes every route on to the policy it wraps. */
static struct {
    const policy_methods *inner;
    uint32_t n_experts;
    uint32_t *seq;
    size_t n, cap;
} rec;

static void recording_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    size_t k = (size_t)r->n_tokens * r->top_k;
    for (size_t i = 0; i < k; i++) {
        if (r->experts[i] == POLICY_NO_EXPERT) continue;
        if (rec.n == rec.cap) {
            rec.cap = rec.cap ? 2 * rec.cap : 4096;
            rec.seq = realloc(rec.seq, rec.cap * sizeof *rec.seq);
            cr_assert(rec.seq);
        }
        rec.seq[rec.n++] = r->layer * rec.n_experts + r->experts[i];
    }
    rec.inner->on_route(p, r, plan);
}

static moesim_status run_recorded(const trace *t, const model_geometry *m, const hw_profile *hw,
                                  const char *name, const char *const *sets, sim_result *r,
                                  moesim_error *err) {
    policy_methods wrapped = *policy_lookup(name);
    rec.inner = policy_lookup(name);
    rec.n_experts = m->n_experts;
    rec.n = 0;
    wrapped.on_route = recording_on_route;
    config *c = config_create();
    for (const char *const *s = sets; *s; s++)
        cr_assert_eq(config_set(c, *s, err), MOESIM_OK, "%s", err->msg);
    sim_inputs in = {.trace = t, .model = m, .hw = hw, .quant = &quant, .policy = &wrapped};
    moesim_status st = sim_run(&in, name, c, r, err);
    config_destroy(c);
    return st;
}

/* Experts the run loaded (placed before the clock included), and Belady's minimum for its pools
 * over the sequence it was handed: one pool of what the expert budget holds, or per-layer pools
 * of `per_layer` experts. */
static void loads_and_bound(const sim_result *r, const model_geometry *m, moesim_precision prec,
                            uint32_t per_layer, uint64_t *loads, uint64_t *bound) {
    uint64_t eb = model_expert_bytes(m, &quant, prec);
    uint64_t bytes = r->h2d_bytes + r->warmup_h2d_bytes;
    cr_assert_eq(bytes % eb, 0, "whole experts only: %llu bytes", (unsigned long long)bytes);
    *loads = bytes / eb;
    uint32_t ids = m->n_moe_layers * m->n_experts;
    if (!per_layer) {
        uint64_t fit = r->expert_budget_bytes / eb;
        *bound = belady_min_loads(rec.seq, rec.n, ids, fit < ids ? (uint32_t)fit : ids);
        return;
    }
    *bound = 0;
    uint32_t *one = malloc((rec.n ? rec.n : 1) * sizeof *one);
    for (uint32_t l = 0; l < m->n_moe_layers; l++) {
        size_t n = 0;
        for (size_t i = 0; i < rec.n; i++)
            if (rec.seq[i] / m->n_experts == l) one[n++] = rec.seq[i] % m->n_experts;
        *bound += belady_min_loads(one, n, m->n_experts, per_layer);
    }
    free(one);
}

/* The policies that hold whole experts at expert.precision, the ones the bound is about. */
static const char *const single_precision[] = {"ondemand",        "lru",    "lfu",
                                               "mixtral-offload", "static", "oracle"};

Test(policy_oracle, no_single_precision_policy_loads_fewer_experts_than_belady_minimum) {
    typedef struct {
        uint32_t layers, experts, top_k, requests, prompt, decode, per_layer;
        double skew;
        const char *sets[4];
    } bound_case;
    static const bound_case cases[] = {
        {4, 16, 2, 3, 4, 12, 0, 1.0, {"memory.budget_gb=0.06", NULL}},
        {4, 16, 2, 5, 3, 10, 0, 0.0, {"memory.budget_gb=0.3", "batch.size=3", NULL}},
        {3, 12, 2, 2, 5, 15, 4, 2.0, {"cache.experts_per_layer=4", "batch.size=2", NULL}},
        {2, 32, 4, 4, 24, 8, 0, 1.0, {"memory.budget_gb=0.05", "expert.precision=int4", NULL}},
    };
    hw_profile hw = fixture_hw();
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const bound_case *bc = &cases[ci];
        model_geometry m = fixture_model(bc->layers, bc->experts, bc->top_k);
        trace *t = fixture_trace(&m, bc->requests, bc->prompt, bc->decode, bc->skew, ci + 1);
        moesim_precision prec = PREC_BF16;
        for (const char *const *s = bc->sets; *s; s++)
            if (!strcmp(*s, "expert.precision=int4")) prec = PREC_INT4;
        size_t ran = 0;
        for (size_t pi = 0; pi < sizeof single_precision / sizeof *single_precision; pi++) {
            sim_result r;
            moesim_error err = {0};
            if (run_recorded(t, &m, &hw, single_precision[pi], bc->sets, &r, &err)) continue;
            cr_assert_eq(r.precision_mix_skip, 0.0, "case %zu %s", ci, single_precision[pi]);
            uint64_t loads, bound;
            loads_and_bound(&r, &m, prec, bc->per_layer, &loads, &bound);
            cr_assert_geq(loads, bound, "case %zu: %s loads %llu experts, Belady's minimum %llu",
                          ci, single_precision[pi], (unsigned long long)loads,
                          (unsigned long long)bound);
            cr_assert_gt(bound, 0);
            ran++;
        }
        cr_assert_geq(ran, 5, "case %zu: %zu policies ran", ci, ran);
        trace_destroy(t);
    }
    free(rec.seq);
    rec.seq = NULL, rec.cap = 0;
}

/* The trace of the counter-example: 24 requests of one 64-token prompt step each (no decode),
 * synthesized for DeepSeek-V2-Lite (64 routed experts, top-6). */
static trace *prompt_steps_trace(model_geometry *m) {
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("deepseek-v2-lite", m, &err), MOESIM_OK, "%s", err.msg);
    synth_options o;
    synth_options_default(&o, m);
    o.n_requests = 24;
    o.prompt_len = (synth_range){64, 64};
    o.gen_len = (synth_range){0, 0};
    o.seed = 1;
    trace *t = NULL;
    cr_assert_eq(synth_generate(m, &o, &t, &err), MOESIM_OK, "%s", err.msg);
    return t;
}

Test(policy_oracle, lfu_beats_oracle_hit_rate_on_prompt_steps_and_both_respect_the_load_bound) {
    /* the documented counter-example (policies/README.md, "oracle"): with 64-token routes pinned
     * whole, Belady's rule per access is no longer optimal for hits or loads */
    model_geometry m;
    hw_profile hw;
    moesim_error err = {0};
    trace *t = prompt_steps_trace(&m);
    cr_assert_eq(hw_load_by_name("rtx3090-pcie4", &hw, &err), MOESIM_OK, "%s", err.msg);
    const char *sets[] = {"expert.precision=int4", "memory.budget_gb=3.3", NULL};
    sim_result lfu, oracle;
    uint64_t lfu_loads, oracle_loads, bound, bound_again;
    cr_assert_eq(run_recorded(t, &m, &hw, "lfu", sets, &lfu, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(lfu.steps, 24, "one step per prompt");
    loads_and_bound(&lfu, &m, PREC_INT4, 0, &lfu_loads, &bound);
    cr_assert_eq(run_recorded(t, &m, &hw, "oracle", sets, &oracle, &err), MOESIM_OK, "%s", err.msg);
    loads_and_bound(&oracle, &m, PREC_INT4, 0, &oracle_loads, &bound_again);
    cr_assert_eq(bound, bound_again, "the same sequence and pool for both");
    cr_assert_eq(oracle.precision_mix_skip, 0.0);
    cr_assert_gt(lfu.hit_rate, oracle.hit_rate, "lfu %.4f, oracle %.4f", lfu.hit_rate,
                 oracle.hit_rate);
    cr_assert_lt(lfu_loads, oracle_loads, "lfu %llu loads, oracle %llu",
                 (unsigned long long)lfu_loads, (unsigned long long)oracle_loads);
    cr_assert_geq(lfu_loads, bound);
    cr_assert_gt(lfu_loads, bound, "a strict gap: the bound is not reached by either");
    free(rec.seq);
    rec.seq = NULL, rec.cap = 0;
    trace_destroy(t);
}

/* ---- no skip ---- */

Test(policy_oracle, oracle_runs_every_expert_of_mixtral_prompts_at_a_tight_budget_batch_1_and_4) {
    /* the case that skipped before: 560 MB of int4 experts, fewer than a prompt route touches,
     * so prompt steps split into sub-routes that each fill the pool (every configured model over
     * a grid of budgets: test_policy_oracle_grid.c, label slow) */
    model_geometry m;
    hw_profile hw;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("mixtral-8x7b", &m, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(hw_load_by_name("rtx3090-pcie3", &hw, &err), MOESIM_OK, "%s", err.msg);
    synth_options o;
    synth_options_default(&o, &m);
    o.n_requests = 8;
    o.prompt_len = (synth_range){64, 256};
    o.gen_len = (synth_range){32, 32};
    o.seed = 3;
    trace *t = NULL;
    cr_assert_eq(synth_generate(&m, &o, &t, &err), MOESIM_OK, "%s", err.msg);
    static const char *const batches[] = {"batch.size=1", "batch.size=4", NULL};
    static const char *const budgets[] = {"memory.budget_gb=3.6", "memory.budget_gb=3.8", NULL};
    for (const char *const *b = batches; *b; b++)
        for (const char *const *g = budgets; *g; g++) {
            const char *sets[] = {"expert.precision=int4", *g, *b, NULL};
            sim_result r;
            cr_assert_eq(run_recorded(t, &m, &hw, "oracle", sets, &r, &err), MOESIM_OK, "%s",
                         err.msg);
            cr_assert_eq(r.precision_mix_skip, 0.0, "%s, %s: oracle skipped %.4f of the gate mass",
                         *g, *b, r.precision_mix_skip);
            uint64_t loads, bound;
            loads_and_bound(&r, &m, PREC_INT4, 0, &loads, &bound);
            cr_assert_geq(loads, bound);
        }
    free(rec.seq);
    rec.seq = NULL, rec.cap = 0;
    trace_destroy(t);
}
