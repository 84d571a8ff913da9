/* config.json as the engine reads it: the file itself (size-limited), the keys every architecture
 * shares (sizes, heads, norms, RoPE theta, tied head), the refusal table (config_json.c), then the
 * architecture's own keys (arch_*.c) and the checks of what they give together. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/hash.h"
#include "engine/engine_internal.h"

#define MAX_HIDDEN (1u << 16)
#define MAX_VOCAB (1u << 22)
#define MAX_INTER (1u << 18)
#define MAX_CONFIG_BYTES (1u << 22)

static const engine_arch *const archs[] = {&engine_arch_qwen3_moe, &engine_arch_qwen2_moe,
                                           &engine_arch_olmoe, &engine_arch_mixtral};

const char *engine_supported_types(void) { return "qwen3_moe, qwen2_moe, olmoe, mixtral"; }

moesim_status engine_read_small_file(const char *path, char **out, size_t *len, moesim_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = moesim_xmalloc(MAX_CONFIG_BYTES + 1);
    size_t n = fread(buf, 1, MAX_CONFIG_BYTES + 1, fp);
    int bad = ferror(fp);
    fclose(fp);
    if (bad || n > MAX_CONFIG_BYTES) {
        free(buf);
        return moesim_fail(err, MOESIM_EINPUT, "%s: unreadable or larger than %u bytes", path,
                           MAX_CONFIG_BYTES);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return MOESIM_OK;
}

static moesim_status check_range(const char *what, const char *key, uint64_t v, uint64_t lo,
                                 uint64_t hi, moesim_error *err) {
    if (v < lo || v > hi)
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s: %llu outside [%llu, %llu]", what, key,
                           (unsigned long long)v, (unsigned long long)lo, (unsigned long long)hi);
    return MOESIM_OK;
}

moesim_status engine_config_load(engine *e, const char *path, moesim_error *err) {
    char *text;
    size_t len;
    moesim_status st = engine_read_small_file(path, &text, &len, err);
    if (st) return st;
    engine_config *c = &e->cfg;
    c->config_hash = hash_fnv1a64(text, len, MOESIM_FNV1A64_INIT);
    json_error_t jerr;
    json_t *cfg = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!cfg)
        return moesim_fail(err, MOESIM_EINPUT, "%s:%d: invalid JSON: %s", path, jerr.line,
                           jerr.text);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return moesim_fail(err, MOESIM_EINPUT, "%s: expected a JSON object", path);
    }
    const json_t *mt = json_object_get(cfg, "model_type");
    if (!json_is_string(mt)) {
        json_decref(cfg);
        return moesim_fail(err, MOESIM_EINPUT, "%s: model_type: missing (supported: %s)", path,
                           engine_supported_types());
    }
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(archs); i++)
        if (!strcmp(archs[i]->model_type, json_string_value(mt))) e->arch = archs[i];
    if (!e->arch) {
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: model_type '%.40s' is not supported (supported: %s)", path,
                         json_string_value(mt), engine_supported_types());
        json_decref(cfg);
        return st;
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", e->arch->model_type);

    double eps, theta = 0;
    uint32_t head_dim;
    if ((st = cfg_u32(cfg, "hidden_size", true, 0, &c->hidden, path, err)) ||
        (st = cfg_u32(cfg, "num_hidden_layers", true, 0, &c->n_layers, path, err)) ||
        (st = cfg_u32(cfg, "vocab_size", true, 0, &c->vocab, path, err)) ||
        (st = cfg_u32(cfg, "num_attention_heads", true, 0, &c->n_heads, path, err)) ||
        /* (n_heads is read by then: || evaluates in order) */
        (st = cfg_u32(cfg, "num_key_value_heads", false,
                      e->arch->default_kv_heads ? e->arch->default_kv_heads : c->n_heads,
                      &c->n_kv_heads, path, err)) ||
        (st = cfg_u32(cfg, "head_dim", false, 0, &head_dim, path, err)) ||
        (st = cfg_u32(cfg, "intermediate_size", false, 0, &c->dense_inter, path, err)) ||
        (st = cfg_f64(cfg, "rms_norm_eps", false, e->arch->default_rms_eps, &eps, path, err)) ||
        (st = cfg_bool(cfg, "tie_word_embeddings", false, &c->tie_embeddings, path, err)))
        goto done;
    c->rms_eps = (float)eps;
    if ((st = cfg_check_refusals(cfg, c->model_type, path, err))) goto done;
    /* RoPE theta as transformers' convert_rope_params_to_dict takes it: the RoPE dict's
     * (rope_scaling when set, else rope_parameters), else the top-level rope_theta, else the class
     * default */
    const json_t *rope = cfg_rope_dict(cfg);
    if (rope && json_object_get(rope, "rope_theta") &&
        !json_is_null(json_object_get(rope, "rope_theta")))
        st = cfg_f64(rope, "rope_theta", true, 0, &theta, path, err);
    else
        st = cfg_f64(cfg, "rope_theta", false, e->arch->default_rope_theta, &theta, path, err);
    if (st) goto done;
    c->rope_theta = theta;
    if ((st = check_range(path, "num_hidden_layers", c->n_layers, 1, MODEL_MAX_LAYERS, err)) ||
        (st = check_range(path, "hidden_size", c->hidden, 1, MAX_HIDDEN, err)) ||
        (st = check_range(path, "vocab_size", c->vocab, 1, MAX_VOCAB, err)) ||
        (st = check_range(path, "num_attention_heads", c->n_heads, 1, 1024, err)) ||
        (st = check_range(path, "num_key_value_heads", c->n_kv_heads, 1, c->n_heads, err)))
        goto done;
    if (c->n_heads % c->n_kv_heads) {
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: num_attention_heads %u is not a multiple of num_key_value_heads %u",
                         path, c->n_heads, c->n_kv_heads);
        goto done;
    }
    c->head_dim = head_dim ? head_dim : c->hidden / c->n_heads;
    if ((st = check_range(path, "head_dim", c->head_dim, 2, 1024, err))) goto done;
    if (c->head_dim % 2) {
        st = moesim_fail(err, MOESIM_EINPUT, "%s: head_dim %u: expected an even number", path,
                         c->head_dim);
        goto done;
    }
    if (!(theta > 0 && isfinite(theta)) || !(eps > 0 && eps < 1)) {
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: rope_theta and rms_norm_eps: expected theta > 0 and 0 < eps < 1",
                         path);
        goto done;
    }
    if ((st = e->arch->parse_config(cfg, c, path, err))) goto done;
    if ((st = check_range(path, "number of experts", c->n_experts, 1, MODEL_MAX_EXPERTS, err)) ||
        (st = check_range(path, "num_experts_per_tok", c->top_k, 1,
                          c->n_experts < ENGINE_MAX_TOP_K ? c->n_experts : ENGINE_MAX_TOP_K,
                          err)) ||
        (st = check_range(path, "expert intermediate size", c->expert_inter, 1, MAX_INTER, err)) ||
        (st = check_range(path, "shared_expert_intermediate_size", c->shared_inter, 0, MAX_INTER,
                          err)) ||
        (st = check_range(path, "intermediate_size", c->dense_inter, 0, MAX_INTER, err)))
        goto done;
    c->n_moe_layers = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (c->is_moe[l]) {
            c->moe_index[l] = c->n_moe_layers;
            c->moe_layer[c->n_moe_layers++] = l;
        } else if (!c->dense_inter) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: layer %u is dense but intermediate_size is missing", path, l);
            goto done;
        }
    }
    if (!c->n_moe_layers)
        st = moesim_fail(err, MOESIM_EINPUT, "%s: no MoE layer (decoder_sparse_step, "
                         "mlp_only_layers)", path);
done:
    json_decref(cfg);
    return st;
}
