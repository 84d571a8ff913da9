/* Model geometry files (common/model.c, configs/models/<name>.ini) and the quantization table
 * (common/precision.c, configs/quant.ini): every shipped file loads with the geometry its
 * config.json gives, sizes are computed as documented, and broken files fail with one message that
 * names the file, the line (or --set) and the key. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/model.h"
#include "common/paths.h"
#include "common/precision.h"
#include "support/test_support.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static char *read_text(const char *path) {
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    cr_assert(buf);
    cr_assert_eq(fread(buf, 1, (size_t)len, fp), (size_t)len);
    buf[len] = '\0';
    fclose(fp);
    return buf;
}

static char *config_text(const char *kind, const char *name) {
    char path[4096];
    moesim_error err = {0};
    cr_assert_eq(moesim_config_path(kind, name, path, sizeof path, &err), MOESIM_OK, "%s", err.msg);
    return read_text(path);
}

/* Replaces the line that starts with `prefix` (e.g. "top_k =") by `line` ("" deletes it, a text
 * ending without a newline gets one) and returns the new text and the line's 1-based number. A
 * NULL prefix appends `line` after the line that starts with `after`. */
static char *mutate(const char *text, const char *prefix, const char *after, const char *line,
                    int *line_no) {
    const char *anchor = prefix ? prefix : after;
    const char *p = text;
    int n = 1;
    while (*p) {
        if (!strncmp(p, anchor, strlen(anchor))) break;
        const char *nl = strchr(p, '\n');
        if (!nl) {
            p += strlen(p);
            break;
        }
        p = nl + 1;
        n++;
    }
    cr_assert(*p, "no line starts with '%s'", anchor);
    const char *end = strchr(p, '\n');
    end = end ? end + 1 : p + strlen(p);
    size_t cap = strlen(text) + strlen(line) + 2;
    char *out = malloc(cap);
    cr_assert(out);
    const char *keep_until = prefix ? p : end; /* text kept before the new line */
    const char *resume = end;                  /* text kept after it */
    size_t head = (size_t)(keep_until - text);
    memcpy(out, text, head);
    size_t pos = head;
    if (*line) pos += (size_t)sprintf(out + pos, "%s\n", line);
    strcpy(out + pos, resume);
    *line_no = prefix ? n : n + 1;
    return out;
}

static moesim_status load_model_text(const char *text, model_geometry *m, moesim_error *err,
                                     const char *path_out_name) {
    const char *path = test_tmp_path(path_out_name);
    test_write_file(path, text);
    return model_load(path, m, err);
}

static const char *const model_names[] = {
    "mixtral-8x7b",      "qwen3-30b-a3b",    "qwen3-next-80b-a3b", "olmoe-1b-7b",
    "qwen1.5-moe-a2.7b", "deepseek-v2-lite", "phi-3.5-moe",
};
#define N_MODELS (sizeof model_names / sizeof model_names[0])

static model_geometry load_named(const char *name) {
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name(name, &m, &err), MOESIM_OK, "%s", err.msg);
    return m;
}

static quant_table load_quant(void) {
    quant_table q;
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_default(&q, &err), MOESIM_OK, "%s", err.msg);
    return q;
}

TestSuite(model_config);

/* ---- every shipped file loads with its config.json geometry ---------------------------- */

typedef struct geometry_case {
    const char *name, *family;
    uint32_t layers, moe_layers, first_moe, hidden, dense_inter, vocab;
    uint32_t experts, top_k, expert_inter, shared, shared_inter;
    bool shared_gate;
    gate_normalization gate_norm;
    attention_kind attention;
    uint32_t heads, kv_heads, head_dim;
    bool qk_norm;
    double rope_theta;
} geometry_case;

