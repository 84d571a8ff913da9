/* `moesim replay --model DIR` (replay/weights.h): the experts replay stores are the engine's own
 * bytes at every precision (the engine's quantization of the same checkpoint), the non-expert
 * buffers hold the checkpoint's matrices in replay's layout (fp32 checkpoints and dense layers
 * included), a trace is checked against the checkpoint field by field, and the command refuses
 * bad usage and mismatched geometry with one line, exit 2, before the GPU. The cpu backend runs
 * a checkpoint: its expert file and its CPU compute hold the checkpoint's bytes, and every policy
 * replays a trace recorded from it. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/safetensors.h"
#include "common/config.h"
#include "common/hw.h"
#include "kernels/quant.h"
#include "policies/policy.h"
#include "replay/cpu_compute.h"
#include "replay/cpu_store.h"
#include "replay/replay.h"
#include "replay/weights.h"
#include "support/test_support.h"
#include "traces/trace.h"

static char out[1 << 14], errbuf[1 << 12];

static const char *const archs[] = {"qwen3_moe", "qwen2_moe", "olmoe", "mixtral"};
static const moesim_precision precs[] = {PREC_BF16, PREC_INT8, PREC_INT4, PREC_INT2};
static const mat_kind prec_kinds[] = {MAT_BF16, MAT_Q8, MAT_Q4,
                                      MAT_Q2}; /* the engine's, of precs */
#define HELD_MASK ((1u << PREC_INT8) | (1u << PREC_INT4) | (1u << PREC_INT2))

static const char *golden(const char *arch) {
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/golden/%s", MOESIM_SOURCE_DIR, arch);
    return dir;
}

static replay_weights *weights_open(const char *dir) {
    replay_weights *w;
    moesim_error err = {0};
    cr_assert_eq(replay_weights_open(dir, &w, &err), MOESIM_OK, "%s", err.msg);
    return w;
}

static engine *engine_open(const char *dir, uint32_t mask) {
    engine *e;
    moesim_error err = {0};
    engine_options opt = {.n_threads = 1, .precision_mask = mask};
    cr_assert_eq(engine_load(dir, &opt, &e, &err), MOESIM_OK, "%s", err.msg);
    return e;
}

static size_t mat_bytes(const engine_mat *m, moesim_precision p) {
    return p == PREC_BF16 ? (size_t)m->rows * m->cols * 2
                          : quant_matrix_size_bytes(p, m->rows, m->cols);
}

static int lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

TestSuite(replay_model);

/* ---- experts ---- */

Test(replay_model, experts_are_the_engines_own_bytes_at_every_precision) {
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        replay_weights *w = weights_open(golden(archs[a]));
        engine *e = engine_open(golden(archs[a]), HELD_MASK);
        const engine_config *c = engine_config_of(e);
        model_geometry g;
        replay_weights_geometry(w, "t", &g);
        cr_assert_eq(g.n_moe_layers, c->n_moe_layers);
        for (size_t pi = 0; pi < sizeof precs / sizeof precs[0]; pi++) {
            moesim_precision p = precs[pi];
            uint64_t blob_bytes = 0;
            for (int part = 0; part < PART_COUNT; part++)
                blob_bytes += replay_part_bytes(&g, p, (expert_part)part);
            uint8_t *blob = moesim_xmalloc(blob_bytes);
            for (uint32_t ml = 0; ml < c->n_moe_layers; ml++)
                for (uint32_t x = 0; x < c->n_experts; x++) {
                    replay_weights_expert(w, ml, x, p, blob);
                    size_t off = 0;
                    for (int part = 0; part < PART_COUNT; part++) {
                        const engine_mat *m =
                            engine_weight(e, T_EXP_GATE + part, c->moe_layer[ml], x, p);
                        cr_assert(m, "%s: no %s expert", archs[a], precision_name(p));
                        cr_assert_eq(mat_bytes(m, p), replay_part_bytes(&g, p, (expert_part)part));
                        cr_assert_eq(m->kind, prec_kinds[pi]);
                        cr_assert(!memcmp(blob + off, m->data, mat_bytes(m, p)),
                                  "%s: MoE layer %u expert %u %s part %d differs from the engine's",
                                  archs[a], ml, x, precision_name(p), part);
                        off += mat_bytes(m, p);
                    }
                    cr_assert_eq(off, blob_bytes);
                }
            free(blob);
        }
        engine_destroy(e);
        replay_weights_close(w);
    }
}

