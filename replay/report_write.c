/* The validation report as Markdown and as CSV (replay/report_files.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "common/atomic_file.h"
#include "replay/report_files.h"

static void pct(FILE *f, double v) {
    if (isnan(v))
        fputs(" n/a |", f);
    else
        fprintf(f, " %+.2f %% |", 100.0 * v);
}

static void gbps(FILE *f, double v) {
    if (isnan(v))
        fputs(" n/a |", f);
    else
        fprintf(f, " %.3f |", v);
}

/* The lowest and highest TPOT of a row's replays overlap the other's: the machine's own spread
 * could order the pair either way. */
static bool ranges_overlap(const validate_row *a, const validate_row *b) {
    return fmax(a->real_tpot_lo_ms, b->real_tpot_lo_ms) <=
           fmin(a->real_tpot_hi_ms, b->real_tpot_hi_ms);
}

/* How the replay's rounds split a pair ("lfu faster in 5 of 9 rounds, not ordered"), or without
 * rounds whether the replays' TPOT ranges overlap (a pair closer than the run-to-run spread can
 * go either way). */
static void write_replay_split(FILE *f, const validate_row *a, const validate_row *b) {
    uint32_t rounds, faster = validate_rounds_faster(a, b, &rounds);
    if (a->n_rounds >= VALIDATE_MIN_ROUNDS && b->n_rounds >= VALIDATE_MIN_ROUNDS)
        fprintf(f, ", %s faster in %u of %u rounds%s", a->policy, faster, rounds,
                validate_replay_order(a, b) ? "" : ": not ordered by the replay");
    else if (ranges_overlap(a, b))
        fputs(", replay ranges overlap", f);
}

/* Which pairs the replay's medians order differently, with how far apart the simulator put them
 * and how the replay's rounds split them; then the pairs the simulator ties, which are not
 * ranked. */
static void write_pairs(FILE *f, const validate_row *rows, size_t n, const validate_summary *s) {
    size_t n_disc = validate_discordant_pairs(rows, n, NULL, 0);
    size_t n_tied = validate_sim_tied_pairs(rows, n, NULL, 0);
    size_t cap = n_disc > n_tied ? n_disc : n_tied;
    if (!cap) return;
    size_t(*pairs)[2] = moesim_xmalloc(cap * sizeof *pairs);
    validate_discordant_pairs(rows, n, pairs, cap);
    if (n_disc)
        fprintf(f, "Ordered differently (simulated TPOTs apart by; largest %.2f %%):",
                100 * s->discordant_gap_max);
    for (size_t k = 0; k < n_disc; k++) {
        const validate_row *a = &rows[pairs[k][0]], *b = &rows[pairs[k][1]];
        fprintf(f, "%s %s vs %s at %s (%.2f %%", k ? ";" : "", a->policy, b->policy, a->label,
                100 * validate_sim_gap(a, b));
        write_replay_split(f, a, b);
        fputc(')', f);
    }
    if (n_disc) fputs(".\n", f);
    validate_sim_tied_pairs(rows, n, pairs, cap);
    if (n_tied) fputs("Tied in the simulator (the same work; not ranked):", f);
    for (size_t k = 0; k < n_tied; k++)
        fprintf(f, "%s %s vs %s at %s", k ? ";" : "", rows[pairs[k][0]].policy,
                rows[pairs[k][1]].policy, rows[pairs[k][0]].label);
    if (n_tied) fputs(".\n", f);
    free(pairs);
}

/* The relative change of b from a, as "+3.1 %" ("n/a" when either is not known). */
static void change(FILE *f, double a, double b) {
    if (isnan(a) || isnan(b) || a == 0)
        fputs(" n/a |", f);
    else
        fprintf(f, " %+.1f %% |", 100.0 * (b / a - 1));
}

/* A slowdown beside the other thread (a fraction), or n/a where not measured. */
static void slowdown(FILE *f, double x) {
    if (isnan(x))
        fputs(" n/a |", f);
    else
        fprintf(f, " %+.1f %% |", 100.0 * x);
}

