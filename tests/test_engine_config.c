/* config.json as the engine reads it (engine/config_json.c, engine/arch_*.c): every key of the
 * refusal table refused by `moesim record` with one line and exit status 2; keys the engine
 * implements read as transformers 5.23 reads them (sliding windows per layer, biases), bad values
 * refused naming the file and the key. Each case edits one key of a golden fixture's config.json
 * in a scratch checkpoint that links the fixture's weights. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/safetensors.h"
#include "support/test_support.h"

TestSuite(engine_config);

/* One key set to a JSON value (NULL: the key removed). */
typedef struct key_edit {
    const char *key, *json;
} key_edit;

static void link_into(const char *dir, const char *fixture, const char *file) {
    char src[2048], dst[2048];
    snprintf(src, sizeof src, "%s/tests/fixtures/golden/%s/%s", MOESIM_SOURCE_DIR, fixture, file);
    snprintf(dst, sizeof dst, "%s/%s", dir, file);
    unlink(dst);
    cr_assert_eq(symlink(src, dst), 0, "symlink %s", dst);
}

/* A checkpoint directory `name` (a static buffer) holding `fixture`'s config.json with `edits`
 * applied and links to its weights and golden outputs. */
static const char *checkpoint_named(const char *name, const char *fixture, const key_edit *edits,
                                    size_t n_edits) {
    static char dir[2048];
    snprintf(dir, sizeof dir, "%s", test_tmp_path(name));
    mkdir(dir, 0755);
    char path[2100];
    snprintf(path, sizeof path, "%s/tests/fixtures/golden/%s/config.json", MOESIM_SOURCE_DIR,
             fixture);
    json_error_t jerr;
    json_t *cfg = json_load_file(path, 0, &jerr);
    cr_assert(cfg, "%s: %s", path, jerr.text);
    for (size_t i = 0; i < n_edits; i++) {
        if (!edits[i].json) {
            json_object_del(cfg, edits[i].key);
            continue;
        }
        json_t *v = json_loads(edits[i].json, JSON_DECODE_ANY, &jerr);
        cr_assert(v, "%s: %s", edits[i].json, jerr.text);
        json_object_set_new(cfg, edits[i].key, v);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(json_dump_file(cfg, path, JSON_INDENT(2)), 0);
    json_decref(cfg);
    link_into(dir, fixture, "model.safetensors");
    link_into(dir, fixture, "golden.safetensors");
    return dir;
}

static const char *checkpoint_with(const char *fixture, const key_edit *edits, size_t n_edits) {
    return checkpoint_named(fixture, fixture, edits, n_edits);
}

static const char *checkpoint_with_key(const char *fixture, const char *key, const char *json) {
    key_edit e = {key, json};
    return checkpoint_with(fixture, &e, 1);
}

/* engine_load of dir fails as bad input with a message holding `want`. */
static void assert_load_refused(const char *dir, const char *want) {
    engine *e = NULL;
    moesim_error err = {0};
    engine_options opt = {.n_threads = 1};
    cr_assert_eq(engine_load(dir, &opt, &e, &err), MOESIM_EINPUT, "%s loaded", dir);
    cr_assert_null(e);
    cr_assert(strstr(err.msg, want), "message '%s' lacks '%s'", err.msg, want);
    cr_assert(strstr(err.msg, "config.json") || strstr(err.msg, dir), "%s: no file named",
              err.msg);
}

static engine *load_ok(const char *dir) {
    engine *e = NULL;
    moesim_error err = {0};
    engine_options opt = {.n_threads = 1};
    cr_assert_eq(engine_load(dir, &opt, &e, &err), MOESIM_OK, "%s", err.msg);
    return e;
}

/* `moesim record` on dir exits 2 with one line on stderr holding `want` and writes nothing. */
static void assert_record_refuses(const char *dir, const char *want) {
    char toks[2048], out_h5[2048], out[4096], errbuf[4096];
    snprintf(toks, sizeof toks, "%s", test_tmp_path("prompts.txt"));
    snprintf(out_h5, sizeof out_h5, "%s", test_tmp_path("never.h5"));
    test_write_file(toks, "1 2 3 4 5 6\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "record", "--model", dir,
                             "--input", toks, "-o", out_h5, NULL);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, errbuf);
    cr_assert(strstr(errbuf, want), "stderr '%s' lacks '%s'", errbuf, want);
    char *nl = strchr(errbuf, '\n');
    cr_assert(nl && nl[1] == '\0', "not one line: '%s'", errbuf);
    cr_assert_not(test_file_exists(out_h5));
}

