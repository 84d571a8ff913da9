/* Throughput of trace_stats_compute on large synthetic traces (>= 10^7 token-layer records):
 * prints expert accesses per second on one core for four geometries: Mixtral-8x7B
 * (32 layers, 8 experts, top-2), OLMoE-1B-7B (16 layers, 64 experts, top-8), Qwen3-30B-A3B (48
 * layers, 128 experts, top-8) and Qwen3-Next-80B-A3B (48 layers, 512 experts, top-10). Target: >=
 * 20 M accesses/s.
 *
 * The synthetic routing is skewed (popularity ~ 1/rank^1.1, ranks shuffled per layer) with
 * consecutive-token reuse (each slot repeats the previous token's expert with probability 0.3)
 * and 32 requests interleaved round-robin, 1/8 of each prefill: deep enough LRU/OPT stacks to
 * be representative, and every statistic has work to do. A second argument runs only the
 * geometry of that name. The machine may be shared: the stats
 * step reports wall time and CPU time of this process (CLOCK_PROCESS_CPUTIME_ID), and the target
 * is judged on accesses per CPU-second. Usage: bench_trace_stats [records [name]]. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/rng.h"
#include "traces/stats.h"

#define BENCH_REQUESTS 32
#define BENCH_REUSE_P  0.3
#define BENCH_ZIPF     1.1

typedef struct geometry {
    const char *name;
    uint32_t layers, experts, k;
} geometry;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of this process (user + system), for a contended machine. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static trace *bench_trace_alloc(const geometry *g, uint64_t n_tokens) {
    trace *t = moesim_xcalloc(1, sizeof *t);
    snprintf(t->meta.model, sizeof t->meta.model, "%s", g->name);
    t->meta.n_layers = g->layers;
    t->meta.n_experts = g->experts;
    t->meta.top_k = g->k;
    t->n_tokens = n_tokens;
    t->request_id = moesim_xcalloc(n_tokens, sizeof *t->request_id);
    t->position = moesim_xcalloc(n_tokens, sizeof *t->position);
    t->phase = moesim_xcalloc(n_tokens, sizeof *t->phase);
    t->expert_ids = moesim_xcalloc(n_tokens * g->layers * g->k, sizeof *t->expert_ids);
    t->gate_weights = moesim_xcalloc(n_tokens * g->layers * g->k, sizeof *t->gate_weights);
    return t;
}

static void bench_trace_free(trace *t) {
    free(t->request_id);
    free(t->position);
    free(t->phase);
    free(t->expert_ids);
    free(t->gate_weights);
    free(t);
}

/* Index of the first cdf entry > u (binary search). */
static uint32_t draw(const double *cdf, uint32_t n, double u) {
    uint32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (cdf[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static trace *bench_trace_make(const geometry *g, uint64_t n_tokens, uint64_t seed) {
    trace *t = bench_trace_alloc(g, n_tokens);
    const uint32_t L = g->layers, E = g->experts, k = g->k;
    uint64_t per_req = n_tokens / BENCH_REQUESTS + 1;
    for (uint64_t i = 0; i < n_tokens; i++) {
        uint32_t r = (uint32_t)(i % BENCH_REQUESTS);
        t->request_id[i] = r;
        t->position[i] = (uint32_t)(i / BENCH_REQUESTS);
        t->phase[i] = t->position[i] < per_req / 8 ? TRACE_PREFILL : TRACE_DECODE;
    }
    t->n_requests = n_tokens < BENCH_REQUESTS ? (uint32_t)n_tokens : BENCH_REQUESTS;
    rng *r = rng_create(seed);
    double *cdf = moesim_xcalloc((size_t)L * E, sizeof *cdf);
    uint32_t *perm = moesim_xcalloc(E, sizeof *perm);
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t e = 0; e < E; e++) perm[e] = e;
        for (uint32_t e = E; e-- > 1;) { /* Fisher-Yates: which expert holds which rank */
            uint32_t x = (uint32_t)rng_below(r, e + 1), tmp = perm[e];
            perm[e] = perm[x];
            perm[x] = tmp;
        }
        double total = 0, acc = 0;
        for (uint32_t e = 0; e < E; e++) total += pow((double)perm[e] + 1.0, -BENCH_ZIPF);
        for (uint32_t e = 0; e < E; e++)
            cdf[(size_t)l * E + e] = (acc += pow((double)perm[e] + 1.0, -BENCH_ZIPF) / total);
        cdf[(size_t)l * E + E - 1] = 2.0; /* rounding: every u < 1 lands somewhere */
    }
    for (uint64_t i = 0; i < n_tokens; i++) {
        uint64_t prev = i >= BENCH_REQUESTS ? i - BENCH_REQUESTS : UINT64_MAX; /* same request */
        for (uint32_t l = 0; l < L; l++) {
            uint16_t *ids = t->expert_ids + trace_route_index(t, i, l);
            float *gates = t->gate_weights + trace_route_index(t, i, l);
            const uint16_t *pids = prev != UINT64_MAX ? trace_experts(t, prev, l) : NULL;
            for (uint32_t j = 0; j < k;) {
                uint16_t e = pids && rng_uniform(r) < BENCH_REUSE_P
                                 ? pids[j]
                                 : (uint16_t)draw(cdf + (size_t)l * E, E, rng_uniform(r));
                bool dup = false;
                for (uint32_t x = 0; x < j; x++) dup |= ids[x] == e;
                if (dup) continue;
                ids[j] = e;
                gates[j] = 1.0f / (float)(j + 2);
                j++;
            }
        }
    }
    free(perm);
    free(cdf);
    rng_destroy(r);
    return t;
}

int main(int argc, char **argv) {
    uint64_t records = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000000ull;
    static const geometry geometries[] = {
        {"mixtral-8x7b", 32, 8, 2},
        {"olmoe-1b-7b", 16, 64, 8},
        {"qwen3-30b-a3b", 48, 128, 8},
        {"qwen3-next-80b", 48, 512, 10},
    };
    printf("trace stats: one core, >= %" PRIu64 " token-layer records per trace\n", records);
    for (size_t g = 0; g < sizeof geometries / sizeof geometries[0]; g++) {
        const geometry *geo = &geometries[g];
        if (argc > 2 && strcmp(argv[2], geo->name) != 0) continue;
        uint64_t n_tokens = (records + geo->layers - 1) / geo->layers;
        double t0 = now_s();
        trace *t = bench_trace_make(geo, n_tokens, 42);
        double t1 = now_s(), c1 = cpu_s();
        trace_stats *s = trace_stats_compute(t);
        double t2 = now_s(), c2 = cpu_s();
        json_t *j = trace_stats_to_json(s);
        char *text = json_dumps(j, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        double t3 = now_s();
        double rate = (double)s->accesses / (t2 - t1), cpu_rate = (double)s->accesses / (c2 - c1);
        printf("%-14s L=%u E=%u k=%u: %" PRIu64 " records, %" PRIu64
               " accesses; generate %.2f s, stats %.3f s wall = %.1f M accesses/s, %.3f CPU-s = "
               "%.1f M accesses per CPU-second (%s 20 M target); json %.3f s (%zu bytes)\n",
               geo->name, geo->layers, geo->experts, geo->k, n_tokens * geo->layers, s->accesses,
               t1 - t0, t2 - t1, rate / 1e6, c2 - c1, cpu_rate / 1e6,
               cpu_rate >= 20e6 ? "meets" : "MISSES", t3 - t2, strlen(text));
        uint32_t cap = 2 * geo->k < geo->experts ? 2 * geo->k : geo->experts;
        printf("%-14s LRU/OPT hit rate at 2k = %u experts: %.4f / %.4f (LRU per slot %.4f), "
               "reuse distance %.2f, active share B=1/8/32: %.3f/%.3f/%.3f\n",
               "", cap, s->lru_hit_rate[cap], s->opt_hit_rate[cap], s->lru_slot_hit_rate[cap],
               s->mean_reuse_distance, s->active_share[0], s->active_share[3], s->active_share[5]);
        free(text);
        json_decref(j);
        trace_stats_destroy(s);
        bench_trace_free(t);
    }
    return 0;
}
