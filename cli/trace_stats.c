/* `moesim trace stats FILE [--batch B] [--json]`: skew, reuse, batch activation, look-ahead
 * accuracy and LRU/OPT hit-rate curves of a router trace (definitions: traces/STATS.md), and with
 * --batch the curves under the simulator's batched steps (sim/batch_curves.h). The text form is
 * a summary for people; --json prints every figure (trace_stats_to_json). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/config.h"
#include "core/provenance.h"
#include "sim/batch_curves.h"
#include "traces/layer_twins.h"
#include "traces/stats.h"
#include "traces/trace.h"


static const char stats_help[] =
    "usage: moesim trace stats FILE [--batch B] [--json]\n"
    "\n"
    "Per layer and overall: tokens, activation counts per expert, skew (Gini, share of the top\n"
    "10% experts, max/mean), same-expert reuse between consecutive tokens of a request, LRU\n"
    "reuse distance, the share of a layer's experts touched per decode iteration when B\n"
    "requests run together (B = 1..32; absent when the trace has fewer requests), look-ahead\n"
    "predictor accuracy per distance (when the trace has predictions), and hit-rate curves of a\n"
    "per-layer expert cache under LRU and Belady's OPT: with a token's top-k experts resident\n"
    "together (the simulator's rule; capacities top_k..E), and LRU per slot (1..E).\n"
    "Definitions: traces/STATS.md.\n"
    "\n"
    "options:\n"
    "  --batch B  also the LRU / OPT curves when the simulator runs B requests together: each\n"
    "             step's experts at a layer resident at once (capacities from the widest step)\n"
    "  --json     every figure as one JSON object (keys in traces/STATS.md)\n"
    "  -h, --help this text\n";

static void print_share(double v) {
    if (isnan(v))
        printf("  %7s", "absent");
    else
        printf("  %6.1f%%", 100.0 * v);
}

/* One line of a curve pair at capacities from, 2 from, 4 from, ... and E. */
static void print_curves(const char *title, const double *lru, const double *opt, uint32_t from,
                         uint32_t n_experts) {
    printf("%s:", title);
    for (uint32_t c = from;; c = 2 * c < n_experts ? 2 * c : n_experts) {
        printf("  %" PRIu32 ": %.1f%% / %.1f%%", c, 100.0 * lru[c], 100.0 * opt[c]);
        if (c == n_experts) break;
    }
    printf("\n");
}

static void print_batch_curves(const sim_batch_curves *b) {
    char title[128];
    snprintf(title, sizeof title,
             "hit rate at batch %" PRIu32 " (%" PRIu64 " steps; capacity: LRU / OPT)", b->batch,
             b->steps);
    if (b->accesses == 0)
        printf("%s: no accesses\n", title);
    else
        print_curves(title, b->lru, b->opt, b->from, b->n_experts);
}

/* `batched`: the --batch curves, or NULL. */
static void print_text(const char *path, const trace_stats *s, const sim_batch_curves *batched) {
    printf("%s: %" PRIu64 " tokens (%" PRIu64 " prefill, %" PRIu64 " decode), %" PRIu32
           " requests, %" PRIu32 " MoE layers, %" PRIu32 " experts, top-%" PRIu32 "\n",
           path, s->tokens, s->prefill_tokens, s->decode_tokens, s->requests, s->layers, s->experts,
           s->top_k);
    printf("skew (mean over layers): gini %.3f, top-10%% share %.1f%%, max/mean %.2f, "
           "min/mean %.2f\n",
           s->gini, 100.0 * s->top10_share, s->max_over_mean, s->min_over_mean);
    printf("reuse between consecutive tokens: top-1 %.1f%%, any %.1f%%; mean reuse distance "
           "%.2f\n",
           100.0 * s->reuse_top1, 100.0 * s->reuse_any, s->mean_reuse_distance);
    printf("experts touched per decode iteration, batch");
    for (int b = 0; b < STATS_N_BATCH; b++) printf("  %7" PRIu32, trace_stats_batch_sizes[b]);
    printf("\n%44s", "");
    for (int b = 0; b < STATS_N_BATCH; b++) print_share(s->active_share[b]);
    printf("\n");
    if (s->lookahead_depth) {
        printf("look-ahead accuracy by distance (top-1 / recall@k):");
        for (uint32_t d = 0; d < s->lookahead_depth; d++)
            printf("  d=%" PRIu32 " %.1f%% / %.1f%%", d + 1, 100.0 * s->lookahead_top1[d],
                   100.0 * s->lookahead_recall[d]);
        printf("\n");
    } else {
        printf("look-ahead accuracy: the trace has no predictions\n");
    }
    print_curves("hit rate of a per-layer cache (capacity: LRU / OPT)", s->lru_hit_rate,
                 s->opt_hit_rate, s->top_k, s->experts);
    printf("LRU per slot, nothing pinned (capacity: hit rate):");
    for (uint32_t c = 1;; c = 2 * c < s->experts ? 2 * c : s->experts) {
        printf("  %" PRIu32 ": %.1f%%", c, 100.0 * s->lru_slot_hit_rate[c]);
        if (c == s->experts) break;
    }
    printf("\n");
    if (batched) print_batch_curves(batched);
    printf("\n%5s %7s %7s %8s %8s %7s %7s %9s %9s\n", "layer", "gini", "top10%", "max/mean",
           "reuse-1", "reuse*", "dist", "LRU@2k", "OPT@2k");
    uint32_t cap = 2 * s->top_k < s->experts ? 2 * s->top_k : s->experts;
    for (uint32_t l = 0; l < s->layers; l++) {
        const layer_stats *ls = &s->per_layer[l];
        printf("%5" PRIu32 " %7.3f %6.1f%% %8.2f %7.1f%% %6.1f%% %7.2f %8.1f%% %8.1f%%\n", l,
               ls->gini, 100.0 * ls->top10_share, ls->max_over_mean, 100.0 * ls->reuse_top1,
               100.0 * ls->reuse_any, ls->mean_reuse_distance, 100.0 * ls->lru_hit_rate[cap],
               100.0 * ls->opt_hit_rate[cap]);
    }
}

