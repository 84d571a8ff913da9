/* Experiment files: parsing, the cross product, exclusions, resolution, hashing and the
 * resolved copy written next to results (format and rules: sweep.h).
 *
 * Enumeration order: axes in file order, the first axis varying slowest (nested loops), so the
 * configuration list, and each configuration's index, depend only on the file. */
#include "sim/sweep.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/paths.h"
#include "policies/policy.h"
#include "sim/sim.h"

#define SWEEP_HASH_TAG     "moesim-sweep-1"
#define SWEEP_MAX_CROSS    1000000u /* configurations before exclusions: beyond is a typo */
#define SWEEP_MAX_RANGE    100000u  /* values of one a:b:step axis */
#define SWEEP_MAX_DECIMALS 17       /* digits after the point of a decimal range value */

static const char *const run_keys[] = {"policy", "model", "hw", "trace"};
#define N_RUN_KEYS 4

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

/* ---- small helpers ----------------------------------------------------------------------- */

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

static bool is_run_key(const char *k) {
    for (int i = 0; i < N_RUN_KEYS; i++)
        if (!strcmp(k, run_keys[i])) return true;
    return false;
}

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '-'; }

/* section.key with identifier characters (the key part may hold further dots) */
static bool is_setting_key(const char *k) {
    const char *dot = strchr(k, '.');
    if (!dot || dot == k || !dot[1]) return false;
    for (const char *p = k; p < dot; p++)
        if (!ident_char(*p)) return false;
    for (const char *p = dot + 1; *p; p++)
        if (!ident_char(*p) && *p != '.') return false;
    return true;
}

static bool is_bundle_name(const char *k) {
    if (!*k || is_run_key(k)) return false;
    for (const char *p = k; *p; p++)
        if (!ident_char(*p)) return false;
    return true;
}

/* A value is a CSV field: no separators, quotes or control characters; and it does not start
 * with ';' or '#', which the resolved copy's "key = value" would turn into a comment. */
static bool value_ok(const char *v) {
    if (!*v || *v == ';' || *v == '#') return false;
    for (const char *p = v; *p; p++)
        if (*p == ',' || *p == '"' || *p == '=' || (unsigned char)*p < 0x20 || *p == 0x7f)
            return false;
    return true;
}

static char *origin_at(const char *path, int line) {
    char buf[PATH_MAX + 32];
    snprintf(buf, sizeof buf, "%s:%d", path, line);
    return moesim_xstrdup(buf);
}

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

/* Decimals a number is written with: digits after the point minus a decimal exponent
 * ("0.25" 2, "1e-3" 3, "2.5e-2" 3, "1e3" 0); SIZE_MAX for an exponent beyond +-999. */
static size_t decimals_of(const char *s) {
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    while (isdigit((unsigned char)*p)) p++;
    long frac = 0;
    if (*p == '.')
        for (p++; isdigit((unsigned char)*p); p++) frac++;
    long exp10 = 0;
    if (*p == 'e' || *p == 'E') {
        char *end;
        errno = 0;
        exp10 = strtol(p + 1, &end, 10);
        if (errno || exp10 > 999 || exp10 < -999) return SIZE_MAX;
    }
    long dec = frac - exp10;
    return dec > 0 ? (size_t)dec : 0;
}

static bool parse_i64(const char *s, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

/* Appends one value to an axis. The arrays double: a range holds up to SWEEP_MAX_RANGE values,
 * and growing by one copied them quadratically (sanitizer builds took minutes). */
static void axis_push(axis *a, const char *value, const char *origin) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 8;
        a->labels = moesim_xrealloc(a->labels, a->cap * sizeof *a->labels);
        a->origins = moesim_xrealloc(a->origins, a->cap * sizeof *a->origins);
    }
    a->labels[a->n] = moesim_xstrdup(value);
    a->origins[a->n] = moesim_xstrdup(origin);
    a->n++;
}

/* "a:b:step" (inclusive of b up to rounding) into the axis; integers stay integers, decimals
 * keep the digits of the most precise of a and step. */
