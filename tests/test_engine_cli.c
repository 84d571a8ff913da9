/* `moesim eval` and `moesim record` end to end on the fixture checkpoints. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "engine/engine.h"
#include "support/test_support.h"
#include "traces/trace.h"

static char model_dir[1024];
static char out[1 << 14], errbuf[1 << 12];

static const char *fixture(const char *arch) {
    snprintf(model_dir, sizeof model_dir, "%s/tests/fixtures/golden/%s", MOESIM_SOURCE_DIR, arch);
    return model_dir;
}

static double json_number(const char *text, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(text, pat);
    cr_assert(p, "no %s in %s", key, text);
    return strtod(p + strlen(pat), NULL);
}

TestSuite(engine_cli);

Test(engine_cli, eval_reports_kl_that_grows_as_precision_drops) {
    const char *toks = test_tmp_path("toks.txt");
    test_write_file(toks, "# two sequences\n1 17 42 99 3 250 7 64 12 13\n"
                          "{\"prompt_ids\": [9, 8, 7, 6, 5, 4, 3]}\n");
    double kl[3];
    const char *precs[] = {"int8", "int4", "int2"};
    for (int i = 0; i < 3; i++) {
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model",
                                 fixture("mixtral"), "--input", toks, "--precision", precs[i],
                                 "--threads", "2", "--json", NULL);
        cr_assert_eq(rc, 0, "%s", errbuf);
        cr_assert_eq(json_number(out, "tokens_scored"), 15);
        kl[i] = json_number(out, "kl_mean_nats");
    }
    cr_assert(kl[0] < kl[1] && kl[1] < kl[2], "KL %g %g %g", kl[0], kl[1], kl[2]);
}

Test(engine_cli, eval_with_a_bf16_map_has_zero_kl_and_equal_perplexity) {
    const char *toks = test_tmp_path("toks.txt"), *map = test_tmp_path("map.txt");
    test_write_file(toks, "5 6 7 8 9 10\n");
    char line[256] = "";
    for (int j = 0; j < 8; j++) strcat(line, "bf16 ");
    char text[1024];
    snprintf(text, sizeof text, "%s\n%s\n%s\n", line, line, line);
    test_write_file(map, text);
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model",
                             fixture("olmoe"), "--input", toks, "--precision-map", map, "--json",
                             NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    cr_assert_eq(json_number(out, "kl_mean_nats"), 0);
    cr_assert_eq(json_number(out, "perplexity"), json_number(out, "perplexity_bf16"));
}

Test(engine_cli, eval_rejects_bad_tokens_with_file_and_line) {
    const char *toks = test_tmp_path("bad.txt");
    test_write_file(toks, "1 2 3\n4 five 6\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model",
                             fixture("olmoe"), "--input", toks, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "bad.txt:2: 'five' is not a token id"), "%s", errbuf);
    test_write_file(toks, "1 2 300\n");
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model",
                         fixture("olmoe"), "--input", toks, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "bad.txt:1: token id 300 outside the vocabulary [0, 256)"), "%s",
              errbuf);
    test_write_bytes(toks, "1 2 3\0 9999\n", 12); /* what follows a NUL must not be dropped */
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model",
                         fixture("olmoe"), "--input", toks, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "bad.txt:1: a NUL byte (expected text)"), "%s", errbuf);
    const char *folder = test_tmp_path("");
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(folder, '/') - folder), folder);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model",
                         fixture("olmoe"), "--input", dir, NULL); /* not "no prompts" */
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, ": a directory (expected a prompts file)"), "%s", errbuf);
}

/* A checkpoint whose weights hold NaN (one expert's down projection, every value the bf16
 * quiet NaN 0x7fc0) gives no perplexity: one line naming the checkpoint, exit 2. */
