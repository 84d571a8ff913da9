/* FIRM-MoE: the pure pieces (Eq. 5 top-K, Eq. 6 intersection, Eq. 11 loss, Algorithm 1's hill
 * climber) and the policy against a small in-test memory system that records every load and
 * eviction (class, parts), so sub-expert prefetch and the sub-expert LRU are checked exactly. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/check.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "policies/firm_moe.h"
#include "sim/sim.h"
#include "support/test_support.h"
#include "traces/synth.h"

/* ---- Eq. 5: TopKIndices over recorded candidates ---- */

typedef struct topk_case {
    const char *what;
    uint16_t ids[6];
    float scores[6];
    bool no_scores;
    uint32_t K;
    uint32_t want_n;
    uint16_t want[6];
} topk_case;

static const topk_case topk_cases[] = {
    {"highest scores first",
     {4, 7, 1, 2, 9, 3},
     {.1f, .9f, .5f, .2f, .7f, .0f},
     false,
     3,
     3,
     {7, 9, 1}},
    {"no scores: recorded order", {4, 7, 1, 2, 9, 3}, {0}, true, 2, 2, {4, 7}},
    {"unrecorded ids and ids past the last expert skipped",
     {POLICY_NO_EXPERT, 5, POLICY_NO_EXPERT, 6, 12, 0},
     {.9f, .1f, .8f, .3f, .2f, .05f},
     false,
     4,
     3,
     {6, 5, 0}},
    {"K beyond the valid candidates",
     {1, 2, POLICY_NO_EXPERT, POLICY_NO_EXPERT, 30, 31},
     {.3f, .4f, 0, 0, .9f, .9f},
     false,
     5,
     2,
     {2, 1}},
    {"equal scores keep recorded order",
     {8, 3, 5, 0, 1, 2},
     {.5f, .5f, .5f, .1f, .1f, .1f},
     false,
     2,
     2,
     {8, 3}},
    {"repeated id counted once",
     {3, 3, 4, 5, 6, 7},
     {.9f, .8f, .7f, .1f, .1f, .1f},
     false,
     2,
     2,
     {3, 4}},
    {"a repeat keeps the score of its first occurrence",
     {5, 1, 2, 5, 6, 7},
     {.1f, .9f, .8f, .95f, .05f, 0},
     false,
     2,
     2,
     {1, 2}},
    {"scores in order: the first valid ids",
     {POLICY_NO_EXPERT, 5, 20, 6, 5, 0},
     {.9f, .8f, .7f, .6f, .5f, .4f},
     false,
     3,
     3,
     {5, 6, 0}},
};

Test(firm_mol, topk_select_keeps_the_K_best_valid_candidates_in_score_order) {
    for (size_t c = 0; c < sizeof topk_cases / sizeof topk_cases[0]; c++) {
        const topk_case *tc = &topk_cases[c];
        uint16_t out[6] = {0};
        /* a 12-expert layer: ids 12 and above are not experts */
        uint32_t n =
            firm_topk_select(tc->ids, tc->no_scores ? NULL : tc->scores, 6, tc->K, 12, out);
        cr_assert_eq(n, tc->want_n, "%s: count %u", tc->what, n);
        for (uint32_t i = 0; i < n; i++)
            cr_assert_eq(out[i], tc->want[i], "%s: out[%u] = %u, want %u", tc->what, i, out[i],
                         tc->want[i]);
    }
}

/* ---- Eq. 6: intersection of the participating layers' sets ---- */

typedef struct mol_case {
    const char *what;
    uint32_t n_sets;
    uint16_t sets[3][4];
    uint32_t sizes[3];
    uint32_t want_n;
    uint16_t want[4];
} mol_case;

static const mol_case mol_cases[] = {
    {"P = 1 is the previous layer's top-K", 1, {{5, 2, 9}}, {3}, 3, {5, 2, 9}},
    {"three layers agree on two experts",
     3,
     {{5, 2, 9, 1}, {2, 7, 5, 3}, {1, 5, 2, 8}},
     {4, 4, 4},
     2,
     {5, 2}},
    {"order of the nearest layer", 2, {{9, 1, 4}, {4, 9, 1}}, {3, 3}, 3, {9, 1, 4}},
    {"disjoint layers predict nothing", 2, {{1, 2}, {3, 4}}, {2, 2}, 0, {0}},
    {"an empty participant empties the meeting", 3, {{1, 2}, {1, 2}, {0}}, {2, 2, 0}, 0, {0}},
    {"no participant: nothing", 0, {{0}}, {0}, 0, {0}},
};

Test(firm_mol, intersection_keeps_experts_every_participating_layer_predicts) {
    for (size_t c = 0; c < sizeof mol_cases / sizeof mol_cases[0]; c++) {
        const mol_case *mc = &mol_cases[c];
        const uint16_t *sets[3] = {mc->sets[0], mc->sets[1], mc->sets[2]};
        uint16_t out[4];
        uint32_t n = firm_mol_intersect(sets, mc->sizes, mc->n_sets, out);
        cr_assert_eq(n, mc->want_n, "%s: count %u, want %u", mc->what, n, mc->want_n);
        for (uint32_t i = 0; i < n; i++)
            cr_assert_eq(out[i], mc->want[i], "%s: out[%u]", mc->what, i);
    }
}

/* ---- Eq. 11 ---- */

Test(firm_heop, counts_unused_miss_and_hit_and_weighs_them_as_eq_11) {
    const uint16_t pred[] = {1, 4, 6, 9};                /* 6 and 9 unused */
    const uint16_t active[] = {1, 2, 4, 7};              /* 2 and 7 missed */
    const bool predicted[] = {true, false, true, false}; /* active[i] in pred */
    const bool cached[] = {true, true, false, false};
    firm_heop_counts c = {0};
    firm_heop_count(MOESIM_ARRAY_LEN(pred), predicted, cached, MOESIM_ARRAY_LEN(active), &c);
    cr_assert_eq(c.n_unused, 2);
    cr_assert_eq(c.n_miss, 2);
    cr_assert_eq(c.n_hit, 1, "1 is cached but predicted: credited as not missed, not also as hit");
    const bool none[] = {false, false, false, false};
    firm_heop_count(0, none, cached, 4, &c); /* a second layer with no prediction */
    cr_assert_eq(c.n_unused, 2);
    cr_assert_eq(c.n_miss, 6);
    cr_assert_eq(c.n_hit, 3);
    /* (0.5 * 2 + 0.25 * (6 - 3)) / 2 layers */
    cr_assert_float_eq(firm_heop_loss(0.5, 0.25, &c, 2), 0.875, 1e-12);
}

/* ---- Algorithm 1 ---- */

static double loss_increasing_in_K(uint32_t K, uint32_t P) {
    (void)P;
    return (double)K;
}

static double loss_bowl(uint32_t K, uint32_t P) {
    double dk = (double)K - 3.0, dp = (double)P - 2.0;
    return dk * dk + 2.0 * dp * dp;
}