/* The values of the issue (copied from the models' config.json files, CALIBRATION.md). */
/* clang-format off */
static const geometry_case geometry_cases[] = {
    {.name = "mixtral-8x7b", .family = "mixtral", .layers = 32, .moe_layers = 32, .first_moe = 0,
     .hidden = 4096, .vocab = 32000, .experts = 8, .top_k = 2, .expert_inter = 14336,
     .gate_norm = GATE_SOFTMAX_TOPK, .attention = ATTENTION_GQA, .heads = 32, .kv_heads = 8,
     .head_dim = 128, .rope_theta = 1e6},
    {.name = "qwen3-30b-a3b", .family = "qwen3_moe", .layers = 48, .moe_layers = 48,
     .hidden = 2048, .vocab = 151936, .experts = 128, .top_k = 8, .expert_inter = 768,
     .gate_norm = GATE_SOFTMAX_TOPK, .attention = ATTENTION_GQA, .heads = 32, .kv_heads = 4,
     .head_dim = 128, .qk_norm = true, .rope_theta = 1e6},
    {.name = "qwen3-next-80b-a3b", .family = "qwen3_next", .layers = 48, .moe_layers = 48,
     .hidden = 2048, .vocab = 151936, .experts = 512, .top_k = 10, .expert_inter = 512,
     .shared = 1, .shared_inter = 512, .shared_gate = true, .gate_norm = GATE_SOFTMAX_TOPK,
     .attention = ATTENTION_HYBRID_LINEAR, .heads = 16, .kv_heads = 2, .head_dim = 256,
     .qk_norm = true, .rope_theta = 1e7},
    {.name = "olmoe-1b-7b", .family = "olmoe", .layers = 16, .moe_layers = 16, .hidden = 2048,
     .vocab = 50304, .experts = 64, .top_k = 8, .expert_inter = 1024,
     .gate_norm = GATE_SOFTMAX_ALL, .attention = ATTENTION_GQA, .heads = 16, .kv_heads = 16,
     .head_dim = 128, .qk_norm = true, .rope_theta = 1e4},
    {.name = "qwen1.5-moe-a2.7b", .family = "qwen2_moe", .layers = 24, .moe_layers = 24,
     .hidden = 2048, .vocab = 151936, .experts = 60, .top_k = 4, .expert_inter = 1408,
     .shared = 1, .shared_inter = 5632, .shared_gate = true, .gate_norm = GATE_SOFTMAX_ALL,
     .attention = ATTENTION_GQA, .heads = 16, .kv_heads = 16, .head_dim = 128, .rope_theta = 1e6},
    {.name = "deepseek-v2-lite", .family = "deepseek_v2", .layers = 27, .moe_layers = 26,
     .first_moe = 1, .hidden = 2048, .dense_inter = 10944, .vocab = 102400, .experts = 64,
     .top_k = 6, .expert_inter = 1408, .shared = 2, .shared_inter = 1408,
     .gate_norm = GATE_SOFTMAX_ALL, .attention = ATTENTION_MLA, .heads = 16, .kv_heads = 16,
     .head_dim = 192, .rope_theta = 1e4},
    {.name = "phi-3.5-moe", .family = "phimoe", .layers = 32, .moe_layers = 32, .hidden = 4096,
     .vocab = 32064, .experts = 16, .top_k = 2, .expert_inter = 6400,
     .gate_norm = GATE_SOFTMAX_TOPK, .attention = ATTENTION_GQA, .heads = 32, .kv_heads = 8,
     .head_dim = 128, .rope_theta = 1e4},
};
/* clang-format on */

Test(model_config, every_shipped_model_loads_with_the_geometry_of_its_config_json) {
    cr_assert_eq(MOESIM_ARRAY_LEN(geometry_cases), N_MODELS);
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(geometry_cases); i++) {
        const geometry_case *c = &geometry_cases[i];
        model_geometry m = load_named(c->name);
        cr_assert_str_eq(m.name, c->name);
        cr_assert_str_eq(m.family, c->family, "%s", c->name);
        cr_assert_eq(m.n_layers, c->layers, "%s", c->name);
        cr_assert_eq(m.n_moe_layers, c->moe_layers, "%s", c->name);
        for (uint32_t l = 0; l < m.n_layers; l++)
            cr_assert_eq(m.is_moe_layer[l], l >= c->first_moe, "%s layer %u", c->name, l);
        cr_assert_eq(m.hidden, c->hidden, "%s", c->name);
        cr_assert_eq(m.dense_inter, c->dense_inter, "%s", c->name);
        cr_assert_eq(m.vocab, c->vocab, "%s", c->name);
        cr_assert_not(m.tie_embeddings, "%s", c->name);
        cr_assert_eq(m.n_experts, c->experts, "%s", c->name);
        cr_assert_eq(m.top_k, c->top_k, "%s", c->name);
        cr_assert_eq(m.expert_inter, c->expert_inter, "%s", c->name);
        cr_assert_eq(m.n_shared_experts, c->shared, "%s", c->name);
        cr_assert_eq(m.shared_inter, c->shared_inter, "%s", c->name);
        cr_assert_eq(m.shared_expert_gate, c->shared_gate, "%s", c->name);
        cr_assert_eq(m.gate_norm, c->gate_norm, "%s", c->name);
        cr_assert_eq(m.attention, c->attention, "%s", c->name);
        cr_assert_eq(m.n_heads, c->heads, "%s", c->name);
        cr_assert_eq(m.n_kv_heads, c->kv_heads, "%s", c->name);
        cr_assert_eq(m.head_dim, c->head_dim, "%s", c->name);
        cr_assert_eq(m.qk_norm, c->qk_norm, "%s", c->name);
        cr_assert_float_eq(m.rope_theta, c->rope_theta, 1e-9 * c->rope_theta, "%s", c->name);
    }
}

