/* Statistics of a router trace; traces/STATS.md defines every figure and JSON key.
 *
 * How the work is laid out (performance matters: the bench target is >= 20 M accesses/s):
 *   - one pass over the tokens per layer gathers that layer's access sequence (expert ids in
 *     token order, each top-k selection in stored order, unrecorded rows skipped) into a flat
 *     uint16 array, and on the way counts activations, consecutive-token reuse and look-ahead
 *     accuracy (predictions made at this layer);
 *   - LRU: Mattson's stack algorithm. A move-to-front stack of at most E experts; the depth
 *     (1-based) at which an access is found is its stack distance, and a histogram of
 *     distances gives the hits of every capacity c (distance <= c) in one pass;
 *   - OPT: the priority-stack form of Mattson et al. (1970). The priority of an expert is the
 *     index of its next access (sooner = higher; never again = lowest), found by one backward
 *     pass. On an access at depth d the expert goes to the top and the old top is carried down
 *     levels 1..d-1: at each level the item with the sooner next use stays and the other goes
 *     on; the last carried item fills level d. The top c levels are then exactly what Belady's
 *     cache of capacity c holds, so the depth histogram again gives every capacity at once;
 *   - the simulator's rule (a token's experts resident together, none evicted for the same
 *     token): the LRU curve comes from the same LRU stack (the depth before the token's
 *     route), the OPT curve from a third stack over the sequence in which every route is
 *     followed by its experts once more (see "routes" below);
 *   - the three stacks run in one loop; with E > 16 on a CPU with AVX2 (checked at run time)
 *     each step handles 16 levels per exit test in vector registers (the OPT carry is a running
 *     maximum, so it vectorizes as a prefix maximum); the scalar steps are the fallback and
 *     give the same histograms (tests compare them; MOESIM_STATS_SIMD=scalar forces them);
 *   - active share by batch: the layer pass also turns each decode token's row into an expert
 *     bitmap; groups of B requests are unions of two adjacent groups of B/2, built in place.
 * The stack passes themselves are in stats_stack.c.
 * No allocation per access: scratch arrays are sized once per call. The stacks hold access
 * times, not expert ids (see the stack passes); access indices within one layer are uint32 (a
 * layer holds fewer than 2^32 - 1 accesses: asserted).
 *
 * Units: counts are plain numbers of accesses, tokens or token pairs; rates are in [0, 1];
 * distances are stack depths (1 = the most recently used expert). */
#include "traces/stats.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/stats_stack.h"

const uint32_t trace_stats_batch_sizes[STATS_N_BATCH] = {1, 2, 4, 8, 16, 32};

#define NO_TOKEN        UINT64_MAX /* no previous token of this request yet */
#define PREFETCH_TOKENS 48         /* how far ahead the per-layer token loop prefetches rows */

/* ---- per-token helpers ---- */

/* A routing row is recorded unless it is the all-TRACE_NO_EXPERT marker (trace.h). */
static inline bool row_recorded(const uint16_t *ids) { return ids[0] != TRACE_NO_EXPERT; }

/* The top-1 expert of a row: the largest gate weight, the first stored on ties. */
static inline uint16_t row_top1(const uint16_t *ids, const float *gates, uint32_t k) {
    uint32_t best = 0;
    for (uint32_t j = 1; j < k; j++)
        if (gates[j] > gates[best]) best = j;
    return ids[best];
}

static double ratio(uint64_t num, uint64_t den) { return den ? (double)num / (double)den : NAN; }

