/* The trace's future for the oracle (sim/future.h). */
#include "sim/future.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"

void sim_future_init(sim_future *f, const trace *tr, const sim_schedule *sch) {
    memset(f, 0, sizeof *f);
    f->tr = tr;
    f->sch = sch;
    f->L = tr->meta.n_layers;
    f->E = tr->meta.n_experts;
    f->K = tr->meta.top_k;
}

void sim_future_init_requests(sim_future *f, const trace_meta *meta,
                              const trace_request_index *rq, uint32_t batch,
                              uint32_t max_step_tokens, sim_future_rows rows, void *ctx) {
    memset(f, 0, sizeof *f);
    f->L = meta->n_layers;
    f->E = meta->n_experts;
    f->K = meta->top_k;
    f->rq = rq;
    f->batch = batch;
    f->max_step_tokens = max_step_tokens;
    sim_future_set_rows(f, rows, ctx);
}

void sim_future_set_rows(sim_future *f, sim_future_rows rows, void *ctx) {
    f->rows = rows;
    f->rows_ctx = ctx;
}

/* The routing of `token` at `layer`: [K]. */
static const uint16_t *experts_of(const sim_future *f, uint64_t token, uint32_t layer) {
    if (!f->rows) return trace_experts(f->tr, token, layer);
    uint64_t local;
    const trace *b = f->rows(f->rows_ctx, token, &local);
    return trace_experts(b, local, layer);
}

void sim_future_free(sim_future *f) {
    sim_schedule_iter_free(&f->win);
    free(f->win_tokens);
    free(f->use_pos32);
    free(f->use_pos64);
    free(f->use_first);
    free(f->use_cur);
    free(f->stamp);
    memset(f, 0, sizeof *f);
}

/* The accesses of one step's tokens, layer by layer, slot by slot. */
static void visit_step(sim_future *f, const uint32_t *tokens, uint32_t n,
                       void (*visit)(sim_future *, size_t, uint64_t *), uint64_t *ctx) {
    for (uint32_t l = 0; l < f->L; l++)
        for (uint32_t i = 0; i < n; i++) {
            const uint16_t *ex = experts_of(f, tokens[i], l);
            for (uint32_t k = 0; k < f->K; k++)
                if (ex[k] != TRACE_NO_EXPERT) visit(f, (size_t)l * f->E + ex[k], ctx);
        }
}

/* Calls visit(f, le, ctx) for every access in execution order. */
static void for_each_access(sim_future *f, void (*visit)(sim_future *, size_t, uint64_t *),
                            uint64_t *ctx) {
    const sim_schedule *s = f->sch;
    if (s) {
        for (uint64_t st = 0; st < s->n_steps; st++)
            visit_step(f, s->tokens + s->steps[st].first, s->steps[st].n_tokens, visit, ctx);
        return;
    }
    sim_schedule_iter it;
    sim_schedule_iter_init(&it, f->rq, f->batch, 0, 0);
    uint32_t *tokens = moesim_xmalloc(f->max_step_tokens * sizeof *tokens);
    sim_schedule_step sd;
    uint64_t kv;
    while (sim_schedule_next(&it, &sd, &kv, tokens, NULL, NULL))
        visit_step(f, tokens, sd.n_tokens, visit, ctx);
    free(tokens);
    sim_schedule_iter_free(&it);
}

/* Tokens of step `step` (*n of them), or NULL past the last step. */
static const uint32_t *step_tokens(sim_future *f, uint64_t step, uint32_t *n) {
    if (f->sch) {
        if (step >= f->sch->n_steps) return NULL;
        *n = f->sch->steps[step].n_tokens;
        return f->sch->tokens + f->sch->steps[step].first;
    }
    if (!f->win_tokens) {
        sim_schedule_iter_init(&f->win, f->rq, f->batch, 0, 0);
        f->win_tokens = moesim_xmalloc(2 * (size_t)f->max_step_tokens * sizeof *f->win_tokens);
        f->win_step[0] = f->win_step[1] = UINT64_MAX;
    }
    for (;;) {
        for (int h = 0; h < 2; h++)
            if (f->win_step[h] == step) {
                *n = f->win_n[h];
                return f->win_tokens + (size_t)h * f->max_step_tokens;
            }
        /* steps are asked for in order, at most one back: produce the next into the older half */
        MOESIM_ASSERT(f->win.step <= step);
        int h = f->win.step % 2;
        sim_schedule_step sd;
        uint64_t kv;
        if (!sim_schedule_next(&f->win, &sd, &kv, f->win_tokens + (size_t)h * f->max_step_tokens,
                               NULL, NULL))
            return NULL;
        f->win_step[h] = f->win.step - 1;
        f->win_n[h] = sd.n_tokens;
    }
}

