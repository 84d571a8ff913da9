/* Layers with identical routing: a log that copies one layer's routing into another (a
 * copy-paste in a per-layer dump) imports without error, and every statistic of the copy is
 * the original's. `trace import` and `trace stats` warn about such pairs. */
#ifndef MOESIM_TRACES_LAYER_TWINS_H
#define MOESIM_TRACES_LAYER_TWINS_H

#include <stdint.h>

#include <jansson.h>

#include "traces/trace.h"

/* The MoE layers of `t` whose expert ids and gate weights equal, token for token and bit for
 * bit, those of an earlier layer (each counted once, paired with the first layer it copies).
 * The first `cap` pairs (earlier, later) go to pairs[], their count to *listed; returns how
 * many layers are copies. A trace with one token or one layer has none. */
uint32_t trace_layer_twins_find(const trace *t, uint32_t (*pairs)[2], uint32_t cap,
                                uint32_t *listed);

/* Each layer's hash is FNV-1a over its rows in token order, ids then gates, each row continuing
 * from the last (start: TRACE_LAYER_TWINS_HASH0): a pass over the trace made for something else
 * can compute them (trace_stats_compute_stream does). */
#define TRACE_LAYER_TWINS_HASH0 0xcbf29ce484222325ull
uint64_t trace_layer_twins_hash_row(uint64_t h, const uint16_t *ids, const float *gates,
                                    uint32_t k);

/* The same for a trace read as a stream, from its layers' hashes `hash` [L]: one pass over its
 * blocks where two layers' hashes agree, none otherwise. */
uint32_t trace_layer_twins_find_stream(trace_stream *ts, const uint64_t *hash,
                                       uint32_t (*pairs)[2], uint32_t cap, uint32_t *listed);

/* The maximum of pairs `trace stats` lists (all are counted). */
#define TRACE_LAYER_TWINS_LISTED 32

/* Adds "identical_layers" (the count) and "identical_layer_pairs" (the first
 * TRACE_LAYER_TWINS_LISTED pairs) of `t` to the JSON object `j`, as `trace stats --json` and
 * libmoesim report them. */
void trace_layer_twins_add_json(const trace *t, json_t *j);
void trace_layer_twins_add_json_stream(trace_stream *ts, const uint64_t *hash, json_t *j);

#endif
