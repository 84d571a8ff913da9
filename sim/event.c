/* Binary min-heap of simulator events on (t_ns, seq); see event.h. */
#include "sim/event.h"

#include <stdlib.h>

#include "common/alloc.h"
#include "common/check.h"

void sim_event_queue_init(sim_event_queue *q, size_t cap_hint) {
    q->cap = cap_hint < 16 ? 16 : cap_hint;
    q->heap = moesim_xmalloc(q->cap * sizeof *q->heap);
    q->n = 0;
    q->next_seq = 0;
    q->last_t_ns = 0;
}

void sim_event_queue_free(sim_event_queue *q) {
    free(q->heap);
    q->heap = NULL;
    q->n = q->cap = 0;
}

void sim_event_queue_grow(sim_event_queue *q) {
    q->cap *= 2;
    q->heap = moesim_xrealloc(q->heap, q->cap * sizeof *q->heap);
}

/* Restores the heap order around slot i after its event changed or moved in: up while it
 * precedes its parent, else down while a child precedes it. */
void sim_event_heap_fix(sim_event_queue *q, size_t i) {
    sim_event e = q->heap[i];
    while (i > 0 && sim_event_before(&e, &q->heap[(i - 1) / 2])) {
        q->heap[i] = q->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= q->n) break;
        if (child + 1 < q->n && sim_event_before(&q->heap[child + 1], &q->heap[child])) child++;
        if (!sim_event_before(&q->heap[child], &e)) break;
        q->heap[i] = q->heap[child];
        i = child;
    }
    q->heap[i] = e;
}

/* Removes slot i: the last event takes its place. */
static void heap_remove(sim_event_queue *q, size_t i) {
    q->heap[i] = q->heap[--q->n];
    if (i < q->n) sim_event_heap_fix(q, i);
}

bool sim_event_cancel(sim_event_queue *q, uint32_t kind, uint32_t arg) {
    for (size_t i = 0; i < q->n; i++)
        if (q->heap[i].kind == kind && q->heap[i].arg == arg) {
            heap_remove(q, i);
            return true;
        }
    return false;
}
