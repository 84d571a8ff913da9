/* Per-layer hit curves over the simulator's step routes (sim/batch_curves.h). */
#include "sim/batch_curves.h"

#include <math.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "common/check.h"
#include "core/schedule.h"
#include "traces/stats.h"

/* Layer `l`'s access sequence in execution order, cut into the schedule's step routes (steps
 * with no recorded row at this layer give no route). Returns the number of routes. */
static size_t layer_routes(const trace *t, const sim_schedule *s, uint32_t l, uint16_t *seq,
                           uint32_t *len, size_t *n_out) {
    const uint32_t K = t->meta.top_k;
    size_t n = 0, n_routes = 0;
    for (uint64_t st = 0; st < s->n_steps; st++) {
        const sim_schedule_step *step = &s->steps[st];
        size_t start = n;
        for (uint32_t i = 0; i < step->n_tokens; i++) {
            const uint16_t *ids = trace_experts(t, s->tokens[step->first + i], l);
            for (uint32_t j = 0; j < K; j++)
                if (ids[j] != TRACE_NO_EXPERT) seq[n++] = ids[j];
        }
        if (n > start) len[n_routes++] = (uint32_t)(n - start);
    }
    *n_out = n;
    return n_routes;
}

void sim_batch_curves_compute(const trace *t, uint32_t batch, sim_batch_curves *out) {
    MOESIM_ASSERT(batch >= 1);
    const uint32_t L = t->meta.n_layers, E = t->meta.n_experts, K = t->meta.top_k;
    sim_schedule s;
    sim_schedule_build(&s, t, batch, 0, 0);
    uint16_t *seq = moesim_xcalloc((size_t)t->n_tokens * K + 1, sizeof *seq);
    uint32_t *len = moesim_xcalloc(s.n_steps + 1, sizeof *len);
    uint64_t *layer_lru = moesim_xcalloc((size_t)E + 1, sizeof *layer_lru);
    uint64_t *layer_opt = moesim_xcalloc((size_t)E + 1, sizeof *layer_opt);
    uint64_t *lru = moesim_xcalloc((size_t)E + 1, sizeof *lru);
    uint64_t *opt = moesim_xcalloc((size_t)E + 1, sizeof *opt);
    *out = (sim_batch_curves){.batch = batch, .n_experts = E, .steps = s.n_steps};
    for (uint32_t l = 0; l < L; l++) {
        size_t n;
        size_t n_routes = layer_routes(t, &s, l, seq, len, &n);
        if (n == 0) continue;
        out->accesses += n;
        uint32_t widest =
            trace_stats_route_hit_counts(seq, n, len, n_routes, E, layer_lru, layer_opt);
        for (uint32_t c = 0; c <= E; c++) {
            lru[c] += layer_lru[c];
            opt[c] += layer_opt[c];
        }
        if (widest > out->from) out->from = widest;
    }
    out->lru = moesim_xcalloc((size_t)E + 1, sizeof *out->lru);
    out->opt = moesim_xcalloc((size_t)E + 1, sizeof *out->opt);
    for (uint32_t c = 0; c <= E; c++) {
        bool valid = out->accesses > 0 && c >= out->from && c > 0;
        out->lru[c] = valid ? (double)lru[c] / (double)out->accesses : NAN;
        out->opt[c] = valid ? (double)opt[c] / (double)out->accesses : NAN;
    }
    free(opt);
    free(lru);
    free(layer_opt);
    free(layer_lru);
    free(len);
    free(seq);
    sim_schedule_free(&s);
}

void sim_batch_curves_free(sim_batch_curves *c) {
    free(c->lru);
    free(c->opt);
    *c = (sim_batch_curves){0};
}
