/* Hit counts of a per-layer expert cache for every capacity at once: Mattson's stack algorithm
 * for LRU and the priority-stack form of Belady's OPT (traces/stats.h: trace_stats_hit_counts,
 * trace_stats_route_hit_counts), under the per-slot rule and under the simulator's (a route's
 * experts resident together). stats.c runs them per layer; how they work is below. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/stats.h"
#include "traces/stats_stack.h"

/* ---- the two stack passes ----
 *
 * Both stacks hold access times (indices into the layer's sequence) instead of expert ids,
 * which lets the search run over one flat uint32 array and needs no position index:
 *   - LRU: level j holds the time of the last access of the j-th most recently used expert;
 *     the accessed expert is found as the level holding last[e];
 *   - OPT: level j holds the next-use time (priority) of the expert there. The expert accessed
 *     at time i is exactly the one whose next use is i (it was set at its previous access), so
 *     it is found as the level holding i; experts never used again hold NEVER, and which of
 *     two such experts sits higher changes no hit, so identical NEVER values need no identity.
 * Each array has one spare level past the live ones for a sentinel, so the searches need no
 * bound check; a search that stops at the sentinel is a cold miss. */

/* One LRU access of expert e at time `now`: returns its stack depth (1-based; 0: first access);
 * the access goes on top, the levels above its old one move down. */
static inline uint32_t lru_step(uint32_t *stack, uint32_t *size, uint32_t *last, uint16_t e,
                                uint32_t now) {
    uint32_t want = last[e];
    stack[*size] = want; /* sentinel */
    uint32_t d = 0, carried = now;
    for (;;) { /* push the access on top, shifting levels down until its old level */
        uint32_t x = stack[d];
        stack[d] = carried;
        if (x == want) break;
        carried = x;
        d++;
    }
    last[e] = now;
    if (d == *size) { /* not in the stack: first access (the stack grew a level) */
        MOESIM_ASSERT(want == NEVER);
        (*size)++;
        return 0;
    }
    return d + 1;
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

/* One OPT access at time `now` (the expert whose priority is `now`), next used at `next`:
 * returns its depth (1-based; 0: first access); the old top is carried down to its level. */
static inline uint32_t opt_step(uint32_t *prio, uint32_t *size, uint32_t now, uint32_t next) {
    prio[*size] = now; /* sentinel */
    uint32_t d = 0;
    if (prio[0] != now) {
        uint32_t carried = prio[0];
        d = 1;
        for (uint32_t x; (x = prio[d]) != now; d++) {
            prio[d] = x < carried ? x : carried;
            carried = x < carried ? carried : x;
        }
        prio[d] = carried;
    }
    prio[0] = next;
    if (d == *size) { /* first access: the stack grew by one level */
        (*size)++;
        return 0;
    }
    return d + 1;
}

/* ---- the same steps, 8 levels per vector (AVX2) ----
 *
 * Chosen at run time where the CPU has AVX2 (__builtin_cpu_supports); the scalar steps above
 * stay the reference and the fallback, and both give the same histograms exactly.
 *   - LRU: one forward pass over 8-level chunks does the search and the shift together: each
 *     chunk is stored rotated down by one lane, its lane 0 taking the previous chunk's lane 7
 *     (the access itself for the first); in the chunk holding the old level, lanes past it
 *     keep their value.
 *   - OPT: the carry down levels 1..d-1 is a running maximum: with c = the old top and x_j the
 *     old level j, the carried item after level j is P_j = max(c, x_1..x_j), level j keeps
 *     min(x_j, P_{j-1}) and level d (which held `now`, the smallest priority of the stack)
 *     gets P_{d-1}. Each chunk computes its prefix maximum in 3 shift-and-max steps; only the
 *     maximum carried from chunk to chunk is a dependent chain (one vpmaxud per 8 levels).
 * Both go 16 levels per round (one exit test per round) and read up to 15 levels past the
 * sentinel: the arrays have STACK_PAD spare levels. */
#define STACK_PAD 16
/* Up to this many experts the stacks are so shallow that the scalar steps are faster (bench:
 * E = 8 runs ~40 % faster scalar, E = 64 ~35 % faster with AVX2). */
#define STATS_SIMD_MIN_EXPERTS 16

#if defined(__x86_64__) && defined(__GNUC__)
#define STATS_HAVE_AVX2 1
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2"), always_inline)) static inline

/* Lanes i > lane: -1 (keep the old value there), else 0. */
AVX2_FN __m256i lanes_after(uint32_t lane) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(idx, _mm256_set1_epi32((int)lane));
}

