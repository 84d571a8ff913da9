/* The CPU-testable parts of replay/ (replay/replay.h): the schedule and the memory budget give
 * the simulator's figures, the card emulation refuses what does not fit, the calibration writers
 * produce files hw_load and cost_table_load accept with the measured values, the validation
 * arithmetic (errors, medians, policy order), the memory system as the replay's copy engines
 * drive it (core/memsys.h: chunk pieces, SSD chunks staged one for one, the bounce slots' bound),
 * and the replay / calibrate / validate commands: bad arguments and a machine without a GPU (or
 * a build without CUDA) exit 2 with one line. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "core/memsys.h"
#include "replay/replay.h"
#include "sim/cost.h"
#include "sim/sim.h"
#include "sim_fixtures.h"
#include "support/test_support.h"

static quant_table quant;

static void setup(void) {
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
}

TestSuite(replay, .init = setup);

static moesim_status sim_with(const trace *t, const model_geometry *m, const hw_profile *hw,
                              const char *policy_name, const char *const *sets, const sim_hooks *h,
                              sim_result *r, moesim_error *err) {
    config *c = config_create();
    for (const char *const *s = sets; s && *s; s++)
        cr_assert_eq(config_set(c, *s, err), MOESIM_OK, "%s", err->msg);
    sim_inputs in = {.trace = t, .model = m, .hw = hw, .quant = &quant, .hooks = h};
    moesim_status st = sim_run(&in, policy_name, c, r, err);
    config_destroy(c);
    return st;
}

/* ---- schedule and budget: the simulator's numbers ---- */

Test(replay, schedule_and_budget_match_the_simulators_for_every_setup) {
    model_geometry m = fixture_model(4, 16, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 5, 7, 9, 1.0, 3);
    cr_assert(t);
    static const struct {
        const char *batch, *budget, *per_layer;
    } cases[] = {
        {"batch.size=1", "memory.budget_gb=0.25", "cache.experts_per_layer=0"},
        {"batch.size=3", "memory.budget_gb=0.5", "cache.experts_per_layer=0"},
        {"batch.size=2", "memory.budget_gb=1", "cache.experts_per_layer=4"},
        {"batch.size=5", "memory.budget_gb=0.3", "cache.experts_per_layer=2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *sets[] = {cases[i].batch, cases[i].budget, cases[i].per_layer, NULL};
        sim_result r;
        moesim_error err = {0};
        cr_assert_eq(sim_with(t, &m, &hw, "lru", sets, NULL, &r, &err), MOESIM_OK, "%s", err.msg);
        config *c = config_create();
        for (const char *const *s = sets; *s; s++) config_set(c, *s, &err);
        sim_settings set;
        cr_assert_eq(sim_settings_read(c, &set, &err), MOESIM_OK, "%s", err.msg);
        config_destroy(c);
        replay_schedule sch;
        replay_schedule_build(&sch, t, &m, set.batch_size);
        cr_assert_eq(sch.n_steps, r.steps, "case %zu: %lu steps, sim %lu", i,
                     (unsigned long)sch.n_steps, (unsigned long)r.steps);
        replay_budget b;
        cr_assert_eq(replay_budget_plan(&m, &quant, &hw, &set, sch.max_step_tokens,
                                        sch.kv_peak_bytes, "b", "c", &b, &err),
                     MOESIM_OK, "%s", err.msg);
        cr_assert_eq(b.budget_bytes, r.budget_bytes, "case %zu", i);
        cr_assert_eq(b.expert_budget_bytes, r.expert_budget_bytes, "case %zu", i);
        cr_assert_eq(b.kv_peak_bytes, r.kv_peak_bytes, "case %zu", i);
        replay_schedule_free(&sch);
    }
    trace_destroy(t);
}

Test(replay, budget_refuses_what_the_simulator_refuses_with_the_same_message) {
    model_geometry m = fixture_model(4, 16, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 2, 4, 4, 1.0, 5);
    const char *sets[] = {"memory.budget_gb=0.02", NULL}; /* 20 MiB: room for 2 of 3 MiB? no */
    sim_result r;
    moesim_error e1 = {0}, e2 = {0};
    moesim_status s1 = sim_with(t, &m, &hw, "lru", sets, NULL, &r, &e1);
    cr_assert_eq(s1, MOESIM_EINPUT);
    sim_settings set;
    config *c = config_create();
    config_set(c, sets[0], &e2);
    sim_settings_read(c, &set, &e2);
    char where[640];
    config_origin(c, "memory", "budget_gb", where, sizeof where);
    config_destroy(c);
    replay_schedule sch;
    replay_schedule_build(&sch, t, &m, 1);
    replay_budget b;
    cr_assert_eq(replay_budget_plan(&m, &quant, &hw, &set, sch.max_step_tokens, sch.kv_peak_bytes,
                                    where, "c", &b, &e2),
                 MOESIM_EINPUT);
    cr_assert_str_eq(e2.msg, e1.msg);
    replay_schedule_free(&sch);
    trace_destroy(t);
}

Test(replay, card_emulation_fits_the_card_and_the_free_device_memory) {
    replay_budget b = {.budget_bytes = 16ull << 30};
    moesim_error err = {0};
    uint64_t free80 = 79ull << 30, reserve = 512ull << 20;
    cr_assert_eq(replay_budget_fit_device(&b, 15ull << 30, free80, reserve, &err), MOESIM_OK);
    cr_assert_eq(replay_budget_fit_device(&b, (16ull << 30) + 1, free80, reserve, &err),
                 MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "16.000 GiB card"), "%s", err.msg);
    /* a 16 GiB card on a GPU with 16 GiB free: the reserve does not fit */
    cr_assert_eq(replay_budget_fit_device(&b, 1ull << 30, 16ull << 30, reserve, &err),
                 MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "free"), "%s", err.msg);
    cr_assert_eq(replay_budget_fit_device(&b, 1ull << 30, (16ull << 30) + reserve, reserve, &err),
                 MOESIM_OK);
    /* pool blocks: what the byte accounting admits, capped by the parts that exist */
    cr_assert_eq(replay_pool_blocks(100, 30, 1000), 3);
    cr_assert_eq(replay_pool_blocks(100, 30, 2), 2);
    cr_assert_eq(replay_pool_blocks(100, 0, 2), 0);
}

/* ---- calibration writers ---- */

static void fake_results(calib_results *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->gpu, sizeof c->gpu, "NVIDIA H100 80GB HBM3");
    c->hbm_bytes = 85520809984ull; /* 79.65 GiB, a cudaMemGetInfo total */
    c->n_sizes = 3;
    double sizes[] = {4096, 1048576, 268435456}, h2d[] = {1.2, 40.5, 53.25};
    for (int i = 0; i < 3; i++) {
        c->size_bytes[i] = sizes[i];
        c->h2d_gb_per_s[i] = h2d[i];
        c->d2h_gb_per_s[i] = h2d[i] * 0.9;
    }
    c->h2d_peak_gb_per_s = 53.25;
    c->d2h_peak_gb_per_s = 47.925;
    c->h2d_latency_us = 2.5;
    c->d2h_latency_us = 3.25;
    c->hbm_gb_per_s = 2680;
    c->bf16_tflops = 650;
    c->kernel_launch_us = 2.75;
    c->op_events_us = 1.25;
    c->repeats = 20;
    double tok[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        c->curve[COST_EXPERT_GATE_UP][PREC_INT4].x[i] = tok[i];
        c->curve[COST_EXPERT_GATE_UP][PREC_INT4].t_ns[i] = 9000 + 250 * tok[i];
        c->curve[COST_ATTENTION][PREC_BF16].x[i] = 16 * tok[i];
        c->curve[COST_ATTENTION][PREC_BF16].t_ns[i] = 30000 + 10 * tok[i];
    }
    c->curve[COST_EXPERT_GATE_UP][PREC_INT4].n = 4;
    c->curve[COST_ATTENTION][PREC_BF16].n = 4;
}

