/* `moesim trace validate FILE [--json]`: reads a trace and checks every attribute, dataset
 * type and shape, and value (the checks of trace_read), block by block (trace_stream_open: the
 * memory does not grow with the trace). Prints "FILE: ok (N tokens, R requests)", or the
 * one-line error on stderr with exit status 2. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "traces/trace.h"

static const char validate_help[] =
    "usage: moesim trace validate FILE [--json]\n"
    "\n"
    "Checks a router trace (HDF5, see traces/FORMAT.md): format name and version, every\n"
    "attribute, every dataset's type and shape, and every value (expert ids below the expert\n"
    "count and distinct within a top-k, gate weights finite in [0, 1], dense request ids,\n"
    "increasing positions, no prefill after decode, look-ahead padding beyond the last layer,\n"
    "the stored first-candidate hits of the look-ahead predictions against its rows).\n"
    "\n"
    "options:\n"
    "  --json     print {\"file\", \"ok\", \"tokens\", \"requests\"} on success\n"
    "  -h, --help this text\n"
    "\n"
    "exit status: 0 when valid; 2 otherwise, with one line on stderr naming the file, the\n"
    "dataset or attribute (and index), and the problem.\n";

int cmd_trace_validate(int argc, char **argv) {
    const char *path = NULL;
    bool as_json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(validate_help, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json"))
            as_json = true;
        else if (argv[i][0] == '-' && argv[i][1])
            return cli_usage_error("trace validate", "unknown option '%s'", argv[i]);
        else if (path)
            return cli_usage_error("trace validate", "one FILE expected, got '%s' and '%s'", path,
                                   argv[i]);
        else
            path = argv[i];
    }
    if (!path) return cli_usage_error("trace validate", "missing FILE");
    moesim_error err = {0};
    trace_stream *ts = NULL;
    if (trace_stream_open(path, &ts, &err)) return cli_fail(&err);
    const trace *t = trace_stream_tokens(ts);
    if (as_json) {
        json_t *j = json_object();
        json_object_set_new(j, "file", json_string(path));
        json_object_set_new(j, "ok", json_true());
        json_object_set_new(j, "tokens", json_integer((json_int_t)t->n_tokens));
        json_object_set_new(j, "requests", json_integer(t->n_requests));
        cli_print_json(j);
    } else {
        printf("%s: ok (%" PRIu64 " tokens, %" PRIu32 " requests)\n", path, t->n_tokens,
               t->n_requests);
    }
    trace_stream_close(ts);
    return 0;
}
