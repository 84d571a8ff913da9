/* Closed-form timing checks of the simulator, the LRU consistency with `trace stats`, and the
 * invariants every registered policy must keep (peak HBM within budget, experts resident at
 * their precision when they run, determinism, the oracle bound). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/precision.h"
#include "policies/policy.h"
#include "sim/batch_curves.h"
#include "sim/cost.h"
#include "sim/sim.h"
#include "sim_fixtures.h"
#include "support/test_support.h"
#include "traces/stats.h"

static quant_table quant;

static void setup(void) {
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
}

TestSuite(sim, .init = setup);

/* Runs `policy` (registry name, or `table` when not NULL) with --set style entries. */
static moesim_status run_sets(const trace *t, const model_geometry *m, const hw_profile *hw,
                              const char *name, const policy_methods *table,
                              const char *const *sets, sim_result *r, moesim_error *err) {
    config *c = config_create();
    for (const char *const *s = sets; s && *s; s++)
        cr_assert_eq(config_set(c, *s, err), MOESIM_OK, "%s", err->msg);
    sim_inputs in = {.trace = t, .model = m, .hw = hw, .quant = &quant, .policy = table};
    moesim_status st = sim_run(&in, name, c, r, err);
    config_destroy(c);
    return st;
}

static uint64_t makespan_ns(const sim_result *r) { return (uint64_t)llround(r->makespan_ms * 1e6); }

/* One token through one layer: everything but the experts, in ns. */
static uint64_t fixed_ns(const cost_model *c, uint32_t tokens, uint64_t attended) {
    return cost_attention_ns(c, tokens, attended) + cost_router_ns(c, tokens);
}
static uint64_t tail_ns(const cost_model *c, uint32_t tokens, uint32_t emit) {
    return cost_shared_ns(c, tokens) + cost_combine_ns(c, tokens) + cost_lm_head_ns(c, emit);
}

Test(sim, ondemand_one_expert_takes_latency_plus_bytes_over_bandwidth_plus_compute) {
    model_geometry m = fixture_model(1, 1, 1);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 1, 1, 0, 0, 1);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t bytes = model_expert_bytes(&m, &quant, PREC_BF16);
    uint64_t want = fixed_ns(&c, 1, 1) + hw.h2d_latency_ns +
                    cost_transfer_ns(bytes, hw.h2d_bytes_per_s) +
                    cost_expert_gate_up_ns(&c, PREC_BF16, 1) +
                    cost_expert_down_ns(&c, PREC_BF16, 1) + tail_ns(&c, 1, 1);
    const char *sets[] = {"sim.part_overlap=false", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "ondemand", NULL, sets, &r, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(makespan_ns(&r), want, "makespan %llu ns, want %llu",
                 (unsigned long long)makespan_ns(&r), (unsigned long long)want);
    cr_assert_eq(r.h2d_bytes, bytes);
    cr_assert_eq(r.hit_rate, 0.0);
    /* the stall is the whole copy: the stream was idle from the router's end to the arrival */
    cr_assert_eq((uint64_t)llround(r.stall_ms * 1e6),
                 hw.h2d_latency_ns + cost_transfer_ns(bytes, hw.h2d_bytes_per_s));
    trace_destroy(t);
}

/* The profile's op_issue_ns (the host's time around each op, e.g. an engine's timing events)
 * lengthens every op on the stream: attention, router, combine and LM head, and the expert's
 * gate+up and down (the fixture has no shared expert: no op for one); the copy starts that much
 * later too, so the stall is unchanged. */
Test(sim, the_hosts_time_around_each_op_adds_to_every_op_on_the_stream) {
    model_geometry m = fixture_model(1, 1, 1);
    hw_profile hw = fixture_hw(), issued = hw;
    issued.op_issue_ns = 1000;
    trace *t = fixture_trace(&m, 1, 1, 0, 0, 1);
    const char *sets[] = {"sim.part_overlap=false", NULL};
    sim_result r0, r1;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "ondemand", NULL, sets, &r0, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(run_sets(t, &m, &issued, "ondemand", NULL, sets, &r1, &err), MOESIM_OK, "%s",
                 err.msg);
    cr_assert_eq(makespan_ns(&r1) - makespan_ns(&r0), 6 * 1000);
    cr_assert_float_eq(r1.stall_ms, r0.stall_ms, 1e-9);
    trace_destroy(t);
}

/* ondemand on t with profile `hw` into *r0 and with `slowed` (the same but for its contention
 * terms) into *r1: the contention tests below compare the two runs. */
static void run_ondemand_pair(const trace *t, const model_geometry *m, const hw_profile *hw,
                              const hw_profile *slowed, const char *const *sets, sim_result *r0,
                              sim_result *r1) {
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, m, hw, "ondemand", NULL, sets, r0, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(run_sets(t, m, slowed, "ondemand", NULL, sets, r1, &err), MOESIM_OK, "%s",
                 err.msg);
}

/* Two demand loads queued at the route: expert 0's op runs while expert 1 still copies. With the
 * profile's op_slowdown_beside_copy it takes that much longer, which only shortens the wait for
 * expert 1 (the copy is the longer); expert 1's op starts with the link idle: unslowed. */
Test(sim, an_op_started_beside_a_copy_is_slowed_by_the_profiles_fraction) {
    model_geometry m = fixture_model(1, 2, 2);
    hw_profile hw = fixture_hw(), slowed = hw;
    slowed.op_slowdown_beside_copy = 0.25;
    trace *t = fixture_trace(&m, 1, 1, 0, 0, 1);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t expert =
        cost_expert_gate_up_ns(&c, PREC_BF16, 1) + cost_expert_down_ns(&c, PREC_BF16, 1);
    const char *sets[] = {"sim.part_overlap=false", NULL};
    sim_result r0, r1;
    run_ondemand_pair(t, &m, &hw, &slowed, sets, &r0, &r1);
    cr_assert_eq(makespan_ns(&r1), makespan_ns(&r0));
    cr_assert_eq((uint64_t)llround((r0.stall_ms - r1.stall_ms) * 1e6),
                 (uint64_t)llround((double)expert * 0.25));
    trace_destroy(t);
}

/* The same two loads with device memory 4000x slower: expert 0's op (about 16 ms) outlasts
 * expert 1's copy, which starts as expert 0 lands. The op is slowed only while the link copies
 * beside it: by b·y/(1+y) for the copy's b ns (latency and bytes), not by its whole length times
 * y; expert 1's op then starts with the link idle. */
Test(sim, an_op_that_outlasts_the_copy_beside_it_is_slowed_only_while_it_copies) {
    model_geometry m = fixture_model(1, 2, 2);
    hw_profile hw = fixture_hw(), slowed;
    hw.hbm_bytes_per_s = 2.5e8;
    slowed = hw;
    slowed.op_slowdown_beside_copy = 0.25;
    trace *t = fixture_trace(&m, 1, 1, 0, 0, 1);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    double op =
        (double)(cost_expert_gate_up_ns(&c, PREC_BF16, 1) + cost_expert_down_ns(&c, PREC_BF16, 1));
    double copy =
        (double)(hw.h2d_latency_ns +
                 cost_transfer_ns(model_expert_bytes(&m, &quant, PREC_BF16), hw.h2d_bytes_per_s));
    cr_assert_gt(op, 2 * copy, "the fixture needs an op longer than the copy");
    const char *sets[] = {"sim.part_overlap=false", NULL};
    sim_result r0, r1;
    run_ondemand_pair(t, &m, &hw, &slowed, sets, &r0, &r1);
    double grew = (double)(makespan_ns(&r1) - makespan_ns(&r0)), want = copy * 0.25 / 1.25;
    cr_assert(fabs(grew - want) <= 2, "grew %.0f ns, want %.0f", grew, want);
    trace_destroy(t);
}

/* The same two loads with device memory 100x slower (expert 0's op about 0.4 ms) and 4 KiB
 * chunks: expert 1's chunks that start during expert 0's op move at 1/(1+x) of the link's rate
 * until it ends (the profile's h2d_slowdown_beside_compute, x), those after at the full rate. Its
 * first chunk starts as expert 0 lands, the stream idle, and pays the transfer latency: so expert
 * 1's copy grows by x/(1+x) of the op less that chunk, within one chunk's growth. */
Test(sim, a_copy_beside_an_op_is_slowed_while_the_op_runs) {
    model_geometry m = fixture_model(1, 2, 2);
    hw_profile hw = fixture_hw(), slowed;
    hw.hbm_bytes_per_s = 1e10;
    slowed = hw;
    slowed.h2d_slowdown_beside_compute = 0.5;
    trace *t = fixture_trace(&m, 1, 1, 0, 0, 1);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    double op =
        (double)(cost_expert_gate_up_ns(&c, PREC_BF16, 1) + cost_expert_down_ns(&c, PREC_BF16, 1));
    double chunk = (double)cost_transfer_ns(4096, hw.h2d_bytes_per_s);
    double first = (double)hw.h2d_latency_ns + chunk, x = 0.5;
    cr_assert_gt(op, 20 * chunk, "the fixture needs an op of many chunks");
    const char *sets[] = {"sim.part_overlap=false", "sim.chunk_kib=4", NULL};
    sim_result r0, r1;
    run_ondemand_pair(t, &m, &hw, &slowed, sets, &r0, &r1);
    double grew = (double)(makespan_ns(&r1) - makespan_ns(&r0));
    double want = (op - first) * x / (1 + x);
    cr_assert(fabs(grew - want) <= chunk * x, "grew %.0f ns, want %.0f +- %.0f", grew, want,
              chunk * x);
    cr_assert_float_eq(r1.h2d_busy_ms - r0.h2d_busy_ms, grew / 1e6, 1e-6);
    trace_destroy(t);
}

