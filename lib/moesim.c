/* libmoesim's public calls (include/moesim.h) over the module libraries: each call loads what it
 * needs, runs it as the CLI command of the same name does, and hands back JSON or a one-line
 * error. Nothing here prints or exits. */
#include "moesim.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/paths.h"
#include "common/precision.h"
#include "common/status.h"
#include "core/provenance.h"
#include "policies/plugin.h"
#include "policies/policy.h"
#include "sim/inputs.h"
#include "sim/sim.h"
#include "sweep/sweep.h"
#include "traces/layer_twins.h"
#include "traces/stats.h"
#include "traces/trace.h"

_Static_assert(MOESIM_LIB_EINPUT == MOESIM_EINPUT && MOESIM_LIB_EIO == MOESIM_EIO &&
                   MOESIM_LIB_ENOMEM == MOESIM_ENOMEM,
               "the public status codes are moesim_status's");

/* The CLI's JSON layout (cli_print_json), so that both parse to the same values. */
#define LIB_JSON_FLAGS (JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))

static char *lib_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Hands `err` to the caller (st != OK) and returns st. */
static int lib_finish(moesim_status st, const moesim_error *err, char **error) {
    if (error) *error = st ? lib_strdup(err->msg[0] ? err->msg : "unknown error") : NULL;
    return (int)st;
}

/* Takes ownership of `j` (may be NULL: out of memory). */
static moesim_status lib_dump(json_t *j, char **out, moesim_error *err) {
    char *s = j ? json_dumps(j, LIB_JSON_FLAGS) : NULL;
    json_decref(j);
    if (!s) return moesim_fail(err, MOESIM_ENOMEM, "out of memory writing JSON");
    if (out)
        *out = s;
    else
        free(s);
    return MOESIM_OK;
}

const char *moesim_version(void) { return MOESIM_VERSION; }

int moesim_abi_version(void) { return MOESIM_ABI_VERSION; }

void moesim_free(void *p) { free(p); }

static json_t *trace_info_json(const trace *t) {
    const trace_meta *m = &t->meta;
    uint64_t prefill = 0;
    for (uint64_t i = 0; i < t->n_tokens; i++) prefill += t->phase[i] == TRACE_PREFILL;
    json_t *j = json_object();
    json_object_set_new(j, "model", json_string(m->model));
    json_object_set_new(j, "tokens", json_integer((json_int_t)t->n_tokens));
    json_object_set_new(j, "prefill_tokens", json_integer((json_int_t)prefill));
    json_object_set_new(j, "decode_tokens", json_integer((json_int_t)(t->n_tokens - prefill)));
    json_object_set_new(j, "requests", json_integer(t->n_requests));
    json_object_set_new(j, "layers", json_integer(m->n_layers));
    json_object_set_new(j, "experts", json_integer(m->n_experts));
    json_object_set_new(j, "top_k", json_integer(m->top_k));
    json_object_set_new(j, "lookahead_depth", json_integer(m->lookahead_depth));
    json_object_set_new(j, "lookahead_k", json_integer(m->lookahead_k));
    json_object_set_new(j, "has_importance", json_boolean(m->has_importance));
    return j;
}

int moesim_trace_open(const char *path, char **info, char **error) {
    moesim_error err = {0};
    trace *t = NULL;
    if (info) *info = NULL;
    moesim_status st = path ? trace_read(path, &t, &err)
                            : moesim_fail(&err, MOESIM_EINPUT, "trace: expected a path");
    if (!st && info) st = lib_dump(trace_info_json(t), info, &err);
    trace_destroy(t);
    return lib_finish(st, &err, error);
}

int moesim_trace_stats(const char *path, char **json, char **error) {
    moesim_error err = {0};
    trace *t = NULL;
    *json = NULL;
    moesim_status st = path ? trace_read(path, &t, &err)
                            : moesim_fail(&err, MOESIM_EINPUT, "trace: expected a path");
    if (!st) {
        trace_stats *s = trace_stats_compute(t);
        json_t *inputs = json_object(); /* as `moesim trace stats --json` */
        json_object_set_new(inputs, "trace", provenance_file_json(path));
        json_object_set_new(inputs, "batch", json_null());
        json_t *j = trace_stats_to_json(s);
        trace_layer_twins_add_json(t, j);
        st = lib_dump(provenance_attach(j, inputs), json, &err);
        trace_stats_destroy(s);
    }
    trace_destroy(t);
    return lib_finish(st, &err, error);
}

