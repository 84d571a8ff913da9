/* The single-precision expert cache shared by the cache policies (see expert_cache.h for the
 * model, the scope rules and the victim order).
 *
 * Layout: per layer, a compact list of held expert ids (held_ids, with held_pos as its inverse)
 * so a layer-scope victim search scans only what is held (at most the pool), never all E. Every
 * held expert's key is stored (stored_key) when it is held and whenever it may change
 * (expert_cache_refresh_layer), so a search compares stored keys instead of calling the key
 * function per candidate. Global scope adds an indexed 4-ary max-heap over every held expert
 * (heap, each entry a slot and its stored key so a compare reads no slot; heap_pos its inverse)
 * whose root is the next victim; pinned roots are popped aside during a search and pushed back
 * with fresh keys. With the next-use key, buckets by next use take the heap's place (a search
 * reads them from the furthest down and re-stores the keys of the pinned experts it passes, the
 * roots the heap would have set aside). Recency ticks and use counts are per (layer, expert) and
 * count (token, slot) accesses. Pins are epoch stamps: a new route bumps the epoch instead of
 * clearing. No allocation after init but the buckets' table, which grows with the positions seen.
 */
#include "policies/expert_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"

#define NOT_HELD UINT16_MAX
#define NO_HEAP  UINT32_MAX

static void heap_rebuild(expert_cache *c);

const char *const expert_cache_scope_names[] = {"layer", "global", NULL};

uint64_t expert_cache_expert_bytes(const policy_params *pp, moesim_precision p) {
    uint64_t bytes = 0;
    for (int part = 0; part < PART_COUNT; part++) {
        if (pp->part_bytes[p][part] == 0) return 0;
        bytes += pp->part_bytes[p][part];
    }
    return bytes;
}

