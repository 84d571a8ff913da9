/* Moments of a router trace that trace_stats does not compute (traces/synth_moments.h): what the
 * fit (traces/synth_fit.c) and the real-vs-synthetic comparison (traces/synth_compare.c) read
 * besides traces/stats.h. Shares in [0, 1]; NaN where a trace has nothing to measure. */
#include "traces/synth_moments.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

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

static double request_gini(const trace *t) {
    const uint32_t E = t->meta.n_experts, L = t->meta.n_layers, k = t->meta.top_k;
    const uint32_t R = t->n_requests;
    uint32_t *count = moesim_xcalloc((size_t)R * E, sizeof *count); /* [R][E] */
    uint32_t *rows = moesim_xcalloc(R, sizeof *rows);
    double sum = 0;
    uint64_t n = 0;
    for (uint32_t l = 0; l < L; l++) {
        memset(count, 0, (size_t)R * E * sizeof *count);
        memset(rows, 0, R * sizeof *rows);
        for (uint64_t i = 0; i < t->n_tokens; i++) {
            const uint16_t *ids = trace_experts(t, i, l);
            if (!fit_row_recorded(ids)) continue;
            rows[t->request_id[i]]++;
            for (uint32_t j = 0; j < k; j++) count[(size_t)t->request_id[i] * E + ids[j]]++;
        }
        for (uint32_t r = 0; r < R; r++)
            if (rows[r] >= 2) sum += fit_gini_of(count + (size_t)r * E, E), n++;
    }
    free(rows);
    free(count);
    return n ? sum / (double)n : NAN;
}

/* Share of decode tokens (with a predecessor in their request, all rows recorded) whose experts
 * are their predecessor's, in the same order, at every layer. */
static double repeat_share(const trace *t) {
    const uint32_t L = t->meta.n_layers, k = t->meta.top_k;
    uint64_t *prev = moesim_xcalloc(t->n_requests, sizeof *prev); /* last token + 1; 0: none */
    uint64_t pairs = 0, same = 0;
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        const uint32_t r = t->request_id[i];
        const uint64_t p = prev[r];
        prev[r] = i + 1;
        if (!p || t->phase[i] != TRACE_DECODE) continue;
        bool recorded = true, identical = true;
        for (uint32_t l = 0; l < L; l++) {
            const uint16_t *a = trace_experts(t, i, l), *b = trace_experts(t, p - 1, l);
            recorded = recorded && fit_row_recorded(a) && fit_row_recorded(b);
            identical = identical && !memcmp(a, b, k * sizeof *a);
        }
        pairs += recorded;
        same += recorded && identical;
    }
    free(prev);
    return pairs ? (double)same / (double)pairs : NAN;
}

/* Per phase and layer, the mean share of a row's experts found in its predecessor's row (the
 * request's previous token, both recorded): the LRU hit rate at capacity k of the request
 * alone. */
static void shared_with_predecessor(const trace *t, double (*shared)[MODEL_MAX_LAYERS]) {
    const uint32_t L = t->meta.n_layers, k = t->meta.top_k, R = t->n_requests;
    uint64_t *prev = moesim_xcalloc(R, sizeof *prev);               /* last token + 1; 0: none */
    uint64_t *pairs = moesim_xcalloc(2 * (size_t)L, sizeof *pairs); /* [phase][L] */
    uint64_t *hits = moesim_xcalloc(2 * (size_t)L, sizeof *hits);   /* [phase][L] */
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        const uint32_t r = t->request_id[i];
        const uint64_t p = prev[r];
        prev[r] = i + 1;
        if (!p) continue;
        const size_t at = (size_t)(t->phase[i] == TRACE_DECODE) * L;
        for (uint32_t l = 0; l < L; l++) {
            const uint16_t *a = trace_experts(t, i, l), *b = trace_experts(t, p - 1, l);
            if (!fit_row_recorded(a) || !fit_row_recorded(b)) continue;
            pairs[at + l]++;
            for (uint32_t x = 0; x < k; x++)
                for (uint32_t y = 0; y < k; y++) hits[at + l] += a[x] == b[y];
        }
    }
    for (size_t i = 0; i < 2 * (size_t)L; i++)
        shared[i / L][i % L] = pairs[i] ? (double)hits[i] / ((double)pairs[i] * k) : NAN;
    free(hits);
    free(pairs);
    free(prev);
}

