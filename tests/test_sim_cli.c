/* `moesim sim` end to end: a trace of a real model geometry written to HDF5, run through the
 * binary with --json and --timeline; usage errors exit 2 with one line and write nothing. */
#include <criterion/criterion.h>
#include <hdf5.h>
#include <jansson.h>
#include <string.h>
#include <zlib.h>

#include "common/model.h"
#include "sim_fixtures.h"
#include "support/test_support.h"
#include "traces/trace.h"

static char trace_path[4096];

static void setup(void) {
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", &m, &err), MOESIM_OK, "%s", err.msg);
    trace *t = fixture_trace(&m, 4, 6, 20, 1.0, 11);
    cr_assert(t);
    snprintf(trace_path, sizeof trace_path, "%s", test_tmp_path("sim-cli.h5"));
    cr_assert_eq(trace_write(t, trace_path, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
}

TestSuite(sim_cli, .init = setup);

static char out[1 << 20], errbuf[8192];

Test(sim_cli, json_has_the_documented_keys_and_the_timeline_opens_as_trace_events) {
    const char *tl = test_tmp_path("sim-cli-timeline.json");
    int rc =
        test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", trace_path,
                        "--hw", "rtx3090-pcie4", "--policy", "lru", "--set", "memory.budget_gb=4",
                        "--set", "batch.size=2", "--json", "--timeline", tl, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "not JSON: %s", je.text);
    cr_assert_eq(json_integer_value(json_object_get(j, "tokens")), 4 * 26);
    const char *lat[] = {"ttft_ms", "tpot_ms"};
    for (int i = 0; i < 2; i++)
        for (const char *const *k = (const char *const[]){"mean", "p50", "p99", NULL}; *k; k++)
            cr_assert(json_is_number(json_object_get(json_object_get(j, lat[i]), *k)), "%s.%s",
                      lat[i], *k);
    const char *keys[] = {"tokens_per_s", "hit_rate",       "h2d_bytes",   "ssd_bytes",
                          "stall_ms",     "peak_hbm_bytes", "budget_bytes"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        cr_assert(json_is_number(json_object_get(j, keys[i])), "%s", keys[i]);
    json_t *mix = json_object_get(j, "precision_mix");
    cr_assert(json_is_number(json_object_get(mix, "hi")) &&
              json_is_number(json_object_get(mix, "lo")) &&
              json_is_number(json_object_get(mix, "skip")));
    cr_assert(json_is_number(json_object_get(json_object_get(j, "prefetch"), "accuracy")));
    cr_assert(json_is_number(json_object_get(json_object_get(j, "prefetch"), "utilization")));
    /* the fixture trace has no look-ahead: the predictor is emulated and says so */
    cr_assert_str_eq(json_string_value(json_object_get(j, "predictor")), "emulated");
    cr_assert_leq(json_integer_value(json_object_get(j, "peak_hbm_bytes")),
                  json_integer_value(json_object_get(j, "budget_bytes")));
    json_decref(j);

    json_t *timeline = json_load_file(tl, 0, &je);
    cr_assert(timeline, "timeline is not JSON: %s", je.text);
    json_t *ev = json_object_get(timeline, "traceEvents");
    cr_assert(json_array_size(ev) > 10);
    bool tracks[5] = {false};
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X")) continue;
        json_int_t tid = json_integer_value(json_object_get(e, "tid"));
        cr_assert(tid >= 1 && tid <= 3);
        tracks[tid] = true;
    }
    cr_assert(tracks[1] && tracks[2], "compute and h2d tracks hold slices");
    json_decref(timeline);
}

Test(sim_cli, same_inputs_give_identical_json) {
    static char out2[1 << 20];
    const char *args[] = {"sim",           "--trace",  trace_path, "--hw",
                          "rtx3090-pcie4", "--policy", "ondemand", "--json"};
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, args[0], args[1], args[2],
                                 args[3], args[4], args[5], args[6], args[7], NULL),
                 0, "%s", errbuf);
    cr_assert_eq(test_run_moesim(out2, sizeof out2, errbuf, sizeof errbuf, args[0], args[1],
                                 args[2], args[3], args[4], args[5], args[6], args[7], NULL),
                 0, "%s", errbuf);
    cr_assert_str_eq(out, out2);
}

