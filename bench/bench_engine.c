/* CPU engine figures: expert GEMV bandwidth per precision against the machine's own streaming
 * read bandwidth, and decode tokens/s of a mid-size random model (OLMoE-1B-7B geometry cut to 4
 * layers: hidden 2048, 64 experts of width 1024, top-8, vocab 50304), written as a real
 * checkpoint (config.json + model.safetensors, bf16) and loaded through engine_load.
 *
 *   bench_engine [--layers N] [--gen N] [--threads N] [--dir DIR] [--gemv-only]
 *
 * The checkpoint (~3.6 GB for 4 layers) goes to DIR (default: a fresh folder under /tmp) and is
 * removed at the end unless --dir was given. GEMV figures are single-threaded (one core's share
 * of the memory system); decode uses every thread the engine is given. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/progress.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "bench/support/random_checkpoint.h"

/* Single-thread streaming read of a buffer far larger than the caches: the reference the GEMV
 * figures are compared with. */
static double stream_read_gb_per_s(void) {
    size_t n = (size_t)1 << 27; /* 1 GiB of uint64 */
    uint64_t *buf = moesim_xmalloc(n * sizeof *buf);
    for (size_t i = 0; i < n; i++) buf[i] = i;
    volatile uint64_t sink = 0;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = moesim_monotonic_s();
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i < n; i += 4)
            s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
        sink += s0 + s1 + s2 + s3;
        double gbs = n * sizeof *buf / (moesim_monotonic_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    free(buf);
    return best;
}

/* Expert-matrix GEMV (INTER x HIDDEN, the gate/up shape) at precision p over enough experts that
 * the weights stream from DRAM; returns weight GB/s on one thread. */
