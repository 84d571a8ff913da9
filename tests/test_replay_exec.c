/* The replay executor (replay/exec.h) on the backend every machine has (cpu), and the pool blocks
 * both backends share (core/block_pool.h): the executor runs the simulator's schedule and routes
 * (same steps, sub-routes and accesses as sim_run on the same trace and settings), no expert op
 * starts before its parts landed, the budget holds, and the pools reuse blocks per precision.
 * A backend that queues its ops, as the cuda one does, is stood in for by a deferred backend
 * here: the executor's asynchronous path (wait for the stream before a route, unpin only then)
 * runs on every machine. */
#define _GNU_SOURCE /* pthread_getaffinity_np */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "replay/cpu_store.h"
#include "replay/exec.h"
#include "replay/replay.h"
#include "core/block_pool.h"
#include "sim/sim.h"
#include "sim_fixtures.h"
#include "support/test_support.h"

static quant_table quant;

static void setup(void) {
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
}

TestSuite(replay_exec, .init = setup);

/* ---- pool blocks ---- */

Test(replay_exec, pool_reuses_freed_blocks_by_precision_and_refuses_what_no_block_can_hold) {
    uint64_t block[PREC_COUNT] = {0};
    block[PREC_BF16] = 8192;
    block[PREC_INT4] = 4096;
    block_pool p;
    block_pool_init(&p, 16384, block, 12);
    /* gate and up at int4, down at bf16: the arena is cut in order and full */
    cr_assert(block_pool_reserve(&p, 0, PREC_INT4, 1u << PART_GATE | 1u << PART_UP));
    cr_assert_eq(block_pool_offset(&p, 0 + PART_GATE), 0);
    cr_assert_eq(block_pool_offset(&p, 0 + PART_UP), 4096);
    cr_assert(block_pool_reserve(&p, 3, PREC_BF16, 1u << PART_DOWN));
    cr_assert_eq(block_pool_offset(&p, 3 + PART_DOWN), 8192);
    /* three more int4 parts: none fits, and none is taken */
    cr_assert_not(block_pool_reserve(&p, 6, PREC_INT4, POLICY_PARTS_ALL));
    cr_assert_eq(p.refusals, 1);
    cr_assert_eq(p.part_off[6 + PART_GATE], BLOCK_POOL_NONE);
    /* a freed int4 block serves the next int4 part */
    block_pool_release(&p, 0 + PART_GATE, PREC_INT4);
    cr_assert(block_pool_reserve(&p, 9, PREC_INT4, 1u << PART_GATE));
    cr_assert_eq(block_pool_offset(&p, 9 + PART_GATE), 0);
    /* a freed bf16 block does not serve an int4 part: blocks are carved per precision */
    block_pool_release(&p, 3 + PART_DOWN, PREC_BF16);
    cr_assert_not(block_pool_reserve(&p, 6, PREC_INT4, 1u << PART_DOWN));
    cr_assert_eq(p.refusals, 2);
    cr_assert(block_pool_reserve(&p, 6, PREC_BF16, 1u << PART_DOWN));
    cr_assert_eq(block_pool_offset(&p, 6 + PART_DOWN), 8192);
    block_pool_free(&p);
}

/* ---- the host tier of the cpu backend ---- */

Test(replay_exec, dma_buffers_are_huge_page_aligned_and_zeroed) {
    uint8_t *p = cpu_store_dma_alloc(3 * 1048576 + 17);
    cr_assert_eq((uintptr_t)p % (2u << 20), 0);
    for (size_t i = 0; i < 4u << 20; i += 4096) cr_assert_eq(p[i], 0, "byte %zu", i);
    free(p);
}