AVX2_FN uint32_t lru_step_avx2(uint32_t *stack, uint32_t *size, uint32_t *last, uint16_t e,
                               uint32_t now) {
    const uint32_t want = last[e];
    stack[*size] = want; /* sentinel */
    const __m256i w = _mm256_set1_epi32((int)want);
    const __m256i rot = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6);
    __m256i carry = _mm256_set1_epi32((int)now); /* lane 0: what enters the chunk on top */
    uint32_t d;
    for (uint32_t b = 0;; b += 16) { /* two chunks per round: one exit test per 16 levels */
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(stack + b));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(stack + b + 8));
        uint32_t m = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(x0, w))) |
                     (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(x1, w)))
                         << 8;
        __m256i r0 = _mm256_permutevar8x32_epi32(x0, rot);
        __m256i r1 = _mm256_permutevar8x32_epi32(x1, rot);
        __m256i n0 = _mm256_blend_epi32(r0, carry, 0x01);
        __m256i n1 = _mm256_blend_epi32(r1, r0, 0x01);
        if (m) {
            uint32_t lane = (uint32_t)__builtin_ctz(m);
            n0 = _mm256_blendv_epi8(n0, x0, lanes_after(lane));
            n1 = _mm256_blendv_epi8(n1, x1, lanes_after(lane - 8)); /* all kept when lane < 8 */
            _mm256_storeu_si256((__m256i *)(stack + b), n0);
            _mm256_storeu_si256((__m256i *)(stack + b + 8), n1);
            d = b + lane;
            break;
        }
        _mm256_storeu_si256((__m256i *)(stack + b), n0);
        _mm256_storeu_si256((__m256i *)(stack + b + 8), n1);
        carry = r1;
    }
    last[e] = now;
    if (d == *size) { /* not in the stack: first access (the stack grew a level) */
        MOESIM_ASSERT(want == NEVER);
        (*size)++;
        return 0;
    }
    return d + 1;
}

/* One chunk of the OPT carry: x = old levels, carry = P of the levels before the chunk. Sets
 * *before = P_{j-1} per lane and *chunk_max = the chunk's own maximum in every lane; returns
 * min(x, P_{j-1}). */
AVX2_FN __m256i opt_chunk_avx2(__m256i x, __m256i carry, __m256i *before, __m256i *chunk_max) {
    const __m256i rot = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6);
    const __m256i sh1 = _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6);
    const __m256i sh2 = _mm256_setr_epi32(0, 1, 0, 1, 2, 3, 4, 5);
    const __m256i sh4 = _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3);
    __m256i p = _mm256_max_epu32(x, _mm256_permutevar8x32_epi32(x, sh1));
    p = _mm256_max_epu32(p, _mm256_permutevar8x32_epi32(p, sh2));
    p = _mm256_max_epu32(p, _mm256_permutevar8x32_epi32(p, sh4));
    *chunk_max = _mm256_permutevar8x32_epi32(p, _mm256_set1_epi32(7));
    p = _mm256_max_epu32(p, carry); /* P_j, inclusive */
    *before = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(p, rot), carry, 0x01);
    return _mm256_min_epu32(x, *before);
}

