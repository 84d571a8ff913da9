/* A small pthread pool for parallel-for loops: thread i of n always gets the i-th contiguous
 * chunk, the caller's thread takes chunk 0 and waits for the others. One job at a time. */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "common/check.h"
#include "engine/thread_pool.h"

struct thread_pool {
    uint32_t n; /* threads including the caller */
    pthread_t *workers; /* [n - 1] */
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    uint64_t generation; /* bumped per job */
    uint32_t pending;    /* workers still running the current job */
    bool quit;
    void (*fn)(void *, size_t, size_t);
    void *ctx;
    size_t total;
};

typedef struct worker_arg {
    thread_pool *p;
    uint32_t index;
} worker_arg;

static void chunk(size_t total, uint32_t n, uint32_t i, size_t *b, size_t *e) {
    *b = total * i / n;
    *e = total * (i + 1) / n;
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    thread_pool *p = wa->p;
    uint32_t index = wa->index;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->start, &p->mu);
        if (p->quit) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        void (*fn)(void *, size_t, size_t) = p->fn;
        void *ctx = p->ctx;
        size_t total = p->total;
        pthread_mutex_unlock(&p->mu);
        size_t b, e;
        chunk(total, p->n, index, &b, &e);
        if (b < e) fn(ctx, b, e);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

thread_pool *thread_pool_create(uint32_t n_threads) {
    thread_pool *p = moesim_xcalloc(1, sizeof *p);
    p->n = n_threads ? n_threads : 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    p->workers = moesim_xcalloc(p->n, sizeof *p->workers);
    for (uint32_t i = 1; i < p->n; i++) {
        worker_arg *wa = moesim_xmalloc(sizeof *wa);
        wa->p = p;
        wa->index = i;
        MOESIM_ASSERT(pthread_create(&p->workers[i - 1], NULL, worker_main, wa) == 0);
    }
    return p;
}

void thread_pool_destroy(thread_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n; i++) pthread_join(p->workers[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->workers);
    free(p);
}

uint32_t thread_pool_size(const thread_pool *p) { return p->n; }

void thread_pool_run(thread_pool *p, size_t n, void (*fn)(void *ctx, size_t begin, size_t end),
                     void *ctx) {
    if (p->n == 1) {
        if (n) fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    size_t b, e;
    chunk(n, p->n, 0, &b, &e);
    if (b < e) fn(ctx, b, e);
    pthread_mutex_lock(&p->mu);
    while (p->pending) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