/* Runs `steps` decode steps of one group: one loss per step, a move every n_update steps. */
static void heop_run(firm_heop_group *g, double (*loss)(uint32_t, uint32_t), uint64_t steps,
                     uint64_t n_update, uint64_t patience, uint32_t *K_seen, uint32_t *P_seen) {
    for (uint64_t t = 1; t <= steps; t++) {
        firm_heop_group_record(g, loss(g->K, g->P));
        if (t % n_update == 0) {
            firm_heop_group_update(g, t, patience);
            if (K_seen) K_seen[t / n_update] = g->K;
            if (P_seen) P_seen[t / n_update] = g->P;
        }
    }
}

Test(firm_heop, every_update_moves_exactly_one_of_K_or_P_by_one) {
    /* the move starts from the configuration just measured, or from the incumbent after a
     * reversal */
    firm_heop_group g;
    firm_heop_group_init(&g, 5, 2, 8, 3, FIRM_DIM_P, -1, true);
    uint32_t K_prev = g.K, P_prev = g.P;
    for (uint64_t t = 1; t <= 400; t++) {
        firm_heop_group_record(&g, loss_bowl(g.K, g.P));
        if (t % 10 != 0) continue;
        cr_assert(firm_heop_group_update(&g, t, 20));
        int dk = (int)g.K - (int)K_prev, dp = (int)g.P - (int)P_prev;
        int ik = (int)g.K - (int)g.best_K, ip = (int)g.P - (int)g.best_P;
        cr_assert(abs(dk) + abs(dp) == 1 || abs(ik) + abs(ip) == 1,
                  "step %lu: (%u,%u) -> (%u,%u), incumbent (%u,%u)", (unsigned long)t, K_prev,
                  P_prev, g.K, g.P, g.best_K, g.best_P);
        cr_assert(g.K >= 1 && g.K <= 8 && g.P >= 1 && g.P <= 3);
        K_prev = g.K;
        P_prev = g.P;
    }
    firm_heop_group_free(&g);
}

Test(firm_heop, direction_reverses_after_patience_steps_without_improvement) {
    /* loss = K, climbing K upwards: the first window (K = 4) is the best; 20 steps later (two
     * windows at K = 5 and 6, patience 20) delta turns to -1 and the search goes on downwards
     * from the incumbent K = 4 */
    firm_heop_group g;
    firm_heop_group_init(&g, 4, 2, 8, 3, FIRM_DIM_K, +1, true);
    uint32_t K_seen[5] = {0};
    heop_run(&g, loss_increasing_in_K, 40, 10, 20, K_seen, NULL);
    cr_assert_eq(K_seen[1], 5); /* step 10: best = 4, move up */
    cr_assert_eq(K_seen[2], 6); /* step 20: no improvement for 10 steps < patience */
    cr_assert_eq(K_seen[3], 3); /* step 30: 20 steps without improvement: reversed */
    cr_assert_eq(K_seen[4], 2); /* step 40: K = 3 improved on 4: keep going */
    cr_assert_eq(g.delta, -1);
    cr_assert_eq(g.P, 2); /* only K moved */
    firm_heop_group_free(&g);
}

Test(firm_heop, longer_patience_keeps_the_direction_longer) {
    firm_heop_group g;
    firm_heop_group_init(&g, 2, 1, 8, 3, FIRM_DIM_K, +1, true);
    uint32_t K_seen[6] = {0};
    heop_run(&g, loss_increasing_in_K, 50, 10, 40, K_seen, NULL);
    cr_assert_eq(K_seen[4], 6); /* step 40: 30 steps since the improvement at 10: still up */
    cr_assert_eq(K_seen[5], 1); /* step 50: 40 steps: reversed, below the incumbent K = 2 */
    firm_heop_group_free(&g);
}

Test(firm_heop, settles_on_the_argmin_of_the_historical_average_cost) {
    /* a bowl with its minimum at (3, 2) inside [1,8] x [1,3], from every corner and direction */
    const uint32_t starts[][2] = {{1, 1}, {8, 3}, {8, 1}, {1, 3}, {5, 2}};
    for (size_t s = 0; s < sizeof starts / sizeof starts[0]; s++) {
        for (int dim = 0; dim < 2; dim++) {
            for (int sign = -1; sign <= 1; sign += 2) {
                firm_heop_group g;
                firm_heop_group_init(&g, starts[s][0], starts[s][1], 8, 3, (firm_dim)dim, sign,
                                     true);
                heop_run(&g, loss_bowl, 600, 10, 20, NULL, NULL);
                uint32_t K, P;
                firm_heop_group_best(&g, &K, &P);
                cr_assert_eq(K, 3, "start (%u,%u) dim %d sign %d: K = %u", starts[s][0],
                             starts[s][1], dim, sign, K);
                cr_assert_eq(P, 2, "start (%u,%u) dim %d sign %d: P = %u", starts[s][0],
                             starts[s][1], dim, sign, P);
                firm_heop_group_free(&g);
            }
        }
    }
}

Test(firm_heop, best_is_the_lowest_average_not_the_last_visited) {
    firm_heop_group g;
    firm_heop_group_init(&g, 2, 1, 4, 2, FIRM_DIM_K, +1, true);
    g.K = 2, g.P = 1;
    firm_heop_group_record(&g, 3.0);
    firm_heop_group_record(&g, 1.0); /* (2,1): average 2 */
    g.K = 4, g.P = 2;
    firm_heop_group_record(&g, 2.5); /* (4,2): 2.5 */
    g.K = 1, g.P = 2;
    firm_heop_group_record(&g, 2.0); /* (1,2): 2, ties with (2,1): smaller K wins */
    uint32_t K, P;
    firm_heop_group_best(&g, &K, &P);
    cr_assert_eq(K, 1);
    cr_assert_eq(P, 2);
    firm_heop_group_free(&g);
}

Test(firm_heop, the_paper_split_is_figure_6s_five_shallow_and_four_deep_of_sixteen) {
    for (uint32_t l = 0; l < 16; l++) {
        uint32_t want = l < 5 ? 0 : l < 12 ? 1 : 2;
        cr_assert_eq(firm_group_of_layer(l, 16, 3, true), want, "layer %u", l);
    }
    /* scaled: 48 layers (Qwen3-30B-A3B) 15 / 21 / 12; 3 layers one each */
    cr_assert_eq(firm_group_of_layer(14, 48, 3, true), 0);
    cr_assert_eq(firm_group_of_layer(15, 48, 3, true), 1);
    cr_assert_eq(firm_group_of_layer(36, 48, 3, true), 2);
    for (uint32_t l = 0; l < 3; l++) cr_assert_eq(firm_group_of_layer(l, 3, 3, true), l);
}

