/* Router traces in memory: allocation, the invariant check every reader and writer runs,
 * model geometry -> trace_meta, and the recorded predictor's first hits. The HDF5 form lives
 * in trace_write.c and trace_read.c (traces/FORMAT.md).
 *
 * trace_check is on the path of every read, so it is written for speed: each array is first
 * scanned with branch-free reductions (and one bitmap per routing row for duplicate ids); only
 * when a scan finds something wrong does a second, plain pass locate the first bad value and
 * describe it. Messages name the dataset of the file form ("/routing/expert_ids[12][3][1]") so
 * that an in-memory trace and its file report problems identically. */
#include "traces/trace.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/alloc.h"
#include "common/check.h"
#include "common/paths.h"
#include "common/ranked.h"

/* ---- sizes ------------------------------------------------------------------------------- */

size_t trace_route_values(const trace_meta *m) { return (size_t)m->n_layers * m->top_k; }

size_t trace_lookahead_values(const trace_meta *m) {
    return (size_t)m->n_layers * m->lookahead_depth * m->lookahead_k;
}

uint64_t trace_bytes_per_token(const trace_meta *m) {
    uint64_t b = sizeof(uint32_t) * 2 + sizeof(uint8_t);
    if (m->has_token_ids) b += sizeof(int32_t);
    b += (uint64_t)trace_route_values(m) * (sizeof(uint16_t) + sizeof(float));
    if (m->has_importance) b += (uint64_t)m->n_layers * sizeof(float);
    b += (uint64_t)trace_lookahead_values(m) * (sizeof(uint16_t) + sizeof(float));
    return b;
}

const char *trace_gate_norm_name(gate_normalization g) {
    return g == GATE_SOFTMAX_ALL ? "all" : "topk";
}

const char *trace_phase_name(uint8_t phase) {
    return phase == TRACE_PREFILL ? "prefill" : phase == TRACE_DECODE ? "decode" : "?";
}

/* ---- meta -------------------------------------------------------------------------------- */

static bool str_terminated(const char *s, size_t cap) { return memchr(s, '\0', cap) != NULL; }

moesim_status trace_meta_check(const trace_meta *m, const char *what, moesim_error *err) {
    if (!str_terminated(m->model, sizeof m->model) || !m->model[0])
        return moesim_fail(err, MOESIM_EINPUT, "%s: model: expected a name of 1..%zu characters",
                           what, sizeof m->model - 1);
    size_t bad = moesim_config_name_fault(m->model); /* looked up by name, never as a path */
    if (bad)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: model: character %zu cannot be in a config name (expected "
                           "printable ASCII without spaces or '/')",
                           what, bad);
    if (!str_terminated(m->source, sizeof m->source))
        return moesim_fail(err, MOESIM_EINPUT, "%s: source: longer than %zu characters", what,
                           sizeof m->source - 1);
    if (!str_terminated(m->tool_version, sizeof m->tool_version))
        return moesim_fail(err, MOESIM_EINPUT, "%s: tool_version: longer than %zu characters", what,
                           sizeof m->tool_version - 1);
    if (m->n_layers < 1 || m->n_layers > MODEL_MAX_LAYERS)
        return moesim_fail(err, MOESIM_EINPUT, "%s: n_layers: expected 1..%d, got %" PRIu32, what,
                           MODEL_MAX_LAYERS, m->n_layers);
    if (m->n_experts < 1 || m->n_experts > MODEL_MAX_EXPERTS)
        return moesim_fail(err, MOESIM_EINPUT, "%s: n_experts: expected 1..%d, got %" PRIu32, what,
                           MODEL_MAX_EXPERTS, m->n_experts);
    if (m->n_shared_experts > MODEL_MAX_SHARED_EXPERTS)
        return moesim_fail(err, MOESIM_EINPUT, "%s: n_shared_experts: expected 0..%d, got %" PRIu32,
                           what, MODEL_MAX_SHARED_EXPERTS, m->n_shared_experts);
    uint32_t max_k = m->n_experts < TRACE_MAX_TOP_K ? m->n_experts : TRACE_MAX_TOP_K;
    if (m->top_k < 1 || m->top_k > max_k)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: top_k: expected 1..%" PRIu32 " (n_experts %" PRIu32
                           ", at most %d), got %" PRIu32,
                           what, max_k, m->n_experts, TRACE_MAX_TOP_K, m->top_k);
    if (m->gate_norm != GATE_SOFTMAX_TOPK && m->gate_norm != GATE_SOFTMAX_ALL)
        return moesim_fail(err, MOESIM_EINPUT, "%s: gate_normalization: expected topk or all",
                           what);
    if (m->lookahead_depth > TRACE_MAX_LOOKAHEAD_DEPTH)
        return moesim_fail(err, MOESIM_EINPUT, "%s: lookahead_depth: expected 0..%d, got %" PRIu32,
                           what, TRACE_MAX_LOOKAHEAD_DEPTH, m->lookahead_depth);
    if (m->lookahead_depth == 0 && m->lookahead_k != 0)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: lookahead_k: expected 0 when lookahead_depth is 0, got %" PRIu32,
                           what, m->lookahead_k);
    uint32_t max_kp = m->n_experts < TRACE_MAX_LOOKAHEAD_K ? m->n_experts : TRACE_MAX_LOOKAHEAD_K;
    if (m->lookahead_depth > 0 && (m->lookahead_k < 1 || m->lookahead_k > max_kp))
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: lookahead_k: expected 1..%" PRIu32 " (n_experts %" PRIu32
                           ", at most %d), got %" PRIu32,
                           what, max_kp, m->n_experts, TRACE_MAX_LOOKAHEAD_K, m->lookahead_k);
    for (uint32_t l = 0; l < m->n_layers; l++) {
        if (m->model_layer[l] >= MODEL_MAX_LAYERS)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /layers/model_layer[%" PRIu32 "]: layer %" PRIu32
                               " >= %d (the most a model may have)",
                               what, l, m->model_layer[l], MODEL_MAX_LAYERS);
        if (l > 0 && m->model_layer[l] <= m->model_layer[l - 1])
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /layers/model_layer[%" PRIu32 "]: layer %" PRIu32
                               " does not follow layer %" PRIu32 " (expected increasing)",
                               what, l, m->model_layer[l], m->model_layer[l - 1]);
    }
    return MOESIM_OK;
}

