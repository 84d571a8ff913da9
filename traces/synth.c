/* The router-trace synthesizer: tables built once per run, then one pass over the requests in
 * order, generated into a small reused window (SYNTH_WINDOW_BYTES) and handed on block by block
 * to a sink: the trace writer (synth_write), the whole trace in memory (synth_generate) or the
 * caller's (synth_stream). traces/SYNTH.md states the model; traces/synth.h the knobs.
 *
 * Work layout (the bench target is >= 5 M token x layer records/s on one core):
 *   - every distribution a token draws from is an alias table (Vose), built once per
 *     (workload, topic, layer) in 4-byte cells; a draw costs one 32-bit number: the high part
 *     of u * E picks the column, the low 32 bits are compared with the column's threshold;
 *   - probabilities tested per record (reuse, look-ahead right) are 32-bit thresholds, counts
 *     (copied slots, kept predictions) come from binomial CDF tables: one number each;
 *   - the hot paths read their numbers from a block holding the generator's next numbers, made
 *     by MT19937 run in place on GSL's mt19937 state (checked against gsl_rng_get at start);
 *   - gate-weight vectors come from a pool of SYNTH_GATE_POOL precomputed rows (Gumbel
 *     order-statistic logits through the model's softmax);
 *   - duplicates within a row are found with stamped markers in a branch-free draw loop;
 *     look-ahead rows are built per target layer, so its true experts are marked and its
 *     popular non-true experts compacted once for every distance, then assembled from a few
 *     segments copied in fixed-size chunks. Nothing is cleared or allocated per record.
 * RNG streams of the one seed (common/rng.h): 0 model tables, 1 request plan, 2 routing and
 * gates, 3 importance, 4 look-ahead; so changing D or K' leaves the routing unchanged.
 *
 * Units: lengths in tokens; probabilities in [0, 1]; log-popularity in nats. */
/* GSL's inline gsl_rng_get (gsl_inline.h): the fallback block refill calls it in a loop */
#define HAVE_INLINE 1
#include "traces/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>

#include <gsl/gsl_cdf.h>
#include <gsl/gsl_randist.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/progress.h"
#include "common/rng.h"
#include "traces/synth_draw.h"

#define SYNTH_GATE_POOL_BITS     10 /* precomputed gate-weight rows per run: 1024 (L1/L2) */
#define SYNTH_GATE_POOL          (1u << SYNTH_GATE_POOL_BITS)
#define SYNTH_SALIENCE_POOL_BITS 10 /* precomputed per-layer salience factors: 1024 */
#define SYNTH_SALIENCE_POOL      (1u << SYNTH_SALIENCE_POOL_BITS)
#define SYNTH_DRAW_CAP           64 /* rejected duplicate draws per slot before the fallback */
/* Tokens are generated and handed on in blocks of about this many bytes (at least 2 tokens):
 * small enough that the window stays in a core's L2 between the generator's writes and the sink's
 * reads (bench_synth, stream, D = 3, idle 2-core machine: 7.5-7.9 M records per CPU-second, against
 * 5.0-5.7 with one request per block). */
#define SYNTH_WINDOW_BYTES (512u * 1024u)
#define STREAM_TABLES      0
#define STREAM_PLAN        1
#define STREAM_ROUTING     2
#define STREAM_IMPORTANCE  3
#define STREAM_LOOKAHEAD   4

/* Linear interpolation of a depth profile: first at layer 0, mid at (L-1)/2, last at L-1. */
double synth_depth_profile(double first, double mid, double last, uint32_t l, uint32_t n_layers) {
    if (n_layers <= 1) return mid;
    double x = (double)l / (double)(n_layers - 1); /* 0..1 */
    if (x <= 0.5) return first + (mid - first) * (x / 0.5);
    return mid + (last - mid) * ((x - 0.5) / 0.5);
}

/* ---- tables ---- */

typedef struct synth_tables {
    uint32_t E, L, k, W, T;
    uint32_t P;          /* phases with tables of their own: 1, or 2 from a fitted table */
    alias_cell *cells;   /* [W][T][P][L][E] alias tables (a request's L tables adjacent) */
    uint16_t *pop_order; /* [L][W][E] experts by decreasing workload popularity */
    float *gate_pool;    /* [SYNTH_GATE_POOL][k] descending gate rows */
    uint32_t *reuse_top1, *avoid_other; /* [L] thresholds */
    uint32_t *avoid_top1;     /* [L] threshold of redrawing prev's top-1 (reuse_top1 < 0) */
    uint32_t *history;        /* [L] threshold of a history copy; all 0: off */
    uint32_t *avoid_history;  /* [L] threshold of redrawing a history expert (reuse_history < 0) */
    uint32_t H;               /* tokens of history (reuse_history_tokens) */
    uint32_t *history_tokens; /* [L] tokens a layer's history copies reach, <= H */
    uint32_t repeat;          /* threshold of repeat_decode_token; 0: off */
    uint32_t *row_copy;       /* [2][L] thresholds of reuse_row_prefill, reuse_row_decode; 0: off */
    bool any_history;         /* some layer copies from (or avoids) its history */
    uint32_t *copy_cdf; /* [L][k] P(copied slots <= c), copied slots ~ Binomial(k - 1, reuse) */
    bool *copies;       /* [L] reuse_other > 0 at this layer */
} synth_tables;

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

/* out[0..n) = the normal scores Phi^-1((i + 0.5) / n) in random order: a log-popularity whose
 * shape is exactly normal at every layer (no per-layer sampling luck), only the ranking random. */
static void normal_scores_shuffled(double *out, const double *quantiles, uint32_t n, gsl_rng *g) {
    memcpy(out, quantiles, n * sizeof *out);
    gsl_ran_shuffle(g, out, n, sizeof *out);
}

/* Layer l's tables from a fitted popularity table [T][P][L][E] (every workload the same): topic
 * t draws from its row of the token's phase; the popularity order is that of the rows' mean.
 * `w`, `scaled`, `small`, `large`, `order` are scratch [E]. */
