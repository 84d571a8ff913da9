/* Experiment files: loading (the sections are read by sweep_experiment_parse.c), the cross
 * product, exclusions, resolution, hashing, the accessors and the resolved copy written next to
 * results (format and rules: sweep.h).
 *
 * Enumeration order: axes in file order, the first axis varying slowest (nested loops), so the
 * configuration list, and each configuration's index, depend only on the file. */
#include "sweep/sweep.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/paths.h"
#include "sweep/sweep_experiment_internal.h"

#define SWEEP_HASH_TAG  "moesim-sweep-1"
#define SWEEP_MAX_CROSS 1000000u /* configurations before exclusions: beyond is a typo */

static int column_find(const sweep_experiment *e, const char *name) {
    for (size_t i = 0; i < e->n_columns; i++)
        if (!strcmp(e->columns[i], name)) return (int)i;
    return -1;
}

static int column_add(sweep_experiment *e, const char *name, bool setting) {
    int c = column_find(e, name);
    if (c >= 0) return c;
    if (e->n_columns == SWEEP_MAX_COLUMNS) return -1; /* build_columns reports it */
    e->columns = moesim_xrealloc(e->columns, (e->n_columns + 1) * sizeof *e->columns);
    e->is_setting = moesim_xrealloc(e->is_setting, (e->n_columns + 1) * sizeof *e->is_setting);
    e->columns[e->n_columns] = moesim_xstrdup(name);
    e->is_setting[e->n_columns] = setting;
    return (int)e->n_columns++;
}

/* ---- checks and resolution --------------------------------------------------------------- */

/* The keys an axis can set (all labels of a bundle together). */
static bool axis_sets_key(const axis *a, const char *key) {
    if (!a->bundle) return !strcmp(a->name, key);
    for (size_t i = 0; i < a->n; i++)
        for (size_t j = 0; j < a->n_sets[i]; j++)
            if (!strcmp(a->sets[i][j].key, key)) return true;
    return false;
}

static moesim_status check_axes(sweep_experiment *e, moesim_error *err) {
    for (size_t i = 0; i < e->n_axes; i++) {
        const axis *a = &e->axes[i];
        if (!a->n)
            return moesim_fail(err, MOESIM_EINPUT, "%s:%d: [axis %s]: no labels", e->path, a->line,
                               a->name);
        /* a value in [fixed] and on an [axes] axis, which sets it in every configuration: the
         * fixed one would never be used (a bundle's labels may override it, some of them) */
        for (size_t f = 0; f < e->n_fixed && !a->bundle; f++)
            if (axis_sets_key(a, e->fixed[f].key))
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s: [fixed] %s is also set by the axis at line %d (expected "
                                   "one of the two)",
                                   e->fixed[f].origin, e->fixed[f].key, a->line);
        for (size_t j = 0; j < i; j++) {
            const axis *b = &e->axes[j];
            /* every key a sets, checked against b */
            for (size_t v = 0; v < (a->bundle ? a->n : 1); v++)
                for (size_t s = 0; s < (a->bundle ? a->n_sets[v] : 1); s++) {
                    const char *k = a->bundle ? a->sets[v][s].key : a->name;
                    if (axis_sets_key(b, k))
                        return moesim_fail(err, MOESIM_EINPUT,
                                           "%s:%d: %s is set by two axes (the other at line %d)",
                                           e->path, a->line, k, b->line);
                }
        }
    }
    return MOESIM_OK;
}

/* A `--set` setting handed to the evaluator: section.key, except label.* (annotations: columns
 * of the CSV and part of the hash, e.g. a paper's cache size next to our per-layer count). */
static bool is_eval_setting(const char *k) {
    return sweep_key_is_setting(k) && strncmp(k, "label.", 6) != 0;
}

