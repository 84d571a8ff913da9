/* Each CUDA kernel (kernels/cuda/kernels_cuda.h) against its CPU reference (kernels/kernels.h) on
 * seeded random inputs, over shapes that hit every code path: rows and columns that are not
 * multiples of the warp, of the 8-wide bf16 vector, or of four quant blocks (unaligned rows take
 * the 32-bit load path), more than one 32-block chunk per row, and batch sizes that are not tiles.
 * Skipped (exit 77) without a GPU.
 *
 * Tolerances are named below. Products are compared by NMSE = sum (gpu - cpu)^2 / sum cpu^2 (as
 * ggml's test-backend-ops), elementwise ops by |gpu - cpu| <= atol + rtol |cpu| (as llm.c). */
#include <cuda_runtime.h>
#include <gsl/gsl_randist.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "support/gpu_test.h"

/* Same weights, same fp32 accumulation, different summation order: relative errors ~1e-7, so
 * NMSE ~1e-13; 1e-9 leaves four orders of margin while a misdecoded code (a swapped nibble, a
 * wrong scale) gives NMSE > 1e-3. */
#define MATVEC_NMSE_MAX 1e-9
/* cuBLAS multiplies bf16 by bf16: x is rounded to bf16 first (relative error <= 2^-9, uniform),
 * so NMSE ~ (2^-9)^2 / 3 ~ 1.3e-6 on random data; 2e-5 bounds that with margin while a wrong
 * transpose or leading dimension gives NMSE ~ 1. */
#define CUBLAS_NMSE_MAX 2e-5
/* RMSNorm: both sum squares in double; the last multiply may differ by an ulp. */
#define RMSNORM_ATOL 1e-6f
#define RMSNORM_RTOL 1e-6f
/* RoPE: CUDA's powf / sinf / cosf are within 2 ulp of glibc's; an ulp of the inverse frequency
 * becomes pos * 2^-24 rad of angle, i.e. ~2.4e-4 at pos 4095 for |x| ~ 1. */
#define ROPE_ATOL 1e-3f
#define ROPE_RTOL 1e-5f
/* expf within 2 ulp; softmax sums in double on both sides. */
#define SOFTMAX_ATOL 1e-7f
#define SOFTMAX_RTOL 1e-5f
#define SWIGLU_ATOL  1e-6f
#define SWIGLU_RTOL  1e-5f
/* Attention: reordered fp32 dot products (scores), expf, then the same-order weighted sum. */
#define ATTN_ATOL 2e-6f
#define ATTN_RTOL 1e-4f

typedef struct kernels_fixture {
    rng *r;
    cudaStream_t s;
} kernels_fixture;

static kernels_fixture fx;

static void setup(void) {
    fx.r = rng_create(20261123);
    cr_assert_eq(cudaStreamCreate(&fx.s), cudaSuccess);
}
static void teardown(void) {
    cudaStreamDestroy(fx.s);
    rng_destroy(fx.r);
}

TestSuite(gpu_kernels, .init = setup, .fini = teardown);

#define CHECK_CUDA(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        cr_assert_eq(e_, cudaSuccess, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                  \
                     cudaGetErrorString(e_));                                                      \
    } while (0)

static float *randn(size_t n, double sigma) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)gsl_ran_gaussian(rng_gsl(fx.r), sigma);
    return x;
}