static double gemv_gb_per_s(moesim_precision p) {
    enum { N_MATS = 96 }; /* 96 x 4 MiB at bf16: far beyond the last-level cache */
    size_t rows = INTER, cols = HIDDEN, bytes = quant_matrix_size_bytes(p, rows, cols);
    uint8_t *w = moesim_xmalloc(N_MATS * bytes);
    float *src = moesim_xmalloc(cols * sizeof *src), x[HIDDEN], y[INTER];
    for (size_t c = 0; c < cols; c++) x[c] = uniform_pm(1.0f);
    size_t row_bytes = bytes / rows;
    for (size_t m = 0; m < N_MATS; m++)
        for (size_t r = 0; r < rows; r++) {
            for (size_t c = 0; c < cols; c++) src[c] = uniform_pm(0.02f);
            uint8_t *dst = w + m * bytes + r * row_bytes;
            if (p == PREC_BF16)
                for (size_t c = 0; c < cols; c++) ((uint16_t *)dst)[c] = quant_f32_to_bf16(src[c]);
            else
                quant_row_quantize_ref(p, src, dst, cols);
        }
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = moesim_monotonic_s();
        for (size_t m = 0; m < N_MATS; m++) {
            if (p == PREC_BF16)
                kern_matvec_bf16_cpu(y, (const uint16_t *)(w + m * bytes), x, rows, cols);
            else
                kern_matvec_quant_cpu(y, p, w + m * bytes, x, rows, cols);
        }
        double gbs = (double)N_MATS * bytes / (moesim_monotonic_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    free(w);
    free(src);
    return best;
}

static double decode_tokens_per_s(const char *dir, moesim_precision p, uint32_t gen,
                                  uint32_t threads, double *load_s) {
    engine_options eo = {.n_threads = threads, .precision_mask = 1u << p};
    engine *e;
    moesim_error err = {0};
    double t0 = moesim_monotonic_s();
    if (engine_load(dir, &eo, &e, &err)) {
        fprintf(stderr, "bench_engine: %s\n", err.msg);
        exit(1);
    }
    *load_s = moesim_monotonic_s() - t0;
    engine_precmap pm;
    engine_precmap_init(&pm, e, (uint8_t)p);
    engine_seq *s = engine_seq_create(e, 8 + gen);
    float *logits = moesim_xmalloc(VOCAB * sizeof *logits);
    int32_t tok = 1;
    for (uint32_t i = 0; i < 8; i++) /* prefill a short prompt */
        if (engine_seq_forward(e, s, (int32_t)(17 * i + 3), &pm, logits, NULL, &err)) exit(1);
    t0 = moesim_monotonic_s();
    for (uint32_t i = 0; i < gen; i++) {
        if (engine_seq_forward(e, s, tok, &pm, logits, NULL, &err)) {
            fprintf(stderr, "bench_engine: %s\n", err.msg);
            exit(1);
        }
        tok = (int32_t)engine_sample(logits, VOCAB, 0, 0);
    }
    double tps = gen / (moesim_monotonic_s() - t0);
    free(logits);
    engine_seq_destroy(s);
    engine_precmap_free(&pm);
    engine_destroy(e);
    return tps;
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"layers", required_argument, NULL, 'l'},
                                         {"gen", required_argument, NULL, 'g'},
                                         {"threads", required_argument, NULL, 't'},
                                         {"dir", required_argument, NULL, 'd'},
                                         {"gemv-only", no_argument, NULL, 'G'},
                                         {NULL, 0, NULL, 0}};
    uint32_t layers = 4, gen = 16, threads = 0;
    const char *dir_opt = NULL;
    bool gemv_only = false;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'l':
            layers = (uint32_t)atoi(optarg);
            break;
        case 'g':
            gen = (uint32_t)atoi(optarg);
            break;
        case 't':
            threads = (uint32_t)atoi(optarg);
            break;
        case 'd':
            dir_opt = optarg;
            break;
        case 'G':
            gemv_only = true;
            break;
        default:
            fprintf(stderr,
                    "usage: bench_engine [--layers N] [--gen N] [--threads N] [--dir DIR] "
                    "[--gemv-only]\n");
            return 2;
        }
    }
    if (layers < 1 || layers > 64 || gen < 1) {
        fprintf(stderr, "bench_engine: --layers in 1..64 and --gen >= 1\n");
        return 2;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    printf("machine: %ld online CPUs\n", cpus);
    double stream = stream_read_gb_per_s();
    printf("streaming read, 1 thread: %.2f GB/s\n", stream);
    const moesim_precision precs[] = {PREC_BF16, PREC_INT8, PREC_INT4, PREC_INT2};
    printf("\nexpert GEMV %dx%d, 1 thread (weight bytes read per second):\n", INTER, HIDDEN);
    for (size_t i = 0; i < 4; i++) {
        double g = gemv_gb_per_s(precs[i]);
        printf("  %-5s %7.2f GB/s  (%3.0f%% of streaming read)\n", precision_name(precs[i]), g,
               100 * g / stream);
    }
    if (gemv_only) return 0;

    char dir[4096];
    if (dir_opt) {
        snprintf(dir, sizeof dir, "%s", dir_opt);
        mkdir(dir, 0755);
    } else {
        snprintf(dir, sizeof dir, "/tmp/moesim-bench-engine-XXXXXX");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "bench_engine: mkdtemp: %s\n", strerror(errno));
            return 1;
        }
    }
    double t0 = moesim_monotonic_s();
    write_checkpoint(dir, layers);
    printf("\nrandom OLMoE-geometry checkpoint, %u layers: written to %s in %.1f s\n", layers, dir,
           moesim_monotonic_s() - t0);
    printf("decode, batch 1, %u tokens after an 8-token prompt, %s threads:\n", gen,
           threads ? "given" : "all");
    for (size_t i = 0; i < 4; i++) {
        double load_s, tps = decode_tokens_per_s(dir, precs[i], gen, threads, &load_s);
        printf("  %-5s %7.2f tokens/s  (load + quantize %.1f s)\n", precision_name(precs[i]), tps,
               load_s);
    }
    if (!dir_opt) {
        char path[4200];
        snprintf(path, sizeof path, "%s/config.json", dir);
        unlink(path);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        unlink(path);
        rmdir(dir);
    }
    return 0;
}