Test(model_config, mla_and_hybrid_models_carry_their_attention_keys) {
    model_geometry ds = load_named("deepseek-v2-lite");
    cr_assert_eq(ds.q_lora_rank, 0);
    cr_assert_eq(ds.kv_lora_rank, 512);
    cr_assert_eq(ds.qk_nope_head_dim, 128);
    cr_assert_eq(ds.qk_rope_head_dim, 64);
    cr_assert_eq(ds.v_head_dim, 128);
    cr_assert_eq(ds.full_attention_interval, 0);

    model_geometry qn = load_named("qwen3-next-80b-a3b");
    cr_assert_eq(qn.full_attention_interval, 4);
    cr_assert_eq(qn.linear_key_heads, 16);
    cr_assert_eq(qn.linear_value_heads, 32);
    cr_assert_eq(qn.linear_key_head_dim, 128);
    cr_assert_eq(qn.linear_value_head_dim, 128);
    cr_assert_eq(qn.linear_conv_kernel, 4);
    cr_assert_eq(qn.kv_lora_rank, 0);

    model_geometry mx = load_named("mixtral-8x7b");
    cr_assert_eq(mx.kv_lora_rank + mx.full_attention_interval + mx.linear_key_heads, 0);
}

/* Every nonzero number in a model file cites the config.json key it comes from. */
Test(model_config, every_nonzero_number_in_a_model_file_cites_config_json) {
    for (size_t i = 0; i < N_MODELS; i++) {
        char *text = config_text("models", model_names[i]);
        int line_no = 0;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            line_no++;
            if (line[0] == ';' || line[0] == '[' || !strchr(line, '=')) continue;
            const char *v = strchr(line, '=') + 1;
            while (*v == ' ') v++;
            if (*v < '1' || *v > '9') continue; /* strings, booleans, zeros */
            cr_assert(strstr(line, "; config.json:"), "%s:%d: '%s' cites no config.json key",
                      model_names[i], line_no, line);
        }
        free(text);
    }
}

/* ---- parameter counts against published figures ----------------------------------------- */

Test(model_config, expert_parameters_match_the_published_per_expert_counts) {
    /* CALIBRATION.md: 3 * hidden * inter, published rounded: half the last digit shown is the
     * tolerance (an exact count, so only the rounding can differ) */
    static const struct {
        const char *name;
        double params_m, half_last_digit_m;
    } cases[] = {
        {"mixtral-8x7b", 176.2, 0.05},
        {"qwen3-30b-a3b", 4.72, 0.005},
        {"olmoe-1b-7b", 6.29, 0.005},
        {"qwen1.5-moe-a2.7b", 8.65, 0.005},
    };
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(cases); i++) {
        model_geometry m = load_named(cases[i].name);
        double got_m = (double)model_expert_params(&m) / 1e6;
        cr_assert_leq(fabs(got_m - cases[i].params_m), cases[i].half_last_digit_m,
                      "%s: %.4f M expert parameters, published %g M", cases[i].name, got_m,
                      cases[i].params_m);
    }
}

Test(model_config, mixtral_routed_experts_are_45_1_b_of_46_7_b_parameters) {
    /* Mixtral-offloading paper: 45.1 B of 46.7 B. 1 %: both figures are rounded to 0.1 B and we
     * leave out nothing bigger than a norm vector. */
    model_geometry m = load_named("mixtral-8x7b");
    double experts_b = (double)m.n_moe_layers * m.n_experts * model_expert_params(&m) / 1e9;
    double total_b = (double)model_total_params(&m) / 1e9;
    cr_assert(fabs(experts_b - 45.1) / 45.1 < 0.01, "routed experts %.3f B", experts_b);
    cr_assert(fabs(total_b - 46.7) / 46.7 < 0.01, "total %.3f B", total_b);
}

Test(model_config, total_parameters_are_within_three_percent_of_the_published_totals) {
    /* Published totals from the model cards. 3 %: the cards round (Qwen3-Next's "80B"), and our
     * count leaves out biases, QK-norm shape details and Qwen3-Next's multi-token-prediction
     * layer; any geometry error (a wrong width, layer count or expert count) moves a total by
     * far more than 3 %. */
    static const struct {
        const char *name;
        double total_b;
    } cases[] = {
        {"qwen3-30b-a3b", 30.5},    {"olmoe-1b-7b", 6.9},  {"qwen1.5-moe-a2.7b", 14.3},
        {"deepseek-v2-lite", 15.7}, {"phi-3.5-moe", 41.9}, {"qwen3-next-80b-a3b", 80.0},
        {"mixtral-8x7b", 46.7},
    };
    cr_assert_eq(MOESIM_ARRAY_LEN(cases), N_MODELS);
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(cases); i++) {
        model_geometry m = load_named(cases[i].name);
        double got_b = (double)model_total_params(&m) / 1e9;
        cr_assert(fabs(got_b - cases[i].total_b) / cases[i].total_b < 0.03,
                  "%s: %.3f B parameters, published %.1f B", cases[i].name, got_b,
                  cases[i].total_b);
    }
}

