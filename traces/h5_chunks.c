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

/* HDF5's shuffle: byte j of element i goes to j * n + i (plane j holds byte j of every
 * element). The trace's element sizes, 2 (expert ids) and 4 (gates, scores, positions), go 16
 * elements a step through SSE2 (x86-64's baseline) byte interleaves; other sizes, the last
 * n % 16 elements and other architectures go byte by byte. Every byte a simulation reads is
 * unshuffled, and -O2 leaves element-by-element loops scalar (3 instructions a byte, 1.1 G of
 * a 7.3 G look-ahead run; now 0.35 a byte). */

/* Elements [from, n), byte by byte: the tails and the other sizes and architectures. */
static void shuffle_scalar(unsigned char *dst, const unsigned char *src, size_t n, size_t s,
                           size_t from) {
    for (size_t j = 0; j < s; j++)
        for (size_t i = from; i < n; i++) dst[j * n + i] = src[i * s + j];
}

static void unshuffle_scalar(unsigned char *dst, const unsigned char *src, size_t n, size_t n_out,
                             size_t s, size_t from) {
    for (size_t i = from; i < n_out; i++)
        for (size_t j = 0; j < s; j++) dst[i * s + j] = src[j * n + i];
}

#if defined(__SSE2__)
#include <emmintrin.h>

#define SHUFFLE_STEP 16 /* elements a vector step moves: one 16-byte load or store per plane */

static __m128i load16(const unsigned char *p) { return _mm_loadu_si128((const __m128i *)p); }
static void store16(unsigned char *p, __m128i v) { _mm_storeu_si128((__m128i *)p, v); }

/* Even and odd bytes of a and b, 16 of each: the inverse of _mm_unpack{lo,hi}_epi8. */
static void split_bytes(__m128i a, __m128i b, __m128i *even, __m128i *odd) {
    const __m128i low = _mm_set1_epi16(0x00FF);
    *even = _mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(b, low));
    *odd = _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8));
}

/* The elements of whole steps; returns how many (the rest is the scalar tail's). */
static size_t shuffle_simd(unsigned char *dst, const unsigned char *src, size_t n, size_t s) {
    const size_t whole = n / SHUFFLE_STEP * SHUFFLE_STEP;
    if (s == 2) {
        for (size_t i = 0; i < whole; i += SHUFFLE_STEP) {
            __m128i b0, b1;
            split_bytes(load16(src + 2 * i), load16(src + 2 * i + 16), &b0, &b1);
            store16(dst + i, b0);
            store16(dst + n + i, b1);
        }
        return whole;
    }
    if (s == 4) { /* bytes 0 and 2 apart from 1 and 3, then each pair apart */
        for (size_t i = 0; i < whole; i += SHUFFLE_STEP) {
            const unsigned char *in = src + 4 * i;
            __m128i b02_lo, b13_lo, b02_hi, b13_hi, b0, b1, b2, b3;
            split_bytes(load16(in), load16(in + 16), &b02_lo, &b13_lo);
            split_bytes(load16(in + 32), load16(in + 48), &b02_hi, &b13_hi);
            split_bytes(b02_lo, b02_hi, &b0, &b2);
            split_bytes(b13_lo, b13_hi, &b1, &b3);
            store16(dst + i, b0);
            store16(dst + n + i, b1);
            store16(dst + 2 * n + i, b2);
            store16(dst + 3 * n + i, b3);
        }
        return whole;
    }
    return 0;
}

