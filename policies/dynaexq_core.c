/* DynaExq's pure pieces (see policies/dynaexq.h): hotness ([DynaExq-v1] Eq. 2 / Algorithm 1 and the
 * revised counters of [DynaExq-v2] §3.5), per-layer top-n_l selection with hysteresis ([DynaExq-v2]
 * §3.5), the BudgetTracker ([DynaExq-v2] §3.3), fixed-size block pools ([DynaExq-v1] §3.4,
 * [DynaExq-v2] §3.3) and the Versioned Expert Residency state machine ([DynaExq-v2] §3.2). Scores
 * are unitless doubles; sizes are bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "policies/dynaexq.h"

/* ---- hotness ---- */

void dx_hotness_init(dx_hotness *h, dx_hotness_mode mode, double alpha, uint32_t n_layers,
                     uint32_t n_experts, uint32_t top_k) {
    MOESIM_ASSERT(alpha >= 0 && alpha < 1 && n_layers > 0 && n_experts > 0);
    memset(h, 0, sizeof *h);
    h->mode = mode;
    h->alpha = alpha;
    h->n_layers = n_layers;
    h->n_experts = n_experts;
    h->top_k = top_k;
    size_t n = (size_t)n_layers * n_experts;
    h->score = moesim_xcalloc(n, sizeof *h->score);
    h->count = moesim_xcalloc(n, sizeof *h->count);
    h->tokens = moesim_xcalloc(n_layers, sizeof *h->tokens);
    h->step_gate = moesim_xcalloc(n, sizeof *h->step_gate);
    h->step_tokens = moesim_xcalloc(n_layers, sizeof *h->step_tokens);
}

void dx_hotness_free(dx_hotness *h) {
    if (!h) return;
    free(h->score);
    free(h->count);
    free(h->tokens);
    free(h->step_gate);
    free(h->step_tokens);
    memset(h, 0, sizeof *h);
}

void dx_hotness_observe(dx_hotness *h, uint32_t layer, uint32_t n_tokens, uint32_t n_active,
                        const uint16_t *active, const uint32_t *active_tokens,
                        const float *active_gate) {
    MOESIM_ASSERT(layer < h->n_layers);
    size_t base = (size_t)layer * h->n_experts;
    if (h->mode == DX_HOTNESS_COUNT) {
        /* [DynaExq-v2] §3.5: "a counter that accumulates the number of times [the expert] is
         * selected by the router during the current update interval" */
        for (uint32_t i = 0; i < n_active; i++) {
            MOESIM_ASSERT(active[i] < h->n_experts);
            h->count[base + active[i]] += active_tokens[i];
        }
        h->tokens[layer] += n_tokens;
        return;
    }
    /* [DynaExq-v1] §3.2: "After each forward pass, DynaExq records the selected experts and
     * accumulates gating probabilities" (applied in dx_hotness_end_step) */
    for (uint32_t i = 0; i < n_active; i++) {
        MOESIM_ASSERT(active[i] < h->n_experts);
        h->step_gate[base + active[i]] += active_gate[i];
    }
    h->step_tokens[layer] += n_tokens;
}

void dx_hotness_end_step(dx_hotness *h) {
    if (h->mode != DX_HOTNESS_EMA) return;
    double a = h->alpha;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        double *s = h->score + (size_t)l * h->n_experts;
        double *g = h->step_gate + (size_t)l * h->n_experts;
        /* [DynaExq-v1] Algorithm 1, UPDATEHOTNESS: one forward pass is one step t; g_i(x_t) is the
         * router probability of expert i averaged over the step's tokens (gate mass / tokens), so a
         * score stays in [0, 1] whatever the batch size or prompt length. */
        double inv = h->step_tokens[l] ? 1.0 / (double)h->step_tokens[l] : 0.0;
        for (uint32_t e = 0; e < h->n_experts; e++) {
            if (g[e] > 0)
                s[e] = a * s[e] + (1.0 - a) * g[e] * inv; /* line 6 */
            else
                s[e] = a * s[e]; /* line 9: passive decay of inactive experts */
            g[e] = 0;
        }
        h->step_tokens[l] = 0;
    }
}

