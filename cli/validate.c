/* `moesim validate`: the simulator against a real execution, on the GPU or (--backend cpu) on
 * this machine. This file holds the command line; the configurations and their runs are
 * sweep/validate.h's, the report's files replay/report_files.h's.
 *
 * Configurations come from one of:
 *   --policy NAME [--set ...]           one configuration
 *   --experiment FILE                   a sweep experiment file's configurations (sweep/sweep.h;
 *                                       its [validate] section: repeats and the check)
 *   --merge A.json ...                  the rows of earlier --json outputs as one set (no GPU)
 *   --winners CSV [--top N] [--by COL]  the N best rows of a `moesim sweep` CSV by COL
 * The experiment file may name trace and hw; options override it. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/sim_options.h"
#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "core/provenance.h"
#include "replay/replay.h"
#include "replay/report_files.h"
#include "sweep/validate.h"

static const char validate_usage[] =
    "usage: moesim validate --trace T.h5 --hw NAME (--policy NAME | --experiment FILE\n"
    "                       [--budgets LIST] | --winners CSV [--top N] [--by COLUMN])\n"
    "                       [--set S.K=V ...] [--config FILE ...] [--seed N] [--report FILE]\n"
    "                       [--backend cuda|cpu [--ssd-dir DIR]] [--json]\n"
    "       moesim validate --merge A.json --merge B.json ... [--report FILE] [--csv FILE]\n"
    "                       [--json]\n"
    "\n"
    "Runs the simulator and the GPU replay on the same trace, geometry, calibrated profile\n"
    "(--hw: the one `moesim calibrate` wrote; pass its table with --set sim.cost_table=...),\n"
    "policy and settings, and reports the TPOT, TTFT and total-time errors ((sim - real) /\n"
    "real), per request and per MoE layer, and whether both rank the policies alike.\n"
    "Targets: median |TPOT error| <= 5 %, median |TTFT error| <= 10 %, same policy order.\n"
    "\n"
    "options:\n"
    "  --trace FILE        router trace (or the experiment file's trace)\n"
    "  --hw NAME           calibrated hardware profile (or the experiment file's hw)\n"
    "  --policy NAME       one configuration\n"
    "  --experiment FILE   the configurations of a sweep experiment file (experiments/README.md:\n"
    "                      [fixed], [axes], ...; one trace, hw and model); its [validate]\n"
    "                      section: repeats, tpot_error_max and order_margin (the check)\n"
    "  --budgets LIST      only the experiment's configurations with these memory.budget_gb\n"
    "                      (e.g. one per GPU call)\n"
    "  --merge FILE        summarize the --json outputs of several runs as one set\n"
    "  --winners CSV       the best rows of a sweep's results CSV\n"
    "  --top N             how many winners (default 5)\n"
    "  --by COLUMN         winners' ranking column, lowest first (default tpot_ms.mean)\n"
    "  --set, --config     settings for every run (as `moesim sim`)\n"
    "  --seed N            synthetic weights' seed (default 1)\n"
    "  --repeats N         N rounds of replays, every configuration once per round (a slow\n"
    "                      drift of a shared machine falls on all alike); each is compared by\n"
    "                      its run of median makespan, with its TPOT range (default 1); with 6\n"
    "                      or more, a pair of policies is ranked only where its rounds agree\n"
    "                      (sign test, p < 0.05; replay/README.md)\n"
    "  --calibrate-rounds DIR\n"
    "                      calibrate the machine (as `moesim calibrate`) before the first round\n"
    "                      and in slices through every round (before its first replay and after\n"
    "                      each), writing the profiles and cost tables to DIR; each round is\n"
    "                      simulated with its slices combined and the median of the rounds'\n"
    "                      simulations compared (--hw then supplies only what a calibration\n"
    "                      cannot measure, e.g. cpu-host), and the report shows the\n"
    "                      drift and calls no result when the machine drifted more than the\n"
    "                      error (a machine that drifts: replay/README.md)\n"
    "  --calibrate-repeats N\n"
    "                      repetitions per point of the calibration before the first round\n"
    "                      (default 5; the slices take one)\n"
    "  --backend B         cuda (default: replay on the GPU) or cpu (replay on this machine's CPU\n"
    "                      and disk, experiments/validation/cpu/)\n"
    "  --ssd-dir DIR       with --backend cpu: where the expert file the replays read goes\n"
    "                      (default /var/tmp; it needs room for every expert of the model)\n"
    "  --check TPOT,MARGIN exit 1 unless the median |TPOT error| is at most TPOT (e.g. 0.25) and\n"
    "                      every two policies whose simulated TPOTs differ by more than MARGIN\n"
    "                      (e.g. 0.3) are ordered alike by the replay, where the replay orders\n"
    "                      them (6+ rounds: its rounds agree by the sign test)\n"
    "  --report FILE       the report as Markdown (default: stdout)\n"
    "  --csv FILE          the rows as CSV (plots/validate.gp plots it)\n"
    "  --json              the rows and the summary as JSON on stdout\n"
    "  -h, --help          this text\n";

/* The report (Markdown to `report`, else to stdout unless --json), the CSV and the JSON. */
/* The report, CSV and JSON; `inputs` (owned) is what the rows were made from, in the JSON. */
static moesim_status write_outputs(const validate_meta *meta, const validate_row *rows, size_t n,
                                   const validate_summary *s, const char *report, const char *csv,
                                   bool json, json_t *inputs, moesim_error *err) {
    moesim_status st = MOESIM_OK;
    if (report) {
        atomic_file af;
        st = atomic_file_open(&af, report, err);
        if (!st) {
            validate_report_write_md(af.fp, meta, rows, n, s);
            st = atomic_file_commit(&af, err);
        }
    } else if (!json) {
        validate_report_write_md(stdout, meta, rows, n, s);
    }
    if (!st && csv) st = validate_report_write_csv(csv, rows, n, err);
    if (!st && json)
        cli_print_json(provenance_attach(validate_report_json(meta, rows, n, s), inputs));
    else
        json_decref(inputs);
    return st;
}