static void gate_moments(const trace *t, fit_moments *mo) {
    const uint32_t L = t->meta.n_layers, k = t->meta.top_k;
    double top = 0, sum = 0;
    uint64_t n = 0;
    for (uint64_t i = 0; i < t->n_tokens; i++)
        for (uint32_t l = 0; l < L; l++) {
            if (!fit_row_recorded(trace_experts(t, i, l))) continue;
            const float *g = trace_gates(t, i, l);
            double mx = g[0], s = 0;
            for (uint32_t j = 0; j < k; j++) mx = g[j] > mx ? g[j] : mx, s += g[j];
            top += mx, sum += s, n++;
        }
    mo->gate_top1 = n ? top / (double)n : NAN;
    mo->gate_sum = n ? sum / (double)n : NAN;
}

/* The importance moments (traces/SYNTH.md, item 5): with equal saliences and no sink, position
 * p of an n-token request receives sum_{q=p}^{n-1} 1/(q+1) = harm[n] - harm[p]; the log of the
 * importance over that spreads with the salience (sigma) and correlates across layers (rho). */
static void importance_moments(const trace *t, fit_moments *mo) {
    mo->imp_sink = mo->imp_sigma = mo->imp_rho = NAN;
    if (!t->importance) return;
    const uint32_t L = t->meta.n_layers, R = t->n_requests;
    uint32_t *len = moesim_xcalloc(R, sizeof *len);
    uint32_t longest = 0;
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        uint32_t *n = &len[t->request_id[i]];
        *n = t->position[i] + 1 > *n ? t->position[i] + 1 : *n;
        longest = *n > longest ? *n : longest;
    }
    double *harm = moesim_xcalloc((size_t)longest + 1, sizeof *harm); /* harm[n] = sum 1/q */
    for (uint32_t q = 1; q <= longest; q++) harm[q] = harm[q - 1] + 1.0 / q;
    double sink = 0, s1 = 0, s2 = 0, sxy = 0, sx = 0, sy = 0, sxx = 0, syy = 0;
    uint64_t n_sink = 0, n_x = 0, n_xy = 0;
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        const uint32_t n = len[t->request_id[i]], p = t->position[i];
        if (n < 2) continue;
        const float *imp = t->importance + i * L;
        if (p == 0) {
            for (uint32_t l = 0; l < L; l++) sink += (imp[l] - 1.0) / (n - 1.0), n_sink++;
            continue;
        }
        const double ref = log(harm[n] - harm[p]);
        for (uint32_t l = 0; l < L; l++) {
            if (!(imp[l] > 0)) continue;
            const double x = log(imp[l]) - ref;
            s1 += x, s2 += x * x, n_x++;
            if (l + 1 < L && imp[l + 1] > 0) {
                const double y = log(imp[l + 1]) - ref;
                sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y, n_xy++;
            }
        }
    }
    if (n_sink) mo->imp_sink = sink / (double)n_sink;
    if (n_x > 1) {
        const double mean = s1 / (double)n_x, var = s2 / (double)n_x - mean * mean;
        mo->imp_sigma = var > 0 ? sqrt(var) : 0;
    }
    if (n_xy > 1) {
        const double N = (double)n_xy, cov = sxy / N - (sx / N) * (sy / N);
        const double vx = sxx / N - (sx / N) * (sx / N), vy = syy / N - (sy / N) * (sy / N);
        mo->imp_rho = vx > 0 && vy > 0 ? cov / sqrt(vx * vy) : NAN;
    }
    free(harm);
    free(len);
}

void fit_moments_compute_some(const trace *t, fit_moments *mo, unsigned which) {
    if (which & FIT_MOMENT_REQUEST_GINI) mo->request_gini = request_gini(t);
    if (which & FIT_MOMENT_REPEAT) mo->repeat_share = repeat_share(t);
    if (which & FIT_MOMENT_SHARED) shared_with_predecessor(t, mo->shared);
}