moesim_status expert_cache_init(expert_cache *c, const char *policy_name, const policy_params *pp,
                                policy_mem_view mem, expert_cache_scope scope,
                                uint32_t layer_capacity, expert_cache_key_fn key,
                                const void *key_ctx, moesim_error *err) {
    memset(c, 0, sizeof *c);
    MOESIM_ASSERT(pp->n_layers > 0 && pp->n_experts > 0 && pp->n_experts < NOT_HELD);
    const char *prec = precision_name(pp->precision);
    uint64_t eb = expert_cache_expert_bytes(pp, pp->precision);
    if (eb == 0)
        return moesim_fail(err, MOESIM_EINPUT,
                           "expert.precision=%s is not stored by this host (expected a "
                           "precision the quantization table and the host support)",
                           prec);
    uint64_t L = pp->n_layers;
    uint64_t capacity;
    uint32_t per_layer = 0;
    if (scope == EXPERT_CACHE_GLOBAL) {
        if (pp->experts_per_layer != 0)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s.scope=global: needs cache.experts_per_layer=0 (one shared "
                               "budget), got cache.experts_per_layer=%u",
                               policy_name, pp->experts_per_layer);
        capacity = pp->expert_budget_bytes / eb;
        if (capacity > L * pp->n_experts) capacity = L * pp->n_experts;
        if (capacity < pp->top_k)
            return moesim_fail(err, MOESIM_EINPUT,
                               "the expert budget of %llu bytes holds %llu experts at %s "
                               "(%llu bytes each), fewer than top_k=%u; raise memory.budget_gb",
                               (unsigned long long)pp->expert_budget_bytes,
                               (unsigned long long)capacity, prec, (unsigned long long)eb,
                               pp->top_k);
    } else {
        if (layer_capacity != 0) {
            if (layer_capacity > pp->n_experts)
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s.experts_per_layer=%u: expected at most the model's %u "
                                   "experts",
                                   policy_name, layer_capacity, pp->n_experts);
            if (pp->experts_per_layer != 0 && layer_capacity > pp->experts_per_layer)
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s.experts_per_layer=%u exceeds cache.experts_per_layer=%u",
                                   policy_name, layer_capacity, pp->experts_per_layer);
            if (pp->experts_per_layer == 0 &&
                (uint64_t)layer_capacity * L * eb > pp->expert_budget_bytes)
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s.experts_per_layer=%u: %u layers at %s need %llu bytes, "
                                   "more than the expert budget of %llu bytes",
                                   policy_name, layer_capacity, pp->n_layers, prec,
                                   (unsigned long long)((uint64_t)layer_capacity * L * eb),
                                   (unsigned long long)pp->expert_budget_bytes);
            per_layer = layer_capacity;
        } else if (pp->experts_per_layer != 0) {
            per_layer = pp->experts_per_layer;
        } else {
            uint64_t share = pp->expert_budget_bytes / (L * eb);
            per_layer = share > pp->n_experts ? pp->n_experts : (uint32_t)share;
        }
        if (per_layer > pp->n_experts) per_layer = pp->n_experts;
        if (per_layer < pp->top_k)
            return moesim_fail(err, MOESIM_EINPUT,
                               "the cache holds %u experts per layer at %s (expert budget "
                               "%llu bytes, %llu bytes per expert, %u layers), fewer than "
                               "top_k=%u; raise memory.budget_gb or cache.experts_per_layer",
                               per_layer, prec, (unsigned long long)pp->expert_budget_bytes,
                               (unsigned long long)eb, pp->n_layers, pp->top_k);
        capacity = (uint64_t)per_layer * L;
    }

    c->n_layers = pp->n_layers;
    c->n_experts = pp->n_experts;
    c->top_k = pp->top_k;
    c->precision = pp->precision;
    c->expert_bytes = eb;
    c->scope = scope;
    c->layer_capacity = per_layer;
    c->capacity = capacity;
    c->per_layer_pools = pp->experts_per_layer != 0;
    c->mem = mem;
    size_t n = (size_t)pp->n_layers * pp->n_experts;
    c->held_ids = moesim_xcalloc(n, sizeof *c->held_ids);
    c->held_pos = moesim_xmalloc(n * sizeof *c->held_pos);
    for (size_t i = 0; i < n; i++) c->held_pos[i] = NOT_HELD;
    c->n_held = moesim_xcalloc(pp->n_layers, sizeof *c->n_held);
    c->last_use = moesim_xcalloc(n, sizeof *c->last_use);
    c->uses = moesim_xcalloc(n, sizeof *c->uses);
    c->pin = moesim_xcalloc(n, sizeof *c->pin);
    c->pin_epoch = 1;
    c->key = key;
    c->key_ctx = key_ctx;
    /* a count per access is a store to a line of its own: only for keys that read it */
    c->counts_uses = key != expert_cache_key_lru && key != expert_cache_key_next_use;
    c->stored_key = moesim_xcalloc(n, sizeof *c->stored_key);
    c->active_slot = moesim_xcalloc(pp->n_experts, sizeof *c->active_slot);
    if (scope == EXPERT_CACHE_LAYER &&
        (key == expert_cache_key_lru || key == expert_cache_key_lfu)) {
        c->order_prev = moesim_xmalloc(n * sizeof *c->order_prev);
        c->order_next = moesim_xmalloc(n * sizeof *c->order_next);
        c->order_linked = moesim_xcalloc(n, 1);
        c->order_head = moesim_xmalloc(pp->n_layers * sizeof *c->order_head);
        c->order_tail = moesim_xmalloc(pp->n_layers * sizeof *c->order_tail);
        for (uint32_t l = 0; l < pp->n_layers; l++) c->order_head[l] = c->order_tail[l] = NO_HEAP;
    }
    if (scope == EXPERT_CACHE_GLOBAL) {
        c->scratch = moesim_xcalloc(n, sizeof *c->scratch);
        c->bucketed = key == expert_cache_key_next_use;
        if (c->bucketed) {
            key_buckets_init(&c->buckets, n);
        } else {
            c->heap = moesim_xcalloc(n, sizeof *c->heap);
            c->heap_pos = moesim_xmalloc(n * sizeof *c->heap_pos);
            for (size_t i = 0; i < n; i++) c->heap_pos[i] = NO_HEAP;
        }
    }
    return MOESIM_OK;
}

void expert_cache_free(expert_cache *c) {
    free(c->held_ids);
    free(c->held_pos);
    free(c->n_held);
    free(c->last_use);
    free(c->uses);
    free(c->pin);
    free(c->stored_key);
    free(c->active_slot);
    free(c->order_prev);
    free(c->order_next);
    free(c->order_linked);
    free(c->order_head);
    free(c->order_tail);
    free(c->heap);
    free(c->heap_pos);
    free(c->scratch);
    key_buckets_free(&c->buckets);
    memset(c, 0, sizeof *c);
}

void expert_cache_begin_route(expert_cache *c) {
    c->pin_epoch++;
    c->route_tick = c->tick;
}

void expert_cache_pin_active(expert_cache *c, const policy_route *r) {
    MOESIM_ASSERT(r->layer < c->n_layers);
    const size_t row = (size_t)r->layer * c->n_experts;
    for (uint32_t i = 0; i < r->n_active; i++) {
        uint16_t e = r->active[i];
        MOESIM_ASSERT(e < c->n_experts);
        c->pin[row + e] = c->pin_epoch;
        c->active_slot[e] = i;
    }
}

static inline bool key_before(expert_cache_key ka, size_t a, expert_cache_key kb, size_t b);

/* ---- layer scope, LRU key: each layer's held experts in victim order (order_*) ----
 * Slot s of layer l is passed with l: the callers know it, and a division per access (s / E)
 * cost more cycles than the relink. */