/* ---- skew of one layer's activation counts ---- */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void layer_skew(layer_stats *ls, uint32_t n_experts, uint64_t *sorted /* scratch [E] */) {
    uint64_t total = 0;
    for (uint32_t e = 0; e < n_experts; e++) total += ls->expert_count[e];
    if (total == 0) {
        ls->gini = ls->top10_share = ls->max_over_mean = ls->min_over_mean = NAN;
        return;
    }
    memcpy(sorted, ls->expert_count, n_experts * sizeof *sorted);
    qsort(sorted, n_experts, sizeof *sorted, cmp_u64);
    /* Gini of ascending x_1..x_n: 2 sum(i x_i) / (n sum x) - (n + 1) / n */
    double weighted = 0;
    for (uint32_t i = 0; i < n_experts; i++) weighted += (double)(i + 1) * (double)sorted[i];
    double n = n_experts;
    ls->gini = 2.0 * weighted / (n * (double)total) - (n + 1.0) / n;
    uint32_t busiest = (n_experts + 9) / 10; /* ceil(10 % of E) */
    uint64_t top = 0;
    for (uint32_t i = n_experts - busiest; i < n_experts; i++) top += sorted[i];
    ls->top10_share = (double)top / (double)total;
    double mean = (double)total / n;
    ls->max_over_mean = (double)sorted[n_experts - 1] / mean;
    ls->min_over_mean = (double)sorted[0] / mean;
}

/* ---- active share by batch ----
 *
 * Requests with decode tokens, in request id order (= order of first appearance), are cut into
 * consecutive groups of B (a last partial group is dropped); iteration i of a group takes the
 * i-th decode token of each of its B requests, for i below the fewest decode tokens in the
 * group. Each (group, iteration, layer) where all B rows are recorded contributes
 * |union of their top-k| / E.
 *
 * Per layer, the routing of every decode token becomes an expert bitmap, stored request by
 * request (CSR order). A group of B is two adjacent groups of B/2, so each batch size is
 * built from the previous one in place: OR the bitmaps of iteration i of the two halves (and
 * AND their recorded flags) for i below the shorter half. Work per layer and batch size is
 * (decode tokens / B) * E / 64 words. */

typedef struct batch_plan {
    uint32_t n_slots;      /* requests with decode tokens */
    uint64_t n_decode;     /* decode tokens */
    uint64_t *start;       /* [n_slots + 1] CSR offsets of each slot's decode tokens */
    uint64_t *slot_index;  /* [n_tokens] CSR index of a decode token, NO_TOKEN for prefill */
    uint32_t words;        /* 64-bit words per expert bitmap */
    uint64_t *bits;        /* [n_decode][words] the current layer's routing of each token */
    uint8_t *valid;        /* [n_decode] row recorded (after merging: all rows recorded) */
    uint64_t *group_start; /* [n_slots] CSR index of each group's first iteration */
    uint64_t *group_len;   /* [n_slots] iterations of each group */
    uint64_t sum_union[STATS_N_BATCH], n_union[STATS_N_BATCH]; /* all layers */
} batch_plan;

static void batch_plan_init(batch_plan *p, const trace *t) {
    const uint32_t R = t->n_requests;
    memset(p, 0, sizeof *p);
    uint64_t *n_dec = moesim_xcalloc(R ? R : 1, sizeof *n_dec);
    for (uint64_t tok = 0; tok < t->n_tokens; tok++)
        if (t->phase[tok] == TRACE_DECODE) n_dec[t->request_id[tok]]++;
    uint32_t *slot_of = moesim_xcalloc(R ? R : 1, sizeof *slot_of);
    for (uint32_t r = 0; r < R; r++)
        if (n_dec[r]) slot_of[r] = p->n_slots++;
    p->start = moesim_xcalloc((size_t)p->n_slots + 1, sizeof *p->start);
    for (uint32_t r = 0; r < R; r++)
        if (n_dec[r]) p->start[slot_of[r] + 1] = p->start[slot_of[r]] + n_dec[r];
    p->n_decode = p->start[p->n_slots];
    uint64_t *fill = moesim_xcalloc(p->n_slots ? p->n_slots : 1, sizeof *fill);
    p->slot_index = moesim_xcalloc(t->n_tokens ? t->n_tokens : 1, sizeof *p->slot_index);
    for (uint64_t tok = 0; tok < t->n_tokens; tok++) {
        p->slot_index[tok] = NO_TOKEN;
        if (t->phase[tok] != TRACE_DECODE) continue;
        uint32_t slot = slot_of[t->request_id[tok]];
        p->slot_index[tok] = p->start[slot] + fill[slot]++;
    }
    p->words = (t->meta.n_experts + 63) / 64;
    p->bits = moesim_xcalloc(p->n_decode ? p->n_decode * p->words : 1, sizeof *p->bits);
    p->valid = moesim_xcalloc(p->n_decode ? p->n_decode : 1, sizeof *p->valid);
    p->group_start = moesim_xcalloc(p->n_slots ? p->n_slots : 1, sizeof *p->group_start);
    p->group_len = moesim_xcalloc(p->n_slots ? p->n_slots : 1, sizeof *p->group_len);
    free(fill);
    free(slot_of);
    free(n_dec);
}

