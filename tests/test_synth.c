/* The trace synthesizer (traces/synth.h, `moesim trace synth`): valid traces for every model
 * of configs/models, determinism, the trace contract (phases, gate normalization, importance,
 * look-ahead padding), and the calibration targets of traces/SYNTH.md measured with the real
 * statistics code (traces/stats.h). The published figures below are copied from
 * docs/CALIBRATION.md; the tolerances are the ones SYNTH.md states. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/model.h"
#include "support/test_support.h"
#include "traces/stats.h"
#include "traces/synth.h"
#include "traces/trace.h"

#define BATCH_TOLERANCE     0.05 /* ±5 points at every B (SYNTH.md) */
#define LOOKAHEAD_TOLERANCE 0.02 /* "~96 %", "~90 %": ±2 points (SYNTH.md) */

static model_geometry load_model(const char *name) {
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name(name, &m, &err), MOESIM_OK, "%s", err.msg);
    return m;
}

/* Generates with the family defaults, then the given changes; the caller destroys. */
static trace *synth(const model_geometry *m, uint32_t requests, synth_range prompt, synth_range gen,
                    synth_workload w, uint32_t depth) {
    synth_options o;
    synth_options_default(&o, m);
    o.n_requests = requests;
    o.prompt_len = prompt;
    o.gen_len = gen;
    o.workload = w;
    o.lookahead_depth = depth;
    trace *t = NULL;
    moesim_error err = {0};
    cr_assert_eq(synth_generate(m, &o, &t, &err), MOESIM_OK, "%s", err.msg);
    return t;
}

static const char *const all_models[] = {"deepseek-v2-lite",  "mixtral-8x7b",      "olmoe-1b-7b",
                                         "phi-3.5-moe",       "qwen1.5-moe-a2.7b", "qwen3-30b-a3b",
                                         "qwen3-next-80b-a3b"};

TestSuite(synth);

/* ---- the trace contract ---- */

/* Requests whose plans need more memory than the machine has fail in one line, before any
 * output exists (an allocation failure aborted the process). */
Test(synth, more_requests_than_the_machine_can_plan_fail_in_one_line_and_write_nothing) {
    model_geometry m = load_model("olmoe-1b-7b");
    synth_options o;
    synth_options_default(&o, &m);
    o.n_requests = UINT32_MAX; /* 4.3e9 requests of one token: about 96 GiB of plans */
    o.prompt_len = (synth_range){1, 1};
    o.gen_len = (synth_range){0, 0};
    double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (have > 200.0 * (1u << 30)) cr_skip("a machine with more than 200 GiB plans them");
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("synth-too-many.h5"));
    moesim_error err = {0};
    cr_assert_eq(synth_write(&m, &o, path, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "requests of up to 1 tokens need"), "%s", err.msg);
    cr_assert(strstr(err.msg, "GiB of working memory, this machine has"), "%s", err.msg);
    cr_assert_not(test_file_exists(path));
}

Test(synth, every_configured_model_gives_a_trace_that_passes_trace_check) {
    for (size_t i = 0; i < sizeof all_models / sizeof *all_models; i++) {
        model_geometry m = load_model(all_models[i]);
        trace *t = synth(&m, 5, (synth_range){3, 9}, (synth_range){0, 6}, SYNTH_MIX, 3);
        moesim_error err = {0};
        cr_assert_eq(trace_check(t, "synth", &err), MOESIM_OK, "%s: %s", m.name, err.msg);
        cr_assert_str_eq(t->meta.model, m.name);
        cr_assert_eq(t->meta.n_layers, m.n_moe_layers);
        cr_assert_eq(t->meta.n_experts, m.n_experts);
        cr_assert_eq(t->meta.top_k, m.top_k);
        cr_assert_eq(t->meta.gate_norm, m.gate_norm);
        cr_assert_eq(t->meta.lookahead_depth, 3);
        cr_assert_eq(t->meta.lookahead_k, m.n_experts < 16 ? m.n_experts : 16);
        cr_assert(t->meta.has_importance);
        cr_assert_str_eq(t->meta.source, "synth:1");
        cr_assert(t->params_json && strstr(t->params_json, "\"topic_persistence\""));
        cr_assert_eq(t->n_requests, 5);
        trace_destroy(t);
    }
}

/* k = E (every expert chosen: no intruders exist for the look-ahead) and k = 1 of 2 (a wrong
 * top-1 prediction must come from outside the true set), with anti-reuse and K' = 1. */
