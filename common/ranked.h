/* Whether a row of candidate scores is ranked: no score above the one before it, so the row
 * lists its candidates best first (a NaN counts as out of order). The trace format claims it of
 * every look-ahead row with /lookahead/scores' attribute `ranked` (traces/FORMAT.md), and a
 * policy that orders candidates by score keeps a ranked row's recorded order (FIRM-MoE's
 * top-K selection, policies/firm_moe.c). The writer and every reader of the scores look at each
 * row: four neighbours a compare where SSE2 is (the last four of a row overlapping the ones
 * before), which the compiler's own vectorizer did not do for a row's run-time length. */
#ifndef MOESIM_COMMON_RANKED_H
#define MOESIM_COMMON_RANKED_H

#include <stdbool.h>
#include <stdint.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static inline bool scores_ranked(const float *scores, uint32_t n) {
#if defined(__SSE2__)
    if (n >= 5) {
        int rises = 0; /* _mm_cmpnle_ps: !(a <= b), true for a NaN either side */
        uint32_t i = 1;
        for (; i + 4 <= n; i += 4)
            rises |= _mm_movemask_ps(
                _mm_cmpnle_ps(_mm_loadu_ps(scores + i), _mm_loadu_ps(scores + i - 1)));
        if (i < n)
            rises |= _mm_movemask_ps(
                _mm_cmpnle_ps(_mm_loadu_ps(scores + n - 4), _mm_loadu_ps(scores + n - 5)));
        return rises == 0;
    }
#endif
    uint32_t rises = 0;
    for (uint32_t i = 1; i < n; i++) rises |= !(scores[i] <= scores[i - 1]);
    return rises == 0;
}

#endif
