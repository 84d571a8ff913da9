/* Dense per-layer score files for `moesim trace import` (traces/FORMAT.md, "Dense scores"): one
 * file per MoE layer, one row per token, one score per expert, as router dumps of training
 * frameworks write them (Megatron's per-layer CSVs, a [tokens][experts] tensor saved per layer).
 *
 *   CSV   a header naming expert_0 .. expert_<E-1> (every expert once), optionally a token
 *         column (token_id, token_idx, position, token), a request column (request_id, req_id,
 *         seq_id, sequence_id) and a layer column (layer_id, layer); other columns are ignored
 *         and reported
 *   .npy  a 2-D float array [tokens][E]
 *
 * A file's layer comes from its layer column (row by row), from its name (the first group of
 * --layer-from-name) or from its place in the file list; for the last two every file's layer is
 * mapped (--layer-base, --layers) and checked, and no two files may give the same layer, before
 * any row is read. A row's token is its token column or its row index; its request the request
 * column, or token / --tokens-per-request (position token % N), or else one request. Each row is
 * reduced to the top-k by score (ties to the lower expert id) by import_scores_topk, and placed
 * as one (token, layer) record: files may hold their tokens in any order. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/import_internal.h"
#include "traces/npy.h"
#include "traces/text_scan.h"

#define DENSE_WHERE_MAX 600 /* "path:line" or "path: [row]" */

/* ---- scores -> top-k --------------------------------------------------------------------- */

moesim_status import_scores_topk(importer *x, const float *z, const char *where, uint64_t *ids,
                                 float *gates) {
    const uint32_t E = x->E, k = x->k;
    const double tol = TRACE_IMPORT_GATE_SUM_TOLERANCE;
    double sum = 0;
    uint32_t nonzero = 0;
    bool nonneg = true;
    float zmax = -INFINITY;
    for (uint32_t e = 0; e < E; e++) {
        if (!isfinite(z[e]))
            return moesim_fail(x->err, MOESIM_EINPUT, "%s: expert %" PRIu32 ": score is not finite",
                               where, e);
        nonneg &= z[e] >= 0.0f;
        nonzero += z[e] != 0.0f;
        sum += z[e];
        if (z[e] > zmax) zmax = z[e];
    }
    const trace_scores_kind kind = x->o->scores;
    if (kind == TRACE_SCORES_LOGITS && nonneg && !x->o->force_scores) {
        if (fabs(sum - 1.0) <= tol)
            return moesim_fail(x->err, MOESIM_EINPUT,
                               "%s: scores are non-negative and sum to %.4f: probabilities, not "
                               "router logits (--scores probs; --force-scores reads them as "
                               "logits)",
                               where, sum);
        if (nonzero <= k && sum <= 1.0 + tol)
            return moesim_fail(x->err, MOESIM_EINPUT,
                               "%s: %" PRIu32 " of %" PRIu32 " scores non-zero, non-negative, sum "
                               "%.4f: gate weights, not router logits (--scores weights; "
                               "--force-scores reads them as logits)",
                               where, nonzero, E, sum);
    }
    if (kind == TRACE_SCORES_PROBS && (!nonneg || fabs(sum - 1.0) > tol))
        return moesim_fail(x->err, MOESIM_EINPUT,
                           "%s: scores %s %.6g: not probabilities over the %" PRIu32 " experts "
                           "(--scores probs expects non-negative scores summing to 1 +- %g; "
                           "--scores weights for gate weights with zeros for unpicked experts)",
                           where, nonneg ? "sum to" : "are negative, sum", sum, E, tol);
    if (kind == TRACE_SCORES_WEIGHTS && !nonneg)
        return moesim_fail(x->err, MOESIM_EINPUT,
                           "%s: negative scores: not gate weights (--scores weights; --scores "
                           "logits for router logits)",
                           where);
    bool taken[MODEL_MAX_EXPERTS] = {false};
    for (uint32_t j = 0; j < k; j++) { /* selection: strict > keeps the lower id on a tie */
        uint32_t best = UINT32_MAX;
        for (uint32_t e = 0; e < E; e++)
            if (!taken[e] && (best == UINT32_MAX || z[e] > z[best])) best = e;
        taken[best] = true;
        ids[j] = best;
    }
    if (kind == TRACE_SCORES_WEIGHTS) {
        for (uint32_t j = 0; j < k; j++) gates[j] = z[ids[j]];
        return MOESIM_OK;
    }
    bool over_topk = x->m->gate_norm == GATE_SOFTMAX_TOPK;
    if (kind == TRACE_SCORES_PROBS) { /* already softmax over all: kept, or renormalized */
        double top = 0;
        for (uint32_t j = 0; j < k; j++) top += z[ids[j]];
        for (uint32_t j = 0; j < k; j++)
            gates[j] =
                over_topk ? (top > 0 ? (float)(z[ids[j]] / top) : 1.0f / (float)k) : z[ids[j]];
        return MOESIM_OK;
    }
    double den = 0; /* logits: softmax over the top-k, or over all E with the top-k kept */
    if (over_topk)
        for (uint32_t j = 0; j < k; j++) den += exp((double)z[ids[j]] - zmax);
    else
        for (uint32_t e = 0; e < E; e++) den += exp((double)z[e] - zmax);
    for (uint32_t j = 0; j < k; j++) gates[j] = (float)(exp((double)z[ids[j]] - zmax) / den);
    return MOESIM_OK;
}

