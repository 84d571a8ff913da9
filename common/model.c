/* Model geometry files (configs/models/<name>.ini): loading, cross-field validation, and the sizes
 * derived from geometry (expert bytes at a precision, resident non-expert bytes, KV cache and
 * recurrent state per token or request).
 *
 * Units: sizes in parameters or bytes (names say which); resident tensors are bf16 (2 bytes).
 * Invariants after a successful load: 1 <= n_moe_layers <= n_layers <= MODEL_MAX_LAYERS,
 * 1 <= top_k <= n_experts <= MODEL_MAX_EXPERTS, n_kv_heads divides n_heads, shared_inter > 0
 * exactly when n_shared_experts > 0, dense_inter > 0 exactly when some layer is dense, and the
 * MLA / linear-attention fields are nonzero only for their attention kind. */
#include "common/model.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "common/paths.h"

#define BF16_BYTES 2u

/* What the file holds, before the moe_layers string is expanded and enums are narrowed. */
typedef struct model_file {
    char name[64], hf_id[128], family[32];
    uint32_t n_layers, hidden, dense_inter, vocab;
    char moe_layers[256];
    bool tie_embeddings;
    uint32_t n_experts, top_k, expert_inter, n_shared, shared_inter;
    int gate_norm;
    bool shared_gate;
    int kind;
    uint32_t heads, kv_heads, head_dim;
    bool qk_norm;
    double rope_theta;
    uint32_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    uint32_t full_attention_interval, linear_key_heads, linear_value_heads, linear_key_head_dim,
        linear_value_head_dim, linear_conv_kernel;
} model_file;

static const char *const gate_norm_names[] = {"topk", "all", NULL}; /* gate_normalization */
static const char *const kind_names[] = {"gqa", "mla", "hybrid_linear", NULL}; /* attention_kind */

/* clang-format off */
#define F(sec, key, type, member, req, lo, hi, help)                                              \
    {sec, key, type, offsetof(model_file, member), sizeof(((model_file *)0)->member), req, lo, hi, \
     NULL, NULL, help}
#define FE(sec, key, member, choices, help)                                                       \
    {sec, key, CONFIG_ENUM, offsetof(model_file, member), 0, true, 1, 0, choices, NULL, help}
/* clang-format on */
/* upper bound for widths and counts: far above any real model, and inside uint32 */
#define BIG 1e9

