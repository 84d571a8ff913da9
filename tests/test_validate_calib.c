/* Calibrations through a validation's rounds (sweep/validate_calib.h, validate --calibrate-rounds):
 * a round's slices combine to the median per point times their pooled stalls and the link's mean
 * read time, written as a profile and cost table the simulator loads; a validation whose machine
 * drifted more than its error calls no result (summary, --check, the report), and the drift
 * survives --merge. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/hw.h"
#include "common/model.h"
#include "replay/replay.h"
#include "replay/report_files.h"
#include "sim/cost.h"
#include "support/test_support.h"
#include "sweep/validate_calib.h"

/* A CPU calibration of a small geometry: a link, DRAM, and two op curves, `scale` times slower
 * than scale 1. */
static void calibration(calib_results *c, double scale) {
    memset(c, 0, sizeof *c);
    snprintf(c->gpu, sizeof c->gpu, "CPU (2 cores online)");
    snprintf(c->backend, sizeof c->backend, "cpu");
    c->n_sizes = 2;
    c->size_bytes[0] = 65536;
    c->size_bytes[1] = 4194304;
    c->h2d_gb_per_s[0] = c->d2h_gb_per_s[0] = 1.0 / scale;
    c->h2d_gb_per_s[1] = c->d2h_gb_per_s[1] = 3.0 / scale;
    c->h2d_peak_gb_per_s = c->d2h_peak_gb_per_s = 3.0 / scale;
    c->h2d_latency_us = c->d2h_latency_us = 80 * scale;
    c->hbm_gb_per_s = 8 / scale;
    c->bf16_tflops = 0.02 / scale;
    c->repeats = 5;
    c->stall_overhead = 1;
    for (int i = 0; i < 3; i++) {
        double tok = 1u << i;
        c->curve[COST_EXPERT_GATE_UP][PREC_BF16].x[i] = tok;
        c->curve[COST_EXPERT_GATE_UP][PREC_BF16].t_ns[i] = scale * (600e3 + 50e3 * tok);
        c->curve[COST_LM_HEAD][PREC_BF16].x[i] = tok;
        c->curve[COST_LM_HEAD][PREC_BF16].t_ns[i] = scale * 900e3 * tok;
    }
    c->curve[COST_EXPERT_GATE_UP][PREC_BF16].n = 3;
    c->curve[COST_LM_HEAD][PREC_BF16].n = 3;
    c->contention_measured = true;
    c->link_slowdown_beside_compute = 0.04 * scale;
    c->op_slowdown_beside_copy = 0.1 * scale;
}

