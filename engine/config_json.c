/* config.json readers shared by the architecture files: typed keys with defaults, each failure
 * naming the file and the key. JSON null counts as absent (HF writes "head_dim": null), except
 * where the reference gives null its own meaning (cfg_window). Also the table of keys the engine
 * refuses (cfg_check_refusals), the expert-count aliases and the RoPE dict transformers reads. */
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "engine/engine_internal.h"

static const json_t *get(const json_t *cfg, const char *key) {
    const json_t *v = json_object_get(cfg, key);
    return json_is_null(v) ? NULL : v;
}

moesim_status cfg_u32(const json_t *cfg, const char *key, bool required, uint32_t def,
                      uint32_t *out, const char *what, moesim_error *err) {
    const json_t *v = get(cfg, key);
    if (!v) {
        if (required)
            return moesim_fail(err, MOESIM_EINPUT, "%s: %s: missing (expected an integer)", what,
                               key);
        *out = def;
        return MOESIM_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s: expected a non-negative integer", what,
                           key);
    *out = (uint32_t)json_integer_value(v);
    return MOESIM_OK;
}

moesim_status cfg_f64(const json_t *cfg, const char *key, bool required, double def, double *out,
                      const char *what, moesim_error *err) {
    const json_t *v = get(cfg, key);
    if (!v) {
        if (required)
            return moesim_fail(err, MOESIM_EINPUT, "%s: %s: missing (expected a number)", what,
                               key);
        *out = def;
        return MOESIM_OK;
    }
    if (!json_is_number(v))
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s: expected a number", what, key);
    *out = json_number_value(v);
    return MOESIM_OK;
}

moesim_status cfg_bool(const json_t *cfg, const char *key, bool def, bool *out, const char *what,
                       moesim_error *err) {
    const json_t *v = get(cfg, key);
    if (!v) {
        *out = def;
        return MOESIM_OK;
    }
    if (!json_is_boolean(v))
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s: expected true or false", what, key);
    *out = json_is_true(v);
    return MOESIM_OK;
}

moesim_status cfg_qwen_moe_layers(const json_t *cfg, engine_config *c, const char *what,
                                  moesim_error *err) {
    uint32_t step;
    moesim_status st = cfg_u32(cfg, "decoder_sparse_step", false, 1, &step, what, err);
    if (st) return st;
    if (step == 0)
        return moesim_fail(err, MOESIM_EINPUT, "%s: decoder_sparse_step: expected >= 1", what);
    for (uint32_t l = 0; l < c->n_layers; l++) c->is_moe[l] = (l + 1) % step == 0;
    const json_t *only = get(cfg, "mlp_only_layers");
    if (only) {
        if (!json_is_array(only))
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: mlp_only_layers: expected an array of layer indices", what);
        for (size_t i = 0; i < json_array_size(only); i++) {
            const json_t *x = json_array_get(only, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) >= c->n_layers)
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s: mlp_only_layers[%zu]: expected a layer index < %u", what,
                                   i, c->n_layers);
            c->is_moe[json_integer_value(x)] = false;
        }
    }
    return MOESIM_OK;
}

moesim_status cfg_window(const json_t *cfg, const char *key, uint32_t absent, bool null_is_full,
                         uint32_t *out, const char *what, moesim_error *err) {
    const json_t *v = json_object_get(cfg, key);
    if (!v) {
        *out = absent;
        return MOESIM_OK;
    }
    if (json_is_null(v) && null_is_full) {
        *out = 0;
        return MOESIM_OK;
    }
    /* a window of 0 masks every position in the reference (kv > q - 0 and kv <= q) */
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > UINT32_MAX)
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s: expected %san integer >= 1", what, key,
                           null_is_full ? "null or " : "");
    *out = (uint32_t)json_integer_value(v);
    return MOESIM_OK;
}

moesim_status cfg_n_experts(const json_t *cfg, const char *key, uint32_t *out, const char *what,
                            moesim_error *err) {
    /* transformers' attribute_map makes num_experts and num_local_experts one attribute */
    static const char *const names[] = {"num_experts", "num_local_experts"};
    uint32_t n[2];
    bool set[2];
    for (int i = 0; i < 2; i++) {
        set[i] = get(cfg, names[i]) != NULL;
        moesim_status st = cfg_u32(cfg, names[i], false, 0, &n[i], what, err);
        if (st) return st;
    }
    if (set[0] && set[1] && n[0] != n[1])
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: num_experts %u and num_local_experts %u: expected one value "
                           "(transformers reads both keys as one attribute)",
                           what, n[0], n[1]);
    if (!set[0] && !set[1])
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s: missing (expected an integer)", what, key);
    *out = set[0] ? n[0] : n[1];
    return MOESIM_OK;
}

