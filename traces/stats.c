/* Statistics of a router trace; traces/STATS.md defines every figure and JSON key.
 *
 * How the work is laid out (performance matters: the bench target is >= 20 M accesses/s):
 *   - the trace comes block by block (a stream's blocks, or blocks of a trace in memory), so
 *     memory does not grow with its length; each layer keeps its stacks and counts across blocks;
 *   - a backward pass over the blocks finds every access's next use (for OPT) and stores it per
 *     block, in memory for a small trace, else in an unlinked temporary file;
 *   - the forward pass, per block and per layer, gathers that layer's accesses of the block
 *     (expert ids in token order, each top-k selection in stored order, unrecorded rows skipped)
 *     and on the way counts activations, consecutive-token reuse (each request in flight keeps
 *     its last row per layer) and look-ahead accuracy (predictions made at this layer), then
 *     runs the stacks over that segment;
 *   - LRU: Mattson's stack algorithm. A move-to-front stack of at most E experts; the depth
 *     (1-based) at which an access is found is its stack distance, and a histogram of
 *     distances gives the hits of every capacity c (distance <= c) in one pass;
 *   - OPT: the priority-stack form of Mattson et al. (1970). The priority of an expert is the
 *     index of its next access (sooner = higher; never again = lowest), found by the backward
 *     pass. On an access at depth d the expert goes to the top and the old top is carried down
 *     levels 1..d-1: at each level the item with the sooner next use stays and the other goes
 *     on; the last carried item fills level d. The top c levels are then exactly what Belady's
 *     cache of capacity c holds, so the depth histogram again gives every capacity at once;
 *   - the simulator's rule (a token's experts resident together, none evicted for the same
 *     token): the LRU curve comes from the same LRU stack (the depth before the token's
 *     route), the OPT curve from a third stack over the sequence in which every route is
 *     followed by its experts once more (see "routes" in stats_stack.c);
 *   - the three stacks run in one loop; with E > 16 on a CPU with AVX2 (checked at run time)
 *     each step handles 16 levels per exit test in vector registers (the OPT carry is a running
 *     maximum, so it vectorizes as a prefix maximum); the scalar steps are the fallback and
 *     give the same histograms (tests compare them; MOESIM_STATS_SIMD=scalar forces them);
 *   - active share by batch: each decode token's row becomes an expert bitmap, kept per window
 *     of 32 requests until the window's last decode token; groups of B requests are unions of
 *     two adjacent groups of B/2, built in place.
 * The stack passes themselves are in stats_stack.c.
 * No allocation per access: scratch arrays are sized once per call. The stacks hold access
 * times, not expert ids (see the stack passes); access indices within one layer are uint32 (a
 * layer holds fewer than 2^32 - 1 accesses: asserted).
 *
 * Units: counts are plain numbers of accesses, tokens or token pairs; rates are in [0, 1];
 * distances are stack depths (1 = the most recently used expert). */
#include "traces/stats.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/layer_twins.h"
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

/* ---- where the rows come from: a trace in memory or a stream, block by block ---- */

#define MEMORY_BLOCK_TOKENS 4096 /* blocks of a trace in memory: the scratch per block is small */

typedef struct stats_source {
    const trace *whole;  /* in memory, or NULL */
    trace_stream *ts;    /* streamed, or NULL */
    const trace *tokens; /* meta and counts */
    const trace_request_index *requests;
    uint64_t block_tokens, n_blocks;
    trace view;          /* the current block of `whole` */
    uint16_t *ids;       /* [block_tokens][L][k] a stream's block of expert ids */
} stats_source;

/* Block b (tokens [b * block_tokens, + *n)): a trace whose rows are indexed from 0. Valid until
 * the next call. */
static const trace *source_block(stats_source *src, uint64_t b, uint64_t *n) {
    const uint64_t first = b * src->block_tokens, left = src->tokens->n_tokens - first;
    *n = left < src->block_tokens ? left : src->block_tokens;
    if (src->ts) {
        uint64_t local;
        const trace *blk = trace_stream_row(src->ts, first, &local);
        MOESIM_ASSERT(local == 0);
        return blk;
    }
    const trace *t = src->whole;
    trace *v = &src->view;
    const size_t route = trace_route_values(&t->meta), la = trace_lookahead_values(&t->meta);
    *v = *t;
    v->n_tokens = *n;
    v->params_json = NULL;
    v->request_id = t->request_id + first;
    v->position = t->position + first;
    v->phase = t->phase + first;
    v->token_id = t->token_id ? t->token_id + first : NULL;
    v->expert_ids = t->expert_ids + first * route;
    v->gate_weights = t->gate_weights + first * route;
    v->importance = t->importance ? t->importance + first * t->meta.n_layers : NULL;
    v->lookahead_ids = t->lookahead_ids ? t->lookahead_ids + first * la : NULL;
    v->lookahead_scores = t->lookahead_scores ? t->lookahead_scores + first * la : NULL;
    return v;
}

/* Block b's expert ids alone (stride L * k per token), for the backward pass. */
static const uint16_t *source_experts(stats_source *src, uint64_t b, uint64_t *n) {
    const trace *blk = NULL;
    if (!src->ts) {
        blk = source_block(src, b, n);
        return blk->expert_ids;
    }
    const uint64_t first = b * src->block_tokens, left = src->tokens->n_tokens - first;
    *n = left < src->block_tokens ? left : src->block_tokens;
    trace_stream_read_experts(src->ts, first, *n, src->ids);
    return src->ids;
}