static moesim_status build_columns(sweep_experiment *e, moesim_error *err) {
    for (size_t i = 0; i < e->n_axes; i++)
        if (e->axes[i].bundle) column_add(e, e->axes[i].name, false);
    for (int i = 0; i < SWEEP_N_RUN_KEYS; i++) column_add(e, sweep_run_keys[i], false);
    for (size_t i = 0; i < e->n_fixed; i++)
        column_add(e, e->fixed[i].key, is_eval_setting(e->fixed[i].key));
    for (size_t i = 0; i < e->n_axes; i++) {
        const axis *a = &e->axes[i];
        if (!a->bundle) {
            column_add(e, a->name, is_eval_setting(a->name));
            continue;
        }
        for (size_t v = 0; v < a->n; v++)
            for (size_t s = 0; s < a->n_sets[v]; s++)
                column_add(e, a->sets[v][s].key, is_eval_setting(a->sets[v][s].key));
    }
    if (e->n_columns == SWEEP_MAX_COLUMNS)
        return moesim_fail(err, MOESIM_EINPUT, "%s: more than %d distinct keys", e->path,
                           SWEEP_MAX_COLUMNS - 1);
    e->sorted = moesim_xcalloc(e->n_columns, sizeof *e->sorted);
    for (size_t i = 0; i < e->n_columns; i++) e->sorted[i] = i;
    for (size_t i = 1; i < e->n_columns; i++) /* insertion sort by name: few columns */
        for (size_t j = i;
             j > 0 && strcmp(e->columns[e->sorted[j - 1]], e->columns[e->sorted[j]]) > 0; j--) {
            size_t t = e->sorted[j];
            e->sorted[j] = e->sorted[j - 1];
            e->sorted[j - 1] = t;
        }
    return MOESIM_OK;
}

static bool excluded_by(const sweep_experiment *e, const char *const *vals) {
    for (size_t x = 0; x < e->n_excl; x++) {
        bool all = true;
        for (size_t t = 0; t < e->excl[x].n && all; t++) {
            const cond_term *ct = &e->excl[x].terms[t];
            const char *v = vals[ct->column];
            bool eq = v && !strcmp(v, ct->value);
            all = ct->negate ? !eq : eq;
        }
        if (all) return true;
    }
    return false;
}

/* Drops the settings of the other policies the experiment names (sweep.h: Resolution). */
static void drop_other_policies(const sweep_experiment *e, const char **vals, const char **origins,
                                char *const *policy_names, size_t n_policy_names) {
    int pc = column_find(e, "policy");
    const char *own = vals[pc];
    for (size_t c = 0; c < e->n_columns; c++) {
        if (!e->is_setting[c] || !vals[c]) continue;
        const char *dot = strchr(e->columns[c], '.');
        size_t len = (size_t)(dot - e->columns[c]);
        for (size_t p = 0; p < n_policy_names; p++)
            if (strlen(policy_names[p]) == len && !strncmp(policy_names[p], e->columns[c], len) &&
                !(own && !strcmp(own, policy_names[p]))) {
                vals[c] = NULL;
                origins[c] = NULL;
                break;
            }
    }
}

static uint64_t point_hash(const sweep_experiment *e, const char *const *vals) {
    uint64_t h = hash_fnv1a64(SWEEP_HASH_TAG, sizeof SWEEP_HASH_TAG, MOESIM_FNV1A64_INIT);
    h = hash_fnv1a64(e->evaluator, strlen(e->evaluator) + 1, h);
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, e->seed);
    h = hash_fnv1a64(seed, strlen(seed) + 1, h);
    for (size_t i = 0; i < e->n_columns; i++) {
        size_t c = e->sorted[i];
        if (!vals[c]) continue;
        h = hash_fnv1a64(e->columns[c], strlen(e->columns[c]), h);
        h = hash_fnv1a64("=", 1, h);
        h = hash_fnv1a64(vals[c], strlen(vals[c]) + 1, h);
    }
    return h;
}

