/* The replay on the CPU (replay/replay.h, replay_run_cpu): a real execution of the simulator's run
 * on any machine. The "device" is a DRAM arena of the run's expert budget carved into fixed
 * blocks per precision; the tier experts are loaded from is a file on local disk read with
 * O_DIRECT (replay/cpu_store.h) by a copy thread (replay/cpu_copier.h) that serves the memory
 * system's queue (sim/memsys.h) chunk by chunk in class order; compute runs on this thread with
 * the engine's CPU kernels at the planned precision. Schedule, routes, policy calls, residency
 * and the result are the simulator's (sim/schedule.h, sim/route.h, sim/memsys.h), so a run is step
 * for step comparable with sim_run on the same trace, settings and a CPU profile (configs/hw/
 * README.md, "CPU kind": the [pcie] link is the disk).
 *
 * Activations and the KV buffer are synthetic (routing comes from the trace); expert weights are
 * the store's synthetic bytes, non-expert weights seeded random bf16. What is timed is shapes and
 * bytes. Times are CLOCK_MONOTONIC ns since the first step; the compute stream waits for a part
 * to land (stall time) exactly where the simulator's does. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "kernels/quant.h"
#include "replay/cpu_compute.h"
#include "replay/cpu_copier.h"
#include "replay/cpu_store.h"
#include "replay/replay.h"
#include "sim/budget.h"
#include "sim/future.h"
#include "sim/memsys.h"
#include "sim/route.h"
#include "sim/schedule.h"

#define NONE UINT32_MAX

typedef struct cpu_run {
    const trace *tr;
    const model_geometry *m;
    sim_settings set;
    sim_schedule sch;
    sim_budget bud;
    uint32_t L, E, K;
    moesim_precision prec;
    quant_table quant;

    /* memory system, guarded by lock (the copier thread shares it) */
    pthread_mutex_t lock;
    memsys ms;
    sim_future future;
    cpu_copier cp;
    const cpu_store *store;
    cpu_store *own_store;
    uint32_t route_capacity;
    uint64_t route_expert_bytes;

    /* the "device": fixed blocks per precision carved from one arena */
    uint8_t *arena;
    uint64_t arena_bytes, arena_top;
    uint64_t block_bytes[PREC_COUNT];
    uint32_t *free_blocks[PREC_COUNT]; /* [cap_free] stack of freed block offsets / block_bytes */
    uint32_t n_free[PREC_COUNT], cap_free[PREC_COUNT];
    uint8_t **part_ptr; /* [L*E*P*PART_COUNT] block of each resident or loading part */
    uint64_t physical_refusals;

    /* policy */
    const policy_methods *pm;
    policy *pol;
    void *knobs;
    policy_params params;

    /* routes (sim/route.h) */
    sim_route_source src;
    uint16_t *r_experts, *r_la_ids, *active;
    float *r_gates, *r_importance, *r_la_scores, *active_gate;
    uint32_t *active_tokens, *stamp, *slot, *order, stamp_gen;
    uint64_t *order_key;
    uint8_t *plan;
    uint32_t *step_tokens, *step_req, *step_pos;

    cpu_compute cc; /* weights, activations and the ops (replay/cpu_compute.h) */

    /* measured */
    uint64_t t0, stall_ns, expert_ops, sub_routes, pf_hit, pf_active, pf_issued_sets;
    uint64_t *step_start, *step_end, *layer_ns; /* [n_steps], [n_steps], [L] */
    sim_route_tally tally;
    const sim_hooks *hooks;
    sim_timeline tl;
} cpu_run;

static uint64_t now(const cpu_run *r) { return cpu_clock_ns() - r->t0; }

/* ---- pool blocks (memsys_host.reserve / release) ---- */

static size_t part_index(const cpu_run *r, uint32_t layer, uint32_t expert, uint32_t p, int part) {
    return memsys_lep(&r->ms, layer, expert, p) * PART_COUNT + (size_t)part;
}

static uint8_t *block_take(cpu_run *r, uint32_t p) {
    if (r->n_free[p]) return r->arena + (uint64_t)r->free_blocks[p][--r->n_free[p]] * 4096;
    if (r->arena_top + r->block_bytes[p] > r->arena_bytes) return NULL;
    uint8_t *b = r->arena + r->arena_top;
    r->arena_top += r->block_bytes[p];
    return b;
}

