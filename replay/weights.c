/* Replay's weights from a checkpoint (replay/weights.h): the engine loads and checks the
 * checkpoint; this file reads its matrices through engine_weight and writes them in the layouts
 * of replay's kernels. Integer expert formats are quantized here, row by row from the same fp32
 * rows as the engine's load-time quantization (bf16 widened, or the fp32 copy of an fp16 / fp32
 * tensor), with the same quantizer (quant_row_quantize_ref), so no second copy of every expert at
 * every format is held: the host store receives each expert straight into its pinned slot. */
#include "replay/weights.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/paths.h"
#include "engine/engine.h"
#include "engine/thread_pool.h"
#include "engine/weights.h"
#include "kernels/quant.h"

struct replay_weights {
    engine *e;
    thread_pool *pool; /* one worker per online CPU: expert conversion */
    char dir[1024];
};

moesim_status replay_weights_open(const char *dir, replay_weights **out, moesim_error *err) {
    *out = NULL;
    engine_options opt = {.n_threads = 1, .backend = "cpu"}; /* the engine never runs a token */
    engine *e;
    moesim_status st = engine_load(dir, &opt, &e, err);
    if (st) return st;
    replay_weights *w = moesim_xcalloc(1, sizeof *w);
    w->e = e;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    w->pool = thread_pool_create(ncpu > 0 ? (uint32_t)ncpu : 1);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    *out = w;
    return MOESIM_OK;
}

void replay_weights_close(replay_weights *w) {
    if (!w) return;
    thread_pool_destroy(w->pool);
    engine_destroy(w->e);
    free(w);
}

void replay_weights_geometry(const replay_weights *w, const char *name, model_geometry *out) {
    engine_geometry(w->e, name, out);
}

/* ---- the trace against the checkpoint ---- */

static moesim_status differs(const replay_weights *w, const char *file, const char *field,
                             uint64_t theirs, uint64_t ours, moesim_error *err) {
    return moesim_fail(err, MOESIM_EINPUT,
                       "%s: %s is %" PRIu64 ", but the checkpoint %s/config.json has %" PRIu64,
                       file, field, theirs, w->dir, ours);
}

/* The configs/models file the trace names, when there is one: its geometry must be the
 * checkpoint's (the trace was made for that model). */
static moesim_status check_model_file(const replay_weights *w, const model_geometry *g,
                                      const char *name, moesim_error *err) {
    char path[4096];
    if (moesim_config_path("models", name, path, sizeof path, NULL) || access(path, F_OK))
        return MOESIM_OK;
    model_geometry m;
    moesim_status st = model_load(path, &m, err);
    if (st) return st;
    if (m.attention != ATTENTION_GQA)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: attention is not grouped-query, but the checkpoint %s/config.json "
                           "is (model_type %s)",
                           path, w->dir, g->family);
    const struct {
        const char *field;
        uint64_t theirs, ours;
    } fields[] = {
        {"n_layers", m.n_layers, g->n_layers},
        {"MoE layers", m.n_moe_layers, g->n_moe_layers},
        {"hidden", m.hidden, g->hidden},
        {"dense_inter", m.dense_inter, g->dense_inter},
        {"vocab", m.vocab, g->vocab},
        {"n_experts", m.n_experts, g->n_experts},
        {"top_k", m.top_k, g->top_k},
        {"expert_inter", m.expert_inter, g->expert_inter},
        {"n_shared_experts", m.n_shared_experts, g->n_shared_experts},
        {"shared_inter", m.shared_inter, g->shared_inter},
        {"n_heads", m.n_heads, g->n_heads},
        {"n_kv_heads", m.n_kv_heads, g->n_kv_heads},
        {"head_dim", m.head_dim, g->head_dim},
    };
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(fields); i++)
        if (fields[i].theirs != fields[i].ours)
            return differs(w, path, fields[i].field, fields[i].theirs, fields[i].ours, err);
    for (uint32_t l = 0; l < m.n_layers; l++)
        if (m.is_moe_layer[l] != g->is_moe_layer[l]) {
            char field[64];
            snprintf(field, sizeof field, "MoE layer flag of layer %u", l);
            return differs(w, path, field, m.is_moe_layer[l], g->is_moe_layer[l], err);
        }
    return MOESIM_OK;
}