/* The last chunk, holding `now` at `lane` (may be past the chunk: then it is all carry). */
AVX2_FN __m256i opt_chunk_last_avx2(__m256i x, __m256i carried, __m256i before, int lane) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i l = _mm256_set1_epi32(lane);
    /* level d takes P_{d-1} (min(now, P_{d-1}) = now would be wrong there) */
    carried = _mm256_blendv_epi8(carried, before, _mm256_cmpeq_epi32(idx, l));
    return _mm256_blendv_epi8(carried, x, _mm256_cmpgt_epi32(idx, l));
}

AVX2_FN uint32_t opt_step_avx2(uint32_t *prio, uint32_t *size, uint32_t now, uint32_t next) {
    prio[*size] = now; /* sentinel */
    uint32_t d = 0;
    if (prio[0] != now) {
        const __m256i w = _mm256_set1_epi32((int)now);
        __m256i carry = _mm256_setzero_si256(); /* P of the levels before the round */
        for (uint32_t b = 0;; b += 16) {        /* level 0 (the old top, c) is lane 0 of chunk 0 */
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(prio + b));
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(prio + b + 8));
            uint32_t m =
                (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(x0, w))) |
                (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(x1, w))) << 8;
            __m256i before0, before1, max0, max1;
            __m256i n0 = opt_chunk_avx2(x0, carry, &before0, &max0);
            __m256i carry1 = _mm256_max_epu32(carry, max0);
            __m256i n1 = opt_chunk_avx2(x1, carry1, &before1, &max1);
            if (m) {
                int lane = __builtin_ctz(m);
                n0 = opt_chunk_last_avx2(x0, n0, before0, lane);
                n1 = opt_chunk_last_avx2(x1, n1, before1, lane - 8);
                _mm256_storeu_si256((__m256i *)(prio + b), n0);
                _mm256_storeu_si256((__m256i *)(prio + b + 8), n1);
                d = b + (uint32_t)lane;
                break;
            }
            _mm256_storeu_si256((__m256i *)(prio + b), n0);
            _mm256_storeu_si256((__m256i *)(prio + b + 8), n1);
            carry = _mm256_max_epu32(carry1, max1);
        }
    }
    prio[0] = next;
    if (d == *size) { /* first access: the stack grew by one level */
        (*size)++;
        return 0;
    }
    return d + 1;
}

#endif

/* ---- routes: the simulator's rule ----
 *
 * The simulator runs a token's experts together: every expert a (sub-)route needs is resident at
 * once, and none of them is the victim of a load for the same route (policies/policy.h). Under
 * that rule a route's accesses cannot evict each other, so:
 *   - LRU: a route S moves its experts to the top of the stack like per-slot accesses do, and
 *     an expert of S hits in a cache of capacity c (c >= |S|) exactly when its depth in the
 *     stack *before the route* is <= c (the cache holds the top c of the LRU stack at every
 *     route boundary: the route's misses evict the least recent experts outside S, which are
 *     the ones below the top c - |S| experts outside S). The depth before the route is the
 *     per-slot depth minus the experts of S already accessed in the route that were below it
 *     (or new): one stack pass gives both curves;
 *   - OPT: Belady under the rule evicts the expert outside S whose next use is farthest. That
 *     is plain Belady on the sequence in which every route is followed by its distinct experts
 *     once more ("again" accesses): while S is being accessed, each expert of S has its next
 *     use inside the route, sooner than any expert outside S, so Belady never evicts one, and
 *     the again accesses all hit at c >= |S|. The OPT stack over that sequence, counting only
 *     the route's own accesses, gives every capacity c >= |S| at once.
 * A route's later accesses of an expert it already accessed are hits (the same copy serves
 * them), as in the simulator. */

void stack_state_init(stack_state *st, uint32_t n_experts) {
    size_t E = n_experts ? n_experts : 1;
    st->stack = moesim_xcalloc(E + 1 + STACK_PAD, sizeof *st->stack);
    st->prio = moesim_xcalloc(E + 1 + STACK_PAD, sizeof *st->prio);
    st->prio2 = moesim_xcalloc(E + 1 + STACK_PAD, sizeof *st->prio2);
    st->last = moesim_xmalloc(E * sizeof *st->last);
    for (size_t e = 0; e < E; e++) st->last[e] = NEVER;
    st->lru_size = st->opt_size = st->opt2_size = st->now = 0;
}

