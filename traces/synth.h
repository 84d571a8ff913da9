/* The router-trace synthesizer: full-size traces for any model of configs/models whose routing
 * statistics (traces/STATS.md) match what has been measured on real models
 * (traces/SYNTH.md cites each). traces/SYNTH.md states the generative model, every knob, the
 * defaults per model family with their sources, and the tolerances the tests assert.
 *
 * The model, per MoE layer l and token (all randomness from common/rng.h streams of one seed):
 *   - popularity: each workload (text, math, code) has its own log-popularity of the E experts
 *     per layer, scaled by a depth profile and a workload factor (hot sets shift between
 *     workloads);
 *   - batch correlation: a request follows one topic, a further log-popularity offset; the next
 *     request continues the same topic with probability topic_persistence, so requests that
 *     run together (consecutive ids) concentrate on the same experts;
 *   - temporal locality: a token copies its previous token's top-1 (and each other slot one of
 *     its previous experts) with depth-dependent probabilities (the knobs added for --fit, off
 *     by default, add copies from further back, whole rows per phase and repeated tokens);
 *   - the remaining slots are drawn without replacement from the topic's distribution (alias
 *     tables, Plackett-Luce order: the first drawn is the top-1);
 *   - gate weights: Gumbel order-statistic logits, softmax over the top-k or over all experts
 *     as the model config says;
 *   - importance (DyMoE Eq. 1, as the engine records it): attention received, from a sink share
 *     on the first token and log-normal salience weights;
 *   - look-ahead: for d = 1..D the top-K' candidates for layer l + d, whose first candidate is
 *     the true top-1 with probability lookahead_top1_d{d}.
 *
 * Invariants: the same options (and seed) give the same trace, byte for byte; the result
 * passes trace_check; decode tokens of a request follow its prefill tokens. */
#ifndef MOESIM_TRACES_SYNTH_H
#define MOESIM_TRACES_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/model.h"
#include "common/status.h"
#include "traces/trace.h"

typedef enum synth_workload {
    SYNTH_TEXT = 0,
    SYNTH_MATH,
    SYNTH_CODE,
    SYNTH_MIX, /* each topic session draws text, math or code */
} synth_workload;
#define SYNTH_N_WORKLOADS  3  /* text, math, code (mix draws among them) */
#define SYNTH_MAX_HISTORY  64 /* most tokens reuse_history_tokens may reach back */
#define SYNTH_TABLE_PHASES 2  /* a fitted popularity table has rows for prefill, then decode */

/* A length fixed (min == max) or drawn uniformly from [min, max], in tokens. */
typedef struct synth_range {
    uint32_t min, max;
} synth_range;

/* The generative model's knobs (traces/SYNTH.md explains each; names say what they control).
 * Depth profiles: *_first at MoE layer 0, *_mid at layer (L-1)/2, *_last at layer L-1, linear
 * in between. Probabilities in [0, 1]. */
