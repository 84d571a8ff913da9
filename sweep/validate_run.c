/* Running a validation (sweep/validate.h): every configuration through the simulator, then
 * rounds of replays, each configuration once per round, and the row of each from its replay of
 * median makespan. With calibrations between the rounds (sweep/validate_calib.h) each round is
 * simulated again with the machine as it was around it. */
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
#include "replay/exec.h"
#include "replay/replay.h"
#include "sim/sim.h"
#include "sweep/validate.h"
#include "sweep/validate_calib.h"
#include "traces/trace.h"

typedef struct vctx {
    const char *const *files;
    size_t n_files;
    const char *const *sets;
    size_t n_sets;
    trace *t;            /* the trace in memory (GPU replays), or NULL */
    trace_stream *ts;    /* --backend cpu: the trace as a stream (memory flat in its length) */
    const trace *tokens; /* t, or the stream's meta and counts */
    hw_profile hw;
    model_geometry model;
    quant_table quant;
    uint64_t seed;
    replay_store *store; /* lent to every run (a run whose formats differ makes its own) */
    char store_formats[128];
    bool cpu;             /* --backend cpu: replay_run_cpu */
    cpu_store *cpu_store; /* its expert file, lent to every run */
    const char *ssd_dir;  /* where that file goes (NULL: /var/tmp) */
    uint32_t repeats;     /* replays per configuration (--repeats): the median one is compared */
    bool quiet;
    moesim_precision primary;         /* the first configuration's expert precision */
    uint32_t batch_size;              /* and batch size */
    bool stored[PREC_COUNT];          /* cpu: the formats of the shared expert file */
    const validate_calibrator *calib; /* calibrations between the rounds; NULL: none */
} vctx;

/* A fresh config: files, common sets, the run's own sets, the cost table of a calibration
 * between rounds (NULL: the settings'), and host precisions the GPU kernels have (bf16, int8,
 * int4, int2) unless given, so sim and replay store the same formats. */
