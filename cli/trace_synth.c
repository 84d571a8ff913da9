/* `moesim trace synth`: writes a synthetic router trace for any model of configs/models whose
 * statistics match published measurements (the model and its knobs: traces/SYNTH.md). With
 * --report it also computes the trace's statistics (traces/stats.h, as `moesim trace stats`
 * does) and prints each published target next to what the trace achieves (holding the whole
 * trace in memory); without it the trace is streamed to the file request by request
 * (synth_write), so memory stays small whatever the trace length. With --fit REAL.h5 the knobs
 * are fitted to a real trace instead (traces/synth_fit.h; the real trace is read as a stream),
 * printed with the statistic each was fitted to, and --report compares the real trace with the
 * generated one (both held whole); --save-knobs and
 * --knobs store and reuse fitted knobs. The output is written crash-safely; bad input gives one
 * line on stderr, exit status 2, and no file. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "common/model.h"
#include "traces/stats.h"
#include "traces/synth.h"
#include "traces/synth_fit.h"
#include "traces/trace.h"

static const char synth_help[] =
    "usage: moesim trace synth --model NAME --requests R --prompt-len P --gen-len G\n"
    "                          [--workload text|math|code|mix] [--seed S] [--lookahead D]\n"
    "                          [--lookahead-k K] [--set KNOB=VALUE]... [--knobs FILE]\n"
    "                          [--interleave B] [--report] [-q] -o OUT.h5\n"
    "       moesim trace synth --fit REAL.h5 [--model NAME] [--save-knobs FILE] [options above]\n"
    "\n"
    "Synthesizes a router trace for a model of configs/models (a name, or a path to an .ini):\n"
    "R requests, each P prefill tokens then G decode tokens, with top-k experts and gate weights\n"
    "per MoE layer, token importance, and look-ahead predictions for distances 1..D (K'\n"
    "candidates each). Lengths are fixed (128) or ranges drawn uniformly (64:1024). The knobs\n"
    "start from the model family's calibrated defaults; traces/SYNTH.md lists every knob. The\n"
    "same arguments give a byte-identical file.\n"
    "\n"
    "options:\n"
    "  --model NAME       model config (required)\n"
    "  --requests R       number of requests (default 64)\n"
    "  --prompt-len P     prefill tokens per request, N or MIN:MAX (default 64:512)\n"
    "  --gen-len G        decode tokens per request, N or MIN:MAX (default 128)\n"
    "  --workload W       text, math, code or mix (default text): which hot sets are used\n"
    "  --seed S           random seed (default 1)\n"
    "  --lookahead D      look-ahead distances 0..16 (default 3; 0: no predictions)\n"
    "  --lookahead-k K    candidates per distance (default min(16, E))\n"
    "  --set KNOB=VALUE   override a knob of the generative model (repeatable)\n"
    "  --knobs FILE       knobs from a file (--save-knobs writes one; [synth] knob = value)\n"
    "  --interleave B     store the requests in the execution order of decode batches of B\n"
    "                     (default 1: one after another; with --fit: the real trace's)\n"
    "  --fit REAL.h5      fit the knobs to a real trace and print them, each with the\n"
    "                     statistic it was fitted to; the defaults of the other options\n"
    "                     become the real trace's shape (requests, lengths, look-ahead);\n"
    "                     --model defaults to the model the trace names\n"
    "  --save-knobs FILE  with --fit: write the fitted knobs for --knobs\n"
    "  --report           print published target vs achieved for every calibrated statistic\n"
    "                     (with --fit: the real trace vs the generated one)\n"
    "  -o, --output FILE  the trace to write (may be left out with --report or --fit)\n"
    "  -q, --quiet        no progress bar (it is drawn only when stderr is a terminal)\n"
    "  -h, --help         this text\n"
    "\n"
    "exit status: 0 on success, 2 on bad input (one line on stderr; nothing is written).\n";

#define CMD "trace synth"

/* A whole decimal number (config_parse_u64) into *out, at most max. */
static bool parse_u64(const char *s, uint64_t max, uint64_t *out) {
    uint64_t v;
    if (!config_parse_u64(s, &v) || v > max) return false;
    *out = v;
    return true;
}

