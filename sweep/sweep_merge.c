/* Joining the results files of shards into one (sweep.h: sweep_merge). A configuration's row
 * appears once: a hash found twice across the inputs means overlapping shards (or one shard run
 * into two files) and is refused before anything is written. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/atomic_file.h"
#include "sweep/sweep.h"
#include "sweep/sweep_internal.h"

typedef struct merged_row {
    uint64_t hash;
    size_t input; /* which input */
    size_t row;   /* which row of it */
} merged_row;

static int cmp_merged(const void *a, const void *b) {
    const merged_row *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    if (x->input != y->input) return x->input < y->input ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

moesim_status sweep_merge(const char *const *inputs, size_t n_inputs, const char *out_path,
                          const sweep_experiment *e, sweep_merge_report *report,
                          moesim_error *err) {
    memset(report, 0, sizeof *report);
    if (n_inputs == 0) return moesim_fail(err, MOESIM_EINPUT, "merge: no input files");
    sweep_results *res = moesim_xcalloc(n_inputs, sizeof *res);
    char *prefix = e ? sweep_header_line(e, NULL) : NULL;
    moesim_status st = MOESIM_OK;
    size_t total = 0;
    for (size_t i = 0; i < n_inputs && !st; i++) {
        st = sweep_results_read(inputs[i], prefix, true, &res[i], err);
        if (st) break;
        if (res[i].torn) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: the last row is cut (its sweep was killed): rerun that shard to "
                             "finish it, then merge",
                             inputs[i]);
            break;
        }
        if (i > 0 && (res[i].header_len != res[0].header_len ||
                      memcmp(res[i].text, res[0].text, res[0].header_len))) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s: columns differ from those of %s", inputs[i],
                             inputs[0]);
            break;
        }
        total += res[i].n_rows;
    }
    free(prefix);
    merged_row *all = NULL;
    if (!st) {
        all = moesim_xcalloc(total + 1, sizeof *all);
        size_t k = 0;
        for (size_t i = 0; i < n_inputs; i++)
            for (size_t r = 0; r < res[i].n_rows; r++)
                all[k++] = (merged_row){res[i].rows[r].hash, i, r};
        qsort(all, total, sizeof *all, cmp_merged);
        for (size_t k2 = 1; k2 < total && !st; k2++)
            if (all[k2].hash == all[k2 - 1].hash) {
                const merged_row *a = &all[k2 - 1], *b = &all[k2];
                st = moesim_fail(err, MOESIM_EINPUT,
                                 "configuration %016" PRIx64 " has two rows: %s:%zu and %s:%zu "
                                 "(overlapping shards?); nothing written",
                                 a->hash, inputs[a->input], res[a->input].rows[a->row].line,
                                 inputs[b->input], res[b->input].rows[b->row].line);
            }
    }
    /* with an experiment: every row must be one of its configurations; order by index */
    size_t *slot_of = NULL; /* [n points] index into `all` + 1, 0: missing */
    if (!st && e) {
        size_t n = sweep_experiment_count(e);
        slot_of = moesim_xcalloc(n + 1, sizeof *slot_of);
        for (size_t k = 0; k < total && !st; k++) {
            const sweep_point *p = sweep_experiment_find(e, all[k].hash);
            if (!p) {
                const merged_row *a = &all[k];
                st = moesim_fail(err, MOESIM_EINPUT,
                                 "%s:%zu: configuration %016" PRIx64
                                 " is not one of the experiment's (another experiment, or an "
                                 "edited one?); nothing written",
                                 inputs[a->input], res[a->input].rows[a->row].line, a->hash);
                break;
            }
            slot_of[p->index] = k + 1;
        }
        report->expected = n;
        for (size_t i = 0; i < n && !st; i++)
            if (!slot_of[i]) {
                if (report->missing < sizeof report->missing_index / sizeof *report->missing_index)
                    report->missing_index[report->missing] = i;
                report->missing++;
            }
    }
    if (!st) {
        atomic_file af;
        st = atomic_file_open(&af, out_path, err);
        if (!st) {
            fwrite(res[0].text, 1, res[0].header_len, af.fp);
            size_t n = e ? sweep_experiment_count(e) : 0;
            if (e) {
                for (size_t i = 0; i < n; i++) {
                    if (!slot_of[i]) continue;
                    const merged_row *a = &all[slot_of[i] - 1];
                    const sweep_row *r = &res[a->input].rows[a->row];
                    fwrite(res[a->input].text + r->offset, 1, r->len, af.fp);
                    report->rows++;
                }
            } else {
                for (size_t i = 0; i < n_inputs; i++)
                    for (size_t r = 0; r < res[i].n_rows; r++) {
                        fwrite(res[i].text + res[i].rows[r].offset, 1, res[i].rows[r].len, af.fp);
                        report->rows++;
                    }
            }
            st = atomic_file_commit(&af, err);
        }
    }
    free(slot_of);
    free(all);
    for (size_t i = 0; i < n_inputs; i++) sweep_results_free(&res[i]);
    free(res);
    return st;
}
