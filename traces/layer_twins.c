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

static bool layers_equal(const trace *t, uint32_t a, uint32_t b) {
    const uint32_t k = t->meta.top_k;
    for (uint64_t i = 0; i < t->n_tokens; i++)
        if (memcmp(trace_experts(t, i, a), trace_experts(t, i, b), k * sizeof(uint16_t)) ||
            memcmp(trace_gates(t, i, a), trace_gates(t, i, b), k * sizeof(float)))
            return false;
    return true;
}

uint32_t trace_layer_twins_find(const trace *t, uint32_t (*pairs)[2], uint32_t cap,
                                uint32_t *listed) {
    const uint32_t L = t->meta.n_layers, k = t->meta.top_k;
    *listed = 0;
    if (L < 2 || t->n_tokens < 2) return 0;
    uint64_t *h = moesim_xmalloc(L * sizeof *h); /* [L] */
    for (uint32_t l = 0; l < L; l++) {
        h[l] = 0xcbf29ce484222325ull;
        for (uint64_t i = 0; i < t->n_tokens; i++) {
            h[l] = fnv1a(h[l], trace_experts(t, i, l), k * sizeof(uint16_t));
            h[l] = fnv1a(h[l], trace_gates(t, i, l), k * sizeof(float));
        }
    }
    uint32_t copies = 0;
    for (uint32_t b = 1; b < L; b++)
        for (uint32_t a = 0; a < b; a++) {
            if (h[a] != h[b] || !layers_equal(t, a, b)) continue;
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

void trace_layer_twins_add_json(const trace *t, json_t *j) {
    uint32_t twins[TRACE_LAYER_TWINS_LISTED][2], listed = 0;
    uint32_t copies = trace_layer_twins_find(t, twins, TRACE_LAYER_TWINS_LISTED, &listed);
    json_t *pairs = json_array();
    for (uint32_t i = 0; i < listed; i++)
        json_array_append_new(pairs, json_pack("[ii]", twins[i][0], twins[i][1]));
    json_object_set_new(j, "identical_layers", json_integer(copies));
    json_object_set_new(j, "identical_layer_pairs", pairs);
}