static void batch_plan_free(batch_plan *p) {
    free(p->start);
    free(p->slot_index);
    free(p->bits);
    free(p->valid);
    free(p->group_start);
    free(p->group_len);
}

/* Records the routing row of a token of the current layer (NULL: unrecorded). */
static inline void batch_plan_set_row(batch_plan *p, uint64_t tok, const uint16_t *ids,
                                      uint32_t k) {
    uint64_t idx = p->slot_index[tok];
    if (idx == NO_TOKEN) return;
    uint64_t *b = p->bits + idx * p->words;
    memset(b, 0, p->words * sizeof *b);
    p->valid[idx] = ids != NULL;
    if (ids)
        for (uint32_t j = 0; j < k; j++) b[ids[j] >> 6] |= (uint64_t)1 << (ids[j] & 63);
}

/* Every batch size for the current layer, once its rows are set; consumes the bitmaps. Built
 * twice on x86-64 (with and without the POPCNT instruction, picked at load time): without it
 * each popcount is a libgcc call. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("popcnt", "default")))
#endif
static void
batch_plan_layer(batch_plan *p, uint32_t n_experts, layer_stats *ls) {
    const uint32_t W = p->words;
    uint32_t n_groups = p->n_slots;
    for (uint32_t g = 0; g < n_groups; g++) {
        p->group_start[g] = p->start[g];
        p->group_len[g] = p->start[g + 1] - p->start[g];
    }
    for (uint32_t b = 0; b < STATS_N_BATCH; b++) {
        if (b > 0) { /* groups of B from pairs of groups of B/2 */
            MOESIM_ASSERT(trace_stats_batch_sizes[b] == 2 * trace_stats_batch_sizes[b - 1]);
            uint32_t merged = n_groups / 2;
            for (uint32_t g = 0; g < merged; g++) {
                uint64_t a = p->group_start[2 * g], c = p->group_start[2 * g + 1];
                uint64_t len = p->group_len[2 * g] < p->group_len[2 * g + 1]
                                   ? p->group_len[2 * g]
                                   : p->group_len[2 * g + 1];
                for (uint64_t i = 0; i < len; i++) {
                    uint64_t *dst = p->bits + (a + i) * W;
                    const uint64_t *src = p->bits + (c + i) * W;
                    for (uint32_t x = 0; x < W; x++) dst[x] |= src[x];
                    p->valid[a + i] &= p->valid[c + i];
                }
                p->group_start[g] = a;
                p->group_len[g] = len;
            }
            n_groups = merged;
        }
        if (n_groups == 0) { /* fewer than B requests with decode tokens */
            ls->active_share[b] = NAN;
            continue;
        }
        uint64_t sum = 0, cnt = 0;
        for (uint32_t g = 0; g < n_groups; g++)
            for (uint64_t i = 0; i < p->group_len[g]; i++) {
                uint64_t idx = p->group_start[g] + i;
                if (!p->valid[idx]) continue;
                const uint64_t *bits = p->bits + idx * W;
                for (uint32_t x = 0; x < W; x++) sum += (uint64_t)__builtin_popcountll(bits[x]);
                cnt++;
            }
        ls->active_share[b] = ratio(sum, cnt * n_experts);
        p->sum_union[b] += sum;
        p->n_union[b] += cnt;
    }
}

/* ---- one layer: gather, reuse, look-ahead, stack passes ---- */

