/* Fixed-size blocks per precision carved from one arena (replay/pool.h). */
#include "replay/pool.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"

void replay_pool_init(replay_pool *p, uint64_t arena_bytes, const uint64_t block_bytes[PREC_COUNT],
                      size_t n_parts) {
    memset(p, 0, sizeof *p);
    p->arena_bytes = arena_bytes;
    memcpy(p->block_bytes, block_bytes, sizeof p->block_bytes);
    p->n_parts = n_parts;
    p->part_off = moesim_xmalloc((n_parts ? n_parts : 1) * sizeof(uint64_t));
    for (size_t i = 0; i < n_parts; i++) p->part_off[i] = REPLAY_POOL_NONE;
}

void replay_pool_free(replay_pool *p) {
    for (int q = 0; q < PREC_COUNT; q++) free(p->free_off[q]);
    free(p->part_off);
    memset(p, 0, sizeof *p);
}

static uint64_t block_take(replay_pool *p, moesim_precision prec) {
    if (p->n_free[prec]) return p->free_off[prec][--p->n_free[prec]];
    uint64_t need = p->block_bytes[prec];
    MOESIM_ASSERT(need > 0); /* the memory system loads only the precisions the store holds */
    if (p->top + need > p->arena_bytes) return REPLAY_POOL_NONE;
    uint64_t off = p->top;
    p->top += need;
    return off;
}

static void block_give(replay_pool *p, moesim_precision prec, uint64_t off) {
    if (p->n_free[prec] == p->cap_free[prec]) {
        p->cap_free[prec] = p->cap_free[prec] ? 2 * p->cap_free[prec] : 64;
        p->free_off[prec] =
            moesim_xrealloc(p->free_off[prec], p->cap_free[prec] * sizeof(uint64_t));
    }
    p->free_off[prec][p->n_free[prec]++] = off;
}

bool replay_pool_reserve(replay_pool *p, size_t part_base, moesim_precision prec, uint32_t parts) {
    uint64_t got[PART_COUNT] = {REPLAY_POOL_NONE, REPLAY_POOL_NONE, REPLAY_POOL_NONE};
    for (int part = 0; part < PART_COUNT; part++) {
        if (!(parts & (1u << part))) continue;
        if ((got[part] = block_take(p, prec)) == REPLAY_POOL_NONE) {
            for (int q = 0; q < part; q++)
                if (got[q] != REPLAY_POOL_NONE) block_give(p, prec, got[q]);
            p->refusals++;
            return false;
        }
    }
    for (int part = 0; part < PART_COUNT; part++)
        if (parts & (1u << part)) p->part_off[part_base + (size_t)part] = got[part];
    return true;
}

void replay_pool_release(replay_pool *p, size_t part_index, moesim_precision prec) {
    MOESIM_ASSERT(p->part_off[part_index] != REPLAY_POOL_NONE);
    block_give(p, prec, p->part_off[part_index]);
    p->part_off[part_index] = REPLAY_POOL_NONE;
}
