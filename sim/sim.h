/* The simulator's front door: one run of a trace under a policy on a hardware profile, and its
 * metrics. `moesim sim`, `moesim sweep` and `moesim validate` all go through sim_run, so a sweep
 * row and a single run with the same resolved settings give the same figures (same bytes of
 * JSON: the simulator is deterministic).
 *
 * Settings come from one `config` (files + --set entries + sweep axes), sections:
 *   [memory] budget_gb          HBM the run may use (default: the hardware profile's memory)
 *   [cache]  experts_per_layer  explicit per-layer expert pool (0: pools take what the budget
 *                               leaves after non-expert weights, KV cache and activations)
 *   [expert] precision          precision of single-precision policies (bf16, int8, int4, ...)
 *   [batch]  size               requests in flight together
 *   [predictor] accuracy, depth top-1 accuracy and distance of the emulated look-ahead
 *                               predictor (used only when the trace has no predictions)
 *   [sim] chunk_kib, part_overlap, seed, host_precisions, bounce_mib, block_pools, cost_table
 *                               simulator knobs (sim/README.md; `moesim sim --help`)
 *   [<policy name>] ...         the policy's knobs (policies/policy.h)
 * Every key is checked: an unknown key or section is an error naming where it came from. */
#ifndef MOESIM_SIM_SIM_H
#define MOESIM_SIM_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "common/status.h"
#include "policies/policy.h"
#include "core/result.h"
#include "core/settings.h"
#include "core/timeline.h"
#include "traces/trace.h"


/* What a run reads; all borrowed for the duration of sim_run. */
/* Bumped whenever the simulator's figures change for the same inputs (a cost, an event order, a
 * metric's definition): part of a sweep's configuration hash, so older rows are rerun. */
#define SIM_CODE_VERSION 1

typedef struct sim_inputs {
    const trace *trace;
    trace_stream *stream; /* optional: the routing, importance and look-ahead rows are read from
                             here block by block (memory does not grow with the trace), and
                             `trace` is trace_stream_tokens(stream); NULL: `trace` holds them.
                             Opened with sim_stream_options(policy) or reading every row */
    const model_geometry *model; /* must match the trace's geometry (checked) */
    const hw_profile *hw;
    const quant_table *quant;
    const char *timeline_path;    /* a timeline (format by name: core/timeline.h), or NULL */
    sim_timeline_window timeline_window; /* the part of the run it keeps; zeroed: all of it */
    const sim_hooks *hooks;       /* optional, NULL for none */
    const policy_methods *policy; /* optional: run this table instead of looking the name up
                                     (tests, out-of-tree policies); NULL: the registry */
} sim_inputs;

/* Runs the trace under `policy_name` with `settings` (which the run reads and checks; unknown
 * entries are an error). Fails with one line for bad settings, an unknown policy (listing the
 * known ones), a policy that cannot work in the budget, a trace/model mismatch, or a stream
 * whose rows fail their check (trace_stream_check_rest, after the run: then nothing of the run is
 * kept, no timeline either). */
moesim_status sim_run(const sim_inputs *in, const char *policy_name, config *settings,
                      sim_result *out, moesim_error *err);
/* What sim_run checks of `settings` before it looks at any input: the policy (`table`, as
 * sim_inputs.policy: NULL looks `policy_name` up) known, every setting and knob of `settings`
 * parsed and in range, none unknown. A sweep checks each configuration so before running any. */
moesim_status sim_settings_check(const policy_methods *table, const char *policy_name,
                                 config *settings, moesim_error *err);
/* The rows a run reads, for opening its stream (sim_inputs.stream): the run of `table` (as
 * sim_inputs.policy: NULL looks `policy_name` up) with the knobs of its section in `settings`.
 * Look-ahead rows are skipped when the policy ignores them with those knobs
 * (policy_ignores_lookahead). An unknown name or bad knobs ask for every row (sim_run then
 * reports them). The rows are checked as the run reads them (check_rows_on_read: one inflation
 * per block for one run); a caller that runs many simulations on one stream may open it with
 * every value checked up front instead. */
trace_stream_options sim_stream_options(const policy_methods *table, const char *policy_name,
                                        config *settings);


#endif