static json_t *batch_curves_json(const sim_batch_curves *b) {
    json_t *j = json_object(), *lru = json_object(), *opt = json_object();
    json_object_set_new(j, "batch", json_integer(b->batch));
    json_object_set_new(j, "steps", json_integer((json_int_t)b->steps));
    json_object_set_new(j, "from", json_integer(b->from));
    for (uint32_t c = b->from ? b->from : 1; b->accesses && c <= b->n_experts; c++) {
        char key[16];
        snprintf(key, sizeof key, "%" PRIu32, c);
        json_object_set_new(lru, key, json_real(b->lru[c]));
        json_object_set_new(opt, key, json_real(b->opt[c]));
    }
    json_object_set_new(j, "lru_hit_rate", lru);
    json_object_set_new(j, "opt_hit_rate", opt);
    return j;
}

int cmd_trace_stats(int argc, char **argv) {
    const char *path = NULL, *batch_text = NULL;
    bool as_json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(stats_help, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json"))
            as_json = true;
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch_text = argv[++i];
        else if (!strcmp(argv[i], "--batch"))
            return cli_usage_error("trace stats", "option '--batch' needs a value");
        else if (argv[i][0] == '-' && argv[i][1])
            return cli_usage_error("trace stats", "unknown option '%s'", argv[i]);
        else if (path)
            return cli_usage_error("trace stats", "one FILE expected, got '%s' and '%s'", path,
                                   argv[i]);
        else
            path = argv[i];
    }
    if (!path) return cli_usage_error("trace stats", "missing FILE");
    uint64_t batch = 0;
    if (batch_text && (!config_parse_u64(batch_text, &batch) || batch < 1 || batch > 65536))
        return cli_usage_error("trace stats",
                               "--batch: expected an integer in [1, 65536], got '%s'", batch_text);
    moesim_error err = {0};
    /* --batch simulates the batched steps over the trace in memory; without it the figures
     * come from a stream, in memory that does not grow with the trace */
    trace *t = NULL;
    trace_stream *ts = NULL;
    trace_stats *s = NULL;
    sim_batch_curves b = {0};
    if (batch) {
        if (trace_read(path, &t, &err)) return cli_fail(&err);
        s = trace_stats_compute(t);
        sim_batch_curves_compute(t, (uint32_t)batch, &b);
    } else if (trace_stream_open(path, &ts, &err) || trace_stats_compute_stream(ts, &s, &err)) {
        trace_stream_close(ts);
        return cli_fail(&err);
    }
    if (as_json) {
        json_t *j = trace_stats_to_json(s);
        if (batch) json_object_set_new(j, "batched", batch_curves_json(&b));
        if (t)
            trace_layer_twins_add_json(t, j);
        else
            trace_layer_twins_add_json_stream(ts, s->layer_hash, j);
        json_t *inputs = json_object();
        json_object_set_new(inputs, "trace", provenance_file_json(path));
        json_object_set_new(inputs, "batch", batch ? json_integer((json_int_t)batch) : json_null());
        cli_print_json(provenance_attach(j, inputs));
    } else {
        print_text(path, s, batch ? &b : NULL);
        uint32_t twins[TRACE_LAYER_TWINS_LISTED][2], listed = 0;
        if (t)
            trace_layer_twins_find(t, twins, TRACE_LAYER_TWINS_LISTED, &listed);
        else
            trace_layer_twins_find_stream(ts, s->layer_hash, twins, TRACE_LAYER_TWINS_LISTED,
                                          &listed);
        for (uint32_t i = 0; i < listed; i++)
            printf("warning: MoE layers %" PRIu32 " and %" PRIu32 " have identical routing in "
                   "every token (a layer copied in the log?): their figures are one layer's\n",
                   twins[i][0], twins[i][1]);
    }
    sim_batch_curves_free(&b);
    trace_stats_destroy(s);
    trace_destroy(t);
    trace_stream_close(ts);
    return 0;
}
