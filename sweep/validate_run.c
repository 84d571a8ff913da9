/* Running a validation (sweep/validate.h): every configuration through the simulator, then
 * rounds of replays, each configuration once per round, and the row of each from its replay of
 * median makespan. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/model.h"
#include "core/memsys.h"
#include "core/settings.h"
#include "replay/cpu_store.h"
#include "replay/replay.h"
#include "sim/sim.h"
#include "sweep/validate.h"
#include "traces/trace.h"

typedef struct vctx {
    const char *const *files;
    size_t n_files;
    const char *const *sets;
    size_t n_sets;
    trace *t;           /* the trace in memory (GPU replays), or NULL */
    trace_stream *ts;   /* --backend cpu: the trace as a stream (memory flat in its length) */
    const trace *tokens; /* t, or the stream's meta and counts */
    hw_profile hw;
    model_geometry model;
    quant_table quant;
    uint64_t seed;
    replay_store *store; /* lent to every run (a run whose formats differ makes its own) */
    char store_formats[128];
    bool cpu;             /* --backend cpu: replay_run_cpu */
    cpu_store *cpu_store; /* its expert file, lent to every run */
    uint32_t repeats;     /* replays per configuration (--repeats): the median one is compared */
    bool quiet;
} vctx;

/* A fresh config: files, common sets, the run's own sets, and host precisions the GPU kernels
 * have (bf16, int8, int4, int2) unless given, so sim and replay store the same formats. */
static moesim_status make_config(const vctx *v, const validate_spec *r, config **out,
                                 moesim_error *err) {
    config *c = config_create();
    moesim_status st = MOESIM_OK;
    for (size_t i = 0; i < v->n_files && !st; i++) st = config_load_file(c, v->files[i], err);
    for (size_t i = 0; i < v->n_sets && !st; i++) st = config_set(c, v->sets[i], err);
    for (size_t i = 0; i < r->n_sets && !st; i++) st = config_set(c, r->sets[i], err);
    bool has = false; /* config_get would mark the entry used: look without it */
    for (size_t i = 0; i < config_size(c) && !st; i++) {
        const char *sec, *key, *val;
        config_entry_at(c, i, &sec, &key, &val);
        has |= !strcmp(sec, "sim") && !strcmp(key, "host_precisions");
    }
    if (!st && !has)
        config_put(c, "sim", "host_precisions", "bf16,int8,int4,int2", "moesim validate");
    if (st) {
        config_destroy(c);
        return st;
    }
    *out = c;
    return MOESIM_OK;
}

/* sim.host_precisions of a run as its settings resolve it. */
static moesim_status run_formats(const vctx *v, const validate_spec *r, char *out, size_t len,
                                 moesim_precision *primary, moesim_error *err) {
    config *c = NULL;
    moesim_status st = make_config(v, r, &c, err);
    sim_settings set;
    if (!st) st = sim_settings_read(c, &set, err);
    if (!st) snprintf(out, len, "%s", set.host_precisions);
    if (!st) *primary = (moesim_precision)set.precision;
    config_destroy(c);
    return st;
}

static moesim_status replay_once(const vctx *v, const char *policy_name, config *c,
                                 validate_record *rec, moesim_error *err) {
    sim_hooks h = validate_record_hooks(rec);
    replay_inputs in = {.trace = v->tokens,
                        .stream = v->ts,
                        .model = &v->model,
                        .hw = &v->hw,
                        .quant = &v->quant,
                        .hooks = &h,
                        .weight_seed = v->seed,
                        .store = v->store};
    in.cpu_store = v->cpu_store;
    return v->cpu ? replay_run_cpu(&in, policy_name, c, &rec->r, NULL, err)
                  : replay_run(&in, policy_name, c, &rec->r, NULL, err);
}

/* One configuration in flight: the simulator's run and the replays made so far. */
typedef struct config_runs {
    validate_record sim;
    validate_record *real; /* [repeats] */
    uint32_t n_real;
    bool refused; /* the simulator refused the configuration */
    char note[160];
} config_runs;

/* The simulator's run of a configuration. One it refuses (a policy that cannot work in the
 * budget, e.g. `static` when the experts do not fit) is marked refused, not an error: the
 * validation set crosses every policy with every budget. */