Test(replay_exec, the_expert_file_is_on_disk_nameless_and_out_of_the_page_cache_when_created) {
    /* a dirty or cached copy would make the first O_DIRECT reads (calibration's) wait for
     * writeback or differ from later ones */
    model_geometry m = fixture_model(2, 4, 2);
    bool stored[PREC_COUNT] = {[PREC_INT4] = true};
    cpu_store *s = NULL;
    moesim_error err = {0};
    cr_assert_eq(cpu_store_create(&m, stored, NULL, 3, NULL, &s, &err), MOESIM_OK, "%s", err.msg);
    /* no name on disk: a replay killed mid-run leaves nothing behind */
    cr_expect_neq(access(s->path, F_OK), 0, "%s still exists", s->path);
    long page = sysconf(_SC_PAGESIZE);
    size_t pages = (size_t)((s->file_bytes + (uint64_t)page - 1) / (uint64_t)page);
    char by_fd[64];
    snprintf(by_fd, sizeof by_fd, "/proc/self/fd/%d", s->fd);
    int fd = open(by_fd, O_RDONLY);
    cr_assert_geq(fd, 0);
    void *map = mmap(NULL, s->file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    cr_assert_neq(map, MAP_FAILED);
    unsigned char *in_core = calloc(pages, 1);
    cr_assert_eq(mincore(map, s->file_bytes, in_core), 0);
    size_t cached = 0;
    for (size_t i = 0; i < pages; i++) cached += in_core[i] & 1;
    cr_expect_eq(cached, 0, "%zu of %zu pages of the expert file are in the page cache", cached,
                 pages);
    /* and what a direct read returns is the expert's blob */
    uint64_t blob_bytes = s->part_bytes[PREC_INT4][0] + s->part_bytes[PREC_INT4][1] +
                          s->part_bytes[PREC_INT4][2];
    uint8_t *want = cpu_store_expert_blob(&m, PREC_INT4, 3);
    uint8_t *got = cpu_store_dma_alloc(s->stride[PREC_INT4]);
    cr_assert(cpu_store_read(s, cpu_store_part_offset(s, 1, 3, PREC_INT4, PART_GATE),
                             s->stride[PREC_INT4], got, NULL));
    cr_expect_eq(memcmp(got, want, blob_bytes), 0);
    /* the same bytes when read as one request into two blocks (a chunk across a part boundary),
     * and piece by piece when a piece is not aligned */
    uint64_t gate = s->part_bytes[PREC_INT4][PART_GATE];
    cr_assert_eq(gate % CPU_STORE_ALIGN, 0, "the fixture's parts are whole pages");
    uint8_t *second = cpu_store_dma_alloc(s->stride[PREC_INT4]);
    uint8_t *bounce = cpu_store_dma_alloc(s->stride[PREC_INT4] + 2 * CPU_STORE_ALIGN);
    for (uint64_t first_len = gate; first_len >= gate - 100; first_len -= 100) {
        memset(got, 0, s->stride[PREC_INT4]);
        memset(second, 0, s->stride[PREC_INT4]);
        struct iovec iov[2] = {{got, first_len}, {second, blob_bytes - first_len}};
        cr_assert(cpu_store_read_pieces(s, cpu_store_part_offset(s, 1, 3, PREC_INT4, PART_GATE),
                                        iov, 2, bounce));
        cr_expect_eq(memcmp(got, want, first_len), 0, "first piece of %" PRIu64, first_len);
        cr_expect_eq(memcmp(second, want + first_len, blob_bytes - first_len), 0,
                     "second piece after %" PRIu64, first_len);
    }
    free(bounce);
    free(second);
    free(got);
    free(want);
    free(in_core);
    munmap(map, s->file_bytes);
    close(fd);
    cpu_store_destroy(s);
}

/* ---- the executor on the cpu backend ---- */

/* What the on_expert_start hook saw: every op's parts must be resident when it starts. */
typedef struct expert_starts {
    uint64_t ops, not_resident, masks_seen;
} expert_starts;

static void on_expert_start(void *ctx, policy_mem_view mem, uint32_t layer, uint32_t expert,
                            moesim_precision prec, uint32_t mask, uint64_t t_ns) {
    (void)t_ns;
    expert_starts *c = ctx;
    c->ops++;
    c->masks_seen |= 1u << mask;
    c->not_resident += fixture_parts_not_resident(mem, layer, expert, prec, mask);
}

/* The settings of a case: per-layer pools of 3 of 8 experts, so experts are loaded and evicted
 * all run long. */
static config *settings(const char *extra) {
    moesim_error err = {0};
    config *c = config_create();
    const char *sets[] = {"cache.experts_per_layer=3", "expert.precision=int4",
                          "sim.host_precisions=int4,int2", extra};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        if (sets[i]) cr_assert_eq(config_set(c, sets[i], &err), MOESIM_OK, "%s", err.msg);
    return c;
}

typedef struct replay_case {
    model_geometry m;
    hw_profile hw;
    trace *t;
} replay_case;

static replay_case make_case(void) {
    replay_case rc = {fixture_model(2, 8, 2), fixture_hw(), NULL};
    rc.t = fixture_trace(&rc.m, 2, 6, 5, 1.0, 11);
    cr_assert(rc.t);
    return rc;
}

/* Runs `policy_name` through sim_run and the cpu replay with the same settings; false when the
 * simulator refuses the configuration (a policy may not work in it). */
static bool run_both(const replay_case *rc, const char *policy_name, const char *extra,
                     sim_result *sim, sim_result *real, replay_checks *ck, expert_starts *starts) {
    moesim_error err = {0};
    config *c = settings(extra);
    sim_inputs si = {.trace = rc->t, .model = &rc->m, .hw = &rc->hw, .quant = &quant};
    moesim_status st = sim_run(&si, policy_name, c, sim, &err);
    config_destroy(c);
    if (st) return false;
    sim_hooks hooks = {.ctx = starts, .on_expert_start = on_expert_start};
    replay_inputs ri = {.trace = rc->t,
                        .model = &rc->m,
                        .hw = &rc->hw,
                        .quant = &quant,
                        .hooks = &hooks,
                        .weight_seed = 5};
    c = settings(extra);
    st = replay_run_cpu(&ri, policy_name, c, real, ck, &err);
    config_destroy(c);
    cr_assert_eq(st, MOESIM_OK, "policy %s: %s", policy_name, err.msg);
    return true;
}

Test(replay_exec, an_expert_file_the_disk_cannot_hold_fails_at_once_and_leaves_nothing) {
    /* a file-size limit below the file stands in for a full disk: the reservation is refused
     * before anything is written (SIGXFSZ ignored, as a shell with `ulimit -f` would) */
    model_geometry m = fixture_model(2, 4, 2);
    bool stored[PREC_COUNT] = {[PREC_BF16] = true};
    char dir[] = "/var/tmp/moesim-test-no-room-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &limit), 0);
    cpu_store *s = NULL;
    moesim_error err = {0};
    moesim_status st = cpu_store_create(&m, stored, dir, 3, NULL, &s, &err);
    limit.rlim_cur = RLIM_INFINITY;
    setrlimit(RLIMIT_FSIZE, &limit);
    cr_expect_eq(st, MOESIM_EIO);
    cr_expect_null(s);
    cr_expect(strstr(err.msg, dir) && strstr(err.msg, "reserving the expert file") &&
                  !strchr(err.msg, '\n'),
              "%s", err.msg);
    cr_expect_eq(rmdir(dir), 0, "%s is not empty", dir);
}

Test(replay_exec, cpu_backend_runs_the_simulators_routes_and_no_expert_before_its_copy,
     .timeout = 600) {
    replay_case rc = make_case();
    size_t n_pol;
    const policy_methods *const *all = policy_all(&n_pol);
    uint32_t ran = 0;
    for (size_t i = 0; i < n_pol; i++) {
        sim_result sim, real;
        replay_checks ck;
        expert_starts starts = {0};
        if (!run_both(&rc, all[i]->name, NULL, &sim, &real, &ck, &starts)) continue;
        const char *name = all[i]->name;
        ran++;
        cr_expect_eq(real.steps, sim.steps, "%s", name);
        cr_expect_eq(real.sub_routes, sim.sub_routes, "%s", name);
        cr_expect_eq(real.tokens, sim.tokens, "%s", name);
        cr_expect_eq(real.accesses + real.skipped_accesses, sim.accesses + sim.skipped_accesses,
                     "%s", name);
        /* part overlap (the default): gate+up, then down, each checked against its copy */
        cr_expect_gt(real.expert_ops, 0, "%s", name);
        cr_expect_eq(ck.order_checked, 2 * real.expert_ops, "%s", name);
        cr_expect_eq(ck.order_violations, 0, "%s", name);
        cr_expect_eq(starts.ops, 2 * real.expert_ops, "%s", name);
        cr_expect_eq(starts.not_resident, 0, "%s", name);
        cr_expect_gt(real.h2d_bytes, 0, "%s: 3 of 8 experts per layer must be loaded", name);
        cr_expect_leq(real.peak_hbm_bytes, real.budget_bytes, "%s", name);
        cr_expect_gt(real.tpot.mean_ms, 0, "%s", name);
    }
    cr_assert_geq(ran, 6, "only %u policies ran", ran);
    trace_destroy(rc.t);
}

/* One cpu replay of `policy_name`, the trace in memory or (ts) as a stream. */
static void replay_one(const replay_case *rc, trace_stream *ts, const char *policy_name,
                       sim_result *real) {
    moesim_error err = {0};
    replay_inputs ri = {.trace = ts ? trace_stream_tokens(ts) : rc->t,
                        .stream = ts,
                        .model = &rc->m,
                        .hw = &rc->hw,
                        .quant = &quant,
                        .weight_seed = 5};
    config *c = settings(NULL);
    moesim_status st = replay_run_cpu(&ri, policy_name, c, real, NULL, &err);
    config_destroy(c);
    cr_assert_eq(st, MOESIM_OK, "policy %s: %s", policy_name, err.msg);
}

Test(replay_exec, cpu_backend_on_a_streamed_trace_runs_the_steps_and_routes_of_the_trace_in_memory,
     .timeout = 300) {
    replay_case rc = make_case();
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("replay-stream.h5"));
    moesim_error err = {0};
    cr_assert_eq(trace_write(rc.t, path, &err), MOESIM_OK, "%s", err.msg);
    const char *policies[] = {"lru", "oracle"}; /* oracle: the future from the requests */
    for (size_t i = 0; i < 2; i++) {
        trace_stream *ts = NULL;
        cr_assert_eq(trace_stream_open(path, &ts, &err), MOESIM_OK, "%s", err.msg);
        trace_stream_set_cache(ts, 7, 2); /* blocks of 7 tokens: many block reads */
        sim_result whole, streamed;
        replay_one(&rc, NULL, policies[i], &whole);
        replay_one(&rc, ts, policies[i], &streamed);
        const char *name = policies[i];
        cr_expect_gt(trace_stream_blocks_read(ts), 2, "%s", name);
        cr_expect_eq(streamed.steps, whole.steps, "%s", name);
        cr_expect_eq(streamed.sub_routes, whole.sub_routes, "%s", name);
        cr_expect_eq(streamed.tokens, whole.tokens, "%s", name);
        cr_expect_eq(streamed.requests, whole.requests, "%s", name);
        cr_expect_eq(streamed.accesses, whole.accesses, "%s", name);
        cr_expect_eq(streamed.expert_ops, whole.expert_ops, "%s", name);
        cr_expect_gt(streamed.makespan_ms, 0, "%s", name);
        cr_expect_gt(streamed.ttft.mean_ms, 0, "%s", name);
        cr_expect_gt(streamed.tpot.mean_ms, 0, "%s", name);
        trace_stream_close(ts);
    }
    trace_destroy(rc.t);
}

