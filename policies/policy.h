/* The policy API: what decides expert residency, prefetch and precision, shared by the simulator
 * (sim/) and the real-GPU replay (replay/). A policy is compiled once and linked into both.
 *
 * Shape (SQLite's sqlite3_pcache_methods2): a policy is a versioned, static const table of
 * function pointers (policy_methods) over an opaque state the policy allocates; a NULL slot means
 * "not used". The host (sim or replay) drives it step by step:
 *
 *   create(params, knobs)                       once, before the first step
 *   for every step (a batch of tokens: one prefill chunk, or one decode token per active request):
 *       begin_step(step)
 *       for every MoE layer l = 0..L-1, when the compute stream reaches layer l's router:
 *           on_route(layer routing) -> plan      policy returns HI / LO / skip per activated
 *                                                expert, and may load / prefetch / evict through
 *                                                the memory system (policy_mem)
 *       end_step(step)
 *   on_transfer_done(...)                       whenever a load the policy issued completes
 *   on_transfer_cancelled(...)                  when the memory system drops a stale prefetch
 *   destroy()
 *
 * Routes and sub-routes: on_route normally comes once per (step, layer). When the step's distinct
 * experts at a layer cannot all fit one pool at once, the host splits the step's tokens, in
 * order, into consecutive sub-routes whose experts fit, and calls on_route for each (same layer,
 * increasing now_ns; the previous sub-route's experts have computed). Warm-up: loads issued from
 * warmup are the initial placement, resident before the clock starts; on_transfer_done is
 * called for them after warmup returns. sim/README.md defines the hit rate and the other metrics.
 *
 * The memory system (policy_mem, implemented by sim/ and by replay/) holds every
 * (layer, expert, precision, part) in one of three states: absent, loading, resident. The
 * mechanism, not the policy, enforces the HBM budget: a load that would exceed it is refused
 * (returns POLICY_REFUSED), so "never over budget" holds for every policy by construction. The
 * mechanism also never runs an expert before every part it needs at the planned precision is
 * resident: compute waits for the copy (part by part: gate and up first, then down).
 *
 * Copy classes, promotion and cancellation (core/memsys.h): demand > prefetch > background. A load
 * of parts that are loading in a lower class moves their copy up to the caller's class at once and
 * returns POLICY_PROMOTED (the policy learns its prefetch was late). A prefetch targets the next
 * route of its layer after it was issued; if that layer is routed in a step that does not run it
 * and its copy has not started, the memory system drops it and calls on_transfer_cancelled, so
 * mispredictions do not keep the link busy. A policy can also cancel a not-started load itself
 * with evict. A chunk already handed to a copy engine always completes.
 *
 * Host placement: the host keeps in DRAM the precisions the policy declares it loads
 * (load_precisions), so DRAM is not filled with copies the policy never runs.
 *
 * Rules a policy must keep (both hosts assert them):
 *   - every activated expert gets a plan entry: a precision the model stores, or POLICY_RUN_SKIP;
 *   - for a planned (expert, precision) every part must be resident or loading once on_route
 *     returns (the policy issues the demand loads it needs: POLICY_DEMAND class);
 *   - no clock, no CUDA, no I/O, no globals: time is the `now_ns` the host passes in, so a policy
 *     behaves identically in sim and replay for the same routing and timings.
 *
 * Versioning: the host refuses a table whose api_version differs from POLICY_API_VERSION. */
#ifndef MOESIM_POLICIES_POLICY_H
#define MOESIM_POLICIES_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/model.h"
#include "common/precision.h"
#include "common/status.h"

#define POLICY_API_VERSION 6
#define POLICY_RUN_SKIP 0xffu /* plan entry: the expert is not run; its gate mass is dropped */
#define POLICY_NO_EXPERT UINT16_MAX
#define POLICY_PARTS_ALL ((1u << PART_COUNT) - 1u) /* gate | up | down */

/* ---- what the policy is told ---- */

/* Transfer priority classes: a demand load overtakes queued prefetches at a chunk boundary, and
 * prefetches overtake background migrations (promotions, demotions). */
typedef enum policy_class { POLICY_DEMAND = 0, POLICY_PREFETCH, POLICY_BACKGROUND } policy_class;

typedef enum policy_residency {
    POLICY_ABSENT = 0, /* not in HBM (in DRAM or on SSD) */
    POLICY_LOADING,    /* a copy to HBM is queued or running; bytes already count against budget */
    POLICY_RESIDENT,   /* usable by compute */
} policy_residency;

