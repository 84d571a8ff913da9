/* Trace statistics (traces/stats.c): hit-rate curves against brute-force LRU and Belady caches
 * on random traces, curve invariants, and hand-computed cases for skew, reuse, active share by
 * batch and look-ahead accuracy. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/rng.h"
#include "traces/stats.h"

/* ---- building traces by hand ---- */

/* A zeroed trace of the given geometry (look-ahead arrays when depth > 0). */
static trace *make_trace(uint32_t layers, uint32_t experts, uint32_t k, uint64_t n_tokens,
                         uint32_t depth, uint32_t lookahead_k) {
    trace *t = moesim_xcalloc(1, sizeof *t);
    t->meta.n_layers = layers;
    t->meta.n_experts = experts;
    t->meta.top_k = k;
    t->meta.lookahead_depth = depth;
    t->meta.lookahead_k = depth ? lookahead_k : 0;
    t->n_tokens = n_tokens;
    size_t rows = (size_t)n_tokens * layers;
    t->request_id = moesim_xcalloc(n_tokens + 1, sizeof *t->request_id);
    t->position = moesim_xcalloc(n_tokens + 1, sizeof *t->position);
    t->phase = moesim_xcalloc(n_tokens + 1, sizeof *t->phase);
    t->expert_ids = moesim_xcalloc(rows * k + 1, sizeof *t->expert_ids);
    t->gate_weights = moesim_xcalloc(rows * k + 1, sizeof *t->gate_weights);
    if (depth) {
        t->lookahead_ids = moesim_xcalloc(rows * depth * lookahead_k, sizeof *t->lookahead_ids);
        t->lookahead_scores =
            moesim_xcalloc(rows * depth * lookahead_k, sizeof *t->lookahead_scores);
    }
    return t;
}

static void free_trace(trace *t) {
    free(t->request_id);
    free(t->position);
    free(t->phase);
    free(t->expert_ids);
    free(t->gate_weights);
    free(t->lookahead_ids);
    free(t->lookahead_scores);
    free(t);
}

/* Sets request ids (dense by first appearance), positions and phases from a schedule. */
static void set_tokens(trace *t, const uint32_t *request, const uint8_t *phase) {
    uint32_t pos[64] = {0}, n_req = 0;
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        t->request_id[i] = request[i];
        t->position[i] = pos[request[i]]++;
        t->phase[i] = phase ? phase[i] : TRACE_DECODE;
        if (request[i] + 1 > n_req) n_req = request[i] + 1;
    }
    t->n_requests = n_req;
}

/* Routing row of (token, layer): ids in order, gates decreasing (the first is the top-1). */
static void set_row(trace *t, uint64_t tok, uint32_t layer, const uint16_t *ids) {
    uint16_t *dst = t->expert_ids + trace_route_index(t, tok, layer);
    float *g = t->gate_weights + trace_route_index(t, tok, layer);
    for (uint32_t j = 0; j < t->meta.top_k; j++) {
        dst[j] = ids[j];
        g[j] = ids[j] == TRACE_NO_EXPERT ? 0.0f : 0.5f / (float)(j + 1);
    }
}

static void set_unrecorded(trace *t, uint64_t tok, uint32_t layer) {
    uint16_t ids[TRACE_MAX_TOP_K];
    for (uint32_t j = 0; j < t->meta.top_k; j++) ids[j] = TRACE_NO_EXPERT;
    set_row(t, tok, layer, ids);
}

/* ---- random traces ---- */

typedef struct random_spec {
    uint32_t layers, experts, k, requests, tokens_per_request;
    double zipf;       /* expert popularity ~ 1 / rank^zipf (0: uniform) */
    double unrecorded; /* share of rows left unrecorded */
    uint64_t seed;
} random_spec;

/* k distinct experts drawn by popularity (rejection), with random decreasing gates. */
static void draw_row(rng *r, const double *cdf, uint32_t experts, uint32_t k, uint16_t *ids) {
    for (uint32_t j = 0; j < k;) {
        double u = rng_uniform(r);
        uint32_t e = 0;
        while (e + 1 < experts && cdf[e] <= u) e++;
        bool dup = false;
        for (uint32_t i = 0; i < j; i++) dup |= ids[i] == e;
        if (!dup) ids[j++] = (uint16_t)e;
    }
}

/* Requests start in id order and interleave at random, as a batched server runs them; the
 * first quarter of each request is prefill. */
static trace *random_trace(const random_spec *sp) {
    uint64_t n = (uint64_t)sp->requests * sp->tokens_per_request;
    trace *t = make_trace(sp->layers, sp->experts, sp->k, n, 0, 0);
    rng *r = rng_create(sp->seed);
    uint32_t *done = moesim_xcalloc(sp->requests, sizeof *done);
    uint32_t started = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t req;
        do {
            req = (uint32_t)rng_below(r, started + 1 < sp->requests ? started + 1 : sp->requests);
        } while (done[req] == sp->tokens_per_request);
        if (req == started) started++;
        t->request_id[i] = req;
        t->position[i] = done[req];
        t->phase[i] = done[req] < sp->tokens_per_request / 4 ? TRACE_PREFILL : TRACE_DECODE;
        done[req]++;
    }
    t->n_requests = sp->requests;
    double *cdf = moesim_xcalloc(sp->experts, sizeof *cdf);
    for (uint32_t l = 0; l < sp->layers; l++) {
        /* popularity by rank, ranks shuffled per layer */
        double total = 0;
        for (uint32_t e = 0; e < sp->experts; e++) {
            cdf[e] = pow((double)((e * 7 + l * 3) % sp->experts) + 1.0, -sp->zipf);
            total += cdf[e];
        }
        double acc = 0;
        for (uint32_t e = 0; e < sp->experts; e++) cdf[e] = (acc += cdf[e] / total);
        for (uint64_t i = 0; i < n; i++) {
            uint16_t ids[TRACE_MAX_TOP_K];
            if (rng_uniform(r) < sp->unrecorded) {
                set_unrecorded(t, i, l);
                continue;
            }
            draw_row(r, cdf, sp->experts, sp->k, ids);
            set_row(t, i, l, ids);
        }
    }
    free(cdf);
    free(done);
    rng_destroy(r);
    return t;
}

/* ---- brute-force caches ---- */