Test(engine_cli, eval_of_a_checkpoint_with_nan_weights_fails_in_one_line) {
    const char *dir = test_tmp_path("olmoe-nan"), *toks = test_tmp_path("nan-toks.txt");
    char cmd[8192], st_path[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, fixture("olmoe"), dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    size_t n;
    unsigned char *bytes = (unsigned char *)test_read_file(st_path, &n);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = header_len << 8 | bytes[i];
    json_error_t je;
    json_t *h = json_loadb((const char *)bytes + 8, header_len, 0, &je);
    cr_assert(h, "%s", je.text);
    json_t *tensor = json_object_get(h, "model.layers.0.mlp.experts.0.down_proj.weight");
    cr_assert(tensor && !strcmp(json_string_value(json_object_get(tensor, "dtype")), "BF16"));
    json_t *offsets = json_object_get(tensor, "data_offsets");
    size_t from = 8 + header_len + (size_t)json_integer_value(json_array_get(offsets, 0)),
           to = 8 + header_len + (size_t)json_integer_value(json_array_get(offsets, 1));
    for (size_t i = from; i + 1 < to; i += 2) bytes[i] = 0xc0, bytes[i + 1] = 0x7f;
    test_write_bytes(st_path, bytes, n);
    json_decref(h);
    free(bytes);
    test_write_file(toks, "1 17 42 99 3 250 7 64\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model", dir,
                             "--input", toks, "--json", NULL);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, errbuf);
    cr_assert(strstr(errbuf, "olmoe-nan: the forward pass gave log-probabilities that are not "
                             "finite"),
              "%s", errbuf);
    cr_assert_eq(out[0], '\0', "no result printed: %s", out);
}

/* The trace `moesim record` writes holds exactly what the engine did: the same run through the
 * library (same prompts, options and seed) gives the same routing, gates, importance,
 * look-ahead and tokens, for every architecture. */