int moesim_config_load(const char *kind, const char *name, char **path, char **error) {
    moesim_error err = {0};
    char resolved[4096] = "";
    moesim_status st = MOESIM_OK;
    if (path) *path = NULL;
    if (!kind || (strcmp(kind, "models") && strcmp(kind, "hw") && strcmp(kind, "quant"))) {
        st = moesim_fail(&err, MOESIM_EINPUT, "config kind '%s': expected models, hw or quant",
                         kind ? kind : "(null)");
    } else if (!strcmp(kind, "quant")) {
        quant_table q;
        if (name)
            snprintf(resolved, sizeof resolved, "%s", name);
        else
            st = moesim_data_find("configs/quant.ini", "quantization table", resolved,
                                  sizeof resolved, &err);
        if (!st) st = quant_table_load(resolved, &q, &err);
    } else if (!name) {
        st = moesim_fail(&err, MOESIM_EINPUT, "%s: expected a name or a path", kind);
    } else {
        st = moesim_config_path(kind, name, resolved, sizeof resolved, &err);
        model_geometry m;
        hw_profile h;
        if (!st)
            st = !strcmp(kind, "hw") ? hw_load(resolved, &h, &err) : model_load(resolved, &m, &err);
    }
    if (!st && path && !(*path = lib_strdup(resolved)))
        st = moesim_fail(&err, MOESIM_ENOMEM, "out of memory");
    return lib_finish(st, &err, error);
}

int moesim_sim(const char *trace_path, const char *hw_name, const char *policy_name,
               const char *model_name, const char *policy_lib, const char *const *settings,
               size_t n_settings, char **json, char **error) {
    moesim_error err = {0};
    *json = NULL;
    moesim_status st = MOESIM_OK;
    policy_plugin *plugin = NULL;
    const policy_methods *pm = NULL;
    if (!trace_path || !hw_name || (!policy_name && !policy_lib))
        st = moesim_fail(&err, MOESIM_EINPUT, "sim: trace, hw and policy are required");
    if (!st && policy_lib && !(st = policy_plugin_open(policy_lib, &plugin, &err))) {
        pm = policy_plugin_methods(plugin);
        if (!policy_name) policy_name = pm->name;
        if (strcmp(policy_name, pm->name))
            st = moesim_fail(&err, MOESIM_EINPUT, "policy %s: the plug-in %s provides policy '%s'",
                             policy_name, policy_lib, pm->name);
    }
    config *c = config_create();
    for (size_t i = 0; i < n_settings && !st; i++) st = config_set(c, settings[i], &err);
    trace_stream *ts = NULL;
    hw_profile hw;
    model_geometry model;
    quant_table quant;
    trace_stream_options rows = {0};
    if (!st) rows = sim_stream_options(pm, policy_name, c); /* needs a policy: after the checks */
    if (!st)
        st = sim_inputs_open_stream(trace_path, &rows, hw_name, model_name, &ts, &hw, &model,
                                    &quant, &err);
    if (!st) {
        sim_inputs in = {.trace = trace_stream_tokens(ts),
                         .stream = ts,
                         .model = &model,
                         .hw = &hw,
                         .quant = &quant,
                         .policy = pm};
        sim_result r;
        st = sim_run(&in, policy_name, c, &r, &err);
        const char *named = model_name ? model_name : trace_stream_tokens(ts)->meta.model;
        json_t *inputs = st ? NULL
                            : provenance_inputs_json(trace_stream_tokens(ts), trace_path, named,
                                                     hw_name, policy_name, c);
        if (!st) st = lib_dump(provenance_attach(sim_result_to_json(&r), inputs), json, &err);
    }
    trace_stream_close(ts);
    config_destroy(c);
    policy_plugin_close(plugin);
    return lib_finish(st, &err, error);
}

int moesim_sweep(const char *experiment, const char *csv_path, unsigned jobs, char **summary,
                 char **error) {
    moesim_error err = {0};
    if (summary) *summary = NULL;
    if (!experiment || !csv_path)
        return lib_finish(moesim_fail(&err, MOESIM_EINPUT,
                                      "sweep: experiment and csv_path are "
                                      "required"),
                          &err, error);
    if (jobs > SWEEP_MAX_JOBS)
        return lib_finish(moesim_fail(&err, MOESIM_EINPUT, "sweep: jobs: expected 0..%d, got %u",
                                      SWEEP_MAX_JOBS, jobs),
                          &err, error);
    sweep_experiment *e = NULL;
    sweep_evaluator ev = {0};
    sweep_summary sum = {0};
    moesim_status st = sweep_experiment_load(experiment, &e, &err);
    if (!st) st = sweep_experiment_bind_inputs(e, &err);
    if (!st) st = sweep_evaluator_create(e, &ev, &err);
    if (!st) {
        sweep_options opt = {.csv_path = csv_path,
                             .jobs = jobs ? jobs : 1,
                             .shard_index = 0,
                             .shard_count = 1,
                             .progress = false,
                             .source = experiment};
        st = sweep_run(e, &ev, &opt, &sum, &err);
    }
    if (!st && summary) {
        json_t *j = json_object();
        json_object_set_new(j, "configurations", json_integer((json_int_t)sum.in_shard));
        json_object_set_new(j, "already_done", json_integer((json_int_t)sum.already_done));
        json_object_set_new(j, "ran", json_integer((json_int_t)sum.ran));
        json_object_set_new(j, "failed", json_integer((json_int_t)sum.failed));
        json_object_set_new(j, "first_failure", json_string(sum.first_failure));
        st = lib_dump(j, summary, &err);
    }
    sweep_evaluator_destroy(&ev);
    sweep_experiment_destroy(e);
    return lib_finish(st, &err, error);
}

