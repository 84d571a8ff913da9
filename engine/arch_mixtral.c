/* Mixtral (model_type "mixtral"): experts w1 (gate), w3 (up), w2 (down) under block_sparse_moe;
 * softmax over all experts then the top-k renormalized (always); every layer MoE; no attention
 * bias; optional sliding-window attention on every layer (sliding_window; null: none). */
#include <stdio.h>

#include "engine/engine_internal.h"

static moesim_status parse(const json_t *cfg, engine_config *c, const char *what,
                           moesim_error *err) {
    moesim_status st;
    uint32_t window;
    if ((st = cfg_n_experts(cfg, "num_local_experts", &c->n_experts, what, err)) ||
        (st = cfg_u32(cfg, "num_experts_per_tok", true, 0, &c->top_k, what, err)) ||
        (st = cfg_u32(cfg, "intermediate_size", true, 0, &c->expert_inter, what, err)) ||
        (st = cfg_window(cfg, "sliding_window", 0, true, &window, what, err)))
        return st;
    c->norm_topk_prob = true;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        c->is_moe[l] = true;
        c->attn_window[l] = window;
    }
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
    case T_ROUTER: snprintf(buf, len, "model.layers.%u.block_sparse_moe.gate.weight", l); break;
    case T_EXP_GATE: snprintf(buf, len, "model.layers.%u.block_sparse_moe.experts.%u.w1.weight", l, e); break;
    case T_EXP_UP: snprintf(buf, len, "model.layers.%u.block_sparse_moe.experts.%u.w3.weight", l, e); break;
    case T_EXP_DOWN: snprintf(buf, len, "model.layers.%u.block_sparse_moe.experts.%u.w2.weight", l, e); break;
    default: snprintf(buf, len, "(none)"); break;
    }
}

/* defaults when config.json leaves the key out, as transformers 5.23's MixtralConfig sets them:
 * default_theta, rms_norm_eps, num_key_value_heads 8 */
const engine_arch engine_arch_mixtral = {"mixtral", 1e6, 1e-5, 8, parse, name};
