/* The discrete-event simulator of a GPU serving an MoE model whose experts do not all fit
 * (sim/README.md describes the model, its units and what it leaves out).
 *
 * Resources: one in-order compute stream; a host->device copy engine (PCIe) and an SSD read
 * queue, each serving transfers in chunks with three priority classes (demand > prefetch >
 * background): at every chunk boundary the engine serves the head of the highest non-empty
 * class, so a demand load overtakes queued or running prefetches after at most one chunk. A
 * transfer pays its engine's latency once, when its first chunk starts; its parts (gate, up,
 * down, in that order in the byte stream) become resident as their last byte lands.
 *
 * The run loop: the compute stream is the driving process; it advances its own clock op by op
 * (attention, router, experts part by part, shared experts, combine, LM head) and, before any
 * action that can touch the copy engines or the policy, delivers every queued event (chunk
 * completions) up to its clock, in (time, seq) order. An expert op whose parts are not resident
 * blocks the stream: events are delivered until they are, and the wait is stall time.
 * Invariants (asserted): event time never goes back; no event is left at the end; an expert op
 * starts only when every part it needs is resident at its planned precision; HBM use never
 * exceeds the budget. */
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "common/alloc.h"
#include "common/arena.h"
#include "common/check.h"
#include "policies/policy.h"
#include "sim/block_pool.h"
#include "sim/budget.h"
#include "sim/cost.h"
#include "sim/event.h"
#include "sim/future.h"
#include "sim/memsys.h"
#include "sim/result.h"
#include "sim/route.h"
#include "sim/schedule.h"
#include "sim/sim.h"
#include "sim/sim_internal.h"

#define NONE             UINT32_MAX
#define SIM_ECOST_TOKENS 64 /* expert op times cached for 1..63 tokens */

/* ---- settings ---- */

static const char *const precision_choices[] = {"bf16", "fp8",  "int8", "int4",
                                                "int3", "int2", NULL};


#define SF(sec, k, t, m, mn, mx, d, h)                                                             \
    { sec, k, t, offsetof(sim_settings, m), 0, false, mn, mx, NULL, d, h }
static const config_field sim_fields[] = {
    SF("memory", "budget_gb", CONFIG_F64, budget_gb, 0, 1e6, "0",
       "HBM the run may use, GiB; 0: the hardware profile's memory"),
    SF("cache", "experts_per_layer", CONFIG_U32, experts_per_layer, 0, MODEL_MAX_EXPERTS, "0",
       "per-layer expert pool in experts at expert.precision; 0: one pool from the budget"),
    {"expert", "precision", CONFIG_ENUM, offsetof(sim_settings, precision), 0, false, 1, 0,
     precision_choices, "bf16", "precision single-precision policies run experts at"},
    SF("batch", "size", CONFIG_U32, batch_size, 1, 65536, "1",
       "requests in flight together (each decode step advances each by one token)"),
    SF("predictor", "accuracy", CONFIG_F64, predictor_accuracy, 0, 1, "0.9",
       "top-1 accuracy of the emulated look-ahead predictor (traces without predictions); 0.9: "
       "HOBBIT §3.3 measures ~96% next layer, ~90% 2-3 layers ahead"),
    SF("predictor", "depth", CONFIG_U32, predictor_depth, 0, TRACE_MAX_LOOKAHEAD_DEPTH, "1",
       "look-ahead distance D of the emulated predictor"),
    SF("sim", "chunk_kib", CONFIG_U64, chunk_kib, 4, 1u << 20, "1024",
       "copy chunk size, KiB: a demand load overtakes queued prefetches at chunk boundaries (1 "
       "MiB: assumption, a few % of one PCIe copy's latency at 24 GB/s)"),
    {"sim", "part_overlap", CONFIG_BOOL, offsetof(sim_settings, part_overlap), 0, false, 1, 0, NULL,
     "true", "start an expert's gate/up compute before its down matrix arrives"},
    SF("sim", "seed", CONFIG_U64, seed, 1, 0, "1", "seed of the emulated predictor and policies"),
    {"sim", "host_precisions", CONFIG_STR, offsetof(sim_settings, host_precisions),
     sizeof(((sim_settings *)0)->host_precisions), false, 1, 0, NULL, "policy",
     "precisions host DRAM holds experts at: 'policy' (those the policy declares it loads), "
     "'all', or a comma list; what DRAM cannot hold lives on the SSD"},
    SF("sim", "bounce_mib", CONFIG_U64, bounce_mib, 1, 1u << 20, "64",
       "DRAM staging buffer for SSD reads, MiB, taken from the profile's dram_gib (assumption: 64 "
       "chunks of the default 1 MiB keep the SSD and PCIe copies pipelined; no engine standard)"),
    {"sim", "block_pools", CONFIG_BOOL, offsetof(sim_settings, block_pools), 0, false, 1, 0, NULL,
     "false",
     "place loads in fixed-size blocks per precision, as the replay's pools do (a freed block "
     "serves its own precision only: sim/block_pool.h); false: the byte budget alone"},
    {"sim", "cost_table", CONFIG_STR, offsetof(sim_settings, cost_table),
     sizeof(((sim_settings *)0)->cost_table), false, 1, 0, NULL, NULL,
     "measured cost table (sim/COST.md); empty: roofline"},
};
#undef SF

const config_field *sim_settings_fields(size_t *n) {
    *n = MOESIM_ARRAY_LEN(sim_fields);
    return sim_fields;
}

moesim_status sim_settings_read(config *c, sim_settings *out, moesim_error *err) {
    return config_read_fields(c, sim_fields, MOESIM_ARRAY_LEN(sim_fields), out, err);
}

/* ---- copy engines (the clock of sim/memsys.h's queues) ---- */

enum { EV_CHUNK = 1 };

