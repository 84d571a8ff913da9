/* The memory system's guarantees across policies and real model geometries (sim/memsys.h):
 * a policy whose design never skips never skips at any budget its setup accepts (pools account
 * for copies in flight), and host placement follows the precisions the policy loads, so a setting
 * the policy does not read never changes its result. Closed-form timings of promotion,
 * cancellation and the SSD pipeline are in tests/test_sim.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "sim/sim.h"
#include "traces/synth.h"

static quant_table quant;

static void setup(void) {
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
}

TestSuite(sim_memsys, .init = setup);

static trace *small_trace(const model_geometry *m, uint32_t lookahead, uint64_t seed) {
    synth_options o;
    synth_options_default(&o, m);
    o.n_requests = 3;
    o.prompt_len = (synth_range){8, 8};
    o.gen_len = (synth_range){16, 16};
    o.lookahead_depth = lookahead;
    o.seed = seed;
    trace *t = NULL;
    moesim_error err = {0};
    cr_assert_eq(synth_generate(m, &o, &t, &err), MOESIM_OK, "%s", err.msg);
    return t;
}

static moesim_status run(const trace *t, const model_geometry *m, const hw_profile *hw,
                         const char *policy_name, const char *const *sets, sim_result *r,
                         moesim_error *err) {
    config *c = config_create();
    for (const char *const *s = sets; *s; s++)
        cr_assert_eq(config_set(c, *s, err), MOESIM_OK, "%s", err->msg);
    sim_inputs in = {.trace = t, .model = m, .hw = hw, .quant = &quant};
    moesim_status st = sim_run(&in, policy_name, c, r, err);
    config_destroy(c);
    return st;
}

Test(sim_memsys, no_policy_designed_never_to_skip_skips_at_any_budget_it_accepts) {
    static const char *const models[] = {"mixtral-8x7b",      "olmoe-1b-7b",   "qwen1.5-moe-a2.7b",
                                         "qwen3-30b-a3b",     "phi-3.5-moe",   "deepseek-v2-lite",
                                         "qwen3-next-80b-a3b"};
    static const struct {
        const char *policy, *knob;
    } policies[] = {{"ondemand", NULL},          {"lru", NULL},     {"lfu", NULL},
                    {"mixtral-offload", NULL},   {"oracle", NULL},  {"dymoe", "dymoe.lo=int2"},
                    {"dynaexq", NULL},           {"firm-moe", NULL}};
    hw_profile hw;
    moesim_error err = {0};
    cr_assert_eq(hw_load_by_name("rtx3090-pcie3", &hw, &err), MOESIM_OK, "%s", err.msg);
    uint32_t ran = 0;
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        model_geometry m;
        cr_assert_eq(model_load_by_name(models[mi], &m, &err), MOESIM_OK, "%s", err.msg);
        trace *t = small_trace(&m, 2, 5 + mi);
        /* budgets from the smallest pools a token fits (top_k experts per layer) up */
        char sets_txt[4][64];
        snprintf(sets_txt[0], sizeof sets_txt[0], "cache.experts_per_layer=%u", m.top_k);
        snprintf(sets_txt[1], sizeof sets_txt[1], "cache.experts_per_layer=%u", m.top_k + 1);
        snprintf(sets_txt[2], sizeof sets_txt[2], "cache.experts_per_layer=%u", 2 * m.top_k);
        snprintf(sets_txt[3], sizeof sets_txt[3], "cache.experts_per_layer=0");
        for (size_t b = 0; b < 4; b++)
            for (size_t pi = 0; pi < sizeof policies / sizeof *policies; pi++) {
                const char *sets[] = {sets_txt[b], "expert.precision=int4", "memory.budget_gb=80",
                                      policies[pi].knob ? policies[pi].knob : "sim.seed=1", NULL};
                sim_result r;
                if (run(t, &m, &hw, policies[pi].policy, sets, &r, &err) != MOESIM_OK)
                    continue; /* a setup the policy refuses (one line, tested elsewhere) */
                ran++;
                cr_expect_eq(r.skipped_accesses, 0, "%s, %s, %s: %llu accesses skipped",
                             models[mi], policies[pi].policy, sets_txt[b],
                             (unsigned long long)r.skipped_accesses);
            }
        trace_destroy(t);
    }
    cr_assert_gt(ran, 100, "the grid must run (ran %u)", ran);
}

