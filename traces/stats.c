/* Statistics of a router trace; traces/STATS.md defines every figure and JSON key.
 *
 * How the work is laid out (performance matters: the bench target is >= 20 M accesses/s):
 *   - one pass over the tokens per layer gathers that layer's access sequence (expert ids in
 *     token order, each top-k selection in stored order, unrecorded rows skipped) into a flat
 *     uint16 array, and on the way counts activations, consecutive-token reuse and look-ahead
 *     accuracy (predictions made at this layer);
 *   - LRU: Mattson's stack algorithm. A move-to-front stack of at most E experts with a
 *     position index; the depth (1-based) at which an access is found is its stack distance, a
 *     histogram of distances gives the hits of every capacity c (distance <= c) in one pass;
 *   - OPT: the priority-stack form of Mattson et al. (1970). The priority of an expert is the
 *     index of its next access (sooner = higher; never again = lowest), found by one backward
 *     pass. On an access at depth d the expert goes to the top and the old top is carried down
 *     levels 1..d-1: at each level the item with the sooner next use stays and the other goes
 *     on; the last carried item fills level d. The top c levels are then exactly what Belady's
 *     cache of capacity c holds, so the depth histogram again gives every capacity at once;
 *   - active share by batch: one token-major pass per batch size over the decode tokens of
 *     each group of B requests, a stamped mark array [layers][experts] forming the unions.
 * No allocation per access: scratch arrays are sized once per call. Positions in the stacks are
 * uint16 (E <= MODEL_MAX_EXPERTS = 1024); access indices within one layer are uint32 (a layer
 * holds fewer than 2^32 - 1 accesses: asserted).
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

const uint32_t trace_stats_batch_sizes[STATS_N_BATCH] = {1, 2, 4, 8, 16, 32};

#define NOT_IN_STACK UINT16_MAX
#define NEVER UINT32_MAX     /* next use of an expert that is not accessed again */
#define NO_TOKEN UINT64_MAX  /* no previous token of this request yet */

_Static_assert(MODEL_MAX_EXPERTS < NOT_IN_STACK, "stack positions must fit in uint16_t");

/* ---- stamped marks: set membership in O(1) without clearing between sets ---- */

typedef struct marker {
    uint32_t *mark; /* [n] the stamp of the set an element was last put in */
    size_t n;
    uint32_t stamp; /* current set; 0 is never a live stamp */
} marker;

static void marker_init(marker *m, size_t n) {
    m->mark = moesim_xcalloc(n ? n : 1, sizeof *m->mark);
    m->n = n;
    m->stamp = 0;
}

static void marker_free(marker *m) { free(m->mark); }

/* Starts a new, empty set. */
static void marker_next(marker *m) {
    if (++m->stamp == 0) { /* wrapped: old stamps could collide, clear them */
        memset(m->mark, 0, m->n * sizeof *m->mark);
        m->stamp = 1;
    }
}

/* ---- the two stack passes ---- */

/* hist[d] += 1 for each access found at LRU stack depth d (1..E); cold misses go to hist[0]. */
static void lru_stack_pass(const uint16_t *seq, size_t n, uint32_t n_experts, uint16_t *stack,
                           uint16_t *pos, uint64_t *hist) {
    memset(pos, 0xff, n_experts * sizeof *pos);
    uint32_t size = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t e = seq[i];
        uint32_t d = pos[e];
        if (d == NOT_IN_STACK) {
            d = size++;
            hist[0]++;
        } else {
            hist[d + 1]++;
        }
        for (uint32_t j = d; j > 0; j--) { /* shift the more recent ones down a level */
            uint16_t s = stack[j - 1];
            stack[j] = s;
            pos[s] = (uint16_t)j;
        }
        stack[0] = e;
        pos[e] = 0;
    }
    MOESIM_ASSERT(size <= n_experts);
}

/* next_use[i] = index of the next access of seq[i], or NEVER. `last` is scratch [n_experts]. */
static void next_use_pass(const uint16_t *seq, size_t n, uint32_t n_experts, uint32_t *last,
                          uint32_t *next_use) {
    for (uint32_t e = 0; e < n_experts; e++) last[e] = NEVER;
    for (size_t i = n; i-- > 0;) {
        next_use[i] = last[seq[i]];
        last[seq[i]] = (uint32_t)i;
    }
}

/* Same histogram under Belady's OPT (priority stack, priority = sooner next use). `prio` is
 * scratch [n_experts]. */