void trace_meta_from_model(trace_meta *meta, const model_geometry *m) {
    snprintf(meta->model, sizeof meta->model, "%s", m->name);
    meta->n_layers = m->n_moe_layers;
    meta->n_experts = m->n_experts;
    meta->top_k = m->top_k;
    meta->n_shared_experts = m->n_shared_experts;
    meta->gate_norm = m->gate_norm;
    memset(meta->model_layer, 0, sizeof meta->model_layer);
    uint32_t j = 0;
    for (uint32_t l = 0; l < m->n_layers && l < MODEL_MAX_LAYERS; l++)
        if (m->is_moe_layer[l]) {
            MOESIM_ASSERT(j < MODEL_MAX_LAYERS);
            meta->model_layer[j++] = l;
        }
    MOESIM_ASSERT(j == m->n_moe_layers);
}

/* ---- allocation -------------------------------------------------------------------------- */

/* calloc of count * size that reports (rather than aborts) when it cannot be satisfied. */
static void *try_calloc(uint64_t count, size_t size, bool *failed) {
    if (*failed || count == 0) return NULL;
    if (count > SIZE_MAX / size) {
        *failed = true;
        return NULL;
    }
    void *p = calloc((size_t)count, size);
    if (!p) *failed = true;
    return p;
}

trace *trace_try_create(const trace_meta *meta, uint64_t n_tokens) {
    MOESIM_ASSERT(trace_meta_check(meta, "trace_create", NULL) == MOESIM_OK);
    trace *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->meta = *meta;
    t->n_tokens = n_tokens;
    bool failed = n_tokens > SIZE_MAX / trace_bytes_per_token(meta);
    uint64_t route = n_tokens * trace_route_values(meta);
    uint64_t look = n_tokens * trace_lookahead_values(meta);
    t->request_id = try_calloc(n_tokens, sizeof *t->request_id, &failed);
    t->position = try_calloc(n_tokens, sizeof *t->position, &failed);
    t->phase = try_calloc(n_tokens, sizeof *t->phase, &failed);
    if (meta->has_token_ids) t->token_id = try_calloc(n_tokens, sizeof *t->token_id, &failed);
    t->expert_ids = try_calloc(route, sizeof *t->expert_ids, &failed);
    t->gate_weights = try_calloc(route, sizeof *t->gate_weights, &failed);
    if (meta->has_importance)
        t->importance = try_calloc(n_tokens * meta->n_layers, sizeof *t->importance, &failed);
    if (meta->lookahead_depth) {
        t->lookahead_ids = try_calloc(look, sizeof *t->lookahead_ids, &failed);
        t->lookahead_scores = try_calloc(look, sizeof *t->lookahead_scores, &failed);
    }
    if (failed) {
        trace_destroy(t);
        return NULL;
    }
    return t;
}

trace *trace_create(const trace_meta *meta, uint64_t n_tokens) {
    trace *t = trace_try_create(meta, n_tokens);
    if (!t) {
        fprintf(stderr, "moesim: out of memory allocating a trace of %" PRIu64 " tokens\n",
                n_tokens);
        abort();
    }
    return t;
}

void trace_destroy(trace *t) {
    if (!t) return;
    free(t->request_id);
    free(t->position);
    free(t->phase);
    free(t->token_id);
    free(t->expert_ids);
    free(t->gate_weights);
    free(t->importance);
    free(t->lookahead_ids);
    free(t->lookahead_scores);
    free(t->params_json);
    free(t);
}

