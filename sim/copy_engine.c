/* The simulator's copy engines (sim/sim_internal.h): the host->device copy engine (PCIe) and the
 * SSD read queue, each serving core/memsys.h's queues chunk by chunk in virtual time with three
 * priority classes (demand > prefetch > background): at every chunk boundary an engine serves
 * the head of the highest non-empty class, so a demand load overtakes queued or running
 * prefetches after at most one chunk. A transfer pays its engine's latency once, when its first
 * chunk starts (or every chunk, with the profile's h2d_latency_per_chunk); its parts become
 * resident as their last byte lands. Every chunk end is an event of the run's queue, delivered
 * in (time, seq) order; an idle stretch of one engine may be served as one span event, whose
 * inner part landings the engine delivers itself at their chunks' ends (deliver_next_until). */
#include <math.h>
#include <stdio.h>

#include "common/check.h"
#include "sim/sim_internal.h"

/* ---- memory-system callbacks ---- */

void sim_hbm_note(sim_state *s) {
    uint64_t used = s->non_expert_bytes + s->act_bytes + s->kv_bytes + s->ms.experts_used;
    MOESIM_ASSERT(used <= s->budget_bytes);
    if (used > s->peak_hbm) s->peak_hbm = used;
}

/* Called for every part loaded or dropped: the note inline, the timeline only when on. */
static void on_hbm(void *ctx, uint64_t experts_used) {
    sim_state *s = ctx;
    uint64_t used = s->non_expert_bytes + s->act_bytes + s->kv_bytes + experts_used;
    MOESIM_ASSERT(used <= s->budget_bytes);
    if (used > s->peak_hbm) s->peak_hbm = used;
    if (s->tl.on) sim_timeline_hbm(&s->tl, s->now_ns, experts_used, s->ms.prec_used, &s->tl_hbm);
}

/* sim.block_pools: a load is placed only where the replay could place it, in a block of its
 * precision (core/block_pool.h; the byte budget alone admits loads no block can hold). */
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
    /* A chunk that starts while the stream runs an op is slowed for the w ns until the stream's
     * clock (h2d_slowdown_beside_compute: the CPU kind's disk reads beside the compute thread's
     * kernels); only the op already issued counts: the stream's next is not known yet. */
    if (e->slowdown_beside_compute > 0 && s->t_ns > e->t_start_ns)
        t = e->t_start_ns +
            sim_beside_ns(t - e->t_start_ns, s->t_ns - e->t_start_ns, e->slowdown_beside_compute);
    return t;
}

uint64_t sim_link_busy_ns(const sim_state *s) {
    const sim_engine *e = &s->eng[MEMSYS_H2D];
    if (!e->busy) return 0;
    uint64_t busy = e->t_end_ns > s->t_ns ? e->t_end_ns - s->t_ns : 0;
    memsys_backlog b = memsys_engine_backlog(&s->ms, MEMSYS_H2D);
    if (!b.bytes) return busy;
    uint64_t alone = cost_transfer_ns(b.bytes, e->bytes_per_s) +
                     (e->latency_per_chunk ? b.chunks : b.unstarted) * e->latency_ns;
    return busy + (uint64_t)llround((double)alone * (1 + e->slowdown_beside_compute));
}

/* The first-span times of the chunk in flight (just started) when it is its transfer's first
 * span, whole or all but the last chunk, and no link slowdown makes them depend on the stream's
 * clock, else NULL. */
static const sim_first_span_ns *engine_first_span_ns(sim_state *s, sim_engine *e) {
    const memsys_xfer *x = &s->ms.xf[e->chunk.xfer];
    bool whole = e->chunk.bytes == x->bytes;
    if (e->chunk.offset != 0 || e->slowdown_beside_compute > 0 ||
        !(whole || e->chunk.bytes == memsys_chunks_floor(&s->ms, x->bytes - 1)))
        return NULL;
    sim_first_span_ns *w = &e->first_span[(x->prec << PART_COUNT | x->parts) << 1 | whole];
    if (w->end_ns) return w;
    w->end_ns = engine_end_ns(s, e, e->chunk.bytes) - e->t_start_ns;
    for (int part = 0; part < PART_COUNT; part++) {
        uint64_t bytes;
        bool inside =
            (x->parts & 1u << part) && memsys_part_lands_inside(&s->ms, &e->chunk, part, &bytes);
        w->land_ns[part] = inside ? engine_end_ns(s, e, bytes) - e->t_start_ns : UINT64_MAX;
    }
    return w;
}

/* When the next part of the span in flight lands, if one lands before the span's end: its
 * chunks end then, as they would chunk by chunk (engine_end_ns adds up exactly). Inline: it
 * follows every landing. */
