/* Sweeps (sweep/sweep.h): experiment files (cross product, ranges, bundles, exclusions, the drop
 * of other policies' knobs, errors), stable configuration hashes, and `moesim sweep` end to end
 * over real traces: a sweep killed with SIGKILL at random points and resumed gives the rows of
 * an uninterrupted run; shards merged give the unsharded file; merge refuses duplicates and
 * reports gaps. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/model.h"
#include "common/progress.h"
#include "common/rng.h"
#include "support/test_support.h"
#include "sweep/sweep.h"
#include "sweep/sweep_internal.h"
#include "sweep/validate.h"
#include "traces/stats.h"
#include "traces/trace.h"

TestSuite(sweep);

/* ---- helpers ------------------------------------------------------------------------------ */

static sweep_experiment *load_text(const char *name, const char *text) {
    const char *path = test_tmp_path(name);
    test_write_file(path, text);
    sweep_experiment *e = NULL;
    moesim_error err = {0};
    cr_assert_eq(sweep_experiment_load(path, &e, &err), MOESIM_OK, "%s", err.msg);
    return e;
}

static moesim_status load_error(const char *text, moesim_error *err) {
    const char *path = test_tmp_path("bad.ini");
    test_write_file(path, text);
    sweep_experiment *e = NULL;
    moesim_status st = sweep_experiment_load(path, &e, err);
    sweep_experiment_destroy(e);
    return st;
}

static char *read_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "cannot read %s", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
    buf[n] = '\0';
    fclose(fp);
    return buf;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The header, then the rows sorted: a results file with row order set aside. */
static char *canonical_rows(const char *path, size_t *n_rows) {
    char *text = read_file(path);
    size_t n = 0, cap = 64;
    char **lines = malloc(cap * sizeof *lines);
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (n == cap) lines = realloc(lines, (cap *= 2) * sizeof *lines);
        lines[n++] = l;
    }
    cr_assert(n >= 1, "%s: empty", path);
    qsort(lines + 1, n - 1, sizeof *lines, cmp_str);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += strlen(lines[i]) + 1;
    char *out = malloc(total + 1);
    out[0] = '\0';
    char *w = out;
    for (size_t i = 0; i < n; i++) w += sprintf(w, "%s\n", lines[i]);
    free(lines);
    free(text);
    if (n_rows) *n_rows = n - 1;
    return out;
}

static size_t count_lines(const char *path) {
    if (!test_file_exists(path)) return 0;
    char *t = read_file(path);
    size_t n = 0;
    for (char *p = t; *p; p++) n += *p == '\n';
    free(t);
    return n;
}

/* A trace with the geometry of configs/models/<model>.ini: `requests` requests of `prompt`
 * prefill and `gen` decode tokens, skewed random routing (a few hot experts per layer). */
