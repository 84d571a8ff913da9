/* `moesim replay`: one run of a trace under a policy on the real GPU (replay/replay.h), with the
 * simulator's settings, JSON and timeline schema, so its output sits beside `moesim sim`'s. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "policies/policy.h"
#include "replay/replay.h"
#include "traces/trace.h"

static const char replay_usage[] =
    "usage: moesim replay --synthetic-weights --trace T.h5 --hw NAME --policy NAME\n"
    "                     [--set key=value ...] [--config FILE ...] [--seed N] [--json]\n"
    "                     [--timeline out.json] [--ssd-dir DIR]\n"
    "\n"
    "Replays the trace's routing on the GPU: the policy's loads, prefetches and evictions are\n"
    "real copies from pinned host memory into fixed-block device pools on a demand and a\n"
    "background copy stream, and every activated expert runs its real kernels at the planned\n"
    "precision. Settings are `moesim sim`'s (see its --help): memory.budget_gb emulates a\n"
    "smaller card on a larger GPU. Output: the simulator's figures and timeline schema,\n"
    "measured.\n"
    "\n"
    "options:\n"
    "  --synthetic-weights  random weights of the trace's model geometry (timing depends on\n"
    "                       shapes and bytes only; no checkpoint needed)\n"
    "  --trace FILE         router trace (HDF5)\n"
    "  --hw NAME            hardware profile (the one `moesim calibrate` wrote)\n"
    "  --policy NAME        policy (`moesim sim --list-policies`)\n"
    "  --model-geometry N   model geometry (default: the trace's model)\n"
    "  --set S.K=V          a setting or policy knob (repeatable)\n"
    "  --config FILE        an INI file of settings (repeatable)\n"
    "  --seed N             seed of the synthetic weights (default 1)\n"
    "  --ssd-dir DIR        where experts beyond the profile's DRAM are stored (a disk file\n"
    "                       system: read with O_DIRECT; default /var/tmp)\n"
    "  --json               every figure as one JSON object (`moesim sim --json` keys)\n"
    "  --timeline FILE      Chrome trace-event JSON of the measured run\n"
    "  -h, --help           this text\n";

int cmd_replay(int argc, char **argv) {
    static const struct option opts[] = {{"synthetic-weights", no_argument, NULL, 'S'},
                                         {"trace", required_argument, NULL, 't'},
                                         {"hw", required_argument, NULL, 'w'},
                                         {"policy", required_argument, NULL, 'p'},
                                         {"model-geometry", required_argument, NULL, 'g'},
                                         {"set", required_argument, NULL, 's'},
                                         {"config", required_argument, NULL, 'c'},
                                         {"seed", required_argument, NULL, 'e'},
                                         {"ssd-dir", required_argument, NULL, 'D'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"timeline", required_argument, NULL, 'T'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *trace_path = NULL, *hw_name = NULL, *policy_name = NULL, *geometry = NULL,
               *timeline = NULL, *seed_text = NULL, *ssd_dir = NULL;
    const char **sets = NULL, **files = NULL;
    size_t n_sets = 0, n_files = 0;
    bool json = false, synthetic = false;
    int c, rc = 0;
    optind = 1;
    opterr = 0; /* one line: ours, naming the option */
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'S':
            synthetic = true;
            break;
        case 't':
            trace_path = optarg;
            break;
        case 'w':
            hw_name = optarg;
            break;
        case 'p':
            policy_name = optarg;
            break;
        case 'g': {
            /* getopt_long takes unique prefixes: '--model DIR' (a planned option, see
             * replay/README.md) must not silently mean --model-geometry DIR */
            const char *o = argv[optind - (optarg == argv[optind - 1] ? 2 : 1)];
            size_t n = strcspn(o, "=");
            if (n != strlen("--model-geometry")) {
                free(sets);
                free(files);
                return cli_usage_error("replay", "unknown option '%.*s'", (int)n, o);
            }
            geometry = optarg;
            break;
        }
        case 's':
            cli_collect(&sets, &n_sets, optarg);
            break;
        case 'c':
            cli_collect(&files, &n_files, optarg);
            break;
        case 'e':
            seed_text = optarg;
            break;
        case 'D':
            ssd_dir = optarg;
            break;
        case 'j':
            json = true;
            break;
        case 'T':
            timeline = optarg;
            break;
        case 'h':
            fputs(replay_usage, stdout);
            free(sets);
            free(files);
            return 0;
        default:
            free(sets);
            free(files);
            return cli_getopt_error("replay", c, argc, argv, opts);
        }
    }
    uint64_t seed = 1;
    if (optind < argc)
        rc = cli_usage_error("replay", "unexpected argument '%s'", argv[optind]);
    else if (!synthetic)
        rc = cli_usage_error("replay", "--synthetic-weights is required (the only weight source)");
    else if (!trace_path || !hw_name || !policy_name)
        rc = cli_usage_error("replay", "--trace, --hw and --policy are required");
    else if (!policy_lookup(policy_name))
        rc = cli_usage_error("replay", "unknown policy '%s' (known: %s)", policy_name,
                             policy_names());
    else if (seed_text && !config_parse_u64(seed_text, &seed))
        rc = cli_usage_error("replay", "--seed: expected a non-negative integer, got '%s'",
                             seed_text);
    if (rc) {
        free(sets);
        free(files);
        return rc;
    }
    moesim_error err = {0};
    if (replay_device_check(&err)) {
        free(sets);
        free(files);
        return cli_fail(&err);
    }
    config *settings = config_create();
    moesim_status st = cli_settings_load(settings, files, n_files, sets, n_sets, &err);
    free(sets);
    free(files);
    trace *t = NULL;
    hw_profile hw;
    model_geometry model;
    quant_table quant;
    if (!st) st = cli_sim_inputs_load(trace_path, hw_name, geometry, &t, &hw, &model, &quant, &err);
    sim_result r;
    if (!st) {
        replay_inputs in = {.trace = t,
                            .model = &model,
                            .hw = &hw,
                            .quant = &quant,
                            .timeline_path = timeline,
                            .weight_seed = seed,
                            .ssd_dir = ssd_dir};
        st = replay_run(&in, policy_name, settings, &r, NULL, &err);
    }
    if (st) {
        rc = cli_fail(&err);
    } else if (json) {
        cli_print_json(sim_result_to_json(&r));
    } else {
        printf("%s on %s (replay), policy %s: %.3f ms, TTFT mean %.3f ms, TPOT mean %.3f ms, "
               "hit rate %.2f%%, stall %.3f ms, h2d %.3f GB\n",
               trace_path, hw.gpu, r.policy, r.makespan_ms, r.ttft.mean_ms, r.tpot.mean_ms,
               100.0 * r.hit_rate, r.stall_ms, r.h2d_bytes / 1e9);
    }
    trace_destroy(t);
    config_destroy(settings);
    return rc;
}
