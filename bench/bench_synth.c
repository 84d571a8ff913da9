/* Throughput of the trace synthesizer (synth_generate) on one core: token x layer records per
 * second for a Qwen3-30B-A3B trace of 10^5 tokens (100 requests of 500 prefill + 500 decode
 * tokens, 48 layers, top-8 of 128), with the default look-ahead (D = 3, K' = 16) and without
 * it. The time covers everything synth_generate does: tables, the request plan, allocating the
 * trace, routing, gates, importance, look-ahead, and the final trace_check. Target: >= 5 M
 * records/s. Each case runs BENCH_REPEATS times; the best and the median are printed.
 * Usage: bench_synth [tokens [depth]] (tokens: default 100000, a multiple of 1000; depth: run
 * only that look-ahead depth, for profiling). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/model.h"
#include "common/progress.h"
#include "traces/synth.h"

#define BENCH_REPEATS        3
#define BENCH_REQUEST_TOKENS 1000 /* 500 prefill + 500 decode */

/* CPU seconds of this process (user + system: page faults count), for a contended machine. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    uint64_t tokens = argc > 1 ? strtoull(argv[1], NULL, 10) : 100000;
    if (tokens < BENCH_REQUEST_TOKENS || tokens % BENCH_REQUEST_TOKENS) {
        fprintf(stderr, "bench_synth: tokens must be a positive multiple of %d\n",
                BENCH_REQUEST_TOKENS);
        return 2;
    }
    moesim_error err = {0};
    model_geometry m;
    if (model_load_by_name("qwen3-30b-a3b", &m, &err)) {
        fprintf(stderr, "bench_synth: %s\n", err.msg);
        return 2;
    }
    uint32_t depths[2] = {3, 0}, n_cases = 2;
    if (argc > 2) depths[0] = (uint32_t)strtoul(argv[2], NULL, 10), n_cases = 1;
    for (uint32_t c = 0; c < n_cases; c++) {
        synth_options o;
        synth_options_default(&o, &m);
        o.n_requests = (uint32_t)(tokens / BENCH_REQUEST_TOKENS);
        o.prompt_len = (synth_range){500, 500};
        o.gen_len = (synth_range){500, 500};
        o.lookahead_depth = depths[c];
        double rate[BENCH_REPEATS], cpu_rate[BENCH_REPEATS];
        uint64_t records = 0;
        for (int r = 0; r < BENCH_REPEATS; r++) {
            trace *t = NULL;
            double t0 = moesim_monotonic_s(), c0 = cpu_s();
            if (synth_generate(&m, &o, &t, &err)) {
                fprintf(stderr, "bench_synth: %s\n", err.msg);
                return 2;
            }
            double dt = moesim_monotonic_s() - t0, dc = cpu_s() - c0;
            records = t->n_tokens * t->meta.n_layers;
            rate[r] = (double)records / dt;
            cpu_rate[r] = (double)records / dc;
            trace_destroy(t);
        }
        qsort(rate, BENCH_REPEATS, sizeof *rate, cmp_double);
        qsort(cpu_rate, BENCH_REPEATS, sizeof *cpu_rate, cmp_double);
        printf("synth %s, %" PRIu64 " tokens, look-ahead D=%u K'=%u: %" PRIu64
               " records: best %.2f M records/s, median %.2f (wall); best %.2f M records per CPU"
               "-second (target >= 5)\n",
               m.name, tokens, o.lookahead_depth, o.lookahead_depth ? o.lookahead_k : 0, records,
               rate[BENCH_REPEATS - 1] / 1e6, rate[BENCH_REPEATS / 2] / 1e6,
               cpu_rate[BENCH_REPEATS - 1] / 1e6);
    }
    return 0;
}
