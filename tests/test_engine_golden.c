/* The engine against Hugging Face transformers: for each architecture's tiny random checkpoint,
 * and for the configurations beyond an architecture's defaults that the engine implements
 * (attention biases, sliding windows: tests/fixtures/golden/<model_type>_<feature>), all made by
 * tools/make_golden.py, every prompt token's router choices must equal transformers' exactly, gate
 * weights and logits must agree within named tolerances. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/safetensors.h"

/* transformers computes the reference in float64 on the same bf16 weights; the engine computes in
 * fp32. fp32 rounding through 3 layers moves logits (|logit| <= ~5) by ~3e-6 at most here;
 * 2e-5 absolute + 1e-5 relative leaves a margin while any wrong op (norm, rope, gate rule,
 * shared expert) moves them by more than 1e-2. Gate weights are probabilities in [0, 1]. */
#define LOGIT_ATOL 2e-5f
#define LOGIT_RTOL 1e-5f
#define GATE_ATOL 2e-6f

typedef struct golden_case {
    const char *arch;
} golden_case;

static const float *golden_f32(const st_file *g, const char *name, uint64_t want_elems) {
    const st_tensor *t = st_file_find(g, name);
    cr_assert(t, "golden tensor %s missing", name);
    cr_assert_eq(t->dtype, ST_F32);
    cr_assert_eq(t->n_elems, want_elems, "%s: %llu elements", name,
                 (unsigned long long)t->n_elems);
    return t->data;
}

/* The fixture tests/fixtures/golden/<arch> (a fixture name: "qwen3_moe_attention_bias") of the
 * architecture model_type. */
static void check_fixture(const char *arch, const char *model_type) {
    char dir[1024], gpath[1100];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/golden/%s", MOESIM_SOURCE_DIR, arch);
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    moesim_error err = {0};
    engine *e;
    engine_options opt = {.n_threads = 2};
    cr_assert_eq(engine_load(dir, &opt, &e, &err), MOESIM_OK, "%s", err.msg);
    st_file *g;
    cr_assert_eq(st_file_open(gpath, &g, &err), MOESIM_OK, "%s", err.msg);
    const engine_config *c = engine_config_of(e);
    cr_assert_str_eq(c->model_type, model_type);
    uint32_t L = c->n_moe_layers, K = c->top_k, V = c->vocab;
    float *logits = malloc(V * sizeof *logits);
    uint16_t ids[64 * 8];
    float gates[64 * 8];
    engine_token_info info = {.expert_ids = ids, .gate_weights = gates};
    int n_prompts = 0;
    double worst = 0;
    for (int p = 0;; p++, n_prompts++) {
        char name[64];
        snprintf(name, sizeof name, "prompt%d.ids", p);
        const st_tensor *idt = st_file_find(g, name);
        if (!idt) break;
        uint64_t n = idt->n_elems;
        const float *tok = idt->data;
        snprintf(name, sizeof name, "prompt%d.logits", p);
        const float *want_logits = golden_f32(g, name, n * V);
        snprintf(name, sizeof name, "prompt%d.topk_ids", p);
        const float *want_ids = golden_f32(g, name, n * L * K);
        snprintf(name, sizeof name, "prompt%d.topk_weights", p);
        const float *want_w = golden_f32(g, name, n * L * K);
        engine_seq *s = engine_seq_create(e, (uint32_t)n);
        for (uint64_t t = 0; t < n; t++) {
            cr_assert_eq(engine_seq_forward(e, s, (int32_t)tok[t], NULL, logits, &info, &err),
                         MOESIM_OK, "%s", err.msg);
            for (uint32_t i = 0; i < L * K; i++) {
                cr_assert_eq(ids[i], (uint16_t)want_ids[t * L * K + i],
                             "%s prompt %d token %llu layer %u rank %u: expert %u, transformers %g",
                             arch, p, (unsigned long long)t, i / K, i % K, ids[i],
                             want_ids[t * L * K + i]);
                cr_assert(fabsf(gates[i] - want_w[t * L * K + i]) <= GATE_ATOL,
                          "%s prompt %d token %llu: gate %g vs %g", arch, p,
                          (unsigned long long)t, gates[i], want_w[t * L * K + i]);
            }
            for (uint32_t v = 0; v < V; v++) {
                float want = want_logits[t * V + v], diff = fabsf(logits[v] - want);
                if (diff > worst) worst = diff;
                cr_assert(diff <= LOGIT_ATOL + LOGIT_RTOL * fabsf(want),
                          "%s prompt %d token %llu logit %u: %.7g vs transformers %.7g", arch, p,
                          (unsigned long long)t, v, logits[v], want);
            }
        }
        engine_seq_destroy(s);
    }
    cr_assert_geq(n_prompts, 2, "%s: golden file holds %d prompts", arch, n_prompts);
    cr_log_info("%s: worst logit difference %.3g", arch, worst);
    free(logits);
    st_file_close(g);
    engine_destroy(e);
}

static void check_arch(const char *arch) { check_fixture(arch, arch); }

TestSuite(engine_golden);

Test(engine_golden, mixtral_matches_transformers_routing_and_logits) { check_arch("mixtral"); }
Test(engine_golden, qwen2_moe_matches_transformers_routing_and_logits) { check_arch("qwen2_moe"); }
Test(engine_golden, qwen3_moe_matches_transformers_routing_and_logits) { check_arch("qwen3_moe"); }
Test(engine_golden, olmoe_matches_transformers_routing_and_logits) { check_arch("olmoe"); }

Test(engine_golden, qwen3_moe_with_attention_bias_matches_transformers) {
    check_fixture("qwen3_moe_attention_bias", "qwen3_moe");
}
Test(engine_golden, olmoe_with_attention_bias_matches_transformers) {
    check_fixture("olmoe_attention_bias", "olmoe");
}
Test(engine_golden, qwen3_moe_with_a_sliding_window_matches_transformers) {
    check_fixture("qwen3_moe_sliding_window", "qwen3_moe");
}
Test(engine_golden, mixtral_with_a_sliding_window_matches_transformers) {
    check_fixture("mixtral_sliding_window", "mixtral");
}
Test(engine_golden, qwen2_moe_with_windows_on_the_layers_layer_types_names_matches_transformers) {
    check_fixture("qwen2_moe_sliding_window", "qwen2_moe");
}
