/* The HBM split of a run (sim/README.md "HBM accounting"), shared by the simulator (sim/sim.c)
 * and the GPU replay (replay/budget.c) so both reserve the same bytes and fail on the same
 * settings with the same message: non-expert weights, the KV peak and the activations of the
 * largest step come first, experts get the rest, as one pool or as per-layer pools of
 * cache.experts_per_layer experts.
 *
 * Units: bytes; GiB = 2^30 bytes in messages. Invariants: on success non_expert_bytes +
 * act_bytes + kv_peak_bytes + expert_budget_bytes == budget_bytes, and route_capacity >= top_k. */
#ifndef MOESIM_CORE_BUDGET_H
#define MOESIM_CORE_BUDGET_H

#include <stdbool.h>
#include <stdint.h>

#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "common/status.h"
#include "core/settings.h"

typedef struct sim_budget {
    uint64_t budget_bytes;     /* the emulated card: memory.budget_gb, or the profile's HBM */
    uint64_t non_expert_bytes; /* bf16 non-expert weights */
    uint64_t act_bytes;        /* activation buffers of the largest step */
    uint64_t kv_peak_bytes;    /* KV reservation */
    uint64_t expert_budget_bytes;
    bool per_layer;          /* cache.experts_per_layer > 0 */
    uint64_t pool_cap_bytes; /* per layer pool, or the one pool */
    uint32_t route_capacity; /* most distinct experts of one (sub-)route */
} sim_budget;

/* Splits the card's memory for model `m` stored per `q` at set->precision, on profile `hw`,
 * for a schedule whose largest step runs `max_step_tokens` and whose KV peaks at
 * `kv_peak_bytes`, so sim and replay agree on every figure. Bad settings return MOESIM_EINPUT
 * with one message naming the setting's origin (`budget_where` for memory.budget_gb,
 * `cache_where` for cache.experts_per_layer). Fills the caller's *out; borrows the rest. */
moesim_status sim_budget_plan(const model_geometry *m, const quant_table *q, const hw_profile *hw,
                              const sim_settings *set, uint32_t max_step_tokens,
                              uint64_t kv_peak_bytes, const char *budget_where,
                              const char *cache_where, sim_budget *out, moesim_error *err);

/* Most distinct experts of one (sub-)route in a shared pool of `expert_budget_bytes` when the
 * policy's widest expert takes `expert_bytes`: at least top_k (a token needs its experts
 * together), at most E. */
uint32_t sim_budget_route_capacity(uint64_t expert_budget_bytes, uint64_t expert_bytes,
                                   uint32_t top_k, uint32_t n_experts);

#endif
