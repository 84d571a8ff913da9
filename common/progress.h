/* Progress of long work on stderr (done/total, rate, ETA), when the caller allows it (not -q):
 * on a terminal a bar redrawn in place; otherwise (a pipe, a Slurm or CI log) a plain line every
 * PROGRESS_LINE_S seconds and a last one at the end, so work shorter than that prints nothing. A
 * total of 0 means unknown: the count and the rate, no bar or ETA. */
#ifndef MOESIM_COMMON_PROGRESS_H
#define MOESIM_COMMON_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

#define PROGRESS_LINE_S 10.0

typedef struct progress {
    bool enabled;
    bool tty;        /* a bar redrawn in place, else plain lines */
    bool line_shown; /* a plain line was printed: the end prints the last one */
    char label[32];
    uint64_t total, done;
    double t_start_s, t_drawn_s; /* monotonic seconds */
} progress;

void progress_begin(progress *p, const char *label, uint64_t total, bool allowed);
void progress_update(progress *p, uint64_t done); /* redraws at most 10 times a second */
void progress_end(progress *p);                   /* final line, then a newline */

double moesim_monotonic_s(void); /* seconds on CLOCK_MONOTONIC, for rates and benchmarks */

#endif
