/* The synthesizer's per-layer locality knobs and anti-locality (traces/synth.h: reuse_top1 < 0,
 * synth_options.layer_knobs), the fit's fast per-layer statistics against trace_stats
 * (traces/synth_moments.h), and the [layers] section of knob files. Fast: no fit runs here
 * (tests/test_synth_fit.c, label slow, runs them). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model.h"
#include "support/test_support.h"
#include "traces/stats.h"
#include "traces/synth.h"
#include "traces/synth_fit.h"
#include "traces/synth_moments.h"
#include "traces/trace.h"

TestSuite(synth_locality);

#define STATS_AGREE 1e-12 /* the fast statistics count the same things: equal up to rounding */

static model_geometry anti_local_model(void) {
    model_geometry m;
    moesim_error err = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/anti-local/model.ini", MOESIM_SOURCE_DIR);
    cr_assert_eq(model_load_by_name(path, &m, &err), MOESIM_OK, "%s", err.msg);
    return m;
}

static trace *generate(const model_geometry *m, double top1, const double *layer_knobs) {
    synth_options o;
    synth_options_default(&o, m);
    o.n_requests = 16;
    o.prompt_len = (synth_range){1, 1};
    o.gen_len = (synth_range){63, 63};
    o.lookahead_depth = 0;
    o.knobs.reuse_top1_first = o.knobs.reuse_top1_mid = o.knobs.reuse_top1_last = top1;
    o.layer_knobs = layer_knobs;
    trace *t = NULL;
    moesim_error err = {0};
    cr_assert_eq(synth_generate(m, &o, &t, &err), MOESIM_OK, "%s", err.msg);
    return t;
}

Test(synth_locality, a_negative_reuse_top1_makes_consecutive_top1s_agree_less_than_drawing_does) {
    model_geometry m = anti_local_model();
    trace *drawn = generate(&m, 0, NULL), *repelled = generate(&m, -1, NULL);
    trace_stats *a = trace_stats_compute(drawn), *b = trace_stats_compute(repelled);
    /* the popularity draw alone repeats the top-1 by chance (skewed popularity: often) */
    cr_assert_gt(a->reuse_top1, 0.02, "drawn: %g", a->reuse_top1);
    cr_assert_lt(b->reuse_top1, a->reuse_top1 / 4, "repelled %g, drawn %g", b->reuse_top1,
                 a->reuse_top1);
    trace_stats_destroy(a);
    trace_stats_destroy(b);
    trace_destroy(drawn);
    trace_destroy(repelled);
}

Test(synth_locality, a_negative_reuse_history_spreads_a_layer_s_experts_further_apart_in_time) {
    model_geometry m = anti_local_model();
    const uint32_t L = m.n_moe_layers, k = m.top_k, layer = 2;
    double *lk = malloc((size_t)SYNTH_LAYER_KNOBS * L * sizeof *lk);
    for (size_t i = 0; i < (size_t)SYNTH_LAYER_KNOBS * L; i++) lk[i] = NAN; /* profiles */
    trace *drawn = generate(&m, 0, lk);
    lk[(size_t)SYNTH_LK_REUSE_HISTORY * L + layer] = -1; /* avoid the tokens 2..5 back */
    lk[(size_t)SYNTH_LK_HISTORY_TOKENS * L + layer] = 4;
    trace *spread = generate(&m, 0, lk);
    trace_stats *a = trace_stats_compute(drawn), *b = trace_stats_compute(spread);
    /* a cache of 2k..3k experts holds the last few rows: they are avoided, so it hits less */
    for (uint32_t c = 2 * k; c <= 3 * k; c++)
        cr_assert_lt(b->per_layer[layer].lru_hit_rate[c],
                     a->per_layer[layer].lru_hit_rate[c] - 0.05,
                     "capacity %u: %g avoiding, %g drawn", c, b->per_layer[layer].lru_hit_rate[c],
                     a->per_layer[layer].lru_hit_rate[c]);
    trace_stats_destroy(a);
    trace_stats_destroy(b);
    trace_destroy(drawn);
    trace_destroy(spread);
    free(lk);
}

Test(synth_locality, per_layer_knob_values_replace_the_profile_at_their_layer_only) {
    model_geometry m = anti_local_model();
    const uint32_t L = m.n_moe_layers;
    double *lk = malloc((size_t)SYNTH_LAYER_KNOBS * L * sizeof *lk);
    for (size_t i = 0; i < (size_t)SYNTH_LAYER_KNOBS * L; i++) lk[i] = NAN; /* profiles */
    lk[(size_t)SYNTH_LK_REUSE_TOP1 * L + 3] = 0.9; /* layer 3 copies its predecessor's top-1 */
    trace *t = generate(&m, 0, lk);
    trace_stats *s = trace_stats_compute(t);
    for (uint32_t l = 0; l < L; l++)
        if (l == 3)
            cr_assert_gt(s->per_layer[l].reuse_top1, 0.85, "layer 3: %g",
                         s->per_layer[l].reuse_top1);
        else
            cr_assert_lt(s->per_layer[l].reuse_top1, 0.5, "layer %u: %g", l,
                         s->per_layer[l].reuse_top1);
    trace_stats_destroy(s);
    trace_destroy(t);
    free(lk);
}