/* ---- the refusal table, one test per key ---- */

Test(engine_config, quantization_config_is_refused_whatever_the_method) {
    assert_record_refuses(
        checkpoint_with_key("qwen3_moe", "quantization_config",
                            "{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}"),
        "config.json: quantization_config: {\"quant_method\":\"fp8\",\"weight_block_size\":"
        "[128,128]} is not implemented by the engine (supported: absent or null: the engine reads "
        "unquantized bf16, fp16 or fp32 weights)");
    /* null is what the reference reads as no quantization */
    engine_destroy(load_ok(checkpoint_with_key("qwen3_moe", "quantization_config", "null")));
}

Test(engine_config, an_activation_other_than_silu_is_refused) {
    assert_record_refuses(checkpoint_with_key("mixtral", "hidden_act", "\"gelu\""),
                          "config.json: hidden_act: \"gelu\" is not implemented by the engine "
                          "(supported: \"silu\" or \"swish\")");
}

Test(engine_config, scaled_rope_in_rope_scaling_is_refused) {
    assert_record_refuses(
        checkpoint_with_key("olmoe", "rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0}"),
        "config.json: rope_scaling: {\"type\":\"yarn\",\"factor\":4.0} is not implemented by the "
        "engine (supported: null, {} or rope_type (or type) \"default\": scaled RoPE is not "
        "implemented)");
}

Test(engine_config, scaled_rope_in_rope_parameters_is_refused) {
    assert_record_refuses(
        checkpoint_with_key("qwen2_moe", "rope_parameters",
                            "{\"rope_type\": \"linear\", \"factor\": 2.0, \"rope_theta\": 1e6}"),
        "config.json: rope_parameters: {\"rope_type\":\"linear\",\"factor\":2.0,"
        "\"rope_theta\":1000000.0} is not implemented by the engine (supported: rope_type (or "
        "type) \"default\"");
}

Test(engine_config, an_olmoe_sliding_window_is_refused) {
    assert_record_refuses(checkpoint_with_key("olmoe", "sliding_window", "4"),
                          "config.json: sliding_window: 4 is not implemented by the engine "
                          "(supported: null: transformers applies it to OLMoE only under flash "
                          "attention");
}

Test(engine_config, a_long_refused_value_is_cut_short_in_the_message) {
    assert_record_refuses(
        checkpoint_with_key("qwen3_moe", "quantization_config",
                            "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                            "\"desc_act\": false, \"sym\": true}"),
        "quantization_config: {\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128,"
        "\"desc_act\":... is not implemented");
}

/* Every row of the loader's table is a row of engine/README.md's. */
Test(engine_config, the_readme_lists_every_refused_key) {
    char path[2048];
    snprintf(path, sizeof path, "%s/engine/README.md", MOESIM_SOURCE_DIR);
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "%s missing", path);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[n] = '\0';
    size_t n_rows;
    const cfg_refusal *rows = cfg_refusals(&n_rows);
    cr_assert_geq(n_rows, 5);
    for (size_t i = 0; i < n_rows; i++) {
        char want[256];
        snprintf(want, sizeof want, "| %s | `%s` | refused",
                 rows[i].model_type ? rows[i].model_type : "all", rows[i].key);
        cr_assert(strstr(text, want), "engine/README.md lacks the row '%s'", want);
    }
}

/* ---- keys the engine implements: bad values ---- */

