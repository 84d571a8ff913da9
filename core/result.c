/* A run's figures as flat (name, value) columns for sweeps and as the nested JSON of
 * `moesim sim --json`. One table drives both, so they never disagree. Also the request latencies
 * every host (sim and replay) derives from its step clocks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>

#include "common/alloc.h"
#include "common/check.h"
#include "core/result_fill.h"
#include "core/schedule.h"
#include "core/result_fill.h"

/* ---- a run's totals (core/result.h) ---- */

void sim_result_fill(sim_result *r, const sim_result_totals *t) {
    const sim_route_tally *ta = t->tally;
    r->tokens = t->tokens;
    r->requests = t->requests;
    r->makespan_ms = (double)t->makespan_ns / 1e6;
    r->tokens_per_s = t->makespan_ns ? (double)t->tokens * 1e9 / (double)t->makespan_ns : 0;
    r->hit_rate = ta->accesses ? (double)ta->hits / (double)ta->accesses : 0;
    r->h2d_bytes = t->moved->h2d_bytes;
    r->ssd_bytes = t->moved->ssd_bytes;
    r->stall_ms = (double)t->stall_ns / 1e6;
    r->budget_bytes = t->budget_bytes;
    double mass = ta->gate_hi + ta->gate_lo + ta->gate_skip;
    r->precision_mix_hi = mass > 0 ? ta->gate_hi / mass : 0;
    r->precision_mix_lo = mass > 0 ? ta->gate_lo / mass : 0;
    r->precision_mix_skip = mass > 0 ? ta->gate_skip / mass : 0;
    r->bits_per_weight = sim_route_tally_bits_per_weight(ta);
    r->prefetch_accuracy = t->pf_active ? (double)t->pf_hit / (double)t->pf_active : 0;
    r->prefetch_utilization = t->pf_issued_sets ? (double)t->pf_hit / (double)t->pf_issued_sets : 0;
    r->prefetches = t->moved->prefetches;
    r->prefetch_late = t->moved->late;
    r->prefetch_promoted = t->moved->promoted;
    r->prefetch_cancelled = t->moved->cancelled;
    r->prefetch_wasted_bytes = t->moved->wasted_bytes;
    r->h2d_demand_bytes = t->moved->h2d_class_bytes[POLICY_DEMAND];
    r->h2d_prefetch_bytes = t->moved->h2d_class_bytes[POLICY_PREFETCH];
    r->h2d_background_bytes = t->moved->h2d_class_bytes[POLICY_BACKGROUND];
    r->predictor_emulated = t->predictor_emulated;
    r->predictor_accuracy = t->predictor_accuracy;
    r->accesses = ta->accesses;
    r->hits = ta->hits;
    r->skipped_accesses = ta->skipped;
    r->expert_ops = t->expert_ops;
    r->warmup_h2d_bytes = t->moved->warmup_bytes;
    r->steps = t->steps;
    r->sub_routes = t->sub_routes;
    r->expert_budget_bytes = t->expert_budget_bytes;
    r->kv_peak_bytes = t->kv_peak_bytes;
    r->placement_refusals = t->placement_refusals;
    r->h2d_busy_ms = (double)t->h2d_busy_ns / 1e6;
    r->ssd_busy_ms = (double)t->ssd_busy_ns / 1e6;
    if (t->pm->report) {
        const char *names[SIM_POLICY_REPORT_MAX];
        double values[SIM_POLICY_REPORT_MAX];
        size_t n = t->pm->report(t->pol, names, values, SIM_POLICY_REPORT_MAX);
        MOESIM_ASSERT(n <= SIM_POLICY_REPORT_MAX);
        r->n_policy_report = n;
        for (size_t i = 0; i < n; i++) {
            snprintf(r->policy_report_names[i], sizeof r->policy_report_names[i], "%s", names[i]);
            r->policy_report_values[i] = values[i];
        }
    }
}

/* ---- the metric table: the sweep CSV's columns and the JSON's keys ---- */

