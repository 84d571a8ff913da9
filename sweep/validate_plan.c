/* The configurations `moesim validate` compares (sweep/validate.h): an experiment file's, the
 * best rows of a sweep's results CSV, or one policy as given. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/config.h"
#include "core/settings.h"
#include "policies/policy.h"
#include "sweep/sweep.h"
#include "sweep/validate.h"

static void spec_add_set(validate_spec *r, const char *key, const char *value) {
    size_t len = strlen(key) + strlen(value) + 2;
    char *s = moesim_xmalloc(len);
    snprintf(s, len, "%s=%s", key, value);
    r->sets = moesim_xrealloc(r->sets, (r->n_sets + 1) * sizeof *r->sets);
    r->sets[r->n_sets++] = s;
}

void sweep_validate_plan_free(validate_plan *p) {
    for (size_t i = 0; i < p->n; i++) {
        for (size_t j = 0; j < p->specs[i].n_sets; j++) free(p->specs[i].sets[j]);
        free(p->specs[i].sets);
    }
    free(p->specs);
    p->specs = NULL;
    p->n = 0;
}

void sweep_validate_plan_one(const char *policy_name, validate_plan *out) {
    memset(out, 0, sizeof *out);
    out->specs = moesim_xcalloc(1, sizeof *out->specs);
    out->n = 1;
    snprintf(out->specs[0].policy, sizeof out->specs[0].policy, "%s", policy_name);
    snprintf(out->specs[0].label, sizeof out->specs[0].label, "as given");
}

/* ---- an experiment file ------------------------------------------------------------------ */

/* "budget 16 GiB, dymoe.retention=0.8": the point's values of the axes other than policy. */
static void point_label(const sweep_experiment *e, const sweep_point *p, char *out, size_t len) {
    size_t used = 0;
    out[0] = '\0';
    for (size_t a = 0; a < sweep_experiment_n_axes(e); a++) {
        const char *name = sweep_experiment_axis_name(e, a);
        const char *v = sweep_point_get(e, p, name);
        if (!strcmp(name, "policy") || !v || used >= len) continue;
        const char *sep = used ? ", " : "";
        if (!strcmp(name, "memory.budget_gb"))
            used += (size_t)snprintf(out + used, len - used, "%sbudget %s GiB", sep, v);
        else
            used += (size_t)snprintf(out + used, len - used, "%s%s=%s", sep, name, v);
    }
    if (!used) snprintf(out, len, "as given");
}

/* Every configuration names the same `key` (trace, hw, model): copied to out ("" if none). */
static moesim_status one_input(const sweep_experiment *e, const char *path, const char *key,
                               char *out, size_t len, moesim_error *err) {
    const char *first = sweep_point_get(e, sweep_experiment_point(e, 0), key);
    for (size_t i = 1; i < sweep_experiment_count(e); i++) {
        const char *v = sweep_point_get(e, sweep_experiment_point(e, i), key);
        if ((!first) != (!v) || (v && strcmp(v, first)))
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: %s: expected one value for every configuration (validate loads "
                               "one), got '%s' and '%s'",
                               path, key, first ? first : "(none)", v ? v : "(none)");
    }
    snprintf(out, len, "%s", first ? first : "");
    return MOESIM_OK;
}

/* --budgets: the budgets listed, each a positive number. */
static moesim_status parse_budgets(const char *text, double *gb, size_t cap, size_t *n,
                                   moesim_error *err) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", text);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok;
         tok = strtok_r(NULL, ", ", &save)) {
        if (*n == cap || !config_parse_f64(tok, &gb[*n]) || !(gb[*n] > 0))
            return moesim_fail(err, MOESIM_EINPUT,
                               "moesim validate: --budgets: expected at most %zu positive numbers, "
                               "got '%s'",
                               cap, tok);
        (*n)++;
    }
    if (!*n)
        return moesim_fail(err, MOESIM_EINPUT,
                           "moesim validate: --budgets: expected positive numbers, got '%s'", text);
    return MOESIM_OK;
}

/* The [validate] section: repeats and the check. */
static moesim_status plan_options(const sweep_experiment *e, const char *path, validate_plan *out,
                                  moesim_error *err) {
    const char *origin = NULL;
    const char *rep = sweep_experiment_validate_get(e, "repeats", &origin);
    uint64_t r = 0;
    if (rep && (!config_parse_u64(rep, &r) || r > VALIDATE_MAX_ROUNDS))
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [validate] repeats: expected an integer in [1, %d], got '%s'",
                           origin, VALIDATE_MAX_ROUNDS, rep);
    out->repeats = (uint32_t)r;
    const char *tpot = sweep_experiment_validate_get(e, "tpot_error_max", NULL);
    const char *margin = sweep_experiment_validate_get(e, "order_margin", NULL);
    if (!tpot != !margin)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [validate]: tpot_error_max and order_margin go together (the "
                           "check), got only %s",
                           path, tpot ? "tpot_error_max" : "order_margin");
    out->check = tpot != NULL;
    if (out->check) /* checked when the file was read */
        config_parse_f64(tpot, &out->check_tpot), config_parse_f64(margin, &out->check_margin);
    return MOESIM_OK;
}

