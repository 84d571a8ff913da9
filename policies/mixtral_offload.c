/* `mixtral-offload`: the offloading scheme of Eliseev & Mazur 2023, "Fast Inference of
 * Mixture-of-Experts Language Models with Offloading" (arXiv:2312.17238): a per-layer LRU cache of
 * k experts at one precision (Sec. 3.1, "Expert Locality and LRU Caching"), plus speculative
 * expert loading (Sec. 3.2): while layer l runs, the next layer's gating function is applied to
 * layer l's hidden state and the experts it ranks highest are loaded into layer l+1's cache ahead
 * of need. In our API that guess is the look-ahead prediction at distance 1 that on_route receives
 * (lookahead_ids[token][0][...], from the trace or the simulator's emulated predictor); with no
 * predictions the policy is a plain per-layer LRU. Per route: the layer's accesses are processed
 * one (token, slot) at a time in token order exactly as `lru` does (expert_cache.h), a miss
 * loading on demand and evicting the layer's least recently used expert the route has not used
 * yet. Then each token's first mixtral-offload.prefetch_experts guesses for layer l+1 are
 * gathered (union over the batch; with batch size 1, the paper's setting, the token's top
 * guesses), ranked by summed predicted score (ties: lower id), cut to the room the pool can
 * spare, and loaded with prefetch priority, each entering layer l+1's LRU as its newest entry and
 * evicting that layer's least recently used expert that is not itself guessed. The room is the
 * whole pool, even at top_k experts per layer (the paper's 12 GB setting): a wrong guess not yet
 * copied is cancelled by the memory system when layer l+1 runs without it. The last layer does not guess past the end of the model (the paper's
 * guess stays within one token's forward pass). The cache size per layer is
 * mixtral-offload.experts_per_layer, else cache.experts_per_layer, else the layer's share of the
 * expert budget; the cache starts empty. The paper's mixed quantization (HQQ) is
 * expressed by expert.precision. */
#include <stddef.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "common/check.h"
#include "policies/expert_cache.h"
#include "policies/policy.h"
#include "policies/score_order.h"

typedef struct mixtral_offload_knobs {
    uint32_t experts_per_layer; /* k; 0: cache.experts_per_layer or the budget's share */
    uint32_t prefetch_experts;  /* guesses loaded per token; 0: top_k */
} mixtral_offload_knobs;

static const config_field mixtral_offload_knob_fields[] = {
    {.section = "mixtral-offload",
     .key = "experts_per_layer",
     .type = CONFIG_U32,
     .offset = offsetof(mixtral_offload_knobs, experts_per_layer),
     .min = 0,
     .max = MODEL_MAX_EXPERTS,
     .def = "0",
     .help = "k, the LRU cache size per layer (Eliseev & Mazur 2023, Sec. 3.1); 0 = "
             "cache.experts_per_layer, else the layer's share of the expert budget"},
    {.section = "mixtral-offload",
     .key = "prefetch_experts",
     .type = CONFIG_U32,
     .offset = offsetof(mixtral_offload_knobs, prefetch_experts),
     .min = 0,
     .max = MODEL_MAX_EXPERTS,
     .def = "0",
     .help = "next-layer experts speculatively loaded per token, the top guesses of the next "
             "layer's gate on this layer's hidden state (Eliseev & Mazur 2023, Sec. 3.2); 0 = "
             "the model's top_k (what the router will pick)"},
};

struct policy {
    expert_cache cache;
    uint32_t prefetch_experts; /* resolved: >= 1 */
    uint32_t lookahead_depth, lookahead_k;
    double *score;        /* [n_experts] summed predicted score of each candidate */
    uint16_t *candidates; /* [n_experts] candidate expert ids, best first */
    double *cand_score;   /* [n_experts] their summed scores, in the same order */
    score_order order;    /* the candidates' ordering (higher summed score, then lower id) */
    uint64_t *cand_mark;  /* [n_experts] == cand_epoch: already a candidate */
    uint64_t cand_epoch;
    uint64_t prefetches, prefetch_skipped;
};

static moesim_status mixtral_offload_create(const policy_params *params, const void *knobs_in,
                                            policy_mem_view mem, policy **out, moesim_error *err) {
    const mixtral_offload_knobs *k = knobs_in;
    if (k->prefetch_experts > params->n_experts) /* more would be cut silently */
        return moesim_fail(err, MOESIM_EINPUT,
                           "[mixtral-offload] prefetch_experts: expected at most the model's %u "
                           "experts, got %u",
                           params->n_experts, k->prefetch_experts);
    policy *p = moesim_xcalloc(1, sizeof *p);
    moesim_status st =
        expert_cache_init(&p->cache, "mixtral-offload", params, mem, EXPERT_CACHE_LAYER,
                          k->experts_per_layer, expert_cache_key_lru, NULL, err);
    if (st != MOESIM_OK) {
        free(p);
        return st;
    }
    p->prefetch_experts = k->prefetch_experts ? k->prefetch_experts : params->top_k;
    p->lookahead_depth = params->lookahead_depth;
    p->lookahead_k = params->lookahead_k;
    p->score = moesim_xcalloc(params->n_experts, sizeof *p->score);
    p->candidates = moesim_xcalloc(params->n_experts, sizeof *p->candidates);
    p->cand_score = moesim_xcalloc(params->n_experts, sizeof *p->cand_score);
    score_order_init(&p->order, params->n_experts);
    p->cand_mark = moesim_xcalloc(params->n_experts, sizeof *p->cand_mark);
    *out = p;
    return MOESIM_OK;
}

