/* The in-memory trace (traces/trace.c): allocation, trace_finish / trace_check invariants and
 * their messages, model geometry -> meta; and the HDF5 form (traces/trace_write.c, trace_read.c):
 * round trip, determinism, streaming in blocks, crash-safe writing. Malformed files are in
 * test_trace_corpus.c. */
#include <criterion/criterion.h>
#include <float.h>
#include <hdf5.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ranked.h"
#include "support/test_support.h"
#include "traces/trace.h"

/* A small valid trace: 3 requests interleaved, L layers, E experts, top-k, optional look-ahead.
 * Token i of request r: prefill for its first 2 tokens, then decode. Routing is a deterministic
 * function of (i, l) with distinct experts per row. */
static trace *make_trace(uint32_t L, uint32_t E, uint32_t k, uint32_t D, uint32_t Kp,
                         uint64_t n_tokens, bool extras) {
    trace_meta m = {0};
    snprintf(m.model, sizeof m.model, "test-moe");
    snprintf(m.source, sizeof m.source, "synth:7");
    snprintf(m.tool_version, sizeof m.tool_version, "0.1.0");
    m.n_layers = L;
    m.n_experts = E;
    m.top_k = k;
    m.n_shared_experts = 1;
    m.gate_norm = GATE_SOFTMAX_TOPK;
    for (uint32_t l = 0; l < L; l++) m.model_layer[l] = 2 * l + 1;
    m.lookahead_depth = D;
    m.lookahead_k = Kp;
    m.has_importance = extras;
    m.has_token_ids = extras;
    m.model_config_hash = extras ? 0x0123456789abcdefull : 0;
    trace *t = trace_create(&m, n_tokens);
    uint32_t pos[3] = {0, 0, 0};
    for (uint64_t i = 0; i < n_tokens; i++) {
        /* request 0 first, then 1 and 2 join: ids by first appearance */
        uint32_t r = i < 2 ? 0 : (uint32_t)((i + 1) % 3);
        t->request_id[i] = r;
        t->position[i] = pos[r]++;
        t->phase[i] = t->position[i] < 2 ? TRACE_PREFILL : TRACE_DECODE;
        if (t->token_id) t->token_id[i] = (int32_t)(i * 7919 % 32000);
        for (uint32_t l = 0; l < L; l++) {
            uint16_t *ids = t->expert_ids + trace_route_index(t, i, l);
            float *g = t->gate_weights + trace_route_index(t, i, l);
            for (uint32_t j = 0; j < k; j++) {
                ids[j] = (uint16_t)((i * 5 + l * 3 + j) % E);
                g[j] = 1.0f / (float)k;
            }
            if (t->importance) t->importance[i * L + l] = (float)((i + l) % 5) * 0.25f;
            for (uint32_t d = 1; d <= D; d++)
                for (uint32_t c = 0; c < Kp; c++) {
                    size_t x = trace_lookahead_index(t, i, l, d) + c;
                    t->lookahead_ids[x] =
                        l + d < L ? (uint16_t)((i + l + d + c) % E) : TRACE_NO_EXPERT;
                    t->lookahead_scores[x] = l + d < L ? 1.0f / (float)(c + 1) : 0.0f;
                }
        }
    }
    t->params_json = extras ? strdup("{\"seed\": 7}") : NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_finish(t, "made", &err), MOESIM_OK, "%s", err.msg);
    return t;
}

TestSuite(trace);

Test(trace, finish_counts_requests_and_accepts_a_valid_trace) {
    trace *t = make_trace(4, 16, 2, 2, 3, 30, true);
    cr_assert_eq(t->n_requests, 3);
    trace_destroy(t);
}

Test(trace, destroy_accepts_null) { trace_destroy(NULL); }

/* One corruption of a valid trace and the message fragment trace_check must give. */
typedef struct check_case {
    const char *name;
    void (*corrupt)(trace *t);
    const char *fragment;
} check_case;

static void expert_out_of_range(trace *t) { t->expert_ids[trace_route_index(t, 12, 3) + 1] = 16; }
static void duplicate_expert(trace *t) {
    uint16_t *ids = t->expert_ids + trace_route_index(t, 5, 1);
    ids[1] = ids[0];
}
static void nan_gate(trace *t) { t->gate_weights[trace_route_index(t, 7, 2)] = NAN; }
static void negative_gate(trace *t) { t->gate_weights[trace_route_index(t, 7, 2) + 1] = -0.5f; }
static void gate_above_one(trace *t) { t->gate_weights[trace_route_index(t, 0, 0)] = 1.5f; }
static void partly_unrecorded(trace *t) {
    t->expert_ids[trace_route_index(t, 9, 0) + 1] = TRACE_NO_EXPERT;
}
static void unrecorded_with_gate(trace *t) {
    size_t x = trace_route_index(t, 9, 0);
    t->expert_ids[x] = t->expert_ids[x + 1] = TRACE_NO_EXPERT;
    t->gate_weights[x] = 0.0f;
}
static void request_not_dense(trace *t) { t->request_id[2] = 2; }
static void position_not_increasing(trace *t) { t->position[8] = 3; }
static void prefill_after_decode(trace *t) { t->phase[11] = TRACE_PREFILL; }
static void bad_phase(trace *t) { t->phase[4] = 7; }
static void negative_importance(trace *t) { t->importance[3 * 4 + 2] = -1.0f; }
static void inf_importance(trace *t) { t->importance[0] = INFINITY; }
static void lookahead_padding_inside(trace *t) {
    t->lookahead_ids[trace_lookahead_index(t, 4, 1, 2)] = TRACE_NO_EXPERT;
}
static void lookahead_missing_padding(trace *t) {
    t->lookahead_ids[trace_lookahead_index(t, 4, 3, 1) + 2] = 3;
}
static void lookahead_out_of_range(trace *t) {
    t->lookahead_ids[trace_lookahead_index(t, 4, 0, 1)] = 99;
}
static void lookahead_nan_score(trace *t) {
    t->lookahead_scores[trace_lookahead_index(t, 4, 0, 1)] = NAN;
}
static void negative_token_id(trace *t) { t->token_id[11] = -3; }
static void wrong_request_count(trace *t) { t->n_requests = 4; }
static void top_k_above_experts(trace *t) { t->meta.top_k = 17; }
static void layers_not_increasing(trace *t) { t->meta.model_layer[2] = t->meta.model_layer[1]; }
static void lookahead_k_without_depth(trace *t) {
    t->meta.lookahead_depth = 0; /* arrays stay: only the meta check runs into it */
    t->meta.lookahead_k = 3;
}

static const check_case check_cases[] = {
    {"expert id >= E", expert_out_of_range,
     "made: /routing/expert_ids[12][3][1]: expert id 16 >= 16 experts"},
    {"duplicate expert", duplicate_expert,
     "made: /routing/expert_ids[5][1][1]: expert 12 appears twice in one top-k (also at [0])"},
    {"NaN gate", nan_gate, "made: /routing/gate_weights[7][2][0]: gate weight nan is not finite"},
    {"negative gate", negative_gate,
     "made: /routing/gate_weights[7][2][1]: gate weight -0.5 outside [0, 1]"},
    {"gate above one", gate_above_one,
     "made: /routing/gate_weights[0][0][0]: gate weight 1.5 outside [0, 1]"},
    {"row partly unrecorded", partly_unrecorded,
     "made: /routing/expert_ids[9][0]: row partly unrecorded: slot 1 is 65535 (no expert) but "
     "slot 0 is expert 13"},
    {"unrecorded row with a gate", unrecorded_with_gate,
     "made: /routing/gate_weights[9][0][1]: gate weight 0.5 on an unrecorded row"},
    {"request ids not dense", request_not_dense,
     "made: /tokens/request_id[2]: request id 2 is not dense: expected at most 1"},
    {"positions not increasing", position_not_increasing,
     "made: /tokens/position[8]: position 3 of request 0 does not increase (previous 3)"},
    {"prefill after decode", prefill_after_decode,
     "made: /tokens/phase[11]: prefill token after a decode token in request 0"},
    {"phase out of range", bad_phase,
     "made: /tokens/phase[4]: phase 7 is neither 0 (prefill) nor 1 (decode)"},
    {"negative importance", negative_importance,
     "made: /routing/importance[3][2]: importance -1 is negative"},
    {"infinite importance", inf_importance,
     "made: /routing/importance[0][0]: importance inf is not finite"},
    {"look-ahead padding inside the model", lookahead_padding_inside,
     "made: /lookahead/expert_ids[4][1][1][0]: padding 65535 where layer 1 + distance 2 < 4"},
    {"look-ahead beyond the last layer not padded", lookahead_missing_padding,
     "made: /lookahead/expert_ids[4][3][0][2]: expected padding 65535 (layer 3 + distance 1 >= 4 "
     "layers), got 3"},
    {"look-ahead expert id >= E", lookahead_out_of_range,
     "made: /lookahead/expert_ids[4][0][0][0]: expert id 99 >= 16 experts"},
    {"look-ahead NaN score", lookahead_nan_score,
     "made: /lookahead/scores[4][0][0][0]: score nan is not finite"},
    {"negative token id", negative_token_id, "made: /tokens/token_id[11]: token id -3 is negative"},
    {"n_requests disagrees", wrong_request_count,
     "made: n_requests 4 disagrees with /tokens/request_id (3 requests)"},
    {"top_k above n_experts", top_k_above_experts, "made: top_k: expected 1..16"},
    {"model layers not increasing", layers_not_increasing,
     "made: /layers/model_layer[2]: layer 3 does not follow layer 3"},
    {"look-ahead K' without depth", lookahead_k_without_depth,
     "made: lookahead_k: expected 0 when lookahead_depth is 0, got 3"},
};

Test(trace, check_names_the_dataset_index_and_problem_of_every_broken_invariant) {
    for (size_t c = 0; c < sizeof check_cases / sizeof check_cases[0]; c++) {
        trace *t = make_trace(4, 16, 2, 2, 3, 30, true);
        check_cases[c].corrupt(t);
        moesim_error err = {0};
        cr_expect_eq(trace_check(t, "made", &err), MOESIM_EINPUT, "%s: accepted",
                     check_cases[c].name);
        cr_expect(strstr(err.msg, check_cases[c].fragment) != NULL, "%s: message '%s' lacks '%s'",
                  check_cases[c].name, err.msg, check_cases[c].fragment);
        if (t->meta.lookahead_depth == 0) t->meta.lookahead_k = 0;
        trace_destroy(t);
    }
}