static moesim_status expand_range(axis *a, const char *spec, const char *origin,
                                  moesim_error *err) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    char *p1 = strchr(buf, ':');
    char *p2 = p1 ? strchr(p1 + 1, ':') : NULL;
    if (!p1 || !p2 || strchr(p2 + 1, ':'))
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [axes] %s: expected 'start:stop:step', got '%s'", origin, a->name,
                           spec);
    *p1 = *p2 = '\0';
    char *sa = trim(buf), *sb = trim(p1 + 1), *ss = trim(p2 + 1);
    long long ia, ib, is;
    if (parse_i64(sa, &ia) && parse_i64(sb, &ib) && parse_i64(ss, &is)) {
        /* counted up front in unsigned arithmetic: stop - start cannot overflow, and every
           value start + i * step (i < count) lies in [start, stop] */
        unsigned long long span = ib >= ia ? (unsigned long long)ib - (unsigned long long)ia : 0;
        if (is <= 0 || ib < ia || span / (unsigned long long)is >= SWEEP_MAX_RANGE)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: [axes] %s: range '%s': need step > 0, stop >= start and at "
                               "most %u values",
                               origin, a->name, spec, SWEEP_MAX_RANGE);
        size_t count = (size_t)(span / (unsigned long long)is) + 1;
        for (size_t i = 0; i < count; i++) {
            long long v = (long long)((unsigned long long)ia + i * (unsigned long long)is);
            char num[32];
            snprintf(num, sizeof num, "%lld", v);
            axis_push(a, num, origin);
        }
        return MOESIM_OK;
    }
    double fa, fb, fs;
    if (!config_parse_f64(sa, &fa) || !config_parse_f64(sb, &fb) || !config_parse_f64(ss, &fs) ||
        !isfinite(fa) || !isfinite(fb) || !isfinite(fs))
        return moesim_fail(err, MOESIM_EINPUT, "%s: [axes] %s: range '%s': expected finite numbers",
                           origin, a->name, spec);
    double span = (fb - fa) / fs;
    if (!(fs > 0) || fb < fa || !(span < SWEEP_MAX_RANGE))
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [axes] %s: range '%s': need step > 0, stop >= start and at most "
                           "%u values",
                           origin, a->name, spec, SWEEP_MAX_RANGE);
    size_t da = decimals_of(sa), ds = decimals_of(ss);
    size_t dec = da > ds ? da : ds;
    if (dec > SWEEP_MAX_DECIMALS)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [axes] %s: range '%s': start and step need at most %d decimals",
                           origin, a->name, spec, SWEEP_MAX_DECIMALS);
    size_t count = (size_t)floor(span + 1e-9) + 1;
    for (size_t i = 0; i < count; i++) {
        char num[512]; /* %.17f of 1.8e308: 309 digits before the point */
        snprintf(num, sizeof num, "%.*f", (int)dec, fa + (double)i * fs);
        axis_push(a, num, origin);
    }
    return MOESIM_OK;
}

/* ---- parsing ----------------------------------------------------------------------------- */

typedef enum section_kind {
    SEC_NONE,
    SEC_EXPERIMENT,
    SEC_FIXED,
    SEC_AXES,
    SEC_BUNDLE,
    SEC_EXCLUDE,
    SEC_TRACES
} section_kind;

typedef struct parser {
    sweep_experiment *e;
    const char *path;
    int line;
    moesim_error *err;
} parser;

#define PFAIL(ps, ...) moesim_fail((ps)->err, MOESIM_EINPUT, __VA_ARGS__)

static moesim_status check_key(parser *ps, const char *where, const char *key) {
    if (is_run_key(key) || is_setting_key(key)) return MOESIM_OK;
    return PFAIL(ps,
                 "%s:%d: %s '%s': expected policy, model, hw, trace or a setting section.key "
                 "(e.g. memory.budget_gb)",
                 ps->path, ps->line, where, key);
}

static moesim_status check_value(parser *ps, const char *key, const char *value) {
    if (value_ok(value)) return MOESIM_OK;
    return PFAIL(ps,
                 "%s:%d: %s = '%s': expected a non-empty value without ',', '\"', '=' or control "
                 "characters, not starting with ';' or '#' (values are CSV fields)",
                 ps->path, ps->line, key, value);
}