typedef struct sim_engine {
    double bytes_per_s;
    uint64_t latency_ns;
    bool latency_per_chunk; /* every chunk pays latency_ns (hw h2d_latency_per_chunk) */
    bool spans;             /* may serve spans of chunks (engine_may_span) */
    bool busy;              /* a chunk (or span) is in flight */
    memsys_chunk chunk;    /* the chunk in flight */
    uint64_t t_start_ns, t_end_ns; /* when it started and ends (its event's time) */
    uint64_t start_xfer_ns;        /* engine_xfer_ns at its offset */
    uint64_t seg_start_ns; /* timeline: when the open segment's transfer started being served */
    uint32_t seg_xfer;     /* timeline: the open segment's transfer, or NONE */
    uint64_t seg_seq;      /* its issue sequence (transfer slots are reused) */
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
    const model_geometry *model;
    cost_model cost;
    sim_settings set;
    uint32_t L, E, K, P;
    moesim_precision prec;
    uint64_t part_bytes[PREC_COUNT][PART_COUNT];
    uint64_t non_expert_bytes, act_bytes, budget_bytes, expert_budget_bytes;
    uint64_t pool_cap;
    uint32_t route_capacity;  /* max distinct experts of one (sub-)route */
    uint64_t route_expert_bytes; /* one expert at the widest precision the policy loads */
    arena mem;

    memsys ms; /* residency, pools, copy queues (sim/memsys.h) */
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

    /* schedule (time-independent: which tokens run in which step, sim/schedule.h), produced
     * step by step: nothing per token or per step is kept */
    trace_request_index rq_own; /* built from an in-memory trace */
    const trace_request_index *rq;
    sim_schedule_iter it;
    uint64_t n_steps, kv_peak_bytes;
    uint32_t max_step_tokens;
    uint32_t *step_tok;     /* [max_step_tokens] the current step's tokens */
    uint8_t *step_emit;     /* [max_step_tokens] the token emits an output */
    uint32_t step_n;        /* tokens of the current step */
    uint64_t *req_t_admit;  /* [n_requests] start of the step that admitted the request */
    uint64_t *req_t_first;  /* [n_requests] end of its first step */
    uint64_t *req_t_last;   /* [n_requests] end of its last step */

    /* per-route scratch: [max_step_tokens * K] etc. */
    uint16_t *r_experts;
    float *r_gates;
    float *r_importance;
    uint16_t *r_la_ids;
    float *r_la_scores;
    uint16_t *active;
    uint32_t *active_tokens;
    float *active_gate;
    uint8_t *plan;
    uint32_t *stamp; /* [E] */
    uint32_t *slot;  /* [E] index in the active list */
    uint32_t stamp_gen;
    uint32_t *order; /* [E] execution order of the planned experts */
    uint64_t *order_key;
    uint32_t la_depth, la_k;
    bool la_emulated;
    bool la_unread; /* predictions the policy never reads: emulated ones not built, recorded ones
                       not read (the stream skips them); r_la_* NULL */
    uint64_t ecost_ns[PREC_COUNT][SIM_ECOST_TOKENS][2]; /* expert op times by tokens (0: unset) */

    /* recorded look-ahead: top-1 hits at distance 1, counted as the run gathers each row once */
    uint64_t la_right, la_total;

    /* prefetch accounting (FIRM-MoE Eq. 7-8; the prefetched sets are memsys's pf_mark) */
    uint64_t pf_hit, pf_active, pf_issued_sets;

    /* metrics */
    sim_route_tally tally; /* accesses, hits, skips and gate mass by precision class */
    uint64_t expert_ops, stall_ns, sub_routes;
    const sim_hooks *hooks;
    sim_timeline tl;
    sim_timeline_hbm_shown tl_hbm; /* what the per-precision HBM counters show */

    /* lifetime */
    void *knobs;          /* the policy's knob struct (policy_read_knobs) */
    policy_params params; /* borrowed by the policy for the run */
    bool queue_live, ms_live;
    uint32_t *step_req, *step_pos; /* [max_step_tokens] of the current step */
    uint32_t cost_extrapolated;
    uint64_t makespan_ns;
};

typedef struct sim_state sim_state;

static size_t idx_lep(const sim_state *s, uint32_t l, uint32_t e, uint32_t p) {
    return ((size_t)l * s->E + e) * s->P + p;
}

/* The block holding token `tok`'s rows and its index there: the trace itself, or the stream's
 * cached block (valid until the next lookup). */
static const trace *row_of(void *ctx, uint64_t tok, uint64_t *local) {
    sim_state *s = ctx;
    if (!s->stream) {
        *local = tok;
        return s->tr;
    }
    return trace_stream_row(s->stream, tok, local);
}

/* ---- memory-system callbacks ---- */

static void hbm_note(sim_state *s) {
    uint64_t used = s->non_expert_bytes + s->act_bytes + s->kv_bytes + s->ms.experts_used;
    MOESIM_ASSERT(used <= s->budget_bytes);
    if (used > s->peak_hbm) s->peak_hbm = used;
}

static void on_hbm(void *ctx, uint64_t experts_used) {
    sim_state *s = ctx;
    hbm_note(s);
    sim_timeline_hbm(&s->tl, s->now_ns, experts_used, s->ms.prec_used, &s->tl_hbm);
}

/* sim.block_pools: a load is placed only where the replay could place it, in a block of its
 * precision (sim/block_pool.h; the byte budget alone admits loads no block can hold). */
static bool on_reserve(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p,
                       uint32_t parts) {
    sim_state *s = ctx;
    return block_pool_reserve_expert(&s->blocks, &s->ms, layer, expert, p, parts);
}

static void on_release(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p, int part) {
    sim_state *s = ctx;
    block_pool_release_part(&s->blocks, &s->ms, layer, expert, p, part);
}

static const char *const cls_name[MEMSYS_CLASSES] = {"demand", "prefetch", "background"};

static void engine_close_segment(sim_state *s, sim_engine *e) {
    if (!s->tl.on || e->seg_xfer == NONE) return;
    sim_timeline_slice(&s->tl, e->track, cls_name[e->seg_cls], e->seg_name, e->seg_start_ns,
                       s->now_ns);
    e->seg_xfer = NONE;
}

/* cost_transfer_ns of `offset` bytes on engine e. */
static uint64_t engine_xfer_ns(const sim_engine *e, uint64_t offset) {
    uint64_t k = offset >> e->chunk_shift;
    if (e->ns_at_chunk && k << e->chunk_shift == offset && k < e->n_at_chunk)
        return e->ns_at_chunk[k];
    return cost_transfer_ns(offset, e->bytes_per_s);
}

/* When the first `bytes` of the chunk in flight end. A chunk of b bytes after d bytes of its
 * transfer takes ceil((d+b)·1e9/bw) − ceil(d·1e9/bw) ns, so chunks (and spans) add up to the
 * transfer's exact time; the latency is paid once per transfer, on its first chunk, or by every
 * chunk with latency_per_chunk. */
static uint64_t engine_end_ns(const sim_state *s, const sim_engine *e, uint64_t bytes) {
    uint64_t t = e->t_start_ns + engine_xfer_ns(e, e->chunk.offset + bytes) - e->start_xfer_ns;
    if (e->latency_per_chunk) {
        uint64_t chunk = s->ms.cfg.chunk_bytes;
        t += (bytes + chunk - 1) / chunk * e->latency_ns;
    } else if (e->chunk.first) {
        t += e->latency_ns;
    }
    return t;
}