Test(engine_config, a_window_of_zero_is_refused_because_the_reference_would_mask_everything) {
    assert_load_refused(checkpoint_with_key("mixtral", "sliding_window", "0"),
                        "config.json: sliding_window: expected null or an integer >= 1");
    key_edit qwen3[] = {{"use_sliding_window", "true"}, {"sliding_window", "0"}};
    assert_load_refused(checkpoint_with("qwen3_moe", qwen3, 2),
                        "config.json: sliding_window: expected null or an integer >= 1");
}

Test(engine_config, qwen2_moe_needs_a_window_when_use_sliding_window_is_true) {
    /* the reference raises on a null window: there is no "none" to fall back to */
    key_edit e[] = {{"use_sliding_window", "true"}, {"sliding_window", "null"}};
    assert_load_refused(checkpoint_with("qwen2_moe", e, 2),
                        "config.json: sliding_window: expected an integer >= 1");
}

Test(engine_config, qwen2_moe_layer_types_must_name_every_layer_full_or_sliding) {
    assert_load_refused(
        checkpoint_with_key("qwen2_moe_sliding_window", "layer_types",
                            "[\"full_attention\", \"full_attention\"]"),
        "config.json: layer_types: expected an array of 3 names (one per layer)");
    assert_load_refused(
        checkpoint_with_key("qwen2_moe_sliding_window", "layer_types",
                            "[\"full_attention\", \"chunked_attention\", \"full_attention\"]"),
        "config.json: layer_types[1]: expected \"full_attention\" or \"sliding_attention\"");
}

Test(engine_config, a_sliding_layer_without_use_sliding_window_is_refused) {
    assert_load_refused(
        checkpoint_with_key("qwen2_moe", "layer_types",
                            "[\"full_attention\", \"full_attention\", \"sliding_attention\"]"),
        "config.json: layer_types[2]: \"sliding_attention\" needs use_sliding_window true");
}

Test(engine_config, attention_bias_must_be_a_boolean) {
    assert_load_refused(checkpoint_with_key("olmoe", "attention_bias", "\"yes\""),
                        "config.json: attention_bias: expected true or false");
}

Test(engine_config, attention_bias_without_bias_tensors_names_the_missing_tensor) {
    assert_load_refused(checkpoint_with_key("qwen3_moe", "attention_bias", "true"),
                        "tensor 'model.layers.0.self_attn.q_proj.bias' missing");
    assert_load_refused(checkpoint_with_key("olmoe", "attention_bias", "true"),
                        "tensor 'model.layers.0.self_attn.q_proj.bias' missing");
}

/* ---- keys the engine implements: what they mean ---- */

static void assert_windows(const char *dir, const uint32_t *want) {
    engine *e = load_ok(dir);
    const engine_config *c = engine_config_of(e);
    for (uint32_t l = 0; l < c->n_layers; l++)
        cr_assert_eq(c->attn_window[l], want[l], "layer %u: window %u, expected %u", l,
                     c->attn_window[l], want[l]);
    engine_destroy(e);
}

Test(engine_config, qwen2_moe_derives_layer_types_from_max_window_layers_as_transformers_does) {
    /* sliding where (l + 1) % 2 and l < max_window_layers (Qwen2MoeConfig.__post_init__) */
    key_edit cut[] = {{"layer_types", NULL}, {"max_window_layers", "1"}};
    assert_windows(checkpoint_with("qwen2_moe_sliding_window", cut, 2), (uint32_t[]){4, 0, 0});
    key_edit all[] = {{"layer_types", NULL}, {"max_window_layers", "28"}};
    assert_windows(checkpoint_with("qwen2_moe_sliding_window", all, 2), (uint32_t[]){4, 0, 4});
    key_edit off[] = {{"layer_types", NULL}, {"use_sliding_window", "false"}};
    assert_windows(checkpoint_with("qwen2_moe_sliding_window", off, 2), (uint32_t[]){0, 0, 0});
    /* the window key is read only when use_sliding_window says so (saved configs hold 0) */
    assert_windows(checkpoint_with_key("qwen2_moe", "sliding_window", "0"), (uint32_t[]){0, 0, 0});
}