void stack_state_free(stack_state *st) {
    free(st->stack);
    free(st->prio);
    free(st->prio2);
    free(st->last);
}

void stack_scratch_init(stack_scratch *s, uint32_t n_experts, size_t capacity) {
    size_t E = n_experts ? n_experts : 1;
    stack_state_init(&s->whole, n_experts);
    s->pre_last = moesim_xcalloc(E, sizeof *s->pre_last);
    marker_init(&s->in_route, E);
    s->next_use = moesim_xcalloc(capacity ? capacity : 1, sizeof *s->next_use);
    s->after = moesim_xcalloc(E, sizeof *s->after);
    s->capacity = capacity;
#ifdef STATS_HAVE_AVX2
    __builtin_cpu_init();
    const char *force = getenv("MOESIM_STATS_SIMD");
    s->avx2 = n_experts > STATS_SIMD_MIN_EXPERTS && __builtin_cpu_supports("avx2") &&
              !(force && strcmp(force, "scalar") == 0);
#else
    s->avx2 = false;
#endif
}

void stack_scratch_free(stack_scratch *s) {
    stack_state_free(&s->whole);
    free(s->pre_last);
    marker_free(&s->in_route);
    free(s->next_use);
    free(s->after);
}

/* The LRU depth of expert e before the current route, from its per-slot depth d (the stack
 * pass just moved it on top) and its last access before this one; the first access of e in
 * the route joins the route's list. A later access of e in the route is a hit at depth 1. */
static inline uint32_t pinned_lru_depth(stack_scratch *s, uint16_t e, uint32_t before, uint32_t d,
                                        uint32_t *members) {
    if (s->in_route.mark[e] == s->in_route.stamp) return 1;
    s->in_route.mark[e] = s->in_route.stamp;
    uint32_t pd = d;
    if (d) /* members that were below e (or new) pushed it down by one each */
        for (uint32_t x = 0; x < *members; x++)
            pd -= s->pre_last[x] == NEVER || s->pre_last[x] < before;
    s->pre_last[(*members)++] = before;
    MOESIM_ASSERT(d == 0 || pd >= 1);
    return pd;
}

/* The widest route's distinct experts: the smallest capacity the rule allows. */
static uint32_t widest_route(const uint16_t *seq, const route_list *routes, stack_scratch *s) {
    uint32_t widest = 0;
    size_t i = 0;
    for (size_t r = 0; r < routes->n; r++) {
        uint32_t m = route_length(routes, r), u = 0;
        marker_next(&s->in_route);
        for (uint32_t j = 0; j < m; j++, i++) {
            if (s->in_route.mark[seq[i]] == s->in_route.stamp) continue;
            s->in_route.mark[seq[i]] = s->in_route.stamp;
            u++;
        }
        if (u > widest) widest = u;
    }
    return widest;
}

/* The pinned OPT stack runs the doubled sequence (routes followed by their again accesses)
 * without writing it out. Its times are 2 i for access i; while a route [r0, r1) runs, an
 * access whose expert comes back inside the route gets that use as its priority, and the last
 * access of each of its experts gets IN_ROUTE(r1) = 2 r1 - 1: sooner than any use past the route
 * (>= 2 r1) and never the time of an access (odd), like the again accesses that follow. Those
 * experts are then exactly the top |S| levels (each access puts its expert on top and the carry
 * keeps the sooner item at every level), and the again accesses only reorder those levels and
 * give them their true next uses. The order inside the top |S| <= widest levels changes no
 * count at a capacity >= the widest route (an access found there hits at all of them, and what
 * the carry takes past them is their maximum, whatever their order), so the again accesses
 * reduce to writing the route's next uses past its end into the top |S| levels. */
#define IN_ROUTE(r1) (2 * (uint32_t)(r1)-1)