Test(synth, extreme_geometries_give_valid_traces) {
    static const struct {
        const char *name, *experts, *top_k;
    } cases[] = {{"edge-k-eq-e", "8", "8"}, {"edge-k1", "2", "1"}};
    for (size_t i = 0; i < 2; i++) {
        char text[2048], path[4096];
        snprintf(text, sizeof text,
                 "[model]\nname = %s\nhf_id = test/%s\nfamily = mixtral\n"
                 "[layers]\nn_layers = 6\nmoe_layers = all\nhidden = 64\ndense_inter = 0\n"
                 "vocab = 256\ntie_embeddings = false\n"
                 "[experts]\nn_experts = %s\ntop_k = %s\nexpert_inter = 32\ngate_norm = topk\n"
                 "n_shared = 0\nshared_inter = 0\nshared_gate = false\n"
                 "[attention]\nkind = gqa\nheads = 4\nkv_heads = 4\nhead_dim = 16\n"
                 "qk_norm = false\nrope_theta = 10000\n",
                 cases[i].name, cases[i].name, cases[i].experts, cases[i].top_k);
        snprintf(path, sizeof path, "%s", test_tmp_path(cases[i].name));
        test_write_file(path, text);
        model_geometry m;
        moesim_error err = {0};
        cr_assert_eq(model_load(path, &m, &err), MOESIM_OK, "%s", err.msg);
        for (uint32_t kp = 1; kp <= m.n_experts; kp += m.n_experts - 1) {
            synth_options o;
            synth_options_default(&o, &m);
            o.n_requests = 6;
            o.prompt_len = (synth_range){3, 7};
            o.gen_len = (synth_range){2, 5};
            o.lookahead_depth = 4;
            o.lookahead_k = kp;
            cr_assert_eq(synth_knob_set(&o.knobs, "reuse_other_mid", -0.5, &err), MOESIM_OK);
            trace *t = NULL;
            cr_assert_eq(synth_generate(&m, &o, &t, &err), MOESIM_OK, "%s", err.msg);
            cr_assert_eq(trace_check(t, cases[i].name, &err), MOESIM_OK, "%s", err.msg);
            trace_destroy(t);
            if (m.n_experts == 1) break;
        }
    }
}

Test(synth, requests_are_prompt_then_generation_with_lengths_in_their_ranges) {
    model_geometry m = load_model("olmoe-1b-7b");
    trace *t = synth(&m, 40, (synth_range){5, 12}, (synth_range){2, 4}, SYNTH_TEXT, 0);
    uint32_t prefill[40] = {0}, decode[40] = {0};
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        uint32_t r = t->request_id[i];
        if (i > 0 && t->request_id[i - 1] == r)
            cr_assert_eq(t->position[i], t->position[i - 1] + 1);
        else
            cr_assert_eq(t->position[i], 0);
        if (t->phase[i] == TRACE_PREFILL) {
            cr_assert_eq(decode[r], 0, "prefill after decode in request %u", r);
            prefill[r]++;
        } else {
            decode[r]++;
        }
    }
    for (uint32_t r = 0; r < 40; r++) {
        cr_assert(prefill[r] >= 5 && prefill[r] <= 12, "request %u: %u prefill", r, prefill[r]);
        cr_assert(decode[r] >= 2 && decode[r] <= 4, "request %u: %u decode", r, decode[r]);
    }
    trace_destroy(t);
}

/* Gates as the model applies them: softmax over the top-k sums to 1; softmax over all E keeps
 * the top-k share (< 1). Descending, so slot 0 is the top-1 that statistics use. */
Test(synth, gate_weights_follow_the_models_normalization_and_slot_0_is_the_top_1) {
    static const char *const names[] = {"qwen3-30b-a3b", "deepseek-v2-lite", "olmoe-1b-7b",
                                        "mixtral-8x7b"};
    for (size_t i = 0; i < 4; i++) {
        model_geometry m = load_model(names[i]);
        trace *t = synth(&m, 4, (synth_range){20, 20}, (synth_range){20, 20}, SYNTH_TEXT, 0);
        double min_sum = 2, max_sum = 0;
        for (uint64_t tok = 0; tok < t->n_tokens; tok++)
            for (uint32_t l = 0; l < t->meta.n_layers; l++) {
                const float *g = trace_gates(t, tok, l);
                double sum = 0;
                for (uint32_t j = 0; j < t->meta.top_k; j++) {
                    sum += g[j];
                    if (j) cr_assert(g[j] <= g[j - 1], "%s: gates not descending", m.name);
                }
                min_sum = sum < min_sum ? sum : min_sum;
                max_sum = sum > max_sum ? sum : max_sum;
            }
        if (m.gate_norm == GATE_SOFTMAX_TOPK) {
            cr_assert(fabs(min_sum - 1) < 1e-5 && fabs(max_sum - 1) < 1e-5, "%s: %g..%g", m.name,
                      min_sum, max_sum);
        } else {
            cr_assert(max_sum < 1 - 1e-3 && min_sum > 0, "%s: top-k mass %g..%g", m.name, min_sum,
                      max_sum);
        }
        trace_destroy(t);
    }
}

/* Importance as engine_seq_importance defines it (DyMoE Eq. 1): the attention each position
 * received from every query of its request, so a request of n tokens sums to n at each layer,
 * and the first token (the attention sink) receives the most. */
