/* `moesim trace import`: routing logs (JSONL in two shapes, or export's CSV) -> trace; see
 * traces/convert.h and traces/FORMAT.md ("Import and export").
 *
 * One pass over the file, one line at a time (chunked reads, so the file size does not matter
 * beyond the trace itself). Each line is parsed into an import_record by the JSONL or CSV
 * parser, then import_add places it: the request by a hash of its key (problem_id with dataset,
 * or req_id), the token by (request, token_idx) — within a request token_idx never decreases,
 * so a request's current token is the only one a record can extend — and the routing row by
 * its layer. Rows start as TRACE_NO_EXPERT, so a second record for a row is seen at once.
 * After the last line, import_finish finds incomplete tokens and constant runs, applies the
 * drop options, renumbers requests densely and builds the trace.
 *
 * Units: token_idx and positions are token counts within a request; lines are 1-based. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/hash.h"
#include "common/progress.h"
#include "traces/convert.h"
#include "traces/text_scan.h"

#define NO_TOKEN         UINT64_MAX
#define REQUEST_PART_MAX 120 /* bytes of a dataset name or a request id */
#define REQUEST_KEY_MAX  256 /* bytes of a request key: two tagged parts (key_append) */
#define READ_CHUNK_BYTES (4u << 20)

/* ---- one parsed record ------------------------------------------------------------------- */

typedef struct import_fields {
    const char *request; /* "problem_id", "req_id", "request_id" */
    const char *token;   /* "token_idx", "position" */
    const char *layer;
    const char *ids;   /* "experts", "topk_ids", "expert_<j>" */
    const char *gates; /* "gating_probs", "topk_weights", "gate_<j>" */
    const char *phase;
} import_fields;

static const import_fields fields_problem = {"problem_id", "token_idx",    "layer",
                                             "experts",    "gating_probs", "phase"};
static const import_fields fields_request = {"req_id",   "token_idx",    "layer",
                                             "topk_ids", "topk_weights", "phase"};
static const import_fields fields_csv = {"request_id", "position", "layer",
                                         "expert",     "gate",     "phase"};

/* A request's identity: tagged parts (key_append). */
typedef struct request_key {
    char bytes[REQUEST_KEY_MAX];
    size_t len;
} request_key;

typedef struct import_record {
    request_key key;
    uint64_t token_idx;
    uint64_t layer;
    uint32_t n_ids, n_gates; /* as many as the record holds (only the first 64 are kept) */
    uint64_t ids[TRACE_MAX_TOP_K];
    float gates[TRACE_MAX_TOP_K];
    int phase; /* TRACE_PREFILL, TRACE_DECODE, or -1: the record does not say */
} import_record;

/* ---- the importer ------------------------------------------------------------------------ */

typedef struct import_request {
    size_t key_off, key_len; /* bytes in importer.keys */
    uint64_t hash;
    char name[64];
    uint64_t last_token; /* index of its latest token, NO_TOKEN before the first */
    bool decoded;        /* a decode token was seen */
} import_request;

typedef struct importer {
    const char *path;
    const model_geometry *m;
    const trace_import_options *o;
    trace_import_report *rep;
    moesim_error *err;
    uint32_t L, E, k;
    int32_t moe_index[MODEL_MAX_LAYERS]; /* [model layers] MoE index, or -1 for dense layers */
    const import_fields *f;
    trace_jsonl_schema schema; /* decided by the option or the first record */
    uint64_t schema_line;      /* line that decided it (0: --schema) */
    int has_phase;             /* -1 undecided, 0/1: whether records carry "phase" */
    uint64_t phase_line;
    uint64_t line;

    /* tokens, in order of their first record */
    uint64_t n_tokens, cap_tokens;
    uint32_t *tok_request; /* [n_tokens] index into reqs */
    uint32_t *tok_pos;     /* [n_tokens] token_idx */
    uint8_t *tok_phase;    /* [n_tokens] */
    uint64_t *tok_line;    /* [n_tokens] line of the first record */
    uint16_t *tok_layers;  /* [n_tokens] layers recorded */
    uint16_t *ids;         /* [n_tokens][L][k], TRACE_NO_EXPERT until recorded */
    float *gates;          /* [n_tokens][L][k] */

    /* requests, in order of first appearance; open-addressing table of index + 1 */
    import_request *reqs;
    uint32_t n_reqs, cap_reqs;
    char *keys;
    size_t keys_len, keys_cap;
    uint32_t *table;
    uint32_t table_cap; /* power of two, > 2 n_reqs */
    uint32_t last_req;  /* cache: the previous record's request (UINT32_MAX: none) */
} importer;