static void write_model_trace(const char *model_name, const char *path, uint32_t requests,
                              uint32_t prompt, uint32_t gen, uint64_t seed) {
    model_geometry m;
    moesim_error err = {0};
    cr_assert_eq(model_load_by_name(model_name, &m, &err), MOESIM_OK, "%s", err.msg);
    trace_meta meta = {.source = "test", .tool_version = "test"};
    trace_meta_from_model(&meta, &m);
    uint32_t per = prompt + gen, L = meta.n_layers, E = meta.n_experts, k = meta.top_k;
    trace *t = trace_create(&meta, (uint64_t)requests * per);
    rng *r = rng_create(seed);
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        t->request_id[i] = (uint32_t)(i / per);
        t->position[i] = (uint32_t)(i % per);
        t->phase[i] = i % per < prompt ? TRACE_PREFILL : TRACE_DECODE;
        for (uint32_t l = 0; l < L; l++) {
            uint16_t *ids = t->expert_ids + trace_route_index(t, i, l);
            float *g = t->gate_weights + trace_route_index(t, i, l);
            for (uint32_t s = 0; s < k; s++) {
                uint16_t id;
                bool fresh;
                do { /* half the picks from the layer's 2k hottest experts */
                    id = (uint16_t)(rng_uniform(r) < 0.5 ? (l * 7 + rng_below(r, 2 * k)) % E
                                                         : rng_below(r, E));
                    fresh = true;
                    for (uint32_t q = 0; q < s; q++) fresh &= ids[q] != id;
                } while (!fresh);
                ids[s] = id;
                g[s] = 1.0f / (float)k;
            }
        }
    }
    rng_destroy(r);
    cr_assert_eq(trace_finish(t, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(trace_write(t, path, &err), MOESIM_OK, "%s", err.msg);
    trace_destroy(t);
}

/* ---- experiment files --------------------------------------------------------------------- */

Test(sweep, cross_product_runs_every_combination_minus_exclusions) {
    sweep_experiment *e =
        load_text("cross.ini", "[experiment]\nname = cross\nevaluator = trace-stats\n"
                               "[fixed]\ntrace = t.h5\n"
                               "[axes]\nstats.capacity = 1, 2, 3\nmodel = a, b\n"
                               "[exclude]\nstats.capacity=2, model=b\nstats.capacity=3\n");
    cr_assert_eq(sweep_experiment_cross_size(e), 6);
    cr_assert_eq(sweep_experiment_excluded(e), 3);
    cr_assert_eq(sweep_experiment_count(e), 3);
    /* first axis slowest: (1,a) (1,b) (2,a) */
    static const char *const want[][2] = {{"1", "a"}, {"1", "b"}, {"2", "a"}};
    for (size_t i = 0; i < 3; i++) {
        const sweep_point *p = sweep_experiment_point(e, i);
        cr_assert_eq(p->index, i);
        cr_assert_str_eq(sweep_point_get(e, p, "stats.capacity"), want[i][0]);
        cr_assert_str_eq(sweep_point_get(e, p, "model"), want[i][1]);
        cr_assert_str_eq(sweep_point_get(e, p, "trace"), "t.h5");
    }
    sweep_experiment_destroy(e);
}

Test(sweep, ranges_expand_inclusively_keeping_the_written_decimals) {
    sweep_experiment *e = load_text("range.ini", "[fixed]\nmodel = m\nhw = h\ntrace = t\n"
                                                 "[axes]\npolicy = lru, dymoe\n"
                                                 "dymoe.retention = 0.5:1.0:0.1\n"
                                                 "cache.experts_per_layer = 128:896:128\n");
    cr_assert_eq(sweep_experiment_cross_size(e), 2 * 6 * 7);
    cr_assert_eq(sweep_experiment_count(e), 7 + 6 * 7, "lru drops dymoe.*: retentions collapse");
    cr_assert_eq(sweep_experiment_duplicates(e), 35);
    cr_assert_str_eq(sweep_point_get(e, sweep_experiment_point(e, 6), "cache.experts_per_layer"),
                     "896");
    cr_assert_null(sweep_point_get(e, sweep_experiment_point(e, 0), "dymoe.retention"));
    sweep_experiment_destroy(e);
    e = load_text("range2.ini", "[fixed]\npolicy = dymoe\nmodel = m\nhw = h\ntrace = t\n"
                                "[axes]\ndymoe.retention = 0.5:1.0:0.1\n");
    static const char *const want[] = {"0.5", "0.6", "0.7", "0.8", "0.9", "1.0"};
    cr_assert_eq(sweep_experiment_count(e), 6);
    for (size_t i = 0; i < 6; i++)
        cr_assert_str_eq(sweep_point_get(e, sweep_experiment_point(e, i), "dymoe.retention"),
                         want[i]);
    sweep_experiment_destroy(e);
}

/* Found while setting the hang limit of tests/fuzz/fuzz_experiment.c: the values of an axis
 * were checked for repeats pair by pair (16 s of CPU for this range in a release build), and
 * values and configurations grew one element at a time (quadratic copying: minutes under ASan).
 * Well under a second now. */
Test(sweep, a_range_of_the_largest_size_crossed_with_two_policies_loads_within_seconds,
     .timeout = 10) {
    sweep_experiment *e = load_text("largest-range.ini", "[fixed]\nmodel = m\nhw = h\ntrace = t\n"
                                                         "[axes]\npolicy = lru, fifo\n"
                                                         "batch.size = 1:100000:1\n");
    cr_assert_eq(sweep_experiment_count(e), 200000);
    const sweep_point *last = sweep_experiment_point(e, 199999);
    cr_assert_str_eq(sweep_point_get(e, last, "policy"), "fifo");
    cr_assert_str_eq(sweep_point_get(e, last, "batch.size"), "100000");
    cr_assert_eq(sweep_experiment_find(e, last->hash), last);
    sweep_experiment_destroy(e);
}

Test(sweep, ranges_at_the_ends_of_the_integers_and_in_exponent_notation_expand_exactly,
     .timeout = 20) {
    /* start = stop = LLONG_MAX: one value (a naive v += step loop overflows and never ends) */
    sweep_experiment *e = load_text("rmax.ini", "[fixed]\npolicy = lru\nmodel = m\nhw = h\n"
                                                "trace = t\n[axes]\nsim.seed = "
                                                "9223372036854775807:9223372036854775807:1\n"
                                                "label.x = -9223372036854775808:"
                                                "-9223372036854775807:5\n");
    cr_assert_eq(sweep_experiment_count(e), 1);
    const sweep_point *p = sweep_experiment_point(e, 0);
    cr_assert_str_eq(sweep_point_get(e, p, "sim.seed"), "9223372036854775807");
    cr_assert_str_eq(sweep_point_get(e, p, "label.x"), "-9223372036854775808");
    sweep_experiment_destroy(e);
    e = load_text("rexp.ini", "[fixed]\npolicy = dymoe\nmodel = m\nhw = h\ntrace = t\n"
                              "[axes]\ndymoe.lambda = 0:0.003:1e-3\nlabel.y = 1e2:3e2:1e2\n"
                              "label.z = 0.1:0.125:2.5e-2\n");
    static const char *const want[] = {"0.000", "0.001", "0.002", "0.003"};
    cr_assert_eq(sweep_experiment_count(e), 4 * 3 * 2);
    for (size_t i = 0; i < 4; i++)
        cr_assert_str_eq(sweep_point_get(e, sweep_experiment_point(e, 6 * i), "dymoe.lambda"),
                         want[i]);
    cr_assert_str_eq(sweep_point_get(e, sweep_experiment_point(e, 2), "label.y"), "200");
    cr_assert_str_eq(sweep_point_get(e, sweep_experiment_point(e, 1), "label.z"), "0.125");
    sweep_experiment_destroy(e);
}

Test(sweep, other_policies_knobs_are_dropped_and_duplicates_merged) {
    sweep_experiment *e =
        load_text("drop.ini", "[fixed]\nmodel = m\nhw = h\ntrace = t\n"
                              "[axes]\npolicy = lru, dymoe\ndymoe.lambda = 1, 2, 3\n"
                              "memory.budget_gb = 16, 24\n");
    /* lru: 2 budgets; dymoe: 3 lambdas x 2 budgets */
    cr_assert_eq(sweep_experiment_count(e), 2 + 6);
    cr_assert_eq(sweep_experiment_duplicates(e), 4);
    const sweep_point *p0 = sweep_experiment_point(e, 0);
    cr_assert_str_eq(sweep_point_get(e, p0, "policy"), "lru");
    cr_assert_null(sweep_point_get(e, p0, "dymoe.lambda"));
    cr_assert_str_eq(sweep_point_get(e, p0, "memory.budget_gb"), "16");
    sweep_experiment_destroy(e);
}

Test(sweep, bundle_axes_set_several_keys_and_exclusions_match_their_labels) {
    sweep_experiment *e =
        load_text("bundle.ini", "[fixed]\nmodel = m\nhw = h\ntrace = t\npolicy = dymoe\n"
                                "[axis variant]\n"
                                "4/4 = dymoe.hi=bf16, dymoe.lo=bf16\n"
                                "4/2 = dymoe.hi=bf16, dymoe.lo=int4\n"
                                "LRU = policy=lru\n"
                                "[axes]\nmemory.budget_gb = 16, 24\n"
                                "[exclude]\nvariant=4/2, memory.budget_gb!=16\n");
    cr_assert_eq(sweep_experiment_count(e), 5);
    cr_assert_eq(sweep_experiment_excluded(e), 1);
    cr_assert_str_eq(sweep_experiment_column(e, 0), "variant");
    const sweep_point *lru = sweep_experiment_point(e, 3);
    cr_assert_str_eq(sweep_point_get(e, lru, "variant"), "LRU");
    cr_assert_str_eq(sweep_point_get(e, lru, "policy"), "lru");
    cr_assert_null(sweep_point_get(e, lru, "dymoe.hi"));
    const sweep_point *p2 = sweep_experiment_point(e, 2);
    cr_assert_str_eq(sweep_point_get(e, p2, "dymoe.lo"), "int4");
    cr_assert_str_eq(sweep_point_get(e, p2, "memory.budget_gb"), "16");
    sweep_experiment_destroy(e);
}

typedef struct bad_case {
    const char *text;
    const char *message; /* a piece of the expected one-line error */
} bad_case;

static const bad_case bad_cases[] = {
    {"[fixed]\npolicy = lru\nfoo = 1\n", "foo"},
    {"[experiment]\nname = ../../evil\n", "bad.ini:2: [experiment] name: expected letters"},
    {"[axes]\npolicy = lru,,lfu\n", "bad.ini:2: [axes] policy: an empty value"},
    {"[axes]\npolicy = lru, lfu,\n", "bad.ini:2: [axes] policy: an empty value"},
    {"[experiment]\nname = .hidden\n",
     "name: expected letters, digits, '-', '_' or '.' (not first)"},
    {"[fixed]\nmemory.budget_gb = 24\n[axes]\nmemory.budget_gb = 16, 20\n",
     "bad.ini:2: [fixed] memory.budget_gb is also set by the axis at line 4"},
    {"[axes]\nmemory.budget_gb = 16, 16\n", "listed twice"},
    {"[axes]\nmemory.budget_gb = 4:1:1\n", "stop >= start"},
    {"[axes]\nsim.seed = -9223372036854775808:9223372036854775807:1\n",
     "bad.ini:2: [axes] sim.seed: range"},
    {"[axes]\nsim.seed = 0:9223372036854775807:9223372036854775807\n"
     "label.q = 0:1e400:1\n",
     "label.q: range '0:1e400:1': expected finite"},
    {"[axes]\nlabel.q = 0:0:1e-40\n", "at most 17 decimals"},
    {"[traces]\nt.h5 = --seed 1\n"
     "u.h5 = a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a a "
     "a a a a a a a a a a a a a a a a a a a a a a\n",
     "bad.ini:3: [traces] u.h5: recipe has 65 arguments"},
    {"[axes]\nmemory.budget_gb = 1, 2\n[axis v]\na = memory.budget_gb=3\n", "set by two axes"},
    {"[fixed]\npolicy = lru\nmodel=m\nhw=h\ntrace=t\n[exclude]\nbatch.size=1\n", "no fixed"},
    {"[fixed]\npolicy = lr,u\n", "CSV"},
    {"[experiment]\nevaluator = magic\n", "evaluator"},
    {"[fixed]\npolicy = lru\nmodel = m\nhw = h\n", "sets no 'trace'"},
    {"[fixed]\npolicy = lru\nmodel=m\nhw=h\ntrace=t\n[exclude]\npolicy=lru\n",
     "every configuration"},
    /* found by fuzz_experiment: the resolved copy wrote these as "k = ;1", a comment */
    {"[fixed]\nbatch.size =;1\n", "bad.ini:2: batch.size: a value must not start with ';'"},
    {"[experiment]\nname =#x\n", "bad.ini:2: name: a value must not start with '#'"},
    {"[axes]\nmemory.budget_gb = 16,;24\n", "not starting with ';' or '#'"},
    {"[nonsense]\n", "unknown section"},
    {"key = value\n", "[section] first"},
    {"[experiment]\nevaluator = trace-stats\n[fixed]\ntrace = t\nstats.capacity = 1\n"
     "memory.budget_gb = 3\n",
     "reads only"},
};

Test(sweep, bad_experiment_files_fail_with_one_line_naming_the_file_and_problem) {
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        moesim_error err = {0};
        cr_assert_eq(load_error(c->text, &err), MOESIM_EINPUT, "accepted:\n%s", c->text);
        cr_assert(strstr(err.msg, c->message), "message '%s' lacks '%s'", err.msg, c->message);
        cr_assert(strstr(err.msg, "bad.ini"), "message '%s' does not name the file", err.msg);
        cr_assert_null(strchr(err.msg, '\n'));
    }
}

/* ---- hashing ------------------------------------------------------------------------------ */