/* The pass, written once and built twice: with the scalar steps and (where the CPU has AVX2)
 * with the vector ones. One loop over the routes runs up to three stacks: LRU (per-slot and
 * pinned depths), OPT per slot and OPT with routes pinned (both over s->next_use). The LRU
 * shift and the OPT carries are each a chain of dependent loads and compares; interleaved, the
 * core overlaps them (measured with bench_trace_stats on the shared 2-core machine, CPU time:
 * +10..35 % accesses/s for two chains; the pinned OPT as a separate pass over a written-out
 * doubled sequence made the whole stats step 2.1 CPU-s, interleaved 1.5, Qwen3-30B-A3B
 * geometry, 32 M accesses). */
#define DEFINE_STACK_PASS(SFX, ATTR, LRU_STEP, OPT_STEP)                                           \
    ATTR static void route_pass_##SFX(const uint16_t *seq, const uint32_t *next_use,              \
                                      const route_list *routes, uint32_t n_experts,               \
                                      stack_state *st, stack_scratch *s, const depth_hists *h) {  \
        size_t i = st->now; /* time of seq[i - st->now] */                                         \
        const size_t i0 = st->now;                                                                 \
        for (size_t r = 0; r < routes->n; r++) {                                                   \
            uint32_t m = route_length(routes, r), members = 0, n_after = 0;                        \
            const size_t r1 = i + m;                                                               \
            marker_next(&s->in_route);                                                             \
            for (uint32_t j = 0; j < m; j++, i++) {                                                \
                uint16_t e = seq[i - i0];                                                          \
                uint32_t nu = h->opt_slot || h->opt ? next_use[i - i0] : NEVER;                    \
                if (h->opt_slot) h->opt_slot[OPT_STEP(st->prio, &st->opt_size, (uint32_t)i, nu)]++; \
                if (h->opt) {                                                                      \
                    uint32_t next = nu < r1 ? 2 * nu : IN_ROUTE(r1);                               \
                    if (nu >= r1) s->after[n_after++] = nu == NEVER ? NEVER : 2 * nu;              \
                    h->opt[OPT_STEP(st->prio2, &st->opt2_size, 2 * (uint32_t)i, next)]++;          \
                }                                                                                  \
                if (!h->lru_slot && !h->lru) continue;                                             \
                uint32_t before = st->last[e];                                                     \
                uint32_t d = LRU_STEP(st->stack, &st->lru_size, st->last, e, (uint32_t)i);         \
                if (h->lru_slot) h->lru_slot[d]++;                                                 \
                if (h->lru) h->lru[pinned_lru_depth(s, e, before, d, &members)]++;                 \
            }                                                                                      \
            for (uint32_t x = 0; x < n_after; x++) { /* the again accesses */                      \
                MOESIM_ASSERT(st->prio2[x] == IN_ROUTE(r1));                                       \
                st->prio2[x] = s->after[x];                                                        \
            }                                                                                      \
        }                                                                                          \
        st->now = (uint32_t)i;                                                                     \
        MOESIM_ASSERT(st->lru_size <= n_experts && st->opt_size <= n_experts &&                    \
                      st->opt2_size <= n_experts);                                                 \
    }

DEFINE_STACK_PASS(scalar, , lru_step, opt_step)
#ifdef STATS_HAVE_AVX2
DEFINE_STACK_PASS(avx2, __attribute__((target("avx2"))), lru_step_avx2, opt_step_avx2)
#endif

void route_histograms_segment(const uint16_t *seq, size_t n, const uint32_t *next_use,
                              const route_list *routes, uint32_t n_experts, stack_state *st,
                              stack_scratch *s, const depth_hists *h) {
    MOESIM_ASSERT(st->now + n < NEVER / 2);
#ifdef STATS_HAVE_AVX2
    if (s->avx2) {
        route_pass_avx2(seq, next_use, routes, n_experts, st, s, h);
        return;
    }
#endif
    route_pass_scalar(seq, next_use, routes, n_experts, st, s, h);
}

