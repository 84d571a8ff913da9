/* libFuzzer harness for the INI loader (common/config.c) and the typed readers that consume what
 * it loads: any byte string is an INI file; config_load_file must accept it or return one error
 * line, and then every reader the CLI applies to a settings file (hardware, model, quantization,
 * simulator settings, each registered policy's knobs, the unused-entry check) must do the same
 * on what was loaded. No crash, leak, hang or out-of-bounds read.
 * Build and run: make fuzz (see tests/fuzz/README.md). */
#include <stdlib.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "fuzz_support.h"
#include "policies/policy.h"
#include "sim/sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file_of(data, size);
    config *c = config_create();
    moesim_error err = {0};
    moesim_status st = config_load_file(c, path, &err);
    fuzz_check_error(st, &err);
    if (st == MOESIM_OK) {
        /* each reader on its own: one reader's refusal must not hide another's crash */
        hw_profile hw;
        fuzz_check_error(hw_read_config(c, &hw, &err), &err);
        model_geometry m;
        fuzz_check_error(model_read_config(c, &m, &err), &err);
        quant_table q;
        fuzz_check_error(quant_table_read_config(c, &q, &err), &err);
        sim_settings s;
        fuzz_check_error(sim_settings_read(c, &s, &err), &err);
        size_t n_policies;
        const policy_methods *const *all = policy_all(&n_policies);
        for (size_t i = 0; i < n_policies; i++) {
            void *knobs = NULL;
            fuzz_check_error(policy_read_knobs(all[i], c, &knobs, &err), &err);
            free(knobs);
        }
        fuzz_check_error(config_check_unused(c, &err), &err);
    }
    config_destroy(c);
    return 0;
}
