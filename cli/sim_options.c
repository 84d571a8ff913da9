/* The shared options of `moesim sim`, `replay` and `validate`; see sim_options.h. */
#include "cli/sim_options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "policies/policy.h"

enum { /* getopt codes of the shared options: above every character */
       OPT_TRACE = 0x100,
       OPT_HW,
       OPT_POLICY,
       OPT_SET,
       OPT_CONFIG,
       OPT_JSON,
       OPT_TIMELINE,
       OPT_TIMELINE_WINDOW,
       OPT_POLICY_LIB,
       OPT_QUIET,
};

static const struct option run_rows[] = {
    {"trace", required_argument, NULL, OPT_TRACE},   {"hw", required_argument, NULL, OPT_HW},
    {"policy", required_argument, NULL, OPT_POLICY}, {"set", required_argument, NULL, OPT_SET},
    {"config", required_argument, NULL, OPT_CONFIG}, {"json", no_argument, NULL, OPT_JSON},
    {"quiet", no_argument, NULL, OPT_QUIET},
};
static const struct option timeline_rows[] = {
    {"timeline", required_argument, NULL, OPT_TIMELINE},
    {"timeline-window", required_argument, NULL, OPT_TIMELINE_WINDOW},
};
static const struct option plugin_rows[] = {
    {"policy-lib", required_argument, NULL, OPT_POLICY_LIB},
};
_Static_assert(MOESIM_ARRAY_LEN(run_rows) + MOESIM_ARRAY_LEN(timeline_rows) +
                       MOESIM_ARRAY_LEN(plugin_rows) ==
                   CLI_SIM_OPTIONS_MAX,
               "CLI_SIM_OPTIONS_MAX counts every shared row");

void cli_sim_options_start(cli_sim_options *o, unsigned groups, const struct option *own,
                           size_t n_own, struct option *opts) {
    *o = (cli_sim_options){0};
    size_t n = 0;
    if (groups & CLI_SIM_RUN)
        for (size_t i = 0; i < MOESIM_ARRAY_LEN(run_rows); i++) opts[n++] = run_rows[i];
    if (groups & CLI_SIM_TIMELINE)
        for (size_t i = 0; i < MOESIM_ARRAY_LEN(timeline_rows); i++) opts[n++] = timeline_rows[i];
    if (groups & CLI_SIM_PLUGIN)
        for (size_t i = 0; i < MOESIM_ARRAY_LEN(plugin_rows); i++) opts[n++] = plugin_rows[i];
    for (size_t i = 0; i < n_own; i++) opts[n++] = own[i];
    opts[n] = (struct option){NULL, 0, NULL, 0};
    optind = 1;
    opterr = 0; /* one line: ours, naming the option */
}

/* Records shared option `c`; false when `c` is not one. */
static bool take(cli_sim_options *o, int c, const char *arg) {
    switch (c) {
    case OPT_TRACE:
        o->trace_path = arg;
        return true;
    case OPT_HW:
        o->hw_name = arg;
        return true;
    case OPT_POLICY:
        o->policy_name = arg;
        return true;
    case OPT_SET:
        cli_collect(&o->sets, &o->n_sets, arg);
        return true;
    case OPT_CONFIG:
        cli_collect(&o->files, &o->n_files, arg);
        return true;
    case OPT_JSON:
        o->json = true;
        return true;
    case 'q': /* -q: only with the run group, the one that has --quiet */
    case OPT_QUIET:
        o->quiet = true;
        return true;
    case OPT_TIMELINE:
        o->timeline_path = arg;
        return true;
    case OPT_TIMELINE_WINDOW:
        o->timeline_window_text = arg;
        return true;
    case OPT_POLICY_LIB:
        o->policy_lib = arg;
        return true;
    default:
        return false;
    }
}

int cli_sim_options_next(cli_sim_options *o, int argc, char **argv, const struct option *opts) {
    int c;
    while ((c = getopt_long(argc, argv, ":hq", opts, NULL)) != -1 && take(o, c, optarg)) {
    }
    return c;
}

/* Loads --policy-lib once; 0 or the exit status after one line. */
static int load_plugin(const char *cmd, cli_sim_options *o) {
    if (!o->policy_lib || o->plugin) return 0;
    moesim_error err = {0};
    if (policy_plugin_open(o->policy_lib, &o->plugin, &err)) return cli_fail(&err);
    const char *name = policy_plugin_methods(o->plugin)->name;
    if (!o->policy_name) o->policy_name = name;
    if (strcmp(o->policy_name, name))
        return cli_usage_error(cmd, "--policy %s: the plug-in %s provides policy '%s'",
                               o->policy_name, o->policy_lib, name);
    return 0;
}

