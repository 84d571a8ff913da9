/* Throughput of `moesim trace import` and `trace export` on large synthetic logs (>= 10^7
 * token-layer records): for Mixtral-8x7B (32 layers, 8 experts, top-2) and Qwen3-30B-A3B
 * (48 layers, 128 experts, top-8) geometries, builds a trace in memory (random routing, random
 * float gates that need 9 digits, 32 requests interleaved, 1/8 of each prefill), exports it as
 * JSONL and CSV to a scratch file (timed: export), imports each back with trace_import_file
 * (timed: import = read, scan, check every value, group, build and trace_check the trace), and
 * checks that the arrays came back bit for bit. Then writes the same records layer-major (all
 * tokens of layer 0, then layer 1, ...: the order of a logger hooked on each layer's router
 * during one batched forward pass, and the worst case for the grouping, which revisits every
 * token once per layer) as JSONL and imports that too, checking the same arrays. Prints records per
 * CPU second (one thread; wall time beside it, which on a shared machine includes waiting for a
 * core); target: import
 * >= 1 M records/s on one core. Usage: bench_trace_import [records] [scratch dir (default $TMPDIR
 * or /tmp)]. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/model.h"
#include "common/progress.h"
#include "common/rng.h"
#include "traces/convert.h"
#include "traces/trace.h"

#define BENCH_REQUESTS 32

/* CPU seconds of this process: on a shared machine, the one-core figure (wall time is printed
 * beside it). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static trace *bench_trace_make(const model_geometry *m, uint64_t n_tokens, uint64_t seed) {
    trace_meta meta = {0};
    trace_meta_from_model(&meta, m);
    snprintf(meta.source, sizeof meta.source, "synth:%" PRIu64, seed);
    trace *t = trace_create(&meta, n_tokens);
    const uint32_t L = meta.n_layers, E = meta.n_experts, k = meta.top_k;
    uint64_t per_req = n_tokens / BENCH_REQUESTS + 1;
    rng *r = rng_create(seed);
    for (uint64_t i = 0; i < n_tokens; i++) {
        t->request_id[i] = (uint32_t)(i % BENCH_REQUESTS);
        t->position[i] = (uint32_t)(i / BENCH_REQUESTS);
        t->phase[i] = t->position[i] < per_req / 8 ? TRACE_PREFILL : TRACE_DECODE;
        for (uint32_t l = 0; l < L; l++) {
            uint16_t *ids = t->expert_ids + trace_route_index(t, i, l);
            float *g = t->gate_weights + trace_route_index(t, i, l);
            double sum = 0;
            for (uint32_t j = 0; j < k;) {
                uint16_t e = (uint16_t)rng_below(r, E);
                bool dup = false;
                for (uint32_t a = 0; a < j; a++) dup |= ids[a] == e;
                if (dup) continue;
                ids[j] = e;
                g[j] = (float)(0.05 + rng_uniform(r));
                sum += g[j];
                j++;
            }
            for (uint32_t j = 0; j < k; j++) g[j] = (float)(g[j] / sum); /* sums to 1 +- 1e-6 */
        }
    }
    rng_destroy(r);
    moesim_error err = {0};
    if (trace_finish(t, "bench trace", &err)) {
        fprintf(stderr, "bench_trace_import: %s\n", err.msg);
        exit(1);
    }
    return t;
}

static bool same_arrays(const trace *a, const trace *b) {
    size_t n = a->n_tokens, rv = n * trace_route_values(&a->meta);
    return a->n_tokens == b->n_tokens && a->n_requests == b->n_requests &&
           !memcmp(a->request_id, b->request_id, n * sizeof *a->request_id) &&
           !memcmp(a->position, b->position, n * sizeof *a->position) &&
           !memcmp(a->phase, b->phase, n * sizeof *a->phase) &&
           !memcmp(a->expert_ids, b->expert_ids, rv * sizeof *a->expert_ids) &&
           !memcmp(a->gate_weights, b->gate_weights, rv * sizeof *a->gate_weights);
}

/* The records of `t` in request-shape JSONL with "phase", layer-major: layer 0 of every token
 * in trace order, then layer 1, ... (gates in "%.9g", enough for a float). */
static bool write_layer_major(const trace *t, FILE *fp) {
    const uint32_t L = t->meta.n_layers, k = t->meta.top_k;
    for (uint32_t l = 0; l < L; l++)
        for (uint64_t i = 0; i < t->n_tokens; i++) {
            const uint16_t *ids = trace_experts(t, i, l);
            const float *g = trace_gates(t, i, l);
            fprintf(fp,
                    "{\"req_id\": %" PRIu32 ", \"token_idx\": %" PRIu32 ", \"layer\": %" PRIu32
                    ", \"phase\": \"%s\", \"topk_ids\": [",
                    t->request_id[i], t->position[i], l, trace_phase_name(t->phase[i]));
            for (uint32_t j = 0; j < k; j++) fprintf(fp, "%s%u", j ? ", " : "", ids[j]);
            fputs("], \"topk_weights\": [", fp);
            for (uint32_t j = 0; j < k; j++) fprintf(fp, "%s%.9g", j ? ", " : "", (double)g[j]);
            fputs("]}\n", fp);
        }
    return !ferror(fp);
}

