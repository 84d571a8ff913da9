/* Sequences and the forward pass (engine.h): one token of one sequence at a time (prefill feeds
 * the prompt token by token; the KV cache makes that equal to a causal pass over the whole
 * prompt). The pass below runs on an op-by-op backend (engine_backend's ops); a whole-forward
 * backend (cuda) gets the token's embedding row and runs it all. One forward at a time per
 * engine: scratch buffers and the thread pool are the engine's. */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "engine/engine_internal.h"

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
    s->be = e->be;
    if (s->be->seq_attach) s->be->seq_attach(e, s);
    return s;
}

void engine_seq_destroy(engine_seq *s) {
    if (!s) return;
    if (s->be->seq_detach) s->be->seq_detach(s);
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
    if (e->be->forward) {
        e->be->forward(e, s, pmap, logits, info);
        s->len++;
        return MOESIM_OK;
    }
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
        float *kc = s->k + ((size_t)l * s->max_ctx) * kvd,
              *vc = s->v + ((size_t)l * s->max_ctx) * kvd;
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
