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

/* The same for a trace read as a stream (two passes over its blocks where two layers' hashes
 * agree, one otherwise). */
uint32_t trace_layer_twins_find_stream(trace_stream *ts, uint32_t (*pairs)[2], uint32_t cap,
                                       uint32_t *listed);

/* The maximum of pairs `trace stats` lists (all are counted). */
#define TRACE_LAYER_TWINS_LISTED 32

/* Adds "identical_layers" (the count) and "identical_layer_pairs" (the first
 * TRACE_LAYER_TWINS_LISTED pairs) of `t` to the JSON object `j`, as `trace stats --json` and
 * libmoesim report them. */
void trace_layer_twins_add_json(const trace *t, json_t *j);
void trace_layer_twins_add_json_stream(trace_stream *ts, json_t *j);

#endif
