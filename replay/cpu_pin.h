/* The CPU replay's two threads, the calling (compute) thread and another (the copies), each on a
 * CPU of its own when the process may use two: unpinned, a chunk landing woke the compute thread
 * onto the copy thread's CPU (the scheduler puts a woken thread beside its waker) and the copy
 * thread waited there while an op ran (19 % of an ondemand run on the 2-core machine of
 * experiments/validation/cpu), where the simulator overlaps them as a copy engine does.
 * Calibration places its threads so too, to measure what they cost each other. */
#ifndef MOESIM_REPLAY_CPU_PIN_H
#define MOESIM_REPLAY_CPU_PIN_H

/* cpu_set_t: a file including this header defines _GNU_SOURCE before any system header */
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>

typedef struct cpu_pin {
    cpu_set_t caller_cpus; /* the calling thread's CPUs before, restored by cpu_pin_restore */
    bool pinned;
} cpu_pin;

/* The caller on the first CPU it may use, `other` on the second; nothing with fewer than two
 * (best effort: a refused placement leaves the threads where they were). */
void cpu_pin_pair(cpu_pin *p, pthread_t other);
/* The caller back on the CPUs it had before cpu_pin_pair. */
void cpu_pin_restore(const cpu_pin *p);

#endif
