/* Binding an experiment's configurations to the content of their inputs (sweep.h, "Hash"): the
 * trace's recipe and bytes, the model's and hw profile's resolved settings. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/config.h"
#include "common/hash.h"
#include "common/paths.h"
#include "policies/policy.h"
#include "sim/sim.h"
#include "sweep/sweep.h"
#include "sweep/sweep_experiment_internal.h"

/* ---- binding the inputs' content ---------------------------------------------------------- */

#define SWEEP_INPUTS_TAG "moesim-sweep-inputs-1"

/* One distinct input (a trace path, a model or hw name) and the hash of its content. */
typedef struct input_id {
    char *name;
    uint64_t id;
} input_id;

typedef struct input_cache {
    input_id *items; /* [n] */
    size_t n;
} input_cache;

static const uint64_t *input_cache_find(const input_cache *c, const char *name) {
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->items[i].name, name)) return &c->items[i].id;
    return NULL;
}

static uint64_t input_cache_add(input_cache *c, const char *name, uint64_t id) {
    c->items = moesim_xrealloc(c->items, (c->n + 1) * sizeof *c->items);
    c->items[c->n++] = (input_id){moesim_xstrdup(name), id};
    return id;
}

static void input_cache_free(input_cache *c) {
    for (size_t i = 0; i < c->n; i++) free(c->items[i].name);
    free(c->items);
}

/* FNV-1a of a file's bytes; false (errno set) when it cannot be read. An absent file is not an
 * error of binding: its configurations get another hash and the evaluator reports it. */
static bool file_content_hash(const char *path, uint64_t *out) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    uint64_t h = hash_fnv1a64("file", 4, MOESIM_FNV1A64_INIT);
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, fp)) > 0) h = hash_fnv1a64(buf, n, h);
    bool ok = !ferror(fp);
    fclose(fp);
    *out = h;
    return ok;
}

typedef struct config_kv {
    const char *section, *key, *value;
} config_kv;

static int cmp_config_kv(const void *a, const void *b) {
    const config_kv *x = a, *y = b;
    int c = strcmp(x->section, y->section);
    return c ? c : strcmp(x->key, y->key);
}

/* Hash of the settings (section, key, value) a model or hw file resolves to, in name order:
 * comments, layout and entry order do not count; the file's name and folder do not either. */
static moesim_status config_values_hash(const char *kind, const char *name, uint64_t *out,
                                        moesim_error *err) {
    char path[4096];
    moesim_status st = moesim_config_path(kind, name, path, sizeof path, err);
    if (st) return st;
    config *c = config_create();
    st = config_load_file(c, path, err);
    if (st) {
        config_destroy(c);
        return st;
    }
    size_t n = config_size(c);
    config_kv *kv = moesim_xcalloc(n + 1, sizeof *kv);
    for (size_t i = 0; i < n; i++) config_entry_at(c, i, &kv[i].section, &kv[i].key, &kv[i].value);
    qsort(kv, n, sizeof *kv, cmp_config_kv);
    uint64_t h = hash_fnv1a64_str(kind, MOESIM_FNV1A64_INIT);
    for (size_t i = 0; i < n; i++) {
        h = hash_fnv1a64(kv[i].section, strlen(kv[i].section) + 1, h);
        h = hash_fnv1a64(kv[i].key, strlen(kv[i].key) + 1, h);
        h = hash_fnv1a64(kv[i].value, strlen(kv[i].value) + 1, h);
    }
    free(kv);
    config_destroy(c);
    *out = h;
    return MOESIM_OK;
}

static const char *recipe_of(const sweep_experiment *e, const char *trace_path) {
    for (size_t i = 0; i < e->n_traces; i++)
        if (!strcmp(e->trace_paths[i], trace_path)) return e->trace_args[i];
    return NULL;
}

void sweep_experiment_input_path(const sweep_experiment *e, const char *key, const char *value,
                                 char *out, size_t out_len) {
    size_t n = strlen(value);
    bool relative = value[0] != '/', file_relative = false;
    if (!strcmp(key, "trace"))
        file_relative = relative && !recipe_of(e, value); /* a made trace is an output */
    else if (!strcmp(key, "model") || !strcmp(key, "hw"))
        file_relative =
            relative && (strchr(value, '/') || (n > 4 && !strcmp(value + n - 4, ".ini")));
    if (file_relative)
        moesim_path_join(e->inputs_dir, value, out, out_len);
    else
        snprintf(out, out_len, "%s", value);
}