Test(sweep, hashes_do_not_depend_on_file_order_or_on_other_configurations) {
    sweep_experiment *a = load_text("ha.ini", "[fixed]\npolicy = lru\nmodel = m\nhw = h\n"
                                              "trace = t\nbatch.size = 4\n"
                                              "[axes]\nmemory.budget_gb = 16, 24\n");
    /* same configurations, keys in another order, budgets from an axis with more values and a
       bundle instead of [fixed] */
    sweep_experiment *b = load_text("hb.ini", "[axes]\nmemory.budget_gb = 8, 24, 16\n"
                                              "[axis x]\n"
                                              "only = trace=t, batch.size=4, hw=h\n"
                                              "[fixed]\nmodel = m\npolicy = lru\n");
    sweep_experiment *c = load_text("hc.ini", "[fixed]\npolicy = lru\nmodel = m\nhw = h\n"
                                              "trace = t\nbatch.size = 4\n"
                                              "memory.budget_gb = 24\n");
    const sweep_point *a24 = sweep_experiment_point(a, 1);
    /* b's configurations carry the bundle label "x=only", so hash differs; c equals a */
    cr_assert_eq(sweep_experiment_point(c, 0)->hash, a24->hash);
    cr_assert_eq(sweep_experiment_point(c, 0)->seed, a24->seed);
    cr_assert_neq(sweep_experiment_point(b, 1)->hash, a24->hash);
    cr_assert_neq(sweep_experiment_point(a, 0)->hash, a24->hash);
    /* the same file loaded twice, and the hash of a fixed configuration across versions */
    sweep_experiment *c2 = load_text("hc2.ini", "[fixed]\nbatch.size = 4\ntrace = t\nhw = h\n"
                                                "memory.budget_gb = 24\nmodel = m\npolicy = lru\n");
    cr_assert_eq(sweep_experiment_point(c2, 0)->hash, a24->hash);
    cr_assert_eq(a24->hash, UINT64_C(0x8a997565d761b24c),
                 "configuration hash changed: results files of earlier "
                 "sweeps would no longer resume (got %016llx)",
                 (unsigned long long)a24->hash);
    sweep_experiment_destroy(a);
    sweep_experiment_destroy(b);
    sweep_experiment_destroy(c);
    sweep_experiment_destroy(c2);
}