Test(sim, part_by_part_start_overlaps_gate_up_compute_with_the_down_copy) {
    model_geometry m = fixture_model(1, 1, 1);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 1, 1, 0, 0, 1);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t gate = model_expert_part_bytes(&m, &quant, PART_GATE, PREC_BF16);
    uint64_t up = model_expert_part_bytes(&m, &quant, PART_UP, PREC_BF16);
    uint64_t all = model_expert_bytes(&m, &quant, PREC_BF16);
    uint64_t t_route = fixed_ns(&c, 1, 1);
    uint64_t gu_ready =
        t_route + hw.h2d_latency_ns + cost_transfer_ns(gate + up, hw.h2d_bytes_per_s);
    uint64_t gu_end = gu_ready + cost_expert_gate_up_ns(&c, PREC_BF16, 1);
    uint64_t down_ready = t_route + hw.h2d_latency_ns + cost_transfer_ns(all, hw.h2d_bytes_per_s);
    uint64_t down_start = gu_end > down_ready ? gu_end : down_ready;
    uint64_t want = down_start + cost_expert_down_ns(&c, PREC_BF16, 1) + tail_ns(&c, 1, 1);
    /* chunks of 64 KiB: the parts (1 MiB each) land chunk by chunk */
    const char *sets[] = {"sim.chunk_kib=64", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "ondemand", NULL, sets, &r, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(makespan_ns(&r), want);
    trace_destroy(t);
}

Test(sim, two_demand_loads_queue_behind_each_other_on_one_copy_engine) {
    model_geometry m = fixture_model(1, 2, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 1, 1, 0, 0, 1);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t bytes = model_expert_bytes(&m, &quant, PREC_BF16);
    uint64_t copy = hw.h2d_latency_ns + cost_transfer_ns(bytes, hw.h2d_bytes_per_s);
    uint64_t expert =
        cost_expert_gate_up_ns(&c, PREC_BF16, 1) + cost_expert_down_ns(&c, PREC_BF16, 1);
    cr_assert_lt(expert, copy, "the fixture needs compute shorter than one copy");
    /* expert 0 arrives after one copy, expert 1 after two: the second waits for the first */
    uint64_t want = fixed_ns(&c, 1, 1) + 2 * copy + expert + tail_ns(&c, 1, 1);
    const char *sets[] = {"sim.part_overlap=false", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "ondemand", NULL, sets, &r, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(makespan_ns(&r), want);
    cr_assert_eq(r.h2d_bytes, 2 * bytes);
    trace_destroy(t);
}

/* A scripted policy: at the first route it prefetches every expert it is told not to run
 * (ids >= 1), in id order, then loads the activated expert 0 on demand. */
typedef struct policy {
    policy_mem_view mem;
    uint32_t E;
    bool done;
    uint64_t first_token; /* "recorded": trace index of the step's first token */
} scripted;

static moesim_status scripted_create(const policy_params *params, const void *knobs,
                                     policy_mem_view mem, policy **out, moesim_error *err) {
    (void)knobs;
    (void)err;
    scripted *p = calloc(1, sizeof *p);
    p->mem = mem;
    p->E = params->n_experts;
    *out = p;
    return MOESIM_OK;
}

static void scripted_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    if (!p->done)
        for (uint32_t e = 1; e < p->E; e++)
            cr_assert_eq(p->mem.ops->load(p->mem.mem, r->layer, e, PREC_BF16, POLICY_PARTS_ALL,
                                          POLICY_PREFETCH),
                         POLICY_ISSUED);
    p->done = true;
    for (uint32_t a = 0; a < r->n_active; a++) {
        policy_mem_result res = p->mem.ops->load(p->mem.mem, r->layer, r->active[a], PREC_BF16,
                                                 POLICY_PARTS_ALL, POLICY_DEMAND);
        cr_assert(res == POLICY_ISSUED || res == POLICY_ALREADY || res == POLICY_PROMOTED);
        plan->run[a] = PREC_BF16;
    }
}

static void scripted_destroy(policy *p) { free(p); }

static const policy_methods scripted_methods = {
    .api_version = POLICY_API_VERSION,
    .name = "scripted",
    .summary = "test: prefetch then demand",
    .create = scripted_create,
    .on_route = scripted_on_route,
    .destroy = scripted_destroy,
};

/* A trace whose single token routes to expert 0 only. */
static trace *trace_to_expert0(const model_geometry *m) {
    trace *t = fixture_trace(m, 1, 1, 0, 0, 1);
    t->expert_ids[0] = 0;
    t->gate_weights[0] = 1.0f;
    return t;
}

