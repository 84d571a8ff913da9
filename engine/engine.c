/* Checkpoint loading and the shared forward pass of every architecture (see engine.h).
 *
 * Loading: config.json is read and checked (common keys here, architecture keys in arch_*.c),
 * then every tensor the architecture needs is looked up in the safetensors file(s) and checked
 * for shape and dtype; bf16 matrices stay in the read-only mapping, fp16/fp32 ones and all
 * vectors are converted to fp32 copies the engine owns; routed experts are quantized to each
 * requested integer format at load time (quant.h layout, round-to-nearest reference quantizer).
 *
 * Forward pass: one token of one sequence at a time (prefill feeds the prompt token by token; the
 * KV cache makes that equal to a causal pass over the whole prompt). One forward at a time per
 * engine: scratch buffers and the thread pool are the engine's. */
#include "engine/engine.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/hash.h"
#include "engine/engine_internal.h"
#include "kernels/quant.h"
#ifdef MOESIM_HAVE_CUDA
#include "kernels/cuda/engine_cuda.h"
#endif

#define MAX_SHARDS 256
#define MAX_HIDDEN (1u << 16)
#define MAX_VOCAB (1u << 22)
#define MAX_INTER (1u << 18)
#define MAX_CONFIG_BYTES (1u << 22)

static const engine_arch *const archs[] = {&engine_arch_qwen3_moe, &engine_arch_qwen2_moe,
                                           &engine_arch_olmoe, &engine_arch_mixtral};

const char *engine_supported_types(void) { return "qwen3_moe, qwen2_moe, olmoe, mixtral"; }

typedef struct expert_w {
    engine_mat m[PREC_COUNT][PART_COUNT]; /* filled for bf16 and each held integer format */
} expert_w;

typedef struct layer_w {
    float *attn_norm, *ffn_norm;          /* [hidden] */
    float *q_bias, *k_bias, *v_bias;      /* [q_dim], [kv_dim], [kv_dim] or NULL */
    float *o_bias;                        /* [hidden] or NULL */
    float *q_norm, *k_norm;               /* [head_dim] (per head) or [q_dim]/[kv_dim] (full) */
    engine_mat wq, wk, wv, wo;            /* [q_dim][hidden] ... [hidden][q_dim] */
    engine_mat router;                    /* [n_experts][hidden] (MoE layers) */
    expert_w *experts;                    /* [n_experts] (MoE layers) */
    engine_mat shared[PART_COUNT];        /* shared expert, when shared_inter > 0 */
    float *shared_gate;                   /* [hidden] or NULL */
    engine_mat dense[PART_COUNT];         /* dense MLP (non-MoE layers) */
} layer_w;

struct engine {
    engine_config cfg;
    const engine_arch *arch;
    const engine_backend *be;
    thread_pool *pool;
    uint32_t precision_mask;
    st_file *shards[MAX_SHARDS];
    char shard_names[MAX_SHARDS][256]; /* file names of index shards */
    uint32_t n_shards;
    json_t *weight_map; /* index.json's weight_map, or NULL for a single file */
    void **owned;       /* buffers to free */
    size_t n_owned, cap_owned;
    engine_mat embed, lm_head;
    float *final_norm;
    layer_w *layers; /* [n_layers] */
    /* scratch for one forward */
    float *x, *h, *tmp, *y, *eo, *q, *k, *v, *att; /* [hidden] x5, [q_dim], [kv_dim] x2, [q_dim] */
    float *ff_gate, *ff_up;                         /* [max inter] */
    float *router_logits, *router_probs;            /* [n_experts] */
    uint32_t *la_ids;                               /* [n_experts] */
    float *la_vals;                                 /* [n_experts] */
#ifdef MOESIM_HAVE_CUDA
    engine_cuda *cuda; /* the CUDA forward pass (backend "cuda"), NULL on the CPU backend */
#endif
};

struct engine_seq {
    uint32_t max_ctx, len;
    uint32_t n_layers, kv_dim, n_moe, n_heads;
    float *k, *v;        /* [n_layers][max_ctx][kv_dim] */
    float *importance;   /* [n_moe][max_ctx] */
    float *probs;        /* [n_heads][max_ctx] scratch */
#ifdef MOESIM_HAVE_CUDA
    engine_cuda_seq *cuda; /* device KV cache (backend "cuda") */
#endif
};

static void *own(engine *e, void *p) {
    if (e->n_owned == e->cap_owned) {
        e->cap_owned = e->cap_owned ? 2 * e->cap_owned : 256;
        e->owned = moesim_xrealloc(e->owned, e->cap_owned * sizeof *e->owned);
    }
    e->owned[e->n_owned++] = p;
    return p;
}

/* ---- config.json ---- */

static moesim_status read_small_file(const char *path, char **out, size_t *len,
                                     moesim_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = moesim_xmalloc(MAX_CONFIG_BYTES + 1);
    size_t n = fread(buf, 1, MAX_CONFIG_BYTES + 1, fp);
    int bad = ferror(fp);
    fclose(fp);
    if (bad || n > MAX_CONFIG_BYTES) {
        free(buf);
        return moesim_fail(err, MOESIM_EINPUT, "%s: unreadable or larger than %u bytes", path,
                           MAX_CONFIG_BYTES);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return MOESIM_OK;
}

static moesim_status check_range(const char *what, const char *key, uint64_t v, uint64_t lo,
                                 uint64_t hi, moesim_error *err) {
    if (v < lo || v > hi)
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s: %llu outside [%llu, %llu]", what, key,
                           (unsigned long long)v, (unsigned long long)lo, (unsigned long long)hi);
    return MOESIM_OK;
}