static moesim_status rec_fail(importer *x, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "path:line: field: problem" */
static moesim_status rec_fail(importer *x, const char *field, const char *fmt, ...) {
    char msg[MOESIM_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return moesim_fail(x->err, MOESIM_EINPUT, "%s:%" PRIu64 ": %s: %s", x->path, x->line, field,
                       msg);
}

void trace_import_options_default(trace_import_options *o) {
    memset(o, 0, sizeof *o);
    o->format = TRACE_TEXT_JSONL;
    o->schema = TRACE_SCHEMA_AUTO;
    o->incomplete = TRACE_INCOMPLETE_KEEP;
    o->layers = TRACE_LAYERS_MOE;
    o->constant_run_min = TRACE_IMPORT_CONSTANT_RUN_MIN;
}

static const char *schema_name(trace_jsonl_schema s) {
    return s == TRACE_SCHEMA_PROBLEM ? "problem" : s == TRACE_SCHEMA_REQUEST ? "request" : "auto";
}

static void importer_free(importer *x) {
    free(x->tok_request);
    free(x->tok_pos);
    free(x->tok_phase);
    free(x->tok_line);
    free(x->tok_layers);
    free(x->ids);
    free(x->gates);
    free(x->reqs);
    free(x->keys);
    free(x->table);
}

/* ---- requests ---------------------------------------------------------------------------- */

static void table_insert(importer *x, uint32_t idx) {
    uint32_t mask = x->table_cap - 1;
    uint32_t h = (uint32_t)x->reqs[idx].hash & mask;
    while (x->table[h]) h = (h + 1) & mask;
    x->table[h] = idx + 1;
}

/* The printable name of a request key: its segments joined by '/' ("gsm8k/17", "r3"), control
 * characters shown as '?' so that messages stay on one line. */
static void key_to_name(const char *key, size_t len, char *out, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i + 1 < len;) {
        char tag = key[i];
        size_t seg = (unsigned char)key[i + 1];
        i += 2;
        MOESIM_ASSERT(i + seg <= len);
        if (tag != 'n') {
            if (n && n + 1 < cap) out[n++] = '/';
            for (size_t j = 0; j < seg && n + 1 < cap; j++)
                out[n++] = (unsigned char)key[i + j] < 0x20 ? '?' : key[i + j];
        }
        i += seg;
    }
    out[n] = '\0';
}

static uint32_t request_find_or_add(importer *x, const import_record *r) {
    if (x->last_req != UINT32_MAX) {
        const import_request *q = &x->reqs[x->last_req];
        if (q->key_len == r->key.len && !memcmp(x->keys + q->key_off, r->key.bytes, r->key.len))
            return x->last_req;
    }
    uint64_t h = hash_fnv1a64(r->key.bytes, r->key.len, MOESIM_FNV1A64_INIT);
    if (x->table_cap) {
        uint32_t mask = x->table_cap - 1;
        for (uint32_t s = (uint32_t)h & mask; x->table[s]; s = (s + 1) & mask) {
            const import_request *q = &x->reqs[x->table[s] - 1];
            if (q->hash == h && q->key_len == r->key.len &&
                !memcmp(x->keys + q->key_off, r->key.bytes, r->key.len))
                return x->last_req = x->table[s] - 1;
        }
    }
    if (x->n_reqs == x->cap_reqs) {
        x->cap_reqs = x->cap_reqs ? 2 * x->cap_reqs : 64;
        x->reqs = moesim_xrealloc(x->reqs, x->cap_reqs * sizeof *x->reqs);
    }
    if (x->keys_len + r->key.len > x->keys_cap) {
        x->keys_cap = 2 * (x->keys_cap + r->key.len);
        x->keys = moesim_xrealloc(x->keys, x->keys_cap);
    }
    uint32_t idx = x->n_reqs++;
    import_request *q = &x->reqs[idx];
    memset(q, 0, sizeof *q);
    q->key_off = x->keys_len;
    q->key_len = r->key.len;
    q->hash = h;
    memcpy(x->keys + x->keys_len, r->key.bytes, r->key.len);
    x->keys_len += r->key.len;
    key_to_name(r->key.bytes, r->key.len, q->name, sizeof q->name);
    q->last_token = NO_TOKEN;
    if (2 * (uint64_t)x->n_reqs >= x->table_cap) { /* grow and rehash at half load */
        free(x->table);
        x->table_cap = x->table_cap ? 2 * x->table_cap : 256;
        x->table = moesim_xcalloc(x->table_cap, sizeof *x->table);
        for (uint32_t i = 0; i < x->n_reqs; i++) table_insert(x, i);
    } else {
        table_insert(x, idx);
    }
    return x->last_req = idx;
}

/* ---- tokens ------------------------------------------------------------------------------ */

static uint64_t token_add(importer *x, uint32_t req, uint32_t pos, uint8_t phase) {
    if (x->n_tokens == x->cap_tokens) {
        uint64_t cap = x->cap_tokens ? 2 * x->cap_tokens : 1024;
        size_t row = (size_t)x->L * x->k;
        x->tok_request = moesim_xrealloc(x->tok_request, cap * sizeof *x->tok_request);
        x->tok_pos = moesim_xrealloc(x->tok_pos, cap * sizeof *x->tok_pos);
        x->tok_phase = moesim_xrealloc(x->tok_phase, cap * sizeof *x->tok_phase);
        x->tok_line = moesim_xrealloc(x->tok_line, cap * sizeof *x->tok_line);
        x->tok_layers = moesim_xrealloc(x->tok_layers, cap * sizeof *x->tok_layers);
        x->ids = moesim_xrealloc(x->ids, cap * row * sizeof *x->ids);
        x->gates = moesim_xrealloc(x->gates, cap * row * sizeof *x->gates);
        x->cap_tokens = cap;
    }
    uint64_t t = x->n_tokens++;
    size_t row = (size_t)x->L * x->k;
    x->tok_request[t] = req;
    x->tok_pos[t] = pos;
    x->tok_phase[t] = phase;
    x->tok_line[t] = x->line;
    x->tok_layers[t] = 0;
    memset(x->ids + t * row, 0xFF, row * sizeof *x->ids); /* TRACE_NO_EXPERT */
    memset(x->gates + t * row, 0, row * sizeof *x->gates);
    return t;
}

/* "ids[3]": a field with its index, in `buf`. CSV fields are columns ("expert_3"). */
static const char *field_at(char *buf, size_t cap, const char *field, uint32_t j) {
    bool csv = !strcmp(field, "expert") || !strcmp(field, "gate");
    snprintf(buf, cap, csv ? "%s_%" PRIu32 : "%s[%" PRIu32 "]", field, j);
    return buf;
}

/* Places one record (every value checked against the model). */
static moesim_status import_add(importer *x, import_record *r) {
    const import_fields *f = x->f;
    const char *model = x->m->name;

    /* phase: every record of a file says it, or none does */
    int has_phase = r->phase >= 0;
    if (x->has_phase < 0) {
        x->has_phase = has_phase;
        x->phase_line = x->line;
        if (has_phase && x->o->prefill_tokens_set)
            return rec_fail(x, f->phase,
                            "the records carry their phase; --prefill-tokens does not apply");
    } else if (has_phase != x->has_phase) {
        return rec_fail(x, f->phase,
                        has_phase ? "present, but the records before it (line %" PRIu64
                                    ") carry no phase (all records or none)"
                                  : "missing, but the records before it (line %" PRIu64
                                    ") carry one (all records or none)",
                        x->phase_line);
    }

    /* layer */
    uint32_t l;
    if (x->o->layers == TRACE_LAYERS_MOE) {
        if (r->layer >= x->L)
            return rec_fail(x, f->layer,
                            "layer %" PRIu64 " >= %" PRIu32 " MoE layers of %s (--layers moe "
                            "counts MoE layers from 0)",
                            r->layer, x->L, model);
        l = (uint32_t)r->layer;
    } else {
        if (r->layer >= x->m->n_layers)
            return rec_fail(x, f->layer, "layer %" PRIu64 " >= %" PRIu32 " layers of %s", r->layer,
                            x->m->n_layers, model);
        if (x->moe_index[r->layer] < 0)
            return rec_fail(x, f->layer,
                            "layer %" PRIu64 " of %s is a dense layer, not an MoE layer "
                            "(--layers model)",
                            r->layer, model);
        l = (uint32_t)x->moe_index[r->layer];
    }

    /* routing values */
    if (r->n_ids != x->k)
        return rec_fail(x, f->ids, "%" PRIu32 " expert ids, expected top_k = %" PRIu32 " (%s)",
                        r->n_ids, x->k, model);
    if (r->n_gates != r->n_ids)
        return rec_fail(x, f->gates, "%" PRIu32 " gate weights for %" PRIu32 " expert ids",
                        r->n_gates, r->n_ids);
    double sum = 0;
    char fld[48];
    for (uint32_t j = 0; j < x->k; j++) {
        if (r->ids[j] >= x->E)
            return rec_fail(x, field_at(fld, sizeof fld, f->ids, j),
                            "expert id %" PRIu64 " >= %" PRIu32 " experts (%s)", r->ids[j], x->E,
                            model);
        for (uint32_t a = 0; a < j; a++)
            if (r->ids[a] == r->ids[j])
                return rec_fail(x, field_at(fld, sizeof fld, f->ids, j),
                                "expert %" PRIu64 " appears twice (also at [%" PRIu32 "])",
                                r->ids[j], a);
        float g = r->gates[j];
        if (!isfinite(g))
            return rec_fail(x, field_at(fld, sizeof fld, f->gates, j), "gate weight is not finite");
        if (g < 0.0f)
            return rec_fail(x, field_at(fld, sizeof fld, f->gates, j), "gate weight %g is negative",
                            (double)g);
        if (g > 1.0f)
            return rec_fail(x, field_at(fld, sizeof fld, f->gates, j), "gate weight %g > 1",
                            (double)g);
        sum += g;
    }
    const double tol = TRACE_IMPORT_GATE_SUM_TOLERANCE;
    if (x->m->gate_norm == GATE_SOFTMAX_TOPK) {
        if (x->o->renormalize) {
            if (!(sum > 0))
                return rec_fail(x, f->gates, "gate weights sum to 0: cannot renormalize");
            bool changed = false;
            for (uint32_t j = 0; j < x->k; j++) {
                float g = (float)(r->gates[j] / sum);
                changed |= g != r->gates[j];
                r->gates[j] = g;
            }
            x->rep->renormalized_records += changed;
        } else if (fabs(sum - 1.0) > tol) {
            return rec_fail(x, f->gates,
                            "gate weights sum to %.6g, expected 1 +- %g (%s: softmax over the "
                            "top-k); --renormalize rescales them",
                            sum, tol, model);
        }
    } else if (sum > 1.0 + tol) {
        return rec_fail(x, f->gates,
                        "gate weights sum to %.6g, expected at most 1 + %g (%s: softmax over "
                        "all experts)",
                        sum, tol, model);
    }

    /* request and token */
    uint32_t ri = request_find_or_add(x, r);
    import_request *q = &x->reqs[ri];
    uint64_t t;
    if (q->last_token != NO_TOKEN && x->tok_pos[q->last_token] == r->token_idx) {
        t = q->last_token;
        if (has_phase && r->phase != x->tok_phase[t])
            return rec_fail(x, f->phase,
                            "'%s', but earlier records of token_idx %" PRIu64
                            " of request '%s' say '%s'",
                            trace_phase_name((uint8_t)r->phase), r->token_idx, q->name,
                            trace_phase_name(x->tok_phase[t]));
    } else if (q->last_token == NO_TOKEN || r->token_idx > x->tok_pos[q->last_token]) {
        uint8_t phase = has_phase                             ? (uint8_t)r->phase
                        : r->token_idx < x->o->prefill_tokens ? TRACE_PREFILL
                                                              : TRACE_DECODE;
        if (phase == TRACE_PREFILL && q->decoded)
            return rec_fail(x, f->phase,
                            "prefill token_idx %" PRIu64 " after a decode token of request '%s'",
                            r->token_idx, q->name);
        t = token_add(x, ri, (uint32_t)r->token_idx, phase);
        q->last_token = t;
        q->decoded |= phase == TRACE_DECODE;
    } else {
        return rec_fail(x, f->token,
                        "token_idx %" PRIu64 " after token_idx %" PRIu32 " of request '%s' "
                        "(line %" PRIu64 "): token_idx must not decrease within a request (the "
                        "records of a token come together)",
                        r->token_idx, x->tok_pos[q->last_token], q->name,
                        x->tok_line[q->last_token]);
    }

    size_t at = ((size_t)t * x->L + l) * x->k;
    if (x->ids[at] != TRACE_NO_EXPERT)
        return rec_fail(x, f->layer,
                        "second record for layer %" PRIu64 " of token_idx %" PRIu64
                        " of request '%s'",
                        r->layer, r->token_idx, q->name);
    for (uint32_t j = 0; j < x->k; j++) {
        x->ids[at + j] = (uint16_t)r->ids[j];
        x->gates[at + j] = r->gates[j];
    }
    x->tok_layers[t]++;
    x->rep->records++;
    return MOESIM_OK;
}

/* ---- JSONL ------------------------------------------------------------------------------- */

enum jkey {
    JK_DATASET,
    JK_PROBLEM_ID,
    JK_REQ_ID,
    JK_TOKEN_IDX,
    JK_LAYER,
    JK_EXPERTS,
    JK_GATING_PROBS,
    JK_TOPK_IDS,
    JK_TOPK_WEIGHTS,
    JK_PHASE,
    JK_COUNT
};
static const char *const jkey_names[JK_COUNT] = {
    "dataset", "problem_id",   "req_id",   "token_idx",    "layer",
    "experts", "gating_probs", "topk_ids", "topk_weights", "phase"};
#define JBIT(k) (1u << (k))
#define PROBLEM_KEYS                                                                               \
    (JBIT(JK_DATASET) | JBIT(JK_PROBLEM_ID) | JBIT(JK_EXPERTS) | JBIT(JK_GATING_PROBS))
#define REQUEST_KEYS (JBIT(JK_REQ_ID) | JBIT(JK_TOPK_IDS) | JBIT(JK_TOPK_WEIGHTS))
#define PROBLEM_REQUIRED                                                                           \
    (JBIT(JK_PROBLEM_ID) | JBIT(JK_TOKEN_IDX) | JBIT(JK_LAYER) | JBIT(JK_EXPERTS) |                \
     JBIT(JK_GATING_PROBS))
#define REQUEST_REQUIRED                                                                           \
    (JBIT(JK_REQ_ID) | JBIT(JK_TOKEN_IDX) | JBIT(JK_LAYER) | JBIT(JK_TOPK_IDS) |                   \
     JBIT(JK_TOPK_WEIGHTS))

static int jkey_lookup(const char *k, size_t n) {
    static const unsigned char len[JK_COUNT] = {7, 10, 6, 9, 5, 7, 12, 8, 12, 5};
    for (int i = 0; i < JK_COUNT; i++)
        if (len[i] == n && !memcmp(jkey_names[i], k, n)) return i;
    return -1;
}

static moesim_status syntax_fail(importer *x, const char *field, const text_scan *s,
                                 const char *line) {
    return rec_fail(x, field, "column %zu: %s", (size_t)(s->p - line) + 1,
                    s->why ? s->why : "unexpected input");
}

/* A JSON array of non-negative integers (ids) or numbers (gates). */
static moesim_status scan_array(importer *x, text_scan *s, const char *line, const char *field,
                                bool gates, import_record *r) {
    uint32_t n = 0;
    if (!text_scan_char(s, '[', "expected an array")) return syntax_fail(x, field, s, line);
    text_scan_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
    } else {
        for (;;) {
            text_scan_ws(s);
            bool ok;
            if (gates) {
                if (s->p < s->end && (*s->p == 'N' || *s->p == 'I' ||
                                      (*s->p == '-' && s->end - s->p > 1 && s->p[1] == 'I'))) {
                    char where[80];
                    snprintf(where, sizeof where, "%s[%" PRIu32 "]", field, n);
                    return rec_fail(x, where,
                                    "NaN or Infinity is not a gate weight (nor valid JSON)");
                }
                float g;
                ok = text_scan_float(s, &g);
                if (ok && n < TRACE_MAX_TOP_K) r->gates[n] = g;
            } else {
                uint64_t v;
                ok = text_scan_uint(s, UINT64_MAX, &v);
                if (ok && n < TRACE_MAX_TOP_K) r->ids[n] = v;
            }
            if (!ok) {
                char where[80];
                snprintf(where, sizeof where, "%s[%" PRIu32 "]", field, n);
                return syntax_fail(x, where, s, line);
            }
            n++;
            text_scan_ws(s);
            if (s->p < s->end && *s->p == ',') {
                s->p++;
                continue;
            }
            if (s->p < s->end && *s->p == ']') {
                s->p++;
                break;
            }
            s->why = "expected ',' or ']' in the array";
            return syntax_fail(x, field, s, line);
        }
    }
    if (gates)
        r->n_gates = n;
    else
        r->n_ids = n;
    return MOESIM_OK;
}

