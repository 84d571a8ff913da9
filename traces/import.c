/* `moesim trace import`: routing logs -> trace; see traces/convert.h and traces/FORMAT.md
 * ("Import and export"). This file drives the import: options, files, the line reader and the
 * report. The parsers are in import_text.c (JSONL, CSV) and import_npy.c (NumPy arrays), the
 * grouping of records into tokens and the trace build in import_group.c
 * (traces/import_internal.h has the data flow).
 *
 * Text is read once, one line at a time in 4 MiB chunks, so the log's size does not matter
 * beyond the trace it holds. Only a duplicate record reads the file again, from the first
 * record of the duplicated token, to name the line of the first copy. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/progress.h"
#include "traces/import_internal.h"
#include "traces/npy.h"

#define READ_CHUNK_BYTES (4u << 20)

const import_fields import_fields_problem = {"problem_id", "token_idx",    "layer",
                                             "experts",    "gating_probs", "phase"};
const import_fields import_fields_request = {"req_id",   "token_idx",    "layer",
                                             "topk_ids", "topk_weights", "phase"};
const import_fields import_fields_csv = {"request_id", "position", "layer",
                                         "expert",     "gate",     "phase"};
const import_fields import_fields_dense = {"request", "token", "layer", "expert", "gate", "phase"};

moesim_status import_fail(importer *x, const char *field, const char *fmt, ...) {
    char msg[MOESIM_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (x->line)
        return moesim_fail(x->err, MOESIM_EINPUT, "%s:%" PRIu64 ": %s: %s", x->path, x->line, field,
                           msg);
    /* arrays: "topk_ids[3][2]" (layer 3, slot 2) of token 7 reads "topk_ids[7][3][2]" */
    const char *bracket = strchr(field, '[');
    int base = bracket ? (int)(bracket - field) : (int)strlen(field);
    bool of_gates = x->gates_path && x->f && !strncmp(field, x->f->gates, (size_t)base);
    return moesim_fail(x->err, MOESIM_EINPUT, "%s: %.*s[%" PRIu64 "]%s: %s",
                       of_gates ? x->gates_path : x->path, base, field, x->arr_token, field + base,
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

/* ---- the text formats: one parser per format, indexed by trace_text_format ----------------- */

typedef struct import_format {
    const char *name;
    /* checks the first line (NULL: the format has no header) */
    moesim_status (*header)(importer *x, const char *line, const char *end);
    /* parses one non-blank line [line, end) into r (NULL: not a text format) */
    moesim_status (*record)(importer *x, const char *line, const char *end, import_record *r);
} import_format;

static const import_format import_formats[] = {
    [TRACE_TEXT_JSONL] = {"jsonl", NULL, import_parse_jsonl},
    [TRACE_TEXT_CSV] = {"csv", import_parse_csv_header, import_parse_csv_row},
    [TRACE_TEXT_NPY] = {"npy", NULL, NULL},
    [TRACE_TEXT_NPZ] = {"npz", NULL, NULL},
};

const char *trace_text_format_name(trace_text_format f) {
    MOESIM_ASSERT((size_t)f < MOESIM_ARRAY_LEN(import_formats));
    return import_formats[f].name;
}

/* ---- lines ------------------------------------------------------------------------------- */

typedef struct line_reader {
    FILE *fp;
    char *buf;
    size_t cap, len, pos;
    bool eof;
    uint64_t consumed; /* bytes before buf[0] */
} line_reader;

static void line_reader_init(line_reader *lr, FILE *fp) {
    *lr = (line_reader){.fp = fp, .cap = READ_CHUNK_BYTES};
    lr->buf = moesim_xmalloc(lr->cap);
}

/* The next line [*line, *end) without its newline: 1, or 0 at the end, -1 on a read error. */
static int line_reader_next(line_reader *lr, const char **line, const char **end) {
    for (;;) {
        char *nl = lr->pos < lr->len ? memchr(lr->buf + lr->pos, '\n', lr->len - lr->pos) : NULL;
        if (nl || lr->eof) {
            if (!nl && lr->pos == lr->len) return 0; /* end of file after a newline */
            *line = lr->buf + lr->pos;
            *end = nl ? nl : lr->buf + lr->len;
            lr->pos = nl ? (size_t)(nl - lr->buf) + 1 : lr->len;
            return 1;
        }
        memmove(lr->buf, lr->buf + lr->pos, lr->len - lr->pos);
        lr->consumed += lr->pos;
        lr->len -= lr->pos;
        lr->pos = 0;
        if (lr->len == lr->cap) {
            lr->cap *= 2;
            lr->buf = moesim_xrealloc(lr->buf, lr->cap);
        }
        size_t got = fread(lr->buf + lr->len, 1, lr->cap - lr->len, lr->fp);
        if (got == 0) {
            if (ferror(lr->fp)) return -1;
            lr->eof = true;
        }
        lr->len += got;
    }
}

static bool line_is_blank(const char *p, const char *end) {
    for (; p < end; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r') return false;
    return true;
}

moesim_status import_check_text_line(importer *x, const char *line, const char *end) {
    const char *nul = memchr(line, '\0', (size_t)(end - line));
    if (!nul) return MOESIM_OK;
    return import_fail(x, "line", "a NUL byte at column %zu (expected text)",
                       (size_t)(nul - line) + 1);
}

/* Reads every line: the header, then each record, placed as it comes. */
static moesim_status import_lines(importer *x, FILE *fp, uint64_t file_bytes) {
    const import_format *fmt = &import_formats[x->o->format];
    line_reader lr;
    line_reader_init(&lr, fp);
    import_record *r = moesim_xmalloc(sizeof *r);
    progress bar;
    progress_begin(&bar, "import", file_bytes, x->o->progress);
    moesim_status st = MOESIM_OK;
    const char *line, *end;
    int got;
    while ((got = line_reader_next(&lr, &line, &end)) > 0) {
        x->line++;
        x->rep->lines++;
        if ((x->line & 0xFFFF) == 0) progress_update(&bar, lr.consumed + lr.pos);
        if (x->line == 1) line = import_past_bom(line, end);
        if ((st = import_check_text_line(x, line, end))) break;
        if (fmt->header && x->line == 1) {
            st = fmt->header(x, line, end);
        } else if (line_is_blank(line, end)) {
            x->rep->blank_lines++;
            continue;
        } else {
            st = fmt->record(x, line, end, r);
            if (!st) st = import_place(x, r);
        }
        if (st) break;
    }
    if (got < 0)
        st = moesim_fail(x->err, MOESIM_EIO, "%s: read error: %s", x->path, strerror(errno));
    progress_end(&bar);
    free(r);
    free(lr.buf);
    return st;
}

/* Whether record `r` holds a row for (request `req`, token_idx `pos`, MoE layer `layer`). */
static bool record_holds(const importer *x, const import_record *r, uint32_t req, uint32_t pos,
                         uint32_t layer) {
    const import_request *q = &x->reqs[req];
    if (r->token_idx != pos || r->key.len != q->key_len ||
        memcmp(r->key.bytes, x->keys + q->key_off, q->key_len))
        return false;
    if (r->all_layers) return layer < r->n_rows;
    if (x->o->layers == TRACE_LAYERS_MOE) return r->layer == layer;
    return r->layer < x->m->n_layers && x->moe_index[r->layer] == (int32_t)layer;
}

/* importer.first_line_of for text: reads the file again from line `from` up to the current
 * line, parsing each record into scratch state, until one holds the row. */
static uint64_t text_first_line_of(importer *x, uint32_t req, uint32_t pos, uint32_t layer,
                                   uint64_t from) {
    FILE *fp = fopen(x->path, "rb");
    if (!fp) return 0;
    trace_import_report scratch_rep = *x->rep;
    moesim_error scratch_err = {0};
    importer y = *x; /* the parsers may note keys and shapes: on a copy */
    y.rep = &scratch_rep;
    y.err = &scratch_err;
    y.line = 0;
    const import_format *fmt = &import_formats[x->o->format];
    line_reader lr;
    line_reader_init(&lr, fp);
    import_record *r = moesim_xmalloc(sizeof *r);
    uint64_t found = 0;
    const char *line, *end;
    while (!found && line_reader_next(&lr, &line, &end) > 0 && ++y.line < x->line) {
        if (y.line == 1) line = import_past_bom(line, end);
        if (y.line < from || (fmt->header && y.line == 1) || line_is_blank(line, end)) continue;
        if (!fmt->record(&y, line, end, r) && record_holds(x, r, req, pos, layer)) found = y.line;
    }
    free(r);
    free(lr.buf);
    fclose(fp);
    return found;
}

/* ---- entry ------------------------------------------------------------------------------- */

static moesim_status check_input_file(const char *path, const char *what, uint64_t *bytes,
                                      moesim_error *err) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return moesim_fail(err, MOESIM_EIO, "%s: is a directory, expected a %s file", path, what);
    *bytes = (uint64_t)sb.st_size;
    return MOESIM_OK;
}

/* Whether the first line of the CSV at `path` is a dense score header (false when unreadable:
 * the text reader then names the problem). */
static bool csv_file_is_dense(const importer *x, const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, fp);
    const char *end = line + (n > 0 ? n - (line[n - 1] == '\n') : 0);
    bool dense = n > 0 && import_csv_is_dense(x, import_past_bom(line, end), end);
    free(line);
    fclose(fp);
    return dense;
}