Test(replay_exec, cpu_backend_gives_the_calling_thread_its_cpus_back, .timeout = 120) {
    /* the backend pins its compute and copy threads to two CPUs for the run (exec_cpu.c) */
    cpu_set_t before, after;
    cr_assert_eq(pthread_getaffinity_np(pthread_self(), sizeof before, &before), 0);
    replay_case rc = make_case();
    sim_result sim, real;
    replay_checks ck;
    expert_starts starts = {0};
    cr_assert(run_both(&rc, "lru", NULL, &sim, &real, &ck, &starts));
    cr_assert_eq(pthread_getaffinity_np(pthread_self(), sizeof after, &after), 0);
    cr_expect(CPU_EQUAL(&before, &after));
    trace_destroy(rc.t);
}

Test(replay_exec, cpu_backend_without_part_overlap_starts_an_expert_once_all_its_parts_landed,
     .timeout = 120) {
    replay_case rc = make_case();
    sim_result sim, real;
    replay_checks ck;
    expert_starts starts = {0};
    cr_assert(run_both(&rc, "lru", "sim.part_overlap=false", &sim, &real, &ck, &starts));
    cr_assert_gt(real.expert_ops, 0);
    cr_expect_eq(starts.masks_seen, 1u << POLICY_PARTS_ALL, "masks seen: %#llx",
                 (unsigned long long)starts.masks_seen);
    cr_expect_eq(starts.ops, real.expert_ops);
    cr_expect_eq(starts.not_resident, 0);
    cr_expect_eq(ck.order_violations, 0);
    trace_destroy(rc.t);
}

