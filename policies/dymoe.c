/* DyMoE: importance-aware mixed precision, depth-aware retention, look-ahead prefetch and a
 * mixed-precision LRU expert cache ([DyMoE] Huang et al., Sec. 4; the
 * mapping paper -> code -> knobs is in policies/README.md, section dymoe).
 *
 * Per MoE layer l of a step (on_route), with the M experts the step activates in that layer:
 *   1. importance of each activated expert: prefill = heavy-hitter token load (Eq. 1-2, ties by
 *      total token load, then gate mass); decode = gate score (Eq. 3, summed over the batch);
 *   2. t_l critical experts (Eq. 4-5): the t_l most important run at `hi`, the others at `lo`
 *      (4/2) or are skipped (4/0, lo = skip);
 *   3. the mixed-precision cache serves each request under its three rules, issuing demand
 *      loads for misses and evicting least-recently-used experts when the budget is full;
 *   4. the prefetcher loads the predicted experts of layer l+1 (Eq. 6-8), each at the precision
 *      its forecast importance gives it: the first t_{l+1} (Eq. 5 for layer l+1) at `hi`, the
 *      rest of Eq. 7's prefill set at `lo` (none with 4/0); in decode t is t_{l+1} itself
 *      (prefetch_t_rule = critical), or the model's top_k with the sub-critical ones at `lo`
 *      (top_k). They enter the LRU list at its least recent end and move up when used
 *      (prefetch_insert).
 *
 * Units: bytes (uint64_t), no time is used (the policy is driven by routing alone).
 * Invariants: an expert is held at one precision at most (rule 1). A LO copy whose eviction the
 * memory system refused (its copy had started) is "stale": not held, retried at every later layer,
 * and no HI copy of that expert is loaded until it is gone (a LO request takes it back instead).
 * Every activated expert gets a plan entry whose parts are resident or loading. */
#include "policies/dymoe.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"

#define DYMOE_NIL UINT32_MAX

/* ---- knobs ---- */

static const char *const dymoe_hi_choices[] = {"bf16", "fp8", "int8", "int4", "int3", "int2", NULL};
static const char *const dymoe_lo_choices[] = {"bf16", "fp8",  "int8", "int4",
                                               "int3", "int2", "skip", NULL};
#define DYMOE_LO_SKIP 6
static const char *const dymoe_rounding_choices[] = {"carry", "ceil", NULL};
static const char *const dymoe_prefetch_insert_choices[] = {"cold", "hot", NULL};
static const char *const dymoe_prefetch_t_rule_choices[] = {"critical", "top_k", NULL};

#define K(key, type, member, lo, hi, choices, def, help)                                           \
    {                                                                                              \
        "dymoe", key, type, offsetof(dymoe_knobs, member), sizeof(((dymoe_knobs *)0)->member),     \
            false, lo, hi, choices, def, help                                                      \
    }

static const config_field dymoe_knob_fields[] = {
    K("lambda", CONFIG_F64, lambda, 0, 1, NULL, "0.5",
      "Eq. 4 retention floor of the deepest layer; default 0.5 = the paper's r = 0.75 (Sec. 6.2)"),
    K("retention", CONFIG_F64, retention, 0, 1, NULL, "0",
      "Table 2 average retention r; 0: use lambda; else in [0.5, 1] and lambda = 2r - 1"),
    K("hi", CONFIG_ENUM, hi, 1, 0, dymoe_hi_choices, "int4",
      "precision of critical experts; Sec. 5: 4-bit (GPTQ) in both 4/2 and 4/0"),
    K("lo", CONFIG_ENUM, lo, 1, 0, dymoe_lo_choices, "int2",
      "precision of sub-critical experts, or skip (0-bit); Sec. 5 '4/2' (int2), '4/0' (skip)"),
    K("dyquant", CONFIG_BOOL, dyquant, 1, 0, NULL, "true",
      "dynamic quantization (Sec. 4.2-4.3); off: all at hi (Table 3 rows 1-3)"),
    K("cache", CONFIG_BOOL, cache, 1, 0, NULL, "true",
      "mixed-precision LRU cache (Sec. 4.4.2); off: load on demand (Table 3 row 1)"),
    K("prefetch", CONFIG_BOOL, prefetch, 1, 0, NULL, "true",
      "look-ahead prefetcher (Sec. 4.4.1, Eq. 6-8; Table 3 rows 3, 5, 6)"),
    K("prefetch_t", CONFIG_U32, prefetch_t, 0, 1024, NULL, "0",
      "Eq. 8 decode top-t; 0: as prefetch_t_rule says (the paper gives no value)"),
    K("prefetch_t_rule", CONFIG_ENUM, prefetch_t_rule, 1, 0, dymoe_prefetch_t_rule_choices,
      "critical",
      "Eq. 8's t when prefetch_t = 0: critical = Eq. 5's t_{l+1} (Sec. 4.4.1 prefetches "
      "'critical experts'); top_k = the model's top_k, sub-critical ones at lo (see README)"),
    K("prefetch_t_prefill", CONFIG_U32, prefetch_t_prefill, 0, 1024, NULL, "0",
      "Eq. 7 prefill top-t; 0: every expert some token's top-k predicts (paper gives no value)"),
    K("heavy_hitter_k", CONFIG_U32, heavy_hitter_k, 0, 1u << 30, NULL, "0",
      "Eq. 2 top-k heavy-hitter tokens per step; 0: use heavy_hitter_share"),
    K("heavy_hitter_share", CONFIG_F64, heavy_hitter_share, 0.001, 1, NULL, "0.2",
      "Eq. 2 k as a share of the step's tokens; 0.2 = H2O's budget (Zhang et al. 2023, cited)"),
    K("rounding", CONFIG_ENUM, rounding, 1, 0, dymoe_rounding_choices, "carry",
      "Eq. 5: carry (realized average = r, see README) or ceil (literal)"),
    K("prefetch_insert", CONFIG_ENUM, prefetch_insert, 1, 0, dymoe_prefetch_insert_choices, "cold",
      "Sec. 4.4.2's 'standard LRU' orders by last use; cold: a prefetched expert is least recent "
      "until used; hot: a prefetch counts as a use (paper silent; see README)"),
};
#undef K

