/* Evaluators of sweep configurations (sweep.h): the dispatch by name, and "trace-stats", which
 * reads the LRU and Belady-OPT hit rates of a per-layer cache of `stats.capacity` experts (or
 * `stats.capacity_share` of the layer's experts, rounded, at least 1) off
 * trace_stats_compute (traces/STATS.md) — the curves of `moesim trace stats`, one row per
 * (trace, capacity). Every trace is read and summarized once, before any configuration runs. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/config.h"
#include "sweep/sweep.h"
#include "sweep/sweep_internal.h"
#include "traces/stats.h"
#include "traces/trace.h"

static const char *const stats_metric_names[] = {
    "experts",        /* routed experts per layer (E) of the trace */
    "top_k",          /* experts chosen per token */
    "capacity",       /* experts per layer the cache holds */
    "capacity_share", /* capacity / E */
    "lru_hit_rate",   /* hits / accesses over all layers, LRU cache of the capacity */
    "opt_hit_rate",   /* same under Belady's OPT (the bound any policy meets) */
};

typedef struct stats_ctx {
    size_t n;
    char **paths;        /* [n] distinct trace paths */
    trace_stats **stats; /* [n] */
} stats_ctx;

static void stats_destroy(void *ctx) {
    stats_ctx *c = ctx;
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->paths[i]);
        trace_stats_destroy(c->stats[i]);
    }
    free(c->paths);
    free(c->stats);
    free(c);
}

/* The capacity in experts per layer: stats.capacity, or round(stats.capacity_share * E) >= 1. */
static moesim_status stats_capacity(const sweep_experiment *e, const sweep_point *p,
                                    uint32_t n_experts, uint64_t *cap, moesim_error *err) {
    const char *count = sweep_point_get(e, p, "stats.capacity");
    const char *share = sweep_point_get(e, p, "stats.capacity_share");
    if ((count != NULL) == (share != NULL))
        return moesim_fail(err, MOESIM_EINPUT,
                           "configuration %zu: set exactly one of stats.capacity and "
                           "stats.capacity_share",
                           p->index);
    if (count) {
        int col = sweep_experiment_column_index(e, "stats.capacity");
        if (!config_parse_u64(count, cap) || *cap < 1 || *cap > n_experts)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: stats.capacity: expected an integer in [1, %" PRIu32
                               "] (the trace's experts per layer), got '%s'",
                               p->origins[col], n_experts, count);
        return MOESIM_OK;
    }
    double s;
    int col = sweep_experiment_column_index(e, "stats.capacity_share");
    if (!config_parse_f64(share, &s) || !(s > 0) || s > 1)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: stats.capacity_share: expected a share in (0, 1], got '%s'",
                           p->origins[col], share);
    double c = floor(s * n_experts + 0.5);
    *cap = c < 1 ? 1 : (uint64_t)c;
    return MOESIM_OK;
}

static moesim_status stats_run(void *ctx, const sweep_experiment *e, const sweep_point *p,
                               double *metrics, char *note, size_t note_len, moesim_error *err) {
    (void)note;
    (void)note_len;
    const stats_ctx *c = ctx;
    const char *path = sweep_point_get(e, p, "trace");
    const trace_stats *s = NULL;
    for (size_t i = 0; i < c->n && !s; i++)
        if (!strcmp(c->paths[i], path)) s = c->stats[i];
    if (!s) return moesim_fail(err, MOESIM_EINPUT, "%s: trace not loaded", path);
    uint64_t cap;
    moesim_status st = stats_capacity(e, p, s->experts, &cap, err);
    if (st) return st;
    metrics[0] = s->experts;
    metrics[1] = s->top_k;
    metrics[2] = (double)cap;
    metrics[3] = (double)cap / s->experts;
    metrics[4] = s->lru_hit_rate[cap];
    metrics[5] = s->opt_hit_rate[cap];
    return MOESIM_OK;
}

moesim_status sweep_eval_stats_create(const sweep_experiment *e, sweep_evaluator *out,
                                      moesim_error *err) {
    stats_ctx *c = moesim_xcalloc(1, sizeof *c);
    *out = (sweep_evaluator){.name = "trace-stats",
                             .n_metrics = sizeof stats_metric_names / sizeof *stats_metric_names,
                             .metric_names = stats_metric_names,
                             .ctx = c,
                             .run = stats_run,
                             .destroy = stats_destroy};
    for (size_t i = 0; i < sweep_experiment_count(e); i++) {
        const char *path = sweep_point_get(e, sweep_experiment_point(e, i), "trace");
        bool seen = false;
        for (size_t j = 0; j < c->n && !seen; j++) seen = !strcmp(c->paths[j], path);
        if (seen) continue;
        trace *t = NULL;
        char file[PATH_MAX];
        sweep_experiment_input_path(e, "trace", path, file, sizeof file);
        moesim_status st = trace_read(file, &t, err);
        if (st) {
            stats_destroy(c);
            out->ctx = NULL;
            return st;
        }
        c->paths = moesim_xrealloc(c->paths, (c->n + 1) * sizeof *c->paths);
        c->stats = moesim_xrealloc(c->stats, (c->n + 1) * sizeof *c->stats);
        c->paths[c->n] = moesim_xstrdup(path);
        c->stats[c->n] = trace_stats_compute(t);
        c->n++;
        trace_destroy(t);
    }
    return MOESIM_OK;
}

moesim_status sweep_evaluator_create(const sweep_experiment *e, sweep_evaluator *out,
                                     moesim_error *err) {
    memset(out, 0, sizeof *out);
    if (!strcmp(sweep_experiment_evaluator(e), "trace-stats"))
        return sweep_eval_stats_create(e, out, err);
    return sweep_eval_sim_create(e, out, err);
}

void sweep_evaluator_destroy(sweep_evaluator *ev) {
    if (ev->destroy) ev->destroy(ev->ctx);
    memset(ev, 0, sizeof *ev);
}
