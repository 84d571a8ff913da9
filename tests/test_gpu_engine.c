/* The CUDA forward pass (engine_options.backend = "cuda") against the golden fixtures made by
 * Hugging Face transformers (tests/fixtures/golden/, read as tests/test_engine_golden.c does) and
 * against the CPU backend: identical router choices, logits within named tolerances; the
 * offloaded expert pool gives bit-identical results to the resident one; `moesim record
 * --backend cuda` writes the same routing as the CPU backend. Skipped (exit 77) without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/safetensors.h"
#include "support/gpu_test.h"
#include "support/test_support.h"
#include "traces/trace.h"

/* The CPU engine meets transformers (float64) within 2e-5 + 1e-5 |logit| (test_engine_golden.c);
 * the GPU computes the same fp32 ops with matrix-vector sums in another order (warp lanes, not 8
 * CPU lanes), which moves logits by a few 1e-6 on these 3-layer checkpoints. 5e-5 + 2e-5 |logit|
 * keeps a margin of ~10x over that while a wrong op moves logits by more than 1e-2. */
#define GPU_LOGIT_ATOL 5e-5f
#define GPU_LOGIT_RTOL 2e-5f
/* Gate weights are probabilities in [0, 1]: expf within 2 ulp, sums reordered. */
#define GPU_GATE_ATOL 5e-6f
/* GPU against the CPU backend on the same weights (quantized experts included): the same
 * reordering bound as above, applied to both sides' fp32 error. */
#define GPU_CPU_LOGIT_ATOL 5e-5f
#define GPU_CPU_LOGIT_RTOL 2e-5f
/* DyMoE importance: sums of attention probabilities over up to ~20 queries. */
#define GPU_CPU_IMPORTANCE_ATOL 1e-5f

static const char *fixture_dir(const char *arch) {
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/golden/%s", MOESIM_SOURCE_DIR, arch);
    return dir;
}

static engine *load(const char *arch, const char *backend, uint32_t mask, uint32_t pool) {
    engine_options opt = {
        .n_threads = 2, .precision_mask = mask, .backend = backend, .gpu_pool_experts = pool};
    engine *e;
    moesim_error err = {0};
    cr_assert_eq(engine_load(fixture_dir(arch), &opt, &e, &err), MOESIM_OK, "%s: %s", arch,
                 err.msg);
    cr_assert_str_eq(engine_backend_name(e), backend);
    return e;
}

static const float *golden_f32(const st_file *g, const char *name, uint64_t want_elems) {
    const st_tensor *t = st_file_find(g, name);
    cr_assert(t, "golden tensor %s missing", name);
    cr_assert_eq(t->dtype, ST_F32);
    cr_assert_eq(t->n_elems, want_elems, "%s: %llu elements", name, (unsigned long long)t->n_elems);
    return t->data;
}

static void check_golden(const char *arch) {
    char gpath[1100];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", fixture_dir(arch));
    moesim_error err = {0};
    engine *e = load(arch, "cuda", 0, 0);
    st_file *g;
    cr_assert_eq(st_file_open(gpath, &g, &err), MOESIM_OK, "%s", err.msg);
    const engine_config *c = engine_config_of(e);
    uint32_t L = c->n_moe_layers, K = c->top_k, V = c->vocab;
    float *logits = malloc(V * sizeof *logits);
    uint16_t *ids = malloc((size_t)L * K * sizeof *ids);
    float *gates = malloc((size_t)L * K * sizeof *gates);
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
                cr_assert(fabsf(gates[i] - want_w[t * L * K + i]) <= GPU_GATE_ATOL,
                          "%s prompt %d token %llu: gate %g vs %g", arch, p, (unsigned long long)t,
                          gates[i], want_w[t * L * K + i]);
            }
            for (uint32_t v = 0; v < V; v++) {
                float want = want_logits[t * V + v], diff = fabsf(logits[v] - want);
                if (diff > worst) worst = diff;
                cr_assert(diff <= GPU_LOGIT_ATOL + GPU_LOGIT_RTOL * fabsf(want),
                          "%s prompt %d token %llu logit %u: gpu %.7g vs transformers %.7g", arch,
                          p, (unsigned long long)t, v, logits[v], want);
            }
        }
        engine_seq_destroy(s);
    }
    cr_assert_geq(n_prompts, 2, "%s: golden file holds %d prompts", arch, n_prompts);
    cr_log_info("%s on the GPU: worst logit difference to transformers %.3g", arch, worst);
    free(logits), free(ids), free(gates);
    st_file_close(g);
    engine_destroy(e);
}