/* A configuration as a spec: its policy (registered) and setting columns; memory.budget_gb, when
 * set, a positive number. */
static moesim_status point_spec(const sweep_experiment *e, const sweep_point *p, validate_spec *r,
                                moesim_error *err) {
    int pc = sweep_experiment_column_index(e, "policy");
    const char *pol = p->values[pc];
    if (!policy_lookup(pol))
        return moesim_fail(err, MOESIM_EINPUT, "%s: policy: unknown policy '%s' (known: %s)",
                           p->origins[pc], pol, policy_names());
    snprintf(r->policy, sizeof r->policy, "%s", pol);
    point_label(e, p, r->label, sizeof r->label);
    for (size_t c = 0; c < sweep_experiment_n_columns(e); c++) {
        const char *col = sweep_experiment_column(e, c);
        if (!sweep_experiment_column_is_setting(e, c) || !p->values[c]) continue;
        double gb;
        if (!strcmp(col, "memory.budget_gb") && (!config_parse_f64(p->values[c], &gb) || !(gb > 0)))
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: memory.budget_gb: expected a positive number, got '%s'",
                               p->origins[c], p->values[c]);
        spec_add_set(r, col, p->values[c]);
    }
    return MOESIM_OK;
}

/* Whether the point's memory.budget_gb is one of gb[n] (marking it found). */
static bool budget_selected(const sweep_experiment *e, const sweep_point *p, const double *gb,
                            bool *found, size_t n) {
    const char *v = sweep_point_get(e, p, "memory.budget_gb");
    double x;
    bool hit = false;
    for (size_t i = 0; v && config_parse_f64(v, &x) && i < n; i++)
        if (x == gb[i]) found[i] = hit = true;
    return hit;
}

moesim_status sweep_validate_plan_experiment(const char *path, const char *budgets,
                                             validate_plan *out, moesim_error *err) {
    memset(out, 0, sizeof *out);
    sweep_experiment *e = NULL;
    moesim_status st = sweep_experiment_load(path, &e, err);
    if (!st) st = one_input(e, path, "trace", out->trace, sizeof out->trace, err);
    if (!st) st = one_input(e, path, "hw", out->hw, sizeof out->hw, err);
    if (!st) st = one_input(e, path, "model", out->model, sizeof out->model, err);
    if (!st) st = plan_options(e, path, out, err);
    double gb[64];
    bool found[64] = {false};
    size_t n_gb = 0;
    if (!st && budgets) st = parse_budgets(budgets, gb, 64, &n_gb, err);
    size_t n_points = st ? 0 : sweep_experiment_count(e);
    out->specs = moesim_xcalloc(n_points + 1, sizeof *out->specs);
    for (size_t i = 0; i < n_points && !st; i++) {
        const sweep_point *p = sweep_experiment_point(e, i);
        if (budgets && !budget_selected(e, p, gb, found, n_gb)) continue;
        st = point_spec(e, p, &out->specs[out->n++], err);
    }
    for (size_t i = 0; i < n_gb && !st; i++)
        if (!found[i])
            st = moesim_fail(err, MOESIM_EINPUT,
                             "moesim validate: --budgets: no configuration of %s has "
                             "memory.budget_gb = %g",
                             path, gb[i]);
    sweep_experiment_destroy(e);
    if (st) sweep_validate_plan_free(out);
    return st;
}

/* ---- the best rows of a sweep ------------------------------------------------------------ */

/* Is `section.key` a setting sim_run reads, or a knob of policy `pm`? */
static bool is_setting(const char *col, const policy_methods *pm) {
    const char *dot = strchr(col, '.');
    if (!dot) return false;
    size_t n;
    const config_field *f = sim_settings_fields(&n);
    size_t sl = (size_t)(dot - col);
    for (size_t i = 0; i < n; i++)
        if (strlen(f[i].section) == sl && !strncmp(f[i].section, col, sl) &&
            !strcmp(f[i].key, dot + 1))
            return true;
    if (strlen(pm->name) != sl || strncmp(pm->name, col, sl)) return false;
    for (size_t i = 0; i < pm->n_knobs; i++)
        if (!strcmp(pm->knobs[i].key, dot + 1)) return true;
    return false;
}

#define CSV_MAX_COLS 256

static size_t csv_split(char *line, char **cols, size_t cap) {
    size_t n = 0;
    line[strcspn(line, "\r\n")] = '\0';
    for (char *p = line; n < cap;) {
        cols[n++] = p;
        char *comma = strchr(p, ',');
        if (!comma) break;
        *comma = '\0';
        p = comma + 1;
    }
    return n;
}

