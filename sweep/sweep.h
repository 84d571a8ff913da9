/* Sweeps: an experiment file names fixed settings and axes; its configurations (the cross product
 * of the axes, minus exclusions, without duplicates) each become one CSV row of settings and
 * metrics, keyed by a stable hash of the resolved configuration (experiments/README.md).
 *
 * Experiment file (INI, ';' or '#' comments):
 *   [experiment]  name, paper (the published setting it reproduces), seed (base seed, default 1),
 *                 evaluator: "sim" (sim_run per configuration, the default) or "trace-stats"
 *                 (LRU / OPT hit rate of a per-layer cache of `stats.capacity` experts, or
 *                 of `stats.capacity_share` of the layer's experts)
 *   [fixed]       key = value          set in every configuration
 *   [axes]        key = v1, v2, ...    one axis per key; "a:b:step" expands to a, a+step, ... <= b
 *   [axis NAME]   label = k=v, k=v     a bundle axis: each label sets several keys at once (the
 *                                      rows of a paper's ablation table); NAME becomes a column
 *   [exclude]     k=v, k!=v, ...       one condition per line; a configuration matching every
 *                                      term of a line is dropped (NAME=label matches bundles)
 *   [traces]      path = ARGS          how to make a trace that is missing:
 *                                      `moesim trace synth ARGS -o path` (run by `moesim sweep`)
 *   [validate]    what only `moesim validate --experiment` reads (a sweep ignores it; the
 *                 options of the same names win): repeats (rounds of replays), tpot_error_max
 *                 and order_margin (together: its --check TPOT,MARGIN)
 * Keys: policy, model, hw, trace (the run's inputs), policy_lib (a policy plug-in FILE.so,
 * policies/WRITING.md: configurations whose policy is the plug-in's run it, the others the
 * built-in of their name; a column only where set), or section.key (a `--set` setting, e.g.
 * memory.budget_gb, batch.size, dymoe.retention), or label.NAME: an annotation that becomes a
 * column and part of the hash but is not handed to the evaluator (e.g. a paper's cache size).
 * Values hold no ',' '"' '=' or control characters (they are CSV fields) and do not start with
 * ';' or '#' (the resolved copy writes "key = value", where those start a comment). Axes override
 * [fixed]; two axes setting one key is an error.
 *
 * Resolution: a configuration keeps the settings of its own policy's section and drops those of
 * the other policies the experiment names (so `policy = lru, dymoe` x `dymoe.lambda = 1, 2` gives
 * one lru configuration, not two identical ones); configurations that resolve to the same settings
 * are one. Exclusions are checked before that drop, on the assignments as written.
 *
 * Hash: FNV-1a 64 over "moesim-sweep-1", the evaluator, the base seed and every (column, value)
 * set, in column-name order: independent of file order, of where a setting came from (fixed,
 * axis, bundle) and of the other configurations. sweep_experiment_bind_inputs then folds in what
 * the names resolve to, so a row is keyed by the resolved configuration: the trace's [traces]
 * recipe and the FNV-1a of its file's bytes (0 while the file is absent), the FNV-1a of the
 * policy_lib file's bytes (a rebuilt plug-in gives new hashes), and for the sim
 * evaluator the (section, key, value) settings of the model and hw files in name order (not
 * their file names, comments or layout). Editing a recipe, replacing a trace or changing a
 * model's or a profile's values gives new hashes: the old rows stay in the file, unmatched.
 * Last it folds in the code version (the point's `code`, its own column): the simulator's
 * SIM_CODE_VERSION and the policy's policy_methods.version for the sim evaluator,
 * SWEEP_STATS_CODE_VERSION for trace-stats. A row an older version made is stale: rerun, unless
 * the run keeps stale rows on purpose (sweep_options.reuse_stale, `sweep --reuse-stale`).
 *
 * Seed: every configuration runs with sim.seed = the [experiment] seed (common random numbers:
 * configurations differ only by their settings) unless it sets sim.seed itself (an axis
 * sim.seed = 1:5:1 gives replicates); the row's seed column records it.
 *
 * Results file: a header line, then one line per finished configuration:
 *   config_hash,seed,status,code,moesim,<columns>,<metrics>[,policy_report]
 * status is "ok" or the run's one-line error (metrics NaN); code is the code version in the hash,
 * moesim the `git describe` of the build that made the row. Rows are appended by one writer,
 * each with a single write() and fdatasync, so a killed sweep leaves complete rows plus at most one
 * torn last line (no newline), which the next run truncates before it appends. */
