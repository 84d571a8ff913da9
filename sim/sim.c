/* The discrete-event simulator of a GPU serving an MoE model whose experts do not all fit
 * (sim/README.md describes the model, its units and what it leaves out): the virtual-time host
 * of the one run loop (core/run_loop.h).
 *
 * Resources: one in-order compute stream, whose clock the host advances op by op by the cost
 * model's times (sim/cost.h); the copy engines (sim/copy_engine.c), whose chunk completions are
 * events. Before any action that can touch the copy engines or the policy, the host delivers
 * every queued event up to the stream's clock, in (time, seq) order (run_host_ops.sync). An
 * expert op whose parts are not resident blocks the stream: events are delivered until they
 * are, and the wait is stall time.
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
#include "core/block_pool.h"
#include "core/budget.h"
#include "core/future.h"
#include "core/memsys.h"
#include "core/result_fill.h"
#include "core/route.h"
#include "core/run_loop.h"
#include "core/schedule.h"
#include "policies/policy.h"
#include "sim/cost.h"
#include "sim/event.h"
#include "sim/sim.h"
#include "sim/sim_internal.h"

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

/* ---- the schedule ---- */

/* The schedule's size (core/schedule.h: the same schedule the replay runs) from one pass over
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
    size_t R = s->rq->n_requests ? s->rq->n_requests : 1;
    s->req_t_admit = arena_calloc(&s->mem, R, sizeof *s->req_t_admit);
    s->req_t_first = arena_calloc(&s->mem, R, sizeof *s->req_t_first);
    s->req_t_last = arena_calloc(&s->mem, R, sizeof *s->req_t_last);
}

/* ---- setup ---- */

/* Host placement (memsys_place_for_policy); routes are sized by the widest precision the policy
 * loads. */