void trace_copy_tokens(trace *dst, uint64_t at, const trace *src) {
    const trace_meta *m = &src->meta;
    const uint64_t n = src->n_tokens;
    MOESIM_ASSERT(at + n <= dst->n_tokens && dst->meta.n_layers == m->n_layers &&
                  dst->meta.top_k == m->top_k && dst->meta.lookahead_depth == m->lookahead_depth &&
                  dst->meta.lookahead_k == m->lookahead_k && !dst->importance == !src->importance &&
                  !dst->token_id == !src->token_id);
    const size_t route = trace_route_values(m), look = trace_lookahead_values(m);
    memcpy(dst->request_id + at, src->request_id, n * sizeof *src->request_id);
    memcpy(dst->position + at, src->position, n * sizeof *src->position);
    memcpy(dst->phase + at, src->phase, n * sizeof *src->phase);
    if (src->token_id) memcpy(dst->token_id + at, src->token_id, n * sizeof *src->token_id);
    memcpy(dst->expert_ids + at * route, src->expert_ids, n * route * sizeof *src->expert_ids);
    memcpy(dst->gate_weights + at * route, src->gate_weights,
           n * route * sizeof *src->gate_weights);
    if (src->importance)
        memcpy(dst->importance + at * m->n_layers, src->importance,
               n * m->n_layers * sizeof *src->importance);
    if (look) {
        memcpy(dst->lookahead_ids + at * look, src->lookahead_ids,
               n * look * sizeof *src->lookahead_ids);
        memcpy(dst->lookahead_scores + at * look, src->lookahead_scores,
               n * look * sizeof *src->lookahead_scores);
    }
}

moesim_status trace_request_ids_scan(const uint32_t *ids, uint64_t n, uint64_t first,
                                     uint64_t n_tokens, uint32_t *max_id, const char *what,
                                     moesim_error *err) {
    for (uint64_t i = 0; i < n; i++) {
        if (ids[i] >= n_tokens) /* dense ids stay below the token count */
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /tokens/request_id[%" PRIu64 "]: request id %" PRIu32
                               " >= %" PRIu64 " (the token count; requests are numbered 0, 1, "
                               "2, ... by first appearance)",
                               what, first + i, ids[i], n_tokens);
        if (ids[i] > *max_id) *max_id = ids[i];
    }
    return MOESIM_OK;
}

moesim_status trace_finish(trace *t, const char *what, moesim_error *err) {
    uint32_t max_id = 0;
    moesim_status st =
        trace_request_ids_scan(t->request_id, t->n_tokens, 0, t->n_tokens, &max_id, what, err);
    if (st) return st;
    t->n_requests = t->n_tokens ? (max_id < UINT32_MAX ? max_id + 1 : UINT32_MAX) : 0;
    return trace_check(t, what, err);
}

/* ---- trace_check: tokens -----------------------------------------------------------------
 *
 * The token invariants span blocks (a request's positions continue from one block into the
 * next), so they live in a trace_checker that a writer feeds block by block; trace_check is one
 * block holding the whole trace. */

void trace_checker_init(trace_checker *c, const trace_meta *meta, uint32_t n_requests,
                        const char *what) {
    *c = (trace_checker){.meta = meta, .what = what, .n_requests = n_requests};
    c->last = moesim_xcalloc(n_requests ? n_requests : 1, sizeof *c->last);
}

void trace_checker_free(trace_checker *c) {
    free(c->last);
    c->last = NULL;
}

static moesim_status check_tokens(trace_checker *c, const trace *t, moesim_error *err) {
    const char *what = c->what;
    const uint64_t first = c->n_checked;
    for (uint64_t j = 0; j < t->n_tokens; j++) {
        const uint64_t i = first + j; /* the token's index in the whole trace */
        uint32_t r = t->request_id[j];
        uint8_t ph = t->phase[j];
        if (r > c->next_new)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /tokens/request_id[%" PRIu64 "]: request id %" PRIu32
                               " is not dense: expected at most %" PRIu32
                               " (requests are numbered 0, 1, 2, ... by first appearance)",
                               what, i, r, c->next_new);
        if (r >= c->n_requests)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /tokens/request_id[%" PRIu64 "]: request id %" PRIu32
                               " >= n_requests %" PRIu32,
                               what, i, r, c->n_requests);
        if (r == c->next_new) c->next_new++;
        if (ph > TRACE_DECODE)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /tokens/phase[%" PRIu64 "]: phase %u is neither 0 (prefill) "
                               "nor 1 (decode)",
                               what, i, (unsigned)ph);
        uint64_t prev = c->last[r] >> 1; /* previous position + 1 */
        bool decoded = c->last[r] & 1;
        if (prev && (uint64_t)t->position[j] + 1 <= prev)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /tokens/position[%" PRIu64 "]: position %" PRIu32
                               " of request %" PRIu32 " does not increase (previous %" PRIu64 ")",
                               what, i, t->position[j], r, prev - 1);
        if (decoded && ph == TRACE_PREFILL)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /tokens/phase[%" PRIu64 "]: prefill token after a decode "
                               "token in request %" PRIu32,
                               what, i, r);
        c->last[r] = (((uint64_t)t->position[j] + 1) << 1) | (decoded || ph == TRACE_DECODE);
    }
    if (t->token_id) {
        int32_t min_id = 0;
        for (uint64_t j = 0; j < t->n_tokens; j++)
            min_id = t->token_id[j] < min_id ? t->token_id[j] : min_id;
        if (min_id < 0)
            for (uint64_t j = 0; j < t->n_tokens; j++)
                if (t->token_id[j] < 0)
                    return moesim_fail(err, MOESIM_EINPUT,
                                       "%s: /tokens/token_id[%" PRIu64 "]: token id %" PRId32
                                       " is negative",
                                       what, first + j, t->token_id[j]);
    }
    return MOESIM_OK;
}