/* The profile calibrate writes from `c` on `base`, as NAME (its file under the test's folder),
 * loaded back into *got; returns the file's path. */
static const char *profile_round_trip(const calib_results *c, const hw_profile *base,
                                      const char *name, hw_profile *got) {
    static char path[4096];
    char file[128];
    snprintf(file, sizeof file, "%s.ini", name);
    snprintf(path, sizeof path, "%s", test_tmp_path(file));
    moesim_error err = {0};
    cr_assert_eq(calib_write_profile(c, base, name, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(hw_load(path, got, &err), MOESIM_OK, "%s", err.msg);
    return path;
}

Test(replay, calibration_profile_loads_with_the_measured_figures) {
    calib_results c;
    fake_results(&c);
    hw_profile base, got;
    moesim_error err = {0};
    cr_assert_eq(hw_load_by_name("h100-sxm", &base, &err), MOESIM_OK, "%s", err.msg);
    const char *path = profile_round_trip(&c, &base, "h100-test-measured", &got);
    cr_assert_str_eq(got.name, "h100-test-measured");
    cr_assert_str_eq(got.gpu, "NVIDIA H100 80GB HBM3");
    cr_assert_float_eq(got.h2d_bytes_per_s, 53.25e9, 1e3);
    cr_assert_float_eq(got.d2h_bytes_per_s, 47.925e9, 1e3);
    cr_assert_eq(got.h2d_latency_ns, 2500);
    cr_assert_eq(got.d2h_latency_ns, 3250);
    cr_assert_eq(got.kernel_launch_ns, 2750);
    cr_assert_eq(got.op_issue_ns, 1250);
    cr_assert_float_eq(got.hbm_efficiency, 2680 / 3350.0, 1e-5);
    cr_assert_float_eq(got.compute_efficiency, 650 / 989.4, 1e-5);
    cr_assert_eq(got.dram_bytes, base.dram_bytes);
    cr_assert(!got.gpu_direct_storage, "replay's SSD path bounces through DRAM");
    cr_assert_eq(got.copy_engines, base.copy_engines);
    /* every figure names its source, as tests/test_hw_config.c requires of configs/hw */
    FILE *f = fopen(path, "r");
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == ';' || line[0] == '[' || !strchr(line, '=') || !strncmp(line, "name", 4))
            continue;
        cr_assert(strstr(line, "; derived:"), "no source: %s", line);
    }
    fclose(f);
}

/* What calibrate measured on the GPU replaces the base's figures: latency_per_chunk from the
 * back-to-back chunks, and a device copy faster than the base's peak (another card) as the
 * profile's HBM rate. */
Test(replay, calibration_profile_takes_the_measured_chunk_latency_and_a_faster_hbm) {
    calib_results c;
    fake_results(&c);
    hw_profile base, got;
    moesim_error err = {0};
    cr_assert_eq(hw_load_by_name("h100-sxm", &base, &err), MOESIM_OK, "%s", err.msg);
    cr_assert(!base.h2d_latency_per_chunk, "the base assumes the latency is paid once");
    c.h2d_chunk_measured = true;
    c.h2d_latency_per_chunk = true;
    c.h2d_chunk_us = 22.0;
    c.hbm_gb_per_s = 4224; /* an H200's device copy on the H100 base (3350 GB/s) */
    profile_round_trip(&c, &base, "h200-test-measured", &got);
    cr_assert(got.h2d_latency_per_chunk);
    cr_assert_eq(got.op_issue_ns, 1250);
    cr_assert_float_eq(got.hbm_bytes_per_s, 4224e9, 1e3);
    cr_assert_float_eq(got.hbm_efficiency, 1.0, 1e-9);
    c.h2d_latency_per_chunk = false; /* measured not to pay it: false even were the base true */
    base.h2d_latency_per_chunk = true;
    profile_round_trip(&c, &base, "h200-test-measured", &got);
    cr_assert(!got.h2d_latency_per_chunk);
}

/* What the link and the compute cost each other, where calibrate measured it (the CPU backend):
 * the profile's slowdowns; a calibration that did not leaves them at the base's (0). */
Test(replay, calibration_profile_carries_the_measured_slowdowns_beside_each_other) {
    calib_results c;
    fake_results(&c);
    hw_profile base, got;
    moesim_error err = {0};
    cr_assert_eq(hw_load_by_name("h100-sxm", &base, &err), MOESIM_OK, "%s", err.msg);
    profile_round_trip(&c, &base, "h100-test-measured", &got);
    cr_assert_eq(got.op_slowdown_beside_copy, 0);
    cr_assert_eq(got.h2d_slowdown_beside_compute, 0);
    c.contention_measured = true;
    c.op_slowdown_beside_copy = 0.107;
    c.link_slowdown_beside_compute = 0.042;
    profile_round_trip(&c, &base, "h100-test-measured", &got);
    cr_assert_float_eq(got.op_slowdown_beside_copy, 0.107, 1e-9);
    cr_assert_float_eq(got.h2d_slowdown_beside_compute, 0.042, 1e-9);
}

