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
#include "replay/weights.h"
#include "core/result_fill.h"

uint64_t replay_exec_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t replay_exec_now(const replay_exec *x) { return replay_exec_clock_ns() - x->t0_ns; }

static uint64_t route_clock(const void *x) { return replay_exec_now(x); }

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

static void run_op(replay_exec *x, replay_op_kind kind, uint32_t ml, const sim_schedule_step *sd,
                   uint32_t n, const char *cat, const char *name, int moe_layer) {
    replay_op op = {kind, ml, sd, n};
    x->be->op_begin(x, cat, name, moe_layer);
    x->be->run(x, &op);
    x->be->op_end(x);
}

/* ---- the run ---- */

/* The last route's experts have run once the stream is idle: unpins them (an op enqueued is not
 * an op done, so a backend that queues ops unpins here, not after each op). */
static void compute_idle(replay_exec *x) {
    if (!x->be->wait_compute) return;
    x->be->wait_compute(x);
    for (uint32_t i = 0; i < x->n_pinned; i++) {
        uint32_t lep = x->pinned_lep[i], p = lep % PREC_COUNT, le = lep / PREC_COUNT;
        memsys_unpin(&x->ms, le / x->E, le % x->E, (moesim_precision)p);
    }
    x->n_pinned = 0;
}

/* Before a route is planned, its pool must have room for the route's experts once everything
 * the policy may evict is evicted: copies already started cannot be (even those of the route's
 * own experts, which may be at another precision than planned), so the stream waits for them to
 * land, as the simulator's does (stream_wait_room): an op of category "stall". Lock held. */
static void wait_room(replay_exec *x, uint32_t layer, uint32_t n_active) {
    uint64_t cap = x->bud.pool_cap_bytes;
    uint64_t need = (uint64_t)n_active * x->route_expert_bytes;
    if (need > cap) need = cap;
    if (x->ms.pool_used[x->ms.cfg.per_layer ? layer : 0] + need <= cap) return;
    if (memsys_unevictable_bytes(&x->ms, layer) + need <= cap) return;
    x->be->op_begin(x, "stall", "stall: room", (int)layer);
    while (memsys_unevictable_bytes(&x->ms, layer) + need > cap && x->be->wait_copy(x)) {
    }
    x->be->op_end(x);
}

/* Issue sequence of the copy loading part `part_index` of the layer being routed (the callback
 * of sim_route_execution_order). */
static uint64_t loading_seq(const void *host, size_t part_index) {
    const replay_exec *x = host;
    size_t layer_parts = (size_t)x->ms.cur_layer * x->E * PREC_COUNT * PART_COUNT;
    return memsys_loading_seq(&x->ms, layer_parts + part_index);
}

static sim_route_scratch route_scratch(replay_exec *x) {
    return (sim_route_scratch){x->stamp,         &x->stamp_gen,  x->active, x->slot,
                               x->active_tokens, x->active_gate, x->plan};
}