const char *import_scores_source(const importer *x) {
    static const char *const text[3][2] = {
        {"router logits: softmax over the top-k", "router logits: softmax over all experts, "
                                                  "top-k kept"},
        {"probabilities: renormalized over the top-k", "probabilities: top-k kept"},
        {"gate weights: top-k kept", "gate weights: top-k kept"}};
    return text[x->o->scores][x->m->gate_norm != GATE_SOFTMAX_TOPK];
}

/* ---- the files' layers ------------------------------------------------------------------- */

/* The MoE layer of layer `written` (as the log numbers it), or -1 when it names none. */
static int64_t layer_to_moe(const importer *x, uint64_t written) {
    if (written < x->o->layer_base) return -1;
    uint64_t l = written - x->o->layer_base;
    if (x->o->layers == TRACE_LAYERS_MOE) return l < x->L ? (int64_t)l : -1;
    return l < x->m->n_layers ? x->moe_index[l] : -1;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Each file's layer as written, from its name or its order. */
static moesim_status file_layers_read(importer *x, uint64_t *written) {
    const trace_import_options *o = x->o;
    if (o->layer_from == TRACE_LAYER_FROM_ORDER) {
        for (uint32_t f = 0; f < x->n_paths; f++) written[f] = (uint64_t)o->layer_base + f;
        return MOESIM_OK;
    }
    regex_t re;
    if (regcomp(&re, o->layer_name_pattern, REG_EXTENDED) != 0 || re.re_nsub < 1) {
        if (re.re_nsub < 1) regfree(&re);
        return moesim_fail(x->err, MOESIM_EINPUT,
                           "--layer-from-name '%s': expected an extended regular expression with "
                           "a group around the layer number, e.g. 'layer([0-9]+)'",
                           o->layer_name_pattern);
    }
    moesim_status st = MOESIM_OK;
    for (uint32_t f = 0; f < x->n_paths && !st; f++) {
        const char *name = base_name(x->paths[f]);
        regmatch_t m[2];
        if (regexec(&re, name, 2, m, 0) != 0 || m[1].rm_so < 0) {
            st = moesim_fail(x->err, MOESIM_EINPUT,
                             "%s: --layer-from-name '%s': the file name does not match (expected "
                             "the layer number in group 1)",
                             x->paths[f], o->layer_name_pattern);
            break;
        }
        text_scan s = {name + m[1].rm_so, name + m[1].rm_eo, NULL};
        if (!text_scan_uint(&s, UINT32_MAX, &written[f]) || s.p != s.end)
            st = moesim_fail(x->err, MOESIM_EINPUT,
                             "%s: --layer-from-name '%s': '%.*s' is not a layer number",
                             x->paths[f], o->layer_name_pattern, (int)(m[1].rm_eo - m[1].rm_so),
                             name + m[1].rm_so);
    }
    regfree(&re);
    return st;
}

/* Every file's layer mapped and checked, and no layer twice, before any row is read. */
static moesim_status file_layers_check(importer *x, const uint64_t *written) {
    const trace_import_options *o = x->o;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t f = 0; f < x->n_paths; f++) {
        lo = written[f] < lo ? written[f] : lo;
        hi = written[f] > hi ? written[f] : hi;
    }
    const char *from = o->layer_from == TRACE_LAYER_FROM_NAME ? "the file names" : "the file order";
    for (uint32_t f = 0; f < x->n_paths; f++) {
        if (layer_to_moe(x, written[f]) >= 0) continue;
        char want[160];
        if (o->layers == TRACE_LAYERS_MOE)
            snprintf(want, sizeof want, "MoE layers %" PRIu32 "..%" PRIu32 " (--layers moe)",
                     o->layer_base, o->layer_base + x->L - 1);
        else
            snprintf(want, sizeof want,
                     "the MoE layers among model layers %" PRIu32 "..%" PRIu32 " (--layers model)",
                     o->layer_base, o->layer_base + x->m->n_layers - 1);
        return moesim_fail(x->err, MOESIM_EINPUT,
                           "%s: layer %" PRIu64 " (layers %" PRIu64 "..%" PRIu64 " from %s) is "
                           "not an MoE layer of %s: with --layer-base %" PRIu32 " expected %s; "
                           "nothing was read",
                           x->paths[f], written[f], lo, hi, from, x->m->name, o->layer_base, want);
    }
    for (uint32_t f = 1; f < x->n_paths; f++)
        for (uint32_t g = 0; g < f; g++)
            if (layer_to_moe(x, written[f]) == layer_to_moe(x, written[g]))
                return moesim_fail(x->err, MOESIM_EINPUT,
                                   "%s: layer %" PRIu64 " again (also %s): one file per layer",
                                   x->paths[f], written[f], x->paths[g]);
    return MOESIM_OK;
}

