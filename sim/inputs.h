/* What a sim or replay run reads, loaded once for every front end (the CLI's sim and replay,
 * libmoesim): the trace (whole, or as a stream), the hardware profile, the model geometry (by name
 * or path, else the config the trace stores: trace_model_load) and the default quant table. */
#ifndef MOESIM_SIM_INPUTS_H
#define MOESIM_SIM_INPUTS_H

#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "common/status.h"
#include "traces/trace.h"

/* Loads what a sim or replay run reads, in the order their errors are reported: the trace at
 * `trace_path`, hardware profile `hw_name`, the model `model_name` (NULL: the trace's model) and
 * the default quant table. Stops at the first failure; *t (NULL if the trace did not load) is
 * the caller's to trace_destroy, also on failure. */
moesim_status sim_inputs_load(const char *trace_path, const char *hw_name, const char *model_name,
                              trace **t, hw_profile *hw, model_geometry *model, quant_table *quant,
                              moesim_error *err);
/* The same with the trace opened as a stream (trace_stream_open_with `opt`: `moesim sim`'s memory
 * does not grow with the trace); *ts is the caller's to trace_stream_close, also on failure. */
moesim_status sim_inputs_open_stream(const char *trace_path, const trace_stream_options *opt,
                                     const char *hw_name, const char *model_name, trace_stream **ts,
                                     hw_profile *hw, model_geometry *model, quant_table *quant,
                                     moesim_error *err);

#endif