static void place_experts(sim_state *s, bool policy_only) {
    uint64_t dram = s->cost.hw.dram_bytes;
    uint64_t bounce = s->cost.hw.gpu_direct_storage ? 0 : s->ms.cfg.bounce_bytes;
    uint64_t widest = memsys_place_for_policy(&s->ms, s->pm, s->pol, s->prec, policy_only,
                                              dram > bounce ? dram - bounce : 0);
    s->route_expert_bytes = widest;
    if (!s->ms.cfg.per_layer)
        s->route_capacity = sim_budget_route_capacity(s->expert_budget_bytes, widest, s->K, s->E);
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

/* ---- the simulator as a host of the run loop (core/run_loop.h) ---- */

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

/* Runs one op of `dur_ns` on the compute stream at its clock. */
static void stream_op(sim_state *s, uint64_t dur_ns, const char *cat, const char *name) {
    if (s->tl.on && dur_ns)
        sim_timeline_slice(&s->tl, SIM_TRACK_COMPUTE, cat, name, s->t_ns, s->t_ns + dur_ns);
    s->t_ns += dur_ns;
}

static uint64_t host_now(void *h) { return ((const sim_state *)h)->t_ns; }

static void host_step_begin(void *h, const run_step_info *si) {
    sim_state *s = h;
    sim_timeline_step(&s->tl, si->index, s->t_ns);
    sim_advance_to(s, s->t_ns);
    for (uint32_t a = 0; a < si->n_admitted; a++) s->req_t_admit[si->admitted[a]] = s->t_ns;
    s->kv_bytes = si->kv_bytes;
    sim_hbm_note(s);
    s->attn_ns = cost_attention_ns(&s->cost, si->sd->n_tokens, si->attended);
}

/* Copies that landed by the stream's clock are delivered before the host decides. */
static void host_sync(void *h) {
    sim_state *s = h;
    sim_advance_to(s, s->t_ns);
}

/* The stream waits until the next copy event: the wait is stall time. */
static bool host_wait_copy(void *h, const char *why) {
    sim_state *s = h;
    uint64_t te = sim_deliver_next(s);
    if (te <= s->t_ns) return true;
    s->stall_ns += te - s->t_ns;
    if (s->tl.on) sim_timeline_slice(&s->tl, SIM_TRACK_COMPUTE, "stall", why, s->t_ns, te);
    s->t_ns = te;
    return true;
}

static void host_stall_end(void *h) {
    sim_state *s = h;
    s->now_ns = s->t_ns;
}

/* The cost model's time of a non-attention op for `tok` tokens. */
static uint64_t op_cost_ns(const sim_state *s, run_op_kind kind, uint32_t tok) {
    switch (kind) {
    case RUN_OP_DENSE:
        return cost_dense_ffn_ns(&s->cost, tok);
    case RUN_OP_ROUTER:
        return cost_router_ns(&s->cost, tok);
    case RUN_OP_SHARED:
        return cost_shared_ns(&s->cost, tok);
    case RUN_OP_COMBINE:
        return cost_combine_ns(&s->cost, tok);
    case RUN_OP_LM_HEAD:
        return cost_lm_head_ns(&s->cost, tok);
    case RUN_OP_ATTENTION:
        break;
    }
    MOESIM_UNREACHABLE();
}

/* An op of `dur_ns` that starts at the stream's clock: slowed by the profile's
 * op_slowdown_beside_copy for as long as the host link copies beside it (the CPU kind: kernels
 * beside the copy thread's reads share the machine's cores and memory): what the link has at the
 * op's start, as the stream issues nothing while an op runs (work a copy's completion issues
 * during it is not counted). Known once the events up to the clock are delivered, which the host
 * does here only for such a profile. */
static uint64_t op_time_ns(sim_state *s, uint64_t dur_ns) {
    if (!(s->op_slowdown > 0)) return dur_ns;
    sim_advance_to(s, s->t_ns);
    return sim_beside_ns(dur_ns, sim_link_busy_ns(s), s->op_slowdown);
}

static void host_op(void *h, const run_op *op) {
    sim_state *s = h;
    uint64_t dur;
    if (op->kind == RUN_OP_ATTENTION) {
        dur = s->attn_ns;
    } else if (op->n_tokens < SIM_ECOST_TOKENS) { /* cached: four of these per layer */
        uint64_t *c = &s->opcost_ns[op->kind][op->n_tokens];
        if (!*c) *c = op_cost_ns(s, op->kind, op->n_tokens);
        dur = *c;
    } else {
        dur = op_cost_ns(s, op->kind, op->n_tokens);
    }
    if (op->kind == RUN_OP_ROUTER) s->layer_t0_ns = s->t_ns;
    stream_op(s, op_time_ns(s, dur) + s->op_issue_ns, op->cat, op->name);
}

/* The stream blocks: copy events are delivered until every part in `mask` is resident (out of
 * line: most expert ops find their parts resident). The wait is stall time; with a timeline, a
 * stall slice per delivery. */
static void wait_parts(sim_state *s, const uint8_t *st, uint32_t layer, uint32_t expert,
                       uint32_t mask) {
    if (!s->tl.on) { /* host_wait_copy per delivery, summed: times only grow */
        uint64_t te = sim_deliver_until_resident(s, st, mask);
        if (te <= s->t_ns) return;
        s->stall_ns += te - s->t_ns;
        s->t_ns = te;
        return;
    }
    for (uint32_t waiting; (waiting = sim_parts_waiting(st, mask));) {
        MOESIM_ASSERT(!memsys_parts_differ(st, waiting, POLICY_LOADING));
        char name[64];
        snprintf(name, sizeof name, "stall L%u e%u", layer, expert);
        host_wait_copy(s, name);
    }
}

/* The expert op's slice on the timeline. */
static void expert_slice(sim_state *s, uint32_t layer, uint32_t expert, moesim_precision p,
                         uint32_t tokens, uint32_t mask, uint64_t dur) {
    char name[80];
    if (mask == POLICY_PARTS_ALL)
        snprintf(name, sizeof name, "L%u e%u %s x%u", layer, expert, precision_name(p), tokens);
    else
        snprintf(name, sizeof name, "L%u e%u %s %s x%u", layer, expert,
                 mask == 1u << PART_DOWN ? "down" : "gate_up", precision_name(p), tokens);
    stream_op(s, dur, "expert", name);
}

/* The stream blocks until every part in `mask` of the expert (state `st`) is resident, then
 * runs the op for `dur_ns`, its cost model time (slowed beside copies: op_time_ns). */
static inline void expert_op(sim_state *s, const uint8_t *st, uint32_t layer, uint32_t expert,
                             moesim_precision p, uint32_t tokens, uint32_t mask, uint64_t dur_ns) {
    sim_advance_to(s, s->t_ns);
    if (memsys_parts_differ(st, mask, POLICY_RESIDENT)) wait_parts(s, st, layer, expert, mask);
    s->now_ns = s->t_ns;
    if (s->plain_expert_ops) {
        s->t_ns += dur_ns;
        return;
    }
    run_loop_expert_start(&s->loop, layer, expert, p, mask, s->t_ns);
    uint64_t dur = op_time_ns(s, dur_ns);
    if (s->tl.on)
        expert_slice(s, layer, expert, p, tokens, mask, dur);
    else
        s->t_ns += dur;
}

/* The expert's ops (run_loop_expert_masks), each once its parts are resident. */
static void host_expert(void *h, uint32_t layer, uint32_t expert, moesim_precision p,
                        uint32_t tokens, bool split) {
    sim_state *s = h;
    const uint8_t *st =
        s->ms.state + memsys_lep(&s->ms, layer, expert, p) * PART_COUNT; /* [PART_COUNT] */
    uint64_t gu, dn;
    expert_cost(s, p, tokens, &gu, &dn);
    gu += s->op_issue_ns, dn += s->op_issue_ns; /* gate+up and down: an op each */
    /* the masks' list unrolled (one op, or gate+up then down): a loop over it cost a tenth of
     * this function, which runs for every routed expert */
    const uint32_t *mask = run_loop_expert_masks(split);
    if (!split) {
        expert_op(s, st, layer, expert, p, tokens, mask[0], gu + dn);
        return;
    }
    expert_op(s, st, layer, expert, p, tokens, mask[0], gu);
    expert_op(s, st, layer, expert, p, tokens, mask[1], dn);
}

static void host_layer_end(void *h, uint64_t step, uint32_t layer) {
    sim_state *s = h;
    if (s->hooks && s->hooks->on_layer_done)
        s->hooks->on_layer_done(s->hooks->ctx, step, layer, s->layer_t0_ns, s->t_ns);
}

/* The step's requests that emitted: the first and last step ends of each. */
static void host_step_end(void *h, const run_step_info *si) {
    sim_state *s = h;
    const run_loop *rl = &s->loop;
    for (uint32_t i = 0; i < si->sd->n_tokens; i++) { /* once per request: its last token */
        if (!rl->step_emit[i]) continue;
        uint32_t r = rl->step_req[i];
        if (rl->it.req_first[r] == si->index) s->req_t_first[r] = s->t_ns;
        s->req_t_last[r] = s->t_ns;
    }
}

static void host_drain(void *h) { sim_drain(h); }

static const run_host_ops sim_host = {
    .now_ns = host_now,
    .step_begin = host_step_begin,
    .sync = host_sync,
    .wait_copy = host_wait_copy,
    .stall_end = host_stall_end,
    .op = host_op,
    .expert = host_expert,
    .layer_end = host_layer_end,
    .step_end = host_step_end,
    .drain = host_drain,
};

/* ---- metrics ---- */

static void fill_result(sim_state *s, sim_result *r, uint64_t makespan_ns) {
    const trace *t = s->tr;
    uint32_t R = t->n_requests;
    sim_result_set_request_latency(r, R, s->req_t_admit, s->req_t_first, s->req_t_last,
                                   s->loop.it.req_steps, s->hooks);
    sim_result_fill(
        r, &(sim_result_totals){.tokens = t->n_tokens,
                                .requests = R,
                                .steps = s->n_steps,
                                .makespan_ns = makespan_ns,
                                .tally = &s->loop.tally,
                                .moved = &s->ms.n,
                                .pf_hit = s->loop.pf_hit,
                                .pf_active = s->loop.pf_active,
                                .pf_issued_sets = s->loop.pf_issued_sets,
                                .expert_ops = s->loop.expert_ops,
                                .sub_routes = s->loop.sub_routes,
                                .stall_ns = s->stall_ns,
                                .h2d_busy_ns = s->eng[MEMSYS_H2D].busy_ns,
                                .ssd_busy_ns = s->eng[MEMSYS_SSD].busy_ns,
                                .budget_bytes = s->budget_bytes,
                                .expert_budget_bytes = s->expert_budget_bytes,
                                .kv_peak_bytes = s->kv_peak_bytes,
                                .placement_refusals = s->blocks.refusals,
                                .predictor_emulated = s->loop.c.la_emulated,
                                .predictor_accuracy = run_loop_predictor_accuracy(&s->loop),
                                .pm = s->pm,
                                .pol = s->pol});
    r->d2h_bytes = 0;
    r->peak_hbm_bytes = s->peak_hbm;
    r->cost_extrapolated = s->cost_extrapolated;
}

/* ---- the run ---- */

/* The policy (`table`, or `policy_name` from the registry), the settings and the policy's knobs
 * (*knobs: free()) of a run, every entry of `settings` read. */
static moesim_status read_run_settings(const policy_methods *table, const char *policy_name,
                                       config *settings, const policy_methods **pm,
                                       sim_settings *set, void **knobs, moesim_error *err) {
    *knobs = NULL;
    *pm = table ? table : policy_lookup(policy_name);
    if (!*pm)
        return moesim_fail(err, MOESIM_EINPUT, "unknown policy '%s' (known: %s)", policy_name,
                           policy_names());
    if ((*pm)->api_version != POLICY_API_VERSION)
        return moesim_fail(err, MOESIM_EINPUT, "policy '%s' has API version %d, expected %d",
                           policy_name, (*pm)->api_version, POLICY_API_VERSION);
    moesim_status st;
    if ((st = sim_settings_read(settings, set, err))) return st;
    if ((st = policy_read_knobs(*pm, settings, knobs, err))) return st;
    if ((st = config_check_unused(settings, err))) {
        free(*knobs);
        *knobs = NULL;
    }
    return st;
}

moesim_status sim_settings_check(const policy_methods *table, const char *policy_name,
                                 config *settings, moesim_error *err) {
    const policy_methods *pm;
    sim_settings set;
    void *knobs;
    moesim_status st = read_run_settings(table, policy_name, settings, &pm, &set, &knobs, err);
    free(knobs);
    return st;
}

static moesim_status sim_setup(sim_state *s, const sim_inputs *in, const char *policy_name,
                               config *settings, moesim_error *err) {
    moesim_status st;
    if ((st = check_geometry(in, err))) return st;
    void *knobs;
    if ((st = read_run_settings(in->policy, policy_name, settings, &s->pm, &s->set, &knobs, err)))
        return st;
    s->knobs = knobs;

    const trace *t = in->trace;
    s->tr = t;
    s->stream = in->stream;
    s->model = in->model;
    s->hooks = in->hooks;
    s->L = t->meta.n_layers;
    s->E = t->meta.n_experts;
    s->K = t->meta.top_k;
    s->prec = (moesim_precision)s->set.precision;
    cost_model_init(&s->cost, in->hw, in->model, in->quant);
    s->op_issue_ns = in->hw->op_issue_ns;
    s->op_slowdown = in->hw->op_slowdown_beside_copy;
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
        uint32_t *tokens = arena_calloc(&s->mem, s->max_step_tokens, sizeof *tokens);
        while (sim_schedule_next(&it, &sd, &kv, tokens, NULL, NULL)) {
            uint64_t a = 0;
            for (uint32_t i = 0; i < sd.n_tokens; i++) {
                uint64_t at;
                a += (uint64_t)row_of(s, tokens[i], &at)->position[at] + 1;
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
    s->route_expert_bytes = sim_expert_bytes_at(s, s->prec);

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
    if (in->timeline_path &&
        (st = sim_timeline_open(&s->tl, in->timeline_path, &in->timeline_window, err)))
        return st;
    memsys_host mh = sim_memsys_host(s, s->set.block_pools); /* after the timeline: its drops */
    s->plain_expert_ops =
        !(s->hooks && s->hooks->on_expert_start) && !(s->op_slowdown > 0) && !s->tl.on;
    if (s->set.block_pools) {
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
    sim_future_set_ids_stream(&s->future, s->stream);
    s->ms.future = &s->future;

    /* look-ahead: recorded, or emulated from the routing (never built for a policy that
     * ignores it: a few % of such a run) */
    uint32_t la_depth = t->meta.lookahead_depth, la_k = t->meta.lookahead_k;
    bool la_emulated = false, la_skipped = false;
    bool ignores_la = policy_ignores_lookahead(s->pm, s->knobs);
    if (la_depth && s->stream && !trace_stream_rows_meta(s->stream)->lookahead_depth) {
        MOESIM_ASSERT(ignores_la); /* sim_stream_options skips only then */
        la_skipped = true;
    } else if (la_depth && s->stream) { /* the distances and candidates the policy reads
                                           (sim_stream_options) */
        la_depth = trace_stream_rows_meta(s->stream)->lookahead_depth;
        la_k = trace_stream_rows_meta(s->stream)->lookahead_k;
    }
    s->la_skipped = la_skipped;
    if (!la_depth) {
        la_depth = s->set.predictor_depth;
        la_k = la_depth ? s->K : 0;
        la_emulated = la_depth > 0;
    }

    sim_engines_init(s, in->hw, mc.chunk_bytes);
    sim_event_queue_init(&s->q, 64);
    s->queue_live = true;
    s->view = memsys_view(&s->ms);

    policy_params params = {
        .model = in->model,
        .n_layers = s->L,
        .n_experts = s->E,
        .top_k = s->K,
        .expert_budget_bytes = bud.per_layer ? s->pool_cap * s->L : s->expert_budget_bytes,
        .experts_per_layer = bud.per_layer ? s->set.experts_per_layer : 0,
        .precision = s->prec,
        .batch_size = s->set.batch_size,
        .lookahead_depth = la_depth,
        .lookahead_k = la_k,
        .lookahead_emulated = la_emulated,
        .seed = s->set.seed,
    };
    memcpy(params.part_bytes, s->part_bytes, sizeof params.part_bytes);
    s->params = params;
    if ((st = policy_create(s->pm, &s->params, knobs, s->view, &s->pol, err))) return st;
    memsys_attach_policy(&s->ms, s->pm, s->pol);
    place_experts(s, policy_only);

    run_loop_init(&s->loop, &(run_loop_config){
                                .ops = &sim_host,
                                .host = s,
                                .pm = s->pm,
                                .pol = s->pol,
                                .ms = &s->ms,
                                .quant = &s->cost.quant,
                                .precision = s->prec,
                                .model = in->model,
                                .hooks = in->hooks,
                                .meta = &t->meta,
                                .rq = s->rq,
                                .row_of = row_of,
                                .row_ctx = s,
                                .batch_size = s->set.batch_size,
                                .max_step_tokens = s->max_step_tokens,
                                .la_depth = la_depth,
                                .la_k = la_k,
                                .la_emulated = la_emulated,
                                .la_unread = la_skipped || (la_emulated && ignores_la),
                                .la_scores_unread = !la_emulated && s->stream &&
                                                    trace_stream_scores_unread(s->stream),
                                .la_accuracy = s->set.predictor_accuracy,
                                .seed = s->set.seed,
                                .part_overlap = s->set.part_overlap,
                                .timeline = s->tl.on,
                                .mem = &s->mem,
                            });
    s->loop.pool_cap_bytes = s->pool_cap;
    s->loop.route_capacity = s->route_capacity;
    s->loop.route_expert_bytes = s->route_expert_bytes;
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
    run_loop_free(&s->loop);
    trace_request_index_free(&s->rq_own);
    arena_free(&s->mem);
}

static void sim_loop(sim_state *s) {
    s->kv_bytes = 0;
    sim_hbm_note(s);
    s->now_ns = 0;
    s->t_ns = 0;
    moesim_status st = run_loop_run(&s->loop, NULL);
    MOESIM_ASSERT(!st); /* the simulator's copies cannot fail */
    s->makespan_ns = s->t_ns;
}

/* After the run over a stream: the blocks it did not read are checked, and a bad value or
 * unreadable chunk anywhere fails the run before anything of it is reported (the stream checks
 * each block's rows as the run first reads it: trace_stream_check_rest). The skipped look-ahead
 * rows' top-1 hits are complete only then. */
static moesim_status settle_stream(sim_state *s, moesim_error *err) {
    if (!s->stream) return MOESIM_OK;
    moesim_status st = trace_stream_check_rest(s->stream, err);
    if (!st && s->la_skipped)
        trace_stream_lookahead_first_hits(s->stream, &s->loop.la_right, &s->loop.la_total);
    return st;
}

trace_stream_options sim_stream_options(const policy_methods *table, const char *policy_name,
                                        config *settings) {
    const policy_methods *pm = table ? table : policy_lookup(policy_name);
    bool skip = false;
    bool first_candidates = false;
    uint32_t candidates = 0;
    void *knobs = NULL;
    moesim_error ignored; /* bad knobs: every row is read, and sim_run reports them */
    if (pm && !policy_read_knobs(pm, settings, &knobs, &ignored)) {
        skip = policy_ignores_lookahead(pm, knobs);
        first_candidates = pm->lookahead_candidates_with != NULL;
        if (first_candidates) candidates = pm->lookahead_candidates_with(knobs);
    }
    free(knobs);
    return (trace_stream_options){.skip_lookahead = skip,
                                  .check_rows_on_read = true,
                                  .blocks_by_request = true,
                                  .lookahead_distances = pm ? pm->lookahead_distances : 0,
                                  .first_candidates_only = first_candidates,
                                  .lookahead_candidates = candidates,
                                  .skip_ranked_scores = pm && pm->lookahead_scores_rank_only};
}

moesim_status sim_run(const sim_inputs *in, const char *policy_name, config *settings,
                      sim_result *out, moesim_error *err) {
    MOESIM_ASSERT(in && in->trace && in->model && in->hw && in->quant && policy_name && out);
    memset(out, 0, sizeof *out);
    sim_state *s = moesim_xcalloc(1, sizeof *s);
    moesim_status st = sim_setup(s, in, policy_name, settings, err);
    if (!st) {
        sim_loop(s);
        st = settle_stream(s, err);
    }
    if (!st) {
        snprintf(out->policy, sizeof out->policy, "%s", s->pm->name);
        fill_result(s, out, s->makespan_ns);
        st = sim_timeline_close(&s->tl, err);
    }
    sim_teardown(s);
    free(s);
    return st;
}
