/* Fitting the synthesizer's knobs to a trace (traces/synth_fit.h; the method and its limits:
 * traces/SYNTH.md, "Fitting to a trace").
 *
 * Popularity is a table: each topic (a run of consecutive real requests) draws from the expert
 * counts of its requests in the token's phase (prefill, decode), mixed with the layer's overall
 * counts (popularity_smoothing), turned into drawing weights (pl_weight) and raised to
 * popularity_sharpness_* (a depth profile); requests take the topics in turn from the first
 * (topic_cycle).
 * Routing knobs are fitted by simulated moments: a simulation is synth_generate with the real
 * trace's shape (SYNTH_FIT_SCALE times its requests, fewer for a long trace, its length ranges,
 * its decode batch) and the fixed seed FIT_SEED, then the fast per-layer statistics
 * (traces/synth_moments.h; trace_stats_compute only where OPT curves or the active share are
 * read) and the moments a bisection needs; each knob is bisected on its statistic (monotone in
 * it) with the others held, in sweeps over all of them, the later sweeps in a shrinking window
 * around each knob's value. The locality knobs and the sharpness are per layer: every layer's
 * value is bisected at once on its own layer's statistic (layers route independently), and the
 * history reach is chosen per layer. The execution order of batched runs is traces/synth_order.c,
 * knob files traces/synth_knobs_file.c, the real-vs-synthetic rows traces/synth_compare.c.
 *
 * The real trace is read once (fit_source: a stream's blocks, or a trace in memory, the same fit
 * bit for bit): trace_stats by its own passes, everything else in one forward pass (read_real)
 * that keeps per request in flight its previous token, nothing per token.
 *
 * Units: probabilities and shares in [0, 1]; logits and log-popularity in nats. */
#include "traces/synth_fit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "traces/stats.h"
#include "traces/synth_moments.h"

#define FIT_SEED        1  /* seed of every simulation: the fit is a function of the trace */
#define FIT_SWEEPS      6  /* sweeps over the routing knobs */
#define FIT_BISECT      10 /* halvings per knob per sweep (range / 1024) */
#define FIT_BISECT_H    6  /* halvings per history knob while choosing reuse_history_tokens */
#define FIT_AVOID_REACH 8  /* the longest history reach tried with avoidance */
#define FIT_MAX_CELLS   (1u << 22) /* token x layer records per simulation at most */
#define FIT_SIM_CELLS   (1u << 16) /* records a simulation needs at least (fewer copies above) */
#define FIT_SIM_TOKENS  8192       /* and tokens */
#define N_DEPTH         3          /* profile points: first, mid, last */
#define PL_MAX_SHARE    (1 - 1e-6) /* an expert in every row of a topic: a finite weight */

static const char *const depth_names[N_DEPTH] = {"first", "mid", "last"};
/* reuse_history_tokens tried (the second sweep keeps the one closest on the hit-rate curves) */
static const uint32_t history_lengths[] = {1, 2, 4, 8, 16, 32, 64};

/* ---- the statistics knobs are fitted to ---- */

typedef enum fit_stat {
    STAT_GINI,           /* per layer, hat-weighted */
    STAT_REUSE_TOP1,     /* per layer, hat-weighted */
    STAT_REUSE_ANY,      /* per layer, hat-weighted */
    STAT_LRU,            /* per layer: mean LRU hit rate over capacities k..E-1, hat-weighted */
    STAT_REQUEST_GINI,   /* fit_moments */
    STAT_REPEAT,         /* fit_moments */
    STAT_SHARED_PREFILL, /* fit_moments, per layer, hat-weighted */
    STAT_SHARED_DECODE,  /* fit_moments, per layer, hat-weighted */
    STAT_ACTIVE,         /* mean active share over the batch sizes >= 2 the real trace has */
    STAT_GATE_TOP1,
    STAT_GATE_SUM,
    STAT_IMP_SINK,
    STAT_IMP_SIGMA,
    STAT_IMP_RHO,
} fit_stat;

/* Weight of layer l (of L) in depth-profile point g: the profile's own hat function. */
static double hat_weight(uint32_t l, uint32_t L, int g) {
    if (L <= 1) return g == 1;
    const double x = (double)l / (double)(L - 1);
    if (g == 0) return x < 0.5 ? 1 - 2 * x : 0;
    if (g == 2) return x > 0.5 ? 2 * x - 1 : 0;
    return 1 - fabs(1 - 2 * x);
}

/* A per-layer statistic at layer l; NaN where the layer has none. */
static double layer_value(const fit_layer_stats *ls, const fit_moments *mo, uint32_t l,
                          fit_stat st) {
    switch (st) {
    case STAT_GINI:
        return ls->gini[l];
    case STAT_REUSE_TOP1:
        return ls->reuse_top1[l];
    case STAT_REUSE_ANY:
        return ls->reuse_any[l];
    case STAT_LRU:
        return ls->lru_mean[l];
    case STAT_SHARED_PREFILL:
        return mo->shared[0][l];
    case STAT_SHARED_DECODE:
        return mo->shared[1][l];
    default:
        MOESIM_UNREACHABLE();
    }
}

/* The statistic (depth point g for per-layer ones) of a trace; NaN where it has none. `s` (the
 * full statistics) is read for the active share only. */
static double stat_value(const trace_stats *s, const fit_layer_stats *ls, const fit_moments *mo,
                         uint32_t L, const bool *batches, fit_stat st, int g) {
    switch (st) {
    case STAT_REQUEST_GINI:
        return mo->request_gini;
    case STAT_REPEAT:
        return mo->repeat_share;
    case STAT_GATE_TOP1:
        return mo->gate_top1;
    case STAT_GATE_SUM:
        return mo->gate_sum;
    case STAT_IMP_SINK:
        return mo->imp_sink;
    case STAT_IMP_SIGMA:
        return mo->imp_sigma;
    case STAT_IMP_RHO:
        return mo->imp_rho;
    case STAT_ACTIVE: {
        double sum = 0;
        int n = 0;
        MOESIM_ASSERT(s);
        for (int b = 1; b < STATS_N_BATCH; b++)
            if (batches[b] && !isnan(s->active_share[b])) sum += s->active_share[b], n++;
        return n ? sum / n : NAN;
    }
    default:
        break;
    }
    double sum = 0, w = 0;
    for (uint32_t l = 0; l < L; l++) {
        const double x = layer_value(ls, mo, l, st);
        const double h = hat_weight(l, L, g);
        if (h > 0 && !isnan(x)) sum += h * x, w += h;
    }
    return w > 0 ? sum / w : NAN;
}

