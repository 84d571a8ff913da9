/* `moesim trace <subcommand>`: the router-trace tools, one file each (trace_*.c). */
#include "cli/cli.h"
#include "cli/commands.h"
#include "common/check.h"

static const cli_command trace_commands[] = {
    {"info", cmd_trace_info, "print a trace's model, size and contents"},
    {"validate", cmd_trace_validate, "check every field of a trace file"},
    {"import", cmd_trace_import, "convert routing logs (JSONL) into a trace"},
    {"export", cmd_trace_export, "write a trace as CSV or JSONL"},
    {"stats", cmd_trace_stats, "skew, reuse, batch activation, predictor accuracy, hit curves"},
    {"synth", cmd_trace_synth, "synthesize a calibrated router trace for any configured model"},
};

int cmd_trace(int argc, char **argv) {
    return cli_dispatch("moesim trace", trace_commands, MOESIM_ARRAY_LEN(trace_commands), argc,
                        argv);
}