int cli_sim_options_check(const char *cmd, cli_sim_options *o, bool require_run) {
    int rc = load_plugin(cmd, o);
    if (rc) return rc;
    if (require_run && (!o->trace_path || !o->hw_name || !o->policy_name))
        return cli_usage_error(cmd, "--trace, --hw and --policy are required");
    if (o->policy_name && !o->plugin && !policy_lookup(o->policy_name))
        return cli_usage_error(cmd, "unknown policy '%s' (known: %s)", o->policy_name,
                               policy_names());
    if (o->timeline_path) { /* the run's input files, whose path the timeline must not take */
        moesim_error err = {0};
        const char *ins[] = {o->trace_path, o->hw_name, o->policy_lib};
        if (atomic_file_check_outputs(&o->timeline_path, 1, ins, MOESIM_ARRAY_LEN(ins), &err) ||
            atomic_file_check_outputs(&o->timeline_path, 1, o->files, o->n_files, &err))
            return cli_fail(&err);
    }
    if (o->timeline_window_text) {
        moesim_error err = {0};
        if (!o->timeline_path) return cli_usage_error(cmd, "--timeline-window needs --timeline");
        if (sim_timeline_window_parse(o->timeline_window_text, &o->timeline_window, &err))
            return cli_usage_error(cmd, "%s", err.msg);
    }
    return 0;
}

moesim_status cli_sim_options_settings(const cli_sim_options *o, config *settings,
                                       moesim_error *err) {
    return cli_settings_load(settings, o->files, o->n_files, o->sets, o->n_sets, err);
}

void cli_sim_options_timeline_help(FILE *out, int column) {
    static const struct {
        const char *option, *text;
    } rows[] = {
        {"--timeline FILE",
         "the run's timeline for Perfetto (ui.perfetto.dev): one track per stream\n"
         "and copy engine, HBM use as a counter. FILE's name picks the format:\n"
         ".pftrace or .perfetto-trace: Perfetto's protobuf, compressed (the\n"
         "smallest); .json.gz: gzip'd JSON; otherwise Chrome trace-event JSON"},
        {"--timeline-window steps=A:B | ms=A:B",
         "keep only what overlaps steps A to B-1, or [A, B) ms of the run's\n"
         "clock (a bound may be left out: steps=100:, ms=:2.5); sim/README.md"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        int n = fprintf(out, "  %s", rows[i].option);
        if (n + 1 > column) {
            fputc('\n', out);
            n = 0;
        }
        for (const char *p = rows[i].text; *p;) {
            const char *nl = strchr(p, '\n');
            size_t len = nl ? (size_t)(nl - p) : strlen(p);
            fprintf(out, "%*s%.*s\n", column - n, "", (int)len, p);
            n = 0;
            p += len + (nl != NULL);
        }
    }
}

const policy_methods *cli_sim_options_policy(const cli_sim_options *o) {
    return o->plugin ? policy_plugin_methods(o->plugin) : NULL;
}

static void print_fields(FILE *out, const config_field *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char key[96];
        snprintf(key, sizeof key, "%s.%s", f[i].section, f[i].key);
        fprintf(out, "  %-26s %s (default %s)\n", key, f[i].help,
                f[i].def && f[i].def[0] ? f[i].def : "none");
    }
}

void cli_sim_options_list_policies(const cli_sim_options *o, FILE *out) {
    size_t n;
    const policy_methods *const *all = policy_all(&n);
    for (size_t i = 0; i < n; i++) {
        fprintf(out, "%-16s %s\n", all[i]->name, all[i]->summary);
        print_fields(out, all[i]->knobs, all[i]->n_knobs);
    }
    const policy_methods *pm = cli_sim_options_policy(o);
    if (!pm) return;
    fprintf(out, "%-16s %s (plug-in %s)\n", pm->name, pm->summary, o->policy_lib);
    print_fields(out, pm->knobs, pm->n_knobs);
}

void cli_sim_options_free(cli_sim_options *o) {
    policy_plugin_close(o->plugin);
    o->plugin = NULL;
    free(o->sets);
    free(o->files);
    o->sets = o->files = NULL;
    o->n_sets = o->n_files = 0;
}