static moesim_status make_config(const vctx *v, const validate_spec *r, const char *cost_table,
                                 config **out, moesim_error *err) {
    config *c = config_create();
    moesim_status st = MOESIM_OK;
    for (size_t i = 0; i < v->n_files && !st; i++) st = config_load_file(c, v->files[i], err);
    for (size_t i = 0; i < v->n_sets && !st; i++) st = config_set(c, v->sets[i], err);
    for (size_t i = 0; i < r->n_sets && !st; i++) st = config_set(c, r->sets[i], err);
    if (!st && cost_table)
        config_put(c, "sim", "cost_table", cost_table, "moesim validate --calibrate-rounds");
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

/* sim.host_precisions, expert.precision and batch.size of a run as its settings resolve them. */
static moesim_status run_formats(const vctx *v, const validate_spec *r, char *out, size_t len,
                                 moesim_precision *primary, uint32_t *batch_size,
                                 moesim_error *err) {
    config *c = NULL;
    moesim_status st = make_config(v, r, NULL, &c, err);
    sim_settings set;
    if (!st) st = sim_settings_read(c, &set, err);
    if (!st) snprintf(out, len, "%s", set.host_precisions);
    if (!st) *primary = (moesim_precision)set.precision;
    if (!st) *batch_size = set.batch_size;
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
                        .ssd_dir = v->ssd_dir,
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
    /* calibrating through the rounds: round r simulated with its slices combined, the TPOTs
     * with its first and second half of slices ([2 r], [2 r + 1]), with its even and odd slices
     * (the same), and with the calibration before round 1 alone */
    validate_record *sim_round; /* [repeats], NULL without */
    double *sim_tpot_half;      /* [2 * repeats] */
    double *sim_tpot_parity;    /* [2 * repeats] */
    double sim_tpot_first;
    bool refused; /* the simulator refused the configuration */
    char note[160];
} config_runs;

/* One simulation of a configuration on the machine `hw` (with its cost table: NULL, the
 * settings'), recorded in *rec (initialized by the caller). */
static moesim_status simulate_on(const vctx *v, const validate_spec *r, const hw_profile *hw,
                                 const char *cost_table, validate_record *rec, moesim_error *err) {
    config *c = NULL;
    moesim_status st = make_config(v, r, cost_table, &c, err);
    if (!st) {
        sim_hooks h = validate_record_hooks(rec);
        sim_inputs in = {.trace = v->tokens,
                         .stream = v->ts,
                         .model = &v->model,
                         .hw = hw,
                         .quant = &v->quant,
                         .hooks = &h};
        st = sim_run(&in, r->policy, c, &rec->r, err);
    }
    config_destroy(c);
    return st;
}

/* The simulator's run of a configuration. One it refuses (a policy that cannot work in the
 * budget, e.g. `static` when the experts do not fit) is marked refused, not an error: the
 * validation set crosses every policy with every budget. */
static moesim_status simulate(const vctx *v, const validate_spec *r, const hw_profile *hw,
                              const char *cost_table, config_runs *cr, moesim_error *err) {
    validate_record_init(&cr->sim, v->tokens->n_requests, v->tokens->meta.n_layers);
    cr->real = moesim_xcalloc(v->repeats, sizeof *cr->real);
    moesim_status st = simulate_on(v, r, hw, cost_table, &cr->sim, err);
    if (st == MOESIM_EINPUT) {
        cr->refused = true;
        snprintf(cr->note, sizeof cr->note, "%s", err->msg);
        st = MOESIM_OK;
    }
    return st;
}

/* One more replay of a configuration. */
static moesim_status replay_again(const vctx *v, const validate_spec *r, config_runs *cr,
                                  moesim_error *err) {
    validate_record *rec = &cr->real[cr->n_real++];
    validate_record_init(rec, v->tokens->n_requests, v->tokens->meta.n_layers);
    config *c = NULL;
    moesim_status st = make_config(v, r, NULL, &c, err);
    if (!st) st = replay_once(v, r->policy, c, rec, err);
    config_destroy(c);
    return st;
}

/* Which of n records has the median makespan (the lower one of an even count). */
static uint32_t median_makespan(const validate_record *recs, uint32_t n) {
    uint32_t median = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t below = 0; /* runs faster than run i (ties by order) */
        for (uint32_t j = 0; j < n; j++) {
            double a = recs[j].r.makespan_ms, b = recs[i].r.makespan_ms;
            below += a < b || (a == b && j < i);
        }
        if (below == (n - 1) / 2) median = i;
    }
    return median;
}

/* The row of a configuration: the replay of median makespan (the lower one of an even count;
 * it keeps the per-request and per-layer figures of one real execution) against the simulator,
 * with the TPOT range of all its replays. Calibrated through the rounds, the simulation compared
 * is the median of the rounds' simulations, each with its round's profile, as the replay is the
 * median of the rounds' replays: one round's profile is a handful of single-shot slices, and
 * its own noise (even against odd slices: a median 12.8 % of simulated TPOT on the Mixtral
 * shapes) would come whole into the error. */
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
    uint32_t n = cr->n_real, median = median_makespan(cr->real, n);
    uint32_t sim_median = cr->sim_round ? median_makespan(cr->sim_round, n) : 0;
    const validate_record *sim = cr->sim_round ? &cr->sim_round[sim_median] : &cr->sim;
    moesim_status st = validate_compare(sim, &cr->real[median], r->label, row, err);
    if (!st && cr->sim_round) {
        validate_calib_drift(&cr->sim_tpot_half[2 * sim_median],
                             &cr->sim_tpot_parity[2 * sim_median], sim->r.tpot.mean_ms,
                             &row->sim_tpot_drift, &row->sim_tpot_slice_noise);
        row->tpot_err_first_calib = validate_rel_err(cr->sim_tpot_first, row->real_tpot_ms);
    }
    MOESIM_ASSERT(n <= VALIDATE_MAX_ROUNDS); /* --repeats is checked against it */
    for (uint32_t i = 0; i < n && !st; i++) {
        row->real_tpot_lo_ms = fmin(row->real_tpot_lo_ms, cr->real[i].r.tpot.mean_ms);
        row->real_tpot_hi_ms = fmax(row->real_tpot_hi_ms, cr->real[i].r.tpot.mean_ms);
        row->real_tpot_round_ms[row->n_rounds++] = cr->real[i].r.tpot.mean_ms; /* round i */
    }
    if (st) moesim_error_prefix(err, "%s (%s)", r->policy, r->label);
    return st;
}

