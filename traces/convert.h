/* Routing logs <-> router traces: `moesim trace import` and `moesim trace export`.
 *
 * Import reads routing logs (traces/FORMAT.md, "Import and export"): JSONL in either of the two
 * shapes public tools write (CALIBRATION.md, "Routing logs people already have"), one record per
 * (token, MoE layer) or one per token with every layer; the CSV that export writes; or dense
 * NumPy arrays [tokens][layers][top_k] of ids and weights (.npy pair or .npz). Geometry
 * (L, E, k) and the gate rule come from the model config; every record is checked against them.
 * Tokens are identified by (request, token_idx), records may come in any order (layer-major,
 * token-major, interleaved); requests (problem_id together with dataset, or req_id) are
 * numbered by first appearance, each request's tokens run in position order, and a token's
 * position is its token_idx. Anything malformed is an error naming file:line (or array index)
 * and the field; what the importer drops or fills in (incomplete tokens, constant warm-up runs)
 * is counted in a report, never done silently.
 *
 * Export writes every recorded (token, layer) row of a trace as JSONL (the request shape plus
 * "phase") or CSV; gates are printed so that they parse back bit-exact, so import(export(t))
 * holds the same routing, positions, phases and request numbering as t. */
#ifndef MOESIM_TRACES_CONVERT_H
#define MOESIM_TRACES_CONVERT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/model.h"
#include "common/status.h"
#include "traces/trace.h"

/* Import reads all four; export writes JSONL and CSV. */
typedef enum trace_text_format {
    TRACE_TEXT_JSONL = 0,
    TRACE_TEXT_CSV,
    TRACE_TEXT_NPY, /* the ids .npy; the weights .npy in trace_import_options.weights_path */
    TRACE_TEXT_NPZ, /* one .npz holding the ids, the weights and optionally request columns */
} trace_text_format;

/* The two JSONL shapes; AUTO decides per file from the first record's keys. */
typedef enum trace_jsonl_schema {
    TRACE_SCHEMA_AUTO = 0,
    TRACE_SCHEMA_PROBLEM, /* dataset, problem_id, token_idx, layer, experts, gating_probs */
    TRACE_SCHEMA_REQUEST, /* req_id, token_idx, layer, topk_ids, topk_weights */
} trace_jsonl_schema;

typedef enum trace_incomplete_mode {
    TRACE_INCOMPLETE_KEEP = 0, /* missing layers become TRACE_NO_EXPERT rows (trace.h) */
    TRACE_INCOMPLETE_DROP,     /* tokens missing any layer are left out */
} trace_incomplete_mode;

typedef enum trace_layer_numbering {
    TRACE_LAYERS_MOE = 0, /* "layer" counts MoE layers 0..L-1 (the trace's own numbering) */
    TRACE_LAYERS_MODEL,   /* "layer" is the model's layer index; dense layers are errors */
} trace_layer_numbering;

/* Where the layer of a per-layer file's rows comes from (dense score files). */
typedef enum trace_layer_source {
    TRACE_LAYER_FROM_COLUMN = 0, /* a "layer" / "layer_id" column of each row */
    TRACE_LAYER_FROM_NAME,       /* the file name: first group of layer_name_pattern */
    TRACE_LAYER_FROM_ORDER,      /* the files' order on the command line: 0, 1, ... */
} trace_layer_source;

/* What dense scores and router outputs hold (traces/FORMAT.md, "Dense scores"). */
typedef enum trace_scores_kind {
    TRACE_SCORES_LOGITS = 0, /* router logits: top-k by logit, gates by the model's gate rule */
    TRACE_SCORES_PROBS,      /* softmax over all experts: gates kept (all) or renormalized over
                                the top-k (topk) */
    TRACE_SCORES_WEIGHTS,    /* the gate weights themselves, zeros for unpicked experts */
} trace_scores_kind;