static void fitted_tables_layer(synth_tables *tb, const float *popularity, uint32_t l, double *w,
                                double *scaled, uint32_t *small, uint32_t *large,
                                weighted_expert *order) {
    const uint32_t E = tb->E, L = tb->L, T = tb->T, P = tb->P;
    for (uint32_t e = 0; e < E; e++) order[e] = (weighted_expert){0, e};
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t ph = 0; ph < P; ph++) {
            const float *row = popularity + (((size_t)t * P + ph) * L + l) * E;
            for (uint32_t e = 0; e < E; e++) w[e] = row[e], order[e].w += row[e];
            for (uint32_t wl = 0; wl < tb->W; wl++)
                alias_build(w, E, tb->cells + ((((size_t)wl * T + t) * P + ph) * L + l) * E, scaled,
                            small, large);
        }
    qsort(order, E, sizeof *order, cmp_weight_desc);
    for (uint32_t wl = 0; wl < tb->W; wl++) {
        uint16_t *po = tb->pop_order + ((size_t)l * tb->W + wl) * E;
        for (uint32_t e = 0; e < E; e++) po[e] = (uint16_t)order[e].e;
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
    tb->P = o->popularity ? SYNTH_TABLE_PHASES : 1;
    const size_t n_tables = (size_t)L * W * T * tb->P;
    tb->cells = moesim_xcalloc(n_tables * E, sizeof *tb->cells);
    tb->pop_order = moesim_xcalloc((size_t)L * W * E, sizeof *tb->pop_order);
    tb->gate_pool = moesim_xcalloc((size_t)SYNTH_GATE_POOL * m->top_k, sizeof *tb->gate_pool);
    tb->reuse_top1 = moesim_xcalloc(L, sizeof *tb->reuse_top1);
    tb->copy_cdf = moesim_xcalloc((size_t)L * m->top_k, sizeof *tb->copy_cdf);
    tb->copies = moesim_xcalloc(L, sizeof *tb->copies);
    tb->avoid_other = moesim_xcalloc(L, sizeof *tb->avoid_other);
    tb->avoid_top1 = moesim_xcalloc(L, sizeof *tb->avoid_top1);
    tb->history = moesim_xcalloc(L, sizeof *tb->history);
    tb->avoid_history = moesim_xcalloc(L, sizeof *tb->avoid_history);
    tb->H = (uint32_t)kn->reuse_history_tokens;
    tb->history_tokens = moesim_xcalloc(L, sizeof *tb->history_tokens);
    tb->repeat = prob_threshold(kn->repeat_decode_token);
    tb->row_copy = moesim_xcalloc(2 * (size_t)L, sizeof *tb->row_copy);

    double *shared = moesim_xcalloc(E, sizeof *shared); /* [E] common part of log-popularity */
    double *own = moesim_xcalloc(E, sizeof *own);       /* [E] workload's own part */
    double *logpop = moesim_xcalloc(E, sizeof *logpop); /* [E] */
    double *quantiles = moesim_xcalloc(E, sizeof *quantiles); /* [E] normal scores */
    for (uint32_t e = 0; e < E; e++) quantiles[e] = gsl_cdf_ugaussian_Pinv((e + 0.5) / E);
    double *w = moesim_xcalloc(E, sizeof *w);
    double *scaled = moesim_xcalloc(E, sizeof *scaled);
    uint32_t *small = moesim_xcalloc(E, sizeof *small), *large = moesim_xcalloc(E, sizeof *large);
    weighted_expert *order = moesim_xcalloc(E, sizeof *order);
    const double ws[SYNTH_N_WORKLOADS] = {kn->workload_skew_text, kn->workload_skew_math,
                                          kn->workload_skew_code};
    const double c = kn->workload_hot_set_correlation, c_own = sqrt(1.0 - c * c);
    for (uint32_t l = 0; l < L; l++) {
        const double skew = synth_depth_profile(kn->popularity_skew_first, kn->popularity_skew_mid,
                                                kn->popularity_skew_last, l, L);
        if (o->popularity)
            fitted_tables_layer(tb, o->popularity, l, w, scaled, small, large, order);
        else
            normal_scores_shuffled(shared, quantiles, E, g);
        for (uint32_t wl = 0; wl < W && !o->popularity; wl++) {
            normal_scores_shuffled(own, quantiles, E, g);
            for (uint32_t e = 0; e < E; e++)
                logpop[e] = skew * ws[wl] * (c * shared[e] + c_own * own[e]);
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
                size_t at = (((size_t)wl * T + t) * L + l) * E;
                alias_build(w, E, tb->cells + at, scaled, small, large);
            }
        }
        const double top1 = synth_layer_knob_value(o, SYNTH_LK_REUSE_TOP1, l, L);
        tb->reuse_top1[l] = prob_threshold(top1);
        tb->avoid_top1[l] = prob_threshold(-top1); /* < 0: repulsion from prev's top-1 */
        const double other = synth_layer_knob_value(o, SYNTH_LK_REUSE_OTHER, l, L);
        /* > 0: slots that copy a predecessor's expert; < 0: redraw a predecessor's expert */
        binomial_cdf_thresholds(m->top_k - 1, other > 0 ? other : 0,
                                tb->copy_cdf + (size_t)l * m->top_k);
        tb->copies[l] = other > 0;
        tb->avoid_other[l] = prob_threshold(-other);
        const double hist = synth_layer_knob_value(o, SYNTH_LK_REUSE_HISTORY, l, L);
        tb->history[l] = prob_threshold(hist);
        tb->avoid_history[l] = prob_threshold(-hist); /* < 0: the request's recent experts */
        tb->any_history |= tb->history[l] != 0 || tb->avoid_history[l] != 0;
        const double reach = synth_layer_knob_value(o, SYNTH_LK_HISTORY_TOKENS, l, L);
        tb->history_tokens[l] = reach < 1 ? 1 : reach > tb->H ? tb->H : (uint32_t)lround(reach);
        tb->row_copy[l] = prob_threshold(synth_layer_knob_value(o, SYNTH_LK_ROW_PREFILL, l, L));
        tb->row_copy[L + l] = prob_threshold(synth_layer_knob_value(o, SYNTH_LK_ROW_DECODE, l, L));
    }
    gate_pool_build(tb->gate_pool, m->top_k, E, m->gate_norm, kn->gate_logit_scale,
                    kn->gate_tail_gap, g);
    free(order);
    free(large);
    free(small);
    free(scaled);
    free(w);
    free(logpop);
    free(own);
    free(quantiles);
    free(shared);
}

