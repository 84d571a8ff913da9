/* `moesim calibrate --backend cpu` (replay/replay.h, calib_run_cpu): what the CPU replay's
 * profile and cost table hold, measured on this machine with the replay's own code. The link into
 * the pool is the disk: O_DIRECT reads of the expert file (replay/cpu_store.h) at the copy sizes,
 * random offsets, one at a time as the copy thread reads them; bandwidth at each size and the
 * latency as the intercept of time vs size (least squares). Compute: every op of sim/COST.md
 * timed with replay/cpu_compute.c at the points the model's runs use; DRAM bandwidth by memcpy;
 * the bf16 matvec rate as the compute peak actually reached. Median of `repeats` per point, the
 * ops' in rounds (time_plan); the disk's reads the mean (time_disk). */
#define _GNU_SOURCE /* cpu_set_t (replay/cpu_pin.h) */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <gsl/gsl_fit.h>
#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>

#include "common/alloc.h"
#include "common/check.h"
#include "kernels/quant.h"
#include "replay/cpu_compute.h"
#include "replay/cpu_copier.h"
#include "replay/cpu_pin.h"
#include "replay/cpu_store.h"
#include "replay/exec.h"
#include "replay/replay.h"

static double median(double *v, size_t n) {
    gsl_sort(v, 1, n);
    return gsl_stats_median_from_sorted_data(v, 1, n);
}

/* Bytes read per chunk size timed: enough chunks that their mean is the disk's sustained rate. */
#define CALIB_DISK_BYTES (64ull << 20)
/* Where the reads land, in turn: the copy thread writes all over a pool arena, and reads into one
 * reused buffer ran about 20 % faster on this project's VM than reads that move through memory
 * (the host translates each new destination page). */
#define CALIB_DISK_DEST_BYTES (256ull << 20)

/* Disk, as the copy thread reads it: one expert after another, each in consecutive chunks of the
 * size timed (64 KiB .. 4 MiB), from expert starts spread over the file (a cheap LCG: no cache),
 * into destinations that move through CALIB_DISK_DEST_BYTES as pool blocks do, at least `repeats`
 * experts and CALIB_DISK_BYTES per size. Per size the mean time of one chunk
 * read, not the median: the simulator charges every chunk the same time and a run's copies take
 * their sum, so a tail of slow reads (this VM's disk has one) counts; the link is the
 * least-squares line through the means. */
static moesim_status time_disk(const cpu_store *s, moesim_precision p, uint32_t repeats,
                               calib_results *c, moesim_error *err) {
    static const double sizes[] = {64 * 1024.0, 256 * 1024.0, 1048576.0, 4 * 1048576.0};
    uint64_t blob = s->stride[p], n_blobs = (uint64_t)s->m.n_moe_layers * s->m.n_experts;
    uint8_t *dest = cpu_store_dma_alloc(CALIB_DISK_DEST_BYTES);
    uint64_t dest_off = 0;
    double xs[4], ys[4];
    uint64_t lcg = 12345;
    c->n_sizes = 0;
    for (size_t k = 0; k < 4; k++) {
        uint64_t n = (uint64_t)sizes[k];
        uint64_t per_blob = blob / n ? blob / n : 1;
        if (n > blob || n_blobs < 2) break;
        /* of a large expert (hundreds of MB) only its first chunks: enough experts still start
         * reads that their mean is the rate, in CALIB_DISK_BYTES */
        uint64_t enough = CALIB_DISK_BYTES / n / repeats;
        if (per_blob > enough) per_blob = enough ? enough : 1;
        uint64_t reads = 0, read_ns = 0;
        for (uint32_t r = 0; r < repeats || reads * n < CALIB_DISK_BYTES; r++) {
            lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t start = s->base[p] + (lcg >> 20) % n_blobs * blob;
            for (uint64_t j = 0; j < per_blob; j++) {
                if (dest_off + n > CALIB_DISK_DEST_BYTES) dest_off = 0;
                uint64_t t0 = replay_exec_clock_ns();
                bool ok = cpu_store_read(s, start + j * n, n, dest + dest_off, NULL);
                dest_off += n;
                if (!ok) {
                    free(dest);
                    return moesim_fail(err, MOESIM_EIO, "%s: O_DIRECT read failed", s->path);
                }
                read_ns += replay_exec_clock_ns() - t0;
                reads++;
            }
        }
        double ns = (double)read_ns / (double)reads;
        c->size_bytes[c->n_sizes] = sizes[k];
        c->h2d_gb_per_s[c->n_sizes] = sizes[k] / ns;
        c->d2h_gb_per_s[c->n_sizes] = sizes[k] / ns;
        xs[c->n_sizes] = sizes[k];
        ys[c->n_sizes++] = ns;
    }
    free(dest);
    if (c->n_sizes < 2)
        return moesim_fail(err, MOESIM_EINPUT, "%s: the expert file is too small to time reads",
                           s->path);
    double c0, c1, cov00, cov01, cov11, sumsq;
    gsl_fit_linear(xs, 1, ys, 1, c->n_sizes, &c0, &c1, &cov00, &cov01, &cov11, &sumsq);
    /* each chunk is one request (cpu-host: latency_per_chunk), so the link is the fit itself:
     * the intercept per request, the slope's bandwidth per byte */
    c->h2d_latency_us = c->d2h_latency_us = c0 > 0 ? c0 / 1e3 : 0;
    c->h2d_peak_gb_per_s = c->d2h_peak_gb_per_s =
        c1 > 0 ? 1.0 / c1 : c->h2d_gb_per_s[c->n_sizes - 1];
    return MOESIM_OK;
}

