/* Group-wise asymmetric int8/int4/int2 blocks and float conversions; layout in quant.h. */
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

#include "common/check.h"

static const quant_traits traits[] = {
    {PREC_BF16, "bf16", 16, 1, 2},
    {PREC_INT8, "int8", 8, QUANT_GROUP, sizeof(block_q8)},
    {PREC_INT4, "int4", 4, QUANT_GROUP, sizeof(block_q4)},
    {PREC_INT2, "int2", 2, QUANT_GROUP, sizeof(block_q2)},
};

const quant_traits *quant_traits_of(moesim_precision p) {
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(traits); i++)
        if (traits[i].prec == p) return &traits[i];
    return NULL;
}

bool quant_precision_parse(const char *name, moesim_precision *out) {
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(traits); i++)
        if (!strcmp(traits[i].name, name)) {
            *out = traits[i].prec;
            return true;
        }
    return false;
}

size_t quant_matrix_size_bytes(moesim_precision p, size_t rows, size_t cols) {
    const quant_traits *t = quant_traits_of(p);
    MOESIM_ASSERT(t && cols % t->block_weights == 0);
    return rows * (cols / t->block_weights) * t->block_bytes;
}

moesim_status quant_check_cols(moesim_precision p, size_t cols, const char *what,
                               moesim_error *err) {
    const quant_traits *t = quant_traits_of(p);
    if (!t)
        return moesim_fail(err, MOESIM_EINPUT, "%s: precision %d is not stored by the engine "
                           "(expected bf16, int8, int4 or int2)", what, (int)p);
    if (cols == 0 || cols % t->block_weights)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: %zu columns is not a multiple of the %s group size %u", what, cols,
                           t->name, t->block_weights);
    return MOESIM_OK;
}

float quant_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union {
        uint32_t u;
        float f;
    } v;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31) v.u = sign | 0x7f800000u | (man << 13);
    else v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}

uint16_t quant_f32_to_fp16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    uint16_t sign = (uint16_t)((v.u >> 16) & 0x8000);
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7e00;
    if (a >= 65520.0f) return sign | 0x7c00; /* rounds to infinity */
    if (a < 6.103515625e-05f) {              /* subnormal half: multiples of 2^-24 */
        float q = nearbyintf(ldexpf(a, 24)); /* default rounding mode: to nearest even */
        return sign | (uint16_t)q;
    }
    uint32_t u = v.u & 0x7fffffffu;
    uint32_t exp = (u >> 23) - 112, man = u & 0x7fffff;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* carries into the exponent fine */
    return sign | (uint16_t)h;
}

uint16_t quant_f32_to_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    if (isnan(f)) return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t rounding = 0x7fff + ((v.u >> 16) & 1);
    return (uint16_t)((v.u + rounding) >> 16);
}

/* One group: fp16 scale and minimum, codes by round-to-nearest against the stored values. */
static void quantize_group(const float *x, uint32_t levels, uint16_t *d_out, uint16_t *m_out,
                           uint8_t *codes) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < QUANT_GROUP; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    uint16_t m16 = quant_f32_to_fp16(lo);
    float m = quant_fp16_to_f32(m16);
    uint16_t d16 = quant_f32_to_fp16((hi - m) / (float)levels);
    float d = quant_fp16_to_f32(d16);
    float inv = d > 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < QUANT_GROUP; i++) {
        float q = nearbyintf((x[i] - m) * inv);
        if (q < 0) q = 0;
        if (q > (float)levels) q = (float)levels;
        codes[i] = (uint8_t)q;
    }
    *d_out = d16;
    *m_out = m16;
}

void quant_row_quantize_ref(moesim_precision p, const float *x, void *blocks, size_t cols) {
    MOESIM_ASSERT(cols % QUANT_GROUP == 0);
    uint8_t codes[QUANT_GROUP];
    for (size_t g = 0; g < cols / QUANT_GROUP; g++) {
        const float *xg = x + g * QUANT_GROUP;
        switch (p) {
        case PREC_INT8: {
            block_q8 *b = (block_q8 *)blocks + g;
            quantize_group(xg, 255, &b->d, &b->m, b->q);
            break;
        }
        case PREC_INT4: {
            block_q4 *b = (block_q4 *)blocks + g;
            quantize_group(xg, 15, &b->d, &b->m, codes);
            for (int i = 0; i < QUANT_GROUP / 2; i++)
                b->q[i] = (uint8_t)(codes[2 * i] | (codes[2 * i + 1] << 4));
            break;
        }
        case PREC_INT2: {
            block_q2 *b = (block_q2 *)blocks + g;
            quantize_group(xg, 3, &b->d, &b->m, codes);
            for (int i = 0; i < QUANT_GROUP / 4; i++)
                b->q[i] = (uint8_t)(codes[4 * i] | (codes[4 * i + 1] << 2) |
                                    (codes[4 * i + 2] << 4) | (codes[4 * i + 3] << 6));
            break;
        }
        default: MOESIM_UNREACHABLE();
        }
    }
}

void quant_row_dequantize(moesim_precision p, const void *blocks, float *y, size_t cols) {
    MOESIM_ASSERT(cols % QUANT_GROUP == 0);
    for (size_t g = 0; g < cols / QUANT_GROUP; g++) {
        float *yg = y + g * QUANT_GROUP;
        switch (p) {
        case PREC_INT8: {
            const block_q8 *b = (const block_q8 *)blocks + g;
            float d = quant_fp16_to_f32(b->d), m = quant_fp16_to_f32(b->m);
            for (int i = 0; i < QUANT_GROUP; i++) yg[i] = d * b->q[i] + m;
            break;
        }
        case PREC_INT4: {
            const block_q4 *b = (const block_q4 *)blocks + g;
            float d = quant_fp16_to_f32(b->d), m = quant_fp16_to_f32(b->m);
            for (int i = 0; i < QUANT_GROUP / 2; i++) {
                yg[2 * i] = d * (b->q[i] & 15) + m;
                yg[2 * i + 1] = d * (b->q[i] >> 4) + m;
            }
            break;
        }
        case PREC_INT2: {
            const block_q2 *b = (const block_q2 *)blocks + g;
            float d = quant_fp16_to_f32(b->d), m = quant_fp16_to_f32(b->m);
            for (int i = 0; i < QUANT_GROUP / 4; i++)
                for (int j = 0; j < 4; j++) yg[4 * i + j] = d * ((b->q[i] >> (2 * j)) & 3) + m;
            break;
        }
        default: MOESIM_UNREACHABLE();
        }
    }
}