Test(replay_model, experts_written_together_at_a_stride_equal_one_by_one_and_leave_the_gaps) {
    replay_weights *w = weights_open(golden("qwen2_moe"));
    model_geometry g;
    replay_weights_geometry(w, "t", &g);
    for (size_t pi = 0; pi < sizeof precs / sizeof precs[0]; pi++) {
        moesim_precision p = precs[pi];
        uint64_t blob = 0;
        for (int part = 0; part < PART_COUNT; part++)
            blob += replay_part_bytes(&g, p, (expert_part)part);
        uint64_t stride = blob + 100, first = 5, n = (uint64_t)g.n_moe_layers * g.n_experts - 7;
        uint8_t *many = moesim_xmalloc(n * stride), *one = moesim_xmalloc(blob);
        memset(many, 0xab, n * stride);
        replay_weights_experts(w, p, first, n, many, stride);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t le = first + i;
            replay_weights_expert(w, (uint32_t)(le / g.n_experts), (uint32_t)(le % g.n_experts), p,
                                  one);
            cr_assert(!memcmp(many + i * stride, one, blob), "%s: expert %lu", precision_name(p),
                      (unsigned long)le);
            for (uint64_t b = blob; b < stride; b++)
                cr_assert_eq(many[i * stride + b], 0xab, "gap after expert %lu overwritten",
                             (unsigned long)le);
        }
        free(many);
        free(one);
    }
    replay_weights_close(w);
}

/* ---- non-expert buffers ---- */

/* The matrices of `kinds` (bf16 in the engine) back to back, as replay lays them out. */
static void expect_concat(const engine *e, const uint16_t *buf, uint64_t elems,
                          const tensor_kind *kinds, size_t n, uint32_t layer, const char *what) {
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const engine_mat *m = engine_weight(e, kinds[i], layer, 0, PREC_BF16);
        cr_assert(m && m->kind == MAT_BF16, "%s: layer %u", what, layer);
        size_t k = (size_t)m->rows * m->cols;
        cr_assert(!memcmp(buf + off, m->data, k * 2), "%s: layer %u matrix %zu differs", what,
                  layer, i);
        off += k;
    }
    cr_assert_eq(off, elems, "%s: %lu elements, replay sizes %lu", what, (unsigned long)off,
                 (unsigned long)elems);
}

Test(replay_model, non_expert_buffers_hold_the_checkpoints_matrices_in_replays_layout) {
    static const tensor_kind attn[] = {T_Q, T_K, T_V, T_O}, router[] = {T_ROUTER},
                             shared[] = {T_SHARED_GATE, T_SHARED_UP, T_SHARED_DOWN},
                             lm[] = {T_LM_HEAD};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        replay_weights *w = weights_open(golden(archs[a]));
        engine *e = engine_open(golden(archs[a]), 0);
        model_geometry g;
        replay_weights_geometry(w, "t", &g);
        uint64_t most = 0;
        for (int k = 0; k < REPLAY_NX_COUNT; k++)
            if (replay_nonexpert_elems(&g, (replay_nonexpert)k) > most)
                most = replay_nonexpert_elems(&g, (replay_nonexpert)k);
        uint16_t *buf = moesim_xmalloc(most * 2);
        for (uint32_t l = 0; l < g.n_layers; l++) {
            cr_assert(g.is_moe_layer[l], "the golden checkpoints are MoE in every layer");
            replay_weights_nonexpert(w, REPLAY_NX_ATTENTION, l, buf);
            expect_concat(e, buf, replay_nonexpert_elems(&g, REPLAY_NX_ATTENTION), attn, 4, l,
                          "attention");
            replay_weights_nonexpert(w, REPLAY_NX_ROUTER, l, buf);
            expect_concat(e, buf, replay_nonexpert_elems(&g, REPLAY_NX_ROUTER), router, 1, l,
                          "router");
            if (g.n_shared_experts) {
                replay_weights_nonexpert(w, REPLAY_NX_SHARED, l, buf);
                expect_concat(e, buf, replay_nonexpert_elems(&g, REPLAY_NX_SHARED), shared, 3, l,
                              "shared expert");
            }
        }
        cr_assert_eq(g.n_shared_experts, !strcmp(archs[a], "qwen2_moe"));
        cr_assert_eq(replay_nonexpert_elems(&g, REPLAY_NX_DENSE), 0);
        replay_weights_nonexpert(w, REPLAY_NX_LM_HEAD, 0, buf);
        expect_concat(e, buf, replay_nonexpert_elems(&g, REPLAY_NX_LM_HEAD), lm, 1, 0, "lm head");
        free(buf);
        engine_destroy(e);
        replay_weights_close(w);
    }
}