static void assert_fast_stats_agree(const trace *t) {
    trace_stats *s = trace_stats_compute(t);
    fit_layer_stats f;
    fit_stats_compute(t, FIT_LAYER_STATS, &f, NULL);
    const uint32_t k = t->meta.top_k, E = t->meta.n_experts;
    for (uint32_t l = 0; l < t->meta.n_layers; l++) {
        const layer_stats *x = &s->per_layer[l];
        double lru = 0;
        for (uint32_t c = k; c < E; c++) lru += x->lru_hit_rate[c];
        lru /= E - k;
        cr_assert_float_eq(f.gini[l], x->gini, STATS_AGREE, "layer %u gini", l);
        cr_assert_float_eq(f.reuse_top1[l], x->reuse_top1, STATS_AGREE, "layer %u top-1", l);
        cr_assert_float_eq(f.reuse_any[l], x->reuse_any, STATS_AGREE, "layer %u any", l);
        cr_assert_float_eq(f.lru_mean[l], lru, STATS_AGREE, "layer %u LRU", l);
    }
    trace_stats_destroy(s);
}

Test(synth_locality, the_fits_fast_statistics_equal_trace_stats_per_layer) {
    model_geometry m = anti_local_model();
    trace *t = generate(&m, -0.5, NULL);
    assert_fast_stats_agree(t); /* 64 experts: one mask word */
    trace_destroy(t);
    char path[4096];
    snprintf(path, sizeof path,
             "%s/tests/fixtures/mixtral-humaneval/mixtral-8x7b-humaneval-vllm.h5",
             MOESIM_SOURCE_DIR);
    trace *real = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_read(path, &real, &err), MOESIM_OK, "%s", err.msg);
    assert_fast_stats_agree(real); /* a real log, with unrecorded rows */
    trace_destroy(real);
    model_geometry q;
    cr_assert_eq(model_load_by_name("qwen3-30b-a3b", &q, &err), MOESIM_OK, "%s", err.msg);
    synth_options o;
    synth_options_default(&o, &q);
    o.n_requests = 3;
    o.prompt_len = (synth_range){20, 20};
    o.gen_len = (synth_range){20, 20};
    o.lookahead_depth = 0;
    cr_assert_eq(synth_generate(&q, &o, &t, &err), MOESIM_OK, "%s", err.msg);
    assert_fast_stats_agree(t); /* 128 experts: two mask words */
    trace_destroy(t);
}

Test(synth_locality, a_knob_files_layers_section_loads_and_a_bad_line_is_one_error) {
    model_geometry m = anti_local_model();
    const uint32_t L = m.n_moe_layers;
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("layers.ini"));
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    fprintf(fp, "[synth]\nreuse_history_tokens = 16\n[layers]\n");
    for (int k = 0; k < SYNTH_LAYER_KNOBS; k++)
        for (uint32_t l = 0; l < L; l++)
            fprintf(fp, "%s.l%u = %g\n", synth_layer_knob_names[k], l,
                    k == SYNTH_LK_HISTORY_TOKENS ? 4.0
                    : k == SYNTH_LK_REUSE_TOP1   ? -0.25
                                                 : 0.125);
    fclose(fp);
    synth_options o;
    synth_options_default(&o, &m);
    float *table = NULL;
    double *layers = NULL;
    uint32_t interleave = 1;
    moesim_error err = {0};
    cr_assert_eq(synth_knobs_load(path, &m, &o, &table, &layers, &interleave, &err), MOESIM_OK,
                 "%s", err.msg);
    cr_assert_eq(o.layer_knobs, layers);
    cr_assert_float_eq(synth_layer_knob_value(&o, SYNTH_LK_REUSE_TOP1, L - 1, L), -0.25, 0);
    cr_assert_float_eq(synth_layer_knob_value(&o, SYNTH_LK_HISTORY_TOKENS, 0, L), 4, 0);
    free(layers);
    layers = NULL;

    test_write_file(path, "[layers]\nreuse_top1.l0 = -2\n");
    synth_options_default(&o, &m);
    cr_assert_eq(synth_knobs_load(path, &m, &o, &table, &layers, &interleave, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "[layers] reuse_top1.l0: expected a number in [-1, 1], got '-2'"),
              "%s", err.msg);
    test_write_file(path, "[layers]\nreuse_top1.l99 = 0\n");
    cr_assert_eq(synth_knobs_load(path, &m, &o, &table, &layers, &interleave, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "L < 8 MoE layers"), "%s", err.msg);
    test_write_file(path, "[layers]\nreuse_top1.l0 = 0\n");
    cr_assert_eq(synth_knobs_load(path, &m, &o, &table, &layers, &interleave, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "missing"), "%s", err.msg);
    cr_assert_null(layers);
    free(table);
}
