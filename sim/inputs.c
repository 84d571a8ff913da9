/* Loading what a run reads (sim/inputs.h), for the CLI and libmoesim alike. */
#include "sim/inputs.h"

moesim_status sim_inputs_load(const char *trace_path, const char *hw_name, const char *model_name,
                              trace **t, hw_profile *hw, model_geometry *model, quant_table *quant,
                              moesim_error *err) {
    moesim_status st = trace_read(trace_path, t, err);
    if (!st) st = hw_load_by_name(hw_name, hw, err);
    if (!st) st = trace_model_load(*t, trace_path, model_name, model, err);
    if (!st) st = quant_table_load_default(quant, err);
    return st;
}

moesim_status sim_inputs_open_stream(const char *trace_path, const trace_stream_options *opt,
                                     const char *hw_name, const char *model_name, trace_stream **ts,
                                     hw_profile *hw, model_geometry *model, quant_table *quant,
                                     moesim_error *err) {
    moesim_status st = trace_stream_open_with(trace_path, opt, ts, err);
    if (!st) st = hw_load_by_name(hw_name, hw, err);
    if (!st) st = trace_model_load(trace_stream_tokens(*ts), trace_path, model_name, model, err);
    if (!st) st = quant_table_load_default(quant, err);
    return st;
}