/* ---- pure pieces (dymoe.h) ---- */

double dymoe_retention_at(double lambda, uint32_t layer, uint32_t n_layers) {
    MOESIM_ASSERT(n_layers > 0 && layer < n_layers);
    if (n_layers == 1) return dymoe_retention_for_lambda(lambda);
    /* Eq. 4: r(l) = (1 - lambda) * (cos(pi * l / (L - 1)) + 1) / 2 + lambda */
    double x = (double)layer / (double)(n_layers - 1);
    return (1.0 - lambda) * (cos(M_PI * x) + 1.0) / 2.0 + lambda;
}

double dymoe_retention_for_lambda(double lambda) { return (1.0 + lambda) / 2.0; }

double dymoe_lambda_for_retention(double retention) {
    MOESIM_ASSERT(retention >= 0.5 && retention <= 1.0);
    return 2.0 * retention - 1.0;
}

/* Tolerance for r * M landing a hair above an integer through rounding of the cosine. */
#define DYMOE_CEIL_EPS 1e-9

uint32_t dymoe_critical_count(double r_l, uint32_t m, dymoe_rounding rounding, double *carry) {
    double want = r_l * (double)m;
    if (rounding == DYMOE_ROUND_CEIL) {
        /* Eq. 5: t_l = ceil(r(l) * M) */
        double t = ceil(want - DYMOE_CEIL_EPS);
        return t < 0 ? 0u : (t > m ? m : (uint32_t)t);
    }
    MOESIM_ASSERT(carry != NULL);
    /* Eq. 5 with the rounding remainder carried to the layer's next step (error diffusion): the
     * sum of t over steps stays within 1/2 of the sum of r(l) * M, so the realized share of
     * critical experts is r(l) even when M = 2 (where ceil would keep every expert). */
    double with_carry = want + *carry;
    double t = floor(with_carry + 0.5);
    if (t < 0) t = 0;
    if (t > m) t = m;
    *carry = with_carry - t;
    return (uint32_t)t;
}

uint32_t dymoe_heavy_hitter_k(uint32_t n_tokens, uint32_t k_abs, double share) {
    uint64_t k = k_abs ? k_abs : (uint64_t)ceil(share * (double)n_tokens - DYMOE_CEIL_EPS);
    return k > n_tokens ? n_tokens : (uint32_t)k;
}

/* Heavy-hitter selection: binary heap-free partial order via qsort over (importance, index). */
typedef struct dymoe_token_rank {
    float importance;
    uint32_t token;
} dymoe_token_rank;

static int dymoe_token_rank_cmp(const void *a, const void *b) {
    const dymoe_token_rank *x = a, *y = b;
    if (x->importance != y->importance) return x->importance > y->importance ? -1 : 1;
    return x->token < y->token ? -1 : (x->token > y->token);
}

uint32_t dymoe_heavy_hitter_count(uint32_t n_tokens, uint32_t top_k, const uint16_t *experts,
                                  const float *importance, uint32_t k_hh, uint32_t n_experts,
                                  uint32_t *counts, uint32_t *scratch) {
    memset(counts, 0, (size_t)n_experts * sizeof *counts);
    if (k_hh > n_tokens) k_hh = n_tokens;
    if (k_hh == 0) return 0;
    /* Eq. 2's T_imp: the k tokens with the highest s_i (Eq. 1). */
    dymoe_token_rank *rank = moesim_xcalloc(n_tokens, sizeof *rank);
    for (uint32_t i = 0; i < n_tokens; i++) rank[i] = (dymoe_token_rank){importance[i], i};
    qsort(rank, n_tokens, sizeof *rank, dymoe_token_rank_cmp);
    for (uint32_t j = 0; j < k_hh; j++) scratch[j] = rank[j].token;
    free(rank);
    /* Eq. 2: I_Prefill(E_j) = |{t_i in Tokens_j : t_i in T_imp}| */
    for (uint32_t j = 0; j < k_hh; j++) {
        const uint16_t *row = experts + (size_t)scratch[j] * top_k;
        for (uint32_t s = 0; s < top_k; s++) {
            if (row[s] == POLICY_NO_EXPERT) continue;
            MOESIM_ASSERT(row[s] < n_experts);
            counts[row[s]]++;
        }
    }
    return k_hh;
}

/* True when item a ranks before item b in dymoe_rank's order. */
static bool rank_before(const double *key0, const double *key1, const double *key2,
                        const uint16_t *ids, uint32_t a, uint32_t b) {
    if (key0[a] != key0[b]) return key0[a] > key0[b];
    if (key1[a] != key1[b]) return key1[a] > key1[b];
    if (key2 && key2[a] != key2[b]) return key2[a] > key2[b];
    return ids[a] < ids[b];
}

/* An insertion sort in place (a route's active experts: top_k of them in decode), not an
 * allocation and qsort per route; the keys are finite and the ids distinct, so the order is
 * total and any sort gives the same. */
