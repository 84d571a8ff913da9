/* [FIRM-MoE]: fine-grained sub-expert offloading with Meeting-of-Layers
 * prediction and HEOP's resource-adaptive (K, P) search. policies/README.md ("firm-moe") maps
 * every piece of the paper to this file and its knobs. One file (some 880 lines): the predictor,
 * the prefetch and HEOP's search share the per-layer-group state on_route updates in one pass,
 * the order below, as every other policy keeps its one story in one file.
 *
 * Mechanism, in the order on_route runs it for MoE layer l of a step:
 *   1. Plan: every activated expert runs at expert.precision (FIRM-MoE does not quantize: "our
 *      approach is orthogonal to model compression", Experiments Setup).
 *   2. HEOP bookkeeping (Algorithm 1 line 8): the prediction S_l made when
 *      layer l-1 routed is compared with the activated set A_l: n_unused = |S_l \ A_l|,
 *      n_miss = |A_l \ S_l|, n_hit = activated experts whose first n parts were already resident
 *      in the GPU cache when the router finished.
 *   3. Demand loads: every part (gate, up, down) of every activated expert that is absent is
 *      loaded on the demand class; the sub-expert LRU makes room (Method, Overview: "an LRU
 *      caching strategy is implemented", over "transmitted expert sub-modules").
 *   4. Meeting-of-Layers for layer t = l + 1 (Eq. 5-6): the participating layers are
 *      m = t-P .. t-1 (fewer for shallow layers, P < l in the paper); layer m's look-ahead at
 *      distance t - m, recorded in the trace (policy_route.lookahead_ids), gives its top-K set
 *      S_t^(m) per token; S_t is their intersection per token, united over the step's tokens.
 *      Look-ahead rows of the previous layers of the step are kept in a ring of D slots.
 *   5. Fine-grained prefetch: the first n of (gate, up, down) of every expert of S_t that is
 *      absent are loaded on the POLICY_PREFETCH class, most confident first (Method, "different
 *      pre-fetching granularities (n)"; Table 1 "+FG": n = 1). The simulator measures Eq. 7-8 from
 *      these prefetch-class loads.
 *   Steps 2, 4 and 5 run on decode steps (the paper's workload: it measures decoding) whose
 *   batch reaches the policy in one route; prefill steps are served by demand loads and the LRU.
 *   end_step: HEOP (Algorithm 1) per depth group: record the step's loss (Eq. 11), every N_update
 *   steps move K or P by delta, reverse after `patience` steps without improvement; after
 *   `profile_steps` decode steps fix each group's (K, P) at its lowest historical average cost.
 *
 * Invariants: the LRU lists hold exactly the parts this policy has loaded and not evicted (every
 * one resident or loading in the memory system); parts touched in the current on_route (stamp ==
 * serial) are never chosen as victims, so room made for a prefetch never costs the current layer
 * or the prediction being prefetched. No clock, no I/O, no globals: the only randomness is HEOP's
 * initial direction (Algorithm 1 line 5), drawn from params->seed. */
#include "policies/firm_moe.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/model.h"
#include "common/ranked.h"
#include "common/rng.h"

#define FIRM_REPORT_MAX 17
#define FIRM_NAME_LEN   48
#define FIRM_RNG_STREAM 0x4649524dull /* "FIRM": HEOP's initial directions */
#define FIRM_P_LIMIT    64            /* most layers one meeting can gather */

/* ---- pure pieces ---------------------------------------------------------------------------- */

/* The first K distinct valid ids in recorded order. */
static uint32_t topk_in_recorded_order(const uint16_t *ids, uint32_t k_prime, uint32_t K,
                                       uint32_t n_experts, uint16_t *out) {
    /* one bit per expert id, the words of n_experts alone cleared (an initializer of all of
     * them became `rep stos`, a sixth of mol_predict's time) */
    uint64_t taken[MODEL_MAX_EXPERTS / 64];
    for (uint32_t w = 0; w < (n_experts + 63) / 64; w++) taken[w] = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < k_prime && n < K; i++) {
        uint16_t e = ids[i];
        if (e >= n_experts) continue;
        uint64_t bit = 1ull << (e & 63);
        if (taken[e >> 6] & bit) continue;
        taken[e >> 6] |= bit;
        out[n++] = e;
    }
    return n;
}

/* A stable insertion of the valid, first-occurring candidates by descending score into the best
 * K so far (equal scores keep their recorded order; k_prime is small: the trace's K'). A
 * candidate that does not enter the best K changes nothing, a repeat or not, so only an entrant
 * is checked against the earlier ids. */
static uint32_t topk_by_score(const uint16_t *ids, const float *scores, uint32_t k_prime,
                              uint32_t K, uint32_t n_experts, uint16_t *out) {
    uint16_t best[MODEL_MAX_EXPERTS]; /* [n] indices into ids, best first */
    uint32_t n = 0;
    for (uint32_t i = 0; i < k_prime; i++) {
        if (ids[i] >= n_experts) continue;
        uint32_t at = n;
        while (at > 0 && scores[i] > scores[best[at - 1]]) at--;
        if (at >= K) continue;
        bool repeat = false;
        for (uint32_t j = 0; j < i && !repeat; j++) repeat = ids[j] == ids[i];
        if (repeat) continue;
        if (n < K) n++;
        for (uint32_t r = n - 1; r > at; r--) best[r] = best[r - 1];
        best[at] = (uint16_t)i;
    }
    for (uint32_t r = 0; r < n; r++) out[r] = ids[best[r]];
    return n;
}

uint32_t firm_topk_select(const uint16_t *ids, const float *scores, uint32_t k_prime, uint32_t K,
                          uint32_t n_experts, uint16_t *out) {
    /* recorded rows mostly list their candidates best first: those need no sorting */
    MOESIM_ASSERT(k_prime <= MODEL_MAX_EXPERTS);
    if (K > k_prime) K = k_prime;
    /* a ranked row's descending stable order is its recorded one */
    if (!scores || scores_ranked(scores, k_prime))
        return topk_in_recorded_order(ids, k_prime, K, n_experts, out);
    return topk_by_score(ids, scores, k_prime, K, n_experts, out);
}

/* Sets the bit of every valid id of ids[n] in set (MODEL_MAX_EXPERTS bits, cleared before). */
static void id_set_fill(uint64_t *set, const uint16_t *ids, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < MODEL_MAX_EXPERTS) set[ids[i] >> 6] |= 1ull << (ids[i] & 63);
}

