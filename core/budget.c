/* The HBM split of a run, shared by the simulator and the GPU replay (core/budget.h). Units:
 * bytes; GiB = 2^30 bytes in messages. */
#include "core/budget.h"

#include <inttypes.h>

#define GIB 1073741824.0

/* Activation buffers reserved for the largest step: per token the residual, normed input, attention
 * q/k/v/o and the routed experts' intermediate activations (bf16), plus fp32 logits of the tokens
 * that emit. */
static uint64_t activation_bytes(const model_geometry *m, uint32_t max_tokens) {
    uint64_t hd = m->n_heads && m->head_dim ? (uint64_t)m->n_heads * m->head_dim : m->hidden;
    uint64_t kvd = (uint64_t)m->n_kv_heads * m->head_dim;
    uint64_t per_token =
        2ull * (4ull * m->hidden + hd + 2 * kvd + 2ull * m->top_k * m->expert_inter);
    return per_token * max_tokens + 4ull * m->vocab * max_tokens;
}

moesim_status sim_budget_plan(const model_geometry *m, const quant_table *q, const hw_profile *hw,
                              const sim_settings *set, uint32_t max_step_tokens,
                              uint64_t kv_peak_bytes, const char *bwhere, const char *cwhere,
                              sim_budget *b, moesim_error *err) {
    double budget_gb = set->budget_gb > 0 ? set->budget_gb : (double)hw->hbm_bytes / GIB;
    moesim_precision prec = (moesim_precision)set->precision;
    b->budget_bytes = (uint64_t)(budget_gb * GIB);
    if (b->budget_bytes > hw->hbm_bytes) /* a budget is part of the device's memory */
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: memory.budget_gb = %g exceeds the %g GiB of device memory of "
                           "hw '%s' ([gpu] hbm_gib)",
                           bwhere, budget_gb, (double)hw->hbm_bytes / GIB, hw->name);
    b->non_expert_bytes = model_non_expert_bytes(m);
    b->act_bytes = activation_bytes(m, max_step_tokens);
    b->kv_peak_bytes = kv_peak_bytes;
    uint64_t fixed = b->non_expert_bytes + b->act_bytes + kv_peak_bytes;
    if (fixed >= b->budget_bytes)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: memory.budget_gb = %.3g leaves nothing for experts: non-expert "
                           "weights %.2f GiB + KV cache %.2f GiB + activations %.2f GiB = %.2f GiB",
                           bwhere, budget_gb, b->non_expert_bytes / GIB, kv_peak_bytes / GIB,
                           b->act_bytes / GIB, fixed / GIB);
    b->expert_budget_bytes = b->budget_bytes - fixed;
    uint64_t ebytes = model_expert_bytes(m, q, prec);
    b->per_layer = set->experts_per_layer > 0;
    if (b->per_layer) {
        uint32_t c = set->experts_per_layer;
        if (c < m->top_k)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: cache.experts_per_layer = %u: expected >= top_k (%u), a "
                               "token needs all its experts resident at once",
                               cwhere, c, m->top_k);
        if (c > m->n_experts)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: cache.experts_per_layer = %u: expected at most n_experts (%u), "
                               "the experts a layer has",
                               cwhere, c, m->n_experts);
        b->pool_cap_bytes = (uint64_t)c * ebytes;
        if (b->pool_cap_bytes * m->n_moe_layers > b->expert_budget_bytes)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: cache.experts_per_layer = %u needs %.2f GiB of experts at %s, "
                               "but memory.budget_gb = %.3g leaves %.2f GiB for experts",
                               cwhere, c, (double)b->pool_cap_bytes * m->n_moe_layers / GIB,
                               precision_name(prec), budget_gb, b->expert_budget_bytes / GIB);
        b->route_capacity = c;
    } else {
        b->pool_cap_bytes = b->expert_budget_bytes;
        uint64_t fit = b->expert_budget_bytes / ebytes;
        if (fit < m->top_k)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: memory.budget_gb = %.3g leaves %.2f GiB for experts: room for "
                               "%" PRIu64 " experts at %s, fewer than top_k (%u)",
                               bwhere, budget_gb, b->expert_budget_bytes / GIB, fit,
                               precision_name(prec), m->top_k);
        b->route_capacity = fit > m->n_experts ? m->n_experts : (uint32_t)fit;
    }
    return MOESIM_OK;
}

uint32_t sim_budget_route_capacity(uint64_t expert_budget_bytes, uint64_t expert_bytes,
                                   uint32_t top_k, uint32_t n_experts) {
    uint64_t fit = expert_bytes ? expert_budget_bytes / expert_bytes : n_experts;
    return fit < top_k ? top_k : (fit > n_experts ? n_experts : (uint32_t)fit);
}
