/* Belady's minimum loads (policies/belady.h): next uses found in one backward pass, then the
 * cache replayed with a scan of its `capacity` entries per miss (capacities here are a pool of
 * experts, hundreds at most). */
#include "policies/belady.h"

#include <stdlib.h>

#include "common/alloc.h"
#include "common/check.h"

#define NEVER SIZE_MAX

uint64_t belady_min_loads(const uint32_t *seq, size_t n, uint32_t n_ids, uint32_t capacity) {
    MOESIM_ASSERT(capacity >= 1 && n_ids >= 1);
    size_t *next = moesim_xmalloc((n ? n : 1) * sizeof *next);
    size_t *seen = moesim_xmalloc((size_t)n_ids * sizeof *seen);
    for (uint32_t id = 0; id < n_ids; id++) seen[id] = NEVER;
    for (size_t i = n; i-- > 0;) {
        MOESIM_ASSERT(seq[i] < n_ids);
        next[i] = seen[seq[i]];
        seen[seq[i]] = i;
    }
    /* seen[] is reused: the cache slot of a held id, or NEVER */
    for (uint32_t id = 0; id < n_ids; id++) seen[id] = NEVER;
    uint32_t *held = moesim_xmalloc((size_t)capacity * sizeof *held);
    size_t *held_next = moesim_xmalloc((size_t)capacity * sizeof *held_next);
    uint32_t n_held = 0;
    uint64_t loads = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = seq[i];
        size_t at = seen[id];
        if (at == NEVER) {
            loads++;
            if (n_held < capacity) {
                at = n_held++;
            } else {
                at = 0;
                for (uint32_t k = 1; k < n_held; k++)
                    if (held_next[k] > held_next[at]) at = k;
                seen[held[at]] = NEVER;
            }
            held[at] = id;
            seen[id] = at;
        }
        held_next[at] = next[i];
    }
    free(next);
    free(seen);
    free(held);
    free(held_next);
    return loads;
}