static void tables_free(synth_tables *tb) {
    free(tb->cells);
    free(tb->pop_order);
    free(tb->gate_pool);
    free(tb->reuse_top1);
    free(tb->copy_cdf);
    free(tb->copies);
    free(tb->avoid_other);
    free(tb->avoid_top1);
    free(tb->history_tokens);
    free(tb->history);
    free(tb->avoid_history);
    free(tb->row_copy);
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
            /* in turn from topic 0: with a fitted table, the real requests in their order, so
             * requests that run together are those that ran together in the real trace */
            if (o->knobs.topic_cycle)
                p->topic = r > 0 ? (plan[r - 1].topic + 1) % n_topics : 0;
            else
                p->topic = (uint32_t)rng_below(g, n_topics);
        }
        p->first_token = at;
        at += (uint64_t)p->prompt + p->gen;
    }
    return at;
}

/* ---- routing of one token at one layer ---- */

/* Membership of the experts chosen so far in a row: stamped, never cleared per row. */
typedef struct route_work {
    uint32_t *mark;  /* [E] chosen for the current row */
    uint32_t *pmark; /* [E] in the predecessor's row (anti-reuse layers only) */
    uint32_t *hmark; /* [E] in the rows 2.. back that history reaches (history-avoiding layers) */
    uint32_t stamp;
    uint32_t E;
} route_work;

/* One draw from the table that is not yet in the row (and, at layers with anti-reuse, redrawn
 * with probability avoid when the predecessor used it, or avoid_history when one of the tokens
 * 2..reach + 1 back did); the most popular unchosen expert after SYNTH_DRAW_CAP rejected
 * draws. */
static inline __attribute__((always_inline)) uint16_t
route_draw(const synth_tables *tb, uint32_t l, const alias_cell *cells, const uint16_t *pop,
           const uint16_t *prev, const route_work *rw, rng_block *g) {
    const uint32_t E = tb->E;
    for (uint32_t tries = 0; tries < SYNTH_DRAW_CAP; tries++) {
        uint16_t e = alias_draw(cells, E, g);
        if (rw->mark[e] == rw->stamp) continue;
        if (prev && tb->avoid_other[l] && rw->pmark[e] == rw->stamp &&
            rng_block_u32(g) < tb->avoid_other[l])
            continue; /* anti-reuse: redraw an expert the predecessor used */
        if (tb->avoid_history[l] && rw->hmark[e] == rw->stamp &&
            rng_block_u32(g) < tb->avoid_history[l])
            continue; /* anti-reuse further back: redraw an expert of the recent history */
        return e;
    }
    for (uint32_t j = 0; j < E; j++) /* rare: the most popular unchosen expert */
        if (rw->mark[pop[j]] != rw->stamp) return pop[j];
    MOESIM_UNREACHABLE(); /* a row holds k <= E experts */
}

/* The request's last tokens at one layer, for reuse_history: rows [H + 1][k], token i at
 * i mod (H + 1); `n` tokens of the request so far. */
typedef struct route_history {
    const uint16_t *rows;
    uint32_t n;
} route_history;

/* A drawn slot's history copy: with probability history[l], an expert of one of the tokens 2..H
 * + 1 back (the previous token is the reuse knobs' part; token and slot uniform, one number)
 * that the row does not hold yet; TRACE_NO_EXPERT when the slot is drawn from the table
 * instead. */
static inline uint16_t history_pick(const synth_tables *tb, uint32_t l, const route_history *h,
                                    const route_work *rw, rng_block *g) {
    if (!tb->history[l] || h->n < 2 || rng_block_u32(g) >= tb->history[l]) return TRACE_NO_EXPERT;
    const uint32_t k = tb->k, reach = tb->history_tokens[l];
    const uint32_t avail = h->n - 1 < reach ? h->n - 1 : reach;
    const uint32_t at = (uint32_t)(((uint64_t)rng_block_u32(g) * (avail * k)) >> 32);
    const uint32_t back = 2 + at / k; /* tokens back: 2..avail + 1 */
    const uint16_t e = h->rows[(size_t)((h->n - back) % (tb->H + 1)) * k + at % k];
    return rw->mark[e] == rw->stamp ? TRACE_NO_EXPERT : e;
}

/* Fills `row` [k] (slot 0 = top-1) and `gates` [k]. `prev` is the previous token's row of this
 * request at this layer, or NULL. Slot 0 copies prev's top-1 with probability reuse_top1, else
 * is drawn; then Binomial(k - 1, reuse_other) slots copy a random expert of prev (skipped when
 * already chosen); the rest are drawn without replacement. With `hist` (layers that copy from
 * their history), each drawn slot is first offered a history copy (history_pick). */
