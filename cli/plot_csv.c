/* `moesim plot CSV --x COL --y COL [--series COL] [--panel COL] [--logx] [--logy] -o FILE`: any
 * sweep result (or any CSV with a header) drawn with gnuplot, one line per value of the series
 * column, one panel per value of the panel column, axes labelled from the column names with
 * their units ("tpot_ms.mean" -> "tpot (ms), mean"). The experiment figures keep their scripts
 * (plots/NAME.gp, cli/plot.c); this is for everything else.
 *
 * The CSV is read here, not by gnuplot: a missing column or a value that is not a number is one
 * line naming the file, the line and the column, and gnuplot gets a clean data file (one block
 * per panel and series, points ordered by x) and a script made here. Rows whose y is empty or
 * "nan" (a run that failed) are left out and counted. The image is written to a temporary name
 * and renamed when gnuplot succeeded. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/plot.h"
#include "common/alloc.h"
#include "common/atomic_file.h"

#define PLOT_MAX_COLUMNS 512
#define PLOT_MAX_GROUPS  64 /* series and panels at most */
#define PLOT_NAME_MAX    128

typedef struct plot_point {
    uint32_t panel, series;
    double x, y;
} plot_point;

typedef struct plot_data {
    char series[PLOT_MAX_GROUPS][PLOT_NAME_MAX], panels[PLOT_MAX_GROUPS][PLOT_NAME_MAX];
    uint32_t n_series, n_panels;
    plot_point *points; /* [n_points] */
    size_t n_points, cap_points, skipped;
} plot_data;

/* Splits line (modified in place) at commas; returns the cell count. */
static uint32_t csv_split(char *line, char **cells, uint32_t cap) {
    uint32_t n = 0;
    size_t len = strlen(line);
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
    for (char *p = line; n < cap;) {
        cells[n++] = p;
        char *c = strchr(p, ',');
        if (!c) break;
        *c = '\0';
        p = c + 1;
    }
    return n;
}

/* The index of value `v` in `names` (added at its first appearance), or -1 when full. */
static int group_of(char names[][PLOT_NAME_MAX], uint32_t *n, const char *v) {
    for (uint32_t i = 0; i < *n; i++)
        if (!strcmp(names[i], v)) return (int)i;
    if (*n == PLOT_MAX_GROUPS) return -1;
    snprintf(names[*n], PLOT_NAME_MAX, "%s", v);
    return (int)(*n)++;
}

/* "tpot_ms.mean" -> "tpot (ms), mean"; "label.cache_experts" -> "cache experts". */
static void axis_label(const char *col, char *out, size_t cap) {
    static const struct {
        const char *suffix, *unit;
    } units[] = {{"_ns", "ns"},   {"_us", "µs"},       {"_ms", "ms"},        {"_s", "s"},
                 {"_gib", "GiB"}, {"_mib", "MiB"},     {"_gb", "GB"},        {"_bytes", "bytes"},
                 {"_pct", "%"},   {"_per_s", "per s"}, {"_tokens", "tokens"}};
    if (!strncmp(col, "label.", 6)) col += 6;
    char base[PLOT_NAME_MAX], stat[PLOT_NAME_MAX] = "";
    snprintf(base, sizeof base, "%s", col);
    char *dot = strchr(base, '.');
    if (dot) {
        snprintf(stat, sizeof stat, "%s", dot + 1);
        *dot = '\0';
    }
    const char *unit = NULL;
    size_t bl = strlen(base);
    for (size_t i = 0; i < sizeof units / sizeof *units && !unit; i++) {
        size_t sl = strlen(units[i].suffix);
        if (bl > sl && !strcmp(base + bl - sl, units[i].suffix)) {
            base[bl - sl] = '\0';
            unit = units[i].unit;
        }
    }
    for (char *p = base; *p; p++)
        if (*p == '_') *p = ' ';
    int n = snprintf(out, cap, "%s", base);
    if (unit && n >= 0 && (size_t)n < cap) n += snprintf(out + n, cap - (size_t)n, " (%s)", unit);
    if (stat[0] && n >= 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, ", %s", stat);
}

static int column_index(char **cells, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(cells[i], name)) return (int)i;
    return -1;
}

/* A number, or NaN for an empty cell or "nan"; false for anything else. */
static bool parse_value(const char *s, double *v) {
    if (!*s || !strcasecmp(s, "nan")) {
        *v = NAN;
        return true;
    }
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return end != s && !*end && errno == 0 && isfinite(*v);
}

