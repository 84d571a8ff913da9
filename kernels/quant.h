/* Weight storage formats of the engine: float conversions (bf16, fp16) and the group-wise
 * asymmetric integer block formats int8, int4 and int2 (configs/quant.ini describes the same
 * layout to the cost model).
 *
 * Layout (ggml style): a matrix of rows x cols is stored row by row; each row is cols / QUANT_GROUP
 * blocks of QUANT_GROUP = 64 consecutive weights along the row (the input dimension). A block holds
 * one fp16 scale d, one fp16 minimum m (the zero point), and the 64 codes q (unsigned, b bits):
 *     w = d * q + m,   q in [0, 2^b - 1]
 * int4 packs two codes per byte (weight 2i in the low nibble, 2i+1 in the high one); int2 packs
 * four (weight 4i + j in bits 2j..2j+1). Quantization is round-to-nearest against the fp16-rounded
 * d and m: the scalar quant_row_quantize_ref defines what is correct. Matrices whose cols are not
 * a multiple of QUANT_GROUP cannot be stored in these formats (quant_check_cols says so). */
#ifndef MOESIM_KERNELS_QUANT_H
#define MOESIM_KERNELS_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/precision.h"
#include "common/status.h"

#define QUANT_GROUP 64

typedef struct block_q8 {
    uint16_t d; /* fp16 scale */
    uint16_t m; /* fp16 minimum (zero point) */
    uint8_t q[QUANT_GROUP];
} block_q8;
typedef struct block_q4 {
    uint16_t d;
    uint16_t m;
    uint8_t q[QUANT_GROUP / 2];
} block_q4;
typedef struct block_q2 {
    uint16_t d;
    uint16_t m;
    uint8_t q[QUANT_GROUP / 4];
} block_q2;
_Static_assert(sizeof(block_q8) == 4 + QUANT_GROUP, "block_q8 must be packed: 68 bytes");
_Static_assert(sizeof(block_q4) == 4 + QUANT_GROUP / 2, "block_q4 must be packed: 36 bytes");
_Static_assert(sizeof(block_q2) == 4 + QUANT_GROUP / 4, "block_q2 must be packed: 20 bytes");

/* Traits of one stored precision (ggml's type_traits). Float formats have block_weights 1. */
typedef struct quant_traits {
    moesim_precision prec;
    const char *name;
    uint32_t bits;          /* per code */
    uint32_t block_weights; /* weights per block */
    uint32_t block_bytes;   /* bytes per block */
} quant_traits;

/* Traits of bf16, int8, int4, int2 (the precisions the engine stores); NULL for the others. */
const quant_traits *quant_traits_of(moesim_precision p);
/* The precision the engine stores under `name` ("bf16", "int8", "int4", "int2"). */
bool quant_precision_parse(const char *name, moesim_precision *out);
/* Bytes of a rows x cols matrix at precision p (p must have traits; cols checked by caller). */
size_t quant_matrix_size_bytes(moesim_precision p, size_t rows, size_t cols);
/* cols must be a positive multiple of QUANT_GROUP for the integer formats. */
moesim_status quant_check_cols(moesim_precision p, size_t cols, const char *what,
                               moesim_error *err);

/* Quantizes one row of `cols` floats into blocks of format p (int8/int4/int2). */
void quant_row_quantize_ref(moesim_precision p, const float *x, void *blocks, size_t cols);
/* Expands one quantized row back to floats. */
void quant_row_dequantize(moesim_precision p, const void *blocks, float *y, size_t cols);

/* Scalar conversions (round-to-nearest-even; NaN stays NaN). */
float quant_fp16_to_f32(uint16_t h);
uint16_t quant_f32_to_fp16(float f);
static inline float quant_bf16_to_f32(uint16_t b) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)b << 16};
    return v.f;
}
uint16_t quant_f32_to_bf16(float f);

#endif