Test(sim_cli, config_file_sets_policy_knobs_and_listing_shows_policies) {
    const char *ini = test_tmp_path("sim-cli-preset.ini");
    test_write_file(ini, "[lru]\nscope = global\n[memory]\nbudget_gb = 3\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", trace_path,
                             "--hw", "rtx3090-pcie4", "--policy", "lru", "--config", ini, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    cr_assert(strstr(out, "hit rate") != NULL, "%s", out);
    cr_assert_eq(
        test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--list-policies", NULL), 0);
    cr_assert(strstr(out, "ondemand") && strstr(out, "lru.scope"), "%s", out);
    /* a listing reads no run option: one given is refused, not ignored */
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--list-policies",
                                 "--set", "bogus", NULL),
                 2);
    cr_assert(strstr(errbuf, "--list-policies takes only --policy-lib, got --set") != NULL, "%s",
              errbuf);
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--help", NULL), 0);
    const char *knobs[] = {"memory.budget_gb", "cache.experts_per_layer", "expert.precision",
                           "batch.size", "predictor.accuracy"};
    for (size_t i = 0; i < sizeof knobs / sizeof *knobs; i++)
        cr_assert(strstr(out, knobs[i]) != NULL, "--help lacks %s", knobs[i]);
}

Test(sim_cli, bad_input_exits_2_with_one_line_and_writes_no_timeline) {
    const char *tl = test_tmp_path("sim-cli-bad-timeline.json");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", trace_path,
                             "--hw", "rtx3090-pcie4", "--policy", "lru", "--set",
                             "memory.budget_gb=0.5", "--timeline", tl, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "memory.budget_gb") != NULL, "%s", errbuf);
    cr_assert_eq(strchr(errbuf, '\n'), errbuf + strlen(errbuf) - 1, "one line: %s", errbuf);
    cr_assert(!test_file_exists(tl));
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", trace_path,
                         "--hw", "rtx3090-pcie4", "--policy", "belady2", NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "known: ") != NULL, "%s", errbuf);
}

/* Counts beyond what the model or the device has are refused, not cut to fit: a budget over
 * the device's memory, a per-layer cache or a policy's per-layer count over the model's experts
 * (OLMoE: 64); a list of host precisions with an empty item, not read in part. */
Test(sim_cli, a_count_beyond_the_model_or_the_device_is_refused_not_cut_to_fit) {
    static const struct {
        const char *policy, *set, *says;
    } cases[] = {
        {"lru", "memory.budget_gb=25",
         "memory.budget_gb = 25 exceeds the 24 GiB of device memory of hw 'rtx3090-pcie4'"},
        {"lru", "cache.experts_per_layer=65", "expected at most n_experts (64)"},
        {"mixtral-offload", "mixtral-offload.prefetch_experts=65",
         "prefetch_experts: expected at most the model's 64 experts, got 65"},
        {"mixtral-offload", "mixtral-offload.experts_per_layer=65",
         "experts_per_layer=65: expected at most the model's 64 experts"},
        {"dymoe", "dymoe.prefetch_t_prefill=65",
         "prefetch_t_prefill: expected at most the model's 64 experts, got 65"},
        {"lru", "sim.host_precisions=bf16,,int4", "an empty item in 'bf16,,int4'"},
        {"lru", "sim.host_precisions=bf16, ,int4", "an empty item in 'bf16, ,int4'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace",
                                 trace_path, "--hw", "rtx3090-pcie4", "--policy", cases[i].policy,
                                 "--set", cases[i].set, NULL);
        cr_assert_eq(rc, 2, "case %zu: exit %d: %s", i, rc, errbuf);
        cr_assert(strstr(errbuf, cases[i].says), "case %zu: %s", i, errbuf);
        cr_assert_eq(strchr(errbuf, '\n'), errbuf + strlen(errbuf) - 1, "one line: %s", errbuf);
    }
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", trace_path,
                             "--hw", "rtx3090-pcie4", "--policy", "lru", "--set",
                             "memory.budget_gb=24", "--set", "cache.experts_per_layer=64", NULL);
    cr_assert_eq(rc, 0, "the device's whole memory, every expert of a layer: %s", errbuf);
}

