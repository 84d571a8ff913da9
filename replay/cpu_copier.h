/* The CPU replay's copy engine (replay/exec_cpu.c, the cpu backend of replay/exec.h): one thread that serves the memory system's
 * host->device queue (core/memsys.h, MEMSYS_H2D) by reading each chunk from the expert file
 * (replay/cpu_store.h) into the DRAM pool blocks of its parts. It takes the next chunk at every
 * chunk boundary, so a demand load overtakes queued prefetches after at most one chunk, as the
 * simulator's engine does.
 *
 * Threads: the memory system is guarded by `lock` (owned by the executor). The copier holds it
 * only to take a chunk and to report it done; it reads with the lock released. Transfers it
 * completes are kept for the executor to report to the policy (cpu_copier_deliver), so every
 * policy callback runs on the executor's thread. Times are ns on CLOCK_MONOTONIC since `t0_ns`. */
#ifndef MOESIM_REPLAY_CPU_COPIER_H
#define MOESIM_REPLAY_CPU_COPIER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "replay/cpu_store.h"
#include "core/memsys.h"
#include "core/timeline.h"

/* Where part `part` of (layer, expert, p) lands: its pool block (set when the load was issued). */
typedef uint8_t *(*cpu_copier_block_fn)(void *ctx, uint32_t layer, uint32_t expert,
                                        moesim_precision p, int part);

typedef struct cpu_copy_record { /* one chunk, for the timeline */
    uint64_t t0_ns, t1_ns;
    uint32_t layer, expert;
    uint8_t prec, cls;
} cpu_copy_record;

typedef struct cpu_copier {
    pthread_t thread;
    pthread_mutex_t *lock;   /* the executor's, guards the memory system */
    pthread_cond_t work;     /* signalled when the queue may have a chunk (on_work) */
    pthread_cond_t progress; /* broadcast after every chunk lands */
    memsys *ms;
    const cpu_store *store;
    cpu_copier_block_fn block;
    void *block_ctx;
    uint8_t *bounce; /* [chunk + 2 * CPU_STORE_ALIGN] for unaligned reads */
    uint64_t t0_ns;
    bool stop, started, failed;
    int io_errno;

    memsys_xfer *done; /* [n_done] completed transfers awaiting delivery */
    uint64_t *done_ns; /* [n_done] */
    uint32_t n_done, cap_done;
    cpu_copy_record *rec; /* [n_rec] when `record` */
    uint64_t n_rec, cap_rec;
    bool record;
    uint64_t busy_ns, bytes;
} cpu_copier;

/* Starts the thread (caller-allocated struct; cpu_copier_stop joins and frees). `chunk_bytes`
 * sizes the bounce buffer. */
void cpu_copier_start(cpu_copier *c, pthread_mutex_t *lock, memsys *ms, const cpu_store *store,
                      cpu_copier_block_fn block, void *block_ctx, uint64_t chunk_bytes,
                      uint64_t t0_ns, bool record);
void cpu_copier_stop(cpu_copier *c);
/* The memory system has work for `engine` (its on_work): wakes the copier (caller holds the
 * lock). */
void cpu_copier_on_work(cpu_copier *c, int engine);
/* Reports every completed transfer to the policy (caller holds the lock). */
void cpu_copier_deliver(cpu_copier *c);
/* Waits for the next chunk to land (caller holds the lock; returns with it held). */
void cpu_copier_wait(cpu_copier *c);
/* True while a chunk is queued or in flight (caller holds the lock). */
bool cpu_copier_busy(const cpu_copier *c);

#endif
