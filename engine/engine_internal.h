/* Engine internals shared by engine.c, the architecture files (arch_*.c), the checkpoint reader
 * and the backends: weight matrices in their stored formats, the per-architecture table, the
 * backend table (ggml-backend style: a struct of function pointers, NULL = not supported) and the
 * thread pool. Not part of the public interface (engine.h). */
#ifndef MOESIM_ENGINE_INTERNAL_H
#define MOESIM_ENGINE_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/safetensors.h"

/* A weight matrix [rows][cols] (a vector when rows == 1) in one stored format. */
typedef enum mat_kind { MAT_F32 = 0, MAT_BF16, MAT_Q8, MAT_Q4, MAT_Q2 } mat_kind;
typedef struct engine_mat {
    mat_kind kind;
    const void *data; /* borrowed from the mapping (bf16) or owned by the engine */
    uint32_t rows, cols;
} engine_mat;

/* Tensors an architecture names; the forward pass asks for them by kind. */
typedef enum tensor_kind {
    T_EMBED, T_FINAL_NORM, T_LM_HEAD,
    T_ATTN_NORM, T_FFN_NORM, T_Q, T_K, T_V, T_O, T_Q_BIAS, T_K_BIAS, T_V_BIAS, T_O_BIAS, T_Q_NORM,
    T_K_NORM,
    T_ROUTER, T_EXP_GATE, T_EXP_UP, T_EXP_DOWN,
    T_SHARED_GATE, T_SHARED_UP, T_SHARED_DOWN, T_SHARED_EXPERT_GATE,
    T_DENSE_GATE, T_DENSE_UP, T_DENSE_DOWN,
    T_KIND_COUNT
} tensor_kind;

typedef struct engine_arch {
    const char *model_type;
    /* defaults of keys config.json may leave out, as the reference's config class sets them */
    double default_rope_theta;
    double default_rms_eps;
    uint32_t default_kv_heads; /* 0: num_attention_heads */
    /* Reads the architecture's config.json keys into c (common keys already read). */
    moesim_status (*parse_config)(const json_t *cfg, engine_config *c, const char *what,
                                  moesim_error *err);
    /* Writes the checkpoint name of a tensor (layer and expert where they apply). */
    void (*tensor_name)(char *buf, size_t len, tensor_kind kind, uint32_t layer, uint32_t expert);
} engine_arch;

/* The loaded matrix of `kind` at model layer `layer` (`expert` and precision `p` for the routed
 * experts' kinds; ignored otherwise; `layer` ignored for T_EMBED and T_LM_HEAD, which is the
 * embedding when tied), or NULL where there is none: a router, expert or shared expert of a
 * dense layer, a dense FFN of an MoE layer, an expert precision not held, and the vector kinds
 * (norms, biases, the shared expert's gate). Borrowed from the engine (replay reads the
 * checkpoint's weights through it). */
const engine_mat *engine_weight(const engine *e, tensor_kind kind, uint32_t layer, uint32_t expert,
                                moesim_precision p);

/* Row r of a stored fp32 or bf16 matrix widened to fp32 (what the quantizer reads). out: [cols] */
void engine_mat_row_f32(const engine_mat *m, uint32_t r, float *out);

extern const engine_arch engine_arch_qwen3_moe, engine_arch_qwen2_moe, engine_arch_olmoe,
    engine_arch_mixtral;

/* Shared config.json readers for the arch files. Each fails naming `what` and the key. */
moesim_status cfg_u32(const json_t *cfg, const char *key, bool required, uint32_t def,
                      uint32_t *out, const char *what, moesim_error *err);
moesim_status cfg_f64(const json_t *cfg, const char *key, bool required, double def, double *out,
                      const char *what, moesim_error *err);
moesim_status cfg_bool(const json_t *cfg, const char *key, bool def, bool *out, const char *what,
                       moesim_error *err);
/* An attention window key: `absent` when the key is missing, 0 (every position) for null when
 * null_is_full, else an integer >= 1 (0 is refused: the reference would mask every position). */
moesim_status cfg_window(const json_t *cfg, const char *key, uint32_t absent, bool null_is_full,
                         uint32_t *out, const char *what, moesim_error *err);
/* A config.json key the reference reads, accepted only where the engine computes the same. */
typedef struct cfg_refusal {
    const char *model_type;           /* NULL: every architecture */
    const char *key;
    /* v: the key's value, NULL when absent; cfg: the whole config (keys read together) */
    bool (*accepts)(const json_t *v, const json_t *cfg);
    const char *supported;            /* what the engine runs, for the message */
} cfg_refusal;
/* The table (engine/README.md lists the same rows). */
const cfg_refusal *cfg_refusals(size_t *n);
/* Fails on the first key of the table `cfg` sets to a value the engine does not implement, naming
 * `what`, the key, its value and what is supported. */
moesim_status cfg_check_refusals(const json_t *cfg, const char *model_type, const char *what,
                                 moesim_error *err);
/* The expert count under `key` or its alias (num_experts, num_local_experts: transformers'
 * attribute_map reads them as one); both set to different values is refused. */
moesim_status cfg_n_experts(const json_t *cfg, const char *key, uint32_t *out, const char *what,
                            moesim_error *err);
/* The RoPE dict transformers reads (convert_rope_params_to_dict): rope_scaling when set (not null,
 * absent or {}), else rope_parameters; NULL when that is not an object. Its rope_theta, else the
 * top-level rope_theta, else the config class's default, is the theta. */
const json_t *cfg_rope_dict(const json_t *cfg);
/* Qwen-style layer selection: MoE where not in mlp_only_layers and (l+1) % decoder_sparse_step
 * == 0. */
moesim_status cfg_qwen_moe_layers(const json_t *cfg, engine_config *c, const char *what,
                                  moesim_error *err);

/* A fixed pool of worker threads running parallel-for loops; deterministic by construction
 * (callers give each index its own output). */
typedef struct thread_pool thread_pool;
thread_pool *thread_pool_create(uint32_t n_threads);
void thread_pool_destroy(thread_pool *p);
uint32_t thread_pool_size(const thread_pool *p);
/* Calls fn(ctx, begin, end) over [0, n) split into contiguous chunks, one per thread. */
void thread_pool_run(thread_pool *p, size_t n, void (*fn)(void *ctx, size_t begin, size_t end),
                     void *ctx);

/* The ops a backend provides to the forward pass. */
typedef struct engine_backend {
    const char *name;
    void (*matvec)(thread_pool *pool, float *y, const engine_mat *w, const float *x);
    void (*rmsnorm)(float *y, const float *x, const float *w, size_t n, float eps);
    void (*rope)(float *x, size_t n_heads, size_t head_dim, uint32_t pos, double theta);
    void (*attention)(float *out, float *probs, const float *q, const float *k, const float *v,
                      size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t n_ctx);
    void (*swiglu)(float *h, const float *gate, const float *up, size_t n);
    void (*softmax)(float *x, size_t n);
    void (*topk)(const float *x, size_t n, size_t k, uint32_t *ids, float *vals);
} engine_backend;

extern const engine_backend engine_backend_cpu;

#endif