/* ---- the next uses, from a backward pass ----
 *
 * Belady's OPT needs each access's next use. One backward pass over the blocks finds it for
 * every layer and stores, per block, a region [L][block_tokens * k] (each layer's accesses of
 * the block, in order): in memory for a small trace, else in an unlinked temporary file (TMPDIR
 * or /tmp), read back block by block by the forward pass. Going back, accesses are numbered from
 * the end, so a stored next use is the reverse index of that access; the forward pass turns it
 * into the forward index once the layer's access count is known. */

#define NEXT_USE_MEMORY_BYTES (64u << 20) /* up to this the next uses stay in memory */

typedef struct next_use_store {
    uint32_t *mem;        /* [n_blocks * region] in memory, or NULL */
    int fd;               /* the temporary file, or -1 */
    size_t region;        /* values per block */
    uint32_t *buf;        /* [region] one block's values, file only */
    const char *dir;      /* of the temporary file (messages) */
} next_use_store;

/* The bytes kept in memory at most: NEXT_USE_MEMORY_BYTES, or MOESIM_STATS_NEXT_USE_MEMORY (tests
 * set 0 to run the file path on small traces). */
static uint64_t next_use_memory_limit(void) {
    const char *v = getenv("MOESIM_STATS_NEXT_USE_MEMORY");
    return v && *v ? strtoull(v, NULL, 10) : NEXT_USE_MEMORY_BYTES;
}

/* In memory when small or `fallback` (a caller that holds the trace whole), else a file sized
 * up front (so no write runs out of space later). */
static moesim_status store_init(next_use_store *st, uint64_t n_blocks, size_t region,
                                bool fallback, moesim_error *err) {
    memset(st, 0, sizeof *st);
    st->fd = -1;
    st->region = region;
    const uint64_t bytes = n_blocks * region * sizeof(uint32_t);
    if (bytes > next_use_memory_limit()) {
        st->dir = getenv("TMPDIR");
        if (!st->dir || !*st->dir) st->dir = "/tmp";
        char path[4096];
        snprintf(path, sizeof path, "%s/moesim-stats.XXXXXX", st->dir);
        st->fd = mkstemp(path);
        int e = st->fd < 0 ? errno : 0;
        if (st->fd >= 0) {
            unlink(path);
            e = posix_fallocate(st->fd, 0, (off_t)bytes);
        }
        if (!e) {
            st->buf = moesim_xmalloc((region ? region : 1) * sizeof *st->buf);
            return MOESIM_OK;
        }
        if (st->fd >= 0) close(st->fd);
        st->fd = -1;
        if (!fallback)
            return moesim_fail(err, MOESIM_EIO,
                               "cannot make a %.1f MB temporary file in %s for the next uses of "
                               "OPT (TMPDIR names another folder): %s",
                               (double)bytes / 1e6, st->dir, strerror(e));
    }
    const uint64_t values = n_blocks * region;
    st->mem = moesim_xmalloc((values ? values : 1) * sizeof *st->mem);
    return MOESIM_OK;
}

static void store_free(next_use_store *st) {
    free(st->mem);
    free(st->buf);
    if (st->fd >= 0) close(st->fd);
}

/* Block b's values on disk: written once, read once (the file is sized: a failure is the disk's,
 * after the trace was read, and leaves nothing to report but the reason). */
static void store_io(const next_use_store *st, bool write_it, uint64_t b) {
    char *p = (char *)st->buf;
    size_t bytes = st->region * sizeof *st->buf;
    off_t at = (off_t)(b * bytes);
    while (bytes) {
        ssize_t n = write_it ? pwrite(st->fd, p, bytes, at) : pread(st->fd, p, bytes, at);
        if (n <= 0) {
            fprintf(stderr, "moesim: the temporary next-use file in %s: %s\n", st->dir,
                    n < 0 ? strerror(errno) : "short read");
            abort();
        }
        p += n;
        bytes -= (size_t)n;
        at += n;
    }
}

/* Where block b's values are written (store_put then stores them) or read from (store_get). */
static uint32_t *store_slot(const next_use_store *st, uint64_t b) {
    return st->mem ? st->mem + b * st->region : st->buf;
}
static void store_put(const next_use_store *st, uint64_t b) {
    if (!st->mem) store_io(st, true, b);
}
static uint32_t *store_get(const next_use_store *st, uint64_t b) {
    if (!st->mem) store_io(st, false, b);
    return store_slot(st, b);
}

/* ---- active share by batch ----
 *
 * Requests with decode tokens, in request id order (= order of first appearance), are cut into
 * consecutive groups of B (a last partial group is dropped); iteration i of a group takes the
 * i-th decode token of each of its B requests, for i below the fewest decode tokens in the
 * group. Each (group, iteration, layer) where all B rows are recorded contributes
 * |union of their top-k| / E.
 *
 * Every batch size divides the largest (32), so a group of any size lies inside one *window* of
 * 32 consecutive requests (slots). A window's decode tokens are kept as expert bitmaps, one per
 * token and layer, stored request by request (CSR order), from its first decode token until its
 * last, then reduced and freed: memory follows the requests in flight, not the trace. A group
 * of B is two adjacent groups of B/2, so each batch size is built from the previous one in
 * place: OR the bitmaps of iteration i of the two halves (and AND their recorded flags) for i
 * below the shorter half. Work per layer and batch size is (decode tokens / B) * E / 64 words. */