typedef struct work {
    const trace *t;
    uint16_t *seq;       /* [n_tokens * top_k] the current layer's accesses */
    uint64_t *prev_tok;  /* [n_requests] last token of each request seen so far */
    uint16_t *prev_top1; /* [n_requests] top-1 expert of that token (when recorded) */
    marker set;          /* [n_experts] */
    stack_scratch stacks;
    depth_hists hist;              /* each [n_experts + 1], this layer */
    uint64_t *lru_hits, *opt_hits; /* [n_experts + 1] routes pinned, summed over layers */
    uint64_t *lru_slot_hits;       /* [n_experts + 1] per slot, summed over layers */
    uint64_t *la_pairs, *la_top1, *la_found, *la_wanted;                 /* [D] this layer */
    uint64_t *sum_la_pairs, *sum_la_top1, *sum_la_found, *sum_la_wanted; /* [D] all layers */
    uint64_t reuse_pairs, reuse_top1, reuse_any;                         /* all layers */
    uint64_t reuse_dist_sum, reuse_dist_n;                               /* all layers */
    batch_plan batch;
} work;

/* A layer's hit-rate curve [E + 1] from its depth histogram: hits / n at c = from..E, NaN
 * below (index 0 included); adds the hit counts to sum [E + 1]. */
static double *layer_curve(const uint64_t *hist, uint32_t E, uint32_t from, size_t n, uint64_t *sum,
                           arena *mem) {
    double *rate = arena_calloc(mem, (size_t)E + 1, sizeof *rate);
    uint64_t hits = 0;
    rate[0] = NAN;
    for (uint32_t c = 1; c <= E; c++) {
        hits += hist[c];
        rate[c] = c < from ? NAN : ratio(hits, n);
        sum[c] += hits;
    }
    return rate;
}

