/* The router-trace synthesizer: tables built once per run, then one pass over the tokens
 * (traces/SYNTH.md states the model; traces/synth.h the knobs).
 *
 * Work layout (the bench target is >= 5 M token x layer records/s on one core):
 *   - every distribution a token draws from is an alias table (Vose), built once per
 *     (layer, workload, topic); a draw costs one 32-bit RNG output: the high part of u * E
 *     picks the column, the low 32 bits are compared with the column's threshold;
 *   - probabilities that are tested per record (reuse, look-ahead right) are 32-bit thresholds;
 *   - gate-weight vectors come from a pool of SYNTH_GATE_POOL precomputed rows (Gumbel
 *     order-statistic logits through the model's softmax), picked with one draw per record;
 *   - duplicates within a row are found by a linear scan (k <= 64); look-ahead candidates use a
 *     stamped marker, so nothing is cleared or allocated per record.
 * RNG streams of the one seed (common/rng.h): 0 model tables, 1 request plan, 2 routing and
 * gates, 3 importance, 4 look-ahead; so changing D or K' leaves the routing unchanged.
 *
 * Units: lengths in tokens; probabilities in [0, 1]; log-popularity in nats. */
#include "traces/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_randist.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/rng.h"

#define SYNTH_GATE_POOL     4096 /* precomputed gate-weight rows per run */
#define SYNTH_SALIENCE_POOL 4096 /* precomputed per-layer salience factors */
#define SYNTH_DRAW_CAP      64   /* rejected duplicate draws per slot before the fallback */
#define STREAM_TABLES       0
#define STREAM_PLAN         1
#define STREAM_ROUTING      2
#define STREAM_IMPORTANCE   3
#define STREAM_LOOKAHEAD    4

/* P(x) as a threshold on a uniform 32-bit draw: draw < threshold happens with probability x. */
static uint32_t prob_threshold(double x) {
    if (x <= 0) return 0;
    if (x >= 1) return UINT32_MAX;
    return (uint32_t)(x * 4294967296.0);
}

/* Linear interpolation of a depth profile: first at layer 0, mid at (L-1)/2, last at L-1. */
static double depth_profile(double first, double mid, double last, uint32_t l, uint32_t n_layers) {
    if (n_layers <= 1) return mid;
    double x = (double)l / (double)(n_layers - 1); /* 0..1 */
    if (x <= 0.5) return first + (mid - first) * (x / 0.5);
    return mid + (last - mid) * ((x - 0.5) / 0.5);
}

/* ---- alias tables ---- */

typedef struct synth_tables {
    uint32_t E, L, k, W, T;
    uint32_t *thresh;                   /* [L][W][T][E] alias thresholds (32-bit fixed point) */
    uint16_t *alias;                    /* [L][W][T][E] */
    uint16_t *pop_order;                /* [L][W][E] experts by decreasing workload popularity */
    float *gate_pool;                   /* [SYNTH_GATE_POOL][k] descending gate rows */
    uint32_t *reuse_top1, *reuse_other; /* [L] thresholds */
} synth_tables;

/* Vose's alias method over weights w[0..n) (> 0): column j keeps j with probability
 * thresh[j] / 2^32, else gives alias[j]. `scratch` holds 2n doubles and n uint32s. */
static void alias_build(const double *w, uint32_t n, uint32_t *thresh, uint16_t *alias,
                        double *scaled, uint32_t *small, uint32_t *large) {
    double total = 0;
    for (uint32_t e = 0; e < n; e++) total += w[e];
    MOESIM_ASSERT(total > 0 && isfinite(total));
    uint32_t ns = 0, nl = 0;
    for (uint32_t e = 0; e < n; e++) {
        scaled[e] = w[e] * n / total;
        if (scaled[e] < 1.0)
            small[ns++] = e;
        else
            large[nl++] = e;
    }
    while (ns && nl) {
        uint32_t s = small[--ns], g = large[nl - 1];
        thresh[s] = prob_threshold(scaled[s]);
        alias[s] = (uint16_t)g;
        scaled[g] -= 1.0 - scaled[s];
        if (scaled[g] < 1.0) {
            nl--;
            small[ns++] = g;
        }
    }
    while (nl) { /* numerically ~1: keep the column itself */
        uint32_t g = large[--nl];
        thresh[g] = UINT32_MAX;
        alias[g] = (uint16_t)g;
    }
    while (ns) {
        uint32_t s = small[--ns];
        thresh[s] = UINT32_MAX;
        alias[s] = (uint16_t)s;
    }
}

