/* `moesim sweep EXPERIMENT.ini [-o CSV] [-j N] [--shard i/n] [--dry-run]` runs an experiment's
 * configurations (sweep/sweep.h), resuming a results file; `moesim sweep merge` joins shard files.
 * Traces the experiment names but that do not exist yet, or were made from another recipe (the
 * recipe is stamped in <trace>.recipe), are made first from its [traces] recipes with
 * `moesim trace synth` (a child process of this same binary). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "common/paths.h"
#include "sweep/sweep.h"

static const char sweep_help[] =
    "usage: moesim sweep EXPERIMENT.ini [-o results/NAME.csv] [-j N] [--shard i/n] [--dry-run]\n"
    "                    [--reuse-stale] [-q]\n"
    "       moesim sweep merge [-o OUT.csv] [--experiment EXPERIMENT.ini] SHARD.csv...\n"
    "\n"
    "Runs every configuration of an experiment (the cross product of its axes minus its\n"
    "exclusions; format in sweep/sweep.h and experiments/README.md) and appends one CSV row per\n"
    "configuration: its hash, seed, status, the code version in the hash and the commit of the\n"
    "build, every resolved setting and every metric of `moesim sim --json` (the same names).\n"
    "Rows already in the results file are skipped, so a killed sweep resumes where it stopped;\n"
    "rows an older simulator or policy version made are rerun. The resolved experiment goes next "
    "to the results\n"
    "(NAME.experiment.ini). Traces named in the experiment's [traces] section are synthesized\n"
    "first when missing or made from another recipe (stamped in TRACE.recipe). A row is keyed\n"
    "by the resolved configuration: trace bytes and model/hw values, not just their names.\n"
    "Relative input paths resolve against the experiment file's folder (experiments/README.md).\n"
    "\n"
    "options:\n"
    "  -o FILE        results file (default results/NAME.csv, or results/NAME.shard-I-of-N.csv)\n"
    "  -j N           worker threads (default: the cores of this machine)\n"
    "  --shard i/n    run only configurations whose index is i modulo n (0 <= i < n), for\n"
    "                 Slurm job arrays or GNU parallel over ssh; join with `moesim sweep merge`\n"
    "  --dry-run      list the configurations this run would do, run and write nothing\n"
    "  --reuse-stale  keep rows an older simulator or policy version made as done\n"
    "  -q, --quiet    no progress bar\n"
    "  -h, --help     this text\n"
    "\n"
    "merge: joins results files with the same columns into OUT (default results/NAME.csv with\n"
    "--experiment); refuses a configuration present twice; with --experiment (or the\n"
    "NAME.experiment.ini next to the first input) lists configurations with no row and exits 1.\n";

static bool parse_shard(const char *s, uint32_t *i, uint32_t *n) {
    const char *slash = strchr(s, '/');
    if (!slash) return false;
    char a[32], b[32];
    size_t la = (size_t)(slash - s);
    if (la == 0 || la >= sizeof a || strlen(slash + 1) >= sizeof b) return false;
    memcpy(a, s, la);
    a[la] = '\0';
    strcpy(b, slash + 1);
    uint64_t vi, vn;
    if (!config_parse_u64(a, &vi) || !config_parse_u64(b, &vn) || vn < 1 || vn > UINT32_MAX ||
        vi >= vn)
        return false;
    *i = (uint32_t)vi;
    *n = (uint32_t)vn;
    return true;
}

/* Runs `moesim trace synth ARGS -o path` (this binary) for a missing trace. */
static moesim_status synth_trace(const char *path, const char *args, moesim_error *err) {
    moesim_status st = moesim_path_make_parents(path, err);
    if (st) return st;
    char *copy = moesim_xstrdup(args);
    char *argv[SWEEP_MAX_RECIPE_ARGS + 6]; /* moesim trace synth ARGS -o path NULL */
    int argc = 0;
    argv[argc++] = "moesim";
    argv[argc++] = "trace";
    argv[argc++] = "synth";
    for (char *save = NULL, *tok = strtok_r(copy, " \t", &save); tok;
         tok = strtok_r(NULL, " \t", &save)) {
        MOESIM_ASSERT(argc < 3 + SWEEP_MAX_RECIPE_ARGS); /* sweep_experiment_load counted them */
        argv[argc++] = tok;
    }
    argv[argc++] = "-o";
    argv[argc++] = (char *)path;
    argv[argc] = NULL;
    fprintf(stderr, "sweep: synthesizing %s (moesim trace synth %s)\n", path, args);
    fflush(stderr);
    FILE *messages = tmpfile(); /* the child's stderr: its one line goes into ours */
    pid_t pid = messages ? fork() : -1;
    if (pid < 0) {
        int e = errno;
        free(copy);
        if (messages) fclose(messages);
        return moesim_fail(err, MOESIM_EIO, "cannot start moesim trace synth: %s", strerror(e));
    }
    if (pid == 0) {
        dup2(fileno(messages), STDERR_FILENO);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    free(copy);
    char text[4096] = "";
    rewind(messages);
    size_t n = fread(text, 1, sizeof text - 1, messages);
    text[n] = '\0';
    fclose(messages);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        fputs(text, stderr);
        return MOESIM_OK;
    }
    /* its last line, without the "moesim: " every error line starts with */
    while (n && text[n - 1] == '\n') text[--n] = '\0';
    const char *why = strrchr(text, '\n') ? strrchr(text, '\n') + 1 : text;
    if (!strncmp(why, "moesim: ", 8)) why += 8;
    return moesim_fail(err, MOESIM_EINPUT, "%s: its [traces] recipe '%s' failed: %s", path, args,
                       *why ? why : "no message");
}

