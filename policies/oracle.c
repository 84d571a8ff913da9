/* `oracle`: Belady's replacement rule with perfect prefetch, the reference line of the figures
 * (Belady 1966, "A study of replacement algorithms for a virtual-storage computer", IBM Systems
 * Journal 5(2): evict
 * the page whose next use lies furthest in the future) applied to experts at one precision
 * (expert.precision), plus perfect prefetch of the next layer. It reads the future through the
 * memory system's oracle-only calls: next_use (accesses until an expert is routed again) and
 * future_active (the experts the next layer truly activates). Per route of layer l: the active
 * experts are planned at expert.precision (loaded on demand if a prefetch could not place them),
 * then the experts layer l+1 will activate (layer 0 of the next step after the last layer) are
 * loaded with prefetch priority; each load that needs room evicts the unpinned held expert whose
 * next use is furthest (never-again first; ties: least recently used, then lower layer, lower
 * id), and stops when that victim would be used sooner than the expert it makes room for (Belady
 * never trades a sooner use for a later one). Warmup fills the cache with the experts used
 * soonest, so the cache starts as Belady's would after the first accesses. Scope: one pool over
 * all layers when cache.experts_per_layer = 0 (a single cache is what Belady's bound is about,
 * and it is at least as good as any split into per-layer pools), per-layer pools when
 * cache.experts_per_layer is set (the memory system enforces them). With multi-token routes pinned
 * whole it bounds neither hits nor loads (policies/README.md, "oracle"); the lower bound on loads
 * is belady_min_loads (policies/belady.h). No knobs. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "policies/expert_cache.h"
#include "policies/policy.h"

#define NEVER UINT64_MAX

struct policy {
    expert_cache cache;
    uint16_t *ids;  /* [n_experts] future_active scratch */
    uint16_t *prev; /* [n_experts] the previous route's active experts */
    uint32_t n_prev, prev_layer;
    uint64_t prefetches, warmup_loads;
};

static moesim_status oracle_create(const policy_params *params, const void *knobs,
                                   policy_mem_view mem, policy **out, moesim_error *err) {
    (void)knobs;
    policy *p = moesim_xcalloc(1, sizeof *p);
    expert_cache_scope scope =
        params->experts_per_layer != 0 ? EXPERT_CACHE_LAYER : EXPERT_CACHE_GLOBAL;
    moesim_status st =
        expert_cache_init(&p->cache, "oracle", params, mem, scope, 0, expert_cache_key_next_use,
                          NULL, err);
    if (st != MOESIM_OK) {
        free(p);
        return st;
    }
    p->cache.keys_after_route = true; /* oracle_on_route re-stores the previous route's */
    MOESIM_ASSERT(mem.ops->next_use != NULL && mem.ops->future_active != NULL);
    p->ids = moesim_xcalloc(params->n_experts, sizeof *p->ids);
    p->prev = moesim_xcalloc(params->n_experts, sizeof *p->prev);
    *out = p;
    return MOESIM_OK;
}

/* Orders (next use, layer * E + expert) pairs: sooner first, then lower layer and id. */
static int cmp_pair(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    if (x[0] != y[0]) return (x[0] > y[0]) - (x[0] < y[0]);
    return (x[1] > y[1]) - (x[1] < y[1]);
}

/* Loads (layer, expert) with prefetch priority, making room Belady's way: false when no victim
 * is left or the best victim is used sooner than the expert. */
static bool prefetch_one(policy *p, uint32_t layer, uint32_t expert) {
    expert_cache *c = &p->cache;
    /* most candidates are held (resident or loading): a prefetch of them would return at once */
    if (expert_cache_holds(c, layer, expert)) return true;
    uint64_t want = 0; /* the expert's next use, looked up once a victim is needed */
    for (bool looked_up = false;;) {
        policy_mem_result r = expert_cache_try_load(c, layer, expert, POLICY_PREFETCH);
        if (r == POLICY_ALREADY) return true;
        if (r == POLICY_ISSUED) {
            p->prefetches++;
            return true;
        }
        uint32_t vl, ve;
        if (!expert_cache_find_victim(c, layer, &vl, &ve)) return false;
        if (!looked_up) want = c->mem.ops->next_use(c->mem.mem, layer, expert), looked_up = true;
        if (c->mem.ops->next_use(c->mem.mem, vl, ve) < want) return false;
        expert_cache_evict(c, vl, ve); /* refused: pinned, the search moves on */
    }
}

