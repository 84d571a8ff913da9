/* The memory system shared by the simulator and the replay (core/memsys.h describes the model). */
#include "core/memsys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"

#define NONE MEMSYS_NONE

/* ---- setup ---- */

void memsys_init(memsys *m, const memsys_config *cfg, const memsys_host *host) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->host = *host;
    m->L = cfg->n_layers;
    m->E = cfg->n_experts;
    m->P = PREC_COUNT;
    m->n_le = (size_t)m->L * m->E;
    size_t lep = m->n_le * m->P;
    m->state = moesim_xcalloc(lep * PART_COUNT + 1, 1); /* + 1: memsys_parts_differ's load */
    m->xfer_of = moesim_xmalloc(lep * PART_COUNT * sizeof *m->xfer_of);
    for (size_t i = 0; i < lep * PART_COUNT; i++) m->xfer_of[i] = NONE;
    m->pinned = moesim_xcalloc(lep, 1);
    m->on_ssd = moesim_xcalloc(lep, 1);
    m->pf_unused = moesim_xcalloc(lep, 1);
    m->used_mark = moesim_xcalloc(lep, sizeof *m->used_mark);
    m->pf_mark = moesim_xcalloc((size_t)m->L * m->E, 1);
    m->pf_count = moesim_xcalloc(m->L ? m->L : 1, sizeof *m->pf_count);
    m->pool_used = moesim_xcalloc(cfg->per_layer ? m->L : 1, sizeof *m->pool_used);
    m->free_xf = NONE;
    for (int e = 0; e < MEMSYS_ENGINES; e++)
        for (int c = 0; c < MEMSYS_CLASSES; c++) m->head[e][c] = m->tail[e][c] = NONE;
    m->cur_layer = -1;
    if (cfg->chunk_bytes && !(cfg->chunk_bytes & (cfg->chunk_bytes - 1)))
        m->chunk_mask = cfg->chunk_bytes - 1;
}

void memsys_free(memsys *m) {
    free(m->state);
    free(m->xfer_of);
    free(m->pinned);
    free(m->on_ssd);
    free(m->pf_unused);
    free(m->used_mark);
    free(m->pf_mark);
    free(m->pf_count);
    free(m->pool_used);
    free(m->xf);
    free(m->warm);
    free(m->warm_parts);
    memset(m, 0, sizeof *m);
}

void memsys_attach_policy(memsys *m, const policy_methods *pm, policy *pol) {
    m->pm = pm;
    m->pol = pol;
}

static uint64_t expert_bytes(const memsys *m, uint32_t p) {
    const uint64_t *b = m->cfg.part_bytes[p];
    return b[0] + b[1] + b[2];
}

void memsys_place(memsys *m, const moesim_precision *order, uint32_t n, uint64_t dram_bytes) {
    bool placed[PREC_COUNT] = {false};
    uint64_t left = dram_bytes;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = order[i];
        MOESIM_ASSERT(p < PREC_COUNT && !placed[p]);
        placed[p] = true;
        uint64_t b = expert_bytes(m, p);
        for (uint32_t l = 0; l < m->L; l++)
            for (uint32_t e = 0; e < m->E; e++) {
                if (b <= left)
                    left -= b;
                else
                    m->on_ssd[memsys_lep(m, l, e, p)] = 1;
            }
    }
    for (uint32_t p = 0; p < PREC_COUNT; p++) /* stored but not wanted: on the SSD */
        if (!placed[p] && expert_bytes(m, p))
            for (uint32_t l = 0; l < m->L; l++)
                for (uint32_t e = 0; e < m->E; e++) m->on_ssd[memsys_lep(m, l, e, p)] = 1;
}

moesim_status memsys_parse_host_precisions(const char *text, bool stored[PREC_COUNT],
                                           bool *policy_only, moesim_error *err) {
    memset(stored, 0, PREC_COUNT * sizeof *stored);
    *policy_only = !strcmp(text, "policy");
    if (*policy_only || !strcmp(text, "all")) {
        for (int p = 0; p < PREC_COUNT; p++) stored[p] = true;
        return MOESIM_OK;
    }
    char buf[128];
    if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf)
        return moesim_fail(err, MOESIM_EINPUT, "[sim] host_precisions: longer than %zu characters",
                           sizeof buf - 1);
    /* names apart by spaces or commas ("bf16 int4", "bf16, int4"); an empty item between
     * commas (or at either end) is a typo to report, not a gap to skip */
    for (const char *item = buf;;) {
        size_t n = strcspn(item, ",");
        if (strspn(item, " ") >= n)
            return moesim_fail(err, MOESIM_EINPUT,
                               "[sim] host_precisions: an empty item in '%s' (two commas, or one "
                               "at an end)",
                               text);
        if (!item[n]) break;
        item += n + 1;
    }
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        moesim_precision p;
        if (!precision_from_name(tok, &p))
            return moesim_fail(err, MOESIM_EINPUT,
                               "[sim] host_precisions: unknown precision '%s' (expected 'policy', "
                               "'all' or a list of bf16, fp8, int8, int4, int3, int2)",
                               tok);
        stored[p] = true;
    }
    return MOESIM_OK;
}

