/* What a run reports (the JSON of `moesim sim --json` and of the replay is a sim_result), the
 * observation points a host calls while it runs (sim_hooks), and the latency and output helpers
 * every host shares. Units: ms in the result's fields (as the JSON), ns in the hooks. */
#ifndef MOESIM_CORE_RESULT_H
#define MOESIM_CORE_RESULT_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "policies/policy.h"

/* Optional observation points for tests and tools (NULL members are not called). */
typedef struct sim_hooks {
    void *ctx;
    /* An expert op (gate/up, down, or the whole expert) is about to start at t_ns: every part in
     * parts_mask of (layer, expert, prec) must be resident; `mem` answers state queries. */
    void (*on_expert_start)(void *ctx, policy_mem_view mem, uint32_t layer, uint32_t expert,
                            moesim_precision prec, uint32_t parts_mask, uint64_t t_ns);
    /* A request's TTFT and TPOT in ms, once per request when the run ends (tpot_ms is NAN for a
     * request with one step); `moesim validate` compares them request by request. */
    void (*on_request_done)(void *ctx, uint32_t request, double ttft_ms, double tpot_ms);
    /* MoE layer `layer` of step `step` ran on the compute stream from t0_ns to t1_ns (router
     * to the end of its experts): the per-layer comparison of `moesim validate`. */
    void (*on_layer_done)(void *ctx, uint64_t step, uint32_t layer, uint64_t t0_ns, uint64_t t1_ns);
} sim_hooks;

typedef struct sim_latency {
    double mean_ms, p50_ms, p99_ms;
} sim_latency;

/* Every figure a run reports (the JSON of `moesim sim --json` is this struct). */
/* The most name/value pairs a policy's report (policy_methods.report) may give. */
#define SIM_POLICY_REPORT_MAX 32

typedef struct sim_result {
    char policy[POLICY_NAME_MAX];
    uint64_t tokens; /* tokens of the trace that ran (prefill + decode) */
    uint64_t requests;
    sim_latency ttft;    /* time to first token per request */
    sim_latency tpot;    /* time per output token (decode steps) per request */
    double tokens_per_s; /* all tokens / makespan */
    double makespan_ms;
    double hit_rate; /* (token, slot) accesses that found the expert resident */
    uint64_t h2d_bytes, d2h_bytes, ssd_bytes;
    double stall_ms;         /* compute stream idle waiting for expert weights */
    uint64_t peak_hbm_bytes; /* all of it: non-expert, KV, activations, experts */
    uint64_t budget_bytes;
    double precision_mix_hi, precision_mix_lo, precision_mix_skip; /* shares of gate mass */
    double bits_per_weight;      /* gate-mass-weighted effective bits per weight run (skips: 0) */
    double prefetch_accuracy;    /* FIRM-MoE Eq. 7: |S ∩ A| / |A| */
    double prefetch_utilization; /* FIRM-MoE Eq. 8: |S ∩ A| / |S| */
    uint64_t prefetches;         /* prefetch-class loads issued */
    uint64_t prefetch_late;      /* routes that ran a prefetched expert still loading */
    uint64_t prefetch_promoted;  /* loads that moved a lower-class copy up (core/memsys.h) */
    uint64_t prefetch_cancelled; /* prefetches dropped before their copy started */
    uint64_t prefetch_wasted_bytes; /* prefetched bytes moved and never run */
    /* h2d_bytes by copy class: demand loads, prefetches, background (DynaExq's migrations):
     * what shares the link with the demand loads */
    uint64_t h2d_demand_bytes, h2d_prefetch_bytes, h2d_background_bytes;
    bool predictor_emulated;   /* look-ahead predictions emulated (trace had none) */
    double predictor_accuracy; /* the emulated top-1 accuracy, or the trace's measured one */
    size_t n_policy_report;
    char policy_report_names[SIM_POLICY_REPORT_MAX][48];
    double policy_report_values[SIM_POLICY_REPORT_MAX];
    /* counts behind the figures above (sim/README.md defines each) */
    uint64_t accesses;               /* (token, slot) accesses that ran (not skipped) */
    uint64_t hits;                   /* of those, hits */
    uint64_t skipped_accesses;       /* planned POLICY_RUN_SKIP */
    uint64_t expert_ops;             /* expert invocations on the compute stream */
    uint64_t steps, sub_routes;      /* batch steps; on_route calls */
    uint64_t warmup_h2d_bytes;       /* initial placement by the policy's warmup (before t = 0) */
    uint64_t expert_budget_bytes;    /* what the expert pools got */
    uint64_t kv_peak_bytes;          /* KV cache reserved (its peak over the run) */
    uint64_t placement_refusals;     /* loads the byte budget admitted but no free block of their
                                        precision could hold (the replay; sim.block_pools) */
    double h2d_busy_ms, ssd_busy_ms; /* copy engine busy time */
    uint32_t cost_extrapolated; /* (op, precision) curves of the measured cost table used outside
                                   their measured range (sim/COST.md) */
} sim_result;

/* TTFT and TPOT of every request from the step clocks of schedule `sch` (sim/README.md:
 * TTFT from the start of the admitting step to the end of the first; TPOT (last end - first end)
 * / (steps - 1)) into r->ttft, r->tpot (mean, p50, p99 over requests), calling
 * hooks->on_request_done per request when set. Steps' times are [sch->n_steps] ns. */
struct sim_schedule;
void sim_result_set_latency(sim_result *r, const struct sim_schedule *sch,
                            const uint64_t *step_start_ns, const uint64_t *step_end_ns,
                            const sim_hooks *hooks);
/* The same from each request's times (ns): admitted (start of its admitting step), first (end of
 * the step of its first token), last (end of its last step), and its step count; [n_requests]. */
void sim_result_set_request_latency(sim_result *r, uint32_t n_requests, const uint64_t *t_admit_ns,
                                    const uint64_t *t_first_ns, const uint64_t *t_last_ns,
                                    const uint32_t *steps, const sim_hooks *hooks);

/* The metrics as flat (name, value) pairs in a fixed order ("ttft_ms.p99", "hit_rate", ...):
 * the columns of a sweep CSV. Returns the count (at most cap). */
size_t sim_result_fields(const sim_result *r, const char **names, double *values, size_t cap);

/* The JSON of `moesim sim --json` (keys nested as sim/README.md lists them). New reference. */
json_t *sim_result_to_json(const sim_result *r);

#endif