Test(trace, an_all_unrecorded_row_with_zero_gates_is_valid) {
    trace *t = make_trace(4, 16, 2, 0, 0, 30, false);
    size_t x = trace_route_index(t, 9, 2);
    t->expert_ids[x] = t->expert_ids[x + 1] = TRACE_NO_EXPERT;
    t->gate_weights[x] = t->gate_weights[x + 1] = 0.0f;
    moesim_error err = {0};
    cr_assert_eq(trace_check(t, "made", &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
}

/* The check's fast path compares gate bits; -0 (>= 0 as a float) goes through the exact check. */
Test(trace, gates_of_minus_zero_and_exactly_one_are_valid) {
    trace *t = make_trace(4, 16, 2, 0, 0, 30, false);
    size_t x = trace_route_index(t, 9, 2);
    t->gate_weights[x] = -0.0f;
    t->gate_weights[x + 1] = 1.0f;
    moesim_error err = {0};
    cr_assert_eq(trace_check(t, "made", &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
}

/* The checks' fast passes scan 8 or 16 values a step with a scalar tail: one token of a
 * geometry whose rows span several steps (8 layers, look-ahead 3 x 8: 192 values a token, 120 of
 * them in layers that predict real layers only), a bad value tried at each of its positions. */
#define LANES_TOKEN 17

static void expect_check_names(trace *t, const char *want) {
    moesim_error err = {0};
    cr_assert_eq(trace_check(t, "made", &err), MOESIM_EINPUT, "accepted, expected '%s'", want);
    cr_assert(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
}

Test(trace, a_bad_lookahead_value_at_any_position_of_a_token_is_named) {
    const uint32_t L = 8, E = 64, D = 3, K = 8;
    const float bad_scores[] = {NAN, INFINITY, -INFINITY};
    trace *t = make_trace(L, E, 8, D, K, 30, false);
    char want[200];
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t d = 1; d <= D; d++)
            for (uint32_t c = 0; c < K; c++) {
                size_t x = trace_lookahead_index(t, LANES_TOKEN, l, d) + c;
                uint16_t id = t->lookahead_ids[x];
                float score = t->lookahead_scores[x];
                if (l + d < L) {
                    t->lookahead_ids[x] = (uint16_t)E;
                    snprintf(want, sizeof want,
                             "/lookahead/expert_ids[%d][%u][%u][%u]: expert id %u >= %u experts",
                             LANES_TOKEN, l, d - 1, c, E, E);
                } else {
                    t->lookahead_ids[x] = 5;
                    snprintf(want, sizeof want,
                             "/lookahead/expert_ids[%d][%u][%u][%u]: expected padding 65535",
                             LANES_TOKEN, l, d - 1, c);
                }
                expect_check_names(t, want);
                t->lookahead_ids[x] = id;
                for (size_t b = 0; b < sizeof bad_scores / sizeof bad_scores[0]; b++) {
                    t->lookahead_scores[x] = bad_scores[b];
                    snprintf(want, sizeof want,
                             "/lookahead/scores[%d][%u][%u][%u]: score %g is not finite",
                             LANES_TOKEN, l, d - 1, c, (double)bad_scores[b]);
                    expect_check_names(t, want);
                }
                t->lookahead_scores[x] = score;
            }
    trace_destroy(t);
}

Test(trace, a_bad_routing_value_at_any_position_of_a_token_is_named) {
    const uint32_t L = 8, E = 64, k = 8;
    trace *t = make_trace(L, E, k, 0, 0, 30, false);
    char want[200];
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t j = 0; j < k; j++) {
            size_t x = trace_route_index(t, LANES_TOKEN, l) + j;
            uint16_t id = t->expert_ids[x];
            float gate = t->gate_weights[x];
            t->expert_ids[x] = (uint16_t)E;
            snprintf(want, sizeof want,
                     "/routing/expert_ids[%d][%u][%u]: expert id %u >= %u experts", LANES_TOKEN, l,
                     j, E, E);
            expect_check_names(t, want);
            t->expert_ids[x] = id;
            t->gate_weights[x] = 1.5f;
            snprintf(want, sizeof want,
                     "/routing/gate_weights[%d][%u][%u]: gate weight 1.5 outside [0, 1]",
                     LANES_TOKEN, l, j);
            expect_check_names(t, want);
            t->gate_weights[x] = NAN;
            snprintf(want, sizeof want,
                     "/routing/gate_weights[%d][%u][%u]: gate weight nan is not finite",
                     LANES_TOKEN, l, j);
            expect_check_names(t, want);
            t->gate_weights[x] = gate;
        }
    trace_destroy(t);
}

/* The limits themselves pass at every position: id E - 1, scores +-FLT_MAX, gates -0 and 1. */
Test(trace, the_largest_valid_values_at_every_position_of_a_token_are_valid) {
    const uint32_t L = 8, E = 64, k = 8, D = 3, K = 8;
    trace *t = make_trace(L, E, k, D, K, 30, false);
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t d = 1; d <= D; d++)
            for (uint32_t c = 0; c < K; c++) {
                size_t x = trace_lookahead_index(t, LANES_TOKEN, l, d) + c;
                if (l + d < L) t->lookahead_ids[x] = (uint16_t)(E - 1 - c);
                t->lookahead_scores[x] = c % 2 ? FLT_MAX : -FLT_MAX;
            }
        for (uint32_t j = 0; j < k; j++)
            t->gate_weights[trace_route_index(t, LANES_TOKEN, l) + j] = j % 2 ? 1.0f : -0.0f;
        t->expert_ids[trace_route_index(t, LANES_TOKEN, l)] = (uint16_t)(E - 1);
    }
    moesim_error err = {0};
    cr_assert_eq(trace_check(t, "made", &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
}

Test(trace, an_empty_trace_is_rejected) {
    trace *one = make_trace(2, 8, 2, 0, 0, 1, false);
    trace *t = trace_create(&one->meta, 0);
    moesim_error err = {0};
    cr_expect_eq(trace_finish(t, "made", &err), MOESIM_EINPUT);
    cr_expect_str_eq(err.msg, "made: the trace holds no tokens");
    trace_destroy(t);
    trace_destroy(one);
}

Test(trace, meta_from_model_maps_moe_layers_in_model_order) {
    model_geometry g = {0};
    snprintf(g.name, sizeof g.name, "deepseek-v2-lite");
    g.n_layers = 27;
    g.n_moe_layers = 26;
    for (uint32_t l = 1; l < 27; l++) g.is_moe_layer[l] = true;
    g.n_experts = 64;
    g.top_k = 6;
    g.n_shared_experts = 2;
    g.gate_norm = GATE_SOFTMAX_ALL;
    trace_meta m = {0};
    trace_meta_from_model(&m, &g);
    cr_assert_str_eq(m.model, "deepseek-v2-lite");
    cr_assert_eq(m.n_layers, 26);
    cr_assert_eq(m.n_experts, 64);
    cr_assert_eq(m.top_k, 6);
    cr_assert_eq(m.n_shared_experts, 2);
    cr_assert_eq(m.gate_norm, GATE_SOFTMAX_ALL);
    cr_assert_eq(m.model_layer[0], 1);
    cr_assert_eq(m.model_layer[25], 26);
    moesim_error err = {0};
    cr_assert_eq(trace_meta_check(&m, "meta", &err), MOESIM_OK, "%s", err.msg);
}

/* ---- HDF5 form ------------------------------------------------------------------------- */

static void assert_same_trace(const trace *a, const trace *b) {
    const trace_meta *x = &a->meta, *y = &b->meta;
    cr_assert_str_eq(x->model, y->model);
    cr_assert_str_eq(x->source, y->source);
    cr_assert_str_eq(x->tool_version, y->tool_version);
    cr_assert_eq(x->n_layers, y->n_layers);
    cr_assert_eq(x->n_experts, y->n_experts);
    cr_assert_eq(x->top_k, y->top_k);
    cr_assert_eq(x->n_shared_experts, y->n_shared_experts);
    cr_assert_eq(x->gate_norm, y->gate_norm);
    cr_assert_arr_eq(x->model_layer, y->model_layer, x->n_layers * sizeof x->model_layer[0]);
    cr_assert_eq(x->lookahead_depth, y->lookahead_depth);
    cr_assert_eq(x->lookahead_k, y->lookahead_k);
    cr_assert_eq(x->has_importance, y->has_importance);
    cr_assert_eq(x->has_token_ids, y->has_token_ids);
    cr_assert_eq(x->model_config_hash, y->model_config_hash);
    cr_assert_eq(a->n_tokens, b->n_tokens);
    cr_assert_eq(a->n_requests, b->n_requests);
    size_t n = a->n_tokens, route = n * trace_route_values(x), look = n * trace_lookahead_values(x);
    cr_assert_arr_eq(a->request_id, b->request_id, n * sizeof(uint32_t));
    cr_assert_arr_eq(a->position, b->position, n * sizeof(uint32_t));
    cr_assert_arr_eq(a->phase, b->phase, n);
    cr_assert_eq(!a->token_id, !b->token_id);
    if (a->token_id) cr_assert_arr_eq(a->token_id, b->token_id, n * sizeof(int32_t));
    cr_assert_arr_eq(a->expert_ids, b->expert_ids, route * sizeof(uint16_t));
    cr_assert_arr_eq(a->gate_weights, b->gate_weights, route * sizeof(float));
    cr_assert_eq(!a->importance, !b->importance);
    if (a->importance) cr_assert_arr_eq(a->importance, b->importance, n * x->n_layers * 4);
    cr_assert_eq(!a->lookahead_ids, !b->lookahead_ids);
    if (look) {
        cr_assert_arr_eq(a->lookahead_ids, b->lookahead_ids, look * sizeof(uint16_t));
        cr_assert_arr_eq(a->lookahead_scores, b->lookahead_scores, look * sizeof(float));
    }
    cr_assert_eq(!a->params_json, !b->params_json);
    if (a->params_json) cr_assert_str_eq(a->params_json, b->params_json);
}

static void round_trip(trace *t, const char *name) {
    const char *path = test_tmp_path(name);
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace *back = NULL;
    cr_assert_eq(trace_read(path, &back, &err), MOESIM_OK, "%s", err.msg);
    assert_same_trace(t, back);
    trace_destroy(back);
    trace_destroy(t);
}

Test(trace, write_then_read_gives_back_every_field_with_all_optional_parts) {
    round_trip(make_trace(6, 32, 4, 3, 5, 5000, true), "full.h5");
}

Test(trace, write_then_read_gives_back_a_trace_without_optional_parts) {
    round_trip(make_trace(3, 8, 2, 0, 0, 17, false), "plain.h5");
}

Test(trace, write_then_read_keeps_unrecorded_rows_and_gate_rule_all) {
    trace *t = make_trace(4, 16, 2, 1, 2, 40, false);
    t->meta.gate_norm = GATE_SOFTMAX_ALL;
    size_t x = trace_route_index(t, 3, 1);
    t->expert_ids[x] = t->expert_ids[x + 1] = TRACE_NO_EXPERT;
    t->gate_weights[x] = t->gate_weights[x + 1] = 0.0f;
    round_trip(t, "unrecorded.h5");
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(*len ? *len : 1);
    cr_assert_eq(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

Test(trace, the_same_trace_gives_a_byte_identical_file) {
    /* 25001 tokens: several chunks along N and a partial last one in every dataset */
    trace *t = make_trace(6, 32, 4, 3, 5, 25001, true);
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s", test_tmp_path("same-a.h5"));
    snprintf(b, sizeof b, "%s", test_tmp_path("same-b.h5"));
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, a, &err), MOESIM_OK, "%s", err.msg);
    sleep(1); /* a stored modification time would differ now */
    cr_assert_eq(trace_write(t, b, &err), MOESIM_OK, "%s", err.msg);
    size_t la, lb;
    unsigned char *da = slurp(a, &la), *db = slurp(b, &lb);
    cr_assert_eq(la, lb);
    cr_assert(memcmp(da, db, la) == 0, "files differ");
    free(da);
    free(db);
    trace_destroy(t);
}

/* Tokens [from, from + n) of `t` as a block for trace_writer_append: a view sharing t's arrays
 * (never trace_destroy'ed). */
static trace block_view(const trace *t, uint64_t from, uint64_t n) {
    trace b = *t;
    b.n_tokens = n;
    b.request_id += from;
    b.position += from;
    b.phase += from;
    if (b.token_id) b.token_id += from;
    b.expert_ids += from * trace_route_values(&t->meta);
    b.gate_weights += from * trace_route_values(&t->meta);
    if (b.importance) b.importance += from * t->meta.n_layers;
    if (b.lookahead_ids) {
        b.lookahead_ids += from * trace_lookahead_values(&t->meta);
        b.lookahead_scores += from * trace_lookahead_values(&t->meta);
    }
    b.params_json = NULL;
    return b;
}

/* Streams `t` to `path` in blocks whose sizes cycle through sizes[]; returns the first
 * failure (the writer aborted) or MOESIM_OK (committed). */
static moesim_status stream_trace(const trace *t, const char *path, const uint64_t *sizes,
                                  size_t n_sizes, moesim_error *err) {
    trace_writer *w = NULL;
    moesim_status st =
        trace_writer_open(&t->meta, t->n_tokens, t->n_requests, t->params_json, path, &w, err);
    if (st) return st;
    for (uint64_t from = 0, i = 0; from < t->n_tokens; i++) {
        uint64_t n = sizes[i % n_sizes];
        if (n > t->n_tokens - from) n = t->n_tokens - from;
        trace b = block_view(t, from, n);
        if ((st = trace_writer_append(w, &b, err))) {
            trace_writer_abort(w);
            return st;
        }
        from += n;
    }
    return trace_writer_commit(w, err);
}

Test(trace, streamed_blocks_of_any_size_give_the_file_trace_write_gives) {
    /* ~10.6 KB per token: the writer flushes every ~1580 tokens (16 MiB), so 8001 tokens cross
     * five flushes, with partial chunks left over at each and at the end */
    trace *t = make_trace(24, 64, 8, 4, 16, 8001, true);
    char whole[4096];
    snprintf(whole, sizeof whole, "%s", test_tmp_path("whole.h5"));
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, whole, &err), MOESIM_OK, "%s", err.msg);
    size_t lw;
    unsigned char *want = slurp(whole, &lw);
    static const uint64_t single[] = {1}, mixed[] = {7, 1000, 1, 333, 4096}, big[] = {8000};
    const struct {
        const uint64_t *sizes;
        size_t n;
    } splits[] = {{single, 1}, {mixed, 5}, {big, 1}};
    for (size_t s = 0; s < sizeof splits / sizeof *splits; s++) {
        const char *path = test_tmp_path("streamed.h5");
        cr_assert_eq(stream_trace(t, path, splits[s].sizes, splits[s].n, &err), MOESIM_OK, "%s",
                     err.msg);
        size_t lg;
        unsigned char *got = slurp(path, &lg);
        cr_expect(lg == lw && memcmp(got, want, lw) == 0, "split %zu: file differs", s);
        free(got);
    }
    trace *back = NULL;
    cr_assert_eq(trace_read(test_tmp_path("streamed.h5"), &back, &err), MOESIM_OK, "%s", err.msg);
    assert_same_trace(t, back);
    trace_destroy(back);
    free(want);
    trace_destroy(t);
}

Test(trace,
     a_stream_broken_in_a_later_block_names_the_token_of_the_whole_trace_and_leaves_no_file) {
    trace *t = make_trace(4, 16, 2, 2, 3, 3000, true);
    t->expert_ids[trace_route_index(t, 2500, 1)] = 99;
    const char *path = test_tmp_path("broken-stream.h5");
    moesim_error err = {0};
    static const uint64_t blocks[] = {1000};
    cr_assert_eq(stream_trace(t, path, blocks, 1, &err), MOESIM_EINPUT);
    cr_expect(strstr(err.msg, "/routing/expert_ids[2500][1][0]: expert id 99 >= 16 experts") !=
                  NULL,
              "%s", err.msg);
    cr_expect_not(test_file_exists(path));
    trace_destroy(t);
}

Test(trace, a_stream_checks_request_positions_across_block_boundaries) {
    trace *t = make_trace(4, 16, 2, 0, 0, 30, false);
    t->position[8] = 3; /* token 8 is the first of the second block */
    moesim_error err = {0};
    static const uint64_t blocks[] = {8};
    cr_assert_eq(stream_trace(t, test_tmp_path("positions.h5"), blocks, 1, &err), MOESIM_EINPUT);
    cr_expect(strstr(err.msg, "/tokens/position[8]: position 3") != NULL, "%s", err.msg);
    trace_destroy(t);
}

Test(trace, a_stream_with_more_or_fewer_tokens_than_announced_fails_without_a_file) {
    trace *t = make_trace(4, 16, 2, 0, 0, 30, false);
    const char *path = test_tmp_path("count.h5");
    moesim_error err = {0};
    trace_writer *w = NULL;
    cr_assert_eq(trace_writer_open(&t->meta, 29, t->n_requests, NULL, path, &w, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(trace_writer_append(w, t, &err), MOESIM_EINPUT);
    cr_expect(strstr(err.msg, "1 more tokens than the 29 announced") != NULL, "%s", err.msg);
    trace_writer_abort(w);
    cr_expect_not(test_file_exists(path));
    cr_assert_eq(trace_writer_open(&t->meta, 31, t->n_requests, NULL, path, &w, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(trace_writer_append(w, t, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_writer_commit(w, &err), MOESIM_EINPUT);
    cr_expect(strstr(err.msg, "30 tokens appended, 31 announced") != NULL, "%s", err.msg);
    cr_expect_not(test_file_exists(path));
    trace_destroy(t);
}

/* The writer compresses chunks itself (H5Dwrite_chunk): HDF5's own filter pipeline, which
 * h5py and every other reader use, must decode them to the same values. */
static void expect_h5dread(hid_t f, const char *name, hid_t mtype, const void *want, size_t bytes) {
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    cr_assert_geq(d, 0, "%s missing", name);
    void *got = malloc(bytes);
    cr_assert_geq(H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, got), 0, "%s", name);
    cr_expect(memcmp(got, want, bytes) == 0, "%s differs through H5Dread", name);
    free(got);
    H5Dclose(d);
}

Test(trace, files_read_back_through_the_hdf5_filter_pipeline) {
    /* 25001 tokens: many chunks, a partial last one */
    trace *t = make_trace(6, 32, 4, 3, 5, 25001, true);
    const char *path = test_tmp_path("pipeline.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    size_t n = t->n_tokens, route = n * trace_route_values(&t->meta),
           look = n * trace_lookahead_values(&t->meta);
    expect_h5dread(f, "/tokens/request_id", H5T_NATIVE_UINT32, t->request_id, n * 4);
    expect_h5dread(f, "/tokens/position", H5T_NATIVE_UINT32, t->position, n * 4);
    expect_h5dread(f, "/tokens/phase", H5T_NATIVE_UINT8, t->phase, n);
    expect_h5dread(f, "/tokens/token_id", H5T_NATIVE_INT32, t->token_id, n * 4);
    expect_h5dread(f, "/routing/expert_ids", H5T_NATIVE_UINT16, t->expert_ids, route * 2);
    expect_h5dread(f, "/routing/gate_weights", H5T_NATIVE_FLOAT, t->gate_weights, route * 4);
    expect_h5dread(f, "/routing/importance", H5T_NATIVE_FLOAT, t->importance,
                   n * t->meta.n_layers * 4);
    expect_h5dread(f, "/lookahead/expert_ids", H5T_NATIVE_UINT16, t->lookahead_ids, look * 2);
    expect_h5dread(f, "/lookahead/scores", H5T_NATIVE_FLOAT, t->lookahead_scores, look * 4);
    expect_h5dread(f, "/layers/model_layer", H5T_NATIVE_UINT32, t->meta.model_layer,
                   t->meta.n_layers * 4);
    H5Fclose(f);
    trace_destroy(t);
}

/* The chunk shape of dataset `name` in the file at f (dims[0]: rows per chunk). */
static void chunk_dims_of(hid_t f, const char *name, hsize_t dims[4]) {
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    cr_assert_geq(d, 0, "%s missing", name);
    hid_t dcpl = H5Dget_create_plist(d);
    cr_assert_geq(H5Pget_chunk(dcpl, 4, dims), 1, "%s is not chunked", name);
    H5Pclose(dcpl);
    H5Dclose(d);
}

static hsize_t chunk_rows_of(hid_t f, const char *name) {
    hsize_t dims[4] = {0};
    chunk_dims_of(f, name, dims);
    return dims[0];
}

Test(trace, one_value_per_token_is_chunked_by_64_kib_routing_by_1_mib_lookahead_by_part) {
    /* 40000 tokens of 2 layers x top-2: a routing row is 8 bytes, 1 MiB would be 131072 rows */
    trace *t = make_trace(2, 8, 2, 3, 4, 40000, true);
    const char *path = test_tmp_path("chunks.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    cr_expect_eq(chunk_rows_of(f, "/tokens/request_id"), 16384);
    cr_expect_eq(chunk_rows_of(f, "/tokens/position"), 16384);
    cr_expect_eq(chunk_rows_of(f, "/tokens/token_id"), 16384);
    cr_expect_eq(chunk_rows_of(f, "/tokens/phase"), 40000); /* 65536 one-byte values, at most N */
    cr_expect_eq(chunk_rows_of(f, "/routing/expert_ids"), 40000);
    cr_expect_eq(chunk_rows_of(f, "/routing/gate_weights"), 40000); /* 65536 rows of 16 bytes */
    /* a look-ahead row: 2 layers x D = 3 x K' = 4 scores, 96 bytes; a chunk holds one distance
     * and top_k = 2 of the candidates of 21845 rows, the bytes of one distance of 10922 rows */
    hsize_t dims[4] = {0};
    chunk_dims_of(f, "/lookahead/scores", dims);
    cr_expect(dims[0] == 21845 && dims[1] == 2 && dims[2] == 1 && dims[3] == 2,
              "{%llu, %llu, %llu, %llu}", (unsigned long long)dims[0], (unsigned long long)dims[1],
              (unsigned long long)dims[2], (unsigned long long)dims[3]);
    chunk_dims_of(f, "/lookahead/expert_ids", dims); /* 43690 rows, at most N */
    cr_expect(dims[0] == 40000 && dims[2] == 1 && dims[3] == 2, "{%llu, ..., %llu}",
              (unsigned long long)dims[0], (unsigned long long)dims[3]);
    H5Fclose(f);
    trace *back = NULL;
    cr_assert_eq(trace_read(path, &back, &err), MOESIM_OK, "%s", err.msg);
    assert_same_trace(t, back);
    trace_destroy(back);
    trace_destroy(t);
}

Test(trace, an_invalid_trace_is_not_written_and_leaves_no_file) {
    trace *t = make_trace(4, 16, 2, 0, 0, 30, false);
    t->expert_ids[7] = 200;
    const char *path = test_tmp_path("invalid-out.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "expert id 200 >= 16 experts") != NULL, "%s", err.msg);
    cr_assert_not(test_file_exists(path));
    trace_destroy(t);
}

Test(trace, a_failed_write_keeps_the_previous_file_untouched) {
    trace *good = make_trace(4, 16, 2, 0, 0, 30, false);
    const char *path = test_tmp_path("keep.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(good, path, &err), MOESIM_OK, "%s", err.msg);
    trace *bad = make_trace(4, 16, 2, 0, 0, 30, false);
    bad->gate_weights[3] = NAN;
    cr_assert_eq(trace_write(bad, path, &err), MOESIM_EINPUT);
    trace *back = NULL;
    cr_assert_eq(trace_read(path, &back, &err), MOESIM_OK, "%s", err.msg);
    assert_same_trace(good, back);
    trace_destroy(back);
    trace_destroy(bad);
    trace_destroy(good);
}

Test(trace, writing_into_a_missing_folder_fails_with_the_path) {
    trace *t = make_trace(2, 8, 2, 0, 0, 5, false);
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, "/nonexistent-moesim-dir/x.h5", &err), MOESIM_EIO);
    cr_assert(strstr(err.msg, "/nonexistent-moesim-dir/x.h5: cannot create output file") != NULL,
              "%s", err.msg);
    trace_destroy(t);
}

/* Every shipped model config gives a meta that passes trace_meta_check, with one trace layer
 * per MoE layer of the model, in model order. */
Test(trace, meta_from_every_model_config_is_valid) {
    static const struct {
        const char *name;
        uint32_t layers, experts, top_k, first_model_layer;
    } models[] = {
        {"mixtral-8x7b", 32, 8, 2, 0},      {"phi-3.5-moe", 32, 16, 2, 0},
        {"qwen3-30b-a3b", 48, 128, 8, 0},   {"qwen3-next-80b-a3b", 48, 512, 10, 0},
        {"olmoe-1b-7b", 16, 64, 8, 0},      {"qwen1.5-moe-a2.7b", 24, 60, 4, 0},
        {"deepseek-v2-lite", 26, 64, 6, 1},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        model_geometry g;
        moesim_error err = {0};
        cr_assert_eq(model_load_by_name(models[i].name, &g, &err), MOESIM_OK, "%s", err.msg);
        trace_meta m = {0};
        trace_meta_from_model(&m, &g);
        cr_expect_str_eq(m.model, models[i].name);
        cr_expect_eq(m.n_layers, models[i].layers, "%s", models[i].name);
        cr_expect_eq(m.n_experts, models[i].experts, "%s", models[i].name);
        cr_expect_eq(m.top_k, models[i].top_k, "%s", models[i].name);
        cr_expect_eq(m.model_layer[0], models[i].first_model_layer, "%s", models[i].name);
        cr_expect_eq(m.model_layer[m.n_layers - 1], g.n_layers - 1, "%s", models[i].name);
        cr_expect_eq(trace_meta_check(&m, models[i].name, &err), MOESIM_OK, "%s", err.msg);
    }
}

/* ---- the commands ---------------------------------------------------------------------- */

static const char *write_full(const char *name) {
    trace *t = make_trace(6, 32, 4, 3, 5, 50, true);
    const char *path = test_tmp_path(name);
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
    return path;
}

Test(trace, info_prints_model_tokens_requests_geometry_and_optional_parts) {
    const char *path = write_full("info.h5");
    char out[4096] = "", err[1024] = "";
    cr_assert_eq(test_run_moesim(out, sizeof out, err, sizeof err, "trace", "info", path, NULL), 0,
                 "%s", err);
    const char *want[] = {
        "model       test-moe (config hash 0123456789abcdef)\n",
        "source      synth:7\n",
        "tokens      50 (prefill 6, decode 44)\n",
        "requests    3\n",
        "layers      6 MoE (model layers 1..11)\n",
        "experts     32 routed, top-4, 1 shared; gates: softmax over the top-k\n",
        "look-ahead  depth 3, K' 5\n",
        "optional    importance yes, token_id yes, params_json yes\n",
        "unrecorded  0 of 300 token x layer rows\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(out, want[i]) != NULL, "missing '%s' in:\n%s", want[i], out);
    cr_expect_str_empty(err);
}

Test(trace, info_json_gives_the_same_figures_as_an_object) {
    const char *path = write_full("info-json.h5");
    char out[8192] = "", err[1024] = "";
    cr_assert_eq(
        test_run_moesim(out, sizeof out, err, sizeof err, "trace", "info", "--json", path, NULL), 0,
        "%s", err);
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    cr_assert_not_null(j, "not JSON (%s): %s", jerr.text, out);
    cr_expect_str_eq(json_string_value(json_object_get(j, "model")), "test-moe");
    cr_expect_str_eq(json_string_value(json_object_get(j, "source")), "synth:7");
    cr_expect_eq(json_integer_value(json_object_get(j, "tokens")), 50);
    cr_expect_eq(json_integer_value(json_object_get(j, "prefill_tokens")), 6);
    cr_expect_eq(json_integer_value(json_object_get(j, "decode_tokens")), 44);
    cr_expect_eq(json_integer_value(json_object_get(j, "requests")), 3);
    cr_expect_eq(json_integer_value(json_object_get(j, "layers")), 6);
    cr_expect_eq(json_integer_value(json_array_get(json_object_get(j, "model_layers"), 5)), 11);
    cr_expect_eq(json_integer_value(json_object_get(j, "experts")), 32);
    cr_expect_eq(json_integer_value(json_object_get(j, "top_k")), 4);
    cr_expect_eq(json_integer_value(json_object_get(j, "lookahead_depth")), 3);
    cr_expect_eq(json_integer_value(json_object_get(j, "lookahead_k")), 5);
    cr_expect(json_is_true(json_object_get(j, "has_importance")));
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "params"), "seed")), 7);
    cr_expect_gt(json_integer_value(json_object_get(j, "file_bytes")), 0);
    json_decref(j);
}

Test(trace, validate_prints_ok_with_token_and_request_counts) {
    const char *path = write_full("validate.h5");
    char out[4096] = "", err[1024] = "", want[4200];
    cr_assert_eq(test_run_moesim(out, sizeof out, err, sizeof err, "trace", "validate", path, NULL),
                 0, "%s", err);
    snprintf(want, sizeof want, "%s: ok (50 tokens, 3 requests)\n", path);
    cr_expect_str_eq(out, want);
    cr_assert_eq(test_run_moesim(out, sizeof out, err, sizeof err, "trace", "validate", "--json",
                                 path, NULL),
                 0, "%s", err);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    cr_expect(json_is_true(json_object_get(j, "ok")));
    cr_expect_eq(json_integer_value(json_object_get(j, "tokens")), 50);
    json_decref(j);
}

/* Usage mistakes: exit 2, one line on stderr pointing at --help, nothing on stdout. */
Test(trace, commands_have_help_and_reject_bad_usage_with_exit_2) {
    static const struct {
        const char *cmd, *arg1, *arg2;
        int rc;
        const char *fragment; /* in stdout for rc 0, else in stderr */
    } cases[] = {
        {"info", "--help", NULL, 0, "usage: moesim trace info FILE [--json]"},
        {"validate", "-h", NULL, 0, "usage: moesim trace validate FILE [--json]"},
        {"info", NULL, NULL, 2, "moesim trace info: missing FILE (see 'moesim trace info --help')"},
        {"validate", "--frobnicate", "x.h5", 2,
         "moesim trace validate: unknown option '--frobnicate'"},
        {"info", "a.h5", "b.h5", 2, "moesim trace info: one FILE expected, got 'a.h5' and 'b.h5'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[4096] = "", err[1024] = "";
        int rc = test_run_moesim(out, sizeof out, err, sizeof err, "trace", cases[i].cmd,
                                 cases[i].arg1, cases[i].arg2, NULL);
        cr_expect_eq(rc, cases[i].rc, "case %zu: exit %d (%s)", i, rc, err);
        const char *where = cases[i].rc ? err : out;
        cr_expect(strstr(where, cases[i].fragment) != NULL, "case %zu: '%s' lacks '%s'", i, where,
                  cases[i].fragment);
        if (cases[i].rc) cr_expect_str_empty(out, "case %zu", i);
    }
}

Test(trace, params_json_beyond_one_mebibyte_is_refused_before_writing) {
    trace *t = make_trace(2, 8, 2, 0, 0, 5, false);
    size_t n = (1u << 20) + 1;
    t->params_json = malloc(n + 1);
    memset(t->params_json, ' ', n);
    t->params_json[n] = '\0';
    const char *path = test_tmp_path("big-params.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "params_json: 1048577 characters, at most 1048576 can be stored"),
              "%s", err.msg);
    cr_assert_not(test_file_exists(path));
    trace_destroy(t);
}

/* ---- trace_stream ---- */

Test(trace, a_stream_gives_every_row_trace_read_gives_in_any_order_of_visits) {
    trace *t = make_trace(6, 32, 4, 3, 5, 5000, true);
    const char *path = test_tmp_path("stream.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_stream *s = NULL;
    cr_assert_eq(trace_stream_open(path, &s, &err), MOESIM_OK, "%s", err.msg);
    const trace *k = trace_stream_tokens(s);
    cr_assert_eq(k->n_tokens, t->n_tokens);
    cr_assert_eq(k->n_requests, t->n_requests);
    cr_assert_null(k->expert_ids);
    cr_assert_null(k->request_id);
    cr_assert_str_eq(k->params_json, t->params_json);
    /* requests 1 and 2 interleave: the index lists each one's tokens, as the trace's own does */
    trace_request_index want;
    trace_request_index_build(&want, t);
    const trace_request_index *got = trace_stream_requests(s);
    cr_assert_not_null(want.tokens);
    cr_assert_eq(got->n_requests, want.n_requests);
    for (uint32_t r = 0; r < want.n_requests; r++) {
        cr_assert_eq(got->n_tokens[r], want.n_tokens[r]);
        cr_assert_eq(got->n_prefill[r], want.n_prefill[r]);
        for (uint32_t c = 0; c < want.n_tokens[r]; c++) {
            uint64_t tok = trace_request_token(got, r, c);
            cr_assert_eq(tok, trace_request_token(&want, r, c));
            cr_assert_eq(t->request_id[tok], r);
        }
    }
    trace_request_index_free(&want);
    /* blocks of 37 tokens, 2 cached; visits hop between two far-apart tokens */
    trace_stream_set_cache(s, 37, 2);
    size_t R = trace_route_values(&t->meta), A = trace_lookahead_values(&t->meta);
    for (uint64_t j = 0; j < t->n_tokens; j++) {
        uint64_t i = j % 2 ? t->n_tokens - 1 - j / 2 : j / 2, at;
        const trace *b = trace_stream_row(s, i, &at);
        cr_assert_eq(memcmp(trace_experts(b, at, 0), trace_experts(t, i, 0), R * 2), 0, "%lu",
                     (unsigned long)i);
        cr_assert_eq(b->position[at], t->position[i]);
        cr_assert_eq(b->request_id[at], t->request_id[i]);
        cr_assert_eq(memcmp(trace_gates(b, at, 0), trace_gates(t, i, 0), R * 4), 0);
        cr_assert_eq(memcmp(b->importance + at * 6, t->importance + i * 6, 6 * 4), 0);
        cr_assert_eq(memcmp(b->lookahead_ids + trace_lookahead_index(b, at, 0, 1),
                            t->lookahead_ids + trace_lookahead_index(t, i, 0, 1), A * 2),
                     0);
        cr_assert_eq(memcmp(b->lookahead_scores + trace_lookahead_index(b, at, 0, 1),
                            t->lookahead_scores + trace_lookahead_index(t, i, 0, 1), A * 4),
                     0);
    }
    trace_stream_close(s);
    trace_destroy(t);
}

Test(trace, a_stream_refuses_what_trace_read_refuses_with_the_same_line) {
    const char *path = test_tmp_path("not-a-trace.h5");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("not hdf5\n", f);
    fclose(f);
    moesim_error e1 = {0}, e2 = {0};
    trace *t = NULL;
    trace_stream *s = NULL;
    cr_assert_eq(trace_read(path, &t, &e1), MOESIM_EINPUT);
    cr_assert_eq(trace_stream_open(path, &s, &e2), MOESIM_EINPUT);
    cr_assert_null(s);
    cr_assert_str_eq(e1.msg, e2.msg);
    trace_stream_close(NULL);
}

/* Sets value `at` (a flat index) of dataset `name` in the file at `path` to *value (of memory
 * type `mtype`), through HDF5's own filters. */
static void poke_value(const char *path, const char *name, hsize_t rank, hsize_t at, hid_t mtype,
                       const void *value) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT), fs = H5Dget_space(d);
    hsize_t dims[4], start[4] = {0}, one[4] = {1, 1, 1, 1};
    cr_assert_eq(H5Sget_simple_extent_dims(fs, dims, NULL), (int)rank);
    for (hsize_t i = rank; i-- > 0;) {
        start[i] = at % dims[i];
        at /= dims[i];
    }
    hid_t ms = H5Screate_simple(1, one, NULL);
    cr_assert_geq(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, one, NULL), 0);
    cr_assert_geq(H5Dwrite(d, mtype, ms, fs, H5P_DEFAULT, value), 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
    H5Fclose(f);
}

/* Every chunk of dataset `name` from row `from_row` on replaced by as many bytes that do not
 * inflate. */
static void garble_chunks(const char *path, const char *name, hsize_t from_row) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    cr_assert(f >= 0 && d >= 0);
    hid_t space = H5Dget_space(d);
    hsize_t n_chunks = 0;
    cr_assert_geq(H5Dget_num_chunks(d, space, &n_chunks), 0);
    cr_assert_gt(n_chunks, 0);
    for (hsize_t c = 0; c < n_chunks; c++) {
        hsize_t offset[4], size;
        unsigned mask;
        haddr_t addr;
        cr_assert_geq(H5Dget_chunk_info(d, space, c, offset, &mask, &addr, &size), 0);
        if (offset[0] < from_row) continue;
        unsigned char *junk = malloc(size);
        memset(junk, 0xA5, size);
        cr_assert_geq(H5Dwrite_chunk(d, H5P_DEFAULT, 0, offset, size, junk), 0);
        free(junk);
    }
    H5Sclose(space);
    H5Dclose(d);
    H5Fclose(f);
}

Test(trace, a_stream_that_skips_lookahead_carries_none_and_counts_its_first_candidate_hits) {
    trace *t = make_trace(6, 32, 4, 3, 5, 700, true);
    const uint32_t L = t->meta.n_layers;
    uint64_t right = 0, total = 0;
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        for (uint32_t l = 0; l + 1 < L; l++) { /* every third prediction right */
            uint16_t *pred = t->lookahead_ids + trace_lookahead_index(t, i, l, 1);
            if ((i + l) % 3 == 0) pred[0] = trace_experts(t, i, l + 1)[0];
            right += pred[0] == trace_experts(t, i, l + 1)[0];
            total++;
        }
    }
    cr_assert_gt(right, 0);
    const char *path = test_tmp_path("stream-skip.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_stream *s = NULL;
    trace_stream_options skip = {.skip_lookahead = true};
    cr_assert_eq(trace_stream_open_with(path, &skip, &s, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_stream_tokens(s)->meta.lookahead_depth, 3); /* the file's */
    cr_assert_eq(trace_stream_rows_meta(s)->lookahead_depth, 0);
    uint64_t got_right, got_total;
    trace_stream_lookahead_first_hits(s, &got_right, &got_total);
    cr_assert_eq(got_right, right);
    cr_assert_eq(got_total, total);
    trace_stream_set_cache(s, 64, 2);
    size_t R = trace_route_values(&t->meta);
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        uint64_t at;
        const trace *b = trace_stream_row(s, i, &at);
        cr_assert_null(b->lookahead_ids);
        cr_assert_null(b->lookahead_scores);
        cr_assert_eq(memcmp(trace_experts(b, at, 0), trace_experts(t, i, 0), R * 2), 0);
        cr_assert_eq(memcmp(trace_gates(b, at, 0), trace_gates(t, i, 0), R * 4), 0);
        cr_assert_eq(memcmp(b->importance + at * L, t->importance + i * L, L * 4), 0);
    }
    trace_stream_close(s);
    /* a stream reading every row counts nothing (the simulator counts from the rows) */
    cr_assert_eq(trace_stream_open(path, &s, &err), MOESIM_OK, "%s", err.msg);
    trace_stream_lookahead_first_hits(s, &got_right, &got_total);
    cr_assert_eq(got_total, 0);
    trace_stream_close(s);
    trace_destroy(t);
}

Test(trace, a_bad_lookahead_score_fails_a_stream_that_reads_it_and_not_one_that_skips_it) {
    trace *t = make_trace(4, 16, 2, 2, 3, 40, false);
    const char *path = test_tmp_path("stream-skip-nan.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    const float nan = NAN;
    poke_value(path, "/lookahead/scores", 4, 17 * 4 * 2 * 3 + 1, H5T_NATIVE_FLOAT, &nan);
    trace_stream *s = NULL;
    cr_assert_eq(trace_stream_open(path, &s, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "look"), "%s", err.msg);
    trace_stream_options skip = {.skip_lookahead = true};
    cr_assert_eq(trace_stream_open_with(path, &skip, &s, &err), MOESIM_OK, "%s", err.msg);
    trace_stream_close(s);
    /* trace validate (whole-trace reading) still checks every value */
    trace *back = NULL;
    cr_assert_eq(trace_read(path, &back, &err), MOESIM_EINPUT);
    cr_assert_null(back);
    trace_destroy(t);
}

/* Several blocks of a stream (48 layers of top-8 routing: about 1,700 tokens a block). */
static trace *make_blocks_trace(void) { return make_trace(48, 64, 8, 2, 4, 4000, true); }

/* Writes t to path with the last token's layer-47 slot-1 id out of range (64 = E); `whole`
 * receives trace_read's message for the file. */
static void write_with_bad_last_id(const trace *t, const char *path, moesim_error *whole) {
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    const uint64_t last = t->n_tokens - 1;
    const uint16_t bad = 64; /* = E */
    poke_value(path, "/routing/expert_ids", 3, (last * 48 + 47) * 8 + 1, H5T_NATIVE_UINT16, &bad);
    trace *back = NULL;
    cr_assert_eq(trace_read(path, &back, whole), MOESIM_EINPUT);
}

Test(trace, a_stream_checking_rows_on_read_opens_a_bad_last_block_and_reports_it_later) {
    trace *t = make_blocks_trace();
    const char *path = test_tmp_path("stream-late-bad.h5");
    moesim_error err = {0}, whole = {0};
    write_with_bad_last_id(t, path, &whole);
    const uint64_t last = t->n_tokens - 1;
    cr_assert(strstr(whole.msg, "/routing/expert_ids[3999][47][1]: expert id 64 >= 64 experts"),
              "%s", whole.msg);
    trace_stream *s = NULL;
    cr_assert_eq(trace_stream_open(path, &s, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, whole.msg);
    trace_stream_options on_read = {.skip_lookahead = true, .check_rows_on_read = true};
    cr_assert_eq(trace_stream_open_with(path, &on_read, &s, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_gt(t->n_tokens / trace_stream_block_tokens(s), 1);
    uint64_t at;
    const trace *b = trace_stream_row(s, 0, &at); /* a good block: its rows as written */
    cr_assert_eq(memcmp(trace_experts(b, at, 0), trace_experts(t, 0, 0), 48 * 8 * 2), 0);
    /* the bad block: blank rows for the rest of the run (every layer unrecorded) */
    b = trace_stream_row(s, last, &at);
    for (uint32_t l = 0; l < 48; l++) {
        cr_assert_eq(trace_experts(b, at, l)[1], TRACE_NO_EXPERT);
        cr_assert_eq(trace_gates(b, at, l)[0], 0.0f);
    }
    cr_assert_eq(b->position[at], t->position[last]); /* its tokens' rows were checked at open */
    memset(&err, 0, sizeof err);
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, whole.msg);
    trace_stream_close(s);
    /* a block no run read is checked by trace_stream_check_rest alone */
    cr_assert_eq(trace_stream_open_with(path, &on_read, &s, &err), MOESIM_OK, "%s", err.msg);
    memset(&err, 0, sizeof err);
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, whole.msg);
    trace_stream_close(s);
    trace_destroy(t);
}

/* The expert ids of every token of the stream `s`, read alone in one call: [N][L][k]. */
static uint16_t *read_all_experts(trace_stream *s, const trace *t) {
    uint16_t *ids = malloc(t->n_tokens * trace_route_values(&t->meta) * sizeof *ids);
    trace_stream_read_experts(s, 0, t->n_tokens, ids);
    return ids;
}

Test(trace, a_stream_checking_rows_on_read_reads_ids_ahead_of_the_run_and_checks_none_of_them) {
    trace *t = make_blocks_trace();
    const char *path = test_tmp_path("stream-ids-ahead.h5");
    moesim_error err = {0}, whole = {0};
    write_with_bad_last_id(t, path, &whole);
    const uint64_t last = t->n_tokens - 1;
    trace_stream_options on_read = {.skip_lookahead = true, .check_rows_on_read = true};
    trace_stream *s = NULL;
    cr_assert_eq(trace_stream_open_with(path, &on_read, &s, &err), MOESIM_OK, "%s", err.msg);
    /* the ids as written, but the one that is no expert id: unrecorded */
    uint16_t *ids = read_all_experts(s, t);
    const size_t at_bad = trace_route_index(t, last, 47) + 1;
    cr_assert_eq(ids[at_bad], TRACE_NO_EXPERT);
    ids[at_bad] = t->expert_ids[at_bad];
    cr_assert_eq(memcmp(ids, t->expert_ids, t->n_tokens * 48 * 8 * sizeof *ids), 0);
    free(ids);
    /* nothing was checked or kept: the run's reads and the rest report it as trace_read does */
    uint64_t local;
    const trace *b = trace_stream_row(s, last, &local);
    cr_assert_eq(trace_experts(b, local, 0)[0], TRACE_NO_EXPERT, "the bad block: blank rows");
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, whole.msg);
    trace_stream_close(s);
    trace_destroy(t);
}

Test(trace, a_stream_checking_rows_on_read_gives_unreadable_ids_as_unrecorded_block_by_block) {
    trace *t = make_blocks_trace();
    const char *path = test_tmp_path("stream-ids-garbled.h5");
    moesim_error err = {0}, whole = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    garble_chunks(path, "/routing/expert_ids", t->n_tokens / 2);
    trace *back = NULL;
    cr_assert_eq(trace_read(path, &back, &whole), MOESIM_EINPUT);
    cr_assert(strstr(whole.msg, "/routing/expert_ids"), "%s", whole.msg);
    trace_stream_options on_read = {.skip_lookahead = true, .check_rows_on_read = true};
    trace_stream *s = NULL;
    cr_assert_eq(trace_stream_open_with(path, &on_read, &s, &err), MOESIM_OK, "%s", err.msg);
    /* blocks whose ids cannot all be read: unrecorded throughout; the others as written */
    const uint64_t bt = trace_stream_block_tokens(s), per_token = 48 * 8;
    const uint64_t readable = (t->n_tokens / 2) / bt * bt;
    cr_assert_gt(readable, 0, "the test needs a readable block");
    uint16_t *ids = read_all_experts(s, t);
    cr_assert_eq(memcmp(ids, t->expert_ids, readable * per_token * sizeof *ids), 0);
    for (uint64_t i = readable * per_token; i < t->n_tokens * per_token; i++)
        cr_assert_eq(ids[i], TRACE_NO_EXPERT, "id %llu", (unsigned long long)i);
    free(ids);
    /* the failure was not kept: the block's check reports it as trace_read does */
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, whole.msg);
    trace_stream_close(s);
    trace_destroy(t);
}

Test(trace, a_stream_checking_rows_on_read_counts_the_same_first_candidate_hits) {
    trace *t = make_blocks_trace();
    const char *path = test_tmp_path("stream-on-read.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_stream *s = NULL;
    trace_stream_options at_open = {.skip_lookahead = true};
    cr_assert_eq(trace_stream_open_with(path, &at_open, &s, &err), MOESIM_OK, "%s", err.msg);
    uint64_t want_right, want_total;
    trace_stream_lookahead_first_hits(s, &want_right, &want_total);
    cr_assert_gt(want_right, 0);
    trace_stream_close(s);
    trace_stream_options on_read = {.skip_lookahead = true, .check_rows_on_read = true};
    cr_assert_eq(trace_stream_open_with(path, &on_read, &s, &err), MOESIM_OK, "%s", err.msg);
    /* the last block read twice (evicted in between), the others never: counted once each */
    trace_stream_set_cache(s, 0, 1);
    uint64_t at, right, total;
    trace_stream_row(s, t->n_tokens - 1, &at);
    trace_stream_row(s, 0, &at);
    trace_stream_row(s, t->n_tokens - 1, &at);
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_OK, "%s", err.msg);
    trace_stream_lookahead_first_hits(s, &right, &total);
    cr_assert_eq(right, want_right);
    cr_assert_eq(total, want_total);
    /* a new block size settles the checks first; the rows are those written */
    trace_stream_set_cache(s, 64, 2);
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_OK, "%s", err.msg);
    trace_stream_lookahead_first_hits(s, &right, &total);
    cr_assert_eq(total, want_total);
    const trace *b = trace_stream_row(s, 1000, &at);
    cr_assert_eq(memcmp(trace_experts(b, at, 0), trace_experts(t, 1000, 0), 48 * 8 * 2), 0);
    trace_stream_close(s);
    trace_destroy(t);
}

/* ---- streams read by request (trace_stream_options.blocks_by_request) ---- */

/* t with its requests one after another, `len` tokens each, renumbered. */
static trace *contiguous_requests(trace *t, uint64_t len) {
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        t->request_id[i] = (uint32_t)(i / len);
        t->position[i] = (uint32_t)(i % len);
        t->phase[i] = t->position[i] < 2 ? TRACE_PREFILL : TRACE_DECODE;
    }
    moesim_error err = {0};
    cr_assert_eq(trace_finish(t, "made", &err), MOESIM_OK, "%s", err.msg);
    return t;
}

/* Chunks a stream of `path` opened with `opt` inflates after its cache is set for a batch of
 * `batch` requests of `len` tokens visited in turn, token by token, as a run steps them; every row
 * it gets is checked against t's. */
static uint64_t chunks_for_batch(const char *path, trace_stream_options opt, const trace *t,
                                 uint64_t len, uint32_t batch) {
    trace_stream *s = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_stream_open_with(path, &opt, &s, &err), MOESIM_OK, "%s", err.msg);
    /* blocks of 300 tokens (a few chunks of look-ahead rows), as many cached as the simulator
     * keeps for a batch: requests start inside blocks, and the trace has more blocks than the
     * cache */
    trace_stream_set_cache(s, 300, batch + 2);
    const uint64_t at_open = trace_stream_chunks_inflated(s);
    const size_t R = trace_route_values(&t->meta), A = trace_lookahead_values(&t->meta);
    const uint64_t n_requests = t->n_tokens / len;
    for (uint64_t r0 = 0; r0 < n_requests; r0 += batch)
        for (uint64_t j = 0; j < len; j++)
            for (uint64_t r = r0; r < r0 + batch && r < n_requests; r++) {
                uint64_t i = r * len + j, at;
                const trace *b = trace_stream_row(s, i, &at);
                cr_assert_eq(b->position[at], t->position[i]);
                cr_assert_eq(memcmp(trace_experts(b, at, 0), trace_experts(t, i, 0), R * 2), 0);
                cr_assert_eq(memcmp(b->lookahead_scores + trace_lookahead_index(b, at, 0, 1),
                                    t->lookahead_scores + trace_lookahead_index(t, i, 0, 1), A * 4),
                             0);
            }
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_OK, "%s", err.msg);
    const uint64_t inflated = trace_stream_chunks_inflated(s) - at_open;
    trace_stream_close(s);
    return inflated;
}

