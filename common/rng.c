/* GSL-backed generators; see rng.h. */
#include "common/rng.h"

#include <stdlib.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/hash.h"

struct rng {
    gsl_rng *g;
};

rng *rng_create(uint64_t seed) {
    rng *r = moesim_xmalloc(sizeof *r);
    r->g = gsl_rng_alloc(gsl_rng_mt19937);
    MOESIM_ASSERT(r->g);
    /* mt19937 takes 32 bits of seed: fold the 64-bit seed so both halves matter;
     * GSL maps seed 0 to its default seed, so avoid it. */
    uint64_t mixed = hash_splitmix64(seed);
    unsigned long s = (unsigned long)((mixed ^ (mixed >> 32)) & 0xffffffffu);
    gsl_rng_set(r->g, s ? s : 1);
    return r;
}

rng *rng_create_stream(uint64_t seed, uint64_t stream) {
    return rng_create(hash_splitmix64(seed ^ hash_splitmix64(stream + 0x5bd1e995u)));
}

void rng_destroy(rng *r) {
    if (!r) return;
    gsl_rng_free(r->g);
    free(r);
}

double rng_uniform(rng *r) { return gsl_rng_uniform(r->g); }
double rng_uniform_pos(rng *r) { return gsl_rng_uniform_pos(r->g); }

uint64_t rng_below(rng *r, uint64_t n) {
    MOESIM_ASSERT(n >= 1);
    if (n <= gsl_rng_max(r->g) - gsl_rng_min(r->g)) return gsl_rng_uniform_int(r->g, n);
    /* wider than one draw: combine two 32-bit draws, reject the biased tail */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = ((uint64_t)gsl_rng_get(r->g) << 32) ^ gsl_rng_get(r->g);
    } while (x >= limit);
    return x % n;
}

gsl_rng *rng_gsl(rng *r) { return r->g; }
