/* The step schedule and the emulated look-ahead shared by the simulator and the GPU replay
 * (core/schedule.h). Time does not enter either, so both hosts run the same steps and hand the
 * policy the same predictions. Units: bytes for KV; steps and tokens are indices. */
#include "core/schedule.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/hash.h"
#include "policies/policy.h"

#define NONE UINT32_MAX

void sim_schedule_iter_init(sim_schedule_iter *it, const trace_request_index *rq, uint32_t batch,
                            uint64_t kv_bytes_per_token, uint64_t recurrent_bytes) {
    MOESIM_ASSERT(batch >= 1);
    memset(it, 0, sizeof *it);
    it->rq = rq;
    it->batch = batch;
    it->kv_bytes_per_token = kv_bytes_per_token;
    it->recurrent_bytes = recurrent_bytes;
    size_t R = rq->n_requests ? rq->n_requests : 1;
    it->slot_req = moesim_xmalloc(batch * sizeof *it->slot_req);
    it->admitted = moesim_xmalloc(batch * sizeof *it->admitted);
    for (uint32_t b = 0; b < batch; b++) it->slot_req[b] = NONE;
    it->cursor = moesim_xcalloc(R, sizeof *it->cursor);
    it->req_admit = moesim_xcalloc(R, sizeof *it->req_admit);
    it->req_first = moesim_xcalloc(R, sizeof *it->req_first);
    it->req_last = moesim_xcalloc(R, sizeof *it->req_last);
    it->req_steps = moesim_xcalloc(R, sizeof *it->req_steps);
}

void sim_schedule_iter_free(sim_schedule_iter *it) {
    free(it->slot_req);
    free(it->admitted);
    free(it->cursor);
    free(it->req_admit);
    free(it->req_first);
    free(it->req_last);
    free(it->req_steps);
    memset(it, 0, sizeof *it);
}

bool sim_schedule_next(sim_schedule_iter *it, sim_schedule_step *sd, uint64_t *kv_bytes,
                       uint32_t *tokens, uint32_t *requests, uint8_t *emit) {
    const trace_request_index *rq = it->rq;
    uint32_t R = rq->n_requests, batch = it->batch;
    if (it->next_req >= R && !it->active) return false;
    it->n_admitted = 0;
    for (uint32_t b = 0; b < batch && it->next_req < R; b++)
        if (it->slot_req[b] == NONE) {
            uint32_t r = it->next_req++;
            it->slot_req[b] = r;
            it->req_admit[r] = (uint32_t)it->step;
            it->req_first[r] = NONE;
            it->admitted[it->n_admitted++] = r;
            it->active++;
        }
    bool prefill = false;
    for (uint32_t b = 0; b < batch; b++) {
        uint32_t r = it->slot_req[b];
        if (r != NONE && it->cursor[r] < rq->n_prefill[r]) prefill = true;
    }
    uint32_t n = 0;
    uint64_t kv = 0;
    for (uint32_t b = 0; b < batch; b++) {
        uint32_t r = it->slot_req[b];
        if (r == NONE) continue;
        uint32_t stop = prefill ? rq->n_prefill[r] : it->cursor[r] + 1;
        if (it->cursor[r] < stop) {
            for (uint32_t c = it->cursor[r]; c < stop; c++, n++) {
                if (tokens) tokens[n] = (uint32_t)trace_request_token(rq, r, c);
                if (requests) requests[n] = r;
                if (emit) emit[n] = 0;
            }
            if (emit) emit[n - 1] = 1; /* the last token of the request in the step emits */
            it->cursor[r] = stop;
            if (it->req_first[r] == NONE) it->req_first[r] = (uint32_t)it->step;
            it->req_last[r] = (uint32_t)it->step;
            it->req_steps[r]++;
        }
        kv += (uint64_t)it->cursor[r] * it->kv_bytes_per_token + it->recurrent_bytes;
    }
    MOESIM_ASSERT(n > 0);
    sd->first = it->produced;
    sd->n_tokens = n;
    sd->is_prefill = prefill;
    it->produced += n;
    *kv_bytes = kv;
    it->step++;
    for (uint32_t b = 0; b < batch; b++) {
        uint32_t r = it->slot_req[b];
        if (r != NONE && it->cursor[r] == rq->n_tokens[r]) {
            it->slot_req[b] = NONE;
            it->active--;
        }
    }
    return true;
}