void dymoe_rank(uint32_t n, const double *key0, const double *key1, const double *key2,
                const uint16_t *ids, uint32_t *order) {
    for (uint32_t i = 0; i < n; i++) {
        uint32_t j = i;
        for (; j > 0 && rank_before(key0, key1, key2, ids, i, order[j - 1]); j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
}

/* Whether expert a ranks before expert b in Eq. 7's order: more votes, then the larger summed
 * score, then the lower id. The summed scores are finite (the trace's checks): a total order. */
static bool votes_before(const uint32_t *count, const double *score, uint16_t a, uint16_t b) {
    if (count[a] != count[b]) return count[a] > count[b];
    if (score[a] != score[b]) return score[a] > score[b];
    return a < b;
}

uint32_t dymoe_prefetch_select(uint32_t n_tokens, uint32_t depth, uint32_t k_pred, uint32_t k_use,
                               const uint16_t *lookahead_ids, const float *lookahead_scores,
                               uint32_t n_experts, uint32_t t, uint32_t *count, double *score,
                               uint16_t *voted, uint16_t *out) {
    if (k_use > k_pred) k_use = k_pred;
    const size_t stride = (size_t)depth * k_pred; /* distance 1 is each token's first row */
    /* the voted experts' tallies cleared (a few per token, not all E of every route) */
    for (uint32_t i = 0; i < n_tokens; i++)
        for (uint32_t k = 0; k < k_use; k++) {
            uint16_t e = lookahead_ids[i * stride + k];
            if (e == POLICY_NO_EXPERT) continue;
            MOESIM_ASSERT(e < n_experts);
            count[e] = 0;
            score[e] = 0;
        }
    /* Eq. 7: c_e = sum over tokens of 1(e in s_i), s_i = TopK_k(g^_i(l+1)) (Eq. 6, the trace's
     * look-ahead candidates are g^'s top-K' in descending order) */
    uint32_t n_voted = 0;
    for (uint32_t i = 0; i < n_tokens; i++) {
        const uint16_t *ids = lookahead_ids + i * stride;
        const float *sc = lookahead_scores ? lookahead_scores + i * stride : NULL;
        for (uint32_t k = 0; k < k_use; k++) {
            uint16_t e = ids[k];
            if (e == POLICY_NO_EXPERT) continue;
            if (count[e]++ == 0) voted[n_voted++] = e;
            score[e] += sc ? (double)sc[k] : 0.0;
        }
    }
    /* Top-t by c_e (Eq. 7); one token: top-t by predicted score (Eq. 8): the best t kept sorted
     * as the voted experts come (a repeated maximum scanned all E experts t times) */
    uint32_t n_out = 0;
    for (uint32_t v = 0; v < n_voted; v++) {
        uint16_t e = voted[v];
        uint32_t j = n_out;
        while (j > 0 && votes_before(count, score, e, out[j - 1])) j--;
        if (j >= t) continue;
        if (n_out < t) n_out++;
        memmove(out + j + 1, out + j, (n_out - 1 - j) * sizeof *out);
        out[j] = e;
    }
    return n_out;
}

dymoe_cache_action dymoe_cache_decide(dymoe_tier held, dymoe_tier wanted) {
    MOESIM_ASSERT(wanted == DYMOE_TIER_HI || wanted == DYMOE_TIER_LO);
    if (held == DYMOE_TIER_NONE) return DYMOE_CACHE_MISS;
    if (held == wanted) return DYMOE_CACHE_HIT;
    /* Sec. 4.4.2: "If a request requires High Precision but only Low Precision is cached, the
     * system treats it as a miss, loading the High-Precision Experts ... and evicting the
     * Low-Precision version." / "If Low Precision is requested but High Precision is cached, the
     * High-Precision version is reused". */
    return wanted == DYMOE_TIER_HI ? DYMOE_CACHE_PROMOTE : DYMOE_CACHE_REUSE_HI;
}

/* ---- the policy ---- */

typedef struct dymoe_entry {
    uint8_t tier;  /* dymoe_tier held (resident or loading) */
    uint8_t stale; /* a LO copy whose eviction was refused: still to evict (pending) */
    uint32_t prev; /* LRU list of the entry's pool, towards the most recently used */
    uint32_t next; /* towards the least recently used */
    uint64_t pin;  /* stamp of the on_route that planned or prefetched it (not a victim) */
} dymoe_entry;

/* Figures for the report. */
typedef struct dymoe_stats {
    uint64_t critical, activated; /* sum of t_l and of M over (layer, step) with dyquant */
    uint64_t hits, misses, promotions, reuses;
    uint64_t forced_lo, forced_skip; /* the budget could not take the planned precision */
    uint64_t prefetches, evictions, importance_fallbacks;
} dymoe_stats;

struct policy {
    policy_params params;
    dymoe_knobs knobs;
    policy_mem_view mem;
    double lambda;
    moesim_precision hi, lo;
    bool lo_skip;
    uint64_t bytes_hi, bytes_lo;
    uint32_t n_pools;     /* 1 (shared budget) or n_layers (per-layer pools) */
    uint32_t *lru_head;   /* [n_pools] most recently used entry, DYMOE_NIL if empty */
    uint32_t *lru_tail;   /* [n_pools] least recently used */
    dymoe_entry *entries; /* [n_layers][n_experts] */
    double *carry;        /* [n_layers] Eq. 5 rounding remainder */
    uint32_t *pending;    /* [n_layers * n_experts] entries with a stale LO copy */
    uint32_t n_pending;
    uint64_t stamp;
    bool is_prefill;
    /* scratch for one on_route, sized by n_experts or by the largest step seen */
    uint32_t *hh_counts;        /* [n_experts] */
    uint32_t *u32_e;            /* [n_experts] */
    double *key0, *key1, *key2; /* [n_experts] */
    uint32_t *order;            /* [n_experts] */
    uint8_t *want;              /* [n_experts] dymoe_tier wanted per active index, NONE = skip */
    uint16_t *pf_ids;           /* [n_experts] */
    uint16_t *pf_voted;         /* [n_experts] */
    double *retention;          /* [n_layers] Eq. 4's r(l) */
    uint32_t *tok_scratch;      /* [tok_cap] */
    uint32_t tok_cap;
    dymoe_stats stats;
};

static moesim_precision dymoe_tier_prec(const policy *p, dymoe_tier t) {
    MOESIM_ASSERT(t == DYMOE_TIER_HI || (t == DYMOE_TIER_LO && !p->lo_skip));
    return t == DYMOE_TIER_HI ? p->hi : p->lo;
}

static uint64_t dymoe_tier_bytes(const policy *p, dymoe_tier t) {
    return t == DYMOE_TIER_HI ? p->bytes_hi : p->bytes_lo;
}

static uint32_t dymoe_pool_of(const policy *p, uint32_t layer) {
    return p->n_pools == 1 ? 0 : layer;
}

/* Takes a held entry out of its pool's list (held <=> linked). */
static void dymoe_lru_unlink(policy *p, uint32_t idx) {
    dymoe_entry *en = &p->entries[idx];
    uint32_t pool = dymoe_pool_of(p, idx / p->params.n_experts);
    MOESIM_ASSERT(en->prev != DYMOE_NIL || p->lru_head[pool] == idx);
    if (en->prev != DYMOE_NIL)
        p->entries[en->prev].next = en->next;
    else
        p->lru_head[pool] = en->next;
    if (en->next != DYMOE_NIL)
        p->entries[en->next].prev = en->prev;
    else
        p->lru_tail[pool] = en->prev;
    en->prev = en->next = DYMOE_NIL;
}

/* Moves (or inserts) the entry to one end of its pool's list: the most recently used (hot) or
 * the least (a prefetch not yet used, under prefetch_insert = cold). */
static void dymoe_lru_place(policy *p, uint32_t idx, bool hot) {
    dymoe_entry *en = &p->entries[idx];
    uint32_t pool = dymoe_pool_of(p, idx / p->params.n_experts);
    bool linked = en->prev != DYMOE_NIL || p->lru_head[pool] == idx;
    if (linked) dymoe_lru_unlink(p, idx);
    uint32_t *end = hot ? &p->lru_head[pool] : &p->lru_tail[pool];
    uint32_t *other_end = hot ? &p->lru_tail[pool] : &p->lru_head[pool];
    uint32_t neighbour = *end;
    en->prev = hot ? DYMOE_NIL : neighbour;
    en->next = hot ? neighbour : DYMOE_NIL;
    if (neighbour == DYMOE_NIL)
        *other_end = idx;
    else if (hot)
        p->entries[neighbour].prev = idx;
    else
        p->entries[neighbour].next = idx;
    *end = idx;
}

/* Moves (or inserts) the entry to the most-recently-used end of its pool's list. */
static void dymoe_lru_touch(policy *p, uint32_t idx) { dymoe_lru_place(p, idx, true); }

/* Evicts whatever the entry holds; false when the memory system refused. */
static bool dymoe_evict_entry(policy *p, uint32_t idx) {
    dymoe_entry *en = &p->entries[idx];
    MOESIM_ASSERT(en->tier != DYMOE_TIER_NONE);
    uint32_t layer = idx / p->params.n_experts, expert = idx % p->params.n_experts;
    policy_mem_result r = p->mem.ops->evict(
        p->mem.mem, layer, expert, dymoe_tier_prec(p, (dymoe_tier)en->tier), POLICY_PARTS_ALL);
    if (r == POLICY_REFUSED) return false;
    dymoe_lru_unlink(p, idx);
    en->tier = DYMOE_TIER_NONE;
    p->stats.evictions++;
    return true;
}

/* Frees room in `layer`'s pool for `need` bytes by evicting least-recently-used entries that the
 * current layer does not use (pinned ones are skipped, refused evictions too). */
static bool dymoe_make_room(policy *p, uint32_t layer, uint64_t need) {
    const policy_mem_ops *ops = p->mem.ops;
    uint32_t pool = dymoe_pool_of(p, layer);
    uint32_t cur = p->lru_tail[pool];
    while (ops->free_bytes(p->mem.mem, layer) < need) {
        if (cur == DYMOE_NIL) return false;
        uint32_t victim = cur;
        cur = p->entries[cur].prev;
        if (p->entries[victim].pin == p->stamp) continue;
        (void)dymoe_evict_entry(p, victim);
    }
    return true;
}

/* Takes an entry off the pending-eviction list: its stale LO copy is wanted again. */
static void dymoe_unstale(policy *p, uint32_t idx) {
    for (uint32_t i = 0; i < p->n_pending; i++) {
        if (p->pending[i] != idx) continue;
        p->pending[i] = p->pending[--p->n_pending];
        break;
    }
    p->entries[idx].stale = 0;
}

/* Loads the entry at `tier` (class `cls`), making room first; records it as held. */
static bool dymoe_fetch(policy *p, uint32_t layer, uint32_t expert, dymoe_tier tier,
                        policy_class cls) {
    uint32_t idx = layer * p->params.n_experts + expert;
    MOESIM_ASSERT(p->entries[idx].tier == DYMOE_TIER_NONE);
    if (p->entries[idx].stale) {
        /* The LO copy awaiting eviction is still in HBM (its copy started): a LO request takes it
         * back as it is, needing no room; a HI request would duplicate the expert (rule 1), so
         * it waits until the LO copy is gone. */
        if (tier == DYMOE_TIER_HI) return false;
        dymoe_unstale(p, idx);
        p->entries[idx].tier = (uint8_t)tier;
        dymoe_lru_touch(p, idx);
        return true;
    }
    if (!dymoe_make_room(p, layer, dymoe_tier_bytes(p, tier))) return false;
    policy_mem_result r = p->mem.ops->load(p->mem.mem, layer, expert, dymoe_tier_prec(p, tier),
                                           POLICY_PARTS_ALL, cls);
    if (r == POLICY_REFUSED) return false;
    p->entries[idx].tier = (uint8_t)tier;
    dymoe_lru_place(p, idx,
                    cls != POLICY_PREFETCH || p->knobs.prefetch_insert == DYMOE_PREFETCH_HOT);
    if (cls == POLICY_PREFETCH && r == POLICY_ISSUED) p->stats.prefetches++;
    return true;
}

/* Rule 1 (no duplication): a LO copy being replaced by HI leaves the cache. When the memory system
 * refuses (its copy has started), the eviction is retried at every later layer. */
static void dymoe_drop_lo(policy *p, uint32_t idx) {
    uint32_t layer = idx / p->params.n_experts, expert = idx % p->params.n_experts;
    policy_mem_result r = p->mem.ops->evict(p->mem.mem, layer, expert, p->lo, POLICY_PARTS_ALL);
    if (r != POLICY_REFUSED) {
        p->stats.evictions++;
        return;
    }
    if (!p->entries[idx].stale) {
        p->entries[idx].stale = 1;
        p->pending[p->n_pending++] = idx;
    }
}

static void dymoe_retry_pending(policy *p) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < p->n_pending; i++) {
        uint32_t idx = p->pending[i];
        uint32_t layer = idx / p->params.n_experts, expert = idx % p->params.n_experts;
        if (p->mem.ops->evict(p->mem.mem, layer, expert, p->lo, POLICY_PARTS_ALL) ==
            POLICY_REFUSED) {
            p->pending[kept++] = idx;
        } else {
            p->entries[idx].stale = 0;
            p->stats.evictions++;
        }
    }
    p->n_pending = kept;
}