/* Loads `text`, binds its inputs and returns configuration 0's hash. */
static uint64_t bound_hash(const char *name, const char *text) {
    sweep_experiment *e = load_text(name, text);
    moesim_error err = {0};
    cr_assert_eq(sweep_experiment_bind_inputs(e, &err), MOESIM_OK, "%s", err.msg);
    uint64_t h = sweep_experiment_point(e, 0)->hash;
    cr_assert_eq(sweep_experiment_find(e, h), sweep_experiment_point(e, 0));
    cr_assert_eq(sweep_experiment_bind_inputs(e, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(sweep_experiment_point(e, 0)->hash, h, "binding twice changed the hash");
    sweep_experiment_destroy(e);
    return h;
}

static void copy_file(const char *from, const char *to) {
    char *t = read_file(from);
    test_write_file(to, t);
    free(t);
}

Test(sweep, bound_hashes_follow_the_content_of_the_trace_recipe_model_and_hw_not_their_names) {
    char model[4096], hw[4096], trace_path[4096], text[16384];
    snprintf(model, sizeof model, "%s", test_tmp_path("bind-model.ini"));
    snprintf(hw, sizeof hw, "%s", test_tmp_path("bind-hw.ini"));
    snprintf(trace_path, sizeof trace_path, "%s", test_tmp_path("bind-trace.h5"));
    const char *configs = MOESIM_SOURCE_DIR "/configs";
    char src[4096];
    snprintf(src, sizeof src, "%s/models/olmoe-1b-7b.ini", configs);
    copy_file(src, model);
    snprintf(src, sizeof src, "%s/hw/rtx3090-pcie4.ini", configs);
    copy_file(src, hw);
    test_write_file(trace_path, "trace bytes v1");
#define BIND_TEXT(recipe_seed)                                                                     \
    snprintf(text, sizeof text,                                                                    \
             "[fixed]\npolicy = lru\nmodel = %s\nhw = %s\ntrace = %s\n"                            \
             "[traces]\n%s = --model olmoe-1b-7b --requests 1 --seed %d\n",                        \
             model, hw, trace_path, trace_path, recipe_seed)
    BIND_TEXT(1);
    uint64_t h0 = bound_hash("bind0.ini", text);
    sweep_experiment *unbound = load_text("bind-u.ini", text);
    cr_assert_neq(sweep_experiment_point(unbound, 0)->hash, h0, "binding added nothing");
    sweep_experiment_destroy(unbound);
    cr_assert_eq(bound_hash("bind1.ini", text), h0, "same inputs, another hash");

    /* a comment and the order of entries are not values */
    char *orig_model = read_file(model);
    size_t len = strlen(orig_model);
    char *edited = malloc(len + 64);
    snprintf(edited, len + 64, "; a new comment\n%s\n\n", orig_model);
    test_write_file(model, edited);
    cr_assert_eq(bound_hash("bind2.ini", text), h0, "a comment changed the hash");
    /* a value is: n_layers 16 -> 15 */
    char *v = strstr(orig_model, "n_layers = 16");
    cr_assert(v, "olmoe-1b-7b.ini lacks n_layers = 16");
    snprintf(edited, len + 64, "%s", orig_model);
    edited[(v - orig_model) + strlen("n_layers = 1")] = '5';
    test_write_file(model, edited);
    cr_assert_neq(bound_hash("bind3.ini", text), h0, "a model value did not count");
    /* a name that resolves to nothing: an error naming the setting */
    moesim_error err = {0};
    char bad_text[16384];
    snprintf(bad_text, sizeof bad_text,
             "[fixed]\npolicy = lru\nmodel = no-such-model\nhw = %s\n"
             "trace = %s\n",
             hw, trace_path);
    sweep_experiment *e = load_text("bind-bad.ini", bad_text);
    cr_assert_eq(sweep_experiment_bind_inputs(e, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "bind-bad.ini:3: model = no-such-model"), "%s", err.msg);
    sweep_experiment_destroy(e);
    test_write_file(model, orig_model);
    char *orig_hw = read_file(hw);
    char *w = strstr(orig_hw, "hbm_gb_per_s = 936");
    cr_assert(w, "rtx3090-pcie4.ini lacks hbm_gb_per_s = 936");
    char *hw_edit = strdup(orig_hw);
    hw_edit[(w - orig_hw) + strlen("hbm_gb_per_s = 93")] = '7';
    test_write_file(hw, hw_edit);
    cr_assert_neq(bound_hash("bind4.ini", text), h0, "an hw value did not count");
    test_write_file(hw, orig_hw);
    cr_assert_eq(bound_hash("bind5.ini", text), h0);

    /* the trace's bytes, its absence, and its recipe */
    test_write_file(trace_path, "trace bytes v2");
    cr_assert_neq(bound_hash("bind6.ini", text), h0, "a replaced trace kept the hash");
    unlink(trace_path);
    cr_assert_neq(bound_hash("bind7.ini", text), h0, "a missing trace kept the hash");
    test_write_file(trace_path, "trace bytes v1");
    BIND_TEXT(2);
    cr_assert_neq(bound_hash("bind8.ini", text), h0, "an edited recipe kept the hash");
#undef BIND_TEXT
    free(orig_model);
    free(orig_hw);
    free(edited);
    free(hw_edit);
}

Test(sweep, the_base_seed_changes_every_hash) {
    sweep_experiment *a = load_text("s1.ini", "[experiment]\nseed = 1\n[fixed]\npolicy = lru\n"
                                              "model = m\nhw = h\ntrace = t\n");
    sweep_experiment *b = load_text("s2.ini", "[experiment]\nseed = 2\n[fixed]\npolicy = lru\n"
                                              "model = m\nhw = h\ntrace = t\n");
    cr_assert_neq(sweep_experiment_point(a, 0)->hash, sweep_experiment_point(b, 0)->hash);
    cr_assert_neq(sweep_experiment_point(a, 0)->seed, sweep_experiment_point(b, 0)->seed);
    sweep_experiment_destroy(a);
    sweep_experiment_destroy(b);
}

Test(sweep, a_sim_seed_axis_gives_replicates_with_their_own_seeds) {
    sweep_experiment *e = load_text("seeds.ini", "[experiment]\nseed = 7\n"
                                                 "[fixed]\npolicy = lru\nmodel = m\nhw = h\n"
                                                 "trace = t\n[axes]\nsim.seed = 1:3:1\n");
    cr_assert_eq(sweep_experiment_count(e), 3);
    for (size_t i = 0; i < 3; i++) cr_assert_eq(sweep_experiment_point(e, i)->seed, i + 1);
    sweep_experiment_destroy(e);
    e = load_text("seeds2.ini", "[experiment]\nseed = 7\n[fixed]\npolicy = lru\nmodel = m\n"
                                "hw = h\ntrace = t\n[axes]\nbatch.size = 1, 2\n");
    cr_assert_eq(sweep_experiment_point(e, 0)->seed, 7, "common random numbers: the base seed");
    cr_assert_eq(sweep_experiment_point(e, 1)->seed, 7);
    sweep_experiment_destroy(e);
    moesim_error err = {0};
    cr_assert_eq(load_error("[fixed]\npolicy = lru\nmodel=m\nhw=h\ntrace=t\nsim.seed = x\n", &err),
                 MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "sim.seed"), "%s", err.msg);
}

Test(sweep, the_resolved_copy_loads_to_the_same_configurations) {
    const char *text = "[experiment]\nname = rt\nseed = 9\n"
                       "[fixed]\nmodel = m\nhw = h\ntrace = t\n"
                       "[axes]\npolicy = lru, dymoe\ndymoe.retention = 0.5:0.7:0.1\n"
                       "[axis v]\nlo = batch.size=1\nhi = batch.size=8\n"
                       "[exclude]\npolicy=dymoe, v=hi\n"
                       "[traces]\nt = --model m --seed 3\n"
                       "[validate]\nrepeats = 3\n";
    sweep_experiment *a = load_text("rt.ini", text);
    char side[4096];
    snprintf(side, sizeof side, "%s", test_tmp_path("rt.experiment.ini"));
    moesim_error err = {0};
    cr_assert_eq(sweep_experiment_write_resolved(a, "rt.ini", side, &err), MOESIM_OK, "%s",
                 err.msg);
    sweep_experiment *b = NULL;
    cr_assert_eq(sweep_experiment_load(side, &b, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(sweep_experiment_count(a), sweep_experiment_count(b));
    cr_assert_eq(sweep_experiment_n_columns(a), sweep_experiment_n_columns(b));
    for (size_t i = 0; i < sweep_experiment_count(a); i++)
        cr_assert_eq(sweep_experiment_point(a, i)->hash, sweep_experiment_point(b, i)->hash);
    cr_assert_eq(sweep_experiment_n_traces(b), 1);
    sweep_experiment_destroy(a);
    cr_assert_str_eq(sweep_experiment_validate_get(b, "repeats", NULL), "3");
    sweep_experiment_destroy(b);
}

/* ---- `moesim sweep` end to end ------------------------------------------------------------ */

typedef struct cli_fixture {
    char exp[4096]; /* experiment file */
    char trace_a[4096], trace_b[4096];
    size_t n_configs;
} cli_fixture;

/* Two real traces and an experiment over them. */
static void make_fixture(cli_fixture *f, const char *tag) {
    char name[128];
    snprintf(name, sizeof name, "%s-a.h5", tag);
    snprintf(f->trace_a, sizeof f->trace_a, "%s", test_tmp_path(name));
    snprintf(name, sizeof name, "%s-b.h5", tag);
    snprintf(f->trace_b, sizeof f->trace_b, "%s", test_tmp_path(name));
    write_model_trace("olmoe-1b-7b", f->trace_a, 4, 16, 16, 1);
    write_model_trace("olmoe-1b-7b", f->trace_b, 4, 16, 16, 2);
    snprintf(name, sizeof name, "%s.ini", tag);
    snprintf(f->exp, sizeof f->exp, "%s", test_tmp_path(name));
    char text[16384];
    /* real simulations: two policies over per-layer caches of 4..64 experts (OLMoE: 64) */
    snprintf(text, sizeof text,
             "[experiment]\nname = %s\n"
             "[fixed]\nmodel = olmoe-1b-7b\nhw = rtx3090-pcie4\n"
             "[axes]\ntrace = %s, %s\npolicy = ondemand, lru\n"
             "cache.experts_per_layer = 4:64:4\n",
             tag, f->trace_a, f->trace_b);
    test_write_file(f->exp, text);
    f->n_configs = 2 * 2 * 16;
}

static const char *csv_path(const char *tag, const char *what) {
    static char buf[4][4096];
    static int slot;
    char name[256];
    snprintf(name, sizeof name, "%s-%s.csv", tag, what);
    char *b = buf[slot++ % 4];
    snprintf(b, sizeof buf[0], "%s", test_tmp_path(name));
    return b;
}

static int run_quiet(const char *a1, const char *a2, const char *a3, const char *a4, const char *a5,
                     const char *a6, const char *a7) {
    static char out[1 << 16], errb[1 << 14];
    return test_run_moesim(out, sizeof out, errb, sizeof errb, a1, a2, a3, a4, a5, a6, a7, NULL);
}

Test(sweep, validate_runs_an_experiments_configurations_in_order_labelled_by_their_axes) {
    const char *path = test_tmp_path("validate-plan.ini");
    test_write_file(path, "[fixed]\nmodel = m\nhw = h.ini\ntrace = t.h5\nbatch.size = 1\n"
                          "dymoe.retention = 0.8\n"
                          "[axes]\nmemory.budget_gb = 12, 16\npolicy = lru, dymoe\n"
                          "[validate]\nrepeats = 4\ntpot_error_max = 0.25\norder_margin = 0.3\n");
    validate_plan plan;
    moesim_error err = {0};
    cr_assert_eq(sweep_validate_plan_experiment(path, NULL, &plan, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(plan.n, 4);
    cr_assert_str_eq(plan.trace, "t.h5");
    cr_assert_str_eq(plan.hw, "h.ini");
    cr_assert_str_eq(plan.model, "m");
    cr_assert(plan.repeats == 4 && plan.check && plan.check_tpot == 0.25 &&
              plan.check_margin == 0.3);
    /* the first axis varies slowest: budget-major, as the report groups them */
    static const char *const policies[] = {"lru", "dymoe", "lru", "dymoe"};
    static const char *const labels[] = {"budget 12 GiB", "budget 12 GiB", "budget 16 GiB",
                                         "budget 16 GiB"};
    for (size_t i = 0; i < 4; i++) {
        cr_assert_str_eq(plan.specs[i].policy, policies[i]);
        cr_assert_str_eq(plan.specs[i].label, labels[i]);
    }
    /* settings only (not the run's inputs); a policy's knobs only for that policy */
    cr_assert_eq(plan.specs[0].n_sets, 2);
    cr_assert_eq(plan.specs[1].n_sets, 3);
    bool has_knob = false, has_budget = false;
    for (size_t k = 0; k < plan.specs[1].n_sets; k++) {
        has_knob |= !strcmp(plan.specs[1].sets[k], "dymoe.retention=0.8");
        has_budget |= !strcmp(plan.specs[1].sets[k], "memory.budget_gb=12");
    }
    cr_assert(has_knob && has_budget);
    sweep_validate_plan_free(&plan);
    /* --budgets keeps those budgets' configurations */
    cr_assert_eq(sweep_validate_plan_experiment(path, "16", &plan, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(plan.n, 2);
    cr_assert_str_eq(plan.specs[0].label, "budget 16 GiB");
    sweep_validate_plan_free(&plan);
    /* the check takes both of its keys */
    test_write_file(path, "[fixed]\nmodel = m\nhw = h\ntrace = t\npolicy = lru\n"
                          "[validate]\norder_margin = 0.3\n");
    cr_assert_eq(sweep_validate_plan_experiment(path, NULL, &plan, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "tpot_error_max"), "%s", err.msg);
    cr_assert_eq(load_error("[validate]\nrounds = 3\n", &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "bad.ini:2: [validate] rounds: unknown key"), "%s", err.msg);
}

/* A value of the file no configuration can run with (a setting that does not parse, a policy
 * nobody provides) fails the sweep before any configuration runs, naming its line: not an error
 * row per configuration, exit 0, and "already done" on the next run. */
Test(sweep, a_value_no_configuration_can_run_with_fails_before_any_runs) {
    cli_fixture f;
    make_fixture(&f, "badvalue");
    static const char *const edits[][2] = {
        {"policy = ondemand, lru\n", "policy = ondemand, nosuch\n"},
        {"cache.experts_per_layer = 4:64:4\n", "cache.experts_per_layer = 4, four\n"},
    };
    static const char *const says[] = {"badvalue.ini:8: policy: unknown policy 'nosuch'",
                                       "badvalue.ini:9: [cache] experts_per_layer: expected a "
                                       "non-negative integer, got 'four'"};
    char *orig = test_read_file(f.exp, NULL);
    for (size_t i = 0; i < 2; i++) {
        char text[16384];
        const char *at = strstr(orig, edits[i][0]);
        cr_assert(at);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - orig), orig, edits[i][1],
                 at + strlen(edits[i][0]));
        test_write_file(f.exp, text);
        const char *out = csv_path("badvalue", "out");
        unlink(out);
        char so[4096], se[4096];
        int rc =
            test_run_moesim(so, sizeof so, se, sizeof se, "sweep", f.exp, "-o", out, "-q", NULL);
        cr_assert_eq(rc, 2, "edit %zu: exit %d: %s", i, rc, se);
        cr_assert(strstr(se, says[i]), "edit %zu: %s", i, se);
        cr_assert_not(test_file_exists(out), "edit %zu wrote rows", i);
    }
    free(orig);
}

/* A complete row whose cells are not what a run of its configuration wrote (its hash kept, a
 * cell edited) stops the resume in one line naming it: it would count as done otherwise. */
Test(sweep, a_resumed_row_edited_by_hand_is_refused_not_counted_as_done) {
    cli_fixture f;
    make_fixture(&f, "edited");
    const char *ref = csv_path("edited", "ref");
    unlink(ref);
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", ref, "-j", "1", NULL), 0);
    char *orig = test_read_file(ref, NULL);
    /* the first row's policy cell, then its status (the third cell) emptied */
    static const char *const edits[][3] = {{",ondemand,", ",nosuch,", "policy 'nosuch'"},
                                           {NULL, ",,", "status ''"}};
    for (size_t i = 0; i < 2; i++) {
        char *text = moesim_xstrdup(orig);
        char *row = strchr(text, '\n') + 1, *at;
        size_t cut;
        if (edits[i][0]) {
            at = strstr(row, edits[i][0]);
            cut = strlen(edits[i][0]);
        } else {
            at = strchr(strchr(row, ',') + 1, ','); /* the comma before the status */
            cut = (size_t)(strchr(at + 1, ',') - at) + 1;
        }
        cr_assert(at && at < strchr(row, '\n'), "edit %zu: not in the first row", i);
        size_t put = strlen(edits[i][1]);
        memmove(at + put, at + cut, strlen(at + cut) + 1);
        memcpy(at, edits[i][1], put);
        test_write_file(ref, text);
        static char so[1 << 14], se[4096];
        int rc = test_run_moesim(so, sizeof so, se, sizeof se, "sweep", f.exp, "-o", ref, NULL);
        cr_assert_eq(rc, 2, "edit %zu: exit %d: %s", i, rc, se);
        cr_assert(strstr(se, ":2: configuration ") && strstr(se, edits[i][2]) &&
                      strstr(se, "is not what a run wrote"),
                  "edit %zu: %s", i, se);
        free(text);
    }
    free(orig);
}

Test(sweep, a_sweep_killed_at_random_points_resumes_to_the_rows_of_an_uninterrupted_run) {
    cli_fixture f;
    make_fixture(&f, "kill");
    const char *ref = csv_path("kill", "ref");
    double t0 = moesim_monotonic_s();
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", ref, "-j", "2", NULL), 0);
    /* kills land uniformly over the length of an uninterrupted run */
    long run_us = (long)((moesim_monotonic_s() - t0) * 1e6) + 1;
    size_t n_ref;
    char *want = canonical_rows(ref, &n_ref);
    cr_assert_eq(n_ref, f.n_configs);

    const char *out = csv_path("kill", "resumed");
    const char *bin = getenv("MOESIM_BIN");
    rng *r = rng_create(20261123);
    int kills = 0, mid_run_kills = 0;
    for (int round = 0; round < 4; round++) { /* each round from an empty results file */
        unlink(out);
        for (int attempt = 0; attempt < 100; attempt++) {
            pid_t pid = fork();
            cr_assert(pid >= 0);
            if (pid == 0) {
                cr_assert(freopen("/dev/null", "w", stdout) && freopen("/dev/null", "w", stderr));
                execl(bin, bin, "sweep", f.exp, "-o", out, "-j", "2", (char *)NULL);
                _exit(127);
            }
            long us = (long)rng_below(r, (uint64_t)run_us);
            struct timespec d = {us / 1000000, (us % 1000000) * 1000};
            nanosleep(&d, NULL);
            int status;
            kill(pid, SIGKILL);
            cr_assert_eq(waitpid(pid, &status, 0), pid);
            if (WIFEXITED(status)) { /* finished before the kill */
                cr_assert_eq(WEXITSTATUS(status), 0);
                break;
            }
            kills++;
            size_t lines = count_lines(out);
            mid_run_kills += lines > 1 && lines < f.n_configs + 1;
        }
        size_t n_got;
        char *got = canonical_rows(out, &n_got);
        cr_assert_eq(n_got, f.n_configs, "%zu rows after %d kills, want %zu", n_got, kills,
                     f.n_configs);
        cr_assert_str_eq(got, want);
        free(got);
    }
    rng_destroy(r);
    cr_assert_gt(mid_run_kills, 0, "no kill landed mid-sweep (%d kills): the test proves nothing",
                 kills);
    free(want);
}

Test(sweep, a_torn_last_row_is_removed_and_its_configuration_rerun) {
    cli_fixture f;
    make_fixture(&f, "torn");
    const char *ref = csv_path("torn", "ref");
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", ref, "-j", "1", NULL), 0);
    char *full = read_file(ref);
    /* keep the header and 10 rows, then half of the 11th: what a kill mid-write leaves */
    char *p = full;
    for (int i = 0; i < 11; i++) p = strchr(p, '\n') + 1;
    char *eol = strchr(p, '\n');
    const char *cut = csv_path("torn", "cut");
    test_write_bytes(cut, full, (size_t)(p - full) + (size_t)(eol - p) / 2);
    static char out[1 << 16], errb[1 << 14];
    cr_assert_eq(test_run_moesim(out, sizeof out, errb, sizeof errb, "sweep", f.exp, "-o", cut,
                                 "-j", "1", NULL),
                 0, "%s", errb);
    cr_assert(strstr(errb, "torn"), "no word of the repair: %s", errb);
    char *got = read_file(cut);
    cr_assert_str_eq(got, full, "a -j 1 resume must give the uninterrupted bytes");
    free(got);
    free(full);
}

Test(sweep, a_finished_sweep_reruns_nothing_and_keeps_its_bytes) {
    cli_fixture f;
    make_fixture(&f, "again");
    const char *out = csv_path("again", "out");
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", out, "-j", "2", NULL), 0);
    char *before = read_file(out);
    static char so[1 << 16], se[1 << 14];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", f.exp, "-o", out, NULL), 0);
    cr_assert(strstr(so, "0 run"), "%s", so);
    char *after = read_file(out);
    cr_assert_str_eq(after, before);
    /* the resolved experiment sits next to the results */
    char side[4096];
    sweep_sidecar_path(out, side, sizeof side);
    cr_assert(test_file_exists(side));
    free(before);
    free(after);
}

/* A results file another sweep is appending to (here: locked by this process, as a running
 * sweep holds it) is refused in one line and left as it is: two sweeps would repeat rows. */
Test(sweep, a_results_file_another_sweep_holds_is_refused_untouched) {
    cli_fixture f;
    make_fixture(&f, "held");
    const char *out = csv_path("held", "out");
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", out, "-j", "1", NULL), 0);
    char *before = read_file(out);
    int fd = open(out, O_RDONLY);
    cr_assert(fd >= 0 && flock(fd, LOCK_EX) == 0);
    static char so[1 << 12], se[1 << 12];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", f.exp, "-o", out, NULL), 2,
                 "%s", se);
    cr_assert(strstr(se, "held-out.csv: in use by another sweep"), "%s", se);
    close(fd);
    char *after = read_file(out);
    cr_assert_str_eq(after, before);
    free(before);
    free(after);
}

Test(sweep, two_sweeps_of_one_experiment_give_the_same_bytes_with_one_job) {
    cli_fixture f;
    make_fixture(&f, "det");
    const char *a = csv_path("det", "a"), *b = csv_path("det", "b");
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", a, "-j", "1", NULL), 0);
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", b, "-j", "1", NULL), 0);
    char *ta = read_file(a), *tb = read_file(b);
    cr_assert_str_eq(ta, tb);
    free(ta);
    free(tb);
}

Test(sweep, shards_merged_equal_the_unsharded_run) {
    cli_fixture f;
    make_fixture(&f, "shard");
    const char *whole = csv_path("shard", "whole");
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", whole, "-j", "1", NULL), 0);
    char s0[4096], s1[4096], s2[4096];
    snprintf(s0, sizeof s0, "%s", csv_path("shard", "s0"));
    snprintf(s1, sizeof s1, "%s", csv_path("shard", "s1"));
    snprintf(s2, sizeof s2, "%s", csv_path("shard", "s2"));
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", s0, "--shard", "0/3", NULL), 0);
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", s1, "--shard", "1/3", NULL), 0);
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", s2, "--shard", "2/3", NULL), 0);
    size_t n0 = count_lines(s0) - 1, n1 = count_lines(s1) - 1, n2 = count_lines(s2) - 1;
    cr_assert_eq(n0 + n1 + n2, f.n_configs);
    cr_assert(n0 && n1 && n2);
    const char *merged = csv_path("shard", "merged");
    static char so[1 << 16], se[1 << 14];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", "merge", "-o", merged, s2,
                                 s0, s1, NULL),
                 0, "%s", se);
    /* merged in configuration order: the bytes of a -j 1 unsharded run */
    char *tw = read_file(whole), *tm = read_file(merged);
    cr_assert_str_eq(tm, tw);
    free(tw);
    free(tm);

    /* overlapping shards (a copy of shard 0 under another name): refused, nothing written */
    char s0copy[4096];
    snprintf(s0copy, sizeof s0copy, "%s", csv_path("shard", "s0copy"));
    char *t0 = read_file(s0);
    test_write_file(s0copy, t0);
    free(t0);
    const char *dup = csv_path("shard", "dup");
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", "merge", "-o", dup, s0, s1,
                                 s2, s0copy, NULL),
                 2);
    cr_assert(strstr(se, "two rows") && strstr(se, "s0copy"), "%s", se);
    cr_assert_not(test_file_exists(dup));
    cr_assert_eq(
        test_run_moesim(so, sizeof so, se, sizeof se, "sweep", "merge", "-o", dup, s0, s0, NULL),
        2);
    cr_assert(strstr(se, "given twice"), "%s", se);
    cr_assert_not(test_file_exists(dup));

    /* a shard missing: merged, gaps reported, exit 1 */
    const char *gap = csv_path("shard", "gap");
    cr_assert_eq(
        test_run_moesim(so, sizeof so, se, sizeof se, "sweep", "merge", "-o", gap, s0, s2, NULL), 1,
        "%s", se);
    cr_assert(strstr(se, "gaps"), "%s", se);
    char want[64];
    snprintf(want, sizeof want, "%zu of %zu", n1, f.n_configs);
    cr_assert(strstr(se, want), "'%s' not in: %s", want, se);
    cr_assert(strstr(se, " 1 "), "configuration 1 (shard 1) not named: %s", se);
    cr_assert_eq(count_lines(gap), 1 + n0 + n2);
}