static int cmp_u64_pair(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static moesim_status describe_missing(const sweep_experiment *e, const sweep_point *p,
                                      const char *key, moesim_error *err) {
    return moesim_fail(err, MOESIM_EINPUT,
                       "%s: configuration %zu sets no '%s' (the %s evaluator needs it: put it in "
                       "[fixed] or on an axis)",
                       e->path, p->index, key, e->evaluator);
}

/* The sorted (hash, point) index sweep_experiment_find searches; rebuilt when hashes change. */
void sweep_experiment_index(sweep_experiment *e) {
    free(e->find_hash);
    free(e->find_index);
    uint64_t *pairs = moesim_xcalloc(2 * e->n_points + 2, sizeof *pairs); /* (hash, point) */
    for (size_t i = 0; i < e->n_points; i++) {
        pairs[2 * i] = e->points[i].hash;
        pairs[2 * i + 1] = i;
    }
    qsort(pairs, e->n_points, 2 * sizeof *pairs, cmp_u64_pair);
    e->find_hash = moesim_xcalloc(e->n_points + 1, sizeof *e->find_hash);
    e->find_index = moesim_xcalloc(e->n_points + 1, sizeof *e->find_index);
    for (size_t i = 0; i < e->n_points; i++) {
        e->find_hash[i] = pairs[2 * i];
        e->find_index[i] = (size_t)pairs[2 * i + 1];
    }
    free(pairs);
}

static moesim_status resolve(sweep_experiment *e, moesim_error *err) {
    /* exclusion terms name columns */
    for (size_t x = 0; x < e->n_excl; x++)
        for (size_t t = 0; t < e->excl[x].n; t++) {
            cond_term *ct = &e->excl[x].terms[t];
            ct->column = column_find(e, ct->key);
            if (ct->column < 0)
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s:%d: [exclude] %s: no fixed setting or axis sets this key",
                                   e->path, e->excl[x].line, ct->key);
        }
    /* the policies the experiment names */
    char **pol = NULL;
    size_t n_pol = 0;
    for (size_t i = 0; i < e->n_fixed; i++)
        if (!strcmp(e->fixed[i].key, "policy")) {
            pol = moesim_xrealloc(pol, (n_pol + 1) * sizeof *pol);
            pol[n_pol++] = e->fixed[i].value;
        }
    for (size_t i = 0; i < e->n_axes; i++) {
        const axis *a = &e->axes[i];
        for (size_t v = 0; v < a->n; v++) {
            if (!a->bundle && !strcmp(a->name, "policy")) {
                pol = moesim_xrealloc(pol, (n_pol + 1) * sizeof *pol);
                pol[n_pol++] = a->labels[v];
            }
            for (size_t s = 0; a->bundle && s < a->n_sets[v]; s++)
                if (!strcmp(a->sets[v][s].key, "policy")) {
                    pol = moesim_xrealloc(pol, (n_pol + 1) * sizeof *pol);
                    pol[n_pol++] = a->sets[v][s].value;
                }
        }
    }
    size_t cross = 1;
    for (size_t i = 0; i < e->n_axes; i++) {
        if (cross > SWEEP_MAX_CROSS / e->axes[i].n) {
            free(pol);
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: the cross product exceeds %u configurations", e->path,
                               SWEEP_MAX_CROSS);
        }
        cross *= e->axes[i].n;
    }
    e->cross_size = cross;
    size_t nc = e->n_columns;
    const char **vals = moesim_xcalloc(nc, sizeof *vals);
    const char **origins = moesim_xcalloc(nc, sizeof *origins);
    size_t *digit = moesim_xcalloc(e->n_axes + 1, sizeof *digit);
    size_t slots = 16;
    while (slots < 2 * cross) slots *= 2;
    size_t *table = moesim_xcalloc(slots, sizeof *table); /* open addressing: point index + 1 */
    moesim_status st = MOESIM_OK;
    for (size_t combo = 0; combo < cross && !st; combo++) {
        /* mixed radix: the last axis varies fastest */
        size_t rest = combo;
        for (size_t i = e->n_axes; i-- > 0;) {
            digit[i] = rest % e->axes[i].n;
            rest /= e->axes[i].n;
        }
        memset(vals, 0, nc * sizeof *vals);
        memset(origins, 0, nc * sizeof *origins);
        for (size_t i = 0; i < e->n_fixed; i++) {
            int c = column_find(e, e->fixed[i].key);
            vals[c] = e->fixed[i].value;
            origins[c] = e->fixed[i].origin;
        }
        for (size_t i = 0; i < e->n_axes; i++) {
            const axis *a = &e->axes[i];
            int c = column_find(e, a->name);
            vals[c] = a->labels[digit[i]];
            origins[c] = a->origins[digit[i]];
            for (size_t s = 0; a->bundle && s < a->n_sets[digit[i]]; s++) {
                const assign *as = &a->sets[digit[i]][s];
                int k = column_find(e, as->key);
                vals[k] = as->value;
                origins[k] = as->origin;
            }
        }
        if (excluded_by(e, vals)) {
            e->excluded++;
            continue;
        }
        drop_other_policies(e, vals, origins, pol, n_pol);
        uint64_t h = point_hash(e, vals);
        bool dup = false;
        size_t slot = (size_t)(h & (slots - 1));
        for (; table[slot]; slot = (slot + 1) & (slots - 1)) {
            const sweep_point *q = &e->points[table[slot] - 1];
            if (q->hash != h) continue;
            for (size_t c = 0; c < nc; c++) {
                const char *a = vals[c], *b = q->values[c];
                MOESIM_ASSERT((!a && !b) || (a && b && !strcmp(a, b))); /* 64-bit collision */
            }
            dup = true;
            break;
        }
        if (dup) {
            e->duplicates++;
            continue;
        }
        if (e->n_points == e->points_cap) { /* doubling: up to SWEEP_MAX_CROSS points */
            e->points_cap = e->points_cap ? 2 * e->points_cap : 16;
            e->points = moesim_xrealloc(e->points, e->points_cap * sizeof *e->points);
        }
        sweep_point *p = &e->points[e->n_points];
        p->index = e->n_points;
        p->hash = h;
        int sc = column_find(e, "sim.seed");
        p->seed = e->seed;
        if (sc >= 0 && vals[sc] && !config_parse_u64(vals[sc], &p->seed)) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: sim.seed: expected an unsigned integer, got '%s'", origins[sc],
                             vals[sc]);
        }
        p->values = moesim_xcalloc(nc, sizeof *p->values);
        p->origins = moesim_xcalloc(nc, sizeof *p->origins);
        memcpy(p->values, vals, nc * sizeof *vals);
        memcpy(p->origins, origins, nc * sizeof *origins);
        table[slot] = e->n_points + 1;
        e->n_points++;
    }
    free(vals);
    free(origins);
    free(digit);
    free(pol);
    free(table);
    if (st) return st;
    sweep_experiment_index(e);
    if (!e->n_points)
        return moesim_fail(err, MOESIM_EINPUT, "%s: every configuration is excluded", e->path);
    /* what the evaluator needs, in every configuration */
    static const char *const sim_needs[] = {"policy", "model", "hw", "trace"};
    static const char *const stats_needs[] = {"trace"};
    bool is_sim = !strcmp(e->evaluator, "sim");
    const char *const *needs = is_sim ? sim_needs : stats_needs;
    size_t n_needs = is_sim ? 4 : 1;
    for (size_t i = 0; i < e->n_points; i++)
        for (size_t k = 0; k < n_needs; k++)
            if (!sweep_point_get(e, &e->points[i], needs[k]))
                return describe_missing(e, &e->points[i], needs[k], err);
    return MOESIM_OK;
}