static moesim_status parse_experiment_key(parser *ps, const char *key, const char *value) {
    sweep_experiment *e = ps->e;
    if (!strcmp(key, "name")) {
        if (!is_bundle_name(value) && !strchr(value, '.'))
            return PFAIL(ps,
                         "%s:%d: [experiment] name: expected letters, digits, '-' or '_', got '%s'",
                         ps->path, ps->line, value);
        free(e->name);
        e->name = moesim_xstrdup(value);
    } else if (!strcmp(key, "paper")) {
        free(e->paper);
        e->paper = moesim_xstrdup(value);
    } else if (!strcmp(key, "seed")) {
        if (!config_parse_u64(value, &e->seed))
            return PFAIL(ps, "%s:%d: [experiment] seed: expected an unsigned integer, got '%s'",
                         ps->path, ps->line, value);
    } else if (!strcmp(key, "evaluator")) {
        if (strcmp(value, "sim") && strcmp(value, "trace-stats"))
            return PFAIL(ps, "%s:%d: [experiment] evaluator: expected sim or trace-stats, got '%s'",
                         ps->path, ps->line, value);
        free(e->evaluator);
        e->evaluator = moesim_xstrdup(value);
    } else if (!strcmp(key, "inputs")) {
        char dir[PATH_MAX], abs[PATH_MAX];
        if (!strcmp(value, "cwd")) {
            snprintf(dir, sizeof dir, ".");
        } else {
            char file_dir[PATH_MAX];
            moesim_path_dirname(ps->path, file_dir, sizeof file_dir);
            moesim_path_join(file_dir, value, dir, sizeof dir);
        }
        if (!realpath(dir, abs))
            return PFAIL(ps, "%s:%d: [experiment] inputs: %s: expected cwd or a folder: %s",
                         ps->path, ps->line, value, strerror(errno));
        free(e->inputs_dir);
        e->inputs_dir = moesim_xstrdup(abs);
    } else {
        return PFAIL(ps,
                     "%s:%d: [experiment] %s: unknown key (known: name, paper, seed, evaluator, "
                     "inputs)",
                     ps->path, ps->line, key);
    }
    return MOESIM_OK;
}

static moesim_status parse_fixed(parser *ps, const char *key, const char *value) {
    sweep_experiment *e = ps->e;
    moesim_status st = check_key(ps, "[fixed]", key);
    if (!st) st = check_value(ps, key, value);
    if (st) return st;
    for (size_t i = 0; i < e->n_fixed; i++)
        if (!strcmp(e->fixed[i].key, key))
            return PFAIL(ps, "%s:%d: [fixed] %s: set twice (first at %s)", ps->path, ps->line, key,
                         e->fixed[i].origin);
    e->fixed = moesim_xrealloc(e->fixed, (e->n_fixed + 1) * sizeof *e->fixed);
    e->fixed[e->n_fixed++] =
        (assign){moesim_xstrdup(key), moesim_xstrdup(value), origin_at(ps->path, ps->line)};
    return MOESIM_OK;
}

static axis *axis_new(sweep_experiment *e, const char *name, bool bundle, int line) {
    e->axes = moesim_xrealloc(e->axes, (e->n_axes + 1) * sizeof *e->axes);
    axis *a = &e->axes[e->n_axes++];
    *a = (axis){.name = moesim_xstrdup(name), .bundle = bundle, .line = line};
    return a;
}

static const axis *axis_named(const sweep_experiment *e, const char *name) {
    for (size_t i = 0; i < e->n_axes; i++)
        if (!strcmp(e->axes[i].name, name)) return &e->axes[i];
    return NULL;
}

typedef struct label_at {
    const char *label;
    size_t index; /* in the axis */
} label_at;

static int cmp_label_at(const void *x, const void *y) {
    const label_at *a = x, *b = y;
    int c = strcmp(a->label, b->label);
    return c ? c : (a->index > b->index) - (a->index < b->index);
}

/* The first value (in axis order) that repeats an earlier one, or a->n. Sorted, not compared
 * pairwise: a line of ranges holds hundreds of thousands of values (pairwise took seconds;
 * found while setting the hang limit of tests/fuzz/fuzz_experiment.c). */