/* "N" or "MIN:MAX" */
static bool parse_range(const char *s, synth_range *r) {
    char buf[64];
    if (strlen(s) >= sizeof buf) return false;
    snprintf(buf, sizeof buf, "%s", s);
    char *colon = strchr(buf, ':');
    uint64_t lo, hi;
    if (colon) {
        *colon = '\0';
        if (!parse_u64(buf, UINT32_MAX, &lo) || !parse_u64(colon + 1, UINT32_MAX, &hi))
            return false;
    } else {
        if (!parse_u64(buf, UINT32_MAX, &lo)) return false;
        hi = lo;
    }
    *r = (synth_range){(uint32_t)lo, (uint32_t)hi};
    return true;
}

static void print_range(const char *what, synth_range r) {
    if (r.min == r.max)
        printf("%s %" PRIu32, what, r.min);
    else
        printf("%s %" PRIu32 ":%" PRIu32, what, r.min, r.max);
}

static void print_report(const model_geometry *m, const synth_options *o, const trace *t) {
    trace_stats *s = trace_stats_compute(t);
    bool own = false;
    const char *fam = synth_family_defaults_for(m->family, &own);
    printf("calibration report: %s (family %s, defaults of %s%s), workload %s, seed %" PRIu64
           ", %" PRIu64 " tokens (%" PRIu64 " decode), %" PRIu32 " requests, ",
           m->name, m->family, fam, own ? "" : ": no published figures of its own",
           synth_workload_name(o->workload), o->seed, s->tokens, s->decode_tokens, s->requests);
    print_range("prompt", o->prompt_len);
    print_range(", gen", o->gen_len);
    printf("\n%-40s %17s %9s %9s  %s\n", "statistic", "target", "achieved", "verdict", "source");
    synth_target tg[64];
    size_t n = synth_targets_evaluate(m, o->workload, s, tg, MOESIM_ARRAY_LEN(tg));
    if (n > MOESIM_ARRAY_LEN(tg)) n = MOESIM_ARRAY_LEN(tg);
    for (size_t i = 0; i < n; i++) {
        char target[48];
        if (tg[i].low == tg[i].high && tg[i].tolerance > 0)
            snprintf(target, sizeof target, "%.1f%% ±%.1f", 100 * tg[i].low, 100 * tg[i].tolerance);
        else if (tg[i].low == tg[i].high)
            snprintf(target, sizeof target, "%.2f%%", 100 * tg[i].low);
        else if (tg[i].high > 1.0) /* ratios (max/mean) */
            snprintf(target, sizeof target, "%.2f-%.2fx", tg[i].low, tg[i].high);
        else
            snprintf(target, sizeof target, "%.0f-%.0f%%", 100 * tg[i].low, 100 * tg[i].high);
        if (tg[i].high > 1.0)
            printf("%-40s %17s %8.2fx %9s  %s\n", tg[i].statistic, target, tg[i].achieved,
                   tg[i].pass ? "ok" : "OFF", tg[i].source);
        else
            printf("%-40s %17s %8.2f%% %9s  %s\n", tg[i].statistic, target, 100 * tg[i].achieved,
                   tg[i].pass ? "ok" : "OFF", tg[i].source);
    }
    if (n == 0) printf("(no published figure applies to %s)\n", m->name);
    printf("other figures: active share by B");
    for (int b = 0; b < STATS_N_BATCH; b++) {
        if (isnan(s->active_share[b]))
            printf(" %u:absent", trace_stats_batch_sizes[b]);
        else
            printf(" %u:%.1f%%", trace_stats_batch_sizes[b], 100 * s->active_share[b]);
    }
    printf("; top10 share %.1f%%, max/mean %.2f, min/mean %.2f; reuse top-1 %.1f%%, any %.1f%%",
           100 * s->top10_share, s->max_over_mean, s->min_over_mean, 100 * s->reuse_top1,
           100 * s->reuse_any);
    for (uint32_t d = 0; d < s->lookahead_depth; d++)
        printf("; look-ahead d=%u top-1 %.1f%% recall %.1f%%", d + 1, 100 * s->lookahead_top1[d],
               100 * s->lookahead_recall[d]);
    printf("\n");
    trace_stats_destroy(s);
}