static void order_unlink(expert_cache *c, uint32_t l, size_t s) {
    uint32_t p = c->order_prev[s], n = c->order_next[s];
    if (p != NO_HEAP)
        c->order_next[p] = n;
    else
        c->order_head[l] = n;
    if (n != NO_HEAP)
        c->order_prev[n] = p;
    else
        c->order_tail[l] = p;
    c->order_linked[s] = 0;
}

/* Links slot s between prev (headward) and next (tailward) of layer l's list. */
static void order_link(expert_cache *c, uint32_t l, size_t s, uint32_t prev, uint32_t next) {
    c->order_prev[s] = prev;
    c->order_next[s] = next;
    if (prev != NO_HEAP)
        c->order_next[prev] = (uint32_t)s;
    else
        c->order_head[l] = (uint32_t)s;
    if (next != NO_HEAP)
        c->order_prev[next] = (uint32_t)s;
    else
        c->order_tail[l] = (uint32_t)s;
    c->order_linked[s] = 1;
}

/* Links slot s where its stored key puts it: headward of every entry evicted before it. Searched
 * from both ends at once: a refreshed LRU key, the newest, stops at the head; a copy held again
 * carries the key of its last use until the access that loaded it refreshes it, and stops near
 * the tail. */
static void order_insert(expert_cache *c, uint32_t l, size_t s) {
    const expert_cache_key *k = c->stored_key;
    for (uint32_t h = c->order_head[l], t = c->order_tail[l];;
         h = c->order_next[h], t = c->order_prev[t]) {
        if (h == NO_HEAP || !key_before(k[s], s, k[h], h)) { /* s goes headward of h */
            order_link(c, l, s, h == NO_HEAP ? c->order_tail[l] : c->order_prev[h], h);
            return;
        }
        if (!key_before(k[t], t, k[s], s)) { /* s goes tailward of t */
            order_link(c, l, s, t, c->order_next[t]);
            return;
        }
    }
}

/* Relinks slot s, whose new key is evicted no earlier than its old one (the LRU and LFU keys
 * only move so while held: recency and use counts only grow, and halving rebuilds the lists), so
 * its place is at or headward of the old one.
 * Searched from the old place headward and from the head at once: an LRU key, the newest,
 * stops at the head; an LFU key, one use more, passes the few entries of its old and new counts. */
static void order_move_headward(expert_cache *c, uint32_t l, size_t s) {
    const expert_cache_key *k = c->stored_key;
    uint32_t p = c->order_prev[s];
    order_unlink(c, l, s);
    for (uint32_t h = c->order_head[l];; p = c->order_prev[p], h = c->order_next[h]) {
        if (h == NO_HEAP || !key_before(k[s], s, k[h], h)) { /* s goes headward of h */
            order_link(c, l, s, h == NO_HEAP ? c->order_tail[l] : c->order_prev[h], h);
            return;
        }
        if (p == NO_HEAP || !key_before(k[p], p, k[s], s)) { /* s goes tailward of p */
            order_link(c, l, s, p, p == NO_HEAP ? c->order_head[l] : c->order_next[p]);
            return;
        }
    }
}

static expert_cache_key lru_key_at(const expert_cache *c, size_t s) {
    expert_cache_key k = {UINT64_MAX - c->last_use[s], 0};
    return k;
}

static expert_cache_key lfu_key_at(const expert_cache *c, size_t s) {
    expert_cache_key k = {UINT64_MAX - c->uses[s], UINT64_MAX - c->last_use[s]};
    return k;
}

static expert_cache_key next_use_key_at(const expert_cache *c, size_t s, uint32_t layer,
                                        uint32_t expert) {
    uint64_t next = c->mem.ops->next_use(c->mem.mem, layer, expert);
    expert_cache_key k = {next == UINT64_MAX ? UINT64_MAX : next + c->route_tick,
                          UINT64_MAX - c->last_use[s]};
    return k;
}

/* The current key of (layer, expert), slot s. The built-in keys are worked out here, not called
 * through c->key: a store comes with every access, and the call cost more than the key. */
static inline expert_cache_key key_of(const expert_cache *c, size_t s, uint32_t layer,
                                      uint32_t expert) {
    if (c->key == expert_cache_key_lru) return lru_key_at(c, s);
    if (c->key == expert_cache_key_lfu) return lfu_key_at(c, s);
    if (c->key == expert_cache_key_next_use) return next_use_key_at(c, s, layer, expert);
    return c->key(c, c->key_ctx, layer, expert);
}

/* Stores the current key of held (layer, expert). */
static void store_key(expert_cache *c, uint32_t layer, uint32_t expert) {
    size_t s = expert_cache_slot(c, layer, expert);
    c->stored_key[s] = key_of(c, s, layer, expert);
    if (!c->order_linked) return;
    if (c->order_linked[s])
        order_move_headward(c, layer, s);
    else
        order_insert(c, layer, s);
}