/* An F32 copy of the golden qwen3_moe (every tensor widened exactly from bf16) whose layer 1 is a
 * dense MLP (mlp_only_layers [1], intermediate_size 128) with F32 weights dense_value(i): the
 * engine holds every matrix as fp32, so replay converts to bf16 and quantizes from fp32 rows. */
#define DENSE_INTER 128
#define DENSE_ELEMS (3 * DENSE_INTER * 64)

static float dense_value(size_t i) { return (float)((int)(i * 37 % 201) - 100) * 0.00731f; }

static void header_add(char *header, size_t cap, size_t *used, const char *name,
                       const uint64_t *shape, uint32_t n_dims, uint64_t *data_bytes) {
    uint64_t n = 1;
    char dims[64] = "";
    for (uint32_t d = 0; d < n_dims; d++) {
        n *= shape[d];
        snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%llu", d ? "," : "",
                 (unsigned long long)shape[d]);
    }
    *used += (size_t)snprintf(header + *used, cap - *used,
                              "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%llu,"
                              "%llu]}",
                              *used > 1 ? "," : "", name, dims, (unsigned long long)*data_bytes,
                              (unsigned long long)(*data_bytes + 4 * n));
    *data_bytes += 4 * n;
}

static const char *f32_checkpoint_with_a_dense_layer(void) {
    static char dir[2048];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("f32-dense-ckpt"));
    char cmd[2200], path[2100];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    /* config.json: the golden one with layer 1 dense */
    snprintf(path, sizeof path, "%s/config.json", golden("qwen3_moe"));
    FILE *fp = fopen(path, "rb");
    cr_assert(fp);
    char cfg[1 << 13];
    size_t len = fread(cfg, 1, sizeof cfg - 1, fp);
    fclose(fp);
    cfg[len] = '\0';
    char *at = strstr(cfg, "\"mlp_only_layers\": []");
    cr_assert(at);
    char edited[1 << 13];
    snprintf(edited, sizeof edited, "%.*s\"mlp_only_layers\": [1]%s", (int)(at - cfg), cfg,
             at + strlen("\"mlp_only_layers\": []"));
    snprintf(path, sizeof path, "%s/config.json", dir);
    test_write_file(path, edited);
    /* model.safetensors */
    moesim_error err = {0};
    snprintf(path, sizeof path, "%s/model.safetensors", golden("qwen3_moe"));
    st_file *src;
    cr_assert_eq(st_file_open(path, &src, &err), MOESIM_OK, "%s", err.msg);
    size_t n = st_file_count(src), cap = 1 << 16, used = 1;
    char *header = moesim_xmalloc(cap);
    header[0] = '{';
    uint64_t data_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_file_tensor(src, i);
        header_add(header, cap, &used, t->name, t->shape, t->n_dims, &data_bytes);
    }
    static const tensor_kind dense[] = {T_DENSE_GATE, T_DENSE_UP, T_DENSE_DOWN};
    for (int k = 0; k < 3; k++) {
        char name[SAFETENSORS_MAX_NAME];
        engine_arch_qwen3_moe.tensor_name(name, sizeof name, dense[k], 1, 0);
        uint64_t shape[2] = {k == 2 ? 64 : DENSE_INTER, k == 2 ? DENSE_INTER : 64};
        header_add(header, cap, &used, name, shape, 2, &data_bytes);
    }
    used += (size_t)snprintf(header + used, cap - used, "}");
    uint64_t hlen = used;
    uint8_t *file = moesim_xcalloc(1, 8 + hlen + data_bytes), *f = file + 8 + hlen;
    memcpy(file, &hlen, 8);
    memcpy(file + 8, header, hlen);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_file_tensor(src, i);
        cr_assert_eq(t->dtype, ST_BF16);
        for (uint64_t j = 0; j < t->n_elems; j++, f += 4) {
            uint16_t b;
            memcpy(&b, (const uint8_t *)t->data + 2 * j, 2);
            float v = quant_bf16_to_f32(b);
            memcpy(f, &v, 4);
        }
    }
    for (size_t j = 0; j < DENSE_ELEMS; j++, f += 4) {
        float v = dense_value(j);
        memcpy(f, &v, 4);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    test_write_bytes(path, file, 8 + hlen + data_bytes);
    free(file);
    free(header);
    st_file_close(src);
    return dir;
}

