/* The state of one simulator run (sim/sim.c) shared with its copy engines (sim/copy_engine.c):
 * the virtual-time host of the run loop. Not part of the public API.
 *
 * Units: every time is integer ns since the run started; sizes are bytes.
 * Index conventions (shape comments below use them):
 *   le  = layer * E + expert                      (L * E entries)
 *   lep = memsys_lep: precision * L * E + le      (L * E * P)
 *   part index = lep * PART_COUNT + part          (L * E * P * 3) */
#ifndef MOESIM_SIM_SIM_INTERNAL_H
#define MOESIM_SIM_SIM_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/arena.h"
#include "core/block_pool.h"
#include "core/future.h"
#include "core/memsys.h"
#include "core/run_loop.h"
#include "core/timeline.h"
#include "policies/policy.h"
#include "sim/cost.h"
#include "sim/event.h"
#include "sim/sim.h"

#define NONE             UINT32_MAX
#define SIM_ECOST_TOKENS 64 /* expert op times cached for 1..63 tokens */

/* ---- copy engines (the clock of core/memsys.h's queues: sim/copy_engine.c) ---- */

enum { EV_CHUNK = 1 };

/* When a transfer's first span (or chunk), which takes its whole copy or (a prefetch's) all of
 * it but the last chunk, ends and its parts land, counted from its start (UINT64_MAX: the part
 * lands at the span's end or after). */
typedef struct sim_first_span_ns {
    uint64_t end_ns; /* 0: not worked out yet (or a span of no time, worked out each time) */
    uint64_t land_ns[PART_COUNT];
} sim_first_span_ns;

typedef struct sim_engine {
    double bytes_per_s;
    uint64_t latency_ns;
    bool latency_per_chunk;         /* every chunk pays latency_ns (hw h2d_latency_per_chunk) */
    bool spans;                     /* may serve spans of chunks (engine_may_span) */
    double slowdown_beside_compute; /* hw h2d_slowdown_beside_compute (H2D only; 0: none) */
    bool busy;                      /* a chunk (or span) is in flight */
    memsys_chunk chunk;             /* the chunk in flight */
    uint64_t t_start_ns, t_end_ns;  /* when it started and ends (its event's time) */
    /* the next part of the span in flight that lands before its end (memsys_chunk_next_landing)
     * and when: landed by the host, not by an event (-1, UINT64_MAX: none) */
    int land_part;
    uint64_t land_ns;
    uint64_t start_xfer_ns; /* engine_xfer_ns at its offset */
    /* without a link slowdown, a first span's times depend on its precision, parts and whether
     * it keeps the last chunk alone: worked out for the first of each, looked up for the rest
     * (most copies of a span host) */
    sim_first_span_ns first_span[PREC_COUNT << (PART_COUNT + 1)]; /* engine_first_span_ns */
    const sim_first_span_ns *times; /* the chunk in flight's first-span times, or NULL */
    uint64_t seg_start_ns;  /* timeline: when the open segment's transfer started being served */
    uint32_t seg_xfer;      /* timeline: the open segment's transfer, or NONE */
    uint64_t seg_seq;       /* its issue sequence (transfer slots are reused) */
    char seg_name[96];
    uint8_t seg_cls;
    uint64_t busy_ns;
    int track;
    /* [n_at_chunk] cost_transfer_ns(k << chunk_shift): no division for the whole chunks nearly
     * every copy is cut into (NULL unless the chunk size is a power of two: the offset's chunk
     * index is then a shift, where a division would cost more than the table saves) */
    uint64_t *ns_at_chunk;
    uint64_t n_at_chunk;
    unsigned chunk_shift;
} sim_engine;

struct sim_state {
    /* fixed */
    const trace *tr;      /* with a stream: its skeleton (per-token arrays only) */
    trace_stream *stream; /* NULL: tr holds the rows */
    bool la_skipped;      /* the stream skips the trace's look-ahead rows (their hits: its own) */
    const model_geometry *model;
    cost_model cost;
    sim_settings set;
    uint32_t L, E, K;
    moesim_precision prec;
    uint64_t part_bytes[PREC_COUNT][PART_COUNT];
    uint64_t non_expert_bytes, act_bytes, budget_bytes, expert_budget_bytes;
    uint64_t pool_cap;
    uint32_t route_capacity;     /* max distinct experts of one (sub-)route */
    uint64_t route_expert_bytes; /* one expert at the widest precision the policy loads */
    arena mem;

    memsys ms;         /* residency, pools, copy queues (core/memsys.h) */
    block_pool blocks; /* sim.block_pools: the pools' fixed-size blocks per precision */
    sim_future future;
    sim_engine eng[MEMSYS_ENGINES];
    sim_event_queue q;
    uint64_t now_ns; /* time of the event being delivered, or the stream clock */
    uint64_t kv_bytes, peak_hbm;

    /* policy */
    const policy_methods *pm;
    policy *pol;
    policy_mem_view view;

