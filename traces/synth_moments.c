/* Moments of a router trace that trace_stats does not compute (traces/synth_moments.h): what the
 * fit (traces/synth_fit.c) and the real-vs-synthetic comparison (traces/synth_compare.c) read
 * besides traces/stats.h. The per-layer statistics and the moments come from one pass over the
 * tokens in trace order (fit_pass: a trace in memory, or a stream's blocks), which keeps per
 * request in flight its previous token and nothing per token; the drift (the comparison only)
 * orders each request's rows and reads a trace in memory. Shares in [0, 1]; NaN where a trace
 * has nothing to measure. */
#include "traces/synth_moments.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"

static int cmp_u32(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Gini of counts x[0..E) (sorted in place), as STATS.md defines it; NaN when all zero. */
double fit_gini_of(uint32_t *x, uint32_t E) {
    if (E <= 64) { /* insertion sort: a fit sorts hundreds of thousands of short rows */
        for (uint32_t i = 1; i < E; i++) {
            const uint32_t v = x[i];
            uint32_t j = i;
            for (; j > 0 && x[j - 1] > v; j--) x[j] = x[j - 1];
            x[j] = v;
        }
    } else {
        qsort(x, E, sizeof *x, cmp_u32);
    }
    double num = 0, sum = 0;
    for (uint32_t i = 0; i < E; i++) num += (double)(i + 1) * x[i], sum += x[i];
    return sum > 0 ? 2 * num / (E * sum) - (E + 1.0) / E : NAN;
}

/* ---- per-layer statistics, the fast way ---- */

/* The row's top-1 (largest gate, the first on ties), as STATS.md defines it. */
static uint16_t row_top1(const uint16_t *ids, const float *gates, uint32_t k) {
    uint32_t best = 0;
    for (uint32_t j = 1; j < k; j++)
        if (gates[j] > gates[best]) best = j;
    return ids[best];
}

/* Set bits of x (SWAR: inline where the target has no popcount instruction by default). */
static inline uint32_t bit_count(uint64_t x) {
    x -= (x >> 1) & 0x5555555555555555ull;
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
    return (uint32_t)((x * 0x0101010101010101ull) >> 56);
}

/* Each request's decode rows in trace order (their positions' order), per layer cut into
 * windows of FIT_DRIFT_WINDOW recorded rows (a last partial one left out). */
void fit_drift_compute(const trace *t, double *drift) {
    const uint32_t L = t->meta.n_layers, E = t->meta.n_experts, k = t->meta.top_k;
    const uint32_t R = t->n_requests, Wn = FIT_DRIFT_WINDOW;
    uint64_t *start = moesim_xcalloc((size_t)R + 1, sizeof *start); /* [R + 1] */
    for (uint64_t i = 0; i < t->n_tokens; i++)
        start[t->request_id[i] + 1] += t->phase[i] == TRACE_DECODE;
    for (uint32_t r = 0; r < R; r++) start[r + 1] += start[r];
    uint64_t *order = moesim_xmalloc((start[R] ? start[R] : 1) * sizeof *order);
    uint64_t *fill = moesim_xmalloc(((size_t)R + 1) * sizeof *fill);
    memcpy(fill, start, ((size_t)R + 1) * sizeof *fill);
    for (uint64_t i = 0; i < t->n_tokens; i++)
        if (t->phase[i] == TRACE_DECODE) order[fill[t->request_id[i]]++] = i;
    uint32_t *win = moesim_xcalloc(E, sizeof *win), *tot = moesim_xcalloc(E, sizeof *tot);
    for (uint32_t l = 0; l < L; l++) {
        double sum = 0;
        uint64_t n = 0;
        for (uint32_t r = 0; r < R; r++) {
            uint64_t rows = 0, end = start[r];
            for (uint64_t j = start[r]; j < start[r + 1]; j++)
                rows += fit_row_recorded(trace_experts(t, order[j], l));
            const uint64_t windows = rows / Wn;
            if (windows < 2) continue;
            memset(tot, 0, E * sizeof *tot);
            for (uint64_t used = 0; used < windows * Wn; end++) { /* the whole windows' rows */
                const uint16_t *ids = trace_experts(t, order[end], l);
                if (!fit_row_recorded(ids)) continue;
                for (uint32_t j = 0; j < k; j++) tot[ids[j]]++;
                used++;
            }
            memset(win, 0, E * sizeof *win);
            uint64_t in = 0;
            for (uint64_t j = start[r]; j < end; j++) {
                const uint16_t *ids = trace_experts(t, order[j], l);
                if (!fit_row_recorded(ids)) continue;
                for (uint32_t a = 0; a < k; a++) win[ids[a]]++;
                if (++in < Wn) continue;
                double tv = 0;
                for (uint32_t e = 0; e < E; e++)
                    tv += fabs((double)win[e] / (Wn * k) - (double)tot[e] / (windows * Wn * k));
                sum += 0.5 * tv, n++;
                memset(win, 0, E * sizeof *win);
                in = 0;
            }
        }
        drift[l] = n ? sum / (double)n : NAN;
    }
    free(tot);
    free(win);
    free(fill);
    free(order);
    free(start);
}

/* ---- one pass, token by token ---- */

/* A request in flight: its previous token's rows and its own counts (a slot, reused once the
 * request has passed). */
typedef struct pass_request {
    uint32_t seen;       /* its tokens passed */
    bool has_prev;       /* prev holds its previous token */
    bool prev_decode;    /* that token was a decode token */
    uint16_t *prev;      /* [L][k] the previous token's experts */
    uint16_t *prev_top1; /* [L] their top-1, at the recorded rows (FIT_LAYER_STATS) */
    uint32_t *count;     /* [L][E] its activations (FIT_MOMENT_REQUEST_GINI), else NULL */
    uint32_t *rows;      /* [L] its recorded rows (likewise) */
} pass_request;

struct fit_pass {
    uint32_t L, E, k, W; /* W: 64-bit words of an expert mask */
    unsigned what;
    const trace_request_index *ix; /* borrowed */
    uint32_t *slot_of;             /* [R] the slot of a request in flight; UINT32_MAX: none */
    pass_request *slot;            /* [n_slots] */
    uint32_t *idle;                /* [n_slots] slots free for the next request (n_idle of them) */
    uint32_t n_slots, n_idle;
    /* per-layer statistics. LRU depth by bit masks: since[l][e] holds the experts of layer l
     * used since e was (W words of 64), so e's depth is 1 + its popcount; a route ORs its
     * experts into every mask at once, E * W word operations per row whatever the depths */
    uint32_t *count;                    /* [L][E] */
    uint64_t *since;                    /* [L][E][W] */
    uint8_t *used;                      /* [L][E] used yet */
    uint64_t *depth;                    /* [L][E + 2] */
    uint64_t *pairs, *same, *any, *acc; /* [L] */
    /* moments */
    uint64_t repeat_pairs, repeat_same;
    uint64_t *shared_pairs, *shared_hits; /* [phase][L] */
    double *request_gini; /* [R][L] the gini of a request's counts; NaN: fewer than two rows */
    double gate_top, gate_sum;
    uint64_t gate_rows;
    uint32_t *len; /* [R] the request's positions (last + 1), with importance; else NULL */
    double *harm;  /* [longest + 1] harm[n] = sum_{q <= n} 1/q */
    double sink, s1, s2, sxy, sx, sy, sxx, syy;
    uint64_t n_sink, n_x, n_xy;
    uint32_t decode_open, decode_most; /* requests whose decode is under way: now, at most */
};

const trace *fit_row_in_memory(void *t, uint64_t token, uint64_t *local) {
    *local = token;
    return t;
}

typedef struct last_token {
    uint64_t token; /* the request's last token */
    uint32_t r;
} last_token;

static int cmp_last_token(const void *a, const void *b) {
    const uint64_t x = ((const last_token *)a)->token, y = ((const last_token *)b)->token;
    return (x > y) - (x < y);
}

/* Each request's positions (its last token's + 1), the last tokens read in trace order so that a
 * stream reads each block once. */
static uint32_t *request_lengths(const trace_request_index *ix, fit_row_fn row, void *src) {
    const uint32_t R = ix->n_requests;
    uint32_t *len = moesim_xcalloc(R ? R : 1, sizeof *len);
    last_token *last = moesim_xmalloc((R ? R : 1) * sizeof *last);
    for (uint32_t r = 0; r < R; r++)
        last[r] = (last_token){trace_request_token(ix, r, ix->n_tokens[r] - 1), r};
    qsort(last, R, sizeof *last, cmp_last_token);
    for (uint32_t i = 0; i < R; i++) {
        uint64_t local;
        const trace *b = row(src, last[i].token, &local);
        len[last[i].r] = b->position[local] + 1;
    }
    free(last);
    return len;
}

fit_pass *fit_pass_create(const trace *tokens, const trace_request_index *ix, fit_row_fn row,
                          void *src, unsigned what) {
    const uint32_t L = tokens->meta.n_layers, E = tokens->meta.n_experts, k = tokens->meta.top_k;
    const uint32_t R = ix->n_requests;
    fit_pass *p = moesim_xcalloc(1, sizeof *p);
    *p = (fit_pass){.L = L, .E = E, .k = k, .W = (E + 63) / 64, .what = what, .ix = ix};
    MOESIM_ASSERT(p->W <= 16); /* E <= 1024 */
    p->slot_of = moesim_xmalloc((R ? R : 1) * sizeof *p->slot_of);
    for (uint32_t r = 0; r < R; r++) p->slot_of[r] = UINT32_MAX;
    if (what & FIT_LAYER_STATS) {
        p->count = moesim_xcalloc((size_t)L * E, sizeof *p->count);
        p->since = moesim_xcalloc((size_t)L * E * p->W, sizeof *p->since);
        p->used = moesim_xcalloc((size_t)L * E, 1);
        p->depth = moesim_xcalloc((size_t)L * (E + 2), sizeof *p->depth);
        p->pairs = moesim_xcalloc(L, sizeof *p->pairs);
        p->same = moesim_xcalloc(L, sizeof *p->same);
        p->any = moesim_xcalloc(L, sizeof *p->any);
        p->acc = moesim_xcalloc(L, sizeof *p->acc);
    }
    if (what & FIT_MOMENT_SHARED) {
        p->shared_pairs = moesim_xcalloc(2 * (size_t)L, sizeof *p->shared_pairs);
        p->shared_hits = moesim_xcalloc(2 * (size_t)L, sizeof *p->shared_hits);
    }
    if (what & FIT_MOMENT_REQUEST_GINI)
        p->request_gini = moesim_xmalloc(((size_t)R * L + 1) * sizeof *p->request_gini);
    if ((what & FIT_MOMENT_IMPORTANCE) && tokens->meta.has_importance) {
        p->len = request_lengths(ix, row, src);
        uint32_t longest = 0;
        for (uint32_t r = 0; r < R; r++) longest = p->len[r] > longest ? p->len[r] : longest;
        p->harm = moesim_xcalloc((size_t)longest + 1, sizeof *p->harm);
        for (uint32_t q = 1; q <= longest; q++) p->harm[q] = p->harm[q - 1] + 1.0 / q;
    }
    return p;
}

/* A slot for a request's first token. */
static pass_request *slot_take(fit_pass *p, uint32_t r) {
    if (p->n_idle == 0) {
        p->slot = moesim_xrealloc(p->slot, (p->n_slots + 1) * sizeof *p->slot);
        p->idle = moesim_xrealloc(p->idle, (p->n_slots + 1) * sizeof *p->idle);
        pass_request *q = &p->slot[p->n_slots];
        *q = (pass_request){.prev = moesim_xmalloc((size_t)p->L * p->k * sizeof *q->prev),
                            .prev_top1 = moesim_xmalloc(p->L * sizeof *q->prev_top1)};
        if (p->what & FIT_MOMENT_REQUEST_GINI) {
            q->count = moesim_xmalloc((size_t)p->L * p->E * sizeof *q->count);
            q->rows = moesim_xmalloc(p->L * sizeof *q->rows);
        }
        p->idle[p->n_idle++] = p->n_slots++;
    }
    const uint32_t s = p->idle[--p->n_idle];
    pass_request *q = &p->slot[s];
    q->seen = 0, q->has_prev = q->prev_decode = false;
    if (q->count) {
        memset(q->count, 0, (size_t)p->L * p->E * sizeof *q->count);
        memset(q->rows, 0, p->L * sizeof *q->rows);
    }
    p->slot_of[r] = s;
    return q;
}

/* The LRU stack depths, counts and reuse of token i's rows (q: its request, whose prev_top1 then
 * becomes this token's at its recorded rows). */
static void layer_stats_token(fit_pass *p, const trace *b, uint64_t i, pass_request *q) {
    const uint32_t L = p->L, E = p->E, k = p->k, W = p->W;
    uint64_t route[16];
    for (uint32_t l = 0; l < L; l++) {
        const uint16_t *ids = trace_experts(b, i, l);
        if (!fit_row_recorded(ids)) continue;
        uint64_t *sl = p->since + (size_t)l * E * W;
        uint8_t *sn = p->used + (size_t)l * E;
        memset(route, 0, W * sizeof *route);
        for (uint32_t j = 0; j < k; j++) { /* depth before the route (STATS.md); 0: cold */
            const uint16_t e = ids[j];
            uint32_t d = 0;
            if (sn[e]) {
                d = 1;
                for (uint32_t w = 0; w < W; w++) d += bit_count(sl[(size_t)e * W + w]);
            }
            p->depth[(size_t)l * (E + 2) + d]++;
            p->count[(size_t)l * E + e]++;
            route[e / 64] |= 1ull << (e % 64);
        }
        if (W == 1) {
            const uint64_t m = route[0];
            for (uint32_t e = 0; e < E; e++) sl[e] |= m;
        } else {
            for (uint32_t e = 0; e < E; e++)
                for (uint32_t w = 0; w < W; w++) sl[(size_t)e * W + w] |= route[w];
        }
        for (uint32_t j = k; j-- > 0;) { /* e_j: the route's later experts are newer */
            const uint16_t e = ids[j];
            memset(sl + (size_t)e * W, 0, W * sizeof *sl);
            for (uint32_t a = j + 1; a < k; a++)
                sl[(size_t)e * W + ids[a] / 64] |= 1ull << (ids[a] % 64);
            sn[e] = 1;
        }
        p->acc[l] += k;
        const uint16_t *pv = q->prev + (size_t)l * k;
        const uint16_t top1 = row_top1(ids, trace_gates(b, i, l), k);
        const bool pair = q->has_prev && fit_row_recorded(pv);
        if (pair) {
            p->pairs[l]++;
            p->same[l] += top1 == q->prev_top1[l];
            bool hit = false;
            for (uint32_t a = 0; a < k && !hit; a++)
                for (uint32_t c = 0; c < k && !hit; c++) hit = ids[a] == pv[c];
            p->any[l] += hit;
        }
        q->prev_top1[l] = top1; /* for the request's next token (pv becomes this row) */
    }
}

/* Whether token i is routed as its predecessor (q->prev) at every layer, both recorded: the
 * repeat share's pairs and repeats. */
static void repeat_token(fit_pass *p, const trace *b, uint64_t i, const pass_request *q) {
    bool recorded = true, identical = true;
    for (uint32_t l = 0; l < p->L; l++) {
        const uint16_t *a = trace_experts(b, i, l), *pv = q->prev + (size_t)l * p->k;
        recorded = recorded && fit_row_recorded(a) && fit_row_recorded(pv);
        identical = identical && !memcmp(a, pv, p->k * sizeof *a);
    }
    p->repeat_pairs += recorded;
    p->repeat_same += recorded && identical;
}

/* The experts token i's rows share with its predecessor's, per phase and layer. */
static void shared_token(fit_pass *p, const trace *b, uint64_t i, const pass_request *q,
                         bool decode) {
    const uint32_t L = p->L, k = p->k;
    const size_t at = (size_t)decode * L;
    for (uint32_t l = 0; l < L; l++) {
        const uint16_t *a = trace_experts(b, i, l), *pv = q->prev + (size_t)l * k;
        if (!fit_row_recorded(a) || !fit_row_recorded(pv)) continue;
        p->shared_pairs[at + l]++;
        for (uint32_t x = 0; x < k; x++)
            for (uint32_t y = 0; y < k; y++) p->shared_hits[at + l] += a[x] == pv[y];
    }
}

static void gates_token(fit_pass *p, const trace *b, uint64_t i) {
    for (uint32_t l = 0; l < p->L; l++) {
        if (!fit_row_recorded(trace_experts(b, i, l))) continue;
        const float *g = trace_gates(b, i, l);
        double mx = g[0], s = 0;
        for (uint32_t j = 0; j < p->k; j++) mx = g[j] > mx ? g[j] : mx, s += g[j];
        p->gate_top += mx, p->gate_sum += s, p->gate_rows++;
    }
}

/* The importance moments (traces/SYNTH.md, item 5): with equal saliences and no sink, position
 * p of an n-token request receives sum_{q=p}^{n-1} 1/(q+1) = harm[n] - harm[p]; the log of the
 * importance over that spreads with the salience (sigma) and correlates across layers (rho). */
static void importance_token(fit_pass *p, const trace *b, uint64_t i, uint32_t r) {
    const uint32_t L = p->L, n = p->len[r], pos = b->position[i];
    if (n < 2) return;
    const float *imp = b->importance + i * L;
    if (pos == 0) {
        for (uint32_t l = 0; l < L; l++) p->sink += (imp[l] - 1.0) / (n - 1.0), p->n_sink++;
        return;
    }
    const double ref = log(p->harm[n] - p->harm[pos]);
    for (uint32_t l = 0; l < L; l++) {
        if (!(imp[l] > 0)) continue;
        const double x = log(imp[l]) - ref;
        p->s1 += x, p->s2 += x * x, p->n_x++;
        if (l + 1 < L && imp[l + 1] > 0) {
            const double y = log(imp[l + 1]) - ref;
            p->sx += x, p->sy += y, p->sxx += x * x, p->syy += y * y, p->sxy += x * y, p->n_xy++;
        }
    }
}

void fit_pass_token(fit_pass *p, const trace *b, uint64_t i) {
    const uint32_t L = p->L, E = p->E, k = p->k, r = b->request_id[i];
    pass_request *q = p->slot_of[r] == UINT32_MAX ? slot_take(p, r) : &p->slot[p->slot_of[r]];
    const bool decode = b->phase[i] == TRACE_DECODE;
    if (decode && !q->prev_decode) { /* decode tokens come last in a request */
        p->decode_open++;
        p->decode_most = p->decode_open > p->decode_most ? p->decode_open : p->decode_most;
    }
    if (p->what & FIT_LAYER_STATS) layer_stats_token(p, b, i, q);
    if ((p->what & FIT_MOMENT_REPEAT) && q->has_prev && decode) repeat_token(p, b, i, q);
    if ((p->what & FIT_MOMENT_SHARED) && q->has_prev) shared_token(p, b, i, q, decode);
    if (q->count)
        for (uint32_t l = 0; l < L; l++) {
            const uint16_t *ids = trace_experts(b, i, l);
            if (!fit_row_recorded(ids)) continue;
            q->rows[l]++;
            for (uint32_t j = 0; j < k; j++) q->count[(size_t)l * E + ids[j]]++;
        }
    if (p->what & FIT_MOMENT_GATES) gates_token(p, b, i);
    if (p->len) importance_token(p, b, i, r);
    memcpy(q->prev, trace_experts(b, i, 0), (size_t)L * k * sizeof *q->prev);
    q->has_prev = true, q->prev_decode = decode;
    if (++q->seen < p->ix->n_tokens[r]) return;
    /* the request's last token */
    p->decode_open -= decode;
    if (q->count)
        for (uint32_t l = 0; l < L; l++)
            p->request_gini[(size_t)r * L + l] =
                q->rows[l] >= 2 ? fit_gini_of(q->count + (size_t)l * E, E) : NAN;
    p->idle[p->n_idle++] = p->slot_of[r];
    p->slot_of[r] = UINT32_MAX;
}

static void layer_stats_finish(const fit_pass *p, fit_layer_stats *ls) {
    const uint32_t E = p->E, k = p->k;
    for (uint32_t l = 0; l < p->L; l++) {
        const uint64_t acc = p->acc[l], pairs = p->pairs[l];
        ls->gini[l] = acc ? fit_gini_of(p->count + (size_t)l * E, E) : NAN;
        ls->reuse_top1[l] = pairs ? (double)p->same[l] / pairs : NAN;
        ls->reuse_any[l] = pairs ? (double)p->any[l] / pairs : NAN;
        double sum = 0, hits = 0;
        const uint64_t *h = p->depth + (size_t)l * (E + 2);
        for (uint32_t c = 1; c < E; c++) {
            hits += (double)h[c];
            if (c >= k) sum += hits / (double)acc;
        }
        ls->lru_mean[l] = acc && E > k ? sum / (E - k) : NAN;
    }
}

static void moments_finish(const fit_pass *p, fit_moments *mo) {
    const uint32_t L = p->L, R = p->ix->n_requests;
    if (p->what & FIT_MOMENT_REQUEST_GINI) {
        double sum = 0;
        uint64_t n = 0;
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t r = 0; r < R; r++) {
                const double g = p->request_gini[(size_t)r * L + l];
                if (!isnan(g)) sum += g, n++;
            }
        mo->request_gini = n ? sum / (double)n : NAN;
    }
    if (p->what & FIT_MOMENT_REPEAT)
        mo->repeat_share = p->repeat_pairs ? (double)p->repeat_same / (double)p->repeat_pairs : NAN;
    if (p->what & FIT_MOMENT_SHARED)
        for (size_t i = 0; i < 2 * (size_t)L; i++)
            mo->shared[i / L][i % L] =
                p->shared_pairs[i] ? (double)p->shared_hits[i] / ((double)p->shared_pairs[i] * p->k)
                                   : NAN;
    if (p->what & FIT_MOMENT_GATES) {
        mo->gate_top1 = p->gate_rows ? p->gate_top / (double)p->gate_rows : NAN;
        mo->gate_sum = p->gate_rows ? p->gate_sum / (double)p->gate_rows : NAN;
    }
    if (p->what & FIT_MOMENT_IMPORTANCE) {
        mo->imp_sink = mo->imp_sigma = mo->imp_rho = NAN;
        if (p->n_sink) mo->imp_sink = p->sink / (double)p->n_sink;
        if (p->n_x > 1) {
            const double mean = p->s1 / (double)p->n_x, var = p->s2 / (double)p->n_x - mean * mean;
            mo->imp_sigma = var > 0 ? sqrt(var) : 0;
        }
        if (p->n_xy > 1) {
            const double N = (double)p->n_xy, cov = p->sxy / N - (p->sx / N) * (p->sy / N);
            const double vx = p->sxx / N - (p->sx / N) * (p->sx / N);
            const double vy = p->syy / N - (p->sy / N) * (p->sy / N);
            mo->imp_rho = vx > 0 && vy > 0 ? cov / sqrt(vx * vy) : NAN;
        }
    }
    mo->decode_batch = p->decode_most > 1 ? p->decode_most : 1;
}