Test(firm_heop, algorithm_1_reverses_and_switches_dimension_from_the_configuration_in_force) {
    /* loss = K from (4, 2) moving K up: windows at K = 5, 6 bring no improvement; after 20 steps
     * (patience) delta turns to -1 and the dimension to P, moving on from (6, 2): (6, 1) */
    firm_heop_group g;
    firm_heop_group_init(&g, 4, 2, 8, 3, FIRM_DIM_K, +1, false);
    uint32_t K_seen[4] = {0}, P_seen[4] = {0};
    heop_run(&g, loss_increasing_in_K, 30, 10, 20, K_seen, P_seen);
    cr_assert_eq(K_seen[1], 5);
    cr_assert_eq(K_seen[2], 6);
    cr_assert_eq(K_seen[3], 6, "not back to the incumbent K = 4");
    cr_assert_eq(P_seen[3], 1);
    cr_assert_eq(g.dim, FIRM_DIM_P);
    cr_assert_eq(g.delta, -1);
    firm_heop_group_free(&g);
}

/* Windows of 10 steps at one configuration each, losses 1.0, 0.5, 0.55: the third window is no
 * improvement on its own (0.55 > 0.5) but lowers the average of the whole history H_g (20.5 / 30
 * = 0.683 < 15 / 20 = 0.75), the improvement Algorithm 1 line 14 measures. */
static void heop_three_windows(firm_heop_group *g) {
    static const double window_loss[3] = {1.0, 0.5, 0.55};
    for (int w = 0; w < 3; w++) {
        for (int i = 0; i < 10; i++) firm_heop_group_record(g, window_loss[w]);
        firm_heop_group_update(g, (uint64_t)(w + 1) * 10, 1000);
    }
}

Test(firm_heop, line_14_averages_the_whole_history_unless_the_window_knob_is_set) {
    firm_heop_group g;
    firm_heop_group_init(&g, 2, 1, 8, 3, FIRM_DIM_K, +1, false);
    g.history_average = true;
    heop_three_windows(&g);
    /* K 2 -> 3 -> 4 -> 5; the third window ran at K = 4 and improved the history average */
    cr_assert_eq(g.best_K, 4);
    cr_assert_float_eq(g.best_window, 20.5 / 30.0, 1e-12, "%g", g.best_window);
    firm_heop_group_free(&g);
    firm_heop_group_init(&g, 2, 1, 8, 3, FIRM_DIM_K, +1, false);
    heop_three_windows(&g);
    cr_assert_eq(g.best_K, 3, "window: the second window (K = 3) stays the best");
    cr_assert_float_eq(g.best_window, 0.5, 1e-12);
    firm_heop_group_free(&g);
}