/* The machine as the calibration before round 1 and each round's slices found it, each figure's
 * change from the row before, and what the drift within the rounds is worth in the simulated
 * TPOTs against the error reported. */
static void write_drift(FILE *f, const validate_meta *meta, const validate_summary *s) {
    if (!meta->n_calib) return;
    fprintf(f, "\n## The machine through the rounds\n\n"
               "Calibrated before the first round of replays, then in slices through every "
               "round (before its first replay and after each); round r is simulated with its "
               "slices combined. Changes are from the row before.\n\n"
               "| calibration | at s | disk GB/s | change | disk latency us | gate+up us (1 "
               "token) | change | attention proj us | change | LM head us | change | reads beside "
               "ops | ops beside reads | profile |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (uint32_t k = 0; k < meta->n_calib; k++) {
        const validate_calibration *c = &meta->calib[k], *p = k ? &meta->calib[k - 1] : c;
        if (k)
            fprintf(f, "| round %u |", k);
        else
            fputs("| before round 1 |", f);
        fprintf(f, " %.0f | %.3f |", c->at_s, c->disk_gb_per_s);
        change(f, p->disk_gb_per_s, c->disk_gb_per_s);
        fprintf(f, " %.1f | %.1f |", c->disk_latency_us, c->gate_up_us);
        change(f, p->gate_up_us, c->gate_up_us);
        fprintf(f, " %.1f |", c->attention_proj_us);
        change(f, p->attention_proj_us, c->attention_proj_us);
        fprintf(f, " %.1f |", c->lm_head_us);
        change(f, p->lm_head_us, c->lm_head_us);
        slowdown(f, c->reads_beside_ops);
        slowdown(f, c->ops_beside_reads);
        fprintf(f, " %s |\n", c->profile);
    }
    fprintf(f,
            "\nDrift within the compared rounds, as simulated TPOT: how much more a round's first "
            "and second half of slices move it than its even and odd slices do (the same span of "
            "time: the slices' own noise, median %.2f %%), relative to the TPOT compared: median "
            "%.2f %% against a median |TPOT error| of %.2f %%",
            100 * s->slice_noise_tpot_median, 100 * s->drift_tpot_median,
            100 * s->tpot_abs_err_median);
    if (!isnan(s->tpot_abs_err_median_first_calib))
        fprintf(f,
                " (had every round been simulated with the first calibration alone, as with one "
                "calibration before the validation: %.2f %%)",
                100 * s->tpot_abs_err_median_first_calib);
    if (s->drift_exceeds_error)
        fputs(": **the machine drifted more than the error; no result is called** (rerun on a "
              "quieter machine, or with shorter rounds).\n",
              f);
    else
        fputs(": the error is the simulator's, not the machine's drift.\n", f);
}

