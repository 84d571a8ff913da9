/* Execution order of batched runs (traces/synth_fit.h: synth_fit_detect_interleave,
 * synth_interleave, synth_generate_interleaved): a trace's requests interleaved in decode
 * batches, as the engine and serving logs record them, and the batch a trace was run in. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/synth_fit.h"
#include "traces/synth_moments.h"

uint32_t synth_fit_detect_interleave(const trace *t) {
    fit_moments mo;
    fit_stats_compute(t, 0, NULL, &mo);
    return mo.decode_batch;
}

/* A one-token view of token `tok` of `t` (for trace_copy_tokens). */
static trace token_view(const trace *t, uint64_t tok) {
    trace v = *t;
    const size_t route = trace_route_values(&t->meta), look = trace_lookahead_values(&t->meta);
    v.n_tokens = 1;
    v.request_id += tok, v.position += tok, v.phase += tok;
    if (v.token_id) v.token_id += tok;
    v.expert_ids += tok * route, v.gate_weights += tok * route;
    if (v.importance) v.importance += tok * t->meta.n_layers;
    if (look) v.lookahead_ids += tok * look, v.lookahead_scores += tok * look;
    return v;
}

trace *synth_interleave(const trace *t, uint32_t batch) {
    const uint32_t R = t->n_requests;
    uint64_t *first = moesim_xcalloc(R, sizeof *first), *n = moesim_xcalloc(R, sizeof *n);
    uint64_t *prompt = moesim_xcalloc(R, sizeof *prompt);
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        const uint32_t r = t->request_id[i];
        MOESIM_ASSERT(i == 0 || r >= t->request_id[i - 1]); /* requests one after another */
        if (n[r]++ == 0) first[r] = i;
        prompt[r] += t->phase[i] != TRACE_DECODE;
    }
    trace *out = trace_create(&t->meta, t->n_tokens);
    out->n_requests = R;
    out->params_json = t->params_json ? moesim_xstrdup(t->params_json) : NULL;
    uint64_t at = 0;
    for (uint32_t g0 = 0; g0 < R; g0 += batch) {
        const uint32_t g1 = R - g0 < batch ? R : g0 + batch;
        for (uint32_t r = g0; r < g1; r++)
            for (uint64_t i = 0; i < prompt[r]; i++) {
                const trace v = token_view(t, first[r] + i);
                trace_copy_tokens(out, at++, &v);
            }
        for (uint64_t it = 0;; it++) {
            bool any = false;
            for (uint32_t r = g0; r < g1; r++)
                if (prompt[r] + it < n[r]) {
                    const trace v = token_view(t, first[r] + prompt[r] + it);
                    trace_copy_tokens(out, at++, &v);
                    any = true;
                }
            if (!any) break;
        }
    }
    MOESIM_ASSERT(at == t->n_tokens);
    free(prompt);
    free(n);
    free(first);
    return out;
}

moesim_status synth_generate_interleaved(const model_geometry *m, const synth_options *o,
                                         uint32_t interleave, trace **out, moesim_error *err) {
    trace *t = NULL;
    moesim_status st = synth_generate(m, o, &t, err);
    if (st || interleave <= 1) {
        *out = t;
        return st;
    }
    *out = synth_interleave(t, interleave);
    trace_destroy(t);
    return MOESIM_OK;
}