/* Every metric of a run, in output order. A dotted name is a nested JSON object ("ttft_ms.p99" is
 * ttft_ms: {p99}); `integer` ones are counts, written as JSON integers. */
typedef struct sim_metric {
    const char *name;
    double value;
    bool integer;
} sim_metric;

#define SIM_N_METRICS 44

static void sim_result_metrics(const sim_result *r, sim_metric out[SIM_N_METRICS]) {
    const sim_metric m[] = {
        {"tokens", (double)r->tokens, true},
        {"requests", (double)r->requests, true},
        {"ttft_ms.mean", r->ttft.mean_ms, false},
        {"ttft_ms.p50", r->ttft.p50_ms, false},
        {"ttft_ms.p99", r->ttft.p99_ms, false},
        {"tpot_ms.mean", r->tpot.mean_ms, false},
        {"tpot_ms.p50", r->tpot.p50_ms, false},
        {"tpot_ms.p99", r->tpot.p99_ms, false},
        {"tokens_per_s", r->tokens_per_s, false},
        {"makespan_ms", r->makespan_ms, false},
        {"hit_rate", r->hit_rate, false},
        {"accesses", (double)r->accesses, true},
        {"hits", (double)r->hits, true},
        {"h2d_bytes", (double)r->h2d_bytes, true},
        {"d2h_bytes", (double)r->d2h_bytes, true},
        {"h2d_bytes_by_class.demand", (double)r->h2d_demand_bytes, true},
        {"h2d_bytes_by_class.prefetch", (double)r->h2d_prefetch_bytes, true},
        {"h2d_bytes_by_class.background", (double)r->h2d_background_bytes, true},
        {"ssd_bytes", (double)r->ssd_bytes, true},
        {"warmup_h2d_bytes", (double)r->warmup_h2d_bytes, true},
        {"stall_ms", r->stall_ms, false},
        {"h2d_busy_ms", r->h2d_busy_ms, false},
        {"ssd_busy_ms", r->ssd_busy_ms, false},
        {"peak_hbm_bytes", (double)r->peak_hbm_bytes, true},
        {"budget_bytes", (double)r->budget_bytes, true},
        {"expert_budget_bytes", (double)r->expert_budget_bytes, true},
        {"kv_peak_bytes", (double)r->kv_peak_bytes, true},
        {"placement_refusals", (double)r->placement_refusals, true},
        {"precision_mix.hi", r->precision_mix_hi, false},
        {"precision_mix.lo", r->precision_mix_lo, false},
        {"precision_mix.skip", r->precision_mix_skip, false},
        {"bits_per_weight", r->bits_per_weight, false},
        {"prefetch.accuracy", r->prefetch_accuracy, false},
        {"prefetch.utilization", r->prefetch_utilization, false},
        {"prefetch.issued", (double)r->prefetches, true},
        {"prefetch.late", (double)r->prefetch_late, true},
        {"prefetch.promoted", (double)r->prefetch_promoted, true},
        {"prefetch.cancelled", (double)r->prefetch_cancelled, true},
        {"prefetch.wasted_bytes", (double)r->prefetch_wasted_bytes, true},
        {"predictor_emulated", r->predictor_emulated ? 1.0 : 0.0, true},
        {"predictor_accuracy", r->predictor_accuracy, false},
        {"steps", (double)r->steps, true},
        {"expert_ops", (double)r->expert_ops, true},
        {"cost_extrapolated", (double)r->cost_extrapolated, true},
    };
    _Static_assert(MOESIM_ARRAY_LEN(m) == SIM_N_METRICS, "SIM_N_METRICS");
    memcpy(out, m, sizeof m);
}

size_t sim_result_fields(const sim_result *r, const char **names, double *values, size_t cap) {
    sim_metric m[SIM_N_METRICS];
    sim_result_metrics(r, m);
    size_t n = 0;
    for (size_t i = 0; i < SIM_N_METRICS && n < cap; i++, n++) {
        names[n] = m[i].name;
        values[n] = m[i].value;
    }
    for (size_t i = 0; i < r->n_policy_report && n < cap; i++, n++) {
        names[n] = r->policy_report_names[i];
        values[n] = r->policy_report_values[i];
    }
    return n;
}