static void block_give(cpu_run *r, uint32_t p, uint8_t *b) {
    if (r->n_free[p] == r->cap_free[p]) {
        r->cap_free[p] = r->cap_free[p] ? 2 * r->cap_free[p] : 64;
        r->free_blocks[p] = moesim_xrealloc(r->free_blocks[p], r->cap_free[p] * sizeof(uint32_t));
    }
    r->free_blocks[p][r->n_free[p]++] = (uint32_t)((uint64_t)(b - r->arena) / 4096);
}

static bool reserve(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p,
                    uint32_t parts) {
    cpu_run *r = ctx;
    uint8_t *got[PART_COUNT] = {NULL};
    for (int part = 0; part < PART_COUNT; part++) {
        if (!(parts & (1u << part))) continue;
        if (!(got[part] = block_take(r, p))) {
            for (int q = 0; q < part; q++)
                if (got[q]) block_give(r, p, got[q]);
            r->physical_refusals++;
            return false;
        }
    }
    for (int part = 0; part < PART_COUNT; part++)
        if (got[part]) r->part_ptr[part_index(r, layer, expert, p, part)] = got[part];
    return true;
}

static void release(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p, int part) {
    cpu_run *r = ctx;
    size_t pi = part_index(r, layer, expert, p, part);
    block_give(r, p, r->part_ptr[pi]);
    r->part_ptr[pi] = NULL;
}

static uint8_t *part_block(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p,
                           int part) {
    cpu_run *r = ctx;
    return r->part_ptr[part_index(r, layer, expert, p, part)];
}

static void on_work(void *ctx, int engine) {
    cpu_run *r = ctx;
    cpu_copier_on_work(&r->cp, engine);
}

static void on_hbm(void *ctx, uint64_t experts_used) {
    cpu_run *r = ctx;
    MOESIM_ASSERT(experts_used <= r->bud.expert_budget_bytes);
}

/* ---- the run ---- */

static void locked_deliver(cpu_run *r) { cpu_copier_deliver(&r->cp); }

/* Waits (lock held) until every part in `mask` of (layer, expert, p) is resident. */
static void wait_parts(cpu_run *r, uint32_t layer, uint32_t expert, moesim_precision p,
                       uint32_t mask) {
    size_t base = memsys_lep(&r->ms, layer, expert, p) * PART_COUNT;
    uint64_t t0 = now(r);
    for (;;) {
        bool ready = true;
        for (int part = 0; part < PART_COUNT; part++)
            if ((mask & (1u << part)) && r->ms.state[base + part] != POLICY_RESIDENT) ready = false;
        if (ready || r->cp.failed) break;
        cpu_copier_wait(&r->cp);
    }
    r->stall_ns += now(r) - t0;
    locked_deliver(r);
}

/* Waits (lock held) until the route's pool has room once everything evictable is evicted (the
 * simulator's stream_wait_room). */
static void wait_room(cpu_run *r, uint32_t layer, uint32_t n_active) {
    uint64_t cap = r->bud.pool_cap_bytes;
    uint64_t need = (uint64_t)n_active * r->route_expert_bytes;
    if (need > cap) need = cap;
    uint64_t t0 = now(r);
    while (!r->cp.failed && memsys_unevictable_bytes(&r->ms, layer) + need > cap)
        cpu_copier_wait(&r->cp);
    r->stall_ns += now(r) - t0;
    locked_deliver(r);
}

static uint64_t loading_seq(const void *host, size_t part_index_in_layer) {
    const cpu_run *r = host;
    size_t layer_parts = (size_t)r->ms.cur_layer * r->E * PREC_COUNT * PART_COUNT;
    return memsys_loading_seq(&r->ms, layer_parts + part_index_in_layer);
}

static void timeline_op(cpu_run *r, const char *cat, const char *name, uint64_t t0, uint64_t t1) {
    if (r->tl.on) sim_timeline_slice(&r->tl, SIM_TRACK_COMPUTE, cat, name, t0, t1);
}