/* The replay runs every op on weights that come from DRAM (an expert just read from disk, a layer
 * last touched a whole token ago): each timed call starts after reading this much other memory,
 * more than the last-level caches of the machines we run on (32 MiB L3 here). */
#define EVICT_BYTES (48u << 20)

static volatile uint64_t evict_sink;

static void evict_caches(const uint64_t *buf) {
    uint64_t s = 0;
    for (size_t i = 0; i < EVICT_BYTES / sizeof *buf; i += 8) s += buf[i];
    evict_sink = s;
}

typedef void (*op_fn)(cpu_compute *cc, void *ctx, uint32_t x); /* ctx: the op's, may move on */

/* The replay runs each expert on weights just read from disk, a different expert almost every
 * time. A sweep through other memory does not make one expert's weights cold again: a last-level
 * cache that keeps a reused working set against a streaming sweep (adaptive replacement) hands
 * repeated calls part of the weights from cache (measured here: bf16 gate+up of cpu-moe-small in
 * 342 us with the sweep alone, 357-387 us cycled, 368-379 us per op in a replay on a quiet
 * machine). So timed calls rotate through copies of the expert spanning at least this much
 * memory. */
#define EXPERT_ROTATION_BYTES (512ull << 20)

typedef struct expert_ctx {
    moesim_precision p;
    uint8_t *copies; /* [n_copies][3 * part_bytes]: gate | up | down in the kernels' format,
                        in huge pages as the replay's arena */
    uint32_t n_copies;
    uint32_t next; /* the copy the next call uses */
    uint64_t part_bytes;
} expert_ctx;

static const uint8_t *next_copy(expert_ctx *e) {
    return e->copies + (uint64_t)(e->next++ % e->n_copies) * 3 * e->part_bytes;
}

static void op_gate_up(cpu_compute *cc, void *ctx, uint32_t x) {
    expert_ctx *e = ctx;
    const uint8_t *w = next_copy(e);
    cpu_compute_expert_gate_up(cc, e->p, w, w + e->part_bytes, x);
}
static void op_down(cpu_compute *cc, void *ctx, uint32_t x) {
    expert_ctx *e = ctx;
    cpu_compute_expert_down(cc, e->p, next_copy(e) + 2 * e->part_bytes, x);
}
/* x = attended positions of one decode token (its context): the core alone */
static void op_attention(cpu_compute *cc, void *ctx, uint32_t x) {
    (void)ctx;
    uint32_t pos = x - 1;
    cpu_compute_attention_core(cc, &pos, 1);
}
/* The layers an op of one layer is timed on, in turn: the replay runs each layer's weights once a
 * token, so timing one layer's again and again would hand it part of them from cache (see
 * EXPERT_ROTATION_BYTES). */