Test(replay, calibration_table_replaces_the_roofline_with_the_measured_times) {
    calib_results c;
    fake_results(&c);
    model_geometry m;
    hw_profile hw;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", &m, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(hw_load_by_name("h100-sxm", &hw, &err), MOESIM_OK, "%s", err.msg);
    const char *path = test_tmp_path("cost-table.txt");
    cr_assert_eq(calib_write_table(&c, m.name, path, &err), MOESIM_OK, "%s", err.msg);
    static cost_model cm;
    cost_model_init(&cm, &hw, &m, &quant);
    uint64_t roof = cost_op_ns(&cm, COST_EXPERT_GATE_UP, PREC_INT4, 4);
    cr_assert_eq(cost_table_load(&cm, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert(cm.has_table);
    cr_assert_eq(cost_op_ns(&cm, COST_EXPERT_GATE_UP, PREC_INT4, 4), 10000, "roofline was %lu",
                 (unsigned long)roof);
    cr_assert_eq(cost_op_ns(&cm, COST_EXPERT_GATE_UP, PREC_INT4, 3), 9750); /* interpolated */
    cr_assert_eq(cost_op_ns(&cm, COST_ATTENTION, PREC_BF16, 64), 30040);
    cr_assert(cost_table_covers(&cm, COST_EXPERT_GATE_UP, PREC_INT4, 1, 8));
    cr_assert(!cost_table_covers(&cm, COST_EXPERT_GATE_UP, PREC_INT4, 1, 16));
}

/* ---- validation arithmetic ---- */

static void record(validate_record *v, const char *policy_name, double tpot, double ttft,
                   double total, const double *req_tpot, const double *req_ttft,
                   const double *layer) {
    validate_record_init(v, 3, 2);
    snprintf(v->r.policy, sizeof v->r.policy, "%s", policy_name);
    v->r.tpot.mean_ms = tpot;
    v->r.ttft.mean_ms = ttft;
    v->r.makespan_ms = total;
    for (int i = 0; i < 3; i++) {
        v->tpot_ms[i] = req_tpot[i];
        v->ttft_ms[i] = req_ttft[i];
    }
    for (int l = 0; l < 2; l++) v->layer_ms[l] = layer[l];
}

Test(replay, validation_errors_and_medians_are_relative_to_the_measurement) {
    validate_record s, r;
    record(&s, "lru", 11, 45, 1100, (double[]){10, 22, NAN}, (double[]){40, 50, 60},
           (double[]){3, 6});
    record(&r, "lru", 10, 50, 1000, (double[]){10, 20, 30}, (double[]){50, 50, 50},
           (double[]){4, 6});
    validate_row row;
    moesim_error err = {0};
    cr_assert_eq(validate_compare(&s, &r, "budget 16 GiB", &row, &err), MOESIM_OK);
    cr_assert_float_eq(row.tpot_err, 0.1, 1e-12);
    cr_assert_float_eq(row.ttft_err, -0.1, 1e-12);
    cr_assert_float_eq(row.total_err, 0.1, 1e-12);
    /* one replay: its TPOT is the whole range */
    cr_assert(row.real_tpot_lo_ms == row.real_tpot_ms && row.real_tpot_hi_ms == row.real_tpot_ms);
    /* per request |err|: tpot {0, 0.1} (the single-step request is left out) -> 0.05 */
    cr_assert_float_eq(row.req_tpot_err_median, 0.05, 1e-12);
    cr_assert_float_eq(row.req_ttft_err_median, 0.2, 1e-12); /* {0.2, 0, 0.2} */
    cr_assert_float_eq(row.layer_err_median, 0.125, 1e-12);  /* {0.25, 0} */
    cr_assert_float_eq(row.layer_err_max, 0.25, 1e-12);
    cr_assert_eq(row.layer_worst, 0);
    cr_assert_eq(row.n_layers, 2);
    cr_assert_float_eq(row.sim_layer_ms[1], 6, 1e-6);
    cr_assert_float_eq(row.real_layer_ms[0], 4, 1e-6);
    /* outside the layers: 1100 - 9 simulated, 1000 - 10 replayed */
    cr_assert_float_eq(row.sim_outside_ms, 1091, 1e-9);
    cr_assert_float_eq(row.real_outside_ms, 990, 1e-9);
    cr_assert_float_eq(row.outside_err, 101.0 / 990, 1e-12);
    cr_assert_str_eq(row.policy, "lru");
    /* nothing copied: no link rate */
    cr_assert(isnan(row.sim_link_gb_per_s) && isnan(row.real_link_gb_per_s));
    s.r.h2d_bytes = 3000000000ull, s.r.h2d_busy_ms = 3000; /* 1 GB/s */
    r.r.h2d_bytes = 3000000000ull, r.r.h2d_busy_ms = 1500; /* 2 GB/s */
    cr_assert_eq(validate_compare(&s, &r, "budget 16 GiB", &row, &err), MOESIM_OK);
    cr_assert_float_eq(row.sim_link_gb_per_s, 1.0, 1e-12);
    cr_assert_float_eq(row.real_link_gb_per_s, 2.0, 1e-12);
    validate_record other;
    validate_record_init(&other, 4, 2);
    cr_assert_eq(validate_compare(&s, &other, "x", &row, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "not the same trace"), "%s", err.msg);
    validate_record_free(&s);
    validate_record_free(&r);
    validate_record_free(&other);
    cr_assert(isnan(validate_rel_err(1, 0)));
    double v[] = {3, 1, 2, 10};
    cr_assert_float_eq(validate_median(v, 4), 2.5, 1e-12);
    cr_assert(isnan(validate_median(v, 0)));
}

Test(replay, summary_checks_the_targets_and_the_policy_order_per_group) {
    validate_row rows[] = {
        {.policy = "lru",
         .group = "16",
         .sim_tpot_ms = 10,
         .real_tpot_ms = 10.3,
         .tpot_err = -0.03,
         .ttft_err = 0.05,
         .total_err = 0.01},
        {.policy = "oracle",
         .group = "16",
         .sim_tpot_ms = 5,
         .real_tpot_ms = 5.1,
         .tpot_err = -0.02,
         .ttft_err = -0.08,
         .total_err = 0.02},
        {.policy = "ondemand",
         .group = "16",
         .sim_tpot_ms = 50,
         .real_tpot_ms = 48,
         .tpot_err = 0.04,
         .ttft_err = 0.09,
         .total_err = 0.03},
        /* another budget: compared only among itself */
        {.policy = "lru",
         .group = "24",
         .sim_tpot_ms = 8,
         .real_tpot_ms = 8,
         .tpot_err = 0,
         .ttft_err = 0,
         .total_err = 0},
    };
    validate_summary s;
    validate_summarize(rows, 4, &s);
    cr_assert_eq(s.n_rows, 4);
    cr_assert_eq(s.pairs, 3);
    cr_assert_eq(s.concordant, 3);
    cr_assert(s.same_order);
    cr_assert_float_eq(s.tpot_abs_err_median, 0.025, 1e-12); /* {0, .02, .03, .04} */
    cr_assert_float_eq(s.ttft_abs_err_median, 0.065, 1e-12);
    cr_assert(s.meets_targets);
    cr_assert_eq(s.discordant_gap_max, 0);
    cr_assert_eq(validate_discordant_pairs(rows, 4, NULL, 0), 0);
    rows[1].real_tpot_ms = 11; /* replay now ranks oracle behind lru */
    validate_summarize(rows, 4, &s);
    cr_assert_eq(s.concordant, 2);
    cr_assert(!s.same_order);
    cr_assert(!s.meets_targets);
    /* which pair, and how far apart the simulator put it */
    size_t pairs[2][2];
    cr_assert_eq(validate_discordant_pairs(rows, 4, pairs, 2), 1);
    cr_assert(pairs[0][0] == 0 && pairs[0][1] == 1);
    cr_assert_float_eq(s.discordant_gap_max, validate_sim_gap(&rows[0], &rows[1]), 1e-15);
    cr_assert_float_eq(validate_sim_gap(&rows[0], &rows[1]), rows[0].sim_tpot_ms / 5 - 1, 1e-15);
    rows[1].real_tpot_ms = 5.1;
    rows[0].tpot_err = rows[1].tpot_err = -0.2; /* median |TPOT err| 0.11 > 5 % */
    validate_summarize(rows, 4, &s);
    cr_assert(s.same_order);
    cr_assert(!s.meets_targets);
    /* a configuration the simulator refused counts nowhere, even with a wild "error" */
    validate_row more[5];
    memcpy(more, rows, sizeof rows);
    more[0].tpot_err = more[1].tpot_err = -0.03;
    more[4] = (validate_row){.policy = "static",
                             .group = "16",
                             .refused = true,
                             .sim_tpot_ms = 1,
                             .real_tpot_ms = 100,
                             .tpot_err = -0.99};
    validate_summarize(more, 5, &s);
    cr_assert_eq(s.n_rows, 4);
    cr_assert_eq(s.pairs, 3);
    cr_assert_float_eq(s.tpot_abs_err_median, 0.03, 1e-12); /* {0, .03, .03, .04} */
    cr_assert(s.meets_targets);
}

Test(replay, a_pair_the_simulator_ties_is_not_ranked_whatever_the_replay_measures) {
    /* lru and lfu with every expert resident: the same cold misses, the same simulated TPOT */
    validate_row rows[] = {
        {.policy = "lru", .group = "24", .sim_tpot_ms = 15, .real_tpot_ms = 16.05},
        {.policy = "lfu", .group = "24", .sim_tpot_ms = 15, .real_tpot_ms = 16.01},
        {.policy = "ondemand", .group = "24", .sim_tpot_ms = 60, .real_tpot_ms = 61},
    };
    validate_summary s;
    validate_summarize(rows, 3, &s);
    cr_assert_eq(s.sim_ties, 1);
    cr_assert_eq(s.pairs, 2); /* lru-ondemand, lfu-ondemand */
    cr_assert_eq(s.concordant, 2);
    cr_assert(s.same_order);
    cr_assert_eq(validate_discordant_pairs(rows, 3, NULL, 0), 0);
    size_t tied[1][2];
    cr_assert_eq(validate_sim_tied_pairs(rows, 3, tied, 1), 1);
    cr_assert(tied[0][0] == 0 && tied[0][1] == 1);
    /* a simulated order, however small, is ranked */
    rows[1].sim_tpot_ms = 15.01;
    validate_summarize(rows, 3, &s);
    cr_assert_eq(s.sim_ties, 0);
    cr_assert_eq(s.pairs, 3);
    cr_assert(!s.same_order);
    cr_assert_eq(validate_discordant_pairs(rows, 3, NULL, 0), 1);
}

/* Rounds of TPOTs: the configuration's own, a + k * step for round k. */
static void set_rounds(validate_row *r, uint32_t n, const double *tpot) {
    r->n_rounds = n;
    for (uint32_t k = 0; k < n; k++) r->real_tpot_round_ms[k] = tpot[k];
}

Test(replay, the_replay_orders_a_pair_only_where_its_rounds_agree_by_the_sign_test) {
    /* lfu vs firm-moe at 1.6 GiB in the CPU report's rounds: 5 of 9 one way, no measured order */
    static const double lfu[] = {11.78, 11.03, 12.19, 11.96, 10.93, 12.52, 11.92, 11.69, 11.50};
    static const double firm[] = {11.33, 11.14, 11.77, 12.12, 11.96, 13.62, 12.00, 11.31, 10.70};
    static const double ondemand[] = {66.8, 67.1, 65.9, 70.2, 66.0, 66.4, 75.5, 66.1, 66.7};
    validate_row rows[] = {
        {.policy = "lfu", .group = "1.6", .sim_tpot_ms = 11.69, .real_tpot_ms = 11.69},
        {.policy = "firm-moe", .group = "1.6", .sim_tpot_ms = 11.52, .real_tpot_ms = 11.77},
        {.policy = "ondemand", .group = "1.6", .sim_tpot_ms = 66.5, .real_tpot_ms = 66.7},
    };
    set_rounds(&rows[0], 9, lfu);
    set_rounds(&rows[1], 9, firm);
    set_rounds(&rows[2], 9, ondemand);
    uint32_t rounds;
    cr_assert_eq(validate_rounds_faster(&rows[0], &rows[1], &rounds), 5);
    cr_assert_eq(rounds, 9);
    cr_assert_eq(validate_replay_order(&rows[0], &rows[1]), 0);
    cr_assert_eq(validate_replay_order(&rows[0], &rows[2]), -1); /* 9 of 9 */
    cr_assert_eq(validate_replay_order(&rows[2], &rows[1]), 1);
    validate_summary s;
    validate_summarize(rows, 3, &s);
    cr_assert_eq(s.pairs, 3);
    cr_assert_eq(s.concordant, 2); /* the medians put lfu ahead, the simulator firm-moe */
    cr_assert(!s.same_order);
    cr_assert_eq(s.replay_ordered, 2);
    cr_assert_eq(s.replay_ordered_concordant, 2);
    cr_assert(s.meets_targets);
    /* 8 of 9 rounds is an order (p = 0.039), and the simulator must then agree with it */
    double lfu8[9];
    for (int k = 0; k < 9; k++) lfu8[k] = k == 3 ? 11.0 : firm[k] + 0.3;
    set_rounds(&rows[0], 9, lfu8);
    cr_assert_eq(validate_replay_order(&rows[0], &rows[1]), 1);
    validate_summarize(rows, 3, &s);
    cr_assert_eq(s.replay_ordered, 3);
    cr_assert_eq(s.replay_ordered_concordant, 3); /* the simulator has lfu slower too */
    rows[0].sim_tpot_ms = 11.4;
    validate_summarize(rows, 3, &s);
    cr_assert_eq(s.replay_ordered_concordant, 2);
    cr_assert(!s.meets_targets);
    /* 7 of 8 rounds (one tie left out) is not: p = 0.070 */
    lfu8[0] = firm[0];
    set_rounds(&rows[0], 9, lfu8);
    cr_assert_eq(validate_rounds_faster(&rows[0], &rows[1], &rounds), 1);
    cr_assert_eq(rounds, 8);
    cr_assert_eq(validate_replay_order(&rows[0], &rows[1]), 0);
    /* too few rounds for the test: the compared replays decide, as with one replay */
    rows[0].n_rounds = rows[1].n_rounds = VALIDATE_MIN_ROUNDS - 1;
    rows[0].real_tpot_ms = 11.7;
    rows[1].real_tpot_ms = 11.8;
    cr_assert_eq(validate_replay_order(&rows[0], &rows[1]), -1);
    validate_summarize(rows, 3, &s);
    cr_assert_eq(s.replay_ordered, 3);
}

Test(replay, record_hooks_collect_the_simulators_per_request_and_per_layer_times) {
    model_geometry m = fixture_model(3, 16, 2);
    hw_profile hw = fixture_hw();
    trace *t = fixture_trace(&m, 4, 5, 6, 1.0, 9);
    validate_record v;
    validate_record_init(&v, 4, 3);
    sim_hooks h = validate_record_hooks(&v);
    const char *sets[] = {"batch.size=2", NULL};
    moesim_error err = {0};
    cr_assert_eq(sim_with(t, &m, &hw, "lru", sets, &h, &v.r, &err), MOESIM_OK, "%s", err.msg);
    double sum_tpot = 0, sum_ttft = 0, layers = 0;
    for (int q = 0; q < 4; q++) {
        cr_assert(!isnan(v.tpot_ms[q]) && v.ttft_ms[q] > 0);
        sum_tpot += v.tpot_ms[q];
        sum_ttft += v.ttft_ms[q];
    }
    cr_assert_float_eq(sum_tpot / 4, v.r.tpot.mean_ms, 1e-9);
    cr_assert_float_eq(sum_ttft / 4, v.r.ttft.mean_ms, 1e-9);
    for (int l = 0; l < 3; l++) {
        cr_assert(v.layer_ms[l] > 0);
        layers += v.layer_ms[l];
    }
    cr_assert(layers < v.r.makespan_ms, "MoE layers %.3f ms of %.3f", layers, v.r.makespan_ms);
    validate_record_free(&v);
    trace_destroy(t);
}

/* ---- the memory system as the replay drives it ---- */

/* The replay's copy engines (replay/run.cu) over memsys, without a GPU: the SSD engine reads
 * every chunk memsys hands it at once and stages it; the H2D engine keeps 2 chunks in flight and
 * retires them in submission order. What run.cu relies on is checked as it goes. */
#define ED_STAGED_MAX 4096
typedef struct engine_double {
    memsys ms;
    memsys_chunk inflight[2];
    uint32_t n_inflight;
    struct {
        uint32_t xfer;
        uint64_t offset, bytes;
    } staged[ED_STAGED_MAX];
    uint32_t n_staged, staged_peak;
    uint64_t next_part_byte[MEMSYS_ENGINES][1024][PART_COUNT]; /* [engine][transfer][part] the
                                                                  next byte expected */
    uint64_t h2d_chunks, ssd_chunks, parts_landed;
    bool ssd_running;
} engine_double;

/* Checks a chunk's pieces: in stream order, contiguous, each part's bytes from its first on. */
static void ed_check_pieces(engine_double *d, const memsys_chunk *c) {
    const memsys_xfer *x = &d->ms.xf[c->xfer];
    cr_assert_lt(c->xfer, 1024);
    memsys_piece pc[PART_COUNT];
    uint32_t n = memsys_chunk_pieces(&d->ms, c, pc);
    uint64_t *next = d->next_part_byte[c->engine][c->xfer];
    if (c->first)
        for (int part = 0; part < PART_COUNT; part++) next[part] = 0;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        cr_assert(x->parts & (1u << pc[i].part), "a piece of a part the transfer does not carry");
        cr_assert(i == 0 || pc[i].part > pc[i - 1].part);
        cr_assert(i == 0 || pc[i].part_offset == 0, "only the first piece starts mid-part");
        cr_assert_eq(pc[i].part_offset, next[pc[i].part]);
        next[pc[i].part] += pc[i].bytes;
        cr_assert_leq(next[pc[i].part], d->ms.cfg.part_bytes[x->prec][pc[i].part]);
        cr_assert(i + 1 == n || next[pc[i].part] == d->ms.cfg.part_bytes[x->prec][pc[i].part],
                  "a piece before another ends its part");
        sum += pc[i].bytes;
    }
    cr_assert_eq(sum, c->bytes);
}

static void ed_on_work(void *ctx, int engine);

static void ed_h2d_kick(engine_double *d) {
    memsys_chunk c;
    while (d->n_inflight < 2 && memsys_next_chunk(&d->ms, MEMSYS_H2D, &c)) {
        ed_check_pieces(d, &c);
        if (d->ms.xf[c.xfer].via_ssd) { /* run.cu copies on exactly the SSD chunk it staged */
            uint32_t i = 0;
            while (i < d->n_staged && d->staged[i].xfer != c.xfer) i++;
            cr_assert_lt(i, d->n_staged, "an H2D chunk of bytes the SSD engine did not stage");
            cr_assert_eq(d->staged[i].offset, c.offset);
            cr_assert_eq(d->staged[i].bytes, c.bytes);
            memmove(&d->staged[i], &d->staged[i + 1], (d->n_staged - i - 1) * sizeof d->staged[0]);
            d->n_staged--;
        }
        d->inflight[d->n_inflight++] = c;
        d->h2d_chunks++;
    }
}

static void ed_ssd_kick(engine_double *d) {
    if (d->ssd_running) return;
    d->ssd_running = true;
    memsys_chunk c;
    while (memsys_next_chunk(&d->ms, MEMSYS_SSD, &c)) {
        ed_check_pieces(d, &c);
        cr_assert_lt(d->n_staged, ED_STAGED_MAX);
        d->staged[d->n_staged].xfer = c.xfer;
        d->staged[d->n_staged].offset = c.offset;
        d->staged[d->n_staged++].bytes = c.bytes;
        if (d->n_staged > d->staged_peak) d->staged_peak = d->n_staged;
        d->ssd_chunks++;
        memsys_xfer fin;
        cr_assert_not(memsys_chunk_done(&d->ms, &c, &fin), "an SSD chunk landed in HBM");
    }
    d->ssd_running = false;
}

static void ed_on_work(void *ctx, int engine) {
    if (engine == MEMSYS_SSD)
        ed_ssd_kick(ctx);
    else
        ed_h2d_kick(ctx);
}

static void ed_retire_one(engine_double *d) {
    memsys_chunk c = d->inflight[0];
    d->inflight[0] = d->inflight[1];
    d->n_inflight--;
    memsys_xfer fin;
    bool complete = memsys_chunk_done(&d->ms, &c, &fin);
    if (complete)
        for (int part = 0; part < PART_COUNT; part++)
            if (fin.parts & (1u << part)) {
                cr_assert_eq(d->next_part_byte[MEMSYS_H2D][c.xfer][part],
                             d->ms.cfg.part_bytes[fin.prec][part]);
                d->parts_landed++;
            }
    ed_h2d_kick(d);
    if (complete) memsys_deliver(&d->ms, &fin, 0);
}

static uint64_t ed_rand(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

Test(replay, ssd_chunks_are_copied_on_one_for_one_and_fit_the_bounce_slots) {
    /* parts that are no multiple of the chunk (tails), two precisions, most experts on the SSD,
     * loads of every class and part mask, promotions (a route running a queued copy) and
     * cancellations (evicting a queued copy) in a random order */
    const uint64_t chunk = 1u << 20, bounce = 6u << 20;
    memsys_config cfg = {.n_layers = 2,
                         .n_experts = 8,
                         .per_layer = false,
                         .pool_cap_bytes = 400u << 20,
                         .chunk_bytes = chunk,
                         .bounce_bytes = bounce};
    const uint64_t bf16[PART_COUNT] = {3 * chunk + 40960, 3 * chunk + 40960, 3 * chunk + 12288};
    const uint64_t int4[PART_COUNT] = {chunk - 8192, chunk - 8192, chunk + 300000};
    memcpy(cfg.part_bytes[PREC_BF16], bf16, sizeof bf16);
    memcpy(cfg.part_bytes[PREC_INT4], int4, sizeof int4);
    engine_double *d = calloc(1, sizeof *d);
    memsys_host host = {.ctx = d, .on_work = ed_on_work};
    memsys_init(&d->ms, &cfg, &host);
    const moesim_precision order[] = {PREC_BF16, PREC_INT4};
    memsys_place(&d->ms, order, 2, 3 * (bf16[0] + bf16[1] + bf16[2])); /* 3 bf16 experts in DRAM */
    /* the replay's bound: every staged chunk is at least the smallest chunk a transfer can have */
    uint64_t min_chunk = chunk;
    const uint64_t *pb[] = {bf16, int4};
    for (int p = 0; p < 2; p++)
        for (uint32_t mask = 1; mask <= POLICY_PARTS_ALL; mask++) {
            uint64_t b = 0;
            for (int part = 0; part < PART_COUNT; part++)
                if (mask & (1u << part)) b += pb[p][part];
            uint64_t tail = b % chunk ? b % chunk : chunk;
            if (tail < min_chunk) min_chunk = tail;
        }
    uint64_t rng = 88172645463325252ull, loads = 0, promoted0 = 0;
    for (int op = 0; op < 20000; op++) {
        uint32_t l = (uint32_t)(ed_rand(&rng) % 2), e = (uint32_t)(ed_rand(&rng) % 8);
        moesim_precision p = ed_rand(&rng) % 2 ? PREC_BF16 : PREC_INT4;
        switch (ed_rand(&rng) % 4) {
        case 0: {
            uint32_t mask = 1 + (uint32_t)(ed_rand(&rng) % POLICY_PARTS_ALL);
            policy_class cls = (policy_class)(ed_rand(&rng) % 3);
            loads += memsys_ops.load(&d->ms, l, e, p, mask, cls) == POLICY_ISSUED;
            break;
        }
        case 1:
            memsys_ops.evict(&d->ms, l, e, p, POLICY_PARTS_ALL);
            break;
        case 2:
            memsys_begin_layer(&d->ms);
            memsys_run(&d->ms, l, e, p);
            memsys_unpin(&d->ms, l, e, p);
            break;
        default:
            if (d->n_inflight) ed_retire_one(d);
        }
        cr_assert_leq(d->n_staged * min_chunk, bounce, "%u staged chunks overflow the slots",
                      d->n_staged);
    }
    while (d->n_inflight) ed_retire_one(d);
    for (int en = 0; en < MEMSYS_ENGINES; en++)
        for (int c = 0; c < MEMSYS_CLASSES; c++) cr_assert_eq(d->ms.head[en][c], MEMSYS_NONE);
    cr_assert_eq(d->n_staged, 0);
    /* the run exercised what it claims to */
    cr_assert_gt(loads, 1000);
    cr_assert_gt(d->ssd_chunks, 1000);
    cr_assert_gt(d->ms.n.promoted, promoted0);
    cr_assert_gt(d->ms.n.cancelled, 0);
    cr_assert_gt(d->staged_peak, bounce / chunk, "tails never filled the bounce buffer");
    cr_assert_gt(d->parts_landed, 0);
    memsys_free(&d->ms);
    free(d);
}

/* ---- the commands ---- */

static char out[1 << 16], errbuf[4096];

static int lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

Test(replay, bad_arguments_exit_2_with_one_line) {
    static const char *const cases[][8] = {
        {"replay", "--trace", "t.h5", "--hw", "h100-sxm", "--policy", "lru", NULL},
        {"replay", "--synthetic-weights", "--trace", "t.h5", "--hw", "h", "--policy", "nope"},
        {"calibrate", "-o", "x.ini", "--table", "t.txt", NULL},
        {"calibrate", "-o", "x.txt", "--table", "t.txt", "--base", "h100-sxm", "--model"},
        {"validate", "--trace", "t.h5", "--hw", "h", NULL},
        {"validate", "--policy", "lru", "--experiment", "e.ini", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *const *a = cases[i];
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, a[0], a[1], a[2], a[3],
                                 a[4], a[5], a[6], a[7], NULL);
        cr_assert_eq(rc, 2, "case %zu: rc %d: %s", i, rc, errbuf);
        cr_assert_eq(lines(errbuf), 1, "case %zu: %s", i, errbuf);
    }
    /* sim's --model is a geometry file, replay's a checkpoint directory: the line says so */
    const char *geometry = test_tmp_path("geometry.ini");
    test_write_file(geometry, "[model]\nname = x\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "replay", "--model", geometry,
                             "--trace", "t.h5", "--hw", "h100-sxm", "--policy", "lru", NULL);
    cr_assert_eq(rc, 2, "%s", errbuf);
    cr_assert(lines(errbuf) == 1 && strstr(errbuf, "--model-geometry"), "%s", errbuf);
}

Test(replay, without_a_gpu_every_gpu_command_exits_2_with_one_line) {
    moesim_error err = {0};
    if (replay_device_check(&err) == MOESIM_OK) cr_skip_test("a CUDA device is present");
    const char *want = replay_built_with_cuda() ? "no CUDA GPU or driver" : "built without CUDA";
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    model_geometry m;
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", &m, &err), MOESIM_OK, "%s", err.msg);
    trace *t = fixture_trace(&m, 1, 4, 4, 1.0, 1);
    char tp[4096];
    snprintf(tp, sizeof tp, "%s", test_tmp_path("replay-nogpu.h5"));
    cr_assert_eq(trace_write(t, tp, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
    char tab[4096], ini[4096];
    snprintf(tab, sizeof tab, "%s", test_tmp_path("nogpu-table.txt"));
    snprintf(ini, sizeof ini, "%s", test_tmp_path("nogpu.ini"));
    int rc =
        test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "replay", "--synthetic-weights",
                        "--trace", tp, "--hw", "h100-sxm", "--policy", "lru", NULL);
    cr_assert_eq(rc, 2, "%s", errbuf);
    cr_assert(strstr(errbuf, want) && lines(errbuf) == 1, "%s", errbuf);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "calibrate", "-o", ini, "--table",
                         tab, "--base", "h100-sxm", "--model", "olmoe-1b-7b", NULL);
    cr_assert_eq(rc, 2, "%s", errbuf);
    cr_assert(strstr(errbuf, want) && lines(errbuf) == 1, "%s", errbuf);
    cr_assert(!test_file_exists(ini) && !test_file_exists(tab), "nothing half-written");
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--trace", tp, "--hw",
                         "h100-sxm", "--policy", "lru", NULL);
    cr_assert_eq(rc, 2, "%s", errbuf);
    cr_assert(strstr(errbuf, want) && lines(errbuf) == 1, "%s", errbuf);
}

Test(replay, merge_summarizes_several_json_outputs_without_a_gpu) {
    char a[4096], b[4096], rep[4096], c[4096], rep2[4096];
    snprintf(a, sizeof a, "%s", test_tmp_path("merge-a.json"));
    snprintf(b, sizeof b, "%s", test_tmp_path("merge-b.json"));
    snprintf(rep, sizeof rep, "%s", test_tmp_path("merge-report.md"));
    snprintf(c, sizeof c, "%s", test_tmp_path("merge-c.json"));
    snprintf(rep2, sizeof rep2, "%s", test_tmp_path("merge-report2.md"));
    test_write_file(a, "{\"device\": \"NVIDIA H100 80GB HBM3\", \"profile\": \"h100-measured\", "
                       "\"trace\": \"t.h5\", \"model\": \"qwen3-30b-a3b\", \"rows\": ["
                       "{\"policy\": \"lru\", \"configuration\": \"budget 12 GiB\", "
                       "\"sim_tpot_ms\": 10, \"real_tpot_ms\": 10.4, \"tpot_err\": -0.04, "
                       "\"sim_ttft_ms\": 5, \"real_ttft_ms\": 5.5, \"ttft_err\": -0.09, "
                       "\"total_err\": -0.02},"
                       "{\"policy\": \"oracle\", \"configuration\": \"budget 12 GiB\", "
                       "\"sim_tpot_ms\": 6, \"real_tpot_ms\": 6.1, \"tpot_err\": -0.02, "
                       "\"sim_ttft_ms\": 4, \"real_ttft_ms\": 4.2, \"ttft_err\": -0.05, "
                       "\"total_err\": -0.01},"
                       "{\"policy\": \"static\", \"configuration\": \"budget 12 GiB\", "
                       "\"refused\": \"experts do not fit\"}]}");
    test_write_file(b, "{\"device\": \"NVIDIA H100 80GB HBM3\", \"profile\": \"h100-measured\", "
                       "\"trace\": \"t.h5\", \"model\": \"qwen3-30b-a3b\", \"rows\": ["
                       "{\"policy\": \"lru\", \"configuration\": \"budget 16 GiB\", "
                       "\"sim_tpot_ms\": 8, \"real_tpot_ms\": 8, \"tpot_err\": 0, "
                       "\"sim_ttft_ms\": 4, \"real_ttft_ms\": 4, \"ttft_err\": 0, "
                       "\"total_err\": 0}]}");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--merge", a,
                             "--merge", b, "--json", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "%s", je.text);
    json_t *s = json_object_get(j, "summary");
    cr_assert_float_eq(json_real_value(json_object_get(s, "tpot_abs_err_median")), 0.02, 1e-12);
    cr_assert_float_eq(json_real_value(json_object_get(s, "ttft_abs_err_median")), 0.05, 1e-12);
    cr_assert_eq(json_integer_value(json_object_get(s, "pairs")), 1);
    cr_assert(json_is_true(json_object_get(s, "meets_targets")));
    cr_assert_eq(json_array_size(json_object_get(j, "rows")), 4);
    json_decref(j);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--merge", a,
                         "--merge", b, "--report", rep, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    cr_assert(test_file_exists(rep));
    /* a device mismatch, or a file that is not validate's JSON: one line, exit 2, no report */
    test_write_file(c, "{\"device\": \"NVIDIA H200\", \"rows\": []}");
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--merge", a,
                         "--merge", c, "--report", rep2, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "H200") && lines(errbuf) == 1, "%s", errbuf);
    cr_assert(!test_file_exists(rep2));
    test_write_file(c, "[1, 2]");
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--merge", c, NULL);
    cr_assert_eq(rc, 2);
    cr_assert_eq(lines(errbuf), 1, "%s", errbuf);
    /* rows a run cannot have made, another trace, a file twice, no rows: refused, not nan */
    static const struct {
        const char *json, *says;
    } bad[] = {
        {"{\"device\": \"NVIDIA H100 80GB HBM3\", \"profile\": \"h100-measured\", \"trace\": "
         "\"t.h5\", \"model\": \"qwen3-30b-a3b\", \"rows\": [{\"policy\": \"lru\", "
         "\"sim_tpot_ms\": \"fast\", \"real_tpot_ms\": 8, \"tpot_err\": 0}]}",
         "rows[0]: expected sim_tpot_ms and real_tpot_ms > 0"},
        {"{\"device\": \"NVIDIA H100 80GB HBM3\", \"profile\": \"h100-measured\", \"trace\": "
         "\"t.h5\", \"model\": \"qwen3-30b-a3b\", \"rows\": [{\"policy\": \"lru\", "
         "\"sim_tpot_ms\": 10, \"real_tpot_ms\": 8, \"tpot_err\": -0.04}]}",
         "rows[0]: tpot_err -0.04, its TPOTs give 0.25"},
        {"{\"device\": \"NVIDIA H100 80GB HBM3\", \"profile\": \"h100-measured\", \"trace\": "
         "\"other.h5\", \"model\": \"qwen3-30b-a3b\", \"rows\": [{\"policy\": \"lru\", "
         "\"sim_tpot_ms\": 8, \"real_tpot_ms\": 8, \"tpot_err\": 0}]}",
         "trace 'other.h5', the first file's is 't.h5'"},
        {"{\"device\": \"NVIDIA H100 80GB HBM3\", \"profile\": \"h100-measured\", \"trace\": "
         "\"t.h5\", \"model\": \"qwen3-30b-a3b\", \"rows\": []}",
         "\"rows\" is empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        test_write_file(c, bad[i].json);
        rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--merge", a,
                             "--merge", c, NULL);
        cr_assert_eq(rc, 2, "case %zu: %s", i, errbuf);
        cr_assert(strstr(errbuf, bad[i].says) && lines(errbuf) == 1, "case %zu: %s", i, errbuf);
    }
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--merge", a,
                         "--merge", a, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "merge-a.json: given twice"), "%s", errbuf);
}

