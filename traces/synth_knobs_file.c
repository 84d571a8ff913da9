/* Knob files of the synthesizer (traces/synth_fit.h: synth_knobs_save, synth_knobs_load): the
 * fitted knobs as an INI file ([synth] knob = value, each with the statistic it was fitted to
 * in its comment; [popularity] the fitted table), written crash-safely and read back over a
 * synth_options. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "traces/synth_fit.h"

#define TABLE_PER_LINE 8 /* probabilities per line: lines stay within the INI reader's 200 */
static const char *const table_phase_names[SYNTH_TABLE_PHASES] = {"prefill", "decode"};

moesim_status synth_knobs_save(const char *path, const synth_fit_result *f, const model_geometry *m,
                               const char *real_path, moesim_error *err) {
    atomic_file af;
    if (atomic_file_open(&af, path, err)) return err ? err->status : MOESIM_EIO;
    FILE *fp = af.fp;
    fprintf(
        fp,
        "; synthesizer knobs fitted to %s by `moesim trace synth --fit` (traces/SYNTH.md,\n"
        "; \"Fitting to a trace\"): each value cites the statistic of that trace it was fitted\n"
        "; to (real / the fit's simulation). Load with `moesim trace synth --knobs FILE`.\n"
        "[synth]\n"
        "model = %s\n"
        "interleave = %u ; decode batch of %s's execution order\n",
        real_path, m->name, f->interleave, real_path);
    for (size_t i = 0; i < synth_knob_count; i++) {
        const synth_knob_info *ki = &synth_knob_table[i];
        const double v = *(const double *)((const char *)&f->options.knobs + ki->offset);
        fprintf(fp, "%s = %.17g ;", ki->name, v);
        const synth_fit_entry *e = NULL;
        for (size_t j = 0; j < f->n_entries; j++)
            if (!strcmp(f->entries[j].knob, ki->name)) e = &f->entries[j];
        if (e && e->fitted)
            fprintf(fp, " fitted to %s: %.4f / %.4f\n", e->statistic, e->real, e->achieved);
        else
            fprintf(fp, " default of the %s family (%s)\n", f->options.family_defaults,
                    e ? "the trace does not carry its statistic" : "not fitted");
    }
    const uint32_t T = (uint32_t)f->options.knobs.topics, L = m->n_moe_layers, E = m->n_experts;
    if (f->options.layer_knobs) {
        fprintf(fp,
                "\n; the fitted per-layer values of the locality knobs (KNOB.lL = value at MoE\n"
                "; layer L): they replace the depth profiles *_first/_mid/_last above, which\n"
                "; list their values at the first, middle and last layer\n"
                "[layers]\n");
        for (int k = 0; k < SYNTH_LAYER_KNOBS; k++)
            for (uint32_t l = 0; l < L; l++)
                fprintf(fp, "%s.l%u = %.17g\n", synth_layer_knob_names[k], l,
                        f->options.layer_knobs[(size_t)k * L + l]);
    }
    if (f->options.popularity) {
        fprintf(fp,
                "\n; the fitted popularity: [topic t][phase][layer l] each expert's probability,\n"
                "; experts e.. on the line tT.PHASE.lL.eE (topic t = a run of the real\n"
                "; requests; PHASE = prefill or decode)\n"
                "[popularity]\n");
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t ph = 0; ph < SYNTH_TABLE_PHASES; ph++)
                for (uint32_t l = 0; l < L; l++)
                    for (uint32_t e = 0; e < E; e += TABLE_PER_LINE) {
                        fprintf(fp, "t%u.%s.l%u.e%u =", t, table_phase_names[ph], l, e);
                        const float *row = f->options.popularity +
                                           (((size_t)t * SYNTH_TABLE_PHASES + ph) * L + l) * E;
                        for (uint32_t j = e; j < E && j < e + TABLE_PER_LINE; j++)
                            fprintf(fp, " %.9g", row[j]);
                        fputc('\n', fp);
                    }
    }
    if (ferror(fp)) {
        atomic_file_abort(&af);
        return moesim_fail(err, MOESIM_EIO, "%s: write failed", path);
    }
    return atomic_file_commit(&af, err);
}