uint64_t memsys_place_for_policy(memsys *m, const policy_methods *pm, policy *pol,
                                 moesim_precision fallback, bool policy_only, uint64_t dram_bytes) {
    moesim_precision order[PREC_COUNT];
    uint32_t n = pm->load_precisions ? pm->load_precisions(pol, order) : 0;
    if (!n) order[n++] = fallback;
    MOESIM_ASSERT(n <= PREC_COUNT);
    bool taken[PREC_COUNT] = {false};
    uint64_t widest = 0;
    for (uint32_t i = 0; i < n; i++) {
        taken[order[i]] = true;
        uint64_t b = expert_bytes(m, order[i]);
        if (b > widest) widest = b;
    }
    while (!policy_only) { /* the other stored precisions, smaller first */
        uint32_t best = PREC_COUNT;
        for (uint32_t p = 0; p < PREC_COUNT; p++) {
            uint64_t b = expert_bytes(m, p);
            if (!taken[p] && b && (best == PREC_COUNT || b < expert_bytes(m, best))) best = p;
        }
        if (best == PREC_COUNT) break;
        taken[best] = true;
        order[n++] = (moesim_precision)best;
    }
    memsys_place(m, order, n, dram_bytes);
    return widest;
}

/* ---- pools ---- */

static uint64_t *pool_of(memsys *m, uint32_t layer) {
    return &m->pool_used[m->cfg.per_layer ? layer : 0];
}

static inline __attribute__((always_inline)) void hbm_add(memsys *m, uint32_t layer, uint32_t p,
                                                          uint64_t bytes) {
    *pool_of(m, layer) += bytes;
    MOESIM_ASSERT(*pool_of(m, layer) <= m->cfg.pool_cap_bytes);
    m->prec_used[p] += bytes;
    m->experts_used += bytes;
    if (m->host.on_hbm) m->host.on_hbm(m->host.ctx, m->experts_used);
}

static inline __attribute__((always_inline)) void hbm_sub(memsys *m, uint32_t layer, uint32_t p,
                                                          uint64_t bytes) {
    MOESIM_ASSERT(*pool_of(m, layer) >= bytes && m->prec_used[p] >= bytes);
    *pool_of(m, layer) -= bytes;
    m->prec_used[p] -= bytes;
    m->experts_used -= bytes;
    if (m->host.hbm_drops && m->host.on_hbm) m->host.on_hbm(m->host.ctx, m->experts_used);
}

/* A part leaves HBM (evicted, or its load cancelled). Inline: an eviction drops three. */
static inline __attribute__((always_inline)) void part_drop(memsys *m, uint32_t layer,
                                                            uint32_t expert, uint32_t p, int part) {
    size_t pi = memsys_lep(m, layer, expert, p) * PART_COUNT + part;
    m->state[pi] = POLICY_ABSENT;
    m->xfer_of[pi] = NONE;
    hbm_sub(m, layer, p, m->cfg.part_bytes[p][part]);
    if (m->host.release) m->host.release(m->host.ctx, layer, expert, (moesim_precision)p, part);
}

/* ---- transfers and class queues ---- */

static uint32_t xfer_alloc(memsys *m) {
    if (m->free_xf != NONE) {
        uint32_t i = m->free_xf;
        m->free_xf = m->xf[i].next[0];
        return i;
    }
    if (m->n_xf == m->cap_xf) {
        m->cap_xf = m->cap_xf ? 2 * m->cap_xf : 256;
        m->xf = moesim_xrealloc(m->xf, m->cap_xf * sizeof *m->xf);
    }
    return m->n_xf++;
}

static void xfer_release(memsys *m, uint32_t i) {
    m->xf[i].parts = 0;
    m->xf[i].next[0] = m->free_xf;
    m->free_xf = i;
}

/* A new transfer, every field set one by one: as a compound literal GCC zeroed the struct with
 * `rep stos`, whose start-up was a quarter of mem_load's time (bench/README.md). */
static inline void xfer_start(memsys_xfer *x, uint32_t layer, uint32_t expert, uint32_t p,
                              size_t lep, uint32_t parts, policy_class cls, bool via_ssd,
                              uint64_t seq) {
    _Static_assert(sizeof(memsys_xfer) == 112, "a field added to memsys_xfer is set here too");
    x->layer = layer;
    x->expert = expert;
    x->lep = (uint32_t)lep;
    x->prec = (uint8_t)p;
    x->parts = (uint8_t)parts;
    x->cls = x->issued_cls = (uint8_t)cls;
    x->parts_done = x->queued = 0;
    x->via_ssd = via_ssd;
    x->from_policy = true;
    x->bytes = 0; /* xfer_layout: bytes and part_end */
    for (int e = 0; e < MEMSYS_ENGINES; e++)
        x->sent[e] = x->done[e] = 0, x->next[e] = x->prev[e] = 0;
    x->seq = seq;
}

