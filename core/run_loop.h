/* The one run loop: a trace played step by step under a policy, written once and driven by every
 * host — the simulator's virtual clock (sim/sim.c) and the replay's real backends (replay/exec.c
 * over replay_backend: cpu, cuda) — in the manner of ns-3's default and real-time simulator
 * implementations behind one scheduler interface. Sim and replay therefore cannot differ in what
 * they decide, only in how long things take, which is what validation measures.
 *
 * What the loop owns, for every host:
 * - the steps (core/schedule.h's iterator: which tokens run together), each step's tokens,
 *   requests, positions and emit flags, the policy's begin_step / end_step;
 * - per step, the ops of every layer in model order: attention, then a dense FFN or the router,
 *   the MoE layer's routes, shared experts and combine; the LM head for the tokens that emit;
 * - per MoE layer, the routing gathered once (core/route.h), split into sub-routes whose
 *   distinct experts fit one pool, and per sub-route: the active set, the prefetch accounting,
 *   the wait for room (copies already started cannot be evicted, so the stream waits for them to
 *   land), the policy's decision, the execution order (resident experts first, then by copy
 *   issue order) and each expert's ops, part by part with sim.part_overlap, each after a wait
 *   for its parts' copies; the pins that keep a running expert resident;
 * - warm-up before the clock starts, and the drain of copies nobody waited for.
 *
 * What a host supplies (run_host_ops): its clock, its lock, how the stream catches up with the
 * copies (deliver events up to the stream clock; wait until queued ops ran), how it waits for
 * one copy, and how long each op takes (the cost model advances a virtual clock; a backend runs
 * the kernel). Locking: a host with a copy thread guards the memory system and the policy with
 * its lock; the loop holds it around every memsys and policy call and around sync, wait_copy and
 * stall_begin / stall_end, and never around op, expert_wait or expert.
 *
 * Units: ns of the host's clock; experts and tokens are indices. Shapes use T = the largest
 * step's tokens, K = top-k, D x K' = look-ahead depth x candidates, E = experts per layer. */
#ifndef MOESIM_CORE_RUN_LOOP_H
#define MOESIM_CORE_RUN_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/model.h"
#include "common/precision.h"
#include "common/status.h"
#include "core/memsys.h"
#include "core/result.h"
#include "core/route.h"
#include "core/schedule.h"
#include "policies/policy.h"
#include "traces/trace.h"

/* The compute ops of a step beside the experts' (sim/COST.md). */
typedef enum run_op_kind {
    RUN_OP_ATTENTION, /* q/k/v and o projections, attention over each token's context */
    RUN_OP_DENSE,     /* a dense layer's FFN */
    RUN_OP_ROUTER,
    RUN_OP_SHARED, /* a MoE layer's shared experts */
    RUN_OP_COMBINE,
    RUN_OP_LM_HEAD, /* for the step's tokens that emit */
} run_op_kind;

typedef struct run_op {
    run_op_kind kind;
    uint32_t layer; /* model layer (0..n_layers-1); unused by the LM head */
    int moe_layer;  /* its MoE layer (router, the layer's timings), or -1 */
    uint64_t step_index;
    const sim_schedule_step *step; /* the step it belongs to (first, n_tokens, is_prefill) */
    uint32_t n_tokens;             /* the step's tokens; the LM head: those that emit */
    const char *cat, *name;        /* timeline category and name ("" without a timeline) */
} run_op;

/* A step as the host sees it begin: its index, its schedule entry, the KV bytes in use during
 * it, the requests it admitted (their indices, [n_admitted]), the context its attention reads
 * (sum over its tokens of position + 1) and how many of its tokens emit an output. */
typedef struct run_step_info {
    uint64_t index;
    const sim_schedule_step *sd;
    uint64_t kv_bytes;
    const uint32_t *admitted;
    uint32_t n_admitted;
    uint64_t attended;
    uint32_t n_emit;
} run_step_info;

