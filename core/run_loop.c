/* The one run loop (core/run_loop.h): steps, layers, routes, their waits and the order of their
 * ops, for every host. */
#include "core/run_loop.h"

#include <stdio.h>
#include <string.h>

#include "common/check.h"

static void rl_lock(run_loop *rl) {
    if (rl->c.ops->lock) rl->c.ops->lock(rl->c.host);
}

static void rl_unlock(run_loop *rl) {
    if (rl->c.ops->unlock) rl->c.ops->unlock(rl->c.host);
}

static uint64_t rl_now(const void *rl) {
    const run_loop *l = rl;
    return l->c.ops->now_ns(l->c.host);
}

void run_loop_init(run_loop *rl, const run_loop_config *c) {
    memset(rl, 0, sizeof *rl);
    rl->c = *c;
    rl->L = c->meta->n_layers;
    rl->E = c->meta->n_experts;
    rl->K = c->meta->top_k;
    sim_route_bits_of(c->quant, rl->bits_of);
    arena *a = c->mem;
    size_t T = c->max_step_tokens, E = rl->E, K = rl->K;
    size_t DK = (size_t)c->la_depth * c->la_k;
    rl->step_tok = arena_calloc(a, T, sizeof *rl->step_tok);
    rl->step_emit = arena_calloc(a, T, sizeof *rl->step_emit);
    rl->step_req = arena_calloc(a, T, sizeof *rl->step_req);
    rl->step_pos = arena_calloc(a, T, sizeof *rl->step_pos);
    rl->r_experts = arena_calloc(a, T * K, sizeof(uint16_t));
    rl->r_gates = arena_calloc(a, T * K, sizeof(float));
    if (c->meta->has_importance) rl->r_importance = arena_calloc(a, T, sizeof(float));
    if (DK && !c->la_unread) {
        rl->r_la_ids = arena_calloc(a, T * DK, sizeof(uint16_t));
        if (!c->la_scores_unread) rl->r_la_scores = arena_calloc(a, T * DK, sizeof(float));
    }
    rl->active = arena_calloc(a, E, sizeof(uint16_t));
    rl->active_tokens = arena_calloc(a, E, sizeof(uint32_t));
    rl->active_gate = arena_calloc(a, E, sizeof(float));
    rl->plan = arena_calloc(a, E, 1);
    rl->lep = arena_calloc(a, E, sizeof(uint32_t));
    rl->stamp = arena_calloc(a, E, sizeof(uint32_t));
    rl->seen = arena_calloc(a, MODEL_MAX_EXPERTS / 64, sizeof(uint64_t));
    rl->slot = arena_calloc(a, E, sizeof(uint32_t));
    rl->order = arena_calloc(a, E, sizeof(uint32_t));
    rl->order_key = arena_calloc(a, E, sizeof(uint64_t));
    if (c->ops->queues_ops) rl->pinned_lep = arena_calloc(a, E, sizeof(uint32_t));
}

void run_loop_free(run_loop *rl) { sim_schedule_iter_free(&rl->it); }

double run_loop_predictor_accuracy(const run_loop *rl) {
    if (rl->c.la_emulated) return rl->c.la_accuracy;
    return rl->la_total ? (double)rl->la_right / (double)rl->la_total : 0;
}

/* ---- routing ---- */

/* Gathers the step's routing (and look-ahead) at `layer` into the r_* buffers; with recorded
 * look-ahead, counts its top-1 hits at distance 1 (every (token, layer) is gathered once). */
