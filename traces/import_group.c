/* Grouping for `moesim trace import`: records in any order -> tokens in execution order -> the
 * trace (traces/import_internal.h has the data flow; traces/FORMAT.md, "Record order", the rules).
 *
 * The grouping buffer is the trace's own routing array, [token][layer][k], grown as new tokens
 * appear: a record's row is written in place as soon as it is read, so memory follows the
 * trace (about 6 k L bytes per token, plus ~60 bytes per token of index), never the log, and
 * the log is read once with no scratch files. A record finds its token by (request, position):
 * first the previous record's token (token-major logs), then, past the request's highest
 * position, a new token; then the token that followed the request's previous token in order of
 * appearance (layer-major logs revisit a request's tokens in the same order, layer after
 * layer), then a hash table, built at the first lookup (a token-major log never needs it). Rows
 * start as TRACE_NO_EXPERT, so a second record for a row is seen at once; the source then finds the
 * first one's line.
 *
 * import_finish orders the tokens: the trace's execution order keeps the file's interleaving
 * of requests (the k-th token of the trace that belongs to request q sits where the k-th
 * distinct token of q first appeared in the file) and puts each request's tokens in position
 * order. A file already in that order (token-major, positions increasing) keeps its order;
 * a layer-major file gives the trace of the same records sorted token-major. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/hash.h"
#include "traces/import_internal.h"
#include "traces/layer_twins.h"

#define PHASE_UNSAID 0xFF

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

void import_key_append(request_key *k, char tag, const char *bytes, size_t n) {
    MOESIM_ASSERT(n <= IMPORT_REQUEST_PART_MAX && k->len + 2 + n <= sizeof k->bytes);
    k->bytes[k->len++] = tag;
    k->bytes[k->len++] = (char)(unsigned char)n;
    memcpy(k->bytes + k->len, bytes, n);
    k->len += n;
}

uint32_t import_request_find_or_add(importer *x, const request_key *key) {
    if (x->last_req != UINT32_MAX) {
        const import_request *q = &x->reqs[x->last_req];
        if (q->key_len == key->len && !memcmp(x->keys + q->key_off, key->bytes, key->len))
            return x->last_req;
    }
    uint64_t h = hash_fnv1a64(key->bytes, key->len, MOESIM_FNV1A64_INIT);
    if (x->table_cap) {
        uint32_t mask = x->table_cap - 1;
        for (uint32_t s = (uint32_t)h & mask; x->table[s]; s = (s + 1) & mask) {
            const import_request *q = &x->reqs[x->table[s] - 1];
            if (q->hash == h && q->key_len == key->len &&
                !memcmp(x->keys + q->key_off, key->bytes, key->len))
                return x->last_req = x->table[s] - 1;
        }
    }
    if (x->n_reqs == x->cap_reqs) {
        x->cap_reqs = x->cap_reqs ? 2 * x->cap_reqs : 64;
        x->reqs = moesim_xrealloc(x->reqs, x->cap_reqs * sizeof *x->reqs);
    }
    if (x->keys_len + key->len > x->keys_cap) {
        x->keys_cap = 2 * (x->keys_cap + key->len);
        x->keys = moesim_xrealloc(x->keys, x->keys_cap);
    }
    uint32_t idx = x->n_reqs++;
    import_request *q = &x->reqs[idx];
    memset(q, 0, sizeof *q);
    q->key_off = x->keys_len;
    q->key_len = key->len;
    q->hash = h;
    memcpy(x->keys + x->keys_len, key->bytes, key->len);
    x->keys_len += key->len;
    key_to_name(key->bytes, key->len, q->name, sizeof q->name);
    q->tail = q->last = IMPORT_NO_TOKEN;
    q->max_pos = -1;
    q->prompt_len = -1;
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

static uint64_t token_key(uint32_t req, uint32_t pos) {
    return ((uint64_t)req << 32 | pos) + 1; /* pos <= UINT32_MAX - 1: never 0 */
}

static void index_insert(importer *x, uint64_t key, uint64_t t) {
    uint64_t mask = x->tok_cap - 1;
    uint64_t s = hash_splitmix64(key) & mask;
    while (x->tok_keys[s]) s = (s + 1) & mask;
    x->tok_keys[s] = key;
    x->tok_vals[s] = t;
}