Test(trace, a_stream_by_request_inflates_each_chunk_once_for_a_batch_of_requests) {
    /* long look-ahead rows: more chunks of them than a stream keeps */
    const uint64_t len = 500;
    trace *t = contiguous_requests(make_trace(16, 64, 8, 4, 16, 4000, true), len);
    const char *path = test_tmp_path("stream-by-request.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    const trace_stream_options by_block = {.check_rows_on_read = true},
                               by_request = {.check_rows_on_read = true, .blocks_by_request = true};
    /* one request at a time reads the file front to back: each chunk once */
    const uint64_t once = chunks_for_batch(path, by_request, t, len, 1);
    cr_assert_eq(chunks_for_batch(path, by_block, t, len, 1), once);
    /* four in turn: the blocks two requests share are read for each when it reaches them */
    cr_assert_eq(chunks_for_batch(path, by_request, t, len, 4), once);
    cr_assert_gt(chunks_for_batch(path, by_block, t, len, 4), once,
                 "whole blocks read again: the comparison above can fail");
    trace_destroy(t);
}

/* Rewrites dataset `name` (a look-ahead one) of the file at `path` as earlier versions of the
 * writer laid it out: chunks of all K' candidates of whole rows, all D distances
 * ({rows, L, D, K'}) or one each ({rows, L, 1, K'}), HDF5's own shuffle and deflate; the
 * first_hits attribute kept. */
static void rechunk_lookahead(const char *path, const char *name, hid_t mtype, const void *rows,
                              bool by_distance) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    cr_assert(f >= 0 && d >= 0);
    hid_t ftype = H5Dget_type(d), space = H5Dget_space(d);
    hsize_t dims[4];
    cr_assert_eq(H5Sget_simple_extent_dims(space, dims, NULL), 4);
    uint64_t hits[2];
    const bool has_hits = H5Aexists(d, "first_hits") > 0;
    if (has_hits) {
        hid_t a = H5Aopen(d, "first_hits", H5P_DEFAULT);
        cr_assert_geq(H5Aread(a, H5T_NATIVE_UINT64, hits), 0);
        H5Aclose(a);
    }
    H5Dclose(d);
    cr_assert_geq(H5Ldelete(f, name, H5P_DEFAULT), 0);
    hsize_t chunk[4] = {dims[0] < 100 ? dims[0] : 100, dims[1], by_distance ? 1 : dims[2], dims[3]};
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    cr_assert(H5Pset_chunk(dcpl, 4, chunk) >= 0 && H5Pset_shuffle(dcpl) >= 0 &&
              H5Pset_deflate(dcpl, 1) >= 0);
    d = H5Dcreate2(f, name, ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    cr_assert_geq(H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows), 0);
    if (has_hits) {
        hsize_t two = 2;
        hid_t as = H5Screate_simple(1, &two, NULL);
        hid_t a = H5Acreate2(d, "first_hits", H5T_STD_U64LE, as, H5P_DEFAULT, H5P_DEFAULT);
        cr_assert_geq(H5Awrite(a, H5T_NATIVE_UINT64, hits), 0);
        H5Aclose(a);
        H5Sclose(as);
    }
    H5Pclose(dcpl);
    H5Tclose(ftype);
    H5Sclose(space);
    H5Dclose(d);
    H5Fclose(f);
}

