/* The chunk codec's byte shuffle (traces/h5_chunks.c): HDF5's layout, and the inverse, at every
 * element size the trace uses, at lengths that leave a tail past the vector steps, whole and a
 * prefix (the real elements of a short last chunk); and rows taken out of a chunk kept shuffled,
 * at every offset around the vector steps. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "traces/h5_chunks.h"

TestSuite(h5_chunks);

/* Element counts around the 16-element vector step: none, a tail alone, whole steps, a tail
 * after whole steps, and a chunk-sized odd count. */
static const size_t lengths[] = {0, 1, 2, 7, 15, 16, 17, 31, 32, 33, 47, 1000, 65537};
/* 2 and 4: the trace's sizes (vector steps); 1, 3, 8: byte by byte throughout. */
static const size_t elem_sizes[] = {1, 2, 3, 4, 8};

/* Bytes that differ at every position and plane (an xorshift stream). */
static void fill_bytes(unsigned char *p, size_t len, uint32_t seed) {
    uint32_t x = seed | 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

Test(h5_chunks, shuffle_puts_byte_j_of_element_i_at_j_n_plus_i_and_unshuffle_undoes_it) {
    for (size_t a = 0; a < sizeof lengths / sizeof lengths[0]; a++)
        for (size_t b = 0; b < sizeof elem_sizes / sizeof elem_sizes[0]; b++) {
            const size_t n = lengths[a], s = elem_sizes[b], len = n * s;
            /* one spare byte after each buffer: a step past the end would overwrite it */
            unsigned char *elems = malloc(len + 1), *planes = malloc(len + 1);
            unsigned char *back = malloc(len + 1);
            fill_bytes(elems, len, (uint32_t)(n * 31 + s));
            planes[len] = back[len] = 0xA5;
            h5_shuffle_bytes(planes, elems, n, s);
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < s; j++)
                    cr_assert_eq(planes[j * n + i], elems[i * s + j],
                                 "n %zu, size %zu: byte %zu of element %zu misplaced", n, s, j, i);
            h5_unshuffle_bytes(back, planes, n, n, s);
            cr_assert(memcmp(back, elems, len) == 0, "n %zu, size %zu: no round trip", n, s);
            cr_assert(planes[len] == 0xA5 && back[len] == 0xA5,
                      "n %zu, size %zu: wrote past the end", n, s);
            /* the real elements of a short last chunk: a prefix, nothing written after it */
            const size_t n_out = n / 2 + (n % 2);
            memset(back, 0xA5, len + 1);
            h5_unshuffle_bytes(back, planes, n, n_out, s);
            cr_assert(memcmp(back, elems, n_out * s) == 0, "n %zu, size %zu: prefix of %zu", n, s,
                      n_out);
            for (size_t i = n_out * s; i <= len; i++)
                cr_assert_eq(back[i], 0xA5, "n %zu, size %zu: prefix of %zu wrote byte %zu", n, s,
                             n_out, i);
            free(elems);
            free(planes);
            free(back);
        }
}

Test(h5_chunks, take_elems_unshuffles_any_range_of_a_chunk_kept_shuffled) {
    for (size_t a = 0; a < sizeof lengths / sizeof lengths[0]; a++)
        for (size_t b = 0; b < sizeof elem_sizes / sizeof elem_sizes[0]; b++) {
            const size_t n = lengths[a], s = elem_sizes[b], len = n * s;
            unsigned char *elems = malloc(len + 1), *chunk = malloc(len + 1);
            unsigned char *out = malloc(len + 1);
            fill_bytes(elems, len, (uint32_t)(n * 17 + s));
            /* as the codec stores it: shuffled unless single bytes or a single element */
            if (chunk_is_shuffled(len, s))
                h5_shuffle_bytes(chunk, elems, n, s);
            else
                memcpy(chunk, elems, len);
            cr_assert_eq(chunk_is_shuffled(len, s), s > 1 && n > 1, "n %zu, size %zu", n, s);
            /* ranges starting on and off the 16-element steps, short and to the end */
            const size_t firsts[] = {0, 1, 3, 16, 17, n / 2, n ? n - 1 : 0};
            for (size_t f = 0; f < sizeof firsts / sizeof firsts[0]; f++) {
                const size_t first = firsts[f];
                if (first > n) continue;
                const size_t counts[] = {0, 1, 15, 16, 33, n - first};
                for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                    const size_t count = counts[c];
                    if (first + count > n) continue;
                    memset(out, 0xA5, len + 1);
                    chunk_take_elems(out, chunk, len, s, first, count);
                    cr_assert(memcmp(out, elems + first * s, count * s) == 0,
                              "n %zu, size %zu: elements %zu + %zu", n, s, first, count);
                    for (size_t i = count * s; i <= len; i++)
                        cr_assert_eq(out[i], 0xA5, "n %zu, size %zu: %zu + %zu wrote byte %zu", n,
                                     s, first, count, i);
                }
            }
            free(elems);
            free(chunk);
            free(out);
        }
}