static size_t unshuffle_simd(unsigned char *dst, const unsigned char *src, size_t n, size_t n_out,
                             size_t s) {
    const size_t whole = n_out / SHUFFLE_STEP * SHUFFLE_STEP;
    if (s == 2) {
        for (size_t i = 0; i < whole; i += SHUFFLE_STEP) {
            __m128i b0 = load16(src + i), b1 = load16(src + n + i);
            store16(dst + 2 * i, _mm_unpacklo_epi8(b0, b1));
            store16(dst + 2 * i + 16, _mm_unpackhi_epi8(b0, b1));
        }
        return whole;
    }
    if (s == 4) { /* byte pairs 0-1 and 2-3 first, then the pairs into elements */
        for (size_t i = 0; i < whole; i += SHUFFLE_STEP) {
            __m128i b0 = load16(src + i), b1 = load16(src + n + i);
            __m128i b2 = load16(src + 2 * n + i), b3 = load16(src + 3 * n + i);
            __m128i b01_lo = _mm_unpacklo_epi8(b0, b1), b01_hi = _mm_unpackhi_epi8(b0, b1);
            __m128i b23_lo = _mm_unpacklo_epi8(b2, b3), b23_hi = _mm_unpackhi_epi8(b2, b3);
            unsigned char *out = dst + 4 * i;
            store16(out, _mm_unpacklo_epi16(b01_lo, b23_lo));
            store16(out + 16, _mm_unpackhi_epi16(b01_lo, b23_lo));
            store16(out + 32, _mm_unpacklo_epi16(b01_hi, b23_hi));
            store16(out + 48, _mm_unpackhi_epi16(b01_hi, b23_hi));
        }
        return whole;
    }
    return 0;
}
#endif

void h5_shuffle_bytes(unsigned char *dst, const unsigned char *src, size_t n, size_t s) {
    size_t done = 0;
#if defined(__SSE2__)
    done = shuffle_simd(dst, src, n, s);
#endif
    shuffle_scalar(dst, src, n, s, done);
}

void h5_unshuffle_bytes(unsigned char *dst, const unsigned char *src, size_t n, size_t n_out,
                        size_t s) {
    size_t done = 0;
#if defined(__SSE2__)
    done = unshuffle_simd(dst, src, n, n_out, s);
#endif
    unshuffle_scalar(dst, src, n, n_out, s, done);
}

bool chunk_is_shuffled(size_t chunk_bytes, size_t elem_size) {
    return elem_size > 1 && chunk_bytes / elem_size > 1;
}

void chunk_take_elems(unsigned char *dst, const unsigned char *chunk, size_t chunk_bytes,
                      size_t elem_size, size_t first, size_t count) {
    if (!chunk_is_shuffled(chunk_bytes, elem_size)) {
        memcpy(dst, chunk + first * elem_size, count * elem_size);
        return;
    }
    /* plane j of the elements from `first` on starts at chunk + j * n + first */
    h5_unshuffle_bytes(dst, chunk + first, chunk_bytes / elem_size, count, elem_size);
}

void chunk_gather_runs(unsigned char *dst, const unsigned char *src, size_t bytes, size_t run_bytes,
                       size_t stride) {
    for (size_t at = 0; at < bytes; at += run_bytes, src += stride)
        memcpy(dst + at, src, run_bytes);
}