Test(model_config, non_expert_bytes_are_two_bytes_per_non_expert_parameter) {
    for (size_t i = 0; i < N_MODELS; i++) {
        model_geometry m = load_named(model_names[i]);
        cr_assert_eq(model_non_expert_bytes(&m), 2 * model_non_expert_params(&m));
        cr_assert_eq(model_total_params(&m),
                     model_non_expert_params(&m) +
                         (uint64_t)m.n_moe_layers * m.n_experts * model_expert_params(&m));
    }
}

Test(model_config, mixtral_non_expert_parameters_are_counted_part_by_part) {
    /* embeddings + LM head, 32 x (attention + 2 norms + router), final norm */
    model_geometry m = load_named("mixtral-8x7b");
    uint64_t h = 4096, attn = h * 4096 + 2 * h * 1024 + 4096 * h;
    uint64_t want = 2 * 32000 * h + 32 * (attn + 2 * h + h * 8) + h;
    cr_assert_eq(model_non_expert_params(&m), want);
}

Test(model_config, deepseek_counts_mla_projections_the_dense_layer_and_shared_experts) {
    model_geometry m = load_named("deepseek-v2-lite");
    uint64_t h = 2048;
    uint64_t mla = h * 16 * 192                     /* q_proj (no q lora) */
                   + h * (512 + 64)                 /* kv_a_proj_with_mqa */
                   + 512                            /* kv_a_layernorm */
                   + 512 * 16 * (128 + 128)         /* kv_b_proj */
                   + 16 * 128 * h;                  /* o_proj */
    uint64_t moe_extra = h * 64 + 2 * 3 * h * 1408; /* router, two shared experts */
    uint64_t want = 2 * 102400 * h + h + 27 * (mla + 2 * h) + 3 * h * 10944 + 26 * moe_extra;
    cr_assert_eq(model_non_expert_params(&m), want);
}

/* ---- KV cache and recurrent state --------------------------------------------------------- */

Test(model_config, kv_bytes_per_token_follow_the_attention_kind) {
    static const struct {
        const char *name;
        uint64_t bytes;
    } cases[] = {
        {"mixtral-8x7b", 32ull * 2 * 8 * 128 * 2}, /* layers x (k, v) x kv heads x dim x bf16 */
        {"qwen3-30b-a3b", 48ull * 2 * 4 * 128 * 2},      {"olmoe-1b-7b", 16ull * 2 * 16 * 128 * 2},
        {"deepseek-v2-lite", 27ull * (512 + 64) * 2},    /* latent + rope key per layer */
        {"qwen3-next-80b-a3b", 12ull * 2 * 2 * 256 * 2}, /* 12 of 48 layers hold a KV cache */
    };
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(cases); i++) {
        model_geometry m = load_named(cases[i].name);
        cr_assert_eq(model_kv_bytes_per_token(&m), cases[i].bytes, "%s", cases[i].name);
    }
}

Test(model_config, only_linear_attention_models_have_recurrent_state) {
    model_geometry qn = load_named("qwen3-next-80b-a3b");
    /* 36 gated-DeltaNet layers x (32 value heads x 128 x 128 state + conv state of
     * (2 x 16 x 128 + 32 x 128) channels x 3 previous inputs), bf16 */
    uint64_t want = 36ull * (32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3) * 2;
    cr_assert_eq(model_recurrent_state_bytes(&qn), want);
    for (size_t i = 0; i < N_MODELS; i++) {
        model_geometry m = load_named(model_names[i]);
        if (m.attention != ATTENTION_HYBRID_LINEAR)
            cr_assert_eq(model_recurrent_state_bytes(&m), 0, "%s", model_names[i]);
    }
}

/* ---- quantization table and expert sizes -------------------------------------------------- */

Test(model_config, quant_table_holds_the_documented_formats) {
    quant_table q = load_quant();
    static const quant_format want[PREC_COUNT] = {
        [PREC_BF16] = {16, 0, 0, 0},   [PREC_FP8] = {8, 128, 32, 0},  [PREC_INT8] = {8, 64, 16, 16},
        [PREC_INT4] = {4, 64, 16, 16}, [PREC_INT3] = {3, 64, 16, 16}, [PREC_INT2] = {2, 64, 16, 16},
    };
    for (int p = 0; p < PREC_COUNT; p++) {
        cr_assert_eq(q.fmt[p].weight_bits, want[p].weight_bits, "%s", precision_name(p));
        cr_assert_eq(q.fmt[p].group_size, want[p].group_size, "%s", precision_name(p));
        cr_assert_eq(q.fmt[p].scale_bits, want[p].scale_bits, "%s", precision_name(p));
        cr_assert_eq(q.fmt[p].zero_bits, want[p].zero_bits, "%s", precision_name(p));
    }
}

Test(model_config, precision_names_round_trip) {
    for (int p = 0; p < PREC_COUNT; p++) {
        moesim_precision back;
        cr_assert(precision_from_name(precision_name(p), &back));
        cr_assert_eq(back, p);
    }
    moesim_precision unused;
    cr_assert_not(precision_from_name("int5", &unused));
}