void expert_cache_halve(expert_cache *c) {
    size_t n = (size_t)c->n_layers * c->n_experts;
    for (size_t i = 0; i < n; i++) c->uses[i] >>= 1;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const size_t row = (size_t)l * c->n_experts;
        /* every key moves at once: the victim order is rebuilt, not relinked entry by entry */
        if (c->order_linked) {
            for (uint32_t i = 0; i < c->n_held[l]; i++)
                c->order_linked[row + c->held_ids[row + i]] = 0;
            c->order_head[l] = c->order_tail[l] = NO_HEAP;
        }
        for (uint32_t i = 0; i < c->n_held[l]; i++) {
            size_t s = row + c->held_ids[row + i];
            store_key(c, l, c->held_ids[row + i]);
            if (c->bucketed) key_buckets_move(&c->buckets, (uint32_t)s, c->stored_key[s].primary);
        }
    }
    if (c->heap_pos) heap_rebuild(c);
}

/* ---- the global-scope heap, whose root is the victim ---- */

/* True when slot a (= layer * E + expert) with key ka is evicted before slot b with key kb: by
 * key, then lower layer, then lower expert, which is slot order. Primaries mostly differ (a
 * recency tick, a next use): one compare then, a jump that is rarely mispredicted; the rest
 * without branches, for in a victim scan the outcome is data, and mispredicted jumps were most
 * of the scan's time. */
static inline bool key_before(expert_cache_key ka, size_t a, expert_cache_key kb, size_t b) {
    if (ka.primary != kb.primary) return ka.primary > kb.primary;
    return (ka.secondary > kb.secondary) | ((ka.secondary == kb.secondary) & (a < b));
}

/* The heap is 4-ary: entry i's parent is (i - 1) / 4, its children 4i + 1 .. 4i + 4, side by
 * side. An access moves its expert's key up the heap (a next use moves on) by half the levels of
 * a binary heap, where the sift up after each access was an eighth of an `oracle` run. */
#define HEAP_ARITY 4

/* True when heap entry a is evicted before heap entry b. */
static inline bool entry_before(const expert_cache_heap_entry *a,
                                const expert_cache_heap_entry *b) {
    return key_before(a->key, a->le, b->key, b->le);
}

static inline void heap_place(expert_cache *c, uint32_t i, expert_cache_heap_entry e) {
    c->heap[i] = e;
    c->heap_pos[e.le] = i;
}

/* The child of i evicted first among those below `n` entries (i has at least one). */
static inline uint32_t heap_first_child(const expert_cache *c, uint32_t i, uint32_t n) {
    uint32_t first = HEAP_ARITY * i + 1, end = first + HEAP_ARITY < n ? first + HEAP_ARITY : n;
    uint32_t best = first;
    for (uint32_t k = first + 1; k < end; k++)
        if (entry_before(&c->heap[k], &c->heap[best])) best = k;
    return best;
}

/* The sifts carry the moving entry in a hole and place it once, where it stops. */
static void heap_up(expert_cache *c, uint32_t i) {
    expert_cache_heap_entry e = c->heap[i];
    for (uint32_t up; i > 0; i = up) {
        up = (i - 1) / HEAP_ARITY;
        if (!entry_before(&e, &c->heap[up])) break;
        heap_place(c, i, c->heap[up]);
    }
    heap_place(c, i, e);
}

static void heap_down(expert_cache *c, uint32_t i) {
    expert_cache_heap_entry e = c->heap[i];
    while (HEAP_ARITY * i + 1 < c->n_heap) {
        uint32_t child = heap_first_child(c, i, c->n_heap);
        if (!entry_before(&c->heap[child], &e)) break;
        heap_place(c, i, c->heap[child]);
        i = child;
    }
    heap_place(c, i, e);
}

static void heap_push(expert_cache *c, uint32_t le) {
    uint32_t i = c->n_heap++;
    heap_place(c, i, (expert_cache_heap_entry){c->stored_key[le], le});
    heap_up(c, i);
}

/* Removes entry i bottom-up: the hole left at i sinks to a leaf by the earliest child, then the
 * last entry fills it and rises; it came from the bottom and seldom rises far. */
static void heap_remove_at(expert_cache *c, uint32_t i) {
    uint32_t last = --c->n_heap;
    c->heap_pos[c->heap[i].le] = NO_HEAP;
    if (i == last) return;
    while (HEAP_ARITY * i + 1 < last) {
        uint32_t child = heap_first_child(c, i, last);
        heap_place(c, i, c->heap[child]);
        i = child;
    }
    heap_place(c, i, c->heap[last]);
    heap_up(c, i);
}