/* "<trace>.recipe": the recipe the trace at `trace_path` was made from, one line. */
static void recipe_stamp_path(const char *trace_path, char *out, size_t len) {
    snprintf(out, len, "%s.recipe", trace_path);
}

/* True when `trace_path` exists and its stamp holds exactly `args`. */
static bool trace_matches_recipe(const char *trace_path, const char *args) {
    if (access(trace_path, F_OK) != 0) return false;
    char stamp[PATH_MAX + 16];
    recipe_stamp_path(trace_path, stamp, sizeof stamp);
    FILE *fp = fopen(stamp, "r");
    if (!fp) return false;
    size_t want = strlen(args) + 1;
    char *buf = moesim_xcalloc(want + 2, 1);
    size_t n = fread(buf, 1, want + 1, fp);
    fclose(fp);
    bool same = n == want && !memcmp(buf, args, want - 1) && buf[want - 1] == '\n';
    free(buf);
    return same;
}

static moesim_status write_recipe_stamp(const char *trace_path, const char *args,
                                        moesim_error *err) {
    char stamp[PATH_MAX + 16];
    recipe_stamp_path(trace_path, stamp, sizeof stamp);
    atomic_file af;
    moesim_status st = atomic_file_open(&af, stamp, err);
    if (st) return st;
    fprintf(af.fp, "%s\n", args);
    return atomic_file_commit(&af, err);
}

/* Makes every [traces] trace that is missing, or whose recipe changed since it was made (the
 * recipe is stamped in <trace>.recipe; a trace without a stamp is remade too). */
static moesim_status make_traces(const sweep_experiment *e, moesim_error *err) {
    for (size_t i = 0; i < sweep_experiment_n_traces(e); i++) {
        const char *path, *args;
        sweep_experiment_trace_at(e, i, &path, &args);
        if (trace_matches_recipe(path, args)) continue;
        if (access(path, F_OK) == 0)
            fprintf(stderr, "sweep: %s: made from another recipe (or unstamped): remaking it\n",
                    path);
        moesim_status st = synth_trace(path, args, err);
        if (!st) st = write_recipe_stamp(path, args, err);
        if (st) return st;
    }
    return MOESIM_OK;
}

static void print_point(const sweep_experiment *e, const sweep_point *p) {
    printf("%6zu %016" PRIx64, p->index, p->hash);
    for (size_t c = 0; c < sweep_experiment_n_columns(e); c++)
        if (p->values[c]) printf(" %s=%s", sweep_experiment_column(e, c), p->values[c]);
    printf("\n");
}

