/* Replay: the same policy objects as the simulator (policies/policy.h, looked up with
 * policy_lookup) driving real hardware. One executor in plain C (replay/exec.h, replay_exec_run)
 * runs the simulator's schedule, routes and sub-routes, policy calls (core/route.h), memory system
 * (core/memsys.h: residency, pools, copy classes, promotion, cancellation, host placement), expert
 * pools of fixed-size blocks per precision carved from one arena made before the clock starts
 * (core/block_pool.h), the checks (no expert op before its copy landed, the budget never exceeded)
 * and the result (core/result.h, same JSON and timeline schema as sim_run). A small table of
 * function pointers, the backend, supplies what differs between machines: its host store and
 * arena, the copy engine that serves memsys's queues chunk by chunk, the ops and their clocks.
 *
 * - `cuda` (replay_run, replay/run.cu; its store replay/store.cu): expert weights in pinned
 *   host memory and an SSD-backed file read with O_DIRECT into pinned bounce slots, a demand
 *   and a background copy stream, CUDA kernels and cuBLAS on a compute stream, CUDA events
 *   around every copy and op; weights synthetic (seeded random bytes of the model's shapes) or
 *   a checkpoint's (replay/weights.h: `moesim replay --model DIR`).
 * - `cpu` (replay_run_cpu, replay/exec_cpu.c): a DRAM arena as the "device", an O_DIRECT file of
 *   every expert read by a copy thread, the engine's CPU kernels; synthetic weights.
 *
 * Routing comes from the trace, so a run is step for step comparable with sim_run on the same
 * trace, settings and profile.
 *
 * Pure-C parts (always built, tested on the CPU): the executor and the cpu backend, the schedule
 * (replay/schedule.c), the memory budget and its emulation of a smaller card (replay/budget.c),
 * the checkpoint weights in the kernels' formats (replay/weights.c), the calibration writers
 * (replay/calib_write.c) and the validation arithmetic (replay/report.c). The GPU parts are
 * compiled only with MOESIM_CUDA; without it replay_run and calib_run fail with "built without
 * CUDA".
 *
 * Units: ns for times (ms in reports), bytes; GiB = 2^30 bytes as in sim/README.md. */
#ifndef MOESIM_REPLAY_REPLAY_H
#define MOESIM_REPLAY_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/hw.h"
#include "common/model.h"
#include "common/precision.h"
#include "common/progress.h"
#include "common/status.h"
#include "core/budget.h"
#include "core/schedule.h"
#include "replay/weights.h"
#include "sim/cost.h"
#include "sim/sim.h"
#include "traces/trace.h"

/* ---- availability ---- */

/* True when this binary holds the CUDA replay (MOESIM_CUDA was on). */
bool replay_built_with_cuda(void);
/* MOESIM_OK when a CUDA device can be used; else one line: "built without CUDA (...)" or
 * "no CUDA GPU or driver on this machine (...)". Every GPU command checks this before touching
 * its inputs' outputs. */
moesim_status replay_device_check(moesim_error *err);

/* ---- schedule (time-independent, identical to the simulator's: sim/README.md "Steps") ---- */

/* The replay runs the simulator's schedule (core/schedule.h); these names are its own. */
typedef sim_schedule_step replay_step;
typedef sim_schedule replay_schedule;

/* Builds the schedule of `t` at batch size `batch` with `m`'s KV and recurrent-state bytes
 * (sim_schedule_build): requests enter in id order as slots free; a step is all pending prompt
 * tokens of the admitted requests, else one decode token each. Caller frees with
 * replay_schedule_free. */
void replay_schedule_build(replay_schedule *s, const trace *t, const model_geometry *m,
                           uint32_t batch);
void replay_schedule_free(replay_schedule *s);

/* ---- memory budget (the simulator's arithmetic, sim/README.md "HBM accounting") ---- */

typedef sim_budget replay_budget; /* core/budget.h */

