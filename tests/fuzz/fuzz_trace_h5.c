/* libFuzzer harness for the trace reader (traces/trace_read.c, traces/h5_chunks.c), structure
 * aware: mutating the bytes of an HDF5 file mostly breaks libhdf5's own checksums, so the
 * reader's checks are rarely reached (fuzz_trace does that). Here the input is an edit program
 * applied through the HDF5 API to a valid trace that trace_write made; the edited, well-formed
 * HDF5 file is then handed to trace_read. Edits
 * reach every attribute and dataset the reader looks at:
 *   - set a root attribute to another integer or float type, an array, or another string (fixed
 *     or variable length, any bytes), or delete it;
 *   - delete a dataset, replace it by one of another type, rank, shape, layout (contiguous,
 *     compact, chunked with or without shuffle/deflate) and content, or by a group;
 *   - overwrite one element of a dataset with raw bytes (ids out of range, NaN gates, ...);
 *   - overwrite one stored chunk with raw bytes (corrupt deflate streams, wrong sizes, a filter
 *     mask), which the reader inflates itself.
 * Must hold: one error line, or a trace that passes trace_check. No crash, leak, hang or
 * out-of-bounds read in our code. Program format: see next_op below; the empty program reads the
 * base trace unchanged. Build and run: make fuzz (see tests/fuzz/README.md). */
#include <hdf5.h>
#include <stdlib.h>

#include "common/model.h"
#include "common/paths.h"
#include "fuzz_support.h"
#include "traces/trace.h"

#define MAX_EDITS 16 /* per program */

static void *base_image; /* the valid trace file every program starts from */
static size_t base_bytes;

/* ---- the base trace ------------------------------------------------------------------------ */

/* Mixtral cut to 2 layers, 2 requests of 3 tokens, importance, token ids and a look-ahead of
 * depth 1 with 2 candidates: every optional part present, so every dataset can be edited. */
static trace *base_trace(void) {
    static const char *const sets[] = {"layers.n_layers=2"};
    char path[4096];
    moesim_error err = {0};
    model_geometry m;
    MOESIM_ASSERT(moesim_config_path("models", "mixtral-8x7b", path, sizeof path, &err) == 0);
    MOESIM_ASSERT(model_load_with_sets(path, sets, 1, &m, &err) == MOESIM_OK);
    trace_meta meta = {0};
    trace_meta_from_model(&meta, &m);
    snprintf(meta.source, sizeof meta.source, "fuzz");
    snprintf(meta.tool_version, sizeof meta.tool_version, "%s", MOESIM_VERSION);
    meta.lookahead_depth = 1;
    meta.lookahead_k = 2;
    meta.has_importance = meta.has_token_ids = true;
    trace *t = trace_create(&meta, 6);
    for (uint32_t i = 0; i < 6; i++) {
        t->request_id[i] = i / 3;
        t->position[i] = i % 3;
        t->phase[i] = i % 3 == 2 ? TRACE_DECODE : TRACE_PREFILL;
        t->token_id[i] = (int32_t)(100 + i);
        for (uint32_t l = 0; l < 2; l++) {
            size_t r = trace_route_index(t, i, l);
            t->expert_ids[r] = (uint16_t)((i + l) % 8);
            t->expert_ids[r + 1] = (uint16_t)((i + l + 3) % 8);
            t->gate_weights[r] = 0.625f;
            t->gate_weights[r + 1] = 0.375f;
            t->importance[i * 2 + l] = 0.5f * (float)(l + 1);
            size_t a = trace_lookahead_index(t, i, l, 1);
            for (uint32_t c = 0; c < 2; c++) {
                t->lookahead_ids[a + c] = l == 0 ? (uint16_t)((i + c) % 8) : TRACE_NO_EXPERT;
                t->lookahead_scores[a + c] = l == 0 ? 0.25f : 0.0f;
            }
        }
    }
    MOESIM_ASSERT(trace_finish(t, "fuzz base trace", &err) == MOESIM_OK);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    const char *path = fuzz_temp_path("base.h5");
    trace *t = base_trace();
    moesim_error err = {0};
    if (trace_write(t, path, &err) != MOESIM_OK) fprintf(stderr, "%s\n", err.msg);
    trace_destroy(t);
    FILE *fp = fopen(path, "rb");
    MOESIM_ASSERT(fp && fseek(fp, 0, SEEK_END) == 0);
    base_bytes = (size_t)ftell(fp);
    base_image = malloc(base_bytes);
    MOESIM_ASSERT(base_image && fseek(fp, 0, SEEK_SET) == 0);
    MOESIM_ASSERT(fread(base_image, 1, base_bytes, fp) == base_bytes);
    fclose(fp);
    remove(path);
    return 0;
}

/* ---- reading the program ------------------------------------------------------------------- */