/* ---- trace_check: flat scans -------------------------------------------------------------
 *
 * The fast passes' reductions over whole arrays: SSE2 (x86-64's baseline) 16 bytes a step, a
 * scalar loop for the tail and other architectures. They only decide "all valid"; naming the
 * first bad value is the plain second pass's. */

/* Floats as bits: finite is (bits & FLOAT_ABS_BITS) <= FLOAT_MAX_BITS (inf and NaN lie above);
 * a non-negative float orders as its bits, so [+0, 1] is bits <= FLOAT_ONE_BITS. */
#define FLOAT_ALL_BITS 0xFFFFFFFFu
#define FLOAT_ABS_BITS 0x7FFFFFFFu /* all but the sign */
#define FLOAT_MAX_BITS 0x7F7FFFFFu /* FLT_MAX */
#define FLOAT_ONE_BITS 0x3F800000u /* 1.0f */

#if defined(__SSE2__)
static __m128i load16(const void *p) { return _mm_loadu_si128((const __m128i *)p); }
#endif

/* True when every one of the n values is <= limit. */
static bool u16_all_at_most(const uint16_t *v, size_t n, uint16_t limit) {
    size_t i = 0;
    bool over = false;
#if defined(__SSE2__)
    const __m128i lim = _mm_set1_epi16((short)limit);
    __m128i excess = _mm_setzero_si128(); /* v - limit, saturated at 0: nonzero when over */
    for (; i + 16 <= n; i += 16) {
        excess = _mm_or_si128(excess, _mm_subs_epu16(load16(v + i), lim));
        excess = _mm_or_si128(excess, _mm_subs_epu16(load16(v + i + 8), lim));
    }
    over = _mm_movemask_epi8(_mm_cmpeq_epi8(excess, _mm_setzero_si128())) != 0xFFFF;
#endif
    for (; i < n; i++) over |= v[i] > limit;
    return !over;
}

static bool u16_all_equal(const uint16_t *v, size_t n, uint16_t value) {
    bool ok = true;
    for (size_t i = 0; i < n; i++) ok &= v[i] == value;
    return ok;
}

/* True when the bits of every one of the n 32-bit values v (floats read as bits), masked, are
 * <= limit as unsigned integers. */
static bool bits32_all_at_most(const void *v, size_t n, uint32_t mask, uint32_t limit) {
    const unsigned char *p = v;
    size_t i = 0;
    bool over = false;
#if defined(__SSE2__)
    /* SSE2 compares signed: the sign bit flipped on both sides orders them as unsigned */
    const __m128i m = _mm_set1_epi32((int)mask), flip = _mm_set1_epi32(INT32_MIN);
    const __m128i lim = _mm_set1_epi32((int)(limit ^ 0x80000000u));
    __m128i gt = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        __m128i x0 = _mm_xor_si128(_mm_and_si128(load16(p + 4 * i), m), flip);
        __m128i x1 = _mm_xor_si128(_mm_and_si128(load16(p + 4 * i + 16), m), flip);
        gt = _mm_or_si128(gt, _mm_or_si128(_mm_cmpgt_epi32(x0, lim), _mm_cmpgt_epi32(x1, lim)));
    }
    over = _mm_movemask_epi8(gt) != 0;
#endif
    for (; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, p + 4 * i, sizeof bits);
        over |= (bits & mask) > limit;
    }
    return !over;
}

/* ---- trace_check: routing ---------------------------------------------------------------- */

