/* config.json readers shared by the architecture files: typed keys with defaults, each failure
 * naming the file and the key. JSON null counts as absent (HF writes "head_dim": null). */
#include <string.h>

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
