/* `moesim calibrate`'s microbenchmarks on device 0 (replay/replay.h calib_run): pinned
 * host<->device bandwidth vs transfer size and the per-transfer latency (intercept of a
 * least-squares line through time vs size), device-to-device copy bandwidth, empty-kernel launch
 * overhead, the best cuBLAS bf16 GEMM, and the compute-stream ops of sim/COST.md timed with the
 * kernels the replay launches (replay/gemm.cuh): expert gate+up and down per precision vs
 * tokens, router, shared experts, dense FFN, combine and LM head vs tokens, attention vs attended
 * positions. Every point is the median of `repeats` timed runs (CUDA events) after one warm-up
 * run. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <gsl/gsl_fit.h>

/* measure_chunked: the replay's default chunk (sim.chunk_kib = 1024), 64 of them */
#define CALIB_CHUNK_BYTES (1ull << 20)
#define CALIB_CHUNKS      64

#define _Noreturn [[noreturn]]
#define _Static_assert static_assert
extern "C" {
#include "common/alloc.h"
#include "common/check.h"
#include "kernels/quant.h"
#include "replay/replay.h"
}
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "replay/gemm.cuh"

__global__ void calib_empty_kernel(void) {}

typedef struct calib_ctx {
    cudaStream_t s;
    cublas_lazy_handle blas; /* on s */
    cudaEvent_t e0, e1;
    uint32_t repeats;
} calib_ctx;

/* Median time in ns of `fn` on the stream (one untimed warm-up). */
template <typename F> static double time_median_ns(calib_ctx *c, F fn) {
    fn();
    CUDA_CHECK(cudaStreamSynchronize(c->s));
    std::vector<double> v;
    for (uint32_t r = 0; r < c->repeats; r++) {
        CUDA_CHECK(cudaEventRecord(c->e0, c->s));
        fn();
        CUDA_CHECK(cudaEventRecord(c->e1, c->s));
        CUDA_CHECK(cudaEventSynchronize(c->e1));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, c->e0, c->e1));
        v.push_back((double)ms * 1e6);
    }
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void *dev_fill(uint64_t bytes) {
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 16));
    /* 0x3c: bf16 and fp16 values near 1, quant codes mid-range: finite arithmetic throughout */
    CUDA_CHECK(cudaMemset(d, 0x3c, bytes));
    return d;
}

static void curve_add(cost_curve *cv, double x, double t_ns) {
    MOESIM_ASSERT(cv->n < COST_TABLE_MAX_POINTS && (cv->n == 0 || x > cv->x[cv->n - 1]));
    cv->x[cv->n] = x;
    cv->t_ns[cv->n++] = t_ns;
}

/* Back-to-back chunks on one stream, an event before and after each cudaMemcpyAsync as the
 * replay's copy engine records them (replay/run_copy.cu; here all 64 queued at once, timing
 * disabled): does each chunk pay the transfer latency again, or do queued copies overlap their
 * setup? The time per chunk beyond its bytes at the largest transfer's rate, when over half the
 * fitted per-transfer latency, says it is paid per chunk (a yes or no: the profile's
 * latency_per_chunk then charges the whole latency to every chunk). */
static void measure_chunked(calib_ctx *c, calib_results *out, void *d, const void *h) {
    cudaEvent_t ev[2 * CALIB_CHUNKS];
    for (cudaEvent_t &e : ev) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    double t = time_median_ns(c, [&] {
        for (int i = 0; i < CALIB_CHUNKS; i++) {
            CUDA_CHECK(cudaEventRecord(ev[2 * i], c->s));
            CUDA_CHECK(cudaMemcpyAsync((uint8_t *)d + (uint64_t)i * CALIB_CHUNK_BYTES,
                                       (const uint8_t *)h + (uint64_t)i * CALIB_CHUNK_BYTES,
                                       CALIB_CHUNK_BYTES, cudaMemcpyHostToDevice, c->s));
            CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], c->s));
        }
    });
    for (cudaEvent_t e : ev) CUDA_CHECK(cudaEventDestroy(e));
    double per_chunk_ns = t / CALIB_CHUNKS;
    double stream_ns = CALIB_CHUNK_BYTES / out->h2d_peak_gb_per_s; /* bytes / (GB/s) = ns */
    out->h2d_chunk_us = per_chunk_ns / 1e3;
    out->h2d_chunk_measured = true;
    out->h2d_latency_per_chunk = per_chunk_ns - stream_ns > 0.5 * out->h2d_latency_us * 1e3;
}

