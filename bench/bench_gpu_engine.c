/* GPU engine figures, on the GPU it names:
 *   1. expert GEMV bandwidth per precision (bf16, int8, int4, int2): weight bytes read per second
 *      and its share of the GPU's peak (memory clock x bus width x 2, DDR), at batch 1 and for the
 *      small-batch GEMM at batch 4 and 8 (weights read once for all vectors), and cuBLAS bf16;
 *   2. copies: pinned and pageable host-to-device GB/s per transfer size (an OLMoE expert at int4
 *      up to a Mixtral expert at bf16) as a share of the best pinned rate it measures (the link's
 *      measured peak), and a device-to-device copy's bytes read + written per second (the HBM
 *      bandwidth a kernel can reach, beside the clock x bus figure);
 *   3. decode tokens/s of a random OLMoE-geometry checkpoint (bench/support/random_checkpoint.h)
 *      on the cuda backend, experts resident and offloaded (a device pool of a quarter of the
 *      experts, loaded from pinned host memory on demand), with the pool's hit rate.
 *
 *   bench_gpu_engine [--layers N] [--gen N] [--dir DIR] [--no-decode]
 *
 * Copies are timed with events around a loop of cudaMemcpyAsync on one stream, at least
 * MIN_TIMED_S per size after a warm-up copy.
 *
 * Matrices are cycled through a footprint of at least four L2 caches so every launch reads from
 * DRAM. Timings come from CUDA events around many launches. Without a CUDA device it prints so
 * and exits 0 (make bench runs every benchmark). */
#include <cuda_runtime.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/support/random_checkpoint.h"
#include "common/progress.h"
#include "engine/engine.h"
#include "kernels/cuda/gpu_probe.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/quant.h"

#define BENCH_CUDA(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define MIN_TIMED_S 0.2 /* each figure times launches for at least this long */

typedef struct gpu_info {
    char name[256];
    double peak_bytes_per_s;
    size_t l2_bytes, free_bytes;
} gpu_info;

static void gpu_describe(gpu_info *g) {
    struct cudaDeviceProp prop;
    BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
    snprintf(g->name, sizeof g->name, "%s", prop.name);
    int clock_khz = 0, bus_bits = 0, l2 = 0;
    BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0));
    BENCH_CUDA(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
    BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    g->peak_bytes_per_s = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0); /* double data rate */
    g->l2_bytes = (size_t)l2;
    size_t total;
    BENCH_CUDA(cudaMemGetInfo(&g->free_bytes, &total));
    printf("GPU: %s, %.1f GiB, memory clock %.0f MHz x %d-bit bus: peak %.0f GB/s, L2 %.0f MiB\n",
           g->name, total / 1073741824.0, clock_khz / 1e3, bus_bits, g->peak_bytes_per_s / 1e9,
           l2 / 1048576.0);
}

/* Weights of one rows x cols matrix at precision p, as the engine stores them. */
static void *make_weights(moesim_precision p, size_t rows, size_t cols, size_t *bytes) {
    *bytes = quant_matrix_size_bytes(p, rows, cols);
    uint8_t *w = malloc(*bytes);
    float *row = malloc(cols * sizeof *row);
    size_t row_bytes = *bytes / rows;
    for (size_t r = 0; r < rows; r++) {
        for (size_t c = 0; c < cols; c++) row[c] = uniform_pm(0.02f);
        if (p == PREC_BF16)
            for (size_t c = 0; c < cols; c++)
                ((uint16_t *)(w + r * row_bytes))[c] = quant_f32_to_bf16(row[c]);
        else
            quant_row_quantize_ref(p, row, w + r * row_bytes, cols);
    }
    free(row);
    return w;
}

typedef enum gemv_impl { IMPL_OURS, IMPL_CUBLAS } gemv_impl;