Test(sim, demand_load_overtakes_running_and_queued_prefetches_at_a_chunk_boundary) {
    model_geometry m = fixture_model(1, 3, 1);
    hw_profile hw = fixture_hw();
    trace *t = trace_to_expert0(&m);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t bytes = model_expert_bytes(&m, &quant, PREC_BF16);
    uint64_t chunk = 256 * 1024;
    /* prefetch of expert 1 starts at once; prefetch of expert 2 queues; the demand load of
     * expert 0 is served right after expert 1's first chunk, before expert 2 */
    uint64_t first_chunk = hw.h2d_latency_ns + cost_transfer_ns(chunk, hw.h2d_bytes_per_s);
    uint64_t demand = hw.h2d_latency_ns + cost_transfer_ns(bytes, hw.h2d_bytes_per_s);
    uint64_t want = fixed_ns(&c, 1, 1) + first_chunk + demand +
                    cost_expert_gate_up_ns(&c, PREC_BF16, 1) +
                    cost_expert_down_ns(&c, PREC_BF16, 1) + tail_ns(&c, 1, 1);
    const char *sets[] = {"sim.part_overlap=false", "sim.chunk_kib=256", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "scripted", &scripted_methods, sets, &r, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(makespan_ns(&r), want);
    /* the prefetches still complete (drained after the last step) */
    cr_assert_eq(r.h2d_bytes, 3 * bytes);
    cr_assert_eq(r.prefetches, 2);
    cr_assert_eq(r.prefetch_accuracy, 0.0); /* S = {1, 2}, A = {0} */
    trace_destroy(t);
}

/* Two tokens of one request through one layer, routed to experts e0 then e1 (top-1). */
static trace *two_token_trace(const model_geometry *m, uint16_t e0, uint16_t e1) {
    trace_meta meta;
    memset(&meta, 0, sizeof meta);
    trace_meta_from_model(&meta, m);
    snprintf(meta.source, sizeof meta.source, "test");
    trace *t = trace_create(&meta, 2);
    for (uint64_t i = 0; i < 2; i++) {
        t->request_id[i] = 0;
        t->position[i] = (uint32_t)i;
        t->phase[i] = i == 0 ? TRACE_PREFILL : TRACE_DECODE;
        size_t r = trace_route_index(t, i, 0);
        t->expert_ids[r] = i == 0 ? e0 : e1;
        t->gate_weights[r] = 1.0f;
    }
    moesim_error err;
    cr_assert_eq(trace_finish(t, "test trace", &err), MOESIM_OK, "%s", err.msg);
    return t;
}

/* At its first route, prefetches experts 1..E-1 in id order; then loads what each route runs. */
static uint32_t cancelled_parts;
static void prefetcher_on_cancelled(policy *p, uint32_t layer, uint32_t expert,
                                    moesim_precision prec, uint32_t parts_mask, policy_class cls,
                                    uint64_t now_ns) {
    (void)p, (void)layer, (void)expert, (void)prec, (void)cls, (void)now_ns;
    cr_assert_eq(cls, POLICY_PREFETCH);
    cancelled_parts |= parts_mask;
}

static const policy_methods prefetcher_methods = {
    .api_version = POLICY_API_VERSION,
    .name = "prefetcher",
    .create = scripted_create,
    .on_route = scripted_on_route,
    .on_transfer_cancelled = prefetcher_on_cancelled,
    .destroy = scripted_destroy,
};

Test(sim, a_needed_prefetch_is_promoted_and_a_stale_one_is_cancelled_before_its_copy_starts) {
    /* step 0 runs expert 0 and prefetches 1, 2, 3, 4 (one chunk each): 1 starts at once, the
     * demand load of 0 goes next, then 2. Step 1 runs expert 4: its queued prefetch is promoted
     * past 3, which step 1's layer ran without and which had not started: it is dropped. */
    model_geometry m = fixture_model(1, 5, 1);
    hw_profile hw = fixture_hw();
    trace *t = two_token_trace(&m, 0, 4);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t bytes = model_expert_bytes(&m, &quant, PREC_BF16);
    uint64_t copy = hw.h2d_latency_ns + cost_transfer_ns(bytes, hw.h2d_bytes_per_s);
    uint64_t compute =
        cost_expert_gate_up_ns(&c, PREC_BF16, 1) + cost_expert_down_ns(&c, PREC_BF16, 1);
    /* copies: 1, 0 (demand), 2, then 4 (promoted); the run ends with expert 4's compute */
    uint64_t want = fixed_ns(&c, 1, 1) + 4 * copy + compute + tail_ns(&c, 1, 1);
    const char *sets[] = {"sim.part_overlap=false", "sim.chunk_kib=4096", NULL};
    sim_result r;
    moesim_error err = {0};
    cancelled_parts = 0;
    cr_assert_eq(run_sets(t, &m, &hw, "prefetcher", &prefetcher_methods, sets, &r, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_expect_eq(makespan_ns(&r), want);
    cr_expect_eq(r.prefetches, 4);
    cr_expect_eq(r.prefetch_promoted, 1);
    cr_expect_eq(r.prefetch_late, 1);
    cr_expect_eq(r.prefetch_cancelled, 1);
    cr_expect_eq(cancelled_parts, POLICY_PARTS_ALL);
    cr_expect_eq(r.h2d_bytes, 4 * bytes, "expert 3 never moves");
    cr_expect_eq(r.prefetch_wasted_bytes, 2 * bytes, "experts 1 and 2 moved and never ran");
    trace_destroy(t);
}

/* The scripted prefetches, then takes back the last one (experts 1 and 2: 2 has not started). */
static void take_back_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    bool first = !p->done;
    scripted_on_route(p, r, plan);
    if (first)
        cr_assert_eq(p->mem.ops->evict(p->mem.mem, r->layer, p->E - 1, PREC_BF16, POLICY_PARTS_ALL),
                     POLICY_ISSUED);
}

Test(sim, a_prefetch_the_policy_takes_back_before_its_copy_starts_is_one_cancellation) {
    model_geometry m = fixture_model(1, 3, 1);
    hw_profile hw = fixture_hw();
    trace *t = trace_to_expert0(&m);
    policy_methods takes_back = prefetcher_methods;
    takes_back.on_route = take_back_on_route;
    const char *sets[] = {"sim.chunk_kib=4096", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "takes-back", &takes_back, sets, &r, &err), MOESIM_OK, "%s",
                 err.msg);
    cr_expect_eq(r.prefetches, 2);
    cr_expect_eq(r.prefetch_cancelled, 1, "one transfer of %d parts", PART_COUNT);
    cr_expect_eq(r.h2d_bytes, 2 * model_expert_bytes(&m, &quant, PREC_BF16));
    trace_destroy(t);
}

/* One on-demand expert that lives on the SSD (nothing fits DRAM), copied in chunks of `chunk_kib`
 * through a bounce buffer of `bounce_mib`: the makespan of the run. */
static uint64_t ssd_run_makespan(const char *chunk_set, const char *bounce_set, sim_result *r) {
    model_geometry m = fixture_model(1, 1, 1);
    hw_profile hw = fixture_hw();
    hw.dram_bytes = 0;
    trace *t = fixture_trace(&m, 1, 1, 0, 0, 1);
    const char *sets[] = {"sim.part_overlap=false", chunk_set, bounce_set, NULL};
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "ondemand", NULL, sets, r, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
    return makespan_ns(r);
}

Test(sim, ssd_read_and_pcie_copy_are_store_and_forward_when_the_bounce_holds_one_chunk) {
    /* a one-chunk bounce buffer: the SSD reads chunk i + 1 only once PCIe has copied chunk i,
     * so the copy takes the SSD time plus the PCIe time; the same when one chunk is the expert */
    model_geometry m = fixture_model(1, 1, 1);
    hw_profile hw = fixture_hw();
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t bytes = model_expert_bytes(&m, &quant, PREC_BF16);
    uint64_t ssd = hw.ssd_latency_ns + cost_transfer_ns(bytes, hw.ssd_read_bytes_per_s);
    uint64_t pcie = hw.h2d_latency_ns + cost_transfer_ns(bytes, hw.h2d_bytes_per_s);
    uint64_t want = fixed_ns(&c, 1, 1) + ssd + pcie + cost_expert_gate_up_ns(&c, PREC_BF16, 1) +
                    cost_expert_down_ns(&c, PREC_BF16, 1) + tail_ns(&c, 1, 1);
    sim_result r;
    cr_assert_eq(ssd_run_makespan("sim.chunk_kib=1024", "sim.bounce_mib=1", &r), want);
    cr_assert_eq(r.ssd_bytes, bytes);
    cr_assert_eq(r.h2d_bytes, bytes);
    cr_assert_eq(ssd_run_makespan("sim.chunk_kib=4096", "sim.bounce_mib=4", &r), want);
}

Test(sim, ssd_reads_and_pcie_copies_pipeline_chunk_by_chunk_through_the_bounce_buffer) {
    /* a bounce buffer of many chunks: PCIe copies chunk i as soon as the SSD has read it and
     * PCIe has finished chunk i - 1 (the SSD is the slower link here: 0.5 vs 1 GB/s) */
    model_geometry m = fixture_model(1, 1, 1);
    hw_profile hw = fixture_hw();
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t bytes = model_expert_bytes(&m, &quant, PREC_BF16), chunk = 1024 * 1024;
    uint64_t pcie_end = 0;
    for (uint64_t off = 0; off < bytes; off += chunk) {
        uint64_t n = bytes - off < chunk ? bytes - off : chunk;
        uint64_t read_end = hw.ssd_latency_ns + cost_transfer_ns(off + n, hw.ssd_read_bytes_per_s);
        uint64_t start = read_end > pcie_end ? read_end : pcie_end;
        pcie_end = start + cost_transfer_ns(off + n, hw.h2d_bytes_per_s) -
                   cost_transfer_ns(off, hw.h2d_bytes_per_s) + (off == 0 ? hw.h2d_latency_ns : 0);
    }
    uint64_t want = fixed_ns(&c, 1, 1) + pcie_end + cost_expert_gate_up_ns(&c, PREC_BF16, 1) +
                    cost_expert_down_ns(&c, PREC_BF16, 1) + tail_ns(&c, 1, 1);
    sim_result r;
    cr_assert_eq(ssd_run_makespan("sim.chunk_kib=1024", "sim.bounce_mib=64", &r), want);
    uint64_t serial = hw.ssd_latency_ns + cost_transfer_ns(bytes, hw.ssd_read_bytes_per_s) +
                      hw.h2d_latency_ns + cost_transfer_ns(bytes, hw.h2d_bytes_per_s);
    cr_assert_lt(pcie_end, serial, "pipelining must beat store-and-forward here");
}

/* Layer l's accesses in the simulator's order at batch 1 (a request's prompt is one step, each
 * decode token one), cut into the sub-routes it runs with pools of `cap` experts (consecutive
 * tokens of a step while their distinct experts fit, sim/sim.c run_layer). Fills seq and len;
 * returns the number of routes. */
static size_t sim_batch1_routes(const trace *t, uint32_t l, uint32_t cap, uint16_t *seq,
                                uint32_t *len) {
    const uint32_t K = t->meta.top_k;
    size_t n = 0, n_routes = 0;
    for (uint64_t i = 0; i < t->n_tokens;) {
        uint64_t end = i + 1;
        if (t->phase[i] == TRACE_PREFILL)
            while (end < t->n_tokens && t->request_id[end] == t->request_id[i] &&
                   t->phase[end] == TRACE_PREFILL)
                end++;
        for (uint64_t i0 = i; i0 < end;) {
            uint64_t mask = 0, i1 = i0;
            for (; i1 < end; i1++) {
                uint64_t row = 0;
                for (uint32_t k = 0; k < K; k++) row |= 1ull << trace_experts(t, i1, l)[k];
                if (i1 > i0 && (uint32_t)__builtin_popcountll(mask | row) > cap) break;
                mask |= row;
            }
            len[n_routes++] = (uint32_t)((i1 - i0) * K);
            for (uint64_t j = i0; j < i1; j++)
                for (uint32_t k = 0; k < K; k++) seq[n++] = trace_experts(t, j, l)[k];
            i0 = i1;
        }
        i = end;
    }
    return n_routes;
}

/* Hits of every layer's cache of `cap` under the simulator's rule at batch 1 (LRU or OPT). */
static uint64_t batch1_route_hits(const trace *t, uint32_t cap, bool opt) {
    const uint32_t L = t->meta.n_layers, E = t->meta.n_experts;
    uint16_t *seq = calloc((size_t)t->n_tokens * t->meta.top_k, sizeof *seq);
    uint32_t *len = calloc(t->n_tokens, sizeof *len);
    uint64_t *hits = calloc((size_t)E + 1, sizeof *hits), total = 0;
    cr_assert(E <= 64, "the helper keeps a route's experts in 64 bits");
    for (uint32_t l = 0; l < L; l++) {
        size_t n_routes = sim_batch1_routes(t, l, cap, seq, len), n = 0;
        for (size_t r = 0; r < n_routes; r++) n += len[r];
        uint32_t widest = trace_stats_route_hit_counts(seq, n, len, n_routes, E, opt ? NULL : hits,
                                                       opt ? hits : NULL);
        cr_assert_leq(widest, cap);
        total += hits[cap];
    }
    free(hits);
    free(len);
    free(seq);
    return total;
}

Test(sim, lru_hit_rate_equals_trace_stats_lru_curve_for_every_capacity) {
    /* one-token prompts: every step is one token, the routes `trace stats` pins */
    model_geometry m = fixture_model(3, 16, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 6, 1, 40, 1.0, 7);
    trace_stats *ts = trace_stats_compute(t);
    for (uint32_t cap = m.top_k; cap <= m.n_experts; cap++) {
        char set[64];
        snprintf(set, sizeof set, "cache.experts_per_layer=%u", cap);
        const char *sets[] = {set, NULL};
        sim_result r;
        moesim_error err = {0};
        cr_assert_eq(run_sets(t, &m, &hw, "lru", NULL, sets, &r, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_eq(r.accesses, ts->accesses);
        cr_assert_eq(r.hit_rate, ts->lru_hit_rate[cap], "capacity %u: sim %.6f, stats %.6f", cap,
                     r.hit_rate, ts->lru_hit_rate[cap]);
    }
    trace_stats_destroy(ts);
    trace_destroy(t);
}

Test(sim, lru_hits_equal_pinned_lru_over_the_simulator_sub_routes_with_long_prompts) {
    /* 5-token prompts run as one step: its (sub-)routes are pinned whole, so the simulator's lru
     * equals the LRU stack over those routes (trace_stats_route_hit_counts), not per token */
    model_geometry m = fixture_model(3, 16, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 6, 5, 40, 1.0, 7);
    for (uint32_t cap = m.top_k; cap <= m.n_experts; cap++) {
        char set[64];
        snprintf(set, sizeof set, "cache.experts_per_layer=%u", cap);
        const char *sets[] = {set, NULL};
        sim_result r;
        moesim_error err = {0};
        cr_assert_eq(run_sets(t, &m, &hw, "lru", NULL, sets, &r, &err), MOESIM_OK, "%s", err.msg);
        uint64_t want = batch1_route_hits(t, cap, false);
        cr_assert_eq(r.hits, want, "capacity %u: sim %llu hits, pinned LRU %llu", cap,
                     (unsigned long long)r.hits, (unsigned long long)want);
    }
    trace_destroy(t);
}

/* The oracle's "loads" figure of a run. */
static double report_value(const sim_result *r, const char *name) {
    for (size_t i = 0; i < r->n_policy_report; i++)
        if (!strcmp(r->policy_report_names[i], name)) return r->policy_report_values[i];
    cr_assert_fail("no '%s' in policy_report", name);
    return NAN;
}

Test(sim, oracle_loads_equal_trace_stats_belady_misses_for_every_capacity) {
    /* per-layer pools of c and one-token steps: the oracle's loads (warmup placement,
     * prefetches and demand loads together) are exactly the misses of Belady with each token's
     * experts pinned, at every c >= top_k. (With multi-token prompts split into sub-routes they
     * differ by a few loads either way: the oracle prefetches the next layer's whole step, not
     * its sub-routes.) */
    model_geometry m = fixture_model(3, 16, 2);
    hw_profile hw = fixture_hw();
    for (uint64_t seed = 11; seed <= 12; seed++) {
        const uint32_t prompt = 1;
        trace *t = fixture_trace(&m, 6, prompt, 40, 1.0, seed);
        trace_stats *ts = trace_stats_compute(t);
        for (uint32_t cap = m.top_k; cap <= m.n_experts; cap++) {
            char set[64];
            snprintf(set, sizeof set, "cache.experts_per_layer=%u", cap);
            const char *sets[] = {set, NULL};
            sim_result r;
            moesim_error err = {0};
            cr_assert_eq(run_sets(t, &m, &hw, "oracle", NULL, sets, &r, &err), MOESIM_OK, "%s",
                         err.msg);
            uint64_t misses = ts->accesses - batch1_route_hits(t, cap, true);
            cr_assert_eq(report_value(&r, "loads"), (double)misses,
                         "seed %llu capacity %u: oracle %.0f loads, pinned Belady %llu misses",
                         (unsigned long long)seed, cap, report_value(&r, "loads"),
                         (unsigned long long)misses);
            double stats_misses = (1.0 - ts->opt_hit_rate[cap]) * (double)ts->accesses;
            cr_assert_float_eq(stats_misses, (double)misses, 1e-6);
        }
        trace_stats_destroy(ts);
        trace_destroy(t);
    }
}

Test(sim, batched_lru_and_oracle_equal_trace_stats_batch_curves_from_the_widest_step) {
    /* batch 3, one-token prompts: each step runs up to 3 tokens per layer as one route; from the
     * widest step's distinct experts up (no sub-routes), lru's hit rate is the LRU curve over the
     * step routes and the oracle's loads are the pinned Belady misses (`trace stats --batch 3`) */
    model_geometry m = fixture_model(3, 16, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 6, 1, 40, 1.0, 7);
    sim_batch_curves b;
    sim_batch_curves_compute(t, 3, &b);
    cr_assert(b.from > m.top_k && b.from <= 3 * m.top_k, "widest step %u", b.from);
    for (uint32_t cap = b.from; cap <= m.n_experts; cap++) {
        char set[64];
        snprintf(set, sizeof set, "cache.experts_per_layer=%u", cap);
        const char *sets[] = {set, "batch.size=3", NULL};
        sim_result r;
        moesim_error err = {0};
        cr_assert_eq(run_sets(t, &m, &hw, "lru", NULL, sets, &r, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_eq(r.accesses, b.accesses);
        cr_assert_float_eq(r.hit_rate, b.lru[cap], 1e-12, "capacity %u: sim %.6f, stats %.6f", cap,
                           r.hit_rate, b.lru[cap]);
        cr_assert_eq(run_sets(t, &m, &hw, "oracle", NULL, sets, &r, &err), MOESIM_OK, "%s",
                     err.msg);
        double misses = (1.0 - b.opt[cap]) * (double)b.accesses;
        cr_assert_float_eq(report_value(&r, "loads"), misses, 1e-6,
                           "capacity %u: oracle %.0f loads, pinned Belady %.0f misses", cap,
                           report_value(&r, "loads"), misses);
    }
    cr_assert(isnan(b.lru[b.from - 1]));
    sim_batch_curves_free(&b);
    trace_destroy(t);
}

Test(sim, capacity_below_top_k_is_refused_with_a_message_naming_the_setting) {
    model_geometry m = fixture_model(2, 8, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 1, 2, 2, 0, 3);
    const char *sets[] = {"cache.experts_per_layer=1", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "lru", NULL, sets, &r, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "cache.experts_per_layer") != NULL, "%s", err.msg);
    trace_destroy(t);
}

Test(sim, unknown_policy_lists_the_known_ones) {
    model_geometry m = fixture_model(1, 4, 1);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 1, 1, 1, 0, 3);
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "nosuch", NULL, NULL, &r, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "lru") && strstr(err.msg, "ondemand"), "%s", err.msg);
    trace_destroy(t);
}

Test(sim, unknown_setting_is_an_error_naming_it) {
    model_geometry m = fixture_model(1, 4, 1);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 1, 1, 1, 0, 3);
    const char *sets[] = {"cache.experts_per_lyr=4", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "lru", NULL, sets, &r, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "experts_per_lyr") != NULL, "%s", err.msg);
    trace_destroy(t);
}

