/* policies/score_order.h: candidates ordered by score (higher first), then id (lower first), by
 * counting ranks with AVX2 or by insertion; both give the order a plain sort by that rule gives,
 * on random sets with many tied scores, negative ones and every size up to the cap. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "common/rng.h"
#include "policies/score_order.h"

typedef struct candidate {
    double score;
    uint16_t id;
} candidate;

static int before(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* n distinct ids of [0, 1024) with scores from a few values (ties) or from a wide range */
static void draw(rng *r, uint32_t n, bool ties, uint16_t *ids, double *scores, candidate *ref) {
    static bool taken[1024];
    for (uint32_t i = 0; i < n; i++) {
        uint16_t e;
        do e = (uint16_t)rng_below(r, 1024);
        while (taken[e]);
        taken[e] = true;
        double s = ties ? (double)rng_below(r, 4) * 0.25 : rng_uniform(r) * 2 - 1;
        ids[i] = e, scores[i] = s, ref[i] = (candidate){s, e};
    }
    for (uint32_t i = 0; i < n; i++) taken[ids[i]] = false;
    qsort(ref, n, sizeof *ref, before);
}

static void check_both_ways(bool avx2) {
    enum { CAP = 130 };
    score_order o;
    score_order_init(&o, CAP);
    if (avx2 && !o.avx2) {
        score_order_free(&o);
        cr_skip_test("this CPU has no AVX2");
    }
    o.avx2 = avx2;
    rng *r = rng_create(7);
    uint16_t ids[CAP];
    double scores[CAP];
    candidate ref[CAP];
    for (uint32_t n = 0; n <= CAP; n++)
        for (int ties = 0; ties < 2; ties++) {
            draw(r, n, ties, ids, scores, ref);
            score_order_sort(&o, ids, scores, n);
            for (uint32_t i = 0; i < n; i++) {
                cr_assert_eq(ids[i], ref[i].id, "n %u ties %d: rank %u holds id %u, expected %u", n,
                             ties, i, ids[i], ref[i].id);
                cr_assert_eq(scores[i], ref[i].score, "n %u: the score moves with its id", n);
            }
        }
    rng_destroy(r);
    score_order_free(&o);
}

Test(score_order, ranks_counted_with_avx2_give_the_sorted_order) { check_both_ways(true); }

Test(score_order, an_insertion_gives_the_sorted_order) { check_both_ways(false); }