Test(engine_config, qwen2_moe_layer_types_given_win_over_max_window_layers) {
    key_edit e[] = {{"layer_types", "[\"full_attention\", \"sliding_attention\", "
                                    "\"sliding_attention\"]"},
                    {"max_window_layers", "1"}};
    assert_windows(checkpoint_with("qwen2_moe_sliding_window", e, 2), (uint32_t[]){0, 4, 4});
}

Test(engine_config, qwen3_moe_windows_every_layer_with_4096_when_the_window_is_absent) {
    key_edit absent_w[] = {{"use_sliding_window", "true"}, {"sliding_window", NULL}};
    assert_windows(checkpoint_with("qwen3_moe", absent_w, 2), (uint32_t[]){4096, 4096, 4096});
    key_edit null_w[] = {{"use_sliding_window", "true"}, {"sliding_window", "null"}};
    assert_windows(checkpoint_with("qwen3_moe", null_w, 2), (uint32_t[]){0, 0, 0});
    /* max_window_layers is not read by transformers' Qwen3-MoE */
    key_edit mwl[] = {{"max_window_layers", "1"}};
    assert_windows(checkpoint_with("qwen3_moe_sliding_window", mwl, 1), (uint32_t[]){4, 4, 4});
    assert_windows(checkpoint_with_key("qwen3_moe_sliding_window", "use_sliding_window", "false"),
                   (uint32_t[]){0, 0, 0});
}

Test(engine_config, biases_follow_the_config_not_the_tensors_present) {
    /* transformers ignores bias tensors its config does not ask for: so does the engine */
    engine *e = load_ok(checkpoint_with_key("qwen3_moe_attention_bias", "attention_bias", "false"));
    cr_assert_not(engine_config_of(e)->qkv_bias);
    cr_assert_not(engine_config_of(e)->o_bias);
    engine_destroy(e);
    e = load_ok(checkpoint_with_key("qwen2_moe", "qkv_bias", NULL));
    cr_assert(engine_config_of(e)->qkv_bias);
    cr_assert_not(engine_config_of(e)->o_bias);
    engine_destroy(e);
}

/* A key left out means the reference config class's default, not the engine's choice. */
Test(engine_config, keys_left_out_take_the_defaults_of_the_reference_config_class) {
    key_edit drop[] = {{"rope_parameters", NULL}, {"rms_norm_eps", NULL}};
    static const struct {
        const char *fixture;
        double theta;
        float eps;
    } want[] = {{"mixtral", 1e6, 1e-5f}, /* MixtralConfig: default_theta 1e6, rms_norm_eps 1e-5 */
                {"olmoe", 1e4, 1e-5f},   /* OlmoeConfig: rms_norm_eps 1e-5 */
                {"qwen2_moe", 1e4, 1e-6f},
                {"qwen3_moe", 1e4, 1e-6f}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        engine *e = load_ok(checkpoint_with(want[i].fixture, drop, 2));
        cr_assert_eq(engine_config_of(e)->rope_theta, want[i].theta, "%s: rope_theta %g",
                     want[i].fixture, engine_config_of(e)->rope_theta);
        cr_assert_eq(engine_config_of(e)->rms_eps, want[i].eps, "%s: rms_norm_eps %g",
                     want[i].fixture, engine_config_of(e)->rms_eps);
        engine_destroy(e);
    }
}

Test(engine_config, qwen2_moe_without_a_shared_expert_width_expects_the_reference_default) {
    /* Qwen2MoeConfig: shared_expert_intermediate_size 5632; the fixture's is 128 */
    assert_load_refused(
        checkpoint_with_key("qwen2_moe", "shared_expert_intermediate_size", NULL),
        "tensor 'model.layers.0.mlp.shared_expert.gate_proj.weight': shape [128, 64], expected "
        "[5632, 64]");
}

