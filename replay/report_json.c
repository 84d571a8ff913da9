/* The validation report as JSON, and several such files merged into one set (e.g. one GPU call
 * per budget; no GPU needed) (replay/report_files.h). A number the JSON lacks (an older file) or
 * holds as null reads back as NaN. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/alloc.h"
#include "common/model.h"
#include "common/paths.h"
#include "replay/report_files.h"

json_t *validate_report_json(const validate_meta *meta, const validate_row *rows, size_t n,
                             const validate_summary *s) {
    json_t *j = json_object(), *a = json_array();
    json_object_set_new(j, "device", json_string(meta->device));
    json_object_set_new(j, "profile", json_string(meta->profile));
    json_object_set_new(j, "trace", json_string(meta->trace));
    json_object_set_new(j, "model", json_string(meta->model));
    for (size_t i = 0; i < n; i++) {
        const validate_row *r = &rows[i];
        json_t *o = json_object();
#define NUM(x) (isnan(x) ? json_null() : json_real(x))
        json_object_set_new(o, "policy", json_string(r->policy));
        json_object_set_new(o, "configuration", json_string(r->label));
        if (r->refused) {
            json_object_set_new(o, "refused", json_string(r->note));
            json_array_append_new(a, o);
            continue;
        }
        json_object_set_new(o, "sim_tpot_ms", NUM(r->sim_tpot_ms));
        json_object_set_new(o, "real_tpot_ms", NUM(r->real_tpot_ms));
        json_object_set_new(o, "real_tpot_lo_ms", NUM(r->real_tpot_lo_ms));
        json_object_set_new(o, "real_tpot_hi_ms", NUM(r->real_tpot_hi_ms));
        json_t *rounds = json_array();
        for (uint32_t k = 0; k < r->n_rounds; k++)
            json_array_append_new(rounds, NUM(r->real_tpot_round_ms[k]));
        json_object_set_new(o, "real_tpot_rounds_ms", rounds);
        json_object_set_new(o, "tpot_err", NUM(r->tpot_err));
        json_object_set_new(o, "sim_ttft_ms", NUM(r->sim_ttft_ms));
        json_object_set_new(o, "real_ttft_ms", NUM(r->real_ttft_ms));
        json_object_set_new(o, "ttft_err", NUM(r->ttft_err));
        json_object_set_new(o, "total_err", NUM(r->total_err));
        json_object_set_new(o, "sim_total_ms", NUM(r->sim_total_ms));
        json_object_set_new(o, "real_total_ms", NUM(r->real_total_ms));
        json_object_set_new(o, "sim_outside_ms", NUM(r->sim_outside_ms));
        json_object_set_new(o, "real_outside_ms", NUM(r->real_outside_ms));
        json_object_set_new(o, "outside_err", NUM(r->outside_err));
        json_object_set_new(o, "req_tpot_err_median", NUM(r->req_tpot_err_median));
        json_object_set_new(o, "req_ttft_err_median", NUM(r->req_ttft_err_median));
        json_object_set_new(o, "layer_err_median", NUM(r->layer_err_median));
        json_object_set_new(o, "layer_err_max", NUM(r->layer_err_max));
        json_object_set_new(o, "layer_worst", json_integer(r->layer_worst));
        json_t *ls = json_array(), *lr = json_array();
        for (uint32_t l = 0; l < r->n_layers; l++) {
            json_array_append_new(ls, json_real(r->sim_layer_ms[l]));
            json_array_append_new(lr, json_real(r->real_layer_ms[l]));
        }
        json_object_set_new(o, "sim_layer_ms", ls);
        json_object_set_new(o, "real_layer_ms", lr);
        json_object_set_new(o, "sim_hit_rate", NUM(r->sim_hit_rate));
        json_object_set_new(o, "real_hit_rate", NUM(r->real_hit_rate));
        json_object_set_new(o, "sim_link_gb_per_s", NUM(r->sim_link_gb_per_s));
        json_object_set_new(o, "real_link_gb_per_s", NUM(r->real_link_gb_per_s));
        json_object_set_new(o, "sim_tpot_drift", NUM(r->sim_tpot_drift));
        json_object_set_new(o, "sim_tpot_slice_noise", NUM(r->sim_tpot_slice_noise));
        json_object_set_new(o, "tpot_err_first_calib", NUM(r->tpot_err_first_calib));
        json_array_append_new(a, o);
    }
    json_object_set_new(j, "rows", a);
    json_t *cj = json_array();
    for (uint32_t k = 0; k < meta->n_calib; k++) {
        const validate_calibration *c = &meta->calib[k];
        json_t *o = json_object();
        json_object_set_new(o, "at_s", NUM(c->at_s));
        json_object_set_new(o, "disk_gb_per_s", NUM(c->disk_gb_per_s));
        json_object_set_new(o, "disk_latency_us", NUM(c->disk_latency_us));
        json_object_set_new(o, "gate_up_us", NUM(c->gate_up_us));
        json_object_set_new(o, "attention_proj_us", NUM(c->attention_proj_us));
        json_object_set_new(o, "lm_head_us", NUM(c->lm_head_us));
        json_object_set_new(o, "reads_beside_ops", NUM(c->reads_beside_ops));
        json_object_set_new(o, "ops_beside_reads", NUM(c->ops_beside_reads));
        json_object_set_new(o, "profile", json_string(c->profile));
        json_array_append_new(cj, o);
    }
    json_object_set_new(j, "calibrations", cj);
    json_t *sj = json_object();
    json_object_set_new(sj, "tpot_abs_err_median", NUM(s->tpot_abs_err_median));
    json_object_set_new(sj, "ttft_abs_err_median", NUM(s->ttft_abs_err_median));
    json_object_set_new(sj, "total_abs_err_median", NUM(s->total_abs_err_median));
    json_object_set_new(sj, "outside_abs_err_median", NUM(s->outside_abs_err_median));
    json_object_set_new(sj, "layer_abs_err_median", NUM(s->layer_abs_err_median));
    json_object_set_new(sj, "pairs", json_integer((json_int_t)s->pairs));
    json_object_set_new(sj, "concordant", json_integer((json_int_t)s->concordant));
    json_object_set_new(sj, "sim_ties", json_integer((json_int_t)s->sim_ties));
    json_object_set_new(sj, "same_order", json_boolean(s->same_order));
    json_object_set_new(sj, "replay_ordered", json_integer((json_int_t)s->replay_ordered));
    json_object_set_new(sj, "replay_ordered_concordant",
                        json_integer((json_int_t)s->replay_ordered_concordant));
    json_object_set_new(sj, "discordant_sim_gap_max", json_real(s->discordant_gap_max));
    json_object_set_new(sj, "drift_tpot_median", NUM(s->drift_tpot_median));
    json_object_set_new(sj, "slice_noise_tpot_median", NUM(s->slice_noise_tpot_median));
    json_object_set_new(sj, "tpot_abs_err_median_first_calib",
                        NUM(s->tpot_abs_err_median_first_calib));
    json_object_set_new(sj, "drift_exceeds_error", json_boolean(s->drift_exceeds_error));
    json_object_set_new(sj, "meets_targets", json_boolean(s->meets_targets));
#undef NUM
    json_object_set_new(j, "summary", sj);
    return j;
}

#define VALIDATE_MERGE_ERR_TOLERANCE 0.005

/* A merged row's TPOTs are what a run measured (finite, > 0) and its error the one they give
 * (to half a percentage point, the report's resolution: hand-written summaries round): an
 * edited row would otherwise enter the summary as nan or as a stale error. */
