/* `moesim trace validate`: placeholder until its implementation lands in this session's merge. */
#include "cli/cli.h"
#include "cli/commands.h"

int cmd_trace_validate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_usage_error("trace validate", "not implemented yet");
}