/* The trace-stats evaluator reads only these; anything else would be silently ignored. */
static moesim_status check_stats_columns(const sweep_experiment *e, moesim_error *err) {
    if (strcmp(e->evaluator, "trace-stats")) return MOESIM_OK;
    for (size_t c = 0; c < e->n_columns; c++) {
        if (!e->is_setting[c] || !strcmp(e->columns[c], "stats.capacity") ||
            !strcmp(e->columns[c], "stats.capacity_share"))
            continue;
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: %s: the trace-stats evaluator reads only trace, stats.capacity and "
                           "stats.capacity_share",
                           e->path, e->columns[c]);
    }
    return MOESIM_OK;
}

moesim_status sweep_experiment_load(const char *path, sweep_experiment **out, moesim_error *err) {
    *out = NULL;
    FILE *fp = fopen(path, "r");
    if (!fp)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot open experiment: %s", path,
                           strerror(errno));
    sweep_experiment *e = moesim_xcalloc(1, sizeof *e);
    e->path = moesim_xstrdup(path);
    e->seed = 1;
    e->evaluator = moesim_xstrdup("sim");
    e->paper = moesim_xstrdup("");
    moesim_status st = sweep_experiment_parse(e, path, fp, err);
    fclose(fp);
    if (!st && !e->inputs_dir) {
        char dir[PATH_MAX];
        moesim_path_dirname(path, dir, sizeof dir);
        e->inputs_dir = moesim_xstrdup(dir);
    }
    if (!st && !e->name) {
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        e->name = moesim_xstrdup(base);
        char *dot = strrchr(e->name, '.');
        if (dot && dot != e->name) *dot = '\0';
    }
    if (!st) st = check_axes(e, err);
    if (!st) st = build_columns(e, err);
    if (!st) st = check_stats_columns(e, err);
    if (!st) st = resolve(e, err);
    if (st) {
        sweep_experiment_destroy(e);
        return st;
    }
    *out = e;
    return MOESIM_OK;
}

