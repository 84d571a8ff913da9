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
#include "cli/sim_options.h"
#include "common/check.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "core/provenance.h"
#include "policies/policy.h"
#include "sim/inputs.h"
#include "sim/sim.h"
#include "traces/trace.h"

static const char sim_usage[] =
    "usage: moesim sim --trace T.h5 --hw NAME --policy NAME [--model NAME] [--set key=value ...]\n"
    "                  [--config FILE ...] [--json] [--timeline FILE [--timeline-window W]] [-q]\n"
    "       moesim sim --list-policies [--policy-lib FILE.so]\n"
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
    "  --model NAME       model geometry (default: the trace's model, else the config it stores)\n"
    "  --set S.K=V        a setting or policy knob (repeatable), e.g. --set lru.scope=global\n"
    "  --config FILE      an INI file of settings and knobs, or a policy preset by name\n"
    "                     (configs/policies/NAME.ini on the data search path; repeatable:\n"
    "                     later files and --set entries override earlier ones)\n"
    "  --json             every figure as one JSON object (keys: sim/README.md), with the run's\n"
    "                     inputs and the build that made it\n"
    "  --policy-lib FILE.so  a policy plug-in (policies/WRITING.md); --policy defaults to it\n"
    "  -q, --quiet        no progress (a bar on a terminal, else a line every 10 s)\n";
static const char sim_usage_tail[] =
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
    cli_sim_options_timeline_help(stdout, 21);
    fputs(sim_usage_tail, stdout);
    size_t n;
    const config_field *f = sim_settings_fields(&n);
    print_fields(f, n);
}

static void print_text(const sim_result *r, const char *trace_path, const char *hw) {
    char a[32], b[32], c[32], d[32];
    printf("%s on %s, policy %s: %" PRIu64 " tokens of %" PRIu64 " requests in %s "
           "(%.1f tokens/s)\n",
           trace_path, hw, r->policy, r->tokens, r->requests,
           cli_format_ms(r->makespan_ms, a, sizeof a), r->tokens_per_s);
    printf("TTFT mean %s p50 %s p99 %s; ", cli_format_ms(r->ttft.mean_ms, a, sizeof a),
           cli_format_ms(r->ttft.p50_ms, b, sizeof b), cli_format_ms(r->ttft.p99_ms, c, sizeof c));
    printf("TPOT mean %s p50 %s p99 %s\n", cli_format_ms(r->tpot.mean_ms, a, sizeof a),
           cli_format_ms(r->tpot.p50_ms, b, sizeof b), cli_format_ms(r->tpot.p99_ms, c, sizeof c));
    printf("hit rate %.2f%%, stall %s, h2d %.3f GB, ssd %.3f GB\n", 100.0 * r->hit_rate,
           cli_format_ms(r->stall_ms, d, sizeof d), r->h2d_bytes / 1e9, r->ssd_bytes / 1e9);
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

/* The first option of a run given (a listing takes none of them), or NULL. */
static const char *run_option_given(const cli_sim_options *o, const char *model_name) {
    if (o->trace_path) return "--trace";
    if (o->hw_name) return "--hw";
    if (o->policy_name) return "--policy";
    if (model_name) return "--model";
    if (o->n_sets) return "--set";
    if (o->n_files) return "--config";
    if (o->json) return "--json";
    if (o->timeline_path) return "--timeline";
    if (o->timeline_window_text) return "--timeline-window";
    return NULL;
}

int cmd_sim(int argc, char **argv) {
    static const struct option own[] = {{"model", required_argument, NULL, 'm'},
                                        {"list-policies", no_argument, NULL, 'L'},
                                        {"help", no_argument, NULL, 'h'}};
    struct option opts[CLI_SIM_OPTIONS_MAX + MOESIM_ARRAY_LEN(own) + 1];
    cli_sim_options o;
    cli_sim_options_start(&o, CLI_SIM_RUN | CLI_SIM_TIMELINE | CLI_SIM_PLUGIN, own,
                          MOESIM_ARRAY_LEN(own), opts);
    const char *model_name = NULL;
    bool list = false;
    int c, rc = 0;
    while ((c = cli_sim_options_next(&o, argc, argv, opts)) != -1) {
        switch (c) {
        case 'm':
            model_name = optarg;
            break;
        case 'L':
            list = true;
            break;
        case 'h':
            print_help();
            cli_sim_options_free(&o);
            return 0;
        default:
            cli_sim_options_free(&o);
            return cli_getopt_error("sim", c, argc, argv, opts);
        }
    }
    const char *unused = list ? run_option_given(&o, model_name) : NULL;
    if (optind < argc)
        rc = cli_usage_error("sim", "unexpected argument '%s'", argv[optind]);
    else if (unused) /* a listing reads none: taking one in silence hides a typo'd command */
        rc = cli_usage_error("sim", "--list-policies takes only --policy-lib, got %s", unused);
    else
        rc = cli_sim_options_check("sim", &o, !list);
    if (!rc && list) {
        cli_sim_options_list_policies(&o, stdout);
        cli_sim_options_free(&o);
        return 0;
    }
    if (rc) {
        cli_sim_options_free(&o);
        return rc;
    }

    moesim_error err = {0};
    config *settings = config_create();
    moesim_status st = cli_sim_options_settings(&o, settings, &err);
    trace_stream *ts = NULL;
    hw_profile hw;
    model_geometry model;
    quant_table quant;
    trace_stream_options rows =
        sim_stream_options(cli_sim_options_policy(&o), o.policy_name, settings);
    if (!st)
        st = sim_inputs_open_stream(o.trace_path, &rows, o.hw_name, model_name, &ts, &hw, &model,
                                   &quant, &err);
    sim_result r;
    if (!st) {
        sim_inputs in = {.trace = trace_stream_tokens(ts),
                         .stream = ts,
                         .model = &model,
                         .hw = &hw,
                         .quant = &quant,
                         .timeline_path = o.timeline_path,
                         .timeline_window = o.timeline_window,
                         .policy = cli_sim_options_policy(&o)};
        cli_step_progress prog;
        in.hooks = cli_step_progress_begin(&prog, "sim steps", o.quiet);
        st = sim_run(&in, o.policy_name, settings, &r, &err);
        cli_step_progress_end(&prog);
    }
    if (!st && r.cost_extrapolated)
        fprintf(stderr,
                "moesim sim: warning: the cost table's measurements do not cover %u op curves "
                "this run needs; those times are extrapolated (sim/COST.md)\n",
                r.cost_extrapolated);
    if (st) {
        rc = cli_fail(&err);
    } else if (o.json) {
        const char *named = model_name ? model_name : trace_stream_tokens(ts)->meta.model;
        json_t *inputs = provenance_inputs_json(trace_stream_tokens(ts), o.trace_path, named,
                                                o.hw_name, o.policy_name, settings);
        cli_print_json(provenance_attach(sim_result_to_json(&r), inputs));
    } else {
        print_text(&r, o.trace_path, hw.name);
    }
    cli_sim_options_free(&o);
    trace_stream_close(ts);
    config_destroy(settings);
    return rc;
}