/* Appends a segment to the request key: tag ('s' string, 'i' integer, 'd' dataset, 'n' no
 * dataset), length byte, bytes. */
static void key_append(request_key *k, char tag, const char *bytes, size_t n) {
    MOESIM_ASSERT(n <= REQUEST_PART_MAX && k->len + 2 + n <= sizeof k->bytes);
    k->bytes[k->len++] = tag;
    k->bytes[k->len++] = (char)(unsigned char)n;
    memcpy(k->bytes + k->len, bytes, n);
    k->len += n;
}

/* A request identifier: a JSON string or integer, appended to the key. */
static moesim_status scan_request_part(importer *x, text_scan *s, const char *line,
                                       const char *field, request_key *k) {
    text_scan_ws(s);
    char buf[REQUEST_PART_MAX];
    size_t n;
    char tag;
    if (s->p < s->end && *s->p == '"') {
        bool cut;
        if (!text_scan_string(s, buf, sizeof buf, &n, &cut)) return syntax_fail(x, field, s, line);
        if (cut) return rec_fail(x, field, "longer than %d bytes", REQUEST_PART_MAX);
        tag = 's';
    } else {
        const char *start;
        bool integer;
        if (!text_scan_number(s, &start, &integer)) {
            s->why = "expected a string or an integer";
            return syntax_fail(x, field, s, line);
        }
        if (!integer) return rec_fail(x, field, "expected a string or an integer, got a fraction");
        n = (size_t)(s->p - start);
        if (n > REQUEST_PART_MAX)
            return rec_fail(x, field, "longer than %d digits", REQUEST_PART_MAX);
        memcpy(buf, start, n);
        tag = 'i';
    }
    key_append(k, tag, buf, n);
    return MOESIM_OK;
}

