/* Dense NumPy arrays for `moesim trace import`: ids and gate weights of shape
 * [tokens][layers][top_k], as research code dumps them (np.save / np.savez /
 * np.savez_compressed), one token at a time into import_place (traces/import_internal.h).
 *
 * Inputs (traces/FORMAT.md, "Dense arrays"):
 *   --format npy IDS.npy --weights W.npy [--requests SIDE.csv]
 *   --format npy LOGITS.npy [--requests SIDE.csv]: router logits [tokens][layers][experts]
 *   --format npz ROUTES.npz [--requests SIDE.csv]: members topk_ids (or routed_experts) with
 *     topk_weights, or router_logits; optionally request_id [tokens] or seq_lens [requests],
 *     prompt_lens [requests].
 * Ids without weights (SGLang's routed_experts, Megatron's routing indices) import with
 * --uniform-gates (gate 1/k each). Router logits (HF output_router_logits, stacked per token)
 * give the top-k and the gates by the model's rule: softmax over the k chosen logits, or over
 * all E with the top-k kept.
 * Request boundaries come from the request_id column (any integer per token; requests
 * numbered by first appearance), seq_lens (consecutive blocks), the side file (consecutive
 * blocks, named), or else the whole array is one request. A request's positions count its
 * tokens in array order from 0. Prompt lengths (prompt_lens, or the side file's
 * prompt_tokens) give the phases.
 *
 * The .npy reader is traces/npy.c, the zip reader traces/zip.c. Arrays are streamed, never
 * loaded whole (bar seq_lens and prompt_lens), so memory follows the trace, not the files. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/import_internal.h"
#include "traces/npy.h"
#include "traces/text_scan.h"
#include "traces/zip.h"

#define SIDE_NAME_MAX IMPORT_REQUEST_PART_MAX

/* ---- the array source ---------------------------------------------------------------------- */

typedef struct side_request {
    char name[SIDE_NAME_MAX];
    size_t name_len;
    uint64_t tokens;
    int64_t prompt; /* -1: not given */
} side_request;

static int side_name_cmp(const void *a, const void *b) {
    const side_request *p = *(const side_request *const *)a, *q = *(const side_request *const *)b;
    size_t n = p->name_len < q->name_len ? p->name_len : q->name_len;
    int c = memcmp(p->name, q->name, n);
    if (c) return c;
    return p->name_len < q->name_len ? -1 : p->name_len > q->name_len;
}

/* One row per request: a name given twice would merge two requests' tokens into one. */
static moesim_status check_side_names(const char *path, const side_request *rq, uint64_t n,
                                      moesim_error *err) {
    const side_request **by_name = moesim_xcalloc(n, sizeof *by_name);
    for (uint64_t i = 0; i < n; i++) by_name[i] = &rq[i];
    qsort(by_name, n, sizeof *by_name, side_name_cmp);
    moesim_status st = MOESIM_OK;
    for (uint64_t i = 1; i < n && !st; i++)
        if (!side_name_cmp(&by_name[i - 1], &by_name[i]))
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: request '%.*s' has two rows (one row per request expected)", path,
                             (int)by_name[i]->name_len, by_name[i]->name);
    free(by_name);
    return st;
}

