/* The replay executor (replay/exec.h) on the backend every machine has (cpu), and the pool blocks
 * both backends share (replay/pool.h): the executor runs the simulator's schedule and routes
 * (same steps, sub-routes and accesses as sim_run on the same trace and settings), no expert op
 * starts before its parts landed, the budget holds, and the pools reuse blocks per precision. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "replay/exec.h"
#include "replay/pool.h"
#include "replay/replay.h"
#include "sim/sim.h"
#include "sim_fixtures.h"

static quant_table quant;

static void setup(void) {
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
}

TestSuite(replay_exec, .init = setup);

/* ---- pool blocks ---- */

Test(replay_exec, pool_reuses_freed_blocks_by_precision_and_refuses_what_no_block_can_hold) {
    uint64_t block[PREC_COUNT] = {0};
    block[PREC_BF16] = 8192;
    block[PREC_INT4] = 4096;
    replay_pool p;
    replay_pool_init(&p, 16384, block, 12);
    /* gate and up at int4, down at bf16: the arena is cut in order and full */
    cr_assert(replay_pool_reserve(&p, 0, PREC_INT4, 1u << PART_GATE | 1u << PART_UP));
    cr_assert_eq(replay_pool_offset(&p, 0 + PART_GATE), 0);
    cr_assert_eq(replay_pool_offset(&p, 0 + PART_UP), 4096);
    cr_assert(replay_pool_reserve(&p, 3, PREC_BF16, 1u << PART_DOWN));
    cr_assert_eq(replay_pool_offset(&p, 3 + PART_DOWN), 8192);
    /* three more int4 parts: none fits, and none is taken */
    cr_assert_not(replay_pool_reserve(&p, 6, PREC_INT4, POLICY_PARTS_ALL));
    cr_assert_eq(p.refusals, 1);
    cr_assert_eq(p.part_off[6 + PART_GATE], REPLAY_POOL_NONE);
    /* a freed int4 block serves the next int4 part */
    replay_pool_release(&p, 0 + PART_GATE, PREC_INT4);
    cr_assert(replay_pool_reserve(&p, 9, PREC_INT4, 1u << PART_GATE));
    cr_assert_eq(replay_pool_offset(&p, 9 + PART_GATE), 0);
    /* a freed bf16 block does not serve an int4 part: blocks are carved per precision */
    replay_pool_release(&p, 3 + PART_DOWN, PREC_BF16);
    cr_assert_not(replay_pool_reserve(&p, 6, PREC_INT4, 1u << PART_DOWN));
    cr_assert_eq(p.refusals, 2);
    cr_assert(replay_pool_reserve(&p, 6, PREC_BF16, 1u << PART_DOWN));
    cr_assert_eq(replay_pool_offset(&p, 6 + PART_DOWN), 8192);
    replay_pool_free(&p);
}

/* ---- the executor on the cpu backend ---- */

/* What the on_expert_start hook saw: every op's parts must be resident when it starts. */
typedef struct expert_starts {
    uint64_t ops, not_resident, masks_seen;
} expert_starts;

static void on_expert_start(void *ctx, policy_mem_view mem, uint32_t layer, uint32_t expert,
                            moesim_precision prec, uint32_t mask, uint64_t t_ns) {
    (void)t_ns;
    expert_starts *c = ctx;
    c->ops++;
    c->masks_seen |= 1u << mask;
    for (int part = 0; part < PART_COUNT; part++)
        if ((mask & (1u << part)) &&
            mem.ops->state(mem.mem, layer, expert, prec, (expert_part)part) != POLICY_RESIDENT)
            c->not_resident++;
}

/* The settings of a case: per-layer pools of 3 of 8 experts, so experts are loaded and evicted
 * all run long. */
static config *settings(const char *extra) {
    moesim_error err = {0};
    config *c = config_create();
    const char *sets[] = {"cache.experts_per_layer=3", "expert.precision=int4",
                          "sim.host_precisions=int4,int2", extra};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        if (sets[i]) cr_assert_eq(config_set(c, sets[i], &err), MOESIM_OK, "%s", err.msg);
    return c;
}

typedef struct replay_case {
    model_geometry m;
    hw_profile hw;
    trace *t;
} replay_case;