static void measure_copies(calib_ctx *c, calib_results *out, bool quick) {
    uint64_t max_bytes = quick ? (64ull << 20) : (256ull << 20);
    void *h = NULL, *d = dev_fill(max_bytes);
    CUDA_CHECK(cudaHostAlloc(&h, max_bytes, cudaHostAllocDefault));
    memset(h, 0x3c, max_bytes);
    std::vector<double> xs, th, td;
    out->n_sizes = 0;
    for (uint64_t b = 4096; b <= max_bytes && out->n_sizes < CALIB_MAX_SIZES; b *= quick ? 16 : 4) {
        double t_h2d = time_median_ns(
            c, [&] { CUDA_CHECK(cudaMemcpyAsync(d, h, b, cudaMemcpyHostToDevice, c->s)); });
        double t_d2h = time_median_ns(
            c, [&] { CUDA_CHECK(cudaMemcpyAsync(h, d, b, cudaMemcpyDeviceToHost, c->s)); });
        uint32_t i = out->n_sizes++;
        out->size_bytes[i] = (double)b;
        out->h2d_gb_per_s[i] = (double)b / t_h2d;
        out->d2h_gb_per_s[i] = (double)b / t_d2h;
        xs.push_back((double)b);
        th.push_back(t_h2d);
        td.push_back(t_d2h);
    }
    double a, bb, c00, c01, c11, ss;
    gsl_fit_linear(xs.data(), 1, th.data(), 1, xs.size(), &a, &bb, &c00, &c01, &c11, &ss);
    out->h2d_latency_us = a > 0 ? a / 1e3 : 0;
    gsl_fit_linear(xs.data(), 1, td.data(), 1, xs.size(), &a, &bb, &c00, &c01, &c11, &ss);
    out->d2h_latency_us = a > 0 ? a / 1e3 : 0;
    out->h2d_peak_gb_per_s = out->h2d_gb_per_s[out->n_sizes - 1];
    out->d2h_peak_gb_per_s = out->d2h_gb_per_s[out->n_sizes - 1];
    measure_chunked(c, out, d, h);
    CUDA_CHECK(cudaFreeHost(h));
    CUDA_CHECK(cudaFree(d));
}

static void measure_device(calib_ctx *c, calib_results *out, bool quick) {
    uint64_t bytes = quick ? (256ull << 20) : (1ull << 30);
    void *a = dev_fill(bytes), *b = dev_fill(bytes);
    double t = time_median_ns(
        c, [&] { CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->s)); });
    out->hbm_gb_per_s = 2.0 * (double)bytes / t; /* read + write */
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    const int launches = 1000;
    double tl = time_median_ns(c, [&] {
        for (int i = 0; i < launches; i++) calib_empty_kernel<<<1, 1, 0, c->s>>>();
        CUDA_LAUNCH_CHECK();
    });
    out->kernel_launch_us = tl / launches / 1e3;
    /* the same launches each between two timing events, as the replay brackets every op */
    std::vector<cudaEvent_t> ev(2 * launches);
    for (cudaEvent_t &e : ev) CUDA_CHECK(cudaEventCreate(&e));
    double te = time_median_ns(c, [&] {
        for (int i = 0; i < launches; i++) {
            CUDA_CHECK(cudaEventRecord(ev[2 * i], c->s));
            calib_empty_kernel<<<1, 1, 0, c->s>>>();
            CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], c->s));
        }
        CUDA_LAUNCH_CHECK();
    });
    for (cudaEvent_t e : ev) CUDA_CHECK(cudaEventDestroy(e));
    out->op_events_us = te > tl ? (te - tl) / launches / 1e3 : 0; /* noise can invert them */
    size_t n = quick ? 4096 : 8192;
    uint16_t *w = (uint16_t *)dev_fill(n * n * 2), *xb = (uint16_t *)dev_fill(n * n * 2);
    float *x = (float *)dev_fill(n * n * 4), *y = (float *)dev_fill(n * n * 4);
    CUDA_CHECK(cudaMemset(x, 0, n * n * 4));
    double tg =
        time_median_ns(c, [&] { kern_gemm_bf16_cublas(&c->blas, y, w, x, xb, n, n, n, c->s); });
    out->bf16_tflops = 2.0 * n * n * n / tg / 1e3;
    CUDA_CHECK(cudaFree(w));
    CUDA_CHECK(cudaFree(xb));
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(y));
}