typedef struct program {
    const uint8_t *p;
    size_t n;
} program;

static uint8_t take_u8(program *g) {
    if (!g->n) return 0;
    g->n--;
    return *g->p++;
}
static uint64_t take_u64(program *g, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)take_u8(g) << (8 * i);
    return v;
}
/* Up to `max` raw bytes: a length byte, then that many bytes (fewer when the program ends). */
static size_t take_bytes(program *g, size_t max, const uint8_t **out) {
    size_t len = take_u8(g) % (max + 1);
    if (len > g->n) len = g->n;
    *out = g->p;
    g->p += len;
    g->n -= len;
    return len;
}

static const char *const attr_names[] = {
    "format",          "format_version", "model",       "source",
    "tool_version",    "n_layers",       "n_experts",   "top_k",
    "n_shared_experts", "lookahead_depth", "lookahead_k", "model_config_hash",
    "gate_normalization", "params_json"};
static const char *const dataset_names[] = {
    "/layers/model_layer",  "/tokens/request_id",    "/tokens/position",
    "/tokens/phase",        "/tokens/token_id",      "/routing/expert_ids",
    "/routing/gate_weights", "/routing/importance",   "/lookahead/expert_ids",
    "/lookahead/scores"};
/* strings the reader compares against, so that edits can keep or break them on purpose */
static const char *const words[] = {"moesim-trace", "topk", "all", "mixtral-8x7b", "{}", ""};

static hid_t number_type(uint8_t pick) {
    const hid_t types[] = {H5T_NATIVE_UINT8,  H5T_NATIVE_INT8,   H5T_NATIVE_UINT16,
                           H5T_NATIVE_INT16,  H5T_NATIVE_UINT32, H5T_NATIVE_INT32,
                           H5T_NATIVE_UINT64, H5T_NATIVE_INT64,  H5T_NATIVE_FLOAT,
                           H5T_NATIVE_DOUBLE, H5T_STD_U32BE,     H5T_IEEE_F32BE};
    return types[pick % MOESIM_ARRAY_LEN(types)];
}

/* A string type: fixed length `len` (at least 1) or variable. */
static hid_t string_type(bool variable, size_t len) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, variable ? H5T_VARIABLE : (len ? len : 1));
    return t;
}

/* ---- the edits ----------------------------------------------------------------------------- */

static void attr_replace(hid_t file, const char *name, hid_t type, hid_t space, const void *buf) {
    if (H5Aexists(file, name) > 0) H5Adelete(file, name);
    hid_t a = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        H5Awrite(a, type, buf);
        H5Aclose(a);
    }
}

static void edit_attr_number(hid_t file, program *g) {
    const char *name = attr_names[take_u8(g) % MOESIM_ARRAY_LEN(attr_names)];
    hid_t type = number_type(take_u8(g));
    hsize_t n = take_u8(g) % 4; /* 0: scalar, else a 1-D array of n */
    hid_t space = n ? H5Screate_simple(1, &n, NULL) : H5Screate(H5S_SCALAR);
    uint64_t v[3] = {0};
    for (hsize_t i = 0; i < (n ? n : 1); i++) v[i] = take_u64(g, 8);
    /* values of the type's size: write through a memory type of the same class and size */
    hid_t mtype = H5Tget_native_type(type, H5T_DIR_DEFAULT);
    unsigned char buf[3 * 8];
    size_t size = H5Tget_size(mtype);
    for (hsize_t i = 0; i < (n ? n : 1); i++) memcpy(buf + i * size, &v[i], size);
    if (H5Aexists(file, name) > 0) H5Adelete(file, name);
    hid_t a = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        H5Awrite(a, mtype, buf);
        H5Aclose(a);
    }
    H5Tclose(mtype);
    H5Sclose(space);
}

static void edit_attr_string(hid_t file, program *g) {
    const char *name = attr_names[take_u8(g) % MOESIM_ARRAY_LEN(attr_names)];
    uint8_t how = take_u8(g);
    char text[512];
    size_t len;
    if (how & 1) {
        const char *w = words[take_u8(g) % MOESIM_ARRAY_LEN(words)];
        len = strlen(w);
        memcpy(text, w, len);
    } else {
        const uint8_t *b;
        len = take_bytes(g, 255, &b);
        memcpy(text, b, len);
    }
    if (how & 4) { /* long: repeat it (names must not overflow the reader's buffers) */
        size_t rep = len ? len : 1;
        if (!len) text[0] = 'x';
        for (len = rep; len + rep < sizeof text; len += rep) memcpy(text + len, text, rep);
    }
    text[len] = '\0';
    bool variable = how & 2;
    hid_t type = string_type(variable, len);
    hsize_t two = 2;
    hid_t space = (how & 8) ? H5Screate_simple(1, &two, NULL) : H5Screate(H5S_SCALAR);
    const char *ptrs[2] = {text, text};
    char fixed[2 * sizeof text];
    memcpy(fixed, text, len ? len : 1);
    memcpy(fixed + (len ? len : 1), text, len ? len : 1);
    attr_replace(file, name, type, space, variable ? (const void *)ptrs : (const void *)fixed);
    H5Sclose(space);
    H5Tclose(type);
}