Test(sim_cli, a_model_that_does_not_fit_the_trace_is_refused_naming_the_trace) {
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", trace_path,
                             "--model", "mixtral-8x7b", "--hw", "rtx3090-pcie4", "--policy", "lru",
                             NULL);
    cr_assert_eq(rc, 2, "%s", errbuf);
    char want[4200];
    snprintf(want, sizeof want,
             "%s: its routing (model 'olmoe-1b-7b': 16 MoE layers, 64 experts, "
             "top-8, 0 shared) does not match model 'mixtral-8x7b' (32 MoE layers, 8 experts, "
             "top-2, 0 shared)",
             trace_path);
    cr_assert(strstr(errbuf, want), "%s", errbuf);
}

/* Sets the value at `at` (an index per dimension, at most 4) of dataset `name` of the trace at
 * `path` to *value, of type `mtype`, through HDF5's filters. */
static void poke(const char *path, const char *name, const hsize_t *at, hid_t mtype,
                 const void *value) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT), fs = H5Dget_space(d);
    const hsize_t one[4] = {1, 1, 1, 1};
    hid_t ms = H5Screate_simple(1, one, NULL);
    cr_assert_geq(H5Sselect_hyperslab(fs, H5S_SELECT_SET, at, NULL, one, NULL), 0);
    cr_assert_geq(H5Dwrite(d, mtype, ms, fs, H5P_DEFAULT, value), 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
    H5Fclose(f);
}

/* ... an expert id of dataset `name` */
static void poke_id(const char *path, const char *name, const hsize_t *at, uint16_t id) {
    poke(path, name, at, H5T_NATIVE_UINT16, &id);
}

/* `moesim sim` of lru on the trace at `path`, quiet, with a timeline `tl` of its first steps;
 * with --json or not. */
static int run_lru(const char *path, const char *tl, bool json) {
    return test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", path, "--hw",
                           "rtx3090-pcie4", "--set", "memory.budget_gb=4", "--policy", "lru", "-q",
                           "--timeline", tl, "--timeline-window", "steps=0:4",
                           json ? "--json" : NULL, NULL);
}

/* A bad value in the trace's last block, which a run reads last (the stream checks a block's
 * rows as the run first reads it): still one line naming the file, the dataset and what was
 * expected, exit 2, and nothing of the run on stdout or on disk. */
