/* `moesim trace import` / `trace export` (traces/convert.h): both JSONL shapes and auto-detect,
 * grouping of tokens per request, --incomplete keep/drop, constant-run reports, phases, layer
 * numbering, gate rules, exact round trips (trace -> text -> trace, and log -> trace -> text ->
 * trace), the float scanner against strtof, and a corpus of malformed JSONL and CSV files made
 * here, each of which must give one line naming file:line and the field, exit status 2 and no
 * output file (and fail the same way in this process without leaking; the ASan build checks). */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/model.h"
#include "common/rng.h"
#include "support/test_support.h"
#include "traces/convert.h"
#include "traces/text_scan.h"
#include "traces/trace.h"

TestSuite(trace_import);

static model_geometry load_model(const char *name) {
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name(name, &m, &err), MOESIM_OK, "%s", err.msg);
    return m;
}

/* Writes `text` to a scratch file and imports it; returns the status. */
static moesim_status import_text(const char *name, const char *text, const char *model,
                                 const trace_import_options *o, trace **out,
                                 trace_import_report *rep, moesim_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path(name));
    test_write_file(path, text);
    model_geometry m = load_model(model);
    return trace_import_file(path, &m, o, out, rep, err);
}

static trace_import_options defaults(void) {
    trace_import_options o;
    trace_import_options_default(&o);
    return o;
}

/* Text builder over open_memstream. */
typedef struct text {
    char *buf;
    size_t len;
    FILE *fp;
} text;
static void text_open(text *t) {
    t->fp = open_memstream(&t->buf, &t->len);
    cr_assert(t->fp);
}
static char *text_close(text *t) {
    fclose(t->fp);
    return t->buf;
}

/* One request-shape record of a top-2 model: experts a, b with gates g, 1 - g. */
static void rec2(text *t, const char *req, unsigned tok, unsigned layer, unsigned a, unsigned b,
                 double g) {
    fprintf(t->fp,
            "{\"req_id\": \"%s\", \"token_idx\": %u, \"layer\": %u, \"topk_ids\": [%u, %u], "
            "\"topk_weights\": [%.9g, %.9g]}\n",
            req, tok, layer, a, b, g, 1.0 - g);
}

/* All 32 layers of one Mixtral token, routing derived from `seed`. */
static void token32(text *t, const char *req, unsigned tok, unsigned seed) {
    for (unsigned l = 0; l < 32; l++) {
        unsigned a = (seed + l) % 8, b = (seed + 3 * l + 1) % 8;
        if (b == a) b = (a + 1) % 8;
        rec2(t, req, tok, l, a, b, 0.25 + 0.5 * ((seed * 7 + l) % 11) / 11.0);
    }
}

/* ---- shapes, grouping ---------------------------------------------------------------------- */

Test(trace_import, problem_shape_with_keys_in_any_order_groups_by_dataset_and_problem) {
    /* Qwen1.5-MoE-A2.7B: 24 layers, 60 experts, top-4, softmax over all (sums <= 1) */
    text t;
    text_open(&t);
    const char *order[3] = {
        "{\"dataset\": \"%s\", \"problem_id\": %u, \"token_idx\": %u, \"layer\": %u, "
        "\"experts\": [%u, 5, 7, 58], \"gating_probs\": [0.4, 0.3, 0.2, 0.1]}\n",
        "{\"layer\": %4$u, \"token_idx\": %3$u, \"problem_id\": %2$u, \"dataset\": \"%1$s\", "
        "\"gating_probs\": [0.4, 0.3, 0.2, 0.1], \"experts\": [%5$u, 5, 7, 58]}\n",
        "{\"experts\":[%5$u,5,7,58],\"gating_probs\":[0.4,0.3,0.2,0.1],\"dataset\":\"%1$s\","
        "\"problem_id\":%2$u,\"layer\":%4$u,\"token_idx\":%3$u}\n"};
    /* gsm8k/0 tokens 0,1; mmlu/0 token 0 (same problem_id, other dataset); gsm8k/0 token 2 */
    struct {
        const char *ds;
        unsigned pid, tok;
    } toks[4] = {{"gsm8k", 0, 0}, {"gsm8k", 0, 1}, {"mmlu", 0, 0}, {"gsm8k", 0, 2}};
    for (int i = 0; i < 4; i++)
        for (unsigned l = 0; l < 24; l++)
            fprintf(t.fp, order[(i + l) % 3], toks[i].ds, toks[i].pid, toks[i].tok, l,
                    (unsigned)(10 + i + l));
    char *s = text_close(&t);
    trace_import_options o = defaults();
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("problem.jsonl", s, "qwen1.5-moe-a2.7b", &o, &tr, &rep, &err),
                 MOESIM_OK, "%s", err.msg);
    free(s);
    cr_assert_str_eq(rep.schema, "problem");
    cr_assert_eq(tr->n_tokens, 4);
    cr_assert_eq(tr->n_requests, 2);
    uint32_t want_req[4] = {0, 0, 1, 0}, want_pos[4] = {0, 1, 0, 2};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(tr->request_id[i], want_req[i], "token %d", i);
        cr_assert_eq(tr->position[i], want_pos[i], "token %d", i);
        cr_assert_eq(tr->phase[i], TRACE_DECODE);
        for (uint32_t l = 0; l < 24; l++) {
            cr_assert_eq(trace_experts(tr, i, l)[0], 10 + i + l);
            cr_assert_eq(trace_experts(tr, i, l)[3], 58);
            cr_assert_eq(trace_gates(tr, i, l)[1], 0.3f);
        }
    }
    cr_assert_str_eq(tr->meta.model, "qwen1.5-moe-a2.7b");
    cr_assert_str_eq(tr->meta.source, "import:jsonl");
    cr_assert_eq(tr->meta.gate_norm, GATE_SOFTMAX_ALL);
    cr_assert_eq(rep.records, 96);
    cr_assert_eq(rep.tokens_incomplete, 0);
    trace_destroy(tr);
}

