/* `moesim validate`: the simulator against the GPU. Each configuration (trace, model geometry,
 * calibrated profile, policy, settings) runs twice, through sim_run and through replay_run, and
 * the report gives per configuration the TPOT, TTFT and total-time errors of the means, the
 * median per-request errors and the per-layer comparison, then the medians over the set and
 * whether sim and replay rank the policies the same way by TPOT (replay/report.c).
 *
 * Configurations come from one of:
 *   --policy NAME [--set ...]           one configuration
 *   --experiment FILE                   [validate] policies (comma list) x budgets_gb (comma
 *                                       list); every other section holds settings for all runs
 *   --merge A.json ...                  the rows of earlier --json outputs as one set (no GPU)
 *   --winners CSV [--top N] [--by COL]  the N best rows of a `moesim sweep` CSV by COL (lowest
 *                                       first, default tpot_ms.mean; ties in file order) among
 *                                       those with status "ok" and, where the CSV has trace / hw
 *                                       columns, the --trace and --hw given: its `policy` column
 *                                       and its `section.key` setting columns (those sim_run or
 *                                       the policy reads) are replayed; other columns (metrics,
 *                                       label.*, config_hash, seed) are ignored
 * The experiment file may name trace and hw in [validate]; options override it. */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/provenance.h"
#include "cli/sim_options.h"
#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "policies/policy.h"
#include "replay/cpu_store.h"
#include "replay/replay.h"
#include "sim/memsys.h"
#include "traces/trace.h"

static const char validate_usage[] =
    "usage: moesim validate --trace T.h5 --hw NAME (--policy NAME | --experiment FILE\n"
    "                       [--budgets LIST] | --winners CSV [--top N] [--by COLUMN])\n"
    "                       [--set S.K=V ...] [--config FILE ...] [--seed N] [--report FILE]\n"
    "                       [--json]\n"
    "       moesim validate --merge A.json --merge B.json ... [--report FILE] [--csv FILE]\n"
    "                       [--json]\n"
    "\n"
    "Runs the simulator and the GPU replay on the same trace, geometry, calibrated profile\n"
    "(--hw: the one `moesim calibrate` wrote; pass its table with --set sim.cost_table=...),\n"
    "policy and settings, and reports the TPOT, TTFT and total-time errors ((sim - real) /\n"
    "real), per request and per MoE layer, and whether both rank the policies alike.\n"
    "Targets (issue 9): median |TPOT error| <= 5 %, median |TTFT error| <= 10 %, same order.\n"
    "\n"
    "options:\n"
    "  --trace FILE        router trace (or [validate] trace in the experiment file)\n"
    "  --hw NAME           calibrated hardware profile (or [validate] hw)\n"
    "  --policy NAME       one configuration\n"
    "  --experiment FILE   [validate] policies = a, b, ...; budgets_gb = 12, 16, 24; other\n"
    "                      sections: settings (a policy's section only for that policy)\n"
    "  --budgets LIST      only these budgets of the experiment (e.g. one per GPU call)\n"
    "  --merge FILE        summarize the --json outputs of several runs as one set\n"
    "  --winners CSV       the best rows of a sweep's results CSV\n"
    "  --top N             how many winners (default 5)\n"
    "  --by COLUMN         winners' ranking column, lowest first (default tpot_ms.mean)\n"
    "  --set, --config     settings for every run (as `moesim sim`)\n"
    "  --seed N            synthetic weights' seed (default 1)\n"
    "  --repeats N         N rounds of replays, every configuration once per round (a slow\n"
    "                      drift of a shared machine falls on all alike); each is compared by\n"
    "                      its run of median makespan, with its TPOT range (default 1); with 6\n"
    "                      or more, a pair of policies is ranked only where its rounds agree\n"
    "                      (sign test, p < 0.05; replay/README.md)\n"
    "  --backend B         cuda (default: replay on the GPU) or cpu (replay on this machine's CPU\n"
    "                      and disk, experiments/validation/cpu/)\n"
    "  --check TPOT,MARGIN exit 1 unless the median |TPOT error| is at most TPOT (e.g. 0.25) and\n"
    "                      every two policies whose simulated TPOTs differ by more than MARGIN\n"
    "                      (e.g. 0.3) are ordered alike by the replay (a check noise cannot fail)\n"
    "  --report FILE       the report as Markdown (default: stdout)\n"
    "  --csv FILE          the rows as CSV (plots/validate.gp plots it)\n"
    "  --json              the rows and the summary as JSON on stdout\n"
    "  -h, --help          this text\n";

#define MAX_RUNS 512

typedef struct run_spec {
    char policy[32];
    char label[96];
    const char **sets; /* [n_sets] "section.key=value", owned strings */
    size_t n_sets;
} run_spec;

typedef struct vctx {
    const char *const *files;
    size_t n_files;
    const char *const *sets;
    size_t n_sets;
    trace *t;
    hw_profile hw;
    model_geometry model;
    quant_table quant;
    uint64_t seed;
    replay_store *store; /* lent to every run (a run whose formats differ makes its own) */
    char store_formats[128];
    bool cpu;             /* --backend cpu: replay_run_cpu */
    cpu_store *cpu_store; /* its expert file, lent to every run */
    uint32_t repeats;     /* replays per configuration (--repeats): the median one is compared */
} vctx;

/* A fresh config: files, common sets, the run's own sets, and host precisions the GPU kernels
 * have (bf16, int8, int4, int2) unless given, so sim and replay store the same formats. */