Test(validate_calib, slices_combine_to_the_median_point_times_their_pooled_stalls) {
    static calib_results sl[3], m; /* large: the cost curves */
    calibration(&sl[0], 1);
    calibration(&sl[1], 1.2);
    calibration(&sl[2], 3); /* a slice in a slow spell */
    validate_calib_combine(sl, 3, 1, &m);
    /* per point the median (scale 1.2) times all calls' time over the medians' */
    double all = 0, typical = 0;
    for (int op = 0; op < COST_OP_COUNT; op++)
        for (int p = 0; p < PREC_COUNT; p++)
            for (uint32_t i = 0; i < sl[0].curve[op][p].n; i++) {
                all += sl[0].curve[op][p].t_ns[i] + sl[1].curve[op][p].t_ns[i] +
                       sl[2].curve[op][p].t_ns[i];
                typical += 3 * sl[1].curve[op][p].t_ns[i];
            }
    cr_assert_float_eq(m.stall_overhead, all / typical, 1e-12);
    cr_assert_float_eq(m.stall_overhead, (1 + 1.2 + 3) / 3.6, 1e-12);
    cr_assert_float_eq(m.curve[COST_LM_HEAD][PREC_BF16].t_ns[1], 1.2 * 1800e3 * m.stall_overhead,
                       1e-3);
    cr_assert_eq(m.curve[COST_LM_HEAD][PREC_BF16].x[1], 2); /* the points stay */
    /* the link: each size's mean read time (64 KiB read in 65.536 us at scale 1) */
    double ns = (65536 / 1.0 + 65536 / (1.0 / 1.2) + 65536 / (1.0 / 3)) / 3;
    cr_assert_float_eq(m.h2d_gb_per_s[0], 65536 / ns, 1e-9);
    cr_assert(m.h2d_peak_gb_per_s > 0 && m.h2d_peak_gb_per_s < 3.0);
    /* what the link and the compute cost each other: the slices' medians */
    cr_assert_float_eq(m.link_slowdown_beside_compute, 0.04 * 1.2, 1e-12);
    cr_assert_float_eq(m.op_slowdown_beside_copy, 0.1 * 1.2, 1e-12);
    static calib_results every_other[4], alone[2], m2;
    calibration(&every_other[0], 1);
    calibration(&every_other[1], 5);
    calibration(&every_other[2], 3);
    calibration(&every_other[3], 7);
    alone[0] = every_other[0];
    alone[1] = every_other[2];
    validate_calib_combine(every_other, 2, 2, &m); /* slices 0 and 2 */
    validate_calib_combine(alone, 2, 1, &m2);
    cr_assert_eq(memcmp(&m, &m2, sizeof m), 0);
    cr_assert_float_eq(m.curve[COST_LM_HEAD][PREC_BF16].t_ns[0], 2 * 900e3 * m.stall_overhead,
                       1e-3);
    validate_calib_combine(sl, 1, 1, &m); /* one slice is itself */
    cr_assert_float_eq(m.curve[COST_EXPERT_GATE_UP][PREC_BF16].t_ns[2], 800e3, 1e-6);
    cr_assert_float_eq(m.stall_overhead, 1, 1e-12);
}