/* One (sub-)route, as sim.c's run_route: plan, hits, gate mass, then the experts in order. */
static void run_route(replay_exec *x, uint64_t step, uint32_t layer, uint32_t i0, uint32_t i1,
                      bool first_of_layer, bool last_of_layer) {
    const uint32_t K = x->K;
    uint32_t n = i1 - i0;
    sim_route_scratch rs = route_scratch(x);
    replay_exec_lock(x);
    uint32_t n_active = sim_route_active_build(&rs, x->r_experts + (size_t)i0 * K,
                                               x->r_gates + (size_t)i0 * K, n * K);
    if (first_of_layer)
        sim_route_prefetch_account(&rs, n_active, x->r_experts, x->sch.steps[step].n_tokens * K,
                                   x->ms.pf_mark + (size_t)layer * x->E, x->E,
                                   &x->ms.pf_count[layer], &x->pf_hit, &x->pf_active,
                                   &x->pf_issued_sets);
    compute_idle(x); /* the router's output is known: the host decides now */
    wait_room(x, layer, n_active);
    sim_route_host h = {
        .pm = x->pm,
        .pol = x->pol,
        .ms = &x->ms,
        .quant = &x->quant,
        .precision = x->prec,
        .now_ns = route_clock,
        .clock_ctx = x,
        .experts = x->r_experts,
        .gates = x->r_gates,
        .importance = x->r_importance,
        .la_ids = x->r_la_ids,
        .la_scores = x->r_la_scores,
        .top_k = K,
        .la_depth = x->src.la_depth,
        .la_k = x->src.la_k,
        .tally = &x->tally,
        .sub_routes = &x->sub_routes,
    };
    sim_route_decide(&h, &rs, step, layer, i0, i1, n_active, last_of_layer);
    const size_t layer_parts = (size_t)layer * x->E * PREC_COUNT * PART_COUNT;
    uint32_t n_run = sim_route_execution_order(&rs, n_active, x->ms.state + layer_parts, PREC_COUNT,
                                               loading_seq, x, x->order, x->order_key);
    replay_exec_unlock(x);

    const uint32_t masks[2][2] = {{POLICY_PARTS_ALL, 0},
                                  {1u << PART_GATE | 1u << PART_UP, 1u << PART_DOWN}};
    for (uint32_t r = 0; r < n_run; r++) {
        uint32_t a = x->order[r];
        uint16_t e = x->active[a];
        moesim_precision p = (moesim_precision)x->plan[a];
        uint32_t tok = x->active_tokens[a];
        for (int i = 0; i < 2 && masks[x->set.part_overlap][i]; i++) {
            uint32_t mask = masks[x->set.part_overlap][i];
            x->be->expert_wait(x, layer, e, p, mask);
            if (x->hooks && x->hooks->on_expert_start)
                x->hooks->on_expert_start(x->hooks->ctx, (policy_mem_view){&memsys_ops, &x->ms},
                                          layer, e, p, mask, replay_exec_now(x));
            x->be->expert(x, layer, e, p, tok, mask);
        }
        x->expert_ops++;
        replay_exec_lock(x);
        if (x->be->wait_compute) /* pinned until the stream is idle (compute_idle) */
            x->pinned_lep[x->n_pinned++] = (uint32_t)memsys_lep(&x->ms, layer, e, p);
        else
            memsys_unpin(&x->ms, layer, e, p);
        replay_exec_unlock(x);
    }
}

/* sim.c's run_layer: sub-routes whose distinct experts fit one pool, in token order. */
static void run_layer(replay_exec *x, uint64_t step, uint32_t layer) {
    uint32_t n = x->sch.steps[step].n_tokens, K = x->K;
    sim_route_gather(&x->src, x->step_tokens, n, layer, x->r_experts, x->r_gates, x->r_importance,
                     x->r_la_ids, x->r_la_scores);
    sim_route_scratch rs = route_scratch(x);
    replay_exec_lock(x);
    memsys_begin_layer(&x->ms);
    replay_exec_unlock(x);
    for (uint32_t i0 = 0; i0 < n;) {
        uint32_t i1 = sim_route_split(&rs, x->r_experts, K, i0, n, x->route_capacity);
        run_route(x, step, layer, i0, i1, i0 == 0, i1 == n);
        for (uint32_t i = i0 * K; i < i1 * K; i++)
            x->ms.access_pos += x->r_experts[i] != TRACE_NO_EXPERT;
        i0 = i1;
    }
}

