/* A progress bar on stderr for long work (done/total, rate, ETA). It draws only when stderr is a
 * terminal and the caller allows it, so pipes, CI logs and tests stay quiet. */
#ifndef MOESIM_COMMON_PROGRESS_H
#define MOESIM_COMMON_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct progress {
    bool enabled;
    char label[32];
    uint64_t total, done;
    double t_start_s, t_drawn_s; /* monotonic seconds */
} progress;

void progress_begin(progress *p, const char *label, uint64_t total, bool allowed);
void progress_update(progress *p, uint64_t done); /* redraws at most 10 times a second */
void progress_end(progress *p);                   /* final line, then a newline */

double moesim_monotonic_s(void); /* seconds on CLOCK_MONOTONIC, for rates and benchmarks */

#endif