static size_t first_repeat(const axis *a) {
    label_at *sorted = moesim_xcalloc(a->n, sizeof *sorted);
    for (size_t i = 0; i < a->n; i++) sorted[i] = (label_at){a->labels[i], i};
    qsort(sorted, a->n, sizeof *sorted, cmp_label_at);
    size_t first = a->n;
    for (size_t i = 1; i < a->n; i++)
        if (!strcmp(sorted[i].label, sorted[i - 1].label) && sorted[i].index < first)
            first = sorted[i].index;
    free(sorted);
    return first;
}

static moesim_status parse_axis(parser *ps, const char *key, char *value) {
    sweep_experiment *e = ps->e;
    moesim_status st = check_key(ps, "[axes]", key);
    if (st) return st;
    const axis *prev = axis_named(e, key);
    if (prev)
        return PFAIL(ps, "%s:%d: [axes] %s: axis already defined at line %d", ps->path, ps->line,
                     key, prev->line);
    axis *a = axis_new(e, key, false, ps->line);
    char *origin = origin_at(ps->path, ps->line);
    for (char *save = NULL, *tok = strtok_r(value, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *v = trim(tok);
        if (strchr(v, ':') && (isdigit((unsigned char)v[0]) || v[0] == '-' || v[0] == '.')) {
            st = expand_range(a, v, origin, ps->err);
        } else {
            st = check_value(ps, key, v);
            if (!st) axis_push(a, v, origin);
        }
        if (st) break;
    }
    free(origin);
    if (st) return st;
    if (!a->n) return PFAIL(ps, "%s:%d: [axes] %s: no values", ps->path, ps->line, key);
    size_t twice = first_repeat(a);
    if (twice < a->n)
        return PFAIL(ps, "%s:%d: [axes] %s: value '%s' listed twice", ps->path, ps->line, key,
                     a->labels[twice]);
    return MOESIM_OK;
}

static moesim_status parse_bundle_entry(parser *ps, axis *a, const char *label, char *value) {
    moesim_status st = check_value(ps, "label", label);
    if (st) return st;
    for (size_t i = 0; i < a->n; i++)
        if (!strcmp(a->labels[i], label))
            return PFAIL(ps, "%s:%d: [axis %s] %s: label defined twice", ps->path, ps->line,
                         a->name, label);
    char *origin = origin_at(ps->path, ps->line);
    axis_push(a, label, origin);
    a->sets = moesim_xrealloc(a->sets, a->n * sizeof *a->sets);
    a->n_sets = moesim_xrealloc(a->n_sets, a->n * sizeof *a->n_sets);
    a->sets[a->n - 1] = NULL;
    a->n_sets[a->n - 1] = 0;
    for (char *save = NULL, *tok = strtok_r(value, ",", &save); tok && !st;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            st = PFAIL(ps, "%s:%d: [axis %s] %s: expected key=value, got '%s'", ps->path, ps->line,
                       a->name, label, trim(tok));
            break;
        }
        *eq = '\0';
        char *k = trim(tok), *v = trim(eq + 1);
        st = check_key(ps, "bundle key", k);
        if (!st) st = check_value(ps, k, v);
        if (st) break;
        size_t n = a->n_sets[a->n - 1];
        for (size_t i = 0; i < n; i++)
            if (!strcmp(a->sets[a->n - 1][i].key, k))
                st = PFAIL(ps, "%s:%d: [axis %s] %s: %s set twice", ps->path, ps->line, a->name,
                           label, k);
        if (st) break;
        a->sets[a->n - 1] = moesim_xrealloc(a->sets[a->n - 1], (n + 1) * sizeof(assign));
        a->sets[a->n - 1][n] =
            (assign){moesim_xstrdup(k), moesim_xstrdup(v), moesim_xstrdup(origin)};
        a->n_sets[a->n - 1] = n + 1;
    }
    free(origin);
    return st;
}

