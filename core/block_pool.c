/* Fixed-size blocks per precision carved from one arena (core/block_pool.h). */
#include "core/block_pool.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"

void block_pool_init(block_pool *p, uint64_t arena_bytes, const uint64_t block_bytes[PREC_COUNT],
                     size_t n_parts) {
    memset(p, 0, sizeof *p);
    p->arena_bytes = arena_bytes;
    memcpy(p->block_bytes, block_bytes, sizeof p->block_bytes);
    p->n_parts = n_parts;
    p->part_off = moesim_xmalloc((n_parts ? n_parts : 1) * sizeof(uint64_t));
    for (size_t i = 0; i < n_parts; i++) p->part_off[i] = BLOCK_POOL_NONE;
}

static uint64_t align_up(uint64_t n) {
    return (n + BLOCK_POOL_ALIGN - 1) / BLOCK_POOL_ALIGN * BLOCK_POOL_ALIGN;
}

void block_pool_block_bytes(const uint64_t part_bytes[PREC_COUNT][PART_COUNT],
                            uint64_t out[PREC_COUNT]) {
    for (int p = 0; p < PREC_COUNT; p++) {
        out[p] = 0;
        for (int part = 0; part < PART_COUNT; part++)
            if (part_bytes[p][part] > out[p]) out[p] = part_bytes[p][part];
        out[p] = align_up(out[p]);
    }
}

uint64_t block_pool_arena_bytes(bool per_layer, uint64_t pool_cap_bytes, uint32_t n_layers,
                                uint64_t expert_budget_bytes) {
    return align_up(per_layer ? pool_cap_bytes * n_layers : expert_budget_bytes);
}

void block_pool_free(block_pool *p) {
    for (int q = 0; q < PREC_COUNT; q++) free(p->free_off[q]);
    free(p->part_off);
    memset(p, 0, sizeof *p);
}

static uint64_t block_take(block_pool *p, moesim_precision prec) {
    if (p->n_free[prec]) return p->free_off[prec][--p->n_free[prec]];
    uint64_t need = p->block_bytes[prec];
    MOESIM_ASSERT(need > 0); /* the memory system loads only the precisions the store holds */
    if (p->top + need > p->arena_bytes) return BLOCK_POOL_NONE;
    uint64_t off = p->top;
    p->top += need;
    return off;
}

static void block_give(block_pool *p, moesim_precision prec, uint64_t off) {
    if (p->n_free[prec] == p->cap_free[prec]) {
        p->cap_free[prec] = p->cap_free[prec] ? 2 * p->cap_free[prec] : 64;
        p->free_off[prec] =
            moesim_xrealloc(p->free_off[prec], p->cap_free[prec] * sizeof(uint64_t));
    }
    p->free_off[prec][p->n_free[prec]++] = off;
}

bool block_pool_reserve(block_pool *p, size_t part_base, moesim_precision prec, uint32_t parts) {
    uint64_t got[PART_COUNT] = {BLOCK_POOL_NONE, BLOCK_POOL_NONE, BLOCK_POOL_NONE};
    for (int part = 0; part < PART_COUNT; part++) {
        if (!(parts & (1u << part))) continue;
        if ((got[part] = block_take(p, prec)) == BLOCK_POOL_NONE) {
            for (int q = 0; q < part; q++)
                if (got[q] != BLOCK_POOL_NONE) block_give(p, prec, got[q]);
            p->refusals++;
            return false;
        }
    }
    for (int part = 0; part < PART_COUNT; part++)
        if (parts & (1u << part)) p->part_off[part_base + (size_t)part] = got[part];
    return true;
}

bool block_pool_reserve_expert(block_pool *p, const memsys *ms, uint32_t layer, uint32_t expert,
                               moesim_precision prec, uint32_t parts) {
    return block_pool_reserve(p, memsys_lep(ms, layer, expert, prec) * PART_COUNT, prec, parts);
}

size_t block_pool_release_part(block_pool *p, const memsys *ms, uint32_t layer, uint32_t expert,
                               moesim_precision prec, int part) {
    size_t pi = memsys_lep(ms, layer, expert, prec) * PART_COUNT + (size_t)part;
    block_pool_release(p, pi, prec);
    return pi;
}

void block_pool_release(block_pool *p, size_t part_index, moesim_precision prec) {
    MOESIM_ASSERT(p->part_off[part_index] != BLOCK_POOL_NONE);
    block_give(p, prec, p->part_off[part_index]);
    p->part_off[part_index] = BLOCK_POOL_NONE;
}