Test(synth, importance_is_attention_received_and_sums_to_the_request_length) {
    model_geometry m = load_model("mixtral-8x7b");
    trace *t = synth(&m, 3, (synth_range){50, 50}, (synth_range){30, 30}, SYNTH_TEXT, 0);
    const uint32_t L = t->meta.n_layers;
    for (uint32_t r = 0; r < 3; r++)
        for (uint32_t l = 0; l < L; l++) {
            double sum = 0, first = 0, max_other = 0;
            for (uint64_t tok = r * 80ull; tok < (r + 1) * 80ull; tok++) {
                float x = t->importance[tok * L + l];
                cr_assert(x >= 0 && isfinite(x));
                sum += x;
                if (t->position[tok] == 0)
                    first = x;
                else
                    max_other = x > max_other ? x : max_other;
            }
            cr_assert(fabs(sum - 80) < 1e-3 * 80, "request %u layer %u: sum %g", r, l, sum);
            cr_assert(first > max_other, "the first token is the attention sink");
        }
    trace_destroy(t);
}

Test(synth, lookahead_is_padded_exactly_beyond_the_last_layer) {
    model_geometry m = load_model("olmoe-1b-7b");
    trace *t = synth(&m, 2, (synth_range){4, 4}, (synth_range){4, 4}, SYNTH_TEXT, 5);
    const uint32_t L = t->meta.n_layers, K = t->meta.lookahead_k;
    for (uint64_t tok = 0; tok < t->n_tokens; tok++)
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t d = 1; d <= 5; d++) {
                const uint16_t *ids = t->lookahead_ids + trace_lookahead_index(t, tok, l, d);
                for (uint32_t c = 0; c < K; c++) {
                    if (l + d >= L) {
                        cr_assert_eq(ids[c], TRACE_NO_EXPERT);
                        continue;
                    }
                    cr_assert(ids[c] < t->meta.n_experts);
                    for (uint32_t c2 = 0; c2 < c; c2++) cr_assert_neq(ids[c], ids[c2]);
                }
            }
    trace_destroy(t);
}

/* The layout traces/SYNTH.md states for a row predicting target layer m (kk = min(k, K')):
 * candidate 0 is m's top-1 or runner-up; in places 1..kk - 1 the kept true experts, then the
 * intruders; from place kk the deferred true experts, then the popular tail; the true experts
 * after candidate 0 in gate order; the non-true ones one list per target (every row a prefix
 * of the longest); scores m's gates by rank, halved per rank beyond k. Several K' around k. */
Test(synth, lookahead_rows_follow_the_documented_layout) {
    static const struct {
        const char *model;
        uint32_t kp;
    } cases[] = {{"qwen3-30b-a3b", 1},  {"qwen3-30b-a3b", 5},  {"qwen3-30b-a3b", 8},
                 {"qwen3-30b-a3b", 9},  {"qwen3-30b-a3b", 16}, {"qwen3-30b-a3b", 23},
                 {"qwen3-30b-a3b", 40}, {"mixtral-8x7b", 1},   {"mixtral-8x7b", 3},
                 {"mixtral-8x7b", 8},   {"olmoe-1b-7b", 12}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        model_geometry m = load_model(cases[i].model);
        synth_options o;
        synth_options_default(&o, &m);
        o.n_requests = 3;
        o.prompt_len = (synth_range){6, 6};
        o.gen_len = (synth_range){6, 6};
        o.lookahead_depth = 4;
        o.lookahead_k = cases[i].kp;
        trace *t = NULL;
        moesim_error err = {0};
        cr_assert_eq(synth_generate(&m, &o, &t, &err), MOESIM_OK, "%s", err.msg);
        const uint32_t L = t->meta.n_layers, k = t->meta.top_k, KP = cases[i].kp;
        const uint32_t kk = k < KP ? k : KP;
        for (uint64_t tok = 0; tok < t->n_tokens; tok++)
            for (uint32_t tm = 1; tm < L; tm++) {
                const uint16_t *actual = trace_experts(t, tok, tm);
                const float *gates = trace_gates(t, tok, tm);
                uint16_t longest[TRACE_MAX_LOOKAHEAD_K]; /* the non-true ones of the longest row */
                uint32_t n_longest = 0;
                for (uint32_t d = 1; d <= 4 && d <= tm; d++) {
                    const size_t at = trace_lookahead_index(t, tok, tm - d, d);
                    const uint16_t *ids = t->lookahead_ids + at;
                    const float *sc = t->lookahead_scores + at;
                    cr_assert(ids[0] == actual[0] || ids[0] == actual[1 % k]);
                    int last_key = 0; /* gate order of the last true one placed */
                    bool other_in_head = false, other_in_tail = false;
                    uint16_t others[TRACE_MAX_LOOKAHEAD_K];
                    uint32_t n_others = 0;
                    for (uint32_t c = 0; c < KP; c++) {
                        int slot = -1;
                        for (uint32_t j = 0; j < k; j++)
                            if (actual[j] == ids[c]) slot = (int)j;
                        const float want = gates[c < k ? c : k - 1] *
                                           (c + 1 > k ? ldexpf(1.0f, -(int)(c + 1 - k)) : 1.0f);
                        cr_assert_eq(sc[c], want, "%s K'=%u: score %u", m.name, KP, c);
                        if (c == 0) continue;
                        if (slot < 0) {
                            others[n_others++] = ids[c];
                            *(c < kk ? &other_in_head : &other_in_tail) = true;
                            continue;
                        }
                        cr_assert(!(c < kk ? other_in_head : other_in_tail),
                                  "%s K'=%u: a true expert after an intruder or the tail", m.name,
                                  KP);
                        /* with the runner-up as candidate 0 the top-1 leads the rest */
                        const int key = slot == 0 && ids[0] == actual[1] ? 1 : slot;
                        cr_assert(key > last_key, "%s K'=%u: true experts out of gate order",
                                  m.name, KP);
                        last_key = key;
                    }
                    const uint32_t n_common = n_others < n_longest ? n_others : n_longest;
                    cr_assert(!memcmp(others, longest, n_common * sizeof *others),
                              "%s K'=%u: rows of one target disagree on its popular experts",
                              m.name, KP);
                    if (n_others > n_longest) {
                        memcpy(longest, others, n_others * sizeof *others);
                        n_longest = n_others;
                    }
                }
            }
        trace_destroy(t);
    }
}

