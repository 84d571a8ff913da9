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

/* One calibration of a validation that calibrates through its rounds (validate
 * --calibrate-rounds): the figures of the machine that move when it drifts. */
typedef struct validate_calibration {
    double at_s;              /* when it started, seconds after the validation's start */
    double disk_gb_per_s;     /* the link (CPU: O_DIRECT reads), its peak */
    double disk_latency_us;   /* and its per-request latency */
    double gate_up_us;        /* one expert's gate+up for one token at the run's precision */
    double attention_proj_us; /* one layer's attention projections for one token */
    double lm_head_us;        /* the LM head for one token */
    /* what the copy thread's reads and the ops cost each other, fractions (the profile's
     * slowdown_beside_compute and slowdown_beside_copy; NAN: not measured) */
    double reads_beside_ops, ops_beside_reads;
    char profile[1024]; /* the profile written (its cost table beside it) */
} validate_calibration;

/* What the report names besides its rows. */
typedef struct validate_meta {
    char device[96];  /* the GPU (or CPU) the replay ran on */
    char profile[96]; /* the calibrated hardware profile */
    char trace[1024]; /* the trace's path */
    char model[96];   /* the model geometry */
    /* validate --calibrate-rounds: [0] the calibration before round 1, [r] round r's slices
     * combined (0: not calibrated through the rounds) */
    uint32_t n_calib;
    validate_calibration calib[VALIDATE_MAX_ROUNDS + 1];
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