/* One [popularity] line "tT.PHASE.lL.eE = p p ...": into table [T][SYNTH_TABLE_PHASES][L][E];
 * `filled` counts cells. */
static moesim_status table_line(const char *origin, const char *key, const char *value,
                                float *table, uint32_t T, uint32_t L, uint32_t E, uint8_t *filled,
                                moesim_error *err) {
    unsigned t, l, e, ph = SYNTH_TABLE_PHASES;
    char phase[16];
    int used = 0;
    const bool parsed = sscanf(key, "t%u.%15[a-z].l%u.e%u%n", &t, phase, &l, &e, &used) == 4;
    for (unsigned i = 0; parsed && i < SYNTH_TABLE_PHASES; i++)
        if (!strcmp(phase, table_phase_names[i])) ph = i;
    if (!parsed || key[used] || t >= T || ph >= SYNTH_TABLE_PHASES || l >= L || e >= E)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [popularity] %s: expected tT.prefill.lL.eE or tT.decode.lL.eE "
                           "with T < %u topics, L < %u layers, E < %u experts",
                           origin, key, T, L, E);
    const char *p = value;
    for (uint32_t j = e; *p; j++) {
        char *end;
        const double x = strtod(p, &end);
        if (end == p || j >= E || !(x >= 0 && x <= 1))
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: [popularity] %s: expected probabilities in [0, 1] for experts "
                               "%u..%u, got '%s'",
                               origin, key, e, E - 1, value);
        const size_t at = (((size_t)t * SYNTH_TABLE_PHASES + ph) * L + l) * E + j;
        table[at] = (float)x;
        filled[at] = 1;
        for (p = end; *p == ' ' || *p == '\t'; p++) {
        }
    }
    return MOESIM_OK;
}

/* One [layers] line "KNOB.lL = value" into layers [SYNTH_LAYER_KNOBS][L]. */
static moesim_status layer_line(const char *origin, const char *key, const char *value,
                                double *layers, uint32_t L, uint8_t *filled, moesim_error *err) {
    const char *dot = strrchr(key, '.');
    unsigned l = 0;
    int used = 0;
    int k = -1;
    for (int i = 0; dot && i < SYNTH_LAYER_KNOBS; i++)
        if (strlen(synth_layer_knob_names[i]) == (size_t)(dot - key) &&
            !strncmp(key, synth_layer_knob_names[i], (size_t)(dot - key)))
            k = i;
    if (k < 0 || sscanf(dot + 1, "l%u%n", &l, &used) != 1 || dot[1 + used] || l >= L)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [layers] %s: expected KNOB.lL with KNOB one of reuse_top1, "
                           "reuse_other, reuse_history, reuse_row_prefill, reuse_row_decode, "
                           "reuse_history_tokens and L < %u MoE layers",
                           origin, key, L);
    /* the range of the knob's profile points (or of reuse_history_tokens) */
    char name[64];
    snprintf(name, sizeof name, "%s%s", synth_layer_knob_names[k],
             k == SYNTH_LK_HISTORY_TOKENS ? "" : "_first");
    double x, lo = 0, hi = 0;
    for (size_t i = 0; i < synth_knob_count; i++)
        if (!strcmp(synth_knob_table[i].name, name))
            lo = synth_knob_table[i].min, hi = synth_knob_table[i].max;
    if (!config_parse_f64(value, &x) || !(x >= lo && x <= hi))
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [layers] %s: expected a number in [%g, %g], got '%s'", origin, key,
                           lo, hi, value);
    layers[(size_t)k * L + l] = x;
    filled[(size_t)k * L + l] = 1;
    return MOESIM_OK;
}

