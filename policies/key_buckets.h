/* Slots (layer * E + expert) bucketed by a position: the next use of a held expert in the
 * access stream, Belady's key, or never again. The victim is the held expert used furthest
 * ahead, and after every access the expert's next use moves on: in a heap that move was a sift
 * up over most of its levels, 17 % of an `oracle` run (bench/README.md); here it is an unlink
 * and a link. A search reads the buckets from the highest (never again, then the furthest
 * positions) down, and compares exact keys only inside them. Bucket b holds the positions
 * [b << KEY_BUCKETS_SHIFT, (b + 1) << KEY_BUCKETS_SHIFT); the table grows with the positions
 * seen (4 bytes per 2^KEY_BUCKETS_SHIFT positions of the stream). */
#ifndef MOESIM_POLICIES_KEY_BUCKETS_H
#define MOESIM_POLICIES_KEY_BUCKETS_H

#include <stddef.h>
#include <stdint.h>

#define KEY_BUCKETS_SHIFT        10
#define KEY_BUCKETS_NEVER        UINT64_MAX       /* the position of a slot never used again */
#define KEY_BUCKETS_NEVER_BUCKET (UINT32_MAX - 1) /* its bucket, above every other */
#define KEY_BUCKETS_NONE         UINT32_MAX       /* no slot, no bucket */

typedef struct key_buckets {
    uint32_t *prev, *next; /* [n_slots] links within a bucket, KEY_BUCKETS_NONE: none */
    uint32_t *bucket;      /* [n_slots] the slot's bucket, KEY_BUCKETS_NONE: not in one */
    uint32_t never_head;   /* first slot never used again */
    uint32_t n_buckets;    /* positions' buckets in the table (a multiple of 64 * 64) */
    uint32_t *head;        /* [n_buckets] first slot of each */
    uint64_t *bits;        /* [n_buckets / 64] bit b % 64 of word b / 64: bucket b not empty */
    uint64_t *summary;     /* [n_buckets / 4096] bit w % 64 of word w / 64: bits[w] not zero */
} key_buckets;

void key_buckets_init(key_buckets *kb, size_t n_slots);
void key_buckets_free(key_buckets *kb);

/* Puts slot s (in no bucket) in the bucket of `position`. */
void key_buckets_insert(key_buckets *kb, uint32_t s, uint64_t position);
/* Takes slot s out of its bucket. */
void key_buckets_remove(key_buckets *kb, uint32_t s);
/* Moves slot s (in a bucket) to the bucket of `position`. */
void key_buckets_move(key_buckets *kb, uint32_t s, uint64_t position);

/* The highest non-empty bucket below `bucket` (KEY_BUCKETS_NONE: from the top, the never-again
 * bucket first), or KEY_BUCKETS_NONE when there is none. */
uint32_t key_buckets_below(const key_buckets *kb, uint32_t bucket);
/* A bucket's slots: the first, then kb->next[s] until KEY_BUCKETS_NONE. */
static inline uint32_t key_buckets_first(const key_buckets *kb, uint32_t bucket) {
    return bucket == KEY_BUCKETS_NEVER_BUCKET ? kb->never_head : kb->head[bucket];
}

#endif