typedef struct layer_cycle {
    uint32_t layers[MODEL_MAX_LAYERS];
    uint32_t n;
    uint32_t next;
} layer_cycle;

static uint32_t next_layer(void *ctx) {
    layer_cycle *lc = ctx;
    return lc->layers[lc->next++ % lc->n];
}

/* x = tokens: the projections */
static void op_attention_proj(cpu_compute *cc, void *ctx, uint32_t x) {
    cpu_compute_attention_proj(cc, next_layer(ctx), x);
}
static void op_router(cpu_compute *cc, void *ctx, uint32_t x) {
    cpu_compute_router(cc, next_layer(ctx), x);
}
static void op_shared(cpu_compute *cc, void *ctx, uint32_t x) {
    cpu_compute_shared(cc, next_layer(ctx), x);
}
static void op_dense(cpu_compute *cc, void *ctx, uint32_t x) {
    cpu_compute_dense(cc, next_layer(ctx), x);
}
static void op_combine(cpu_compute *cc, void *ctx, uint32_t x) {
    (void)ctx;
    cpu_compute_combine(cc, x);
}
static void op_lm_head(cpu_compute *cc, void *ctx, uint32_t x) {
    (void)ctx;
    cpu_compute_lm_head(cc, x);
}

/* ---- the link and the compute beside each other ----
 *
 * The replay's copy thread reads experts while its compute thread runs ops, each on a CPU of its
 * own (replay/cpu_pin.h), and on this project's 2-core VM they slow each other: the CPU
 * validation's replays read 3-9 % below the rate calibrated alone, and their ops ran slower
 * wherever copies went on beside them. So calibration measures both, in rounds of three phases
 * of CONTENTION_PHASE_NS each: the copy thread reading alone; reading while the calling thread
 * runs a decode step's ops (per MoE layer the attention projections, the router and top-k
 * experts' gate+up and down, then the LM head, one token, weights cold as in the replay); the
 * same ops again alone (phases of CONTENTION_SLICE_NS in a validation's one-repetition slices,
 * which its rounds combine by median). The link's slowdown is the reads' mean time beside the ops
 * over alone, the ops' their time beside the reads over alone (the profile's
 * slowdown_beside_compute and slowdown_beside_copy). Reads are 1 MiB chunks (the default
 * sim.chunk_kib) of whole experts from random starts, into moving destinations, as time_disk reads.
 */
#define CONTENTION_PHASE_NS (250ull * 1000 * 1000)
#define CONTENTION_SLICE_NS (100ull * 1000 * 1000)
#define CONTENTION_CHUNK    (1ull << 20)

typedef struct contention_reader {
    const cpu_store *s;
    moesim_precision p;
    uint8_t *dest; /* [CALIB_DISK_DEST_BYTES] */
    uint64_t dest_off, lcg;
    atomic_bool stop;
    uint64_t reads, read_ns;
    bool failed;
} contention_reader;

static void *reader_main(void *arg) {
    contention_reader *r = arg;
    const cpu_store *s = r->s;
    uint64_t blob = s->stride[r->p], n_blobs = (uint64_t)s->m.n_moe_layers * s->m.n_experts;
    uint64_t chunks = blob / CONTENTION_CHUNK ? blob / CONTENTION_CHUNK : 1;
    uint64_t n = blob < CONTENTION_CHUNK ? blob : CONTENTION_CHUNK;
    while (!atomic_load(&r->stop) && !r->failed) {
        r->lcg = r->lcg * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t start = s->base[r->p] + (r->lcg >> 20) % n_blobs * blob;
        for (uint64_t j = 0; j < chunks && !atomic_load(&r->stop); j++) {
            if (r->dest_off + n > CALIB_DISK_DEST_BYTES) r->dest_off = 0;
            uint64_t t0 = replay_exec_clock_ns();
            if (!cpu_store_read(s, start + j * n, n, r->dest + r->dest_off, NULL)) {
                r->failed = true;
                break;
            }
            r->read_ns += replay_exec_clock_ns() - t0;
            r->reads++;
            r->dest_off += n;
        }
    }
    return NULL;
}

