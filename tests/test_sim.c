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
#include "sim/cost.h"
#include "sim/sim.h"
#include "sim_fixtures.h"
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
        cr_assert(res == POLICY_ISSUED || res == POLICY_ALREADY);
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

Test(sim, ssd_resident_experts_add_the_ssd_read_before_the_pcie_copy) {
    model_geometry m = fixture_model(1, 1, 1);
    hw_profile hw = fixture_hw();
    hw.dram_bytes = 0; /* nothing fits DRAM: every expert lives on the SSD */
    trace *t = fixture_trace(&m, 1, 1, 0, 0, 1);
    cost_model c;
    cost_model_init(&c, &hw, &m, &quant);
    uint64_t bytes = model_expert_bytes(&m, &quant, PREC_BF16);
    uint64_t ssd = hw.ssd_latency_ns + cost_transfer_ns(bytes, hw.ssd_read_bytes_per_s);
    uint64_t pcie = hw.h2d_latency_ns + cost_transfer_ns(bytes, hw.h2d_bytes_per_s);
    uint64_t want = fixed_ns(&c, 1, 1) + ssd + pcie + cost_expert_gate_up_ns(&c, PREC_BF16, 1) +
                    cost_expert_down_ns(&c, PREC_BF16, 1) + tail_ns(&c, 1, 1);
    const char *sets[] = {"sim.part_overlap=false", NULL};
    sim_result r;
    moesim_error err = {0};
    cr_assert_eq(run_sets(t, &m, &hw, "ondemand", NULL, sets, &r, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(makespan_ns(&r), want);
    cr_assert_eq(r.ssd_bytes, bytes);
    cr_assert_eq(r.h2d_bytes, bytes);
    trace_destroy(t);
}

Test(sim, lru_hit_rate_equals_trace_stats_lru_curve_for_every_capacity) {
    model_geometry m = fixture_model(3, 16, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 6, 5, 40, 1.0, 7);
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
