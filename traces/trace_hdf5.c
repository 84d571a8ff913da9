/* The HDF5 form of a router trace: trace_write and trace_read (traces/FORMAT.md is the
 * reference for every attribute and dataset written here).
 *
 * Writing: the trace is checked first (an invalid trace is never written), then written into a
 * temporary file beside the destination (common/atomic_file.h) and renamed over it once closed
 * and synced; on any failure the temporary is removed. Files are byte-identical for identical
 * traces: object modification times are off on every group and dataset, the library's format
 * version bounds are fixed (v1.8 objects), and the chunk size depends only on the shape.
 *
 * Reading: the HDF5 error stack is silenced and every failure becomes one line naming the file
 * and the attribute or dataset. Order of checks: plain file (exists, not empty, HDF5 signature),
 * format name and version, geometry attributes (trace_meta_check), every dataset's presence,
 * type and shape, then storage sizes against the shape and the file size (so a corrupt header
 * cannot ask for a giant allocation), then the data, then every value (trace_finish ->
 * trace_check). */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/atomic_file.h"
#include "common/check.h"
#include "traces/trace.h"

/* Chunks hold about this many bytes of uncompressed data (whole tokens along N). Measured with
 * bench/bench_trace_io (48 x 8 routing): 64 KiB to 4 MiB chunks read and write within 10% of
 * each other (deflate dominates); 1 MiB keeps chunk counts low and reads fastest. */
#define TRACE_CHUNK_TARGET_BYTES (1024u * 1024u)
/* deflate cannot expand data by more than this factor when decompressing (its best case is
 * 258 bytes from a 2-bit code, about 1032:1); a dataset claiming more is corrupt. */
#define DEFLATE_MAX_RATIO 1100u
#define DEFLATE_LEVEL     1
/* Longest params_json attribute written and read (bytes, without the terminator). */
#define TRACE_PARAMS_JSON_MAX (1u << 20)
/* Threads that (de)compress chunks, and chunks each handles per batch. */
#define CHUNK_MAX_THREADS     8
#define CHUNK_JOBS_PER_THREAD 2
/* Larger chunks (other writers) are read through H5Dread rather than buffered per thread. */
#define CHUNK_MAX_BYTES (64u * 1024u * 1024u)

/* ---- HDF5 error capture ------------------------------------------------------------------ */

static herr_t first_error_cb(unsigned n, const H5E_error2_t *e, void *data) {
    char *buf = data;
    if (n == 0 && e->desc) snprintf(buf, 160, "%s", e->desc);
    return 0;
}

/* The innermost HDF5 error description (the most specific one), then clears the stack. */
static const char *h5_reason(char buf[160]) {
    buf[0] = '\0';
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, first_error_cb, buf);
    H5Eclear2(H5E_DEFAULT);
    if (!buf[0]) snprintf(buf, 160, "HDF5 library error");
    return buf;
}

static void h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

static void h5_close(hid_t *id, herr_t (*close_fn)(hid_t)) {
    if (*id >= 0) close_fn(*id);
    *id = H5I_INVALID_HID;
}

/* ---- chunk codec: shuffle + deflate of whole chunks, in parallel --------------------------
 *
 * HDF5 runs filters one chunk at a time on the calling thread; deflate then bounds writing at
 * about 70 MB/s. Since our chunks are whole rows along N, each chunk is a contiguous slice of
 * the in-memory array: worker threads shuffle and deflate (or inflate and unshuffle) batches
 * of chunks while only the calling thread talks to HDF5 (H5Dwrite_chunk / H5Dread_chunk, in
 * chunk order, so the file bytes do not depend on the thread count). The bytes are exactly
 * what HDF5's own shuffle and deflate filters produce and expect: any HDF5 reader (h5py)
 * reads the file, and files from other writers are read through H5Dread when their layout or
 * filters differ from ours. */

typedef struct chunk_job {
    const unsigned char *src; /* pack: the chunk's rows in the caller's array */
    unsigned char *dst;       /* unpack: where the chunk's rows go in the caller's array */
    unsigned char *raw;       /* [chunk_bytes] a short last chunk, zero-padded to full size */
    size_t raw_bytes;         /* bytes of real data in this chunk (the last one may be short) */
    unsigned char *packed;    /* [packed_cap] shuffled + deflated bytes */
    size_t packed_bytes;
    int zrc; /* zlib status of this job */
} chunk_job;

typedef struct chunk_batch {
    chunk_job *jobs;
    size_t n_jobs;
    size_t chunk_bytes, elem_size, packed_cap;
    unsigned char **scratch; /* [n_threads][chunk_bytes] shuffle buffers */
    bool pack;               /* true: shuffle + deflate; false: inflate + unshuffle */
    unsigned n_threads;
} chunk_batch;

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
    const size_t n_elems = b->chunk_bytes / b->elem_size;
    for (size_t j = w->index; j < b->n_jobs; j += b->n_threads) {
        chunk_job *job = &b->jobs[j];
        const bool full = job->raw_bytes == b->chunk_bytes;
        if (b->pack) {
            const unsigned char *src = job->src;
            if (!full) { /* HDF5 stores edge chunks whole: pad with zeros */
                memcpy(job->raw, job->src, job->raw_bytes);
                memset(job->raw + job->raw_bytes, 0, b->chunk_bytes - job->raw_bytes);
                src = job->raw;
            }
            if (b->elem_size > 1 && n_elems > 1) {
                shuffle_bytes(tmp, src, n_elems, b->elem_size);
                src = tmp;
            }
            uLongf out = (uLongf)b->packed_cap;
            job->zrc = compress2(job->packed, &out, src, (uLong)b->chunk_bytes, DEFLATE_LEVEL);
            job->packed_bytes = out;
        } else {
            bool shuffled = b->elem_size > 1 && n_elems > 1;
            unsigned char *target = full ? job->dst : job->raw;
            uLongf out = (uLongf)b->chunk_bytes;
            job->zrc =
                uncompress(shuffled ? tmp : target, &out, job->packed, (uLong)job->packed_bytes);
            if (job->zrc == Z_OK && out != b->chunk_bytes) job->zrc = Z_DATA_ERROR;
            if (job->zrc == Z_OK && shuffled) unshuffle_bytes(target, tmp, n_elems, b->elem_size);
            if (job->zrc == Z_OK && !full) memcpy(job->dst, job->raw, job->raw_bytes);
        }
    }
    return NULL;
}

