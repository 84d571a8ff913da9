/* The replay's expert pools (replay/exec.h): one arena of the expert budget, made by the backend
 * before the clock starts (device memory, or DRAM for the CPU backend), carved into fixed-size
 * blocks per precision, one block per expert part (gate, up or down) in the kernels' format. The
 * memory system's reserve / release (sim/memsys.h, memsys_host) take and give back blocks: a
 * freed block is reused by its precision only (LIFO), a new one is cut from the arena's top. So a
 * load the byte budget admits can find no block of its size in a multi-precision run: it is
 * refused and counted (`refusals`), as no real engine could place it either.
 *
 * Units: bytes, offsets from the arena's base. Part indices are memsys's
 * (memsys_lep * PART_COUNT + part). */
#ifndef MOESIM_REPLAY_POOL_H
#define MOESIM_REPLAY_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/model.h"
#include "common/precision.h"

#define REPLAY_POOL_NONE UINT64_MAX

typedef struct replay_pool {
    uint64_t arena_bytes, top;        /* arena size; bytes already cut into blocks */
    uint64_t block_bytes[PREC_COUNT]; /* one block of each precision (0: none of it) */
    uint64_t *free_off[PREC_COUNT];   /* [n_free] freed blocks' offsets, reused last first */
    uint32_t n_free[PREC_COUNT], cap_free[PREC_COUNT];
    uint64_t *part_off; /* [n_parts] block of each part resident or loading, or REPLAY_POOL_NONE */
    size_t n_parts;
    uint64_t refusals; /* reservations the byte budget admitted but no block could hold */
} replay_pool;

/* An arena of `arena_bytes` handing out blocks of block_bytes[p] for `n_parts` parts
 * (caller-allocated struct; replay_pool_free). */
void replay_pool_init(replay_pool *p, uint64_t arena_bytes, const uint64_t block_bytes[PREC_COUNT],
                      size_t n_parts);
void replay_pool_free(replay_pool *p); /* accepts a zeroed struct */

/* Blocks at precision `prec` for each part in the mask `parts` of the parts starting at
 * `part_base` (memsys_lep * PART_COUNT): all of them, or none and a refusal counted. */
bool replay_pool_reserve(replay_pool *p, size_t part_base, moesim_precision prec, uint32_t parts);
/* Part `part_index` at precision `prec` left the pool: its block is free. */
void replay_pool_release(replay_pool *p, size_t part_index, moesim_precision prec);

/* Offset of part `part_index`'s block in the arena (it must hold one). */
static inline uint64_t replay_pool_offset(const replay_pool *p, size_t part_index) {
    return p->part_off[part_index];
}

#endif