static moesim_status parse_config(engine *e, const char *path, moesim_error *err) {
    char *text;
    size_t len;
    moesim_status st = read_small_file(path, &text, &len, err);
    if (st) return st;
    engine_config *c = &e->cfg;
    c->config_hash = hash_fnv1a64(text, len, MOESIM_FNV1A64_INIT);
    json_error_t jerr;
    json_t *cfg = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!cfg)
        return moesim_fail(err, MOESIM_EINPUT, "%s:%d: invalid JSON: %s", path, jerr.line,
                           jerr.text);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return moesim_fail(err, MOESIM_EINPUT, "%s: expected a JSON object", path);
    }
    const json_t *mt = json_object_get(cfg, "model_type");
    if (!json_is_string(mt)) {
        json_decref(cfg);
        return moesim_fail(err, MOESIM_EINPUT, "%s: model_type: missing (supported: %s)", path,
                           engine_supported_types());
    }
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(archs); i++)
        if (!strcmp(archs[i]->model_type, json_string_value(mt))) e->arch = archs[i];
    if (!e->arch) {
        st = moesim_fail(err, MOESIM_EINPUT, "%s: model_type '%.40s' is not supported (supported: %s)",
                         path, json_string_value(mt), engine_supported_types());
        json_decref(cfg);
        return st;
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", e->arch->model_type);

    double eps, theta = 0;
    uint32_t head_dim;
    if ((st = cfg_u32(cfg, "hidden_size", true, 0, &c->hidden, path, err)) ||
        (st = cfg_u32(cfg, "num_hidden_layers", true, 0, &c->n_layers, path, err)) ||
        (st = cfg_u32(cfg, "vocab_size", true, 0, &c->vocab, path, err)) ||
        (st = cfg_u32(cfg, "num_attention_heads", true, 0, &c->n_heads, path, err)) ||
        /* (n_heads is read by then: || evaluates in order) */
        (st = cfg_u32(cfg, "num_key_value_heads", false,
                      e->arch->default_kv_heads ? e->arch->default_kv_heads : c->n_heads,
                      &c->n_kv_heads, path, err)) ||
        (st = cfg_u32(cfg, "head_dim", false, 0, &head_dim, path, err)) ||
        (st = cfg_u32(cfg, "intermediate_size", false, 0, &c->dense_inter, path, err)) ||
        (st = cfg_f64(cfg, "rms_norm_eps", false, e->arch->default_rms_eps, &eps, path, err)) ||
        (st = cfg_bool(cfg, "tie_word_embeddings", false, &c->tie_embeddings, path, err)))
        goto done;
    c->rms_eps = (float)eps;
    if ((st = cfg_check_refusals(cfg, c->model_type, path, err))) goto done;
    /* RoPE theta as transformers' convert_rope_params_to_dict takes it: the RoPE dict's
     * (rope_scaling when set, else rope_parameters), else the top-level rope_theta, else the class
     * default */
    const json_t *rope = cfg_rope_dict(cfg);
    if (rope && json_object_get(rope, "rope_theta") &&
        !json_is_null(json_object_get(rope, "rope_theta")))
        st = cfg_f64(rope, "rope_theta", true, 0, &theta, path, err);
    else
        st = cfg_f64(cfg, "rope_theta", false, e->arch->default_rope_theta, &theta, path, err);
    if (st) goto done;
    c->rope_theta = theta;
    if ((st = check_range(path, "num_hidden_layers", c->n_layers, 1, MODEL_MAX_LAYERS, err)) ||
        (st = check_range(path, "hidden_size", c->hidden, 1, MAX_HIDDEN, err)) ||
        (st = check_range(path, "vocab_size", c->vocab, 1, MAX_VOCAB, err)) ||
        (st = check_range(path, "num_attention_heads", c->n_heads, 1, 1024, err)) ||
        (st = check_range(path, "num_key_value_heads", c->n_kv_heads, 1, c->n_heads, err)))
        goto done;
    if (c->n_heads % c->n_kv_heads) {
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: num_attention_heads %u is not a multiple of num_key_value_heads %u",
                         path, c->n_heads, c->n_kv_heads);
        goto done;
    }
    c->head_dim = head_dim ? head_dim : c->hidden / c->n_heads;
    if ((st = check_range(path, "head_dim", c->head_dim, 2, 1024, err))) goto done;
    if (c->head_dim % 2) {
        st = moesim_fail(err, MOESIM_EINPUT, "%s: head_dim %u: expected an even number", path,
                         c->head_dim);
        goto done;
    }
    if (!(theta > 0 && isfinite(theta)) || !(eps > 0 && eps < 1)) {
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: rope_theta and rms_norm_eps: expected theta > 0 and 0 < eps < 1",
                         path);
        goto done;
    }
    if ((st = e->arch->parse_config(cfg, c, path, err))) goto done;
    if ((st = check_range(path, "number of experts", c->n_experts, 1, MODEL_MAX_EXPERTS, err)) ||
        (st = check_range(path, "num_experts_per_tok", c->top_k, 1,
                          c->n_experts < ENGINE_MAX_TOP_K ? c->n_experts : ENGINE_MAX_TOP_K,
                          err)) ||
        (st = check_range(path, "expert intermediate size", c->expert_inter, 1, MAX_INTER, err)) ||
        (st = check_range(path, "shared_expert_intermediate_size", c->shared_inter, 0, MAX_INTER,
                          err)) ||
        (st = check_range(path, "intermediate_size", c->dense_inter, 0, MAX_INTER, err)))
        goto done;
    c->n_moe_layers = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (c->is_moe[l]) {
            c->moe_index[l] = c->n_moe_layers;
            c->moe_layer[c->n_moe_layers++] = l;
        } else if (!c->dense_inter) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: layer %u is dense but intermediate_size is missing", path, l);
            goto done;
        }
    }
    if (!c->n_moe_layers)
        st = moesim_fail(err, MOESIM_EINPUT, "%s: no MoE layer (decoder_sparse_step, "
                         "mlp_only_layers)", path);
done:
    json_decref(cfg);
    return st;
}

/* ---- tensors ---- */

static moesim_status open_checkpoint(engine *e, const char *dir, moesim_error *err) {
    char path[2048];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    struct stat sb;
    if (stat(path, &sb)) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        e->n_shards = 1;
        return st_file_open(path, &e->shards[0], err);
    }
    char *text;
    size_t len;
    moesim_status st = read_small_file(path, &text, &len, err);
    if (st) return st;
    json_error_t jerr;
    json_t *idx = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!idx) return moesim_fail(err, MOESIM_EINPUT, "%s:%d: invalid JSON: %s", path, jerr.line,
                                 jerr.text);
    json_t *wm = json_object_get(idx, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(idx);
        return moesim_fail(err, MOESIM_EINPUT, "%s: weight_map: expected an object", path);
    }
    e->weight_map = json_incref(wm);
    json_decref(idx);
    /* shards are opened on first use (shard_for); names must stay inside dir */
    const char *name;
    json_t *file;
    json_object_foreach(e->weight_map, name, file) {
        if (!json_is_string(file) || strchr(json_string_value(file), '/') ||
            strlen(json_string_value(file)) >= 256 ||
            !strcmp(json_string_value(file), "..") || !*json_string_value(file))
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: weight_map['%.80s']: expected a file name in %s", path, name,
                               dir);
    }
    return MOESIM_OK;
}

