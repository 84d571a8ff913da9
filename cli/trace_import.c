/* `moesim trace import`: routing logs (JSONL in either shape of CALIBRATION.md, per (token,
 * layer) or per token; the CSV of `trace export`; NumPy arrays) -> an HDF5 trace, with a report of
 * what was kept, dropped and why (text, or
 * --json). Geometry and the gate rule come from --model. Bad input: one line on stderr naming
 * file:line and the field, exit status 2, no output file (trace_write is crash-safe and runs
 * only after the whole input was read and checked). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/atomic_file.h"
#include "common/config.h"
#include "common/model.h"
#include "traces/convert.h"
#include "traces/trace.h"

static const char import_help[] =
    "usage: moesim trace import [--format jsonl|csv|npy|npz] --model NAME IN... -o OUT.h5 "
    "[options]\n"
    "\n"
    "Converts routing logs into a router trace (traces/FORMAT.md, \"Import and export\").\n"
    "JSONL records come in two shapes, detected per file from the first record (or named\n"
    "with --schema), keys in any order:\n"
    "  problem: {\"dataset\", \"problem_id\", \"token_idx\", \"layer\", \"experts\", "
    "\"gating_probs\"}\n"
    "  request: {\"req_id\", \"token_idx\", \"layer\", \"topk_ids\", \"topk_weights\"}\n"
    "one record per (token, layer), or per token without \"layer\" and with one array per\n"
    "MoE layer in the ids and weights; optionally \"phase\" (\"prefill\" / \"decode\") or\n"
    "\"prompt_len\" (the request's prompt tokens). Records may come in any order\n"
    "(layer-major, token-major, requests or steps interleaved): requests (problem_id with\n"
    "dataset, or req_id) are numbered by first appearance, each request's tokens run in\n"
    "token_idx order, and a second record for one (request, token_idx, layer) is an error.\n"
    "npy / npz: dense arrays [tokens][layers][top_k] of ids and weights (np.save, np.savez).\n"
    "Per-layer dense scores: several CSVs with columns expert_0 .. expert_<E-1> (and\n"
    "optionally token_id, request_id, layer_id) or .npy arrays [tokens][E], one MoE layer\n"
    "each, reduced to the top-k by score (ties to the lower expert id).\n"
    "Prints what it read, kept, dropped and why.\n"
    "\n"
    "options:\n"
    "  --model NAME            model config (configs/models/NAME.ini or a path): layers,\n"
    "                          experts, top-k and gate rule every record is checked against\n"
    "  -o, --output OUT.h5     the trace to write (nothing is written on error)\n"
    "  --format jsonl|csv|npy|npz   input format (default jsonl; csv: what trace export\n"
    "                          writes; npy: IN holds the expert ids or router logits;\n"
    "                          npz: IN holds topk_ids (or routed_experts) and\n"
    "                          topk_weights, or router_logits; optionally request_id,\n"
    "                          seq_lens, prompt_lens)\n"
    "  --weights W.npy         npy: the gate weights [tokens][layers][top_k] (IN of\n"
    "                          integers: expert ids; IN of floats: router logits\n"
    "                          [tokens][layers][experts], which give top-k and gates)\n"
    "  --uniform-gates         npy/npz ids without weights (SGLang routed_experts, Megatron\n"
    "                          routing indices): each chosen expert gets gate 1/k\n"
    "  --requests FILE.csv     npy/npz: request boundaries, CSV 'request,tokens' or\n"
    "                          'request,tokens,prompt_tokens', one row per request in array\n"
    "                          order (default: the npz's columns, else one request)\n"
    "  --scores logits|probs|weights   what dense scores and router_logits hold (default\n"
    "                          logits: top-k by logit, gates by the model's gate rule; probs:\n"
    "                          softmax over all experts, renormalized over the top-k for gate\n"
    "                          rule topk; weights: the gates themselves, zeros elsewhere);\n"
    "                          probabilities or weights given as logits are refused\n"
    "  --force-scores          read scores as logits even when they look like probabilities\n"
    "  --layer-from-name RE    per-layer files: the layer is group 1 of the extended regular\n"
    "                          expression RE in the file name, e.g. 'layer([0-9]+)'\n"
    "  --layer-from-order      per-layer files: the layer is the file's place in the list\n"
    "                          (default: the layer_id / layer column)\n"
    "  --layer-base N          layers in the log count from N (Megatron: 1); every file's\n"
    "                          layer is checked before any row is read\n"
    "  --tokens-per-request N  dense files without a request column: request = token / N,\n"
    "                          position = token %% N (default: one request)\n"
    "  --schema auto|problem|request   JSONL shape (default auto)\n"
    "  --incomplete keep|drop  a token missing some layers is kept with those rows\n"
    "                          unrecorded (default keep) or dropped\n"
    "  --layers moe|model      \"layer\" counts MoE layers from 0 (default moe) or is the\n"
    "                          model's layer index (dense layers are then errors)\n"
    "  --prefill-tokens N      phase when the records carry none: token_idx < N is prefill,\n"
    "                          the rest decode (default 0: every token decode)\n"
    "  --all-prefill           every token without a phase is prefill (a teacher-forced log)\n"
    "  --prompt-lens N[,N...]  prompt tokens of every request (one value) or of each request\n"
    "                          in order of appearance: token_idx < N is prefill\n"
    "  --constant-run-min N    report runs of >= N consecutive tokens with identical routing\n"
    "                          in every layer (warm-up noise; default 16, N >= 2)\n"
    "  --drop-constant-runs    leave the tokens of those runs out (default: keep, report)\n"
    "  --renormalize           rescale each record's gates to sum to 1 (models whose gates\n"
    "                          are a softmax over the top-k); default: a sum off by more\n"
    "                          than 0.01 is an error\n"
    "  --json                  print the report as one JSON object\n"
    "  --quiet                 no progress bar\n"
    "  -h, --help              this text\n"
    "\n"
    "exit status: 0 on success, 2 on bad input (one line on stderr: file:line: field: problem).\n";

#define IMPORT_MAX_INPUTS 1024

/* A count option: config_parse_u64's decimal, at most UINT32_MAX. */
static bool parse_u32(const char *s, uint32_t *out) {
    uint64_t v;
    if (!config_parse_u64(s, &v) || v > UINT32_MAX) return false;
    *out = (uint32_t)v;
    return true;
}