/* Load on demand (cache = off): nothing outlives its use. Evicts every held entry that the
 * current layer does not run, except this layer's (prefetched ones among them are used below). */
static void dymoe_drop_all_but(policy *p, uint32_t layer) {
    for (uint32_t pool = 0; pool < p->n_pools; pool++) {
        uint32_t cur = p->lru_tail[pool];
        while (cur != DYMOE_NIL) {
            uint32_t victim = cur;
            cur = p->entries[cur].prev;
            if (victim / p->params.n_experts == layer) continue;
            (void)dymoe_evict_entry(p, victim);
        }
    }
}

static moesim_status dymoe_create(const policy_params *params, const void *knobs_in,
                                  policy_mem_view mem, policy **out, moesim_error *err) {
    const dymoe_knobs *knobs = knobs_in;
    MOESIM_ASSERT(params && knobs && out && mem.ops);
    *out = NULL;
    if (params->n_layers == 0 || params->n_experts == 0 || params->n_experts > POLICY_NO_EXPERT)
        return moesim_fail(err, MOESIM_EINPUT, "dymoe: the model has %u MoE layers and %u experts",
                           params->n_layers, params->n_experts);
    if (knobs->retention != 0 && (knobs->retention < 0.5 || knobs->retention > 1))
        return moesim_fail(err, MOESIM_EINPUT,
                           "[dymoe] retention: expected 0 (use lambda) or a value in [0.5, 1] "
                           "(Eq. 4 averages (1 + lambda) / 2 >= 0.5), got %g",
                           knobs->retention);
    moesim_precision hi, lo = PREC_COUNT;
    if (!precision_from_name(dymoe_hi_choices[knobs->hi], &hi)) MOESIM_UNREACHABLE();
    bool lo_skip = knobs->lo == DYMOE_LO_SKIP;
    if (!lo_skip && !precision_from_name(dymoe_lo_choices[knobs->lo], &lo)) MOESIM_UNREACHABLE();
    uint64_t bytes_hi = 0, bytes_lo = 0;
    for (int part = 0; part < PART_COUNT; part++) {
        bytes_hi += params->part_bytes[hi][part];
        if (!lo_skip) bytes_lo += params->part_bytes[lo][part];
    }
    if (bytes_hi == 0)
        return moesim_fail(err, MOESIM_EINPUT, "[dymoe] hi: the host cannot store %s experts",
                           precision_name(hi));
    if (knobs->dyquant && !lo_skip) {
        if (bytes_lo == 0)
            return moesim_fail(err, MOESIM_EINPUT, "[dymoe] lo: the host cannot store %s experts",
                               precision_name(lo));
        if (bytes_lo >= bytes_hi)
            return moesim_fail(err, MOESIM_EINPUT,
                               "[dymoe] lo: expected a precision smaller than hi = %s or skip, "
                               "got %s",
                               precision_name(hi), precision_name(lo));
    }
    if (knobs->prefetch && params->lookahead_depth == 0)
        return moesim_fail(err, MOESIM_EINPUT,
                           "[dymoe] prefetch: needs look-ahead predictions (Eq. 6) and the run "
                           "has none; set dymoe.prefetch=off");
    const uint32_t counts[] = {knobs->prefetch_t, knobs->prefetch_t_prefill};
    const char *const count_keys[] = {"prefetch_t", "prefetch_t_prefill"};
    for (int i = 0; i < 2; i++) /* a layer's experts at most: more would be cut silently */
        if (counts[i] > params->n_experts)
            return moesim_fail(err, MOESIM_EINPUT,
                               "[dymoe] %s: expected at most the model's %u experts, got %u",
                               count_keys[i], params->n_experts, counts[i]);

    policy *p = moesim_xcalloc(1, sizeof *p);
    p->params = *params;
    p->knobs = *knobs;
    p->mem = mem;
    p->lambda =
        knobs->retention != 0 ? dymoe_lambda_for_retention(knobs->retention) : knobs->lambda;
    p->hi = hi;
    p->lo = lo_skip ? hi : lo; /* lo is never used as a precision when skipped */
    p->lo_skip = lo_skip;
    p->bytes_hi = bytes_hi;
    p->bytes_lo = bytes_lo;
    uint32_t L = params->n_layers, E = params->n_experts;
    p->n_pools = params->experts_per_layer ? L : 1;
    p->lru_head = moesim_xcalloc(p->n_pools, sizeof *p->lru_head);
    p->lru_tail = moesim_xcalloc(p->n_pools, sizeof *p->lru_tail);
    for (uint32_t i = 0; i < p->n_pools; i++) p->lru_head[i] = p->lru_tail[i] = DYMOE_NIL;
    p->entries = moesim_xcalloc((size_t)L * E, sizeof *p->entries);
    for (size_t i = 0; i < (size_t)L * E; i++)
        p->entries[i] = (dymoe_entry){DYMOE_TIER_NONE, 0, DYMOE_NIL, DYMOE_NIL, 0};
    p->carry = moesim_xcalloc(L, sizeof *p->carry);
    p->pending = moesim_xcalloc((size_t)L * E, sizeof *p->pending);
    p->hh_counts = moesim_xcalloc(E, sizeof *p->hh_counts);
    p->u32_e = moesim_xcalloc(E, sizeof *p->u32_e);
    p->key0 = moesim_xcalloc(E, sizeof *p->key0);
    p->key1 = moesim_xcalloc(E, sizeof *p->key1);
    p->key2 = moesim_xcalloc(E, sizeof *p->key2);
    p->order = moesim_xcalloc(E, sizeof *p->order);
    p->want = moesim_xcalloc(E, sizeof *p->want);
    p->pf_ids = moesim_xcalloc(E, sizeof *p->pf_ids);
    p->pf_voted = moesim_xcalloc(E, sizeof *p->pf_voted);
    p->retention = moesim_xcalloc(L, sizeof *p->retention);
    for (uint32_t l = 0; l < L; l++) p->retention[l] = dymoe_retention_at(p->lambda, l, L);
    *out = p;
    return MOESIM_OK;
}