/* Runs the batch on up to n_threads threads (the caller's thread is one of them). */
static void chunk_batch_run(chunk_batch *b) {
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

/* Allocates a batch of `n_jobs` job buffers; false when memory is short. */
static bool chunk_batch_init(chunk_batch *b, size_t chunk_bytes, size_t elem_size, bool pack) {
    memset(b, 0, sizeof *b);
    b->n_threads = chunk_threads();
    b->n_jobs = (size_t)b->n_threads * CHUNK_JOBS_PER_THREAD;
    b->chunk_bytes = chunk_bytes;
    b->elem_size = elem_size;
    b->packed_cap = compressBound((uLong)chunk_bytes);
    b->pack = pack;
    b->jobs = calloc(b->n_jobs, sizeof *b->jobs);
    b->scratch = calloc(b->n_threads, sizeof *b->scratch);
    bool ok = b->jobs && b->scratch;
    for (size_t j = 0; ok && j < b->n_jobs; j++) {
        b->jobs[j].raw = malloc(chunk_bytes);
        b->jobs[j].packed = malloc(b->packed_cap);
        ok = b->jobs[j].raw && b->jobs[j].packed;
    }
    for (unsigned i = 0; ok && i < b->n_threads; i++) ok = (b->scratch[i] = malloc(chunk_bytes));
    return ok;
}

static void chunk_batch_free(chunk_batch *b) {
    for (size_t j = 0; b->jobs && j < b->n_jobs; j++) {
        free(b->jobs[j].raw);
        free(b->jobs[j].packed);
    }
    for (unsigned i = 0; b->scratch && i < b->n_threads; i++) free(b->scratch[i]);
    free(b->jobs);
    free(b->scratch);
}

/* ---- writing ----------------------------------------------------------------------------- */

typedef struct writer {
    const char *path; /* destination, for messages */
    hid_t file;
    char why[160];
    moesim_error *err;
} writer;

static moesim_status write_fail(writer *w, const char *object) {
    return moesim_fail(w->err, MOESIM_EIO, "%s: %s: cannot write (%s)", w->path, object,
                       h5_reason(w->why));
}

static moesim_status write_attr(writer *w, const char *name, hid_t ftype, hid_t mtype,
                                const void *value) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = space < 0 ? H5I_INVALID_HID
                        : H5Acreate2(w->file, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = a < 0 ? -1 : H5Awrite(a, mtype, value);
    h5_close(&a, H5Aclose);
    h5_close(&space, H5Sclose);
    return rc < 0 ? write_fail(w, name) : MOESIM_OK;
}

static moesim_status write_attr_u32(writer *w, const char *name, uint32_t v) {
    return write_attr(w, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &v);
}

static moesim_status write_attr_str(writer *w, const char *name, const char *s) {
    hid_t type = H5Tcopy(H5T_C_S1);
    if (type < 0 || H5Tset_size(type, H5T_VARIABLE) < 0 || H5Tset_cset(type, H5T_CSET_UTF8) < 0) {
        h5_close(&type, H5Tclose);
        return write_fail(w, name);
    }
    moesim_status st = write_attr(w, name, type, type, &s);
    h5_close(&type, H5Tclose);
    return st;
}

static moesim_status write_group(writer *w, const char *name) {
    hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
    herr_t rc = gcpl < 0 ? -1 : H5Pset_obj_track_times(gcpl, 0);
    hid_t g = rc < 0 ? H5I_INVALID_HID : H5Gcreate2(w->file, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
    moesim_status st = g < 0 ? write_fail(w, name) : MOESIM_OK;
    h5_close(&g, H5Gclose);
    h5_close(&gcpl, H5Pclose);
    return st;
}

/* Tokens per chunk for a dataset whose one token holds `row_bytes`. */
static hsize_t chunk_tokens(uint64_t n_tokens, size_t row_bytes) {
    uint64_t c = TRACE_CHUNK_TARGET_BYTES / row_bytes;
    if (c < 1) c = 1;
    return c < n_tokens ? c : n_tokens;
}

/* Writes `data` ([n_rows] rows of row_bytes) as chunks of chunk_rows rows through the codec. */
static moesim_status write_chunks(writer *w, const char *name, hid_t d, const void *data,
                                  uint64_t n_rows, size_t row_bytes, hsize_t chunk_rows,
                                  size_t elem_size) {
    const size_t chunk_bytes = (size_t)chunk_rows * row_bytes;
    const uint64_t total = n_rows * row_bytes, n_chunks = (n_rows + chunk_rows - 1) / chunk_rows;
    chunk_batch b;
    if (!chunk_batch_init(&b, chunk_bytes, elem_size, true)) {
        chunk_batch_free(&b);
        return moesim_fail(w->err, MOESIM_ENOMEM, "%s: %s: out of memory for chunk buffers",
                           w->path, name);
    }
    const size_t per_batch = b.n_jobs;
    moesim_status st = MOESIM_OK;
    for (uint64_t first = 0; first < n_chunks && !st; first += per_batch) {
        b.n_jobs = n_chunks - first < per_batch ? (size_t)(n_chunks - first) : per_batch;
        for (size_t j = 0; j < b.n_jobs; j++) {
            uint64_t at = (first + j) * chunk_bytes;
            b.jobs[j].raw_bytes = total - at < chunk_bytes ? (size_t)(total - at) : chunk_bytes;
            b.jobs[j].src = (const unsigned char *)data + at;
        }
        chunk_batch_run(&b);
        for (size_t j = 0; j < b.n_jobs && !st; j++) {
            hsize_t offset[4] = {(first + j) * chunk_rows, 0, 0, 0};
            if (b.jobs[j].zrc != Z_OK)
                st = moesim_fail(w->err, MOESIM_EIO, "%s: %s: deflate failed (zlib error %d)",
                                 w->path, name, b.jobs[j].zrc);
            else if (H5Dwrite_chunk(d, H5P_DEFAULT, 0, offset, b.jobs[j].packed_bytes,
                                    b.jobs[j].packed) < 0)
                st = write_fail(w, name);
        }
    }
    b.n_jobs = per_batch;
    chunk_batch_free(&b);
    return st;
}

/* One dataset of shape dims[0..rank) (dims[0] = tokens or layers), chunked along dims[0],
 * shuffled and deflated, written whole from `data`. */
static moesim_status write_dataset(writer *w, const char *name, hid_t ftype, hid_t mtype, int rank,
                                   const hsize_t *dims, const void *data) {
    hsize_t chunk[4];
    size_t row_bytes = H5Tget_size(mtype);
    for (int i = 1; i < rank; i++) row_bytes *= dims[i];
    chunk[0] = chunk_tokens(dims[0], row_bytes);
    for (int i = 1; i < rank; i++) chunk[i] = dims[i];
    hid_t space = H5I_INVALID_HID, d = H5I_INVALID_HID;
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    herr_t rc = dcpl < 0 ? -1 : H5Pset_obj_track_times(dcpl, 0);
    if (rc >= 0) rc = H5Pset_chunk(dcpl, rank, chunk);
    if (rc >= 0) rc = H5Pset_shuffle(dcpl);
    if (rc >= 0) rc = H5Pset_deflate(dcpl, DEFLATE_LEVEL);
    if (rc >= 0) rc = (space = H5Screate_simple(rank, dims, NULL)) < 0 ? -1 : 0;
    if (rc >= 0)
        rc = (d = H5Dcreate2(w->file, name, ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)) < 0 ? -1
                                                                                               : 0;
    moesim_status st = MOESIM_OK;
    if (rc >= 0 && H5Tequal(ftype, mtype) > 0)
        st = write_chunks(w, name, d, data, dims[0], row_bytes, chunk[0], H5Tget_size(mtype));
    else if (rc >= 0) /* a host whose byte order differs from the file's: let HDF5 convert */
        rc = H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    if (rc < 0) st = write_fail(w, name);
    h5_close(&d, H5Dclose);
    h5_close(&space, H5Sclose);
    h5_close(&dcpl, H5Pclose);
    return st;
}

static moesim_status write_contents(writer *w, const trace *t) {
    const trace_meta *m = &t->meta;
    moesim_status st = MOESIM_OK;
    uint32_t version = TRACE_FORMAT_VERSION;
    if (!st) st = write_attr_str(w, "format", TRACE_FORMAT_NAME);
    if (!st) st = write_attr_u32(w, "format_version", version);
    if (!st) st = write_attr_str(w, "model", m->model);
    if (!st) st = write_attr_u32(w, "n_layers", m->n_layers);
    if (!st) st = write_attr_u32(w, "n_experts", m->n_experts);
    if (!st) st = write_attr_u32(w, "top_k", m->top_k);
    if (!st) st = write_attr_u32(w, "n_shared_experts", m->n_shared_experts);
    if (!st) st = write_attr_str(w, "gate_normalization", trace_gate_norm_name(m->gate_norm));
    if (!st) st = write_attr_str(w, "source", m->source);
    if (!st) st = write_attr_str(w, "tool_version", m->tool_version);
    if (!st) st = write_attr_u32(w, "lookahead_depth", m->lookahead_depth);
    if (!st) st = write_attr_u32(w, "lookahead_k", m->lookahead_k);
    if (!st)
        st = write_attr(w, "model_config_hash", H5T_STD_U64LE, H5T_NATIVE_UINT64,
                        &m->model_config_hash);
    if (!st && t->params_json) st = write_attr_str(w, "params_json", t->params_json);

    const hsize_t N = t->n_tokens, L = m->n_layers, k = m->top_k, D = m->lookahead_depth,
                  Kp = m->lookahead_k;
    const hsize_t tok[1] = {N}, route[3] = {N, L, k}, per_layer[2] = {N, L},
                  look[4] = {N, L, D, Kp}, layers[1] = {L};
    if (!st) st = write_group(w, "/tokens");
    if (!st)
        st = write_dataset(w, "/tokens/request_id", H5T_STD_U32LE, H5T_NATIVE_UINT32, 1, tok,
                           t->request_id);
    if (!st)
        st = write_dataset(w, "/tokens/position", H5T_STD_U32LE, H5T_NATIVE_UINT32, 1, tok,
                           t->position);
    if (!st)
        st = write_dataset(w, "/tokens/phase", H5T_STD_U8LE, H5T_NATIVE_UINT8, 1, tok, t->phase);
    if (!st && t->token_id)
        st = write_dataset(w, "/tokens/token_id", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, tok,
                           t->token_id);
    if (!st) st = write_group(w, "/routing");
    if (!st)
        st = write_dataset(w, "/routing/expert_ids", H5T_STD_U16LE, H5T_NATIVE_UINT16, 3, route,
                           t->expert_ids);
    if (!st)
        st = write_dataset(w, "/routing/gate_weights", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 3, route,
                           t->gate_weights);
    if (!st && t->importance)
        st = write_dataset(w, "/routing/importance", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, per_layer,
                           t->importance);
    if (!st && D) {
        st = write_group(w, "/lookahead");
        if (!st)
            st = write_dataset(w, "/lookahead/expert_ids", H5T_STD_U16LE, H5T_NATIVE_UINT16, 4,
                               look, t->lookahead_ids);
        if (!st)
            st = write_dataset(w, "/lookahead/scores", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, look,
                               t->lookahead_scores);
    }
    if (!st) st = write_group(w, "/layers");
    if (!st)
        st = write_dataset(w, "/layers/model_layer", H5T_STD_U32LE, H5T_NATIVE_UINT32, 1, layers,
                           m->model_layer);
    return st;
}

static moesim_status sync_path(const char *tmp, const char *path, moesim_error *err) {
    int fd = open(tmp, O_RDONLY);
    int bad = fd < 0 || fsync(fd) != 0;
    int e = errno;
    if (fd >= 0) close(fd);
    return bad ? moesim_fail(err, MOESIM_EIO, "%s: cannot sync the written trace: %s", path,
                             strerror(e))
               : MOESIM_OK;
}

moesim_status trace_write(const trace *t, const char *path, moesim_error *err) {
    moesim_status st = trace_check(t, path, err);
    if (st) return st;
    if (t->params_json && strlen(t->params_json) > TRACE_PARAMS_JSON_MAX)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: params_json: %zu characters, at most %u can be stored", path,
                           strlen(t->params_json), TRACE_PARAMS_JSON_MAX);
    h5_quiet();
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0 || H5Zfilter_avail(H5Z_FILTER_SHUFFLE) <= 0)
        return moesim_fail(err, MOESIM_EIO, "%s: this HDF5 library lacks deflate or shuffle", path);
    atomic_file af;
    if ((st = atomic_file_begin_path(&af, path, err))) return st;
    writer w = {.path = path, .file = H5I_INVALID_HID, .err = err};
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS);
    herr_t rc = fcpl < 0 || fapl < 0 ? -1 : H5Pset_obj_track_times(fcpl, 0);
    if (rc >= 0) rc = H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18);
    if (rc >= 0) w.file = H5Fcreate(af.tmp_path, H5F_ACC_TRUNC, fcpl, fapl);
    h5_close(&fcpl, H5Pclose);
    h5_close(&fapl, H5Pclose);
    if (w.file < 0) {
        st = moesim_fail(err, MOESIM_EIO, "%s: cannot create the HDF5 file (%s)", path,
                         h5_reason(w.why));
    } else {
        st = write_contents(&w, t);
        if (H5Fclose(w.file) < 0 && !st) st = write_fail(&w, "file close");
    }
    if (!st) st = sync_path(af.tmp_path, path, err);
    if (st) {
        atomic_file_abort(&af);
        return st;
    }
    return atomic_file_commit(&af, err);
}

