/* OLMoE (model_type "olmoe"): QK-norm over the whole q and k projections (q_norm: [hidden],
 * k_norm: [n_kv_heads * head_dim]) before RoPE, a clip_qkv clamp unless null, every layer MoE,
 * gate weights not renormalized unless norm_topk_prob; attention_bias puts a bias on q, k, v and
 * o_proj; full attention (a sliding_window key is refused, config_json.c). */
#include <stdio.h>

#include "engine/engine_internal.h"

static moesim_status parse(const json_t *cfg, engine_config *c, const char *what,
                           moesim_error *err) {
    moesim_status st;
    double clip;
    if ((st = cfg_n_experts(cfg, "num_experts", &c->n_experts, what, err)) ||
        (st = cfg_u32(cfg, "num_experts_per_tok", true, 0, &c->top_k, what, err)) ||
        (st = cfg_u32(cfg, "intermediate_size", true, 0, &c->expert_inter, what, err)) ||
        (st = cfg_bool(cfg, "norm_topk_prob", false, &c->norm_topk_prob, what, err)) ||
        (st = cfg_bool(cfg, "attention_bias", false, &c->qkv_bias, what, err)) ||
        (st = cfg_f64(cfg, "clip_qkv", false, -1, &clip, what, err)))
        return st;
    c->o_bias = c->qkv_bias;
    /* the reference clamps whenever clip_qkv is not None: 0 clamps q, k and v to 0 */
    c->clip_qkv_on = json_is_number(json_object_get(cfg, "clip_qkv"));
    if (c->clip_qkv_on && clip < 0)
        return moesim_fail(err, MOESIM_EINPUT, "%s: clip_qkv: expected null or a number >= 0",
                           what);
    c->clip_qkv = c->clip_qkv_on ? (float)clip : 0;
    c->qk_norm_full = true;
    for (uint32_t l = 0; l < c->n_layers; l++) c->is_moe[l] = true;
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
    default: snprintf(buf, len, "(none)"); break;
    }
}

/* defaults when config.json leaves the key out, as transformers 5.23's OlmoeConfig sets them:
 * default_theta, rms_norm_eps, num_key_value_heads None (= heads) */
const engine_arch engine_arch_olmoe = {"olmoe", 1e4, 1e-5, 0, parse, name};
