/* The files of a validation report (`moesim validate`): the Markdown report, the CSV that
 * plots/validate.gp draws, the JSON of the rows and the summary, and the merge of several such
 * JSON files (e.g. one GPU call per budget) into one set. The arithmetic behind them:
 * replay/report.c. */
#ifndef MOESIM_REPLAY_REPORT_FILES_H
#define MOESIM_REPLAY_REPORT_FILES_H

#include <stdio.h>

#include <jansson.h>

#include "common/status.h"
#include "replay/replay.h"

/* What the report names besides its rows. */
typedef struct validate_meta {
    char device[96];  /* the GPU (or CPU) the replay ran on */
    char profile[96]; /* the calibrated hardware profile */
    char trace[1024]; /* the trace's path */
    char model[96];   /* the model geometry */
} validate_meta;

/* The Markdown report: one table row per configuration the simulator ran, the refused ones, the
 * medians, the policy order and the pairs ordered differently or tied. */
void validate_report_write_md(FILE *f, const validate_meta *meta, const validate_row *rows,
                              size_t n, const validate_summary *s);
/* The rows as CSV (refused configurations left out), written atomically to `path`. */
moesim_status validate_report_write_csv(const char *path, const validate_row *rows, size_t n,
                                        moesim_error *err);
/* The rows and the summary as JSON (what validate_report_merge reads back). Caller owns it. */
json_t *validate_report_json(const validate_meta *meta, const validate_row *rows, size_t n,
                             const validate_summary *s);
/* The rows of several validate_report_json files as one set; every file must name the same
 * device (the other names are the last file's). Errors name the file. Caller frees *rows. */
moesim_status validate_report_merge(const char *const *files, size_t n_files, validate_meta *meta,
                                    validate_row **rows, size_t *n_rows, moesim_error *err);

#endif
