/* Bump allocator over a list of blocks; see arena.h. */
#include "common/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"

#define ARENA_ALIGN 64

struct arena_block {
    arena_block *next;
    size_t size, used;
    _Alignas(ARENA_ALIGN) unsigned char data[];
};

void arena_init(arena *a, size_t block_bytes) {
    a->head = NULL;
    a->block_bytes = block_bytes ? block_bytes : (size_t)1 << 20;
}

void *arena_alloc(arena *a, size_t bytes) {
    size_t need = (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    MOESIM_ASSERT(need >= bytes);
    if (!a->head || a->head->size - a->head->used < need) {
        size_t size = need > a->block_bytes ? need : a->block_bytes;
        MOESIM_ASSERT(size <= SIZE_MAX - sizeof(arena_block));
        arena_block *b = moesim_xmalloc(sizeof(arena_block) + size);
        b->size = size;
        b->used = 0;
        b->next = a->head;
        a->head = b;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += need;
    memset(p, 0, bytes);
    return p;
}

void *arena_calloc(arena *a, size_t count, size_t elem_bytes) {
    MOESIM_ASSERT(elem_bytes == 0 || count <= SIZE_MAX / elem_bytes);
    return arena_alloc(a, count * elem_bytes);
}

void arena_free(arena *a) {
    arena_block *b = a->head;
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}
