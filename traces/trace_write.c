/* Writing the HDF5 form of a router trace (traces/FORMAT.md is the reference for every
 * attribute and dataset written here): the streaming trace_writer, and trace_write on top of it.
 *
 * Crash safety: the file is a temporary beside the destination (common/atomic_file.h), renamed
 * over it once closed and synced; on any failure the temporary is removed. Every block is
 * checked (trace_checker) before it is staged, so an invalid trace never becomes a file.
 * The look-ahead rows' first hits (trace_first_hits) and whether each lists its candidates best
 * first (TRACE_RANKED_ATTR) are found as blocks are appended and stored at commit.
 *
 * Layout and determinism: each dataset is chunked along its first dimension (about
 * TRACE_CHUNK_TARGET_BYTES of whole rows per chunk, TRACE_TOKEN_CHUNK_TARGET_BYTES for one value
 * per token), shuffled and deflated by the chunk codec
 * (traces/h5_chunks.h). Rows are staged per dataset; each time the token count crosses a
 * multiple of the stride (a function of the geometry only), the complete chunks of every
 * dataset, in dataset order, are compressed and written; commit writes the rest. The order of
 * chunks in the file thus depends on the trace alone, never on how the caller split it into
 * blocks nor on the thread count, and with object times off and the format bounds fixed (v1.8
 * objects) identical traces give byte-identical files. */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "traces/h5_chunks.h"
#include "traces/trace.h"

/* Tokens staged between two flushes: about this many bytes of all datasets together. Larger
 * strides give the codec more chunks to spread over threads per flush (16 MiB: ~9 look-ahead
 * score chunks for Qwen3-30B-A3B with D = 3, K' = 16) at the price of staging memory (about
 * twice the stride, whatever the trace length). */
#define WRITER_STRIDE_BYTES (16u * 1024u * 1024u)

/* The datasets, in the order they are created and flushed. */
enum {
    WD_REQUEST_ID,
    WD_POSITION,
    WD_PHASE,
    WD_TOKEN_ID,
    WD_EXPERT_IDS,
    WD_GATE_WEIGHTS,
    WD_IMPORTANCE,
    WD_LOOK_IDS,
    WD_LOOK_SCORES,
    WD_MODEL_LAYER,
    WD_COUNT
};

typedef struct staged_dataset {
    const char *name;
    hid_t d;              /* H5I_INVALID_HID: not in this trace */
    hid_t mtype;          /* the memory type of the rows */
    bool raw;             /* file type == memory type: chunks go through our codec */
    size_t row_bytes;     /* one row along dimension 0 */
    size_t elem_size;     /* bytes per value (the shuffle's element) */
    uint64_t chunk_rows;  /* rows per chunk */
    uint32_t distances;   /* look-ahead rows: D, each distance chunked apart; else 1 */
    uint32_t columns;     /* look-ahead rows: K' / Kc, each Kc candidates chunked apart; else 1 */
    size_t run_bytes;     /* with parts: the Kc values of one (layer, distance) in a chunk */
    size_t row_run_bytes; /* the K' values of one (layer, distance) in a row */
    chunk_level level;    /* its deflate level (h5_chunks.h) */
    unsigned char *stage; /* [stage_cap][row_bytes]: rows written .. written + staged - 1 */
    uint64_t stage_cap;
    uint64_t staged;  /* rows waiting in stage */
    uint64_t written; /* rows already in the file (whole chunks until commit) */
} staged_dataset;

struct trace_writer {
    char *path;     /* destination, for messages */
    atomic_file af; /* zeroed until begun: aborting it is then a no-op */
    hid_t file;
    char why[160];
    trace_meta meta;
    trace_checker check;
    uint64_t n_tokens;      /* announced at open */
    uint64_t appended;      /* tokens appended so far */
    uint64_t stride_tokens; /* a flush each time `appended` crosses a multiple of this */
    staged_dataset ds[WD_COUNT];
    chunk_batch batch;
    trace_first_hits first_hits; /* of the look-ahead rows appended so far */
    bool ranked;                 /* every look-ahead row appended so far lists its best first */
};

static moesim_status write_fail(trace_writer *w, const char *object, moesim_error *err) {
    return moesim_fail(err, MOESIM_EIO, "%s: %s: cannot write (%s)", w->path, object,
                       h5_reason(w->why));
}