void fit_moments_compute(const trace *t, fit_moments *mo) {
    fit_moments_compute_some(t, mo,
                             FIT_MOMENT_REQUEST_GINI | FIT_MOMENT_REPEAT | FIT_MOMENT_SHARED);
    gate_moments(t, mo);
    importance_moments(t, mo);
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

void fit_layer_stats_compute(const trace *t, fit_layer_stats *ls) {
    const uint32_t L = t->meta.n_layers, E = t->meta.n_experts, k = t->meta.top_k;
    const uint32_t R = t->n_requests;
    uint64_t *prev = moesim_xmalloc(R * sizeof *prev); /* [R] the request's previous token */
    for (uint32_t r = 0; r < R; r++) prev[r] = UINT64_MAX;
    uint32_t *count = moesim_xcalloc((size_t)L * E, sizeof *count); /* [L][E] */
    /* LRU depth by bit masks: since[l][e] holds the experts of layer l used since e was (W
     * words of 64), so e's depth is 1 + its popcount; a route ORs its experts into every mask
     * at once, E * W word operations per row whatever the depths */
    const uint32_t W = (E + 63) / 64;
    uint64_t *since = moesim_xcalloc((size_t)L * E * W, sizeof *since);   /* [L][E][W] */
    uint8_t *seen = moesim_xcalloc((size_t)L * E, 1);                     /* [L][E] used yet */
    uint64_t *depth = moesim_xcalloc((size_t)L * (E + 2), sizeof *depth); /* [L][E + 2] */
    uint64_t *pairs = moesim_xcalloc(L, sizeof *pairs), *same = moesim_xcalloc(L, sizeof *same),
             *any = moesim_xcalloc(L, sizeof *any), *acc = moesim_xcalloc(L, sizeof *acc);
    uint64_t route[16]; /* W <= 16: E <= 1024 */
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        const uint32_t r = t->request_id[i];
        for (uint32_t l = 0; l < L; l++) {
            const uint16_t *ids = trace_experts(t, i, l);
            if (!fit_row_recorded(ids)) continue;
            uint64_t *sl = since + (size_t)l * E * W;
            uint8_t *sn = seen + (size_t)l * E;
            memset(route, 0, W * sizeof *route);
            for (uint32_t j = 0; j < k; j++) { /* depth before the route (STATS.md); 0: cold */
                const uint16_t e = ids[j];
                uint32_t d = 0;
                if (sn[e]) {
                    d = 1;
                    for (uint32_t w = 0; w < W; w++) d += bit_count(sl[(size_t)e * W + w]);
                }
                depth[(size_t)l * (E + 2) + d]++;
                count[(size_t)l * E + e]++;
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
            acc[l] += k;
            if (prev[r] == UINT64_MAX) continue;
            const uint16_t *p = trace_experts(t, prev[r], l);
            if (!fit_row_recorded(p)) continue;
            pairs[l]++;
            same[l] += row_top1(ids, trace_gates(t, i, l), k) ==
                       row_top1(p, trace_gates(t, prev[r], l), k);
            bool hit = false;
            for (uint32_t a = 0; a < k && !hit; a++)
                for (uint32_t b = 0; b < k && !hit; b++) hit = ids[a] == p[b];
            any[l] += hit;
        }
        prev[r] = i;
    }
    for (uint32_t l = 0; l < L; l++) {
        ls->gini[l] = acc[l] ? fit_gini_of(count + (size_t)l * E, E) : NAN;
        ls->reuse_top1[l] = pairs[l] ? (double)same[l] / pairs[l] : NAN;
        ls->reuse_any[l] = pairs[l] ? (double)any[l] / pairs[l] : NAN;
        double sum = 0, hits = 0;
        const uint64_t *h = depth + (size_t)l * (E + 2);
        for (uint32_t c = 1; c < E; c++) {
            hits += (double)h[c];
            if (c >= k) sum += hits / (double)acc[l];
        }
        ls->lru_mean[l] = acc[l] && E > k ? sum / (E - k) : NAN;
    }
    free(acc);
    free(any);
    free(same);
    free(pairs);
    free(depth);
    free(seen);
    free(since);
    free(count);
    free(prev);
}