static bool id_set_has(const uint64_t *set, uint16_t e) {
    return e < MODEL_MAX_EXPERTS && (set[e >> 6] >> (e & 63) & 1);
}

uint32_t firm_mol_intersect(const uint16_t *const *sets, const uint32_t *sizes, uint32_t n_sets,
                            uint16_t *out) {
    /* sets[0] filtered by each further set in turn, that set's members as a bit set: a look-up
     * per id instead of a scan of the set (K up to K', several layers per token) */
    if (n_sets == 0) return 0;
    const uint16_t *kept_so_far = sets[0]; /* then `out`, filtered in place */
    uint32_t n_out = sizes[0];
    for (uint32_t s = 1; s < n_sets && n_out > 0; s++) {
        uint64_t member[MODEL_MAX_EXPERTS / 64] = {0};
        id_set_fill(member, sets[s], sizes[s]);
        uint32_t kept = 0;
        for (uint32_t i = 0; i < n_out; i++)
            if (id_set_has(member, kept_so_far[i])) out[kept++] = kept_so_far[i];
        n_out = kept;
        kept_so_far = out;
    }
    if (kept_so_far != out) memcpy(out, kept_so_far, n_out * sizeof *out);
    return n_out;
}

void firm_heop_count(uint32_t n_pred, const bool *predicted, const bool *cached, uint32_t n_active,
                     firm_heop_counts *acc) {
    /* Neither list repeats an id, so the predictions used are the activations predicted:
     * n_unused needs no set of its own. */
    uint64_t used = 0, hit = 0;
    for (uint32_t i = 0; i < n_active; i++) {
        used += predicted[i];
        hit += cached[i] && !predicted[i];
    }
    MOESIM_ASSERT(used <= n_pred);
    acc->n_unused += n_pred - used;
    acc->n_miss += n_active - used;
    acc->n_hit += hit;
}

double firm_heop_loss(double alpha, double beta, const firm_heop_counts *c, uint32_t n_layers) {
    MOESIM_ASSERT(n_layers > 0);
    /* Eq. 11 */
    double loss = alpha * (double)c->n_unused + beta * ((double)c->n_miss - (double)c->n_hit);
    return loss / (double)n_layers;
}