Test(model_config, matrix_bytes_are_packed_rows_plus_per_group_scales_and_zeros) {
    quant_table q = load_quant();
    static const struct {
        moesim_precision p;
        uint64_t rows, cols, bytes;
    } cases[] = {
        {PREC_BF16, 14336, 4096, 14336ull * 4096 * 2},
        /* fp8: 4096 bytes of weights + 32 groups x 4-byte fp32 scale per row */
        {PREC_FP8, 14336, 4096, 14336ull * (4096 + 32 * 4)},
        /* int4: 2048 bytes + 64 groups x (2 + 2) bytes per row = 2304 */
        {PREC_INT4, 14336, 4096, 14336ull * 2304},
        /* int8, down projection of Qwen3-30B: 768 bytes + 12 groups x 4 bytes */
        {PREC_INT8, 2048, 768, 2048ull * (768 + 48)},
        /* int2, 100 columns (not a multiple of 64): 25 bytes + 2 groups (64 + 36) x 4 bytes */
        {PREC_INT2, 3, 100, 3ull * (25 + 8)},
        /* int3, 100 columns: 300 bits -> 38 bytes (padded) + 2 groups x 4 bytes */
        {PREC_INT3, 5, 100, 5ull * (38 + 8)},
        /* int4, 1 column: half a byte rounds up to one, plus one group */
        {PREC_INT4, 7, 1, 7ull * (1 + 4)},
        /* fp8, 129 columns: 129 bytes + 2 groups x 4 bytes */
        {PREC_FP8, 2, 129, 2ull * (129 + 8)},
    };
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(cases); i++)
        cr_assert_eq(quant_matrix_bytes(&q, cases[i].p, cases[i].rows, cases[i].cols),
                     cases[i].bytes, "case %zu (%s %llux%llu)", i, precision_name(cases[i].p),
                     (unsigned long long)cases[i].rows, (unsigned long long)cases[i].cols);
}

Test(model_config, bits_per_weight_include_scales_and_zero_points) {
    quant_table q = load_quant();
    /* int2's 2.5 bits sit next to HQQ 2-bit's ~2.6 (group 16, CALIBRATION.md): the scales and
     * zero points are counted, not the bare 2 bits */
    static const double want[PREC_COUNT] = {16.0, 8.25, 8.5, 4.5, 3.5, 2.5};
    for (int p = 0; p < PREC_COUNT; p++)
        cr_assert_float_eq(quant_bits_per_weight(&q, p, 4096), want[p], 1e-12, "%s",
                           precision_name(p));
}

Test(model_config, expert_bytes_are_the_sum_of_gate_up_and_down_at_each_precision) {
    quant_table q = load_quant();
    model_geometry m = load_named("mixtral-8x7b");
    /* gate and up: 14336 rows of 4096 inputs; down: 4096 rows of 14336 inputs */
    cr_assert_eq(model_expert_part_bytes(&m, &q, PART_GATE, PREC_INT4), 14336ull * (2048 + 256));
    cr_assert_eq(model_expert_part_bytes(&m, &q, PART_UP, PREC_INT4), 14336ull * (2048 + 256));
    cr_assert_eq(model_expert_part_bytes(&m, &q, PART_DOWN, PREC_INT4), 4096ull * (7168 + 224 * 4));
    cr_assert_eq(model_expert_bytes(&m, &q, PREC_BF16), 2 * model_expert_params(&m));
    for (size_t i = 0; i < N_MODELS; i++) {
        model_geometry g = load_named(model_names[i]);
        uint64_t prev = UINT64_MAX;
        for (int p = 0; p < PREC_COUNT; p++) {
            uint64_t sum = 0;
            for (int part = 0; part < PART_COUNT; part++)
                sum += model_expert_part_bytes(&g, &q, part, p);
            uint64_t total = model_expert_bytes(&g, &q, p);
            cr_assert_eq(total, sum, "%s %s", model_names[i], precision_name(p));
            if (p != PREC_INT8) /* fp8 (8.25 bits) is smaller than int8 (8.5 bits) */
                cr_assert_lt(total, prev, "%s: %s not smaller than the previous precision",
                             model_names[i], precision_name(p));
            prev = total;
        }
    }
}

/* ---- bad model files ---------------------------------------------------------------------- */

typedef struct bad_case {
    const char *model;  /* file to start from */
    const char *prefix; /* line to replace (NULL: insert after `after`) */
    const char *after;
    const char *line;    /* replacement ("" deletes) */
    bool names_line;     /* message starts with path:line of the changed line */
    const char *message; /* expected after "path[:line]: " */
} bad_case;

