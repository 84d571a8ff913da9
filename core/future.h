/* The trace's future, for the `oracle` bound only (policies/oracle.c): the host knows the whole
 * schedule because routing comes from a trace. One index for every host (sim and replay), built
 * on first use: for each (layer, expert), the global positions of its accesses in execution order
 * (steps in order, layers in order, tokens of the step in order, slots in order).
 *
 * Memory: with the trace's schedule in memory (sim_future_init: the replay), 4 bytes per routed
 * access (8 when the trace has 2^32 or more), plus [L*E+1] offsets. Without it
 * (sim_future_init_requests: the simulator), O(L*E + the largest step) in memory and 12 bytes
 * per routed access in unlinked temporary files (TMPDIR or /tmp), built by one pass forward over
 * the trace (each access's layer and expert) and one backward over that file (each access's next
 * use). */
#ifndef MOESIM_CORE_FUTURE_H
#define MOESIM_CORE_FUTURE_H

#include <stdint.h>

#include "core/schedule.h"
#include "traces/trace.h"

/* Where a token's rows are: the block of the trace holding `token` and its index there
 * (trace_stream_row's shape). The pointer is used before the next call. */
typedef const trace *(*sim_future_rows)(void *ctx, uint64_t token, uint64_t *local);

typedef struct sim_future {
    const trace *tr;          /* borrowed */
    sim_future_rows rows;     /* NULL: tr holds every row */
    void *rows_ctx;
    trace_stream *ids_stream; /* borrowed; NULL: the next-use stream's pass reads rows */
    /* without a schedule in memory (sch NULL): steps come from iterators over the requests */
    const trace_request_index *rq; /* borrowed */
    uint32_t batch, max_step_tokens;
    sim_schedule_iter win;  /* the steps sim_future_active asks for, produced in order */
    uint32_t *win_tokens;   /* [2][max_step_tokens] the last two steps produced */
    uint32_t win_n[2];
    uint64_t win_step[2];   /* step held in each half, or UINT64_MAX */
    /* next-use stream (no schedule in memory): for every access in execution order, its
     * (layer, expert) and the position of the next access of the same one, in two unlinked
     * temporary files, read forward as the queries' position advances; nxt[le] is the next use
     * of le not before `consumed` */
    int le_fd, next_fd;     /* open once nxt is built */
    uint64_t n_access;      /* accesses of the whole run */
    uint64_t *nxt;          /* [L*E] */
    uint64_t consumed;      /* accesses consumed (their next uses applied to nxt) */
    uint64_t nxt_answers_below; /* a query at a position below it reads nxt as it is (the stream
                                   built, consumed up to it); 0 until then and with an index */
    uint32_t *rd_le;        /* [SIM_FUTURE_READ or more] (layer, expert) of accesses read ahead */
    uint64_t *rd;           /* [SIM_FUTURE_READ] their next uses */
    uint64_t rd_first, rd_n;
    const sim_schedule *sch;  /* borrowed */
    uint32_t L, E, K;
    uint32_t *use_pos32; /* [accesses] positions grouped by (layer, expert), when they fit 32 bits */
    uint64_t *use_pos64; /* [accesses] otherwise */
    uint64_t *use_first; /* [L*E + 1] CSR offsets into use_pos */
    uint64_t *use_cur;   /* [L*E] cursor: first use not before the last query's position */
    bool built;
} sim_future;

/* Remembers the trace and schedule (borrowed for the future's lifetime); builds nothing yet. */
void sim_future_init(sim_future *f, const trace *tr, const sim_schedule *sch);
void sim_future_free(sim_future *f); /* accepts a zeroed struct */
/* The same for a host that holds neither the trace nor its schedule (a streamed trace): the
 * schedule of `rq` at `batch` is replayed step by step (core/schedule.h), rows come from `rows`.
 * sim_future_active's steps must then not go back by more than one between calls. */
void sim_future_init_requests(sim_future *f, const trace_meta *meta,
                              const trace_request_index *rq, uint32_t batch,
                              uint32_t max_step_tokens, sim_future_rows rows, void *ctx);
/* Reads routing rows through `rows` instead of the trace (a trace_stream's blocks). */
void sim_future_set_rows(sim_future *f, sim_future_rows rows, void *ctx);
/* The stream whose blocks `rows` returns, borrowed: the next-use stream's pass over the whole
 * trace then reads its expert ids alone (trace_stream_read_experts), not every row of every
 * block once more (unless the stream caches every block, which the run then reads from it). */
void sim_future_set_ids_stream(sim_future *f, trace_stream *s);

/* Accesses (token, slot) between `pos` and the next access of (layer, expert) at or after it;
 * UINT64_MAX if never again. Positions must not go back between calls for one expert. */
uint64_t sim_future_next_use(sim_future *f, uint32_t layer, uint32_t expert, uint64_t pos);

/* The distinct experts step `step` activates at `layer`, ascending: writes up to `cap` ids,
 * returns the count (0 past the last step). */
uint32_t sim_future_active(sim_future *f, uint64_t step, uint32_t layer, uint16_t *ids,
                           uint32_t cap);

#endif