/* Gate sums may differ from the rule's value by this much (logs print rounded gates). */
#define TRACE_IMPORT_GATE_SUM_TOLERANCE 0.01
/* Default: a run of at least this many consecutive tokens with identical routing in every
 * layer (ids and gates bit for bit) is reported as a constant run (warm-up noise). */
#define TRACE_IMPORT_CONSTANT_RUN_MIN 16
/* The phase source of a log that carries no phase and no prompt lengths: every token decode. */
#define TRACE_IMPORT_PHASE_DEFAULT "default (all decode)"
/* The report lists at most this many constant runs (all are counted). */
#define TRACE_IMPORT_RUNS_LISTED 32

typedef struct trace_import_options {
    trace_text_format format;
    trace_jsonl_schema schema; /* JSONL only */
    trace_incomplete_mode incomplete;
    trace_layer_numbering layers;
    /* Phase of tokens whose records carry no "phase": token_idx < prefill_tokens is prefill,
     * the rest decode. Default 0: every token decode (the logs do not say). When the records
     * carry "phase" and prefill_tokens_set, the import fails (two sources for one fact). */
    uint32_t prefill_tokens;
    bool prefill_tokens_set;
    uint32_t constant_run_min; /* >= 2 */
    bool drop_constant_runs;   /* leave the tokens of reported constant runs out */
    bool renormalize;          /* rescale each record's gates to the model's rule */
    bool progress;             /* draw a progress bar (caller decides: terminal, --quiet) */
    /* NPY: the gate weights .npy [tokens][layers][top_k] (required). */
    const char *weights_path;
    /* NPY/NPZ: side file of request boundaries (CSV "request,tokens[,prompt_tokens]", one row
     * per request in array order); NULL: from the .npz's columns, else one request. */
    const char *requests_path;
    /* NPY/NPZ logs of expert ids without weights (SGLang's routed_experts, Megatron's routing
     * indices): every chosen expert gets gate 1/k, and the report says so. */
    bool uniform_gates;
    /* Dense scores (CSV expert_0..expert_<E-1>, .npy [tokens][E] per layer, router_logits)
     * hold this; a row given as logits that looks like probabilities or gate weights is refused
     * unless force_scores. */
    trace_scores_kind scores;
    bool force_scores;
    /* Per-layer files (several inputs): where each file's layer comes from; layer_name_pattern
     * is a POSIX extended regular expression whose first group is the layer number. */
    trace_layer_source layer_from;
    const char *layer_name_pattern;
    /* Layers as written count from this number (Megatron's 1-based layers: 1); subtracted
     * before --layers maps them. */
    uint32_t layer_base;
    /* Dense files without a request column: request = token / N, position = token % N (0: one
     * request, position = token). */
    uint32_t tokens_per_request;
    /* Phase when the log says nothing: every token prefill (a teacher-forced log), or the
     * prompt length of every request (n == 1) or of each request in order. */
    bool all_prefill;
    const uint32_t *prompt_lens; /* [n_prompt_lens] */
    uint32_t n_prompt_lens;
} trace_import_options;

/* One constant run, numbered as in the input (request by its name in the file). */
typedef struct trace_import_run {
    char request[64];         /* the request's name as in the file (cut to fit) */
    uint64_t first_token_idx; /* token_idx of the run's first token */
    uint64_t line;            /* line of that token's first record */
    uint64_t tokens;          /* run length */
} trace_import_run;

