/* Invariants every registered policy and the template plug-in (examples/policy-fifo, loaded as
 * a plug-in: policies/WRITING.md) keep under the simulator, table-driven over random traces: peak
 * HBM never exceeds the budget; every expert op starts with all its parts resident at the
 * precision it runs at; the same inputs and seed give identical JSON; and on these short-prompt
 * cases `oracle`'s hit rate is at least that of every other policy that runs every expert at
 * expert.precision. That is an observation on these cases, not a theorem: on longer prompt steps
 * lfu beats it (tests/test_policy_oracle.c, the documented counter-example; the bound that holds
 * is on loads, policies/belady.h). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "policies/plugin.h"
#include "policies/policy.h"
#include "sim/sim.h"
#include "sim_fixtures.h"

static quant_table quant;

static void setup(void) {
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
}

TestSuite(sim_invariants, .init = setup);

typedef struct sim_case {
    const char *what;
    uint32_t layers, experts, top_k;
    uint32_t requests, prompt, decode;
    double skew;
    uint64_t seed;
    const char *sets[4]; /* NULL-terminated */
} sim_case;

/* One bf16 fixture expert is 3 MiB; the cases range from a budget that holds a few layers'
 * worth of experts to one that holds them all, per-layer pools, batches and mixed phases. */
static const sim_case cases[] = {
    {.what = "tight budget, batch 1",
     .layers = 4,
     .experts = 16,
     .top_k = 2,
     .requests = 3,
     .prompt = 4,
     .decode = 12,
     .skew = 1.0,
     .seed = 1,
     .sets = {"memory.budget_gb=0.06", NULL}},
    {.what = "roomy budget, batch 3",
     .layers = 4,
     .experts = 16,
     .top_k = 2,
     .requests = 5,
     .prompt = 3,
     .decode = 10,
     .skew = 0.0,
     .seed = 2,
     .sets = {"memory.budget_gb=0.3", "batch.size=3", NULL}},
    {.what = "per-layer pools of 4",
     .layers = 3,
     .experts = 12,
     .top_k = 2,
     .requests = 2,
     .prompt = 5,
     .decode = 15,
     .skew = 2.0,
     .seed = 3,
     .sets = {"cache.experts_per_layer=4", "batch.size=2", NULL}},
    {.what = "int4 experts, top-4",
     .layers = 2,
     .experts = 32,
     .top_k = 4,
     .requests = 4,
     .prompt = 2,
     .decode = 8,
     .skew = 1.0,
     .seed = 4,
     .sets = {"memory.budget_gb=0.05", "expert.precision=int4", "batch.size=2", NULL}},
};

typedef struct residency_check {
    uint64_t ops, violations;
} residency_check;

static void check_expert_start(void *ctx, policy_mem_view mem, uint32_t layer, uint32_t expert,
                               moesim_precision prec, uint32_t parts_mask, uint64_t t_ns) {
    (void)t_ns;
    residency_check *c = ctx;
    c->ops++;
    c->violations += fixture_parts_not_resident(mem, layer, expert, prec, parts_mask);
}

/* The policies under test: every registered one, then the template plug-in (built beside this
 * test: MOESIM_TEST_POLICY_PLUGIN is its path). Caller frees the array and closes *plugin. */
static const policy_methods **policies_under_test(size_t *n, policy_plugin **plugin) {
    size_t n_reg;
    const policy_methods *const *all = policy_all(&n_reg);
    const policy_methods **list = calloc(n_reg + 1, sizeof *list);
    cr_assert(list);
    memcpy(list, all, n_reg * sizeof *list);
    moesim_error err = {0};
    cr_assert_eq(policy_plugin_open(MOESIM_TEST_POLICY_PLUGIN, plugin, &err), MOESIM_OK, "%s",
                 err.msg);
    list[n_reg] = policy_plugin_methods(*plugin);
    *n = n_reg + 1;
    return list;
}

/* Runs one case; returns the status (a policy may refuse a setting it cannot work in). */
static moesim_status run_case(const sim_case *sc, const trace *t, const model_geometry *m,
                              const policy_methods *pm, sim_result *r, residency_check *rc,
                              moesim_error *err) {
    hw_profile hw = fixture_hw();
    config *c = config_create();
    for (const char *const *s = sc->sets; *s; s++)
        cr_assert_eq(config_set(c, *s, err), MOESIM_OK, "%s", err->msg);
    sim_hooks hooks = {.ctx = rc, .on_expert_start = check_expert_start};
    sim_inputs in = {
        .trace = t, .model = m, .hw = &hw, .quant = &quant, .hooks = &hooks, .policy = pm};
    moesim_status st = sim_run(&in, pm->name, c, r, err);
    config_destroy(c);
    return st;
}

