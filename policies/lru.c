/* `lru`: a least-recently-used expert cache at one precision (expert.precision), the classic
 * offloading baseline (e.g. the per-layer LRU of Eliseev & Mazur 2023, "Fast Inference of
 * Mixture-of-Experts Language Models with Offloading", §3.2). The route's experts run together,
 * so all of them are pinned first: none is ever the victim of a load for the same route (the
 * simulator's rule, policies/policy.h; an engine never evicts what the kernel it is about to
 * launch needs). Then accesses are processed one (token, slot) at a time in routing order: a hit
 * moves the expert to the front; a miss evicts the least recently used expert the route does
 * not need (when the cache is full) and loads the missing one on demand. Scope `layer` (default)
 * keeps one list per layer with a fixed capacity per layer: cache.experts_per_layer, or an equal
 * share of the expert budget; scope `global` keeps one list over all layers and evicts only when
 * the mechanism refuses a load (the budget is full). With scope `layer`, cache.experts_per_layer
 * = c and one-token steps (batch 1, one-token prompts) the hit rate equals lru_hit_rate[c] of
 * `moesim trace stats` (tests/test_sim.c checks it). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "policies/policy.h"

#define LRU_NIL UINT32_MAX

enum lru_scope { LRU_SCOPE_LAYER = 0, LRU_SCOPE_GLOBAL };

typedef struct lru_knobs {
    int scope; /* enum lru_scope */
} lru_knobs;

static const char *const lru_scope_names[] = {"layer", "global", NULL};

static const config_field lru_knob_fields[] = {
    {"lru", "scope", CONFIG_ENUM, offsetof(lru_knobs, scope), 0, false, 1, 0, lru_scope_names,
     "layer",
     "layer: one LRU list per layer (Eliseev & Mazur 2023, §3.2); global: one list for all "
     "layers"},
};

/* Intrusive doubly linked lists over nodes le = layer * E + expert. */
typedef struct lru_list {
    uint32_t head, tail, n;
} lru_list;

typedef struct lru_link {
    uint32_t prev, next;
} lru_link;

/* A node's state in one place: every access reads and relinks it, and in five arrays its
 * fields were five cache lines (bench/README.md: 1-4 % of a run's CPU time). */
typedef struct lru_node {
    lru_link layer, global; /* on its layer's list; on the global list (scope global) */
    uint32_t stamp;         /* latest route that needs the node */
    uint32_t cached;
    uint64_t touched; /* scope layer: tick of the node's last touch */
} lru_node;

struct policy {
    policy_mem_view mem;
    moesim_precision prec;
    uint32_t L, E;
    int scope;
    bool pool_per_layer; /* the mechanism's pools are per layer (cache.experts_per_layer) */
    uint32_t layer_cap;  /* scope layer: experts per layer list */
    lru_node *node;      /* [L*E] */
    uint32_t gen;
    lru_list *layer; /* [L] */
    /* Scope global: every node by recency. Scope layer needs the global order only when a whole
     * layer is pinned (rare), so it keeps no list (two relinks per access) but each node's
     * last-touch tick: the globally least recent node is the least recent of the layers'. */
    lru_list global;
    uint64_t tick;
};

/* Node x's link on the global list or on its layer's (constant `global` where inlined). */
static inline __attribute__((always_inline)) lru_link *link_of(lru_node *node, uint32_t x,
                                                               bool global) {
    return global ? &node[x].global : &node[x].layer;
}

/* Inline, as list_push_front: every access relinks its node. */
static inline __attribute__((always_inline)) void list_unlink(lru_list *l, lru_node *node,
                                                              bool global, uint32_t x) {
    lru_link *k = link_of(node, x, global);
    const uint32_t prev = k->prev, next = k->next;
    if (prev != LRU_NIL)
        link_of(node, prev, global)->next = next;
    else
        l->head = next;
    if (next != LRU_NIL)
        link_of(node, next, global)->prev = prev;
    else
        l->tail = prev;
    k->prev = k->next = LRU_NIL;
    l->n--;
}

static inline __attribute__((always_inline)) void list_push_front(lru_list *l, lru_node *node,
                                                                  bool global, uint32_t x) {
    lru_link *k = link_of(node, x, global);
    k->prev = LRU_NIL;
    k->next = l->head;
    if (l->head != LRU_NIL)
        link_of(node, l->head, global)->prev = x;
    else
        l->tail = x;
    l->head = x;
    l->n++;
}

static moesim_status lru_create(const policy_params *params, const void *knobs, policy_mem_view mem,
                                policy **out, moesim_error *err) {
    const lru_knobs *k = knobs;
    uint64_t ebytes = 0;
    for (int part = 0; part < PART_COUNT; part++)
        ebytes += params->part_bytes[params->precision][part];
    if (!ebytes)
        return moesim_fail(err, MOESIM_EINPUT, "expert.precision %s is not stored by the host",
                           precision_name(params->precision));
    policy *p = moesim_xcalloc(1, sizeof *p);
    p->mem = mem;
    p->prec = params->precision;
    p->L = params->n_layers;
    p->E = params->n_experts;
    p->scope = k->scope;
    p->pool_per_layer = params->experts_per_layer > 0;
    if (params->experts_per_layer) {
        p->layer_cap = params->experts_per_layer;
    } else {
        uint64_t share = params->expert_budget_bytes / ((uint64_t)p->L * ebytes);
        p->layer_cap = share > p->E ? p->E : (uint32_t)share;
    }
    if (p->scope == LRU_SCOPE_LAYER && p->layer_cap < params->top_k) {
        uint32_t cap = p->layer_cap;
        free(p);
        return moesim_fail(err, MOESIM_EINPUT,
                           "[lru] scope = layer: the budget gives each layer %u experts at %s, "
                           "fewer than top_k (%u); raise memory.budget_gb or use lru.scope=global",
                           cap, precision_name(params->precision), params->top_k);
    }
    size_t n = (size_t)p->L * p->E;
    p->node = moesim_xcalloc(n, sizeof *p->node);
    for (size_t i = 0; i < n; i++)
        p->node[i].layer = p->node[i].global = (lru_link){LRU_NIL, LRU_NIL};
    p->layer = moesim_xmalloc(p->L * sizeof *p->layer);
    for (uint32_t l = 0; l < p->L; l++) p->layer[l] = (lru_list){LRU_NIL, LRU_NIL, 0};
    p->global = (lru_list){LRU_NIL, LRU_NIL, 0};
    *out = p;
    return MOESIM_OK;
}