Test(engine_config, num_key_value_heads_left_out_is_the_reference_default_not_the_head_count) {
    /* MixtralConfig: 8 and Qwen2MoeConfig: 16 key-value heads, more than the fixtures' 4 heads */
    assert_load_refused(checkpoint_with_key("mixtral", "num_key_value_heads", NULL),
                        "config.json: num_key_value_heads: 8 outside [1, 4]");
    assert_load_refused(checkpoint_with_key("qwen2_moe", "num_key_value_heads", NULL),
                        "config.json: num_key_value_heads: 16 outside [1, 4]");
    /* OlmoeConfig: None, meaning num_attention_heads (4 of 16; the fixture has 2 KV heads) */
    assert_load_refused(checkpoint_with_key("olmoe", "num_key_value_heads", NULL),
                        "tensor 'model.layers.0.self_attn.k_proj.weight': shape [32, 64], "
                        "expected [64, 64]");
}

/* ---- config patterns whose meaning is transformers' reading, not their names ---- */

/* Every prompt of dir's golden.safetensors run on `e`: routing equal to transformers', logits
 * within test_engine_golden.c's tolerances (2e-5 + 1e-5 relative). */
static void assert_matches_golden(engine *e, const char *dir) {
    char gpath[2100];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", dir);
    moesim_error err = {0};
    st_file *g;
    cr_assert_eq(st_file_open(gpath, &g, &err), MOESIM_OK, "%s", err.msg);
    const engine_config *c = engine_config_of(e);
    uint32_t LK = c->n_moe_layers * c->top_k, V = c->vocab;
    float *logits = malloc(V * sizeof *logits), gates[64 * 8];
    uint16_t ids[64 * 8];
    engine_token_info info = {.expert_ids = ids, .gate_weights = gates};
    int p = 0;
    for (;; p++) {
        char name[64];
        snprintf(name, sizeof name, "prompt%d.ids", p);
        const st_tensor *idt = st_file_find(g, name);
        if (!idt) break;
        const float *tok = idt->data;
        snprintf(name, sizeof name, "prompt%d.logits", p);
        const float *want = st_file_find(g, name)->data;
        snprintf(name, sizeof name, "prompt%d.topk_ids", p);
        const float *want_ids = st_file_find(g, name)->data;
        engine_seq *s = engine_seq_create(e, (uint32_t)idt->n_elems);
        for (uint64_t t = 0; t < idt->n_elems; t++) {
            cr_assert_eq(engine_seq_forward(e, s, (int32_t)tok[t], NULL, logits, &info, &err),
                         MOESIM_OK, "%s", err.msg);
            for (uint32_t i = 0; i < LK; i++)
                cr_assert_eq(ids[i], (uint16_t)want_ids[t * LK + i], "prompt %d token %llu", p,
                             (unsigned long long)t);
            for (uint32_t v = 0; v < V; v++)
                cr_assert(fabsf(logits[v] - want[t * V + v]) <=
                              2e-5f + 1e-5f * fabsf(want[t * V + v]),
                          "prompt %d token %llu logit %u: %.7g vs transformers %.7g", p,
                          (unsigned long long)t, v, logits[v], want[t * V + v]);
        }
        engine_seq_destroy(s);
    }
    cr_assert_geq(p, 1, "%s holds no prompt", gpath);
    free(logits);
    st_file_close(g);
}

static void assert_loads_as_golden(const char *dir) {
    engine *e = load_ok(dir);
    assert_matches_golden(e, dir);
    engine_destroy(e);
}

Test(engine_config, a_stored_lm_head_is_used_even_under_tie_word_embeddings) {
    /* transformers does not tie when the checkpoint holds lm_head.weight: the fixture's head
     * differs from its embedding, and its golden logits are those of the stored head */
    const char *dir = checkpoint_with_key("mixtral", "tie_word_embeddings", "true");
    engine *e = load_ok(dir);
    cr_assert_not(engine_config_of(e)->tie_embeddings);
    cr_assert_neq(engine_weight(e, T_LM_HEAD, 0, 0, PREC_BF16)->data,
                  engine_weight(e, T_EMBED, 0, 0, PREC_BF16)->data);
    assert_matches_golden(e, dir);
    engine_destroy(e);
}