/* Whether keys are recency kept in a victim-order list (no heap): an access's key is then the
 * newest, and its place the list's head (move_to_head). */
static inline bool lru_ordered(const expert_cache *c) {
    return !c->heap_pos && c->key == expert_cache_key_lru && c->order_linked;
}

/* A held expert (slot le of `layer`) just accessed under lru_ordered: its key, its place. */
static inline void move_to_head(expert_cache *c, size_t le, uint32_t layer) {
    c->stored_key[le] = lru_key_at(c, le);
    if (c->order_head[layer] != le) {
        order_unlink(c, layer, le);
        order_link(c, layer, le, NO_HEAP, c->order_head[layer]);
    }
}

/* Re-stores the key of (layer, expert), slot le, if held. */
static void refresh(expert_cache *c, size_t le, uint32_t layer, uint32_t expert) {
    if (c->held_pos[le] == NOT_HELD) return;
    if (c->bucketed) {
        c->stored_key[le] = key_of(c, le, layer, expert);
        key_buckets_move(&c->buckets, (uint32_t)le, c->stored_key[le].primary);
        return;
    }
    if (!c->heap_pos) {
        if (lru_ordered(c) && c->tick && c->last_use[le] == c->tick) { /* an access */
            move_to_head(c, le, layer);
            return;
        }
        store_key(c, layer, expert);
        return;
    }
    /* global scope keeps no victim-order list: the key goes to the heap alone */
    expert_cache_key old = c->stored_key[le], k = key_of(c, le, layer, expert);
    c->stored_key[le] = k;
    uint32_t i = c->heap_pos[le];
    c->heap[i].key = k;
    /* the heap was in order with the old key: the new one moves the entry one way only */
    if (key_before(k, le, old, le))
        heap_up(c, i);
    else
        heap_down(c, i);
}

/* Restores the heap order after every stored key changed. */
static void heap_rebuild(expert_cache *c) {
    for (uint32_t i = 0; i < c->n_heap; i++) c->heap[i].key = c->stored_key[c->heap[i].le];
    for (uint32_t i = c->n_heap / HEAP_ARITY + 1; i-- > 0;) heap_down(c, i);
}

static void hold(expert_cache *c, uint32_t layer, uint32_t expert) {
    size_t s = expert_cache_slot(c, layer, expert);
    MOESIM_ASSERT(c->held_pos[s] == NOT_HELD);
    uint32_t i = c->n_held[layer]++;
    c->held_ids[(size_t)layer * c->n_experts + i] = (uint16_t)expert;
    c->held_pos[s] = (uint16_t)i;
    c->total_held++;
    if (c->count_per_copy) c->uses[s] = 0; /* a new copy: its count starts over */
    store_key(c, layer, expert);
    if (c->heap_pos) heap_push(c, (uint32_t)s);
    if (c->bucketed) key_buckets_insert(&c->buckets, (uint32_t)s, c->stored_key[s].primary);
}

static void release(expert_cache *c, uint32_t layer, uint32_t expert) {
    size_t s = expert_cache_slot(c, layer, expert);
    uint16_t i = c->held_pos[s];
    MOESIM_ASSERT(i != NOT_HELD);
    uint16_t *ids = c->held_ids + (size_t)layer * c->n_experts;
    uint32_t last = --c->n_held[layer];
    ids[i] = ids[last];
    c->held_pos[(size_t)layer * c->n_experts + ids[i]] = i;
    c->held_pos[s] = NOT_HELD;
    c->total_held--;
    if (c->order_linked) order_unlink(c, layer, s);
    if (c->heap_pos) heap_remove_at(c, c->heap_pos[s]);
    if (c->bucketed) key_buckets_remove(&c->buckets, (uint32_t)s);
}

static bool order_find_victim(const expert_cache *c, uint32_t layer, uint32_t *victim_layer,
                              uint32_t *victim_expert);