static void edit_attr_delete(hid_t file, program *g) {
    const char *name = attr_names[take_u8(g) % MOESIM_ARRAY_LEN(attr_names)];
    if (H5Aexists(file, name) > 0) H5Adelete(file, name);
}

static void edit_dataset_delete(hid_t file, program *g) {
    const char *name = dataset_names[take_u8(g) % MOESIM_ARRAY_LEN(dataset_names)];
    if (H5Lexists(file, name, H5P_DEFAULT) > 0) H5Ldelete(file, name, H5P_DEFAULT);
}

/* Replaces a dataset by a new one: type, rank 0..4, dims 0..7 (dim 0 up to 63), layout and
 * filters from the program, content from the program's bytes (cycled). */
static void edit_dataset_replace(hid_t file, program *g) {
    const char *name = dataset_names[take_u8(g) % MOESIM_ARRAY_LEN(dataset_names)];
    hid_t type = number_type(take_u8(g));
    int rank = take_u8(g) % 5;
    hsize_t dims[4], n = 1;
    for (int i = 0; i < rank; i++) {
        dims[i] = take_u8(g) % (i == 0 ? 64 : 8);
        n *= dims[i];
    }
    uint8_t layout = take_u8(g);
    const uint8_t *fill;
    size_t fill_len = take_bytes(g, 64, &fill);
    if (H5Lexists(file, name, H5P_DEFAULT) > 0) H5Ldelete(file, name, H5P_DEFAULT);
    hid_t space = rank ? H5Screate_simple(rank, dims, NULL) : H5Screate(H5S_SCALAR);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    if (rank && n && (layout & 3) == 1) {
        hsize_t chunk[4];
        for (int i = 0; i < rank; i++) chunk[i] = 1 + (layout >> 2) % dims[i];
        H5Pset_chunk(dcpl, rank, chunk);
        if (layout & 16) H5Pset_shuffle(dcpl);
        if (layout & 32) H5Pset_deflate(dcpl, 1);
    } else if ((layout & 3) == 2) {
        H5Pset_layout(dcpl, H5D_COMPACT);
    }
    hid_t d = H5Dcreate2(file, name, type, space, lcpl, dcpl, H5P_DEFAULT);
    if (d >= 0 && n && (layout & 64)) { /* else unwritten: fill values, or no storage at all */
        size_t bytes = n * H5Tget_size(type);
        unsigned char *buf = malloc(bytes);
        for (size_t i = 0; i < bytes; i++) buf[i] = fill_len ? fill[i % fill_len] : 0;
        H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
        free(buf);
    }
    if (d >= 0) H5Dclose(d);
    H5Pclose(lcpl);
    H5Pclose(dcpl);
    H5Sclose(space);
}