void chunk_scatter_runs(unsigned char *dst, const unsigned char *src, size_t bytes,
                        size_t run_bytes, size_t stride) {
    for (size_t at = 0; at < bytes; at += run_bytes, dst += stride)
        memcpy(dst, src + at, run_bytes);
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
            if (job->run_stride) {
                chunk_gather_runs(job->raw, job->src, job->raw_bytes, job->run_bytes,
                                  job->run_stride);
                memset(job->raw + job->raw_bytes, 0, chunk_bytes - job->raw_bytes);
                src = job->raw;
            } else if (!full) { /* HDF5 stores edge chunks whole: pad with zeros */
                memcpy(job->raw, job->src, job->raw_bytes);
                memset(job->raw + job->raw_bytes, 0, chunk_bytes - job->raw_bytes);
                src = job->raw;
            }
            if (chunk_is_shuffled(chunk_bytes, elem_size)) {
                h5_shuffle_bytes(tmp, src, n_elems, elem_size);
                src = tmp;
            }
            job->packed_bytes =
                libdeflate_zlib_compress(b->compressor[w->index * CHUNK_LEVELS + job->level], src,
                                         chunk_bytes, job->packed, b->packed_cap);
            job->ok = job->packed_bytes > 0; /* 0: did not fit (the bound makes it fit) */
        } else {
            bool shuffled = chunk_is_shuffled(chunk_bytes, elem_size) && !job->keep_shuffled;
            /* a short last chunk unshuffles its real elements straight into dst; one that is
             * not shuffled inflates whole into raw and its real bytes are copied; one kept
             * shuffled inflates whole into dst; one of runs goes through raw */
            bool into_dst = (full || job->keep_shuffled) && !job->run_stride;
            unsigned char *target = shuffled ? tmp : into_dst ? job->dst : job->raw;
            unsigned char *unshuffled = job->run_stride ? job->raw : job->dst;
            /* the exact size is known: anything else (shorter, longer, corrupt, a wrong
             * checksum) fails */
            job->ok = libdeflate_zlib_decompress(b->decompressor[w->index], job->packed,
                                                 job->packed_bytes, target, chunk_bytes,
                                                 NULL) == LIBDEFLATE_SUCCESS;
            if (job->ok && shuffled)
                h5_unshuffle_bytes(unshuffled, tmp, n_elems, job->raw_bytes / elem_size,
                                   elem_size);
            if (job->ok && job->run_stride)
                chunk_scatter_runs(job->dst, job->raw, job->raw_bytes, job->run_bytes,
                                   job->run_stride);
            else if (job->ok && !shuffled && !full && !job->keep_shuffled)
                memcpy(job->dst, job->raw, job->raw_bytes);
        }
    }
    return NULL;
}

void chunk_batch_run(chunk_batch *b) {
    if (b->n_jobs == 0) return;
    for (size_t j = 0; j < b->n_jobs; j++)
        MOESIM_ASSERT(b->jobs[j].chunk_bytes <= b->cap_bytes && b->jobs[j].elem_size > 0 &&
                      b->jobs[j].chunk_bytes % b->jobs[j].elem_size == 0 &&
                      b->jobs[j].raw_bytes % b->jobs[j].elem_size == 0 &&
                      b->jobs[j].raw_bytes <= b->jobs[j].chunk_bytes &&
                      (!b->jobs[j].run_stride ||
                       (!b->jobs[j].keep_shuffled && b->jobs[j].run_bytes &&
                        b->jobs[j].raw_bytes % b->jobs[j].run_bytes == 0)));
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
    b->compressor = calloc((size_t)b->n_threads * CHUNK_LEVELS, sizeof *b->compressor);
    b->decompressor = calloc(b->n_threads, sizeof *b->decompressor);
    bool ok = b->jobs && b->scratch && b->compressor && b->decompressor;
    static const int levels[CHUNK_LEVELS] = {DEFLATE_LEVEL, LOOKAHEAD_DEFLATE_LEVEL};
    for (unsigned i = 0; ok && i < b->n_threads; i++) {
        for (int l = 0; ok && pack && l < CHUNK_LEVELS; l++)
            ok = (b->compressor[i * CHUNK_LEVELS + l] = libdeflate_alloc_compressor(levels[l]));
        if (!pack) ok = (b->decompressor[i] = libdeflate_alloc_decompressor()) != NULL;
    }
    /* writing: libdeflate's bound for its own streams; reading: zlib's compressBound formula,
     * the largest stream zlib (HDF5's deflate filter, h5py) makes of cap_bytes */
    if (ok && !pack)
        b->packed_cap = cap_bytes + (cap_bytes >> 12) + (cap_bytes >> 14) + (cap_bytes >> 25) + 13;
    for (int l = 0; ok && pack && l < CHUNK_LEVELS; l++) {
        size_t bound = libdeflate_zlib_compress_bound(b->compressor[l], cap_bytes);
        if (bound > b->packed_cap) b->packed_cap = bound;
    }
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
        for (int l = 0; b->compressor && l < CHUNK_LEVELS; l++)
            libdeflate_free_compressor(b->compressor[i * CHUNK_LEVELS + l]);
        if (b->decompressor) libdeflate_free_decompressor(b->decompressor[i]);
    }
    free(b->jobs);
    free(b->scratch);
    free(b->compressor);
    free(b->decompressor);
}
