/* FIRM-MoE ([FIRM-MoE], "FIRM-MoE: Fine-Grained Expert Decomposition for Resource-Adaptive
 * MoE Inference"): the policy table and the pure pieces it is built from, exposed so that tests
 * can check each one alone.
 *
 * Pure pieces (no memory system, no allocation except the HEOP group's cost table):
 *   - firm_topk_select: TopKIndices of Eq. 5 over one layer's recorded look-ahead candidates;
 *   - firm_mol_intersect: the Meeting-of-Layers intersection of Eq. 6;
 *   - firm_heop_count / firm_heop_loss: n_unused, n_miss, n_hit and the loss of Eq. 11;
 *   - firm_heop_group: the per-group coordinate-wise hill climbing of Algorithm 1.
 *
 * Units: expert ids are MoE-layer-local (0..E-1); steps count decode token steps from 1 (the
 * paper's t in Algorithm 1); losses are dimensionless (expert counts weighted by alpha, beta). */
#ifndef MOESIM_POLICIES_FIRM_MOE_H
#define MOESIM_POLICIES_FIRM_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policies/policy.h"

/* The knobs of section [firm-moe] (filled by policy_read_knobs from firm_moe_knobs' table). */
typedef struct firm_knobs {
    uint32_t K;             /* Eq. 5: candidates per participating layer; 0 = the model's top-k */
    uint32_t P;             /* Eq. 6: previous layers that take part in predicting a layer */
    uint32_t n;             /* prefetch granularity: first n of (gate, up, down); 3 = whole;
                               0: by model size (firm_prefetch_parts_for_model) */
    double alpha;           /* Eq. 11 weight of n_unused */
    double beta;            /* Eq. 11 weight of (n_miss - n_hit) */
    uint32_t n_update;      /* Algorithm 1 line 12: steps between moves */
    uint32_t patience;      /* Algorithm 1 line 15: steps without improvement before reversing */
    uint32_t groups;        /* Algorithm 1 line 3: depth groups (3: shallow, middle, deep) */
    bool heop;              /* run HEOP (Algorithm 1); off: (K, P) fixed for every layer */
    uint32_t profile_steps; /* decode steps of HEOP's profiling phase (Algorithm 1 line 26) */
    bool prefetch;          /* off: the sub-expert LRU alone, no MoL prediction or prefetch */
    int heop_search;        /* 0 paper (Algorithm 1), 1 incumbent */
    int split;              /* 0 paper (Figure 6), 1 equal */
    int heop_average;       /* 0 history (Algorithm 1 line 14: avg(H_g)), 1 window */
} firm_knobs;

/* [FIRM-MoE] Table 2 and its text: "n = 1 for smaller models, and n = 2 for larger models"
 * (OLMoE-1B-7B, 7 B parameters as the paper lists it: n = 1; Qwen1.5-MoE-A2.7B, 14 B, and
 * DeepSeek-MoE-16B, 16 B: n = 2). The cut-off, between 7 and 14 B: FIRM_LARGE_MODEL_PARAMS total
 * parameters (model_total_params). */
#define FIRM_LARGE_MODEL_PARAMS 10000000000ull
uint32_t firm_prefetch_parts_for_model(uint64_t total_params);

/* The policy registered as "firm-moe". */
extern const policy_methods policy_firm_moe;

/* Eq. 5, TopKIndices(x_m . W_g^(l), K) for one token: the K highest-scoring valid ids among the
 * k_prime recorded candidates `ids` (scores in `scores`, or NULL when the ids are already in
 * descending score order). Ids >= n_experts (POLICY_NO_EXPERT: not recorded) are skipped; equal
 * scores keep the recorded order. Writes at most K ids to `out` in descending score order and
 * returns their count. */
uint32_t firm_topk_select(const uint16_t *ids, const float *scores, uint32_t k_prime, uint32_t K,
                          uint32_t n_experts, uint16_t *out);

/* Eq. 6, S_l = intersection over the participating layers m of S_l^(m). `sets[j]` holds
 * `sizes[j]` ids (no repeats), sets[0] being the nearest layer (m = l - 1). Writes the ids present
 * in every set to `out` in the order of sets[0] (most confident first) and returns their count;
 * with n_sets == 0 the intersection is empty (no layer can predict). A smaller result than the
 * model's top-k is final: the paper fills nothing in, the rest is loaded on demand. */
uint32_t firm_mol_intersect(const uint16_t *const *sets, const uint32_t *sizes, uint32_t n_sets,
                            uint16_t *out);