static void route_row(const synth_tables *tb, uint32_t l, const alias_cell *cells,
                      const uint16_t *pop, const uint16_t *prev, const route_history *hist,
                      uint16_t *row, float *gates, route_work *rw, rng_block *g) {
    const uint32_t k = tb->k;
    if (++rw->stamp == 0) {
        memset(rw->mark, 0, rw->E * sizeof *rw->mark);
        memset(rw->pmark, 0, rw->E * sizeof *rw->pmark);
        memset(rw->hmark, 0, rw->E * sizeof *rw->hmark);
        rw->stamp = 1;
    }
    if (prev && tb->avoid_other[l])
        for (uint32_t j = 0; j < k; j++) rw->pmark[prev[j]] = rw->stamp;
    if (hist && tb->avoid_history[l]) { /* the experts of the tokens 2..reach + 1 back */
        const uint32_t n = hist->n, reach = tb->history_tokens[l];
        for (uint32_t back = 2; back <= reach + 1 && back <= n; back++)
            for (uint32_t j = 0; j < k; j++)
                rw->hmark[hist->rows[(size_t)((n - back) % (tb->H + 1)) * k + j]] = rw->stamp;
    }
    uint16_t e;
    /* one 32-bit draw: the high 22 bits decide the top-1 copy, the low 10 pick the gate row */
    const uint32_t u = rng_block_u32(g);
    if (prev && (u >> SYNTH_GATE_POOL_BITS) < (tb->reuse_top1[l] >> SYNTH_GATE_POOL_BITS)) {
        e = prev[0];
    } else if (!hist || (e = history_pick(tb, l, hist, rw, g)) == TRACE_NO_EXPERT) {
        e = route_draw(tb, l, cells, pop, prev, rw, g);
        /* repulsion: a drawn top-1 equal to prev's is redrawn with probability avoid_top1
         * (consecutive tokens agreeing less than the popularity draw makes them) */
        for (uint32_t tries = 0; prev && e == prev[0] && tb->avoid_top1[l] &&
                                 tries < SYNTH_DRAW_CAP && rng_block_u32(g) < tb->avoid_top1[l];
             tries++)
            e = route_draw(tb, l, cells, pop, prev, rw, g);
    }
    row[0] = e;
    rw->mark[e] = rw->stamp;
    uint32_t n = 1;
    if (prev && tb->copies[l]) {
        uint32_t copies = binomial_draw(tb->copy_cdf + (size_t)l * k, k - 1, g);
        for (uint32_t c = 0; c < copies; c++) {
            e = prev[((uint64_t)rng_block_u32(g) * k) >> 32];
            if (rw->mark[e] == rw->stamp) continue;
            row[n++] = e;
            rw->mark[e] = rw->stamp;
        }
    }
    if (!(prev && tb->avoid_other[l]) && !hist) {
        /* the common case, branch-free: write the draw, advance only when it is new (marking
         * an expert twice is harmless); SYNTH_DRAW_CAP draws per missing slot at most */
        const uint32_t E = tb->E;
        for (uint32_t tries = 0; n < k && tries < SYNTH_DRAW_CAP * k; tries++) {
            e = alias_draw(cells, E, g);
            row[n] = e;
            n += rw->mark[e] != rw->stamp;
            rw->mark[e] = rw->stamp;
        }
    }
    while (n < k) { /* anti-reuse and history layers, and the rare fallback */
        if (!hist || (e = history_pick(tb, l, hist, rw, g)) == TRACE_NO_EXPERT)
            e = route_draw(tb, l, cells, pop, prev, rw, g);
        row[n++] = e;
        rw->mark[e] = rw->stamp;
    }
    const float *gp = tb->gate_pool + (size_t)(u & (SYNTH_GATE_POOL - 1)) * k;
    for (uint32_t j = 0; j < k; j++) gates[j] = gp[j];
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
    double *salience; /* [SYNTH_SALIENCE_POOL] exp(sigma sqrt(1 - a^2) z): per layer */
    double *shared;   /* [SYNTH_SALIENCE_POOL] exp(sigma a z): shared by a token's layers */
} importance_work;

/* Writes the importance of request p's tokens to out [n][L] (n = p's tokens). It depends on the
 * request's length and its own RNG stream only, not on the routing, so it can be made before
 * the request's tokens are. */
static void importance_request(float *out, uint32_t L, const synth_options *o,
                               const request_plan *p, importance_work *iw, rng_block *g) {
    const uint32_t n = p->prompt + p->gen;
    const double s = o->knobs.importance_sink_share;
    uint32_t bits = 0, left = 0; /* one 32-bit draw gives three 10-bit pool indices */
    for (uint32_t q = 0; q < n; q++) {
        if (left == 0) bits = rng_block_u32(g), left = 3;
        iw->base[q] = iw->shared[bits & (SYNTH_SALIENCE_POOL - 1)];
        bits >>= SYNTH_SALIENCE_POOL_BITS;
        left--;
    }
    for (uint32_t l = 0; l < L; l++) {
        left = 0;
        for (uint32_t q = 0; q < n; q++) {
            if (left == 0) bits = rng_block_u32(g), left = 3;
            iw->w[q] = iw->base[q] * iw->salience[bits & (SYNTH_SALIENCE_POOL - 1)];
            bits >>= SYNTH_SALIENCE_POOL_BITS;
            left--;
        }
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
            out[(size_t)q * L + l] = (float)imp;
        }
    }
}

/* ---- look-ahead predictions of one token ----
 *
 * For layer l and distance d (target m = l + d < L): candidate 0 is m's true top-1 with
 * probability top1[d], else its runner-up (or, for k = 1, the most popular other expert). Of
 * m's other true experts, the Binomial(k - 1, keep[d]) strongest (in gate order) take the next
 * of the first min(k, K') places; the remaining places go to m's most popular experts that are
 * not true ones (intruders); then come the deferred true experts, then m's most popular
 * remaining experts up to K'. Scores: m's gate weights by rank, halved per rank beyond k.
 *
 * A row is assembled from those four segments (kept true experts, intruders, deferred true
 * experts, popular tail) copied in whole chunks of LA_CHUNK ids: a chunk may run past its
 * segment and the next segment overwrites the excess, so every source and the row being built
 * have LA_CHUNK ids of slack (what is read there is never kept). */
#define LA_CHUNK 16