static inline __attribute__((always_inline)) void engine_plan_landing(sim_state *s, sim_engine *e) {
    if (e->times) {
        const memsys_xfer *x = &s->ms.xf[e->chunk.xfer];
        uint32_t pending = x->parts & ~(uint32_t)x->parts_done;
        int part = pending ? __builtin_ctz(pending) : 0;
        uint64_t after = pending ? e->times->land_ns[part] : UINT64_MAX;
        e->land_part = after == UINT64_MAX ? -1 : part;
        e->land_ns = after == UINT64_MAX ? UINT64_MAX : e->t_start_ns + after;
        return;
    }
    uint64_t bytes = 0;
    e->land_part = e->busy ? memsys_chunk_next_landing(&s->ms, &e->chunk, &bytes) : -1;
    e->land_ns = e->land_part < 0 ? UINT64_MAX : engine_end_ns(s, e, bytes);
}

/* Whether engine `id` may serve a span of chunks as one event (memsys_next_span_past_landings):
 * only when no other event can fall on the span's inner boundaries, where chunk by chunk their
 * order would depend on issue sequence: the SSD engine idle (it starts only through on_work,
 * which cuts the span first). Not with a timeline, which draws the stream's stall chunk by
 * chunk. */
static bool engine_may_span(const sim_state *s, int id) {
    return id == MEMSYS_H2D && s->eng[id].spans && !s->tl.on && !s->eng[MEMSYS_SSD].busy;
}

/* Serves the next chunk (or span) if the engine is idle and the memory system has one for it. */
static void engine_kick(sim_state *s, int id) {
    sim_engine *e = &s->eng[id];
    if (e->busy) return;
    memsys_chunk c;
    bool any = engine_may_span(s, id) ? memsys_next_span_past_landings(&s->ms, id, &c)
                                      : memsys_next_chunk(&s->ms, id, &c);
    if (!any) {
        engine_close_segment(s, e);
        return;
    }
    const memsys_xfer *x = &s->ms.xf[c.xfer];
    if (s->tl.on && (e->seg_xfer != c.xfer || e->seg_seq != x->seq)) {
        engine_close_segment(s, e);
        e->seg_xfer = c.xfer;
        e->seg_seq = x->seq;
        e->seg_cls = x->cls;
        e->seg_start_ns = s->now_ns;
        snprintf(e->seg_name, sizeof e->seg_name, "L%u e%u %s %s", x->layer, x->expert,
                 precision_name((moesim_precision)x->prec), cls_name[x->cls]);
    }
    e->busy = true;
    e->chunk = c;
    e->t_start_ns = s->now_ns;
    e->start_xfer_ns = engine_xfer_ns(e, c.offset);
    e->times = engine_first_span_ns(s, e);
    e->t_end_ns = e->times ? s->now_ns + e->times->end_ns : engine_end_ns(s, e, c.bytes);
    engine_plan_landing(s, e);
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
    e->times = NULL;
    e->t_end_ns = engine_end_ns(s, e, keep);
    engine_plan_landing(s, e);
    bool moved = sim_event_cancel(&s->q, EV_CHUNK, (uint32_t)id);
    MOESIM_ASSERT(moved);
    sim_event_push(&s->q, e->t_end_ns, EV_CHUNK, (uint32_t)id);
}

static void on_work(void *ctx, int engine) {
    sim_state *s = ctx;
    const sim_engine *h = &s->eng[MEMSYS_H2D];
    /* new PCIe work that would not take the engine at the span's inner boundaries (a demand copy
     * queued behind the span's, most often) leaves the span whole: cut or not, the engine serves
     * the same bytes at the same times; SSD work always cuts (spans need the SSD idle) */
    bool keep = engine == MEMSYS_H2D && h->busy && memsys_span_unrivalled(&s->ms, &h->chunk);
    if (keep) return; /* busy: its span's end takes the work */
    for (int id = 0; id < MEMSYS_ENGINES; id++) engine_cut_span(s, id);
    engine_kick(s, engine);
}

/* A chunk of engine `id` finished at s->now_ns. Out of line: a landing, which needs none of
 * its registers, is what most deliveries are. */
static __attribute__((noinline)) void engine_chunk_done(sim_state *s, int id) {
    sim_engine *e = &s->eng[id];
    MOESIM_ASSERT(e->busy && e->t_end_ns == s->now_ns);
    e->busy = false;
    e->times = NULL;
    e->land_part = -1;
    e->land_ns = UINT64_MAX;
    e->busy_ns += e->t_end_ns - e->t_start_ns;
    memsys_xfer done;
    bool complete = memsys_chunk_done(&s->ms, &e->chunk, &done);
    if (complete) engine_close_segment(s, e);
    engine_kick(s, id);
    if (complete) memsys_deliver(&s->ms, &done, s->now_ns);
}

/* Delivers what happens next if it happens at or before t_ns: a part landing inside the PCIe
 * span in flight, or the earliest event. A landing comes before its span's end, and while a span
 * is in flight no other event is queued (engine_may_span). Returns false when nothing is due. */
