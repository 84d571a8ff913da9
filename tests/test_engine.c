/* The engine beyond the golden comparison: quantized experts and precision maps, determinism
 * across thread counts, importance and look-ahead bookkeeping, batched generation. Uses the
 * committed fixture checkpoints (tests/fixtures/golden/). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "support/test_support.h"

static const int32_t prompt_a[] = {1, 17, 42, 99, 3, 250, 7, 64, 12, 13, 200, 201};
static const int32_t prompt_b[] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 255, 31, 77};

static engine *load(const char *arch, uint32_t threads, uint32_t mask) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/golden/%s", MOESIM_SOURCE_DIR, arch);
    engine_options opt = {.n_threads = threads, .precision_mask = mask};
    engine *e;
    moesim_error err = {0};
    cr_assert_eq(engine_load(dir, &opt, &e, &err), MOESIM_OK, "%s", err.msg);
    return e;
}

/* logits of every position of `prompt`: [n][vocab], caller frees */
static float *run_prompt(engine *e, const int32_t *prompt, uint32_t n, const engine_precmap *pm) {
    uint32_t V = engine_config_of(e)->vocab;
    float *out = malloc((size_t)n * V * sizeof *out);
    engine_seq *s = engine_seq_create(e, n);
    moesim_error err = {0};
    for (uint32_t t = 0; t < n; t++)
        cr_assert_eq(engine_seq_forward(e, s, prompt[t], pm, out + (size_t)t * V, NULL, &err),
                     MOESIM_OK, "%s", err.msg);
    engine_seq_destroy(s);
    return out;
}

static void softmax64(const float *x, double *p, uint32_t n) {
    double mx = x[0], sum = 0;
    for (uint32_t i = 1; i < n; i++) mx = fmax(mx, x[i]);
    for (uint32_t i = 0; i < n; i++) sum += p[i] = exp(x[i] - mx);
    for (uint32_t i = 0; i < n; i++) p[i] /= sum;
}

/* mean over positions of KL(p_ref || p_q) */
static double mean_kl(const float *ref, const float *q, uint32_t n, uint32_t V) {
    double *p = malloc(V * sizeof *p), *r = malloc(V * sizeof *r), kl = 0;
    for (uint32_t t = 0; t < n; t++) {
        softmax64(ref + (size_t)t * V, p, V);
        softmax64(q + (size_t)t * V, r, V);
        for (uint32_t v = 0; v < V; v++) kl += p[v] * log(p[v] / r[v]);
    }
    free(p);
    free(r);
    return kl / n;
}

TestSuite(engine);

Test(engine, kl_to_bf16_grows_from_int8_to_int4_to_int2_and_int8_stays_near_zero) {
    static const char *const archs[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};
    const moesim_precision precs[] = {PREC_INT8, PREC_INT4, PREC_INT2};
    for (size_t a = 0; a < 4; a++) {
        engine *e = load(archs[a], 1, 1u << PREC_INT8 | 1u << PREC_INT4 | 1u << PREC_INT2);
        uint32_t V = engine_config_of(e)->vocab, n = sizeof prompt_a / sizeof *prompt_a;
        float *ref = run_prompt(e, prompt_a, n, NULL);
        double kl[3];
        for (int i = 0; i < 3; i++) {
            engine_precmap pm;
            engine_precmap_init(&pm, e, (uint8_t)precs[i]);
            float *q = run_prompt(e, prompt_a, n, &pm);
            kl[i] = mean_kl(ref, q, n, V);
            free(q);
            engine_precmap_free(&pm);
        }
        cr_log_info("%s: KL int8 %.3g int4 %.3g int2 %.3g", archs[a], kl[0], kl[1], kl[2]);
        /* int8 with groups of 64 keeps each weight within 0.2% of its group's range: its KL
         * (1e-4 to 1e-3 nats on these random models, where one flipped top-2 choice in a later
         * layer costs ~1e-3) stays under 2e-3 and an order of magnitude below int4's */
        cr_assert_lt(kl[0], 2e-3, "%s: int8 KL %g", archs[a], kl[0]);
        cr_assert_lt(kl[0] * 8, kl[1], "%s: int8 %g not far below int4 %g", archs[a], kl[0],
                     kl[1]);
        cr_assert_lt(kl[0], kl[1], "%s: int8 %g vs int4 %g", archs[a], kl[0], kl[1]);
        cr_assert_lt(kl[1], kl[2], "%s: int4 %g vs int2 %g", archs[a], kl[1], kl[2]);
        free(ref);
        engine_destroy(e);
    }
}