Test(sim, measured_cost_table_interpolates_inside_and_extrapolates_a_fitted_line_outside) {
    model_geometry m = fixture_model(1, 1, 1);
    hw_profile hw = fixture_hw();
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t roofline_down = cost_expert_down_ns(&c, PREC_BF16, 2);
    const char *path = "cost-table-test.txt";
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("# moesim cost table v1\n# op precision x time_us\n"
          "expert_gate_up bf16 1 10   # one token\n"
          "expert_gate_up bf16 3 30\n\n"
          "expert_gate_up int4 1 4\n",
          f);
    fclose(f);
    moesim_error err = {0};
    cr_assert_eq(cost_table_load(&c, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(cost_expert_gate_up_ns(&c, PREC_BF16, 2), 20000);      /* interpolated */
    cr_assert_eq(cost_expert_gate_up_ns(&c, PREC_BF16, 5), 50000);      /* line t = 10 us * x */
    cr_assert_eq(cost_expert_gate_up_ns(&c, PREC_INT4, 3), 12000);      /* one point: through 0 */
    cr_assert_eq(cost_expert_down_ns(&c, PREC_BF16, 2), roofline_down); /* not measured */
    cr_assert(cost_table_covers(&c, COST_EXPERT_GATE_UP, PREC_BF16, 1, 3));
    cr_assert(!cost_table_covers(&c, COST_EXPERT_GATE_UP, PREC_BF16, 1, 4));
    cr_assert(cost_table_covers(&c, COST_ROUTER, PREC_BF16, 1, 1000));

    f = fopen(path, "w");
    fputs("# moesim cost table v1\nexpert_gate_up bf16 3 30\nexpert_gate_up bf16 2 20\n", f);
    fclose(f);
    cr_assert_eq(cost_table_load(&c, path, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "cost-table-test.txt:3") && strstr(err.msg, "increase"), "%s",
              err.msg);
    f = fopen(path, "w");
    fputs("# moesim cost table v1\nrouter int4 1 3\n", f);
    fclose(f);
    cr_assert_eq(cost_table_load(&c, path, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, ":2") && strstr(err.msg, "bf16"), "%s", err.msg);

    /* a time beyond COST_TABLE_MAX_TIME_US (1e300 us once gave a silent, normal-looking run) */
    f = fopen(path, "w");
    fputs("# moesim cost table v1\nexpert_gate_up bf16 1 10\nexpert_gate_up bf16 2 1e300\n", f);
    fclose(f);
    cr_assert_eq(cost_table_load(&c, path, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "cost-table-test.txt:3: ") && strstr(err.msg, "time_us <= 1e+09"),
              "%s", err.msg);
    cr_assert_null(strchr(err.msg, '\n'), "%s", err.msg);

    /* the largest allowed time, extrapolated far out, clamps to COST_NS_MAX (no UB cast) */
    f = fopen(path, "w");
    fputs("# moesim cost table v1\nexpert_gate_up bf16 1 0\nexpert_gate_up bf16 2 1e9\n", f);
    fclose(f);
    cr_assert_eq(cost_table_load(&c, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(cost_expert_gate_up_ns(&c, PREC_BF16, 2), 1000000000000ull);
    cr_assert_eq(cost_expert_gate_up_ns(&c, PREC_BF16, UINT32_MAX), COST_NS_MAX);
    cr_assert_eq(cost_transfer_ns(UINT64_MAX, 1e-3), COST_NS_MAX);

    /* damaged or foreign tables: each one line naming the file, never a roofline run */
    static const struct {
        const char *text;
        size_t len; /* 0: strlen */
        const char *says;
    } bad[] = {
        {"# moesim cost table v1\n# op precision x time_us\n", 0,
         "cost-table-test.txt: no measurement"},
        {"# moesim cost table v12\nrouter bf16 1 5\n", 0, ":1: expected the header"},
        {"# moesim cost table v1\nrouter bf16 1 5\nrouter bf16 2 1057", 0,
         ":3: the last line has no end (a truncated file?)"},
        {"# moesim cost table v1\nrouter bf16 1 5\0garbage\n", 47, ":2: a NUL byte"},
        {"# moesim cost table v1\n# model another-model\nrouter bf16 1 5\n", 0,
         ":2: a table measured for model another-model, this run's model is"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(path, "wb");
        fwrite(bad[i].text, 1, bad[i].len ? bad[i].len : strlen(bad[i].text), f);
        fclose(f);
        cr_assert_eq(cost_table_load(&c, path, &err), MOESIM_EINPUT, "case %zu", i);
        cr_assert(strstr(err.msg, bad[i].says), "case %zu: %s", i, err.msg);
    }
    cr_assert_eq(cost_table_load(&c, ".", &err), MOESIM_EINPUT); /* not read as an empty one */
    cr_assert(strstr(err.msg, ".: a directory (expected a cost table file)"), "%s", err.msg);
    f = fopen(path, "w"); /* the run's own model named: accepted */
    fprintf(f, "# moesim cost table v1\n# model %s\nrouter bf16 1 5\n", m.name);
    fclose(f);
    cr_assert_eq(cost_table_load(&c, path, &err), MOESIM_OK, "%s", err.msg);
    remove(path);
}

Test(sim, a_run_with_a_measured_table_uses_its_times_and_reports_extrapolation) {
    model_geometry m = fixture_model(1, 1, 1);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 1, 1, 0, 0, 1);
    const char *path = "cost-table-run.txt";
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("# moesim cost table v1\nexpert_gate_up bf16 1 100\nexpert_down bf16 1 50\n"
          "lm_head bf16 2 7\nlm_head bf16 4 9\n",
          f);
    fclose(f);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t bytes = model_expert_bytes(&m, &quant, PREC_BF16);
    /* lm_head at x = 1 is below its measured range: the fitted line 5 us + 1 us * x gives 6 us */
    uint64_t want = fixed_ns(&c, 1, 1) + hw.h2d_latency_ns +
                    cost_transfer_ns(bytes, hw.h2d_bytes_per_s) + 100000 + 50000 +
                    cost_shared_ns(&c, 1) + cost_combine_ns(&c, 1) + 6000;
    const char *sets[] = {"sim.part_overlap=false", "sim.cost_table=cost-table-run.txt", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "ondemand", NULL, sets, &r, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(makespan_ns(&r), want);
    cr_assert_eq(r.cost_extrapolated, 1, "%u", r.cost_extrapolated); /* lm_head */
    remove(path);
    trace_destroy(t);
}

/* Records, for every decode token, whether the distance-1 prediction's first candidate made at
 * layer l is the expert the token's top-1 turns out to be at layer l + 1. */
typedef struct predictor_probe {
    uint16_t predicted; /* made at the previous layer, for this layer */
    uint64_t right, total;
} predictor_probe;

static predictor_probe *probe_out;

static moesim_status probe_create(const policy_params *params, const void *knobs,
                                  policy_mem_view mem, policy **out, moesim_error *err) {
    (void)knobs;
    (void)err;
    cr_assert(params->lookahead_emulated);
    cr_assert_eq(params->lookahead_depth, 1);
    scripted *p = calloc(1, sizeof *p);
    p->mem = mem;
    *out = p;
    return MOESIM_OK;
}

static void probe_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    if (r->n_tokens == 1) {
        if (r->layer > 0 && probe_out->predicted != POLICY_NO_EXPERT) {
            probe_out->total++;
            probe_out->right += probe_out->predicted == r->experts[0];
        }
        probe_out->predicted = r->lookahead_ids[0];
    } else {
        probe_out->predicted = POLICY_NO_EXPERT;
    }
    for (uint32_t a = 0; a < r->n_active; a++) {
        p->mem.ops->load(p->mem.mem, r->layer, r->active[a], PREC_INT4, POLICY_PARTS_ALL,
                         POLICY_DEMAND);
        plan->run[a] = PREC_INT4;
    }
}

static void probe_end_step(policy *p, const policy_step *step, uint64_t now_ns) {
    (void)step;
    (void)now_ns;
    /* free everything: the probe is not a cache */
    for (uint32_t l = 0; l < 4; l++)
        for (uint32_t e = 0; e < 32; e++)
            p->mem.ops->evict(p->mem.mem, l, e, PREC_INT4, POLICY_PARTS_ALL);
}

static const policy_methods probe_methods = {
    .api_version = POLICY_API_VERSION,
    .name = "probe",
    .summary = "test: measures the emulated predictor",
    .create = probe_create,
    .on_route = probe_on_route,
    .end_step = probe_end_step,
    .destroy = scripted_destroy,
};

Test(sim, emulated_predictor_has_the_stated_top1_accuracy_and_is_reported_as_emulated) {
    model_geometry m = fixture_model(4, 32, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 4, 1, 300, 0.0, 5);
    predictor_probe probe = {.predicted = POLICY_NO_EXPERT};
    probe_out = &probe;
    const char *sets[] = {"predictor.accuracy=0.7", "expert.precision=int4", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "probe", &probe_methods, sets, &r, &err), MOESIM_OK, "%s",
                 err.msg);
    cr_assert(r.predictor_emulated);
    cr_assert_float_eq(r.predictor_accuracy, 0.7, 1e-12);
    /* 0.7 kept plus a random replacement that hits by chance never (it excludes the truth) */
    double acc = (double)probe.right / (double)probe.total;
    double sigma = sqrt(0.7 * 0.3 / (double)probe.total);
    cr_assert_gt(probe.total, 3000);
    cr_assert(fabs(acc - 0.7) < 4 * sigma, "measured %.4f over %llu", acc,
              (unsigned long long)probe.total);
    trace_destroy(t);
}

/* on_route records whether it was handed look-ahead predictions */
static uint32_t routes_with_lookahead, routes_without_lookahead;
static void lookahead_seen_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    routes_with_lookahead += r->lookahead_ids != NULL;
    routes_without_lookahead += r->lookahead_ids == NULL;
    scripted_on_route(p, r, plan);
}

Test(sim, a_policy_that_ignores_lookahead_is_handed_no_emulated_predictions) {
    model_geometry m = fixture_model(2, 4, 1);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 2, 1, 4, 0.0, 3);
    policy_methods reads = {.api_version = POLICY_API_VERSION,
                            .name = "reads",
                            .create = scripted_create,
                            .on_route = lookahead_seen_on_route,
                            .on_transfer_cancelled = prefetcher_on_cancelled,
                            .destroy = scripted_destroy};
    policy_methods ignores = reads;
    ignores.ignores_lookahead = true;
    const char *sets[] = {"predictor.depth=1", NULL};
    sim_result r;
    moesim_error err = {0};
    routes_with_lookahead = routes_without_lookahead = 0;
    cr_assert_eq(run_sets(t, &m, &hw, "reads", &reads, sets, &r, &err), MOESIM_OK, "%s", err.msg);
    cr_expect(routes_with_lookahead > 0 && routes_without_lookahead == 0);
    cr_expect(r.predictor_emulated);
    routes_with_lookahead = routes_without_lookahead = 0;
    cr_assert_eq(run_sets(t, &m, &hw, "ignores", &ignores, sets, &r, &err), MOESIM_OK, "%s",
                 err.msg);
    cr_expect(routes_without_lookahead > 0 && routes_with_lookahead == 0);
    cr_expect(r.predictor_emulated, "the report still says what the run's predictor was");
    trace_destroy(t);
}

Test(sim, every_policy_that_declares_it_ignores_lookahead_gives_the_same_figures_when_handed_it) {
    /* the declaration is a promise: the same policy table with it withdrawn (predictions built
     * and handed over) must give every figure unchanged */
    model_geometry m;
    hw_profile hw;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", &m, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(hw_load_by_name("rtx3090-pcie4", &hw, &err), MOESIM_OK, "%s", err.msg);
    trace *t = fixture_trace(&m, 3, 8, 12, 0.0, 7);
    size_t n_pol = 0, declared = 0;
    const policy_methods *const *pols = policy_all(&n_pol);
    const char *sets[] = {"batch.size=2", "predictor.depth=2", "cache.experts_per_layer=16", NULL};
    for (size_t pi = 0; pi < n_pol; pi++) {
        if (!pols[pi]->ignores_lookahead) continue;
        policy_methods handed = *pols[pi];
        handed.ignores_lookahead = false;
        sim_result a, b;
        if (run_sets(t, &m, &hw, pols[pi]->name, NULL, sets, &a, &err) != MOESIM_OK)
            continue; /* a setup the policy refuses (static: pools too small; tested elsewhere) */
        declared++;
        cr_assert_eq(run_sets(t, &m, &hw, pols[pi]->name, &handed, sets, &b, &err), MOESIM_OK,
                     "%s: %s", pols[pi]->name, err.msg);
        const char *na[160], *nb[160];
        double va[160], vb[160];
        size_t n = sim_result_fields(&a, na, va, 160);
        cr_assert_eq(sim_result_fields(&b, nb, vb, 160), n);
        for (size_t i = 0; i < n; i++)
            cr_expect_eq(va[i], vb[i], "%s: %s is %.17g without predictions, %.17g with",
                         pols[pi]->name, na[i], va[i], vb[i]);
    }
    cr_expect_geq(declared, 4, "lru, lfu, ondemand, oracle at least ran");
    trace_destroy(t);
}

Test(sim, global_lru_hit_rate_equals_one_lru_stack_over_all_layers_in_execution_order) {
    model_geometry m = fixture_model(3, 16, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 5, 3, 30, 1.0, 9);
    const char *sets[] = {"lru.scope=global", "memory.budget_gb=0.05", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "lru", NULL, sets, &r, &err), MOESIM_OK, "%s", err.msg);
    uint64_t cap = r.expert_budget_bytes / model_expert_bytes(&m, &quant, PREC_BF16);
    cr_assert(cap >= 6 && cap < 3 * 16, "the budget should hold a few experts, holds %llu",
              (unsigned long long)cap);
    /* the execution order with batch 1: per step (a request's prompt, or one decode token),
     * layer by layer, the step's tokens in order, their slots in order; ids = layer * E + e.
     * Each (step, layer) is one route (a 3-token prompt has at most 6 <= cap experts), pinned */
    uint32_t L = m.n_moe_layers, E = m.n_experts, K = m.top_k;
    size_t n = (size_t)t->n_tokens * L * K, w = 0, n_routes = 0;
    uint16_t *seq = malloc(n * sizeof *seq);
    uint32_t *len = malloc((size_t)t->n_tokens * L * sizeof *len);
    for (uint64_t i = 0; i < t->n_tokens;) {
        uint64_t end = i + 1;
        if (t->phase[i] == TRACE_PREFILL)
            while (end < t->n_tokens && t->request_id[end] == t->request_id[i] &&
                   t->phase[end] == TRACE_PREFILL)
                end++;
        for (uint32_t l = 0; l < L; l++) {
            len[n_routes++] = (uint32_t)((end - i) * K);
            for (uint64_t j = i; j < end; j++)
                for (uint32_t k = 0; k < K; k++)
                    seq[w++] = (uint16_t)(l * E + trace_experts(t, j, l)[k]);
        }
        i = end;
    }
    cr_assert_eq(w, n);
    uint64_t *hits = calloc((size_t)L * E + 1, sizeof *hits);
    cr_assert_leq(trace_stats_route_hit_counts(seq, n, len, n_routes, L * E, hits, NULL), cap);
    cr_assert_eq(r.accesses, n);
    cr_assert_eq(r.hits, hits[cap], "sim %llu hits, one LRU stack of %llu: %llu",
                 (unsigned long long)r.hits, (unsigned long long)cap,
                 (unsigned long long)hits[cap]);
    free(hits);
    free(len);
    free(seq);
    trace_destroy(t);
}

