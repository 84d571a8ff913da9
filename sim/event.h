/* The simulator's event queue: a binary min-heap of events ordered by (t_ns, seq), where seq is
 * the insertion count, so two events at the same nanosecond come out in the order they were
 * pushed and a run is bit-for-bit deterministic (the ns-3 / SimGrid rule).
 *
 * Units: t_ns is simulated time in integer nanoseconds since the start of the run.
 * Invariants: pop never returns an event earlier than the last one popped (asserted: time never
 * goes back); the heap grows by doubling, so pushes do not allocate in steady state. */
#ifndef MOESIM_SIM_EVENT_H
#define MOESIM_SIM_EVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/check.h"

typedef struct sim_event {
    uint64_t t_ns;
    uint64_t seq;  /* insertion order: the tie-break */
    uint32_t kind; /* what happens (the owner's enum) */
    uint32_t arg;  /* which resource / object it concerns */
} sim_event;

typedef struct sim_event_queue {
    sim_event *heap; /* [cap] min-heap on (t_ns, seq); [0, n) used */
    size_t n, cap;
    uint64_t next_seq;
    uint64_t last_t_ns; /* time of the last pop: pops never go back */
} sim_event_queue;

/* Caller-allocated queue: init sizes it (cap_hint events), free releases the heap. */
void sim_event_queue_init(sim_event_queue *q, size_t cap_hint);
void sim_event_queue_free(sim_event_queue *q);

/* Out of line for sim_event_push / sim_event_pop: room for one more event; the heap's order
 * restored around slot i. */
void sim_event_queue_grow(sim_event_queue *q);
void sim_event_heap_fix(sim_event_queue *q, size_t i);

static inline bool sim_event_before(const sim_event *a, const sim_event *b) {
    return a->t_ns < b->t_ns || (a->t_ns == b->t_ns && a->seq < b->seq);
}

/* Schedules an event; t_ns must not precede the last popped time (asserted). Inline: one push
 * per copy, into a queue of one event per engine. */
static inline void sim_event_push(sim_event_queue *q, uint64_t t_ns, uint32_t kind, uint32_t arg) {
    MOESIM_ASSERT(t_ns >= q->last_t_ns);
    if (q->n == q->cap) sim_event_queue_grow(q);
    sim_event e = {.t_ns = t_ns, .seq = q->next_seq++, .kind = kind, .arg = arg};
    size_t i = q->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!sim_event_before(&e, &q->heap[parent])) break;
        q->heap[i] = q->heap[parent];
        i = parent;
    }
    q->heap[i] = e;
}

/* The earliest event without removing it; NULL when empty. Inline: the simulator asks before
 * every action that may touch the copy engines, and mostly nothing is due. */
static inline const sim_event *sim_event_peek(const sim_event_queue *q) {
    return q->n ? &q->heap[0] : NULL;
}

/* Removes and returns the earliest event; false when empty. Asserts time never goes back. */
static inline bool sim_event_pop(sim_event_queue *q, sim_event *out) {
    if (q->n == 0) return false;
    *out = q->heap[0];
    MOESIM_ASSERT(out->t_ns >= q->last_t_ns);
    q->last_t_ns = out->t_ns;
    q->heap[0] = q->heap[--q->n]; /* the last event takes its place */
    if (q->n > 1) sim_event_heap_fix(q, 0);
    return true;
}

/* Removes the pending event of (kind, arg), the first found: for an owner that keeps at most
 * one such event and must move it (a copy engine whose chunk in flight is cut short; it pushes
 * the corrected event next). A linear scan: the simulator's queue holds one event per engine.
 * Returns false when there is none. */
bool sim_event_cancel(sim_event_queue *q, uint32_t kind, uint32_t arg);

#endif
