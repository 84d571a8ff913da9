/* The fit of a trace read as a stream (traces/synth_fit.h: synth_fit_stream, what `moesim trace
 * synth --fit` runs) against the fit of the same trace in memory (synth_fit), and the one pass
 * its statistics come from (traces/synth_moments.h: fit_pass) fed block by block. Fast: one fit
 * of a small trace (tests/test_synth_fit.c, label slow, runs the long ones). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "support/test_support.h"
#include "traces/synth_fit.h"
#include "traces/synth_moments.h"
#include "traces/trace.h"

TestSuite(synth_fit_stream);

/* Bits of two doubles equal (NaN included). */
static bool same_bits(double a, double b) { return !memcmp(&a, &b, sizeof a); }

static model_geometry three_layer_mixtral(void) {
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("mixtral-8x7b", &m, &err), MOESIM_OK, "%s", err.msg);
    m.n_layers = m.n_moe_layers = 3;
    return m;
}

/* 12 requests of the 3-layer Mixtral geometry, in decode batches of 4 (requests interleave in
 * the file: the stream's request index is per token), with importance and look-ahead: in memory
 * (*t) and as a stream of the file `name`, in blocks of `block_tokens` tokens, `blocks` cached. */
static trace_stream *small_interleaved_trace(const model_geometry *m, const char *name,
                                             uint64_t block_tokens, uint32_t blocks, trace **t) {
    synth_options o;
    synth_options_default(&o, m);
    o.n_requests = 12;
    o.prompt_len = (synth_range){6, 14};
    o.gen_len = (synth_range){10, 30};
    o.lookahead_depth = 2;
    moesim_error err = {0};
    const char *path = test_tmp_path(name);
    cr_assert_eq(synth_generate_interleaved(m, &o, 4, t, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_write(*t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_stream *ts = NULL;
    cr_assert_eq(trace_stream_open(path, &ts, &err), MOESIM_OK, "%s", err.msg);
    trace_stream_set_cache(ts, block_tokens, blocks);
    return ts;
}

Test(synth_fit_stream, the_streamed_fit_equals_the_fit_in_memory_bit_for_bit) {
    const model_geometry m = three_layer_mixtral();
    trace *t = NULL; /* blocks of 7 tokens: requests cross them */
    trace_stream *ts = small_interleaved_trace(&m, "fit_stream.h5", 7, 2, &t);
    moesim_error err = {0};
    synth_fit_result a, b;
    cr_assert_eq(synth_fit(t, &m, "t", &a, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(synth_fit_stream(ts, &m, "t", &b, &err), MOESIM_OK, "%s", err.msg);
    cr_expect_eq(a.interleave, 4);
    cr_expect_eq(b.interleave, a.interleave);
    cr_expect_eq(b.simulations, a.simulations);
    cr_expect(!memcmp(&a.options.knobs, &b.options.knobs, sizeof a.options.knobs));
    cr_expect_eq(b.options.n_requests, a.options.n_requests);
    cr_expect(!memcmp(&a.options.prompt_len, &b.options.prompt_len, sizeof a.options.prompt_len));
    cr_expect(!memcmp(&a.options.gen_len, &b.options.gen_len, sizeof a.options.gen_len));
    cr_expect_eq(b.options.lookahead_depth, 2);
    const size_t cells =
        (size_t)a.options.knobs.topics * SYNTH_TABLE_PHASES * m.n_moe_layers * m.n_experts;
    cr_expect(!memcmp(a.popularity, b.popularity, cells * sizeof *a.popularity));
    cr_expect(!memcmp(a.layer_knobs, b.layer_knobs,
                      (size_t)SYNTH_LAYER_KNOBS * m.n_moe_layers * sizeof *a.layer_knobs));
    cr_assert_eq(b.n_entries, a.n_entries);
    for (size_t i = 0; i < a.n_entries; i++) {
        const synth_fit_entry *x = &a.entries[i], *y = &b.entries[i];
        cr_expect_str_eq(y->knob, x->knob);
        cr_expect(same_bits(x->value, y->value) && same_bits(x->real, y->real) &&
                      same_bits(x->achieved, y->achieved) && x->fitted == y->fitted,
                  "%s: %g %g %g against %g %g %g", x->knob, y->value, y->real, y->achieved,
                  x->value, x->real, x->achieved);
    }
    synth_fit_result_free(&a);
    synth_fit_result_free(&b);
    trace_stream_close(ts);
    trace_destroy(t);
}

static const trace *stream_row(void *ts, uint64_t token, uint64_t *local) {
    return trace_stream_row(ts, token, local);
}

/* A stream's tokens, block by block, handed to a pass in turn. */
static void pass_over_stream(trace_stream *ts, unsigned what, fit_layer_stats *ls,
                             fit_moments *mo) {
    const trace *tokens = trace_stream_tokens(ts);
    fit_pass *p = fit_pass_create(tokens, trace_stream_requests(ts), stream_row, ts, what);
    for (uint64_t i = 0; i < tokens->n_tokens; i++) {
        uint64_t local;
        const trace *b = trace_stream_row(ts, i, &local);
        fit_pass_token(p, b, local);
    }
    fit_pass_finish(p, ls, mo);
}

Test(synth_fit_stream, the_pass_over_blocks_gives_the_statistics_of_the_trace_in_memory) {
    const model_geometry m = three_layer_mixtral();
    trace *t = NULL; /* one block of 5 tokens cached: every request crosses blocks */
    trace_stream *ts = small_interleaved_trace(&m, "pass_blocks.h5", 5, 1, &t);
    fit_layer_stats la, lb;
    fit_moments ma, mb;
    memset(&la, 0, sizeof la); /* the layers past L and the padding compare equal */
    memset(&lb, 0, sizeof lb);
    memset(&ma, 0, sizeof ma);
    memset(&mb, 0, sizeof mb);
    fit_stats_compute(t, FIT_LAYER_STATS | FIT_MOMENTS_ALL, &la, &ma);
    pass_over_stream(ts, FIT_LAYER_STATS | FIT_MOMENTS_ALL, &lb, &mb);
    cr_expect(!memcmp(&la, &lb, sizeof la));
    cr_expect(!memcmp(&ma, &mb, sizeof ma));
    cr_expect_eq(ma.decode_batch, 4);
    for (uint32_t l = 0; l < m.n_moe_layers; l++) /* every figure measured on this trace */
        cr_expect(!isnan(la.gini[l]) && !isnan(la.reuse_any[l]) && !isnan(ma.shared[1][l]));
    cr_expect(!isnan(ma.request_gini) && !isnan(ma.gate_top1) && !isnan(ma.imp_sigma));
    trace_stream_close(ts);
    trace_destroy(t);
}