static inline uint16_t alias_draw(const uint32_t *thresh, const uint16_t *alias, uint32_t n,
                                  gsl_rng *g) {
    uint64_t x = (uint64_t)(uint32_t)gsl_rng_get(g) * n;
    uint32_t j = (uint32_t)(x >> 32), f = (uint32_t)x;
    return f < thresh[j] ? (uint16_t)j : alias[j];
}

/* Sort helper: experts by decreasing weight (ties by id, so the order is deterministic). */
typedef struct weighted_expert {
    double w;
    uint32_t e;
} weighted_expert;

static int cmp_weight_desc(const void *a, const void *b) {
    const weighted_expert *x = a, *y = b;
    if (x->w != y->w) return x->w < y->w ? 1 : -1;
    return (x->e > y->e) - (x->e < y->e);
}

/* Gate rows: logits z_0 = 0, z_j = z_{j-1} - scale * Exp(1) / j (spacings of the top order
 * statistics of Gumbel noise), then softmax over the k (GATE_SOFTMAX_TOPK) or over all E with
 * the E - k unchosen experts at z_{k-1} - tail_gap each (GATE_SOFTMAX_ALL). */
static void gate_pool_build(float *pool, uint32_t k, uint32_t E, gate_normalization norm,
                            double scale, double tail_gap, gsl_rng *g) {
    double z[TRACE_MAX_TOP_K];
    for (uint32_t i = 0; i < SYNTH_GATE_POOL; i++) {
        z[0] = 0;
        for (uint32_t j = 1; j < k; j++) z[j] = z[j - 1] - scale * gsl_ran_exponential(g, 1.0) / j;
        double sum = 0;
        for (uint32_t j = 0; j < k; j++) sum += exp(z[j]);
        if (norm == GATE_SOFTMAX_ALL) sum += (double)(E - k) * exp(z[k - 1] - tail_gap);
        float *row = pool + (size_t)i * k;
        for (uint32_t j = 0; j < k; j++) row[j] = (float)(exp(z[j]) / sum);
        for (uint32_t j = 1; j < k; j++) /* float rounding must not break the order */
            if (row[j] > row[j - 1]) row[j] = row[j - 1];
    }
}

static void tables_build(synth_tables *tb, const model_geometry *m, const synth_options *o,
                         rng *r) {
    const synth_knobs *kn = &o->knobs;
    gsl_rng *g = rng_gsl(r);
    const uint32_t E = m->n_experts, L = m->n_moe_layers, W = SYNTH_N_WORKLOADS;
    const uint32_t T = (uint32_t)kn->topics;
    memset(tb, 0, sizeof *tb);
    tb->E = E, tb->L = L, tb->k = m->top_k, tb->W = W, tb->T = T;
    const size_t n_tables = (size_t)L * W * T;
    tb->thresh = moesim_xcalloc(n_tables * E, sizeof *tb->thresh);
    tb->alias = moesim_xcalloc(n_tables * E, sizeof *tb->alias);
    tb->pop_order = moesim_xcalloc((size_t)L * W * E, sizeof *tb->pop_order);
    tb->gate_pool = moesim_xcalloc((size_t)SYNTH_GATE_POOL * m->top_k, sizeof *tb->gate_pool);
    tb->reuse_top1 = moesim_xcalloc(L, sizeof *tb->reuse_top1);
    tb->reuse_other = moesim_xcalloc(L, sizeof *tb->reuse_other);

    double *shared = moesim_xcalloc(E, sizeof *shared); /* [E] common part of log-popularity */
    double *logpop = moesim_xcalloc(E, sizeof *logpop); /* [E] */
    double *w = moesim_xcalloc(E, sizeof *w);
    double *scaled = moesim_xcalloc(E, sizeof *scaled);
    uint32_t *small = moesim_xcalloc(E, sizeof *small), *large = moesim_xcalloc(E, sizeof *large);
    weighted_expert *order = moesim_xcalloc(E, sizeof *order);
    const double ws[SYNTH_N_WORKLOADS] = {kn->workload_skew_text, kn->workload_skew_math,
                                          kn->workload_skew_code};
    const double c = kn->workload_hot_set_correlation, c_own = sqrt(1.0 - c * c);
    for (uint32_t l = 0; l < L; l++) {
        const double skew = depth_profile(kn->popularity_skew_first, kn->popularity_skew_mid,
                                          kn->popularity_skew_last, l, L);
        for (uint32_t e = 0; e < E; e++) shared[e] = gsl_ran_gaussian_ziggurat(g, 1.0);
        for (uint32_t wl = 0; wl < W; wl++) {
            for (uint32_t e = 0; e < E; e++)
                logpop[e] =
                    skew * ws[wl] * (c * shared[e] + c_own * gsl_ran_gaussian_ziggurat(g, 1.0));
            for (uint32_t e = 0; e < E; e++) order[e] = (weighted_expert){logpop[e], e};
            qsort(order, E, sizeof *order, cmp_weight_desc);
            uint16_t *po = tb->pop_order + ((size_t)l * W + wl) * E;
            for (uint32_t e = 0; e < E; e++) po[e] = (uint16_t)order[e].e;
            for (uint32_t t = 0; t < T; t++) {
                double top = -INFINITY;
                for (uint32_t e = 0; e < E; e++) {
                    w[e] = logpop[e] + kn->topic_concentration * gsl_ran_gaussian_ziggurat(g, 1.0);
                    top = w[e] > top ? w[e] : top;
                }
                for (uint32_t e = 0; e < E; e++) w[e] = exp(w[e] - top);
                size_t at = (((size_t)l * W + wl) * T + t) * E;
                alias_build(w, E, tb->thresh + at, tb->alias + at, scaled, small, large);
            }
        }
        tb->reuse_top1[l] = prob_threshold(
            depth_profile(kn->reuse_top1_first, kn->reuse_top1_mid, kn->reuse_top1_last, l, L));
        tb->reuse_other[l] = prob_threshold(
            depth_profile(kn->reuse_other_first, kn->reuse_other_mid, kn->reuse_other_last, l, L));
    }
    gate_pool_build(tb->gate_pool, m->top_k, E, m->gate_norm, kn->gate_logit_scale,
                    kn->gate_tail_gap, g);
    free(order);
    free(large);
    free(small);
    free(scaled);
    free(w);
    free(logpop);
    free(shared);
}