/* Describes the first bad value of routing row `row` (token i, layer l); `row` is known bad. */
/* `i` indexes the block `t`; messages name token first + i of the whole trace. */
static moesim_status describe_route_row(const trace *t, uint64_t first, uint64_t i, uint32_t l,
                                        const char *what, moesim_error *err) {
    const trace_meta *m = &t->meta;
    const uint16_t *ids = trace_experts(t, i, l);
    const float *g = trace_gates(t, i, l);
    uint32_t k = m->top_k;
    uint32_t none = 0, first_none = 0, first_id = 0;
    for (uint32_t j = k; j-- > 0;) {
        if (ids[j] == TRACE_NO_EXPERT) {
            none++;
            first_none = j;
        } else {
            first_id = j;
        }
    }
    if (none == k) {
        for (uint32_t j = 0; j < k; j++)
            if (g[j] != 0.0f)
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s: /routing/gate_weights[%" PRIu64 "][%" PRIu32 "][%" PRIu32
                                   "]: gate weight %g on an unrecorded row (all expert ids %u) "
                                   "must be 0",
                                   what, first + i, l, j, (double)g[j], (unsigned)TRACE_NO_EXPERT);
        MOESIM_UNREACHABLE();
    }
    if (none > 0)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: /routing/expert_ids[%" PRIu64 "][%" PRIu32 "]: row partly "
                           "unrecorded: slot %" PRIu32 " is %u (no expert) but slot %" PRIu32
                           " is expert %u (a row is all %u or all expert ids)",
                           what, first + i, l, first_none, (unsigned)TRACE_NO_EXPERT, first_id,
                           (unsigned)ids[first_id], (unsigned)TRACE_NO_EXPERT);
    for (uint32_t j = 0; j < k; j++)
        if (ids[j] >= m->n_experts)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /routing/expert_ids[%" PRIu64 "][%" PRIu32 "][%" PRIu32
                               "]: expert id %u >= %" PRIu32 " experts",
                               what, first + i, l, j, (unsigned)ids[j], m->n_experts);
    for (uint32_t j = 1; j < k; j++)
        for (uint32_t a = 0; a < j; a++)
            if (ids[a] == ids[j])
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s: /routing/expert_ids[%" PRIu64 "][%" PRIu32 "][%" PRIu32
                                   "]: expert %u appears twice in one top-k (also at [%" PRIu32
                                   "])",
                                   what, first + i, l, j, (unsigned)ids[j], a);
    for (uint32_t j = 0; j < k; j++) {
        if (!isfinite(g[j]))
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /routing/gate_weights[%" PRIu64 "][%" PRIu32 "][%" PRIu32
                               "]: gate weight %g is not finite",
                               what, first + i, l, j, (double)g[j]);
        if (!(g[j] >= 0.0f && g[j] <= 1.0f))
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /routing/gate_weights[%" PRIu64 "][%" PRIu32 "][%" PRIu32
                               "]: gate weight %g outside [0, 1]",
                               what, first + i, l, j, (double)g[j]);
    }
    MOESIM_UNREACHABLE();
}

/* True when a routing row is valid: all ids < E and distinct, gates in [0, 1]; or all ids
 * TRACE_NO_EXPERT with zero gates. `seen` is a cleared bitmap over experts; left cleared. */
static inline bool route_row_ok(const uint16_t *ids, const float *g, uint32_t k, uint32_t n_exp,
                                uint64_t *seen) {
    bool ok = true;
    uint32_t j = 0;
    for (; j < k; j++) {
        uint32_t e = ids[j];
        if (e >= n_exp) break;
        uint64_t bit = 1ull << (e & 63);
        ok &= !(seen[e >> 6] & bit);
        seen[e >> 6] |= bit;
    }
    for (uint32_t a = 0; a < j; a++) seen[ids[a] >> 6] = 0;
    if (j < k) { /* only an all-unrecorded row with zero gates can hold an id >= E */
        if (j > 0) return false;
        for (uint32_t a = 0; a < k; a++) ok &= (ids[a] == TRACE_NO_EXPERT) & (g[a] == 0.0f);
        return ok;
    }
    for (uint32_t a = 0; a < k; a++) ok &= (g[a] >= 0.0f) & (g[a] <= 1.0f); /* NaN fails */
    return ok;
}

/* True when every one of `rows` routing rows is a recorded valid one: ids < E and distinct
 * within the row, gates in [0, 1]. The common case in a few instructions a value (flat passes,
 * distinctness by a stamp per expert, nothing to clear); false sends the rows through
 * route_row_ok, which also accepts unrecorded rows and finds the first bad one. */
static bool routes_all_recorded_ok(const uint16_t *ids, const float *g, uint64_t rows, uint32_t k,
                                   uint32_t n_exp) {
    const uint64_t n = rows * k;
    /* gates in [0, 1]: non-negative floats order as their bits (-0 and NaN: the exact check) */
    if (!u16_all_at_most(ids, n, (uint16_t)(n_exp - 1)) ||
        !bits32_all_at_most(g, n, FLOAT_ALL_BITS, FLOAT_ONE_BITS))
        return false;
    bool ok = true;
    uint64_t stamp[MODEL_MAX_EXPERTS] = {0}; /* the last row (+ 1) each expert appeared in */
    for (uint64_t r = 0; r < rows; r++)
        for (uint32_t j = 0; j < k; j++) {
            uint16_t e = ids[r * k + j];
            ok &= stamp[e] != r + 1;
            stamp[e] = r + 1;
        }
    return ok;
}

