/* Internal to traces/: what the trace writer (trace_write.c) and reader (trace_read.c) share.
 *
 * HDF5 errors: the library's error stack is silenced (h5_quiet) and its innermost description
 * becomes the reason in our one-line messages (h5_reason).
 *
 * The chunk codec: HDF5 runs filters one chunk at a time on the calling thread; deflate then
 * bounds writing at about 70 MB/s. Since our chunks are whole rows along N, each chunk is a
 * contiguous slice of an array: worker threads shuffle and deflate (or inflate and unshuffle)
 * batches of chunks while only the calling thread talks to HDF5 (H5Dwrite_chunk /
 * H5Dread_chunk, in chunk order, so the file bytes do not depend on the thread count). The
 * bytes are exactly what HDF5's own shuffle and deflate filters produce and expect: any HDF5
 * reader (h5py) reads the file, and files from other writers are read through H5Dread when
 * their layout or filters differ from ours. */
#ifndef MOESIM_TRACES_H5_CHUNKS_H
#define MOESIM_TRACES_H5_CHUNKS_H

#include <hdf5.h>
#include <stdbool.h>
#include <stddef.h>

/* deflate itself is libdeflate's (zlib-wrapped streams, as HDF5's deflate filter writes and
 * reads them): 1.8-2.1x faster to compress and 1.7-2.8x faster to decompress than zlib at
 * level 1 on trace data, and slightly smaller. */

/* Chunks hold about this many bytes of uncompressed data (whole tokens along N). Measured with
 * bench/bench_trace_io (48 x 8 routing): 64 KiB to 4 MiB chunks read and write within 10% of
 * each other (deflate dominates); 1 MiB keeps chunk counts low and reads fastest. */
#define TRACE_CHUNK_TARGET_BYTES (1024u * 1024u)
/* Datasets of one value per token (/tokens/...) are chunked smaller: a reader streaming a long
 * trace keeps a chunk of each inflated while it reads the chunk's tokens, and at 1 MiB a chunk
 * of request ids spans 2.6 x 10^5 tokens, so the reader's memory grew with the trace up to that
 * length (3 MB at 10^6 tokens). A 64 KiB chunk costs a few more chunk reads, nothing measurable. */
#define TRACE_TOKEN_CHUNK_TARGET_BYTES (64u * 1024u)
/* deflate cannot expand data by more than this factor when decompressing (its best case is
 * 258 bytes from a 2-bit code, about 1032:1); a dataset claiming more is corrupt. */
#define DEFLATE_MAX_RATIO 1100u
/* The deflate level of a dataset: 1, but 2 for the look-ahead rows, whose chunks hold a part of
 * each row's candidates (traces/FORMAT.md, "Storage"): libdeflate's level 1 finds few of the
 * matches in such a part (on a synthesized Qwen3-30B-A3B trace its scores took 45 % more bytes
 * than in whole-row chunks at level 1; at level 2, 2 % fewer: bench/README.md, "Look-ahead
 * candidates chunked apart"). */
typedef enum chunk_level { CHUNK_LEVEL_ROWS, CHUNK_LEVEL_LOOKAHEAD, CHUNK_LEVELS } chunk_level;
#define DEFLATE_LEVEL           1
#define LOOKAHEAD_DEFLATE_LEVEL 2
/* Longest params_json attribute written and read (bytes, without the terminator). */
#define TRACE_PARAMS_JSON_MAX (1u << 20)
/* Threads that (de)compress chunks, and chunks each handles per batch. */
#define CHUNK_MAX_THREADS     8
#define CHUNK_JOBS_PER_THREAD 2
/* Larger chunks (other writers) are read through H5Dread rather than buffered per thread. */
#define CHUNK_MAX_BYTES (64u * 1024u * 1024u)

/* The innermost HDF5 error description (the most specific one), then clears the stack. */
const char *h5_reason(char buf[160]);
void h5_quiet(void);
/* Closes *id when open and marks it closed. */
void h5_close(hid_t *id, herr_t (*close_fn)(hid_t));

/* HDF5's shuffle filter on n elements of s bytes (dst and src do not overlap): byte j of
 * element i goes to j * n + i. The inverse writes the first n_out <= n elements of the n (the
 * real ones of a short last chunk). Public for the tests; the chunk codec runs them. */
