/* The trace's future for the oracle (core/future.h). */
#include "core/future.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/check.h"

#define SIM_FUTURE_READ 65536 /* next-use values read ahead at once (512 KiB) */
/* The builds and the stream's advance stay out of line: inlined, their frame was set up on
 * every query, and a query mostly reads one value. */
#define NOT_INLINED __attribute__((noinline))

void sim_future_init(sim_future *f, const trace *tr, const sim_schedule *sch) {
    memset(f, 0, sizeof *f);
    f->tr = tr;
    f->sch = sch;
    f->L = tr->meta.n_layers;
    f->E = tr->meta.n_experts;
    f->K = tr->meta.top_k;
}

void sim_future_init_requests(sim_future *f, const trace_meta *meta,
                              const trace_request_index *rq, uint32_t batch,
                              uint32_t max_step_tokens, sim_future_rows rows, void *ctx) {
    memset(f, 0, sizeof *f);
    f->L = meta->n_layers;
    f->E = meta->n_experts;
    f->K = meta->top_k;
    f->rq = rq;
    f->batch = batch;
    f->max_step_tokens = max_step_tokens;
    sim_future_set_rows(f, rows, ctx);
}

void sim_future_set_rows(sim_future *f, sim_future_rows rows, void *ctx) {
    f->rows = rows;
    f->rows_ctx = ctx;
}

void sim_future_set_ids_stream(sim_future *f, trace_stream *s) { f->ids_stream = s; }

/* The routing of `token` at `layer`: [K]. */
static const uint16_t *experts_of(const sim_future *f, uint64_t token, uint32_t layer) {
    if (!f->rows) return trace_experts(f->tr, token, layer);
    uint64_t local;
    const trace *b = f->rows(f->rows_ctx, token, &local);
    return trace_experts(b, local, layer);
}

void sim_future_free(sim_future *f) {
    if (f->nxt) close(f->le_fd), close(f->next_fd);
    free(f->nxt);
    free(f->rd_le);
    free(f->rd);
    sim_schedule_iter_free(&f->win);
    free(f->win_tokens);
    free(f->use_pos32);
    free(f->use_pos64);
    free(f->use_first);
    free(f->use_cur);
    memset(f, 0, sizeof *f);
}

/* The accesses of one step's tokens, layer by layer, slot by slot. */
static void visit_step(sim_future *f, const uint32_t *tokens, uint32_t n,
                       void (*visit)(sim_future *, size_t, uint64_t *), uint64_t *ctx) {
    for (uint32_t l = 0; l < f->L; l++)
        for (uint32_t i = 0; i < n; i++) {
            const uint16_t *ex = experts_of(f, tokens[i], l);
            for (uint32_t k = 0; k < f->K; k++)
                if (ex[k] != TRACE_NO_EXPERT) visit(f, (size_t)l * f->E + ex[k], ctx);
        }
}

/* Calls visit(f, le, ctx) for every access in execution order (the schedule in memory). */
static void for_each_access(sim_future *f, void (*visit)(sim_future *, size_t, uint64_t *),
                            uint64_t *ctx) {
    const sim_schedule *s = f->sch;
    for (uint64_t st = 0; st < s->n_steps; st++)
        visit_step(f, s->tokens + s->steps[st].first, s->steps[st].n_tokens, visit, ctx);
}

/* Tokens of step `step` (*n of them), or NULL past the last step. */
static const uint32_t *step_tokens(sim_future *f, uint64_t step, uint32_t *n) {
    if (f->sch) {
        if (step >= f->sch->n_steps) return NULL;
        *n = f->sch->steps[step].n_tokens;
        return f->sch->tokens + f->sch->steps[step].first;
    }
    if (!f->win_tokens) {
        sim_schedule_iter_init(&f->win, f->rq, f->batch, 0, 0);
        f->win_tokens = moesim_xmalloc(2 * (size_t)f->max_step_tokens * sizeof *f->win_tokens);
        f->win_step[0] = f->win_step[1] = UINT64_MAX;
    }
    for (;;) {
        for (int h = 0; h < 2; h++)
            if (f->win_step[h] == step) {
                *n = f->win_n[h];
                return f->win_tokens + (size_t)h * f->max_step_tokens;
            }
        /* steps are asked for in order, at most one back: produce the next into the older half */
        MOESIM_ASSERT(f->win.step <= step);
        int h = f->win.step % 2;
        sim_schedule_step sd;
        uint64_t kv;
        if (!sim_schedule_next(&f->win, &sd, &kv, f->win_tokens + (size_t)h * f->max_step_tokens,
                               NULL, NULL))
            return NULL;
        f->win_step[h] = f->win.step - 1;
        f->win_n[h] = sd.n_tokens;
    }
}

