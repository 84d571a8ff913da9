/* CUDA kernels of kernels_cuda.h (the CPU references in kernels/cpu/kernels_cpu.c define what is
 * correct; tests/test_gpu_kernels.c compares the two with named tolerances).
 *
 * Matrix-vector products are memory-bound at batch 1: one warp owns an output row and streams it
 * with 128-bit loads (uint4) whenever the row start is 16-byte aligned, falling back to 32-bit
 * loads otherwise; fp32 accumulation; a warp shuffle reduction at the end. Quantized rows are
 * staged 32 blocks at a time (2176 / 1152 / 640 bytes for int8 / int4 / int2, all multiples of
 * 16) into the warp's shared-memory slice with coalesced loads, then each lane decodes one block
 * (its odd word stride, 17 / 9 / 5 words, keeps the shared-memory reads free of bank conflicts)
 * and dots it with the 64 matching inputs. Reductions over a row use w = d q + m:
 * sum_i w_i x_i = d sum_i q_i x_i + m sum_i x_i, as the CPU reference does.
 *
 * Units: sizes are element counts; byte counts end in _bytes. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernels_cuda.h"

namespace {

constexpr int WARP = 32;
constexpr int GROUP = 64;           /* QUANT_GROUP of kernels/quant.h */
constexpr int MATVEC_WARPS = 8;     /* rows per thread block of the matvec kernels */
constexpr int REDUCE_THREADS = 256; /* norms and softmax */
constexpr int TOPK_THREADS = 512;
constexpr int TOPK_MAX_N = 4096;
constexpr int ATTN_THREADS = 128;