static void opt_stack_pass(const uint16_t *seq, const uint32_t *next_use, size_t n,
                           uint32_t n_experts, uint16_t *stack, uint16_t *pos, uint32_t *prio,
                           uint64_t *hist) {
    memset(pos, 0xff, n_experts * sizeof *pos);
    uint32_t size = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t e = seq[i];
        uint32_t d = pos[e];
        if (d == NOT_IN_STACK) {
            d = size++;
            hist[0]++;
        } else {
            hist[d + 1]++;
        }
        if (d > 0) {
            uint16_t carried = stack[0];
            uint32_t carried_prio = prio[carried];
            for (uint32_t j = 1; j < d; j++) {
                uint16_t y = stack[j];
                uint32_t y_prio = prio[y];
                if (carried_prio < y_prio) { /* carried is needed sooner: it stays here */
                    stack[j] = carried;
                    pos[carried] = (uint16_t)j;
                    carried = y;
                    carried_prio = y_prio;
                }
            }
            stack[d] = carried;
            pos[carried] = (uint16_t)d;
        }
        stack[0] = e;
        pos[e] = 0;
        prio[e] = next_use[i];
    }
    MOESIM_ASSERT(size <= n_experts);
}

/* Scratch for the stack passes, sized once. */
typedef struct stack_scratch {
    uint16_t *stack, *pos; /* [n_experts] */
    uint32_t *aux;         /* [n_experts] last access / priority */
    uint32_t *next_use;    /* [capacity] */
    size_t capacity;
} stack_scratch;

static void stack_scratch_init(stack_scratch *s, uint32_t n_experts, size_t capacity) {
    s->stack = moesim_xcalloc(n_experts ? n_experts : 1, sizeof *s->stack);
    s->pos = moesim_xcalloc(n_experts ? n_experts : 1, sizeof *s->pos);
    s->aux = moesim_xcalloc(n_experts ? n_experts : 1, sizeof *s->aux);
    s->next_use = moesim_xcalloc(capacity ? capacity : 1, sizeof *s->next_use);
    s->capacity = capacity;
}

static void stack_scratch_free(stack_scratch *s) {
    free(s->stack);
    free(s->pos);
    free(s->aux);
    free(s->next_use);
}

/* Depth histograms (hist[0] = cold misses, hist[d] = found at depth d) for both policies. */
static void depth_histograms(const uint16_t *seq, size_t n, uint32_t n_experts, stack_scratch *s,
                             uint64_t *lru_hist, uint64_t *opt_hist) {
    MOESIM_ASSERT(n < NEVER && n <= s->capacity);
    if (lru_hist) lru_stack_pass(seq, n, n_experts, s->stack, s->pos, lru_hist);
    if (opt_hist) {
        next_use_pass(seq, n, n_experts, s->aux, s->next_use);
        for (uint32_t e = 0; e < n_experts; e++) s->aux[e] = NEVER;
        opt_stack_pass(seq, s->next_use, n, n_experts, s->stack, s->pos, s->aux, opt_hist);
    }
}

/* hits[c] = accesses found at depth <= c, c = 0..n_experts. */
static void hits_from_histogram(const uint64_t *hist, uint32_t n_experts, uint64_t *hits) {
    hits[0] = 0;
    for (uint32_t c = 1; c <= n_experts; c++) hits[c] = hits[c - 1] + hist[c];
}

void trace_stats_hit_counts(const uint16_t *seq, size_t n, uint32_t n_experts, uint64_t *lru_hits,
                            uint64_t *opt_hits) {
    MOESIM_ASSERT(n_experts >= 1 && n_experts <= MODEL_MAX_EXPERTS);
    for (size_t i = 0; i < n; i++) MOESIM_ASSERT(seq[i] < n_experts);
    stack_scratch s;
    stack_scratch_init(&s, n_experts, n);
    uint64_t *hist = moesim_xcalloc((size_t)n_experts + 1, sizeof *hist);
    if (lru_hits) {
        depth_histograms(seq, n, n_experts, &s, hist, NULL);
        hits_from_histogram(hist, n_experts, lru_hits);
    }
    if (opt_hits) {
        memset(hist, 0, ((size_t)n_experts + 1) * sizeof *hist);
        depth_histograms(seq, n, n_experts, &s, NULL, hist);
        hits_from_histogram(hist, n_experts, opt_hits);
    }
    free(hist);
    stack_scratch_free(&s);
}

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