static const config_field model_fields[] = {
    F("model", "name", CONFIG_STR, name, true, 1, 0, "config name, e.g. mixtral-8x7b"),
    F("model", "hf_id", CONFIG_STR, hf_id, true, 1, 0, "Hugging Face repository id"),
    F("model", "family", CONFIG_STR, family, true, 1, 0, "config.json model_type"),
    F("layers", "n_layers", CONFIG_U32, n_layers, true, 1, MODEL_MAX_LAYERS, "decoder layers"),
    F("layers", "moe_layers", CONFIG_STR, moe_layers, true, 1, 0,
      "MoE layers: all, or ranges like 1-26 or 0-3,8"),
    F("layers", "hidden", CONFIG_U32, hidden, true, 1, BIG, "hidden size"),
    F("layers", "dense_inter", CONFIG_U32, dense_inter, true, 0, BIG,
      "FFN width of dense layers (0 when every layer is MoE)"),
    F("layers", "vocab", CONFIG_U32, vocab, true, 1, BIG, "vocabulary size"),
    F("layers", "tie_embeddings", CONFIG_BOOL, tie_embeddings, true, 1, 0,
      "LM head shares the embedding matrix"),
    F("experts", "n_experts", CONFIG_U32, n_experts, true, 1, MODEL_MAX_EXPERTS,
      "routed experts per MoE layer"),
    F("experts", "top_k", CONFIG_U32, top_k, true, 1, MODEL_MAX_EXPERTS, "experts per token"),
    F("experts", "expert_inter", CONFIG_U32, expert_inter, true, 1, BIG, "routed expert width"),
    FE("experts", "gate_norm", gate_norm, gate_norm_names,
       "topk: weights renormalized over the chosen experts; all: softmax over all experts"),
    F("experts", "n_shared", CONFIG_U32, n_shared, true, 0, MODEL_MAX_SHARED_EXPERTS,
      "always-on shared experts"),
    F("experts", "shared_inter", CONFIG_U32, shared_inter, true, 0, BIG,
      "width of each shared expert (0 without shared experts)"),
    F("experts", "shared_gate", CONFIG_BOOL, shared_gate, true, 1, 0,
      "sigmoid gate on the shared expert output"),
    FE("attention", "kind", kind, kind_names, "gqa, mla or hybrid_linear"),
    F("attention", "heads", CONFIG_U32, heads, true, 1, 4096, "query heads"),
    F("attention", "kv_heads", CONFIG_U32, kv_heads, true, 1, 4096, "key/value heads"),
    F("attention", "head_dim", CONFIG_U32, head_dim, true, 1, 4096, "per-head dimension"),
    F("attention", "qk_norm", CONFIG_BOOL, qk_norm, true, 1, 0, "RMSNorm on queries and keys"),
    F("attention", "rope_theta", CONFIG_F64, rope_theta, true, 1, 1e12, "RoPE base"),
    F("attention", "q_lora_rank", CONFIG_U32, q_lora_rank, false, 0, BIG, "MLA: 0 = none"),
    F("attention", "kv_lora_rank", CONFIG_U32, kv_lora_rank, false, 1, BIG, "MLA latent rank"),
    F("attention", "qk_nope_head_dim", CONFIG_U32, qk_nope_head_dim, false, 1, 4096, "MLA"),
    F("attention", "qk_rope_head_dim", CONFIG_U32, qk_rope_head_dim, false, 1, 4096, "MLA"),
    F("attention", "v_head_dim", CONFIG_U32, v_head_dim, false, 1, 4096, "MLA"),
    F("attention", "full_attention_interval", CONFIG_U32, full_attention_interval, false, 1,
      MODEL_MAX_LAYERS, "hybrid: every n-th layer is full attention"),
    F("attention", "linear_key_heads", CONFIG_U32, linear_key_heads, false, 1, 4096, "hybrid"),
    F("attention", "linear_value_heads", CONFIG_U32, linear_value_heads, false, 1, 4096, "hybrid"),
    F("attention", "linear_key_head_dim", CONFIG_U32, linear_key_head_dim, false, 1, 4096,
      "hybrid"),
    F("attention", "linear_value_head_dim", CONFIG_U32, linear_value_head_dim, false, 1, 4096,
      "hybrid"),
    F("attention", "linear_conv_kernel", CONFIG_U32, linear_conv_kernel, false, 1, 64,
      "hybrid: causal conv1d width"),
};

static const char *const mla_keys[] = {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                       "qk_rope_head_dim", "v_head_dim"};
static const char *const hybrid_keys[] = {"full_attention_interval", "linear_key_heads",
                                          "linear_value_heads",      "linear_key_head_dim",
                                          "linear_value_head_dim",   "linear_conv_kernel"};

