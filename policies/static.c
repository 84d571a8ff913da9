/* `static`: every routed expert of every MoE layer resident in HBM at one precision
 * (expert.precision) from warmup on, nothing ever evicted or moved again. It is the uniform
 * static post-training quantization deployment that DyMoE (Sec. 2, "Standard PTQ ... apply uniform
 * bit-widths", Fig. 2b) and DynaExq (abstract and Sec. 2: "static post-training quantization",
 * its static low-precision baselines) contrast with: pick one bit-width offline so the
 * whole model fits, then run with no expert transfers on the critical path. The policy refuses to
 * start (one line naming the budget and the bytes needed) when L x E experts at that precision
 * do not fit the expert budget, or when cache.experts_per_layer is set below E. Warmup queues the
 * loads in execution order (layer 0 first, ascending expert ids, demand class) so the first layers
 * are usable first; after that every access hits. No knobs. */
#include <stdlib.h>

#include "common/alloc.h"
#include "common/check.h"
#include "policies/expert_cache.h"
#include "policies/policy.h"

struct policy {
    policy_mem_view mem;
    uint32_t n_layers, n_experts;
    moesim_precision precision;
    uint64_t loads;
};

static moesim_status static_create(const policy_params *params, const void *knobs,
                                   policy_mem_view mem, policy **out, moesim_error *err) {
    (void)knobs;
    const char *prec = precision_name(params->precision);
    uint64_t eb = expert_cache_expert_bytes(params, params->precision);
    if (eb == 0)
        return moesim_fail(err, MOESIM_EINPUT,
                           "expert.precision=%s is not stored by this host (expected a "
                           "precision the quantization table and the host support)",
                           prec);
    if (params->experts_per_layer != 0 && params->experts_per_layer < params->n_experts)
        return moesim_fail(err, MOESIM_EINPUT,
                           "cache.experts_per_layer=%u cannot hold all %u experts of a "
                           "layer (expected 0 or >= %u)",
                           params->experts_per_layer, params->n_experts, params->n_experts);
    uint64_t n = (uint64_t)params->n_layers * params->n_experts;
    uint64_t need = n * eb;
    if (need > params->expert_budget_bytes)
        return moesim_fail(err, MOESIM_EINPUT,
                           "all %llu experts at %s need %llu bytes (%.2f GiB) but the "
                           "expert budget is %llu bytes (%.2f GiB); raise memory.budget_gb or "
                           "lower expert.precision",
                           (unsigned long long)n, prec, (unsigned long long)need,
                           (double)need / (1024.0 * 1024.0 * 1024.0),
                           (unsigned long long)params->expert_budget_bytes,
                           (double)params->expert_budget_bytes / (1024.0 * 1024.0 * 1024.0));
    policy *p = moesim_xcalloc(1, sizeof *p);
    p->mem = mem;
    p->n_layers = params->n_layers;
    p->n_experts = params->n_experts;
    p->precision = params->precision;
    *out = p;
    return MOESIM_OK;
}

static void static_warmup(policy *p, uint64_t now_ns) {
    (void)now_ns;
    for (uint32_t l = 0; l < p->n_layers; l++) {
        for (uint32_t e = 0; e < p->n_experts; e++) {
            policy_mem_result r =
                p->mem.ops->load(p->mem.mem, l, e, p->precision, POLICY_PARTS_ALL, POLICY_DEMAND);
            /* create checked that everything fits: the mechanism cannot refuse */
            MOESIM_ASSERT(r != POLICY_REFUSED);
            if (r == POLICY_ISSUED) p->loads++;
        }
    }
}

static void static_on_route(policy *p, const policy_route *route, policy_plan *plan) {
    for (uint32_t i = 0; i < route->n_active; i++) {
        policy_mem_result r = p->mem.ops->load(p->mem.mem, route->layer, route->active[i],
                                               p->precision, POLICY_PARTS_ALL, POLICY_DEMAND);
        /* warmup made every expert loading or resident and nothing is evicted */
        MOESIM_ASSERT(r == POLICY_ALREADY);
        plan->run[i] = (uint8_t)p->precision;
    }
}

static size_t static_report(const policy *p, const char **names, double *values, size_t cap) {
    if (cap == 0) return 0;
    names[0] = "loads";
    values[0] = (double)p->loads;
    return 1;
}

static void static_destroy(policy *p) { free(p); }

const policy_methods policy_static = {
    .api_version = POLICY_API_VERSION,
    .name = "static",
    .summary = "every expert resident at expert.precision from warmup on (refused if it does "
               "not fit)",
    .create = static_create,
    .warmup = static_warmup,
    .on_route = static_on_route,
    .report = static_report,
    .destroy = static_destroy,
    .ignores_lookahead = true,
};
