/* The field table of the run settings (core/settings.h): names, types, ranges, defaults and
 * their sources, as `--help` lists them. */
#include "core/settings.h"

#include <stddef.h>

#include "common/check.h"
#include "common/model.h"
#include "traces/trace.h"

static const char *const precision_choices[] = {"bf16", "fp8",  "int8", "int4",
                                                "int3", "int2", NULL};

#define SF(sec, k, t, m, mn, mx, d, h)                                                             \
    { sec, k, t, offsetof(sim_settings, m), 0, false, mn, mx, NULL, d, h }
static const config_field sim_fields[] = {
    SF("memory", "budget_gb", CONFIG_F64, budget_gb, 0, 1e6, "0",
       "HBM the run may use, GiB; 0: the hardware profile's memory"),
    SF("cache", "experts_per_layer", CONFIG_U32, experts_per_layer, 0, MODEL_MAX_EXPERTS, "0",
       "per-layer expert pool in experts at expert.precision; 0: one pool from the budget"),
    {"expert", "precision", CONFIG_ENUM, offsetof(sim_settings, precision), 0, false, 1, 0,
     precision_choices, "bf16", "precision single-precision policies run experts at"},
    SF("batch", "size", CONFIG_U32, batch_size, 1, 65536, "1",
       "requests in flight together (each decode step advances each by one token)"),
    SF("predictor", "accuracy", CONFIG_F64, predictor_accuracy, 0, 1, "0.9",
       "top-1 accuracy of the emulated look-ahead predictor (traces without predictions); 0.9: "
       "HOBBIT §3.3 measures ~96% next layer, ~90% 2-3 layers ahead"),
    SF("predictor", "depth", CONFIG_U32, predictor_depth, 0, TRACE_MAX_LOOKAHEAD_DEPTH, "1",
       "look-ahead distance D of the emulated predictor"),
    SF("sim", "chunk_kib", CONFIG_U64, chunk_kib, 4, 1u << 20, "1024",
       "copy chunk size, KiB: a demand load overtakes queued prefetches at chunk boundaries (1 "
       "MiB: assumption, a few % of one PCIe copy's latency at 24 GB/s)"),
    {"sim", "part_overlap", CONFIG_BOOL, offsetof(sim_settings, part_overlap), 0, false, 1, 0, NULL,
     "true", "start an expert's gate/up compute before its down matrix arrives"},
    SF("sim", "seed", CONFIG_U64, seed, 1, 0, "1", "seed of the emulated predictor and policies"),
    {"sim", "host_precisions", CONFIG_STR, offsetof(sim_settings, host_precisions),
     sizeof(((sim_settings *)0)->host_precisions), false, 1, 0, NULL, "policy",
     "precisions host DRAM holds experts at: 'policy' (those the policy declares it loads), "
     "'all', or a comma list; what DRAM cannot hold lives on the SSD"},
    SF("sim", "bounce_mib", CONFIG_U64, bounce_mib, 1, 1u << 20, "64",
       "DRAM staging buffer for SSD reads, MiB, taken from the profile's dram_gib (assumption: 64 "
       "chunks of the default 1 MiB keep the SSD and PCIe copies pipelined; no engine standard)"),
    {"sim", "block_pools", CONFIG_BOOL, offsetof(sim_settings, block_pools), 0, false, 1, 0, NULL,
     "false",
     "place loads in fixed-size blocks per precision, as the replay's pools do (a freed block "
     "serves its own precision only: sim/block_pool.h); false: the byte budget alone"},
    {"sim", "cost_table", CONFIG_STR, offsetof(sim_settings, cost_table),
     sizeof(((sim_settings *)0)->cost_table), false, 1, 0, NULL, NULL,
     "measured cost table (sim/COST.md); empty: roofline"},
};
#undef SF

const config_field *sim_settings_fields(size_t *n) {
    *n = MOESIM_ARRAY_LEN(sim_fields);
    return sim_fields;
}

moesim_status sim_settings_read(config *c, sim_settings *out, moesim_error *err) {
    return config_read_fields(c, sim_fields, MOESIM_ARRAY_LEN(sim_fields), out, err);
}
