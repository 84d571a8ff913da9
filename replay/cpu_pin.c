/* The CPU replay's two threads on CPUs of their own (replay/cpu_pin.h). */
#define _GNU_SOURCE /* sched_getaffinity, pthread_setaffinity_np */
#include "replay/cpu_pin.h"

void cpu_pin_pair(cpu_pin *p, pthread_t other) {
    p->pinned = false;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return;
    int cpus[2], n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &allowed)) cpus[n++] = c;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[0], &one);
    if (pthread_getaffinity_np(pthread_self(), sizeof p->caller_cpus, &p->caller_cpus) != 0 ||
        pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0)
        return;
    p->pinned = true;
    CPU_ZERO(&one);
    CPU_SET(cpus[1], &one);
    (void)pthread_setaffinity_np(other, sizeof one, &one); /* best effort, as above */
}

void cpu_pin_restore(const cpu_pin *p) {
    if (p->pinned)
        (void)pthread_setaffinity_np(pthread_self(), sizeof p->caller_cpus, &p->caller_cpus);
}