/* Splits the card's memory as sim_run does: sim_budget_plan (same figures, same error messages
 * naming the setting's origin `budget_where` / `cache_where`). */
moesim_status replay_budget_plan(const model_geometry *m, const quant_table *q,
                                 const hw_profile *hw, const sim_settings *set,
                                 uint32_t max_step_tokens, uint64_t kv_peak_bytes,
                                 const char *budget_where, const char *cache_where,
                                 replay_budget *out, moesim_error *err);

/* Emulating a smaller card on a larger GPU: the run's device allocations (`device_bytes`: what
 * replay allocates, pools + weights + workspace) must fit both the card budget and what the
 * device has free less a reserve for the CUDA context and cuBLAS workspace. */
moesim_status replay_budget_fit_device(const replay_budget *b, uint64_t device_bytes,
                                       uint64_t device_free_bytes, uint64_t reserve_bytes,
                                       moesim_error *err);

/* Blocks of a fixed-size pool at one precision: how many blocks of `block_bytes` a pool of
 * `pool_bytes` accounted at `part_bytes` per part can hand out (the byte accounting of the
 * policy API admits floor(pool / part) parts; each needs one block). */
uint64_t replay_pool_blocks(uint64_t pool_bytes, uint64_t part_bytes, uint64_t n_parts_max);

/* ---- the run ---- */

/* The host store: every expert of the model at the formats host placement orders, random bytes
 * from `seed`, one blob [gate | up | down] per (layer, expert), placed by the simulator's rule
 * (memsys_place_order and memsys_place, core/memsys.h) for a policy that loads `primary`
 * (expert.precision) alone: with `host_precisions` "policy", `primary` only; with "all" (the
 * kernels' bf16, int8, int4, int2) or a comma list, `primary` first, then the other stored
 * formats, smaller first; layer by layer, expert by expert, in pinned DRAM while `dram_bytes`
 * lasts (a run places in the profile's dram_gib less sim.bounce_mib); the rest in a file under
 * `ssd_dir` (NULL: /var/tmp) read with O_DIRECT into pinned bounce slots. A validation creates
 * one and lends it to its runs; a run uses it only when its own placement is the same. Caller
 * owns; replay_store_destroy (accepts NULL; removes the SSD file). */
typedef struct replay_store replay_store;
moesim_status replay_store_create(const model_geometry *m, const quant_table *q,
                                  const char *host_precisions, moesim_precision primary,
                                  uint64_t dram_bytes, const char *ssd_dir, uint64_t seed,
                                  replay_store **out, moesim_error *err);
/* The same store holding a checkpoint's experts (replay_weights_experts: the kernels' formats,
 * the engine's quantization) instead of random bytes; `m` must be the checkpoint's geometry
 * (replay_weights_geometry). `w` is borrowed for the store's lifetime. */
moesim_status replay_store_create_checkpoint(const model_geometry *m, const quant_table *q,
                                             const char *host_precisions, moesim_precision primary,
                                             uint64_t dram_bytes, const char *ssd_dir,
                                             const replay_weights *w, replay_store **out,
                                             moesim_error *err);
void replay_store_destroy(replay_store *s);
/* Copies expert `expert` of MoE layer `moe_layer` at precision p, as the store holds it (from
 * pinned DRAM, or read back from the SSD file), into blob [blob bytes of p]: for tests that the
 * store holds what it was filled with. Fails (MOESIM_EINPUT) when p is not held, MOESIM_EIO
 * when the SSD file cannot be read. */
moesim_status replay_store_expert(const replay_store *s, uint32_t moe_layer, uint32_t expert,
                                  moesim_precision p, uint8_t *blob, moesim_error *err);