static void layer_compute(work *w, uint32_t l, layer_stats *ls, arena *mem) {
    const trace *t = w->t;
    const uint32_t E = t->meta.n_experts, k = t->meta.top_k, L = t->meta.n_layers;
    const uint32_t D = t->lookahead_ids ? t->meta.lookahead_depth : 0;
    const uint32_t KP = t->meta.lookahead_k;
    const uint32_t pred_k = KP < k ? KP : k; /* predictions scored for recall */

    for (uint32_t r = 0; r < t->n_requests; r++) w->prev_tok[r] = NO_TOKEN;
    memset(w->la_pairs, 0, D * sizeof *w->la_pairs);
    memset(w->la_top1, 0, D * sizeof *w->la_top1);
    memset(w->la_found, 0, D * sizeof *w->la_found);
    memset(w->la_wanted, 0, D * sizeof *w->la_wanted);

    uint64_t *count = ls->expert_count;
    uint64_t pairs = 0, same_top1 = 0, any_shared = 0;
    size_t n = 0;
    for (uint64_t tok = 0; tok < t->n_tokens; tok++) {
        const uint16_t *ids = trace_experts(t, tok, l);
        if (tok + PREFETCH_TOKENS < t->n_tokens) { /* rows are L * k apart: help the hardware */
            const uint16_t *pid = trace_experts(t, tok + PREFETCH_TOKENS, l);
            const float *pg = trace_gates(t, tok + PREFETCH_TOKENS, l);
            __builtin_prefetch(pid);
            __builtin_prefetch(pid + k - 1); /* a row may straddle two cache lines */
            __builtin_prefetch(pg);
            __builtin_prefetch(pg + k - 1);
        }
        uint32_t req = t->request_id[tok];
        MOESIM_ASSERT(req < t->n_requests);
        uint64_t prev = w->prev_tok[req];
        w->prev_tok[req] = tok;
        if (!row_recorded(ids)) {
            batch_plan_set_row(&w->batch, tok, NULL, k);
            continue;
        }
        batch_plan_set_row(&w->batch, tok, ids, k);
        const uint16_t top1 = row_top1(ids, trace_gates(t, tok, l), k);
        const uint16_t prev_top1 = w->prev_top1[req];
        w->prev_top1[req] = top1;
        for (uint32_t j = 0; j < k; j++) {
            uint16_t e = ids[j];
            MOESIM_ASSERT(e < E);
            w->seq[n++] = e;
            count[e]++;
        }
        if (prev != NO_TOKEN) {
            const uint16_t *pids = trace_experts(t, prev, l);
            if (row_recorded(pids)) {
                pairs++;
                same_top1 += top1 == prev_top1;
                marker_next(&w->set);
                for (uint32_t j = 0; j < k; j++) w->set.mark[pids[j]] = w->set.stamp;
                bool shared = false;
                for (uint32_t j = 0; j < k && !shared; j++)
                    shared = w->set.mark[ids[j]] == w->set.stamp;
                any_shared += shared;
            }
        }
        for (uint32_t d = 1; d <= D && l + d < L; d++) {
            const uint16_t *pred = t->lookahead_ids + trace_lookahead_index(t, tok, l, d);
            const uint16_t *actual = trace_experts(t, tok, l + d);
            if (pred[0] == TRACE_NO_EXPERT || !row_recorded(actual)) continue;
            w->la_pairs[d - 1]++;
            w->la_top1[d - 1] += pred[0] == row_top1(actual, trace_gates(t, tok, l + d), k);
            marker_next(&w->set);
            for (uint32_t j = 0; j < pred_k; j++)
                if (pred[j] < E) w->set.mark[pred[j]] = w->set.stamp;
            uint64_t found = 0;
            for (uint32_t j = 0; j < k; j++) found += w->set.mark[actual[j]] == w->set.stamp;
            w->la_found[d - 1] += found;
            w->la_wanted[d - 1] += k;
        }
    }

    batch_plan_layer(&w->batch, E, ls);
    ls->accesses = n;
    ls->tokens = n / k;
    ls->reuse_pairs = pairs;
    ls->reuse_top1 = ratio(same_top1, pairs);
    ls->reuse_any = ratio(any_shared, pairs);
    w->reuse_pairs += pairs;
    w->reuse_top1 += same_top1;
    w->reuse_any += any_shared;

    const depth_hists *h = &w->hist;
    memset(h->lru_slot, 0, 3 * ((size_t)E + 1) * sizeof *h->lru_slot); /* one block, 3 arrays */
    route_list rows = {.fixed = k, .n = n / k}; /* a token's row runs together */
    route_histograms(w->seq, n, &rows, E, &w->stacks, h);
    ls->cold_misses = h->lru_slot[0];
    MOESIM_ASSERT(h->lru[0] == ls->cold_misses && h->opt[0] == ls->cold_misses);
    uint64_t dist_sum = 0, dist_n = 0;
    for (uint32_t d = 1; d <= E; d++) {
        dist_sum += (uint64_t)d * h->lru_slot[d];
        dist_n += h->lru_slot[d];
    }
    ls->mean_reuse_distance = ratio(dist_sum, dist_n);
    w->reuse_dist_sum += dist_sum;
    w->reuse_dist_n += dist_n;

    ls->lru_hit_rate = layer_curve(h->lru, E, k, n, w->lru_hits, mem);
    ls->opt_hit_rate = layer_curve(h->opt, E, k, n, w->opt_hits, mem);
    ls->lru_slot_hit_rate = layer_curve(h->lru_slot, E, 1, n, w->lru_slot_hits, mem);

    if (D) {
        ls->lookahead_top1 = arena_calloc(mem, D, sizeof(double));
        ls->lookahead_recall = arena_calloc(mem, D, sizeof(double));
        for (uint32_t d = 0; d < D; d++) {
            ls->lookahead_top1[d] = ratio(w->la_top1[d], w->la_pairs[d]);
            ls->lookahead_recall[d] = ratio(w->la_found[d], w->la_wanted[d]);
            w->sum_la_pairs[d] += w->la_pairs[d];
            w->sum_la_top1[d] += w->la_top1[d];
            w->sum_la_found[d] += w->la_found[d];
            w->sum_la_wanted[d] += w->la_wanted[d];
        }
    }
}

/* ---- the whole trace ---- */

/* hits[c] / accesses at c = from..E, NaN below. */
static double *total_curve(const uint64_t *hits, uint32_t E, uint32_t from, uint64_t accesses,
                           arena *mem) {
    double *rate = arena_calloc(mem, (size_t)E + 1, sizeof *rate);
    for (uint32_t c = 0; c <= E; c++) rate[c] = c < from ? NAN : ratio(hits[c], accesses);
    return rate;
}