static void note_ignored_key(importer *x, const char *k, size_t n) {
    trace_import_report *rep = x->rep;
    char name[40];
    snprintf(name, sizeof name, "%.*s", (int)(n < 32 ? n : 32), k);
    /* list each name once, as long as there is room */
    size_t len = strlen(rep->ignored_keys);
    const char *p = rep->ignored_keys;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t l = comma ? (size_t)(comma - p) : strlen(p);
        if (l == strlen(name) && !memcmp(p, name, l)) return;
        p = comma ? comma + 1 : p + l;
    }
    if (len + strlen(name) + 2 < sizeof rep->ignored_keys)
        snprintf(rep->ignored_keys + len, sizeof rep->ignored_keys - len, "%s%s", len ? "," : "",
                 name);
}

static moesim_status parse_jsonl(importer *x, const char *line, const char *end, import_record *r) {
    text_scan s = {line, end, NULL};
    r->key.len = 0;
    r->phase = -1;
    r->n_ids = r->n_gates = 0;
    unsigned seen = 0;
    bool ignored = false;
    char dataset[REQUEST_PART_MAX];
    size_t dataset_len = 0;
    bool dataset_seen = false;
    request_key id = {.len = 0}; /* problem_id may come before dataset: joined after the object */
    if (!text_scan_char(&s, '{', "expected '{' (one JSON object per line)"))
        return syntax_fail(x, "record", &s, line);
    text_scan_ws(&s);
    if (s.p < s.end && *s.p == '}') {
        s.p++;
    } else {
        for (;;) {
            char key[40];
            size_t klen;
            bool cut;
            if (!text_scan_string(&s, key, sizeof key, &klen, &cut)) {
                if (!s.why || !strcmp(s.why, "expected a string")) s.why = "expected a key";
                return syntax_fail(x, "record", &s, line);
            }
            int jk = cut ? -1 : jkey_lookup(key, klen);
            const char *field = jk >= 0 ? jkey_names[jk] : "record";
            if (!text_scan_char(&s, ':', "expected ':' after the key"))
                return syntax_fail(x, field, &s, line);
            if (jk >= 0 && (seen & JBIT(jk)))
                return rec_fail(x, field, "key appears twice in one record");
            if (jk >= 0) seen |= JBIT(jk);
            moesim_status st = MOESIM_OK;
            uint64_t v;
            switch (jk) {
            case JK_DATASET: {
                bool dcut;
                if (!text_scan_string(&s, dataset, sizeof dataset, &dataset_len, &dcut))
                    return syntax_fail(x, field, &s, line);
                if (dcut) return rec_fail(x, field, "longer than %d bytes", REQUEST_PART_MAX);
                dataset_seen = true;
                break;
            }
            case JK_PROBLEM_ID:
            case JK_REQ_ID:
                st = scan_request_part(x, &s, line, field, &id);
                break;
            case JK_TOKEN_IDX:
                if (!text_scan_uint(&s, UINT32_MAX - 1, &v)) return syntax_fail(x, field, &s, line);
                r->token_idx = v;
                break;
            case JK_LAYER:
                if (!text_scan_uint(&s, UINT32_MAX, &v)) return syntax_fail(x, field, &s, line);
                r->layer = v;
                break;
            case JK_EXPERTS:
            case JK_TOPK_IDS:
                st = scan_array(x, &s, line, field, false, r);
                break;
            case JK_GATING_PROBS:
            case JK_TOPK_WEIGHTS:
                st = scan_array(x, &s, line, field, true, r);
                break;
            case JK_PHASE: {
                char ph[16];
                size_t plen;
                bool pcut;
                if (!text_scan_string(&s, ph, sizeof ph, &plen, &pcut))
                    return syntax_fail(x, field, &s, line);
                if (!pcut && plen == 7 && !memcmp(ph, "prefill", 7))
                    r->phase = TRACE_PREFILL;
                else if (!pcut && plen == 6 && !memcmp(ph, "decode", 6))
                    r->phase = TRACE_DECODE;
                else
                    return rec_fail(x, field, "expected \"prefill\" or \"decode\"");
                break;
            }
            default:
                if (!text_scan_skip_value(&s, 1)) {
                    /* key holds klen bytes (at most sizeof key), no NUL: name it by length */
                    char kname[sizeof key + 4];
                    snprintf(kname, sizeof kname, "%.*s%s",
                             (int)(klen < sizeof key ? klen : sizeof key), key, cut ? "..." : "");
                    return syntax_fail(x, kname, &s, line);
                }
                note_ignored_key(x, key, klen);
                ignored = true;
                break;
            }
            if (st) return st;
            text_scan_ws(&s);
            if (s.p < s.end && *s.p == ',') {
                s.p++;
                continue;
            }
            if (s.p < s.end && *s.p == '}') {
                s.p++;
                break;
            }
            s.why = "expected ',' or '}' after the value";
            return syntax_fail(x, field, &s, line);
        }
    }
    text_scan_ws(&s);
    if (s.p != s.end) {
        s.why = "unexpected characters after the object (one object per line)";
        return syntax_fail(x, "record", &s, line);
    }
    x->rep->ignored_key_records += ignored;

    /* the shape of this record, and of the file */
    unsigned pk = seen & PROBLEM_KEYS, rk = seen & REQUEST_KEYS;
    if (pk && rk) {
        int a = __builtin_ctz(pk), b = __builtin_ctz(rk);
        return rec_fail(x, jkey_names[b],
                        "a key of the request shape in a record that also has '%s' of the "
                        "problem shape",
                        jkey_names[a]);
    }
    trace_jsonl_schema mine = pk   ? TRACE_SCHEMA_PROBLEM
                              : rk ? TRACE_SCHEMA_REQUEST
                                   : TRACE_SCHEMA_AUTO;
    if (x->schema == TRACE_SCHEMA_AUTO) {
        if (mine == TRACE_SCHEMA_AUTO)
            return rec_fail(x, "record",
                            "neither 'problem_id' nor 'req_id': cannot tell the shape of the "
                            "file (see --schema)");
        x->schema = mine;
        x->schema_line = x->line;
        x->f = mine == TRACE_SCHEMA_PROBLEM ? &fields_problem : &fields_request;
        x->rep->schema = schema_name(mine);
    } else if (mine != TRACE_SCHEMA_AUTO && mine != x->schema) {
        unsigned wrong = mine == TRACE_SCHEMA_PROBLEM ? pk : rk;
        char decided[48];
        if (x->schema_line)
            snprintf(decided, sizeof decided, "line %" PRIu64, x->schema_line);
        else
            snprintf(decided, sizeof decided, "--schema %s", schema_name(x->schema));
        return rec_fail(x, jkey_names[__builtin_ctz(wrong)],
                        "a key of the %s shape in a file of the %s shape (%s)", schema_name(mine),
                        schema_name(x->schema), decided);
    }
    unsigned required = x->schema == TRACE_SCHEMA_PROBLEM ? PROBLEM_REQUIRED : REQUEST_REQUIRED;
    if ((seen & required) != required) {
        int missing = __builtin_ctz(required & ~seen);
        return rec_fail(x, jkey_names[missing], "missing key (the %s shape needs %s)",
                        schema_name(x->schema),
                        x->schema == TRACE_SCHEMA_PROBLEM
                            ? "problem_id, token_idx, layer, experts, gating_probs"
                            : "req_id, token_idx, layer, topk_ids, topk_weights");
    }

    /* request key: the dataset (or its absence) first, then the id */
    if (x->schema == TRACE_SCHEMA_PROBLEM)
        key_append(&r->key, dataset_seen ? 'd' : 'n', dataset, dataset_seen ? dataset_len : 0);
    MOESIM_ASSERT(r->key.len + id.len <= sizeof r->key.bytes);
    memcpy(r->key.bytes + r->key.len, id.bytes, id.len);
    r->key.len += id.len;
    return import_add(x, r);
}

