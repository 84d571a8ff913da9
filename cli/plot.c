/* `moesim plot NAME [--csv FILE] [-o DIR]` (the generic `moesim plot CSV --x --y` is
 * cli/plot_csv.c): renders plots/NAME.gp over a sweep's results CSV
 * into DIR/NAME.png and DIR/NAME.svg with gnuplot. The script reads the CSV path from the
 * gnuplot variable `csv` and leaves the terminal to this command, so one script gives both
 * formats. Each image is written to a temporary name and renamed when gnuplot succeeded. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/plot.h"
#include "common/atomic_file.h"
#include "common/paths.h"

static const char plot_help[] =
    "usage: moesim plot NAME [--csv results/NAME.csv] [-o DIR]\n"
    "       moesim plot CSV --x COL --y COL [--series COL] [--panel COL] [--logx] [--logy]\n"
    "                   -o FILE.png|FILE.svg\n"
    "\n"
    "The second form draws any sweep result (any CSV with a header): y against x, one line per\n"
    "value of --series, one panel per value of --panel, axes labelled from the column names\n"
    "with their units (tpot_ms.mean: 'tpot (ms), mean'). Rows with an empty or nan y are\n"
    "left out and counted.\n"
    "\n"
    "Runs gnuplot on plots/NAME.gp over the results of `moesim sweep experiments/NAME.ini` and\n"
    "writes DIR/NAME.png and DIR/NAME.svg (DIR: the CSV's folder; made when missing). The script\n"
    "is found on the data search path (see `moesim --help`). The scripts label axes with units\n"
    "and name the paper setting each figure reproduces; `make figures` renders them all.\n"
    "\n"
    "options:\n"
    "  --csv FILE   results file (default results/NAME.csv)\n"
    "  -o DIR       folder for the images (default: the CSV's folder)\n"
    "  -h, --help   this text\n";

const plot_format plot_formats[PLOT_FORMAT_COUNT] = {
    {"png", "pngcairo enhanced size 1400,900 font 'Sans,12'"},
    {"svg", "svg enhanced size 1400,900 font 'Sans,12' background rgb 'white'"},
};

static bool quote_safe(const char *s) { return !strchr(s, '\'') && !strchr(s, '\\'); }

/* The line of gnuplot's messages (`text`) that says why it failed: the last naming a script
 * line ("FILE" line N: ...), else the last that is not blank; into why[why_len]. */
static void failure_line(const char *text, char *why, size_t why_len) {
    const char *best = NULL, *last = NULL;
    for (const char *line = text; *line;) {
        size_t n = strcspn(line, "\n");
        if (strspn(line, " \t") < n) last = line;
        char copy[1024];
        snprintf(copy, sizeof copy, "%.*s", (int)n, line);
        const char *at = strstr(copy, " line ");
        if (at && isdigit((unsigned char)at[6])) best = line;
        line += n + (line[n] == '\n');
    }
    const char *pick = best ? best : last;
    if (!pick) {
        snprintf(why, why_len, "no message");
        return;
    }
    pick += strspn(pick, " \t");
    snprintf(why, why_len, "%.*s", (int)strcspn(pick, "\n"), pick);
}