/* One layer's outcome for HEOP (Algorithm 1 line 8). */
typedef struct firm_heop_counts {
    uint64_t n_unused; /* predicted (prefetched) experts that the layer did not activate */
    uint64_t n_miss;   /* activated experts absent from the prediction */
    uint64_t n_hit;    /* activated experts not predicted but already in the GPU cache */
} firm_heop_counts;

/* Counts n_unused = |S \ A|, n_miss = |A \ S| and n_hit = #{a in A \ S : cached[a]} for a
 * predicted set S of n_pred ids and the activated set A of n_active ids, given per activation
 * whether it is in S (`predicted`) and cached (`cached`; neither set repeats an id), and adds
 * them to `acc`. Each activation counts once: a predicted one is credited by not being a miss,
 * so a landed prefetch is not also a hit. */
void firm_heop_count(uint32_t n_pred, const bool *predicted, const bool *cached, uint32_t n_active,
                     firm_heop_counts *acc);

/* Eq. 11: L_T = alpha * n_unused + beta * (n_miss - n_hit), over counts summed on `n_layers`
 * layers and divided by n_layers (the layer-wise average of the paper's Figure 6). */
double firm_heop_loss(double alpha, double beta, const firm_heop_counts *c, uint32_t n_layers);

typedef enum firm_dim { FIRM_DIM_K = 0, FIRM_DIM_P = 1 } firm_dim;

/* One layer group's hill climber over (K, P) in the box [1, K_max] x [1, P_max]. */
typedef struct firm_heop_group {
    uint32_t K, P;         /* configuration applied to the group's layers now */
    uint32_t K_max, P_max; /* search box */
    firm_dim dim;          /* Direction_g: the coordinate the next move changes */
    int delta;             /* delta_g: +1 or -1 */
    uint32_t reversals;    /* reversals since the last improvement */
    bool from_incumbent;   /* firm-moe.heop_search = incumbent (see firm_heop_group_update) */
    bool has_best;
    double best_window;         /* lowest window average seen (the "improvement" reference) */
    uint32_t best_K, best_P;    /* the incumbent: configuration of best_window */
    uint64_t last_improve_step; /* step of the last improvement (or of the last reversal) */
    double window_sum;          /* losses recorded since the last move */
    uint64_t window_n;
    bool history_average; /* line 14 averages H_g (every loss since the start), not the
                             window (set after init; knob heop_average) */
    double history_sum;   /* H_g: every loss recorded */
    uint64_t history_n;
    double *cost_sum; /* [K_max][P_max] all losses recorded under each (K, P) */
    uint64_t *cost_n; /* [K_max][P_max] steps recorded under each (K, P) */
    uint64_t moves;   /* moves made (for reports and tests) */
} firm_heop_group;

/* Starts at (K0, P0) (clamped into the box) moving along `dim0` by `delta0` (+1 or -1): Algorithm
 * 1 lines 4-5. Allocates the cost table; release with firm_heop_group_free. */
void firm_heop_group_init(firm_heop_group *g, uint32_t K0, uint32_t P0, uint32_t K_max,
                          uint32_t P_max, firm_dim dim0, int delta0, bool from_incumbent);
void firm_heop_group_free(firm_heop_group *g); /* accepts a zeroed group */

/* Algorithm 1 line 10: H_g <- H_g u {L_T^g} for the configuration in force. */
void firm_heop_group_record(firm_heop_group *g, double loss);

/* Algorithm 1 lines 14-23, at decode step `step` (a multiple of N_update): averages H_g, every
 * loss recorded so far (line 14 as written; with history_average unset, the window since the
 * last move);
 * after `patience` steps without a new lowest window average reverses delta and switches the
 * dimension between K and P (line 16 and the text), moving on from the current configuration;
 * then moves one coordinate by delta (a move off the box counts as a reversal). With
 * `from_incumbent` (the knob's alternative) a reversal switches the dimension only every second
 * time and restarts from the incumbent, so all four moves K+-1, P+-1 of the best configuration
 * are tried. An empty window (nothing recorded) moves nothing. Returns true when (K, P) moved. */
bool firm_heop_group_update(firm_heop_group *g, uint64_t step, uint64_t patience);

/* Algorithm 1 line 28: the (K, P) with the lowest historical average cost (ties: smaller K, then
 * smaller P); the current configuration when nothing was recorded. */
void firm_heop_group_best(const firm_heop_group *g, uint32_t *K, uint32_t *P);

/* Group of MoE layer `layer` among `n_groups` contiguous depth groups of n_layers: near-equal, or
 * with `paper_split` and 3 groups Figure 6's split (OLMoE's 16 layers: the first five shallow,
 * the last four deep, the rest middle), scaled to other depths. */
uint32_t firm_group_of_layer(uint32_t layer, uint32_t n_layers, uint32_t n_groups,
                             bool paper_split);

#endif
