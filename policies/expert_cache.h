/* The single-precision expert cache shared by the cache policies of policies/ (lfu,
 * mixtral-offload, oracle; lru may use it too): which experts a policy holds in HBM at one
 * precision, their recency and frequency, and victim selection. Internal to policies/: no host
 * includes it.
 *
 * What it models: a policy-side view of the residency it created through policy_mem. An expert is
 * "held" from the load the policy issued (POLICY_LOADING or POLICY_RESIDENT in the memory system)
 * until the policy evicts it; the memory system stays the authority (held experts are checked
 * against it on every access, and the budget is enforced there).
 *
 * Scope (the `scope` knob of lru / lfu):
 *   - layer:  one pool per MoE layer of `layer_capacity` experts; a miss evicts from its own layer.
 *     The capacity is cache.experts_per_layer when set (the memory system then enforces it), else
 *     the policy's share of the shared budget: floor(expert_budget / (L * expert_bytes)), at
 *     most E. The mechanism also refuses loads past the budget, so a full pool evicts first.
 *   - global: one pool over every layer, bounded by the shared budget alone (needs
 *     cache.experts_per_layer = 0); a miss evicts the best victim of any layer.
 *
 * The layer size is a target for demand loads: when every held expert of the layer is pinned (a
 * batch routes more distinct experts to the layer than its share), a demand load overflows the
 * share, and if the shared budget is then full it takes its room from any layer (as lru.c does);
 * prefetches never overflow.
 *
 * Victims: the held expert with the largest key (expert_cache_key: primary, then secondary),
 * ties to the lower layer, then the lower expert id: deterministic. The key function is fixed at
 * init and searches compare stored keys (the key function is called when an expert is held and
 * when its key may have changed, not per candidate): a key that changes must be re-stored with
 * expert_cache_refresh_layer (plan_route does it for the recency and use counts it changes;
 * expert_cache_halve re-stores every key). Layer scope walks its victim-order list with the LRU
 * and LFU keys and scans the layer's held list (at most its pool) with others; global scope
 * keeps every held expert in an indexed max-heap of stored keys, so a victim costs O(log n)
 * instead of a scan of thousands, or with the next-use key in buckets by next use
 * (policies/key_buckets.h), where a key's move after an access costs O(1). Pinned experts (every
 * expert the current route needs, the candidates of a prefetch, and any expert whose eviction the
 * memory system refused during this route) are never chosen. Pins last until the next
 * expert_cache_begin_route.
 *
 * Accesses (expert_cache_plan_route): first the route's whole active set is pinned (the
 * simulator's rule, policies/policy.h: a (sub-)route's experts are resident together, so none of
 * them is ever the victim of a load for the same route); then the (token, slot) accesses one at
 * a time in token order, then slot order (the convention of traces/stats.h and of lru.c, so a
 * per-layer LRU here gives lru's hit rate and `trace stats`' lru_hit_rate): each access stamps
 * the expert's recency with a strictly increasing tick and adds one use; the first access of an
 * expert in the route loads it on demand if it is not held, evicting unpinned victims first.
 * Use counts persist across evictions unless the cache counts per copy (use_per_copy: a load
 * starts the expert's count from zero). */
#ifndef MOESIM_POLICIES_EXPERT_CACHE_H
#define MOESIM_POLICIES_EXPERT_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/check.h"
#include "common/status.h"
#include "policies/key_buckets.h"
#include "policies/policy.h"

typedef enum expert_cache_scope { EXPERT_CACHE_LAYER = 0, EXPERT_CACHE_GLOBAL } expert_cache_scope;

/* "layer", "global", NULL: the choices of a CONFIG_ENUM scope knob (indices match the enum). */
extern const char *const expert_cache_scope_names[];

/* Eviction order: larger evicts first (primary, then secondary). */
typedef struct expert_cache_key {
    uint64_t primary, secondary;
} expert_cache_key;

/* A global-scope heap entry: a held expert's slot (layer * E + expert) and its stored key, side
 * by side, so that a compare on a sift reads one line. */
typedef struct expert_cache_heap_entry {
    expert_cache_key key;
    uint32_t le;
} expert_cache_heap_entry;

typedef struct expert_cache expert_cache;
typedef expert_cache_key (*expert_cache_key_fn)(const expert_cache *c, const void *ctx,
                                                uint32_t layer, uint32_t expert);