/* Weight bytes per second of y = W x (batch vectors) over copies of W cycled past the L2. */
static double product_bytes_per_s(const gpu_info *g, moesim_precision p, size_t rows, size_t cols,
                                  size_t batch, gemv_impl impl) {
    size_t bytes;
    void *w = make_weights(p, rows, cols, &bytes);
    size_t copies = (4 * g->l2_bytes + bytes - 1) / bytes + 1;
    if (copies * bytes > g->free_bytes / 2) copies = g->free_bytes / 2 / bytes;
    if (copies < 1) copies = 1;
    void **dw = calloc(copies, sizeof *dw);
    for (size_t i = 0; i < copies; i++) {
        BENCH_CUDA(cudaMalloc(&dw[i], bytes));
        BENCH_CUDA(cudaMemcpy(dw[i], w, bytes, cudaMemcpyHostToDevice));
    }
    float *x = malloc(batch * cols * sizeof *x);
    for (size_t i = 0; i < batch * cols; i++) x[i] = uniform_pm(1.0f);
    float *dx, *dy;
    uint16_t *dxb;
    BENCH_CUDA(cudaMalloc((void **)&dx, batch * cols * sizeof *dx));
    BENCH_CUDA(cudaMalloc((void **)&dxb, batch * cols * sizeof *dxb));
    BENCH_CUDA(cudaMalloc((void **)&dy, batch * rows * sizeof *dy));
    BENCH_CUDA(cudaMemcpy(dx, x, batch * cols * sizeof *dx, cudaMemcpyHostToDevice));
    cudaStream_t s;
    BENCH_CUDA(cudaStreamCreate(&s));
    cublas_lazy_handle h = {0};
    if (impl == IMPL_CUBLAS) {
        moesim_error err = {0};
        if (cublas_lazy_handle_init(&h, s, &err)) {
            fprintf(stderr, "bench_gpu_engine: %s\n", err.msg);
            exit(1);
        }
    }
    cudaEvent_t t0, t1;
    BENCH_CUDA(cudaEventCreate(&t0));
    BENCH_CUDA(cudaEventCreate(&t1));
    size_t launches = 0, iters = copies * 4;
    float ms = 0;
    for (int round = 0; round < 2; round++) { /* round 0 warms up and sizes round 1 */
        BENCH_CUDA(cudaEventRecord(t0, s));
        for (size_t i = 0; i < iters; i++) {
            void *wi = dw[i % copies];
            if (impl == IMPL_CUBLAS)
                kern_gemm_bf16_cublas(&h, dy, wi, dx, dxb, rows, cols, batch, s);
            else if (p == PREC_BF16)
                kern_gemm_bf16_cuda(dy, wi, dx, rows, cols, batch, s);
            else
                kern_gemm_quant_cuda(dy, p, wi, dx, rows, cols, batch, s);
        }
        BENCH_CUDA(cudaEventRecord(t1, s));
        BENCH_CUDA(cudaEventSynchronize(t1));
        BENCH_CUDA(cudaEventElapsedTime(&ms, t0, t1));
        launches = iters;
        double want = MIN_TIMED_S * 1e3 / (ms > 0 ? ms : 1e-3) * (double)iters;
        iters = want > (double)iters ? (size_t)want + 1 : iters;
    }
    double rate = (double)bytes * launches / (ms * 1e-3);
    cublas_lazy_handle_free(&h);
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaStreamDestroy(s);
    for (size_t i = 0; i < copies; i++) cudaFree(dw[i]);
    cudaFree(dx), cudaFree(dxb), cudaFree(dy);
    free(dw), free(w), free(x);
    return rate;
}

static void gemv_figures(const gpu_info *g) {
    static const struct {
        const char *what;
        size_t rows, cols;
    } shapes[] = {{"Mixtral-8x7B expert w1 14336x4096", 14336, 4096},
                  {"OLMoE-1B-7B expert gate 1024x2048", 1024, 2048}};
    const moesim_precision precs[] = {PREC_BF16, PREC_INT8, PREC_INT4, PREC_INT2};
    for (size_t s = 0; s < 2; s++) {
        printf("\n%s: weight bytes read per second (%% of peak)\n", shapes[s].what);
        printf("  %-5s %20s %20s %20s\n", "", "GEMV (batch 1)", "GEMM batch 4", "GEMM batch 8");
        for (size_t i = 0; i < 4; i++) {
            printf("  %-5s", precision_name(precs[i]));
            for (size_t b = 1; b <= 8; b *= (b == 1 ? 4 : 2)) {
                double r =
                    product_bytes_per_s(g, precs[i], shapes[s].rows, shapes[s].cols, b, IMPL_OURS);
                printf("   %8.1f GB/s (%3.0f%%)", r / 1e9, 100 * r / g->peak_bytes_per_s);
            }
            printf("\n");
        }
        printf("  %-5s", "cuBLAS bf16");
        for (size_t b = 1; b <= 64; b *= 8) {
            double r =
                product_bytes_per_s(g, PREC_BF16, shapes[s].rows, shapes[s].cols, b, IMPL_CUBLAS);
            printf("  batch %zu: %.1f GB/s (%.0f%%)", b, r / 1e9, 100 * r / g->peak_bytes_per_s);
        }
        printf("\n");
    }
}

/* Seconds per copy of `bytes` from src to dst on stream s: a warm-up copy, then a loop of at
 * least MIN_TIMED_S, timed with events. */