/* The best unpinned victim held in layers [l0, l1). */
static bool find_victim_in(const expert_cache *c, uint32_t l0, uint32_t l1, uint32_t *victim_layer,
                           uint32_t *victim_expert) {
    if (c->order_linked) { /* the best of each layer's own victim (order_find_victim) */
        size_t best = SIZE_MAX;
        for (uint32_t l = l0; l < l1; l++) {
            uint32_t vl, ve;
            if (!order_find_victim(c, l, &vl, &ve)) continue;
            size_t s = (size_t)l * c->n_experts + ve;
            if (best == SIZE_MAX || key_before(c->stored_key[s], s, c->stored_key[best], best)) {
                best = s;
                *victim_layer = vl, *victim_expert = ve;
            }
        }
        return best != SIZE_MAX;
    }
    /* the sentinel (key 0, slot SIZE_MAX) comes after every candidate; a pinned one is skipped by
     * selection rather than by a jump, for the reason key_before gives */
    size_t best = SIZE_MAX;
    expert_cache_key bk = {0, 0};
    for (uint32_t l = l0; l < l1; l++) {
        const size_t row = (size_t)l * c->n_experts;
        const uint16_t *ids = c->held_ids + row;
        for (uint32_t i = 0; i < c->n_held[l]; i++) {
            size_t s = row + ids[i];
            expert_cache_key k = c->stored_key[s];
            bool take = (c->pin[s] != c->pin_epoch) & key_before(k, s, bk, best);
            best = take ? s : best;
            bk.primary = take ? k.primary : bk.primary;
            bk.secondary = take ? k.secondary : bk.secondary;
        }
    }
    if (best == SIZE_MAX) return false;
    *victim_layer = (uint32_t)(best / c->n_experts);
    *victim_expert = (uint32_t)(best % c->n_experts);
    return true;
}

/* The heap's best unpinned entry: pinned roots are set aside and put back. */
static bool heap_find_victim(expert_cache *c, uint32_t *victim_layer, uint32_t *victim_expert) {
    uint32_t n_aside = 0;
    bool found = false;
    while (c->n_heap > 0) {
        uint32_t le = c->heap[0].le;
        if (c->pin[le] != c->pin_epoch) {
            *victim_layer = le / c->n_experts, *victim_expert = le % c->n_experts;
            found = true;
            break;
        }
        c->scratch[n_aside++] = le;
        heap_remove_at(c, 0);
    }
    for (uint32_t i = 0; i < n_aside; i++) {
        store_key(c, c->scratch[i] / c->n_experts, c->scratch[i] % c->n_experts);
        heap_push(c, c->scratch[i]);
    }
    return found;
}

/* heap_find_victim over the buckets: the best unpinned expert of the highest bucket that has
 * one (a higher bucket's keys all come first). The pinned experts it passes, those whose keys
 * come before the victim's, get fresh keys, as the heap's pinned roots do. */
static bool bucket_find_victim(expert_cache *c, uint32_t *victim_layer, uint32_t *victim_expert) {
    const key_buckets *kb = &c->buckets;
    uint32_t n_aside = 0, best = NO_HEAP;
    for (uint32_t b = key_buckets_below(kb, KEY_BUCKETS_NONE); b != KEY_BUCKETS_NONE;
         b = key_buckets_below(kb, b)) {
        for (uint32_t s = key_buckets_first(kb, b); s != KEY_BUCKETS_NONE; s = kb->next[s]) {
            if (c->pin[s] == c->pin_epoch)
                c->scratch[n_aside++] = s;
            else if (best == NO_HEAP || key_before(c->stored_key[s], s, c->stored_key[best], best))
                best = s;
        }
        if (best != NO_HEAP) break;
    }
    for (uint32_t i = 0; i < n_aside; i++) {
        uint32_t s = c->scratch[i];
        if (best != NO_HEAP && !key_before(c->stored_key[s], s, c->stored_key[best], best))
            continue;
        store_key(c, s / c->n_experts, s % c->n_experts);
        key_buckets_move(&c->buckets, s, c->stored_key[s].primary);
    }
    if (best == NO_HEAP) return false;
    *victim_layer = best / c->n_experts, *victim_expert = best % c->n_experts;
    return true;
}

/* find_victim_in for one layer with its victim-order list: the first unpinned from the tail. */
static bool order_find_victim(const expert_cache *c, uint32_t layer, uint32_t *victim_layer,
                              uint32_t *victim_expert) {
    for (uint32_t s = c->order_tail[layer]; s != NO_HEAP; s = c->order_prev[s])
        if (c->pin[s] != c->pin_epoch) {
            *victim_layer = layer;
            *victim_expert = (uint32_t)(s - (size_t)layer * c->n_experts);
            return true;
        }
    return false;
}

static bool find_victim(expert_cache *c, uint32_t layer, uint32_t *victim_layer,
                        uint32_t *victim_expert) {
    if (c->bucketed) return bucket_find_victim(c, victim_layer, victim_expert);
    if (c->scope == EXPERT_CACHE_GLOBAL) return heap_find_victim(c, victim_layer, victim_expert);
    return find_victim_in(c, layer, layer + 1, victim_layer, victim_expert);
}

void expert_cache_forget(expert_cache *c, uint32_t layer, uint32_t expert) {
    release(c, layer, expert);
}

static bool evict(expert_cache *c, uint32_t layer, uint32_t expert) {
    MOESIM_ASSERT(expert_cache_holds(c, layer, expert));
    policy_mem_result r =
        c->mem.ops->evict(c->mem.mem, layer, expert, c->precision, POLICY_PARTS_ALL);
    if (r == POLICY_REFUSED) {
        expert_cache_pin(c, layer, expert);
        return false;
    }
    release(c, layer, expert);
    c->evictions++;
    return true;
}