static uint32_t clamp_u32(uint32_t v, uint32_t lo, uint32_t hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

void firm_heop_group_init(firm_heop_group *g, uint32_t K0, uint32_t P0, uint32_t K_max,
                          uint32_t P_max, firm_dim dim0, int delta0, bool from_incumbent) {
    MOESIM_ASSERT(K_max >= 1 && P_max >= 1);
    MOESIM_ASSERT(delta0 == 1 || delta0 == -1);
    memset(g, 0, sizeof *g);
    g->K_max = K_max;
    g->P_max = P_max;
    g->K = clamp_u32(K0, 1, K_max);
    g->P = clamp_u32(P0, 1, P_max);
    g->dim = dim0;
    g->delta = delta0;
    g->from_incumbent = from_incumbent;
    g->cost_sum = moesim_xcalloc((size_t)K_max * P_max, sizeof *g->cost_sum);
    g->cost_n = moesim_xcalloc((size_t)K_max * P_max, sizeof *g->cost_n);
}

void firm_heop_group_free(firm_heop_group *g) {
    free(g->cost_sum);
    free(g->cost_n);
    g->cost_sum = NULL;
    g->cost_n = NULL;
}

void firm_heop_group_record(firm_heop_group *g, double loss) {
    size_t cell = (size_t)(g->K - 1) * g->P_max + (g->P - 1);
    g->cost_sum[cell] += loss; /* the (K, P)'s historical cost, for line 28 */
    g->cost_n[cell]++;
    g->history_sum += loss; /* line 10: H_g <- H_g u {L_T^g} */
    g->history_n++;
    g->window_sum += loss;
    g->window_n++;
}

uint32_t firm_prefetch_parts_for_model(uint64_t total_params) {
    return total_params < FIRM_LARGE_MODEL_PARAMS ? 1 : 2;
}

/* Moves coordinate `dim` by `delta`; false when it would leave [1, max]. */
static bool heop_try_move(firm_heop_group *g, firm_dim dim, int delta) {
    uint32_t *v = dim == FIRM_DIM_K ? &g->K : &g->P;
    uint32_t max = dim == FIRM_DIM_K ? g->K_max : g->P_max;
    int64_t next = (int64_t)*v + delta;
    if (next < 1 || next > (int64_t)max) return false;
    *v = (uint32_t)next;
    return true;
}

/* Line 16: delta_g <- -delta_g, and the text: "the search dimension is switched between K and
 * P", from the configuration in force. From the incumbent (heop_search = incumbent, not in the
 * paper): switching at every reversal only ever tries K + delta and P - delta, so the dimension
 * switches on every second consecutive reversal (K+, K-, P+, P- in turn) and the search resumes
 * from the configuration of the lowest window so far. */
static void heop_reverse(firm_heop_group *g) {
    g->delta = -g->delta;
    g->reversals++;
    if (!g->from_incumbent || g->reversals % 2 == 0)
        g->dim = g->dim == FIRM_DIM_K ? FIRM_DIM_P : FIRM_DIM_K;
    if (!g->from_incumbent) return;
    g->K = g->best_K;
    g->P = g->best_P;
}

bool firm_heop_group_update(firm_heop_group *g, uint64_t step, uint64_t patience) {
    if (g->window_n == 0) return false;
    /* line 14: avg(H_g) over every loss so far; the window alternative (knob) averages the
     * losses since the last move, the configuration just tried alone */
    double avg = g->history_average ? g->history_sum / (double)g->history_n
                                    : g->window_sum / (double)g->window_n;
    g->window_sum = 0;
    g->window_n = 0;
    if (!g->has_best || avg < g->best_window) {
        g->has_best = true;
        g->best_window = avg;
        g->best_K = g->K;
        g->best_P = g->P;
        g->last_improve_step = step;
        g->reversals = 0;
    } else if (step - g->last_improve_step >= patience) { /* line 15 */
        heop_reverse(g);
        g->last_improve_step = step; /* the patience count starts again in the new direction */
    }
    /* lines 18-22: one coordinate moves by delta; a move that would leave the box counts as an
     * exhausted direction (reverse as above), four tries cover every move of the incumbent. */
    for (int attempt = 0; attempt < 4; attempt++) {
        if (heop_try_move(g, g->dim, g->delta)) {
            g->moves++;
            return true;
        }
        heop_reverse(g);
    }
    return false; /* a 1 x 1 box */
}

void firm_heop_group_best(const firm_heop_group *g, uint32_t *K, uint32_t *P) {
    *K = g->K;
    *P = g->P;
    bool found = false;
    double best = 0;
    for (uint32_t k = 1; k <= g->K_max; k++) {
        for (uint32_t q = 1; q <= g->P_max; q++) {
            size_t cell = (size_t)(k - 1) * g->P_max + (q - 1);
            if (g->cost_n[cell] == 0) continue;
            double avg = g->cost_sum[cell] / (double)g->cost_n[cell];
            if (!found || avg < best) { /* strict: ties keep the smaller K, then P */
                found = true;
                best = avg;
                *K = k;
                *P = q;
            }
        }
    }
}

uint32_t firm_group_of_layer(uint32_t layer, uint32_t n_layers, uint32_t n_groups,
                             bool paper_split) {
    MOESIM_ASSERT(layer < n_layers && n_groups >= 1 && n_groups <= n_layers);
    if (paper_split && n_groups == 3) {
        /* Figure 6 (OLMoE, 16 layers): 5 shallow, 4 deep; each group keeps at least one layer */
        uint32_t shallow = (uint32_t)((5ull * n_layers + 8) / 16);
        uint32_t deep = (uint32_t)((4ull * n_layers + 8) / 16);
        if (shallow < 1) shallow = 1;
        if (deep < 1) deep = 1;
        if (shallow + deep > n_layers - 1) deep = n_layers - 1 - shallow;
        return layer < shallow ? 0 : layer >= n_layers - deep ? 2 : 1;
    }
    return (uint32_t)((uint64_t)layer * n_groups / n_layers);
}

/* ---- the policy ----------------------------------------------------------------------------- */

/* LRU items per expert: gate, up, down and one unused, a power of two so that an item's expert
 * and part come by shift and mask. */
#define FIRM_SLOTS 4

/* One LRU item: a part of an expert. Links are meaningful only while the item is listed. */
typedef struct lru_node {
    int32_t prev, next; /* -1: none */
    uint64_t stamp;     /* serial of the last touch */
} lru_node;

/* One pool's list: head most recently used, tail the next victim; -1: empty. */
typedef struct lru_pool {
    int32_t head, tail;
} lru_pool;

/* One layer's look-ahead rows, kept until the layers it predicts have been predicted. */
typedef struct lookahead_slot {
    bool valid;
    uint32_t layer;
    uint64_t step;
    uint32_t n_tokens;
    uint16_t *ids; /* [n_tokens][D][K'] */
    float *scores; /* [n_tokens][D][K'] when has_scores, else the ids are best first */
    bool has_scores;
    size_t cap; /* entries allocated in ids and scores */
} lookahead_slot;

struct policy {
    firm_knobs knobs;
    policy_mem_view mem;
    moesim_precision prec;
    uint32_t L, E, D, Kp; /* MoE layers, experts per layer, look-ahead depth and width (K') */
    uint32_t K0, P0;      /* resolved starting (K, P) */
    uint32_t K_max, P_max;
    uint32_t n;           /* prefetch granularity in force (the knob, or by model size) */
    uint32_t prefix_mask; /* the first n parts: gate, gate|up or gate|up|down */
    uint64_t mask_bytes[1u << PART_COUNT]; /* [parts mask] bytes of those parts */

    /* LRU of sub-expert parts: item = (layer * E + expert) * FIRM_SLOTS + part */
    uint32_t n_pools;  /* 1 (shared budget) or L (cache.experts_per_layer) */
    lru_node *node;    /* [L][E][FIRM_SLOTS] */
    uint8_t *listed;   /* [L][E] parts in a list (resident or loading), bit 1 << part */
    uint8_t *resident; /* [L][E] listed parts the memory system has reported resident */
    lru_pool *pool;    /* [n_pools] */
    uint64_t serial;   /* on_route calls so far */

    /* the step */
    uint64_t step_index;
    bool is_prefill;
    uint32_t step_tokens;  /* tokens of the whole step (a route may carry part of them) */
    uint64_t decode_steps; /* t of Algorithm 1 */

    lookahead_slot *ring; /* [D] slot m % D holds layer m's rows */

    /* MoL scratch and the prediction for the next layer */
    uint16_t *cand;    /* [P_max][K_max] S_t^(m) of one token, nearest layer first */
    uint16_t *tok_set; /* [K_max] */
    uint64_t *mark;    /* [E] == mark_gen: already in pred */
    uint64_t mark_gen;
    uint16_t *pred; /* [E] S_t, most confident first */
    uint32_t n_pred;
    bool pred_valid;
    uint32_t pred_layer;
    uint64_t pred_step;
    bool *predicted; /* [E] scratch: activated expert i is in the prediction */
    bool *cached;    /* [E] scratch: activated expert i, not predicted, was cached at router time */

    /* HEOP */
    uint32_t G;
    uint8_t *group_of;             /* [L] firm_group_of_layer of each layer */
    firm_heop_group *grp;          /* [G] */
    firm_heop_counts *step_counts; /* [G] counts of the current step */
    uint32_t *step_layers;         /* [G] layers counted in the current step */
    bool heop_done;

    /* figures for the report (decode steps) */
    uint64_t n_predictions, n_predicted, n_empty;
    uint64_t parts_prefetched, prefetch_dropped;
    uint64_t mol_both, mol_predicted, mol_active; /* |S_l n A_l|, |S_l|, |A_l| summed */
    size_t n_names;
    char names[FIRM_REPORT_MAX][FIRM_NAME_LEN];
};

/* (layer, expert) as one index: the row of listed, the first item of the expert. */
static uint32_t expert_index(const policy *p, uint32_t layer, uint32_t expert) {
    return layer * p->E + expert;
}

static int32_t item_of(uint32_t le, uint32_t part) { return (int32_t)(le * FIRM_SLOTS + part); }

static lru_pool *pool_of(policy *p, uint32_t layer) {
    return &p->pool[p->n_pools == 1 ? 0 : layer];
}

/* Takes `it` out of its pool's links (its listed bit is the caller's). */
static void lru_detach(lru_node *node, int32_t it, lru_pool *pool) {
    int32_t prev = node[it].prev, next = node[it].next;
    if (prev >= 0)
        node[prev].next = next;
    else
        pool->head = next;
    if (next >= 0)
        node[next].prev = prev;
    else
        pool->tail = prev;
}

/* Links `it` at the head of `pool`, stamped. */
static void lru_attach(lru_node *node, int32_t it, lru_pool *pool, uint64_t serial) {
    node[it].prev = -1;
    node[it].next = pool->head;
    if (pool->head >= 0)
        node[pool->head].prev = it;
    else
        pool->tail = it;
    pool->head = it;
    node[it].stamp = serial;
}

static void lru_unlink(policy *p, int32_t it, lru_pool *pool) {
    lru_detach(p->node, it, pool);
    uint32_t le = (uint32_t)it / FIRM_SLOTS;
    uint8_t keep = (uint8_t) ~(1u << ((uint32_t)it % FIRM_SLOTS));
    p->listed[le] &= keep;
    p->resident[le] &= keep;
}

/* Makes the listed item `it` the most recently used of its pool. */
static void lru_touch(lru_node *node, int32_t it, lru_pool *pool, uint64_t serial) {
    if (pool->head != it) {
        lru_detach(node, it, pool);
        lru_attach(node, it, pool, serial);
    }
    node[it].stamp = serial;
}

/* Moves the run down, up, gate of expert `le` (headward to tailward, linked) to the head of
 * `pool`, in the same order, and stamps them. */
static void lru_touch_expert(lru_node *node, uint32_t le, lru_pool *pool, uint64_t serial) {
    int32_t gate = item_of(le, PART_GATE), up = gate + 1, down = gate + 2;
    int32_t head = pool->head;
    if (head != down) {
        int32_t prev = node[down].prev, next = node[gate].next;
        node[prev].next = next; /* prev exists: down is not the head */
        if (next >= 0)
            node[next].prev = prev;
        else
            pool->tail = prev;
        node[down].prev = -1;
        node[gate].next = head;
        node[head].prev = gate;
        pool->head = down;
    }
    node[gate].stamp = node[up].stamp = node[down].stamp = serial;
}

/* Touches the parts of each expert of experts[n] (of `layer`) that are in the cache (resident or
 * loading), in that order. Parts last touched together lie together, down headmost: those move
 * to the head in one splice, as touching them one by one in part order would move them. */
static void touch_present(policy *p, uint32_t layer, const uint16_t *experts, uint32_t n) {
    lru_node *node = p->node;
    lru_pool *pool = pool_of(p, layer);
    uint64_t serial = p->serial;
    uint32_t first = expert_index(p, layer, 0); /* in locals: the stores to node could reach */
    const uint8_t *listed = p->listed;          /* p's fields, for all the compiler knows */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t le = first + experts[i];
        uint32_t in = listed[le];
        int32_t gate = item_of(le, PART_GATE), up = gate + 1, down = gate + 2;
        if (in == POLICY_PARTS_ALL && node[down].next == up && node[up].next == gate) {
            lru_touch_expert(node, le, pool, serial);
            continue;
        }
        for (; in; in &= in - 1)
            lru_touch(node, item_of(le, (uint32_t)__builtin_ctz(in)), pool, serial);
    }
}