/* Whether engine `id` may serve a span of chunks as one event (memsys_next_span): only when no
 * other event can fall on the span's inner boundaries, where chunk by chunk their order would
 * depend on issue sequence: the SSD engine idle (it starts only through on_work, which cuts the
 * span first). Not with a timeline, which draws the stream's stall chunk by chunk. */
static bool engine_may_span(const sim_state *s, int id) {
    return id == MEMSYS_H2D && s->eng[id].spans && !s->tl.on && !s->eng[MEMSYS_SSD].busy;
}

/* Serves the next chunk (or span) if the engine is idle and the memory system has one for it. */
static void engine_kick(sim_state *s, int id) {
    sim_engine *e = &s->eng[id];
    if (e->busy) return;
    memsys_chunk c;
    bool any = engine_may_span(s, id) ? memsys_next_span(&s->ms, id, &c)
                                      : memsys_next_chunk(&s->ms, id, &c);
    if (!any) {
        engine_close_segment(s, e);
        return;
    }
    const memsys_xfer *x = &s->ms.xf[c.xfer];
    if (e->seg_xfer != c.xfer || e->seg_seq != x->seq) {
        engine_close_segment(s, e);
        if (s->tl.on) {
            e->seg_xfer = c.xfer;
            e->seg_seq = x->seq;
            e->seg_cls = x->cls;
            e->seg_start_ns = s->now_ns;
            snprintf(e->seg_name, sizeof e->seg_name, "L%u e%u %s %s", x->layer, x->expert,
                     precision_name((moesim_precision)x->prec), cls_name[x->cls]);
        }
    }
    e->busy = true;
    e->chunk = c;
    e->t_start_ns = s->now_ns;
    e->start_xfer_ns = engine_xfer_ns(e, c.offset);
    e->t_end_ns = engine_end_ns(s, e, c.bytes);
    sim_event_push(&s->q, e->t_end_ns, EV_CHUNK, (uint32_t)id);
}

/* Cuts engine id's span back to the chunk in flight at now_ns, the first that ends after it
 * (chunk by chunk, those ending at or before now_ns would have been delivered), so that new work
 * competes for the engine at that chunk's end, as it would chunk by chunk. The moved event takes
 * a new sequence number: no other event was pushed since the span started (engine_may_span). */
static void engine_cut_span(sim_state *s, int id) {
    sim_engine *e = &s->eng[id];
    uint64_t chunk = s->ms.cfg.chunk_bytes, keep = chunk;
    if (!e->busy || e->chunk.bytes <= chunk) return;
    while (keep < e->chunk.bytes && engine_end_ns(s, e, keep) <= s->now_ns) keep += chunk;
    /* its last chunk is in flight (a demand copy's may be shorter than a chunk): nothing to cut */
    if (keep >= e->chunk.bytes) return;
    memsys_span_trim(&s->ms, &e->chunk, keep);
    e->t_end_ns = engine_end_ns(s, e, keep);
    bool moved = sim_event_cancel(&s->q, EV_CHUNK, (uint32_t)id);
    MOESIM_ASSERT(moved);
    sim_event_push(&s->q, e->t_end_ns, EV_CHUNK, (uint32_t)id);
}

static void on_work(void *ctx, int engine) {
    sim_state *s = ctx;
    for (int id = 0; id < MEMSYS_ENGINES; id++) engine_cut_span(s, id);
    engine_kick(s, engine);
}

/* A chunk of engine `id` finished at s->now_ns. */
static void engine_chunk_done(sim_state *s, int id) {
    sim_engine *e = &s->eng[id];
    MOESIM_ASSERT(e->busy && e->t_end_ns == s->now_ns);
    e->busy = false;
    e->busy_ns += e->t_end_ns - e->t_start_ns;
    memsys_xfer done;
    bool complete = memsys_chunk_done(&s->ms, &e->chunk, &done);
    if (complete) engine_close_segment(s, e);
    engine_kick(s, id);
    if (complete) memsys_deliver(&s->ms, &done, s->now_ns);
}

/* Delivers every event at or before t_ns, in (time, seq) order. */
static void sim_advance_to(sim_state *s, uint64_t t_ns) {
    sim_event ev;
    while (sim_event_peek(&s->q, &ev) && ev.t_ns <= t_ns) {
        sim_event_pop(&s->q, &ev);
        s->now_ns = ev.t_ns;
        MOESIM_ASSERT(ev.kind == EV_CHUNK && ev.arg < MEMSYS_ENGINES);
        engine_chunk_done(s, (int)ev.arg);
    }
    s->now_ns = t_ns;
}

/* Delivers the next event (the stream is blocked); returns its time. */
static uint64_t sim_deliver_next(sim_state *s) {
    sim_event ev;
    bool any = sim_event_pop(&s->q, &ev);
    MOESIM_ASSERT(any); /* a part is LOADING, so its transfer has an event coming */
    s->now_ns = ev.t_ns;
    engine_chunk_done(s, (int)ev.arg);
    return ev.t_ns;
}

/* The compute stream waits from *t until the next copy event: the wait is stall time. */
static void stream_stall_until_next(sim_state *s, uint64_t *t, const char *name) {
    uint64_t te = sim_deliver_next(s);
    if (te <= *t) return;
    s->stall_ns += te - *t;
    if (s->tl.on) sim_timeline_slice(&s->tl, SIM_TRACK_COMPUTE, "stall", name, *t, te);
    *t = te;
}

/* ---- the schedule ---- */

/* The schedule's size (sim/schedule.h: the same schedule the replay runs) from one pass over
 * its steps: step count, largest step, KV peak; then the per-step and per-request arrays the
 * run fills in. */
static void schedule_plan(sim_state *s) {
    if (s->stream) {
        s->rq = trace_stream_requests(s->stream);
    } else {
        trace_request_index_build(&s->rq_own, s->tr);
        s->rq = &s->rq_own;
    }
    sim_schedule_iter it;
    sim_schedule_iter_init(&it, s->rq, s->set.batch_size, model_kv_bytes_per_token(s->model),
                           model_recurrent_state_bytes(s->model));
    sim_schedule_step sd;
    uint64_t kv;
    uint32_t max_tokens = 0;
    while (sim_schedule_next(&it, &sd, &kv, NULL, NULL, NULL)) {
        if (kv > s->kv_peak_bytes) s->kv_peak_bytes = kv;
        if (sd.n_tokens > max_tokens) max_tokens = sd.n_tokens;
    }
    s->n_steps = it.step;
    sim_schedule_iter_free(&it);
    s->max_step_tokens = max_tokens ? max_tokens : 1;
    size_t MT = s->max_step_tokens, R = s->rq->n_requests ? s->rq->n_requests : 1;
    s->step_tok = arena_calloc(&s->mem, MT, sizeof *s->step_tok);
    s->step_emit = arena_calloc(&s->mem, MT, sizeof *s->step_emit);
    s->step_req = arena_calloc(&s->mem, MT, sizeof *s->step_req);
    s->step_pos = arena_calloc(&s->mem, MT, sizeof *s->step_pos);
    s->req_t_admit = arena_calloc(&s->mem, R, sizeof *s->req_t_admit);
    s->req_t_first = arena_calloc(&s->mem, R, sizeof *s->req_t_first);
    s->req_t_last = arena_calloc(&s->mem, R, sizeof *s->req_t_last);
}