/* ---- the executor's asynchronous path, with a backend that queues its ops ---- */

/* A stand-in for a backend whose ops run later than they are issued (the cuda one): ops queue
 * until wait_compute or the step's end, copies complete a chunk at a time when the executor
 * waits. When a queued expert op finally runs, its parts must be resident and its expert still
 * pinned (an eviction may not have freed its blocks in between). */
typedef struct deferred_op {
    uint32_t layer, expert, mask;
    moesim_precision p;
} deferred_op;

typedef struct deferred {
    deferred_op queue[4096];
    uint32_t n_queued;
    uint64_t ran, not_resident, not_pinned, pinned_at_end;
    uint64_t op_t0[8192];
    const char *op_cat[8192];
    int op_layer[8192];
    uint32_t n_ops;
} deferred;

static deferred *dstate(const replay_exec *x) { return x->be_state; }

/* Completes the next chunk of the host-to-device queue; false when none is queued. */
static bool pump_one(replay_exec *x) {
    memsys_chunk c;
    if (!memsys_next_chunk(&x->ms, MEMSYS_H2D, &c)) return false;
    memsys_xfer fin;
    if (memsys_chunk_done(&x->ms, &c, &fin)) memsys_deliver(&x->ms, &fin, replay_exec_now(x));
    return true;
}