typedef struct synth_knobs {
    /* per-layer expert popularity: std of the log-popularity of a layer's experts */
    double popularity_skew_first, popularity_skew_mid, popularity_skew_last;
    double workload_skew_text, workload_skew_math, workload_skew_code; /* multipliers */
    double workload_hot_set_correlation; /* log-popularity correlation between workloads */
    /* correlation between requests of one batch */
    double topics;              /* topics per workload (an integer >= 1) */
    double topic_concentration; /* std of a topic's log-popularity offset */
    double topic_persistence;   /* P(next request continues the previous one's topic) */
    /* 1: a request that changes topic takes the next one in turn instead of a random one, so
     * requests that run together have distinct topics while there are enough (added for --fit;
     * 0 = random, the published model) */
    double topic_cycle;
    double popularity_smoothing; /* fitted table only: weight of the layer's overall popularity
                                  * mixed into each topic's (0: the topic's own counts) */
    double popularity_sharpness_first, popularity_sharpness_mid,
        popularity_sharpness_last; /* fitted table only, a depth profile: exponent on those
                                    * probabilities (1: as counted; > 1 sharper; the locality
                                    * knobs flatten or sharpen a layer a little) */
    /* temporal locality between consecutive tokens of a request */
    double reuse_top1_first, reuse_top1_mid, reuse_top1_last; /* P(copy previous top-1) */
    double reuse_other_first, reuse_other_mid,
        reuse_other_last; /* P(slot copies a previous); < 0: P(redraw) */
    /* locality beyond the previous token (added for `trace synth --fit`; 0 = off, the model
     * of the published defaults): P(a drawn slot copies an expert of one of the request's
     * tokens 2..reuse_history_tokens + 1 back at this layer, the token and its slot uniform) */
    double reuse_history_first, reuse_history_mid, reuse_history_last;
    double reuse_history_tokens; /* H, the history's length in tokens (an integer >= 1) */
    /* P(a token's row at this layer is its predecessor's whole row: experts and gates), layer
     * by layer, for prefill and decode tokens apart (added for --fit; 0 = off): rows shared
     * whole, which the slot copies above make too rarely for a given reuse top-1 and reuse
     * any, and more often between decode tokens than between prompt tokens */
    double reuse_row_prefill_first, reuse_row_prefill_mid, reuse_row_prefill_last;
    double reuse_row_decode_first, reuse_row_decode_mid, reuse_row_decode_last;
    /* P(a decode token repeats its predecessor's routing at every layer: experts and gates),
     * as repeated tokens do (decoding loops, repeated n-grams); 0 = off, added for --fit */
    double repeat_decode_token;
    /* cross-layer predictability */
    double lookahead_top1_d1, lookahead_top1_d2, lookahead_top1_d3; /* P(first candidate right) */
    double lookahead_top1_decay;   /* factor per distance beyond 3 */
    double lookahead_recall_d1;    /* share of the k true experts among the first k candidates */
    double lookahead_recall_decay; /* factor per distance beyond 1 */
    /* gate-weight distribution */
    double gate_logit_scale; /* spread of the chosen experts' router logits (Gumbel spacings) */
    double gate_tail_gap;    /* logit gap from the k-th chosen to the unchosen experts */
    /* token importance */
    double importance_sink_share;        /* share of each query's attention on token 0 */
    double importance_salience_sigma;    /* std of a token's log-salience */
    double importance_layer_correlation; /* correlation of a token's salience across layers */
} synth_knobs;

typedef struct synth_options {
    uint32_t n_requests;
    synth_range prompt_len; /* prefill tokens per request, >= 1 */
    synth_range gen_len;    /* decode tokens per request, >= 0 */
    synth_workload workload;
    uint64_t seed;
    uint32_t lookahead_depth; /* D, 0..TRACE_MAX_LOOKAHEAD_DEPTH (0: no predictions) */
    uint32_t lookahead_k;     /* K', 1..min(E, TRACE_MAX_LOOKAHEAD_K) when D > 0 */
    synth_knobs knobs;
    bool show_progress;       /* draw a progress bar on stderr when it is a terminal */
    char family_defaults[32]; /* the family whose defaults `knobs` started from (for params) */
    /* the text of the model config file, stored in params_json ("model_config") so the trace
     * carries its geometry (traces/FORMAT.md); NULL: not stored. Not owned. */
    const char *model_config;
    /* a fitted popularity table (`trace synth --fit`): [topics][SYNTH_TABLE_PHASES][L][E]
     * each topic's expert probabilities per phase (prefill, decode) and layer (each row sums to
     * 1), used instead of the random log-normal
     * popularity and topic offsets; NULL: the random model. Not owned. */
    const float *popularity;
    uint32_t popularity_topics; /* the table's topics: knobs.topics must equal it */
    /* fitted per-layer values of the locality knobs (`trace synth --fit`): [SYNTH_LAYER_KNOBS]
     * [L], each replacing its depth profile at that layer (NaN: the profile's); NULL: the
     * profiles. Not owned. */
    const double *layer_knobs;
} synth_options;

/* The locality knobs a fit sets per layer (each also a depth profile <name>_first/_mid/_last). */
typedef enum synth_layer_knob {
    SYNTH_LK_REUSE_TOP1 = 0,
    SYNTH_LK_REUSE_OTHER,
    SYNTH_LK_REUSE_HISTORY,
    SYNTH_LK_ROW_PREFILL,
    SYNTH_LK_ROW_DECODE,
    SYNTH_LK_HISTORY_TOKENS, /* tokens back that history copies reach, <= reuse_history_tokens */
    SYNTH_LAYER_KNOBS,
} synth_layer_knob;

/* "reuse_top1", "reuse_other", "reuse_history", "reuse_row_prefill", "reuse_row_decode",
 * "reuse_history_tokens". */
extern const char *const synth_layer_knob_names[SYNTH_LAYER_KNOBS];

/* The per-layer knob that knob `knob` (a --set name) is a profile point of, or -1. */
int synth_layer_knob_of(const char *knob);

/* Knob `k` at MoE layer l of L: o->layer_knobs' value (NaN: none), else its depth profile. */
double synth_layer_knob_value(const synth_options *o, synth_layer_knob k, uint32_t l, uint32_t L);