/* Byte layout of a transfer: its parts in gate, up, down order. */
static void xfer_layout(memsys *m, memsys_xfer *x) {
    const uint64_t *b = m->cfg.part_bytes[x->prec];
    if (x->parts == POLICY_PARTS_ALL) { /* a whole expert (most loads): the loop below unrolled */
        x->part_end[0] = b[0];
        x->part_end[1] = b[0] + b[1];
        x->bytes = x->part_end[2] = b[0] + b[1] + b[2];
        return;
    }
    uint64_t off = 0;
    for (int part = 0; part < PART_COUNT; part++) {
        x->part_end[part] = 0;
        if (!(x->parts & (1u << part))) continue;
        off += b[part];
        x->part_end[part] = off;
    }
    x->bytes = off;
}

static bool xfer_started(const memsys_xfer *x) {
    return x->sent[MEMSYS_H2D] > 0 || x->sent[MEMSYS_SSD] > 0;
}

static void queue_push(memsys *m, int e, uint32_t i) {
    memsys_xfer *x = &m->xf[i];
    uint8_t c = x->cls;
    x->next[e] = NONE;
    x->prev[e] = m->tail[e][c];
    if (m->tail[e][c] == NONE)
        m->head[e][c] = i;
    else
        m->xf[m->tail[e][c]].next[e] = i;
    m->tail[e][c] = i;
    x->queued |= (uint8_t)(1u << e);
}

/* Queues a promoted transfer in its new class by issue order: it was asked for before the class's
 * later requests, and the compute stream runs experts in the order their copies were issued. */
static void queue_insert_by_seq(memsys *m, int e, uint32_t i) {
    memsys_xfer *x = &m->xf[i];
    uint8_t c = x->cls;
    uint32_t prev = NONE, k = m->head[e][c];
    while (k != NONE && m->xf[k].seq < x->seq) prev = k, k = m->xf[k].next[e];
    x->next[e] = k;
    x->prev[e] = prev;
    if (prev == NONE)
        m->head[e][c] = i;
    else
        m->xf[prev].next[e] = i;
    if (k == NONE)
        m->tail[e][c] = i;
    else
        m->xf[k].prev[e] = i;
    x->queued |= (uint8_t)(1u << e);
}

/* Takes transfer i off engine e's queue of its class. */
static inline void queue_remove(memsys *m, int e, uint32_t i) {
    memsys_xfer *x = &m->xf[i];
    uint8_t c = x->cls;
    MOESIM_ASSERT(x->queued & (1u << e));
    uint32_t prev = x->prev[e], next = x->next[e];
    if (prev == NONE)
        m->head[e][c] = next;
    else
        m->xf[prev].next[e] = next;
    if (next == NONE)
        m->tail[e][c] = prev;
    else
        m->xf[next].prev[e] = prev;
    x->queued &= (uint8_t)~(1u << e);
}

/* The engines a transfer's bytes pass through: the SSD (when placement left the expert there),
 * then PCIe unless GPUDirect Storage lands SSD reads in HBM. */
static bool uses_engine(const memsys *m, const memsys_xfer *x, int e) {
    if (e == MEMSYS_SSD) return x->via_ssd;
    return !x->via_ssd || !m->cfg.gpu_direct_storage;
}

/* The engine whose completions land bytes in HBM. */
static int landing_engine(const memsys *m, const memsys_xfer *x) {
    return x->via_ssd && m->cfg.gpu_direct_storage ? MEMSYS_SSD : MEMSYS_H2D;
}

static void notify_work(memsys *m, int e) {
    if (m->host.on_work) m->host.on_work(m->host.ctx, e);
}

/* Moves a queued transfer to a higher class on every engine it is queued on. */
static void xfer_promote(memsys *m, uint32_t i, uint8_t cls) {
    memsys_xfer *x = &m->xf[i];
    uint8_t queued = x->queued;
    for (int e = 0; e < MEMSYS_ENGINES; e++)
        if (queued & (1u << e)) queue_remove(m, e, i);
    x->cls = cls;
    for (int e = 0; e < MEMSYS_ENGINES; e++)
        if (queued & (1u << e)) queue_insert_by_seq(m, e, i);
    m->n.promoted++;
    for (int e = 0; e < MEMSYS_ENGINES; e++)
        if (queued & (1u << e)) notify_work(m, e);
}

/* Drops parts `mask` of a not-started transfer; the transfer goes when it carries nothing. */
static void xfer_drop_parts(memsys *m, uint32_t i, uint32_t mask) {
    memsys_xfer *x = &m->xf[i];
    MOESIM_ASSERT(!xfer_started(x));
    x->parts &= (uint8_t)~mask;
    if (x->parts) {
        xfer_layout(m, x);
        return;
    }
    for (int e = 0; e < MEMSYS_ENGINES; e++)
        if (x->queued & (1u << e)) queue_remove(m, e, i);
    xfer_release(m, i);
}

/* ---- chunks ---- */

/* Bytes of x the engine could take now. */
static uint64_t servable(const memsys_xfer *x, int e) {
    if (e == MEMSYS_H2D && x->via_ssd) return x->done[MEMSYS_SSD] - x->sent[MEMSYS_H2D];
    return x->bytes - x->sent[e];
}

/* Where a span of PCIe chunks of x starting at its sent offset may end (memsys_next_span): at
 * the end of the chunk in which the next of its parts lands, and before its last chunk unless x
 * is a demand copy. Handing out the last chunk takes x off its queue, which chunk by chunk
 * happens only when that chunk starts; only a promotion could tell (it moves queued transfers
 * and leaves others be), and nothing promotes a demand copy. */
