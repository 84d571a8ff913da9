/* What `moesim plot NAME` (cli/plot.c) and `moesim plot CSV --x --y` (cli/plot_csv.c) share:
 * the image formats and running gnuplot. */
#ifndef MOESIM_CLI_PLOT_H
#define MOESIM_CLI_PLOT_H

#include <stddef.h>

/* Terminal settings of each format: size in pixels (png) or points (svg). */
typedef struct plot_format {
    const char *ext;
    const char *terminal;
} plot_format;

enum { PLOT_FORMAT_COUNT = 2 }; /* png, svg */
extern const plot_format plot_formats[PLOT_FORMAT_COUNT];

/* Runs gnuplot on `script` writing `out_path` with `terminal`; the gnuplot variables `csv` and
 * `paper` are set when not NULL. Its exit status, or -1 with *exec_errno set when it could not
 * be started. Gnuplot's messages are held back: passed on when it succeeds (its warnings), and
 * when it fails the one that says why goes to why[why_len] (its "FILE line N: ..." line, else
 * its last), for the caller's one line. */
int plot_gnuplot_run(const char *script, const char *csv, const char *paper, const char *terminal,
                     const char *out_path, int *exec_errno, char *why, size_t why_len);

/* `moesim plot CSV --x COL --y COL ...` (cli/plot_csv.c). */
int cmd_plot_csv(int argc, char **argv);

#endif