Test(engine, skipping_every_expert_changes_the_output_and_a_bf16_map_does_not) {
    engine *e = load("olmoe", 1, 0);
    uint32_t V = engine_config_of(e)->vocab, n = 6;
    float *ref = run_prompt(e, prompt_a, n, NULL);
    engine_precmap pm;
    engine_precmap_init(&pm, e, PREC_BF16);
    float *same = run_prompt(e, prompt_a, n, &pm);
    cr_assert_eq(memcmp(ref, same, (size_t)n * V * sizeof *ref), 0);
    memset(pm.prec, ENGINE_PREC_SKIP, (size_t)pm.n_layers * pm.n_experts);
    float *skipped = run_prompt(e, prompt_a, n, &pm);
    cr_assert_gt(mean_kl(ref, skipped, n, V), 1e-3);
    free(ref);
    free(same);
    free(skipped);
    engine_precmap_free(&pm);
    engine_destroy(e);
}

Test(engine, results_are_identical_for_one_and_three_threads) {
    engine *e1 = load("qwen2_moe", 1, 1u << PREC_INT4), *e3 = load("qwen2_moe", 3, 1u << PREC_INT4);
    uint32_t V = engine_config_of(e1)->vocab, n = sizeof prompt_b / sizeof *prompt_b;
    engine_precmap pm;
    engine_precmap_init(&pm, e1, PREC_INT4);
    float *a = run_prompt(e1, prompt_b, n, &pm), *b = run_prompt(e3, prompt_b, n, &pm);
    cr_assert_eq(memcmp(a, b, (size_t)n * V * sizeof *a), 0);
    free(a);
    free(b);
    engine_precmap_free(&pm);
    engine_destroy(e1);
    engine_destroy(e3);
}

