/* The MoE model engine: a Hugging Face checkpoint (config.json + safetensors) loaded for a
 * forward pass on a backend (engine_options.backend: "cpu", the kernels/cpu references over a
 * thread pool, or "cuda", the whole forward pass on the GPU in kernels/cuda/engine_cuda.cu with
 * experts offloadable to pinned host memory), with routed experts stored at any of bf16 / int8 /
 * int4 / int2 and a per-(MoE layer, expert) precision map, "skip" included, applied at every
 * step.
 *
 * Supported model_type values: qwen3_moe, qwen2_moe, olmoe, mixtral (engine/arch_*.c, one file
 * each, sharing the forward pass of forward.c). Every layer: RMSNorm -> attention (GQA, RoPE,
 * optional QK-norm, q/k/v and o biases, a sliding window per layer, KV cache) -> residual ->
 * RMSNorm (the router input) -> MoE block (router softmax, top-k, optional renormalization, SwiGLU
 * experts, optional sigmoid-gated shared expert) or dense SwiGLU MLP -> residual; then the final
 * norm and the LM head.
 *
 * config.json: every key the reference (transformers' modeling code) reads is implemented or, at
 * a value the engine does not implement, refused with one line (engine/README.md).
 *
 * Numerics: activations fp32; weights read in their stored format (bf16 straight from the
 * memory-mapped file; fp16 and fp32 tensors converted to fp32 at load). Results do not depend on
 * the number of threads (work is split by output row; each output is one fixed-order sum).
 *
 * "bf16" in the precision map means the checkpoint's own weights, whatever their dtype. */
#ifndef MOESIM_ENGINE_ENGINE_H
#define MOESIM_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/model.h"
#include "common/precision.h"
#include "common/status.h"

#define ENGINE_PREC_SKIP 0xffu /* precision map entry: the expert is not run (gate mass dropped) */
#define ENGINE_MAX_TOP_K 64

typedef struct engine engine;
typedef struct engine_seq engine_seq;

/* What the loaded checkpoint is (read from config.json, checked against the tensors). */
typedef struct engine_config {
    char model_type[32];
    uint64_t config_hash; /* FNV-1a of config.json's bytes */
    uint32_t n_layers, hidden, vocab;
    uint32_t n_heads, n_kv_heads, head_dim;
    uint32_t n_experts, top_k, expert_inter;
    uint32_t dense_inter;  /* FFN width of non-MoE layers */
    uint32_t shared_inter; /* shared expert width, 0: none */
    bool shared_expert_gate;
    bool norm_topk_prob; /* renormalize the chosen gate weights to sum 1 */
    bool qk_norm_per_head; /* Qwen3: RMSNorm over head_dim of each head */
    bool qk_norm_full;     /* OLMoE: RMSNorm over the whole q / k projection */
    bool tie_embeddings; /* the LM head is the embedding: tie_word_embeddings and no lm_head.weight
                            in the checkpoint (transformers does not tie when both exist) */
    float rms_eps;
    double rope_theta;
    bool clip_qkv_on; /* q, k, v clamped to [-clip_qkv, clip_qkv] (0 included) */
    float clip_qkv;
    bool qkv_bias;  /* q_proj, k_proj, v_proj carry a bias */
    bool o_bias;    /* o_proj carries a bias */
    /* per layer: attention sees the last attn_window positions (its own included); 0: all */
    uint32_t attn_window[MODEL_MAX_LAYERS];
    uint32_t n_moe_layers;
    bool is_moe[MODEL_MAX_LAYERS];
    uint32_t moe_index[MODEL_MAX_LAYERS]; /* model layer -> MoE layer index (valid if is_moe) */
    uint32_t moe_layer[MODEL_MAX_LAYERS]; /* MoE layer index -> model layer */
} engine_config;

