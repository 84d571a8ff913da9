/* `moesim trace info FILE [--json]`: what a trace holds. Reads (and so fully validates) the
 * file, then prints model, source, token counts (prefill / decode), requests, layers, experts,
 * top-k, look-ahead depth and K', the optional parts present and the file size; --json gives
 * the same figures as one object. A bad file gives one line on stderr and exit status 2. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "traces/trace.h"

static const char info_help[] =
    "usage: moesim trace info FILE [--json]\n"
    "\n"
    "Reads a router trace (HDF5, see traces/FORMAT.md), checks every field, and prints its\n"
    "model, source, tokens (prefill/decode), requests, layers, experts, top-k, look-ahead\n"
    "depth and K', the optional datasets present and the file size.\n"
    "\n"
    "options:\n"
    "  --json     print the same figures as one JSON object\n"
    "  -h, --help this text\n"
    "\n"
    "exit status: 0 on success, 2 when the file is missing, corrupt or inconsistent\n"
    "(one line on stderr names the file, the dataset or attribute, and the problem).\n";

/* Counts derived from the arrays: tokens per phase and routing rows not recorded. */
typedef struct info_counts {
    uint64_t prefill, decode;
    uint64_t unrecorded_rows; /* token x layer rows of all TRACE_NO_EXPERT */
} info_counts;

static info_counts count_trace(const trace *t) {
    info_counts c = {0};
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        if (t->phase[i] == TRACE_PREFILL)
            c.prefill++;
        else
            c.decode++;
    }
    const uint64_t rows = t->n_tokens * t->meta.n_layers;
    for (uint64_t r = 0; r < rows; r++)
        c.unrecorded_rows += t->expert_ids[r * t->meta.top_k] == TRACE_NO_EXPERT;
    return c;
}

static void print_text(const char *path, uint64_t file_bytes, const trace *t,
                       const info_counts *c) {
    const trace_meta *m = &t->meta;
    printf("file        %s (%.1f MB, %" PRIu64 " bytes)\n", path, (double)file_bytes / 1e6,
           file_bytes);
    printf("format      %s version %u, written by moesim %s\n", TRACE_FORMAT_NAME,
           TRACE_FORMAT_VERSION, m->tool_version[0] ? m->tool_version : "(unknown)");
    printf("model       %s", m->model);
    if (m->model_config_hash) printf(" (config hash %016" PRIx64 ")", m->model_config_hash);
    printf("\nsource      %s\n", m->source[0] ? m->source : "(unknown)");
    printf("tokens      %" PRIu64 " (prefill %" PRIu64 ", decode %" PRIu64 ")\n", t->n_tokens,
           c->prefill, c->decode);
    printf("requests    %" PRIu32 "\n", t->n_requests);
    printf("layers      %" PRIu32 " MoE (model layers %" PRIu32 "..%" PRIu32 ")\n", m->n_layers,
           m->model_layer[0], m->model_layer[m->n_layers - 1]);
    printf("experts     %" PRIu32 " routed, top-%" PRIu32 ", %" PRIu32
           " shared; gates: softmax over %s\n",
           m->n_experts, m->top_k, m->n_shared_experts,
           m->gate_norm == GATE_SOFTMAX_TOPK ? "the top-k" : "all experts");
    if (m->lookahead_depth)
        printf("look-ahead  depth %" PRIu32 ", K' %" PRIu32 "\n", m->lookahead_depth,
               m->lookahead_k);
    else
        printf("look-ahead  none\n");
    printf("optional    importance %s, token_id %s, params_json %s\n",
           m->has_importance ? "yes" : "no", m->has_token_ids ? "yes" : "no",
           t->params_json ? "yes" : "no");
    printf("unrecorded  %" PRIu64 " of %" PRIu64 " token x layer rows\n", c->unrecorded_rows,
           t->n_tokens * m->n_layers);
}

static json_t *info_json(const char *path, uint64_t file_bytes, const trace *t,
                         const info_counts *c) {
    const trace_meta *m = &t->meta;
    json_t *j = json_object();
    json_object_set_new(j, "file", json_string(path));
    json_object_set_new(j, "file_bytes", json_integer((json_int_t)file_bytes));
    json_object_set_new(j, "format", json_string(TRACE_FORMAT_NAME));
    json_object_set_new(j, "format_version", json_integer(TRACE_FORMAT_VERSION));
    json_object_set_new(j, "tool_version", json_string(m->tool_version));
    json_object_set_new(j, "model", json_string(m->model));
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, m->model_config_hash);
    json_object_set_new(j, "model_config_hash", json_string(hash));
    json_object_set_new(j, "source", json_string(m->source));
    json_object_set_new(j, "tokens", json_integer((json_int_t)t->n_tokens));
    json_object_set_new(j, "prefill_tokens", json_integer((json_int_t)c->prefill));
    json_object_set_new(j, "decode_tokens", json_integer((json_int_t)c->decode));
    json_object_set_new(j, "requests", json_integer(t->n_requests));
    json_object_set_new(j, "layers", json_integer(m->n_layers));
    json_t *ml = json_array();
    for (uint32_t l = 0; l < m->n_layers; l++)
        json_array_append_new(ml, json_integer(m->model_layer[l]));
    json_object_set_new(j, "model_layers", ml);
    json_object_set_new(j, "experts", json_integer(m->n_experts));
    json_object_set_new(j, "top_k", json_integer(m->top_k));
    json_object_set_new(j, "shared_experts", json_integer(m->n_shared_experts));
    json_object_set_new(j, "gate_normalization", json_string(trace_gate_norm_name(m->gate_norm)));
    json_object_set_new(j, "lookahead_depth", json_integer(m->lookahead_depth));
    json_object_set_new(j, "lookahead_k", json_integer(m->lookahead_k));
    json_object_set_new(j, "has_importance", json_boolean(m->has_importance));
    json_object_set_new(j, "has_token_ids", json_boolean(m->has_token_ids));
    json_object_set_new(j, "has_params_json", json_boolean(t->params_json != NULL));
    if (t->params_json) {
        /* the generator's settings as an object when they parse, else as the stored text */
        json_t *p = json_loads(t->params_json, JSON_DECODE_ANY, NULL);
        json_object_set_new(j, "params", p ? p : json_string(t->params_json));
    }
    json_object_set_new(j, "unrecorded_rows", json_integer((json_int_t)c->unrecorded_rows));
    return j;
}

int cmd_trace_info(int argc, char **argv) {
    const char *path = NULL;
    bool as_json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(info_help, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json"))
            as_json = true;
        else if (argv[i][0] == '-' && argv[i][1])
            return cli_usage_error("trace info", "unknown option '%s'", argv[i]);
        else if (path)
            return cli_usage_error("trace info", "one FILE expected, got '%s' and '%s'", path,
                                   argv[i]);
        else
            path = argv[i];
    }
    if (!path) return cli_usage_error("trace info", "missing FILE");
    moesim_error err = {0};
    trace *t = NULL;
    if (trace_read(path, &t, &err)) return cli_fail(&err);
    struct stat sb;
    uint64_t file_bytes = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    info_counts c = count_trace(t);
    if (as_json)
        cli_print_json(info_json(path, file_bytes, t, &c));
    else
        print_text(path, file_bytes, t, &c);
    trace_destroy(t);
    return 0;
}