static void *to_dev(const void *h, size_t bytes) {
    void *d;
    CHECK_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CHECK_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void *dev_zero(size_t bytes) {
    void *d;
    CHECK_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
    CHECK_CUDA(cudaMemset(d, 0, bytes ? bytes : 1));
    return d;
}

static void from_dev(void *h, const void *d, size_t bytes) {
    CHECK_CUDA(cudaStreamSynchronize(fx.s));
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static double nmse(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? num / den : num;
}

static void assert_close(const char *what, const float *got, const float *want, size_t n,
                         float atol, float rtol) {
    for (size_t i = 0; i < n; i++)
        cr_assert(fabsf(got[i] - want[i]) <= atol + rtol * fabsf(want[i]),
                  "%s[%zu]: gpu %.9g, cpu %.9g", what, i, got[i], want[i]);
}

/* ---- products ---- */

typedef struct mat_shape {
    size_t rows, cols;
} mat_shape;

static const mat_shape float_shapes[] = {{1, 1},      {3, 7},       {33, 100}, {64, 512},
                                         {257, 1000}, {1000, 2048}, {5, 4097}};
/* cols are multiples of QUANT_GROUP; 17 and 41 blocks per row make rows start unaligned and
 * split into a full 32-block chunk plus a tail */
static const mat_shape quant_shapes[] = {{1, 64},     {7, 192},      {33, 640},   {130, 1088},
                                         {257, 2048}, {64, 64 * 41}, {1000, 1024}};

Test(gpu_kernels, matvec_f32_matches_the_cpu_reference) {
    for (size_t c = 0; c < sizeof float_shapes / sizeof float_shapes[0]; c++) {
        size_t R = float_shapes[c].rows, C = float_shapes[c].cols;
        float *w = randn(R * C, 0.05), *x = randn(C, 1), *want = malloc(R * sizeof *want),
              *got = malloc(R * sizeof *got);
        kern_matvec_f32_cpu(want, w, x, R, C);
        float *dw = to_dev(w, R * C * 4), *dx = to_dev(x, C * 4), *dy = dev_zero(R * 4);
        kern_matvec_f32_cuda(dy, dw, dx, R, C, fx.s);
        from_dev(got, dy, R * 4);
        double e = nmse(got, want, R);
        cr_assert(e <= MATVEC_NMSE_MAX, "f32 %zux%zu: NMSE %g", R, C, e);
        cudaFree(dw), cudaFree(dx), cudaFree(dy);
        free(w), free(x), free(want), free(got);
    }
}

static uint16_t *to_bf16(const float *x, size_t n) {
    uint16_t *b = malloc((n ? n : 1) * sizeof *b);
    for (size_t i = 0; i < n; i++) b[i] = quant_f32_to_bf16(x[i]);
    return b;
}

Test(gpu_kernels, bf16_gemv_and_small_batch_gemm_match_the_cpu_reference) {
    static const size_t batches[] = {1, 2, 3, 5, 8, 11};
    for (size_t c = 0; c < sizeof float_shapes / sizeof float_shapes[0]; c++) {
        size_t R = float_shapes[c].rows, C = float_shapes[c].cols;
        float *wf = randn(R * C, 0.05);
        uint16_t *w = to_bf16(wf, R * C);
        uint16_t *dw = to_dev(w, R * C * 2);
        for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
            size_t B = batches[b];
            float *x = randn(B * C, 1), *want = malloc(B * R * 4), *got = malloc(B * R * 4);
            for (size_t i = 0; i < B; i++) kern_matvec_bf16_cpu(want + i * R, w, x + i * C, R, C);
            float *dx = to_dev(x, B * C * 4), *dy = dev_zero(B * R * 4);
            if (B == 1)
                kern_matvec_bf16_cuda(dy, dw, dx, R, C, fx.s);
            else
                kern_gemm_bf16_cuda(dy, dw, dx, R, C, B, fx.s);
            from_dev(got, dy, B * R * 4);
            double e = nmse(got, want, B * R);
            cr_assert(e <= MATVEC_NMSE_MAX, "bf16 %zux%zu batch %zu: NMSE %g", R, C, B, e);
            cudaFree(dx), cudaFree(dy);
            free(x), free(want), free(got);
        }
        cudaFree(dw);
        free(wf), free(w);
    }
}

static void check_quant(moesim_precision p) {
    static const size_t batches[] = {1, 2, 4, 7, 8, 13};
    for (size_t c = 0; c < sizeof quant_shapes / sizeof quant_shapes[0]; c++) {
        size_t R = quant_shapes[c].rows, C = quant_shapes[c].cols;
        size_t row_bytes = quant_matrix_size_bytes(p, 1, C);
        float *wf = randn(R * C, 0.05);
        uint8_t *w = malloc(R * row_bytes);
        for (size_t r = 0; r < R; r++) quant_row_quantize_ref(p, wf + r * C, w + r * row_bytes, C);
        void *dw = to_dev(w, R * row_bytes);
        for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
            size_t B = batches[b];
            float *x = randn(B * C, 1), *want = malloc(B * R * 4), *got = malloc(B * R * 4);
            for (size_t i = 0; i < B; i++)
                kern_matvec_quant_cpu(want + i * R, p, w, x + i * C, R, C);
            float *dx = to_dev(x, B * C * 4), *dy = dev_zero(B * R * 4);
            if (B == 1)
                kern_matvec_quant_cuda(dy, p, dw, dx, R, C, fx.s);
            else
                kern_gemm_quant_cuda(dy, p, dw, dx, R, C, B, fx.s);
            from_dev(got, dy, B * R * 4);
            double e = nmse(got, want, B * R);
            cr_assert(e <= MATVEC_NMSE_MAX, "%s %zux%zu batch %zu: NMSE %g", precision_name(p), R,
                      C, B, e);
            cudaFree(dx), cudaFree(dy);
            free(x), free(want), free(got);
        }
        cudaFree(dw);
        free(wf), free(w);
    }
}

