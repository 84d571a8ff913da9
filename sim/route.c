/* One route's active set, the FIRM-MoE prefetch accounting and the policy call with what follows
 * it, shared by the simulator and the replay executor (sim/route.h). Units: experts, tokens and
 * slots are indices; gate mass is the sum of the routed gates. */
#include "sim/route.h"

#include <stddef.h>
#include <string.h>

#include "common/model.h"
#include "policies/policy.h"
#include "sim/schedule.h"
#include "traces/trace.h"

uint32_t sim_route_active_build(const sim_route_scratch *rs, const uint16_t *experts,
                                const float *gates, uint32_t n_slots) {
    /* distinct active experts, ascending */
    uint32_t gen = ++*rs->stamp_gen;
    uint32_t n_active = 0;
    for (uint32_t i = 0; i < n_slots; i++) {
        uint16_t e = experts[i];
        if (e == TRACE_NO_EXPERT) continue;
        if (rs->stamp[e] != gen) {
            rs->stamp[e] = gen;
            rs->active[n_active++] = e;
        }
    }
    for (uint32_t i = 1; i < n_active; i++) {
        uint16_t v = rs->active[i];
        uint32_t j = i;
        while (j > 0 && rs->active[j - 1] > v) {
            rs->active[j] = rs->active[j - 1];
            j--;
        }
        rs->active[j] = v;
    }
    for (uint32_t a = 0; a < n_active; a++) {
        rs->slot[rs->active[a]] = a;
        rs->active_tokens[a] = 0;
        rs->active_gate[a] = 0;
        rs->plan[a] = POLICY_RUN_SKIP;
    }
    for (uint32_t i = 0; i < n_slots; i++) {
        if (experts[i] == TRACE_NO_EXPERT) continue;
        uint32_t a = rs->slot[experts[i]];
        rs->active_tokens[a]++;
        rs->active_gate[a] += gates[i];
    }
    return n_active;
}

void sim_route_prefetch_account(const sim_route_scratch *rs, uint32_t n_active,
                                const uint16_t *step_experts, uint32_t n_step_slots, uint8_t *mark,
                                uint32_t E, uint32_t *pf_count, uint64_t *pf_hit,
                                uint64_t *pf_active, uint64_t *pf_issued_sets) {
    if (!*pf_count) return;
    /* the prefetched set S of this layer against the activated set A */
    uint32_t both = 0, n_layer_active = 0;
    uint32_t g2 = ++*rs->stamp_gen;
    for (uint32_t i = 0; i < n_step_slots; i++) {
        uint16_t e = step_experts[i];
        if (e == TRACE_NO_EXPERT || rs->stamp[e] == g2) continue;
        rs->stamp[e] = g2;
        n_layer_active++;
        both += mark[e];
    }
    *pf_hit += both;
    *pf_active += n_layer_active;
    *pf_issued_sets += *pf_count;
    memset(mark, 0, E);
    *pf_count = 0;
    /* restore this route's slot stamps (the pass above reused the stamp array) */
    uint32_t gen = ++*rs->stamp_gen;
    for (uint32_t a = 0; a < n_active; a++) rs->stamp[rs->active[a]] = gen;
}

void sim_route_tally_accesses(const sim_route_scratch *rs, const uint16_t *experts,
                              const float *gates, uint32_t n_slots, const uint8_t *layer_state,
                              uint32_t P, const quant_table *q, uint32_t hi_bits,
                              sim_route_tally *t) {
    uint32_t gen = ++*rs->stamp_gen;
    for (uint32_t i = 0; i < n_slots; i++) {
        uint16_t e = experts[i];
        if (e == TRACE_NO_EXPERT) continue;
        uint8_t pr = rs->plan[rs->slot[e]];
        if (pr == POLICY_RUN_SKIP) {
            t->skipped++;
            t->gate_skip += gates[i];
            continue;
        }
        t->accesses++;
        const quant_format *f = &q->fmt[pr];
        double bits = f->weight_bits +
                      (f->group_size ? (double)(f->scale_bits + f->zero_bits) / f->group_size : 0);
        t->gate_bits += gates[i] * bits;
        if (q->fmt[pr].weight_bits >= hi_bits)
            t->gate_hi += gates[i];
        else
            t->gate_lo += gates[i];
        if (rs->stamp[e] == gen) { /* served by the same fetch as an earlier access */
            t->hits++;
            continue;
        }
        rs->stamp[e] = gen;
        const uint8_t *st = layer_state + ((size_t)e * P + pr) * PART_COUNT;
        bool resident = true;
        for (int part = 0; part < PART_COUNT; part++) resident &= st[part] == POLICY_RESIDENT;
        t->hits += resident;
    }
}