static void gather_route(run_loop *rl, uint32_t layer) {
    const run_loop_config *c = &rl->c;
    uint32_t K = rl->K, L = rl->L;
    size_t DK = rl->r_la_ids ? (size_t)c->la_depth * c->la_k : 0;
    for (uint32_t i = 0; i < rl->step_n; i++) {
        uint32_t tok = rl->step_tok[i];
        uint64_t at;
        const trace *t = c->row_of(c->row_ctx, tok, &at);
        memcpy(rl->r_experts + (size_t)i * K, trace_experts(t, at, layer), K * sizeof(uint16_t));
        memcpy(rl->r_gates + (size_t)i * K, trace_gates(t, at, layer), K * sizeof(float));
        if (rl->r_importance) rl->r_importance[i] = t->importance[(size_t)at * L + layer];
        /* the token's rows of the next layer, fetched now: the stream filled its block long
         * before, and copies of rows not in cache were up to 8 % of a run (bench/README.md) */
        if (layer + 1 < L) {
            __builtin_prefetch(trace_experts(t, at, layer + 1));
            __builtin_prefetch(trace_gates(t, at, layer + 1));
            __builtin_prefetch(trace_gates(t, at, layer + 1) + K - 1);
        }
        if (!DK) continue;
        if (c->la_emulated) {
            sim_lookahead_emulate_rows(trace_experts(t, at, 0), trace_gates(t, at, 0), L, rl->E, K,
                                       c->la_depth, c->la_k, c->seed, c->la_accuracy, tok, layer,
                                       rl->r_la_ids + i * DK, rl->r_la_scores + i * DK);
        } else {
            size_t src = trace_lookahead_index(t, at, layer, 1);
            memcpy(rl->r_la_ids + i * DK, t->lookahead_ids + src, DK * sizeof(uint16_t));
            if (rl->r_la_scores)
                memcpy(rl->r_la_scores + i * DK, t->lookahead_scores + src, DK * sizeof(float));
            if (layer + 1 < L) {
                const size_t next = trace_lookahead_index(t, at, layer + 1, 1); /* as above */
                __builtin_prefetch(t->lookahead_ids + next);
                __builtin_prefetch(t->lookahead_ids + next + DK - 1);
                if (rl->r_la_scores) {
                    __builtin_prefetch(t->lookahead_scores + next);
                    __builtin_prefetch(t->lookahead_scores + next + DK - 1);
                }
                uint16_t want = trace_experts(t, at, layer + 1)[0];
                if (want != TRACE_NO_EXPERT) {
                    rl->la_right += t->lookahead_ids[src] == want;
                    rl->la_total++;
                }
            }
        }
    }
}

static sim_route_scratch route_scratch(run_loop *rl) {
    return (sim_route_scratch){.stamp = rl->stamp,
                               .stamp_gen = &rl->stamp_gen,
                               .active = rl->active,
                               .slot = rl->slot,
                               .active_tokens = rl->active_tokens,
                               .active_gate = rl->active_gate,
                               .plan = rl->plan,
                               .lep = rl->lep,
                               .seen = rl->seen};
}

/* The stream catches up with the host; a host that queues ops unpins the last route's experts
 * once they ran (an op enqueued is not an op done). Lock held. */
static void catch_up(run_loop *rl) {
    rl->c.ops->sync(rl->c.host);
    memsys *ms = rl->c.ms;
    for (uint32_t i = 0; i < rl->n_pinned; i++) memsys_unpin_lep(ms, rl->pinned_lep[i]);
    rl->n_pinned = 0;
}

/* Before a route is planned, its pool must have room for the route's experts once everything
 * the policy may evict is evicted: copies already started cannot be (even those of the route's
 * own experts, which may be at another precision than planned), so the stream waits for them to
 * land (what an engine does when a DMA it cannot recall holds the room). Without this wait a
 * demand load would be refused and become a skip. Lock held. */
static void wait_room(run_loop *rl, uint32_t layer, uint32_t n_active) {
    const run_host_ops *ops = rl->c.ops;
    memsys *ms = rl->c.ms;
    uint64_t cap = rl->pool_cap_bytes;
    uint64_t need = (uint64_t)n_active * rl->route_expert_bytes;
    if (need > cap) need = cap;
    if (ms->pool_used[ms->cfg.per_layer ? layer : 0] + need <= cap) return;
    if (ms->started_bytes + need <= cap) return; /* the bound first: a full cache asks per route */
    if (memsys_unevictable_bytes(ms, layer) + need <= cap) return;
    if (ops->stall_begin) ops->stall_begin(rl->c.host, "stall: room", (int)layer);
    while (memsys_unevictable_bytes(ms, layer) + need > cap &&
           ops->wait_copy(rl->c.host, "stall: room")) {
    }
    if (ops->stall_end) ops->stall_end(rl->c.host);
}

/* One expert's ops (run_loop_expert_masks), then its pin's release (`lep`: the expert at p). */
static void run_expert(run_loop *rl, uint32_t layer, uint16_t e, moesim_precision p,
                       uint32_t tokens, uint32_t lep) {
    const run_host_ops *ops = rl->c.ops;
    ops->expert(rl->c.host, layer, e, p, tokens, rl->c.part_overlap);
    rl->expert_ops++;
    rl_lock(rl);
    if (ops->queues_ops) /* pinned until the stream caught up (catch_up) */
        rl->pinned_lep[rl->n_pinned++] = lep;
    else
        memsys_unpin_lep(rl->c.ms, lep);
    rl_unlock(rl);
}