/* ---- setup ---- */

static uint64_t expert_bytes_at(const sim_state *s, uint32_t p) {
    return s->part_bytes[p][0] + s->part_bytes[p][1] + s->part_bytes[p][2];
}

/* Host placement (memsys_place_for_policy); routes are sized by the widest precision the policy
 * loads. */
static void place_experts(sim_state *s, bool policy_only) {
    uint64_t dram = s->cost.hw.dram_bytes;
    uint64_t bounce = s->cost.hw.gpu_direct_storage ? 0 : s->ms.cfg.bounce_bytes;
    uint64_t widest = memsys_place_for_policy(&s->ms, s->pm, s->pol, s->prec, policy_only,
                                              dram > bounce ? dram - bounce : 0);
    s->route_expert_bytes = widest;
    if (!s->ms.cfg.per_layer) s->route_capacity = sim_budget_route_capacity(s->expert_budget_bytes,
                                                                            widest, s->K, s->E);
}

static moesim_status check_geometry(const sim_inputs *in, moesim_error *err) {
    const trace_meta *tm = &in->trace->meta;
    const model_geometry *m = in->model;
    if (tm->n_layers != m->n_moe_layers || tm->n_experts != m->n_experts || tm->top_k != m->top_k)
        return moesim_fail(err, MOESIM_EINPUT,
                           "trace (model '%s': %u MoE layers, %u experts, top-%u) does not match "
                           "model '%s' (%u MoE layers, %u experts, top-%u)",
                           tm->model, tm->n_layers, tm->n_experts, tm->top_k, m->name,
                           m->n_moe_layers, m->n_experts, m->top_k);
    if (in->trace->n_tokens == 0)
        return moesim_fail(err, MOESIM_EINPUT, "trace has no tokens: nothing to simulate");
    if (in->trace->n_tokens >= UINT32_MAX)
        return moesim_fail(err, MOESIM_EINPUT, "trace has %" PRIu64 " tokens; at most %u",
                           in->trace->n_tokens, UINT32_MAX - 1);
    return MOESIM_OK;
}

/* ---- per-route work ---- */

/* Gate/up and down op times of an expert at precision p for `tok` tokens (cached). */
static void expert_cost(sim_state *s, moesim_precision p, uint32_t tok, uint64_t *gu,
                        uint64_t *dn) {
    if (tok < SIM_ECOST_TOKENS) {
        uint64_t *c = s->ecost_ns[p][tok];
        if (!c[0] && !c[1]) {
            c[0] = cost_expert_gate_up_ns(&s->cost, p, tok);
            c[1] = cost_expert_down_ns(&s->cost, p, tok);
        }
        *gu = c[0];
        *dn = c[1];
        return;
    }
    *gu = cost_expert_gate_up_ns(&s->cost, p, tok);
    *dn = cost_expert_down_ns(&s->cost, p, tok);
}

/* Runs one op of `dur_ns` on the compute stream at *t. */
static void stream_op(sim_state *s, uint64_t *t, uint64_t dur_ns, const char *cat,
                      const char *name) {
    if (s->tl.on && dur_ns)
        sim_timeline_slice(&s->tl, SIM_TRACK_COMPUTE, cat, name, *t, *t + dur_ns);
    *t += dur_ns;
}

/* Blocks the stream until every part in `mask` of (layer, expert, p) is resident. */
static void stream_wait_parts(sim_state *s, uint64_t *t, uint32_t layer, uint32_t expert,
                              moesim_precision p, uint32_t mask) {
    const uint8_t *st = s->ms.state + idx_lep(s, layer, expert, p) * PART_COUNT; /* [PART_COUNT] */
    sim_advance_to(s, *t);
    char name[64];
    name[0] = '\0';
    for (;;) {
        /* the parts of `mask` not yet resident, as a mask (this test runs twice per expert op) */
        uint32_t waiting = 0;
        for (int part = 0; part < PART_COUNT; part++)
            waiting |= (uint32_t)(st[part] != POLICY_RESIDENT) << part;
        waiting &= mask;
        if (!waiting) break;
        for (int part = 0; part < PART_COUNT; part++)
            MOESIM_ASSERT(!(waiting & (1u << part)) || st[part] == POLICY_LOADING);
        if (s->tl.on && !name[0]) snprintf(name, sizeof name, "stall L%u e%u", layer, expert);
        stream_stall_until_next(s, t, name);
    }
    s->now_ns = *t;
    if (s->hooks && s->hooks->on_expert_start)
        s->hooks->on_expert_start(s->hooks->ctx, s->view, layer, expert, p, mask, *t);
}

/* Before a route is planned, its pool must have room for the route's experts once everything
 * the policy may evict is evicted: copies already started for other experts cannot be, so the
 * stream waits for them to land (what an engine does when a DMA it cannot recall holds the
 * room). Without this wait a demand load would be refused and become a skip. */
static void stream_wait_room(sim_state *s, uint64_t *t, uint32_t layer, uint32_t n_active) {
    uint64_t cap = s->pool_cap;
    uint64_t need = (uint64_t)n_active * s->route_expert_bytes;
    if (need > cap) need = cap;
    uint64_t used = s->ms.pool_used[s->ms.cfg.per_layer ? layer : 0];
    if (used + need <= cap) return; /* nothing in flight can be in the way */
    while (memsys_unevictable_bytes(&s->ms, layer) + need > cap)
        stream_stall_until_next(s, t, "stall: room");
    s->now_ns = *t;
}

/* One (sub-)route: tokens [i0, i1) of the step (their routing already gathered in r_*). */
/* Issue sequence of the copy loading part `part_index` of the current layer (the callback of
 * sim_route_execution_order; the layer is the one being routed). */
static uint64_t loading_seq(const void *host, size_t part_index) {
    const sim_state *s = host;
    size_t layer_parts = (size_t)s->ms.cur_layer * s->E * s->P * PART_COUNT;
    return memsys_loading_seq(&s->ms, layer_parts + part_index);
}

