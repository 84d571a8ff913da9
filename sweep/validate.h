/* `moesim validate`'s orchestration: the configurations it compares (an experiment file's, the
 * best rows of a sweep's results CSV, or one policy as given), each run once through the
 * simulator (sim_run) and `repeats` times through the replay (replay_run on the GPU, or
 * replay_run_cpu), and the row comparing the two (validate_compare, replay/report.c). The
 * report's files are replay/report_files.h's; the command line is cli/validate.c's.
 *
 * An experiment file is a sweep's (sweep/sweep.h): its configurations, in order, are validate's.
 * Every configuration must name the same trace, hw and model (validate loads them once; the
 * --trace and --hw options win over the file). A row's label is what tells it from the other
 * configurations of the same policy: its values of the axes other than policy, memory.budget_gb
 * written "budget 16 GiB", others "key=value" ("as given" with none); the policy order is
 * compared among the rows of one label. The file's [validate] section may give repeats and the
 * check (tpot_error_max, order_margin). */
#ifndef MOESIM_SWEEP_VALIDATE_H
#define MOESIM_SWEEP_VALIDATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "replay/replay.h"
#include "replay/report_files.h"

#define VALIDATE_MAX_RUNS 512 /* configurations of one validation (and --top at most) */

/* One configuration: a policy and its settings. */
typedef struct validate_spec {
    char policy[POLICY_NAME_MAX];
    char label[96]; /* tells it from the other configurations of its policy (see above) */
    char **sets;    /* [n_sets] "section.key=value", owned */
    size_t n_sets;
} validate_spec;

typedef struct validate_plan {
    validate_spec *specs; /* [n] */
    size_t n;
    /* the inputs the experiment names ("" where it names none, or without an experiment) */
    char trace[1024], hw[1024], model[1024];
    uint32_t repeats;                /* [validate] repeats; 0: not given */
    bool check;                      /* [validate] tpot_error_max and order_margin given */
    double check_tpot, check_margin; /* their values */
} validate_plan;

/* The configurations of an experiment file; `budgets` (a comma list, or NULL) keeps only those
 * whose memory.budget_gb is one of them, each of which must match one. Errors name the file, the
 * line and the field. */
moesim_status sweep_validate_plan_experiment(const char *path, const char *budgets,
                                             validate_plan *out, moesim_error *err);
/* The `top` rows of a `moesim sweep` results CSV with the lowest `by` (ties in file order) among
 * those with status "ok" and, where the CSV has trace / hw columns, `trace_path` and `hw_name`:
 * its policy column and its setting columns (those sim_run or the policy reads) are replayed;
 * the other columns (metrics, label.*, config_hash, seed) are ignored. */
moesim_status sweep_validate_plan_winners(const char *csv_path, const char *by, uint32_t top,
                                          const char *trace_path, const char *hw_name,
                                          validate_plan *out, moesim_error *err);
/* One configuration: `policy` with the common settings alone (label "as given"). */
void sweep_validate_plan_one(const char *policy_name, validate_plan *out);
void sweep_validate_plan_free(validate_plan *p);

/* What every run of a validation shares. */
typedef struct validate_setup {
    const char *const *files; /* [n_files] --config files, then */
    size_t n_files;
    const char *const *sets; /* [n_sets] --set assignments, then each configuration's own */
    size_t n_sets;
    const char *trace_path, *hw_name;
    const char *model_name; /* NULL: the trace's */
    uint64_t seed;          /* synthetic weights */
    bool cpu;               /* replay_run_cpu instead of replay_run (the GPU) */
    const char *ssd_dir;    /* cpu: where the expert file goes (NULL: /var/tmp) */
    uint32_t repeats;       /* rounds of replays, 1 ..= VALIDATE_MAX_ROUNDS */
    bool quiet;             /* no line per replay on stderr */
    /* calibrate before the first round and after each, writing the profiles here
     * (sweep/validate_calib.h); NULL: the hw profile alone */
    const char *calibrate_dir;
    uint32_t calibrate_repeats; /* timed repetitions per point of those calibrations */
} validate_setup;

/* Loads the inputs (trace, hw profile, model, quantization table, in that order of errors),
 * checks for the device (GPU replay), makes the host store every run shares, runs every
 * configuration through the simulator, then `repeats` rounds of replays (every configuration once
 * per round: a slow drift of a shared machine falls on all alike), and fills rows[p->n] and
 * meta. With calibrate_dir, calibrates before the first round and in slices through every
 * round, simulates each round with its slices and compares the median replay with the median of
 * the rounds' simulations (sweep/validate_calib.h). A configuration the simulator refuses
 * (e.g. `static` when its experts do not fit the budget) is a refused row, not an error. */
moesim_status sweep_validate_run(const validate_setup *s, const validate_plan *p,
                                 validate_row *rows, validate_meta *meta, moesim_error *err);

#endif