static moesim_status check_routing(const trace *t, uint64_t first, const char *what,
                                   moesim_error *err) {
    const trace_meta *m = &t->meta;
    uint64_t seen[MODEL_MAX_EXPERTS / 64 + 1] = {0};
    const uint32_t k = m->top_k, L = m->n_layers, E = m->n_experts;
    const uint64_t rows = t->n_tokens * L;
    if (routes_all_recorded_ok(t->expert_ids, t->gate_weights, rows, k, E)) return MOESIM_OK;
    for (uint64_t r = 0; r < rows; r++) {
        if (!route_row_ok(t->expert_ids + r * k, t->gate_weights + r * k, k, E, seen))
            return describe_route_row(t, first, r / L, (uint32_t)(r % L), what, err);
    }
    return MOESIM_OK;
}

static moesim_status check_importance(const trace *t, uint64_t first, const char *what,
                                      moesim_error *err) {
    if (!t->importance) return MOESIM_OK;
    const uint64_t n = t->n_tokens * t->meta.n_layers;
    bool ok = true;
    for (uint64_t i = 0; i < n; i++)
        ok &= (t->importance[i] >= 0.0f) & (t->importance[i] <= FLT_MAX);
    if (ok) return MOESIM_OK;
    for (uint64_t i = 0; i < n; i++) {
        float v = t->importance[i];
        if (!(v >= 0.0f && v <= FLT_MAX))
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /routing/importance[%" PRIu64 "][%" PRIu64
                               "]: importance %g is %s",
                               what, first + i / t->meta.n_layers, i % t->meta.n_layers, (double)v,
                               isfinite(v) ? "negative" : "not finite");
    }
    MOESIM_UNREACHABLE();
}

/* True when every look-ahead row of the block is valid: a prediction of a real layer
 * (l + d < L) an id < E, one beyond the last layer padding TRACE_NO_EXPERT, every score finite.
 * A token's layers below L - D predict real layers only: their ids are one run to scan. */
static bool lookahead_all_ok(const trace *t) {
    const trace_meta *m = &t->meta;
    const uint32_t L = m->n_layers, D = m->lookahead_depth, K = m->lookahead_k;
    const uint16_t max_id = (uint16_t)(m->n_experts - 1);
    const size_t per_layer = (size_t)D * K, per_token = L * per_layer;
    const uint32_t full_layers = L > D ? L - D : 0;
    bool ok = bits32_all_at_most(t->lookahead_scores, t->n_tokens * per_token, FLOAT_ABS_BITS,
                                 FLOAT_MAX_BITS);
    for (uint64_t i = 0; ok && i < t->n_tokens; i++) {
        const uint16_t *ids = t->lookahead_ids + i * per_token;
        ok &= u16_all_at_most(ids, full_layers * per_layer, max_id);
        for (uint32_t l = full_layers; l < L; l++) {
            const uint16_t *row = ids + l * per_layer;
            const size_t n_in = (size_t)(L - 1 - l) * K; /* distances 1..L-1-l, fewer than D */
            ok &= u16_all_at_most(row, n_in, max_id);
            ok &= u16_all_equal(row + n_in, per_layer - n_in, TRACE_NO_EXPERT);
        }
    }
    return ok;
}

