/* The memory system behind the policy API (policies/policy.h), in one place for every host: the
 * simulator (sim/sim.c, virtual time) and the replay (replay/, real copies) both drive it, so
 * residency, pools, copy classes, promotion, cancellation and host placement cannot drift apart.
 * It has no clock: a host asks which chunk an engine should copy next (memsys_next_chunk), copies
 * it in its own time, and reports the chunk done (memsys_chunk_done).
 *
 * State: every (layer, expert, precision, part) is ABSENT, LOADING or RESIDENT (state[], indexed
 * by part index = lep * PART_COUNT + part, lep = (precision * L + layer) * E + expert). A load
 * reserves its bytes in the pool at once (so a LOADING part counts as used) and becomes one
 * transfer whose parts travel gate, up, down in one byte stream.
 *
 * Engines: MEMSYS_H2D copies host DRAM -> HBM (PCIe); MEMSYS_SSD reads experts that host placement
 * left on the SSD. Without GPUDirect Storage an SSD read lands in a DRAM bounce buffer of
 * `bounce_bytes` and the H2D engine copies each staged chunk on as soon as it is read (chunk by
 * chunk, so the two engines pipeline); the SSD engine stalls while the bounce buffer is full.
 * With GPUDirect Storage the SSD read lands in HBM. Each engine keeps three FIFO classes, demand >
 * prefetch > background, and serves the first servable transfer of the highest class at every
 * chunk boundary.
 *
 * Promotion: a load of a part that is already loading in a lower class moves the whole transfer
 * (its remaining chunks) to the requester's class at once (POLICY_PROMOTED), placed there by issue
 * order, the order the compute stream runs loading experts in.
 * Cancellation (sim/README.md): a prefetch targets the next route of its layer after it was
 * issued; when that layer has been routed in a step without running it and its copy has not
 * started, it is dropped (memsys_end_layer), and the policy hears of it (on_transfer_cancelled).
 * A chunk already handed to an engine always completes.
 *
 * Invariants (asserted): pool use never exceeds its capacity; a part is LOADING exactly while a
 * live transfer carries it; chunks of one transfer complete in the order they were handed out on
 * each engine. */
#ifndef MOESIM_CORE_MEMSYS_H
#define MOESIM_CORE_MEMSYS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/check.h"
#include "core/future.h"
#include "policies/policy.h"

#define MEMSYS_NONE    UINT32_MAX
#define MEMSYS_CLASSES 3
enum { MEMSYS_H2D = 0, MEMSYS_SSD = 1, MEMSYS_ENGINES = 2 };

/* What the memory system asks of its host. */
typedef struct memsys_host {
    void *ctx;
    /* Engine `engine` may have a servable chunk (new work, a promotion, staged bytes, bounce room
     * freed): the host calls memsys_next_chunk when the engine can take one. */
    void (*on_work)(void *ctx, int engine);
    /* Expert bytes in HBM changed to `experts_used` (timeline counters, peak, budget checks):
     * called when they rise, and when they fall only if `hbm_drops` is set (a fall cannot break
     * the budget or raise the peak: only a timeline draws it). */
    void (*on_hbm)(void *ctx, uint64_t experts_used);
    /* Optional (NULL: the pools' byte count is the only limit): physical room for the parts in
     * `parts` of a load about to be issued; false refuses the load. `release` gives one part's
     * room back when it leaves HBM. */
    bool (*reserve)(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p,
                    uint32_t parts);
    void (*release)(void *ctx, uint32_t layer, uint32_t expert, moesim_precision p, int part);
    bool hbm_drops; /* on_hbm hears of falls too */
} memsys_host;

