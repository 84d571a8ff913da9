/* The "sim" evaluator of sweeps: one sim_run per configuration (sim/sim.h), so a sweep row and
 * `moesim sim` with the same settings give the same figures. Models, hardware profiles, the
 * quantization table and traces are loaded once, before any configuration runs, and shared
 * read-only by the worker threads; each run gets its own config of the row's settings, with
 * origins naming the experiment line that set them. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "policies/plugin.h"
#include "sim/sim.h"
#include "sweep/sweep.h"
#include "sweep/sweep_internal.h"
#include "traces/trace.h"

#define SIM_MAX_METRICS 64

typedef struct named_model {
    char *name;
    model_geometry geometry;
} named_model;

typedef struct named_hw {
    char *name;
    hw_profile profile;
} named_hw;

typedef struct named_trace {
    char *path;
    trace *t;
} named_trace;

typedef struct sim_ctx {
    quant_table quant;
    named_model *models; /* [n_models] */
    size_t n_models;
    named_hw *hws; /* [n_hws] */
    size_t n_hws;
    named_trace *traces; /* [n_traces] */
    size_t n_traces;
    policy_plugin **plugins; /* [n_plugins] the policy_lib files, each loaded once */
    size_t n_plugins;
    size_t n_metrics; /* the fixed fields of sim_result_fields */
    const char *metric_names[SIM_MAX_METRICS];
} sim_ctx;

static void sim_ctx_destroy(void *ctx) {
    sim_ctx *c = ctx;
    if (!c) return;
    for (size_t i = 0; i < c->n_models; i++) free(c->models[i].name);
    for (size_t i = 0; i < c->n_hws; i++) free(c->hws[i].name);
    for (size_t i = 0; i < c->n_traces; i++) {
        free(c->traces[i].path);
        trace_destroy(c->traces[i].t);
    }
    for (size_t i = 0; i < c->n_plugins; i++) policy_plugin_close(c->plugins[i]);
    free(c->models);
    free(c->hws);
    free(c->traces);
    free(c->plugins);
    free(c);
}

static const model_geometry *find_model(const sim_ctx *c, const char *name) {
    for (size_t i = 0; i < c->n_models; i++)
        if (!strcmp(c->models[i].name, name)) return &c->models[i].geometry;
    return NULL;
}

static const hw_profile *find_hw(const sim_ctx *c, const char *name) {
    for (size_t i = 0; i < c->n_hws; i++)
        if (!strcmp(c->hws[i].name, name)) return &c->hws[i].profile;
    return NULL;
}

static const trace *find_trace(const sim_ctx *c, const char *path) {
    for (size_t i = 0; i < c->n_traces; i++)
        if (!strcmp(c->traces[i].path, path)) return c->traces[i].t;
    return NULL;
}

static const policy_plugin *find_plugin(const sim_ctx *c, const char *path) {
    for (size_t i = 0; path && i < c->n_plugins; i++)
        if (!strcmp(policy_plugin_path(c->plugins[i]), path)) return c->plugins[i];
    return NULL;
}

/* The table a configuration runs: its policy_lib's when the plug-in provides its policy, else
 * NULL (the registry's policy of that name: a built-in beside a plug-in in one experiment). */
static const policy_methods *point_policy(const sim_ctx *c, const sweep_experiment *e,
                                          const sweep_point *p) {
    const policy_plugin *pl = find_plugin(c, sweep_point_get(e, p, "policy_lib"));
    if (!pl) return NULL;
    const policy_methods *pm = policy_plugin_methods(pl);
    return strcmp(pm->name, sweep_point_get(e, p, "policy")) ? NULL : pm;
}

/* Loads every model, hw profile, trace and policy plug-in the configurations name (each once). */
static moesim_status load_inputs(sim_ctx *c, const sweep_experiment *e, moesim_error *err) {
    for (size_t i = 0; i < sweep_experiment_count(e); i++) {
        const sweep_point *p = sweep_experiment_point(e, i);
        const char *model = sweep_point_get(e, p, "model");
        const char *hw = sweep_point_get(e, p, "hw");
        const char *path = sweep_point_get(e, p, "trace");
        moesim_status st;
        if (!find_model(c, model)) {
            c->models = moesim_xrealloc(c->models, (c->n_models + 1) * sizeof *c->models);
            named_model *m = &c->models[c->n_models];
            char file[PATH_MAX];
            sweep_experiment_input_path(e, "model", model, file, sizeof file);
            st = model_load_by_name(file, &m->geometry, err);
            if (st) return st;
            m->name = moesim_xstrdup(model);
            c->n_models++;
        }
        if (!find_hw(c, hw)) {
            c->hws = moesim_xrealloc(c->hws, (c->n_hws + 1) * sizeof *c->hws);
            named_hw *h = &c->hws[c->n_hws];
            char file[PATH_MAX];
            sweep_experiment_input_path(e, "hw", hw, file, sizeof file);
            st = hw_load_by_name(file, &h->profile, err);
            if (st) return st;
            h->name = moesim_xstrdup(hw);
            c->n_hws++;
        }
        const char *lib = sweep_point_get(e, p, "policy_lib");
        if (lib && !find_plugin(c, lib)) {
            policy_plugin *pl = NULL;
            st = policy_plugin_open(lib, &pl, err);
            if (st) {
                int col = sweep_experiment_column_index(e, "policy_lib");
                moesim_error_prefix(err, "%s: policy_lib", p->origins[col]);
                return st;
            }
            c->plugins = moesim_xrealloc(c->plugins, (c->n_plugins + 1) * sizeof *c->plugins);
            c->plugins[c->n_plugins++] = pl;
        }
        if (!find_trace(c, path)) {
            trace *t = NULL;
            char file[PATH_MAX];
            sweep_experiment_input_path(e, "trace", path, file, sizeof file);
            st = trace_read(file, &t, err);
            if (st) return st;
            c->traces = moesim_xrealloc(c->traces, (c->n_traces + 1) * sizeof *c->traces);
            c->traces[c->n_traces++] = (named_trace){moesim_xstrdup(path), t};
        }
    }
    return MOESIM_OK;
}