static void dymoe_begin_step(policy *p, const policy_step *step) {
    p->is_prefill = step->is_prefill;
}

/* Step 1-2 of on_route: the wanted tier of every activated expert (p->want, by active index). */
static void dymoe_classify(policy *p, const policy_route *r) {
    uint32_t M = r->n_active;
    if (!p->knobs.dyquant) {
        for (uint32_t i = 0; i < M; i++) p->want[i] = DYMOE_TIER_HI;
        return;
    }
    const double *k2 = NULL;
    if (p->is_prefill && r->importance) {
        /* Prefill, Eq. 1-2: heavy-hitter token load; ties by total token load (Sec. 3.3: token
         * load is a proxy of heavy-hitter load), then by gate mass. */
        if (r->n_tokens > p->tok_cap) {
            p->tok_cap = r->n_tokens;
            p->tok_scratch = moesim_xrealloc(p->tok_scratch, p->tok_cap * sizeof *p->tok_scratch);
        }
        uint32_t k_hh =
            dymoe_heavy_hitter_k(r->n_tokens, p->knobs.heavy_hitter_k, p->knobs.heavy_hitter_share);
        dymoe_heavy_hitter_count(r->n_tokens, r->top_k, r->experts, r->importance, k_hh,
                                 p->params.n_experts, p->hh_counts, p->tok_scratch);
        for (uint32_t i = 0; i < M; i++) {
            p->key0[i] = p->hh_counts[r->active[i]];
            p->key1[i] = r->active_tokens[i];
            p->key2[i] = r->active_gate[i];
        }
        k2 = p->key2;
    } else if (p->is_prefill) {
        /* No Eq. 1 scores in the trace: token load stands in for heavy-hitter load (Sec. 3.3). */
        p->stats.importance_fallbacks++;
        for (uint32_t i = 0; i < M; i++) {
            p->key0[i] = r->active_tokens[i];
            p->key1[i] = r->active_gate[i];
        }
    } else {
        /* Decode, Eq. 3: I(E_j) = g_j (summed over the batch's tokens when batch > 1). */
        for (uint32_t i = 0; i < M; i++) {
            p->key0[i] = r->active_gate[i];
            p->key1[i] = r->active_tokens[i];
        }
    }
    dymoe_rank(M, p->key0, p->key1, k2, r->active, p->order);
    /* Eq. 4-5: the t_l most important are critical. */
    uint32_t t = dymoe_critical_count(p->retention[r->layer], M, (dymoe_rounding)p->knobs.rounding,
                                      &p->carry[r->layer]);
    p->stats.critical += t;
    p->stats.activated += M;
    for (uint32_t j = 0; j < M; j++)
        p->want[p->order[j]] =
            j < t ? DYMOE_TIER_HI : (p->lo_skip ? DYMOE_TIER_NONE : DYMOE_TIER_LO);
}