static uint64_t span_end(const memsys *m, const memsys_xfer *x, uint64_t offset,
                         bool past_landings) {
    const uint64_t chunk = m->cfg.chunk_bytes;
    uint64_t limit =
        x->cls == POLICY_DEMAND ? x->bytes : offset + memsys_chunks_floor(m, x->bytes - offset - 1);
    if (past_landings) return limit;
    /* the carried parts lie in part order (xfer_layout): the first not landed lands next */
    uint32_t pending = x->parts & ~(uint32_t)x->parts_done;
    uint64_t lands = pending ? x->part_end[__builtin_ctz(pending)] : x->bytes;
    uint64_t end = offset + memsys_chunks_floor(m, lands - offset + chunk - 1);
    return end < limit ? end : limit;
}

enum { CHUNK_ONE, CHUNK_SPAN, CHUNK_SPAN_PAST_LANDINGS };

/* memsys_next_chunk, extended to a span of chunks when `span` allows it. */
static bool next_chunk(memsys *m, int e, int span, memsys_chunk *out) {
    bool staged = e == MEMSYS_SSD && !m->cfg.gpu_direct_storage;
    for (int c = 0; c < MEMSYS_CLASSES; c++)
        for (uint32_t i = m->head[e][c]; i != NONE; i = m->xf[i].next[e]) {
            memsys_xfer *x = &m->xf[i];
            uint64_t n = servable(x, e);
            if (n == 0) continue;
            if (n > m->cfg.chunk_bytes) n = m->cfg.chunk_bytes;
            if (staged) {
                /* the bounce buffer is shared: when the best chunk does not fit, nothing is read */
                if (m->bounce_used + n > m->cfg.bounce_bytes) return false;
                m->bounce_used += n;
            }
            if (span && e == MEMSYS_H2D && !x->via_ssd) {
                uint64_t end = span_end(m, x, x->sent[e], span == CHUNK_SPAN_PAST_LANDINGS);
                if (end > x->sent[e] + n) n = end - x->sent[e];
            }
            *out = (memsys_chunk){.xfer = i, .engine = e, .offset = x->sent[e], .bytes = n,
                                  .first = x->sent[e] == 0, .cls = x->cls};
            if (!xfer_started(x)) m->started_bytes += x->bytes;
            x->sent[e] += n;
            if (x->sent[e] == x->bytes) queue_remove(m, e, i);
            return true;
        }
    return false;
}

bool memsys_next_chunk(memsys *m, int e, memsys_chunk *out) {
    return next_chunk(m, e, CHUNK_ONE, out);
}

bool memsys_next_span(memsys *m, int e, memsys_chunk *out) {
    return next_chunk(m, e, CHUNK_SPAN, out);
}

bool memsys_next_span_past_landings(memsys *m, int e, memsys_chunk *out) {
    return next_chunk(m, e, CHUNK_SPAN_PAST_LANDINGS, out);
}

memsys_backlog memsys_engine_backlog(const memsys *m, int e) {
    memsys_backlog b = {0};
    const uint64_t chunk = m->cfg.chunk_bytes;
    for (int c = 0; c < MEMSYS_CLASSES; c++)
        for (uint32_t i = m->head[e][c]; i != NONE; i = m->xf[i].next[e]) {
            const memsys_xfer *x = &m->xf[i];
            uint64_t left = x->bytes - x->sent[e];
            b.bytes += left;
            b.chunks += (left + chunk - 1) / chunk;
            b.unstarted += x->sent[e] == 0;
        }
    return b;
}

bool memsys_span_unrivalled(const memsys *m, const memsys_chunk *c) {
    const memsys_xfer *x = &m->xf[c->xfer];
    if (x->cls != c->cls) return false;
    for (int cls = 0; cls < c->cls; cls++)
        if (m->head[c->engine][cls] != NONE) return false;
    uint32_t first = m->head[c->engine][c->cls];
    return first == NONE || first == c->xfer || m->xf[first].seq > x->seq;
}

void memsys_span_trim(memsys *m, memsys_chunk *c, uint64_t bytes) {
    memsys_xfer *x = &m->xf[c->xfer];
    MOESIM_ASSERT(bytes > 0 && bytes < c->bytes && x->sent[c->engine] == c->offset + c->bytes);
    x->sent[c->engine] -= c->bytes - bytes;
    c->bytes = bytes;
    /* a span that took the last chunk took x off its queue: back where issue order puts it */
    if (!(x->queued & (1u << c->engine))) queue_insert_by_seq(m, c->engine, c->xfer);
}

uint32_t memsys_chunk_pieces(const memsys *m, const memsys_chunk *c,
                             memsys_piece out[PART_COUNT]) {
    const memsys_xfer *x = &m->xf[c->xfer];
    MOESIM_ASSERT(x->parts && c->offset + c->bytes <= x->bytes);
    uint32_t n = 0;
    uint64_t lo = c->offset, hi = c->offset + c->bytes;
    for (int part = 0; part < PART_COUNT; part++) {
        if (!(x->parts & (1u << part))) continue;
        uint64_t end = x->part_end[part], start = end - m->cfg.part_bytes[x->prec][part];
        uint64_t a = lo > start ? lo : start, b = hi < end ? hi : end;
        if (a < b) out[n++] = (memsys_piece){.part = part, .part_offset = a - start, .bytes = b - a};
    }
    MOESIM_ASSERT(n > 0);
    return n;
}