void sweep_experiment_destroy(sweep_experiment *e) {
    if (!e) return;
    for (size_t i = 0; i < e->n_fixed; i++) {
        free(e->fixed[i].key);
        free(e->fixed[i].value);
        free(e->fixed[i].origin);
    }
    free(e->fixed);
    for (size_t i = 0; i < e->n_axes; i++) {
        axis *a = &e->axes[i];
        for (size_t v = 0; v < a->n; v++) {
            free(a->labels[v]);
            free(a->origins[v]);
            for (size_t s = 0; a->bundle && s < a->n_sets[v]; s++) {
                free(a->sets[v][s].key);
                free(a->sets[v][s].value);
                free(a->sets[v][s].origin);
            }
            if (a->bundle) free(a->sets[v]);
        }
        free(a->labels);
        free(a->origins);
        free(a->sets);
        free(a->n_sets);
        free(a->name);
    }
    free(e->axes);
    for (size_t x = 0; x < e->n_excl; x++) {
        for (size_t t = 0; t < e->excl[x].n; t++) {
            free(e->excl[x].terms[t].key);
            free(e->excl[x].terms[t].value);
        }
        free(e->excl[x].terms);
    }
    free(e->excl);
    for (size_t i = 0; i < e->n_traces; i++) {
        free(e->trace_paths[i]);
        free(e->trace_args[i]);
    }
    free(e->trace_paths);
    free(e->trace_args);
    for (size_t i = 0; i < e->n_validate; i++) {
        free(e->validate[i].key);
        free(e->validate[i].value);
        free(e->validate[i].origin);
    }
    free(e->validate);
    for (size_t i = 0; i < e->n_columns; i++) free(e->columns[i]);
    free(e->columns);
    free(e->is_setting);
    free(e->sorted);
    for (size_t i = 0; i < e->n_points; i++) {
        free(e->points[i].values);
        free(e->points[i].origins);
    }
    free(e->points);
    free(e->find_hash);
    free(e->find_index);
    free(e->base_hash);
    free(e->name);
    free(e->paper);
    free(e->evaluator);
    free(e->inputs_dir);
    free(e->path);
    free(e);
}

/* ---- accessors ---------------------------------------------------------------------------- */

const char *sweep_experiment_name(const sweep_experiment *e) { return e->name; }
const char *sweep_experiment_paper(const sweep_experiment *e) { return e->paper; }
const char *sweep_experiment_evaluator(const sweep_experiment *e) { return e->evaluator; }
uint64_t sweep_experiment_seed(const sweep_experiment *e) { return e->seed; }
size_t sweep_experiment_count(const sweep_experiment *e) { return e->n_points; }
size_t sweep_experiment_cross_size(const sweep_experiment *e) { return e->cross_size; }
size_t sweep_experiment_excluded(const sweep_experiment *e) { return e->excluded; }
size_t sweep_experiment_duplicates(const sweep_experiment *e) { return e->duplicates; }

const sweep_point *sweep_experiment_point(const sweep_experiment *e, size_t i) {
    MOESIM_ASSERT(i < e->n_points);
    return &e->points[i];
}

const sweep_point *sweep_experiment_find(const sweep_experiment *e, uint64_t hash) {
    size_t lo = 0, hi = e->n_points;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e->find_hash[mid] < hash)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < e->n_points && e->find_hash[lo] == hash ? &e->points[e->find_index[lo]] : NULL;
}

size_t sweep_experiment_n_columns(const sweep_experiment *e) { return e->n_columns; }

const char *sweep_experiment_column(const sweep_experiment *e, size_t i) {
    MOESIM_ASSERT(i < e->n_columns);
    return e->columns[i];
}

int sweep_experiment_column_index(const sweep_experiment *e, const char *name) {
    return column_find(e, name);
}

bool sweep_experiment_column_is_setting(const sweep_experiment *e, size_t i) {
    MOESIM_ASSERT(i < e->n_columns);
    return e->is_setting[i];
}

const char *sweep_point_get(const sweep_experiment *e, const sweep_point *p, const char *name) {
    int c = column_find(e, name);
    return c < 0 ? NULL : p->values[c];
}

size_t sweep_experiment_n_traces(const sweep_experiment *e) { return e->n_traces; }