/* Parts of `mask` that the memory system holds neither resident nor loading. Read from the LRU
 * lists, not through policy_mem_ops.state (an indirect call per part): a part is in a list
 * exactly while it is loading or resident, for only this policy loads at its precision and the
 * list follows every load, eviction and cancellation. */
static uint32_t absent_parts(const policy *p, uint32_t le, uint32_t mask) {
    return ~(uint32_t)p->listed[le] & mask;
}

/* Whether the first n parts of (layer, expert) are resident when its router finished (HEOP's
 * n_hit). A resident part stays so until this policy evicts it (a cancellation drops only loading
 * parts), so the memory system is asked once per listed part until it answers resident; an
 * unlisted part is absent. */
static bool prefix_resident(policy *p, uint32_t layer, uint32_t expert) {
    uint32_t le = expert_index(p, layer, expert), want = p->prefix_mask;
    if ((p->listed[le] & want) != want) return false;
    for (uint32_t m = want & ~(uint32_t)p->resident[le]; m; m &= m - 1) {
        uint32_t part = (uint32_t)__builtin_ctz(m);
        if (p->mem.ops->state(p->mem.mem, layer, expert, p->prec, (expert_part)part) !=
            POLICY_RESIDENT)
            return false;
        p->resident[le] |= (uint8_t)(1u << part);
    }
    return true;
}

/* Evicts least recently used parts of `layer`'s pool until `need_bytes` are free. Parts touched
 * in this on_route are never victims; parts the memory system refuses (copy running, compute
 * using them) are skipped. The free bytes are asked once: an eviction done frees its part's
 * bytes, resident or loading (policy_mem_ops: loading parts count as used), and the victims are
 * of the pool asked about (asking after each victim made a batch-1 run 3 % slower). Returns
 * whether the bytes are free. */
static bool make_room(policy *p, uint32_t layer, uint64_t need_bytes) {
    lru_pool *pool = pool_of(p, layer);
    int32_t it = pool->tail;
    uint64_t free_bytes = p->mem.ops->free_bytes(p->mem.mem, layer);
    while (free_bytes < need_bytes) {
        if (it < 0 || p->node[it].stamp == p->serial) return false;
        int32_t prev = p->node[it].prev;
        uint32_t le = (uint32_t)it / FIRM_SLOTS, part = (uint32_t)it % FIRM_SLOTS;
        policy_mem_result r =
            p->mem.ops->evict(p->mem.mem, le / p->E, le % p->E, p->prec, 1u << part);
        if (r != POLICY_REFUSED) lru_unlink(p, it, pool);
        if (r == POLICY_ISSUED) free_bytes += p->mask_bytes[1u << part];
        it = prev;
    }
    return true;
}

/* Loads the parts `mask` (absent) of (layer, expert) on class `cls` after making room; adds them
 * to the LRU as most recently used, in part order. Returns the parts queued (0 when they did not
 * fit). */
static uint32_t load_parts(policy *p, uint32_t layer, uint32_t expert, uint32_t mask,
                           policy_class cls) {
    if (!mask || !make_room(p, layer, p->mask_bytes[mask])) return 0;
    policy_mem_result r = p->mem.ops->load(p->mem.mem, layer, expert, p->prec, mask, cls);
    if (r != POLICY_ISSUED) return 0;
    uint32_t le = expert_index(p, layer, expert);
    lru_pool *pool = pool_of(p, layer);
    for (uint32_t m = mask; m; m &= m - 1)
        lru_attach(p->node, item_of(le, (uint32_t)__builtin_ctz(m)), pool, p->serial);
    p->listed[le] |= (uint8_t)mask;
    return mask;
}