/* The --requests side file: CSV "request,tokens[,prompt_tokens]", one row per request. */
static moesim_status read_side_file(importer *x, side_request **out, uint64_t *n) {
    const char *path = x->o->requests_path;
    *out = NULL;
    *n = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return moesim_fail(x->err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    side_request *rq = NULL;
    uint64_t cap = 0, count = 0, line_no = 0;
    bool with_prompt = false;
    char line[1024];
    moesim_status st = MOESIM_OK;
    while (!st && fgets(line, sizeof line, fp)) {
        line_no++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            st = moesim_fail(x->err, MOESIM_EINPUT, "%s:%" PRIu64 ": row: longer than %zu bytes",
                             path, line_no, sizeof line - 2);
            break;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (line_no == 1) {
            if (!strcmp(line, "request,tokens,prompt_tokens"))
                with_prompt = true;
            else if (strcmp(line, "request,tokens"))
                st = moesim_fail(x->err, MOESIM_EINPUT,
                                 "%s:1: header: expected 'request,tokens' or "
                                 "'request,tokens,prompt_tokens'",
                                 path);
            continue;
        }
        if (!len) continue;
        char *c1 = strchr(line, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        if (!c1 || (with_prompt != (c2 != NULL)) || (c2 && strchr(c2 + 1, ','))) {
            st = moesim_fail(x->err, MOESIM_EINPUT, "%s:%" PRIu64 ": row: expected %d columns",
                             path, line_no, with_prompt ? 3 : 2);
            break;
        }
        if (count == cap) {
            cap = cap ? 2 * cap : 64;
            rq = moesim_xrealloc(rq, cap * sizeof *rq);
        }
        side_request *q = &rq[count];
        q->name_len = (size_t)(c1 - line);
        if (q->name_len == 0 || q->name_len > SIDE_NAME_MAX) {
            st = moesim_fail(x->err, MOESIM_EINPUT, "%s:%" PRIu64 ": request: expected 1..%d bytes",
                             path, line_no, SIDE_NAME_MAX);
            break;
        }
        memcpy(q->name, line, q->name_len);
        uint64_t v;
        const char *te = c2 ? c2 : line + len;
        text_scan s = {c1 + 1, te, NULL};
        if (!text_scan_uint(&s, UINT32_MAX, &v) || s.p != te || v == 0) {
            st = moesim_fail(x->err, MOESIM_EINPUT, "%s:%" PRIu64 ": tokens: expected a count >= 1",
                             path, line_no);
            break;
        }
        q->tokens = v;
        q->prompt = -1;
        if (c2) {
            s = (text_scan){c2 + 1, line + len, NULL};
            if (!text_scan_uint(&s, UINT32_MAX, &v) || s.p != line + len) {
                st = moesim_fail(x->err, MOESIM_EINPUT,
                                 "%s:%" PRIu64 ": prompt_tokens: expected a count >= 0", path,
                                 line_no);
                break;
            }
            q->prompt = (int64_t)v;
        }
        count++;
    }
    if (!st && ferror(fp))
        st = moesim_fail(x->err, MOESIM_EIO, "%s: read error: %s", path, strerror(errno));
    if (!st && count == 0) st = moesim_fail(x->err, MOESIM_EINPUT, "%s: no requests", path);
    if (!st) st = check_side_names(path, rq, count, x->err);
    fclose(fp);
    if (st) {
        free(rq);
        return st;
    }
    *out = rq;
    *n = count;
    return MOESIM_OK;
}

/* The open arrays of one import. */
typedef struct array_set {
    npy_array ids, gates, request_id; /* request_id: optional column [T] */
    npy_array logits;                 /* router logits [T][L][E] instead of ids and gates */
    bool has_request_id, has_gates, has_logits;
    int64_t *seq_lens, *prompt_lens; /* [n_seq], [n_prompt] or NULL */
    uint64_t n_seq, n_prompt;
    side_request *side; /* [n_side] or NULL */
    uint64_t n_side;
} array_set;

static void array_set_free(array_set *a) {
    npy_close(&a->ids);
    npy_close(&a->gates);
    npy_close(&a->logits);
    npy_close(&a->request_id);
    free(a->seq_lens);
    free(a->prompt_lens);
    free(a->side);
}

static const zip_member *find_member(const zip_member *m, uint32_t n, const char *const *names) {
    for (; *names; names++) {
        char want[64];
        snprintf(want, sizeof want, "%s.npy", *names);
        for (uint32_t i = 0; i < n; i++)
            if (!strcmp(m[i].name, want)) return &m[i];
    }
    return NULL;
}

/* A whole 1-D integer member (seq_lens, prompt_lens) into *out [*n]. */
static moesim_status read_int_vector(const char *path, const zip_member *z, int64_t **out,
                                     uint64_t *n, moesim_error *err) {
    npy_array a;
    moesim_status st = byte_stream_open_member(&a.s, path, z, err);
    if (st) return st;
    if (!(st = npy_header_read(&a, err))) {
        if (a.ndim != 1 || a.kind == 'f') {
            char sh[64];
            npy_shape_text(&a, sh, sizeof sh);
            st = byte_stream_fail(&a.s, err, "shape %s of %s: expected a 1-D integer array", sh,
                                  a.kind == 'f' ? "floats" : "integers");
        } else if (a.count > (1u << 28)) {
            st = byte_stream_fail(&a.s, err, "%" PRIu64 " entries: at most %u requests", a.count,
                                  1u << 28);
        } else {
            *n = a.count;
            *out = moesim_xmalloc((a.count ? a.count : 1) * sizeof **out);
            unsigned char *scratch = moesim_xmalloc((a.count ? a.count : 1) * a.itemsize);
            uint64_t neg;
            st = npy_read_values(&a, a.count, *out, NULL, scratch, &neg, err);
            free(scratch);
            if (!st && neg != UINT64_MAX)
                st = byte_stream_fail(&a.s, err, "[%" PRIu64 "]: %" PRId64 " is negative", neg,
                                      (*out)[neg]);
        }
    }
    npy_close(&a);
    return st;
}

static moesim_status open_npz(importer *x, array_set *a) {
    zip_member *m;
    uint32_t n;
    moesim_status st = zip_directory_read(x->path, &m, &n, x->err);
    if (st) return st;
    static const char *const ids_names[] = {"topk_ids", "routed_experts", NULL};
    static const char *const gate_names[] = {"topk_weights", NULL};
    static const char *const logit_names[] = {"router_logits", NULL};
    static const char *const rid_names[] = {"request_id", NULL};
    static const char *const seq_names[] = {"seq_lens", NULL};
    static const char *const prompt_names[] = {"prompt_lens", NULL};
    const zip_member *zi = find_member(m, n, ids_names), *zg = find_member(m, n, gate_names),
                     *zl = find_member(m, n, logit_names), *zr = find_member(m, n, rid_names),
                     *zs = find_member(m, n, seq_names), *zp = find_member(m, n, prompt_names);
    static const char *const alt_ids_names[] = {"routed_experts", NULL};
    if (zi && zi != find_member(m, n, alt_ids_names) && find_member(m, n, alt_ids_names))
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: topk_ids.npy and routed_experts.npy: two sources of expert ids "
                         "(give one)",
                         x->path);
    else if (zl && (zi || zg))
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: router_logits.npy and %s.npy: two sources of routing (give one)",
                         x->path, zi ? "topk_ids" : "topk_weights");
    else if (!zl && !zi)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: topk_ids.npy: no such array (%" PRIu32 " members): expected "
                         "topk_ids (or routed_experts) [tokens][layers][top_k] with topk_weights, "
                         "or router_logits [tokens][layers][experts]",
                         x->path, n);
    else if (zi && !zg && !x->o->uniform_gates)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: topk_weights.npy: no such array: the gate weights [tokens][layers]"
                         "[top_k] (--uniform-gates gives each chosen expert 1/k instead)",
                         x->path);
    else if ((zg || zl) && x->o->uniform_gates)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: --uniform-gates: the file has %s.npy; the option is for ids without "
                         "weights",
                         x->path, zg ? "topk_weights" : "router_logits");
    if (!st && zr && zs)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: request_id.npy and seq_lens.npy: two sources of request boundaries "
                         "(give one)",
                         x->path);
    if (!st && (zr || zs) && x->o->requests_path)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: %s.npy and --requests %s: two sources of request boundaries", x->path,
                         zr ? "request_id" : "seq_lens", x->o->requests_path);
    if (!st && zp && x->o->requests_path)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: prompt_lens.npy and --requests %s: two sources of prompt lengths",
                         x->path, x->o->requests_path);
    if (!st && zl) {
        a->has_logits = true;
        st = byte_stream_open_member(&a->logits.s, x->path, zl, x->err);
        if (!st) st = npy_header_read(&a->logits, x->err);
    }
    if (!st && zi) st = byte_stream_open_member(&a->ids.s, x->path, zi, x->err);
    if (!st && zi) st = npy_header_read(&a->ids, x->err);
    if (!st && zg) {
        a->has_gates = true;
        st = byte_stream_open_member(&a->gates.s, x->path, zg, x->err);
        if (!st) st = npy_header_read(&a->gates, x->err);
    }
    if (!st && zr) {
        a->has_request_id = true;
        st = byte_stream_open_member(&a->request_id.s, x->path, zr, x->err);
        if (!st) st = npy_header_read(&a->request_id, x->err);
    }
    if (!st && zs) st = read_int_vector(x->path, zs, &a->seq_lens, &a->n_seq, x->err);
    if (!st && zp) st = read_int_vector(x->path, zp, &a->prompt_lens, &a->n_prompt, x->err);
    free(m);
    return st;
}

