/* The checkpoint's tensors: model.safetensors, or model.safetensors.index.json and its shards
 * (opened on first use, names kept inside the directory); each tensor the configuration needs is
 * looked up by the architecture's name for it and checked for shape and dtype. bf16 matrices stay
 * in the read-only mapping, fp16/fp32 ones and all vectors become fp32 copies the engine owns;
 * routed experts are quantized to each requested integer format (quant.h layout,
 * round-to-nearest reference quantizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/check.h"
#include "engine/engine_internal.h"
#include "kernels/quant.h"

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
    moesim_status st = engine_read_small_file(path, &text, &len, err);
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
    if (e->n_shards == ENGINE_MAX_SHARDS)
        return moesim_fail(err, MOESIM_EINPUT, "%s: more than %d shards", dir, ENGINE_MAX_SHARDS);
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
    float *v = engine_own(e, moesim_xcalloc(n, sizeof *v));
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
            uint16_t *w = engine_own(e, moesim_xcalloc(n, sizeof *w));
            memcpy(w, t->data, n * sizeof *w);
            out->data = w;
        }
        return MOESIM_OK;
    }
    float *w = engine_own(e, moesim_xcalloc(n, sizeof *w));
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
            uint8_t *q = engine_own(e, moesim_xmalloc(row_bytes * src->rows));
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
    e->layers = engine_own(e, moesim_xcalloc(c->n_layers, sizeof *e->layers));
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
        L->experts = engine_own(e, moesim_xcalloc(c->n_experts, sizeof *L->experts));
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
                L->shared_gate = engine_own(e, moesim_xcalloc(H, sizeof(float)));
                engine_mat_row_f32(&g, 0, L->shared_gate);
            }
        }
    }
    return MOESIM_OK;
}

moesim_status engine_checkpoint_load(engine *e, const char *dir, moesim_error *err) {
    moesim_status st = open_checkpoint(e, dir, err);
    return st ? st : load_weights(e, dir, err);
}