static void reader_start(contention_reader *r, pthread_t *th, cpu_pin *pin) {
    atomic_store(&r->stop, false);
    MOESIM_ASSERT(pthread_create(th, NULL, reader_main, r) == 0);
    cpu_pin_pair(pin, *th);
}

static void reader_stop(contention_reader *r, pthread_t th, const cpu_pin *pin) {
    atomic_store(&r->stop, true);
    MOESIM_ASSERT(pthread_join(th, NULL) == 0);
    cpu_pin_restore(pin);
}

/* A decode step's ops, one token: the i-th op of the endless sequence the contention runs. */
typedef struct step_ops {
    cpu_compute *cc;
    expert_ctx *e;
    layer_cycle *moe;
    uint32_t top_k, per_layer, n_layers;
} step_ops;

static void step_op(step_ops *so, uint64_t i) {
    uint64_t per_step = (uint64_t)so->per_layer * so->n_layers + 1;
    uint64_t k = i % per_step, in_layer = k % so->per_layer;
    if (k == per_step - 1)
        op_lm_head(so->cc, NULL, 1);
    else if (in_layer == 0)
        op_attention_proj(so->cc, so->moe, 1);
    else if (in_layer == 1)
        op_router(so->cc, so->moe, 1);
    else if (in_layer % 2 == 0)
        op_gate_up(so->cc, so->e, 1);
    else
        op_down(so->cc, so->e, 1);
}

/* Runs ops from sequence index *i on until `until_ns` (at least one) or, with until_ns 0, `count`
 * of them; their time in ns. */
static uint64_t run_ops(step_ops *so, uint64_t *i, uint64_t until_ns, uint64_t count) {
    uint64_t t0 = replay_exec_clock_ns(), t = t0, done = 0;
    while (until_ns ? done == 0 || t < until_ns : done < count) {
        step_op(so, (*i)++);
        done++;
        t = replay_exec_clock_ns();
    }
    return t - t0;
}

static moesim_status time_contention(const cpu_store *s, moesim_precision disk_p, step_ops *so,
                                     uint32_t repeats, calib_results *c, moesim_error *err) {
    uint32_t rounds = repeats < 5 ? repeats : 5;
    uint64_t phase_ns = repeats > 1 ? CONTENTION_PHASE_NS : CONTENTION_SLICE_NS;
    contention_reader r = {.s = s, .p = disk_p, .lcg = 777};
    r.dest = cpu_store_dma_alloc(CALIB_DISK_DEST_BYTES);
    uint64_t alone_reads = 0, alone_ns = 0, beside_reads = 0, beside_ns = 0;
    uint64_t ops_beside_ns = 0, ops_alone_ns = 0, op = 0;
    pthread_t th;
    cpu_pin pin;
    for (uint32_t k = 0; k < rounds && !r.failed; k++) {
        reader_start(&r, &th, &pin);
        struct timespec phase = {0, (long)phase_ns};
        nanosleep(&phase, NULL);
        reader_stop(&r, th, &pin);
        alone_reads += r.reads, alone_ns += r.read_ns;
        r.reads = r.read_ns = 0;

        uint64_t first = op;
        reader_start(&r, &th, &pin);
        ops_beside_ns += run_ops(so, &op, replay_exec_clock_ns() + phase_ns, 0);
        reader_stop(&r, th, &pin);
        beside_reads += r.reads, beside_ns += r.read_ns;
        r.reads = r.read_ns = 0;

        uint64_t again = first; /* the same ops alone */
        ops_alone_ns += run_ops(so, &again, 0, op - first);
    }
    free(r.dest);
    if (r.failed) return moesim_fail(err, MOESIM_EIO, "%s: O_DIRECT read failed", s->path);
    double link = alone_reads && beside_reads ? ((double)beside_ns / (double)beside_reads) /
                                                    ((double)alone_ns / (double)alone_reads)
                                              : 1;
    double ops = ops_alone_ns ? (double)ops_beside_ns / (double)ops_alone_ns : 1;
    /* below 1 (faster beside the other) is noise; above 5 the profile refuses */
    c->link_slowdown_beside_compute = fmin(fmax(link - 1, 0), 4);
    c->op_slowdown_beside_copy = fmin(fmax(ops - 1, 0), 4);
    c->contention_measured = true;
    return MOESIM_OK;
}