static const bad_case bad_cases[] = {
    {"mixtral-8x7b", NULL, "[layers]", "layer_count = 32", true,
     "[layers] layer_count: unknown key (known: n_layers, moe_layers, hidden, dense_inter, vocab, "
     "tie_embeddings)"},
    {"mixtral-8x7b", "vocab =", NULL, "", false, "[layers] vocab: missing required key"},
    {"mixtral-8x7b", "hidden =", NULL, "hidden = 4k", true,
     "[layers] hidden: expected a non-negative integer, got '4k'"},
    {"mixtral-8x7b", "n_layers =", NULL, "n_layers = 0", true,
     "[layers] n_layers: expected an integer in [1, 256], got '0'"},
    {"mixtral-8x7b", "tie_embeddings =", NULL, "tie_embeddings = maybe", true,
     "[layers] tie_embeddings: expected true or false, got 'maybe'"},
    {"mixtral-8x7b", "gate_norm =", NULL, "gate_norm = softmax", true,
     "[experts] gate_norm: expected one of topk, all, got 'softmax'"},
    {"mixtral-8x7b", "kind =", NULL, "kind = mha", true,
     "[attention] kind: expected one of gqa, mla, hybrid_linear, got 'mha'"},
    {"mixtral-8x7b", "top_k =", NULL, "top_k = 9", true,
     "[experts] top_k: expected at most n_experts (8), got 9"},
    {"mixtral-8x7b", "kv_heads =", NULL, "kv_heads = 6", true,
     "[attention] kv_heads: expected a divisor of heads (32), got 6"},
    {"mixtral-8x7b", "moe_layers =", NULL, "moe_layers = 0-32", true,
     "[layers] moe_layers: range 0-32 is not inside layers 0-31 (n_layers = 32)"},
    /* echoed as typed: a value too large for an integer is not shown wrapped or saturated */
    {"mixtral-8x7b", "moe_layers =", NULL, "moe_layers = 0-99999999999999999999999", true,
     "[layers] moe_layers: range 0-99999999999999999999999 is not inside layers 0-31 (n_layers = "
     "32)"},
    {"mixtral-8x7b", "moe_layers =", NULL, "moe_layers = 3--5", true,
     "[layers] moe_layers: expected 'all' or layer ranges like '1-26' or '0-3,8', got '3--5'"},
    {"mixtral-8x7b", "moe_layers =", NULL, "moe_layers = 0-3,2", true,
     "[layers] moe_layers: layer 2 listed twice"},
    {"mixtral-8x7b", "moe_layers =", NULL, "moe_layers = most", true,
     "[layers] moe_layers: expected 'all' or layer ranges like '1-26' or '0-3,8', got 'most'"},
    {"mixtral-8x7b", "dense_inter =", NULL, "dense_inter = 14336", true,
     "[layers] dense_inter: expected > 0 exactly when some layer is dense (32 of 32 layers are "
     "MoE), got 14336"},
    {"mixtral-8x7b", "shared_inter =", NULL, "shared_inter = 512", true,
     "[experts] shared_inter: expected > 0 exactly when n_shared > 0 (n_shared = 0, got 512)"},
    {"mixtral-8x7b", "shared_gate =", NULL, "shared_gate = true", true,
     "[experts] shared_gate: a shared-expert gate needs n_shared > 0"},
    {"mixtral-8x7b", NULL, "rope_theta =", "kv_lora_rank = 512", true,
     "[attention] kv_lora_rank: only allowed with kind = mla (the file's kind differs)"},
    {"qwen1.5-moe-a2.7b", "shared_inter =", NULL, "shared_inter = 0", true,
     "[experts] shared_inter: expected > 0 exactly when n_shared > 0 (n_shared = 1, got 0)"},
    {"deepseek-v2-lite", "kv_lora_rank =", NULL, "", false,
     "[attention] kv_lora_rank: missing required key (kind = mla)"},
    {"deepseek-v2-lite", "head_dim =", NULL, "head_dim = 128", true,
     "[attention] head_dim: expected qk_nope_head_dim + qk_rope_head_dim = 192 for mla, got 128"},
    {"deepseek-v2-lite", "dense_inter =", NULL, "dense_inter = 0", true,
     "[layers] dense_inter: expected > 0 exactly when some layer is dense (26 of 27 layers are "
     "MoE), got 0"},
    {"qwen3-next-80b-a3b", "linear_conv_kernel =", NULL, "", false,
     "[attention] linear_conv_kernel: missing required key (kind = hybrid_linear)"},
    {"qwen3-next-80b-a3b", "linear_value_heads =", NULL, "linear_value_heads = 24", true,
     "[attention] linear_value_heads: expected a multiple of linear_key_heads (16), got 24"},
    {"qwen3-next-80b-a3b", "full_attention_interval =", NULL, "full_attention_interval = 49", true,
     "[attention] full_attention_interval: expected at most n_layers (48), got 49"},
    {"mixtral-8x7b", NULL, "rope_theta =", "[attnetion]\nheads = 32", true,
     "[attnetion] heads: unknown section or key"},
    {"mixtral-8x7b", "name =", NULL, "name = ../mixtral", true,
     "[model] name: character 3 cannot be in a config name (expected printable ASCII without "
     "spaces or '/')"},
};