static void count_use(sim_future *f, size_t le, uint64_t *ctx) {
    (void)ctx;
    f->use_first[le + 1]++;
}

static void place_use(sim_future *f, size_t le, uint64_t *pos) {
    uint64_t at = f->use_cur[le]++;
    if (f->use_pos32)
        f->use_pos32[at] = (uint32_t)(*pos)++;
    else
        f->use_pos64[at] = (*pos)++;
}

static NOT_INLINED void build(sim_future *f) {
    size_t LE = (size_t)f->L * f->E;
    f->use_first = moesim_xcalloc(LE + 1, sizeof *f->use_first);
    f->use_cur = moesim_xcalloc(LE ? LE : 1, sizeof *f->use_cur);
    for_each_access(f, count_use, NULL);
    for (size_t i = 0; i < LE; i++) f->use_first[i + 1] += f->use_first[i];
    uint64_t total = f->use_first[LE];
    if (total < UINT32_MAX)
        f->use_pos32 = moesim_xcalloc(total ? total : 1, sizeof *f->use_pos32);
    else
        f->use_pos64 = moesim_xcalloc(total, sizeof *f->use_pos64);
    memcpy(f->use_cur, f->use_first, LE * sizeof *f->use_cur);
    uint64_t pos = 0;
    for_each_access(f, place_use, &pos);
    memcpy(f->use_cur, f->use_first, LE * sizeof *f->use_cur);
    f->built = true;
}

static uint64_t use_pos_at(const sim_future *f, uint64_t i) {
    return f->use_pos32 ? f->use_pos32[i] : f->use_pos64[i];
}

/* ---- the next-use stream (no schedule in memory) ---- */

/* A temporary file nobody else sees (unlinked at once). The oracle cannot run without it: a
 * failure is fatal, with one line saying why. */
static int temp_fd(void) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    char path[4096];
    snprintf(path, sizeof path, "%s/moesim-future.XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "moesim: cannot create a temporary file in %s for the oracle's future: %s\n",
                dir, strerror(errno));
        abort();
    }
    unlink(path);
    return fd;
}

static void file_io(bool write_it, int fd, void *buf, size_t bytes, uint64_t offset) {
    char *p = buf;
    while (bytes) {
        ssize_t n = write_it ? pwrite(fd, p, bytes, (off_t)offset) : pread(fd, p, bytes, (off_t)offset);
        if (n <= 0) {
            fprintf(stderr, "moesim: the oracle's temporary future file: %s\n",
                    n < 0 ? strerror(errno) : "short read");
            abort();
        }
        p += n;
        bytes -= (size_t)n;
        offset += (uint64_t)n;
    }
}

/* The expert ids of a step's tokens into ids [n][L][K]: read alone from the ids stream (a run
 * of consecutive tokens at once), else copied from their rows. */
static void step_ids(const sim_future *f, bool ids_alone, const uint32_t *tokens, uint32_t n,
                     uint16_t *ids) {
    const size_t per_token = (size_t)f->L * f->K;
    for (uint32_t i = 0, run; i < n; i += run) {
        for (run = 1; i + run < n && tokens[i + run] == tokens[i] + run; run++) continue;
        if (ids_alone) {
            trace_stream_read_experts(f->ids_stream, tokens[i], run, ids + i * per_token);
            continue;
        }
        for (uint32_t j = i; j < i + run; j++)
            memcpy(ids + j * per_token, experts_of(f, tokens[j], 0), per_token * sizeof *ids);
    }
}