#define WINDOW_SLOTS 32u
#define NO_SLOT      UINT32_MAX

typedef struct batch_window {
    uint64_t *bits;    /* [L][n_decode][words], or NULL before its first token */
    uint8_t *valid;    /* [L][n_decode] row recorded (after merging: all rows recorded), past the
                          bits in the same buffer */
    size_t bytes;      /* of that buffer (window_map) */
    uint64_t n_decode; /* decode tokens of its requests */
    uint64_t left;     /* decode tokens not seen yet */
} batch_window;

typedef struct batch_plan {
    uint32_t n_slots;     /* requests with decode tokens */
    uint32_t *slot_of;    /* [n_requests] slot of a request, NO_SLOT without decode tokens */
    uint64_t *start;      /* [n_slots + 1] CSR offsets of each slot's decode tokens */
    uint32_t *fill;       /* [n_slots] decode tokens of the slot seen so far */
    uint32_t words;       /* 64-bit words per expert bitmap */
    uint32_t n_windows;
    batch_window *win;    /* [n_windows] */
    uint32_t *done;       /* [n_windows] windows whose last token was in the current block */
    uint32_t n_done;
    uint64_t *sum, *cnt;  /* [L][STATS_N_BATCH] per layer */
    uint64_t sum_union[STATS_N_BATCH], n_union[STATS_N_BATCH]; /* all layers */
} batch_plan;

static void batch_plan_init(batch_plan *p, const trace_request_index *rq, uint32_t L,
                            uint32_t E) {
    const uint32_t R = rq->n_requests;
    memset(p, 0, sizeof *p);
    p->slot_of = moesim_xmalloc((R ? R : 1) * sizeof *p->slot_of);
    for (uint32_t r = 0; r < R; r++)
        p->slot_of[r] = rq->n_tokens[r] > rq->n_prefill[r] ? p->n_slots++ : NO_SLOT;
    p->start = moesim_xcalloc((size_t)p->n_slots + 1, sizeof *p->start);
    for (uint32_t r = 0; r < R; r++)
        if (p->slot_of[r] != NO_SLOT)
            p->start[p->slot_of[r] + 1] =
                p->start[p->slot_of[r]] + (rq->n_tokens[r] - rq->n_prefill[r]);
    p->fill = moesim_xcalloc(p->n_slots ? p->n_slots : 1, sizeof *p->fill);
    p->words = (E + 63) / 64;
    p->n_windows = (p->n_slots + WINDOW_SLOTS - 1) / WINDOW_SLOTS;
    p->win = moesim_xcalloc(p->n_windows ? p->n_windows : 1, sizeof *p->win);
    for (uint32_t g = 0; g < p->n_windows; g++) {
        uint32_t a = g * WINDOW_SLOTS, b = a + WINDOW_SLOTS < p->n_slots ? a + WINDOW_SLOTS
                                                                         : p->n_slots;
        p->win[g].n_decode = p->win[g].left = p->start[b] - p->start[a];
    }
    p->done = moesim_xcalloc(p->n_windows ? p->n_windows : 1, sizeof *p->done);
    p->sum = moesim_xcalloc((size_t)L * STATS_N_BATCH, sizeof *p->sum);
    p->cnt = moesim_xcalloc((size_t)L * STATS_N_BATCH, sizeof *p->cnt);
}

/* A window's buffer, zeroed, straight from the kernel and given back whole: through malloc,
 * freeing a window of tens of MB made glibc raise its mmap threshold and serve the next ones from
 * a heap that kept growing (trace stats of 3 x 10^5 Qwen3-30B-A3B tokens: 91 MB instead of 68). */
static void *window_map(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "moesim: out of memory (%zu bytes for the active share)\n", bytes);
        abort();
    }
    return p;
}

static void window_unmap(batch_window *w) {
    if (w->bits) munmap(w->bits, w->bytes);
    w->bits = NULL;
    w->valid = NULL;
}

static void batch_plan_free(batch_plan *p) {
    for (uint32_t g = 0; g < p->n_windows; g++) window_unmap(&p->win[g]);
    free(p->win);
    free(p->slot_of);
    free(p->start);
    free(p->fill);
    free(p->done);
    free(p->sum);
    free(p->cnt);
}

/* A token of request r (in trace order): its window and index there, or NO_SLOT for a prefill
 * token or a request without decode tokens. */
static uint32_t batch_plan_token(batch_plan *p, uint32_t r, uint8_t phase, uint32_t L,
                                 uint64_t *local) {
    uint32_t slot = p->slot_of[r];
    if (phase != TRACE_DECODE || slot == NO_SLOT) return NO_SLOT;
    uint32_t g = slot / WINDOW_SLOTS;
    batch_window *w = &p->win[g];
    if (!w->bits) {
        const size_t bits_bytes = w->n_decode * L * p->words * sizeof *w->bits;
        w->bytes = bits_bytes + w->n_decode * L;
        w->bits = window_map(w->bytes);
        w->valid = (uint8_t *)w->bits + bits_bytes;
    }
    *local = p->start[slot] + p->fill[slot]++ - p->start[g * WINDOW_SLOTS];
    if (--w->left == 0) p->done[p->n_done++] = g;
    return g;
}