/* The safetensors file holding `name` (opening shards of an index on first use). */
static moesim_status shard_for(engine *e, const char *dir, const char *name, st_file **out,
                               moesim_error *err) {
    if (!e->weight_map) {
        *out = e->shards[0];
        return MOESIM_OK;
    }
    const json_t *file = json_object_get(e->weight_map, name);
    *out = NULL;
    if (!file) return MOESIM_OK;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, json_string_value(file));
    for (uint32_t i = 0; i < e->n_shards; i++)
        if (!strcmp(e->shard_names[i], json_string_value(file))) {
            *out = e->shards[i];
            return MOESIM_OK;
        }
    if (e->n_shards == MAX_SHARDS)
        return moesim_fail(err, MOESIM_EINPUT, "%s: more than %d shards", dir, MAX_SHARDS);
    moesim_status st = st_file_open(path, &e->shards[e->n_shards], err);
    if (st) return st;
    snprintf(e->shard_names[e->n_shards], sizeof e->shard_names[0], "%s",
             json_string_value(file));
    *out = e->shards[e->n_shards++];
    return MOESIM_OK;
}

static moesim_status find_tensor(engine *e, const char *dir, tensor_kind kind, uint32_t l,
                                 uint32_t x, const st_tensor **out, char *name, size_t name_len,
                                 moesim_error *err) {
    e->arch->tensor_name(name, name_len, kind, l, x);
    st_file *f;
    moesim_status st = shard_for(e, dir, name, &f, err);
    if (st) return st;
    *out = f ? st_file_find(f, name) : NULL;
    if (!*out)
        return moesim_fail(err, MOESIM_EINPUT, "%s: tensor '%s' missing from the checkpoint", dir,
                           name);
    return MOESIM_OK;
}

/* Whether the checkpoint holds the tensor of `kind` (layer 0, expert 0). */
static moesim_status has_tensor(engine *e, const char *dir, tensor_kind kind, bool *out,
                                moesim_error *err) {
    char name[SAFETENSORS_MAX_NAME];
    e->arch->tensor_name(name, sizeof name, kind, 0, 0);
    st_file *f;
    moesim_status st = shard_for(e, dir, name, &f, err);
    *out = !st && f && st_file_find(f, name);
    return st;
}

static float to_f32(const st_tensor *t, uint64_t i) {
    const uint8_t *p = (const uint8_t *)t->data + i * st_dtype_size(t->dtype);
    switch (t->dtype) {
    case ST_F32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case ST_F16: return quant_fp16_to_f32((uint16_t)(p[0] | p[1] << 8));
    case ST_BF16: return quant_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
    }
    MOESIM_UNREACHABLE();
}

static moesim_status check_shape(const char *dir, const char *name, const st_tensor *t,
                                 uint32_t rows, uint32_t cols, moesim_error *err) {
    bool ok = rows == 0 ? (t->n_dims == 1 && t->shape[0] == cols)
                        : (t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols);
    if (!ok) {
        char got[96] = "[";
        for (uint32_t d = 0; d < t->n_dims; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", d ? ", " : "",
                     (unsigned long long)t->shape[d]);
        strncat(got, "]", sizeof got - strlen(got) - 1);
        if (rows)
            return moesim_fail(err, MOESIM_EINPUT, "%s: tensor '%s': shape %s, expected [%u, %u]",
                               dir, name, got, rows, cols);
        return moesim_fail(err, MOESIM_EINPUT, "%s: tensor '%s': shape %s, expected [%u]", dir,
                           name, got, cols);
    }
    return MOESIM_OK;
}

/* A vector [n] as an owned fp32 copy. */
static moesim_status load_vec(engine *e, const char *dir, tensor_kind kind, uint32_t l, uint32_t n,
                              float **out, moesim_error *err) {
    const st_tensor *t;
    char name[SAFETENSORS_MAX_NAME];
    *out = NULL;
    moesim_status st = find_tensor(e, dir, kind, l, 0, &t, name, sizeof name, err);
    if (st) return st;
    if ((st = check_shape(dir, name, t, 0, n, err))) return st;
    float *v = own(e, moesim_xcalloc(n, sizeof *v));
    for (uint32_t i = 0; i < n; i++) v[i] = to_f32(t, i);
    *out = v;
    return MOESIM_OK;
}

/* A matrix [rows][cols]: bf16 stays mapped (when aligned), other dtypes become fp32 copies. */
static moesim_status load_mat(engine *e, const char *dir, tensor_kind kind, uint32_t l,
                              uint32_t x, uint32_t rows, uint32_t cols, engine_mat *out,
                              moesim_error *err) {
    const st_tensor *t;
    char name[SAFETENSORS_MAX_NAME];
    moesim_status st = find_tensor(e, dir, kind, l, x, &t, name, sizeof name, err);
    if (st) return st;
    if ((st = check_shape(dir, name, t, rows, cols, err))) return st;
    out->rows = rows;
    out->cols = cols;
    size_t n = (size_t)rows * cols;
    if (t->dtype == ST_BF16) {
        out->kind = MAT_BF16;
        if ((uintptr_t)t->data % 2 == 0) {
            out->data = t->data;
        } else {
            uint16_t *w = own(e, moesim_xcalloc(n, sizeof *w));
            memcpy(w, t->data, n * sizeof *w);
            out->data = w;
        }
        return MOESIM_OK;
    }
    float *w = own(e, moesim_xcalloc(n, sizeof *w));
    for (size_t i = 0; i < n; i++) w[i] = to_f32(t, i);
    out->kind = MAT_F32;
    out->data = w;
    return MOESIM_OK;
}

void engine_mat_row_f32(const engine_mat *m, uint32_t r, float *out) {
    size_t c = m->cols;
    if (m->kind == MAT_F32) {
        memcpy(out, (const float *)m->data + (size_t)r * c, c * sizeof *out);
    } else if (m->kind == MAT_BF16) {
        const uint16_t *w = (const uint16_t *)m->data + (size_t)r * c;
        for (size_t i = 0; i < c; i++) out[i] = quant_bf16_to_f32(w[i]);
    } else {
        MOESIM_UNREACHABLE();
    }
}

