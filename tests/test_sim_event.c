/* The simulator's event queue (sim/event.h): (time, insertion) order, and the removal of one
 * pending event that a copy engine uses to move its chunk's completion when it cuts a span. */
#include <criterion/criterion.h>

#include "sim/event.h"

TestSuite(sim_event);

Test(sim_event, events_pop_by_time_then_by_insertion_order) {
    sim_event_queue q;
    sim_event_queue_init(&q, 2);
    const uint64_t t[] = {50, 10, 30, 10, 50, 20, 10};
    for (uint32_t i = 0; i < 7; i++) sim_event_push(&q, t[i], 1, i);
    const uint32_t want[] = {1, 3, 6, 5, 2, 0, 4};
    sim_event ev;
    for (uint32_t i = 0; i < 7; i++) {
        cr_assert(sim_event_pop(&q, &ev));
        cr_expect_eq(ev.arg, want[i], "pop %u: arg %u, want %u", i, ev.arg, want[i]);
    }
    cr_expect_not(sim_event_pop(&q, &ev));
    sim_event_queue_free(&q);
}

Test(sim_event, a_cancelled_event_is_gone_and_the_rest_keep_their_order) {
    /* every position of a queue of 9 (root, inner, last leaf): cancel it, push its replacement
     * earlier than its old time, and the queue pops everything else in (time, insertion) order */
    for (uint32_t victim = 0; victim < 9; victim++) {
        sim_event_queue q;
        sim_event_queue_init(&q, 4);
        for (uint32_t i = 0; i < 9; i++) sim_event_push(&q, 100 + 10 * ((i * 5) % 9), 1, i);
        cr_assert(sim_event_cancel(&q, 1, victim));
        cr_expect_not(sim_event_cancel(&q, 1, victim), "only one event per (kind, arg)");
        cr_expect_not(sim_event_cancel(&q, 2, (victim + 1) % 9), "kind must match too");
        sim_event_push(&q, 95, 1, victim);
        sim_event ev;
        cr_assert(sim_event_pop(&q, &ev));
        cr_expect_eq(ev.arg, victim, "the moved event comes first");
        uint64_t last = 0;
        uint32_t n = 0;
        while (sim_event_pop(&q, &ev)) {
            cr_expect_neq(ev.arg, victim, "victim %u popped twice", victim);
            cr_expect_geq(ev.t_ns, last);
            last = ev.t_ns;
            n++;
        }
        cr_expect_eq(n, 8);
        sim_event_queue_free(&q);
    }
}