static double copy_seconds(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                           cudaStream_t s) {
    cudaEvent_t t0, t1;
    BENCH_CUDA(cudaEventCreate(&t0));
    BENCH_CUDA(cudaEventCreate(&t1));
    size_t iters = 1;
    float ms = 0;
    for (int round = 0; round < 2; round++) { /* round 0 warms up and sizes round 1 */
        BENCH_CUDA(cudaEventRecord(t0, s));
        for (size_t i = 0; i < iters; i++) BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, s));
        BENCH_CUDA(cudaEventRecord(t1, s));
        BENCH_CUDA(cudaEventSynchronize(t1));
        BENCH_CUDA(cudaEventElapsedTime(&ms, t0, t1));
        if (round == 0) {
            double want = MIN_TIMED_S * 1e3 / (ms > 0 ? ms : 1e-3);
            iters = want > 1 ? (size_t)want + 1 : 1;
        }
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return ms * 1e-3 / (double)iters;
}

static void copy_figures(const gpu_info *g) {
    /* transfer sizes: OLMoE expert at int4 (~3.3 MB) and bf16 (12.6 MB), Qwen3-30B-A3B expert at
     * bf16 (9.4 MB), Mixtral-8x7B expert at int4 (~93 MB) and bf16 (352 MB), and 1 GiB */
    static const size_t sizes[] = {1u << 20,  3300000,   9437184,  12582912,
                                   93000000, 352321536, 1u << 30};
    const size_t n = sizeof sizes / sizeof *sizes, max = sizes[n - 1];
    void *pinned, *dev, *dev2;
    BENCH_CUDA(cudaHostAlloc(&pinned, max, cudaHostAllocDefault));
    void *pageable = malloc(max);
    if (!pageable) {
        fprintf(stderr, "bench_gpu_engine: out of host memory for %zu bytes\n", max);
        exit(1);
    }
    memset(pinned, 0x5a, max); /* touched: a pageable buffer's first copy must not fault in */
    memset(pageable, 0x5a, max);
    BENCH_CUDA(cudaMalloc(&dev, max));
    BENCH_CUDA(cudaMalloc(&dev2, max));
    cudaStream_t s;
    BENCH_CUDA(cudaStreamCreate(&s));
    double pinned_rate[sizeof sizes / sizeof *sizes], pageable_rate[sizeof sizes / sizeof *sizes];
    double peak = 0;
    for (size_t i = 0; i < n; i++) {
        pinned_rate[i] = sizes[i] / copy_seconds(dev, pinned, sizes[i], cudaMemcpyHostToDevice, s);
        pageable_rate[i] =
            sizes[i] / copy_seconds(dev, pageable, sizes[i], cudaMemcpyHostToDevice, s);
        if (pinned_rate[i] > peak) peak = pinned_rate[i];
    }
    printf("\nhost-to-device copies, one stream (%% of the best pinned rate, %.1f GB/s):\n",
           peak / 1e9);
    printf("  %12s %22s %22s\n", "bytes", "pinned", "pageable");
    for (size_t i = 0; i < n; i++)
        printf("  %12zu %12.1f GB/s (%3.0f%%) %12.1f GB/s (%3.0f%%)\n", sizes[i],
               pinned_rate[i] / 1e9, 100 * pinned_rate[i] / peak, pageable_rate[i] / 1e9,
               100 * pageable_rate[i] / peak);
    double d2d = 2.0 * max / copy_seconds(dev2, dev, max, cudaMemcpyDeviceToDevice, s);
    printf("device-to-device copy of 1 GiB: %.0f GB/s read + written (%.0f%% of the %.0f GB/s "
           "clock x bus figure)\n",
           d2d / 1e9, 100 * d2d / g->peak_bytes_per_s, g->peak_bytes_per_s / 1e9);
    cudaStreamDestroy(s);
    cudaFree(dev), cudaFree(dev2);
    cudaFreeHost(pinned);
    free(pageable);
}

