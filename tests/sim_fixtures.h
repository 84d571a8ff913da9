/* Shared fixtures of the simulator tests and benchmark: a hand-made model geometry and hardware
 * profile with round numbers (so closed-form times are easy to write down), and random router
 * traces built in memory with trace_create (no dependence on the synthesizer). Header-only:
 * every function is static. */
#ifndef MOESIM_TESTS_SIM_FIXTURES_H
#define MOESIM_TESTS_SIM_FIXTURES_H

#include <stdio.h>
#include <string.h>

#include "common/hash.h"
#include "common/hw.h"
#include "common/model.h"
#include "policies/policy.h"
#include "traces/trace.h"

/* A small GQA MoE model: `layers` MoE layers of `experts` experts, top-k, hidden 1024, expert
 * width 512 (one bf16 expert = 3 * 1024 * 512 * 2 = 3 MiB), vocabulary 1000. */
static inline model_geometry fixture_model(uint32_t layers, uint32_t experts, uint32_t top_k) {
    model_geometry m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "fixture");
    snprintf(m.family, sizeof m.family, "fixture");
    m.n_layers = layers;
    m.n_moe_layers = layers;
    for (uint32_t l = 0; l < layers; l++) m.is_moe_layer[l] = true;
    m.hidden = 1024;
    m.vocab = 1000;
    m.n_experts = experts;
    m.top_k = top_k;
    m.expert_inter = 512;
    m.gate_norm = GATE_SOFTMAX_TOPK;
    m.attention = ATTENTION_GQA;
    m.n_heads = 8;
    m.n_kv_heads = 2;
    m.head_dim = 128;
    m.rope_theta = 10000;
    return m;
}

/* Round numbers: PCIe 1 GB/s (1 byte per ns) with 10 us per transfer, SSD 0.5 GB/s with
 * 50 us, 1 GiB of HBM, plenty of DRAM. */
static inline hw_profile fixture_hw(void) {
    hw_profile h;
    memset(&h, 0, sizeof h);
    snprintf(h.name, sizeof h.name, "fixture");
    snprintf(h.gpu, sizeof h.gpu, "fixture gpu");
    h.hbm_bytes = 1ull << 30;
    h.hbm_bytes_per_s = 1e12;
    h.bf16_flops_per_s = 1e14;
    h.int8_ops_per_s = 2e14;
    h.hbm_efficiency = 0.8;
    h.compute_efficiency = 0.5;
    h.kernel_launch_ns = 2000;
    h.h2d_bytes_per_s = 1e9;
    h.d2h_bytes_per_s = 1e9;
    h.h2d_latency_ns = 10000;
    h.d2h_latency_ns = 10000;
    h.copy_engines = 2;
    h.dram_bytes = 64ull << 30;
    h.dram_bytes_per_s = 2e10;
    h.ssd_read_bytes_per_s = 5e8;
    h.ssd_latency_ns = 50000;
    h.gpu_direct_storage = false;
    return h;
}

/* Parts in `mask` of (layer, expert, prec) not resident in `mem`: what an expert op starting
 * now would read before its copy landed (the on_expert_start checks of sim and replay tests). */
static inline uint32_t fixture_parts_not_resident(policy_mem_view mem, uint32_t layer,
                                                  uint32_t expert, moesim_precision prec,
                                                  uint32_t mask) {
    uint32_t n = 0;
    for (int part = 0; part < PART_COUNT; part++)
        n += (mask & (1u << part)) &&
             mem.ops->state(mem.mem, layer, expert, prec, (expert_part)part) != POLICY_RESIDENT;
    return n;
}

/* Deterministic uniform in [0, 1) from a counter. */
static inline double fixture_u01(uint64_t *state) {
    *state = hash_splitmix64(*state);
    return (double)(*state >> 11) * 0x1.0p-53;
}

/* A random trace of `n_req` requests, each `prompt` prefill tokens then `decode` decode
 * tokens, requests one after the other. Routing is skewed (expert e drawn with weight
 * 1 / (1 + e)^skew) with distinct experts per token; gates decrease with the slot. */
static inline trace *fixture_trace(const model_geometry *m, uint32_t n_req, uint32_t prompt,
                                   uint32_t decode, double skew, uint64_t seed) {
    trace_meta meta;
    memset(&meta, 0, sizeof meta);
    trace_meta_from_model(&meta, m);
    snprintf(meta.source, sizeof meta.source, "test:%llu", (unsigned long long)seed);
    snprintf(meta.tool_version, sizeof meta.tool_version, "test");
    uint64_t n = (uint64_t)n_req * (prompt + decode);
    trace *t = trace_create(&meta, n);
    uint32_t L = m->n_moe_layers, E = m->n_experts, K = m->top_k;
    double w[MODEL_MAX_EXPERTS], total = 0;
    for (uint32_t e = 0; e < E; e++) {
        w[e] = 1.0;
        for (double s = 0; s < skew; s += 1.0) w[e] /= (1.0 + e);
        total += w[e];
    }
    uint64_t st = seed * 0x9e3779b97f4a7c15ull + 1;
    uint64_t i = 0;
    for (uint32_t r = 0; r < n_req; r++)
        for (uint32_t p = 0; p < prompt + decode; p++, i++) {
            t->request_id[i] = r;
            t->position[i] = p;
            t->phase[i] = p < prompt ? TRACE_PREFILL : TRACE_DECODE;
            for (uint32_t l = 0; l < L; l++) {
                uint16_t *ex = t->expert_ids + trace_route_index(t, i, l);
                float *g = t->gate_weights + trace_route_index(t, i, l);
                float gsum = 0;
                for (uint32_t k = 0; k < K; k++) {
                    uint16_t pick;
                    for (;;) {
                        double u = fixture_u01(&st) * total, acc = 0;
                        pick = (uint16_t)(E - 1);
                        for (uint32_t e = 0; e < E; e++) {
                            acc += w[e];
                            if (u < acc) {
                                pick = (uint16_t)e;
                                break;
                            }
                        }
                        bool dup = false;
                        for (uint32_t j = 0; j < k; j++) dup |= ex[j] == pick;
                        if (!dup) break;
                    }
                    ex[k] = pick;
                    g[k] = (float)(K - k);
                    gsum += g[k];
                }
                for (uint32_t k = 0; k < K; k++) g[k] /= gsum;
            }
        }
    moesim_error err = {0};
    if (trace_finish(t, "fixture trace", &err)) {
        fprintf(stderr, "fixture trace: %s\n", err.msg);
        trace_destroy(t);
        return NULL;
    }
    return t;
}

#endif