    /* schedule (time-independent: which tokens run in which step, core/schedule.h), produced
     * step by step by the run loop: nothing per token or per step is kept */
    trace_request_index rq_own; /* built from an in-memory trace */
    const trace_request_index *rq;
    uint64_t n_steps, kv_peak_bytes;
    uint32_t max_step_tokens;
    uint64_t *req_t_admit; /* [n_requests] start of the step that admitted the request */
    uint64_t *req_t_first; /* [n_requests] end of its first step */
    uint64_t *req_t_last;  /* [n_requests] end of its last step */

    /* the run loop (core/run_loop.h) and the compute stream's clock */
    run_loop loop;
    uint64_t t_ns;        /* the compute stream: when its last op ends */
    uint64_t attn_ns;     /* the current step's attention op, per layer */
    uint64_t op_issue_ns; /* hw op_issue_ns: the host's time around every op */
    double op_slowdown;   /* hw op_slowdown_beside_copy (0: none) */
    bool plain_expert_ops; /* no hook at an expert op's start, no op slowdown, no timeline: an
                              expert op only advances the clock (most runs) */
    uint64_t layer_t0_ns; /* the MoE layer being run: when its router started */
    uint64_t ecost_ns[PREC_COUNT][SIM_ECOST_TOKENS][2]; /* expert op times by tokens (0: unset) */
    uint64_t opcost_ns[RUN_OP_LM_HEAD + 1][SIM_ECOST_TOKENS]; /* other ops' times (0: unset) */

    /* metrics */
    uint64_t stall_ns;
    const sim_hooks *hooks;
    sim_timeline tl;
    sim_timeline_hbm_shown tl_hbm; /* what the per-precision HBM counters show */

    /* lifetime */
    void *knobs;          /* the policy's knob struct (policy_read_knobs) */
    policy_params params; /* borrowed by the policy for the run */
    bool queue_live, ms_live;
    uint32_t cost_extrapolated;
    uint64_t makespan_ns;
};

typedef struct sim_state sim_state;

/* Bytes of one expert at precision p (0: not stored). */
static inline uint64_t sim_expert_bytes_at(const sim_state *s, uint32_t p) {
    return s->part_bytes[p][0] + s->part_bytes[p][1] + s->part_bytes[p][2];
}

/* The memory system's host: the copy engines its queues feed, the HBM check (falls heard only
 * with a timeline open: call after opening it), and with sim.block_pools the placement of loads
 * in fixed-size blocks (core/block_pool.h). */
memsys_host sim_memsys_host(sim_state *s, bool block_pools);
/* The engines' rates and latencies from the profile, their chunk-time tables (from s->mem). */
void sim_engines_init(sim_state *s, const hw_profile *hw, uint64_t chunk_bytes);
/* Checks that the run's HBM use is within the budget and records its peak. */
void sim_hbm_note(sim_state *s);
/* Delivers every event at or before t_ns, in (time, seq) order. */
void sim_deliver_until(sim_state *s, uint64_t t_ns);
/* The same, inline where nothing is due: the stream asks before every expert op. */
static inline void sim_advance_to(sim_state *s, uint64_t t_ns) {
    if ((s->q.n && s->q.heap[0].t_ns <= t_ns) || s->eng[MEMSYS_H2D].land_ns <= t_ns)
        sim_deliver_until(s, t_ns);
    else
        s->now_ns = t_ns;
}
/* Delivers the next event or part landing (the stream is blocked); returns its time. */
uint64_t sim_deliver_next(sim_state *s);
/* The parts of `mask` in a part-state triple st[PART_COUNT] that are not resident. */
static inline uint32_t sim_parts_waiting(const uint8_t *st, uint32_t mask) {
    return memsys_parts_not_in(st, POLICY_RESIDENT) & mask;
}
/* Delivers events and landings (the stream is blocked) until every part of `mask` in
 * st[PART_COUNT] is resident, each waited-for part being loading; returns the last one's time. */
uint64_t sim_deliver_until_resident(sim_state *s, const uint8_t *st, uint32_t mask);
/* Every copy still queued or in flight completes; nothing may be left. */
void sim_drain(sim_state *s);
/* How long the host->device engine stays busy from the stream's clock if no new work comes:
 * the chunk (or span) in flight, then its queued work (memsys_engine_backlog), which runs beside
 * the op about to start, so slowed by the link's slowdown beside compute. 0: idle. Events up to
 * the clock delivered (sim_advance_to). */
uint64_t sim_link_busy_ns(const sim_state *s);

/* A job of d ns alone beside another for the first w ns, each slowing the other by x while both
 * run (rate 1/(1+x)): d·(1+x) when it ends first, else d + w·x/(1+x). The one rule of the
 * simulator's contention between the copy engine and the compute stream, both ways. */
static inline uint64_t sim_beside_ns(uint64_t d, uint64_t w, double x) {
    double whole = (double)d * (1 + x), part = (double)d + (double)w * x / (1 + x);
    return (uint64_t)llround(whole < part ? whole : part);
}

#endif