static void run_route(cpu_run *r, uint64_t step, uint32_t layer, uint32_t i0, uint32_t i1,
                      bool first, bool last) {
    const uint32_t K = r->K;
    uint32_t n = i1 - i0;
    const uint16_t *ex = r->r_experts + (size_t)i0 * K;
    const float *gs = r->r_gates + (size_t)i0 * K;
    sim_route_scratch rs = {r->stamp, &r->stamp_gen, r->active, r->slot, r->active_tokens,
                            r->active_gate, r->plan};
    size_t DK = (size_t)r->src.la_depth * r->src.la_k;
    pthread_mutex_lock(&r->lock);
    uint32_t n_active = sim_route_active_build(&rs, ex, gs, n * K);
    if (first)
        sim_route_prefetch_account(&rs, n_active, r->r_experts, r->sch.steps[step].n_tokens * K,
                                   r->ms.pf_mark + (size_t)layer * r->E, r->E,
                                   &r->ms.pf_count[layer], &r->pf_hit, &r->pf_active,
                                   &r->pf_issued_sets);
    wait_room(r, layer, n_active);
    policy_route route = {
        .layer = layer,
        .now_ns = now(r),
        .n_tokens = n,
        .top_k = K,
        .experts = ex,
        .gates = gs,
        .importance = r->r_importance ? r->r_importance + i0 : NULL,
        .lookahead_ids = DK ? r->r_la_ids + i0 * DK : NULL,
        .lookahead_scores = DK ? r->r_la_scores + i0 * DK : NULL,
        .n_active = n_active,
        .active = r->active,
        .active_tokens = r->active_tokens,
        .active_gate = r->active_gate,
    };
    policy_plan plan = {.run = r->plan};
    r->ms.cur_layer = layer;
    r->ms.cur_step = step;
    r->sub_routes++;
    r->pm->on_route(r->pol, &route, &plan);
    memsys_run_plan(&r->ms, layer, r->active, r->plan, n_active);
    moesim_precision hi = r->pm->hi_precision ? r->pm->hi_precision(r->pol) : r->prec;
    const size_t layer_parts = (size_t)layer * r->E * PREC_COUNT * PART_COUNT;
    sim_route_tally_accesses(&rs, ex, gs, n * K, r->ms.state + layer_parts, PREC_COUNT, &r->quant,
                             r->quant.fmt[hi].weight_bits, &r->tally);
    if (last) memsys_end_layer(&r->ms, layer, now(r));
    uint32_t n_run = sim_route_execution_order(&rs, n_active, r->ms.state + layer_parts,
                                               PREC_COUNT, loading_seq, r, r->order, r->order_key);
    pthread_mutex_unlock(&r->lock);

    char name[80] = "expert";
    for (uint32_t k = 0; k < n_run; k++) {
        uint32_t a = r->order[k];
        uint16_t e = r->active[a];
        moesim_precision p = (moesim_precision)r->plan[a];
        uint32_t tok = r->active_tokens[a];
        size_t base = part_index(r, layer, e, p, 0);
        pthread_mutex_lock(&r->lock);
        wait_parts(r, layer, e, p, 1u << PART_GATE | 1u << PART_UP);
        pthread_mutex_unlock(&r->lock);
        if (r->hooks && r->hooks->on_expert_start)
            r->hooks->on_expert_start(r->hooks->ctx, (policy_mem_view){&memsys_ops, &r->ms}, layer,
                                      e, p, 1u << PART_GATE | 1u << PART_UP, now(r));
        uint64_t t0 = now(r);
        cpu_compute_expert_gate_up(&r->cc, p, r->part_ptr[base + PART_GATE],
                                   r->part_ptr[base + PART_UP], tok);
        uint64_t t1 = now(r);
        if (r->tl.on) snprintf(name, sizeof name, "L%u e%u gate_up %s x%u", layer, e,
                               precision_name(p), tok);
        timeline_op(r, "expert", name, t0, t1);
        pthread_mutex_lock(&r->lock);
        wait_parts(r, layer, e, p, 1u << PART_DOWN);
        pthread_mutex_unlock(&r->lock);
        t0 = now(r);
        cpu_compute_expert_down(&r->cc, p, r->part_ptr[base + PART_DOWN], tok);
        t1 = now(r);
        if (r->tl.on) snprintf(name, sizeof name, "L%u e%u down %s x%u", layer, e,
                               precision_name(p), tok);
        timeline_op(r, "expert", name, t0, t1);
        pthread_mutex_lock(&r->lock);
        memsys_unpin(&r->ms, layer, e, p);
        pthread_mutex_unlock(&r->lock);
        r->expert_ops++;
    }
}