/* Runs experiments/slurm/sweep.sbatch with the Slurm variables of `env` and MOESIM=echo: the
 * command it would exec lands in out. Returns the script's exit status. */
static int run_sbatch(const char *env, const char *args, char *out, size_t out_len) {
    const char *configs = MOESIM_SOURCE_DIR "/configs";
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "env -u MOESIM_SHARDS SLURM_CPUS_PER_TASK=2 MOESIM=echo %s bash "
             "'%s/../experiments/slurm/sweep.sbatch' %s 2>&1",
             env, configs, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(out, 1, out_len - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(sweep, the_slurm_script_takes_the_shard_count_from_its_argument_not_the_array_size) {
    char out[4096];
    /* resubmitting shard 3 alone (`sbatch --array=3`): still shard 3 of 8, not 0 of 1 */
    cr_assert_eq(run_sbatch("SLURM_ARRAY_TASK_ID=3 SLURM_ARRAY_TASK_COUNT=1 "
                            "SLURM_ARRAY_TASK_MIN=3 SLURM_ARRAY_TASK_MAX=3",
                            "x.ini 8", out, sizeof out),
                 0, "%s", out);
    cr_assert_str_eq(out, "sweep x.ini -j 2 --shard 3/8 -q\n");
    /* --array=3,7 with the count from the environment */
    cr_assert_eq(run_sbatch("MOESIM_SHARDS=8 SLURM_ARRAY_TASK_ID=7 SLURM_ARRAY_TASK_COUNT=2 "
                            "SLURM_ARRAY_TASK_MIN=3 SLURM_ARRAY_TASK_MAX=7",
                            "x.ini", out, sizeof out),
                 0, "%s", out);
    cr_assert_str_eq(out, "sweep x.ini -j 2 --shard 7/8 -q\n");
    /* a task beyond the count, no count, a bad count: refused */
    cr_assert_eq(run_sbatch("SLURM_ARRAY_TASK_ID=8", "x.ini 8", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "no shard of 8"), "%s", out);
    cr_assert_eq(
        run_sbatch("SLURM_ARRAY_TASK_ID=0 SLURM_ARRAY_TASK_COUNT=4", "x.ini", out, sizeof out), 2,
        "%s", out);
    cr_assert(strstr(out, "shard count N is missing"), "%s", out);
    cr_assert_eq(run_sbatch("SLURM_ARRAY_TASK_ID=0", "x.ini 0", out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "positive integer"), "%s", out);
}

Test(sweep, an_edited_trace_recipe_remakes_the_trace_and_reruns_its_rows) {
    char exp[4096], trace_path[4096], stamp[4200], text[8192];
    snprintf(exp, sizeof exp, "%s", test_tmp_path("recipe.ini"));
    snprintf(trace_path, sizeof trace_path, "%s", test_tmp_path("recipe-trace.h5"));
    snprintf(stamp, sizeof stamp, "%s.recipe", trace_path);
    const char *out = csv_path("recipe", "out");
    unlink(trace_path);
    unlink(stamp);
    unlink(out);
    static char so[1 << 16], se[1 << 14];
    for (int seed = 1; seed <= 2; seed++) {
        snprintf(text, sizeof text,
                 "[experiment]\nname = recipe\nevaluator = trace-stats\n"
                 "[fixed]\ntrace = %s\n[axes]\nstats.capacity = 1, 2\n"
                 "[traces]\n%s = --model olmoe-1b-7b --requests 1 --prompt-len 8 --gen-len 8 "
                 "--seed %d\n",
                 trace_path, trace_path, seed);
        test_write_file(exp, text);
        cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", exp, "-o", out, "-q",
                                     "-j", "1", NULL),
                     0, "%s", se);
        cr_assert(strstr(so, "0 already done, 2 run"), "seed %d: %s", seed, so);
        cr_assert(test_file_exists(trace_path));
        char *st = read_file(stamp);
        cr_assert(strstr(st, seed == 1 ? "--seed 1\n" : "--seed 2\n"), "stamp: %s", st);
        free(st);
        if (seed == 2) cr_assert(strstr(se, "remaking"), "%s", se);
        /* unchanged: nothing remade, nothing rerun */
        cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", exp, "-o", out, "-q",
                                     "-j", "1", NULL),
                     0, "%s", se);
        cr_assert(strstr(so, "2 already done, 0 run"), "seed %d rerun: %s", seed, so);
        cr_assert_null(strstr(se, "synthesizing"), "%s", se);
    }
    cr_assert_eq(count_lines(out), 1 + 4, "old rows stay, new rows added");
}