static void tables_free(synth_tables *tb) {
    free(tb->thresh);
    free(tb->alias);
    free(tb->pop_order);
    free(tb->gate_pool);
    free(tb->reuse_top1);
    free(tb->reuse_other);
}

/* ---- the request plan ---- */

typedef struct request_plan {
    uint32_t prompt, gen; /* tokens */
    uint8_t workload;     /* text, math or code */
    uint32_t topic;
    uint64_t first_token; /* index of its first token in the trace */
} request_plan;

static uint32_t range_draw(synth_range r, rng *g) {
    return r.min + (uint32_t)rng_below(g, (uint64_t)r.max - r.min + 1);
}

static uint8_t workload_draw(synth_workload w, rng *g) {
    return w == SYNTH_MIX ? (uint8_t)rng_below(g, SYNTH_N_WORKLOADS) : (uint8_t)w;
}

/* Lengths, workloads and topics of every request; returns the total number of tokens. */
static uint64_t plan_build(request_plan *plan, const synth_options *o, uint32_t n_topics, rng *g) {
    uint64_t at = 0;
    for (uint32_t r = 0; r < o->n_requests; r++) {
        request_plan *p = &plan[r];
        p->prompt = range_draw(o->prompt_len, g);
        p->gen = range_draw(o->gen_len, g);
        if (r > 0 && rng_uniform(g) < o->knobs.topic_persistence) {
            p->workload = plan[r - 1].workload;
            p->topic = plan[r - 1].topic;
        } else {
            p->workload = workload_draw(o->workload, g);
            p->topic = (uint32_t)rng_below(g, n_topics);
        }
        p->first_token = at;
        at += (uint64_t)p->prompt + p->gen;
    }
    return at;
}

/* ---- routing of one token at one layer ---- */

static inline bool row_has(const uint16_t *row, uint32_t n, uint16_t e) {
    for (uint32_t j = 0; j < n; j++)
        if (row[j] == e) return true;
    return false;
}

/* Fills `row` [k] (slot 0 = top-1) and `gates` [k]. `prev` is the previous token's row of this
 * request at this layer, or NULL. */