/* ---- simulations ---- */

typedef struct fit_ctx {
    const model_geometry *m;
    synth_options o; /* the knobs being fitted; the simulation's shape */
    uint32_t interleave;
    bool batches[STATS_N_BATCH]; /* batch sizes the real trace has */
    uint32_t L;
    const trace_stats *real;
    fit_layer_stats real_ls;
    fit_moments real_mo;
    trace_stats *sim;       /* the last full simulation's statistics (NULL: none yet) */
    fit_layer_stats sim_ls; /* the last simulation's per-layer statistics */
    fit_moments sim_mo;
    /* per-layer knobs: [SYNTH_LAYER_KNOBS][L] (c->o.layer_knobs), and the sharpness [L] */
    double *layer_knobs;
    double sharpness[MODEL_MAX_LAYERS];
    /* [L] the layer's history knob is searched below 0 (avoidance), else above; chosen with the
     * history reach */
    bool avoid[MODEL_MAX_LAYERS];
    uint32_t simulations;
    double window; /* share of a knob's range bisect searches, centred on its value (1: all) */
    /* the fitted popularity table: real counts per (topic, layer, expert), smoothed */
    uint32_t T;      /* topics: min(real requests, 64), each a run of consecutive requests */
    double *counts;  /* [T][P][L][E] activations in the topic's requests, per phase */
    double *overall; /* [L][E] the layer's share of each expert over the whole trace */
    float *table;    /* [T][P][L][E] what the simulation draws from (c->o.popularity) */
} fit_ctx;

/* Plackett-Luce weight under which an expert is among the k drawn with probability pi (its
 * share of the rows): drawing without replacement flattens the weights (the busiest expert
 * fills at most one slot of a row), so weights proportional to the counts come out flatter
 * than counted. Rosen's approximation for successive sampling, pi = 1 - exp(-tau w), inverted
 * (tau = 1: the weights are normalized afterwards); for k = 1 one draw is exact, w = pi. */
static double pl_weight(double pi, uint32_t k) {
    if (k == 1) return pi;
    return -log1p(-(pi < PL_MAX_SHARE ? pi : PL_MAX_SHARE));
}

/* The table from the counts with the current popularity_smoothing s and popularity_sharpness_*
 * g (at layer l): topic t's row at phase p and layer l is proportional to pl_weight(its share of
 * the rows)^g, the share from its counts + s * (mean activations of a topic at p, l) * the layer's
 * overall shares + a floor that keeps every expert possible. */
static void table_build(fit_ctx *c) {
    const uint32_t L = c->m->n_moe_layers, E = c->m->n_experts, T = c->T, k = c->m->top_k;
    const uint32_t P = SYNTH_TABLE_PHASES;
    const synth_knobs *kn = &c->o.knobs;
    const double s = kn->popularity_smoothing;
    double *w = moesim_xcalloc(E, sizeof *w);
    for (uint32_t ph = 0; ph < P; ph++)
        for (uint32_t l = 0; l < L; l++) {
            const double g = c->sharpness[l];
            double mean = 0;
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t e = 0; e < E; e++)
                    mean += c->counts[(((size_t)t * P + ph) * L + l) * E + e];
            mean /= T;
            const double floor = 1e-6 * (mean > 0 ? mean : 1) / E;
            for (uint32_t t = 0; t < T; t++) {
                const size_t at = (((size_t)t * P + ph) * L + l) * E;
                double counted = 0, total = 0;
                for (uint32_t e = 0; e < E; e++)
                    counted += w[e] =
                        c->counts[at + e] + s * mean * c->overall[(size_t)l * E + e] + floor;
                for (uint32_t e = 0; e < E; e++)
                    total += w[e] = pow(pl_weight(k * w[e] / counted, k), g);
                for (uint32_t e = 0; e < E; e++) c->table[at + e] = (float)(w[e] / total);
            }
        }
    free(w);
}

/* The popularity counts of the real trace's R requests, zero: topics T = min(R, 64). */
static void table_alloc(fit_ctx *c, uint32_t R) {
    const uint32_t L = c->m->n_moe_layers, E = c->m->n_experts, P = SYNTH_TABLE_PHASES;
    c->T = R < 64 ? R : 64;
    const size_t cells = (size_t)c->T * P * L * E;
    c->counts = moesim_xcalloc(cells, sizeof *c->counts);
    c->overall = moesim_xcalloc((size_t)L * E, sizeof *c->overall);
    c->table = moesim_xcalloc(cells, sizeof *c->table);
}

/* Token `i` of block `b` of the real trace (of R requests) into the counts per topic (request r
 * is in topic r * T / R) and phase, and overall. */
static void table_count(fit_ctx *c, const trace *b, uint64_t i, uint32_t R) {
    const uint32_t L = c->m->n_moe_layers, E = c->m->n_experts, k = c->m->top_k;
    const uint32_t P = SYNTH_TABLE_PHASES;
    const uint32_t t = (uint32_t)((uint64_t)b->request_id[i] * c->T / R);
    const uint32_t ph = b->phase[i] == TRACE_DECODE;
    for (uint32_t l = 0; l < L; l++) {
        const uint16_t *ids = trace_experts(b, i, l);
        if (!fit_row_recorded(ids)) continue;
        for (uint32_t j = 0; j < k; j++) {
            c->counts[(((size_t)t * P + ph) * L + l) * E + ids[j]]++;
            c->overall[(size_t)l * E + ids[j]]++;
        }
    }
}

/* The table from the counts of every token (R requests). A topic without rows of one phase (a
 * decode-only log has no prefill) counts its other phase's there. */