/* ---- determinism ---- */

static bool same_trace(const trace *a, const trace *b) {
    size_t route = a->n_tokens * trace_route_values(&a->meta);
    return a->n_tokens == b->n_tokens && !memcmp(a->expert_ids, b->expert_ids, route * 2) &&
           !memcmp(a->gate_weights, b->gate_weights, route * 4) &&
           !memcmp(a->importance, b->importance, a->n_tokens * a->meta.n_layers * 4);
}

Test(synth, the_same_options_give_the_same_trace_and_another_seed_another) {
    model_geometry m = load_model("qwen3-30b-a3b");
    synth_options o;
    synth_options_default(&o, &m);
    o.n_requests = 6;
    o.prompt_len = (synth_range){4, 30};
    o.gen_len = (synth_range){1, 9};
    o.workload = SYNTH_MIX;
    trace *a = NULL, *b = NULL, *c = NULL;
    moesim_error err = {0};
    cr_assert_eq(synth_generate(&m, &o, &a, &err), MOESIM_OK);
    cr_assert_eq(synth_generate(&m, &o, &b, &err), MOESIM_OK);
    o.seed = 2;
    cr_assert_eq(synth_generate(&m, &o, &c, &err), MOESIM_OK);
    cr_assert(same_trace(a, b));
    size_t look = a->n_tokens * trace_lookahead_values(&a->meta);
    cr_assert(!memcmp(a->lookahead_ids, b->lookahead_ids, look * 2));
    cr_assert(!memcmp(a->lookahead_scores, b->lookahead_scores, look * 4));
    cr_assert_str_eq(a->params_json, b->params_json);
    cr_assert(c->n_tokens != a->n_tokens || !same_trace(a, c), "seed 2 gave seed 1's trace");
    trace_destroy(a);
    trace_destroy(b);
    trace_destroy(c);
}

Test(synth, lookahead_settings_leave_the_routing_unchanged) {
    model_geometry m = load_model("deepseek-v2-lite");
    trace *a = synth(&m, 4, (synth_range){9, 9}, (synth_range){9, 9}, SYNTH_TEXT, 0);
    trace *b = synth(&m, 4, (synth_range){9, 9}, (synth_range){9, 9}, SYNTH_TEXT, 4);
    cr_assert(same_trace(a, b));
    trace_destroy(a);
    trace_destroy(b);
}

/* Streaming cuts long requests into window-sized blocks whose size depends on the bytes per
 * token: 32 tokens for qwen3-30b-a3b at D = 3, K' = 16; the 2-token minimum at D = 16,
 * K' = 128 (592 KB per token); the whole request without look-ahead. A token's routing reads
 * its predecessor across those cuts and must not change with them. */