static uint32_t popcount_u32(uint32_t v) {
    uint32_t n = 0;
    for (; v; v &= v - 1) n++;
    return n;
}

/* Keeps layer `route->layer`'s look-ahead rows for the layers after it in this step. */
static void remember_lookahead(policy *p, const policy_route *route) {
    lookahead_slot *s = &p->ring[route->layer % p->D];
    size_t n = (size_t)route->n_tokens * p->D * p->Kp;
    if (n > s->cap) {
        s->ids = moesim_xrealloc(s->ids, n * sizeof *s->ids);
        s->scores = moesim_xrealloc(s->scores, n * sizeof *s->scores);
        s->cap = n;
    }
    memcpy(s->ids, route->lookahead_ids, n * sizeof *s->ids);
    s->has_scores = route->lookahead_scores != NULL;
    if (s->has_scores) memcpy(s->scores, route->lookahead_scores, n * sizeof *s->scores);
    s->valid = true;
    s->layer = route->layer;
    s->step = p->step_index;
    s->n_tokens = route->n_tokens;
}

/* Eq. 5-6 for layer t (>= 1), from the rows of layers t-P .. t-1 kept in the ring; per token the
 * intersection, united over the step's tokens into p->pred (most confident first). */
static void mol_predict(policy *p, uint32_t t, uint32_t n_tokens) {
    const firm_heop_group *g = &p->grp[p->group_of[t]];
    uint32_t K = g->K, P = g->P < t ? g->P : t; /* P < l: shallow layers have fewer */
    const lookahead_slot *part[FIRM_P_LIMIT];
    uint32_t n_part = 0;
    MOESIM_ASSERT(P <= FIRM_P_LIMIT);
    for (uint32_t d = 1; d <= P; d++) { /* m = t - d, nearest first */
        const lookahead_slot *s = &p->ring[(t - d) % p->D];
        if (s->valid && s->layer == t - d && s->step == p->step_index && s->n_tokens == n_tokens)
            part[n_part++] = s;
        else
            break; /* a layer that did not route this step ends the meeting */
    }
    uint64_t gen = ++p->mark_gen;
    uint64_t *mark = p->mark;
    uint16_t *pred = p->pred, *tok_set = p->tok_set, *cand = p->cand;
    uint32_t n_pred = 0, D = p->D, Kp = p->Kp, E = p->E, K_max = p->K_max;
    const uint16_t *sets[FIRM_P_LIMIT];
    uint32_t sizes[FIRM_P_LIMIT];
    for (uint32_t j = 0; j < n_part; j++) sets[j] = cand + (size_t)j * K_max;
    for (uint32_t tok = 0; tok < n_tokens && n_part > 0; tok++) {
        for (uint32_t j = 0; j < n_part; j++) {
            size_t row = ((size_t)tok * D + j) * Kp; /* distance d = j + 1 */
            const float *scores = part[j]->has_scores ? part[j]->scores + row : NULL;
            sizes[j] =
                firm_topk_select(part[j]->ids + row, scores, Kp, K, E, cand + (size_t)j * K_max);
        }
        uint32_t n = firm_mol_intersect(sets, sizes, n_part, tok_set);
        for (uint32_t i = 0; i < n; i++) {
            uint16_t e = tok_set[i];
            if (mark[e] == gen) continue;
            mark[e] = gen;
            pred[n_pred++] = e;
        }
    }
    p->n_pred = n_pred;
    p->pred_valid = true;
    p->pred_layer = t;
    p->pred_step = p->step_index;
}

/* Whether `expert` is in the prediction p->pred: mol_predict marked its members. */
static bool in_prediction(const policy *p, uint16_t expert) {
    return p->mark[expert] == p->mark_gen;
}

static void firm_on_route(policy *p, const policy_route *route, policy_plan *plan) {
    uint32_t l = route->layer;
    MOESIM_ASSERT(l < p->L);
    p->serial++;
    const uint16_t *active = route->active;
    uint32_t n_active = route->n_active;

    /* 1. plan: single precision */
    uint8_t *run = plan->run;
    uint8_t prec = (uint8_t)p->prec;
    for (uint32_t i = 0; i < n_active; i++) run[i] = prec;

    /* Prediction and prefetch run on decode steps whose batch comes in one route. A prefill
     * step activates most of a layer, and the host may split it into sub-routes that each fill
     * the pool, so prefetched bytes there could only stand in a demand load's way. */
    bool predicting = p->knobs.prefetch && !p->is_prefill && route->n_tokens == p->step_tokens;

    /* 2. HEOP bookkeeping for S_l vs A_l (Algorithm 1 line 8) */
    bool have_pred = p->pred_valid && p->pred_layer == l && p->pred_step == p->step_index;
    uint32_t n_pred = have_pred ? p->n_pred : 0;
    if (predicting && l >= 1) {
        /* n_hit counts cached activations that were not predicted: only those ask the cache;
         * membership by mol_predict's marks, set for exactly this layer's prediction */
        for (uint32_t i = 0; i < n_active; i++) {
            p->predicted[i] = have_pred && in_prediction(p, active[i]);
            p->cached[i] = !p->predicted[i] && prefix_resident(p, l, active[i]);
        }
        uint32_t g = p->group_of[l];
        firm_heop_counts c = {0};
        firm_heop_count(n_pred, p->predicted, p->cached, n_active, &c);
        p->step_counts[g].n_unused += c.n_unused;
        p->step_counts[g].n_miss += c.n_miss;
        p->step_counts[g].n_hit += c.n_hit;
        p->step_layers[g]++;
        /* Eq. 7-8 over the whole predicted set (the host sees only what was prefetched) */
        p->mol_both += n_pred - c.n_unused;
        p->mol_predicted += n_pred;
        p->mol_active += n_active;
    }

    /* 3. demand loads of the absent parts; the activated experts are protected first */
    touch_present(p, l, active, n_active);
    for (uint32_t i = 0; i < n_active; i++) {
        uint16_t e = active[i];
        uint32_t mask = absent_parts(p, expert_index(p, l, e), POLICY_PARTS_ALL);
        if (!mask) continue;
        uint32_t issued = load_parts(p, l, e, mask, POLICY_DEMAND);
        /* queued prefetches are cancelled as LRU victims; what cannot be is a copy already
         * started (at most one per copy stage), and the pool holds the layer's activated experts
         * beside two of those (checked at create): a demand load always finds room */
        MOESIM_ASSERT(issued == mask);
    }

    /* 4. Meeting-of-Layers prediction for the next layer (Eq. 5-6) */
    p->pred_valid = false;
    if (!predicting) return;
    if (route->lookahead_ids) remember_lookahead(p, route);
    if (l + 1 >= p->L) return;
    mol_predict(p, l + 1, route->n_tokens);
    p->n_predictions++;
    p->n_predicted += p->n_pred;
    p->n_empty += p->n_pred == 0;

    /* 5. fine-grained prefetch of the first n parts (POLICY_PREFETCH), most confident first */
    touch_present(p, l + 1, p->pred, p->n_pred);
    for (uint32_t i = 0; i < p->n_pred; i++) {
        uint32_t mask = absent_parts(p, expert_index(p, l + 1, p->pred[i]), p->prefix_mask);
        if (!mask) continue;
        uint32_t issued = load_parts(p, l + 1, p->pred[i], mask, POLICY_PREFETCH);
        p->parts_prefetched += popcount_u32(issued);
        p->prefetch_dropped += issued == 0;
    }
}