/* ---- one row ----------------------------------------------------------------------------- */

/* Request key and position of token `tok` without a request column. */
static void token_place(const importer *x, uint64_t tok, import_record *r) {
    uint32_t n = x->o->tokens_per_request;
    char num[24];
    int len = snprintf(num, sizeof num, "%" PRIu64, n ? tok / n : 0);
    r->key.len = 0;
    import_key_append(&r->key, 'i', num, (size_t)len);
    r->token_idx = n ? tok % n : tok;
}

static moesim_status place_scores(importer *x, import_record *r, const float *z,
                                  const char *where) {
    moesim_status st = import_scores_topk(x, z, where, r->ids[0], r->gates[0]);
    if (!st) st = import_place(x, r);
    return st;
}

static void record_start(const importer *x, import_record *r, int64_t layer) {
    r->all_layers = false;
    r->n_rows = 1;
    r->n_ids[0] = r->n_gates[0] = x->k;
    r->phase = -1;
    r->prompt_len = -1;
    r->layer = layer >= 0 ? (uint64_t)layer : 0;
}

/* ---- CSV --------------------------------------------------------------------------------- */

typedef struct dense_columns {
    uint32_t n;                    /* columns in the header */
    int32_t token, request, layer; /* column index, or -1 */
    int32_t *expert;               /* [n] the expert of column c, or -1 */
    char names[3][32];             /* the token, request and layer columns' names */
    bool ignored;                  /* the header has columns the importer does not read */
} dense_columns;

static bool name_is(const char *p, size_t n, const char *const *names) {
    for (; *names; names++)
        if (strlen(*names) == n && !memcmp(p, *names, n)) return true;
    return false;
}

static const char *const token_names[] = {"token_id", "token_idx", "position", "token", NULL};
static const char *const request_names[] = {"request_id", "req_id", "seq_id", "sequence_id", NULL};
static const char *const layer_names[] = {"layer_id", "layer", NULL};

/* A header name [*p, *end) without the spaces and tabs around it (cells are read so too). */
static void trim_name(const char **p, const char **end) {
    while (*p < *end && (**p == ' ' || **p == '\t')) (*p)++;
    while (*end > *p && ((*end)[-1] == ' ' || (*end)[-1] == '\t')) (*end)--;
}