/* Fixed for the whole run. Borrowed by the policy for its lifetime. */
typedef struct policy_params {
    const model_geometry *model; /* geometry (layers indexed as MoE layers 0..n_moe_layers-1) */
    uint32_t n_layers;           /* MoE layers (L) */
    uint32_t n_experts;          /* routed experts per layer (E) */
    uint32_t top_k;
    uint64_t part_bytes[PREC_COUNT][PART_COUNT]; /* size of one part of one expert; 0: the host
                                                    cannot store that precision */
    uint64_t expert_budget_bytes;  /* HBM left for routed experts (all layers together) */
    uint32_t experts_per_layer;    /* cache.experts_per_layer: 0 = one shared budget; else each
                                      layer's pool holds this many experts at `precision` and the
                                      mechanism enforces it per layer */
    moesim_precision precision;    /* expert.precision: what single-precision policies run */
    uint32_t batch_size;           /* batch.size: requests in flight together */
    uint32_t lookahead_depth;      /* D of the predictions on_route receives (0: none) */
    uint32_t lookahead_k;          /* K' */
    bool lookahead_emulated;       /* predictions come from an emulated predictor, not the trace */
    uint64_t seed;                 /* for policies that randomize; same seed, same decisions */
} policy_params;

/* One step: the batch of tokens that runs every layer together. Arrays: [n_tokens]. */
typedef struct policy_step {
    uint64_t index;          /* 0, 1, 2, ... */
    uint64_t now_ns;         /* host time at the start of the step */
    uint32_t n_tokens;
    bool is_prefill;         /* all tokens are prompt tokens of one or more requests */
    const uint32_t *request; /* [n_tokens] trace request id of each token */
    const uint32_t *position;/* [n_tokens] position in its request */
} policy_step;

/* One MoE layer's routing for the step, and what the host knows about the future. */
typedef struct policy_route {
    uint32_t layer;
    uint64_t now_ns;             /* when the router of this layer finished */
    uint32_t n_tokens, top_k;
    const uint16_t *experts;     /* [n_tokens][top_k]; POLICY_NO_EXPERT rows: not recorded */
    const float *gates;          /* [n_tokens][top_k] gate weights as applied */
    const float *importance;     /* [n_tokens] DyMoE Eq. 1 importance, or NULL */
    /* Look-ahead: for distance d = 1..D, the top-K' experts layer + d's router picks from this
     * layer's router input (DyMoE Eq. 6, FIRM-MoE Eq. 4-5); POLICY_NO_EXPERT past the last layer.
     * NULL when lookahead_depth is 0. */
    const uint16_t *lookahead_ids;  /* [n_tokens][D][K'] */
    const float *lookahead_scores;  /* [n_tokens][D][K'] */
    /* The activated experts of this layer for the step, each once, ascending id. The plan is
     * indexed like this list. */
    uint32_t n_active;
    const uint16_t *active;       /* [n_active] expert ids */
    const uint32_t *active_tokens;/* [n_active] tokens routed to each */
    const float *active_gate;     /* [n_active] gate mass routed to each (sum over its tokens) */
} policy_route;

/* The plan a policy returns from on_route: plan[i] is the precision active[i] runs at, or
 * POLICY_RUN_SKIP. The host allocates it (n_active entries) and sets every entry to
 * POLICY_RUN_SKIP before the call; the policy must fill it. */
typedef struct policy_plan {
    uint8_t *run; /* [n_active] moesim_precision or POLICY_RUN_SKIP */
} policy_plan;

/* ---- the memory system a policy acts through (implemented by sim/ and replay/) ---- */

typedef enum policy_mem_result {
    POLICY_ISSUED = 0,  /* the transfer is queued (or the eviction done) */
    POLICY_ALREADY,     /* nothing to do: already resident / loading / absent */
    POLICY_REFUSED,     /* would exceed the budget (load) or the part is in use (evict) */
    POLICY_PROMOTED,    /* load: nothing new queued, but parts loading in a lower class (a late
                           prefetch) now copy in the caller's class */
} policy_mem_result;

typedef struct policy_mem policy_mem; /* the host's state, opaque to policies */

