/* A random checkpoint of OLMoE-1B-7B geometry (hidden 2048, 64 experts of width 1024, top-8,
 * vocab 50304; the layer count is the caller's) written as a real Hugging Face folder
 * (config.json + model.safetensors, bf16, ~0.9 GB per layer), for the benchmarks that load it
 * through engine_load (bench_engine, bench_gpu_engine). Weights are uniform in +-0.02 from a fixed
 * xorshift stream, so every run writes the same bytes. Header-only: each benchmark is one file. */
#ifndef MOESIM_BENCH_SUPPORT_RANDOM_CHECKPOINT_H
#define MOESIM_BENCH_SUPPORT_RANDOM_CHECKPOINT_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "kernels/quant.h"

/* OLMoE-1B-7B (configs/models/olmoe-1b-7b.ini), all but the layer count */
enum { HIDDEN = 2048, INTER = 1024, EXPERTS = 64, TOP_K = 8, HEADS = 16, VOCAB = 50304 };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float uniform_pm(float scale) { /* xorshift64*: fixed weights, fast to make */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545f4914f6cdd1dull;
    return scale * ((float)(r >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
}

typedef struct tensor_spec {
    char name[96];
    uint64_t rows, cols; /* cols 0: a vector of `rows` */
    float fill;          /* 0: random in +-0.02; else this constant (norm weights) */
} tensor_spec;

static size_t model_tensors(uint32_t layers, tensor_spec *t) {
    size_t n = 0;
#define ADD(r, c, f, ...)                                                                          \
    do {                                                                                           \
        snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);                                        \
        t[n].rows = (r), t[n].cols = (c), t[n].fill = (f);                                         \
        n++;                                                                                       \
    } while (0)
    ADD(VOCAB, HIDDEN, 0, "model.embed_tokens.weight");
    for (uint32_t l = 0; l < layers; l++) {
        ADD(HIDDEN, 0, 1, "model.layers.%u.input_layernorm.weight", l);
        ADD(HIDDEN, 0, 1, "model.layers.%u.post_attention_layernorm.weight", l);
        ADD(HIDDEN, HIDDEN, 0, "model.layers.%u.self_attn.q_proj.weight", l);
        ADD(HIDDEN, HIDDEN, 0, "model.layers.%u.self_attn.k_proj.weight", l);
        ADD(HIDDEN, HIDDEN, 0, "model.layers.%u.self_attn.v_proj.weight", l);
        ADD(HIDDEN, HIDDEN, 0, "model.layers.%u.self_attn.o_proj.weight", l);
        ADD(HIDDEN, 0, 1, "model.layers.%u.self_attn.q_norm.weight", l);
        ADD(HIDDEN, 0, 1, "model.layers.%u.self_attn.k_norm.weight", l);
        ADD(EXPERTS, HIDDEN, 0, "model.layers.%u.mlp.gate.weight", l);
        for (uint32_t e = 0; e < EXPERTS; e++) {
            ADD(INTER, HIDDEN, 0, "model.layers.%u.mlp.experts.%u.gate_proj.weight", l, e);
            ADD(INTER, HIDDEN, 0, "model.layers.%u.mlp.experts.%u.up_proj.weight", l, e);
            ADD(HIDDEN, INTER, 0, "model.layers.%u.mlp.experts.%u.down_proj.weight", l, e);
        }
    }
    ADD(HIDDEN, 0, 1, "model.norm.weight");
    ADD(VOCAB, HIDDEN, 0, "lm_head.weight");
#undef ADD
    return n;
}

static void write_or_die(FILE *f, const void *p, size_t n, const char *path) {
    if (fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "random checkpoint: writing %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

/* config.json + model.safetensors of the random model in `dir`. */
static void write_checkpoint(const char *dir, uint32_t layers) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "random checkpoint: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fprintf(
        f,
        "{\"model_type\": \"olmoe\", \"hidden_size\": %d, \"intermediate_size\": %d,\n"
        " \"num_hidden_layers\": %u, \"num_attention_heads\": %d, \"num_key_value_heads\": %d,\n"
        " \"num_experts\": %d, \"num_experts_per_tok\": %d, \"norm_topk_prob\": false,\n"
        " \"vocab_size\": %d, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,\n"
        " \"tie_word_embeddings\": false, \"max_position_embeddings\": 4096}\n",
        HIDDEN, INTER, layers, HEADS, HEADS, EXPERTS, TOP_K, VOCAB);
    fclose(f);

    tensor_spec *t = moesim_xcalloc(16 + (size_t)layers * (9 + 3 * EXPERTS), sizeof *t);
    size_t n = model_tensors(layers, t);
    size_t cap = n * 160 + 64, used = 0;
    char *header = moesim_xmalloc(cap);
    uint64_t offset = 0;
    used += (size_t)snprintf(header + used, cap - used, "{");
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = 2 * t[i].rows * (t[i].cols ? t[i].cols : 1);
        used += t[i].cols
                    ? (size_t)snprintf(header + used, cap - used,
                                       "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%llu,%llu],"
                                       "\"data_offsets\":[%llu,%llu]}",
                                       i ? "," : "", t[i].name, (unsigned long long)t[i].rows,
                                       (unsigned long long)t[i].cols, (unsigned long long)offset,
                                       (unsigned long long)(offset + bytes))
                    : (size_t)snprintf(header + used, cap - used,
                                       "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%llu],"
                                       "\"data_offsets\":[%llu,%llu]}",
                                       i ? "," : "", t[i].name, (unsigned long long)t[i].rows,
                                       (unsigned long long)offset,
                                       (unsigned long long)(offset + bytes));
        offset += bytes;
    }
    used += (size_t)snprintf(header + used, cap - used, "}");
    while (used % 8) header[used++] = ' '; /* data region 8-byte aligned */

    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "random checkpoint: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    uint8_t len_le[8];
    for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)((uint64_t)used >> (8 * i));
    write_or_die(f, len_le, 8, path);
    write_or_die(f, header, used, path);
    uint16_t *row = moesim_xmalloc((size_t)VOCAB * 2);
    for (size_t i = 0; i < n; i++) {
        uint64_t cols = t[i].cols ? t[i].cols : t[i].rows, rows = t[i].cols ? t[i].rows : 1;
        for (uint64_t r = 0; r < rows; r++) {
            for (uint64_t c = 0; c < cols; c++)
                row[c] = quant_f32_to_bf16(t[i].fill != 0 ? t[i].fill : uniform_pm(0.02f));
            write_or_die(f, row, cols * 2, path);
        }
    }
    fclose(f);
    free(row);
    free(header);
    free(t);
}

#endif
