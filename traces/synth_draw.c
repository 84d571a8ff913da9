/* The synthesizer's sampling primitives (traces/synth_draw.h): building alias tables and binomial
 * CDF tables, and refilling the block of 32-bit numbers. */
/* GSL's inline gsl_rng_get (gsl_inline.h): the fallback block refill calls it in a loop */
#define HAVE_INLINE 1
#include "traces/synth_draw.h"

#include <math.h>
#include <string.h>

#include <gsl/gsl_randist.h>

#include "common/check.h"

/* Vose's alias method over weights w[0..n) (> 0): column j keeps j with the probability in
 * cell[j] (see alias_cell), else gives its alias. `scaled`, `small`, `large` are scratch [n]. */
void alias_build(const double *w, uint32_t n, alias_cell *cell, double *scaled, uint32_t *small,
                 uint32_t *large) {
    double total = 0;
    for (uint32_t e = 0; e < n; e++) total += w[e];
    MOESIM_ASSERT(total > 0 && isfinite(total));
    uint32_t ns = 0, nl = 0;
    for (uint32_t e = 0; e < n; e++) {
        scaled[e] = w[e] * n / total;
        if (scaled[e] < 1.0)
            small[ns++] = e;
        else
            large[nl++] = e;
    }
    while (ns && nl) {
        uint32_t s = small[--ns], g = large[nl - 1];
        cell[s] = alias_cell_make(scaled[s], g);
        scaled[g] -= 1.0 - scaled[s];
        if (scaled[g] < 1.0) {
            nl--;
            small[ns++] = g;
        }
    }
    while (nl) { /* numerically ~1: keep the column itself */
        uint32_t g = large[--nl];
        cell[g] = alias_cell_make(1, g); /* alias = itself: always kept */
    }
    while (ns) {
        uint32_t s = small[--ns];
        cell[s] = alias_cell_make(1, s);
    }
}

/* One MT19937 recurrence step: the new word from words i, i + 1 and the one M ahead. */
static inline unsigned long mt_twist(unsigned long wi, unsigned long wi1, unsigned long wm) {
    const unsigned long y = (wi & 0x80000000UL) | (wi1 & 0x7fffffffUL);
    return wm ^ (y >> 1) ^ (0x9908b0dfUL & (0 - (y & 1)));
}

/* MT19937's output function on a state word (< 2^32). */
static inline uint32_t mt_temper(unsigned long w) {
    uint32_t y = (uint32_t)w;
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

/* out[first..MT_N) = the next MT_N - first numbers of an mt19937 state (its words not yet
 * used, after a regeneration when none is left), leaving it as that many mt_get calls would;
 * returns first. The fixed-length loops vectorize (the first split to an even count). */
static uint32_t mt_next(mt_state *s, uint32_t out[MT_N]) {
    unsigned long *mt = s->mt;
    if (s->mti >= MT_N) {
        uint32_t i = 0;
        for (; i < MT_N - MT_M - 1; i++) mt[i] = mt_twist(mt[i], mt[i + 1], mt[i + MT_M]);
        for (; i < MT_N - MT_M; i++) mt[i] = mt_twist(mt[i], mt[i + 1], mt[i + MT_M]);
        for (; i < MT_N - 1; i++) mt[i] = mt_twist(mt[i], mt[i + 1], mt[i + MT_M - MT_N]);
        mt[MT_N - 1] = mt_twist(mt[MT_N - 1], mt[0], mt[MT_M - 1]);
        s->mti = 0;
    }
    const uint32_t first = (uint32_t)s->mti;
    if (first == 0)
        for (uint32_t i = 0; i < MT_N; i++) out[i] = mt_temper(mt[i]);
    else
        for (uint32_t i = first; i < MT_N; i++) out[i] = mt_temper(mt[i]);
    s->mti = MT_N;
    return first;
}

/* Whether mt_next on g's state gives gsl_rng_get's numbers and leaves the same state: tried on
 * copies of g over two regenerations. */
static bool mt_matches_gsl(const gsl_rng *g) {
    if (g->type != gsl_rng_mt19937 || gsl_rng_size(g) != sizeof(mt_state)) return false;
    gsl_rng *a = gsl_rng_clone(g), *b = gsl_rng_clone(g);
    mt_state *sa = gsl_rng_state(a), *sb = gsl_rng_state(b);
    bool same = sb->mti >= 0 && sb->mti <= MT_N;
    uint32_t block[MT_N];
    for (uint32_t pass = 0; same && pass < 3; pass++)
        for (uint32_t i = mt_next(sb, block); same && i < MT_N; i++)
            same = block[i] == (uint32_t)gsl_rng_get(a);
    same = same && sa->mti == sb->mti && memcmp(sa->mt, sb->mt, sizeof sa->mt) == 0;
    gsl_rng_free(b);
    gsl_rng_free(a);
    return same;
}

void rng_block_init(rng_block *b, gsl_rng *g) {
    b->g = g;
    b->direct = mt_matches_gsl(g);
    b->at = SYNTH_RNG_BLOCK;
}

void rng_block_refill(rng_block *b) {
    if (b->direct) {
        b->at = mt_next(gsl_rng_state(b->g), b->v);
    } else {
        for (uint32_t i = 0; i < SYNTH_RNG_BLOCK; i++) b->v[i] = (uint32_t)gsl_rng_get(b->g);
        b->at = 0;
    }
}

/* out[c] (c = 0..n-1) = P(X <= c) as a 32-bit threshold for X ~ Binomial(n, p); X = n beyond. */
void binomial_cdf_thresholds(uint32_t n, double p, uint32_t *out) {
    double cdf = 0;
    for (uint32_t c = 0; c < n; c++) {
        cdf += gsl_ran_binomial_pdf(c, p, n);
        out[c] = prob_threshold(cdf);
    }
}