typedef struct policy_mem_ops {
    policy_residency (*state)(const policy_mem *m, uint32_t layer, uint32_t expert,
                              moesim_precision p, expert_part part);
    /* Queues copies to HBM of the parts in `parts_mask` (bit 1 << expert_part) not already
     * resident or loading, and promotes to `cls` the copies of those loading in a lower class.
     * All or nothing: refused when the bytes do not fit the free budget of the pool (layer's pool
     * when experts_per_layer is set). */
    policy_mem_result (*load)(policy_mem *m, uint32_t layer, uint32_t expert, moesim_precision p,
                              uint32_t parts_mask, policy_class cls);
    /* Frees the HBM of resident parts. Refused for a part the current layer's compute uses; a
     * loading part is cancelled only if its copy has not started (else refused). */
    policy_mem_result (*evict)(policy_mem *m, uint32_t layer, uint32_t expert,
                               moesim_precision p, uint32_t parts_mask);
    /* Free bytes of the expert budget (of `layer`'s pool when experts_per_layer is set; the
     * layer is ignored otherwise). Loading parts count as used. */
    uint64_t (*free_bytes)(const policy_mem *m, uint32_t layer);
    /* Bytes used (resident + loading) at precision p over all layers. */
    uint64_t (*used_bytes)(const policy_mem *m, moesim_precision p);
    /* Perfect knowledge of the trace's future, for the `oracle` bound only (the host knows the
     * whole schedule because routing comes from a trace): the number of accesses (token, slot)
     * that happen before `expert` of `layer` is accessed again, counted from the current layer
     * of the current step in execution order; UINT64_MAX if never again. */
    uint64_t (*next_use)(const policy_mem *m, uint32_t layer, uint32_t expert);
    /* The experts the current step's batch truly activates at `layer` (a later layer of the same
     * step, or the next step's layers when layer <= the current one): writes up to `cap` ids,
     * returns the count. Oracle only. */
    uint32_t (*future_active)(const policy_mem *m, uint32_t layer, uint16_t *ids, uint32_t cap);
} policy_mem_ops;

typedef struct policy_mem_view {
    const policy_mem_ops *ops;
    policy_mem *mem;
    /* What ops->state answers, to read without a call (a check per access): the residency of
     * part `part` of (layer, expert) at precision p is residency[((p * n_layers + layer) *
     * n_experts + expert) * PART_COUNT + part], a policy_residency; read-only, current whenever
     * the policy is called. NULL when the host has none to show: then ask ops->state. */
    const uint8_t *residency;
} policy_mem_view;

/* ---- the table a policy provides ---- */

typedef struct policy policy; /* a policy's own state, opaque to hosts */

typedef struct policy_methods {
    int api_version;    /* POLICY_API_VERSION */
    const char *name;   /* registry name: "lru", "dymoe", ...; under POLICY_NAME_MAX bytes */
    const char *summary;/* one line for listings */
    /* Bumped whenever the policy's decisions change for the same inputs: part of a sweep's
     * configuration hash, so `moesim sweep` reruns the rows an older version made (sim/sweep.h).
     * 0 (left out) until a policy first changes. */
    uint32_t version;
    /* Knobs, read from the config section named like the policy ("--set lru.scope=global").
     * Each field's help names its source (paper, equation) and default. */
    const config_field *knobs;
    size_t n_knobs;
    size_t knobs_size; /* bytes of the struct the knobs are read into (passed to create) */

    /* Allocates the state. `knobs` points at the filled knob struct (knobs_size bytes, NULL if
     * n_knobs is 0). Fails (MOESIM_EINPUT, one line naming the knob) for settings that cannot
     * work, e.g. `static` when the experts do not fit the budget. Must not touch memory. */
    moesim_status (*create)(const policy_params *params, const void *knobs, policy_mem_view mem,
                            policy **out, moesim_error *err);
    /* Called once before the first step: the policy may place its initial residency. */
    void (*warmup)(policy *p, uint64_t now_ns);
    void (*begin_step)(policy *p, const policy_step *step);
    /* The heart: decide the plan for one layer of the step; may load, prefetch, evict. */
    void (*on_route)(policy *p, const policy_route *route, policy_plan *plan);
    /* A load issued by the policy finished: its parts are now resident (a cancelled load is not
     * reported). Called at completion time `now_ns`, between the host's other events. */
    void (*on_transfer_done)(policy *p, uint32_t layer, uint32_t expert, moesim_precision prec,
                             uint32_t parts_mask, policy_class cls, uint64_t now_ns);
    void (*end_step)(policy *p, const policy_step *step, uint64_t now_ns);
    /* The memory system dropped a prefetch whose copy had not started (the cancellation rule
     * above): its parts are absent again and their bytes free. Required of every policy that
     * issues POLICY_PREFETCH loads; must not load or evict. */
    void (*on_transfer_cancelled)(policy *p, uint32_t layer, uint32_t expert,
                                  moesim_precision prec, uint32_t parts_mask, policy_class cls,
                                  uint64_t now_ns);
    /* Policy-specific figures for the report (e.g. FIRM-MoE's chosen (K, P) per group), added to
     * the JSON under "policy_report" as a flat list of name/value pairs. Returns the count
     * written (at most cap). */
    size_t (*report)(const policy *p, const char **names, double *values, size_t cap);
    void (*destroy)(policy *p); /* accepts NULL */
    /* The precision this policy calls HI, for the host's precision mix: a run at a precision of
     * at least that many bits counts as HI, fewer as LO (DyMoE's `hi` is int4, DynaExq's bf16).
     * NULL: expert.precision, which single-precision policies run at. */
    moesim_precision (*hi_precision)(const policy *p);
    /* Writes the precisions this policy loads into `order`, most wanted first, and returns their
     * count (1..PREC_COUNT, each once): what host placement keeps in DRAM, and what the host
     * sizes routes by (the widest). NULL: expert.precision alone. */
    uint32_t (*load_precisions)(const policy *p, moesim_precision order[PREC_COUNT]);
    /* True when on_route never reads the look-ahead predictions: a host may then leave emulated
     * ones unbuilt and pass NULL (false, the default: the host builds what params promise). */
    bool ignores_lookahead;
    /* For a policy whose knobs can turn its use of the predictions off (a prefetch knob): true
     * when on_route never reads them with these knobs (the policy's knob struct, as filled from
     * its section), with the same effect as ignores_lookahead. NULL: ignores_lookahead alone. */
    bool (*ignores_lookahead_with)(const void *knobs);
    /* The predictions on_route reads lie at distances 1..lookahead_distances alone: a host may
     * then hand it no more (params.lookahead_depth at most this), and a simulator reading a
     * trace whose look-ahead rows are chunked by distance inflates those distances alone.
     * 0 (the default): every distance the trace or the emulated predictor provides. */
    uint32_t lookahead_distances;
    /* For a policy that reads only each row's first candidates (a prefetcher of as many experts
     * as a token routes, or of a knob's count): with these knobs (as for ignores_lookahead_with),
     * an n such that on_route reads no more than each row's first max(n, top_k) candidates (nor
     * more than params.lookahead_k). A host may then hand it rows of fewer candidates
     * (params.lookahead_k at least that many), and a simulator reading a trace whose rows'
     * candidates are chunked apart inflates those chunks alone. NULL: every candidate. */
    uint32_t (*lookahead_candidates_with)(const void *knobs);
    /* on_route reads route.lookahead_scores only to order each row's candidates, keeps the
     * recorded order of a row whose scores never increase (common/ranked.h) and takes NULL
     * scores for rows listed best first: a host may then hand it NULL for a trace whose rows
     * are all ranked (its TRACE_RANKED_ATTR), with the same effect, and leave them unread. */
    bool lookahead_scores_rank_only;
} policy_methods;