/* Prints the fitted knobs, each with the statistic it was fitted to. */
static void print_fit(const char *real_path, const trace *real, const synth_fit_result *f) {
    /* real: its counts (a stream's skeleton) */
    printf("fitted to %s: %" PRIu64 " tokens, %" PRIu32 " requests, decode batch %" PRIu32
           " (%" PRIu32 " simulations, seed 1; traces/SYNTH.md)\n",
           real_path, real->n_tokens, real->n_requests, f->interleave, f->simulations);
    printf("%-30s %10s  %-48s %9s %9s\n", "knob", "value", "fitted to", "real", "fit");
    for (size_t i = 0; i < f->n_entries; i++) {
        const synth_fit_entry *e = &f->entries[i];
        if (e->fitted)
            printf("%-30s %10.4f  %-48s %9.4f %9.4f\n", e->knob, e->value, e->statistic, e->real,
                   e->achieved);
        else
            printf("%-30s %10.4f  %-48s %9s %9s\n", e->knob, e->value, e->statistic, "absent",
                   "default");
    }
}

static void print_number(double x) {
    if (isnan(x))
        printf(" %9s", "-");
    else
        printf(" %9.4f", x);
}

/* Real vs synthetic, side by side, with the knob fitted to each statistic. */
static void print_fit_report(const trace *real, const trace *t, const synth_options *o) {
    const size_t cap = 2 * (size_t)real->meta.n_experts + 64; /* two curves and the rest */
    synth_fit_row *rows = moesim_xcalloc(cap, sizeof *rows);
    size_t n = synth_fit_compare(real, t, rows, cap);
    MOESIM_ASSERT(n <= cap);
    printf("report: real (%" PRIu64 " tokens) vs synthetic (%" PRIu64 " tokens, seed %" PRIu64
           ")\n%-32s %9s %9s %9s %8s  %s\n",
           real->n_tokens, t->n_tokens, o->seed, "statistic", "real", "synthetic", "|gap|",
           "verdict", "knob fitted to it");
    for (size_t i = 0; i < n; i++) {
        const synth_fit_row *r = &rows[i];
        const double gap = fabs(r->synthetic - r->real);
        printf("%-32s", r->statistic);
        print_number(r->real);
        print_number(r->synthetic);
        print_number(gap);
        printf(" %8s  %s\n",
               r->tolerance == 0 || isnan(gap) ? "-"
               : gap <= r->tolerance           ? "ok"
                                               : "OFF",
               r->knob);
    }
    free(rows);
}