Test(replay, merge_keeps_the_rounds_and_ranks_only_what_they_order) {
    char a[4096], rep[4096];
    snprintf(a, sizeof a, "%s", test_tmp_path("merge-rounds.json"));
    snprintf(rep, sizeof rep, "%s", test_tmp_path("merge-rounds.md"));
    /* the medians order lfu ahead of firm-moe, the simulator the other way; the rounds split 5-4 */
    test_write_file(a,
                    "{\"device\": \"CPU\", \"profile\": \"cpu-measured\", \"trace\": \"t.h5\", "
                    "\"model\": \"cpu-moe-small\", \"rows\": ["
                    "{\"policy\": \"lfu\", \"configuration\": \"budget 1.6 GiB\", "
                    "\"sim_tpot_ms\": 11.69, \"real_tpot_ms\": 11.69, \"tpot_err\": 0, "
                    "\"sim_ttft_ms\": 5, \"real_ttft_ms\": 5, \"ttft_err\": 0, \"total_err\": 0, "
                    "\"real_tpot_rounds_ms\": [11.78, 11.03, 12.19, 11.96, 10.93, 12.52, 11.92, "
                    "11.69, 11.50]},"
                    "{\"policy\": \"firm-moe\", \"configuration\": \"budget 1.6 GiB\", "
                    "\"sim_tpot_ms\": 11.52, \"real_tpot_ms\": 11.77, \"tpot_err\": -0.02, "
                    "\"sim_ttft_ms\": 5, \"real_ttft_ms\": 5, \"ttft_err\": 0, \"total_err\": 0, "
                    "\"real_tpot_rounds_ms\": [11.33, 11.14, 11.77, 12.12, 11.96, 13.62, 12.00, "
                    "11.31, 10.70]}]}");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--merge", a,
                             "--json", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "%s", je.text);
    json_t *s = json_object_get(j, "summary");
    cr_assert_eq(json_integer_value(json_object_get(s, "pairs")), 1);
    cr_assert_eq(json_integer_value(json_object_get(s, "concordant")), 0);
    cr_assert_eq(json_integer_value(json_object_get(s, "replay_ordered")), 0);
    cr_assert(json_is_true(json_object_get(s, "meets_targets")));
    json_t *row = json_array_get(json_object_get(j, "rows"), 1);
    cr_assert_eq(json_array_size(json_object_get(row, "real_tpot_rounds_ms")), 9);
    json_decref(j);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--merge", a,
                         "--report", rep, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    char *text = test_read_file(rep, NULL);
    cr_assert(strstr(text, "lfu faster in 5 of 9 rounds: not ordered by the replay"), "%s", text);
    free(text);
}