static moesim_status make_config(const vctx *v, const run_spec *r, config **out,
                                 moesim_error *err) {
    config *c = config_create();
    moesim_status st = cli_settings_load(c, v->files, v->n_files, v->sets, v->n_sets, err);
    for (size_t i = 0; i < r->n_sets && !st; i++) st = config_set(c, r->sets[i], err);
    bool has = false; /* config_get would mark the entry used: look without it */
    for (size_t i = 0; i < config_size(c) && !st; i++) {
        const char *sec, *key, *val;
        config_entry_at(c, i, &sec, &key, &val);
        has |= !strcmp(sec, "sim") && !strcmp(key, "host_precisions");
    }
    if (!st && !has)
        config_put(c, "sim", "host_precisions", "bf16,int8,int4,int2", "moesim validate");
    if (st) {
        config_destroy(c);
        return st;
    }
    *out = c;
    return MOESIM_OK;
}

/* sim.host_precisions of a run as its settings resolve it. */
static moesim_status run_formats(const vctx *v, const run_spec *r, char *out, size_t len,
                                 moesim_precision *primary, moesim_error *err) {
    config *c = NULL;
    moesim_status st = make_config(v, r, &c, err);
    sim_settings set;
    if (!st) st = sim_settings_read(c, &set, err);
    if (!st) snprintf(out, len, "%s", set.host_precisions);
    if (!st) *primary = (moesim_precision)set.precision;
    config_destroy(c);
    return st;
}

static moesim_status replay_once(const vctx *v, const char *policy_name, config *c,
                                 validate_record *rec, moesim_error *err) {
    sim_hooks h = validate_record_hooks(rec);
    replay_inputs in = {.trace = v->t,
                        .model = &v->model,
                        .hw = &v->hw,
                        .quant = &v->quant,
                        .hooks = &h,
                        .weight_seed = v->seed,
                        .store = v->store};
    in.cpu_store = v->cpu_store;
    return v->cpu ? replay_run_cpu(&in, policy_name, c, &rec->r, NULL, err)
                  : replay_run(&in, policy_name, c, &rec->r, NULL, err);
}

/* One configuration in flight: the simulator's run and the replays made so far. */
typedef struct config_runs {
    validate_record sim;
    validate_record *real; /* [repeats] */
    uint32_t n_real;
    bool refused; /* the simulator refused the configuration */
    char note[160];
} config_runs;

/* The simulator's run of a configuration. One it refuses (a policy that cannot work in the
 * budget, e.g. `static` when the experts do not fit) is marked refused, not an error: the
 * validation set crosses every policy with every budget. */
static moesim_status simulate(const vctx *v, const run_spec *r, config_runs *cr,
                              moesim_error *err) {
    validate_record_init(&cr->sim, v->t->n_requests, v->t->meta.n_layers);
    cr->real = moesim_xcalloc(v->repeats, sizeof *cr->real);
    config *c = NULL;
    moesim_status st = make_config(v, r, &c, err);
    if (!st) {
        sim_hooks h = validate_record_hooks(&cr->sim);
        sim_inputs in = {
            .trace = v->t, .model = &v->model, .hw = &v->hw, .quant = &v->quant, .hooks = &h};
        st = sim_run(&in, r->policy, c, &cr->sim.r, err);
        if (st == MOESIM_EINPUT) {
            cr->refused = true;
            snprintf(cr->note, sizeof cr->note, "%s", err->msg);
            st = MOESIM_OK;
        }
    }
    config_destroy(c);
    return st;
}

/* One more replay of a configuration. */
static moesim_status replay_again(const vctx *v, const run_spec *r, config_runs *cr,
                                  moesim_error *err) {
    validate_record *rec = &cr->real[cr->n_real++];
    validate_record_init(rec, v->t->n_requests, v->t->meta.n_layers);
    config *c = NULL;
    moesim_status st = make_config(v, r, &c, err);
    if (!st) st = replay_once(v, r->policy, c, rec, err);
    config_destroy(c);
    return st;
}

/* The row of a configuration: the replay of median makespan (the lower one of an even count;
 * it keeps the per-request and per-layer figures of one real execution) against the simulator,
 * with the TPOT range of all its replays. */
static moesim_status compare_runs(const config_runs *cr, const run_spec *r, validate_row *row,
                                  moesim_error *err) {
    if (cr->refused) {
        memset(row, 0, sizeof *row);
        snprintf(row->policy, sizeof row->policy, "%s", r->policy);
        snprintf(row->label, sizeof row->label, "%s", r->label);
        snprintf(row->group, sizeof row->group, "%s", r->label);
        row->refused = true;
        snprintf(row->note, sizeof row->note, "%s", cr->note);
        return MOESIM_OK;
    }
    uint32_t n = cr->n_real, median = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t below = 0; /* runs faster than run i (ties by order) */
        for (uint32_t j = 0; j < n; j++) {
            double a = cr->real[j].r.makespan_ms, b = cr->real[i].r.makespan_ms;
            below += a < b || (a == b && j < i);
        }
        if (below == (n - 1) / 2) median = i;
    }
    moesim_status st = validate_compare(&cr->sim, &cr->real[median], r->label, row, err);
    MOESIM_ASSERT(n <= VALIDATE_MAX_ROUNDS); /* --repeats is checked against it */
    for (uint32_t i = 0; i < n && !st; i++) {
        row->real_tpot_lo_ms = fmin(row->real_tpot_lo_ms, cr->real[i].r.tpot.mean_ms);
        row->real_tpot_hi_ms = fmax(row->real_tpot_hi_ms, cr->real[i].r.tpot.mean_ms);
        row->real_tpot_round_ms[row->n_rounds++] = cr->real[i].r.tpot.mean_ms; /* round i */
    }
    if (st) moesim_error_prefix(err, "%s (%s)", r->policy, r->label);
    return st;
}

static void config_runs_free(config_runs *cr) {
    validate_record_free(&cr->sim);
    for (uint32_t i = 0; i < cr->n_real; i++) validate_record_free(&cr->real[i]);
    free(cr->real);
}

/* Every configuration through the simulator, then `v->repeats` rounds of replays, each
 * configuration once per round: a slow drift of a shared machine's disk or memory bandwidth
 * falls on every configuration alike instead of on those measured while it lasted. */
