/* Filling a sim_result (core/result.h) from a run's totals: the figures the simulator
 * (sim/sim.c) and the replay executor (replay/exec.c) count the same way, so the two fill them
 * from one place. What differs between hosts (latencies from their clocks, peak memory, the
 * simulator's own cost and memory figures, the replay's checks) each host sets around this call.
 * Units: ns in, ms out (as sim_result's fields), bytes. */
#ifndef MOESIM_CORE_RESULT_FILL_H
#define MOESIM_CORE_RESULT_FILL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/memsys.h"
#include "core/result.h"
#include "core/route.h"
#include "policies/policy.h"

/* A run's totals, borrowed. */
typedef struct sim_result_totals {
    uint64_t tokens, requests, steps;
    uint64_t makespan_ns;                       /* end of the last step */
    const sim_route_tally *tally;               /* accesses, hits, gate mass by precision class */
    const memsys_counts *moved;                 /* bytes moved and prefetch outcomes (memsys.n) */
    uint64_t pf_hit, pf_active, pf_issued_sets; /* FIRM-MoE Eq. 7-8 (sim_route_prefetch_account) */
    uint64_t expert_ops, sub_routes;
    uint64_t stall_ns, h2d_busy_ns, ssd_busy_ns;
    uint64_t budget_bytes, expert_budget_bytes, kv_peak_bytes;
    uint64_t placement_refusals; /* block_pool.refusals: 0 where no block pool placed loads */
    bool predictor_emulated;
    double predictor_accuracy;
    const policy_methods *pm; /* its report (NULL slot: none) */
    const policy *pol;
} sim_result_totals;

/* Sets r's counts, rates, precision mix, prefetch figures, busy times and the policy's report
 * from `t`; leaves every other field as it was. */
void sim_result_fill(sim_result *r, const sim_result_totals *t);

#endif