typedef struct engine_options {
    uint32_t n_threads;      /* 0: one per online CPU */
    uint32_t precision_mask; /* bit (1u << p) for each moesim_precision to hold experts at;
                                bf16 is always held; 0 means bf16 only */
    const char *backend;       /* "cpu" (NULL too) or "cuda" (builds with MOESIM_CUDA only) */
    uint32_t gpu_pool_experts; /* cuda: device pool blocks for routed experts, one expert at one
                                  precision each, loaded on demand from pinned host memory (LRU);
                                  0: every held expert resident */
} engine_options;

/* Loads `dir` (config.json and model.safetensors, or model.safetensors.index.json + shards).
 * Caller owns; engine_destroy. */
moesim_status engine_load(const char *dir, const engine_options *opt, engine **out,
                          moesim_error *err);
void engine_destroy(engine *e); /* accepts NULL */
const engine_config *engine_config_of(const engine *e);
/* Comma-separated list of the backends this build has ("cpu" or "cpu, cuda"). */
const char *engine_backends(void);
/* Name of the backend `e` runs on. */
const char *engine_backend_name(const engine *e);
/* Expert pool counters of the cuda backend since load (all zero on the cpu backend): pool
 * blocks and their size, lookups that found the expert on the device, and those that copied it. */
typedef struct engine_pool_stats {
    uint32_t blocks;
    uint64_t block_bytes, hits, misses, h2d_bytes;
} engine_pool_stats;
void engine_pool_stats_get(const engine *e, engine_pool_stats *out);
/* Comma-separated list of supported model_type values (for messages). */
const char *engine_supported_types(void);
/* Fills a model_geometry (for trace metadata) from the checkpoint; name is the trace's model. */
void engine_geometry(const engine *e, const char *name, model_geometry *g);
bool engine_has_precision(const engine *e, moesim_precision p);

/* Per-(MoE layer, expert) precision: a moesim_precision the engine holds, or ENGINE_PREC_SKIP. */
typedef struct engine_precmap {
    uint32_t n_layers, n_experts;
    uint8_t *prec; /* [n_layers][n_experts] */
} engine_precmap;
void engine_precmap_init(engine_precmap *m, const engine *e, uint8_t prec); /* uniform */
void engine_precmap_free(engine_precmap *m);
/* Reads a text file: one line per MoE layer, n_experts names (bf16 int8 int4 int2 skip);
 * '#' starts a comment. Every name is checked against what `e` holds. */
moesim_status engine_precmap_load(engine_precmap *m, const engine *e, const char *path,
                                  moesim_error *err);

/* What one token did at every MoE layer (filled by engine_seq_forward when asked). */
typedef struct engine_token_info {
    uint32_t lookahead_depth, lookahead_k; /* requested D and K' (set by the caller) */
    uint16_t *expert_ids;    /* [n_moe_layers][top_k] chosen experts, best first */
    float *gate_weights;     /* [n_moe_layers][top_k] gate weights as applied */
    uint16_t *lookahead_ids; /* [n_moe_layers][D][K'] or NULL; TRACE_NO_EXPERT past the end */
    float *lookahead_scores; /* [n_moe_layers][D][K'] softmax probabilities, or NULL */
} engine_token_info;

/* A request's state: KV cache of up to max_ctx positions, and accumulated attention importance.
 * Caller owns; engine_seq_destroy. */
engine_seq *engine_seq_create(const engine *e, uint32_t max_ctx);
void engine_seq_destroy(engine_seq *s);
uint32_t engine_seq_len(const engine_seq *s);
/* Runs one token at the next position. logits: [vocab] or NULL; info may be NULL. pmap NULL: all
 * experts at bf16. Errors: token id out of range, context full. */
moesim_status engine_seq_forward(engine *e, engine_seq *s, int32_t token,
                                 const engine_precmap *pmap, float *logits,
                                 engine_token_info *info, moesim_error *err);
/* DyMoE Eq. 1 importance of position `pos` at MoE layer l: the attention probability it received,
 * averaged over heads, summed over every query of the sequence so far (itself included). */