Test(sim_cli, a_bad_value_in_the_last_block_exits_2_with_one_line_and_writes_nothing) {
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", &m, &err), MOESIM_OK, "%s", err.msg);
    trace *t = fixture_trace(&m, 8, 32, 700, 1.0, 13);
    const uint64_t last = t->n_tokens - 1;
    char path[4096], tl[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("sim-cli-late-bad.h5"));
    snprintf(tl, sizeof tl, "%s", test_tmp_path("sim-cli-late-bad-timeline.json"));
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
    trace_stream *ts = NULL;
    trace_stream_options on_read = {.check_rows_on_read = true}; /* as sim opens it */
    cr_assert_eq(trace_stream_open_with(path, &on_read, &ts, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_gt(last, trace_stream_block_tokens(ts), "one block only: the test needs more");
    trace_stream_close(ts);
    int rc = run_lru(path, tl, true);
    cr_assert_eq(rc, 0, "the good trace: %s", errbuf);
    cr_assert_eq(out[0], '{', "%s", out);
    cr_assert(test_file_exists(tl));
    remove(tl);
    poke_id(path, "/routing/expert_ids", (hsize_t[]){last, m.n_moe_layers - 1, 0},
            (uint16_t)m.n_experts);
    char want[4200];
    snprintf(want, sizeof want,
             "%s: /routing/expert_ids[%llu][%u][0]: expert id %u >= %u experts\n", path,
             (unsigned long long)last, m.n_moe_layers - 1, m.n_experts, m.n_experts);
    for (int json = 0; json < 2; json++) {
        rc = run_lru(path, tl, json);
        cr_assert_eq(rc, 2, "exit %d: %s", rc, errbuf);
        cr_assert_str_eq(out, "", "nothing on stdout");
        cr_assert(strstr(errbuf, want), "%s", errbuf);
        cr_assert_eq(strchr(errbuf, '\n'), errbuf + strlen(errbuf) - 1, "one line: %s", errbuf);
        cr_assert(!test_file_exists(tl));
    }
}

/* `moesim sim` of `policy` on the trace at `path` with --json. */
static int run_json(const char *path, const char *policy_name) {
    return test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", path, "--hw",
                           "rtx3090-pcie4", "--set", "memory.budget_gb=4", "--policy", policy_name,
                           "-q", "--json", NULL);
}

static double json_predictor_accuracy(void) {
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(j, "not JSON: %s", out);
    double a = json_number_value(json_object_get(j, "predictor_accuracy"));
    json_decref(j);
    return a;
}

/* A small OLMoE trace with look-ahead rows synthesized into the test file `name` (its path in
 * path[cap]), read back. */
static trace *synth_small(const char *name, char *path, size_t cap) {
    snprintf(path, cap, "%s", test_tmp_path(name));
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "synth", "--model",
                             "olmoe-1b-7b", "--requests", "2", "--prompt-len", "8", "--gen-len",
                             "8", "--seed", "3", "-q", "-o", path, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    trace *t = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_read(path, &t, &err), MOESIM_OK, "%s", err.msg);
    return t;
}

/* A policy that ignores look-ahead reports the recorded predictor's accuracy from the trace's
 * first_hits attribute and reads no look-ahead row; `trace validate` still checks every row,
 * and a policy that reads them refuses rows that contradict the attribute. */
Test(sim_cli, lru_reports_the_stored_predictor_accuracy_and_validate_still_checks_the_rows) {
    char path[4096], line[4400];
    trace *t = synth_small("sim-cli-hits.h5", path, sizeof path);
    int rc;
    trace_first_hits h = {0};
    trace_first_hits_add(&h, &t->meta, t->expert_ids, t->lookahead_ids, t->n_tokens);
    const double accuracy = (double)h.right / (double)h.total;
    /* the first right first candidate, to be made wrong */
    uint64_t i = 0;
    uint32_t l = 0;
    while (i < t->n_tokens &&
           t->lookahead_ids[trace_lookahead_index(t, i, l, 1)] != trace_experts(t, i, l + 1)[0]) {
        if (++l + 1 < t->meta.n_layers) continue;
        l = 0;
        i++;
    }
    cr_assert_lt(i, t->n_tokens, "no right prediction in the trace");
    const uint32_t E = t->meta.n_experts;
    const uint16_t right_id = trace_experts(t, i, l + 1)[0];
    trace_destroy(t);
    const hsize_t at[4] = {i, l, 0, 0};
    poke_id(path, "/lookahead/expert_ids", at, (uint16_t)E);
    cr_assert_eq(run_json(path, "lru"), 0, "%s", errbuf);
    cr_assert_float_eq(json_predictor_accuracy(), accuracy, 1e-15);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "validate", path, NULL);
    cr_assert_eq(rc, 2);
    snprintf(line, sizeof line,
             "%s: /lookahead/expert_ids[%llu][%u][0][0]: expert id %u >= %u experts\n", path,
             (unsigned long long)i, l, E, E);
    cr_assert(strstr(errbuf, line), "%s", errbuf);
    cr_assert_eq(strchr(errbuf, '\n'), errbuf + strlen(errbuf) - 1, "one line: %s", errbuf);
    /* a valid id, but a wrong prediction: the rows and the attribute disagree */
    poke_id(path, "/lookahead/expert_ids", at, (uint16_t)((right_id + 1) % E));
    snprintf(line, sizeof line,
             "%s: /lookahead/expert_ids attribute first_hits: %llu of %llu, the rows give %llu of "
             "%llu\n",
             path, (unsigned long long)h.right, (unsigned long long)h.total,
             (unsigned long long)h.right - 1, (unsigned long long)h.total);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "validate", path, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, line), "%s", errbuf);
    cr_assert_eq(run_json(path, "mixtral-offload"), 2, "%s", errbuf);
    cr_assert(strstr(errbuf, line), "%s", errbuf);
    cr_assert_str_eq(out, "", "nothing on stdout");
    cr_assert_eq(run_json(path, "lru"), 0, "%s", errbuf);
    cr_assert_float_eq(json_predictor_accuracy(), accuracy, 1e-15);
}