struct expert_cache {
    uint32_t n_layers, n_experts, top_k;
    moesim_precision precision;
    uint64_t expert_bytes; /* all parts at `precision` */
    expert_cache_scope scope;
    uint32_t layer_capacity; /* layer scope: experts per layer pool; global: 0 */
    bool per_layer_pools;    /* the memory system enforces per-layer pools */
    uint64_t capacity;       /* experts the whole cache may hold (layer: L * layer_capacity) */
    policy_mem_view mem;

    uint16_t *held_ids; /* [n_layers][n_experts] first n_held[l] entries: held experts of l */
    uint16_t *held_pos; /* [n_layers][n_experts] index in held_ids, or UINT16_MAX: not held */
    uint32_t *n_held;   /* [n_layers] */
    uint64_t total_held;
    uint64_t *last_use; /* [n_layers][n_experts] tick of the latest access, 0: never */
    uint64_t *uses;     /* [n_layers][n_experts] accesses so far (see expert_cache_halve), or
                           since the expert's current copy was loaded (count_per_copy); not
                           counted under the LRU and next-use keys, which never read them */
    bool counts_uses;   /* uses is kept (every key but LRU and next use; set at init) */
    bool count_per_copy; /* a load restarts the expert's use count (set after init) */
    /* the policy re-stores the keys of a route's experts once the route is over (set after
     * init; oracle: their next use moves on only then), so plan_route does not: they are pinned
     * meanwhile, and a pinned key orders no victim */
    bool keys_after_route;
    uint64_t *pin;      /* [n_layers][n_experts] == pin_epoch: pinned for this route */
    uint32_t *active_slot; /* [n_experts] index in the pinned route's active list (valid for
                              its active experts; a lookup, not a search, per access) */
    uint64_t tick, pin_epoch;
    uint64_t route_tick; /* tick at the latest expert_cache_begin_route: the route's first access */
    expert_cache_key_fn key; /* victim order */
    const void *key_ctx;

    /* every held expert's key as of its latest store (hold, expert_cache_refresh_layer, halve) */
    expert_cache_key *stored_key; /* [n_layers][n_experts] */

    /* layer scope with the LRU or LFU key: each layer's held experts as a list in victim order
     * (by stored key, the victim at the tail), so a victim search walks from the tail past the
     * pinned ones instead of comparing every held expert. An access only moves a key headward:
     * a new LRU key is the newest, at the head in one step; an LFU key passes the entries of its
     * old and new use counts. NULL otherwise. */
    uint32_t *order_prev, *order_next; /* [n_layers * n_experts] links, UINT32_MAX: none */
    uint32_t *order_head, *order_tail; /* [n_layers] */
    uint8_t *order_linked;             /* [n_layers * n_experts] */

    /* global scope: 4-ary max-heap (victim first) of held experts by stored key, or with the
     * next-use key (its primary a position) the held experts bucketed by it (bucketed) */
    expert_cache_heap_entry *heap; /* [n_layers * n_experts] */
    uint32_t *heap_pos;            /* [n_layers * n_experts] index in the heap, or UINT32_MAX */
    uint32_t *scratch;          /* [n_layers * n_experts] pinned entries set aside in a search */
    uint32_t n_heap;
    bool bucketed;
    key_buckets buckets;

    /* figures for policy_report */
    uint64_t loads, evictions, refused;
};

/* Sets up an empty cache (caller-allocated struct; expert_cache_free). `layer_capacity` is an
 * explicit per-layer size from the knob `policy_name`.experts_per_layer (0: derive it as described
 * above). Fails (MOESIM_EINPUT, one line; the host names the policy) when the precision is not
 * stored by the host, when scope global meets cache.experts_per_layer, when an explicit capacity
 * exceeds the budget, or when the cache cannot hold top_k experts of a layer (no token could run).
 */
moesim_status expert_cache_init(expert_cache *c, const char *policy_name, const policy_params *pp,
                                policy_mem_view mem, expert_cache_scope scope,
                                uint32_t layer_capacity, expert_cache_key_fn key,
                                const void *key_ctx, moesim_error *err);
void expert_cache_free(expert_cache *c); /* accepts a zeroed struct */

/* Bytes of one expert (every part) at precision p on this host; 0 if it cannot store p. */
uint64_t expert_cache_expert_bytes(const policy_params *pp, moesim_precision p);

/* Starts a route: drops the previous route's pins; route_tick becomes the tick. */
void expert_cache_begin_route(expert_cache *c);
/* Pins every active expert of the route (none of them is evicted while the route is planned)
 * and maps each to its index in route->active for expert_cache_plan_route. */
void expert_cache_pin_active(expert_cache *c, const policy_route *r);
/* Halves every use count (TinyLFU's reset); recency is kept. */
void expert_cache_halve(expert_cache *c);
/* Re-stores the keys of experts[0..n) of `layer`, in that order (no-op for one not held). */
void expert_cache_refresh_layer(expert_cache *c, uint32_t layer, const uint16_t *experts,
                                uint32_t n);

