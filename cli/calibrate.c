/* `moesim calibrate`: microbenchmarks on the real GPU (replay/calibrate.cu) written as a
 * hardware profile (configs/hw/README.md) and a measured cost table (sim/COST.md) that the
 * simulator reads with `--hw NAME-measured --set sim.cost_table=TABLE`. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "replay/replay.h"

static const char calibrate_usage[] =
    "usage: moesim calibrate -o configs/hw/NAME-measured.ini --table OUT.txt --base NAME\n"
    "                        --model NAME [--repeats N] [--quick] [--backend cuda|cpu]\n"
    "                        [--ssd-dir DIR]\n"
    "\n"
    "Measures the GPU: pinned host<->device bandwidth vs transfer size and per-transfer\n"
    "latency, device memory bandwidth, launch overhead, the model's expert GEMV/GEMM time per\n"
    "precision vs tokens, router, shared/dense FFN, LM head, attention time vs attended\n"
    "positions. Writes a hardware profile (figures calibrate cannot measure, such as the\n"
    "datasheet peaks, DRAM and SSD, come from --base) and the measured cost table.\n"
    "With --backend cpu it measures what `moesim replay --backend cpu` runs instead: O_DIRECT\n"
    "reads of an expert file (the profile's [pcie] link), DRAM copies, and every op with the\n"
    "replay's CPU compute (base: configs/hw/cpu-host.ini).\n"
    "\n"
    "options:\n"
    "  -o FILE         hardware profile to write; its [profile] name is the file's stem\n"
    "  --table FILE    cost table to write (sim/COST.md format)\n"
    "  --base NAME     hardware profile to take unmeasured figures from (e.g. h100-sxm)\n"
    "  --model NAME    model geometry whose op shapes are timed (configs/models)\n"
    "  --repeats N     timed repetitions per point, median kept (default 20)\n"
    "  --quick         fewer points (a smoke run)\n"
    "  --backend B     cuda (default: the GPU) or cpu (this machine's CPU and disk)\n"
    "  --ssd-dir DIR   with --backend cpu: where the timed expert file goes (default /var/tmp)\n"
    "  --quiet         no progress (--backend cpu: a bar on a terminal, else a line every 10 s)\n"
    "  -h, --help      this text\n";

int cmd_calibrate(int argc, char **argv) {
    static const struct option opts[] = {
        {"table", required_argument, NULL, 'T'},   {"base", required_argument, NULL, 'b'},
        {"model", required_argument, NULL, 'm'},   {"repeats", required_argument, NULL, 'r'},
        {"quick", no_argument, NULL, 'q'},         {"backend", required_argument, NULL, 'B'},
        {"ssd-dir", required_argument, NULL, 'D'}, {"quiet", no_argument, NULL, 'Q'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    const char *out_path = NULL, *table = NULL, *base_name = NULL, *model_name = NULL,
               *repeats_text = NULL, *backend = "cuda", *ssd_dir = NULL;
    bool quick = false, quiet = false;
    int c;
    optind = 1;
    opterr = 0; /* one line: ours, naming the option */
    while ((c = getopt_long(argc, argv, ":ho:", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out_path = optarg;
            break;
        case 'T':
            table = optarg;
            break;
        case 'b':
            base_name = optarg;
            break;
        case 'm':
            model_name = optarg;
            break;
        case 'r':
            repeats_text = optarg;
            break;
        case 'q':
            quick = true;
            break;
        case 'B':
            backend = optarg;
            break;
        case 'Q':
            quiet = true;
            break;
        case 'D':
            ssd_dir = optarg;
            break;
        case 'h':
            fputs(calibrate_usage, stdout);
            return 0;
        default:
            return cli_getopt_error("calibrate", c, argc, argv, opts);
        }
    }
    uint64_t repeats = 20;
    if (optind < argc)
        return cli_usage_error("calibrate", "unexpected argument '%s'", argv[optind]);
    bool cpu = !strcmp(backend, "cpu");
    if (!cpu && strcmp(backend, "cuda"))
        return cli_usage_error("calibrate", "--backend: expected cuda or cpu, got '%s'", backend);
    if (!out_path || !table || !base_name || !model_name)
        return cli_usage_error("calibrate", "-o, --table, --base and --model are required");
    if (repeats_text &&
        (!config_parse_u64(repeats_text, &repeats) || repeats < 1 || repeats > 10000))
        return cli_usage_error("calibrate",
                               "--repeats: expected an integer in [1, 10000], got "
                               "'%s'",
                               repeats_text);
    /* the profile's name is the file's stem: configs/hw/NAME.ini loads as --hw NAME */
    char name[64];
    const char *slash = strrchr(out_path, '/');
    if (snprintf(name, sizeof name, "%s", slash ? slash + 1 : out_path) >= (int)sizeof name)
        return cli_usage_error("calibrate", "-o %s: expected a file name of at most %zu characters",
                               out_path, sizeof name - 1);
    char *dot = strrchr(name, '.');
    if (!dot || strcmp(dot, ".ini") || dot == name)
        return cli_usage_error("calibrate", "-o %s: expected a file name ending in .ini", out_path);
    *dot = '\0';
    moesim_error err = {0};
    /* both outputs writable, neither an input nor the other, before the measurements */
    const char *outs[] = {out_path, table}, *ins[] = {base_name, model_name};
    if (atomic_file_check_outputs(outs, 2, ins, 2, &err) ||
        atomic_file_check_writable(out_path, &err) || atomic_file_check_writable(table, &err))
        return cli_fail(&err);
    hw_profile base;
    model_geometry model;
    if (hw_load_by_name(base_name, &base, &err) || model_load_by_name(model_name, &model, &err))
        return cli_fail(&err);
    if (!cpu && replay_device_check(&err)) return cli_fail(&err);
    progress bar; /* the CPU calibration's phases (the GPU's runs unobserved) */
    progress_begin(&bar, "calibrate", CALIB_CPU_PHASES, cpu && cli_progress_allowed(quiet));
    calib_options opt = {
        .model = &model, .repeats = (uint32_t)repeats, .quick = quick, .bar = cpu ? &bar : NULL};
    calib_results *res = moesim_xcalloc(1, sizeof *res); /* large: the cost curves */
    moesim_status st = cpu ? calib_run_cpu(&opt, ssd_dir, res, &err) : calib_run(&opt, res, &err);
    progress_end(&bar);
    if (st || calib_write_table(res, model.name, table, &err) ||
        calib_write_profile(res, &base, name, out_path, &err)) {
        free(res);
        return cli_fail(&err);
    }
    printf("%s: h2d %.2f GB/s (latency %.2f us), d2h %.2f GB/s, device memory %.0f GB/s, "
           "bf16 GEMM %.1f TFLOPS, launch %.2f us\n",
           res->gpu, res->h2d_peak_gb_per_s, res->h2d_latency_us, res->d2h_peak_gb_per_s,
           res->hbm_gb_per_s, res->bf16_tflops, res->kernel_launch_us);
    if (res->h2d_chunk_measured)
        printf("1 MiB chunks back to back: %.2f us each (latency paid per chunk: %s); two timing "
               "events around a launch add %.2f us\n",
               res->h2d_chunk_us, res->h2d_latency_per_chunk ? "yes" : "no", res->op_events_us);
    if (res->contention_measured)
        printf("beside each other: reads %.1f %% slower while ops run, ops %.1f %% slower while "
               "reads run\n",
               100 * res->link_slowdown_beside_compute, 100 * res->op_slowdown_beside_copy);
    printf("wrote %s and %s\n", out_path, table);
    free(res);
    return 0;
}