Test(firm_heop, prefetch_granularity_by_model_size_follows_table_2) {
    /* Table 2: OLMoE-1B-7B n = 1; Qwen1.5-MoE-A2.7B and DeepSeek-MoE-16B n = 2 */
    static const struct {
        const char *model;
        uint32_t n;
    } want[] = {
        {"olmoe-1b-7b", 1}, {"qwen1.5-moe-a2.7b", 2}, {"deepseek-v2-lite", 2}, {"mixtral-8x7b", 2}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        model_geometry m;
        moesim_error err = {0};
        cr_assert_eq(model_load_by_name(want[i].model, &m, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_eq(firm_prefetch_parts_for_model(model_total_params(&m)), want[i].n, "%s",
                     want[i].model);
    }
}

Test(firm_heop, layers_split_into_shallow_middle_and_deep_groups) {
    /* 16 layers (OLMoE) in 3 groups: 0-5, 6-10, 11-15 */
    for (uint32_t l = 0; l < 16; l++) {
        uint32_t want = l < 6 ? 0 : l < 11 ? 1 : 2;
        cr_assert_eq(firm_group_of_layer(l, 16, 3, false), want, "layer %u", l);
    }
    cr_assert_eq(firm_group_of_layer(23, 24, 1, false), 0);
}

/* ---- the policy against a recording memory system ---- */

#define FM_L   4
#define FM_E   8
#define FM_LOG 512

typedef struct fm_load {
    uint32_t layer, expert, mask;
    policy_class cls;
} fm_load;

struct policy_mem {
    policy_residency st[FM_L][FM_E][PART_COUNT];
    bool started[FM_L][FM_E]; /* a copy already running: eviction refused */
    uint64_t part_bytes, budget_bytes, used_bytes;
    fm_load loads[FM_LOG];
    size_t n_loads;
    fm_load evicts[FM_LOG];
    size_t n_evicts;
};

static policy_residency fm_state(const policy_mem *m, uint32_t layer, uint32_t expert,
                                 moesim_precision p, expert_part part) {
    cr_assert_eq(p, PREC_BF16);
    return m->st[layer][expert][part];
}

static policy_mem_result fm_load_parts(policy_mem *m, uint32_t layer, uint32_t expert,
                                       moesim_precision p, uint32_t mask, policy_class cls) {
    cr_assert_eq(p, PREC_BF16);
    uint64_t need = 0;
    for (uint32_t part = 0; part < PART_COUNT; part++)
        if ((mask & (1u << part)) && m->st[layer][expert][part] == POLICY_ABSENT)
            need += m->part_bytes;
    if (need == 0) return POLICY_ALREADY;
    if (m->used_bytes + need > m->budget_bytes) return POLICY_REFUSED;
    for (uint32_t part = 0; part < PART_COUNT; part++)
        if ((mask & (1u << part)) && m->st[layer][expert][part] == POLICY_ABSENT)
            m->st[layer][expert][part] = POLICY_LOADING;
    m->used_bytes += need;
    cr_assert_lt(m->n_loads, FM_LOG);
    m->loads[m->n_loads++] = (fm_load){layer, expert, mask, cls};
    return POLICY_ISSUED;
}

static policy_mem_result fm_evict(policy_mem *m, uint32_t layer, uint32_t expert,
                                  moesim_precision p, uint32_t mask) {
    cr_assert_eq(p, PREC_BF16);
    if (m->started[layer][expert]) return POLICY_REFUSED;
    bool any = false;
    for (uint32_t part = 0; part < PART_COUNT; part++) {
        if (!(mask & (1u << part)) || m->st[layer][expert][part] == POLICY_ABSENT) continue;
        m->st[layer][expert][part] = POLICY_ABSENT;
        m->used_bytes -= m->part_bytes;
        any = true;
    }
    if (!any) return POLICY_ALREADY;
    m->evicts[m->n_evicts++] = (fm_load){layer, expert, mask, POLICY_DEMAND};
    return POLICY_ISSUED;
}

static uint64_t fm_free(const policy_mem *m, uint32_t layer) {
    (void)layer;
    return m->budget_bytes - m->used_bytes;
}

static uint64_t fm_used(const policy_mem *m, moesim_precision p) {
    (void)p;
    return m->used_bytes;
}

static const policy_mem_ops fm_ops = {.state = fm_state,
                                      .load = fm_load_parts,
                                      .evict = fm_evict,
                                      .free_bytes = fm_free,
                                      .used_bytes = fm_used};

/* Every copy finishes (between steps, as if the copy engine caught up). */
static void fm_complete(policy_mem *m) {
    for (uint32_t l = 0; l < FM_L; l++)
        for (uint32_t e = 0; e < FM_E; e++)
            for (uint32_t q = 0; q < PART_COUNT; q++)
                if (m->st[l][e][q] == POLICY_LOADING) m->st[l][e][q] = POLICY_RESIDENT;
}

#define FM_D  3
#define FM_KP 4

typedef struct fm_run {
    model_geometry model;
    policy_params params;
    firm_knobs knobs;
    policy_mem mem;
    policy *pol;
} fm_run;

static firm_knobs fm_knobs_default(void) {
    return (firm_knobs){.K = 2,
                        .P = 3,
                        .n = 1,
                        .alpha = 0.5,
                        .beta = 0.5,
                        .n_update = 10,
                        .patience = 20,
                        .groups = 1,
                        .heop = false,
                        .prefetch = true,
                        .profile_steps = 200};
}

static void fm_init(fm_run *r, const firm_knobs *k, uint64_t budget_experts) {
    memset(r, 0, sizeof *r);
    r->knobs = *k;
    r->params.model = &r->model;
    r->params.n_layers = FM_L;
    r->params.n_experts = FM_E;
    r->params.top_k = 2;
    for (uint32_t q = 0; q < PART_COUNT; q++) r->params.part_bytes[PREC_BF16][q] = 100;
    r->params.expert_budget_bytes = budget_experts * 300;
    r->params.precision = PREC_BF16;
    r->params.batch_size = 1;
    r->params.lookahead_depth = FM_D;
    r->params.lookahead_k = FM_KP;
    r->params.seed = 7;
    r->mem.part_bytes = 100;
    r->mem.budget_bytes = r->params.expert_budget_bytes;
}

static moesim_status fm_create(fm_run *r, moesim_error *err) {
    policy_mem_view view = {.ops = &fm_ops, .mem = &r->mem};
    return policy_firm_moe.create(&r->params, &r->knobs, view, &r->pol, err);
}

static moesim_status fm_open(fm_run *r, const firm_knobs *k, uint64_t budget_experts,
                             moesim_error *err) {
    fm_init(r, k, budget_experts);
    return fm_create(r, err);
}

/* One token's route for `layer`: activated experts `act` (2), look-ahead rows la[d][K']. */
static void fm_route(fm_run *r, uint64_t step, uint32_t layer, const uint16_t act[2],
                     const uint16_t la[FM_D][FM_KP]) {
    uint16_t experts[2] = {act[0], act[1]};
    float gates[2] = {0.6f, 0.4f};
    uint16_t ids[FM_D][FM_KP];
    float scores[FM_D][FM_KP];
    for (uint32_t d = 0; d < FM_D; d++)
        for (uint32_t j = 0; j < FM_KP; j++) {
            ids[d][j] = la[d][j];
            scores[d][j] = 1.0f - 0.1f * (float)j; /* listed order = score order */
        }
    uint16_t active[2] = {act[0] < act[1] ? act[0] : act[1], act[0] < act[1] ? act[1] : act[0]};
    uint32_t active_tokens[2] = {1, 1};
    float active_gate[2] = {0.6f, 0.4f};
    policy_route route = {.layer = layer,
                          .now_ns = step * 1000 + layer,
                          .n_tokens = 1,
                          .top_k = 2,
                          .experts = experts,
                          .gates = gates,
                          .lookahead_ids = &ids[0][0],
                          .lookahead_scores = &scores[0][0],
                          .n_active = 2,
                          .active = active,
                          .active_tokens = active_tokens,
                          .active_gate = active_gate};
    uint8_t run[2] = {POLICY_RUN_SKIP, POLICY_RUN_SKIP};
    policy_plan plan = {run};
    policy_firm_moe.on_route(r->pol, &route, &plan);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(run[i], PREC_BF16);
        for (uint32_t q = 0; q < PART_COUNT; q++)
            cr_assert_neq(r->mem.st[layer][active[i]][q], POLICY_ABSENT,
                          "layer %u expert %u part %u not loading after on_route", layer, active[i],
                          q);
    }
}

static void fm_step_kind(fm_run *r, uint64_t index, bool begin, bool prefill) {
    uint32_t req = 0, pos = (uint32_t)index;
    policy_step s = {.index = index,
                     .now_ns = index * 1000,
                     .n_tokens = 1,
                     .is_prefill = prefill,
                     .request = &req,
                     .position = &pos};
    if (begin)
        policy_firm_moe.begin_step(r->pol, &s);
    else
        policy_firm_moe.end_step(r->pol, &s, index * 1000 + 999);
}

static void fm_step(fm_run *r, uint64_t index, bool begin) { fm_step_kind(r, index, begin, false); }

static size_t fm_prefetches(const fm_run *r, uint32_t layer, fm_load *out, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < r->mem.n_loads; i++)
        if (r->mem.loads[i].cls == POLICY_PREFETCH && r->mem.loads[i].layer == layer && n < cap)
            out[n++] = r->mem.loads[i];
    return n;
}

static const uint16_t NONE = POLICY_NO_EXPERT;

Test(firm_policy, meeting_of_layers_intersects_the_look_ahead_of_the_previous_P_layers) {
    /* layer 3 is predicted by layer 2 at d = 1, layer 1 at d = 2 and layer 0 at d = 3, top-2
     * each: {5, 6} & {6, 5} & {6, 1} = {6} (5 is not in layer 0's top-2) */
    firm_knobs k = fm_knobs_default();
    fm_run r;
    moesim_error err = {0};
    cr_assert_eq(fm_open(&r, &k, 32, &err), MOESIM_OK, "%s", err.msg);
    const uint16_t act[2] = {0, 1};
    const uint16_t la0[FM_D][FM_KP] = {{2, 3, 4, 7}, {3, 2, 7, 4}, {6, 1, 5, 0}};
    const uint16_t la1[FM_D][FM_KP] = {{3, 4, 0, 1}, {6, 5, 2, 3}, {NONE, NONE, NONE, NONE}};
    const uint16_t la2[FM_D][FM_KP] = {
        {5, 6, 7, 0}, {NONE, NONE, NONE, NONE}, {NONE, NONE, NONE, NONE}};
    fm_step(&r, 0, true);
    fm_route(&r, 0, 0, act, la0);
    fm_route(&r, 0, 1, act, la1);
    fm_route(&r, 0, 2, act, la2);
    fm_load pf[8];
    size_t n = fm_prefetches(&r, 3, pf, 8);
    cr_assert_eq(n, 1, "prefetches for layer 3: %zu", n);
    cr_assert_eq(pf[0].expert, 6);
    /* layer 1 had one predecessor: its prediction is layer 0's top-2 at d = 1 */
    n = fm_prefetches(&r, 1, pf, 8);
    cr_assert_eq(n, 2);
    cr_assert_eq(pf[0].expert, 2);
    cr_assert_eq(pf[1].expert, 3);
    /* layer 2: {3, 4} (layer 1, d = 1) & {3, 2} (layer 0, d = 2) = {3} */
    n = fm_prefetches(&r, 2, pf, 8);
    cr_assert_eq(n, 1);
    cr_assert_eq(pf[0].expert, 3);
    policy_firm_moe.destroy(r.pol);
}