static moesim_status parse_exclusion(parser *ps, char *line) {
    sweep_experiment *e = ps->e;
    exclusion x = {.line = ps->line};
    moesim_status st = MOESIM_OK;
    for (char *save = NULL, *tok = strtok_r(line, ",", &save); tok && !st;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            st = PFAIL(ps, "%s:%d: [exclude]: expected key=value or key!=value terms, got '%s'",
                       ps->path, ps->line, trim(tok));
            break;
        }
        bool negate = eq > tok && eq[-1] == '!';
        if (negate) eq[-1] = '\0';
        *eq = '\0';
        char *k = trim(tok), *v = trim(eq + 1);
        if (!is_run_key(k) && !is_setting_key(k) && !is_bundle_name(k))
            st = PFAIL(ps, "%s:%d: [exclude] %s: not a key", ps->path, ps->line, k);
        if (!st) st = check_value(ps, k, v);
        if (st) break;
        x.terms = moesim_xrealloc(x.terms, (x.n + 1) * sizeof *x.terms);
        x.terms[x.n++] = (cond_term){moesim_xstrdup(k), moesim_xstrdup(v), negate, -1};
    }
    if (!st && !x.n) st = PFAIL(ps, "%s:%d: [exclude]: empty condition", ps->path, ps->line);
    e->excl = moesim_xrealloc(e->excl, (e->n_excl + 1) * sizeof *e->excl);
    e->excl[e->n_excl++] = x; /* kept even on error so destroy frees it */
    return st;
}

static moesim_status parse_trace_recipe(parser *ps, const char *path, const char *args) {
    sweep_experiment *e = ps->e;
    moesim_status st = check_value(ps, "trace path", path);
    if (st) return st;
    for (size_t i = 0; i < e->n_traces; i++)
        if (!strcmp(e->trace_paths[i], path))
            return PFAIL(ps, "%s:%d: [traces] %s: recipe given twice", ps->path, ps->line, path);
    if (strstr(args, " -o") || !strncmp(args, "-o", 2) || strstr(args, "--output"))
        return PFAIL(ps, "%s:%d: [traces] %s: the recipe must not name the output (-o is the key)",
                     ps->path, ps->line, path);
    size_t n_args = 0;
    for (const char *q = args; *q;) {
        while (*q == ' ' || *q == '\t') q++;
        if (!*q) break;
        n_args++;
        while (*q && *q != ' ' && *q != '\t') q++;
    }
    if (n_args > SWEEP_MAX_RECIPE_ARGS)
        return PFAIL(ps, "%s:%d: [traces] %s: recipe has %zu arguments, at most %d expected",
                     ps->path, ps->line, path, n_args, SWEEP_MAX_RECIPE_ARGS);
    e->trace_paths = moesim_xrealloc(e->trace_paths, (e->n_traces + 1) * sizeof(char *));
    e->trace_args = moesim_xrealloc(e->trace_args, (e->n_traces + 1) * sizeof(char *));
    e->trace_paths[e->n_traces] = moesim_xstrdup(path);
    e->trace_args[e->n_traces] = moesim_xstrdup(args);
    e->n_traces++;
    return MOESIM_OK;
}

/* Cuts a trailing " ; comment" or " # comment". */
static void strip_comment(char *s) {
    for (char *p = s; *p; p++)
        if ((*p == ';' || *p == '#') && (p == s || isspace((unsigned char)p[-1]))) {
            *p = '\0';
            return;
        }
}