bool memsys_chunk_done(memsys *m, const memsys_chunk *c, memsys_xfer *done) {
    memsys_xfer *x = &m->xf[c->xfer];
    int e = c->engine;
    MOESIM_ASSERT(x->parts && x->done[e] == c->offset && c->offset + c->bytes <= x->sent[e]);
    x->done[e] += c->bytes;
    if (e == MEMSYS_H2D) {
        m->n.h2d_bytes += c->bytes;
        m->n.h2d_class_bytes[c->cls] += c->bytes;
    } else
        m->n.ssd_bytes += c->bytes;
    if (e != landing_engine(m, x)) { /* staged in the bounce buffer: PCIe may take it */
        notify_work(m, MEMSYS_H2D);
        return false;
    }
    if (x->via_ssd && e == MEMSYS_H2D) { /* its bounce bytes are free again */
        MOESIM_ASSERT(m->bounce_used >= c->bytes);
        m->bounce_used -= c->bytes;
        notify_work(m, MEMSYS_SSD);
    }
    /* the carried parts not landed yet that this chunk completes (most chunks: none), in part
     * order, which is byte order (xfer_layout) */
    for (uint32_t pending = x->parts & ~(uint32_t)x->parts_done; pending; pending &= pending - 1) {
        int part = __builtin_ctz(pending);
        if (x->part_end[part] > x->done[e]) break;
        memsys_part_land(m, c->xfer, part);
    }
    if (x->done[e] < x->bytes) return false;
    *done = *x;
    m->started_bytes -= x->bytes;
    xfer_release(m, c->xfer);
    return true;
}

void memsys_deliver(memsys *m, const memsys_xfer *x, uint64_t now_ns) {
    if (x->from_policy && m->pm && m->pm->on_transfer_done)
        m->pm->on_transfer_done(m->pol, x->layer, x->expert, (moesim_precision)x->prec, x->parts,
                                (policy_class)x->cls, now_ns);
}

/* ---- warm-up ---- */

void memsys_warmup_begin(memsys *m) { m->warmup = true; }

void memsys_warmup_end(memsys *m) {
    m->warmup = false;
    for (uint32_t i = 0; i < m->n_warm; i++) {
        uint32_t lep = m->warm[i];
        uint32_t p = memsys_lep_precision(m, lep), le = memsys_lep_le(m, lep);
        if (m->pm && m->pm->on_transfer_done)
            m->pm->on_transfer_done(m->pol, le / m->E, le % m->E, (moesim_precision)p,
                                    m->warm_parts[i] & 0xfu, (policy_class)(m->warm_parts[i] >> 4),
                                    0);
    }
    m->n_warm = 0;
}

static void warm_note(memsys *m, size_t lep, uint32_t parts, policy_class cls) {
    if (m->n_warm == m->cap_warm) {
        m->cap_warm = m->cap_warm ? 2 * m->cap_warm : 256;
        m->warm = moesim_xrealloc(m->warm, m->cap_warm * sizeof *m->warm);
        m->warm_parts = moesim_xrealloc(m->warm_parts, m->cap_warm);
    }
    m->warm[m->n_warm] = (uint32_t)lep;
    m->warm_parts[m->n_warm++] = (uint8_t)(parts | (uint32_t)cls << 4);
}

/* ---- routes ---- */

void memsys_begin_layer(memsys *m) {
    m->layer_mark++;
    m->layer_seq = m->xfer_seq;
}

/* Transfer i carries a part about to run: the stream needs it now, so its remaining chunks go
 * ahead of every other class. */
static inline void run_loading(memsys *m, uint32_t i) {
    if (m->xf[i].cls != POLICY_DEMAND && m->xf[i].queued) xfer_promote(m, i, POLICY_DEMAND);
}

/* memsys_run of lep `lep` (inline in the plan's loop, which runs it for every planned expert). */
static inline void run_lep(memsys *m, size_t lep) {
    m->pinned[lep] = 1;
    if (m->used_mark[lep] == m->layer_mark) return;
    m->used_mark[lep] = m->layer_mark;
    m->pf_unused[lep] = 0;
    /* resident parts have no transfer (most runs): nothing late, nothing to promote */
    if (!memsys_parts_differ(m->state + lep * PART_COUNT, POLICY_PARTS_ALL, POLICY_RESIDENT))
        return;
    const uint32_t *loading_xfer = m->xfer_of + lep * PART_COUNT;
    if (loading_xfer[0] == loading_xfer[1] && loading_xfer[1] == loading_xfer[2]) {
        if (loading_xfer[0] == NONE) return; /* no part loading: resident and absent ones */
        run_loading(m, loading_xfer[0]); /* one transfer carries the three (most loads) */
        m->n.late += m->xf[loading_xfer[0]].issued_cls == POLICY_PREFETCH;
        return;
    }
    bool late = false;
    for (int part = 0; part < PART_COUNT; part++) {
        uint32_t i = loading_xfer[part];
        if (i == NONE) continue;
        late |= m->xf[i].issued_cls == POLICY_PREFETCH;
        run_loading(m, i);
    }
    m->n.late += late;
}