static void edit_dataset_to_group(hid_t file, program *g) {
    const char *name = dataset_names[take_u8(g) % MOESIM_ARRAY_LEN(dataset_names)];
    if (H5Lexists(file, name, H5P_DEFAULT) > 0) H5Ldelete(file, name, H5P_DEFAULT);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t grp = H5Gcreate2(file, name, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (grp >= 0) H5Gclose(grp);
    H5Pclose(lcpl);
}

/* Overwrites element i of a dataset with raw bytes of its own type. */
static void edit_element(hid_t file, program *g) {
    const char *name = dataset_names[take_u8(g) % MOESIM_ARRAY_LEN(dataset_names)];
    uint64_t at = take_u64(g, 2);
    uint64_t raw = take_u64(g, 8);
    if (H5Lexists(file, name, H5P_DEFAULT) <= 0) return;
    hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
    if (d < 0) return;
    hid_t space = H5Dget_space(d), type = H5Dget_type(d);
    hssize_t n = H5Sget_simple_extent_npoints(space);
    int rank = H5Sget_simple_extent_ndims(space);
    size_t size = H5Tget_size(type);
    if (n > 0 && rank >= 1 && rank <= 4 && size <= 8) {
        hsize_t dims[4], coord[4];
        H5Sget_simple_extent_dims(space, dims, NULL);
        uint64_t flat = at % (uint64_t)n;
        for (int i = rank; i-- > 0;) {
            coord[i] = flat % dims[i];
            flat /= dims[i];
        }
        hsize_t one = 1;
        hid_t mspace = H5Screate_simple(1, &one, NULL);
        H5Sselect_elements(space, H5S_SELECT_SET, 1, coord);
        H5Dwrite(d, type, mspace, space, H5P_DEFAULT, &raw);
        H5Sclose(mspace);
    }
    H5Tclose(type);
    H5Sclose(space);
    H5Dclose(d);
}

/* Overwrites one stored chunk with raw bytes and a filter mask (skipped filters). Applied after
 * every other edit of the program (see chunk_edits): HDF5 itself reads past a short unfiltered
 * chunk when a later edit rewrites an element of it, and that is the file, not the reader. */
typedef struct chunk_edit {
    const char *name;
    uint8_t which, mask;
    const uint8_t *raw;
    size_t len;
} chunk_edit;
static chunk_edit chunk_edits[MAX_EDITS];
static int n_chunk_edits;

static void edit_chunk(hid_t file, program *g) {
    (void)file;
    chunk_edit *c = &chunk_edits[n_chunk_edits++];
    c->name = dataset_names[take_u8(g) % MOESIM_ARRAY_LEN(dataset_names)];
    c->which = take_u8(g);
    c->mask = take_u8(g);
    c->len = take_bytes(g, 255, &c->raw);
}

static void apply_chunk_edit(hid_t file, const chunk_edit *c) {
    if (H5Lexists(file, c->name, H5P_DEFAULT) <= 0) return;
    hid_t d = H5Dopen2(file, c->name, H5P_DEFAULT);
    if (d < 0) return;
    hid_t dcpl = H5Dget_create_plist(d), space = H5Dget_space(d);
    hsize_t chunk[4], dims[4];
    int rank = H5Sget_simple_extent_ndims(space);
    if (H5Pget_layout(dcpl) == H5D_CHUNKED && rank >= 1 && rank <= 4 && c->len > 0 &&
        H5Pget_chunk(dcpl, 4, chunk) == rank) {
        H5Sget_simple_extent_dims(space, dims, NULL);
        hsize_t n_chunks = (dims[0] + chunk[0] - 1) / chunk[0], offset[4] = {0, 0, 0, 0};
        if (n_chunks) {
            offset[0] = (c->which % n_chunks) * chunk[0];
            H5Dwrite_chunk(d, H5P_DEFAULT, c->mask & 3, offset, c->len, c->raw);
        }
    }
    H5Sclose(space);
    H5Pclose(dcpl);
    H5Dclose(d);
}

typedef void (*edit_fn)(hid_t file, program *g);
static const edit_fn edits[] = {edit_attr_number,     edit_attr_string,      edit_attr_delete,
                                edit_dataset_delete,  edit_dataset_replace,  edit_dataset_to_group,
                                edit_element,         edit_chunk};

/* ---- one execution ------------------------------------------------------------------------- */

/* Writes the base trace to a scratch file, applies the program to it there, and returns the
 * file's path (a real name: HDF5 resolves the names of files it opens read-write). */
static const char *edited_file(const uint8_t *data, size_t size) {
    const char *path = fuzz_temp_path("edited.h5");
    FILE *fp = fopen(path, "wb");
    MOESIM_ASSERT(fp && fwrite(base_image, 1, base_bytes, fp) == base_bytes && fclose(fp) == 0);
    hid_t file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    MOESIM_ASSERT(file >= 0);
    program g = {data, size};
    n_chunk_edits = 0;
    for (int i = 0; i < MAX_EDITS && g.n; i++)
        edits[take_u8(&g) % MOESIM_ARRAY_LEN(edits)](file, &g);
    for (int i = 0; i < n_chunk_edits; i++) apply_chunk_edit(file, &chunk_edits[i]);
    MOESIM_ASSERT(H5Fget_obj_count(file, H5F_OBJ_ALL) == 1); /* the edits closed what they opened */
    MOESIM_ASSERT(H5Fclose(file) >= 0);
    H5Eclear2(H5E_DEFAULT);
    return path;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = edited_file(data, size);
    trace *t = NULL;
    moesim_error err = {0};
    long long ids = fuzz_h5_open_ids();
    moesim_status st = trace_read(path, &t, &err);
    /* (from the second read on: the first one registers libhdf5's own types) */
    static bool warm;
    if (warm && fuzz_h5_open_ids() != ids)
        fprintf(stderr, "trace_read left %lld HDF5 ids open\n", fuzz_h5_open_ids() - ids);
    MOESIM_ASSERT(!warm || fuzz_h5_open_ids() == ids);
    warm = true;
    fuzz_check_error(st, &err);
    MOESIM_ASSERT((st == MOESIM_OK) == (t != NULL));
    if (size == 0 && st) fprintf(stderr, "the base trace does not read: %s\n", err.msg);
    if (size == 0) MOESIM_ASSERT(st == MOESIM_OK); /* the base trace itself reads */
    if (t) MOESIM_ASSERT(trace_check(t, "fuzz trace", &err) == MOESIM_OK);
    trace_destroy(t);
    return 0;
}