static moesim_status check_lookahead(const trace *t, uint64_t first, const char *what,
                                     moesim_error *err) {
    const trace_meta *m = &t->meta;
    if (m->lookahead_depth == 0 || lookahead_all_ok(t)) return MOESIM_OK;
    /* something is wrong: the first bad row, then its first bad value */
    const uint32_t L = m->n_layers, D = m->lookahead_depth, K = m->lookahead_k, E = m->n_experts;
    const size_t per_layer = (size_t)D * K;
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        for (uint32_t l = 0; l < L; l++) {
            size_t base = ((size_t)i * L + l) * per_layer;
            const uint16_t *ids = t->lookahead_ids + base;
            const float *sc = t->lookahead_scores + base;
            /* distances d with l + d < L predict real layers; the rest are padding */
            uint32_t inside = L - 1 - l < D ? L - 1 - l : D;
            size_t n_in = (size_t)inside * K;
            bool ok = true;
            for (size_t j = 0; j < n_in; j++) ok &= ids[j] < E;
            for (size_t j = n_in; j < per_layer; j++) ok &= ids[j] == TRACE_NO_EXPERT;
            for (size_t j = 0; j < per_layer; j++) ok &= (sc[j] >= -FLT_MAX) & (sc[j] <= FLT_MAX);
            if (ok) continue;
            for (size_t j = 0; j < per_layer; j++) {
                uint32_t d = (uint32_t)(j / K) + 1, c = (uint32_t)(j % K);
                if (j < n_in && ids[j] == TRACE_NO_EXPERT)
                    return moesim_fail(
                        err, MOESIM_EINPUT,
                        "%s: /lookahead/expert_ids[%" PRIu64 "][%" PRIu32 "][%" PRIu32 "][%" PRIu32
                        "]: padding %u where layer %" PRIu32 " + distance %" PRIu32 " < %" PRIu32
                        " layers (expected an expert id)",
                        what, first + i, l, d - 1, c, (unsigned)TRACE_NO_EXPERT, l, d, L);
                if (j < n_in && ids[j] >= E)
                    return moesim_fail(err, MOESIM_EINPUT,
                                       "%s: /lookahead/expert_ids[%" PRIu64 "][%" PRIu32
                                       "][%" PRIu32 "][%" PRIu32 "]: expert id %u >= %" PRIu32
                                       " experts",
                                       what, first + i, l, d - 1, c, (unsigned)ids[j], E);
                if (j >= n_in && ids[j] != TRACE_NO_EXPERT)
                    return moesim_fail(err, MOESIM_EINPUT,
                                       "%s: /lookahead/expert_ids[%" PRIu64 "][%" PRIu32
                                       "][%" PRIu32 "][%" PRIu32 "]: expected padding %u "
                                       "(layer %" PRIu32 " + distance %" PRIu32 " >= %" PRIu32
                                       " layers), got %u",
                                       what, first + i, l, d - 1, c, (unsigned)TRACE_NO_EXPERT, l,
                                       d, L, (unsigned)ids[j]);
                if (!isfinite(sc[j]))
                    return moesim_fail(err, MOESIM_EINPUT,
                                       "%s: /lookahead/scores[%" PRIu64 "][%" PRIu32 "][%" PRIu32
                                       "][%" PRIu32 "]: score %g is not finite",
                                       what, first + i, l, d - 1, c, (double)sc[j]);
            }
            MOESIM_UNREACHABLE();
        }
    }
    return MOESIM_OK;
}

moesim_status trace_checker_block(trace_checker *c, const trace *block, moesim_error *err) {
    MOESIM_ASSERT(block->meta.n_layers == c->meta->n_layers &&
                  block->meta.top_k == c->meta->top_k &&
                  block->meta.lookahead_depth == c->meta->lookahead_depth &&
                  block->meta.lookahead_k == c->meta->lookahead_k);
    MOESIM_ASSERT(block->request_id && block->position && block->phase && block->expert_ids &&
                  block->gate_weights);
    MOESIM_ASSERT(!block->meta.has_token_ids == !block->token_id);
    MOESIM_ASSERT(!block->meta.has_importance == !block->importance);
    MOESIM_ASSERT(!block->meta.lookahead_depth == !block->lookahead_ids &&
                  !block->meta.lookahead_depth == !block->lookahead_scores);
    const uint64_t first = c->n_checked;
    moesim_status st = trace_checker_tokens(c, block, err);
    if (!st) st = trace_check_rows(block, first, c->what, err);
    return st;
}

moesim_status trace_checker_tokens(trace_checker *c, const trace *block, moesim_error *err) {
    moesim_status st = check_tokens(c, block, err);
    c->n_checked += block->n_tokens;
    return st;
}

moesim_status trace_check_rows(const trace *block, uint64_t first, const char *what,
                               moesim_error *err) {
    moesim_status st = check_routing(block, first, what, err);
    if (!st) st = check_importance(block, first, what, err);
    if (!st) st = check_lookahead(block, first, what, err);
    return st;
}

moesim_status trace_checker_finish(const trace_checker *c, moesim_error *err) {
    if (c->next_new != c->n_requests)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: n_requests %" PRIu32 " disagrees with /tokens/request_id (%" PRIu32
                           " requests)",
                           c->what, c->n_requests, c->next_new);
    return MOESIM_OK;
}

moesim_status trace_counts_check(uint64_t n_tokens, uint32_t n_requests, const char *what,
                                 moesim_error *err) {
    if (n_tokens == 0)
        return moesim_fail(err, MOESIM_EINPUT, "%s: the trace holds no tokens", what);
    if (n_requests == 0 || n_requests > n_tokens)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: n_requests %" PRIu32 " outside 1..%" PRIu64 " (the token count)",
                           what, n_requests, n_tokens);
    return MOESIM_OK;
}

moesim_status trace_check(const trace *t, const char *what, moesim_error *err) {
    moesim_status st = trace_meta_check(&t->meta, what, err);
    if (!st) st = trace_counts_check(t->n_tokens, t->n_requests, what, err);
    if (st) return st;
    trace_checker c;
    trace_checker_init(&c, &t->meta, t->n_requests, what);
    st = trace_checker_block(&c, t, err);
    if (!st) st = trace_checker_finish(&c, err);
    trace_checker_free(&c);
    return st;
}

char *trace_stored_model_config(const trace *t) {
    json_t *params = t->params_json ? json_loads(t->params_json, 0, NULL) : NULL;
    const char *text = json_string_value(json_object_get(params, "model_config"));
    char *copy = text ? moesim_xstrdup(text) : NULL;
    json_decref(params);
    return copy;
}

