/* The HDF5 plumbing trace_write.c and trace_read.c share: one-line HDF5 error reasons and
 * the parallel chunk codec (traces/h5_chunks.h). */
#include "traces/h5_chunks.h"

#include <libdeflate.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"

/* ---- HDF5 error capture ------------------------------------------------------------------ */

static herr_t first_error_cb(unsigned n, const H5E_error2_t *e, void *data) {
    char *buf = data;
    if (n == 0 && e->desc) snprintf(buf, 160, "%s", e->desc);
    return 0;
}

/* The innermost HDF5 error description (the most specific one), then clears the stack. */
const char *h5_reason(char buf[160]) {
    buf[0] = '\0';
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, first_error_cb, buf);
    H5Eclear2(H5E_DEFAULT);
    if (!buf[0]) snprintf(buf, 160, "HDF5 library error");
    return buf;
}

void h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

void h5_close(hid_t *id, herr_t (*close_fn)(hid_t)) {
    if (*id >= 0) close_fn(*id);
    *id = H5I_INVALID_HID;
}

/* ---- chunk codec ------------------------------------------------------------------------ */

typedef struct chunk_worker {
    chunk_batch *b;
    unsigned index;
} chunk_worker;

/* HDF5's shuffle: byte j of element i goes to j * n + i. */
static void shuffle_bytes(unsigned char *dst, const unsigned char *src, size_t n, size_t s) {
    for (size_t j = 0; j < s; j++) {
        unsigned char *out = dst + j * n;
        const unsigned char *in = src + j;
        for (size_t i = 0; i < n; i++) out[i] = in[i * s];
    }
}

static void unshuffle_bytes(unsigned char *dst, const unsigned char *src, size_t n, size_t s) {
    /* the trace's element sizes (2: expert ids, 4: gates, scores, positions) element by element
     * with sequential stores, which the compiler vectorizes; a store per byte at a stride was a
     * few % of a simulation (every block is read twice) */
    if (s == 2) {
        for (size_t i = 0; i < n; i++) {
            dst[2 * i] = src[i];
            dst[2 * i + 1] = src[n + i];
        }
        return;
    }
    if (s == 4) {
        for (size_t i = 0; i < n; i++) {
            dst[4 * i] = src[i];
            dst[4 * i + 1] = src[n + i];
            dst[4 * i + 2] = src[2 * n + i];
            dst[4 * i + 3] = src[3 * n + i];
        }
        return;
    }
    for (size_t j = 0; j < s; j++) {
        const unsigned char *in = src + j * n;
        unsigned char *out = dst + j;
        for (size_t i = 0; i < n; i++) out[i * s] = in[i];
    }
}

static void *chunk_worker_run(void *arg) {
    chunk_worker *w = arg;
    chunk_batch *b = w->b;
    unsigned char *tmp = b->scratch[w->index];
    for (size_t j = w->index; j < b->n_jobs; j += b->n_threads) {
        chunk_job *job = &b->jobs[j];
        const size_t chunk_bytes = job->chunk_bytes, elem_size = job->elem_size;
        const size_t n_elems = chunk_bytes / elem_size;
        const bool full = job->raw_bytes == chunk_bytes;
        if (b->pack) {
            const unsigned char *src = job->src;
            if (!full) { /* HDF5 stores edge chunks whole: pad with zeros */
                memcpy(job->raw, job->src, job->raw_bytes);
                memset(job->raw + job->raw_bytes, 0, chunk_bytes - job->raw_bytes);
                src = job->raw;
            }
            if (elem_size > 1 && n_elems > 1) {
                shuffle_bytes(tmp, src, n_elems, elem_size);
                src = tmp;
            }
            job->packed_bytes = libdeflate_zlib_compress(b->compressor[w->index], src, chunk_bytes,
                                                         job->packed, b->packed_cap);
            job->ok = job->packed_bytes > 0; /* 0: did not fit (the bound makes it fit) */
        } else {
            bool shuffled = elem_size > 1 && n_elems > 1;
            unsigned char *target = full ? job->dst : job->raw;
            /* the exact size is known: anything else (shorter, longer, corrupt, a wrong
             * checksum) fails */
            job->ok = libdeflate_zlib_decompress(b->decompressor[w->index], job->packed,
                                                 job->packed_bytes, shuffled ? tmp : target,
                                                 chunk_bytes, NULL) == LIBDEFLATE_SUCCESS;
            if (job->ok && shuffled) unshuffle_bytes(target, tmp, n_elems, elem_size);
            if (job->ok && !full) memcpy(job->dst, job->raw, job->raw_bytes);
        }
    }
    return NULL;
}

