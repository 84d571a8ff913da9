/* One route's active set, the FIRM-MoE prefetch accounting and the policy call with what follows
 * it, shared by the simulator and the replay executor (core/route.h). Units: experts, tokens and
 * slots are indices; gate mass is the sum of the routed gates. */
#include "core/route.h"

#include <stddef.h>
#include <string.h>

#include "common/check.h"
#include "common/model.h"
#include "core/memsys.h"
#include "core/schedule.h"
#include "policies/policy.h"
#include "traces/trace.h"

uint32_t sim_route_active_build(const sim_route_scratch *rs, const uint16_t *experts,
                                const float *gates, uint32_t n_slots, bool one_token) {
    /* distinct active experts, ascending: a bitmap of expert ids read out word by word (sorting
     * the list instead mispredicted most of its comparisons), and cleared as it is read (a
     * bitmap cleared whole per route cost a sixth of this function). One token's row names an
     * expert once (the trace's checks: as many active experts as named slots): its slot, kept in
     * the slot map until the readout, gives the expert's one gate, and no pass over the slots
     * counts them. */
    _Static_assert(MODEL_MAX_EXPERTS >= 128, "seen holds the two words of experts 0..127");
    uint64_t *seen = rs->seen;
    uint32_t words = 0, n_named = 0;
    /* experts 0..127 (most models' all) in one 128-bit word held in registers, set by a shift
     * without jumps: in memory, each slot's update waited for the store of the one before */
    unsigned __int128 low = 0;
    for (uint32_t i = 0; i < n_slots; i++) {
        uint16_t e = experts[i];
        if (e == TRACE_NO_EXPERT) continue;
        MOESIM_ASSERT(e < MODEL_MAX_EXPERTS);
        n_named++;
        if (e < 128) {
            low |= (unsigned __int128)1 << e;
        } else {
            seen[e >> 6] |= 1ull << (e & 63);
            if ((uint32_t)(e >> 6) >= words) words = (uint32_t)(e >> 6) + 1;
        }
        if (one_token) rs->slot[e] = i;
    }
    seen[0] = (uint64_t)low;
    seen[1] = (uint64_t)(low >> 64);
    if (!words) words = seen[1] ? 2 : seen[0] ? 1 : 0;
    uint32_t n_active = 0;
    for (uint32_t w = 0; w < words; w++) {
        uint64_t word = seen[w];
        seen[w] = 0;
        for (uint64_t bits = word; bits; bits &= bits - 1) {
            uint16_t e = (uint16_t)(w * 64 + (uint32_t)__builtin_ctzll(bits));
            rs->active_tokens[n_active] = one_token;
            /* 0 + gate as the sum over slots gives it (a gate of -0 sums to +0) */
            rs->active_gate[n_active] = one_token ? 0.0f + gates[rs->slot[e]] : 0;
            rs->slot[e] = n_active;
            rs->active[n_active] = e;
            rs->plan[n_active] = POLICY_RUN_SKIP;
            n_active++;
        }
    }
    MOESIM_ASSERT(!one_token || n_active == n_named);
    for (uint32_t i = 0; i < n_slots && !one_token; i++) {
        if (experts[i] == TRACE_NO_EXPERT) continue;
        uint32_t a = rs->slot[experts[i]];
        rs->active_tokens[a]++;
        rs->active_gate[a] += gates[i];
    }
    return n_active;
}

void sim_route_prefetch_account(const sim_route_scratch *rs, const uint16_t *step_experts,
                                uint32_t n_step_slots, uint8_t *mark, uint32_t E,
                                uint32_t *pf_count, uint64_t *pf_hit, uint64_t *pf_active,
                                uint64_t *pf_issued_sets) {
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
}

void sim_route_tally_accesses(const sim_route_scratch *rs, const uint16_t *experts,
                              const float *gates, uint32_t n_slots, const quant_table *q,
                              const double *bits_of, uint32_t hi_bits, sim_route_tally *t) {
    /* summed in a copy, in the same order: through *t, which the stores of the loop may alias,
     * every sum went to memory and back (the loop's longest chain) */
    sim_route_tally sum = *t;
    for (uint32_t i = 0; i < n_slots; i++) {
        uint16_t e = experts[i];
        if (e == TRACE_NO_EXPERT) continue;
        uint8_t pr = rs->plan[rs->slot[e]];
        if (pr == POLICY_RUN_SKIP) {
            sum.skipped++;
            sum.gate_skip += gates[i];
            continue;
        }
        sum.accesses++;
        sum.gate_bits += gates[i] * bits_of[pr];
        if (q->fmt[pr].weight_bits >= hi_bits)
            sum.gate_hi += gates[i];
        else
            sum.gate_lo += gates[i];
    }
    *t = sum;
}