void sim_schedule_build(sim_schedule *s, const trace *t, uint32_t batch,
                        uint64_t kv_bytes_per_token, uint64_t recurrent_bytes) {
    memset(s, 0, sizeof *s);
    uint64_t N = t->n_tokens;
    uint32_t R = t->n_requests;
    trace_request_index rq;
    trace_request_index_build(&rq, t);
    sim_schedule_iter it;
    sim_schedule_iter_init(&it, &rq, batch, kv_bytes_per_token, recurrent_bytes);
    s->n_requests = R;
    s->tokens = moesim_xcalloc(N ? N : 1, sizeof *s->tokens);
    s->emit = moesim_xcalloc(N ? N : 1, 1);
    s->steps = moesim_xcalloc(N ? N : 1, sizeof *s->steps);
    s->step_kv_bytes = moesim_xcalloc(N ? N : 1, sizeof *s->step_kv_bytes);
    uint32_t max_tokens = 0;
    uint64_t out = 0, n_steps = 0, kv_peak = 0;
    sim_schedule_step sd;
    uint64_t kv;
    while (sim_schedule_next(&it, &sd, &kv, s->tokens + out, NULL, s->emit + out)) {
        s->steps[n_steps] = sd;
        s->step_kv_bytes[n_steps] = kv;
        if (kv > kv_peak) kv_peak = kv;
        if (sd.n_tokens > max_tokens) max_tokens = sd.n_tokens;
        out += sd.n_tokens;
        n_steps++;
    }
    MOESIM_ASSERT(out == N);
    s->n_steps = n_steps;
    s->max_step_tokens = max_tokens ? max_tokens : 1;
    s->kv_peak_bytes = kv_peak;
    size_t RB = (R ? R : 1) * sizeof(uint32_t);
    s->req_admit = moesim_xmalloc(RB);
    s->req_first = moesim_xmalloc(RB);
    s->req_last = moesim_xmalloc(RB);
    s->req_steps = moesim_xmalloc(RB);
    memcpy(s->req_admit, it.req_admit, RB);
    memcpy(s->req_first, it.req_first, RB);
    memcpy(s->req_last, it.req_last, RB);
    memcpy(s->req_steps, it.req_steps, RB);
    sim_schedule_iter_free(&it);
    trace_request_index_free(&rq);
}

void sim_schedule_free(sim_schedule *s) {
    if (!s) return;
    free(s->tokens);
    free(s->emit);
    free(s->steps);
    free(s->step_kv_bytes);
    free(s->req_admit);
    free(s->req_first);
    free(s->req_last);
    free(s->req_steps);
    memset(s, 0, sizeof *s);
}

static uint64_t mix64(uint64_t a, uint64_t b) {
    return hash_splitmix64(a ^ hash_splitmix64(b + 0x9e3779b97f4a7c15ull));
}

/* A draw h keeps the true expert when u = (h >> 11) / 2^53 < accuracy: as integers, when
 * h >> 11 < the returned bound (u and accuracy * 2^53 scale exactly; an accuracy above 1 keeps
 * every one, a NaN too, as the compare of doubles would). */
static uint64_t keep_bound(double accuracy) {
    double a = accuracy * 0x1.0p53;
    if (!(a > 0)) return a == a ? 0 : UINT64_MAX;
    if (a > 0x1.0p53) return UINT64_MAX;
    uint64_t t = (uint64_t)a;
    return t + ((double)t < a); /* the least integer at or above a */
}

#if defined(__x86_64__)
/* hash_splitmix64 of each lane (AVX512DQ: its 64-bit multiplies). */
__attribute__((target("avx512f,avx512dq"))) static inline __m512i splitmix64_x8(__m512i x) {
    x = _mm512_add_epi64(x, _mm512_set1_epi64((long long)0x9e3779b97f4a7c15ull));
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 30)),
                           _mm512_set1_epi64((long long)0xbf58476d1ce4e5b9ull));
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)),
                           _mm512_set1_epi64((long long)0x94d049bb133111ebull));
    return _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
}

