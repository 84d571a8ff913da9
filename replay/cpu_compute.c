/* The CPU replay's compute (replay/cpu_compute.h). */
#include "replay/cpu_compute.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/rng.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

static uint16_t *random_bf16(uint64_t n, uint64_t seed) {
    uint16_t *w = moesim_xmalloc(n * sizeof *w);
    rng *g = rng_create(seed);
    for (uint64_t i = 0; i < n; i++)
        w[i] = quant_f32_to_bf16((float)(rng_uniform(g) - 0.5) * 0.05f);
    rng_destroy(g);
    return w;
}

static void matvec(float *y, moesim_precision p, const void *w, const float *x, size_t rows,
                   size_t cols) {
    if (p == PREC_BF16)
        kern_matvec_bf16_cpu(y, w, x, rows, cols);
    else
        kern_matvec_quant_cpu(y, p, w, x, rows, cols);
}

/* Layer `ml`'s matrices of kind k: the checkpoint's when there is one, else seeded random. */
static uint16_t *layer_weights(const replay_weights *w, replay_nonexpert k, uint32_t ml,
                               uint64_t n, uint64_t seed) {
    if (!w) return random_bf16(n, seed);
    uint16_t *buf = moesim_xmalloc(n * sizeof *buf);
    replay_weights_nonexpert(w, k, ml, buf);
    return buf;
}

/* Layer `ml`'s q|k|v and o projections; the checkpoint keeps them as one buffer, q|k|v rows then
 * o (replay/weights.h), the kernels read them as two. */
static void attention_weights(cpu_compute *c, const replay_weights *w, uint32_t ml, uint64_t seed) {
    uint64_t qkv = (c->q_dim + 2 * c->kv_dim) * c->m->hidden, o = c->q_dim * c->m->hidden;
    if (!w) {
        c->w_qkv[ml] = random_bf16(qkv, seed);
        c->w_o[ml] = random_bf16(o, seed + 1);
        return;
    }
    uint16_t *both = layer_weights(w, REPLAY_NX_ATTENTION, ml, qkv + o, 0);
    c->w_o[ml] = moesim_xmalloc(o * sizeof *both);
    memcpy(c->w_o[ml], both + qkv, o * sizeof *both);
    c->w_qkv[ml] = moesim_xrealloc(both, qkv * sizeof *both);
}

void cpu_compute_init(cpu_compute *c, const model_geometry *m, uint32_t max_ctx, uint64_t seed,
                      const replay_weights *w) {
    memset(c, 0, sizeof *c);
    c->m = m;
    c->max_ctx = max_ctx ? max_ctx : 1;
    uint64_t H = m->hidden;
    c->q_dim = (uint64_t)m->n_heads * m->head_dim;
    c->kv_dim = (uint64_t)m->n_kv_heads * m->head_dim;
    uint32_t NL = m->n_layers;
    c->w_qkv = moesim_xcalloc(NL, sizeof *c->w_qkv);
    c->w_o = moesim_xcalloc(NL, sizeof *c->w_o);
    c->w_router = moesim_xcalloc(NL, sizeof *c->w_router);
    c->w_shared = moesim_xcalloc(NL, sizeof *c->w_shared);
    c->w_dense = moesim_xcalloc(NL, sizeof *c->w_dense);
    uint64_t S = (uint64_t)m->shared_inter * m->n_shared_experts;
    for (uint32_t l = 0; l < NL; l++) {
        attention_weights(c, w, l, seed + 7ull * l);
        if (!m->is_moe_layer[l]) {
            c->w_dense[l] = layer_weights(w, REPLAY_NX_DENSE, l, 3ull * m->dense_inter * H,
                                          seed + 7ull * l + 2);
            continue;
        }
        c->w_router[l] = layer_weights(w, REPLAY_NX_ROUTER, l, (uint64_t)m->n_experts * H,
                                       seed + 7ull * l + 3);
        if (S) c->w_shared[l] = layer_weights(w, REPLAY_NX_SHARED, l, 3 * S * H, seed + 7ull * l + 4);
    }
    c->w_lm = layer_weights(w, REPLAY_NX_LM_HEAD, 0, (uint64_t)m->vocab * H, seed + 7ull * NL);
    uint64_t wide = H;
    if (m->expert_inter > wide) wide = m->expert_inter;
    if (m->dense_inter > wide) wide = m->dense_inter;
    if (S > wide) wide = S;
    c->x = moesim_xcalloc(H, sizeof(float));
    for (uint64_t h = 0; h < H; h++) c->x[h] = 0.01f * (float)(h % 7);
    c->q = moesim_xcalloc(c->q_dim + 2 * c->kv_dim, sizeof(float));
    c->kv = moesim_xcalloc((size_t)c->max_ctx * 2 * c->kv_dim + 2 * c->kv_dim, sizeof(float));
    c->att = moesim_xcalloc(c->q_dim, sizeof(float));
    c->probs = moesim_xcalloc((size_t)m->n_heads * c->max_ctx, sizeof(float));
    c->h1 = moesim_xcalloc(wide, sizeof(float));
    c->h2 = moesim_xcalloc(wide, sizeof(float));
    c->y = moesim_xcalloc(H, sizeof(float));
    c->logits = moesim_xcalloc(m->vocab > m->n_experts ? m->vocab : m->n_experts, sizeof(float));
}