/* The fixture's checkpoint as an index whose weight_map lists every tensor but `drop`. */
static const char *checkpoint_without_tensor(const char *fixture, const char *drop,
                                             const key_edit *edits, size_t n_edits) {
    const char *dir = checkpoint_named("no_tensor", fixture, edits, n_edits);
    char path[2100];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    moesim_error err = {0};
    st_file *f;
    cr_assert_eq(st_file_open(path, &f, &err), MOESIM_OK, "%s", err.msg);
    json_t *map = json_object();
    for (size_t i = 0; i < st_file_count(f); i++)
        if (strcmp(st_file_tensor(f, i)->name, drop))
            json_object_set_new(map, st_file_tensor(f, i)->name, json_string("model.safetensors"));
    st_file_close(f);
    json_t *idx = json_pack("{s:o}", "weight_map", map);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    cr_assert_eq(json_dump_file(idx, path, 0), 0);
    json_decref(idx);
    return dir;
}

Test(engine_config, tie_word_embeddings_without_a_stored_head_runs_the_embedding_as_the_head) {
    key_edit tie[] = {{"tie_word_embeddings", "true"}};
    engine *e = load_ok(checkpoint_without_tensor("mixtral", "lm_head.weight", tie, 1));
    cr_assert(engine_config_of(e)->tie_embeddings);
    cr_assert_eq(engine_weight(e, T_LM_HEAD, 0, 0, PREC_BF16)->data,
                 engine_weight(e, T_EMBED, 0, 0, PREC_BF16)->data);
    engine_destroy(e);
    key_edit untied[] = {{"tie_word_embeddings", "false"}};
    assert_load_refused(checkpoint_without_tensor("mixtral", "lm_head.weight", untied, 1),
                        "tensor 'lm_head.weight' missing");
}

Test(engine_config, a_scaled_rope_named_under_the_legacy_key_type_is_refused) {
    assert_record_refuses(
        checkpoint_with_key("mixtral", "rope_parameters",
                            "{\"type\": \"linear\", \"factor\": 2.0, \"rope_theta\": 10000.0}"),
        "config.json: rope_parameters: {\"type\":\"linear\",\"factor\":2.0,\"rope_theta\":10000.0} "
        "is not implemented by the engine (supported: rope_type (or type) \"default\"");
    assert_record_refuses(
        checkpoint_with_key("olmoe", "rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}"),
        "config.json: rope_scaling: {\"type\":\"dynamic\",\"factor\":2.0} is not implemented");
    /* RoPE per layer type (a dict of dicts) is not one the engine runs either */
    assert_record_refuses(
        checkpoint_with_key("qwen2_moe", "rope_parameters",
                            "{\"full_attention\": {\"rope_type\": \"default\"}}"),
        "config.json: rope_parameters: {\"full_attention\":{\"rope_type\":\"default\"}} is not "
        "implemented");
    /* "default" under either key, and rope_type before type as standardize_rope_params reads
     * them, are unscaled: the golden outputs hold */
    assert_loads_as_golden(checkpoint_with_key("mixtral", "rope_parameters",
                                               "{\"type\": \"default\", \"rope_theta\": 1e6}"));
    assert_loads_as_golden(checkpoint_with_key(
        "mixtral", "rope_parameters",
        "{\"rope_type\": \"default\", \"type\": \"linear\", \"rope_theta\": 1e6}"));
}

static void assert_theta(const char *dir, double want) {
    engine *e = load_ok(dir);
    cr_assert_eq(engine_config_of(e)->rope_theta, want, "rope_theta %g, expected %g",
                 engine_config_of(e)->rope_theta, want);
    engine_destroy(e);
}