/* A recipe trace synth refuses fails the sweep with synth's own reason in the sweep's one
 * error line (after the progress line that names the trace being made). */
Test(sweep, a_failing_trace_recipe_is_one_error_line_with_synths_reason) {
    char exp[4096], trace_path[4096], text[8192];
    snprintf(exp, sizeof exp, "%s", test_tmp_path("bad-recipe.ini"));
    snprintf(trace_path, sizeof trace_path, "%s", test_tmp_path("bad-recipe.h5"));
    unlink(trace_path);
    snprintf(text, sizeof text,
             "[experiment]\nname = bad-recipe\nevaluator = trace-stats\n"
             "[fixed]\ntrace = %s\n[axes]\nstats.capacity = 1, 2\n"
             "[traces]\n%s = --model olmoe-1b-7b --requests 0\n",
             trace_path, trace_path);
    test_write_file(exp, text);
    static char so[1 << 16], se[1 << 14];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", exp, "-o",
                                 csv_path("bad-recipe", "out"), "-q", NULL),
                 2, "%s", se);
    const char *error = strstr(se, "\nmoesim: ");
    cr_assert(error && !strncmp(se, "sweep: synthesizing ", 20), "%s", se);
    cr_assert(strstr(error, "its [traces] recipe '--model olmoe-1b-7b --requests 0' failed: "
                            "moesim trace synth: --requests: expected a whole number >= 1"),
              "%s", se);
    cr_assert_eq(strchr(error + 1, '\n'), se + strlen(se) - 1, "two lines in all: %s", se);
    cr_assert_not(test_file_exists(trace_path));
}

