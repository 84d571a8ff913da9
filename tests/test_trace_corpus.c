/* A corpus of malformed HDF5 trace files, made here from one valid trace by truncating it,
 * overwriting bytes, or editing attributes and datasets with the HDF5 library. Each must make
 * `moesim trace validate` print one line naming the file and the attribute or dataset (with
 * the index for bad values), write nothing on stdout, and exit with status 2; and trace_read
 * in this process must fail the same way without leaking (the ASan build checks both). */
#include <criterion/criterion.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/test_support.h"
#include "traces/trace.h"

/* The valid base: 3 requests, 30 tokens, L = 4, E = 16, k = 2, look-ahead D = 2, K' = 3,
 * importance and token ids. Request of token i: 0 for i < 2, then (i + 1) % 3. */
enum { N = 30, L = 4, E = 16, K = 2, D = 2, KP = 3 };

static trace *make_base(void) {
    trace_meta m = {0};
    snprintf(m.model, sizeof m.model, "corpus-moe");
    snprintf(m.source, sizeof m.source, "synth:1");
    snprintf(m.tool_version, sizeof m.tool_version, "0.1.0");
    m.n_layers = L;
    m.n_experts = E;
    m.top_k = K;
    m.gate_norm = GATE_SOFTMAX_TOPK;
    for (uint32_t l = 0; l < L; l++) m.model_layer[l] = l;
    m.lookahead_depth = D;
    m.lookahead_k = KP;
    m.has_importance = true;
    m.has_token_ids = true;
    trace *t = trace_create(&m, N);
    uint32_t pos[3] = {0};
    for (uint64_t i = 0; i < N; i++) {
        uint32_t r = i < 2 ? 0 : (uint32_t)((i + 1) % 3);
        t->request_id[i] = r;
        t->position[i] = pos[r]++;
        t->phase[i] = t->position[i] < 2 ? TRACE_PREFILL : TRACE_DECODE;
        t->token_id[i] = (int32_t)i;
        for (uint32_t l = 0; l < L; l++) {
            size_t x = trace_route_index(t, i, l);
            for (uint32_t j = 0; j < K; j++) {
                t->expert_ids[x + j] = (uint16_t)((i + l + j) % E);
                t->gate_weights[x + j] = 0.5f;
            }
            t->importance[i * L + l] = 1.0f;
            for (uint32_t d = 1; d <= D; d++)
                for (uint32_t c = 0; c < KP; c++) {
                    size_t y = trace_lookahead_index(t, i, l, d) + c;
                    t->lookahead_ids[y] = l + d < L ? (uint16_t)((l + d + c) % E) : TRACE_NO_EXPERT;
                    t->lookahead_scores[y] = l + d < L ? 0.5f : 0.0f;
                }
        }
    }
    moesim_error err = {0};
    cr_assert_eq(trace_finish(t, "corpus base", &err), MOESIM_OK, "%s", err.msg);
    return t;
}

static void write_base(const char *path) {
    trace *t = make_base();
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
}

/* ---- editing tools ----------------------------------------------------------------------- */

static hid_t open_rw(const char *path) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert_geq(f, 0, "cannot reopen %s", path);
    return f;
}

static void set_attr_str(const char *path, const char *name, const char *value) {
    hid_t f = open_rw(path);
    if (H5Aexists(f, name) > 0) H5Adelete(f, name);
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(H5Awrite(a, type, &value), 0);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
    H5Fclose(f);
}

static void set_attr_u32(const char *path, const char *name, uint32_t value) {
    hid_t f = open_rw(path);
    if (H5Aexists(f, name) > 0) H5Adelete(f, name);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(H5Awrite(a, H5T_NATIVE_UINT32, &value), 0);
    H5Aclose(a);
    H5Sclose(space);
    H5Fclose(f);
}

static void delete_attr(const char *path, const char *name) {
    hid_t f = open_rw(path);
    cr_assert_geq(H5Adelete(f, name), 0);
    H5Fclose(f);
}

static void delete_dataset(const char *path, const char *name) {
    hid_t f = open_rw(path);
    cr_assert_geq(H5Ldelete(f, name, H5P_DEFAULT), 0);
    H5Fclose(f);
}

/* Replaces dataset `name` by one of file type `type` and shape dims[rank], every element `fill`
 * (one value of the matching native type), or left unwritten when fill is NULL. Chunked so it
 * may claim any size. */
