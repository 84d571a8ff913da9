/* Calibrations between a validation's rounds (`moesim validate --calibrate-rounds DIR`): a
 * shared machine drifts, so one calibration before a long validation cannot tell the simulator's
 * error from the machine slowing down, and a short calibration between rounds samples one second
 * of a machine whose slow spells last seconds. So the machine is calibrated once before the first
 * round (the profile of the first simulations) and then in slices spread over every round, one
 * repetition of every point before the round's first replay and after each replay; a round is
 * simulated with its slices combined, with the first and the second half of them apart (the
 * drift within the round and the slices' own noise) and with the even and the odd ones apart
 * (the same span of time: the noise alone), which together say what the drift within the round
 * is worth (sweep/validate_run.c). */
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
    uint32_t repeats;            /* repetitions per point of the calibration before round 1 */
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

/* One calibration of the machine, now, of `repeats` repetitions per point; *at_s: when it
 * started, seconds after the validation's start. */
moesim_status validate_calib_take(const validate_calibrator *c, uint32_t repeats,
                                  calib_results *out, double *at_s, moesim_error *err);

/* The figures of a calibration the report shows (the profile's path left empty). */
void validate_calib_figures(const validate_calibrator *c, const calib_results *r, double at_s,
                            validate_calibration *fig);
/* One line on stderr (unless quiet): "validate: WHAT at T s: link ... GB/s ...". */
void validate_calib_log(const validate_calibrator *c, const char *what,
                        const validate_calibration *fig);

/* Writes a calibration as DIR/STEM.ini and its cost table as DIR/STEM-cost.txt, and loads the
 * profile back as the simulator reads it: *hw, and the table's path in table[table_len]. */
moesim_status validate_calib_publish(const validate_calibrator *c, const calib_results *r,
                                     const char *stem, hw_profile *hw, char *table,
                                     size_t table_len, moesim_error *err);

/* Calibration slices taken through a round (one repetition each, before its first replay and
 * after every replay) as one calibration: the machine the round's replays met. Per point the
 * median over the slices times their pooled stall overhead (the time of all their calls over
 * what the medians account for: slow spells count as often as the round met them); the link
 * from each size's mean read time, refitted; DRAM and the matvec peak their means. The slices
 * must come from the same plan (one model, one validation). The n slices are slices[0],
 * slices[stride], ... (stride 2: every other slice of a round). */
void validate_calib_combine(const calib_results *slices, size_t n, size_t stride,
                            calib_results *out);

/* What a round's drift is worth in a configuration's simulated TPOT `compared`, from its TPOTs
 * with the profiles of the round's first and second half of slices (halves[2]) and of its even
 * and odd slices (parity[2]): halves differ by the drift and the slices' own noise, even and odd
 * span the same time and differ by the noise alone. *noise = |odd - even| / compared, *drift =
 * how much more the halves differ, / compared (0 when not more). */
void validate_calib_drift(const double halves[2], const double parity[2], double compared,
                          double *drift, double *noise);

#endif
