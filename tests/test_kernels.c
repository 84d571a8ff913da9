/* CPU reference kernels and the int8/int4/int2 block formats (kernels/). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

TestSuite(kernels);

static void fill_normal(float *x, size_t n, uint64_t seed, float scale) {
    rng *r = rng_create(seed);
    for (size_t i = 0; i < n; i++) {
        double u1 = rng_uniform_pos(r), u2 = rng_uniform(r);
        x[i] = scale * (float)(sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
    }
    rng_destroy(r);
}

typedef struct quant_case {
    moesim_precision p;
    int levels; /* 2^bits - 1 */
} quant_case;

static const quant_case quant_cases[] = {{PREC_INT8, 255}, {PREC_INT4, 15}, {PREC_INT2, 3}};

Test(kernels, block_structs_have_the_documented_sizes) {
    cr_assert_eq(quant_traits_of(PREC_INT8)->block_bytes, 68);
    cr_assert_eq(quant_traits_of(PREC_INT4)->block_bytes, 36);
    cr_assert_eq(quant_traits_of(PREC_INT2)->block_bytes, 20);
    cr_assert_eq(quant_matrix_size_bytes(PREC_INT4, 3, 128), 3 * 2 * 36);
    cr_assert_null(quant_traits_of(PREC_FP8));
}

Test(kernels, dequantized_weights_lie_within_half_a_step_of_the_originals) {
    enum { COLS = 256 };
    float x[COLS], y[COLS];
    fill_normal(x, COLS, 7, 0.1f);
    for (size_t c = 0; c < sizeof quant_cases / sizeof quant_cases[0]; c++) {
        uint8_t blocks[COLS / QUANT_GROUP * sizeof(block_q8)];
        quant_row_quantize_ref(quant_cases[c].p, x, blocks, COLS);
        quant_row_dequantize(quant_cases[c].p, blocks, y, COLS);
        for (int g = 0; g < COLS / QUANT_GROUP; g++) {
            float lo = x[g * 64], hi = x[g * 64];
            for (int i = 1; i < 64; i++) {
                lo = fminf(lo, x[g * 64 + i]);
                hi = fmaxf(hi, x[g * 64 + i]);
            }
            /* half a step, plus the fp16 rounding of scale and minimum */
            float tol = 0.5f * (hi - lo) / quant_cases[c].levels * 1.01f + 1e-3f * (hi - lo);
            for (int i = 0; i < 64; i++)
                cr_assert(fabsf(y[g * 64 + i] - x[g * 64 + i]) <= tol,
                          "%s: weight %d: %g -> %g (tol %g)",
                          quant_traits_of(quant_cases[c].p)->name, g * 64 + i, x[g * 64 + i],
                          y[g * 64 + i], tol);
        }
    }
}

Test(kernels, quantized_matvec_equals_matvec_of_dequantized_weights) {
    enum { ROWS = 5, COLS = 192 };
    float w[ROWS * COLS], x[COLS], deq[ROWS * COLS], want[ROWS], got[ROWS];
    fill_normal(w, ROWS * COLS, 11, 0.05f);
    fill_normal(x, COLS, 12, 1.0f);
    for (size_t c = 0; c < sizeof quant_cases / sizeof quant_cases[0]; c++) {
        moesim_precision p = quant_cases[c].p;
        size_t row_bytes = quant_matrix_size_bytes(p, 1, COLS);
        uint8_t *q = malloc(row_bytes * ROWS);
        for (int r = 0; r < ROWS; r++) {
            quant_row_quantize_ref(p, w + r * COLS, q + r * row_bytes, COLS);
            quant_row_dequantize(p, q + r * row_bytes, deq + r * COLS, COLS);
        }
        kern_matvec_f32_cpu(want, deq, x, ROWS, COLS);
        kern_matvec_quant_cpu(got, p, q, x, ROWS, COLS);
        for (int r = 0; r < ROWS; r++)
            cr_assert(fabsf(got[r] - want[r]) <= 1e-4f * (1 + fabsf(want[r])), "%s row %d: %g vs %g",
                      quant_traits_of(p)->name, r, got[r], want[r]);
        free(q);
    }
}

Test(kernels, half_precision_conversions_round_to_nearest) {
    const float vals[] = {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.1f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        float back = quant_fp16_to_f32(quant_f32_to_fp16(vals[i]));
        cr_assert(fabsf(back - vals[i]) <= fabsf(vals[i]) * 0x1p-11f, "%g -> %g", vals[i], back);
    }
    cr_assert(isinf(quant_fp16_to_f32(quant_f32_to_fp16(1e6f))));
    cr_assert_eq(quant_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_float_eq(quant_bf16_to_f32(quant_f32_to_bf16(3.14159f)), 3.140625f, 0);
}

Test(kernels, bf16_matvec_matches_fp32_on_bf16_exact_values) {
    enum { ROWS = 3, COLS = 19 };
    float w[ROWS * COLS], x[COLS], want[ROWS], got[ROWS];
    uint16_t wb[ROWS * COLS];
    fill_normal(w, ROWS * COLS, 3, 1.0f);
    fill_normal(x, COLS, 4, 1.0f);
    for (int i = 0; i < ROWS * COLS; i++) {
        wb[i] = quant_f32_to_bf16(w[i]);
        w[i] = quant_bf16_to_f32(wb[i]);
    }
    kern_matvec_f32_cpu(want, w, x, ROWS, COLS);
    kern_matvec_bf16_cpu(got, wb, x, ROWS, COLS);
    for (int r = 0; r < ROWS; r++) cr_assert_float_eq(got[r], want[r], 0);
}

Test(kernels, topk_returns_the_largest_in_descending_order) {
    const float x[] = {0.1f, 0.7f, 0.3f, 0.7f, -1.0f, 0.9f};
    uint32_t ids[3];
    float vals[3];
    kern_topk_cpu(x, 6, 3, ids, vals);
    cr_assert_eq(ids[0], 5);
    cr_assert_eq(ids[1], 1); /* tie: lower index first */
    cr_assert_eq(ids[2], 3);
    cr_assert_float_eq(vals[2], 0.7f, 0);
}

Test(kernels, attention_over_one_position_returns_its_value) {
    /* two heads sharing one KV head: with a single cached position, softmax is 1 */
    float q[2 * 4] = {1, 2, 3, 4, -1, 0, 1, 0}, k[4] = {0.5f, 0.5f, 0, 1}, v[4] = {9, 8, 7, 6};
    float out[8], probs[2];
    kern_attention_cpu(out, probs, q, k, v, 2, 1, 4, 1);
    for (int i = 0; i < 8; i++) cr_assert_float_eq(out[i], v[i % 4], 1e-6);
    cr_assert_float_eq(probs[0], 1.0f, 1e-7);
}

Test(kernels, rope_at_position_zero_is_identity_and_preserves_norm_elsewhere) {
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    memcpy(y, x, sizeof x);
    kern_rope_cpu(y, 1, 8, 0, 10000.0);
    for (int i = 0; i < 8; i++) cr_assert_float_eq(y[i], x[i], 0);
    kern_rope_cpu(y, 1, 8, 17, 10000.0);
    for (int i = 0; i < 4; i++)
        cr_assert_float_eq(y[i] * y[i] + y[i + 4] * y[i + 4], x[i] * x[i] + x[i + 4] * x[i + 4],
                           1e-4);
}