/* Sizes the index for `n` tokens (load <= 1/2) and files tokens 0..n_tokens-1 in it. */
static void index_build(importer *x, uint64_t n) {
    free(x->tok_keys);
    free(x->tok_vals);
    x->tok_cap = 4096;
    while (x->tok_cap < 2 * n) x->tok_cap *= 2;
    x->tok_keys = moesim_xcalloc(x->tok_cap, sizeof *x->tok_keys);
    x->tok_vals = moesim_xmalloc(x->tok_cap * sizeof *x->tok_vals);
    for (uint64_t t = 0; t < x->n_tokens; t++)
        index_insert(x, token_key(x->tok_request[t], x->tok_pos[t]), t);
}

/* The index is built at the first lookup: a token-major file never needs one. */
static uint64_t index_find(importer *x, uint64_t key) {
    if (!x->tok_cap) index_build(x, x->n_tokens + 1);
    uint64_t mask = x->tok_cap - 1;
    for (uint64_t s = hash_splitmix64(key) & mask; x->tok_keys[s]; s = (s + 1) & mask)
        if (x->tok_keys[s] == key) return x->tok_vals[s];
    return IMPORT_NO_TOKEN;
}

static uint64_t token_add(importer *x, uint32_t req, uint32_t pos) {
    size_t row = (size_t)x->L * x->k;
    if (x->n_tokens == x->cap_tokens) {
        uint64_t cap = x->cap_tokens ? 2 * x->cap_tokens : 1024;
        x->tok_request = moesim_xrealloc(x->tok_request, cap * sizeof *x->tok_request);
        x->tok_pos = moesim_xrealloc(x->tok_pos, cap * sizeof *x->tok_pos);
        x->tok_phase = moesim_xrealloc(x->tok_phase, cap * sizeof *x->tok_phase);
        x->tok_line = moesim_xrealloc(x->tok_line, cap * sizeof *x->tok_line);
        x->tok_next = moesim_xrealloc(x->tok_next, cap * sizeof *x->tok_next);
        x->tok_layers = moesim_xrealloc(x->tok_layers, cap * sizeof *x->tok_layers);
        x->ids = moesim_xrealloc(x->ids, cap * row * sizeof *x->ids);
        x->gates = moesim_xrealloc(x->gates, cap * row * sizeof *x->gates);
        x->cap_tokens = cap;
    }
    if (x->tok_cap && 2 * (x->n_tokens + 1) > x->tok_cap) /* grow and rehash at half load */
        index_build(x, 2 * x->n_tokens);
    uint64_t t = x->n_tokens++;
    x->tok_request[t] = req;
    x->tok_pos[t] = pos;
    x->tok_phase[t] = PHASE_UNSAID;
    x->tok_line[t] = x->line ? x->line : x->arr_token + 1;
    x->tok_next[t] = IMPORT_NO_TOKEN;
    x->tok_layers[t] = 0;
    memset(x->ids + t * row, 0xFF, row * sizeof *x->ids); /* TRACE_NO_EXPERT */
    memset(x->gates + t * row, 0, row * sizeof *x->gates);
    if (x->tok_cap) index_insert(x, token_key(req, pos), t);
    import_request *q = &x->reqs[req];
    if (q->tail != IMPORT_NO_TOKEN) x->tok_next[q->tail] = t;
    q->tail = t;
    return t;
}

/* The token of (req, pos), added at its first record. */
static uint64_t token_find_or_add(importer *x, uint32_t req, uint32_t pos) {
    uint64_t t = x->last_token;
    if (t != IMPORT_NO_TOKEN && x->tok_request[t] == req && x->tok_pos[t] == pos) return t;
    import_request *q = &x->reqs[req];
    if ((int64_t)pos > q->max_pos) { /* past the request's highest position: a new token */
        t = token_add(x, req, pos);
        q->max_pos = pos;
    } else {
        t = x->tok_next[q->last]; /* layer-major: the request's tokens come round in order */
        if (t == IMPORT_NO_TOKEN || x->tok_pos[t] != pos) t = index_find(x, token_key(req, pos));
        if (t == IMPORT_NO_TOKEN) t = token_add(x, req, pos);
    }
    if (t != q->tail) x->rep->records_reordered++;
    q->last = t;
    return x->last_token = t;
}

/* ---- one record -------------------------------------------------------------------------- */

