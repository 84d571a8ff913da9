/* Text parsers of `moesim trace import`: one line of JSONL (the problem and request shapes, each
 * either one record per (token, layer) or one per token with every layer) or of export's CSV
 * -> one import_record. They check syntax and shape, never place anything (import_group.c
 * does); see traces/import_internal.h and traces/FORMAT.md ("What import reads"). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/check.h"
#include "traces/import_internal.h"
#include "traces/text_scan.h"

const char *import_schema_name(trace_jsonl_schema s) {
    return s == TRACE_SCHEMA_PROBLEM ? "problem" : s == TRACE_SCHEMA_REQUEST ? "request" : "auto";
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
    JK_PROMPT_LEN,
    JK_COUNT
};
static const char *const jkey_names[JK_COUNT] = {
    "dataset",      "problem_id", "req_id",       "token_idx", "layer",     "experts",
    "gating_probs", "topk_ids",   "topk_weights", "phase",     "prompt_len"};
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
    static const unsigned char len[JK_COUNT] = {7, 10, 6, 9, 5, 7, 12, 8, 12, 5, 10};
    for (int i = 0; i < JK_COUNT; i++)
        if (len[i] == n && !memcmp(jkey_names[i], k, n)) return i;
    return -1;
}

static moesim_status syntax_fail(importer *x, const char *field, const text_scan *s,
                                 const char *line) {
    return import_fail(x, field, "column %zu: %s", (size_t)(s->p - line) + 1,
                       s->why ? s->why : "unexpected input");
}

/* A JSON array of non-negative integers (ids, into ids[]) or numbers (gates, into g[]); *count
 * is the element count (only the first TRACE_MAX_TOP_K are stored). */
static moesim_status scan_row(importer *x, text_scan *s, const char *line, const char *field,
                              uint64_t *ids, float *g, uint32_t *count) {
    uint32_t n = 0;
    if (!text_scan_char(s, '[', "expected an array")) return syntax_fail(x, field, s, line);
    text_scan_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        *count = 0;
        return MOESIM_OK;
    }
    for (;;) {
        text_scan_ws(s);
        bool ok;
        if (g) {
            if (s->p < s->end && (*s->p == 'N' || *s->p == 'I' ||
                                  (*s->p == '-' && s->end - s->p > 1 && s->p[1] == 'I'))) {
                char where[80];
                snprintf(where, sizeof where, "%s[%" PRIu32 "]", field, n);
                return import_fail(x, where,
                                   "NaN or Infinity is not a gate weight (nor valid JSON)");
            }
            float v;
            ok = text_scan_float(s, &v);
            if (ok && n < TRACE_MAX_TOP_K) g[n] = v;
        } else {
            uint64_t v;
            ok = text_scan_uint(s, UINT64_MAX, &v);
            if (ok && n < TRACE_MAX_TOP_K) ids[n] = v;
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
    *count = n;
    return MOESIM_OK;
}

/* The routing of a record: a flat array (one layer's top-k) or an array of such arrays (one
 * per MoE layer: a per-token record). *rows: 1 or the number of inner arrays. */
static moesim_status scan_routing(importer *x, text_scan *s, const char *line, const char *field,
                                  bool gates, import_record *r, uint32_t *rows, bool *nested) {
    text_scan_ws(s);
    const char *open = s->p;
    if (!text_scan_char(s, '[', "expected an array")) return syntax_fail(x, field, s, line);
    text_scan_ws(s);
    *nested = s->p < s->end && *s->p == '[';
    if (!*nested) {
        s->p = open;
        *rows = 1;
        return scan_row(x, s, line, field, gates ? NULL : r->ids[0], gates ? r->gates[0] : NULL,
                        gates ? &r->n_gates[0] : &r->n_ids[0]);
    }
    for (uint32_t row = 0;; row++) {
        char name[64];
        snprintf(name, sizeof name, "%s[%" PRIu32 "]", field, row);
        if (row == MODEL_MAX_LAYERS)
            return import_fail(x, name, "more than %d layers", MODEL_MAX_LAYERS);
        moesim_status st =
            scan_row(x, s, line, name, gates ? NULL : r->ids[row], gates ? r->gates[row] : NULL,
                     gates ? &r->n_gates[row] : &r->n_ids[row]);
        if (st) return st;
        text_scan_ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            *rows = row + 1;
            return MOESIM_OK;
        }
        s->why = "expected ',' or ']' after a layer's array";
        return syntax_fail(x, field, s, line);
    }
}