Test(gpu_kernels, int8_gemv_and_gemm_match_the_cpu_reference) { check_quant(PREC_INT8); }
Test(gpu_kernels, int4_gemv_and_gemm_match_the_cpu_reference) { check_quant(PREC_INT4); }
Test(gpu_kernels, int2_gemv_and_gemm_match_the_cpu_reference) { check_quant(PREC_INT2); }

Test(gpu_kernels, cublas_bf16_gemm_matches_the_cpu_reference_on_bf16_rounded_inputs) {
    static const size_t batches[] = {1, 4, 33, 128};
    cublas_lazy_handle h;
    moesim_error err = {0};
    cr_assert_eq(cublas_lazy_handle_init(&h, fx.s, &err), MOESIM_OK, "%s", err.msg);
    for (size_t c = 2; c < sizeof float_shapes / sizeof float_shapes[0]; c++) {
        size_t R = float_shapes[c].rows, C = float_shapes[c].cols;
        float *wf = randn(R * C, 0.05);
        uint16_t *w = to_bf16(wf, R * C);
        uint16_t *dw = to_dev(w, R * C * 2);
        for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
            size_t B = batches[b];
            float *x = randn(B * C, 1), *want = malloc(B * R * 4), *got = malloc(B * R * 4);
            for (size_t i = 0; i < B; i++) kern_matvec_bf16_cpu(want + i * R, w, x + i * C, R, C);
            float *dx = to_dev(x, B * C * 4), *dy = dev_zero(B * R * 4);
            uint16_t *dxb = dev_zero(B * C * 2);
            kern_gemm_bf16_cublas(&h, dy, dw, dx, dxb, R, C, B, fx.s);
            from_dev(got, dy, B * R * 4);
            double e = nmse(got, want, B * R);
            cr_assert(e <= CUBLAS_NMSE_MAX, "cublas %zux%zu batch %zu: NMSE %g", R, C, B, e);
            cudaFree(dx), cudaFree(dy), cudaFree(dxb);
            free(x), free(want), free(got);
        }
        cudaFree(dw);
        free(wf), free(w);
    }
    cublas_lazy_handle_free(&h);
}

/* ---- norms and elementwise ops ---- */

Test(gpu_kernels, rmsnorm_single_and_per_row_match_the_cpu_reference) {
    static const size_t sizes[] = {1, 31, 128, 1000, 4096, 65536};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        size_t n = sizes[c], rows = c % 2 ? 3 : 1;
        float *x = randn(rows * n, 2), *w = randn(n, 1), *want = malloc(rows * n * 4),
              *got = malloc(rows * n * 4);
        for (size_t r = 0; r < rows; r++) kern_rmsnorm_cpu(want + r * n, x + r * n, w, n, 1e-6f);
        float *dx = to_dev(x, rows * n * 4), *dw = to_dev(w, n * 4);
        if (rows == 1)
            kern_rmsnorm_cuda(dx, dx, dw, n, 1e-6f, fx.s); /* in place, as allowed */
        else
            kern_rmsnorm_rows_cuda(dx, dx, dw, rows, n, 1e-6f, fx.s);
        from_dev(got, dx, rows * n * 4);
        assert_close("rmsnorm", got, want, rows * n, RMSNORM_ATOL, RMSNORM_RTOL);
        cudaFree(dx), cudaFree(dw);
        free(x), free(w), free(want), free(got);
    }
}