/* Step 3: serves one activated expert from the cache; returns its plan entry. */
static uint8_t dymoe_serve(policy *p, uint32_t layer, uint32_t expert, dymoe_tier wanted) {
    uint32_t idx = layer * p->params.n_experts + expert;
    dymoe_entry *en = &p->entries[idx];
    switch (dymoe_cache_decide((dymoe_tier)en->tier, wanted)) {
    case DYMOE_CACHE_HIT:
        p->stats.hits++;
        dymoe_lru_touch(p, idx);
        return (uint8_t)dymoe_tier_prec(p, wanted);
    case DYMOE_CACHE_REUSE_HI: /* rule 3 */
        p->stats.hits++;
        p->stats.reuses++;
        dymoe_lru_touch(p, idx);
        return (uint8_t)p->hi;
    case DYMOE_CACHE_PROMOTE: /* rule 2: a miss; the LO copy goes (rule 1), HI is loaded */
        p->stats.misses++;
        p->stats.promotions++;
        dymoe_lru_unlink(p, idx);
        en->tier = DYMOE_TIER_NONE;
        dymoe_drop_lo(p, idx);
        if (dymoe_fetch(p, layer, expert, DYMOE_TIER_HI, POLICY_DEMAND)) return (uint8_t)p->hi;
        break;
    case DYMOE_CACHE_MISS:
        p->stats.misses++;
        if (dymoe_fetch(p, layer, expert, wanted, POLICY_DEMAND))
            return (uint8_t)dymoe_tier_prec(p, wanted);
        break;
    }
    /* The budget cannot take the wanted precision even after evicting every unpinned expert:
     * run at LO if that fits, else skip (counted; only under budgets below one layer's need). */
    if (wanted == DYMOE_TIER_HI && !p->lo_skip && p->knobs.dyquant &&
        dymoe_fetch(p, layer, expert, DYMOE_TIER_LO, POLICY_DEMAND)) {
        p->stats.forced_lo++;
        return (uint8_t)p->lo;
    }
    p->stats.forced_skip++;
    return POLICY_RUN_SKIP;
}