/* One knob of synth_knobs: its name (the --set key), where it lives, its valid range and what
 * it controls. The table drives option parsing, params_json and the docs. */
typedef struct synth_knob_info {
    const char *name;
    size_t offset; /* offsetof(synth_knobs, ...) */
    double min, max;
    const char *what;
    /* a knob added after the published calibration: params_json names it only when it differs
     * from `neutral` (the value that leaves the model as it was), so traces made without it
     * keep their bytes */
    bool extension;
    double neutral;
} synth_knob_info;

extern const synth_knob_info synth_knob_table[];
extern const size_t synth_knob_count;

/* The value of a depth profile at MoE layer l of n_layers: `first` at layer 0, `mid` at
 * (n_layers - 1) / 2, `last` at n_layers - 1, linear in between. */
double synth_depth_profile(double first, double mid, double last, uint32_t l, uint32_t n_layers);

/* Fills `o` with defaults for model `m`: requests 64, prompt 64:512, gen 128, text, seed 1,
 * D = 3, K' = min(16, E), and the knobs of m's family (or of the nearest family with published
 * figures: traces/SYNTH.md). */
void synth_options_default(synth_options *o, const model_geometry *m);
/* The family whose defaults apply to model family `family` (HF model_type), and whether it has
 * published figures of its own. */
const char *synth_family_defaults_for(const char *family, bool *has_own_figures);

/* Sets knob `name` to `value` ("name=value" pieces are the caller's); bad names or values out
 * of range fail with a message naming the knob and the range. */
moesim_status synth_knob_set(synth_knobs *k, const char *name, double value, moesim_error *err);
/* Checks the whole option set against model `m`; the message names the option. */
moesim_status synth_options_check(const synth_options *o, const model_geometry *m,
                                  moesim_error *err);
/* "text" / "math" / "code" / "mix"; parse returns false on an unknown name. */
const char *synth_workload_name(synth_workload w);
bool synth_workload_parse(const char *s, synth_workload *out);

/* The options as JSON text (every knob, resolved): what the trace stores as params_json.
 * Caller frees. */
char *synth_params_json(const synth_options *o, const model_geometry *m);

/* Generates the trace. Fails (MOESIM_EINPUT) on options that synth_options_check refuses and
 * (MOESIM_ENOMEM) when the trace cannot be allocated. Caller owns *out (trace_destroy). */
moesim_status synth_generate(const model_geometry *m, const synth_options *o, trace **out,
                             moesim_error *err);

/* The same trace handed over in consecutive blocks, never held whole: memory is one window of
 * about 512 KiB (at least two tokens) plus one request's importance. `begin` is called once
 * first, with the whole trace's description and counts; then `block` for every block in token
 * order. A block holds consecutive tokens of one request (a request longer than the window
 * comes in several blocks), with request ids and positions as in the whole trace; it is valid
 * until the callback returns. A failing callback stops the run and its status is returned. */
typedef struct synth_sink {
    moesim_status (*begin)(void *ctx, const trace_meta *meta, uint64_t n_tokens,
                           uint32_t n_requests, const char *params_json, moesim_error *err);
    moesim_status (*block)(void *ctx, const trace *block, moesim_error *err);
    void *ctx;
} synth_sink;
moesim_status synth_stream(const model_geometry *m, const synth_options *o, const synth_sink *sink,
                           moesim_error *err);

/* Streams the trace into the file `path` (trace_writer): byte for byte the file
 * trace_write(synth_generate(...)) makes, in memory bounded by the window, one request's
 * importance and the writer's staging rather than by the trace. Crash-safe like trace_write. */
moesim_status synth_write(const model_geometry *m, const synth_options *o, const char *path,
                          moesim_error *err);

/* ---- calibration targets (CALIBRATION.md) for `moesim trace synth --report` ---- */

typedef struct synth_target {
    const char *statistic; /* e.g. "active_share B=8", "reuse_top1 layer 15" */
    double low, high;      /* the published figure or range (fractions) */
    double tolerance;      /* accepted distance outside [low, high] (traces/SYNTH.md) */
    double achieved;       /* filled by synth_targets_evaluate; NaN when absent */
    bool pass;             /* achieved within [low - tolerance, high + tolerance] */
    const char *source;
} synth_target;

struct trace_stats;
/* The published figures that apply to model `m` (by name) for a trace made with workload
 * `w`, evaluated on `s` (computed from that trace). Writes at most `cap` targets, returns how
 * many apply (0: no published figure for this model). */
size_t synth_targets_evaluate(const model_geometry *m, synth_workload w,
                              const struct trace_stats *s, synth_target *out, size_t cap);

#endif