static void run_step(replay_exec *x, uint64_t st) {
    const model_geometry *m = x->m;
    const sim_schedule_step *sd = &x->sch.steps[st];
    uint32_t n = sd->n_tokens, n_emit = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t tok = x->sch.tokens[sd->first + i];
        x->step_tokens[i] = tok;
        x->step_req[i] = x->tr->request_id[tok];
        x->step_pos[i] = x->tr->position[tok];
        n_emit += x->sch.emit[sd->first + i];
    }
    x->be->step_begin(x, st);
    x->ops_in_step = 0;
    x->last_op_end = 0;
    uint64_t now = replay_exec_now(x);
    x->step_start[st] = now;
    sim_timeline_step(&x->tl, st, now); /* the stream is idle: host and stream clocks agree */
    policy_step ps = {st, now, n, sd->is_prefill, x->step_req, x->step_pos};
    replay_exec_lock(x);
    x->ms.cur_step = st;
    x->ms.cur_layer = -1;
    if (x->pm->begin_step) x->pm->begin_step(x->pol, &ps);
    replay_exec_unlock(x);

    bool has_shared = replay_nonexpert_elems(m, REPLAY_NX_SHARED) > 0;
    bool has_dense = replay_nonexpert_elems(m, REPLAY_NX_DENSE) > 0;
    char name[64] = "";
    uint32_t moe = 0;
    for (uint32_t ml = 0; ml < m->n_layers; ml++) {
        if (x->tl.on) snprintf(name, sizeof name, "L%u attention", ml);
        run_op(x, REPLAY_OP_ATTENTION, ml, sd, n, "attention", name, -1);
        if (!m->is_moe_layer[ml]) {
            if (!has_dense) continue;
            if (x->tl.on) snprintf(name, sizeof name, "L%u dense ffn", ml);
            run_op(x, REPLAY_OP_DENSE, ml, sd, n, "ffn", name, -1);
            continue;
        }
        if (x->tl.on) snprintf(name, sizeof name, "L%u router", moe);
        run_op(x, REPLAY_OP_ROUTER, ml, sd, n, "router", name, (int)moe);
        run_layer(x, st, moe);
        if (has_shared) {
            if (x->tl.on) snprintf(name, sizeof name, "L%u shared", moe);
            run_op(x, REPLAY_OP_SHARED, ml, sd, n, "shared", name, -1);
        }
        if (x->tl.on) snprintf(name, sizeof name, "L%u combine", moe);
        run_op(x, REPLAY_OP_COMBINE, ml, sd, n, "combine", name, -1);
        moe++;
    }
    run_op(x, REPLAY_OP_LM_HEAD, 0, sd, n_emit, "lm_head", "lm head", -1);
    replay_exec_lock(x);
    compute_idle(x);
    replay_exec_unlock(x);
    x->step_end[st] = replay_exec_now(x);
    x->be->step_end(x, st);
    for (uint32_t l = 0; l < x->L; l++) {
        if (x->layer_t0[l] != UINT64_MAX && x->hooks && x->hooks->on_layer_done)
            x->hooks->on_layer_done(x->hooks->ctx, st, l, x->layer_t0[l], x->layer_t1[l]);
        x->layer_t0[l] = UINT64_MAX;
        x->layer_t1[l] = 0;
    }
    replay_exec_lock(x);
    if (x->pm->end_step) x->pm->end_step(x->pol, &ps, replay_exec_now(x));
    replay_exec_unlock(x);
}

static moesim_status run_steps(replay_exec *x, moesim_error *err) {
    moesim_status st = MOESIM_OK;
    replay_exec_lock(x);
    memsys_warmup_begin(&x->ms);
    if (x->pm->warmup) x->pm->warmup(x->pol, 0);
    replay_exec_unlock(x);
    x->be->warm_copy(x); /* initial placement (model loading) is read before the clock starts */
    replay_exec_lock(x);
    memsys_warmup_end(&x->ms);
    x->be->clock_start(x);
    x->clock_on = true;
    replay_exec_unlock(x);
    for (uint64_t s = 0; s < x->sch.n_steps && !st; s++) {
        run_step(x, s);
        if (x->be->io_status) st = x->be->io_status(x, err);
    }
    /* drain: copies still queued or in flight (prefetches nobody used) complete */
    replay_exec_lock(x);
    x->be->drain(x);
    memsys_finish(&x->ms);
    replay_exec_unlock(x);
    if (!st && x->be->io_status) st = x->be->io_status(x, err);
    return st;
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
    return MOESIM_OK;
}

static moesim_status read_settings(replay_exec *x, const char *policy_name, config *settings,
                                   moesim_error *err) {
    moesim_status st;
    x->pm = policy_lookup(policy_name);
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
    memsys_host mh = {x, on_work, on_hbm, on_reserve, on_release};
    memsys_init(&x->ms, &mc, &mh);
    x->ms_live = true;
    sim_future_init(&x->future, x->tr, &x->sch);
    x->ms.future = &x->future;
    const trace_meta *tm = &x->tr->meta;
    bool emulated = tm->lookahead_depth == 0;
    uint32_t D = emulated ? x->set.predictor_depth : tm->lookahead_depth;
    x->src = (sim_route_source){x->tr,
                                x->L,
                                x->E,
                                x->K,
                                D,
                                emulated ? (D ? x->K : 0) : tm->lookahead_k,
                                emulated && D > 0,
                                x->set.seed,
                                x->set.predictor_accuracy};
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
        .lookahead_depth = x->src.la_depth,
        .lookahead_k = x->src.la_k,
        .lookahead_emulated = x->src.la_emulated,
        .seed = x->set.seed,
    };
    memcpy(params.part_bytes, x->part_bytes, sizeof params.part_bytes);
    x->params = params;
    moesim_status st =
        x->pm->create(&x->params, x->knobs, (policy_mem_view){&memsys_ops, &x->ms}, &x->pol, err);
    if (st) {
        moesim_error_prefix(err, "policy '%s'", x->pm->name);
        return st;
    }
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