/* IN is the ids (integers) or the router logits (floats). */
static moesim_status open_npy(importer *x, array_set *a) {
    npy_array in;
    moesim_status st = byte_stream_open_file(&in.s, x->path, x->err);
    if (!st) st = npy_header_read(&in, x->err);
    if (st) {
        npy_close(&in);
        return st;
    }
    const char *w = x->o->weights_path;
    if (in.kind == 'f') {
        a->logits = in;
        a->has_logits = true;
        if (w || x->o->uniform_gates)
            return moesim_fail(x->err, MOESIM_EINPUT,
                               "%s: floats: router logits [tokens][layers][experts], which give "
                               "the gates; %s does not apply",
                               x->path, w ? "--weights" : "--uniform-gates");
        return MOESIM_OK;
    }
    a->ids = in;
    if (!w && !x->o->uniform_gates)
        return moesim_fail(x->err, MOESIM_EINPUT,
                           "%s: --format npy needs --weights W.npy (gate weights [tokens][layers]"
                           "[top_k]), or --uniform-gates for ids without weights",
                           x->path);
    if (w && x->o->uniform_gates)
        return moesim_fail(x->err, MOESIM_EINPUT, "%s: --weights and --uniform-gates: give one",
                           x->path);
    if (!w) return MOESIM_OK;
    a->has_gates = true;
    x->gates_path = w;
    st = byte_stream_open_file(&a->gates.s, w, x->err);
    if (!st) st = npy_header_read(&a->gates, x->err);
    return st;
}