Test(trace_import, request_shape_is_detected_and_interleaved_requests_keep_file_order) {
    text t;
    text_open(&t);
    /* r7 token 0, r2 token 0 (layer-interleaved with r7 token 1), then r7 token 1 finishes */
    token32(&t, "r7", 0, 1);
    for (unsigned l = 0; l < 32; l++) {
        rec2(&t, "r2", 0, l, 2, 3, 0.5);
        if (l < 16) rec2(&t, "r7", 4, l, 4, 5, 0.5);
    }
    for (unsigned l = 16; l < 32; l++) rec2(&t, "r7", 4, l, 6, 7, 0.5);
    char *s = text_close(&t);
    trace_import_options o = defaults();
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("request.jsonl", s, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_str_eq(rep.schema, "request");
    cr_assert_eq(tr->n_tokens, 3);
    cr_assert_eq(tr->request_id[0], 0); /* r7 */
    cr_assert_eq(tr->request_id[1], 1); /* r2: its first record precedes r7 token 4's */
    cr_assert_eq(tr->request_id[2], 0);
    cr_assert_eq(tr->position[2], 4);
    cr_assert_eq(trace_experts(tr, 2, 15)[0], 4);
    cr_assert_eq(trace_experts(tr, 2, 16)[0], 6);
    trace_destroy(tr);

    /* the same text named explicitly: same result; named as the other shape: an error */
    o.schema = TRACE_SCHEMA_REQUEST;
    cr_assert_eq(import_text("request.jsonl", s, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    trace_destroy(tr);
    o.schema = TRACE_SCHEMA_PROBLEM;
    cr_assert_eq(import_text("request.jsonl", s, "mixtral-8x7b", &o, &tr, &rep, &err),
                 MOESIM_EINPUT);
    cr_assert_null(tr);
    cr_assert(strstr(err.msg, "request.jsonl:1: req_id: a key of the request shape in a file of "
                              "the problem shape (--schema problem)"),
              "%s", err.msg);
    free(s);
}

/* ---- incomplete tokens, constant runs ------------------------------------------------------ */

static char *incomplete_log(void) {
    text t;
    text_open(&t);
    token32(&t, "a", 0, 1);
    for (unsigned l = 0; l < 32; l++) /* token 1 of "a" lacks layers 5 and 9 */
        if (l != 5 && l != 9) rec2(&t, "a", 1, l, 1, 2, 0.5);
    token32(&t, "b", 0, 2);
    for (unsigned l = 0; l < 3; l++) rec2(&t, "c", 0, l, 3, 4, 0.5); /* request c: one partial */
    token32(&t, "a", 2, 3);
    return text_close(&t);
}

Test(trace_import, incomplete_tokens_are_kept_as_unrecorded_rows_by_default) {
    char *s = incomplete_log();
    trace_import_options o = defaults();
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("incomplete.jsonl", s, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(tr->n_tokens, 5);
    cr_assert_eq(tr->n_requests, 3);
    cr_assert_eq(rep.tokens_incomplete, 2);
    cr_assert_eq(rep.rows_missing, 2 + 29);
    cr_assert_eq(rep.rows_unrecorded_kept, 31);
    cr_assert_eq(rep.tokens_dropped_incomplete, 0);
    for (uint32_t j = 0; j < 2; j++) {
        cr_assert_eq(trace_experts(tr, 1, 5)[j], TRACE_NO_EXPERT);
        cr_assert_eq(trace_gates(tr, 1, 5)[j], 0.0f);
    }
    cr_assert_eq(trace_experts(tr, 1, 6)[0], 1);
    cr_assert_eq(trace_experts(tr, 3, 3)[0], TRACE_NO_EXPERT);
    trace_destroy(tr);
    free(s);
}

Test(trace_import, incomplete_drop_leaves_those_tokens_out_and_renumbers_requests) {
    char *s = incomplete_log();
    trace_import_options o = defaults();
    o.incomplete = TRACE_INCOMPLETE_DROP;
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("incomplete.jsonl", s, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(tr->n_tokens, 3);
    cr_assert_eq(tr->n_requests, 2); /* c had only its partial token */
    cr_assert_eq(rep.tokens_dropped_incomplete, 2);
    cr_assert_eq(rep.records_dropped, 30 + 3);
    cr_assert_eq(rep.rows_unrecorded_kept, 0);
    uint32_t want_req[3] = {0, 1, 0}, want_pos[3] = {0, 0, 2};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tr->request_id[i], want_req[i]);
        cr_assert_eq(tr->position[i], want_pos[i]);
    }
    trace_destroy(tr);
    free(s);
}

Test(trace_import, constant_warmup_runs_are_reported_and_dropped_only_when_asked) {
    text t;
    text_open(&t);
    for (unsigned i = 0; i < 40; i++) token32(&t, "warmup", i, 5); /* one routing, 40 times */
    for (unsigned i = 0; i < 10; i++) token32(&t, "real", i, 7);   /* 10 identical: below 16 */
    for (unsigned i = 10; i < 30; i++) token32(&t, "real", i, i);
    char *s = text_close(&t);
    trace_import_options o = defaults();
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("warmup.jsonl", s, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(tr->n_tokens, 70, "reported, not dropped");
    cr_assert_eq(rep.constant_runs, 1);
    cr_assert_eq(rep.constant_run_tokens, 40);
    cr_assert_eq(rep.runs_listed, 1);
    cr_assert_str_eq(rep.runs[0].request, "warmup");
    cr_assert_eq(rep.runs[0].first_token_idx, 0);
    cr_assert_eq(rep.runs[0].line, 1);
    cr_assert_eq(rep.runs[0].tokens, 40);
    trace_destroy(tr);

    o.constant_run_min = 10; /* now the 10 tokens of "real" count too */
    o.drop_constant_runs = true;
    cr_assert_eq(import_text("warmup.jsonl", s, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(rep.constant_runs, 2);
    cr_assert_eq(rep.runs[1].line, 40 * 32 + 1);
    cr_assert_eq(rep.tokens_dropped_constant, 50);
    cr_assert_eq(tr->n_tokens, 20);
    cr_assert_eq(tr->n_requests, 1);
    cr_assert_eq(tr->position[0], 10);
    trace_destroy(tr);
    free(s);
}

/* ---- phase, layers, gates ------------------------------------------------------------------ */

Test(trace_import, phase_is_decode_by_default_and_set_by_prefill_tokens_or_records) {
    text t;
    text_open(&t);
    for (unsigned i = 0; i < 6; i++) token32(&t, "a", i, i);
    char *s = text_close(&t);
    trace_import_options o = defaults();
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("phase.jsonl", s, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK);
    cr_assert_eq(rep.decode_tokens, 6);
    cr_assert_str_eq(rep.phase_source, "default (all decode)");
    trace_destroy(tr);
    o.prefill_tokens = 4;
    o.prefill_tokens_set = true;
    cr_assert_eq(import_text("phase.jsonl", s, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK);
    for (int i = 0; i < 6; i++) cr_assert_eq(tr->phase[i], i < 4 ? TRACE_PREFILL : TRACE_DECODE);
    cr_assert_eq(rep.prefill_tokens, 4);
    cr_assert_str_eq(rep.phase_source, "--prefill-tokens");
    trace_destroy(tr);
    free(s);

    /* records that carry their phase: used as given; --prefill-tokens then conflicts */
    const char *rec = "{\"req_id\": 1, \"token_idx\": 0, \"layer\": 0, \"phase\": \"prefill\", "
                      "\"topk_ids\": [0, 1], \"topk_weights\": [0.5, 0.5]}\n"
                      "{\"req_id\": 1, \"token_idx\": 1, \"layer\": 0, \"phase\": \"decode\", "
                      "\"topk_ids\": [0, 1], \"topk_weights\": [0.5, 0.5]}\n";
    cr_assert_eq(import_text("phase2.jsonl", rec, "mixtral-8x7b", &o, &tr, &rep, &err),
                 MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "phase2.jsonl:1: phase: the records carry their phase"), "%s",
              err.msg);
    o = defaults();
    cr_assert_eq(import_text("phase2.jsonl", rec, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(tr->phase[0], TRACE_PREFILL);
    cr_assert_eq(tr->phase[1], TRACE_DECODE);
    cr_assert_str_eq(rep.phase_source, "records");
    trace_destroy(tr);
}

Test(trace_import, model_layer_numbering_skips_dense_layers) {
    /* DeepSeek-V2-Lite: layer 0 dense, MoE layers 1..26; top-6 of 64, softmax over all */
    const char *ok = "{\"req_id\": 0, \"token_idx\": 0, \"layer\": 1, \"topk_ids\": [0, 1, 2, 3, "
                     "4, 5], \"topk_weights\": [0.1, 0.1, 0.1, 0.1, 0.1, 0.1]}\n";
    const char *dense = "{\"req_id\": 0, \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [0, 1, 2, "
                        "3, 4, 5], \"topk_weights\": [0.1, 0.1, 0.1, 0.1, 0.1, 0.1]}\n";
    trace_import_options o = defaults();
    o.layers = TRACE_LAYERS_MODEL;
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("dsv2.jsonl", ok, "deepseek-v2-lite", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(tr->meta.n_layers, 26);
    cr_assert_eq(trace_experts(tr, 0, 0)[5], 5);
    trace_destroy(tr);
    cr_assert_eq(import_text("dsv2.jsonl", dense, "deepseek-v2-lite", &o, &tr, &rep, &err),
                 MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "dsv2.jsonl:1: layer: layer 0 of deepseek-v2-lite is a dense layer"),
              "%s", err.msg);
    o.layers = TRACE_LAYERS_MOE; /* MoE numbering: "layer": 0 is the first MoE layer */
    cr_assert_eq(import_text("dsv2.jsonl", dense, "deepseek-v2-lite", &o, &tr, &rep, &err),
                 MOESIM_OK, "%s", err.msg);
    trace_destroy(tr);
}

Test(trace_import, gates_off_the_models_rule_fail_unless_renormalized) {
    const char *rec = "{\"req_id\": 0, \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [3, 1], "
                      "\"topk_weights\": [0.6, 0.2]}\n";
    trace_import_options o = defaults();
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("sum.jsonl", rec, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "sum.jsonl:1: topk_weights: gate weights sum to 0.8, expected 1"),
              "%s", err.msg);
    o.renormalize = true;
    cr_assert_eq(import_text("sum.jsonl", rec, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_float_eq(trace_gates(tr, 0, 0)[0], 0.75f, 1e-7);
    cr_assert_float_eq(trace_gates(tr, 0, 0)[1], 0.25f, 1e-7);
    cr_assert_eq(rep.renormalized_records, 1);
    trace_destroy(tr);
    /* a softmax-over-all model: the sum only has an upper bound; renormalizing is refused */
    cr_assert_eq(import_text("sum.jsonl", rec, "olmoe-1b-7b", &o, &tr, &rep, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "--renormalize"), "%s", err.msg);
}

Test(trace_import, unknown_keys_are_skipped_and_reported) {
    const char *rec = "{\"req_id\": 0, \"ts\": {\"a\": [1, 2.5e3, null, true]}, \"token_idx\": 0, "
                      "\"layer\": 0, \"topk_ids\": [3, 1], \"topk_weights\": [0.5, 0.5], "
                      "\"host\": \"n\\u00e9\"}\n";
    trace_import_options o = defaults();
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("keys.jsonl", rec, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(rep.ignored_key_records, 1);
    cr_assert_str_eq(rep.ignored_keys, "ts,host");
    trace_destroy(tr);
}

/* ---- round trips --------------------------------------------------------------------------- */

/* A Mixtral-shaped trace: 5 requests interleaved, positions with gaps, prefill then decode,
 * random gates (some subnormal, 0 or 1), some rows unrecorded (never a whole token). */
static trace *random_trace(uint64_t seed) {
    model_geometry m = load_model("mixtral-8x7b");
    trace_meta meta = {0};
    trace_meta_from_model(&meta, &m);
    snprintf(meta.source, sizeof meta.source, "synth:%llu", (unsigned long long)seed);
    enum { N = 300 };
    trace *t = trace_create(&meta, N);
    rng *r = rng_create(seed);
    uint32_t pos[5] = {0}, seen = 0;
    for (uint64_t i = 0; i < N; i++) {
        uint32_t q = (uint32_t)rng_below(r, seen < 5 ? seen + 1 : 5);
        if (q == seen) seen++;
        t->request_id[i] = q;
        pos[q] += 1 + (uint32_t)rng_below(r, 3);
        t->position[i] = pos[q];
        t->phase[i] = pos[q] < 12 ? TRACE_PREFILL : TRACE_DECODE;
        for (uint32_t l = 0; l < 32; l++) {
            size_t at = trace_route_index(t, i, l);
            if (l > 0 && rng_uniform(r) < 0.05) {
                t->expert_ids[at] = t->expert_ids[at + 1] = TRACE_NO_EXPERT;
                continue;
            }
            uint16_t a = (uint16_t)rng_below(r, 8);
            t->expert_ids[at] = a;
            t->expert_ids[at + 1] = (uint16_t)((a + 1 + rng_below(r, 7)) % 8);
            double u = rng_uniform(r);
            float g = u < 0.05 ? 1e-40f : u < 0.1 ? 0.0f : (float)rng_uniform(r);
            t->gate_weights[at] = g;
            t->gate_weights[at + 1] = 1.0f - g;
        }
    }
    rng_destroy(r);
    moesim_error err = {0};
    cr_assert_eq(trace_finish(t, "random trace", &err), MOESIM_OK, "%s", err.msg);
    return t;
}

static void assert_same_arrays(const trace *a, const trace *b) {
    cr_assert_eq(a->n_tokens, b->n_tokens);
    cr_assert_eq(a->n_requests, b->n_requests);
    size_t n = a->n_tokens, rv = n * trace_route_values(&a->meta);
    cr_assert(!memcmp(a->request_id, b->request_id, n * sizeof *a->request_id));
    cr_assert(!memcmp(a->position, b->position, n * sizeof *a->position));
    cr_assert(!memcmp(a->phase, b->phase, n * sizeof *a->phase));
    cr_assert(!memcmp(a->expert_ids, b->expert_ids, rv * sizeof *a->expert_ids));
    cr_assert(!memcmp(a->gate_weights, b->gate_weights, rv * sizeof *a->gate_weights),
              "gates differ");
}

static void export_to(const trace *t, trace_text_format f, const char *path) {
    moesim_error err = {0};
    cr_assert_eq(trace_export_check(t, path, &err), MOESIM_OK, "%s", err.msg);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    cr_assert_eq(trace_export_write(t, f, fp, false, path, &err), MOESIM_OK, "%s", err.msg);
    fclose(fp);
}

static char *slurp(const char *path) {
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "%s", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, fp), (size_t)n);
    s[n] = '\0';
    fclose(fp);
    return s;
}

Test(trace_import, trace_to_text_to_trace_is_exact_in_both_formats) {
    model_geometry m = load_model("mixtral-8x7b");
    for (int f = 0; f < 2; f++) {
        trace *t = random_trace(11 + (uint64_t)f);
        trace_text_format fmt = f ? TRACE_TEXT_CSV : TRACE_TEXT_JSONL;
        char path[4096], path2[4096];
        snprintf(path, sizeof path, "%s", test_tmp_path(f ? "rt.csv" : "rt.jsonl"));
        snprintf(path2, sizeof path2, "%s", test_tmp_path(f ? "rt2.csv" : "rt2.jsonl"));
        export_to(t, fmt, path);
        trace_import_options o = defaults();
        o.format = fmt;
        trace *back = NULL;
        trace_import_report rep;
        moesim_error err = {0};
        cr_assert_eq(trace_import_file(path, &m, &o, &back, &rep, &err), MOESIM_OK, "%s", err.msg);
        assert_same_arrays(t, back);
        cr_assert_str_eq(rep.phase_source, "records");
        /* and the text of the re-import is the same text */
        export_to(back, fmt, path2);
        char *a = slurp(path), *b = slurp(path2);
        cr_assert_str_eq(a, b);
        free(a);
        free(b);
        trace_destroy(back);
        trace_destroy(t);
    }
}

/* A cell's number is its request: " 3" (a space after the comma of a hand-edited file) is
 * request 3, as "3" is, and a byte order mark before the header is no part of it. */
Test(trace_import, csv_request_ids_are_numbers_whatever_spaces_precede_them) {
    model_geometry m = load_model("mixtral-8x7b");
    trace *t = random_trace(5);
    char path[4096], spaced[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("spaces.csv"));
    snprintf(spaced, sizeof spaced, "%s", test_tmp_path("spaces2.csv"));
    export_to(t, TRACE_TEXT_CSV, path);
    char *a = slurp(path);
    FILE *fp = fopen(spaced, "w");
    cr_assert(fp);
    fputs("\xEF\xBB\xBF", fp);
    bool odd = false;
    for (char *line = a, *nl; *line; line = nl + 1) { /* every other row's id after a space */
        nl = strchr(line, '\n');
        cr_assert(nl);
        fprintf(fp, "%s%.*s\n", line != a && (odd = !odd) ? " " : "", (int)(nl - line), line);
    }
    fclose(fp);
    free(a);
    trace_import_options o = defaults();
    o.format = TRACE_TEXT_CSV;
    trace *back = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(trace_import_file(spaced, &m, &o, &back, &rep, &err), MOESIM_OK, "%s", err.msg);
    assert_same_arrays(t, back);
    trace_destroy(back);
    trace_destroy(t);
}

Test(trace_import, log_to_trace_to_text_to_trace_is_exact_through_the_cli) {
    /* a problem-shape log with incomplete tokens, gates in short decimals */
    text t;
    text_open(&t);
    for (unsigned p = 0; p < 3; p++)
        for (unsigned i = 0; i < 5; i++)
            for (unsigned l = 0; l < 32; l++) {
                if ((p + i + l) % 13 == 0 && l) continue;
                fprintf(t.fp,
                        "{\"dataset\": \"gsm8k\", \"problem_id\": %u, \"token_idx\": %u, "
                        "\"layer\": %u, \"experts\": [%u, %u], \"gating_probs\": [0.71, 0.29]}\n",
                        p, i, l, (p + l) % 8, (p + l + 1 + i) % 8);
            }
    char *s = text_close(&t);
    char log[4096], h1[4096], txt[4096], h2[4096], txt2[4096];
    snprintf(log, sizeof log, "%s", test_tmp_path("log.jsonl"));
    snprintf(h1, sizeof h1, "%s", test_tmp_path("log.h5"));
    snprintf(txt, sizeof txt, "%s", test_tmp_path("log-export.jsonl"));
    snprintf(h2, sizeof h2, "%s", test_tmp_path("log2.h5"));
    snprintf(txt2, sizeof txt2, "%s", test_tmp_path("log-export2.jsonl"));
    test_write_file(log, s);
    free(s);
    static char out[1 << 16], errb[4096];
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--format",
                                 "jsonl", "--model", "mixtral-8x7b", log, "-o", h1, NULL),
                 0, "%s", errb);
    cr_assert(strstr(out, "kept        3 requests, 15 tokens"), "%s", out);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "export", "--format",
                                 "jsonl", h1, "-o", txt, NULL),
                 0, "%s", errb);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--model",
                                 "mixtral-8x7b", txt, "-o", h2, "--json", NULL),
                 0, "%s", errb);
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    cr_assert(j, "%s", jerr.text);
    cr_assert_str_eq(json_string_value(json_object_get(j, "schema")), "request");
    cr_assert_eq(json_integer_value(json_object_get(j, "tokens_kept")), 15);
    cr_assert_str_eq(json_string_value(json_object_get(j, "phase_source")), "records");
    json_decref(j);
    trace *a = NULL, *b = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_read(h1, &a, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_read(h2, &b, &err), MOESIM_OK, "%s", err.msg);
    assert_same_arrays(a, b);
    cr_assert_eq(trace_gates(a, 0, 0)[0], 0.71f);
    trace_destroy(a);
    trace_destroy(b);
    /* exporting the re-import gives the same bytes; export to stdout gives them too */
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "export", "--format",
                                 "jsonl", h2, "-o", txt2, NULL),
                 0, "%s", errb);
    char *x = slurp(txt), *y = slurp(txt2);
    cr_assert_str_eq(x, y);
    static char so[1 << 20];
    cr_assert_eq(test_run_moesim(so, sizeof so, errb, sizeof errb, "trace", "export", "--format",
                                 "jsonl", h2, NULL),
                 0, "%s", errb);
    cr_assert_str_eq(so, x);
    cr_assert(strstr(x, "\"topk_weights\": [0.71, 0.29]"), "short decimals stay short");
    free(x);
    free(y);
}