trace_stats *trace_stats_compute(const trace *t) {
    const uint32_t E = t->meta.n_experts, k = t->meta.top_k, L = t->meta.n_layers;
    MOESIM_ASSERT(E >= 1 && E <= MODEL_MAX_EXPERTS && k >= 1 && k <= E && L >= 1);
    const uint32_t D = t->lookahead_ids ? t->meta.lookahead_depth : 0;
    MOESIM_ASSERT(D <= TRACE_MAX_LOOKAHEAD_DEPTH && (D == 0 || t->meta.lookahead_k >= 1));

    trace_stats *s = moesim_xcalloc(1, sizeof *s);
    arena_init(&s->mem, 0);
    s->tokens = t->n_tokens;
    for (uint64_t tok = 0; tok < t->n_tokens; tok++) {
        if (t->phase[tok] == TRACE_DECODE)
            s->decode_tokens++;
        else
            s->prefill_tokens++;
    }
    s->requests = t->n_requests;
    s->layers = L;
    s->experts = E;
    s->top_k = k;
    s->lookahead_depth = D;
    s->lookahead_k = D ? t->meta.lookahead_k : 0;
    s->per_layer = arena_calloc(&s->mem, L, sizeof *s->per_layer);

    const size_t max_seq = (size_t)t->n_tokens * k;
    MOESIM_ASSERT(t->n_tokens == 0 || max_seq / k == t->n_tokens);
    work w = {.t = t};
    w.seq = moesim_xcalloc(max_seq ? max_seq : 1, sizeof *w.seq);
    w.prev_tok = moesim_xcalloc(t->n_requests ? t->n_requests : 1, sizeof *w.prev_tok);
    w.prev_top1 = moesim_xcalloc(t->n_requests ? t->n_requests : 1, sizeof *w.prev_top1);
    marker_init(&w.set, E);
    stack_scratch_init(&w.stacks, E, max_seq);
    /* the per-slot OPT curve is left out: a third OPT-sized chain would cost ~20 % of the
     * throughput (bench, E = 512) for a figure that is no bound for the simulator */
    uint64_t *hist = moesim_xcalloc(6 * ((size_t)E + 1), sizeof *hist);
    w.hist = (depth_hists){.lru_slot = hist, .lru = hist + (E + 1), .opt = hist + 2 * (E + 1)};
    w.lru_hits = hist + 3 * (E + 1), w.opt_hits = hist + 4 * (E + 1);
    w.lru_slot_hits = hist + 5 * (E + 1);
    uint64_t *la = moesim_xcalloc(8 * (size_t)(D ? D : 1), sizeof(uint64_t));
    w.la_pairs = la, w.la_top1 = la + D, w.la_found = la + 2 * D, w.la_wanted = la + 3 * D;
    w.sum_la_pairs = la + 4 * D, w.sum_la_top1 = la + 5 * D;
    w.sum_la_found = la + 6 * D, w.sum_la_wanted = la + 7 * D;
    uint64_t *sorted = moesim_xcalloc(E, sizeof *sorted);
    batch_plan_init(&w.batch, t);

    double skew_sum[4] = {0};
    uint32_t skew_layers = 0;
    for (uint32_t l = 0; l < L; l++) {
        layer_stats *ls = &s->per_layer[l];
        ls->expert_count = arena_calloc(&s->mem, E, sizeof *ls->expert_count);
        layer_compute(&w, l, ls, &s->mem);
        s->accesses += ls->accesses;
        layer_skew(ls, E, sorted);
        if (ls->accesses) {
            skew_sum[0] += ls->gini;
            skew_sum[1] += ls->top10_share;
            skew_sum[2] += ls->max_over_mean;
            skew_sum[3] += ls->min_over_mean;
            skew_layers++;
        }
    }
    s->gini = skew_layers ? skew_sum[0] / skew_layers : NAN;
    s->top10_share = skew_layers ? skew_sum[1] / skew_layers : NAN;
    s->max_over_mean = skew_layers ? skew_sum[2] / skew_layers : NAN;
    s->min_over_mean = skew_layers ? skew_sum[3] / skew_layers : NAN;
    s->reuse_top1 = ratio(w.reuse_top1, w.reuse_pairs);
    s->reuse_any = ratio(w.reuse_any, w.reuse_pairs);
    s->mean_reuse_distance = ratio(w.reuse_dist_sum, w.reuse_dist_n);

    s->lru_hit_rate = total_curve(w.lru_hits, E, k, s->accesses, &s->mem);
    s->opt_hit_rate = total_curve(w.opt_hits, E, k, s->accesses, &s->mem);
    s->lru_slot_hit_rate = total_curve(w.lru_slot_hits, E, 1, s->accesses, &s->mem);
    if (D) {
        s->lookahead_top1 = arena_calloc(&s->mem, D, sizeof(double));
        s->lookahead_recall = arena_calloc(&s->mem, D, sizeof(double));
        for (uint32_t d = 0; d < D; d++) {
            s->lookahead_top1[d] = ratio(w.sum_la_top1[d], w.sum_la_pairs[d]);
            s->lookahead_recall[d] = ratio(w.sum_la_found[d], w.sum_la_wanted[d]);
        }
    }
    s->decode_requests = w.batch.n_slots;
    for (uint32_t b = 0; b < STATS_N_BATCH; b++)
        s->active_share[b] = w.batch.n_slots < trace_stats_batch_sizes[b]
                                 ? NAN
                                 : ratio(w.batch.sum_union[b], w.batch.n_union[b] * E);
    batch_plan_free(&w.batch);

    free(sorted);
    free(la);
    free(hist);
    stack_scratch_free(&w.stacks);
    marker_free(&w.set);
    free(w.prev_top1);
    free(w.prev_tok);
    free(w.seq);
    return s;
}