static int cmd_sweep_merge(int argc, char **argv) {
    const char *out = NULL, *exp_path = NULL;
    const char **inputs = NULL;
    size_t n_inputs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(sweep_help, stdout);
            free(inputs);
            return 0;
        }
        if ((!strcmp(a, "-o") || !strcmp(a, "--experiment")) && i + 1 >= argc) {
            free(inputs);
            return cli_usage_error("sweep merge", "option '%s' needs a value", a);
        }
        if (!strcmp(a, "-o"))
            out = argv[++i];
        else if (!strcmp(a, "--experiment"))
            exp_path = argv[++i];
        else if (a[0] == '-' && a[1]) {
            free(inputs);
            return cli_usage_error("sweep merge", "unknown option '%s'", a);
        } else
            cli_collect(&inputs, &n_inputs, a);
    }
    if (!n_inputs) return cli_usage_error("sweep merge", "no shard files given");
    moesim_error err = {0};
    char side[PATH_MAX];
    if (!exp_path) {
        sweep_sidecar_path(inputs[0], side, sizeof side);
        if (access(side, R_OK) == 0) exp_path = side;
    }
    sweep_experiment *e = NULL;
    if (exp_path &&
        (sweep_experiment_load(exp_path, &e, &err) || sweep_experiment_bind_inputs(e, &err))) {
        sweep_experiment_destroy(e);
        free(inputs);
        return cli_fail(&err);
    }
    char def_out[PATH_MAX];
    if (!out && e) {
        snprintf(def_out, sizeof def_out, "results/%s.csv", sweep_experiment_name(e));
        out = def_out;
    }
    if (!out) {
        free(inputs);
        return cli_usage_error("sweep merge", "-o OUT.csv needed (no experiment to name it)");
    }
    for (size_t i = 0; i < n_inputs; i++)
        for (size_t j = 0; j < i; j++)
            if (!strcmp(inputs[i], inputs[j])) {
                const char *twice = inputs[i];
                free(inputs);
                sweep_experiment_destroy(e);
                return cli_usage_error("sweep merge", "%s given twice", twice);
            }
    for (size_t i = 0; i < n_inputs; i++)
        if (!strcmp(inputs[i], out)) {
            free(inputs);
            sweep_experiment_destroy(e);
            return cli_usage_error("sweep merge", "output %s is also an input", out);
        }
    sweep_merge_report rep;
    moesim_status st = moesim_path_make_parents(out, &err);
    if (!st) st = sweep_merge(inputs, n_inputs, out, e, &rep, &err);
    if (!st && e) {
        char out_side[PATH_MAX];
        sweep_sidecar_path(out, out_side, sizeof out_side);
        st = sweep_experiment_write_resolved(e, exp_path, out_side, &err);
    }
    free(inputs);
    if (st) {
        sweep_experiment_destroy(e);
        return cli_fail(&err);
    }
    printf("merged %zu rows from %zu files into %s\n", rep.rows, n_inputs, out);
    int rc = 0;
    if (e && rep.missing) {
        fprintf(stderr,
                "sweep merge: gaps: %zu of %zu configurations have no row; first:", rep.missing,
                rep.expected);
        size_t shown = rep.missing < 8 ? rep.missing : 8;
        for (size_t i = 0; i < shown; i++) fprintf(stderr, " %zu", rep.missing_index[i]);
        fprintf(stderr, " (rerun their shards)\n");
        rc = 1;
    } else if (!e) {
        fprintf(stderr, "sweep merge: no experiment given: gaps not checked\n");
    }
    sweep_experiment_destroy(e);
    return rc;
}

