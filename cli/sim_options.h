/* The options of the commands that run a simulation (`moesim sim`, `replay`, `validate`): one
 * getopt table, one parser and one set of checks for --trace, --hw, --policy, --set, --config,
 * --json, -q, --timeline, --timeline-window and --policy-lib, so that every command spells,
 * stores and refuses them alike. A command puts its own options beside them:
 *
 *     struct option opts[CLI_SIM_OPTIONS_MAX + MOESIM_ARRAY_LEN(own) + 1];
 *     cli_sim_options o;
 *     cli_sim_options_start(&o, CLI_SIM_RUN | CLI_SIM_TIMELINE, own, MOESIM_ARRAY_LEN(own), opts);
 *     while ((c = cli_sim_options_next(&o, argc, argv, opts)) != -1)
 *         switch (c) { ...the command's own options, '?' and ':'... }
 *
 * The shared options have getopt codes above any character, so they never collide with a
 * command's own short options. */
#ifndef MOESIM_CLI_SIM_OPTIONS_H
#define MOESIM_CLI_SIM_OPTIONS_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/config.h"
#include "common/status.h"
#include "core/timeline.h"
#include "policies/plugin.h"

/* Which shared options a command takes (bit set). */
enum cli_sim_option_group {
    CLI_SIM_RUN = 1u,      /* --trace --hw --policy --set --config --json -q/--quiet */
    CLI_SIM_TIMELINE = 2u, /* --timeline --timeline-window */
    CLI_SIM_PLUGIN = 4u,   /* --policy-lib */
};

#define CLI_SIM_OPTIONS_MAX 10 /* rows the shared options add to a getopt table */

typedef struct cli_sim_options {
    const char *trace_path, *hw_name, *policy_name; /* borrowed from argv; NULL: not given */
    const char **sets;                              /* [n_sets] --set entries, in order */
    size_t n_sets;
    const char **files; /* [n_files] --config files, in order */
    size_t n_files;
    bool json;
    bool quiet;                       /* -q: no progress */
    const char *timeline_path;        /* NULL: no timeline */
    const char *timeline_window_text; /* as typed; parsed by cli_sim_options_check */
    sim_timeline_window timeline_window;
    const char *policy_lib; /* --policy-lib FILE.so, or NULL */
    policy_plugin *plugin;  /* loaded by cli_sim_options_check when policy_lib is given */
} cli_sim_options;

/* Zeroes `o` and writes into `opts` (CLI_SIM_OPTIONS_MAX + n_own + 1 rows) the rows of the shared
 * groups in `groups`, then the command's `n_own` rows of `own`, then the terminating zero row;
 * resets getopt for a new parse with its messages off (cli_getopt_error says it in one line). */
void cli_sim_options_start(cli_sim_options *o, unsigned groups, const struct option *own,
                           size_t n_own, struct option *opts);

/* getopt_long over argv with optstring ":h": records the shared options in `o` and returns the
 * next code that is not one (a command's own option, '?', ':'), or -1 at the end. */
int cli_sim_options_next(cli_sim_options *o, int argc, char **argv, const struct option *opts);

/* The checks every command makes of what it was given, in this order: --policy-lib loads
 * (policies/plugin.h; --policy then defaults to the plug-in's policy and, when given, must be
 * its name); --trace, --hw and --policy are there (when `require_run`); the policy, when given,
 * is registered or the plug-in's;
 * --timeline-window is well formed (into o->timeline_window) and comes with --timeline. Returns
 * 0, or the exit status after one line naming `cmd`. */
int cli_sim_options_check(const char *cmd, cli_sim_options *o, bool require_run);

/* Applies --config then --set to `settings` (cli_settings_load): the same first error in every
 * command, reported before any input is read or any device is looked for. */
moesim_status cli_sim_options_settings(const cli_sim_options *o, config *settings,
                                       moesim_error *err);

/* The --help lines of --timeline and --timeline-window, the description starting at `column`. */
void cli_sim_options_timeline_help(FILE *out, int column);

/* The table of the plug-in (--policy-lib), or NULL: what sim_inputs.policy and
 * replay_inputs.policy take. */
const policy_methods *cli_sim_options_policy(const cli_sim_options *o);

/* Prints every policy and its knobs (`--list-policies`), the plug-in's last. */
void cli_sim_options_list_policies(const cli_sim_options *o, FILE *out);

void cli_sim_options_free(cli_sim_options *o); /* the --set and --config arrays, the plug-in */

#endif