/* "ids[3]": a field with its index, in `buf`. CSV fields are columns ("expert_3"). */
static const char *field_at(char *buf, size_t cap, const char *field, uint32_t j) {
    bool csv = !strcmp(field, "expert") || !strcmp(field, "gate");
    snprintf(buf, cap, csv ? "%s_%" PRIu32 : "%s[%" PRIu32 "]", field, j);
    return buf;
}

/* The MoE layer of row `row` of `r`, or an error. */
static moesim_status row_layer(importer *x, const import_record *r, uint32_t row, uint32_t *l) {
    const char *model = x->m->name;
    if (r->all_layers) { /* row r is MoE layer r, whatever --layers says of "layer" keys */
        char fld[48];
        if (row >= x->L)
            return import_fail(x, field_at(fld, sizeof fld, x->f->ids, row),
                               "layer %" PRIu32 " >= %" PRIu32 " MoE layers of %s (a record with "
                               "one array per layer holds the MoE layers in order)",
                               row, x->L, model);
        *l = row;
        return MOESIM_OK;
    }
    uint64_t layer = r->layer;
    const char *field = x->f->layer;
    if (layer < x->o->layer_base)
        return import_fail(x, field, "layer %" PRIu64 " < --layer-base %" PRIu32, layer,
                           x->o->layer_base);
    layer -= x->o->layer_base;
    if (x->o->layers == TRACE_LAYERS_MOE) {
        if (layer >= x->L)
            return import_fail(x, field,
                               "layer %" PRIu64 " >= %" PRIu32 " MoE layers of %s (--layers moe "
                               "counts MoE layers from 0; --layer-base N for a log counting "
                               "from N)",
                               layer, x->L, model);
        *l = (uint32_t)layer;
        return MOESIM_OK;
    }
    if (layer >= x->m->n_layers)
        return import_fail(x, field,
                           "layer %" PRIu64 " >= %" PRIu32 " layers of %s (--layer-base N for a "
                           "log counting from N)",
                           layer, x->m->n_layers, model);
    if (x->moe_index[layer] < 0)
        return import_fail(x, field,
                           "layer %" PRIu64 " of %s is a dense layer, not an MoE layer "
                           "(--layers model)",
                           layer, model);
    *l = (uint32_t)x->moe_index[layer];
    return MOESIM_OK;
}

/* The field of row `row`'s ids or gates, slot j (j < 0: the whole array), for a message:
 * "topk_ids", "topk_ids[1]", "expert_1" (CSV), or "topk_ids[5][1]" (per-token records: layer
 * 5's array). Built only on the error path. */
static const char *row_field(char *buf, size_t cap, const importer *x, const import_record *r,
                             uint32_t row, bool gates, int j) {
    const char *field = gates ? x->f->gates : x->f->ids;
    char base[48];
    if (r->all_layers) field = field_at(base, sizeof base, field, row);
    if (j < 0)
        snprintf(buf, cap, "%s", field);
    else
        field_at(buf, cap, field, (uint32_t)j);
    return buf;
}