static void decode_figure(const char *dir, moesim_precision p, uint32_t pool, uint32_t gen) {
    engine_options eo = {.precision_mask = 1u << p, .backend = "cuda", .gpu_pool_experts = pool};
    engine *e;
    moesim_error err = {0};
    double t0 = moesim_monotonic_s();
    if (engine_load(dir, &eo, &e, &err)) {
        fprintf(stderr, "bench_gpu_engine: %s\n", err.msg);
        exit(1);
    }
    double load_s = moesim_monotonic_s() - t0;
    engine_precmap pm;
    engine_precmap_init(&pm, e, (uint8_t)p);
    engine_seq *s = engine_seq_create(e, 8 + gen);
    float *logits = malloc(VOCAB * sizeof *logits);
    for (uint32_t i = 0; i < 8; i++) /* prefill a short prompt */
        if (engine_seq_forward(e, s, (int32_t)(17 * i + 3), &pm, logits, NULL, &err)) {
            fprintf(stderr, "bench_gpu_engine: %s\n", err.msg);
            exit(1);
        }
    engine_pool_stats before, after;
    engine_pool_stats_get(e, &before);
    int32_t tok = 1;
    t0 = moesim_monotonic_s();
    for (uint32_t i = 0; i < gen; i++) {
        if (engine_seq_forward(e, s, tok, &pm, logits, NULL, &err)) {
            fprintf(stderr, "bench_gpu_engine: %s\n", err.msg);
            exit(1);
        }
        tok = (int32_t)engine_sample(logits, VOCAB, 0, 0);
    }
    double dt = moesim_monotonic_s() - t0;
    engine_pool_stats_get(e, &after);
    uint64_t hits = after.hits - before.hits, misses = after.misses - before.misses;
    printf("  %-5s %-10s %8.1f tokens/s  pool %u x %.1f MiB, hit rate %5.1f%%, H2D %.2f GB/s "
           "(load %.1f s)\n",
           precision_name(p), pool ? "offloaded" : "resident", gen / dt, after.blocks,
           after.block_bytes / 1048576.0,
           hits + misses ? 100.0 * (double)hits / (double)(hits + misses) : 100.0,
           (double)(after.h2d_bytes - before.h2d_bytes) / dt / 1e9, load_s);
    free(logits);
    engine_seq_destroy(s);
    engine_precmap_free(&pm);
    engine_destroy(e);
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"layers", required_argument, NULL, 'l'},
                                         {"gen", required_argument, NULL, 'g'},
                                         {"dir", required_argument, NULL, 'd'},
                                         {"no-decode", no_argument, NULL, 'n'},
                                         {NULL, 0, NULL, 0}};
    uint32_t layers = 4, gen = 64;
    const char *dir_opt = NULL;
    int c, decode = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'l':
            layers = (uint32_t)atoi(optarg);
            break;
        case 'g':
            gen = (uint32_t)atoi(optarg);
            break;
        case 'd':
            dir_opt = optarg;
            break;
        case 'n':
            decode = 0;
            break;
        default:
            fprintf(stderr, "usage: bench_gpu_engine [--layers N] [--gen N] [--dir DIR] "
                            "[--no-decode]\n");
            return 2;
        }
    }
    if (layers < 1 || layers > 64 || gen < 1) {
        fprintf(stderr, "bench_gpu_engine: --layers in 1..64 and --gen >= 1\n");
        return 2;
    }
    if (gpu_probe_device_count() < 1) {
        printf("bench_gpu_engine: no CUDA device on this machine: nothing measured (run it where "
               "a GPU is present; see scripts/gpu-deps.sh)\n");
        return 0;
    }
    gpu_info g;
    gpu_describe(&g);
    gemv_figures(&g);
    copy_figures(&g);
    if (!decode) return 0;

    char dir[4096];
    if (dir_opt) {
        snprintf(dir, sizeof dir, "%s", dir_opt);
        mkdir(dir, 0755);
    } else {
        snprintf(dir, sizeof dir, "/tmp/moesim-bench-gpu-XXXXXX");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "bench_gpu_engine: mkdtemp: %s\n", strerror(errno));
            return 1;
        }
    }
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/model.safetensors", dir);
    struct stat sb;
    if (!dir_opt || stat(cfg, &sb)) write_checkpoint(dir, layers);
    uint32_t all = layers * EXPERTS, quarter = all / 4 > TOP_K ? all / 4 : TOP_K;
    printf("\ndecode on %s, batch 1, %u tokens after an 8-token prompt, random OLMoE-geometry "
           "checkpoint of %u layers (%u experts):\n",
           g.name, gen, layers, all);
    const moesim_precision precs[] = {PREC_BF16, PREC_INT8, PREC_INT4, PREC_INT2};
    for (size_t i = 0; i < 4; i++) {
        decode_figure(dir, precs[i], 0, gen);
        decode_figure(dir, precs[i], quarter, gen);
    }
    if (!dir_opt) {
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        unlink(cfg);
        snprintf(cfg, sizeof cfg, "%s/model.safetensors", dir);
        unlink(cfg);
        rmdir(dir);
    }
    return 0;
}