/* Shapes and dtypes against the model and each other; the request sources against T. */
static moesim_status check_arrays(importer *x, const array_set *a) {
    char sh[96];
    const npy_array *ids = a->has_logits ? &a->logits : &a->ids, *g = &a->gates;
    if (a->has_logits) {
        if (ids->kind != 'f')
            return byte_stream_fail(&ids->s, x->err, "dtype integer: expected float router logits");
        if (ids->ndim != 3 || ids->shape[1] != x->L || ids->shape[2] != x->E || !ids->shape[0]) {
            npy_shape_text(ids, sh, sizeof sh);
            return byte_stream_fail(&ids->s, x->err,
                                    "shape %s: expected [tokens >= 1][%" PRIu32
                                    " MoE layers][%" PRIu32 " experts] (%s)",
                                    sh, x->L, x->E, x->m->name);
        }
    } else {
        if (ids->kind == 'f')
            return byte_stream_fail(&ids->s, x->err, "dtype float: expected integer expert ids");
        if (ids->ndim != 3 || ids->shape[1] != x->L || ids->shape[2] != x->k || !ids->shape[0]) {
            npy_shape_text(ids, sh, sizeof sh);
            return byte_stream_fail(&ids->s, x->err,
                                    "shape %s: expected [tokens >= 1][%" PRIu32
                                    " MoE layers][top_k = %" PRIu32 "] (%s)",
                                    sh, x->L, x->k, x->m->name);
        }
    }
    if (a->has_gates && g->kind != 'f')
        return byte_stream_fail(&g->s, x->err, "dtype integer: expected float gate weights");
    if (a->has_gates && (g->ndim != 3 || memcmp(g->shape, ids->shape, 3 * sizeof g->shape[0]))) {
        npy_shape_text(g, sh, sizeof sh);
        char want[96];
        npy_shape_text(ids, want, sizeof want);
        return byte_stream_fail(&g->s, x->err, "shape %s: expected %s like the expert ids", sh,
                                want);
    }
    uint64_t T = ids->shape[0];
    if (ids->shape[0] > UINT32_MAX - 1)
        return byte_stream_fail(&ids->s, x->err, "%" PRIu64 " tokens: at most %u", T,
                                UINT32_MAX - 1);
    if (a->has_request_id) {
        const npy_array *r = &a->request_id;
        if (r->ndim != 1 || r->shape[0] != T || r->kind == 'f') {
            npy_shape_text(r, sh, sizeof sh);
            return byte_stream_fail(
                &r->s, x->err, "shape %s: expected [%" PRIu64 "] integers (one per token)", sh, T);
        }
    }
    const int64_t *lens = a->seq_lens;
    uint64_t n_lens = a->n_seq;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n_lens; i++) {
        if (lens[i] == 0 || (uint64_t)lens[i] > T) /* <= T: the sum cannot wrap */
            return moesim_fail(x->err, MOESIM_EINPUT,
                               "%s: seq_lens.npy[%" PRIu64 "]: %" PRId64
                               " tokens, expected 1..%" PRIu64 " (the arrays' tokens)",
                               x->path, i, lens[i], T);
        sum += (uint64_t)lens[i];
    }
    for (uint64_t i = 0; i < a->n_side && sum <= T; i++) sum += a->side[i].tokens;
    if ((a->seq_lens || a->side) && sum != T)
        return moesim_fail(
            x->err, MOESIM_EINPUT,
            "%s: %s: request lengths sum to %s%" PRIu64 " tokens, the arrays hold %" PRIu64,
            a->side ? x->o->requests_path : x->path, a->side ? "tokens" : "seq_lens.npy",
            sum > T ? "more than " : "", sum > T ? T : sum, T);
    return MOESIM_OK;
}

