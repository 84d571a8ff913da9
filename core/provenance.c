/* The `inputs` and `moesim` objects of every --json; see provenance.h. */
#include "core/provenance.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/paths.h"
#include "common/version.h"
#include "core/settings.h"
#include "policies/policy.h"

json_t *provenance_moesim_json(void) {
    json_t *j = json_object();
    json_object_set_new(j, "version", json_string(moesim_version_release()));
    json_object_set_new(j, "git", json_string(moesim_version_describe()));
    return j;
}

/* FNV-1a 64 of a file's bytes as 16 hex digits, or JSON null. */
static json_t *file_hash_json(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return json_null();
    uint64_t h = MOESIM_FNV1A64_INIT;
    static _Thread_local unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, fp)) > 0) h = hash_fnv1a64(buf, n, h);
    bool ok = !ferror(fp);
    fclose(fp);
    if (!ok) return json_null();
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, h);
    return json_string(hex);
}

json_t *provenance_file_json(const char *path) {
    json_t *j = json_object();
    json_object_set_new(j, "path", json_string(path));
    json_object_set_new(j, "fnv1a64", file_hash_json(path));
    return j;
}

json_t *provenance_config_json(const char *kind, const char *name) {
    json_t *j = json_object();
    json_object_set_new(j, "name", json_string(name));
    char path[4096];
    if (moesim_config_path(kind, name, path, sizeof path, NULL) == MOESIM_OK) {
        json_object_set_new(j, "path", json_string(path));
        json_object_set_new(j, "fnv1a64", file_hash_json(path));
    } else {
        json_object_set_new(j, "path", json_null());
        json_object_set_new(j, "fnv1a64", json_null());
    }
    return j;
}

static void put_fields(json_t *out, config *settings, const config_field *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const char *v = config_get(settings, f[i].section, f[i].key);
        if (!v) v = f[i].def;
        char key[128];
        snprintf(key, sizeof key, "%s.%s", f[i].section, f[i].key);
        json_object_set_new(out, key, v ? json_string(v) : json_null());
    }
}

json_t *provenance_inputs_json(const trace *t, const char *trace_path, const char *model_name,
                               const char *hw_name, const char *policy_name, config *settings) {
    json_t *j = json_object();
    json_object_set_new(j, "trace", provenance_file_json(trace_path));
    if (model_name) {
        json_t *model = provenance_config_json("models", model_name);
        char *text =
            json_is_null(json_object_get(model, "path")) && t ? trace_stored_model_config(t) : NULL;
        if (text) { /* the geometry came from the config the trace stores */
            char hex[17];
            snprintf(hex, sizeof hex, "%016" PRIx64,
                     hash_fnv1a64(text, strlen(text), MOESIM_FNV1A64_INIT));
            json_object_set_new(model, "stored_in_trace", json_true());
            json_object_set_new(model, "fnv1a64", json_string(hex));
            free(text);
        }
        json_object_set_new(j, "model", model);
    }
    if (hw_name) json_object_set_new(j, "hw", provenance_config_json("hw", hw_name));
    if (policy_name) json_object_set_new(j, "policy", json_string(policy_name));
    json_t *s = json_object();
    size_t n;
    const config_field *f = sim_settings_fields(&n);
    put_fields(s, settings, f, n);
    const policy_methods *pm = policy_name ? policy_lookup(policy_name) : NULL;
    if (pm) put_fields(s, settings, pm->knobs, pm->n_knobs);
    uint64_t seed = 0; /* sim.seed as resolved (sim_run checked it) */
    const char *seed_text = json_string_value(json_object_get(s, "sim.seed"));
    json_object_set_new(j, "seed",
                        seed_text && config_parse_u64(seed_text, &seed)
                            ? json_integer((json_int_t)seed)
                            : json_null());
    json_object_set_new(j, "settings", s);
    return j;
}

json_t *provenance_attach(json_t *result, json_t *inputs) {
    json_object_set_new(result, "inputs", inputs);
    json_object_set_new(result, "moesim", provenance_moesim_json());
    return result;
}