static void config_runs_free(config_runs *cr, uint32_t repeats) {
    validate_record_free(&cr->sim);
    for (uint32_t i = 0; i < cr->n_real; i++) validate_record_free(&cr->real[i]);
    free(cr->real);
    for (uint32_t i = 0; cr->sim_round && i < repeats; i++) validate_record_free(&cr->sim_round[i]);
    free(cr->sim_round);
    free(cr->sim_tpot_half);
    free(cr->sim_tpot_parity);
}

/* A profile the simulator loads: a calibration written as a profile and a cost table. */
typedef struct loaded_profile {
    hw_profile hw;
    char table[1100];
} loaded_profile;

/* The calibrations of a validation that calibrates through its rounds: the one before round 1
 * and each round's slices, and the profiles made of them. */
typedef struct round_profiles {
    calib_results *first;  /* before round 1 */
    calib_results *slices; /* [repeats][per_round]: before a round's first replay, after each */
    uint32_t per_round;    /* configurations replayed + 1 */
    loaded_profile first_p, *round_p;  /* [repeats] */
    loaded_profile *half_p, *parity_p; /* [2 * repeats]: first|second, even|odd */
} round_profiles;

static void round_profiles_alloc(round_profiles *rp, uint32_t repeats, uint32_t per_round) {
    rp->first = moesim_xcalloc(1, sizeof *rp->first);
    rp->per_round = per_round;
    rp->slices = moesim_xcalloc((size_t)repeats * per_round, sizeof *rp->slices);
    rp->round_p = moesim_xcalloc(repeats, sizeof *rp->round_p);
    rp->half_p = moesim_xcalloc(2 * (size_t)repeats, sizeof *rp->half_p);
    rp->parity_p = moesim_xcalloc(2 * (size_t)repeats, sizeof *rp->parity_p);
}

static void round_profiles_free(round_profiles *rp) {
    free(rp->first);
    free(rp->slices);
    free(rp->round_p);
    free(rp->half_p);
    free(rp->parity_p);
}

static moesim_status publish(const vctx *v, const calib_results *r, const char *stem,
                             loaded_profile *out, moesim_error *err) {
    return validate_calib_publish(v->calib, r, stem, &out->hw, out->table, sizeof out->table, err);
}

/* One slice of round `round` (slot k of its slices). */
static moesim_status take_slice(const vctx *v, round_profiles *rp, uint32_t round, uint32_t k,
                                double *at_s, moesim_error *err) {
    return validate_calib_take(v->calib, 1, &rp->slices[(size_t)round * rp->per_round + k], at_s,
                               err);
}

/* Each round's slices combined, whole, by halves and by even and odd, written as profiles and
 * named in meta. */