/* One (sub-)route: tokens [i0, i1) of the step: plan, hits, gate mass, then the experts in
 * order. */
static void run_route(run_loop *rl, uint64_t step, uint32_t layer, uint32_t i0, uint32_t i1,
                      bool first_of_layer, bool last_of_layer) {
    const run_loop_config *c = &rl->c;
    const uint32_t K = rl->K;
    memsys *ms = c->ms;
    sim_route_scratch rs = route_scratch(rl);
    rl_lock(rl);
    uint32_t n_active =
        sim_route_active_build(&rs, rl->r_experts + (size_t)i0 * K, rl->r_gates + (size_t)i0 * K,
                               (i1 - i0) * K, i1 - i0 == 1);
    if (first_of_layer)
        sim_route_prefetch_account(&rs, rl->r_experts, rl->step_n * K,
                                   ms->pf_mark + (size_t)layer * rl->E, rl->E, &ms->pf_count[layer],
                                   &rl->pf_hit, &rl->pf_active, &rl->pf_issued_sets);
    catch_up(rl); /* the router's output is known: the host decides now */
    wait_room(rl, layer, n_active);
    sim_route_host h = {
        .pm = c->pm,
        .pol = c->pol,
        .ms = ms,
        .quant = c->quant,
        .bits_of = rl->bits_of,
        .precision = c->precision,
        .now_ns = rl_now,
        .clock_ctx = rl,
        .experts = rl->r_experts,
        .gates = rl->r_gates,
        .importance = rl->r_importance,
        .la_ids = rl->r_la_ids,
        .la_scores = rl->r_la_scores,
        .top_k = K,
        .la_depth = c->la_depth,
        .la_k = c->la_k,
        .tally = &rl->tally,
        .sub_routes = &rl->sub_routes,
    };
    sim_route_decide(&h, &rs, step, layer, i0, i1, n_active, last_of_layer);
    uint32_t n_run =
        sim_route_execution_order(&rs, n_active, ms, rl->order, rl->order_key, &rl->tally.hits);
    rl_unlock(rl);
    for (uint32_t r = 0; r < n_run; r++) {
        uint32_t a = rl->order[r];
        run_expert(rl, layer, rl->active[a], (moesim_precision)rl->plan[a], rl->active_tokens[a],
                   rl->lep[a]);
    }
}

/* A MoE layer: sub-routes whose distinct experts fit one pool (route_capacity), in token
 * order, one after the other. */
static void run_layer(run_loop *rl, uint64_t step, uint32_t layer) {
    uint32_t n = rl->step_n, K = rl->K;
    gather_route(rl, layer);
    rl_lock(rl);
    memsys_begin_layer(rl->c.ms);
    rl_unlock(rl);
    sim_route_scratch rs = route_scratch(rl);
    for (uint32_t i0 = 0; i0 < n;) {
        uint32_t i1 = sim_route_split(&rs, rl->r_experts, K, i0, n, rl->route_capacity);
        /* the route's accesses (its expert slots, skipped or not) as its tally counts them */
        uint64_t counted = rl->tally.accesses + rl->tally.skipped;
        run_route(rl, step, layer, i0, i1, i0 == 0, i1 == n);
        rl->c.ms->access_pos += rl->tally.accesses + rl->tally.skipped - counted;
        i0 = i1;
    }
}

/* ---- steps ---- */

static void issue_op(run_loop *rl, run_op *op, run_op_kind kind, uint32_t layer, int moe_layer,
                     uint32_t n_tokens, const char *cat, const char *name) {
    op->kind = kind;
    op->layer = layer;
    op->moe_layer = moe_layer;
    op->n_tokens = n_tokens;
    op->cat = cat;
    op->name = name;
    rl->c.ops->op(rl->c.host, op);
}