/* ---- CSV (as trace export writes it) ----------------------------------------------------- */

/* The header export writes for top-k = k: request_id,position,phase,layer,expert_0..,gate_0.. */
static void csv_header(uint32_t k, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "request_id,position,phase,layer");
    for (uint32_t j = 0; j < k && n < cap; j++)
        n += (size_t)snprintf(out + n, cap - n, ",expert_%" PRIu32, j);
    for (uint32_t j = 0; j < k && n < cap; j++)
        n += (size_t)snprintf(out + n, cap - n, ",gate_%" PRIu32, j);
}

static moesim_status parse_csv_header(importer *x, const char *line, const char *end) {
    char want[2048];
    csv_header(x->k, want, sizeof want);
    if (end > line && end[-1] == '\r') end--;
    size_t n = (size_t)(end - line);
    if (n == strlen(want) && !memcmp(line, want, n)) return MOESIM_OK;
    /* name the first column that differs */
    const char *a = line, *b = want;
    for (uint32_t col = 1;; col++) {
        const char *ae = memchr(a, ',', (size_t)(end - a)), *be = strchr(b, ',');
        if (!ae) ae = end;
        if (!be) be = b + strlen(b);
        if (ae - a != be - b || memcmp(a, b, (size_t)(ae - a)))
            return rec_fail(x, "header",
                            "column %" PRIu32 " is '%.*s', expected '%.*s' (CSV of a top-%" PRIu32
                            " model: %s)",
                            col, (int)(ae - a < 40 ? ae - a : 40), a, (int)(be - b), b, x->k,
                            x->m->name);
        if (ae == end || !*be)
            return rec_fail(x, "header", "%s columns, expected %" PRIu32 " (top-%" PRIu32 ")",
                            ae == end ? "too few" : "too many", 4 + 2 * x->k, x->k);
        a = ae + 1;
        b = be + 1;
    }
}