/* params_json with "model_config" added (traces/FORMAT.md); NULL when `params` is not a JSON
 * object. */
static char *lib_params_with_model(const char *params, const char *model_config) {
    json_t *j = params ? json_loads(params, 0, NULL) : json_object();
    char *out = NULL;
    if (json_is_object(j)) {
        json_object_set_new(j, "model_config", json_string(model_config));
        char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
        out = s ? lib_strdup(s) : NULL; /* trace_destroy frees with free(): not jansson's */
        free(s);
    }
    json_decref(j);
    return out;
}

/* The trace of `d`, checked (trace_finish). */
static moesim_status lib_trace_from_data(const moesim_trace_data *d, trace **out,
                                         moesim_error *err) {
    *out = NULL;
    if (!d->model_config || !d->source || !d->request_id || !d->position || !d->phase ||
        !d->expert_ids || !d->gate_weights ||
        (d->lookahead_depth && (!d->lookahead_ids || !d->lookahead_scores)))
        return moesim_fail(err, MOESIM_EINPUT,
                           "trace data: model_config, source, request_id, position, phase, "
                           "expert_ids and gate_weights are required (and the look-ahead arrays "
                           "with lookahead_depth > 0)");
    model_geometry g;
    moesim_status st = model_load_text("trace data: model_config", d->model_config, &g, err);
    if (st) return st;
    trace_meta meta;
    memset(&meta, 0, sizeof meta);
    trace_meta_from_model(&meta, &g);
    if (strlen(d->source) >= sizeof meta.source)
        return moesim_fail(err, MOESIM_EINPUT, "trace data: source: at most %zu characters",
                           sizeof meta.source - 1);
    snprintf(meta.source, sizeof meta.source, "%s", d->source);
    snprintf(meta.tool_version, sizeof meta.tool_version, "%s", MOESIM_VERSION);
    meta.lookahead_depth = d->lookahead_depth;
    meta.lookahead_k = d->lookahead_depth ? d->lookahead_k : 0;
    meta.has_importance = d->importance != NULL;
    meta.has_token_ids = d->token_id != NULL;
    meta.model_config_hash = d->model_config_hash;
    if ((st = trace_meta_check(&meta, "trace data", err))) return st;
    if (d->n_tokens == 0)
        return moesim_fail(err, MOESIM_EINPUT, "trace data: the trace holds no tokens");
    char *params = lib_params_with_model(d->params_json, d->model_config);
    if (!params)
        return moesim_fail(err, MOESIM_EINPUT, "trace data: params_json: expected a JSON object");
    trace *t = trace_try_create(&meta, d->n_tokens);
    if (!t) {
        free(params);
        return moesim_fail(err, MOESIM_ENOMEM, "trace data: out of memory for %zu tokens",
                           d->n_tokens);
    }
    t->params_json = params;
    size_t n = d->n_tokens, route = n * trace_route_values(&meta);
    memcpy(t->request_id, d->request_id, n * sizeof *t->request_id);
    memcpy(t->position, d->position, n * sizeof *t->position);
    memcpy(t->phase, d->phase, n * sizeof *t->phase);
    if (d->token_id) memcpy(t->token_id, d->token_id, n * sizeof *t->token_id);
    memcpy(t->expert_ids, d->expert_ids, route * sizeof *t->expert_ids);
    memcpy(t->gate_weights, d->gate_weights, route * sizeof *t->gate_weights);
    if (d->importance) memcpy(t->importance, d->importance, n * meta.n_layers * sizeof(float));
    if (meta.lookahead_depth) {
        size_t la = n * trace_lookahead_values(&meta);
        memcpy(t->lookahead_ids, d->lookahead_ids, la * sizeof *t->lookahead_ids);
        memcpy(t->lookahead_scores, d->lookahead_scores, la * sizeof *t->lookahead_scores);
    }
    if ((st = trace_finish(t, "trace data", err))) {
        trace_destroy(t);
        return st;
    }
    *out = t;
    return MOESIM_OK;
}

int moesim_trace_write(const char *path, const moesim_trace_data *data, char **error) {
    moesim_error err = {0};
    trace *t = NULL;
    moesim_status st = path && data ? lib_trace_from_data(data, &t, &err)
                                    : moesim_fail(&err, MOESIM_EINPUT,
                                                  "trace write: expected a path and the data");
    if (!st) st = trace_write(t, path, &err);
    trace_destroy(t);
    return lib_finish(st, &err, error);
}

int moesim_model_shape(const char *model_config, char **json, char **error) {
    moesim_error err = {0};
    model_geometry g;
    if (json) *json = NULL;
    moesim_status st =
        model_config ? model_load_text("model_config", model_config, &g, &err)
                     : moesim_fail(&err, MOESIM_EINPUT, "model shape: expected a model config");
    if (!st && json)
        st = lib_dump(json_pack("{s:s, s:I, s:I, s:I}", "model", g.name, "layers",
                                (json_int_t)g.n_moe_layers, "experts", (json_int_t)g.n_experts,
                                "top_k", (json_int_t)g.top_k),
                      json, &err);
    return lib_finish(st, &err, error);
}