Test(firm_policy, prefetch_loads_only_the_first_n_parts_on_the_prefetch_class) {
    const uint32_t want_mask[4] = {0, 1u << PART_GATE, (1u << PART_GATE) | (1u << PART_UP),
                                   POLICY_PARTS_ALL};
    for (uint32_t n_parts = 1; n_parts <= 3; n_parts++) {
        firm_knobs k = fm_knobs_default();
        k.n = n_parts;
        k.P = 1;
        fm_run r;
        moesim_error err = {0};
        cr_assert_eq(fm_open(&r, &k, 32, &err), MOESIM_OK, "%s", err.msg);
        const uint16_t act[2] = {0, 1};
        const uint16_t la[FM_D][FM_KP] = {{4, 5, 6, 7}, {4, 5, 6, 7}, {4, 5, 6, 7}};
        fm_step(&r, 0, true);
        fm_route(&r, 0, 0, act, la);
        fm_load pf[8];
        size_t n = fm_prefetches(&r, 1, pf, 8);
        cr_assert_eq(n, 2);
        for (size_t i = 0; i < n; i++) cr_assert_eq(pf[i].mask, want_mask[n_parts]);
        /* demand loads of layer 0 are whole experts on the demand class */
        cr_assert_eq(r.mem.loads[0].cls, POLICY_DEMAND);
        cr_assert_eq(r.mem.loads[0].mask, POLICY_PARTS_ALL);
        /* layer 1 activates predicted expert 4: only its missing parts are demand-loaded */
        const uint16_t act1[2] = {4, 3};
        size_t before = r.mem.n_loads;
        fm_route(&r, 0, 1, act1, la);
        bool saw4 = false;
        for (size_t i = before; i < r.mem.n_loads; i++)
            if (r.mem.loads[i].layer == 1 && r.mem.loads[i].expert == 4) {
                saw4 = true;
                cr_assert_eq(r.mem.loads[i].cls, POLICY_DEMAND);
                cr_assert_eq(r.mem.loads[i].mask, POLICY_PARTS_ALL & ~want_mask[n_parts]);
            }
        cr_assert_eq(saw4, n_parts < 3);
        policy_firm_moe.destroy(r.pol);
    }
}

Test(firm_policy, sub_expert_lru_evicts_the_least_recently_used_parts_first) {
    /* room for 4 experts (12 parts); no prefetch (layer rows predict nothing valid) */
    firm_knobs k = fm_knobs_default();
    k.P = 1;
    fm_run r;
    moesim_error err = {0};
    cr_assert_eq(fm_open(&r, &k, 4, &err), MOESIM_OK, "%s", err.msg);
    const uint16_t la[FM_D][FM_KP] = {
        {NONE, NONE, NONE, NONE}, {NONE, NONE, NONE, NONE}, {NONE, NONE, NONE, NONE}};
    const uint16_t a01[2] = {0, 1}, a23[2] = {2, 3}, a02[2] = {0, 2}, a45[2] = {4, 5};
    fm_step(&r, 0, true);
    fm_route(&r, 0, 0, a01, la);
    fm_route(&r, 0, 1, a23, la);
    fm_step(&r, 0, false);
    fm_complete(&r.mem);
    fm_step(&r, 1, true);
    fm_route(&r, 1, 0, a02, la); /* hits 0; loads 2 of layer 0: evicts expert 1 of layer 0 */
    cr_assert_eq(r.mem.n_evicts, 3);
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(r.mem.evicts[i].layer, 0);
        cr_assert_eq(r.mem.evicts[i].expert, 1);
    }
    fm_route(&r, 1, 1, a45, la); /* evicts layer 1's 2 and 3 (older than layer 0's 0 and 2) */
    cr_assert_eq(r.mem.n_evicts, 9);
    for (size_t i = 3; i < 9; i++) {
        cr_assert_eq(r.mem.evicts[i].layer, 1);
        cr_assert(r.mem.evicts[i].expert == 2 || r.mem.evicts[i].expert == 3);
    }
    cr_assert_eq(r.mem.st[0][0][PART_DOWN], POLICY_RESIDENT);
    cr_assert_leq(r.mem.used_bytes, r.mem.budget_bytes);
    policy_firm_moe.destroy(r.pol);
}

Test(firm_policy, parts_the_memory_system_refuses_to_evict_are_skipped) {
    /* room for 4 experts: layer 0's experts 0 and 1, layer 1's 2 and 3; expert 0 of layer 0
     * (least recently used) has a copy running, so a new expert of layer 1 evicts expert 1 */
    firm_knobs k = fm_knobs_default();
    k.P = 1;
    fm_run r;
    moesim_error err = {0};
    cr_assert_eq(fm_open(&r, &k, 4, &err), MOESIM_OK, "%s", err.msg);
    const uint16_t la[FM_D][FM_KP] = {
        {NONE, NONE, NONE, NONE}, {NONE, NONE, NONE, NONE}, {NONE, NONE, NONE, NONE}};
    const uint16_t a01[2] = {0, 1}, a23[2] = {2, 3}, a24[2] = {2, 4};
    fm_step(&r, 0, true);
    fm_route(&r, 0, 0, a01, la);
    fm_route(&r, 0, 1, a23, la);
    fm_step(&r, 0, false);
    r.mem.started[0][0] = true;
    fm_step(&r, 1, true);
    fm_route(&r, 1, 1, a24, la);
    cr_assert_eq(r.mem.n_evicts, 3);
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(r.mem.evicts[i].layer, 0);
        cr_assert_eq(r.mem.evicts[i].expert, 1);
    }
    cr_assert_neq(r.mem.st[0][0][PART_GATE], POLICY_ABSENT);
    policy_firm_moe.destroy(r.pol);
}

