/* `moesim trace stats` end to end: a trace written to disk, the command's JSON has the keys
 * traces/STATS.md names and the same figures as the library; bad command lines exit 2. A stream
 * in small blocks (trace_stats_compute_stream) gives the library's figures bit for bit. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "sim/batch_curves.h"
#include "support/test_support.h"
#include "traces/layer_twins.h"
#include "traces/stats.h"
#include "traces/trace.h"

/* 6 requests x (4 prefill + 12 decode) tokens, 3 layers, 8 experts, top-2, skewed choices */
static trace *make_trace(void) {
    trace_meta meta = {.model = "test", .source = "test", .tool_version = "test", .n_layers = 3,
                       .n_experts = 8, .top_k = 2, .gate_norm = GATE_SOFTMAX_TOPK};
    for (uint32_t l = 0; l < 3; l++) meta.model_layer[l] = l;
    trace *t = trace_create(&meta, 6 * 16);
    rng *r = rng_create(7);
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        t->request_id[i] = (uint32_t)(i / 16);
        t->position[i] = (uint32_t)(i % 16);
        t->phase[i] = i % 16 < 4 ? TRACE_PREFILL : TRACE_DECODE;
        for (uint32_t l = 0; l < 3; l++) {
            size_t at = trace_route_index(t, i, l);
            uint16_t a = (uint16_t)(rng_below(r, 4) * rng_below(r, 3) % 8);
            uint16_t b = (uint16_t)((a + 1 + rng_below(r, 7)) % 8);
            t->expert_ids[at] = a;
            t->expert_ids[at + 1] = b;
            t->gate_weights[at] = 0.7f;
            t->gate_weights[at + 1] = 0.3f;
        }
    }
    rng_destroy(r);
    moesim_error err = {0};
    cr_assert_eq(trace_finish(t, "test trace", &err), MOESIM_OK, "%s", err.msg);
    return t;
}

TestSuite(trace_stats_cli);

Test(trace_stats_cli, json_has_the_issue_keys_and_the_library_figures) {
    trace *t = make_trace();
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("stats.h5"));
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);

    static char out[1 << 20], errbuf[4096];
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "stats", "--json",
                                 path, NULL),
                 0, "%s", errbuf);
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    cr_assert(j, "not JSON: %s", jerr.text);
    static const char *const keys[] = {"tokens", "layers", "experts", "top_k", "lru_hit_rate",
                                       "opt_hit_rate", "active_share_by_batch", "per_layer"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_assert(json_object_get(j, keys[i]), "missing key %s", keys[i]);
    cr_assert_eq(json_integer_value(json_object_get(j, "tokens")), 96);
    cr_assert_eq(json_array_size(json_object_get(j, "per_layer")), 3);

    trace_stats *s = trace_stats_compute(t);
    json_t *lru = json_object_get(j, "lru_hit_rate"), *opt = json_object_get(j, "opt_hit_rate");
    json_t *lru_slot = json_object_get(j, "lru_slot_hit_rate");
    for (uint32_t c = 1; c <= 8; c++) {
        char key[8];
        snprintf(key, sizeof key, "%u", c);
        cr_assert_float_eq(json_number_value(json_object_get(lru_slot, key)),
                           s->lru_slot_hit_rate[c], 1e-15);
        if (c < s->top_k) { /* the simulator refuses a cache smaller than top_k */
            cr_assert_null(json_object_get(lru, key));
            continue;
        }
        cr_assert_float_eq(json_number_value(json_object_get(lru, key)), s->lru_hit_rate[c], 1e-15);
        cr_assert_float_eq(json_number_value(json_object_get(opt, key)), s->opt_hit_rate[c], 1e-15);
    }
    /* 6 requests: B = 1, 2, 4 present, 8 and above absent (null) */
    json_t *share = json_object_get(j, "active_share_by_batch");
    cr_assert_float_eq(json_number_value(json_object_get(share, "1")), 2.0 / 8.0, 1e-15);
    cr_assert(json_is_number(json_object_get(share, "4")));
    cr_assert(json_is_null(json_object_get(share, "8")));
    trace_stats_destroy(s);
    json_decref(j);

    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "stats", path,
                                 NULL),
                 0, "%s", errbuf);
    cr_assert(strstr(out, "96 tokens (24 prefill, 72 decode), 6 requests"), "%s", out);
    trace_destroy(t);
}