/* The request key of a block request (seq_lens: its index; side file: its name). */
static void block_key(const array_set *a, uint64_t q, request_key *k) {
    k->len = 0;
    if (a->side) {
        import_key_append(k, 's', a->side[q].name, a->side[q].name_len);
    } else {
        char num[24];
        int n = snprintf(num, sizeof num, "%" PRIu64, q);
        import_key_append(k, 'i', num, (size_t)n);
    }
}

/* One token's routing from its dense scores [L][E] (router logits by default, --scores says
 * otherwise): per layer the top-k and the gates by import_scores_topk. */
static moesim_status route_from_logits(importer *x, const npy_array *src, const float *logits,
                                       int64_t *ids, float *gates) {
    uint64_t row[TRACE_MAX_TOP_K];
    char where[600];
    for (uint32_t l = 0; l < x->L; l++) {
        snprintf(where, sizeof where, "%s: [%" PRIu64 "][%" PRIu32 "]", src->s.name, x->arr_token,
                 l);
        moesim_status st =
            import_scores_topk(x, logits + (size_t)l * x->E, where, row, gates + (size_t)l * x->k);
        if (st) return st;
        for (uint32_t j = 0; j < x->k; j++) ids[(size_t)l * x->k + j] = (int64_t)row[j];
    }
    return MOESIM_OK;
}