Test(firm_policy, prefetch_never_evicts_the_current_layer_or_its_own_prediction) {
    /* room for 4 experts: layer 0 uses 2, the 2 left take the two most confident predictions */
    firm_knobs k = fm_knobs_default();
    k.P = 1;
    k.K = 4;
    k.n = 3;
    fm_run r;
    moesim_error err = {0};
    cr_assert_eq(fm_open(&r, &k, 4, &err), MOESIM_OK, "%s", err.msg);
    const uint16_t la[FM_D][FM_KP] = {{4, 5, 6, 7}, {4, 5, 6, 7}, {4, 5, 6, 7}};
    const uint16_t act[2] = {0, 1};
    fm_step(&r, 0, true);
    fm_route(&r, 0, 0, act, la);
    fm_load pf[8];
    cr_assert_eq(fm_prefetches(&r, 1, pf, 8), 2);
    cr_assert_eq(pf[0].expert, 4);
    cr_assert_eq(pf[1].expert, 5);
    cr_assert_eq(r.mem.n_evicts, 0);
    const char *names[16];
    double values[16];
    size_t n = policy_firm_moe.report(r.pol, names, values, 16);
    bool dropped_seen = false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], "prefetch.dropped") == 0) {
            dropped_seen = true;
            cr_assert_float_eq(values[i], 2.0, 1e-9); /* experts 6 and 7 found no room */
        }
    cr_assert(dropped_seen);
    policy_firm_moe.destroy(r.pol);
}

Test(firm_policy, prefill_steps_are_served_on_demand_without_prefetch) {
    firm_knobs k = fm_knobs_default();
    fm_run r;
    moesim_error err = {0};
    cr_assert_eq(fm_open(&r, &k, 32, &err), MOESIM_OK, "%s", err.msg);
    const uint16_t la[FM_D][FM_KP] = {{4, 5, 6, 7}, {4, 5, 6, 7}, {4, 5, 6, 7}};
    const uint16_t act[2] = {0, 1};
    fm_step_kind(&r, 0, true, true);
    for (uint32_t l = 0; l < FM_L; l++) fm_route(&r, 0, l, act, la);
    for (size_t i = 0; i < r.mem.n_loads; i++) cr_assert_eq(r.mem.loads[i].cls, POLICY_DEMAND);
    cr_assert_eq(r.mem.n_loads, 2 * FM_L);
    policy_firm_moe.destroy(r.pol);
}

Test(firm_policy, heop_reports_the_chosen_K_and_P_of_every_group) {
    firm_knobs k = fm_knobs_default();
    k.heop = true;
    k.groups = 2;
    k.profile_steps = 40;
    k.n_update = 5;
    k.patience = 10;
    fm_run r;
    moesim_error err = {0};
    cr_assert_eq(fm_open(&r, &k, 32, &err), MOESIM_OK, "%s", err.msg);
    /* every layer activates {1, 2}. The look-ahead at d = 1 ranks them first, so K = 2 predicts
     * exactly at every P (d = 2 and 3 rank them in their top 2 too); K = 1 misses one, K = 3
     * prefetches one unused at P = 1. Step 0 is a prefill step: HEOP leaves it out, so every
     * decode step finds the activated experts cached: K = 2's exact prediction costs 0, and so
     * does K = 1's (its missed expert is a cache hit, n_miss - n_hit = 0, Eq. 11 counting each
     * activation once); K = 3 pays for its unused one. The chosen K is one of the two. */
    const uint16_t la[FM_D][FM_KP] = {{1, 2, 3, 4}, {2, 1, 5, 6}, {1, 2, 7, 0}};
    const uint16_t act[2] = {1, 2};
    for (uint64_t s = 0; s < 60; s++) {
        fm_step_kind(&r, s, true, s == 0);
        for (uint32_t l = 0; l < FM_L; l++) fm_route(&r, s, l, act, la);
        fm_step_kind(&r, s, false, s == 0);
        fm_complete(&r.mem);
    }
    const char *names[16];
    double values[16];
    size_t n = policy_firm_moe.report(r.pol, names, values, 16);
    cr_assert_geq(n, 4);
    cr_assert_str_eq(names[0], "group0.K");
    cr_assert_str_eq(names[1], "group0.P");
    cr_assert_str_eq(names[2], "group1.K");
    cr_assert_str_eq(names[3], "group1.P");
    for (int g = 0; g < 2; g++)
        cr_assert(values[2 * g] == 1.0 || values[2 * g] == 2.0, "group %d: K = %g", g,
                  values[2 * g]);
    bool done_seen = false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], "heop.done") == 0) {
            done_seen = true;
            cr_assert_float_eq(values[i], 1.0, 1e-9);
        }
    cr_assert(done_seen);
    policy_firm_moe.destroy(r.pol);
}

typedef struct bad_case {
    const char *what;
    uint32_t K, P, groups;
    uint64_t budget_experts;
    const char *needle;
} bad_case;

static const bad_case bad_cases[] = {
    {"K beyond the recorded candidates", 5, 3, 1, 32, "firm-moe.K = 5"},
    {"P beyond the look-ahead depth", 2, 4, 1, 32, "firm-moe.P = 4"},
    {"more groups than layers", 2, 3, 5, 32, "firm-moe.groups = 5"},
    {"budget below one layer's experts", 2, 3, 1, 2, "memory.budget_gb"},
};

Test(firm_policy, settings_that_cannot_work_are_refused_naming_the_knob) {
    for (size_t c = 0; c < sizeof bad_cases / sizeof bad_cases[0]; c++) {
        firm_knobs k = fm_knobs_default();
        k.K = bad_cases[c].K;
        k.P = bad_cases[c].P;
        k.groups = bad_cases[c].groups;
        fm_run r;
        moesim_error err = {0};
        cr_assert_eq(fm_open(&r, &k, bad_cases[c].budget_experts, &err), MOESIM_EINPUT,
                     "%s: accepted", bad_cases[c].what);
        cr_assert(strstr(err.msg, bad_cases[c].needle), "%s: message '%s'", bad_cases[c].what,
                  err.msg);
    }
}

Test(firm_policy, emulated_predictions_bound_K_and_P_instead_of_failing) {
    /* the host's emulated predictor has depth 1 and K' = top-k: the meeting is the previous layer
     * alone, with the candidates it has */
    firm_knobs k = fm_knobs_default();
    k.K = 3;
    k.P = 3;
    fm_run r;
    fm_init(&r, &k, 32);
    r.params.lookahead_emulated = true;
    r.params.lookahead_depth = 1;
    r.params.lookahead_k = 2;
    moesim_error err = {0};
    cr_assert_eq(fm_create(&r, &err), MOESIM_OK, "%s", err.msg);
    const char *names[16];
    double values[16];
    size_t n = policy_firm_moe.report(r.pol, names, values, 16);
    cr_assert_geq(n, 2);
    cr_assert_str_eq(names[0], "all.K");
    cr_assert_float_eq(values[0], 2.0, 1e-12);
    cr_assert_float_eq(values[1], 1.0, 1e-12);
    policy_firm_moe.destroy(r.pol);
}