static uint64_t fold_u64(uint64_t h, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i)); /* little-endian */
    return hash_fnv1a64(b, sizeof b, h);
}

/* The code version a configuration's figures come from (sweep.h, "Hash"). */
static void code_version(const sweep_experiment *e, const sweep_point *p, char *out, size_t len) {
    if (strcmp(e->evaluator, "sim")) {
        snprintf(out, len, "stats%d", SWEEP_STATS_CODE_VERSION);
        return;
    }
    const char *name = sweep_point_get(e, p, "policy");
    const policy_methods *pm = name ? policy_lookup(name) : NULL;
    snprintf(out, len, "sim%d-%s%" PRIu32, SIM_CODE_VERSION, pm ? pm->name : "none",
             pm ? pm->version : 0);
}

uint64_t sweep_point_hash_with_code(const sweep_point *p, const char *code) {
    return fold_u64(p->inputs_hash, hash_fnv1a64_str(code, MOESIM_FNV1A64_INIT));
}

moesim_status sweep_experiment_bind_inputs(sweep_experiment *e, moesim_error *err) {
    if (!e->base_hash) {
        e->base_hash = moesim_xcalloc(e->n_points + 1, sizeof *e->base_hash);
        for (size_t i = 0; i < e->n_points; i++) e->base_hash[i] = e->points[i].hash;
    }
    bool is_sim = !strcmp(e->evaluator, "sim");
    input_cache traces = {0}, models = {0}, hws = {0}, libs = {0};
    moesim_status st = MOESIM_OK;
    for (size_t i = 0; i < e->n_points && !st; i++) {
        sweep_point *p = &e->points[i];
        uint64_t h = hash_fnv1a64(SWEEP_INPUTS_TAG, sizeof SWEEP_INPUTS_TAG, MOESIM_FNV1A64_INIT);
        h = fold_u64(h, e->base_hash[i]);
        const char *path = sweep_point_get(e, p, "trace");
        if (path) {
            const uint64_t *id = input_cache_find(&traces, path);
            uint64_t v;
            if (!id) {
                const char *recipe = recipe_of(e, path);
                v = hash_fnv1a64_str(recipe ? recipe : "", MOESIM_FNV1A64_INIT);
                uint64_t content;
                char file[PATH_MAX];
                sweep_experiment_input_path(e, "trace", path, file, sizeof file);
                v = fold_u64(v, file_content_hash(file, &content) ? content : 0);
                input_cache_add(&traces, path, v);
            } else {
                v = *id;
            }
            h = fold_u64(h, v);
        }
        const char *lib = sweep_point_get(e, p, "policy_lib");
        if (lib) { /* a rebuilt plug-in gives new hashes: its rows run again */
            const uint64_t *id = input_cache_find(&libs, lib);
            uint64_t v = 0;
            if (!id) {
                uint64_t content;
                v = fold_u64(hash_fnv1a64_str("policy_lib", MOESIM_FNV1A64_INIT),
                             file_content_hash(lib, &content) ? content : 0);
                input_cache_add(&libs, lib, v);
            } else {
                v = *id;
            }
            h = fold_u64(h, v);
        }
        static const char *const keys[] = {"model", "hw"};
        static const char *const kinds[] = {"models", "hw"};
        input_cache *caches[] = {&models, &hws};
        for (size_t k = 0; k < 2 && is_sim && !st; k++) {
            const char *name = sweep_point_get(e, p, keys[k]);
            if (!name) continue;
            const uint64_t *id = input_cache_find(caches[k], name);
            uint64_t v = 0;
            if (!id) {
                char file[PATH_MAX];
                sweep_experiment_input_path(e, keys[k], name, file, sizeof file);
                st = config_values_hash(kinds[k], file, &v, err);
                if (st && err) {
                    int col = sweep_experiment_column_index(e, keys[k]);
                    char msg[MOESIM_ERROR_MAX];
                    snprintf(msg, sizeof msg, "%s", err->msg);
                    st = moesim_fail(err, st, "%s: %s = %s: %s", p->origins[col], keys[k], name,
                                     msg);
                }
                if (st) break;
                input_cache_add(caches[k], name, v);
            } else {
                v = *id;
            }
            h = fold_u64(h, v);
        }
        p->inputs_hash = h;
        code_version(e, p, p->code, sizeof p->code);
        p->hash = sweep_point_hash_with_code(p, p->code);
    }
    input_cache_free(&traces);
    input_cache_free(&models);
    input_cache_free(&hws);
    input_cache_free(&libs);
    if (st) return st;
    sweep_experiment_index(e);
    return MOESIM_OK;
}