/* The layer's access sequence, gathered independently of stats.c. Returns its length. */
static size_t layer_sequence(const trace *t, uint32_t l, uint16_t *seq) {
    size_t n = 0;
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        const uint16_t *ids = trace_experts(t, i, l);
        for (uint32_t j = 0; j < t->meta.top_k; j++)
            if (ids[j] != TRACE_NO_EXPERT) seq[n++] = ids[j];
    }
    return n;
}

/* A plain LRU cache of `capacity` experts: a slot array with last-use times. */
static uint64_t brute_lru_hits(const uint16_t *seq, size_t n, uint32_t capacity) {
    uint16_t slot[1024];
    size_t used_at[1024];
    uint32_t filled = 0;
    uint64_t hits = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = 0;
        while (s < filled && slot[s] != seq[i]) s++;
        if (s < filled) {
            hits++;
        } else if (filled < capacity) {
            s = filled++;
        } else {
            s = 0;
            for (uint32_t x = 1; x < filled; x++)
                if (used_at[x] < used_at[s]) s = x;
        }
        slot[s] = seq[i];
        used_at[s] = i;
    }
    return hits;
}

/* A plain Belady cache: on a miss with a full cache, evict the expert used again last (or
 * never), found by scanning forward. */
static uint64_t brute_opt_hits(const uint16_t *seq, size_t n, uint32_t capacity) {
    uint16_t slot[1024];
    uint32_t filled = 0;
    uint64_t hits = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = 0;
        while (s < filled && slot[s] != seq[i]) s++;
        if (s < filled) {
            hits++;
            continue;
        }
        if (filled < capacity) {
            slot[filled++] = seq[i];
            continue;
        }
        uint32_t victim = 0;
        size_t victim_next = 0;
        for (uint32_t x = 0; x < filled; x++) {
            size_t next = i + 1;
            while (next < n && seq[next] != slot[x]) next++;
            if (next > victim_next) {
                victim_next = next;
                victim = x;
            }
        }
        slot[victim] = seq[i];
    }
    return hits;
}

TestSuite(trace_stats);

/* ---- hit-rate curves ---- */

Test(trace_stats, per_slot_lru_curve_and_hit_counts_equal_brute_force_caches_at_every_capacity) {
    static const random_spec specs[] = {
        {.layers = 2,
         .experts = 8,
         .k = 2,
         .requests = 5,
         .tokens_per_request = 60,
         .zipf = 0.0,
         .seed = 1},
        {.layers = 3,
         .experts = 8,
         .k = 2,
         .requests = 4,
         .tokens_per_request = 80,
         .zipf = 1.2,
         .seed = 2},
        {.layers = 2,
         .experts = 16,
         .k = 4,
         .requests = 6,
         .tokens_per_request = 50,
         .zipf = 0.8,
         .unrecorded = 0.1,
         .seed = 3},
        {.layers = 2,
         .experts = 32,
         .k = 1,
         .requests = 3,
         .tokens_per_request = 150,
         .zipf = 1.5,
         .seed = 4},
        {.layers = 1,
         .experts = 64,
         .k = 8,
         .requests = 8,
         .tokens_per_request = 25,
         .zipf = 0.5,
         .seed = 5},
        {.layers = 2,
         .experts = 5,
         .k = 5,
         .requests = 2,
         .tokens_per_request = 30,
         .zipf = 0.0,
         .seed = 6},
        {.layers = 1,
         .experts = 128,
         .k = 3,
         .requests = 4,
         .tokens_per_request = 100,
         .zipf = 2.0,
         .unrecorded = 0.3,
         .seed = 7},
    };
    for (size_t c = 0; c < sizeof specs / sizeof specs[0]; c++) {
        const random_spec *sp = &specs[c];
        trace *t = random_trace(sp);
        trace_stats *s = trace_stats_compute(t);
        uint16_t *seq = moesim_xcalloc(t->n_tokens * sp->k, sizeof *seq);
        uint64_t total_n = 0, total_lru[129] = {0}, lru_counts[129], opt_counts[129];
        for (uint32_t l = 0; l < sp->layers; l++) {
            size_t n = layer_sequence(t, l, seq);
            cr_assert_eq(s->per_layer[l].accesses, n, "case %zu layer %u", c, l);
            total_n += n;
            trace_stats_hit_counts(seq, n, sp->experts, lru_counts, opt_counts);
            for (uint32_t cap = 1; cap <= sp->experts; cap++) {
                uint64_t lru = brute_lru_hits(seq, n, cap), opt = brute_opt_hits(seq, n, cap);
                total_lru[cap] += lru;
                cr_assert_eq(s->per_layer[l].lru_slot_hit_rate[cap], (double)lru / (double)n,
                             "case %zu layer %u capacity %u: LRU %.17g, brute force %.17g", c, l,
                             cap, s->per_layer[l].lru_slot_hit_rate[cap], (double)lru / (double)n);
                cr_assert_eq(lru_counts[cap], lru, "case %zu layer %u capacity %u", c, l, cap);
                cr_assert_eq(opt_counts[cap], opt, "case %zu layer %u capacity %u: OPT %llu, "
                             "brute force %llu", c, l, cap, (unsigned long long)opt_counts[cap],
                             (unsigned long long)opt);
            }
        }
        for (uint32_t cap = 1; cap <= sp->experts; cap++)
            cr_assert_eq(s->lru_slot_hit_rate[cap], (double)total_lru[cap] / (double)total_n,
                         "case %zu capacity %u", c, cap);
        free(seq);
        trace_stats_destroy(s);
        free_trace(t);
    }
}

/* ---- the simulator's rule (routes pinned), by brute force ---- */

#define SMALL_E 8 /* the exhaustive search keeps cache contents as a bitmask of SMALL_E bits */

/* LRU with each route's experts pinned, simulated directly: a slot array with last-use times; a
 * miss evicts the least recently used held expert the route does not need. len: [n_routes]. */
static uint64_t brute_pinned_lru_hits(const uint16_t *seq, const uint32_t *len, size_t n_routes,
                                      uint32_t capacity) {
    uint16_t slot[SMALL_E];
    size_t used[SMALL_E];
    uint32_t filled = 0;
    uint64_t hits = 0;
    size_t i = 0;
    for (size_t r = 0; r < n_routes; r++) {
        bool need[SMALL_E] = {false};
        for (uint32_t j = 0; j < len[r]; j++) need[seq[i + j]] = true;
        for (uint32_t j = 0; j < len[r]; j++, i++) {
            uint32_t x = 0;
            while (x < filled && slot[x] != seq[i]) x++;
            if (x < filled) {
                hits++;
            } else if (filled < capacity) {
                x = filled++;
            } else {
                x = capacity;
                for (uint32_t y = 0; y < filled; y++)
                    if (!need[slot[y]] && (x == capacity || used[y] < used[x])) x = y;
                cr_assert_lt(x, capacity, "a route wider than the cache");
            }
            slot[x] = seq[i];
            used[x] = i;
        }
    }
    return hits;
}