float engine_seq_importance(const engine_seq *s, uint32_t moe_layer, uint32_t pos);



/* ---- batched generation (engine/generate.c) ---- */

typedef struct engine_request {
    const int32_t *prompt; /* [n_prompt] token ids, borrowed */
    uint32_t n_prompt;     /* >= 1 */
} engine_request;

typedef struct engine_gen_options {
    uint32_t gen_len;     /* decode steps per request: each feeds the last sampled token */
    uint32_t batch;       /* requests in flight together (>= 1) */
    uint32_t lookahead_depth, lookahead_k; /* D and K' of the recorded predictions (0: none) */
    float temperature;    /* 0: greedy (ties: lowest id); > 0: sampling, seeded */
    uint64_t seed;        /* request i samples from rng stream (seed, i) */
    const engine_precmap *pmap; /* NULL: every expert at bf16 */
} engine_gen_options;

/* Every token the engine ran, in execution order: requests go in groups of `batch`; a group's
 * prompts are prefilled one request after another, then each decode step runs one token of every
 * request of the group, in request order. */
typedef struct engine_gen_log {
    uint64_t n_tokens;
    uint32_t n_moe_layers, top_k, lookahead_depth, lookahead_k;
    uint32_t *request_id;     /* [n_tokens] */
    uint32_t *position;       /* [n_tokens] */
    uint8_t *phase;           /* [n_tokens] 0 prefill, 1 decode (trace_phase values) */
    int32_t *token_id;        /* [n_tokens] the token fed at that step */
    uint16_t *expert_ids;     /* [n_tokens][n_moe_layers][top_k] */
    float *gate_weights;      /* [n_tokens][n_moe_layers][top_k] */
    float *importance;        /* [n_tokens][n_moe_layers] engine_seq_importance at request end */
    uint16_t *lookahead_ids;  /* [n_tokens][n_moe_layers][D][K'] or NULL */
    float *lookahead_scores;  /* [n_tokens][n_moe_layers][D][K'] or NULL */
    uint32_t n_requests;
    int32_t *generated;       /* [n_requests][gen_len + 1] sampled tokens (the last is never fed) */
    uint32_t gen_stride;      /* gen_len + 1 */
} engine_gen_log;

moesim_status engine_generate(engine *e, const engine_request *reqs, uint32_t n_reqs,
                              const engine_gen_options *o, engine_gen_log *log,
                              moesim_error *err);
void engine_gen_log_free(engine_gen_log *log);

/* The log as a router trace for `moesim record` (engine/record.c): geometry `g` (from
 * engine_geometry), source "engine", importance and token ids always present, look-ahead when
 * the log has it, the checkpoint's config hash, and `params_json` (NULL for none) recording how
 * it was made. Checked with trace_finish. Caller owns *out (trace_destroy). */
typedef struct trace trace;
moesim_status engine_log_to_trace(const engine *e, const model_geometry *g,
                                  const engine_gen_log *log, const char *params_json, trace **out,
                                  moesim_error *err);

/* Index of the sampled token: argmax when temperature is 0, else a draw from softmax(logits / T)
 * using `u` in [0, 1). logits: [n] (overwritten when sampling). */
uint32_t engine_sample(float *logits, uint32_t n, float temperature, double u);

/* ---- token-id input files (engine/prompts.c) ---- */

/* Prompts as token ids: one prompt per line (ids separated by spaces or commas), or JSONL with
 * an integer array "prompt_ids" per line; blank lines and lines starting with '#' are skipped.
 * Every id is checked against `vocab`; errors name file:line. */
typedef struct engine_prompts {
    uint32_t n;
    engine_request *reqs; /* [n], prompts point into `ids` */
    int32_t *ids;
} engine_prompts;
moesim_status engine_prompts_load(const char *path, uint32_t vocab, engine_prompts *out,
                                  moesim_error *err);
void engine_prompts_free(engine_prompts *p);

#endif