Test(gpu_kernels, rope_matches_the_cpu_reference_at_near_and_far_positions) {
    static const struct {
        size_t heads, dim;
        uint32_t pos;
        double theta;
    } cases[] = {{1, 2, 0, 10000},
                 {4, 64, 1, 10000},
                 {32, 128, 17, 1e6},
                 {8, 96, 4095, 10000},
                 {2, 256, 1000, 5e5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = cases[c].heads * cases[c].dim;
        float *x = randn(n, 1), *got = malloc(n * 4);
        float *dx = to_dev(x, n * 4);
        kern_rope_cpu(x, cases[c].heads, cases[c].dim, cases[c].pos, cases[c].theta);
        kern_rope_cuda(dx, cases[c].heads, cases[c].dim, cases[c].pos, cases[c].theta, fx.s);
        from_dev(got, dx, n * 4);
        assert_close("rope", got, x, n, ROPE_ATOL, ROPE_RTOL);
        cudaFree(dx);
        free(x), free(got);
    }
}

Test(gpu_kernels, swiglu_and_softmax_match_the_cpu_reference) {
    static const size_t sizes[] = {1, 8, 60, 128, 1000, 14336};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        size_t n = sizes[c];
        float *g = randn(n, 3), *u = randn(n, 1), *want = malloc(n * 4), *got = malloc(n * 4);
        kern_swiglu_cpu(want, g, u, n);
        float *dg = to_dev(g, n * 4), *du = to_dev(u, n * 4);
        kern_swiglu_cuda(dg, dg, du, n, fx.s);
        from_dev(got, dg, n * 4);
        assert_close("swiglu", got, want, n, SWIGLU_ATOL, SWIGLU_RTOL);
        CHECK_CUDA(cudaMemcpy(dg, g, n * 4, cudaMemcpyHostToDevice));
        memcpy(want, g, n * 4);
        kern_softmax_cpu(want, n);
        kern_softmax_cuda(dg, n, fx.s);
        from_dev(got, dg, n * 4);
        assert_close("softmax", got, want, n, SOFTMAX_ATOL, SOFTMAX_RTOL);
        cudaFree(dg), cudaFree(du);
        free(g), free(u), free(want), free(got);
    }
}

/* ---- routing ---- */

Test(gpu_kernels, topk_picks_the_cpu_reference_experts_in_order_with_ties_to_the_lower_index) {
    static const struct {
        size_t n, k;
        bool ties;
    } cases[] = {{8, 2, false},    {60, 4, false},   {64, 8, false}, {128, 8, false},
                 {256, 64, false}, {512, 10, false}, {16, 16, true}, {100, 7, true}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = cases[c].n, k = cases[c].k;
        float *x = randn(n, 1);
        if (cases[c].ties) /* few distinct values: many exact ties */
            for (size_t i = 0; i < n; i++) x[i] = (float)(rng_below(fx.r, 4));
        uint32_t want_ids[64], got_ids[64];
        float want_v[64], got_v[64];
        kern_topk_cpu(x, n, k, want_ids, want_v);
        float *dx = to_dev(x, n * 4), *dv = dev_zero(k * 4);
        uint32_t *di = dev_zero(k * 4);
        kern_topk_cuda(dx, n, k, di, dv, fx.s);
        from_dev(got_ids, di, k * 4);
        from_dev(got_v, dv, k * 4);
        for (size_t i = 0; i < k; i++) {
            cr_assert_eq(got_ids[i], want_ids[i], "n %zu k %zu rank %zu: gpu %u, cpu %u", n, k, i,
                         got_ids[i], want_ids[i]);
            cr_assert_eq(got_v[i], want_v[i]);
        }
        cudaFree(dx), cudaFree(dv), cudaFree(di);
        free(x);
    }
}

