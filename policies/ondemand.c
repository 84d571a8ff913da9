/* `ondemand`: the no-cache baseline. Nothing stays in HBM between uses: when a layer's router
 * finishes, every expert the previous route loaded is evicted and every activated expert is
 * loaded (demand class) at expert.precision, all three parts, then run. Its hit rate is 0 apart
 * from tokens of one step that share an expert (they share the fetch); its time is the
 * transfer-bound worst case every caching policy should beat. No knobs. */
#include <stdlib.h>

#include "common/alloc.h"
#include "common/check.h"
#include "policies/policy.h"

struct policy {
    policy_mem_view mem;
    moesim_precision prec;
    uint32_t layer; /* layer of the experts in `held` */
    uint16_t *held; /* [n_experts] experts the last route loaded */
    uint32_t n_held;
};

static moesim_status ondemand_create(const policy_params *params, const void *knobs,
                                     policy_mem_view mem, policy **out, moesim_error *err) {
    (void)knobs;
    (void)err;
    policy *p = moesim_xcalloc(1, sizeof *p);
    p->mem = mem;
    p->prec = params->precision;
    p->held = moesim_xcalloc(params->n_experts, sizeof *p->held);
    *out = p;
    return MOESIM_OK;
}

static void ondemand_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    const policy_mem_ops *ops = p->mem.ops;
    for (uint32_t i = 0; i < p->n_held; i++) {
        policy_mem_result res =
            ops->evict(p->mem.mem, p->layer, p->held[i], p->prec, POLICY_PARTS_ALL);
        MOESIM_ASSERT(res != POLICY_REFUSED); /* the previous route's compute has finished */
    }
    p->n_held = 0;
    p->layer = r->layer;
    for (uint32_t a = 0; a < r->n_active; a++) {
        policy_mem_result res =
            ops->load(p->mem.mem, r->layer, r->active[a], p->prec, POLICY_PARTS_ALL, POLICY_DEMAND);
        /* the host splits routes so that their experts fit one pool */
        MOESIM_ASSERT(res != POLICY_REFUSED);
        p->held[p->n_held++] = r->active[a];
        plan->run[a] = (uint8_t)p->prec;
    }
}

static void ondemand_destroy(policy *p) {
    if (!p) return;
    free(p->held);
    free(p);
}

const policy_methods policy_ondemand = {
    .api_version = POLICY_API_VERSION,
    .name = "ondemand",
    .summary = "no cache: every activated expert is loaded when its layer is routed",
    .create = ondemand_create,
    .on_route = ondemand_on_route,
    .destroy = ondemand_destroy,
    .ignores_lookahead = true,
};
