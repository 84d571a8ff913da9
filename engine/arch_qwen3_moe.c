/* Qwen3-MoE (model_type "qwen3_moe"): QK-norm per head, no shared expert, top-k renormalized when
 * norm_topk_prob, Qwen-style MoE layer selection (decoder_sparse_step, mlp_only_layers);
 * attention_bias puts a bias on q, k, v and o_proj; use_sliding_window gives every layer the
 * window sliding_window (4096 when absent, none when null), as transformers 5.23 does: its
 * Qwen3-MoE reads no max_window_layers or layer_types. */
#include <stdio.h>

#include "engine/engine_internal.h"

static moesim_status parse(const json_t *cfg, engine_config *c, const char *what,
                           moesim_error *err) {
    moesim_status st;
    bool sliding;
    uint32_t window = 0;
    if ((st = cfg_n_experts(cfg, "num_experts", &c->n_experts, what, err)) ||
        (st = cfg_u32(cfg, "num_experts_per_tok", true, 0, &c->top_k, what, err)) ||
        (st = cfg_u32(cfg, "moe_intermediate_size", true, 0, &c->expert_inter, what, err)) ||
        (st = cfg_bool(cfg, "norm_topk_prob", false, &c->norm_topk_prob, what, err)) ||
        (st = cfg_bool(cfg, "attention_bias", false, &c->qkv_bias, what, err)) ||
        (st = cfg_bool(cfg, "use_sliding_window", false, &sliding, what, err)) ||
        (sliding && (st = cfg_window(cfg, "sliding_window", 4096, true, &window, what, err))) ||
        (st = cfg_qwen_moe_layers(cfg, c, what, err)))
        return st;
    c->o_bias = c->qkv_bias;
    for (uint32_t l = 0; l < c->n_layers; l++) c->attn_window[l] = window;
    c->qk_norm_per_head = true;
    return MOESIM_OK;
}

static void name(char *buf, size_t len, tensor_kind kind, uint32_t l, uint32_t e) {
    switch (kind) {
    case T_EMBED: snprintf(buf, len, "model.embed_tokens.weight"); break;
    case T_FINAL_NORM: snprintf(buf, len, "model.norm.weight"); break;
    case T_LM_HEAD: snprintf(buf, len, "lm_head.weight"); break;
    case T_ATTN_NORM: snprintf(buf, len, "model.layers.%u.input_layernorm.weight", l); break;
    case T_FFN_NORM: snprintf(buf, len, "model.layers.%u.post_attention_layernorm.weight", l); break;
    case T_Q: snprintf(buf, len, "model.layers.%u.self_attn.q_proj.weight", l); break;
    case T_K: snprintf(buf, len, "model.layers.%u.self_attn.k_proj.weight", l); break;
    case T_V: snprintf(buf, len, "model.layers.%u.self_attn.v_proj.weight", l); break;
    case T_O: snprintf(buf, len, "model.layers.%u.self_attn.o_proj.weight", l); break;
    case T_Q_BIAS: snprintf(buf, len, "model.layers.%u.self_attn.q_proj.bias", l); break;
    case T_K_BIAS: snprintf(buf, len, "model.layers.%u.self_attn.k_proj.bias", l); break;
    case T_V_BIAS: snprintf(buf, len, "model.layers.%u.self_attn.v_proj.bias", l); break;
    case T_O_BIAS: snprintf(buf, len, "model.layers.%u.self_attn.o_proj.bias", l); break;
    case T_Q_NORM: snprintf(buf, len, "model.layers.%u.self_attn.q_norm.weight", l); break;
    case T_K_NORM: snprintf(buf, len, "model.layers.%u.self_attn.k_norm.weight", l); break;
    case T_ROUTER: snprintf(buf, len, "model.layers.%u.mlp.gate.weight", l); break;
    case T_EXP_GATE: snprintf(buf, len, "model.layers.%u.mlp.experts.%u.gate_proj.weight", l, e); break;
    case T_EXP_UP: snprintf(buf, len, "model.layers.%u.mlp.experts.%u.up_proj.weight", l, e); break;
    case T_EXP_DOWN: snprintf(buf, len, "model.layers.%u.mlp.experts.%u.down_proj.weight", l, e); break;
    case T_DENSE_GATE: snprintf(buf, len, "model.layers.%u.mlp.gate_proj.weight", l); break;
    case T_DENSE_UP: snprintf(buf, len, "model.layers.%u.mlp.up_proj.weight", l); break;
    case T_DENSE_DOWN: snprintf(buf, len, "model.layers.%u.mlp.down_proj.weight", l); break;
    default: snprintf(buf, len, "(none)"); break;
    }
}

/* defaults when config.json leaves the key out, as transformers 5.23's Qwen3MoeConfig sets them:
 * default_theta, rms_norm_eps, num_key_value_heads 4 */
const engine_arch engine_arch_qwen3_moe = {"qwen3_moe", 1e4, 1e-6, 4, parse, name};