int plot_gnuplot_run(const char *script, const char *csv, const char *paper, const char *terminal,
                     const char *out_path, int *exec_errno, char *why, size_t why_len) {
    *exec_errno = 0;
    why[0] = '\0';
    char setup[4 * PATH_MAX];
    snprintf(setup, sizeof setup, "csv='%s'; paper='%s'; set terminal %s; set output '%s'",
             csv ? csv : "", paper ? paper : "", terminal, out_path);
    fflush(stdout);
    fflush(stderr);
    FILE *messages = tmpfile(); /* gnuplot's stderr, read once it exited */
    int fds[2]; /* close-on-exec: the child writes errno into it only when exec fails */
    if (!messages || pipe(fds) != 0 || fcntl(fds[1], F_SETFD, FD_CLOEXEC) != 0) {
        *exec_errno = errno;
        if (messages) fclose(messages);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        *exec_errno = errno;
        close(fds[0]);
        close(fds[1]);
        fclose(messages);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        dup2(fileno(messages), STDERR_FILENO);
        execlp("gnuplot", "gnuplot", "-e", setup, script, (char *)NULL);
        int e = errno;
        ssize_t w = write(fds[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    close(fds[1]);
    int e = 0;
    ssize_t got;
    while ((got = read(fds[0], &e, sizeof e)) < 0 && errno == EINTR) {
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (got == (ssize_t)sizeof e) {
        fclose(messages);
        *exec_errno = e;
        return -1;
    }
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    char text[16384];
    rewind(messages);
    size_t n = fread(text, 1, sizeof text - 1, messages);
    text[n] = '\0';
    fclose(messages);
    if (rc == 0)
        fputs(text, stderr);
    else
        failure_line(text, why, why_len);
    return rc;
}

/* The generic form: an argument ending in .csv that is not --csv's value, or --x / --y. */
static bool plot_is_generic(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--x") || !strcmp(argv[i], "--y")) return true;
        if (!strcmp(argv[i], "--csv") || !strcmp(argv[i], "-o")) {
            i++;
            continue;
        }
        size_t n = strlen(argv[i]);
        if (n > 4 && !strcmp(argv[i] + n - 4, ".csv")) return true;
    }
    return false;
}

int cmd_plot(int argc, char **argv) {
    if (plot_is_generic(argc, argv)) return cmd_plot_csv(argc, argv);
    const char *name = NULL, *csv = NULL, *dir = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(plot_help, stdout);
            return 0;
        }
        if ((!strcmp(a, "--csv") || !strcmp(a, "-o")) && i + 1 >= argc)
            return cli_usage_error("plot", "option '%s' needs a value", a);
        if (!strcmp(a, "--csv"))
            csv = argv[++i];
        else if (!strcmp(a, "-o"))
            dir = argv[++i];
        else if (a[0] == '-' && a[1])
            return cli_usage_error("plot", "unknown option '%s'", a);
        else if (name)
            return cli_usage_error("plot", "one NAME expected, got '%s' and '%s'", name, a);
        else
            name = a;
    }
    if (!name) return cli_usage_error("plot", "missing NAME (a plots/NAME.gp script)");
    for (const char *p = name; *p; p++)
        if (*p == '/' || *p == '\'')
            return cli_usage_error("plot", "NAME '%s': expected a script name, not a path", name);
    char script[PATH_MAX], rel[PATH_MAX];
    snprintf(rel, sizeof rel, "plots/%s.gp", name);
    moesim_error err = {0};
    if (moesim_data_find(rel, "plot script", script, sizeof script, &err)) return cli_fail(&err);
    char csv_buf[PATH_MAX];
    if (!csv) {
        snprintf(csv_buf, sizeof csv_buf, "results/%s.csv", name);
        csv = csv_buf;
    }
    if (access(csv, R_OK) != 0) {
        moesim_fail(&err, MOESIM_EIO,
                    "%s: cannot read results (run `moesim sweep "
                    "experiments/%s.ini` first): %s",
                    csv, name, strerror(errno));
        return cli_fail(&err);
    }
    char dir_buf[PATH_MAX];
    if (!dir) {
        moesim_path_dirname(csv, dir_buf, sizeof dir_buf);
        dir = dir_buf;
    }
    /* the paper's published figures beside the plot's script: experiments/paper/NAME.csv */
    char paper[PATH_MAX];
    size_t base_len = strlen(script) - strlen("plots/") - strlen(name) - strlen(".gp");
    snprintf(paper, sizeof paper, "%.*sexperiments/paper/%s.csv", (int)base_len, script, name);
    if (access(paper, R_OK) != 0) paper[0] = '\0';
    if (!quote_safe(csv) || !quote_safe(dir) || !quote_safe(script) || !quote_safe(paper))
        return cli_usage_error("plot", "paths with quotes or backslashes are not supported");
    /* every image rendered before any replaces its file: a failure leaves the folder as it was
     * (without the folders this run made) */
    char out[PLOT_FORMAT_COUNT][PATH_MAX], made[PATH_MAX];
    atomic_file af[PLOT_FORMAT_COUNT];
    for (size_t f = 0; f < PLOT_FORMAT_COUNT; f++)
        snprintf(out[f], sizeof out[f], "%s/%s.%s", dir, name, plot_formats[f].ext);
    size_t begun = 0;
    moesim_status st = moesim_path_make_parents_noted(out[0], made, sizeof made, &err);
    for (; !st && begun < PLOT_FORMAT_COUNT; begun++) {
        if ((st = atomic_file_begin_path(&af[begun], out[begun], &err))) break;
        int exec_errno;
        char why[512];
        int rc = plot_gnuplot_run(script, csv, paper, plot_formats[begun].terminal,
                                  af[begun].tmp_path, &exec_errno, why, sizeof why);
        if (rc == 0) continue;
        if (exec_errno)
            st = moesim_fail(&err, MOESIM_EIO, "cannot run gnuplot: %s (install gnuplot)",
                             strerror(exec_errno));
        else
            st = moesim_fail(&err, MOESIM_EINPUT, "%s: gnuplot failed on %s: %s", script, csv, why);
        begun++; /* its temporary file too */
        break;
    }
    for (size_t f = 0; f < begun; f++) {
        if (!st && (st = atomic_file_commit(&af[f], &err)) == MOESIM_OK)
            printf("%s\n", out[f]);
        else
            atomic_file_abort(&af[f]);
    }
    if (st) {
        moesim_path_remove_made(out[0], made);
        return cli_fail(&err);
    }
    return 0;
}
