/* What a result was made from, for the JSON of sim, replay, validate and trace stats: the
 * `inputs` object (the trace, model and hw by path or name with a hash of their bytes, the policy
 * and every setting and knob as resolved, the seed) and the `moesim` object (the version and the
 * commit of the build), so a result file alone says how to make it again. */
#ifndef MOESIM_CORE_PROVENANCE_H
#define MOESIM_CORE_PROVENANCE_H

#include <jansson.h>

#include "common/config.h"
#include "traces/trace.h"

/* {"version": "0.1.0", "git": "<git describe of the build>"}. New reference. */
json_t *provenance_moesim_json(void);

/* {"path": PATH, "fnv1a64": "<16 hex digits of FNV-1a 64 over the file's bytes>"}; the hash is
 * null when the file cannot be read. New reference. */
json_t *provenance_file_json(const char *path);

/* {"name": NAME, "path": ..., "fnv1a64": ...} of a configs/KIND name (or path) as the data search
 * path resolves it; path and hash null when it does not resolve (a checkpoint folder). */
json_t *provenance_config_json(const char *kind, const char *name);

/* The `inputs` of a run: trace (path and hash), model and hw (provenance_config_json; a model no
 * data folder has but trace t stores: "stored_in_trace" and the hash of that text), policy, and
 * "settings": every setting the simulator reads and every knob of the policy, "section.key" ->
 * value as resolved (given by --config or --set, else the default), and "seed" (sim.seed).
 * `settings` is what the run read. New reference. */
json_t *provenance_inputs_json(const trace *t, const char *trace_path, const char *model_name,
                               const char *hw_name, const char *policy_name, config *settings);

/* Adds "inputs" and "moesim" to `result` (a command's JSON object) and returns it. */
json_t *provenance_attach(json_t *result, json_t *inputs);

#endif