void sim_route_bits_of(const quant_table *q, double bits_of[PREC_COUNT]) {
    for (int p = 0; p < PREC_COUNT; p++) {
        const quant_format *f = &q->fmt[p];
        bits_of[p] = f->weight_bits +
                     (f->group_size ? (double)(f->scale_bits + f->zero_bits) / f->group_size : 0);
    }
}

uint32_t sim_route_execution_order(const sim_route_scratch *rs, uint32_t n_active, const memsys *ms,
                                   uint32_t *order, uint64_t *order_key, uint64_t *hits) {
    /* One pass puts the resident experts in order (active order) and lists the loading ones in
     * order_key, both by conditional counts rather than jumps: which experts are still loading
     * is data, and the jumps were mostly mispredicted. */
    uint32_t n_resident = 0, n_loading = 0;
    uint64_t route_hits = 0; /* summed here, not through `hits` (a chain through memory) */
    for (uint32_t a = 0; a < n_active; a++) {
        uint8_t pr = rs->plan[a];
        if (pr == POLICY_RUN_SKIP) continue;
        const uint8_t *st = ms->state + (size_t)rs->lep[a] * PART_COUNT;
        /* a planned expert's parts are resident or loading (memsys_run_plan asserts) */
        uint32_t loading = memsys_parts_differ(st, POLICY_PARTS_ALL, POLICY_RESIDENT);
        order[n_resident] = a;
        n_resident += !loading;
        order_key[n_loading] = a;
        n_loading += loading;
        /* a resident expert's accesses all hit, a loading one's all but the fetching first */
        route_hits += rs->active_tokens[a] - loading;
    }
    *hits += route_hits;
    /* Then the loading ones by the issue sequence of their latest-issued loading part (distinct:
     * a transfer carries one expert), by insertion: the k-th is read from order_key[k] before
     * the sorted keys (order_key[0, k]) can reach that slot. */
    for (uint32_t k = 0; k < n_loading; k++) {
        uint32_t a = (uint32_t)order_key[k];
        size_t base = (size_t)rs->lep[a] * PART_COUNT;
        uint64_t key = 0;
        if (memsys_whole_in_one_transfer(ms, rs->lep[a])) {
            key = memsys_loading_seq(ms, base) + 1;
        } else {
            for (int part = 0; part < PART_COUNT; part++)
                if (ms->state[base + part] == POLICY_LOADING) {
                    uint64_t seq = memsys_loading_seq(ms, base + (size_t)part) + 1;
                    if (seq > key) key = seq;
                }
        }
        uint32_t j = k;
        while (j > 0 && order_key[j - 1] > key) {
            order[n_resident + j] = order[n_resident + j - 1];
            order_key[j] = order_key[j - 1];
            j--;
        }
        order[n_resident + j] = a;
        order_key[j] = key;
    }
    return n_resident + n_loading;
}

uint32_t sim_route_split(const sim_route_scratch *rs, const uint16_t *experts, uint32_t K,
                         uint32_t i0, uint32_t n, uint32_t capacity) {
    if (i0 + 1 >= n) return n; /* a last token always runs (the loop below takes it anyway) */
    /* no more distinct experts than slots: a batch that routes fewer fits without a count */
    if ((uint64_t)(n - i0) * K <= capacity) return n;
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
        /* a policy that ignores look-ahead is handed none (policy_ignores_lookahead) */
        .lookahead_ids = h->la_ids ? h->la_ids + i0 * DK : NULL,
        .lookahead_scores = h->la_scores ? h->la_scores + i0 * DK : NULL,
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
    memsys_run_plan(ms, layer, rs->active, rs->plan, n_active, rs->lep);
    sim_route_tally_accesses(rs, ex, gs, n * K, h->quant, h->bits_of, hi_bits, h->tally);
    if (last_of_layer) memsys_end_layer(ms, layer, h->now_ns(h->clock_ctx));
}
