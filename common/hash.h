/* Stable 64-bit hashes: FNV-1a for bytes (configuration keys, file fingerprints) and SplitMix64
 * for mixing integers (seed derivation). Stable across runs, machines and versions: results
 * files are keyed by them. */
#ifndef MOESIM_COMMON_HASH_H
#define MOESIM_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

#define MOESIM_FNV1A64_INIT 0xcbf29ce484222325ull

uint64_t hash_fnv1a64(const void *data, size_t len, uint64_t h); /* h = MOESIM_FNV1A64_INIT to start */
uint64_t hash_fnv1a64_str(const char *s, uint64_t h);
uint64_t hash_splitmix64(uint64_t x); /* bijective mixer */

#endif