/* One point of a cost curve: an op at one x, on its context; its time goes to *t_ns. */
typedef struct timed_point {
    op_fn f;
    void *ctx;
    uint32_t x;
    double *t_ns;
} timed_point;

typedef struct timing_plan {
    timed_point pt[COST_OP_COUNT * PREC_COUNT * COST_TABLE_MAX_POINTS];
    uint32_t n;
} timing_plan;

static void plan_curve(timing_plan *pl, calib_results *c, cost_op op, moesim_precision p, op_fn f,
                       void *ctx, const uint32_t *xs, uint32_t n) {
    cost_curve *cv = &c->curve[op][p];
    cv->n = n;
    for (uint32_t i = 0; i < n; i++) {
        cv->x[i] = xs[i];
        cv->t_ns[i] = 0;
        pl->pt[pl->n++] = (timed_point){f, ctx, xs[i], &cv->t_ns[i]};
    }
}

/* Each point's median time of one call on cold caches, ns. In rounds, every point of the plan
 * once before any a second time: this VM has slow spells lasting seconds, and timing a point's
 * repeats back to back put a spell on whichever points it met; in rounds a spell falls on all
 * points alike. An untimed round goes first: the first call of an op after cpu_compute_init ran
 * 1.1-3x its later calls (attention projections of qwen1.5-moe-4l, one token: 7.3 ms, then
 * 2.6-3.1 ms), the replay runs every op many times, and a calibration of one repetition (a
 * validation's slice) timed nothing but first calls. Adds the time of every call and what the
 * medians account for of it to *all_ns and *typical_ns (see apply_stall_overhead). */
static void time_plan(const timing_plan *pl, cpu_compute *cc, uint32_t repeats,
                      const uint64_t *evict, double *all_ns, double *typical_ns) {
    for (uint32_t k = 0; k < pl->n; k++) pl->pt[k].f(cc, pl->pt[k].ctx, pl->pt[k].x);
    double *t = moesim_xcalloc((size_t)pl->n * repeats, sizeof *t); /* [point][repeat] */
    for (uint32_t r = 0; r < repeats; r++)
        for (uint32_t k = 0; k < pl->n; k++) {
            const timed_point *tp = &pl->pt[k];
            evict_caches(evict);
            uint64_t t0 = replay_exec_clock_ns();
            tp->f(cc, tp->ctx, tp->x);
            t[(size_t)k * repeats + r] = (double)(replay_exec_clock_ns() - t0);
            *all_ns += t[(size_t)k * repeats + r];
        }
    for (uint32_t k = 0; k < pl->n; k++) {
        *pl->pt[k].t_ns = median(t + (size_t)k * repeats, repeats);
        *typical_ns += *pl->pt[k].t_ns * repeats;
    }
    free(t);
}

/* The VM also stalls a call now and then by milliseconds. A run's compute is the sum of its ops,
 * so the stalls count, but a point's own mean is no measure of them: with a few repeats one stall
 * moved a point's mean by up to 2x (bf16 gate+up of cpu-moe-small: 597 us in one calibration,
 * 1003 us in the next, 577 us in the replays between). Stalls come from the host, not from the
 * op, so they are pooled over every timed call: every point's median is scaled by the time of all
 * calls over what the medians account for. */
static void apply_stall_overhead(calib_results *c, double all_ns, double typical_ns) {
    c->stall_overhead = typical_ns > 0 ? all_ns / typical_ns : 1;
    for (int op = 0; op < COST_OP_COUNT; op++)
        for (int p = 0; p < PREC_COUNT; p++)
            for (uint32_t i = 0; i < c->curve[op][p].n; i++)
                c->curve[op][p].t_ns[i] *= c->stall_overhead;
}