/* The simulator's clock as sim_route_decide reads it (ctx: the stream's time). */
static uint64_t virtual_now(const void *t) { return *(const uint64_t *)t; }

static void run_route(sim_state *s, uint64_t *t, uint64_t step, uint32_t layer, uint32_t i0,
                      uint32_t i1, bool first_of_layer, bool last_of_layer) {
    const uint32_t K = s->K;
    uint32_t n = i1 - i0;
    const uint16_t *ex = s->r_experts + (size_t)i0 * K;
    const float *gs = s->r_gates + (size_t)i0 * K;
    sim_route_scratch rs = {
        .stamp = s->stamp,
        .stamp_gen = &s->stamp_gen,
        .active = s->active,
        .slot = s->slot,
        .active_tokens = s->active_tokens,
        .active_gate = s->active_gate,
        .plan = s->plan,
    };
    uint32_t n_active = sim_route_active_build(&rs, ex, gs, n * K);
    if (first_of_layer)
        sim_route_prefetch_account(&rs, n_active, s->r_experts, s->step_n * K,
                                   s->ms.pf_mark + (size_t)layer * s->E, s->E,
                                   &s->ms.pf_count[layer], &s->pf_hit, &s->pf_active,
                                   &s->pf_issued_sets);

    sim_advance_to(s, *t);
    stream_wait_room(s, t, layer, n_active);
    sim_route_host h = {
        .pm = s->pm, .pol = s->pol, .ms = &s->ms, .quant = &s->cost.quant, .precision = s->prec,
        .now_ns = virtual_now, .clock_ctx = t,
        .experts = s->r_experts, .gates = s->r_gates, .importance = s->r_importance,
        .la_ids = s->r_la_ids, .la_scores = s->r_la_scores,
        .top_k = K, .la_depth = s->la_depth, .la_k = s->la_k,
        .tally = &s->tally, .sub_routes = &s->sub_routes,
    };
    sim_route_decide(&h, &rs, step, layer, i0, i1, n_active, last_of_layer);
    const size_t layer_parts = (size_t)layer * s->E * s->P * PART_COUNT;

    /* execution order: resident experts first, then by the order their copies were issued */
    uint32_t n_run = sim_route_execution_order(&rs, n_active, s->ms.state + layer_parts, s->P,
                                               loading_seq, s, s->order, s->order_key);
    char name[80];
    for (uint32_t r = 0; r < n_run; r++) {
        uint32_t a = s->order[r];
        uint16_t e = s->active[a];
        moesim_precision pr = (moesim_precision)s->plan[a];
        uint32_t tok = s->active_tokens[a];
        uint64_t gu, dn;
        expert_cost(s, pr, tok, &gu, &dn);
        if (s->set.part_overlap) {
            stream_wait_parts(s, t, layer, e, pr, 1u << PART_GATE | 1u << PART_UP);
            if (s->tl.on)
                snprintf(name, sizeof name, "L%u e%u gate_up %s x%u", layer, e, precision_name(pr),
                         tok);
            stream_op(s, t, gu, "expert", name);
            stream_wait_parts(s, t, layer, e, pr, 1u << PART_DOWN);
            if (s->tl.on)
                snprintf(name, sizeof name, "L%u e%u down %s x%u", layer, e, precision_name(pr),
                         tok);
            stream_op(s, t, dn, "expert", name);
        } else {
            stream_wait_parts(s, t, layer, e, pr, POLICY_PARTS_ALL);
            if (s->tl.on)
                snprintf(name, sizeof name, "L%u e%u %s x%u", layer, e, precision_name(pr), tok);
            stream_op(s, t, gu + dn, "expert", name);
        }
        s->expert_ops++;
        memsys_unpin(&s->ms, layer, e, pr);
    }
}

/* Gathers the step's routing (and look-ahead) for `layer` into the r_* buffers; with recorded
 * look-ahead, counts its top-1 hits at distance 1 (every (token, layer) is gathered once). */
static void gather_route(sim_state *s, uint32_t layer) {
    uint32_t K = s->K;
    size_t DK = s->la_unread ? 0 : (size_t)s->la_depth * s->la_k;
    for (uint32_t i = 0; i < s->step_n; i++) {
        uint32_t tok = s->step_tok[i];
        uint64_t at;
        const trace *t = row_of(s, tok, &at);
        memcpy(s->r_experts + (size_t)i * K, trace_experts(t, at, layer), K * sizeof(uint16_t));
        memcpy(s->r_gates + (size_t)i * K, trace_gates(t, at, layer), K * sizeof(float));
        if (s->r_importance) s->r_importance[i] = t->importance[(size_t)at * s->L + layer];
        if (!DK) continue;
        if (s->la_emulated) {
            sim_lookahead_emulate_rows(trace_experts(t, at, 0), trace_gates(t, at, 0), s->L, s->E,
                                       s->K, s->la_depth, s->la_k, s->set.seed,
                                       s->set.predictor_accuracy, tok, layer,
                                       s->r_la_ids + i * DK, s->r_la_scores + i * DK);
        } else {
            size_t src = trace_lookahead_index(t, at, layer, 1);
            memcpy(s->r_la_ids + i * DK, t->lookahead_ids + src, DK * sizeof(uint16_t));
            memcpy(s->r_la_scores + i * DK, t->lookahead_scores + src, DK * sizeof(float));
            if (layer + 1 < s->L) {
                uint16_t want = trace_experts(t, at, layer + 1)[0];
                if (want != TRACE_NO_EXPERT) {
                    s->la_right += t->lookahead_ids[src] == want;
                    s->la_total++;
                }
            }
        }
    }
}

/* Splits the step's tokens into sub-routes whose distinct experts fit one pool
 * (route_capacity), in token order, and runs them one after the other. */
static void run_layer(sim_state *s, uint64_t *t, uint64_t step, uint32_t layer) {
    uint32_t n = s->step_n, K = s->K;
    gather_route(s, layer);
    memsys_begin_layer(&s->ms);
    sim_route_scratch rs = {.stamp = s->stamp, .stamp_gen = &s->stamp_gen};
    uint32_t i0 = 0;
    bool first = true;
    while (i0 < n) {
        uint32_t i1 = sim_route_split(&rs, s->r_experts, K, i0, n, s->route_capacity);
        run_route(s, t, step, layer, i0, i1, first, i1 == n);
        for (uint32_t i = i0 * K; i < i1 * K; i++)
            s->ms.access_pos += s->r_experts[i] != TRACE_NO_EXPERT;
        first = false;
        i0 = i1;
    }
}