#ifndef MOESIM_SWEEP_SWEEP_H
#define MOESIM_SWEEP_SWEEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define SWEEP_HASH_COLUMN     "config_hash"
#define SWEEP_MAX_COLUMNS     256
#define SWEEP_MAX_RECIPE_ARGS 64 /* arguments of one [traces] recipe (space-separated) */
/* Bumped whenever the trace-stats evaluator's figures change for the same trace. */
#define SWEEP_STATS_CODE_VERSION 1

typedef struct sweep_experiment sweep_experiment;

/* One resolved configuration. Borrowed from its experiment. */
typedef struct sweep_point {
    size_t index;         /* position in the experiment's configuration list */
    uint64_t hash;        /* of the resolved configuration (see above) */
    uint64_t inputs_hash; /* the same before the code version was folded in */
    char code[64];        /* the code version folded in ("sim1-lru0"): see Hash above */
    uint64_t seed;        /* sim.seed of the configuration, else the experiment seed */
    const char **values;  /* [n_columns] value of each column, NULL where not set */
    const char **origins; /* [n_columns] "file:line" where each value was set, NULL if unset */
} sweep_point;

/* Parses and resolves an experiment file. Errors name the file, line and what was expected.
 * Caller owns *out (sweep_experiment_destroy). */
moesim_status sweep_experiment_load(const char *path, sweep_experiment **out, moesim_error *err);
void sweep_experiment_destroy(sweep_experiment *e); /* accepts NULL */

const char *sweep_experiment_name(const sweep_experiment *e);  /* [experiment] name or stem */
const char *sweep_experiment_paper(const sweep_experiment *e); /* "" when not given */
const char *sweep_experiment_evaluator(const sweep_experiment *e);
uint64_t sweep_experiment_seed(const sweep_experiment *e);

/* Configurations after exclusions and deduplication, and what was dropped on the way. */
size_t sweep_experiment_count(const sweep_experiment *e);
size_t sweep_experiment_cross_size(const sweep_experiment *e); /* before exclusions */
size_t sweep_experiment_excluded(const sweep_experiment *e);
size_t sweep_experiment_duplicates(const sweep_experiment *e);
const sweep_point *sweep_experiment_point(const sweep_experiment *e, size_t i);
/* Folds the content of each configuration's inputs into its hash (see Hash above); each
 * distinct trace file is read, and each model and hw file parsed, once. Call after the traces
 * exist and before sweep_plan, sweep_run or sweep_merge; calling it again rebinds (inputs changed
 * since). Errors: a model or hw name that resolves to no valid file (naming the setting's
 * file:line). */
moesim_status sweep_experiment_bind_inputs(sweep_experiment *e, moesim_error *err);
/* The configuration with `hash`, or NULL. */
const sweep_point *sweep_experiment_find(const sweep_experiment *e, uint64_t hash);
/* p's hash had its figures come from code version `code` (a stale row's code column). */
uint64_t sweep_point_hash_with_code(const sweep_point *p, const char *code);

/* Columns: bundle axis names, then policy, model, hw, trace, then settings in order of first
 * appearance in the file. Settings are named "section.key". */
size_t sweep_experiment_n_columns(const sweep_experiment *e);
const char *sweep_experiment_column(const sweep_experiment *e, size_t i);
/* Index of a column by name, or -1. */
int sweep_experiment_column_index(const sweep_experiment *e, const char *name);
/* True for a column that is a `--set` setting (section.key), false for labels and run keys. */
bool sweep_experiment_column_is_setting(const sweep_experiment *e, size_t i);
/* Value of column `name` in point p, or NULL. */
const char *sweep_point_get(const sweep_experiment *e, const sweep_point *p, const char *name);

/* Axes in file order: the key of a simple axis or the NAME of a bundle (its column). */
size_t sweep_experiment_n_axes(const sweep_experiment *e);
const char *sweep_experiment_axis_name(const sweep_experiment *e, size_t i);

/* A [validate] value (checked when the file was read), or NULL; *origin "file:line" (may be
 * NULL). */
const char *sweep_experiment_validate_get(const sweep_experiment *e, const char *key,
                                          const char **origin);

/* [traces] recipes: path and the arguments of `moesim trace synth` that make it. */
size_t sweep_experiment_n_traces(const sweep_experiment *e);
void sweep_experiment_trace_at(const sweep_experiment *e, size_t i, const char **path,
                               const char **synth_args);

/* The file a configuration's `key` (trace, model or hw) = `value` names. A relative path resolves
 * against the experiment's inputs folder ([experiment] inputs: the file's own folder unless it
 * says `cwd`, the working directory, or names another folder), except a trace with a [traces]
 * recipe: the sweep makes it, so it is an output and, like the results file, is relative to the
 * working directory. Names (no '/', no ".ini") are returned unchanged for the data search path. */
