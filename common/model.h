/* Model geometry of a real MoE model, loaded from configs/models/<name>.ini. Every number in
 * those files is traceable to the model's Hugging Face config.json (each file cites it). Only
 * geometry lives here (sizes, routing rule, attention shape); weights are the engine's business.
 *
 * Layer numbering: model layers 0..n_layers-1; MoE layers are the subset flagged in
 * is_moe_layer. Traces index MoE layers 0..n_moe_layers-1 in model order. */
#ifndef MOESIM_COMMON_MODEL_H
#define MOESIM_COMMON_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/precision.h"
#include "common/status.h"

#define MODEL_MAX_LAYERS 256
#define MODEL_MAX_EXPERTS 1024
#define MODEL_MAX_SHARED_EXPERTS 64 /* always-on experts per MoE layer */

typedef enum attention_kind {
    ATTENTION_GQA,           /* multi-head / grouped-query attention */
    ATTENTION_MLA,           /* DeepSeek multi-head latent attention */
    ATTENTION_HYBRID_LINEAR, /* Qwen3-Next: gated DeltaNet layers + periodic full attention */
} attention_kind;

/* How the gate weights of the chosen experts are formed from router logits. */
typedef enum gate_normalization {
    GATE_SOFTMAX_TOPK, /* softmax over the top-k logits (= softmax over all, renormalized): sum 1 */
    GATE_SOFTMAX_ALL,  /* softmax over all experts, top-k kept as is: sum <= 1 */
} gate_normalization;

typedef enum expert_part { PART_GATE = 0, PART_UP, PART_DOWN, PART_COUNT } expert_part;

typedef struct model_geometry {
    char name[64];   /* config stem, e.g. "mixtral-8x7b" */
    char hf_id[128]; /* e.g. "mistralai/Mixtral-8x7B-v0.1" */
    char family[32]; /* HF model_type: mixtral, qwen3_moe, qwen3_next, olmoe, qwen2_moe, ... */

    uint32_t n_layers;                      /* decoder layers */
    uint32_t n_moe_layers;                  /* layers whose FFN is an MoE block */
    bool is_moe_layer[MODEL_MAX_LAYERS];    /* [n_layers] */
    uint32_t hidden;                        /* hidden_size */
    uint32_t dense_inter;                   /* FFN width of non-MoE layers (0: none) */
    uint32_t vocab;
    bool tie_embeddings;

    uint32_t n_experts;         /* routed experts per MoE layer */
    uint32_t top_k;             /* experts chosen per token */
    uint32_t expert_inter;      /* routed expert FFN width */
    gate_normalization gate_norm;
    uint32_t n_shared_experts;  /* always-on experts per MoE layer */
    uint32_t shared_inter;      /* FFN width of each shared expert */
    bool shared_expert_gate;    /* Qwen1.5/Qwen3-Next: sigmoid gate on the shared expert */

    attention_kind attention;
    uint32_t n_heads, n_kv_heads, head_dim;
    bool qk_norm;
    double rope_theta;
    /* MLA (attention == ATTENTION_MLA) */
    uint32_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    /* hybrid linear attention (attention == ATTENTION_HYBRID_LINEAR) */
    uint32_t full_attention_interval; /* every n-th layer is full attention */
    uint32_t linear_key_heads, linear_value_heads, linear_key_head_dim, linear_value_head_dim;
    uint32_t linear_conv_kernel;
} model_geometry;

typedef struct config config;

/* Loads and validates a model file (every key checked; see configs/models/README.md). */
moesim_status model_load(const char *path, model_geometry *out, moesim_error *err);
/* Same, then applies `sets` ("section.key=value", the --set option) before validating. */
moesim_status model_load_with_sets(const char *path, const char *const *sets, size_t n_sets,
                                   model_geometry *out, moesim_error *err);
/* Reads and validates the model sections ([model], [layers], [experts], [attention]) of an
 * already loaded config (a run may combine several files and --set entries in one); marks them
 * used and leaves config_check_unused to the caller. */
moesim_status model_read_config(config *c, model_geometry *out, moesim_error *err);
/* Resolves a name through moesim_config_path("models", ...) and loads it. */
moesim_status model_load_by_name(const char *name, model_geometry *out, moesim_error *err);
/* A model config held as INI text (what a trace stores, traces/FORMAT.md), named `origin` in
 * messages. */
moesim_status model_load_text(const char *origin, const char *text, model_geometry *out,
                              moesim_error *err);

/* Writes `m` as a model file that model_load reads back to the same geometry (crash-safe: the
 * file appears whole or not at all). `origin` goes into the header comment (what it came from,
 * e.g. a checkpoint folder), since such a file cites no config.json of its own. */
moesim_status model_write_ini(const model_geometry *m, const char *path, const char *origin,
                              moesim_error *err);

uint64_t model_expert_params(const model_geometry *m);                     /* 3 * hidden * inter */
uint64_t model_expert_part_bytes(const model_geometry *m, const quant_table *q, expert_part part,
                                 moesim_precision p);
uint64_t model_expert_bytes(const model_geometry *m, const quant_table *q, moesim_precision p);
/* Everything resident besides routed experts (embeddings, attention, norms, routers, shared
 * experts, dense FFNs, LM head), stored in bf16. */
uint64_t model_non_expert_bytes(const model_geometry *m);
/* KV cache (or MLA latent cache) bytes per token of context, over all layers, in bf16. */
uint64_t model_kv_bytes_per_token(const model_geometry *m);
/* Fixed per-request state of linear-attention layers (0 for other kinds), bf16. */
uint64_t model_recurrent_state_bytes(const model_geometry *m);
/* Parameters counted by model_non_expert_bytes (which is 2 bytes each). */
uint64_t model_non_expert_params(const model_geometry *m);
/* Total parameters (for sanity checks against published totals). */
uint64_t model_total_params(const model_geometry *m);

#endif