/* The settings configuration p hands the simulator, each entry named by its place in the file. */
static config *point_settings(const sweep_experiment *e, const sweep_point *p) {
    config *settings = config_create();
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, p->seed);
    config_put(settings, "sim", "seed", seed, "sweep: [experiment] seed");
    for (size_t col = 0; col < sweep_experiment_n_columns(e); col++) {
        if (!sweep_experiment_column_is_setting(e, col) || !p->values[col]) continue;
        const char *name = sweep_experiment_column(e, col);
        const char *dot = strchr(name, '.');
        char section[128];
        snprintf(section, sizeof section, "%.*s", (int)(dot - name), name);
        config_put(settings, section, dot + 1, p->values[col], p->origins[col]);
    }
    return settings;
}

/* Every configuration's policy and settings, before any runs: a value of the file that cannot
 * be read is the file's fault (one line, exit 2), not a row's status. */
static moesim_status check_points(const sim_ctx *c, const sweep_experiment *e, moesim_error *err) {
    int policy_col = sweep_experiment_column_index(e, "policy");
    for (size_t i = 0; i < sweep_experiment_count(e); i++) {
        const sweep_point *p = sweep_experiment_point(e, i);
        const policy_methods *table = point_policy(c, e, p);
        const char *name = sweep_point_get(e, p, "policy");
        if (!table && !policy_lookup(name)) /* named where the file sets it */
            return moesim_fail(err, MOESIM_EINPUT, "%s: policy: unknown policy '%s' (known: %s)",
                               p->origins[policy_col], name, policy_names());
        config *settings = point_settings(e, p); /* each entry names its line */
        moesim_status st = sim_settings_check(table, name, settings, err);
        config_destroy(settings);
        if (st) return st;
    }
    return MOESIM_OK;
}

static moesim_status sim_eval_run(void *ctx, const sweep_experiment *e, const sweep_point *p,
                                  double *metrics, char *note, size_t note_len, moesim_error *err) {
    const sim_ctx *c = ctx;
    sim_inputs in = {.trace = find_trace(c, sweep_point_get(e, p, "trace")),
                     .model = find_model(c, sweep_point_get(e, p, "model")),
                     .hw = find_hw(c, sweep_point_get(e, p, "hw")),
                     .quant = &c->quant,
                     .timeline_path = NULL,
                     .policy = point_policy(c, e, p)};
    MOESIM_ASSERT(in.trace && in.model && in.hw); /* load_inputs loaded every one */
    config *settings = point_settings(e, p);
    sim_result r;
    moesim_status st = sim_run(&in, sweep_point_get(e, p, "policy"), settings, &r, err);
    config_destroy(settings);
    if (st) return st;
    const char *names[SIM_MAX_METRICS + 16];
    double values[SIM_MAX_METRICS + 16];
    size_t n = sim_result_fields(&r, names, values, MOESIM_ARRAY_LEN(names));
    MOESIM_ASSERT(n >= c->n_metrics);
    for (size_t m = 0; m < c->n_metrics; m++) {
        MOESIM_ASSERT(!strcmp(names[m], c->metric_names[m])); /* fixed fields, fixed order */
        metrics[m] = values[m];
    }
    /* the policy's own figures: name=value pairs */
    size_t used = 0;
    note[0] = '\0';
    for (size_t m = c->n_metrics; m < n && used < note_len; m++) {
        int w = snprintf(note + used, note_len - used, "%s%s=%.10g", m > c->n_metrics ? ";" : "",
                         names[m], values[m]);
        if (w < 0 || (size_t)w >= note_len - used) break;
        used += (size_t)w;
    }
    return MOESIM_OK;
}

moesim_status sweep_eval_sim_create(const sweep_experiment *e, sweep_evaluator *out,
                                    moesim_error *err) {
    sim_ctx *c = moesim_xcalloc(1, sizeof *c);
    /* the fixed metric columns: a result without policy figures */
    sim_result empty;
    memset(&empty, 0, sizeof empty);
    double scratch[SIM_MAX_METRICS];
    c->n_metrics = sim_result_fields(&empty, c->metric_names, scratch, SIM_MAX_METRICS);
    MOESIM_ASSERT(c->n_metrics > 0 && c->n_metrics < SIM_MAX_METRICS);
    *out = (sweep_evaluator){.name = "sim",
                             .n_metrics = c->n_metrics,
                             .metric_names = c->metric_names,
                             .note_name = "policy_report",
                             .ctx = c,
                             .run = sim_eval_run,
                             .destroy = sim_ctx_destroy};
    moesim_status st = quant_table_load_default(&c->quant, err);
    if (!st) st = load_inputs(c, e, err);
    if (!st) st = check_points(c, e, err);
    if (st) {
        sim_ctx_destroy(c);
        memset(out, 0, sizeof *out);
    }
    return st;
}