Test(firm_policy, knob_table_reads_section_firm_moe_with_the_paper_defaults) {
    config *c = config_create();
    firm_knobs k;
    memset(&k, 0xff, sizeof k);
    moesim_error err = {0};
    cr_assert_eq(config_read_fields(c, policy_firm_moe.knobs, policy_firm_moe.n_knobs, &k, &err),
                 MOESIM_OK, "%s", err.msg);
    cr_assert_eq(k.K, 3);
    cr_assert_eq(k.P, 3);
    cr_assert_eq(k.n, 0, "by model size (Table 2)");
    cr_assert_eq(k.heop_average, 0, "Algorithm 1 line 14's avg(H_g)");
    cr_assert_float_eq(k.alpha, 0.5, 1e-12);
    cr_assert_float_eq(k.beta, 0.5, 1e-12);
    cr_assert_eq(k.n_update, 10);
    cr_assert_eq(k.groups, 3);
    cr_assert(k.heop);
    cr_assert_eq(policy_firm_moe.knobs_size, sizeof(firm_knobs));
    cr_assert_str_eq(policy_firm_moe.name, "firm-moe");
    cr_assert_eq(config_set(c, "firm-moe.n=4", &err), MOESIM_OK);
    cr_assert_eq(config_read_fields(c, policy_firm_moe.knobs, policy_firm_moe.n_knobs, &k, &err),
                 MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "[firm-moe] n: expected an integer in [0, 3]"), "%s", err.msg);
    config_destroy(c);
}

/* ---- Table 1's ablation rows are knob settings alone ---- */

typedef struct preset_case {
    const char *file;
    uint32_t K, P, n;
    bool heop;
} preset_case;

static const preset_case presets[] = {
    {"firm-moe-baseline.ini", 0, 1, 3, false}, {"firm-moe-fg.ini", 0, 1, 1, false},
    {"firm-moe-mol.ini", 3, 3, 3, false},      {"firm-moe-fg-mol.ini", 3, 3, 1, false},
    {"firm-moe-all.ini", 3, 3, 1, true},
};

Test(firm_policy, table_1_rows_load_from_their_presets_as_knobs) {
    const char *dir = MOESIM_SOURCE_DIR "/configs";
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/policies/%s", dir, presets[i].file);
        config *c = config_create();
        moesim_error err = {0};
        cr_assert_eq(config_load_file(c, path, &err), MOESIM_OK, "%s", err.msg);
        firm_knobs k;
        cr_assert_eq(
            config_read_fields(c, policy_firm_moe.knobs, policy_firm_moe.n_knobs, &k, &err),
            MOESIM_OK, "%s", err.msg);
        cr_assert_eq(config_check_unused(c, &err), MOESIM_OK, "%s: %s", path, err.msg);
        cr_assert_eq(k.K, presets[i].K, "%s", path);
        cr_assert_eq(k.P, presets[i].P, "%s", path);
        cr_assert_eq(k.n, presets[i].n, "%s", path);
        cr_assert_eq(k.heop, presets[i].heop, "%s", path);
        cr_assert_float_eq(k.alpha, 0.5, 1e-12, "%s", path);
        cr_assert_float_eq(k.beta, 0.5, 1e-12, "%s", path);
        config_destroy(c);
    }
}

/* ---- behaviour on synthetic traces, through the simulator ---- */

/* A Qwen1.5-MoE-A2.7B trace (the model of the paper's Table 1) from the calibrated synthesizer:
 * 4 requests of 16 prompt and 96 decode tokens, look-ahead D = 3, K' = 16. On an RTX 3090 over
 * PCIe 4.0 (the paper's testbed). */
typedef struct sim_bench {
    model_geometry model;
    hw_profile hw;
    quant_table quant;
    trace *trace;
    uint64_t fixed_bytes;  /* budget the simulator reserves before the expert pool */
    uint64_t expert_bytes; /* one bf16 expert */
} sim_bench;