/* The least recently used node of `list` (the global one or a layer's) not needed by the
 * current route, or LRU_NIL. */
static uint32_t victim_of(policy *p, const lru_list *list, bool global) {
    for (uint32_t x = list->tail; x != LRU_NIL; x = link_of(p->node, x, global)->prev)
        if (p->node[x].stamp != p->gen) return x;
    return LRU_NIL;
}

/* The least recently used node of all layers not needed by the current route, or LRU_NIL. */
static uint32_t global_victim(policy *p) {
    if (p->scope == LRU_SCOPE_GLOBAL) return victim_of(p, &p->global, true);
    uint32_t best = LRU_NIL;
    for (uint32_t l = 0; l < p->L; l++) {
        uint32_t v = victim_of(p, &p->layer[l], false);
        if (v != LRU_NIL && (best == LRU_NIL || p->node[v].touched < p->node[best].touched))
            best = v;
    }
    return best;
}

/* Evicts node x of `layer` (passed: a division x / E per eviction cost more than the unlink). */
static void drop(policy *p, uint32_t layer, uint32_t x) {
    policy_mem_result res =
        p->mem.ops->evict(p->mem.mem, layer, x - layer * p->E, p->prec, POLICY_PARTS_ALL);
    MOESIM_ASSERT(res != POLICY_REFUSED); /* not in use: the route's compute has not started */
    list_unlink(&p->layer[layer], p->node, false, x);
    if (p->scope == LRU_SCOPE_GLOBAL) list_unlink(&p->global, p->node, true, x);
    p->node[x].cached = 0;
}

/* An access of expert e of `layer` (node x, on list ll), whose node the route stamped. */
static void touch(policy *p, uint32_t layer, lru_list *ll, uint32_t x, uint16_t e) {
    bool global = p->scope == LRU_SCOPE_GLOBAL;
    lru_node *nx = &p->node[x];
    if (nx->cached) {
        list_unlink(ll, p->node, false, x);
        if (global) list_unlink(&p->global, p->node, true, x);
    } else {
        if (p->scope == LRU_SCOPE_LAYER)
            while (ll->n >= p->layer_cap) {
                uint32_t v = victim_of(p, ll, false);
                if (v == LRU_NIL) break; /* the route needs more than the share: overflow */
                drop(p, layer, v);
            }
        for (;;) {
            policy_mem_result res =
                p->mem.ops->load(p->mem.mem, layer, e, p->prec, POLICY_PARTS_ALL, POLICY_DEMAND);
            if (res != POLICY_REFUSED) break;
            uint32_t v = LRU_NIL, v_layer = layer;
            if (p->pool_per_layer || p->scope == LRU_SCOPE_LAYER) v = victim_of(p, ll, false);
            if (v == LRU_NIL) {
                v = global_victim(p);
                MOESIM_ASSERT(v != LRU_NIL); /* the host splits routes so that they fit a pool */
                v_layer = v / p->E;
            }
            drop(p, v_layer, v);
        }
        nx->cached = 1;
    }
    nx->touched = ++p->tick;
    list_push_front(ll, p->node, false, x);
    if (global) list_push_front(&p->global, p->node, true, x);
}

static void lru_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    /* the route's experts run together: stamping them all first keeps every one of them out of
     * the victim search of the route's misses (the simulator's rule, policies/policy.h) */
    const uint32_t layer = r->layer, base = layer * p->E, n_active = r->n_active, gen = ++p->gen;
    for (uint32_t a = 0; a < n_active; a++) p->node[base + r->active[a]].stamp = gen;
    lru_list *ll = &p->layer[layer];
    size_t n = (size_t)r->n_tokens * r->top_k;
    for (size_t i = 0; i < n; i++) {
        uint16_t e = r->experts[i];
        if (e != POLICY_NO_EXPERT) touch(p, layer, ll, base + e, e);
    }
    memset(plan->run, p->prec, n_active);
}

static void lru_destroy(policy *p) {
    if (!p) return;
    free(p->node);
    free(p->layer);
    free(p);
}

const policy_methods policy_lru = {
    .api_version = POLICY_API_VERSION,
    .name = "lru",
    .summary = "least-recently-used expert cache at expert.precision (per layer or global)",
    .knobs = lru_knob_fields,
    .n_knobs = 1,
    .knobs_size = sizeof(lru_knobs),
    .create = lru_create,
    .on_route = lru_on_route,
    .destroy = lru_destroy,
    .ignores_lookahead = true,
};