void memsys_run(memsys *m, uint32_t layer, uint32_t expert, moesim_precision p) {
    run_lep(m, memsys_lep(m, layer, expert, p));
}

void memsys_run_plan(memsys *m, uint32_t layer, const uint16_t *active, const uint8_t *plan,
                     uint32_t n, uint32_t *lep) {
    const size_t le0 = (size_t)layer * m->E;
    for (uint32_t a = 0; a < n; a++) {
        uint8_t pr = plan[a];
        if (pr == POLICY_RUN_SKIP) continue;
        MOESIM_ASSERT(pr < PREC_COUNT && m->cfg.part_bytes[pr][0]);
        size_t l = memsys_lep_of(m->n_le, le0 + active[a], pr);
        lep[a] = (uint32_t)l;
        /* no part absent: a resident expert (most) needs no further look */
        const uint8_t *st = m->state + l * PART_COUNT;
        MOESIM_ASSERT(!memsys_parts_differ(st, POLICY_PARTS_ALL, POLICY_RESIDENT) ||
                      memsys_parts_not_in(st, POLICY_ABSENT) == POLICY_PARTS_ALL);
        run_lep(m, l);
    }
}

/* Cancels a not-started prefetch transfer and tells the policy. */
static void cancel(memsys *m, uint32_t i, uint64_t now_ns) {
    memsys_xfer x = m->xf[i];
    for (int part = 0; part < PART_COUNT; part++)
        if (x.parts & (1u << part)) part_drop(m, x.layer, x.expert, x.prec, part);
    m->pf_unused[x.lep] = 0;
    xfer_drop_parts(m, i, x.parts);
    m->n.cancelled++;
    MOESIM_ASSERT(m->pm && m->pm->on_transfer_cancelled); /* required of prefetching policies */
    m->pm->on_transfer_cancelled(m->pol, x.layer, x.expert, (moesim_precision)x.prec, x.parts,
                                 (policy_class)x.cls, now_ns);
}

void memsys_end_layer(memsys *m, uint32_t layer, uint64_t now_ns) {
    for (int e = 0; e < MEMSYS_ENGINES; e++) {
        uint32_t i = m->head[e][POLICY_PREFETCH];
        while (i != NONE) {
            uint32_t next = m->xf[i].next[e];
            const memsys_xfer *x = &m->xf[i];
            bool stale = x->layer == layer && x->seq < m->layer_seq && !xfer_started(x) &&
                         m->used_mark[x->lep] != m->layer_mark;
            if (stale) cancel(m, i, now_ns);
            i = next;
        }
    }
}

uint64_t memsys_unevictable_bytes(const memsys *m, uint32_t layer) {
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < m->n_xf; i++) {
        const memsys_xfer *x = &m->xf[i];
        if (!x->parts || !xfer_started(x)) continue;
        if (m->cfg.per_layer && x->layer != layer) continue;
        /* the landed parts still held count too: evicting the expert is refused until the
         * rest lands (a policy may evict a landed part alone; then its room is free) */
        size_t lep = x->lep;
        for (int part = 0; part < PART_COUNT; part++) {
            uint32_t bit = 1u << part;
            bool landed = x->parts_done & bit;
            if ((x->parts & bit) && (!landed || m->state[lep * PART_COUNT + part] != POLICY_ABSENT))
                bytes += m->cfg.part_bytes[x->prec][part];
        }
    }
    MOESIM_ASSERT(bytes <= m->started_bytes);
    return bytes;
}

void memsys_finish(memsys *m) {
    size_t lep_n = (size_t)m->L * m->E * m->P;
    for (size_t lep = 0; lep < lep_n; lep++) {
        if (!m->pf_unused[lep]) continue;
        for (int part = 0; part < PART_COUNT; part++)
            if (m->state[lep * PART_COUNT + part] == POLICY_RESIDENT)
                m->n.wasted_bytes += m->cfg.part_bytes[memsys_lep_precision(m, lep)][part];
        m->pf_unused[lep] = 0;
    }
}

/* ---- policy_mem_ops ---- */

static policy_residency mem_state(const policy_mem *m, uint32_t layer, uint32_t expert,
                                  moesim_precision p, expert_part part) {
    MOESIM_ASSERT(layer < m->L && expert < m->E && (uint32_t)p < m->P && part < PART_COUNT);
    return (policy_residency)m->state[memsys_lep(m, layer, expert, p) * PART_COUNT + part];
}