/* The model the trace's rows were routed by: the same MoE layers, experts and top-k. */
static moesim_status check_model_fits(const trace *t, const char *trace_path,
                                      const model_geometry *m, moesim_error *err) {
    const trace_meta *tm = &t->meta;
    if (tm->n_layers == m->n_moe_layers && tm->n_experts == m->n_experts && tm->top_k == m->top_k &&
        tm->n_shared_experts == m->n_shared_experts)
        return MOESIM_OK;
    return moesim_fail(err, MOESIM_EINPUT,
                       "%s: its routing (model '%s': %u MoE layers, %u experts, top-%u, %u shared) "
                       "does not match model '%s' (%u MoE layers, %u experts, top-%u, %u shared)",
                       trace_path, tm->model, tm->n_layers, tm->n_experts, tm->top_k,
                       tm->n_shared_experts, m->name, m->n_moe_layers, m->n_experts, m->top_k,
                       m->n_shared_experts);
}

/* trace_model_load before the check that the model fits. */
static moesim_status trace_model_find(const trace *t, const char *trace_path,
                                      const char *model_name, model_geometry *model,
                                      moesim_error *err) {
    if (model_name) return model_load_by_name(model_name, model, err);
    moesim_error by_name = {0};
    char path[4096]; /* a name the search path knows wins (errors in that file are reported) */
    if (!moesim_config_path("models", t->meta.model, path, sizeof path, &by_name))
        return model_load(path, model, err);
    char *text = trace_stored_model_config(t);
    if (!text) {
        *err = by_name;
        moesim_error_prefix(err,
                            "%s names model '%s' and stores no model config; pass --model "
                            "NAME or FILE.ini",
                            trace_path, t->meta.model);
        return err->status;
    }
    char origin[4200];
    snprintf(origin, sizeof origin, "%s: the model config it stores", trace_path);
    moesim_status st = model_load_text(origin, text, model, err);
    free(text);
    return st;
}

moesim_status trace_model_load(const trace *t, const char *trace_path, const char *model_name,
                               model_geometry *model, moesim_error *err) {
    moesim_status st = trace_model_find(t, trace_path, model_name, model, err);
    return st ? st : check_model_fits(t, trace_path, model, err);
}

/* ---- ranked look-ahead rows ---------------------------------------------------------------- */

/* Look-ahead rows of K' scores in t. */
static uint64_t lookahead_rows(const trace *t) {
    return t->n_tokens * t->meta.n_layers * t->meta.lookahead_depth;
}

/* The first look-ahead row of t that is not ranked, or lookahead_rows(t) when every one is. */
static uint64_t first_unranked_row(const trace *t) {
    const uint32_t K = t->meta.lookahead_k;
    const uint64_t rows = lookahead_rows(t);
    uint64_t r = 0;
    while (r < rows && scores_ranked(t->lookahead_scores + r * K, K)) r++;
    return r;
}

bool trace_lookahead_ranked(const trace *t) { return first_unranked_row(t) == lookahead_rows(t); }

moesim_status trace_check_ranked(const trace *block, uint64_t first, const char *what,
                                 moesim_error *err) {
    const uint64_t r = first_unranked_row(block);
    if (r == lookahead_rows(block)) return MOESIM_OK;
    const uint64_t L = block->meta.n_layers, D = block->meta.lookahead_depth;
    const uint32_t K = block->meta.lookahead_k;
    const float *row = block->lookahead_scores + r * K;
    uint32_t c = 1;
    while (c < K && row[c] <= row[c - 1]) c++;
    return moesim_fail(err, MOESIM_EINPUT,
                       "%s: /lookahead/scores[%" PRIu64 "][%" PRIu64 "][%" PRIu64
                       "]: column %" PRIu32 " scores %g above column %" PRIu32
                       "'s %g, but attribute " TRACE_RANKED_ATTR
                       " says every row lists its candidates best first",
                       what, first + r / (L * D), r / D % L, r % D, c, (double)row[c], c - 1,
                       (double)row[c - 1]);
}

/* ---- the recorded predictor's first hits ------------------------------------------------- */

void trace_first_hits_add(trace_first_hits *h, const trace_meta *meta, const uint16_t *expert_ids,
                          const uint16_t *lookahead_ids, uint64_t n) {
    const uint32_t L = meta->n_layers;
    const size_t k = meta->top_k, per_layer = (size_t)meta->lookahead_depth * meta->lookahead_k;
    for (uint64_t i = 0; i < n; i++)
        for (uint32_t l = 0; l + 1 < L; l++) {
            uint16_t want = expert_ids[((size_t)i * L + l + 1) * k];
            if (want == TRACE_NO_EXPERT) continue;
            h->right += lookahead_ids[((size_t)i * L + l) * per_layer] == want;
            h->total++;
        }
}