static inline bool deliver_next_until(sim_state *s, uint64_t t_ns) {
    sim_engine *h = &s->eng[MEMSYS_H2D];
    const sim_event *next = sim_event_peek(&s->q);
    if (h->land_part >= 0 && (!next || h->land_ns <= next->t_ns)) {
        if (h->land_ns > t_ns) return false;
        s->now_ns = h->land_ns;
        memsys_part_land(&s->ms, h->chunk.xfer, h->land_part);
        engine_plan_landing(s, h);
        return true;
    }
    if (!next || next->t_ns > t_ns) return false;
    sim_event ev;
    sim_event_pop(&s->q, &ev);
    s->now_ns = ev.t_ns;
    MOESIM_ASSERT(ev.kind == EV_CHUNK && ev.arg < MEMSYS_ENGINES);
    engine_chunk_done(s, (int)ev.arg);
    return true;
}

/* Delivers every event and landing at or before t_ns, in (time, seq) order. */
void sim_deliver_until(sim_state *s, uint64_t t_ns) {
    while (deliver_next_until(s, t_ns)) {
    }
    s->now_ns = t_ns;
}

/* Delivers the next event or landing (the stream is blocked); returns its time. */
uint64_t sim_deliver_next(sim_state *s) {
    bool any = deliver_next_until(s, UINT64_MAX);
    MOESIM_ASSERT(any); /* a part is LOADING, so its transfer has an event or a landing coming */
    return s->now_ns;
}

uint64_t sim_deliver_until_resident(sim_state *s, const uint8_t *st, uint32_t mask) {
    /* the parts waited for are loading, so their transfers have events or landings coming; they
     * stay loading until they land (their expert is pinned: neither evicted nor cancelled) */
    MOESIM_ASSERT(!memsys_parts_differ(st, sim_parts_waiting(st, mask), POLICY_LOADING));
    while (sim_parts_waiting(st, mask)) {
        bool any = deliver_next_until(s, UINT64_MAX);
        MOESIM_ASSERT(any);
    }
    return s->now_ns;
}

memsys_host sim_memsys_host(sim_state *s, bool block_pools) {
    memsys_host h = {.ctx = s, .on_work = on_work, .on_hbm = on_hbm, .hbm_drops = s->tl.on};
    if (block_pools) {
        h.reserve = on_reserve;
        h.release = on_release;
    }
    return h;
}

void sim_engines_init(sim_state *s, const hw_profile *hw, uint64_t chunk_bytes) {
    sim_engine *h = &s->eng[MEMSYS_H2D], *d = &s->eng[MEMSYS_SSD];
    h->bytes_per_s = hw->h2d_bytes_per_s;
    h->latency_ns = hw->h2d_latency_ns;
    h->latency_per_chunk = hw->h2d_latency_per_chunk;
    h->slowdown_beside_compute = hw->h2d_slowdown_beside_compute;
    h->track = SIM_TRACK_H2D;
    d->bytes_per_s = hw->ssd_read_bytes_per_s;
    d->latency_ns = hw->ssd_latency_ns;
    d->track = SIM_TRACK_SSD;
    uint64_t widest = 0; /* the longest transfer: one expert at its widest stored precision */
    for (uint32_t p = 0; p < PREC_COUNT; p++)
        if (sim_expert_bytes_at(s, p) > widest) widest = sim_expert_bytes_at(s, p);
    for (int i = 0; i < MEMSYS_ENGINES; i++) {
        sim_engine *e = &s->eng[i];
        e->seg_xfer = NONE;
        e->land_part = -1;
        e->land_ns = UINT64_MAX;
        if (!(e->bytes_per_s > 0)) continue; /* an engine the profile lacks copies nothing */
        /* a span is cut at the first chunk ending after the cut: that needs every chunk to take
         * time (at least 1 ns: a chunk's exact time of 2 ns or more, whatever the rounding) */
        e->spans = (double)chunk_bytes * 1e9 / e->bytes_per_s >= 2;
        /* a chunk's time depends on the stream's clock when it starts, or an op's on the chunk
         * in flight (sim_link_busy_ns: a span left whole would round it otherwise): chunk by
         * chunk */
        if (e->slowdown_beside_compute > 0 || hw->op_slowdown_beside_copy > 0) e->spans = false;
        if (chunk_bytes & (chunk_bytes - 1)) continue; /* not a power of two: no table */
        e->chunk_shift = (unsigned)__builtin_ctzll(chunk_bytes);
        e->n_at_chunk = widest / chunk_bytes + 2;
        e->ns_at_chunk = arena_calloc(&s->mem, e->n_at_chunk, sizeof *e->ns_at_chunk);
        for (uint64_t k = 0; k < e->n_at_chunk; k++)
            e->ns_at_chunk[k] = cost_transfer_ns(k * chunk_bytes, e->bytes_per_s);
    }
}

void sim_drain(sim_state *s) {
    while (deliver_next_until(s, UINT64_MAX)) {
    }
    MOESIM_ASSERT(s->q.n == 0 && s->ms.started_bytes == 0);
    for (int i = 0; i < MEMSYS_ENGINES; i++) {
        MOESIM_ASSERT(!s->eng[i].busy);
        for (int c = 0; c < MEMSYS_CLASSES; c++) MOESIM_ASSERT(s->ms.head[i][c] == NONE);
    }
}
