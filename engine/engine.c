/* The engine (engine.h): loading a checkpoint onto a backend, and what a loaded engine answers
 * (its configuration, weights, geometry, backend). Loading reads config.json (config_load.c), the
 * tensors (checkpoint.c), then lets a whole-forward backend take the weights (attach); the
 * forward pass is forward.c's. Backends register in `backends` below: "cpu" always, "cuda" in a
 * build with CUDA (backend_cuda.c). */
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/check.h"
#include "engine/engine_internal.h"
#include "kernels/quant.h"

void *engine_own(engine *e, void *p) {
    if (e->n_owned == e->cap_owned) {
        e->cap_owned = e->cap_owned ? 2 * e->cap_owned : 256;
        e->owned = moesim_xrealloc(e->owned, e->cap_owned * sizeof *e->owned);
    }
    e->owned[e->n_owned++] = p;
    return p;
}

/* ---- backends ---- */

const char *engine_backends(void) { return engine_backend_cuda ? "cpu, cuda" : "cpu"; }

const char *engine_backend_name(const engine *e) { return e->be->name; }

void engine_pool_stats_get(const engine *e, engine_pool_stats *out) {
    memset(out, 0, sizeof *out);
    if (e->be->pool_stats) e->be->pool_stats(e, out);
}

/* The backend called `name`, or a one-line refusal naming what this build has. */
static moesim_status backend_find(const char *name, const engine_backend **out, moesim_error *err) {
    const engine_backend *const backends[] = {&engine_backend_cpu, engine_backend_cuda};
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(backends); i++)
        if (backends[i] && !strcmp(backends[i]->name, name)) {
            *out = backends[i];
            return MOESIM_OK;
        }
    if (!strcmp(name, "cuda"))
        return moesim_fail(err, MOESIM_EINPUT,
                           "backend 'cuda': built without CUDA (configure with -DMOESIM_CUDA=ON "
                           "on a machine with nvcc; this build has: %s)", engine_backends());
    return moesim_fail(err, MOESIM_EINPUT, "backend '%.32s' is unknown (this build has: %s)", name,
                       engine_backends());
}

/* ---- loading ---- */

moesim_status engine_load(const char *dir, const engine_options *opt, engine **out,
                          moesim_error *err) {
    const engine_backend *be = NULL;
    moesim_status st = backend_find(opt && opt->backend ? opt->backend : "cpu", &be, err);
    if (st) return st;
    *out = NULL;
    engine *e = moesim_xcalloc(1, sizeof *e);
    e->be = be;
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
    st = engine_config_load(e, path, err);
    if (!st) st = engine_checkpoint_load(e, dir, err);
    if (!st && e->be->attach) st = e->be->attach(e, opt, err);
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
        *hbufs[i] = engine_own(e, moesim_xcalloc(H, sizeof(float)));
    e->q = engine_own(e, moesim_xcalloc(qd, sizeof(float)));
    e->att = engine_own(e, moesim_xcalloc(qd, sizeof(float)));
    e->k = engine_own(e, moesim_xcalloc(kvd, sizeof(float)));
    e->v = engine_own(e, moesim_xcalloc(kvd, sizeof(float)));
    e->ff_gate = engine_own(e, moesim_xcalloc(inter, sizeof(float)));
    e->ff_up = engine_own(e, moesim_xcalloc(inter, sizeof(float)));
    e->router_logits = engine_own(e, moesim_xcalloc(c->n_experts, sizeof(float)));
    e->router_probs = engine_own(e, moesim_xcalloc(c->n_experts, sizeof(float)));
    e->la_vals = engine_own(e, moesim_xcalloc(c->n_experts, sizeof(float)));
    e->la_ids = engine_own(e, moesim_xcalloc(c->n_experts, sizeof(uint32_t)));
    *out = e;
    return MOESIM_OK;
}

void engine_destroy(engine *e) {
    if (!e) return;
    if (e->be && e->be->detach) e->be->detach(e);
    thread_pool_destroy(e->pool);
    for (size_t i = 0; i < e->n_owned; i++) free(e->owned[i]);
    free(e->owned);
    for (uint32_t i = 0; i < e->n_shards; i++) st_file_close(e->shards[i]);
    json_decref(e->weight_map);
    free(e);
}

/* ---- what a loaded engine answers ---- */

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