/* Step 4, Eq. 6-8: prefetch the predicted experts of layer l+1, each at the precision its
 * forecast importance gives it (Sec. 3.3: "we can proactively forecast the importance of experts,
 * enabling the system to orchestrate their fidelity states"). The predicted set, ranked like
 * Eq. 2-3 rank the real one (decode: by predicted gate; prefill: by token frequency, the
 * Sec. 3.3 proxy of heavy-hitter load), is split by Eq. 4-5 for layer l+1: its first t_{l+1}
 * at HI, the rest at LO (not prefetched when LO is skip). */
static void dymoe_prefetch(policy *p, const policy_route *r) {
    uint32_t next = r->layer + 1;
    if (next >= p->params.n_layers || !r->lookahead_ids || p->params.lookahead_k == 0) return;
    uint32_t E = p->params.n_experts;
    uint32_t t, k_use, cap;
    if (p->is_prefill) {
        k_use = p->params.top_k; /* Eq. 6: s_i = TopK_k, k the model's top_k */
        t = E;                   /* Eq. 7: rank every predicted expert, take the top t below */
        cap = p->knobs.prefetch_t_prefill ? p->knobs.prefetch_t_prefill : E;
    } else {
        t = p->knobs.prefetch_t ? p->knobs.prefetch_t : p->params.top_k; /* Eq. 8 */
        k_use = t;
        cap = t;
    }
    /* Eq. 8's t by default is Eq. 5's critical count of layer l+1 (below): the prefetcher
     * exists "to mask the latency of loading critical experts" (Sec. 4.4.1) */
    bool t_critical = !p->is_prefill && !p->knobs.prefetch_t &&
                      p->knobs.prefetch_t_rule == DYMOE_PREFETCH_T_CRITICAL;
    if (t > E) t = E;
    uint32_t n = dymoe_prefetch_select(
        r->n_tokens, p->params.lookahead_depth, p->params.lookahead_k, k_use, r->lookahead_ids,
        r->lookahead_scores, E, t, p->u32_e, p->key0, p->pf_voted, p->pf_ids);
    /* Forecast of Eq. 5 for layer l+1 over the n predicted experts; the carry is only read. */
    uint32_t n_hi = n;
    if (p->knobs.dyquant) {
        double carry = p->carry[next];
        n_hi =
            dymoe_critical_count(p->retention[next], n, (dymoe_rounding)p->knobs.rounding, &carry);
    }
    if (t_critical && n_hi < cap) cap = n_hi;
    if (n > cap) n = cap;
    for (uint32_t j = 0; j < n; j++) {
        dymoe_tier tier = j < n_hi ? DYMOE_TIER_HI : DYMOE_TIER_LO;
        if (tier == DYMOE_TIER_LO && p->lo_skip) break; /* 4/0: sub-critical ones never run */
        uint32_t expert = p->pf_ids[j];
        uint32_t idx = next * E + expert;
        dymoe_entry *en = &p->entries[idx];
        en->pin = p->stamp;
        if (en->tier == DYMOE_TIER_HI || en->tier == tier) {
            /* already usable (rule 3 for a LO forecast); a forecast is not a use */
            if (p->knobs.prefetch_insert == DYMOE_PREFETCH_HOT) dymoe_lru_touch(p, idx);
            continue;
        }
        if (en->stale && tier == DYMOE_TIER_HI) continue; /* its LO copy still occupies the slot */
        if (en->tier == DYMOE_TIER_LO) {
            /* Forecast critical, held at LO: promote ahead of the request (rule 2). */
            dymoe_lru_unlink(p, idx);
            en->tier = DYMOE_TIER_NONE;
            dymoe_drop_lo(p, idx);
        }
        (void)dymoe_fetch(p, next, expert, tier, POLICY_PREFETCH);
    }
}