void fit_pass_finish(fit_pass *p, fit_layer_stats *ls, fit_moments *mo) {
    if (ls) layer_stats_finish(p, ls);
    if (mo) moments_finish(p, mo);
    for (uint32_t s = 0; s < p->n_slots; s++) {
        free(p->slot[s].prev);
        free(p->slot[s].prev_top1);
        free(p->slot[s].count);
        free(p->slot[s].rows);
    }
    free(p->slot);
    free(p->idle);
    free(p->slot_of);
    free(p->count);
    free(p->since);
    free(p->used);
    free(p->depth);
    free(p->pairs);
    free(p->same);
    free(p->any);
    free(p->acc);
    free(p->shared_pairs);
    free(p->shared_hits);
    free(p->request_gini);
    free(p->len);
    free(p->harm);
    free(p);
}

void fit_stats_compute(const trace *t, unsigned what, fit_layer_stats *ls, fit_moments *mo) {
    trace_request_index ix;
    trace_request_index_build(&ix, t);
    /* the row function reads the trace only: the cast drops nothing it writes */
    fit_pass *p = fit_pass_create(t, &ix, fit_row_in_memory, (void *)t, what);
    for (uint64_t i = 0; i < t->n_tokens; i++) fit_pass_token(p, t, i);
    fit_pass_finish(p, ls, mo);
    trace_request_index_free(&ix);
}