/* Sets (or, with `read`, reads) the u8 attribute `name` of dataset `ds` of the file at `path`. */
static uint8_t u8_attr(const char *path, const char *ds, const char *name, bool read,
                       uint8_t v) {
    hid_t f = H5Fopen(path, read ? H5F_ACC_RDONLY : H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    hid_t d = H5Dopen2(f, ds, H5P_DEFAULT), a = H5Aopen(d, name, H5P_DEFAULT);
    cr_assert_geq(a, 0, "%s: %s has no attribute %s", path, ds, name);
    cr_assert_geq(read ? H5Aread(a, H5T_NATIVE_UINT8, &v) : H5Awrite(a, H5T_NATIVE_UINT8, &v), 0);
    H5Aclose(a);
    H5Dclose(d);
    H5Fclose(f);
    return v;
}

/* ... a look-ahead score */
static void poke_score(const char *path, const hsize_t *at, float v) {
    poke(path, "/lookahead/scores", at, H5T_NATIVE_FLOAT, &v);
}

/* `out` as JSON less what names the inputs (the file's hash differs when only an attribute
 * does). */
static json_t *json_result(void) {
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(j, "not JSON: %s", out);
    json_object_del(j, "inputs");
    json_object_del(j, "moesim");
    return j;
}

/* The writer says whether every look-ahead row lists its candidates best first; firm-moe, whose
 * scores only rank them, then reads no score and runs as it does reading them; `trace validate`
 * and a policy that reads the scores refuse a file whose rows contradict the attribute. */
Test(sim_cli, firm_moe_reads_no_score_of_a_ranked_trace_and_readers_of_scores_check_the_claim) {
    char path[4096], line[4400];
    trace *t = synth_small("sim-cli-ranked.h5", path, sizeof path);
    int rc;
    cr_assert(trace_lookahead_ranked(t), "the synthesizer lists candidates best first");
    cr_assert_eq(u8_attr(path, "/lookahead/scores", TRACE_RANKED_ATTR, true, 0), 1);
    /* a row inside the model (layer 0, distance 1) whose second score is made to rise */
    const float first = t->lookahead_scores[trace_lookahead_index(t, 5, 0, 1)];
    trace_destroy(t);
    cr_assert_eq(run_json(path, "firm-moe"), 0, "%s", errbuf);
    json_t *skipped = json_result();
    u8_attr(path, "/lookahead/scores", TRACE_RANKED_ATTR, false, 0);
    cr_assert_eq(run_json(path, "firm-moe"), 0, "%s", errbuf);
    json_t *read = json_result();
    cr_assert(json_equal(skipped, read), "firm-moe differs when it reads the scores");
    json_decref(read);
    /* unclaimed, a rising row is a valid file; claimed, it is refused by whoever reads scores */
    const hsize_t at[4] = {5, 0, 0, 1};
    poke_score(path, at, first + 1);
    cr_assert_eq(run_json(path, "mixtral-offload"), 0, "%s", errbuf);
    u8_attr(path, "/lookahead/scores", TRACE_RANKED_ATTR, false, 1);
    snprintf(line, sizeof line,
             "%s: /lookahead/scores[5][0][0]: column 1 scores %g above column 0's %g, but "
             "attribute ranked says every row lists its candidates best first\n",
             path, (double)(first + 1), (double)first);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "validate", path, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, line), "%s", errbuf);
    cr_assert_eq(strchr(errbuf, '\n'), errbuf + strlen(errbuf) - 1, "one line: %s", errbuf);
    cr_assert_eq(run_json(path, "mixtral-offload"), 2, "%s", errbuf);
    cr_assert(strstr(errbuf, line), "%s", errbuf);
    cr_assert_str_eq(out, "", "nothing on stdout");
    /* firm-moe trusts the attribute: the rising score is never read */
    cr_assert_eq(run_json(path, "firm-moe"), 0, "%s", errbuf);
    json_t *trusted = json_result();
    cr_assert(json_equal(skipped, trusted));
    json_decref(trusted);
    json_decref(skipped);
}

