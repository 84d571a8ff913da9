/* A fixed pool of worker threads running parallel-for loops (engine/thread_pool.c): the engine's
 * matrix-vector products and the replay's expert conversion use it. */
#ifndef MOESIM_ENGINE_THREAD_POOL_H
#define MOESIM_ENGINE_THREAD_POOL_H

#include <stddef.h>
#include <stdint.h>

/* A fixed pool of worker threads running parallel-for loops; deterministic by construction
 * (callers give each index its own output). */
typedef struct thread_pool thread_pool;
thread_pool *thread_pool_create(uint32_t n_threads);
void thread_pool_destroy(thread_pool *p);
uint32_t thread_pool_size(const thread_pool *p);
/* Calls fn(ctx, begin, end) over [0, n) split into contiguous chunks, one per thread. */
void thread_pool_run(thread_pool *p, size_t n, void (*fn)(void *ctx, size_t begin, size_t end),
                     void *ctx);

#endif
