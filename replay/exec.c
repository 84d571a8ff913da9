/* The replay executor (replay/exec.h): setup, the run loop over the simulator's schedule and
 * routes, the waits of the simulator's compute stream, the checks and the result, for every
 * backend. What a backend does is named at each call; everything else here is what sim_run does,
 * through the same modules, on a real clock. */
#include "replay/exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/check.h"
#include "core/result_fill.h"
#include "replay/weights.h"

uint64_t replay_exec_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t replay_exec_now(const replay_exec *x) { return replay_exec_clock_ns() - x->t0_ns; }

/* ---- the memory system's host (memsys_host) ---- */

static void on_work(void *ctx, int engine) {
    replay_exec *x = ctx;
    x->be->copy_kick(x, engine);
}

/* The budget check, the peak the result reports, the timeline's "hbm" counter (bytes of expert
 * weights, as the simulator's). A copy thread may call this: the timeline is the run thread's. */
static void on_hbm(void *ctx, uint64_t experts_used) {
    replay_exec *x = ctx;
    MOESIM_ASSERT(experts_used <= x->bud.expert_budget_bytes);
    if (experts_used > x->experts_peak) x->experts_peak = experts_used;
    if (x->tl.on && x->clock_on && !x->lock)
        sim_timeline_hbm(&x->tl, replay_exec_now(x), experts_used, x->ms.prec_used, &x->tl_hbm);
}

static bool on_reserve(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p,
                       uint32_t parts) {
    replay_exec *x = ctx;
    return block_pool_reserve_expert(&x->pool, &x->ms, layer, expert, p, parts);
}

/* A part left the pool (evicted, or its not-started copy cancelled): no op reads its block any
 * more (the route's experts are pinned until their ops are done) and no copy writes it (a
 * started copy cannot be evicted). */
static void on_release(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p, int part) {
    replay_exec *x = ctx;
    size_t pi = block_pool_release_part(&x->pool, &x->ms, layer, expert, p, part);
    if (x->be->part_released) x->be->part_released(x, pi);
}

/* ---- ops and their times ---- */

void replay_exec_expert_name(char *buf, size_t cap, uint32_t layer, uint32_t expert,
                             moesim_precision p, uint32_t tokens, int part) {
    snprintf(buf, cap, "L%u e%u %s %s x%u", layer, expert, part == PART_DOWN ? "down" : "gate_up",
             precision_name(p), tokens);
}

void replay_exec_op_done(replay_exec *x, const char *cat, const char *name, int moe_layer,
                         const replay_op_times *t) {
    uint64_t t0 = t->t0_ns, t1 = t->t1_ns < t0 ? t0 : t->t1_ns;
    if (x->tl.on) sim_timeline_slice(&x->tl, SIM_TRACK_COMPUTE, cat, name, t0, t1);
    if (!strcmp(cat, "stall")) x->stall_ns += t1 - t0; /* the host waited for room */
    if (moe_layer >= 0) {
        if (x->layer_t0[moe_layer] == UINT64_MAX || t0 < x->layer_t0[moe_layer])
            x->layer_t0[moe_layer] = t0;
        if (t1 > x->layer_t1[moe_layer]) x->layer_t1[moe_layer] = t1;
    }
    if (t->order >= 0) { /* an expert must not start before its copy ended */
        x->order_checked++;
        x->order_violations += t->order > 0;
    }
    if (t->need_ns != REPLAY_NO_NEED && x->ops_in_step) {
        /* the stream idled from the last op until the copy landed */
        uint64_t landed = t->need_ns > t0 ? t0 : t->need_ns;
        if (landed > x->last_op_end) x->stall_ns += landed - x->last_op_end;
    }
    x->last_op_end = t1;
    x->ops_in_step++;
}

/* ---- the replay as a host of the run loop (core/run_loop.h) ---- */

static uint64_t host_now(void *h) { return replay_exec_now(h); }

static void host_lock(void *h) { replay_exec_lock(h); }

static void host_unlock(void *h) { replay_exec_unlock(h); }

static void host_warm_copy(void *h) {
    replay_exec *x = h;
    x->be->warm_copy(x);
}

static void host_clock_start(void *h) {
    replay_exec *x = h;
    x->be->clock_start(x);
    x->clock_on = true;
}