typedef struct replay_inputs {
    const trace *trace;
    trace_stream *stream; /* optional, replay_run_cpu only: the rows are read from here block by
                             block (memory does not grow with the trace) and `trace` is
                             trace_stream_tokens(stream), opened reading every row; NULL:
                             `trace` holds them */
    const model_geometry *model; /* must match the trace's geometry */
    const hw_profile *hw;        /* the calibrated profile: DRAM size, default budget */
    const quant_table *quant;
    const char *timeline_path;           /* a timeline (core/timeline.h: schema, formats) or NULL */
    sim_timeline_window timeline_window; /* the part of the run it keeps; zeroed: all */
    const sim_hooks *hooks;            /* on_expert_start when an expert's kernel is enqueued (after
                                          its copies' events), on_request_done, on_layer_done */
    const replay_weights *weights;     /* a checkpoint's weights (`model` must be its geometry,
                                          replay_weights_geometry), or NULL: synthetic weights */
    uint64_t weight_seed;              /* synthetic weights: same seed, same bytes */
    const replay_store *store;         /* borrowed host store, or NULL: the run makes its own from
                                          its placement (also when the store's placement: formats,
                                          experts in DRAM, or weights differ from the run's) */
    const char *ssd_dir;               /* the run's own SSD store (NULL: /var/tmp) */
    const struct cpu_store *cpu_store; /* replay_run_cpu: a borrowed expert file, or NULL: the
                                          run writes its own under ssd_dir */
    const policy_methods *policy;      /* optional: run this table (a plug-in) instead of looking
                                          the name up; NULL: the registry */
} replay_inputs;

/* What a replay measured beyond sim_result (checks of the GPU tests). */
typedef struct replay_checks {
    uint64_t device_used_before, device_used_peak; /* cudaMemGetInfo: total - free */
    uint64_t device_alloc_bytes;                   /* replay's own allocations */
    uint64_t order_checked, order_violations;      /* expert starts checked against copy ends */
    double h2d_gb_per_s; /* bytes copied (kernel formats) / busy time of the copy
                            streams */
} replay_checks;

/* Replays the trace under `policy_name` with `settings` (the same keys as sim_run: the
 * settings of sim/sim.h and the policy's knobs; every key checked). The checkpoint's weights
 * when `in->weights` is set, else synthetic weights of the model's geometry (timing depends on
 * shapes and bytes only, so a checkpoint is not needed to measure). Activations, the KV buffer
 * and the experts' outputs the combine reads stay synthetic: routing comes from the trace.
 * Fills `out` in the simulator's schema and, when `checks` is not NULL, the GPU checks. */
moesim_status replay_run(const replay_inputs *in, const char *policy_name, config *settings,
                         sim_result *out, replay_checks *checks, moesim_error *err);

/* The same replay on the CPU (the executor's cpu backend, replay/exec_cpu.c), on any machine: the
 * "device" is a DRAM arena of the expert budget in fixed blocks, the tier experts load from is a
 * file on local disk read with O_DIRECT by a copy thread in the memory system's class order,
 * compute is the engine's CPU kernels at the planned precision. Synthetic weights only (in->weights
 * must be NULL). Compare with sim_run under a CPU profile (configs/hw/README.md, "CPU kind"). */
moesim_status replay_run_cpu(const replay_inputs *in, const char *policy_name, config *settings,
                             sim_result *out, replay_checks *checks, moesim_error *err);

/* ---- calibration (replay/calibrate.cu measures, replay/calib_write.c writes) ---- */

#define CALIB_MAX_SIZES 24