/* What differs between hosts; `host` is run_loop.host. Slots marked optional may be NULL. */
typedef struct run_host_ops {
    /* The host's clock, as the policy sees it (ns). */
    uint64_t (*now_ns)(void *host);
    /* Optional: the lock guarding the memory system and the policy (a copy thread). */
    void (*lock)(void *host);
    void (*unlock)(void *host);
    /* Optional: copies warm-up's loads (before the clock starts; lock not held). */
    void (*warm_copy)(void *host);
    /* Optional: starts the clock (lock held). */
    void (*clock_start)(void *host);
    /* A step begins; the loop has filled its tokens, requests, positions and emit flags. */
    void (*step_begin)(void *host, const run_step_info *si);
    /* The stream catches up with the host before a decision: the simulator delivers every copy
     * event up to the stream clock, a backend that queues ops waits until they ran (lock held). */
    void (*sync)(void *host);
    /* Blocks until the next copy chunk landed; false when copies failed (lock held). The wait is
     * stall time; `why` names it on a timeline. */
    bool (*wait_copy)(void *host, const char *why);
    /* Optional: a wait for room begins / ends (a backend times it as a "stall" op; lock held). */
    void (*stall_begin)(void *host, const char *name, int moe_layer);
    void (*stall_end)(void *host);
    /* A compute op (lock not held). */
    void (*op)(void *host, const run_op *op);
    /* The expert's ops on (layer, expert, p) for `tokens` tokens, in the order and on the parts
     * of run_loop_expert_masks(split) (split: sim.part_overlap); each blocks until it can be
     * issued (its parts' copies landed, or are ordered before it), calls run_loop_expert_start,
     * then runs or enqueues it (lock not held). One slot for the waits and the ops of an expert:
     * the simulator makes millions of these calls a second. */
    void (*expert)(void *host, uint32_t layer, uint32_t expert, moesim_precision p, uint32_t tokens,
                   bool split);
    /* Optional: MoE layer `layer`'s experts ran (before its shared experts and combine). */
    void (*layer_end)(void *host, uint64_t step, uint32_t layer);
    /* The step's ops ran or are enqueued and the stream caught up (lock not held). */
    void (*step_end)(void *host, const run_step_info *si);
    /* Optional: MOESIM_OK, or the copies' failure in one line (checked after every step). */
    moesim_status (*io_status)(void *host, moesim_error *err);
    /* Every queued copy completes (lock held). */
    void (*drain)(void *host);
    /* An expert op returns once enqueued, not once run: the route's experts stay pinned until
     * the stream caught up (sync), not just until their op returned. */
    bool queues_ops;
} run_host_ops;

/* Looks up token `tok`'s rows: the trace block holding them and the token's index there. */
typedef const trace *(*run_row_fn)(void *ctx, uint64_t tok, uint64_t *local);

/* What a host gives the loop; borrowed for the run. */
typedef struct run_loop_config {
    const run_host_ops *ops;
    void *host;
    const policy_methods *pm;
    policy *pol;
    memsys *ms;
    const quant_table *quant;
    moesim_precision precision; /* expert.precision: HI when the policy names none */
    const model_geometry *model;
    const sim_hooks *hooks; /* or NULL */
    /* the trace: its request index (for the schedule) and its rows */
    const trace_meta *meta;
    const trace_request_index *rq;
    run_row_fn row_of;
    void *row_ctx;
    uint32_t batch_size;
    uint32_t max_step_tokens;
    /* look-ahead handed to the policy: recorded in the trace, or emulated from its routing */
    uint32_t la_depth, la_k;
    bool la_emulated;
    bool la_unread;     /* never read by the policy: emulated rows not built, recorded ones
                           not read (the stream skipped them) */
    bool la_scores_unread; /* recorded scores not read (a ranked trace's, for a policy whose
                              scores only rank): routes carry ids alone */
    double la_accuracy; /* of the emulated predictor */
    uint64_t seed;
    bool part_overlap; /* sim.part_overlap: gate/up before the down matrix arrives */
    bool timeline;     /* build op names */
    arena *mem;        /* the loop's buffers come from here */
} run_loop_config;

