/* Reading the HDF5 form of a router trace: trace_read (traces/FORMAT.md is the reference for
 * every attribute and dataset read here; trace_write.c writes them).
 *
 * The HDF5 error stack is silenced and every failure becomes one line naming the file and the
 * attribute or dataset. Order of checks: plain file (exists, not empty, HDF5 signature),
 * format name and version, geometry attributes (trace_meta_check), every dataset's presence,
 * type and shape, then storage sizes against the shape and the file size (so a corrupt header
 * cannot ask for a giant allocation), the first_hits attribute's form, then the data, then every
 * value (trace_finish -> trace_check) and first_hits against the look-ahead rows. Datasets laid
 * out as our writer lays them out are inflated in parallel (traces/h5_chunks.h); others go
 * through H5Dread. The streaming reader (trace_stream.c) shares
 * the opening steps (trace_read_internal.h). */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/h5_chunks.h"
#include "traces/trace.h"
#include "traces/trace_read_internal.h"

moesim_status trace_read_fail(reader *r, const char *object, const char *fmt, ...) {
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
    if (!present)
        return required ? trace_read_fail(r, name, "required attribute missing") : MOESIM_OK;
    if (a < 0) return trace_read_fail(r, name, "cannot read (corrupt: %s)", h5_reason(r->why));
    hid_t ftype = H5Aget_type(a);
    moesim_status st = MOESIM_OK;
    if (ftype < 0 || H5Tget_class(ftype) != H5T_STRING || !attr_is_single(a)) {
        char desc[48] = "unreadable";
        if (ftype >= 0) describe_type(ftype, desc, sizeof desc);
        st = trace_read_fail(r, name, "expected a string attribute, got %s%s", desc,
                             !attr_is_single(a) ? " array" : "");
    } else if (H5Tis_variable_str(ftype) > 0) {
        hid_t mtype = H5Tcopy(H5T_C_S1);
        H5Tset_size(mtype, H5T_VARIABLE);
        H5Tset_cset(mtype, H5Tget_cset(ftype));
        char *s = NULL;
        if (H5Aread(a, mtype, &s) < 0 || !s) {
            st = trace_read_fail(r, name, "cannot read (%s)", h5_reason(r->why));
        } else if (strlen(s) >= cap) {
            st = trace_read_fail(r, name, "expected at most %zu characters, got %zu", cap - 1,
                                 strlen(s));
        } else {
            memcpy(buf, s, strlen(s) + 1);
        }
        if (s) H5free_memory(s);
        h5_close(&mtype, H5Tclose);
    } else {
        size_t n = H5Tget_size(ftype);
        if (n >= cap) {
            st = trace_read_fail(r, name, "expected at most %zu characters, got a %zu-byte string",
                                 cap - 1, n);
        } else {
            /* the stored bytes first: NULs pad a fixed-length string, and one with text after
             * it would cut the text short (the conversion below stops at it) */
            if (H5Aread(a, ftype, buf) < 0)
                st = trace_read_fail(r, name, "cannot read (%s)", h5_reason(r->why));
            for (size_t i = strnlen(buf, n); !st && i < n; i++)
                if (buf[i]) st = trace_read_fail(r, name, "a NUL byte inside the string");
            hid_t mtype = H5Tcopy(ftype);
            H5Tset_strpad(mtype, H5T_STR_NULLTERM);
            H5Tset_size(mtype, n + 1);
            if (!st && H5Aread(a, mtype, buf) < 0)
                st = trace_read_fail(r, name, "cannot read (%s)", h5_reason(r->why));
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
    if (!present)
        return required ? trace_read_fail(r, name, "required attribute missing") : MOESIM_OK;
    if (a < 0) return trace_read_fail(r, name, "cannot read (corrupt: %s)", h5_reason(r->why));
    hid_t ftype = H5Aget_type(a);
    moesim_status st = MOESIM_OK;
    if (ftype < 0 || H5Tget_class(ftype) != H5T_INTEGER || !attr_is_single(a)) {
        char desc[48] = "unreadable";
        if (ftype >= 0) describe_type(ftype, desc, sizeof desc);
        st = trace_read_fail(r, name, "expected one unsigned integer, got %s%s", desc,
                             !attr_is_single(a) ? " array" : "");
    } else if (H5Tget_sign(ftype) == H5T_SGN_NONE) {
        uint64_t v;
        if (H5Aread(a, H5T_NATIVE_UINT64, &v) < 0)
            st = trace_read_fail(r, name, "cannot read (%s)", h5_reason(r->why));
        else if (v > max)
            st = trace_read_fail(r, name, "expected 0..%" PRIu64 ", got %" PRIu64, max, v);
        else
            *out = v;
    } else {
        int64_t v;
        if (H5Aread(a, H5T_NATIVE_INT64, &v) < 0)
            st = trace_read_fail(r, name, "cannot read (%s)", h5_reason(r->why));
        else if (v < 0 || (uint64_t)v > max)
            st = trace_read_fail(r, name, "expected 0..%" PRIu64 ", got %" PRId64, max, v);
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
    if (ex < 0)
        return trace_read_fail(r, spec->name, "cannot open (corrupt: %s)", h5_reason(r->why));
    if (ex == 0) return MOESIM_OK;
    H5O_info_t info;
    if (H5Oget_info_by_name(r->file, spec->name, &info, H5P_DEFAULT) < 0)
        return trace_read_fail(r, spec->name, "cannot open (%s)", h5_reason(r->why));
    if (info.type != H5O_TYPE_DATASET)
        return trace_read_fail(r, spec->name, "expected a dataset, got a %s",
                               info.type == H5O_TYPE_GROUP ? "group" : "named type");
    *present = true;
    hid_t d = H5Dopen2(r->file, spec->name, H5P_DEFAULT);
    if (d < 0) return trace_read_fail(r, spec->name, "cannot open (%s)", h5_reason(r->why));
    hid_t type = H5Dget_type(d), space = H5Dget_space(d);
    moesim_status st = MOESIM_OK;
    if (type < 0 || space < 0) {
        st =
            trace_read_fail(r, spec->name, "cannot read its type or shape (%s)", h5_reason(r->why));
    } else if (H5Tget_class(type) != spec->cls || H5Tget_size(type) != spec->size ||
               (spec->cls == H5T_INTEGER &&
                (H5Tget_sign(type) != H5T_SGN_NONE) != spec->is_signed)) {
        char got[48];
        describe_type(type, got, sizeof got);
        st = trace_read_fail(r, spec->name, "expected dtype %s, got %s", spec->type_name, got);
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
            st = trace_read_fail(r, spec->name, "expected shape %s%s%s, got %s", spec->shape_name,
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
        return trace_read_fail(r, spec->name,
                               "claims %llu bytes of storage in a %" PRIu64 "-byte file (corrupt)",
                               (unsigned long long)stored, r->file_bytes);
    if ((uint64_t)stored * DEFLATE_MAX_RATIO < raw)
        return trace_read_fail(r, spec->name,
                               "%llu bytes stored cannot hold its %" PRIu64
                               " bytes of data (truncated or not written)",
                               (unsigned long long)stored, raw);
    return MOESIM_OK;
}

/* Rows per chunk when `d` is laid out as this writer lays datasets out (chunks of whole rows
 * along dimension 0, or for look-ahead rows of one distance and Kc of the K' candidates of them;
 * filters exactly shuffle then deflate; file type = memory type), else 0. *distances: D when
 * each chunk holds one distance of [N][L][D][K'] rows, else 1; *columns: K' / Kc, the chunks
 * across a row's candidates (1 but where each holds one distance or D is 1). */
hsize_t trace_read_chunk_rows(const dataset_spec *spec, hid_t d, uint32_t *distances,
                              uint32_t *columns) {
    hsize_t rows = 0, chunk[H5S_MAX_RANK];
    hid_t dcpl = H5Dget_create_plist(d), type = H5Dget_type(d);
    bool ok = dcpl >= 0 && type >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED &&
              H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk) == spec->rank && H5Pget_nfilters(dcpl) == 2 &&
              H5Tequal(type, spec->mtype) > 0;
    const bool look = ok && spec->rank == 4;
    const bool by_distance = look && spec->dims[2] > 1 && chunk[2] == 1;
    const bool by_column = look && (by_distance || spec->dims[2] == 1) && chunk[3] > 0 &&
                           chunk[3] < spec->dims[3] && spec->dims[3] % chunk[3] == 0;
    *distances = by_distance ? (uint32_t)spec->dims[2] : 1;
    *columns = by_column ? (uint32_t)(spec->dims[3] / chunk[3]) : 1;
    for (int i = 1; ok && i < spec->rank; i++)
        ok = chunk[i] == spec->dims[i] || (i == 2 && by_distance) || (i == 3 && by_column);
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

moesim_status trace_read_chunk_fail(reader *r, const dataset_spec *spec, uint64_t row,
                                    const char *what) {
    return trace_read_fail(
        r, spec->name, "cannot read its data (truncated or corrupt: chunk at [%" PRIu64 "]: %s)",
        row, what);
}

/* Reads a dataset laid out by our writer: raw chunks on this thread, inflate in parallel.
 * *fallback is set when a chunk was stored some other way (then nothing was read). With
 * `distances` or `columns` > 1 each chunk holds a part of its rows (trace_read_chunk_rows),
 * scattered into place. */
static moesim_status read_chunks(reader *r, const dataset_spec *spec, hid_t d, void *buf,
                                 hsize_t chunk_rows, uint32_t distances, uint32_t columns,
                                 bool *fallback) {
    size_t row_bytes = spec->size;
    for (int i = 1; i < spec->rank; i++) row_bytes *= spec->dims[i];
    const uint32_t parts = distances * columns; /* chunks per row chunk */
    const uint64_t n_rows = spec->dims[0], total = n_rows * row_bytes;
    const uint64_t n_chunks = (n_rows + chunk_rows - 1) / chunk_rows * parts;
    const size_t chunk_bytes = (size_t)chunk_rows * row_bytes / parts;
    /* a part's runs: Kc candidates of one (layer, distance), one every D * K' of the rows */
    const size_t row_run = spec->rank == 4 ? spec->size * spec->dims[3] : 0;
    const size_t run_bytes = parts > 1 ? row_run / columns : 0;
    *fallback = false;
    /* our writer never makes chunks longer than N or much above TRACE_CHUNK_TARGET_BYTES */
    if ((chunk_rows > n_rows && n_rows > 0) || chunk_bytes > CHUNK_MAX_BYTES) {
        *fallback = true;
        return MOESIM_OK;
    }
    chunk_batch b;
    if (!chunk_batch_init(&b, chunk_bytes, false)) {
        chunk_batch_free(&b);
        return moesim_fail(r->err, MOESIM_ENOMEM, "%s: %s: out of memory for chunk buffers",
                           r->path, spec->name);
    }
    const size_t per_batch = b.jobs_cap;
    moesim_status st = MOESIM_OK;
    for (uint64_t first = 0; first < n_chunks && !st && !*fallback; first += per_batch) {
        b.n_jobs = n_chunks - first < per_batch ? (size_t)(n_chunks - first) : per_batch;
        for (size_t j = 0; j < b.n_jobs && !st && !*fallback; j++) {
            const uint64_t c = (first + j) / parts;
            const uint32_t part = (uint32_t)((first + j) % parts);
            const uint32_t dist = part / columns, col = part % columns;
            hsize_t offset[4] = {c * chunk_rows, 0, dist, col * (run_bytes / spec->size)};
            hsize_t stored = 0;
            uint32_t mask = 0;
            if (H5Dget_chunk_storage_size(d, offset, &stored) < 0 || stored == 0 ||
                stored > b.packed_cap) {
                /* unallocated chunks read as fill values: leave them to H5Dread */
                *fallback = stored == 0;
                if (!*fallback) st = trace_read_chunk_fail(r, spec, offset[0], "bad chunk size");
                break;
            }
            if (H5Dread_chunk(d, H5P_DEFAULT, offset, &mask, b.jobs[j].packed) < 0) {
                st = trace_read_chunk_fail(r, spec, offset[0], h5_reason(r->why));
                break;
            }
            if (mask != 0) *fallback = true; /* a filter was skipped for this chunk */
            uint64_t at = offset[0] * row_bytes, rows_bytes = chunk_bytes * parts;
            b.jobs[j].packed_bytes = stored;
            b.jobs[j].dst = (unsigned char *)buf + at + dist * row_run + col * run_bytes;
            b.jobs[j].chunk_bytes = chunk_bytes;
            b.jobs[j].elem_size = spec->size;
            b.jobs[j].raw_bytes =
                (total - at < rows_bytes ? (size_t)(total - at) : rows_bytes) / parts;
            b.jobs[j].run_bytes = run_bytes;
            b.jobs[j].run_stride = parts > 1 ? row_run * distances : 0;
        }
        if (st || *fallback) break;
        chunk_batch_run(&b);
        for (size_t j = 0; j < b.n_jobs && !st; j++)
            if (!b.jobs[j].ok)
                st = trace_read_chunk_fail(r, spec, (first + j) / parts * chunk_rows,
                                           "deflate data do not inflate");
    }
    H5Eclear2(H5E_DEFAULT);
    chunk_batch_free(&b);
    return st;
}

/* Before H5Dread of a chunked, filtered dataset: a chunk stored with its filters skipped (filter
 * mask) that only size-preserving filters would undo (shuffle; fletcher32 drops its 4-byte
 * checksum) must hold a whole chunk. HDF5 does not check this and reads past the stored bytes
 * (found by tests/fuzz/fuzz_trace_h5.c). One index lookup per chunk of the grid: H5Dread
 * visits every chunk of the grid as well. */
moesim_status trace_read_skipped_filters_check(reader *r, const dataset_spec *spec, hid_t d) {
    hid_t dcpl = H5Dget_create_plist(d);
    hsize_t chunk[H5S_MAX_RANK];
    int n_filters = dcpl < 0 ? 0 : H5Pget_nfilters(dcpl);
    bool chunked = n_filters > 0 && H5Pget_layout(dcpl) == H5D_CHUNKED &&
                   H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk) == spec->rank;
    H5Z_filter_t ids[32];
    for (int f = 0; chunked && f < n_filters && f < 32; f++) {
        unsigned flags, cd[8];
        size_t n_cd = 8;
        ids[f] = H5Pget_filter2(dcpl, (unsigned)f, &flags, &n_cd, cd, 0, NULL, NULL);
    }
    h5_close(&dcpl, H5Pclose);
    H5Eclear2(H5E_DEFAULT);
    if (!chunked || n_filters > 32) return MOESIM_OK;
    uint64_t chunk_bytes = spec->size, grid[H5S_MAX_RANK], n_chunks = 1;
    for (int i = 0; i < spec->rank; i++) {
        chunk_bytes *= chunk[i];
        grid[i] = chunk[i] ? (spec->dims[i] + chunk[i] - 1) / chunk[i] : 0;
        n_chunks *= grid[i];
    }
    for (uint64_t c = 0; c < n_chunks; c++) {
        hsize_t offset[H5S_MAX_RANK];
        uint64_t rest = c;
        for (int i = spec->rank; i-- > 0;) {
            offset[i] = (rest % grid[i]) * chunk[i];
            rest /= grid[i];
        }
        unsigned mask = 0;
        haddr_t addr;
        hsize_t stored = 0;
        if (H5Dget_chunk_info_by_coord(d, offset, &mask, &addr, &stored) < 0) {
            H5Eclear2(H5E_DEFAULT);
            return trace_read_chunk_fail(r, spec, offset[0], "unreadable chunk index");
        }
        if (!mask || addr == HADDR_UNDEF) continue;
        uint64_t need = chunk_bytes;
        bool sized = true; /* only size-preserving filters are applied to this chunk */
        for (int f = 0; f < n_filters; f++) {
            if (mask & (1u << f)) continue;
            if (ids[f] == H5Z_FILTER_FLETCHER32)
                need += 4;
            else if (ids[f] != H5Z_FILTER_SHUFFLE)
                sized = false;
        }
        if (sized && stored < need)
            return trace_read_chunk_fail(r, spec, offset[0],
                                         "stored unfiltered but shorter than a chunk");
    }
    return MOESIM_OK;
}

moesim_status trace_read_dataset(reader *r, const dataset_spec *spec, hid_t d, void *buf) {
    uint32_t distances, columns;
    hsize_t rows = trace_read_chunk_rows(spec, d, &distances, &columns);
    if (rows) {
        bool fallback;
        moesim_status st = read_chunks(r, spec, d, buf, rows, distances, columns, &fallback);
        if (st || !fallback) return st;
    }
    moesim_status st = trace_read_skipped_filters_check(r, spec, d);
    if (st) return st;
    if (H5Dread(d, spec->mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
        return trace_read_fail(r, spec->name, "cannot read its data (truncated or corrupt: %s)",
                               h5_reason(r->why));
    return MOESIM_OK;
}

#define U32_SPEC H5T_INTEGER, 4, false, "uint32", H5T_NATIVE_UINT32
static moesim_status read_meta(reader *r, trace_meta *m, char **params_json) {
    moesim_status st;
    char format[64], norm[16];
    if ((st = read_attr_str(r, "format", format, sizeof format, true, NULL))) return st;
    if (strcmp(format, TRACE_FORMAT_NAME) != 0)
        return trace_read_fail(r, "format", "expected \"%s\", got \"%s\" (not a moesim trace)",
                               TRACE_FORMAT_NAME, format);
    uint64_t version;
    if ((st = read_attr_uint(r, "format_version", UINT32_MAX, true, &version))) return st;
    if (version > TRACE_FORMAT_VERSION)
        return trace_read_fail(r, "format_version",
                               "version %" PRIu64
                               " is newer than this moesim reads (%u): upgrade moesim",
                               version, TRACE_FORMAT_VERSION);
    if (version < 1)
        return trace_read_fail(r, "format_version", "expected 1..%u, got 0", TRACE_FORMAT_VERSION);
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
        return trace_read_fail(r, "gate_normalization", "expected \"topk\" or \"all\", got \"%s\"",
                               norm);
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
        json_error_t why;
        json_t *parsed = json_loads(buf, JSON_DECODE_ANY, &why);
        if (!parsed) {
            free(buf);
            return trace_read_fail(r, "params_json", "expected JSON text (line %d: %s)", why.line,
                                   why.text);
        }
        json_decref(parsed);
        *params_json = strdup(buf);
        free(buf);
        if (!*params_json) return moesim_fail(r->err, MOESIM_ENOMEM, "%s: out of memory", r->path);
    }
    return MOESIM_OK;
}

/* "uint64 [2]", "float32 scalar": an attribute's type and shape, for messages. */
static void describe_attr(hid_t type, hid_t space, char *buf, size_t cap) {
    char shape[96] = " (shape unreadable)";
    hsize_t dims[H5S_MAX_RANK];
    int rank = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
    if (rank == 0) snprintf(shape, sizeof shape, " scalar");
    if (rank > 0 && H5Sget_simple_extent_dims(space, dims, NULL) == rank) {
        shape[0] = ' ';
        format_dims(shape + 1, sizeof shape - 1, rank, dims);
    }
    snprintf(buf, cap, "unreadable");
    if (type >= 0) describe_type(type, buf, cap);
    size_t at = strlen(buf);
    snprintf(buf + at, cap - at, "%s", shape);
}

/* The n (1: a scalar, 2: a pair) counts of the optional attribute `name` of dataset `d` into v
 * (*present: whether it exists); fails naming `object` and what was `expected` when it holds
 * anything else. */
static moesim_status read_counts(reader *r, const char *object, hid_t d, const char *name,
                                 uint64_t *v, int n, const char *expected, bool *present) {
    htri_t ex = H5Aexists(d, name);
    *present = ex != 0;
    if (ex == 0) return MOESIM_OK;
    hid_t a = ex < 0 ? H5I_INVALID_HID : H5Aopen(d, name, H5P_DEFAULT);
    if (a < 0) return trace_read_fail(r, object, "cannot read (corrupt: %s)", h5_reason(r->why));
    hid_t type = H5Aget_type(a), space = H5Aget_space(a);
    int rank = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
    hsize_t dims[1];
    bool shaped = n == 1 ? rank == 0
                         : rank == 1 && H5Sget_simple_extent_dims(space, dims, NULL) == 1 &&
                               dims[0] == (hsize_t)n;
    bool integer = type >= 0 && H5Tget_class(type) == H5T_INTEGER;
    bool is_unsigned = integer && H5Tget_sign(type) == H5T_SGN_NONE;
    int64_t s[2] = {0, 0};
    moesim_status st = MOESIM_OK;
    MOESIM_ASSERT(n == 1 || n == 2);
    if (!integer || !shaped) {
        char got[160];
        describe_attr(type, space, got, sizeof got);
        st = trace_read_fail(r, object, "expected %s, got %s", expected, got);
    } else if (H5Aread(a, is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64,
                       is_unsigned ? (void *)v : (void *)s) < 0) {
        st = trace_read_fail(r, object, "cannot read (%s)", h5_reason(r->why));
    }
    if (!st && !is_unsigned && n == 2 && (s[0] < 0 || s[1] < 0))
        st = trace_read_fail(r, object, "expected counts >= 0, got %" PRId64 " and %" PRId64, s[0],
                             s[1]);
    else if (!st && !is_unsigned && s[0] < 0)
        st = trace_read_fail(r, object, "expected %s, got %" PRId64, expected, s[0]);
    for (int i = 0; !st && !is_unsigned && i < n; i++) v[i] = (uint64_t)s[i];
    h5_close(&type, H5Tclose);
    h5_close(&space, H5Sclose);
    h5_close(&a, H5Aclose);
    return st;
}

/* The optional first_hits attribute of /lookahead/expert_ids: {right, total} with right <= total
 * <= the (token, layer) pairs that have a next layer. */
static moesim_status read_first_hits(reader *r, opened_trace *o) {
    uint64_t v[2] = {0, 0};
    bool present;
    moesim_status st = read_counts(r, FIRST_HITS_OBJECT, o->ds[DS_LOOK_IDS], TRACE_FIRST_HITS_ATTR,
                                   v, 2, "uint64 [2] {right, total}", &present);
    if (!present) return st;
    const uint64_t pairs = o->n_tokens * (o->meta.n_layers - 1);
    if (!st && v[0] > v[1])
        st = trace_read_fail(r, FIRST_HITS_OBJECT,
                             "%" PRIu64 " of %" PRIu64 ": expected right <= total", v[0], v[1]);
    if (!st && v[1] > pairs)
        st = trace_read_fail(r, FIRST_HITS_OBJECT,
                             "total %" PRIu64 " > the %" PRIu64
                             " (token, layer) pairs that have a next layer",
                             v[1], pairs);
    if (st) return st;
    o->has_first_hits = true;
    o->first_hits = (trace_first_hits){.right = v[0], .total = v[1]};
    return MOESIM_OK;
}

/* The optional ranked attribute of /lookahead/scores: 0 or 1, any integer type, a scalar. */
static moesim_status read_ranked(reader *r, opened_trace *o) {
    uint64_t v = 0;
    bool present;
    moesim_status st = read_counts(r, RANKED_OBJECT, o->ds[DS_LOOK_SCORES], TRACE_RANKED_ATTR, &v,
                                   1, "a scalar integer, 0 or 1", &present);
    if (!st && v > 1)
        st = trace_read_fail(r, RANKED_OBJECT, "expected 0 or 1, got %" PRIu64, v);
    o->scores_ranked = !st && v == 1;
    return st;
}

moesim_status trace_read_first_hits_check(reader *r, const opened_trace *o,
                                          const trace_first_hits *rows) {
    const trace_first_hits *a = &o->first_hits;
    if (!o->has_first_hits || (a->right == rows->right && a->total == rows->total))
        return MOESIM_OK;
    return trace_read_fail(r, FIRST_HITS_OBJECT,
                           "%" PRIu64 " of %" PRIu64 ", the rows give %" PRIu64 " of %" PRIu64,
                           a->right, a->total, rows->right, rows->total);
}

void trace_read_datasets_close(opened_trace *o) {
    for (int i = 0; i < DS_COUNT; i++) h5_close(&o->ds[i], H5Dclose);
    free(o->params_json);
    o->params_json = NULL;
}

moesim_status trace_read_datasets_open(reader *r, opened_trace *o) {
    trace_meta m = {0};
    for (int i = 0; i < DS_COUNT; i++) o->ds[i] = H5I_INVALID_HID;
    moesim_status st = read_meta(r, &m, &o->params_json);

    /* the layer map must be known before trace_meta_check checks it */
    dataset_spec layers = {"/layers/model_layer", U32_SPEC, 1, "[L]", {m.n_layers}};
    hid_t ld = H5I_INVALID_HID;
    bool present = false;
    if (!st && (m.n_layers < 1 || m.n_layers > MODEL_MAX_LAYERS))
        st = trace_read_fail(r, "n_layers", "expected 1..%d, got %" PRIu32, MODEL_MAX_LAYERS,
                             m.n_layers);
    if (!st) st = open_dataset(r, &layers, &present, &ld, NULL);
    if (!st && !present) st = trace_read_fail(r, layers.name, "required dataset missing");
    if (!st) st = check_storage(r, &layers, ld);
    if (!st) st = trace_read_dataset(r, &layers, ld, m.model_layer);
    h5_close(&ld, H5Dclose);
    if (!st) {
        /* attribute names in messages: the meta check speaks of fields, which are the names */
        st = trace_meta_check(&m, r->path, r->err);
    }

    const hsize_t L = m.n_layers, k = m.top_k, D = m.lookahead_depth, Kp = m.lookahead_k;
    const dataset_spec specs_init[DS_COUNT] = {
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
    dataset_spec *specs = o->specs;
    memcpy(specs, specs_init, sizeof specs_init);
    /* N comes from /tokens/request_id; every other dataset must agree */
    uint64_t n_tokens = 0;
    bool *have = o->have;
    hid_t *ds = o->ds;
    for (int i = 0; i < DS_COUNT && !st; i++) {
        bool required = i != DS_TOKEN_ID && i != DS_IMPORTANCE;
        specs[i].dims[0] = n_tokens;
        if ((i == DS_LOOK_IDS || i == DS_LOOK_SCORES) && D == 0) {
            int ex = link_state(r->file, specs[i].name);
            if (ex < 0)
                st = trace_read_fail(r, specs[i].name, "cannot open (corrupt: %s)",
                                     h5_reason(r->why));
            else if (ex > 0)
                st = trace_read_fail(r, specs[i].name, "present but lookahead_depth is 0");
            continue;
        }
        st = open_dataset(r, &specs[i], &have[i], &ds[i], i == DS_REQUEST_ID ? &n_tokens : NULL);
        if (i == DS_REQUEST_ID) specs[i].dims[0] = n_tokens;
        if (!st && !have[i] && required)
            st = trace_read_fail(r, specs[i].name,
                                 (i == DS_LOOK_IDS || i == DS_LOOK_SCORES)
                                     ? "required dataset missing (lookahead_depth > 0)"
                                     : "required dataset missing");
        if (!st && i == DS_REQUEST_ID && n_tokens == 0)
            st = trace_read_fail(r, specs[i].name, "the trace holds no tokens");
    }
    m.has_token_ids = have[DS_TOKEN_ID];
    m.has_importance = have[DS_IMPORTANCE];
    for (int i = 0; i < DS_COUNT && !st; i++)
        if (have[i]) st = check_storage(r, &specs[i], ds[i]);
    o->meta = m;
    o->n_tokens = n_tokens;
    if (!st && have[DS_LOOK_IDS]) st = read_first_hits(r, o);
    if (!st && have[DS_LOOK_SCORES]) st = read_ranked(r, o);
    return st;
}

static moesim_status read_file(reader *r, trace **out) {
    opened_trace o = {0};
    trace *t = NULL;
    moesim_status st = trace_read_datasets_open(r, &o);
    if (!st) {
        t = trace_try_create(&o.meta, o.n_tokens);
        if (!t)
            st = moesim_fail(
                r->err, MOESIM_ENOMEM, "%s: cannot allocate %.1f MiB for %" PRIu64 " tokens",
                r->path, (double)trace_bytes_per_token(&o.meta) * (double)o.n_tokens / 1048576.0,
                o.n_tokens);
    }
    if (!st) {
        void *bufs[DS_COUNT] = {t->request_id, t->position,      t->phase,
                                t->token_id,   t->expert_ids,    t->gate_weights,
                                t->importance, t->lookahead_ids, t->lookahead_scores};
        for (int i = 0; i < DS_COUNT && !st; i++)
            if (o.have[i]) st = trace_read_dataset(r, &o.specs[i], o.ds[i], bufs[i]);
    }
    if (!st) {
        t->params_json = o.params_json;
        o.params_json = NULL;
        st = trace_finish(t, r->path, r->err);
    }
    if (!st && o.has_first_hits) { /* the reader that reads every row checks the attribute too */
        trace_first_hits rows = {0};
        trace_first_hits_add(&rows, &t->meta, t->expert_ids, t->lookahead_ids, t->n_tokens);
        st = trace_read_first_hits_check(r, &o, &rows);
    }
    if (!st && o.scores_ranked) st = trace_check_ranked(t, 0, r->path, r->err);
    trace_read_datasets_close(&o);
    if (st) {
        trace_destroy(t);
        return st;
    }
    *out = t;
    return MOESIM_OK;
}

/* Opens `path` for reading into *r (r->file open on success): the plain-file checks, the HDF5
 * signature, and HDF5's own truncation message made readable. */
moesim_status trace_read_file_open(const char *path, hid_t fapl, reader *r, moesim_error *err) {
    h5_quiet();
    struct stat sb;
    if (stat(path, &sb) != 0)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return moesim_fail(err, MOESIM_EINPUT, "%s: not a regular file", path);
    if (sb.st_size == 0)
        return moesim_fail(err, MOESIM_EINPUT, "%s: empty file (0 bytes), not an HDF5 trace", path);
    *r = (reader){
        .path = path, .file = H5I_INVALID_HID, .file_bytes = (uint64_t)sb.st_size, .err = err};
    htri_t is = H5Fis_hdf5(path);
    if (is == 0)
        return moesim_fail(err, MOESIM_EINPUT, "%s: not an HDF5 file (no HDF5 signature)", path);
    if (is < 0)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot open (%s)", path, h5_reason(r->why));
    r->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (r->file < 0) {
        /* HDF5 says "truncated file: eof = 2000, sblock->base_addr = 0, stored_eof = 25206" */
        const char *why = h5_reason(r->why), *stored = strstr(why, "stored_eof = ");
        unsigned long long eof, stored_eof;
        if (!strncmp(why, "truncated file: eof = ", 22) && stored &&
            sscanf(why + 22, "%llu", &eof) == 1 && sscanf(stored + 13, "%llu", &stored_eof) == 1)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: truncated HDF5 file: %llu of %llu bytes present", path, eof,
                               stored_eof);
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: not a readable HDF5 file (truncated or corrupt: %s)", path, why);
    }
    return MOESIM_OK;
}

moesim_status trace_read(const char *path, trace **out, moesim_error *err) {
    *out = NULL;
    reader r;
    moesim_status st = trace_read_file_open(path, H5P_DEFAULT, &r, err);
    if (st) return st;
    st = read_file(&r, out);
    if (H5Fclose(r.file) < 0 && !st) {
        trace_destroy(*out);
        *out = NULL;
        st = moesim_fail(err, MOESIM_EINPUT, "%s: corrupt HDF5 file (%s)", path, h5_reason(r.why));
    }
    H5Eclear2(H5E_DEFAULT);
    return st;
}