/* Fills the histograms of `h` for the access sequence seq [n] cut into `routes`. */
void route_histograms(const uint16_t *seq, size_t n, const route_list *routes, uint32_t n_experts,
                      stack_scratch *s, const depth_hists *h) {
    MOESIM_ASSERT(n < NEVER / 2 && n <= s->capacity);
    stack_state *st = &s->whole;
    if (h->opt_slot || h->opt) next_use_pass(seq, n, n_experts, st->last, s->next_use);
    for (uint32_t e = 0; e < n_experts; e++) st->last[e] = NEVER; /* next_use_pass's scratch */
    st->lru_size = st->opt_size = st->opt2_size = st->now = 0;
    route_histograms_segment(seq, n, s->next_use, routes, n_experts, st, s, h);
}

/* hits[c] = accesses found at depth <= c, c = 0..n_experts. */
static void hits_from_histogram(const uint64_t *hist, uint32_t n_experts, uint64_t *hits) {
    hits[0] = 0;
    for (uint32_t c = 1; c <= n_experts; c++) hits[c] = hits[c - 1] + hist[c];
}

/* The same for a curve defined from capacity `from` on: hits[c] = 0 below it. */
static void hits_from_histogram_from(const uint64_t *hist, uint32_t n_experts, uint32_t from,
                                     uint64_t *hits) {
    hits_from_histogram(hist, n_experts, hits);
    for (uint32_t c = 0; c < from && c <= n_experts; c++) hits[c] = 0;
}

void trace_stats_hit_counts(const uint16_t *seq, size_t n, uint32_t n_experts, uint64_t *lru_hits,
                            uint64_t *opt_hits) {
    MOESIM_ASSERT(n_experts >= 1 && n_experts <= MODEL_MAX_EXPERTS);
    for (size_t i = 0; i < n; i++) MOESIM_ASSERT(seq[i] < n_experts);
    stack_scratch s;
    stack_scratch_init(&s, n_experts, n);
    uint64_t *hist = moesim_xcalloc(2 * ((size_t)n_experts + 1), sizeof *hist);
    depth_hists h = {.lru_slot = lru_hits ? hist : NULL,
                     .opt_slot = opt_hits ? hist + n_experts + 1 : NULL};
    route_list one_each = {.fixed = 1, .n = n};
    route_histograms(seq, n, &one_each, n_experts, &s, &h);
    if (lru_hits) hits_from_histogram(h.lru_slot, n_experts, lru_hits);
    if (opt_hits) hits_from_histogram(h.opt_slot, n_experts, opt_hits);
    free(hist);
    stack_scratch_free(&s);
}

uint32_t trace_stats_route_hit_counts(const uint16_t *seq, size_t n, const uint32_t *route_len,
                                      size_t n_routes, uint32_t n_experts, uint64_t *lru_hits,
                                      uint64_t *opt_hits) {
    MOESIM_ASSERT(n_experts >= 1 && n_experts <= MODEL_MAX_EXPERTS);
    for (size_t i = 0; i < n; i++) MOESIM_ASSERT(seq[i] < n_experts);
    size_t total = 0;
    for (size_t r = 0; r < n_routes; r++) total += route_len[r];
    MOESIM_ASSERT(total == n);
    stack_scratch s;
    stack_scratch_init(&s, n_experts, n);
    route_list routes = {.len = route_len, .n = n_routes};
    uint32_t widest = widest_route(seq, &routes, &s);
    uint64_t *hist = moesim_xcalloc(2 * ((size_t)n_experts + 1), sizeof *hist);
    depth_hists h = {.lru = lru_hits ? hist : NULL, .opt = opt_hits ? hist + n_experts + 1 : NULL};
    route_histograms(seq, n, &routes, n_experts, &s, &h);
    if (lru_hits) hits_from_histogram_from(h.lru, n_experts, widest, lru_hits);
    if (opt_hits) hits_from_histogram_from(h.opt, n_experts, widest, opt_hits);
    free(hist);
    stack_scratch_free(&s);
    return widest;
}
