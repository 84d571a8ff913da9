/* What `moesim record` writes: the generation log of engine_generate turned into a router trace
 * (traces/trace.h). The log already holds every field of the trace contract in execution order;
 * this file only carries it over, with the geometry of the checkpoint as the trace's model. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "engine/engine.h"
#include "traces/trace.h"

moesim_status engine_log_to_trace(const engine *e, const model_geometry *g,
                                  const engine_gen_log *log, const char *params_json, trace **out,
                                  moesim_error *err) {
    const engine_config *c = engine_config_of(e);
    MOESIM_ASSERT(log->n_moe_layers == c->n_moe_layers && log->top_k == c->top_k);
    *out = NULL;
    trace_meta meta;
    memset(&meta, 0, sizeof meta);
    trace_meta_from_model(&meta, g);
    snprintf(meta.source, sizeof meta.source, "engine");
    snprintf(meta.tool_version, sizeof meta.tool_version, "%s", MOESIM_VERSION);
    meta.lookahead_depth = log->lookahead_depth;
    meta.lookahead_k = log->lookahead_k;
    meta.has_importance = true;
    meta.has_token_ids = true;
    meta.model_config_hash = c->config_hash;
    moesim_status st = trace_meta_check(&meta, "recorded trace", err);
    if (st) return st;
    trace *t = trace_create(&meta, log->n_tokens);
    size_t n = log->n_tokens;
    memcpy(t->request_id, log->request_id, n * sizeof *t->request_id);
    memcpy(t->position, log->position, n * sizeof *t->position);
    memcpy(t->phase, log->phase, n * sizeof *t->phase);
    memcpy(t->token_id, log->token_id, n * sizeof *t->token_id);
    memcpy(t->expert_ids, log->expert_ids, n * trace_route_values(&meta) * sizeof *t->expert_ids);
    memcpy(t->gate_weights, log->gate_weights,
           n * trace_route_values(&meta) * sizeof *t->gate_weights);
    memcpy(t->importance, log->importance, n * meta.n_layers * sizeof *t->importance);
    if (meta.lookahead_depth) {
        size_t la = n * trace_lookahead_values(&meta);
        memcpy(t->lookahead_ids, log->lookahead_ids, la * sizeof *t->lookahead_ids);
        memcpy(t->lookahead_scores, log->lookahead_scores, la * sizeof *t->lookahead_scores);
    }
    if (params_json) t->params_json = moesim_xstrdup(params_json);
    if ((st = trace_finish(t, "recorded trace", err))) {
        trace_destroy(t);
        return st;
    }
    *out = t;
    return MOESIM_OK;
}