typedef struct memsys_config {
    uint32_t n_layers, n_experts;
    uint64_t part_bytes[PREC_COUNT][PART_COUNT]; /* 0: the host does not store that precision */
    bool per_layer;          /* one pool per layer (cache.experts_per_layer) or one in all */
    uint64_t pool_cap_bytes; /* each pool's capacity */
    uint64_t chunk_bytes;    /* copy granularity: the preemption point of the engines */
    uint64_t bounce_bytes;   /* DRAM staging of SSD reads (unused with GPUDirect Storage) */
    bool gpu_direct_storage; /* SSD reads land in HBM */
} memsys_config;

typedef struct memsys_xfer {
    uint32_t layer, expert;
    uint32_t lep;             /* memsys_lep of (layer, expert, prec): every landing needs it */
    uint8_t prec, parts, cls; /* parts: mask carried; cls: current class (after promotions) */
    uint8_t issued_cls;       /* class it was issued in */
    uint8_t parts_done;       /* parts landed in HBM */
    uint8_t queued;           /* bit per engine: in that engine's class queue */
    bool via_ssd;             /* read from the SSD first (host placement) */
    bool from_policy;         /* false: the host's own copy, not reported to the policy */
    uint64_t bytes;                /* all carried parts */
    uint64_t part_end[PART_COUNT]; /* cumulative byte offset where each carried part ends */
    uint64_t sent[MEMSYS_ENGINES]; /* bytes handed to each engine */
    uint64_t done[MEMSYS_ENGINES]; /* bytes each engine completed */
    uint64_t seq;                  /* issue order */
    uint32_t next[MEMSYS_ENGINES]; /* class queue links; next[0] links the free list */
    uint32_t prev[MEMSYS_ENGINES]; /* the other way: a promotion or cancellation unlinks at once */
} memsys_xfer;

/* A chunk an engine is to copy: bytes [offset, offset + bytes) of transfer `xfer`'s stream on
 * `engine`. `first`: the transfer's first chunk on that engine (it pays the engine's latency). */
typedef struct memsys_chunk {
    uint32_t xfer;
    int engine;
    uint64_t offset, bytes;
    bool first;
    uint8_t cls; /* the transfer's class when the engine took the chunk (a later promotion does
                    not move bytes already on the wire) */
} memsys_chunk;

typedef struct memsys_counts {
    uint64_t h2d_bytes, ssd_bytes, warmup_bytes; /* moved after t = 0; initial placement */
    uint64_t h2d_class_bytes[MEMSYS_CLASSES]; /* h2d_bytes by the class each chunk was taken in
                                                 (demand, prefetch, background = migrations) */
    uint64_t prefetches;   /* prefetch-class transfers issued */
    uint64_t promoted;     /* loads that moved a lower-class transfer up */
    uint64_t late;         /* routes that ran a prefetched expert whose copy had not landed */
    uint64_t cancelled;    /* prefetch transfers dropped before their copy started */
    uint64_t wasted_bytes; /* prefetched bytes moved and never run before eviction (or the end) */
} memsys_counts;

struct policy_mem {
    memsys_config cfg;
    memsys_host host;
    uint32_t L, E, P;
    size_t n_le; /* L * E: the stride of a precision in every per-lep array (memsys_lep) */
    bool warmup; /* loads land at once (initial placement before the clock starts) */

    uint8_t *state;      /* [L*E*P*PART_COUNT] policy_residency */
    uint32_t *xfer_of;   /* [L*E*P*PART_COUNT] loading transfer of each part, or MEMSYS_NONE */
    uint8_t *pinned;     /* [L*E*P] in use by the current route's compute */
    uint8_t *on_ssd;     /* [L*E*P] host placement left it on the SSD */
    uint8_t *pf_unused;  /* [L*E*P] prefetched and not run since */
    uint32_t *used_mark; /* [L*E*P] == layer_mark: run by the current layer's routes */
    uint8_t *pf_mark;    /* [L*E] prefetched since the layer last ran: FIRM-MoE Eq. 7-8's S */
    uint32_t *pf_count;  /* [L] experts marked in pf_mark (core/route.h consumes both) */
    uint64_t *pool_used; /* [L] or [1] bytes resident or loading */
    uint64_t prec_used[PREC_COUNT];
    uint64_t experts_used, bounce_used;
    uint64_t started_bytes; /* carried by the live transfers whose copy started: at least
                               memsys_unevictable_bytes of any layer, kept without a scan */
    uint64_t chunk_mask; /* cfg.chunk_bytes - 1 when a power of two (rounding by a mask), else 0 */