/* Bytes of one quant.h block: fp16 d, fp16 m, then the codes. */
template <int BITS> struct qblock {
    static constexpr int bytes = 4 + GROUP * BITS / 8;
    static constexpr int chunk_bytes = WARP * bytes; /* one block per lane */
    static_assert(chunk_bytes % 16 == 0, "a chunk of 32 blocks is a whole number of uint4");
    static_assert(bytes % 4 == 0, "blocks are whole words");
};

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the thread block (blockDim.x a multiple of 32, <= 1024); every thread gets it. */
__device__ double block_sum_d(double v) {
    __shared__ double part[32];
    __shared__ double total;
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    v = warp_sum_d(v);
    if (lane == 0) part[w] = v;
    __syncthreads();
    if (w == 0) {
        double s = lane < (int)(blockDim.x / WARP) ? part[lane] : 0.0;
        s = warp_sum_d(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    double r = total;
    __syncthreads(); /* part/total may be reused by the next call */
    return r;
}
__device__ float block_max(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    v = warp_max(v);
    if (lane == 0) part[w] = v;
    __syncthreads();
    if (w == 0) {
        float s = lane < (int)(blockDim.x / WARP) ? part[lane] : -INFINITY;
        s = warp_max(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t b) { return __uint_as_float(b << 16); }
__device__ __forceinline__ float fp16_bits_to_f32(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

/* ---- RMSNorm ---- */

__global__ void rmsnorm_rows_kernel(float *y, const float *x, const float *w, size_t n, float eps) {
    const float *xr = x + blockIdx.x * n;
    float *yr = y + blockIdx.x * n;
    double ss = 0; /* double, as the reference: n reaches 2^16 */
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum_d(ss);
    float inv = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] * inv) * w[i];
}

/* ---- matrix-vector and small-batch products ---- */

/* fp32 rows: VEC reads float4 (cols % 4 == 0, w and x 16-byte aligned). */
template <bool VEC>
__global__ void matvec_f32_kernel(float *y, const float *w, const float *x, size_t rows,
                                  size_t cols) {
    size_t r = (size_t)blockIdx.x * MATVEC_WARPS + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (r >= rows) return;
    const float *wr = w + r * cols;
    float acc = 0;
    if (VEC) {
        const float4 *w4 = reinterpret_cast<const float4 *>(wr);
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        for (size_t i = lane; i < cols / 4; i += WARP) {
            float4 a = __ldg(&w4[i]), b = __ldg(&x4[i]);
            acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
    } else {
        for (size_t i = lane; i < cols; i += WARP) acc += __ldg(&wr[i]) * __ldg(&x[i]);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[r] = acc;
}

/* bf16 rows against NB vectors: VEC reads 8 weights per uint4 (cols % 8 == 0, w 16-aligned). */
template <bool VEC, int NB>
__global__ void gemm_bf16_kernel(float *y, const uint16_t *w, const float *x, size_t rows,
                                 size_t cols) {
    size_t r = (size_t)blockIdx.x * MATVEC_WARPS + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (r >= rows) return;
    const uint16_t *wr = w + r * cols;
    float acc[NB];
    for (int b = 0; b < NB; b++) acc[b] = 0;
    if (VEC) {
        const uint4 *w8 = reinterpret_cast<const uint4 *>(wr);
        for (size_t i = lane; i < cols / 8; i += WARP) {
            uint4 q = __ldg(&w8[i]);
            uint32_t u[4] = {q.x, q.y, q.z, q.w};
            float f[8];
            for (int j = 0; j < 4; j++) {
                f[2 * j] = bf16_bits_to_f32(u[j] & 0xffffu);
                f[2 * j + 1] = bf16_bits_to_f32(u[j] >> 16);
            }
            for (int b = 0; b < NB; b++) {
                const float4 *x4 = reinterpret_cast<const float4 *>(x + b * cols + i * 8);
                float4 a = __ldg(&x4[0]), c = __ldg(&x4[1]);
                acc[b] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * c.x +
                          f[5] * c.y + f[6] * c.z + f[7] * c.w;
            }
        }
    } else {
        for (size_t i = lane; i < cols; i += WARP) {
            float f = bf16_bits_to_f32(__ldg(&wr[i]));
            for (int b = 0; b < NB; b++) acc[b] += f * __ldg(&x[b * cols + i]);
        }
    }
    for (int b = 0; b < NB; b++) {
        float s = warp_sum(acc[b]);
        if (lane == 0) y[b * rows + r] = s;
    }
}

/* One block of 64 codes dotted with NB vectors: qx[b] = sum q_i x_b,i, sx[b] = sum x_b,i.
 * blk: the block in shared memory (word aligned); xg: the group's first input of vector 0. */
template <int BITS, int NB>
__device__ __forceinline__ void block_dot(const uint8_t *blk, const float *xg, size_t cols,
                                          float *acc) {
    const uint16_t *dm = reinterpret_cast<const uint16_t *>(blk);
    float d = fp16_bits_to_f32(dm[0]), m = fp16_bits_to_f32(dm[1]);
    const uint32_t *codes = reinterpret_cast<const uint32_t *>(blk + 4);
    constexpr int WORDS = GROUP * BITS / 32; /* code words per block */
    constexpr int PER_WORD = 32 / BITS;      /* codes per word */
    constexpr uint32_t MASK = (1u << BITS) - 1;
    float qx[NB], sx[NB];
    for (int b = 0; b < NB; b++) qx[b] = sx[b] = 0;
#pragma unroll
    for (int wd = 0; wd < WORDS; wd++) {
        uint32_t word = codes[wd];
        /* the word's codes cover inputs wd*PER_WORD .. +PER_WORD-1 (little-endian packing: code
         * i of the block sits in byte i*BITS/8 at bit (i*BITS)%8, i.e. bit i*BITS of the word) */
#pragma unroll
        for (int j4 = 0; j4 < PER_WORD; j4 += 4) {
            float q0 = (float)((word >> ((j4 + 0) * BITS)) & MASK);
            float q1 = (float)((word >> ((j4 + 1) * BITS)) & MASK);
            float q2 = (float)((word >> ((j4 + 2) * BITS)) & MASK);
            float q3 = (float)((word >> ((j4 + 3) * BITS)) & MASK);
            for (int b = 0; b < NB; b++) {
                float4 xv =
                    __ldg(reinterpret_cast<const float4 *>(xg + b * cols + wd * PER_WORD + j4));
                qx[b] += q0 * xv.x + q1 * xv.y + q2 * xv.z + q3 * xv.w;
                sx[b] += (xv.x + xv.y) + (xv.z + xv.w);
            }
        }
    }
    for (int b = 0; b < NB; b++) acc[b] += d * qx[b] + m * sx[b];
}

template <int BITS, int NB>
__global__ void gemm_quant_kernel(float *y, const uint8_t *w, const float *x, size_t rows,
                                  size_t cols) {
    using B = qblock<BITS>;
    __shared__ uint4 stage[MATVEC_WARPS][B::chunk_bytes / 16];
    int wid = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    size_t r = (size_t)blockIdx.x * MATVEC_WARPS + wid;
    if (r >= rows) return; /* whole warps leave together: no block-wide barrier below */
    size_t nb = cols / GROUP;
    const uint8_t *wr = w + r * nb * B::bytes;
    bool vec = (reinterpret_cast<uintptr_t>(wr) % 16) == 0; /* chunks then stay 16-aligned */
    uint4 *buf = stage[wid];
    float acc[NB];
    for (int b = 0; b < NB; b++) acc[b] = 0;
    for (size_t c0 = 0; c0 < nb; c0 += WARP) {
        size_t nblk = nb - c0 < (size_t)WARP ? nb - c0 : (size_t)WARP;
        size_t bytes = nblk * B::bytes;
        const uint8_t *src = wr + c0 * B::bytes;
        __syncwarp(); /* the previous chunk has been read by every lane */
        if (vec) {
            const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
            size_t n16 = bytes / 16;
            for (size_t i = lane; i < n16; i += WARP) buf[i] = __ldg(&s4[i]);
            const uint32_t *s1 = reinterpret_cast<const uint32_t *>(src);
            uint32_t *b1 = reinterpret_cast<uint32_t *>(buf);
            for (size_t i = n16 * 4 + lane; i < bytes / 4; i += WARP) b1[i] = __ldg(&s1[i]);
        } else {
            const uint32_t *s1 = reinterpret_cast<const uint32_t *>(src);
            uint32_t *b1 = reinterpret_cast<uint32_t *>(buf);
            for (size_t i = lane; i < bytes / 4; i += WARP) b1[i] = __ldg(&s1[i]);
        }
        __syncwarp();
        if ((size_t)lane < nblk)
            block_dot<BITS, NB>(reinterpret_cast<const uint8_t *>(buf) + lane * B::bytes,
                                x + (c0 + lane) * GROUP, cols, acc);
    }
    for (int b = 0; b < NB; b++) {
        float s = warp_sum(acc[b]);
        if (lane == 0) y[b * rows + r] = s;
    }
}

/* Batch-1 GEMV of quantized rows, the decode hot path. Each warp owns GEMV_ROWS consecutive rows
 * and walks them together chunk by chunk: the chunks of all its rows are loaded (128-bit when a
 * row is 16-byte aligned) before any is decoded, so a warp keeps GEMV_ROWS chunks in flight, and
 * each lane loads the 64 inputs of its block into registers once for all GEMV_ROWS rows (the
 * inputs would otherwise be re-read from L1 for every row: 256 bytes per 20-byte int2 block).
 * sum_i x_i of the group is shared by the rows too. */
constexpr int GEMV_WARPS = 4;
constexpr int GEMV_ROWS = 4;

/* Copies `bytes` (a multiple of 4) from global src to shared dst with the warp's lanes. */
__device__ __forceinline__ void stage_chunk(uint4 *dst, const uint8_t *src, size_t bytes,
                                            int lane) {
    uint32_t *d1 = reinterpret_cast<uint32_t *>(dst);
    const uint32_t *s1 = reinterpret_cast<const uint32_t *>(src);
    size_t done_words = 0;
    if (reinterpret_cast<uintptr_t>(src) % 16 == 0) {
        const uint4 *s4 = reinterpret_cast<const uint4 *>(src);
        size_t n16 = bytes / 16;
        for (size_t i = lane; i < n16; i += WARP) dst[i] = __ldg(&s4[i]);
        done_words = n16 * 4;
    }
    for (size_t i = done_words + lane; i < bytes / 4; i += WARP) d1[i] = __ldg(&s1[i]);
}

template <int BITS>
__device__ __forceinline__ float block_dot_reg(const uint8_t *blk, const float (&xr)[GROUP],
                                               float sx) {
    const uint16_t *dm = reinterpret_cast<const uint16_t *>(blk);
    float d = fp16_bits_to_f32(dm[0]), m = fp16_bits_to_f32(dm[1]);
    const uint32_t *codes = reinterpret_cast<const uint32_t *>(blk + 4);
    constexpr int WORDS = GROUP * BITS / 32, PER_WORD = 32 / BITS;
    constexpr uint32_t MASK = (1u << BITS) - 1;
    float qx = 0;
#pragma unroll
    for (int wd = 0; wd < WORDS; wd++) {
        uint32_t word = codes[wd];
#pragma unroll
        for (int j = 0; j < PER_WORD; j++)
            qx += (float)((word >> (j * BITS)) & MASK) * xr[wd * PER_WORD + j];
    }
    return d * qx + m * sx;
}

template <int BITS>
__global__ void __launch_bounds__(GEMV_WARPS *WARP)
    gemv_quant_kernel(float *y, const uint8_t *w, const float *x, size_t rows, size_t cols) {
    using B = qblock<BITS>;
    __shared__ uint4 stage[GEMV_WARPS][GEMV_ROWS][B::chunk_bytes / 16];
    int wid = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    size_t r0 = ((size_t)blockIdx.x * GEMV_WARPS + wid) * GEMV_ROWS;
    if (r0 >= rows) return; /* whole warps leave together: no block-wide barrier below */
    int nr = rows - r0 < (size_t)GEMV_ROWS ? (int)(rows - r0) : GEMV_ROWS;
    size_t nb = cols / GROUP, row_bytes = nb * B::bytes;
    float acc[GEMV_ROWS];
#pragma unroll
    for (int i = 0; i < GEMV_ROWS; i++) acc[i] = 0;
    for (size_t c0 = 0; c0 < nb; c0 += WARP) {
        size_t nblk = nb - c0 < (size_t)WARP ? nb - c0 : (size_t)WARP;
        __syncwarp(); /* every lane is done with the previous chunks */
#pragma unroll
        for (int i = 0; i < GEMV_ROWS; i++)
            if (i < nr)
                stage_chunk(stage[wid][i], w + (r0 + i) * row_bytes + c0 * B::bytes,
                            nblk * B::bytes, lane);
        __syncwarp();
        if ((size_t)lane < nblk) {
            const float4 *xg = reinterpret_cast<const float4 *>(x + (c0 + lane) * GROUP);
            float xr[GROUP];
            float sx = 0;
#pragma unroll
            for (int j = 0; j < GROUP / 4; j++) {
                float4 v = __ldg(&xg[j]);
                xr[4 * j] = v.x;
                xr[4 * j + 1] = v.y;
                xr[4 * j + 2] = v.z;
                xr[4 * j + 3] = v.w;
                sx += (v.x + v.y) + (v.z + v.w);
            }
#pragma unroll
            for (int i = 0; i < GEMV_ROWS; i++)
                if (i < nr)
                    acc[i] += block_dot_reg<BITS>(
                        reinterpret_cast<const uint8_t *>(stage[wid][i]) + lane * B::bytes, xr, sx);
        }
    }
#pragma unroll
    for (int i = 0; i < GEMV_ROWS; i++) {
        float sum = warp_sum(acc[i]);
        if (i < nr && lane == 0) y[r0 + i] = sum;
    }
}

void launch_gemv_quant(float *y, moesim_precision p, const void *w, const float *x, size_t rows,
                       size_t cols, cudaStream_t s) {
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    constexpr size_t per_block = (size_t)GEMV_WARPS * GEMV_ROWS;
    dim3 grid((unsigned)((rows + per_block - 1) / per_block)), block(GEMV_WARPS * WARP);
    switch (p) {
    case PREC_INT8:
        gemv_quant_kernel<8><<<grid, block, 0, s>>>(y, wb, x, rows, cols);
        break;
    case PREC_INT4:
        gemv_quant_kernel<4><<<grid, block, 0, s>>>(y, wb, x, rows, cols);
        break;
    case PREC_INT2:
        gemv_quant_kernel<2><<<grid, block, 0, s>>>(y, wb, x, rows, cols);
        break;
    default:
        CUDA_REQUIRE(!"kern_*_quant_cuda: precision is not int8, int4 or int2");
    }
    CUDA_LAUNCH_CHECK();
}

unsigned matvec_grid(size_t rows) { return (unsigned)((rows + MATVEC_WARPS - 1) / MATVEC_WARPS); }

bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int NB>
void launch_gemm_bf16(float *y, const uint16_t *w, const float *x, size_t rows, size_t cols,
                      cudaStream_t s) {
    bool vec = cols % 8 == 0 && aligned16(w) && aligned16(x);
    if (vec)
        gemm_bf16_kernel<true, NB>
            <<<matvec_grid(rows), MATVEC_WARPS * WARP, 0, s>>>(y, w, x, rows, cols);
    else
        gemm_bf16_kernel<false, NB>
            <<<matvec_grid(rows), MATVEC_WARPS * WARP, 0, s>>>(y, w, x, rows, cols);
    CUDA_LAUNCH_CHECK();
}

template <int NB>
void launch_gemm_quant(float *y, moesim_precision p, const void *w, const float *x, size_t rows,
                       size_t cols, cudaStream_t s) {
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    dim3 grid(matvec_grid(rows)), block(MATVEC_WARPS * WARP);
    switch (p) {
    case PREC_INT8:
        gemm_quant_kernel<8, NB><<<grid, block, 0, s>>>(y, wb, x, rows, cols);
        break;
    case PREC_INT4:
        gemm_quant_kernel<4, NB><<<grid, block, 0, s>>>(y, wb, x, rows, cols);
        break;
    case PREC_INT2:
        gemm_quant_kernel<2, NB><<<grid, block, 0, s>>>(y, wb, x, rows, cols);
        break;
    default:
        CUDA_REQUIRE(!"kern_*_quant_cuda: precision is not int8, int4 or int2");
    }
    CUDA_LAUNCH_CHECK();
}

/* Vectors per pass of the small-batch GEMMs: the largest of {8, 4, 2, 1} not above n. */
int batch_tile(size_t n) { return n >= 8 ? 8 : n >= 4 ? 4 : n >= 2 ? 2 : 1; }

/* ---- cuBLAS helper ---- */

__global__ void f32_to_bf16_kernel(uint16_t *out, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
}

/* ---- elementwise ---- */

__global__ void rope_kernel(float *x, unsigned n_heads, unsigned head_dim, uint32_t pos,
                            float theta) {
    unsigned half = head_dim / 2;
    unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_heads * half) return;
    unsigned h = t / half, i = t % half;
    /* as the reference (and Hugging Face): fp32 inverse frequency, fp32 angle */
    float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
    float angle = (float)pos * inv_freq;
    float c = cosf(angle), sn = sinf(angle);
    float *xh = x + (size_t)h * head_dim;
    float a = xh[i], b = xh[i + half];
    xh[i] = a * c - b * sn;
    xh[i + half] = b * c + a * sn;
}

__global__ void swiglu_kernel(float *h, const float *gate, const float *up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    h[i] = g / (1.0f + expf(-g)) * up[i];
}

/* ---- softmax and top-k (one thread block) ---- */

__device__ void block_softmax(float *out, const float *in, size_t n) {
    float mx = -INFINITY;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, in[i]);
    mx = block_max(mx);
    double sum = 0; /* double, as the reference */
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        float e = expf(in[i] - mx);
        out[i] = e;
        sum += e;
    }
    sum = block_sum_d(sum);
    float inv = (float)(1.0 / sum);
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) out[i] *= inv;
    __syncthreads();
}

/* (v, i) beats (bv, bi): larger value, ties to the lower index (the reference's order). */
__device__ __forceinline__ bool topk_better(float v, unsigned i, float bv, unsigned bi) {
    return v > bv || (v == bv && i < bi);
}

/* k rounds of a block-wide argmax over the values not yet taken. x: [n] in global memory. */
__device__ void block_topk(const float *x, size_t n, size_t k, uint32_t *ids, float *vals) {
    __shared__ float sv[TOPK_MAX_N];
    __shared__ unsigned char taken[TOPK_MAX_N];
    __shared__ float wv[32];
    __shared__ unsigned wi[32];
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        sv[i] = x[i];
        taken[i] = 0;
    }
    __syncthreads();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    for (size_t r = 0; r < k; r++) {
        float bv = -INFINITY;
        unsigned bi = 0xffffffffu;
        for (size_t i = threadIdx.x; i < n; i += blockDim.x)
            if (!taken[i] && topk_better(sv[i], (unsigned)i, bv, bi)) {
                bv = sv[i];
                bi = (unsigned)i;
            }
        for (int o = WARP / 2; o > 0; o /= 2) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (topk_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            wv[w] = bv;
            wi[w] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int j = 1; j < n_warps; j++)
                if (topk_better(wv[j], wi[j], bv, bi)) {
                    bv = wv[j];
                    bi = wi[j];
                }
            /* only NaNs left (never "better"): take the lowest untaken index, as nothing
             * orders them; keeps bi < n */
            if (bi >= n)
                for (unsigned j = 0; j < n; j++)
                    if (!taken[j]) {
                        bi = j;
                        bv = sv[j];
                        break;
                    }
            ids[r] = bi;
            vals[r] = bv;
            taken[bi] = 1;
        }
        __syncthreads();
    }
}