void sweep_experiment_trace_at(const sweep_experiment *e, size_t i, const char **path,
                               const char **synth_args) {
    MOESIM_ASSERT(i < e->n_traces);
    *path = e->trace_paths[i];
    *synth_args = e->trace_args[i];
}

size_t sweep_experiment_n_axes(const sweep_experiment *e) { return e->n_axes; }

const char *sweep_experiment_axis_name(const sweep_experiment *e, size_t i) {
    MOESIM_ASSERT(i < e->n_axes);
    return e->axes[i].name;
}

const char *sweep_experiment_validate_get(const sweep_experiment *e, const char *key,
                                          const char **origin) {
    for (size_t i = 0; i < e->n_validate; i++)
        if (!strcmp(e->validate[i].key, key)) {
            if (origin) *origin = e->validate[i].origin;
            return e->validate[i].value;
        }
    return NULL;
}

/* ---- the resolved copy ------------------------------------------------------------------- */

moesim_status sweep_experiment_write_resolved(const sweep_experiment *e, const char *source,
                                              const char *path, moesim_error *err) {
    atomic_file af;
    moesim_status st = atomic_file_open(&af, path, err);
    if (st) return st;
    FILE *f = af.fp;
    fprintf(
        f,
        "; resolved by moesim %s from %s: %zu configurations (cross product %zu, %zu "
        "excluded, %zu duplicates)\n"
        "; every configuration runs with sim.seed = [experiment] seed unless it sets sim.seed (the "
        "seed column); config_hash: sweep/sweep.h\n",
        MOESIM_VERSION, source ? source : e->path, e->n_points, e->cross_size, e->excluded,
        e->duplicates);
    fprintf(f, "[experiment]\nname = %s\n", e->name);
    if (e->paper[0]) fprintf(f, "paper = %s\n", e->paper);
    fprintf(f, "seed = %" PRIu64 "\nevaluator = %s\n", e->seed, e->evaluator);
    char inputs[PATH_MAX]; /* absolute: the copy lives in another folder than the file */
    if (realpath(e->inputs_dir, inputs) && sweep_value_ok(inputs))
        fprintf(f, "inputs = %s\n", inputs);
    if (e->n_fixed) fprintf(f, "\n[fixed]\n");
    for (size_t i = 0; i < e->n_fixed; i++)
        fprintf(f, "%s = %s\n", e->fixed[i].key, e->fixed[i].value);
    for (size_t i = 0; i < e->n_axes; i++) {
        const axis *a = &e->axes[i];
        if (!a->bundle) {
            fprintf(f, "\n[axes]\n%s = ", a->name);
            for (size_t v = 0; v < a->n; v++) fprintf(f, "%s%s", v ? ", " : "", a->labels[v]);
            fputc('\n', f);
            continue;
        }
        fprintf(f, "\n[axis %s]\n", a->name);
        for (size_t v = 0; v < a->n; v++) {
            fprintf(f, "%s = ", a->labels[v]);
            for (size_t s = 0; s < a->n_sets[v]; s++)
                fprintf(f, "%s%s=%s", s ? ", " : "", a->sets[v][s].key, a->sets[v][s].value);
            fputc('\n', f);
        }
    }
    if (e->n_excl) fprintf(f, "\n[exclude]\n");
    for (size_t x = 0; x < e->n_excl; x++) {
        for (size_t t = 0; t < e->excl[x].n; t++)
            fprintf(f, "%s%s%s=%s", t ? ", " : "", e->excl[x].terms[t].key,
                    e->excl[x].terms[t].negate ? "!" : "", e->excl[x].terms[t].value);
        fputc('\n', f);
    }
    if (e->n_traces) fprintf(f, "\n[traces]\n");
    for (size_t i = 0; i < e->n_traces; i++)
        fprintf(f, "%s = %s\n", e->trace_paths[i], e->trace_args[i]);
    if (e->n_validate) fprintf(f, "\n[validate]\n");
    for (size_t i = 0; i < e->n_validate; i++)
        fprintf(f, "%s = %s\n", e->validate[i].key, e->validate[i].value);
    return atomic_file_commit(&af, err);
}

void sweep_sidecar_path(const char *csv_path, char *out, size_t len) {
    size_t n = strlen(csv_path);
    if (n > 4 && !strcmp(csv_path + n - 4, ".csv")) n -= 4;
    snprintf(out, len, "%.*s.experiment.ini", (int)n, csv_path);
}