static void table_init(fit_ctx *c, uint32_t R) {
    const uint32_t L = c->m->n_moe_layers, E = c->m->n_experts, P = SYNTH_TABLE_PHASES;
    const size_t phase_cells = (size_t)L * E; /* one phase of one topic */
    for (uint32_t t = 0; t < c->T; t++)
        for (uint32_t ph = 0; ph < P; ph++) {
            double *own = c->counts + ((size_t)t * P + ph) * phase_cells;
            const double *other = c->counts + ((size_t)t * P + (P - 1 - ph)) * phase_cells;
            double sum = 0;
            for (size_t i = 0; i < phase_cells; i++) sum += own[i];
            if (sum == 0) memcpy(own, other, phase_cells * sizeof *own);
        }
    for (uint32_t l = 0; l < L; l++) {
        double sum = 0;
        for (uint32_t e = 0; e < E; e++) sum += c->overall[(size_t)l * E + e];
        for (uint32_t e = 0; e < E; e++) c->overall[(size_t)l * E + e] /= sum > 0 ? sum : 1;
    }
    c->o.knobs.topics = c->T;
    c->o.knobs.topic_cycle = 1; /* requests take the real trace's runs of requests in turn */
    if (c->T == R) c->o.knobs.topic_persistence = 0; /* one_request_a_topic */
    c->o.popularity = c->table;
    c->o.popularity_topics = c->T;
    table_build(c);
}

/* One simulation with the current knobs: its per-layer statistics, and the routing moments
 * `which` (FIT_MOMENT_*); `full` adds trace_stats (OPT curves, active share) and every moment
 * (gates, importance). */
static void simulate(fit_ctx *c, bool full, unsigned which) {
    table_build(c); /* popularity_smoothing may have changed */
    trace *t = NULL;
    moesim_error err = {0};
    /* the options were checked once; every knob stays inside its range */
    MOESIM_ASSERT(synth_generate_interleaved(c->m, &c->o, c->interleave, &t, &err) == MOESIM_OK);
    fit_stats_compute(t, FIT_LAYER_STATS | (full ? FIT_MOMENTS_ALL : which), &c->sim_ls,
                      &c->sim_mo);
    if (full) {
        trace_stats_destroy(c->sim);
        c->sim = trace_stats_compute(t);
    }
    trace_destroy(t);
    c->simulations++;
}

/* The routing moments statistic `st` reads. */
static unsigned moments_of(fit_stat st) {
    return st == STAT_REQUEST_GINI                                 ? FIT_MOMENT_REQUEST_GINI
           : st == STAT_REPEAT                                     ? FIT_MOMENT_REPEAT
           : st == STAT_SHARED_PREFILL || st == STAT_SHARED_DECODE ? FIT_MOMENT_SHARED
                                                                   : 0;
}

/* Which statistics need the full simulation. */
static bool stat_needs_full(fit_stat st) { return st == STAT_ACTIVE || st >= STAT_GATE_TOP1; }

static double sim_value(fit_ctx *c, fit_stat st, int g) {
    simulate(c, stat_needs_full(st), moments_of(st));
    return stat_value(c->sim, &c->sim_ls, &c->sim_mo, c->L, c->batches, st, g);
}

static double real_value(const fit_ctx *c, fit_stat st, int g) {
    return stat_value(c->real, &c->real_ls, &c->real_mo, c->L, c->batches, st, g);
}

/* Bisects *knob in [lo, hi] until the simulated statistic (increasing in the knob, or
 * decreasing) meets the real one; leaves the knob where they met. No-op when the real trace
 * lacks the statistic. Returns whether it fitted. */
static bool bisect(fit_ctx *c, double *knob, double lo, double hi, bool increasing, fit_stat st,
                   int g, int halvings) {
    const double target = real_value(c, st, g);
    if (isnan(target)) return false;
    const double half = 0.5 * c->window * (hi - lo); /* later sweeps: around the knob's value */
    if (*knob - half > lo) lo = *knob - half;
    if (*knob + half < hi) hi = *knob + half;
    for (int i = 0; i < halvings; i++) {
        *knob = 0.5 * (lo + hi);
        const double v = sim_value(c, st, g);
        if (isnan(v)) break;
        if ((v < target) == increasing)
            lo = *knob;
        else
            hi = *knob;
    }
    *knob = 0.5 * (lo + hi);
    return true;
}

/* Bisects every layer's value v[l] of a per-layer knob at once, each on its own layer's
 * statistic: layers route independently of each other, so one simulation per halving moves
 * every layer toward its own target (a depth profile of three points could not follow layers
 * that differ: the Mixtral log's reuse any runs from 0.41 to 0.77 between neighbours). Layers
 * without the statistic keep their value. */
static void bisect_layers2(fit_ctx *c, double *v0, fit_stat st0, double *v1, fit_stat st1,
                           const bool *only, double lo, double hi, int halvings);

static void bisect_layers(fit_ctx *c, double *v, double lo, double hi, bool increasing, fit_stat st,
                          int halvings) {
    MOESIM_ASSERT(increasing); /* every per-layer knob raises its statistic */
    bisect_layers2(c, v, st, NULL, st, NULL, lo, hi, halvings);
}

/* The same for the layers `only` marks; the others keep their values. */
static void bisect_layers_only(fit_ctx *c, double *v, const bool *only, double lo, double hi,
                               fit_stat st, int halvings) {
    bisect_layers2(c, v, st, NULL, st, only, lo, hi, halvings);
}

/* The same for two knobs at once, each on its own statistic (v1 NULL: one), where neither
 * moves the other's: the prompt and decode row copies. */