/* Attribute `name` of object `obj` in `space`; `object` names it in messages. */
static moesim_status write_attr_of(trace_writer *w, hid_t obj, const char *object, const char *name,
                                   hid_t space, hid_t ftype, hid_t mtype, const void *value,
                                   moesim_error *err) {
    hid_t a =
        space < 0 ? H5I_INVALID_HID : H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = a < 0 ? -1 : H5Awrite(a, mtype, value);
    h5_close(&a, H5Aclose);
    return rc < 0 ? write_fail(w, object, err) : MOESIM_OK;
}

/* A scalar root attribute. */
static moesim_status write_attr(trace_writer *w, const char *name, hid_t ftype, hid_t mtype,
                                const void *value, moesim_error *err) {
    hid_t space = H5Screate(H5S_SCALAR);
    moesim_status st = write_attr_of(w, w->file, name, name, space, ftype, mtype, value, err);
    h5_close(&space, H5Sclose);
    return st;
}

static moesim_status write_attr_u32(trace_writer *w, const char *name, uint32_t v,
                                    moesim_error *err) {
    return write_attr(w, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &v, err);
}

static moesim_status write_attr_str(trace_writer *w, const char *name, const char *s,
                                    moesim_error *err) {
    hid_t type = H5Tcopy(H5T_C_S1);
    if (type < 0 || H5Tset_size(type, H5T_VARIABLE) < 0 || H5Tset_cset(type, H5T_CSET_UTF8) < 0) {
        h5_close(&type, H5Tclose);
        return write_fail(w, name, err);
    }
    moesim_status st = write_attr(w, name, type, type, &s, err);
    h5_close(&type, H5Tclose);
    return st;
}