Test(trace_import, export_refuses_a_token_without_any_recorded_layer) {
    trace *t = random_trace(3);
    for (uint32_t l = 0; l < 32; l++) {
        size_t at = trace_route_index(t, 7, l);
        t->expert_ids[at] = t->expert_ids[at + 1] = TRACE_NO_EXPERT;
        t->gate_weights[at] = t->gate_weights[at + 1] = 0.0f;
    }
    moesim_error err = {0};
    cr_assert_eq(trace_export_check(t, "t.h5", &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "t.h5: /routing/expert_ids[7]: token has no recorded layer"), "%s",
              err.msg);
    trace_destroy(t);
}

/* ---- the float scanner --------------------------------------------------------------------- */

static float scan_float(const char *s) {
    text_scan sc = {s, s + strlen(s), NULL};
    float f;
    cr_assert(text_scan_float(&sc, &f), "'%s': %s", s, sc.why);
    cr_assert_eq(sc.p, sc.end, "'%s' not consumed", s);
    return f;
}

Test(trace_import, float_scanner_rounds_like_strtof) {
    rng *r = rng_create(99);
    char buf[128];
    for (int i = 0; i < 200000; i++) {
        float want;
        switch (i % 4) {
        case 0: { /* any float bits in [0, 1], every precision */
            uint32_t bits = (uint32_t)rng_below(r, 0x3F800001u);
            memcpy(&want, &bits, sizeof want);
            snprintf(buf, sizeof buf, "%.*g", 1 + (int)rng_below(r, 12), (double)want);
            break;
        }
        case 1: /* long decimals (more than 19 digits) and exponents */
            snprintf(buf, sizeof buf, "%.25f", rng_uniform(r));
            break;
        case 2:
            snprintf(buf, sizeof buf, "%.17fe%d", rng_uniform(r), (int)rng_below(r, 90) - 45);
            break;
        default: /* decimals near float midpoints */ {
            uint32_t bits = (uint32_t)rng_below(r, 0x3F800000u);
            float lo, hi;
            memcpy(&lo, &bits, sizeof lo);
            hi = nextafterf(lo, 2.0f);
            snprintf(buf, sizeof buf, "%.20g", ((double)lo + (double)hi) / 2.0);
            break;
        }
        }
        want = strtof(buf, NULL);
        float got = scan_float(buf);
        cr_assert(!memcmp(&got, &want, sizeof got), "'%s': %a vs strtof %a", buf, (double)got,
                  (double)want);
    }
    rng_destroy(r);
    cr_assert_eq(scan_float("0"), 0.0f);
    cr_assert(signbit(scan_float("-0")));
    cr_assert_eq(scan_float("1E+0"), 1.0f);
}

/* ---- the malformed-input corpus ------------------------------------------------------------ */

#define OK1                                                                                        \
    "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [1, 2], \"topk_weights\": " \
    "[0.5, 0.5]}\n"
#define OK2                                                                                        \
    "{\"req_id\": \"a\", \"token_idx\": 1, \"layer\": 0, \"topk_ids\": [1, 2], \"topk_weights\": " \
    "[0.5, 0.5]}\n"

typedef struct bad_case {
    const char *name;
    const char *text;
    const char *format; /* "jsonl" or "csv" */
    int line;
    const char *field; /* the message must contain "<file>:<line>: <field>:" */
    const char *says;  /* and this */
} bad_case;