static moesim_status run_all(const vctx *v, const run_spec *specs, size_t n, validate_row *rows,
                             bool quiet, moesim_error *err) {
    config_runs *runs = moesim_xcalloc(n ? n : 1, sizeof *runs);
    moesim_status st = MOESIM_OK;
    size_t simulated = 0;
    for (; simulated < n && !st; simulated++) {
        st = simulate(v, &specs[simulated], &runs[simulated], err);
        if (st) moesim_error_prefix(err, "%s (%s)", specs[simulated].policy, specs[simulated].label);
    }
    for (uint32_t round = 0; round < v->repeats && !st; round++)
        for (size_t i = 0; i < n && !st; i++) {
            if (runs[i].refused) continue;
            st = replay_again(v, &specs[i], &runs[i], err);
            if (st)
                moesim_error_prefix(err, "%s (%s)", specs[i].policy, specs[i].label);
            else if (!quiet)
                fprintf(stderr, "validate: %s (%s), replay %u of %u: TPOT sim %.4f ms, real %.4f ms\n",
                        specs[i].policy, specs[i].label, round + 1, v->repeats,
                        runs[i].sim.r.tpot.mean_ms, runs[i].real[round].r.tpot.mean_ms);
        }
    for (size_t i = 0; i < n && !st; i++) st = compare_runs(&runs[i], &specs[i], &rows[i], err);
    for (size_t i = 0; i < simulated; i++) config_runs_free(&runs[i]);
    free(runs);
    return st;
}

static void spec_add_set(run_spec *r, const char *fmt, const char *a, const char *b) {
    size_t len = strlen(fmt) + strlen(a) + strlen(b) + 1;
    char *s = moesim_xmalloc(len);
    snprintf(s, len, fmt, a, b);
    r->sets = moesim_xrealloc(r->sets, (r->n_sets + 1) * sizeof *r->sets);
    r->sets[r->n_sets++] = s;
}

static void specs_free(run_spec *specs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < specs[i].n_sets; j++) free((char *)specs[i].sets[j]);
        free(specs[i].sets);
    }
    free(specs);
}

/* Splits "a, b,c" into trimmed items; calls fn for each. Returns the count. */
static size_t split_list(const char *text, char items[][64], size_t cap) {
    size_t n = 0;
    const char *p = text;
    while (*p && n < cap) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        size_t len = strcspn(p, ",");
        while (len && p[len - 1] == ' ') len--;
        snprintf(items[n++], 64, "%.*s", (int)len, p);
        p += strcspn(p, ",");
    }
    return n;
}

/* --experiment: [validate] policies x budgets_gb; trace and hw when not given. The other
 * sections are appended to the common settings as files (the file itself, read by make_config
 * after its [validate] section is consumed here). */
static moesim_status experiment_specs(const char *path, const char *budgets_override,
                                      run_spec **out, size_t *n_out, char *trace_path,
                                      char *hw_name, char *model_name, size_t len,
                                      moesim_error *err) {
    config *c = config_create();
    moesim_status st = config_load_file(c, path, err);
    const char *pol = st ? NULL : config_get(c, "validate", "policies");
    const char *bud = st ? NULL : config_get(c, "validate", "budgets_gb");
    if (budgets_override) bud = budgets_override;
    if (!st && (!pol || !bud))
        st = moesim_fail(err, MOESIM_EINPUT, "%s: [validate] needs policies and budgets_gb", path);
    const char *tp = st ? NULL : config_get(c, "validate", "trace");
    const char *hw = st ? NULL : config_get(c, "validate", "hw");
    if (tp && !trace_path[0]) snprintf(trace_path, len, "%s", tp);
    if (hw && !hw_name[0]) snprintf(hw_name, len, "%s", hw);
    const char *mo = st ? NULL : config_get(c, "validate", "model"); /* default: the trace's */
    if (mo) snprintf(model_name, len, "%s", mo);
    char pols[64][64], buds[16][64];
    size_t np = st ? 0 : split_list(pol, pols, 64), nb = st ? 0 : split_list(bud, buds, 16);
    run_spec *specs = moesim_xcalloc(np * nb + 1, sizeof *specs);
    size_t n = 0;
    for (size_t b = 0; b < nb && !st; b++) {
        double gb;
        if (!config_parse_f64(buds[b], &gb) || gb <= 0) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: [validate] budgets_gb: expected positive numbers, got '%s'", path,
                             buds[b]);
            break;
        }
        for (size_t p = 0; p < np && !st; p++) {
            if (!policy_lookup(pols[p])) {
                st = moesim_fail(err, MOESIM_EINPUT,
                                 "%s: [validate] policies: unknown policy '%s' (known: %s)", path,
                                 pols[p], policy_names());
                break;
            }
            run_spec *r = &specs[n++];
            snprintf(r->policy, sizeof r->policy, "%s", pols[p]);
            snprintf(r->label, sizeof r->label, "budget %s GiB", buds[b]);
            spec_add_set(r, "memory.budget_gb=%s%s", buds[b], "");
            /* the file's other sections, as sets */
            for (size_t i = 0; i < config_size(c); i++) {
                const char *s, *k, *val;
                config_entry_at(c, i, &s, &k, &val);
                if (!strcmp(s, "validate")) continue;
                if (policy_lookup(s) && strcmp(s, pols[p])) continue; /* another policy's knobs */
                char sk[160];
                snprintf(sk, sizeof sk, "%s.%s", s, k);
                spec_add_set(r, "%s=%s", sk, val);
            }
        }
    }
    config_destroy(c);
    if (st) {
        specs_free(specs, n);
        return st;
    }
    *out = specs;
    *n_out = n;
    return MOESIM_OK;
}

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