/* Records the routing row (NULL: unrecorded) of a window's token at layer l. */
static inline void batch_plan_set_row(batch_plan *p, uint32_t g, uint64_t local, uint32_t l,
                                      const uint16_t *ids, uint32_t k) {
    batch_window *w = &p->win[g];
    uint64_t idx = (uint64_t)l * w->n_decode + local;
    uint64_t *b = w->bits + idx * p->words;
    w->valid[idx] = ids != NULL;
    if (ids)
        for (uint32_t j = 0; j < k; j++) b[ids[j] >> 6] |= (uint64_t)1 << (ids[j] & 63);
}

/* Every batch size for one layer of window g, once all its rows are set; consumes the bitmaps.
 * Built twice on x86-64, with and without the POPCNT instruction (without it each popcount is a
 * libgcc call), picked at run time by batch_window_layer: a call, not an IFUNC, which a
 * profile-instrumented build (MOESIM_PGO) cannot resolve at load time. */
static inline __attribute__((always_inline)) void batch_window_layer_body(batch_plan *p,
                                                                          uint32_t g, uint32_t l) {
    const uint32_t W = p->words, first = g * WINDOW_SLOTS;
    batch_window *w = &p->win[g];
    uint64_t *bits = w->bits + (uint64_t)l * w->n_decode * W;
    uint8_t *valid = w->valid + (uint64_t)l * w->n_decode;
    uint64_t group_start[WINDOW_SLOTS], group_len[WINDOW_SLOTS];
    uint32_t n_groups = p->n_slots - first < WINDOW_SLOTS ? p->n_slots - first : WINDOW_SLOTS;
    for (uint32_t i = 0; i < n_groups; i++) {
        group_start[i] = p->start[first + i] - p->start[first];
        group_len[i] = p->start[first + i + 1] - p->start[first + i];
    }
    for (uint32_t b = 0; b < STATS_N_BATCH; b++) {
        if (b > 0) { /* groups of B from pairs of groups of B/2 */
            MOESIM_ASSERT(trace_stats_batch_sizes[b] == 2 * trace_stats_batch_sizes[b - 1]);
            uint32_t merged = n_groups / 2;
            for (uint32_t i = 0; i < merged; i++) {
                uint64_t a = group_start[2 * i], c = group_start[2 * i + 1];
                uint64_t len = group_len[2 * i] < group_len[2 * i + 1] ? group_len[2 * i]
                                                                       : group_len[2 * i + 1];
                for (uint64_t j = 0; j < len; j++) {
                    uint64_t *dst = bits + (a + j) * W;
                    const uint64_t *src = bits + (c + j) * W;
                    for (uint32_t x = 0; x < W; x++) dst[x] |= src[x];
                    valid[a + j] &= valid[c + j];
                }
                group_start[i] = a;
                group_len[i] = len;
            }
            n_groups = merged;
        }
        uint64_t sum = 0, cnt = 0;
        for (uint32_t i = 0; i < n_groups; i++)
            for (uint64_t j = 0; j < group_len[i]; j++) {
                uint64_t idx = group_start[i] + j;
                if (!valid[idx]) continue;
                const uint64_t *x = bits + idx * W;
                for (uint32_t y = 0; y < W; y++) sum += (uint64_t)__builtin_popcountll(x[y]);
                cnt++;
            }
        p->sum[(size_t)l * STATS_N_BATCH + b] += sum;
        p->cnt[(size_t)l * STATS_N_BATCH + b] += cnt;
        p->sum_union[b] += sum;
        p->n_union[b] += cnt;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
static __attribute__((target("popcnt"))) void batch_window_layer_popcnt(batch_plan *p, uint32_t g,
                                                                         uint32_t l) {
    batch_window_layer_body(p, g, l);
}
#endif

static void batch_window_layer(batch_plan *p, uint32_t g, uint32_t l) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("popcnt")) {
        batch_window_layer_popcnt(p, g, l);
        return;
    }
#endif
    batch_window_layer_body(p, g, l);
}

/* The windows whose last decode token was in the block just done: reduced, then freed. */
static void batch_plan_block_done(batch_plan *p, uint32_t L) {
    for (uint32_t i = 0; i < p->n_done; i++) {
        uint32_t g = p->done[i];
        for (uint32_t l = 0; l < L; l++) batch_window_layer(p, g, l);
        window_unmap(&p->win[g]);
    }
    p->n_done = 0;
}

/* ---- the requests in flight: each one's last row per layer, for the reuse pairs ---- */

typedef struct open_requests {
    uint32_t *slot_of; /* [n_requests] row slot of a request in flight, NO_SLOT otherwise */
    uint32_t *seen;    /* [n_requests] tokens seen */
    uint16_t *ids;     /* [cap][L][k] its last token's rows (first id TRACE_NO_EXPERT: none) */
    uint16_t *top1;    /* [cap][L] their top-1 experts */
    uint32_t *free_slots, n_free, cap;
    uint32_t *closing, n_closing; /* requests whose last token was in the current block */
} open_requests;

