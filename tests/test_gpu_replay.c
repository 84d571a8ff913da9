/* The GPU replay (replay/replay.h) on a real device, on a fixture trace of OLMoE-1B-7B geometry
 * (16 MoE layers of 64 experts, 12 MiB per bf16 expert) with synthetic weights:
 *   - the run's device memory (cudaMemGetInfo before and while it holds everything) never
 *     exceeds the emulated card;
 *   - no expert op starts before the copy of its weights ended (CUDA events);
 *   - back-to-back copies reach >= 90 % of the rate calibrate measured for 1 MiB chunks issued
 *     as the replay issues them (the link's rate with the latency each chunk pays);
 *   - lru gives the simulator's hit count on the same trace (its decisions do not depend on
 *     time, so both hosts must see the same accesses and hits), the simulator placing experts in
 *     fixed-size blocks per precision as the replay does (sim.block_pools: without it the golden
 *     int4 case below gives 91 hits in the simulator and 68 in the replay, on the GPU and on the
 *     CPU backend alike);
 *   - a prefetching policy on core/memsys.h's SSD path (chunks split across parts, tails, bounce
 *     slots, promotions across the two copy streams) runs no expert before its copy ended and
 *     never skips.
 * And with a checkpoint's weights (`--model`, replay/weights.h): the golden qwen2_moe routed by
 * a trace the engine recorded from it replays in order, within the card, with the simulator's
 * hits, from DRAM and from the SSD store, at bf16 and int4.
 * Skipped (exit 77) without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hw.h"
#include "common/model.h"
#include "engine/engine.h"
#include "replay/replay.h"
#include "sim/sim.h"
#include "sim_fixtures.h"
#include "support/gpu_test.h"

/* copy throughput back to back >= 90 % of the calibrated rate of back-to-back 1 MiB chunks (the
 * replay's default chunk; a chunk pays the transfer latency again on some links, and the profile
 * says so): the replay's copies must run as fast as the link lets them for its timings to
 * validate the simulator's */
#define COPY_SHARE_MIN 0.90

static model_geometry model;
static hw_profile hw;
static quant_table quant;
static trace *tr;

static void setup(void) {
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", &model, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(hw_load_by_name("h100-sxm", &hw, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
    tr = fixture_trace(&model, 4, 16, 24, 1.0, 7);
    cr_assert(tr);
}

static void teardown(void) { trace_destroy(tr); }

TestSuite(gpu_replay, .init = setup, .fini = teardown);

/* Replays the fixture trace on profile `h` with `sets` (NULL-terminated). */
static moesim_status replay_on(const hw_profile *h, const char *policy_name,
                               const char *const *sets, sim_result *r, replay_checks *ck,
                               moesim_error *err) {
    config *c = config_create();
    for (const char *const *s = sets; *s; s++)
        cr_assert_eq(config_set(c, *s, err), MOESIM_OK, "%s", err->msg);
    replay_inputs in = {.trace = tr, .model = &model, .hw = h, .quant = &quant, .weight_seed = 1};
    moesim_status st = replay_run(&in, policy_name, c, r, ck, err);
    config_destroy(c);
    return st;
}

static moesim_status replay_with(const char *policy_name, const char *const *sets, sim_result *r,
                                 replay_checks *ck, moesim_error *err) {
    return replay_on(&hw, policy_name, sets, r, ck, err);
}