static void host_step_begin(void *h, const run_step_info *si) {
    replay_exec *x = h;
    x->be->step_begin(x, si->index);
    x->ops_in_step = 0;
    x->last_op_end = 0;
    uint64_t now = replay_exec_now(x);
    if (x->step_start)
        x->step_start[si->index] = now;
    else
        for (uint32_t a = 0; a < si->n_admitted; a++) x->req_t_admit[si->admitted[a]] = now;
    sim_timeline_step(&x->tl, si->index, now); /* the stream is idle: host and stream agree */
}

/* A backend that queues ops waits until they ran; one that runs them as they come has nothing
 * to wait for. */
static void host_sync(void *h) {
    replay_exec *x = h;
    if (x->be->wait_compute) x->be->wait_compute(x);
}

static bool host_wait_copy(void *h, const char *why) {
    (void)why;
    replay_exec *x = h;
    return x->be->wait_copy(x);
}

static void host_stall_begin(void *h, const char *name, int moe_layer) {
    replay_exec *x = h;
    x->be->op_begin(x, "stall", name, moe_layer);
}

static void host_stall_end(void *h) {
    replay_exec *x = h;
    x->be->op_end(x);
}

static void host_op(void *h, const run_op *op) {
    replay_exec *x = h;
    x->be->op_begin(x, op->cat, op->name, op->moe_layer);
    x->be->run(x, op);
    x->be->op_end(x);
}

static void host_expert(void *h, uint32_t layer, uint32_t expert, moesim_precision p,
                        uint32_t tokens, bool split) {
    replay_exec *x = h;
    for (const uint32_t *mask = run_loop_expert_masks(split); *mask; mask++) {
        x->be->expert_wait(x, layer, expert, p, *mask);
        run_loop_expert_start(&x->loop, layer, expert, p, *mask, replay_exec_now(x));
        x->be->expert(x, layer, expert, p, tokens, *mask);
    }
}

/* The step's ops have run or are enqueued: their times, then each MoE layer's span. */
static void host_step_end(void *h, const run_step_info *si) {
    replay_exec *x = h;
    uint64_t now = replay_exec_now(x);
    if (x->step_end) {
        x->step_end[si->index] = now;
    } else { /* the step's requests that emitted: the first and last step ends of each (sim's) */
        x->last_step_end_ns = now;
        for (uint32_t i = 0; i < si->sd->n_tokens; i++) {
            if (!x->loop.step_emit[i]) continue;
            uint32_t r = x->loop.step_req[i];
            if (x->loop.it.req_first[r] == si->index) x->req_t_first[r] = now;
            x->req_t_last[r] = now;
        }
    }
    x->be->step_end(x, si->index);
    for (uint32_t l = 0; l < x->L; l++) {
        if (x->layer_t0[l] != UINT64_MAX && x->hooks && x->hooks->on_layer_done)
            x->hooks->on_layer_done(x->hooks->ctx, si->index, l, x->layer_t0[l], x->layer_t1[l]);
        x->layer_t0[l] = UINT64_MAX;
        x->layer_t1[l] = 0;
    }
}

static moesim_status host_io_status(void *h, moesim_error *err) {
    replay_exec *x = h;
    return x->be->io_status ? x->be->io_status(x, err) : MOESIM_OK;
}

static void host_drain(void *h) {
    replay_exec *x = h;
    x->be->drain(x);
}

/* Two tables: a backend whose ops return once enqueued keeps a route's experts pinned until the
 * stream caught up. */
#define REPLAY_HOST_SLOTS                                                                          \
    .now_ns = host_now, .lock = host_lock, .unlock = host_unlock, .warm_copy = host_warm_copy,     \
    .clock_start = host_clock_start, .step_begin = host_step_begin, .sync = host_sync,             \
    .wait_copy = host_wait_copy, .stall_begin = host_stall_begin, .stall_end = host_stall_end,     \
    .op = host_op, .expert = host_expert, .step_end = host_step_end, .io_status = host_io_status,  \
    .drain = host_drain
static const run_host_ops replay_host = {REPLAY_HOST_SLOTS, .queues_ops = false};
static const run_host_ops replay_host_queued = {REPLAY_HOST_SLOTS, .queues_ops = true};
#undef REPLAY_HOST_SLOTS

/* Token `tok`'s rows: the whole trace, or the stream's cached block (valid until the next
 * lookup). */
