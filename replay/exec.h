/* The replay executor (replay/exec.c): the real-time host of the one run loop
 * (core/run_loop.h), and the backend table that supplies what differs between machines, in the
 * manner of ggml's backend interface.
 *
 * The loop itself — steps, layers, routes and sub-routes, the waits for room and for a part's
 * copy, the order of ops, the policy calls — is the simulator's, line for line, since both drive
 * core/run_loop.c. The executor adds what a real run needs around it: setup through the same
 * modules (the schedule core/schedule.h, the budget core/budget.h, the memory system with its
 * copy classes, chunking, promotion and host placement core/memsys.h, the expert pools
 * core/block_pool.h), the real clock, the timing of every op, the replay's checks (no expert op
 * before its copy landed, the expert budget never exceeded), and the result and timeline
 * (core/result.h, core/timeline.h). So a run is step for step comparable with sim_run on the
 * same trace, settings and profile.
 *
 * A backend (replay_backend, a static const table over the opaque x->be_state) supplies the
 * physical side: its host store and arena, the copy engine that serves memsys's queues chunk by
 * chunk, the compute of each op, and how ops are timed. Two exist: `cpu` (replay/exec_cpu.c: a
 * DRAM arena, an O_DIRECT expert file read by a copy thread, the engine's CPU kernels run on the
 * executor's thread, timed by the host clock as they run) and `cuda` (replay/run.cu: device
 * blocks, pinned host memory and an SSD file, copy and compute streams, CUDA events resolved at
 * the end of each step).
 *
 * Threads: the executor's thread makes every policy call. A backend with a copy thread sets
 * x->lock (it guards the memory system); the loop holds it around every memsys and policy call.
 * The slots a route's planning needs (wait_compute, wait_copy, and op_begin / op_end of the
 * "stall" op while waiting for room) and drain are called with it held, the others without.
 *
 * Time: ns of CLOCK_MONOTONIC since clock_start (replay_exec_now); the policy sees that clock.
 * Op times reach the executor through replay_exec_op_done, in the order the ops ran, within the
 * step (a backend may report a step's ops at its end). */
#ifndef MOESIM_REPLAY_EXEC_H
#define MOESIM_REPLAY_EXEC_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "policies/policy.h"
#include "replay/replay.h"
#include "core/block_pool.h"
#include "core/budget.h"
#include "core/future.h"
#include "core/memsys.h"
#include "core/route.h"
#include "core/run_loop.h"
#include "core/schedule.h"
#include "core/timeline.h"

/* One op's times as the backend measured them (ns, replay_exec_now's clock). */
typedef struct replay_op_times {
    uint64_t t0_ns, t1_ns;
    uint64_t need_ns; /* when the copy the op waited for landed, or REPLAY_NO_NEED */
    int order;        /* -1: not checked; 0: started after its parts landed; 1: before (bug) */
} replay_op_times;
#define REPLAY_NO_NEED UINT64_MAX

typedef struct replay_exec replay_exec;

/* A backend: NULL slots are marked optional. Each gets the executor's state and its own in
 * x->be_state. */
typedef struct replay_backend {
    const char *name;
    /* Inputs this backend cannot run, one line each (before anything is made). Optional. */
    moesim_status (*check)(replay_exec *x, moesim_error *err);
    /* DRAM bytes host placement may use (memsys_place_for_policy): what does not fit lives on
     * the SSD tier. */
    uint64_t (*placement_dram)(const replay_exec *x);
    /* After placement: the host store, the arena (block_pool_init on x->pool), weights,
     * streams, the copy thread (and x->lock). */
    moesim_status (*setup)(replay_exec *x, moesim_error *err);
    /* Frees what setup made, also after a failed setup; x->be_state may be NULL. */
    void (*teardown)(replay_exec *x);

    /* memsys has work for copy engine `engine` (memsys_host.on_work). */
    void (*copy_kick)(replay_exec *x, int engine);
    /* Part `part_index` left the pool (after the pool freed its block). Optional. */
    void (*part_released)(replay_exec *x, size_t part_index);
    /* Copies the loads of warm-up (x->ms.warm) into their blocks, before the clock starts. */
    void (*warm_copy)(replay_exec *x);
    /* Starts the run's clock: sets x->t0_ns (CLOCK_MONOTONIC, replay_exec_clock_ns). */
    void (*clock_start)(replay_exec *x);

    /* A step begins (the stream is idle, completed copies are reported). */
    void (*step_begin)(replay_exec *x, uint64_t step);
    /* The step's ops are enqueued and the stream is idle: reports every op of the step not yet
     * reported (replay_exec_op_done) and sets x->step_end[step] (and x->step_start[step] when
     * its own clock says better than the host's at step_begin). */
    void (*step_end)(replay_exec *x, uint64_t step);
    /* Blocks until the compute stream is idle (lock held); NULL when ops run synchronously (an
     * op done is an op returned). */
    void (*wait_compute)(replay_exec *x);
    /* Blocks until the next copy chunk landed (lock held); false when copies failed. */
    bool (*wait_copy)(replay_exec *x);
    /* Blocks until an op on the parts in `mask` of (layer, expert, p) can be issued. */
    void (*expert_wait)(replay_exec *x, uint32_t layer, uint32_t expert, moesim_precision p,
                        uint32_t mask);

    /* A timed op of the compute stream: begin, run, end. */
    void (*op_begin)(replay_exec *x, const char *cat, const char *name, int moe_layer);
    void (*run)(replay_exec *x, const run_op *op);
    void (*op_end)(replay_exec *x);
    /* The expert's gate+up (mask has PART_GATE) and down (PART_DOWN) ops at precision p for
     * `tokens` tokens from its pool blocks, each timed and reported with the copy it waited for. */
    void (*expert)(replay_exec *x, uint32_t layer, uint32_t expert, moesim_precision p,
                   uint32_t tokens, uint32_t mask);

    /* Every queued copy completes (lock held). */
    void (*drain)(replay_exec *x);
    /* MOESIM_OK, or the copies' failure in one line. Optional. */
    moesim_status (*io_status)(replay_exec *x, moesim_error *err);
    /* After the drain: sets x->h2d_busy_ns, ssd_busy_ns, h2d_copied_bytes, device_alloc_bytes
     * (and device_used_peak: memory in use while the run holds everything). */
    void (*finish)(replay_exec *x);
} replay_backend;

