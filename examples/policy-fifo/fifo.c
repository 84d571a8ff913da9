/* `fifo`: a template policy plug-in (policies/WRITING.md). A first-in first-out expert cache:
 * an activated expert that is not resident is loaded on demand at expert.precision; when the
 * memory system refuses the load (its pool is full), the expert that entered the cache first and
 * that the current route does not need is evicted, and the load is retried. With
 * fifo.second_chance an expert used since it entered is moved to the back once instead (the
 * CLOCK / second-chance variant). One queue holds every layer's experts in load order; with
 * per-layer pools (cache.experts_per_layer) only the routed layer's experts are candidates, since
 * only they free room in its pool.
 *
 * It calls nothing of moesim: the types and macros of policies/policy.h only, so it builds
 * against the installed header alone (Makefile, CMakeLists.txt beside this file). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <policies/policy.h>

typedef struct fifo_knobs {
    bool second_chance;
} fifo_knobs;

static const config_field fifo_knob_fields[] = {
    {"fifo", "second_chance", CONFIG_BOOL, offsetof(fifo_knobs, second_chance), 0, false, 1, 0,
     NULL, "false",
     "an expert used since it entered the queue goes to the back once instead of being evicted "
     "(second chance / CLOCK: Corbato 1968, 'A paging experiment with the Multics system')"},
};

typedef struct fifo_entry {
    uint32_t layer, expert;
    bool used; /* hit since it entered (second chance) */
} fifo_entry;

struct policy {
    policy_mem_view mem;
    moesim_precision prec;
    uint32_t n_experts;
    bool pool_per_layer, second_chance;
    fifo_entry *queue; /* [L*E] in load order: queue[0] entered first */
    uint32_t n_queued;
    uint8_t *needed; /* [E] the current route's experts (never victims) */
};

/* The host's moesim_fail is not linked into a plug-in: fill the error record directly. */
static moesim_status fifo_fail(moesim_error *err, const char *msg) {
    if (err) {
        err->status = MOESIM_ENOMEM;
        snprintf(err->msg, sizeof err->msg, "fifo: %s", msg);
    }
    return MOESIM_ENOMEM;
}

static moesim_status fifo_create(const policy_params *params, const void *knobs,
                                 policy_mem_view mem, policy **out, moesim_error *err) {
    const fifo_knobs *k = knobs;
    policy *p = calloc(1, sizeof *p);
    if (!p) return fifo_fail(err, "out of memory");
    p->mem = mem;
    p->prec = params->precision;
    p->n_experts = params->n_experts;
    p->pool_per_layer = params->experts_per_layer != 0;
    p->second_chance = k->second_chance;
    p->queue = calloc((size_t)params->n_layers * params->n_experts, sizeof *p->queue);
    p->needed = calloc(params->n_experts, 1);
    if (!p->queue || !p->needed) {
        free(p->queue);
        free(p->needed);
        free(p);
        return fifo_fail(err, "out of memory");
    }
    *out = p;
    return MOESIM_OK;
}

static int32_t fifo_find(const policy *p, uint32_t layer, uint32_t expert) {
    for (uint32_t i = 0; i < p->n_queued; i++)
        if (p->queue[i].layer == layer && p->queue[i].expert == expert) return (int32_t)i;
    return -1;
}

static void fifo_remove(policy *p, uint32_t i) {
    memmove(&p->queue[i], &p->queue[i + 1], (p->n_queued - i - 1) * sizeof *p->queue);
    p->n_queued--;
}

static bool fifo_is_victim(const policy *p, const fifo_entry *e, uint32_t layer) {
    if (e->layer == layer && p->needed[e->expert]) return false;
    return !p->pool_per_layer || e->layer == layer;
}

/* Evicts the first candidate in queue order; false when none can go. */
static bool fifo_evict_one(policy *p, uint32_t layer) {
    uint32_t rounds = p->second_chance ? 2 : 1; /* the second pass sees the cleared bits */
    for (uint32_t round = 0; round < rounds; round++)
        for (uint32_t i = 0, seen = 0, n = p->n_queued; seen < n; seen++) {
            fifo_entry e = p->queue[i];
            if (!fifo_is_victim(p, &e, layer)) {
                i++;
                continue;
            }
            if (p->second_chance && e.used) { /* to the back, bit cleared */
                fifo_remove(p, i);
                e.used = false;
                p->queue[p->n_queued++] = e;
                continue;
            }
            policy_mem_result r =
                p->mem.ops->evict(p->mem.mem, e.layer, e.expert, p->prec, POLICY_PARTS_ALL);
            if (r == POLICY_REFUSED) { /* in use by the compute of its layer: try the next */
                i++;
                continue;
            }
            fifo_remove(p, i);
            return true;
        }
    return false;
}

static bool fifo_held(const policy *p, uint32_t layer, uint32_t expert) {
    for (int part = 0; part < PART_COUNT; part++)
        if (p->mem.ops->state(p->mem.mem, layer, expert, p->prec, (expert_part)part) ==
            POLICY_ABSENT)
            return false;
    return true;
}

static void fifo_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    memset(p->needed, 0, p->n_experts);
    for (uint32_t a = 0; a < r->n_active; a++) p->needed[r->active[a]] = 1;
    for (uint32_t a = 0; a < r->n_active; a++) {
        uint32_t x = r->active[a];
        int32_t q = fifo_find(p, r->layer, x);
        if (q >= 0 && fifo_held(p, r->layer, x)) {
            p->queue[q].used = true;
            plan->run[a] = (uint8_t)p->prec;
            continue;
        }
        policy_mem_result res;
        while ((res = p->mem.ops->load(p->mem.mem, r->layer, x, p->prec, POLICY_PARTS_ALL,
                                       POLICY_DEMAND)) == POLICY_REFUSED)
            if (!fifo_evict_one(p, r->layer)) break;
        /* the host splits routes so that their experts fit one pool: a refusal here means a
         * pool smaller than one route; the plan entry stays POLICY_RUN_SKIP */
        if (res == POLICY_REFUSED) continue;
        if (q < 0) p->queue[p->n_queued++] = (fifo_entry){.layer = r->layer, .expert = x};
        plan->run[a] = (uint8_t)p->prec;
    }
}

static void fifo_destroy(policy *p) {
    if (!p) return;
    free(p->queue);
    free(p->needed);
    free(p);
}

POLICY_PLUGIN_EXPORT const policy_methods moesim_policy = {
    .api_version = POLICY_API_VERSION,
    .name = "fifo",
    .summary = "plug-in template: first-in first-out expert cache, demand loads only",
    .knobs = fifo_knob_fields,
    .n_knobs = sizeof fifo_knob_fields / sizeof *fifo_knob_fields,
    .knobs_size = sizeof(fifo_knobs),
    .create = fifo_create,
    .on_route = fifo_on_route,
    .destroy = fifo_destroy,
    .ignores_lookahead = true,
};