/* Reads the points; one line on failure (the caller exits 2). */
static moesim_status plot_data_read(const char *path, const char *const cols[4], plot_data *d,
                                    moesim_error *err) {
    FILE *fp = fopen(path, "r");
    if (!fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL, *cells[PLOT_MAX_COLUMNS];
    size_t cap = 0;
    moesim_status st = MOESIM_OK;
    int idx[4] = {-1, -1, -1, -1}; /* x, y, series, panel */
    uint32_t n_cols = 0;
    for (unsigned long lineno = 1; !st && getline(&line, &cap, fp) >= 0; lineno++) {
        uint32_t n = csv_split(line, cells, PLOT_MAX_COLUMNS);
        if (lineno == 1) {
            n_cols = n;
            static const char *const what[4] = {"--x", "--y", "--series", "--panel"};
            for (int c = 0; c < 4 && !st; c++) {
                if (!cols[c]) continue;
                idx[c] = column_index(cells, n, cols[c]);
                if (idx[c] < 0)
                    st = moesim_fail(err, MOESIM_EINPUT,
                                     "%s:1: %s '%s': no such column (the header has %u columns, "
                                     "the first '%s')",
                                     path, what[c], cols[c], n, cells[0]);
            }
            continue;
        }
        if (n == 1 && !cells[0][0]) continue; /* blank line */
        if (n != n_cols) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%lu: %u columns, the header has %u", path,
                             lineno, n, n_cols);
            break;
        }
        plot_point p = {0};
        for (int c = 0; c < 2 && !st; c++)
            if (!parse_value(cells[idx[c]], c ? &p.y : &p.x))
                st = moesim_fail(err, MOESIM_EINPUT, "%s:%lu: %s: '%.40s' is not a number", path,
                                 lineno, cols[c], cells[idx[c]]);
        if (st) break;
        if (isnan(p.x) || isnan(p.y)) {
            d->skipped++;
            continue;
        }
        int s = idx[2] >= 0 ? group_of(d->series, &d->n_series, cells[idx[2]]) : 0;
        int q = idx[3] >= 0 ? group_of(d->panels, &d->n_panels, cells[idx[3]]) : 0;
        if (s < 0 || q < 0) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%lu: %s: more than %d distinct values", path,
                             lineno, s < 0 ? cols[2] : cols[3], PLOT_MAX_GROUPS);
            break;
        }
        p.series = (uint32_t)s;
        p.panel = (uint32_t)q;
        if (d->n_points == d->cap_points) {
            d->cap_points = d->cap_points ? 2 * d->cap_points : 256;
            d->points = moesim_xrealloc(d->points, d->cap_points * sizeof *d->points);
        }
        d->points[d->n_points++] = p;
    }
    if (!st && n_cols == 0)
        st = moesim_fail(err, MOESIM_EINPUT, "%s: empty file (no header)", path);
    if (!st && d->n_points == 0)
        st = moesim_fail(err, MOESIM_EINPUT, "%s: no rows with numbers in '%s' and '%s'", path,
                         cols[0], cols[1]);
    if (!d->n_series) d->n_series = 1;
    if (!d->n_panels) d->n_panels = 1;
    free(line);
    fclose(fp);
    return st;
}

static int point_cmp(const void *a, const void *b) {
    const plot_point *p = a, *q = b;
    if (p->panel != q->panel) return p->panel < q->panel ? -1 : 1;
    if (p->series != q->series) return p->series < q->series ? -1 : 1;
    return (p->x > q->x) - (p->x < q->x);
}