static void measure_ops(calib_ctx *c, const model_geometry *m, calib_results *out, bool quick) {
    const uint32_t tokens[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    size_t n_tok = quick ? 5 : sizeof tokens / sizeof tokens[0];
    uint32_t T = tokens[n_tok - 1];
    uint64_t H = m->hidden, I = m->expert_inter;
    uint64_t q_dim = (uint64_t)m->n_heads * m->head_dim,
             kv_dim = (uint64_t)m->n_kv_heads * m->head_dim;
    uint64_t S = (uint64_t)m->shared_inter * m->n_shared_experts, D = m->dense_inter;
    uint64_t wide = std::max<uint64_t>({H, I, S, D, q_dim + 2 * kv_dim, m->vocab, m->n_experts});
    float *x = (float *)dev_fill(T * wide * 4), *y = (float *)dev_fill(T * wide * 4);
    float *h1 = (float *)dev_fill(T * wide * 4), *h2 = (float *)dev_fill(T * wide * 4);
    CUDA_CHECK(cudaMemset(x, 0, T * wide * 4));
    uint16_t *xb = (uint16_t *)dev_fill(T * wide * 2);
    /* experts, per precision the kernels have */
    const moesim_precision precs[] = {PREC_BF16, PREC_INT8, PREC_INT4, PREC_INT2};
    for (moesim_precision p : precs) {
        if (p != PREC_BF16 && (H % QUANT_GROUP || I % QUANT_GROUP)) continue;
        uint64_t gb = p == PREC_BF16 ? I * H * 2 : quant_matrix_size_bytes(p, I, H);
        uint64_t db = p == PREC_BF16 ? H * I * 2 : quant_matrix_size_bytes(p, H, I);
        void *g = dev_fill(gb), *u = dev_fill(gb), *dn = dev_fill(db);
        for (size_t i = 0; i < n_tok; i++) {
            uint32_t n = tokens[i];
            double tgu = time_median_ns(c, [&] {
                replay_gemm(&c->blas, xb, c->s, h1, p, g, x, I, H, n);
                replay_gemm(&c->blas, xb, c->s, h2, p, u, x, I, H, n);
                kern_swiglu_cuda(h1, h1, h2, I * n, c->s);
            });
            double tdn =
                time_median_ns(c, [&] { replay_gemm(&c->blas, xb, c->s, y, p, dn, h1, H, I, n); });
            curve_add(&out->curve[COST_EXPERT_GATE_UP][p], n, tgu);
            curve_add(&out->curve[COST_EXPERT_DOWN][p], n, tdn);
        }
        CUDA_CHECK(cudaFree(g));
        CUDA_CHECK(cudaFree(u));
        CUDA_CHECK(cudaFree(dn));
    }
    /* router, shared experts, dense FFN, LM head: bf16 */
    uint16_t *wr = (uint16_t *)dev_fill(m->n_experts * H * 2);
    uint16_t *ws = S ? (uint16_t *)dev_fill(3 * S * H * 2) : NULL;
    uint16_t *wd = D ? (uint16_t *)dev_fill(3 * D * H * 2) : NULL;
    uint16_t *wl = (uint16_t *)dev_fill((uint64_t)m->vocab * H * 2);
    uint16_t *ys = (uint16_t *)dev_fill((uint64_t)T * m->top_k * H * 2);
    float *gates = (float *)dev_fill((uint64_t)T * m->top_k * 4);
    for (size_t i = 0; i < n_tok; i++) {
        uint32_t n = tokens[i];
        curve_add(&out->curve[COST_ROUTER][PREC_BF16], n, time_median_ns(c, [&] {
            replay_gemm(&c->blas, xb, c->s, y, PREC_BF16, wr, x, m->n_experts, H, n);
        }));
        if (ws)
            curve_add(&out->curve[COST_SHARED][PREC_BF16], n, time_median_ns(c, [&] {
                replay_gemm(&c->blas, xb, c->s, h1, PREC_BF16, ws, x, S, H, n);
                replay_gemm(&c->blas, xb, c->s, h2, PREC_BF16, ws + S * H, x, S, H, n);
                kern_swiglu_cuda(h1, h1, h2, S * n, c->s);
                replay_gemm(&c->blas, xb, c->s, y, PREC_BF16, ws + 2 * S * H, h1, H, S, n);
            }));
        if (wd)
            curve_add(&out->curve[COST_DENSE_FFN][PREC_BF16], n, time_median_ns(c, [&] {
                replay_gemm(&c->blas, xb, c->s, h1, PREC_BF16, wd, x, D, H, n);
                replay_gemm(&c->blas, xb, c->s, h2, PREC_BF16, wd + D * H, x, D, H, n);
                kern_swiglu_cuda(h1, h1, h2, D * n, c->s);
                replay_gemm(&c->blas, xb, c->s, y, PREC_BF16, wd + 2 * D * H, h1, H, D, n);
            }));
        curve_add(&out->curve[COST_LM_HEAD][PREC_BF16], n, time_median_ns(c, [&] {
            replay_gemm(&c->blas, xb, c->s, y, PREC_BF16, wl, x, m->vocab, H, n);
        }));
        curve_add(&out->curve[COST_COMBINE][PREC_BF16], n,
                  time_median_ns(c, [&] { replay_combine(y, ys, gates, n, m->top_k, H, c->s); }));
    }
    CUDA_CHECK(cudaFree(wr));
    if (ws) CUDA_CHECK(cudaFree(ws));
    if (wd) CUDA_CHECK(cudaFree(wd));
    CUDA_CHECK(cudaFree(wl));
    CUDA_CHECK(cudaFree(ys));
    CUDA_CHECK(cudaFree(gates));
    /* attention of one token vs context (x = attended positions), as replay runs it */
    if (q_dim && kv_dim) {
        uint32_t max_ctx = quick ? 4096 : 32768;
        uint16_t *wa = (uint16_t *)dev_fill(((q_dim + 2 * kv_dim) * H + H * q_dim) * 2);
        float *kv = (float *)dev_fill(((uint64_t)max_ctx * kv_dim * 2 + kv_dim) * 4);
        CUDA_CHECK(cudaMemset(kv, 0, ((uint64_t)max_ctx * kv_dim * 2 + kv_dim) * 4));
        float *probs = (float *)dev_fill((uint64_t)m->n_heads * max_ctx * 4);
        float *ao = (float *)dev_fill(q_dim * 4 * 2);
        for (uint32_t ctx = 16; ctx <= max_ctx; ctx *= 4)
            curve_add(&out->curve[COST_ATTENTION][PREC_BF16], ctx, time_median_ns(c, [&] {
                replay_gemm(&c->blas, xb, c->s, y, PREC_BF16, wa, x, q_dim + 2 * kv_dim, H, 1);
                kern_attention_prefill_cuda(ao, probs, y, kv, kv + kv_dim, 1, m->n_heads,
                                            m->n_kv_heads, m->head_dim, ctx, c->s);
                replay_gemm(&c->blas, xb, c->s, h2, PREC_BF16, wa + (q_dim + 2 * kv_dim) * H, ao, H,
                            q_dim, 1);
            }));
        CUDA_CHECK(cudaFree(wa));
        CUDA_CHECK(cudaFree(kv));
        CUDA_CHECK(cudaFree(probs));
        CUDA_CHECK(cudaFree(ao));
    }
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(y));
    CUDA_CHECK(cudaFree(h1));
    CUDA_CHECK(cudaFree(h2));
    CUDA_CHECK(cudaFree(xb));
}

