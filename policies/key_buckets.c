/* Slots bucketed by a position (policies/key_buckets.h): a doubly linked list per bucket, a bit
 * per non-empty bucket and a bit per non-zero word of those, so that the next non-empty bucket
 * down is found by two count-leading-zeros, whatever the gap. */
#include "policies/key_buckets.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"

#define WORD_BUCKETS    64u
#define SUMMARY_BUCKETS (64u * 64u) /* buckets under one summary word */

/* Grows the table to hold bucket b (zeroed, empty); the size stays a multiple of a summary
 * word's buckets. */
static void grow(key_buckets *kb, uint32_t b) {
    uint64_t want = (uint64_t)b + 1, n = kb->n_buckets ? kb->n_buckets : SUMMARY_BUCKETS;
    while (n < want) n *= 2;
    MOESIM_ASSERT(n < KEY_BUCKETS_NEVER_BUCKET);
    uint32_t old = kb->n_buckets;
    kb->head = moesim_xrealloc(kb->head, n * sizeof *kb->head);
    for (uint64_t i = old; i < n; i++) kb->head[i] = KEY_BUCKETS_NONE;
    kb->bits = moesim_xrealloc(kb->bits, n / WORD_BUCKETS * sizeof *kb->bits);
    memset(kb->bits + old / WORD_BUCKETS, 0, (n - old) / WORD_BUCKETS * sizeof *kb->bits);
    kb->summary = moesim_xrealloc(kb->summary, n / SUMMARY_BUCKETS * sizeof *kb->summary);
    memset(kb->summary + old / SUMMARY_BUCKETS, 0,
           (n - old) / SUMMARY_BUCKETS * sizeof *kb->summary);
    kb->n_buckets = (uint32_t)n;
}

void key_buckets_init(key_buckets *kb, size_t n_slots) {
    MOESIM_ASSERT(n_slots < KEY_BUCKETS_NONE);
    memset(kb, 0, sizeof *kb);
    kb->prev = moesim_xmalloc(n_slots * sizeof *kb->prev);
    kb->next = moesim_xmalloc(n_slots * sizeof *kb->next);
    kb->bucket = moesim_xmalloc(n_slots * sizeof *kb->bucket);
    for (size_t s = 0; s < n_slots; s++) kb->bucket[s] = KEY_BUCKETS_NONE;
    kb->never_head = KEY_BUCKETS_NONE;
    grow(kb, 0);
}

void key_buckets_free(key_buckets *kb) {
    free(kb->prev);
    free(kb->next);
    free(kb->bucket);
    free(kb->head);
    free(kb->bits);
    free(kb->summary);
    memset(kb, 0, sizeof *kb);
}

static inline uint32_t bucket_of(uint64_t position) {
    if (position == KEY_BUCKETS_NEVER) return KEY_BUCKETS_NEVER_BUCKET;
    MOESIM_ASSERT(position >> KEY_BUCKETS_SHIFT < KEY_BUCKETS_NEVER_BUCKET);
    return (uint32_t)(position >> KEY_BUCKETS_SHIFT);
}

static inline uint32_t *head_of(key_buckets *kb, uint32_t b) {
    return b == KEY_BUCKETS_NEVER_BUCKET ? &kb->never_head : &kb->head[b];
}

void key_buckets_insert(key_buckets *kb, uint32_t s, uint64_t position) {
    MOESIM_ASSERT(kb->bucket[s] == KEY_BUCKETS_NONE);
    uint32_t b = bucket_of(position);
    if (b != KEY_BUCKETS_NEVER_BUCKET) {
        if (b >= kb->n_buckets) grow(kb, b);
        kb->bits[b / WORD_BUCKETS] |= 1ull << (b % WORD_BUCKETS);
        kb->summary[b / SUMMARY_BUCKETS] |= 1ull << (b / WORD_BUCKETS % 64);
    }
    uint32_t *head = head_of(kb, b);
    kb->bucket[s] = b;
    kb->prev[s] = KEY_BUCKETS_NONE;
    kb->next[s] = *head;
    if (*head != KEY_BUCKETS_NONE) kb->prev[*head] = s;
    *head = s;
}

void key_buckets_remove(key_buckets *kb, uint32_t s) {
    uint32_t b = kb->bucket[s];
    MOESIM_ASSERT(b != KEY_BUCKETS_NONE);
    uint32_t prev = kb->prev[s], next = kb->next[s];
    if (prev != KEY_BUCKETS_NONE)
        kb->next[prev] = next;
    else
        *head_of(kb, b) = next;
    if (next != KEY_BUCKETS_NONE) kb->prev[next] = prev;
    kb->bucket[s] = KEY_BUCKETS_NONE;
    if (b == KEY_BUCKETS_NEVER_BUCKET || kb->head[b] != KEY_BUCKETS_NONE) return;
    uint64_t *word = &kb->bits[b / WORD_BUCKETS];
    *word &= ~(1ull << (b % WORD_BUCKETS));
    if (!*word) kb->summary[b / SUMMARY_BUCKETS] &= ~(1ull << (b / WORD_BUCKETS % 64));
}

void key_buckets_move(key_buckets *kb, uint32_t s, uint64_t position) {
    if (bucket_of(position) == kb->bucket[s]) return;
    key_buckets_remove(kb, s);
    key_buckets_insert(kb, s, position);
}

/* The highest set bit of w at or below bit `at`, or -1. */
static inline int highest_at_or_below(uint64_t w, uint32_t at) {
    w &= at >= 63 ? ~0ull : (2ull << at) - 1;
    return w ? 63 - __builtin_clzll(w) : -1;
}

uint32_t key_buckets_below(const key_buckets *kb, uint32_t bucket) {
    if (bucket == KEY_BUCKETS_NONE && kb->never_head != KEY_BUCKETS_NONE)
        return KEY_BUCKETS_NEVER_BUCKET;
    /* the last bucket to look at: b - 1, or the table's top */
    uint32_t b = bucket >= KEY_BUCKETS_NEVER_BUCKET ? kb->n_buckets : bucket;
    if (b == 0) return KEY_BUCKETS_NONE;
    b--;
    uint32_t w = b / WORD_BUCKETS;
    int bit = highest_at_or_below(kb->bits[w], b % WORD_BUCKETS);
    if (bit >= 0) return w * WORD_BUCKETS + (uint32_t)bit;
    if (w == 0) return KEY_BUCKETS_NONE;
    w--; /* the highest non-zero word below w, by the summary */
    uint32_t sw = w / 64;
    int wbit = highest_at_or_below(kb->summary[sw], w % 64);
    while (wbit < 0) {
        if (sw == 0) return KEY_BUCKETS_NONE;
        sw--;
        wbit = highest_at_or_below(kb->summary[sw], 63);
    }
    w = sw * 64 + (uint32_t)wbit;
    return w * WORD_BUCKETS + (uint32_t)(63 - __builtin_clzll(kb->bits[w]));
}
