/* Internal to traces/: Mattson's stack passes (stats_stack.c) as the statistics pass (stats.c)
 * drives them: one layer's access sequence cut into routes, LRU and Belady/OPT stack depths of
 * every access gathered into histograms, so that one pass gives the hits of every capacity.
 * stats_stack.c's file comment explains the algorithms. */
#ifndef MOESIM_TRACES_STATS_STACK_H
#define MOESIM_TRACES_STATS_STACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

#define NEVER UINT32_MAX /* next use of an expert that is not accessed again */

/* ---- stamped marks: set membership in O(1) without clearing between sets ---- */

typedef struct marker {
    uint32_t *mark; /* [n] the stamp of the set an element was last put in */
    size_t n;
    uint32_t stamp; /* current set; 0 is never a live stamp */
} marker;

static inline void marker_init(marker *m, size_t n) {
    m->mark = moesim_xcalloc(n ? n : 1, sizeof *m->mark);
    m->n = n;
    m->stamp = 0;
}

static inline void marker_free(marker *m) { free(m->mark); }

/* Starts a new, empty set. */
static inline void marker_next(marker *m) {
    if (++m->stamp == 0) { /* wrapped: old stamps could collide, clear them */
        memset(m->mark, 0, m->n * sizeof *m->mark);
        m->stamp = 1;
    }
}

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

/* The stacks of one access sequence, kept between segments of it (a layer's accesses come
 * block by block when the trace is streamed). Times are indices into the whole sequence. */
typedef struct stack_state {
    uint32_t *stack; /* [n_experts + 1 + STACK_PAD] LRU */
    uint32_t *prio;  /* [n_experts + 1 + STACK_PAD] OPT per slot */
    uint32_t *prio2; /* [n_experts + 1 + STACK_PAD] OPT with routes pinned */
    uint32_t *last;  /* [n_experts] time of each expert's last access, NEVER before the first */
    uint32_t lru_size, opt_size, opt2_size;
    uint32_t now; /* accesses so far: the time of the next segment's first access */
} stack_state;

/* Scratch for the stack passes, sized once. */
typedef struct stack_scratch {
    stack_state whole;  /* the state of route_histograms (one segment: the whole sequence) */
    uint32_t *pre_last; /* [n_experts] the route's experts' last access before the route */
    marker in_route;    /* [n_experts] experts already accessed in the current route */
    uint32_t *next_use; /* [capacity] next use of each access of seq (route_histograms) */
    uint32_t *after;    /* [n_experts] next uses past the current route of its experts */
    size_t capacity;    /* accesses of the longest sequence */
    bool avx2; /* the CPU runs the AVX2 steps (MOESIM_STATS_SIMD=scalar: the portable ones) */
} stack_scratch;

/* Depth histograms (hist[0] = cold misses, hist[d] = hits at every capacity >= d); NULL: that
 * one is not computed. */
typedef struct depth_hists {
    uint64_t *lru_slot, *opt_slot; /* [n_experts + 1] per-slot rule: nothing pinned */
    uint64_t *lru, *opt;           /* [n_experts + 1] the simulator's rule: routes pinned */
} depth_hists;

/* Scratch for n_experts and sequences of up to `capacity` accesses; _free releases it. */
void stack_scratch_init(stack_scratch *s, uint32_t n_experts, size_t capacity);
void stack_scratch_free(stack_scratch *s);
/* Fills the histograms of `h` for the access sequence seq [n] cut into `routes`. */
void route_histograms(const uint16_t *seq, size_t n, const route_list *routes, uint32_t n_experts,
                      stack_scratch *s, const depth_hists *h);

/* The same over a sequence given in segments of whole routes, one call per segment in order:
 * seq [n] the segment's accesses, next_use [n] the time (index in the whole sequence) of each
 * one's next access or NEVER; the stacks carry over in `st` (stack_state_init: empty), so the
 * histograms summed over the segments are those of route_histograms on the whole sequence. */
void stack_state_init(stack_state *st, uint32_t n_experts);
void stack_state_free(stack_state *st);
void route_histograms_segment(const uint16_t *seq, size_t n, const uint32_t *next_use,
                              const route_list *routes, uint32_t n_experts, stack_state *st,
                              stack_scratch *s, const depth_hists *h);

#endif
