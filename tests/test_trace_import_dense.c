/* `moesim trace import` of per-layer dense score files (traces/import_dense.c): a router dump of
 * the shape training frameworks write (tests/fixtures/import-dense, make_fixtures.py: one CSV or
 * .npy per MoE layer, 64 experts, top-6, layers numbered from 2 in the file names) imports in
 * one command to the trace the NumPy route gives; scores that are not what --scores says are
 * refused; layer numbers are checked for every file before any row is read; identical layers
 * are warned; the report says how phases were decided. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "support/test_support.h"
#include "traces/convert.h"
#include "traces/trace.h"

TestSuite(trace_import_dense);

#define N_LAYER_FILES 4
#define LAYER_PATTERN "layer([0-9]+)"

static const char *fixture_path(const char *name) {
    static char path[8][4096];
    static int slot;
    slot = (slot + 1) % 8;
    snprintf(path[slot], sizeof path[slot], "%s/tests/fixtures/import-dense/%s", MOESIM_SOURCE_DIR,
             name);
    return path[slot];
}

static model_geometry fixture_model(void) {
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name(fixture_path("model.ini"), &m, &err), MOESIM_OK, "%s", err.msg);
    return m;
}

/* The four layer files (".csv" or ".npy"), names 2..5, copied so that the paths outlive calls. */
static void layer_files(const char *ext, char paths[N_LAYER_FILES][4096]) {
    for (int i = 0; i < N_LAYER_FILES; i++) {
        char name[64];
        snprintf(name, sizeof name, "router_layer%d%s", i + 2, ext);
        snprintf(paths[i], sizeof paths[i], "%s", fixture_path(name));
    }
}

/* The options one command gives for the dump: layers from the names, 1-based model layers,
 * 16 tokens a sequence, gate weights, a teacher-forced log. */
static trace_import_options dump_options(trace_text_format f) {
    trace_import_options o;
    trace_import_options_default(&o);
    o.format = f;
    o.layer_from = TRACE_LAYER_FROM_NAME;
    o.layer_name_pattern = LAYER_PATTERN;
    o.layer_base = 1;
    o.layers = TRACE_LAYERS_MODEL;
    o.tokens_per_request = 16;
    o.scores = TRACE_SCORES_WEIGHTS;
    o.all_prefill = true;
    return o;
}

static moesim_status import_paths(char paths[][4096], uint32_t n, const trace_import_options *o,
                                  trace **out, trace_import_report *rep, moesim_error *err) {
    const char *p[8];
    for (uint32_t i = 0; i < n; i++) p[i] = paths[i];
    model_geometry m = fixture_model();
    return trace_import_files(p, n, &m, o, out, rep, err);
}

static void assert_same_trace(const trace *a, const trace *b) {
    cr_assert_eq(a->n_tokens, b->n_tokens);
    cr_assert_eq(a->n_requests, b->n_requests);
    size_t route = trace_route_values(&a->meta);
    cr_assert_eq(route, trace_route_values(&b->meta));
    for (uint64_t t = 0; t < a->n_tokens; t++) {
        cr_assert_eq(a->request_id[t], b->request_id[t], "token %lu", (unsigned long)t);
        cr_assert_eq(a->position[t], b->position[t], "token %lu", (unsigned long)t);
        cr_assert_eq(a->phase[t], b->phase[t], "token %lu", (unsigned long)t);
    }
    cr_assert_eq(memcmp(a->expert_ids, b->expert_ids, a->n_tokens * route * sizeof(uint16_t)), 0);
    cr_assert_eq(memcmp(a->gate_weights, b->gate_weights, a->n_tokens * route * sizeof(float)), 0);
}

static trace *import_npz_route(void) {
    trace_import_options o;
    trace_import_options_default(&o);
    o.format = TRACE_TEXT_NPZ;
    model_geometry m = fixture_model();
    trace *t = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    const char *path = fixture_path("routes.npz");
    cr_assert_eq(trace_import_files(&path, 1, &m, &o, &t, &rep, &err), MOESIM_OK, "%s", err.msg);
    return t;
}