/* Streams the trace at `path` with `opt`: the blocks carry distances 1..depth and the first
 * `carried` candidates of each row, every one t's; returns the chunks the stream inflated. */
static uint64_t stream_first_rows(const char *path, const trace *t, const trace_stream_options *opt,
                                  uint32_t depth, uint32_t carried) {
    trace_stream *s = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_stream_open_with(path, opt, &s, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_stream_rows_meta(s)->lookahead_depth, depth, "%s", path);
    cr_assert_eq(trace_stream_rows_meta(s)->lookahead_k, carried, "%s", path);
    cr_assert_lt(trace_stream_block_tokens(s), t->n_tokens / 3, "blocks: the test needs a few");
    const uint32_t L = t->meta.n_layers;
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        uint64_t at;
        const trace *b = trace_stream_row(s, i, &at);
        cr_assert(b->meta.lookahead_depth == depth && b->meta.lookahead_k == carried);
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t d = 1; d <= depth; d++) {
                size_t x = trace_lookahead_index(b, at, l, d),
                       y = trace_lookahead_index(t, i, l, d);
                cr_assert_eq(memcmp(b->lookahead_ids + x, t->lookahead_ids + y, carried * 2), 0,
                             "token %llu layer %u distance %u", (unsigned long long)i, l, d);
                cr_assert_eq(memcmp(b->lookahead_scores + x, t->lookahead_scores + y, carried * 4),
                             0, "token %llu layer %u distance %u", (unsigned long long)i, l, d);
            }
    }
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_OK, "%s", err.msg);
    const uint64_t inflated = trace_stream_chunks_inflated(s);
    trace_stream_close(s);
    return inflated;
}