Test(sweep, a_results_file_of_another_experiment_is_refused) {
    cli_fixture f;
    make_fixture(&f, "other");
    const char *out = csv_path("other", "out");
    test_write_file(out, "config_hash,seed,status,policy\n");
    static char so[1 << 16], se[1 << 14];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", f.exp, "-o", out, NULL), 2);
    cr_assert(strstr(se, "columns differ"), "%s", se);
    char *t = read_file(out);
    cr_assert_str_eq(t, "config_hash,seed,status,policy\n");
    free(t);
}

Test(sweep, a_dry_run_lists_the_shard_and_writes_nothing) {
    cli_fixture f;
    make_fixture(&f, "dry");
    const char *out = csv_path("dry", "out");
    static char so[1 << 16], se[1 << 14];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", f.exp, "-o", out, "--shard",
                                 "1/4", "--dry-run", NULL),
                 0, "%s", se);
    cr_assert(strstr(so, "16 to run"), "%s", so);
    cr_assert_not(test_file_exists(out));
    cr_assert_eq(
        test_run_moesim(so, sizeof so, se, sizeof se, "sweep", f.exp, "--shard", "4/4", NULL), 2);
    cr_assert(strstr(se, "--shard"), "%s", se);
}

Test(sweep, the_trace_stats_evaluator_gives_the_hit_rates_of_trace_stats) {
    char tpath[4096], exp[4096], out[4096];
    snprintf(tpath, sizeof tpath, "%s", test_tmp_path("hr.h5"));
    snprintf(exp, sizeof exp, "%s", test_tmp_path("hr.ini"));
    snprintf(out, sizeof out, "%s", test_tmp_path("hr.csv"));
    write_model_trace("olmoe-1b-7b", tpath, 4, 16, 16, 5);
    char text[8192];
    snprintf(text, sizeof text,
             "[experiment]\nevaluator = trace-stats\n[fixed]\ntrace = %s\n"
             "[axes]\nstats.capacity_share = 0.25, 0.5, 1.0\n",
             tpath);
    test_write_file(exp, text);
    cr_assert_eq(run_quiet("sweep", exp, "-o", out, "-j", "1", NULL), 0);
    trace *t = NULL;
    moesim_error err = {0};
    cr_assert_eq(trace_read(tpath, &t, &err), MOESIM_OK, "%s", err.msg);
    trace_stats *st = trace_stats_compute(t);
    char *csv = read_file(out);
    static const int caps[] = {16, 32, 64};
    char *line = strchr(csv, '\n') + 1;
    for (int i = 0; i < 3; i++, line = strchr(line, '\n') + 1) {
        /* hash,seed,status,code,moesim,policy,model,hw,trace,share, then experts,top_k,... */
        double f[6];
        const char *p = line;
        for (int c = 0; c < 10; c++) p = strchr(p, ',') + 1;
        cr_assert_eq(sscanf(p, "%lf,%lf,%lf,%lf,%lf,%lf", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5]),
                     6, "%s", line);
        cr_assert_eq((int)f[2], caps[i]);
        cr_assert_float_eq(f[4], st->lru_hit_rate[caps[i]], 1e-15);
        cr_assert_float_eq(f[5], st->opt_hit_rate[caps[i]], 1e-15);
        cr_assert_geq(f[5], f[4], "OPT below LRU");
    }
    cr_assert_float_eq(st->opt_hit_rate[64], st->lru_hit_rate[64], 1e-15);
    free(csv);
    trace_stats_destroy(st);
    trace_destroy(t);
}

Test(sweep, plot_renders_png_and_svg_and_refuses_missing_results) {
    char tpath[4096], exp[4096], out[4096], dir[4096];
    snprintf(tpath, sizeof tpath, "%s", test_tmp_path("plot.h5"));
    snprintf(exp, sizeof exp, "%s", test_tmp_path("hit-rate-curves.ini"));
    snprintf(dir, sizeof dir, "%s", test_tmp_path("plots"));
    snprintf(out, sizeof out, "%s/hit-rate-curves.csv", dir);
    mkdir(dir, 0755);
    write_model_trace("olmoe-1b-7b", tpath, 4, 16, 16, 9);
    char text[8192];
    snprintf(text, sizeof text,
             "[experiment]\nevaluator = trace-stats\n[axis model_name]\n"
             "OLMoE-1B-7B = model=olmoe-1b-7b, trace=%s\n"
             "[axes]\nstats.capacity_share = 0.1:1.0:0.1\n",
             tpath);
    test_write_file(exp, text);
    cr_assert_eq(run_quiet("sweep", exp, "-o", out, NULL, NULL, NULL), 0);
    static char so[1 << 16], se[1 << 14];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "plot", "hit-rate-curves", "--csv",
                                 out, NULL),
                 0, "%s", se);
    char png[4200], svg[4200];
    snprintf(png, sizeof png, "%s/hit-rate-curves.png", dir);
    snprintf(svg, sizeof svg, "%s/hit-rate-curves.svg", dir);
    char *p = read_file(png), *s = read_file(svg);
    cr_assert(!memcmp(p, "\x89PNG", 4), "not a PNG");
    cr_assert(strstr(s, "<svg") && strstr(s, "LRU"), "not an SVG with the legend");
    free(p);
    free(s);
    /* no results: exit 2, one line, no image */
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/none.csv", dir);
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "plot", "batch-sweep", "--csv",
                                 missing, NULL),
                 2);
    cr_assert(strstr(se, "none.csv"), "%s", se);
    snprintf(png, sizeof png, "%s/batch-sweep.png", dir);
    cr_assert_not(test_file_exists(png));
    cr_assert_eq(
        test_run_moesim(so, sizeof so, se, sizeof se, "plot", "no-such-figure", "--csv", out, NULL),
        2);
    cr_assert(strstr(se, "plot script plots/no-such-figure.gp not found (looked in "), "%s", se);
}

Test(sweep, plot_makes_the_output_folder_it_is_given) {
    char tpath[4096], exp[4096], out[4096], dir[4096];
    snprintf(tpath, sizeof tpath, "%s", test_tmp_path("plot-o.h5"));
    snprintf(exp, sizeof exp, "%s", test_tmp_path("plot-o.ini"));
    snprintf(out, sizeof out, "%s", test_tmp_path("plot-o.csv"));
    snprintf(dir, sizeof dir, "%s", test_tmp_path("plot-o-figs/a/b"));
    write_model_trace("olmoe-1b-7b", tpath, 4, 16, 16, 9);
    char text[8192];
    snprintf(text, sizeof text,
             "[experiment]\nevaluator = trace-stats\n[axis model_name]\n"
             "OLMoE-1B-7B = model=olmoe-1b-7b, trace=%s\n"
             "[axes]\nstats.capacity_share = 0.5, 1.0\n",
             tpath);
    test_write_file(exp, text);
    cr_assert_eq(run_quiet("sweep", exp, "-o", out, NULL, NULL, NULL), 0);
    static char so[1 << 16], se[1 << 14];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "plot", "hit-rate-curves", "--csv",
                                 out, "-o", dir, NULL),
                 0, "%s", se);
    char png[4200];
    snprintf(png, sizeof png, "%s/hit-rate-curves.png", dir);
    cr_assert(test_file_exists(png), "%s not made", png);
}

