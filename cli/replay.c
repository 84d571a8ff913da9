/* `moesim replay`: one run of a trace under a policy for real (replay/replay.h), on the GPU or,
 * with --backend cpu, on this machine's CPU and disk, with the simulator's settings, JSON and
 * timeline schema, so its output sits beside `moesim sim`'s. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/sim_options.h"
#include "common/check.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "core/provenance.h"
#include "policies/policy.h"
#include "replay/replay.h"
#include "sim/inputs.h"
#include "traces/trace.h"

static const char replay_usage[] =
    "usage: moesim replay (--model DIR | --synthetic-weights) --trace T.h5 --hw NAME\n"
    "                     --policy NAME [--set key=value ...] [--config FILE ...] [--seed N]\n"
    "                     [--json] [--timeline FILE [--timeline-window W]] [--ssd-dir DIR]\n"
    "                     [--backend B]\n"
    "\n"
    "Replays the trace's routing on the GPU: the policy's loads, prefetches and evictions are\n"
    "real copies from pinned host memory into fixed-block device pools on a demand and a\n"
    "background copy stream, and every activated expert runs its real kernels at the planned\n"
    "precision. Settings are `moesim sim`'s (see its --help): memory.budget_gb emulates a\n"
    "smaller card on a larger GPU. Output: the simulator's figures and timeline schema,\n"
    "measured. Routing always comes from the trace. With --backend cpu the same run executes on\n"
    "this machine: a DRAM arena of the expert budget stands for HBM, experts are read from a\n"
    "file on local disk with O_DIRECT by a copy thread, and compute runs the engine's CPU\n"
    "kernels; compare it with `moesim sim` under a CPU profile (configs/hw/README.md).\n"
    "\n"
    "options (one weight source: --model or --synthetic-weights):\n"
    "  --model DIR          the weights of a Hugging Face checkpoint (config.json and\n"
    "                       safetensors, as `moesim record` reads it): experts at every stored\n"
    "                       precision quantized as the engine does, attention, routers, shared\n"
    "                       experts and LM head in bf16. Its geometry must be the trace's (and\n"
    "                       its config.json the one a recorded trace names by hash)\n"
    "  --synthetic-weights  random weights of the trace's model geometry (timing depends on\n"
    "                       shapes and bytes only; no checkpoint needed)\n"
    "  --trace FILE         router trace (HDF5)\n"
    "  --hw NAME            hardware profile (the one `moesim calibrate` wrote)\n"
    "  --policy NAME        policy (`moesim sim --list-policies`)\n"
    "  --policy-lib FILE.so a policy plug-in (policies/WRITING.md); --policy defaults to it\n"
    "  --model-geometry N   model geometry with --synthetic-weights (default: the trace's\n"
    "                       model; with --model the checkpoint is the geometry)\n"
    "  --set S.K=V          a setting or policy knob (repeatable)\n"
    "  --config FILE        an INI file of settings (repeatable)\n"
    "  --seed N             seed of the synthetic weights (default 1; --synthetic-weights)\n"
    "  --ssd-dir DIR        where experts beyond the profile's DRAM are stored (a disk file\n"
    "                       system: read with O_DIRECT; default /var/tmp)\n"
    "  --json               every figure as one JSON object (`moesim sim --json` keys)\n"
    "  -q, --quiet          no progress (a bar on a terminal, else a line every 10 s)\n";
static const char replay_usage_tail[] = "  --backend B          cuda (default: the GPU) or cpu\n"
                                        "  -h, --help           this text\n";

/* Loads what a replay with a checkpoint's weights reads, and checks the checkpoint against the
 * trace, all before any GPU work: the trace (whole, or with `ts` as a stream), the hardware
 * profile, the quant table, the checkpoint (replay/weights.h) and its geometry (under the trace's
 * model name) into `model`. *t, *ts and *w are the caller's to release, also on failure. */