/* Checks the values of row `row` against the model (and renormalizes when asked). */
static moesim_status row_check(importer *x, import_record *r, uint32_t row) {
    const char *model = x->m->name;
    char fld[64];
    if (r->n_ids[row] != x->k)
        return import_fail(x, row_field(fld, sizeof fld, x, r, row, false, -1),
                           "%" PRIu32 " expert ids, expected top_k = %" PRIu32 " (%s)",
                           r->n_ids[row], x->k, model);
    if (r->n_gates[row] != r->n_ids[row])
        return import_fail(x, row_field(fld, sizeof fld, x, r, row, true, -1),
                           "%" PRIu32 " gate weights for %" PRIu32 " expert ids", r->n_gates[row],
                           r->n_ids[row]);
    const uint64_t *ids = r->ids[row];
    float *gates = r->gates[row];
    double sum = 0;
    for (uint32_t j = 0; j < x->k; j++) {
        if (ids[j] >= x->E)
            return import_fail(x, row_field(fld, sizeof fld, x, r, row, false, (int)j),
                               "expert id %" PRIu64 " >= %" PRIu32 " experts (%s)", ids[j], x->E,
                               model);
        for (uint32_t a = 0; a < j; a++)
            if (ids[a] == ids[j])
                return import_fail(x, row_field(fld, sizeof fld, x, r, row, false, (int)j),
                                   "expert %" PRIu64 " appears twice (also at [%" PRIu32 "])",
                                   ids[j], a);
        float g = gates[j];
        if (!isfinite(g))
            return import_fail(x, row_field(fld, sizeof fld, x, r, row, true, (int)j),
                               "gate weight is not finite");
        if (g < 0.0f)
            return import_fail(x, row_field(fld, sizeof fld, x, r, row, true, (int)j),
                               "gate weight %g is negative", (double)g);
        if (g > 1.0f)
            return import_fail(x, row_field(fld, sizeof fld, x, r, row, true, (int)j),
                               "gate weight %g > 1", (double)g);
        sum += g;
    }
    const double tol = TRACE_IMPORT_GATE_SUM_TOLERANCE;
    if (x->m->gate_norm == GATE_SOFTMAX_TOPK) {
        if (x->o->renormalize) {
            if (!(sum > 0))
                return import_fail(x, row_field(fld, sizeof fld, x, r, row, true, -1),
                                   "gate weights sum to 0: cannot renormalize");
            bool changed = false;
            for (uint32_t j = 0; j < x->k; j++) {
                float g = (float)(gates[j] / sum);
                changed |= g != gates[j];
                gates[j] = g;
            }
            x->rep->renormalized_records += changed;
        } else if (fabs(sum - 1.0) > tol) {
            return import_fail(x, row_field(fld, sizeof fld, x, r, row, true, -1),
                               "gate weights sum to %.6g, expected 1 +- %g (%s: softmax over the "
                               "top-k); --renormalize rescales them",
                               sum, tol, model);
        }
    } else if (sum > 1.0 + tol) {
        return import_fail(x, row_field(fld, sizeof fld, x, r, row, true, -1),
                           "gate weights sum to %.6g, expected at most 1 + %g (%s: softmax over "
                           "all experts)",
                           sum, tol, model);
    }
    return MOESIM_OK;
}

/* Phase and prompt length: every record of a file says them, or none does. */
static moesim_status record_meta_check(importer *x, const import_record *r) {
    const import_fields *f = x->f;
    int has_phase = r->phase >= 0;
    if (x->has_phase < 0) {
        x->has_phase = has_phase;
        x->phase_line = x->line;
        if (has_phase && x->o->prefill_tokens_set)
            return import_fail(x, f->phase,
                               "the records carry their phase; --prefill-tokens does not apply");
    } else if (has_phase != x->has_phase) {
        return import_fail(x, f->phase,
                           has_phase ? "present, but the records before it (line %" PRIu64
                                       ") carry no phase (all records or none)"
                                     : "missing, but the records before it (line %" PRIu64
                                       ") carry one (all records or none)",
                           x->phase_line);
    }
    int has_prompt = r->prompt_len >= 0;
    if (x->has_prompt_len < 0) {
        x->has_prompt_len = has_prompt;
        x->prompt_len_line = x->line;
        if (has_prompt && x->o->prefill_tokens_set)
            return import_fail(x, "prompt_len",
                               "the records carry their prompt length; --prefill-tokens does "
                               "not apply");
    } else if (has_prompt != x->has_prompt_len) {
        return import_fail(x, "prompt_len",
                           has_prompt ? "present, but the records before it (line %" PRIu64
                                        ") carry none (all records or none)"
                                      : "missing, but the records before it (line %" PRIu64
                                        ") carry it (all records or none)",
                           x->prompt_len_line);
    }
    return MOESIM_OK;
}