static double ratio(uint64_t num, uint64_t den) {
    return den ? (double)num / (double)den : NAN;
}

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

/* ---- one layer: gather, reuse, look-ahead, stack passes ---- */

typedef struct work {
    const trace *t;
    uint16_t *seq;       /* [n_tokens * top_k] the current layer's accesses */
    uint64_t *prev_tok;  /* [n_requests] last token of each request seen so far */
    marker set;          /* [n_experts] */
    stack_scratch stacks;
    uint64_t *lru_hist, *opt_hist; /* [n_experts + 1] */
    uint64_t *lru_hits, *opt_hits; /* [n_experts + 1] summed over layers */
    uint64_t *la_pairs, *la_top1, *la_found, *la_wanted;  /* [D] this layer */
    uint64_t *sum_la_pairs, *sum_la_top1, *sum_la_found, *sum_la_wanted; /* [D] all layers */
    uint64_t reuse_pairs, reuse_top1, reuse_any; /* all layers */
    uint64_t reuse_dist_sum, reuse_dist_n;       /* all layers */
} work;

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
        uint32_t req = t->request_id[tok];
        MOESIM_ASSERT(req < t->n_requests);
        uint64_t prev = w->prev_tok[req];
        w->prev_tok[req] = tok;
        if (!row_recorded(ids)) continue;
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
                same_top1 += row_top1(ids, trace_gates(t, tok, l), k) ==
                             row_top1(pids, trace_gates(t, prev, l), k);
                marker_next(&w->set);
                for (uint32_t j = 0; j < k; j++) w->set.mark[pids[j]] = w->set.stamp;
                bool shared = false;
                for (uint32_t j = 0; j < k && !shared; j++) shared = w->set.mark[ids[j]] == w->set.stamp;
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

    ls->accesses = n;
    ls->reuse_pairs = pairs;
    ls->reuse_top1 = ratio(same_top1, pairs);
    ls->reuse_any = ratio(any_shared, pairs);
    w->reuse_pairs += pairs;
    w->reuse_top1 += same_top1;
    w->reuse_any += any_shared;

    memset(w->lru_hist, 0, ((size_t)E + 1) * sizeof *w->lru_hist);
    memset(w->opt_hist, 0, ((size_t)E + 1) * sizeof *w->opt_hist);
    depth_histograms(w->seq, n, E, &w->stacks, w->lru_hist, w->opt_hist);
    ls->cold_misses = w->lru_hist[0];
    MOESIM_ASSERT(w->opt_hist[0] == w->lru_hist[0]);
    uint64_t dist_sum = 0, dist_n = 0;
    for (uint32_t d = 1; d <= E; d++) {
        dist_sum += (uint64_t)d * w->lru_hist[d];
        dist_n += w->lru_hist[d];
    }
    ls->mean_reuse_distance = ratio(dist_sum, dist_n);
    w->reuse_dist_sum += dist_sum;
    w->reuse_dist_n += dist_n;

    ls->lru_hit_rate = arena_calloc(mem, (size_t)E + 1, sizeof(double));
    ls->opt_hit_rate = arena_calloc(mem, (size_t)E + 1, sizeof(double));
    uint64_t lru = 0, opt = 0;
    for (uint32_t c = 1; c <= E; c++) {
        lru += w->lru_hist[c];
        opt += w->opt_hist[c];
        ls->lru_hit_rate[c] = ratio(lru, n);
        ls->opt_hit_rate[c] = ratio(opt, n);
        w->lru_hits[c] += lru;
        w->opt_hits[c] += opt;
    }

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

/* ---- active share by batch ---- */

/* Fills s->active_share and each layer's active_share. Requests with decode tokens, in request
 * id order (= order of first appearance), are cut into consecutive groups of B (a last partial
 * group is dropped); iteration i of a group takes the i-th decode token of each of its B
 * requests, for i below the fewest decode tokens in the group. Each (group, iteration, layer)
 * where all B rows are recorded contributes |union of their top-k| / E. */