/* A policy that exercises the memory system's answers at the first route of a 1-layer, 3-expert
 * model whose per-layer pool holds 3 bf16 experts (int4 ones are smaller). */
typedef struct mem_probe {
    policy_mem_result load_again, load_over, evict_started, evict_queued, evict_absent;
    uint64_t free_before, free_after_cancel, used_bf16;
    uint32_t done_calls;
    bool refused_in_use;
} mem_probe;

static mem_probe *mem_probe_out;

static void memprobe_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    const policy_mem_ops *o = p->mem.ops;
    policy_mem *mm = p->mem.mem;
    mem_probe *q = mem_probe_out;
    if (!p->done) {
        q->free_before = o->free_bytes(mm, 0);
        cr_assert_eq(o->load(mm, 0, 1, PREC_BF16, POLICY_PARTS_ALL, POLICY_PREFETCH),
                     POLICY_ISSUED);
        cr_assert_eq(o->load(mm, 0, 2, PREC_BF16, POLICY_PARTS_ALL, POLICY_PREFETCH),
                     POLICY_ISSUED);
        q->load_again = o->load(mm, 0, 1, PREC_BF16, POLICY_PARTS_ALL, POLICY_PREFETCH);
        cr_assert_eq(o->state(mm, 0, 1, PREC_BF16, PART_DOWN), POLICY_LOADING);
        q->evict_started = o->evict(mm, 0, 1, PREC_BF16, POLICY_PARTS_ALL); /* copy running */
        q->evict_queued = o->evict(mm, 0, 2, PREC_BF16, POLICY_PARTS_ALL);  /* still queued */
        q->free_after_cancel = o->free_bytes(mm, 0);
        q->evict_absent = o->evict(mm, 0, 2, PREC_BF16, POLICY_PARTS_ALL);
        cr_assert_eq(o->load(mm, 0, 2, PREC_BF16, POLICY_PARTS_ALL, POLICY_PREFETCH),
                     POLICY_ISSUED);
        q->load_over = o->load(mm, 0, 0, PREC_INT8, POLICY_PARTS_ALL, POLICY_DEMAND);
        q->used_bf16 = o->used_bytes(mm, PREC_BF16);
        /* make room for the demand load of expert 0: drop the queued prefetch of expert 2 */
        cr_assert_eq(o->evict(mm, 0, 2, PREC_BF16, POLICY_PARTS_ALL), POLICY_ISSUED);
    }
    p->done = true;
    for (uint32_t a = 0; a < r->n_active; a++) {
        policy_mem_result res =
            o->load(mm, r->layer, r->active[a], PREC_BF16, POLICY_PARTS_ALL, POLICY_DEMAND);
        cr_assert(res == POLICY_ISSUED || res == POLICY_ALREADY);
        plan->run[a] = PREC_BF16;
    }
}