static void route_row(const synth_tables *tb, uint32_t l, const uint32_t *thresh,
                      const uint16_t *alias, const uint16_t *pop, const uint16_t *prev,
                      uint16_t *row, float *gates, gsl_rng *g) {
    const uint32_t k = tb->k, E = tb->E;
    uint32_t n = 0;
    if (prev && (uint32_t)gsl_rng_get(g) < tb->reuse_top1[l]) row[n++] = prev[0];
    while (n < k) {
        if (n > 0 && prev && (uint32_t)gsl_rng_get(g) < tb->reuse_other[l]) {
            uint16_t e = prev[((uint64_t)(uint32_t)gsl_rng_get(g) * k) >> 32];
            if (!row_has(row, n, e)) {
                row[n++] = e;
                continue;
            }
        }
        uint16_t e = 0;
        bool found = false;
        for (uint32_t tries = 0; tries < SYNTH_DRAW_CAP && !found; tries++) {
            e = alias_draw(thresh, alias, E, g);
            found = !row_has(row, n, e);
        }
        for (uint32_t j = 0; !found && j < E; j++) { /* rare: most popular unchosen expert */
            e = pop[j];
            found = !row_has(row, n, e);
        }
        MOESIM_ASSERT(found);
        row[n++] = e;
    }
    const float *gp =
        tb->gate_pool + (((uint64_t)(uint32_t)gsl_rng_get(g) * SYNTH_GATE_POOL) >> 32) * k;
    memcpy(gates, gp, k * sizeof *gates);
}

/* ---- importance (DyMoE Eq. 1 as engine_seq_importance computes it) ----
 *
 * Query q (q = 0..n-1) spreads one unit of attention over positions 0..q: query 0 all on
 * itself; a later query a share s on position 0 (the attention sink) and 1 - s in proportion to
 * the salience w_p of p = 0..q. The importance of p is what it received from every query:
 *   imp[p] = [p = 0] (1 + s (n - 1)) + (1 - s) w_p sum_{q = max(p, 1)}^{n-1} 1 / W_q,
 * W_q = sum_{p' <= q} w_p'. The importances of a request sum to n. */
typedef struct importance_work {
    double *w;        /* [n_max] salience of each position at this layer */
    double *base;     /* [n_max] exp(sigma a z_p): the part shared by all layers */
    double *salience; /* [SYNTH_SALIENCE_POOL] exp(sigma sqrt(1 - a^2) z) */
} importance_work;

static void importance_request(trace *t, const synth_options *o, const request_plan *p,
                               importance_work *iw, gsl_rng *g) {
    const uint32_t L = t->meta.n_layers, n = p->prompt + p->gen;
    const double s = o->knobs.importance_sink_share;
    const double a = o->knobs.importance_layer_correlation;
    const double sigma = o->knobs.importance_salience_sigma;
    for (uint32_t q = 0; q < n; q++) iw->base[q] = exp(sigma * a * gsl_ran_gaussian_ziggurat(g, 1));
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t q = 0; q < n; q++)
            iw->w[q] =
                iw->base[q] *
                iw->salience[((uint64_t)(uint32_t)gsl_rng_get(g) * SYNTH_SALIENCE_POOL) >> 32];
        /* prefix sums W_q, then the suffix sum of 1 / W_q walking backwards */
        double prefix = 0;
        for (uint32_t q = 0; q < n; q++) {
            prefix += iw->w[q];
            iw->base[n + q] = prefix; /* W_q kept after the base factors */
        }
        double suffix = 0;
        for (uint32_t q = n; q-- > 0;) {
            if (q >= 1) suffix += 1.0 / iw->base[n + q];
            double imp = (1.0 - s) * iw->w[q] * suffix;
            if (q == 0) imp += 1.0 + s * (double)(n - 1);
            t->importance[(p->first_token + q) * L + l] = (float)imp;
        }
    }
}

/* ---- look-ahead predictions of one token ----
 *
 * For layer l and distance d (target m = l + d < L): candidate 0 is m's true top-1 with
 * probability top1[d], else its runner-up (or, for k = 1, the most popular other expert); each
 * other true expert of m takes the next of the first min(k, K') places with probability
 * keep[d], else it is deferred behind them and the place goes to the most popular expert of m
 * not chosen (an intruder); then the deferred true experts, then m's most popular remaining
 * experts up to K'. Scores: m's gate weights by rank, halved per rank beyond k. */
typedef struct lookahead_work {
    uint32_t *mark; /* [E] stamp of the set an expert is in */
    uint32_t stamp;
    uint32_t top1[TRACE_MAX_LOOKAHEAD_DEPTH + 1]; /* [d] thresholds */
    uint32_t keep[TRACE_MAX_LOOKAHEAD_DEPTH + 1]; /* [d] thresholds */
} lookahead_work;

static inline void la_next(lookahead_work *lw, uint32_t E) {
    if (++lw->stamp == 0) {
        memset(lw->mark, 0, E * sizeof *lw->mark);
        lw->stamp = 1;
    }
}

