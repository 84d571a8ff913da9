/* The expert pools of a run, simulated or replayed (sim/sim.c, replay/exec.h): one arena of the
 * expert budget (in a replay made by the backend before the clock starts: device memory, or DRAM
 * for the CPU backend), carved into fixed-size
 * blocks per precision, one block per expert part (gate, up or down) in the kernels' format. The
 * memory system's reserve / release (core/memsys.h, memsys_host) take and give back blocks: a
 * freed block is reused by its precision only (LIFO), a new one is cut from the arena's top. So a
 * load the byte budget admits can find no block of its size in a multi-precision run: it is
 * refused and counted (`refusals`), as no real engine could place it either.
 *
 * Units: bytes, offsets from the arena's base. Part indices are memsys's
 * (memsys_lep * PART_COUNT + part). */
#ifndef MOESIM_CORE_BLOCK_POOL_H
#define MOESIM_CORE_BLOCK_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/model.h"
#include "common/precision.h"
#include "core/memsys.h"

#define BLOCK_POOL_NONE UINT64_MAX
/* Blocks start at multiples of this: the CPU backend's O_DIRECT alignment, a multiple of the
 * 256 B the CUDA kernels need. */
#define BLOCK_POOL_ALIGN 4096u

typedef struct block_pool {
    uint64_t arena_bytes, top;        /* arena size; bytes already cut into blocks */
    uint64_t block_bytes[PREC_COUNT]; /* one block of each precision (0: none of it) */
    uint64_t *free_off[PREC_COUNT];   /* [n_free] freed blocks' offsets, reused last first */
    uint32_t n_free[PREC_COUNT], cap_free[PREC_COUNT];
    uint64_t *part_off; /* [n_parts] block of each part resident or loading, or BLOCK_POOL_NONE */
    size_t n_parts;
    uint64_t refusals; /* reservations the byte budget admitted but no block could hold */
} block_pool;

/* An arena of `arena_bytes` handing out blocks of block_bytes[p] for `n_parts` parts
 * (caller-allocated struct; block_pool_free). */
void block_pool_init(block_pool *p, uint64_t arena_bytes, const uint64_t block_bytes[PREC_COUNT],
                     size_t n_parts);
void block_pool_free(block_pool *p); /* accepts a zeroed struct */

/* One block of each precision: the largest of its parts' bytes (`part_bytes`, 0: not held) rounded
 * up to BLOCK_POOL_ALIGN. */
void block_pool_block_bytes(const uint64_t part_bytes[PREC_COUNT][PART_COUNT],
                            uint64_t out[PREC_COUNT]);
/* The arena of a run's expert budget: `n_layers` pools of `pool_cap_bytes` (per_layer) or the
 * expert budget, rounded up to BLOCK_POOL_ALIGN. */
uint64_t block_pool_arena_bytes(bool per_layer, uint64_t pool_cap_bytes, uint32_t n_layers,
                                uint64_t expert_budget_bytes);

/* Blocks at precision `prec` for each part in the mask `parts` of the parts starting at
 * `part_base` (memsys_lep * PART_COUNT): all of them, or none and a refusal counted. */
bool block_pool_reserve(block_pool *p, size_t part_base, moesim_precision prec, uint32_t parts);
/* Part `part_index` at precision `prec` left the pool: its block is free. */
void block_pool_release(block_pool *p, size_t part_index, moesim_precision prec);

/* The memory system's reserve / release (memsys_host) on `p`: expert (layer, expert) of `ms` at
 * precision `prec`. The release returns the part's index. */
bool block_pool_reserve_expert(block_pool *p, const memsys *ms, uint32_t layer, uint32_t expert,
                               moesim_precision prec, uint32_t parts);
size_t block_pool_release_part(block_pool *p, const memsys *ms, uint32_t layer, uint32_t expert,
                               moesim_precision prec, int part);

/* Offset of part `part_index`'s block in the arena (it must hold one). */
static inline uint64_t block_pool_offset(const block_pool *p, size_t part_index) {
    return p->part_off[part_index];
}

#endif