/* Fills the empty cache with the experts used soonest (each layer's pool up to its size). */
static void oracle_warmup(policy *p, uint64_t now_ns) {
    (void)now_ns;
    expert_cache *c = &p->cache;
    size_t n_slots = (size_t)c->n_layers * c->n_experts;
    uint64_t(*pairs)[2] = moesim_xcalloc(n_slots, sizeof *pairs);
    size_t n = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        for (uint32_t e = 0; e < c->n_experts; e++) {
            uint64_t next = c->mem.ops->next_use(c->mem.mem, l, e);
            if (next == NEVER) continue;
            pairs[n][0] = next;
            pairs[n][1] = (uint64_t)l * c->n_experts + e;
            n++;
        }
    }
    qsort(pairs, n, sizeof *pairs, cmp_pair);
    for (size_t i = 0; i < n; i++) {
        uint32_t l = (uint32_t)(pairs[i][1] / c->n_experts);
        uint32_t e = (uint32_t)(pairs[i][1] % c->n_experts);
        policy_mem_result r = expert_cache_try_load(c, l, e, POLICY_PREFETCH);
        if (r == POLICY_ISSUED) p->warmup_loads++;
        if (r == POLICY_REFUSED && c->scope == EXPERT_CACHE_GLOBAL) break; /* budget full */
    }
    free(pairs);
}

static void oracle_on_route(policy *p, const policy_route *route, policy_plan *plan) {
    expert_cache *c = &p->cache;
    /* first: the keys count from the route's first access (the cache's tick counts the accesses
     * it planned; oracle stamps nothing else) */
    expert_cache_begin_route(c);
    /* the previous route's experts were used: their next use moved on (a key changes only when
     * the expert is accessed) */
    expert_cache_refresh_layer(c, p->prev_layer, p->prev, p->n_prev);
    expert_cache_plan_route(c, route, plan); /* pins the route's experts: never evicted for it */

    uint32_t next = route->layer + 1 < c->n_layers ? route->layer + 1 : 0;
    uint32_t n = c->mem.ops->future_active(c->mem.mem, next, p->ids, c->n_experts);
    MOESIM_ASSERT(n <= c->n_experts);
    for (uint32_t i = 0; i < n; i++) expert_cache_pin(c, next, p->ids[i]);
    for (uint32_t i = 0; i < n; i++)
        if (!prefetch_one(p, next, p->ids[i])) break;

    memcpy(p->prev, route->active, route->n_active * sizeof *p->prev);
    p->n_prev = route->n_active;
    p->prev_layer = route->layer;
}

static void oracle_on_cancelled(policy *p, uint32_t layer, uint32_t expert, moesim_precision prec,
                                uint32_t parts_mask, policy_class cls, uint64_t now_ns) {
    (void)prec, (void)parts_mask, (void)cls, (void)now_ns;
    expert_cache_forget(&p->cache, layer, expert);
}

static size_t oracle_report(const policy *p, const char **names, double *values, size_t cap) {
    size_t n = expert_cache_report(&p->cache, names, values, cap);
    if (n < cap) names[n] = "prefetches", values[n++] = (double)p->prefetches;
    if (n < cap) names[n] = "warmup_loads", values[n++] = (double)p->warmup_loads;
    return n;
}

static void oracle_destroy(policy *p) {
    if (!p) return;
    expert_cache_free(&p->cache);
    free(p->ids);
    free(p->prev);
    free(p);
}

const policy_methods policy_oracle = {
    .api_version = POLICY_API_VERSION,
    .name = "oracle",
    .summary = "Belady's replacement with perfect prefetch of the next layer (a reference; the "
               "bound on loads is belady_min_loads)",
    .create = oracle_create,
    .warmup = oracle_warmup,
    .on_route = oracle_on_route,
    .on_transfer_cancelled = oracle_on_cancelled,
    .report = oracle_report,
    .destroy = oracle_destroy,
    .ignores_lookahead = true,
};