extern const replay_backend replay_backend_cpu;  /* replay/exec_cpu.c */
extern const replay_backend replay_backend_cuda; /* replay/run.cu, with MOESIM_CUDA */

struct replay_exec {
    const replay_inputs *in;
    const replay_backend *be;
    void *be_state;
    const trace *tr;
    const model_geometry *m;
    sim_settings set;
    sim_schedule sch;
    sim_budget bud;
    uint32_t L, E, K;
    moesim_precision prec;
    quant_table quant;
    uint64_t part_bytes[PREC_COUNT][PART_COUNT]; /* the simulator's bytes of a part (0: not
                                                    stored) */
    bool policy_only;                            /* sim.host_precisions = policy */

    /* the memory system and the pools; lock guards both when the backend has a copy thread */
    pthread_mutex_t *lock;
    memsys ms;
    bool ms_live;
    sim_future future;
    block_pool pool;
    uint32_t route_capacity;     /* max distinct experts of one (sub-)route */
    uint64_t route_expert_bytes; /* one expert at the widest precision the policy loads */
    uint64_t experts_peak;       /* bytes of expert weights in the pools, at most */

    /* the policy */
    const policy_methods *pm;
    policy *pol;
    void *knobs;
    policy_params params;

    /* the run loop (core/run_loop.h): routes, steps, their waits; its buffers in `mem` */
    run_loop loop;
    arena mem;
    trace_request_index rq;     /* the trace's requests, built when `tr` holds them */
    const trace_request_index *requests; /* &rq, or the stream's (in->stream) */
    uint32_t la_depth, la_k;    /* look-ahead handed to the policy */
    bool la_emulated;           /* emulated from the routing (the trace has none) */

    /* clock and measures */
    uint64_t t0_ns;
    bool clock_on;
    uint64_t *step_start, *step_end; /* [n_steps] ns; NULL with a stream (sch holds the plan's
                                        sizes only), which keeps per request instead: */
    uint64_t *req_t_admit, *req_t_first, *req_t_last; /* [n_requests] ns, with a stream */
    uint64_t last_step_end_ns;                        /* with a stream: the makespan */
    uint64_t *layer_t0, *layer_t1;   /* [L] the step's first and last op of each MoE layer */
    uint64_t last_op_end;            /* of the step's ops reported so far */
    uint32_t ops_in_step;
    uint64_t stall_ns;
    uint64_t order_checked, order_violations;
    uint64_t h2d_busy_ns, ssd_busy_ns, h2d_copied_bytes, device_alloc_bytes; /* finish sets */
    uint64_t device_used_before, device_used_peak; /* the backend's view of its device, or 0 */
    const sim_hooks *hooks;
    sim_timeline tl;
    sim_timeline_hbm_shown tl_hbm; /* what the per-precision HBM counters show */
};

/* The longest context of the trace: 1 + its largest position. */
uint32_t replay_exec_max_context(replay_exec *x);

/* Runs the trace under `policy_name` on backend `be` (replay_run, replay_run_cpu). */
moesim_status replay_exec_run(const replay_backend *be, const replay_inputs *in,
                              const char *policy_name, config *settings, sim_result *out,
                              replay_checks *checks, moesim_error *err);

/* sim.host_precisions as memsys reads it (memsys_parse_host_precisions), limited to the formats
 * the replay's kernels have (bf16, int8, int4, int2): 'policy' and 'all' store those, a list
 * must name only those; `primary` (expert.precision) must be one. */
moesim_status replay_exec_host_precisions(const char *text, moesim_precision primary,
                                          bool stored[PREC_COUNT], bool *policy_only,
                                          moesim_error *err);
/* CLOCK_MONOTONIC, ns. */
uint64_t replay_exec_clock_ns(void);
/* The run's clock: ns since clock_start. */
uint64_t replay_exec_now(const replay_exec *x);
/* A backend reports one op of the current step (in the order the ops ran): the timeline slice,
 * the layer's time, stall time (a "stall" op; the stream idle before the copy it needed), the
 * order check. */
void replay_exec_op_done(replay_exec *x, const char *cat, const char *name, int moe_layer,
                         const replay_op_times *t);
/* The timeline name of an expert's gate+up (part PART_GATE) or down op. */
void replay_exec_expert_name(char *buf, size_t cap, uint32_t layer, uint32_t expert,
                             moesim_precision p, uint32_t tokens, int part);
static inline void replay_exec_lock(replay_exec *x) {
    if (x->lock) pthread_mutex_lock(x->lock);
}
static inline void replay_exec_unlock(replay_exec *x) {
    if (x->lock) pthread_mutex_unlock(x->lock);
}

#endif
