/* Experiment files read line by line into their sections (format: sweep.h): keys and values
 * checked as they are read, "a:b:step" ranges expanded, every error naming the file and line. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/config.h"
#include "common/paths.h"
#include "sweep/sweep.h"
#include "sweep/sweep_experiment_internal.h"

#define SWEEP_MAX_RANGE    100000u /* values of one a:b:step axis */
#define SWEEP_MAX_DECIMALS 17      /* digits after the point of a decimal range value */

const char *const sweep_run_keys[SWEEP_N_RUN_KEYS] = {"policy", "model", "hw", "trace"};

/* ---- small helpers ----------------------------------------------------------------------- */

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

/* policy_lib (a policy plug-in, policies/plugin.h) is a run key too, but a column only in the
 * experiments that set it: the CSV of every other experiment keeps its columns. */
bool sweep_key_is_run(const char *k) {
    for (int i = 0; i < SWEEP_N_RUN_KEYS; i++)
        if (!strcmp(k, sweep_run_keys[i])) return true;
    return !strcmp(k, "policy_lib");
}

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '-'; }

/* section.key with identifier characters (the key part may hold further dots) */
bool sweep_key_is_setting(const char *k) {
    const char *dot = strchr(k, '.');
    if (!dot || dot == k || !dot[1]) return false;
    for (const char *p = k; p < dot; p++)
        if (!ident_char(*p)) return false;
    for (const char *p = dot + 1; *p; p++)
        if (!ident_char(*p) && *p != '.') return false;
    return true;
}

static bool is_bundle_name(const char *k) {
    if (!*k || sweep_key_is_run(k)) return false;
    for (const char *p = k; *p; p++)
        if (!ident_char(*p)) return false;
    return true;
}

/* An experiment's name, which names its results file: "qwen1.5-moe-4l", never a path ('/')
 * nor a hidden or parent entry (a '.' first). */
static bool is_experiment_name(const char *v) {
    if (!*v || *v == '.') return false;
    for (const char *p = v; *p; p++)
        if (!ident_char(*p) && *p != '.') return false;
    return true;
}

/* A value is a CSV field: no separators, quotes or control characters; and it does not start
 * with ';' or '#', which the resolved copy's "key = value" would turn into a comment. */
bool sweep_value_ok(const char *v) {
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
    SEC_TRACES,
    SEC_VALIDATE
} section_kind;

typedef struct parser {
    sweep_experiment *e;
    const char *path;
    int line;
    moesim_error *err;
} parser;

#define PFAIL(ps, ...) moesim_fail((ps)->err, MOESIM_EINPUT, __VA_ARGS__)

static moesim_status check_key(parser *ps, const char *where, const char *key) {
    if (sweep_key_is_run(key) || sweep_key_is_setting(key)) return MOESIM_OK;
    return PFAIL(
        ps,
        "%s:%d: %s '%s': expected policy, policy_lib, model, hw, trace or a setting section.key "
        "(e.g. memory.budget_gb)",
        ps->path, ps->line, where, key);
}

static moesim_status check_value(parser *ps, const char *key, const char *value) {
    if (sweep_value_ok(value)) return MOESIM_OK;
    return PFAIL(ps,
                 "%s:%d: %s = '%s': expected a non-empty value without ',', '\"', '=' or control "
                 "characters, not starting with ';' or '#' (values are CSV fields)",
                 ps->path, ps->line, key, value);
}

static moesim_status parse_experiment_key(parser *ps, const char *key, const char *value) {
    sweep_experiment *e = ps->e;
    if (!strcmp(key, "name")) {
        if (!is_experiment_name(value))
            return PFAIL(ps,
                         "%s:%d: [experiment] name: expected letters, digits, '-', '_' or '.' "
                         "(not first), got '%s'",
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
    for (char *rest = value, *tok; (tok = strsep(&rest, ","));) {
        char *v = trim(tok);
        if (!*v) {
            st = PFAIL(ps, "%s:%d: [axes] %s: an empty value (two commas, or one at an end)",
                       ps->path, ps->line, key);
            break;
        }
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
        if (!sweep_key_is_run(k) && !sweep_key_is_setting(k) && !is_bundle_name(k))
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

/* [validate]: what only `moesim validate` reads (sweep.h); values checked here. */
static moesim_status parse_validate_key(parser *ps, const char *key, const char *value) {
    sweep_experiment *e = ps->e;
    uint64_t u;
    double d;
    if (!strcmp(key, "repeats")) {
        if (!config_parse_u64(value, &u) || u < 1)
            return PFAIL(ps, "%s:%d: [validate] repeats: expected a positive integer, got '%s'",
                         ps->path, ps->line, value);
    } else if (!strcmp(key, "tpot_error_max") || !strcmp(key, "order_margin")) {
        bool margin = key[0] == 'o';
        if (!config_parse_f64(value, &d) || !isfinite(d) || (margin ? d < 0 : d <= 0))
            return PFAIL(ps, "%s:%d: [validate] %s: expected a %s number, got '%s'", ps->path,
                         ps->line, key, margin ? "non-negative" : "positive", value);
    } else {
        return PFAIL(ps,
                     "%s:%d: [validate] %s: unknown key (known: repeats, tpot_error_max, "
                     "order_margin)",
                     ps->path, ps->line, key);
    }
    for (size_t i = 0; i < e->n_validate; i++)
        if (!strcmp(e->validate[i].key, key))
            return PFAIL(ps, "%s:%d: [validate] %s: set twice (first at %s)", ps->path, ps->line,
                         key, e->validate[i].origin);
    e->validate = moesim_xrealloc(e->validate, (e->n_validate + 1) * sizeof *e->validate);
    e->validate[e->n_validate++] =
        (assign){moesim_xstrdup(key), moesim_xstrdup(value), origin_at(ps->path, ps->line)};
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
            else if (!strcmp(name, "validate"))
                sec = SEC_VALIDATE;
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
                           "axis NAME, exclude, traces, validate)",
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
        case SEC_VALIDATE:
            st = parse_validate_key(ps, key, value);
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

moesim_status sweep_experiment_parse(sweep_experiment *e, const char *path, FILE *fp,
                                     moesim_error *err) {
    parser ps = {.e = e, .path = path, .err = err};
    return parse_file(&ps, fp);
}
