/* Fitting the synthesizer's knobs to a trace (`moesim trace synth --fit REAL.h5`): estimates
 * every knob of the generative model (traces/synth.h) from a real router trace, so that traces
 * of any length, batch mix and seed generated with them have the real one's statistics
 * (traces/STATS.md). traces/SYNTH.md ("Fitting to a trace") states the method, which statistic
 * each knob is fitted to, and the limits, with figures.
 *
 * The method: the expert popularity of each topic is a table counted from the real trace's
 * requests (smoothed and sharpened by two knobs), and every other knob is fitted by simulated
 * moments: paired with one statistic of the real trace that it drives monotonically
 * (sharpness -> gini, top-1 reuse -> reuse_top1, history copies -> LRU hit rates, ...);
 * the fit generates traces of the real one's shape (its request and length ranges, 10 times as
 * many requests, its execution order) with a fixed seed and bisects each knob in turn until the
 * simulated statistic meets the real one, sweeping over all knobs a few times because they
 * interact. Look-ahead knobs are read off the real trace directly (the model makes them exact).
 * Everything is deterministic: the same trace gives the same knobs, bit for bit.
 *
 * Also here: the execution order of batched runs (a trace's requests interleaved in decode
 * batches, as the engine and serving logs record them; traces/synth_order.c), knob files
 * (`--save-knobs`, `--knobs`; traces/synth_knobs_file.c) and the real-vs-synthetic comparison
 * (traces/synth_compare.c). */
#ifndef MOESIM_TRACES_SYNTH_FIT_H
#define MOESIM_TRACES_SYNTH_FIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/model.h"
#include "common/status.h"
#include "traces/synth.h"
#include "traces/trace.h"

#define SYNTH_FIT_MAX_ENTRIES 48
#define SYNTH_FIT_SCALE       10 /* simulated requests per real request */

/* One fitted knob and the statistic it was fitted to. */
typedef struct synth_fit_entry {
    char knob[40];
    char statistic[64];
    double value;    /* the knob's fitted value (or the default kept) */
    double real;     /* the statistic on the real trace; NaN: absent there */
    double achieved; /* the statistic on the fit's final simulation; NaN: not simulated */
    bool fitted;     /* false: the real trace does not carry the statistic, the default stays */
} synth_fit_entry;

typedef struct synth_fit_result {
    /* the fitted knobs, with the real trace's shape: its request count, prompt and decode
     * length ranges, look-ahead depth and width (generate more by changing n_requests) */
    synth_options options;
    uint32_t interleave; /* decode batch of the real trace's execution order (1: sequential) */
    size_t n_entries;
    synth_fit_entry entries[SYNTH_FIT_MAX_ENTRIES];
    uint32_t simulations; /* traces the fit generated */
    float *popularity;    /* [topics][L][E] the fitted table options.popularity points to; owned */
    double *layer_knobs;  /* [SYNTH_LAYER_KNOBS][L] what options.layer_knobs points to; owned */
} synth_fit_result;

void synth_fit_result_free(synth_fit_result *f); /* the table; accepts NULL */

/* Fits the knobs of model `m` (whose geometry must be the trace's) to `real`. Fails
 * (MOESIM_EINPUT, naming `what`) on a geometry mismatch or a trace without decode or with
 * nothing recorded. The result is a function of the trace and `m` only. */
moesim_status synth_fit(const trace *real, const model_geometry *m, const char *what,
                        synth_fit_result *out, moesim_error *err);
/* The same fit, bit for bit, of a trace read as a stream (trace_stream_open, every row): what it
 * reads from the trace is computed in passes over its blocks, keeping per request in flight its
 * previous token, so holding the real trace costs O(requests), not O(tokens) (the simulations
 * still grow with a long trace: traces/SYNTH.md, "Memory"). Fails as synth_fit, and (MOESIM_EIO)
 * where trace_stats_compute_stream does. */
moesim_status synth_fit_stream(trace_stream *real, const model_geometry *m, const char *what,
                               synth_fit_result *out, moesim_error *err);

/* The decode batch of a trace's execution order: the most requests whose decode is under way
 * (begun and not finished) at any point of the trace. 1 for requests stored one after another. */
uint32_t synth_fit_detect_interleave(const trace *t);

/* `t` (requests stored one after another, as synth_generate makes them) in the execution order
 * of static batches of `batch` consecutive requests: each batch's prefills request by request,
 * then its decode tokens round robin (iteration i: the i-th decode token of every request of
 * the batch that has one), as `moesim record --batch` runs them. Routing is unchanged. New
 * trace; caller destroys. */
trace *synth_interleave(const trace *t, uint32_t batch);

/* Generates with `o` and orders the tokens in decode batches of `interleave` (1: as
 * synth_generate). */
moesim_status synth_generate_interleaved(const model_geometry *m, const synth_options *o,
                                         uint32_t interleave, trace **out, moesim_error *err);

/* One statistic of a real trace next to a synthetic one's (`--report`, the tests, SYNTH.md). */
typedef struct synth_fit_row {
    char statistic[48];
    char knob[40];    /* the knob fitted to it (or that drives it); "" when none */
    double real;      /* NaN: absent there */
    double synthetic; /* NaN: absent there */
    double tolerance; /* what counts as a match (absolute); 0: informative */
} synth_fit_row;

/* The rows comparing `real` with `synthetic` (same geometry): skew, reuse, the LRU and OPT hit
 * rates at every capacity k..E (pooled over layers, and the worst layer), the active share at
 * every batch size the real trace has, look-ahead accuracy, gates, importance. Writes at most
 * `cap` rows, returns how many there are. */
size_t synth_fit_compare(const trace *real, const trace *synthetic, synth_fit_row *rows,
                         size_t cap);

/* Writes the fitted knobs as an INI file ([synth]: model, interleave and every knob, each with
 * the statistic it was fitted to in its comment; [layers]: the per-layer knobs; [popularity]:
 * the table), crash-safely. */
moesim_status synth_knobs_save(const char *path, const synth_fit_result *f, const model_geometry *m,
                               const char *real_path, moesim_error *err);
/* Loads such a file (or any [synth] section of knob = value lines) over o->knobs, for model
 * `m`; `interleave` gets the file's value when it has one. A [popularity] table (sized by the
 * file's topics and m's layers and experts) replaces *table (freed; caller frees the new one)
 * and o->popularity points to it; a [layers] table (every per-layer knob at every MoE layer)
 * likewise replaces *layer_table and o->layer_knobs. Errors name the file, line and key. */
moesim_status synth_knobs_load(const char *path, const model_geometry *m, synth_options *o,
                               float **table, double **layer_table, uint32_t *interleave,
                               moesim_error *err);

#endif
