/* The `cpu` backend of the replay executor (replay/exec.h; replay_run_cpu): a real execution of
 * the simulator's run on any machine. The "device" is a DRAM arena of the run's expert budget
 * carved into 4 KiB-aligned blocks per precision (core/block_pool.h); the tier experts load from is
 * a file on local disk read with O_DIRECT (replay/cpu_store.h) by a copy thread
 * (replay/cpu_copier.h) that serves the memory system's queue chunk by chunk in class order;
 * compute runs on the executor's thread with the engine's CPU kernels at the planned precision
 * (replay/cpu_compute.h), so an op is timed by the host clock as it runs and is done when it
 * returns. Compare with sim_run under a CPU profile (configs/hw/README.md, "CPU kind": the [pcie]
 * link is the disk).
 *
 * Activations and the KV buffer are synthetic (routing comes from the trace); the weights are a
 * checkpoint's (`--model DIR`, converted as the cuda backend converts them) or synthetic (the
 * store's seeded blobs, non-expert weights seeded random bf16). What is timed is shapes and
 * bytes. The copy thread shares the memory system under the executor's lock (x->lock). */
#define _GNU_SOURCE /* cpu_set_t (replay/cpu_pin.h) */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "replay/cpu_compute.h"
#include "replay/cpu_copier.h"
#include "replay/cpu_pin.h"
#include "replay/cpu_store.h"
#include "replay/exec.h"

typedef struct cpu_backend {
    pthread_mutex_t lock;
    bool lock_live;
    cpu_copier cp;
    const cpu_store *store; /* borrowed (replay_inputs.cpu_store) or own_store */
    cpu_store *own_store;
    uint8_t *arena; /* [arena_bytes] the pools' blocks */
    uint64_t arena_bytes;
    cpu_compute cc; /* weights, activations and the ops */
    cpu_pin pin;    /* the two threads' CPUs (replay/cpu_pin.h), restored at teardown */

    /* the op being timed (op_begin .. op_end) */
    uint64_t op_t0;
    const char *op_cat;
    char op_name[80];
    int op_layer;
    uint64_t landed_ns; /* when the parts expert_wait waited for landed, or REPLAY_NO_NEED */
} cpu_backend;

static cpu_backend *be_of(const replay_exec *x) { return x->be_state; }

static uint8_t *part_block(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p,
                           int part) {
    replay_exec *x = ctx;
    size_t pi = memsys_lep(&x->ms, layer, expert, p) * PART_COUNT + (size_t)part;
    return be_of(x)->arena + block_pool_offset(&x->pool, pi);
}

/* ---- setup ---- */

/* Every expert lives in the file tier: nothing is "on the SSD" of the simulator's model. */
static uint64_t cpu_placement_dram(const replay_exec *x) {
    (void)x;
    return UINT64_MAX;
}

/* The store's bytes are what the memory system counts: the kernels' formats must be the
 * simulator's accounting formats (configs/quant.ini), or the two would not compare. */
static moesim_status check_formats(const replay_exec *x, const cpu_store *s, moesim_error *err) {
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT && s->stored[p]; part++) {
            uint64_t acct =
                model_expert_part_bytes(x->m, &x->quant, (expert_part)part, (moesim_precision)p);
            if (acct != s->part_bytes[p][part])
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s: configs/quant.ini counts %" PRIu64 " bytes per expert "
                                   "part, the CPU kernels store %" PRIu64 ": the replay would not "
                                   "move what the simulator counts",
                                   precision_name((moesim_precision)p), acct,
                                   s->part_bytes[p][part]);
        }
    return MOESIM_OK;
}