static void firm_begin_step(policy *p, const policy_step *step) {
    p->step_index = step->index;
    p->is_prefill = step->is_prefill;
    p->step_tokens = step->n_tokens;
    memset(p->step_counts, 0, p->G * sizeof *p->step_counts);
    memset(p->step_layers, 0, p->G * sizeof *p->step_layers);
}

static void firm_end_step(policy *p, const policy_step *step, uint64_t now_ns) {
    (void)now_ns;
    if (step->is_prefill) return; /* HEOP profiles decoding, the paper's metric */
    p->decode_steps++;
    if (!p->knobs.heop || p->heop_done) return;
    uint64_t t = p->decode_steps;
    for (uint32_t g = 0; g < p->G; g++) /* lines 7-11 */
        if (p->step_layers[g] > 0)
            firm_heop_group_record(&p->grp[g],
                                   firm_heop_loss(p->knobs.alpha, p->knobs.beta, &p->step_counts[g],
                                                  p->step_layers[g]));
    if (t % p->knobs.n_update == 0) /* lines 12-25 */
        for (uint32_t g = 0; g < p->G; g++)
            firm_heop_group_update(&p->grp[g], t, p->knobs.patience);
    if (t >= p->knobs.profile_steps) { /* lines 27-30: fix the best configuration */
        for (uint32_t g = 0; g < p->G; g++) {
            uint32_t K, P;
            firm_heop_group_best(&p->grp[g], &K, &P);
            p->grp[g].K = K;
            p->grp[g].P = P;
        }
        p->heop_done = true;
    }
}

static size_t firm_report(const policy *p, const char **names, double *values, size_t cap) {
    double v[FIRM_REPORT_MAX];
    size_t n = 0;
    for (uint32_t g = 0; g < p->G && n + 2 <= FIRM_REPORT_MAX; g++) {
        uint32_t K = p->grp[g].K, P = p->grp[g].P;
        if (p->knobs.heop && !p->heop_done) firm_heop_group_best(&p->grp[g], &K, &P);
        v[n++] = K;
        v[n++] = P;
    }
    double preds = (double)p->n_predictions;
    uint64_t profiled =
        p->decode_steps < p->knobs.profile_steps ? p->decode_steps : p->knobs.profile_steps;
    double extra[] = {
        p->knobs.heop ? (double)p->heop_done : 1.0,
        p->knobs.heop ? (double)profiled : 0.0,
        preds > 0 ? (double)p->n_predicted / preds : 0.0,
        preds > 0 ? (double)p->n_empty / preds : 0.0,
        p->mol_active ? (double)p->mol_both / (double)p->mol_active : 0.0,
        p->mol_predicted ? (double)p->mol_both / (double)p->mol_predicted : 0.0,
        (double)p->parts_prefetched,
        (double)p->prefetch_dropped,
        (double)p->n,
    };
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(extra) && n < FIRM_REPORT_MAX; i++) v[n++] = extra[i];
    MOESIM_ASSERT(n == p->n_names);
    size_t out = n < cap ? n : cap;
    for (size_t i = 0; i < out; i++) {
        names[i] = p->names[i];
        values[i] = v[i];
    }
    return out;
}

/* The memory system dropped a stale prefetch of these parts: they leave the LRU. */
static void firm_on_cancelled(policy *p, uint32_t layer, uint32_t expert, moesim_precision prec,
                              uint32_t parts_mask, policy_class cls, uint64_t now_ns) {
    (void)prec, (void)cls, (void)now_ns;
    uint32_t le = expert_index(p, layer, expert);
    for (uint32_t m = parts_mask & p->listed[le]; m; m &= m - 1)
        lru_unlink(p, item_of(le, (uint32_t)__builtin_ctz(m)), pool_of(p, layer));
}

static void firm_destroy(policy *p) {
    if (!p) return;
    for (uint32_t d = 0; p->ring && d < p->D; d++) {
        free(p->ring[d].ids);
        free(p->ring[d].scores);
    }
    for (uint32_t g = 0; p->grp && g < p->G; g++) firm_heop_group_free(&p->grp[g]);
    free(p->ring);
    free(p->grp);
    free(p->step_counts);
    free(p->step_layers);
    free(p->group_of);
    free(p->node);
    free(p->listed);
    free(p->resident);
    free(p->pool);
    free(p->cand);
    free(p->tok_set);
    free(p->mark);
    free(p->pred);
    free(p->predicted);
    free(p->cached);
    free(p);
}

static void firm_names_fill(policy *p) {
    static const char *const three[] = {"shallow", "middle", "deep"};
    size_t n = 0;
    for (uint32_t g = 0; g < p->G && n + 2 <= FIRM_REPORT_MAX; g++) {
        char group[24];
        if (p->G == 3)
            snprintf(group, sizeof group, "%s", three[g]);
        else if (p->G == 1)
            snprintf(group, sizeof group, "all");
        else
            snprintf(group, sizeof group, "group%u", g);
        snprintf(p->names[n++], FIRM_NAME_LEN, "%s.K", group);
        snprintf(p->names[n++], FIRM_NAME_LEN, "%s.P", group);
    }
    static const char *const extra[] = {
        "heop.done",       "heop.profiled_steps", "mol.mean_set_size",
        "mol.empty_share", "mol.accuracy",        "mol.utilization",
        "prefetch.parts",  "prefetch.dropped",    "prefetch.n"};
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(extra) && n < FIRM_REPORT_MAX; i++)
        snprintf(p->names[n++], FIRM_NAME_LEN, "%s", extra[i]);
    p->n_names = n;
}