void chunk_batch_run(chunk_batch *b) {
    if (b->n_jobs == 0) return;
    for (size_t j = 0; j < b->n_jobs; j++)
        MOESIM_ASSERT(b->jobs[j].chunk_bytes <= b->cap_bytes && b->jobs[j].elem_size > 0 &&
                      b->jobs[j].chunk_bytes % b->jobs[j].elem_size == 0 &&
                      b->jobs[j].raw_bytes <= b->jobs[j].chunk_bytes);
    chunk_worker workers[CHUNK_MAX_THREADS];
    pthread_t threads[CHUNK_MAX_THREADS];
    unsigned n = b->n_threads < b->n_jobs ? b->n_threads : (unsigned)b->n_jobs;
    unsigned started = 0;
    for (unsigned i = 0; i < n; i++) workers[i] = (chunk_worker){b, i};
    for (unsigned i = 1; i < n; i++) {
        if (pthread_create(&threads[i], NULL, chunk_worker_run, &workers[i]) != 0) break;
        started = i;
    }
    /* jobs of threads that could not start run here, after this thread's own */
    chunk_worker_run(&workers[0]);
    for (unsigned i = 1; i <= started; i++) pthread_join(threads[i], NULL);
    for (unsigned i = started + 1; i < n; i++) chunk_worker_run(&workers[i]);
}

static unsigned chunk_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    return n > CHUNK_MAX_THREADS ? CHUNK_MAX_THREADS : (unsigned)n;
}

bool chunk_batch_init(chunk_batch *b, size_t cap_bytes, bool pack) {
    memset(b, 0, sizeof *b);
    b->cap_bytes = cap_bytes;
    b->n_threads = chunk_threads();
    b->n_jobs = b->jobs_cap = (size_t)b->n_threads * CHUNK_JOBS_PER_THREAD;
    b->pack = pack;
    b->jobs = calloc(b->n_jobs, sizeof *b->jobs);
    b->scratch = calloc(b->n_threads, sizeof *b->scratch);
    b->compressor = calloc(b->n_threads, sizeof *b->compressor);
    b->decompressor = calloc(b->n_threads, sizeof *b->decompressor);
    bool ok = b->jobs && b->scratch && b->compressor && b->decompressor;
    for (unsigned i = 0; ok && i < b->n_threads; i++) {
        if (pack)
            ok = (b->compressor[i] = libdeflate_alloc_compressor(DEFLATE_LEVEL)) != NULL;
        else
            ok = (b->decompressor[i] = libdeflate_alloc_decompressor()) != NULL;
    }
    /* writing: libdeflate's bound for its own streams; reading: zlib's compressBound formula,
     * the largest stream zlib (HDF5's deflate filter, h5py) makes of cap_bytes */
    if (ok)
        b->packed_cap =
            pack ? libdeflate_zlib_compress_bound(b->compressor[0], cap_bytes)
                 : cap_bytes + (cap_bytes >> 12) + (cap_bytes >> 14) + (cap_bytes >> 25) + 13;
    for (size_t j = 0; ok && j < b->jobs_cap; j++) {
        b->jobs[j].raw = malloc(cap_bytes);
        b->jobs[j].packed = malloc(b->packed_cap);
        ok = b->jobs[j].raw && b->jobs[j].packed;
    }
    for (unsigned i = 0; ok && i < b->n_threads; i++) ok = (b->scratch[i] = malloc(cap_bytes));
    return ok;
}

void chunk_batch_free(chunk_batch *b) {
    for (size_t j = 0; b->jobs && j < b->jobs_cap; j++) {
        free(b->jobs[j].raw);
        free(b->jobs[j].packed);
    }
    for (unsigned i = 0; i < b->n_threads; i++) {
        if (b->scratch) free(b->scratch[i]);
        if (b->compressor) libdeflate_free_compressor(b->compressor[i]);
        if (b->decompressor) libdeflate_free_decompressor(b->decompressor[i]);
    }
    free(b->jobs);
    free(b->scratch);
    free(b->compressor);
    free(b->decompressor);
}