void validate_report_write_md(FILE *f, const validate_meta *meta, const validate_row *rows,
                              size_t n, const validate_summary *s) {
    fprintf(f, "# moesim validate: simulator vs replay\n\n");
    fprintf(f, "Device: %s (profile %s). Trace: %s (model %s).\n\n", meta->device, meta->profile,
            meta->trace, meta->model);
    fprintf(f, "| policy | configuration | TPOT sim ms | TPOT real ms | TPOT real range ms | "
               "TPOT err | TTFT sim ms | TTFT real ms | TTFT err | total err | median req TPOT "
               "err | median req TTFT err | median layer err | worst layer (err) | hit sim | hit "
               "real | link GB/s sim | link GB/s real |\n");
    fprintf(f, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const validate_row *r = &rows[i];
        if (r->refused) continue;
        fprintf(f, "| %s | %s | %.4f | %.4f |", r->policy, r->label, r->sim_tpot_ms,
                r->real_tpot_ms);
        if (isnan(r->real_tpot_lo_ms) || isnan(r->real_tpot_hi_ms))
            fputs(" n/a |", f);
        else
            fprintf(f, " %.2f-%.2f |", r->real_tpot_lo_ms, r->real_tpot_hi_ms);
        pct(f, r->tpot_err);
        fprintf(f, " %.4f | %.4f |", r->sim_ttft_ms, r->real_ttft_ms);
        pct(f, r->ttft_err);
        pct(f, r->total_err);
        pct(f, r->req_tpot_err_median);
        pct(f, r->req_ttft_err_median);
        pct(f, r->layer_err_median);
        if (r->layer_worst >= 0)
            fprintf(f, " L%d (%.2f %%) |", r->layer_worst, 100.0 * r->layer_err_max);
        else
            fputs(" n/a |", f);
        fprintf(f, " %.4f | %.4f |", r->sim_hit_rate, r->real_hit_rate);
        gbps(f, r->sim_link_gb_per_s);
        gbps(f, r->real_link_gb_per_s);
        fputc('\n', f);
    }
    for (size_t i = 0; i < n; i++)
        if (rows[i].refused)
            fprintf(f, "\nRefused by the simulator (left out): %s, %s: %s\n", rows[i].policy,
                    rows[i].label, rows[i].note);
    fprintf(f, "\nPer-layer times (ms, summed over steps) of every configuration: the JSON's "
               "sim_layer_ms and real_layer_ms.\n");
    fprintf(f,
            "\nMedian |TPOT error| %.2f %% (target <= 5 %%), median |TTFT error| %.2f %% "
            "(target <= 10 %%), median |total error| %.2f %%.\n",
            100 * s->tpot_abs_err_median, 100 * s->ttft_abs_err_median,
            100 * s->total_abs_err_median);
    if (!isnan(s->outside_abs_err_median))
        fprintf(f,
                "Where the time goes: in the MoE layers (router to last expert) median |error| "
                "%.2f %%; outside them (attention, shared and dense FFNs, combine, LM head, the "
                "step's own work; the JSON's sim_outside_ms and real_outside_ms) %.2f %%.\n",
                100 * s->layer_abs_err_median, 100 * s->outside_abs_err_median);
    fprintf(f,
            "Policy order by TPOT: %llu of %llu pairs agree (%s; %llu tied in the simulator, "
            "not ranked); of the %llu pairs the replay orders (at least %d rounds: the sign "
            "test over rounds, p < 0.05; fewer: every pair), %llu agree. Targets %s.\n",
            (unsigned long long)s->concordant, (unsigned long long)s->pairs,
            s->same_order ? "same order" : "order differs", (unsigned long long)s->sim_ties,
            (unsigned long long)s->replay_ordered, VALIDATE_MIN_ROUNDS,
            (unsigned long long)s->replay_ordered_concordant, s->meets_targets ? "met" : "not met");
    write_pairs(f, rows, n, s);
    write_drift(f, meta, s);
}

/* The rows as CSV for plots/validate.gp (refused configurations left out). */
moesim_status validate_report_write_csv(const char *path, const validate_row *rows, size_t n,
                                        moesim_error *err) {
    atomic_file af;
    if (atomic_file_open(&af, path, err)) return MOESIM_EIO;
    fprintf(af.fp, "policy,configuration,sim_tpot_ms,real_tpot_ms,tpot_err,sim_ttft_ms,"
                   "real_ttft_ms,ttft_err,total_err,real_tpot_lo_ms,real_tpot_hi_ms,"
                   "sim_tpot_drift,sim_tpot_slice_noise,sim_outside_ms,real_outside_ms\n");
    for (size_t i = 0; i < n; i++) {
        const validate_row *r = &rows[i];
        if (r->refused) continue;
        fprintf(af.fp,
                "%s,%s,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,"
                "%.17g\n",
                r->policy, r->label, r->sim_tpot_ms, r->real_tpot_ms, r->tpot_err, r->sim_ttft_ms,
                r->real_ttft_ms, r->ttft_err, r->total_err, r->real_tpot_lo_ms, r->real_tpot_hi_ms,
                r->sim_tpot_drift, r->sim_tpot_slice_noise, r->sim_outside_ms, r->real_outside_ms);
    }
    return atomic_file_commit(&af, err);
}
