/* Calibrations between a validation's rounds (`moesim validate --calibrate-rounds DIR`): a
 * shared machine drifts (this project's VM measured its disk at 2.2-3.8 GB/s and its int4 ops
 * 20-40 % apart within 1.5 h), so one calibration before a long validation cannot tell the
 * simulator's error from the machine slowing down. The machine is calibrated before the first
 * round of replays and after each; round r is simulated with the mean of the calibrations around
 * it, and the simulated TPOT under each calibration says what the drift during a round is worth
 * (sweep/validate_run.c). */
#ifndef MOESIM_SWEEP_VALIDATE_CALIB_H
#define MOESIM_SWEEP_VALIDATE_CALIB_H

#include <stdbool.h>
#include <stdint.h>

#include "common/hw.h"
#include "common/model.h"
#include "common/status.h"
#include "replay/replay.h"
#include "replay/report_files.h"

typedef struct validate_calibrator {
    const model_geometry *model; /* whose ops are timed */
    const hw_profile *base;      /* what a calibration cannot measure (datasheet figures) */
    moesim_precision precision;  /* the runs' expert precision: the gate+up figure's */
    uint32_t repeats;            /* timed repetitions per point */
    bool cpu;                    /* calibrate the CPU replay (else the GPU) */
    const char *dir;             /* where the profiles and cost tables are written */
    /* the points the runs need (calib_options): the most tokens of one step, the most attended
     * positions, the expert formats stored (NULL: all) */
    uint32_t max_tokens, max_context;
    const bool *precisions;
    calib_cpu_cache *cache; /* cpu: the validation's expert file, and what calibrations keep */
    uint64_t start_ns;      /* the validation's start (replay_exec_clock_ns) */
    bool quiet;             /* no line per calibration on stderr */
} validate_calibrator;

/* Makes `dir` (mkdir -p) and checks it is writable: a validation finds out before its replays,
 * not after them. */
moesim_status validate_calib_dir_prepare(const char *dir, moesim_error *err);

/* One calibration of the machine, now; its figures to *fig (the profile's path set by
 * validate_calib_publish). */
moesim_status validate_calib_take(const validate_calibrator *c, calib_results *out,
                                  validate_calibration *fig, moesim_error *err);

/* Writes a calibration as DIR/STEM.ini and its cost table as DIR/STEM-cost.txt, and loads the
 * profile back as the simulator reads it: *hw, and the table's path in table[table_len]. */
moesim_status validate_calib_publish(const validate_calibrator *c, const calib_results *r,
                                     const char *stem, hw_profile *hw, char *table,
                                     size_t table_len, moesim_error *err);

/* The mean of two calibrations of the same model, point by point: the machine during the round
 * between them. */
void validate_calib_mean(const calib_results *a, const calib_results *b, calib_results *out);

#endif
