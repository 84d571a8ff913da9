/* The synthesizer's sampling primitives (traces/synth.c): alias tables in 4-byte cells, uniform
 * 32-bit numbers drawn from a block refilled by MT19937 run in place on GSL's state, and
 * binomial counts from CDF tables of 32-bit thresholds. The draws are inline: the generator makes
 * millions of them a second. Private to traces/synth*.c. */
#ifndef MOESIM_TRACES_SYNTH_DRAW_H
#define MOESIM_TRACES_SYNTH_DRAW_H

#include <stdbool.h>
#include <stdint.h>

#include <gsl/gsl_rng.h>

#include "common/model.h"

/* P(x) as a threshold on a uniform 32-bit draw: draw < threshold happens with probability x. */
static inline uint32_t prob_threshold(double x) {
    if (x <= 0) return 0;
    if (x >= 1) return UINT32_MAX;
    return (uint32_t)(x * 4294967296.0);
}

/* One column of an alias table in 32 bits: the high 22 bits are the threshold (keep the
 * column with probability thresh / 2^22), the low 10 the alias (E <= MODEL_MAX_EXPERTS = 1024).
 * 4-byte cells keep a request's L tables (L * E * 4 bytes: 24 KiB for Qwen3-30B) in L1. */
typedef uint32_t alias_cell;
#define ALIAS_BITS 10
#define ALIAS_MASK ((1u << ALIAS_BITS) - 1)
_Static_assert(MODEL_MAX_EXPERTS <= (1u << ALIAS_BITS), "alias ids fit the cell");

/* A cell keeping column j with probability p, else giving `alias`. */
static inline alias_cell alias_cell_make(double p, uint32_t alias) {
    uint32_t t = p >= 1 ? (1u << 22) - 1 : p <= 0 ? 0 : (uint32_t)(p * 4194304.0);
    return (t << ALIAS_BITS) | alias;
}

/* Vose's alias method over weights w[0..n) (> 0): column j keeps j with the probability in
 * cell[j] (see alias_cell), else gives its alias. `scaled`, `small`, `large` are scratch [n]. */
void alias_build(const double *w, uint32_t n, alias_cell *cell, double *scaled, uint32_t *small,
                 uint32_t *large);

/* 32-bit draws in blocks:
 * The hot paths take their uniform 32-bit numbers from a block refilled with the next numbers
 * of the generator: the same numbers in the same order as calling gsl_rng_get each time (so
 * determinism is untouched), without an indirect call in the middle of dependent work. For
 * GSL's mt19937 (common/rng.h's generator) a refill runs MT19937 itself in place on GSL's state
 * (gsl/rng/mt.c: the 624 words, then the index of the next one) and tempers the rest of the
 * state's words, all 624 after a regeneration, in loops the compiler vectorizes: ~0.7 ns a number
 * instead of ~6.4 through gsl_rng_get. rng_block_init checks on copies of the generator that
 * this gives gsl_rng_get's numbers and final state, else every refill calls gsl_rng_get. */
#define MT_N            624  /* MT19937 state words */
#define MT_M            397  /* MT19937 middle word offset */
#define SYNTH_RNG_BLOCK MT_N /* numbers per refill: one MT19937 state */

typedef struct mt_state { /* GSL's mt19937 state, gsl/rng/mt.c */
    unsigned long mt[MT_N];
    int mti; /* next word to temper; MT_N: regenerate first */
} mt_state;

typedef struct rng_block {
    gsl_rng *g;
    bool direct; /* g is GSL's mt19937 and mt_next reproduces it */
    uint32_t at; /* next unread value; SYNTH_RNG_BLOCK: empty */
    uint32_t v[SYNTH_RNG_BLOCK];
} rng_block;

/* Checks on copies of g that MT19937 in place reproduces gsl_rng_get, and empties the block. */
void rng_block_init(rng_block *b, gsl_rng *g);
/* The next SYNTH_RNG_BLOCK numbers of the generator into the block. */
void rng_block_refill(rng_block *b);

static inline uint32_t rng_block_u32(rng_block *b) {
    if (b->at == SYNTH_RNG_BLOCK) rng_block_refill(b);
    return b->v[b->at++];
}

static inline uint16_t alias_draw(const alias_cell *cell, uint32_t n, rng_block *g) {
    uint64_t x = (uint64_t)rng_block_u32(g) * n;
    uint32_t j = (uint32_t)(x >> 32), f = (uint32_t)x;
    const alias_cell c = cell[j];
    return (f >> ALIAS_BITS) < (c >> ALIAS_BITS) ? (uint16_t)j : (uint16_t)(c & ALIAS_MASK);
}

/* out[c] (c = 0..n-1) = P(X <= c) as a 32-bit threshold for X ~ Binomial(n, p); X = n beyond. */
void binomial_cdf_thresholds(uint32_t n, double p, uint32_t *out);

/* A draw from such a table: the first c with u < out[c], else n. */
static inline uint32_t binomial_draw(const uint32_t *cdf, uint32_t n, rng_block *g) {
    /* cdf is nondecreasing: the first c with u < cdf[c] is the count of c with cdf[c] <= u */
    const uint32_t u = rng_block_u32(g);
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++) c += u >= cdf[i];
    return c;
}

#endif
