/* Plain C references of the ops in kernels/kernels.h. They define correct results for the CUDA
 * kernels; they are written for clarity first and vectorizable inner loops second (fixed-width
 * partial sums, combined in a fixed order, so results are deterministic). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#define LANES 8

static float sum_lanes(const float acc[LANES]) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void kern_rmsnorm_cpu(float *y, const float *x, const float *w, size_t n, float eps) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (size_t i = 0; i < n; i++) y[i] = (x[i] * inv) * w[i];
}

static float dot_f32(const float *a, const float *b, size_t n) {
    float acc[LANES] = {0};
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * b[i + j];
    float s = sum_lanes(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void kern_matvec_f32_cpu(float *y, const float *w, const float *x, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) y[r] = dot_f32(w + r * cols, x, cols);
}

void kern_matvec_bf16_cpu(float *y, const uint16_t *w, const float *x, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) {
        const uint16_t *wr = w + r * cols;
        float acc[LANES] = {0};
        size_t i = 0;
        for (; i + LANES <= cols; i += LANES)
            for (int j = 0; j < LANES; j++) {
                uint32_t u = (uint32_t)wr[i + j] << 16;
                float f;
                memcpy(&f, &u, sizeof f);
                acc[j] += f * x[i + j];
            }
        float s = sum_lanes(acc);
        for (; i < cols; i++) s += quant_bf16_to_f32(wr[i]) * x[i];
        y[r] = s;
    }
}

/* sum_i (d q_i + m) x_i = d * sum_i q_i x_i + m * sum_i x_i, per group of QUANT_GROUP. The sums
 * of x per group are the same for every row, so a matvec computes them once (x_sums). Each block's
 * codes are first widened into a float array in weight order, then dotted with fixed lanes: two
 * loops without cross-iteration dependencies that the compiler vectorizes. */