void cpu_compute_free(cpu_compute *c) {
    for (uint32_t l = 0; c->m && l < c->m->n_layers; l++) {
        free(c->w_qkv[l]);
        free(c->w_o[l]);
        free(c->w_router[l]);
        free(c->w_shared[l]);
        free(c->w_dense[l]);
    }
    void *bufs[] = {c->w_qkv, c->w_o, c->w_router, c->w_shared, c->w_dense, c->w_lm, c->x,
                    c->q,     c->kv,  c->att,      c->probs,    c->h1,      c->h2,   c->y,
                    c->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    memset(c, 0, sizeof *c);
}

void cpu_compute_attention_proj(cpu_compute *c, uint32_t ml, uint32_t n) {
    const model_geometry *m = c->m;
    for (uint32_t i = 0; i < n; i++) {
        matvec(c->q, PREC_BF16, c->w_qkv[ml], c->x, c->q_dim + 2 * c->kv_dim, m->hidden);
        matvec(c->y, PREC_BF16, c->w_o[ml], c->att, m->hidden, c->q_dim);
    }
}

void cpu_compute_attention_core(cpu_compute *c, const uint32_t *positions, uint32_t n) {
    const model_geometry *m = c->m;
    for (uint32_t i = 0; i < n; i++) {
        kern_rope_cpu(c->q, m->n_heads, m->head_dim, positions[i], m->rope_theta);
        size_t ctx = (size_t)positions[i] + 1 < c->max_ctx ? (size_t)positions[i] + 1 : c->max_ctx;
        kern_attention_cpu(c->att, c->probs, c->q, c->kv, c->kv + c->kv_dim, m->n_heads,
                           m->n_kv_heads, m->head_dim, ctx);
    }
}

void cpu_compute_attention(cpu_compute *c, uint32_t ml, const uint32_t *positions, uint32_t n) {
    cpu_compute_attention_proj(c, ml, n);
    cpu_compute_attention_core(c, positions, n);
}

void cpu_compute_router(cpu_compute *c, uint32_t ml, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        matvec(c->logits, PREC_BF16, c->w_router[ml], c->x, c->m->n_experts, c->m->hidden);
}

/* SwiGLU feed-forward of width `inter` from three row-major matrices at precision p. */
static void swiglu_ffn(cpu_compute *c, moesim_precision p, const void *gate, const void *up,
                       const void *down, uint64_t inter, uint32_t n) {
    uint64_t H = c->m->hidden;
    for (uint32_t i = 0; i < n; i++) {
        if (gate) {
            matvec(c->h1, p, gate, c->x, inter, H);
            matvec(c->h2, p, up, c->x, inter, H);
            kern_swiglu_cpu(c->h1, c->h1, c->h2, inter);
        }
        if (down) matvec(c->y, p, down, c->h1, H, inter);
    }
}

void cpu_compute_shared(cpu_compute *c, uint32_t ml, uint32_t n) {
    uint64_t S = (uint64_t)c->m->shared_inter * c->m->n_shared_experts, H = c->m->hidden;
    if (!c->w_shared[ml]) return;
    swiglu_ffn(c, PREC_BF16, c->w_shared[ml], c->w_shared[ml] + S * H, c->w_shared[ml] + 2 * S * H,
               S, n);
}

void cpu_compute_dense(cpu_compute *c, uint32_t ml, uint32_t n) {
    uint64_t D = c->m->dense_inter, H = c->m->hidden;
    swiglu_ffn(c, PREC_BF16, c->w_dense[ml], c->w_dense[ml] + D * H, c->w_dense[ml] + 2 * D * H,
               D, n);
}

void cpu_compute_combine(cpu_compute *c, uint32_t n) {
    for (uint64_t j = 0; j < (uint64_t)n * c->m->top_k; j++)
        for (uint32_t h = 0; h < c->m->hidden; h++) c->x[h] += 1e-6f * c->y[h];
}

void cpu_compute_lm_head(cpu_compute *c, uint32_t n_emit) {
    for (uint32_t i = 0; i < n_emit; i++)
        matvec(c->logits, PREC_BF16, c->w_lm, c->x, c->m->vocab, c->m->hidden);
}

void cpu_compute_expert_gate_up(cpu_compute *c, moesim_precision p, const void *gate,
                                const void *up, uint32_t tokens) {
    swiglu_ffn(c, p, gate, up, NULL, c->m->expert_inter, tokens);
}

void cpu_compute_expert_down(cpu_compute *c, moesim_precision p, const void *down,
                             uint32_t tokens) {
    swiglu_ffn(c, p, NULL, NULL, down, c->m->expert_inter, tokens);
}