static void replace_dataset(const char *path, const char *name, hid_t type, int rank,
                            const hsize_t *dims, const void *fill) {
    hid_t f = open_rw(path);
    if (H5Lexists(f, name, H5P_DEFAULT) > 0) H5Ldelete(f, name, H5P_DEFAULT);
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hsize_t chunk[4];
    for (int i = 0; i < rank; i++) chunk[i] = dims[i] < 64 ? dims[i] : 64;
    H5Pset_chunk(dcpl, rank, chunk);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t d = H5Dcreate2(f, name, type, space, lcpl, dcpl, H5P_DEFAULT);
    cr_assert_geq(d, 0, "cannot create %s", name);
    if (fill) {
        size_t n = H5Tget_size(type);
        for (int i = 0; i < rank; i++) n *= dims[i];
        unsigned char *buf = malloc(n);
        size_t es = H5Tget_size(type);
        for (size_t i = 0; i < n; i++) buf[i] = ((const unsigned char *)fill)[i % es];
        hid_t native = H5Tget_native_type(type, H5T_DIR_DEFAULT); /* `fill` is in memory order */
        cr_assert_geq(H5Dwrite(d, native, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), 0);
        H5Tclose(native);
        free(buf);
    }
    H5Dclose(d);
    H5Pclose(lcpl);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
}

