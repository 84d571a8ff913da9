/* Command dispatch, error printing and JSON output shared by all commands; see cli.h. */
#include "cli/cli.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"

static void print_commands(FILE *out, const char *group, const cli_command *cmds, size_t n) {
    fprintf(out, "usage: %s <command> [options]\n\ncommands:\n", group);
    for (size_t i = 0; i < n; i++) fprintf(out, "  %-10s %s\n", cmds[i].name, cmds[i].summary);
    fprintf(out, "\n'%s <command> --help' describes each command.\n", group);
}

int cli_dispatch(const char *group, const cli_command *cmds, size_t n_cmds, int argc, char **argv) {
    if (argc < 2) {
        print_commands(stderr, group, cmds, n_cmds);
        return MOESIM_EXIT_INPUT;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_commands(stdout, group, cmds, n_cmds);
        return 0;
    }
    for (size_t i = 0; i < n_cmds; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].run(argc - 1, argv + 1);
    fprintf(stderr, "%s: unknown command '%s' (known:", group, argv[1]);
    for (size_t i = 0; i < n_cmds; i++) fprintf(stderr, "%s %s", i ? "," : "", cmds[i].name);
    fprintf(stderr, ")\n");
    return MOESIM_EXIT_INPUT;
}

int cli_fail(const moesim_error *err) {
    fflush(stdout);
    fprintf(stderr, "moesim: %s\n", err->msg[0] ? err->msg : "unknown error");
    return MOESIM_EXIT_INPUT;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "moesim %s: ", cmd);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see 'moesim %s --help')\n", cmd);
    return MOESIM_EXIT_INPUT;
}

int cli_getopt_error(const char *cmd, int c, int argc, char **argv, const struct option *opts) {
    const char *arg = optind >= 1 && optind <= argc ? argv[optind - 1] : "";
    if (!strncmp(arg, "--", 2)) { /* getopt_long has stepped past the long option */
        int n = (int)strcspn(arg, "=");
        if (c == ':') return cli_usage_error(cmd, "option '%.*s' needs a value", n, arg);
        if (arg[n] == '=')
            for (const struct option *o = opts; o && o->name; o++)
                if ((int)strlen(o->name) == n - 2 && !strncmp(o->name, arg + 2, (size_t)n - 2) &&
                    o->has_arg == no_argument)
                    return cli_usage_error(cmd, "option '%.*s' takes no value", n, arg);
        return cli_usage_error(cmd, "unknown option '%.*s'", n, arg);
    }
    if (c == ':') return cli_usage_error(cmd, "option '-%c' needs a value", optopt);
    return cli_usage_error(cmd, "unknown option '-%c'", optopt);
}

void cli_print_json(json_t *j) {
    json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    fputc('\n', stdout);
    json_decref(j);
}

bool cli_progress_allowed(bool quiet) { return !quiet && isatty(STDERR_FILENO); }

void cli_collect(const char ***list, size_t *n, const char *item) {
    *list = moesim_xrealloc(*list, (*n + 1) * sizeof **list);
    (*list)[(*n)++] = item;
}

moesim_status cli_settings_load(config *settings, const char *const *files, size_t n_files,
                                const char *const *sets, size_t n_sets, moesim_error *err) {
    moesim_status st = MOESIM_OK;
    for (size_t i = 0; i < n_files && !st; i++) st = config_load_file(settings, files[i], err);
    for (size_t i = 0; i < n_sets && !st; i++) st = config_set(settings, sets[i], err);
    return st;
}

moesim_status cli_sim_inputs_load(const char *trace_path, const char *hw_name,
                                  const char *model_name, trace **t, hw_profile *hw,
                                  model_geometry *model, quant_table *quant, moesim_error *err) {
    moesim_status st = trace_read(trace_path, t, err);
    if (!st) st = hw_load_by_name(hw_name, hw, err);
    if (!st) st = model_load_by_name(model_name ? model_name : (*t)->meta.model, model, err);
    if (!st) st = quant_table_load_default(quant, err);
    return st;
}

moesim_status cli_sim_inputs_stream(const char *trace_path, const trace_stream_options *opt,
                                    const char *hw_name, const char *model_name, trace_stream **ts,
                                    hw_profile *hw, model_geometry *model, quant_table *quant,
                                    moesim_error *err) {
    moesim_status st = trace_stream_open_with(trace_path, opt, ts, err);
    if (!st) st = hw_load_by_name(hw_name, hw, err);
    if (!st)
        st = model_load_by_name(model_name ? model_name : trace_stream_tokens(*ts)->meta.model,
                                model, err);
    if (!st) st = quant_table_load_default(quant, err);
    return st;
}