moesim_status replay_weights_check_trace(const replay_weights *w, const trace_meta *meta,
                                         const char *trace_path, moesim_error *err) {
    const engine_config *c = engine_config_of(w->e);
    model_geometry g;
    engine_geometry(w->e, meta->model, &g);
    const struct {
        const char *field;
        uint64_t theirs, ours;
    } fields[] = {
        {"n_layers (MoE layers)", meta->n_layers, c->n_moe_layers},
        {"n_experts", meta->n_experts, c->n_experts},
        {"top_k", meta->top_k, c->top_k},
        {"n_shared_experts", meta->n_shared_experts, g.n_shared_experts},
    };
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(fields); i++)
        if (fields[i].theirs != fields[i].ours)
            return differs(w, trace_path, fields[i].field, fields[i].theirs, fields[i].ours, err);
    for (uint32_t l = 0; l < meta->n_layers; l++)
        if (meta->model_layer[l] != c->moe_layer[l]) {
            char field[64];
            snprintf(field, sizeof field, "/layers/model_layer[%u]", l);
            return differs(w, trace_path, field, meta->model_layer[l], c->moe_layer[l], err);
        }
    if (meta->gate_norm != g.gate_norm)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: gate_normalization is \"%s\", but the checkpoint %s/config.json "
                           "has \"%s\" (norm_topk_prob)",
                           trace_path, meta->gate_norm == GATE_SOFTMAX_TOPK ? "topk" : "all",
                           w->dir, g.gate_norm == GATE_SOFTMAX_TOPK ? "topk" : "all");
    if (meta->model_config_hash && meta->model_config_hash != c->config_hash)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: model_config_hash is %016" PRIx64 ", but the checkpoint "
                           "%s/config.json hashes to %016" PRIx64
                           " (the trace was recorded from another checkpoint)",
                           trace_path, meta->model_config_hash, w->dir, c->config_hash);
    return check_model_file(w, &g, meta->model, err);
}

/* ---- conversion ---- */

uint64_t replay_part_bytes(const model_geometry *m, moesim_precision p, expert_part part) {
    uint64_t rows = part == PART_DOWN ? m->hidden : m->expert_inter;
    uint64_t cols = part == PART_DOWN ? m->expert_inter : m->hidden;
    return p == PREC_BF16 ? rows * cols * 2 : quant_matrix_size_bytes(p, rows, cols);
}

/* m as bf16 into dst ([rows][cols] * 2 bytes, any alignment); returns the bytes written. */
static size_t mat_write_bf16(const engine_mat *m, uint8_t *dst) {
    size_t n = (size_t)m->rows * m->cols;
    if (m->kind == MAT_BF16) {
        memcpy(dst, m->data, n * 2);
        return n * 2;
    }
    MOESIM_ASSERT(m->kind == MAT_F32);
    const float *f = m->data;
    for (size_t i = 0; i < n; i++) {
        uint16_t b = quant_f32_to_bf16(f[i]);
        memcpy(dst + 2 * i, &b, 2);
    }
    return n * 2;
}

/* m at precision p into dst (replay_part_bytes); row: [cols] scratch. */
static void part_write(const engine_mat *m, moesim_precision p, uint8_t *dst, float *row) {
    if (p == PREC_BF16) {
        mat_write_bf16(m, dst);
        return;
    }
    MOESIM_ASSERT(m->cols % QUANT_GROUP == 0);
    size_t row_bytes = quant_matrix_size_bytes(p, 1, m->cols);
    for (uint32_t r = 0; r < m->rows; r++) {
        engine_mat_row_f32(m, r, row);
        quant_row_quantize_ref(p, row, dst + r * row_bytes, m->cols);
    }
}

static void expert_write(const replay_weights *w, uint32_t moe_layer, uint32_t expert,
                         moesim_precision p, uint8_t *blob, float *row) {
    const engine_config *c = engine_config_of(w->e);
    MOESIM_ASSERT(moe_layer < c->n_moe_layers && quant_traits_of(p));
    for (int part = 0; part < PART_COUNT; part++) {
        const engine_mat *m =
            engine_weight(w->e, T_EXP_GATE + part, c->moe_layer[moe_layer], expert, PREC_BF16);
        MOESIM_ASSERT(m);
        part_write(m, p, blob, row);
        blob += p == PREC_BF16 ? (size_t)m->rows * m->cols * 2
                               : quant_matrix_size_bytes(p, m->rows, m->cols);
    }
}

