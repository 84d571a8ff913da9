/* The baseline policies lfu, static, mixtral-offload and oracle, run through the real simulator
 * (sim_run) on small in-memory traces of Mixtral-8x7B's geometry (32 MoE layers, 8 experts,
 * top-2; configs/models/mixtral-8x7b.ini) on the RTX 3090 PCIe 4.0 profile. Each test states
 * the hits or the bytes it expects from the policy's rule, computed by hand, or an ordering
 * between policies that the rules imply. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "common/rng.h"
#include "policies/policy.h"
#include "sim/sim.h"
#include "traces/trace.h"

static model_geometry model;
static hw_profile hw;
static quant_table quant;

static void setup(void) {
    moesim_error err;
    cr_assert_eq(model_load_by_name("mixtral-8x7b", &model, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(hw_load_by_name("rtx3090-pcie4", &hw, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
}

TestSuite(policy_baselines, .init = setup);

/* ---- traces ---- */

/* One request of n_tokens (the first a one-token prompt, then decode) in which every MoE layer
 * routes token i to rows[i][0..1] (gates 0.6, 0.4). With `lookahead`, each layer's distance-1
 * prediction is the given table (layer l predicts layer l+1; NULL: the true next layer). */
static trace *make_trace(uint64_t n_tokens, const uint16_t (*rows)[2], bool lookahead,
                         const uint16_t (*predicted)[2]) {
    trace_meta meta;
    memset(&meta, 0, sizeof meta);
    trace_meta_from_model(&meta, &model);
    snprintf(meta.source, sizeof meta.source, "test");
    if (lookahead) {
        meta.lookahead_depth = 1;
        meta.lookahead_k = 2;
    }
    trace *t = trace_create(&meta, n_tokens);
    uint32_t L = meta.n_layers;
    for (uint64_t i = 0; i < n_tokens; i++) {
        t->request_id[i] = 0;
        t->position[i] = (uint32_t)i;
        t->phase[i] = i == 0 ? TRACE_PREFILL : TRACE_DECODE;
        for (uint32_t l = 0; l < L; l++) {
            size_t r = trace_route_index(t, i, l);
            for (uint32_t s = 0; s < 2; s++) {
                t->expert_ids[r + s] = rows[i][s];
                t->gate_weights[r + s] = s == 0 ? 0.6f : 0.4f;
            }
            if (!lookahead) continue;
            size_t a = trace_lookahead_index(t, i, l, 1);
            for (uint32_t s = 0; s < 2; s++) {
                t->lookahead_ids[a + s] =
                    l + 1 >= L ? TRACE_NO_EXPERT : (predicted ? predicted[i][s] : rows[i][s]);
                t->lookahead_scores[a + s] = l + 1 >= L ? 0.0f : (s == 0 ? 0.6f : 0.4f);
            }
        }
    }
    moesim_error err;
    cr_assert_eq(trace_finish(t, "test trace", &err), MOESIM_OK, "%s", err.msg);
    return t;
}

/* n_tokens of random top-2 routing, drawn independently per layer: a skewed mix where experts 0-2
 * take 60 % of the first slot. With `lookahead`, predictions are the true next layer's experts. */