__global__ void softmax_kernel(float *x, size_t n) { block_softmax(x, x, n); }

__global__ void topk_kernel(const float *x, size_t n, size_t k, uint32_t *ids, float *vals) {
    block_topk(x, n, k, ids, vals);
}

__global__ void router_topk_kernel(float *probs, const float *logits, size_t n, size_t k,
                                   uint32_t *ids, float *vals) {
    block_softmax(probs, logits, n);
    block_topk(probs, n, k, ids, vals);
}

/* ---- attention ---- */

/* Block (head h, query qi): scores over the query's horizon with a warp per position, softmax,
 * then out[i] = sum_t p[t] v[t][i] with a thread per i summing t in increasing order (the
 * reference's order). q: [n_q][n_heads][hd]; probs: [n_q][n_heads][n_ctx]. */
__global__ void attention_kernel(float *out, float *probs, const float *q, const float *k,
                                 const float *v, unsigned n_q, unsigned n_heads,
                                 unsigned n_kv_heads, unsigned hd, size_t n_ctx) {
    extern __shared__ float qs[]; /* [hd] */
    unsigned h = blockIdx.x, qi = blockIdx.y;
    unsigned kvh = h / (n_heads / n_kv_heads);
    size_t kv_stride = (size_t)n_kv_heads * hd;
    size_t horizon = n_ctx - n_q + qi + 1;
    const float *qh = q + ((size_t)qi * n_heads + h) * hd;
    float *p = probs + ((size_t)qi * n_heads + h) * n_ctx;
    float *oh = out + ((size_t)qi * n_heads + h) * hd;
    for (unsigned i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qh[i];
    __syncthreads();
    float scale = 1.0f / sqrtf((float)hd);
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    for (size_t t = w; t < horizon; t += n_warps) {
        const float *kt = k + t * kv_stride + (size_t)kvh * hd;
        float acc = 0;
        for (unsigned i = lane; i < hd; i += WARP) acc += qs[i] * kt[i];
        acc = warp_sum(acc);
        if (lane == 0) p[t] = acc * scale;
    }
    for (size_t t = horizon + threadIdx.x; t < n_ctx; t += blockDim.x) p[t] = 0;
    __syncthreads();
    float mx = -INFINITY;
    for (size_t t = threadIdx.x; t < horizon; t += blockDim.x) mx = fmaxf(mx, p[t]);
    mx = block_max(mx);
    double sum = 0;
    for (size_t t = threadIdx.x; t < horizon; t += blockDim.x) {
        float e = expf(p[t] - mx);
        p[t] = e;
        sum += e;
    }
    sum = block_sum_d(sum);
    float inv = (float)(1.0 / sum);
    for (size_t t = threadIdx.x; t < horizon; t += blockDim.x) p[t] *= inv;
    __syncthreads();
    for (unsigned i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0;
        const float *vi = v + (size_t)kvh * hd + i;
        for (size_t t = 0; t < horizon; t++) acc += p[t] * vi[t * kv_stride];
        oh[i] = acc;
    }
}

unsigned blocks_for(size_t n, unsigned threads) { return (unsigned)((n + threads - 1) / threads); }

} // namespace