Test(sim_invariants, every_policy_stays_in_budget_runs_only_resident_experts_and_is_deterministic) {
    size_t n_pol;
    policy_plugin *plugin = NULL;
    const policy_methods **all = policies_under_test(&n_pol, &plugin);
    cr_assert_geq(n_pol, 3);
    uint32_t *ran = calloc(n_pol, sizeof *ran);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const sim_case *sc = &cases[ci];
        model_geometry m = fixture_model(sc->layers, sc->experts, sc->top_k);
        trace *t = fixture_trace(&m, sc->requests, sc->prompt, sc->decode, sc->skew, sc->seed);
        cr_assert(t);
        for (size_t pi = 0; pi < n_pol; pi++) {
            const char *name = all[pi]->name;
            sim_result r1, r2;
            residency_check rc1 = {0}, rc2 = {0};
            moesim_error err = {0};
            moesim_status st = run_case(sc, t, &m, all[pi], &r1, &rc1, &err);
            if (st) {
                /* refusing a setting is allowed, with a message; the two baselines never do */
                cr_assert_eq(st, MOESIM_EINPUT, "%s / %s: %s", sc->what, name, err.msg);
                cr_assert(err.msg[0]);
                cr_assert(strcmp(name, "ondemand") && strcmp(name, "lru") && strcmp(name, "fifo"),
                          "%s / %s: %s", sc->what, name, err.msg);
                continue;
            }
            cr_assert_leq(r1.peak_hbm_bytes, r1.budget_bytes, "%s / %s", sc->what, name);
            cr_assert_gt(rc1.ops, 0, "%s / %s ran no expert", sc->what, name);
            cr_assert_eq(rc1.violations, 0, "%s / %s: %llu expert ops started without weights",
                         sc->what, name, (unsigned long long)rc1.violations);
            cr_assert_eq(r1.tokens, t->n_tokens);
            double mix = r1.precision_mix_hi + r1.precision_mix_lo + r1.precision_mix_skip;
            cr_assert_float_eq(mix, 1.0, 1e-9, "%s / %s", sc->what, name);
            cr_assert_eq(run_case(sc, t, &m, all[pi], &r2, &rc2, &err), MOESIM_OK, "%s", err.msg);
            json_t *o1 = sim_result_to_json(&r1), *o2 = sim_result_to_json(&r2);
            char *j1 = json_dumps(o1, JSON_COMPACT | JSON_REAL_PRECISION(17));
            char *j2 = json_dumps(o2, JSON_COMPACT | JSON_REAL_PRECISION(17));
            cr_assert_str_eq(j1, j2, "%s / %s: two runs differ", sc->what, name);
            free(j1);
            free(j2);
            json_decref(o1);
            json_decref(o2);
            ran[pi]++;
        }
        trace_destroy(t);
    }
    for (size_t pi = 0; pi < n_pol; pi++)
        cr_assert_gt(ran[pi], 0, "policy %s refused every case: add a case it can run",
                     all[pi]->name);
    free(ran);
    free(all);
    policy_plugin_close(plugin);
}

Test(sim_invariants, oracle_hit_rate_is_at_least_every_other_policys_on_these_short_prompt_cases) {
    const policy_methods *oracle = policy_lookup("oracle");
    cr_assert(oracle, "no policy named 'oracle' is registered");
    size_t n_pol;
    policy_plugin *plugin = NULL;
    const policy_methods **all = policies_under_test(&n_pol, &plugin);
    static const char *const bounded[] = {"lru", "lfu", "mixtral-offload", "ondemand", "fifo"};
    const size_t n_bounded = sizeof bounded / sizeof *bounded;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const sim_case *sc = &cases[ci];
        model_geometry m = fixture_model(sc->layers, sc->experts, sc->top_k);
        trace *t = fixture_trace(&m, sc->requests, sc->prompt, sc->decode, sc->skew, sc->seed);
        sim_result ro;
        residency_check rc = {0};
        moesim_error err = {0};
        cr_assert_eq(run_case(sc, t, &m, oracle, &ro, &rc, &err), MOESIM_OK, "%s: %s", sc->what,
                     err.msg);
        size_t compared = 0;
        unsigned seen = 0;
        for (size_t pi = 0; pi < n_pol; pi++) {
            sim_result r;
            if (run_case(sc, t, &m, all[pi], &r, &rc, &err)) continue;
            /* Belady's bound holds among caches of one precision: a policy that runs some
             * experts narrower (more of them fit) or skips some is not bounded by it */
            if (r.precision_mix_hi < 1.0) continue;
            cr_assert_geq(ro.hit_rate, r.hit_rate, "%s: oracle %.4f < %s %.4f", sc->what,
                          ro.hit_rate, all[pi]->name, r.hit_rate);
            if (strcmp(all[pi]->name, "oracle")) compared++;
            for (size_t b = 0; b < n_bounded; b++)
                if (!strcmp(all[pi]->name, bounded[b])) seen |= 1u << b;
        }
        /* the single-precision baselines run in every case: the bound is never vacuous */
        for (size_t b = 0; b < n_bounded; b++)
            cr_assert(seen & (1u << b), "%s: %s was not compared with the oracle", sc->what,
                      bounded[b]);
        cr_assert_geq(compared, n_bounded, "%s: %zu policies compared", sc->what, compared);
        trace_destroy(t);
    }
    free(all);
    policy_plugin_close(plugin);
}