/* --winners: the `top` rows of `path` with the lowest `by`. */
static moesim_status winners_specs(const char *path, const char *by, uint32_t top,
                                   const char *trace_path, const char *hw_name, run_spec **out,
                                   size_t *n_out, moesim_error *err) {
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
    run_spec *specs = NULL;
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
            run_spec *r = &specs[n++];
            snprintf(r->policy, sizeof r->policy, "%s", pm->name);
            snprintf(r->label, sizeof r->label, "winner %zu (%s %s)", i + 1, by, cols[by_col]);
            for (size_t c2 = 0; c2 < nh; c2++)
                if ((int)c2 != pol_col && cols[c2][0] && is_setting(hcols[c2], pm))
                    spec_add_set(r, "%s=%s", hcols[c2], cols[c2]);
        }
    }
    for (size_t i = 0; i < n_rows; i++) free(rows[i].line);
    free(rows);
    free(header);
    if (st) {
        specs_free(specs, n);
        return st;
    }
    *out = specs;
    *n_out = n;
    return MOESIM_OK;
}

static void pct(FILE *f, double v) {
    if (isnan(v))
        fputs(" n/a |", f);
    else
        fprintf(f, " %+.2f %% |", 100.0 * v);
}

static void gbps(FILE *f, double v) {
    if (isnan(v))
        fputs(" n/a |", f);
    else
        fprintf(f, " %.3f |", v);
}

/* The lowest and highest TPOT of a row's replays overlap the other's: the machine's own spread
 * could order the pair either way. */
static bool ranges_overlap(const validate_row *a, const validate_row *b) {
    return fmax(a->real_tpot_lo_ms, b->real_tpot_lo_ms) <=
           fmin(a->real_tpot_hi_ms, b->real_tpot_hi_ms);
}

/* How the replay's rounds split a pair ("lfu faster in 5 of 9 rounds, not ordered"), or without
 * rounds whether the replays' TPOT ranges overlap (a pair closer than the run-to-run spread can
 * go either way). */
static void write_replay_split(FILE *f, const validate_row *a, const validate_row *b) {
    uint32_t rounds, faster = validate_rounds_faster(a, b, &rounds);
    if (a->n_rounds >= VALIDATE_MIN_ROUNDS && b->n_rounds >= VALIDATE_MIN_ROUNDS)
        fprintf(f, ", %s faster in %u of %u rounds%s", a->policy, faster, rounds,
                validate_replay_order(a, b) ? "" : ": not ordered by the replay");
    else if (ranges_overlap(a, b))
        fputs(", replay ranges overlap", f);
}

/* Which pairs the replay's medians order differently, with how far apart the simulator put them
 * and how the replay's rounds split them; then the pairs the simulator ties, which are not
 * ranked. */
static void write_pairs(FILE *f, const validate_row *rows, size_t n, const validate_summary *s) {
    size_t n_disc = validate_discordant_pairs(rows, n, NULL, 0);
    size_t n_tied = validate_sim_tied_pairs(rows, n, NULL, 0);
    size_t cap = n_disc > n_tied ? n_disc : n_tied;
    if (!cap) return;
    size_t (*pairs)[2] = moesim_xmalloc(cap * sizeof *pairs);
    validate_discordant_pairs(rows, n, pairs, cap);
    if (n_disc)
        fprintf(f, "Ordered differently (simulated TPOTs apart by; largest %.2f %%):",
                100 * s->discordant_gap_max);
    for (size_t k = 0; k < n_disc; k++) {
        const validate_row *a = &rows[pairs[k][0]], *b = &rows[pairs[k][1]];
        fprintf(f, "%s %s vs %s at %s (%.2f %%", k ? ";" : "", a->policy, b->policy, a->label,
                100 * validate_sim_gap(a, b));
        write_replay_split(f, a, b);
        fputc(')', f);
    }
    if (n_disc) fputs(".\n", f);
    validate_sim_tied_pairs(rows, n, pairs, cap);
    if (n_tied) fputs("Tied in the simulator (the same work; not ranked):", f);
    for (size_t k = 0; k < n_tied; k++)
        fprintf(f, "%s %s vs %s at %s", k ? ";" : "", rows[pairs[k][0]].policy,
                rows[pairs[k][1]].policy, rows[pairs[k][0]].label);
    if (n_tied) fputs(".\n", f);
    free(pairs);
}

static void write_report(FILE *f, const char *device, const char *profile, const char *trace_path,
                         const char *model, const validate_row *rows, size_t n,
                         const validate_summary *s) {
    fprintf(f, "# moesim validate: simulator vs replay\n\n");
    fprintf(f, "Device: %s (profile %s). Trace: %s (model %s).\n\n", device, profile, trace_path,
            model);
    fprintf(f, "| policy | configuration | TPOT sim ms | TPOT real ms | TPOT real range ms | "
               "TPOT err | TTFT sim ms | TTFT real ms | TTFT err | total err | median req TPOT "
               "err | median req TTFT err | median layer err | worst layer (err) | hit sim | hit "
               "real | link GB/s sim | link GB/s real |\n");
    fprintf(f, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const validate_row *r = &rows[i];
        if (r->refused) continue;
        fprintf(f, "| %s | %s | %.4f | %.4f |", r->policy, r->label, r->sim_tpot_ms,
                r->real_tpot_ms);
        if (isnan(r->real_tpot_lo_ms) || isnan(r->real_tpot_hi_ms))
            fputs(" n/a |", f);
        else
            fprintf(f, " %.2f-%.2f |", r->real_tpot_lo_ms, r->real_tpot_hi_ms);
        pct(f, r->tpot_err);
        fprintf(f, " %.4f | %.4f |", r->sim_ttft_ms, r->real_ttft_ms);
        pct(f, r->ttft_err);
        pct(f, r->total_err);
        pct(f, r->req_tpot_err_median);
        pct(f, r->req_ttft_err_median);
        pct(f, r->layer_err_median);
        if (r->layer_worst >= 0)
            fprintf(f, " L%d (%.2f %%) |", r->layer_worst, 100.0 * r->layer_err_max);
        else
            fputs(" n/a |", f);
        fprintf(f, " %.4f | %.4f |", r->sim_hit_rate, r->real_hit_rate);
        gbps(f, r->sim_link_gb_per_s);
        gbps(f, r->real_link_gb_per_s);
        fputc('\n', f);
    }
    for (size_t i = 0; i < n; i++)
        if (rows[i].refused)
            fprintf(f, "\nRefused by the simulator (left out): %s, %s: %s\n", rows[i].policy,
                    rows[i].label, rows[i].note);
    fprintf(f, "\nPer-layer times (ms, summed over steps) of every configuration: the JSON's "
               "sim_layer_ms and real_layer_ms.\n");
    fprintf(f,
            "\nMedian |TPOT error| %.2f %% (target <= 5 %%), median |TTFT error| %.2f %% "
            "(target <= 10 %%), median |total error| %.2f %%.\n",
            100 * s->tpot_abs_err_median, 100 * s->ttft_abs_err_median,
            100 * s->total_abs_err_median);
    fprintf(f,
            "Policy order by TPOT: %llu of %llu pairs agree (%s; %llu tied in the simulator, "
            "not ranked); of the %llu pairs the replay orders (at least %d rounds: the sign "
            "test over rounds, p < 0.05; fewer: every pair), %llu agree. Targets %s.\n",
            (unsigned long long)s->concordant, (unsigned long long)s->pairs,
            s->same_order ? "same order" : "order differs", (unsigned long long)s->sim_ties,
            (unsigned long long)s->replay_ordered, VALIDATE_MIN_ROUNDS,
            (unsigned long long)s->replay_ordered_concordant, s->meets_targets ? "met" : "not met");
    write_pairs(f, rows, n, s);
}

