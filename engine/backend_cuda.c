/* The engine's "cuda" backend: the whole forward pass on the GPU (kernels/cuda/engine_cuda.cu,
 * behind its plain C interface). attach describes the weights checkpoint.c loaded (host pointers)
 * to engine_cuda_create, which copies them to the device and to pinned host memory; forward hands
 * it one token's embedding row. Registered only in a build with CUDA (MOESIM_CUDA on, which
 * defines MOESIM_HAVE_CUDA for the engine); without, engine_backend_cuda is NULL and engine_load
 * refuses the backend with one line. */
#include "engine/engine_internal.h"

#ifdef MOESIM_HAVE_CUDA

#include <stdlib.h>

#include "common/alloc.h"
#include "kernels/cuda/engine_cuda.h"

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
static moesim_status cuda_attach(engine *e, const engine_options *opt, moesim_error *err) {
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
                   .rms_eps = c->rms_eps, .clip_qkv = c->clip_qkv, .clip_qkv_on = c->clip_qkv_on,
                   .rope_theta = c->rope_theta, .moe_index = c->moe_index,
                   .precision_mask = e->precision_mask, .layers = layers,
                   .final_norm = e->final_norm, .lm_head = ecu_of(&e->lm_head),
                   .pool_experts = opt ? opt->gpu_pool_experts : 0};
    char msg[512];
    engine_cuda *g = NULL;
    int rc = engine_cuda_create(&m, &g, msg, sizeof msg);
    e->be_state = g;
    free(experts);
    free(layers);
    if (rc) return moesim_fail(err, MOESIM_EINPUT, "%s", msg);
    return MOESIM_OK;
}

static void cuda_detach(engine *e) { engine_cuda_destroy(e->be_state); }

static void cuda_seq_attach(const engine *e, engine_seq *s) {
    s->be_seq = engine_cuda_seq_create(e->be_state, s->max_ctx);
}

static void cuda_seq_detach(engine_seq *s) { engine_cuda_seq_destroy(s->be_seq); }

static void cuda_forward(engine *e, engine_seq *s, const engine_precmap *pmap, float *logits,
                         engine_token_info *info) {
    ecu_token_out o = {.logits = logits, .importance = s->importance};
    if (info) {
        o.expert_ids = info->expert_ids;
        o.gate_weights = info->gate_weights;
        o.la_depth = info->lookahead_depth;
        o.la_k = info->lookahead_k;
        o.la_ids = info->lookahead_ids;
        o.la_scores = info->lookahead_scores;
    }
    engine_cuda_forward(e->be_state, s->be_seq, e->x, s->len, pmap ? pmap->prec : NULL, &o);
}

static void cuda_pool_stats(const engine *e, engine_pool_stats *out) {
    ecu_pool_stats s;
    engine_cuda_pool_stats(e->be_state, &s);
    *out = (engine_pool_stats){.blocks = s.blocks, .block_bytes = s.block_bytes, .hits = s.hits,
                               .misses = s.misses, .h2d_bytes = s.h2d_bytes};
}

static const engine_backend cuda_backend = {
    .name = "cuda",
    .attach = cuda_attach,
    .detach = cuda_detach,
    .seq_attach = cuda_seq_attach,
    .seq_detach = cuda_seq_detach,
    .forward = cuda_forward,
    .pool_stats = cuda_pool_stats,
};
const engine_backend *const engine_backend_cuda = &cuda_backend;

#else

const engine_backend *const engine_backend_cuda = NULL;

#endif