Test(synth, routing_does_not_depend_on_where_lookahead_settings_cut_requests_into_blocks) {
    model_geometry m = load_model("qwen3-30b-a3b");
    static const uint32_t depth[] = {0, 3, 16}, kp[] = {16, 16, 128};
    trace *t[3];
    for (int i = 0; i < 3; i++) {
        synth_options o;
        synth_options_default(&o, &m);
        o.n_requests = 2;
        o.prompt_len = (synth_range){70, 70};
        o.gen_len = (synth_range){30, 30};
        o.lookahead_depth = depth[i];
        o.lookahead_k = kp[i];
        moesim_error err = {0};
        cr_assert_eq(synth_generate(&m, &o, &t[i], &err), MOESIM_OK, "%s", err.msg);
    }
    cr_expect(same_trace(t[0], t[1]), "D = 3 changed the routing");
    cr_expect(same_trace(t[0], t[2]), "D = 16, K' = 128 changed the routing");
    for (int i = 0; i < 3; i++) trace_destroy(t[i]);
}

static long file_bytes(const char *path, char **data) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc((size_t)n);
    cr_assert_eq(fread(*data, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return n;
}

Test(synth, the_command_writes_byte_identical_files_for_the_same_arguments) {
    char a[4096], b[4096], errbuf[4096];
    snprintf(a, sizeof a, "%s", test_tmp_path("synth_a.h5"));
    snprintf(b, sizeof b, "%s", test_tmp_path("synth_b.h5"));
    const char *paths[2] = {a, b};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(test_run_moesim(NULL, 0, errbuf, sizeof errbuf, "trace", "synth", "--model",
                                     "qwen3-30b-a3b", "--requests", "5", "--prompt-len", "8:40",
                                     "--gen-len", "16", "--workload", "mix", "--seed", "42",
                                     "--set", "topic_persistence=0.5", "-o", paths[i], NULL),
                     0, "%s", errbuf);
    char *da, *db;
    long na = file_bytes(a, &da), nb = file_bytes(b, &db);
    cr_assert_eq(na, nb);
    cr_assert(!memcmp(da, db, (size_t)na), "files differ");
    free(da);
    free(db);
    trace *t = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_read(a, &t, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_str_eq(t->meta.source, "synth:42");
    cr_assert(strstr(t->params_json, "\"topic_persistence\":0.5"), "%s", t->params_json);
    trace_destroy(t);
}

/* synth_write streams request by request; its file must be the one the whole trace gives. */
Test(synth, streaming_to_a_file_gives_the_bytes_of_the_whole_trace_written_at_once) {
    model_geometry m = load_model("olmoe-1b-7b");
    synth_options o;
    synth_options_default(&o, &m);
    o.n_requests = 40; /* ~25 k tokens: the writer flushes many times between requests */
    o.prompt_len = (synth_range){64, 1024};
    o.gen_len = (synth_range){1, 200};
    o.lookahead_depth = 2;
    o.lookahead_k = 12;
    char whole[4096], streamed[4096];
    snprintf(whole, sizeof whole, "%s", test_tmp_path("synth_whole.h5"));
    snprintf(streamed, sizeof streamed, "%s", test_tmp_path("synth_streamed.h5"));
    trace *t = NULL;
    moesim_error err = {0};
    cr_assert_eq(synth_generate(&m, &o, &t, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_write(t, whole, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(synth_write(&m, &o, streamed, &err), MOESIM_OK, "%s", err.msg);
    char *dw, *ds;
    long nw = file_bytes(whole, &dw), ns = file_bytes(streamed, &ds);
    cr_assert_eq(nw, ns);
    cr_assert(!memcmp(dw, ds, (size_t)nw), "files differ");
    free(dw);
    free(ds);
    trace_destroy(t);
}

/* A sink that takes the first `accept` blocks, then fails (the run stops there), and checks
 * that blocks come in token order, each within one request, request ids and positions as in
 * the whole trace. */
typedef struct counting_sink {
    uint32_t blocks, accept;
    uint64_t tokens, announced;
    uint32_t request, next_position; /* where the next token must continue */
    uint32_t largest;                /* tokens in the largest block */
} counting_sink;

static moesim_status counting_begin(void *ctx, const trace_meta *meta, uint64_t n_tokens,
                                    uint32_t n_requests, const char *params_json,
                                    moesim_error *err) {
    (void)meta, (void)n_requests, (void)params_json, (void)err;
    ((counting_sink *)ctx)->announced = n_tokens;
    return MOESIM_OK;
}

static moesim_status counting_block(void *ctx, const trace *block, moesim_error *err) {
    counting_sink *c = ctx;
    if (c->blocks == c->accept) return moesim_fail(err, MOESIM_EIO, "sink full");
    if (block->position[0] == 0 && c->tokens > 0) c->request++, c->next_position = 0;
    for (uint64_t i = 0; i < block->n_tokens; i++) {
        cr_assert_eq(block->request_id[i], c->request, "block %u token %llu", c->blocks,
                     (unsigned long long)i);
        cr_assert_eq(block->position[i], c->next_position++);
    }
    c->blocks++;
    c->tokens += block->n_tokens;
    c->largest = block->n_tokens > c->largest ? (uint32_t)block->n_tokens : c->largest;
    return MOESIM_OK;
}

Test(synth,
     a_stream_hands_over_requests_in_order_in_window_sized_blocks_and_stops_when_the_sink_fails) {
    model_geometry m = load_model("qwen3-30b-a3b");
    synth_options o;
    synth_options_default(&o, &m);
    o.n_requests = 6;
    o.prompt_len = (synth_range){30, 300}; /* 16 KB per token: a 512 KiB window is 32 tokens */
    counting_sink c = {.accept = UINT32_MAX};
    synth_sink sink = {counting_begin, counting_block, &c};
    moesim_error err = {0};
    cr_assert_eq(synth_stream(&m, &o, &sink, &err), MOESIM_OK, "%s", err.msg);
    cr_expect_eq(c.request, 5, "every request arrived");
    cr_expect_eq(c.tokens, c.announced);
    cr_expect_eq(c.largest, 32, "requests longer than the window come in several blocks");
    c = (counting_sink){.accept = 2};
    cr_assert_eq(synth_stream(&m, &o, &sink, &err), MOESIM_EIO);
    cr_expect_str_eq(err.msg, "sink full");
    cr_expect_eq(c.blocks, 2);
}

/* ---- bad input ---- */

typedef struct bad_case {
    const char *args[5]; /* NULL-terminated */
    const char *message; /* a piece of the one-line error */
} bad_case;

Test(synth, bad_arguments_exit_2_with_one_line_and_write_nothing) {
    static const bad_case cases[] = {
        {{"--model", "no-such-model"}, "no-such-model"},
        {{"--model", "qwen3-30b-a3b", "--requests", "0"}, "--requests"},
        {{"--model", "qwen3-30b-a3b", "--prompt-len", "9:3"}, "prompt-len"},
        {{"--model", "qwen3-30b-a3b", "--prompt-len", "0"}, "prompt-len"},
        {{"--model", "qwen3-30b-a3b", "--workload", "poetry"}, "--workload"},
        {{"--model", "qwen3-30b-a3b", "--lookahead-k", "200"}, "lookahead-k"},
        {{"--model", "qwen3-30b-a3b", "--set", "no_such_knob=1"}, "no_such_knob"},
        {{"--model", "qwen3-30b-a3b", "--set", "topic_persistence=1.5"}, "topic_persistence"},
        {{"--model", "qwen3-30b-a3b", "--set", "topics=2.5"}, "topics"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out_path[4096], errbuf[4096];
        snprintf(out_path, sizeof out_path, "%s", test_tmp_path("synth_bad.h5"));
        remove(out_path);
        const char *const *a = cases[i].args;
        /* the case's arguments end at their first NULL, after "-o OUT" */
        int rc = test_run_moesim(NULL, 0, errbuf, sizeof errbuf, "trace", "synth", "-o", out_path,
                                 a[0], a[1], a[2], a[3], NULL);
        cr_assert_eq(rc, 2, "case %zu: exit %d (%s)", i, rc, errbuf);
        cr_assert(strstr(errbuf, cases[i].message), "case %zu: '%s'", i, errbuf);
        cr_assert_eq(strchr(errbuf, '\n'), errbuf + strlen(errbuf) - 1, "one line: '%s'", errbuf);
        cr_assert(!test_file_exists(out_path), "case %zu left a file", i);
    }
}

Test(synth, report_prints_target_and_achieved_for_each_statistic) {
    static char out[1 << 16];
    char errbuf[4096];
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "synth",
                                 "--model", "qwen3-30b-a3b", "--requests", "64", "--prompt-len",
                                 "4", "--gen-len", "16", "--report", NULL),
                 0, "%s", errbuf);
    static const char *const rows[] = {
        "active share B=1", "active share B=32", "lookahead top-1 d=1", "lookahead top-1 d=3",
        "target",           "achieved"};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        cr_assert(strstr(out, rows[i]), "missing '%s' in:\n%s", rows[i], out);
    cr_assert(!strstr(out, "OFF"), "a target is missed:\n%s", out);
}

/* ---- calibration (CALIBRATION.md figures, tolerances of SYNTH.md) ---- */

typedef struct batch_case {
    const char *model;
    double share[STATS_N_BATCH]; /* DynaExq (revised), first table, B = 1..32 */
} batch_case;

static void assert_batch_table(const batch_case *c) {
    model_geometry m = load_model(c->model);
    /* 256 decode requests: 8 groups of 32, 32 iterations each */
    trace *t = synth(&m, 256, (synth_range){8, 8}, (synth_range){32, 32}, SYNTH_TEXT, 0);
    trace_stats *s = trace_stats_compute(t);
    cr_assert_eq(s->active_share[0], (double)m.top_k / m.n_experts, "B=1 is exactly k/E");
    for (int b = 1; b < STATS_N_BATCH; b++)
        cr_assert(fabs(s->active_share[b] - c->share[b]) <= BATCH_TOLERANCE,
                  "%s B=%u: %.1f%% vs published %.1f%%", c->model, trace_stats_batch_sizes[b],
                  100 * s->active_share[b], 100 * c->share[b]);
    /* far below the uniform bound at B = 32: the batch correlation is what pulls it down */
    double uniform = 1 - pow(1 - (double)m.top_k / m.n_experts, 32);
    cr_assert(s->active_share[5] < uniform - 0.15, "%s: B=32 %.1f%% vs uniform %.1f%%", c->model,
              100 * s->active_share[5], 100 * uniform);
    trace_stats_destroy(s);
    trace_destroy(t);
}

Test(synth, qwen3_30b_touched_share_per_batch_matches_dynaexq_within_5_points) {
    static const batch_case c = {"qwen3-30b-a3b", {0.063, 0.116, 0.201, 0.319, 0.465, 0.620}};
    assert_batch_table(&c);
}

Test(synth, deepseek_v2_lite_touched_share_per_batch_matches_dynaexq_within_5_points) {
    static const batch_case c = {"deepseek-v2-lite", {0.090, 0.149, 0.232, 0.359, 0.517, 0.676}};
    assert_batch_table(&c);
}

Test(synth, qwen3_next_touched_share_per_batch_matches_dynaexq_within_5_points) {
    model_geometry m = load_model("qwen3-next-80b-a3b");
    static const double share[STATS_N_BATCH] = {0.019, 0.037, 0.067, 0.149, 0.254, 0.392};
    trace *t = synth(&m, 256, (synth_range){8, 8}, (synth_range){32, 32}, SYNTH_TEXT, 0);
    trace_stats *s = trace_stats_compute(t);
    cr_assert_eq(s->active_share[0], (double)m.top_k / m.n_experts);
    for (int b = 1; b < STATS_N_BATCH; b++)
        cr_assert(fabs(s->active_share[b] - share[b]) <= BATCH_TOLERANCE, "B=%u: %.1f%%",
                  trace_stats_batch_sizes[b], 100 * s->active_share[b]);
    trace_stats_destroy(s);
    trace_destroy(t);
}

/* Without skew or topics the routing is uniform and independent: the knobs, not an accident of
 * the sampler, produce the correlation. */
Test(synth, without_skew_and_topics_the_batch_share_is_the_uniform_bound) {
    model_geometry m = load_model("qwen3-30b-a3b");
    synth_options o;
    synth_options_default(&o, &m);
    o.n_requests = 256;
    o.prompt_len = (synth_range){4, 4};
    o.gen_len = (synth_range){32, 32};
    o.lookahead_depth = 0;
    moesim_error err = {0};
    static const char *const zero[] = {"popularity_skew_first", "popularity_skew_mid",
                                       "popularity_skew_last", "topic_concentration"};
    for (size_t i = 0; i < 4; i++)
        cr_assert_eq(synth_knob_set(&o.knobs, zero[i], 0, &err), MOESIM_OK, "%s", err.msg);
    trace *t = NULL;
    cr_assert_eq(synth_generate(&m, &o, &t, &err), MOESIM_OK, "%s", err.msg);
    trace_stats *s = trace_stats_compute(t);
    for (int b = 0; b < STATS_N_BATCH; b++) {
        double uniform = 1 - pow(1 - 8.0 / 128, trace_stats_batch_sizes[b]);
        cr_assert(fabs(s->active_share[b] - uniform) < 0.01, "B=%u: %.2f%% vs %.2f%%",
                  trace_stats_batch_sizes[b], 100 * s->active_share[b], 100 * uniform);
    }
    trace_stats_destroy(s);
    trace_destroy(t);
}

/* Mixtral paper Table 5: consecutive tokens choosing the same expert (first choice / either
 * choice) at layers 0, 15 and 31, inside the published ranges. */
Test(synth, mixtral_consecutive_token_reuse_per_depth_is_in_the_published_ranges) {
    model_geometry m = load_model("mixtral-8x7b");
    trace *t = synth(&m, 256, (synth_range){256, 256}, (synth_range){256, 256}, SYNTH_TEXT, 0);
    trace_stats *s = trace_stats_compute(t);
    static const struct {
        uint32_t layer;
        double top1_lo, top1_hi, any_lo, any_hi;
    } t5[] = {
        {0, 0.14, 0.15, 0.45, 0.50}, {15, 0.24, 0.28, 0.62, 0.67}, {31, 0.20, 0.26, 0.45, 0.54}};
    for (size_t i = 0; i < 3; i++) {
        const layer_stats *ls = &s->per_layer[t5[i].layer];
        cr_assert(ls->reuse_pairs > 100000, "enough pairs for a 1-point range");
        cr_assert(ls->reuse_top1 >= t5[i].top1_lo && ls->reuse_top1 <= t5[i].top1_hi,
                  "layer %u top-1 reuse %.2f%%", t5[i].layer, 100 * ls->reuse_top1);
        cr_assert(ls->reuse_any >= t5[i].any_lo && ls->reuse_any <= t5[i].any_hi,
                  "layer %u any reuse %.2f%%", t5[i].layer, 100 * ls->reuse_any);
    }
    /* Mixtral profiling: busiest expert 1.1-1.9x the mean per layer */
    cr_assert(s->max_over_mean >= 1.1 && s->max_over_mean <= 1.9, "max/mean %.2f",
              s->max_over_mean);
    trace_stats_destroy(s);
    trace_destroy(t);
}

/* HOBBIT §3.3: top-1 right ~96 % for the next layer, ~90 % two to three layers ahead, and
 * falling with distance beyond. */
Test(synth, lookahead_top1_accuracy_matches_hobbit_and_falls_with_distance) {
    static const char *const names[] = {"mixtral-8x7b", "qwen3-30b-a3b"};
    for (size_t i = 0; i < 2; i++) {
        model_geometry m = load_model(names[i]);
        trace *t = synth(&m, 64, (synth_range){64, 64}, (synth_range){64, 64}, SYNTH_TEXT, 5);
        trace_stats *s = trace_stats_compute(t);
        static const double want[3] = {0.96, 0.90, 0.90};
        for (int d = 0; d < 3; d++)
            cr_assert(fabs(s->lookahead_top1[d] - want[d]) <= LOOKAHEAD_TOLERANCE,
                      "%s d=%d: %.2f%%", m.name, d + 1, 100 * s->lookahead_top1[d]);
        for (int d = 1; d < 5; d++) {
            cr_assert(s->lookahead_top1[d] < s->lookahead_top1[d - 1], "%s: top-1 at d=%d", m.name,
                      d + 1);
            cr_assert(s->lookahead_recall[d] < s->lookahead_recall[d - 1], "%s: recall at d=%d",
                      m.name, d + 1);
        }
        trace_stats_destroy(s);
        trace_destroy(t);
    }
}

/* OLMoE repository counts: top 10 % of experts carry 16-19 % of activations on C4 (text) and
 * 38-44 % at layers 7 and 15 on arXiv / GitHub (math, code); busiest expert 2.5-7.8x the mean
 * (reached where the skew is, math and code). */
Test(synth, olmoe_skew_matches_the_published_counts_per_workload) {
    model_geometry m = load_model("olmoe-1b-7b");
    trace *t = synth(&m, 128, (synth_range){64, 64}, (synth_range){64, 64}, SYNTH_TEXT, 0);
    trace_stats *s = trace_stats_compute(t);
    cr_assert(s->top10_share >= 0.16 && s->top10_share <= 0.19, "text top-10%% share %.2f%%",
              100 * s->top10_share);
    trace_stats_destroy(s);
    trace_destroy(t);
    static const synth_workload skewed[] = {SYNTH_MATH, SYNTH_CODE};
    for (size_t i = 0; i < 2; i++) {
        t = synth(&m, 128, (synth_range){64, 64}, (synth_range){64, 64}, skewed[i], 0);
        s = trace_stats_compute(t);
        for (uint32_t l = 7; l <= 15; l += 8)
            cr_assert(s->per_layer[l].top10_share >= 0.38 && s->per_layer[l].top10_share <= 0.44,
                      "%s layer %u: top-10%% share %.2f%%", synth_workload_name(skewed[i]), l,
                      100 * s->per_layer[l].top10_share);
        cr_assert(s->max_over_mean >= 2.5 && s->max_over_mean <= 7.8, "max/mean %.2f",
                  s->max_over_mean);
        trace_stats_destroy(s);
        trace_destroy(t);
    }
}

/* DynaExq §2.3: the hot sets of one layer under text, math and code can be disjoint. */
Test(synth, hot_sets_shift_between_workloads) {
    model_geometry m = load_model("qwen3-30b-a3b");
    static const synth_workload ws[] = {SYNTH_TEXT, SYNTH_MATH, SYNTH_CODE};
    uint8_t hot[3][128] = {{0}};
    for (int w = 0; w < 3; w++) {
        trace *t = synth(&m, 32, (synth_range){32, 32}, (synth_range){32, 32}, ws[w], 0);
        trace_stats *s = trace_stats_compute(t);
        const uint64_t *count = s->per_layer[20].expert_count;
        for (int n = 0; n < 10; n++) { /* mark the 10 busiest */
            int best = -1;
            for (int e = 0; e < 128; e++)
                if (!hot[w][e] && (best < 0 || count[e] > count[best])) best = e;
            hot[w][best] = 1;
        }
        trace_stats_destroy(s);
        trace_destroy(t);
    }
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++) {
            int shared = 0;
            for (int e = 0; e < 128; e++) shared += hot[a][e] && hot[b][e];
            cr_assert(shared <= 3, "workloads %d and %d share %d of their top-10", a, b, shared);
        }
}