static void open_requests_init(open_requests *o, uint32_t R) {
    memset(o, 0, sizeof *o);
    o->slot_of = moesim_xmalloc((R ? R : 1) * sizeof *o->slot_of);
    for (uint32_t r = 0; r < R; r++) o->slot_of[r] = NO_SLOT;
    o->seen = moesim_xcalloc(R ? R : 1, sizeof *o->seen);
    o->closing = moesim_xcalloc(R ? R : 1, sizeof *o->closing);
}

static void open_requests_free(open_requests *o) {
    free(o->slot_of);
    free(o->seen);
    free(o->ids);
    free(o->top1);
    free(o->free_slots);
    free(o->closing);
}

/* Request r's row slot (opened on its first token); *first: this is its first token. */
static uint32_t open_requests_token(open_requests *o, const trace_request_index *rq, uint32_t r,
                                    size_t row_values, uint32_t L, bool *first) {
    *first = o->seen[r] == 0;
    if (o->slot_of[r] == NO_SLOT) {
        if (!o->n_free) { /* grow: the slots double */
            uint32_t cap = o->cap ? 2 * o->cap : 4;
            o->ids = moesim_xrealloc(o->ids, cap * row_values * sizeof *o->ids);
            o->top1 = moesim_xrealloc(o->top1, (size_t)cap * L * sizeof *o->top1);
            o->free_slots = moesim_xrealloc(o->free_slots, cap * sizeof *o->free_slots);
            for (uint32_t i = cap; i-- > o->cap;) o->free_slots[o->n_free++] = i;
            o->cap = cap;
        }
        o->slot_of[r] = o->free_slots[--o->n_free];
    }
    if (++o->seen[r] == rq->n_tokens[r]) o->closing[o->n_closing++] = r;
    return o->slot_of[r];
}

/* After a block: the requests that ended in it give their slots back. */
static void open_requests_block_done(open_requests *o) {
    for (uint32_t i = 0; i < o->n_closing; i++) {
        uint32_t r = o->closing[i];
        o->free_slots[o->n_free++] = o->slot_of[r];
        o->slot_of[r] = NO_SLOT;
    }
    o->n_closing = 0;
}

/* ---- the pass: per block, per layer: gather, reuse, look-ahead, stack segments ---- */

typedef struct layer_acc {
    stack_state stacks;
    uint64_t *hist; /* [3][E + 1]: lru_slot, lru, opt depth histograms */
    uint64_t pairs, same_top1, any_shared;
    uint64_t *la; /* [4][D] look-ahead pairs, top-1 hits, found, wanted */
    uint64_t n_access;
} layer_acc;

typedef struct work {
    stats_source *src;
    uint32_t L, E, k, D, KP;
    uint16_t *seq;       /* [block_tokens * k] one layer's accesses of the block */
    uint32_t *tok_slot;  /* [block_tokens] row slot (open_requests) of each token of the block */
    uint8_t *tok_first;  /* [block_tokens] the token is its request's first */
    uint32_t *tok_win;   /* [block_tokens] batch window of a decode token, or NO_SLOT */
    uint64_t *tok_local; /* [block_tokens] its index in the window */
    marker set;          /* [n_experts] */
    stack_scratch scratch;
    layer_acc *acc; /* [L] */
    open_requests open;
    batch_plan batch;
    next_use_store next;
    uint64_t *layer_hash; /* [L] trace_stats.layer_hash, or NULL */
} work;

/* Backward: every layer's next uses, block by block from the last (reverse indices). */
static void next_use_backward(work *w) {
    stats_source *src = w->src;
    const uint32_t L = w->L, E = w->E, k = w->k;
    const size_t per_layer = src->block_tokens * k;
    uint32_t *last = moesim_xmalloc((size_t)L * E * sizeof *last);
    for (size_t i = 0; i < (size_t)L * E; i++) last[i] = NEVER;
    for (uint64_t b = src->n_blocks; b-- > 0;) {
        uint64_t n;
        const uint16_t *blk = source_experts(src, b, &n);
        const size_t stride = (size_t)L * k;
        uint32_t *out = store_slot(&w->next, b);
        for (uint32_t l = 0; l < L; l++) {
            uint32_t *region = out + l * per_layer, *lst = last + (size_t)l * E;
            const uint16_t *col = blk + (size_t)l * k;
            uint64_t rows = 0;
            for (uint64_t tok = 0; tok < n; tok++) rows += row_recorded(col + tok * stride);
            size_t j = rows * k;
            uint64_t rev = w->acc[l].n_access;
            for (uint64_t tok = n; tok-- > 0;) {
                const uint16_t *ids = col + tok * stride;
                if (!row_recorded(ids)) continue;
                for (uint32_t x = k; x-- > 0;) {
                    region[--j] = lst[ids[x]];
                    lst[ids[x]] = (uint32_t)rev++;
                }
            }
            MOESIM_ASSERT(rev < NEVER / 2); /* a layer holds fewer than 2^31 accesses */
            w->acc[l].n_access = rev;
        }
        store_put(&w->next, b);
    }
    free(last);
}

