/* Engine internals shared by its files (engine.c: load and accessors; config_load.c: config.json;
 * checkpoint.c: the tensors; forward.c: the forward pass; precmap.c; the architecture files
 * arch_*.c and the backends backend_*.c): the engine and sequence structs, the per-architecture
 * table, the config.json readers and the backend table (ggml-backend style: a struct of function
 * pointers, NULL = not provided). Not part of the public interface (engine.h, weights.h,
 * thread_pool.h). */
#ifndef MOESIM_ENGINE_INTERNAL_H
#define MOESIM_ENGINE_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/safetensors.h"
#include "engine/thread_pool.h"
#include "engine/weights.h"

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

/* A backend: either op by op (matvec ... topk: forward.c's pass calls them, the whole-forward
 * hooks NULL) or a whole forward pass (the ops NULL): attach prepares the loaded weights (e.g.
 * copies them to a device) and sets e->be_state, detach frees it; seq_attach and seq_detach do
 * the same for a sequence's s->be_seq; forward runs one token whose embedding row is e->x at
 * position s->len, writing what engine_seq_forward promises (logits, info, s->importance). */
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

    moesim_status (*attach)(engine *e, const engine_options *opt, moesim_error *err);
    void (*detach)(engine *e);
    void (*seq_attach)(const engine *e, engine_seq *s);
    void (*seq_detach)(engine_seq *s);
    void (*forward)(engine *e, engine_seq *s, const engine_precmap *pmap, float *logits,
                    engine_token_info *info);
    void (*pool_stats)(const engine *e, engine_pool_stats *out); /* NULL: no pool (all zero) */
} engine_backend;

extern const engine_backend engine_backend_cpu;
/* The CUDA forward pass (backend_cuda.c over kernels/cuda/engine_cuda.cu); NULL in a build
 * without CUDA. */
extern const engine_backend *const engine_backend_cuda;

/* ---- the loaded model (engine.c, config_load.c, checkpoint.c, forward.c) ---- */

#define ENGINE_MAX_SHARDS 256

typedef struct expert_w {
    engine_mat m[PREC_COUNT][PART_COUNT]; /* filled for bf16 and each held integer format */
} expert_w;

typedef struct layer_w {
    float *attn_norm, *ffn_norm;     /* [hidden] */
    float *q_bias, *k_bias, *v_bias; /* [q_dim], [kv_dim], [kv_dim] or NULL */
    float *o_bias;                   /* [hidden] or NULL */
    float *q_norm, *k_norm;          /* [head_dim] (per head) or [q_dim]/[kv_dim] (full) */
    engine_mat wq, wk, wv, wo;       /* [q_dim][hidden] ... [hidden][q_dim] */
    engine_mat router;               /* [n_experts][hidden] (MoE layers) */
    expert_w *experts;               /* [n_experts] (MoE layers) */
    engine_mat shared[PART_COUNT];   /* shared expert, when shared_inter > 0 */
    float *shared_gate;              /* [hidden] or NULL */
    engine_mat dense[PART_COUNT];    /* dense MLP (non-MoE layers) */
} layer_w;

struct engine {
    engine_config cfg;
    const engine_arch *arch;
    const engine_backend *be;
    void *be_state; /* a whole-forward backend's (attach) */
    thread_pool *pool;
    uint32_t precision_mask;
    st_file *shards[ENGINE_MAX_SHARDS];
    char shard_names[ENGINE_MAX_SHARDS][256]; /* file names of index shards */
    uint32_t n_shards;
    json_t *weight_map; /* index.json's weight_map, or NULL for a single file */
    void **owned;       /* buffers to free */
    size_t n_owned, cap_owned;
    engine_mat embed, lm_head;
    float *final_norm;
    layer_w *layers; /* [n_layers] */
    /* scratch for one forward */
    float *x, *h, *tmp, *y, *eo, *q, *k, *v, *att; /* [hidden] x5, [q_dim], [kv_dim] x2, [q_dim] */
    float *ff_gate, *ff_up;                         /* [max inter] */
    float *router_logits, *router_probs;            /* [n_experts] */
    uint32_t *la_ids;                               /* [n_experts] */
    float *la_vals;                                 /* [n_experts] */
};

struct engine_seq {
    const engine_backend *be;
    void *be_seq; /* a whole-forward backend's (seq_attach) */
    uint32_t max_ctx, len;
    uint32_t n_layers, kv_dim, n_moe, n_heads;
    float *k, *v;      /* [n_layers][max_ctx][kv_dim] */
    float *importance; /* [n_moe][max_ctx] */
    float *probs;      /* [n_heads][max_ctx] scratch */
};

/* Records p (malloc'd) to be freed with the engine; returns p. */
void *engine_own(engine *e, void *p);
/* A whole small file (config.json, the shard index), NUL-terminated; caller frees *out. */
moesim_status engine_read_small_file(const char *path, char **out, size_t *len, moesim_error *err);
/* Reads and checks config.json at `path` into e->cfg and e->arch (config_load.c). */
moesim_status engine_config_load(engine *e, const char *path, moesim_error *err);
/* Opens the checkpoint's safetensors file or shard index, then loads and checks every tensor the
 * configuration needs, quantizing the experts to each held precision (checkpoint.c). */
moesim_status engine_checkpoint_load(engine *e, const char *dir, moesim_error *err);

#endif
