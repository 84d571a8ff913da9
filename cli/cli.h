/* Shared pieces of the `moesim` command-line program: the command table type, error reporting
 * (one line on stderr, exit status 2), and JSON output. Each command lives in its own file. */
#ifndef MOESIM_CLI_CLI_H
#define MOESIM_CLI_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "common/progress.h"
#include "common/status.h"
#include "sim/sim.h"
#include "traces/trace.h"

typedef int (*cli_command_fn)(int argc, char **argv); /* argv[0] is the command's name */

typedef struct cli_command {
    const char *name;
    cli_command_fn run;
    const char *summary; /* one line for `moesim --help` */
} cli_command;

/* Runs argv[1] from `cmds`; `group` is the command path so far ("moesim", "moesim trace"). */
int cli_dispatch(const char *group, const cli_command *cmds, size_t n_cmds, int argc, char **argv);

/* Prints "moesim: <message>" and returns MOESIM_EXIT_INPUT. */
int cli_fail(const moesim_error *err);
/* Prints "moesim <cmd>: <message> (see --help)" and returns MOESIM_EXIT_INPUT. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

struct option;

/* The one error line for a getopt_long failure, so that every command says the same thing.
 * Callers set opterr = 0 and start their optstring with ':' (getopt then returns ':' for a
 * missing value and '?' for an unknown option); pass that return value as `c`, and the long
 * option table (borrowed). Names the option as typed: "unknown option '--nope'", "option
 * '--trace' needs a value", "option '--json' takes no value". Returns MOESIM_EXIT_INPUT. */
int cli_getopt_error(const char *cmd, int c, int argc, char **argv, const struct option *opts);

/* Writes `j` to stdout (2-space indent, keys in insertion order, 17 significant digits so
 * results round-trip) and releases it. */
void cli_print_json(json_t *j);

/* A duration for people: "0.412 ms", "7.37 ms", "48.0 ms", "2408.8 s" (ms below a second, else
 * seconds); returns buf. */
const char *cli_format_ms(double ms, char *buf, size_t len);

/* Progress of a simulation or replay in batch steps run (the total is not known beforehand),
 * fed by the run's on_layer_done hook. */
typedef struct cli_step_progress {
    progress bar;
    uint64_t steps;
    sim_hooks hooks;
} cli_step_progress;
/* Starts it (nothing shows with quiet) and returns the hooks to hand to the run. */
const sim_hooks *cli_step_progress_begin(cli_step_progress *p, const char *label, bool quiet);
void cli_step_progress_end(cli_step_progress *p);

/* True when --quiet was not given: progress may show (common/progress.h: a bar on a terminal,
 * a plain line every few seconds elsewhere). */
bool cli_progress_allowed(bool quiet);

/* Parses "--set section.key=value" style option arguments into a growing array (caller frees
 * the array, not the strings, which point into argv). */
void cli_collect(const char ***list, size_t *n, const char *item);

/* Applies the --config files in order, then the --set entries, to `settings`, so every command
 * overrides in the same order (later wins); stops at the first bad one. Borrows the arrays. */
moesim_status cli_settings_load(config *settings, const char *const *files, size_t n_files,
                                const char *const *sets, size_t n_sets, moesim_error *err);

/* The text of the model config a new trace stores to carry its geometry, into *text (caller
 * frees): the file of `model_name` (a name or a path, as the data search path resolves it) when
 * given, else that of the model trace t names, else the config t itself stores. */
moesim_status cli_trace_model_text(const trace *t, const char *model_name, char **text,
                                   moesim_error *err);


/* Adds `text` to t->params_json as "model_config" (traces/FORMAT.md): the trace carries it. */
void cli_trace_store_model_config(trace *t, const char *text);


#endif