/* "N" or "N,N,...": at most cap counts into out; false on anything else. */
static bool parse_u32_list(const char *s, uint32_t *out, uint32_t cap, uint32_t *n) {
    *n = 0;
    char buf[32];
    for (const char *p = s;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 0 || len >= sizeof buf || *n == cap) return false;
        memcpy(buf, p, len);
        buf[len] = '\0';
        if (!parse_u32(buf, &out[(*n)++])) return false;
        if (!c) return true;
        p = c + 1;
    }
}

static void print_report(const char *in, const char *out, const trace_import_report *r,
                         const trace_import_options *o) {
    if (r->files > 1)
        printf("read        %" PRIu32 " files (%s, first %s): %" PRIu64 " lines, %" PRIu64
               " records, %" PRIu64 " requests, %" PRIu64 " tokens\n",
               r->files, r->schema, in, r->lines, r->records, r->requests_read, r->tokens_read);
    else if (r->requests_source)
        printf("read        %s: %" PRIu64 " tokens of arrays, %" PRIu64 " records (%s), %" PRIu64
               " requests from %s\n",
               in, r->lines, r->records, r->schema, r->requests_read, r->requests_source);
    else
        printf("read        %s: %" PRIu64 " lines, %" PRIu64 " records (%s), %" PRIu64
               " requests, %" PRIu64 " tokens\n",
               in, r->lines, r->records, r->schema, r->requests_read, r->tokens_read);
    if (r->gates_source) printf("gates       %s\n", r->gates_source);
    if (r->records_reordered)
        printf("order       %" PRIu64 " records came after a later token of their request "
               "(layer-major or interleaved): grouped by (request, token_idx)\n",
               r->records_reordered);
    if (r->blank_lines) printf("skipped     %" PRIu64 " blank lines\n", r->blank_lines);
    if (r->ignored_key_records)
        printf("ignored     keys the shape does not know: %s (in %" PRIu64 " records)\n",
               r->ignored_keys, r->ignored_key_records);
    if (r->renormalized_records)
        printf("rescaled    gates of %" PRIu64 " records to sum to 1 (--renormalize)\n",
               r->renormalized_records);
    printf("incomplete  %" PRIu64 " tokens missing %" PRIu64 " (token, layer) records: %s\n",
           r->tokens_incomplete, r->rows_missing,
           r->tokens_incomplete == 0                ? "none"
           : o->incomplete == TRACE_INCOMPLETE_DROP ? "dropped (--incomplete drop)"
                                                    : "kept, those rows unrecorded "
                                                      "(--incomplete keep)");
    printf("constant    %" PRIu64 " runs of >= %" PRIu32 " tokens with identical routing, %" PRIu64
           " tokens: %s\n",
           r->constant_runs, o->constant_run_min, r->constant_run_tokens,
           r->constant_runs == 0   ? "none"
           : o->drop_constant_runs ? "dropped (--drop-constant-runs)"
                                   : "kept (--drop-constant-runs drops them)");
    for (uint32_t i = 0; i < r->runs_listed && i < 10; i++)
        printf("            request '%s' from token_idx %" PRIu64 " (line %" PRIu64 "): %" PRIu64
               " tokens\n",
               r->runs[i].request, r->runs[i].first_token_idx, r->runs[i].line, r->runs[i].tokens);
    if (r->constant_runs > 10)
        printf("            ... %" PRIu64 " more (--json lists %d)\n", r->constant_runs - 10,
               TRACE_IMPORT_RUNS_LISTED);
    printf("dropped     %" PRIu64 " tokens (%" PRIu64 " records): %" PRIu64 " incomplete, %" PRIu64
           " in constant runs\n",
           r->tokens_dropped_incomplete + r->tokens_dropped_constant, r->records_dropped,
           r->tokens_dropped_incomplete, r->tokens_dropped_constant);
    printf("phase       %" PRIu64 " prefill, %" PRIu64 " decode tokens; from %s\n",
           r->prefill_tokens, r->decode_tokens, r->phase_source);
    if (!strcmp(r->phase_source, TRACE_IMPORT_PHASE_DEFAULT))
        printf("            the log gives no phase and no prompt lengths: every token counted as "
               "decode; --all-prefill for a teacher-forced (prefill) log, --prompt-lens "
               "N[,N...] or --prefill-tokens N for prompts\n");
    for (uint32_t i = 0; i < r->identical_listed; i++)
        printf("warning     MoE layers %" PRIu32 " and %" PRIu32 " have identical routing in every "
               "token (a layer copied in the log?)\n",
               r->identical[i][0], r->identical[i][1]);
    printf("kept        %" PRIu64 " requests, %" PRIu64 " tokens, %" PRIu64 " records, %" PRIu64
           " unrecorded rows\n",
           r->requests_kept, r->tokens_kept, r->records_kept, r->rows_unrecorded_kept);
    printf("wrote       %s\n", out);
}