static moesim_status publish_rounds(const vctx *v, round_profiles *rp, const double *round_at_s,
                                    validate_meta *meta, moesim_error *err) {
    moesim_status st = MOESIM_OK;
    calib_results *c = moesim_xcalloc(1, sizeof *c); /* large: the cost curves */
    uint32_t n = rp->per_round, half = n / 2;
    for (uint32_t r = 0; r < v->repeats && !st; r++) {
        const calib_results *sl = &rp->slices[(size_t)r * n];
        char stem[48];
        validate_calib_combine(sl, n, 1, c);
        snprintf(stem, sizeof stem, "round-%u", r + 1);
        st = publish(v, c, stem, &rp->round_p[r], err);
        validate_calib_figures(v->calib, c, round_at_s[r], &meta->calib[r + 1]);
        snprintf(meta->calib[r + 1].profile, sizeof meta->calib[r + 1].profile, "%s/%s.ini",
                 v->calib->dir, stem);
        validate_calib_log(v->calib, stem, &meta->calib[r + 1]);
        validate_calib_combine(sl, half, 1, c);
        snprintf(stem, sizeof stem, "round-%u-first-half", r + 1);
        if (!st) st = publish(v, c, stem, &rp->half_p[2 * r], err);
        validate_calib_combine(sl + half, n - half, 1, c);
        snprintf(stem, sizeof stem, "round-%u-second-half", r + 1);
        if (!st) st = publish(v, c, stem, &rp->half_p[2 * r + 1], err);
        validate_calib_combine(sl, n - half, 2, c);
        snprintf(stem, sizeof stem, "round-%u-even", r + 1);
        if (!st) st = publish(v, c, stem, &rp->parity_p[2 * r], err);
        validate_calib_combine(sl + 1, half, 2, c);
        snprintf(stem, sizeof stem, "round-%u-odd", r + 1);
        if (!st) st = publish(v, c, stem, &rp->parity_p[2 * r + 1], err);
    }
    free(c);
    return st;
}

/* The TPOT of one simulation of a configuration with profile p. */
static moesim_status tpot_with(const vctx *v, const validate_spec *spec, const loaded_profile *p,
                               double *tpot_ms, moesim_error *err) {
    validate_record rec;
    validate_record_init(&rec, v->tokens->n_requests, v->tokens->meta.n_layers);
    moesim_status st = simulate_on(v, spec, &p->hw, p->table, &rec, err);
    *tpot_ms = rec.r.tpot.mean_ms;
    validate_record_free(&rec);
    return st;
}

/* Every configuration the simulator took, again with each round's calibration, whole, by halves
 * and by even and odd, and with the calibration before round 1 alone. */
static moesim_status simulate_rounds(const vctx *v, const validate_spec *specs, config_runs *runs,
                                     size_t n, const round_profiles *rp, moesim_error *err) {
    moesim_status st = MOESIM_OK;
    uint32_t nr = v->tokens->n_requests, nl = v->tokens->meta.n_layers;
    for (size_t i = 0; i < n && !st; i++) {
        config_runs *cr = &runs[i];
        if (cr->refused) continue;
        cr->sim_round = moesim_xcalloc(v->repeats, sizeof *cr->sim_round);
        cr->sim_tpot_half = moesim_xcalloc(2 * (size_t)v->repeats, sizeof *cr->sim_tpot_half);
        cr->sim_tpot_parity = moesim_xcalloc(2 * (size_t)v->repeats, sizeof *cr->sim_tpot_parity);
        for (uint32_t r = 0; r < v->repeats && !st; r++) {
            validate_record_init(&cr->sim_round[r], nr, nl);
            st = simulate_on(v, &specs[i], &rp->round_p[r].hw, rp->round_p[r].table,
                             &cr->sim_round[r], err);
            for (int h = 0; h < 2 && !st; h++) {
                st = tpot_with(v, &specs[i], &rp->half_p[2 * r + h], &cr->sim_tpot_half[2 * r + h],
                               err);
                if (!st)
                    st = tpot_with(v, &specs[i], &rp->parity_p[2 * r + h],
                                   &cr->sim_tpot_parity[2 * r + h], err);
            }
        }
        if (!st) st = tpot_with(v, &specs[i], &rp->first_p, &cr->sim_tpot_first, err);
        if (st) moesim_error_prefix(err, "%s (%s)", specs[i].policy, specs[i].label);
    }
    return st;
}

