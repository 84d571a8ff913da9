/* Terminal progress bar; see progress.h. */
#include "common/progress.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double moesim_monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void progress_begin(progress *p, const char *label, uint64_t total, bool allowed) {
    memset(p, 0, sizeof *p);
    p->enabled = allowed && isatty(STDERR_FILENO);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->t_start_s = p->t_drawn_s = moesim_monotonic_s();
}

static void draw(progress *p, double now) {
    enum { WIDTH = 30 };
    double frac = p->total ? (double)p->done / (double)p->total : 0.0;
    if (frac > 1.0) frac = 1.0;
    int filled = (int)(frac * WIDTH);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    double elapsed = now - p->t_start_s;
    double rate = elapsed > 0 ? (double)p->done / elapsed : 0.0;
    double eta = rate > 0 ? (double)(p->total - p->done) / rate : 0.0;
    fprintf(stderr, "\r%-12s [%s] %llu/%llu  %.3g/s  ETA %.0fs   ", p->label, bar,
            (unsigned long long)p->done, (unsigned long long)p->total, rate, eta);
    fflush(stderr);
}

void progress_update(progress *p, uint64_t done) {
    p->done = done;
    if (!p->enabled) return;
    double now = moesim_monotonic_s();
    if (now - p->t_drawn_s < 0.1) return;
    p->t_drawn_s = now;
    draw(p, now);
}

void progress_end(progress *p) {
    if (!p->enabled) return;
    draw(p, moesim_monotonic_s());
    fputc('\n', stderr);
}