static policy_mem_result mem_load(policy_mem *m, uint32_t layer, uint32_t expert,
                                  moesim_precision p, uint32_t parts_mask, policy_class cls) {
    MOESIM_ASSERT(layer < m->L && expert < m->E && (uint32_t)p < m->P);
    MOESIM_ASSERT(parts_mask && parts_mask <= POLICY_PARTS_ALL && (unsigned)cls < MEMSYS_CLASSES);
    size_t lep = memsys_lep(m, layer, expert, p);
    uint32_t need = 0, promote[PART_COUNT], n_promote = 0;
    uint64_t bytes = 0;
    const uint64_t *part_bytes = m->cfg.part_bytes[p];
    uint8_t *st = m->state + lep * PART_COUNT;
    bool whole = parts_mask == POLICY_PARTS_ALL;
    if (whole && !memsys_parts_differ(st, POLICY_PARTS_ALL, POLICY_RESIDENT)) {
        /* the common cases, a whole resident or absent expert: what the loop below finds */
        if (!part_bytes[0] || !part_bytes[1] || !part_bytes[2]) return POLICY_REFUSED;
        return POLICY_ALREADY;
    } else if (whole && !memsys_parts_differ(st, POLICY_PARTS_ALL, POLICY_ABSENT)) {
        if (!part_bytes[0] || !part_bytes[1] || !part_bytes[2]) return POLICY_REFUSED;
        need = POLICY_PARTS_ALL;
        bytes = part_bytes[0] + part_bytes[1] + part_bytes[2];
    } else if (whole && memsys_whole_in_one_transfer(m, lep)) {
        /* the third common case, a whole expert one transfer is loading (a late prefetch) */
        uint32_t i = m->xfer_of[lep * PART_COUNT];
        if (m->xf[i].cls <= cls) return POLICY_ALREADY;
        xfer_promote(m, i, (uint8_t)cls);
        return POLICY_PROMOTED;
    } else {
        for (int part = 0; part < PART_COUNT; part++) {
            if (!(parts_mask & (1u << part))) continue;
            if (!part_bytes[part]) return POLICY_REFUSED; /* host does not store p */
            size_t pi = lep * PART_COUNT + part;
            if (m->state[pi] == POLICY_LOADING && m->xf[m->xfer_of[pi]].cls > cls)
                promote[n_promote++] = m->xfer_of[pi];
            if (m->state[pi] != POLICY_ABSENT) continue;
            need |= 1u << part;
            bytes += part_bytes[part];
        }
    }
    if (need) {
        if (*pool_of(m, layer) + bytes > m->cfg.pool_cap_bytes) return POLICY_REFUSED;
        if (m->host.reserve && !m->host.reserve(m->host.ctx, layer, expert, p, need))
            return POLICY_REFUSED;
    }
    bool promoted = false;
    for (uint32_t k = 0; k < n_promote; k++)
        if (m->xf[promote[k]].cls > cls) { /* parts of one transfer are listed once each */
            xfer_promote(m, promote[k], (uint8_t)cls);
            promoted = true;
        }
    if (!need) return promoted ? POLICY_PROMOTED : POLICY_ALREADY;
    hbm_add(m, layer, p, bytes);
    if (m->warmup) { /* initial placement: before the clock starts (model loading) */
        for (int part = 0; part < PART_COUNT; part++)
            if (need & (1u << part)) m->state[lep * PART_COUNT + part] = POLICY_RESIDENT;
        m->n.warmup_bytes += bytes;
        warm_note(m, lep, need, cls);
        return POLICY_ISSUED;
    }
    uint32_t i = xfer_alloc(m);
    memsys_xfer *x = &m->xf[i];
    xfer_start(x, layer, expert, p, lep, need, cls, m->on_ssd[lep], m->xfer_seq++);
    xfer_layout(m, x);
    uint32_t *loading_xfer = m->xfer_of + lep * PART_COUNT;
    if (need == POLICY_PARTS_ALL) { /* the common case, a whole expert: the loop below unrolled */
        st[0] = st[1] = st[2] = POLICY_LOADING;
        loading_xfer[0] = loading_xfer[1] = loading_xfer[2] = i;
    } else {
        for (int part = 0; part < PART_COUNT; part++)
            if (need & (1u << part)) st[part] = POLICY_LOADING, loading_xfer[part] = i;
    }
    if (cls == POLICY_PREFETCH) {
        m->n.prefetches++;
        m->pf_unused[lep] = 1;
        size_t le = (size_t)layer * m->E + expert;
        if (!m->pf_mark[le]) {
            m->pf_mark[le] = 1;
            m->pf_count[layer]++;
        }
    }
    if (!x->via_ssd) { /* PCIe alone (most loads): the loops below for it */
        queue_push(m, MEMSYS_H2D, i);
        notify_work(m, MEMSYS_H2D);
        return POLICY_ISSUED;
    }
    for (int e = MEMSYS_ENGINES - 1; e >= 0; e--) /* SSD first: its reads feed PCIe */
        if (uses_engine(m, x, e)) queue_push(m, e, i);
    for (int e = MEMSYS_ENGINES - 1; e >= 0; e--)
        if (uses_engine(m, &m->xf[i], e)) notify_work(m, e);
    return POLICY_ISSUED;
}