static moesim_status firm_create(const policy_params *params, const void *knobs_v,
                                 policy_mem_view mem, policy **out, moesim_error *err) {
    const firm_knobs *k = knobs_v;
    MOESIM_ASSERT(k && params && out);
    moesim_precision prec = params->precision;
    for (uint32_t part = 0; part < PART_COUNT; part++)
        if (params->part_bytes[prec][part] == 0)
            return moesim_fail(err, MOESIM_EINPUT,
                               "firm-moe: expert.precision = %s: the host does not store experts "
                               "at that precision",
                               precision_name(prec));
    uint32_t L = params->n_layers, E = params->n_experts;
    if (k->n == 0 && !params->model)
        return moesim_fail(err, MOESIM_EINPUT,
                           "firm-moe.n = 0 (by model size, Table 2) needs the model's geometry; "
                           "set firm-moe.n to 1, 2 or 3");
    if (params->lookahead_depth == 0 || params->lookahead_k == 0)
        return moesim_fail(err, MOESIM_EINPUT,
                           "firm-moe.P: Meeting-of-Layers needs look-ahead predictions at "
                           "distances 1..P (Eq. 5); this run provides none");
    uint32_t K0 = k->K ? k->K : params->top_k;
    uint32_t K_max = params->lookahead_k < E ? params->lookahead_k : E;
    uint32_t P0 = k->P;
    if (params->lookahead_emulated) {
        /* the host's emulated predictor decides D and K' (predictor.depth, top-k): the meeting
         * gathers the layers that predict, each with the candidates it has */
        if (K0 > K_max) K0 = K_max;
        if (P0 > params->lookahead_depth) P0 = params->lookahead_depth;
    }
    if (K0 > K_max)
        return moesim_fail(err, MOESIM_EINPUT,
                           "firm-moe.K = %u: expected at most %u (the trace's look-ahead holds %u "
                           "candidates per distance, the model %u experts)",
                           K0, K_max, params->lookahead_k, E);
    if (P0 > params->lookahead_depth)
        return moesim_fail(err, MOESIM_EINPUT,
                           "firm-moe.P = %u: expected at most %u, the look-ahead depth of the "
                           "trace's predictions (moesim trace synth --lookahead D)",
                           P0, params->lookahead_depth);
    if (k->groups > L)
        return moesim_fail(err, MOESIM_EINPUT,
                           "firm-moe.groups = %u: expected at most the model's %u MoE layers",
                           k->groups, L);
    /* Every demand load must find room: one layer's activated experts (at most E, at most
     * batch x top-k in decode) beside the copies in flight that cannot be cancelled (a started
     * copy, at most one per stage: SSD and PCIe). */
    uint64_t expert_bytes = 0;
    for (uint32_t part = 0; part < PART_COUNT; part++)
        expert_bytes += params->part_bytes[prec][part];
    uint64_t active_max = (uint64_t)params->batch_size * params->top_k;
    if (active_max > E) active_max = E;
    uint64_t need_experts = active_max + 2;
    if (params->experts_per_layer > 0 && need_experts > E) need_experts = E; /* all fit */
    uint64_t need_bytes = need_experts * expert_bytes;
    if (params->experts_per_layer > 0 && params->experts_per_layer < need_experts)
        return moesim_fail(err, MOESIM_EINPUT,
                           "cache.experts_per_layer = %u: firm-moe needs at least %llu (the "
                           "experts one layer activates in a step, plus two copies in flight)",
                           params->experts_per_layer, (unsigned long long)need_experts);
    if (params->experts_per_layer == 0 && params->expert_budget_bytes < need_bytes)
        return moesim_fail(err, MOESIM_EINPUT,
                           "memory.budget_gb: firm-moe needs room for %llu experts (%llu bytes: "
                           "one layer's activated experts plus two copies in flight), the budget "
                           "leaves %llu bytes for experts",
                           (unsigned long long)need_experts, (unsigned long long)need_bytes,
                           (unsigned long long)params->expert_budget_bytes);

    policy *p = moesim_xcalloc(1, sizeof *p);
    p->knobs = *k;
    p->mem = mem;
    p->prec = prec;
    p->L = L;
    p->E = E;
    p->D = params->lookahead_depth;
    p->Kp = params->lookahead_k;
    p->K0 = K0;
    p->P0 = P0;
    p->K_max = K_max;
    p->P_max = p->D < FIRM_P_LIMIT ? p->D : FIRM_P_LIMIT;
    p->n = k->n ? k->n : firm_prefetch_parts_for_model(model_total_params(params->model));
    p->prefix_mask = (1u << p->n) - 1u; /* gate, then up, then down: Eq. 3's order */
    for (uint32_t mask = 0; mask < 1u << PART_COUNT; mask++)
        for (uint32_t part = 0; part < PART_COUNT; part++)
            if (mask & (1u << part)) p->mask_bytes[mask] += params->part_bytes[prec][part];

    p->n_pools = params->experts_per_layer > 0 ? L : 1;
    p->node = moesim_xcalloc((size_t)L * E * FIRM_SLOTS, sizeof *p->node);
    p->listed = moesim_xcalloc((size_t)L * E, sizeof *p->listed);
    p->resident = moesim_xcalloc((size_t)L * E, sizeof *p->resident);
    p->pool = moesim_xmalloc(p->n_pools * sizeof *p->pool);
    for (uint32_t i = 0; i < p->n_pools; i++) p->pool[i] = (lru_pool){-1, -1};

    p->ring = moesim_xcalloc(p->D, sizeof *p->ring);
    p->cand = moesim_xcalloc((size_t)p->P_max * p->K_max, sizeof *p->cand);
    p->tok_set = moesim_xcalloc(p->K_max, sizeof *p->tok_set);
    p->mark = moesim_xcalloc(E, sizeof *p->mark);
    p->pred = moesim_xcalloc(E, sizeof *p->pred);
    p->predicted = moesim_xcalloc(E, sizeof *p->predicted);
    p->cached = moesim_xcalloc(E, sizeof *p->cached);

    /* Algorithm 1 lines 3-5: groups, empty histories, random direction and sign per group */
    p->G = k->groups;
    p->grp = moesim_xcalloc(p->G, sizeof *p->grp);
    p->group_of = moesim_xmalloc(L * sizeof *p->group_of);
    for (uint32_t l = 0; l < L; l++)
        p->group_of[l] = (uint8_t)firm_group_of_layer(l, L, p->G, p->knobs.split == 0);
    p->step_counts = moesim_xcalloc(p->G, sizeof *p->step_counts);
    p->step_layers = moesim_xcalloc(p->G, sizeof *p->step_layers);
    rng *r = rng_create_stream(params->seed, FIRM_RNG_STREAM);
    for (uint32_t g = 0; g < p->G; g++) {
        firm_dim dim = rng_below(r, 2) ? FIRM_DIM_P : FIRM_DIM_K;
        int delta = rng_below(r, 2) ? 1 : -1;
        firm_heop_group_init(&p->grp[g], K0, P0, p->K_max, p->P_max, dim, delta,
                             p->knobs.heop_search == 1);
        p->grp[g].history_average = p->knobs.heop_average == 0;
    }
    rng_destroy(r);
    firm_names_fill(p);
    *out = p;
    return MOESIM_OK;
}