static moesim_status write_group(trace_writer *w, const char *name, moesim_error *err) {
    hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
    herr_t rc = gcpl < 0 ? -1 : H5Pset_obj_track_times(gcpl, 0);
    hid_t g = rc < 0 ? H5I_INVALID_HID : H5Gcreate2(w->file, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
    moesim_status st = g < 0 ? write_fail(w, name, err) : MOESIM_OK;
    h5_close(&g, H5Gclose);
    h5_close(&gcpl, H5Pclose);
    return st;
}

/* Rows per chunk for a dataset of n_rows rows of row_bytes each, of `rank` dimensions (1: one
 * value per token, or the layer map, a single small chunk anyway). */
static uint64_t chunk_rows_for(uint64_t n_rows, size_t row_bytes, int rank) {
    const size_t target = rank == 1 ? TRACE_TOKEN_CHUNK_TARGET_BYTES : TRACE_CHUNK_TARGET_BYTES;
    uint64_t c = target / row_bytes;
    if (c < 1) c = 1;
    return c < n_rows ? c : n_rows;
}

/* Candidates per chunk of look-ahead rows of K' candidates: top_k where K' is a multiple of it,
 * so that a reader of the first top_k (a prefetcher of the routed experts' count) inflates their
 * chunks alone; else all K'. */
static hsize_t lookahead_chunk_k(uint32_t top_k, hsize_t k_pred) {
    return top_k && k_pred > top_k && k_pred % top_k == 0 ? top_k : k_pred;
}

/* Creates dataset `which` of shape dims[0..rank), chunked along dims[0], shuffled and deflated,
 * and its stage. */
static moesim_status create_dataset(trace_writer *w, int which, const char *name, hid_t ftype,
                                    hid_t mtype, int rank, const hsize_t *dims, moesim_error *err) {
    staged_dataset *s = &w->ds[which];
    s->name = name;
    s->mtype = mtype;
    s->elem_size = H5Tget_size(mtype);
    s->row_bytes = s->elem_size;
    for (int i = 1; i < rank; i++) s->row_bytes *= dims[i];
    /* look-ahead rows ([N][L][D][K']): a chunk holds one distance and Kc candidates of each
     * row (lookahead_chunk_k), as many bytes as one distance of the rows of a whole-row chunk,
     * so that a reader of distance 1's first Kc candidates alone inflates that part alone, and
     * a reader of everything keeps as many bytes inflated as before (FORMAT.md, "Storage") */
    s->distances = rank == 4 && dims[2] > 1 ? (uint32_t)dims[2] : 1;
    s->columns =
        rank == 4 && dims[3] ? (uint32_t)(dims[3] / lookahead_chunk_k(w->meta.top_k, dims[3])) : 1;
    s->row_run_bytes = rank == 4 ? s->elem_size * dims[3] : 0;
    s->run_bytes = s->row_run_bytes / s->columns;
    s->level = rank == 4 ? CHUNK_LEVEL_LOOKAHEAD : CHUNK_LEVEL_ROWS;
    s->chunk_rows = chunk_rows_for(dims[0], s->row_bytes / s->columns, rank);
    s->raw = H5Tequal(ftype, mtype) > 0; /* else a host whose byte order differs from the file's */
    uint64_t cap = s->chunk_rows - 1 + w->stride_tokens;
    s->stage_cap = cap < dims[0] ? cap : dims[0];
    s->stage = malloc(s->stage_cap * s->row_bytes);
    if (!s->stage)
        return moesim_fail(err, MOESIM_ENOMEM, "%s: %s: out of memory for staging", w->path, name);
    hsize_t chunk[4];
    chunk[0] = s->chunk_rows;
    for (int i = 1; i < rank; i++) chunk[i] = dims[i];
    if (s->distances > 1) chunk[2] = 1;
    if (rank == 4) chunk[3] = dims[3] / s->columns;
    hid_t space = H5I_INVALID_HID;
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    herr_t rc = dcpl < 0 ? -1 : H5Pset_obj_track_times(dcpl, 0);
    if (rc >= 0) rc = H5Pset_chunk(dcpl, rank, chunk);
    if (rc >= 0) rc = H5Pset_shuffle(dcpl);
    if (rc >= 0) rc = H5Pset_deflate(dcpl, rank == 4 ? LOOKAHEAD_DEFLATE_LEVEL : DEFLATE_LEVEL);
    if (rc >= 0) rc = (space = H5Screate_simple(rank, dims, NULL)) < 0 ? -1 : 0;
    if (rc >= 0) s->d = H5Dcreate2(w->file, name, ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    h5_close(&space, H5Sclose);
    h5_close(&dcpl, H5Pclose);
    return s->d < 0 ? write_fail(w, name, err) : MOESIM_OK;
}

/* The rows of dataset `which` in a block (NULL for the layer map, which comes from meta). */
static const void *block_rows(const trace *t, int which) {
    switch (which) {
    case WD_REQUEST_ID:
        return t->request_id;
    case WD_POSITION:
        return t->position;
    case WD_PHASE:
        return t->phase;
    case WD_TOKEN_ID:
        return t->token_id;
    case WD_EXPERT_IDS:
        return t->expert_ids;
    case WD_GATE_WEIGHTS:
        return t->gate_weights;
    case WD_IMPORTANCE:
        return t->importance;
    case WD_LOOK_IDS:
        return t->lookahead_ids;
    case WD_LOOK_SCORES:
        return t->lookahead_scores;
    default:
        MOESIM_UNREACHABLE();
    }
}

static void stage_rows(staged_dataset *s, const void *rows, uint64_t n) {
    MOESIM_ASSERT(s->staged + n <= s->stage_cap);
    memcpy(s->stage + s->staged * s->row_bytes, rows, n * s->row_bytes);
    s->staged += n;
}

/* Staged rows ready for the file: those of whole chunks, or all when `final`. */
static uint64_t ready_rows(const staged_dataset *s, bool final) {
    return final ? s->staged : s->staged / s->chunk_rows * s->chunk_rows;
}

/* A host whose byte order differs from the file's: HDF5 converts and filters the rows. */
static moesim_status write_rows_converted(trace_writer *w, staged_dataset *s, uint64_t rows,
                                          moesim_error *err) {
    hsize_t start[4] = {s->written, 0, 0, 0}, count[4];
    hid_t fspace = H5Dget_space(s->d), mspace = H5I_INVALID_HID;
    int rank = fspace < 0 ? -1 : H5Sget_simple_extent_dims(fspace, count, NULL);
    herr_t rc = rank < 1 ? -1 : 0;
    if (rc >= 0) {
        count[0] = rows;
        rc = H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL);
    }
    if (rc >= 0) rc = (mspace = H5Screate_simple(rank, count, NULL)) < 0 ? -1 : 0;
    if (rc >= 0) rc = H5Dwrite(s->d, s->mtype, mspace, fspace, H5P_DEFAULT, s->stage);
    h5_close(&mspace, H5Sclose);
    h5_close(&fspace, H5Sclose);
    return rc < 0 ? write_fail(w, s->name, err) : MOESIM_OK;
}

/* The chunks of one codec run: job j is chunk chunk_of[j] (counted from the dataset's first
 * unwritten row), distance distance_of[j] and candidates from column_of[j] (look-ahead rows;
 * else 0), of dataset ds_of[j]. */
typedef struct pending_chunks {
    size_t n;
    int ds_of[CHUNK_MAX_THREADS * CHUNK_JOBS_PER_THREAD];
    uint64_t chunk_of[CHUNK_MAX_THREADS * CHUNK_JOBS_PER_THREAD];
    uint32_t distance_of[CHUNK_MAX_THREADS * CHUNK_JOBS_PER_THREAD];
    hsize_t column_of[CHUNK_MAX_THREADS * CHUNK_JOBS_PER_THREAD];
} pending_chunks;

/* Compresses the pending chunks in one parallel run and stores them in their order. */
static moesim_status write_pending(trace_writer *w, pending_chunks *p, moesim_error *err) {
    chunk_batch *b = &w->batch;
    b->n_jobs = p->n;
    chunk_batch_run(b);
    for (size_t j = 0; j < p->n; j++) {
        const staged_dataset *s = &w->ds[p->ds_of[j]];
        hsize_t offset[4] = {s->written + p->chunk_of[j] * s->chunk_rows, 0, p->distance_of[j],
                             p->column_of[j]};
        if (!b->jobs[j].ok)
            return moesim_fail(err, MOESIM_EIO, "%s: %s: deflate failed", w->path, s->name);
        if (H5Dwrite_chunk(s->d, H5P_DEFAULT, 0, offset, b->jobs[j].packed_bytes,
                           b->jobs[j].packed) < 0)
            return write_fail(w, s->name, err);
    }
    p->n = 0;
    return MOESIM_OK;
}

/* Writes every dataset's ready rows, in dataset order and chunk order within a dataset. The
 * chunks of all datasets share the codec's runs, so a flush of a few chunks per dataset still
 * keeps every thread busy. Then moves each stage's leftover rows to its front. */
static moesim_status flush_all(trace_writer *w, bool final, moesim_error *err) {
    MOESIM_ASSERT(w->batch.jobs_cap <= CHUNK_MAX_THREADS * CHUNK_JOBS_PER_THREAD);
    pending_chunks p = {0};
    moesim_status st = MOESIM_OK;
    for (int i = 0; i < WD_COUNT && !st; i++) {
        staged_dataset *s = &w->ds[i];
        if (s->d < 0) continue;
        const uint64_t rows = ready_rows(s, final), bytes = rows * s->row_bytes;
        if (!s->raw) {
            st = write_pending(w, &p, err); /* what precedes it goes first */
            if (!st && rows) st = write_rows_converted(w, s, rows, err);
            continue;
        }
        const size_t chunk_rows_bytes = (size_t)s->chunk_rows * s->row_bytes;
        const uint32_t parts = s->distances * s->columns; /* chunks per row chunk */
        const size_t chunk_bytes = chunk_rows_bytes / parts;
        for (uint64_t c = 0, at = 0; at < bytes && !st; c++, at += chunk_rows_bytes)
            for (uint32_t part = 0; part < parts && !st; part++) {
                const uint32_t d = part / s->columns, col = part % s->columns;
                chunk_job *job = &w->batch.jobs[p.n];
                job->chunk_bytes = chunk_bytes;
                job->elem_size = s->elem_size;
                job->level = s->level;
                job->src = s->stage + at + d * s->row_run_bytes + col * s->run_bytes;
                size_t left =
                    bytes - at < chunk_rows_bytes ? (size_t)(bytes - at) : chunk_rows_bytes;
                job->raw_bytes = left / parts;
                job->run_bytes = parts > 1 ? s->run_bytes : 0;
                job->run_stride = parts > 1 ? s->row_run_bytes * s->distances : 0;
                p.ds_of[p.n] = i;
                p.chunk_of[p.n] = c;
                p.distance_of[p.n] = d;
                p.column_of[p.n] = col * (s->run_bytes / s->elem_size);
                if (++p.n == w->batch.jobs_cap) st = write_pending(w, &p, err);
            }
    }
    if (!st) st = write_pending(w, &p, err);
    for (int i = 0; i < WD_COUNT && !st; i++) {
        staged_dataset *s = &w->ds[i];
        if (s->d < 0) continue;
        const uint64_t rows = ready_rows(s, final);
        memmove(s->stage, s->stage + rows * s->row_bytes, (s->staged - rows) * s->row_bytes);
        s->staged -= rows;
        s->written += rows;
    }
    return st;
}

/* Closes the datasets and the file; false when HDF5 reports a failure. */
static bool close_file(trace_writer *w) {
    bool ok = true;
    for (int i = 0; i < WD_COUNT; i++)
        if (w->ds[i].d >= 0) ok &= H5Dclose(w->ds[i].d) >= 0, w->ds[i].d = H5I_INVALID_HID;
    if (w->file >= 0) ok &= H5Fclose(w->file) >= 0, w->file = H5I_INVALID_HID;
    return ok;
}

static void writer_free(trace_writer *w) {
    for (int i = 0; i < WD_COUNT; i++) free(w->ds[i].stage);
    chunk_batch_free(&w->batch);
    trace_checker_free(&w->check);
    free(w->path);
    free(w);
}

void trace_writer_abort(trace_writer *w) {
    if (!w) return;
    close_file(w);
    H5Eclear2(H5E_DEFAULT);
    atomic_file_abort(&w->af);
    writer_free(w);
}

static moesim_status write_header(trace_writer *w, const char *params_json, moesim_error *err) {
    const trace_meta *m = &w->meta;
    moesim_status st = write_attr_str(w, "format", TRACE_FORMAT_NAME, err);
    if (!st) st = write_attr_u32(w, "format_version", TRACE_FORMAT_VERSION, err);
    if (!st) st = write_attr_str(w, "model", m->model, err);
    if (!st) st = write_attr_u32(w, "n_layers", m->n_layers, err);
    if (!st) st = write_attr_u32(w, "n_experts", m->n_experts, err);
    if (!st) st = write_attr_u32(w, "top_k", m->top_k, err);
    if (!st) st = write_attr_u32(w, "n_shared_experts", m->n_shared_experts, err);
    if (!st) st = write_attr_str(w, "gate_normalization", trace_gate_norm_name(m->gate_norm), err);
    if (!st) st = write_attr_str(w, "source", m->source, err);
    if (!st) st = write_attr_str(w, "tool_version", m->tool_version, err);
    if (!st) st = write_attr_u32(w, "lookahead_depth", m->lookahead_depth, err);
    if (!st) st = write_attr_u32(w, "lookahead_k", m->lookahead_k, err);
    if (!st)
        st = write_attr(w, "model_config_hash", H5T_STD_U64LE, H5T_NATIVE_UINT64,
                        &m->model_config_hash, err);
    if (!st && params_json) st = write_attr_str(w, "params_json", params_json, err);
    return st;
}

static moesim_status create_datasets(trace_writer *w, moesim_error *err) {
    const trace_meta *m = &w->meta;
    const hsize_t N = w->n_tokens, L = m->n_layers, k = m->top_k, D = m->lookahead_depth,
                  Kp = m->lookahead_k;
    const hsize_t tok[1] = {N}, route[3] = {N, L, k}, per_layer[2] = {N, L},
                  look[4] = {N, L, D, Kp}, layers[1] = {L};
    moesim_status st = write_group(w, "/tokens", err);
    if (!st)
        st = create_dataset(w, WD_REQUEST_ID, "/tokens/request_id", H5T_STD_U32LE,
                            H5T_NATIVE_UINT32, 1, tok, err);
    if (!st)
        st = create_dataset(w, WD_POSITION, "/tokens/position", H5T_STD_U32LE, H5T_NATIVE_UINT32, 1,
                            tok, err);
    if (!st)
        st = create_dataset(w, WD_PHASE, "/tokens/phase", H5T_STD_U8LE, H5T_NATIVE_UINT8, 1, tok,
                            err);
    if (!st && m->has_token_ids)
        st = create_dataset(w, WD_TOKEN_ID, "/tokens/token_id", H5T_STD_I32LE, H5T_NATIVE_INT32, 1,
                            tok, err);
    if (!st) st = write_group(w, "/routing", err);
    if (!st)
        st = create_dataset(w, WD_EXPERT_IDS, "/routing/expert_ids", H5T_STD_U16LE,
                            H5T_NATIVE_UINT16, 3, route, err);
    if (!st)
        st = create_dataset(w, WD_GATE_WEIGHTS, "/routing/gate_weights", H5T_IEEE_F32LE,
                            H5T_NATIVE_FLOAT, 3, route, err);
    if (!st && m->has_importance)
        st = create_dataset(w, WD_IMPORTANCE, "/routing/importance", H5T_IEEE_F32LE,
                            H5T_NATIVE_FLOAT, 2, per_layer, err);
    if (!st && D) {
        st = write_group(w, "/lookahead", err);
        if (!st)
            st = create_dataset(w, WD_LOOK_IDS, "/lookahead/expert_ids", H5T_STD_U16LE,
                                H5T_NATIVE_UINT16, 4, look, err);
        if (!st)
            st = create_dataset(w, WD_LOOK_SCORES, "/lookahead/scores", H5T_IEEE_F32LE,
                                H5T_NATIVE_FLOAT, 4, look, err);
    }
    if (!st) st = write_group(w, "/layers", err);
    if (!st)
        st = create_dataset(w, WD_MODEL_LAYER, "/layers/model_layer", H5T_STD_U32LE,
                            H5T_NATIVE_UINT32, 1, layers, err);
    if (!st) stage_rows(&w->ds[WD_MODEL_LAYER], m->model_layer, L);
    return st;
}

moesim_status trace_writer_open(const trace_meta *meta, uint64_t n_tokens, uint32_t n_requests,
                                const char *params_json, const char *path, trace_writer **out,
                                moesim_error *err) {
    *out = NULL;
    moesim_status st = trace_meta_check(meta, path, err);
    if (!st) st = trace_counts_check(n_tokens, n_requests, path, err);
    if (st) return st;
    if (params_json && strlen(params_json) > TRACE_PARAMS_JSON_MAX)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: params_json: %zu characters, at most %u can be stored", path,
                           strlen(params_json), TRACE_PARAMS_JSON_MAX);
    h5_quiet();
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0 || H5Zfilter_avail(H5Z_FILTER_SHUFFLE) <= 0)
        return moesim_fail(err, MOESIM_EIO, "%s: this HDF5 library lacks deflate or shuffle", path);
    trace_writer *w = moesim_xcalloc(1, sizeof *w);
    w->path = moesim_xstrdup(path);
    w->file = H5I_INVALID_HID;
    for (int i = 0; i < WD_COUNT; i++) w->ds[i].d = H5I_INVALID_HID;
    w->meta = *meta;
    w->n_tokens = n_tokens;
    w->ranked = true;
    const uint64_t per_token = trace_bytes_per_token(meta);
    w->stride_tokens = per_token < WRITER_STRIDE_BYTES ? WRITER_STRIDE_BYTES / per_token : 1;
    trace_checker_init(&w->check, &w->meta, n_requests, w->path);
    if ((st = atomic_file_begin_path(&w->af, path, err))) {
        writer_free(w);
        return st;
    }
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS);
    herr_t rc = fcpl < 0 || fapl < 0 ? -1 : H5Pset_obj_track_times(fcpl, 0);
    if (rc >= 0) rc = H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18);
    if (rc >= 0) w->file = H5Fcreate(w->af.tmp_path, H5F_ACC_TRUNC, fcpl, fapl);
    h5_close(&fcpl, H5Pclose);
    h5_close(&fapl, H5Pclose);
    if (w->file < 0)
        st = moesim_fail(err, MOESIM_EIO, "%s: cannot create the HDF5 file (%s)", path,
                         h5_reason(w->why));
    if (!st) st = write_header(w, params_json, err);
    if (!st) st = create_datasets(w, err);
    size_t cap_bytes = 0;
    for (int i = 0; i < WD_COUNT && !st; i++) {
        const staged_dataset *d = &w->ds[i];
        size_t c =
            d->chunk_rows ? (size_t)d->chunk_rows * d->row_bytes / (d->distances * d->columns) : 0;
        cap_bytes = c > cap_bytes ? c : cap_bytes;
    }
    if (!st && !chunk_batch_init(&w->batch, cap_bytes, true))
        st = moesim_fail(err, MOESIM_ENOMEM, "%s: out of memory for chunk buffers", path);
    if (st) {
        trace_writer_abort(w);
        return st;
    }
    *out = w;
    return MOESIM_OK;
}