Test(gpu_replay, never_exceeds_the_emulated_card) {
    static const char *const budgets[] = {"memory.budget_gb=12", "memory.budget_gb=16",
                                          "memory.budget_gb=24"};
    for (size_t i = 0; i < 3; i++) {
        const char *sets[] = {budgets[i], "sim.host_precisions=bf16", NULL};
        sim_result r;
        replay_checks ck;
        moesim_error err = {0};
        cr_assert_eq(replay_with("lru", sets, &r, &ck, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_leq(ck.device_alloc_bytes, r.budget_bytes);
        cr_assert_leq(ck.device_used_peak - ck.device_used_before, r.budget_bytes,
                      "%s: %.3f GiB used of %.3f", budgets[i],
                      (ck.device_used_peak - ck.device_used_before) / 1073741824.0,
                      r.budget_bytes / 1073741824.0);
        cr_assert_gt(r.tokens, 0);
    }
}

Test(gpu_replay, no_expert_starts_before_its_copy_ended) {
    const char *pols[] = {"ondemand", "lru", "firm-moe"};
    for (size_t i = 0; i < 3; i++) {
        const char *sets[] = {"memory.budget_gb=4", "sim.host_precisions=bf16,int4", NULL};
        sim_result r;
        replay_checks ck;
        moesim_error err = {0};
        cr_assert_eq(replay_with(pols[i], sets, &r, &ck, &err), MOESIM_OK, "%s: %s", pols[i],
                     err.msg);
        cr_assert_gt(ck.order_checked, 0, "%s: no expert waited for a copy", pols[i]);
        cr_assert_eq(ck.order_violations, 0, "%s: %lu of %lu expert ops started early", pols[i],
                     (unsigned long)ck.order_violations, (unsigned long)ck.order_checked);
    }
}

Test(gpu_replay, back_to_back_copies_reach_the_calibrated_bandwidth) {
    calib_options opt = {.model = &model, .repeats = 5, .quick = true};
    static calib_results cal;
    moesim_error err = {0};
    cr_assert_eq(calib_run(&opt, &cal, &err), MOESIM_OK, "%s", err.msg);
    /* ondemand in a small budget: every activation is a demand copy, queued back to back */
    const char *sets[] = {"memory.budget_gb=4", "sim.host_precisions=bf16", NULL};
    sim_result r;
    replay_checks ck;
    cr_assert_eq(replay_with("ondemand", sets, &r, &ck, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_gt(r.h2d_bytes, 1ull << 30);
    cr_assert(cal.h2d_chunk_measured);
    double chunked_gb_per_s = 1048576.0 / (cal.h2d_chunk_us * 1e3);
    cr_assert_geq(ck.h2d_gb_per_s, COPY_SHARE_MIN * chunked_gb_per_s,
                  "replay copies at %.2f GB/s, calibrated 1 MiB chunks back to back %.2f GB/s "
                  "(%.2f GB/s for 64 MiB transfers)",
                  ck.h2d_gb_per_s, chunked_gb_per_s, cal.h2d_peak_gb_per_s);
}

Test(gpu_replay, experts_beyond_dram_come_from_the_ssd_store_as_in_the_simulator) {
    /* 2 GiB of DRAM for 12.6 GiB of bf16 experts: most loads read the SSD store first */
    hw_profile small = hw;
    small.dram_bytes = 2ull << 30;
    small.gpu_direct_storage = false;
    const char *sets[] = {"memory.budget_gb=12", "cache.experts_per_layer=16",
                          "sim.host_precisions=bf16", "sim.block_pools=true", NULL};
    sim_result real, sim;
    replay_checks ck;
    moesim_error err = {0};
    cr_assert_eq(replay_on(&small, "lru", sets, &real, &ck, &err), MOESIM_OK, "%s", err.msg);
    config *c = config_create();
    for (const char *const *s = sets; *s; s++) config_set(c, *s, &err);
    sim_inputs sin = {.trace = tr, .model = &model, .hw = &small, .quant = &quant};
    cr_assert_eq(sim_run(&sin, "lru", c, &sim, &err), MOESIM_OK, "%s", err.msg);
    config_destroy(c);
    cr_assert_gt(sim.ssd_bytes, 0);
    cr_assert_eq(real.ssd_bytes, sim.ssd_bytes);
    cr_assert_eq(real.hits, sim.hits);
    cr_assert_gt(real.ssd_busy_ms, 0);
    cr_assert_eq(ck.order_violations, 0);
}

Test(gpu_replay, lru_hits_equal_the_simulators_on_the_same_trace) {
    static const char *const caches[] = {"cache.experts_per_layer=8", "cache.experts_per_layer=16",
                                         "cache.experts_per_layer=32"};
    for (size_t i = 0; i < 3; i++) {
        const char *sets[] = {"memory.budget_gb=12", caches[i], "sim.host_precisions=bf16",
                              "sim.block_pools=true", NULL};
        sim_result real, sim;
        moesim_error err = {0};
        cr_assert_eq(replay_with("lru", sets, &real, NULL, &err), MOESIM_OK, "%s", err.msg);
        config *c = config_create();
        for (const char *const *s = sets; *s; s++) config_set(c, *s, &err);
        sim_inputs in = {.trace = tr, .model = &model, .hw = &hw, .quant = &quant};
        cr_assert_eq(sim_run(&in, "lru", c, &sim, &err), MOESIM_OK, "%s", err.msg);
        config_destroy(c);
        cr_assert_eq(real.accesses, sim.accesses, "%s", caches[i]);
        cr_assert_eq(real.hits, sim.hits, "%s: replay %lu hits, sim %lu", caches[i],
                     (unsigned long)real.hits, (unsigned long)sim.hits);
        cr_assert_eq(real.steps, sim.steps);
    }
}

Test(gpu_replay, prefetches_and_ssd_chunks_land_before_their_experts_run) {
    /* 1 GiB of DRAM for 3.4 GiB of int4 experts: most loads read the SSD store through the
     * bounce slots; 256 KiB chunks split parts (int4 parts are not a multiple of them) */
    hw_profile small = hw;
    small.dram_bytes = 1ull << 30;
    small.gpu_direct_storage = false;
    const char *sets[] = {"memory.budget_gb=4", "expert.precision=int4", "sim.host_precisions=int4",
                          "sim.chunk_kib=256", NULL};
    sim_result r;
    replay_checks ck;
    moesim_error err = {0};
    cr_assert_eq(replay_on(&small, "firm-moe", sets, &r, &ck, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_gt(r.prefetches, 0);
    cr_assert_gt(r.ssd_bytes, 0);
    cr_assert_gt(ck.order_checked, 0);
    cr_assert_eq(ck.order_violations, 0, "%lu of %lu expert ops started early",
                 (unsigned long)ck.order_violations, (unsigned long)ck.order_checked);
    cr_assert_eq(r.skipped_accesses, 0, "firm-moe never skips; %lu skipped",
                 (unsigned long)r.skipped_accesses);
    cr_assert_eq(r.placement_refusals, 0); /* one precision: its blocks hold the pool */
}

/* A trace the engine records from the checkpoint in `dir` (two requests, 4 decode steps). */
static trace *engine_trace(const char *dir, const char *name) {
    static const int32_t prompt_a[] = {1, 17, 42, 99, 3, 250, 7}, prompt_b[] = {9, 8, 7, 6, 5};
    moesim_error err = {0};
    engine *e;
    engine_options opt = {.n_threads = 1};
    cr_assert_eq(engine_load(dir, &opt, &e, &err), MOESIM_OK, "%s", err.msg);
    engine_request reqs[] = {{prompt_a, 7}, {prompt_b, 5}};
    engine_gen_options o = {.gen_len = 4, .batch = 2};
    engine_gen_log log;
    cr_assert_eq(engine_generate(e, reqs, 2, &o, &log, &err), MOESIM_OK, "%s", err.msg);
    model_geometry g;
    engine_geometry(e, name, &g);
    trace *t;
    cr_assert_eq(engine_log_to_trace(e, &g, &log, NULL, &t, &err), MOESIM_OK, "%s", err.msg);
    engine_gen_log_free(&log);
    engine_destroy(e);
    return t;
}

Test(gpu_replay, a_golden_checkpoint_replays_in_order_within_the_card_with_the_simulators_hits) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/golden/qwen2_moe", MOESIM_SOURCE_DIR);
    trace *t = engine_trace(dir, "tiny-qwen2");
    moesim_error err = {0};
    replay_weights *w;
    cr_assert_eq(replay_weights_open(dir, &w, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(replay_weights_check_trace(w, &t->meta, "recorded", &err), MOESIM_OK, "%s",
                 err.msg);
    model_geometry m;
    replay_weights_geometry(w, t->meta.model, &m);
    /* 4 of 8 experts per layer on the card: lru loads on most routes (24 experts of 24 KiB at
     * bf16); a DRAM of 256 KiB keeps the first 10 and puts the rest in the SSD store */
    static const struct {
        const char *prec, *formats;
        uint64_t dram_bytes;
    } cases[] = {
        {"expert.precision=bf16", "sim.host_precisions=bf16", 0},
        {"expert.precision=int4", "sim.host_precisions=int4", 0},
        {"expert.precision=bf16", "sim.host_precisions=bf16", 256u << 10},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hw_profile h = hw;
        if (cases[i].dram_bytes) {
            h.dram_bytes = cases[i].dram_bytes;
            h.gpu_direct_storage = false;
        }
        const char *sets[] = {"memory.budget_gb=1", "cache.experts_per_layer=4", cases[i].prec,
                              cases[i].formats,     "sim.block_pools=true",      NULL};
        sim_result real, sim;
        replay_checks ck;
        config *c = config_create();
        for (const char *const *s = sets; *s; s++)
            cr_assert_eq(config_set(c, *s, &err), MOESIM_OK, "%s", err.msg);
        replay_inputs in = {.trace = t, .model = &m, .hw = &h, .quant = &quant, .weights = w};
        cr_assert_eq(replay_run(&in, "lru", c, &real, &ck, &err), MOESIM_OK, "case %zu: %s", i,
                     err.msg);
        config_destroy(c);
        c = config_create();
        for (const char *const *s = sets; *s; s++) config_set(c, *s, &err);
        sim_inputs sin = {.trace = t, .model = &m, .hw = &h, .quant = &quant};
        cr_assert_eq(sim_run(&sin, "lru", c, &sim, &err), MOESIM_OK, "case %zu: %s", i, err.msg);
        config_destroy(c);
        cr_assert_eq(real.tokens, t->n_tokens, "case %zu", i);
        cr_assert_gt(real.h2d_bytes, 0, "case %zu: nothing was loaded", i);
        cr_assert_gt(ck.order_checked, 0, "case %zu", i);
        cr_assert_eq(ck.order_violations, 0, "case %zu: %lu of %lu expert ops started early", i,
                     (unsigned long)ck.order_violations, (unsigned long)ck.order_checked);
        cr_assert_leq(ck.device_alloc_bytes, real.budget_bytes, "case %zu", i);
        cr_assert_leq(ck.device_used_peak - ck.device_used_before, real.budget_bytes, "case %zu",
                      i);
        cr_assert_eq(real.hits, sim.hits, "case %zu: replay %lu hits, sim %lu", i,
                     (unsigned long)real.hits, (unsigned long)sim.hits);
        cr_assert_eq(real.ssd_bytes, sim.ssd_bytes, "case %zu", i);
        if (cases[i].dram_bytes) cr_assert_gt(real.ssd_bytes, 0, "case %zu: no SSD read", i);
    }
    /* the store holds the checkpoint's experts, in DRAM and in the SSD file alike */
    const moesim_precision precs[] = {PREC_BF16, PREC_INT4};
    for (size_t i = 0; i < 2; i++) {
        replay_store *store;
        cr_assert_eq(replay_store_create_checkpoint(&m, &quant, precision_name(precs[i]), precs[i],
                                                    256u << 10, NULL, w, &store, &err),
                     MOESIM_OK, "%s", err.msg);
        uint64_t blob = 0;
        for (int part = 0; part < PART_COUNT; part++)
            blob += replay_part_bytes(&m, precs[i], (expert_part)part);
        uint8_t *want = malloc(blob), *got = malloc(blob);
        for (uint32_t l = 0; l < m.n_moe_layers; l++)
            for (uint32_t e = 0; e < m.n_experts; e++) {
                replay_weights_expert(w, l, e, precs[i], want);
                memset(got, 0xA5, blob);
                cr_assert_eq(replay_store_expert(store, l, e, precs[i], got, &err), MOESIM_OK, "%s",
                             err.msg);
                cr_assert(!memcmp(got, want, blob), "%s: layer %u expert %u differs",
                          precision_name(precs[i]), l, e);
            }
        free(want);
        free(got);
        replay_store_destroy(store);
    }
    replay_weights_close(w);
    trace_destroy(t);
}