static const char *const firm_heop_search_names[] = {"paper", "incumbent", NULL};
static const char *const firm_split_names[] = {"paper", "equal", NULL};
static const char *const firm_heop_average_names[] = {"history", "window", NULL};
/* clang-format off */
#define KNOB(key, type, member, lo, hi, def, help) \
    {"firm-moe", key, type, offsetof(firm_knobs, member), 0, false, lo, hi, NULL, def, help}
#define KNOB_ENUM(key, member, choices, def, help) \
    {"firm-moe", key, CONFIG_ENUM, offsetof(firm_knobs, member), 0, false, 1, 0, choices, def, help}
static const config_field firm_knob_fields[] = {
    KNOB("K", CONFIG_U32, K, 0, 1024, "3",
         "candidates per participating layer, TopKIndices of Eq. 5 (Table 1: K = 3); "
         "0 = the model's top-k (equal-ratio baseline); HEOP's starting K"),
    KNOB("P", CONFIG_U32, P, 1, FIRM_P_LIMIT, "3",
         "previous layers meeting in the intersection of Eq. 6 (Table 1: P = 3; 1 = previous "
         "layer only); HEOP's starting P"),
    KNOB("n", CONFIG_U32, n, 0, 3, "0",
         "prefetch granularity: first n of gate, up, down (Table 1 +FG: n = 1; 3 = whole "
         "expert); 0 = by model size as Table 2: n = 1 below 10 B parameters (OLMoE-1B-7B), "
         "n = 2 from 10 B (Qwen1.5-MoE-A2.7B, DeepSeek-MoE-16B)"),
    KNOB("alpha", CONFIG_F64, alpha, 0, 1e9, "0.5",
         "Eq. 11 weight of n_unused (HEOP Results: alpha = 0.5)"),
    KNOB("beta", CONFIG_F64, beta, 0, 1e9, "0.5",
         "Eq. 11 weight of n_miss - n_hit (HEOP Results: beta = 0.5)"),
    KNOB("n_update", CONFIG_U32, n_update, 1, 1000000, "10",
         "Algorithm 1 N_update: decode steps between moves (Figure 6: 10-token intervals)"),
    KNOB("patience", CONFIG_U32, patience, 1, 1000000, "20",
         "Algorithm 1 Pat: decode steps without improvement before reversing (not given in the "
         "paper: two N_update intervals)"),
    KNOB("groups", CONFIG_U32, groups, 1, 4, "3",
         "Algorithm 1 line 3: depth groups of layers (3: shallow, middle, deep)"),
    KNOB("prefetch", CONFIG_BOOL, prefetch, 1, 0, "true",
         "Meeting-of-Layers prediction and prefetch (Method); false: the same sub-expert LRU "
         "serving demand loads only, the without-prefetch side of an ablation"),
    KNOB("heop", CONFIG_BOOL, heop, 1, 0, "true",
         "HEOP hill climbing over (K, P) per group (Algorithm 1); false: (K, P) fixed"),
    KNOB_ENUM("heop_search", heop_search, firm_heop_search_names, "paper",
              "paper: Algorithm 1 (on no improvement for Pat steps reverse delta and switch "
              "between K and P, from the configuration in force); incumbent (not in the paper): "
              "restart from the best configuration so far and switch every second reversal, "
              "since the literal rule only ever tries K + delta and P - delta"),
    KNOB_ENUM("split", split, firm_split_names, "paper",
              "depth groups: paper = Figure 6's (OLMoE's first five layers shallow, last four "
              "deep, the rest middle; scaled to other depths, 3 groups); equal = near-equal "
              "groups"),
    KNOB_ENUM("heop_average", heop_average, firm_heop_average_names, "history",
              "Algorithm 1 line 14's average: history = avg(H_g), every loss since profiling "
              "began, as written; window = the losses since the last move (the text's 'recent "
              "cost trends'), which judges each configuration by its own steps"),
    KNOB("profile_steps", CONFIG_U32, profile_steps, 1, 100000000, "200",
         "decode steps of HEOP's profiling phase before (K, P) is fixed (Algorithm 1 line 26; "
         "length not given in the paper)"),
};
/* clang-format on */

const policy_methods policy_firm_moe = {
    .api_version = POLICY_API_VERSION,
    .name = "firm-moe",
    .summary = "FIRM-MoE: sub-expert LRU, Meeting-of-Layers prefetch of the first n parts, HEOP "
               "(K, P) search",
    .knobs = firm_knob_fields,
    .n_knobs = MOESIM_ARRAY_LEN(firm_knob_fields),
    .knobs_size = sizeof(firm_knobs),
    .create = firm_create,
    .warmup = NULL,
    .begin_step = firm_begin_step,
    .on_route = firm_on_route,
    .on_transfer_done = NULL,
    .end_step = firm_end_step,
    .on_transfer_cancelled = firm_on_cancelled,
    .report = firm_report,
    .destroy = firm_destroy,
    .lookahead_scores_rank_only = true, /* firm_topk_select: scores order a row's candidates */
};