static moesim_status check_row_tpot(const validate_row *r, const char *file, size_t i,
                                    moesim_error *err) {
    if (!(isfinite(r->sim_tpot_ms) && r->sim_tpot_ms > 0 && isfinite(r->real_tpot_ms) &&
          r->real_tpot_ms > 0))
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: rows[%zu]: expected sim_tpot_ms and real_tpot_ms > 0, got %g and "
                           "%g",
                           file, i, r->sim_tpot_ms, r->real_tpot_ms);
    double want = validate_rel_err(r->sim_tpot_ms, r->real_tpot_ms);
    if (!(fabs(r->tpot_err - want) <= VALIDATE_MERGE_ERR_TOLERANCE))
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: rows[%zu]: tpot_err %g, its TPOTs give %.4g (more than %g apart: "
                           "edited?)",
                           file, i, r->tpot_err, want, VALIDATE_MERGE_ERR_TOLERANCE);
    return MOESIM_OK;
}

moesim_status validate_report_merge(const char *const *files, size_t n_files, validate_meta *meta,
                                    validate_row **rows_out, size_t *n_rows, moesim_error *err) {
    memset(meta, 0, sizeof *meta);
    validate_row *rows = NULL;
    size_t n = 0;
    moesim_status st = MOESIM_OK;
    for (size_t f = 0; f < n_files && !st; f++) {
        json_error_t je;
        json_t *j = json_load_file(files[f], 0, &je);
        json_t *a = j ? json_object_get(j, "rows") : NULL;
        if (!j || !json_is_array(a)) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: expected the JSON of `moesim validate "
                             "--json` (%s)",
                             files[f], j ? "no \"rows\" array" : je.text);
            json_decref(j);
            break;
        }
        for (size_t g = 0; g < f && !st; g++)
            if (moesim_same_file(files[f], files[g]))
                st = moesim_fail(err, MOESIM_EINPUT, "%s: given twice (also as %s)", files[f],
                                 files[g]);
        const char *d = json_string_value(json_object_get(j, "device"));
        const char *pr = json_string_value(json_object_get(j, "profile"));
        const char *tp = json_string_value(json_object_get(j, "trace"));
        const char *md = json_string_value(json_object_get(j, "model"));
        const char *key[] = {"device", "profile", "trace", "model"}, *val[] = {d, pr, tp, md},
                   *first[] = {meta->device, meta->profile, meta->trace, meta->model};
        for (int k = 0; k < 4 && f && !st; k++) /* one validation set: one machine and trace */
            if (strcmp(val[k] ? val[k] : "?", first[k]))
                st = moesim_fail(err, MOESIM_EINPUT, "%s: %s '%s', the first file's is '%s'",
                                 files[f], key[k], val[k] ? val[k] : "?", first[k]);
        if (!st && !json_array_size(a))
            st = moesim_fail(err, MOESIM_EINPUT, "%s: \"rows\" is empty (nothing to merge)",
                             files[f]);
        if (st) {
            json_decref(j);
            break;
        }
        snprintf(meta->device, sizeof meta->device, "%s", d ? d : "?");
        snprintf(meta->profile, sizeof meta->profile, "%s", pr ? pr : "?");
        snprintf(meta->trace, sizeof meta->trace, "%s", tp ? tp : "?");
        snprintf(meta->model, sizeof meta->model, "%s", md ? md : "?");
        size_t i;
        json_t *o;
        json_array_foreach(a, i, o) {
            rows = moesim_xrealloc(rows, (n + 1) * sizeof *rows);
            validate_row *r = &rows[n++];
            memset(r, 0, sizeof *r);
            const char *pol = json_string_value(json_object_get(o, "policy"));
            const char *cfg = json_string_value(json_object_get(o, "configuration"));
            snprintf(r->policy, sizeof r->policy, "%s", pol ? pol : "?");
            snprintf(r->label, sizeof r->label, "%s", cfg ? cfg : "?");
            snprintf(r->group, sizeof r->group, "%s", r->label);
            const char *ref = json_string_value(json_object_get(o, "refused"));
            if (ref) {
                r->refused = true;
                snprintf(r->note, sizeof r->note, "%s", ref);
                continue;
            }
#define GET(field)                                                                                 \
    (json_is_number(json_object_get(o, #field)) ? json_number_value(json_object_get(o, #field))    \
                                                : NAN)
            r->sim_tpot_ms = GET(sim_tpot_ms);
            r->real_tpot_ms = GET(real_tpot_ms);
            r->real_tpot_lo_ms = GET(real_tpot_lo_ms); /* NAN from an older JSON */
            r->real_tpot_hi_ms = GET(real_tpot_hi_ms);
            json_t *rounds = json_object_get(o, "real_tpot_rounds_ms"); /* absent: older JSON */
            if (json_is_array(rounds) && json_array_size(rounds) <= VALIDATE_MAX_ROUNDS) {
                r->n_rounds = (uint32_t)json_array_size(rounds);
                for (uint32_t k = 0; k < r->n_rounds; k++) {
                    json_t *x = json_array_get(rounds, k);
                    r->real_tpot_round_ms[k] = json_is_number(x) ? json_number_value(x) : NAN;
                }
            }
            r->tpot_err = GET(tpot_err);
            if ((st = check_row_tpot(r, files[f], i, err))) break;
            r->sim_ttft_ms = GET(sim_ttft_ms);
            r->real_ttft_ms = GET(real_ttft_ms);
            r->ttft_err = GET(ttft_err);
            r->total_err = GET(total_err);
            r->sim_total_ms = GET(sim_total_ms); /* NAN in a JSON written before these */
            r->real_total_ms = GET(real_total_ms);
            r->sim_outside_ms = GET(sim_outside_ms);
            r->real_outside_ms = GET(real_outside_ms);
            r->outside_err = GET(outside_err);
            r->req_tpot_err_median = GET(req_tpot_err_median);
            r->req_ttft_err_median = GET(req_ttft_err_median);
            r->layer_err_median = GET(layer_err_median);
            r->layer_err_max = GET(layer_err_max);
            json_t *lw = json_object_get(o, "layer_worst");
            r->layer_worst = json_is_integer(lw) ? (int32_t)json_integer_value(lw) : -1;
            json_t *ls = json_object_get(o, "sim_layer_ms"),
                   *lr = json_object_get(o, "real_layer_ms");
            if (json_is_array(ls) && json_is_array(lr) &&
                json_array_size(ls) == json_array_size(lr) &&
                json_array_size(ls) <= MODEL_MAX_LAYERS) {
                r->n_layers = (uint32_t)json_array_size(ls);
                for (uint32_t l = 0; l < r->n_layers; l++) {
                    r->sim_layer_ms[l] = (float)json_number_value(json_array_get(ls, l));
                    r->real_layer_ms[l] = (float)json_number_value(json_array_get(lr, l));
                }
            }
            r->sim_hit_rate = GET(sim_hit_rate);
            r->real_hit_rate = GET(real_hit_rate);
            r->sim_link_gb_per_s = GET(sim_link_gb_per_s);
            r->real_link_gb_per_s = GET(real_link_gb_per_s);
            r->sim_tpot_drift = GET(sim_tpot_drift); /* NAN: not calibrated through the rounds */
            r->sim_tpot_slice_noise = GET(sim_tpot_slice_noise);
            r->tpot_err_first_calib = GET(tpot_err_first_calib);
        }
        /* each file's calibrations in turn (their times are from that file's start) */
        json_t *cs = json_object_get(j, "calibrations");
        json_array_foreach(cs, i, o) {
            if (meta->n_calib == VALIDATE_MAX_ROUNDS + 1) break;
            validate_calibration *c = &meta->calib[meta->n_calib++];
            c->at_s = GET(at_s);
            c->disk_gb_per_s = GET(disk_gb_per_s);
            c->disk_latency_us = GET(disk_latency_us);
            c->gate_up_us = GET(gate_up_us);
            c->attention_proj_us = GET(attention_proj_us);
            c->lm_head_us = GET(lm_head_us);
            c->reads_beside_ops = GET(reads_beside_ops); /* NAN from an older JSON */
            c->ops_beside_reads = GET(ops_beside_reads);
            const char *prof = json_string_value(json_object_get(o, "profile"));
            snprintf(c->profile, sizeof c->profile, "%s", prof ? prof : "?");
        }
#undef GET
        json_decref(j);
    }
    if (st) {
        free(rows);
        return st;
    }
    *rows_out = rows;
    *n_rows = n;
    return MOESIM_OK;
}