/* The fewest misses of any cache of `capacity` on the routes, trying every eviction choice at
 * every miss (any held expert the current route does not need), memoized on (access, contents).
 * Loads happen on misses only: a cache gains nothing by loading early or evicting unasked. */
typedef struct exhaustive {
    const uint16_t *seq;
    size_t n;
    const uint32_t *route_need; /* [n] bitmask of the experts of the access's route */
    uint32_t capacity;
    uint32_t *memo; /* [n][1 << SMALL_E], UINT32_MAX: not yet known */
} exhaustive;

static uint32_t exhaustive_misses(exhaustive *x, size_t i, uint32_t held) {
    if (i == x->n) return 0;
    uint32_t *m = &x->memo[i * (1u << SMALL_E) + held];
    if (*m != UINT32_MAX) return *m;
    uint32_t e = 1u << x->seq[i], best;
    if (held & e) {
        best = exhaustive_misses(x, i + 1, held);
    } else if ((uint32_t)__builtin_popcount(held) < x->capacity) {
        best = 1 + exhaustive_misses(x, i + 1, held | e);
    } else {
        best = UINT32_MAX;
        for (uint32_t v = 0; v < SMALL_E; v++) {
            uint32_t b = 1u << v;
            if (!(held & b) || (x->route_need[i] & b)) continue;
            uint32_t m2 = 1 + exhaustive_misses(x, i + 1, (held & ~b) | e);
            if (m2 < best) best = m2;
        }
        cr_assert_neq(best, UINT32_MAX, "a route wider than the cache");
    }
    return *m = best;
}

static uint64_t exhaustive_opt_hits(const uint16_t *seq, const uint32_t *len, size_t n_routes,
                                    uint32_t capacity) {
    size_t n = 0;
    for (size_t r = 0; r < n_routes; r++) n += len[r];
    uint32_t *need = moesim_xcalloc(n + 1, sizeof *need);
    for (size_t r = 0, i = 0; r < n_routes; i += len[r], r++) {
        uint32_t mask = 0;
        for (uint32_t j = 0; j < len[r]; j++) mask |= 1u << seq[i + j];
        for (uint32_t j = 0; j < len[r]; j++) need[i + j] = mask;
    }
    exhaustive x = {.seq = seq, .n = n, .route_need = need, .capacity = capacity};
    x.memo = moesim_xmalloc((n + 1) * (1u << SMALL_E) * sizeof *x.memo);
    memset(x.memo, 0xff, (n + 1) * (1u << SMALL_E) * sizeof *x.memo);
    uint64_t hits = n - exhaustive_misses(&x, 0, 0);
    free(x.memo);
    free(need);
    return hits;
}

Test(trace_stats, pinned_curves_equal_brute_force_lru_and_the_exhaustive_optimum) {
    /* a token's row is a route: LRU pinned per row, OPT = the best of every eviction choice */
    static const random_spec specs[] = {
        {.layers = 2, .experts = 6, .k = 2, .requests = 3, .tokens_per_request = 12, .seed = 81},
        {.layers = 2,
         .experts = 8,
         .k = 2,
         .requests = 2,
         .tokens_per_request = 20,
         .zipf = 1.0,
         .seed = 82},
        {.layers = 1,
         .experts = 8,
         .k = 3,
         .requests = 3,
         .tokens_per_request = 9,
         .zipf = 0.5,
         .unrecorded = 0.1,
         .seed = 83},
        {.layers = 2, .experts = 5, .k = 1, .requests = 2, .tokens_per_request = 25, .seed = 84},
        {.layers = 1,
         .experts = 7,
         .k = 4,
         .requests = 2,
         .tokens_per_request = 10,
         .zipf = 1.5,
         .seed = 85},
    };
    for (size_t c = 0; c < sizeof specs / sizeof specs[0]; c++) {
        const random_spec *sp = &specs[c];
        trace *t = random_trace(sp);
        trace_stats *s = trace_stats_compute(t);
        uint16_t *seq = moesim_xcalloc(t->n_tokens * sp->k, sizeof *seq);
        uint32_t *len = moesim_xcalloc(t->n_tokens + 1, sizeof *len);
        for (uint32_t l = 0; l < sp->layers; l++) {
            size_t n = layer_sequence(t, l, seq), n_routes = n / sp->k;
            for (size_t r = 0; r < n_routes; r++) len[r] = sp->k;
            for (uint32_t cap = sp->k; cap <= sp->experts; cap++) {
                uint64_t lru = brute_pinned_lru_hits(seq, len, n_routes, cap);
                uint64_t opt = exhaustive_opt_hits(seq, len, n_routes, cap);
                cr_assert_eq(s->per_layer[l].lru_hit_rate[cap], (double)lru / (double)n,
                             "case %zu layer %u capacity %u: LRU %.17g, brute force %.17g", c, l,
                             cap, s->per_layer[l].lru_hit_rate[cap], (double)lru / (double)n);
                cr_assert_eq(s->per_layer[l].opt_hit_rate[cap], (double)opt / (double)n,
                             "case %zu layer %u capacity %u: OPT %.17g, exhaustive %.17g", c, l,
                             cap, s->per_layer[l].opt_hit_rate[cap], (double)opt / (double)n);
            }
        }
        free(len);
        free(seq);
        trace_stats_destroy(s);
        free_trace(t);
    }
}