/* ---- metrics ---- */

static void fill_result(sim_state *s, sim_result *r, uint64_t makespan_ns) {
    const trace *t = s->tr;
    uint32_t R = t->n_requests;
    sim_result_set_request_latency(r, R, s->req_t_admit, s->req_t_first, s->req_t_last,
                                   s->it.req_steps, s->hooks);
    sim_result_fill(r, &(sim_result_totals){
        .tokens = t->n_tokens, .requests = R, .steps = s->n_steps, .makespan_ns = makespan_ns,
        .tally = &s->tally, .moved = &s->ms.n,
        .pf_hit = s->pf_hit, .pf_active = s->pf_active, .pf_issued_sets = s->pf_issued_sets,
        .expert_ops = s->expert_ops, .sub_routes = s->sub_routes, .stall_ns = s->stall_ns,
        .h2d_busy_ns = s->eng[MEMSYS_H2D].busy_ns, .ssd_busy_ns = s->eng[MEMSYS_SSD].busy_ns,
        .budget_bytes = s->budget_bytes, .expert_budget_bytes = s->expert_budget_bytes,
        .kv_peak_bytes = s->kv_peak_bytes, .placement_refusals = s->blocks.refusals,
        .predictor_emulated = s->la_emulated,
        .predictor_accuracy = s->la_emulated ? s->set.predictor_accuracy
                              : s->la_total ? (double)s->la_right / (double)s->la_total
                                            : 0,
        .pm = s->pm, .pol = s->pol});
    r->d2h_bytes = 0;
    r->peak_hbm_bytes = s->peak_hbm;
    r->cost_extrapolated = s->cost_extrapolated;
    r->sim_memory_bytes =
        s->mem.used_bytes + memsys_memory_bytes(&s->ms) + s->q.cap * sizeof(sim_event);
}

/* ---- the run ---- */