static moesim_status cpu_setup(replay_exec *x, moesim_error *err) {
    cpu_backend *b = moesim_xcalloc(1, sizeof *b);
    x->be_state = b;
    /* the "device" (the expert budget) is this machine's memory: checked before the store */
    b->arena_bytes = block_pool_arena_bytes(x->bud.per_layer, x->bud.pool_cap_bytes, x->L,
                                            x->bud.expert_budget_bytes);
    double have = moesim_physical_memory_bytes();
    if (have > 0 && (double)b->arena_bytes > have)
        return moesim_fail(err, MOESIM_EINPUT,
                           "memory.budget_gb: the CPU backend holds the expert budget (%.1f GiB) "
                           "in this machine's memory, which has %.1f GiB (expected a lower "
                           "memory.budget_gb)",
                           (double)b->arena_bytes / (1u << 30), have / (1u << 30));
    moesim_status st;
    bool in_file[PREC_COUNT];
    for (int p = 0; p < PREC_COUNT; p++)
        in_file[p] = x->part_bytes[p][0] && !x->ms.on_ssd[memsys_lep(&x->ms, 0, 0, (uint32_t)p)];
    b->store = x->in->cpu_store;
    if (!b->store) {
        if ((st = cpu_store_create(x->m, in_file, x->in->ssd_dir, x->in->weight_seed,
                                   x->in->weights, &b->own_store, err)))
            return st;
        b->store = b->own_store;
    }
    for (int p = 0; p < PREC_COUNT; p++)
        if (in_file[p] && !b->store->stored[p])
            return moesim_fail(err, MOESIM_EINPUT,
                               "the CPU store lent to the run lacks %s, which policy '%s' loads",
                               precision_name((moesim_precision)p), x->pm->name);
    if ((st = check_formats(x, b->store, err))) return st;

    /* the "device": the expert budget, carved into 4 KiB-aligned blocks per precision */
    b->arena = cpu_store_dma_alloc(b->arena_bytes);
    uint64_t held_bytes[PREC_COUNT][PART_COUNT] = {{0}}, block_bytes[PREC_COUNT];
    for (int p = 0; p < PREC_COUNT; p++)
        if (b->store->stored[p])
            memcpy(held_bytes[p], b->store->part_bytes[p], sizeof held_bytes[p]);
    block_pool_block_bytes(held_bytes, block_bytes);
    block_pool_init(&x->pool, b->arena_bytes, block_bytes,
                    (size_t)x->L * x->E * PREC_COUNT * PART_COUNT);

    cpu_compute_init(&b->cc, x->m, replay_exec_max_context(x), x->in->weight_seed, x->in->weights);
    pthread_mutex_init(&b->lock, NULL);
    b->lock_live = true;
    x->lock = &b->lock;
    cpu_copier_start(&b->cp, &b->lock, &x->ms, b->store, part_block, x, x->ms.cfg.chunk_bytes, 0,
                     x->tl.on);
    cpu_pin_pair(&b->pin, b->cp.thread);
    return MOESIM_OK;
}

static void cpu_teardown(replay_exec *x) {
    cpu_backend *b = be_of(x);
    if (!b) return;
    if (b->lock_live) cpu_copier_stop(&b->cp);
    cpu_pin_restore(&b->pin);
    cpu_store_destroy(b->own_store);
    free(b->arena);
    cpu_compute_free(&b->cc);
    if (b->lock_live) pthread_mutex_destroy(&b->lock);
    x->lock = NULL;
    free(b);
    x->be_state = NULL;
}

/* ---- copies ---- */

static void cpu_copy_kick(replay_exec *x, int engine) { cpu_copier_on_work(&be_of(x)->cp, engine); }

/* The loads of warm-up, read from the file before the clock starts. */
static void cpu_warm_copy(replay_exec *x) {
    cpu_backend *b = be_of(x);
    for (uint32_t i = 0; i < x->ms.n_warm; i++) {
        uint32_t lep = x->ms.warm[i], p = memsys_lep_precision(&x->ms, lep),
                 le = memsys_lep_le(&x->ms, lep);
        for (int part = 0; part < PART_COUNT; part++)
            if (x->ms.warm_parts[i] & (1u << part))
                MOESIM_ASSERT(cpu_store_read(
                    b->store,
                    cpu_store_part_offset(b->store, le / x->E, le % x->E, (moesim_precision)p,
                                          (expert_part)part),
                    b->store->part_bytes[p][part],
                    b->arena + block_pool_offset(&x->pool, (size_t)lep * PART_COUNT + part),
                    b->cp.bounce));
    }
}