typedef struct lookahead_work {
    uint32_t *mark; /* [E] stamp of the set an expert is in */
    uint32_t stamp;
    uint32_t top1[TRACE_MAX_LOOKAHEAD_DEPTH + 1];                      /* [d] thresholds */
    uint32_t keep_cdf[TRACE_MAX_LOOKAHEAD_DEPTH + 1][TRACE_MAX_TOP_K]; /* [d][k] Binomial */
    float score_factor[TRACE_MAX_LOOKAHEAD_K]; /* [K'] 0.5^max(0, c - k + 1) */
    /* scratch for one target layer m */
    float scores[TRACE_MAX_LOOKAHEAD_K]; /* [K'] m's gates by rank, halved beyond k */
    /* [K'] m's most popular experts not chosen (up to k more written while scanning) */
    uint16_t others[TRACE_MAX_LOOKAHEAD_K + TRACE_MAX_TOP_K + LA_CHUNK];
    uint16_t plain[TRACE_MAX_TOP_K + LA_CHUNK];     /* [k] m's true experts, gate order */
    uint16_t swapped[TRACE_MAX_TOP_K + LA_CHUNK];   /* [k] the same with slots 0 and 1 swapped */
    uint16_t row[TRACE_MAX_LOOKAHEAD_K + LA_CHUNK]; /* [K'] the row being assembled */
} lookahead_work;

static inline void la_next(lookahead_work *lw, uint32_t E) {
    if (++lw->stamp == 0) {
        memset(lw->mark, 0, E * sizeof *lw->mark);
        lw->stamp = 1;
    }
}

/* dst[0..n) = src[0..n) in whole chunks, at least one: up to LA_CHUNK ids past n are read from
 * src and written to dst. */
static inline void la_copy(uint16_t *dst, const uint16_t *src, uint32_t n) {
    uint32_t i = 0;
    do {
        memcpy(dst + i, src + i, LA_CHUNK * sizeof *dst);
        i += LA_CHUNK;
    } while (i < n);
}

static void lookahead_token(trace *t, const synth_tables *tb, uint64_t tok, uint8_t workload,
                            lookahead_work *lw, rng_block *g) {
    const uint32_t L = tb->L, E = tb->E, k = tb->k, D = t->meta.lookahead_depth;
    const uint32_t KP = t->meta.lookahead_k, kk = k < KP ? k : KP;
    /* the most others a row takes: candidate 0 true, none of the rest kept, kk - 1 intruders,
     * then the tail after the k - 1 deferred true ones (K' - kk places, if that many); for k = 1
     * with candidate 0 the most popular other, K' - 1 (1 when K' = 1) */
    uint32_t n_need = KP - 1 - (k - 1 < KP - kk ? k - 1 : KP - kk);
    if (k == 1 && n_need == 0) n_need = 1;
    const uint32_t n_scan = n_need + k < E ? n_need + k : E; /* popular experts scanned */
    const size_t base = trace_lookahead_index(t, tok, 0, 1);
    uint16_t *const ids = t->lookahead_ids + base; /* [L][D][K'] this token's rows */
    float *const scs = t->lookahead_scores + base; /* [L][D][K'] */
    /* padding: rows whose target l + d is beyond the last layer */
    for (uint32_t l = L > D ? L - D : 0; l < L; l++)
        for (uint32_t d = L - l; d <= D; d++) {
            const size_t at = ((size_t)l * D + (d - 1)) * KP;
            for (uint32_t c = 0; c < KP; c++) ids[at + c] = TRACE_NO_EXPERT, scs[at + c] = 0;
        }
    /* every target layer m once: its true experts and its popular non-true experts (the
     * intruders and the tail of every row that predicts m) are found once for all d */
    uint16_t *const others = lw->others, *const row = lw->row;
    for (uint32_t m = 1; m < L; m++) {
        const uint16_t *actual = trace_experts(t, tok, m);
        const float *gates = trace_gates(t, tok, m);
        const uint16_t *pop = tb->pop_order + ((size_t)m * tb->W + workload) * E;
        la_next(lw, E);
        for (uint32_t j = 0; j < k; j++) {
            lw->mark[actual[j]] = lw->stamp;
            lw->plain[j] = lw->swapped[j] = actual[j];
        }
        if (k > 1) lw->swapped[0] = actual[1], lw->swapped[1] = actual[0];
        for (uint32_t c = 0; c < kk; c++) lw->scores[c] = gates[c] * lw->score_factor[c];
        for (uint32_t c = kk; c < KP; c++) lw->scores[c] = gates[k - 1] * lw->score_factor[c];
        /* branch-free compaction (write, advance if not a true one) over a fixed span: at most
         * k of the first n_need + k are true ones, so they hold the n_need others a row can
         * take (all E - k when fewer); a row only ever reads the first n_others */
        uint32_t n_others = 0;
        for (uint32_t r = 0; r < n_scan; r++) {
            others[n_others] = pop[r];
            n_others += lw->mark[pop[r]] != lw->stamp;
        }
        if (n_others > n_need) n_others = n_need;
        for (uint32_t d = 1; d <= D && d <= m; d++) {
            const size_t at = ((size_t)(m - d) * D + (d - 1)) * KP;
            const uint16_t *rest; /* [n_rest] the true experts after candidate 0, gate order */
            uint32_t n_rest, next_other = 0;
            if (rng_block_u32(g) < lw->top1[d]) {
                row[0] = actual[0], rest = lw->plain + 1, n_rest = k - 1;
            } else if (k > 1) {
                row[0] = actual[1], rest = lw->swapped + 1, n_rest = k - 1;
            } else if (n_others > 0) { /* k = 1: the most popular other expert */
                row[0] = others[next_other++], rest = lw->plain, n_rest = 1;
            } else {
                row[0] = actual[0], rest = lw->plain + 1, n_rest = 0;
            }
            const uint32_t kept = k > 1 ? binomial_draw(lw->keep_cdf[d], k - 1, g) : 0;
            uint32_t place = kk - 1 < kept ? kk - 1 : kept; /* kept true ones in the first kk */
            if (place > n_rest) place = n_rest;
            la_copy(row + 1, rest, place);
            uint32_t n = 1 + place;
            const uint32_t n_in = /* intruders up to kk */
                kk - n < n_others - next_other ? kk - n : n_others - next_other;
            la_copy(row + n, others + next_other, n_in);
            n += n_in, next_other += n_in;
            const uint32_t n_def = /* the deferred true experts */
                n_rest - place < KP - n ? n_rest - place : KP - n;
            la_copy(row + n, rest + place, n_def);
            n += n_def;
            /* K' <= E distinct candidates exist: m's popular tail fills the row */
            MOESIM_ASSERT(next_other + (KP - n) <= n_others);
            la_copy(row + n, others + next_other, KP - n);
            if (KP == 16) { /* the default K': fixed-size copies */
                memcpy(ids + at, row, 16 * sizeof *row);
                memcpy(scs + at, lw->scores, 16 * sizeof *lw->scores);
            } else {
                memcpy(ids + at, row, KP * sizeof *row);
                memcpy(scs + at, lw->scores, KP * sizeof *lw->scores);
            }
        }
    }
}