Test(engine_config, rope_scaling_beside_rope_parameters_replaces_it_as_in_transformers) {
    /* convert_rope_params_to_dict: rope_parameters = rope_scaling or rope_parameters; its
     * rope_theta, else the top-level rope_theta, else the class default (fixture: 1e6 in
     * rope_parameters) */
    key_edit own[] = {{"rope_scaling", "{\"rope_type\": \"default\", \"rope_theta\": 5e5}"}};
    assert_theta(checkpoint_with("qwen3_moe", own, 1), 5e5);
    key_edit top[] = {{"rope_scaling", "{\"type\": \"default\"}"}, {"rope_theta", "3e5"}};
    assert_theta(checkpoint_with("qwen3_moe", top, 2), 3e5);
    key_edit none[] = {{"rope_scaling", "{\"rope_type\": \"default\"}"}};
    assert_theta(checkpoint_with("qwen3_moe", none, 1), 1e4); /* Qwen3MoeConfig.default_theta */
    key_edit empty[] = {{"rope_scaling", "{}"}, {"rope_theta", "3e5"}};
    assert_theta(checkpoint_with("qwen3_moe", empty, 2), 1e6); /* {} is false: not read */
    /* rope_parameters is not read at all beside rope_scaling, so its scaling does not matter */
    key_edit unread[] = {{"rope_scaling", "{\"rope_type\": \"default\", \"rope_theta\": 1e6}"},
                         {"rope_parameters", "{\"rope_type\": \"linear\", \"factor\": 4.0}"}};
    assert_loads_as_golden(checkpoint_with("qwen3_moe", unread, 2));
}

/* Importance of position 0 at MoE layer 0 after `n` tokens of the golden prompt 0. */
static float importance_after(const char *dir, uint32_t n) {
    engine *e = load_ok(dir);
    engine_seq *s = engine_seq_create(e, n);
    moesim_error err = {0};
    for (uint32_t t = 0; t < n; t++)
        cr_assert_eq(engine_seq_forward(e, s, (int32_t)(t + 1), NULL, NULL, NULL, &err), MOESIM_OK,
                     "%s", err.msg);
    float imp = engine_seq_importance(s, 0, 0);
    engine_seq_destroy(s);
    engine_destroy(e);
    return imp;
}

Test(engine_config, olmoe_clip_qkv_zero_clamps_q_k_v_to_zero_as_transformers_does) {
    /* transformers clamps whenever clip_qkv is not None: at 0 every score is 0, so every query
     * spreads its attention evenly and position 0 receives 1/1 + 1/2 + ... + 1/n */
    uint32_t n = 6;
    float harmonic = 0;
    for (uint32_t t = 1; t <= n; t++) harmonic += 1.0f / (float)t;
    float clipped = importance_after(checkpoint_with_key("olmoe", "clip_qkv", "0.0"), n);
    cr_assert(fabsf(clipped - harmonic) < 1e-5f, "importance %.7g, expected %.7g", clipped,
              harmonic);
    float unclipped = importance_after(checkpoint_with_key("olmoe", "clip_qkv", "null"), n);
    cr_assert(fabsf(unclipped - harmonic) > 1e-3f, "unclipped importance %.7g", unclipped);
    assert_load_refused(checkpoint_with_key("olmoe", "clip_qkv", "-1"),
                        "config.json: clip_qkv: expected null or a number >= 0");
}

Test(engine_config, swish_is_silu_as_in_transformers_act2fn) {
    assert_loads_as_golden(checkpoint_with_key("mixtral", "hidden_act", "\"swish\""));
    assert_loads_as_golden(checkpoint_with_key("olmoe", "hidden_act", "\"silu\""));
}

Test(engine_config, num_experts_and_num_local_experts_are_one_key_as_in_transformers) {
    static const char *const fixtures[] = {"mixtral", "olmoe", "qwen2_moe", "qwen3_moe"};
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        key_edit local[] = {{"num_experts", NULL}, {"num_local_experts", "8"}};
        assert_loads_as_golden(checkpoint_with(fixtures[i], local, 2));
        key_edit plain[] = {{"num_local_experts", NULL}, {"num_experts", "8"}};
        assert_loads_as_golden(checkpoint_with(fixtures[i], plain, 2));
    }
    key_edit differ[] = {{"num_local_experts", "8"}, {"num_experts", "4"}};
    assert_load_refused(checkpoint_with("mixtral", differ, 2),
                        "config.json: num_experts 4 and num_local_experts 8: expected one value");
    key_edit neither[] = {{"num_local_experts", NULL}, {"num_experts", NULL}};
    assert_load_refused(checkpoint_with("mixtral", neither, 2),
                        "config.json: num_local_experts: missing");
}