Test(sim_memsys, host_dram_holds_what_the_policy_runs_not_expert_precision) {
    /* Mixtral-8x7B on a 64 GiB host: bf16 experts (87 GB) do not fit DRAM, DyMoE's int4 and int2
     * copies do. DyMoE never runs expert.precision, so DRAM must hold its precisions and nothing
     * comes from the SSD, whatever expert.precision and sim.host_precisions say. */
    model_geometry m;
    hw_profile hw;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("mixtral-8x7b", &m, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(hw_load_by_name("rtx3090-pcie4", &hw, &err), MOESIM_OK, "%s", err.msg);
    trace *t = small_trace(&m, 1, 3);
    static const char *const variants[][2] = {{"expert.precision=bf16", "sim.host_precisions=policy"},
                                              {"expert.precision=int4", "sim.host_precisions=policy"},
                                              {"expert.precision=bf16", "sim.host_precisions=all"},
                                              {"expert.precision=bf16", "sim.host_precisions=int4,int2"}};
    sim_result first;
    for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
        const char *sets[] = {"memory.budget_gb=16", variants[v][0], variants[v][1], NULL};
        sim_result r;
        cr_assert_eq(run(t, &m, &hw, "dymoe", sets, &r, &err), MOESIM_OK, "%s", err.msg);
        cr_expect_eq(r.ssd_bytes, 0, "%s %s: %llu bytes from the SSD", variants[v][0],
                     variants[v][1], (unsigned long long)r.ssd_bytes);
        if (v == 0) {
            first = r;
            continue;
        }
        const char *na[160], *nb[160];
        double va[160], vb[160];
        size_t n = sim_result_fields(&first, na, va, 160);
        cr_assert_eq(sim_result_fields(&r, nb, vb, 160), n);
        for (size_t i = 0; i < n; i++)
            if (strcmp(na[i], "sim_memory_bytes"))
                cr_expect_eq(va[i], vb[i], "%s %s changes %s: %g vs %g", variants[v][0],
                             variants[v][1], na[i], va[i], vb[i]);
    }
    trace_destroy(t);
}

Test(sim_memsys, bits_per_weight_is_the_run_formats_weighted_by_gate_mass) {
    /* int4 is 4 + (16 + 16) / 64 = 4.5 effective bits (configs/quant.ini); a skip counts 0 */
    model_geometry m;
    hw_profile hw;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", &m, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(hw_load_by_name("rtx3090-pcie3", &hw, &err), MOESIM_OK, "%s", err.msg);
    trace *t = small_trace(&m, 1, 9);
    const char *lru_sets[] = {"expert.precision=int4", "memory.budget_gb=4", NULL};
    sim_result r;
    cr_assert_eq(run(t, &m, &hw, "lru", lru_sets, &r, &err), MOESIM_OK, "%s", err.msg);
    cr_expect_float_eq(r.bits_per_weight, 4.5, 1e-9, "lru at int4: %.9f", r.bits_per_weight);
    const char *dymoe_sets[] = {"dymoe.hi=int4", "dymoe.lo=skip", "memory.budget_gb=4", NULL};
    cr_assert_eq(run(t, &m, &hw, "dymoe", dymoe_sets, &r, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_gt(r.precision_mix_skip, 0.05, "DyMoE 4/0 skips sub-critical experts");
    cr_expect_float_eq(r.bits_per_weight, 4.5 * (1 - r.precision_mix_skip), 1e-6,
                       "4/0: %.6f bits, skip share %.6f", r.bits_per_weight, r.precision_mix_skip);
    trace_destroy(t);
}