static void dymoe_on_route(policy *p, const policy_route *r, policy_plan *plan) {
    uint32_t L = p->params.n_layers, E = p->params.n_experts;
    MOESIM_ASSERT(r->layer < L && r->n_active <= E);
    p->stamp++;
    if (p->n_pending) dymoe_retry_pending(p);
    if (!p->knobs.cache) dymoe_drop_all_but(p, r->layer);

    dymoe_classify(p, r);
    for (uint32_t i = 0; i < r->n_active; i++) {
        MOESIM_ASSERT(r->active[i] < E);
        if (p->want[i] != DYMOE_TIER_NONE) p->entries[r->layer * E + r->active[i]].pin = p->stamp;
    }
    if (!p->knobs.cache) {
        /* Unplanned experts of this layer (prefetched but not activated, or skipped) leave too. */
        for (uint32_t e = 0; e < E; e++) {
            uint32_t idx = r->layer * E + e;
            if (p->entries[idx].tier != DYMOE_TIER_NONE && p->entries[idx].pin != p->stamp)
                (void)dymoe_evict_entry(p, idx);
        }
    }
    /* Critical experts claim the budget first, then sub-critical ones. */
    for (int pass = 0; pass < 2; pass++) {
        dymoe_tier tier = pass == 0 ? DYMOE_TIER_HI : DYMOE_TIER_LO;
        for (uint32_t i = 0; i < r->n_active; i++) {
            if (p->want[i] != tier) continue;
            plan->run[i] = dymoe_serve(p, r->layer, r->active[i], tier);
        }
    }
    for (uint32_t i = 0; i < r->n_active; i++)
        if (p->want[i] == DYMOE_TIER_NONE) plan->run[i] = POLICY_RUN_SKIP; /* 4/0 */

    if (p->knobs.prefetch) dymoe_prefetch(p, r);
}

static size_t dymoe_report(const policy *p, const char **names, double *values, size_t cap) {
    const dymoe_stats *s = &p->stats;
    double realized = s->activated ? (double)s->critical / (double)s->activated : 1.0;
    const char *n[] = {
        "lambda",      "retention_requested", "retention_realized", "hits",
        "misses",      "promotions",          "reuses_hi_for_lo",   "forced_lo",
        "forced_skip", "prefetches",          "evictions",          "importance_fallbacks"};
    double v[] = {p->lambda,
                  p->knobs.dyquant ? dymoe_retention_for_lambda(p->lambda) : 1.0,
                  p->knobs.dyquant ? realized : 1.0,
                  (double)s->hits,
                  (double)s->misses,
                  (double)s->promotions,
                  (double)s->reuses,
                  (double)s->forced_lo,
                  (double)s->forced_skip,
                  (double)s->prefetches,
                  (double)s->evictions,
                  (double)s->importance_fallbacks};
    size_t count = MOESIM_ARRAY_LEN(n) < cap ? MOESIM_ARRAY_LEN(n) : cap;
    for (size_t i = 0; i < count; i++) {
        names[i] = n[i];
        values[i] = v[i];
    }
    return count;
}

static void dymoe_destroy(policy *p) {
    if (!p) return;
    free(p->lru_head);
    free(p->lru_tail);
    free(p->entries);
    free(p->carry);
    free(p->pending);
    free(p->hh_counts);
    free(p->u32_e);
    free(p->key0);
    free(p->key1);
    free(p->key2);
    free(p->order);
    free(p->want);
    free(p->pf_ids);
    free(p->pf_voted);
    free(p->retention);
    free(p->tok_scratch);
    free(p);
}

static moesim_precision dymoe_hi_precision(const policy *p) { return p->hi; }

/* A prefetch the memory system dropped (its layer ran without it): the entry is no longer held. */
static void dymoe_on_cancelled(policy *p, uint32_t layer, uint32_t expert, moesim_precision prec,
                               uint32_t parts_mask, policy_class cls, uint64_t now_ns) {
    (void)prec, (void)parts_mask, (void)cls, (void)now_ns;
    uint32_t idx = layer * p->params.n_experts + expert;
    MOESIM_ASSERT(p->entries[idx].tier != DYMOE_TIER_NONE && !p->entries[idx].stale);
    dymoe_lru_unlink(p, idx);
    p->entries[idx].tier = DYMOE_TIER_NONE;
}

/* DRAM keeps hi first (critical experts, most of the gate mass), then lo when dyquant runs it. */
static uint32_t dymoe_load_precisions(const policy *p, moesim_precision order[PREC_COUNT]) {
    uint32_t n = 0;
    order[n++] = p->hi;
    if (p->knobs.dyquant && !p->lo_skip) order[n++] = p->lo;
    return n;
}

/* dymoe_prefetch reads Eq. 6's TopK_k of each token's predictions: k = top_k in prefill, Eq. 8's
 * t in decode (prefetch_t, else top_k). */
static uint32_t dymoe_lookahead_candidates(const void *knobs) {
    return ((const dymoe_knobs *)knobs)->prefetch_t;
}

/* Only the look-ahead prefetcher (Sec. 4.4.1) reads the predictions. */
static bool dymoe_ignores_lookahead_with(const void *knobs) {
    return !((const dymoe_knobs *)knobs)->prefetch;
}

const policy_methods policy_dymoe = {
    .api_version = POLICY_API_VERSION,
    .name = "dymoe",
    .summary = "DyMoE: importance-aware 4/2/0-bit experts, depth-aware retention, look-ahead "
               "prefetch, mixed-precision LRU",
    .knobs = dymoe_knob_fields,
    .n_knobs = MOESIM_ARRAY_LEN(dymoe_knob_fields),
    .knobs_size = sizeof(dymoe_knobs),
    .create = dymoe_create,
    .warmup = NULL,
    .begin_step = dymoe_begin_step,
    .on_route = dymoe_on_route,
    .on_transfer_done = NULL,
    .end_step = NULL,
    .on_transfer_cancelled = dymoe_on_cancelled,
    .report = dymoe_report,
    .destroy = dymoe_destroy,
    .hi_precision = dymoe_hi_precision,
    .load_precisions = dymoe_load_precisions,
    .ignores_lookahead_with = dymoe_ignores_lookahead_with,
    .lookahead_distances = 1, /* Eq. 6-8: the next layer's predicted experts */
    .lookahead_candidates_with = dymoe_lookahead_candidates,
};