static trace *make_random_trace(uint64_t seed, uint64_t n_tokens, bool lookahead) {
    trace_meta meta;
    memset(&meta, 0, sizeof meta);
    trace_meta_from_model(&meta, &model);
    snprintf(meta.source, sizeof meta.source, "test:%llu", (unsigned long long)seed);
    if (lookahead) {
        meta.lookahead_depth = 1;
        meta.lookahead_k = 2;
    }
    trace *t = trace_create(&meta, n_tokens);
    rng *r = rng_create(seed);
    uint32_t L = meta.n_layers, E = meta.n_experts;
    for (uint64_t i = 0; i < n_tokens; i++) {
        t->request_id[i] = 0;
        t->position[i] = (uint32_t)i;
        t->phase[i] = i == 0 ? TRACE_PREFILL : TRACE_DECODE;
        for (uint32_t l = 0; l < L; l++) {
            size_t x = trace_route_index(t, i, l);
            uint16_t a = (uint16_t)(rng_uniform(r) < 0.6 ? rng_below(r, 3) : rng_below(r, E));
            uint16_t b;
            do b = (uint16_t)rng_below(r, E);
            while (b == a);
            t->expert_ids[x] = a, t->expert_ids[x + 1] = b;
            t->gate_weights[x] = 0.6f, t->gate_weights[x + 1] = 0.4f;
        }
    }
    if (lookahead)
        for (uint64_t i = 0; i < n_tokens; i++)
            for (uint32_t l = 0; l < L; l++) {
                size_t a = trace_lookahead_index(t, i, l, 1);
                for (uint32_t s = 0; s < 2; s++) {
                    bool past = l + 1 >= L;
                    t->lookahead_ids[a + s] =
                        past ? TRACE_NO_EXPERT : trace_experts(t, i, l + 1)[s];
                    t->lookahead_scores[a + s] = past ? 0.0f : (s == 0 ? 0.6f : 0.4f);
                }
            }
    rng_destroy(r);
    moesim_error err;
    cr_assert_eq(trace_finish(t, "random test trace", &err), MOESIM_OK, "%s", err.msg);
    return t;
}

/* ---- running the simulator ---- */

/* Runs policy `name` with the NULL-terminated "section.key=value" settings; returns the status and
 * fills *out / *err. */
static moesim_status run_sim(const trace *t, const char *name, const char *const *sets,
                             sim_result *out, moesim_error *err) {
    config *c = config_create();
    for (size_t i = 0; sets && sets[i]; i++)
        cr_assert_eq(config_set(c, sets[i], err), MOESIM_OK, "%s", err->msg);
    sim_inputs in = {.trace = t, .model = &model, .hw = &hw, .quant = &quant};
    memset(out, 0, sizeof *out);
    moesim_status st = sim_run(&in, name, c, out, err);
    config_destroy(c);
    return st;
}

static sim_result run_ok(const trace *t, const char *name, const char *const *sets) {
    sim_result r;
    moesim_error err;
    cr_assert_eq(run_sim(t, name, sets, &r, &err), MOESIM_OK, "%s: %s", name, err.msg);
    return r;
}

/* Accesses of a trace: tokens x layers x top_k. */
static double accesses(const trace *t) {
    return (double)t->n_tokens * t->meta.n_layers * t->meta.top_k;
}

/* ---- lfu ---- */

typedef struct lfu_case {
    const char *name;
    uint32_t capacity; /* cache.experts_per_layer */
    uint32_t n_tokens;
    uint16_t rows[8][2];
    uint32_t lfu_hits; /* per layer, by hand */
    uint32_t lru_hits; /* per layer, by hand: shows the case separates the two rules */
} lfu_case;

/* Per layer, a miss evicts the held expert (not routed by the token) with the fewest uses; ties
 * go to the least recently used. */
static const lfu_case lfu_cases[] = {
    /* t3 needs room: 1 (2 uses, last t1) vs 2 (1 use, t2): LFU evicts 2, LRU evicts 1; t4 routes
     * 1 and 0: LFU hits both, LRU misses 1 */
    {.name = "frequency beats recency",
     .capacity = 3,
     .n_tokens = 5,
     .rows = {{0, 1}, {0, 1}, {0, 2}, {3, 0}, {1, 0}},
     .lfu_hits = 2 + 1 + 1 + 2,
     .lru_hits = 2 + 1 + 1 + 1},
    /* at t2, 1 (t0) and 2 (t1) have one use each: the tie goes to the least recently used, 1,
     * so t3's {2, 0} hits both; at t4, 1 evicts 3 (one use) rather than 2 (two) */
    {.name = "ties go to the least recently used",
     .capacity = 3,
     .n_tokens = 5,
     .rows = {{0, 1}, {0, 2}, {0, 3}, {2, 0}, {1, 0}},
     .lfu_hits = 0 + 1 + 1 + 2 + 1,
     .lru_hits = 0 + 1 + 1 + 2 + 1},
};

