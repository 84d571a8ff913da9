/* Replay's weights from a checkpoint (`moesim replay --model DIR`): a Hugging Face checkpoint
 * (config.json + safetensors) loaded by the engine (engine_load: config.json checked, every
 * tensor found and shape-checked, bf16 kept in the read-only mapping, fp16 / fp32 converted to
 * fp32) and converted to what the replay's kernels read:
 *   - a routed expert at a stored precision: one blob [gate | up | down], each part row-major
 *     [rows][cols] in the kernels' format: bf16 values, or kernels/quant.h blocks made by
 *     quant_row_quantize_ref from the same fp32 rows the engine quantizes, so the bytes are the
 *     engine's own (engine_load with that precision in its mask);
 *   - the non-expert matrices as bf16 buffers in the layout of replay/run.cu (replay_nonexpert).
 * Also the checks that a trace was made for this checkpoint. Pure C, tested on the CPU; run.cu
 * copies the buffers into pinned host memory and onto the device.
 *
 * Layers: model layers 0..n_layers-1 for the non-expert matrices, MoE layers (the trace's
 * numbering) for the experts. Sizes in bytes or bf16 elements, as named. */
#ifndef MOESIM_REPLAY_WEIGHTS_H
#define MOESIM_REPLAY_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/model.h"
#include "common/precision.h"
#include "common/status.h"
#include "traces/trace.h"

typedef struct replay_weights replay_weights;

/* Loads the checkpoint in `dir` (engine_load on the CPU backend, experts at bf16 only: the
 * integer formats are made expert by expert when the host store is filled). Errors name the
 * file and the field or tensor. Caller owns; replay_weights_close. */
moesim_status replay_weights_open(const char *dir, replay_weights **out, moesim_error *err);
void replay_weights_close(replay_weights *w); /* accepts NULL */

/* The checkpoint's geometry (engine_geometry) under the name `name` (the trace's model). */
void replay_weights_geometry(const replay_weights *w, const char *name, model_geometry *out);

/* Checks that a trace (its metadata `meta`, read from `trace_path`) routes this checkpoint:
 * MoE layers, which model layers they are, experts, top-k, shared experts and gate
 * normalization equal; model_config_hash (engine-recorded traces) equal to the FNV-1a hash of
 * the checkpoint's config.json (engine_config.config_hash, what `moesim record` stores); and when
 * the trace's model names a configs/models file, that file's layers, widths, experts and
 * attention shape equal the checkpoint's. The first difference is one line naming the file and
 * the field. */
moesim_status replay_weights_check_trace(const replay_weights *w, const trace_meta *meta,
                                         const char *trace_path, moesim_error *err);

/* Bytes of one expert part at precision p in the kernels' format (bf16: rows * cols * 2; integer
 * formats: quant_matrix_size_bytes, whose caller checks cols with quant_check_cols). Gate and up
 * are [expert_inter][hidden], down is [hidden][expert_inter]. */
uint64_t replay_part_bytes(const model_geometry *m, moesim_precision p, expert_part part);

/* Writes expert `expert` of MoE layer `moe_layer` at precision p (bf16, int8, int4, int2) as one
 * blob [gate | up | down] of the parts' replay_part_bytes into `blob`. */
void replay_weights_expert(const replay_weights *w, uint32_t moe_layer, uint32_t expert,
                           moesim_precision p, uint8_t *blob);

/* The same for n consecutive experts in (MoE layer, expert) order from index `le_first`
 * (le = moe_layer * n_experts + expert), blob i at dst + i * stride_bytes (stride at least the
 * blob; the bytes between blobs are left as they are). Spread over the CPUs; same bytes as one
 * replay_weights_expert call per expert. */
void replay_weights_experts(const replay_weights *w, moesim_precision p, size_t le_first, size_t n,
                            uint8_t *dst, uint64_t stride_bytes);

/* The non-expert matrices replay's compute stream reads, each one bf16 buffer per layer. */
typedef enum replay_nonexpert {
    REPLAY_NX_ATTENTION, /* every layer: [q_dim + 2 kv_dim][hidden] (q, k, v rows), then
                            [hidden][q_dim] (o); q_dim = n_heads * head_dim, kv_dim likewise */
    REPLAY_NX_ROUTER,    /* MoE layers: [n_experts][hidden] */
    REPLAY_NX_SHARED,    /* MoE layers with shared experts: gate [S][hidden], up [S][hidden], down
                            [hidden][S], S = shared_inter * n_shared_experts */
    REPLAY_NX_DENSE,     /* dense layers: gate [D][hidden], up [D][hidden], down [hidden][D],
                            D = dense_inter */
    REPLAY_NX_LM_HEAD,   /* once: [vocab][hidden] (the embedding when tied) */
    REPLAY_NX_COUNT
} replay_nonexpert;

/* bf16 elements of one buffer of kind k for geometry m (0: the model has none of that kind). */
uint64_t replay_nonexpert_elems(const model_geometry *m, replay_nonexpert k);

/* Writes the buffer of kind k of model layer `layer` (ignored for REPLAY_NX_LM_HEAD) into dst:
 * [replay_nonexpert_elems] bf16. The layer must have that kind (a router only in MoE layers). */
void replay_weights_nonexpert(const replay_weights *w, replay_nonexpert k, uint32_t layer,
                              uint16_t *dst);

#endif