/* The options sim, replay and validate share come from one parser (cli/sim_options.c): a bad
 * --set is the same line from all three, before any input is read or a GPU looked for. */
Test(sim_cli, a_bad_set_is_the_same_one_line_error_from_sim_replay_and_validate) {
    static const char *const cmds[][2] = {
        {"sim", NULL}, {"replay", "--synthetic-weights"}, {"validate", NULL}};
    static char first[8192];
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        const char *extra = cmds[i][1] ? cmds[i][1] : "--json";
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, cmds[i][0], extra,
                                 "--trace", trace_path, "--hw", "rtx3090-pcie4", "--policy", "lru",
                                 "--set", "memory_budget_gb=4", NULL);
        cr_assert_eq(rc, 2, "%s: exit %d: %s", cmds[i][0], rc, errbuf);
        cr_assert_str_eq(errbuf, "moesim: --set memory_budget_gb=4: expected section.key=value\n",
                         "%s", cmds[i][0]);
        if (i) cr_assert_str_eq(errbuf, first);
        snprintf(first, sizeof first, "%s", errbuf);
        cr_assert_eq(out[0], '\0', "%s: stdout: %s", cmds[i][0], out);
    }
}

Test(sim_cli, a_bad_timeline_window_is_refused_alike_by_sim_and_replay_and_writes_nothing) {
    const char *tl = test_tmp_path("sim-cli-window.json");
    static const char *const cmds[][2] = {{"sim", "--json"}, {"replay", "--synthetic-weights"}};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char want[512];
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, cmds[i][0], cmds[i][1],
                                 "--trace", trace_path, "--hw", "rtx3090-pcie4", "--policy", "lru",
                                 "--timeline", tl, "--timeline-window", "steps=9:3", NULL);
        cr_assert_eq(rc, 2, "%s: %s", cmds[i][0], errbuf);
        snprintf(want, sizeof want,
                 "moesim %s: --timeline-window steps=9:3: expected steps=A:B (whole steps) or "
                 "ms=A:B (milliseconds) with A < B, either bound optional (see 'moesim %s "
                 "--help')\n",
                 cmds[i][0], cmds[i][0]);
        cr_assert_str_eq(errbuf, want);
        rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, cmds[i][0], cmds[i][1],
                             "--trace", trace_path, "--hw", "rtx3090-pcie4", "--policy", "lru",
                             "--timeline-window", "ms=1:2", NULL);
        cr_assert_eq(rc, 2);
        snprintf(want, sizeof want,
                 "moesim %s: --timeline-window needs --timeline (see 'moesim %s --help')\n",
                 cmds[i][0], cmds[i][0]);
        cr_assert_str_eq(errbuf, want);
        cr_assert(!test_file_exists(tl));
        /* a window the run never reaches: the run fails rather than write an empty timeline
         * (the simulator here; the replay needs a GPU to get that far) */
        if (i) continue;
        rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, cmds[i][0], cmds[i][1],
                             "--trace", trace_path, "--hw", "rtx3090-pcie4", "--policy", "lru",
                             "--timeline", tl, "--timeline-window", "steps=100000:", NULL);
        cr_assert_eq(rc, 2, "%s: %s", cmds[i][0], errbuf);
        cr_assert(strstr(errbuf, "the run ended before step 100000, where the window opens"),
                  "%s: %s", cmds[i][0], errbuf);
        cr_assert(!test_file_exists(tl));
    }
}