static replay_case make_case(void) {
    replay_case rc = {fixture_model(2, 8, 2), fixture_hw(), NULL};
    rc.t = fixture_trace(&rc.m, 2, 6, 5, 1.0, 11);
    cr_assert(rc.t);
    return rc;
}

/* Runs `policy_name` through sim_run and the cpu replay with the same settings; false when the
 * simulator refuses the configuration (a policy may not work in it). */
static bool run_both(const replay_case *rc, const char *policy_name, const char *extra,
                     sim_result *sim, sim_result *real, replay_checks *ck, expert_starts *starts) {
    moesim_error err = {0};
    config *c = settings(extra);
    sim_inputs si = {.trace = rc->t, .model = &rc->m, .hw = &rc->hw, .quant = &quant};
    moesim_status st = sim_run(&si, policy_name, c, sim, &err);
    config_destroy(c);
    if (st) return false;
    sim_hooks hooks = {.ctx = starts, .on_expert_start = on_expert_start};
    replay_inputs ri = {.trace = rc->t,
                        .model = &rc->m,
                        .hw = &rc->hw,
                        .quant = &quant,
                        .hooks = &hooks,
                        .weight_seed = 5};
    c = settings(extra);
    st = replay_run_cpu(&ri, policy_name, c, real, ck, &err);
    config_destroy(c);
    cr_assert_eq(st, MOESIM_OK, "policy %s: %s", policy_name, err.msg);
    return true;
}

Test(replay_exec, cpu_backend_runs_the_simulators_routes_and_no_expert_before_its_copy,
     .timeout = 600) {
    replay_case rc = make_case();
    size_t n_pol;
    const policy_methods *const *all = policy_all(&n_pol);
    uint32_t ran = 0;
    for (size_t i = 0; i < n_pol; i++) {
        sim_result sim, real;
        replay_checks ck;
        expert_starts starts = {0};
        if (!run_both(&rc, all[i]->name, NULL, &sim, &real, &ck, &starts)) continue;
        const char *name = all[i]->name;
        ran++;
        cr_expect_eq(real.steps, sim.steps, "%s", name);
        cr_expect_eq(real.sub_routes, sim.sub_routes, "%s", name);
        cr_expect_eq(real.tokens, sim.tokens, "%s", name);
        cr_expect_eq(real.accesses + real.skipped_accesses, sim.accesses + sim.skipped_accesses,
                     "%s", name);
        /* part overlap (the default): gate+up, then down, each checked against its copy */
        cr_expect_gt(real.expert_ops, 0, "%s", name);
        cr_expect_eq(ck.order_checked, 2 * real.expert_ops, "%s", name);
        cr_expect_eq(ck.order_violations, 0, "%s", name);
        cr_expect_eq(starts.ops, 2 * real.expert_ops, "%s", name);
        cr_expect_eq(starts.not_resident, 0, "%s", name);
        cr_expect_gt(real.h2d_bytes, 0, "%s: 3 of 8 experts per layer must be loaded", name);
        cr_expect_leq(real.peak_hbm_bytes, real.budget_bytes, "%s", name);
        cr_expect_gt(real.tpot.mean_ms, 0, "%s", name);
    }
    cr_assert_geq(ran, 6, "only %u policies ran", ran);
    trace_destroy(rc.t);
}

Test(replay_exec, cpu_backend_without_part_overlap_starts_an_expert_once_all_its_parts_landed,
     .timeout = 120) {
    replay_case rc = make_case();
    sim_result sim, real;
    replay_checks ck;
    expert_starts starts = {0};
    cr_assert(run_both(&rc, "lru", "sim.part_overlap=false", &sim, &real, &ck, &starts));
    cr_assert_gt(real.expert_ops, 0);
    cr_expect_eq(starts.masks_seen, 1u << POLICY_PARTS_ALL, "masks seen: %#llx",
                 (unsigned long long)starts.masks_seen);
    cr_expect_eq(starts.ops, real.expert_ops);
    cr_expect_eq(starts.not_resident, 0);
    cr_expect_eq(ck.order_violations, 0);
    trace_destroy(rc.t);
}