/* The header name of CSV column c (0-based). */
static const char *csv_column_name(const importer *x, uint32_t c, char *buf, size_t cap) {
    static const char *const fixed[4] = {"request_id", "position", "phase", "layer"};
    if (c < 4) return fixed[c];
    snprintf(buf, cap, "%s_%" PRIu32, c < 4 + x->k ? "expert" : "gate", (c - 4) % x->k);
    return buf;
}

static moesim_status parse_csv_row(importer *x, const char *line, const char *end,
                                   import_record *r) {
    if (end > line && end[-1] == '\r') end--;
    const uint32_t cols = 4 + 2 * x->k;
    const char *cell[4 + 2 * TRACE_MAX_TOP_K + 1], *cell_end[4 + 2 * TRACE_MAX_TOP_K + 1];
    uint32_t n = 0;
    for (const char *p = line;; n++) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        if (n < cols) {
            cell[n] = p;
            cell_end[n] = c ? c : end;
        }
        if (!c) break;
        p = c + 1;
    }
    n++;
    if (n != cols) return rec_fail(x, "row", "%" PRIu32 " columns, expected %" PRIu32, n, cols);
    r->key.len = 0;
    r->n_ids = r->n_gates = x->k;
    char colname[32];
    for (uint32_t c = 0; c < cols; c++) {
        text_scan s = {cell[c], cell_end[c], NULL};
        bool ok = true;
        uint64_t v = 0;
        if (c == 2) {
            size_t len = (size_t)(s.end - s.p);
            if (len == 7 && !memcmp(s.p, "prefill", 7))
                r->phase = TRACE_PREFILL;
            else if (len == 6 && !memcmp(s.p, "decode", 6))
                r->phase = TRACE_DECODE;
            else
                return rec_fail(x, csv_column_name(x, c, colname, sizeof colname),
                                "expected prefill or decode");
            continue;
        }
        if (c >= 4 + x->k) {
            ok = text_scan_float(&s, &r->gates[c - 4 - x->k]);
        } else {
            ok = text_scan_uint(&s, c == 1 ? UINT32_MAX - 1 : UINT32_MAX, &v);
        }
        if (ok && s.p != s.end) {
            ok = false;
            s.why = "unexpected characters after the number";
        }
        if (!ok)
            return rec_fail(x, csv_column_name(x, c, colname, sizeof colname),
                            "'%.*s' is not a %s (%s)",
                            (int)(cell_end[c] - cell[c] < 40 ? cell_end[c] - cell[c] : 40), cell[c],
                            c >= 4 + x->k ? "number" : "non-negative integer", s.why);
        if (c == 0) {
            key_append(&r->key, 'i', cell[0], (size_t)(cell_end[0] - cell[0])); /* <= 10 digits */
        } else if (c == 1) {
            r->token_idx = v;
        } else if (c == 3) {
            r->layer = v;
        } else {
            r->ids[c - 4] = v;
        }
    }
    return import_add(x, r);
}

/* ---- the formats: one parser per format, indexed by trace_text_format ---------------------- */

typedef struct import_format {
    const char *name;
    /* checks the first line (NULL: the format has no header) */
    moesim_status (*header)(importer *x, const char *line, const char *end);
    /* parses one non-blank line [line, end) into r and places it (import_add) */
    moesim_status (*record)(importer *x, const char *line, const char *end, import_record *r);
} import_format;

static const import_format import_formats[] = {
    [TRACE_TEXT_JSONL] = {"jsonl", NULL, parse_jsonl},
    [TRACE_TEXT_CSV] = {"csv", parse_csv_header, parse_csv_row},
};

/* ---- lines ------------------------------------------------------------------------------- */