static void memprobe_done(policy *p, uint32_t layer, uint32_t expert, moesim_precision prec,
                          uint32_t parts_mask, policy_class cls, uint64_t now_ns) {
    (void)cls;
    (void)now_ns;
    mem_probe_out->done_calls++;
    cr_assert_eq(parts_mask, POLICY_PARTS_ALL);
    /* expert 0 runs in this layer: while its compute is pending, it cannot be evicted */
    if (expert == 1 && p->mem.ops->state(p->mem.mem, layer, 0, prec, PART_GATE) != POLICY_ABSENT)
        mem_probe_out->refused_in_use =
            p->mem.ops->evict(p->mem.mem, layer, 0, prec, POLICY_PARTS_ALL) == POLICY_REFUSED;
}

static const policy_methods memprobe_methods = {
    .api_version = POLICY_API_VERSION,
    .name = "memprobe",
    .summary = "test: memory system answers",
    .create = scripted_create,
    .on_route = memprobe_on_route,
    .on_transfer_done = memprobe_done,
    .destroy = scripted_destroy,
};

Test(sim, memory_system_refuses_over_budget_and_in_use_and_cancels_only_unstarted_copies) {
    model_geometry m = fixture_model(1, 3, 1);
    hw_profile hw = fixture_hw();
    trace *t = trace_to_expert0(&m);
    mem_probe q = {0};
    mem_probe_out = &q;
    /* whole-expert chunks: expert 1's prefetch finishes before expert 0's demand copy starts,
     * so its completion arrives while expert 0 waits to run */
    const char *sets[] = {"cache.experts_per_layer=2", "sim.chunk_kib=4096", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "memprobe", &memprobe_methods, sets, &r, &err), MOESIM_OK,
                 "%s", err.msg);
    uint64_t e = model_expert_bytes(&m, &quant, PREC_BF16);
    cr_assert_eq(q.free_before, 2 * e);
    cr_assert_eq(q.load_again, POLICY_ALREADY);
    cr_assert_eq(q.evict_started, POLICY_REFUSED);
    cr_assert_eq(q.evict_queued, POLICY_ISSUED);
    cr_assert_eq(q.free_after_cancel, e); /* only expert 1's copy still holds its bytes */
    cr_assert_eq(q.evict_absent, POLICY_ALREADY);
    cr_assert_eq(q.load_over, POLICY_REFUSED); /* 2 bf16 experts fill the pool */
    cr_assert_eq(q.used_bf16, 2 * e);
    cr_assert(q.refused_in_use);
    cr_assert_eq(q.done_calls, 2); /* expert 1's prefetch and expert 0's demand load */
    cr_assert_eq(r.h2d_bytes, 2 * e);
    trace_destroy(t);
}

/* Background migrations yield to prefetches, prefetches to demand loads: records the order in
 * which copies complete. */
typedef struct order_probe {
    uint32_t order[8];
    uint64_t t_ns[8];
    uint32_t n;
} order_probe;

static order_probe *order_out;

static void classes_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    const policy_mem_ops *o = p->mem.ops;
    if (!p->done) {
        cr_assert_eq(o->load(p->mem.mem, 0, 1, PREC_BF16, POLICY_PARTS_ALL, POLICY_BACKGROUND),
                     POLICY_ISSUED);
        cr_assert_eq(o->load(p->mem.mem, 0, 2, PREC_BF16, POLICY_PARTS_ALL, POLICY_BACKGROUND),
                     POLICY_ISSUED);
        cr_assert_eq(o->load(p->mem.mem, 0, 3, PREC_BF16, POLICY_PARTS_ALL, POLICY_PREFETCH),
                     POLICY_ISSUED);
    }
    p->done = true;
    for (uint32_t a = 0; a < r->n_active; a++) {
        o->load(p->mem.mem, r->layer, r->active[a], PREC_BF16, POLICY_PARTS_ALL, POLICY_DEMAND);
        plan->run[a] = PREC_BF16;
    }
}

static void classes_done(policy *p, uint32_t layer, uint32_t expert, moesim_precision prec,
                         uint32_t parts_mask, policy_class cls, uint64_t now_ns) {
    (void)p, (void)layer, (void)prec, (void)parts_mask, (void)cls;
    order_out->t_ns[order_out->n] = now_ns;
    order_out->order[order_out->n++] = expert;
}

static const policy_methods classes_methods = {
    .api_version = POLICY_API_VERSION,
    .name = "classes",
    .summary = "test: priority classes",
    .create = scripted_create,
    .on_route = classes_on_route,
    .on_transfer_done = classes_done,
    .destroy = scripted_destroy,
};

Test(sim, copies_are_served_demand_first_then_prefetch_then_background) {
    model_geometry m = fixture_model(1, 4, 1);
    hw_profile hw = fixture_hw();
    trace *t = trace_to_expert0(&m);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    order_probe q = {0};
    order_out = &q;
    const char *sets[] = {"sim.chunk_kib=512", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "classes", &classes_methods, sets, &r, &err), MOESIM_OK, "%s",
                 err.msg);
    cr_assert_eq(q.n, 4);
    /* expert 1 (background) had started: it yields after one chunk to the demand load (0), then
     * to the prefetch (3); it resumes before the queued background copy of expert 2 */
    uint32_t want[] = {0, 3, 1, 2};
    for (int i = 0; i < 4; i++) cr_assert_eq(q.order[i], want[i], "completion %d", i);
    uint64_t bytes = model_expert_bytes(&m, &quant, PREC_BF16);
    uint64_t t0 = fixed_ns(&c, 1, 1);
    uint64_t chunk = hw.h2d_latency_ns + cost_transfer_ns(512 * 1024, hw.h2d_bytes_per_s);
    uint64_t copy = hw.h2d_latency_ns + cost_transfer_ns(bytes, hw.h2d_bytes_per_s);
    cr_assert_eq(q.t_ns[0], t0 + chunk + copy);
    cr_assert_eq(q.t_ns[1], t0 + chunk + 2 * copy);
    /* the rest of expert 1 pays no second latency */
    cr_assert_eq(q.t_ns[2], t0 + 3 * copy);
    cr_assert_eq(q.t_ns[3], t0 + 4 * copy);
    trace_destroy(t);
}

/* Runs even experts at int4 and skips odd ones. */
static void mixed_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    for (uint32_t a = 0; a < r->n_active; a++) {
        if (r->active[a] % 2) continue; /* left at POLICY_RUN_SKIP */
        policy_mem_result res = p->mem.ops->load(p->mem.mem, r->layer, r->active[a], PREC_INT4,
                                                 POLICY_PARTS_ALL, POLICY_DEMAND);
        cr_assert(res != POLICY_REFUSED);
        plan->run[a] = PREC_INT4;
    }
}