/* Every configuration through the simulator, then `v->repeats` rounds of replays, each
 * configuration once per round: a slow drift of a shared machine's disk or memory bandwidth
 * falls on every configuration alike instead of on those measured while it lasted. With
 * calibrations between the rounds, the machine is calibrated before the first simulations and
 * after each round, and every round simulated again with the machine as it was around it (the
 * given profile then only supplies what a calibration cannot measure). */
static moesim_status run_all(const vctx *v, const validate_spec *specs, size_t n,
                             validate_row *rows, validate_meta *meta, moesim_error *err) {
    config_runs *runs = moesim_xcalloc(n ? n : 1, sizeof *runs);
    round_profiles rp = {0};
    double *round_at_s = moesim_xcalloc(v->repeats, sizeof *round_at_s);
    moesim_status st = MOESIM_OK;
    /* calibrating through the rounds: the calibration before round 1 is also the profile of the
     * first simulations (which refuse what cannot run, and are printed beside the replays) */
    const hw_profile *first_hw = &v->hw;
    const char *first_table = NULL;
    if (v->calib) {
        calib_results *first = moesim_xcalloc(1, sizeof *first);
        double at_s;
        st = validate_calib_take(v->calib, v->calib->repeats, first, &at_s, err);
        validate_calib_figures(v->calib, first, at_s, &meta->calib[0]);
        snprintf(meta->calib[0].profile, sizeof meta->calib[0].profile, "%s/calibration-0.ini",
                 v->calib->dir);
        validate_calib_log(v->calib, "calibrated", &meta->calib[0]);
        round_profiles_alloc(&rp, v->repeats, (uint32_t)n + 1);
        *rp.first = *first;
        free(first);
        if (!st) st = publish(v, rp.first, "calibration-0", &rp.first_p, err);
        first_hw = &rp.first_p.hw;
        first_table = rp.first_p.table;
    }
    size_t simulated = 0;
    for (; simulated < n && !st; simulated++) {
        st = simulate(v, &specs[simulated], first_hw, first_table, &runs[simulated], err);
        if (st)
            moesim_error_prefix(err, "%s (%s)", specs[simulated].policy, specs[simulated].label);
    }
    uint32_t live = 0; /* configurations replayed: a slice before a round and after each */
    for (size_t i = 0; i < n; i++) live += !runs[i].refused;
    rp.per_round = live + 1;
    for (uint32_t round = 0; round < v->repeats && !st; round++) {
        uint32_t slice = 0;
        if (v->calib) st = take_slice(v, &rp, round, slice++, &round_at_s[round], err);
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
            double at_s;
            if (!st && v->calib) st = take_slice(v, &rp, round, slice++, &at_s, err);
        }
    }
    if (!st && v->calib && live) {
        meta->n_calib = v->repeats + 1;
        st = publish_rounds(v, &rp, round_at_s, meta, err);
        if (!st) st = simulate_rounds(v, specs, runs, n, &rp, err);
    }
    for (size_t i = 0; i < n && !st; i++) st = compare_runs(&runs[i], &specs[i], &rows[i], err);
    for (size_t i = 0; i < simulated; i++) config_runs_free(&runs[i], v->repeats);
    free(runs);
    free(round_at_s);
    round_profiles_free(&rp);
    return st;
}

/* The longest prompt of the trace's requests and the longest request (prompt and decode):
 * the most tokens one step of a request runs and the most positions it attends. */
static void trace_extents(const vctx *v, uint32_t *max_prompt, uint32_t *max_len) {
    trace_request_index own = {0};
    const trace_request_index *ix = v->ts ? trace_stream_requests(v->ts) : &own;
    if (!v->ts) trace_request_index_build(&own, v->t);
    *max_prompt = *max_len = 0;
    for (uint32_t r = 0; r < ix->n_requests; r++) {
        if (ix->n_prefill[r] > *max_prompt) *max_prompt = ix->n_prefill[r];
        if (ix->n_tokens[r] > *max_len) *max_len = ix->n_tokens[r];
    }
    trace_request_index_free(&own);
}