Test(policy_baselines, lfu_evicts_the_least_frequently_used_expert_of_the_layer) {
    for (size_t i = 0; i < sizeof lfu_cases / sizeof lfu_cases[0]; i++) {
        const lfu_case *c = &lfu_cases[i];
        trace *t = make_trace(c->n_tokens, c->rows, false, NULL);
        char cap[64];
        snprintf(cap, sizeof cap, "cache.experts_per_layer=%u", c->capacity);
        const char *sets[] = {cap, "expert.precision=int4", NULL};
        sim_result lfu = run_ok(t, "lfu", sets);
        double want = (double)c->lfu_hits * model.n_moe_layers / accesses(t);
        cr_expect_float_eq(lfu.hit_rate, want, 1e-12, "%s: lfu hit rate %.6f, want %.6f", c->name,
                           lfu.hit_rate, want);
        if (policy_lookup("lru")) {
            sim_result lru = run_ok(t, "lru", sets);
            double want_lru = (double)c->lru_hits * model.n_moe_layers / accesses(t);
            cr_expect_float_eq(lru.hit_rate, want_lru, 1e-12, "%s: lru hit rate %.6f, want %.6f",
                               c->name, lru.hit_rate, want_lru);
        }
        trace_destroy(t);
    }
}

Test(policy_baselines, lfu_halving_lets_an_old_favourite_go) {
    /* cache 3, slot 2 always expert 4. Tokens 0-7 route 0 (8 uses), then 1 and 2 alternate for
     * 14 tokens (7 uses each, never more than 0's 8). Without aging 0 is never evicted, so 1 and 2
     * share the one free place and miss every time: per layer 14 hits (t1-t7) + 14 (expert 4,
     * t8-t21) = 28 of 44. Halving after every step leaves every older count at 0, the tie goes
     * to the least recently used, 0 leaves at t9 and 1, 2 hit from t10 on: 14 + 2 + 24 = 40. */
    uint16_t rows[22][2];
    for (int i = 0; i < 22; i++) {
        rows[i][0] = i < 8 ? 0 : (uint16_t)(1 + (i % 2));
        rows[i][1] = 4;
    }
    trace *t = make_trace(22, rows, false, NULL);
    const char *keep[] = {"cache.experts_per_layer=3", "expert.precision=int4", NULL};
    const char *halve[] = {"cache.experts_per_layer=3", "expert.precision=int4",
                           "lfu.halve_every_steps=1", NULL};
    sim_result a = run_ok(t, "lfu", keep), b = run_ok(t, "lfu", halve);
    double per_layer = accesses(t) / model.n_moe_layers;
    cr_expect_float_eq(a.hit_rate, 28.0 / per_layer, 1e-12, "no aging %.6f", a.hit_rate);
    cr_expect_float_eq(b.hit_rate, 40.0 / per_layer, 1e-12, "halving %.6f", b.hit_rate);
    trace_destroy(t);
}