static moesim_status simulate(const vctx *v, const validate_spec *r, config_runs *cr,
                              moesim_error *err) {
    validate_record_init(&cr->sim, v->tokens->n_requests, v->tokens->meta.n_layers);
    cr->real = moesim_xcalloc(v->repeats, sizeof *cr->real);
    config *c = NULL;
    moesim_status st = make_config(v, r, &c, err);
    if (!st) {
        sim_hooks h = validate_record_hooks(&cr->sim);
        sim_inputs in = {.trace = v->tokens,
                         .stream = v->ts,
                         .model = &v->model,
                         .hw = &v->hw,
                         .quant = &v->quant,
                         .hooks = &h};
        st = sim_run(&in, r->policy, c, &cr->sim.r, err);
        if (st == MOESIM_EINPUT) {
            cr->refused = true;
            snprintf(cr->note, sizeof cr->note, "%s", err->msg);
            st = MOESIM_OK;
        }
    }
    config_destroy(c);
    return st;
}

/* One more replay of a configuration. */
static moesim_status replay_again(const vctx *v, const validate_spec *r, config_runs *cr,
                                  moesim_error *err) {
    validate_record *rec = &cr->real[cr->n_real++];
    validate_record_init(rec, v->tokens->n_requests, v->tokens->meta.n_layers);
    config *c = NULL;
    moesim_status st = make_config(v, r, &c, err);
    if (!st) st = replay_once(v, r->policy, c, rec, err);
    config_destroy(c);
    return st;
}

/* The row of a configuration: the replay of median makespan (the lower one of an even count;
 * it keeps the per-request and per-layer figures of one real execution) against the simulator,
 * with the TPOT range of all its replays. */
static moesim_status compare_runs(const config_runs *cr, const validate_spec *r, validate_row *row,
                                  moesim_error *err) {
    if (cr->refused) {
        memset(row, 0, sizeof *row);
        snprintf(row->policy, sizeof row->policy, "%s", r->policy);
        snprintf(row->label, sizeof row->label, "%s", r->label);
        snprintf(row->group, sizeof row->group, "%s", r->label);
        row->refused = true;
        snprintf(row->note, sizeof row->note, "%s", cr->note);
        return MOESIM_OK;
    }
    uint32_t n = cr->n_real, median = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t below = 0; /* runs faster than run i (ties by order) */
        for (uint32_t j = 0; j < n; j++) {
            double a = cr->real[j].r.makespan_ms, b = cr->real[i].r.makespan_ms;
            below += a < b || (a == b && j < i);
        }
        if (below == (n - 1) / 2) median = i;
    }
    moesim_status st = validate_compare(&cr->sim, &cr->real[median], r->label, row, err);
    MOESIM_ASSERT(n <= VALIDATE_MAX_ROUNDS); /* --repeats is checked against it */
    for (uint32_t i = 0; i < n && !st; i++) {
        row->real_tpot_lo_ms = fmin(row->real_tpot_lo_ms, cr->real[i].r.tpot.mean_ms);
        row->real_tpot_hi_ms = fmax(row->real_tpot_hi_ms, cr->real[i].r.tpot.mean_ms);
        row->real_tpot_round_ms[row->n_rounds++] = cr->real[i].r.tpot.mean_ms; /* round i */
    }
    if (st) moesim_error_prefix(err, "%s (%s)", r->policy, r->label);
    return st;
}

static void config_runs_free(config_runs *cr) {
    validate_record_free(&cr->sim);
    for (uint32_t i = 0; i < cr->n_real; i++) validate_record_free(&cr->real[i]);
    free(cr->real);
}

/* Every configuration through the simulator, then `v->repeats` rounds of replays, each
 * configuration once per round: a slow drift of a shared machine's disk or memory bandwidth
 * falls on every configuration alike instead of on those measured while it lasted. */