void h5_shuffle_bytes(unsigned char *dst, const unsigned char *src, size_t n, size_t s);
void h5_unshuffle_bytes(unsigned char *dst, const unsigned char *src, size_t n, size_t n_out,
                        size_t s);

typedef struct chunk_job {
    size_t chunk_bytes;       /* full size of this chunk (HDF5 stores edge chunks whole) */
    size_t elem_size;         /* shuffle element size: bytes per value of its dataset */
    const unsigned char *src; /* pack: the chunk's rows in the caller's array */
    unsigned char *dst;       /* unpack: where the chunk's rows go in the caller's array */
    bool keep_shuffled;       /* unpack: dst gets the chunk_bytes inflated, still shuffled (a
                                 cache the reader takes rows from with chunk_take_elems) */
    /* A chunk of a part of look-ahead rows ([rows][L][1][Kc] of a [N][L][D][K'] dataset: one
     * distance, Kc of its candidates) is not a slice of the caller's array: its bytes are runs
     * of run_bytes, one every run_stride bytes there (gathered from src, scattered to dst).
     * 0: one contiguous slice. */
    size_t run_bytes, run_stride;
    chunk_level level;        /* pack: the dataset's deflate level */
    unsigned char *raw;       /* [cap_bytes] a short last chunk, zero-padded to full size */
    size_t raw_bytes;         /* whole elements of real data (the last chunk may be short) */
    unsigned char *packed;    /* [packed_cap] shuffled + deflated bytes */
    size_t packed_bytes;
    bool ok; /* the (de)compression succeeded */
} chunk_job;

typedef struct chunk_batch {
    chunk_job *jobs;
    size_t n_jobs;           /* jobs of the next run, <= jobs_cap */
    size_t jobs_cap;         /* jobs allocated */
    size_t cap_bytes;        /* largest chunk the buffers hold */
    size_t packed_cap;       /* deflate bound of cap_bytes */
    unsigned char **scratch; /* [n_threads][cap_bytes] shuffle buffers */
    bool pack;               /* true: shuffle + deflate; false: inflate + unshuffle */
    unsigned n_threads;
    struct libdeflate_compressor **compressor;     /* [n_threads][CHUNK_LEVELS] when pack */
    struct libdeflate_decompressor **decompressor; /* [n_threads] when !pack */
} chunk_batch;

/* Whether a chunk of chunk_bytes of elem_size-byte values is stored shuffled (as HDF5's shuffle
 * filter leaves single bytes and single elements). */
bool chunk_is_shuffled(size_t chunk_bytes, size_t elem_size);
/* Elements [first, first + count) of a chunk of chunk_bytes inflated with keep_shuffled, into
 * dst as the caller's array holds them: unshuffled on the way, so that taking rows costs one
 * pass over them, not an unshuffle of the whole chunk and a copy. */
void chunk_take_elems(unsigned char *dst, const unsigned char *chunk, size_t chunk_bytes,
                      size_t elem_size, size_t first, size_t count);

/* `bytes` of runs of run_bytes, one every `stride` bytes of src, packed into dst (gather); and
 * packed runs of src put one every `stride` bytes of dst (scatter). */
void chunk_gather_runs(unsigned char *dst, const unsigned char *src, size_t bytes, size_t run_bytes,
                       size_t stride);
void chunk_scatter_runs(unsigned char *dst, const unsigned char *src, size_t bytes,
                        size_t run_bytes, size_t stride);

/* Allocates n_threads * CHUNK_JOBS_PER_THREAD jobs (b->jobs_cap = b->n_jobs) with buffers for
 * chunks of up to `cap_bytes`; false when memory is short (free it anyway with
 * chunk_batch_free). */
bool chunk_batch_init(chunk_batch *b, size_t cap_bytes, bool pack);
/* Runs b->n_jobs jobs (none: nothing to do) (each with its own size and element size, so chunks of
 * several datasets can share a run) on up to n_threads threads (the caller's thread is one of
 * them). */
void chunk_batch_run(chunk_batch *b);
void chunk_batch_free(chunk_batch *b);

#endif
