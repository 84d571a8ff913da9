/* The step schedule of a replay: which trace tokens run in which step. The same rules as the
 * simulator's (sim/README.md "Steps, batch and requests"): up to `batch` requests in flight,
 * entering in request id order as slots free up; a step is every pending prompt token of the
 * admitted requests when one has any, else one decode token of each active request. Time does
 * not enter, so replay and sim run the same steps. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "replay/replay.h"

#define NONE UINT32_MAX

void replay_schedule_build(replay_schedule *s, const trace *t, const model_geometry *m,
                           uint32_t batch) {
    MOESIM_ASSERT(batch >= 1);
    memset(s, 0, sizeof *s);
    uint32_t R = t->n_requests;
    uint64_t N = t->n_tokens;
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
    uint32_t *slot_req = moesim_xmalloc(batch * sizeof *slot_req);
    uint64_t *cursor = moesim_xcalloc(R ? R : 1, sizeof *cursor);
    for (uint32_t b = 0; b < batch; b++) slot_req[b] = NONE;
    uint32_t next_req = 0, active = 0, max_tokens = 0;
    uint64_t out = 0, n_steps = 0, kv_peak = 0;
    uint64_t kv_tok = model_kv_bytes_per_token(m), rec = model_recurrent_state_bytes(m);
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
        replay_step *sd = &s->steps[n_steps];
        sd->first = out;
        sd->is_prefill = prefill;
        uint64_t kv = 0;
        for (uint32_t b = 0; b < batch; b++) {
            uint32_t r = slot_req[b];
            if (r == NONE) continue;
            uint64_t stop = prefill ? rprefill[r] : cursor[r] + 1;
            if (cursor[r] < stop) {
                for (uint64_t c = cursor[r]; c < stop; c++) s->tokens[out++] = rtok[rfirst[r] + c];
                s->emit[out - 1] = 1;
                cursor[r] = stop;
                if (s->req_first[r] == NONE) s->req_first[r] = (uint32_t)n_steps;
                s->req_last[r] = (uint32_t)n_steps;
                s->req_steps[r]++;
            }
            kv += cursor[r] * kv_tok + rec;
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

void replay_schedule_free(replay_schedule *s) {
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