TestSuite(gpu_engine);

Test(gpu_engine, mixtral_on_the_gpu_matches_transformers_routing_and_logits) {
    check_golden("mixtral");
}
Test(gpu_engine, qwen2_moe_on_the_gpu_matches_transformers_routing_and_logits) {
    check_golden("qwen2_moe");
}
Test(gpu_engine, qwen3_moe_on_the_gpu_matches_transformers_routing_and_logits) {
    check_golden("qwen3_moe");
}
Test(gpu_engine, olmoe_on_the_gpu_matches_transformers_routing_and_logits) {
    check_golden("olmoe");
}
Test(gpu_engine, attention_biases_on_the_gpu_match_transformers) {
    check_golden("qwen3_moe_attention_bias");
    check_golden("olmoe_attention_bias");
}
Test(gpu_engine, sliding_windows_on_the_gpu_match_transformers_layer_by_layer) {
    check_golden("qwen3_moe_sliding_window");
    check_golden("mixtral_sliding_window");
    check_golden("qwen2_moe_sliding_window");
}

/* ---- GPU against CPU on every held precision, look-ahead and importance ---- */

#define ALL_PRECISIONS ((1u << PREC_INT8) | (1u << PREC_INT4) | (1u << PREC_INT2))

static const int32_t prompt_a[] = {1, 17, 42, 99, 3, 250, 7, 64, 12, 13, 200, 201};
static const int32_t prompt_b[] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 255, 31, 77};

/* A map cycling bf16, int8, int4, int2 and skip over (layer, expert). */
static void mixed_map(engine_precmap *m, const engine *e) {
    static const uint8_t cycle[] = {PREC_BF16, PREC_INT8, PREC_INT4, PREC_INT2, ENGINE_PREC_SKIP};
    engine_precmap_init(m, e, PREC_BF16);
    for (uint32_t l = 0; l < m->n_layers; l++)
        for (uint32_t j = 0; j < m->n_experts; j++)
            m->prec[l * m->n_experts + j] = cycle[(l + j) % 5];
}

static void run_generate(engine *e, engine_gen_log *log) {
    engine_precmap pm;
    mixed_map(&pm, e);
    engine_request reqs[2] = {{prompt_a, 12}, {prompt_b, 13}};
    engine_gen_options o = {
        .gen_len = 6, .batch = 2, .lookahead_depth = 2, .lookahead_k = 3, .pmap = &pm};
    moesim_error err = {0};
    cr_assert_eq(engine_generate(e, reqs, 2, &o, log, &err), MOESIM_OK, "%s", err.msg);
    engine_precmap_free(&pm);
}

static void check_against_cpu(const char *arch, uint32_t pool) {
    engine *cpu = load(arch, "cpu", ALL_PRECISIONS, 0),
           *gpu = load(arch, "cuda", ALL_PRECISIONS, pool);
    engine_gen_log a, b;
    run_generate(cpu, &a);
    run_generate(gpu, &b);
    cr_assert_eq(a.n_tokens, b.n_tokens);
    size_t routes = (size_t)a.n_tokens * a.n_moe_layers * a.top_k;
    size_t la = (size_t)a.n_tokens * a.n_moe_layers * a.lookahead_depth * a.lookahead_k;
    for (size_t i = 0; i < routes; i++) {
        cr_assert_eq(b.expert_ids[i], a.expert_ids[i], "%s route %zu: gpu %u, cpu %u", arch, i,
                     b.expert_ids[i], a.expert_ids[i]);
        cr_assert(fabsf(b.gate_weights[i] - a.gate_weights[i]) <= GPU_GATE_ATOL,
                  "%s gate %zu: gpu %g, cpu %g", arch, i, b.gate_weights[i], a.gate_weights[i]);
    }
    for (size_t i = 0; i < la; i++)
        cr_assert_eq(b.lookahead_ids[i], a.lookahead_ids[i], "%s look-ahead %zu", arch, i);
    for (size_t i = 0; i < (size_t)a.n_tokens * a.n_moe_layers; i++)
        cr_assert(fabsf(b.importance[i] - a.importance[i]) <= GPU_CPU_IMPORTANCE_ATOL,
                  "%s importance %zu: gpu %g, cpu %g", arch, i, b.importance[i], a.importance[i]);
    for (size_t i = 0; i < (size_t)a.n_requests * a.gen_stride; i++)
        cr_assert_eq(b.generated[i], a.generated[i], "%s generated token %zu", arch, i);
    engine_gen_log_free(&a);
    engine_gen_log_free(&b);
    engine_destroy(cpu);
    engine_destroy(gpu);
}

