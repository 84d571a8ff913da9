/* libmoesim's moesim_trace_write: a trace given as arrays is written by the trace writer, reads
 * back to the same arrays with its model config stored, and bad data writes nothing. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "moesim.h"
#include "support/test_support.h"
#include "traces/trace.h"

/* 3 layers (layer 0 dense, 1-2 MoE), 4 experts, top-2 */
static const char model_ini[] = "[model]\nname = tiny-moe\nhf_id = none\nfamily = mixtral\n\n"
                                "[layers]\nn_layers = 3\nmoe_layers = 1-2\nhidden = 8\n"
                                "dense_inter = 16\nvocab = 32\ntie_embeddings = false\n\n"
                                "[experts]\nn_experts = 4\ntop_k = 2\nexpert_inter = 16\n"
                                "gate_norm = topk\nn_shared = 1\nshared_inter = 16\n"
                                "shared_gate = false\n\n"
                                "[attention]\nkind = gqa\nheads = 2\nkv_heads = 1\nhead_dim = 4\n"
                                "qk_norm = false\nrope_theta = 10000\n";

enum { N = 5, L = 2, K = 2, D = 1, KP = 2 };
static uint32_t request_id[N] = {0, 0, 1, 0, 1}, position[N] = {0, 1, 0, 2, 1};
static uint8_t phase[N] = {0, 0, 0, 1, 1};
static int32_t token_id[N] = {3, 4, 5, 6, 7};
static uint16_t ids[N * L * K], la_ids[N * L * D * KP];
static float gates[N * L * K], importance[N * L], la_scores[N * L * D * KP];

static moesim_trace_data sample(void) {
    for (int i = 0; i < N * L; i++) {
        ids[2 * i] = (uint16_t)(i % 4);
        ids[2 * i + 1] = (uint16_t)((i + 1) % 4);
        gates[2 * i] = 0.75f;
        gates[2 * i + 1] = 0.25f;
        importance[i] = (float)i / 4;
        bool last = i % L == L - 1; /* layer l + 1 beyond the last layer: padding */
        la_ids[2 * i] = last ? TRACE_NO_EXPERT : 2;
        la_ids[2 * i + 1] = last ? TRACE_NO_EXPERT : 3;
        la_scores[2 * i] = last ? 0 : 0.6f;
        la_scores[2 * i + 1] = last ? 0 : 0.3f;
    }
    return (moesim_trace_data){.model_config = model_ini,
                               .source = "hf:test",
                               .params_json = "{\"gen_len\": 1}",
                               .n_tokens = N,
                               .request_id = request_id,
                               .position = position,
                               .phase = phase,
                               .token_id = token_id,
                               .expert_ids = ids,
                               .gate_weights = gates,
                               .importance = importance,
                               .lookahead_depth = D,
                               .lookahead_k = KP,
                               .lookahead_ids = la_ids,
                               .lookahead_scores = la_scores};
}

Test(lib_trace_write, writes_arrays_that_read_back_equal_with_the_model_config_stored) {
    moesim_trace_data d = sample();
    const char *path = test_tmp_path("lib_write.h5");
    char *error = NULL;
    cr_assert_eq(moesim_trace_write(path, &d, &error), 0, "%s", error ? error : "");
    trace *t = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_read(path, &t, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_str_eq(t->meta.model, "tiny-moe");
    cr_assert_str_eq(t->meta.source, "hf:test");
    cr_assert(t->n_tokens == N && t->n_requests == 2 && t->meta.n_layers == L &&
              t->meta.top_k == K && t->meta.n_experts == 4 && t->meta.n_shared_experts == 1);
    cr_assert(t->meta.model_layer[0] == 1 && t->meta.model_layer[1] == 2);
    cr_assert(t->meta.gate_norm == GATE_SOFTMAX_TOPK);
    cr_assert(!memcmp(t->request_id, request_id, sizeof request_id));
    cr_assert(!memcmp(t->position, position, sizeof position));
    cr_assert(!memcmp(t->phase, phase, sizeof phase));
    cr_assert(!memcmp(t->token_id, token_id, sizeof token_id));
    cr_assert(!memcmp(t->expert_ids, ids, sizeof ids));
    cr_assert(!memcmp(t->gate_weights, gates, sizeof gates));
    cr_assert(!memcmp(t->importance, importance, sizeof importance));
    cr_assert(!memcmp(t->lookahead_ids, la_ids, sizeof la_ids));
    cr_assert(!memcmp(t->lookahead_scores, la_scores, sizeof la_scores));
    char *stored = trace_stored_model_config(t);
    cr_assert(stored && !strcmp(stored, model_ini), "the model config is stored verbatim");
    cr_assert(strstr(t->params_json, "\"gen_len\": 1") || strstr(t->params_json, "\"gen_len\":1"));
    free(stored);
    trace_destroy(t);
}

Test(lib_trace_write, leaves_the_optional_arrays_out_when_they_are_null) {
    moesim_trace_data d = sample();
    d.token_id = NULL;
    d.importance = NULL;
    d.lookahead_depth = 0;
    d.params_json = NULL;
    const char *path = test_tmp_path("lib_write_min.h5");
    cr_assert_eq(moesim_trace_write(path, &d, NULL), 0);
    trace *t = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_read(path, &t, &err), MOESIM_OK, "%s", err.msg);
    cr_assert(!t->meta.has_importance && !t->meta.has_token_ids && !t->meta.lookahead_depth);
    trace_destroy(t);
}

Test(lib_trace_write, refuses_an_invalid_trace_and_writes_nothing) {
    moesim_trace_data d = sample();
    ids[3] = 4; /* token 0, layer 1, slot 1: expert 4 of 4 */
    const char *path = test_tmp_path("lib_write_bad.h5");
    char *error = NULL;
    cr_assert_eq(moesim_trace_write(path, &d, &error), MOESIM_LIB_EINPUT);
    cr_assert(error && strstr(error, "/routing/expert_ids[0][1][1]"), "%s", error);
    cr_assert(!test_file_exists(path));
    moesim_free(error);
}

Test(lib_trace_write, refuses_a_bad_model_config_or_params_in_one_line) {
    moesim_trace_data d = sample();
    d.params_json = "[1]";
    const char *path = test_tmp_path("lib_write_params.h5");
    char *error = NULL;
    cr_assert_eq(moesim_trace_write(path, &d, &error), MOESIM_LIB_EINPUT);
    cr_assert(strstr(error, "params_json: expected a JSON object"), "%s", error);
    moesim_free(error);
    d = sample();
    d.model_config = "[model]\nname = x\n";
    cr_assert_eq(moesim_trace_write(path, &d, &error), MOESIM_LIB_EINPUT);
    cr_assert(strstr(error, "trace data: model_config") && !strchr(error, '\n'), "%s", error);
    moesim_free(error);
    cr_assert(!test_file_exists(path));
}
