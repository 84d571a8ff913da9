/* The time-independent parts of a run that the simulator (sim/sim.c) and the GPU replay
 * (replay/run.cu) must agree on draw for draw, kept in one place so they cannot drift apart:
 *
 * - the step schedule (sim/README.md "Steps, batch and requests"): which trace tokens run in
 *   which step, the KV bytes in use during each step and each request's admit/first/last step;
 * - the emulated look-ahead predictor used when a trace carries no recorded look-ahead.
 *
 * Units: bytes for KV; steps and tokens are indices. Invariants (asserted): every trace token
 * runs in exactly one step; every step runs at least one token. */
#ifndef MOESIM_CORE_SCHEDULE_H
#define MOESIM_CORE_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "traces/trace.h"

typedef struct sim_schedule_step {
    uint64_t first; /* into sim_schedule.tokens */
    uint32_t n_tokens;
    bool is_prefill;
} sim_schedule_step;

typedef struct sim_schedule {
    uint32_t *tokens;         /* [n_tokens of the trace] trace token index in execution order */
    uint8_t *emit;            /* [n_tokens of the trace] the token emits an output */
    sim_schedule_step *steps; /* [n_steps] */
    uint64_t n_steps;
    uint32_t max_step_tokens; /* largest step (1 when the trace is empty) */
    uint64_t kv_peak_bytes;   /* largest step_kv_bytes */
    uint64_t *step_kv_bytes;  /* [n_steps] KV (and recurrent state) in use during the step */
    uint32_t n_requests;
    uint32_t *req_admit, *req_first, *req_last; /* [n_requests] step indices */
    uint32_t *req_steps;                        /* [n_requests] steps the request took part in */
} sim_schedule;

/* Builds the schedule of `t` at batch size `batch` (>= 1) so sim and replay run the same steps:
 * up to `batch` requests in flight, entering in request id order as slots free up; a step is
 * every pending prompt token of the admitted requests when one has any, else one decode token of
 * each active request. A request in flight holds `kv_bytes_per_token` per token it has run plus
 * `recurrent_bytes`. Fills the caller's *s; its arrays are owned by *s, freed by
 * sim_schedule_free. */
void sim_schedule_build(sim_schedule *s, const trace *t, uint32_t batch,
                        uint64_t kv_bytes_per_token, uint64_t recurrent_bytes);
/* Frees the arrays of a schedule built by sim_schedule_build and zeroes it; NULL is fine. */
void sim_schedule_free(sim_schedule *s);

/* The schedule one step at a time, in memory that grows with the requests, not the tokens (a
 * streamed trace's run): the same steps sim_schedule_build records, which it is built on.
 * Per request it keeps the step it was admitted in, its first and last step and how many it took
 * part in; `admitted`/`n_admitted` list the requests admitted by the last sim_schedule_next. */
typedef struct sim_schedule_iter {
    const trace_request_index *rq; /* borrowed */
    uint32_t batch;
    uint64_t kv_bytes_per_token, recurrent_bytes;
    uint32_t *slot_req; /* [batch] request in each slot, or UINT32_MAX */
    uint32_t *cursor;   /* [n_requests] tokens run so far */
    uint32_t *req_admit, *req_first, *req_last, *req_steps; /* [n_requests] step indices */
    uint32_t *admitted; /* [batch] */
    uint32_t n_admitted;
    uint32_t next_req, active;
    uint64_t step;     /* steps produced */
    uint64_t produced; /* tokens produced */
} sim_schedule_iter;

void sim_schedule_iter_init(sim_schedule_iter *it, const trace_request_index *rq, uint32_t batch,
                            uint64_t kv_bytes_per_token, uint64_t recurrent_bytes);
void sim_schedule_iter_free(sim_schedule_iter *it); /* accepts a zeroed struct */
/* The next step: its token count and kind in *sd (sd->first: tokens produced before it), the KV
 * bytes in use during it, and, where not NULL, its tokens, their requests and emit flags
 * (each [the step's tokens]: the caller sizes them by the largest step). False after the last. */
bool sim_schedule_next(sim_schedule_iter *it, sim_schedule_step *sd, uint64_t *kv_bytes,
                       uint32_t *tokens, uint32_t *requests, uint8_t *emit);

/* Emulated look-ahead of one token at one layer, so sim and replay hand the policy the same
 * predictions: distance d's (1..D) `kp` candidates are the true top-k of layer `layer + d`,
 * each kept with probability `accuracy` and otherwise replaced by another expert drawn
 * uniformly (not the true one, not already listed); scores are the true gates (0 beyond k).
 * Past the last layer the row is POLICY_NO_EXPERT with score 0. A counter-based hash of
 * (seed, token, layer, d, slot) makes it independent of batching and run order.
 * `L`, `E`, `K`: the trace's layers, experts per layer and top-k; `experts` and `gates` are the
 * token's rows [L][K] (borrowed: a host may hold a few blocks of the trace, not all of it).
 * Writes the caller's ids and scores, both [D][kp]. */
void sim_lookahead_emulate_rows(const uint16_t *experts, const float *gates, uint32_t L,
                                uint32_t E, uint32_t K, uint32_t D, uint32_t kp, uint64_t seed,
                                double accuracy, uint64_t token, uint32_t layer, uint16_t *ids,
                                float *scores);

#endif