static float dot_group(const float codes[QUANT_GROUP], const float *x) {
    float acc[LANES] = {0};
    for (int i = 0; i < QUANT_GROUP; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += codes[i + j] * x[i + j];
    return sum_lanes(acc);
}

static void unpack_q8(const uint8_t *q, float codes[QUANT_GROUP]) {
    for (int i = 0; i < QUANT_GROUP; i++) codes[i] = (float)q[i];
}

static void unpack_q4(const uint8_t *q, float codes[QUANT_GROUP]) {
    for (int i = 0; i < QUANT_GROUP / 2; i++) {
        codes[2 * i] = (float)(q[i] & 15);
        codes[2 * i + 1] = (float)(q[i] >> 4);
    }
}

static void unpack_q2(const uint8_t *q, float codes[QUANT_GROUP]) {
    for (int i = 0; i < QUANT_GROUP / 4; i++)
        for (int j = 0; j < 4; j++) codes[4 * i + j] = (float)((q[i] >> (2 * j)) & 3);
}

/* One row of blocks of format p. Always inlined with a constant p, so each format gets its own
 * loop with the unpacker inlined (a function pointer here costs half the speed). */
static inline __attribute__((always_inline)) float dot_row_quant(const uint8_t *row,
                                                                 moesim_precision p, const float *x,
                                                                 const float *x_sums,
                                                                 size_t n_blocks) {
    size_t block_bytes = p == PREC_INT8   ? sizeof(block_q8)
                         : p == PREC_INT4 ? sizeof(block_q4)
                                          : sizeof(block_q2);
    float s = 0, codes[QUANT_GROUP];
    for (size_t g = 0; g < n_blocks; g++, row += block_bytes) {
        uint16_t d, m;
        memcpy(&d, row, sizeof d); /* block layout: d, m, q (quant.h) */
        memcpy(&m, row + 2, sizeof m);
        if (p == PREC_INT8)
            unpack_q8(row + 4, codes);
        else if (p == PREC_INT4)
            unpack_q4(row + 4, codes);
        else
            unpack_q2(row + 4, codes);
        s += quant_fp16_to_f32(d) * dot_group(codes, x + g * QUANT_GROUP) +
             quant_fp16_to_f32(m) * x_sums[g];
    }
    return s;
}

#define X_SUMS_STACK 1024 /* groups: rows of up to 65536 weights need no allocation */

void kern_matvec_quant_cpu(float *y, moesim_precision p, const void *w, const float *x, size_t rows,
                           size_t cols) {
    MOESIM_ASSERT(cols % QUANT_GROUP == 0);
    size_t nb = cols / QUANT_GROUP;
    float stack_sums[X_SUMS_STACK];
    float *x_sums = nb <= X_SUMS_STACK ? stack_sums : moesim_xmalloc(nb * sizeof *x_sums);
    for (size_t g = 0; g < nb; g++) {
        float acc[LANES] = {0};
        for (int i = 0; i < QUANT_GROUP; i += LANES)
            for (int j = 0; j < LANES; j++) acc[j] += x[g * QUANT_GROUP + i + j];
        x_sums[g] = sum_lanes(acc);
    }
    const uint8_t *wb = w;
    switch (p) {
    case PREC_INT8:
        for (size_t r = 0; r < rows; r++)
            y[r] = dot_row_quant(wb + r * nb * sizeof(block_q8), PREC_INT8, x, x_sums, nb);
        break;
    case PREC_INT4:
        for (size_t r = 0; r < rows; r++)
            y[r] = dot_row_quant(wb + r * nb * sizeof(block_q4), PREC_INT4, x, x_sums, nb);
        break;
    case PREC_INT2:
        for (size_t r = 0; r < rows; r++)
            y[r] = dot_row_quant(wb + r * nb * sizeof(block_q2), PREC_INT2, x, x_sums, nb);
        break;
    default:
        MOESIM_UNREACHABLE();
    }
    if (x_sums != stack_sums) free(x_sums);
}

void kern_rope_cpu(float *x, size_t n_heads, size_t head_dim, uint32_t pos, double theta) {
    size_t half = head_dim / 2;
    for (size_t i = 0; i < half; i++) {
        /* as Hugging Face computes it: fp32 inverse frequency, fp32 angle */
        float inv_freq = 1.0f / powf((float)theta, (float)(2 * i) / (float)head_dim);
        float angle = (float)pos * inv_freq;
        float c = cosf(angle), s = sinf(angle);
        for (size_t h = 0; h < n_heads; h++) {
            float *xh = x + h * head_dim;
            float a = xh[i], b = xh[i + half];
            xh[i] = a * c - b * s;
            xh[i + half] = b * c + a * s;
        }
    }
}

void kern_softmax_cpu(float *x, size_t n) {
    float mx = x[0];
    for (size_t i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (size_t i = 0; i < n; i++) x[i] *= inv;
}

void kern_swiglu_cpu(float *h, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        h[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void kern_attention_cpu(float *out, float *probs, const float *q, const float *k, const float *v,
                        size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t n_ctx) {
    MOESIM_ASSERT(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && n_ctx > 0);
    size_t group = n_heads / n_kv_heads, kv_stride = n_kv_heads * head_dim;
    float scale = 1.0f / sqrtf((float)head_dim);
    for (size_t h = 0; h < n_heads; h++) {
        const float *qh = q + h * head_dim;
        size_t kvh = h / group;
        float *p = probs + h * n_ctx;
        for (size_t t = 0; t < n_ctx; t++)
            p[t] = dot_f32(qh, k + t * kv_stride + kvh * head_dim, head_dim) * scale;
        kern_softmax_cpu(p, n_ctx);
        float *oh = out + h * head_dim;
        memset(oh, 0, head_dim * sizeof *oh);
        for (size_t t = 0; t < n_ctx; t++) {
            const float *vt = v + t * kv_stride + kvh * head_dim;
            for (size_t i = 0; i < head_dim; i++) oh[i] += p[t] * vt[i];
        }
    }
}

void kern_topk_cpu(const float *x, size_t n, size_t k, uint32_t *ids, float *vals) {
    MOESIM_ASSERT(k <= n);
    /* selection by insertion into a sorted prefix: k is small (<= 64 for routers) */
    size_t have = 0;
    for (size_t i = 0; i < n; i++) {
        float xi = x[i];
        if (have == k && !(xi > vals[k - 1])) continue;
        size_t j = have < k ? have++ : k - 1;
        while (j > 0 && xi > vals[j - 1]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = xi;
        ids[j] = (uint32_t)i;
    }
}