/* The small accessors are inline: they come with every access and prefetch candidate. */
static inline size_t expert_cache_slot(const expert_cache *c, uint32_t layer, uint32_t expert) {
    MOESIM_ASSERT(layer < c->n_layers && expert < c->n_experts);
    return (size_t)layer * c->n_experts + expert;
}
static inline void expert_cache_pin(expert_cache *c, uint32_t layer, uint32_t expert) {
    c->pin[expert_cache_slot(c, layer, expert)] = c->pin_epoch;
}
static inline bool expert_cache_pinned(const expert_cache *c, uint32_t layer, uint32_t expert) {
    return c->pin[expert_cache_slot(c, layer, expert)] == c->pin_epoch;
}
static inline bool expert_cache_holds(const expert_cache *c, uint32_t layer, uint32_t expert) {
    return c->held_pos[expert_cache_slot(c, layer, expert)] != UINT16_MAX;
}
/* True when `layer`'s pool is at (or over) its policy-side size (layer scope only). */
static inline bool expert_cache_layer_full(const expert_cache *c, uint32_t layer) {
    return c->scope == EXPERT_CACHE_LAYER && c->n_held[layer] >= c->layer_capacity;
}

/* The unpinned held expert to evict for room in `layer`'s pool (layer scope) or anywhere (global):
 * false when there is none. */
bool expert_cache_find_victim(expert_cache *c, uint32_t layer, uint32_t *victim_layer,
                              uint32_t *victim_expert);
/* The memory system cancelled the load of a held expert (policy_methods.on_transfer_cancelled):
 * the cache no longer holds it. */
void expert_cache_forget(expert_cache *c, uint32_t layer, uint32_t expert);
/* Evicts a held expert through the memory system; on refusal (in use, copy started) pins it so
 * the search moves on, and returns false. */
bool expert_cache_evict(expert_cache *c, uint32_t layer, uint32_t expert);
/* Issues the load of every part of (layer, expert) at the cache's precision and holds it:
 * POLICY_ISSUED (a miss), POLICY_ALREADY (held; asserted against the memory system), or
 * POLICY_REFUSED (the memory system's pool is full: the caller makes room). Never evicts and
 * ignores the policy-side layer size. */
policy_mem_result expert_cache_try_load(expert_cache *c, uint32_t layer, uint32_t expert,
                                        policy_class cls);
/* Loads (layer, expert) unless held, first evicting victims while the layer is at its
 * size, then while the memory system refuses (see the overflow rule above): POLICY_ISSUED,
 * POLICY_ALREADY, or POLICY_REFUSED when no evictable victim is left. A copy it loads is the
 * newest use (its last use the next tick, as an access stamps it; uses unchanged): a
 * speculative load that enters the LRU order as its most recent entry. */
policy_mem_result expert_cache_acquire_newest(expert_cache *c, uint32_t layer, uint32_t expert,
                                              policy_class cls);

/* Keys: least recently used first; least frequently used first (ties: least recently used);
 * Belady's, the next use furthest ahead first (never again first; ties: least recently used),
 * which needs the memory system's next_use and a key refreshed whenever the expert is accessed.
 * Its primary is the next use's absolute position, so keys stored at different routes compare
 * correctly: next_use counts from the route's first access, which is route_tick while only
 * plan_route stamps the tick (a policy that stamps it too must not use this key). */
expert_cache_key expert_cache_key_lru(const expert_cache *c, const void *ctx, uint32_t layer,
                                      uint32_t expert);
expert_cache_key expert_cache_key_lfu(const expert_cache *c, const void *ctx, uint32_t layer,
                                      uint32_t expert);
expert_cache_key expert_cache_key_next_use(const expert_cache *c, const void *ctx, uint32_t layer,
                                           uint32_t expert);

/* Plans the route for a single-precision cache: processes its accesses as described above
 * (demand class) and plans every expert it could make loading or resident at
 * the cache's precision; one it could not place (nothing left to evict) is skipped. Returns the
 * number skipped. Call after expert_cache_begin_route; `plan` must come all POLICY_RUN_SKIP (the
 * host's promise). */
uint32_t expert_cache_plan_route(expert_cache *c, const policy_route *r, policy_plan *plan);

/* "loads", "evictions", "refused" (plan entries skipped) as policy_report pairs; returns count. */
size_t expert_cache_report(const expert_cache *c, const char **names, double *values, size_t cap);

#endif