Test(model_config, bad_model_files_fail_naming_file_line_and_key) {
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(bad_cases); i++) {
        const bad_case *c = &bad_cases[i];
        char *orig = config_text("models", c->model);
        int line_no;
        char *text = mutate(orig, c->prefix, c->after, c->line, &line_no);
        if (!c->prefix && strchr(c->line, '\n')) line_no++; /* a new section, then its key */
        char name[32];
        snprintf(name, sizeof name, "bad%zu.ini", i);
        const char *path = test_tmp_path(name);
        char path_copy[4096];
        snprintf(path_copy, sizeof path_copy, "%s", path);
        model_geometry m;
        moesim_error err = {0};
        cr_assert_eq(load_model_text(text, &m, &err, name), MOESIM_EINPUT, "case %zu loaded", i);
        char want[1024];
        if (c->names_line)
            snprintf(want, sizeof want, "%s:%d: %s", path_copy, line_no, c->message);
        else
            snprintf(want, sizeof want, "%s: %s", path_copy, c->message);
        cr_assert_str_eq(err.msg, want, "case %zu:\n got  %s\n want %s", i, err.msg, want);
        cr_assert_null(strchr(err.msg, '\n'));
        free(text);
        free(orig);
    }
}

Test(model_config, a_missing_file_is_an_io_error_naming_it) {
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load("/nonexistent/x.ini", &m, &err), MOESIM_EIO);
    cr_assert(strstr(err.msg, "/nonexistent/x.ini"), "%s", err.msg);
}

Test(model_config, an_unknown_model_name_lists_the_known_ones) {
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("mixtral-8x22b", &m, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "unknown model name 'mixtral-8x22b'"), "%s", err.msg);
    cr_assert(strstr(err.msg, "deepseek-v2-lite"), "%s", err.msg);
}

/* ---- --set overrides ---------------------------------------------------------------------- */

static moesim_status load_with_sets(const char *name, const char *const *sets, size_t n,
                                    model_geometry *m, moesim_error *err) {
    char path[4096];
    cr_assert_eq(moesim_config_path("models", name, path, sizeof path, err), MOESIM_OK);
    return model_load_with_sets(path, sets, n, m, err);
}