int cmd_trace_import(int argc, char **argv) {
    const char *inputs[IMPORT_MAX_INPUTS];
    uint32_t n_inputs = 0, prompt_lens[IMPORT_MAX_INPUTS];
    const char *in = NULL, *out = NULL, *model_name = NULL;
    bool as_json = false, quiet = false;
    trace_import_options o;
    trace_import_options_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(import_help, stdout);
            return 0;
        }
        bool takes_value = !strcmp(a, "--format") || !strcmp(a, "--model") || !strcmp(a, "-o") ||
                           !strcmp(a, "--output") || !strcmp(a, "--schema") ||
                           !strcmp(a, "--incomplete") || !strcmp(a, "--layers") ||
                           !strcmp(a, "--prefill-tokens") || !strcmp(a, "--constant-run-min") ||
                           !strcmp(a, "--weights") || !strcmp(a, "--requests") ||
                           !strcmp(a, "--scores") || !strcmp(a, "--layer-from-name") ||
                           !strcmp(a, "--layer-base") || !strcmp(a, "--tokens-per-request") ||
                           !strcmp(a, "--prompt-lens");
        if (takes_value && !v)
            return cli_usage_error("trace import", "option '%s' needs a value", a);
        if (!strcmp(a, "--format")) {
            if (!strcmp(v, "jsonl"))
                o.format = TRACE_TEXT_JSONL;
            else if (!strcmp(v, "csv"))
                o.format = TRACE_TEXT_CSV;
            else if (!strcmp(v, "npy"))
                o.format = TRACE_TEXT_NPY;
            else if (!strcmp(v, "npz"))
                o.format = TRACE_TEXT_NPZ;
            else
                return cli_usage_error("trace import",
                                       "--format: expected jsonl, csv, npy or npz, got '%s'", v);
        } else if (!strcmp(a, "--scores")) {
            if (!strcmp(v, "logits"))
                o.scores = TRACE_SCORES_LOGITS;
            else if (!strcmp(v, "probs"))
                o.scores = TRACE_SCORES_PROBS;
            else if (!strcmp(v, "weights"))
                o.scores = TRACE_SCORES_WEIGHTS;
            else
                return cli_usage_error("trace import",
                                       "--scores: expected logits, probs or weights, got '%s'", v);
        } else if (!strcmp(a, "--force-scores")) {
            o.force_scores = true;
        } else if (!strcmp(a, "--layer-from-name")) {
            o.layer_from = TRACE_LAYER_FROM_NAME;
            o.layer_name_pattern = v;
        } else if (!strcmp(a, "--layer-from-order")) {
            o.layer_from = TRACE_LAYER_FROM_ORDER;
        } else if (!strcmp(a, "--layer-base")) {
            if (!parse_u32(v, &o.layer_base))
                return cli_usage_error("trace import",
                                       "--layer-base: expected a layer number >= 0, got '%s'", v);
        } else if (!strcmp(a, "--tokens-per-request")) {
            if (!parse_u32(v, &o.tokens_per_request) || !o.tokens_per_request)
                return cli_usage_error("trace import",
                                       "--tokens-per-request: expected a count >= 1, got '%s'", v);
        } else if (!strcmp(a, "--all-prefill")) {
            o.all_prefill = true;
        } else if (!strcmp(a, "--prompt-lens")) {
            if (!parse_u32_list(v, prompt_lens, IMPORT_MAX_INPUTS, &o.n_prompt_lens))
                return cli_usage_error("trace import",
                                       "--prompt-lens: expected counts N or N,N,... (at most %d), "
                                       "got '%s'",
                                       IMPORT_MAX_INPUTS, v);
            o.prompt_lens = prompt_lens;
        } else if (!strcmp(a, "--weights")) {
            o.weights_path = v;
        } else if (!strcmp(a, "--requests")) {
            o.requests_path = v;
        } else if (!strcmp(a, "--model")) {
            model_name = v;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            out = v;
        } else if (!strcmp(a, "--schema")) {
            if (!strcmp(v, "auto"))
                o.schema = TRACE_SCHEMA_AUTO;
            else if (!strcmp(v, "problem"))
                o.schema = TRACE_SCHEMA_PROBLEM;
            else if (!strcmp(v, "request"))
                o.schema = TRACE_SCHEMA_REQUEST;
            else
                return cli_usage_error("trace import",
                                       "--schema: expected auto, problem or request, got '%s'", v);
        } else if (!strcmp(a, "--incomplete")) {
            if (!strcmp(v, "keep"))
                o.incomplete = TRACE_INCOMPLETE_KEEP;
            else if (!strcmp(v, "drop"))
                o.incomplete = TRACE_INCOMPLETE_DROP;
            else
                return cli_usage_error("trace import",
                                       "--incomplete: expected keep or drop, got '%s'", v);
        } else if (!strcmp(a, "--layers")) {
            if (!strcmp(v, "moe"))
                o.layers = TRACE_LAYERS_MOE;
            else if (!strcmp(v, "model"))
                o.layers = TRACE_LAYERS_MODEL;
            else
                return cli_usage_error("trace import", "--layers: expected moe or model, got '%s'",
                                       v);
        } else if (!strcmp(a, "--prefill-tokens")) {
            if (!parse_u32(v, &o.prefill_tokens))
                return cli_usage_error("trace import",
                                       "--prefill-tokens: expected a count >= 0, got '%s'", v);
            o.prefill_tokens_set = true;
        } else if (!strcmp(a, "--constant-run-min")) {
            if (!parse_u32(v, &o.constant_run_min) || o.constant_run_min < 2)
                return cli_usage_error("trace import",
                                       "--constant-run-min: expected a count >= 2, got '%s'", v);
        } else if (!strcmp(a, "--drop-constant-runs")) {
            o.drop_constant_runs = true;
        } else if (!strcmp(a, "--uniform-gates")) {
            o.uniform_gates = true;
        } else if (!strcmp(a, "--renormalize")) {
            o.renormalize = true;
        } else if (!strcmp(a, "--json")) {
            as_json = true;
        } else if (!strcmp(a, "--quiet")) {
            quiet = true;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("trace import", "unknown option '%s'", a);
        } else if (n_inputs == IMPORT_MAX_INPUTS) {
            return cli_usage_error("trace import", "at most %d input files", IMPORT_MAX_INPUTS);
        } else {
            inputs[n_inputs++] = a;
            if (!in) in = a;
        }
        if (takes_value) i++;
    }
    if (!in) return cli_usage_error("trace import", "missing the input file");
    if (!model_name) return cli_usage_error("trace import", "missing --model NAME");
    if (!out) return cli_usage_error("trace import", "missing -o OUT.h5");
    if (o.format != TRACE_TEXT_JSONL && o.schema != TRACE_SCHEMA_AUTO)
        return cli_usage_error("trace import", "--schema applies to --format jsonl only");
    if (o.weights_path && o.format != TRACE_TEXT_NPY)
        return cli_usage_error("trace import", "--weights applies to --format npy only");
    bool arrays = o.format == TRACE_TEXT_NPY || o.format == TRACE_TEXT_NPZ;
    if (o.requests_path && !arrays)
        return cli_usage_error("trace import", "--requests applies to --format npy and npz only");
    if (o.uniform_gates && !arrays)
        return cli_usage_error("trace import",
                               "--uniform-gates applies to --format npy and npz only");
    int phase_options = o.all_prefill + (o.n_prompt_lens > 0) + o.prefill_tokens_set;
    if (phase_options > 1)
        return cli_usage_error("trace import",
                               "--all-prefill, --prompt-lens and --prefill-tokens: give one");
    if (n_inputs > 1 && o.format != TRACE_TEXT_CSV && o.format != TRACE_TEXT_NPY)
        return cli_usage_error("trace import",
                               "several input files are per-layer dense scores: --format csv or "
                               "npy");
    o.progress = cli_progress_allowed(quiet);

    moesim_error err = {0};
    for (uint32_t k = 0; k < n_inputs; k++)
        if (atomic_file_check_not_input(out, inputs[k], &err)) return cli_fail(&err);
    if (o.weights_path && atomic_file_check_not_input(out, o.weights_path, &err))
        return cli_fail(&err);
    if (o.requests_path && atomic_file_check_not_input(out, o.requests_path, &err))
        return cli_fail(&err);
    if (atomic_file_check_writable(out, &err)) return cli_fail(&err); /* before a long read */
    model_geometry m;
    if (model_load_by_name(model_name, &m, &err)) return cli_fail(&err);
    trace *t = NULL;
    trace_import_report rep;
    if (trace_import_files(inputs, n_inputs, &m, &o, &t, &rep, &err)) return cli_fail(&err);
    char *model_text = NULL; /* the trace carries its model config: no --model later */
    if (cli_trace_model_text(t, model_name, &model_text, &err)) {
        trace_destroy(t);
        return cli_fail(&err);
    }
    cli_trace_store_model_config(t, model_text);
    free(model_text);
    if (trace_write(t, out, &err)) {
        trace_destroy(t);
        return cli_fail(&err);
    }
    trace_destroy(t);
    if (as_json) {
        json_t *j = trace_import_report_to_json(&rep);
        json_object_set_new(j, "input", json_string(in));
        json_object_set_new(j, "output", json_string(out));
        json_object_set_new(j, "model", json_string(m.name));
        cli_print_json(j);
    } else {
        print_report(in, out, &rep, &o);
    }
    return 0;
}