Test(trace_stats, route_hit_counts_equal_brute_force_on_routes_of_several_tokens) {
    /* routes of 1..4 tokens of top-2 over 8 experts (a prefill chunk, a batch), ids repeating
     * inside a route: valid from the widest route's distinct experts on */
    for (uint64_t seed = 91; seed < 97; seed++) {
        rng *r = rng_create(seed);
        enum { ROUTES = 14 };
        uint16_t seq[ROUTES * 8];
        uint32_t len[ROUTES], widest = 0;
        size_t n = 0;
        for (uint32_t q = 0; q < ROUTES; q++) {
            uint32_t tokens = 1 + (uint32_t)rng_below(r, 4), mask = 0;
            len[q] = 2 * tokens;
            for (uint32_t j = 0; j < len[q]; j++) {
                /* skewed: half the draws from experts 0..2 */
                seq[n] = (uint16_t)(rng_uniform(r) < 0.5 ? rng_below(r, 3) : rng_below(r, 8));
                mask |= 1u << seq[n++];
            }
            if ((uint32_t)__builtin_popcount(mask) > widest) widest = __builtin_popcount(mask);
        }
        rng_destroy(r);
        uint64_t lru[9], opt[9];
        cr_assert_eq(trace_stats_route_hit_counts(seq, n, len, ROUTES, 8, lru, opt), widest);
        for (uint32_t cap = 0; cap < widest; cap++) cr_assert(lru[cap] == 0 && opt[cap] == 0);
        for (uint32_t cap = widest; cap <= 8; cap++) {
            cr_assert_eq(lru[cap], brute_pinned_lru_hits(seq, len, ROUTES, cap),
                         "seed %llu capacity %u", (unsigned long long)seed, cap);
            cr_assert_eq(opt[cap], exhaustive_opt_hits(seq, len, ROUTES, cap),
                         "seed %llu capacity %u", (unsigned long long)seed, cap);
        }
    }
}

Test(trace_stats, a_token_never_evicts_its_own_experts_under_the_simulator_rule) {
    /* one layer, top-2, cache of 2, tokens {0,1} {2,0} {0,1} {2,3} {0,4}: with a cache of
     * top_k every token must hold exactly its own pair, so both pinned rules hit 0 at t1 and
     * t2 only; per slot, LRU evicts the token's own 0 at t1 and Belady its own 0 at t2. */
    const uint16_t rows[5][2] = {{0, 1}, {2, 0}, {0, 1}, {2, 3}, {0, 4}};
    trace *t = make_trace(1, 5, 2, 5, 0, 0);
    for (uint64_t i = 0; i < 5; i++) set_row(t, i, 0, rows[i]);
    uint32_t req[5] = {0};
    set_tokens(t, req, NULL);
    trace_stats *s = trace_stats_compute(t);
    /* pinned LRU: t1 hits 0; t2: 0 hits, 1 misses (evicting 2); t3: misses both; t4: 0 misses */
    cr_assert_eq(s->lru_hit_rate[2], 2.0 / 10.0, "%.17g", s->lru_hit_rate[2]);
    /* per-slot LRU at 2: t1 misses 2 (evicts 0) then 0 (evicts 1); t2: 0 hits, 1 misses */
    cr_assert_eq(s->lru_slot_hit_rate[2], 1.0 / 10.0, "%.17g", s->lru_slot_hit_rate[2]);
    /* pinned OPT: t1 hits 0 (2 evicts 1); t2 hits 0 (1 evicts 2); t3, t4 miss everything.
     * per-slot OPT: at t2, 1 evicts 0 (next used at t4) rather than 2 (t3), though t2 has just
     * used 0, so t3 hits 2 as well: 3 hits, one more than any cache that runs a token whole */
    cr_assert_eq(s->opt_hit_rate[2], 2.0 / 10.0, "%.17g", s->opt_hit_rate[2]);
    const uint16_t seq[10] = {0, 1, 2, 0, 0, 1, 2, 3, 0, 4};
    uint64_t slot_lru[6], slot_opt[6];
    trace_stats_hit_counts(seq, 10, 5, slot_lru, slot_opt);
    cr_assert_eq(slot_opt[2], 3);
    trace_stats_destroy(s);
    free_trace(t);
}

Test(trace_stats, hit_counts_equal_brute_force_on_adversarial_sequences) {
    /* cycles one longer than the cache, scans, and a hot expert inside a scan */
    enum { N = 240 };
    uint16_t seq[N];
    for (uint32_t pattern = 0; pattern < 4; pattern++) {
        const uint32_t E = 12;
        for (uint32_t i = 0; i < N; i++) {
            switch (pattern) {
            case 0:
                seq[i] = (uint16_t)(i % 5);
                break;
            case 1:
                seq[i] = (uint16_t)(i % E);
                break;
            case 2:
                seq[i] = (uint16_t)(i % 2 ? 0 : 1 + (i / 2) % (E - 1));
                break;
            default:
                seq[i] = (uint16_t)((i * i + 3 * i) % E);
                break;
            }
        }
        uint64_t lru[13], opt[13];
        trace_stats_hit_counts(seq, N, E, lru, opt);
        cr_assert_eq(lru[0], 0);
        cr_assert_eq(opt[0], 0);
        for (uint32_t cap = 1; cap <= E; cap++) {
            cr_assert_eq(lru[cap], brute_lru_hits(seq, N, cap), "pattern %u capacity %u", pattern,
                         cap);
            cr_assert_eq(opt[cap], brute_opt_hits(seq, N, cap), "pattern %u capacity %u", pattern,
                         cap);
        }
    }
}

/* A skewed random sequence over E experts (popularity ~ 1/rank, ranks scrambled): deep LRU and
 * OPT stacks, so the vector steps of stats.c run many rounds. */
static void deep_sequence(uint16_t *seq, size_t n, uint32_t experts, uint64_t seed) {
    rng *r = rng_create(seed);
    for (size_t i = 0; i < n; i++) {
        uint32_t rank = (uint32_t)(1.0 / (rng_uniform_pos(r) + 1.0 / experts)) - 1;
        if (rank >= experts) rank = experts - 1;
        seq[i] = (uint16_t)((rank * 37u + 11u) % experts);
    }
    rng_destroy(r);
}