Test(sweep, rows_of_an_edited_experiment_are_kept_and_reported) {
    char tpath[4096], exp[4096], out[4096];
    snprintf(tpath, sizeof tpath, "%s", test_tmp_path("edit.h5"));
    snprintf(exp, sizeof exp, "%s", test_tmp_path("edit.ini"));
    snprintf(out, sizeof out, "%s", test_tmp_path("edit.csv"));
    write_model_trace("olmoe-1b-7b", tpath, 2, 8, 8, 3);
    char text[8192];
    snprintf(text, sizeof text,
             "[experiment]\nevaluator = trace-stats\n[fixed]\ntrace = %s\n"
             "[axes]\nstats.capacity = 1, 2\n",
             tpath);
    test_write_file(exp, text);
    cr_assert_eq(run_quiet("sweep", exp, "-o", out, NULL, NULL, NULL), 0);
    snprintf(text, sizeof text,
             "[experiment]\nevaluator = trace-stats\n[fixed]\ntrace = %s\n"
             "[axes]\nstats.capacity = 2, 3\n",
             tpath);
    test_write_file(exp, text);
    static char so[1 << 16], se[1 << 14];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", exp, "-o", out, NULL), 0);
    cr_assert(strstr(so, "1 already done, 1 run"), "%s", so);
    cr_assert(strstr(se, "1 rows are not configurations"), "%s", se);
    cr_assert_eq(count_lines(out), 1 + 3);
}

Test(sweep, relative_inputs_resolve_against_the_experiment_files_folder_or_the_working_one) {
    char dir[4096], tpath[4200], exp[4200], out[4200];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("relative-inputs"));
    mkdir(dir, 0755);
    snprintf(tpath, sizeof tpath, "%s/t.h5", dir);
    snprintf(exp, sizeof exp, "%s/e.ini", dir);
    snprintf(out, sizeof out, "%s/e.csv", dir);
    write_model_trace("olmoe-1b-7b", tpath, 2, 8, 8, 3);
    /* the test runs moesim in the build folder: t.h5 is only beside the experiment */
    test_write_file(exp, "[experiment]\nevaluator = trace-stats\n[fixed]\ntrace = t.h5\n"
                         "[axes]\nstats.capacity_share = 0.5, 1.0\n");
    static char so[1 << 16], se[1 << 14];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", exp, "-o", out, "-q", NULL),
                 0, "%s", se);
    char *csv = read_file(out);
    cr_assert(strstr(csv, ",ok,"), "%s", csv);
    free(csv);
    /* inputs = cwd: the same name now means the working directory's t.h5, which is not there */
    test_write_file(exp, "[experiment]\nevaluator = trace-stats\ninputs = cwd\n[fixed]\n"
                         "trace = t.h5\n[axes]\nstats.capacity_share = 0.5, 1.0\n");
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", exp, "-o", out, "-q", NULL),
                 2);
    cr_assert(strstr(se, "t.h5: cannot open"), "%s", se);
}

/* Adds the dotted names of the numbers under `j` (prefix "a.b") to names, comma-joined. */
static void json_metric_names(json_t *j, const char *prefix, char *names, size_t cap) {
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) {
        char name[256];
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", key);
        if (json_is_object(v))
            json_metric_names(v, name, names, cap);
        else if (json_is_number(v) || json_is_null(v))
            snprintf(names + strlen(names), cap - strlen(names), "%s%s", *names ? "," : "", name);
    }
}

Test(sweep, the_csv_has_a_column_for_every_metric_of_sim_json_under_the_same_name) {
    char tpath[4096], exp[4096], out[4096];
    snprintf(tpath, sizeof tpath, "%s", test_tmp_path("metrics.h5"));
    snprintf(exp, sizeof exp, "%s", test_tmp_path("metrics.ini"));
    snprintf(out, sizeof out, "%s", test_tmp_path("metrics.csv"));
    remove(out);
    write_model_trace("olmoe-1b-7b", tpath, 2, 8, 8, 5);
    char text[8192];
    snprintf(text, sizeof text,
             "[fixed]\npolicy = lru\nmodel = olmoe-1b-7b\nhw = rtx3090-pcie4\ntrace = %s\n", tpath);
    test_write_file(exp, text);
    cr_assert_eq(run_quiet("sweep", exp, "-o", out, "-q", NULL, NULL), 0);
    static char so[1 << 17], se[1 << 14];
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sim", "--trace", tpath, "--hw",
                                 "rtx3090-pcie4", "--policy", "lru", "--json", NULL),
                 0, "%s", se);
    json_error_t je;
    json_t *j = json_loads(so, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    /* the metrics: every number of the JSON but the run's inputs and the policy's own report */
    json_object_del(j, "inputs");
    json_object_del(j, "moesim");
    json_object_del(j, "policy_report");
    static char from_json[8192];
    from_json[0] = '\0';
    json_metric_names(j, "", from_json, sizeof from_json);
    json_decref(j);
    /* the CSV's: the columns between the configuration's (…,trace) and policy_report */
    char *csv = read_file(out);
    *strchr(csv, '\n') = '\0';
    char *from = strstr(csv, ",trace,"), *to = strstr(csv, ",policy_report");
    cr_assert(from && to && to > from, "%s", csv);
    *to = '\0';
    cr_assert_str_eq(from + strlen(",trace,"), from_json);
    cr_assert(strstr(csv, "status,code,moesim,"), "no code and version columns: %s", csv);
    free(csv);
}

Test(sweep, a_row_of_another_policy_or_simulator_version_reruns_unless_kept_on_purpose) {
    cli_fixture f;
    make_fixture(&f, "stale");
    const char *out = csv_path("stale", "out");
    remove(out);
    cr_assert_eq(run_quiet("sweep", f.exp, "-o", out, "-q", NULL, NULL), 0);
    /* rewrite every row as an older lru made it: its code column and its hash under that code */
    sweep_experiment *e = NULL;
    moesim_error err = {0};
    cr_assert_eq(sweep_experiment_load(f.exp, &e, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(sweep_experiment_bind_inputs(e, &err), MOESIM_OK, "%s", err.msg);
    char *csv = read_file(out);
    FILE *w = fopen(out, "w");
    cr_assert(w);
    char *save = NULL;
    size_t rows = 0;
    for (char *line = strtok_r(csv, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        uint64_t h;
        if (!sweep_parse_hash(line, 16, &h)) { /* the header */
            fprintf(w, "%s\n", line);
            continue;
        }
        const sweep_point *p = sweep_experiment_find(e, h);
        cr_assert_not_null(p);
        char old[64];
        snprintf(old, sizeof old, "%s", p->code);
        char *v = strstr(old, "lru0");
        if (v) snprintf(v, sizeof old - (size_t)(v - old), "lru-older");
        /* hash,seed,status,code,moesim,...: commas before seed, status, code and moesim */
        char *c1 = line + 16, *c2 = strchr(c1 + 1, ','), *c3 = strchr(c2 + 1, ','),
             *c4 = strchr(c3 + 1, ',');
        fprintf(w, "%016" PRIx64 "%.*s,%s%s\n", sweep_point_hash_with_code(p, old), (int)(c3 - c1),
                c1, old, c4);
        rows += v != NULL;
    }
    fclose(w);
    free(csv);
    sweep_experiment_destroy(e);
    cr_assert_eq(rows, f.n_configs / 2, "the lru half of the configurations");
    static char so[1 << 16], se[1 << 14];
    /* kept on purpose: nothing runs */
    cr_assert_eq(test_run_moesim(so, sizeof so, se, sizeof se, "sweep", f.exp, "-o", out,
                                 "--reuse-stale", "-q", NULL),
                 0, "%s", se);
    cr_assert(strstr(so, ", 0 run in"), "%s", so);
    cr_assert(strstr(se, "kept as done (--reuse-stale)"), "%s", se);
    /* by default: the lru configurations run again, the old rows stay */
    cr_assert_eq(
        test_run_moesim(so, sizeof so, se, sizeof se, "sweep", f.exp, "-o", out, "-q", NULL), 0,
        "%s", se);
    char want[64];
    snprintf(want, sizeof want, ", %zu run in", rows);
    cr_assert(strstr(so, want), "expected '%s' in: %s", want, so);
    cr_assert(strstr(se, "older simulator or policy version"), "%s", se);
}
