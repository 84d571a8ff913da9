/* The seed policies on an imported routing log: a synthesized trace exported as JSONL and
 * imported back has no importance and no look-ahead (the JSONL shapes cannot carry them), which
 * is what a user's vLLM log gives. dymoe, dynaexq and firm-moe must run on it through the
 * command line with the emulated predictor, and report the precision mix and prefetch figures. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "support/test_support.h"

static char imported[4096];
static char out[1 << 20], errbuf[8192];

static void setup(void) {
    char synth[4096], jsonl[4096];
    snprintf(synth, sizeof synth, "%s", test_tmp_path("imp-synth.h5"));
    snprintf(jsonl, sizeof jsonl, "%s", test_tmp_path("imp.jsonl"));
    snprintf(imported, sizeof imported, "%s", test_tmp_path("imp.h5"));
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "synth", "--model",
                             "olmoe-1b-7b", "--requests", "4", "--prompt-len", "32", "--gen-len",
                             "16", "--seed", "3", "-q", "-o", synth, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "export", "--format",
                         "jsonl", synth, "-o", jsonl, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "trace", "import", "--format",
                         "jsonl", "--model", "olmoe-1b-7b", jsonl, "-o", imported, NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
}

TestSuite(policy_imported, .init = setup);

static json_t *run_policy(const char *policy) {
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "sim", "--trace", imported,
                             "--hw", "rtx3090-pcie4", "--policy", policy, "--set",
                             "memory.budget_gb=6", "--json", NULL);
    cr_assert_eq(rc, 0, "%s: %s", policy, errbuf);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "%s: not JSON: %s", policy, je.text);
    cr_assert_eq(json_integer_value(json_object_get(j, "tokens")), 4 * 48, "%s", policy);
    cr_assert_str_eq(json_string_value(json_object_get(j, "predictor")), "emulated", "%s", policy);
    json_t *mix = json_object_get(j, "precision_mix");
    double hi = json_number_value(json_object_get(mix, "hi")),
           lo = json_number_value(json_object_get(mix, "lo")),
           skip = json_number_value(json_object_get(mix, "skip"));
    cr_assert_float_eq(hi + lo + skip, 1.0, 1e-9, "%s: mix %g %g %g", policy, hi, lo, skip);
    cr_assert(json_is_number(json_object_get(json_object_get(j, "prefetch"), "accuracy")));
    return j;
}

Test(policy_imported, dymoe_runs_on_an_imported_log_without_importance_or_look_ahead) {
    json_decref(run_policy("dymoe"));
}

Test(policy_imported, dynaexq_runs_on_an_imported_log_and_runs_some_gate_mass_at_lo) {
    json_t *j = run_policy("dynaexq");
    double lo = json_number_value(json_object_get(json_object_get(j, "precision_mix"), "lo"));
    cr_assert(lo > 0, "at 6 GB not every OLMoE expert fits at bf16: lo share %g", lo);
    json_decref(j);
}

Test(policy_imported, firm_moe_prefetches_on_an_imported_log_from_the_emulated_predictor) {
    json_t *j = run_policy("firm-moe");
    cr_assert_gt(json_integer_value(json_object_get(json_object_get(j, "prefetch"), "issued")), 0);
    json_decref(j);
}
