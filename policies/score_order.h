/* Candidates ordered by score: higher first, then lower id. A policy's few dozen candidates a
 * route (mixtral-offload's guesses united over a batch) are ordered by counting each one's rank
 * where AVX2 is: every comparison made, four a vector, none a branch, where an insertion sort's
 * data-dependent compares were mispredicted (bench/README.md). Both ways give the one order:
 * (score, id) is a total order over distinct ids. */
#ifndef MOESIM_POLICIES_SCORE_ORDER_H
#define MOESIM_POLICIES_SCORE_ORDER_H

#include <stdbool.h>
#include <stdint.h>

/* Scratch of one ordering: ids and scores of up to `cap` candidates, room for the padding. */
typedef struct score_order {
    uint32_t cap;
    bool avx2;            /* rank by AVX2 (the CPU has it, unless turned off for a test) */
    double *score;        /* [cap rounded up to 4] */
    double *id;           /* [cap rounded up to 4] the ids as doubles, compared beside the scores */
    uint16_t *ranked;     /* [cap] the ids by rank */
    double *ranked_score; /* [cap] their scores */
} score_order;

void score_order_init(score_order *o, uint32_t cap);
void score_order_free(score_order *o);

/* Reorders ids[n] (distinct, n <= cap) by scores[n] (finite), higher score first, then
 * lower id; scores move with their ids. */
void score_order_sort(score_order *o, uint16_t *ids, double *scores, uint32_t n);

#endif
