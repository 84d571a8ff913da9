/* The importer's parts, shared by the files of `moesim trace import` (internal to traces/).
 *
 * Data flow: a source turns its input into import_records — the text parsers (import_text.c:
 * JSONL in every shape, export's CSV) one line at a time, the array reader (import_npy.c) one
 * token at a time — and hands each to import_place (import_group.c), which checks every value
 * against the model and files each (token, layer) row under its (request, position) key,
 * whatever the order of the records. import_finish (import_group.c) then orders the tokens,
 * decides phases, finds incomplete tokens and constant runs and builds the trace. import.c
 * drives it all: options, files, the line reader, the report.
 *
 * Locations in messages: text sources set `line` (1-based) and messages read "path:line:
 * field: problem"; the array source sets `line` = 0 and `arr_token`, and messages read
 * "path: field[token][layer][slot]: problem". */
#ifndef MOESIM_TRACES_IMPORT_INTERNAL_H
#define MOESIM_TRACES_IMPORT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "traces/convert.h"

#define IMPORT_NO_TOKEN         UINT64_MAX
#define IMPORT_REQUEST_PART_MAX 120 /* bytes of a dataset name or a request id */
#define IMPORT_REQUEST_KEY_MAX  256 /* bytes of a request key: two tagged parts */

/* Field names of one input shape, for messages. */
typedef struct import_fields {
    const char *request; /* "problem_id", "req_id", "request_id" */
    const char *token;   /* "token_idx", "position" */
    const char *layer;
    const char *ids;   /* "experts", "topk_ids", "expert" (CSV: "expert_<j>") */
    const char *gates; /* "gating_probs", "topk_weights", "gate" */
    const char *phase;
} import_fields;

/* A request's identity: tagged parts (import_key_append). */
typedef struct request_key {
    char bytes[IMPORT_REQUEST_KEY_MAX];
    size_t len;
} request_key;

/* One parsed record: one row (a (token, layer) record) or, for per-token records, one row per
 * layer. Only the first TRACE_MAX_TOP_K values of a row are kept; the counts are exact. */
typedef struct import_record {
    request_key key;
    uint64_t token_idx;
    uint64_t layer;  /* rows == 1 and !all_layers: the row's layer as written */
    bool all_layers; /* row r is layer r (per-token record: no "layer" key) */
    uint32_t n_rows; /* 1, or the layers a per-token record holds */
    uint32_t n_ids[MODEL_MAX_LAYERS], n_gates[MODEL_MAX_LAYERS]; /* [n_rows] */
    uint64_t ids[MODEL_MAX_LAYERS][TRACE_MAX_TOP_K];             /* [n_rows][<= 64] */
    float gates[MODEL_MAX_LAYERS][TRACE_MAX_TOP_K];              /* [n_rows][<= 64] */
    int phase;          /* TRACE_PREFILL, TRACE_DECODE, or -1: the record does not say */
    int64_t prompt_len; /* tokens of the request's prompt, or -1: the record does not say */
} import_record;

typedef struct import_request {
    size_t key_off, key_len; /* bytes in importer.keys */
    uint64_t hash;
    char name[64];
    uint64_t tail;        /* its latest new token (appearance order), IMPORT_NO_TOKEN: none */
    uint64_t last;        /* the token its previous record went to */
    int64_t max_pos;      /* its highest token_idx so far, -1 before the first */
    int64_t prompt_len;   /* from the records or the side file, -1: not given */
    uint64_t prompt_line; /* where prompt_len was first given */
} import_request;