/* The expert of column name [p, p + n): "expert_<i>" with i < limit, else -1. */
static int64_t expert_column(const char *p, size_t n, uint64_t limit) {
    if (n <= 7 || memcmp(p, "expert_", 7)) return -1;
    text_scan s = {p + 7, p + n, NULL};
    uint64_t v;
    if (!text_scan_uint(&s, UINT32_MAX, &v) || s.p != s.end || v >= limit) return -1;
    return (int64_t)v;
}

bool import_csv_is_dense(const importer *x, const char *line, const char *end) {
    bool last = false, gate = false;
    for (const char *p = line; p <= end;) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        const char *ce = c ? c : end, *ne = ce, *np = p;
        if (ne > np && ne[-1] == '\r') ne--;
        trim_name(&np, &ne);
        last |= expert_column(np, (size_t)(ne - np), UINT32_MAX) == (int64_t)x->E - 1;
        gate |= (size_t)(ne - np) == 6 && !memcmp(np, "gate_0", 6);
        if (!c) break;
        p = c + 1;
    }
    return last && !gate && x->E > x->k;
}

static void note_ignored(trace_import_report *rep, const char *p, size_t n) {
    size_t len = strlen(rep->ignored_keys);
    if (len + n + 2 < sizeof rep->ignored_keys)
        snprintf(rep->ignored_keys + len, sizeof rep->ignored_keys - len, "%s%.*s", len ? "," : "",
                 (int)n, p);
}

static moesim_status csv_header_read(importer *x, const char *line, const char *end,
                                     dense_columns *c) {
    if (end > line && end[-1] == '\r') end--;
    c->n = 1;
    for (const char *p = line; p < end; p++) c->n += *p == ',';
    c->expert = moesim_xmalloc(c->n * sizeof *c->expert);
    c->token = c->request = c->layer = -1;
    int32_t *seen = moesim_xmalloc(x->E * sizeof *seen); /* [E] column of each expert */
    for (uint32_t e = 0; e < x->E; e++) seen[e] = -1;
    moesim_status st = MOESIM_OK;
    const char *next = line;
    for (uint32_t col = 0; col < c->n && !st; col++) {
        const char *q = memchr(next, ',', (size_t)(end - next));
        const char *qe = q ? q : end, *p = next, *ne = qe;
        trim_name(&p, &ne);
        size_t n = (size_t)(ne - p);
        c->expert[col] = -1;
        int64_t e = expert_column(p, n, UINT32_MAX);
        int32_t *slot = name_is(p, n, token_names)     ? &c->token
                        : name_is(p, n, request_names) ? &c->request
                        : name_is(p, n, layer_names)   ? &c->layer
                                                       : NULL;
        if (e >= (int64_t)x->E) {
            st = import_fail(x, "header",
                             "column %" PRIu32 " is '%.*s': expert %" PRId64 " >= %" PRIu32
                             " experts of %s",
                             col + 1, (int)n, p, e, x->E, x->m->name);
        } else if (e >= 0) {
            if (seen[e] >= 0)
                st = import_fail(x, "header",
                                 "column %" PRIu32 ": expert_%" PRId64
                                 " again (also column %" PRId32 ")",
                                 col + 1, e, seen[e] + 1);
            seen[e] = (int32_t)col;
            c->expert[col] = (int32_t)e;
        } else if (slot) {
            if (*slot >= 0)
                st = import_fail(x, "header",
                                 "column %" PRIu32 " '%.*s': a second %s column (column %" PRId32
                                 ")",
                                 col + 1, (int)n, p,
                                 slot == &c->token     ? "token"
                                 : slot == &c->request ? "request"
                                                       : "layer",
                                 *slot + 1);
            *slot = (int32_t)col;
            snprintf(c->names[slot == &c->token     ? 0
                              : slot == &c->request ? 1
                                                    : 2],
                     sizeof c->names[0], "%.*s", (int)(n < 31 ? n : 31), p);
        } else {
            note_ignored(x->rep, p, n);
            c->ignored = true;
        }
        next = qe + 1;
    }
    for (uint32_t e = 0; e < x->E && !st; e++)
        if (seen[e] < 0)
            st = import_fail(x, "header",
                             "no column expert_%" PRIu32 ": dense scores need expert_0 .. "
                             "expert_%" PRIu32 " (%s)",
                             e, x->E - 1, x->m->name);
    if (!st && c->request >= 0 && c->token < 0)
        st = import_fail(x, "header",
                         "a request column '%s' needs a token column (token_id, token_idx, "
                         "position or token)",
                         c->names[1]);
    if (!st && x->o->layer_from == TRACE_LAYER_FROM_COLUMN && c->layer < 0)
        st = import_fail(x, "header",
                         "no layer column (layer_id or layer): give each file's layer with "
                         "--layer-from-name PATTERN or --layer-from-order");
    if (!st && c->request >= 0 && x->o->tokens_per_request)
        st = import_fail(x, "header",
                         "request column '%s' and --tokens-per-request: two sources of requests",
                         c->names[1]);
    free(seen);
    return st;
}