Test(trace_stats_cli, batch_adds_the_simulator_step_curves_of_the_library) {
    trace *t = make_trace();
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("stats-batch.h5"));
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    static char out[1 << 20], errbuf[4096];
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "stats", "--json",
                                 "--batch", "2", path, NULL),
                 0, "%s", errbuf);
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    cr_assert(j, "not JSON: %s", jerr.text);
    json_t *b = json_object_get(j, "batched");
    cr_assert(json_is_object(b), "no batched object");
    sim_batch_curves want;
    sim_batch_curves_compute(t, 2, &want);
    cr_assert_eq(json_integer_value(json_object_get(b, "batch")), 2);
    cr_assert_eq(json_integer_value(json_object_get(b, "from")), want.from);
    cr_assert_eq(json_integer_value(json_object_get(b, "steps")), (json_int_t)want.steps);
    json_t *lru = json_object_get(b, "lru_hit_rate"), *opt = json_object_get(b, "opt_hit_rate");
    for (uint32_t c = 1; c <= 8; c++) {
        char key[8];
        snprintf(key, sizeof key, "%u", c);
        if (c < want.from) {
            cr_assert_null(json_object_get(lru, key));
            continue;
        }
        cr_assert_float_eq(json_number_value(json_object_get(lru, key)), want.lru[c], 1e-15);
        cr_assert_float_eq(json_number_value(json_object_get(opt, key)), want.opt[c], 1e-15);
    }
    /* batches of 2 share the step's pool: OPT never below LRU, both reach 1 - cold at E */
    cr_assert_geq(want.opt[want.from], want.lru[want.from]);
    sim_batch_curves_free(&want);
    json_decref(j);
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "stats",
                                 "--batch", "2", path, NULL),
                 0, "%s", errbuf);
    cr_assert(strstr(out, "hit rate at batch 2 ("), "%s", out);
    trace_destroy(t);
}

Test(trace_stats_cli, bad_command_lines_exit_2_with_one_line) {
    static char out[4096], errbuf[4096];
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "stats", NULL), 2);
    cr_assert(strstr(errbuf, "missing FILE"), "%s", errbuf);
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "stats",
                                 "--bogus", "x.h5", NULL),
                 2);
    cr_assert(strstr(errbuf, "unknown option '--bogus'"), "%s", errbuf);
    cr_assert_eq(test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "stats",
                                 "/nonexistent/t.h5", NULL),
                 2);
    cr_assert(strstr(errbuf, "/nonexistent/t.h5"), "%s", errbuf);
    cr_assert_eq(out[0], '\0');
}

/* 100 requests run in batches of 6 (prefills one after another, then decode round robin), 4
 * layers of 16 experts, top-2, look-ahead D = 2 (K' = 3), one row in 40 unrecorded, layer 3 a
 * copy of layer 0: 5 617 tokens, more than one block in memory and many in a stream. */
