/* Trace I/O speed: writes and reads a Qwen3-30B-A3B-shaped trace (48 MoE layers, 128 experts,
 * top-8) of 10^5 tokens, without and with look-ahead (D = 3, K' = 16), and prints the time,
 * MB/s of uncompressed data, records/s (one record = one token x layer) and the file size; also
 * the speed of trace_check alone (values/s).
 *
 * Usage: bench_trace_io [n_tokens [folder]]   (defaults: 100000, $TMPDIR or /tmp)
 *
 * The routing is skewed and temporally correlated like real traces (a per-layer Zipf-like
 * popularity and a 30% chance of keeping the previous token's choice), so the compression
 * ratio is representative rather than that of uniform noise or of constants. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/rng.h"
#include "traces/trace.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Draws an expert with popularity ~ 1 / (rank + 4) under a per-layer permutation. */
static uint16_t draw_expert(rng *r, const uint16_t *perm, const double *cdf, uint32_t E) {
    double u = rng_uniform(r);
    uint32_t lo = 0, hi = E - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return perm[lo];
}

static trace *make_qwen3_trace(uint64_t n_tokens, uint32_t D, uint32_t Kp, uint64_t seed) {
    enum { L = 48, E = 128, K = 8, REQ_TOKENS = 1000, PROMPT = 200 };
    trace_meta m = {0};
    snprintf(m.model, sizeof m.model, "qwen3-30b-a3b");
    snprintf(m.source, sizeof m.source, "bench:%" PRIu64, seed);
    snprintf(m.tool_version, sizeof m.tool_version, "%s", MOESIM_VERSION);
    m.n_layers = L;
    m.n_experts = E;
    m.top_k = K;
    m.gate_norm = GATE_SOFTMAX_TOPK;
    for (uint32_t l = 0; l < L; l++) m.model_layer[l] = l;
    m.lookahead_depth = D;
    m.lookahead_k = Kp;
    m.has_importance = true;
    trace *t = trace_create(&m, n_tokens);
    rng *r = rng_create(seed);
    uint16_t perm[L][E];
    double cdf[E], sum = 0, acc = 0;
    for (uint32_t e = 0; e < E; e++) sum += 1.0 / (e + 4.0);
    for (uint32_t e = 0; e < E; e++) cdf[e] = (acc += 1.0 / (e + 4.0) / sum);
    cdf[E - 1] = 1.0;
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t e = 0; e < E; e++) perm[l][e] = (uint16_t)e;
        for (uint32_t e = E - 1; e > 0; e--) {
            uint32_t j = (uint32_t)rng_below(r, e + 1);
            uint16_t x = perm[l][e];
            perm[l][e] = perm[l][j];
            perm[l][j] = x;
        }
    }
    for (uint64_t i = 0; i < n_tokens; i++) {
        t->request_id[i] = (uint32_t)(i / REQ_TOKENS);
        t->position[i] = (uint32_t)(i % REQ_TOKENS);
        t->phase[i] = t->position[i] < PROMPT ? TRACE_PREFILL : TRACE_DECODE;
        for (uint32_t l = 0; l < L; l++) {
            uint16_t *ids = t->expert_ids + trace_route_index(t, i, l);
            float *g = t->gate_weights + trace_route_index(t, i, l);
            const uint16_t *prev = i ? ids - (size_t)L * K : NULL;
            float gsum = 0;
            for (uint32_t j = 0; j < K; j++) {
                uint16_t e;
                bool dup;
                do {
                    e = prev && rng_uniform(r) < 0.3 ? prev[j] : draw_expert(r, perm[l], cdf, E);
                    dup = false;
                    for (uint32_t a = 0; a < j; a++) dup |= ids[a] == e;
                } while (dup);
                ids[j] = e;
                g[j] = (float)(1.0 / (j + 1.0) * (0.5 + rng_uniform(r)));
                gsum += g[j];
            }
            for (uint32_t j = 0; j < K; j++) g[j] /= gsum;
            t->importance[i * L + l] = (float)rng_uniform(r);
            for (uint32_t d = 1; d <= D; d++) {
                size_t x = trace_lookahead_index(t, i, l, d);
                for (uint32_t c = 0; c < Kp; c++) {
                    bool pad = l + d >= L;
                    t->lookahead_ids[x + c] =
                        pad ? TRACE_NO_EXPERT : draw_expert(r, perm[l + d < L ? l + d : 0], cdf, E);
                    t->lookahead_scores[x + c] =
                        pad ? 0.0f : (float)(4.0 - c * 0.2 - rng_uniform(r));
                }
            }
        }
    }
    rng_destroy(r);
    moesim_error err = {0};
    if (trace_finish(t, "bench trace", &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return t;
}

static void run(uint64_t n_tokens, uint32_t D, uint32_t Kp, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_trace_io-%d.h5", dir, (int)getpid());
    trace *t = make_qwen3_trace(n_tokens, D, Kp, 42);
    double raw_mb = (double)trace_bytes_per_token(&t->meta) * (double)n_tokens / 1e6;
    double records = (double)n_tokens * t->meta.n_layers;
    uint64_t values = n_tokens * (3 + t->meta.n_layers + 2 * trace_route_values(&t->meta) +
                                  2 * trace_lookahead_values(&t->meta));
    moesim_error err = {0};

    double t0 = now_s();
    if (trace_check(t, "bench trace", &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    double check_s = now_s() - t0;

    t0 = now_s();
    if (trace_write(t, path, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    double write_s = now_s() - t0;
    struct stat sb;
    stat(path, &sb);

    trace *back = NULL;
    t0 = now_s();
    if (trace_read(path, &back, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    double read_s = now_s() - t0;
    int same = memcmp(back->expert_ids, t->expert_ids,
                      n_tokens * trace_route_values(&t->meta) * sizeof(uint16_t)) == 0;
    printf("tokens %" PRIu64 ", L 48, E 128, k 8, look-ahead D %u K' %u: %.1f MB raw, file %.1f MB "
           "(%.2fx)%s\n",
           n_tokens, D, Kp, raw_mb, (double)sb.st_size / 1e6, raw_mb * 1e6 / (double)sb.st_size,
           same ? "" : "  ROUND TRIP MISMATCH");
    printf("  check  %7.3f s  %8.0f M values/s\n", check_s, (double)values / check_s / 1e6);
    printf("  write  %7.3f s  %8.1f MB/s  %8.2f M records/s (includes check, fsync)\n", write_s,
           raw_mb / write_s, records / write_s / 1e6);
    printf("  read   %7.3f s  %8.1f MB/s  %8.2f M records/s (includes check)\n", read_s,
           raw_mb / read_s, records / read_s / 1e6);
    fflush(stdout);
    trace_destroy(back);
    trace_destroy(t);
    unlink(path);
}

int main(int argc, char **argv) {
    uint64_t n_tokens = argc > 1 ? strtoull(argv[1], NULL, 10) : 100000;
    const char *dir = argc > 2 ? argv[2] : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    if (n_tokens == 0) {
        fprintf(stderr, "usage: bench_trace_io [n_tokens [folder]]\n");
        return 2;
    }
    run(n_tokens, 0, 0, dir);
    run(n_tokens, 3, 16, dir);
    return 0;
}
