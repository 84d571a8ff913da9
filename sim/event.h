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

/* Schedules an event; t_ns must not precede the last popped time (asserted). */
void sim_event_push(sim_event_queue *q, uint64_t t_ns, uint32_t kind, uint32_t arg);

/* The earliest event without removing it; false when empty. Inline: the simulator asks before
 * every action that may touch the copy engines, and mostly nothing is due. */
static inline bool sim_event_peek(const sim_event_queue *q, sim_event *out) {
    if (q->n == 0) return false;
    *out = q->heap[0];
    return true;
}

/* Removes and returns the earliest event; false when empty. Asserts time never goes back. */
bool sim_event_pop(sim_event_queue *q, sim_event *out);

/* Removes the pending event of (kind, arg), the first found: for an owner that keeps at most
 * one such event and must move it (a copy engine whose chunk in flight is cut short; it pushes
 * the corrected event next). A linear scan: the simulator's queue holds one event per engine.
 * Returns false when there is none. */
bool sim_event_cancel(sim_event_queue *q, uint32_t kind, uint32_t arg);

#endif