/* The widest row of an expert part: hidden or expert_inter. */
static size_t row_floats(const replay_weights *w) {
    const engine_config *c = engine_config_of(w->e);
    return c->hidden > c->expert_inter ? c->hidden : c->expert_inter;
}

void replay_weights_expert(const replay_weights *w, uint32_t moe_layer, uint32_t expert,
                           moesim_precision p, uint8_t *blob) {
    float *row = moesim_xmalloc(row_floats(w) * sizeof *row);
    expert_write(w, moe_layer, expert, p, blob, row);
    free(row);
}

typedef struct experts_job {
    const replay_weights *w;
    moesim_precision p;
    size_t le_first;
    uint8_t *dst;
    uint64_t stride_bytes;
} experts_job;

static void experts_range(void *ctx, size_t begin, size_t end) {
    const experts_job *j = ctx;
    uint32_t E = engine_config_of(j->w->e)->n_experts;
    float *row = moesim_xmalloc(row_floats(j->w) * sizeof *row);
    for (size_t i = begin; i < end; i++) {
        size_t le = j->le_first + i;
        expert_write(j->w, (uint32_t)(le / E), (uint32_t)(le % E), j->p,
                     j->dst + i * j->stride_bytes, row);
    }
    free(row);
}

void replay_weights_experts(const replay_weights *w, moesim_precision p, size_t le_first, size_t n,
                            uint8_t *dst, uint64_t stride_bytes) {
    const engine_config *c = engine_config_of(w->e);
    MOESIM_ASSERT(le_first + n <= (size_t)c->n_moe_layers * c->n_experts);
    experts_job j = {w, p, le_first, dst, stride_bytes};
    thread_pool_run(w->pool, n, experts_range, &j);
}

uint64_t replay_nonexpert_elems(const model_geometry *m, replay_nonexpert k) {
    uint64_t H = m->hidden, q = (uint64_t)m->n_heads * m->head_dim;
    uint64_t kv = (uint64_t)m->n_kv_heads * m->head_dim;
    switch (k) {
    case REPLAY_NX_ATTENTION:
        return (q + 2 * kv) * H + H * q;
    case REPLAY_NX_ROUTER:
        return (uint64_t)m->n_experts * H;
    case REPLAY_NX_SHARED:
        return 3 * H * m->shared_inter * m->n_shared_experts;
    case REPLAY_NX_DENSE:
        return 3 * H * m->dense_inter;
    case REPLAY_NX_LM_HEAD:
        return (uint64_t)m->vocab * H;
    case REPLAY_NX_COUNT:
        break;
    }
    MOESIM_UNREACHABLE();
}

void replay_weights_nonexpert(const replay_weights *w, replay_nonexpert k, uint32_t layer,
                              uint16_t *dst) {
    static const tensor_kind kinds[REPLAY_NX_COUNT][4] = {
        [REPLAY_NX_ATTENTION] = {T_Q, T_K, T_V, T_O},
        [REPLAY_NX_ROUTER] = {T_ROUTER},
        [REPLAY_NX_SHARED] = {T_SHARED_GATE, T_SHARED_UP, T_SHARED_DOWN},
        [REPLAY_NX_DENSE] = {T_DENSE_GATE, T_DENSE_UP, T_DENSE_DOWN},
        [REPLAY_NX_LM_HEAD] = {T_LM_HEAD},
    };
    static const uint32_t n_kinds[REPLAY_NX_COUNT] = {4, 1, 3, 3, 1};
    MOESIM_ASSERT((unsigned)k < REPLAY_NX_COUNT);
    uint8_t *out = (uint8_t *)dst;
    for (uint32_t i = 0; i < n_kinds[k]; i++) {
        const engine_mat *m = engine_weight(w->e, kinds[k][i], layer, 0, PREC_BF16);
        MOESIM_ASSERT(m); /* the caller asks only for what the layer has */
        out += mat_write_bf16(m, out);
    }
}