extern "C" moesim_status calib_run(const calib_options *opt, calib_results *out,
                                   moesim_error *err) {
    MOESIM_ASSERT(opt && opt->model && opt->repeats >= 1 && out);
    moesim_status st = replay_device_check(err);
    if (st) return st;
    memset(out, 0, sizeof *out);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    snprintf(out->gpu, sizeof out->gpu, "%.63s", prop.name);
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    out->hbm_bytes = total_b;
    out->repeats = opt->repeats;
    calib_ctx c;
    c.repeats = opt->repeats;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
    if ((st = cublas_lazy_handle_init(&c.blas, c.s, err))) {
        CUDA_CHECK(cudaStreamDestroy(c.s));
        return st;
    }
    CUDA_CHECK(cudaEventCreate(&c.e0));
    CUDA_CHECK(cudaEventCreate(&c.e1));
    measure_copies(&c, out, opt->quick);
    measure_device(&c, out, opt->quick);
    measure_ops(&c, opt->model, out, opt->quick);
    CUDA_CHECK(cudaEventDestroy(c.e0));
    CUDA_CHECK(cudaEventDestroy(c.e1));
    cublas_lazy_handle_free(&c.blas);
    CUDA_CHECK(cudaStreamDestroy(c.s));
    return MOESIM_OK;
}