static void mixed_end_step(policy *p, const policy_step *step, uint64_t now_ns) {
    (void)step, (void)now_ns;
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t e = 0; e < p->E; e++)
            p->mem.ops->evict(p->mem.mem, l, e, PREC_INT4, POLICY_PARTS_ALL);
}

static const policy_methods mixed_methods = {
    .api_version = POLICY_API_VERSION,
    .name = "mixed",
    .summary = "test: int4 and skip",
    .create = scripted_create,
    .on_route = mixed_on_route,
    .end_step = mixed_end_step,
    .destroy = scripted_destroy,
};

Test(sim, precision_mix_is_the_share_of_gate_mass_run_high_low_and_skipped) {
    model_geometry m = fixture_model(2, 8, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 2, 3, 10, 0.5, 21);
    double lo = 0, skip = 0;
    uint64_t skipped = 0;
    for (size_t i = 0; i < t->n_tokens * m.n_moe_layers * m.top_k; i++) {
        if (t->expert_ids[i] % 2) {
            skip += t->gate_weights[i];
            skipped++;
        } else {
            lo += t->gate_weights[i];
        }
    }
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "mixed", &mixed_methods, NULL, &r, &err), MOESIM_OK, "%s",
                 err.msg);
    cr_assert_float_eq(r.precision_mix_lo, lo / (lo + skip), 1e-6);
    cr_assert_float_eq(r.precision_mix_skip, skip / (lo + skip), 1e-6);
    cr_assert_eq(r.precision_mix_hi, 0.0);
    cr_assert_eq(r.skipped_accesses, skipped);
    cr_assert_eq(r.h2d_bytes % model_expert_bytes(&m, &quant, PREC_INT4), 0);
    trace_destroy(t);
}

Test(sim, result_fields_are_unique_named_columns_in_a_fixed_order) {
    model_geometry m = fixture_model(1, 4, 1);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 2, 2, 3, 0, 3);
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "lru", NULL, NULL, &r, &err), MOESIM_OK, "%s", err.msg);
    const char *names[64];
    double values[64];
    size_t n = sim_result_fields(&r, names, values, 64);
    cr_assert_geq(n, 25);
    cr_assert_str_eq(names[0], "tokens");
    cr_assert_eq(values[0], (double)t->n_tokens);
    bool seen_p99 = false, seen_hit = false;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++) cr_assert_str_neq(names[i], names[j]);
        if (!strcmp(names[i], "ttft_ms.p99")) seen_p99 = values[i] == r.ttft.p99_ms;
        if (!strcmp(names[i], "hit_rate")) seen_hit = values[i] == r.hit_rate;
    }
    cr_assert(seen_p99 && seen_hit);
    cr_assert_eq(sim_result_fields(&r, names, values, 3), 3);
    trace_destroy(t);
}