typedef struct importer {
    const char *path;         /* the file being read (for messages) */
    const char *gates_path;   /* the file the gate weights come from when not `path` (--weights) */
    const char *const *paths; /* [n_paths] every input, in command-line order */
    uint32_t n_paths;
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
    int has_prompt_len; /* -1 undecided, 0/1: whether records carry "prompt_len" */
    uint64_t prompt_len_line;
    const char *prompt_source; /* where prompt lengths come from, for the report */
    uint64_t line;             /* text: current line; 0 for arrays */
    uint64_t arr_token;        /* arrays: current token (row of the arrays) */
    /* Finds the line of the first record of (request, token_idx, MoE layer), at or after
     * `from` (the token's first line), for a duplicate's message; 0 when it cannot say. */
    uint64_t (*first_line_of)(struct importer *x, uint32_t req, uint32_t pos, uint32_t layer,
                              uint64_t from);

    /* tokens, in order of their first record */
    uint64_t n_tokens, cap_tokens;
    uint32_t *tok_request; /* [n_tokens] index into reqs */
    uint32_t *tok_pos;     /* [n_tokens] token_idx */
    uint8_t *tok_phase;    /* [n_tokens] from the records, or 0xFF: not said */
    uint64_t *tok_line;    /* [n_tokens] line of the first record */
    uint64_t *tok_next;    /* [n_tokens] next new token of the same request, or NO_TOKEN */
    uint16_t *tok_layers;  /* [n_tokens] layers recorded */
    uint16_t *ids;         /* [n_tokens][L][k], TRACE_NO_EXPERT until recorded */
    float *gates;          /* [n_tokens][L][k] */
    /* (request, position) -> token: open addressing, key (req << 32 | pos) + 1, 0 = empty */
    uint64_t *tok_keys, *tok_vals; /* [tok_cap] */
    uint64_t tok_cap;              /* power of two, > 2 n_tokens */
    uint64_t last_token;           /* the previous record's token (cache) */

    /* requests, in order of first appearance; open-addressing table of index + 1 */
    import_request *reqs;
    uint32_t n_reqs, cap_reqs;
    char *keys;
    size_t keys_len, keys_cap;
    uint32_t *table;
    uint32_t table_cap; /* power of two, > 2 n_reqs */
    uint32_t last_req;  /* cache: the previous record's request (UINT32_MAX: none) */
} importer;

extern const import_fields import_fields_problem, import_fields_request, import_fields_csv,
    import_fields_dense;

/* "path:line: field: problem" (or "path: field[token][layer]: problem" for arrays). */
moesim_status import_fail(importer *x, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A text file's first line past its UTF-8 byte order mark, if it starts with one (what
 * spreadsheet programs write before the header). */
static inline const char *import_past_bom(const char *line, const char *end) {
    return end - line >= 3 && !memcmp(line, "\xEF\xBB\xBF", 3) ? line + 3 : line;
}
/* A line of text holds no NUL byte: what follows one would be cut from every message. */
moesim_status import_check_text_line(importer *x, const char *line, const char *end);

/* Appends a segment to a request key: tag ('s' string, 'i' integer, 'd' dataset, 'n' no
 * dataset), length byte, bytes (n <= IMPORT_REQUEST_PART_MAX). */
void import_key_append(request_key *k, char tag, const char *bytes, size_t n);
/* The request's index, adding it (named from its key) at its first appearance. */
uint32_t import_request_find_or_add(importer *x, const request_key *key);

/* import_group.c: checks and files every row of `r` (after the source filled it). */
moesim_status import_place(importer *x, import_record *r);
/* import_group.c: orders, decides phases, applies the drop options, builds the trace. */
moesim_status import_finish(importer *x, trace **out);
void import_group_free(importer *x);

/* "problem", "request" or "auto". */
const char *import_schema_name(trace_jsonl_schema s);
/* import_text.c: one line [line, end) (no newline) into r; places nothing. */
moesim_status import_parse_jsonl(importer *x, const char *line, const char *end, import_record *r);
moesim_status import_parse_csv_header(importer *x, const char *line, const char *end);
moesim_status import_parse_csv_row(importer *x, const char *line, const char *end,
                                   import_record *r);

/* import_npy.c: reads the arrays of an .npy pair or an .npz file and places every row. */
moesim_status import_arrays(importer *x);

/* import_dense.c: whether the CSV header line [line, end) is a dense score file (expert_<i>
 * columns for every expert, no gate_<j>) rather than export's CSV. */
bool import_csv_is_dense(const importer *x, const char *line, const char *end);
/* import_dense.c: reads every input as a per-layer file of dense scores (CSV or 2-D .npy,
 * traces/FORMAT.md "Dense scores"): each file's layer from a column, its name or its order,
 * checked for the whole set before any row is read; each row reduced to the top-k. */
moesim_status import_dense(importer *x);
/* import_dense.c: one layer's dense scores z[E] -> the top-k ids (highest score first, ties to
 * the lower id) and gates, by what --scores says the scores are and the model's gate rule.
 * Refuses a row given as logits that looks like probabilities or gate weights (unless
 * --force-scores). Messages read "<where>: ...". */
moesim_status import_scores_topk(importer *x, const float *z, const char *where, uint64_t *ids,
                                 float *gates);
/* The report's "gates" line for dense scores: what they are and the gate rule applied. */
const char *import_scores_source(const importer *x);

#endif
