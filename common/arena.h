/* A bump allocator for the big per-run arrays of one object (a trace, a simulation): everything
 * is freed at once by arena_free. Allocations are zeroed and aligned to 64 bytes. */
#ifndef MOESIM_COMMON_ARENA_H
#define MOESIM_COMMON_ARENA_H

#include <stddef.h>

typedef struct arena_block arena_block;

typedef struct arena {
    arena_block *head;  /* newest block first */
    size_t block_bytes; /* default block size; larger requests get a block of their own */
} arena;

void arena_init(arena *a, size_t block_bytes);
void *arena_alloc(arena *a, size_t bytes);                     /* zeroed, 64-byte aligned */
void *arena_calloc(arena *a, size_t count, size_t elem_bytes); /* overflow-checked */
void arena_free(arena *a);                                     /* releases every block */

#endif