moesim_status trace_writer_append(trace_writer *w, const trace *block, moesim_error *err) {
    const trace_meta *a = &w->meta, *b = &block->meta;
    MOESIM_ASSERT(b->n_layers == a->n_layers && b->n_experts == a->n_experts &&
                  b->top_k == a->top_k && b->gate_norm == a->gate_norm &&
                  b->lookahead_depth == a->lookahead_depth && b->lookahead_k == a->lookahead_k &&
                  b->has_importance == a->has_importance && b->has_token_ids == a->has_token_ids);
    if (block->n_tokens > w->n_tokens - w->appended)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: %" PRIu64 " more tokens than the %" PRIu64 " announced", w->path,
                           w->appended + block->n_tokens - w->n_tokens, w->n_tokens);
    moesim_status st = trace_checker_block(&w->check, block, err);
    if (!st && block->lookahead_ids) {
        trace_first_hits_add(&w->first_hits, &w->meta, block->expert_ids, block->lookahead_ids,
                             block->n_tokens);
        w->ranked = w->ranked && trace_lookahead_ranked(block);
    }
    for (uint64_t from = 0; from < block->n_tokens && !st;) {
        uint64_t room = w->stride_tokens - w->appended % w->stride_tokens;
        uint64_t n = block->n_tokens - from < room ? block->n_tokens - from : room;
        for (int i = 0; i < WD_COUNT; i++) {
            staged_dataset *s = &w->ds[i];
            if (s->d >= 0 && i != WD_MODEL_LAYER)
                stage_rows(s, (const unsigned char *)block_rows(block, i) + from * s->row_bytes, n);
        }
        from += n;
        w->appended += n;
        if (w->appended % w->stride_tokens == 0) st = flush_all(w, false, err);
    }
    return st;
}