static const trace *row_of(void *ctx, uint64_t tok, uint64_t *local) {
    const replay_exec *x = ctx;
    if (x->in->stream) return trace_stream_row(x->in->stream, tok, local);
    *local = tok;
    return x->tr;
}

uint32_t replay_exec_max_context(replay_exec *x) {
    uint32_t max_ctx = 1;
    for (uint64_t i = 0; i < x->tr->n_tokens; i++) {
        uint64_t at;
        uint32_t pos = row_of(x, i, &at)->position[at];
        if (pos + 1 > max_ctx) max_ctx = pos + 1;
    }
    return max_ctx;
}

/* With a stream: the schedule's sizes (step count, largest step, KV peak) from one pass over
 * its steps, as the simulator plans it; the run loop then produces the steps again. */
static void schedule_plan(replay_exec *x) {
    sim_schedule_iter it;
    sim_schedule_iter_init(&it, x->requests, x->set.batch_size, model_kv_bytes_per_token(x->m),
                           model_recurrent_state_bytes(x->m));
    sim_schedule_step sd;
    uint64_t kv;
    uint32_t max_tokens = 0;
    while (sim_schedule_next(&it, &sd, &kv, NULL, NULL, NULL)) {
        if (kv > x->sch.kv_peak_bytes) x->sch.kv_peak_bytes = kv;
        if (sd.n_tokens > max_tokens) max_tokens = sd.n_tokens;
    }
    x->sch.n_steps = it.step;
    sim_schedule_iter_free(&it);
    x->sch.max_step_tokens = max_tokens ? max_tokens : 1;
    x->sch.n_requests = x->requests->n_requests;
}

/* ---- setup ---- */

moesim_status replay_exec_host_precisions(const char *text, moesim_precision primary,
                                          bool stored[PREC_COUNT], bool *policy_only,
                                          moesim_error *err) {
    bool kernel_has[PREC_COUNT] = {false};
    kernel_has[PREC_BF16] = kernel_has[PREC_INT8] = kernel_has[PREC_INT4] = true;
    kernel_has[PREC_INT2] = true;
    if (!kernel_has[primary])
        return moesim_fail(err, MOESIM_EINPUT,
                           "expert.precision = %s: the replay's kernels have no such experts "
                           "(bf16, int8, int4, int2)",
                           precision_name(primary));
    moesim_status st = memsys_parse_host_precisions(text, stored, policy_only, err);
    if (st) return st;
    bool list = !*policy_only && strcmp(text, "all") != 0;
    for (int p = 0; p < PREC_COUNT; p++) {
        if (!stored[p] || kernel_has[p]) continue;
        if (list)
            return moesim_fail(err, MOESIM_EINPUT,
                               "sim.host_precisions: the replay's kernels have no %s experts "
                               "(replay stores bf16, int8, int4, int2)",
                               precision_name((moesim_precision)p));
        stored[p] = false;
    }
    return MOESIM_OK;
}

static moesim_status check_inputs(const replay_inputs *in, moesim_error *err) {
    const trace_meta *tm = &in->trace->meta;
    const model_geometry *m = in->model;
    if (tm->n_layers != m->n_moe_layers || tm->n_experts != m->n_experts || tm->top_k != m->top_k)
        return moesim_fail(err, MOESIM_EINPUT,
                           "trace (model '%s': %u MoE layers, %u experts, top-%u) does not match "
                           "model '%s'",
                           tm->model, tm->n_layers, tm->n_experts, tm->top_k, m->name);
    if (in->trace->n_tokens == 0)
        return moesim_fail(err, MOESIM_EINPUT, "trace has no tokens: nothing to replay");
    if (in->stream && in->trace != trace_stream_tokens(in->stream))
        return moesim_fail(err, MOESIM_EINPUT, "replay: the trace is not the stream's");
    return MOESIM_OK;
}

