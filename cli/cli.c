/* Command dispatch, error printing and JSON output shared by all commands; see cli.h. */
#include "cli/cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/paths.h"

static void print_commands(FILE *out, const char *group, const cli_command *cmds, size_t n) {
    fprintf(out, "usage: %s <command> [options]\n\ncommands:\n", group);
    for (size_t i = 0; i < n; i++) fprintf(out, "  %-10s %s\n", cmds[i].name, cmds[i].summary);
    fprintf(out, "\n'%s <command> --help' describes each command.\n", group);
    if (!strcmp(group, "moesim"))
        fputs("\noptions (any command):\n"
              "  --data-dir DIR  search DIR first for configs/, plots/, experiments/\n"
              "                  (repeatable; then $MOESIM_DATA_PATH, colon-separated; then\n"
              "                  ../share/moesim beside the executable; then the source tree\n"
              "                  of a build that runs from its build folder)\n"
              "  --version       the version and the commit this build was made from\n"
              "  -h, --help      this text\n",
              out);
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

bool cli_progress_allowed(bool quiet) { return !quiet; }

const char *cli_format_ms(double ms, char *buf, size_t len) {
    if (!isfinite(ms))
        snprintf(buf, len, "%g ms", ms);
    else if (fabs(ms) < 1.0)
        snprintf(buf, len, "%.3f ms", ms);
    else if (fabs(ms) < 10.0)
        snprintf(buf, len, "%.2f ms", ms);
    else if (fabs(ms) < 1000.0)
        snprintf(buf, len, "%.1f ms", ms);
    else
        snprintf(buf, len, "%.1f s", ms / 1000.0);
    return buf;
}

static void step_progress_layer_done(void *ctx, uint64_t step, uint32_t layer, uint64_t t0_ns,
                                     uint64_t t1_ns) {
    (void)layer, (void)t0_ns, (void)t1_ns;
    cli_step_progress *p = ctx;
    if (step + 1 <= p->steps) return; /* once per step, not per layer */
    p->steps = step + 1;
    progress_update(&p->bar, p->steps);
}

const sim_hooks *cli_step_progress_begin(cli_step_progress *p, const char *label, bool quiet) {
    memset(p, 0, sizeof *p);
    progress_begin(&p->bar, label, 0, cli_progress_allowed(quiet));
    p->hooks = (sim_hooks){.ctx = p, .on_layer_done = step_progress_layer_done};
    return &p->hooks;
}

void cli_step_progress_end(cli_step_progress *p) { progress_end(&p->bar); }

void cli_collect(const char ***list, size_t *n, const char *item) {
    *list = moesim_xrealloc(*list, (*n + 1) * sizeof **list);
    (*list)[(*n)++] = item;
}

moesim_status cli_settings_load(config *settings, const char *const *files, size_t n_files,
                                const char *const *sets, size_t n_sets, moesim_error *err) {
    moesim_status st = MOESIM_OK;
    for (size_t i = 0; i < n_files && !st; i++) {
        char path[4096]; /* a policy preset by name (configs/policies/NAME.ini), or a path */
        st = moesim_config_path("policies", files[i], path, sizeof path, err);
        if (!st) st = config_load_file(settings, path, err);
    }
    for (size_t i = 0; i < n_sets && !st; i++) st = config_set(settings, sets[i], err);
    return st;
}

moesim_status cli_trace_model_text(const trace *t, const char *model_name, char **text,
                                   moesim_error *err) {
    const char *name = model_name ? model_name : t->meta.model;
    char path[4096];
    moesim_status st = moesim_config_path("models", name, path, sizeof path, err);
    if (st && !model_name && (*text = trace_stored_model_config(t))) return MOESIM_OK;
    if (st) return st;
    FILE *fp = fopen(path, "rb");
    if (!fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = moesim_xmalloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, fp)) > 0)
        if ((n += got) + 1 == cap) buf = moesim_xrealloc(buf, cap *= 2);
    bool bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return moesim_fail(err, MOESIM_EIO, "%s: cannot read", path);
    }
    buf[n] = '\0';
    *text = buf;
    return MOESIM_OK;
}

void cli_trace_store_model_config(trace *t, const char *text) {
    json_t *params = t->params_json ? json_loads(t->params_json, 0, NULL) : NULL;
    if (!json_is_object(params)) {
        json_decref(params);
        params = json_object();
    }
    json_object_set_new(params, "model_config", json_string(text));
    char *s = json_dumps(params, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(params);
    MOESIM_ASSERT(s);
    free(t->params_json);
    t->params_json = moesim_xstrdup(s); /* trace_destroy frees with free(): not jansson's */
    free(s);
}
