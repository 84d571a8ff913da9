/* The CPU replay's copy engine thread (replay/cpu_copier.h). */
#include "replay/cpu_copier.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "replay/exec.h"

/* One piece of a chunk: `bytes` from file offset `off` into `dst`. */
typedef struct segment {
    uint64_t off, bytes;
    uint8_t *dst;
} segment;

/* The chunk's bytes [offset, offset + bytes) of its transfer's stream, part by part. */
static uint32_t chunk_segments(cpu_copier *c, const memsys_chunk *ch, segment seg[PART_COUNT]) {
    const memsys_xfer *x = &c->ms->xf[ch->xfer];
    uint32_t n = 0;
    uint64_t start = 0;
    for (int part = 0; part < PART_COUNT; part++) {
        if (!(x->parts & (1u << part))) continue;
        uint64_t end = x->part_end[part];
        uint64_t lo = ch->offset > start ? ch->offset : start;
        uint64_t hi = ch->offset + ch->bytes < end ? ch->offset + ch->bytes : end;
        if (lo < hi) {
            uint64_t in_part = lo - start;
            seg[n].off = cpu_store_part_offset(c->store, x->layer, x->expert,
                                               (moesim_precision)x->prec, (expert_part)part) +
                         in_part;
            seg[n].bytes = hi - lo;
            seg[n].dst = c->block(c->block_ctx, x->layer, x->expert, (moesim_precision)x->prec,
                                  part) +
                         in_part;
            n++;
        }
        start = end;
    }
    return n;
}

static void record(cpu_copier *c, const memsys_xfer *x, uint64_t t0, uint64_t t1) {
    if (!c->record) return;
    if (c->n_rec == c->cap_rec) {
        c->cap_rec = c->cap_rec ? 2 * c->cap_rec : 1024;
        c->rec = moesim_xrealloc(c->rec, c->cap_rec * sizeof *c->rec);
    }
    c->rec[c->n_rec++] = (cpu_copy_record){t0 - c->t0_ns, t1 - c->t0_ns, x->layer, x->expert,
                                           x->prec, x->cls};
}

static void *copier_main(void *arg) {
    cpu_copier *c = arg;
    pthread_mutex_lock(c->lock);
    while (!c->stop) {
        memsys_chunk ch;
        if (c->failed || !memsys_next_chunk(c->ms, MEMSYS_H2D, &ch)) {
            pthread_cond_wait(&c->work, c->lock);
            continue;
        }
        segment seg[PART_COUNT];
        uint32_t n = chunk_segments(c, &ch, seg);
        memsys_xfer x = c->ms->xf[ch.xfer];
        pthread_mutex_unlock(c->lock);
        uint64_t t0 = replay_exec_clock_ns();
        struct iovec iov[PART_COUNT];
        for (uint32_t i = 0; i < n; i++) {
            MOESIM_ASSERT(i == 0 || seg[i].off == seg[i - 1].off + seg[i - 1].bytes);
            iov[i] = (struct iovec){seg[i].dst, seg[i].bytes};
        }
        bool ok = cpu_store_read_pieces(c->store, seg[0].off, iov, (int)n, c->bounce);
        int e = errno;
        uint64_t t1 = replay_exec_clock_ns();
        pthread_mutex_lock(c->lock);
        if (!ok) { /* an I/O error mid-run: the executor reports it and stops */
            c->failed = true;
            c->io_errno = e;
            pthread_cond_broadcast(&c->progress);
            continue;
        }
        c->busy_ns += t1 - t0;
        c->bytes += ch.bytes;
        record(c, &x, t0, t1);
        memsys_xfer done;
        if (memsys_chunk_done(c->ms, &ch, &done)) {
            if (c->n_done == c->cap_done) {
                c->cap_done = c->cap_done ? 2 * c->cap_done : 64;
                c->done = moesim_xrealloc(c->done, c->cap_done * sizeof *c->done);
                c->done_ns = moesim_xrealloc(c->done_ns, c->cap_done * sizeof *c->done_ns);
            }
            c->done[c->n_done] = done;
            c->done_ns[c->n_done++] = t1 - c->t0_ns;
        }
        pthread_cond_broadcast(&c->progress);
    }
    pthread_mutex_unlock(c->lock);
    return NULL;
}

void cpu_copier_start(cpu_copier *c, pthread_mutex_t *lock, memsys *ms, const cpu_store *store,
                      cpu_copier_block_fn block, void *block_ctx, uint64_t chunk_bytes,
                      uint64_t t0_ns, bool rec) {
    memset(c, 0, sizeof *c);
    c->lock = lock;
    c->ms = ms;
    c->store = store;
    c->block = block;
    c->block_ctx = block_ctx;
    c->t0_ns = t0_ns;
    c->record = rec;
    c->bounce = cpu_store_dma_alloc(chunk_bytes + 2 * CPU_STORE_ALIGN);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->progress, NULL);
    MOESIM_ASSERT(pthread_create(&c->thread, NULL, copier_main, c) == 0);
    c->started = true;
}

void cpu_copier_stop(cpu_copier *c) {
    if (!c->started) return;
    pthread_mutex_lock(c->lock);
    c->stop = true;
    pthread_cond_signal(&c->work);
    pthread_mutex_unlock(c->lock);
    pthread_join(c->thread, NULL);
    pthread_cond_destroy(&c->work);
    pthread_cond_destroy(&c->progress);
    free(c->bounce);
    free(c->done);
    free(c->done_ns);
    free(c->rec);
    c->started = false;
}

void cpu_copier_on_work(cpu_copier *c, int engine) {
    MOESIM_ASSERT(engine == MEMSYS_H2D); /* the CPU run keeps every expert in the file tier */
    pthread_cond_signal(&c->work);
}

void cpu_copier_deliver(cpu_copier *c) {
    for (uint32_t i = 0; i < c->n_done; i++) memsys_deliver(c->ms, &c->done[i], c->done_ns[i]);
    c->n_done = 0;
}

void cpu_copier_wait(cpu_copier *c) {
    if (c->failed) return;
    pthread_cond_wait(&c->progress, c->lock);
}

bool cpu_copier_busy(const cpu_copier *c) {
    for (int cls = 0; cls < MEMSYS_CLASSES; cls++)
        if (c->ms->head[MEMSYS_H2D][cls] != MEMSYS_NONE) return true;
    for (uint32_t i = 0; i < c->ms->n_xf; i++)
        if (c->ms->xf[i].parts && c->ms->xf[i].sent[MEMSYS_H2D] > c->ms->xf[i].done[MEMSYS_H2D])
            return true;
    return false;
}