static const mat_kind kind_of_prec[PREC_COUNT] = {
    [PREC_BF16] = MAT_BF16, [PREC_INT8] = MAT_Q8, [PREC_INT4] = MAT_Q4, [PREC_INT2] = MAT_Q2};

static moesim_status quantize_expert(engine *e, expert_w *x, uint32_t l, uint32_t j,
                                     moesim_error *err) {
    float *row = NULL;
    for (int p = PREC_INT8; p < PREC_COUNT; p++) {
        if (!(e->precision_mask & (1u << p)) || p == PREC_BF16) continue;
        for (int part = 0; part < PART_COUNT; part++) {
            const engine_mat *src = &x->m[PREC_BF16][part];
            char what[96];
            snprintf(what, sizeof what, "layer %u expert %u part %d", l, j, part);
            moesim_status st = quant_check_cols((moesim_precision)p, src->cols, what, err);
            if (st) {
                free(row);
                return st;
            }
            size_t row_bytes = quant_matrix_size_bytes((moesim_precision)p, 1, src->cols);
            uint8_t *q = own(e, moesim_xmalloc(row_bytes * src->rows));
            row = moesim_xrealloc(row, src->cols * sizeof *row);
            for (uint32_t r = 0; r < src->rows; r++) {
                engine_mat_row_f32(src, r, row);
                quant_row_quantize_ref((moesim_precision)p, row, q + r * row_bytes, src->cols);
            }
            x->m[p][part] = (engine_mat){kind_of_prec[p], q, src->rows, src->cols};
        }
    }
    free(row);
    return MOESIM_OK;
}

static moesim_status load_ffn(engine *e, const char *dir, uint32_t l, uint32_t x, tensor_kind g,
                              uint32_t inter, engine_mat mats[PART_COUNT], moesim_error *err) {
    uint32_t H = e->cfg.hidden;
    moesim_status st;
    if ((st = load_mat(e, dir, g, l, x, inter, H, &mats[PART_GATE], err)) ||
        (st = load_mat(e, dir, g + 1, l, x, inter, H, &mats[PART_UP], err)) ||
        (st = load_mat(e, dir, g + 2, l, x, H, inter, &mats[PART_DOWN], err)))
        return st;
    return MOESIM_OK;
}

static moesim_status load_weights(engine *e, const char *dir, moesim_error *err) {
    const engine_config *c = &e->cfg;
    uint32_t H = c->hidden, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    moesim_status st;
    if ((st = load_mat(e, dir, T_EMBED, 0, 0, c->vocab, H, &e->embed, err)) ||
        (st = load_vec(e, dir, T_FINAL_NORM, 0, H, &e->final_norm, err)))
        return st;
    /* transformers ties the head to the embedding only when the checkpoint has no lm_head.weight:
     * a stored head is loaded and used even under tie_word_embeddings */
    bool stored_head;
    if ((st = has_tensor(e, dir, T_LM_HEAD, &stored_head, err))) return st;
    e->cfg.tie_embeddings = e->cfg.tie_embeddings && !stored_head;
    if (c->tie_embeddings) e->lm_head = e->embed;
    else if ((st = load_mat(e, dir, T_LM_HEAD, 0, 0, c->vocab, H, &e->lm_head, err))) return st;
    e->layers = own(e, moesim_xcalloc(c->n_layers, sizeof *e->layers));
    for (uint32_t l = 0; l < c->n_layers; l++) {
        layer_w *L = &e->layers[l];
        uint32_t qn = c->qk_norm_per_head ? c->head_dim : qd;
        uint32_t kn = c->qk_norm_per_head ? c->head_dim : kvd;
        bool qk = c->qk_norm_per_head || c->qk_norm_full;
        if ((st = load_vec(e, dir, T_ATTN_NORM, l, H, &L->attn_norm, err)) ||
            (st = load_vec(e, dir, T_FFN_NORM, l, H, &L->ffn_norm, err)) ||
            (st = load_mat(e, dir, T_Q, l, 0, qd, H, &L->wq, err)) ||
            (st = load_mat(e, dir, T_K, l, 0, kvd, H, &L->wk, err)) ||
            (st = load_mat(e, dir, T_V, l, 0, kvd, H, &L->wv, err)) ||
            (st = load_mat(e, dir, T_O, l, 0, H, qd, &L->wo, err)) ||
            (c->qkv_bias && (st = load_vec(e, dir, T_Q_BIAS, l, qd, &L->q_bias, err))) ||
            (c->qkv_bias && (st = load_vec(e, dir, T_K_BIAS, l, kvd, &L->k_bias, err))) ||
            (c->qkv_bias && (st = load_vec(e, dir, T_V_BIAS, l, kvd, &L->v_bias, err))) ||
            (c->o_bias && (st = load_vec(e, dir, T_O_BIAS, l, H, &L->o_bias, err))) ||
            (qk && (st = load_vec(e, dir, T_Q_NORM, l, qn, &L->q_norm, err))) ||
            (qk && (st = load_vec(e, dir, T_K_NORM, l, kn, &L->k_norm, err))))
            return st;
        if (!c->is_moe[l]) {
            if ((st = load_ffn(e, dir, l, 0, T_DENSE_GATE, c->dense_inter, L->dense, err)))
                return st;
            continue;
        }
        if ((st = load_mat(e, dir, T_ROUTER, l, 0, c->n_experts, H, &L->router, err))) return st;
        L->experts = own(e, moesim_xcalloc(c->n_experts, sizeof *L->experts));
        for (uint32_t j = 0; j < c->n_experts; j++) {
            if ((st = load_ffn(e, dir, l, j, T_EXP_GATE, c->expert_inter,
                               L->experts[j].m[PREC_BF16], err)) ||
                (st = quantize_expert(e, &L->experts[j], l, j, err)))
                return st;
        }
        if (c->shared_inter) {
            if ((st = load_ffn(e, dir, l, 0, T_SHARED_GATE, c->shared_inter, L->shared, err)))
                return st;
            if (c->shared_expert_gate) {
                engine_mat g;
                if ((st = load_mat(e, dir, T_SHARED_EXPERT_GATE, l, 0, 1, H, &g, err))) return st;
                L->shared_gate = own(e, moesim_xcalloc(H, sizeof(float)));
                engine_mat_row_f32(&g, 0, L->shared_gate);
            }
        }
    }
    return MOESIM_OK;
}