/* Whether the .npy at `path` is 2-D (one layer's scores [tokens][E]). */
static bool npy_file_is_2d(const char *path) {
    npy_array a;
    moesim_error scratch = {0};
    bool two = !byte_stream_open_file(&a.s, path, &scratch) && !npy_header_read(&a, &scratch) &&
               a.ndim == 2;
    npy_close(&a);
    return two;
}

moesim_status trace_import_file(const char *path, const model_geometry *m,
                                const trace_import_options *o, trace **out,
                                trace_import_report *rep, moesim_error *err) {
    return trace_import_files(&path, 1, m, o, out, rep, err);
}

moesim_status trace_import_files(const char *const *paths, uint32_t n_paths,
                                 const model_geometry *m, const trace_import_options *o,
                                 trace **out, trace_import_report *rep, moesim_error *err) {
    *out = NULL;
    memset(rep, 0, sizeof *rep);
    MOESIM_ASSERT(n_paths >= 1);
    MOESIM_ASSERT(o->constant_run_min >= 2);
    MOESIM_ASSERT((size_t)o->format < MOESIM_ARRAY_LEN(import_formats));
    MOESIM_ASSERT(m->n_moe_layers >= 1 && m->top_k >= 1 && m->top_k <= TRACE_MAX_TOP_K);
    if (o->renormalize && m->gate_norm != GATE_SOFTMAX_TOPK)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: --renormalize: gates of %s are a softmax over all experts; their "
                           "top-k sum has no fixed value to rescale to",
                           m->name, m->name);
    importer x = {.path = paths[0],
                  .paths = paths,
                  .n_paths = n_paths,
                  .m = m,
                  .o = o,
                  .rep = rep,
                  .err = err,
                  .has_phase = -1,
                  .has_prompt_len = -1,
                  .prompt_source = "prompt_len of the records",
                  .last_token = IMPORT_NO_TOKEN,
                  .last_req = UINT32_MAX};
    x.L = m->n_moe_layers;
    x.E = m->n_experts;
    x.k = m->top_k;
    for (uint32_t l = 0, j = 0; l < MODEL_MAX_LAYERS; l++)
        x.moe_index[l] = l < m->n_layers && m->is_moe_layer[l] ? (int32_t)j++ : -1;
    bool text = import_formats[o->format].record != NULL;
    for (uint32_t f = 0; f < n_paths; f++) {
        uint64_t bytes = 0;
        moesim_status st =
            check_input_file(paths[f], trace_text_format_name(o->format), &bytes, err);
        if (st) return st;
    }
    /* per-layer dense scores: several files, a layer source, or a dense header / 2-D array */
    bool dense = (o->format == TRACE_TEXT_CSV && csv_file_is_dense(&x, paths[0])) ||
                 (o->format == TRACE_TEXT_NPY && npy_file_is_2d(paths[0]));
    if (!dense && o->tokens_per_request)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: --tokens-per-request applies to per-layer dense scores (records "
                           "carry their requests; arrays take --requests)",
                           paths[0]);
    if (!dense && (n_paths > 1 || o->layer_from != TRACE_LAYER_FROM_COLUMN))
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: %s: %s, expected per-layer dense scores (CSV columns expert_0 .. "
                           "expert_%" PRIu32 ", or .npy [tokens][%" PRIu32 "])",
                           paths[0], n_paths > 1 ? "several input files" : "a layer source",
                           o->format == TRACE_TEXT_CSV   ? "not a dense score header"
                           : o->format == TRACE_TEXT_NPY ? "not a 2-D array"
                                                         : "a format of one file",
                           x.E - 1, x.E);
    if (!dense && o->format == TRACE_TEXT_CSV) {
        x.f = &import_fields_csv;
        rep->schema = "csv";
    } else if (dense) {
        x.f = &import_fields_dense;
        rep->schema = o->format == TRACE_TEXT_CSV ? "dense csv" : "dense npy";
    } else if (text) {
        x.schema = o->schema;
        x.f = o->schema == TRACE_SCHEMA_PROBLEM ? &import_fields_problem : &import_fields_request;
        rep->schema = import_schema_name(o->schema);
    } else {
        x.f = &import_fields_request;
        rep->schema = trace_text_format_name(o->format);
    }

    moesim_status st = MOESIM_OK;
    if (dense) {
        st = import_dense(&x);
    } else if (text) {
        uint64_t bytes = 0; /* checked above: for the progress bar */
        check_input_file(paths[0], trace_text_format_name(o->format), &bytes, err);
        FILE *fp = fopen(paths[0], "rb");
        if (!fp)
            return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", paths[0], strerror(errno));
        x.first_line_of = text_first_line_of;
        st = import_lines(&x, fp, bytes);
        fclose(fp);
        rep->files = 1;
    } else {
        st = import_arrays(&x);
        rep->files = 1;
    }
    if (!st) st = import_finish(&x, out);
    import_group_free(&x);
    return st;
}

/* ---- report ------------------------------------------------------------------------------ */

json_t *trace_import_report_to_json(const trace_import_report *rep) {
    json_t *j = json_object();
#define U64(key, v) json_object_set_new(j, key, json_integer((json_int_t)(v)))
    json_object_set_new(j, "schema", json_string(rep->schema ? rep->schema : ""));
    U64("lines", rep->lines);
    U64("blank_lines", rep->blank_lines);
    U64("records", rep->records);
    U64("records_reordered", rep->records_reordered);
    if (rep->requests_source)
        json_object_set_new(j, "requests_source", json_string(rep->requests_source));
    if (rep->gates_source) json_object_set_new(j, "gates_source", json_string(rep->gates_source));
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
    U64("files", rep->files);
    U64("identical_layers", rep->identical_layers);
    json_t *twins = json_array();
    for (uint32_t i = 0; i < rep->identical_listed; i++) {
        json_t *pair = json_array();
        json_array_append_new(pair, json_integer(rep->identical[i][0]));
        json_array_append_new(pair, json_integer(rep->identical[i][1]));
        json_array_append_new(twins, pair);
    }
    json_object_set_new(j, "identical_layer_pairs", twins);
#undef U64
    return j;
}