static void run_layer(cpu_run *r, uint64_t step, uint32_t layer) {
    const sim_schedule_step *sd = &r->sch.steps[step];
    uint32_t n = sd->n_tokens;
    sim_route_gather(&r->src, r->step_tokens, n, layer, r->r_experts, r->r_gates, r->r_importance,
                     r->r_la_ids, r->r_la_scores);
    sim_route_scratch rs = {r->stamp, &r->stamp_gen, r->active, r->slot, r->active_tokens,
                            r->active_gate, r->plan};
    pthread_mutex_lock(&r->lock);
    memsys_begin_layer(&r->ms);
    pthread_mutex_unlock(&r->lock);
    for (uint32_t i0 = 0; i0 < n;) {
        uint32_t i1 = sim_route_split(&rs, r->r_experts, r->K, i0, n, r->route_capacity);
        run_route(r, step, layer, i0, i1, i0 == 0, i1 == n);
        for (uint32_t i = i0 * r->K; i < i1 * r->K; i++)
            r->ms.access_pos += r->r_experts[i] != TRACE_NO_EXPERT;
        i0 = i1;
    }
}

/* A timed op of the compute stream. */
#define TIMED(r, cat, label, body)                                                                 \
    do {                                                                                           \
        uint64_t t0_ = now(r);                                                                     \
        body;                                                                                      \
        timeline_op(r, cat, label, t0_, now(r));                                                  \
    } while (0)

static void run_steps(cpu_run *r) {
    const model_geometry *m = r->m;
    pthread_mutex_lock(&r->lock);
    memsys_warmup_begin(&r->ms);
    if (r->pm->warmup) r->pm->warmup(r->pol, 0);
    pthread_mutex_unlock(&r->lock);
    /* initial placement (model loading) is read before the clock starts */
    for (uint32_t i = 0; i < r->ms.n_warm; i++) {
        uint32_t lep = r->ms.warm[i], p = lep % PREC_COUNT, le = lep / PREC_COUNT;
        for (int part = 0; part < PART_COUNT; part++)
            if (r->ms.warm_parts[i] & (1u << part))
                MOESIM_ASSERT(cpu_store_read(r->store,
                                             cpu_store_part_offset(r->store, le / r->E, le % r->E,
                                                                   (moesim_precision)p,
                                                                   (expert_part)part),
                                             r->store->part_bytes[p][part],
                                             r->part_ptr[(size_t)lep * PART_COUNT + part],
                                             r->cp.bounce));
    }
    pthread_mutex_lock(&r->lock);
    memsys_warmup_end(&r->ms);
    r->t0 = cpu_clock_ns();
    r->cp.t0_ns = r->t0;
    pthread_mutex_unlock(&r->lock);
    char name[64] = "";
    for (uint64_t st = 0; st < r->sch.n_steps && !r->cp.failed; st++) {
        const sim_schedule_step *sd = &r->sch.steps[st];
        uint32_t n_emit = 0;
        for (uint32_t i = 0; i < sd->n_tokens; i++) {
            uint32_t tok = r->sch.tokens[sd->first + i];
            r->step_tokens[i] = tok;
            r->step_req[i] = r->tr->request_id[tok];
            r->step_pos[i] = r->tr->position[tok];
            n_emit += r->sch.emit[sd->first + i];
        }
        r->step_start[st] = now(r);
        sim_timeline_step(&r->tl, st, r->step_start[st]);
        policy_step ps = {st, r->step_start[st], sd->n_tokens, sd->is_prefill, r->step_req,
                          r->step_pos};
        pthread_mutex_lock(&r->lock);
        locked_deliver(r);
        r->ms.cur_step = st;
        r->ms.cur_layer = -1;
        if (r->pm->begin_step) r->pm->begin_step(r->pol, &ps);
        pthread_mutex_unlock(&r->lock);
        uint32_t moe = 0;
        for (uint32_t ml = 0; ml < m->n_layers; ml++) {
            if (r->tl.on) snprintf(name, sizeof name, "L%u attention", ml);
            TIMED(r, "attention", name, cpu_compute_attention(&r->cc, ml, r->step_pos, sd->n_tokens));
            if (!m->is_moe_layer[ml]) {
                if (r->tl.on) snprintf(name, sizeof name, "L%u dense ffn", ml);
                TIMED(r, "ffn", name, cpu_compute_dense(&r->cc, ml, sd->n_tokens));
                continue;
            }
            uint64_t layer_t0 = now(r);
            if (r->tl.on) snprintf(name, sizeof name, "L%u router", moe);
            TIMED(r, "router", name, cpu_compute_router(&r->cc, ml, sd->n_tokens));
            run_layer(r, st, moe);
            uint64_t layer_t1 = now(r);
            r->layer_ns[moe] += layer_t1 - layer_t0;
            if (r->hooks && r->hooks->on_layer_done)
                r->hooks->on_layer_done(r->hooks->ctx, st, moe, layer_t0, layer_t1);
            if (m->n_shared_experts) {
                if (r->tl.on) snprintf(name, sizeof name, "L%u shared", moe);
                TIMED(r, "shared", name, cpu_compute_shared(&r->cc, ml, sd->n_tokens));
            }
            if (r->tl.on) snprintf(name, sizeof name, "L%u combine", moe);
            TIMED(r, "combine", name, cpu_compute_combine(&r->cc, sd->n_tokens));
            moe++;
        }
        TIMED(r, "lm_head", "lm head", cpu_compute_lm_head(&r->cc, n_emit));
        r->step_end[st] = now(r);
        pthread_mutex_lock(&r->lock);
        locked_deliver(r);
        if (r->pm->end_step) r->pm->end_step(r->pol, &ps, r->step_end[st]);
        pthread_mutex_unlock(&r->lock);
    }
    /* drain: prefetches nobody used complete */
    pthread_mutex_lock(&r->lock);
    while (!r->cp.failed && cpu_copier_busy(&r->cp)) cpu_copier_wait(&r->cp);
    locked_deliver(r);
    memsys_finish(&r->ms);
    pthread_mutex_unlock(&r->lock);
}