static const bad_case corpus[] = {
    {"not_json", OK1 "hello\n", "jsonl", 2, "record", "expected '{'"},
    {"truncated_object", OK1 "{\"req_id\": \"a\", \"token_idx\": 1", "jsonl", 2, "token_idx",
     "expected ',' or '}'"},
    {"trailing_comma",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [1, 2], "
     "\"topk_weights\": [0.5, 0.5],}\n",
     "jsonl", 1, "record", "expected a key"},
    {"single_quotes", "{'req_id': 'a'}\n", "jsonl", 1, "record", "expected a key"},
    {"nan_gate",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [1, 2], "
     "\"topk_weights\": [NaN, 0.5]}\n",
     "jsonl", 1, "topk_weights[0]", "NaN"},
    {"negative_gate",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [1, 2], "
     "\"topk_weights\": [-0.5, 1.5]}\n",
     "jsonl", 1, "topk_weights[0]", "negative"},
    {"gate_above_one",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [1, 2], "
     "\"topk_weights\": [1.25, 0]}\n",
     "jsonl", 1, "topk_weights[0]", "> 1"},
    {"gate_overflow",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [1, 2], "
     "\"topk_weights\": [1e99, 0]}\n",
     "jsonl", 1, "topk_weights[0]", "not finite"},
    {"expert_id_too_large",
     OK1 "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 1, "
         "\"topk_ids\": [8, 2], \"topk_weights\": [0.5, 0.5]}\n",
     "jsonl", 2, "topk_ids[0]", "expert id 8 >= 8 experts"},
    {"wrong_k",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [1, 2, 3], "
     "\"topk_weights\": [0.5, 0.25, 0.25]}\n",
     "jsonl", 1, "topk_ids", "3 expert ids, expected top_k = 2"},
    {"gate_count_mismatch",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": "
     "[1, 2], \"topk_weights\": [1]}\n",
     "jsonl", 1, "topk_weights", "1 gate weights for 2 expert ids"},
    {"repeated_expert",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [2, 2], "
     "\"topk_weights\": [0.5, 0.5]}\n",
     "jsonl", 1, "topk_ids[1]", "appears twice"},
    {"duplicate_record", OK1 OK2 OK1, "jsonl", 3, "layer",
     "second record for layer 0 of token_idx 0 of request 'a' (first at line 1)"},
    {"duplicate_layer", OK1 OK1, "jsonl", 2, "layer", "second record for layer 0"},
    {"layer_out_of_range",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 32, \"topk_ids\": "
     "[1, 2], \"topk_weights\": [0.5, 0.5]}\n",
     "jsonl", 1, "layer", "layer 32 >= 32 MoE layers"},
    {"missing_layer_key",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"topk_ids\": [1, 2], "
     "\"topk_weights\": [0.5, 0.5]}\n",
     "jsonl", 1, "layer", "missing key"},
    {"duplicate_key", "{\"req_id\": \"a\", \"layer\": 0, \"layer\": 1}\n", "jsonl", 1, "layer",
     "appears twice"},
    {"mixed_shapes_in_record",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"experts\": "
     "[1, 2], \"gating_probs\": [0.5, 0.5]}\n",
     "jsonl", 1, "req_id", "request shape"},
    {"shape_changes_midway",
     OK1 "{\"problem_id\": 0, \"token_idx\": 0, \"layer\": 1, "
         "\"experts\": [1, 2], \"gating_probs\": [0.5, 0.5]}\n",
     "jsonl", 2, "problem_id", "file of the request shape (line 1)"},
    {"no_request_key", "{\"token_idx\": 0, \"layer\": 0}\n", "jsonl", 1, "record",
     "cannot tell the shape"},
    {"negative_token_idx", "{\"req_id\": \"a\", \"token_idx\": -1}\n", "jsonl", 1, "token_idx",
     "non-negative integer"},
    {"fractional_token_idx", "{\"req_id\": \"a\", \"token_idx\": 1.5}\n", "jsonl", 1, "token_idx",
     "expected an integer"},
    {"leading_zero", "{\"req_id\": \"a\", \"token_idx\": 01}\n", "jsonl", 1, "token_idx",
     "leading zero"},
    {"layer_as_string", "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": \"0\"}\n", "jsonl", 1,
     "layer", "non-negative integer"},
    {"ids_not_an_array", "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": 1}\n",
     "jsonl", 1, "topk_ids", "expected an array"},
    {"fractional_expert_id", "{\"req_id\": \"a\", \"topk_ids\": [1, 2.0]}\n", "jsonl", 1,
     "topk_ids[1]", "expected an integer"},
    {"bad_phase", "{\"req_id\": \"a\", \"phase\": \"warmup\"}\n", "jsonl", 1, "phase",
     "\"prefill\" or \"decode\""},
    {"phase_on_some_records",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"phase\": "
     "\"decode\", \"topk_ids\": [1, 2], \"topk_weights\": [0.5, 0.5]}\n" OK2,
     "jsonl", 2, "phase", "missing"},
    {"prefill_after_decode",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"phase\": \"decode\", \"topk_ids\": "
     "[1, 2], \"topk_weights\": [0.5, 0.5]}\n"
     "{\"req_id\": \"a\", \"token_idx\": 1, \"layer\": 0, \"phase\": \"prefill\", \"topk_ids\": "
     "[1, 2], \"topk_weights\": [0.5, 0.5]}\n",
     "jsonl", 2, "phase", "prefill token_idx 1 after a decode token"},
    {"gate_sum_off",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [1, 2], "
     "\"topk_weights\": [0.3, 0.3]}\n",
     "jsonl", 1, "topk_weights", "sum to 0.6"},
    {"invalid_escape", "{\"req_id\": \"a\\q\"}\n", "jsonl", 1, "req_id", "invalid escape"},
    {"control_character", "{\"req_id\": \"a\tb\"}\n", "jsonl", 1, "req_id", "control character"},
    {"invalid_utf8", "{\"req_id\": \"\xC3\x28\"}\n", "jsonl", 1, "req_id", "invalid UTF-8"},
    {"lone_surrogate", "{\"req_id\": \"\\udc00\"}\n", "jsonl", 1, "req_id", "surrogate"},
    {"two_objects_on_a_line", "{\"req_id\": \"a\"} {\"req_id\": \"b\"}\n", "jsonl", 1, "record",
     "after the object"},
    {"unterminated_string", "{\"req_id\": \"a}\n", "jsonl", 1, "req_id", "unterminated string"},
    {"too_deep",
     "{\"req_id\": \"a\", \"x\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
     "[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
     "]]]]]]]}\n",
     "jsonl", 1, "x", "deeper than 64"},
    {"too_deep_under_a_long_unknown_key",
     "{\"req_id\": \"a\", \"an_unknown_key_longer_than_forty_bytes_abcdefgh\": "
     "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]"
     "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}\n",
     "jsonl", 1, "an_unknown_key_longer_than_forty_bytes_a...", "deeper than 64"},
    {"nul_byte", "{\"req_id\": \"a\", \0}\n", "jsonl", 1, "line",
     "a NUL byte at column 17 (expected text)"},
    {"request_id_too_long",
     "{\"req_id\": "
     "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}\n",
     "jsonl", 1, "req_id", "longer than 120 bytes"},
    {"control_character_in_a_name_is_shown_as_a_question_mark",
     "{\"req_id\": \"a\\nb\", \"token_idx\": 1, \"layer\": 0, \"topk_ids\": [1, 2], "
     "\"topk_weights\": [0.5, 0.5]}\n"
     "{\"req_id\": \"a\\nb\", \"token_idx\": 1, \"layer\": 0, \"topk_ids\": [1, 2], "
     "\"topk_weights\": [0.5, 0.5]}\n",
     "jsonl", 2, "layer", "of request 'a?b'"},
    {"per_token_record_with_a_layer_key",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [[1, 2]], "
     "\"topk_weights\": [[0.5, 0.5]]}\n",
     "jsonl", 1, "layer", "holds every layer; 'layer' does not apply"},
    {"per_token_record_with_flat_gates",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"topk_ids\": [[1, 2], [3, 4]], "
     "\"topk_weights\": [0.5, 0.5]}\n",
     "jsonl", 1, "topk_weights", "0 arrays for the 2 layers of 'topk_ids'"},
    {"per_token_record_with_fewer_gate_arrays",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"topk_ids\": [[1, 2], [3, 4]], "
     "\"topk_weights\": [[0.5, 0.5]]}\n",
     "jsonl", 1, "topk_weights", "1 arrays for the 2 layers"},
    {"flat_ids_with_per_layer_gates",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"topk_ids\": [1, 2], "
     "\"topk_weights\": [[0.5, 0.5]]}\n",
     "jsonl", 1, "topk_weights", "one array per layer, but 'topk_ids' holds one layer's ids"},
    {"per_token_record_with_a_short_layer",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"topk_ids\": [[1, 2], [3]], "
     "\"topk_weights\": [[0.5, 0.5], [1]]}\n",
     "jsonl", 1, "topk_ids[1]", "1 expert ids, expected top_k = 2"},
    {"per_token_record_with_a_bad_id",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"topk_ids\": [[1, 2], [3, 9]], "
     "\"topk_weights\": [[0.5, 0.5], [0.5, 0.5]]}\n",
     "jsonl", 1, "topk_ids[1][1]", "expert id 9 >= 8 experts"},
    {"per_token_record_twice",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"topk_ids\": [[1, 2], [3, 4]], "
     "\"topk_weights\": [[0.5, 0.5], [0.5, 0.5]]}\n" OK2
     "{\"req_id\": \"a\", \"token_idx\": 0, \"topk_ids\": [[1, 2]], "
     "\"topk_weights\": [[0.5, 0.5]]}\n",
     "jsonl", 3, "topk_ids",
     "second record for layer 0 of token_idx 0 of request 'a' (first at "
     "line 1)"},
    {"phases_disagree_within_a_token",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"phase\": \"prefill\", \"topk_ids\": "
     "[1, 2], \"topk_weights\": [0.5, 0.5]}\n"
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 1, \"phase\": \"decode\", \"topk_ids\": "
     "[1, 2], \"topk_weights\": [0.5, 0.5]}\n",
     "jsonl", 2, "phase",
     "'decode', but the record of token_idx 0 of request 'a' at line 1 says "
     "'prefill'"},
    {"prompt_lengths_disagree_within_a_request",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"prompt_len\": 4, \"topk_ids\": "
     "[1, 2], \"topk_weights\": [0.5, 0.5]}\n"
     "{\"req_id\": \"a\", \"token_idx\": 1, \"layer\": 0, \"prompt_len\": 5, \"topk_ids\": "
     "[1, 2], \"topk_weights\": [0.5, 0.5]}\n",
     "jsonl", 2, "prompt_len", "5, but line 1 gives 4 for request 'a'"},
    {"prompt_length_on_some_records",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"prompt_len\": 4, \"topk_ids\": "
     "[1, 2], \"topk_weights\": [0.5, 0.5]}\n" OK2,
     "jsonl", 2, "prompt_len", "missing, but the records before it (line 1) carry it"},
    {"phase_against_the_prompt_length",
     "{\"req_id\": \"a\", \"token_idx\": 0, \"layer\": 0, \"prompt_len\": 1, \"phase\": "
     "\"prefill\", \"topk_ids\": [1, 2], \"topk_weights\": [0.5, 0.5]}\n"
     "{\"req_id\": \"a\", \"token_idx\": 1, \"layer\": 0, \"prompt_len\": 1, \"phase\": "
     "\"prefill\", \"topk_ids\": [1, 2], \"topk_weights\": [0.5, 0.5]}\n",
     "jsonl", 2, "phase", "'prefill' for token_idx 1 of request 'a', whose prompt has 1 tokens"},
    {"csv_wrong_header", "request_id,position,phase,layer,expert_0,expert_1,gate_0,weight_1\n",
     "csv", 1, "header", "column 8 is 'weight_1', expected 'gate_1'"},
    {"csv_bad_gate",
     "request_id,position,phase,layer,expert_0,expert_1,gate_0,gate_1\n0,0,decode,0,1,2,0.5,x\n",
     "csv", 2, "gate_1", "expected a number"},
    {"csv_missing_column",
     "request_id,position,phase,layer,expert_0,expert_1,gate_0,gate_1\n0,0,decode,0,1,2,0.5\n",
     "csv", 2, "row", "7 columns, expected 8"},
};

/* Bytes of a corpus text: "nul_byte" holds a NUL, so its length is counted to the last '\n'. */
static size_t case_length(const bad_case *c) {
    if (strcmp(c->name, "nul_byte")) return strlen(c->text);
    return sizeof("{\"req_id\": \"a\", \0}\n") - 1;
}

Test(trace_import, every_malformed_input_gives_file_line_field_exit_2_and_no_output) {
    cr_assert_geq(sizeof corpus / sizeof corpus[0], 20);
    model_geometry m = load_model("mixtral-8x7b");
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++) {
        const bad_case *c = &corpus[i];
        char in[4096], out_h5[4096], want[4600];
        snprintf(in, sizeof in, "%s", test_tmp_path(c->name));
        snprintf(out_h5, sizeof out_h5, "%s.h5", in);
        test_write_bytes(in, c->text, case_length(c));
        /* the field name and its ':' so that "x" does not match "xeq_id" */
        snprintf(want, sizeof want, "%s:%d: %s:", in, c->line, c->field);

        static char out[4096], errb[4096];
        int rc = test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--format",
                                 c->format, "--model", "mixtral-8x7b", in, "-o", out_h5, NULL);
        cr_assert_eq(rc, 2, "%s: exit %d, stderr: %s", c->name, rc, errb);
        cr_assert(strstr(errb, want), "%s: expected '%s' in: %s", c->name, want, errb);
        cr_assert(strstr(errb, c->says), "%s: expected '%s' in: %s", c->name, c->says, errb);
        char *nl = strchr(errb, '\n');
        cr_assert(nl && nl[1] == '\0', "%s: not one line: %s", c->name, errb);
        cr_assert_eq(out[0], '\0', "%s: stdout not empty", c->name);
        cr_assert(!test_file_exists(out_h5), "%s: output written", c->name);

        /* in process: the same message, nothing returned, nothing leaked */
        trace_import_options o = defaults();
        o.format = strcmp(c->format, "csv") ? TRACE_TEXT_JSONL : TRACE_TEXT_CSV;
        trace *t = (trace *)&o; /* must be reset to NULL */
        trace_import_report rep;
        moesim_error err = {0};
        cr_assert_eq(trace_import_file(in, &m, &o, &t, &rep, &err), MOESIM_EINPUT, "%s", c->name);
        cr_assert_null(t);
        cr_assert(strstr(err.msg, want), "%s: %s", c->name, err.msg);
    }
}