/* Counts the "X" event lines of `text`; when `whole` is given, checks that each event is in
 * `whole`, in the same order (a window keeps events as they were written). */
static size_t slice_lines(const char *text, const char *whole) {
    static char line[4096];
    size_t n = 0;
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, "\n") + (p[strcspn(p, "\n")] == '\n');
        cr_assert(len < sizeof line);
        memcpy(line, p, len);
        p += len;
        while (len && (line[len - 1] == '\n' || line[len - 1] == ',')) len--; /* "},\n" or "}\n" */
        line[len] = '\0';
        if (!strstr(line, "\"ph\":\"X\"")) continue;
        n++;
        if (whole) {
            const char *at = strstr(whole, line);
            cr_assert(at, "not in the whole timeline (in order): %s", line);
            whole = at + len;
        }
    }
    return n;
}

Test(sim_cli, timeline_formats_and_windows_hold_the_same_run) {
    char json[4096], gz[4096], pf[4096], steps0[4096], window[4096];
    snprintf(json, sizeof json, "%s", test_tmp_path("sim-cli-tl.json"));
    snprintf(gz, sizeof gz, "%s", test_tmp_path("sim-cli-tl.json.gz"));
    snprintf(pf, sizeof pf, "%s", test_tmp_path("sim-cli-tl.pftrace"));
    snprintf(steps0, sizeof steps0, "%s", test_tmp_path("sim-cli-tl-steps0.json"));
    snprintf(window, sizeof window, "%s", test_tmp_path("sim-cli-tl-window.json"));
    struct {
        const char *path, *window;
    } runs[] = {{json, NULL}, {gz, NULL}, {pf, NULL}, {steps0, "steps=0:"}, {window, "steps=3:5"}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace",
                                 trace_path, "--hw", "rtx3090-pcie4", "--policy", "lru", "--set",
                                 "memory.budget_gb=4", "--timeline", runs[i].path,
                                 runs[i].window ? "--timeline-window" : NULL, runs[i].window, NULL);
        cr_assert_eq(rc, 0, "%s: %s", runs[i].path, errbuf);
    }
    size_t n, m;
    char *whole = test_read_file(json, &n), *other = malloc(n + 1);

    gzFile z = gzopen(gz, "rb");
    cr_assert(z);
    int got = gzread(z, other, (unsigned)n + 1);
    gzclose(z);
    cr_assert((size_t)got == n && !memcmp(whole, other, n), ".json.gz inflates to the .json bytes");
    free(other);

    other = test_read_file(steps0, &m);
    cr_assert(m == n && !memcmp(whole, other, n), "steps=0: is the whole run");
    free(other);

    other = test_read_file(window, &m);
    size_t all = slice_lines(whole, NULL), kept = slice_lines(other, whole);
    cr_assert(kept > 0 && kept < all / 2, "steps 3 and 4 of 26: %zu of %zu slices", kept, all);
    free(other);

    other = test_read_file(pf, &m);
    cr_assert(m > 0 && m * 5 < n, ".pftrace %zu bytes, JSON %zu", m, n);
    free(other);
    free(whole);
}