Test(policy_baselines, lfu_per_copy_counts_restart_when_an_expert_is_reloaded) {
    /* cache 3, slot 2 always expert 4 (never a victim), slot 1: A A B B B C C A C B (A=0, B=1,
     * C=2), two places. Both rules evict A at t5 (2 uses vs B's 3) and C at t7 (2 vs 3). At t8
     * lifetime counts give A 3 uses, tied with B: the least recently used, B, goes, and t9's B
     * misses; per-copy counts give the reloaded A 1 use: A goes and t9's B hits. Per layer:
     * 4 + 9 (expert 4) = 13 hits, and 14 with per-copy counts. */
    static const uint16_t first[10] = {0, 0, 1, 1, 1, 2, 2, 0, 2, 1};
    uint16_t rows[10][2];
    for (int i = 0; i < 10; i++) rows[i][0] = first[i], rows[i][1] = 4;
    trace *t = make_trace(10, rows, false, NULL);
    const char *lifetime[] = {"cache.experts_per_layer=3", "expert.precision=int4", NULL};
    const char *per_copy[] = {"cache.experts_per_layer=3", "expert.precision=int4",
                              "lfu.counts=per_copy", NULL};
    sim_result a = run_ok(t, "lfu", lifetime), b = run_ok(t, "lfu", per_copy);
    double per_layer = accesses(t) / model.n_moe_layers;
    cr_expect_float_eq(a.hit_rate, 13.0 / per_layer, 1e-12, "lifetime %.6f", a.hit_rate);
    cr_expect_float_eq(b.hit_rate, 14.0 / per_layer, 1e-12, "per copy %.6f", b.hit_rate);
    trace_destroy(t);
}

/* ---- pinned routes: every cache policy ---- */