Test(replay_model, an_fp32_checkpoint_gives_the_bf16_bytes_and_its_dense_layer_in_replays_layout) {
    const char *dir = f32_checkpoint_with_a_dense_layer();
    replay_weights *w32 = weights_open(dir), *w16 = weights_open(golden("qwen3_moe"));
    model_geometry g32, g16;
    replay_weights_geometry(w32, "t", &g32);
    replay_weights_geometry(w16, "t", &g16);
    cr_assert_eq(g32.n_moe_layers, 2);
    cr_assert(!g32.is_moe_layer[1] && g32.is_moe_layer[0] && g32.is_moe_layer[2]);
    cr_assert_eq(g32.dense_inter, DENSE_INTER);
    /* the dense layer: gate, up, down back to back, rounded to bf16 */
    uint64_t n = replay_nonexpert_elems(&g32, REPLAY_NX_DENSE);
    cr_assert_eq(n, DENSE_ELEMS);
    uint16_t *buf = moesim_xmalloc(n * 2), *ref = moesim_xmalloc(n * 2);
    replay_weights_nonexpert(w32, REPLAY_NX_DENSE, 1, buf);
    for (size_t j = 0; j < n; j++)
        cr_assert_eq(buf[j], quant_f32_to_bf16(dense_value(j)), "dense weight %zu", j);
    /* fp32 widened from bf16: every other buffer is the bf16 checkpoint's, bit for bit */
    uint64_t an = replay_nonexpert_elems(&g32, REPLAY_NX_ATTENTION);
    buf = moesim_xrealloc(buf, an * 2);
    ref = moesim_xrealloc(ref, an * 2);
    replay_weights_nonexpert(w32, REPLAY_NX_ATTENTION, 1, buf);
    replay_weights_nonexpert(w16, REPLAY_NX_ATTENTION, 1, ref);
    cr_assert(!memcmp(buf, ref, an * 2));
    /* experts: MoE layer 1 is model layer 2 in both numberings' checkpoints */
    for (size_t pi = 0; pi < sizeof precs / sizeof precs[0]; pi++) {
        uint64_t blob = 0;
        for (int part = 0; part < PART_COUNT; part++)
            blob += replay_part_bytes(&g32, precs[pi], (expert_part)part);
        uint8_t *a = moesim_xmalloc(blob), *b = moesim_xmalloc(blob);
        for (uint32_t x = 0; x < g32.n_experts; x++) {
            replay_weights_expert(w32, 1, x, precs[pi], a);
            replay_weights_expert(w16, 2, x, precs[pi], b);
            cr_assert(!memcmp(a, b, blob), "%s expert %u", precision_name(precs[pi]), x);
        }
        free(a);
        free(b);
    }
    free(buf);
    free(ref);
    replay_weights_close(w32);
    replay_weights_close(w16);
}