/* ---- reading ----------------------------------------------------------------------------- */

typedef struct reader {
    const char *path;
    hid_t file;
    uint64_t file_bytes;
    char why[160];
    moesim_error *err;
} reader;

static moesim_status read_fail(reader *r, const char *object, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static moesim_status read_fail(reader *r, const char *object, const char *fmt, ...) {
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return moesim_fail(r->err, MOESIM_EINPUT, "%s: %s: %s", r->path, object, what);
}

/* "uint16", "float32", "string", ... for messages. */
static void describe_type(hid_t type, char *buf, size_t cap) {
    H5T_class_t c = H5Tget_class(type);
    size_t bits = H5Tget_size(type) * 8;
    if (c == H5T_INTEGER)
        snprintf(buf, cap, "%s%zu", H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int", bits);
    else if (c == H5T_FLOAT)
        snprintf(buf, cap, "float%zu", bits);
    else if (c == H5T_STRING)
        snprintf(buf, cap, "string");
    else if (c == H5T_COMPOUND)
        snprintf(buf, cap, "compound");
    else if (c == H5T_ARRAY)
        snprintf(buf, cap, "array");
    else
        snprintf(buf, cap, "HDF5 type class %d", (int)c);
}

/* Opens root attribute `name`: < 0 with *present false when absent; < 0 with *present true
 * when the root's attribute storage is unreadable (the error stack holds the reason). */
static hid_t open_attr(reader *r, const char *name, bool *present) {
    htri_t ex = H5Aexists(r->file, name);
    *present = ex != 0;
    if (ex == 0) H5Eclear2(H5E_DEFAULT);
    return ex > 0 ? H5Aopen(r->file, name, H5P_DEFAULT) : H5I_INVALID_HID;
}

/* True when an attribute holds exactly one value (scalar, or a 1-element array). */
static bool attr_is_single(hid_t a) {
    hid_t s = H5Aget_space(a);
    hssize_t n = s < 0 ? -1 : H5Sget_simple_extent_npoints(s);
    h5_close(&s, H5Sclose);
    return n == 1;
}

/* Reads a string attribute (variable- or fixed-length) into buf[cap]. A missing optional
 * attribute leaves buf empty and sets *present false. */
static moesim_status read_attr_str(reader *r, const char *name, char *buf, size_t cap,
                                   bool required, bool *present_out) {
    bool present;
    buf[0] = '\0';
    hid_t a = open_attr(r, name, &present);
    if (present_out) *present_out = present;
    if (!present) return required ? read_fail(r, name, "required attribute missing") : MOESIM_OK;
    if (a < 0) return read_fail(r, name, "cannot read (corrupt: %s)", h5_reason(r->why));
    hid_t ftype = H5Aget_type(a);
    moesim_status st = MOESIM_OK;
    if (ftype < 0 || H5Tget_class(ftype) != H5T_STRING || !attr_is_single(a)) {
        char desc[48] = "unreadable";
        if (ftype >= 0) describe_type(ftype, desc, sizeof desc);
        st = read_fail(r, name, "expected a string attribute, got %s%s", desc,
                       !attr_is_single(a) ? " array" : "");
    } else if (H5Tis_variable_str(ftype) > 0) {
        hid_t mtype = H5Tcopy(H5T_C_S1);
        H5Tset_size(mtype, H5T_VARIABLE);
        H5Tset_cset(mtype, H5Tget_cset(ftype));
        char *s = NULL;
        if (H5Aread(a, mtype, &s) < 0 || !s) {
            st = read_fail(r, name, "cannot read (%s)", h5_reason(r->why));
        } else if (strlen(s) >= cap) {
            st = read_fail(r, name, "expected at most %zu characters, got %zu", cap - 1, strlen(s));
        } else {
            memcpy(buf, s, strlen(s) + 1);
        }
        if (s) H5free_memory(s);
        h5_close(&mtype, H5Tclose);
    } else {
        size_t n = H5Tget_size(ftype);
        if (n >= cap) {
            st = read_fail(r, name, "expected at most %zu characters, got a %zu-byte string",
                           cap - 1, n);
        } else {
            hid_t mtype = H5Tcopy(ftype);
            H5Tset_strpad(mtype, H5T_STR_NULLTERM);
            H5Tset_size(mtype, n + 1);
            if (H5Aread(a, mtype, buf) < 0)
                st = read_fail(r, name, "cannot read (%s)", h5_reason(r->why));
            buf[n] = '\0';
            h5_close(&mtype, H5Tclose);
        }
    }
    h5_close(&ftype, H5Tclose);
    h5_close(&a, H5Aclose);
    return st;
}

/* Reads an integer attribute in 0..max. */
static moesim_status read_attr_uint(reader *r, const char *name, uint64_t max, bool required,
                                    uint64_t *out) {
    bool present;
    *out = 0;
    hid_t a = open_attr(r, name, &present);
    if (!present) return required ? read_fail(r, name, "required attribute missing") : MOESIM_OK;
    if (a < 0) return read_fail(r, name, "cannot read (corrupt: %s)", h5_reason(r->why));
    hid_t ftype = H5Aget_type(a);
    moesim_status st = MOESIM_OK;
    if (ftype < 0 || H5Tget_class(ftype) != H5T_INTEGER || !attr_is_single(a)) {
        char desc[48] = "unreadable";
        if (ftype >= 0) describe_type(ftype, desc, sizeof desc);
        st = read_fail(r, name, "expected one unsigned integer, got %s%s", desc,
                       !attr_is_single(a) ? " array" : "");
    } else if (H5Tget_sign(ftype) == H5T_SGN_NONE) {
        uint64_t v;
        if (H5Aread(a, H5T_NATIVE_UINT64, &v) < 0)
            st = read_fail(r, name, "cannot read (%s)", h5_reason(r->why));
        else if (v > max)
            st = read_fail(r, name, "expected 0..%" PRIu64 ", got %" PRIu64, max, v);
        else
            *out = v;
    } else {
        int64_t v;
        if (H5Aread(a, H5T_NATIVE_INT64, &v) < 0)
            st = read_fail(r, name, "cannot read (%s)", h5_reason(r->why));
        else if (v < 0 || (uint64_t)v > max)
            st = read_fail(r, name, "expected 0..%" PRIu64 ", got %" PRId64, max, v);
        else
            *out = (uint64_t)v;
    }
    h5_close(&ftype, H5Tclose);
    h5_close(&a, H5Aclose);
    return st;
}

static moesim_status read_attr_u32(reader *r, const char *name, uint32_t *out) {
    uint64_t v;
    moesim_status st = read_attr_uint(r, name, UINT32_MAX, true, &v);
    *out = (uint32_t)v;
    return st;
}

/* What a dataset must be: HDF5 type class, size and signedness, and shape. */
typedef struct dataset_spec {
    const char *name;
    H5T_class_t cls;
    size_t size;
    bool is_signed;
    const char *type_name; /* "uint16" */
    hid_t mtype;           /* native memory type */
    int rank;
    const char *shape_name; /* "[N][L][k]" */
    hsize_t dims[4];        /* dims[0] == 0: N is taken from this dataset (the first one) */
} dataset_spec;

static void format_dims(char *buf, size_t cap, int rank, const hsize_t *dims) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < rank && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "[%llu]", (unsigned long long)dims[i]);
}