static moesim_status sim_setup(sim_state *s, const sim_inputs *in, const char *policy_name,
                               config *settings, moesim_error *err) {
    moesim_status st;
    if ((st = check_geometry(in, err))) return st;
    s->pm = in->policy ? in->policy : policy_lookup(policy_name);
    if (!s->pm)
        return moesim_fail(err, MOESIM_EINPUT, "unknown policy '%s' (known: %s)", policy_name,
                           policy_names());
    if (s->pm->api_version != POLICY_API_VERSION)
        return moesim_fail(err, MOESIM_EINPUT, "policy '%s' has API version %d, expected %d",
                           policy_name, s->pm->api_version, POLICY_API_VERSION);
    if ((st = config_read_fields(settings, sim_fields, MOESIM_ARRAY_LEN(sim_fields), &s->set, err)))
        return st;
    void *knobs = NULL;
    if ((st = policy_read_knobs(s->pm, settings, &knobs, err))) return st;
    if ((st = config_check_unused(settings, err))) {
        free(knobs);
        return st;
    }
    s->knobs = knobs;

    const trace *t = in->trace;
    s->tr = t;
    s->stream = in->stream;
    s->model = in->model;
    s->hooks = in->hooks;
    s->L = t->meta.n_layers;
    s->E = t->meta.n_experts;
    s->K = t->meta.top_k;
    s->P = PREC_COUNT;
    s->prec = (moesim_precision)s->set.precision;
    cost_model_init(&s->cost, in->hw, in->model, in->quant);
    if (s->set.cost_table[0] && (st = cost_table_load(&s->cost, s->set.cost_table, err))) return st;
    bool stored[PREC_COUNT], policy_only;
    if ((st = memsys_parse_host_precisions(s->set.host_precisions, stored, &policy_only, err)))
        return st;
    if (!in->hw->gpu_direct_storage && s->set.bounce_mib * 1024 < s->set.chunk_kib)
        return moesim_fail(err, MOESIM_EINPUT,
                           "[sim] bounce_mib = %" PRIu64 ": expected at least one copy chunk "
                           "(sim.chunk_kib = %" PRIu64 ")",
                           s->set.bounce_mib, s->set.chunk_kib);
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT; part++)
            s->part_bytes[p][part] =
                stored[p] ? model_expert_part_bytes(in->model, in->quant, (expert_part)part,
                                                    (moesim_precision)p)
                          : 0;

    arena_init(&s->mem, 1u << 20);
    schedule_plan(s);
    if (s->stream) {
        /* a step visits the blocks of up to batch.size requests, or of one long prompt */
        uint64_t bt = trace_stream_block_tokens(s->stream);
        trace_stream_set_cache(s->stream, 0,
                               (uint32_t)(s->set.batch_size + s->max_step_tokens / bt + 2));
    }

    if (s->cost.has_table) { /* which measured curves this run's steps reach beyond */
        uint64_t max_attended = 1;
        sim_schedule_iter it;
        sim_schedule_iter_init(&it, s->rq, s->set.batch_size, 0, 0);
        sim_schedule_step sd;
        uint64_t kv;
        while (sim_schedule_next(&it, &sd, &kv, s->step_tok, NULL, NULL)) {
            uint64_t a = 0;
            for (uint32_t i = 0; i < sd.n_tokens; i++) {
                uint64_t at;
                a += (uint64_t)row_of(s, s->step_tok[i], &at)->position[at] + 1;
            }
            if (a > max_attended) max_attended = a;
        }
        sim_schedule_iter_free(&it);
        for (int op = 0; op < COST_OP_COUNT; op++)
            for (int p = 0; p < PREC_COUNT; p++) {
                if (p != PREC_BF16 && op != COST_EXPERT_GATE_UP && op != COST_EXPERT_DOWN) continue;
                double hi =
                    op == COST_ATTENTION ? (double)max_attended : (double)s->max_step_tokens;
                s->cost_extrapolated +=
                    !cost_table_covers(&s->cost, (cost_op)op, (moesim_precision)p, 1, hi);
            }
    }

    /* where the memory settings came from, for messages: "file:line", "--set", or the profile */
    char bwhere[640], cwhere[640];
    if (config_get(settings, "memory", "budget_gb"))
        config_origin(settings, "memory", "budget_gb", bwhere, sizeof bwhere);
    else
        snprintf(bwhere, sizeof bwhere, "hardware profile %s (hbm_gib)", in->hw->name);
    config_origin(settings, "cache", "experts_per_layer", cwhere, sizeof cwhere);

    /* HBM: non-expert weights, KV peak and activations first; experts get the rest */
    sim_budget bud;
    if ((st = sim_budget_plan(in->model, in->quant, in->hw, &s->set, s->max_step_tokens,
                              s->kv_peak_bytes, bwhere, cwhere, &bud, err)))
        return st;
    s->budget_bytes = bud.budget_bytes;
    s->non_expert_bytes = bud.non_expert_bytes;
    s->act_bytes = bud.act_bytes;
    s->expert_budget_bytes = bud.expert_budget_bytes;
    s->pool_cap = bud.pool_cap_bytes;
    s->route_capacity = bud.route_capacity;
    s->route_expert_bytes = expert_bytes_at(s, s->prec);

    memsys_config mc = {
        .n_layers = s->L,
        .n_experts = s->E,
        .per_layer = bud.per_layer,
        .pool_cap_bytes = bud.pool_cap_bytes,
        .chunk_bytes = s->set.chunk_kib * 1024,
        .bounce_bytes = s->set.bounce_mib * 1024 * 1024,
        .gpu_direct_storage = in->hw->gpu_direct_storage,
    };
    memcpy(mc.part_bytes, s->part_bytes, sizeof mc.part_bytes);
    memsys_host mh = {.ctx = s, .on_work = on_work, .on_hbm = on_hbm};
    if (s->set.block_pools) {
        mh.reserve = on_reserve;
        mh.release = on_release;
        uint64_t block_bytes[PREC_COUNT];
        block_pool_block_bytes(s->part_bytes, block_bytes);
        block_pool_init(&s->blocks,
                        block_pool_arena_bytes(bud.per_layer, bud.pool_cap_bytes, s->L,
                                               bud.expert_budget_bytes),
                        block_bytes, (size_t)s->L * s->E * PREC_COUNT * PART_COUNT);
    }
    memsys_init(&s->ms, &mc, &mh);
    s->ms_live = true;
    sim_future_init_requests(&s->future, &t->meta, s->rq, s->set.batch_size, s->max_step_tokens,
                             row_of, s);
    s->ms.future = &s->future;

    /* look-ahead */
    if (t->meta.lookahead_depth) {
        s->la_depth = t->meta.lookahead_depth;
        s->la_k = t->meta.lookahead_k;
        if (s->stream && !trace_stream_rows_meta(s->stream)->lookahead_depth) {
            MOESIM_ASSERT(s->pm->ignores_lookahead); /* sim_stream_options skips only then */
            s->la_unread = true;
            trace_stream_lookahead_first_hits(s->stream, &s->la_right, &s->la_total);
        }
    } else {
        s->la_depth = s->set.predictor_depth;
        s->la_k = s->la_depth ? s->K : 0;
        s->la_emulated = s->la_depth > 0;
        /* building them is a few % of a run of a policy that ignores them */
        s->la_unread = s->la_emulated && s->pm->ignores_lookahead;
    }
    size_t MT = s->max_step_tokens;
    s->r_experts = arena_calloc(&s->mem, MT * s->K, sizeof(uint16_t));
    s->r_gates = arena_calloc(&s->mem, MT * s->K, sizeof(float));
    if (t->meta.has_importance) s->r_importance = arena_calloc(&s->mem, MT, sizeof(float));
    if (s->la_depth && !s->la_unread) {
        s->r_la_ids = arena_calloc(&s->mem, MT * s->la_depth * s->la_k, sizeof(uint16_t));
        s->r_la_scores = arena_calloc(&s->mem, MT * s->la_depth * s->la_k, sizeof(float));
    }
    s->active = arena_calloc(&s->mem, s->E, sizeof(uint16_t));
    s->active_tokens = arena_calloc(&s->mem, s->E, sizeof(uint32_t));
    s->active_gate = arena_calloc(&s->mem, s->E, sizeof(float));
    s->plan = arena_calloc(&s->mem, s->E, 1);
    s->stamp = arena_calloc(&s->mem, s->E, sizeof(uint32_t));
    s->slot = arena_calloc(&s->mem, s->E, sizeof(uint32_t));
    s->order = arena_calloc(&s->mem, s->E, sizeof(uint32_t));
    s->order_key = arena_calloc(&s->mem, s->E, sizeof(uint64_t));

    /* engines */
    sim_engine *h = &s->eng[MEMSYS_H2D], *d = &s->eng[MEMSYS_SSD];
    h->bytes_per_s = in->hw->h2d_bytes_per_s;
    h->latency_ns = in->hw->h2d_latency_ns;
    h->latency_per_chunk = in->hw->h2d_latency_per_chunk;
    h->track = SIM_TRACK_H2D;
    d->bytes_per_s = in->hw->ssd_read_bytes_per_s;
    d->latency_ns = in->hw->ssd_latency_ns;
    d->track = SIM_TRACK_SSD;
    uint64_t widest = 0; /* the longest transfer: one expert at its widest stored precision */
    for (uint32_t p = 0; p < PREC_COUNT; p++)
        if (expert_bytes_at(s, p) > widest) widest = expert_bytes_at(s, p);
    for (int i = 0; i < MEMSYS_ENGINES; i++) {
        sim_engine *e = &s->eng[i];
        e->seg_xfer = NONE;
        if (!(e->bytes_per_s > 0)) continue; /* an engine the profile lacks copies nothing */
        /* a span is cut at the first chunk ending after the cut: that needs every chunk to take
         * time (at least 1 ns: a chunk's exact time of 2 ns or more, whatever the rounding) */
        e->spans = (double)mc.chunk_bytes * 1e9 / e->bytes_per_s >= 2;
        if (mc.chunk_bytes & (mc.chunk_bytes - 1)) continue; /* not a power of two: no table */
        e->chunk_shift = (unsigned)__builtin_ctzll(mc.chunk_bytes);
        e->n_at_chunk = widest / mc.chunk_bytes + 2;
        e->ns_at_chunk = arena_calloc(&s->mem, e->n_at_chunk, sizeof *e->ns_at_chunk);
        for (uint64_t k = 0; k < e->n_at_chunk; k++)
            e->ns_at_chunk[k] = cost_transfer_ns(k * mc.chunk_bytes, e->bytes_per_s);
    }
    sim_event_queue_init(&s->q, 64);
    s->queue_live = true;
    s->view = (policy_mem_view){.ops = &memsys_ops, .mem = &s->ms};

    if (in->timeline_path &&
        (st = sim_timeline_open(&s->tl, in->timeline_path, &in->timeline_window, err)))
        return st;

    policy_params params = {
        .model = in->model,
        .n_layers = s->L,
        .n_experts = s->E,
        .top_k = s->K,
        .expert_budget_bytes = bud.per_layer ? s->pool_cap * s->L : s->expert_budget_bytes,
        .experts_per_layer = bud.per_layer ? s->set.experts_per_layer : 0,
        .precision = s->prec,
        .batch_size = s->set.batch_size,
        .lookahead_depth = s->la_depth,
        .lookahead_k = s->la_k,
        .lookahead_emulated = s->la_emulated,
        .seed = s->set.seed,
    };
    memcpy(params.part_bytes, s->part_bytes, sizeof params.part_bytes);
    s->params = params;
    if ((st = s->pm->create(&s->params, knobs, s->view, &s->pol, err))) {
        moesim_error_prefix(err, "policy '%s'", s->pm->name);
        return st;
    }
    memsys_attach_policy(&s->ms, s->pm, s->pol);
    place_experts(s, policy_only);
    return MOESIM_OK;
}