/* ---- the trace against the checkpoint ---- */

/* Records a trace of the golden `arch` with `moesim record` (model name `name`). */
static const char *record(const char *arch, const char *name) {
    static char path[2][2048];
    static int slot;
    char *p = path[slot++ % 2];
    char prompts[2048], tag[64];
    snprintf(prompts, sizeof prompts, "%s", test_tmp_path("replay-model-prompts.txt"));
    test_write_file(prompts, "1 2 3 4 5\n7 8 9\n");
    snprintf(tag, sizeof tag, "replay-model-%s-%s.h5", arch, name);
    snprintf(p, sizeof path[0], "%s", test_tmp_path(tag));
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "record", "--model",
                             golden(arch), "--input", prompts, "-o", p, "--gen-len", "3",
                             "--threads", "1", "--name", name, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    return p;
}

static trace *read_trace(const char *path) {
    trace *t;
    moesim_error err = {0};
    cr_assert_eq(trace_read(path, &t, &err), MOESIM_OK, "%s", err.msg);
    return t;
}

typedef enum meta_edit {
    EDIT_LAYERS,
    EDIT_EXPERTS,
    EDIT_TOP_K,
    EDIT_SHARED,
    EDIT_MODEL_LAYER,
    EDIT_GATE_NORM,
    EDIT_HASH,
} meta_edit;

static void meta_apply(trace_meta *m, meta_edit e) {
    switch (e) {
    case EDIT_LAYERS:
        m->n_layers = 2;
        break;
    case EDIT_EXPERTS:
        m->n_experts = 16;
        break;
    case EDIT_TOP_K:
        m->top_k = 4;
        break;
    case EDIT_SHARED:
        m->n_shared_experts = 0;
        break;
    case EDIT_MODEL_LAYER:
        m->model_layer[2] = 5;
        break;
    case EDIT_GATE_NORM:
        m->gate_norm = GATE_SOFTMAX_TOPK;
        break;
    case EDIT_HASH:
        m->model_config_hash ^= 1;
        break;
    }
}

