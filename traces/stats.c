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

const uint32_t trace_stats_batch_sizes[STATS_N_BATCH] = {1, 2, 4, 8, 16, 32};

#define NEVER           UINT32_MAX /* next use of an expert that is not accessed again */
#define NO_TOKEN        UINT64_MAX /* no previous token of this request yet */
#define PREFETCH_TOKENS 48         /* how far ahead the per-layer token loop prefetches rows */

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

/* Consecutive runs of a layer's access sequence that run together: `len` [n], or NULL when
 * every route is `fixed` accesses long (a token's top-k row). */
typedef struct route_list {
    const uint32_t *len;
    uint32_t fixed;
    size_t n;
} route_list;

static inline uint32_t route_length(const route_list *r, size_t i) {
    return r->len ? r->len[i] : r->fixed;
}

/* Scratch for the stack passes, sized once. */
typedef struct stack_scratch {
    uint32_t *stack;    /* [n_experts + 1 + STACK_PAD] LRU */
    uint32_t *prio;     /* [n_experts + 1 + STACK_PAD] OPT per slot */
    uint32_t *prio2;    /* [n_experts + 1 + STACK_PAD] OPT with routes pinned */
    uint32_t *last;     /* [n_experts] */
    uint32_t *pre_last; /* [n_experts] the route's experts' last access before the route */
    marker in_route;    /* [n_experts] experts already accessed in the current route */
    uint32_t *next_use; /* [capacity] next use of each access of seq */
    uint32_t *after;    /* [n_experts] next uses past the current route of its experts */
    size_t capacity;    /* accesses of the longest sequence */
    bool avx2; /* the CPU runs the AVX2 steps (MOESIM_STATS_SIMD=scalar: the portable ones) */
} stack_scratch;

static void stack_scratch_init(stack_scratch *s, uint32_t n_experts, size_t capacity) {
    size_t E = n_experts ? n_experts : 1;
    s->stack = moesim_xcalloc(E + 1 + STACK_PAD, sizeof *s->stack);
    s->prio = moesim_xcalloc(E + 1 + STACK_PAD, sizeof *s->prio);
    s->prio2 = moesim_xcalloc(E + 1 + STACK_PAD, sizeof *s->prio2);
    s->last = moesim_xcalloc(E, sizeof *s->last);
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

static void stack_scratch_free(stack_scratch *s) {
    free(s->stack);
    free(s->prio);
    free(s->prio2);
    free(s->last);
    free(s->pre_last);
    marker_free(&s->in_route);
    free(s->next_use);
    free(s->after);
}

/* Depth histograms (hist[0] = cold misses, hist[d] = hits at every capacity >= d); NULL: that
 * one is not computed. */
typedef struct depth_hists {
    uint64_t *lru_slot, *opt_slot; /* [n_experts + 1] per-slot rule: nothing pinned */
    uint64_t *lru, *opt;           /* [n_experts + 1] the simulator's rule: routes pinned */
} depth_hists;

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
#define IN_ROUTE(r1) (2 * (uint32_t)(r1) - 1)

/* The pass, written once and built twice: with the scalar steps and (where the CPU has AVX2)
 * with the vector ones. One loop over the routes runs up to three stacks: LRU (per-slot and
 * pinned depths), OPT per slot and OPT with routes pinned (both over s->next_use). The LRU
 * shift and the OPT carries are each a chain of dependent loads and compares; interleaved, the
 * core overlaps them (measured with bench_trace_stats on the shared 2-core machine, CPU time:
 * +10..35 % accesses/s for two chains; the pinned OPT as a separate pass over a written-out
 * doubled sequence made the whole stats step 2.1 CPU-s, interleaved 1.5, Qwen3-30B-A3B
 * geometry, 32 M accesses). */
#define DEFINE_STACK_PASS(SFX, ATTR, LRU_STEP, OPT_STEP)                                          \
    ATTR static void route_pass_##SFX(const uint16_t *seq, const route_list *routes,              \
                                      uint32_t n_experts, stack_scratch *s,                       \
                                      const depth_hists *h) {                                     \
        for (uint32_t e = 0; e < n_experts; e++) s->last[e] = NEVER;                              \
        uint32_t lru_size = 0, opt_size = 0, opt2_size = 0;                                       \
        size_t i = 0;                                                                             \
        for (size_t r = 0; r < routes->n; r++) {                                                  \
            uint32_t m = route_length(routes, r), members = 0, n_after = 0;                       \
            const size_t r1 = i + m;                                                              \
            marker_next(&s->in_route);                                                            \
            for (uint32_t j = 0; j < m; j++, i++) {                                               \
                uint16_t e = seq[i];                                                              \
                uint32_t nu = h->opt_slot || h->opt ? s->next_use[i] : NEVER;                     \
                if (h->opt_slot) h->opt_slot[OPT_STEP(s->prio, &opt_size, (uint32_t)i, nu)]++;    \
                if (h->opt) {                                                                     \
                    uint32_t next = nu < r1 ? 2 * nu : IN_ROUTE(r1);                              \
                    if (nu >= r1) s->after[n_after++] = nu == NEVER ? NEVER : 2 * nu;             \
                    h->opt[OPT_STEP(s->prio2, &opt2_size, 2 * (uint32_t)i, next)]++;              \
                }                                                                                 \
                if (!h->lru_slot && !h->lru) continue;                                            \
                uint32_t before = s->last[e];                                                     \
                uint32_t d = LRU_STEP(s->stack, &lru_size, s->last, e, (uint32_t)i);              \
                if (h->lru_slot) h->lru_slot[d]++;                                                \
                if (h->lru) h->lru[pinned_lru_depth(s, e, before, d, &members)]++;                \
            }                                                                                     \
            for (uint32_t x = 0; x < n_after; x++) { /* the again accesses */                     \
                MOESIM_ASSERT(s->prio2[x] == IN_ROUTE(r1));                                       \
                s->prio2[x] = s->after[x];                                                        \
            }                                                                                     \
        }                                                                                         \
        MOESIM_ASSERT(lru_size <= n_experts && opt_size <= n_experts && opt2_size <= n_experts);  \
    }

