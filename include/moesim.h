/* libmoesim: moesim's trace reader, simulator and sweeps as a C library (lib/README.md).
 *
 * Every call that can fail returns 0 on success or a moesim status (1: bad input, 2: I/O,
 * 3: out of memory) and, when `error` is not NULL, sets *error to the one-line message the CLI
 * would print (without "moesim: "); the library never exits or prints. Strings it returns
 * (*json, *error, ...) are malloc'd: free them with moesim_free. Inputs are plain paths and
 * names: a model, hw profile or quant table by name (looked up along the data search path:
 * $MOESIM_DATA_PATH, ../share/moesim beside the program, the source tree of a build) or by path
 * (a name with '/' or ending in ".ini").
 *
 * Threads: the calls keep no state between them, but every call that reads a trace uses HDF5,
 * whose usual (Debian) build is not thread-safe: make them from one thread at a time
 * (moesim_sweep runs its own worker threads safely: it reads the traces before they start).
 * ABI: the soname is libmoesim.so.MOESIM_ABI_VERSION; a change to these declarations that
 * breaks old callers bumps it. */
#ifndef MOESIM_H
#define MOESIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOESIM_ABI_VERSION 1

/* Status codes (common/status.h's moesim_status values). */
#define MOESIM_LIB_OK     0
#define MOESIM_LIB_EINPUT 1
#define MOESIM_LIB_EIO    2
#define MOESIM_LIB_ENOMEM 3

const char *moesim_version(void); /* "0.1.0"; static storage */
int moesim_abi_version(void);     /* MOESIM_ABI_VERSION of the loaded library */

void moesim_free(void *p); /* frees what the library returned; accepts NULL */

/* Reads (and so fully validates: traces/FORMAT.md) the trace at `path`. With `info` not NULL,
 * *info receives a JSON object of what it holds: model, tokens, prefill_tokens, decode_tokens,
 * requests, layers, experts, top_k, lookahead_depth, lookahead_k, has_importance. */
int moesim_trace_open(const char *path, char **info, char **error);

/* The trace's statistics: the JSON object `moesim trace stats FILE --json` prints. */
int moesim_trace_stats(const char *path, char **json, char **error);

/* Loads and checks a configuration file of `kind` ("models", "hw" or "quant") by name or path;
 * *path receives the file it resolved to (may be NULL). quant's name may be NULL: the default
 * table (configs/quant.ini). */
int moesim_config_load(const char *kind, const char *name, char **path, char **error);

/* One simulator run: the JSON object `moesim sim --json` prints for the same inputs.
 *   trace, hw, policy: as --trace, --hw, --policy (policy may be NULL with a policy_lib: its
 *                      policy);
 *   model:             as --model, or NULL (the trace's model);
 *   policy_lib:        as --policy-lib (a policy plug-in FILE.so), or NULL;
 *   settings:          n_settings "section.key=value" strings, as --set takes them, applied in
 *                      order (sim/sim.h lists the settings; policy knobs too). */
int moesim_sim(const char *trace, const char *hw, const char *policy, const char *model,
               const char *policy_lib, const char *const *settings, size_t n_settings, char **json,
               char **error);

/* Runs the experiment file's configurations not yet in `csv_path` (created or resumed, as
 * `moesim sweep EXPERIMENT -o CSV` does; the resolved experiment is written beside it) on `jobs`
 * threads (0: 1; at most 1024). The traces must exist: [traces] recipes are made by
 * `moesim sweep` only. With `summary` not NULL, *summary receives {"configurations",
 * "already_done", "ran", "failed", "first_failure"} as JSON. A failing configuration is a row with
 * its error, not a failure of the call. */
int moesim_sweep(const char *experiment, const char *csv_path, unsigned jobs, char **summary,
                 char **error);

/* A router trace given as arrays, for moesim_trace_write (traces/FORMAT.md names every field;
 * N = n_tokens, L, k, E from the model config; D, K' the look-ahead shape). Arrays are C order;
 * the optional ones may be NULL. */
typedef struct moesim_trace_data {
    const char *model_config;   /* the model config file's text (INI, configs/models/README.md):
                                   the trace's model name and geometry; stored in params_json as
                                   "model_config" so later commands need no model file */
    const char *source;         /* the `source` attribute, e.g. "hf:transformers-<version>" */
    const char *params_json;    /* a JSON object of the producer's settings, or NULL */
    uint64_t model_config_hash; /* of the checkpoint's config, or 0 */
    size_t n_tokens;
    const uint32_t *request_id;    /* [N] dense, numbered by first appearance */
    const uint32_t *position;      /* [N] */
    const uint8_t *phase;          /* [N] 0 prefill, 1 decode */
    const int32_t *token_id;       /* [N] or NULL */
    const uint16_t *expert_ids;    /* [N][L][k] */
    const float *gate_weights;     /* [N][L][k] */
    const float *importance;       /* [N][L] or NULL */
    uint32_t lookahead_depth;      /* D, 0: no look-ahead (the two arrays below are ignored) */
    uint32_t lookahead_k;          /* K' */
    const uint16_t *lookahead_ids; /* [N][L][D][K'] */
    const float *lookahead_scores; /* [N][L][D][K'] */
} moesim_trace_data;

/* The trace shape a model config's text (INI) gives: *json receives {"model", "layers" (its
 * MoE layers, L), "experts" (E), "top_k" (k)}; a bad config is an error naming the field. */
int moesim_model_shape(const char *model_config, char **json, char **error);

/* Writes `data` as the trace file `path` with the writer `moesim record`, `trace import` and
 * `trace synth` use: every value checked first (an invalid trace writes nothing; the error
 * names the dataset and index), crash-safe (the file appears whole or not at all),
 * deterministic bytes. */
int moesim_trace_write(const char *path, const moesim_trace_data *data, char **error);

#ifdef __cplusplus
}
#endif

#endif