/* ---- setup, result, teardown ---- */

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
    if (in->weights)
        return moesim_fail(err, MOESIM_EINPUT,
                           "replay --backend cpu runs synthetic weights only (--model is the "
                           "cuda backend's)");
    return MOESIM_OK;
}

/* The store's bytes are what the memory system counts: the kernels' formats must be the
 * simulator's accounting formats (configs/quant.ini), or the two would not compare. */
static moesim_status check_formats(const cpu_run *r, moesim_error *err) {
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT && r->store->stored[p]; part++) {
            uint64_t acct = model_expert_part_bytes(r->m, &r->quant, (expert_part)part,
                                                    (moesim_precision)p);
            if (acct != r->store->part_bytes[p][part])
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s: configs/quant.ini counts %" PRIu64 " bytes per expert "
                                   "part, the CPU kernels store %" PRIu64 ": the replay would not "
                                   "move what the simulator counts",
                                   precision_name((moesim_precision)p), acct,
                                   r->store->part_bytes[p][part]);
        }
    return MOESIM_OK;
}

static moesim_status cpu_setup(cpu_run *r, const replay_inputs *in, const char *policy_name,
                               config *settings, moesim_error *err) {
    moesim_status st;
    if ((st = check_inputs(in, err))) return st;
    r->pm = policy_lookup(policy_name);
    if (!r->pm)
        return moesim_fail(err, MOESIM_EINPUT, "unknown policy '%s' (known: %s)", policy_name,
                           policy_names());
    if ((st = sim_settings_read(settings, &r->set, err))) return st;
    if ((st = policy_read_knobs(r->pm, settings, &r->knobs, err))) return st;
    if ((st = config_check_unused(settings, err))) return st;
    r->tr = in->trace;
    r->m = in->model;
    r->hooks = in->hooks;
    r->quant = *in->quant;
    r->L = r->tr->meta.n_layers;
    r->E = r->tr->meta.n_experts;
    r->K = r->tr->meta.top_k;
    r->prec = (moesim_precision)r->set.precision;
    bool stored[PREC_COUNT], policy_only;
    if ((st = memsys_parse_host_precisions(r->set.host_precisions, stored, &policy_only, err)))
        return st;
    sim_schedule_build(&r->sch, r->tr, r->set.batch_size, model_kv_bytes_per_token(r->m),
                       model_recurrent_state_bytes(r->m));
    char bwhere[640], cwhere[640];
    if (config_get(settings, "memory", "budget_gb"))
        config_origin(settings, "memory", "budget_gb", bwhere, sizeof bwhere);
    else
        snprintf(bwhere, sizeof bwhere, "hardware profile %s (hbm_gib)", in->hw->name);
    config_origin(settings, "cache", "experts_per_layer", cwhere, sizeof cwhere);
    if ((st = sim_budget_plan(r->m, in->quant, in->hw, &r->set, r->sch.max_step_tokens,
                              r->sch.kv_peak_bytes, bwhere, cwhere, &r->bud, err)))
        return st;

    /* the policy first: the store holds what it loads (host placement) */
    memsys_config mc = {
        .n_layers = r->L,
        .n_experts = r->E,
        .per_layer = r->bud.per_layer,
        .pool_cap_bytes = r->bud.pool_cap_bytes,
        .chunk_bytes = r->set.chunk_kib * 1024,
        .bounce_bytes = r->set.bounce_mib * 1024 * 1024,
    };
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT && stored[p] && quant_traits_of((moesim_precision)p);
             part++)
            mc.part_bytes[p][part] = model_expert_part_bytes(r->m, in->quant, (expert_part)part,
                                                             (moesim_precision)p);
    memsys_host mh = {.ctx = r, .on_work = on_work, .on_hbm = on_hbm, .reserve = reserve,
                      .release = release};
    memsys_init(&r->ms, &mc, &mh);
    sim_future_init(&r->future, r->tr, &r->sch);
    r->ms.future = &r->future;
    bool emulated = r->tr->meta.lookahead_depth == 0;
    uint32_t D = emulated ? r->set.predictor_depth : r->tr->meta.lookahead_depth;
    r->src = (sim_route_source){r->tr,
                                r->L,
                                r->E,
                                r->K,
                                D,
                                emulated ? (D ? r->K : 0) : r->tr->meta.lookahead_k,
                                emulated && D > 0,
                                r->set.seed,
                                r->set.predictor_accuracy};
    policy_params params = {
        .model = r->m,
        .n_layers = r->L,
        .n_experts = r->E,
        .top_k = r->K,
        .expert_budget_bytes =
            r->bud.per_layer ? r->bud.pool_cap_bytes * r->L : r->bud.expert_budget_bytes,
        .experts_per_layer = r->bud.per_layer ? r->set.experts_per_layer : 0,
        .precision = r->prec,
        .batch_size = r->set.batch_size,
        .lookahead_depth = r->src.la_depth,
        .lookahead_k = r->src.la_k,
        .lookahead_emulated = r->src.la_emulated,
        .seed = r->set.seed,
    };
    memcpy(params.part_bytes, mc.part_bytes, sizeof params.part_bytes);
    r->params = params;
    if ((st = r->pm->create(&r->params, r->knobs, (policy_mem_view){&memsys_ops, &r->ms}, &r->pol,
                            err))) {
        moesim_error_prefix(err, "policy '%s'", r->pm->name);
        return st;
    }
    memsys_attach_policy(&r->ms, r->pm, r->pol);
    /* every expert lives in the file tier: nothing is "on the SSD" of the simulator's model */
    r->route_expert_bytes =
        memsys_place_for_policy(&r->ms, r->pm, r->pol, r->prec, policy_only, UINT64_MAX);
    r->route_capacity = r->bud.per_layer
                            ? r->bud.route_capacity
                            : sim_budget_route_capacity(r->bud.expert_budget_bytes,
                                                        r->route_expert_bytes, r->K, r->E);
    bool in_file[PREC_COUNT];
    for (int p = 0; p < PREC_COUNT; p++) {
        size_t lep0 = memsys_lep(&r->ms, 0, 0, (uint32_t)p);
        in_file[p] = mc.part_bytes[p][0] && !r->ms.on_ssd[lep0];
    }
    r->store = in->cpu_store;
    if (!r->store) {
        if ((st = cpu_store_create(r->m, in_file, in->ssd_dir, in->weight_seed, &r->own_store,
                                   err)))
            return st;
        r->store = r->own_store;
    }
    for (int p = 0; p < PREC_COUNT; p++)
        if (in_file[p] && !r->store->stored[p])
            return moesim_fail(err, MOESIM_EINPUT,
                               "the CPU store lent to the run lacks %s, which policy '%s' loads",
                               precision_name((moesim_precision)p), r->pm->name);
    if ((st = check_formats(r, err))) return st;

    /* the device arena: the expert budget, carved into 4 KiB-aligned blocks per precision */
    r->arena_bytes = r->bud.per_layer ? r->bud.pool_cap_bytes * r->L : r->bud.expert_budget_bytes;
    r->arena_bytes = (r->arena_bytes + 4095) / 4096 * 4096;
    r->arena = moesim_xaligned(4096, r->arena_bytes);
    memset(r->arena, 0, r->arena_bytes); /* touch: page faults do not land in the timed run */
    for (int p = 0; p < PREC_COUNT; p++) {
        uint64_t b = 0;
        for (int part = 0; part < PART_COUNT; part++)
            if (r->store->stored[p] && r->store->part_bytes[p][part] > b)
                b = r->store->part_bytes[p][part];
        r->block_bytes[p] = (b + 4095) / 4096 * 4096;
    }
    r->part_ptr = moesim_xcalloc((size_t)r->L * r->E * PREC_COUNT * PART_COUNT, sizeof(uint8_t *));

    size_t MT = r->sch.max_step_tokens, DK = (size_t)r->src.la_depth * r->src.la_k;
    r->r_experts = moesim_xcalloc(MT * r->K, sizeof(uint16_t));
    r->r_gates = moesim_xcalloc(MT * r->K, sizeof(float));
    if (r->tr->importance) r->r_importance = moesim_xcalloc(MT, sizeof(float));
    if (DK) {
        r->r_la_ids = moesim_xcalloc(MT * DK, sizeof(uint16_t));
        r->r_la_scores = moesim_xcalloc(MT * DK, sizeof(float));
    }
    r->active = moesim_xcalloc(r->E, sizeof(uint16_t));
    r->active_tokens = moesim_xcalloc(r->E, sizeof(uint32_t));
    r->active_gate = moesim_xcalloc(r->E, sizeof(float));
    r->plan = moesim_xcalloc(r->E, 1);
    r->stamp = moesim_xcalloc(r->E, sizeof(uint32_t));
    r->slot = moesim_xcalloc(r->E, sizeof(uint32_t));
    r->order = moesim_xcalloc(r->E, sizeof(uint32_t));
    r->order_key = moesim_xcalloc(r->E, sizeof(uint64_t));
    r->step_tokens = moesim_xcalloc(MT, sizeof(uint32_t));
    r->step_req = moesim_xcalloc(MT, sizeof(uint32_t));
    r->step_pos = moesim_xcalloc(MT, sizeof(uint32_t));
    r->step_start = moesim_xcalloc(r->sch.n_steps, sizeof(uint64_t));
    r->step_end = moesim_xcalloc(r->sch.n_steps, sizeof(uint64_t));
    r->layer_ns = moesim_xcalloc(r->L, sizeof(uint64_t));
    uint32_t max_ctx = 1;
    for (uint64_t i = 0; i < r->tr->n_tokens; i++)
        if (r->tr->position[i] + 1 > max_ctx) max_ctx = r->tr->position[i] + 1;
    cpu_compute_init(&r->cc, r->m, max_ctx, in->weight_seed);
    if (in->timeline_path &&
        (st = sim_timeline_open(&r->tl, in->timeline_path, &in->timeline_window, err)))
        return st;
    pthread_mutex_init(&r->lock, NULL);
    cpu_copier_start(&r->cp, &r->lock, &r->ms, r->store, part_block, r, mc.chunk_bytes, 0,
                     r->tl.on);
    return MOESIM_OK;
}