uint32_t sim_route_execution_order(const sim_route_scratch *rs, uint32_t n_active,
                                   const uint8_t *layer_state, uint32_t P,
                                   uint64_t (*loading_seq)(const void *host, size_t part_index),
                                   const void *host, uint32_t *order, uint64_t *order_key) {
    uint32_t n_run = 0;
    for (uint32_t a = 0; a < n_active; a++) {
        uint8_t pr = rs->plan[a];
        if (pr == POLICY_RUN_SKIP) continue;
        size_t base = ((size_t)rs->active[a] * P + pr) * PART_COUNT;
        uint64_t key = 0;
        for (int part = 0; part < PART_COUNT; part++)
            if (layer_state[base + part] == POLICY_LOADING) {
                uint64_t k = loading_seq(host, base + (size_t)part) + 1;
                if (k > key) key = k;
            }
        uint32_t j = n_run++;
        while (j > 0 && order_key[j - 1] > key) {
            order[j] = order[j - 1];
            order_key[j] = order_key[j - 1];
            j--;
        }
        order[j] = a;
        order_key[j] = key;
    }
    return n_run;
}

void sim_route_gather(const sim_route_source *src, const uint32_t *tokens, uint32_t n,
                      uint32_t layer, uint16_t *experts, float *gates, float *importance,
                      uint16_t *la_ids, float *la_scores) {
    const trace *t = src->tr;
    uint32_t K = src->K;
    size_t DK = (size_t)src->la_depth * src->la_k;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t tok = tokens[i];
        memcpy(experts + (size_t)i * K, trace_experts(t, tok, layer), K * sizeof(uint16_t));
        memcpy(gates + (size_t)i * K, trace_gates(t, tok, layer), K * sizeof(float));
        if (importance) importance[i] = t->importance[(size_t)tok * src->L + layer];
        if (!DK) continue;
        if (src->la_emulated) {
            sim_lookahead_emulate(t, src->L, src->E, K, src->la_depth, src->la_k, src->seed,
                                  src->accuracy, tok, layer, la_ids + i * DK, la_scores + i * DK);
        } else {
            size_t from = trace_lookahead_index(t, tok, layer, 1);
            memcpy(la_ids + i * DK, t->lookahead_ids + from, DK * sizeof(uint16_t));
            memcpy(la_scores + i * DK, t->lookahead_scores + from, DK * sizeof(float));
        }
    }
}

uint32_t sim_route_split(const sim_route_scratch *rs, const uint16_t *experts, uint32_t K,
                         uint32_t i0, uint32_t n, uint32_t capacity) {
    uint32_t gen = ++*rs->stamp_gen, distinct = 0, i1 = i0;
    while (i1 < n) {
        uint32_t add = 0;
        const uint16_t *row = experts + (size_t)i1 * K;
        for (uint32_t k = 0; k < K; k++)
            if (row[k] != TRACE_NO_EXPERT && rs->stamp[row[k]] != gen) add++;
        if (i1 > i0 && distinct + add > capacity) break;
        for (uint32_t k = 0; k < K; k++)
            if (row[k] != TRACE_NO_EXPERT && rs->stamp[row[k]] != gen) {
                rs->stamp[row[k]] = gen;
                distinct++;
            }
        i1++;
    }
    return i1;
}

double sim_route_tally_bits_per_weight(const sim_route_tally *t) {
    double mass = t->gate_hi + t->gate_lo + t->gate_skip;
    return mass > 0 ? t->gate_bits / mass : 0;
}

void sim_route_decide(const sim_route_host *h, const sim_route_scratch *rs, uint64_t step,
                      uint32_t layer, uint32_t i0, uint32_t i1, uint32_t n_active,
                      bool last_of_layer) {
    const uint32_t K = h->top_k, n = i1 - i0;
    const uint16_t *ex = h->experts + (size_t)i0 * K;
    const float *gs = h->gates + (size_t)i0 * K;
    size_t DK = (size_t)h->la_depth * h->la_k;
    policy_route route = {
        .layer = layer,
        .now_ns = h->now_ns(h->clock_ctx),
        .n_tokens = n,
        .top_k = K,
        .experts = ex,
        .gates = gs,
        .importance = h->importance ? h->importance + i0 : NULL,
        .lookahead_ids = h->la_depth ? h->la_ids + i0 * DK : NULL,
        .lookahead_scores = h->la_depth ? h->la_scores + i0 * DK : NULL,
        .n_active = n_active,
        .active = rs->active,
        .active_tokens = rs->active_tokens,
        .active_gate = rs->active_gate,
    };
    policy_plan plan = {.run = rs->plan};
    memsys *ms = h->ms;
    ms->cur_layer = layer;
    ms->cur_step = step;
    ++*h->sub_routes;
    h->pm->on_route(h->pol, &route, &plan);

    /* check the plan, pin what runs, count hits and gate mass */
    moesim_precision hi = h->pm->hi_precision ? h->pm->hi_precision(h->pol) : h->precision;
    uint8_t hi_bits = (uint8_t)h->quant->fmt[hi].weight_bits;
    memsys_run_plan(ms, layer, rs->active, rs->plan, n_active);
    const size_t layer_parts = (size_t)layer * ms->E * ms->P * PART_COUNT;
    sim_route_tally_accesses(rs, ex, gs, n * K, ms->state + layer_parts, ms->P, h->quant, hi_bits,
                             h->tally);
    if (last_of_layer) memsys_end_layer(ms, layer, h->now_ns(h->clock_ctx));
}
