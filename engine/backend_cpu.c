/* The CPU backend: kernels/cpu references, matrix-vector products split by output row over the
 * thread pool (small matrices run on the calling thread: waking workers costs more). */
#include "common/check.h"
#include "engine/engine_internal.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#define PARALLEL_MIN_WEIGHTS (1u << 15) /* below this many weights a matvec stays single-thread */

typedef struct matvec_job {
    float *y;
    const engine_mat *w;
    const float *x;
} matvec_job;

static void matvec_rows(void *ctx, size_t begin, size_t end) {
    const matvec_job *j = ctx;
    const engine_mat *w = j->w;
    size_t cols = w->cols, rows = end - begin;
    switch (w->kind) {
    case MAT_F32:
        kern_matvec_f32_cpu(j->y + begin, (const float *)w->data + begin * cols, j->x, rows, cols);
        break;
    case MAT_BF16:
        kern_matvec_bf16_cpu(j->y + begin, (const uint16_t *)w->data + begin * cols, j->x, rows,
                             cols);
        break;
    case MAT_Q8:
        kern_matvec_quant_cpu(j->y + begin, PREC_INT8,
                              (const block_q8 *)w->data + begin * (cols / QUANT_GROUP), j->x, rows,
                              cols);
        break;
    case MAT_Q4:
        kern_matvec_quant_cpu(j->y + begin, PREC_INT4,
                              (const block_q4 *)w->data + begin * (cols / QUANT_GROUP), j->x, rows,
                              cols);
        break;
    case MAT_Q2:
        kern_matvec_quant_cpu(j->y + begin, PREC_INT2,
                              (const block_q2 *)w->data + begin * (cols / QUANT_GROUP), j->x, rows,
                              cols);
        break;
    }
}

static void cpu_matvec(thread_pool *pool, float *y, const engine_mat *w, const float *x) {
    matvec_job j = {y, w, x};
    if ((uint64_t)w->rows * w->cols < PARALLEL_MIN_WEIGHTS || !pool) matvec_rows(&j, 0, w->rows);
    else thread_pool_run(pool, w->rows, matvec_rows, &j);
}

const engine_backend engine_backend_cpu = {
    .name = "cpu",
    .matvec = cpu_matvec,
    .rmsnorm = kern_rmsnorm_cpu,
    .rope = kern_rope_cpu,
    .attention = kern_attention_cpu,
    .swiglu = kern_swiglu_cpu,
    .softmax = kern_softmax_cpu,
    .topk = kern_topk_cpu,
};