/* The (layer, expert) of each access of a step's tokens (ids: their [n][L][K] expert ids), in
 * execution order; returns the count. */
static uint64_t step_les(const sim_future *f, const uint16_t *ids, uint32_t n, uint32_t *le) {
    const uint32_t L = f->L, K = f->K;
    uint64_t c = 0;
    for (uint32_t l = 0; l < L; l++) {
        const uint32_t layer_first = l * f->E;
        for (uint32_t i = 0; i < n; i++) {
            const uint16_t *ex = ids + ((size_t)i * L + l) * K;
            /* written whatever the id, kept when it is an expert's: no jump to mispredict */
            for (uint32_t k = 0; k < K; k++) {
                le[c] = layer_first + ex[k];
                c += ex[k] != TRACE_NO_EXPERT;
            }
        }
    }
    return c;
}

/* Forward: each access's (layer, expert) to the le file at its position. Backward over that
 * file: each access's next use (the last one seen, going back) written at its position. The trace
 * is read once, its expert ids alone from the ids stream (its decompression was most of the
 * future's cost) unless the stream caches every block: the run then reads the blocks this
 * pass reads whole from the cache. */
static NOT_INLINED void build_stream(sim_future *f) {
    const bool ids_alone = f->ids_stream && !trace_stream_caches_every_block(f->ids_stream);
    size_t LE = (size_t)f->L * f->E, MT = f->max_step_tokens, MA = MT * f->L * f->K;
    size_t cap = MA > SIM_FUTURE_READ ? MA : SIM_FUTURE_READ;
    uint32_t *tokens = moesim_xmalloc((MT ? MT : 1) * sizeof *tokens);
    uint16_t *ids = moesim_xmalloc((MA ? MA : 1) * sizeof *ids);
    uint32_t *le = moesim_xmalloc(cap * sizeof *le);
    f->le_fd = temp_fd();
    sim_schedule_iter it;
    sim_schedule_iter_init(&it, f->rq, f->batch, 0, 0);
    sim_schedule_step sd;
    uint64_t kv, total = 0;
    while (sim_schedule_next(&it, &sd, &kv, tokens, NULL, NULL)) {
        step_ids(f, ids_alone, tokens, sd.n_tokens, ids);
        uint64_t c = step_les(f, ids, sd.n_tokens, le);
        if (c) file_io(true, f->le_fd, le, c * sizeof *le, total * sizeof *le);
        total += c;
    }
    sim_schedule_iter_free(&it);
    free(tokens);
    free(ids);
    f->n_access = total;
    f->next_fd = temp_fd();
    f->nxt = moesim_xmalloc((LE ? LE : 1) * sizeof *f->nxt);
    for (size_t i = 0; i < LE; i++) f->nxt[i] = UINT64_MAX;
    f->rd = moesim_xmalloc(SIM_FUTURE_READ * sizeof *f->rd);
    for (uint64_t end = total; end > 0;) { /* rd is the backward pass's next-use buffer */
        uint64_t c = end < SIM_FUTURE_READ ? end : SIM_FUTURE_READ, first = end - c;
        file_io(false, f->le_fd, le, c * sizeof *le, first * sizeof *le);
        for (uint64_t q = c; q-- > 0;) {
            f->rd[q] = f->nxt[le[q]];
            f->nxt[le[q]] = first + q;
        }
        file_io(true, f->next_fd, f->rd, c * sizeof *f->rd, first * sizeof *f->rd);
        end = first;
    }
    f->rd_le = le;
    f->built = true; /* nxt now holds every expert's first use: nothing consumed yet */
}