static void bisect_layers2(fit_ctx *c, double *v0, fit_stat st0, double *v1, fit_stat st1,
                           const bool *only, double lo, double hi, int halvings) {
    const uint32_t L = c->L;
    double *v[2] = {v0, v1};
    const fit_stat st[2] = {st0, st1};
    double a[2][MODEL_MAX_LAYERS], b[2][MODEL_MAX_LAYERS], target[2][MODEL_MAX_LAYERS];
    const double half = 0.5 * c->window * (hi - lo);
    bool any = false;
    for (int q = 0; q < 2; q++)
        for (uint32_t l = 0; l < L; l++) {
            target[q][l] =
                v[q] && (!only || only[l]) ? layer_value(&c->real_ls, &c->real_mo, l, st[q]) : NAN;
            if (isnan(target[q][l])) continue;
            a[q][l] = v[q][l] - half > lo ? v[q][l] - half : lo;
            b[q][l] = v[q][l] + half < hi ? v[q][l] + half : hi;
            any = true;
        }
    if (!any) return;
    for (int i = 0; i < halvings; i++) {
        for (int q = 0; q < 2; q++)
            for (uint32_t l = 0; l < L; l++)
                if (!isnan(target[q][l])) v[q][l] = 0.5 * (a[q][l] + b[q][l]);
        simulate(c, false, moments_of(st[0]) | moments_of(st[1]));
        for (int q = 0; q < 2; q++)
            for (uint32_t l = 0; l < L; l++) {
                const double x = layer_value(&c->sim_ls, &c->sim_mo, l, st[q]);
                if (isnan(target[q][l]) || isnan(x)) continue;
                if (x < target[q][l])
                    a[q][l] = v[q][l];
                else
                    b[q][l] = v[q][l];
            }
    }
    for (int q = 0; q < 2; q++)
        for (uint32_t l = 0; l < L; l++)
            if (!isnan(target[q][l])) v[q][l] = 0.5 * (a[q][l] + b[q][l]);
}

/* How far the simulation (a full one) is from the real trace on what the history knobs trade
 * against each other: the worst gap of the per-layer LRU and OPT curves (capacities k..E) and
 * of reuse any. */
static double locality_gap(const fit_ctx *c) {
    double worst = fabs(c->sim->reuse_any - c->real->reuse_any);
    for (uint32_t l = 0; l < c->L; l++) {
        const layer_stats *x = &c->sim->per_layer[l], *y = &c->real->per_layer[l];
        if (!x->accesses || !y->accesses) continue;
        for (uint32_t cap = c->real->top_k; cap <= c->real->experts; cap++) {
            const double lru = fabs(x->lru_hit_rate[cap] - y->lru_hit_rate[cap]);
            const double opt = fabs(x->opt_hit_rate[cap] - y->opt_hit_rate[cap]);
            worst = lru > worst ? lru : worst;
            worst = opt > worst ? opt : worst;
        }
    }
    return worst;
}

/* The same at one layer: its LRU and OPT curves (k..E) and its reuse any. */
static double layer_locality_gap(const fit_ctx *c, uint32_t l) {
    const layer_stats *x = &c->sim->per_layer[l], *y = &c->real->per_layer[l];
    if (!x->accesses || !y->accesses) return NAN;
    double worst = x->reuse_pairs && y->reuse_pairs ? fabs(x->reuse_any - y->reuse_any) : 0;
    for (uint32_t cap = c->real->top_k; cap <= c->real->experts; cap++) {
        const double lru = fabs(x->lru_hit_rate[cap] - y->lru_hit_rate[cap]);
        const double opt = fabs(x->opt_hit_rate[cap] - y->opt_hit_rate[cap]);
        worst = lru > worst ? lru : worst;
        worst = opt > worst ? opt : worst;
    }
    return worst;
}

/* Knob `k`'s per-layer values [L]. */
static double *layer_knob(fit_ctx *c, synth_layer_knob k) {
    return c->layer_knobs + (size_t)k * c->L;
}

static double *depth_knob(synth_knobs *k, const char *base, int g) {
    char name[48];
    snprintf(name, sizeof name, "%s_%s", base, depth_names[g]);
    for (size_t i = 0; i < synth_knob_count; i++)
        if (!strcmp(synth_knob_table[i].name, name))
            return (double *)((char *)k + synth_knob_table[i].offset);
    MOESIM_UNREACHABLE();
}

/* History copies in [0, 1], or, at the layers that avoid their history (c->avoid), the
 * avoidance in [-1, 0]. */
static void fit_history(fit_ctx *c, int halvings) {
    double *v = layer_knob(c, SYNTH_LK_REUSE_HISTORY);
    bool copy[MODEL_MAX_LAYERS], any_copy = false, any_avoid = false;
    for (uint32_t l = 0; l < c->L; l++) {
        copy[l] = !c->avoid[l];
        any_copy |= copy[l], any_avoid |= c->avoid[l];
        if (c->avoid[l] ? v[l] > 0 : v[l] < 0) v[l] = 0; /* a side just chosen starts at 0 */
    }
    if (any_copy) bisect_layers_only(c, v, copy, 0, 1, STAT_LRU, halvings);
    if (any_avoid) bisect_layers_only(c, v, c->avoid, -1, 0, STAT_LRU, halvings);
}

/* Top-1 copies in [0, 1]; a layer whose real reuse top-1 is below what drawing alone gives
 * (its copies went to 0) then gets the repulsion, [-1, 0]: anti-locality. Two stages rather
 * than one search of [-1, 1], so that traces with locality are fitted as before. */
static void fit_reuse_top1(fit_ctx *c) {
    double *v = layer_knob(c, SYNTH_LK_REUSE_TOP1);
    bool local[MODEL_MAX_LAYERS], below[MODEL_MAX_LAYERS], any = false;
    for (uint32_t l = 0; l < c->L; l++) local[l] = v[l] >= 0;
    bisect_layers_only(c, v, local, 0, 1, STAT_REUSE_TOP1, FIT_BISECT);
    for (uint32_t l = 0; l < c->L; l++) any |= below[l] = v[l] < ldexp(1.0, -FIT_BISECT);
    if (any) bisect_layers_only(c, v, below, -1, 0, STAT_REUSE_TOP1, FIT_BISECT);
}

static void fit_reuse_other(fit_ctx *c, int halvings) {
    bisect_layers(c, layer_knob(c, SYNTH_LK_REUSE_OTHER), -1, 1, true, STAT_REUSE_ANY, halvings);
}

/* Whole-row copies per phase: to the share of a row's experts its predecessor has, which they
 * raise more than the slot copies (fitted to reuse top-1 and reuse any, both phases together)
 * do. */
static void fit_reuse_row(fit_ctx *c, int halvings) {
    bisect_layers2(c, layer_knob(c, SYNTH_LK_ROW_PREFILL), STAT_SHARED_PREFILL,
                   layer_knob(c, SYNTH_LK_ROW_DECODE), STAT_SHARED_DECODE, NULL, 0, 1, halvings);
}