static bool parts_landed(const replay_exec *x, uint32_t layer, uint32_t e, moesim_precision p,
                         uint32_t mask) {
    size_t base = memsys_lep(&x->ms, layer, e, p) * PART_COUNT;
    for (int part = 0; part < PART_COUNT; part++)
        if ((mask & (1u << part)) && x->ms.state[base + part] != POLICY_RESIDENT) return false;
    return true;
}

/* Runs the queued expert ops, as a stream that waits for each op's copies. */
static void deferred_wait_compute(replay_exec *x) {
    deferred *d = dstate(x);
    for (uint32_t i = 0; i < d->n_queued; i++) {
        const deferred_op *o = &d->queue[i];
        while (!parts_landed(x, o->layer, o->expert, o->p, o->mask) && pump_one(x)) {
        }
        d->not_resident += !parts_landed(x, o->layer, o->expert, o->p, o->mask);
        d->not_pinned += !x->ms.pinned[memsys_lep(&x->ms, o->layer, o->expert, o->p)];
        d->ran++;
    }
    d->n_queued = 0;
}

static moesim_status deferred_setup(replay_exec *x, moesim_error *err) {
    (void)err;
    x->be_state = calloc(1, sizeof(deferred));
    uint64_t block[PREC_COUNT] = {0};
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT; part++)
            if (x->part_bytes[p][part] > block[p]) block[p] = x->part_bytes[p][part];
    block_pool_init(&x->pool,
                     x->bud.per_layer ? x->bud.pool_cap_bytes * x->L : x->bud.expert_budget_bytes,
                     block, (size_t)x->L * x->E * PREC_COUNT * PART_COUNT);
    return MOESIM_OK;
}

static void deferred_teardown(replay_exec *x) {
    free(x->be_state);
    x->be_state = NULL;
}

static uint64_t deferred_placement(const replay_exec *x) {
    (void)x;
    return UINT64_MAX;
}

static void deferred_kick(replay_exec *x, int engine) { (void)x, (void)engine; }
static void deferred_nothing(replay_exec *x) { (void)x; }

static void deferred_clock_start(replay_exec *x) { x->t0_ns = replay_exec_clock_ns(); }

static void deferred_step_begin(replay_exec *x, uint64_t step) {
    (void)step;
    deferred_wait_compute(x);
}

static void deferred_step_end(replay_exec *x, uint64_t step) {
    (void)step;
    deferred *d = dstate(x);
    uint64_t now = replay_exec_now(x);
    for (uint32_t i = 0; i < d->n_ops; i++) {
        replay_op_times t = {d->op_t0[i], now, REPLAY_NO_NEED, -1};
        replay_exec_op_done(x, d->op_cat[i], "", d->op_layer[i], &t);
    }
    d->n_ops = 0;
}

static bool deferred_wait_copy(replay_exec *x) { return pump_one(x); }