    memsys_xfer *xf; /* transfers; free slots on a list */
    uint32_t n_xf, cap_xf, free_xf;
    uint64_t xfer_seq;
    uint32_t head[MEMSYS_ENGINES][MEMSYS_CLASSES], tail[MEMSYS_ENGINES][MEMSYS_CLASSES];

    uint32_t layer_mark;    /* bumped by memsys_begin_layer */
    uint64_t layer_seq;     /* xfer_seq when the current layer's routing began */
    uint32_t *warm;         /* [n_warm] lep of loads issued during warm-up */
    uint8_t *warm_parts;    /* [n_warm] parts | class << 4 */
    uint32_t n_warm, cap_warm;

    /* policy and oracle support */
    const policy_methods *pm;
    policy *pol;
    const sim_future *future; /* NULL unless the host offers the trace's future */
    uint64_t access_pos;      /* global position of the current route's first access */
    uint64_t cur_step;
    int64_t cur_layer; /* last layer routed in the current step; -1 before its first route */

    memsys_counts n;
};
typedef struct policy_mem memsys;

/* The policy_mem_ops every host hands its policy (view.mem is the memsys). */
extern const policy_mem_ops memsys_ops;
/* What a policy sees of m: memsys_ops, and the parts' residency to read without a call. */
static inline policy_mem_view memsys_view(memsys *m) {
    return (policy_mem_view){.ops = &memsys_ops, .mem = m, .residency = m->state};
}

/* Sets up an empty memory system (caller-allocated; memsys_free). Borrows nothing from cfg. */
void memsys_init(memsys *m, const memsys_config *cfg, const memsys_host *host);
void memsys_free(memsys *m); /* accepts a zeroed struct */

/* Host placement: which (layer, expert, precision) lives in `dram_bytes` of host memory and which
 * on the SSD. Precisions in `order` (most wanted first, `n` of them) fill DRAM in that order,
 * layer by layer, expert by expert; the rest of every stored precision lives on the SSD. */
void memsys_place(memsys *m, const moesim_precision *order, uint32_t n, uint64_t dram_bytes);

/* sim.host_precisions: "policy" (stored: every precision, *policy_only set: only what the policy
 * declares is placed), "all", or a comma list. One line naming the setting on a bad name. */
moesim_status memsys_parse_host_precisions(const char *text, bool stored[PREC_COUNT],
                                           bool *policy_only, moesim_error *err);

/* Host placement of a run (sim/README.md "Host placement"): the precisions the policy loads
 * (policy_methods.load_precisions; `fallback`, expert.precision, when it declares none) fill
 * `dram_bytes` first, most wanted first; unless `policy_only`, the other stored precisions
 * follow, smaller first. Returns the bytes of one expert at the widest precision the policy
 * loads, what routes are sized by. Call after memsys_attach_policy. */
uint64_t memsys_place_for_policy(memsys *m, const policy_methods *pm, policy *pol,
                                 moesim_precision fallback, bool policy_only, uint64_t dram_bytes);

/* The policy whose loads the memory system reports (on_transfer_done, on_transfer_cancelled). */
void memsys_attach_policy(memsys *m, const policy_methods *pm, policy *pol);