/* Layer l of a block: tokens [0, n) of blk, whose per-token bookkeeping is in w->tok_*. */
static void layer_block(work *w, const trace *blk, uint64_t n, uint32_t l, uint32_t *next_use,
                        uint64_t *count) {
    const uint32_t E = w->E, k = w->k, L = w->L, D = w->D;
    const uint32_t pred_k = w->KP < k ? w->KP : k; /* predictions scored for recall */
    layer_acc *a = &w->acc[l];
    uint64_t *la_pairs = a->la, *la_top1 = a->la + D, *la_found = a->la + 2 * D;
    uint64_t *la_wanted = a->la + 3 * D;
    const size_t row_values = (size_t)L * k;
    uint64_t *hash = w->layer_hash ? &w->layer_hash[l] : NULL;
    size_t m = 0;
    for (uint64_t tok = 0; tok < n; tok++) {
        const uint16_t *ids = trace_experts(blk, tok, l);
        if (hash) *hash = trace_layer_twins_hash_row(*hash, ids, trace_gates(blk, tok, l), k);
        if (tok + PREFETCH_TOKENS < n) { /* rows are L * k apart: help the hardware */
            const uint16_t *pid = trace_experts(blk, tok + PREFETCH_TOKENS, l);
            const float *pg = trace_gates(blk, tok + PREFETCH_TOKENS, l);
            __builtin_prefetch(pid);
            __builtin_prefetch(pid + k - 1); /* a row may straddle two cache lines */
            __builtin_prefetch(pg);
            __builtin_prefetch(pg + k - 1);
        }
        uint16_t *prev_ids = w->open.ids + w->tok_slot[tok] * row_values + (size_t)l * k;
        uint16_t *prev_top1 = w->open.top1 + (size_t)w->tok_slot[tok] * L + l;
        const bool had_prev = !w->tok_first[tok] && row_recorded(prev_ids);
        const bool recorded = row_recorded(ids);
        if (w->tok_win[tok] != NO_SLOT)
            batch_plan_set_row(&w->batch, w->tok_win[tok], w->tok_local[tok], l,
                               recorded ? ids : NULL, k);
        if (!recorded) {
            prev_ids[0] = TRACE_NO_EXPERT;
            continue;
        }
        const uint16_t top1 = row_top1(ids, trace_gates(blk, tok, l), k);
        for (uint32_t j = 0; j < k; j++) {
            uint16_t e = ids[j];
            MOESIM_ASSERT(e < E);
            w->seq[m++] = e;
            count[e]++;
        }
        if (had_prev) {
            a->pairs++;
            a->same_top1 += top1 == *prev_top1;
            marker_next(&w->set);
            for (uint32_t j = 0; j < k; j++) w->set.mark[prev_ids[j]] = w->set.stamp;
            bool shared = false;
            for (uint32_t j = 0; j < k && !shared; j++) shared = w->set.mark[ids[j]] == w->set.stamp;
            a->any_shared += shared;
        }
        memcpy(prev_ids, ids, k * sizeof *ids);
        *prev_top1 = top1;
        for (uint32_t d = 1; d <= D && l + d < L; d++) {
            const uint16_t *pred = blk->lookahead_ids + trace_lookahead_index(blk, tok, l, d);
            const uint16_t *actual = trace_experts(blk, tok, l + d);
            if (pred[0] == TRACE_NO_EXPERT || !row_recorded(actual)) continue;
            la_pairs[d - 1]++;
            la_top1[d - 1] += pred[0] == row_top1(actual, trace_gates(blk, tok, l + d), k);
            marker_next(&w->set);
            for (uint32_t j = 0; j < pred_k; j++)
                if (pred[j] < E) w->set.mark[pred[j]] = w->set.stamp;
            uint64_t found = 0;
            for (uint32_t j = 0; j < k; j++) found += w->set.mark[actual[j]] == w->set.stamp;
            la_found[d - 1] += found;
            la_wanted[d - 1] += k;
        }
    }
    for (size_t i = 0; i < m; i++) /* reverse indices to the layer's forward times */
        next_use[i] = next_use[i] == NEVER ? NEVER : (uint32_t)(a->n_access - 1 - next_use[i]);
    depth_hists h = {.lru_slot = a->hist, .lru = a->hist + (E + 1), .opt = a->hist + 2 * (E + 1)};
    route_list rows = {.fixed = k, .n = m / k}; /* a token's row runs together */
    route_histograms_segment(w->seq, m, next_use, &rows, E, &a->stacks, &w->scratch, &h);
}

/* Forward: per block, the tokens' bookkeeping, then every layer. */
static void forward_pass(work *w, trace_stats *s) {
    stats_source *src = w->src;
    const trace_request_index *rq = src->requests;
    const size_t per_layer = src->block_tokens * w->k, row_values = (size_t)w->L * w->k;
    for (uint64_t b = 0; b < src->n_blocks; b++) {
        uint64_t n;
        uint32_t *next = store_get(&w->next, b);
        const trace *blk = source_block(src, b, &n);
        for (uint64_t tok = 0; tok < n; tok++) {
            uint32_t r = blk->request_id[tok];
            MOESIM_ASSERT(r < src->tokens->n_requests);
            bool first;
            w->tok_slot[tok] = open_requests_token(&w->open, rq, r, row_values, w->L, &first);
            w->tok_first[tok] = first;
            w->tok_win[tok] = batch_plan_token(&w->batch, r, blk->phase[tok], w->L,
                                               &w->tok_local[tok]);
            if (blk->phase[tok] == TRACE_DECODE)
                s->decode_tokens++;
            else
                s->prefill_tokens++;
        }
        for (uint32_t l = 0; l < w->L; l++)
            layer_block(w, blk, n, l, next + l * per_layer, s->per_layer[l].expert_count);
        batch_plan_block_done(&w->batch, w->L);
        open_requests_block_done(&w->open);
    }
}

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