static void deferred_expert_wait(replay_exec *x, uint32_t layer, uint32_t e, moesim_precision p,
                                 uint32_t mask) {
    (void)x, (void)layer, (void)e, (void)p, (void)mask; /* queued copies order the op */
}

static void deferred_op_begin(replay_exec *x, const char *cat, const char *name, int layer) {
    (void)name;
    deferred *d = dstate(x);
    cr_assert_lt(d->n_ops, 8192);
    d->op_t0[d->n_ops] = replay_exec_now(x);
    d->op_cat[d->n_ops] = cat;
    d->op_layer[d->n_ops++] = layer;
}

static void deferred_run(replay_exec *x, const run_op *op) { (void)x, (void)op; }

static void deferred_expert(replay_exec *x, uint32_t layer, uint32_t e, moesim_precision p,
                            uint32_t tokens, uint32_t mask) {
    (void)tokens;
    deferred *d = dstate(x);
    cr_assert_lt(d->n_queued, 4096);
    d->queue[d->n_queued++] = (deferred_op){layer, e, mask, p};
}

static void deferred_drain(replay_exec *x) {
    while (pump_one(x)) {
    }
}

static void deferred_finish(replay_exec *x) {
    deferred *d = dstate(x);
    for (size_t lep = 0; lep < (size_t)x->L * x->E * PREC_COUNT; lep++)
        d->pinned_at_end += x->ms.pinned[lep] != 0;
    *(deferred *)x->in->hooks->ctx = *d; /* what the test reads after the run */
}

static const replay_backend deferred_backend = {
    .name = "deferred",
    .placement_dram = deferred_placement,
    .setup = deferred_setup,
    .teardown = deferred_teardown,
    .copy_kick = deferred_kick,
    .warm_copy = deferred_nothing,
    .clock_start = deferred_clock_start,
    .step_begin = deferred_step_begin,
    .step_end = deferred_step_end,
    .wait_compute = deferred_wait_compute,
    .wait_copy = deferred_wait_copy,
    .expert_wait = deferred_expert_wait,
    .op_begin = deferred_op_begin,
    .run = deferred_run,
    .op_end = deferred_nothing,
    .expert = deferred_expert,
    .drain = deferred_drain,
    .finish = deferred_finish,
};

Test(replay_exec, a_backend_that_queues_ops_runs_each_expert_pinned_and_after_its_copy) {
    replay_case rc = make_case();
    const char *pols[] = {"lru", "lfu", "oracle", "dymoe", "mixtral-offload"};
    for (size_t i = 0; i < sizeof pols / sizeof *pols; i++) {
        moesim_error err = {0};
        sim_result sim, real;
        replay_checks ck;
        config *c = settings(NULL);
        sim_inputs si = {.trace = rc.t, .model = &rc.m, .hw = &rc.hw, .quant = &quant};
        cr_assert_eq(sim_run(&si, pols[i], c, &sim, &err), MOESIM_OK, "%s", err.msg);
        config_destroy(c);
        deferred *seen = calloc(1, sizeof *seen);
        sim_hooks hooks = {.ctx = seen};
        replay_inputs ri = {
            .trace = rc.t, .model = &rc.m, .hw = &rc.hw, .quant = &quant, .hooks = &hooks};
        c = settings(NULL);
        cr_assert_eq(replay_exec_run(&deferred_backend, &ri, pols[i], c, &real, &ck, &err),
                     MOESIM_OK, "%s: %s", pols[i], err.msg);
        config_destroy(c);
        cr_expect_eq(real.steps, sim.steps, "%s", pols[i]);
        cr_expect_eq(real.sub_routes, sim.sub_routes, "%s", pols[i]);
        cr_expect_gt(real.h2d_bytes, 0, "%s", pols[i]);
        /* part overlap: two ops per expert, every one run once the stream caught up */
        cr_expect_eq(seen->ran, 2 * real.expert_ops, "%s", pols[i]);
        cr_expect_eq(seen->not_resident, 0, "%s", pols[i]);
        cr_expect_eq(seen->not_pinned, 0, "%s: an expert was unpinned before its ops ran", pols[i]);
        cr_expect_eq(seen->pinned_at_end, 0, "%s: experts left pinned", pols[i]);
        free(seen);
    }
    trace_destroy(rc.t);
}
