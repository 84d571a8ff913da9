/* `moesim trace export --format csv|jsonl IN.h5 [-o OUT]`: a trace as text, one line per
 * recorded (token, layer) row (traces/FORMAT.md, "Import and export"); `trace import` reads it
 * back to the same arrays. The output file is written atomically; without -o (or with -o -)
 * the text goes to stdout, after every check has passed. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/atomic_file.h"
#include "traces/convert.h"
#include "traces/trace.h"

static const char export_help[] =
    "usage: moesim trace export --format csv|jsonl IN.h5 [-o OUT]\n"
    "\n"
    "Writes every recorded (token, layer) row of a trace, in trace order, as\n"
    "  jsonl: {\"req_id\": R, \"token_idx\": P, \"layer\": L, \"phase\": \"decode\",\n"
    "          \"topk_ids\": [...], \"topk_weights\": [...]}   (the request shape of import)\n"
    "  csv:   request_id,position,phase,layer,expert_0..expert_{k-1},gate_0..gate_{k-1}\n"
    "Gates are printed so that they parse back bit-exact: `moesim trace import --model M`\n"
    "of the output gives the same trace arrays. Unrecorded rows are left out (import restores\n"
    "them with --incomplete keep); importance, token ids and look-ahead predictions have no\n"
    "column (a note on stderr says so when the trace has them).\n"
    "\n"
    "options:\n"
    "  --format csv|jsonl   output format (required)\n"
    "  -o, --output OUT     write to OUT (atomically); default or '-': stdout\n"
    "  --quiet              no progress bar\n"
    "  -h, --help           this text\n"
    "\n"
    "exit status: 0 on success, 2 on a bad trace or command line (one line on stderr).\n";

/* The rows the text formats cannot hold, named once the export is sure to run. */
static void note_left_out(const trace *t, const char *in, const char *format) {
    const trace_meta *m = &t->meta;
    const char *what[3];
    int n = 0;
    if (m->has_importance) what[n++] = "importance";
    if (m->has_token_ids) what[n++] = "token ids";
    if (m->lookahead_depth) what[n++] = "look-ahead predictions";
    if (!n) return;
    char list[96] = ""; /* "a", "a and b", "a, b and c" */
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                 i == 0       ? ""
                 : i == n - 1 ? " and "
                              : ", ",
                 what[i]);
    fprintf(stderr, "moesim trace export: note: %s has %s, which %s cannot hold; left out\n", in,
            list, format);
}

int cmd_trace_export(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *format = NULL;
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(export_help, stdout);
            return 0;
        }
        if (!strcmp(a, "--format") || !strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc)
                return cli_usage_error("trace export", "option '%s' needs a value", a);
            if (!strcmp(a, "--format"))
                format = argv[++i];
            else
                out = argv[++i];
        } else if (!strcmp(a, "--quiet")) {
            quiet = true;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error("trace export", "unknown option '%s'", a);
        } else if (in) {
            return cli_usage_error("trace export", "one input file expected, got '%s' and '%s'", in,
                                   a);
        } else {
            in = a;
        }
    }
    if (!format) return cli_usage_error("trace export", "missing --format csv|jsonl");
    trace_text_format f;
    if (!strcmp(format, "csv"))
        f = TRACE_TEXT_CSV;
    else if (!strcmp(format, "jsonl"))
        f = TRACE_TEXT_JSONL;
    else
        return cli_usage_error("trace export", "--format: expected csv or jsonl, got '%s'", format);
    if (!in) return cli_usage_error("trace export", "missing the input trace");

    moesim_error err = {0};
    bool to_stdout = !out || !strcmp(out, "-");
    if (!to_stdout && atomic_file_check_not_input(out, in, &err)) return cli_fail(&err);
    trace *t = NULL;
    if (trace_read(in, &t, &err)) return cli_fail(&err);
    if (trace_export_check(t, in, &err)) {
        trace_destroy(t);
        return cli_fail(&err);
    }
    moesim_status st;
    if (to_stdout) {
        note_left_out(t, in, format);
        st = trace_export_write(t, f, stdout, cli_progress_allowed(quiet), "stdout", &err);
    } else {
        atomic_file af;
        st = atomic_file_open(&af, out, &err);
        if (!st) {
            note_left_out(t, in, format);
            st = trace_export_write(t, f, af.fp, cli_progress_allowed(quiet), out, &err);
            if (st)
                atomic_file_abort(&af);
            else
                st = atomic_file_commit(&af, &err);
        }
    }
    trace_destroy(t);
    return st ? cli_fail(&err) : 0;
}
