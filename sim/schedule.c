/* The step schedule and the emulated look-ahead shared by the simulator and the GPU replay
 * (sim/schedule.h). Time does not enter either, so both hosts run the same steps and hand the
 * policy the same predictions. Units: bytes for KV; steps and tokens are indices. */
#include "sim/schedule.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/hash.h"
#include "policies/policy.h"

#define NONE UINT32_MAX

void sim_schedule_build(sim_schedule *s, const trace *t, uint32_t batch,
                        uint64_t kv_bytes_per_token, uint64_t recurrent_bytes) {
    MOESIM_ASSERT(batch >= 1);
    memset(s, 0, sizeof *s);
    uint32_t R = t->n_requests;
    uint64_t N = t->n_tokens;
    /* the tokens of each request in trace order: rtok[rfirst[r] .. rfirst[r + 1]) */
    uint64_t *rfirst = moesim_xcalloc((size_t)R + 1, sizeof *rfirst);
    for (uint64_t i = 0; i < N; i++) rfirst[t->request_id[i] + 1]++;
    for (uint32_t r = 0; r < R; r++) rfirst[r + 1] += rfirst[r];
    uint32_t *rtok = moesim_xmalloc((N ? N : 1) * sizeof *rtok);
    uint64_t *fill = moesim_xmalloc(((size_t)R + 1) * sizeof *fill);
    memcpy(fill, rfirst, ((size_t)R + 1) * sizeof *fill);
    uint32_t *rprefill = moesim_xcalloc(R ? R : 1, sizeof *rprefill);
    for (uint64_t i = 0; i < N; i++) {
        uint32_t r = t->request_id[i];
        rtok[fill[r]++] = (uint32_t)i;
        if (t->phase[i] == TRACE_PREFILL) rprefill[r]++;
    }
    free(fill);
    s->n_requests = R;
    s->tokens = moesim_xcalloc(N ? N : 1, sizeof *s->tokens);
    s->emit = moesim_xcalloc(N ? N : 1, 1);
    s->steps = moesim_xcalloc(N ? N : 1, sizeof *s->steps);
    s->step_kv_bytes = moesim_xcalloc(N ? N : 1, sizeof *s->step_kv_bytes);
    s->req_admit = moesim_xcalloc(R ? R : 1, sizeof(uint32_t));
    s->req_first = moesim_xcalloc(R ? R : 1, sizeof(uint32_t));
    s->req_last = moesim_xcalloc(R ? R : 1, sizeof(uint32_t));
    s->req_steps = moesim_xcalloc(R ? R : 1, sizeof(uint32_t));
    uint32_t *slot_req = moesim_xmalloc(batch * sizeof *slot_req); /* [batch] request or NONE */
    uint64_t *cursor = moesim_xcalloc(R ? R : 1, sizeof *cursor);  /* [R] tokens run so far */
    for (uint32_t b = 0; b < batch; b++) slot_req[b] = NONE;
    uint32_t next_req = 0, active = 0, max_tokens = 0;
    uint64_t out = 0, n_steps = 0, kv_peak = 0;
    while (next_req < R || active) {
        for (uint32_t b = 0; b < batch && next_req < R; b++)
            if (slot_req[b] == NONE) {
                slot_req[b] = next_req;
                s->req_admit[next_req] = (uint32_t)n_steps;
                s->req_first[next_req] = NONE;
                next_req++;
                active++;
            }
        bool prefill = false;
        for (uint32_t b = 0; b < batch; b++)
            if (slot_req[b] != NONE && cursor[slot_req[b]] < rprefill[slot_req[b]]) prefill = true;
        sim_schedule_step *sd = &s->steps[n_steps];
        sd->first = out;
        sd->is_prefill = prefill;
        uint64_t kv = 0;
        for (uint32_t b = 0; b < batch; b++) {
            uint32_t r = slot_req[b];
            if (r == NONE) continue;
            uint64_t stop = prefill ? rprefill[r] : cursor[r] + 1;
            if (cursor[r] < stop) {
                for (uint64_t c = cursor[r]; c < stop; c++) s->tokens[out++] = rtok[rfirst[r] + c];
                s->emit[out - 1] = 1; /* the last token of the request in the step emits */
                cursor[r] = stop;
                if (s->req_first[r] == NONE) s->req_first[r] = (uint32_t)n_steps;
                s->req_last[r] = (uint32_t)n_steps;
                s->req_steps[r]++;
            }
            kv += cursor[r] * kv_bytes_per_token + recurrent_bytes;
        }
        sd->n_tokens = (uint32_t)(out - sd->first);
        MOESIM_ASSERT(sd->n_tokens > 0);
        if (sd->n_tokens > max_tokens) max_tokens = sd->n_tokens;
        s->step_kv_bytes[n_steps] = kv;
        if (kv > kv_peak) kv_peak = kv;
        n_steps++;
        for (uint32_t b = 0; b < batch; b++) {
            uint32_t r = slot_req[b];
            if (r != NONE && cursor[r] == rfirst[r + 1] - rfirst[r]) {
                slot_req[b] = NONE;
                active--;
            }
        }
    }
    MOESIM_ASSERT(out == N);
    s->n_steps = n_steps;
    s->max_step_tokens = max_tokens ? max_tokens : 1;
    s->kv_peak_bytes = kv_peak;
    free(slot_req);
    free(cursor);
    free(rprefill);
    free(rtok);
    free(rfirst);
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

void sim_lookahead_emulate(const trace *t, uint32_t L, uint32_t E, uint32_t K, uint32_t D,
                           uint32_t kp, uint64_t seed, double accuracy, uint64_t token,
                           uint32_t layer, uint16_t *ids, float *scores) {
    sim_lookahead_emulate_rows(trace_experts(t, token, 0), trace_gates(t, token, 0), L, E, K, D,
                               kp, seed, accuracy, token, layer, ids, scores);
}

void sim_lookahead_emulate_rows(const uint16_t *experts, const float *gates, uint32_t L,
                                uint32_t E, uint32_t K, uint32_t D, uint32_t kp, uint64_t seed,
                                double accuracy, uint64_t token, uint32_t layer, uint16_t *ids,
                                float *scores) {
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
                    uint16_t c = (uint16_t)(h % E);
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
