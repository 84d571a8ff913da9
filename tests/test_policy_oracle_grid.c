/* `oracle` runs every expert (no skip) over a grid of budgets, from the smallest its setup
 * accepts upward, at batch 1 and 4 with prompts of 64-256 tokens, on every configured model
 * (configs/models). Label slow: a few hundred simulations (about a minute on two cores). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/paths.h"
#include "sim/sim.h"
#include "traces/synth.h"

static quant_table quant;

static void setup(void) {
    moesim_error err = {0};
    cr_assert_eq(quant_table_load_default(&quant, &err), MOESIM_OK, "%s", err.msg);
}

TestSuite(policy_oracle_grid, .init = setup);

static moesim_status run_oracle(const trace *t, const model_geometry *m, const hw_profile *hw,
                                double budget_gib, const char *batch, sim_result *r,
                                moesim_error *err) {
    char budget[64];
    snprintf(budget, sizeof budget, "memory.budget_gb=%.6f", budget_gib);
    const char *sets[] = {"expert.precision=int4", budget, batch, NULL};
    config *c = config_create();
    for (const char *const *s = sets; *s; s++)
        cr_assert_eq(config_set(c, *s, err), MOESIM_OK, "%s", err->msg);
    sim_inputs in = {.trace = t, .model = m, .hw = hw, .quant = &quant};
    moesim_status st = sim_run(&in, "oracle", c, r, err);
    config_destroy(c);
    return st;
}

Test(policy_oracle_grid, oracle_runs_every_expert_at_every_budget_it_accepts_on_every_model) {
    char names[8192]; /* every configured model, along the data search path */
    moesim_config_names("models", names, sizeof names);
    cr_assert(names[0], "no configured model found");
    hw_profile hw;
    moesim_error err = {0};
    cr_assert_eq(hw_load_by_name("rtx3090-pcie3", &hw, &err), MOESIM_OK, "%s", err.msg);
    size_t models = 0;
    for (char *save = NULL, *name = strtok_r(names, ", ", &save); name;
         name = strtok_r(NULL, ", ", &save)) {
        model_geometry m;
        cr_assert_eq(model_load_by_name(name, &m, &err), MOESIM_OK, "%s: %s", name, err.msg);
        synth_options o;
        synth_options_default(&o, &m);
        o.n_requests = 3;
        o.prompt_len = (synth_range){64, 256};
        o.gen_len = (synth_range){4, 4};
        o.lookahead_depth = 0;
        o.seed = 3;
        trace *t = NULL;
        cr_assert_eq(synth_generate(&m, &o, &t, &err), MOESIM_OK, "%s: %s", name, err.msg);
        double eb_gib = (double)model_expert_bytes(&m, &quant, PREC_INT4) / (1 << 30);
        double base_gib = (double)model_non_expert_bytes(&m) / (1 << 30);
        static const char *const batches[] = {"batch.size=1", "batch.size=4"};
        for (size_t b = 0; b < 2; b++) {
            /* the smallest budget the setup accepts, to a tenth of an expert: grow the
             * room above the non-expert weights until accepted, then bisect */
            sim_result r;
            double refused = base_gib, room = eb_gib;
            while (run_oracle(t, &m, &hw, refused + room, batches[b], &r, &err) != MOESIM_OK) {
                cr_assert_lt(room, 64.0, "%s: %s", name, err.msg);
                refused += room;
                room *= 2;
            }
            double lo = refused + room;
            while (lo - refused > 0.1 * eb_gib) {
                double mid = (lo + refused) / 2;
                if (run_oracle(t, &m, &hw, mid, batches[b], &r, &err) == MOESIM_OK)
                    lo = mid;
                else
                    refused = mid;
            }
            /* it and room for 1, 2, 4, 8 and 16 experts more */
            for (uint32_t more = 0; more <= 16; more = more ? 2 * more : 1) {
                double gib = lo + more * eb_gib;
                cr_assert_eq(run_oracle(t, &m, &hw, gib, batches[b], &r, &err), MOESIM_OK,
                             "%s: %.4f GiB refused above an accepted budget: %s", name, gib,
                             err.msg);
                cr_assert_eq(r.precision_mix_skip, 0.0, "%s, %.4f GiB, %s: oracle skipped %.4f",
                             name, gib, batches[b], r.precision_mix_skip);
            }
        }
        trace_destroy(t);
        models++;
    }
    cr_assert_geq(models, 7, "every configured model");
}