/* Writes one element of dataset `name` at coords[rank] (memory type `mtype`). */
static void poke(const char *path, const char *name, hid_t mtype, const hsize_t *coords,
                 const void *value) {
    hid_t f = open_rw(path);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    cr_assert_geq(d, 0, "cannot open %s", name);
    hid_t fs = H5Dget_space(d);
    int rank = H5Sget_simple_extent_ndims(fs);
    hsize_t one[4] = {1, 1, 1, 1};
    cr_assert_geq(H5Sselect_hyperslab(fs, H5S_SELECT_SET, coords, NULL, one, NULL), 0);
    hid_t ms = H5Screate_simple(rank, one, NULL);
    cr_assert_geq(H5Dwrite(d, mtype, ms, fs, H5P_DEFAULT, value), 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
    H5Fclose(f);
}

static void poke_u16(const char *path, const char *name, hsize_t a, hsize_t b, hsize_t c, hsize_t e,
                     uint16_t v) {
    hsize_t coords[4] = {a, b, c, e};
    poke(path, name, H5T_NATIVE_UINT16, coords, &v);
}
static void poke_u32(const char *path, const char *name, hsize_t a, uint32_t v) {
    hsize_t coords[1] = {a};
    poke(path, name, H5T_NATIVE_UINT32, coords, &v);
}
static void poke_f32(const char *path, const char *name, hsize_t a, hsize_t b, hsize_t c, float v) {
    hsize_t coords[3] = {a, b, c};
    poke(path, name, H5T_NATIVE_FLOAT, coords, &v);
}

static size_t file_size(const char *path) {
    FILE *fp = fopen(path, "rb");
    cr_assert_not_null(fp);
    fseek(fp, 0, SEEK_END);
    size_t n = (size_t)ftell(fp);
    fclose(fp);
    return n;
}

static void truncate_to(const char *path, size_t bytes) {
    cr_assert_eq(truncate(path, (off_t)bytes), 0);
}

/* ---- the corpus -------------------------------------------------------------------------- */

static void c_not_hdf5(const char *p) { test_write_file(p, "request,layer,expert\n0,0,3\n"); }
static void c_empty(const char *p) { test_write_bytes(p, "", 0); }
static void c_truncated_header(const char *p) {
    write_base(p);
    truncate_to(p, 96);
}
static void c_truncated_half(const char *p) {
    write_base(p);
    truncate_to(p, file_size(p) / 2);
}
static void c_truncated_last_byte(const char *p) {
    write_base(p);
    truncate_to(p, file_size(p) - 1);
}
static void c_wrong_format(const char *p) {
    write_base(p);
    set_attr_str(p, "format", "other-trace");
}
static void c_newer_version(const char *p) {
    write_base(p);
    set_attr_u32(p, "format_version", TRACE_FORMAT_VERSION + 1);
}
static void c_version_zero(const char *p) {
    write_base(p);
    set_attr_u32(p, "format_version", 0);
}
static void c_missing_attribute(const char *p) {
    write_base(p);
    delete_attr(p, "n_experts");
}
static void c_attribute_wrong_type(const char *p) {
    write_base(p);
    set_attr_str(p, "top_k", "8");
}
static void c_unknown_gate_rule(const char *p) {
    write_base(p);
    set_attr_str(p, "gate_normalization", "sigmoid");
}
static void c_top_k_above_experts(const char *p) {
    write_base(p);
    set_attr_u32(p, "top_k", E + 1);
}
static void c_missing_dataset(const char *p) {
    write_base(p);
    delete_dataset(p, "/routing/gate_weights");
}
static void c_missing_lookahead(const char *p) {
    write_base(p);
    delete_dataset(p, "/lookahead/scores");
}
static void c_lookahead_without_depth(const char *p) {
    write_base(p);
    set_attr_u32(p, "lookahead_depth", 0);
    set_attr_u32(p, "lookahead_k", 0);
}
static void c_wrong_dtype(const char *p) {
    write_base(p);
    hsize_t dims[3] = {N, L, K};
    float one = 1.0f;
    replace_dataset(p, "/routing/expert_ids", H5T_IEEE_F32LE, 3, dims, &one);
}
static void c_wrong_shape(const char *p) {
    write_base(p);
    hsize_t dims[3] = {N, L, K + 1};
    uint16_t zero = 0;
    replace_dataset(p, "/routing/expert_ids", H5T_STD_U16LE, 3, dims, &zero);
}
static void c_length_disagrees(const char *p) {
    write_base(p);
    hsize_t dims[1] = {N - 1};
    uint32_t zero = 0;
    replace_dataset(p, "/tokens/position", H5T_STD_U32LE, 1, dims, &zero);
}
static void c_layers_disagree(const char *p) {
    write_base(p);
    set_attr_u32(p, "n_layers", L + 1);
}
static void c_unwritten_dataset(const char *p) {
    write_base(p);
    hsize_t dims[3] = {N, L, K};
    replace_dataset(p, "/routing/gate_weights", H5T_IEEE_F32LE, 3, dims, NULL);
}
static void c_giant_claim(const char *p) {
    /* a header claiming 2^40 tokens must be refused before anything is allocated */
    write_base(p);
    hsize_t dims[1] = {1ull << 40};
    replace_dataset(p, "/tokens/request_id", H5T_STD_U32LE, 1, dims, NULL);
}
static void c_giant_consistent_claim(const char *p) {
    /* every dataset agrees on 2^36 tokens, none holds data: refused by the storage check
     * (without it the reader would ask for about 7 TB) */
    write_base(p);
    const hsize_t n = 1ull << 36, tok[1] = {n}, route[3] = {n, L, K}, per_layer[2] = {n, L},
                  look[4] = {n, L, D, KP};
    replace_dataset(p, "/tokens/request_id", H5T_STD_U32LE, 1, tok, NULL);
    replace_dataset(p, "/tokens/position", H5T_STD_U32LE, 1, tok, NULL);
    replace_dataset(p, "/tokens/phase", H5T_STD_U8LE, 1, tok, NULL);
    replace_dataset(p, "/tokens/token_id", H5T_STD_I32LE, 1, tok, NULL);
    replace_dataset(p, "/routing/expert_ids", H5T_STD_U16LE, 3, route, NULL);
    replace_dataset(p, "/routing/gate_weights", H5T_IEEE_F32LE, 3, route, NULL);
    replace_dataset(p, "/routing/importance", H5T_IEEE_F32LE, 2, per_layer, NULL);
    replace_dataset(p, "/lookahead/expert_ids", H5T_STD_U16LE, 4, look, NULL);
    replace_dataset(p, "/lookahead/scores", H5T_IEEE_F32LE, 4, look, NULL);
}
static void c_expert_out_of_range(const char *p) {
    write_base(p);
    poke_u16(p, "/routing/expert_ids", 12, 3, 1, 0, 130);
}
static void c_duplicate_expert(const char *p) {
    write_base(p);
    poke_u16(p, "/routing/expert_ids", 5, 1, 1, 0, (5 + 1 + 0) % E);
}
static void c_partly_unrecorded(const char *p) {
    write_base(p);
    poke_u16(p, "/routing/expert_ids", 9, 2, 0, 0, TRACE_NO_EXPERT);
}
static void c_nan_gate(const char *p) {
    write_base(p);
    poke_f32(p, "/routing/gate_weights", 7, 2, 1, NAN);
}
static void c_negative_gate(const char *p) {
    write_base(p);
    poke_f32(p, "/routing/gate_weights", 8, 0, 0, -0.25f);
}
static void c_nan_importance(const char *p) {
    write_base(p);
    hsize_t coords[2] = {4, 1};
    float v = NAN;
    poke(p, "/routing/importance", H5T_NATIVE_FLOAT, coords, &v);
}
static void c_request_not_dense(const char *p) {
    write_base(p);
    poke_u32(p, "/tokens/request_id", 3, 5);
}
static void c_request_id_past_tokens(const char *p) {
    write_base(p);
    poke_u32(p, "/tokens/request_id", 3, UINT32_MAX);
}
static void c_position_not_increasing(const char *p) {
    write_base(p);
    poke_u32(p, "/tokens/position", 8, 1);
}
static void c_prefill_after_decode(const char *p) {
    write_base(p);
    hsize_t coords[1] = {11};
    uint8_t v = TRACE_PREFILL;
    poke(p, "/tokens/phase", H5T_NATIVE_UINT8, coords, &v);
}
static void c_lookahead_padding_inside(const char *p) {
    write_base(p);
    poke_u16(p, "/lookahead/expert_ids", 6, 1, 1, 2, TRACE_NO_EXPERT);
}
static void c_lookahead_padding_missing(const char *p) {
    write_base(p);
    poke_u16(p, "/lookahead/expert_ids", 6, 3, 0, 0, 4);
}
static void c_model_layers_repeat(const char *p) {
    write_base(p);
    poke_u32(p, "/layers/model_layer", 2, 1);
}
static void c_corrupt_chunk(const char *p) {
    /* overwrite the compressed bytes of the first chunk of /routing/gate_weights */
    write_base(p);
    hid_t f = H5Fopen(p, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "/routing/gate_weights", H5P_DEFAULT);
    hsize_t offset[3] = {0, 0, 0};
    unsigned mask;
    haddr_t addr;
    hsize_t size;
    cr_assert_geq(H5Dget_chunk_info_by_coord(d, offset, &mask, &addr, &size), 0);
    H5Dclose(d);
    H5Fclose(f);
    FILE *fp = fopen(p, "r+b");
    cr_assert_not_null(fp);
    fseek(fp, (long)addr, SEEK_SET);
    for (hsize_t i = 0; i < size; i++) fputc(0xA5, fp);
    fclose(fp);
}

/* Stores bytes as chunk [0] of `name` with the filters in `mask` skipped (H5Dwrite_chunk). */
static void write_chunk0(const char *p, const char *name, uint32_t mask, const void *bytes,
                         size_t len) {
    hid_t f = open_rw(p);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hsize_t offset[4] = {0}; /* of any rank up to the look-ahead rows' */
    cr_assert_geq(H5Dwrite_chunk(d, H5P_DEFAULT, mask, offset, len, bytes), 0);
    H5Dclose(d);
    H5Fclose(f);
}
static void c_unfiltered_chunk_too_short(const char *p) {
    /* a chunk of 30 phases stored as 1 byte with shuffle and deflate skipped: HDF5 would read
     * 29 bytes past it (fuzz_trace_h5) */
    write_base(p);
    uint8_t one = TRACE_PREFILL;
    write_chunk0(p, "/tokens/phase", 3, &one, 1);
}

typedef struct corpus_case {
    const char *file;               /* name under the test tmp folder */
    void (*make)(const char *path); /* writes the malformed file */
    const char *fragment;           /* what must follow "PATH: " in the message */
} corpus_case;

static const corpus_case corpus[] = {
    {"not-hdf5.h5", c_not_hdf5, "not an HDF5 file (no HDF5 signature)"},
    {"empty.h5", c_empty, "empty file (0 bytes), not an HDF5 trace"},
    {"truncated-header.h5", c_truncated_header, "truncated HDF5 file: 96 of "},
    {"truncated-half.h5", c_truncated_half, "truncated HDF5 file: "},
    {"truncated-last-byte.h5", c_truncated_last_byte, "truncated HDF5 file: "},
    {"wrong-format.h5", c_wrong_format,
     "format: expected \"moesim-trace\", got \"other-trace\" (not a moesim trace)"},
    {"newer-version.h5", c_newer_version,
     "format_version: version 2 is newer than this moesim reads (1): upgrade moesim"},
    {"version-zero.h5", c_version_zero, "format_version: expected 1..1, got 0"},
    {"missing-attribute.h5", c_missing_attribute, "n_experts: required attribute missing"},
    {"attribute-wrong-type.h5", c_attribute_wrong_type,
     "top_k: expected one unsigned integer, got string"},
    {"unknown-gate-rule.h5", c_unknown_gate_rule,
     "gate_normalization: expected \"topk\" or \"all\", got \"sigmoid\""},
    {"top-k-above-experts.h5", c_top_k_above_experts,
     "top_k: expected 1..16 (n_experts 16, at most 64), got 17"},
    {"missing-dataset.h5", c_missing_dataset, "/routing/gate_weights: required dataset missing"},
    {"missing-lookahead.h5", c_missing_lookahead,
     "/lookahead/scores: required dataset missing (lookahead_depth > 0)"},
    {"lookahead-without-depth.h5", c_lookahead_without_depth,
     "/lookahead/expert_ids: present but lookahead_depth is 0"},
    {"wrong-dtype.h5", c_wrong_dtype, "/routing/expert_ids: expected dtype uint16, got float32"},
    {"wrong-shape.h5", c_wrong_shape,
     "/routing/expert_ids: expected shape [N][L][k] = [30][4][2], got [30][4][3]"},
    {"length-disagrees.h5", c_length_disagrees,
     "/tokens/position: expected shape [N] = [30], got [29]"},
    {"layers-disagree.h5", c_layers_disagree,
     "/layers/model_layer: expected shape [L] = [5], got [4]"},
    {"unwritten-dataset.h5", c_unwritten_dataset,
     "/routing/gate_weights: 0 bytes stored cannot hold its 960 bytes of data (truncated or not "
     "written)"},
    {"giant-claim.h5", c_giant_claim,
     "/tokens/position: expected shape [N] = [1099511627776], got [30]"},
    {"giant-consistent-claim.h5", c_giant_consistent_claim,
     "/tokens/request_id: 0 bytes stored cannot hold its 274877906944 bytes of data (truncated "
     "or not written)"},
    {"expert-out-of-range.h5", c_expert_out_of_range,
     "/routing/expert_ids[12][3][1]: expert id 130 >= 16 experts"},
    {"duplicate-expert.h5", c_duplicate_expert,
     "/routing/expert_ids[5][1][1]: expert 6 appears twice in one top-k (also at [0])"},
    {"partly-unrecorded.h5", c_partly_unrecorded,
     "/routing/expert_ids[9][2]: row partly unrecorded: slot 0 is 65535 (no expert) but slot 1 "
     "is expert 12"},
    {"nan-gate.h5", c_nan_gate, "/routing/gate_weights[7][2][1]: gate weight nan is not finite"},
    {"negative-gate.h5", c_negative_gate,
     "/routing/gate_weights[8][0][0]: gate weight -0.25 outside [0, 1]"},
    {"nan-importance.h5", c_nan_importance,
     "/routing/importance[4][1]: importance nan is not finite"},
    {"request-not-dense.h5", c_request_not_dense,
     "/tokens/request_id[3]: request id 5 is not dense: expected at most 1"},
    {"request-id-past-tokens.h5", c_request_id_past_tokens,
     "/tokens/request_id[3]: request id 4294967295 >= 30 (the token count; requests are "
     "numbered 0, 1, 2, ... by first appearance)"},
    {"position-not-increasing.h5", c_position_not_increasing,
     "/tokens/position[8]: position 1 of request 0 does not increase (previous 3)"},
    {"prefill-after-decode.h5", c_prefill_after_decode,
     "/tokens/phase[11]: prefill token after a decode token in request 0"},
    {"lookahead-padding-inside.h5", c_lookahead_padding_inside,
     "/lookahead/expert_ids[6][1][1][2]: padding 65535 where layer 1 + distance 2 < 4 layers"},
    {"lookahead-padding-missing.h5", c_lookahead_padding_missing,
     "/lookahead/expert_ids[6][3][0][0]: expected padding 65535 (layer 3 + distance 1 >= 4 "
     "layers), got 4"},
    {"model-layers-repeat.h5", c_model_layers_repeat,
     "/layers/model_layer[2]: layer 1 does not follow layer 1 (expected increasing)"},
    {"corrupt-chunk.h5", c_corrupt_chunk,
     "/routing/gate_weights: cannot read its data (truncated or corrupt: chunk at [0]: deflate "
     "data do not inflate)"},
    {"unfiltered-chunk-too-short.h5", c_unfiltered_chunk_too_short,
     "/tokens/phase: cannot read its data (truncated or corrupt: chunk at [0]: stored unfiltered "
     "but shorter than a chunk)"},
};

TestSuite(trace_corpus, .init = NULL);

static void quiet_hdf5(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

Test(trace_corpus, the_base_trace_is_valid) {
    const char *path = test_tmp_path("corpus-base.h5");
    write_base(path);
    char out[512] = "", err[512] = "";
    int rc = test_run_moesim(out, sizeof out, err, sizeof err, "trace", "validate", path, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    char want[1024];
    snprintf(want, sizeof want, "%s: ok (30 tokens, 3 requests)\n", path);
    cr_assert_str_eq(out, want);
}

Test(trace_corpus, every_malformed_file_gives_one_line_naming_file_and_field_and_exit_2) {
    quiet_hdf5();
    cr_assert_geq(sizeof corpus / sizeof corpus[0], 14);
    for (size_t c = 0; c < sizeof corpus / sizeof corpus[0]; c++) {
        char path[1024], want[1024];
        snprintf(path, sizeof path, "%s", test_tmp_path(corpus[c].file));
        corpus[c].make(path);
        snprintf(want, sizeof want, "moesim: %s: %s", path, corpus[c].fragment);

        char out[512] = "", err[1024] = "";
        int rc = test_run_moesim(out, sizeof out, err, sizeof err, "trace", "validate", path, NULL);
        cr_expect_eq(rc, 2, "%s: exit status %d, stderr '%s'", corpus[c].file, rc, err);
        cr_expect_str_empty(out, "%s: stdout '%s'", corpus[c].file, out);
        cr_expect(strncmp(err, want, strlen(want)) == 0, "%s: stderr '%s' does not start '%s'",
                  corpus[c].file, err, want);
        char *nl = strchr(err, '\n');
        cr_expect(nl && nl[1] == '\0', "%s: not exactly one line: '%s'", corpus[c].file, err);

        /* the same through the library, in this process (ASan sees leaks here) */
        trace *t = (trace *)1;
        moesim_error e = {0};
        cr_expect_neq(trace_read(path, &t, &e), MOESIM_OK, "%s: read succeeded", corpus[c].file);
        cr_expect_null(t, "%s: a trace came back", corpus[c].file);
        cr_expect(strncmp(e.msg, want + strlen("moesim: "), strlen(want) - strlen("moesim: ")) == 0,
                  "%s: library message '%s'", corpus[c].file, e.msg);
    }
}

Test(trace_corpus, info_on_a_malformed_file_fails_the_same_way) {
    quiet_hdf5();
    const char *path = test_tmp_path("info-nan-gate.h5");
    c_nan_gate(path);
    char out[512] = "", err[1024] = "";
    int rc =
        test_run_moesim(out, sizeof out, err, sizeof err, "trace", "info", "--json", path, NULL);
    cr_assert_eq(rc, 2);
    cr_assert_str_empty(out);
    cr_assert(strstr(err, "/routing/gate_weights[7][2][1]: gate weight nan is not finite"), "%s",
              err);
}

Test(trace_corpus, a_missing_file_is_named_with_the_system_reason) {
    char out[256] = "", err[1024] = "";
    int rc = test_run_moesim(out, sizeof out, err, sizeof err, "trace", "validate",
                             "/nonexistent/trace.h5", NULL);
    cr_assert_eq(rc, 2);
    cr_assert_str_eq(err,
                     "moesim: /nonexistent/trace.h5: cannot open: No such file or directory\n");
}

/* HDF5 stores a chunk without its optional filters when they fail (deflate of incompressible
 * data): a whole chunk stored that way reads as the same trace. */
Test(trace_corpus, a_whole_chunk_stored_with_deflate_skipped_reads_back) {
    quiet_hdf5();
    const char *path = test_tmp_path("deflate-skipped.h5");
    write_base(path);
    trace *base = make_base();
    /* one-byte phases: shuffle leaves them as they are */
    write_chunk0(path, "/tokens/phase", 2, base->phase, N);
    trace *t = NULL;
    moesim_error e = {0};
    cr_assert_eq(trace_read(path, &t, &e), MOESIM_OK, "%s", e.msg);
    cr_assert_arr_eq(t->phase, base->phase, N);
    trace_destroy(t);
    trace_destroy(base);
}

/* The streaming reader (the simulator's) reads the routing rows during the run, in chunks of
 * its own and through HDF5 from the first chunk stored otherwise: a whole chunk stored with
 * both filters skipped reads back there too, and a short one is refused as trace_read refuses
 * it, when the run reaches the dataset (trace_stream_check_rest reports it). */
static moesim_status stream_expert_ids(const char *path, uint16_t *ids, moesim_error *err) {
    trace_stream *s = NULL;
    trace_stream_options on_read = {.check_rows_on_read = true};
    moesim_status st = trace_stream_open_with(path, &on_read, &s, err);
    for (uint64_t i = 0; !st && i < N; i++) {
        uint64_t local;
        const trace *block = trace_stream_row(s, i, &local);
        memcpy(ids + i * L * K, trace_experts(block, local, 0), sizeof *ids * L * K);
    }
    if (!st) st = trace_stream_check_rest(s, err);
    trace_stream_close(s);
    return st;
}

Test(trace_corpus, the_stream_reads_a_whole_unfiltered_chunk_and_refuses_a_short_one) {
    quiet_hdf5();
    const char *path = test_tmp_path("stream-unfiltered.h5");
    write_base(path);
    trace *base = make_base();
    write_chunk0(path, "/routing/expert_ids", 3, base->expert_ids,
                 sizeof *base->expert_ids * N * L * K);
    uint16_t ids[N * L * K];
    moesim_error err = {0};
    cr_assert_eq(stream_expert_ids(path, ids, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_arr_eq(ids, base->expert_ids, sizeof ids);

    uint8_t one = 0;
    write_chunk0(path, "/routing/expert_ids", 3, &one, 1);
    cr_assert_neq(stream_expert_ids(path, ids, &err), MOESIM_OK);
    char want[1024];
    snprintf(want, sizeof want,
             "%s: /routing/expert_ids: cannot read its data (truncated or corrupt: chunk at [0]: "
             "stored unfiltered but shorter than a chunk)",
             path);
    cr_assert_str_eq(err.msg, want);
    trace_destroy(base);
}

/* h5py and pandas write fixed-length byte strings (np.bytes_) and signed 64-bit integers:
 * a file made that way by hand, with big-endian data, must read as the same trace. */
Test(trace_corpus, fixed_strings_signed_attributes_and_big_endian_data_are_accepted) {
    quiet_hdf5();
    const char *path = test_tmp_path("other-tool.h5");
    write_base(path);
    hid_t f = open_rw(path);
    H5Adelete(f, "format");
    hid_t fixed = H5Tcopy(H5T_C_S1);
    H5Tset_size(fixed, strlen(TRACE_FORMAT_NAME));
    H5Tset_strpad(fixed, H5T_STR_NULLPAD);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "format", fixed, space, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(H5Awrite(a, fixed, TRACE_FORMAT_NAME), 0);
    H5Aclose(a);
    H5Adelete(f, "n_experts");
    int64_t e = E;
    a = H5Acreate2(f, "n_experts", H5T_STD_I64BE, space, H5P_DEFAULT, H5P_DEFAULT);
    cr_assert_geq(H5Awrite(a, H5T_NATIVE_INT64, &e), 0);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(fixed);
    H5Fclose(f);
    hsize_t dims[3] = {N, L, K};
    float half = 0.5f;
    replace_dataset(path, "/routing/gate_weights", H5T_IEEE_F32BE, 3, dims, &half);

    trace *t = NULL, *base = make_base();
    moesim_error err = {0};
    cr_assert_eq(trace_read(path, &t, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(t->meta.n_experts, E);
    cr_assert_eq(t->n_tokens, N);
    cr_assert_arr_eq(t->gate_weights, base->gate_weights, sizeof(float) * N * L * K);
    cr_assert_arr_eq(t->expert_ids, base->expert_ids, sizeof(uint16_t) * N * L * K);
    trace_destroy(t);
    trace_destroy(base);
}