/* The most popular expert (from rank *at on) not yet in the current set, now added to it; E when
 * every expert is in the set. */
static inline uint16_t next_unmarked(const uint16_t *pop, uint32_t E, uint32_t *at,
                                     lookahead_work *lw) {
    while (*at < E && lw->mark[pop[*at]] == lw->stamp) (*at)++;
    if (*at == E) return (uint16_t)E;
    uint16_t e = pop[(*at)++];
    lw->mark[e] = lw->stamp;
    return e;
}

static void lookahead_token(trace *t, const synth_tables *tb, uint64_t tok, uint8_t workload,
                            lookahead_work *lw, gsl_rng *g) {
    const uint32_t L = tb->L, E = tb->E, k = tb->k, D = t->meta.lookahead_depth;
    const uint32_t KP = t->meta.lookahead_k, kk = k < KP ? k : KP;
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t d = 1; d <= D; d++) {
            size_t at = trace_lookahead_index(t, tok, l, d);
            uint16_t *pred = t->lookahead_ids + at;
            float *score = t->lookahead_scores + at;
            const uint32_t m = l + d;
            if (m >= L) {
                for (uint32_t c = 0; c < KP; c++) pred[c] = TRACE_NO_EXPERT, score[c] = 0;
                continue;
            }
            const uint16_t *actual = trace_experts(t, tok, m);
            const float *gates = trace_gates(t, tok, m);
            const uint16_t *pop = tb->pop_order + ((size_t)m * tb->W + workload) * E;
            la_next(lw, E);
            for (uint32_t j = 0; j < k; j++) lw->mark[actual[j]] = lw->stamp;
            uint32_t pop_at = 0; /* popularity rank where the search for unmarked experts resumes */
            uint16_t deferred[TRACE_MAX_TOP_K];
            uint32_t n_def = 0, n = 0;
            uint32_t skip = 0; /* the true slot used as candidate 0 (UINT32_MAX: none) */
            if ((uint32_t)gsl_rng_get(g) < lw->top1[d]) {
                pred[n++] = actual[0];
            } else if (k > 1) {
                pred[n++] = actual[1];
                skip = 1;
            } else {
                uint16_t other = next_unmarked(pop, E, &pop_at, lw);
                pred[n++] = other < E ? other : actual[0];
                skip = other < E ? UINT32_MAX : 0;
            }
            for (uint32_t j = 0; j < k; j++) {
                if (j == skip) continue;
                if (n < kk && (uint32_t)gsl_rng_get(g) < lw->keep[d]) {
                    pred[n++] = actual[j];
                    continue;
                }
                uint16_t intruder = n < kk ? next_unmarked(pop, E, &pop_at, lw) : E;
                if (n < kk && intruder == E) { /* every expert is a true one (k = E) */
                    pred[n++] = actual[j];
                    continue;
                }
                deferred[n_def++] = actual[j];
                if (n < kk) pred[n++] = intruder;
            }
            for (uint32_t j = 0; j < n_def && n < KP; j++) pred[n++] = deferred[j];
            while (n < KP) {
                uint16_t e = next_unmarked(pop, E, &pop_at, lw);
                MOESIM_ASSERT(e < E); /* K' <= E distinct candidates always exist */
                pred[n++] = e;
            }
            for (uint32_t c = 0; c < KP; c++) {
                float s = gates[c < k ? c : k - 1];
                for (uint32_t h = k; h <= c; h++) s *= 0.5f;
                score[c] = s;
            }
        }
    }
}

/* ---- the whole trace ---- */