/* ---- the whole run ---- */

/* Faults in a large array the generator is about to fill in one system call
 * (MADV_POPULATE_WRITE, Linux >= 5.14) instead of one page fault per 4 KiB page on first touch,
 * asking for transparent huge pages first (MADV_HUGEPAGE). Hints only: where unsupported
 * nothing changes, and the bytes written never depend on them. */
static void prefault(void *p, size_t size_bytes) {
#ifdef MADV_POPULATE_WRITE
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (!p || size_bytes < ((size_t)1 << 20) || page == 0 || page == (uintptr_t)-1) return;
    uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t end = ((uintptr_t)p + size_bytes) & ~(page - 1);
    if (end <= start) return;
#ifdef MADV_HUGEPAGE
    /* 2 MiB pages where the kernel has them on request (transparent_hugepage=madvise): one
     * fault and one TLB entry per 512 small pages (bench_synth with look-ahead: +19 % records
     * per CPU-second) */
    (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
#endif
    (void)madvise((void *)start, end - start, MADV_POPULATE_WRITE);
#else
    (void)p, (void)size_bytes;
#endif
}

/* What one run keeps from its first request to its last: tables, the request plan, the RNG
 * streams and the work buffers. */
typedef struct synth_run {
    const synth_options *o;
    trace_meta meta;
    synth_tables tb;
    request_plan *plan; /* [n_requests] */
    uint64_t n_tokens;  /* of the whole trace */
    uint32_t longest;   /* tokens of the longest request */
    rng *r_route, *r_imp, *r_look;
    rng_block *g_route, *g_imp, *g_look;
    importance_work iw;
    route_work rw;
    uint16_t *history; /* [L][H + 1][k] the request's last H + 1 rows (reuse_history), or NULL */
    lookahead_work lw;
    progress bar;
} synth_run;

static void run_begin(synth_run *s, const model_geometry *m, const synth_options *o) {
    memset(s, 0, sizeof *s);
    s->o = o;
    trace_meta_from_model(&s->meta, m);
    snprintf(s->meta.source, sizeof s->meta.source, "synth:%llu", (unsigned long long)o->seed);
    snprintf(s->meta.tool_version, sizeof s->meta.tool_version, "%s", MOESIM_VERSION);
    s->meta.lookahead_depth = o->lookahead_depth;
    s->meta.lookahead_k = o->lookahead_depth ? o->lookahead_k : 0;
    s->meta.has_importance = true;
    s->meta.has_token_ids = false;

    rng *r_tables = rng_create_stream(o->seed, STREAM_TABLES);
    tables_build(&s->tb, m, o, r_tables);
    rng_destroy(r_tables);
    s->plan = moesim_xcalloc(o->n_requests, sizeof *s->plan);
    rng *r_plan = rng_create_stream(o->seed, STREAM_PLAN);
    s->n_tokens = plan_build(s->plan, o, s->tb.T, r_plan);
    rng_destroy(r_plan);
    for (uint32_t r = 0; r < o->n_requests; r++) {
        const uint32_t n = s->plan[r].prompt + s->plan[r].gen;
        s->longest = n > s->longest ? n : s->longest;
    }

    s->r_route = rng_create_stream(o->seed, STREAM_ROUTING);
    s->r_imp = rng_create_stream(o->seed, STREAM_IMPORTANCE);
    s->r_look = rng_create_stream(o->seed, STREAM_LOOKAHEAD);
    s->g_route = moesim_xmalloc(sizeof *s->g_route);
    s->g_imp = moesim_xmalloc(sizeof *s->g_imp);
    s->g_look = moesim_xmalloc(sizeof *s->g_look);
    rng_block_init(s->g_route, rng_gsl(s->r_route));
    rng_block_init(s->g_imp, rng_gsl(s->r_imp));
    rng_block_init(s->g_look, rng_gsl(s->r_look));

    importance_work *iw = &s->iw;
    iw->w = moesim_xcalloc(s->longest, sizeof(double));
    iw->base = moesim_xcalloc(2 * (size_t)s->longest, sizeof(double));
    iw->salience = moesim_xcalloc(SYNTH_SALIENCE_POOL, sizeof(double));
    iw->shared = moesim_xcalloc(SYNTH_SALIENCE_POOL, sizeof(double));
    const double a = o->knobs.importance_layer_correlation;
    const double sd = o->knobs.importance_salience_sigma * sqrt(1.0 - a * a);
    const double sa = o->knobs.importance_salience_sigma * a;
    for (uint32_t i = 0; i < SYNTH_SALIENCE_POOL; i++) {
        iw->salience[i] = exp(sd * gsl_ran_gaussian_ziggurat(rng_gsl(s->r_imp), 1.0));
        iw->shared[i] = exp(sa * gsl_ran_gaussian_ziggurat(rng_gsl(s->r_imp), 1.0));
    }

    const synth_tables *tb = &s->tb;
    s->rw = (route_work){.mark = moesim_xcalloc(tb->E, sizeof(uint32_t)),
                         .pmark = moesim_xcalloc(tb->E, sizeof(uint32_t)),
                         .hmark = moesim_xcalloc(tb->E, sizeof(uint32_t)),
                         .E = tb->E};
    if (tb->any_history)
        s->history = moesim_xcalloc((size_t)tb->L * (tb->H + 1) * tb->k, sizeof *s->history);
    lookahead_work *lw = &s->lw;
    lw->mark = moesim_xcalloc(tb->E, sizeof(uint32_t));
    for (uint32_t c = 0; c < o->lookahead_k && o->lookahead_depth; c++)
        lw->score_factor[c] = c + 1 > tb->k ? (float)ldexp(1.0, -(int)(c + 1 - tb->k)) : 1.0f;
    for (uint32_t d = 1; d <= o->lookahead_depth; d++) {
        const synth_knobs *kn = &o->knobs;
        double acc = d == 1   ? kn->lookahead_top1_d1
                     : d == 2 ? kn->lookahead_top1_d2
                              : kn->lookahead_top1_d3 * pow(kn->lookahead_top1_decay, d - 3.0);
        double recall = kn->lookahead_recall_d1 * pow(kn->lookahead_recall_decay, d - 1.0);
        double keep = tb->k > 1 ? (tb->k * recall - 1.0) / (tb->k - 1.0) : 1.0;
        lw->top1[d] = prob_threshold(acc);
        if (tb->k > 1)
            binomial_cdf_thresholds(tb->k - 1, keep < 0 ? 0 : keep > 1 ? 1 : keep, lw->keep_cdf[d]);
    }
    progress_begin(&s->bar, "synth", s->n_tokens, o->show_progress);
}

/* Generates tokens i0..i1-1 of request r into `win` from its first position on; `prev_at` is
 * the window position of token i0 - 1 when i0 > 0 (the routing of a token depends on its
 * predecessor's). Importance is not written here. */
static void run_tokens(synth_run *s, trace *win, uint32_t r, uint32_t i0, uint32_t i1,
                       uint64_t prev_at) {
    const synth_tables *tb = &s->tb;
    const uint32_t L = tb->L, W = tb->W, T = tb->T, E = tb->E, P = tb->P;
    const request_plan *p = &s->plan[r];
    MOESIM_ASSERT(i0 <= i1 && i1 <= p->prompt + p->gen && i1 - i0 <= win->n_tokens);
    for (uint32_t i = i0; i < i1; i++) {
        const uint64_t tok = i - i0;                       /* in the window */
        const uint64_t prev = i == i0 ? prev_at : tok - 1; /* meaningful when i > 0 */
        win->request_id[tok] = r;
        win->position[tok] = i;
        win->phase[tok] = i < p->prompt ? TRACE_PREFILL : TRACE_DECODE;
        /* a repeated decode token routes exactly as its predecessor at every layer, a row copy at
         * one layer (numbers drawn only when they are on) */
        const bool repeat =
            tb->repeat && i > 0 && i >= p->prompt && rng_block_u32(s->g_route) < tb->repeat;
        for (uint32_t l = 0; l < L; l++) {
            const uint32_t ph = P > 1 && i >= p->prompt; /* the decode rows of a fitted table */
            const size_t tab = ((((size_t)p->workload * T + p->topic) * P + ph) * L + l) * E;
            const size_t row = trace_route_index(win, tok, l);
            uint16_t *ring = s->history ? s->history + (size_t)l * (tb->H + 1) * tb->k : NULL;
            const route_history hist = {ring, i};
            const uint32_t row_copy = tb->row_copy[(size_t)(i >= p->prompt) * L + l];
            if (repeat || (i > 0 && row_copy && rng_block_u32(s->g_route) < row_copy)) {
                const size_t from = trace_route_index(win, prev, l);
                memcpy(win->expert_ids + row, win->expert_ids + from, tb->k * sizeof(uint16_t));
                memcpy(win->gate_weights + row, win->gate_weights + from, tb->k * sizeof(float));
            } else {
                route_row(tb, l, tb->cells + tab, tb->pop_order + ((size_t)l * W + p->workload) * E,
                          i ? win->expert_ids + trace_route_index(win, prev, l) : NULL,
                          tb->history[l] || tb->avoid_history[l] ? &hist : NULL,
                          win->expert_ids + row, win->gate_weights + row, &s->rw, s->g_route);
            }
            if (ring) /* the ring outlives the window, which may cut the request anywhere */
                memcpy(ring + (size_t)(i % (tb->H + 1)) * tb->k, win->expert_ids + row,
                       tb->k * sizeof *ring);
        }
        if (s->o->lookahead_depth) lookahead_token(win, tb, tok, p->workload, &s->lw, s->g_look);
    }
}

static void run_end(synth_run *s) {
    if (s->bar.enabled) progress_end(&s->bar);
    free(s->lw.mark);
    free(s->rw.mark);
    free(s->rw.pmark);
    free(s->rw.hmark);
    free(s->history);
    free(s->iw.w);
    free(s->iw.base);
    free(s->iw.salience);
    free(s->iw.shared);
    free(s->g_route);
    free(s->g_imp);
    free(s->g_look);
    rng_destroy(s->r_look);
    rng_destroy(s->r_imp);
    rng_destroy(s->r_route);
    free(s->plan);
    tables_free(&s->tb);
}

/* The run's working memory (run_begin: every request's plan, the longest request's importance
 * arrays) against the machine's: asked for more, the run says so instead of aborting. */
static moesim_status check_working_memory(const synth_options *o, moesim_error *err) {
    uint64_t longest = (uint64_t)o->prompt_len.max + o->gen_len.max;
    double need =
        (double)o->n_requests * sizeof(request_plan) + (double)longest * 3 * sizeof(double);
    double have = moesim_physical_memory_bytes();
    if (have > 0 && need > have)
        return moesim_fail(err, MOESIM_EINPUT,
                           "synth: %u requests of up to %llu tokens need %.1f GiB of working "
                           "memory, this machine has %.1f GiB (expected fewer or shorter requests)",
                           o->n_requests, (unsigned long long)longest, need / (1u << 30),
                           have / (1u << 30));
    return MOESIM_OK;
}

moesim_status synth_stream(const model_geometry *m, const synth_options *o, const synth_sink *sink,
                           moesim_error *err) {
    if (synth_options_check(o, m, err)) return err ? err->status : MOESIM_EINPUT;
    if (check_working_memory(o, err)) return err ? err->status : MOESIM_EINPUT;
    synth_run s;
    run_begin(&s, m, o);
    char *params_json = synth_params_json(o, m);
    moesim_status st = sink->begin(sink->ctx, &s.meta, s.n_tokens, o->n_requests, params_json, err);
    free(params_json);
    const uint32_t L = s.meta.n_layers;
    const uint64_t per_token = trace_bytes_per_token(&s.meta);
    /* at least 2 tokens: a request's next block reads its predecessor at the window's last
     * position while writing its first */
    uint64_t window = SYNTH_WINDOW_BYTES / per_token;
    window = window < 2 ? 2 : window;
    window = window > s.longest ? s.longest : window;
    trace *win = st ? NULL : trace_try_create(&s.meta, window);
    float *imp = st ? NULL : malloc((size_t)s.longest * L * sizeof *imp); /* [longest][L] */
    if (!st && (!win || !imp))
        st = moesim_fail(err, MOESIM_ENOMEM,
                         "synthesized trace: cannot allocate a window of %llu tokens (%.1f MB)",
                         (unsigned long long)window, (double)window * (double)per_token / 1e6);
    for (uint32_t r = 0; r < o->n_requests && !st; r++) {
        const request_plan *p = &s.plan[r];
        const uint32_t n = p->prompt + p->gen;
        importance_request(imp, L, o, p, &s.iw, s.g_imp);
        for (uint32_t i0 = 0; i0 < n && !st; i0 += (uint32_t)window) {
            const uint32_t i1 = n - i0 < window ? n : i0 + (uint32_t)window;
            win->n_tokens = i1 - i0;
            /* the previous piece of this request ended at the window's last position */
            run_tokens(&s, win, r, i0, i1, window - 1);
            memcpy(win->importance, imp + (size_t)i0 * L, (size_t)(i1 - i0) * L * sizeof *imp);
            st = sink->block(sink->ctx, win, err);
        }
        if (s.bar.enabled) progress_update(&s.bar, p->first_token + n);
    }
    free(imp);
    trace_destroy(win);
    run_end(&s);
    return st;
}

/* The sink of synth_generate: the whole trace, filled block by block (copying a cache-warm
 * window is cheaper than generating straight into 1.6 GB of cold memory). */
typedef struct memory_sink {
    trace *t;
    uint64_t filled; /* tokens copied so far */
} memory_sink;

static moesim_status memory_sink_begin(void *ctx, const trace_meta *meta, uint64_t n_tokens,
                                       uint32_t n_requests, const char *params_json,
                                       moesim_error *err) {
    memory_sink *f = ctx;
    trace *t = f->t = trace_try_create(meta, n_tokens);
    if (!t)
        return moesim_fail(err, MOESIM_ENOMEM,
                           "synthesized trace: cannot allocate %llu tokens (%.1f MB)",
                           (unsigned long long)n_tokens,
                           (double)n_tokens * (double)trace_bytes_per_token(meta) / 1e6);
    t->n_requests = n_requests;
    t->params_json = moesim_xstrdup(params_json);
    const size_t route = (size_t)n_tokens * trace_route_values(meta);
    const size_t look = (size_t)n_tokens * trace_lookahead_values(meta);
    prefault(t->expert_ids, route * sizeof *t->expert_ids);
    prefault(t->gate_weights, route * sizeof *t->gate_weights);
    prefault(t->importance, (size_t)n_tokens * meta->n_layers * sizeof(float));
    prefault(t->lookahead_ids, look * sizeof *t->lookahead_ids);
    prefault(t->lookahead_scores, look * sizeof *t->lookahead_scores);
    return MOESIM_OK;
}

static moesim_status memory_sink_block(void *ctx, const trace *block, moesim_error *err) {
    (void)err;
    memory_sink *f = ctx;
    trace_copy_tokens(f->t, f->filled, block);
    f->filled += block->n_tokens;
    return MOESIM_OK;
}

moesim_status synth_generate(const model_geometry *m, const synth_options *o, trace **out,
                             moesim_error *err) {
    memory_sink f = {0};
    const synth_sink sink = {memory_sink_begin, memory_sink_block, &f};
    moesim_status st = synth_stream(m, o, &sink, err);
    if (st) {
        trace_destroy(f.t);
        f.t = NULL;
    }
    /* Requests are dense and in order by construction; trace_check runs in the tests and again
     * in trace_write, so it is not repeated here (it is ~10 % of the generation time). */
    *out = f.t;
    return st;
}

/* The sink of synth_write: a streaming trace writer. */
typedef struct file_sink {
    const char *path;
    trace_writer *w;
} file_sink;

static moesim_status file_sink_begin(void *ctx, const trace_meta *meta, uint64_t n_tokens,
                                     uint32_t n_requests, const char *params_json,
                                     moesim_error *err) {
    file_sink *f = ctx;
    return trace_writer_open(meta, n_tokens, n_requests, params_json, f->path, &f->w, err);
}

static moesim_status file_sink_block(void *ctx, const trace *block, moesim_error *err) {
    file_sink *f = ctx;
    return trace_writer_append(f->w, block, err);
}

moesim_status synth_write(const model_geometry *m, const synth_options *o, const char *path,
                          moesim_error *err) {
    file_sink f = {.path = path};
    const synth_sink sink = {file_sink_begin, file_sink_block, &f};
    moesim_status st = synth_stream(m, o, &sink, err);
    if (st) {
        trace_writer_abort(f.w);
        return st;
    }
    return trace_writer_commit(f.w, err);
}
