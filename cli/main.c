/* moesim: record MoE router traces, simulate expert offloading policies on them, replay the
 * winners on a real GPU. This file only dispatches to the commands (one file each). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/check.h"

static const cli_command commands[] = {
    {"trace", cmd_trace, "inspect, validate, import, export and summarize router traces"},
    {"record", cmd_record, "run a checkpoint over prompts and write its router trace"},
    {"eval", cmd_eval, "perplexity and KL vs bf16 under an expert precision or precision map"},
    {"sim", cmd_sim, "simulate a trace under an expert offloading policy on a hardware profile"},
    {"sweep", cmd_sweep, "run an experiment's configurations into a resumable CSV; merge shards"},
    {"plot", cmd_plot, "render plots/NAME.gp, or any CSV's --x/--y columns, as PNG and SVG"},
    {"replay", cmd_replay, "replay a trace under a policy on the GPU (real copies and kernels)"},
    {"calibrate", cmd_calibrate, "measure the GPU: hardware profile and cost table for the sim"},
    {"validate", cmd_validate, "compare the simulator with the GPU replay on the same runs"},
};

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("moesim %s\n", MOESIM_VERSION);
        return 0;
    }
    return cli_dispatch("moesim", commands, MOESIM_ARRAY_LEN(commands), argc, argv);
}