static moesim_status csv_row_read(importer *x, const dense_columns *c, const char *line,
                                  const char *end, uint64_t row, import_record *r, float *z) {
    if (end > line && end[-1] == '\r') end--;
    uint64_t tok = row, layer = r->layer, req = 0;
    const char *p = line;
    uint32_t col = 0;
    for (;; col++) {
        const char *q = memchr(p, ',', (size_t)(end - p));
        const char *qe = q ? q : end;
        if (col < c->n) {
            text_scan s = {p, qe, NULL};
            int32_t e = c->expert[col];
            bool is_int = (int32_t)col == c->token || (int32_t)col == c->request ||
                          ((int32_t)col == c->layer && x->o->layer_from == TRACE_LAYER_FROM_COLUMN);
            bool ok = true;
            uint64_t v = 0;
            if (e >= 0)
                ok = text_scan_float(&s, &z[e]);
            else if (is_int)
                ok = text_scan_uint(&s, UINT32_MAX - 1, &v);
            if ((e >= 0 || is_int) && ok && s.p != s.end) {
                ok = false;
                s.why = "unexpected characters after the number";
            }
            char name[32];
            if (e >= 0)
                snprintf(name, sizeof name, "expert_%" PRId32, e);
            else
                snprintf(name, sizeof name, "%s",
                         (int32_t)col == c->token     ? c->names[0]
                         : (int32_t)col == c->request ? c->names[1]
                                                      : c->names[2]);
            if (!ok)
                return import_fail(x, name, "'%.*s' is not a %s (%s)",
                                   (int)(qe - p < 40 ? qe - p : 40), p,
                                   e >= 0 ? "number" : "non-negative integer", s.why);
            if ((int32_t)col == c->token) tok = v;
            if ((int32_t)col == c->request) req = v;
            if ((int32_t)col == c->layer && is_int) layer = v;
        }
        if (!q) break;
        p = q + 1;
    }
    if (col + 1 != c->n)
        return import_fail(x, "row", "%" PRIu32 " columns, the header has %" PRIu32, col + 1, c->n);
    if (c->request >= 0) {
        char num[24];
        int len = snprintf(num, sizeof num, "%" PRIu64, req);
        r->key.len = 0;
        import_key_append(&r->key, 'i', num, (size_t)len);
        r->token_idx = tok;
    } else {
        token_place(x, tok, r);
    }
    r->layer = layer;
    return MOESIM_OK;
}