moesim_status import_place(importer *x, import_record *r) {
    moesim_status st = record_meta_check(x, r);
    if (st) return st;
    uint32_t layer[MODEL_MAX_LAYERS];
    for (uint32_t row = 0; row < r->n_rows; row++) {
        if ((st = row_layer(x, r, row, &layer[row]))) return st;
        if ((st = row_check(x, r, row))) return st;
    }

    uint32_t ri = import_request_find_or_add(x, &r->key);
    import_request *q = &x->reqs[ri];
    if (r->prompt_len >= 0) {
        if (q->prompt_len < 0) {
            q->prompt_len = r->prompt_len;
            q->prompt_line = x->line ? x->line : x->arr_token + 1;
        } else if (q->prompt_len != r->prompt_len) {
            return import_fail(x, "prompt_len",
                               "%" PRId64 ", but line %" PRIu64 " gives %" PRId64
                               " for request '%s'",
                               r->prompt_len, q->prompt_line, q->prompt_len, q->name);
        }
    }
    uint64_t t = token_find_or_add(x, ri, (uint32_t)r->token_idx);
    if (r->phase >= 0) {
        if (x->tok_phase[t] == PHASE_UNSAID) {
            x->tok_phase[t] = (uint8_t)r->phase;
        } else if (x->tok_phase[t] != r->phase) {
            return import_fail(x, x->f->phase,
                               "'%s', but the record of token_idx %" PRIu64
                               " of request '%s' at line %" PRIu64 " says '%s'",
                               trace_phase_name((uint8_t)r->phase), r->token_idx, q->name,
                               x->tok_line[t], trace_phase_name(x->tok_phase[t]));
        }
    }
    for (uint32_t row = 0; row < r->n_rows; row++) {
        uint32_t l = layer[row];
        size_t at = ((size_t)t * x->L + l) * x->k;
        if (x->ids[at] != TRACE_NO_EXPERT) {
            uint64_t first = x->first_line_of ? x->first_line_of(x, ri, (uint32_t)r->token_idx, l,
                                                                 x->tok_line[t])
                                              : 0;
            char also[48] = "";
            if (first) snprintf(also, sizeof also, " (first at line %" PRIu64 ")", first);
            return import_fail(x, r->all_layers ? x->f->ids : x->f->layer,
                               "second record for layer %" PRIu32 " of token_idx %" PRIu64
                               " of request '%s'%s: duplicates are errors",
                               l, r->token_idx, q->name, also);
        }
        for (uint32_t j = 0; j < x->k; j++) {
            x->ids[at + j] = (uint16_t)r->ids[row][j];
            x->gates[at + j] = r->gates[row][j];
        }
        x->tok_layers[t]++;
        x->rep->records++;
    }
    return MOESIM_OK;
}

/* ---- finishing --------------------------------------------------------------------------- */

void import_group_free(importer *x) {
    free(x->tok_request);
    free(x->tok_pos);
    free(x->tok_phase);
    free(x->tok_line);
    free(x->tok_next);
    free(x->tok_layers);
    free(x->ids);
    free(x->gates);
    free(x->tok_keys);
    free(x->tok_vals);
    free(x->reqs);
    free(x->keys);
    free(x->table);
}

typedef struct pos_token {
    uint32_t pos;
    uint64_t t;
} pos_token;

static int pos_token_cmp(const void *a, const void *b) {
    uint32_t x = ((const pos_token *)a)->pos, y = ((const pos_token *)b)->pos;
    return (x > y) - (x < y);
}

/* order[i] = the token (appearance index) at execution slot i: slot i belongs to the request
 * of the i-th distinct token to appear, and a request's slots take its tokens by position.
 * Caller frees. */
static uint64_t *execution_order(const importer *x) {
    uint64_t n = x->n_tokens;
    uint64_t *off = moesim_xcalloc((size_t)x->n_reqs + 1, sizeof *off); /* [n_reqs + 1] */
    for (uint64_t t = 0; t < n; t++) off[x->tok_request[t] + 1]++;
    for (uint32_t q = 0; q < x->n_reqs; q++) off[q + 1] += off[q];
    uint64_t *fill = moesim_xmalloc(x->n_reqs * sizeof *fill); /* [n_reqs] */
    memcpy(fill, off, x->n_reqs * sizeof *fill);
    uint64_t *by_request = moesim_xmalloc(n * sizeof *by_request); /* [n] grouped by request */
    for (uint64_t t = 0; t < n; t++) by_request[fill[x->tok_request[t]]++] = t;
    for (uint32_t q = 0; q < x->n_reqs; q++) {
        uint64_t a = off[q], b = off[q + 1];
        bool sorted = true;
        for (uint64_t i = a + 1; i < b && sorted; i++)
            sorted = x->tok_pos[by_request[i - 1]] < x->tok_pos[by_request[i]];
        if (sorted) continue;
        pos_token *seg = moesim_xmalloc((b - a) * sizeof *seg);
        for (uint64_t i = a; i < b; i++)
            seg[i - a] = (pos_token){x->tok_pos[by_request[i]], by_request[i]};
        qsort(seg, b - a, sizeof *seg, pos_token_cmp);
        for (uint64_t i = a; i < b; i++) by_request[i] = seg[i - a].t;
        free(seg);
    }
    uint64_t *order = moesim_xmalloc(n * sizeof *order); /* [n] */
    memcpy(fill, off, x->n_reqs * sizeof *fill);
    for (uint64_t s = 0; s < n; s++) order[s] = by_request[fill[x->tok_request[s]]++];
    free(by_request);
    free(fill);
    free(off);
    return order;
}