/* Whether each topic of the table is one real request: then the requests, taking the topics in
 * turn from the first with topic_persistence = 0, replay the real requests in their order, and
 * requests that run together (a batch) are those that ran together in the real trace. A
 * persistence above 0 would shift them against the real batches (measured on the golden Qwen3
 * trace in batches of 4: the LRU curve 0.04 high at 4-5 experts), so it stays 0. */
static bool one_request_a_topic(const fit_ctx *c) { return c->T == c->real->requests; }

/* One sweep over the routing knobs; `choose_history` also tries every history length and
 * keeps the one whose LRU curve is closest to the real one. */
static void routing_sweep(fit_ctx *c, bool choose_history) {
    synth_knobs *k = &c->o.knobs;
    if (real_value(c, STAT_REPEAT, 0) == 0)
        k->repeat_decode_token = 0; /* no repeats: exact at 0, no search */
    else
        bisect(c, &k->repeat_decode_token, 0, 1, true, STAT_REPEAT, 0, FIT_BISECT);
    bisect_layers(c, c->sharpness, 0.1, 8, true, STAT_GINI, FIT_BISECT + 2);
    bisect(c, &k->popularity_smoothing, 0, 64, false, STAT_REQUEST_GINI, 0, FIT_BISECT + 2);
    if (!one_request_a_topic(c))
        bisect(c, &k->topic_persistence, 0, 1, false, STAT_ACTIVE, 0, FIT_BISECT);
    fit_reuse_top1(c);
    fit_reuse_other(c, FIT_BISECT);
    fit_reuse_row(c, FIT_BISECT);
    if (choose_history && !isnan(real_value(c, STAT_LRU, 1))) {
        /* copies from far back raise the hit rates of large caches, from near back those of
         * small ones and reuse between consecutive tokens: the reach decides the balance, per
         * layer (layers route independently: each keeps the reach, and the knobs fitted with
         * it, whose curves came closest to its own) */
        const uint32_t L = c->L;
        const size_t n_lk = (size_t)SYNTH_LAYER_KNOBS * L;
        double *start = moesim_xmalloc(n_lk * sizeof *start);
        double *best = moesim_xmalloc(n_lk * sizeof *best);
        double best_gap[MODEL_MAX_LAYERS];
        bool best_avoid[MODEL_MAX_LAYERS];
        memcpy(start, c->layer_knobs, n_lk * sizeof *start);
        memcpy(best, start, n_lk * sizeof *best);
        for (uint32_t l = 0; l < L; l++) best_gap[l] = INFINITY, best_avoid[l] = false;
        k->reuse_history_tokens = history_lengths[MOESIM_ARRAY_LEN(history_lengths) - 1];
        /* each reach with copies, and the short ones also with avoidance: a layer avoids its
         * history only where that brings its own curves closer than any copies do (searched
         * below 0 for every layer, noise alone sent layers with no history at all there) */
        for (size_t i = 0; i < 2 * MOESIM_ARRAY_LEN(history_lengths); i++) {
            const size_t at = i % MOESIM_ARRAY_LEN(history_lengths);
            const bool avoid = i >= MOESIM_ARRAY_LEN(history_lengths);
            if (avoid && history_lengths[at] > FIT_AVOID_REACH) continue;
            memcpy(c->layer_knobs, start, n_lk * sizeof *start);
            double *reach = layer_knob(c, SYNTH_LK_HISTORY_TOKENS);
            for (uint32_t l = 0; l < L; l++) reach[l] = history_lengths[at], c->avoid[l] = avoid;
            fit_history(c, FIT_BISECT_H);
            fit_reuse_other(c, FIT_BISECT_H);
            fit_reuse_row(c, FIT_BISECT_H);
            simulate(c, true, 0);
            for (uint32_t l = 0; l < L; l++) {
                /* avoidance must bring the curves closer by more than the sampling error of a
                 * real hit rate against a simulated one (twice its largest standard deviation),
                 * or it fits the real trace's noise: on traces made without it, it was taken
                 * where the copies left a layer 0.015 off, and moved the other knobs away from
                 * those the trace was made with */
                const double n_real = (double)c->real->per_layer[l].accesses;
                const double n_sim = (double)c->sim->per_layer[l].accesses;
                const double margin = avoid && !best_avoid[l] ? sqrt(1 / n_real + 1 / n_sim) : 0;
                const double gap = layer_locality_gap(c, l);
                if (!(gap + margin < best_gap[l])) continue;
                best_gap[l] = gap;
                best_avoid[l] = avoid;
                for (int kk = 0; kk < SYNTH_LAYER_KNOBS; kk++)
                    best[(size_t)kk * L + l] = c->layer_knobs[(size_t)kk * L + l];
            }
        }
        memcpy(c->avoid, best_avoid, L * sizeof *best_avoid);
        memcpy(c->layer_knobs, best, n_lk * sizeof *best);
        free(best);
        free(start);
    }
    fit_history(c, FIT_BISECT);
}

/* Gates and importance: independent of the routing (their own RNG use), fitted after it. */
static void fit_gates_and_importance(fit_ctx *c) {
    synth_knobs *k = &c->o.knobs;
    const bool all = c->m->gate_norm == GATE_SOFTMAX_ALL;
    for (int sweep = 0; sweep < (all ? 2 : 1); sweep++) {
        if (c->m->top_k > 1 || all)
            bisect(c, &k->gate_logit_scale, 0.01, 20, true, STAT_GATE_TOP1, 0, FIT_BISECT + 2);
        if (all) bisect(c, &k->gate_tail_gap, -20, 50, true, STAT_GATE_SUM, 0, FIT_BISECT + 2);
    }
    for (int sweep = 0; sweep < 2; sweep++) {
        bisect(c, &k->importance_sink_share, 0, 1, true, STAT_IMP_SINK, 0, FIT_BISECT);
        bisect(c, &k->importance_salience_sigma, 0, 8, true, STAT_IMP_SIGMA, 0, FIT_BISECT);
        bisect(c, &k->importance_layer_correlation, 0, 1, true, STAT_IMP_RHO, 0, FIT_BISECT);
    }
}