/* One host store for the runs (pinning tens of GB is slow): the formats of the first
 * configuration's settings; on the CPU, its expert file. */
static moesim_status make_store(vctx *v, const validate_spec *first, moesim_error *err) {
    moesim_status st = run_formats(v, first, v->store_formats, sizeof v->store_formats, &v->primary,
                                   &v->batch_size, err);
    moesim_precision primary = v->primary;
    if (st) return st;
    if (!v->cpu)
        return replay_store_create(&v->model, &v->quant, v->store_formats, primary,
                                   v->hw.dram_bytes, NULL, v->seed, &v->store, err);
    bool policy_only;
    st = memsys_parse_host_precisions(v->store_formats, v->stored, &policy_only, err);
    if (!st && policy_only)
        st = moesim_fail(err, MOESIM_EINPUT,
                         "validate --backend cpu: [sim] host_precisions must list the formats "
                         "of the shared expert file (e.g. int8,int4,int2), not 'policy'");
    if (!st)
        st = cpu_store_create(&v->model, v->stored, v->ssd_dir, v->seed, NULL, &v->cpu_store,
                             err);
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
              .ssd_dir = s->ssd_dir,
              .repeats = s->repeats,
              .quiet = s->quiet};
    memset(meta, 0, sizeof *meta);
    /* the CPU replay and the simulator read the trace as a stream; the GPU replay holds it */
    moesim_status st =
        v.cpu ? trace_stream_open(s->trace_path, &v.ts, err) : trace_read(s->trace_path, &v.t, err);
    if (!st) v.tokens = v.ts ? trace_stream_tokens(v.ts) : v.t;
    if (!st) st = hw_load_by_name(s->hw_name, &v.hw, err);
    if (!st)
        st =
            model_load_by_name(s->model_name ? s->model_name : v.tokens->meta.model, &v.model, err);
    if (!st) st = quant_table_load_default(&v.quant, err);
    if (!st && !v.cpu) st = replay_device_check(err); /* after the inputs: theirs come first */
    if (!st && p->n) st = make_store(&v, &p->specs[0], err);
    validate_calibrator calib;
    calib_cpu_cache calib_cache = {.store = v.cpu_store};
    if (!st && s->calibrate_dir) st = validate_calib_dir_prepare(s->calibrate_dir, err);
    if (!st && s->calibrate_dir) {
        uint32_t max_prompt, max_len;
        trace_extents(&v, &max_prompt, &max_len);
        calib = (validate_calibrator){.model = &v.model,
                                      .base = &v.hw,
                                      .precision = v.primary,
                                      .repeats = s->calibrate_repeats,
                                      .cpu = v.cpu,
                                      .dir = s->calibrate_dir,
                                      .max_tokens = max_prompt * v.batch_size,
                                      .max_context = max_len,
                                      .precisions = v.cpu ? v.stored : NULL,
                                      .cache = v.cpu ? &calib_cache : NULL,
                                      .start_ns = replay_exec_clock_ns(),
                                      .quiet = s->quiet};
        v.calib = &calib;
    }
    if (!st) st = run_all(&v, p->specs, p->n, rows, meta, err);
    if (!st) {
        snprintf(meta->device, sizeof meta->device, "%s", v.hw.gpu);
        snprintf(meta->profile, sizeof meta->profile, "%s%s", v.hw.name,
                 v.calib ? ", calibrated through the rounds" : "");
        snprintf(meta->trace, sizeof meta->trace, "%s", s->trace_path);
        snprintf(meta->model, sizeof meta->model, "%s", v.model.name);
    }
    calib_cpu_cache_free(&calib_cache);
    replay_store_destroy(v.store);
    cpu_store_destroy(v.cpu_store);
    trace_destroy(v.t);
    trace_stream_close(v.ts);
    return st;
}