/* The look-ahead rows' first hits as /lookahead/expert_ids's attribute first_hits = u64[2]
 * {right, total}: a reader that skips those rows then reports the predictor's accuracy
 * without inflating them. */
static moesim_status write_first_hits(trace_writer *w, moesim_error *err) {
    const uint64_t v[2] = {w->first_hits.right, w->first_hits.total};
    const hsize_t n = 2;
    hid_t space = H5Screate_simple(1, &n, NULL);
    moesim_status st = write_attr_of(
        w, w->ds[WD_LOOK_IDS].d, "/lookahead/expert_ids attribute " TRACE_FIRST_HITS_ATTR,
        TRACE_FIRST_HITS_ATTR, space, H5T_STD_U64LE, H5T_NATIVE_UINT64, v, err);
    h5_close(&space, H5Sclose);
    return st;
}

/* Whether every look-ahead row lists its candidates best first, as /lookahead/scores's attribute
 * ranked = u8 0 or 1: a reader that only ranks by the scores then skips them. */
static moesim_status write_ranked(trace_writer *w, moesim_error *err) {
    const uint8_t v = w->ranked;
    hid_t space = H5Screate(H5S_SCALAR);
    moesim_status st = write_attr_of(w, w->ds[WD_LOOK_SCORES].d,
                                     "/lookahead/scores attribute " TRACE_RANKED_ATTR,
                                     TRACE_RANKED_ATTR, space, H5T_STD_U8LE, H5T_NATIVE_UINT8, &v,
                                     err);
    h5_close(&space, H5Sclose);
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

moesim_status trace_writer_commit(trace_writer *w, moesim_error *err) {
    moesim_status st = MOESIM_OK;
    if (w->appended != w->n_tokens)
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: %" PRIu64 " tokens appended, %" PRIu64 " announced", w->path,
                         w->appended, w->n_tokens);
    if (!st) st = trace_checker_finish(&w->check, err);
    if (!st) st = flush_all(w, true, err);
    if (!st && w->ds[WD_LOOK_IDS].d >= 0) st = write_first_hits(w, err);
    if (!st && w->ds[WD_LOOK_SCORES].d >= 0) st = write_ranked(w, err);
    if (!st && !close_file(w)) st = write_fail(w, "file close", err);
    if (!st) st = sync_path(w->af.tmp_path, w->path, err);
    if (!st) st = atomic_file_commit(&w->af, err); /* a failed commit removes the temporary */
    if (st) {
        trace_writer_abort(w);
        return st;
    }
    writer_free(w);
    return MOESIM_OK;
}

moesim_status trace_write(const trace *t, const char *path, moesim_error *err) {
    trace_writer *w;
    moesim_status st =
        trace_writer_open(&t->meta, t->n_tokens, t->n_requests, t->params_json, path, &w, err);
    if (st) return st;
    if ((st = trace_writer_append(w, t, err))) {
        trace_writer_abort(w);
        return st;
    }
    return trace_writer_commit(w, err);
}