static json_t *rows_json(const validate_row *rows, size_t n, const validate_summary *s,
                         const char *device, const char *profile, const char *trace_path,
                         const char *model) {
    json_t *j = json_object(), *a = json_array();
    json_object_set_new(j, "device", json_string(device));
    json_object_set_new(j, "profile", json_string(profile));
    json_object_set_new(j, "trace", json_string(trace_path));
    json_object_set_new(j, "model", json_string(model));
    for (size_t i = 0; i < n; i++) {
        const validate_row *r = &rows[i];
        json_t *o = json_object();
#define NUM(x) (isnan(x) ? json_null() : json_real(x))
        json_object_set_new(o, "policy", json_string(r->policy));
        json_object_set_new(o, "configuration", json_string(r->label));
        if (r->refused) {
            json_object_set_new(o, "refused", json_string(r->note));
            json_array_append_new(a, o);
            continue;
        }
        json_object_set_new(o, "sim_tpot_ms", NUM(r->sim_tpot_ms));
        json_object_set_new(o, "real_tpot_ms", NUM(r->real_tpot_ms));
        json_object_set_new(o, "real_tpot_lo_ms", NUM(r->real_tpot_lo_ms));
        json_object_set_new(o, "real_tpot_hi_ms", NUM(r->real_tpot_hi_ms));
        json_t *rounds = json_array();
        for (uint32_t k = 0; k < r->n_rounds; k++)
            json_array_append_new(rounds, NUM(r->real_tpot_round_ms[k]));
        json_object_set_new(o, "real_tpot_rounds_ms", rounds);
        json_object_set_new(o, "tpot_err", NUM(r->tpot_err));
        json_object_set_new(o, "sim_ttft_ms", NUM(r->sim_ttft_ms));
        json_object_set_new(o, "real_ttft_ms", NUM(r->real_ttft_ms));
        json_object_set_new(o, "ttft_err", NUM(r->ttft_err));
        json_object_set_new(o, "total_err", NUM(r->total_err));
        json_object_set_new(o, "req_tpot_err_median", NUM(r->req_tpot_err_median));
        json_object_set_new(o, "req_ttft_err_median", NUM(r->req_ttft_err_median));
        json_object_set_new(o, "layer_err_median", NUM(r->layer_err_median));
        json_object_set_new(o, "layer_err_max", NUM(r->layer_err_max));
        json_object_set_new(o, "layer_worst", json_integer(r->layer_worst));
        json_t *ls = json_array(), *lr = json_array();
        for (uint32_t l = 0; l < r->n_layers; l++) {
            json_array_append_new(ls, json_real(r->sim_layer_ms[l]));
            json_array_append_new(lr, json_real(r->real_layer_ms[l]));
        }
        json_object_set_new(o, "sim_layer_ms", ls);
        json_object_set_new(o, "real_layer_ms", lr);
        json_object_set_new(o, "sim_hit_rate", NUM(r->sim_hit_rate));
        json_object_set_new(o, "real_hit_rate", NUM(r->real_hit_rate));
        json_object_set_new(o, "sim_link_gb_per_s", NUM(r->sim_link_gb_per_s));
        json_object_set_new(o, "real_link_gb_per_s", NUM(r->real_link_gb_per_s));
        json_array_append_new(a, o);
    }
    json_object_set_new(j, "rows", a);
    json_t *sj = json_object();
    json_object_set_new(sj, "tpot_abs_err_median", NUM(s->tpot_abs_err_median));
    json_object_set_new(sj, "ttft_abs_err_median", NUM(s->ttft_abs_err_median));
    json_object_set_new(sj, "total_abs_err_median", NUM(s->total_abs_err_median));
    json_object_set_new(sj, "pairs", json_integer((json_int_t)s->pairs));
    json_object_set_new(sj, "concordant", json_integer((json_int_t)s->concordant));
    json_object_set_new(sj, "sim_ties", json_integer((json_int_t)s->sim_ties));
    json_object_set_new(sj, "same_order", json_boolean(s->same_order));
    json_object_set_new(sj, "replay_ordered", json_integer((json_int_t)s->replay_ordered));
    json_object_set_new(sj, "replay_ordered_concordant",
                        json_integer((json_int_t)s->replay_ordered_concordant));
    json_object_set_new(sj, "discordant_sim_gap_max", json_real(s->discordant_gap_max));
    json_object_set_new(sj, "meets_targets", json_boolean(s->meets_targets));
#undef NUM
    json_object_set_new(j, "summary", sj);
    return j;
}