Test(gpu_kernels, router_softmax_topk_matches_softmax_then_topk_on_the_cpu) {
    static const struct { size_t n, k; } cases[] = {{8, 2}, {60, 4}, {64, 8}, {128, 8}, {512, 10}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = cases[c].n, k = cases[c].k;
        float *logits = randn(n, 2), *probs = malloc(n * 4), *got_p = malloc(n * 4);
        memcpy(probs, logits, n * 4);
        kern_softmax_cpu(probs, n);
        uint32_t want_ids[64], got_ids[64];
        float want_v[64], got_v[64];
        kern_topk_cpu(probs, n, k, want_ids, want_v);
        float *dl = to_dev(logits, n * 4), *dp = dev_zero(n * 4), *dv = dev_zero(k * 4);
        uint32_t *di = dev_zero(k * 4);
        kern_router_topk_cuda(dp, dl, n, k, di, dv, fx.s);
        from_dev(got_p, dp, n * 4);
        from_dev(got_ids, di, k * 4);
        from_dev(got_v, dv, k * 4);
        assert_close("router probs", got_p, probs, n, SOFTMAX_ATOL, SOFTMAX_RTOL);
        for (size_t i = 0; i < k; i++)
            cr_assert_eq(got_ids[i], want_ids[i], "n %zu rank %zu: gpu %u, cpu %u", n, i,
                         got_ids[i], want_ids[i]);
        assert_close("router top-k weights", got_v, want_v, k, SOFTMAX_ATOL, SOFTMAX_RTOL);
        cudaFree(dl), cudaFree(dp), cudaFree(dv), cudaFree(di);
        free(logits), free(probs), free(got_p);
    }
}

/* ---- attention ---- */

typedef struct attn_case {
    size_t heads, kv_heads, dim, ctx, n_q;
} attn_case;

static const attn_case attn_cases[] = {
    {1, 1, 2, 1, 1},      {4, 4, 64, 7, 1}, {8, 2, 128, 33, 1}, {32, 8, 128, 300, 1},
    {16, 4, 64, 1025, 1}, {4, 2, 64, 9, 9}, {8, 8, 96, 40, 13}, {16, 2, 128, 200, 64}};

Test(gpu_kernels, attention_decode_and_prefill_match_the_cpu_reference_query_by_query) {
    for (size_t c = 0; c < sizeof attn_cases / sizeof attn_cases[0]; c++) {
        attn_case a = attn_cases[c];
        size_t qn = a.n_q * a.heads * a.dim, kvn = a.ctx * a.kv_heads * a.dim;
        float *q = randn(qn, 1), *k = randn(kvn, 1), *v = randn(kvn, 1);
        float *want = malloc(qn * 4), *got = malloc(qn * 4);
        float *want_p = calloc(a.n_q * a.heads * a.ctx, 4),
              *got_p = malloc(a.n_q * a.heads * a.ctx * 4);
        float *scratch = malloc(a.heads * a.ctx * 4);
        for (size_t i = 0; i < a.n_q; i++) {
            size_t horizon = a.ctx - a.n_q + i + 1;
            kern_attention_cpu(want + i * a.heads * a.dim, scratch, q + i * a.heads * a.dim, k, v,
                               a.heads, a.kv_heads, a.dim, horizon);
            for (size_t h = 0; h < a.heads; h++)
                memcpy(want_p + (i * a.heads + h) * a.ctx, scratch + h * horizon, horizon * 4);
        }
        float *dq = to_dev(q, qn * 4), *dk = to_dev(k, kvn * 4), *dv = to_dev(v, kvn * 4);
        float *dout = dev_zero(qn * 4), *dp = dev_zero(a.n_q * a.heads * a.ctx * 4);
        if (a.n_q == 1)
            kern_attention_cuda(dout, dp, dq, dk, dv, a.heads, a.kv_heads, a.dim, a.ctx, fx.s);
        else
            kern_attention_prefill_cuda(dout, dp, dq, dk, dv, a.n_q, a.heads, a.kv_heads, a.dim,
                                        a.ctx, fx.s);
        from_dev(got, dout, qn * 4);
        from_dev(got_p, dp, a.n_q * a.heads * a.ctx * 4);
        assert_close("attention out", got, want, qn, ATTN_ATOL, ATTN_RTOL);
        assert_close("attention probs", got_p, want_p, a.n_q * a.heads * a.ctx, ATTN_ATOL,
                     ATTN_RTOL);
        cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dp);
        free(q), free(k), free(v), free(want), free(got), free(want_p), free(got_p), free(scratch);
    }
}