/* 1 when every component of absolute path `name` exists, 0 when one is absent, -1 when the
 * file cannot answer (corrupt metadata; the error stack holds the reason). */
static int link_state(hid_t file, const char *name) {
    char part[256];
    for (const char *slash = strchr(name + 1, '/');; slash = strchr(slash + 1, '/')) {
        size_t n = slash ? (size_t)(slash - name) : strlen(name);
        if (n >= sizeof part) return -1;
        memcpy(part, name, n);
        part[n] = '\0';
        htri_t ex = H5Lexists(file, part, H5P_DEFAULT);
        if (ex <= 0) return ex < 0 ? -1 : 0;
        if (!slash) return 1;
    }
}

/* Opens a dataset and checks its type and shape against `spec`. A missing dataset returns
 * H5I_INVALID_HID with *present false (the caller decides whether it was required). With
 * `n_out`, dims[0] may be anything and is stored there (the dataset that defines N). */
static moesim_status open_dataset(reader *r, const dataset_spec *spec, bool *present, hid_t *out,
                                  uint64_t *n_out) {
    *out = H5I_INVALID_HID;
    *present = false;
    int ex = link_state(r->file, spec->name);
    if (ex < 0) return read_fail(r, spec->name, "cannot open (corrupt: %s)", h5_reason(r->why));
    if (ex == 0) return MOESIM_OK;
    H5O_info_t info;
    if (H5Oget_info_by_name(r->file, spec->name, &info, H5P_DEFAULT) < 0)
        return read_fail(r, spec->name, "cannot open (%s)", h5_reason(r->why));
    if (info.type != H5O_TYPE_DATASET)
        return read_fail(r, spec->name, "expected a dataset, got a %s",
                         info.type == H5O_TYPE_GROUP ? "group" : "named type");
    *present = true;
    hid_t d = H5Dopen2(r->file, spec->name, H5P_DEFAULT);
    if (d < 0) return read_fail(r, spec->name, "cannot open (%s)", h5_reason(r->why));
    hid_t type = H5Dget_type(d), space = H5Dget_space(d);
    moesim_status st = MOESIM_OK;
    if (type < 0 || space < 0) {
        st = read_fail(r, spec->name, "cannot read its type or shape (%s)", h5_reason(r->why));
    } else if (H5Tget_class(type) != spec->cls || H5Tget_size(type) != spec->size ||
               (spec->cls == H5T_INTEGER &&
                (H5Tget_sign(type) != H5T_SGN_NONE) != spec->is_signed)) {
        char got[48];
        describe_type(type, got, sizeof got);
        st = read_fail(r, spec->name, "expected dtype %s, got %s", spec->type_name, got);
    } else {
        hsize_t dims[H5S_MAX_RANK];
        int rank = H5Sget_simple_extent_ndims(space);
        if (rank >= 0 && rank <= H5S_MAX_RANK) H5Sget_simple_extent_dims(space, dims, NULL);
        bool ok = rank == spec->rank;
        for (int i = n_out ? 1 : 0; ok && i < rank; i++) ok = dims[i] == spec->dims[i];
        if (ok && n_out) *n_out = dims[0];
        if (!ok) {
            char want[96] = "", got[96] = "(not a simple array)";
            if (!n_out) format_dims(want, sizeof want, spec->rank, spec->dims);
            if (rank >= 0 && rank <= H5S_MAX_RANK) format_dims(got, sizeof got, rank, dims);
            if (rank == 0) snprintf(got, sizeof got, "a scalar");
            st = read_fail(r, spec->name, "expected shape %s%s%s, got %s", spec->shape_name,
                           want[0] ? " = " : "", want, got);
        }
    }
    h5_close(&type, H5Tclose);
    h5_close(&space, H5Sclose);
    if (st) {
        h5_close(&d, H5Dclose);
        return st;
    }
    *out = d;
    return MOESIM_OK;
}