static void active_share_compute(const trace *t, trace_stats *s) {
    const uint32_t E = t->meta.n_experts, k = t->meta.top_k, L = t->meta.n_layers;
    const uint32_t R = t->n_requests;
    uint64_t *n_dec = moesim_xcalloc(R ? R : 1, sizeof *n_dec);
    for (uint64_t tok = 0; tok < t->n_tokens; tok++)
        if (t->phase[tok] == TRACE_DECODE) n_dec[t->request_id[tok]]++;
    /* decode tokens of each request with any, in trace order: CSR over the decode requests */
    uint32_t *dec_req = moesim_xcalloc(R ? R : 1, sizeof *dec_req); /* request of slot */
    uint32_t *slot_of = moesim_xcalloc(R ? R : 1, sizeof *slot_of);
    uint32_t n_slots = 0;
    for (uint32_t r = 0; r < R; r++)
        if (n_dec[r]) {
            slot_of[r] = n_slots;
            dec_req[n_slots++] = r;
        }
    uint64_t *start = moesim_xcalloc((size_t)n_slots + 1, sizeof *start);
    for (uint32_t i = 0; i < n_slots; i++) start[i + 1] = start[i] + n_dec[dec_req[i]];
    uint64_t *fill = moesim_xcalloc(n_slots ? n_slots : 1, sizeof *fill);
    uint64_t *dec_tok = moesim_xcalloc(start[n_slots] ? start[n_slots] : 1, sizeof *dec_tok);
    for (uint64_t tok = 0; tok < t->n_tokens; tok++)
        if (t->phase[tok] == TRACE_DECODE) {
            uint32_t slot = slot_of[t->request_id[tok]];
            dec_tok[start[slot] + fill[slot]++] = tok;
        }
    s->decode_requests = n_slots;

    marker set; /* [L][E] */
    marker_init(&set, (size_t)L * E);
    uint32_t *union_size = moesim_xcalloc(L, sizeof *union_size);
    uint32_t *recorded = moesim_xcalloc(L, sizeof *recorded);
    uint64_t *sum_union = moesim_xcalloc(L, sizeof *sum_union);
    uint64_t *n_union = moesim_xcalloc(L, sizeof *n_union);
    for (uint32_t b = 0; b < STATS_N_BATCH; b++) {
        const uint32_t B = trace_stats_batch_sizes[b];
        if (n_slots < B) { /* absent */
            s->active_share[b] = NAN;
            for (uint32_t l = 0; l < L; l++) s->per_layer[l].active_share[b] = NAN;
            continue;
        }
        memset(sum_union, 0, L * sizeof *sum_union);
        memset(n_union, 0, L * sizeof *n_union);
        for (uint32_t g0 = 0; g0 + B <= n_slots; g0 += B) {
            uint64_t iters = UINT64_MAX;
            for (uint32_t i = g0; i < g0 + B; i++) {
                uint64_t len = start[i + 1] - start[i];
                if (len < iters) iters = len;
            }
            for (uint64_t it = 0; it < iters; it++) {
                marker_next(&set);
                memset(union_size, 0, L * sizeof *union_size);
                memset(recorded, 0, L * sizeof *recorded);
                for (uint32_t i = g0; i < g0 + B; i++) {
                    uint64_t tok = dec_tok[start[i] + it];
                    const uint16_t *row = trace_experts(t, tok, 0);
                    for (uint32_t l = 0; l < L; l++, row += k) {
                        if (!row_recorded(row)) continue;
                        recorded[l]++;
                        uint32_t *mark = set.mark + (size_t)l * E;
                        for (uint32_t j = 0; j < k; j++) {
                            MOESIM_ASSERT(row[j] < E);
                            if (mark[row[j]] != set.stamp) {
                                mark[row[j]] = set.stamp;
                                union_size[l]++;
                            }
                        }
                    }
                }
                for (uint32_t l = 0; l < L; l++)
                    if (recorded[l] == B) {
                        sum_union[l] += union_size[l];
                        n_union[l]++;
                    }
            }
        }
        uint64_t all_sum = 0, all_n = 0;
        for (uint32_t l = 0; l < L; l++) {
            s->per_layer[l].active_share[b] = ratio(sum_union[l], n_union[l] * E);
            all_sum += sum_union[l];
            all_n += n_union[l];
        }
        s->active_share[b] = ratio(all_sum, all_n * E);
    }
    free(n_union);
    free(sum_union);
    free(recorded);
    free(union_size);
    marker_free(&set);
    free(dec_tok);
    free(fill);
    free(start);
    free(slot_of);
    free(dec_req);
    free(n_dec);
}

/* ---- the whole trace ---- */