Test(gpu_engine, resident_gpu_generation_routes_like_the_cpu_at_every_precision) {
    /* the window fixtures: importance where layers see different spans */
    const char *archs[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "qwen2_moe_sliding_window",
                           "olmoe_attention_bias"};
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++) check_against_cpu(archs[i], 0);
}

Test(gpu_engine, offloaded_gpu_generation_with_a_top_k_pool_routes_like_the_cpu) {
    const char *archs[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};
    for (int i = 0; i < 4; i++) {
        engine *probe = load(archs[i], "cpu", 0, 0);
        uint32_t k = engine_config_of(probe)->top_k;
        engine_destroy(probe);
        check_against_cpu(archs[i], k); /* the smallest pool: a miss on almost every expert */
    }
}

/* Offloading moves bytes, not arithmetic: logits are bit-identical to the resident pool's. */
Test(gpu_engine, offloaded_pool_logits_equal_resident_logits_bit_for_bit) {
    engine *res = load("olmoe", "cuda", ALL_PRECISIONS, 0);
    uint32_t K = engine_config_of(res)->top_k, V = engine_config_of(res)->vocab;
    engine *off = load("olmoe", "cuda", ALL_PRECISIONS, K + 1);
    engine_precmap pm;
    mixed_map(&pm, res);
    float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb);
    engine_seq *sa = engine_seq_create(res, 16), *sb = engine_seq_create(off, 16);
    moesim_error err = {0};
    for (uint32_t t = 0; t < 12; t++) {
        cr_assert_eq(engine_seq_forward(res, sa, prompt_a[t], &pm, la, NULL, &err), MOESIM_OK);
        cr_assert_eq(engine_seq_forward(off, sb, prompt_a[t], &pm, lb, NULL, &err), MOESIM_OK);
        cr_assert_eq(memcmp(la, lb, V * sizeof *la), 0, "token %u: logits differ", t);
    }
    engine_seq_destroy(sa), engine_seq_destroy(sb);
    free(la), free(lb);
    engine_precmap_free(&pm);
    engine_destroy(res);
    engine_destroy(off);
}

Test(gpu_engine, a_pool_smaller_than_top_k_is_refused_with_a_message) {
    engine_options opt = {.backend = "cuda", .gpu_pool_experts = 1};
    engine *e;
    moesim_error err = {0};
    cr_assert_neq(engine_load(fixture_dir("mixtral"), &opt, &e, &err), MOESIM_OK);
    cr_assert(strstr(err.msg, "top_k"), "%s", err.msg);
}

/* ---- moesim record ---- */

static char out[1 << 14], errbuf[1 << 12];

Test(gpu_engine, record_on_cuda_writes_the_routing_of_the_cpu_backend) {
    const char *archs[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};
    for (int a = 0; a < 4; a++) {
        const char *toks = test_tmp_path("toks.txt");
        test_write_file(toks, "1 17 42 99 3 250 7\n9 8 7 6 5\n");
        char cpu_path[1024], gpu_path[1024];
        snprintf(cpu_path, sizeof cpu_path, "%s", test_tmp_path("cpu.h5"));
        snprintf(gpu_path, sizeof gpu_path, "%s", test_tmp_path("gpu.h5"));
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "record", "--model",
                                 fixture_dir(archs[a]), "--input", toks, "-o", cpu_path,
                                 "--gen-len", "5", "--precision", "int4", NULL);
        cr_assert_eq(rc, 0, "%s", errbuf);
        rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "record", "--model",
                             fixture_dir(archs[a]), "--input", toks, "-o", gpu_path, "--gen-len",
                             "5", "--precision", "int4", "--backend", "cuda", "--gpu-pool", "8",
                             NULL);
        cr_assert_eq(rc, 0, "%s", errbuf);
        trace *tc, *tg;
        moesim_error err = {0};
        cr_assert_eq(trace_read(cpu_path, &tc, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_eq(trace_read(gpu_path, &tg, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_eq(tg->n_tokens, tc->n_tokens);
        size_t n = (size_t)tc->n_tokens * tc->meta.n_layers * tc->meta.top_k;
        cr_assert_eq(memcmp(tg->expert_ids, tc->expert_ids, n * sizeof *tc->expert_ids), 0,
                     "%s: routing differs between backends", archs[a]);
        cr_assert_eq(memcmp(tg->token_id, tc->token_id, tc->n_tokens * sizeof *tc->token_id), 0,
                     "%s: generated tokens differ between backends", archs[a]);
        trace_destroy(tc);
        trace_destroy(tg);
    }
}