/* Phases of the tokens in execution order: from the records, from the request's prompt
 * length, or from --prefill-tokens; no prefill token after a decode token of its request. */
static moesim_status decide_phases(importer *x, const uint64_t *order) {
    const trace_import_options *o = x->o;
    uint64_t *decode_line = moesim_xmalloc(x->n_reqs * sizeof *decode_line); /* [n_reqs] */
    for (uint32_t q = 0; q < x->n_reqs; q++) decode_line[q] = 0;
    moesim_status st = MOESIM_OK;
    for (uint64_t i = 0; i < x->n_tokens && !st; i++) {
        uint64_t t = order[i];
        const import_request *q = &x->reqs[x->tok_request[t]];
        uint8_t phase = x->tok_phase[t];
        if (q->prompt_len >= 0) {
            uint8_t by_len = x->tok_pos[t] < q->prompt_len ? TRACE_PREFILL : TRACE_DECODE;
            if (phase != PHASE_UNSAID && phase != by_len) {
                x->line = x->tok_line[t];
                st = import_fail(x, x->f->phase,
                                 "'%s' for token_idx %" PRIu32 " of request '%s', whose prompt "
                                 "has %" PRId64 " tokens (line %" PRIu64 ")",
                                 trace_phase_name(phase), x->tok_pos[t], q->name, q->prompt_len,
                                 q->prompt_line);
                break;
            }
            phase = by_len;
        } else if (phase == PHASE_UNSAID) {
            phase =
                o->all_prefill || x->tok_pos[t] < o->prefill_tokens ? TRACE_PREFILL : TRACE_DECODE;
        }
        x->tok_phase[t] = phase;
        uint32_t qi = x->tok_request[t];
        if (phase == TRACE_DECODE && !decode_line[qi]) decode_line[qi] = x->tok_line[t];
        if (phase == TRACE_PREFILL && decode_line[qi]) {
            x->line = x->tok_line[t];
            st = import_fail(x, x->f->phase,
                             "prefill token_idx %" PRIu32 " after a decode token (line %" PRIu64
                             ") of request '%s'",
                             x->tok_pos[t], decode_line[qi], q->name);
        }
    }
    free(decode_line);
    return st;
}

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
    if (o->weights_path) json_object_set_new(j, "weights", json_string(o->weights_path));
    if (o->requests_path) json_object_set_new(j, "requests", json_string(o->requests_path));
    if (x->rep->gates_source) json_object_set_new(j, "gates", json_string(x->rep->gates_source));
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

static const char *phase_source(const importer *x) {
    if (x->has_phase == 1) return "records";
    bool by_len = false;
    for (uint32_t q = 0; q < x->n_reqs && !by_len; q++) by_len = x->reqs[q].prompt_len >= 0;
    if (by_len) return x->prompt_source;
    if (x->o->all_prefill) return "--all-prefill";
    return x->o->prefill_tokens_set ? "--prefill-tokens" : TRACE_IMPORT_PHASE_DEFAULT;
}

/* --prompt-lens: one length for every request, or one per request in order of appearance. */
static moesim_status apply_prompt_lens(importer *x) {
    const trace_import_options *o = x->o;
    if (!o->n_prompt_lens) return MOESIM_OK;
    if (x->has_phase == 1 || x->has_prompt_len == 1)
        return moesim_fail(x->err, MOESIM_EINPUT,
                           "%s: --prompt-lens: the log gives its %s already (two sources for one "
                           "fact)",
                           x->path, x->has_phase == 1 ? "phases" : "prompt lengths");
    for (uint32_t q = 0; q < x->n_reqs; q++)
        if (x->reqs[q].prompt_len >= 0)
            return moesim_fail(x->err, MOESIM_EINPUT,
                               "%s: --prompt-lens: request '%s' has its prompt length from %s "
                               "already (two sources for one fact)",
                               x->path, x->reqs[q].name, x->prompt_source);
    if (o->n_prompt_lens != 1 && o->n_prompt_lens != x->n_reqs)
        return moesim_fail(x->err, MOESIM_EINPUT,
                           "--prompt-lens: %" PRIu32 " lengths for the %" PRIu32
                           " requests of %s (give one for all, or one per request)",
                           o->n_prompt_lens, x->n_reqs, x->path);
    for (uint32_t q = 0; q < x->n_reqs; q++) {
        x->reqs[q].prompt_len = o->prompt_lens[o->n_prompt_lens == 1 ? 0 : q];
        x->reqs[q].prompt_line = 0;
    }
    x->prompt_source = "--prompt-lens";
    return MOESIM_OK;
}