static void cpu_result(cpu_run *r, sim_result *out, replay_checks *checks) {
    uint64_t makespan = r->sch.n_steps ? r->step_end[r->sch.n_steps - 1] : 0;
    snprintf(out->policy, sizeof out->policy, "%s", r->pm->name);
    sim_result_set_latency(out, &r->sch, r->step_start, r->step_end, r->hooks);
    out->tokens = r->tr->n_tokens;
    out->requests = r->sch.n_requests;
    out->makespan_ms = (double)makespan / 1e6;
    out->tokens_per_s = makespan ? (double)r->tr->n_tokens * 1e9 / (double)makespan : 0;
    out->hit_rate = r->tally.accesses ? (double)r->tally.hits / (double)r->tally.accesses : 0;
    out->h2d_bytes = r->ms.n.h2d_bytes;
    out->stall_ms = (double)r->stall_ns / 1e6;
    out->budget_bytes = r->bud.budget_bytes;
    out->expert_budget_bytes = r->bud.expert_budget_bytes;
    out->kv_peak_bytes = r->sch.kv_peak_bytes;
    double mass = r->tally.gate_hi + r->tally.gate_lo + r->tally.gate_skip;
    out->precision_mix_hi = mass > 0 ? r->tally.gate_hi / mass : 0;
    out->precision_mix_lo = mass > 0 ? r->tally.gate_lo / mass : 0;
    out->precision_mix_skip = mass > 0 ? r->tally.gate_skip / mass : 0;
    out->bits_per_weight = sim_route_tally_bits_per_weight(&r->tally);
    out->prefetch_accuracy = r->pf_active ? (double)r->pf_hit / (double)r->pf_active : 0;
    out->prefetch_utilization =
        r->pf_issued_sets ? (double)r->pf_hit / (double)r->pf_issued_sets : 0;
    out->prefetches = r->ms.n.prefetches;
    out->prefetch_late = r->ms.n.late;
    out->prefetch_promoted = r->ms.n.promoted;
    out->prefetch_cancelled = r->ms.n.cancelled;
    out->prefetch_wasted_bytes = r->ms.n.wasted_bytes;
    out->predictor_emulated = r->src.la_emulated;
    out->predictor_accuracy = r->src.la_emulated ? r->set.predictor_accuracy : 0;
    out->accesses = r->tally.accesses;
    out->hits = r->tally.hits;
    out->skipped_accesses = r->tally.skipped;
    out->expert_ops = r->expert_ops;
    out->warmup_h2d_bytes = r->ms.n.warmup_bytes;
    out->steps = r->sch.n_steps;
    out->sub_routes = r->sub_routes;
    out->h2d_busy_ms = (double)r->cp.busy_ns / 1e6;
    if (r->pm->report) {
        const char *names[SIM_POLICY_REPORT_MAX];
        double values[SIM_POLICY_REPORT_MAX];
        size_t n = r->pm->report(r->pol, names, values, SIM_POLICY_REPORT_MAX);
        out->n_policy_report = n;
        for (size_t i = 0; i < n; i++) {
            snprintf(out->policy_report_names[i], sizeof out->policy_report_names[i], "%s",
                     names[i]);
            out->policy_report_values[i] = values[i];
        }
    }
    if (checks) {
        memset(checks, 0, sizeof *checks);
        checks->device_alloc_bytes = r->arena_bytes;
        checks->physical_refusals = r->physical_refusals;
        checks->h2d_gb_per_s = r->cp.busy_ns ? (double)r->cp.bytes / (double)r->cp.busy_ns : 0;
    }
}