/* The bytes a dataset occupies in the file must be able to hold its shape: no more than the
 * file, and (deflate's limit) no less than its raw size / DEFLATE_MAX_RATIO. */
static moesim_status check_storage(reader *r, const dataset_spec *spec, hid_t d) {
    uint64_t raw = spec->size;
    for (int i = 0; i < spec->rank; i++) raw *= spec->dims[i];
    hsize_t stored = H5Dget_storage_size(d);
    H5Eclear2(H5E_DEFAULT);
    if (stored > r->file_bytes)
        return read_fail(r, spec->name,
                         "claims %llu bytes of storage in a %" PRIu64 "-byte file (corrupt)",
                         (unsigned long long)stored, r->file_bytes);
    if ((uint64_t)stored * DEFLATE_MAX_RATIO < raw)
        return read_fail(r, spec->name,
                         "%llu bytes stored cannot hold its %" PRIu64
                         " bytes of data (truncated or not written)",
                         (unsigned long long)stored, raw);
    return MOESIM_OK;
}

/* Rows per chunk when `d` is laid out as this writer lays datasets out (chunks of whole rows
 * along dimension 0, filters exactly shuffle then deflate, file type = memory type), else 0. */
static hsize_t own_chunk_rows(const dataset_spec *spec, hid_t d) {
    hsize_t rows = 0, chunk[H5S_MAX_RANK];
    hid_t dcpl = H5Dget_create_plist(d), type = H5Dget_type(d);
    bool ok = dcpl >= 0 && type >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED &&
              H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk) == spec->rank && H5Pget_nfilters(dcpl) == 2 &&
              H5Tequal(type, spec->mtype) > 0;
    for (int i = 1; ok && i < spec->rank; i++) ok = chunk[i] == spec->dims[i];
    for (unsigned f = 0; ok && f < 2; f++) {
        unsigned flags, cd[8];
        size_t n_cd = 8;
        H5Z_filter_t id = H5Pget_filter2(dcpl, f, &flags, &n_cd, cd, 0, NULL, NULL);
        ok = id == (f == 0 ? H5Z_FILTER_SHUFFLE : H5Z_FILTER_DEFLATE);
    }
    if (ok && chunk[0] > 0) rows = chunk[0];
    h5_close(&type, H5Tclose);
    h5_close(&dcpl, H5Pclose);
    H5Eclear2(H5E_DEFAULT);
    return rows;
}