void trace_stats_destroy(trace_stats *s) {
    if (!s) return;
    arena_free(&s->mem);
    free(s);
}

/* ---- JSON ---- */

/* A number, or null where the figure is absent (NaN). */
static json_t *json_number_or_null(double x) { return isnan(x) ? json_null() : json_real(x); }

/* {"from": r[from], ..., "E": r[E]} */
static json_t *json_curve(const double *rate, uint32_t from, uint32_t n_experts) {
    json_t *o = json_object();
    char key[16];
    for (uint32_t c = from; c <= n_experts; c++) {
        snprintf(key, sizeof key, "%u", c);
        json_object_set_new(o, key, json_number_or_null(rate[c]));
    }
    return o;
}

static json_t *json_by_batch(const double *share) {
    json_t *o = json_object();
    char key[16];
    for (uint32_t b = 0; b < STATS_N_BATCH; b++) {
        snprintf(key, sizeof key, "%u", trace_stats_batch_sizes[b]);
        json_object_set_new(o, key, json_number_or_null(share[b]));
    }
    return o;
}

/* {"1": x[0], ..., "D": x[D-1]}, or null without look-ahead predictions. */
static json_t *json_by_distance(const double *x, uint32_t depth) {
    if (!x || depth == 0) return json_null();
    json_t *o = json_object();
    char key[16];
    for (uint32_t d = 1; d <= depth; d++) {
        snprintf(key, sizeof key, "%u", d);
        json_object_set_new(o, key, json_number_or_null(x[d - 1]));
    }
    return o;
}