/* A request identifier: a JSON string or integer, appended to the key. */
static moesim_status scan_request_part(importer *x, text_scan *s, const char *line,
                                       const char *field, request_key *k) {
    text_scan_ws(s);
    char buf[IMPORT_REQUEST_PART_MAX];
    size_t n;
    char tag;
    if (s->p < s->end && *s->p == '"') {
        bool cut;
        if (!text_scan_string(s, buf, sizeof buf, &n, &cut)) return syntax_fail(x, field, s, line);
        if (cut) return import_fail(x, field, "longer than %d bytes", IMPORT_REQUEST_PART_MAX);
        tag = 's';
    } else {
        const char *start;
        bool integer;
        if (!text_scan_number(s, &start, &integer)) {
            s->why = "expected a string or an integer";
            return syntax_fail(x, field, s, line);
        }
        if (!integer)
            return import_fail(x, field, "expected a string or an integer, got a fraction");
        n = (size_t)(s->p - start);
        if (n > IMPORT_REQUEST_PART_MAX)
            return import_fail(x, field, "longer than %d digits", IMPORT_REQUEST_PART_MAX);
        memcpy(buf, start, n);
        tag = 'i';
    }
    import_key_append(k, tag, buf, n);
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

moesim_status import_parse_jsonl(importer *x, const char *line, const char *end, import_record *r) {
    text_scan s = {line, end, NULL};
    r->key.len = 0;
    r->phase = -1;
    r->prompt_len = -1;
    uint32_t id_rows = 0, gate_rows = 0;
    bool ids_nested = false, gates_nested = false;
    unsigned seen = 0;
    bool ignored = false;
    char dataset[IMPORT_REQUEST_PART_MAX];
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
                return import_fail(x, field, "key appears twice in one record");
            if (jk >= 0) seen |= JBIT(jk);
            moesim_status st = MOESIM_OK;
            uint64_t v;
            switch (jk) {
            case JK_DATASET: {
                bool dcut;
                if (!text_scan_string(&s, dataset, sizeof dataset, &dataset_len, &dcut))
                    return syntax_fail(x, field, &s, line);
                if (dcut)
                    return import_fail(x, field, "longer than %d bytes", IMPORT_REQUEST_PART_MAX);
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
                st = scan_routing(x, &s, line, field, false, r, &id_rows, &ids_nested);
                break;
            case JK_GATING_PROBS:
            case JK_TOPK_WEIGHTS:
                st = scan_routing(x, &s, line, field, true, r, &gate_rows, &gates_nested);
                break;
            case JK_PROMPT_LEN:
                if (!text_scan_uint(&s, UINT32_MAX, &v)) return syntax_fail(x, field, &s, line);
                r->prompt_len = (int64_t)v;
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
                    return import_fail(x, field, "expected \"prefill\" or \"decode\"");
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
        return import_fail(x, jkey_names[b],
                           "a key of the request shape in a record that also has '%s' of the "
                           "problem shape",
                           jkey_names[a]);
    }
    trace_jsonl_schema mine = pk   ? TRACE_SCHEMA_PROBLEM
                              : rk ? TRACE_SCHEMA_REQUEST
                                   : TRACE_SCHEMA_AUTO;
    if (x->schema == TRACE_SCHEMA_AUTO) {
        if (mine == TRACE_SCHEMA_AUTO)
            return import_fail(x, "record",
                               "neither 'problem_id' nor 'req_id': cannot tell the shape of the "
                               "file (see --schema)");
        x->schema = mine;
        x->schema_line = x->line;
        x->f = mine == TRACE_SCHEMA_PROBLEM ? &import_fields_problem : &import_fields_request;
        x->rep->schema = import_schema_name(mine);
    } else if (mine != TRACE_SCHEMA_AUTO && mine != x->schema) {
        unsigned wrong = mine == TRACE_SCHEMA_PROBLEM ? pk : rk;
        char decided[48];
        if (x->schema_line)
            snprintf(decided, sizeof decided, "line %" PRIu64, x->schema_line);
        else
            snprintf(decided, sizeof decided, "--schema %s", import_schema_name(x->schema));
        return import_fail(x, jkey_names[__builtin_ctz(wrong)],
                           "a key of the %s shape in a file of the %s shape (%s)",
                           import_schema_name(mine), import_schema_name(x->schema), decided);
    }
    /* one array per layer (per-token record) or one layer's array and its "layer" */
    const char *ids_key = x->schema == TRACE_SCHEMA_PROBLEM ? "experts" : "topk_ids";
    const char *gates_key = x->schema == TRACE_SCHEMA_PROBLEM ? "gating_probs" : "topk_weights";
    unsigned required = x->schema == TRACE_SCHEMA_PROBLEM ? PROBLEM_REQUIRED : REQUEST_REQUIRED;
    if (ids_nested) {
        if (seen & JBIT(JK_LAYER))
            return import_fail(x, "layer",
                               "a record with one array per layer in '%s' holds every layer; "
                               "'layer' does not apply",
                               ids_key);
        required &= ~JBIT(JK_LAYER);
    }
    if ((seen & required) != required) {
        int missing = __builtin_ctz(required & ~seen);
        return import_fail(x, jkey_names[missing], "missing key (the %s shape needs %s)",
                           import_schema_name(x->schema),
                           x->schema == TRACE_SCHEMA_PROBLEM
                               ? "problem_id, token_idx, layer, experts, gating_probs"
                               : "req_id, token_idx, layer, topk_ids, topk_weights");
    }
    if (ids_nested && (!gates_nested || id_rows != gate_rows))
        return import_fail(x, gates_key, "%" PRIu32 " arrays for the %" PRIu32 " layers of '%s'",
                           gates_nested ? gate_rows : 0, id_rows, ids_key);
    if (!ids_nested && gates_nested)
        return import_fail(x, gates_key, "one array per layer, but '%s' holds one layer's ids",
                           ids_key);
    r->all_layers = ids_nested;
    r->n_rows = id_rows;

    /* request key: the dataset (or its absence) first, then the id */
    if (x->schema == TRACE_SCHEMA_PROBLEM)
        import_key_append(&r->key, dataset_seen ? 'd' : 'n', dataset,
                          dataset_seen ? dataset_len : 0);
    MOESIM_ASSERT(r->key.len + id.len <= sizeof r->key.bytes);
    memcpy(r->key.bytes + r->key.len, id.bytes, id.len);
    r->key.len += id.len;
    return MOESIM_OK;
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

moesim_status import_parse_csv_header(importer *x, const char *line, const char *end) {
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
            return import_fail(x, "header",
                               "column %" PRIu32
                               " is '%.*s', expected '%.*s' (CSV of a top-%" PRIu32 " model: %s)",
                               col, (int)(ae - a < 40 ? ae - a : 40), a, (int)(be - b), b, x->k,
                               x->m->name);
        if (ae == end || !*be)
            return import_fail(x, "header", "%s columns, expected %" PRIu32 " (top-%" PRIu32 ")",
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

moesim_status import_parse_csv_row(importer *x, const char *line, const char *end,
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
    if (n != cols) return import_fail(x, "row", "%" PRIu32 " columns, expected %" PRIu32, n, cols);
    r->key.len = 0;
    r->all_layers = false;
    r->n_rows = 1;
    r->n_ids[0] = r->n_gates[0] = x->k;
    r->prompt_len = -1;
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
                return import_fail(x, csv_column_name(x, c, colname, sizeof colname),
                                   "expected prefill or decode");
            continue;
        }
        if (c >= 4 + x->k) {
            ok = text_scan_float(&s, &r->gates[0][c - 4 - x->k]);
        } else {
            ok = text_scan_uint(&s, c == 1 ? UINT32_MAX - 1 : UINT32_MAX, &v);
        }
        if (ok && s.p != s.end) {
            ok = false;
            s.why = "unexpected characters after the number";
        }
        if (!ok)
            return import_fail(x, csv_column_name(x, c, colname, sizeof colname),
                               "'%.*s' is not a %s (%s)",
                               (int)(cell_end[c] - cell[c] < 40 ? cell_end[c] - cell[c] : 40),
                               cell[c], c >= 4 + x->k ? "number" : "non-negative integer", s.why);
        if (c == 0) { /* the number's digits, not the cell's text: " 0" is request 0 */
            char digits[24];
            int len = snprintf(digits, sizeof digits, "%" PRIu64, v);
            import_key_append(&r->key, 'i', digits, (size_t)len);
        } else if (c == 1) {
            r->token_idx = v;
        } else if (c == 3) {
            r->layer = v;
        } else {
            r->ids[0][c - 4] = v;
        }
    }
    return MOESIM_OK;
}