Test(engine, a_precision_map_file_is_checked_line_by_line) {
    engine *e = load("mixtral", 1, 1u << PREC_INT4);
    const char *path = test_tmp_path("map.txt");
    engine_precmap pm;
    moesim_error err = {0};
    test_write_file(path, "# layer rows\nbf16 int4 skip bf16 bf16 bf16 bf16 bf16\n"
                          "int4 int4 int4 int4 int4 int4 int4 int4\nskip skip skip skip skip skip skip skip\n");
    cr_assert_eq(engine_precmap_load(&pm, e, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(pm.prec[1], PREC_INT4);
    cr_assert_eq(pm.prec[2], ENGINE_PREC_SKIP);
    engine_precmap_free(&pm);
    test_write_file(path, "bf16 int2 bf16 bf16 bf16 bf16 bf16 bf16\n");
    cr_assert_eq(engine_precmap_load(&pm, e, path, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, ":1: expert 1: 'int2' is not a loaded precision"), "%s", err.msg);
    test_write_file(path, "bf16 bf16\n");
    cr_assert_eq(engine_precmap_load(&pm, e, path, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "2 entries, expected 8"), "%s", err.msg);
    engine_destroy(e);
}

Test(engine, importance_of_a_layer_sums_to_the_number_of_queries) {
    /* each query's attention probabilities sum to 1 per head, so the head-averaged column sums
     * over all positions add up to the number of tokens run */
    engine *e = load("qwen3_moe", 1, 0);
    uint32_t n = sizeof prompt_b / sizeof *prompt_b;
    engine_seq *s = engine_seq_create(e, n);
    moesim_error err = {0};
    for (uint32_t t = 0; t < n; t++)
        cr_assert_eq(engine_seq_forward(e, s, prompt_b[t], NULL, NULL, NULL, &err), MOESIM_OK);
    for (uint32_t m = 0; m < engine_config_of(e)->n_moe_layers; m++) {
        double sum = 0;
        for (uint32_t p = 0; p < n; p++) {
            cr_assert_geq(engine_seq_importance(s, m, p), 0);
            sum += engine_seq_importance(s, m, p);
        }
        cr_assert_float_eq(sum, (double)n, 1e-4);
    }
    /* the first token is seen by every query: it carries more than the last one */
    cr_assert_gt(engine_seq_importance(s, 0, 0), engine_seq_importance(s, 0, n - 1));
    engine_seq_destroy(s);
    engine_destroy(e);
}

Test(engine, generation_is_deterministic_and_logs_every_token_in_execution_order) {
    engine *e = load("olmoe", 2, 0);
    const engine_config *c = engine_config_of(e);
    engine_request reqs[3] = {{prompt_a, 5}, {prompt_b, 3}, {prompt_a + 2, 4}};
    engine_gen_options o = {.gen_len = 4, .batch = 2, .lookahead_depth = 2, .lookahead_k = 3,
                            .temperature = 0.8f, .seed = 42};
    engine_gen_log a, b;
    moesim_error err = {0};
    cr_assert_eq(engine_generate(e, reqs, 3, &o, &a, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(engine_generate(e, reqs, 3, &o, &b, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(a.n_tokens, 5 + 3 + 4 + 3 * 4);
    cr_assert_eq(memcmp(a.generated, b.generated, 3 * a.gen_stride * sizeof(int32_t)), 0);
    cr_assert_eq(memcmp(a.expert_ids, b.expert_ids, a.n_tokens * c->n_moe_layers * c->top_k * 2),
                 0);
    /* group {0, 1}: prefill 0, prefill 1, then decode steps alternate 0, 1 */
    cr_assert_eq(a.request_id[0], 0);
    cr_assert_eq(a.request_id[5], 1);
    cr_assert_eq(a.phase[8], 1);
    cr_assert_eq(a.request_id[8], 0);
    cr_assert_eq(a.request_id[9], 1);
    cr_assert_eq(a.position[8], 5);
    cr_assert_eq(a.token_id[8], a.generated[0]); /* the first decode feeds the first sample */
    cr_assert_eq(a.request_id[16], 2);
    /* look-ahead: beyond the last MoE layer the ids are padding; scores descend */
    uint32_t L = c->n_moe_layers, D = 2, KP = 3;
    for (uint64_t t = 0; t < a.n_tokens; t++)
        for (uint32_t m = 0; m < L; m++)
            for (uint32_t d = 1; d <= D; d++) {
                const uint16_t *ids = a.lookahead_ids + ((t * L + m) * D + d - 1) * KP;
                const float *sc = a.lookahead_scores + ((t * L + m) * D + d - 1) * KP;
                if (m + d >= L) cr_assert_eq(ids[0], UINT16_MAX);
                else cr_assert(ids[0] < c->n_experts && sc[0] >= sc[1] && sc[1] >= sc[2]);
            }
    engine_gen_log_free(&a);
    engine_gen_log_free(&b);
    engine_destroy(e);
}

Test(engine, an_out_of_vocabulary_token_is_an_input_error) {
    engine *e = load("mixtral", 1, 0);
    engine_seq *s = engine_seq_create(e, 2);
    moesim_error err = {0};
    cr_assert_eq(engine_seq_forward(e, s, 256, NULL, NULL, NULL, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "outside the vocabulary"), "%s", err.msg);
    engine_seq_destroy(s);
    engine_destroy(e);
}

Test(engine, an_unknown_backend_is_refused_naming_the_backends_of_the_build) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/golden/mixtral", MOESIM_SOURCE_DIR);
    engine_options opt = {.backend = "tpu"};
    engine *e = NULL;
    moesim_error err = {0};
    cr_assert_eq(engine_load(dir, &opt, &e, &err), MOESIM_EINPUT);
    cr_assert_null(e);
    char want[128];
    snprintf(want, sizeof want, "backend 'tpu' is unknown (this build has: %s)", engine_backends());
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    cr_assert(strstr(engine_backends(), "cpu"));
}

Test(engine, the_cuda_backend_of_a_build_without_cuda_is_refused_in_one_line) {
    if (strstr(engine_backends(), "cuda")) cr_skip_test("this build has CUDA");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/golden/mixtral", MOESIM_SOURCE_DIR);
    engine_options opt = {.backend = "cuda"};
    engine *e = NULL;
    moesim_error err = {0};
    cr_assert_eq(engine_load(dir, &opt, &e, &err), MOESIM_EINPUT);
    cr_assert_null(e);
    cr_assert(strstr(err.msg, "backend 'cuda': built without CUDA (configure with "
                              "-DMOESIM_CUDA=ON"), "%s", err.msg);
    cr_assert_null(strchr(err.msg, '\n'), "%s", err.msg);
}

Test(engine, the_cpu_backend_is_the_default_and_reports_no_pool) {
    engine *e = load("olmoe", 1, 0);
    cr_assert_str_eq(engine_backend_name(e), "cpu");
    engine_pool_stats ps;
    engine_pool_stats_get(e, &ps);
    cr_assert_eq(ps.blocks, 0);
    cr_assert_eq(ps.hits + ps.misses + ps.h2d_bytes, 0);
    engine_destroy(e);
}