static moesim_status run_all(const vctx *v, const validate_spec *specs, size_t n,
                             validate_row *rows, moesim_error *err) {
    config_runs *runs = moesim_xcalloc(n ? n : 1, sizeof *runs);
    moesim_status st = MOESIM_OK;
    size_t simulated = 0;
    for (; simulated < n && !st; simulated++) {
        st = simulate(v, &specs[simulated], &runs[simulated], err);
        if (st)
            moesim_error_prefix(err, "%s (%s)", specs[simulated].policy, specs[simulated].label);
    }
    for (uint32_t round = 0; round < v->repeats && !st; round++)
        for (size_t i = 0; i < n && !st; i++) {
            if (runs[i].refused) continue;
            st = replay_again(v, &specs[i], &runs[i], err);
            if (st)
                moesim_error_prefix(err, "%s (%s)", specs[i].policy, specs[i].label);
            else if (!v->quiet)
                fprintf(stderr,
                        "validate: %s (%s), replay %u of %u: TPOT sim %.4f ms, real %.4f ms\n",
                        specs[i].policy, specs[i].label, round + 1, v->repeats,
                        runs[i].sim.r.tpot.mean_ms, runs[i].real[round].r.tpot.mean_ms);
        }
    for (size_t i = 0; i < n && !st; i++) st = compare_runs(&runs[i], &specs[i], &rows[i], err);
    for (size_t i = 0; i < simulated; i++) config_runs_free(&runs[i]);
    free(runs);
    return st;
}

/* One host store for the runs (pinning tens of GB is slow): the formats of the first
 * configuration's settings; on the CPU, its expert file. */
static moesim_status make_store(vctx *v, const validate_spec *first, moesim_error *err) {
    moesim_precision primary = PREC_BF16;
    moesim_status st =
        run_formats(v, first, v->store_formats, sizeof v->store_formats, &primary, err);
    if (st) return st;
    if (!v->cpu)
        return replay_store_create(&v->model, &v->quant, v->store_formats, primary,
                                   v->hw.dram_bytes, NULL, v->seed, &v->store, err);
    bool stored[PREC_COUNT], policy_only;
    st = memsys_parse_host_precisions(v->store_formats, stored, &policy_only, err);
    if (!st && policy_only)
        st = moesim_fail(err, MOESIM_EINPUT,
                         "validate --backend cpu: [sim] host_precisions must list the formats "
                         "of the shared expert file (e.g. int8,int4,int2), not 'policy'");
    if (!st) st = cpu_store_create(&v->model, stored, NULL, v->seed, NULL, &v->cpu_store, err);
    return st;
}

moesim_status sweep_validate_run(const validate_setup *s, const validate_plan *p,
                                 validate_row *rows, validate_meta *meta, moesim_error *err) {
    vctx v = {.files = s->files,
              .n_files = s->n_files,
              .sets = s->sets,
              .n_sets = s->n_sets,
              .seed = s->seed,
              .cpu = s->cpu,
              .repeats = s->repeats,
              .quiet = s->quiet};
    /* the CPU replay and the simulator read the trace as a stream; the GPU replay holds it */
    moesim_status st = v.cpu ? trace_stream_open(s->trace_path, &v.ts, err)
                             : trace_read(s->trace_path, &v.t, err);
    if (!st) v.tokens = v.ts ? trace_stream_tokens(v.ts) : v.t;
    if (!st) st = hw_load_by_name(s->hw_name, &v.hw, err);
    if (!st)
        st = model_load_by_name(s->model_name ? s->model_name : v.tokens->meta.model, &v.model,
                                err);
    if (!st) st = quant_table_load_default(&v.quant, err);
    if (!st && !v.cpu) st = replay_device_check(err); /* after the inputs: theirs come first */
    if (!st && p->n) st = make_store(&v, &p->specs[0], err);
    if (!st) st = run_all(&v, p->specs, p->n, rows, err);
    if (!st) {
        memset(meta, 0, sizeof *meta);
        snprintf(meta->device, sizeof meta->device, "%s", v.hw.gpu);
        snprintf(meta->profile, sizeof meta->profile, "%s", v.hw.name);
        snprintf(meta->trace, sizeof meta->trace, "%s", s->trace_path);
        snprintf(meta->model, sizeof meta->model, "%s", v.model.name);
    }
    replay_store_destroy(v.store);
    cpu_store_destroy(v.cpu_store);
    trace_destroy(v.t);
    trace_stream_close(v.ts);
    return st;
}