Test(trace_import_dense, per_layer_csvs_named_from_two_import_as_the_npz_route_gives) {
    char paths[N_LAYER_FILES][4096];
    layer_files(".csv", paths);
    trace_import_options o = dump_options(TRACE_TEXT_CSV);
    trace *t = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_paths(paths, N_LAYER_FILES, &o, &t, &rep, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(rep.files, N_LAYER_FILES);
    cr_assert_eq(rep.requests_kept, 4);
    cr_assert_eq(rep.prefill_tokens, 64);
    cr_assert_eq(rep.identical_layers, 0);
    cr_assert_str_eq(rep.phase_source, "--all-prefill");
    trace *npz = import_npz_route();
    assert_same_trace(t, npz);
    trace_destroy(npz);
    trace_destroy(t);
}

Test(trace_import_dense, per_layer_npy_arrays_import_as_the_csvs_do) {
    char csv[N_LAYER_FILES][4096], npy[N_LAYER_FILES][4096];
    layer_files(".csv", csv);
    layer_files(".npy", npy);
    trace_import_options oc = dump_options(TRACE_TEXT_CSV), on = dump_options(TRACE_TEXT_NPY);
    trace *a = NULL, *b = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_paths(csv, N_LAYER_FILES, &oc, &a, &rep, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(import_paths(npy, N_LAYER_FILES, &on, &b, &rep, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_str_eq(rep.schema, "dense npy");
    assert_same_trace(a, b);
    trace_destroy(a);
    trace_destroy(b);
}

Test(trace_import_dense, one_command_imports_the_dump_and_its_export_matches_the_npz_route) {
    char paths[N_LAYER_FILES][4096], out[4096], npz_out[4096], a_csv[4096], b_csv[4096];
    layer_files(".csv", paths);
    snprintf(out, sizeof out, "%s", test_tmp_path("dense.h5"));
    snprintf(npz_out, sizeof npz_out, "%s", test_tmp_path("npz.h5"));
    snprintf(a_csv, sizeof a_csv, "%s", test_tmp_path("dense.csv"));
    snprintf(b_csv, sizeof b_csv, "%s", test_tmp_path("npz.csv"));
    char so[8192], se[1024];
    int rc = test_run_moesim(so, sizeof so, se, sizeof se, "trace", "import", "--format", "csv",
                             "--model", fixture_path("model.ini"), paths[0], paths[1], paths[2],
                             paths[3], "--layer-from-name", LAYER_PATTERN, "--layer-base", "1",
                             "--layers", "model", "--tokens-per-request", "16", "--scores",
                             "weights", "--all-prefill", "--quiet", "-o", out, NULL);
    cr_assert_eq(rc, 0, "%s", se);
    cr_assert(strstr(so, "read        4 files (dense csv"), "%s", so);
    cr_assert(strstr(so, "gate weights: top-k kept"), "%s", so);
    rc = test_run_moesim(NULL, 0, se, sizeof se, "trace", "import", "--format", "npz", "--model",
                         fixture_path("model.ini"), fixture_path("routes.npz"), "--quiet", "-o",
                         npz_out, NULL);
    cr_assert_eq(rc, 0, "%s", se);
    cr_assert_eq(test_run_moesim(NULL, 0, se, sizeof se, "trace", "export", "--format", "csv", out,
                                 "-o", a_csv, NULL),
                 0, "%s", se);
    cr_assert_eq(test_run_moesim(NULL, 0, se, sizeof se, "trace", "export", "--format", "csv",
                                 npz_out, "-o", b_csv, NULL),
                 0, "%s", se);
    size_t na, nb;
    char *a = test_read_file(a_csv, &na), *b = test_read_file(b_csv, &nb);
    cr_assert(na == nb && !memcmp(a, b, na), "exports differ");
    free(a);
    free(b);
}

Test(trace_import_dense, gate_weights_given_as_logits_are_refused_in_one_line) {
    char paths[N_LAYER_FILES][4096];
    layer_files(".csv", paths);
    trace_import_options o = dump_options(TRACE_TEXT_CSV);
    o.scores = TRACE_SCORES_LOGITS;
    trace *t = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_paths(paths, N_LAYER_FILES, &o, &t, &rep, &err), MOESIM_EINPUT);
    cr_assert_null(t);
    cr_assert(strstr(err.msg, "router_layer2.csv:2: 6 of 64 scores non-zero"), "%s", err.msg);
    cr_assert(strstr(err.msg, "--scores weights"), "%s", err.msg);
    cr_assert_null(strchr(err.msg, '\n'));
}

/* A .npy of router logits [tokens][layers][E] for the 4 MoE layers holding probabilities
 * (softmax outputs, as a dump's "scores" are): every row 1/64 but for expert (t + l) % 64. */
static void write_probability_npy(const char *path) {
    const int T = 3, L = 4, E = 64;
    char header[128];
    int n = snprintf(header, sizeof header,
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d), }", T, L, E);
    int pad = 64 - (10 + n + 1) % 64;
    size_t hlen = (size_t)n + (size_t)pad + 1, bytes = 10 + hlen + (size_t)T * L * E * 4;
    unsigned char *buf = calloc(1, bytes);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(hlen & 0xFF);
    buf[9] = (unsigned char)(hlen >> 8);
    memcpy(buf + 10, header, (size_t)n);
    memset(buf + 10 + n, ' ', (size_t)pad);
    buf[10 + hlen - 1] = '\n';
    float *v = (float *)(buf + 10 + hlen);
    for (int t = 0; t < T; t++)
        for (int l = 0; l < L; l++)
            for (int e = 0; e < E; e++)
                v[(t * L + l) * E + e] = e == (t + l) % E ? 0.37f : 0.63f / 63;
    test_write_bytes(path, buf, bytes);
    free(buf);
}

Test(trace_import_dense, probabilities_given_as_logits_are_refused_unless_forced_or_named) {
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("probs.npy"));
    write_probability_npy(path);
    model_geometry m = fixture_model();
    trace_import_options o;
    trace_import_options_default(&o);
    o.format = TRACE_TEXT_NPY;
    trace *t = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    const char *p = path;
    cr_assert_eq(trace_import_files(&p, 1, &m, &o, &t, &rep, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "[0][0]: scores are non-negative and sum to 1.0000: probabilities, "
                              "not router logits (--scores probs"),
              "%s", err.msg);
    o.scores = TRACE_SCORES_PROBS; /* gate rule all: the probabilities themselves */
    cr_assert_eq(trace_import_files(&p, 1, &m, &o, &t, &rep, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_experts(t, 1, 2)[0], 3);
    cr_assert_float_eq(trace_gates(t, 1, 2)[0], 0.37f, 1e-7);
    cr_assert_float_eq(trace_gates(t, 1, 2)[1], 0.01f, 1e-7);
    cr_assert_eq(trace_experts(t, 1, 2)[1], 0, "ties go to the lower expert id");
    trace_destroy(t);
    o.scores = TRACE_SCORES_LOGITS;
    o.force_scores = true; /* as logits: softmax over all of them, the small gates of the issue */
    cr_assert_eq(trace_import_files(&p, 1, &m, &o, &t, &rep, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_lt(trace_gates(t, 1, 2)[0], 0.03f);
    trace_destroy(t);
}

Test(trace_import_dense, an_out_of_range_layer_is_caught_before_any_record_is_read) {
    char paths[N_LAYER_FILES][4096];
    layer_files(".csv", paths);
    trace_import_options o = dump_options(TRACE_TEXT_CSV);
    o.layer_base = 0; /* names 2..5 as 0-based model layers: 5 is past the model's 5 layers */
    trace *t = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_paths(paths, N_LAYER_FILES, &o, &t, &rep, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "router_layer5.csv: layer 5 (layers 2..5 from the file names) is not "
                              "an MoE layer of megatron-moe-fixture"),
              "%s", err.msg);
    cr_assert(strstr(err.msg, "nothing was read"), "%s", err.msg);
    cr_assert_eq(rep.lines, 0);
    cr_assert_eq(rep.records, 0);
    o.layers = TRACE_LAYERS_MOE; /* 2..5 as MoE layers 0..3: 4 and 5 are out */
    cr_assert_eq(import_paths(paths, N_LAYER_FILES, &o, &t, &rep, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "router_layer4.csv: layer 4"), "%s", err.msg);
    cr_assert_eq(rep.records, 0);
    o.layer_base = 2; /* names 2..5 -> MoE layers 0..3: the right reading of this dump */
    cr_assert_eq(import_paths(paths, N_LAYER_FILES, &o, &t, &rep, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
}

Test(trace_import_dense, a_layer_copied_in_the_dump_is_warned_in_the_report_and_by_trace_stats) {
    char paths[N_LAYER_FILES][4096];
    layer_files(".csv", paths);
    /* layers 2, 3, 4 as they are, and layer 2's file again as layer 5 */
    char copy[N_LAYER_FILES][4096];
    for (int i = 0; i < N_LAYER_FILES; i++) {
        char name[64];
        snprintf(name, sizeof name, "twins_layer%d.csv", i + 2);
        snprintf(copy[i], sizeof copy[i], "%s", test_tmp_path(name));
        char *text = test_read_file(paths[i == 3 ? 0 : i], NULL);
        test_write_file(copy[i], text);
        free(text);
    }
    trace_import_options o = dump_options(TRACE_TEXT_CSV);
    trace *t = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_paths(copy, N_LAYER_FILES, &o, &t, &rep, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(rep.identical_layers, 1);
    cr_assert_eq(rep.identical_listed, 1);
    cr_assert_eq(rep.identical[0][0], 0);
    cr_assert_eq(rep.identical[0][1], 3);
    trace_destroy(t);

    char out[4096], so[8192], se[1024];
    snprintf(out, sizeof out, "%s", test_tmp_path("twins.h5"));
    int rc =
        test_run_moesim(so, sizeof so, se, sizeof se, "trace", "import", "--format", "csv",
                        "--model", fixture_path("model.ini"), copy[0], copy[1], copy[2], copy[3],
                        "--layer-from-name", LAYER_PATTERN, "--layer-base", "1", "--layers",
                        "model", "--scores", "weights", "--quiet", "-o", out, NULL);
    cr_assert_eq(rc, 0, "%s", se);
    cr_assert(strstr(so, "warning     MoE layers 0 and 3 have identical routing"), "%s", so);
    rc = test_run_moesim(so, sizeof so, se, sizeof se, "trace", "stats", out, NULL);
    cr_assert_eq(rc, 0, "%s", se);
    cr_assert(strstr(so, "MoE layers 0 and 3 have identical routing"), "%s", so);
}

Test(trace_import_dense, the_report_says_how_phases_were_decided_and_how_to_change_it) {
    char paths[N_LAYER_FILES][4096];
    layer_files(".csv", paths);
    char out[4096], so[8192], se[1024];
    snprintf(out, sizeof out, "%s", test_tmp_path("phases.h5"));
    int rc = test_run_moesim(so, sizeof so, se, sizeof se, "trace", "import", "--format", "csv",
                             "--model", fixture_path("model.ini"), paths[0], paths[1], paths[2],
                             paths[3], "--layer-from-name", LAYER_PATTERN, "--layer-base", "1",
                             "--layers", "model", "--tokens-per-request", "16", "--scores",
                             "weights", "--quiet", "-o", out, NULL);
    cr_assert_eq(rc, 0, "%s", se);
    cr_assert(strstr(so, "phase       0 prefill, 64 decode tokens; from default (all decode)"),
              "%s", so);
    cr_assert(strstr(so, "no phase and no prompt lengths"), "%s", so);
    cr_assert(strstr(so, "--all-prefill") && strstr(so, "--prompt-lens"), "%s", so);

    trace_import_options o = dump_options(TRACE_TEXT_CSV);
    o.all_prefill = false;
    const uint32_t lens[] = {4};
    o.prompt_lens = lens;
    o.n_prompt_lens = 1;
    trace *t = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_paths(paths, N_LAYER_FILES, &o, &t, &rep, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(rep.prefill_tokens, 16);
    cr_assert_str_eq(rep.phase_source, "--prompt-lens");
    trace_destroy(t);
    const uint32_t three[] = {4, 4, 4};
    o.prompt_lens = three;
    o.n_prompt_lens = 3;
    cr_assert_eq(import_paths(paths, N_LAYER_FILES, &o, &t, &rep, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "--prompt-lens: 3 lengths for the 4 requests"), "%s", err.msg);
}

Test(trace_import_dense, several_files_without_a_layer_source_or_dense_header_give_one_line) {
    char paths[N_LAYER_FILES][4096];
    layer_files(".csv", paths);
    trace_import_options o = dump_options(TRACE_TEXT_CSV);
    o.layer_from = TRACE_LAYER_FROM_COLUMN; /* the dump's layer_id column: 0 in every file */
    trace *t = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_paths(paths, N_LAYER_FILES, &o, &t, &rep, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "layer 0 < --layer-base 1"), "%s", err.msg);
    o.layer_from = TRACE_LAYER_FROM_NAME;
    o.layer_name_pattern = "block([0-9]+)";
    cr_assert_eq(import_paths(paths, N_LAYER_FILES, &o, &t, &rep, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "router_layer2.csv: --layer-from-name 'block([0-9]+)': the file name "
                              "does not match"),
              "%s", err.msg);
    cr_assert_eq(rep.records, 0);
}

/* A header written by a spreadsheet (a UTF-8 byte order mark, a space after each comma) names
 * the same columns: the files import as the plain ones do. */
Test(trace_import_dense, a_byte_order_mark_and_spaces_around_header_names_read_as_without) {
    char plain[N_LAYER_FILES][4096], spaced[N_LAYER_FILES][4096];
    layer_files(".csv", plain);
    for (int i = 0; i < N_LAYER_FILES; i++) {
        char *text = test_read_file(plain[i], NULL), *nl = strchr(text, '\n');
        cr_assert(nl);
        size_t n = strlen(text), out = 0;
        char *spread = malloc(2 * n + 4);
        memcpy(spread, "\xEF\xBB\xBF", 3), out = 3;
        for (char *p = text; *p; p++) {
            spread[out++] = *p;
            if (p < nl && *p == ',') spread[out++] = ' ';
        }
        spread[out] = '\0';
        char name[64];
        snprintf(name, sizeof name, "spread_layer%d.csv", i + 2);
        snprintf(spaced[i], sizeof spaced[i], "%s", test_tmp_path(name));
        test_write_file(spaced[i], spread);
        free(spread);
        free(text);
    }
    trace_import_options o = dump_options(TRACE_TEXT_CSV);
    trace *a = NULL, *b = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_paths(plain, N_LAYER_FILES, &o, &a, &rep, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(import_paths(spaced, N_LAYER_FILES, &o, &b, &rep, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_str_eq(rep.ignored_keys, "", "every column read: %s", rep.ignored_keys);
    assert_same_trace(a, b);
    trace_destroy(a);
    trace_destroy(b);
}

/* A .npy of scores has no layer column: without --layer-from-name or --layer-from-order it is
 * refused, not read as layer 0. */
Test(trace_import_dense, npy_scores_without_a_layer_source_are_refused_in_one_line) {
    char paths[N_LAYER_FILES][4096];
    layer_files(".npy", paths);
    trace_import_options o = dump_options(TRACE_TEXT_NPY);
    o.layer_from = TRACE_LAYER_FROM_COLUMN;
    trace *t = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_paths(paths, 1, &o, &t, &rep, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "router_layer2.npy: a .npy of scores has no layer column: give each "
                              "file's layer with --layer-from-name PATTERN or --layer-from-order"),
              "%s", err.msg);
    cr_assert_null(t);
}