static moesim_status csv_file_read(importer *x, int64_t layer, import_record *r, float *z) {
    FILE *fp = fopen(x->path, "rb");
    if (!fp)
        return moesim_fail(x->err, MOESIM_EIO, "%s: cannot open: %s", x->path, strerror(errno));
    dense_columns c = {0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    moesim_status st = MOESIM_OK;
    uint64_t rows = 0;
    char where[DENSE_WHERE_MAX];
    x->line = 0;
    while (!st && (got = getline(&line, &cap, fp)) >= 0) {
        x->line++;
        x->rep->lines++;
        const char *end = line + got;
        if (end > line && end[-1] == '\n') end--;
        if ((st = import_check_text_line(x, line, end))) break;
        if (x->line == 1) {
            st = csv_header_read(x, import_past_bom(line, end), end, &c);
            continue;
        }
        bool blank = true;
        for (const char *p = line; p < end && blank; p++)
            blank = *p == ' ' || *p == '\t' || *p == '\r';
        if (blank) {
            x->rep->blank_lines++;
            continue;
        }
        record_start(x, r, layer);
        st = csv_row_read(x, &c, line, end, rows++, r, z);
        if (!st) {
            snprintf(where, sizeof where, "%s:%" PRIu64, x->path, x->line);
            st = place_scores(x, r, z, where);
        }
        if (!st && c.ignored) x->rep->ignored_key_records++;
    }
    if (!st && ferror(fp))
        st = moesim_fail(x->err, MOESIM_EIO, "%s: read error: %s", x->path, strerror(errno));
    if (!st && x->line == 0)
        st = moesim_fail(x->err, MOESIM_EINPUT, "%s: empty file (no header)", x->path);
    free(line);
    free(c.expert);
    fclose(fp);
    return st;
}

/* ---- .npy [tokens][E] -------------------------------------------------------------------- */

static moesim_status npy_file_read(importer *x, int64_t layer, import_record *r, float *z) {
    npy_array a;
    moesim_status st = byte_stream_open_file(&a.s, x->path, x->err);
    if (!st) st = npy_header_read(&a, x->err);
    if (!st && (a.kind != 'f' || a.ndim != 2 || a.shape[1] != x->E || !a.shape[0])) {
        char sh[96];
        npy_shape_text(&a, sh, sizeof sh);
        st = byte_stream_fail(&a.s, x->err,
                              "%s %s: expected float scores [tokens >= 1][%" PRIu32
                              " experts] (one MoE layer of %s per file)",
                              a.kind == 'f' ? "shape" : "integers of shape", sh, x->E, x->m->name);
    }
    unsigned char *scratch = st ? NULL : moesim_xmalloc((size_t)x->E * a.itemsize);
    char where[DENSE_WHERE_MAX];
    x->line = 0;
    for (uint64_t t = 0; !st && t < a.shape[0]; t++) {
        uint64_t neg;
        x->arr_token = t;
        if ((st = npy_read_values(&a, x->E, NULL, z, scratch, &neg, x->err))) break;
        record_start(x, r, layer);
        token_place(x, t, r);
        snprintf(where, sizeof where, "%s: [%" PRIu64 "]", x->path, t);
        st = place_scores(x, r, z, where);
        x->rep->lines++;
    }
    free(scratch);
    npy_close(&a);
    return st;
}

/* ---- entry ------------------------------------------------------------------------------- */

moesim_status import_dense(importer *x) {
    const trace_import_options *o = x->o;
    uint64_t *written = moesim_xcalloc(x->n_paths, sizeof *written); /* [n_paths] */
    moesim_status st = MOESIM_OK;
    if (o->format != TRACE_TEXT_CSV && o->layer_from == TRACE_LAYER_FROM_COLUMN)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: a .npy of scores has no layer column: give each file's layer with "
                         "--layer-from-name PATTERN or --layer-from-order",
                         x->paths[0]);
    else if (o->layer_from != TRACE_LAYER_FROM_COLUMN) {
        st = file_layers_read(x, written);
        if (!st) st = file_layers_check(x, written);
    }
    x->rep->gates_source = import_scores_source(x);
    x->rep->requests_source = o->tokens_per_request ? "--tokens-per-request" : NULL;
    import_record *r = moesim_xcalloc(1, sizeof *r);
    float *z = moesim_xmalloc(x->E * sizeof *z); /* [E] one row's scores */
    for (uint32_t f = 0; f < x->n_paths && !st; f++) {
        x->path = x->paths[f];
        int64_t layer = o->layer_from == TRACE_LAYER_FROM_COLUMN ? -1 : (int64_t)written[f];
        st = o->format == TRACE_TEXT_CSV ? csv_file_read(x, layer, r, z)
                                         : npy_file_read(x, layer, r, z);
        x->rep->files++;
    }
    x->path = x->paths[0];
    free(z);
    free(r);
    free(written);
    return st;
}