/* One-line error "origin: [section] key: message" for a cross-field check. */
static moesim_status key_error(config *c, moesim_error *err, const char *section, const char *key,
                               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static moesim_status key_error(config *c, moesim_error *err, const char *section, const char *key,
                               const char *fmt, ...) {
    char where[600], what[400];
    config_origin(c, section, key, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return moesim_fail(err, MOESIM_EINPUT, "%s: [%s] %s: %s", where, section, key, what);
}

/* A layer index at *p (digits alone: no sign, no space) into *v, *p moved past it; false when
 * there is none. One past the largest layer count stands for a value too large to hold. */
static bool parse_layer_index(const char **p, unsigned long *v) {
    if (**p < '0' || **p > '9') return false;
    char *end;
    errno = 0;
    *v = strtoul(*p, &end, 10);
    if (errno == ERANGE || *v > MODEL_MAX_LAYERS) *v = MODEL_MAX_LAYERS + 1ul;
    *p = end;
    return true;
}

/* "all" or comma-separated "a" / "a-b" items, 0-based and inside [0, n_layers). */
static moesim_status parse_moe_layers(config *c, const char *spec, uint32_t n_layers, bool *is_moe,
                                      moesim_error *err) {
    memset(is_moe, 0, MODEL_MAX_LAYERS * sizeof *is_moe);
    if (!strcmp(spec, "all")) {
        for (uint32_t l = 0; l < n_layers; l++) is_moe[l] = true;
        return MOESIM_OK;
    }
    const char *p = spec;
    for (;;) {
        while (*p == ' ') p++;
        const char *item = p;
        unsigned long lo = 0, hi;
        bool ok = parse_layer_index(&p, &lo);
        hi = lo;
        if (ok && *p == '-') {
            p++;
            ok = parse_layer_index(&p, &hi);
        }
        if (!ok)
            return key_error(c, err, "layers", "moe_layers",
                             "expected 'all' or layer ranges like '1-26' or '0-3,8', got '%s'",
                             spec);
        if (lo > hi || hi >= n_layers)
            return key_error(c, err, "layers", "moe_layers",
                             "range %.*s is not inside layers 0-%u (n_layers = %u)",
                             (int)(p - item), item, n_layers - 1, n_layers);
        for (unsigned long l = lo; l <= hi; l++) {
            if (is_moe[l])
                return key_error(c, err, "layers", "moe_layers", "layer %lu listed twice", l);
            is_moe[l] = true;
        }
        while (*p == ' ') p++;
        if (!*p) return MOESIM_OK;
        if (*p != ',')
            return key_error(c, err, "layers", "moe_layers",
                             "expected 'all' or layer ranges like '1-26' or '0-3,8', got '%s'",
                             spec);
        p++;
    }
}

/* Keys of an attention kind must be present exactly when that kind is chosen. */
static moesim_status check_kind_keys(config *c, const char *const *keys, size_t n, bool wanted,
                                     const char *kind, moesim_error *err) {
    for (size_t i = 0; i < n; i++) {
        bool present = config_get(c, "attention", keys[i]) != NULL;
        if (wanted && !present)
            return key_error(c, err, "attention", keys[i], "missing required key (kind = %s)",
                             kind);
        if (!wanted && present)
            return key_error(c, err, "attention", keys[i],
                             "only allowed with kind = %s (the file's kind differs)", kind);
    }
    return MOESIM_OK;
}

static moesim_status cross_check(config *c, const model_file *f, moesim_error *err) {
    size_t bad = moesim_config_name_fault(f->name); /* traces store it to find this file */
    if (bad)
        return key_error(c, err, "model", "name",
                         "character %zu cannot be in a config name (expected printable ASCII "
                         "without spaces or '/')",
                         bad);
    if (f->top_k > f->n_experts)
        return key_error(c, err, "experts", "top_k", "expected at most n_experts (%u), got %u",
                         f->n_experts, f->top_k);
    if ((f->n_shared > 0) != (f->shared_inter > 0))
        return key_error(c, err, "experts", "shared_inter",
                         "expected > 0 exactly when n_shared > 0 (n_shared = %u, got %u)",
                         f->n_shared, f->shared_inter);
    if (f->shared_gate && !f->n_shared)
        return key_error(c, err, "experts", "shared_gate",
                         "a shared-expert gate needs n_shared > 0");
    if (f->heads % f->kv_heads)
        return key_error(c, err, "attention", "kv_heads",
                         "expected a divisor of heads (%u), got %u", f->heads, f->kv_heads);
    moesim_status st;
    if ((st = check_kind_keys(c, mla_keys, MOESIM_ARRAY_LEN(mla_keys), f->kind == ATTENTION_MLA,
                              "mla", err)))
        return st;
    if ((st = check_kind_keys(c, hybrid_keys, MOESIM_ARRAY_LEN(hybrid_keys),
                              f->kind == ATTENTION_HYBRID_LINEAR, "hybrid_linear", err)))
        return st;
    if (f->kind == ATTENTION_MLA && f->head_dim != f->qk_nope_head_dim + f->qk_rope_head_dim)
        return key_error(c, err, "attention", "head_dim",
                         "expected qk_nope_head_dim + qk_rope_head_dim = %u for mla, got %u",
                         f->qk_nope_head_dim + f->qk_rope_head_dim, f->head_dim);
    if (f->kind == ATTENTION_HYBRID_LINEAR) {
        if (f->full_attention_interval > f->n_layers)
            return key_error(c, err, "attention", "full_attention_interval",
                             "expected at most n_layers (%u), got %u", f->n_layers,
                             f->full_attention_interval);
        if (f->linear_value_heads % f->linear_key_heads)
            return key_error(c, err, "attention", "linear_value_heads",
                             "expected a multiple of linear_key_heads (%u), got %u",
                             f->linear_key_heads, f->linear_value_heads);
    }
    return MOESIM_OK;
}

moesim_status model_read_config(config *c, model_geometry *out, moesim_error *err) {
    model_file f;
    memset(&f, 0, sizeof f);
    moesim_status st = config_read_fields(c, model_fields, MOESIM_ARRAY_LEN(model_fields), &f, err);
    if (st) return st;
    if ((st = cross_check(c, &f, err))) return st;

    model_geometry m;
    memset(&m, 0, sizeof m);
    if ((st = parse_moe_layers(c, f.moe_layers, f.n_layers, m.is_moe_layer, err))) return st;
    for (uint32_t l = 0; l < f.n_layers; l++) m.n_moe_layers += m.is_moe_layer[l];
    bool has_dense = m.n_moe_layers < f.n_layers;
    if (has_dense != (f.dense_inter > 0))
        return key_error(c, err, "layers", "dense_inter",
                         "expected > 0 exactly when some layer is dense (%u of %u layers are MoE), "
                         "got %u",
                         m.n_moe_layers, f.n_layers, f.dense_inter);

    memcpy(m.name, f.name, sizeof m.name);
    memcpy(m.hf_id, f.hf_id, sizeof m.hf_id);
    memcpy(m.family, f.family, sizeof m.family);
    m.n_layers = f.n_layers;
    m.hidden = f.hidden;
    m.dense_inter = f.dense_inter;
    m.vocab = f.vocab;
    m.tie_embeddings = f.tie_embeddings;
    m.n_experts = f.n_experts;
    m.top_k = f.top_k;
    m.expert_inter = f.expert_inter;
    m.gate_norm = f.gate_norm == 0 ? GATE_SOFTMAX_TOPK : GATE_SOFTMAX_ALL;
    m.n_shared_experts = f.n_shared;
    m.shared_inter = f.shared_inter;
    m.shared_expert_gate = f.shared_gate;
    m.attention = (attention_kind)f.kind;
    m.n_heads = f.heads;
    m.n_kv_heads = f.kv_heads;
    m.head_dim = f.head_dim;
    m.qk_norm = f.qk_norm;
    m.rope_theta = f.rope_theta;
    m.q_lora_rank = f.q_lora_rank;
    m.kv_lora_rank = f.kv_lora_rank;
    m.qk_nope_head_dim = f.qk_nope_head_dim;
    m.qk_rope_head_dim = f.qk_rope_head_dim;
    m.v_head_dim = f.v_head_dim;
    m.full_attention_interval = f.full_attention_interval;
    m.linear_key_heads = f.linear_key_heads;
    m.linear_value_heads = f.linear_value_heads;
    m.linear_key_head_dim = f.linear_key_head_dim;
    m.linear_value_head_dim = f.linear_value_head_dim;
    m.linear_conv_kernel = f.linear_conv_kernel;
    *out = m;
    return MOESIM_OK;
}

moesim_status model_load_with_sets(const char *path, const char *const *sets, size_t n_sets,
                                   model_geometry *out, moesim_error *err) {
    config *c = config_create();
    moesim_status st = config_load_file(c, path, err);
    for (size_t i = 0; !st && i < n_sets; i++) st = config_set(c, sets[i], err);
    if (!st) st = model_read_config(c, out, err);
    if (!st) st = config_check_unused(c, err);
    config_destroy(c);
    return st;
}

moesim_status model_load_text(const char *origin, const char *text, model_geometry *out,
                              moesim_error *err) {
    config *c = config_create();
    moesim_status st = config_load_text(c, origin, text, err);
    if (!st) st = model_read_config(c, out, err);
    if (!st) st = config_check_unused(c, err);
    config_destroy(c);
    return st;
}

moesim_status model_load(const char *path, model_geometry *out, moesim_error *err) {
    return model_load_with_sets(path, NULL, 0, out, err);
}

moesim_status model_load_by_name(const char *name, model_geometry *out, moesim_error *err) {
    char path[4096];
    moesim_status st = moesim_config_path("models", name, path, sizeof path, err);
    if (st) return st;
    return model_load(path, out, err);
}

/* ---- writing ---------------------------------------------------------------------------- */

/* "all", or the MoE layers as comma-separated ranges ("1-26", "0-3,8"). */
static void format_moe_layers(const model_geometry *m, char *out, size_t len) {
    if (m->n_moe_layers == m->n_layers) {
        snprintf(out, len, "all");
        return;
    }
    size_t used = 0;
    out[0] = '\0';
    for (uint32_t l = 0; l < m->n_layers; l++) {
        if (!m->is_moe_layer[l] || (l > 0 && m->is_moe_layer[l - 1])) continue;
        uint32_t hi = l;
        while (hi + 1 < m->n_layers && m->is_moe_layer[hi + 1]) hi++;
        int n = hi > l ? snprintf(out + used, len - used, "%s%u-%u", used ? "," : "", l, hi)
                       : snprintf(out + used, len - used, "%s%u", used ? "," : "", l);
        MOESIM_ASSERT(n > 0 && used + (size_t)n < len);
        used += (size_t)n;
    }
}

moesim_status model_write_ini(const model_geometry *m, const char *path, const char *origin,
                              moesim_error *err) {
    atomic_file af;
    moesim_status st = atomic_file_open(&af, path, err);
    if (st) return st;
    char moe_layers[4 * MODEL_MAX_LAYERS + 8];
    format_moe_layers(m, moe_layers, sizeof moe_layers);
    FILE *f = af.fp;
    fprintf(f, "; %s: geometry written by moesim from %s\n", m->name, origin);
    fprintf(f, "; Layout and key meanings: configs/models/README.md.\n\n");
    fprintf(f, "[model]\nname = %s\nhf_id = %s\nfamily = %s\n\n", m->name,
            m->hf_id[0] ? m->hf_id : "none", m->family);
    fprintf(f, "[layers]\nn_layers = %u\nmoe_layers = %s\nhidden = %u\ndense_inter = %u\n",
            m->n_layers, moe_layers, m->hidden, m->dense_inter);
    fprintf(f, "vocab = %u\ntie_embeddings = %s\n\n", m->vocab,
            m->tie_embeddings ? "true" : "false");
    fprintf(f, "[experts]\nn_experts = %u\ntop_k = %u\nexpert_inter = %u\ngate_norm = %s\n",
            m->n_experts, m->top_k, m->expert_inter, gate_norm_names[m->gate_norm]);
    fprintf(f, "n_shared = %u\nshared_inter = %u\nshared_gate = %s\n\n", m->n_shared_experts,
            m->shared_inter, m->shared_expert_gate ? "true" : "false");
    fprintf(f, "[attention]\nkind = %s\nheads = %u\nkv_heads = %u\nhead_dim = %u\n",
            kind_names[m->attention], m->n_heads, m->n_kv_heads, m->head_dim);
    fprintf(f, "qk_norm = %s\nrope_theta = %.17g\n", m->qk_norm ? "true" : "false",
            m->rope_theta);
    if (m->attention == ATTENTION_MLA)
        fprintf(f,
                "q_lora_rank = %u\nkv_lora_rank = %u\nqk_nope_head_dim = %u\n"
                "qk_rope_head_dim = %u\nv_head_dim = %u\n",
                m->q_lora_rank, m->kv_lora_rank, m->qk_nope_head_dim, m->qk_rope_head_dim,
                m->v_head_dim);
    if (m->attention == ATTENTION_HYBRID_LINEAR)
        fprintf(f,
                "full_attention_interval = %u\nlinear_key_heads = %u\nlinear_value_heads = %u\n"
                "linear_key_head_dim = %u\nlinear_value_head_dim = %u\nlinear_conv_kernel = %u\n",
                m->full_attention_interval, m->linear_key_heads, m->linear_value_heads,
                m->linear_key_head_dim, m->linear_value_head_dim, m->linear_conv_kernel);
    return atomic_file_commit(&af, err);
}

/* ---- sizes ------------------------------------------------------------------------------ */

uint64_t model_expert_params(const model_geometry *m) { return 3ull * m->hidden * m->expert_inter; }

/* gate and up map hidden -> inter (rows = inter outputs, cols = hidden inputs); down maps
 * inter -> hidden. Quantization groups run along the input dimension (cols). */
uint64_t model_expert_part_bytes(const model_geometry *m, const quant_table *q, expert_part part,
                                 moesim_precision p) {
    MOESIM_ASSERT(part >= 0 && part < PART_COUNT);
    if (part == PART_DOWN) return quant_matrix_bytes(q, p, m->hidden, m->expert_inter);
    return quant_matrix_bytes(q, p, m->expert_inter, m->hidden);
}

uint64_t model_expert_bytes(const model_geometry *m, const quant_table *q, moesim_precision p) {
    uint64_t total = 0;
    for (int part = 0; part < PART_COUNT; part++)
        total += model_expert_part_bytes(m, q, (expert_part)part, p);
    return total;
}

/* Hybrid models: layer l is full attention when (l + 1) % interval == 0 (Qwen3-Next's
 * layer_types: three gated-DeltaNet layers, then one gated full-attention layer). */
static bool is_full_attention_layer(const model_geometry *m, uint32_t l) {
    if (m->attention != ATTENTION_HYBRID_LINEAR) return true;
    return (l + 1) % m->full_attention_interval == 0;
}

static uint64_t n_full_attention_layers(const model_geometry *m) {
    uint64_t n = 0;
    for (uint32_t l = 0; l < m->n_layers; l++) n += is_full_attention_layer(m, l);
    return n;
}

/* Gated-DeltaNet sizes (Qwen3-Next): key_dim = key heads * key head dim, value_dim alike;
 * the depthwise causal conv runs over q, k and v channels. */
static uint64_t linear_key_dim(const model_geometry *m) {
    return (uint64_t)m->linear_key_heads * m->linear_key_head_dim;
}
static uint64_t linear_value_dim(const model_geometry *m) {
    return (uint64_t)m->linear_value_heads * m->linear_value_head_dim;
}
static uint64_t linear_conv_dim(const model_geometry *m) {
    return 2 * linear_key_dim(m) + linear_value_dim(m);
}

/* Parameters of one full-attention layer's attention block (projections and per-head norms).
 * Biases (Qwen1.5-MoE's q/k/v bias, Phi-3.5-MoE's) are left out: under 0.01 % of the block. */
static uint64_t full_attention_params(const model_geometry *m) {
    uint64_t h = m->hidden;
    if (m->attention == ATTENTION_MLA) {
        uint64_t qk_dim = (uint64_t)m->qk_nope_head_dim + m->qk_rope_head_dim;
        uint64_t q = m->q_lora_rank
                         ? h * m->q_lora_rank + m->q_lora_rank /* q_a_proj + q_a_layernorm */
                               + (uint64_t)m->q_lora_rank * m->n_heads * qk_dim /* q_b_proj */
                         : h * m->n_heads * qk_dim;                             /* q_proj */
        uint64_t kv = h * ((uint64_t)m->kv_lora_rank + m->qk_rope_head_dim) /* kv_a_proj_with_mqa */
                      + m->kv_lora_rank                                     /* kv_a_layernorm */
                      + (uint64_t)m->kv_lora_rank * m->n_heads *
                            ((uint64_t)m->qk_nope_head_dim + m->v_head_dim); /* kv_b_proj */
        uint64_t o = (uint64_t)m->n_heads * m->v_head_dim * h;
        return q + kv + o;
    }
    uint64_t q_dim = (uint64_t)m->n_heads * m->head_dim;
    uint64_t kv_dim = (uint64_t)m->n_kv_heads * m->head_dim;
    /* Qwen3-Next's full-attention layers gate their output: q_proj also produces the gate */
    uint64_t q_out = m->attention == ATTENTION_HYBRID_LINEAR ? 2 * q_dim : q_dim;
    uint64_t params = h * q_out + 2 * h * kv_dim + q_dim * h;
    /* QK-norm: Qwen3 normalizes each head (weight of head_dim), OLMoE the whole q and k
     * projections (q_dim + kv_dim); we count the larger, a few thousand parameters at most */
    if (m->qk_norm) params += q_dim + kv_dim;
    return params;
}

/* Parameters of one gated-DeltaNet layer (Qwen3-Next's linear attention). */
static uint64_t linear_attention_params(const model_geometry *m) {
    uint64_t h = m->hidden, kd = linear_key_dim(m), vd = linear_value_dim(m);
    uint64_t in_qkvz = h * (2 * kd + 2 * vd);          /* q, k, v and the output gate z */
    uint64_t in_ba = h * 2ull * m->linear_value_heads; /* beta and alpha, one per value head */
    uint64_t conv = linear_conv_dim(m) * m->linear_conv_kernel; /* depthwise, no bias */
    uint64_t per_head = 2ull * m->linear_value_heads;           /* dt_bias and A_log */
    uint64_t norm = m->linear_value_head_dim; /* gated RMSNorm over a value head */
    uint64_t out = vd * h;
    return in_qkvz + in_ba + conv + per_head + norm + out;
}

uint64_t model_non_expert_params(const model_geometry *m) {
    uint64_t h = m->hidden;
    uint64_t params = (uint64_t)m->vocab * h;                 /* token embeddings */
    if (!m->tie_embeddings) params += (uint64_t)m->vocab * h; /* LM head */
    params += h;                                              /* final norm */
    for (uint32_t l = 0; l < m->n_layers; l++) {
        params += 2 * h; /* input and post-attention norms */
        params +=
            is_full_attention_layer(m, l) ? full_attention_params(m) : linear_attention_params(m);
        if (m->is_moe_layer[l]) {
            params += h * m->n_experts;                                        /* router */
            params += (uint64_t)m->n_shared_experts * 3 * h * m->shared_inter; /* shared */
            if (m->shared_expert_gate) params += h;                            /* its gate */
        } else {
            params += 3 * h * m->dense_inter; /* dense gated FFN */
        }
    }
    return params;
}

uint64_t model_non_expert_bytes(const model_geometry *m) {
    return BF16_BYTES * model_non_expert_params(m);
}

uint64_t model_kv_bytes_per_token(const model_geometry *m) {
    if (m->attention == ATTENTION_MLA) /* latent cache: compressed kv plus the shared rope key */
        return BF16_BYTES * (uint64_t)m->n_layers *
               ((uint64_t)m->kv_lora_rank + m->qk_rope_head_dim);
    return BF16_BYTES * n_full_attention_layers(m) * 2ull * m->n_kv_heads * m->head_dim;
}

/* Per linear-attention layer: the delta-rule state (value heads x key dim x value dim) and the
 * causal conv's last kernel-1 inputs. Implementations keep the state in fp32; the header's
 * contract is bf16, so this is half of what a fp32 engine holds. */
uint64_t model_recurrent_state_bytes(const model_geometry *m) {
    if (m->attention != ATTENTION_HYBRID_LINEAR) return 0;
    uint64_t n_linear = m->n_layers - n_full_attention_layers(m);
    uint64_t state =
        (uint64_t)m->linear_value_heads * m->linear_key_head_dim * m->linear_value_head_dim;
    uint64_t conv = linear_conv_dim(m) * (m->linear_conv_kernel - 1);
    return BF16_BYTES * n_linear * (state + conv);
}

uint64_t model_total_params(const model_geometry *m) {
    return model_non_expert_params(m) +
           (uint64_t)m->n_moe_layers * m->n_experts * model_expert_params(m);
}