/* Engine `engine`'s next chunk, if it has a servable one (marks it handed out). */
bool memsys_next_chunk(memsys *m, int engine, memsys_chunk *out);
/* memsys_next_chunk for a host that would rather not hear of every chunk: a PCIe copy of a
 * transfer not staged through the SSD may come as a span of consecutive chunks, up to the chunk
 * where its next part lands (so every part lands at the end of a span, as chunk by chunk), and
 * not the transfer's last chunk unless it is a demand copy (so a copy that could still be
 * promoted stays queued, as chunk by chunk). Served chunk by chunk, the engine would pick the
 * same transfer at each boundary inside the span unless a request arrives; so the host must,
 * whenever an engine gets work (memsys_host.on_work) while a span is in flight, cut the span
 * back to the chunk in flight with memsys_span_trim. The host is also the one to know whether
 * other events could fall on the span's inner boundaries (then it asks chunk by chunk). */
bool memsys_next_span(memsys *m, int engine, memsys_chunk *out);
/* memsys_next_span whose span does not stop where a part lands: the host lands the parts inside
 * it itself (memsys_chunk_next_landing, memsys_part_land) when the chunk holding their last byte
 * ends, as chunk by chunk; for a host whose clock knows when each chunk of a span ends. */
bool memsys_next_span_past_landings(memsys *m, int engine, memsys_chunk *out);
/* Whether span c, in flight, would still be served at each of its inner chunk boundaries as
 * the queues stand: its transfer's class unchanged since it started, nothing queued in a higher
 * class, nothing ahead of it in its own (queues keep issue order). False when unsure; then the
 * host cuts the span (memsys_span_trim) for new work to compete. */
bool memsys_span_unrivalled(const memsys *m, const memsys_chunk *c);
/* Cuts a span handed out by memsys_next_span back to its first `bytes` (a whole number of
 * chunks, at least one); the rest is servable again (queued by issue order if the span had taken
 * the transfer off its queue). */
void memsys_span_trim(memsys *m, memsys_chunk *c, uint64_t bytes);
/* Engine `engine`'s queued work not yet handed out: its bytes, in how many chunks, and how many
 * of its transfers have not started (each pays the engine's latency on its first chunk). With
 * the chunk in flight, what the engine does if no new work comes: a host that charges what runs
 * beside a copy reads it (the simulator's ops slowed beside the link). */
typedef struct memsys_backlog {
    uint64_t bytes, chunks;
    uint32_t unstarted;
} memsys_backlog;
memsys_backlog memsys_engine_backlog(const memsys *m, int engine);
/* The parts a chunk's bytes belong to: piece i is bytes [part_offset, part_offset + bytes) of
 * part `part` of the chunk's transfer (in the stream's byte units, cfg.part_bytes), in stream
 * order. Returns the count (1..PART_COUNT). For hosts that copy real bytes part by part. */
typedef struct memsys_piece {
    int part;
    uint64_t part_offset, bytes;
} memsys_piece;
uint32_t memsys_chunk_pieces(const memsys *m, const memsys_chunk *c,
                             memsys_piece out[PART_COUNT]);

/* A chunk handed out by memsys_next_chunk has completed at `now_ns`. Returns true when it
 * completed its transfer; then *done holds the transfer, to pass to memsys_deliver after the host
 * has restarted its engines (the policy hears of it last). */
bool memsys_chunk_done(memsys *m, const memsys_chunk *c, memsys_xfer *done);
void memsys_deliver(memsys *m, const memsys_xfer *done, uint64_t now_ns);

/* Warm-up: loads issued between memsys_warmup_begin and _end land at once; _end reports them to
 * the policy (at time 0) and returns how many there were (memsys.warm lists them until then). */
void memsys_warmup_begin(memsys *m);
void memsys_warmup_end(memsys *m);

/* A layer's routing for the step begins: loads issued before this point for this layer target
 * this route (the cancellation rule). */
void memsys_begin_layer(memsys *m);
/* Route bookkeeping before compute: (layer, expert, p) runs in the current route. Pins it, marks
 * it used, counts a late prefetch, and promotes a copy of it still queued in a lower class to
 * demand (the stream waits for it now, whether or not the policy asked for it again). */