static moesim_status read_settings(replay_exec *x, const char *policy_name, config *settings,
                                   moesim_error *err) {
    moesim_status st;
    x->pm = x->in->policy ? x->in->policy : policy_lookup(policy_name);
    if (!x->pm)
        return moesim_fail(err, MOESIM_EINPUT, "unknown policy '%s' (known: %s)", policy_name,
                           policy_names());
    if (x->pm->api_version != POLICY_API_VERSION)
        return moesim_fail(err, MOESIM_EINPUT, "policy '%s' has API version %d, expected %d",
                           policy_name, x->pm->api_version, POLICY_API_VERSION);
    if ((st = sim_settings_read(settings, &x->set, err))) return st;
    if ((st = policy_read_knobs(x->pm, settings, &x->knobs, err))) return st;
    if ((st = config_check_unused(settings, err))) return st;
    if (x->set.cost_table[0]) { /* sim reads it; replay only checks it loads, like sim would */
        cost_model c;
        cost_model_init(&c, x->in->hw, x->in->model, x->in->quant);
        if ((st = cost_table_load(&c, x->set.cost_table, err))) return st;
    }
    return MOESIM_OK;
}

/* The budget, as sim_run splits the card (sim_budget_plan, naming where each setting came
 * from). */
static moesim_status plan_budget(replay_exec *x, config *settings, moesim_error *err) {
    char bwhere[640], cwhere[640];
    if (config_get(settings, "memory", "budget_gb"))
        config_origin(settings, "memory", "budget_gb", bwhere, sizeof bwhere);
    else
        snprintf(bwhere, sizeof bwhere, "hardware profile %s (hbm_gib)", x->in->hw->name);
    config_origin(settings, "cache", "experts_per_layer", cwhere, sizeof cwhere);
    return sim_budget_plan(x->m, x->in->quant, x->in->hw, &x->set, x->sch.max_step_tokens,
                           x->sch.kv_peak_bytes, bwhere, cwhere, &x->bud, err);
}

/* The memory system, the policy on it, and host placement (sim.c's). */
static moesim_status make_policy(replay_exec *x, moesim_error *err) {
    memsys_config mc = {
        .n_layers = x->L,
        .n_experts = x->E,
        .per_layer = x->bud.per_layer,
        .pool_cap_bytes = x->bud.pool_cap_bytes,
        .chunk_bytes = x->set.chunk_kib * 1024,
        .bounce_bytes = x->set.bounce_mib * 1024 * 1024,
        .gpu_direct_storage = false, /* SSD reads stage in DRAM (replay/README.md) */
    };
    memcpy(mc.part_bytes, x->part_bytes, sizeof mc.part_bytes);
    memsys_host mh = {.ctx = x, .on_work = on_work, .on_hbm = on_hbm, .reserve = on_reserve,
                      .release = on_release, .hbm_drops = x->in->timeline_path != NULL};
    memsys_init(&x->ms, &mc, &mh);
    x->ms_live = true;
    if (x->in->stream)
        sim_future_init_requests(&x->future, &x->tr->meta, x->requests, x->set.batch_size,
                                 x->sch.max_step_tokens, row_of, x);
    else
        sim_future_init(&x->future, x->tr, &x->sch);
    x->ms.future = &x->future;
    const trace_meta *tm = &x->tr->meta;
    bool emulated = tm->lookahead_depth == 0;
    x->la_depth = emulated ? x->set.predictor_depth : tm->lookahead_depth;
    x->la_k = emulated ? (x->la_depth ? x->K : 0) : tm->lookahead_k;
    x->la_emulated = emulated && x->la_depth > 0;
    policy_params params = {
        .model = x->m,
        .n_layers = x->L,
        .n_experts = x->E,
        .top_k = x->K,
        .expert_budget_bytes =
            x->bud.per_layer ? x->bud.pool_cap_bytes * x->L : x->bud.expert_budget_bytes,
        .experts_per_layer = x->bud.per_layer ? x->set.experts_per_layer : 0,
        .precision = x->prec,
        .batch_size = x->set.batch_size,
        .lookahead_depth = x->la_depth,
        .lookahead_k = x->la_k,
        .lookahead_emulated = x->la_emulated,
        .seed = x->set.seed,
    };
    memcpy(params.part_bytes, x->part_bytes, sizeof params.part_bytes);
    x->params = params;
    moesim_status st =
        policy_create(x->pm, &x->params, x->knobs, memsys_view(&x->ms), &x->pol, err);
    if (st) return st;
    memsys_attach_policy(&x->ms, x->pm, x->pol);
    /* routes are sized by the widest precision the policy loads */
    x->route_expert_bytes = memsys_place_for_policy(&x->ms, x->pm, x->pol, x->prec, x->policy_only,
                                                    x->be->placement_dram(x));
    x->route_capacity = x->bud.per_layer
                            ? x->bud.route_capacity
                            : sim_budget_route_capacity(x->bud.expert_budget_bytes,
                                                        x->route_expert_bytes, x->K, x->E);
    return MOESIM_OK;
}