/* The report and the CSV: neither an input of the run nor the other, and both writable before
 * any work (a report written beside a CSV that cannot be would be half the output). 0 or the
 * exit status after one line. */
static int check_outputs(const char *report, const char *csv, const cli_sim_options *o,
                         const char *experiment, const char *winners, const char **merges,
                         size_t n_merges) {
    moesim_error err = {0};
    const char *outs[] = {report, csv}, *ins[] = {o->trace_path, o->hw_name, experiment, winners};
    if (atomic_file_check_outputs(outs, 2, ins, MOESIM_ARRAY_LEN(ins), &err) ||
        atomic_file_check_outputs(outs, 2, merges, n_merges, &err) ||
        atomic_file_check_outputs(outs, 2, o->files, o->n_files, &err) ||
        (report && atomic_file_check_writable(report, &err)) ||
        (csv && atomic_file_check_writable(csv, &err)))
        return cli_fail(&err);
    return 0;
}

/* --check TPOT,MARGIN: two finite numbers, TPOT > 0, MARGIN >= 0, and nothing else. */
static bool parse_check(const char *text, double *tpot, double *margin) {
    char buf[64];
    if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf) return false;
    char *comma = strchr(buf, ',');
    if (!comma) return false;
    *comma = '\0';
    return config_parse_f64(buf, tpot) && config_parse_f64(comma + 1, margin) && *tpot > 0 &&
           *margin >= 0;
}

/* --merge: the rows of several `--json` outputs (e.g. one GPU call per budget) summarized as
 * one validation set. No GPU needed. */
static int merge_reports(const char **files, size_t n_files, const char *report, const char *csv,
                         bool json) {
    moesim_error err = {0};
    validate_meta meta;
    validate_row *rows = NULL;
    size_t n = 0;
    moesim_status st = validate_report_merge(files, n_files, &meta, &rows, &n, &err);
    if (!st) {
        validate_summary s;
        validate_summarize(rows, n, &s);
        json_t *inputs = json_object(), *merged = json_array(); /* the --json files merged */
        for (size_t f = 0; f < n_files; f++)
            json_array_append_new(merged, provenance_file_json(files[f]));
        json_object_set_new(inputs, "merged", merged);
        st = write_outputs(&meta, rows, n, &s, report, csv, json, inputs, &err);
    }
    free(rows);
    return st ? cli_fail(&err) : 0;
}

