/* The oracle's future (core/future.h): the streamed next-use index (the simulator's, built from
 * the requests through a temporary file) answers every query as the in-memory one (the replay's)
 * and as a scan of the accesses does, and both give each step's active experts, on a trace with
 * unrecorded rows and at several batch sizes; its rows from the trace in memory or from a
 * trace_stream, whose expert ids its pass then reads alone. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "common/model.h"
#include "core/future.h"
#include "core/schedule.h"
#include "support/test_support.h"
#include "traces/synth.h"
#include "traces/trace.h"

static const trace *whole_trace_rows(void *ctx, uint64_t token, uint64_t *local) {
    *local = token;
    return ctx;
}

static const trace *stream_rows(void *ctx, uint64_t token, uint64_t *local) {
    return trace_stream_row(ctx, token, local);
}

/* A few requests of mixed prompt and decode lengths; some rows unrecorded. */
static trace *mixed_trace(model_geometry *m) {
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name("olmoe-1b-7b", m, &err), MOESIM_OK, "%s", err.msg);
    synth_options o;
    synth_options_default(&o, m);
    o.n_requests = 5;
    o.prompt_len = (synth_range){1, 12};
    o.gen_len = (synth_range){0, 9};
    o.seed = 7;
    trace *t = NULL;
    cr_assert_eq(synth_generate(m, &o, &t, &err), MOESIM_OK, "%s", err.msg);
    for (uint64_t tok = 0; tok < t->n_tokens; tok += 5) /* every fifth token, one layer */
        for (uint32_t k = 0; k < t->meta.top_k; k++) {
            size_t at = trace_route_index(t, tok, (uint32_t)(tok % t->meta.n_layers)) + k;
            t->expert_ids[at] = TRACE_NO_EXPERT;
            t->gate_weights[at] = 0.0f;
        }
    return t;
}

/* (layer, expert) of every access in execution order; returns the count. */
static size_t accesses(const trace *t, const sim_schedule *s, uint32_t *le) {
    size_t n = 0;
    for (uint64_t st = 0; st < s->n_steps; st++)
        for (uint32_t l = 0; l < t->meta.n_layers; l++)
            for (uint32_t i = 0; i < s->steps[st].n_tokens; i++) {
                const uint16_t *ex = trace_experts(t, s->tokens[s->steps[st].first + i], l);
                for (uint32_t k = 0; k < t->meta.top_k; k++)
                    if (ex[k] != TRACE_NO_EXPERT) le[n++] = l * t->meta.n_experts + ex[k];
            }
    return n;
}

/* The next-use stream of `t` with rows from `rows` (and, when ids is not NULL, the pass's expert
 * ids from that stream) against the index and a scan, at batch 1 and 4. */
static void expect_stream_answers_as_the_index_and_a_scan(const trace *t, sim_future_rows rows,
                                                          void *ctx, trace_stream *ids) {
    const uint32_t L = t->meta.n_layers, E = t->meta.n_experts, K = t->meta.top_k;
    trace_request_index rq;
    trace_request_index_build(&rq, t);
    uint32_t *le = malloc(t->n_tokens * L * K * sizeof *le);
    uint64_t *want = malloc((size_t)L * E * sizeof *want);
    for (uint32_t batch = 1; batch <= 4; batch += 3) {
        sim_schedule s;
        sim_schedule_build(&s, t, batch, 0, 0);
        size_t n_acc = accesses(t, &s, le);
        sim_future index, stream;
        sim_future_init(&index, t, &s);
        sim_future_init_requests(&stream, &t->meta, &rq, batch, s.max_step_tokens, rows, ctx);
        sim_future_set_ids_stream(&stream, ids);
        uint64_t pos = 0;
        for (uint64_t st = 0; st < s.n_steps; st++)
            for (uint32_t l = 0; l < L; l++) {
                /* the route of (st, l) starts at pos: every expert's next use from there, by a
                 * scan back from the last access */
                for (uint32_t q = 0; q < L * E; q++) want[q] = UINT64_MAX;
                for (size_t i = n_acc; i-- > pos;) want[le[i]] = i - pos;
                for (uint32_t q = 0; q < L * E; q++) {
                    cr_assert_eq(sim_future_next_use(&index, q / E, q % E, pos), want[q]);
                    cr_assert_eq(sim_future_next_use(&stream, q / E, q % E, pos), want[q],
                                 "batch %u step %llu layer %u: le %u", batch,
                                 (unsigned long long)st, l, q);
                }
                /* the route's experts, distinct and ascending: those of its accesses */
                bool routed[MODEL_MAX_EXPERTS] = {false};
                size_t end = pos;
                for (uint32_t i = 0; i < s.steps[st].n_tokens; i++) {
                    const uint16_t *ex = trace_experts(t, s.tokens[s.steps[st].first + i], l);
                    for (uint32_t k = 0; k < K; k++)
                        if (ex[k] != TRACE_NO_EXPERT) routed[ex[k]] = true, end++;
                }
                uint16_t a[MODEL_MAX_EXPERTS], b[MODEL_MAX_EXPERTS];
                uint32_t na = sim_future_active(&index, st, l, a, E);
                uint32_t nb = sim_future_active(&stream, st, l, b, E);
                uint32_t n_routed = 0;
                for (uint32_t e = 0; e < E; e++) n_routed += routed[e];
                cr_assert_eq(na, n_routed);
                cr_assert_eq(nb, n_routed);
                for (uint32_t i = 0; i < na; i++) {
                    cr_assert_eq(a[i], b[i]);
                    cr_assert(routed[a[i]] && (i == 0 || a[i - 1] < a[i]));
                }
                pos = end;
            }
        cr_assert_eq(pos, n_acc);
        cr_assert_eq(sim_future_active(&stream, s.n_steps, 0, (uint16_t[1]){0}, 1), 0);
        sim_future_free(&index);
        sim_future_free(&stream);
        sim_schedule_free(&s);
    }
    free(le);
    free(want);
    trace_request_index_free(&rq);
}

Test(future, the_stream_answers_as_the_index_and_a_scan) {
    model_geometry m;
    trace *t = mixed_trace(&m);
    expect_stream_answers_as_the_index_and_a_scan(t, whole_trace_rows, t, NULL);
    trace_destroy(t);
}

Test(future, the_stream_over_a_trace_stream_reading_its_ids_alone_answers_as_the_index) {
    model_geometry m;
    trace *t = mixed_trace(&m);
    const char *path = test_tmp_path("future-stream.h5");
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_stream *ts = NULL;
    trace_stream_options on_read = {.skip_lookahead = true, .check_rows_on_read = true};
    cr_assert_eq(trace_stream_open_with(path, &on_read, &ts, &err), MOESIM_OK, "%s", err.msg);
    /* blocks of 7 tokens, so that steps' runs of tokens span them; the ids read alone, then
     * (every block cached) the rows read whole */
    const uint32_t slots[2] = {3, 64};
    for (int i = 0; i < 2; i++) {
        trace_stream_set_cache(ts, 7, slots[i]);
        cr_assert_eq(trace_stream_caches_every_block(ts), i == 1);
        expect_stream_answers_as_the_index_and_a_scan(t, stream_rows, ts, ts);
    }
    cr_assert_eq(trace_stream_check_rest(ts, &err), MOESIM_OK, "%s", err.msg);
    trace_stream_close(ts);
    trace_destroy(t);
}