Test(validate_calib, a_round_profile_is_written_where_asked_and_loads_as_measured) {
    static calib_results sl[2], m;
    calibration(&sl[0], 1);
    calibration(&sl[1], 1); /* no stalls: the combined profile is the slices' */
    validate_calib_combine(sl, 2, 1, &m);
    moesim_error err = {0};
    hw_profile base, got;
    model_geometry model;
    cr_assert_eq(hw_load_by_name("cpu-host", &base, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", &model, &err), MOESIM_OK, "%s", err.msg);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("calib-rounds/new/folder"));
    cr_assert_eq(validate_calib_dir_prepare(dir, &err), MOESIM_OK, "%s", err.msg);
    validate_calibrator c = {.model = &model, .base = &base, .cpu = true, .dir = dir};
    char table[1100];
    cr_assert_eq(validate_calib_publish(&c, &m, "round-1", &got, table, sizeof table, &err),
                 MOESIM_OK, "%s", err.msg);
    cr_assert_str_eq(got.name, "round-1");
    /* the link refitted through the sizes' read times: the slope's rate */
    double slope_ns_per_byte = (4194304.0 / 3 - 65536) / (4194304.0 - 65536);
    cr_assert_float_eq(got.h2d_bytes_per_s, 1e9 / slope_ns_per_byte, 1e3);
    cr_assert(strstr(table, "calib-rounds/new/folder/round-1-cost.txt"), "%s", table);
    static quant_table quant;
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
    static cost_model cm;
    cost_model_init(&cm, &got, &model, &quant);
    cr_assert_eq(cost_table_load(&cm, table, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(cost_op_ns(&cm, COST_LM_HEAD, PREC_BF16, 1), 900000);
}

Test(validate_calib, a_folder_that_cannot_be_made_is_refused_before_any_run) {
    moesim_error err = {0};
    char file[4096];
    snprintf(file, sizeof file, "%s", test_tmp_path("calib-rounds-a-file"));
    test_write_file(file, "not a folder\n");
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/sub", file);
    cr_assert_neq(validate_calib_dir_prepare(dir, &err), MOESIM_OK);
    cr_assert(strstr(err.msg, "calib-rounds-a-file"), "%s", err.msg);
}

Test(validate_calib, drift_is_what_the_halves_move_beyond_the_even_and_odd_slices) {
    double drift, noise;
    /* halves 100 vs 110 ms, even and odd 104 vs 108: 10 ms apart, 4 of them the noise */
    validate_calib_drift((double[]){100, 110}, (double[]){104, 108}, 100, &drift, &noise);
    cr_assert_float_eq(noise, 0.04, 1e-12);
    cr_assert_float_eq(drift, 0.06, 1e-12);
    /* halves closer than even and odd: the noise alone, no drift */
    validate_calib_drift((double[]){110, 100}, (double[]){96, 112}, 200, &drift, &noise);
    cr_assert_float_eq(noise, 0.08, 1e-12);
    cr_assert_eq(drift, 0);
}

/* Two policies of one budget, 2 % off; the drift during their rounds is `drift`. */
static void rows_with_drift(validate_row rows[2], double drift) {
    memset(rows, 0, 2 * sizeof *rows);
    const char *names[] = {"lru", "oracle"};
    for (int i = 0; i < 2; i++) {
        snprintf(rows[i].policy, sizeof rows[i].policy, "%s", names[i]);
        snprintf(rows[i].group, sizeof rows[i].group, "budget 1 GiB");
        rows[i].sim_tpot_ms = 10.0 / (i + 1);
        rows[i].real_tpot_ms = rows[i].sim_tpot_ms / 1.02;
        rows[i].tpot_err = rows[i].ttft_err = rows[i].total_err = 0.02;
        rows[i].sim_tpot_drift = drift;
        rows[i].sim_tpot_slice_noise = 0.05 * (i + 1);
    }
}

Test(validate_calib, a_machine_that_drifted_more_than_the_error_calls_no_result) {
    validate_row rows[2];
    validate_summary s;
    rows_with_drift(rows, 0.01);
    validate_summarize(rows, 2, &s);
    cr_assert_float_eq(s.drift_tpot_median, 0.01, 1e-12);
    cr_assert_float_eq(s.slice_noise_tpot_median, 0.075, 1e-12); /* reported, not judged */
    cr_assert(!s.drift_exceeds_error);
    cr_assert(s.meets_targets);
    rows_with_drift(rows, 0.03);
    validate_summarize(rows, 2, &s);
    cr_assert(s.drift_exceeds_error);
    cr_assert(!s.meets_targets, "a 2 %% error under a 3 %% drift is not a result");
    rows_with_drift(rows, NAN); /* not calibrated between rounds: nothing to refuse */
    validate_summarize(rows, 2, &s);
    cr_assert(isnan(s.drift_tpot_median));
    cr_assert(!s.drift_exceeds_error && s.meets_targets);
}

Test(validate_calib, drift_and_calibrations_survive_merge_and_reach_the_report) {
    char a[4096], rep[4096], out[65536], errbuf[4096];
    snprintf(a, sizeof a, "%s", test_tmp_path("calib-merge-a.json"));
    snprintf(rep, sizeof rep, "%s", test_tmp_path("calib-merge-report.md"));
    test_write_file(
        a, "{\"device\": \"CPU (2 cores online)\", \"profile\": \"cpu-measured\", "
           "\"trace\": \"t.h5\", \"model\": \"cpu-moe-small\", \"rows\": ["
           "{\"policy\": \"lru\", \"configuration\": \"budget 1 GiB\", "
           "\"sim_tpot_ms\": 10, \"real_tpot_ms\": 9.8, \"tpot_err\": 0.02, "
           "\"sim_ttft_ms\": 5, \"real_ttft_ms\": 5, \"ttft_err\": 0, "
           "\"total_err\": 0.02, \"sim_tpot_drift\": 0.06, \"sim_tpot_slice_noise\": 0.03, "
           "\"layer_err_median\": 0.01, \"sim_outside_ms\": 90, \"real_outside_ms\": 100, "
           "\"outside_err\": -0.1},"
           "{\"policy\": \"oracle\", \"configuration\": \"budget 1 GiB\", "
           "\"sim_tpot_ms\": 6, \"real_tpot_ms\": 5.9, \"tpot_err\": 0.017, "
           "\"sim_ttft_ms\": 4, \"real_ttft_ms\": 4, \"ttft_err\": 0, "
           "\"total_err\": 0.01, \"sim_tpot_drift\": 0.04, \"sim_tpot_slice_noise\": 0.05, "
           "\"layer_err_median\": 0.03, \"sim_outside_ms\": 95, \"real_outside_ms\": 100, "
           "\"outside_err\": -0.05}],"
           "\"calibrations\": ["
           "{\"at_s\": 0, \"disk_gb_per_s\": 3.3, \"disk_latency_us\": 80, "
           "\"gate_up_us\": 650, \"attention_proj_us\": 450, \"lm_head_us\": 700, "
           "\"profile\": \"cal/calibration-0.ini\"},"
           "{\"at_s\": 300, \"disk_gb_per_s\": 2.2, \"disk_latency_us\": 95, "
           "\"gate_up_us\": 860, \"attention_proj_us\": 520, \"lm_head_us\": 900, "
           "\"reads_beside_ops\": 0.042, \"ops_beside_reads\": 0.107, "
           "\"profile\": \"cal/calibration-1.ini\"}]}");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--merge", a,
                             "--json", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "%s", je.text);
    json_t *s = json_object_get(j, "summary");
    cr_assert_float_eq(json_real_value(json_object_get(s, "drift_tpot_median")), 0.05, 1e-12);
    cr_assert_float_eq(json_real_value(json_object_get(s, "slice_noise_tpot_median")), 0.04, 1e-12);
    /* where the time goes: in the layers 2 %, outside them 7.5 % (the rows' figures survive) */
    cr_assert_float_eq(json_real_value(json_object_get(s, "layer_abs_err_median")), 0.02, 1e-12);
    cr_assert_float_eq(json_real_value(json_object_get(s, "outside_abs_err_median")), 0.075, 1e-12);
    json_t *row0 = json_array_get(json_object_get(j, "rows"), 0);
    cr_assert_float_eq(json_real_value(json_object_get(row0, "real_outside_ms")), 100, 1e-12);
    cr_assert(json_is_true(json_object_get(s, "drift_exceeds_error")));
    cr_assert(json_is_false(json_object_get(s, "meets_targets")));
    cr_assert_eq(json_array_size(json_object_get(j, "calibrations")), 2);
    json_decref(j);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--merge", a,
                         "--report", rep, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    char *md = test_read_file(rep, NULL);
    cr_assert(strstr(md, "## The machine through the rounds"), "%s", md);
    cr_assert(strstr(md, "| round 1 | 300 | 2.200 | -33.3 % |"), "%s", md);
    /* what the reads and the ops cost each other: n/a from a calibration without them */
    cr_assert(strstr(md, "| +4.2 % | +10.7 % | cal/calibration-1.ini |"), "%s", md);
    cr_assert(strstr(md, "| n/a | n/a | cal/calibration-0.ini |"), "%s", md);
    cr_assert(strstr(md, "no result is called"), "%s", md);
    cr_assert(strstr(md, "in the MoE layers (router to last expert) median |error| 2.00 %; "
                         "outside them"),
              "%s", md);
    cr_assert(strstr(md, "real_outside_ms) 7.50 %."), "%s", md);
    cr_assert(strstr(md, "the slices' own noise, median 4.00 %), relative to the TPOT compared: "
                         "median 5.00 % against a median |TPOT error| of 1.85 %"),
              "%s", md);
    free(md);
}

Test(validate_calib, calibrate_options_are_checked_before_anything_runs) {
    char out[4096], errbuf[4096];
    int rc =
        test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--trace", "t.h5",
                        "--hw", "cpu-host", "--policy", "lru", "--calibrate-repeats", "5", NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "--calibrate-repeats goes with --calibrate-rounds DIR"), "%s", errbuf);
    cr_assert_eq(strchr(errbuf, '\n'), strrchr(errbuf, '\n'), "one line: %s", errbuf);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "validate", "--trace", "t.h5",
                         "--hw", "cpu-host", "--policy", "lru", "--calibrate-rounds", "d",
                         "--calibrate-repeats", "0", NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "--calibrate-repeats: expected an integer in [1, 10000], got '0'"),
              "%s", errbuf);
}