/* hits[c] / accesses at c = from..E, NaN below. */
static double *total_curve(const uint64_t *hits, uint32_t E, uint32_t from, uint64_t accesses,
                           arena *mem) {
    double *rate = arena_calloc(mem, (size_t)E + 1, sizeof *rate);
    for (uint32_t c = 0; c <= E; c++) rate[c] = c < from ? NAN : ratio(hits[c], accesses);
    return rate;
}

/* The figures from the counts of the pass. */
static void stats_finish(work *w, trace_stats *s) {
    const uint32_t E = w->E, k = w->k, L = w->L, D = w->D;
    arena *mem = &s->mem;
    uint64_t *sums = moesim_xcalloc(3 * ((size_t)E + 1) + 4 * (size_t)(D ? D : 1), sizeof *sums);
    uint64_t *lru_hits = sums, *opt_hits = sums + (E + 1), *lru_slot_hits = sums + 2 * (E + 1);
    uint64_t *la_sum = sums + 3 * (E + 1);
    uint64_t reuse_pairs = 0, reuse_top1 = 0, reuse_any = 0, dist_sum_all = 0, dist_n_all = 0;
    uint64_t *sorted = moesim_xcalloc(E, sizeof *sorted);
    double skew_sum[4] = {0};
    uint32_t skew_layers = 0;
    for (uint32_t l = 0; l < L; l++) {
        layer_stats *ls = &s->per_layer[l];
        layer_acc *a = &w->acc[l];
        const uint64_t n = a->n_access;
        ls->accesses = n;
        ls->tokens = n / k;
        ls->reuse_pairs = a->pairs;
        ls->reuse_top1 = ratio(a->same_top1, a->pairs);
        ls->reuse_any = ratio(a->any_shared, a->pairs);
        reuse_pairs += a->pairs;
        reuse_top1 += a->same_top1;
        reuse_any += a->any_shared;
        const uint64_t *lru_slot = a->hist, *lru = a->hist + (E + 1), *opt = a->hist + 2 * (E + 1);
        ls->cold_misses = lru_slot[0];
        MOESIM_ASSERT(lru[0] == ls->cold_misses && opt[0] == ls->cold_misses);
        uint64_t dist_sum = 0, dist_n = 0;
        for (uint32_t d = 1; d <= E; d++) {
            dist_sum += (uint64_t)d * lru_slot[d];
            dist_n += lru_slot[d];
        }
        ls->mean_reuse_distance = ratio(dist_sum, dist_n);
        dist_sum_all += dist_sum;
        dist_n_all += dist_n;
        ls->lru_hit_rate = layer_curve(lru, E, k, n, lru_hits, mem);
        ls->opt_hit_rate = layer_curve(opt, E, k, n, opt_hits, mem);
        ls->lru_slot_hit_rate = layer_curve(lru_slot, E, 1, n, lru_slot_hits, mem);
        if (D) {
            ls->lookahead_top1 = arena_calloc(mem, D, sizeof(double));
            ls->lookahead_recall = arena_calloc(mem, D, sizeof(double));
            for (uint32_t d = 0; d < D; d++) {
                ls->lookahead_top1[d] = ratio(a->la[D + d], a->la[d]);
                ls->lookahead_recall[d] = ratio(a->la[2 * D + d], a->la[3 * D + d]);
                for (uint32_t x = 0; x < 4; x++) la_sum[x * D + d] += a->la[x * D + d];
            }
        }
        for (uint32_t b = 0; b < STATS_N_BATCH; b++)
            ls->active_share[b] =
                w->batch.n_slots < trace_stats_batch_sizes[b]
                    ? NAN
                    : ratio(w->batch.sum[l * STATS_N_BATCH + b],
                            w->batch.cnt[l * STATS_N_BATCH + b] * E);
        s->accesses += n;
        layer_skew(ls, E, sorted);
        if (n) {
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
    s->reuse_top1 = ratio(reuse_top1, reuse_pairs);
    s->reuse_any = ratio(reuse_any, reuse_pairs);
    s->mean_reuse_distance = ratio(dist_sum_all, dist_n_all);
    s->lru_hit_rate = total_curve(lru_hits, E, k, s->accesses, mem);
    s->opt_hit_rate = total_curve(opt_hits, E, k, s->accesses, mem);
    s->lru_slot_hit_rate = total_curve(lru_slot_hits, E, 1, s->accesses, mem);
    if (D) {
        s->lookahead_top1 = arena_calloc(mem, D, sizeof(double));
        s->lookahead_recall = arena_calloc(mem, D, sizeof(double));
        for (uint32_t d = 0; d < D; d++) {
            s->lookahead_top1[d] = ratio(la_sum[D + d], la_sum[d]);
            s->lookahead_recall[d] = ratio(la_sum[2 * D + d], la_sum[3 * D + d]);
        }
    }
    s->decode_requests = w->batch.n_slots;
    for (uint32_t b = 0; b < STATS_N_BATCH; b++)
        s->active_share[b] = w->batch.n_slots < trace_stats_batch_sizes[b]
                                 ? NAN
                                 : ratio(w->batch.sum_union[b], w->batch.n_union[b] * E);
    free(sorted);
    free(sums);
}

/* ---- the whole trace ---- */

static moesim_status stats_run(stats_source *src, bool fallback, trace_stats **out,
                               moesim_error *err) {
    const trace *t = src->tokens;
    const uint32_t E = t->meta.n_experts, k = t->meta.top_k, L = t->meta.n_layers;
    MOESIM_ASSERT(E >= 1 && E <= MODEL_MAX_EXPERTS && k >= 1 && k <= E && L >= 1);
    const uint32_t D = t->meta.lookahead_depth;
    MOESIM_ASSERT(D <= TRACE_MAX_LOOKAHEAD_DEPTH && (D == 0 || t->meta.lookahead_k >= 1));
    const uint64_t BT = src->block_tokens;
    src->n_blocks = (t->n_tokens + BT - 1) / BT;

    work w = {.src = src, .L = L, .E = E, .k = k, .D = D, .KP = t->meta.lookahead_k};
    *out = NULL;
    moesim_status st = store_init(&w.next, src->n_blocks, BT * L * k, fallback, err);
    if (st) return st;
    trace_stats *s = moesim_xcalloc(1, sizeof *s);
    arena_init(&s->mem, 0);
    s->tokens = t->n_tokens;
    s->requests = t->n_requests;
    s->layers = L;
    s->experts = E;
    s->top_k = k;
    s->lookahead_depth = D;
    s->lookahead_k = D ? t->meta.lookahead_k : 0;
    s->per_layer = arena_calloc(&s->mem, L, sizeof *s->per_layer);
    for (uint32_t l = 0; l < L; l++)
        s->per_layer[l].expert_count = arena_calloc(&s->mem, E, sizeof(uint64_t));
    if (src->ts) {
        src->ids = moesim_xmalloc(BT * L * k * sizeof *src->ids);
        s->layer_hash = w.layer_hash = arena_calloc(&s->mem, L, sizeof *s->layer_hash);
        for (uint32_t l = 0; l < L; l++) s->layer_hash[l] = TRACE_LAYER_TWINS_HASH0;
    }

    w.seq = moesim_xmalloc(BT * k * sizeof *w.seq);
    w.tok_slot = moesim_xmalloc(BT * sizeof *w.tok_slot);
    w.tok_first = moesim_xmalloc(BT * sizeof *w.tok_first);
    w.tok_win = moesim_xmalloc(BT * sizeof *w.tok_win);
    w.tok_local = moesim_xmalloc(BT * sizeof *w.tok_local);
    marker_init(&w.set, E);
    stack_scratch_init(&w.scratch, E, 0);
    w.acc = moesim_xcalloc(L, sizeof *w.acc);
    for (uint32_t l = 0; l < L; l++) {
        stack_state_init(&w.acc[l].stacks, E);
        w.acc[l].hist = moesim_xcalloc(3 * ((size_t)E + 1), sizeof *w.acc[l].hist);
        w.acc[l].la = moesim_xcalloc(4 * (size_t)(D ? D : 1), sizeof *w.acc[l].la);
    }
    open_requests_init(&w.open, t->n_requests);
    batch_plan_init(&w.batch, src->requests, L, E);

    next_use_backward(&w);
    forward_pass(&w, s);
    stats_finish(&w, s);

    batch_plan_free(&w.batch);
    open_requests_free(&w.open);
    for (uint32_t l = 0; l < L; l++) {
        stack_state_free(&w.acc[l].stacks);
        free(w.acc[l].hist);
        free(w.acc[l].la);
    }
    free(w.acc);
    stack_scratch_free(&w.scratch);
    marker_free(&w.set);
    free(w.seq);
    free(w.tok_slot);
    free(w.tok_first);
    free(w.tok_win);
    free(w.tok_local);
    store_free(&w.next);
    free(src->ids);
    *out = s;
    return MOESIM_OK;
}

trace_stats *trace_stats_compute(const trace *t) {
    trace_request_index rq;
    trace_request_index_build(&rq, t);
    stats_source src = {.whole = t, .tokens = t, .requests = &rq,
                        .block_tokens = MEMORY_BLOCK_TOKENS};
    trace tokens = *t; /* the figures read the predictions only where they are */
    if (!t->lookahead_ids) tokens.meta.lookahead_depth = tokens.meta.lookahead_k = 0;
    src.tokens = &tokens;
    trace_stats *s = NULL;
    moesim_status st = stats_run(&src, true, &s, NULL);
    MOESIM_ASSERT(st == MOESIM_OK); /* in memory when no file can be made */
    trace_request_index_free(&rq);
    return s;
}

moesim_status trace_stats_compute_stream(trace_stream *ts, trace_stats **out, moesim_error *err) {
    trace tokens = *trace_stream_tokens(ts);
    tokens.meta = *trace_stream_rows_meta(ts);
    stats_source src = {.ts = ts, .tokens = &tokens, .requests = trace_stream_requests(ts),
                        .block_tokens = trace_stream_block_tokens(ts)};
    return stats_run(&src, false, out, err);
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