Test(replay, experiment_file_errors_name_the_file_and_the_field) {
    char ini[4096];
    snprintf(ini, sizeof ini, "%s", test_tmp_path("exp.ini"));
    static const char inputs[] = "[fixed]\ntrace = t.h5\nhw = h100-sxm\nmodel = olmoe-1b-7b\n";
    char text[1024];
    snprintf(text, sizeof text, "%s[axes]\npolicy = lru, nosuch\nmemory.budget_gb = 12\n", inputs);
    test_write_file(ini, text);
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--experiment",
                             ini, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "nosuch") && strstr(errbuf, "exp.ini:6") && lines(errbuf) == 1, "%s",
              errbuf);
    snprintf(text, sizeof text, "%s[axes]\npolicy = lru\nmemory.budget_gb = 12, big\n", inputs);
    test_write_file(ini, text);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--experiment", ini,
                         NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "exp.ini:7") && strstr(errbuf, "memory.budget_gb") &&
                  strstr(errbuf, "'big'") && lines(errbuf) == 1,
              "%s", errbuf);
    /* validate loads one trace: an axis over traces is refused */
    test_write_file(ini, "[fixed]\nhw = h100-sxm\nmodel = olmoe-1b-7b\npolicy = lru\n"
                         "[axes]\ntrace = a.h5, b.h5\n");
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--experiment", ini,
                         NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "trace: expected one value") && lines(errbuf) == 1, "%s", errbuf);
    /* [validate] keys are checked where the file is read */
    snprintf(text, sizeof text, "%s[axes]\npolicy = lru\n[validate]\nrepeats = 0\n", inputs);
    test_write_file(ini, text);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--experiment", ini,
                         NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "exp.ini:8: [validate] repeats") && lines(errbuf) == 1, "%s", errbuf);
    /* --budgets selects budgets the experiment has */
    snprintf(text, sizeof text, "%s[axes]\npolicy = lru\nmemory.budget_gb = 12, 16\n", inputs);
    test_write_file(ini, text);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--experiment", ini,
                         "--budgets", "16, 20", NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "--budgets") && strstr(errbuf, "= 20") && lines(errbuf) == 1, "%s",
              errbuf);
    /* the committed validation sets parse: they fail only on their missing trace (not made here) */
    static const char *const sets[] = {"experiments/validation/gpu/validate.ini",
                                       "experiments/validation/cpu/validate-cpu.ini",
                                       "tests/fixtures/cpu-validate/small.ini"};
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        char exp[4096];
        snprintf(exp, sizeof exp, "%s/%s", MOESIM_SOURCE_DIR, sets[i]);
        rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--experiment",
                             exp, "--trace", "/nonexistent/validate.h5", NULL);
        cr_assert_eq(rc, 2, "%s", sets[i]);
        cr_assert(strstr(errbuf, "/nonexistent/validate.h5") && lines(errbuf) == 1, "%s: %s",
                  sets[i], errbuf);
    }
}