void memsys_run(memsys *m, uint32_t layer, uint32_t expert, moesim_precision p);
/* memsys_run for every expert a policy's plan runs (plan[a] for active[a], n of them),
 * asserting the plan's rules: a stored precision, every part resident or loading. Writes the lep
 * of each expert that runs to lep[a] (the host's later passes over the route read it rather than
 * compute it again: a lep is two multiplies of fields behind a pointer). */
void memsys_run_plan(memsys *m, uint32_t layer, const uint16_t *active, const uint8_t *plan,
                     uint32_t n, uint32_t *lep);
/* The layer's last route has been planned: drops its stale prefetches (the rule above). */
void memsys_end_layer(memsys *m, uint32_t layer, uint64_t now_ns);

/* Bytes of `layer`'s pool (the one pool when shared) held by copies already started: they cannot
 * be evicted until they land, even those of the route's own experts (a copy at another precision
 * than the policy will plan holds room too). A started copy's parts that have landed count while
 * held: an eviction of the whole expert is refused until its last part lands. */
uint64_t memsys_unevictable_bytes(const memsys *m, uint32_t layer);

/* Issue sequence of the transfer loading part index `pi` (a LOADING part); inline: the
 * execution order asks it for every loading part of a route. */
static inline uint64_t memsys_loading_seq(const memsys *m, size_t pi) {
    return m->xf[m->xfer_of[pi]].seq;
}

/* Whether one transfer carries the three parts of lep (so they are all loading): most loads. */
static inline bool memsys_whole_in_one_transfer(const memsys *m, size_t lep) {
    const uint32_t *loading_xfer = m->xfer_of + lep * PART_COUNT;
    return loading_xfer[0] == loading_xfer[1] && loading_xfer[1] == loading_xfer[2] &&
           loading_xfer[0] != MEMSYS_NONE;
}

/* End of run, after every copy has drained: prefetched experts never run count as wasted. */
void memsys_finish(memsys *m);

/* The lep of (le, p), le = layer * E + expert, n_le = L * E. Precision-major: a run keeps its
 * experts at one or two precisions, so the per-expert state it touches on every route lies in a
 * few hundred kilobytes of cache lines, not six times that. */
static inline size_t memsys_lep_of(size_t n_le, size_t le, uint32_t p) {
    return (size_t)p * n_le + le;
}
static inline size_t memsys_lep(const memsys *m, uint32_t layer, uint32_t expert, uint32_t p) {
    return memsys_lep_of(m->n_le, (size_t)layer * m->E + expert, p);
}
/* A lep's precision, and its le = layer * E + expert. */
static inline uint32_t memsys_lep_precision(const memsys *m, size_t lep) {
    return (uint32_t)(lep / m->n_le);
}
static inline uint32_t memsys_lep_le(const memsys *m, size_t lep) {
    return (uint32_t)(lep % m->n_le);
}

/* `bytes` rounded down to whole chunks: a mask for the power-of-two sizes (the default 1 MiB),
 * where two 64-bit divisions per span would cost more than the rest of the span's arithmetic. */
static inline uint64_t memsys_chunks_floor(const memsys *m, uint64_t bytes) {
    if (m->chunk_mask) return bytes & ~m->chunk_mask;
    return bytes / m->cfg.chunk_bytes * m->cfg.chunk_bytes;
}

/* Whether carried part `part` of chunk (or span) c's transfer lands before c's end, and if so
 * after how many bytes of c (the chunks up to the one holding its last byte; the span's own end
 * lands the rest). */
static inline bool memsys_part_lands_inside(const memsys *m, const memsys_chunk *c, int part,
                                            uint64_t *bytes) {
    const memsys_xfer *x = &m->xf[c->xfer];
    uint64_t need = memsys_chunks_floor(m, x->part_end[part] - c->offset + m->cfg.chunk_bytes - 1);
    if (need >= c->bytes) return false;
    *bytes = need;
    return true;
}