void sweep_experiment_input_path(const sweep_experiment *e, const char *key, const char *value,
                                 char *out, size_t out_len);

/* Writes the resolved experiment (same format, axes expanded, a comment with the counts and the
 * seed rule) atomically to `path`; loading it gives the same configurations and hashes. */
moesim_status sweep_experiment_write_resolved(const sweep_experiment *e, const char *source,
                                              const char *path, moesim_error *err);

/* "results/x.csv" -> "results/x.experiment.ini": where the resolved experiment goes. */
void sweep_sidecar_path(const char *csv_path, char *out, size_t len);

/* ---- evaluating configurations ---- */

/* Turns one configuration into metrics. run() is called from several threads at once on one
 * shared evaluator: it must only read shared state (prepare() loads everything it needs). */
typedef struct sweep_evaluator {
    const char *name; /* "sim", "trace-stats" */
    size_t n_metrics;
    const char *const *metric_names; /* [n_metrics] CSV column names */
    const char *note_name;           /* a last text column (e.g. "policy_report"), or NULL */
    void *ctx;
    /* Fills metrics[n_metrics] and, with a note column, note (one CSV field); an error becomes
     * the row's status (metrics NaN, note empty). */
    moesim_status (*run)(void *ctx, const sweep_experiment *e, const sweep_point *p,
                         double *metrics, char *note, size_t note_len, moesim_error *err);
    void (*destroy)(void *ctx);
} sweep_evaluator;

/* The evaluator the experiment names, with everything loaded (models, hw profiles, traces):
 * errors for unreadable inputs come here, before anything runs. Caller owns *out (its
 * destroy). */
moesim_status sweep_evaluator_create(const sweep_experiment *e, sweep_evaluator *out,
                                     moesim_error *err);
void sweep_evaluator_destroy(sweep_evaluator *ev);

/* ---- running ---- */

#define SWEEP_MAX_JOBS 1024 /* worker threads: far more than a machine's cores */

typedef struct sweep_options {
    const char *csv_path; /* results file (created with its header, or resumed) */
    unsigned jobs;        /* worker threads, 1..SWEEP_MAX_JOBS */
    uint32_t shard_index; /* this shard, 0 <= shard_index < shard_count */
    uint32_t shard_count; /* 1: no sharding; configuration i belongs to shard i % count */
    bool progress;        /* draw a progress bar on stderr */
    bool reuse_stale;     /* keep rows an older simulator or policy version made as done */
    const char *source;   /* the experiment file, named in the resolved copy */
} sweep_options;

typedef struct sweep_summary {
    size_t in_shard;     /* configurations of this shard */
    size_t already_done; /* found in the results file */
    size_t ran;          /* run now */
    size_t failed;       /* rows whose status is an error (this run) */
    bool truncated_tail; /* a torn last line was removed */
    size_t foreign;      /* rows of the file that are no configuration of the experiment */
    size_t stale;        /* rows of an older code version (rerun; kept as done with reuse_stale) */
    char first_failure[MOESIM_ERROR_MAX];
    double elapsed_s;
} sweep_summary;

/* Runs every configuration of the shard not yet in the results file, appending one row each,
 * and writes the resolved experiment next to the results. Fails before running anything when
 * the results file has other columns or a malformed line before its last. */
moesim_status sweep_run(const sweep_experiment *e, const sweep_evaluator *ev,
                        const sweep_options *opt, sweep_summary *out, moesim_error *err);

/* The configuration indices of a shard not present in `csv_path` (absent file: all of them):
 * what sweep_run would run. Caller frees *todo. */
moesim_status sweep_plan(const sweep_experiment *e, const sweep_evaluator *ev,
                         const sweep_options *opt, size_t **todo, size_t *n_todo,
                         size_t *n_in_shard, moesim_error *err);

/* ---- merging shard files ---- */

typedef struct sweep_merge_report {
    size_t rows;             /* rows written */
    size_t expected;         /* configurations of the experiment (0 when none was given) */
    size_t missing;          /* configurations with no row */
    size_t missing_index[8]; /* the first few missing configuration indices */
    size_t unknown;          /* rows whose hash is not a configuration of the experiment */
} sweep_merge_report;

/* Joins results files with identical headers into `out_path` (atomically). A hash present twice
 * is refused (error naming both files and lines, nothing written). With an experiment, rows are
 * written in configuration order and the configurations without a row are reported (gaps);
 * without one, in input order. */
moesim_status sweep_merge(const char *const *inputs, size_t n_inputs, const char *out_path,
                          const sweep_experiment *e, sweep_merge_report *report, moesim_error *err);

#endif