typedef struct csv_row {
    double key;
    size_t idx; /* file order: ties keep it */
    char *line; /* owned copy */
} csv_row;

static int csv_row_cmp(const void *a, const void *b) {
    const csv_row *x = a, *y = b;
    if (x->key != y->key) return (x->key > y->key) - (x->key < y->key);
    return (x->idx > y->idx) - (x->idx < y->idx);
}

moesim_status sweep_validate_plan_winners(const char *path, const char *by, uint32_t top,
                                          const char *trace_path, const char *hw_name,
                                          validate_plan *out, moesim_error *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return moesim_fail(err, MOESIM_EIO, "%s: cannot open", path);
    char *line = NULL;
    size_t cap = 0;
    char *header = NULL;
    char *hcols[CSV_MAX_COLS];
    size_t nh = 0;
    int pol_col = -1, by_col = -1, status_col = -1, trace_col = -1, hw_col = -1;
    size_t skipped = 0;
    csv_row *rows = NULL;
    size_t n_rows = 0, line_no = 0;
    moesim_status st = MOESIM_OK;
    while (getline(&line, &cap, f) > 0) {
        line_no++;
        if (!header) {
            header = moesim_xstrdup(line);
            nh = csv_split(header, hcols, CSV_MAX_COLS);
            for (size_t i = 0; i < nh; i++) {
                if (!strcmp(hcols[i], "policy")) pol_col = (int)i;
                if (!strcmp(hcols[i], by)) by_col = (int)i;
                if (!strcmp(hcols[i], "status")) status_col = (int)i;
                if (!strcmp(hcols[i], "trace")) trace_col = (int)i;
                if (!strcmp(hcols[i], "hw")) hw_col = (int)i;
            }
            if (pol_col < 0 || by_col < 0) {
                st = moesim_fail(err, MOESIM_EINPUT,
                                 "%s: header: expected columns 'policy' and '%s'", path, by);
                break;
            }
            continue;
        }
        char *copy = moesim_xstrdup(line), *cols[CSV_MAX_COLS];
        size_t nc = csv_split(copy, cols, CSV_MAX_COLS);
        double key;
        /* failed rows, and rows of another trace or profile than the one replayed, are not
         * candidates */
        if (nc == nh &&
            ((status_col >= 0 && strcmp(cols[status_col], "ok")) ||
             (trace_col >= 0 && cols[trace_col][0] && strcmp(cols[trace_col], trace_path)) ||
             (hw_col >= 0 && cols[hw_col][0] && strcmp(cols[hw_col], hw_name)))) {
            free(copy);
            skipped++;
            continue;
        }
        if (nc != nh || !config_parse_f64(cols[by_col], &key)) {
            free(copy);
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s:%zu: expected %zu columns and a number in column '%s'", path,
                             line_no, nh, by);
            break;
        }
        free(copy);
        rows = moesim_xrealloc(rows, (n_rows + 1) * sizeof *rows);
        rows[n_rows].key = key;
        rows[n_rows].idx = n_rows;
        rows[n_rows++].line = moesim_xstrdup(line);
    }
    free(line);
    fclose(f);
    if (!st && !n_rows)
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: no result rows with status ok for trace %s and hw %s (%zu others)",
                         path, trace_path, hw_name, skipped);
    validate_spec *specs = NULL;
    size_t n = 0;
    if (!st) {
        qsort(rows, n_rows, sizeof *rows, csv_row_cmp);
        size_t take = top < n_rows ? top : n_rows;
        specs = moesim_xcalloc(take, sizeof *specs);
        for (size_t i = 0; i < take && !st; i++) {
            char *cols[CSV_MAX_COLS];
            csv_split(rows[i].line, cols, CSV_MAX_COLS);
            const policy_methods *pm = policy_lookup(cols[pol_col]);
            if (!pm) {
                st = moesim_fail(err, MOESIM_EINPUT, "%s: unknown policy '%s' (known: %s)", path,
                                 cols[pol_col], policy_names());
                break;
            }
            validate_spec *r = &specs[n++];
            snprintf(r->policy, sizeof r->policy, "%s", pm->name);
            snprintf(r->label, sizeof r->label, "winner %zu (%s %s)", i + 1, by, cols[by_col]);
            for (size_t c2 = 0; c2 < nh; c2++)
                if ((int)c2 != pol_col && cols[c2][0] && is_setting(hcols[c2], pm))
                    spec_add_set(r, hcols[c2], cols[c2]);
        }
    }
    for (size_t i = 0; i < n_rows; i++) free(rows[i].line);
    free(rows);
    free(header);
    out->specs = specs;
    out->n = n;
    if (st) sweep_validate_plan_free(out);
    return st;
}