static policy_mem_result mem_evict(policy_mem *m, uint32_t layer, uint32_t expert,
                                   moesim_precision p, uint32_t parts_mask) {
    MOESIM_ASSERT(layer < m->L && expert < m->E && (uint32_t)p < m->P);
    MOESIM_ASSERT(parts_mask && parts_mask <= POLICY_PARTS_ALL);
    size_t lep = memsys_lep(m, layer, expert, p);
    if (parts_mask == POLICY_PARTS_ALL &&
        !memsys_parts_differ(m->state + lep * PART_COUNT, POLICY_PARTS_ALL, POLICY_RESIDENT)) {
        /* the common case, a whole resident expert: what the general path below does for it */
        if (m->pinned[lep]) return POLICY_REFUSED;
        if (m->pf_unused[lep]) m->n.wasted_bytes += expert_bytes(m, p);
        m->pf_unused[lep] = 0;
        if (m->host.hbm_drops || m->host.release) { /* heard part by part */
            for (int part = 0; part < PART_COUNT; part++) part_drop(m, layer, expert, p, part);
            return POLICY_ISSUED;
        }
        uint8_t *st = m->state + lep * PART_COUNT;
        uint32_t *loading_xfer = m->xfer_of + lep * PART_COUNT;
        st[0] = st[1] = st[2] = POLICY_ABSENT;
        loading_xfer[0] = loading_xfer[1] = loading_xfer[2] = NONE;
        hbm_sub(m, layer, p, expert_bytes(m, p));
        return POLICY_ISSUED;
    }
    if (!(parts_mask & (parts_mask - 1)) &&
        m->state[lep * PART_COUNT + __builtin_ctz(parts_mask)] == POLICY_RESIDENT) {
        /* one resident part (a sub-expert cache's victims): what the general path does for it */
        int part = __builtin_ctz(parts_mask);
        if (m->pinned[lep]) return POLICY_REFUSED;
        if (m->pf_unused[lep]) m->n.wasted_bytes += m->cfg.part_bytes[p][part];
        part_drop(m, layer, expert, p, part);
        /* byte by byte: part_drop just stored one of them, and a wider load of it would wait
         * for the store to retire (no store forwarding; 3 % of a `firm-moe` run) */
        const uint8_t *st = m->state + lep * PART_COUNT;
        _Static_assert(POLICY_ABSENT == 0,
                       "the three bytes OR to zero exactly when all are absent");
        if ((st[0] | st[1] | st[2]) == POLICY_ABSENT) m->pf_unused[lep] = 0;
        return POLICY_ISSUED;
    }
    bool any = false;
    for (int part = 0; part < PART_COUNT; part++) {
        if (!(parts_mask & (1u << part))) continue;
        uint8_t st = m->state[lep * PART_COUNT + part];
        if (st == POLICY_ABSENT) continue;
        if (m->pinned[lep]) return POLICY_REFUSED;
        if (st == POLICY_LOADING && xfer_started(&m->xf[m->xfer_of[lep * PART_COUNT + part]]))
            return POLICY_REFUSED;
        any = true;
    }
    if (!any) return POLICY_ALREADY;
    uint32_t counted = NONE; /* a cancelled transfer counts once, however many parts it had */
    for (int part = 0; part < PART_COUNT; part++) {
        size_t pi = lep * PART_COUNT + part;
        if (!(parts_mask & (1u << part)) || m->state[pi] == POLICY_ABSENT) continue;
        if (m->state[pi] == POLICY_LOADING) { /* cancel: the copy has not started */
            uint32_t i = m->xfer_of[pi];
            if (m->xf[i].issued_cls == POLICY_PREFETCH && i != counted) {
                m->n.cancelled++;
                counted = i;
            }
            xfer_drop_parts(m, i, 1u << part);
        } else if (m->pf_unused[lep]) {
            m->n.wasted_bytes += m->cfg.part_bytes[p][part];
        }
        part_drop(m, layer, expert, p, part);
    }
    bool left = false;
    for (int part = 0; part < PART_COUNT; part++)
        left |= m->state[lep * PART_COUNT + part] != POLICY_ABSENT;
    if (!left) m->pf_unused[lep] = 0;
    return POLICY_ISSUED;
}

static uint64_t mem_free_bytes(const policy_mem *m, uint32_t layer) {
    uint64_t used = m->pool_used[m->cfg.per_layer ? (layer < m->L ? layer : 0) : 0];
    return m->cfg.pool_cap_bytes - used;
}

static uint64_t mem_used_bytes(const policy_mem *m, moesim_precision p) {
    MOESIM_ASSERT((uint32_t)p < PREC_COUNT);
    return m->prec_used[p];
}

static uint64_t mem_next_use(const policy_mem *cm, uint32_t layer, uint32_t expert) {
    MOESIM_ASSERT(cm->future != NULL);
    /* the future's cursors are a cache: logically const */
    return sim_future_next_use((sim_future *)cm->future, layer, expert, cm->access_pos);
}

static uint32_t mem_future_active(const policy_mem *cm, uint32_t layer, uint16_t *ids,
                                  uint32_t cap) {
    MOESIM_ASSERT(cm->future != NULL && layer < cm->L);
    uint64_t st = (int64_t)layer > cm->cur_layer ? cm->cur_step : cm->cur_step + 1;
    return sim_future_active((sim_future *)cm->future, st, layer, ids, cap);
}

const policy_mem_ops memsys_ops = {
    .state = mem_state,
    .load = mem_load,
    .evict = mem_evict,
    .free_bytes = mem_free_bytes,
    .used_bytes = mem_used_bytes,
    .next_use = mem_next_use,
    .future_active = mem_future_active,
};