typedef struct calib_results {
    char gpu[64];
    char backend[8]; /* "cuda" or "cpu": what the profile's link and compute figures mean */
    uint64_t hbm_bytes;
    uint32_t n_sizes;
    double size_bytes[CALIB_MAX_SIZES]; /* [n_sizes] pinned transfer sizes, increasing */
    double h2d_gb_per_s[CALIB_MAX_SIZES], d2h_gb_per_s[CALIB_MAX_SIZES]; /* [n_sizes] */
    double h2d_latency_us, d2h_latency_us; /* intercept of time vs size (smallest transfers) */
    double h2d_peak_gb_per_s, d2h_peak_gb_per_s; /* at the largest size */
    /* cuda: CALIB_CHUNKS copies of CALIB_CHUNK_BYTES back to back on one stream, an event before
     * and after each (as the replay's copy engine records its chunks): time per chunk, and
     * whether each paid the transfer latency again (the profile's latency_per_chunk) */
    double h2d_chunk_us;
    bool h2d_chunk_measured, h2d_latency_per_chunk;
    double hbm_gb_per_s;     /* device-to-device copy: read + write bytes / time */
    double bf16_tflops;      /* best cuBLAS bf16 GEMM measured */
    double kernel_launch_us; /* empty-kernel launch, back to back */
    /* cuda: what two timing events around each launch add per launch (the replay brackets every
     * op so; the cost table's ops are timed without): the profile's op_issue_us */
    double op_events_us;
    /* cpu: what the link and the compute cost each other on this machine (the profile's
     * slowdown_beside_compute and slowdown_beside_copy): the copy thread's 1 MiB reads beside the
     * compute thread's ops against alone, and those ops beside the reads against alone */
    bool contention_measured;
    double link_slowdown_beside_compute, op_slowdown_beside_copy;
    cost_curve curve[COST_OP_COUNT][PREC_COUNT]; /* measured op times (t_ns), x per sim/COST.md */
    uint32_t repeats;
    double stall_overhead; /* cpu: all calls' time over their medians' (>= 1), in every t_ns */
} calib_results;

/* What repeated CPU calibrations of one model (a validation's, between rounds) keep between
 * them: the expert file whose reads are timed (lent: the validation's own) and the copies of one
 * expert per precision the ops are timed on, made once (a 352 MB expert takes seconds to draw and
 * quantize). Zero-initialized; calib_cpu_cache_free frees the copies. */
typedef struct calib_cpu_cache {
    const struct cpu_store *store;
    uint8_t *copies[PREC_COUNT];
} calib_cpu_cache;

void calib_cpu_cache_free(calib_cpu_cache *c);

/* Options of a calibration run. */
typedef struct calib_options {
    const model_geometry *model; /* expert and attention shapes to time */
    uint32_t repeats;            /* timed repetitions per point (median kept) */
    bool quick;                  /* fewer points (a smoke run) */
    progress *bar;               /* advanced once per phase (CALIB_CPU_PHASES); NULL: none */
    /* CPU: only what a given run needs (a validation's calibrations between rounds): token
     * counts up to the first point at or above max_tokens, attended positions likewise up to
     * max_context (0: every point), expert ops at the precisions marked (NULL: all four) */
    uint32_t max_tokens, max_context;
    const bool *precisions; /* [PREC_COUNT] */
    calib_cpu_cache *cache; /* CPU: NULL, or what repeated calibrations keep */
} calib_options;

#define CALIB_CPU_PHASES 7 /* disk, DRAM, the non-expert ops, the experts at 4 precisions */

/* Runs the microbenchmarks on device 0. */
moesim_status calib_run(const calib_options *opt, calib_results *out, moesim_error *err);
/* The same for the CPU replay (replay/calib_cpu.c): the link is O_DIRECT reads of an expert file
 * written under `dir` (NULL: /var/tmp), the device memory is DRAM, the ops are the replay's CPU
 * compute. */
moesim_status calib_run_cpu(const calib_options *opt, const char *dir, calib_results *out,
                            moesim_error *err);

/* Writes a hardware profile (configs/hw/README.md keys): the measured figures, the rest copied
 * from `base` with their source named. Atomic (common/atomic_file.h). */
moesim_status calib_write_profile(const calib_results *c, const hw_profile *base, const char *name,
                                  const char *path, moesim_error *err);
/* Writes the measured cost table (sim/COST.md format). Atomic. */
moesim_status calib_write_table(const calib_results *c, const char *model_name, const char *path,
                                moesim_error *err);

/* ---- validation arithmetic (replay/report.c) ---- */

/* One run's figures as validate compares them. Arrays owned by the record (validate_record_free).
 */