/* Gathers layer + 1's predicted experts of the route, best first (higher summed score, then
 * lower id); returns how many. */
static uint32_t gather_candidates(policy *p, const policy_route *r) {
    uint32_t per_token =
        p->prefetch_experts < p->lookahead_k ? p->prefetch_experts : p->lookahead_k;
    uint32_t n = 0;
    p->cand_epoch++;
    for (uint32_t t = 0; t < r->n_tokens; t++) {
        if (r->experts[(size_t)t * r->top_k] == POLICY_NO_EXPERT) continue; /* not recorded */
        /* distance d = 1 is the first of the D rows of this token */
        size_t base = (size_t)t * p->lookahead_depth * p->lookahead_k;
        for (uint32_t j = 0; j < per_token; j++) {
            uint16_t e = r->lookahead_ids[base + j];
            if (e == POLICY_NO_EXPERT) continue;
            MOESIM_ASSERT(e < p->cache.n_experts);
            double s = r->lookahead_scores[base + j];
            if (p->cand_mark[e] != p->cand_epoch) {
                p->cand_mark[e] = p->cand_epoch;
                p->score[e] = 0.0;
                p->candidates[n++] = e;
            }
            p->score[e] += s;
        }
    }
    for (uint32_t i = 0; i < n; i++) p->cand_score[i] = p->score[p->candidates[i]];
    score_order_sort(&p->order, p->candidates, p->cand_score, n);
    return n;
}

static void prefetch_next_layer(policy *p, const policy_route *r) {
    uint32_t next = r->layer + 1;
    if (r->lookahead_ids == NULL || p->lookahead_depth == 0 || next >= p->cache.n_layers) return;
    uint32_t n = gather_candidates(p, r);
    /* room for the guesses: the whole pool, even when it holds only top_k experts (the paper's
     * 12 GB setting, Sec. 4: 2 experts per layer). A wrong guess not yet copied is cancelled
     * when the next layer runs without it (core/memsys.h); one whose copy has started makes the
     * host wait for it to land before the next route, as an engine waits for its DMA. */
    uint32_t room = p->cache.layer_capacity;
    if (n > room) {
        p->prefetch_skipped += n - room;
        n = room;
    }
    for (uint32_t i = 0; i < n; i++) expert_cache_pin(&p->cache, next, p->candidates[i]);
    expert_cache *c = &p->cache;
    for (uint32_t i = 0; i < n; i++) {
        uint16_t e = p->candidates[i];
        /* a speculatively loaded expert enters the LRU as its newest entry */
        policy_mem_result res = expert_cache_acquire_newest(c, next, e, POLICY_PREFETCH);
        if (res == POLICY_ISSUED) {
            p->prefetches++;
        } else if (res == POLICY_REFUSED) {
            p->prefetch_skipped++;
        }
    }
}

static void mixtral_offload_on_route(policy *p, const policy_route *route, policy_plan *plan) {
    expert_cache_begin_route(&p->cache);
    expert_cache_plan_route(&p->cache, route, plan);
    prefetch_next_layer(p, route);
}

/* gather_candidates reads each token's first prefetch_experts guesses (0: top_k). */
static uint32_t mixtral_offload_lookahead_candidates(const void *knobs) {
    return ((const mixtral_offload_knobs *)knobs)->prefetch_experts;
}

static void mixtral_offload_on_cancelled(policy *p, uint32_t layer, uint32_t expert,
                                        moesim_precision prec, uint32_t parts_mask,
                                        policy_class cls, uint64_t now_ns) {
    (void)prec, (void)parts_mask, (void)cls, (void)now_ns;
    expert_cache_forget(&p->cache, layer, expert);
}

static size_t mixtral_offload_report(const policy *p, const char **names, double *values,
                                     size_t cap) {
    size_t n = expert_cache_report(&p->cache, names, values, cap);
    if (n < cap) names[n] = "prefetches", values[n++] = (double)p->prefetches;
    if (n < cap) names[n] = "prefetch_skipped", values[n++] = (double)p->prefetch_skipped;
    if (n < cap) names[n] = "experts_per_layer", values[n++] = p->cache.layer_capacity;
    return n;
}

static void mixtral_offload_destroy(policy *p) {
    if (!p) return;
    expert_cache_free(&p->cache);
    free(p->score);
    free(p->candidates);
    free(p->cand_score);
    score_order_free(&p->order);
    free(p->cand_mark);
    free(p);
}

const policy_methods policy_mixtral_offload = {
    .api_version = POLICY_API_VERSION,
    .name = "mixtral-offload",
    .summary = "per-layer LRU plus speculative loading of the next layer's predicted experts "
               "(Eliseev & Mazur 2023)",
    .knobs = mixtral_offload_knob_fields,
    .n_knobs = sizeof mixtral_offload_knob_fields / sizeof mixtral_offload_knob_fields[0],
    .knobs_size = sizeof(mixtral_offload_knobs),
    .create = mixtral_offload_create,
    .on_route = mixtral_offload_on_route,
    .on_transfer_cancelled = mixtral_offload_on_cancelled,
    .report = mixtral_offload_report,
    .destroy = mixtral_offload_destroy,
    .lookahead_distances = 1, /* speculative loading guesses the next layer's experts (Sec. 3.2) */
    .lookahead_candidates_with = mixtral_offload_lookahead_candidates,
};