/* The run loop over the executor (the loop's buffers come from x->mem), and the per-step and
 * per-layer clocks the executor keeps. */
static void make_loop(replay_exec *x) {
    arena_init(&x->mem, 1u << 20);
    run_loop_init(&x->loop, &(run_loop_config){
                                .ops = x->be->wait_compute ? &replay_host_queued : &replay_host,
                                .host = x,
                                .pm = x->pm,
                                .pol = x->pol,
                                .ms = &x->ms,
                                .quant = &x->quant,
                                .precision = x->prec,
                                .model = x->m,
                                .hooks = x->hooks,
                                .meta = &x->tr->meta,
                                .rq = x->requests,
                                .row_of = row_of,
                                .row_ctx = x,
                                .batch_size = x->set.batch_size,
                                .max_step_tokens = x->sch.max_step_tokens,
                                .la_depth = x->la_depth,
                                .la_k = x->la_k,
                                .la_emulated = x->la_emulated,
                                .la_accuracy = x->set.predictor_accuracy,
                                .seed = x->set.seed,
                                .part_overlap = x->set.part_overlap,
                                .timeline = x->tl.on,
                                .mem = &x->mem,
                            });
    x->loop.pool_cap_bytes = x->bud.pool_cap_bytes;
    x->loop.route_capacity = x->route_capacity;
    x->loop.route_expert_bytes = x->route_expert_bytes;
    if (x->in->stream) {
        size_t R = x->sch.n_requests ? x->sch.n_requests : 1;
        x->req_t_admit = moesim_xcalloc(R, sizeof(uint64_t));
        x->req_t_first = moesim_xcalloc(R, sizeof(uint64_t));
        x->req_t_last = moesim_xcalloc(R, sizeof(uint64_t));
    } else {
        x->step_start = moesim_xcalloc(x->sch.n_steps, sizeof(uint64_t));
        x->step_end = moesim_xcalloc(x->sch.n_steps, sizeof(uint64_t));
    }
    x->layer_t0 = moesim_xcalloc(x->L, sizeof(uint64_t));
    x->layer_t1 = moesim_xcalloc(x->L, sizeof(uint64_t));
    for (uint32_t l = 0; l < x->L; l++) x->layer_t0[l] = UINT64_MAX;
}

static moesim_status exec_setup(replay_exec *x, const char *policy_name, config *settings,
                                moesim_error *err) {
    const replay_inputs *in = x->in;
    moesim_status st;
    if ((st = check_inputs(in, err))) return st;
    x->tr = in->trace;
    x->m = in->model;
    x->hooks = in->hooks;
    x->quant = *in->quant;
    x->L = x->tr->meta.n_layers;
    x->E = x->tr->meta.n_experts;
    x->K = x->tr->meta.top_k;
    if ((st = read_settings(x, policy_name, settings, err))) return st;
    if (x->be->check && (st = x->be->check(x, err))) return st;
    x->prec = (moesim_precision)x->set.precision;
    bool stored[PREC_COUNT];
    if ((st = replay_exec_host_precisions(x->set.host_precisions, x->prec, stored, &x->policy_only,
                                          err)))
        return st;
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT && stored[p]; part++)
            x->part_bytes[p][part] =
                model_expert_part_bytes(x->m, in->quant, (expert_part)part, (moesim_precision)p);
    if (in->stream && strcmp(x->be->name, "cpu") != 0)
        return moesim_fail(err, MOESIM_EINPUT,
                           "a streamed trace is replayed by the cpu backend "
                           "only");
    if (in->stream) { /* no per-token array: the steps are produced as the run goes */
        x->requests = trace_stream_requests(in->stream);
        schedule_plan(x);
    } else {
        sim_schedule_build(&x->sch, x->tr, x->set.batch_size, model_kv_bytes_per_token(x->m),
                           model_recurrent_state_bytes(x->m));
        trace_request_index_build(&x->rq, x->tr);
        x->requests = &x->rq;
    }
    if ((st = plan_budget(x, settings, err))) return st;
    if ((st = make_policy(x, err))) return st;
    if (in->timeline_path && (st = sim_timeline_open_as(&x->tl, in->timeline_path, "moesim replay",
                                                        &in->timeline_window, err)))
        return st;
    make_loop(x);
    return x->be->setup(x, err);
}