Test(model_config, set_overrides_any_loaded_value) {
    const char *sets[] = {"experts.top_k=4", "layers.moe_layers=1-31", "layers.dense_inter=14336",
                          "model.name=mixtral-dense0"};
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(load_with_sets("mixtral-8x7b", sets, 4, &m, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(m.top_k, 4);
    cr_assert_eq(m.n_moe_layers, 31);
    cr_assert_not(m.is_moe_layer[0]);
    cr_assert_eq(m.dense_inter, 14336);
    cr_assert_str_eq(m.name, "mixtral-dense0");
}

Test(model_config, a_bad_set_is_reported_as_coming_from_set) {
    static const struct {
        const char *set, *message;
    } cases[] = {
        {"experts.top_k=9", "--set: [experts] top_k: expected at most n_experts (8), got 9"},
        {"experts.top_k=two", "--set: [experts] top_k: expected a non-negative integer, got 'two'"},
        {"experts.topk=2", "--set: [experts] topk: unknown key (known: n_experts, top_k, "
                           "expert_inter, gate_norm, n_shared, shared_inter, shared_gate)"},
        {"expert.top_k=2", "--set: [expert] top_k: unknown section or key"},
    };
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(cases); i++) {
        model_geometry m;
        moesim_error err = {0};
        cr_assert_eq(load_with_sets("mixtral-8x7b", &cases[i].set, 1, &m, &err), MOESIM_EINPUT);
        cr_assert_str_eq(err.msg, cases[i].message);
    }
}

Test(model_config, read_config_shares_a_config_with_other_sections) {
    /* a run loads model and hardware files into one config; model_read_config leaves the other
     * sections alone and config_check_unused still catches them if nobody claims them */
    char path[4096];
    moesim_error err = {0};
    cr_assert_eq(moesim_config_path("models", "olmoe-1b-7b", path, sizeof path, &err), MOESIM_OK);
    config *c = config_create();
    cr_assert_eq(config_load_file(c, path, &err), MOESIM_OK, "%s", err.msg);
    config_put(c, "policy", "name", "lru", "test");
    model_geometry m;
    cr_assert_eq(model_read_config(c, &m, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(m.n_experts, 64);
    cr_assert_eq(config_check_unused(c, &err), MOESIM_EINPUT);
    cr_assert_str_eq(err.msg, "test: [policy] name: unknown section or key");
    config_destroy(c);
}

/* ---- bad quantization tables ------------------------------------------------------------- */

Test(model_config, bad_quant_tables_fail_naming_file_line_and_key) {
    char path[4096];
    snprintf(path, sizeof path, "%s/quant.ini", MOESIM_SOURCE_DIR "/configs");
    char *orig = read_text(path);
    /* table of (section, key line prefix within the section, replacement, message) */
    static const struct {
        const char *section, *key, *line, *message;
        bool names_line;
    } edits[] = {
        {"[int4]", "weight_bits", "weight_bits = 5",
         "[int4] weight_bits: expected an integer in [4, 4], got '5'", true},
        {"[int2]", "scale_bits", "scale_bits = 12",
         "[int2] scale_bits: expected a multiple of 8 (scales are stored as whole bytes), got 12",
         true},
        {"[int8]", "zero_bits", "zero_bits = 4",
         "[int8] zero_bits: expected a multiple of 8 (zero points are stored as whole bytes), got "
         "4",
         true},
        {"[bf16]", "zero_bits", "zero_bits = 16",
         "[bf16] zero_bits: a zero point needs a scale (scale_bits is 0)", true},
        {"[bf16]", "group_size", "group_size = 64",
         "[bf16] group_size: groups need a scale (scale_bits is 0); use group_size = 0 for an "
         "unscaled format",
         true},
        {"[int3]", "scale_bits", "scale_bits = 0",
         "[int3] scale_bits: a 3-bit integer format needs a scale, got 0", true},
        {"[fp8]", "group_size", "group_size = big",
         "[fp8] group_size: expected a non-negative integer, got 'big'", true},
        {"[fp8]", "group_size", "", "[fp8] group_size: missing required key", false},
        {"[int2]", "zero_bits", "zero_points = 16",
         "[int2] zero_points: unknown key (known: weight_bits, group_size, scale_bits, zero_bits)",
         true},
    };
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(edits); i++) {
        /* find the key line inside the section */
        const char *sec = strstr(orig, edits[i].section);
        cr_assert(sec);
        const char *key = strstr(sec, edits[i].key);
        cr_assert(key);
        int line_no = 1;
        for (const char *p = orig; p < key; p++) line_no += *p == '\n';
        const char *eol = strchr(key, '\n');
        char *text = malloc(strlen(orig) + strlen(edits[i].line) + 2);
        size_t head = (size_t)(key - orig);
        memcpy(text, orig, head);
        sprintf(text + head, "%s%s%s", edits[i].line, *edits[i].line ? "\n" : "", eol + 1);
        char name[32];
        snprintf(name, sizeof name, "quant%zu.ini", i);
        char qpath[4096];
        snprintf(qpath, sizeof qpath, "%s", test_tmp_path(name));
        test_write_file(qpath, text);
        quant_table q;
        moesim_error err = {0};
        cr_assert_eq(quant_table_load(qpath, &q, &err), MOESIM_EINPUT, "edit %zu loaded", i);
        char want[1024];
        if (edits[i].names_line)
            snprintf(want, sizeof want, "%s:%d: %s", qpath, line_no, edits[i].message);
        else
            snprintf(want, sizeof want, "%s: %s", qpath, edits[i].message);
        cr_assert_str_eq(err.msg, want, "edit %zu:\n got  %s\n want %s", i, err.msg, want);
        free(text);
    }
    free(orig);
}

Test(model_config, a_quant_table_without_a_precision_fails_naming_its_section) {
    const char *path = test_tmp_path("quant-missing.ini");
    test_write_file(path, "[bf16]\nweight_bits = 16\ngroup_size = 0\nscale_bits = 0\n"
                          "zero_bits = 0\n");
    quant_table q;
    moesim_error err = {0};
    cr_assert_eq(quant_table_load(path, &q, &err), MOESIM_EINPUT);
    char want[1024];
    snprintf(want, sizeof want, "%s: [fp8] weight_bits: missing required key", path);
    cr_assert_str_eq(err.msg, want);
}

Test(model_config, set_overrides_a_quant_format) {
    char path[4096];
    snprintf(path, sizeof path, "%s/quant.ini", MOESIM_SOURCE_DIR "/configs");
    const char *sets[] = {"int4.group_size=128"};
    quant_table q;
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_with_sets(path, sets, 1, &q, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(q.fmt[PREC_INT4].group_size, 128);
    cr_assert_float_eq(quant_bits_per_weight(&q, PREC_INT4, 4096), 4.25, 1e-12);
}

Test(model_config, group_size_zero_means_one_scale_per_row) {
    char path[4096];
    snprintf(path, sizeof path, "%s/quant.ini", MOESIM_SOURCE_DIR "/configs");
    const char *sets[] = {"int8.group_size=0", "int8.zero_bits=0"};
    quant_table q;
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_with_sets(path, sets, 2, &q, &err), MOESIM_OK, "%s", err.msg);
    /* per row: 1000 one-byte weights and one 2-byte fp16 scale */
    cr_assert_eq(quant_matrix_bytes(&q, PREC_INT8, 10, 1000), 10 * (1000 + 2));
}