Test(trace_stats, vector_and_scalar_stack_steps_give_the_same_counts_on_deep_stacks) {
    /* E above the scalar cut-off (16), not multiples of the 8- and 16-level rounds, up to the
     * largest E a model may have; MOESIM_STATS_SIMD=scalar forces the portable steps */
    static const uint32_t experts[] = {17, 23, 129, 200, 513, 1024};
    enum { N = 30000 };
    uint16_t *seq = moesim_xcalloc(N, sizeof *seq);
    for (size_t c = 0; c < sizeof experts / sizeof experts[0]; c++) {
        const uint32_t E = experts[c];
        deep_sequence(seq, N, E, 100 + c);
        uint64_t *hits = moesim_xcalloc(4 * ((size_t)E + 1), sizeof *hits);
        uint64_t *lru = hits, *opt = hits + E + 1, *lru_s = hits + 2 * (E + 1),
                 *opt_s = hits + 3 * (E + 1);
        trace_stats_hit_counts(seq, N, E, lru, opt);
        cr_assert_eq(setenv("MOESIM_STATS_SIMD", "scalar", 1), 0);
        trace_stats_hit_counts(seq, N, E, lru_s, opt_s);
        cr_assert_eq(unsetenv("MOESIM_STATS_SIMD"), 0);
        for (uint32_t cap = 0; cap <= E; cap++) {
            cr_assert_eq(lru[cap], lru_s[cap], "E %u capacity %u: LRU", E, cap);
            cr_assert_eq(opt[cap], opt_s[cap], "E %u capacity %u: OPT", E, cap);
        }
        const uint32_t shallow = E > 64 ? 64 : E - 1; /* 64 levels: four 16-level rounds */
        cr_assert_lt(lru[shallow], lru[E], "E %u: some accesses lie deeper than %u", E, shallow);
        cr_assert_lt(opt[shallow], opt[E], "E %u: some accesses lie deeper than %u", E, shallow);
        /* the same with routes of 6 accesses pinned */
        uint32_t *len = moesim_xcalloc(N / 6, sizeof *len);
        for (size_t r = 0; r < N / 6; r++) len[r] = 6;
        uint32_t from = trace_stats_route_hit_counts(seq, N, len, N / 6, E, lru, opt);
        cr_assert_eq(setenv("MOESIM_STATS_SIMD", "scalar", 1), 0);
        cr_assert_eq(trace_stats_route_hit_counts(seq, N, len, N / 6, E, lru_s, opt_s), from);
        cr_assert_eq(unsetenv("MOESIM_STATS_SIMD"), 0);
        for (uint32_t cap = 0; cap <= E; cap++) {
            cr_assert_eq(lru[cap], lru_s[cap], "E %u capacity %u: pinned LRU", E, cap);
            cr_assert_eq(opt[cap], opt_s[cap], "E %u capacity %u: pinned OPT", E, cap);
        }
        cr_assert_lt(opt[shallow], opt[E], "E %u: pinned OPT deeper than %u", E, shallow);
        free(len);
        free(hits);
    }
    free(seq);
}

Test(trace_stats, hit_counts_on_deep_stacks_equal_brute_force_caches) {
    enum { N = 2500, E = 200 };
    static const uint32_t capacities[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 199, 200};
    uint16_t seq[N];
    deep_sequence(seq, N, E, 7);
    uint64_t lru[E + 1], opt[E + 1];
    trace_stats_hit_counts(seq, N, E, lru, opt);
    for (size_t c = 0; c < sizeof capacities / sizeof capacities[0]; c++) {
        const uint32_t cap = capacities[c];
        cr_assert_eq(lru[cap], brute_lru_hits(seq, N, cap), "capacity %u", cap);
        cr_assert_eq(opt[cap], brute_opt_hits(seq, N, cap), "capacity %u", cap);
    }
}

Test(trace_stats, belady_keeps_the_expert_needed_soonest_on_a_small_cycle) {
    /* A B C A B C with two slots: LRU never hits; Belady evicts B at C (A is needed first),
     * hits A, evicts A at B (never needed again), hits C: 2 hits */
    const uint16_t seq[] = {0, 1, 2, 0, 1, 2};
    uint64_t lru[4], opt[4];
    trace_stats_hit_counts(seq, 6, 3, lru, opt);
    cr_assert_eq(lru[2], 0);
    cr_assert_eq(opt[2], 2);
    cr_assert_eq(lru[3], 3);
    cr_assert_eq(opt[3], 3);
    cr_assert_eq(lru[1], 0);
    cr_assert_eq(opt[1], 0);
}

/* A curve non-decreasing over from..E. */
static void check_monotone(const double *rate, uint32_t from, uint32_t E, size_t c) {
    for (uint32_t cap = from + 1; cap <= E; cap++)
        cr_assert_geq(rate[cap], rate[cap - 1], "case %zu cap %u", c, cap);
}

/* OPT >= LRU at every capacity from..E, both non-decreasing, equal at E. */
static void check_curves(const double *lru, const double *opt, uint32_t from, uint32_t E,
                         size_t c) {
    for (uint32_t cap = from; cap <= E; cap++)
        cr_assert_geq(opt[cap], lru[cap], "case %zu cap %u", c, cap);
    check_monotone(lru, from, E, c);
    check_monotone(opt, from, E, c);
    cr_assert_eq(lru[E], opt[E]);
}

Test(trace_stats, curves_are_monotone_opt_is_never_below_lru_and_full_capacity_misses_only_cold) {
    static const random_spec specs[] = {
        {.layers = 4,
         .experts = 64,
         .k = 6,
         .requests = 16,
         .tokens_per_request = 100,
         .zipf = 1.0,
         .seed = 11},
        {.layers = 3,
         .experts = 128,
         .k = 8,
         .requests = 8,
         .tokens_per_request = 120,
         .zipf = 0.3,
         .unrecorded = 0.05,
         .seed = 12},
        {.layers = 8,
         .experts = 8,
         .k = 2,
         .requests = 4,
         .tokens_per_request = 200,
         .zipf = 0.0,
         .seed = 13},
    };
    for (size_t c = 0; c < sizeof specs / sizeof specs[0]; c++) {
        trace *t = random_trace(&specs[c]);
        trace_stats *s = trace_stats_compute(t);
        const uint32_t E = s->experts, K = s->top_k;
        uint64_t cold = 0, *slot_opt = moesim_xcalloc((size_t)E + 1, sizeof *slot_opt);
        uint16_t *seq = moesim_xcalloc(t->n_tokens * K, sizeof *seq);
        for (uint32_t l = 0; l < s->layers; l++) {
            const layer_stats *ls = &s->per_layer[l];
            cold += ls->cold_misses;
            check_curves(ls->lru_hit_rate, ls->opt_hit_rate, K, E, c);
            check_monotone(ls->lru_slot_hit_rate, 1, E, c);
            double all = (double)(ls->accesses - ls->cold_misses) / (double)ls->accesses;
            cr_assert_eq(ls->lru_hit_rate[E], all);
            cr_assert_eq(ls->lru_slot_hit_rate[E], all);
            /* pinning only takes choices away from Belady; below top_k the rule is undefined */
            size_t n = layer_sequence(t, l, seq);
            trace_stats_hit_counts(seq, n, E, NULL, slot_opt);
            for (uint32_t cap = K; cap <= E; cap++)
                cr_assert_leq(ls->opt_hit_rate[cap], (double)slot_opt[cap] / (double)n);
            for (uint32_t cap = 0; cap < K; cap++)
                cr_assert(isnan(ls->lru_hit_rate[cap]) && isnan(ls->opt_hit_rate[cap]));
        }
        check_curves(s->lru_hit_rate, s->opt_hit_rate, K, E, c);
        check_monotone(s->lru_slot_hit_rate, 1, E, c);
        cr_assert_eq(s->lru_hit_rate[E], (double)(s->accesses - cold) / (double)s->accesses);
        free(slot_opt);
        free(seq);
        trace_stats_destroy(s);
        free_trace(t);
    }
}