static moesim_status chunk_read_fail(reader *r, const dataset_spec *spec, uint64_t row,
                                     const char *what) {
    return read_fail(r, spec->name,
                     "cannot read its data (truncated or corrupt: chunk at [%" PRIu64 "]: %s)", row,
                     what);
}

/* Reads a dataset written by write_chunks: raw chunks on this thread, inflate in parallel.
 * *fallback is set when a chunk was stored some other way (then nothing was read). */
static moesim_status read_chunks(reader *r, const dataset_spec *spec, hid_t d, void *buf,
                                 hsize_t chunk_rows, bool *fallback) {
    size_t row_bytes = spec->size;
    for (int i = 1; i < spec->rank; i++) row_bytes *= spec->dims[i];
    const uint64_t n_rows = spec->dims[0], total = n_rows * row_bytes;
    const uint64_t n_chunks = (n_rows + chunk_rows - 1) / chunk_rows;
    const size_t chunk_bytes = (size_t)chunk_rows * row_bytes;
    *fallback = false;
    /* our writer never makes chunks longer than N or much above TRACE_CHUNK_TARGET_BYTES */
    if ((chunk_rows > n_rows && n_rows > 0) || chunk_bytes > CHUNK_MAX_BYTES) {
        *fallback = true;
        return MOESIM_OK;
    }
    chunk_batch b;
    if (!chunk_batch_init(&b, chunk_bytes, spec->size, false)) {
        chunk_batch_free(&b);
        return moesim_fail(r->err, MOESIM_ENOMEM, "%s: %s: out of memory for chunk buffers",
                           r->path, spec->name);
    }
    const size_t per_batch = b.n_jobs;
    moesim_status st = MOESIM_OK;
    for (uint64_t first = 0; first < n_chunks && !st && !*fallback; first += per_batch) {
        b.n_jobs = n_chunks - first < per_batch ? (size_t)(n_chunks - first) : per_batch;
        for (size_t j = 0; j < b.n_jobs && !st && !*fallback; j++) {
            hsize_t offset[4] = {(first + j) * chunk_rows, 0, 0, 0}, stored = 0;
            uint32_t mask = 0;
            if (H5Dget_chunk_storage_size(d, offset, &stored) < 0 || stored == 0 ||
                stored > b.packed_cap) {
                /* unallocated chunks read as fill values: leave them to H5Dread */
                *fallback = stored == 0;
                if (!*fallback) st = chunk_read_fail(r, spec, offset[0], "bad chunk size");
                break;
            }
            if (H5Dread_chunk(d, H5P_DEFAULT, offset, &mask, b.jobs[j].packed) < 0) {
                st = chunk_read_fail(r, spec, offset[0], h5_reason(r->why));
                break;
            }
            if (mask != 0) *fallback = true; /* a filter was skipped for this chunk */
            uint64_t at = offset[0] * row_bytes;
            b.jobs[j].packed_bytes = stored;
            b.jobs[j].dst = (unsigned char *)buf + at;
            b.jobs[j].raw_bytes = total - at < chunk_bytes ? (size_t)(total - at) : chunk_bytes;
        }
        if (st || *fallback) break;
        chunk_batch_run(&b);
        for (size_t j = 0; j < b.n_jobs && !st; j++)
            if (b.jobs[j].zrc != Z_OK)
                st = chunk_read_fail(r, spec, (first + j) * chunk_rows,
                                     b.jobs[j].zrc == Z_MEM_ERROR ? "out of memory"
                                                                  : "deflate data do not inflate");
    }
    H5Eclear2(H5E_DEFAULT);
    b.n_jobs = per_batch;
    chunk_batch_free(&b);
    return st;
}