/* Whether (layer, expert) is resident at the cache's precision, as far as the view shows it
 * without a call (false: ask the memory system). */
static inline bool resident(const expert_cache *c, uint32_t layer, uint32_t expert) {
    if (!c->mem.residency) return false;
    const uint8_t *st =
        c->mem.residency +
        (((size_t)c->precision * c->n_layers + layer) * c->n_experts + expert) * PART_COUNT;
    return (st[0] == POLICY_RESIDENT) & (st[1] == POLICY_RESIDENT) & (st[2] == POLICY_RESIDENT);
}

/* try_load of an expert the cache holds: POLICY_ALREADY. */
static inline policy_mem_result load_held(expert_cache *c, uint32_t layer, uint32_t expert,
                                          policy_class cls) {
    /* a prefetch promotes nothing the cache holds: it is resident, or loading at a class no
     * lower (the cache loads at demand or prefetch class only) */
    if (cls == POLICY_PREFETCH) return POLICY_ALREADY;
    if (resident(c, layer, expert)) return POLICY_ALREADY; /* nothing to promote: not asked */
    policy_mem_result r =
        c->mem.ops->load(c->mem.mem, layer, expert, c->precision, POLICY_PARTS_ALL, cls);
    /* the policy's view and the memory system agree: what it holds is loading or resident
     * (a late prefetch may just have been promoted to this load's class) */
    MOESIM_ASSERT(r == POLICY_ALREADY || r == POLICY_PROMOTED);
    return POLICY_ALREADY;
}

static policy_mem_result try_load(expert_cache *c, uint32_t layer, uint32_t expert,
                                  policy_class cls) {
    if (expert_cache_holds(c, layer, expert)) return load_held(c, layer, expert, cls);
    policy_mem_result r =
        c->mem.ops->load(c->mem.mem, layer, expert, c->precision, POLICY_PARTS_ALL, cls);
    if (r == POLICY_ISSUED) {
        hold(c, layer, expert);
        c->loads++;
    } else {
        /* an expert the cache does not hold is absent: nothing else loads at this precision */
        MOESIM_ASSERT(r == POLICY_REFUSED);
    }
    return r;
}

/* acquire of an expert the cache does not hold. */
static policy_mem_result acquire_absent(expert_cache *c, uint32_t layer, uint32_t expert,
                                        policy_class cls) {
    uint32_t vl, ve;
    /* layer scope: bring the pool below its size first */
    while (expert_cache_layer_full(c, layer)) {
        if (!find_victim(c, layer, &vl, &ve)) {
            /* every held expert of the layer is pinned: a demand may overflow the share
             * (the budget stays the hard limit), a prefetch may not */
            if (cls != POLICY_DEMAND) return POLICY_REFUSED;
            break;
        }
        evict(c, vl, ve); /* a refused victim is pinned; the search moves on */
    }
    for (;;) {
        policy_mem_result r = try_load(c, layer, expert, cls);
        if (r != POLICY_REFUSED) return r;
        bool found = find_victim(c, layer, &vl, &ve);
        if (!found && c->scope == EXPERT_CACHE_LAYER && !c->per_layer_pools)
            /* an overflowing layer filled the shared budget: take room from any layer */
            found = find_victim_in(c, 0, c->n_layers, &vl, &ve);
        if (!found) return POLICY_REFUSED;
        evict(c, vl, ve);
    }
}

/* Inline: nearly every access finds its expert held, and needs no room. */
static inline policy_mem_result acquire(expert_cache *c, uint32_t layer, uint32_t expert,
                                        policy_class cls) {
    if (expert_cache_holds(c, layer, expert)) return load_held(c, layer, expert, cls);
    return acquire_absent(c, layer, expert, cls);
}

/* Fetches the per-slot state that the accesses of experts[0..n) of the layer whose first slot is
 * `row` read, all at once: each array holds a slot in a line of its own, and one access after
 * the other missed on each of them in turn. */
static void prefetch_slots(const expert_cache *c, size_t row, const uint16_t *experts, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        MOESIM_ASSERT(experts[i] < c->n_experts);
        size_t s = row + experts[i];
        __builtin_prefetch(&c->held_pos[s]);
        __builtin_prefetch(&c->last_use[s]);
        __builtin_prefetch(&c->stored_key[s]);
        if (c->order_linked) {
            __builtin_prefetch(&c->order_prev[s]);
            __builtin_prefetch(&c->order_next[s]);
        }
    }
}

/* The library is built as position-independent code, where a call to an exported function is
 * never inlined (it may be interposed): the cache's own paths call the static functions above,
 * the policies these. */
