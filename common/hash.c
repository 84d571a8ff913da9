/* FNV-1a and SplitMix64; see hash.h. */
#include "common/hash.h"

#include <string.h>

uint64_t hash_fnv1a64(const void *data, size_t len, uint64_t h) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t hash_fnv1a64_str(const char *s, uint64_t h) { return hash_fnv1a64(s, strlen(s), h); }

uint64_t hash_splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