static void alloc_scratch(replay_exec *x) {
    size_t MT = x->sch.max_step_tokens, DK = (size_t)x->src.la_depth * x->src.la_k, E = x->E;
    x->r_experts = moesim_xcalloc(MT * x->K, sizeof(uint16_t));
    x->r_gates = moesim_xcalloc(MT * x->K, sizeof(float));
    if (x->tr->importance) x->r_importance = moesim_xcalloc(MT, sizeof(float));
    if (DK) {
        x->r_la_ids = moesim_xcalloc(MT * DK, sizeof(uint16_t));
        x->r_la_scores = moesim_xcalloc(MT * DK, sizeof(float));
    }
    x->active = moesim_xcalloc(E, sizeof(uint16_t));
    x->active_tokens = moesim_xcalloc(E, sizeof(uint32_t));
    x->active_gate = moesim_xcalloc(E, sizeof(float));
    x->plan = moesim_xcalloc(E, 1);
    x->stamp = moesim_xcalloc(E, sizeof(uint32_t));
    x->slot = moesim_xcalloc(E, sizeof(uint32_t));
    x->order = moesim_xcalloc(E, sizeof(uint32_t));
    x->order_key = moesim_xcalloc(E, sizeof(uint64_t));
    x->pinned_lep = moesim_xcalloc(E, sizeof(uint32_t));
    x->step_tokens = moesim_xcalloc(MT, sizeof(uint32_t));
    x->step_req = moesim_xcalloc(MT, sizeof(uint32_t));
    x->step_pos = moesim_xcalloc(MT, sizeof(uint32_t));
    x->step_start = moesim_xcalloc(x->sch.n_steps, sizeof(uint64_t));
    x->step_end = moesim_xcalloc(x->sch.n_steps, sizeof(uint64_t));
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
    sim_schedule_build(&x->sch, x->tr, x->set.batch_size, model_kv_bytes_per_token(x->m),
                       model_recurrent_state_bytes(x->m));
    if ((st = plan_budget(x, settings, err))) return st;
    if ((st = make_policy(x, err))) return st;
    if (in->timeline_path && (st = sim_timeline_open_as(&x->tl, in->timeline_path, "moesim replay",
                                                        &in->timeline_window, err)))
        return st;
    alloc_scratch(x);
    return x->be->setup(x, err);
}

/* ---- result, teardown ---- */

static void exec_result(replay_exec *x, sim_result *r, replay_checks *ck) {
    snprintf(r->policy, sizeof r->policy, "%s", x->pm->name);
    sim_result_set_latency(r, &x->sch, x->step_start, x->step_end, x->hooks);
    sim_result_fill(r, &(sim_result_totals){
                           .tokens = x->tr->n_tokens,
                           .requests = x->sch.n_requests,
                           .steps = x->sch.n_steps,
                           .makespan_ns = x->sch.n_steps ? x->step_end[x->sch.n_steps - 1] : 0,
                           .tally = &x->tally,
                           .moved = &x->ms.n,
                           .pf_hit = x->pf_hit,
                           .pf_active = x->pf_active,
                           .pf_issued_sets = x->pf_issued_sets,
                           .expert_ops = x->expert_ops,
                           .sub_routes = x->sub_routes,
                           .stall_ns = x->stall_ns,
                           .h2d_busy_ns = x->h2d_busy_ns,
                           .ssd_busy_ns = x->ssd_busy_ns,
                           .budget_bytes = x->bud.budget_bytes,
                           .expert_budget_bytes = x->bud.expert_budget_bytes,
                           .kv_peak_bytes = x->bud.kv_peak_bytes,
                           .placement_refusals = x->pool.refusals,
                           .predictor_emulated = x->src.la_emulated,
                           .predictor_accuracy = x->src.la_emulated ? x->set.predictor_accuracy : 0,
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
    void *bufs[] = {x->r_experts, x->r_gates,       x->r_importance, x->r_la_ids,   x->r_la_scores,
                    x->active,    x->active_tokens, x->active_gate,  x->plan,       x->stamp,
                    x->slot,      x->order,         x->order_key,    x->pinned_lep, x->step_tokens,
                    x->step_req,  x->step_pos,      x->step_start,   x->step_end,   x->layer_t0,
                    x->layer_t1};
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
    if (!st) st = run_steps(x, err);
    if (!st) {
        x->be->finish(x);
        exec_result(x, out, checks);
        st = sim_timeline_close(&x->tl, err);
    }
    exec_teardown(x);
    free(x);
    return st;
}