int cmd_trace_synth(int argc, char **argv) {
    const char *model_name = NULL, *out_path = NULL;
    const char *requests = NULL, *prompt = NULL, *gen = NULL, *workload = NULL, *seed = NULL;
    const char *depth = NULL, *lk = NULL, *fit_path = NULL, *knobs_path = NULL;
    const char *save_path = NULL, *interleave_arg = NULL;
    const char **sets = NULL;
    size_t n_sets = 0;
    bool report = false, quiet = false;
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(synth_help, stdout);
            free(sets);
            return 0;
        }
        if (!strcmp(a, "--report")) {
            report = true;
            continue;
        }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
            continue;
        }
        const char **slot = !strcmp(a, "--model")                        ? &model_name
                            : !strcmp(a, "-o") || !strcmp(a, "--output") ? &out_path
                            : !strcmp(a, "--requests")                   ? &requests
                            : !strcmp(a, "--prompt-len")                 ? &prompt
                            : !strcmp(a, "--gen-len")                    ? &gen
                            : !strcmp(a, "--workload")                   ? &workload
                            : !strcmp(a, "--seed")                       ? &seed
                            : !strcmp(a, "--lookahead")                  ? &depth
                            : !strcmp(a, "--lookahead-k")                ? &lk
                            : !strcmp(a, "--fit")                        ? &fit_path
                            : !strcmp(a, "--knobs")                      ? &knobs_path
                            : !strcmp(a, "--save-knobs")                 ? &save_path
                            : !strcmp(a, "--interleave")                 ? &interleave_arg
                                                                         : NULL;
        bool is_set = !strcmp(a, "--set");
        if (!slot && !is_set) {
            free(sets);
            return cli_usage_error(
                CMD, a[0] == '-' ? "unknown option '%s'" : "unexpected argument '%s'", a);
        }
        if (i + 1 >= argc) {
            free(sets);
            return cli_usage_error(CMD, "option '%s' needs a value", a);
        }
        if (is_set)
            cli_collect(&sets, &n_sets, argv[++i]);
        else
            *slot = argv[++i];
    }
    const char *usage_problem = !model_name && !fit_path ? "--model is required (or --fit REAL.h5)"
                                : !out_path && !report && !fit_path
                                    ? "-o OUT.h5 is required (or --report alone)"
                                : fit_path && knobs_path ? "--fit and --knobs exclude each other"
                                : save_path && !fit_path ? "--save-knobs needs --fit"
                                                         : NULL;
    if (usage_problem) {
        free(sets);
        return cli_usage_error(CMD, "%s", usage_problem);
    }

    moesim_error err = {0};
    trace_stream *real_stream = NULL; /* the real trace of --fit */
    const trace *real_tokens = NULL;  /* its meta and counts */
    trace *real = NULL, *t = NULL;    /* the real trace whole (--fit --report), the output */
    model_geometry m;
    synth_options o;
    synth_fit_result *fit = NULL;
    float *table = NULL;        /* a popularity table from --knobs */
    double *layer_table = NULL; /* per-layer knobs from --knobs, or a copy --set changed */
    char *model_text = NULL;
    uint32_t interleave = 1;
    uint64_t v;
#define BAD(...)                                                                                   \
    do {                                                                                           \
        rc = cli_usage_error(CMD, __VA_ARGS__);                                                    \
        goto done;                                                                                 \
    } while (0)