Test(sim, finished_requests_are_replaced_and_prefill_steps_take_every_pending_prompt) {
    model_geometry m = fixture_model(1, 4, 1);
    hw_profile hw = fixture_hw();
    /* requests (prompt, decode): (2, 3), (2, 1), (2, 5); batch 2:
     *   step 0 prefill r0 r1 | 1 decode r0 r1 (r1 ends) | 2 prefill r2 | 3, 4 decode r0 r2
     *   (r0 ends) | 5, 6, 7 decode r2: 8 steps */
    const uint32_t prompt[] = {2, 2, 2}, decode[] = {3, 1, 5};
    trace *base = fixture_trace(&m, 1, 0, 16, 0, 4); /* routing rows to copy from */
    trace_meta meta = base->meta;
    trace *t = trace_create(&meta, 15);
    uint64_t i = 0;
    for (uint32_t q = 0; q < 3; q++)
        for (uint32_t p = 0; p < prompt[q] + decode[q]; p++, i++) {
            t->request_id[i] = q;
            t->position[i] = p;
            t->phase[i] = p < prompt[q] ? TRACE_PREFILL : TRACE_DECODE;
            t->expert_ids[i] = base->expert_ids[i];
            t->gate_weights[i] = 1.0f;
        }
    moesim_error err = {0};
    cr_assert_eq(trace_finish(t, "test", &err), MOESIM_OK, "%s", err.msg);
    const char *sets[] = {"batch.size=2", NULL};
    sim_result r;
    cr_assert_eq(run_sets(t, &m, &hw, "lru", NULL, sets, &r, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(r.steps, 8);
    cr_assert_eq(r.tokens, 15);
    cr_assert_eq(r.requests, 3);
    trace_destroy(t);
    trace_destroy(base);
}

/* Checks, at every route, that the look-ahead and importance the policy sees are the trace's. */
static const trace *recorded_trace;
static uint64_t recorded_checked;

static void recorded_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    cr_assert(r->lookahead_ids && r->importance);
    /* with batch 1 the step's tokens are consecutive trace tokens from first_token */
    for (uint32_t i = 0; i < r->n_tokens; i++) {
        uint64_t tok = p->first_token + i;
        const uint16_t *want =
            recorded_trace->lookahead_ids + trace_lookahead_index(recorded_trace, tok, r->layer, 1);
        for (uint32_t j = 0; j < recorded_trace->meta.lookahead_k; j++)
            cr_assert_eq(r->lookahead_ids[(size_t)i * recorded_trace->meta.lookahead_k + j],
                         want[j]);
        cr_assert_eq(r->importance[i],
                     recorded_trace->importance[tok * recorded_trace->meta.n_layers + r->layer]);
        recorded_checked++;
    }
    for (uint32_t a = 0; a < r->n_active; a++) {
        p->mem.ops->load(p->mem.mem, r->layer, r->active[a], PREC_INT4, POLICY_PARTS_ALL,
                         POLICY_DEMAND);
        plan->run[a] = PREC_INT4;
    }
}

static void recorded_begin_step(policy *p, const policy_step *step) {
    /* batch 1, requests stored one after the other: the step's first token is the trace token
     * with this request and position */
    uint64_t tok = 0;
    while (recorded_trace->request_id[tok] != step->request[0] ||
           recorded_trace->position[tok] != step->position[0])
        tok++;
    p->first_token = tok;
}

static void recorded_end_step(policy *p, const policy_step *step, uint64_t now_ns) {
    (void)step, (void)now_ns;
    for (uint32_t l = 0; l < recorded_trace->meta.n_layers; l++)
        for (uint32_t e = 0; e < recorded_trace->meta.n_experts; e++)
            p->mem.ops->evict(p->mem.mem, l, e, PREC_INT4, POLICY_PARTS_ALL);
}

static const policy_methods recorded_methods = {
    .api_version = POLICY_API_VERSION,
    .name = "recorded",
    .summary = "test: recorded look-ahead and importance reach the policy",
    .create = scripted_create,
    .begin_step = recorded_begin_step,
    .on_route = recorded_on_route,
    .end_step = recorded_end_step,
    .destroy = scripted_destroy,
};

Test(sim, recorded_lookahead_and_importance_reach_the_policy_and_accuracy_is_measured) {
    model_geometry m = fixture_model(3, 8, 2);
    hw_profile hw = fixture_hw();
    trace *plain = fixture_trace(&m, 2, 3, 6, 0.5, 8);
    trace_meta meta = plain->meta;
    meta.lookahead_depth = 1;
    meta.lookahead_k = 2;
    meta.has_importance = true;
    trace *t = trace_create(&meta, plain->n_tokens);
    size_t route = (size_t)plain->n_tokens * m.n_moe_layers * m.top_k;
    memcpy(t->request_id, plain->request_id, plain->n_tokens * sizeof *t->request_id);
    memcpy(t->position, plain->position, plain->n_tokens * sizeof *t->position);
    memcpy(t->phase, plain->phase, plain->n_tokens);
    memcpy(t->expert_ids, plain->expert_ids, route * sizeof *t->expert_ids);
    memcpy(t->gate_weights, plain->gate_weights, route * sizeof *t->gate_weights);
    /* the prediction at layer l for l + 1: its true top-2 on odd tokens, reversed on even
     * tokens (top-1 wrong); nothing past the last layer */
    uint64_t right = 0, total = 0;
    for (uint64_t i = 0; i < t->n_tokens; i++)
        for (uint32_t l = 0; l < m.n_moe_layers; l++) {
            t->importance[i * m.n_moe_layers + l] = (float)(i + l);
            uint16_t *ids = t->lookahead_ids + trace_lookahead_index(t, i, l, 1);
            float *sc = t->lookahead_scores + trace_lookahead_index(t, i, l, 1);
            for (uint32_t j = 0; j < 2; j++) {
                ids[j] = l + 1 < m.n_moe_layers ? trace_experts(t, i, l + 1)[i % 2 ? j : 1 - j]
                                                : TRACE_NO_EXPERT;
                sc[j] = l + 1 < m.n_moe_layers ? 0.5f : 0.0f;
            }
            if (l + 1 < m.n_moe_layers) {
                total++;
                right += i % 2;
            }
        }
    moesim_error err = {0};
    cr_assert_eq(trace_finish(t, "test", &err), MOESIM_OK, "%s", err.msg);
    recorded_trace = t;
    recorded_checked = 0;
    const char *sets[] = {"expert.precision=int4", NULL};
    sim_result r;
    cr_assert_eq(run_sets(t, &m, &hw, "recorded", &recorded_methods, sets, &r, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(recorded_checked, t->n_tokens * m.n_moe_layers);
    cr_assert(!r.predictor_emulated);
    cr_assert_float_eq(r.predictor_accuracy, (double)right / (double)total, 1e-12);
    trace_destroy(t);
    trace_destroy(plain);
}

/* Copies token `from` of `src` to token `to` of `dst` (same geometry, no look-ahead). */
static void trace_copy_token(trace *dst, uint64_t to, const trace *src, uint64_t from) {
    size_t R = trace_route_values(&src->meta);
    dst->request_id[to] = src->request_id[from];
    dst->position[to] = src->position[from];
    dst->phase[to] = src->phase[from];
    memcpy(dst->expert_ids + to * R, src->expert_ids + from * R, R * sizeof *dst->expert_ids);
    memcpy(dst->gate_weights + to * R, src->gate_weights + from * R, R * sizeof *dst->gate_weights);
    if (src->importance)
        memcpy(dst->importance + to * src->meta.n_layers,
               src->importance + from * src->meta.n_layers,
               src->meta.n_layers * sizeof *dst->importance);
}

/* `src` with recorded look-ahead predictions (depth 3, 3 candidates): the next layers' experts,
 * every fourth first candidate wrong. */
static trace *with_lookahead(const trace *src) {
    trace_meta meta = src->meta;
    meta.lookahead_depth = 3;
    meta.lookahead_k = 4; /* twice top_k: the writer chunks each row's candidates in halves */
    trace *t = trace_create(&meta, src->n_tokens);
    const uint32_t L = meta.n_layers, E = meta.n_experts, K = meta.top_k;
    for (uint64_t i = 0; i < src->n_tokens; i++) {
        trace_copy_token(t, i, src, i);
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t d = 1; d <= 3; d++)
                for (uint32_t c = 0; c < 4; c++) {
                    size_t x = trace_lookahead_index(t, i, l, d) + c;
                    uint16_t e = l + d < L ? trace_experts(src, i, l + d)[c % K] : TRACE_NO_EXPERT;
                    if (e != TRACE_NO_EXPERT && c == 0 && (i + l) % 4 == 0)
                        e = (uint16_t)((e + 1) % E);
                    t->lookahead_ids[x] = e;
                    t->lookahead_scores[x] = e == TRACE_NO_EXPERT ? 0.0f : 1.0f / (float)(c + 1);
                }
    }
    moesim_error err = {0};
    cr_assert_eq(trace_finish(t, "with look-ahead", &err), MOESIM_OK, "%s", err.msg);
    return t;
}

/* Runs `name` with batch.size=2 and `knob` (or none) on the trace in memory and on a stream of
 * its file opened with the rows the run reads (sim_stream_options): every figure agrees, the
 * recorded predictor's accuracy included. Returns whether the stream skipped the look-ahead. */
static bool stream_skip_gives_every_figure(const trace *t, const char *path,
                                           const model_geometry *m, const hw_profile *hw,
                                           const char *name, const char *knob) {
    moesim_error err = {0};
    const char *sets[] = {"batch.size=2", knob, NULL};
    config *c = config_create();
    for (const char *const *kv = sets; *kv; kv++)
        cr_assert_eq(config_set(c, *kv, &err), MOESIM_OK, "%s", err.msg);
    trace_stream_options rows = sim_stream_options(NULL, name, c);
    trace_stream *ts = NULL;
    cr_assert_eq(trace_stream_open_with(path, &rows, &ts, &err), MOESIM_OK, "%s", err.msg);
    /* the distances a policy declares it reads, alone; the run in memory is handed all 3; and
     * the candidates: the first top_k (2, a chunk's) for a reader of as many, all 4 else */
    const policy_methods *pm = policy_lookup(name);
    const uint32_t declared = pm->lookahead_distances;
    cr_assert_eq(trace_stream_rows_meta(ts)->lookahead_depth,
                 rows.skip_lookahead ? 0 : declared ? declared : 3, "%s", name);
    const uint32_t first = rows.first_candidates_only && rows.lookahead_candidates <= 2 ? 2 : 4;
    cr_assert_eq(trace_stream_rows_meta(ts)->lookahead_k, rows.skip_lookahead ? 0 : first, "%s %s",
                 name, knob ? knob : "");
    cr_assert_eq(rows.first_candidates_only, pm->lookahead_candidates_with != NULL, "%s", name);
    sim_result a, b;
    cr_assert_eq(run_sets(t, m, hw, name, NULL, sets, &a, &err), MOESIM_OK, "%s", err.msg);
    sim_inputs in = {.trace = trace_stream_tokens(ts), .stream = ts, .model = m, .hw = hw,
                     .quant = &quant};
    cr_assert_eq(sim_run(&in, name, c, &b, &err), MOESIM_OK, "%s", err.msg);
    config_destroy(c);
    cr_assert_gt(a.predictor_accuracy, 0.5, "%s", name);
    cr_assert_lt(a.predictor_accuracy, 0.9, "%s", name);
    json_t *xa = sim_result_to_json(&a), *xb = sim_result_to_json(&b);
    char *ja = json_dumps(xa, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    char *jb = json_dumps(xb, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    cr_assert_str_eq(ja, jb, "%s %s", name, knob ? knob : "");
    free(ja);
    free(jb);
    json_decref(xa);
    json_decref(xb);
    trace_stream_close(ts);
    return rows.skip_lookahead;
}

/* Only the runs that never read the look-ahead rows skip them: the policies that ignore them,
 * and a reader whose prefetch knob is off (dynaexq by default, dymoe with dymoe.prefetch=false);
 * a policy that reads distance 1 alone (mixtral-offload, dymoe, dynaexq) is handed that alone,
 * and one that reads its first top_k candidates (mixtral-offload, dymoe) those alone;
 * either way every figure is the trace's. */
Test(sim, a_stream_without_the_rows_a_policy_ignores_gives_every_figure_the_trace_gives) {
    model_geometry m = fixture_model(4, 16, 2);
    hw_profile hw = fixture_hw();
    moesim_error err = {0};
    trace *plain = fixture_trace(&m, 3, 7, 15, 1.0, 5);
    trace *t = with_lookahead(plain);
    trace_destroy(plain);
    const char *path = test_tmp_path("sim-stream-skip.h5");
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    size_t n_pol;
    const policy_methods *const *pols = policy_all(&n_pol);
    for (size_t pi = 0; pi < n_pol; pi++) {
        const char *name = pols[pi]->name;
        bool knob_off = !strcmp(name, "dynaexq"); /* dynaexq.prefetch defaults to false */
        cr_assert_eq(stream_skip_gives_every_figure(t, path, &m, &hw, name, NULL),
                     pols[pi]->ignores_lookahead || knob_off, "%s", name);
    }
    cr_assert(stream_skip_gives_every_figure(t, path, &m, &hw, "dymoe", "dymoe.prefetch=false"));
    /* a reader of more than top_k candidates is handed them */
    cr_assert(!stream_skip_gives_every_figure(t, path, &m, &hw, "dymoe", "dymoe.prefetch_t=3"));
    cr_assert(!stream_skip_gives_every_figure(t, path, &m, &hw, "mixtral-offload",
                                              "mixtral-offload.prefetch_experts=4"));
    cr_assert(!stream_skip_gives_every_figure(t, path, &m, &hw, "dynaexq", "dynaexq.prefetch=true"));
    trace_destroy(t);
}

/* Knobs that do not parse, or an unknown policy, ask for every row: the run reports them. */
Test(sim, stream_options_read_every_row_for_bad_knobs_or_an_unknown_policy) {
    moesim_error err = {0};
    config *c = config_create();
    cr_assert(!sim_stream_options(NULL, "dymoe", c).skip_lookahead);
    cr_assert_eq(config_set(c, "dymoe.prefetch=maybe", &err), MOESIM_OK, "%s", err.msg);
    cr_assert(!sim_stream_options(NULL, "dymoe", c).skip_lookahead);
    cr_assert(!sim_stream_options(NULL, "no-such-policy", c).skip_lookahead);
    cr_assert(sim_stream_options(NULL, "lru", c).skip_lookahead);
    config_destroy(c);
}

/* Every registered policy gives the same JSON from a trace streamed block by block (small
 * blocks, so requests in flight straddle them) as from the trace in memory. */
Test(sim, a_streamed_trace_gives_every_figure_the_trace_in_memory_gives) {
    model_geometry m = fixture_model(4, 16, 2);
    hw_profile hw = fixture_hw();
    moesim_error err = {0};
    trace *contiguous = fixture_trace(&m, 6, 9, 23, 1.0, 11);
    /* requests 2..5 interleave in the file, token by token (ids stay in first-appearance order) */
    trace *t = trace_create(&contiguous->meta, contiguous->n_tokens);
    uint64_t at = 0, per = 9 + 23;
    for (uint64_t i = 0; i < 2 * per; i++) trace_copy_token(t, at++, contiguous, i);
    for (uint64_t p = 0; p < per; p++)
        for (uint64_t r = 2; r < 6; r++) trace_copy_token(t, at++, contiguous, r * per + p);
    cr_assert_eq(trace_finish(t, "interleaved", &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(contiguous);
    const char *path = test_tmp_path("sim-stream.h5");
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_stream *ts = NULL;
    cr_assert_eq(trace_stream_open(path, &ts, &err), MOESIM_OK, "%s", err.msg);
    char names[512];
    snprintf(names, sizeof names, "%s", policy_names());
    for (char *name = strtok(names, ", "); name; name = strtok(NULL, ", ")) {
        for (int batch = 1; batch <= 3; batch += 2) {
            char set_batch[32];
            snprintf(set_batch, sizeof set_batch, "batch.size=%d", batch);
            const char *sets[] = {set_batch, NULL};
            sim_result a, b;
            cr_assert_eq(run_sets(t, &m, &hw, name, NULL, sets, &a, &err), MOESIM_OK, "%s",
                         err.msg);
            trace_stream_set_cache(ts, 5, 1);
            config *c = config_create();
            cr_assert_eq(config_set(c, set_batch, &err), MOESIM_OK, "%s", err.msg);
            sim_inputs in = {.trace = trace_stream_tokens(ts),
                             .stream = ts,
                             .model = &m,
                             .hw = &hw,
                             .quant = &quant};
            cr_assert_eq(sim_run(&in, name, c, &b, &err), MOESIM_OK, "%s", err.msg);
            config_destroy(c);
            json_t *xa = sim_result_to_json(&a), *xb = sim_result_to_json(&b);
            char *ja = json_dumps(xa, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
            char *jb = json_dumps(xb, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
            cr_assert_str_eq(ja, jb, "%s, batch %d", name, batch);
            free(ja);
            free(jb);
            json_decref(xa);
            json_decref(xb);
        }
    }
    trace_stream_close(ts);
    trace_destroy(t);
}
