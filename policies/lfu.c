/* `lfu`: an expert cache at one precision (expert.precision) that evicts the least frequently
 * used expert. The classic LFU replacement rule (e.g. Aho, Denning & Ullman 1971, "Principles of
 * Optimal Page Replacement", J. ACM 18(1), the frequency-ordered baseline; activation frequency is
 * also the signal MoE offloading systems cache by, e.g. MoE-Infinity, Xue et al. 2024), applied to
 * experts: every (token, slot) routing of an expert is one use; a miss loads the expert on demand
 * and, when its pool is full, evicts the held expert with the fewest uses that the route does not
 * need (a route's experts are pinned: the simulator's rule, policies/policy.h). Ties go to the
 * least recently used, then to the lower layer, then to the lower expert id, so runs are
 * deterministic. What a use count covers is the `lfu.counts` knob, the two rules of Breslau, Cao,
 * Fan, Phillips & Shenker 1999 ("Web Caching and Zipf-like Distributions: Evidence and
 * Implications", INFOCOM 1999, the two LFU variants it compares):
 *   - lifetime (default, "Perfect-LFU"): every access since the start of the run, whether or not
 *     the expert was resident; counts persist across evictions;
 *   - per_copy ("In-Cache-LFU"): the accesses since the expert's current copy was loaded; a
 *     reload starts from the access that caused it (count 1). A cache that keeps no state for
 *     experts it does not hold counts this way (the rule of the peer simulator robinber/moe-sim,
 *     whose curves ours were checked against).
 * Counts do not age by default; with
 * lfu.halve_every_steps = N every count is halved after each N steps (TinyLFU's reset,
 * Einziger, Friedman & Manes 2017, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM TOS
 * 13(4), Sec. 3.3), so old popularity fades. Scope: one pool per MoE layer (default; the pool is
 * cache.experts_per_layer, or the layer's share of the expert budget) or one pool over all layers
 * (lfu.scope=global, shared budget). The cache starts empty (cold misses count). */
#include <stddef.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "policies/expert_cache.h"
#include "policies/policy.h"

typedef struct lfu_knobs {
    int scope;                  /* expert_cache_scope */
    uint64_t halve_every_steps; /* 0: counts never age */
    int counts;                 /* enum lfu_counts */
} lfu_knobs;

enum lfu_counts { LFU_COUNTS_LIFETIME = 0, LFU_COUNTS_PER_COPY };
static const char *const lfu_counts_names[] = {"lifetime", "per_copy", NULL};

static const config_field lfu_knob_fields[] = {
    {.section = "lfu",
     .key = "scope",
     .type = CONFIG_ENUM,
     .offset = offsetof(lfu_knobs, scope),
     .choices = expert_cache_scope_names,
     .def = "layer",
     .min = 1,
     .max = 0,
     .help = "layer: one LFU pool per MoE layer (per-layer expert caches as in Eliseev & Mazur "
             "2023, Sec. 3.1); global: one pool over all layers in the shared budget"},
    {.section = "lfu",
     .key = "halve_every_steps",
     .type = CONFIG_U64,
     .offset = offsetof(lfu_knobs, halve_every_steps),
     .min = 0,
     .max = 1e15,
     .def = "0",
     .help = "halve every use count after this many steps (TinyLFU reset, Einziger et al. 2017, "
             "Sec. 3.3); 0 = counts never age"},
    {.section = "lfu",
     .key = "counts",
     .type = CONFIG_ENUM,
     .offset = offsetof(lfu_knobs, counts),
     .choices = lfu_counts_names,
     .def = "lifetime",
     .min = 1,
     .max = 0,
     .help = "lifetime: every access since the start, kept across evictions (Perfect-LFU); "
             "per_copy: accesses since the expert's current copy was loaded (In-Cache-LFU); "
             "Breslau et al. 1999, INFOCOM"},
};

struct policy {
    expert_cache cache;
    uint64_t halve_every_steps;
    uint64_t halvings;
};

static moesim_status lfu_create(const policy_params *params, const void *knobs_in,
                                policy_mem_view mem, policy **out, moesim_error *err) {
    const lfu_knobs *k = knobs_in;
    policy *p = moesim_xcalloc(1, sizeof *p);
    moesim_status st =
        expert_cache_init(&p->cache, "lfu", params, mem, (expert_cache_scope)k->scope, 0,
                          expert_cache_key_lfu, NULL, err);
    if (st != MOESIM_OK) {
        free(p);
        return st;
    }
    p->halve_every_steps = k->halve_every_steps;
    p->cache.count_per_copy = k->counts == LFU_COUNTS_PER_COPY;
    *out = p;
    return MOESIM_OK;
}

static void lfu_on_route(policy *p, const policy_route *route, policy_plan *plan) {
    expert_cache_begin_route(&p->cache);
    expert_cache_plan_route(&p->cache, route, plan);
}

static void lfu_end_step(policy *p, const policy_step *step, uint64_t now_ns) {
    (void)now_ns;
    if (p->halve_every_steps != 0 && (step->index + 1) % p->halve_every_steps == 0) {
        expert_cache_halve(&p->cache);
        p->halvings++;
    }
}

static size_t lfu_report(const policy *p, const char **names, double *values, size_t cap) {
    size_t n = expert_cache_report(&p->cache, names, values, cap);
    if (n < cap) names[n] = "halvings", values[n++] = (double)p->halvings;
    return n;
}

static void lfu_destroy(policy *p) {
    if (!p) return;
    expert_cache_free(&p->cache);
    free(p);
}

const policy_methods policy_lfu = {
    .api_version = POLICY_API_VERSION,
    .name = "lfu",
    .summary = "expert cache at expert.precision evicting the least frequently used expert",
    .knobs = lfu_knob_fields,
    .n_knobs = sizeof lfu_knob_fields / sizeof lfu_knob_fields[0],
    .knobs_size = sizeof(lfu_knobs),
    .create = lfu_create,
    .on_route = lfu_on_route,
    .end_step = lfu_end_step,
    .report = lfu_report,
    .destroy = lfu_destroy,
    .ignores_lookahead = true,
};