/* The rows as CSV for plots/validate.gp (refused configurations left out). */
static moesim_status write_csv(const char *path, const validate_row *rows, size_t n,
                               moesim_error *err) {
    atomic_file af;
    if (atomic_file_open(&af, path, err)) return MOESIM_EIO;
    fprintf(af.fp, "policy,configuration,sim_tpot_ms,real_tpot_ms,tpot_err,sim_ttft_ms,"
                   "real_ttft_ms,ttft_err,total_err,real_tpot_lo_ms,real_tpot_hi_ms\n");
    for (size_t i = 0; i < n; i++) {
        const validate_row *r = &rows[i];
        if (r->refused) continue;
        fprintf(af.fp, "%s,%s,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g\n", r->policy,
                r->label, r->sim_tpot_ms, r->real_tpot_ms, r->tpot_err, r->sim_ttft_ms,
                r->real_ttft_ms, r->ttft_err, r->total_err, r->real_tpot_lo_ms,
                r->real_tpot_hi_ms);
    }
    return atomic_file_commit(&af, err);
}

/* --merge: the rows of several `--json` outputs (e.g. one GPU call per budget) summarized as
 * one validation set. No GPU needed. */
static int merge_reports(const char **files, size_t n_files, const char *report, const char *csv,
                         bool json) {
    moesim_error err = {0};
    validate_row *rows = NULL;
    size_t n = 0;
    char device[96] = "", profile[96] = "", trace_path[1024] = "", model[96] = "";
    moesim_status st = MOESIM_OK;
    for (size_t f = 0; f < n_files && !st; f++) {
        json_error_t je;
        json_t *j = json_load_file(files[f], 0, &je);
        json_t *a = j ? json_object_get(j, "rows") : NULL;
        if (!j || !json_is_array(a)) {
            st = moesim_fail(&err, MOESIM_EINPUT,
                             "%s: expected the JSON of `moesim validate "
                             "--json` (%s)",
                             files[f], j ? "no \"rows\" array" : je.text);
            json_decref(j);
            break;
        }
        const char *d = json_string_value(json_object_get(j, "device"));
        if (f && d && strcmp(d, device))
            st = moesim_fail(&err, MOESIM_EINPUT, "%s: device '%s', the first file's is '%s'",
                             files[f], d, device);
        snprintf(device, sizeof device, "%s", d ? d : "?");
        const char *pr = json_string_value(json_object_get(j, "profile"));
        const char *tp = json_string_value(json_object_get(j, "trace"));
        const char *md = json_string_value(json_object_get(j, "model"));
        snprintf(profile, sizeof profile, "%s", pr ? pr : "?");
        snprintf(trace_path, sizeof trace_path, "%s", tp ? tp : "?");
        snprintf(model, sizeof model, "%s", md ? md : "?");
        size_t i;
        json_t *o;
        json_array_foreach(a, i, o) {
            rows = moesim_xrealloc(rows, (n + 1) * sizeof *rows);
            validate_row *r = &rows[n++];
            memset(r, 0, sizeof *r);
            const char *pol = json_string_value(json_object_get(o, "policy"));
            const char *cfg = json_string_value(json_object_get(o, "configuration"));
            snprintf(r->policy, sizeof r->policy, "%s", pol ? pol : "?");
            snprintf(r->label, sizeof r->label, "%s", cfg ? cfg : "?");
            snprintf(r->group, sizeof r->group, "%s", r->label);
            const char *ref = json_string_value(json_object_get(o, "refused"));
            if (ref) {
                r->refused = true;
                snprintf(r->note, sizeof r->note, "%s", ref);
                continue;
            }
#define GET(field)                                                                                 \
    (json_is_number(json_object_get(o, #field)) ? json_number_value(json_object_get(o, #field))    \
                                                : NAN)
            r->sim_tpot_ms = GET(sim_tpot_ms);
            r->real_tpot_ms = GET(real_tpot_ms);
            r->real_tpot_lo_ms = GET(real_tpot_lo_ms); /* NAN from an older JSON */
            r->real_tpot_hi_ms = GET(real_tpot_hi_ms);
            json_t *rounds = json_object_get(o, "real_tpot_rounds_ms"); /* absent: older JSON */
            if (json_is_array(rounds) && json_array_size(rounds) <= VALIDATE_MAX_ROUNDS) {
                r->n_rounds = (uint32_t)json_array_size(rounds);
                for (uint32_t k = 0; k < r->n_rounds; k++) {
                    json_t *x = json_array_get(rounds, k);
                    r->real_tpot_round_ms[k] = json_is_number(x) ? json_number_value(x) : NAN;
                }
            }
            r->tpot_err = GET(tpot_err);
            r->sim_ttft_ms = GET(sim_ttft_ms);
            r->real_ttft_ms = GET(real_ttft_ms);
            r->ttft_err = GET(ttft_err);
            r->total_err = GET(total_err);
            r->req_tpot_err_median = GET(req_tpot_err_median);
            r->req_ttft_err_median = GET(req_ttft_err_median);
            r->layer_err_median = GET(layer_err_median);
            r->layer_err_max = GET(layer_err_max);
            json_t *lw = json_object_get(o, "layer_worst");
            r->layer_worst = json_is_integer(lw) ? (int32_t)json_integer_value(lw) : -1;
            json_t *ls = json_object_get(o, "sim_layer_ms"),
                   *lr = json_object_get(o, "real_layer_ms");
            if (json_is_array(ls) && json_is_array(lr) &&
                json_array_size(ls) == json_array_size(lr) &&
                json_array_size(ls) <= MODEL_MAX_LAYERS) {
                r->n_layers = (uint32_t)json_array_size(ls);
                for (uint32_t l = 0; l < r->n_layers; l++) {
                    r->sim_layer_ms[l] = (float)json_number_value(json_array_get(ls, l));
                    r->real_layer_ms[l] = (float)json_number_value(json_array_get(lr, l));
                }
            }
            r->sim_hit_rate = GET(sim_hit_rate);
            r->real_hit_rate = GET(real_hit_rate);
            r->sim_link_gb_per_s = GET(sim_link_gb_per_s);
            r->real_link_gb_per_s = GET(real_link_gb_per_s);
#undef GET
        }
        json_decref(j);
    }
    if (!st) {
        validate_summary s;
        validate_summarize(rows, n, &s);
        if (report) {
            atomic_file af;
            st = atomic_file_open(&af, report, &err);
            if (!st) {
                write_report(af.fp, device, profile, trace_path, model, rows, n, &s);
                st = atomic_file_commit(&af, &err);
            }
        } else if (!json) {
            write_report(stdout, device, profile, trace_path, model, rows, n, &s);
        }
        if (!st && csv) st = write_csv(csv, rows, n, &err);
        if (!st && json) {
            json_t *inputs = json_object(), *merged = json_array(); /* the --json files merged */
            for (size_t f = 0; f < n_files; f++)
                json_array_append_new(merged, cli_file_json(files[f]));
            json_object_set_new(inputs, "merged", merged);
            cli_print_json(cli_json_with_provenance(
                rows_json(rows, n, &s, device, profile, trace_path, model), inputs));
        }
    }
    free(rows);
    return st ? cli_fail(&err) : 0;
}

int cmd_validate(int argc, char **argv) {
    static const struct option own[] = {
        {"experiment", required_argument, NULL, 'x'}, {"winners", required_argument, NULL, 'W'},
        {"top", required_argument, NULL, 'n'},        {"by", required_argument, NULL, 'b'},
        {"seed", required_argument, NULL, 'e'},       {"report", required_argument, NULL, 'r'},
        {"budgets", required_argument, NULL, 'B'},    {"merge", required_argument, NULL, 'G'},
        {"csv", required_argument, NULL, 'C'},        {"backend", required_argument, NULL, 'K'},
        {"check", required_argument, NULL, 'k'},      {"repeats", required_argument, NULL, 'R'},
        {"help", no_argument, NULL, 'h'}};
    struct option opts[CLI_SIM_OPTIONS_MAX + MOESIM_ARRAY_LEN(own) + 1];
    cli_sim_options o;
    cli_sim_options_start(&o, CLI_SIM_RUN, own, MOESIM_ARRAY_LEN(own), opts);
    const char *backend = "cuda", *check = NULL;
    const char *experiment = NULL, *winners = NULL, *by = "tpot_ms.mean", *top_text = NULL,
               *seed_text = NULL, *report = NULL, *budgets = NULL, *csv = NULL,
               *repeats_text = NULL;
    const char **merges = NULL;
    size_t n_merges = 0;
    int c, rc = 0;
    while ((c = cli_sim_options_next(&o, argc, argv, opts)) != -1) {
        switch (c) {
        case 'B':
            budgets = optarg;
            break;
        case 'C':
            csv = optarg;
            break;
        case 'K':
            backend = optarg;
            break;
        case 'k':
            check = optarg;
            break;
        case 'G':
            cli_collect(&merges, &n_merges, optarg);
            break;
        case 'x':
            experiment = optarg;
            break;
        case 'W':
            winners = optarg;
            break;
        case 'n':
            top_text = optarg;
            break;
        case 'b':
            by = optarg;
            break;
        case 'e':
            seed_text = optarg;
            break;
        case 'R':
            repeats_text = optarg;
            break;
        case 'r':
            report = optarg;
            break;
        case 'h':
            fputs(validate_usage, stdout);
            cli_sim_options_free(&o);
            free(merges);
            return 0;
        default:
            cli_sim_options_free(&o);
            free(merges);
            return cli_getopt_error("validate", c, argc, argv, opts);
        }
    }
    uint64_t top = 5, seed = 1, repeats = 1;
    if (n_merges) {
        bool alone = optind == argc && !o.policy_name && !experiment && !winners;
        cli_sim_options_free(&o);
        rc = alone ? merge_reports(merges, n_merges, report, csv, o.json)
                   : cli_usage_error("validate", "--merge takes only --report, --csv and --json");
        free(merges);
        return rc;
    }
    if (optind < argc)
        rc = cli_usage_error("validate", "unexpected argument '%s'", argv[optind]);
    else if ((o.policy_name != NULL) + (experiment != NULL) + (winners != NULL) != 1)
        rc = cli_usage_error("validate",
                             "give exactly one of --policy, --experiment, --winners, --merge");
    else if (budgets && !experiment)
        rc = cli_usage_error("validate", "--budgets selects budgets of an --experiment file");
    if (!rc) rc = cli_sim_options_check("validate", &o, false);
    if (!rc && top_text && (!config_parse_u64(top_text, &top) || top < 1 || top > MAX_RUNS))
        rc = cli_usage_error("validate", "--top: expected an integer in [1, %d], got '%s'",
                             MAX_RUNS, top_text);
    if (!rc && repeats_text &&
        (!config_parse_u64(repeats_text, &repeats) || repeats < 1 || repeats > VALIDATE_MAX_ROUNDS))
        rc = cli_usage_error("validate", "--repeats: expected an integer in [1, %d], got '%s'",
                             VALIDATE_MAX_ROUNDS, repeats_text);
    if (!rc && seed_text && !config_parse_u64(seed_text, &seed))
        rc = cli_usage_error("validate", "--seed: expected a non-negative integer, got '%s'",
                             seed_text);
    double check_tpot = 0, check_margin = 0;
    if (!rc && strcmp(backend, "cuda") && strcmp(backend, "cpu"))
        rc = cli_usage_error("validate", "--backend: expected cuda or cpu, got '%s'", backend);
    else if (!rc && check &&
             (sscanf(check, "%lf,%lf", &check_tpot, &check_margin) != 2 || check_tpot <= 0 ||
              check_margin < 0))
        rc = cli_usage_error("validate",
                             "--check: expected TPOT,MARGIN as two numbers (e.g. 0.25,0.3), got "
                             "'%s'",
                             check);
    if (rc) {
        cli_sim_options_free(&o);
        return rc;
    }
    /* trace and hw may come from the experiment file (option wins): copies it may fill */
    char trace_path[1024] = "", hw_name[1024] = "", model_name[1024] = "";
    snprintf(trace_path, sizeof trace_path, "%s", o.trace_path ? o.trace_path : "");
    snprintf(hw_name, sizeof hw_name, "%s", o.hw_name ? o.hw_name : "");
    moesim_error err = {0};
    config *settings =
        config_create(); /* its errors first, as in `moesim sim` (runs make theirs) */
    moesim_status st = cli_sim_options_settings(&o, settings, &err);
    config_destroy(settings);
    run_spec *specs = NULL;
    size_t n_specs = 0;
    if (!st && experiment) {
        st = experiment_specs(experiment, budgets, &specs, &n_specs, trace_path, hw_name,
                              model_name, sizeof trace_path, &err);
    } else if (!st && winners) {
        st = winners_specs(winners, by, (uint32_t)top, trace_path, hw_name, &specs, &n_specs, &err);
    } else if (!st) {
        specs = moesim_xcalloc(1, sizeof *specs);
        n_specs = 1;
        snprintf(specs[0].policy, sizeof specs[0].policy, "%s", o.policy_name);
        snprintf(specs[0].label, sizeof specs[0].label, "as given");
    }
    if (!st && (!trace_path[0] || !hw_name[0]))
        st = moesim_fail(&err, MOESIM_EINPUT,
                         "moesim validate: --trace and --hw are required (or [validate] trace "
                         "and hw in the experiment file)");
    vctx v = {.files = o.files,
              .n_files = o.n_files,
              .sets = o.sets,
              .n_sets = o.n_sets,
              .seed = seed,
              .cpu = !strcmp(backend, "cpu"),
              .repeats = (uint32_t)repeats};
    if (!st)
        st = cli_sim_inputs_load(trace_path, hw_name, model_name[0] ? model_name : NULL, &v.t,
                                 &v.hw, &v.model, &v.quant, &err);
    if (!st && !v.cpu) st = replay_device_check(&err); /* after the inputs: theirs come first */
    if (!st && n_specs) { /* one host store for the runs (pinning tens of GB is slow) */
        moesim_precision primary = PREC_BF16;
        st = run_formats(&v, &specs[0], v.store_formats, sizeof v.store_formats, &primary, &err);
        bool stored[PREC_COUNT], policy_only;
        if (!st && v.cpu)
            st = memsys_parse_host_precisions(v.store_formats, stored, &policy_only, &err);
        if (!st && v.cpu && policy_only)
            st = moesim_fail(&err, MOESIM_EINPUT,
                             "validate --backend cpu: [sim] host_precisions must list the formats "
                             "of the shared expert file (e.g. int8,int4,int2), not 'policy'");
        if (!st && v.cpu)
            st = cpu_store_create(&v.model, stored, NULL, v.seed, NULL, &v.cpu_store, &err);
        else if (!st)
            st = replay_store_create(&v.model, &v.quant, v.store_formats, primary, v.hw.dram_bytes,
                                     NULL, v.seed, &v.store, &err);
    }
    validate_row *rows = moesim_xcalloc(n_specs ? n_specs : 1, sizeof *rows);
    if (!st) st = run_all(&v, specs, n_specs, rows, o.json || o.quiet, &err);
    if (!st) {
        validate_summary s;
        validate_summarize(rows, n_specs, &s);
        if (report) {
            atomic_file af;
            st = atomic_file_open(&af, report, &err);
            if (!st) {
                write_report(af.fp, v.hw.gpu, v.hw.name, trace_path, v.model.name, rows, n_specs,
                             &s);
                st = atomic_file_commit(&af, &err);
            }
        } else if (!o.json) {
            write_report(stdout, v.hw.gpu, v.hw.name, trace_path, v.model.name, rows, n_specs, &s);
        }
        if (!st && csv) st = write_csv(csv, rows, n_specs, &err);
        if (!st && o.json) {
            json_t *inputs = json_object(); /* what the rows were made from */
            json_object_set_new(inputs, "trace", cli_file_json(trace_path));
            json_object_set_new(inputs, "model", cli_config_json("models", v.model.name));
            json_object_set_new(inputs, "hw", cli_config_json("hw", v.hw.name));
            json_object_set_new(inputs, "experiment",
                                experiment ? cli_file_json(experiment) : json_null());
            json_object_set_new(inputs, "backend", json_string(v.cpu ? "cpu" : "cuda"));
            json_object_set_new(inputs, "seed", json_integer((json_int_t)v.seed));
            cli_print_json(cli_json_with_provenance(
                rows_json(rows, n_specs, &s, v.hw.gpu, v.hw.name, trace_path, v.model.name),
                inputs));
        }
        uint64_t pairs, alike;
        bool order = validate_order_beyond(rows, n_specs, check_margin, &pairs, &alike);
        if (!st && check) {
            fprintf(stderr,
                    "validate: check: median |TPOT error| %.1f %% (limit %.1f %%), %" PRIu64
                    " of %" PRIu64 " pairs more than %.0f %% apart ordered alike\n",
                    100 * s.tpot_abs_err_median, 100 * check_tpot, alike, pairs,
                    100 * check_margin);
            if (!(s.tpot_abs_err_median <= check_tpot) || !order) rc = 1;
        }
    }
    if (st) rc = cli_fail(&err);
    free(rows);
    replay_store_destroy(v.store);
    cpu_store_destroy(v.cpu_store);
    specs_free(specs, n_specs);
    trace_destroy(v.t);
    cli_sim_options_free(&o);
    return rc;
}