Test(trace_import, empty_inputs_and_bad_command_lines_exit_2) {
    static char out[4096], errb[4096];
    char in[4096], h5[4096];
    snprintf(in, sizeof in, "%s", test_tmp_path("empty.jsonl"));
    snprintf(h5, sizeof h5, "%s", test_tmp_path("empty.h5"));
    test_write_file(in, "\n  \n");
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--model",
                                 "mixtral-8x7b", in, "-o", h5, NULL),
                 2);
    cr_assert(strstr(errb, "empty.jsonl: no records (2 lines read)"), "%s", errb);
    cr_assert(!test_file_exists(h5));
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--model",
                                 "mixtral-8x7b", "/nonexistent/x.jsonl", "-o", h5, NULL),
                 2);
    cr_assert(strstr(errb, "/nonexistent/x.jsonl: cannot open"), "%s", errb);
    cr_assert_eq(
        test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", in, "-o", h5, NULL),
        2);
    cr_assert(strstr(errb, "missing --model"), "%s", errb);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--model",
                                 "no-such-model", in, "-o", h5, NULL),
                 2);
    cr_assert(strstr(errb, "no-such-model"), "%s", errb);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--model",
                                 "mixtral-8x7b", "--incomplete", "maybe", in, "-o", h5, NULL),
                 2);
    cr_assert(strstr(errb, "--incomplete: expected keep or drop"), "%s", errb);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--model",
                                 "mixtral-8x7b", "--tokens-per-request", "4", in, "-o", h5, NULL),
                 2);
    cr_assert(strstr(errb, "--tokens-per-request applies to per-layer dense scores"), "%s", errb);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--model",
                                 "mixtral-8x7b", "--constant-run-min", "1", in, "-o", h5, NULL),
                 2);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "export", in, NULL),
                 2);
    cr_assert(strstr(errb, "missing --format"), "%s", errb);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "export", "--format",
                                 "xml", in, NULL),
                 2);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "export", "--format",
                                 "csv", in, "-o", h5, NULL),
                 2);
    cr_assert(strstr(errb, "empty.jsonl"), "%s", errb);
    cr_assert(!test_file_exists(h5));
    cr_assert_eq(
        test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--help", NULL), 0);
    cr_assert(strstr(out, "--incomplete keep|drop"));
    cr_assert_eq(
        test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "export", "--help", NULL), 0);
}

/* ---- record order -------------------------------------------------------------------------- */

/* The Mixtral problem-shape record of (problem p, token i, layer l), routing derived from them. */
static void problem_rec(FILE *fp, unsigned p, unsigned i, unsigned l) {
    unsigned a = (p * 5 + i + l) % 8, b = (p + 3 * i + 2 * l + 1) % 8;
    if (b == a) b = (a + 1) % 8;
    fprintf(fp,
            "{\"dataset\": \"humaneval\", \"problem_id\": %u, \"token_idx\": %u, \"layer\": %u, "
            "\"experts\": [%u, %u], \"gating_probs\": [%.9g, %.9g]}\n",
            p, i, l, a, b, 0.5 + 0.0625 * ((i * 7 + l) % 8), 0.5 - 0.0625 * ((i * 7 + l) % 8));
}

static const unsigned order_tokens[3] = {90, 7, 131}; /* tokens of problems 0, 1, 2 */

/* A layer-major log (a logger hooked on each layer's router during a forward pass: all tokens
 * of layer 0 of a request, then layer 1, ...) or the same records sorted token-major. */
static char *problem_log(bool layer_major) {
    text t;
    text_open(&t);
    for (unsigned p = 0; p < 3; p++)
        for (unsigned outer = 0; outer < (layer_major ? 32 : order_tokens[p]); outer++)
            for (unsigned inner = 0; inner < (layer_major ? order_tokens[p] : 32); inner++)
                problem_rec(t.fp, p, layer_major ? inner : outer, layer_major ? outer : inner);
    return text_close(&t);
}

Test(trace_import, a_layer_major_log_exports_byte_for_byte_like_the_same_log_sorted_token_major) {
    char logs[2][4096], h5[2][4096], txt[2][4096];
    static char out[1 << 16], errb[4096];
    for (int lm = 0; lm < 2; lm++) {
        snprintf(logs[lm], sizeof logs[lm], "%s", test_tmp_path(lm ? "lm.jsonl" : "tm.jsonl"));
        snprintf(h5[lm], sizeof h5[lm], "%s", test_tmp_path(lm ? "lm.h5" : "tm.h5"));
        snprintf(txt[lm], sizeof txt[lm], "%s", test_tmp_path(lm ? "lm-x.jsonl" : "tm-x.jsonl"));
        char *s = problem_log(lm);
        test_write_file(logs[lm], s);
        free(s);
        cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import",
                                     "--model", "mixtral-8x7b", "--prefill-tokens", "20", logs[lm],
                                     "-o", h5[lm], "--json", NULL),
                     0, "%s", errb);
        json_error_t jerr;
        json_t *j = json_loads(out, 0, &jerr);
        cr_assert(j, "%s", jerr.text);
        cr_assert_eq(json_integer_value(json_object_get(j, "tokens_kept")), 90 + 7 + 131);
        /* a token-major file never goes back to an earlier token; a layer-major one does for
         * every record after layer 0 but those of each request's newest token */
        cr_assert_eq(json_integer_value(json_object_get(j, "records_reordered")),
                     lm ? (90 + 7 + 131 - 3) * 31 : 0);
        json_decref(j);
        cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "export",
                                     "--format", "jsonl", h5[lm], "-o", txt[lm], NULL),
                     0, "%s", errb);
    }
    char *a = slurp(txt[0]), *b = slurp(txt[1]);
    cr_assert_gt(strlen(a), 0);
    cr_assert_str_eq(a, b, "the exports differ");
    free(a);
    free(b);
    trace *ta = NULL, *tb = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_read(h5[0], &ta, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_read(h5[1], &tb, &err), MOESIM_OK, "%s", err.msg);
    assert_same_arrays(ta, tb);
    /* and the trace is the log: problem 2's token 100, layer 7 */
    uint64_t i = 90 + 7 + 100;
    cr_assert_eq(ta->request_id[i], 2);
    cr_assert_eq(ta->position[i], 100);
    cr_assert_eq(ta->phase[i], TRACE_DECODE);
    cr_assert_eq(ta->phase[90 + 7 + 19], TRACE_PREFILL);
    cr_assert_eq(trace_experts(ta, i, 7)[0], (2 * 5 + 100 + 7) % 8);
    trace_destroy(ta);
    trace_destroy(tb);
}

/* The trace of one request, by its name in the file: positions and routing rows. */
static void assert_same_request(const trace *a, uint32_t qa, const trace *b, uint32_t qb) {
    uint64_t i = 0, j = 0, n = 0;
    const size_t row = trace_route_values(&a->meta);
    for (;; n++) {
        while (i < a->n_tokens && a->request_id[i] != qa) i++;
        while (j < b->n_tokens && b->request_id[j] != qb) j++;
        cr_assert_eq(i < a->n_tokens, j < b->n_tokens, "request lengths differ");
        if (i == a->n_tokens) break;
        cr_assert_eq(a->position[i], b->position[j]);
        cr_assert_eq(a->phase[i], b->phase[j]);
        cr_assert(!memcmp(a->expert_ids + i * row, b->expert_ids + j * row, row * 2));
        cr_assert(!memcmp(a->gate_weights + i * row, b->gate_weights + j * row, row * 4));
        i++;
        j++;
    }
    cr_assert_gt(n, 0);
}

Test(trace_import, records_in_any_order_group_by_request_and_token_in_position_order) {
    /* the token-major log, its lines shuffled */
    char *sorted = problem_log(false);
    size_t n_lines = 0, cap = 0;
    char **lines = NULL;
    for (char *p = sorted, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
        if (n_lines == cap) lines = realloc(lines, (cap = cap ? 2 * cap : 1024) * sizeof *lines);
        lines[n_lines++] = p;
        *nl = '\0';
    }
    rng *r = rng_create(5);
    for (size_t i = n_lines - 1; i > 0; i--) {
        size_t j = rng_below(r, i + 1);
        char *tmp = lines[i];
        lines[i] = lines[j];
        lines[j] = tmp;
    }
    rng_destroy(r);
    text t;
    text_open(&t);
    for (size_t i = 0; i < n_lines; i++) fprintf(t.fp, "%s\n", lines[i]);
    char *shuffled = text_close(&t);
    free(lines);
    free(sorted);
    sorted = problem_log(false);

    trace_import_options o = defaults();
    o.prefill_tokens = 20;
    o.prefill_tokens_set = true;
    trace *a = NULL, *b = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("sorted.jsonl", sorted, "mixtral-8x7b", &o, &a, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(import_text("shuffled.jsonl", shuffled, "mixtral-8x7b", &o, &b, &rep, &err),
                 MOESIM_OK, "%s", err.msg);
    cr_assert_eq(b->n_tokens, a->n_tokens);
    cr_assert_eq(rep.tokens_incomplete, 0);
    cr_assert_gt(rep.records_reordered, 0);
    /* same requests, each with the same tokens in position order; request numbers follow the
     * first appearance, and the trace interleaves requests where the shuffled file did */
    char first[3] = {0};
    uint32_t number[3], seen = 0;
    for (size_t i = 0; shuffled[i] && seen < 3;) {
        const char *pid = strstr(shuffled + i, "\"problem_id\": ");
        unsigned p = (unsigned)(pid[14] - '0');
        if (!first[p]) {
            first[p] = 1;
            number[p] = seen++;
        }
        i = (size_t)(strchr(pid, '\n') - shuffled) + 1;
    }
    for (uint32_t p = 0; p < 3; p++) assert_same_request(a, p, b, number[p]);
    bool interleaved = false;
    for (uint64_t i = 1; i < b->n_tokens; i++)
        interleaved |= b->request_id[i] != b->request_id[i - 1] && b->request_id[i] < 2 &&
                       b->request_id[i - 1] < 2 && i > 1;
    cr_assert(interleaved, "the shuffled log's requests should interleave in the trace");
    trace_destroy(a);
    trace_destroy(b);
    free(sorted);
    free(shuffled);
}

Test(trace_import, a_request_keeps_its_slots_and_fills_them_in_position_order) {
    /* r0 token 2, r0 token 0, r1 token 0, r0 token 1 (per-step log, positions out of order) */
    text t;
    text_open(&t);
    token32(&t, "r0", 2, 2);
    token32(&t, "r0", 0, 0);
    token32(&t, "r1", 0, 9);
    token32(&t, "r0", 1, 1);
    char *s = text_close(&t);
    trace_import_options o = defaults();
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("slots.jsonl", s, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_OK,
                 "%s", err.msg);
    uint32_t want_req[4] = {0, 0, 1, 0}, want_pos[4] = {0, 1, 0, 2}, want_seed[4] = {0, 1, 9, 2};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(tr->request_id[i], want_req[i], "token %d", i);
        cr_assert_eq(tr->position[i], want_pos[i], "token %d", i);
        cr_assert_eq(trace_experts(tr, i, 5)[0], (want_seed[i] + 5) % 8, "token %d", i);
    }
    trace_destroy(tr);
    free(s);
}

