/* The memory budget of a replay: the simulator's split of the card (core/budget.h: non-expert
 * weights, KV peak and activations first, experts get the rest), and the checks that let a
 * larger GPU emulate a 12/16/24 GiB card in software. */
#include <inttypes.h>

#include "common/check.h"
#include "replay/replay.h"

#define GIB 1073741824.0

moesim_status replay_budget_plan(const model_geometry *m, const quant_table *q,
                                 const hw_profile *hw, const sim_settings *set,
                                 uint32_t max_step_tokens, uint64_t kv_peak_bytes,
                                 const char *bwhere, const char *cwhere, replay_budget *b,
                                 moesim_error *err) {
    return sim_budget_plan(m, q, hw, set, max_step_tokens, kv_peak_bytes, bwhere, cwhere, b, err);
}

moesim_status replay_budget_fit_device(const replay_budget *b, uint64_t device_bytes,
                                       uint64_t device_free_bytes, uint64_t reserve_bytes,
                                       moesim_error *err) {
    if (device_bytes > b->budget_bytes)
        return moesim_fail(err, MOESIM_EINPUT,
                           "replay needs %.3f GiB of device memory (pools, weights, workspace) "
                           "but memory.budget_gb emulates a %.3f GiB card",
                           device_bytes / GIB, b->budget_bytes / GIB);
    uint64_t usable = device_free_bytes > reserve_bytes ? device_free_bytes - reserve_bytes : 0;
    if (b->budget_bytes > usable)
        return moesim_fail(err, MOESIM_EINPUT,
                           "memory.budget_gb emulates a %.3f GiB card but the GPU has %.3f GiB "
                           "free (%.3f GiB kept for the CUDA context and cuBLAS): set "
                           "memory.budget_gb lower",
                           b->budget_bytes / GIB, device_free_bytes / GIB, reserve_bytes / GIB);
    return MOESIM_OK;
}

uint64_t replay_pool_blocks(uint64_t pool_bytes, uint64_t part_bytes, uint64_t n_parts_max) {
    if (!part_bytes) return 0;
    uint64_t n = pool_bytes / part_bytes;
    return n < n_parts_max ? n : n_parts_max;
}