static bool line_is_blank(const char *p, const char *end) {
    for (; p < end; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r') return false;
    return true;
}

/* Reads the file in chunks and hands each line to the parser. */
static moesim_status import_lines(importer *x, FILE *fp, uint64_t file_bytes) {
    size_t cap = READ_CHUNK_BYTES, len = 0, pos = 0;
    char *buf = moesim_xmalloc(cap);
    bool eof = false;
    uint64_t consumed = 0;
    import_record *r = moesim_xmalloc(sizeof *r);
    progress bar;
    progress_begin(&bar, "import", file_bytes, x->o->progress);
    moesim_status st = MOESIM_OK;
    for (;;) {
        char *nl = pos < len ? memchr(buf + pos, '\n', len - pos) : NULL;
        if (!nl && !eof) {
            memmove(buf, buf + pos, len - pos);
            consumed += pos;
            len -= pos;
            pos = 0;
            if (len == cap) {
                cap *= 2;
                buf = moesim_xrealloc(buf, cap);
            }
            size_t got = fread(buf + len, 1, cap - len, fp);
            if (got == 0) {
                if (ferror(fp)) {
                    st = moesim_fail(x->err, MOESIM_EIO, "%s: read error: %s", x->path,
                                     strerror(errno));
                    break;
                }
                eof = true;
            }
            len += got;
            progress_update(&bar, consumed + len);
            continue;
        }
        if (!nl && pos == len) break; /* end of file after a newline */
        const char *line = buf + pos, *end = nl ? nl : buf + len;
        pos = nl ? (size_t)(nl - buf) + 1 : len;
        x->line++;
        x->rep->lines++;
        const import_format *fmt = &import_formats[x->o->format];
        if (fmt->header && x->line == 1) {
            st = fmt->header(x, line, end);
        } else if (line_is_blank(line, end)) {
            x->rep->blank_lines++;
            continue;
        } else {
            st = fmt->record(x, line, end, r);
        }
        if (st) break;
    }
    progress_end(&bar);
    free(r);
    free(buf);
    return st;
}

/* ---- finishing --------------------------------------------------------------------------- */

static bool token_same_routing(const importer *x, uint64_t a, uint64_t b) {
    size_t row = (size_t)x->L * x->k;
    return !memcmp(x->ids + a * row, x->ids + b * row, row * sizeof *x->ids) &&
           !memcmp(x->gates + a * row, x->gates + b * row, row * sizeof *x->gates);
}

static char *import_params_json(const importer *x) {
    const trace_import_options *o = x->o;
    json_t *j = json_object();
    json_object_set_new(j, "importer", json_string(trace_text_format_name(o->format)));
    json_object_set_new(j, "input", json_string(x->path));
    json_object_set_new(j, "schema", json_string(x->rep->schema));
    json_object_set_new(j, "incomplete",
                        json_string(o->incomplete == TRACE_INCOMPLETE_DROP ? "drop" : "keep"));
    json_object_set_new(j, "layers",
                        json_string(o->layers == TRACE_LAYERS_MODEL ? "model" : "moe"));
    json_object_set_new(j, "phase_source", json_string(x->rep->phase_source));
    json_object_set_new(j, "prefill_tokens", json_integer(o->prefill_tokens));
    json_object_set_new(j, "constant_run_min", json_integer(o->constant_run_min));
    json_object_set_new(j, "drop_constant_runs", json_boolean(o->drop_constant_runs));
    json_object_set_new(j, "renormalize", json_boolean(o->renormalize));
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    MOESIM_ASSERT(s);
    char *copy = moesim_xstrdup(s); /* trace_destroy frees with free(), jansson's may differ */
    free(s);
    return copy;
}

static moesim_status import_finish(importer *x, trace **out) {
    trace_import_report *rep = x->rep;
    const trace_import_options *o = x->o;
    if (x->n_tokens == 0)
        return moesim_fail(x->err, MOESIM_EINPUT, "%s: no records (%" PRIu64 " lines read)",
                           x->path, rep->lines);
    rep->requests_read = x->n_reqs;
    rep->tokens_read = x->n_tokens;
    rep->phase_source = x->has_phase            ? "records"
                        : o->prefill_tokens_set ? "--prefill-tokens"
                                                : "default (all decode)";
    uint8_t *drop = moesim_xcalloc(x->n_tokens, 1); /* [n_tokens] 0 keep, 1 incomplete, 2 run */
    for (uint64_t t = 0; t < x->n_tokens; t++) {
        if (x->tok_layers[t] < x->L) {
            rep->tokens_incomplete++;
            rep->rows_missing += x->L - x->tok_layers[t];
            if (o->incomplete == TRACE_INCOMPLETE_DROP) drop[t] = 1;
        }
    }
    /* constant runs: consecutive tokens (execution order) with identical routing */
    for (uint64_t a = 0; a < x->n_tokens;) {
        uint64_t b = a + 1;
        while (b < x->n_tokens && token_same_routing(x, b - 1, b)) b++;
        if (b - a >= o->constant_run_min) {
            rep->constant_runs++;
            rep->constant_run_tokens += b - a;
            if (rep->runs_listed < TRACE_IMPORT_RUNS_LISTED) {
                trace_import_run *run = &rep->runs[rep->runs_listed++];
                snprintf(run->request, sizeof run->request, "%s", x->reqs[x->tok_request[a]].name);
                run->first_token_idx = x->tok_pos[a];
                run->line = x->tok_line[a];
                run->tokens = b - a;
            }
            if (o->drop_constant_runs)
                for (uint64_t t = a; t < b; t++)
                    if (!drop[t]) drop[t] = 2;
        }
        a = b;
    }
    uint64_t kept = 0;
    for (uint64_t t = 0; t < x->n_tokens; t++) {
        if (drop[t] == 1) rep->tokens_dropped_incomplete++;
        if (drop[t] == 2) rep->tokens_dropped_constant++;
        if (drop[t])
            rep->records_dropped += x->tok_layers[t];
        else
            kept++;
    }
    if (kept == 0) {
        free(drop);
        return moesim_fail(x->err, MOESIM_EINPUT,
                           "%s: every token was dropped (%" PRIu64 " incomplete, %" PRIu64
                           " in constant runs): nothing to write",
                           x->path, rep->tokens_dropped_incomplete, rep->tokens_dropped_constant);
    }

    trace_meta meta = {0};
    trace_meta_from_model(&meta, x->m);
    snprintf(meta.source, sizeof meta.source, "import:%s", trace_text_format_name(o->format));
    snprintf(meta.tool_version, sizeof meta.tool_version, "%s", MOESIM_VERSION);
    trace *t = trace_try_create(&meta, kept);
    if (!t) {
        free(drop);
        return moesim_fail(x->err, MOESIM_ENOMEM,
                           "%s: out of memory for a trace of %" PRIu64 " tokens", x->path, kept);
    }
    uint32_t *renum = moesim_xcalloc(x->n_reqs, sizeof *renum);
    for (uint32_t q = 0; q < x->n_reqs; q++) renum[q] = UINT32_MAX;
    uint32_t next = 0;
    const size_t row = (size_t)x->L * x->k;
    uint64_t i = 0;
    for (uint64_t s = 0; s < x->n_tokens; s++) {
        if (drop[s]) continue;
        uint32_t q = x->tok_request[s];
        if (renum[q] == UINT32_MAX) renum[q] = next++;
        t->request_id[i] = renum[q];
        t->position[i] = x->tok_pos[s];
        t->phase[i] = x->tok_phase[s];
        memcpy(t->expert_ids + i * row, x->ids + s * row, row * sizeof *x->ids);
        memcpy(t->gate_weights + i * row, x->gates + s * row, row * sizeof *x->gates);
        if (t->phase[i] == TRACE_PREFILL)
            rep->prefill_tokens++;
        else
            rep->decode_tokens++;
        rep->records_kept += x->tok_layers[s];
        rep->rows_unrecorded_kept += x->L - x->tok_layers[s];
        i++;
    }
    free(renum);
    free(drop);
    rep->requests_kept = next;
    rep->tokens_kept = kept;
    t->params_json = import_params_json(x);
    moesim_status st = trace_finish(t, x->path, x->err);
    if (st) {
        trace_destroy(t);
        return st;
    }
    *out = t;
    return MOESIM_OK;
}

moesim_status trace_import_file(const char *path, const model_geometry *m,
                                const trace_import_options *o, trace **out,
                                trace_import_report *rep, moesim_error *err) {
    *out = NULL;
    memset(rep, 0, sizeof *rep);
    MOESIM_ASSERT(o->constant_run_min >= 2);
    MOESIM_ASSERT(m->n_moe_layers >= 1 && m->top_k >= 1 && m->top_k <= TRACE_MAX_TOP_K);
    if (o->renormalize && m->gate_norm != GATE_SOFTMAX_TOPK)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: --renormalize: gates of %s are a softmax over all experts; their "
                           "top-k sum has no fixed value to rescale to",
                           m->name, m->name);
    importer x = {.path = path,
                  .m = m,
                  .o = o,
                  .rep = rep,
                  .err = err,
                  .has_phase = -1,
                  .last_req = UINT32_MAX};
    x.L = m->n_moe_layers;
    x.E = m->n_experts;
    x.k = m->top_k;
    for (uint32_t l = 0, j = 0; l < MODEL_MAX_LAYERS; l++)
        x.moe_index[l] = l < m->n_layers && m->is_moe_layer[l] ? (int32_t)j++ : -1;
    if (o->format == TRACE_TEXT_CSV) {
        x.f = &fields_csv;
        rep->schema = "csv";
    } else {
        x.schema = o->schema;
        x.f = o->schema == TRACE_SCHEMA_PROBLEM ? &fields_problem : &fields_request;
        rep->schema = schema_name(o->schema);
    }

    struct stat sb;
    if (stat(path, &sb) != 0)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return moesim_fail(err, MOESIM_EIO, "%s: is a directory, expected a %s file", path,
                           trace_text_format_name(o->format));
    FILE *fp = fopen(path, "rb");
    if (!fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    moesim_status st = import_lines(&x, fp, (uint64_t)sb.st_size);
    fclose(fp);
    if (!st) st = import_finish(&x, out);
    importer_free(&x);
    return st;
}

const char *trace_text_format_name(trace_text_format f) {
    MOESIM_ASSERT((size_t)f < MOESIM_ARRAY_LEN(import_formats));
    return import_formats[f].name;
}

/* ---- report ------------------------------------------------------------------------------ */

json_t *trace_import_report_to_json(const trace_import_report *rep) {
    json_t *j = json_object();
#define U64(key, v) json_object_set_new(j, key, json_integer((json_int_t)(v)))
    json_object_set_new(j, "schema", json_string(rep->schema ? rep->schema : ""));
    U64("lines", rep->lines);
    U64("blank_lines", rep->blank_lines);
    U64("records", rep->records);
    U64("requests_read", rep->requests_read);
    U64("tokens_read", rep->tokens_read);
    U64("ignored_key_records", rep->ignored_key_records);
    json_t *keys = json_array();
    for (const char *p = rep->ignored_keys; *p;) {
        const char *c = strchr(p, ',');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        json_array_append_new(keys, json_stringn(p, n));
        p += n + (c != NULL);
    }
    json_object_set_new(j, "ignored_keys", keys);
    U64("renormalized_records", rep->renormalized_records);
    U64("tokens_incomplete", rep->tokens_incomplete);
    U64("rows_missing", rep->rows_missing);
    U64("constant_runs", rep->constant_runs);
    U64("constant_run_tokens", rep->constant_run_tokens);
    json_t *runs = json_array();
    for (uint32_t i = 0; i < rep->runs_listed; i++) {
        json_t *r = json_object();
        json_object_set_new(r, "request", json_string(rep->runs[i].request));
        json_object_set_new(r, "first_token_idx",
                            json_integer((json_int_t)rep->runs[i].first_token_idx));
        json_object_set_new(r, "line", json_integer((json_int_t)rep->runs[i].line));
        json_object_set_new(r, "tokens", json_integer((json_int_t)rep->runs[i].tokens));
        json_array_append_new(runs, r);
    }
    json_object_set_new(j, "runs", runs);
    U64("tokens_dropped_incomplete", rep->tokens_dropped_incomplete);
    U64("tokens_dropped_constant", rep->tokens_dropped_constant);
    U64("records_dropped", rep->records_dropped);
    U64("requests_kept", rep->requests_kept);
    U64("tokens_kept", rep->tokens_kept);
    U64("records_kept", rep->records_kept);
    U64("rows_unrecorded_kept", rep->rows_unrecorded_kept);
    U64("prefill_tokens", rep->prefill_tokens);
    U64("decode_tokens", rep->decode_tokens);
    json_object_set_new(j, "phase_source", json_string(rep->phase_source ? rep->phase_source : ""));
#undef U64
    return j;
}