/* ---- backends ---- */

#ifdef MOESIM_HAVE_CUDA
_Static_assert((int)ECU_F32 == (int)MAT_F32 && (int)ECU_BF16 == (int)MAT_BF16 &&
                   (int)ECU_Q8 == (int)MAT_Q8 && (int)ECU_Q4 == (int)MAT_Q4 &&
                   (int)ECU_Q2 == (int)MAT_Q2 && ECU_PARTS == (int)PART_COUNT &&
                   ECU_PRECS == (int)PREC_COUNT,
               "engine_cuda.h mirrors the engine's matrix kinds, parts and precisions");

static ecu_mat ecu_of(const engine_mat *m) {
    return (ecu_mat){(uint32_t)m->kind, m->data, m->rows, m->cols};
}

/* Describes the loaded weights to the CUDA forward pass (kernels/cuda/engine_cuda.h), which
 * copies them to the device and to pinned host memory. */
static moesim_status cuda_attach(engine *e, uint32_t pool_experts, moesim_error *err) {
    const engine_config *c = &e->cfg;
    ecu_layer *layers = moesim_xcalloc(c->n_layers, sizeof *layers);
    ecu_mat *experts = moesim_xcalloc((size_t)c->n_layers * c->n_experts * PREC_COUNT * PART_COUNT,
                                      sizeof *experts);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const layer_w *L = &e->layers[l];
        ecu_layer *d = &layers[l];
        *d = (ecu_layer){.attn_norm = L->attn_norm, .ffn_norm = L->ffn_norm, .q_bias = L->q_bias,
                         .k_bias = L->k_bias, .v_bias = L->v_bias, .o_bias = L->o_bias,
                         .attn_window = c->attn_window[l], .q_norm = L->q_norm,
                         .k_norm = L->k_norm, .wq = ecu_of(&L->wq), .wk = ecu_of(&L->wk),
                         .wv = ecu_of(&L->wv), .wo = ecu_of(&L->wo), .is_moe = c->is_moe[l],
                         .shared_gate = L->shared_gate};
        for (int p = 0; p < PART_COUNT; p++) {
            d->shared[p] = ecu_of(&L->shared[p]);
            d->dense[p] = ecu_of(&L->dense[p]);
        }
        if (!c->is_moe[l]) continue;
        d->router = ecu_of(&L->router);
        ecu_mat *x = experts + (size_t)l * c->n_experts * PREC_COUNT * PART_COUNT;
        for (uint32_t j = 0; j < c->n_experts; j++)
            for (int p = 0; p < PREC_COUNT; p++)
                for (int part = 0; part < PART_COUNT; part++)
                    x[((size_t)j * PREC_COUNT + p) * PART_COUNT + part] =
                        ecu_of(&L->experts[j].m[p][part]);
        d->experts = x;
    }
    ecu_model m = {.n_layers = c->n_layers, .hidden = c->hidden, .vocab = c->vocab,
                   .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                   .n_experts = c->n_experts, .top_k = c->top_k, .expert_inter = c->expert_inter,
                   .shared_inter = c->shared_inter,
                   .dense_inter = c->n_moe_layers < c->n_layers ? c->dense_inter : 0,
                   .n_moe_layers = c->n_moe_layers, .norm_topk_prob = c->norm_topk_prob,
                   .qk_norm_per_head = c->qk_norm_per_head, .qk_norm_full = c->qk_norm_full,
                   .rms_eps = c->rms_eps, .clip_qkv = c->clip_qkv, .clip_qkv_on = c->clip_qkv_on, .rope_theta = c->rope_theta,
                   .moe_index = c->moe_index,
                   .precision_mask = e->precision_mask, .layers = layers,
                   .final_norm = e->final_norm, .lm_head = ecu_of(&e->lm_head),
                   .pool_experts = pool_experts};
    char msg[512];
    int rc = engine_cuda_create(&m, &e->cuda, msg, sizeof msg);
    free(experts);
    free(layers);
    if (rc) return moesim_fail(err, MOESIM_EINPUT, "%s", msg);
    return MOESIM_OK;
}
#endif

const char *engine_backends(void) {
#ifdef MOESIM_HAVE_CUDA
    return "cpu, cuda";
#else
    return "cpu";
#endif
}

const char *engine_backend_name(const engine *e) {
#ifdef MOESIM_HAVE_CUDA
    if (e->cuda) return "cuda";
#endif
    return e->be->name;
}

void engine_pool_stats_get(const engine *e, engine_pool_stats *out) {
    memset(out, 0, sizeof *out);
#ifdef MOESIM_HAVE_CUDA
    if (!e->cuda) return;
    ecu_pool_stats s;
    engine_cuda_pool_stats(e->cuda, &s);
    *out = (engine_pool_stats){.blocks = s.blocks, .block_bytes = s.block_bytes, .hits = s.hits,
                               .misses = s.misses, .h2d_bytes = s.h2d_bytes};
#else
    (void)e;
#endif
}