moesim_status synth_generate(const model_geometry *m, const synth_options *o, trace **out,
                             moesim_error *err) {
    *out = NULL;
    if (synth_options_check(o, m, err)) return err ? err->status : MOESIM_EINPUT;
    trace_meta meta = {0};
    trace_meta_from_model(&meta, m);
    snprintf(meta.source, sizeof meta.source, "synth:%llu", (unsigned long long)o->seed);
    snprintf(meta.tool_version, sizeof meta.tool_version, "%s", MOESIM_VERSION);
    meta.lookahead_depth = o->lookahead_depth;
    meta.lookahead_k = o->lookahead_depth ? o->lookahead_k : 0;
    meta.has_importance = true;
    meta.has_token_ids = false;

    synth_tables tb;
    rng *r_tables = rng_create_stream(o->seed, STREAM_TABLES);
    tables_build(&tb, m, o, r_tables);
    rng_destroy(r_tables);

    request_plan *plan = moesim_xcalloc(o->n_requests, sizeof *plan);
    rng *r_plan = rng_create_stream(o->seed, STREAM_PLAN);
    const uint64_t n_tokens = plan_build(plan, o, tb.T, r_plan);
    rng_destroy(r_plan);

    trace *t = trace_try_create(&meta, n_tokens);
    if (!t) {
        free(plan);
        tables_free(&tb);
        return moesim_fail(err, MOESIM_ENOMEM,
                           "synthesized trace: cannot allocate %llu tokens (%.1f MB)",
                           (unsigned long long)n_tokens,
                           (double)n_tokens * (double)trace_bytes_per_token(&meta) / 1e6);
    }
    t->params_json = synth_params_json(o, m);

    rng *r_route = rng_create_stream(o->seed, STREAM_ROUTING);
    rng *r_imp = rng_create_stream(o->seed, STREAM_IMPORTANCE);
    rng *r_look = rng_create_stream(o->seed, STREAM_LOOKAHEAD);
    gsl_rng *g_route = rng_gsl(r_route), *g_look = rng_gsl(r_look);

    uint32_t n_max = 0;
    for (uint32_t r = 0; r < o->n_requests; r++)
        n_max = plan[r].prompt + plan[r].gen > n_max ? plan[r].prompt + plan[r].gen : n_max;
    importance_work iw = {
        .w = moesim_xcalloc(n_max, sizeof(double)),
        .base = moesim_xcalloc(2 * (size_t)n_max, sizeof(double)),
        .salience = moesim_xcalloc(SYNTH_SALIENCE_POOL, sizeof(double)),
    };
    {
        const double a = o->knobs.importance_layer_correlation;
        const double sd = o->knobs.importance_salience_sigma * sqrt(1.0 - a * a);
        for (uint32_t i = 0; i < SYNTH_SALIENCE_POOL; i++)
            iw.salience[i] = exp(sd * gsl_ran_gaussian_ziggurat(rng_gsl(r_imp), 1.0));
    }
    lookahead_work lw = {.mark = moesim_xcalloc(tb.E, sizeof(uint32_t))};
    for (uint32_t d = 1; d <= o->lookahead_depth; d++) {
        const synth_knobs *kn = &o->knobs;
        double acc = d == 1   ? kn->lookahead_top1_d1
                     : d == 2 ? kn->lookahead_top1_d2
                              : kn->lookahead_top1_d3 * pow(kn->lookahead_top1_decay, d - 3.0);
        double recall = kn->lookahead_recall_d1 * pow(kn->lookahead_recall_decay, d - 1.0);
        double keep = tb.k > 1 ? (tb.k * recall - 1.0) / (tb.k - 1.0) : 1.0;
        lw.top1[d] = prob_threshold(acc);
        lw.keep[d] = prob_threshold(keep);
    }

    const uint32_t L = tb.L, W = tb.W, T = tb.T, E = tb.E;
    for (uint32_t r = 0; r < o->n_requests; r++) {
        const request_plan *p = &plan[r];
        const uint32_t n = p->prompt + p->gen;
        for (uint32_t i = 0; i < n; i++) {
            const uint64_t tok = p->first_token + i;
            t->request_id[tok] = r;
            t->position[tok] = i;
            t->phase[tok] = i < p->prompt ? TRACE_PREFILL : TRACE_DECODE;
            for (uint32_t l = 0; l < L; l++) {
                const size_t tab = (((size_t)l * W + p->workload) * T + p->topic) * E;
                const size_t at = trace_route_index(t, tok, l);
                route_row(&tb, l, tb.thresh + tab, tb.alias + tab,
                          tb.pop_order + ((size_t)l * W + p->workload) * E,
                          i ? t->expert_ids + trace_route_index(t, tok - 1, l) : NULL,
                          t->expert_ids + at, t->gate_weights + at, g_route);
            }
            if (o->lookahead_depth) lookahead_token(t, &tb, tok, p->workload, &lw, g_look);
        }
        importance_request(t, o, p, &iw, rng_gsl(r_imp));
    }

    free(lw.mark);
    free(iw.w);
    free(iw.base);
    free(iw.salience);
    rng_destroy(r_look);
    rng_destroy(r_imp);
    rng_destroy(r_route);
    free(plan);
    tables_free(&tb);

    moesim_status st = trace_finish(t, "synthesized trace", err);
    MOESIM_ASSERT(st == MOESIM_OK); /* the generator only writes valid values */
    *out = t;
    return MOESIM_OK;
}