/* What import read, kept and dropped, and why. */
typedef struct trace_import_report {
    const char *schema;          /* "problem", "request", "csv", "npy" or "npz" (static string) */
    uint64_t lines;              /* lines read */
    uint64_t blank_lines;        /* whitespace-only lines, skipped */
    uint64_t records;            /* (token, layer) records read */
    uint64_t records_reordered;  /* records for a token other than its request's newest one (0
                                    for a token-major file) */
    const char *requests_source; /* arrays: "request_id column", "seq_lens", "--requests" or
                                    "one request"; NULL for text */
    const char *gates_source;    /* arrays: "weights", "router logits, <rule>" or "uniform 1/k
                                    (--uniform-gates)"; NULL for text */
    uint64_t requests_read, tokens_read;
    uint64_t ignored_key_records;  /* records with keys the shape does not know (skipped) */
    char ignored_keys[128];        /* the first few such keys, comma-separated */
    uint64_t renormalized_records; /* --renormalize: records whose gates were rescaled */
    uint64_t tokens_incomplete;    /* tokens with fewer than L layers recorded */
    uint64_t rows_missing;         /* (token, layer) rows without a record, over those tokens */
    uint64_t constant_runs, constant_run_tokens;
    uint32_t runs_listed;
    trace_import_run runs[TRACE_IMPORT_RUNS_LISTED];
    uint64_t tokens_dropped_incomplete;
    uint64_t tokens_dropped_constant; /* besides those already dropped as incomplete */
    uint64_t records_dropped;
    uint64_t requests_kept, tokens_kept, records_kept;
    uint64_t rows_unrecorded_kept; /* TRACE_NO_EXPERT rows in the output */
    uint64_t prefill_tokens, decode_tokens;
    /* "records", "prompt_len of the records", "prompt_lens", "--prompt-lens", "--all-prefill",
     * "--prefill-tokens" or TRACE_IMPORT_PHASE_DEFAULT */
    const char *phase_source;
    uint32_t files; /* input files read (per-layer files: one per layer) */
    /* layers whose routing (ids and gates of every token) equals an earlier layer's: the pairs
     * (earlier, later) in MoE layer numbers, at most TRACE_IMPORT_RUNS_LISTED listed */
    uint32_t identical_layers, identical_listed;
    uint32_t identical[TRACE_IMPORT_RUNS_LISTED][2];
} trace_import_report;

/* The documented defaults (JSONL, auto shape, keep incomplete tokens, MoE layer numbering, all
 * decode, constant runs of >= 16 reported and kept, gates checked, no progress bar). */
void trace_import_options_default(trace_import_options *o);

/* Reads the log at `path` into a new trace of model `m` (source "import:<format>", the settings
 * in params_json). On success the caller owns *out (trace_destroy)
 * and `rep` is filled; on failure *out is NULL and err holds one line "path:line: field:
 * problem" (MOESIM_EINPUT), or names the file (MOESIM_EIO). */
moesim_status trace_import_file(const char *path, const model_geometry *m,
                                const trace_import_options *o, trace **out,
                                trace_import_report *rep, moesim_error *err);
/* The same for several inputs: per-layer dense score files (CSV or 2-D .npy), one MoE layer each
 * (trace_import_options.layer_from says where its number comes from). One path of another format
 * reads as trace_import_file. */
moesim_status trace_import_files(const char *const *paths, uint32_t n_paths,
                                 const model_geometry *m, const trace_import_options *o,
                                 trace **out, trace_import_report *rep, moesim_error *err);

/* The report as JSON (keys in traces/FORMAT.md). New reference. */
json_t *trace_import_report_to_json(const trace_import_report *rep);

/* Checks that `t` can be exported: every token has at least one recorded layer (a token
 * without any has no record to carry it). `what` names the trace in messages. */
moesim_status trace_export_check(const trace *t, const char *what, moesim_error *err);
/* Writes every recorded row of `t` to `fp` as JSONL or CSV (traces/FORMAT.md), with a
 * progress bar on stderr when `show_progress` (the caller decides: terminal, --quiet). The
 * caller runs trace_export_check first; returns MOESIM_EIO (naming `what`) when a write
 * fails. */
moesim_status trace_export_write(const trace *t, trace_text_format format, FILE *fp,
                                 bool show_progress, const char *what, moesim_error *err);

/* "jsonl" / "csv" / "npy" / "npz". */
const char *trace_text_format_name(trace_text_format f);

#endif