moesim_status engine_load(const char *dir, const engine_options *opt, engine **out,
                          moesim_error *err) {
    const char *backend = opt && opt->backend ? opt->backend : "cpu";
    bool want_cuda = !strcmp(backend, "cuda");
    if (strcmp(backend, "cpu") && !want_cuda)
        return moesim_fail(err, MOESIM_EINPUT, "backend '%.32s' is unknown (this build has: %s)",
                           backend, engine_backends());
#ifndef MOESIM_HAVE_CUDA
    if (want_cuda)
        return moesim_fail(err, MOESIM_EINPUT,
                           "backend 'cuda': this build has no CUDA (configure with "
                           "-DMOESIM_CUDA=ON; this build has: %s)", engine_backends());
#endif
    *out = NULL;
    engine *e = moesim_xcalloc(1, sizeof *e);
    e->be = &engine_backend_cpu;
    e->precision_mask = (opt ? opt->precision_mask : 0) | (1u << PREC_BF16);
    for (int p = 0; p < PREC_COUNT; p++)
        if ((e->precision_mask & (1u << p)) && !quant_traits_of((moesim_precision)p)) {
            engine_destroy(e);
            return moesim_fail(err, MOESIM_EINPUT,
                               "precision %d: the engine holds experts at bf16, int8, int4 or "
                               "int2", p);
        }
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", dir);
    moesim_status st = parse_config(e, path, err);
    if (!st) st = open_checkpoint(e, dir, err);
    if (!st) st = load_weights(e, dir, err);
#ifdef MOESIM_HAVE_CUDA
    if (!st && want_cuda) st = cuda_attach(e, opt->gpu_pool_experts, err);
#endif
    if (st) {
        engine_destroy(e);
        return st;
    }
    const engine_config *c = &e->cfg;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t nt = opt && opt->n_threads ? opt->n_threads : (uint32_t)(ncpu > 0 ? ncpu : 1);
    e->pool = thread_pool_create(nt);
    uint32_t H = c->hidden, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    uint32_t inter = c->expert_inter;
    if (c->shared_inter > inter) inter = c->shared_inter;
    if (c->dense_inter > inter) inter = c->dense_inter;
    float **hbufs[] = {&e->x, &e->h, &e->tmp, &e->y, &e->eo};
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(hbufs); i++)
        *hbufs[i] = own(e, moesim_xcalloc(H, sizeof(float)));
    e->q = own(e, moesim_xcalloc(qd, sizeof(float)));
    e->att = own(e, moesim_xcalloc(qd, sizeof(float)));
    e->k = own(e, moesim_xcalloc(kvd, sizeof(float)));
    e->v = own(e, moesim_xcalloc(kvd, sizeof(float)));
    e->ff_gate = own(e, moesim_xcalloc(inter, sizeof(float)));
    e->ff_up = own(e, moesim_xcalloc(inter, sizeof(float)));
    e->router_logits = own(e, moesim_xcalloc(c->n_experts, sizeof(float)));
    e->router_probs = own(e, moesim_xcalloc(c->n_experts, sizeof(float)));
    e->la_vals = own(e, moesim_xcalloc(c->n_experts, sizeof(float)));
    e->la_ids = own(e, moesim_xcalloc(c->n_experts, sizeof(uint32_t)));
    *out = e;
    return MOESIM_OK;
}

void engine_destroy(engine *e) {
    if (!e) return;
#ifdef MOESIM_HAVE_CUDA
    engine_cuda_destroy(e->cuda);
#endif
    thread_pool_destroy(e->pool);
    for (size_t i = 0; i < e->n_owned; i++) free(e->owned[i]);
    free(e->owned);
    for (uint32_t i = 0; i < e->n_shards; i++) st_file_close(e->shards[i]);
    json_decref(e->weight_map);
    free(e);
}

const engine_config *engine_config_of(const engine *e) { return &e->cfg; }

bool engine_has_precision(const engine *e, moesim_precision p) {
    return (unsigned)p < PREC_COUNT && (e->precision_mask & (1u << p));
}

const engine_mat *engine_weight(const engine *e, tensor_kind kind, uint32_t layer, uint32_t expert,
                                moesim_precision p) {
    const engine_config *c = &e->cfg;
    if (kind == T_EMBED) return &e->embed;
    if (kind == T_LM_HEAD) return &e->lm_head;
    MOESIM_ASSERT(layer < c->n_layers);
    const layer_w *L = &e->layers[layer];
    bool moe = c->is_moe[layer];
    switch (kind) {
    case T_Q:
        return &L->wq;
    case T_K:
        return &L->wk;
    case T_V:
        return &L->wv;
    case T_O:
        return &L->wo;
    case T_ROUTER:
        return moe ? &L->router : NULL;
    case T_EXP_GATE:
    case T_EXP_UP:
    case T_EXP_DOWN:
        if (!moe || !engine_has_precision(e, p)) return NULL;
        MOESIM_ASSERT(expert < c->n_experts);
        return &L->experts[expert].m[p][kind - T_EXP_GATE];
    case T_SHARED_GATE:
    case T_SHARED_UP:
    case T_SHARED_DOWN:
        return moe && c->shared_inter ? &L->shared[kind - T_SHARED_GATE] : NULL;
    case T_DENSE_GATE:
    case T_DENSE_UP:
    case T_DENSE_DOWN:
        return moe ? NULL : &L->dense[kind - T_DENSE_GATE];
    default:
        return NULL;
    }
}

void engine_geometry(const engine *e, const char *name, model_geometry *g) {
    const engine_config *c = &e->cfg;
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", name);
    snprintf(g->family, sizeof g->family, "%s", c->model_type);
    g->n_layers = c->n_layers;
    g->n_moe_layers = c->n_moe_layers;
    for (uint32_t l = 0; l < c->n_layers; l++) g->is_moe_layer[l] = c->is_moe[l];
    g->hidden = c->hidden;
    /* model_geometry's invariant: a dense width only where some layer is dense (config.json
     * carries intermediate_size even when every layer is MoE) */
    g->dense_inter = c->n_moe_layers < c->n_layers ? c->dense_inter : 0;
    g->vocab = c->vocab;
    g->tie_embeddings = c->tie_embeddings;
    g->n_experts = c->n_experts;
    g->top_k = c->top_k;
    g->expert_inter = c->expert_inter;
    g->gate_norm = c->norm_topk_prob ? GATE_SOFTMAX_TOPK : GATE_SOFTMAX_ALL;
    g->n_shared_experts = c->shared_inter ? 1 : 0;
    g->shared_inter = c->shared_inter;
    g->shared_expert_gate = c->shared_expert_gate;
    g->attention = ATTENTION_GQA;
    g->n_heads = c->n_heads;
    g->n_kv_heads = c->n_kv_heads;
    g->head_dim = c->head_dim;
    g->qk_norm = c->qk_norm_full || c->qk_norm_per_head;
    g->rope_theta = c->rope_theta;
}

/* ---- precision maps ---- */

void engine_precmap_init(engine_precmap *m, const engine *e, uint8_t prec) {
    m->n_layers = e->cfg.n_moe_layers;
    m->n_experts = e->cfg.n_experts;
    m->prec = moesim_xmalloc((size_t)m->n_layers * m->n_experts);
    memset(m->prec, prec, (size_t)m->n_layers * m->n_experts);
}

void engine_precmap_free(engine_precmap *m) {
    free(m->prec);
    m->prec = NULL;
}