/* ---- plug-ins ---- */

/* A policy built outside moesim (policies/WRITING.md, examples/policy-fifo/) is a shared object
 * that exports its table under this symbol; the host loads it with --policy-lib FILE.so (sim,
 * replay), `policy_lib = FILE.so` (experiment files) or libmoesim, refuses it in one line when
 * its api_version differs from POLICY_API_VERSION, and then drives it like a built-in one.
 * In the plug-in:  POLICY_PLUGIN_EXPORT const policy_methods moesim_policy = {...};
 * A plug-in calls nothing of moesim: it uses the types and macros of this header only. */
/* A policy name's bytes with its NUL at most (results store it whole). */
#define POLICY_NAME_MAX      32
#define POLICY_PLUGIN_SYMBOL "moesim_policy"
#define POLICY_PLUGIN_EXPORT __attribute__((visibility("default")))

/* ---- the registry ---- */

/* The policy registered under `name`, or NULL. */
const policy_methods *policy_lookup(const char *name);
/* Every registered policy, in listing order; *n receives the count. */
const policy_methods *const *policy_all(size_t *n);
/* "ondemand, lru, ..." for "unknown policy 'x' (known: ...)" messages. */
const char *policy_names(void);
/* Reads the knobs of `m` from config section m->name into a freshly allocated struct (caller
 * frees with free()); every key checked (unknown knob: error naming it). */
moesim_status policy_read_knobs(const policy_methods *m, config *c, void **knobs_out,
                                moesim_error *err);
/* m->create, its failure reported as "policy 'name': why" in one line: a plug-in's message
 * with its line breaks turned to spaces, a missing one named as such, a status outside
 * moesim_status read as MOESIM_EINPUT. */
moesim_status policy_create(const policy_methods *m, const policy_params *params, const void *knobs,
                            policy_mem_view mem, policy **out, moesim_error *err);
/* Whether a run of `m` with `knobs` (from policy_read_knobs) never reads the look-ahead
 * predictions (ignores_lookahead, ignores_lookahead_with). */
bool policy_ignores_lookahead(const policy_methods *m, const void *knobs);

#endif