/* Look-ahead knobs straight from the real accuracies: the model gives the first candidate
 * right with probability lookahead_top1_d{d} and recall@k = recall_d1 * decay^(d - 1) exactly
 * (SYNTH.md, item 6), so no simulation is needed. */
/* fitted_top1[0..3] (d1, d2, d3, decay), fitted_recall[0..1] (d1, decay): whether each was
 * fitted; at_top1 / at_recall: the distance (0-based) each decay was read at. */
static void fit_lookahead(synth_knobs *k, const trace_stats *s, bool *fitted_top1,
                          bool *fitted_recall, uint32_t *at_top1, uint32_t *at_recall) {
    const uint32_t D = s->lookahead_depth;
    double *top1[3] = {&k->lookahead_top1_d1, &k->lookahead_top1_d2, &k->lookahead_top1_d3};
    for (uint32_t d = 0; d < 3; d++) {
        fitted_top1[d] = d < D && !isnan(s->lookahead_top1[d]);
        if (fitted_top1[d]) *top1[d] = s->lookahead_top1[d];
    }
    fitted_top1[3] = false; /* the decay beyond d = 3: geometric, from the farthest distance */
    for (uint32_t d = D; d-- > 3;)
        if (!isnan(s->lookahead_top1[d]) && fitted_top1[2] && s->lookahead_top1[2] > 0) {
            const double r = pow(s->lookahead_top1[d] / s->lookahead_top1[2], 1.0 / (d - 2.0));
            k->lookahead_top1_decay = r > 1 ? 1 : r;
            fitted_top1[3] = true;
            *at_top1 = d;
            break;
        }
    fitted_recall[0] = D >= 1 && !isnan(s->lookahead_recall[0]);
    fitted_recall[1] = false;
    if (!fitted_recall[0]) return;
    k->lookahead_recall_d1 = s->lookahead_recall[0];
    for (uint32_t d = D; d-- > 1;)
        if (!isnan(s->lookahead_recall[d]) && s->lookahead_recall[0] > 0) {
            const double r = pow(s->lookahead_recall[d] / s->lookahead_recall[0], 1.0 / d);
            k->lookahead_recall_decay = r > 1 ? 1 : r;
            fitted_recall[1] = true;
            *at_recall = d;
            break;
        }
}

/* ---- the fit ---- */

/* The depth-profile knobs set to the fitted per-layer values at the first, middle and last
 * layer: what the printout lists (the per-layer values are what generates). */
static void profiles_from_layers(fit_ctx *c) {
    static const char *const bases[SYNTH_LAYER_KNOBS + 1] = {
        "reuse_top1",       "reuse_other", "reuse_history",       "reuse_row_prefill",
        "reuse_row_decode", NULL,          "popularity_sharpness"};
    const uint32_t at[N_DEPTH] = {0, (c->L - 1) / 2, c->L - 1};
    double reach = 1;
    for (uint32_t l = 0; l < c->L; l++)
        if (layer_knob(c, SYNTH_LK_HISTORY_TOKENS)[l] > reach)
            reach = layer_knob(c, SYNTH_LK_HISTORY_TOKENS)[l];
    c->o.knobs.reuse_history_tokens = reach; /* the ring that the farthest reach needs */
    for (int k = 0; k <= SYNTH_LAYER_KNOBS; k++)
        for (int g = 0; g < N_DEPTH && k != SYNTH_LK_HISTORY_TOKENS; g++)
            *depth_knob(&c->o.knobs, bases[k], g) = k < SYNTH_LAYER_KNOBS
                                                        ? layer_knob(c, (synth_layer_knob)k)[at[g]]
                                                        : c->sharpness[at[g]];
}

static void add_entry(synth_fit_result *f, const synth_knobs *k, const char *knob,
                      const char *statistic, double real, double achieved, bool fitted) {
    MOESIM_ASSERT(f->n_entries < SYNTH_FIT_MAX_ENTRIES);
    synth_fit_entry *e = &f->entries[f->n_entries++];
    snprintf(e->knob, sizeof e->knob, "%s", knob);
    snprintf(e->statistic, sizeof e->statistic, "%s", statistic);
    for (size_t i = 0; i < synth_knob_count; i++)
        if (!strcmp(synth_knob_table[i].name, knob))
            e->value = *(const double *)((const char *)k + synth_knob_table[i].offset);
    e->real = real;
    e->achieved = fitted ? achieved : NAN;
    e->fitted = fitted && !isnan(real);
}

/* An entry whose statistic is a fit_stat: real and simulated values from the context. */
static void add_stat_entry(synth_fit_result *f, const fit_ctx *c, const char *knob,
                           const char *statistic, fit_stat st, int g) {
    add_entry(f, &c->o.knobs, knob, statistic, real_value(c, st, g),
              stat_value(c->sim, &c->sim_ls, &c->sim_mo, c->L, c->batches, st, g), true);
}