/* How many of the n points xs (increasing) a run up to `max` needs: those below it and the first
 * at or above it (the table interpolates between points), at least two (a line to extrapolate
 * by); all n for max 0. */
static uint32_t points_needed(const uint32_t *xs, uint32_t n, uint32_t max) {
    if (!max) return n;
    uint32_t k = 0;
    while (k < n && xs[k] < max) k++;
    k = k < n ? k + 1 : n;
    return k < 2 && n >= 2 ? 2 : k;
}

void calib_cpu_cache_free(calib_cpu_cache *c) {
    for (int p = 0; p < PREC_COUNT; p++) free(c->copies[p]);
    memset(c->copies, 0, sizeof c->copies);
}

moesim_status calib_run_cpu(const calib_options *opt, const char *dir, calib_results *out,
                            moesim_error *err) {
    const model_geometry *m = opt->model;
    uint64_t phase = 0;
#define PHASE_DONE()                                                                               \
    do {                                                                                           \
        if (opt->bar) progress_update(opt->bar, ++phase);                                          \
    } while (0)
    memset(out, 0, sizeof *out);
    snprintf(out->gpu, sizeof out->gpu, "CPU (%ld cores online)", sysconf(_SC_NPROCESSORS_ONLN));
    snprintf(out->backend, sizeof out->backend, "cpu");
    out->repeats = opt->repeats;
    uint32_t repeats = opt->repeats;
    double *t = moesim_xcalloc(repeats, sizeof *t);

    /* the disk: the cache's expert file (a validation's), else an int4 one made for it */
    bool stored[PREC_COUNT] = {false};
    stored[PREC_INT4] = true;
    cpu_store *own = NULL;
    const cpu_store *s = opt->cache ? opt->cache->store : NULL;
    moesim_status st = s ? MOESIM_OK : cpu_store_create(m, stored, dir, 1, NULL, &own, err);
    if (!s) s = own;
    moesim_precision disk_p = PREC_INT4;
    for (int p = 0; !st && !s->stored[disk_p] && p < PREC_COUNT; p++) disk_p = (moesim_precision)p;
    if (!st) st = time_disk(s, disk_p, repeats, out, err);
    if (st) {
        cpu_store_destroy(own);
        free(t);
        return st;
    }
    PHASE_DONE();

    /* DRAM: memcpy of 64 MiB, read + write bytes */
    uint64_t n = 64ull << 20;
    uint8_t *a = moesim_xmalloc(n), *b = moesim_xmalloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    for (uint32_t r = 0; r < repeats; r++) {
        uint64_t t0 = replay_exec_clock_ns();
        memcpy(b, a, n);
        t[r] = (double)(replay_exec_clock_ns() - t0);
    }
    out->hbm_gb_per_s = 2.0 * (double)n / median(t, repeats);
    free(a);
    free(b);
    PHASE_DONE();

    uint32_t max_ctx = opt->quick ? 256 : 2048;
    cpu_compute cc;
    cpu_compute_init(&cc, m, max_ctx, 1, NULL);
    layer_cycle all = {0}, moe = {0}, dense = {0};
    for (uint32_t l = 0; l < m->n_layers; l++) {
        all.layers[all.n++] = l;
        layer_cycle *kind = m->is_moe_layer[l] ? &moe : &dense;
        kind->layers[kind->n++] = l;
    }
    static const uint32_t tok_full[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    static const uint32_t ctx_full[] = {1, 8, 32, 128, 512, 1024, 2048};
    uint32_t n_tok = points_needed(tok_full, opt->quick ? 5 : 9, opt->max_tokens);
    uint32_t n_ctx = points_needed(ctx_full, opt->quick ? 5 : 7, opt->max_context);
    timing_plan *plan = moesim_xcalloc(1, sizeof *plan);
    /* written, so that its pages are its own: untouched zeroed pages all map one shared page, and
     * reading them evicts nothing */
    uint64_t *evict = moesim_xmalloc(EVICT_BYTES);
    memset(evict, 1, EVICT_BYTES);
    double all_ns = 0, typical_ns = 0;
    plan_curve(plan, out, COST_ATTENTION, PREC_BF16, op_attention, NULL, ctx_full, n_ctx);
    plan_curve(plan, out, COST_ATTENTION_PROJ, PREC_BF16, op_attention_proj, &all, tok_full, n_tok);
    plan_curve(plan, out, COST_ROUTER, PREC_BF16, op_router, &moe, tok_full, n_tok);
    if (m->n_shared_experts)
        plan_curve(plan, out, COST_SHARED, PREC_BF16, op_shared, &moe, tok_full, n_tok);
    if (dense.n)
        plan_curve(plan, out, COST_DENSE_FFN, PREC_BF16, op_dense, &dense, tok_full, n_tok);
    plan_curve(plan, out, COST_COMBINE, PREC_BF16, op_combine, NULL, tok_full, n_tok);
    plan_curve(plan, out, COST_LM_HEAD, PREC_BF16, op_lm_head, NULL, tok_full, n_tok);
    time_plan(plan, &cc, repeats, evict, &all_ns, &typical_ns);
    PHASE_DONE();
    /* expert ops one precision at a time, 512 MiB of copies: with all four precisions' copies at
     * once (2 GiB) one calibration timed int4 gate+up at 918 us against 616-680 us in every other
     * (cause not found; the ops of one precision still share their rounds) */
    static const moesim_precision precs[] = {PREC_BF16, PREC_INT8, PREC_INT4, PREC_INT2};
    for (size_t i = 0; i < sizeof precs / sizeof *precs; i++) {
        moesim_precision p = precs[i];
        PHASE_DONE(); /* counted at the start: a precision the shapes skip is done too */
        if (p != PREC_BF16 && (m->hidden % QUANT_GROUP || m->expert_inter % QUANT_GROUP)) continue;
        if (opt->precisions && !opt->precisions[p]) continue;
        uint64_t part = replay_part_bytes(m, p, PART_GATE);
        MOESIM_ASSERT(part == replay_part_bytes(m, p, PART_DOWN));
        uint32_t n_copies = (uint32_t)(EXPERT_ROTATION_BYTES / (3 * part) + 1);
        uint8_t *copies = opt->cache ? opt->cache->copies[p] : NULL;
        if (!copies) {
            uint8_t *blob = cpu_store_expert_blob(m, p, 1); /* what the replay's store holds */
            copies = cpu_store_dma_alloc((uint64_t)n_copies * 3 * part);
            for (uint32_t k = 0; k < n_copies; k++) memcpy(copies + k * 3 * part, blob, 3 * part);
            free(blob);
            if (opt->cache) opt->cache->copies[p] = copies;
        }
        expert_ctx e = {p, copies, n_copies, 0, part};
        plan->n = 0;
        plan_curve(plan, out, COST_EXPERT_GATE_UP, p, op_gate_up, &e, tok_full, n_tok);
        plan_curve(plan, out, COST_EXPERT_DOWN, p, op_down, &e, tok_full, n_tok);
        time_plan(plan, &cc, repeats, evict, &all_ns, &typical_ns);
        if (!out->contention_measured && !st) { /* at the first precision timed */
            step_ops so = {&cc, &e, &moe, m->top_k, 2 + 2 * m->top_k, moe.n};
            st = time_contention(s, disk_p, &so, repeats, out, err);
        }
        if (!opt->cache) free(copies);
        if (st) break;
    }
    cpu_store_destroy(own);
    apply_stall_overhead(out, all_ns, typical_ns);
    free(evict);
    free(plan);
    /* the compute peak this code reaches: a bf16 matvec's flops (the LM head at one token) */
    double lm_ns = out->curve[COST_LM_HEAD][PREC_BF16].t_ns[0];
    out->bf16_tflops = lm_ns > 0 ? 2.0 * m->vocab * m->hidden / lm_ns / 1e3 : 0;
    out->kernel_launch_us = 0; /* ops are function calls on this thread */
    cpu_compute_free(&cc);
    free(t);
    return st;
#undef PHASE_DONE
}
