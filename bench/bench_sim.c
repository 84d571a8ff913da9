/* Simulator throughput: routed (token, layer, expert) activations per second of sim_run on one
 * core, for `lru` (per-layer, bf16, the default budget) on a Qwen3-30B-A3B-shaped trace (48 MoE
 * layers, 128 experts, top-8) on the rtx3090-pcie4 profile, timeline off. Target: >= 2 M/s.
 * Also prints `ondemand` for contrast (every activation is a copy), and the memory the
 * simulator allocates per 10^6 tokens (its own state; the trace's arrays separately).
 *
 * The trace: 16 requests of 32 prompt + 1000 decode tokens, run with batch.size = 4; routing
 * skewed (popularity ~ 1/rank^1.1, ranks shuffled per layer) with consecutive-token reuse (each
 * slot repeats the previous token's expert with probability 0.3), no look-ahead (so the
 * emulated predictor runs too). Usage: bench_sim [tokens_per_request]. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "common/rng.h"
#include "sim/sim.h"
#include "traces/trace.h"

#define BENCH_REQUESTS 16
#define BENCH_PROMPT   32
#define BENCH_REUSE_P  0.3
#define BENCH_ZIPF     1.1

/* CPU time of this process: the machine is shared, so wall time would count other jobs. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Requests one after the other; per layer a shuffled Zipf popularity; top-k distinct. */
static trace *bench_trace(const model_geometry *m, uint32_t per_request) {
    trace_meta meta;
    memset(&meta, 0, sizeof meta);
    trace_meta_from_model(&meta, m);
    snprintf(meta.source, sizeof meta.source, "bench_sim");
    uint64_t n = (uint64_t)BENCH_REQUESTS * per_request;
    trace *t = trace_create(&meta, n);
    uint32_t L = m->n_moe_layers, E = m->n_experts, K = m->top_k;
    rng *r = rng_create(42);
    double *cdf = moesim_xmalloc((size_t)L * E * sizeof *cdf);
    uint16_t *perm = moesim_xmalloc((size_t)L * E * sizeof *perm);
    for (uint32_t l = 0; l < L; l++) {
        double acc = 0;
        for (uint32_t e = 0; e < E; e++) {
            acc += 1.0 / pow(e + 1.0, BENCH_ZIPF);
            cdf[(size_t)l * E + e] = acc;
            perm[(size_t)l * E + e] = (uint16_t)e;
        }
        for (uint32_t e = 0; e < E; e++) cdf[(size_t)l * E + e] /= acc;
        for (uint32_t e = E - 1; e > 0; e--) {
            uint32_t j = (uint32_t)rng_below(r, e + 1);
            uint16_t tmp = perm[(size_t)l * E + e];
            perm[(size_t)l * E + e] = perm[(size_t)l * E + j];
            perm[(size_t)l * E + j] = tmp;
        }
    }
    uint64_t i = 0;
    for (uint32_t q = 0; q < BENCH_REQUESTS; q++)
        for (uint32_t p = 0; p < per_request; p++, i++) {
            t->request_id[i] = q;
            t->position[i] = p;
            t->phase[i] = p < BENCH_PROMPT ? TRACE_PREFILL : TRACE_DECODE;
            for (uint32_t l = 0; l < L; l++) {
                uint16_t *ex = t->expert_ids + trace_route_index(t, i, l);
                float *g = t->gate_weights + trace_route_index(t, i, l);
                const uint16_t *prev = p ? t->expert_ids + trace_route_index(t, i - 1, l) : NULL;
                for (uint32_t k = 0; k < K; k++) {
                    uint16_t pick;
                    for (;;) {
                        if (prev && rng_uniform(r) < BENCH_REUSE_P) {
                            pick = prev[k];
                        } else {
                            double u = rng_uniform(r);
                            uint32_t lo = 0, hi = E - 1;
                            while (lo < hi) {
                                uint32_t mid = (lo + hi) / 2;
                                if (cdf[(size_t)l * E + mid] < u)
                                    lo = mid + 1;
                                else
                                    hi = mid;
                            }
                            pick = perm[(size_t)l * E + lo];
                        }
                        bool dup = false;
                        for (uint32_t j = 0; j < k; j++) dup |= ex[j] == pick;
                        if (!dup) break;
                    }
                    ex[k] = pick;
                    g[k] = 1.0f / (float)K;
                }
            }
        }
    rng_destroy(r);
    free(cdf);
    free(perm);
    moesim_error err = {0};
    if (trace_finish(t, "bench trace", &err)) {
        fprintf(stderr, "bench_sim: %s\n", err.msg);
        exit(1);
    }
    return t;
}

/* Runs `name` on t; returns the simulator's own allocation (bytes). */
static uint64_t run(const char *name, const trace *t, const model_geometry *m, const hw_profile *hw,
                    const quant_table *q, bool print) {
    config *c = config_create();
    moesim_error err = {0};
    config_set(c, "batch.size=4", &err);
    sim_inputs in = {.trace = t, .model = m, .hw = hw, .quant = q};
    sim_result r;
    double t0 = now_s(), c0 = cpu_s();
    if (sim_run(&in, name, c, &r, &err)) {
        fprintf(stderr, "bench_sim: %s\n", err.msg);
        exit(1);
    }
    double dt = now_s() - t0, dc = cpu_s() - c0;
    config_destroy(c);
    double acts = (double)t->n_tokens * m->n_moe_layers * m->top_k;
    if (print)
        printf("%-9s %8" PRIu64 " tokens  %6.2f M activations/s of CPU time (%.2f s CPU, %.2f s "
               "wall; hit rate %.1f%%, simulated %.1f tokens/s)\n",
               name, t->n_tokens, acts / dc / 1e6, dc, dt, 100.0 * r.hit_rate, r.tokens_per_s);
    return r.sim_memory_bytes;
}

int main(int argc, char **argv) {
    uint32_t per_request = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 1032;
    if (per_request <= BENCH_PROMPT) per_request = BENCH_PROMPT + 1;
    model_geometry m;
    hw_profile hw;
    quant_table q;
    moesim_error err = {0};
    if (model_load_by_name("qwen3-30b-a3b", &m, &err) ||
        hw_load_by_name("rtx3090-pcie4", &hw, &err) || quant_table_load_default(&q, &err)) {
        fprintf(stderr, "bench_sim: %s\n", err.msg);
        return 1;
    }
    trace *t = bench_trace(&m, per_request);
    printf("bench_sim: qwen3-30b-a3b shape, %u requests x %u tokens, batch 4, rtx3090-pcie4, "
           "timeline off\n",
           BENCH_REQUESTS, per_request);
    uint64_t mem_full = run("lru", t, &m, &hw, &q, true);
    run("ondemand", t, &m, &hw, &q, true);
    /* memory: the fixed part (per (layer, expert, precision, part) state) and the per-token
     * part (the schedule), from the slope between this trace and one of half the length */
    trace *half =
        bench_trace(&m, per_request / 2 > BENCH_PROMPT ? per_request / 2 : BENCH_PROMPT + 1);
    uint64_t mem_half = run("lru", half, &m, &hw, &q, false);
    double per_token = (double)(mem_full - mem_half) / (double)(t->n_tokens - half->n_tokens);
    double fixed = (double)mem_full - per_token * (double)t->n_tokens;
    printf("memory per 10^6 tokens: simulator %.1f MB (plus %.1f MB fixed); the trace's own "
           "arrays %.1f MB\n",
           per_token, fixed / 1e6, (double)trace_bytes_per_token(&t->meta));
    trace_destroy(half);
    trace_destroy(t);
    return 0;
}