/* Streams the trace at `path` with its look-ahead rows of distances 1..want alone (all K'
 * candidates); returns the chunks the stream inflated. */
static uint64_t stream_first_distances(const char *path, const trace *t, uint32_t want) {
    const trace_stream_options opt = {.check_rows_on_read = true, .lookahead_distances = want};
    return stream_first_rows(path, t, &opt, want, t->meta.lookahead_k);
}

Test(trace, a_stream_of_the_first_distances_reads_them_from_either_layout_and_inflates_theirs) {
    /* 8 layers, K' = 6, 30000 tokens: a chunk holds 3640 rows of ids, 1820 of scores (9 and
     * 17 chunks a distance), a block 3800 (all 3 distances) to 8000 tokens (one) */
    trace *t = make_trace(8, 32, 4, 3, 6, 30000, true);
    char by_distance[4096], whole[4096];
    snprintf(by_distance, sizeof by_distance, "%s", test_tmp_path("distances.h5"));
    snprintf(whole, sizeof whole, "%s", test_tmp_path("distances-whole-rows.h5"));
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, by_distance, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_write(t, whole, &err), MOESIM_OK, "%s", err.msg);
    rechunk_lookahead(whole, "/lookahead/expert_ids", H5T_NATIVE_UINT16, t->lookahead_ids, false);
    rechunk_lookahead(whole, "/lookahead/scores", H5T_NATIVE_FLOAT, t->lookahead_scores, false);
    uint64_t inflated[4];
    for (uint32_t want = 1; want <= 3; want++) {
        inflated[want] = stream_first_distances(by_distance, t, want);
        stream_first_distances(whole, t, want); /* each chunk holds every distance */
    }
    /* each distance more: its 9 chunks of ids and 17 of scores, each inflated once */
    cr_expect_eq(inflated[2], inflated[1] + 26, "%llu, %llu", (unsigned long long)inflated[1],
                 (unsigned long long)inflated[2]);
    cr_expect_eq(inflated[3], inflated[1] + 52, "%llu, %llu", (unsigned long long)inflated[1],
                 (unsigned long long)inflated[3]);
    /* the whole trace reads back from either layout */
    for (int i = 0; i < 2; i++) {
        trace *back = NULL;
        cr_assert_eq(trace_read(i ? whole : by_distance, &back, &err), MOESIM_OK, "%s", err.msg);
        assert_same_trace(t, back);
        trace_destroy(back);
    }
    trace_destroy(t);
}