#define FAIL()                                                                                     \
    do {                                                                                           \
        rc = cli_fail(&err);                                                                       \
        goto done;                                                                                 \
    } while (0)
    const char *outputs[] = {out_path, save_path}, *inputs[] = {fit_path, knobs_path};
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(outputs); i++)
        for (size_t j = 0; j < MOESIM_ARRAY_LEN(inputs); j++)
            if (outputs[i] && inputs[j] && atomic_file_check_not_input(outputs[i], inputs[j], &err))
                FAIL();
    if (fit_path) {
        if (trace_stream_open(fit_path, &real_stream, &err)) FAIL();
        real_tokens = trace_stream_tokens(real_stream);
    }
    if (model_name ? model_load_by_name(model_name, &m, &err)
                   : trace_model_load(real_tokens, fit_path, NULL, &m, &err))
        FAIL();
    synth_options_default(&o, &m);
    if (fit_path) {
        fit = moesim_xcalloc(1, sizeof *fit);
        if (synth_fit_stream(real_stream, &m, fit_path, fit, &err)) FAIL();
        o = fit->options;
        interleave = fit->interleave;
    }
    if (knobs_path && synth_knobs_load(knobs_path, &m, &o, &table, &layer_table, &interleave, &err))
        FAIL();
    if (requests) {
        if (!parse_u64(requests, UINT32_MAX, &v) || v == 0)
            BAD("--requests: expected a whole number >= 1, got '%s'", requests);
        o.n_requests = (uint32_t)v;
    }
    if (prompt && !parse_range(prompt, &o.prompt_len))
        BAD("--prompt-len: expected N or MIN:MAX, got '%s'", prompt);
    if (gen && !parse_range(gen, &o.gen_len))
        BAD("--gen-len: expected N or MIN:MAX, got '%s'", gen);
    if (workload && !synth_workload_parse(workload, &o.workload))
        BAD("--workload: expected text, math, code or mix, got '%s'", workload);
    if (seed) {
        if (!parse_u64(seed, UINT64_MAX, &v))
            BAD("--seed: expected a whole number, got '%s'", seed);
        o.seed = v;
    }
    if (depth) {
        if (!parse_u64(depth, TRACE_MAX_LOOKAHEAD_DEPTH, &v))
            BAD("--lookahead: expected 0..%u, got '%s'", TRACE_MAX_LOOKAHEAD_DEPTH, depth);
        o.lookahead_depth = (uint32_t)v;
    }
    if (lk) {
        if (!parse_u64(lk, TRACE_MAX_LOOKAHEAD_K, &v))
            BAD("--lookahead-k: expected 1..%u, got '%s'", TRACE_MAX_LOOKAHEAD_K, lk);
        o.lookahead_k = (uint32_t)v;
    }
    if (interleave_arg) {
        if (!parse_u64(interleave_arg, UINT32_MAX, &v) || v == 0)
            BAD("--interleave: expected a whole number >= 1, got '%s'", interleave_arg);
        interleave = (uint32_t)v;
    }
    for (size_t i = 0; i < n_sets; i++) {
        char name[64];
        const char *eq = strchr(sets[i], '=');
        if (!eq || eq == sets[i] || (size_t)(eq - sets[i]) >= sizeof name)
            BAD("--set: expected KNOB=VALUE, got '%s'", sets[i]);
        memcpy(name, sets[i], (size_t)(eq - sets[i]));
        name[eq - sets[i]] = '\0';
        double x;
        if (!config_parse_f64(eq + 1, &x))
            BAD("--set %s: expected a number, got '%s'", name, eq + 1);
        if (synth_knob_set(&o.knobs, name, x, &err)) FAIL();
        const int layer_kn = synth_layer_knob_of(name);
        if (layer_kn >= 0 &&
            o.layer_knobs) { /* the profile set replaces the fitted layers' values */
            const size_t n = (size_t)SYNTH_LAYER_KNOBS * m.n_moe_layers;
            if (o.layer_knobs != layer_table) {
                double *copy = moesim_xmalloc(n * sizeof *copy);
                memcpy(copy, o.layer_knobs, n * sizeof *copy);
                free(layer_table);
                layer_table = copy;
                o.layer_knobs = copy;
            }
            for (uint32_t l = 0; l < m.n_moe_layers; l++)
                layer_table[(size_t)layer_kn * m.n_moe_layers + l] = NAN;
        }
    }
    o.show_progress = cli_progress_allowed(quiet);
    if (synth_options_check(&o, &m, &err)) FAIL();
    if (fit) {
        print_fit(fit_path, real_tokens, fit);
        if (save_path && synth_knobs_save(save_path, fit, &m, fit_path, &err)) FAIL();
    }
    if (!out_path && !report) goto done;
    /* the trace carries the model config it was made with: later commands need no --model */
    if (cli_trace_model_text(real_tokens, model_name, &model_text, &err)) FAIL();
    o.model_config = model_text;
    if (!report && interleave == 1) { /* streamed: memory bounded by one request */
        if (synth_write(&m, &o, out_path, &err)) FAIL();
        goto done;
    }
    /* the report's statistics and the interleaved order need the whole trace */
    if (synth_generate_interleaved(&m, &o, interleave, &t, &err)) FAIL();
    if (out_path && trace_write(t, out_path, &err)) FAIL();
    if (report && fit) {
        if (trace_read(fit_path, &real, &err)) FAIL();
        print_fit_report(real, t, &o);
    } else if (report)
        print_report(&m, &o, t);
#undef FAIL
#undef BAD
done:
    trace_destroy(t);
    trace_destroy(real);
    trace_stream_close(real_stream);
    synth_fit_result_free(fit);
    free(fit);
    free(table);
    free(model_text);
    free(layer_table);
    free(sets);
    return rc;
}
