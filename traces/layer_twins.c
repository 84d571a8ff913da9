/* Layers with identical routing (traces/layer_twins.h): a hash of each layer's column of ids
 * and gates over all tokens, then an exact comparison of the layers whose hashes agree, so the
 * cost is one pass over the routing whatever the number of layers. */
#include "traces/layer_twins.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

/* FNV-1a over bytes, continued from h. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

uint64_t trace_layer_twins_hash_row(uint64_t h, const uint16_t *ids, const float *gates,
                                    uint32_t k) {
    h = fnv1a(h, ids, k * sizeof *ids);
    return fnv1a(h, gates, k * sizeof *gates);
}

/* Where token i's rows are (trace_stream_row's shape): a trace in memory or a stream. */
typedef struct rows_src {
    const trace *t;
    trace_stream *ts;
} rows_src;

static const trace *rows_of(const rows_src *src, uint64_t i, uint64_t *local) {
    if (src->ts) return trace_stream_row(src->ts, i, local);
    *local = i;
    return src->t;
}

static bool layers_equal(const rows_src *src, uint64_t n, uint32_t k, uint32_t a, uint32_t b) {
    for (uint64_t i = 0; i < n; i++) {
        uint64_t j;
        const trace *t = rows_of(src, i, &j);
        if (memcmp(trace_experts(t, j, a), trace_experts(t, j, b), k * sizeof(uint16_t)) ||
            memcmp(trace_gates(t, j, a), trace_gates(t, j, b), k * sizeof(float)))
            return false;
    }
    return true;
}

/* The twins among the layers of hashes `hash` (NULL: computed here). */
static uint32_t twins_find(const rows_src *src, const trace *tokens, const uint64_t *hash,
                           uint32_t (*pairs)[2], uint32_t cap, uint32_t *listed) {
    const uint32_t L = tokens->meta.n_layers, k = tokens->meta.top_k;
    const uint64_t n = tokens->n_tokens;
    *listed = 0;
    if (L < 2 || n < 2) return 0;
    uint64_t *h = moesim_xmalloc(L * sizeof *h); /* [L] */
    if (hash) {
        memcpy(h, hash, L * sizeof *h);
    } else {
        for (uint32_t l = 0; l < L; l++) h[l] = TRACE_LAYER_TWINS_HASH0;
        for (uint64_t i = 0; i < n; i++) { /* token-major: a stream reads each block once */
            uint64_t j;
            const trace *t = rows_of(src, i, &j);
            for (uint32_t l = 0; l < L; l++)
                h[l] = trace_layer_twins_hash_row(h[l], trace_experts(t, j, l),
                                                  trace_gates(t, j, l), k);
        }
    }
    uint32_t copies = 0;
    for (uint32_t b = 1; b < L; b++)
        for (uint32_t a = 0; a < b; a++) {
            if (h[a] != h[b] || !layers_equal(src, n, k, a, b)) continue;
            if (*listed < cap) {
                pairs[*listed][0] = a;
                pairs[*listed][1] = b;
                (*listed)++;
            }
            copies++;
            break;
        }
    free(h);
    return copies;
}

uint32_t trace_layer_twins_find(const trace *t, uint32_t (*pairs)[2], uint32_t cap,
                                uint32_t *listed) {
    rows_src src = {.t = t};
    return twins_find(&src, t, NULL, pairs, cap, listed);
}

uint32_t trace_layer_twins_find_stream(trace_stream *ts, const uint64_t *hash,
                                       uint32_t (*pairs)[2], uint32_t cap, uint32_t *listed) {
    rows_src src = {.ts = ts};
    return twins_find(&src, trace_stream_tokens(ts), hash, pairs, cap, listed);
}

static void twins_add_json(const rows_src *src, const trace *tokens, const uint64_t *hash,
                           json_t *j) {
    uint32_t twins[TRACE_LAYER_TWINS_LISTED][2], listed = 0;
    uint32_t copies = twins_find(src, tokens, hash, twins, TRACE_LAYER_TWINS_LISTED, &listed);
    json_t *pairs = json_array();
    for (uint32_t i = 0; i < listed; i++)
        json_array_append_new(pairs, json_pack("[ii]", twins[i][0], twins[i][1]));
    json_object_set_new(j, "identical_layers", json_integer(copies));
    json_object_set_new(j, "identical_layer_pairs", pairs);
}

void trace_layer_twins_add_json_stream(trace_stream *ts, const uint64_t *hash, json_t *j) {
    rows_src src = {.ts = ts};
    twins_add_json(&src, trace_stream_tokens(ts), hash, j);
}

void trace_layer_twins_add_json(const trace *t, json_t *j) {
    rows_src src = {.t = t};
    twins_add_json(&src, t, NULL, j);
}