Test(replay, winners_csv_errors_name_the_file_and_what_was_expected) {
    char csv[4096];
    snprintf(csv, sizeof csv, "%s", test_tmp_path("winners.csv"));
    test_write_file(csv, "hash,memory.budget_gb,tpot_ms.mean\nab,12,5.0\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--winners", csv,
                             "--trace", "t.h5", "--hw", "h100-sxm", NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "'policy'") && lines(errbuf) == 1, "%s", errbuf);
    test_write_file(csv, "policy,memory.budget_gb,tpot_ms.mean\nlru,12,fast\n");
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--winners", csv,
                         "--trace", "t.h5", "--hw", "h100-sxm", NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, ":2:") && lines(errbuf) == 1, "%s", errbuf);
    /* a sweep's CSV: failed rows and rows of another trace are not candidates */
    test_write_file(csv, "config_hash,seed,status,policy,trace,hw,memory.budget_gb,label.cache,"
                         "tpot_ms.mean\n"
                         "a1,1,ok,lru,other.h5,h100-sxm,12,8,4.5\n"
                         "a2,1,policy 'static': does not fit,static,t.h5,h100-sxm,12,8,nan\n");
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--winners", csv,
                         "--trace", "t.h5", "--hw", "h100-sxm", NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "no result rows with status ok") && strstr(errbuf, "2 others") &&
                  lines(errbuf) == 1,
              "%s", errbuf);
    test_write_file(csv, "policy,memory.budget_gb,tpot_ms.mean\nnosuch,12,5\n");
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--winners", csv,
                         "--trace", "t.h5", "--hw", "h100-sxm", NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "nosuch") && lines(errbuf) == 1, "%s", errbuf);
}