/* Streams the trace at `path` with distance 1's first `wanted` candidates (and top_k's): the
 * blocks carry `carried` of them; returns the chunks the stream inflated. */
static uint64_t stream_first_candidates(const char *path, const trace *t, uint32_t wanted,
                                        uint32_t carried) {
    const trace_stream_options opt = {.check_rows_on_read = true,
                                      .lookahead_distances = 1,
                                      .first_candidates_only = true,
                                      .lookahead_candidates = wanted};
    return stream_first_rows(path, t, &opt, 1, carried);
}

Test(trace, a_stream_of_the_first_candidates_inflates_their_chunks_alone_in_any_layout) {
    /* top_k = 4 of K' = 8 candidates: the writer chunks each distance's rows in two halves */
    trace *t = make_trace(8, 32, 4, 3, 8, 30000, true);
    char halves[4096], by_distance[4096], whole[4096];
    snprintf(halves, sizeof halves, "%s", test_tmp_path("candidates.h5"));
    snprintf(by_distance, sizeof by_distance, "%s", test_tmp_path("candidates-by-distance.h5"));
    snprintf(whole, sizeof whole, "%s", test_tmp_path("candidates-whole-rows.h5"));
    moesim_error err = {0};
    const char *paths[] = {halves, by_distance, whole};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(trace_write(t, paths[i], &err), MOESIM_OK, "%s", err.msg);
    for (int i = 1; i < 3; i++) {
        rechunk_lookahead(paths[i], "/lookahead/expert_ids", H5T_NATIVE_UINT16, t->lookahead_ids,
                          i == 1);
        rechunk_lookahead(paths[i], "/lookahead/scores", H5T_NATIVE_FLOAT, t->lookahead_scores,
                          i == 1);
    }
    /* the first top_k (asked for fewer, or for them): one half of the rows' chunks */
    const uint64_t half = stream_first_candidates(halves, t, 2, 4);
    cr_assert_eq(stream_first_candidates(halves, t, 4, 4), half);
    /* more than top_k: both halves; a half of distance 1 is 6 chunks of ids (5461 rows of 8
     * layers x 4 ids each) and 11 of scores (2730 rows), each inflated once */
    const uint64_t both = stream_first_candidates(halves, t, 5, 8);
    cr_expect_eq(both, half + 17, "%llu, %llu", (unsigned long long)half, (unsigned long long)both);
    /* files whose chunks hold all K' candidates: every one, as before */
    stream_first_candidates(by_distance, t, 4, 8);
    stream_first_candidates(whole, t, 4, 8);
    /* the whole trace reads back from each layout */
    for (int i = 0; i < 3; i++) {
        trace *back = NULL;
        cr_assert_eq(trace_read(paths[i], &back, &err), MOESIM_OK, "%s", err.msg);
        assert_same_trace(t, back);
        trace_destroy(back);
    }
    trace_destroy(t);
}

