/* moesim: record MoE router traces, simulate expert offloading policies on them, replay the
 * winners on a real GPU. This file only dispatches to the commands (one file each). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/alloc.h"
#include "common/check.h"
#include "common/paths.h"
#include "common/version.h"

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

/* Takes every `--data-dir DIR` (or `--data-dir=DIR`) out of argv, wherever it stands, and puts
 * them in front of $MOESIM_DATA_PATH (common/paths.h), so every command accepts it and the
 * commands a sweep starts inherit it. Returns the new argc, or -1 after one line when the last
 * has no value or one is not a folder (a typo would otherwise search nothing, unsaid). */
static int take_data_dirs(int argc, char **argv) {
    char *path = NULL;
    size_t len = 0;
    int kept = 1;
    for (int i = 1; i < argc; i++) {
        const char *dir = NULL;
        if (!strcmp(argv[i], "--")) { /* the rest are operands */
            while (i < argc) argv[kept++] = argv[i++];
            break;
        }
        if (!strncmp(argv[i], "--data-dir=", 11)) {
            dir = argv[i] + 11;
        } else if (!strcmp(argv[i], "--data-dir")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "moesim: option '--data-dir' needs a value (a folder laid out "
                                "like share/moesim: configs/, plots/, experiments/)\n");
                free(path);
                return -1;
            }
            dir = argv[++i];
        } else {
            argv[kept++] = argv[i];
            continue;
        }
        struct stat sb;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr,
                    "moesim: --data-dir '%s': not a folder (expected a folder laid out "
                    "like share/moesim: configs/, plots/, experiments/)\n",
                    dir);
            free(path);
            return -1;
        }
        path = moesim_xrealloc(path, len + strlen(dir) + 2);
        len += (size_t)sprintf(path + len, "%s%s", len ? ":" : "", dir);
    }
    argv[kept] = NULL;
    if (path) {
        const char *env = getenv("MOESIM_DATA_PATH");
        if (env && *env) {
            path = moesim_xrealloc(path, len + strlen(env) + 2);
            sprintf(path + len, ":%s", env);
        }
        setenv("MOESIM_DATA_PATH", path, 1);
        free(path);
    }
    return kept;
}

int main(int argc, char **argv) {
    argc = take_data_dirs(argc, argv);
    if (argc < 0) return MOESIM_EXIT_INPUT;
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("moesim %s (%s)\n", moesim_version_release(), moesim_version_describe());
        return 0;
    }
    int rc = cli_dispatch("moesim", commands, MOESIM_ARRAY_LEN(commands), argc, argv);
    /* what stdout could not take (a full disk, a closed pipe's reader gone) is a failed run */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "moesim: writing standard output: %s\n", strerror(errno));
        return rc ? rc : MOESIM_EXIT_INPUT;
    }
    return rc;
}