/* ---- result, teardown ---- */

static void exec_result(replay_exec *x, sim_result *r, replay_checks *ck) {
    snprintf(r->policy, sizeof r->policy, "%s", x->pm->name);
    if (x->step_start)
        sim_result_set_latency(r, &x->sch, x->step_start, x->step_end, x->hooks);
    else
        sim_result_set_request_latency(r, x->sch.n_requests, x->req_t_admit, x->req_t_first,
                                       x->req_t_last, x->loop.it.req_steps, x->hooks);
    sim_result_fill(
        r, &(sim_result_totals){.tokens = x->tr->n_tokens,
                                .requests = x->sch.n_requests,
                                .steps = x->sch.n_steps,
                                .makespan_ns = !x->step_end     ? x->last_step_end_ns
                                               : x->sch.n_steps ? x->step_end[x->sch.n_steps - 1]
                                                                : 0,
                                .tally = &x->loop.tally,
                                .moved = &x->ms.n,
                                .pf_hit = x->loop.pf_hit,
                                .pf_active = x->loop.pf_active,
                                .pf_issued_sets = x->loop.pf_issued_sets,
                                .expert_ops = x->loop.expert_ops,
                                .sub_routes = x->loop.sub_routes,
                                .stall_ns = x->stall_ns,
                                .h2d_busy_ns = x->h2d_busy_ns,
                                .ssd_busy_ns = x->ssd_busy_ns,
                                .budget_bytes = x->bud.budget_bytes,
                                .expert_budget_bytes = x->bud.expert_budget_bytes,
                                .kv_peak_bytes = x->bud.kv_peak_bytes,
                                .placement_refusals = x->pool.refusals,
                                .predictor_emulated = x->la_emulated,
                                .predictor_accuracy = run_loop_predictor_accuracy(&x->loop),
                                .pm = x->pm,
                                .pol = x->pol});
    /* as the simulator accounts it (its KV term follows the steps; this one is the reservation) */
    r->peak_hbm_bytes =
        x->bud.non_expert_bytes + x->bud.act_bytes + x->bud.kv_peak_bytes + x->experts_peak;
    if (ck) {
        ck->device_used_before = x->device_used_before;
        ck->device_used_peak = x->device_used_peak;
        ck->device_alloc_bytes = x->device_alloc_bytes;
        ck->order_checked = x->order_checked;
        ck->order_violations = x->order_violations;
        ck->h2d_gb_per_s =
            x->h2d_busy_ns ? (double)x->h2d_copied_bytes / (double)x->h2d_busy_ns : 0;
    }
}

static void exec_teardown(replay_exec *x) {
    x->be->teardown(x);
    if (x->pm && x->pol) x->pm->destroy(x->pol);
    free(x->knobs);
    sim_timeline_abort(&x->tl);
    if (x->ms_live) memsys_free(&x->ms);
    sim_future_free(&x->future);
    block_pool_free(&x->pool);
    sim_schedule_free(&x->sch);
    run_loop_free(&x->loop);
    trace_request_index_free(&x->rq);
    arena_free(&x->mem);
    void *bufs[] = {x->step_start, x->step_end, x->req_t_admit, x->req_t_first,
                    x->req_t_last, x->layer_t0, x->layer_t1};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
}

moesim_status replay_exec_run(const replay_backend *be, const replay_inputs *in,
                              const char *policy_name, config *settings, sim_result *out,
                              replay_checks *checks, moesim_error *err) {
    MOESIM_ASSERT(be && in && in->trace && in->model && in->hw && in->quant && policy_name && out);
    memset(out, 0, sizeof *out);
    if (checks) memset(checks, 0, sizeof *checks);
    replay_exec *x = moesim_xcalloc(1, sizeof *x);
    x->in = in;
    x->be = be;
    moesim_status st = exec_setup(x, policy_name, settings, err);
    if (!st) st = run_loop_run(&x->loop, err);
    if (!st) {
        x->be->finish(x);
        exec_result(x, out, checks);
        st = sim_timeline_close(&x->tl, err);
    }
    exec_teardown(x);
    free(x);
    return st;
}