trace_stats *trace_stats_compute(const trace *t) {
    const uint32_t E = t->meta.n_experts, k = t->meta.top_k, L = t->meta.n_layers;
    MOESIM_ASSERT(E >= 1 && E <= MODEL_MAX_EXPERTS && k >= 1 && k <= E && L >= 1);
    const uint32_t D = t->lookahead_ids ? t->meta.lookahead_depth : 0;
    MOESIM_ASSERT(D <= TRACE_MAX_LOOKAHEAD_DEPTH && (D == 0 || t->meta.lookahead_k >= 1));

    trace_stats *s = moesim_xcalloc(1, sizeof *s);
    arena_init(&s->mem, 0);
    s->tokens = t->n_tokens;
    for (uint64_t tok = 0; tok < t->n_tokens; tok++) {
        if (t->phase[tok] == TRACE_DECODE) s->decode_tokens++;
        else s->prefill_tokens++;
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
    marker_init(&w.set, E);
    stack_scratch_init(&w.stacks, E, max_seq);
    w.lru_hist = moesim_xcalloc((size_t)E + 1, sizeof(uint64_t));
    w.opt_hist = moesim_xcalloc((size_t)E + 1, sizeof(uint64_t));
    w.lru_hits = moesim_xcalloc((size_t)E + 1, sizeof(uint64_t));
    w.opt_hits = moesim_xcalloc((size_t)E + 1, sizeof(uint64_t));
    uint64_t *la = moesim_xcalloc(8 * (size_t)(D ? D : 1), sizeof(uint64_t));
    w.la_pairs = la, w.la_top1 = la + D, w.la_found = la + 2 * D, w.la_wanted = la + 3 * D;
    w.sum_la_pairs = la + 4 * D, w.sum_la_top1 = la + 5 * D;
    w.sum_la_found = la + 6 * D, w.sum_la_wanted = la + 7 * D;
    uint64_t *sorted = moesim_xcalloc(E, sizeof *sorted);

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

    s->lru_hit_rate = arena_calloc(&s->mem, (size_t)E + 1, sizeof(double));
    s->opt_hit_rate = arena_calloc(&s->mem, (size_t)E + 1, sizeof(double));
    for (uint32_t c = 1; c <= E; c++) {
        s->lru_hit_rate[c] = ratio(w.lru_hits[c], s->accesses);
        s->opt_hit_rate[c] = ratio(w.opt_hits[c], s->accesses);
    }
    if (D) {
        s->lookahead_top1 = arena_calloc(&s->mem, D, sizeof(double));
        s->lookahead_recall = arena_calloc(&s->mem, D, sizeof(double));
        for (uint32_t d = 0; d < D; d++) {
            s->lookahead_top1[d] = ratio(w.sum_la_top1[d], w.sum_la_pairs[d]);
            s->lookahead_recall[d] = ratio(w.sum_la_found[d], w.sum_la_wanted[d]);
        }
    }
    active_share_compute(t, s);

    free(sorted);
    free(la);
    free(w.opt_hits);
    free(w.lru_hits);
    free(w.opt_hist);
    free(w.lru_hist);
    stack_scratch_free(&w.stacks);
    marker_free(&w.set);
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

/* {"1": r[1], ..., "E": r[E]} */
static json_t *json_curve(const double *rate, uint32_t n_experts) {
    json_t *o = json_object();
    char key[16];
    for (uint32_t c = 1; c <= n_experts; c++) {
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
    json_object_set_new(j, "lookahead_top1", json_by_distance(s->lookahead_top1, s->lookahead_depth));
    json_object_set_new(j, "lookahead_recall",
                        json_by_distance(s->lookahead_recall, s->lookahead_depth));
    json_object_set_new(j, "lru_hit_rate", json_curve(s->lru_hit_rate, s->experts));
    json_object_set_new(j, "opt_hit_rate", json_curve(s->opt_hit_rate, s->experts));
    json_t *layers = json_array();
    for (uint32_t l = 0; l < s->layers; l++) {
        const layer_stats *ls = &s->per_layer[l];
        json_t *o = json_object();
        json_object_set_new(o, "layer", json_integer(l));
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
        json_object_set_new(o, "lru_hit_rate", json_curve(ls->lru_hit_rate, s->experts));
        json_object_set_new(o, "opt_hit_rate", json_curve(ls->opt_hit_rate, s->experts));
        json_array_append_new(layers, o);
    }
    json_object_set_new(j, "per_layer", layers);
    return j;
}