Test(replay_model, a_trace_recorded_from_the_checkpoint_passes_and_each_mismatch_names_its_field) {
    const char *path = record("qwen2_moe", "tiny-qwen2");
    trace *t = read_trace(path);
    replay_weights *w = weights_open(golden("qwen2_moe"));
    moesim_error err = {0};
    cr_assert_eq(replay_weights_check_trace(w, &t->meta, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_neq(t->meta.model_config_hash, 0, "an engine trace names its config.json");
    static const struct {
        meta_edit edit;
        const char *want; /* the field, as the message names it */
    } cases[] = {
        {EDIT_LAYERS, "n_layers (MoE layers) is 2"},
        {EDIT_EXPERTS, "n_experts is 16"},
        {EDIT_TOP_K, "top_k is 4"},
        {EDIT_SHARED, "n_shared_experts is 0"},
        {EDIT_MODEL_LAYER, "/layers/model_layer[2] is 5"},
        {EDIT_GATE_NORM, "gate_normalization is \"topk\""},
        {EDIT_HASH, "model_config_hash is"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trace_meta m = t->meta;
        meta_apply(&m, cases[i].edit);
        cr_assert_eq(replay_weights_check_trace(w, &m, path, &err), MOESIM_EINPUT, "case %zu", i);
        cr_assert(strstr(err.msg, path) && strstr(err.msg, cases[i].want) &&
                      strstr(err.msg, "config.json") && !strchr(err.msg, '\n'),
                  "case %zu: %s", i, err.msg);
    }
    /* a trace without a hash (synthesized, imported) is checked on the geometry alone */
    trace_meta m = t->meta;
    m.model_config_hash = 0;
    cr_assert_eq(replay_weights_check_trace(w, &m, path, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
    replay_weights_close(w);
}

Test(replay_model, a_trace_naming_a_configs_model_must_have_the_checkpoints_geometry) {
    /* routing geometry equal to the golden olmoe's, but the name says OLMoE-1B-7B, whose
     * configs/models file has other widths */
    const char *path = record("olmoe", "olmoe-1b-7b");
    trace *t = read_trace(path);
    replay_weights *w = weights_open(golden("olmoe"));
    moesim_error err = {0};
    cr_assert_eq(replay_weights_check_trace(w, &t->meta, path, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "models/olmoe-1b-7b.ini: n_layers is 16, but the checkpoint"), "%s",
              err.msg);
    trace_destroy(t);
    replay_weights_close(w);
}

/* ---- the command ---- */

Test(replay_model, weight_sources_are_exclusive_and_live_routing_is_refused) {
    const char *tp = "t.h5", *dir = golden("qwen3_moe");
    static const struct {
        const char *a, *b, *c;
        const char *want;
    } cases[] = {
        {"--hw", "h100-sxm", NULL, "a weight source is required"},
        {"--synthetic-weights", "--model", NULL, "mutually exclusive"},
        {"--model", NULL, "--seed", "--seed applies to --synthetic-weights only"},
        {"--model", NULL, "--model-geometry", "--model-geometry applies to --synthetic-weights"},
        {"--model", NULL, "--live", "--live (routing from the live model) is not offered"},
        {"--synthetic-weights", "--live", NULL, "--live (routing from the live model)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* --model takes the checkpoint; --seed and --model-geometry a value */
        const char *args[12];
        size_t n = 0;
        args[n++] = cases[i].a;
        if (!strcmp(cases[i].a, "--model")) args[n++] = dir;
        if (cases[i].b) args[n++] = cases[i].b;
        if (cases[i].b && !strcmp(cases[i].b, "--model")) args[n++] = dir;
        if (cases[i].c) args[n++] = cases[i].c;
        if (cases[i].c && strcmp(cases[i].c, "--live")) args[n++] = "3";
        while (n < 6) args[n++] = "--json";
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "replay", args[0], args[1],
                                 args[2], args[3], args[4], args[5], "--trace", tp, "--policy",
                                 "lru", NULL);
        cr_assert_eq(rc, 2, "case %zu: rc %d: %s", i, rc, errbuf);
        cr_assert_eq(lines(errbuf), 1, "case %zu: %s", i, errbuf);
        cr_assert(strstr(errbuf, cases[i].want), "case %zu: %s", i, errbuf);
    }
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "replay", "--help", NULL),
                 0);
    cr_assert(strstr(out, "--model DIR") && strstr(out, "--synthetic-weights") &&
                  strstr(out, "--model-geometry"),
              "%s", out);
}

Test(replay_model, a_mismatched_checkpoint_is_one_line_naming_the_file_and_field_before_the_gpu) {
    const char *tp = record("qwen2_moe", "tiny-qwen2");
    static const struct {
        const char *arch, *want;
    } cases[] = {
        {"qwen3_moe", ": n_shared_experts is 1, but the checkpoint "},
        {"mixtral", ": n_shared_experts is 1, but the checkpoint "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "replay", "--model",
                                 golden(cases[i].arch), "--trace", tp, "--hw", "h100-sxm",
                                 "--policy", "lru", NULL);
        cr_assert_eq(rc, 2, "%s: rc %d: %s", cases[i].arch, rc, errbuf);
        cr_assert(lines(errbuf) == 1 && strstr(errbuf, tp) && strstr(errbuf, cases[i].want) &&
                      strstr(errbuf, golden(cases[i].arch)),
                  "%s: %s", cases[i].arch, errbuf);
    }
    /* same tensors, another config.json: the recorded hash tells them apart */
    char dir[2048], cmd[4400];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("qwen2-other-config"));
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && ln -sf '%s/model.safetensors' '%s/' && "
             "sed 's/\"initializer_range\": 0.15/\"initializer_range\": 0.25/' "
             "'%s/config.json' > '%s/config.json'",
             dir, golden("qwen2_moe"), dir, golden("qwen2_moe"), dir);
    cr_assert_eq(system(cmd), 0);
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "replay", "--model", dir,
                             "--trace", tp, "--hw", "h100-sxm", "--policy", "lru", NULL);
    cr_assert_eq(rc, 2, "%s", errbuf);
    cr_assert(lines(errbuf) == 1 && strstr(errbuf, "model_config_hash is") &&
                  strstr(errbuf, "recorded from another checkpoint"),
              "%s", errbuf);
    /* a missing checkpoint names its config.json */
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "replay", "--model",
                         "/nonexistent-ckpt", "--trace", tp, "--hw", "h100-sxm", "--policy", "lru",
                         NULL);
    cr_assert(rc == 2 && lines(errbuf) == 1 && strstr(errbuf, "/nonexistent-ckpt/config.json"),
              "%s", errbuf);
}

