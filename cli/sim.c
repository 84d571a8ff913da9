/* `moesim sim`: one simulator run of a trace under a policy on a hardware profile (sim/sim.h,
 * sim/README.md). Prints a summary, or every figure as JSON with --json; optionally writes a
 * Perfetto timeline (written to a temporary name and renamed only when the run succeeds). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "policies/policy.h"
#include "sim/sim.h"
#include "traces/trace.h"

static const char sim_usage[] =
    "usage: moesim sim --trace T.h5 --hw NAME --policy NAME [--model NAME] [--set key=value ...]\n"
    "                  [--config FILE ...] [--json] [--timeline out.json]\n"
    "       moesim sim --list-policies\n"
    "\n"
    "Simulates serving the trace's requests on the GPU of hardware profile NAME\n"
    "(configs/hw/NAME.ini or a path) while POLICY decides which experts are resident in HBM,\n"
    "what is prefetched and at which precision each expert runs. The model comes from the\n"
    "trace unless --model is given. The model of the simulator: sim/README.md.\n"
    "\n"
    "options:\n"
    "  --trace FILE       router trace (HDF5, traces/FORMAT.md)\n"
    "  --hw NAME          hardware profile\n"
    "  --policy NAME      policy (--list-policies shows them)\n"
    "  --model NAME       model geometry (default: the trace's model)\n"
    "  --set S.K=V        a setting or policy knob (repeatable), e.g. --set lru.scope=global\n"
    "  --config FILE      an INI file of settings and knobs, e.g. a policy preset (repeatable;\n"
    "                     later files and --set entries override earlier ones)\n"
    "  --json             every figure as one JSON object (keys: sim/README.md)\n"
    "  --timeline FILE    Chrome trace-event JSON (open in Perfetto): one track per stream\n"
    "                     and copy engine\n"
    "  --list-policies    the registered policies and their knobs\n"
    "  -h, --help         this text\n"
    "\n"
    "settings (every policy reads them):\n";

static void print_fields(const config_field *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char key[96];
        snprintf(key, sizeof key, "%s.%s", f[i].section, f[i].key);
        printf("  %-26s %s (default %s)\n", key, f[i].help,
               f[i].def && f[i].def[0] ? f[i].def : "none");
    }
}

static void print_help(void) {
    fputs(sim_usage, stdout);
    size_t n;
    const config_field *f = sim_settings_fields(&n);
    print_fields(f, n);
}

static void list_policies(void) {
    size_t n;
    const policy_methods *const *all = policy_all(&n);
    for (size_t i = 0; i < n; i++) {
        printf("%-16s %s\n", all[i]->name, all[i]->summary);
        print_fields(all[i]->knobs, all[i]->n_knobs);
    }
}

static void print_text(const sim_result *r, const char *trace_path, const char *hw) {
    printf("%s on %s, policy %s: %" PRIu64 " tokens of %" PRIu64 " requests in %.3f ms "
           "(%.1f tokens/s)\n",
           trace_path, hw, r->policy, r->tokens, r->requests, r->makespan_ms, r->tokens_per_s);
    printf("TTFT ms mean %.3f p50 %.3f p99 %.3f; TPOT ms mean %.3f p50 %.3f p99 %.3f\n",
           r->ttft.mean_ms, r->ttft.p50_ms, r->ttft.p99_ms, r->tpot.mean_ms, r->tpot.p50_ms,
           r->tpot.p99_ms);
    printf("hit rate %.2f%%, stall %.3f ms, h2d %.3f GB, ssd %.3f GB\n", 100.0 * r->hit_rate,
           r->stall_ms, r->h2d_bytes / 1e9, r->ssd_bytes / 1e9);
    printf("HBM peak %.3f GiB of %.3f GiB budget (experts %.3f GiB)\n",
           r->peak_hbm_bytes / 1073741824.0, r->budget_bytes / 1073741824.0,
           r->expert_budget_bytes / 1073741824.0);
    printf("precision mix (gate mass): hi %.1f%%, lo %.1f%%, skip %.1f%%\n",
           100.0 * r->precision_mix_hi, 100.0 * r->precision_mix_lo, 100.0 * r->precision_mix_skip);
    printf("prefetch: %" PRIu64 " issued, accuracy %.1f%%, utilization %.1f%%; predictor %s "
           "(top-1 %.1f%%)\n",
           r->prefetches, 100.0 * r->prefetch_accuracy, 100.0 * r->prefetch_utilization,
           r->predictor_emulated ? "emulated" : "recorded", 100.0 * r->predictor_accuracy);
    for (size_t i = 0; i < r->n_policy_report; i++)
        printf("%s: %g\n", r->policy_report_names[i], r->policy_report_values[i]);
}

int cmd_sim(int argc, char **argv) {
    static const struct option opts[] = {{"trace", required_argument, NULL, 't'},
                                         {"hw", required_argument, NULL, 'w'},
                                         {"policy", required_argument, NULL, 'p'},
                                         {"model", required_argument, NULL, 'm'},
                                         {"set", required_argument, NULL, 's'},
                                         {"config", required_argument, NULL, 'c'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"timeline", required_argument, NULL, 'T'},
                                         {"list-policies", no_argument, NULL, 'L'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *trace_path = NULL, *hw_name = NULL, *policy_name = NULL, *model_name = NULL,
               *timeline = NULL;
    const char **sets = NULL, **files = NULL;
    size_t n_sets = 0, n_files = 0;
    bool json = false;
    int c, rc = 0;
    optind = 1;
    opterr = 0; /* one line: ours, naming the option */
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            trace_path = optarg;
            break;
        case 'w':
            hw_name = optarg;
            break;
        case 'p':
            policy_name = optarg;
            break;
        case 'm':
            model_name = optarg;
            break;
        case 's':
            cli_collect(&sets, &n_sets, optarg);
            break;
        case 'c':
            cli_collect(&files, &n_files, optarg);
            break;
        case 'j':
            json = true;
            break;
        case 'T':
            timeline = optarg;
            break;
        case 'L':
            list_policies();
            free(sets);
            free(files);
            return 0;
        case 'h':
            print_help();
            free(sets);
            free(files);
            return 0;
        default:
            free(sets);
            free(files);
            return cli_getopt_error("sim", c, argc, argv, opts);
        }
    }
    if (optind < argc)
        rc = cli_usage_error("sim", "unexpected argument '%s'", argv[optind]);
    else if (!trace_path || !hw_name || !policy_name)
        rc = cli_usage_error("sim", "--trace, --hw and --policy are required");
    else if (!policy_lookup(policy_name))
        rc = cli_usage_error("sim", "unknown policy '%s' (known: %s)", policy_name, policy_names());
    if (rc) {
        free(sets);
        free(files);
        return rc;
    }

    moesim_error err = {0};
    config *settings = config_create();
    moesim_status st = cli_settings_load(settings, files, n_files, sets, n_sets, &err);
    free(sets);
    free(files);
    trace_stream *ts = NULL;
    hw_profile hw;
    model_geometry model;
    quant_table quant;
    if (!st)
        st = cli_sim_inputs_stream(trace_path, hw_name, model_name, &ts, &hw, &model, &quant, &err);
    sim_result r;
    if (!st) {
        sim_inputs in = {.trace = trace_stream_tokens(ts),
                         .stream = ts,
                         .model = &model,
                         .hw = &hw,
                         .quant = &quant,
                         .timeline_path = timeline};
        st = sim_run(&in, policy_name, settings, &r, &err);
    }
    if (!st && r.cost_extrapolated)
        fprintf(stderr,
                "moesim sim: warning: the cost table's measurements do not cover %u op curves "
                "this run needs; those times are extrapolated (sim/COST.md)\n",
                r.cost_extrapolated);
    if (st) {
        rc = cli_fail(&err);
    } else if (json) {
        cli_print_json(sim_result_to_json(&r));
    } else {
        print_text(&r, trace_path, hw.name);
    }
    trace_stream_close(ts);
    config_destroy(settings);
    return rc;
}