/* ---- RoPE: the dict transformers reads ---- */

/* rope_scaling as Python's truth test sees it (`rope_scaling or rope_parameters`): null, absent
 * and {} are false, every other value true. */
static bool rope_scaling_set(const json_t *cfg) {
    const json_t *v = json_object_get(cfg, "rope_scaling");
    return v && !json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0);
}

const json_t *cfg_rope_dict(const json_t *cfg) {
    const json_t *v =
        json_object_get(cfg, rope_scaling_set(cfg) ? "rope_scaling" : "rope_parameters");
    return json_is_object(v) ? v : NULL;
}

/* A RoPE dict of unscaled RoPE: its type ("rope_type", else the legacy "type", as
 * standardize_rope_params reads it) absent or "default", and one dict for every layer (a dict of
 * dicts is transformers' RoPE per layer type). */
static bool default_rope_dict(const json_t *v) {
    if (!json_is_object(v)) return false;
    const char *key;
    const json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        if (json_is_object(x)) return false;
    }
    const json_t *type = json_object_get(v, "rope_type");
    if (!type) type = json_object_get(v, "type");
    return !type || (json_is_string(type) && !strcmp(json_string_value(type), "default"));
}

/* ---- keys the engine does not implement ---- */

/* transformers' ACT2FN maps "swish" to the same SiLU as "silu" */
static bool silu(const json_t *v, const json_t *cfg) {
    (void)cfg;
    if (!v) return true;
    const char *s = json_string_value(v);
    return s && (!strcmp(s, "silu") || !strcmp(s, "swish"));
}

static bool absent_or_null(const json_t *v, const json_t *cfg) {
    (void)cfg;
    return !v || json_is_null(v);
}

/* rope_scaling replaces rope_parameters whenever it is set: it must then be unscaled */
static bool unscaled_rope_scaling(const json_t *v, const json_t *cfg) {
    return !rope_scaling_set(cfg) || default_rope_dict(v);
}

/* rope_parameters is read only when rope_scaling is not set */
static bool unscaled_rope_parameters(const json_t *v, const json_t *cfg) {
    return rope_scaling_set(cfg) || !v || json_is_null(v) || default_rope_dict(v);
}

/* Keys that the reference (transformers' modeling code of the model_type) reads and that change
 * what it computes at inference, at values the engine does not implement. engine/README.md lists
 * the same rows; every key the reference reads is either implemented (arch_*.c, config_load.c), here,
 * or has no effect on inference (README). */
static const cfg_refusal refusals[] = {
    {NULL, "quantization_config", absent_or_null,
     "absent or null: the engine reads unquantized bf16, fp16 or fp32 weights"},
    {NULL, "hidden_act", silu, "\"silu\" or \"swish\""},
    {NULL, "rope_scaling", unscaled_rope_scaling,
     "null, {} or rope_type (or type) \"default\": scaled RoPE is not implemented"},
    {NULL, "rope_parameters", unscaled_rope_parameters,
     "rope_type (or type) \"default\": scaled RoPE is not implemented"},
    {"olmoe", "sliding_window", absent_or_null,
     "null: transformers applies it to OLMoE only under flash attention, the eager and sdpa "
     "references attend to every position"},
};

const cfg_refusal *cfg_refusals(size_t *n) {
    *n = MOESIM_ARRAY_LEN(refusals);
    return refusals;
}

moesim_status cfg_check_refusals(const json_t *cfg, const char *model_type, const char *what,
                                 moesim_error *err) {
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(refusals); i++) {
        const cfg_refusal *r = &refusals[i];
        if (r->model_type && strcmp(r->model_type, model_type)) continue;
        const json_t *v = json_object_get(cfg, r->key);
        if (r->accepts(v, cfg)) continue;
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        moesim_status st = moesim_fail(err, MOESIM_EINPUT,
                                       "%s: %s: %.60s%s is not implemented by the engine "
                                       "(supported: %s)", what, r->key, text ? text : "?",
                                       text && strlen(text) > 60 ? "..." : "", r->supported);
        free(text);
        return st;
    }
    return MOESIM_OK;
}