void dx_hotness_close_interval(dx_hotness *h) {
    if (h->mode != DX_HOTNESS_COUNT) return;
    double a = h->alpha;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        double *s = h->score + (size_t)l * h->n_experts;
        uint64_t *c = h->count + (size_t)l * h->n_experts;
        /* [DynaExq-v2] §3.5: "At the end of each update interval, the runtime updates a smoothed
         * hotness score using an exponential moving average ... The counters are then reset". The
         * count enters as the share of the interval's tokens that selected the expert (in [0, 1])
         * so the score-margin hysteresis has the same unit in both modes; an interval without
         * tokens decays every score. */
        double inv = h->tokens[l] ? 1.0 / (double)h->tokens[l] : 0.0;
        for (uint32_t e = 0; e < h->n_experts; e++) {
            s[e] = a * s[e] + (1.0 - a) * (double)c[e] * inv;
            c[e] = 0;
        }
        h->tokens[l] = 0;
    }
}

double dx_hotness_uniform_score(const dx_hotness *h) {
    if (h->mode == DX_HOTNESS_COUNT) return (double)h->top_k / h->n_experts;
    return 1.0 / h->n_experts;
}

/* ---- selection ---- */

static bool before(const double *score, uint32_t a, uint32_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
}

void dx_sort_by_score(const double *score, uint32_t *ids, uint32_t n, uint32_t *scratch) {
    /* bottom-up merge sort: stable, O(n log n), no comparator context needed */
    uint32_t *src = ids, *dst = scratch;
    for (uint32_t width = 1; width < n; width *= 2) {
        for (uint32_t lo = 0; lo < n; lo += 2 * width) {
            uint32_t mid = lo + width < n ? lo + width : n;
            uint32_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            uint32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                dst[k++] = before(score, src[j], src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        uint32_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != ids) memcpy(ids, src, (size_t)n * sizeof *ids);
}

/* The layer's experts by score, descending, in scratch[0, n) (scratch[n, 2n) is the sort's). */
static uint32_t *order_by_score(const double *score, uint32_t n, uint32_t *scratch) {
    for (uint32_t i = 0; i < n; i++) scratch[i] = i;
    dx_sort_by_score(score, scratch, n, scratch + n);
    return scratch;
}

void dx_order_by_score(const double *score, uint32_t n, uint32_t *order) {
    /* insertion from the previous order: between two schedules every expert no token routed to
     * decays by the same factor, so few move, and a schedule costs about n compares where a sort
     * from scratch cost n log n mispredicted ones (29 % of a `dynaexq` run at batch 1). The
     * order is total (`before`): the result is the one sorted order whatever the start. */
    for (uint32_t i = 1; i < n; i++) {
        uint32_t e = order[i], j = i;
        for (; j > 0 && before(score, e, order[j - 1]); j--) order[j] = order[j - 1];
        order[j] = e;
    }
}

double dx_threshold_of(const double *score, uint32_t n, uint32_t cap, uint32_t *scratch) {
    MOESIM_ASSERT(cap <= n);
    if (cap == 0) return INFINITY;
    return score[order_by_score(score, n, scratch)[cap - 1]];
}

uint32_t dx_select_threshold(const double *score, uint32_t n, uint32_t cap, double tau,
                             bool *in_set, uint32_t *order) {
    MOESIM_ASSERT(cap <= n);
    dx_order_by_score(score, n, order);
    uint32_t taken = 0, changed = 0;
    for (uint32_t r = 0; r < n; r++) {
        uint32_t e = order[r];
        bool want = taken < cap && score[e] >= tau && score[e] > 0;
        taken += want;
        changed += want != in_set[e];
        in_set[e] = want;
    }
    return changed;
}

uint32_t dx_select_layer(const double *score, uint32_t n, uint32_t cap, dx_hysteresis_mode mode,
                         double margin, uint32_t rank_slack, bool *in_set, uint32_t *order) {
    MOESIM_ASSERT(cap <= n);
    dx_order_by_score(score, n, order);

    uint32_t members = 0, changed = 0;
    for (uint32_t i = 0; i < n; i++) members += in_set[i];
    /* The capacity never shrinks at run time; should a set exceed it, the lowest go first. */
    for (uint32_t r = n; r-- > 0 && members > cap;) {
        if (in_set[order[r]]) {
            in_set[order[r]] = false;
            members--;
            changed++;
        }
    }

    if (mode == DX_HYST_RANK) {
        /* [DynaExq-v2] §3.5: "a rank slack that requires an expert to enter a slightly wider
         * candidate set": a member stays while it ranks within cap + slack; a challenger must rank
         * within the plain top-cap (and have been routed to at all) to take a free slot. */
        for (uint32_t r = 0; r < n; r++) {
            uint32_t e = order[r];
            if (in_set[e] && (r >= (uint64_t)cap + rank_slack || score[e] <= 0)) {
                in_set[e] = false;
                members--;
                changed++;
            }
        }
        for (uint32_t r = 0; r < cap && members < cap; r++) {
            uint32_t e = order[r];
            if (!in_set[e] && score[e] > 0) {
                in_set[e] = true;
                members++;
                changed++;
            }
        }
        return changed;
    }

    /* Score margin. Free slots are filled by the hottest non-members ([DynaExq-v1] Algorithm 1 line
     * 15: top-K experts with S_i >= tau, tau > 0: an expert never routed to is not promoted). */
    uint32_t r = 0;
    while (members < cap && r < n) {
        uint32_t e = order[r++];
        if (!in_set[e] && score[e] > 0) {
            in_set[e] = true;
            members++;
            changed++;
        }
    }
    /* [DynaExq-v2] §3.5: "an expert is promoted into the high-precision set only if its hotness
     * exceeds that of the lowest-ranked expert in the current high-precision set by a margin.
     * Symmetrically, an expert is evicted only if its hotness falls below the highest-ranked
     * expert outside the current set by the same margin." Walk challengers from the top and
     * members from the bottom; swap while the margin is exceeded. */
    uint32_t top = 0, bottom = n;
    for (;;) {
        while (top < n && in_set[order[top]]) top++;
        while (bottom > 0 && !in_set[order[bottom - 1]]) bottom--;
        if (top >= n || bottom == 0 || top >= bottom) break;
        uint32_t challenger = order[top], member = order[bottom - 1];
        if (!(score[challenger] > score[member] + margin)) break;
        in_set[challenger] = true;
        in_set[member] = false;
        changed += 2;
    }
    return changed;
}

/* ---- budget tracker ---- */

void dx_budget_init(dx_budget *b, uint64_t total_bytes, uint64_t hi_cap_bytes) {
    MOESIM_ASSERT(hi_cap_bytes <= total_bytes);
    memset(b, 0, sizeof *b);
    b->total_bytes = total_bytes;
    b->hi_cap_bytes = hi_cap_bytes;
}

bool dx_budget_try_reserve(dx_budget *b, dx_version v, uint64_t bytes) {
    uint64_t used = b->used_bytes[DX_LO] + b->used_bytes[DX_HI];
    bool fits = bytes <= b->total_bytes - used;
    if (v == DX_HI) fits = fits && bytes <= b->hi_cap_bytes - b->used_bytes[DX_HI];
    if (!fits) {
        b->refusals++;
        return false;
    }
    b->used_bytes[v] += bytes;
    used += bytes;
    if (b->used_bytes[DX_HI] > b->peak_hi_bytes) b->peak_hi_bytes = b->used_bytes[DX_HI];
    if (used > b->peak_total_bytes) b->peak_total_bytes = used;
    MOESIM_ASSERT(b->used_bytes[DX_HI] <= b->hi_cap_bytes && used <= b->total_bytes);
    return true;
}

void dx_budget_release(dx_budget *b, dx_version v, uint64_t bytes) {
    MOESIM_ASSERT(b->used_bytes[v] >= bytes);
    b->used_bytes[v] -= bytes;
}

/* ---- block pool ---- */

void dx_pool_init(dx_pool *p, uint32_t n_blocks, uint64_t block_bytes) {
    memset(p, 0, sizeof *p);
    p->block_bytes = block_bytes;
    p->n_blocks = n_blocks;
    p->n_free = n_blocks;
    p->free_list = moesim_xcalloc(n_blocks ? n_blocks : 1, sizeof *p->free_list);
    p->used = moesim_xcalloc(n_blocks ? n_blocks : 1, sizeof *p->used);
    for (uint32_t i = 0; i < n_blocks; i++) p->free_list[i] = n_blocks - 1 - i; /* pop 0 first */
}

void dx_pool_free_all(dx_pool *p) {
    if (!p) return;
    free(p->free_list);
    free(p->used);
    memset(p, 0, sizeof *p);
}

uint32_t dx_pool_alloc(dx_pool *p) {
    if (p->n_free == 0) return DX_NO_BLOCK;
    uint32_t b = p->free_list[--p->n_free];
    MOESIM_ASSERT(b < p->n_blocks && !p->used[b]);
    p->used[b] = 1;
    return b;
}

void dx_pool_release(dx_pool *p, uint32_t block) {
    MOESIM_ASSERT(block < p->n_blocks && p->used[block] && p->n_free < p->n_blocks);
    p->used[block] = 0;
    p->free_list[p->n_free++] = block;
}

/* ---- Versioned Expert Residency ---- */

const char *dx_state_name(dx_state s) {
    static const char *const names[DX_STATE_COUNT] = {"resident-lo", "resident-hi", "promoting",
                                                      "demoting", "evicting"};
    MOESIM_ASSERT((unsigned)s < DX_STATE_COUNT);
    return names[s];
}

void dx_entry_init(dx_entry *e, uint32_t lo_block) {
    memset(e, 0, sizeof *e);
    e->state = DX_RESIDENT_LO;
    e->published = DX_LO;
    e->block[DX_LO] = lo_block;
    e->block[DX_HI] = DX_NO_BLOCK;
}

void dx_entry_start_promote(dx_entry *e, uint32_t hi_block) {
    MOESIM_ASSERT(e->state == DX_RESIDENT_LO && e->published == DX_LO);
    MOESIM_ASSERT(e->block[DX_HI] == DX_NO_BLOCK && hi_block != DX_NO_BLOCK);
    e->state =
        DX_PROMOTING; /* [DynaExq-v2] §3.2: "the handle continues to point to [the LO version]" */
    e->block[DX_HI] = hi_block;
    e->copied = 0;
    e->landed = 0;
}

void dx_entry_start_demote(dx_entry *e, uint32_t lo_block) {
    MOESIM_ASSERT(e->state == DX_RESIDENT_HI && e->published == DX_HI);
    MOESIM_ASSERT(lo_block != DX_NO_BLOCK);
    MOESIM_ASSERT(e->block[DX_LO] == DX_NO_BLOCK || e->block[DX_LO] == lo_block);
    e->state = DX_DEMOTING; /* the handle stays on HI until the LO version is complete */
    e->block[DX_LO] = lo_block;
    e->copied = 0;
    e->landed = 0;
}

void dx_entry_copy_done(dx_entry *e) {
    MOESIM_ASSERT((e->state == DX_PROMOTING || e->state == DX_DEMOTING) && !e->copied);
    e->copied = 1;
}

int dx_entry_publish(dx_entry *e, bool keep_lo) {
    MOESIM_ASSERT((e->state == DX_PROMOTING || e->state == DX_DEMOTING) && e->copied);
    /* [DynaExq-v2] §3.2: "After the transfer completes, VER atomically publishes the new version by
     * updating the handle's active pointer"; then the old version is reclaimed (Evicting). */
    dx_version now = e->state == DX_PROMOTING ? DX_HI : DX_LO;
    e->published = (uint8_t)now;
    e->copied = 0;
    if (now == DX_HI && keep_lo) {
        e->state = DX_RESIDENT_HI;
        return -1;
    }
    e->state = DX_EVICTING;
    e->evicting = (uint8_t)(now == DX_HI ? DX_LO : DX_HI);
    return e->evicting;
}

uint32_t dx_entry_evicted(dx_entry *e) {
    MOESIM_ASSERT(e->state == DX_EVICTING && e->evicting != e->published);
    uint32_t b = e->block[e->evicting];
    MOESIM_ASSERT(b != DX_NO_BLOCK);
    e->block[e->evicting] = DX_NO_BLOCK;
    e->state = e->published == DX_HI ? DX_RESIDENT_HI : DX_RESIDENT_LO;
    return b;
}

bool dx_entry_holds(const dx_entry *e, dx_version v) { return e->block[v] != DX_NO_BLOCK; }