static moesim_status read_dataset(reader *r, const dataset_spec *spec, hid_t d, void *buf) {
    hsize_t rows = own_chunk_rows(spec, d);
    if (rows) {
        bool fallback;
        moesim_status st = read_chunks(r, spec, d, buf, rows, &fallback);
        if (st || !fallback) return st;
    }
    if (H5Dread(d, spec->mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
        return read_fail(r, spec->name, "cannot read its data (truncated or corrupt: %s)",
                         h5_reason(r->why));
    return MOESIM_OK;
}

enum {
    DS_REQUEST_ID,
    DS_POSITION,
    DS_PHASE,
    DS_TOKEN_ID,
    DS_EXPERT_IDS,
    DS_GATE_WEIGHTS,
    DS_IMPORTANCE,
    DS_LOOK_IDS,
    DS_LOOK_SCORES,
    DS_COUNT
};

#define U32_SPEC H5T_INTEGER, 4, false, "uint32", H5T_NATIVE_UINT32
static moesim_status read_meta(reader *r, trace_meta *m, char **params_json) {
    moesim_status st;
    char format[64], norm[16];
    if ((st = read_attr_str(r, "format", format, sizeof format, true, NULL))) return st;
    if (strcmp(format, TRACE_FORMAT_NAME) != 0)
        return read_fail(r, "format", "expected \"%s\", got \"%s\" (not a moesim trace)",
                         TRACE_FORMAT_NAME, format);
    uint64_t version;
    if ((st = read_attr_uint(r, "format_version", UINT32_MAX, true, &version))) return st;
    if (version > TRACE_FORMAT_VERSION)
        return read_fail(r, "format_version",
                         "version %" PRIu64 " is newer than this moesim reads (%u): upgrade moesim",
                         version, TRACE_FORMAT_VERSION);
    if (version < 1)
        return read_fail(r, "format_version", "expected 1..%u, got 0", TRACE_FORMAT_VERSION);
    if ((st = read_attr_str(r, "model", m->model, sizeof m->model, true, NULL))) return st;
    if ((st = read_attr_str(r, "source", m->source, sizeof m->source, true, NULL))) return st;
    if ((st =
             read_attr_str(r, "tool_version", m->tool_version, sizeof m->tool_version, true, NULL)))
        return st;
    if ((st = read_attr_u32(r, "n_layers", &m->n_layers))) return st;
    if ((st = read_attr_u32(r, "n_experts", &m->n_experts))) return st;
    if ((st = read_attr_u32(r, "top_k", &m->top_k))) return st;
    if ((st = read_attr_u32(r, "n_shared_experts", &m->n_shared_experts))) return st;
    if ((st = read_attr_u32(r, "lookahead_depth", &m->lookahead_depth))) return st;
    if ((st = read_attr_u32(r, "lookahead_k", &m->lookahead_k))) return st;
    if ((st = read_attr_uint(r, "model_config_hash", UINT64_MAX, false, &m->model_config_hash)))
        return st;
    if ((st = read_attr_str(r, "gate_normalization", norm, sizeof norm, true, NULL))) return st;
    if (!strcmp(norm, "topk"))
        m->gate_norm = GATE_SOFTMAX_TOPK;
    else if (!strcmp(norm, "all"))
        m->gate_norm = GATE_SOFTMAX_ALL;
    else
        return read_fail(r, "gate_normalization", "expected \"topk\" or \"all\", got \"%s\"", norm);
    /* params_json: any length, so read through a growing buffer */
    bool present;
    hid_t a = open_attr(r, "params_json", &present);
    h5_close(&a, H5Aclose);
    if (present) {
        size_t cap = TRACE_PARAMS_JSON_MAX + 1;
        char *buf = malloc(cap);
        if (!buf) return moesim_fail(r->err, MOESIM_ENOMEM, "%s: out of memory", r->path);
        st = read_attr_str(r, "params_json", buf, cap, false, NULL);
        if (st) {
            free(buf);
            return st;
        }
        *params_json = strdup(buf);
        free(buf);
        if (!*params_json) return moesim_fail(r->err, MOESIM_ENOMEM, "%s: out of memory", r->path);
    }
    return MOESIM_OK;
}

static moesim_status read_file(reader *r, trace **out) {
    trace_meta m = {0};
    char *params_json = NULL;
    hid_t ds[DS_COUNT];
    for (int i = 0; i < DS_COUNT; i++) ds[i] = H5I_INVALID_HID;
    trace *t = NULL;
    moesim_status st = read_meta(r, &m, &params_json);

    /* the layer map must be known before trace_meta_check checks it */
    dataset_spec layers = {"/layers/model_layer", U32_SPEC, 1, "[L]", {m.n_layers}};
    hid_t ld = H5I_INVALID_HID;
    bool present = false;
    if (!st && (m.n_layers < 1 || m.n_layers > MODEL_MAX_LAYERS))
        st = read_fail(r, "n_layers", "expected 1..%d, got %" PRIu32, MODEL_MAX_LAYERS, m.n_layers);
    if (!st) st = open_dataset(r, &layers, &present, &ld, NULL);
    if (!st && !present) st = read_fail(r, layers.name, "required dataset missing");
    if (!st) st = check_storage(r, &layers, ld);
    if (!st) st = read_dataset(r, &layers, ld, m.model_layer);
    h5_close(&ld, H5Dclose);
    if (!st) {
        /* attribute names in messages: the meta check speaks of fields, which are the names */
        st = trace_meta_check(&m, r->path, r->err);
    }

    const hsize_t L = m.n_layers, k = m.top_k, D = m.lookahead_depth, Kp = m.lookahead_k;
    dataset_spec specs[DS_COUNT] = {
        [DS_REQUEST_ID] = {"/tokens/request_id", U32_SPEC, 1, "[N]", {0}},
        [DS_POSITION] = {"/tokens/position", U32_SPEC, 1, "[N]", {0}},
        [DS_PHASE] =
            {"/tokens/phase", H5T_INTEGER, 1, false, "uint8", H5T_NATIVE_UINT8, 1, "[N]", {0}},
        [DS_TOKEN_ID] =
            {"/tokens/token_id", H5T_INTEGER, 4, true, "int32", H5T_NATIVE_INT32, 1, "[N]", {0}},
        [DS_EXPERT_IDS] = {"/routing/expert_ids",
                           H5T_INTEGER,
                           2,
                           false,
                           "uint16",
                           H5T_NATIVE_UINT16,
                           3,
                           "[N][L][k]",
                           {0, L, k}},
        [DS_GATE_WEIGHTS] = {"/routing/gate_weights",
                             H5T_FLOAT,
                             4,
                             true,
                             "float32",
                             H5T_NATIVE_FLOAT,
                             3,
                             "[N][L][k]",
                             {0, L, k}},
        [DS_IMPORTANCE] = {"/routing/importance",
                           H5T_FLOAT,
                           4,
                           true,
                           "float32",
                           H5T_NATIVE_FLOAT,
                           2,
                           "[N][L]",
                           {0, L}},
        [DS_LOOK_IDS] = {"/lookahead/expert_ids",
                         H5T_INTEGER,
                         2,
                         false,
                         "uint16",
                         H5T_NATIVE_UINT16,
                         4,
                         "[N][L][D][K']",
                         {0, L, D, Kp}},
        [DS_LOOK_SCORES] = {"/lookahead/scores",
                            H5T_FLOAT,
                            4,
                            true,
                            "float32",
                            H5T_NATIVE_FLOAT,
                            4,
                            "[N][L][D][K']",
                            {0, L, D, Kp}},
    };
    /* N comes from /tokens/request_id; every other dataset must agree */
    uint64_t n_tokens = 0;
    bool have[DS_COUNT] = {false};
    for (int i = 0; i < DS_COUNT && !st; i++) {
        bool required = i != DS_TOKEN_ID && i != DS_IMPORTANCE;
        specs[i].dims[0] = n_tokens;
        if ((i == DS_LOOK_IDS || i == DS_LOOK_SCORES) && D == 0) {
            int ex = link_state(r->file, specs[i].name);
            if (ex < 0)
                st = read_fail(r, specs[i].name, "cannot open (corrupt: %s)", h5_reason(r->why));
            else if (ex > 0)
                st = read_fail(r, specs[i].name, "present but lookahead_depth is 0");
            continue;
        }
        st = open_dataset(r, &specs[i], &have[i], &ds[i], i == DS_REQUEST_ID ? &n_tokens : NULL);
        if (i == DS_REQUEST_ID) specs[i].dims[0] = n_tokens;
        if (!st && !have[i] && required)
            st = read_fail(r, specs[i].name,
                           (i == DS_LOOK_IDS || i == DS_LOOK_SCORES)
                               ? "required dataset missing (lookahead_depth > 0)"
                               : "required dataset missing");
        if (!st && i == DS_REQUEST_ID && n_tokens == 0)
            st = read_fail(r, specs[i].name, "the trace holds no tokens");
    }
    m.has_token_ids = have[DS_TOKEN_ID];
    m.has_importance = have[DS_IMPORTANCE];
    for (int i = 0; i < DS_COUNT && !st; i++)
        if (have[i]) st = check_storage(r, &specs[i], ds[i]);
    if (!st) {
        t = trace_try_create(&m, n_tokens);
        if (!t)
            st = moesim_fail(r->err, MOESIM_ENOMEM,
                             "%s: cannot allocate %.1f MiB for %" PRIu64 " tokens", r->path,
                             (double)trace_bytes_per_token(&m) * (double)n_tokens / 1048576.0,
                             n_tokens);
    }
    if (!st) {
        void *bufs[DS_COUNT] = {t->request_id, t->position,      t->phase,
                                t->token_id,   t->expert_ids,    t->gate_weights,
                                t->importance, t->lookahead_ids, t->lookahead_scores};
        for (int i = 0; i < DS_COUNT && !st; i++)
            if (have[i]) st = read_dataset(r, &specs[i], ds[i], bufs[i]);
    }
    for (int i = 0; i < DS_COUNT; i++) h5_close(&ds[i], H5Dclose);
    if (!st) {
        t->params_json = params_json;
        params_json = NULL;
        st = trace_finish(t, r->path, r->err);
    }
    free(params_json);
    if (st) {
        trace_destroy(t);
        return st;
    }
    *out = t;
    return MOESIM_OK;
}

moesim_status trace_read(const char *path, trace **out, moesim_error *err) {
    *out = NULL;
    h5_quiet();
    struct stat sb;
    if (stat(path, &sb) != 0)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return moesim_fail(err, MOESIM_EINPUT, "%s: not a regular file", path);
    if (sb.st_size == 0)
        return moesim_fail(err, MOESIM_EINPUT, "%s: empty file (0 bytes), not an HDF5 trace", path);
    reader r = {
        .path = path, .file = H5I_INVALID_HID, .file_bytes = (uint64_t)sb.st_size, .err = err};
    htri_t is = H5Fis_hdf5(path);
    if (is == 0)
        return moesim_fail(err, MOESIM_EINPUT, "%s: not an HDF5 file (no HDF5 signature)", path);
    if (is < 0) return moesim_fail(err, MOESIM_EIO, "%s: cannot open (%s)", path, h5_reason(r.why));
    r.file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (r.file < 0) {
        /* HDF5 says "truncated file: eof = 2000, sblock->base_addr = 0, stored_eof = 25206" */
        const char *why = h5_reason(r.why), *stored = strstr(why, "stored_eof = ");
        unsigned long long eof, stored_eof;
        if (!strncmp(why, "truncated file: eof = ", 22) && stored &&
            sscanf(why + 22, "%llu", &eof) == 1 && sscanf(stored + 13, "%llu", &stored_eof) == 1)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: truncated HDF5 file: %llu of %llu bytes present", path, eof,
                               stored_eof);
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: not a readable HDF5 file (truncated or corrupt: %s)", path, why);
    }
    moesim_status st = read_file(&r, out);
    if (H5Fclose(r.file) < 0 && !st) {
        trace_destroy(*out);
        *out = NULL;
        st = moesim_fail(err, MOESIM_EINPUT, "%s: corrupt HDF5 file (%s)", path, h5_reason(r.why));
    }
    H5Eclear2(H5E_DEFAULT);
    return st;
}