/* ---- JSON ---- */

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

json_t *sim_result_to_json(const sim_result *r) {
    json_t *j = json_object();
    json_object_set_new(j, "policy", json_string(r->policy));
    sim_metric m[SIM_N_METRICS];
    sim_result_metrics(r, m);
    for (size_t i = 0; i < SIM_N_METRICS; i++) {
        json_t *v = m[i].integer ? json_integer((json_int_t)m[i].value) : num(m[i].value);
        const char *dot = strchr(m[i].name, '.');
        if (!dot) {
            json_object_set_new(j, m[i].name, v);
            continue;
        }
        char group[64];
        snprintf(group, sizeof group, "%.*s", (int)(dot - m[i].name), m[i].name);
        json_t *obj = json_object_get(j, group);
        if (!obj) {
            obj = json_object();
            json_object_set_new(j, group, obj);
        }
        json_object_set_new(obj, dot + 1, v);
    }
    json_object_set_new(j, "predictor",
                        json_string(r->predictor_emulated ? "emulated" : "recorded"));
    json_t *rep = json_object();
    for (size_t i = 0; i < r->n_policy_report; i++)
        json_object_set_new(rep, r->policy_report_names[i], num(r->policy_report_values[i]));
    json_object_set_new(j, "policy_report", rep);
    return j;
}

static sim_latency latency_of(double *v, size_t n) {
    sim_latency l = {NAN, NAN, NAN}; /* no request gave one (no decode: no TPOT), not 0 ms */
    if (!n) return l;
    gsl_sort(v, 1, n);
    l.mean_ms = gsl_stats_mean(v, 1, n);
    l.p50_ms = gsl_stats_quantile_from_sorted_data(v, 1, n, 0.5);
    l.p99_ms = gsl_stats_quantile_from_sorted_data(v, 1, n, 0.99);
    return l;
}

void sim_result_set_request_latency(sim_result *r, uint32_t n_requests, const uint64_t *t_admit_ns,
                                    const uint64_t *t_first_ns, const uint64_t *t_last_ns,
                                    const uint32_t *steps, const sim_hooks *hooks) {
    uint32_t R = n_requests;
    double *ttft = moesim_xmalloc((R ? R : 1) * sizeof *ttft);
    double *tpot = moesim_xmalloc((R ? R : 1) * sizeof *tpot);
    size_t n_ttft = 0, n_tpot = 0;
    for (uint32_t q = 0; q < R; q++) {
        ttft[n_ttft++] = (double)(t_first_ns[q] - t_admit_ns[q]) / 1e6;
        double req_tpot = NAN;
        if (steps[q] > 1) {
            req_tpot = (double)(t_last_ns[q] - t_first_ns[q]) / 1e6 / (double)(steps[q] - 1);
            tpot[n_tpot++] = req_tpot;
        }
        if (hooks && hooks->on_request_done)
            hooks->on_request_done(hooks->ctx, q, ttft[n_ttft - 1], req_tpot);
    }
    r->ttft = latency_of(ttft, n_ttft);
    r->tpot = latency_of(tpot, n_tpot);
    free(ttft);
    free(tpot);
}

void sim_result_set_latency(sim_result *r, const sim_schedule *sch, const uint64_t *step_start_ns,
                            const uint64_t *step_end_ns, const sim_hooks *hooks) {
    uint32_t R = sch->n_requests;
    uint64_t *t = moesim_xmalloc((R ? R : 1) * 3 * sizeof *t);
    for (uint32_t q = 0; q < R; q++) {
        t[q] = step_start_ns[sch->req_admit[q]];
        t[R + q] = step_end_ns[sch->req_first[q]];
        t[2 * R + q] = step_end_ns[sch->req_last[q]];
    }
    sim_result_set_request_latency(r, R, t, t + R, t + 2 * R, sch->req_steps, hooks);
    free(t);
}