static void record_entries(synth_fit_result *f, const fit_ctx *c, const bool *la_top1,
                           const bool *la_recall, uint32_t at_top1, uint32_t at_recall) {
    static const char *const where[N_DEPTH] = {"first layers", "middle layers", "last layers"};
    char knob[48], what[64];
    const trace_stats *r = c->real, *s = c->sim;
    add_entry(f, &c->o.knobs, "topics", "= the real requests (at most 64), in turn",
              c->real->requests, c->T, true);
    add_stat_entry(f, c, "popularity_smoothing", "gini of a request's own counts",
                   STAT_REQUEST_GINI, 0);
    add_stat_entry(f, c, "repeat_decode_token", "decode tokens routed as their predecessor",
                   STAT_REPEAT, 0);
    add_stat_entry(f, c, "topic_persistence",
                   one_request_a_topic(c) ? "= 0, the real order of requests; active share, B >= 2"
                                          : "active share, mean over its batch sizes >= 2",
                   STAT_ACTIVE, 0);
    static const struct {
        const char *base, *stat;
        fit_stat st;
    } profiles[] = {
        {"popularity_sharpness", "gini", STAT_GINI},
        {"reuse_top1", "reuse top-1", STAT_REUSE_TOP1},
        {"reuse_other", "reuse any", STAT_REUSE_ANY},
        {"reuse_history", "LRU hit rate, mean over capacities k..E-1", STAT_LRU},
        {"reuse_row_prefill", "experts shared with the previous token, prefill",
         STAT_SHARED_PREFILL},
        {"reuse_row_decode", "experts shared with the previous token, decode", STAT_SHARED_DECODE}};
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(profiles); i++)
        for (int g = 0; g < N_DEPTH; g++) {
            snprintf(knob, sizeof knob, "%s_%s", profiles[i].base, depth_names[g]);
            snprintf(what, sizeof what, "%s, %s", profiles[i].stat, where[g]);
            add_stat_entry(f, c, knob, what, profiles[i].st, g);
        }
    add_entry(f, &c->o.knobs, "reuse_history_tokens", "worst LRU/OPT/reuse gap (of 1..64 tried)", 0,
              locality_gap(c), !isnan(real_value(c, STAT_LRU, 1)));
    static const char *const la_names[4] = {"lookahead_top1_d1", "lookahead_top1_d2",
                                            "lookahead_top1_d3", "lookahead_top1_decay"};
    for (uint32_t d = 0; d < 4; d++) {
        const uint32_t at = d < 3 ? d : at_top1; /* decay: the farthest distance measured */
        const bool has = at < r->lookahead_depth;
        snprintf(what, sizeof what, "look-ahead top-1 accuracy, d = %u", at + 1);
        add_entry(f, &c->o.knobs, la_names[d], what, has ? r->lookahead_top1[at] : NAN,
                  has && at < s->lookahead_depth ? s->lookahead_top1[at] : NAN, la_top1[d]);
    }
    for (uint32_t i = 0; i < 2; i++) {
        const uint32_t at = i == 0 ? 0 : at_recall;
        const bool has = at < r->lookahead_depth;
        snprintf(what, sizeof what, "look-ahead recall@k, d = %u", at + 1);
        add_entry(f, &c->o.knobs, i ? "lookahead_recall_decay" : "lookahead_recall_d1", what,
                  has ? r->lookahead_recall[at] : NAN,
                  has && at < s->lookahead_depth ? s->lookahead_recall[at] : NAN, la_recall[i]);
    }
    const bool all = c->m->gate_norm == GATE_SOFTMAX_ALL;
    add_entry(f, &c->o.knobs, "gate_logit_scale", "mean largest gate of a row",
              real_value(c, STAT_GATE_TOP1, 0), c->sim_mo.gate_top1, c->m->top_k > 1 || all);
    add_entry(f, &c->o.knobs, "gate_tail_gap", "mean sum of a row's gates",
              real_value(c, STAT_GATE_SUM, 0), c->sim_mo.gate_sum, all);
    add_stat_entry(f, c, "importance_sink_share", "(importance of token 0 - 1) / (n - 1)",
                   STAT_IMP_SINK, 0);
    add_stat_entry(f, c, "importance_salience_sigma", "std of log importance / harmonic tail",
                   STAT_IMP_SIGMA, 0);
    add_stat_entry(f, c, "importance_layer_correlation", "its correlation across adjacent layers",
                   STAT_IMP_RHO, 0);
}

/* The real trace's shape from its meta and requests: request count, prompt and decode length
 * ranges (a request needs one prompt token at least: a decode-only log gets one), look-ahead. */
static void shape_of(const trace *t, const trace_request_index *ix, synth_options *o) {
    o->prompt_len = (synth_range){UINT32_MAX, 0};
    o->gen_len = (synth_range){UINT32_MAX, 0};
    for (uint32_t r = 0; r < ix->n_requests; r++) {
        const uint32_t p = ix->n_prefill[r] ? ix->n_prefill[r] : 1;
        const uint32_t g = ix->n_tokens[r] - ix->n_prefill[r];
        o->prompt_len.min = p < o->prompt_len.min ? p : o->prompt_len.min;
        o->prompt_len.max = p > o->prompt_len.max ? p : o->prompt_len.max;
        o->gen_len.min = g < o->gen_len.min ? g : o->gen_len.min;
        o->gen_len.max = g > o->gen_len.max ? g : o->gen_len.max;
    }
    o->n_requests = t->n_requests;
    o->workload = SYNTH_TEXT;
    o->seed = FIT_SEED;
    o->lookahead_depth = t->meta.lookahead_depth;
    o->lookahead_k = o->lookahead_depth ? t->meta.lookahead_k : o->lookahead_k;
}

/* The real trace, whole in memory or as a stream: its tokens are read once, in order, through
 * `row` (the statistics of traces/stats.h read a stream in passes of their own). */
typedef struct fit_source {
    const trace *tokens;                 /* meta and counts (a stream's skeleton) */
    const trace_request_index *requests; /* borrowed */
    fit_row_fn row;
    void *src;
    trace_stream *ts; /* NULL: `tokens` is the whole trace */
} fit_source;

/* Everything the fit reads from the real trace's rows, in one pass: its per-layer statistics and
 * moments (held per request in flight, traces/synth_moments.h), its execution order's decode
 * batch, and the popularity counts. */
static void read_real(fit_ctx *c, const fit_source *real) {
    const trace *rt = real->tokens;
    table_alloc(c, rt->n_requests);
    fit_pass *p = fit_pass_create(rt, real->requests, real->row, real->src,
                                  FIT_LAYER_STATS | FIT_MOMENTS_ALL);
    for (uint64_t i = 0; i < rt->n_tokens; i++) {
        uint64_t local;
        const trace *b = real->row(real->src, i, &local);
        fit_pass_token(p, b, local);
        table_count(c, b, local, rt->n_requests);
    }
    fit_pass_finish(p, &c->real_ls, &c->real_mo);
    c->interleave = c->real_mo.decode_batch;
}