/* first_draws, eight lanes at once. */
__attribute__((target("avx512f,avx512dq"))) static uint32_t
first_draws_x8(uint64_t seed, uint64_t b, uint64_t keep, uint64_t out[8]) {
    __m512i x = _mm512_add_epi64(_mm512_set1_epi64((long long)(b + 0x9e3779b97f4a7c15ull)),
                                 _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
    x = splitmix64_x8(_mm512_xor_si512(splitmix64_x8(x), _mm512_set1_epi64((long long)seed)));
    _mm512_storeu_si512(out, x);
    return _mm512_cmpge_epu64_mask(_mm512_srli_epi64(x, 11), _mm512_set1_epi64((long long)keep));
}
#endif

/* The first draws mix64(seed, b + i) for i < n (n <= 8) of a row, and the mask of those that
 * drop the true expert (h >> 11 at or above `keep`, keep_bound): eight at a time where AVX512DQ
 * is (two hashes a draw were most of the emulated predictor's time). Lanes n.. may be set too. */
static uint32_t first_draws(uint64_t seed, uint64_t b, uint32_t n, uint64_t keep, uint64_t out[8]) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512dq")) return first_draws_x8(seed, b, keep, out);
#endif
    uint32_t drop = 0;
    for (uint32_t i = 0; i < n; i++) {
        out[i] = mix64(seed, b + i);
        drop |= (uint32_t)(out[i] >> 11 >= keep) << i;
    }
    return drop;
}

/* A uniform expert of [0, E) for slot j of `row`, from the draw h: neither `want` nor one of
 * row[0..j) (after 65 tries, the last one drawn). */
static uint16_t draw_other(uint64_t h, const uint16_t *row, uint32_t j, uint16_t want, uint32_t E) {
    /* h % E for a power-of-two E (most models) without a 64-bit division per draw */
    const uint64_t e_mask = (E & (E - 1)) == 0 ? E - 1 : 0;
    for (uint64_t tries = 0;; tries++) {
        h = hash_splitmix64(h + tries);
        uint16_t c = (uint16_t)(e_mask ? h & e_mask : h % E);
        bool dup = c == want;
        for (uint32_t k = 0; k < j && !dup; k++) dup = row[k] == c;
        if (!dup || tries > 64) return c;
    }
}

void sim_lookahead_emulate_rows(const uint16_t *experts, const float *gates, uint32_t L,
                                uint32_t E, uint32_t K, uint32_t D, uint32_t kp, uint64_t seed,
                                double accuracy, uint64_t token, uint32_t layer, uint16_t *ids,
                                float *scores) {
    const uint64_t keep = keep_bound(accuracy);
    for (uint32_t d = 1; d <= D; d++) {
        uint16_t *row = ids + (size_t)(d - 1) * kp;  /* [kp] */
        float *srow = scores + (size_t)(d - 1) * kp; /* [kp] */
        if (layer + d >= L) {
            for (uint32_t j = 0; j < kp; j++) {
                row[j] = POLICY_NO_EXPERT;
                srow[j] = 0;
            }
            continue;
        }
        const uint16_t *truth = experts + (size_t)(layer + d) * K;
        const float *g = gates + (size_t)(layer + d) * K;
        const uint64_t base = ((token * L + layer) * 16 + d) * 256;
        /* each slot the true expert, then the dropped ones redrawn in slot order: a redraw
         * reads the slots before it, final by then */
        for (uint32_t j0 = 0; j0 < kp; j0 += 8) {
            uint32_t n = kp - j0 < 8 ? kp - j0 : 8;
            uint64_t first[8];
            uint32_t redraw = first_draws(seed, base + j0, n, keep, first) & ((1u << n) - 1);
            for (uint32_t i = 0; i < n; i++) {
                uint32_t j = j0 + i;
                row[j] = j < K ? truth[j] : TRACE_NO_EXPERT;
                srow[j] = j < K ? g[j] : 0;
                redraw |= (uint32_t)(row[j] == TRACE_NO_EXPERT) << i;
            }
            for (; redraw; redraw &= redraw - 1) {
                uint32_t i = (uint32_t)__builtin_ctz(redraw), j = j0 + i;
                row[j] = draw_other(first[i], row, j, j < K ? truth[j] : TRACE_NO_EXPERT, E);
            }
        }
    }
}