extern "C" {

void kern_rmsnorm_cuda(float *y, const float *x, const float *w, size_t n, float eps,
                       cudaStream_t s) {
    kern_rmsnorm_rows_cuda(y, x, w, 1, n, eps, s);
}

void kern_rmsnorm_rows_cuda(float *y, const float *x, const float *w, size_t n_rows, size_t n,
                            float eps, cudaStream_t s) {
    if (!n_rows || !n) return;
    CUDA_REQUIRE(n_rows <= 0x7fffffffu);
    rmsnorm_rows_kernel<<<(unsigned)n_rows, REDUCE_THREADS, 0, s>>>(y, x, w, n, eps);
    CUDA_LAUNCH_CHECK();
}

void kern_matvec_f32_cuda(float *y, const float *w, const float *x, size_t rows, size_t cols,
                          cudaStream_t s) {
    if (!rows) return;
    if (cols % 4 == 0 && aligned16(w) && aligned16(x))
        matvec_f32_kernel<true>
            <<<matvec_grid(rows), MATVEC_WARPS * WARP, 0, s>>>(y, w, x, rows, cols);
    else
        matvec_f32_kernel<false>
            <<<matvec_grid(rows), MATVEC_WARPS * WARP, 0, s>>>(y, w, x, rows, cols);
    CUDA_LAUNCH_CHECK();
}

void kern_matvec_bf16_cuda(float *y, const uint16_t *w, const float *x, size_t rows, size_t cols,
                           cudaStream_t s) {
    if (!rows) return;
    launch_gemm_bf16<1>(y, w, x, rows, cols, s);
}

void kern_matvec_quant_cuda(float *y, moesim_precision p, const void *w, const float *x,
                            size_t rows, size_t cols, cudaStream_t s) {
    kern_gemm_quant_cuda(y, p, w, x, rows, cols, 1, s);
}

void kern_gemm_bf16_cuda(float *y, const uint16_t *w, const float *x, size_t rows, size_t cols,
                         size_t n_batch, cudaStream_t s) {
    if (!rows) return;
    for (size_t b = 0; b < n_batch;) {
        int t = batch_tile(n_batch - b);
        float *yb = y + b * rows;
        const float *xb = x + b * cols;
        switch (t) {
        case 8:
            launch_gemm_bf16<8>(yb, w, xb, rows, cols, s);
            break;
        case 4:
            launch_gemm_bf16<4>(yb, w, xb, rows, cols, s);
            break;
        case 2:
            launch_gemm_bf16<2>(yb, w, xb, rows, cols, s);
            break;
        default:
            launch_gemm_bf16<1>(yb, w, xb, rows, cols, s);
            break;
        }
        b += (size_t)t;
    }
}

void kern_gemm_quant_cuda(float *y, moesim_precision p, const void *w, const float *x, size_t rows,
                          size_t cols, size_t n_batch, cudaStream_t s) {
    if (!rows) return;
    CUDA_REQUIRE(cols % GROUP == 0 && cols > 0);
    CUDA_REQUIRE(reinterpret_cast<uintptr_t>(w) % 4 == 0 && aligned16(x));
    for (size_t b = 0; b < n_batch;) {
        int t = batch_tile(n_batch - b);
        float *yb = y + b * rows;
        const float *xb = x + b * cols;
        switch (t) {
        case 8:
            launch_gemm_quant<8>(yb, p, w, xb, rows, cols, s);
            break;
        case 4:
            launch_gemm_quant<4>(yb, p, w, xb, rows, cols, s);
            break;
        case 2:
            launch_gemm_quant<2>(yb, p, w, xb, rows, cols, s);
            break;
        default: /* batch 1: the register-reuse GEMV */
            launch_gemv_quant(yb, p, w, xb, rows, cols, s);
            break;
        }
        b += (size_t)t;
    }
}

void kern_gemm_bf16_cublas(const cublas_lazy_handle *b, float *y, const uint16_t *w, const float *x,
                           uint16_t *x_bf16, size_t rows, size_t cols, size_t n_batch,
                           cudaStream_t s) {
    if (!rows || !n_batch) return;
    size_t n = n_batch * cols;
    f32_to_bf16_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x_bf16, x, n);
    CUDA_LAUNCH_CHECK();
    /* column-major view: W is cols x rows (lda cols), X^T is cols x n_batch (ldb cols);
     * Y^T = op(W)^T X^T is rows x n_batch (ldc rows), i.e. Y row-major [n_batch][rows] */
    const float alpha = 1.0f, beta = 0.0f;
    CUDA_REQUIRE(b && b->h);
    CUDA_REQUIRE(rows <= INT32_MAX && cols <= INT32_MAX && n_batch <= INT32_MAX);
    CUBLAS_CHECK(b->api->gemm_ex(b->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n_batch, (int)cols,
                                 &alpha, w, CUDA_R_16BF, (int)cols, x_bf16, CUDA_R_16BF, (int)cols,
                                 &beta, y, CUDA_R_32F, (int)rows, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

void kern_rope_cuda(float *x, size_t n_heads, size_t head_dim, uint32_t pos, double theta,
                    cudaStream_t s) {
    size_t n = n_heads * (head_dim / 2);
    if (!n) return;
    rope_kernel<<<blocks_for(n, 128), 128, 0, s>>>(x, (unsigned)n_heads, (unsigned)head_dim, pos,
                                                   (float)theta);
    CUDA_LAUNCH_CHECK();
}

void kern_softmax_cuda(float *x, size_t n, cudaStream_t s) {
    if (!n) return;
    softmax_kernel<<<1, REDUCE_THREADS, 0, s>>>(x, n);
    CUDA_LAUNCH_CHECK();
}

void kern_swiglu_cuda(float *h, const float *gate, const float *up, size_t n, cudaStream_t s) {
    if (!n) return;
    swiglu_kernel<<<blocks_for(n, 256), 256, 0, s>>>(h, gate, up, n);
    CUDA_LAUNCH_CHECK();
}

void kern_attention_cuda(float *out, float *probs, const float *q, const float *k, const float *v,
                         size_t n_heads, size_t n_kv_heads, size_t head_dim, size_t n_ctx,
                         cudaStream_t s) {
    kern_attention_prefill_cuda(out, probs, q, k, v, 1, n_heads, n_kv_heads, head_dim, n_ctx, s);
}

void kern_attention_prefill_cuda(float *out, float *probs, const float *q, const float *k,
                                 const float *v, size_t n_q, size_t n_heads, size_t n_kv_heads,
                                 size_t head_dim, size_t n_ctx, cudaStream_t s) {
    CUDA_REQUIRE(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && n_q >= 1 && n_q <= n_ctx);
    CUDA_REQUIRE(n_q <= 65535 && n_heads <= 0x7fffffffu && head_dim <= 12288);
    dim3 grid((unsigned)n_heads, (unsigned)n_q);
    attention_kernel<<<grid, ATTN_THREADS, head_dim * sizeof(float), s>>>(
        out, probs, q, k, v, (unsigned)n_q, (unsigned)n_heads, (unsigned)n_kv_heads,
        (unsigned)head_dim, n_ctx);
    CUDA_LAUNCH_CHECK();
}

void kern_topk_cuda(const float *x, size_t n, size_t k, uint32_t *ids, float *vals,
                    cudaStream_t s) {
    CUDA_REQUIRE(k <= n && n <= (size_t)TOPK_MAX_N);
    if (!k) return;
    topk_kernel<<<1, TOPK_THREADS, 0, s>>>(x, n, k, ids, vals);
    CUDA_LAUNCH_CHECK();
}

void kern_router_topk_cuda(float *probs, const float *logits, size_t n, size_t k, uint32_t *ids,
                           float *vals, cudaStream_t s) {
    CUDA_REQUIRE(k <= n && n >= 1 && n <= (size_t)TOPK_MAX_N);
    router_topk_kernel<<<1, TOPK_THREADS, 0, s>>>(probs, logits, n, k, ids, vals);
    CUDA_LAUNCH_CHECK();
}

} // extern "C"