static moesim_status parse_file(parser *ps, FILE *fp) {
    char *buf = NULL;
    size_t cap = 0;
    section_kind sec = SEC_NONE;
    axis *bundle = NULL;
    moesim_status st = MOESIM_OK;
    while (!st && getline(&buf, &cap, fp) >= 0) {
        ps->line++;
        strip_comment(buf);
        char *s = trim(buf);
        if (!*s) continue;
        if (*s == '[') {
            char *close = strchr(s, ']');
            if (!close || close[1]) {
                st = PFAIL(ps, "%s:%d: expected '[section]'", ps->path, ps->line);
                break;
            }
            *close = '\0';
            char *name = trim(s + 1);
            if (!strcmp(name, "experiment"))
                sec = SEC_EXPERIMENT;
            else if (!strcmp(name, "fixed"))
                sec = SEC_FIXED;
            else if (!strcmp(name, "axes"))
                sec = SEC_AXES;
            else if (!strcmp(name, "exclude"))
                sec = SEC_EXCLUDE;
            else if (!strcmp(name, "traces"))
                sec = SEC_TRACES;
            else if (!strncmp(name, "axis ", 5)) {
                char *bn = trim(name + 5);
                if (!is_bundle_name(bn)) {
                    st = PFAIL(ps,
                               "%s:%d: [axis %s]: expected a name of letters, digits, '-' or '_' "
                               "(not policy, model, hw or trace)",
                               ps->path, ps->line, bn);
                    break;
                }
                const axis *prev = axis_named(ps->e, bn);
                if (prev) {
                    st = PFAIL(ps, "%s:%d: [axis %s]: axis already defined at line %d", ps->path,
                               ps->line, bn, prev->line);
                    break;
                }
                bundle = axis_new(ps->e, bn, true, ps->line);
                sec = SEC_BUNDLE;
            } else {
                st = PFAIL(ps,
                           "%s:%d: [%s]: unknown section (known: experiment, fixed, axes, "
                           "axis NAME, exclude, traces)",
                           ps->path, ps->line, name);
            }
            continue;
        }
        if (sec == SEC_NONE) {
            st = PFAIL(ps, "%s:%d: expected a [section] first", ps->path, ps->line);
            break;
        }
        if (sec == SEC_EXCLUDE) {
            st = parse_exclusion(ps, s);
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            st = PFAIL(ps, "%s:%d: expected 'key = value'", ps->path, ps->line);
            break;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        if (!*key) {
            st = PFAIL(ps, "%s:%d: expected a key before '='", ps->path, ps->line);
            break;
        }
        if (*value == ';' || *value == '#') { /* "k =;x": a comment once written "k = ;x" */
            st = PFAIL(ps, "%s:%d: %s: a value must not start with '%c'", ps->path, ps->line, key,
                       *value);
            break;
        }
        switch (sec) {
        case SEC_EXPERIMENT:
            st = parse_experiment_key(ps, key, value);
            break;
        case SEC_FIXED:
            st = parse_fixed(ps, key, value);
            break;
        case SEC_AXES:
            st = parse_axis(ps, key, value);
            break;
        case SEC_BUNDLE:
            st = parse_bundle_entry(ps, bundle, key, value);
            break;
        case SEC_TRACES:
            st = parse_trace_recipe(ps, key, value);
            break;
        default:
            MOESIM_UNREACHABLE();
        }
    }
    free(buf);
    if (!st && ferror(fp))
        st = moesim_fail(ps->err, MOESIM_EIO, "%s: cannot read: %s", ps->path, strerror(errno));
    return st;
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
    return is_setting_key(k) && strncmp(k, "label.", 6) != 0;
}

static moesim_status build_columns(sweep_experiment *e, moesim_error *err) {
    for (size_t i = 0; i < e->n_axes; i++)
        if (e->axes[i].bundle) column_add(e, e->axes[i].name, false);
    for (int i = 0; i < N_RUN_KEYS; i++) column_add(e, run_keys[i], false);
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
static void build_find_index(sweep_experiment *e) {
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
    build_find_index(e);
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
    parser ps = {.e = e, .path = path, .err = err};
    moesim_status st = parse_file(&ps, fp);
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
        "seed column); config_hash: sim/sweep.h\n",
        MOESIM_VERSION, source ? source : e->path, e->n_points, e->cross_size, e->excluded,
        e->duplicates);
    fprintf(f, "[experiment]\nname = %s\n", e->name);
    if (e->paper[0]) fprintf(f, "paper = %s\n", e->paper);
    fprintf(f, "seed = %" PRIu64 "\nevaluator = %s\n", e->seed, e->evaluator);
    char inputs[PATH_MAX]; /* absolute: the copy lives in another folder than the file */
    if (realpath(e->inputs_dir, inputs) && value_ok(inputs)) fprintf(f, "inputs = %s\n", inputs);
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
    return atomic_file_commit(&af, err);
}

void sweep_sidecar_path(const char *csv_path, char *out, size_t len) {
    size_t n = strlen(csv_path);
    if (n > 4 && !strcmp(csv_path + n - 4, ".csv")) n -= 4;
    snprintf(out, len, "%.*s.experiment.ini", (int)n, csv_path);
}

/* ---- binding the inputs' content ---------------------------------------------------------- */

#define SWEEP_INPUTS_TAG "moesim-sweep-inputs-1"

/* One distinct input (a trace path, a model or hw name) and the hash of its content. */
typedef struct input_id {
    char *name;
    uint64_t id;
} input_id;

typedef struct input_cache {
    input_id *items; /* [n] */
    size_t n;
} input_cache;

static const uint64_t *input_cache_find(const input_cache *c, const char *name) {
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->items[i].name, name)) return &c->items[i].id;
    return NULL;
}