/* Gnuplot text: a string in single quotes (a quote doubled). */
static void put_quoted(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

/* The data file (one block per panel and series, in order) and the script drawing it. */
static moesim_status plot_files_write(plot_data *d, const char *const cols[4], bool logx, bool logy,
                                      const char *data_path, const char *script_path,
                                      moesim_error *err) {
    qsort(d->points, d->n_points, sizeof *d->points, point_cmp);
    FILE *f = fopen(data_path, "w");
    if (!f) return moesim_fail(err, MOESIM_EIO, "%s: cannot write: %s", data_path, strerror(errno));
    /* block b = panel * n_series + series; empty blocks hold one NaN point so indices agree */
    for (uint32_t q = 0; q < d->n_panels; q++)
        for (uint32_t s = 0; s < d->n_series; s++) {
            bool any = false;
            for (size_t i = 0; i < d->n_points; i++)
                if (d->points[i].panel == q && d->points[i].series == s) {
                    fprintf(f, "%.17g %.17g\n", d->points[i].x, d->points[i].y);
                    any = true;
                }
            if (!any) fprintf(f, "NaN NaN\n");
            fprintf(f, "\n\n");
        }
    if (fclose(f) != 0) return moesim_fail(err, MOESIM_EIO, "%s: write failed", data_path);
    f = fopen(script_path, "w");
    if (!f)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot write: %s", script_path, strerror(errno));
    char xl[2 * PLOT_NAME_MAX], yl[2 * PLOT_NAME_MAX];
    axis_label(cols[0], xl, sizeof xl);
    axis_label(cols[1], yl, sizeof yl);
    fprintf(f, "set datafile missing 'NaN'\nset grid\nset key top right\n");
    fputs("set xlabel ", f);
    put_quoted(f, xl);
    fputs(" noenhanced\nset ylabel ", f);
    put_quoted(f, yl);
    fputs(" noenhanced\n", f);
    if (logx) fputs("set logscale x\n", f);
    if (logy) fputs("set logscale y\n", f);
    if (d->n_panels > 1) {
        uint32_t cols_n = d->n_panels <= 2 ? d->n_panels : d->n_panels <= 4 ? 2 : 3;
        fprintf(f, "set multiplot layout %u,%u\n", (d->n_panels + cols_n - 1) / cols_n, cols_n);
    }
    for (uint32_t q = 0; q < d->n_panels; q++) {
        if (cols[3]) {
            char t[3 * PLOT_NAME_MAX];
            snprintf(t, sizeof t, "%s = %s", cols[3], d->panels[q]);
            fputs("set title ", f);
            put_quoted(f, t);
            fputs(" noenhanced\n", f);
        }
        fputs("plot ", f);
        for (uint32_t s = 0; s < d->n_series; s++) {
            fputs(s ? ", " : "", f);
            put_quoted(f, data_path);
            fprintf(f, " index %u using 1:2 with linespoints lw 2 pt 7 title ",
                    q * d->n_series + s);
            if (cols[2]) {
                char t[3 * PLOT_NAME_MAX];
                snprintf(t, sizeof t, "%s = %s", cols[2], d->series[s]);
                put_quoted(f, t);
                fputs(" noenhanced", f);
            } else {
                put_quoted(f, yl);
                fputs(" noenhanced", f);
            }
        }
        fputs("\n", f);
    }
    if (d->n_panels > 1) fputs("unset multiplot\n", f);
    if (fclose(f) != 0) return moesim_fail(err, MOESIM_EIO, "%s: write failed", script_path);
    return MOESIM_OK;
}

int cmd_plot_csv(int argc, char **argv) {
    const char *csv = NULL, *out = NULL, *cols[4] = {NULL, NULL, NULL, NULL};
    bool logx = false, logy = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int c = !strcmp(a, "--x")        ? 0
                : !strcmp(a, "--y")      ? 1
                : !strcmp(a, "--series") ? 2
                : !strcmp(a, "--panel")  ? 3
                                         : -1;
        bool takes = c >= 0 || !strcmp(a, "-o");
        if (takes && !v) return cli_usage_error("plot", "option '%s' needs a value", a);
        if (c >= 0)
            cols[c] = v;
        else if (!strcmp(a, "-o"))
            out = v;
        else if (!strcmp(a, "--logx"))
            logx = true;
        else if (!strcmp(a, "--logy"))
            logy = true;
        else if (a[0] == '-' && a[1])
            return cli_usage_error("plot", "unknown option '%s'", a);
        else if (csv)
            return cli_usage_error("plot", "one CSV expected, got '%s' and '%s'", csv, a);
        else
            csv = a;
        if (takes) i++;
    }
    if (!csv) return cli_usage_error("plot", "missing the CSV");
    if (!cols[0] || !cols[1]) return cli_usage_error("plot", "missing --x COL and --y COL");
    if (!out) return cli_usage_error("plot", "missing -o FILE.png or -o FILE.svg");
    size_t ol = strlen(out);
    const char *terminal = NULL;
    for (size_t f = 0; f < PLOT_FORMAT_COUNT; f++) {
        size_t el = strlen(plot_formats[f].ext);
        if (ol > el + 1 && out[ol - el - 1] == '.' && !strcmp(out + ol - el, plot_formats[f].ext))
            terminal = plot_formats[f].terminal;
    }
    if (!terminal)
        return cli_usage_error("plot", "-o %s: expected a name ending in .png or .svg", out);
    moesim_error err = {0};
    plot_data *d = moesim_xcalloc(1, sizeof *d);
    moesim_status st = plot_data_read(csv, cols, d, &err);
    char data_path[PATH_MAX], script_path[PATH_MAX];
    snprintf(data_path, sizeof data_path, "%s.data.tmp", out);
    snprintf(script_path, sizeof script_path, "%s.gp.tmp", out);
    if (!st) st = plot_files_write(d, cols, logx, logy, data_path, script_path, &err);
    atomic_file af;
    bool begun = !st && !(st = atomic_file_begin_path(&af, out, &err));
    if (!st) {
        int exec_errno;
        char why[512];
        int rc = plot_gnuplot_run(script_path, NULL, NULL, terminal, af.tmp_path, &exec_errno, why,
                                  sizeof why);
        if (rc != 0)
            st = exec_errno ? moesim_fail(&err, MOESIM_EIO,
                                          "cannot run gnuplot: %s (install "
                                          "gnuplot)",
                                          strerror(exec_errno))
                            : moesim_fail(&err, MOESIM_EINPUT, "%s: gnuplot failed: %s", csv, why);
    }
    if (begun && st) atomic_file_abort(&af);
    if (begun && !st) st = atomic_file_commit(&af, &err);
    unlink(data_path);
    unlink(script_path);
    size_t skipped = d->skipped;
    free(d->points);
    free(d);
    if (st) return cli_fail(&err);
    if (skipped)
        printf("skipped %zu rows without a number in %s or %s\n", skipped, cols[0], cols[1]);
    printf("%s\n", out);
    return 0;
}