typedef struct validate_record {
    sim_result r;
    uint32_t n_requests;
    double *ttft_ms, *tpot_ms; /* [n_requests]; tpot NAN for single-step requests */
    uint32_t n_layers;
    double *layer_ms; /* [n_layers] summed over steps */
} validate_record;

void validate_record_init(validate_record *v, uint32_t n_requests, uint32_t n_layers);
void validate_record_free(validate_record *v);
/* The sim_hooks that fill a record (ctx = the record) for sim_run and replay_run. */
sim_hooks validate_record_hooks(validate_record *v);

/* validate --repeats at most: the rounds of replays a row keeps */
#define VALIDATE_MAX_ROUNDS 99
/* Fewer rounds cannot order a pair by the sign test at 5 % (5 of 5: p = 0.0625). */
#define VALIDATE_MIN_ROUNDS 6

/* One configuration compared: errors are relative, (sim - real) / real. */
typedef struct validate_row {
    char policy[32];
    char label[96]; /* the configuration beside the policy, e.g. "budget 16 GiB" */
    char group[96]; /* rows of one group are ranked against each other (same label) */
    double sim_tpot_ms, real_tpot_ms, sim_ttft_ms, real_ttft_ms, sim_total_ms, real_total_ms;
    /* the lowest and highest TPOT of the configuration's replays (validate --repeats): the
     * machine's run-to-run spread; both real_tpot_ms for one replay, NAN when not known */
    double real_tpot_lo_ms, real_tpot_hi_ms;
    /* the TPOT of each round of replays (validate --repeats runs every configuration once a
     * round, so round k of two rows ran minutes apart and pairs are compared round by round);
     * 0 rounds: not known */
    uint32_t n_rounds;
    double real_tpot_round_ms[VALIDATE_MAX_ROUNDS];
    double tpot_err, ttft_err, total_err;            /* of the means / the makespan */
    double req_tpot_err_median, req_ttft_err_median; /* median over requests of |error| */
    double layer_err_median, layer_err_max;          /* over MoE layers of |error| of layer time */
    int32_t layer_worst;                             /* the layer of layer_err_max, or -1 */
    uint32_t n_layers;
    float sim_layer_ms[MODEL_MAX_LAYERS], real_layer_ms[MODEL_MAX_LAYERS]; /* [n_layers] summed
                                                                              over steps */
    /* the makespan less the MoE layers' times (each from its router to its last expert):
     * attention, shared and dense FFNs, combine, LM head and the step's own work, over the run;
     * NAN when not known (a JSON written before these figures) */
    double sim_outside_ms, real_outside_ms, outside_err;
    double sim_hit_rate, real_hit_rate;
    /* GB/s of the host->device link while it copied (bytes / busy time; NaN: nothing copied):
     * the profile's figure in the simulator, what the link delivered in the replay */
    double sim_link_gb_per_s, real_link_gb_per_s;
    /* validate --calibrate-rounds, relative to the simulated TPOT compared: how far it moves
     * between the profiles of the compared round's even and odd calibration slices (the same
     * span of time: the slices' own noise), and by how much more it moves between the round's
     * first and second half of slices (0 when not more): what the machine's drift within the
     * round is worth in the result; NAN when not calibrated through the rounds */
    double sim_tpot_slice_noise, sim_tpot_drift;
    /* and the TPOT error had every round been simulated with the first calibration alone (one
     * calibration before the validation): what calibrating between rounds changed; NAN when not
     * calibrated between rounds */
    double tpot_err_first_calib;
    bool refused;   /* the simulator refused the configuration: left out of the summary */
    char note[160]; /* why */
} validate_row;

/* Compares one configuration's simulated and measured records (same trace: same requests and
 * layers, checked). */
moesim_status validate_compare(const validate_record *sim, const validate_record *real,
                               const char *label, validate_row *out, moesim_error *err);