int cmd_sweep(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "merge")) return cmd_sweep_merge(argc - 1, argv + 1);
    const char *exp_path = NULL, *out = NULL;
    uint32_t shard_i = 0, shard_n = 1;
    bool dry = false, quiet = false, sharded = false, reuse_stale = false;
    long jobs = sysconf(_SC_NPROCESSORS_ONLN);
    if (jobs < 1) jobs = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(sweep_help, stdout);
            return 0;
        }
        bool needs_value = !strcmp(a, "-o") || !strcmp(a, "-j") || !strcmp(a, "--shard");
        if (needs_value && i + 1 >= argc)
            return cli_usage_error("sweep", "option '%s' needs a value", a);
        if (!strcmp(a, "-o"))
            out = argv[++i];
        else if (!strcmp(a, "-j")) {
            uint64_t j;
            if (!config_parse_u64(argv[++i], &j) || j < 1 || j > SWEEP_MAX_JOBS)
                return cli_usage_error("sweep", "-j: expected 1..%d, got '%s'", SWEEP_MAX_JOBS,
                                       argv[i]);
            jobs = (long)j;
        } else if (!strcmp(a, "--shard")) {
            if (!parse_shard(argv[++i], &shard_i, &shard_n))
                return cli_usage_error("sweep", "--shard: expected i/n with 0 <= i < n, got '%s'",
                                       argv[i]);
            sharded = true;
        } else if (!strcmp(a, "--dry-run"))
            dry = true;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet"))
            quiet = true;
        else if (!strcmp(a, "--reuse-stale"))
            reuse_stale = true;
        else if (a[0] == '-' && a[1])
            return cli_usage_error("sweep", "unknown option '%s'", a);
        else if (exp_path)
            return cli_usage_error("sweep", "one EXPERIMENT.ini expected, got '%s' and '%s'",
                                   exp_path, a);
        else
            exp_path = a;
    }
    if (!exp_path) return cli_usage_error("sweep", "missing EXPERIMENT.ini");
    moesim_error err = {0};
    sweep_experiment *e = NULL;
    if (sweep_experiment_load(exp_path, &e, &err)) return cli_fail(&err);
    char def_out[PATH_MAX];
    if (!out) {
        if (sharded)
            snprintf(def_out, sizeof def_out, "results/%s.shard-%" PRIu32 "-of-%" PRIu32 ".csv",
                     sweep_experiment_name(e), shard_i, shard_n);
        else
            snprintf(def_out, sizeof def_out, "results/%s.csv", sweep_experiment_name(e));
        out = def_out;
    }
    sweep_options opt = {.csv_path = out,
                         .jobs = (unsigned)jobs,
                         .shard_index = shard_i,
                         .shard_count = shard_n,
                         .progress = cli_progress_allowed(quiet),
                         .reuse_stale = reuse_stale,
                         .source = exp_path};
    moesim_status st = MOESIM_OK;
    if (dry) {
        /* no evaluator loaded: the results file's setting columns are checked, not metrics */
        sweep_evaluator none = {.name = sweep_experiment_evaluator(e)};
        size_t *todo = NULL, n_todo = 0, n_shard = 0;
        st = sweep_experiment_bind_inputs(e, &err); /* traces not made yet: not done */
        if (!st) st = sweep_plan(e, &none, &opt, &todo, &n_todo, &n_shard, &err);
        if (st) {
            sweep_experiment_destroy(e);
            return cli_fail(&err);
        }
        printf("%s: %zu configurations (cross product %zu, %zu excluded, %zu duplicates); "
               "shard %" PRIu32 "/%" PRIu32 ": %zu, %zu done in %s, %zu to run\n",
               exp_path, sweep_experiment_count(e), sweep_experiment_cross_size(e),
               sweep_experiment_excluded(e), sweep_experiment_duplicates(e), shard_i, shard_n,
               n_shard, n_shard - n_todo, out, n_todo);
        for (size_t i = 0; i < n_todo; i++) print_point(e, sweep_experiment_point(e, todo[i]));
        free(todo);
        sweep_experiment_destroy(e);
        return 0;
    }
    st = make_traces(e, &err);
    if (!st) st = sweep_experiment_bind_inputs(e, &err);
    sweep_evaluator ev = {0};
    if (!st) st = sweep_evaluator_create(e, &ev, &err);
    if (!st) st = moesim_path_make_parents(out, &err);
    sweep_summary sum = {0};
    if (!st) st = sweep_run(e, &ev, &opt, &sum, &err);
    sweep_evaluator_destroy(&ev);
    if (st) {
        sweep_experiment_destroy(e);
        return cli_fail(&err);
    }
    if (sum.foreign)
        fprintf(stderr,
                "sweep: %s: %zu rows are not configurations of this experiment (edited since?); "
                "they stay in the file and in its figures\n",
                out, sum.foreign);
    if (sum.stale)
        fprintf(stderr,
                "sweep: %s: %zu rows were made by an older simulator or policy version (the code "
                "column); %s\n",
                out, sum.stale,
                reuse_stale ? "kept as done (--reuse-stale)"
                            : "their configurations rerun; the old rows stay in the file "
                              "(--reuse-stale keeps them as done)");
    if (sum.truncated_tail)
        fprintf(stderr, "sweep: %s: removed a torn last row left by an interrupted run\n", out);
    printf("%s: %zu configurations in shard %" PRIu32 "/%" PRIu32 ", %zu already done, %zu run "
           "in %.1f s (%.1f/s, %ld jobs) -> %s\n",
           sweep_experiment_name(e), sum.in_shard, shard_i, shard_n, sum.already_done, sum.ran,
           sum.elapsed_s, sum.elapsed_s > 0 ? (double)sum.ran / sum.elapsed_s : 0.0, jobs, out);
    int rc = 0;
    if (sum.failed) {
        fprintf(stderr, "sweep: %zu of %zu configurations failed (status column); first: %s\n",
                sum.failed, sum.ran, sum.first_failure);
        if (sum.failed == sum.ran) rc = MOESIM_EXIT_INPUT;
    }
    sweep_experiment_destroy(e);
    return rc;
}