Test(policy_baselines, no_cache_policy_evicts_an_expert_its_own_token_needs) {
    /* With pools of top_k = 2 a token's pair fills its layer's pool, so under the rule every
     * token keeps exactly its own pair: a hit is an expert the previous token also chose, for
     * any victim order. Per layer the rows give 0 + 1 ({2,0} keeps 0) + 2 + 0 + 1 + 1 = 5 hits.
     * A policy that lets a token's first miss evict its second expert falls short: lru evicts
     * 0 for 2 at {2,0} (0 was used before 1) and 3 for 1 at {1,3}; lfu evicts 3 for 1 at {1,3}
     * (two uses against 2's three). The oracle
     * prefetches, so its figure is its loads: accesses - 5. static holds every expert: no
     * eviction at all (its own test). */
    static const uint16_t rows[6][2] = {{0, 1}, {2, 0}, {0, 2}, {3, 1}, {3, 2}, {1, 3}};
    static const struct {
        const char *policy, *extra;
    } cases[] = {{"lru", NULL},
                 {"lfu", NULL},
                 {"lfu", "lfu.counts=per_copy"},
                 {"mixtral-offload", "predictor.depth=0"}, /* its cache part: no guesses */
                 {"oracle", NULL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trace *t = make_trace(6, rows, false, NULL);
        const char *sets[] = {"cache.experts_per_layer=2", "expert.precision=int4",
                              cases[i].extra, NULL};
        sim_result r = run_ok(t, cases[i].policy, sets);
        double want_hits = 5.0 * model.n_moe_layers;
        if (!strcmp(cases[i].policy, "oracle")) {
            double loads = -1;
            for (size_t j = 0; j < r.n_policy_report; j++)
                if (!strcmp(r.policy_report_names[j], "loads")) loads = r.policy_report_values[j];
            cr_expect_float_eq(loads, accesses(t) - want_hits, 1e-9, "oracle: %.0f loads", loads);
        } else {
            cr_expect_float_eq(r.hit_rate, want_hits / accesses(t), 1e-12, "%s %s: hit rate %.6f",
                               cases[i].policy, cases[i].extra ? cases[i].extra : "", r.hit_rate);
        }
        trace_destroy(t);
    }
}

/* ---- static ---- */

Test(policy_baselines, static_refuses_a_budget_that_cannot_hold_every_expert) {
    uint16_t rows[4][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7}};
    trace *t = make_trace(4, rows, false, NULL);
    /* bf16 Mixtral experts: 32 x 8 x 3 x 4096 x 14336 x 2 bytes ~ 84 GiB, far above 24 GiB */
    const char *sets[] = {"expert.precision=bf16", NULL};
    sim_result r;
    moesim_error err;
    cr_assert_eq(run_sim(t, "static", sets, &r, &err), MOESIM_EINPUT);
    uint64_t need = (uint64_t)model.n_moe_layers * model.n_experts *
                    model_expert_bytes(&model, &quant, PREC_BF16);
    char want[96];
    snprintf(want, sizeof want, "all 256 experts at bf16 need %llu bytes",
             (unsigned long long)need);
    cr_expect(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
    cr_expect(strstr(err.msg, "expert budget is") != NULL, "message '%s'", err.msg);
    cr_expect(strchr(err.msg, '\n') == NULL, "one line: '%s'", err.msg);
    trace_destroy(t);
}

Test(policy_baselines, static_never_misses_and_places_each_expert_once_when_it_fits) {
    trace *t = make_random_trace(11, 24, false);
    /* int2 Mixtral experts: ~ 256 x 44 MiB ~ 11 GiB, inside the 3090's 24 GiB */
    const char *sets[] = {"expert.precision=int2", NULL};
    sim_result r = run_ok(t, "static", sets);
    cr_expect_float_eq(r.hit_rate, 1.0, 1e-12, "hit rate %.6f", r.hit_rate);
    uint64_t all = (uint64_t)model.n_moe_layers * model.n_experts *
                   model_expert_bytes(&model, &quant, PREC_INT2);
    /* the placement happens at warmup (before the clock starts); the run moves nothing */
    cr_expect_eq(r.warmup_h2d_bytes, all, "warmup %llu bytes, every expert once is %llu",
                 (unsigned long long)r.warmup_h2d_bytes, (unsigned long long)all);
    cr_expect_eq(r.h2d_bytes, 0, "h2d %llu bytes during the run", (unsigned long long)r.h2d_bytes);
    cr_expect_float_eq(r.precision_mix_skip, 0.0, 1e-12);
    trace_destroy(t);
}

/* ---- mixtral-offload ---- */

Test(policy_baselines, mixtral_offload_prefetches_the_predicted_next_layer_experts) {
    trace *t = make_random_trace(5, 48, true);
    const char *sets[] = {"cache.experts_per_layer=3", "expert.precision=int4", NULL};
    sim_result mo = run_ok(t, "mixtral-offload", sets);
    cr_expect_gt(mo.prefetches, 0);
    /* the predictions are the true next layer: every prefetched expert is used (FIRM-MoE Eq. 8) */
    cr_expect_float_eq(mo.prefetch_utilization, 1.0, 1e-12, "utilization %.6f",
                       mo.prefetch_utilization);
    cr_expect(!mo.predictor_emulated);
    trace_destroy(t);
}

Test(policy_baselines, mixtral_offload_beats_lru_when_predictions_are_right) {
    cr_assert(policy_lookup("lru") != NULL, "lru is registered");
    /* A guess counts as a hit only once its copy has landed when the next layer's router runs
     * (sim: hits are accesses resident after on_route). On the 3090's PCIe an int4 Mixtral
     * expert (~94 MiB) takes ~4 ms, far longer than a decode layer, so the hit-rate gain needs a
     * link fast enough for a guess to land within one layer: 10 TB/s, no per-copy latency. On
     * the real link the gain shows as less stall (checked below). */
    hw_profile real = hw;
    hw.h2d_bytes_per_s = 1e13;
    hw.h2d_latency_ns = 0;
    static const struct {
        uint64_t seed;
        const char *capacity;
    } cases[] = {{1, "cache.experts_per_layer=3"},
                 {2, "cache.experts_per_layer=4"},
                 {3, "cache.experts_per_layer=6"},
                 {4, "memory.budget_gb=16"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trace *t = make_random_trace(cases[i].seed, 48, true);
        const char *sets[] = {cases[i].capacity, "expert.precision=int4", NULL};
        sim_result mo = run_ok(t, "mixtral-offload", sets);
        sim_result lru = run_ok(t, "lru", sets);
        cr_expect_gt(mo.hit_rate, lru.hit_rate, "%s: mixtral-offload %.4f, lru %.4f",
                     cases[i].capacity, mo.hit_rate, lru.hit_rate);
        trace_destroy(t);
    }
    hw = real;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trace *t = make_random_trace(cases[i].seed, 48, true);
        const char *sets[] = {cases[i].capacity, "expert.precision=int4", NULL};
        sim_result mo = run_ok(t, "mixtral-offload", sets);
        sim_result lru = run_ok(t, "lru", sets);
        cr_expect_lt(mo.stall_ms, lru.stall_ms, "%s: stall mixtral-offload %.1f ms, lru %.1f ms",
                     cases[i].capacity, mo.stall_ms, lru.stall_ms);
        trace_destroy(t);
    }
}

Test(policy_baselines, mixtral_offload_without_predictions_is_exactly_lru) {
    cr_assert(policy_lookup("lru") != NULL, "lru is registered");
    /* no recorded predictions and the emulated predictor switched off (predictor.depth=0): the
     * policy's LRU part alone, which must make lru's decisions (same hits, same bytes) */
    static const char *const capacities[] = {"cache.experts_per_layer=2",
                                             "cache.experts_per_layer=5", "memory.budget_gb=16"};
    for (size_t i = 0; i < sizeof capacities / sizeof capacities[0]; i++) {
        trace *t = make_random_trace(30 + i, 40, false);
        const char *sets[] = {capacities[i], "expert.precision=int4", "predictor.depth=0", NULL};
        sim_result mo = run_ok(t, "mixtral-offload", sets), lru = run_ok(t, "lru", sets);
        cr_expect_eq(mo.prefetches, 0);
        cr_expect_eq(mo.hits, lru.hits, "%s: hits %llu vs lru %llu", capacities[i],
                     (unsigned long long)mo.hits, (unsigned long long)lru.hits);
        cr_expect_eq(mo.h2d_bytes, lru.h2d_bytes, "%s", capacities[i]);
        trace_destroy(t);
    }
}

Test(policy_baselines, mixtral_offload_speculates_into_pools_of_top_k_experts) {
    /* pools of top_k = 2 experts per layer, the paper's 12 GB setting (Eliseev & Mazur 2023,
     * Sec. 4): the guesses still go into the next layer's cache, evicting what the current route
     * does not use. Right guesses make it faster than lru; wrong ones never skip an expert and
     * are dropped before their copy starts or counted as wasted. */
    uint16_t rows[12][2], next[12][2], wrong[12][2];
    for (int i = 0; i < 12; i++) {
        rows[i][0] = (uint16_t)(i % 6), rows[i][1] = (uint16_t)((i + 3) % 6);
        wrong[i][0] = 6, wrong[i][1] = 7;
    }
    memcpy(next, rows, sizeof next); /* every layer routes like the previous one: perfect guess */
    const char *sets[] = {"cache.experts_per_layer=2", "expert.precision=int4", NULL};
    trace *t = make_trace(12, rows, true, next);
    sim_result mo = run_ok(t, "mixtral-offload", sets), lru = run_ok(t, "lru", sets);
    cr_expect_gt(mo.prefetches, 0);
    cr_expect_eq(mo.skipped_accesses, 0);
    cr_expect_float_eq(mo.prefetch_utilization, 1.0, 1e-12, "every guess is used");
    cr_expect_lt(mo.makespan_ms, lru.makespan_ms, "%.3f ms vs lru %.3f ms", mo.makespan_ms,
                 lru.makespan_ms);
    trace_destroy(t);

    t = make_trace(12, rows, true, wrong);
    mo = run_ok(t, "mixtral-offload", sets);
    cr_expect_gt(mo.prefetches, 0);
    cr_expect_eq(mo.skipped_accesses, 0);
    cr_expect_eq(mo.prefetch_late, 0);
    cr_expect_gt(mo.prefetch_cancelled + mo.prefetch_wasted_bytes, 0);
    trace_destroy(t);
}

Test(policy_baselines, mixtral_offload_wastes_every_prefetch_when_predictions_are_wrong) {
    /* tokens route among experts 0..5 while every prediction names 6 and 7: each prefetch is
     * loaded and never used (FIRM-MoE Eq. 8 utilization 0) */
    uint16_t rows[12][2], wrong[12][2];
    for (int i = 0; i < 12; i++) {
        rows[i][0] = (uint16_t)(i % 6), rows[i][1] = (uint16_t)((i + 3) % 6);
        wrong[i][0] = 6, wrong[i][1] = 7;
    }
    trace *t = make_trace(12, rows, true, wrong);
    const char *sets[] = {"cache.experts_per_layer=4", "expert.precision=int4", NULL};
    sim_result mo = run_ok(t, "mixtral-offload", sets);
    cr_expect_gt(mo.prefetches, 0);
    cr_expect_float_eq(mo.prefetch_utilization, 0.0, 1e-12, "utilization %.6f",
                       mo.prefetch_utilization);
    cr_expect_eq(mo.skipped_accesses, 0, "a wrong guess never costs a demand load its place");
    trace_destroy(t);
}

/* ---- oracle ---- */

Test(policy_baselines, oracle_hit_rate_bounds_lru_lfu_and_mixtral_offload_on_random_traces) {
    /* every policy the oracle must bound, with the settings each adds to the case's */
    static const struct {
        const char *policy;
        const char *extra;
    } others[] = {{"lru", NULL},
                  {"lru", "lru.scope=global"},
                  {"lfu", NULL},
                  {"lfu", "lfu.scope=global"},
                  {"lfu", "lfu.halve_every_steps=4"},
                  {"mixtral-offload", NULL},
                  {"static", NULL},
                  {"ondemand", NULL}};
    static const struct {
        uint64_t seed;
        const char *capacity;
        const char *precision;
        bool lookahead;
        bool shared_budget; /* the global-scope variants apply */
    } cases[] = {{21, "cache.experts_per_layer=2", "expert.precision=int4", true, false},
                 {22, "cache.experts_per_layer=4", "expert.precision=int4", true, false},
                 {23, "cache.experts_per_layer=6", "expert.precision=int4", false, false},
                 {24, "memory.budget_gb=16", "expert.precision=int4", true, true},
                 {25, "memory.budget_gb=10", "expert.precision=int4", false, true},
                 {26, "memory.budget_gb=24", "expert.precision=int2", true, true}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trace *t = make_random_trace(cases[i].seed, 40, cases[i].lookahead);
        const char *sets[] = {cases[i].capacity, cases[i].precision, NULL, NULL};
        sim_result oracle = run_ok(t, "oracle", sets);
        size_t compared = 0, applicable = 0;
        for (size_t j = 0; j < sizeof others / sizeof others[0]; j++) {
            cr_assert(policy_lookup(others[j].policy), "no policy named '%s' is registered",
                      others[j].policy);
            if (others[j].extra && strstr(others[j].extra, "global") && !cases[i].shared_budget)
                continue;
            applicable++;
            sets[2] = others[j].extra;
            sim_result r;
            moesim_error err;
            if (run_sim(t, others[j].policy, sets, &r, &err) != MOESIM_OK) {
                /* only static may refuse (the experts do not fit) */
                cr_expect_str_eq(others[j].policy, "static", "%s", err.msg);
                continue;
            }
            compared++;
            cr_expect_geq(oracle.hit_rate, r.hit_rate, "seed %llu, %s: oracle %.4f < %s %s %.4f",
                          (unsigned long long)cases[i].seed, cases[i].capacity, oracle.hit_rate,
                          others[j].policy, others[j].extra ? others[j].extra : "", r.hit_rate);
        }
        /* every applicable policy is compared; only static may refuse (checked above) */
        cr_assert_geq(applicable, 6);
        cr_assert_geq(compared + 1, applicable, "seed %llu: %zu of %zu compared",
                      (unsigned long long)cases[i].seed, compared, applicable);
        trace_destroy(t);
    }
}