Test(trace_import, a_duplicate_far_from_its_first_copy_names_both_lines) {
    char *s = problem_log(true);
    text t;
    text_open(&t);
    fputs(s, t.fp);
    problem_rec(t.fp, 1, 3, 30); /* line 90*32 + 7*32 + 131*32 + 1; first at 90*32 + 7*30 + 4 */
    char *dup = text_close(&t);
    free(s);
    trace_import_options o = defaults();
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(import_text("dup.jsonl", dup, "mixtral-8x7b", &o, &tr, &rep, &err), MOESIM_EINPUT);
    cr_assert_null(tr);
    char want[160];
    snprintf(want, sizeof want,
             "dup.jsonl:%u: layer: second record for layer 30 of token_idx 3 of request "
             "'humaneval/1' (first at line %u): duplicates are errors",
             (90 + 7 + 131) * 32 + 1, 90 * 32 + 7 * 30 + 4);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    free(dup);
}

/* ---- per-token records and arrays (tests/fixtures/import, make_fixtures.py) ---------------- */

static const char *fixture(const char *name) {
    static char path[4][4096];
    static int slot;
    slot = (slot + 1) % 4;
    snprintf(path[slot], sizeof path[slot], "%s/tests/fixtures/import/%s", MOESIM_SOURCE_DIR, name);
    return path[slot];
}

/* make_fixtures.py's routing of array row t, layer l */
static void fixture_routing(uint32_t t, uint32_t l, uint16_t ids[2], float gates[2]) {
    ids[0] = (uint16_t)((t + l) % 8);
    ids[1] = (uint16_t)((t + 3 * l + 1) % 8);
    if (ids[1] == ids[0]) ids[1] = (uint16_t)((ids[0] + 1) % 8);
    gates[0] = 0.5f + 0.125f * (float)((7 * t + l) % 3);
    gates[1] = 1.0f - gates[0];
}

static void assert_fixture_routing(const trace *tr) {
    cr_assert_eq(tr->n_tokens, 9);
    for (uint32_t t = 0; t < 9; t++)
        for (uint32_t l = 0; l < 32; l++) {
            uint16_t ids[2];
            float g[2];
            fixture_routing(t, l, ids, g);
            for (int j = 0; j < 2; j++) {
                cr_assert_eq(trace_experts(tr, t, l)[j], ids[j], "token %u layer %u", t, l);
                cr_assert_eq(trace_gates(tr, t, l)[j], g[j], "token %u layer %u", t, l);
            }
        }
}

static trace *import_fixture(const char *name, trace_text_format f, const char *weights,
                             const char *requests, trace_import_report *rep) {
    model_geometry m = load_model("mixtral-8x7b");
    trace_import_options o = defaults();
    o.format = f;
    o.weights_path = weights ? fixture(weights) : NULL;
    o.requests_path = requests ? fixture(requests) : NULL;
    trace *tr = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_import_file(fixture(name), &m, &o, &tr, rep, &err), MOESIM_OK, "%s: %s",
                 name, err.msg);
    return tr;
}

Test(trace_import, per_token_records_of_both_shapes_carry_every_layer_and_their_phases) {
    trace_import_report rep;
    trace *a = import_fixture("per_token_request.jsonl", TRACE_TEXT_JSONL, NULL, NULL, &rep);
    cr_assert_str_eq(rep.schema, "request");
    cr_assert_eq(rep.records, 9 * 32);
    cr_assert_str_eq(rep.phase_source, "prompt_len of the records");
    assert_fixture_routing(a);
    /* rows r0 r0 r0 r1 r1 r0 r1 r0 r1; prompts of 3 and 2 tokens */
    uint32_t want_req[9] = {0, 0, 0, 1, 1, 0, 1, 0, 1}, want_pos[9] = {0, 1, 2, 0, 1, 3, 2, 4, 3};
    for (int i = 0; i < 9; i++) {
        cr_assert_eq(a->request_id[i], want_req[i], "token %d", i);
        cr_assert_eq(a->position[i], want_pos[i], "token %d", i);
        cr_assert_eq(a->phase[i],
                     want_pos[i] < (want_req[i] ? 2u : 3u) ? TRACE_PREFILL : TRACE_DECODE);
    }
    trace *b = import_fixture("per_token_problem.jsonl", TRACE_TEXT_JSONL, NULL, NULL, &rep);
    cr_assert_str_eq(rep.schema, "problem");
    cr_assert_str_eq(rep.phase_source, "records");
    assert_same_arrays(a, b);
    trace_destroy(a);
    trace_destroy(b);
}

Test(trace_import, npz_arrays_with_seq_lens_and_prompt_lens_import_as_blocks_of_requests) {
    trace_import_report rep;
    trace *a = import_fixture("routes.npz", TRACE_TEXT_NPZ, NULL, NULL, &rep);
    cr_assert_str_eq(rep.schema, "npz");
    cr_assert_str_eq(rep.requests_source, "seq_lens");
    cr_assert_str_eq(rep.phase_source, "prompt_lens");
    cr_assert_str_eq(a->meta.source, "import:npz");
    assert_fixture_routing(a);
    for (uint32_t i = 0; i < 9; i++) {
        uint32_t q = i >= 5, pos = q ? i - 5 : i;
        cr_assert_eq(a->request_id[i], q);
        cr_assert_eq(a->position[i], pos);
        cr_assert_eq(a->phase[i], pos < (q ? 2u : 3u) ? TRACE_PREFILL : TRACE_DECODE);
    }
    /* the same arrays as two .npy files (int32 ids, float64 weights) and a side file */
    trace *b = import_fixture("ids.npy", TRACE_TEXT_NPY, "weights.npy", "requests.csv", &rep);
    cr_assert_str_eq(rep.requests_source, "--requests");
    cr_assert_str_eq(rep.phase_source, "prompt_tokens of --requests");
    assert_same_arrays(a, b);
    trace_destroy(a);
    trace_destroy(b);
}

Test(trace_import, compressed_npz_with_a_request_column_imports_like_the_per_token_log) {
    trace_import_report rep;
    /* deflated members, routed_experts int32, float16 weights, request_id 7/8 interleaved */
    trace *a = import_fixture("routes_compressed.npz", TRACE_TEXT_NPZ, NULL, NULL, &rep);
    cr_assert_str_eq(rep.requests_source, "request_id column");
    trace *b = import_fixture("per_token_request.jsonl", TRACE_TEXT_JSONL, NULL, NULL, &rep);
    size_t n = 9, rv = n * trace_route_values(&a->meta);
    cr_assert(!memcmp(a->request_id, b->request_id, n * sizeof *a->request_id));
    cr_assert(!memcmp(a->position, b->position, n * sizeof *a->position));
    cr_assert(!memcmp(a->expert_ids, b->expert_ids, rv * sizeof *a->expert_ids));
    cr_assert(!memcmp(a->gate_weights, b->gate_weights, rv * sizeof *a->gate_weights));
    for (int i = 0; i < 9; i++) cr_assert_eq(a->phase[i], TRACE_DECODE); /* no prompt lengths */
    trace_destroy(a);
    trace_destroy(b);
}

/* ---- malformed arrays ---------------------------------------------------------------------- */

/* An .npy of `descr` and `shape` (numpy's header text) holding data[0..len). */
static size_t npy_make(unsigned char *out, const char *descr, const char *fortran,
                       const char *shape, const void *data, size_t len) {
    char header[256];
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }",
                     descr, fortran, shape);
    int pad = 64 - (10 + n + 1) % 64;
    memset(header + n, ' ', (size_t)pad);
    header[n + pad] = '\n';
    size_t hlen = (size_t)(n + pad + 1);
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (unsigned char)(hlen & 0xFF);
    out[9] = (unsigned char)(hlen >> 8);
    memcpy(out + 10, header, hlen);
    memcpy(out + 10 + hlen, data, len);
    return 10 + hlen + len;
}

/* One token of Mixtral routing as i8 ids and f4 gates. */
static int64_t good_ids[32 * 2];
static float good_gates[32 * 2];
static void good_token(void) {
    for (uint32_t l = 0; l < 32; l++) {
        uint16_t ids[2];
        float g[2];
        fixture_routing(0, l, ids, g);
        for (int j = 0; j < 2; j++) {
            good_ids[l * 2 + j] = ids[j];
            good_gates[l * 2 + j] = g[j];
        }
    }
}

typedef struct bad_npy {
    const char *name;
    const char *ids_descr, *ids_fortran, *ids_shape; /* NULL: the good one */
    size_t ids_cut;                                  /* bytes left out at the end */
    int bad_id_at;                                   /* >= 0: set that id to bad_id */
    int64_t bad_id;
    int bad_gate_at;
    float bad_gate;
    const char *says; /* the message must contain this */
} bad_npy;

static const bad_npy npy_corpus[] = {
    {"fortran_order", NULL, "True", NULL, 0, -1, 0, -1, 0, "fortran_order is not False"},
    {"fortran_order_falsey", NULL, "Falsey", NULL, 0, -1, 0, -1, 0, "fortran_order is not False"},
    {"extra_key", NULL, "False, 'extra_shape': (1,)", NULL, 0, -1, 0, -1, 0,
     "header: a key other than 'descr', 'fortran_order' and 'shape'"},
    {"repeated_key", NULL, "False, 'shape': (9, 32, 2)", NULL, 0, -1, 0, -1, 0,
     "header: a key given twice"},
    {"negative_shape", NULL, NULL, "(-1, 32, 2)", 0, -1, 0, -1, 0,
     "'shape': expected at most 4 non-negative integers"},
    {"big_endian", ">i8", NULL, NULL, 0, -1, 0, -1, 0, "dtype '>i8'"},
    {"float_ids_with_weights", "<f8", NULL, NULL, 0, -1, 0, -1, 0,
     "floats: router logits [tokens][layers][experts], which give the gates; --weights does not "
     "apply"},
    {"wrong_top_k", NULL, NULL, "(2, 32, 1)", 0, -1, 0, -1, 0,
     "shape [2][32][1]: expected [tokens >= 1][32 MoE layers][top_k = 2]"},
    {"wrong_layers", NULL, NULL, "(2, 16, 2)", 0, -1, 0, -1, 0, "shape [2][16][2]"},
    {"truncated", NULL, NULL, NULL, 8, -1, 0, -1, 0, "truncated or trailing data"},
    {"negative_id", NULL, NULL, NULL, 0, 5, -1, -1, 0, "[0][2][1]: expert id -1 is negative"},
    {"id_too_large", NULL, NULL, NULL, 0, 6, 8, -1, 0,
     "topk_ids[0][3][0]: expert id 8 >= 8 experts"},
    {"gate_sum_off", NULL, NULL, NULL, 0, -1, 0, 9, 0.125f,
     "bad_weights.npy: topk_weights[0][4]: gate weights sum"},
    {"nan_gate", NULL, NULL, NULL, 0, -1, 0, 9, NAN,
     "bad_weights.npy: topk_weights[0][4][1]: gate weight is not finite"},
};

