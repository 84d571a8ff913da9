/* policies/key_buckets.h: slots bucketed by position. After random inserts, removals and moves
 * (positions near and far, never again, a table that grows), a walk from the top visits every
 * non-empty bucket once, highest first (never again first), and each bucket holds exactly the
 * slots whose positions fall in it. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "common/rng.h"
#include "policies/key_buckets.h"

enum { SLOTS = 300 };

static uint32_t bucket_of(uint64_t position) {
    return position == KEY_BUCKETS_NEVER ? KEY_BUCKETS_NEVER_BUCKET
                                         : (uint32_t)(position >> KEY_BUCKETS_SHIFT);
}

/* a position: mostly near a moving front, some far ahead (the table grows), some never */
static uint64_t draw_position(rng *r, uint64_t front) {
    uint64_t kind = rng_below(r, 10);
    if (kind == 0) return KEY_BUCKETS_NEVER;
    if (kind == 1) return front + rng_below(r, 1ull << 30);
    return front + rng_below(r, 64ull << KEY_BUCKETS_SHIFT);
}

/* The walk from the top against the reference (position of each slot, or none). */
static void check_walk(const key_buckets *kb, const bool *in, const uint64_t *pos, int op) {
    uint32_t seen = 0, n_in = 0;
    for (uint32_t s = 0; s < SLOTS; s++) n_in += in[s];
    uint32_t last = KEY_BUCKETS_NONE;
    for (uint32_t b = key_buckets_below(kb, KEY_BUCKETS_NONE); b != KEY_BUCKETS_NONE;
         b = key_buckets_below(kb, b)) {
        cr_assert(last == KEY_BUCKETS_NONE || b < last, "op %d: bucket %u after %u", op, b, last);
        uint32_t n_here = 0;
        for (uint32_t s = key_buckets_first(kb, b); s != KEY_BUCKETS_NONE; s = kb->next[s]) {
            cr_assert(s < SLOTS && in[s], "op %d: slot %u in bucket %u is not held", op, s, b);
            cr_assert_eq(bucket_of(pos[s]), b, "op %d: slot %u in bucket %u, expected %u", op, s, b,
                         bucket_of(pos[s]));
            n_here++;
        }
        cr_assert_gt(n_here, 0, "op %d: the walk visits empty bucket %u", op, b);
        seen += n_here;
        last = b;
    }
    cr_assert_eq(seen, n_in, "op %d: the walk visits %u slots of %u", op, seen, n_in);
}

Test(key_buckets, a_walk_from_the_top_visits_every_slot_in_its_bucket_highest_first) {
    key_buckets kb;
    key_buckets_init(&kb, SLOTS);
    rng *r = rng_create(11);
    bool in[SLOTS] = {0};
    uint64_t pos[SLOTS] = {0}, front = 0;
    for (int op = 0; op < 20000; op++) {
        uint32_t s = (uint32_t)rng_below(r, SLOTS);
        front += rng_below(r, 8);
        if (!in[s]) {
            pos[s] = draw_position(r, front);
            key_buckets_insert(&kb, s, pos[s]);
            in[s] = true;
        } else if (rng_below(r, 3) == 0) {
            key_buckets_remove(&kb, s);
            in[s] = false;
        } else {
            pos[s] = draw_position(r, front);
            key_buckets_move(&kb, s, pos[s]);
        }
        if (op % 97 == 0) check_walk(&kb, in, pos, op);
    }
    check_walk(&kb, in, pos, -1);
    for (uint32_t s = 0; s < SLOTS; s++)
        if (in[s]) key_buckets_remove(&kb, s);
    cr_assert_eq(key_buckets_below(&kb, KEY_BUCKETS_NONE), KEY_BUCKETS_NONE, "all removed");
    rng_destroy(r);
    key_buckets_free(&kb);
}

Test(key_buckets, the_next_bucket_down_is_found_across_a_wide_gap) {
    key_buckets kb;
    key_buckets_init(&kb, 3);
    key_buckets_insert(&kb, 0, 5);             /* bucket 0 */
    key_buckets_insert(&kb, 1, (uint64_t)1e9); /* far: the table grows */
    key_buckets_insert(&kb, 2, KEY_BUCKETS_NEVER);
    uint32_t far = (uint32_t)((uint64_t)1e9 >> KEY_BUCKETS_SHIFT);
    cr_assert_eq(key_buckets_below(&kb, KEY_BUCKETS_NONE), KEY_BUCKETS_NEVER_BUCKET);
    cr_assert_eq(key_buckets_below(&kb, KEY_BUCKETS_NEVER_BUCKET), far);
    cr_assert_eq(key_buckets_below(&kb, far), 0u);
    cr_assert_eq(key_buckets_below(&kb, 0), KEY_BUCKETS_NONE);
    key_buckets_move(&kb, 1, 7); /* into bucket 0 beside slot 0 */
    cr_assert_eq(key_buckets_below(&kb, KEY_BUCKETS_NEVER_BUCKET), 0u);
    key_buckets_free(&kb);
}