/* ---- skew ---- */

Test(trace_stats, skew_figures_match_hand_computed_counts) {
    /* one layer, E = 4, k = 1, counts 6, 2, 1, 1: sorted 1 1 2 6, sum i*x = 33,
     * Gini = 2*33/(4*10) - 5/4 = 0.4; busiest ceil(0.4) = 1 expert holds 0.6; mean 2.5 */
    const uint16_t order[10] = {0, 1, 0, 2, 0, 0, 3, 1, 0, 0};
    trace *t = make_trace(1, 4, 1, 10, 0, 0);
    uint32_t req[10] = {0};
    set_tokens(t, req, NULL);
    for (uint64_t i = 0; i < 10; i++) set_row(t, i, 0, &order[i]);
    trace_stats *s = trace_stats_compute(t);
    const layer_stats *ls = &s->per_layer[0];
    const uint64_t want_counts[4] = {6, 2, 1, 1};
    for (uint32_t e = 0; e < 4; e++) cr_assert_eq(ls->expert_count[e], want_counts[e]);
    cr_assert_float_eq(ls->gini, 0.4, 1e-12);
    cr_assert_float_eq(ls->top10_share, 0.6, 1e-12);
    cr_assert_float_eq(ls->max_over_mean, 2.4, 1e-12);
    cr_assert_float_eq(ls->min_over_mean, 0.4, 1e-12);
    cr_assert_float_eq(s->gini, 0.4, 1e-12); /* one layer: the mean over layers is the layer */
    trace_stats_destroy(s);
    free_trace(t);
}

Test(trace_stats, equal_counts_have_zero_gini_and_overall_skew_is_the_mean_over_layers) {
    /* layer 0: every expert once (Gini 0); layer 1: expert 0 always (Gini (E-1)/E) */
    const uint32_t E = 20;
    trace *t = make_trace(2, E, 1, E, 0, 0);
    uint32_t req[20] = {0};
    set_tokens(t, req, NULL);
    for (uint64_t i = 0; i < E; i++) {
        uint16_t e = (uint16_t)i, zero = 0;
        set_row(t, i, 0, &e);
        set_row(t, i, 1, &zero);
    }
    trace_stats *s = trace_stats_compute(t);
    cr_assert_float_eq(s->per_layer[0].gini, 0.0, 1e-12);
    cr_assert_float_eq(s->per_layer[0].top10_share, 2.0 / 20.0, 1e-12);
    cr_assert_float_eq(s->per_layer[0].max_over_mean, 1.0, 1e-12);
    cr_assert_float_eq(s->per_layer[1].gini, 19.0 / 20.0, 1e-12);
    cr_assert_float_eq(s->per_layer[1].top10_share, 1.0, 1e-12);
    cr_assert_float_eq(s->per_layer[1].max_over_mean, 20.0, 1e-12);
    cr_assert_float_eq(s->per_layer[1].min_over_mean, 0.0, 1e-12);
    cr_assert_float_eq(s->gini, 19.0 / 40.0, 1e-12);
    cr_assert_float_eq(s->max_over_mean, 10.5, 1e-12);
    trace_stats_destroy(s);
    free_trace(t);
}

/* ---- reuse ---- */

Test(trace_stats, reuse_pairs_consecutive_tokens_of_the_same_request_even_when_interleaved) {
    /* requests 0 and 1 interleave; k = 2. Pairs of request 0: (t0,t2) top-1 same, (t2,t4)
     * share expert 5 only. Request 1: (t1,t3) disjoint. Adjacent tokens of different requests
     * (t0,t1) share everything but are not pairs. */
    const uint32_t req[5] = {0, 1, 0, 1, 0};
    const uint16_t rows[5][2] = {{3, 4}, {3, 4}, {3, 5}, {6, 7}, {5, 1}};
    trace *t = make_trace(1, 8, 2, 5, 0, 0);
    set_tokens(t, req, NULL);
    for (uint64_t i = 0; i < 5; i++) set_row(t, i, 0, rows[i]);
    trace_stats *s = trace_stats_compute(t);
    cr_assert_eq(s->per_layer[0].reuse_pairs, 3);
    cr_assert_float_eq(s->reuse_top1, 1.0 / 3.0, 1e-12);
    cr_assert_float_eq(s->reuse_any, 2.0 / 3.0, 1e-12);
    trace_stats_destroy(s);
    free_trace(t);
}

Test(trace_stats, top1_is_the_largest_gate_weight_whatever_the_stored_order) {
    const uint32_t req[2] = {0, 0};
    trace *t = make_trace(1, 8, 2, 2, 0, 0);
    set_tokens(t, req, NULL);
    const uint16_t a[2] = {1, 2}, b[2] = {3, 1};
    set_row(t, 0, 0, a);
    set_row(t, 1, 0, b);
    t->gate_weights[2] = 0.1f; /* token 1 stores expert 3 first but gives expert 1 more weight */
    t->gate_weights[3] = 0.9f;
    trace_stats *s = trace_stats_compute(t);
    cr_assert_float_eq(s->reuse_top1, 1.0, 1e-12);
    trace_stats_destroy(s);
    free_trace(t);
}