Test(trace_import, malformed_arrays_give_one_line_naming_file_and_index_exit_2) {
    good_token();
    static unsigned char ids[4096], gates[4096];
    static char out[4096], errb[4096];
    char ids_path[4096], gates_path[4096], h5[4096];
    for (size_t c = 0; c < sizeof npy_corpus / sizeof npy_corpus[0]; c++) {
        const bad_npy *b = &npy_corpus[c];
        int64_t id_data[64];
        float gate_data[64];
        memcpy(id_data, good_ids, sizeof id_data);
        memcpy(gate_data, good_gates, sizeof gate_data);
        if (b->bad_id_at >= 0) id_data[b->bad_id_at] = b->bad_id;
        if (b->bad_gate_at >= 0) gate_data[b->bad_gate_at] = b->bad_gate;
        size_t ni = npy_make(ids, b->ids_descr ? b->ids_descr : "<i8",
                             b->ids_fortran ? b->ids_fortran : "False",
                             b->ids_shape ? b->ids_shape : "(1, 32, 2)", id_data, sizeof id_data);
        size_t ng = npy_make(gates, "<f4", "False", "(1, 32, 2)", gate_data, sizeof gate_data);
        snprintf(ids_path, sizeof ids_path, "%s", test_tmp_path("bad_ids.npy"));
        snprintf(gates_path, sizeof gates_path, "%s", test_tmp_path("bad_weights.npy"));
        snprintf(h5, sizeof h5, "%s", test_tmp_path("bad.h5"));
        test_write_bytes(ids_path, ids, ni - b->ids_cut);
        test_write_bytes(gates_path, gates, ng);
        int rc = test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--format",
                                 "npy", "--model", "mixtral-8x7b", ids_path, "--weights",
                                 gates_path, "-o", h5, NULL);
        cr_assert_eq(rc, 2, "%s: exit %d: %s", b->name, rc, errb);
        cr_assert(strstr(errb, "bad_ids.npy") || strstr(errb, "bad_weights.npy"), "%s: %s", b->name,
                  errb);
        cr_assert(strstr(errb, b->says), "%s: expected '%s' in: %s", b->name, b->says, errb);
        char *nl = strchr(errb, '\n');
        cr_assert(nl && nl[1] == '\0', "%s: not one line: %s", b->name, errb);
        cr_assert(!test_file_exists(h5), "%s: output written", b->name);
    }
}

/* Copies a fixture to a scratch file, with byte `at` (from the end when negative) xor-ed. */
static const char *damaged_copy(const char *name, long at, unsigned char x) {
    char *s = NULL;
    FILE *fp = fopen(fixture(name), "rb");
    cr_assert(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    s = malloc((size_t)n);
    cr_assert_eq(fread(s, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    s[at < 0 ? n + at : at] ^= (char)x;
    const char *path = test_tmp_path(name);
    test_write_bytes(path, s, (size_t)n);
    free(s);
    return path;
}

Test(trace_import, damaged_npz_files_and_side_files_give_one_line_exit_2) {
    static char out[4096], errb[4096];
    char h5[4096], path[4096], side[4096];
    snprintf(h5, sizeof h5, "%s", test_tmp_path("npz.h5"));
    struct {
        const char *name;
        long at;
        unsigned char x;
        const char *says;
    } cases[] = {
        /* a space of topk_ids' header padding made a newline: parses, but the member's CRC-32
         * fails at its end */
        {"routes.npz", 150, ' ' ^ '\n', "routes.npz: topk_ids.npy: CRC-32"},
        /* the same byte made a letter: text after the header's dict, which np.load refuses */
        {"routes.npz", 150, 0x41, "routes.npz: topk_ids.npy: header: text after the dict"},
        /* the end-of-central-directory signature */
        {"routes.npz", -22, 0x41, "routes.npz: not a zip file"},
        /* deflated data of the first member */
        {"routes_compressed.npz", 120, 0x41, "routes_compressed.npz: routed_experts.npy: "},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        snprintf(path, sizeof path, "%s", damaged_copy(cases[c].name, cases[c].at, cases[c].x));
        int rc = test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--format",
                                 "npz", "--model", "mixtral-8x7b", path, "-o", h5, NULL);
        cr_assert_eq(rc, 2, "case %zu: exit %d: %s", c, rc, errb);
        cr_assert(strstr(errb, cases[c].says), "case %zu: expected '%s' in: %s", c, cases[c].says,
                  errb);
        char *nl = strchr(errb, '\n');
        cr_assert(nl && nl[1] == '\0', "case %zu: not one line: %s", c, errb);
        cr_assert(!test_file_exists(h5));
    }
    /* a central directory that claims 2 GB for a member of a few hundred deflated bytes */
    {
        FILE *fp = fopen(fixture("routes_compressed.npz"), "rb");
        cr_assert(fp);
        static unsigned char z[1 << 16];
        size_t n = fread(z, 1, sizeof z, fp);
        fclose(fp);
        unsigned char *cd = NULL; /* the first central directory entry */
        for (size_t i = 0; i + 4 <= n && !cd; i++)
            if (!memcmp(z + i, "PK\x01\x02", 4)) cd = z + i;
        cr_assert(cd);
        cd[27] ^= 0x7F; /* the high byte of the uncompressed size */
        snprintf(path, sizeof path, "%s", test_tmp_path("huge.npz"));
        test_write_bytes(path, z, n);
        int rc = test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--format",
                                 "npz", "--model", "mixtral-8x7b", path, "-o", h5, NULL);
        cr_assert_eq(rc, 2, "exit %d: %s", rc, errb);
        cr_assert(strstr(errb, "huge.npz: routed_experts.npy: ") &&
                      strstr(errb, "(corrupt zip directory)"),
                  "%s", errb);
    }
    /* side files: lengths that do not sum to the arrays, a bad header, a name given twice, a
     * second source */
    struct {
        const char *text, *says;
    } sides[] = {
        {"request,tokens\na,5\nb,3\n", "request lengths sum to 8 tokens, the arrays hold 9"},
        {"name,tokens\na,9\n", "requests.csv:1: header: expected 'request,tokens'"},
        {"request,tokens\na,0\nb,9\n", "requests.csv:2: tokens: expected a count >= 1"},
        {"request,tokens\na,4\nb,2\na,3\n",
         "requests.csv: request 'a' has two rows (one row per request expected)"},
    };
    for (size_t c = 0; c < sizeof sides / sizeof sides[0]; c++) {
        snprintf(side, sizeof side, "%s", test_tmp_path("requests.csv"));
        test_write_file(side, sides[c].text);
        int rc = test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--format",
                                 "npy", "--model", "mixtral-8x7b", fixture("ids.npy"), "--weights",
                                 fixture("weights.npy"), "--requests", side, "-o", h5, NULL);
        cr_assert_eq(rc, 2, "side %zu: exit %d: %s", c, rc, errb);
        cr_assert(strstr(errb, sides[c].says), "side %zu: expected '%s' in: %s", c, sides[c].says,
                  errb);
        cr_assert(!test_file_exists(h5));
    }
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--format",
                                 "npz", "--model", "mixtral-8x7b", fixture("routes.npz"),
                                 "--requests", side, "-o", h5, NULL),
                 2);
    cr_assert(strstr(errb, "seq_lens.npy and --requests"), "%s", errb);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--format",
                                 "npy", "--model", "mixtral-8x7b", fixture("ids.npy"), "-o", h5,
                                 NULL),
                 2);
    cr_assert(strstr(errb, "--format npy needs --weights"), "%s", errb);
}

Test(trace_import, ids_without_weights_need_uniform_gates_and_get_one_over_k) {
    model_geometry m = load_model("mixtral-8x7b");
    trace_import_options o = defaults();
    o.format = TRACE_TEXT_NPZ;
    trace *tr = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    cr_assert_eq(trace_import_file(fixture("routes_ids_only.npz"), &m, &o, &tr, &rep, &err),
                 MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "topk_weights.npy: no such array"), "%s", err.msg);
    o.uniform_gates = true;
    cr_assert_eq(trace_import_file(fixture("routes_ids_only.npz"), &m, &o, &tr, &rep, &err),
                 MOESIM_OK, "%s", err.msg);
    cr_assert_str_eq(rep.gates_source, "uniform 1/k (--uniform-gates)");
    cr_assert(strstr(tr->params_json, "\"gates\":\"uniform 1/k (--uniform-gates)\""), "%s",
              tr->params_json);
    for (uint32_t t = 0; t < 9; t++)
        for (uint32_t l = 0; l < 32; l++) {
            uint16_t ids[2];
            float g[2];
            fixture_routing(t, l, ids, g);
            cr_assert_eq(trace_experts(tr, t, l)[1], ids[1]);
            cr_assert_eq(trace_gates(tr, t, l)[0], 0.5f);
            cr_assert_eq(trace_gates(tr, t, l)[1], 0.5f);
        }
    trace_destroy(tr);
}

Test(trace_import, router_logits_give_the_top_k_and_the_gates_by_the_models_rule) {
    trace_import_report rep;
    /* Mixtral (softmax over the top-k): logits log(g), log(1 - g), -10 elsewhere */
    trace *a = import_fixture("router_logits.npz", TRACE_TEXT_NPZ, NULL, NULL, &rep);
    cr_assert_str_eq(rep.gates_source, "router logits: softmax over the top-k");
    for (uint32_t t = 0; t < 9; t++)
        for (uint32_t l = 0; l < 32; l++) {
            uint16_t ids[2];
            float g[2];
            fixture_routing(t, l, ids, g);
            const uint16_t *got = trace_experts(a, t, l);
            const float *gg = trace_gates(a, t, l);
            /* equal gates tie: the lower expert id comes first */
            int swap = got[0] != ids[0];
            cr_assert(got[0] == ids[swap] && got[1] == ids[!swap], "token %u layer %u", t, l);
            cr_assert(!swap || g[0] == g[1]);
            cr_assert_float_eq(gg[0], g[swap], 1e-6, "token %u layer %u", t, l);
            cr_assert_float_eq(gg[1], g[!swap], 1e-6, "token %u layer %u", t, l);
        }
    trace_destroy(a);

    /* Qwen1.5-MoE (softmax over all 60 experts): logits 1 for four experts, 0 elsewhere */
    model_geometry m = load_model("qwen1.5-moe-a2.7b");
    static float z[24 * 60];
    for (uint32_t l = 0; l < 24; l++)
        for (uint32_t e = 0; e < 60; e++)
            z[l * 60 + e] = (e == l || e == 59 - l || e == 30 || e == 31) ? 1.0f : 0.0f;
    static unsigned char npy[24 * 60 * 4 + 256];
    size_t n = npy_make(npy, "<f4", "False", "(1, 24, 60)", z, sizeof z);
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("qwen_logits.npy"));
    test_write_bytes(path, npy, n);
    trace_import_options o = defaults();
    o.format = TRACE_TEXT_NPY;
    trace *q = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_import_file(path, &m, &o, &q, &rep, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_str_eq(rep.gates_source, "router logits: softmax over all experts, top-k kept");
    float want = (float)(exp(1.0) / (4 * exp(1.0) + 56));
    for (uint32_t l = 0; l < 24; l++) {
        uint16_t sorted[4] = {(uint16_t)l, 30, 31, (uint16_t)(59 - l)}; /* ties: ascending */
        for (int j = 0; j < 4; j++) {
            cr_assert_eq(trace_experts(q, 0, l)[j], sorted[j], "layer %u slot %d", l, j);
            cr_assert_float_eq(trace_gates(q, 0, l)[j], want, 1e-7);
        }
    }
    trace_destroy(q);
}