moesim_status import_finish(importer *x, trace **out) {
    trace_import_report *rep = x->rep;
    const trace_import_options *o = x->o;
    if (x->n_tokens == 0)
        return moesim_fail(x->err, MOESIM_EINPUT, "%s: no records (%" PRIu64 " lines read)",
                           x->path, rep->lines);
    rep->requests_read = x->n_reqs;
    rep->tokens_read = x->n_tokens;
    moesim_status st = apply_prompt_lens(x);
    if (st) return st;
    rep->phase_source = phase_source(x);
    uint64_t *order = execution_order(x); /* [n_tokens] */
    st = decide_phases(x, order);
    if (st) {
        free(order);
        return st;
    }
    uint8_t *drop = moesim_xcalloc(x->n_tokens, 1); /* [n_tokens] by slot: 0 keep, 1 incomplete,
                                                       2 constant run */
    for (uint64_t i = 0; i < x->n_tokens; i++) {
        uint64_t t = order[i];
        if (x->tok_layers[t] < x->L) {
            rep->tokens_incomplete++;
            rep->rows_missing += x->L - x->tok_layers[t];
            if (o->incomplete == TRACE_INCOMPLETE_DROP) drop[i] = 1;
        }
    }
    /* constant runs: consecutive tokens (execution order) with identical routing */
    for (uint64_t a = 0; a < x->n_tokens;) {
        uint64_t b = a + 1;
        while (b < x->n_tokens && token_same_routing(x, order[b - 1], order[b])) b++;
        if (b - a >= o->constant_run_min) {
            rep->constant_runs++;
            rep->constant_run_tokens += b - a;
            if (rep->runs_listed < TRACE_IMPORT_RUNS_LISTED) {
                trace_import_run *run = &rep->runs[rep->runs_listed++];
                uint64_t t = order[a];
                snprintf(run->request, sizeof run->request, "%s", x->reqs[x->tok_request[t]].name);
                run->first_token_idx = x->tok_pos[t];
                run->line = x->tok_line[t];
                run->tokens = b - a;
            }
            if (o->drop_constant_runs)
                for (uint64_t i = a; i < b; i++)
                    if (!drop[i]) drop[i] = 2;
        }
        a = b;
    }
    uint64_t kept = 0;
    for (uint64_t i = 0; i < x->n_tokens; i++) {
        if (drop[i] == 1) rep->tokens_dropped_incomplete++;
        if (drop[i] == 2) rep->tokens_dropped_constant++;
        if (drop[i])
            rep->records_dropped += x->tok_layers[order[i]];
        else
            kept++;
    }
    if (kept == 0) {
        free(drop);
        free(order);
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
        free(order);
        return moesim_fail(x->err, MOESIM_ENOMEM,
                           "%s: out of memory for a trace of %" PRIu64 " tokens", x->path, kept);
    }
    uint32_t *renum = moesim_xmalloc(x->n_reqs * sizeof *renum); /* [n_reqs] */
    for (uint32_t q = 0; q < x->n_reqs; q++) renum[q] = UINT32_MAX;
    uint32_t next = 0;
    const size_t row = (size_t)x->L * x->k;
    uint64_t i = 0;
    for (uint64_t slot = 0; slot < x->n_tokens; slot++) {
        if (drop[slot]) continue;
        uint64_t s = order[slot];
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
    free(order);
    rep->requests_kept = next;
    rep->tokens_kept = kept;
    t->params_json = import_params_json(x);
    st = trace_finish(t, x->path, x->err);
    if (st) {
        trace_destroy(t);
        return st;
    }
    rep->identical_layers =
        trace_layer_twins_find(t, rep->identical, TRACE_IMPORT_RUNS_LISTED, &rep->identical_listed);
    *out = t;
    return MOESIM_OK;
}