void expert_cache_refresh_layer(expert_cache *c, uint32_t layer, const uint16_t *experts,
                                uint32_t n) {
    MOESIM_ASSERT(layer < c->n_layers);
    const size_t row = (size_t)layer * c->n_experts;
    for (uint32_t i = 0; i < n; i++) {
        MOESIM_ASSERT(experts[i] < c->n_experts);
        refresh(c, row + experts[i], layer, experts[i]);
    }
}

bool expert_cache_find_victim(expert_cache *c, uint32_t layer, uint32_t *victim_layer,
                              uint32_t *victim_expert) {
    return find_victim(c, layer, victim_layer, victim_expert);
}

bool expert_cache_evict(expert_cache *c, uint32_t layer, uint32_t expert) {
    return evict(c, layer, expert);
}

policy_mem_result expert_cache_try_load(expert_cache *c, uint32_t layer, uint32_t expert,
                                        policy_class cls) {
    return try_load(c, layer, expert, cls);
}

policy_mem_result expert_cache_acquire_newest(expert_cache *c, uint32_t layer, uint32_t expert,
                                              policy_class cls) {
    if (expert_cache_holds(c, layer, expert)) return load_held(c, layer, expert, cls);
    /* stamped before the load: the copy enters the victim order at its place at once (no
     * relink after), and an expert left unloaded keeps its stamp */
    size_t s = expert_cache_slot(c, layer, expert);
    uint64_t last = c->last_use[s];
    c->last_use[s] = c->tick + 1;
    policy_mem_result r = acquire_absent(c, layer, expert, cls);
    if (r == POLICY_ISSUED)
        c->tick++;
    else
        c->last_use[s] = last;
    return r;
}

expert_cache_key expert_cache_key_lru(const expert_cache *c, const void *ctx, uint32_t layer,
                                      uint32_t expert) {
    (void)ctx;
    return lru_key_at(c, expert_cache_slot(c, layer, expert));
}

expert_cache_key expert_cache_key_lfu(const expert_cache *c, const void *ctx, uint32_t layer,
                                      uint32_t expert) {
    (void)ctx;
    return lfu_key_at(c, expert_cache_slot(c, layer, expert));
}

expert_cache_key expert_cache_key_next_use(const expert_cache *c, const void *ctx, uint32_t layer,
                                           uint32_t expert) {
    (void)ctx;
    return next_use_key_at(c, expert_cache_slot(c, layer, expert), layer, expert);
}

uint32_t expert_cache_plan_route(expert_cache *c, const policy_route *r, policy_plan *plan) {
    /* the route's experts run together: none is the victim of a load for the route */
    expert_cache_pin_active(c, r);
    size_t row = (size_t)r->layer * c->n_experts;
    prefetch_slots(c, row, r->active, r->n_active);
    size_t n = (size_t)r->n_tokens * r->top_k;
    /* each access below is the newest: under recency order refresh's answer is known, and its
     * tests cost a tenth of a per-layer LRU's route */
    const bool to_head = !c->keys_after_route && lru_ordered(c);
    for (size_t i = 0; i < n; i++) {
        uint16_t e = r->experts[i];
        if (e == POLICY_NO_EXPERT) continue;
        MOESIM_ASSERT(e < c->n_experts);
        uint32_t a = c->active_slot[e];
        MOESIM_ASSERT(a < r->n_active && r->active[a] == e);
        /* the first access of the route loads (its own key does not matter: it is pinned);
         * stamped before, a copy it loads enters the victim order where the refresh below puts
         * it; counting after the load lets a per-copy count start from this access */
        c->last_use[row + e] = ++c->tick;
        if (plan->run[a] == POLICY_RUN_SKIP &&
            acquire(c, r->layer, e, POLICY_DEMAND) != POLICY_REFUSED)
            plan->run[a] = (uint8_t)c->precision;
        if (c->counts_uses) c->uses[row + e]++;
        if (to_head) {
            if (c->held_pos[row + e] != NOT_HELD) move_to_head(c, row + e, r->layer);
        } else if (!c->keys_after_route) {
            refresh(c, row + e, r->layer, e);
        }
    }
    uint32_t skipped = 0;
    for (uint32_t a = 0; a < r->n_active; a++) skipped += plan->run[a] == POLICY_RUN_SKIP;
    c->refused += skipped;
    return skipped;
}

size_t expert_cache_report(const expert_cache *c, const char **names, double *values, size_t cap) {
    const char *n[] = {"loads", "evictions", "refused"};
    double v[] = {(double)c->loads, (double)c->evictions, (double)c->refused};
    size_t k = 0;
    for (; k < MOESIM_ARRAY_LEN(n) && k < cap; k++) names[k] = n[k], values[k] = v[k];
    return k;
}