static void check_record_matches_engine(const char *arch) {
    const char *toks = test_tmp_path("rec.txt"), *out_h5 = test_tmp_path("rec.h5");
    test_write_file(toks, "1 17 42 99 3 250 7 64\n9 8 7 6 5\n33 34 35\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "record", "--model",
                             fixture(arch), "--input", toks, "--gen-len", "6", "--batch", "2",
                             "--lookahead", "2", "--lookahead-k", "4", "--temperature", "0.8",
                             "--seed", "7", "-o", out_h5, "--threads", "1", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    trace *t;
    moesim_error err = {0};
    cr_assert_eq(trace_read(out_h5, &t, &err), MOESIM_OK, "%s", err.msg);

    engine_options eo = {.n_threads = 1, .precision_mask = 1u << PREC_BF16};
    engine *e;
    cr_assert_eq(engine_load(fixture(arch), &eo, &e, &err), MOESIM_OK, "%s", err.msg);
    engine_prompts pr;
    cr_assert_eq(engine_prompts_load(toks, engine_config_of(e)->vocab, &pr, &err), MOESIM_OK);
    engine_precmap pm;
    engine_precmap_init(&pm, e, PREC_BF16);
    engine_gen_options go = {.gen_len = 6, .batch = 2, .lookahead_depth = 2, .lookahead_k = 4,
                             .temperature = 0.8f, .seed = 7, .pmap = &pm};
    engine_gen_log log;
    cr_assert_eq(engine_generate(e, pr.reqs, pr.n, &go, &log, &err), MOESIM_OK, "%s", err.msg);

    cr_assert_eq(t->n_tokens, log.n_tokens);
    cr_assert_eq(t->n_requests, 3);
    cr_assert_str_eq(t->meta.source, "engine");
    cr_assert_eq(t->meta.model_config_hash, engine_config_of(e)->config_hash);
    size_t n = log.n_tokens, route = n * t->meta.n_layers * t->meta.top_k;
    size_t la = n * t->meta.n_layers * 2 * 4;
    cr_assert_arr_eq(t->request_id, log.request_id, n * sizeof *t->request_id);
    cr_assert_arr_eq(t->position, log.position, n * sizeof *t->position);
    cr_assert_arr_eq(t->phase, log.phase, n);
    cr_assert_arr_eq(t->token_id, log.token_id, n * sizeof *t->token_id);
    cr_assert_arr_eq(t->expert_ids, log.expert_ids, route * sizeof *t->expert_ids);
    cr_assert_arr_eq(t->gate_weights, log.gate_weights, route * sizeof *t->gate_weights);
    cr_assert_arr_eq(t->importance, log.importance, n * t->meta.n_layers * sizeof(float));
    cr_assert_arr_eq(t->lookahead_ids, log.lookahead_ids, la * sizeof *t->lookahead_ids);
    cr_assert_arr_eq(t->lookahead_scores, log.lookahead_scores, la * sizeof(float));

    engine_gen_log_free(&log);
    engine_precmap_free(&pm);
    engine_prompts_free(&pr);
    engine_destroy(e);
    trace_destroy(t);
}

Test(engine_cli, record_writes_what_the_engine_ran_for_mixtral) { check_record_matches_engine("mixtral"); }
Test(engine_cli, record_writes_what_the_engine_ran_for_olmoe) { check_record_matches_engine("olmoe"); }
Test(engine_cli, record_writes_what_the_engine_ran_for_qwen2_moe) { check_record_matches_engine("qwen2_moe"); }
Test(engine_cli, record_writes_what_the_engine_ran_for_qwen3_moe) { check_record_matches_engine("qwen3_moe"); }

Test(engine_cli, recorded_trace_validates_and_its_model_file_loads_back_to_the_geometry) {
    const char *toks = test_tmp_path("rec.txt"), *out_h5 = test_tmp_path("rec.h5");
    char ini[4096];
    snprintf(ini, sizeof ini, "%s", test_tmp_path("rec.ini"));
    test_write_file(toks, "1 2 3 4 5 6\n7 8 9\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "record", "--model",
                             fixture("qwen2_moe"), "--input", toks, "--gen-len", "4", "-o", out_h5,
                             "--model-ini", ini, "--name", "tiny-qwen2", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "validate", out_h5, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    cr_assert(strstr(out, "ok (17 tokens, 2 requests)"), "%s", out);

    model_geometry g;
    moesim_error err = {0};
    cr_assert_eq(model_load(ini, &g, &err), MOESIM_OK, "%s", err.msg);
    engine_options eo = {.n_threads = 1};
    engine *e;
    cr_assert_eq(engine_load(fixture("qwen2_moe"), &eo, &e, &err), MOESIM_OK, "%s", err.msg);
    model_geometry want;
    engine_geometry(e, "tiny-qwen2", &want);
    snprintf(want.hf_id, sizeof want.hf_id, "none");
    cr_assert_str_eq(g.name, "tiny-qwen2");
    cr_assert_eq(g.n_shared_experts, 1);
    cr_assert(g.shared_expert_gate);
    cr_assert_eq(model_non_expert_bytes(&g), model_non_expert_bytes(&want));
    cr_assert_arr_eq(&g, &want, sizeof g, "the model file does not load back to the geometry");
    engine_destroy(e);
}

/* record -> sim: the trace and its model file are all `moesim sim` needs for a model that has no
 * entry in configs/models; every recorded token is simulated. */
Test(engine_cli, moesim_sim_runs_a_recorded_trace_with_its_model_file) {
    char toks[4096], out_h5[4096], ini[4096];
    snprintf(toks, sizeof toks, "%s", test_tmp_path("rec.txt"));
    snprintf(out_h5, sizeof out_h5, "%s", test_tmp_path("rec.h5"));
    snprintf(ini, sizeof ini, "%s", test_tmp_path("rec.ini"));
    test_write_file(toks, "1 2 3 4 5 6\n7 8 9\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "record", "--model",
                             fixture("mixtral"), "--input", toks, "--gen-len", "5", "-o", out_h5,
                             "--model-ini", ini, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", out_h5,
                         "--model", ini, "--hw", "rtx3090-pcie4", "--policy", "lru", "--set",
                         "cache.experts_per_layer=4", "--json", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    cr_assert_eq(json_number(out, "tokens"), 19);
    cr_assert_eq(json_number(out, "requests"), 2);
    double hit = json_number(out, "hit_rate");
    cr_assert(hit > 0 && hit < 1, "hit rate %g", hit);
}

/* A validation whose every configuration the simulator refuses compares nothing: one line
 * saying so and why, exit 2, not a report of nan errors (a recorded trace: small experts). */
Test(engine_cli, a_validation_that_compares_nothing_fails_saying_why) {
    char toks[4096], out_h5[4096], dir[4096], ini[4200], cmd[4300];
    snprintf(toks, sizeof toks, "%s", test_tmp_path("rec.txt"));
    snprintf(out_h5, sizeof out_h5, "%s", test_tmp_path("rec.h5"));
    snprintf(dir, sizeof dir, "%s", test_tmp_path("validate-data"));
    snprintf(ini, sizeof ini, "%s/configs/models/mixtral.ini", dir); /* the trace's model */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/configs/models", dir);
    cr_assert_eq(system(cmd), 0);
    test_write_file(toks, "1 2 3 4 5 6\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "record", "--model",
                             fixture("mixtral"), "--input", toks, "--gen-len", "3", "-o", out_h5,
                             "--model-ini", ini, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    rc =
        test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "--data-dir", dir, "validate",
                        "--trace", out_h5, "--hw", "cpu-host", "--backend", "cpu", "--ssd-dir", dir,
                        "--policy", "lru", "--set", "cache.experts_per_layer=1000", "-q", NULL);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, errbuf);
    cr_assert(strstr(errbuf, "no configuration was compared: the simulator refused every one "
                             "(the first: ") &&
                  strstr(errbuf, "cache.experts_per_layer = 1000"),
              "%s", errbuf);
    cr_assert_eq(strchr(errbuf, '\n'), strrchr(errbuf, '\n'), "not one line: %s", errbuf);
}

Test(engine_cli, record_refuses_bad_input_and_writes_nothing) {
    char toks[4096], out_h5[4096]; /* test_tmp_path's buffers are reused by test_run_moesim */
    snprintf(toks, sizeof toks, "%s", test_tmp_path("rec.txt"));
    snprintf(out_h5, sizeof out_h5, "%s", test_tmp_path("never.h5"));
    test_write_file(toks, "1 2 3\n");
    struct {
        const char *opt, *value, *message;
    } cases[] = {
        {"--lookahead-k", "9", "--lookahead-k: expected at most 8 (the model's experts), got 9"},
        {"--lookahead", "17", "--lookahead: expected an integer in [0, 16], got '17'"},
        {"--precision", "int5", "--precision: expected bf16, int8, int4 or int2, got 'int5'"},
        {"--batch", "0", "--batch: expected an integer in [1, 4096], got '0'"},
        {"--temperature", "-1", "--temperature: expected a number in [0, 100], got '-1'"},
        {"--backend", "gpu", "--backend: expected cpu or cuda, got 'gpu'"},
        {"--gpu-pool", "-3", "--gpu-pool: expected an integer in [0, 4294967295], got '-3'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "record", "--model",
                                 fixture("mixtral"), "--input", toks, "-o", out_h5, cases[i].opt,
                                 cases[i].value, NULL);
        cr_assert_eq(rc, 2, "%s", cases[i].opt);
        cr_assert(strstr(errbuf, cases[i].message), "%s: %s", cases[i].opt, errbuf);
        cr_assert_not(test_file_exists(out_h5));
    }
    test_write_file(toks, "1 2 300\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "record", "--model",
                             fixture("mixtral"), "--input", toks, "-o", out_h5, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "rec.txt:1: token id 300 outside the vocabulary [0, 256)"), "%s",
              errbuf);
    cr_assert_not(test_file_exists(out_h5));
}
