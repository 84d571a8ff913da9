/* The step schedule and the emulated look-ahead shared by the simulator and the GPU replay
 * (core/schedule.h). Time does not enter either, so both hosts run the same steps and hand the
 * policy the same predictions. Units: bytes for KV; steps and tokens are indices. */
#include "core/schedule.h"

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

void sim_lookahead_emulate_rows(const uint16_t *experts, const float *gates, uint32_t L,
                                uint32_t E, uint32_t K, uint32_t D, uint32_t kp, uint64_t seed,
                                double accuracy, uint64_t token, uint32_t layer, uint16_t *ids,
                                float *scores) {
    /* h % E for a power-of-two E (most models) without a 64-bit division per draw */
    const uint64_t e_mask = (E & (E - 1)) == 0 ? E - 1 : 0;
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
        for (uint32_t j = 0; j < kp; j++) {
            uint64_t h = mix64(seed, ((token * L + layer) * 16 + d) * 256 + j);
            double u = (double)(h >> 11) * 0x1.0p-53;
            uint16_t want = j < K ? truth[j] : TRACE_NO_EXPERT;
            uint16_t pick = want;
            if (want == TRACE_NO_EXPERT || u >= accuracy) {
                for (uint64_t tries = 0;; tries++) {
                    h = hash_splitmix64(h + tries);
                    uint16_t c = (uint16_t)(e_mask ? h & e_mask : h % E);
                    bool dup = c == want;
                    for (uint32_t k = 0; k < j && !dup; k++) dup = row[k] == c;
                    if (!dup || tries > 64) {
                        pick = c;
                        break;
                    }
                }
            }
            row[j] = pick;
            srow[j] = j < K ? g[j] : 0;
        }
    }
}