json_t *trace_stats_to_json(const trace_stats *s) {
    json_t *j = json_object();
    json_object_set_new(j, "tokens", json_integer((json_int_t)s->tokens));
    json_object_set_new(j, "prefill_tokens", json_integer((json_int_t)s->prefill_tokens));
    json_object_set_new(j, "decode_tokens", json_integer((json_int_t)s->decode_tokens));
    json_object_set_new(j, "requests", json_integer(s->requests));
    json_object_set_new(j, "decode_requests", json_integer(s->decode_requests));
    json_object_set_new(j, "layers", json_integer(s->layers));
    json_object_set_new(j, "experts", json_integer(s->experts));
    json_object_set_new(j, "top_k", json_integer(s->top_k));
    json_object_set_new(j, "accesses", json_integer((json_int_t)s->accesses));
    json_object_set_new(j, "gini", json_number_or_null(s->gini));
    json_object_set_new(j, "top10_share", json_number_or_null(s->top10_share));
    json_object_set_new(j, "max_over_mean", json_number_or_null(s->max_over_mean));
    json_object_set_new(j, "min_over_mean", json_number_or_null(s->min_over_mean));
    json_object_set_new(j, "reuse_top1", json_number_or_null(s->reuse_top1));
    json_object_set_new(j, "reuse_any", json_number_or_null(s->reuse_any));
    json_object_set_new(j, "mean_reuse_distance", json_number_or_null(s->mean_reuse_distance));
    json_object_set_new(j, "active_share_by_batch", json_by_batch(s->active_share));
    json_object_set_new(j, "lookahead_depth", json_integer(s->lookahead_depth));
    json_object_set_new(j, "lookahead_k", json_integer(s->lookahead_k));
    json_object_set_new(j, "lookahead_top1",
                        json_by_distance(s->lookahead_top1, s->lookahead_depth));
    json_object_set_new(j, "lookahead_recall",
                        json_by_distance(s->lookahead_recall, s->lookahead_depth));
    json_object_set_new(j, "lru_hit_rate", json_curve(s->lru_hit_rate, s->top_k, s->experts));
    json_object_set_new(j, "opt_hit_rate", json_curve(s->opt_hit_rate, s->top_k, s->experts));
    json_object_set_new(j, "lru_slot_hit_rate", json_curve(s->lru_slot_hit_rate, 1, s->experts));
    json_t *layers = json_array();
    for (uint32_t l = 0; l < s->layers; l++) {
        const layer_stats *ls = &s->per_layer[l];
        json_t *o = json_object();
        json_object_set_new(o, "layer", json_integer(l));
        json_object_set_new(o, "tokens", json_integer((json_int_t)ls->tokens));
        json_object_set_new(o, "accesses", json_integer((json_int_t)ls->accesses));
        json_object_set_new(o, "cold_misses", json_integer((json_int_t)ls->cold_misses));
        json_t *counts = json_array();
        for (uint32_t e = 0; e < s->experts; e++)
            json_array_append_new(counts, json_integer((json_int_t)ls->expert_count[e]));
        json_object_set_new(o, "expert_count", counts);
        json_object_set_new(o, "gini", json_number_or_null(ls->gini));
        json_object_set_new(o, "top10_share", json_number_or_null(ls->top10_share));
        json_object_set_new(o, "max_over_mean", json_number_or_null(ls->max_over_mean));
        json_object_set_new(o, "min_over_mean", json_number_or_null(ls->min_over_mean));
        json_object_set_new(o, "reuse_pairs", json_integer((json_int_t)ls->reuse_pairs));
        json_object_set_new(o, "reuse_top1", json_number_or_null(ls->reuse_top1));
        json_object_set_new(o, "reuse_any", json_number_or_null(ls->reuse_any));
        json_object_set_new(o, "mean_reuse_distance", json_number_or_null(ls->mean_reuse_distance));
        json_object_set_new(o, "active_share_by_batch", json_by_batch(ls->active_share));
        json_object_set_new(o, "lookahead_top1",
                            json_by_distance(ls->lookahead_top1, s->lookahead_depth));
        json_object_set_new(o, "lookahead_recall",
                            json_by_distance(ls->lookahead_recall, s->lookahead_depth));
        json_object_set_new(o, "lru_hit_rate", json_curve(ls->lru_hit_rate, s->top_k, s->experts));
        json_object_set_new(o, "opt_hit_rate", json_curve(ls->opt_hit_rate, s->top_k, s->experts));
        json_object_set_new(o, "lru_slot_hit_rate",
                            json_curve(ls->lru_slot_hit_rate, 1, s->experts));
        json_array_append_new(layers, o);
    }
    json_object_set_new(j, "per_layer", layers);
    return j;
}