static int run_one(const char *model_name, uint64_t records, const char *dir) {
    model_geometry m;
    moesim_error err = {0};
    if (model_load_by_name(model_name, &m, &err)) {
        fprintf(stderr, "bench_trace_import: %s\n", err.msg);
        return 1;
    }
    uint64_t n_tokens = (records + m.n_moe_layers - 1) / m.n_moe_layers;
    uint64_t n_records = n_tokens * m.n_moe_layers;
    double t0 = moesim_monotonic_s();
    trace *t = bench_trace_make(&m, n_tokens, 42);
    printf("%-14s L=%u E=%u k=%u: %" PRIu64 " tokens, %" PRIu64 " records (generated in %.1f s)\n",
           m.name, m.n_moe_layers, m.n_experts, m.top_k, n_tokens, n_records,
           moesim_monotonic_s() - t0);
    for (int f = 0; f < 3; f++) { /* JSONL, CSV, layer-major JSONL */
        trace_text_format fmt = f == 1 ? TRACE_TEXT_CSV : TRACE_TEXT_JSONL;
        bool layer_major = f == 2;
        char path[4096];
        snprintf(path, sizeof path, "%s/bench_trace_import-%d.%s", dir, (int)getpid(),
                 trace_text_format_name(fmt));
        FILE *fp = fopen(path, "w");
        if (!fp) {
            perror(path);
            return 1;
        }
        double a = moesim_monotonic_s(), a_cpu = cpu_s();
        bool written = layer_major ? write_layer_major(t, fp)
                                   : !trace_export_write(t, fmt, fp, false, path, &err);
        if (fclose(fp) || !written) {
            fprintf(stderr, "bench_trace_import: %s: %s\n", path,
                    layer_major ? "write failed" : err.msg);
            return 1;
        }
        double b = moesim_monotonic_s(), b_cpu = cpu_s();
        struct stat sb;
        stat(path, &sb);
        trace_import_options o;
        trace_import_options_default(&o);
        o.format = fmt;
        trace *back = NULL;
        trace_import_report rep;
        double c = moesim_monotonic_s(), c_cpu = cpu_s();
        moesim_status st = trace_import_file(path, &m, &o, &back, &rep, &err);
        double d = moesim_monotonic_s(), d_cpu = cpu_s();
        unlink(path);
        if (st) {
            fprintf(stderr, "bench_trace_import: %s\n", err.msg);
            return 1;
        }
        bool exact = same_arrays(t, back);
        double import_rate = (double)rep.records / (d_cpu - c_cpu);
        if (layer_major)
            printf("  %-5s %5.0f MB layer-major (%" PRIu64 " records out of token order): import "
                   "%.2f s CPU (%.2f s wall) = %.2f M records/s, %.0f MB/s; same trace %s\n",
                   "jsonl", (double)sb.st_size / 1e6, rep.records_reordered, d_cpu - c_cpu, d - c,
                   import_rate / 1e6, (double)sb.st_size / (d_cpu - c_cpu) / 1e6,
                   exact ? "yes" : "NO");
        else
            printf("  %-5s %5.0f MB: export %.2f s CPU (%.2f s wall) = %.2f M records/s; import "
                   "%.2f s CPU (%.2f s wall) = %.2f M records/s, %.0f MB/s (%s 1 M target); "
                   "round trip %s\n",
                   trace_text_format_name(fmt), (double)sb.st_size / 1e6, b_cpu - a_cpu, b - a,
                   (double)n_records / (b_cpu - a_cpu) / 1e6, d_cpu - c_cpu, d - c,
                   import_rate / 1e6, (double)sb.st_size / (d_cpu - c_cpu) / 1e6,
                   import_rate >= 1e6 ? "meets" : "MISSES", exact ? "exact" : "DIFFERS");
        trace_destroy(back);
        if (!exact) return 1;
    }
    trace_destroy(t);
    return 0;
}

int main(int argc, char **argv) {
    uint64_t records = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000000ull;
    const char *dir = argc > 2 ? argv[2] : getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    printf("trace import/export: one core, >= %" PRIu64 " token-layer records per file\n", records);
    static const char *const models[] = {"mixtral-8x7b", "qwen3-30b-a3b"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (run_one(models[i], records, dir)) return 1;
    return 0;
}
