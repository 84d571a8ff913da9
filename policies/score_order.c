/* policies/score_order.h: ranks counted with AVX2 on x86-64, an insertion sort elsewhere. */
#include "policies/score_order.h"

#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define SCORE_ORDER_X86 1
#endif

/* Up to this many candidates an insertion sort is as fast: one token's guesses come ranked, so
 * each takes one compare. */
#define SCORE_ORDER_INSERTION_MAX 8

static uint32_t padded(uint32_t n) { return (n + 3) & ~3u; }

void score_order_init(score_order *o, uint32_t cap) {
    o->cap = cap;
#if SCORE_ORDER_X86
    o->avx2 = __builtin_cpu_supports("avx2");
#else
    o->avx2 = false;
#endif
    o->score = moesim_xcalloc(padded(cap), sizeof *o->score);
    o->id = moesim_xcalloc(padded(cap), sizeof *o->id);
    o->ranked = moesim_xcalloc(cap ? cap : 1, sizeof *o->ranked);
    o->ranked_score = moesim_xcalloc(cap ? cap : 1, sizeof *o->ranked_score);
}

void score_order_free(score_order *o) {
    free(o->score);
    free(o->id);
    free(o->ranked);
    free(o->ranked_score);
    memset(o, 0, sizeof *o);
}

static void insertion_sort(uint16_t *ids, double *scores, uint32_t n) {
    for (uint32_t i = 1; i < n; i++) {
        uint16_t e = ids[i];
        double s = scores[i];
        uint32_t j = i;
        for (; j > 0 && (scores[j - 1] < s || (scores[j - 1] == s && ids[j - 1] > e)); j--) {
            scores[j] = scores[j - 1];
            ids[j] = ids[j - 1];
        }
        scores[j] = s;
        ids[j] = e;
    }
}

#if SCORE_ORDER_X86
/* rank[i] = the candidates before i: a higher score, or the same and a lower id. The padding
 * (score -inf) is before none. */
__attribute__((target("avx2"))) static void rank_sort_avx2(score_order *o, uint16_t *ids,
                                                           double *scores, uint32_t n) {
    uint32_t n4 = padded(n);
    for (uint32_t i = 0; i < n; i++) o->score[i] = scores[i], o->id[i] = ids[i];
    for (uint32_t i = n; i < n4; i++) o->score[i] = -INFINITY, o->id[i] = 0;
    for (uint32_t i = 0; i < n; i++) {
        __m256d si = _mm256_set1_pd(o->score[i]), ii = _mm256_set1_pd(o->id[i]);
        __m256i before = _mm256_setzero_si256();
        for (uint32_t j = 0; j < n4; j += 4) {
            __m256d sj = _mm256_loadu_pd(o->score + j), ij = _mm256_loadu_pd(o->id + j);
            __m256d higher = _mm256_cmp_pd(sj, si, _CMP_GT_OQ);
            __m256d tie =
                _mm256_and_pd(_mm256_cmp_pd(sj, si, _CMP_EQ_OQ), _mm256_cmp_pd(ij, ii, _CMP_LT_OQ));
            /* a true lane is all ones: -1 as an integer */
            before = _mm256_sub_epi64(before, _mm256_castpd_si256(_mm256_or_pd(higher, tie)));
        }
        __m128i two =
            _mm_add_epi64(_mm256_castsi256_si128(before), _mm256_extracti128_si256(before, 1));
        uint64_t rank = (uint64_t)_mm_cvtsi128_si64(two) + (uint64_t)_mm_extract_epi64(two, 1);
        o->ranked[rank] = ids[i];
        o->ranked_score[rank] = scores[i];
    }
    memcpy(ids, o->ranked, n * sizeof *ids);
    memcpy(scores, o->ranked_score, n * sizeof *scores);
}
#endif

void score_order_sort(score_order *o, uint16_t *ids, double *scores, uint32_t n) {
    MOESIM_ASSERT(n <= o->cap);
#if SCORE_ORDER_X86
    if (o->avx2 && n > SCORE_ORDER_INSERTION_MAX) {
        rank_sort_avx2(o, ids, scores, n);
        return;
    }
#endif
    insertion_sort(ids, scores, n);
}