moesim_status synth_knobs_load(const char *path, const model_geometry *m, synth_options *o,
                               float **table, double **layer_table, uint32_t *interleave,
                               moesim_error *err) {
    config *c = config_create();
    moesim_status st = config_load_file(c, path, err);
    /* [synth] first: the table's size depends on its topics */
    for (size_t i = 0; !st && i < config_size(c); i++) {
        const char *section, *key, *value;
        config_entry_at(c, i, &section, &key, &value);
        char origin[512];
        config_origin(c, section, key, origin, sizeof origin);
        double x;
        uint64_t u;
        if (!strcmp(section, "popularity") || !strcmp(section, "layers")) continue;
        if (strcmp(section, "synth"))
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: [%s]: unknown section (expected [synth], [layers] or "
                             "[popularity])",
                             origin, section);
        else if (!strcmp(key, "model"))
            continue; /* which model it was fitted for: informative */
        else if (!strcmp(key, "interleave")) {
            if (!config_parse_u64(value, &u) || u < 1 || u > UINT32_MAX)
                st = moesim_fail(err, MOESIM_EINPUT,
                                 "%s: [synth] interleave: expected a whole number >= 1, got '%s'",
                                 origin, value);
            else
                *interleave = (uint32_t)u;
        } else if (!config_parse_f64(value, &x))
            st = moesim_fail(err, MOESIM_EINPUT, "%s: [synth] %s: expected a number, got '%s'",
                             origin, key, value);
        else if (synth_knob_set(&o->knobs, key, x, err))
            moesim_error_prefix(err, "%s", origin), st = MOESIM_EINPUT;
    }
    const uint32_t T = (uint32_t)o->knobs.topics, L = m->n_moe_layers, E = m->n_experts;
    const size_t cells = (size_t)T * SYNTH_TABLE_PHASES * L * E;
    float *t = NULL;
    uint8_t *filled = NULL;
    if (!st && config_has_section(c, "popularity")) {
        t = moesim_xcalloc(cells, sizeof *t);
        filled = moesim_xcalloc(cells, 1);
    }
    for (size_t i = 0; !st && t && i < config_size(c); i++) {
        const char *section, *key, *value;
        config_entry_at(c, i, &section, &key, &value);
        if (strcmp(section, "popularity")) continue;
        char origin[512];
        config_origin(c, section, key, origin, sizeof origin);
        st = table_line(origin, key, value, t, T, L, E, filled, err);
    }
    for (size_t row = 0; !st && t && row < cells / E; row++) {
        double sum = 0;
        bool whole = true;
        for (uint32_t e = 0; e < E; e++)
            sum += t[row * E + e], whole = whole && filled[row * E + e];
        if (!whole || !(sum > 0.999 && sum < 1.001))
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: [popularity] t%zu.%s.l%zu: expected %u probabilities summing to "
                             "1 (model %s: %u layers, %u experts; %g topics)",
                             path, row / L / SYNTH_TABLE_PHASES,
                             table_phase_names[row / L % SYNTH_TABLE_PHASES], row % L, E, m->name,
                             L, E, o->knobs.topics);
    }
    free(filled);
    double *lt = NULL; /* [layers] */
    if (!st && config_has_section(c, "layers")) {
        const size_t n = (size_t)SYNTH_LAYER_KNOBS * L;
        lt = moesim_xmalloc(n * sizeof *lt);
        uint8_t *got = moesim_xcalloc(n, 1);
        for (size_t i = 0; !st && i < config_size(c); i++) {
            const char *section, *key, *value;
            config_entry_at(c, i, &section, &key, &value);
            if (strcmp(section, "layers")) continue;
            char origin[512];
            config_origin(c, section, key, origin, sizeof origin);
            st = layer_line(origin, key, value, lt, L, got, err);
        }
        for (size_t i = 0; !st && i < n; i++)
            if (!got[i])
                st = moesim_fail(err, MOESIM_EINPUT,
                                 "%s: [layers] %s.l%zu: missing (model %s: every knob at each of "
                                 "its %u MoE layers)",
                                 path, synth_layer_knob_names[i / L], i % L, m->name, L);
        free(got);
    }
    config_destroy(c);
    if (st) {
        free(lt);
        free(t);
        return st;
    }
    if (lt) {
        free(*layer_table);
        *layer_table = lt;
        o->layer_knobs = lt;
    }
    if (t) {
        free(*table);
        *table = t;
        o->popularity = t;
        o->popularity_topics = T;
    }
    return MOESIM_OK;
}