static trace *make_batched_trace(void) {
    enum { R = 100, L = 4, E = 16, K = 2, D = 2, KP = 3, BATCH = 6 };
    uint32_t prompt[R], gen[R], n = 0;
    for (uint32_t r = 0; r < R; r++) {
        prompt[r] = 2 + r % 5;
        gen[r] = r % 9 == 4 ? 0 : 20 + (r * 7) % 80; /* some requests have no decode token */
        n += prompt[r] + gen[r];
    }
    trace_meta meta = {.model = "test", .source = "test", .tool_version = "test", .n_layers = L,
                       .n_experts = E, .top_k = K, .gate_norm = GATE_SOFTMAX_TOPK,
                       .lookahead_depth = D, .lookahead_k = KP};
    for (uint32_t l = 0; l < L; l++) meta.model_layer[l] = l;
    trace *t = trace_create(&meta, n);
    rng *g = rng_create(11);
    uint64_t i = 0;
    for (uint32_t b = 0; b < R; b += BATCH) {
        uint32_t end = b + BATCH < R ? b + BATCH : R, most = 0;
        for (uint32_t r = b; r < end; r++)
            for (uint32_t p = 0; p < prompt[r]; p++, i++) {
                t->request_id[i] = r;
                t->position[i] = p;
                t->phase[i] = TRACE_PREFILL;
            }
        for (uint32_t r = b; r < end; r++) most = gen[r] > most ? gen[r] : most;
        for (uint32_t s = 0; s < most; s++)
            for (uint32_t r = b; r < end; r++) {
                if (s >= gen[r]) continue;
                t->request_id[i] = r;
                t->position[i] = prompt[r] + s;
                t->phase[i++] = TRACE_DECODE;
            }
    }
    cr_assert_eq(i, n);
    for (i = 0; i < n; i++) {
        for (uint32_t l = 0; l < L; l++) {
            size_t at = trace_route_index(t, i, l);
            if (l == 3) {
                memcpy(t->expert_ids + at, trace_experts(t, i, 0), K * sizeof(uint16_t));
                memcpy(t->gate_weights + at, trace_gates(t, i, 0), K * sizeof(float));
                continue;
            }
            if (rng_below(g, 40) == 0) {
                t->expert_ids[at] = t->expert_ids[at + 1] = TRACE_NO_EXPERT;
                continue;
            }
            uint16_t a = (uint16_t)(rng_below(g, 4) * rng_below(g, 5) % E);
            t->expert_ids[at] = a;
            t->expert_ids[at + 1] = (uint16_t)((a + 1 + rng_below(g, E - 1)) % E);
            t->gate_weights[at] = rng_below(g, 2) ? 0.6f : 0.4f;
            t->gate_weights[at + 1] = 1.0f - t->gate_weights[at];
        }
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t d = 1; d <= D; d++) {
                uint16_t *pred = t->lookahead_ids + trace_lookahead_index(t, i, l, d);
                for (uint32_t c = 0; c < KP; c++) {
                    uint16_t want = l + d < L ? trace_experts(t, i, l + d)[c % K] : 0;
                    pred[c] = l + d >= L ? TRACE_NO_EXPERT
                                         : (uint16_t)((want == TRACE_NO_EXPERT ? c : want) +
                                                      rng_below(g, 2)) % E;
                }
            }
    }
    rng_destroy(g);
    moesim_error err = {0};
    cr_assert_eq(trace_finish(t, "batched test trace", &err), MOESIM_OK, "%s", err.msg);
    return t;
}

static char *stats_dump(const trace_stats *s) {
    json_t *j = trace_stats_to_json(s);
    char *text = json_dumps(j, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(j);
    return text;
}

Test(trace_stats_cli, a_stream_in_small_blocks_gives_the_figures_of_the_trace_in_memory) {
    trace *t = make_batched_trace();
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("batched.h5"));
    moesim_error err = {0};
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_stats *mem = trace_stats_compute(t);
    cr_assert_gt(mem->decode_requests, 64, "more than two windows of 32 requests");
    cr_assert_lt(mem->per_layer[0].accesses, 2 * t->n_tokens, "some rows unrecorded");
    char *want = stats_dump(mem);
    /* next uses in memory, then in a temporary file; blocks of 4096 tokens, then of 300 */
    for (int on_disk = 0; on_disk < 2; on_disk++) {
        if (on_disk) setenv("MOESIM_STATS_NEXT_USE_MEMORY", "0", 1);
        trace_stats *again = trace_stats_compute(t);
        char *got = stats_dump(again);
        cr_assert_str_eq(got, want, "in memory, next uses on disk %d", on_disk);
        free(got);
        trace_stats_destroy(again);
        trace_stream *ts = NULL;
        cr_assert_eq(trace_stream_open(path, &ts, &err), MOESIM_OK, "%s", err.msg);
        trace_stream_set_cache(ts, 300, 2);
        trace_stats *streamed = NULL;
        cr_assert_eq(trace_stats_compute_stream(ts, &streamed, &err), MOESIM_OK, "%s", err.msg);
        got = stats_dump(streamed);
        cr_assert_str_eq(got, want, "streamed, next uses on disk %d", on_disk);
        uint32_t pairs[4][2], listed = 0;
        cr_assert_eq(trace_layer_twins_find_stream(ts, streamed->layer_hash, pairs, 4, &listed), 1);
        cr_assert(listed == 1 && pairs[0][0] == 0 && pairs[0][1] == 3);
        uint32_t own[4][2], listed_own = 0; /* hashes from the twins' own pass: the same pair */
        cr_assert_eq(trace_layer_twins_find_stream(ts, NULL, own, 4, &listed_own), 1);
        cr_assert(listed_own == 1 && own[0][0] == 0 && own[0][1] == 3);
        free(got);
        trace_stats_destroy(streamed);
        trace_stream_close(ts);
    }
    unsetenv("MOESIM_STATS_NEXT_USE_MEMORY");
    free(want);
    trace_stats_destroy(mem);
    trace_destroy(t);
}