Test(trace_stats, uniform_routing_reuse_matches_the_random_baselines_of_mixtral_table_5) {
    /* E = 8, k = 2: top-1 same with probability 1/8; sets meet with 1 - C(6,2)/C(8,2) = 13/28 */
    random_spec sp = {.layers = 2,
                      .experts = 8,
                      .k = 2,
                      .requests = 10,
                      .tokens_per_request = 5000,
                      .zipf = 0.0,
                      .seed = 21};
    trace *t = random_trace(&sp);
    trace_stats *s = trace_stats_compute(t);
    double pairs = 2.0 * (10 * 4999);
    double p1 = 1.0 / 8.0, pany = 13.0 / 28.0;
    /* five standard deviations of a binomial share */
    cr_assert_float_eq(s->reuse_top1, p1, 5 * sqrt(p1 * (1 - p1) / pairs));
    cr_assert_float_eq(s->reuse_any, pany, 5 * sqrt(pany * (1 - pany) / pairs));
    trace_stats_destroy(s);
    free_trace(t);
}

Test(trace_stats, reuse_distance_is_the_mean_lru_stack_depth_of_re_accesses) {
    /* one request, k = 1: 0 1 0 0 2 1 -> re-accesses at depths 2, 1, 3: mean 2 */
    const uint16_t order[6] = {0, 1, 0, 0, 2, 1};
    const uint32_t req[6] = {0};
    trace *t = make_trace(1, 4, 1, 6, 0, 0);
    set_tokens(t, req, NULL);
    for (uint64_t i = 0; i < 6; i++) set_row(t, i, 0, &order[i]);
    trace_stats *s = trace_stats_compute(t);
    cr_assert_eq(s->per_layer[0].cold_misses, 3);
    cr_assert_float_eq(s->mean_reuse_distance, 2.0, 1e-12);
    trace_stats_destroy(s);
    free_trace(t);
}

/* ---- unrecorded rows ---- */

Test(trace_stats, unrecorded_rows_make_no_access_and_break_reuse_pairs) {
    const uint32_t req[4] = {0, 0, 0, 0};
    const uint16_t rows[4][2] = {{1, 2}, {1, 2}, {0, 0}, {1, 2}};
    trace *t = make_trace(1, 4, 2, 4, 0, 0);
    set_tokens(t, req, NULL);
    for (uint64_t i = 0; i < 4; i++) set_row(t, i, 0, rows[i]);
    set_unrecorded(t, 2, 0);
    trace_stats *s = trace_stats_compute(t);
    const layer_stats *ls = &s->per_layer[0];
    cr_assert_eq(ls->accesses, 6);
    cr_assert_eq(ls->tokens, 3);
    cr_assert_eq(ls->expert_count[1], 3);
    cr_assert_eq(ls->expert_count[0], 0);
    cr_assert_eq(ls->reuse_pairs, 1); /* (t0,t1) only: t2 is unrecorded */
    cr_assert_float_eq(ls->lru_hit_rate[2], 4.0 / 6.0, 1e-12);
    trace_stats_destroy(s);
    free_trace(t);
}

/* ---- active share by batch ---- */

Test(trace_stats, a_batch_of_one_touches_exactly_k_of_e_experts) {
    random_spec sp = {.layers = 3,
                      .experts = 64,
                      .k = 6,
                      .requests = 5,
                      .tokens_per_request = 40,
                      .zipf = 1.0,
                      .seed = 31};
    trace *t = random_trace(&sp);
    trace_stats *s = trace_stats_compute(t);
    cr_assert_eq(s->active_share[0], 6.0 / 64.0);
    for (uint32_t l = 0; l < 3; l++) cr_assert_eq(s->per_layer[l].active_share[0], 6.0 / 64.0);
    cr_assert(!isnan(s->active_share[2])); /* B = 4: 5 requests suffice */
    cr_assert(isnan(s->active_share[3]), "B = 8 needs 8 requests with decode tokens");
    cr_assert(isnan(s->active_share[5]));
    trace_stats_destroy(s);
    free_trace(t);
}

Test(trace_stats, active_share_unites_the_iteration_tokens_of_each_group_of_b_requests) {
    /* E = 8, k = 2, one layer. Request 0: prefill then decode {0,1} {2,3} {0,1};
     * request 1: decode {0,2} {4,5}; request 2: only prefill (no decode: not grouped);
     * request 3: decode {6,7}.
     * B = 2: decode requests 0, 1, 3 -> one group (0, 1), 2 iterations:
     *   it 0: {0,1} u {0,2} = 3; it 1: {2,3} u {4,5} = 4 -> mean 3.5 / 8.
     * B = 4: only 3 decode requests -> absent. */
    const uint32_t req[9] = {0, 1, 0, 2, 1, 0, 3, 0, 2};
    const uint8_t ph[9] = {TRACE_PREFILL, TRACE_DECODE, TRACE_DECODE, TRACE_PREFILL, TRACE_DECODE,
                           TRACE_DECODE,  TRACE_DECODE, TRACE_DECODE, TRACE_PREFILL};
    const uint16_t rows[9][2] = {{7, 6}, {0, 2}, {0, 1}, {5, 4}, {4, 5},
                                 {2, 3}, {6, 7}, {0, 1}, {3, 2}};
    trace *t = make_trace(1, 8, 2, 9, 0, 0);
    set_tokens(t, req, ph);
    for (uint64_t i = 0; i < 9; i++) set_row(t, i, 0, rows[i]);
    trace_stats *s = trace_stats_compute(t);
    cr_assert_eq(s->decode_requests, 3);
    cr_assert_eq(s->active_share[0], 2.0 / 8.0);
    cr_assert_float_eq(s->active_share[1], 3.5 / 8.0, 1e-12);
    cr_assert(isnan(s->active_share[2]));
    trace_stats_destroy(s);
    free_trace(t);
}

Test(trace_stats, uniform_routing_touches_one_minus_one_minus_k_over_e_to_the_b) {
    random_spec sp = {.layers = 2,
                      .experts = 32,
                      .k = 4,
                      .requests = 64,
                      .tokens_per_request = 200,
                      .zipf = 0.0,
                      .seed = 41};
    trace *t = random_trace(&sp);
    trace_stats *s = trace_stats_compute(t);
    for (uint32_t b = 0; b < STATS_N_BATCH; b++) {
        double want = 1.0 - pow(1.0 - 4.0 / 32.0, trace_stats_batch_sizes[b]);
        cr_assert_float_eq(s->active_share[b], want, 0.01, "B = %u: %.4f, expected %.4f",
                           trace_stats_batch_sizes[b], s->active_share[b], want);
    }
    trace_stats_destroy(s);
    free_trace(t);
}

