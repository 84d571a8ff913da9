/* Whether a row of candidate scores is ranked: no score above the one before it, so the row
 * lists its candidates best first (a NaN counts as out of order). The trace format claims it of
 * every look-ahead row with /lookahead/scores' attribute `ranked` (traces/FORMAT.md), and a
 * policy that orders candidates by score keeps a ranked row's recorded order (FIRM-MoE's
 * top-K selection, policies/firm_moe.c). */
#ifndef MOESIM_COMMON_RANKED_H
#define MOESIM_COMMON_RANKED_H

#include <stdbool.h>
#include <stdint.h>

static inline bool scores_ranked(const float *scores, uint32_t n) {
    uint32_t rises = 0; /* no early exit and no bool: so the loop vectorizes */
    for (uint32_t i = 1; i < n; i++) rises |= !(scores[i] <= scores[i - 1]);
    return rises == 0;
}

#endif