static uint64_t input_cache_add(input_cache *c, const char *name, uint64_t id) {
    c->items = moesim_xrealloc(c->items, (c->n + 1) * sizeof *c->items);
    c->items[c->n++] = (input_id){moesim_xstrdup(name), id};
    return id;
}

static void input_cache_free(input_cache *c) {
    for (size_t i = 0; i < c->n; i++) free(c->items[i].name);
    free(c->items);
}

/* FNV-1a of a file's bytes; false (errno set) when it cannot be read. An absent file is not an
 * error of binding: its configurations get another hash and the evaluator reports it. */
static bool file_content_hash(const char *path, uint64_t *out) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    uint64_t h = hash_fnv1a64("file", 4, MOESIM_FNV1A64_INIT);
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, fp)) > 0) h = hash_fnv1a64(buf, n, h);
    bool ok = !ferror(fp);
    fclose(fp);
    *out = h;
    return ok;
}

typedef struct config_kv {
    const char *section, *key, *value;
} config_kv;

static int cmp_config_kv(const void *a, const void *b) {
    const config_kv *x = a, *y = b;
    int c = strcmp(x->section, y->section);
    return c ? c : strcmp(x->key, y->key);
}

/* Hash of the settings (section, key, value) a model or hw file resolves to, in name order:
 * comments, layout and entry order do not count; the file's name and folder do not either. */
static moesim_status config_values_hash(const char *kind, const char *name, uint64_t *out,
                                        moesim_error *err) {
    char path[4096];
    moesim_status st = moesim_config_path(kind, name, path, sizeof path, err);
    if (st) return st;
    config *c = config_create();
    st = config_load_file(c, path, err);
    if (st) {
        config_destroy(c);
        return st;
    }
    size_t n = config_size(c);
    config_kv *kv = moesim_xcalloc(n + 1, sizeof *kv);
    for (size_t i = 0; i < n; i++) config_entry_at(c, i, &kv[i].section, &kv[i].key, &kv[i].value);
    qsort(kv, n, sizeof *kv, cmp_config_kv);
    uint64_t h = hash_fnv1a64_str(kind, MOESIM_FNV1A64_INIT);
    for (size_t i = 0; i < n; i++) {
        h = hash_fnv1a64(kv[i].section, strlen(kv[i].section) + 1, h);
        h = hash_fnv1a64(kv[i].key, strlen(kv[i].key) + 1, h);
        h = hash_fnv1a64(kv[i].value, strlen(kv[i].value) + 1, h);
    }
    free(kv);
    config_destroy(c);
    *out = h;
    return MOESIM_OK;
}

static const char *recipe_of(const sweep_experiment *e, const char *trace_path) {
    for (size_t i = 0; i < e->n_traces; i++)
        if (!strcmp(e->trace_paths[i], trace_path)) return e->trace_args[i];
    return NULL;
}

void sweep_experiment_input_path(const sweep_experiment *e, const char *key, const char *value,
                                 char *out, size_t out_len) {
    size_t n = strlen(value);
    bool relative = value[0] != '/', file_relative = false;
    if (!strcmp(key, "trace"))
        file_relative = relative && !recipe_of(e, value); /* a made trace is an output */
    else if (!strcmp(key, "model") || !strcmp(key, "hw"))
        file_relative =
            relative && (strchr(value, '/') || (n > 4 && !strcmp(value + n - 4, ".ini")));
    if (file_relative)
        moesim_path_join(e->inputs_dir, value, out, out_len);
    else
        snprintf(out, out_len, "%s", value);
}