Test(trace, a_stream_by_request_reads_whole_blocks_while_its_cache_holds_every_block) {
    trace *t = contiguous_requests(make_blocks_trace(), 500);
    const char *path = test_tmp_path("stream-by-request-fits.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    const trace_stream_options opt = {.check_rows_on_read = true, .blocks_by_request = true};
    for (int fits = 0; fits < 2; fits++) {
        trace_stream *s = NULL;
        cr_assert_eq(trace_stream_open_with(path, &opt, &s, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_gt(trace_stream_block_tokens(s), 501, "tokens 499 and 501 share block 0");
        trace_stream_set_cache(s, 0, fits ? 1000 : 1);
        cr_assert_eq(trace_stream_caches_every_block(s), fits);
        uint64_t at;
        const trace *b = trace_stream_row(s, 499, &at); /* request 0 */
        cr_assert_eq(b->position[at], t->position[499]);
        b = trace_stream_row(s, 501, &at); /* request 1 */
        cr_assert_eq(b->position[at], t->position[501]);
        cr_assert_eq(trace_stream_blocks_read(s), fits ? 1 : 2, "fits %d", fits);
        cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_OK, "%s", err.msg);
        trace_stream_close(s);
    }
    trace_destroy(t);
}

Test(trace, a_stream_by_request_checks_each_request_s_part_of_a_block_on_its_own) {
    trace *t = contiguous_requests(make_blocks_trace(), 500);
    const char *path = test_tmp_path("stream-by-request-bad.h5");
    moesim_error err = {0}, whole = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    const uint16_t bad = 64; /* = E, at token 501: request 1, which starts inside block 0 */
    poke_value(path, "/routing/expert_ids", 3, (501 * 48 + 5) * 8, H5T_NATIVE_UINT16, &bad);
    trace *back = NULL;
    cr_assert_eq(trace_read(path, &back, &whole), MOESIM_EINPUT);
    trace_stream_options opt = {.check_rows_on_read = true, .blocks_by_request = true};
    trace_stream *s = NULL;
    cr_assert_eq(trace_stream_open_with(path, &opt, &s, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_gt(trace_stream_block_tokens(s), 501, "request 1 must start inside block 0");
    trace_stream_set_cache(s, 0, 1); /* fewer blocks than the trace: by request */
    /* request 0's part of the block: its rows as written; request 1's: blank */
    uint64_t at;
    const trace *b = trace_stream_row(s, 499, &at);
    cr_assert_eq(memcmp(trace_experts(b, at, 0), trace_experts(t, 499, 0), 48 * 8 * 2), 0);
    b = trace_stream_row(s, 501, &at);
    cr_assert_eq(trace_experts(b, at, 5)[0], TRACE_NO_EXPERT);
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, whole.msg);
    trace_stream_close(s);
    /* a run that read request 0's part alone: the rest checks request 1's */
    cr_assert_eq(trace_stream_open_with(path, &opt, &s, &err), MOESIM_OK, "%s", err.msg);
    trace_stream_set_cache(s, 0, 1);
    b = trace_stream_row(s, 499, &at);
    cr_assert_eq(memcmp(trace_experts(b, at, 0), trace_experts(t, 499, 0), 48 * 8 * 2), 0);
    memset(&err, 0, sizeof err);
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, whole.msg);
    trace_stream_close(s);
    trace_destroy(t);
}

/* ---- the first_hits attribute (trace_first_hits) ---- */

/* A trace whose distance-1 predictions are right for every third (token, layer), and its hits
 * counted here from the rows (as the simulator counts them). */
static trace *make_hits_trace(uint64_t n_tokens, trace_first_hits *want) {
    trace *t = make_trace(6, 32, 4, 3, 5, n_tokens, true);
    *want = (trace_first_hits){0};
    for (uint64_t i = 0; i < t->n_tokens; i++)
        for (uint32_t l = 0; l + 1 < t->meta.n_layers; l++) {
            uint16_t *pred = t->lookahead_ids + trace_lookahead_index(t, i, l, 1);
            if ((i + l) % 3 == 0) pred[0] = trace_experts(t, i, l + 1)[0];
            want->right += pred[0] == trace_experts(t, i, l + 1)[0];
            want->total++;
        }
    cr_assert(want->right > 0 && want->right < want->total);
    return t;
}

/* The first_hits attribute of the trace at `path`, as stored: false when absent. */
static bool stored_first_hits(const char *path, trace_first_hits *out) {
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    bool present = H5Lexists(f, "/lookahead", H5P_DEFAULT) > 0 &&
                   H5Aexists_by_name(f, "/lookahead/expert_ids", "first_hits", H5P_DEFAULT) > 0;
    if (present) {
        hid_t a =
            H5Aopen_by_name(f, "/lookahead/expert_ids", "first_hits", H5P_DEFAULT, H5P_DEFAULT);
        hid_t type = H5Aget_type(a), space = H5Aget_space(a);
        hsize_t n = 0;
        cr_assert_eq(H5Sget_simple_extent_dims(space, &n, NULL), 1);
        cr_assert_eq(n, 2);
        cr_assert_gt(H5Tequal(type, H5T_STD_U64LE), 0, "stored as u64");
        uint64_t v[2];
        cr_assert_geq(H5Aread(a, H5T_NATIVE_UINT64, v), 0);
        *out = (trace_first_hits){.right = v[0], .total = v[1]};
        H5Tclose(type);
        H5Sclose(space);
        H5Aclose(a);
    }
    H5Fclose(f);
    return present;
}

/* Replaces attribute `name` of dataset `ds` by `n` values (n == 0: a scalar) of type `mtype`,
 * stored as `ftype`; ftype < 0 removes it. */
static void set_attr(const char *path, const char *ds, const char *name, hid_t ftype, hid_t mtype,
                     hsize_t n, const void *values) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, ds, H5P_DEFAULT);
    cr_assert(f >= 0 && d >= 0);
    if (H5Aexists(d, name) > 0) cr_assert_geq(H5Adelete(d, name), 0);
    if (ftype >= 0) {
        hid_t space = n ? H5Screate_simple(1, &n, NULL) : H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(d, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
        cr_assert_geq(H5Awrite(a, mtype, values), 0);
        H5Aclose(a);
        H5Sclose(space);
    }
    H5Dclose(d);
    H5Fclose(f);
}

static void set_first_hits(const char *path, hid_t ftype, hid_t mtype, hsize_t n,
                           const void *values) {
    set_attr(path, "/lookahead/expert_ids", "first_hits", ftype, mtype, n, values);
}

static void remove_first_hits(const char *path) { set_first_hits(path, -1, -1, 0, NULL); }

/* The hits a stream opened with `opt` reports (after the check of every block's rows). */
static trace_first_hits stream_hits(const char *path, trace_stream_options opt) {
    trace_stream *s = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_stream_open_with(path, &opt, &s, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_OK, "%s", err.msg);
    trace_first_hits h;
    trace_stream_lookahead_first_hits(s, &h.right, &h.total);
    trace_stream_close(s);
    return h;
}

static const trace_stream_options skip_at_open = {.skip_lookahead = true},
                                  skip_on_read = {.skip_lookahead = true,
                                                  .check_rows_on_read = true};

Test(trace, the_writer_stores_the_first_candidate_hits_the_rows_give_however_it_is_fed) {
    trace_first_hits want, got;
    trace *t = make_hits_trace(700, &want);
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("hits-whole.h5"));
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert(stored_first_hits(path, &got));
    cr_assert(got.right == want.right && got.total == want.total, "%llu of %llu",
              (unsigned long long)got.right, (unsigned long long)got.total);
    static const uint64_t sizes[] = {7, 100, 1};
    cr_assert_eq(stream_trace(t, path, sizes, 3, &err), MOESIM_OK, "%s", err.msg);
    cr_assert(stored_first_hits(path, &got));
    cr_assert(got.right == want.right && got.total == want.total);
    trace_destroy(t);
    t = make_trace(6, 32, 4, 0, 0, 50, false); /* no look-ahead: nothing to count */
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert(!stored_first_hits(path, &got));
    trace_destroy(t);
}