int cmd_validate(int argc, char **argv) {
    static const struct option own[] = {{"experiment", required_argument, NULL, 'x'},
                                        {"winners", required_argument, NULL, 'W'},
                                        {"top", required_argument, NULL, 'n'},
                                        {"by", required_argument, NULL, 'b'},
                                        {"seed", required_argument, NULL, 'e'},
                                        {"report", required_argument, NULL, 'r'},
                                        {"budgets", required_argument, NULL, 'B'},
                                        {"merge", required_argument, NULL, 'G'},
                                        {"csv", required_argument, NULL, 'C'},
                                        {"backend", required_argument, NULL, 'K'},
                                        {"check", required_argument, NULL, 'k'},
                                        {"repeats", required_argument, NULL, 'R'},
                                        {"calibrate-rounds", required_argument, NULL, 'c'},
                                        {"calibrate-repeats", required_argument, NULL, 'P'},
                                        {"ssd-dir", required_argument, NULL, 'D'},
                                        {"help", no_argument, NULL, 'h'}};
    struct option opts[CLI_SIM_OPTIONS_MAX + MOESIM_ARRAY_LEN(own) + 1];
    cli_sim_options o;
    cli_sim_options_start(&o, CLI_SIM_RUN, own, MOESIM_ARRAY_LEN(own), opts);
    const char *backend = "cuda", *check = NULL;
    const char *experiment = NULL, *winners = NULL, *by = "tpot_ms.mean", *top_text = NULL,
               *seed_text = NULL, *report = NULL, *budgets = NULL, *csv = NULL,
               *repeats_text = NULL, *calibrate_dir = NULL, *calibrate_repeats_text = NULL,
               *ssd_dir = NULL;
    const char **merges = NULL;
    bool by_given = false;
    size_t n_merges = 0;
    int c, rc = 0;
    while ((c = cli_sim_options_next(&o, argc, argv, opts)) != -1) {
        switch (c) {
        case 'B':
            budgets = optarg;
            break;
        case 'C':
            csv = optarg;
            break;
        case 'K':
            backend = optarg;
            break;
        case 'k':
            check = optarg;
            break;
        case 'G':
            cli_collect(&merges, &n_merges, optarg);
            break;
        case 'x':
            experiment = optarg;
            break;
        case 'W':
            winners = optarg;
            break;
        case 'n':
            top_text = optarg;
            break;
        case 'b':
            by = optarg, by_given = true;
            break;
        case 'e':
            seed_text = optarg;
            break;
        case 'R':
            repeats_text = optarg;
            break;
        case 'c':
            calibrate_dir = optarg;
            break;
        case 'P':
            calibrate_repeats_text = optarg;
            break;
        case 'D':
            ssd_dir = optarg;
            break;
        case 'r':
            report = optarg;
            break;
        case 'h':
            fputs(validate_usage, stdout);
            cli_sim_options_free(&o);
            free(merges);
            return 0;
        default:
            cli_sim_options_free(&o);
            free(merges);
            return cli_getopt_error("validate", c, argc, argv, opts);
        }
    }
    uint64_t top = 5, seed = 1, repeats = 1, calibrate_repeats = 5;
    if (!rc) rc = check_outputs(report, csv, &o, experiment, winners, merges, n_merges);
    if (rc) {
        cli_sim_options_free(&o);
        free(merges);
        return rc;
    }
    if (n_merges) {
        bool alone = optind == argc && !o.policy_name && !experiment && !winners;
        cli_sim_options_free(&o);
        rc = alone ? merge_reports(merges, n_merges, report, csv, o.json)
                   : cli_usage_error("validate", "--merge takes only --report, --csv and --json");
        free(merges);
        return rc;
    }
    if (optind < argc)
        rc = cli_usage_error("validate", "unexpected argument '%s'", argv[optind]);
    else if ((o.policy_name != NULL) + (experiment != NULL) + (winners != NULL) != 1)
        rc = cli_usage_error("validate",
                             "give exactly one of --policy, --experiment, --winners, --merge");
    else if (budgets && !experiment)
        rc = cli_usage_error("validate", "--budgets selects budgets of an --experiment file");
    else if ((top_text || by_given) && !winners)
        rc = cli_usage_error("validate", "%s ranks the rows of --winners",
                             top_text ? "--top" : "--by");
    if (!rc) rc = cli_sim_options_check("validate", &o, false);
    if (!rc && top_text &&
        (!config_parse_u64(top_text, &top) || top < 1 || top > VALIDATE_MAX_RUNS))
        rc = cli_usage_error("validate", "--top: expected an integer in [1, %d], got '%s'",
                             VALIDATE_MAX_RUNS, top_text);
    if (!rc && repeats_text &&
        (!config_parse_u64(repeats_text, &repeats) || repeats < 1 || repeats > VALIDATE_MAX_ROUNDS))
        rc = cli_usage_error("validate", "--repeats: expected an integer in [1, %d], got '%s'",
                             VALIDATE_MAX_ROUNDS, repeats_text);
    if (!rc && calibrate_repeats_text &&
        (!config_parse_u64(calibrate_repeats_text, &calibrate_repeats) || calibrate_repeats < 1 ||
         calibrate_repeats > 10000))
        rc = cli_usage_error("validate",
                             "--calibrate-repeats: expected an integer in [1, 10000], got '%s'",
                             calibrate_repeats_text);
    if (!rc && calibrate_repeats_text && !calibrate_dir)
        rc = cli_usage_error("validate", "--calibrate-repeats goes with --calibrate-rounds DIR");
    if (!rc && ssd_dir && strcmp(backend, "cpu"))
        rc = cli_usage_error("validate", "--ssd-dir goes with --backend cpu");
    if (!rc && seed_text && !config_parse_u64(seed_text, &seed))
        rc = cli_usage_error("validate", "--seed: expected a non-negative integer, got '%s'",
                             seed_text);
    double check_tpot = 0, check_margin = 0;
    if (!rc && strcmp(backend, "cuda") && strcmp(backend, "cpu"))
        rc = cli_usage_error("validate", "--backend: expected cuda or cpu, got '%s'", backend);
    else if (!rc && check && !parse_check(check, &check_tpot, &check_margin))
        rc = cli_usage_error("validate",
                             "--check: expected TPOT,MARGIN as two numbers (e.g. 0.25,0.3), got "
                             "'%s'",
                             check);
    if (rc) {
        cli_sim_options_free(&o);
        return rc;
    }
    moesim_error err = {0};
    config *settings =
        config_create(); /* its errors first, as in `moesim sim` (runs make theirs) */
    moesim_status st = cli_sim_options_settings(&o, settings, &err);
    config_destroy(settings);
    validate_plan plan = {0};
    if (!st && experiment)
        st = sweep_validate_plan_experiment(experiment, budgets, &plan, &err);
    else if (!st && winners)
        st = sweep_validate_plan_winners(winners, by, (uint32_t)top,
                                         o.trace_path ? o.trace_path : "",
                                         o.hw_name ? o.hw_name : "", &plan, &err);
    else if (!st)
        sweep_validate_plan_one(o.policy_name, &plan);
    /* trace and hw may come from the experiment file (the option wins) */
    const char *trace_path = o.trace_path ? o.trace_path : plan.trace;
    const char *hw_name = o.hw_name ? o.hw_name : plan.hw;
    if (!st && (!trace_path[0] || !hw_name[0]))
        st = moesim_fail(&err, MOESIM_EINPUT,
                         "validate: --trace and --hw are required (or trace and hw in the "
                         "experiment file)");
    if (!repeats_text && plan.repeats) repeats = plan.repeats;
    if (!check && plan.check) {
        check_tpot = plan.check_tpot;
        check_margin = plan.check_margin;
    }
    bool checking = check || plan.check;
    validate_setup setup = {.files = o.files,
                            .n_files = o.n_files,
                            .sets = o.sets,
                            .n_sets = o.n_sets,
                            .trace_path = trace_path,
                            .hw_name = hw_name,
                            .model_name = plan.model[0] ? plan.model : NULL,
                            .seed = seed,
                            .cpu = !strcmp(backend, "cpu"),
                            .ssd_dir = ssd_dir,
                            .repeats = (uint32_t)repeats,
                            .quiet = o.json || o.quiet,
                            .calibrate_dir = calibrate_dir,
                            .calibrate_repeats = (uint32_t)calibrate_repeats};
    validate_row *rows = moesim_xcalloc(plan.n ? plan.n : 1, sizeof *rows);
    validate_meta meta;
    if (!st) st = sweep_validate_run(&setup, &plan, rows, &meta, &err);
    validate_summary s;
    if (!st) validate_summarize(rows, plan.n, &s);
    if (!st && !s.n_rows) /* a report of nothing compared would read as a result */
        st = moesim_fail(&err, MOESIM_EINPUT,
                         "no configuration was compared: the simulator refused every one "
                         "(the first: %s)",
                         plan.n ? rows[0].note : "none planned");
    if (!st) {
        json_t *inputs = json_object(); /* what the rows were made from */
        json_object_set_new(inputs, "trace", provenance_file_json(trace_path));
        json_object_set_new(inputs, "model", provenance_config_json("models", meta.model));
        json_object_set_new(inputs, "hw", provenance_config_json("hw", hw_name));
        json_object_set_new(inputs, "experiment",
                            experiment ? provenance_file_json(experiment) : json_null());
        json_object_set_new(inputs, "backend", json_string(backend));
        json_object_set_new(inputs, "seed", json_integer((json_int_t)seed));
        st = write_outputs(&meta, rows, plan.n, &s, report, csv, o.json, inputs, &err);
    }
    if (!st && checking) {
        uint64_t pairs, alike;
        bool order = validate_order_beyond(rows, plan.n, check_margin, &pairs, &alike);
        fprintf(stderr,
                "validate: check: median |TPOT error| %.1f %% (limit %.1f %%), %" PRIu64
                " of %" PRIu64 " pairs more than %.0f %% apart ordered alike\n",
                100 * s.tpot_abs_err_median, 100 * check_tpot, alike, pairs, 100 * check_margin);
        if (s.drift_exceeds_error)
            fprintf(stderr,
                    "validate: check: the machine drifted more (median %.1f %% of TPOT within a "
                    "round) than the error: no result\n",
                    100 * s.drift_tpot_median);
        if (!(s.tpot_abs_err_median <= check_tpot) || !order || s.drift_exceeds_error) rc = 1;
    }
    if (st) rc = cli_fail(&err);
    free(rows);
    sweep_validate_plan_free(&plan);
    cli_sim_options_free(&o);
    return rc;
}