Test(sim_cli, json_records_its_inputs_and_the_build_that_made_it) {
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", trace_path,
                             "--hw", "rtx3090-pcie4", "--policy", "lru", "--set",
                             "memory.budget_gb=4", "--json", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(j);
    json_t *in = json_object_get(j, "inputs");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(in, "trace"), "path")),
                     trace_path);
    const char *h = json_string_value(json_object_get(json_object_get(in, "trace"), "fnv1a64"));
    cr_assert(h && strlen(h) == 16, "trace hash: %s", h ? h : "null");
    json_t *model = json_object_get(in, "model"), *hw = json_object_get(in, "hw");
    cr_assert_str_eq(json_string_value(json_object_get(model, "name")), "olmoe-1b-7b");
    cr_assert(strstr(json_string_value(json_object_get(model, "path")), "olmoe-1b-7b.ini"));
    cr_assert_str_eq(json_string_value(json_object_get(hw, "name")), "rtx3090-pcie4");
    cr_assert(json_is_string(json_object_get(hw, "fnv1a64")));
    cr_assert_str_eq(json_string_value(json_object_get(in, "policy")), "lru");
    cr_assert_eq(json_integer_value(json_object_get(in, "seed")), 1);
    json_t *s = json_object_get(in, "settings");
    cr_assert_str_eq(json_string_value(json_object_get(s, "memory.budget_gb")), "4");
    cr_assert_str_eq(json_string_value(json_object_get(s, "lru.scope")), "layer", "the default");
    cr_assert_str_eq(json_string_value(json_object_get(s, "batch.size")), "1");
    json_t *v = json_object_get(j, "moesim");
    cr_assert(json_string_value(json_object_get(v, "version")));
    cr_assert(json_string_value(json_object_get(v, "git")));
    json_decref(j);
}

Test(sim_cli,
     a_trace_made_from_a_model_file_needs_no_model_flag_and_one_without_says_what_to_pass) {
    /* a model of the user's own, by path: the trace stores it, the file can go */
    char ini[4096], own[4096], lost[4096], src[4096];
    snprintf(ini, sizeof ini, "%s", test_tmp_path("own-moe.ini"));
    snprintf(own, sizeof own, "%s", test_tmp_path("own-moe.h5"));
    snprintf(lost, sizeof lost, "%s", test_tmp_path("nowhere-moe.h5"));
    snprintf(src, sizeof src, "%s/configs/models/olmoe-1b-7b.ini", MOESIM_SOURCE_DIR);
    FILE *in = fopen(src, "r"), *o = fopen(ini, "w");
    cr_assert(in && o);
    char line[512];
    while (fgets(line, sizeof line, in))
        fputs(strncmp(line, "name = ", 7) ? line : "name = own-moe\n", o);
    fclose(in);
    fclose(o);
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "synth", "--model",
                             ini, "--requests", "2", "--prompt-len", "8", "--gen-len", "4", "-o",
                             own, "-q", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    /* the same model for an imported log: export the trace, import it back with the file */
    char csv[4096], imported[4096];
    snprintf(csv, sizeof csv, "%s", test_tmp_path("own-moe.csv"));
    snprintf(imported, sizeof imported, "%s", test_tmp_path("own-moe-imported.h5"));
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "export", "--format",
                         "csv", own, "-o", csv, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "import", "--format",
                         "csv", "--model", ini, csv, "-o", imported, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    cr_assert_eq(remove(ini), 0);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", own, "--hw",
                         "rtx3090-pcie4", "--policy", "lru", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", imported, "--hw",
                         "rtx3090-pcie4", "--policy", "lru", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    /* a trace naming a model nobody has, without its config: the flags that would resolve it */
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", &m, &err), MOESIM_OK, "%s", err.msg);
    trace *t = fixture_trace(&m, 2, 4, 4, 1.0, 3);
    snprintf(t->meta.model, sizeof t->meta.model, "nowhere-moe");
    cr_assert_eq(trace_write(t, lost, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", lost, "--hw",
                         "rtx3090-pcie4", "--policy", "lru", NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "names model 'nowhere-moe' and stores no model config; pass --model"),
              "%s", errbuf);
    cr_assert(strstr(errbuf, "--data-dir or MOESIM_DATA_PATH") || strstr(errbuf, "looked in"), "%s",
              errbuf);
}