Test(replay_model, a_matching_checkpoint_passes_every_check_and_then_needs_the_gpu) {
    moesim_error err = {0};
    if (replay_device_check(&err) == MOESIM_OK) cr_skip_test("a CUDA device is present");
    const char *want = replay_built_with_cuda() ? "no CUDA GPU or driver" : "built without CUDA";
    const char *tp = record("qwen2_moe", "tiny-qwen2");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "replay", "--model",
                             golden("qwen2_moe"), "--trace", tp, "--hw", "h100-sxm", "--policy",
                             "lru", "--json", NULL);
    cr_assert_eq(rc, 2, "%s", errbuf);
    cr_assert(lines(errbuf) == 1 && strstr(errbuf, want), "%s", errbuf);
}

/* ---- the cpu backend with a checkpoint ---- */

Test(replay_model, the_cpu_backends_expert_file_and_compute_hold_the_checkpoints_bytes) {
    replay_weights *w = weights_open(golden("qwen2_moe"));
    model_geometry g;
    replay_weights_geometry(w, "t", &g);
    bool stored[PREC_COUNT] = {[PREC_BF16] = true, [PREC_INT4] = true};
    cpu_store *s = NULL;
    moesim_error err = {0};
    cr_assert_eq(cpu_store_create(&g, stored, NULL, 1, w, &s, &err), MOESIM_OK, "%s", err.msg);
    for (int pi = 0; pi < PREC_COUNT; pi++) {
        if (!stored[pi]) continue;
        moesim_precision p = (moesim_precision)pi;
        uint64_t blob_bytes = 0;
        for (int part = 0; part < PART_COUNT; part++)
            blob_bytes += replay_part_bytes(&g, p, (expert_part)part);
        uint8_t *want = moesim_xmalloc(blob_bytes);
        uint8_t *got = cpu_store_dma_alloc(s->stride[p]);
        for (uint32_t ml = 0; ml < g.n_moe_layers; ml++)
            for (uint32_t x = 0; x < g.n_experts; x++) {
                replay_weights_expert(w, ml, x, p, want);
                cr_assert(cpu_store_read(s, cpu_store_part_offset(s, ml, x, p, PART_GATE),
                                         s->stride[p], got, NULL));
                cr_assert(!memcmp(got, want, blob_bytes), "MoE layer %u expert %u %s differs", ml,
                          x, precision_name(p));
            }
        free(got);
        free(want);
    }
    cpu_store_destroy(s);

    cpu_compute cc;
    cpu_compute_init(&cc, &g, 4, 1, w);
    uint64_t H = g.hidden, qkv = (cc.q_dim + 2 * cc.kv_dim) * H;
    for (uint32_t l = 0; l < g.n_layers; l++) {
        uint16_t *att = moesim_xmalloc(replay_nonexpert_elems(&g, REPLAY_NX_ATTENTION) * 2);
        replay_weights_nonexpert(w, REPLAY_NX_ATTENTION, l, att);
        cr_assert(!memcmp(cc.w_qkv[l], att, qkv * 2), "layer %u q|k|v", l);
        cr_assert(!memcmp(cc.w_o[l], att + qkv, cc.q_dim * H * 2), "layer %u o", l);
        free(att);
        if (!g.is_moe_layer[l]) continue;
        uint16_t *router = moesim_xmalloc(replay_nonexpert_elems(&g, REPLAY_NX_ROUTER) * 2);
        replay_weights_nonexpert(w, REPLAY_NX_ROUTER, l, router);
        cr_assert(!memcmp(cc.w_router[l], router, (uint64_t)g.n_experts * H * 2), "layer %u", l);
        free(router);
        uint64_t shared = replay_nonexpert_elems(&g, REPLAY_NX_SHARED);
        cr_assert_gt(shared, 0, "qwen2_moe has a shared expert");
        uint16_t *sh = moesim_xmalloc(shared * 2);
        replay_weights_nonexpert(w, REPLAY_NX_SHARED, l, sh);
        cr_assert(!memcmp(cc.w_shared[l], sh, shared * 2), "layer %u shared expert", l);
        free(sh);
    }
    uint16_t *lm = moesim_xmalloc(replay_nonexpert_elems(&g, REPLAY_NX_LM_HEAD) * 2);
    replay_weights_nonexpert(w, REPLAY_NX_LM_HEAD, 0, lm);
    cr_assert(!memcmp(cc.w_lm, lm, (uint64_t)g.vocab * H * 2));
    free(lm);
    cpu_compute_free(&cc);
    replay_weights_close(w);
}