Test(trace, a_stream_skipping_lookahead_takes_the_stored_hits_and_inflates_no_lookahead_chunk) {
    trace_first_hits want, got;
    trace *t = make_hits_trace(700, &want);
    const char *path = test_tmp_path("hits-garbled.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    garble_chunks(path, "/lookahead/expert_ids", 0);
    const trace_stream_options skips[] = {skip_at_open, skip_on_read};
    for (size_t i = 0; i < 2; i++) {
        got = stream_hits(path, skips[i]);
        cr_assert(got.right == want.right && got.total == want.total);
    }
    trace_stream *s = NULL;
    cr_assert_eq(trace_stream_open(path, &s, &err), MOESIM_EINPUT); /* trace validate */
    cr_assert(strstr(err.msg, "/lookahead/expert_ids"), "%s", err.msg);
    /* without the attribute the ids must be read to count the hits */
    remove_first_hits(path);
    cr_assert_eq(trace_stream_open_with(path, &skip_at_open, &s, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "/lookahead/expert_ids"), "%s", err.msg);
    trace_destroy(t);
}

Test(trace, a_trace_without_the_attribute_counts_the_hits_from_its_rows) {
    trace_first_hits want, got;
    trace *t = make_hits_trace(4000, &want); /* several blocks of rows */
    const char *path = test_tmp_path("hits-absent.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    remove_first_hits(path);
    cr_assert(!stored_first_hits(path, &got));
    const trace_stream_options skips[] = {skip_at_open, skip_on_read};
    for (size_t i = 0; i < 2; i++) {
        got = stream_hits(path, skips[i]);
        cr_assert(got.right == want.right && got.total == want.total);
    }
    trace *back = NULL;
    cr_assert_eq(trace_read(path, &back, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(back);
    trace_destroy(t);
}

/* Every reader of the look-ahead rows refuses an attribute they contradict, with the same line;
 * a stream that skips them reports the attribute. */
Test(trace, a_first_hits_attribute_the_rows_contradict_fails_every_reader_of_the_rows) {
    trace_first_hits want, got;
    trace *t = make_hits_trace(4000, &want);
    char path[4096], line[4400];
    snprintf(path, sizeof path, "%s", test_tmp_path("hits-wrong.h5"));
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    const uint64_t wrong[2] = {want.right + 1, want.total};
    set_first_hits(path, H5T_STD_U64LE, H5T_NATIVE_UINT64, 2, wrong);
    snprintf(line, sizeof line,
             "%s: /lookahead/expert_ids attribute first_hits: %llu of %llu, the rows give %llu of "
             "%llu",
             path, (unsigned long long)wrong[0], (unsigned long long)wrong[1],
             (unsigned long long)want.right, (unsigned long long)want.total);
    trace *back = NULL;
    cr_assert_eq(trace_read(path, &back, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, line);
    trace_stream *s = NULL;
    cr_assert_eq(trace_stream_open(path, &s, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, line);
    trace_stream_options on_read = {.check_rows_on_read = true}; /* sim with look-ahead */
    cr_assert_eq(trace_stream_open_with(path, &on_read, &s, &err), MOESIM_OK, "%s", err.msg);
    uint64_t at;
    trace_stream_row(s, 0, &at);
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, line);
    trace_stream_close(s);
    got = stream_hits(path, skip_on_read);
    cr_assert(got.right == wrong[0] && got.total == wrong[1]);
    trace_destroy(t);
}

/* A malformed attribute: every reader fails at open with one line naming it. */
Test(trace, a_malformed_first_hits_attribute_fails_at_open_with_one_line) {
    trace_first_hits want;
    trace *t = make_hits_trace(700, &want); /* 700 tokens, 6 layers: 3500 pairs */
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("hits-malformed.h5"));
    moesim_error err = {0};
    struct {
        hid_t ftype; /* as stored */
        hsize_t n;   /* values; 0: a scalar */
        int64_t v[3];
        const char *what; /* after "PATH: /lookahead/expert_ids attribute first_hits: " */
    } cases[] = {
        {H5T_IEEE_F64LE, 2, {1, 2}, "expected uint64 [2] {right, total}, got float64 [2]"},
        {H5T_STD_U64LE, 3, {1, 2, 3}, "expected uint64 [2] {right, total}, got uint64 [3]"},
        {H5T_STD_U64LE, 0, {1}, "expected uint64 [2] {right, total}, got uint64 scalar"},
        {H5T_STD_U64LE, 2, {5, 4}, "5 of 4: expected right <= total"},
        {H5T_STD_U32LE,
         2,
         {0, 3501},
         "total 3501 > the 3500 (token, layer) pairs that have a next layer"},
        {H5T_STD_I64LE, 2, {-1, 4}, "expected counts >= 0, got -1 and 4"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
        double as_double[3];
        for (int j = 0; j < 3; j++) as_double[j] = (double)cases[i].v[j];
        bool floating = H5Tget_class(cases[i].ftype) == H5T_FLOAT;
        set_first_hits(path, cases[i].ftype, floating ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64,
                       cases[i].n, floating ? (const void *)as_double : (const void *)cases[i].v);
        char line[4400];
        snprintf(line, sizeof line, "%s: /lookahead/expert_ids attribute first_hits: %s", path,
                 cases[i].what);
        trace *back = NULL;
        cr_assert_eq(trace_read(path, &back, &err), MOESIM_EINPUT, "case %zu", i);
        cr_assert_str_eq(err.msg, line);
        trace_stream *s = NULL;
        cr_assert_eq(trace_stream_open_with(path, &skip_at_open, &s, &err), MOESIM_EINPUT);
        cr_assert_str_eq(err.msg, line);
    }
    /* any integer type holding the two counts in range is read */
    const int32_t small[2] = {(int32_t)want.right, (int32_t)want.total};
    set_first_hits(path, H5T_STD_I32BE, H5T_NATIVE_INT32, 2, small);
    trace_first_hits got = stream_hits(path, skip_at_open);
    cr_assert(got.right == want.right && got.total == want.total);
    trace_destroy(t);
}

/* The ranked attribute of /lookahead/scores as stored (UINT8_MAX when absent). */
static uint8_t stored_ranked(const char *path) {
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    uint8_t v = UINT8_MAX;
    if (H5Aexists_by_name(f, "/lookahead/scores", TRACE_RANKED_ATTR, H5P_DEFAULT) > 0) {
        hid_t a = H5Aopen_by_name(f, "/lookahead/scores", TRACE_RANKED_ATTR, H5P_DEFAULT,
                                  H5P_DEFAULT);
        hid_t type = H5Aget_type(a);
        cr_assert_gt(H5Tequal(type, H5T_STD_U8LE), 0, "stored as u8");
        cr_assert_geq(H5Aread(a, H5T_NATIVE_UINT8, &v), 0);
        H5Tclose(type);
        H5Aclose(a);
    }
    H5Fclose(f);
    return v;
}

/* Token `i`'s look-ahead scores as a stream opened with `opt` gives them, into got[L D K']. */
static void stream_scores(const char *path, trace_stream_options opt, uint64_t i, float *got) {
    trace_stream *s = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_stream_open_with(path, &opt, &s, &err), MOESIM_OK, "%s", err.msg);
    uint64_t at;
    const trace *b = trace_stream_row(s, i, &at);
    cr_assert_not_null(b);
    memcpy(got, b->lookahead_scores + trace_lookahead_index(b, at, 0, 1),
           trace_lookahead_values(&b->meta) * sizeof *got);
    cr_assert_eq(trace_stream_check_rest(s, &err), MOESIM_OK, "%s", err.msg);
    trace_stream_close(s);
}

/* A row is ranked when no score exceeds the one before it, a NaN anywhere counting as a rise:
 * every length up to 20 (the SSE2 path from 5, its overlapping last four), a rise or a NaN at
 * every place, and equal neighbours, against the plain definition. */
Test(trace, scores_ranked_finds_a_rise_or_a_nan_anywhere_in_a_row_of_any_length) {
    float row[20];
    for (uint32_t n = 0; n <= 20; n++) {
        for (uint32_t i = 0; i < n; i++) row[i] = (float)(n - i) / 4; /* 0.25 steps down */
        cr_assert(scores_ranked(row, n), "n %u, descending", n);
        for (uint32_t i = 0; i < n; i++) row[i] = 1.5f;
        cr_assert(scores_ranked(row, n), "n %u, equal", n);
        for (uint32_t at = 1; at < n; at++) {
            for (uint32_t i = 0; i < n; i++) row[i] = (float)(n - i);
            row[at] = row[at - 1] + 0.5f;
            cr_assert(!scores_ranked(row, n), "n %u, a rise at %u", n, at);
        }
        for (uint32_t at = 0; at < n && n > 1; at++) {
            for (uint32_t i = 0; i < n; i++) row[i] = (float)(n - i);
            row[at] = NAN;
            cr_assert(!scores_ranked(row, n), "n %u, a NaN at %u", n, at);
        }
    }
}

/* The writer says whether every look-ahead row lists its candidates best first; a stream asked
 * to skip ranked scores skips them only when the file says so (the blocks' scores are zeros);
 * a malformed attribute fails every reader at open with one line. */
Test(trace, the_ranked_attribute_says_whether_every_row_is_ranked_and_a_bad_one_fails_at_open) {
    trace_first_hits want;
    trace *t = make_hits_trace(700, &want);
    const size_t per_token = trace_lookahead_values(&t->meta), K = t->meta.lookahead_k;
    for (uint64_t r = 0; r < t->n_tokens * per_token / K; r++) /* every row best first */
        for (size_t c = 0; c < K; c++) t->lookahead_scores[r * K + c] = 1.0f / (float)(c + 1);
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("ranked.h5"));
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(stored_ranked(path), 1);
    const trace_stream_options skip = {.skip_ranked_scores = true, .check_rows_on_read = true};
    float *got = calloc(per_token, sizeof *got);
    stream_scores(path, skip, 333, got);
    for (size_t j = 0; j < per_token; j++) cr_assert_eq(got[j], 0.0f, "skipped: zeros");
    stream_scores(path, (trace_stream_options){0}, 333, got);
    cr_assert_eq(memcmp(got, t->lookahead_scores + 333 * per_token, per_token * sizeof *got), 0);
    /* one row that rises: the file says 0, and every reader reads its scores */
    float *row = t->lookahead_scores + trace_lookahead_index(t, 333, 2, 1);
    row[1] = row[0] * 2;
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(stored_ranked(path), 0);
    stream_scores(path, skip, 333, got);
    cr_assert_eq(memcmp(got, t->lookahead_scores + 333 * per_token, per_token * sizeof *got), 0);
    trace *back = NULL;
    cr_assert_eq(trace_read(path, &back, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(back);
    struct {
        hid_t ftype; /* as stored */
        hsize_t n;   /* values; 0: a scalar */
        int64_t v[2];
        const char *what; /* after "PATH: /lookahead/scores attribute ranked: " */
    } cases[] = {
        {H5T_IEEE_F64LE, 0, {1}, "expected a scalar integer, 0 or 1, got float64 scalar"},
        {H5T_STD_U8LE, 2, {1, 1}, "expected a scalar integer, 0 or 1, got uint8 [2]"},
        {H5T_STD_U8LE, 0, {2}, "expected 0 or 1, got 2"},
        {H5T_STD_I64LE, 0, {-1}, "expected a scalar integer, 0 or 1, got -1"},
        /* a false claim: the row that rises, named */
        {H5T_STD_I32BE, 0, {1},
         "/lookahead/scores[333][2][0]: column 1 scores 2 above column 0's 1, but attribute "
         "ranked says every row lists its candidates best first"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double as_double[2] = {(double)cases[i].v[0], (double)cases[i].v[1]};
        bool floating = H5Tget_class(cases[i].ftype) == H5T_FLOAT;
        set_attr(path, "/lookahead/scores", TRACE_RANKED_ATTR, cases[i].ftype,
                 floating ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64, cases[i].n,
                 floating ? (const void *)as_double : (const void *)cases[i].v);
        char line[4400];
        bool claim = i + 1 == sizeof cases / sizeof *cases;
        snprintf(line, sizeof line, "%s: %s%s", path,
                 claim ? "" : "/lookahead/scores attribute ranked: ", cases[i].what);
        cr_assert_eq(trace_read(path, &back, &err), MOESIM_EINPUT, "case %zu", i);
        cr_assert_str_eq(err.msg, line);
        trace_stream *s = NULL;
        moesim_status st = trace_stream_open(path, &s, &err);
        trace_stream_close(s);
        cr_assert_eq(st, MOESIM_EINPUT, "case %zu", i);
        cr_assert_str_eq(err.msg, line);
    }
    free(got);
    trace_destroy(t);
}

/* ---- string attributes ---- */

/* Replaces root attribute `name` by a fixed-length string of the n bytes at `bytes`. */
static void set_root_bytes_attr(const char *path, const char *name, const char *bytes, size_t n) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert(f >= 0);
    if (H5Aexists(f, name) > 0) cr_assert_geq(H5Adelete(f, name), 0);
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, n);
    H5Tset_strpad(type, H5T_STR_NULLPAD);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(H5Awrite(a, type, bytes), 0);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
    H5Fclose(f);
}

/* The model is a config name every command looks up (a path there would be opened), a string
 * holds no NUL inside its text, and params_json is JSON: each refused at open by the whole
 * reader and the stream, in one line naming the attribute. */
Test(trace, a_model_that_is_no_config_name_a_nul_inside_a_string_or_params_that_are_not_json_fail) {
    static const struct {
        const char *name, *bytes;
        size_t n;
        const char *says;
    } cases[] = {
        {"model", "../../etc/passwd", 16, "model: character 3 cannot be in a config name"},
        {"model", "mixtral-\xff", 9, "model: character 9 cannot be in a config name"},
        {"model", "mix\0tral", 8, "model: a NUL byte inside the string"},
        {"params_json", "{not json", 9, "params_json: expected JSON text (line 1:"},
        {"params_json", "{\"a\": \"\xff\"}", 10, "params_json: expected JSON text"},
    };
    trace *t = make_trace(2, 8, 2, 0, 0, 5, false);
    const char *path = test_tmp_path("bad-strings.h5");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        moesim_error err = {0};
        cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
        set_root_bytes_attr(path, cases[i].name, cases[i].bytes, cases[i].n);
        trace *back = NULL;
        cr_assert_eq(trace_read(path, &back, &err), MOESIM_EINPUT, "case %zu read", i);
        cr_assert(strstr(err.msg, cases[i].says), "case %zu: %s", i, err.msg);
        trace_stream *s = NULL;
        moesim_error serr = {0};
        cr_assert_eq(trace_stream_open(path, &s, &serr), MOESIM_EINPUT, "case %zu stream", i);
        cr_assert_str_eq(serr.msg, err.msg, "case %zu", i);
    }
    trace_destroy(t);
}