/* Copy chunks into the timeline (the copier recorded them). */
static void timeline_copies(cpu_run *r) {
    static const char *const cls[MEMSYS_CLASSES] = {"demand", "prefetch", "background"};
    char name[96];
    for (uint64_t i = 0; i < r->cp.n_rec; i++) {
        const cpu_copy_record *c = &r->cp.rec[i];
        snprintf(name, sizeof name, "L%u e%u %s %s", c->layer, c->expert,
                 precision_name((moesim_precision)c->prec), cls[c->cls]);
        sim_timeline_slice(&r->tl, SIM_TRACK_H2D, cls[c->cls], name, c->t0_ns, c->t1_ns);
    }
}

static void cpu_teardown(cpu_run *r) {
    cpu_copier_stop(&r->cp);
    if (r->pm && r->pol) r->pm->destroy(r->pol);
    free(r->knobs);
    memsys_free(&r->ms);
    sim_future_free(&r->future);
    sim_schedule_free(&r->sch);
    cpu_store_destroy(r->own_store);
    sim_timeline_abort(&r->tl);
    free(r->arena);
    for (int p = 0; p < PREC_COUNT; p++) free(r->free_blocks[p]);
    free(r->part_ptr);
    void *bufs[] = {r->r_experts, r->r_gates,     r->r_importance, r->r_la_ids, r->r_la_scores,
                    r->active,    r->active_tokens, r->active_gate, r->plan,     r->stamp,
                    r->slot,      r->order,       r->order_key,    r->step_tokens, r->step_req,
                    r->step_pos,  r->step_start,  r->step_end,     r->layer_ns};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    cpu_compute_free(&r->cc);
}

moesim_status replay_run_cpu(const replay_inputs *in, const char *policy_name, config *settings,
                             sim_result *out, replay_checks *checks, moesim_error *err) {
    MOESIM_ASSERT(in && in->trace && in->model && in->hw && in->quant && policy_name && out);
    memset(out, 0, sizeof *out);
    cpu_run *r = moesim_xcalloc(1, sizeof *r);
    moesim_status st = cpu_setup(r, in, policy_name, settings, err);
    if (st == MOESIM_OK) {
        run_steps(r);
        if (r->cp.failed)
            st = moesim_fail(err, MOESIM_EIO, "%s: reading experts: %s", r->store->path,
                             strerror(r->cp.io_errno));
    }
    if (st == MOESIM_OK) {
        cpu_result(r, out, checks);
        if (r->tl.on) timeline_copies(r);
        st = sim_timeline_close(&r->tl, err);
    }
    cpu_teardown(r);
    free(r);
    return st;
}
