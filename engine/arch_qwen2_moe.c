/* Qwen1.5-MoE / Qwen2-MoE (model_type "qwen2_moe"): bias on q, k, v unless qkv_bias is false (no
 * o_proj bias); a shared expert of width shared_expert_intermediate_size behind a sigmoid gate
 * (shared_expert_gate: hidden -> 1); top-k renormalized only when norm_topk_prob (false for
 * Qwen1.5-MoE-A2.7B); a sliding window on the layers layer_types names. */
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"

/* Windows as transformers 5.23's Qwen2MoeConfig sets them: sliding_window (4096 when absent) if
 * use_sliding_window, else 0; layer_types names each layer "full_attention" or
 * "sliding_attention", and when absent is derived: sliding where (l + 1) % 2 != 0 and
 * l < max_window_layers (28 when absent) and use_sliding_window. */
static moesim_status parse_windows(const json_t *cfg, engine_config *c, const char *what,
                                   moesim_error *err) {
    bool use;
    uint32_t window = 0, max_window_layers;
    moesim_status st;
    /* sliding_window null with use_sliding_window: the reference raises, so no null here */
    if ((st = cfg_bool(cfg, "use_sliding_window", false, &use, what, err)) ||
        (use && (st = cfg_window(cfg, "sliding_window", 4096, false, &window, what, err))) ||
        (st = cfg_u32(cfg, "max_window_layers", false, 28, &max_window_layers, what, err)))
        return st;
    const json_t *types = json_object_get(cfg, "layer_types");
    if (!types || json_is_null(types)) {
        for (uint32_t l = 0; l < c->n_layers; l++)
            c->attn_window[l] = use && (l + 1) % 2 && l < max_window_layers ? window : 0;
        return MOESIM_OK;
    }
    if (!json_is_array(types) || json_array_size(types) != c->n_layers)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: layer_types: expected an array of %u names (one per layer)", what,
                           c->n_layers);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, l));
        if (t && !strcmp(t, "full_attention")) {
            c->attn_window[l] = 0;
        } else if (t && !strcmp(t, "sliding_attention")) {
            if (!use)
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s: layer_types[%u]: \"sliding_attention\" needs "
                                   "use_sliding_window true (the reference's window is then 0, "
                                   "which masks every position)", what, l);
            c->attn_window[l] = window;
        } else {
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: layer_types[%u]: expected \"full_attention\" or "
                               "\"sliding_attention\"", what, l);
        }
    }
    return MOESIM_OK;
}

static moesim_status parse(const json_t *cfg, engine_config *c, const char *what,
                           moesim_error *err) {
    moesim_status st;
    if ((st = cfg_n_experts(cfg, "num_experts", &c->n_experts, what, err)) ||
        (st = cfg_u32(cfg, "num_experts_per_tok", true, 0, &c->top_k, what, err)) ||
        (st = cfg_u32(cfg, "moe_intermediate_size", true, 0, &c->expert_inter, what, err)) ||
        /* 5632 when absent, as Qwen2MoeConfig has it */
        (st = cfg_u32(cfg, "shared_expert_intermediate_size", false, 5632, &c->shared_inter,
                      what, err)) ||
        (st = cfg_bool(cfg, "norm_topk_prob", false, &c->norm_topk_prob, what, err)) ||
        (st = cfg_bool(cfg, "qkv_bias", true, &c->qkv_bias, what, err)) ||
        (st = parse_windows(cfg, c, what, err)) ||
        (st = cfg_qwen_moe_layers(cfg, c, what, err)))
        return st;
    c->shared_expert_gate = c->shared_inter > 0;
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
    case T_ROUTER: snprintf(buf, len, "model.layers.%u.mlp.gate.weight", l); break;
    case T_EXP_GATE: snprintf(buf, len, "model.layers.%u.mlp.experts.%u.gate_proj.weight", l, e); break;
    case T_EXP_UP: snprintf(buf, len, "model.layers.%u.mlp.experts.%u.up_proj.weight", l, e); break;
    case T_EXP_DOWN: snprintf(buf, len, "model.layers.%u.mlp.experts.%u.down_proj.weight", l, e); break;
    case T_SHARED_GATE: snprintf(buf, len, "model.layers.%u.mlp.shared_expert.gate_proj.weight", l); break;
    case T_SHARED_UP: snprintf(buf, len, "model.layers.%u.mlp.shared_expert.up_proj.weight", l); break;
    case T_SHARED_DOWN: snprintf(buf, len, "model.layers.%u.mlp.shared_expert.down_proj.weight", l); break;
    case T_SHARED_EXPERT_GATE: snprintf(buf, len, "model.layers.%u.mlp.shared_expert_gate.weight", l); break;
    case T_DENSE_GATE: snprintf(buf, len, "model.layers.%u.mlp.gate_proj.weight", l); break;
    case T_DENSE_UP: snprintf(buf, len, "model.layers.%u.mlp.up_proj.weight", l); break;
    case T_DENSE_DOWN: snprintf(buf, len, "model.layers.%u.mlp.down_proj.weight", l); break;
    default: snprintf(buf, len, "(none)"); break;
    }
}

/* defaults when config.json leaves the key out, as transformers 5.23's Qwen2MoeConfig sets them:
 * default_theta, rms_norm_eps, num_key_value_heads 16 */
const engine_arch engine_arch_qwen2_moe = {"qwen2_moe", 1e4, 1e-6, 16, parse, name};
