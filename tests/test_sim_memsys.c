/* The memory system's guarantees across policies and real model geometries (core/memsys.h):
 * a policy whose design never skips never skips at any budget its setup accepts (pools account
 * for copies in flight), and host placement follows the precisions the policy loads, so a setting
 * the policy does not read never changes its result; spans of chunks (memsys_next_span) stop where
 * a part lands and change no figure. Closed-form timings of promotion,
 * cancellation and the SSD pipeline are in tests/test_sim.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "core/memsys.h"
#include "sim/sim.h"
#include "sim/sim_internal.h"
#include "support/test_support.h"
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
    hw_profile hw; /* 80 GiB: room for every model's non-expert weights beside its pools */
    moesim_error err = {0};
    cr_assert_eq(hw_load_by_name("h100-sxm", &hw, &err), MOESIM_OK, "%s", err.msg);
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

/* The link's bytes by copy class add up to h2d_bytes; a policy without prefetch moves no
 * prefetch bytes, a prefetcher moves some, and DynaExq's migrations are its background bytes. */
Test(sim_memsys, link_bytes_by_class_add_up_and_show_who_used_the_link) {
    static const struct {
        const char *policy;
        bool prefetch, background;
    } cases[] = {{"lru", false, false}, {"mixtral-offload", true, false},
                 {"dymoe", true, false}, {"dynaexq", false, true}};
    hw_profile hw;
    moesim_error err = {0};
    cr_assert_eq(hw_load_by_name("a6000", &hw, &err), MOESIM_OK, "%s", err.msg);
    model_geometry m;
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", &m, &err), MOESIM_OK, "%s", err.msg);
    trace *t = small_trace(&m, 2, 3);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bool dx = !strcmp(cases[i].policy, "dynaexq");
        const char *sets[] = {"memory.budget_gb=6", dx ? "dynaexq.warmup=2" : "sim.seed=1",
                              dx ? "dynaexq.interval=2" : "sim.seed=1", NULL};
        sim_result r;
        cr_assert_eq(run(t, &m, &hw, cases[i].policy, sets, &r, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_eq(r.h2d_demand_bytes + r.h2d_prefetch_bytes + r.h2d_background_bytes,
                     r.h2d_bytes, "%s", cases[i].policy);
        cr_assert_eq(r.h2d_prefetch_bytes > 0, cases[i].prefetch, "%s: %llu prefetch bytes",
                     cases[i].policy, (unsigned long long)r.h2d_prefetch_bytes);
        cr_assert_eq(r.h2d_background_bytes > 0, cases[i].background, "%s: %llu background bytes",
                     cases[i].policy, (unsigned long long)r.h2d_background_bytes);
    }
    trace_destroy(t);
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

/* One layer of two bf16 experts whose parts end at 2.5, 5 and 6.5 MiB (1 MiB chunks), all in
 * DRAM (on_ssd: expert 1 on the SSD instead); no host callbacks. */
static void span_memsys(memsys *ms, bool expert1_on_ssd) {
    const uint64_t mib = 1u << 20;
    memsys_config cfg = {.n_layers = 1,
                         .n_experts = 2,
                         .pool_cap_bytes = 64 * mib,
                         .chunk_bytes = mib,
                         .bounce_bytes = 8 * mib};
    const uint64_t parts[PART_COUNT] = {5 * mib / 2, 5 * mib / 2, 3 * mib / 2};
    memcpy(cfg.part_bytes[PREC_BF16], parts, sizeof parts);
    memsys_host host = {0};
    memsys_init(ms, &cfg, &host);
    const moesim_precision order[] = {PREC_BF16};
    memsys_place(ms, order, 1, expert1_on_ssd ? 13 * mib / 2 : 64 * mib);
}

/* Serves expert 0's load of class `cls` in spans to the end, checking each span's bytes and the
 * parts resident after it (want_resident[i]: mask of landed parts). */
static void check_spans(policy_class cls, uint32_t n, const uint64_t *want_offset,
                        const uint64_t *want_bytes, const uint32_t *want_resident) {
    memsys ms;
    span_memsys(&ms, false);
    cr_assert_eq(memsys_ops.load(&ms, 0, 0, PREC_BF16, POLICY_PARTS_ALL, cls), POLICY_ISSUED);
    for (uint32_t i = 0; i < n; i++) {
        memsys_chunk c;
        cr_assert(memsys_next_span(&ms, MEMSYS_H2D, &c), "span %u", i);
        cr_expect_eq(c.offset, want_offset[i], "span %u at %llu", i, (unsigned long long)c.offset);
        cr_expect_eq(c.bytes, want_bytes[i], "span %u of %llu bytes", i,
                     (unsigned long long)c.bytes);
        cr_expect_eq(c.first, i == 0);
        memsys_xfer done;
        cr_expect_eq(memsys_chunk_done(&ms, &c, &done), i == n - 1, "the last span completes it");
        for (int part = 0; part < PART_COUNT; part++)
            cr_expect_eq(memsys_ops.state(&ms, 0, 0, PREC_BF16, (expert_part)part),
                         want_resident[i] & (1u << part) ? POLICY_RESIDENT : POLICY_LOADING,
                         "span %u, part %d", i, part);
    }
    memsys_chunk c;
    cr_expect_not(memsys_next_span(&ms, MEMSYS_H2D, &c));
    memsys_free(&ms);
}

Test(sim_memsys,
     a_span_ends_where_the_next_part_lands_and_only_a_demand_copy_takes_its_last_chunk) {
    const uint64_t mib = 1u << 20;
    /* [0, 3): gate lands in chunk 3; [3, 5): up ends at 5; [5, 6.5): down, to the end */
    const uint64_t demand_offset[] = {0, 3 * mib, 5 * mib};
    const uint64_t demand_bytes[] = {3 * mib, 2 * mib, 3 * mib / 2};
    const uint32_t demand_resident[] = {1, 3, 7};
    check_spans(POLICY_DEMAND, 3, demand_offset, demand_bytes, demand_resident);
    /* a prefetch could still be promoted while its last chunk waits: [5, 6), then [6, 6.5) */
    const uint64_t prefetch_offset[] = {0, 3 * mib, 5 * mib, 6 * mib};
    const uint64_t prefetch_bytes[] = {3 * mib, 2 * mib, mib, mib / 2};
    const uint32_t prefetch_resident[] = {1, 3, 3, 7};
    check_spans(POLICY_PREFETCH, 4, prefetch_offset, prefetch_bytes, prefetch_resident);
}

/* The stream's wait reads the three part states in one load: every triple of states, every mask,
 * whatever byte follows the triple (the next lep's first part), against the comparison per part. */
Test(sim_memsys, the_parts_waited_for_are_those_of_the_mask_not_resident_whatever_follows) {
    const uint8_t states[] = {POLICY_ABSENT, POLICY_LOADING, POLICY_RESIDENT};
    const uint8_t after[] = {POLICY_ABSENT, POLICY_RESIDENT, 0x7f, 0xff};
    for (int g = 0; g < 3; g++)
        for (int u = 0; u < 3; u++)
            for (int d = 0; d < 3; d++)
                for (size_t a = 0; a < sizeof after; a++)
                    for (uint32_t mask = 0; mask <= POLICY_PARTS_ALL; mask++) {
                        uint8_t st[PART_COUNT + 1] = {states[g], states[u], states[d], after[a]};
                        uint32_t want = 0;
                        for (int part = 0; part < PART_COUNT; part++)
                            if (st[part] != POLICY_RESIDENT) want |= 1u << part;
                        cr_expect_eq(sim_parts_waiting(st, mask), want & mask,
                                     "states %u %u %u (then %u), mask %u", st[0], st[1], st[2],
                                     st[3], mask);
                    }
}

Test(sim_memsys, a_span_past_landings_names_each_part_landing_inside_it_for_the_host) {
    const uint64_t mib = 1u << 20;
    memsys ms;
    span_memsys(&ms, false);
    cr_assert_eq(memsys_ops.load(&ms, 0, 0, PREC_BF16, POLICY_PARTS_ALL, POLICY_DEMAND),
                 POLICY_ISSUED);
    memsys_chunk c;
    cr_assert(memsys_next_span_past_landings(&ms, MEMSYS_H2D, &c));
    cr_expect(c.offset == 0 && c.bytes == 13 * mib / 2 && c.first, "the whole demand copy");
    /* gate lands with chunk 3, up with chunk 5, down with the span's own end */
    const uint64_t want_bytes[] = {3 * mib, 5 * mib};
    for (int part = PART_GATE; part <= PART_UP; part++) {
        uint64_t bytes = 0;
        cr_assert_eq(memsys_chunk_next_landing(&ms, &c, &bytes), part);
        cr_expect_eq(bytes, want_bytes[part], "part %d after %llu bytes", part,
                     (unsigned long long)bytes);
        cr_expect_eq(memsys_ops.state(&ms, 0, 0, PREC_BF16, (expert_part)part), POLICY_LOADING);
        memsys_part_land(&ms, c.xfer, part);
        cr_expect_eq(memsys_ops.state(&ms, 0, 0, PREC_BF16, (expert_part)part), POLICY_RESIDENT);
    }
    uint64_t bytes = 0;
    cr_expect_eq(memsys_chunk_next_landing(&ms, &c, &bytes), -1);
    memsys_xfer done;
    cr_expect(memsys_chunk_done(&ms, &c, &done));
    cr_expect_eq(memsys_ops.state(&ms, 0, 0, PREC_BF16, PART_DOWN), POLICY_RESIDENT);
    /* a prefetch's span still stops before its last chunk (it could be promoted) */
    cr_assert_eq(memsys_ops.load(&ms, 0, 1, PREC_BF16, POLICY_PARTS_ALL, POLICY_PREFETCH),
                 POLICY_ISSUED);
    cr_assert(memsys_next_span_past_landings(&ms, MEMSYS_H2D, &c));
    cr_expect_eq(c.bytes, 6 * mib, "got %llu bytes", (unsigned long long)c.bytes);
    memsys_free(&ms);
}

Test(sim_memsys, a_cut_demand_span_goes_back_to_its_queue_by_issue_order) {
    /* demand copies of experts 0 then 1: expert 0's last span takes its last chunk (off the
     * queue); cut back to its first chunk, it is queued again ahead of expert 1 */
    const uint64_t mib = 1u << 20;
    memsys ms;
    span_memsys(&ms, false);
    cr_assert_eq(memsys_ops.load(&ms, 0, 0, PREC_BF16, POLICY_PARTS_ALL, POLICY_DEMAND),
                 POLICY_ISSUED);
    memsys_chunk c;
    memsys_xfer done;
    for (int i = 0; i < 2; i++) {
        cr_assert(memsys_next_span(&ms, MEMSYS_H2D, &c));
        memsys_chunk_done(&ms, &c, &done);
    }
    cr_assert(memsys_next_span(&ms, MEMSYS_H2D, &c));
    cr_assert(c.offset == 5 * mib && c.bytes == 3 * mib / 2);
    cr_assert_eq(memsys_ops.load(&ms, 0, 1, PREC_BF16, POLICY_PARTS_ALL, POLICY_DEMAND),
                 POLICY_ISSUED);
    memsys_span_trim(&ms, &c, mib);
    cr_expect_not(memsys_chunk_done(&ms, &c, &done));
    memsys_chunk r;
    cr_assert(memsys_next_span(&ms, MEMSYS_H2D, &r));
    cr_expect(r.xfer == c.xfer && r.offset == 6 * mib && r.bytes == mib / 2,
              "expert 0's last chunk before expert 1: got transfer %u at %llu", r.xfer,
              (unsigned long long)r.offset);
    cr_expect(memsys_chunk_done(&ms, &r, &done));
    cr_assert(memsys_next_span(&ms, MEMSYS_H2D, &r));
    cr_expect(r.xfer != c.xfer && r.first);
    memsys_free(&ms);
}

Test(sim_memsys, a_cut_span_gives_its_unstarted_chunks_back_in_order) {
    const uint64_t mib = 1u << 20;
    memsys ms;
    span_memsys(&ms, false);
    cr_assert_eq(memsys_ops.load(&ms, 0, 0, PREC_BF16, POLICY_PARTS_ALL, POLICY_PREFETCH),
                 POLICY_ISSUED);
    memsys_chunk c;
    cr_assert(memsys_next_span(&ms, MEMSYS_H2D, &c));
    cr_assert_eq(c.bytes, 3 * mib);
    memsys_span_trim(&ms, &c, mib);
    cr_expect_eq(c.bytes, mib);
    /* a demand load arrives: after the chunk in flight, it goes first, then the rest of the cut
     * span, from where the chunk in flight ended */
    cr_assert_eq(memsys_ops.load(&ms, 0, 1, PREC_BF16, POLICY_PARTS_ALL, POLICY_DEMAND),
                 POLICY_ISSUED);
    memsys_xfer done;
    cr_expect_not(memsys_chunk_done(&ms, &c, &done));
    cr_expect_eq(memsys_ops.state(&ms, 0, 0, PREC_BF16, PART_GATE), POLICY_LOADING);
    memsys_chunk d;
    cr_assert(memsys_next_span(&ms, MEMSYS_H2D, &d));
    cr_expect_neq(d.xfer, c.xfer, "the demand load overtakes the rest of the prefetch");
    cr_expect(d.first && d.offset == 0 && d.bytes == 3 * mib);
    memsys_chunk_done(&ms, &d, &done);
    memsys_chunk r;
    cr_assert(memsys_next_span(&ms, MEMSYS_H2D, &r));
    cr_expect_eq(r.xfer, d.xfer, "the demand load goes on");
    memsys_chunk_done(&ms, &r, &done);
    while (memsys_next_span(&ms, MEMSYS_H2D, &r) && r.xfer == d.xfer)
        memsys_chunk_done(&ms, &r, &done);
    cr_expect_eq(r.xfer, c.xfer);
    cr_expect(!r.first && r.offset == mib && r.bytes == 2 * mib,
              "the cut span's chunks come back: [1, 3) MiB, got [%llu, +%llu)",
              (unsigned long long)r.offset, (unsigned long long)r.bytes);
    memsys_free(&ms);
}

Test(sim_memsys, copies_staged_through_the_ssd_are_never_spans) {
    /* expert 1 lives on the SSD: its PCIe copies free bounce room chunk by chunk */
    const uint64_t mib = 1u << 20;
    memsys ms;
    span_memsys(&ms, true);
    cr_assert_eq(memsys_ops.load(&ms, 0, 1, PREC_BF16, POLICY_PARTS_ALL, POLICY_DEMAND),
                 POLICY_ISSUED);
    memsys_chunk c;
    memsys_xfer done;
    for (int i = 0; i < 7; i++) {
        cr_assert(memsys_next_chunk(&ms, MEMSYS_SSD, &c));
        memsys_chunk_done(&ms, &c, &done);
    }
    cr_assert(memsys_next_span(&ms, MEMSYS_H2D, &c));
    cr_expect_eq(c.bytes, mib, "one chunk, not a span: %llu bytes", (unsigned long long)c.bytes);
    memsys_free(&ms);
}

Test(sim_memsys, every_policy_gives_the_same_figures_in_spans_as_chunk_by_chunk) {
    /* a timeline makes the copy engine serve chunk by chunk (it draws each chunk's stall), so
     * the same run with and without one compares spans against single chunks: every figure but
     * the simulator's own memory must agree, for prefetching policies (whose loads cut spans)
     * and small chunks (many spans per expert) */
    model_geometry m;
    hw_profile hw;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("qwen1.5-moe-a2.7b", &m, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(hw_load_by_name("rtx3090-pcie4", &hw, &err), MOESIM_OK, "%s", err.msg);
    trace *t = small_trace(&m, 2, 11);
    const char *timeline = test_tmp_path("spans-timeline.json");
    size_t n_pol = 0;
    const policy_methods *const *pols = policy_all(&n_pol);
    const char *const settings[][3] = {{"batch.size=2", "sim.chunk_kib=64", NULL},
                                       {"cache.experts_per_layer=12", "batch.size=3", NULL}};
    for (size_t pi = 0; pi < n_pol; pi++)
        for (size_t si = 0; si < 2; si++) {
            sim_result a, b;
            config *c = config_create();
            for (const char *const *set = settings[si]; *set; set++)
                cr_assert_eq(config_set(c, *set, &err), MOESIM_OK, "%s", err.msg);
            sim_inputs in = {.trace = t, .model = &m, .hw = &hw, .quant = &quant};
            moesim_status st = sim_run(&in, pols[pi]->name, c, &a, &err);
            config_destroy(c);
            if (st != MOESIM_OK) continue; /* a setup the policy refuses (tested elsewhere) */
            c = config_create();
            for (const char *const *set = settings[si]; *set; set++)
                cr_assert_eq(config_set(c, *set, &err), MOESIM_OK, "%s", err.msg);
            in.timeline_path = timeline;
            cr_assert_eq(sim_run(&in, pols[pi]->name, c, &b, &err), MOESIM_OK, "%s", err.msg);
            config_destroy(c);
            const char *na[160], *nb[160];
            double va[160], vb[160];
            size_t n = sim_result_fields(&a, na, va, 160);
            cr_assert_eq(sim_result_fields(&b, nb, vb, 160), n);
            for (size_t i = 0; i < n; i++)
                cr_expect_eq(va[i], vb[i], "%s, %s: %s is %.17g in spans, %.17g by chunks",
                             pols[pi]->name, settings[si][0], na[i], va[i], vb[i]);
        }
    remove(timeline);
    trace_destroy(t);
}