moesim_status engine_precmap_load(engine_precmap *m, const engine *e, const char *path,
                                  moesim_error *err) {
    FILE *fp = fopen(path, "r");
    if (!fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    engine_precmap_init(m, e, PREC_BF16);
    char line[1 << 16];
    uint32_t layer = 0, lineno = 0;
    moesim_status st = MOESIM_OK;
    while (!st && fgets(line, sizeof line, fp)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *save, *tok = strtok_r(line, " \t\r\n,", &save);
        if (!tok) continue;
        if (layer >= m->n_layers) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: more than %u MoE layer lines", path,
                             lineno, m->n_layers);
            break;
        }
        uint32_t j = 0;
        for (; tok; tok = strtok_r(NULL, " \t\r\n,", &save), j++) {
            if (j >= m->n_experts) {
                st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: more than %u experts", path, lineno,
                                 m->n_experts);
                break;
            }
            moesim_precision p;
            if (!strcmp(tok, "skip")) {
                m->prec[layer * m->n_experts + j] = ENGINE_PREC_SKIP;
            } else if (quant_precision_parse(tok, &p) && engine_has_precision(e, p)) {
                m->prec[layer * m->n_experts + j] = (uint8_t)p;
            } else {
                st = moesim_fail(err, MOESIM_EINPUT,
                                 "%s:%u: expert %u: '%.16s' is not a loaded precision (expected "
                                 "bf16, int8, int4, int2 as loaded, or skip)", path, lineno, j,
                                 tok);
                break;
            }
        }
        if (!st && j != m->n_experts)
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: %u entries, expected %u (one per expert)",
                             path, lineno, j, m->n_experts);
        layer++;
    }
    fclose(fp);
    if (!st && layer != m->n_layers)
        st = moesim_fail(err, MOESIM_EINPUT, "%s: %u layer lines, expected %u (one per MoE layer)",
                         path, layer, m->n_layers);
    if (st) engine_precmap_free(m);
    return st;
}

/* ---- sequences and the forward pass ---- */

engine_seq *engine_seq_create(const engine *e, uint32_t max_ctx) {
    const engine_config *c = &e->cfg;
    engine_seq *s = moesim_xcalloc(1, sizeof *s);
    s->max_ctx = max_ctx ? max_ctx : 1;
    s->n_layers = c->n_layers;
    s->kv_dim = c->n_kv_heads * c->head_dim;
    s->n_moe = c->n_moe_layers;
    s->n_heads = c->n_heads;
    size_t kv = (size_t)s->n_layers * s->max_ctx * s->kv_dim;
    s->k = moesim_xcalloc(kv, sizeof(float));
    s->v = moesim_xcalloc(kv, sizeof(float));
    s->importance = moesim_xcalloc((size_t)s->n_moe * s->max_ctx, sizeof(float));
    s->probs = moesim_xcalloc((size_t)s->n_heads * s->max_ctx, sizeof(float));
#ifdef MOESIM_HAVE_CUDA
    if (e->cuda) s->cuda = engine_cuda_seq_create(e->cuda, s->max_ctx);
#endif
    return s;
}

void engine_seq_destroy(engine_seq *s) {
    if (!s) return;
#ifdef MOESIM_HAVE_CUDA
    engine_cuda_seq_destroy(s->cuda);
#endif
    free(s->k);
    free(s->v);
    free(s->importance);
    free(s->probs);
    free(s);
}

uint32_t engine_seq_len(const engine_seq *s) { return s->len; }

float engine_seq_importance(const engine_seq *s, uint32_t moe_layer, uint32_t pos) {
    MOESIM_ASSERT(moe_layer < s->n_moe && pos < s->len);
    return s->importance[(size_t)moe_layer * s->max_ctx + pos];
}