/* ---- npz contents ---------------------------------------------------------------------------- */

/* A stored (np.savez-like) zip of `n` members, without zip64 extras (the fixtures have them). */
typedef struct zip_in {
    const char *name; /* "topk_ids.npy" */
    const unsigned char *data;
    size_t len;
} zip_in;

static void put16(FILE *fp, unsigned v) {
    fputc((int)(v & 0xFF), fp);
    fputc((int)(v >> 8 & 0xFF), fp);
}
static void put32(FILE *fp, unsigned long v) {
    put16(fp, (unsigned)(v & 0xFFFF));
    put16(fp, (unsigned)(v >> 16 & 0xFFFF));
}

static void zip_write(const char *path, const zip_in *m, int n) {
    FILE *fp = fopen(path, "wb");
    cr_assert(fp);
    long offsets[8];
    for (int i = 0; i < n; i++) {
        offsets[i] = ftell(fp);
        unsigned long crc = crc32(0, m[i].data, (uInt)m[i].len);
        put32(fp, 0x04034b50);
        put16(fp, 20), put16(fp, 0), put16(fp, 0), put16(fp, 0), put16(fp, 0);
        put32(fp, crc), put32(fp, m[i].len), put32(fp, m[i].len);
        put16(fp, (unsigned)strlen(m[i].name)), put16(fp, 0);
        fputs(m[i].name, fp);
        fwrite(m[i].data, 1, m[i].len, fp);
    }
    long cd = ftell(fp);
    for (int i = 0; i < n; i++) {
        put32(fp, 0x02014b50);
        put16(fp, 20), put16(fp, 20), put16(fp, 0), put16(fp, 0), put16(fp, 0), put16(fp, 0);
        put32(fp, crc32(0, m[i].data, (uInt)m[i].len)), put32(fp, m[i].len), put32(fp, m[i].len);
        put16(fp, (unsigned)strlen(m[i].name)), put16(fp, 0), put16(fp, 0), put16(fp, 0);
        put16(fp, 0), put32(fp, 0), put32(fp, (unsigned long)offsets[i]);
        fputs(m[i].name, fp);
    }
    long end = ftell(fp);
    put32(fp, 0x06054b50);
    put16(fp, 0), put16(fp, 0), put16(fp, (unsigned)n), put16(fp, (unsigned)n);
    put32(fp, (unsigned long)(end - cd)), put32(fp, (unsigned long)cd), put16(fp, 0);
    fclose(fp);
}

Test(trace_import, npz_members_that_conflict_or_do_not_fit_give_one_line_exit_2) {
    good_token();
    static unsigned char ids[2][4096], gates[2][4096], logits[8192], col[4][512];
    int64_t two_ids[128];
    float two_gates[128], z[2 * 32 * 8] = {0};
    memcpy(two_ids, good_ids, sizeof good_ids);
    memcpy(two_ids + 64, good_ids, sizeof good_ids);
    memcpy(two_gates, good_gates, sizeof good_gates);
    memcpy(two_gates + 64, good_gates, sizeof good_gates);
    size_t ni = npy_make(ids[0], "<i8", "False", "(2, 32, 2)", two_ids, sizeof two_ids);
    size_t ng = npy_make(gates[0], "<f4", "False", "(2, 32, 2)", two_gates, sizeof two_gates);
    size_t nl = npy_make(logits, "<f4", "False", "(2, 32, 8)", z, sizeof z);
    int64_t three[3] = {1, 1, 1}, zero_two[2] = {0, 2}, neg[2] = {3, -1}, one_one[2] = {1, 1};
    size_t n3 = npy_make(col[0], "<i8", "False", "(3,)", three, sizeof three);
    size_t nz = npy_make(col[1], "<i8", "False", "(2,)", zero_two, sizeof zero_two);
    size_t nn = npy_make(col[2], "<i8", "False", "(2,)", neg, sizeof neg);
    size_t n11 = npy_make(col[3], "<i8", "False", "(2,)", one_one, sizeof one_one);
    const zip_in I = {"topk_ids.npy", ids[0], ni}, G = {"topk_weights.npy", gates[0], ng},
                 Z = {"router_logits.npy", logits, nl};
    struct {
        const char *name;
        zip_in m[4];
        int n;
        const char *says;
    } cases[] = {
        {"no_ids", {G}, 1, "topk_ids.npy: no such array"},
        {"no_weights", {I}, 1, "topk_weights.npy: no such array"},
        {"logits_and_ids", {Z, I, G}, 3, "router_logits.npy and topk_ids.npy: two sources"},
        {"ids_under_both_names",
         {I, G, {"routed_experts.npy", ids[0], ni}},
         3,
         "topk_ids.npy and routed_experts.npy: two sources of expert ids"},
        {"a_member_twice", {I, G, I}, 3, "member topk_ids.npy appears twice"},
        {"request_id_and_seq_lens",
         {I, G, {"request_id.npy", col[3], n11}, {"seq_lens.npy", col[3], n11}},
         4,
         "request_id.npy and seq_lens.npy: two sources"},
        {"seq_lens_too_long",
         {I, G, {"seq_lens.npy", col[0], n3}},
         3,
         "request lengths sum to more than 2 tokens, the arrays hold 2"},
        {"seq_lens_zero", {I, G, {"seq_lens.npy", col[1], nz}}, 3, "seq_lens.npy[0]: 0 tokens"},
        {"negative_request_id",
         {I, G, {"request_id.npy", col[2], nn}},
         3,
         "request_id.npy: [1]: request id -1 is negative"},
        {"request_id_of_the_wrong_length",
         {I, G, {"request_id.npy", col[0], n3}},
         3,
         "request_id.npy: shape [3]: expected [2] integers"},
        {"prompt_lens_for_too_many_requests",
         {I, G, {"prompt_lens.npy", col[0], n3}},
         3,
         "prompt_lens.npy: 3 entries for 1 requests"},
    };
    static char out[4096], errb[4096];
    char path[4096], h5[4096];
    snprintf(h5, sizeof h5, "%s", test_tmp_path("members.h5"));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        snprintf(path, sizeof path, "%s", test_tmp_path("members.npz"));
        zip_write(path, cases[c].m, cases[c].n);
        int rc = test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--format",
                                 "npz", "--model", "mixtral-8x7b", path, "-o", h5, NULL);
        cr_assert_eq(rc, 2, "%s: exit %d: %s", cases[c].name, rc, errb);
        cr_assert(strstr(errb, "members.npz: "), "%s: %s", cases[c].name, errb);
        cr_assert(strstr(errb, cases[c].says), "%s: expected '%s' in: %s", cases[c].name,
                  cases[c].says, errb);
        char *nl2 = strchr(errb, '\n');
        cr_assert(nl2 && nl2[1] == '\0', "%s: not one line: %s", cases[c].name, errb);
        cr_assert(!test_file_exists(h5), "%s: output written", cases[c].name);
    }
    /* the same writer's good file imports (so the cases above fail for their own reason) */
    zip_in good[2] = {I, G};
    zip_write(path, good, 2);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--format",
                                 "npz", "--model", "mixtral-8x7b", path, "-o", h5, NULL),
                 0, "%s", errb);
    cr_assert(strstr(out, "1 requests from one request"), "%s", out);
}

/* ---- a real model's routing, layer-major ----------------------------------------------------- */

/* The "layer" of an exported JSONL line. */
static long line_layer(const char *line) {
    const char *p = strstr(line, "\"layer\": ");
    cr_assert(p, "%s", line);
    return strtol(p + 9, NULL, 10);
}

Test(trace_import, a_real_models_log_written_layer_major_exports_to_its_trace_byte_for_byte) {
    /* the engine's routing of the golden tiny Mixtral (tests/fixtures/golden), two requests
     * decoded in one batch, exported token-major; then the same lines layer-major (stable sort
     * by layer: each layer's router over every token of the run, as a hook logs one batched
     * pass); both import, and export, to the recorded trace's text */
    char dir[4096], toks[4096], rec[4096], ini[4096], tm[4096], lm[4096], h5[4096], back[4096];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/golden/mixtral", MOESIM_SOURCE_DIR);
    snprintf(toks, sizeof toks, "%s", test_tmp_path("real-prompts.txt"));
    snprintf(rec, sizeof rec, "%s", test_tmp_path("real.h5"));
    snprintf(ini, sizeof ini, "%s", test_tmp_path("real-model.ini"));
    snprintf(tm, sizeof tm, "%s", test_tmp_path("real-tm.jsonl"));
    snprintf(lm, sizeof lm, "%s", test_tmp_path("real-lm.jsonl"));
    snprintf(h5, sizeof h5, "%s", test_tmp_path("real-lm.h5"));
    snprintf(back, sizeof back, "%s", test_tmp_path("real-lm-export.jsonl"));
    test_write_file(toks, "1 17 42 99 3 250 7 64\n9 8 7 6 5\n33 34 35\n");
    static char out[1 << 16], errb[4096];
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "record", "--model", dir,
                                 "--input", toks, "--gen-len", "5", "--batch", "2", "--seed", "3",
                                 "--threads", "1", "--model-ini", ini, "-o", rec, NULL),
                 0, "%s", errb);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "export", "--format",
                                 "jsonl", rec, "-o", tm, NULL),
                 0, "%s", errb);
    char *exported = slurp(tm);
    size_t n = 0;
    for (const char *p = exported; *p; p++) n += *p == '\n';
    char **lines = malloc(n * sizeof *lines);
    size_t i = 0;
    for (char *p = exported, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
        *nl = '\0';
        lines[i++] = p;
    }
    for (size_t a = 1; a < n; a++) /* insertion sort: stable, and a few thousand lines */
        for (size_t b = a; b > 0 && line_layer(lines[b - 1]) > line_layer(lines[b]); b--) {
            char *t = lines[b];
            lines[b] = lines[b - 1];
            lines[b - 1] = t;
        }
    FILE *fp = fopen(lm, "w");
    cr_assert(fp);
    for (i = 0; i < n; i++) fprintf(fp, "%s\n", lines[i]);
    fclose(fp);
    free(lines);
    free(exported);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "import", "--model",
                                 ini, lm, "-o", h5, "--json", NULL),
                 0, "%s", errb);
    cr_assert(strstr(out, "\"records_reordered\": 0,") == NULL, "the log was not layer-major: %s",
              out);
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "trace", "export", "--format",
                                 "jsonl", h5, "-o", back, NULL),
                 0, "%s", errb);
    char *want = slurp(tm), *got = slurp(back);
    cr_assert_gt(strlen(want), 1000);
    cr_assert_str_eq(got, want, "the layer-major log does not export to the recorded trace");
    free(want);
    free(got);
}