Test(replay, the_order_check_counts_only_pairs_the_replays_rounds_order) {
    /* dymoe vs lru at 1.33 GiB in a CPU validation: 37 % apart in the simulator; the replay's
     * rounds split 4 to 2, so the check has no measured order to hold them to */
    static const double lru[] = {44.9, 41.8, 46.6, 40.3, 44.3, 53.3};
    static const double dymoe_split[] = {43.5, 39.8, 60.6, 43.4, 48.5, 56.5};
    static const double dymoe_faster[] = {40.1, 39.8, 42.0, 38.0, 41.1, 50.2};
    validate_row rows[] = {
        {.policy = "lru", .group = "1.33", .sim_tpot_ms = 37.2, .real_tpot_ms = 44.6},
        {.policy = "dymoe", .group = "1.33", .sim_tpot_ms = 51.1, .real_tpot_ms = 46.0},
    };
    set_rounds(&rows[0], 6, lru);
    set_rounds(&rows[1], 6, dymoe_split);
    uint64_t pairs, alike;
    cr_assert(validate_order_beyond(rows, 2, 0.3, &pairs, &alike));
    cr_assert_eq(pairs, 0);
    /* every round has dymoe faster: a measured order, against the simulator's */
    set_rounds(&rows[1], 6, dymoe_faster);
    cr_assert(!validate_order_beyond(rows, 2, 0.3, &pairs, &alike));
    cr_assert_eq(pairs, 1);
    cr_assert_eq(alike, 0);
    /* with fewer rounds than the sign test needs, the medians decide, as before */
    set_rounds(&rows[0], 3, lru);
    set_rounds(&rows[1], 3, dymoe_split);
    rows[0].real_tpot_ms = 44.9; /* the medians of those three rounds */
    rows[1].real_tpot_ms = 43.5;
    cr_assert(!validate_order_beyond(rows, 2, 0.3, &pairs, &alike));
    cr_assert_eq(pairs, 1);
}