static void bench_open_depth(sim_bench *b, uint32_t lookahead_depth) {
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("qwen1.5-moe-a2.7b", &b->model, &err), MOESIM_OK, "%s",
                 err.msg);
    cr_assert_eq(hw_load_by_name("rtx3090-pcie4", &b->hw, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(quant_table_load_default(&b->quant, &err), MOESIM_OK, "%s", err.msg);
    synth_options o;
    synth_options_default(&o, &b->model);
    o.n_requests = 4;
    o.prompt_len = (synth_range){16, 16};
    o.gen_len = (synth_range){96, 96};
    o.seed = 11;
    o.lookahead_depth = lookahead_depth;
    cr_assert_eq(synth_generate(&b->model, &o, &b->trace, &err), MOESIM_OK, "%s", err.msg);
    b->expert_bytes = model_expert_bytes(&b->model, &b->quant, PREC_BF16);
}

static void bench_open(sim_bench *b) { bench_open_depth(b, 3); }

/* Runs firm-moe with --set style entries and an expert pool of `cache_experts` experts. */
static sim_result bench_run(sim_bench *b, uint32_t cache_experts, const char *const *sets) {
    moesim_error err = {0};
    if (b->fixed_bytes == 0) { /* learn what the simulator keeps for non-expert state */
        config *c = config_create();
        sim_inputs in = {.trace = b->trace, .model = &b->model, .hw = &b->hw, .quant = &b->quant};
        sim_result r;
        cr_assert_eq(sim_run(&in, "firm-moe", c, &r, &err), MOESIM_OK, "%s", err.msg);
        b->fixed_bytes = r.budget_bytes - r.expert_budget_bytes;
        config_destroy(c);
    }
    config *c = config_create();
    char budget[96];
    double bytes = (double)b->fixed_bytes + ((double)cache_experts + 0.5) * (double)b->expert_bytes;
    snprintf(budget, sizeof budget, "memory.budget_gb=%.9f", bytes / 1073741824.0);
    cr_assert_eq(config_set(c, budget, &err), MOESIM_OK, "%s", err.msg);
    for (const char *const *s = sets; s && *s; s++)
        cr_assert_eq(config_set(c, *s, &err), MOESIM_OK, "%s", err.msg);
    sim_inputs in = {.trace = b->trace, .model = &b->model, .hw = &b->hw, .quant = &b->quant};
    sim_result r;
    cr_assert_eq(sim_run(&in, "firm-moe", c, &r, &err), MOESIM_OK, "%s", err.msg);
    config_destroy(c);
    cr_assert_eq(r.expert_budget_bytes / b->expert_bytes, cache_experts);
    cr_assert_leq(r.peak_hbm_bytes, r.budget_bytes);
    return r;
}

static double report_value(const sim_result *r, const char *name) {
    for (size_t i = 0; i < r->n_policy_report; i++)
        if (strcmp(r->policy_report_names[i], name) == 0) return r->policy_report_values[i];
    cr_assert_fail("policy_report has no %s", name);
    return 0;
}

Test(firm_behaviour, meeting_of_three_layers_uses_prefetches_better_than_the_previous_layer) {
    /* Figure 7: MoL (K = 3, P = 3) has a higher expert utilization than the previous layer alone;
     * at a 128-expert cache (Table 1's smallest), for K = 2 and K = 3 */
    sim_bench b = {0};
    bench_open(&b);
    const char *K_sets[] = {"firm-moe.K=2", "firm-moe.K=3"};
    for (size_t i = 0; i < 2; i++) {
        const char *p1[] = {"firm-moe.heop=false", K_sets[i], "firm-moe.P=1", NULL};
        const char *p3[] = {"firm-moe.heop=false", K_sets[i], "firm-moe.P=3", NULL};
        sim_result r1 = bench_run(&b, 128, p1), r3 = bench_run(&b, 128, p3);
        cr_assert_gt(r1.prefetches, 0);
        cr_assert_gt(r3.prefetches, 0);
        cr_assert_gt(r3.prefetch_utilization, r1.prefetch_utilization, "%s: P=3 %.3f, P=1 %.3f",
                     K_sets[i], r3.prefetch_utilization, r1.prefetch_utilization);
        double m1 = report_value(&r1, "mol.utilization"), m3 = report_value(&r3, "mol.utilization");
        cr_assert_gt(m3, m1, "%s: MoL sets P=3 %.3f, P=1 %.3f", K_sets[i], m3, m1);
        /* the intersection trades accuracy for utilization (Figure 7: 59.8 % vs 90.5 %) */
        cr_assert_lt(report_value(&r3, "mol.accuracy"), report_value(&r1, "mol.accuracy"));
    }
    trace_destroy(b.trace);
}

Test(firm_behaviour, prefetching_only_the_gate_beats_whole_experts_when_the_cache_is_small) {
    /* Table 1 "+ FG" against the baseline at a 128-expert cache: same prediction, n = 1 vs 3 */
    sim_bench b = {0};
    bench_open(&b);
    const char *whole[] = {"firm-moe.heop=false", "firm-moe.K=0", "firm-moe.P=1", "firm-moe.n=3",
                           NULL};
    const char *gate[] = {"firm-moe.heop=false", "firm-moe.K=0", "firm-moe.P=1", "firm-moe.n=1",
                          NULL};
    sim_result rw = bench_run(&b, 128, whole), rg = bench_run(&b, 128, gate);
    cr_assert_lt(rg.tpot.mean_ms, rw.tpot.mean_ms, "n=1 %.3f ms, n=3 %.3f ms", rg.tpot.mean_ms,
                 rw.tpot.mean_ms);
    cr_assert_lt(rg.h2d_bytes, rw.h2d_bytes); /* the unused up and down matrices stay home */
    /* same predictions: the same experts were prefetched */
    cr_assert_float_eq(report_value(&rg, "mol.utilization"), report_value(&rw, "mol.utilization"),
                       1e-12);
    trace_destroy(b.trace);
}

Test(firm_behaviour, heop_fixes_a_configuration_per_group_inside_the_search_box) {
    sim_bench b = {0};
    bench_open(&b);
    const char *sets[] = {"firm-moe.heop=true", "firm-moe.profile_steps=150", NULL};
    sim_result r = bench_run(&b, 128, sets);
    cr_assert_float_eq(report_value(&r, "heop.done"), 1.0, 1e-12);
    cr_assert_float_eq(report_value(&r, "heop.profiled_steps"), 150.0, 1e-12);
    const char *groups[] = {"shallow", "middle", "deep"};
    for (int g = 0; g < 3; g++) {
        char name[48];
        snprintf(name, sizeof name, "%s.K", groups[g]);
        double K = report_value(&r, name);
        snprintf(name, sizeof name, "%s.P", groups[g]);
        double P = report_value(&r, name);
        cr_assert(K >= 1 && K <= 16 && P >= 1 && P <= 3, "%s: (%g, %g)", groups[g], K, P);
    }
    /* deterministic: the random first direction comes from the run's seed */
    sim_result again = bench_run(&b, 128, sets);
    cr_assert_float_eq(again.tpot.mean_ms, r.tpot.mean_ms, 0.0);
    for (size_t i = 0; i < r.n_policy_report; i++)
        cr_assert_float_eq(again.policy_report_values[i], r.policy_report_values[i], 0.0);
    trace_destroy(b.trace);
}

Test(firm_behaviour, traces_without_predictions_meet_on_the_emulated_predictor) {
    /* an imported trace has no look-ahead: the simulator emulates depth predictor.depth (1 by
     * default), and the meeting gathers the layers that predict */
    sim_bench b = {0};
    bench_open_depth(&b, 0);
    const char *d1[] = {"firm-moe.heop=false", NULL};
    const char *d3[] = {"firm-moe.heop=false", "predictor.depth=3", NULL};
    sim_result r1 = bench_run(&b, 128, d1), r3 = bench_run(&b, 128, d3);
    cr_assert(r1.predictor_emulated && r3.predictor_emulated);
    cr_assert_gt(r1.prefetches, 0);
    cr_assert_float_eq(report_value(&r1, "shallow.P"), 1.0, 0.0);
    cr_assert_float_eq(report_value(&r3, "shallow.P"), 3.0, 0.0);
    cr_assert_gt(report_value(&r3, "mol.utilization"), report_value(&r1, "mol.utilization"));
    trace_destroy(b.trace);
}

Test(firm_behaviour, moesim_sim_json_reports_prefetch_figures_and_the_chosen_K_P) {
    const char *trace_path = test_tmp_path("firm_qwen.h5");
    char out[65536], errbuf[4096];
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "synth", "--model",
                             "qwen1.5-moe-a2.7b", "--requests", "2", "--prompt-len", "16",
                             "--gen-len", "64", "-o", trace_path, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    const char *dir = MOESIM_SOURCE_DIR "/configs";
    char preset[1024];
    snprintf(preset, sizeof preset, "%s/policies/firm-moe-all.ini", dir);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", trace_path,
                         "--hw", "rtx3090-pcie4", "--policy", "firm-moe", "--config", preset,
                         "--set", "memory.budget_gb=6", "--set", "firm-moe.profile_steps=60",
                         "--json", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    cr_assert(j, "JSON: %s", jerr.text);
    json_t *pf = json_object_get(j, "prefetch");
    cr_assert(json_is_object(pf));
    double acc = json_number_value(json_object_get(pf, "accuracy"));
    double util = json_number_value(json_object_get(pf, "utilization"));
    cr_assert(acc > 0 && acc <= 1, "accuracy %g", acc);
    cr_assert(util > 0 && util <= 1, "utilization %g", util);
    json_t *rep = json_object_get(j, "policy_report");
    cr_assert(json_is_object(rep));
    const char *keys[] = {"shallow.K", "shallow.P", "middle.K", "middle.P", "deep.K", "deep.P"};
    for (size_t i = 0; i < 6; i++) {
        json_t *v = json_object_get(rep, keys[i]);
        cr_assert(json_is_number(v), "policy_report.%s missing", keys[i]);
        cr_assert_geq(json_number_value(v), 1.0);
    }
    cr_assert_float_eq(json_number_value(json_object_get(rep, "heop.done")), 1.0, 1e-12);
    json_decref(j);
}