static moesim_status checkpoint_inputs_load(const char *trace_path, const char *hw_name,
                                            const char *model_dir, trace **t, trace_stream **ts,
                                            hw_profile *hw, model_geometry *model,
                                            quant_table *quant, replay_weights **w,
                                            moesim_error *err) {
    moesim_status st = ts ? trace_stream_open(trace_path, ts, err) : trace_read(trace_path, t, err);
    const trace *tokens = st ? NULL : ts ? trace_stream_tokens(*ts) : *t;
    if (!st) st = hw_load_by_name(hw_name, hw, err);
    if (!st) st = quant_table_load_default(quant, err);
    if (!st) st = replay_weights_open(model_dir, w, err);
    if (!st) st = replay_weights_check_trace(*w, &tokens->meta, trace_path, err);
    if (!st) replay_weights_geometry(*w, tokens->meta.model, model);
    return st;
}

/* `moesim sim --model` takes a geometry file; a user carrying it over to replay gets a hint, not
 * "FILE/config.json: Not a directory". */
static bool is_regular_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int cmd_replay(int argc, char **argv) {
    static const struct option own[] = {{"synthetic-weights", no_argument, NULL, 'S'},
                                        {"model", required_argument, NULL, 'M'},
                                        {"live", no_argument, NULL, 'L'},
                                        {"model-geometry", required_argument, NULL, 'g'},
                                        {"seed", required_argument, NULL, 'e'},
                                        {"ssd-dir", required_argument, NULL, 'D'},
                                        {"backend", required_argument, NULL, 'B'},
                                        {"help", no_argument, NULL, 'h'}};
    struct option opts[CLI_SIM_OPTIONS_MAX + MOESIM_ARRAY_LEN(own) + 1];
    cli_sim_options o;
    cli_sim_options_start(&o, CLI_SIM_RUN | CLI_SIM_TIMELINE | CLI_SIM_PLUGIN, own,
                          MOESIM_ARRAY_LEN(own), opts);
    const char *geometry = NULL, *seed_text = NULL, *ssd_dir = NULL, *model_dir = NULL,
               *backend = "cuda";
    bool synthetic = false, live = false;
    int c, rc = 0;
    while ((c = cli_sim_options_next(&o, argc, argv, opts)) != -1) {
        switch (c) {
        case 'S':
            synthetic = true;
            break;
        case 'M':
            model_dir = optarg;
            break;
        case 'L':
            live = true;
            break;
        case 'g':
            geometry = optarg;
            break;
        case 'e':
            seed_text = optarg;
            break;
        case 'D':
            ssd_dir = optarg;
            break;
        case 'B':
            backend = optarg;
            break;
        case 'h':
            fputs(replay_usage, stdout);
            cli_sim_options_timeline_help(stdout, 23);
            fputs(replay_usage_tail, stdout);
            cli_sim_options_free(&o);
            return 0;
        default:
            cli_sim_options_free(&o);
            return cli_getopt_error("replay", c, argc, argv, opts);
        }
    }
    uint64_t seed = 1;
    bool cpu = !strcmp(backend, "cpu");
    if (!cpu && strcmp(backend, "cuda"))
        rc = cli_usage_error("replay", "--backend: expected cuda or cpu, got '%s'", backend);
    else if (optind < argc)
        rc = cli_usage_error("replay", "unexpected argument '%s'", argv[optind]);
    else if (live)
        rc = cli_usage_error("replay", "--live (routing from the live model) is not offered: "
                                       "replay routes from the trace (replay/README.md)");
    else if (model_dir && synthetic)
        rc = cli_usage_error("replay", "--model and --synthetic-weights are mutually exclusive "
                                       "(one weight source)");
    else if (!model_dir && !synthetic)
        rc = cli_usage_error("replay", "a weight source is required: --model DIR or "
                                       "--synthetic-weights");
    else if (model_dir && is_regular_file(model_dir))
        rc = cli_usage_error("replay",
                             "--model: expected a checkpoint directory (config.json, "
                             "*.safetensors), got the file '%s' (a geometry file goes with "
                             "--synthetic-weights --model-geometry)",
                             model_dir);
    else if (model_dir && (geometry || seed_text))
        rc = cli_usage_error("replay",
                             "%s applies to --synthetic-weights only (with --model the "
                             "checkpoint is the geometry and the weights)",
                             geometry ? "--model-geometry" : "--seed");
    if (!rc) rc = cli_sim_options_check("replay", &o, true);
    if (!rc && seed_text && !config_parse_u64(seed_text, &seed))
        rc = cli_usage_error("replay", "--seed: expected a non-negative integer, got '%s'",
                             seed_text);
    if (rc) {
        cli_sim_options_free(&o);
        return rc;
    }
    moesim_error err = {0};
    /* settings first, as in every command that runs a simulation; then, with synthetic weights
     * on the GPU, the GPU (no point reading the inputs without one); a checkpoint is checked
     * against the trace first (its errors come before the GPU's) */
    config *settings = config_create();
    moesim_status st = cli_sim_options_settings(&o, settings, &err);
    if (!st && synthetic && !cpu) st = replay_device_check(&err);
    /* the CPU backend reads the trace as a stream (memory flat in its length); the GPU's holds
     * it */
    trace *t = NULL;
    trace_stream *ts = NULL;
    replay_weights *w = NULL;
    hw_profile hw;
    model_geometry model;
    quant_table quant;
    if (!st && synthetic && cpu)
        st = sim_inputs_open_stream(o.trace_path, NULL, o.hw_name, geometry, &ts, &hw, &model,
                                    &quant, &err);
    else if (!st && synthetic)
        st = sim_inputs_load(o.trace_path, o.hw_name, geometry, &t, &hw, &model, &quant, &err);
    if (!st && model_dir) {
        st = checkpoint_inputs_load(o.trace_path, o.hw_name, model_dir, &t, cpu ? &ts : NULL, &hw,
                                    &model, &quant, &w, &err);
        if (!st && !cpu) st = replay_device_check(&err);
    }
    const trace *tokens = ts ? trace_stream_tokens(ts) : t;
    sim_result r;
    if (!st) {
        replay_inputs in = {.trace = tokens,
                            .stream = ts,
                            .model = &model,
                            .hw = &hw,
                            .quant = &quant,
                            .timeline_path = o.timeline_path,
                            .timeline_window = o.timeline_window,
                            .weights = w,
                            .weight_seed = seed,
                            .ssd_dir = ssd_dir,
                            .policy = cli_sim_options_policy(&o)};
        cli_step_progress prog;
        in.hooks = cli_step_progress_begin(&prog, "replay steps", o.quiet);
        st = cpu ? replay_run_cpu(&in, o.policy_name, settings, &r, NULL, &err)
                 : replay_run(&in, o.policy_name, settings, &r, NULL, &err);
        cli_step_progress_end(&prog);
    }
    if (st) {
        rc = cli_fail(&err);
    } else if (o.json) {
        json_t *inputs = provenance_inputs_json(tokens, o.trace_path, model_dir ? NULL : model.name,
                                                o.hw_name, o.policy_name, settings);
        if (model_dir) /* a checkpoint: its folder and the hash of its config.json */
            json_object_set_new(inputs, "checkpoint", json_string(model_dir));
        json_object_set_new(inputs, "backend", json_string(cpu ? "cpu" : "cuda"));
        json_object_set_new(inputs, "weight_seed", json_integer((json_int_t)seed));
        cli_print_json(provenance_attach(sim_result_to_json(&r), inputs));
    } else {
        char f1[32], f2[32], f3[32], f4[32];
        printf("%s on %s (replay, %s weights), policy %s: %s, TTFT mean %s, TPOT mean %s, hit "
               "rate %.2f%%, stall %s, h2d %.3f GB\n",
               o.trace_path, cpu ? "the CPU" : hw.gpu, model_dir ? "checkpoint" : "synthetic",
               r.policy, cli_format_ms(r.makespan_ms, f1, sizeof f1),
               cli_format_ms(r.ttft.mean_ms, f2, sizeof f2),
               cli_format_ms(r.tpot.mean_ms, f3, sizeof f3), 100.0 * r.hit_rate,
               cli_format_ms(r.stall_ms, f4, sizeof f4), r.h2d_bytes / 1e9);
    }
    cli_sim_options_free(&o);
    replay_weights_close(w);
    trace_destroy(t);
    trace_stream_close(ts);
    config_destroy(settings);
    return rc;
}