static uint64_t fold_u64(uint64_t h, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i)); /* little-endian */
    return hash_fnv1a64(b, sizeof b, h);
}

/* The code version a configuration's figures come from (sweep.h, "Hash"). */
static void code_version(const sweep_experiment *e, const sweep_point *p, char *out, size_t len) {
    if (strcmp(e->evaluator, "sim")) {
        snprintf(out, len, "stats%d", SWEEP_STATS_CODE_VERSION);
        return;
    }
    const char *name = sweep_point_get(e, p, "policy");
    const policy_methods *pm = name ? policy_lookup(name) : NULL;
    snprintf(out, len, "sim%d-%s%" PRIu32, SIM_CODE_VERSION, pm ? pm->name : "none",
             pm ? pm->version : 0);
}

uint64_t sweep_point_hash_with_code(const sweep_point *p, const char *code) {
    return fold_u64(p->inputs_hash, hash_fnv1a64_str(code, MOESIM_FNV1A64_INIT));
}

moesim_status sweep_experiment_bind_inputs(sweep_experiment *e, moesim_error *err) {
    if (!e->base_hash) {
        e->base_hash = moesim_xcalloc(e->n_points + 1, sizeof *e->base_hash);
        for (size_t i = 0; i < e->n_points; i++) e->base_hash[i] = e->points[i].hash;
    }
    bool is_sim = !strcmp(e->evaluator, "sim");
    input_cache traces = {0}, models = {0}, hws = {0};
    moesim_status st = MOESIM_OK;
    for (size_t i = 0; i < e->n_points && !st; i++) {
        sweep_point *p = &e->points[i];
        uint64_t h = hash_fnv1a64(SWEEP_INPUTS_TAG, sizeof SWEEP_INPUTS_TAG, MOESIM_FNV1A64_INIT);
        h = fold_u64(h, e->base_hash[i]);
        const char *path = sweep_point_get(e, p, "trace");
        if (path) {
            const uint64_t *id = input_cache_find(&traces, path);
            uint64_t v;
            if (!id) {
                const char *recipe = recipe_of(e, path);
                v = hash_fnv1a64_str(recipe ? recipe : "", MOESIM_FNV1A64_INIT);
                uint64_t content;
                char file[PATH_MAX];
                sweep_experiment_input_path(e, "trace", path, file, sizeof file);
                v = fold_u64(v, file_content_hash(file, &content) ? content : 0);
                input_cache_add(&traces, path, v);
            } else {
                v = *id;
            }
            h = fold_u64(h, v);
        }
        static const char *const keys[] = {"model", "hw"};
        static const char *const kinds[] = {"models", "hw"};
        input_cache *caches[] = {&models, &hws};
        for (size_t k = 0; k < 2 && is_sim && !st; k++) {
            const char *name = sweep_point_get(e, p, keys[k]);
            if (!name) continue;
            const uint64_t *id = input_cache_find(caches[k], name);
            uint64_t v = 0;
            if (!id) {
                char file[PATH_MAX];
                sweep_experiment_input_path(e, keys[k], name, file, sizeof file);
                st = config_values_hash(kinds[k], file, &v, err);
                if (st && err) {
                    int col = column_find(e, keys[k]);
                    char msg[MOESIM_ERROR_MAX];
                    snprintf(msg, sizeof msg, "%s", err->msg);
                    st = moesim_fail(err, st, "%s: %s = %s: %s", p->origins[col], keys[k], name,
                                     msg);
                }
                if (st) break;
                input_cache_add(caches[k], name, v);
            } else {
                v = *id;
            }
            h = fold_u64(h, v);
        }
        p->inputs_hash = h;
        code_version(e, p, p->code, sizeof p->code);
        p->hash = sweep_point_hash_with_code(p, p->code);
    }
    input_cache_free(&traces);
    input_cache_free(&models);
    input_cache_free(&hws);
    if (st) return st;
    build_find_index(e);
    return MOESIM_OK;
}