DEFINE_STACK_PASS(scalar, , lru_step, opt_step)
#ifdef STATS_HAVE_AVX2
DEFINE_STACK_PASS(avx2, __attribute__((target("avx2"))), lru_step_avx2, opt_step_avx2)
#endif

/* Fills the histograms of `h` for the access sequence seq [n] cut into `routes`. */
static void route_histograms(const uint16_t *seq, size_t n, const route_list *routes,
                             uint32_t n_experts, stack_scratch *s, const depth_hists *h) {
    MOESIM_ASSERT(n < NEVER / 2 && n <= s->capacity);
    if (h->opt_slot || h->opt) next_use_pass(seq, n, n_experts, s->last, s->next_use);
#ifdef STATS_HAVE_AVX2
    if (s->avx2) {
        route_pass_avx2(seq, routes, n_experts, s, h);
        return;
    }
#endif
    route_pass_scalar(seq, routes, n_experts, s, h);
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
    depth_hists hist;                 /* each [n_experts + 1], this layer */
    uint64_t *lru_hits, *opt_hits;    /* [n_experts + 1] routes pinned, summed over layers */
    uint64_t *lru_slot_hits;          /* [n_experts + 1] per slot, summed over layers */
    uint64_t *la_pairs, *la_top1, *la_found, *la_wanted; /* [D] this layer */
    uint64_t *sum_la_pairs, *sum_la_top1, *sum_la_found, *sum_la_wanted; /* [D] all layers */
    uint64_t reuse_pairs, reuse_top1, reuse_any;                         /* all layers */
    uint64_t reuse_dist_sum, reuse_dist_n;                               /* all layers */
    batch_plan batch;
} work;

/* A layer's hit-rate curve [E + 1] from its depth histogram: hits / n at c = from..E, NaN
 * below (index 0 included); adds the hit counts to sum [E + 1]. */
static double *layer_curve(const uint64_t *hist, uint32_t E, uint32_t from, size_t n,
                           uint64_t *sum, arena *mem) {
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