static void count_use(sim_future *f, size_t le, uint64_t *ctx) {
    (void)ctx;
    f->use_first[le + 1]++;
}

static void place_use(sim_future *f, size_t le, uint64_t *pos) {
    uint64_t at = f->use_cur[le]++;
    if (f->use_pos32)
        f->use_pos32[at] = (uint32_t)(*pos)++;
    else
        f->use_pos64[at] = (*pos)++;
}

static void build(sim_future *f) {
    size_t LE = (size_t)f->L * f->E;
    f->use_first = moesim_xcalloc(LE + 1, sizeof *f->use_first);
    f->use_cur = moesim_xcalloc(LE ? LE : 1, sizeof *f->use_cur);
    f->stamp = moesim_xcalloc(f->E ? f->E : 1, sizeof *f->stamp);
    for_each_access(f, count_use, NULL);
    for (size_t i = 0; i < LE; i++) f->use_first[i + 1] += f->use_first[i];
    uint64_t total = f->use_first[LE];
    if (total < UINT32_MAX)
        f->use_pos32 = moesim_xcalloc(total ? total : 1, sizeof *f->use_pos32);
    else
        f->use_pos64 = moesim_xcalloc(total, sizeof *f->use_pos64);
    memcpy(f->use_cur, f->use_first, LE * sizeof *f->use_cur);
    uint64_t pos = 0;
    for_each_access(f, place_use, &pos);
    memcpy(f->use_cur, f->use_first, LE * sizeof *f->use_cur);
    f->built = true;
}

static uint64_t use_pos_at(const sim_future *f, uint64_t i) {
    return f->use_pos32 ? f->use_pos32[i] : f->use_pos64[i];
}

uint64_t sim_future_next_use(sim_future *f, uint32_t layer, uint32_t expert, uint64_t pos) {
    MOESIM_ASSERT(layer < f->L && expert < f->E);
    if (!f->built) build(f);
    size_t le = (size_t)layer * f->E + expert;
    uint64_t end = f->use_first[le + 1];
    while (f->use_cur[le] < end && use_pos_at(f, f->use_cur[le]) < pos) f->use_cur[le]++;
    if (f->use_cur[le] == end) return UINT64_MAX;
    return use_pos_at(f, f->use_cur[le]) - pos;
}

uint32_t sim_future_active(sim_future *f, uint64_t step, uint32_t layer, uint16_t *ids,
                           uint32_t cap) {
    MOESIM_ASSERT(layer < f->L);
    uint32_t n_tok;
    const uint32_t *tokens = step_tokens(f, step, &n_tok);
    if (!tokens) return 0;
    if (!f->built) build(f);
    uint32_t gen = ++f->stamp_gen;
    uint32_t n = 0;
    uint16_t found[MODEL_MAX_EXPERTS];
    for (uint32_t i = 0; i < n_tok; i++) {
        const uint16_t *ex = experts_of(f, tokens[i], layer);
        for (uint32_t k = 0; k < f->K; k++) {
            if (ex[k] == TRACE_NO_EXPERT || f->stamp[ex[k]] == gen) continue;
            f->stamp[ex[k]] = gen;
            found[n++] = ex[k];
        }
    }
    for (uint32_t i = 1; i < n; i++) { /* ascending ids (n <= E, usually a handful) */
        uint16_t v = found[i];
        uint32_t j = i;
        while (j > 0 && found[j - 1] > v) {
            found[j] = found[j - 1];
            j--;
        }
        found[j] = v;
    }
    memcpy(ids, found, (n < cap ? n : cap) * sizeof *ids);
    return n;
}