static void cpu_clock_start(replay_exec *x) {
    x->t0_ns = replay_exec_clock_ns();
    be_of(x)->cp.t0_ns = x->t0_ns;
}

/* Reports the copier's completed transfers to the policy, on this thread. */
static void deliver(replay_exec *x) {
    replay_exec_lock(x);
    cpu_copier_deliver(&be_of(x)->cp);
    replay_exec_unlock(x);
}

static void cpu_step_begin(replay_exec *x, uint64_t step) {
    (void)step;
    deliver(x);
}

static void cpu_step_end(replay_exec *x, uint64_t step) {
    (void)step;
    deliver(x);
}

static bool cpu_wait_copy(replay_exec *x) {
    cpu_backend *b = be_of(x);
    if (b->cp.failed) return false;
    cpu_copier_wait(&b->cp);
    cpu_copier_deliver(&b->cp);
    return !b->cp.failed;
}

static bool parts_resident(const replay_exec *x, uint32_t layer, uint32_t expert,
                           moesim_precision p, uint32_t mask) {
    size_t base = memsys_lep(&x->ms, layer, expert, p) * PART_COUNT;
    for (int part = 0; part < PART_COUNT; part++)
        if ((mask & (1u << part)) && x->ms.state[base + part] != POLICY_RESIDENT) return false;
    return true;
}

/* An op on the parts can run once they landed: the stream stalls until then. */
static void cpu_expert_wait(replay_exec *x, uint32_t layer, uint32_t expert, moesim_precision p,
                            uint32_t mask) {
    cpu_backend *b = be_of(x);
    b->landed_ns = REPLAY_NO_NEED;
    replay_exec_lock(x);
    if (!parts_resident(x, layer, expert, p, mask)) {
        while (!parts_resident(x, layer, expert, p, mask) && !b->cp.failed) cpu_copier_wait(&b->cp);
        b->landed_ns = replay_exec_now(x);
    }
    cpu_copier_deliver(&b->cp);
    replay_exec_unlock(x);
}

/* ---- compute ---- */

static void cpu_op_begin(replay_exec *x, const char *cat, const char *name, int moe_layer) {
    cpu_backend *b = be_of(x);
    b->op_cat = cat;
    snprintf(b->op_name, sizeof b->op_name, "%s", name);
    b->op_layer = moe_layer;
    b->op_t0 = replay_exec_now(x);
}

static void cpu_op_end(replay_exec *x) {
    cpu_backend *b = be_of(x);
    replay_op_times t = {b->op_t0, replay_exec_now(x), REPLAY_NO_NEED, -1};
    replay_exec_op_done(x, b->op_cat, b->op_name, b->op_layer, &t);
}

static void cpu_run(replay_exec *x, const run_op *op) {
    cpu_compute *cc = &be_of(x)->cc;
    switch (op->kind) {
    case RUN_OP_ATTENTION:
        cpu_compute_attention(cc, op->layer, x->loop.step_pos, op->n_tokens);
        break;
    case RUN_OP_DENSE:
        cpu_compute_dense(cc, op->layer, op->n_tokens);
        break;
    case RUN_OP_ROUTER:
        cpu_compute_router(cc, op->layer, op->n_tokens);
        break;
    case RUN_OP_SHARED:
        cpu_compute_shared(cc, op->layer, op->n_tokens);
        break;
    case RUN_OP_COMBINE:
        cpu_compute_combine(cc, op->n_tokens);
        break;
    case RUN_OP_LM_HEAD:
        cpu_compute_lm_head(cc, op->n_tokens);
        break;
    }
}

