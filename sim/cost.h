/* The compute-stream cost model: how long each op of a layer takes on the GPU.
 *
 * Roofline from the hardware profile: an op that does `flops` arithmetic and moves `bytes` to or
 * from device memory takes
 *     max(flops / (peak_ops_per_s * compute_efficiency), bytes / (hbm_bytes_per_s *
 * hbm_efficiency))
 *     + kernels * kernel_launch_ns
 * where peak_ops_per_s is the bf16 tensor peak, or the int8 peak for int8 / fp8 experts (the
 * narrower formats are weight-only: dequantized to bf16 in the kernel, so they run at the bf16
 * peak but read fewer bytes). The efficiency factors are the profile's hbm_efficiency and
 * compute_efficiency (documented in configs/hw/README.md, each an assumption until measured).
 *
 * A measured table (sim/COST.md defines the format; `moesim calibrate` writes it) replaces the
 * roofline for every (op, precision) it lists: linear interpolation inside the measured range
 * of x, a least-squares line outside it (with one warning per op on stderr).
 *
 * Units: ns for times, bytes, flops. All functions are pure; a cost_model is read-only after
 * cost_model_init / cost_table_load, so it may be shared by concurrent runs. */
#ifndef MOESIM_SIM_COST_H
#define MOESIM_SIM_COST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "common/status.h"

/* The ops of the compute stream, as named in a measured table. */
typedef enum cost_op {
    COST_ATTENTION = 0,  /* x = attended key positions of the step (sum over tokens of context) */
    COST_ROUTER,         /* x = tokens */
    COST_EXPERT_GATE_UP, /* x = tokens routed to the expert */
    COST_EXPERT_DOWN,    /* x = tokens routed to the expert */
    COST_SHARED,         /* x = tokens (all shared experts of one layer) */
    COST_COMBINE,        /* x = tokens */
    COST_DENSE_FFN,      /* x = tokens (non-MoE layers) */
    COST_LM_HEAD,        /* x = tokens that emit a token */
    COST_ATTENTION_PROJ, /* x = tokens: attention's q/k/v/o projections, when a measured table
                            times them apart from COST_ATTENTION's context part */
    COST_OP_COUNT
} cost_op;

const char *cost_op_name(cost_op op);

#define COST_TABLE_MAX_POINTS 64

/* Largest time_us a measured cost table may hold: 1e9 us = 1000 s for one op, far above any
 * kernel (see sim/COST.md); a larger value is a unit or typing error and fails the load. */
#define COST_TABLE_MAX_TIME_US 1e9

/* Every op time and transfer time (ns) is clamped to this before the double -> uint64 cast
 * (2^60 ns, about 36 years): the cast stays defined and sums of a few thousand such times
 * still fit in uint64. */
#define COST_NS_MAX ((uint64_t)1 << 60)

/* One measured curve: time of `op` at `precision` for increasing x. */
typedef struct cost_curve {
    uint32_t n;                         /* points; 0: not measured (roofline) */
    double x[COST_TABLE_MAX_POINTS];    /* [n] strictly increasing */
    double t_ns[COST_TABLE_MAX_POINTS]; /* [n] */
    double fit_a, fit_b;                /* least-squares line t = a + b x (extrapolation) */
} cost_curve;

typedef struct cost_model {
    hw_profile hw;                  /* copy */
    model_geometry model;           /* copy */
    quant_table quant;              /* copy */
    uint64_t attn_params_per_layer; /* attention + norms of one layer (bf16 params) */
    uint64_t kv_bytes_per_token_layer;
    bool has_table;
    cost_curve curve[COST_OP_COUNT][PREC_COUNT]; /* precision index only for expert ops */
} cost_model;

/* Fills the roofline model. */
void cost_model_init(cost_model *c, const hw_profile *hw, const model_geometry *m,
                     const quant_table *q);

/* Loads a measured table (sim/COST.md) into c; errors name the file and line. */
moesim_status cost_table_load(cost_model *c, const char *path, moesim_error *err);

/* False when the table measures (op, p) but not all of [lo, hi] (those times are
 * extrapolated); true for ops the table does not list. */
bool cost_table_covers(const cost_model *c, cost_op op, moesim_precision p, double lo, double hi);

/* Op times in ns. `prec` matters for expert ops only. */
uint64_t cost_op_ns(const cost_model *c, cost_op op, moesim_precision prec, double x);

/* Convenience wrappers the simulator and the closed-form tests share. */
uint64_t cost_attention_ns(const cost_model *c, uint32_t tokens, uint64_t attended_positions);
uint64_t cost_router_ns(const cost_model *c, uint32_t tokens);
uint64_t cost_expert_gate_up_ns(const cost_model *c, moesim_precision p, uint32_t tokens);
uint64_t cost_expert_down_ns(const cost_model *c, moesim_precision p, uint32_t tokens);
uint64_t cost_shared_ns(const cost_model *c, uint32_t tokens);
uint64_t cost_combine_ns(const cost_model *c, uint32_t tokens);
uint64_t cost_dense_ffn_ns(const cost_model *c, uint32_t tokens);
uint64_t cost_lm_head_ns(const cost_model *c, uint32_t tokens);

/* Bytes moved in `t_ns` nanoseconds... and the reverse: the time to move `bytes` at
 * `bytes_per_s`, rounded up to whole ns (copy engines use it on cumulative byte counts, so a
 * transfer's chunks add up to exactly ceil(bytes * 1e9 / bandwidth)). */
uint64_t cost_transfer_ns(uint64_t bytes, double bytes_per_s);

#endif