static moesim_status fit(const fit_source *real, const model_geometry *m, const char *what,
                         synth_fit_result *out, moesim_error *err) {
    const trace *rt = real->tokens;
    const trace_meta *tm = &rt->meta;
    if (tm->n_layers != m->n_moe_layers || tm->n_experts != m->n_experts || tm->top_k != m->top_k)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: %u MoE layers, %u experts, top-%u; model %s has %u, %u, top-%u "
                           "(--model names the trace's model)",
                           what, tm->n_layers, tm->n_experts, tm->top_k, m->name, m->n_moe_layers,
                           m->n_experts, m->top_k);
    if (tm->gate_norm != m->gate_norm)
        return moesim_fail(err, MOESIM_EINPUT, "%s: gates normalized over %s, model %s: over %s",
                           what, trace_gate_norm_name(tm->gate_norm), m->name,
                           trace_gate_norm_name(m->gate_norm));
    memset(out, 0, sizeof *out);
    fit_ctx c = {.m = m, .window = 1, .L = m->n_moe_layers};
    synth_options_default(&c.o, m);
    shape_of(rt, real->requests, &c.o);
    out->options = c.o; /* the shape to generate, before the simulation's scale */
    if (synth_options_check(&c.o, m, err)) {
        moesim_error_prefix(err, "%s: its shape", what);
        return MOESIM_EINPUT;
    }
    trace_stats *rs = NULL;
    if (!real->ts) {
        rs = trace_stats_compute(rt);
    } else {
        const moesim_status st = trace_stats_compute_stream(real->ts, &rs, err);
        if (st) return st;
    }
    if (rs->accesses == 0) {
        trace_stats_destroy(rs);
        return moesim_fail(err, MOESIM_EINPUT, "%s: no recorded routing row to fit to", what);
    }
    c.real = rs;
    read_real(&c, real);
    /* per-layer knobs start at the family's profiles */
    c.layer_knobs = moesim_xmalloc((size_t)SYNTH_LAYER_KNOBS * c.L * sizeof *c.layer_knobs);
    for (int k = 0; k < SYNTH_LAYER_KNOBS; k++)
        for (uint32_t l = 0; l < c.L; l++)
            c.layer_knobs[(size_t)k * c.L + l] =
                synth_layer_knob_value(&c.o, (synth_layer_knob)k, l, c.L);
    for (uint32_t l = 0; l < c.L; l++)
        c.sharpness[l] = synth_depth_profile(c.o.knobs.popularity_sharpness_first,
                                             c.o.knobs.popularity_sharpness_mid,
                                             c.o.knobs.popularity_sharpness_last, l, c.L);
    c.o.layer_knobs = c.layer_knobs;
    for (int b = 0; b < STATS_N_BATCH; b++) c.batches[b] = !isnan(rs->active_share[b]);
    table_init(&c, rt->n_requests);

    /* the simulation: SYNTH_FIT_SCALE times the requests, bounded in records */
    const uint64_t cells = rt->n_tokens * (uint64_t)tm->n_layers;
    uint64_t scale = SYNTH_FIT_SCALE;
    while (scale > 1 && cells * scale > FIT_MAX_CELLS) scale--;
    /* a long trace needs fewer copies for the same noise: FIT_SIM_CELLS records and
     * FIT_SIM_TOKENS tokens (a layer's shares to about 0.005) are enough; the time of a fit
     * follows the simulation's size */
    while (scale > 1 && cells * (scale - 1) >= FIT_SIM_CELLS &&
           rt->n_tokens * (scale - 1) >= FIT_SIM_TOKENS)
        scale--;
    c.o.n_requests = (uint32_t)(rt->n_requests * scale);
    const uint32_t depth = c.o.lookahead_depth;
    c.o.lookahead_depth = 0; /* routing and importance do not depend on it */

    for (int sweep = 0; sweep < FIT_SWEEPS; sweep++) {
        /* sweeps 0 and 1 search each knob's whole range, later ones a window around its value
         * that halves per sweep: a knob's simulated statistic is noisy (moving a knob moves
         * the alias tables, hence every draw), and where two knobs drive two statistics alike
         * (sharpness and smoothing: gini and a request's gini) full-range bisection on the
         * noise swung them from sweep to sweep (golden Qwen2-MoE in batches of 4: smoothing
         * between 0.2 and 64) */
        c.window = sweep < 2 ? 1 : ldexp(1.0, 1 - sweep);
        routing_sweep(&c, sweep == 1);
    }
    c.window = 1;
    fit_gates_and_importance(&c);
    bool la_top1[4] = {false}, la_recall[2] = {false};
    uint32_t at_top1 = 3, at_recall = 1; /* distances of the decays (0-based) */
    if (depth) fit_lookahead(&c.o.knobs, rs, la_top1, la_recall, &at_top1, &at_recall);
    c.o.lookahead_depth = depth;
    profiles_from_layers(&c);
    simulate(&c, true, 0); /* the final knobs, for every entry's achieved value */
    record_entries(out, &c, la_top1, la_recall, at_top1, at_recall);

    out->options.knobs = c.o.knobs;
    out->options.popularity = out->popularity = c.table;
    out->options.popularity_topics = c.T;
    out->options.layer_knobs = out->layer_knobs = c.layer_knobs;
    out->interleave = c.interleave;
    out->simulations = c.simulations;
    free(c.overall);
    free(c.counts);
    trace_stats_destroy(c.sim);
    trace_stats_destroy(rs);
    return MOESIM_OK;
}

moesim_status synth_fit(const trace *real, const model_geometry *m, const char *what,
                        synth_fit_result *out, moesim_error *err) {
    trace_request_index ix;
    trace_request_index_build(&ix, real);
    /* the row function reads the trace only: the cast drops nothing it writes */
    const fit_source src = {
        .tokens = real, .requests = &ix, .row = fit_row_in_memory, .src = (void *)real};
    const moesim_status st = fit(&src, m, what, out, err);
    trace_request_index_free(&ix);
    return st;
}

static const trace *row_of_stream(void *ts, uint64_t token, uint64_t *local) {
    return trace_stream_row(ts, token, local);
}

moesim_status synth_fit_stream(trace_stream *real, const model_geometry *m, const char *what,
                               synth_fit_result *out, moesim_error *err) {
    const fit_source src = {.tokens = trace_stream_tokens(real),
                            .requests = trace_stream_requests(real),
                            .row = row_of_stream,
                            .src = real,
                            .ts = real};
    return fit(&src, m, what, out, err);
}

void synth_fit_result_free(synth_fit_result *f) {
    if (f) free(f->layer_knobs);
    if (f) free(f->popularity);
}
