/* Progress on stderr: a bar on a terminal, plain lines elsewhere; see progress.h. */
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
    p->enabled = allowed;
    p->tty = isatty(STDERR_FILENO);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total;
    p->t_start_s = p->t_drawn_s = moesim_monotonic_s();
}

static void draw(progress *p, double now) {
    enum { WIDTH = 30 };
    double elapsed = now - p->t_start_s;
    double rate = elapsed > 0 ? (double)p->done / elapsed : 0.0;
    if (!p->total) { /* unknown total: how far, how fast */
        fprintf(stderr, p->tty ? "\r%-12s %llu  %.3g/s  %.0fs   " : "%s: %llu, %.3g/s, %.0f s\n",
                p->label, (unsigned long long)p->done, rate, elapsed);
        fflush(stderr);
        return;
    }
    double frac = (double)p->done / (double)p->total;
    if (frac > 1.0) frac = 1.0;
    double eta = rate > 0 && p->total > p->done ? (double)(p->total - p->done) / rate : 0.0;
    if (!p->tty) {
        fprintf(stderr, "%s: %llu/%llu (%.0f%%), %.3g/s, %.0f s, ETA %.0f s\n", p->label,
                (unsigned long long)p->done, (unsigned long long)p->total, 100.0 * frac, rate,
                elapsed, eta);
        fflush(stderr);
        return;
    }
    int filled = (int)(frac * WIDTH);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\r%-12s [%s] %llu/%llu  %.3g/s  ETA %.0fs   ", p->label, bar,
            (unsigned long long)p->done, (unsigned long long)p->total, rate, eta);
    fflush(stderr);
}

void progress_update(progress *p, uint64_t done) {
    p->done = done;
    if (!p->enabled) return;
    double now = moesim_monotonic_s();
    if (now - p->t_drawn_s < (p->tty ? 0.1 : PROGRESS_LINE_S)) return;
    p->t_drawn_s = now;
    p->line_shown = true;
    draw(p, now);
}

void progress_end(progress *p) {
    if (!p->enabled || (!p->tty && !p->line_shown)) return;
    draw(p, moesim_monotonic_s());
    if (p->tty) fputc('\n', stderr);
}