static void cpu_expert(replay_exec *x, uint32_t layer, uint32_t expert, moesim_precision p,
                       uint32_t tokens, uint32_t mask) {
    cpu_backend *b = be_of(x);
    size_t base = memsys_lep(&x->ms, layer, expert, p) * PART_COUNT;
    const uint8_t *blk[PART_COUNT];
    for (int part = 0; part < PART_COUNT; part++)
        blk[part] =
            (mask & (1u << part)) ? b->arena + block_pool_offset(&x->pool, base + part) : NULL;
    for (int op = 0; op < 2; op++) {
        uint32_t need = op == 0 ? 1u << PART_GATE | 1u << PART_UP : 1u << PART_DOWN;
        if (!(mask & need)) continue;
        replay_exec_lock(x);
        bool landed = parts_resident(x, layer, expert, p, need);
        replay_exec_unlock(x);
        if (x->tl.on)
            replay_exec_expert_name(b->op_name, sizeof b->op_name, layer, expert, p, tokens,
                                    op == 0 ? PART_GATE : PART_DOWN);
        replay_op_times t = {replay_exec_now(x), 0, b->landed_ns, landed ? 0 : 1};
        if (op == 0)
            cpu_compute_expert_gate_up(&b->cc, p, blk[PART_GATE], blk[PART_UP], tokens);
        else
            cpu_compute_expert_down(&b->cc, p, blk[PART_DOWN], tokens);
        t.t1_ns = replay_exec_now(x);
        replay_exec_op_done(x, "expert", b->op_name, (int)layer, &t);
    }
}

/* ---- the end ---- */

static void cpu_drain(replay_exec *x) {
    cpu_backend *b = be_of(x);
    while (!b->cp.failed && cpu_copier_busy(&b->cp)) cpu_copier_wait(&b->cp);
    cpu_copier_deliver(&b->cp);
}

static moesim_status cpu_io_status(replay_exec *x, moesim_error *err) {
    cpu_backend *b = be_of(x);
    if (!b->cp.failed) return MOESIM_OK;
    return moesim_fail(err, MOESIM_EIO, "%s: reading experts: %s", b->store->path,
                       strerror(b->cp.io_errno));
}

/* Busy time and bytes of the copy thread; its chunks into the timeline (it recorded them). */
static void cpu_finish(replay_exec *x) {
    static const char *const cls[MEMSYS_CLASSES] = {"demand", "prefetch", "background"};
    cpu_backend *b = be_of(x);
    x->h2d_busy_ns = b->cp.busy_ns;
    x->h2d_copied_bytes = b->cp.bytes;
    x->device_alloc_bytes = b->arena_bytes;
    char name[96];
    for (uint64_t i = 0; x->tl.on && i < b->cp.n_rec; i++) {
        const cpu_copy_record *c = &b->cp.rec[i];
        snprintf(name, sizeof name, "L%u e%u %s %s", c->layer, c->expert,
                 precision_name((moesim_precision)c->prec), cls[c->cls]);
        sim_timeline_slice(&x->tl, SIM_TRACK_H2D, cls[c->cls], name, c->t0_ns, c->t1_ns);
    }
}

const replay_backend replay_backend_cpu = {
    .name = "cpu",
    .check = NULL,
    .placement_dram = cpu_placement_dram,
    .setup = cpu_setup,
    .teardown = cpu_teardown,
    .copy_kick = cpu_copy_kick,
    .part_released = NULL,
    .warm_copy = cpu_warm_copy,
    .clock_start = cpu_clock_start,
    .step_begin = cpu_step_begin,
    .step_end = cpu_step_end,
    .wait_compute = NULL,
    .wait_copy = cpu_wait_copy,
    .expert_wait = cpu_expert_wait,
    .op_begin = cpu_op_begin,
    .run = cpu_run,
    .op_end = cpu_op_end,
    .expert = cpu_expert,
    .drain = cpu_drain,
    .io_status = cpu_io_status,
    .finish = cpu_finish,
};

moesim_status replay_run_cpu(const replay_inputs *in, const char *policy_name, config *settings,
                             sim_result *out, replay_checks *checks, moesim_error *err) {
    return replay_exec_run(&replay_backend_cpu, in, policy_name, settings, out, checks, err);
}
