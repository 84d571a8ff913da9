/* The insides of an experiment shared by the files that parse it (sweep_experiment_parse.c),
 * resolve it (sweep_experiment.c) and bind its inputs (sweep_experiment_bind.c). Not for use
 * outside sweep/sweep_experiment*. */
#ifndef MOESIM_SWEEP_SWEEP_EXPERIMENT_INTERNAL_H
#define MOESIM_SWEEP_SWEEP_EXPERIMENT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "sweep/sweep.h"

#define SWEEP_N_RUN_KEYS 4
/* policy, model, hw, trace: the run's inputs */
extern const char *const sweep_run_keys[SWEEP_N_RUN_KEYS];

typedef struct assign {
    char *key; /* column name */
    char *value;
    char *origin; /* "file:line" */
} assign;

typedef struct axis {
    char *name; /* the key (simple axis) or the bundle's NAME */
    bool bundle;
    int line;
    size_t n;       /* values (labels) */
    size_t cap;     /* room in labels and origins */
    char **labels;  /* [n] simple axis: the values */
    char **origins; /* [n] "file:line" of each value */
    assign **sets;  /* bundle: [n][n_sets[i]] */
    size_t *n_sets; /* bundle: [n] */
} axis;

typedef struct cond_term {
    char *key, *value;
    bool negate; /* k!=v */
    int column;
} cond_term;

typedef struct exclusion {
    cond_term *terms; /* [n] all must match */
    size_t n;
    int line;
} exclusion;

struct sweep_experiment {
    char *path;
    char *inputs_dir; /* the folder relative input paths resolve against (sweep.h) */
    char *name, *paper, *evaluator;
    uint64_t seed;
    assign *fixed;
    size_t n_fixed;
    axis *axes;
    size_t n_axes;
    exclusion *excl;
    size_t n_excl;
    char **trace_paths, **trace_args; /* [n_traces] */
    size_t n_traces;
    assign *validate; /* [n_validate] the [validate] section */
    size_t n_validate;

    char **columns;   /* [n_columns] */
    bool *is_setting; /* [n_columns] */
    size_t n_columns;
    size_t *sorted; /* [n_columns] column indices in name order (for hashing) */

    sweep_point *points; /* [n_points] */
    size_t n_points, points_cap, cross_size, excluded, duplicates;
    uint64_t *base_hash; /* [n_points] hash of the settings alone (before bind_inputs) */
    uint64_t *find_hash; /* [n_points] sorted hashes */
    size_t *find_index;  /* [n_points] point index of each */
};

/* A run key (policy, model, hw, trace)? */
/* A value is a CSV field: no separators, quotes or control characters; and it does not start
 * with ';' or '#', which the resolved copy's "key = value" would turn into a comment. */
bool sweep_value_ok(const char *v);
bool sweep_key_is_run(const char *k);
/* section.key with identifier characters (the key part may hold further dots)? */
bool sweep_key_is_setting(const char *k);

/* Reads the file's sections into e (nothing resolved yet). Errors name the file and line. */
moesim_status sweep_experiment_parse(sweep_experiment *e, const char *path, FILE *fp,
                                     moesim_error *err);
/* (Re)builds the sorted (hash, point) index sweep_experiment_find searches. */
void sweep_experiment_index(sweep_experiment *e);

#endif