/* ---- look-ahead accuracy ---- */

Test(trace_stats, lookahead_accuracy_scores_top1_and_recall_per_distance) {
    /* L = 3, E = 8, k = 2, D = 2, K' = 3. One token.
     * layer 0 predicts layer 1 = {4,5,1} (actual {4,6}: top-1 right, recall among first 2 = 1/2)
     *                  layer 2 = {0,7,3} (actual {7,0}: top-1 wrong, recall 2/2)
     * layer 1 predicts layer 2 = {7,2,0} (top-1 right, recall among {7,2} = 1/2), d=2 padding */
    trace *t = make_trace(3, 8, 2, 1, 2, 3);
    const uint32_t req[1] = {0};
    set_tokens(t, req, NULL);
    const uint16_t r0[2] = {1, 2}, r1[2] = {4, 6}, r2[2] = {7, 0};
    set_row(t, 0, 0, r0);
    set_row(t, 0, 1, r1);
    set_row(t, 0, 2, r2);
    const uint16_t p[3][2][3] = {{{4, 5, 1}, {0, 7, 3}},
                                 {{7, 2, 0}, {TRACE_NO_EXPERT, TRACE_NO_EXPERT, TRACE_NO_EXPERT}},
                                 {{TRACE_NO_EXPERT, TRACE_NO_EXPERT, TRACE_NO_EXPERT},
                                  {TRACE_NO_EXPERT, TRACE_NO_EXPERT, TRACE_NO_EXPERT}}};
    for (uint32_t l = 0; l < 3; l++)
        for (uint32_t d = 1; d <= 2; d++)
            memcpy(t->lookahead_ids + trace_lookahead_index(t, 0, l, d), p[l][d - 1],
                   sizeof p[l][d - 1]);
    trace_stats *s = trace_stats_compute(t);
    cr_assert_eq(s->lookahead_depth, 2);
    cr_assert_float_eq(s->lookahead_top1[0], 1.0, 1e-12); /* two d=1 predictions, both right */
    cr_assert_float_eq(s->lookahead_recall[0], 2.0 / 4.0, 1e-12);
    cr_assert_float_eq(s->lookahead_top1[1], 0.0, 1e-12);
    cr_assert_float_eq(s->lookahead_recall[1], 1.0, 1e-12);
    cr_assert_float_eq(s->per_layer[0].lookahead_recall[0], 0.5, 1e-12);
    cr_assert(isnan(s->per_layer[1].lookahead_top1[1]), "layer 1 + 2 is beyond the last layer");
    cr_assert(isnan(s->per_layer[2].lookahead_top1[0]));
    trace_stats_destroy(s);
    free_trace(t);
}

Test(trace_stats, a_trace_without_predictions_has_no_lookahead_figures) {
    random_spec sp = {
        .layers = 2, .experts = 8, .k = 2, .requests = 2, .tokens_per_request = 10, .seed = 51};
    trace *t = random_trace(&sp);
    trace_stats *s = trace_stats_compute(t);
    cr_assert_eq(s->lookahead_depth, 0);
    cr_assert_null(s->lookahead_top1);
    json_t *j = trace_stats_to_json(s);
    cr_assert(json_is_null(json_object_get(j, "lookahead_top1")));
    json_decref(j);
    trace_stats_destroy(s);
    free_trace(t);
}

/* ---- JSON ---- */

Test(trace_stats, json_has_the_issue_keys_and_is_the_same_bytes_every_time) {
    random_spec sp = {.layers = 3,
                      .experts = 16,
                      .k = 2,
                      .requests = 3,
                      .tokens_per_request = 30,
                      .zipf = 1.0,
                      .seed = 61};
    trace *t = random_trace(&sp);
    char *dumps[2];
    for (int i = 0; i < 2; i++) {
        trace_stats *s = trace_stats_compute(t);
        json_t *j = trace_stats_to_json(s);
        static const char *const keys[] = {"tokens",
                                           "layers",
                                           "experts",
                                           "top_k",
                                           "lru_hit_rate",
                                           "opt_hit_rate",
                                           "active_share_by_batch",
                                           "per_layer"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            cr_assert_not_null(json_object_get(j, keys[k]), "missing key %s", keys[k]);
        cr_assert_eq(json_integer_value(json_object_get(j, "tokens")), 90);
        cr_assert_eq(json_integer_value(json_object_get(j, "top_k")), 2);
        /* the simulator's rule from top_k = 2 on; per slot from 1 */
        json_t *lru = json_object_get(j, "lru_hit_rate");
        cr_assert_eq(json_object_size(lru), 15);
        cr_assert_null(json_object_get(lru, "1"));
        cr_assert_eq(json_real_value(json_object_get(lru, "4")), s->lru_hit_rate[4]);
        json_t *slot = json_object_get(j, "lru_slot_hit_rate");
        cr_assert_eq(json_object_size(slot), 16);
        cr_assert_eq(json_real_value(json_object_get(slot, "1")), s->lru_slot_hit_rate[1]);
        json_t *by_b = json_object_get(j, "active_share_by_batch");
        cr_assert_eq(json_real_value(json_object_get(by_b, "1")), 2.0 / 16.0);
        cr_assert(json_is_null(json_object_get(by_b, "4")), "3 requests cannot form a batch of 4");
        cr_assert_eq(json_array_size(json_object_get(j, "per_layer")), 3);
        dumps[i] = json_dumps(j, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        json_decref(j);
        trace_stats_destroy(s);
    }
    cr_assert_str_eq(dumps[0], dumps[1]);
    free(dumps[0]);
    free(dumps[1]);
    free_trace(t);
}

Test(trace_stats, an_empty_trace_gives_absent_figures) {
    trace *t = make_trace(2, 8, 2, 0, 0, 0);
    trace_stats *s = trace_stats_compute(t);
    cr_assert_eq(s->accesses, 0);
    cr_assert(isnan(s->gini));
    cr_assert(isnan(s->lru_hit_rate[1]));
    cr_assert(isnan(s->reuse_any));
    for (uint32_t b = 0; b < STATS_N_BATCH; b++) cr_assert(isnan(s->active_share[b]));
    json_t *j = trace_stats_to_json(s);
    cr_assert(json_is_null(json_object_get(json_object_get(j, "lru_hit_rate"), "8")));
    json_decref(j);
    trace_stats_destroy(s);
    free_trace(t);
}
