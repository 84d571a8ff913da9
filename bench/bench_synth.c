/* Throughput of the trace synthesizer on one core: token x layer records per second for a
 * Qwen3-30B-A3B trace of 10^5 tokens (100 requests of 500 prefill + 500 decode tokens, 48
 * layers, top-8 of 128), with the default look-ahead (D = 3, K' = 16) and without it.
 * Target: >= 5 M records/s (a 10^7-token trace in seconds).
 *
 * Three ways to run the generator, each timed end to end (tables, request plan, allocation,
 * routing, gates, importance, look-ahead):
 *   - stream:  synth_stream into a sink that takes each block and drops it: generation as
 *              `moesim trace synth -o` runs it (one request-sized window, reused), without the
 *              file writer's checks and compression;
 *   - memory:  synth_generate, the whole trace in memory (`--report`, tests, library users):
 *              adds first-touch page faults for the whole trace (1.9 GB with look-ahead);
 *   - file:    synth_write to a file in $TMPDIR (or /tmp): the whole command, including the
 *              block checks and shuffle + deflate on up to 8 threads (wall clock, one run).
 * CPU time is process CPU time (user + system: page faults count); wall time is also printed
 * because the machine may be shared. Each in-process case runs BENCH_REPEATS times; the best
 * and the median are printed.
 * Usage: bench_synth [tokens [depth]] (tokens: default 100000, a multiple of 1000; depth: run
 * only that look-ahead depth, for profiling). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

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

static moesim_status drop_begin(void *ctx, const trace_meta *meta, uint64_t n_tokens,
                                uint32_t n_requests, const char *params_json, moesim_error *err) {
    (void)ctx, (void)meta, (void)n_tokens, (void)n_requests, (void)params_json, (void)err;
    return MOESIM_OK;
}

/* Counts the records handed over (so the run is checked to cover every token). */
static moesim_status drop_block(void *ctx, const trace *block, moesim_error *err) {
    (void)err;
    *(uint64_t *)ctx += block->n_tokens * block->meta.n_layers;
    return MOESIM_OK;
}

typedef enum { RUN_STREAM, RUN_MEMORY, RUN_FILE } run_kind;
static const char *const run_names[] = {"stream", "memory", "file"};

/* One run of `kind`; returns the records generated (0 on failure, message printed). */
static uint64_t run_once(run_kind kind, const model_geometry *m, const synth_options *o,
                         const char *path) {
    moesim_error err = {0};
    uint64_t records = 0;
    moesim_status st = MOESIM_OK;
    if (kind == RUN_STREAM) {
        const synth_sink sink = {drop_begin, drop_block, &records};
        st = synth_stream(m, o, &sink, &err);
    } else if (kind == RUN_MEMORY) {
        trace *t = NULL;
        st = synth_generate(m, o, &t, &err);
        if (!st) records = t->n_tokens * t->meta.n_layers;
        trace_destroy(t);
    } else {
        st = synth_write(m, o, path, &err);
        if (!st) records = (uint64_t)o->n_requests * BENCH_REQUEST_TOKENS * m->n_moe_layers;
        unlink(path);
    }
    if (st) fprintf(stderr, "bench_synth: %s\n", err.msg);
    return st ? 0 : records;
}

static int bench_case(run_kind kind, const model_geometry *m, const synth_options *o,
                      uint64_t tokens, const char *path) {
    const int repeats = kind == RUN_FILE ? 1 : BENCH_REPEATS;
    double rate[BENCH_REPEATS], cpu_rate[BENCH_REPEATS];
    uint64_t records = 0;
    for (int r = 0; r < repeats; r++) {
        double t0 = moesim_monotonic_s(), c0 = cpu_s();
        records = run_once(kind, m, o, path);
        double dt = moesim_monotonic_s() - t0, dc = cpu_s() - c0;
        if (!records) return 2;
        rate[r] = (double)records / dt;
        cpu_rate[r] = (double)records / dc;
    }
    qsort(rate, (size_t)repeats, sizeof *rate, cmp_double);
    qsort(cpu_rate, (size_t)repeats, sizeof *cpu_rate, cmp_double);
    printf("synth %-6s %s, %" PRIu64 " tokens, look-ahead D=%u K'=%u: %" PRIu64
           " records: best %.2f M records per CPU-second; wall best %.2f M/s, median %.2f\n",
           run_names[kind], m->name, tokens, o->lookahead_depth,
           o->lookahead_depth ? o->lookahead_k : 0, records, cpu_rate[repeats - 1] / 1e6,
           rate[repeats - 1] / 1e6, rate[repeats / 2] / 1e6);
    return 0;
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
    const char *tmp = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_synth_%ld.h5", tmp && *tmp ? tmp : "/tmp",
             (long)getpid());
    uint32_t depths[2] = {3, 0}, n_depths = 2;
    if (argc > 2) depths[0] = (uint32_t)strtoul(argv[2], NULL, 10), n_depths = 1;
    printf("target: >= 5 M token x layer records/s on one core (stream and memory run on one\n"
           "thread; file compresses on up to 8)\n");
    for (run_kind kind = RUN_STREAM; kind <= RUN_FILE; kind++)
        for (uint32_t c = 0; c < n_depths; c++) {
            synth_options o;
            synth_options_default(&o, &m);
            o.n_requests = (uint32_t)(tokens / BENCH_REQUEST_TOKENS);
            o.prompt_len = (synth_range){500, 500};
            o.gen_len = (synth_range){500, 500};
            o.lookahead_depth = depths[c];
            if (bench_case(kind, &m, &o, tokens, path)) return 2;
        }
    return 0;
}