moesim_status import_arrays(importer *x) {
    array_set a = {0};
    moesim_status st = x->o->format == TRACE_TEXT_NPZ ? open_npz(x, &a) : open_npy(x, &a);
    if (!st && x->o->requests_path) st = read_side_file(x, &a.side, &a.n_side);
    if (!st) st = check_arrays(x, &a);
    if (st) {
        array_set_free(&a);
        return st;
    }
    x->rep->requests_source = a.has_request_id ? "request_id column"
                              : a.seq_lens     ? "seq_lens"
                              : a.side         ? "--requests"
                                               : "one request";
    x->prompt_source = a.prompt_lens ? "prompt_lens" : "prompt_tokens of --requests";
    x->rep->gates_source = a.has_gates     ? "weights"
                           : !a.has_logits ? "uniform 1/k (--uniform-gates)"
                                           : import_scores_source(x);
    const uint64_t T = a.has_logits ? a.logits.shape[0] : a.ids.shape[0];
    const uint64_t row = (uint64_t)x->L * x->k, logit_row = (uint64_t)x->L * x->E;
    import_record *r = moesim_xcalloc(1, sizeof *r);
    int64_t *ids = moesim_xmalloc(row * sizeof *ids); /* [L][k] of one token */
    float *gates = moesim_xmalloc(row * sizeof *gates);
    float *logits = a.has_logits ? moesim_xmalloc(logit_row * sizeof *logits) : NULL; /* [L][E] */
    unsigned char *scratch = moesim_xmalloc((a.has_logits ? logit_row : row) * 8);
    uint64_t block = 0, block_left = a.seq_lens ? (uint64_t)a.seq_lens[0]
                                     : a.side   ? a.side[0].tokens
                                                : T;
    r->all_layers = true;
    r->n_rows = x->L;
    r->phase = -1;
    for (uint32_t l = 0; l < x->L; l++) r->n_ids[l] = r->n_gates[l] = x->k;
    for (uint64_t t = 0; t < T && !st; t++) {
        x->arr_token = t;
        uint64_t neg;
        if (a.has_logits) {
            if ((st = npy_read_values(&a.logits, logit_row, NULL, logits, scratch, &neg, x->err)))
                break;
            if ((st = route_from_logits(x, &a.logits, logits, ids, gates))) break;
        } else {
            if ((st = npy_read_values(&a.ids, row, ids, NULL, scratch, &neg, x->err))) break;
            if (neg != UINT64_MAX) {
                st = moesim_fail(x->err, MOESIM_EINPUT,
                                 "%s: [%" PRIu64 "][%" PRIu64 "][%" PRIu64 "]: expert id %" PRId64
                                 " is negative",
                                 a.ids.s.name, t, neg / x->k, neg % x->k, ids[neg]);
                break;
            }
            if (a.has_gates) {
                if ((st = npy_read_values(&a.gates, row, NULL, gates, scratch, &neg, x->err)))
                    break;
            } else {
                for (uint64_t i = 0; i < row; i++) gates[i] = 1.0f / (float)x->k;
            }
        }
        uint64_t q; /* the request: a block index, or a request_id value */
        if (a.has_request_id) {
            int64_t rid;
            if ((st = npy_read_values(&a.request_id, 1, &rid, NULL, scratch, &neg, x->err))) break;
            if (neg != UINT64_MAX) {
                st = moesim_fail(x->err, MOESIM_EINPUT,
                                 "%s: [%" PRIu64 "]: request id %" PRId64 " is negative",
                                 a.request_id.s.name, t, rid);
                break;
            }
            char num[24];
            int n = snprintf(num, sizeof num, "%" PRId64, rid);
            r->key.len = 0;
            import_key_append(&r->key, 'i', num, (size_t)n);
            q = UINT64_MAX;
        } else {
            while (block_left == 0) {
                block++;
                block_left = a.seq_lens ? (uint64_t)a.seq_lens[block] : a.side[block].tokens;
            }
            block_left--;
            block_key(&a, block, &r->key);
            q = block;
        }
        /* position: the request's tokens so far */
        uint32_t ri = import_request_find_or_add(x, &r->key);
        const import_request *req = &x->reqs[ri];
        r->token_idx = req->tail == IMPORT_NO_TOKEN ? 0 : x->tok_pos[req->tail] + 1;
        r->prompt_len = -1;
        uint64_t pi = q == UINT64_MAX ? ri : q; /* prompt_lens follow the requests' order */
        if (a.prompt_lens) {
            if (pi >= a.n_prompt) {
                st = moesim_fail(x->err, MOESIM_EINPUT,
                                 "%s: prompt_lens.npy: %" PRIu64 " entries, but token %" PRIu64
                                 " starts request %" PRIu64,
                                 x->path, a.n_prompt, t, pi);
                break;
            }
            r->prompt_len = a.prompt_lens[pi];
        } else if (a.side && a.side[pi].prompt >= 0) {
            r->prompt_len = a.side[pi].prompt;
        }
        for (uint32_t l = 0; l < x->L; l++)
            for (uint32_t j = 0; j < x->k; j++) {
                r->ids[l][j] = (uint64_t)ids[(uint64_t)l * x->k + j];
                r->gates[l][j] = gates[(uint64_t)l * x->k + j];
            }
        st = import_place(x, r);
        x->rep->lines++;
    }
    if (!st && a.prompt_lens && a.n_prompt != x->n_reqs)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: prompt_lens.npy: %" PRIu64 " entries for %" PRIu32 " requests",
                         x->path, a.n_prompt, x->n_reqs);
    free(scratch);
    free(logits);
    free(gates);
    free(ids);
    free(r);
    array_set_free(&a);
    return st;
}