static void add_into(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* out = down(silu(gate h) * up h) */
static void ffn(engine *e, const engine_mat m[PART_COUNT], const float *h, float *out) {
    uint32_t inter = m[PART_GATE].rows;
    e->be->matvec(e->pool, e->ff_gate, &m[PART_GATE], h);
    e->be->matvec(e->pool, e->ff_up, &m[PART_UP], h);
    e->be->swiglu(e->ff_gate, e->ff_gate, e->ff_up, inter);
    e->be->matvec(e->pool, out, &m[PART_DOWN], e->ff_gate);
}

static void moe_block(engine *e, const layer_w *L, uint32_t m, const float *h,
                      const engine_precmap *pmap, engine_token_info *info, float *y) {
    const engine_config *c = &e->cfg;
    uint32_t E = c->n_experts, K = c->top_k, H = c->hidden;
    uint32_t ids[ENGINE_MAX_TOP_K];
    float vals[ENGINE_MAX_TOP_K];
    e->be->matvec(e->pool, e->router_logits, &L->router, h);
    memcpy(e->router_probs, e->router_logits, E * sizeof(float));
    e->be->softmax(e->router_probs, E);
    e->be->topk(e->router_probs, E, K, ids, vals);
    if (c->norm_topk_prob) {
        float s = 0;
        for (uint32_t i = 0; i < K; i++) s += vals[i];
        for (uint32_t i = 0; i < K; i++) vals[i] /= s;
    }
    memset(y, 0, H * sizeof *y);
    for (uint32_t i = 0; i < K; i++) {
        uint8_t p = pmap ? pmap->prec[(size_t)m * E + ids[i]] : PREC_BF16;
        if (p == ENGINE_PREC_SKIP) continue;
        MOESIM_ASSERT(engine_has_precision(e, (moesim_precision)p));
        ffn(e, L->experts[ids[i]].m[p], h, e->eo);
        for (uint32_t j = 0; j < H; j++) y[j] += vals[i] * e->eo[j];
    }
    if (c->shared_inter) {
        ffn(e, L->shared, h, e->eo);
        float g = 1.0f;
        if (L->shared_gate) {
            double d = 0;
            for (uint32_t j = 0; j < H; j++) d += (double)L->shared_gate[j] * h[j];
            g = (float)(1.0 / (1.0 + exp(-d)));
        }
        for (uint32_t j = 0; j < H; j++) y[j] += g * e->eo[j];
    }
    if (!info) return;
    for (uint32_t i = 0; i < K; i++) {
        info->expert_ids[(size_t)m * K + i] = (uint16_t)ids[i];
        info->gate_weights[(size_t)m * K + i] = vals[i];
    }
    uint32_t D = info->lookahead_depth, KP = info->lookahead_k;
    if (!D || !info->lookahead_ids) return;
    MOESIM_ASSERT(KP >= 1 && KP <= E);
    for (uint32_t d = 1; d <= D; d++) {
        size_t base = (((size_t)m * D) + (d - 1)) * KP;
        if (m + d >= c->n_moe_layers) {
            for (uint32_t i = 0; i < KP; i++) {
                info->lookahead_ids[base + i] = UINT16_MAX;
                info->lookahead_scores[base + i] = 0;
            }
            continue;
        }
        const layer_w *F = &e->layers[c->moe_layer[m + d]];
        e->be->matvec(e->pool, e->la_vals, &F->router, h);
        e->be->softmax(e->la_vals, E);
        /* router_logits is free again here: it receives the K' descending probabilities */
        e->be->topk(e->la_vals, E, KP, e->la_ids, e->router_logits);
        for (uint32_t i = 0; i < KP; i++) {
            info->lookahead_ids[base + i] = (uint16_t)e->la_ids[i];
            info->lookahead_scores[base + i] = e->router_logits[i];
        }
    }
}

moesim_status engine_seq_forward(engine *e, engine_seq *s, int32_t token,
                                 const engine_precmap *pmap, float *logits,
                                 engine_token_info *info, moesim_error *err) {
    const engine_config *c = &e->cfg;
    if (token < 0 || (uint32_t)token >= c->vocab)
        return moesim_fail(err, MOESIM_EINPUT, "token id %d outside the vocabulary [0, %u)", token,
                           c->vocab);
    if (s->len >= s->max_ctx)
        return moesim_fail(err, MOESIM_EINPUT, "context of %u positions is full", s->max_ctx);
    if (pmap) MOESIM_ASSERT(pmap->n_layers == c->n_moe_layers && pmap->n_experts == c->n_experts);
    uint32_t H = c->hidden, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    uint32_t qd = nh * hd, kvd = nkv * hd, pos = s->len;
    engine_mat_row_f32(&e->embed, (uint32_t)token, e->x);
#ifdef MOESIM_HAVE_CUDA
    if (e->cuda) {
        MOESIM_ASSERT(s->cuda);
        ecu_token_out o = {.logits = logits, .importance = s->importance};
        if (info) {
            o.expert_ids = info->expert_ids;
            o.gate_weights = info->gate_weights;
            o.la_depth = info->lookahead_depth;
            o.la_k = info->lookahead_k;
            o.la_ids = info->lookahead_ids;
            o.la_scores = info->lookahead_scores;
        }
        engine_cuda_forward(e->cuda, s->cuda, e->x, pos, pmap ? pmap->prec : NULL, &o);
        s->len++;
        return MOESIM_OK;
    }
#endif
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const layer_w *L = &e->layers[l];
        e->be->rmsnorm(e->h, e->x, L->attn_norm, H, c->rms_eps);
        e->be->matvec(e->pool, e->q, &L->wq, e->h);
        e->be->matvec(e->pool, e->k, &L->wk, e->h);
        e->be->matvec(e->pool, e->v, &L->wv, e->h);
        if (L->q_bias) add_into(e->q, L->q_bias, qd);
        if (L->k_bias) add_into(e->k, L->k_bias, kvd);
        if (L->v_bias) add_into(e->v, L->v_bias, kvd);
        if (c->qk_norm_full) {
            e->be->rmsnorm(e->q, e->q, L->q_norm, qd, c->rms_eps);
            e->be->rmsnorm(e->k, e->k, L->k_norm, kvd, c->rms_eps);
        }
        if (c->clip_qkv_on) {
            float cl = c->clip_qkv;
            for (uint32_t i = 0; i < qd; i++) e->q[i] = fminf(fmaxf(e->q[i], -cl), cl);
            for (uint32_t i = 0; i < kvd; i++) {
                e->k[i] = fminf(fmaxf(e->k[i], -cl), cl);
                e->v[i] = fminf(fmaxf(e->v[i], -cl), cl);
            }
        }
        if (c->qk_norm_per_head) {
            for (uint32_t h = 0; h < nh; h++)
                e->be->rmsnorm(e->q + h * hd, e->q + h * hd, L->q_norm, hd, c->rms_eps);
            for (uint32_t h = 0; h < nkv; h++)
                e->be->rmsnorm(e->k + h * hd, e->k + h * hd, L->k_norm, hd, c->rms_eps);
        }
        e->be->rope(e->q, nh, hd, pos, c->rope_theta);
        e->be->rope(e->k, nkv, hd, pos, c->rope_theta);
        float *kc = s->k + ((size_t)l * s->max_ctx) * kvd, *vc = s->v + ((size_t)l * s->max_ctx) * kvd;
        memcpy(kc + (size_t)pos * kvd, e->k, kvd * sizeof(float));
        memcpy(vc + (size_t)pos * kvd, e->v, kvd * sizeof(float));
        uint32_t w = c->attn_window[l], start = w && pos + 1 > w ? pos + 1 - w : 0;
        uint32_t n_ctx = pos + 1 - start;
        /* probs laid out [nh][n_ctx] inside the seq's [nh][max_ctx] scratch */
        e->be->attention(e->att, s->probs, e->q, kc + (size_t)start * kvd,
                         vc + (size_t)start * kvd, nh, nkv, hd, n_ctx);
        if (c->is_moe[l]) {
            float *imp = s->importance + (size_t)c->moe_index[l] * s->max_ctx + start;
            for (uint32_t t = 0; t < n_ctx; t++) {
                float a = 0;
                for (uint32_t h = 0; h < nh; h++) a += s->probs[(size_t)h * n_ctx + t];
                imp[t] += a / (float)nh;
            }
        }
        e->be->matvec(e->pool, e->tmp, &L->wo, e->att);
        if (L->o_bias) add_into(e->tmp, L->o_bias, H);
        add_into(e->x, e->tmp, H);
        e->be->rmsnorm(e->h, e->x, L->ffn_norm, H, c->rms_eps);
        if (c->is_moe[l]) moe_block(e, L, c->moe_index[l], e->h, pmap, info, e->y);
        else ffn(e, L->dense, e->h, e->y);
        add_into(e->x, e->y, H);
    }
    s->len++;
    if (logits) {
        e->be->rmsnorm(e->h, e->x, e->final_norm, H, c->rms_eps);
        e->be->matvec(e->pool, logits, &e->lm_head, e->h);
    }
    return MOESIM_OK;
}