Test(replay_model, every_policy_replays_a_checkpoint_on_the_cpu_backend, .timeout = 300) {
    const char *tp = record("qwen3_moe", "tiny-qwen3");
    trace *t = read_trace(tp);
    replay_weights *w = weights_open(golden("qwen3_moe"));
    model_geometry g;
    replay_weights_geometry(w, t->meta.model, &g);
    hw_profile hw;
    quant_table quant;
    moesim_error err = {0};
    cr_assert_eq(hw_load_by_name("cpu-host", &hw, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
    replay_inputs in = {.trace = t, .model = &g, .hw = &hw, .quant = &quant, .weights = w};
    /* every expert fits a 1 MB budget (every policy must run); three of eight experts per layer
     * (loads and evictions all run long; static, dynaexq and firm-moe refuse it) */
    const char *budgets[] = {"memory.budget_gb=0.001", "cache.experts_per_layer=3"};
    const size_t must_run[] = {0, 6}; /* 0: all of them */
    size_t n_pol;
    const policy_methods *const *all = policy_all(&n_pol);
    for (size_t b = 0; b < 2; b++) {
        size_t ran = 0;
        for (size_t i = 0; i < n_pol; i++) {
            config *c = config_create();
            cr_assert_eq(config_set(c, budgets[b], &err), MOESIM_OK, "%s", err.msg);
            cr_assert_eq(config_set(c, "expert.precision=int4", &err), MOESIM_OK, "%s", err.msg);
            sim_result r;
            replay_checks ck;
            moesim_status st = replay_run_cpu(&in, all[i]->name, c, &r, &ck, &err);
            config_destroy(c);
            if (must_run[b] && st == MOESIM_EINPUT && strstr(err.msg, all[i]->name)) continue;
            cr_assert_eq(st, MOESIM_OK, "%s, %s: %s", all[i]->name, budgets[b], err.msg);
            cr_expect_gt(ck.order_checked, 0, "%s, %s", all[i]->name, budgets[b]);
            cr_expect_eq(ck.order_violations, 0, "%s, %s", all[i]->name, budgets[b]);
            cr_expect_leq(r.peak_hbm_bytes, r.budget_bytes, "%s, %s", all[i]->name, budgets[b]);
            cr_expect_eq(r.tokens, t->n_tokens, "%s, %s", all[i]->name, budgets[b]);
            ran++;
        }
        cr_assert_geq(ran, must_run[b] ? must_run[b] : n_pol, "%s: %zu policies ran", budgets[b],
                      ran);
    }
    /* and the command: one line of figures, "checkpoint weights" */
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "replay", "--backend", "cpu",
                             "--model", golden("qwen3_moe"), "--trace", tp, "--hw", "cpu-host",
                             "--policy", "lru", "--set", "cache.experts_per_layer=3", NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    cr_assert(strstr(out, "(replay, checkpoint weights), policy lru"), "%s", out);
    replay_weights_close(w);
    trace_destroy(t);
}