/* The next part of chunk (or span) c's transfer that lands before c's end: returns the part and
 * sets *bytes to the bytes of c, from its offset, after which it lands (the chunks up to the one
 * holding its last byte); -1 when none does (memsys_chunk_done lands the parts c completes).
 * Inline: the simulator asks after every landing of a span. */
static inline int memsys_chunk_next_landing(const memsys *m, const memsys_chunk *c,
                                            uint64_t *bytes) {
    const memsys_xfer *x = &m->xf[c->xfer];
    uint32_t pending = x->parts & ~(uint32_t)x->parts_done;
    if (!pending) return -1;
    int part = __builtin_ctz(pending);
    return memsys_part_lands_inside(m, c, part, bytes) ? part : -1;
}

/* Part `part` of transfer `xfer` landed: resident from now on (memsys_chunk_done's step).
 * Inline: the simulator lands most parts itself, inside spans. */
static inline void memsys_part_land(memsys *m, uint32_t xfer, int part) {
    memsys_xfer *x = &m->xf[xfer];
    x->parts_done |= (uint8_t)(1u << part);
    size_t pi = (size_t)x->lep * PART_COUNT + (size_t)part;
    MOESIM_ASSERT(m->state[pi] == POLICY_LOADING && m->xfer_of[pi] == xfer);
    m->state[pi] = POLICY_RESIDENT;
    m->xfer_of[pi] = MEMSYS_NONE;
}

/* Its compute finished: no longer pinned (inline: once per expert op). */
static inline void memsys_unpin_lep(memsys *m, size_t lep) { m->pinned[lep] = 0; }
static inline void memsys_unpin(memsys *m, uint32_t layer, uint32_t expert, moesim_precision p) {
    memsys_unpin_lep(m, memsys_lep(m, layer, expert, p));
}

/* Whether a part in `mask` of one lep's part states st[PART_COUNT] (memsys.state) is not in
 * state `v`. One 32-bit load of the three bytes (state carries a byte of padding after the last
 * lep) instead of three compares: the simulator asks several times per routed activation. */
static inline bool memsys_parts_differ(const uint8_t *st, uint32_t mask, uint8_t v) {
    _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && PART_COUNT == 3,
                   "part i is byte i of the load");
    static const uint32_t bytes_of[8] = {0,        0xff,     0xff00,   0xffff,
                                         0xff0000, 0xff00ff, 0xffff00, 0xffffff};
    uint32_t w;
    memcpy(&w, st, sizeof w);
    return ((w ^ v * 0x010101u) & bytes_of[mask & 7]) != 0;
}

/* The parts (bit i: part i) of one lep's part states st[PART_COUNT] not in state `v`, read as
 * memsys_parts_differ reads them: a byte that differs from v (states are below 0x80) sets its
 * high bit once 0x7f is added, and the multiply gathers bits 0, 8 and 16 of `differ` into bits
 * 16, 17 and 18 (its other products fall on bits 2, 9, 10, 24, 25 and 32: no carries reach
 * them). */
static inline uint32_t memsys_parts_not_in(const uint8_t *st, uint8_t v) {
    _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && PART_COUNT == 3,
                   "part i is byte i of the load");
    _Static_assert(POLICY_RESIDENT < 0x80 && POLICY_LOADING < 0x80 && POLICY_ABSENT < 0x80,
                   "a state's byte plus 0x7f stays within its byte");
    uint32_t w;
    memcpy(&w, st, sizeof w);
    uint32_t x = (w ^ v * 0x010101u) & 0x7f7f7fu;
    uint32_t differ = ((x + 0x7f7f7fu) & 0x808080u) >> 7;
    return (differ * (1u << 16 | 1u << 9 | 1u << 2) >> 16) & 7u;
}

#endif