typedef struct run_loop {
    run_loop_config c;
    uint32_t L, E, K;
    /* set by the host before running, updated by host placement */
    uint64_t pool_cap_bytes;     /* per-layer pool, or the one pool */
    uint64_t route_expert_bytes; /* one expert at the widest precision the policy loads */
    uint32_t route_capacity;     /* most distinct experts of one (sub-)route */
    double bits_of[PREC_COUNT];  /* sim_route_bits_of(quant) */

    /* the current step */
    uint32_t *step_tok, *step_req, *step_pos; /* [T] */
    uint8_t *step_emit;                       /* [T] */
    uint32_t step_n;
    /* the step's routing at the layer being run (core/route.h) */
    uint16_t *r_experts; /* [T][K] */
    float *r_gates;      /* [T][K] */
    float *r_importance; /* [T], or NULL (the trace has none) */
    uint16_t *r_la_ids;  /* [T][D][K'], or NULL */
    float *r_la_scores;  /* [T][D][K'] */
    /* route scratch: [E] each */
    uint16_t *active;
    uint32_t *active_tokens, *stamp, *slot, *order;
    float *active_gate;
    uint8_t *plan;
    uint32_t *lep; /* active[a]'s lep at its planned precision (memsys_run_plan) */
    uint64_t *order_key;
    uint64_t *seen; /* [MODEL_MAX_EXPERTS / 64] */
    uint32_t stamp_gen;
    uint32_t *pinned_lep; /* [E] experts of the last route, unpinned at sync (queues_ops) */
    uint32_t n_pinned;

    /* totals */
    sim_route_tally tally;
    uint64_t expert_ops, sub_routes;
    uint64_t pf_hit, pf_active, pf_issued_sets; /* FIRM-MoE Eq. 7-8 */
    uint64_t la_right, la_total;                /* recorded look-ahead: top-1 hits at distance 1 */

    /* the schedule, produced step by step (nothing per step is kept) */
    sim_schedule_iter it;
    uint64_t n_steps_run;
} run_loop;

/* Sets up the loop's buffers from `c` (copied; what it points to stays borrowed). */
void run_loop_init(run_loop *rl, const run_loop_config *c);
/* Warm-up (the policy's initial placement, copied before the clock starts), every step of the
 * schedule, then the drain: copies still queued complete. Returns the first io_status failure. */
moesim_status run_loop_run(run_loop *rl, moesim_error *err);
/* Frees the schedule iterator (buffers belong to the arena). Accepts a zeroed struct. */
void run_loop_free(run_loop *rl);

/* An expert's ops, each as the parts it waits for (0 ends the list): with part overlap
 * (sim.part_overlap) gate+up after its gate and up parts' copies, then down after its down
 * part's; else one op after all three. */
static inline const uint32_t *run_loop_expert_masks(bool split) {
    static const uint32_t masks[2][3] = {{POLICY_PARTS_ALL, 0, 0},
                                         {1u << PART_GATE | 1u << PART_UP, 1u << PART_DOWN, 0}};
    return masks[split];
}

/* An expert op may start now (`now_ns`, the host's clock): the hosts' one observation point
 * (sim_hooks.on_expert_start), where every part it needs must be resident. */
static inline void run_loop_expert_start(const run_loop *rl, uint32_t layer, uint32_t expert,
                                         moesim_precision p, uint32_t mask, uint64_t now_ns) {
    const sim_hooks *h = rl->c.hooks;
    if (h && h->on_expert_start)
        h->on_expert_start(h->ctx, memsys_view(rl->c.ms), layer, expert, p, mask, now_ns);
}

/* The predictor accuracy a result reports: the emulated one, or the recorded look-ahead's
 * measured top-1 accuracy at distance 1. */
double run_loop_predictor_accuracy(const run_loop *rl);

#endif