/* Reads the (layer, expert) and next use of accesses from `p` on into rd_le and rd. */
static void read_ahead(sim_future *f, uint64_t p) {
    MOESIM_ASSERT(p < f->n_access);
    uint64_t left = f->n_access - p;
    f->rd_first = p;
    f->rd_n = left < SIM_FUTURE_READ ? left : SIM_FUTURE_READ;
    file_io(false, f->le_fd, f->rd_le, f->rd_n * sizeof *f->rd_le, p * sizeof *f->rd_le);
    file_io(false, f->next_fd, f->rd, f->rd_n * sizeof *f->rd, p * sizeof *f->rd);
}

/* Applies the next uses of accesses [consumed, pos): nxt[le] becomes le's first use >= pos. */
static NOT_INLINED void consume_to(sim_future *f, uint64_t pos) {
    while (f->consumed < pos) {
        if (f->consumed == f->rd_first + f->rd_n) read_ahead(f, f->consumed);
        uint64_t end = f->rd_first + f->rd_n;
        if (end > pos) end = pos;
        const uint32_t *le = f->rd_le - f->rd_first;
        const uint64_t *next = f->rd - f->rd_first;
        for (uint64_t p = f->consumed; p < end; p++) f->nxt[le[p]] = next[p];
        f->consumed = end;
    }
}

/* sim_future_next_use with the schedule in memory: le's cursor moves up to pos. */
static NOT_INLINED uint64_t index_next_use(sim_future *f, size_t le, uint64_t pos) {
    if (!f->built) build(f);
    uint64_t end = f->use_first[le + 1];
    while (f->use_cur[le] < end && use_pos_at(f, f->use_cur[le]) < pos) f->use_cur[le]++;
    if (f->use_cur[le] == end) return UINT64_MAX;
    return use_pos_at(f, f->use_cur[le]) - pos;
}

/* The stream's answer once it is built and consumed up to pos. */
static inline uint64_t stream_next_use(const sim_future *f, size_t le, uint64_t pos) {
    uint64_t next = f->nxt[le];
    return next == UINT64_MAX ? UINT64_MAX : next - pos;
}

/* stream_next_use after building the stream or consuming up to pos (a route's first query). */
static NOT_INLINED uint64_t stream_next_use_advancing(sim_future *f, size_t le, uint64_t pos) {
    if (!f->built) build_stream(f);
    consume_to(f, pos);
    f->nxt_answers_below = f->consumed + 1;
    return stream_next_use(f, le, pos);
}

uint64_t sim_future_next_use(sim_future *f, uint32_t layer, uint32_t expert, uint64_t pos) {
    MOESIM_ASSERT(layer < f->L && expert < f->E);
    size_t le = (size_t)layer * f->E + expert;
    /* one compare for most queries: the route's position was reached by an earlier one */
    if (pos < f->nxt_answers_below) return stream_next_use(f, le, pos);
    if (f->sch) return index_next_use(f, le, pos);
    return stream_next_use_advancing(f, le, pos);
}

uint32_t sim_future_active(sim_future *f, uint64_t step, uint32_t layer, uint16_t *ids,
                           uint32_t cap) {
    MOESIM_ASSERT(layer < f->L);
    uint32_t n_tok;
    const uint32_t *tokens = step_tokens(f, step, &n_tok);
    if (!tokens) return 0;
    /* a bitmap of the ids seen: read word by word, it gives them distinct and ascending */
    uint64_t seen[(MODEL_MAX_EXPERTS + 63) / 64];
    const uint32_t n_words = (f->E + 63) / 64, K = f->K;
    for (uint32_t w = 0; w < n_words; w++) seen[w] = 0;
    for (uint32_t i = 0; i < n_tok; i++) {
        const uint16_t *ex = experts_of(f, tokens[i], layer);
        for (uint32_t k = 0; k < K; k++) {
            const uint32_t e = ex[k];
            if (e != TRACE_NO_EXPERT) seen[e >> 6] |= 1ull << (e & 63);
        }
    }
    uint32_t n = 0;
    for (uint32_t w = 0; w < n_words; w++)
        for (uint64_t bits = seen[w]; bits; bits &= bits - 1, n++)
            if (n < cap) ids[n] = (uint16_t)(w * 64 + (uint32_t)__builtin_ctzll(bits));
    return n;
}