static void run_step(run_loop *rl, run_step_info *si) {
    const run_loop_config *c = &rl->c;
    const model_geometry *m = c->model;
    const sim_schedule_step *sd = si->sd;
    uint32_t n = sd->n_tokens;
    rl->step_n = n;
    si->attended = 0;
    si->n_emit = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t at;
        rl->step_pos[i] = c->row_of(c->row_ctx, rl->step_tok[i], &at)->position[at];
        si->attended += (uint64_t)rl->step_pos[i] + 1;
        si->n_emit += rl->step_emit[i];
    }
    c->ops->step_begin(c->host, si);
    policy_step ps = {.index = si->index,
                      .now_ns = c->ops->now_ns(c->host),
                      .n_tokens = n,
                      .is_prefill = sd->is_prefill,
                      .request = rl->step_req,
                      .position = rl->step_pos};
    rl_lock(rl);
    c->ms->cur_step = si->index;
    c->ms->cur_layer = -1;
    if (c->pm->begin_step) c->pm->begin_step(c->pol, &ps);
    rl_unlock(rl);

    run_op op = {.step_index = si->index, .step = sd};
    char name[64] = "";
    uint32_t moe = 0;
    for (uint32_t ml = 0; ml < m->n_layers; ml++) {
        if (c->timeline) snprintf(name, sizeof name, "L%u attention", ml);
        issue_op(rl, &op, RUN_OP_ATTENTION, ml, -1, n, "attention", name);
        if (!m->is_moe_layer[ml]) {
            if (m->dense_inter) { /* a model's op only where it has one to run */
                if (c->timeline) snprintf(name, sizeof name, "L%u dense ffn", ml);
                issue_op(rl, &op, RUN_OP_DENSE, ml, -1, n, "ffn", name);
            }
            continue;
        }
        if (c->timeline) snprintf(name, sizeof name, "L%u router", moe);
        issue_op(rl, &op, RUN_OP_ROUTER, ml, (int)moe, n, "router", name);
        run_layer(rl, si->index, moe);
        if (c->ops->layer_end) c->ops->layer_end(c->host, si->index, moe);
        if (m->n_shared_experts && m->shared_inter) {
            if (c->timeline) snprintf(name, sizeof name, "L%u shared", moe);
            issue_op(rl, &op, RUN_OP_SHARED, ml, -1, n, "shared", name);
        }
        if (c->timeline) snprintf(name, sizeof name, "L%u combine", moe);
        issue_op(rl, &op, RUN_OP_COMBINE, ml, -1, n, "combine", name);
        moe++;
    }
    issue_op(rl, &op, RUN_OP_LM_HEAD, 0, -1, si->n_emit, "lm_head", "lm head");
    rl_lock(rl);
    catch_up(rl);
    rl_unlock(rl);
    c->ops->step_end(c->host, si);
    rl_lock(rl);
    if (c->pm->end_step) c->pm->end_step(c->pol, &ps, c->ops->now_ns(c->host));
    rl_unlock(rl);
}

moesim_status run_loop_run(run_loop *rl, moesim_error *err) {
    const run_loop_config *c = &rl->c;
    const run_host_ops *ops = c->ops;
    moesim_status st = MOESIM_OK;
    rl_lock(rl);
    memsys_warmup_begin(c->ms);
    if (c->pm->warmup) c->pm->warmup(c->pol, 0);
    rl_unlock(rl);
    if (ops->warm_copy) ops->warm_copy(c->host); /* model loading: before the clock starts */
    rl_lock(rl);
    memsys_warmup_end(c->ms);
    if (ops->clock_start) ops->clock_start(c->host);
    rl_unlock(rl);

    sim_schedule_iter_init(&rl->it, c->rq, c->batch_size, model_kv_bytes_per_token(c->model),
                           model_recurrent_state_bytes(c->model));
    sim_schedule_step sd;
    run_step_info si = {.sd = &sd};
    while (!st && sim_schedule_next(&rl->it, &sd, &si.kv_bytes, rl->step_tok, rl->step_req,
                                    rl->step_emit)) {
        si.admitted = rl->it.admitted;
        si.n_admitted = rl->it.n_admitted;
        run_step(rl, &si);
        si.index++;
        rl->n_steps_run = si.index;
        if (ops->io_status) st = ops->io_status(c->host, err);
    }
    /* drain: copies still queued or in flight (prefetches nobody used) complete */
    rl_lock(rl);
    ops->drain(c->host);
    memsys_finish(c->ms);
    rl_unlock(rl);
    if (!st && ops->io_status) st = ops->io_status(c->host, err);
    return st;
}