typedef struct validate_summary {
    size_t n_rows; /* rows compared (refused ones are left out) */
    double tpot_abs_err_median, ttft_abs_err_median, total_abs_err_median;
    /* median over rows of |outside_err| and of layer_err_median: where the time the simulator
     * misses is, outside the MoE layers or in them (NAN: not known) */
    double outside_abs_err_median, layer_abs_err_median;
    /* policy order by TPOT, per group: of the pairs the simulator orders (`pairs`), those the
     * replay ranks the same way; pairs the simulator ties are counted apart and not ranked */
    uint64_t pairs, concordant, sim_ties;
    bool same_order; /* every pair the simulator orders is ordered alike */
    /* of `pairs`, those the replay orders (validate_replay_order) and, of those, the ones the
     * simulator orders alike: the order the targets judge (a pair the replay's own rounds split
     * has no measured order to agree with) */
    uint64_t replay_ordered, replay_ordered_concordant;
    double discordant_gap_max; /* the largest relative gap of simulated TPOTs among the pairs
                                  ordered differently (0: none), as validate_sim_gap */
    /* median over rows of sim_tpot_drift, of sim_tpot_slice_noise and of |tpot_err_first_calib|
     * (NAN: not calibrated through the rounds) */
    double drift_tpot_median, slice_noise_tpot_median, tpot_abs_err_median_first_calib;
    /* the machine drifted more than the error reported (drift_tpot_median > tpot_abs_err_median):
     * the validation cannot tell the simulator's error from the machine's drift, and calls no
     * result */
    bool drift_exceeds_error;
    /* TPOT <= 5 %, TTFT <= 10 %, every pair the replay orders ordered alike, drift below the
     * error */
    bool meets_targets;
} validate_summary;

void validate_summarize(const validate_row *rows, size_t n, validate_summary *out);

/* The replay's order of a pair: -1 when a runs faster than b, +1 slower, 0 when the replay does
 * not order them. With at least VALIDATE_MIN_ROUNDS rounds each, the rounds paired by index
 * decide: a sign test, two-sided p < 0.05 (8 of 9 rounds alike, 9 of 10), rounds with equal or
 * unknown TPOTs left out. Otherwise the compared replays' TPOTs (real_tpot_ms) decide, 0 only for
 * equal ones. */
int validate_replay_order(const validate_row *a, const validate_row *b);
/* How many paired rounds a runs faster than b, and the rounds compared (0: no rounds). */
uint32_t validate_rounds_faster(const validate_row *a, const validate_row *b, uint32_t *rounds);

/* The relative gap of two simulated TPOTs: larger / smaller - 1 (0 for a tie). */
double validate_sim_gap(const validate_row *a, const validate_row *b);

/* The pairs of rows (indexes into rows, i < j) that one group ranks differently in the simulator
 * and the replay (pairs the simulator ties excluded), in row order; writes at most `cap` and
 * returns how many there are. */
size_t validate_discordant_pairs(const validate_row *rows, size_t n, size_t (*out)[2], size_t cap);
/* The pairs of one group the simulator ties (equal TPOT), as validate_discordant_pairs. */
size_t validate_sim_tied_pairs(const validate_row *rows, size_t n, size_t (*out)[2], size_t cap);

/* The order test a noisy machine cannot break by chance: every pair of rows in one group whose
 * simulated TPOTs differ by more than `margin` (relative, e.g. 0.3) and that the replay orders
 * (validate_replay_order: with VALIDATE_MIN_ROUNDS rounds or more, only where its rounds agree
 * by the sign test, as the targets judge; with fewer, every pair) is ordered alike. Counts the
 * pairs tested and those ordered alike; true when all are. */
bool validate_order_beyond(const validate_row *rows, size_t n, double margin, uint64_t *pairs,
                           uint64_t *concordant);

/* The median of v[0..n) (NAN for n == 0); v is reordered. */
double validate_median(double *v, size_t n);
/* (sim - real) / real; NAN when real is 0 or either is NAN. */
double validate_rel_err(double sim, double real);

#endif
