/* Random numbers through GSL (gsl_rng_mt19937), always seeded explicitly: there is no global
 * generator. A run derives one independent stream per purpose from its seed with
 * rng_create_stream(seed, stream_id), so adding a consumer of randomness in one place does not
 * shift the numbers drawn in another. */
#ifndef MOESIM_COMMON_RNG_H
#define MOESIM_COMMON_RNG_H

#include <stdint.h>

#include <gsl/gsl_rng.h>

typedef struct rng rng;

rng *rng_create(uint64_t seed);                         /* caller owns; rng_destroy */
rng *rng_create_stream(uint64_t seed, uint64_t stream); /* independent stream of one seed */
void rng_destroy(rng *r);                               /* accepts NULL */

double rng_uniform(rng *r);                /* [0, 1) */
double rng_uniform_pos(rng *r);            /* (0, 1) */
uint64_t rng_below(rng *r, uint64_t n);    /* uniform in [0, n), n >= 1 */
gsl_rng *rng_gsl(rng *r);                  /* borrowed, for gsl_ran_* distributions */

#endif