static void sim_teardown(sim_state *s) {
    if (s->pm && s->pol) s->pm->destroy(s->pol);
    free(s->knobs);
    if (s->queue_live) sim_event_queue_free(&s->q);
    if (s->ms_live) memsys_free(&s->ms);
    block_pool_free(&s->blocks);
    sim_future_free(&s->future);
    sim_timeline_abort(&s->tl);
    sim_schedule_iter_free(&s->it);
    trace_request_index_free(&s->rq_own);
    arena_free(&s->mem);
}

static void sim_loop(sim_state *s) {
    uint64_t t = 0;
    const model_geometry *m = s->model;
    s->kv_bytes = 0;
    hbm_note(s);
    s->now_ns = 0;
    memsys_warmup_begin(&s->ms);
    if (s->pm->warmup) s->pm->warmup(s->pol, 0);
    memsys_warmup_end(&s->ms);
    char name[64];
    sim_schedule_iter_init(&s->it, s->rq, s->set.batch_size, model_kv_bytes_per_token(s->model),
                           model_recurrent_state_bytes(s->model));
    sim_schedule_step step;
    const sim_schedule_step *sd = &step;
    uint64_t step_kv;
    for (uint64_t st = 0;
         sim_schedule_next(&s->it, &step, &step_kv, s->step_tok, s->step_req, s->step_emit);
         st++) {
        s->step_n = sd->n_tokens;
        sim_timeline_step(&s->tl, st, t);
        sim_advance_to(s, t);
        for (uint32_t a = 0; a < s->it.n_admitted; a++) s->req_t_admit[s->it.admitted[a]] = t;
        s->kv_bytes = step_kv;
        hbm_note(s);
        policy_step ps = {.index = st,
                          .now_ns = t,
                          .n_tokens = sd->n_tokens,
                          .is_prefill = sd->is_prefill,
                          .request = s->step_req,
                          .position = s->step_pos};
        uint64_t attended = 0;
        uint32_t n_emit = 0;
        for (uint32_t i = 0; i < sd->n_tokens; i++) {
            uint64_t at;
            s->step_pos[i] = row_of(s, s->step_tok[i], &at)->position[at];
            attended += (uint64_t)s->step_pos[i] + 1;
            n_emit += s->step_emit[i];
        }
        s->ms.cur_step = st;
        s->ms.cur_layer = -1;
        if (s->pm->begin_step) s->pm->begin_step(s->pol, &ps);
        uint64_t attn_ns = cost_attention_ns(&s->cost, sd->n_tokens, attended);
        uint32_t moe = 0;
        for (uint32_t ml = 0; ml < m->n_layers; ml++) {
            if (s->tl.on) snprintf(name, sizeof name, "L%u attention", ml);
            stream_op(s, &t, attn_ns, "attention", name);
            if (!m->is_moe_layer[ml]) {
                if (s->tl.on) snprintf(name, sizeof name, "L%u dense ffn", ml);
                stream_op(s, &t, cost_dense_ffn_ns(&s->cost, sd->n_tokens), "ffn", name);
                continue;
            }
            if (s->tl.on) snprintf(name, sizeof name, "L%u router", moe);
            uint64_t layer_t0 = t;
            stream_op(s, &t, cost_router_ns(&s->cost, sd->n_tokens), "router", name);
            run_layer(s, &t, st, moe);
            if (s->hooks && s->hooks->on_layer_done)
                s->hooks->on_layer_done(s->hooks->ctx, st, moe, layer_t0, t);
            if (s->tl.on) snprintf(name, sizeof name, "L%u shared", moe);
            stream_op(s, &t, cost_shared_ns(&s->cost, sd->n_tokens), "shared", name);
            if (s->tl.on) snprintf(name, sizeof name, "L%u combine", moe);
            stream_op(s, &t, cost_combine_ns(&s->cost, sd->n_tokens), "combine", name);
            moe++;
        }
        stream_op(s, &t, cost_lm_head_ns(&s->cost, n_emit), "lm_head", "lm head");
        sim_advance_to(s, t);
        if (s->pm->end_step) s->pm->end_step(s->pol, &ps, t);
        for (uint32_t i = 0; i < sd->n_tokens; i++) { /* once per request: its last token */
            if (!s->step_emit[i]) continue;
            uint32_t r = s->step_req[i];
            if (s->it.req_first[r] == st) s->req_t_first[r] = t;
            s->req_t_last[r] = t;
        }
    }
    s->makespan_ns = t;
    /* drain: copies still in flight (prefetches nobody used) complete; nothing may be left */
    sim_event ev;
    while (sim_event_pop(&s->q, &ev)) {
        s->now_ns = ev.t_ns;
        engine_chunk_done(s, (int)ev.arg);
    }
    MOESIM_ASSERT(s->q.n == 0);
    for (int i = 0; i < MEMSYS_ENGINES; i++) {
        MOESIM_ASSERT(!s->eng[i].busy);
        for (int c = 0; c < MEMSYS_CLASSES; c++) MOESIM_ASSERT(s->ms.head[i][c] == NONE);
    }
    memsys_finish(&s->ms);
}

trace_stream_options sim_stream_options(const char *policy_name) {
    const policy_methods *pm = policy_lookup(policy_name);
    return (trace_stream_options){.skip_lookahead = pm && pm->ignores_lookahead};
}

moesim_status sim_run(const sim_inputs *in, const char *policy_name, config *settings,
                      sim_result *out, moesim_error *err) {
    MOESIM_ASSERT(in && in->trace && in->model && in->hw && in->quant && policy_name && out);
    memset(out, 0, sizeof *out);
    sim_state *s = moesim_xcalloc(1, sizeof *s);
    moesim_status st = sim_setup(s, in, policy_name, settings, err);
    if (!st) {
        sim_loop(s);
        snprintf(out->policy, sizeof out->policy, "%s", s->pm->name);
        fill_result(s, out, s->makespan_ns);
        st = sim_timeline_close(&s->tl, err);
    }
    sim_teardown(s);
    free(s);
    return st;
}
