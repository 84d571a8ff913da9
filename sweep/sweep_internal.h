/* Pieces shared by the sweep's files (sweep/sweep_*.c): the results file as read back, and the
 * evaluators' constructors. Not for use outside sweep/sweep*. */
#ifndef MOESIM_SWEEP_SWEEP_INTERNAL_H
#define MOESIM_SWEEP_SWEEP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sweep/sweep.h"

typedef struct sweep_row {
    uint64_t hash;
    size_t offset, len; /* bytes of the line in the file text, '\n' included */
    size_t line;        /* 1-based line number */
} sweep_row;

/* A results file read whole: header, complete rows, and whether a torn last line follows. */
typedef struct sweep_results {
    char *text; /* [len + 1] the file, NUL-terminated */
    size_t len;
    size_t header_len; /* the header line, '\n' included */
    sweep_row *rows;   /* [n_rows] complete rows in file order */
    size_t n_rows;
    size_t valid_len; /* bytes up to the end of the last complete row */
    bool torn;        /* bytes after valid_len: a row cut by a kill */
} sweep_results;

/* Reads `path`; its header must equal want_header (or start with it up to a column boundary when
 * header_prefix; NULL: any header). Rows must have the header's field count and a hash. */
moesim_status sweep_results_read(const char *path, const char *want_header, bool header_prefix,
                                 sweep_results *out, moesim_error *err);
void sweep_results_free(sweep_results *r);

/* "config_hash,seed,status,<columns>[,<metrics>]\n" (ev NULL: no metrics). Caller frees. */
char *sweep_header_line(const sweep_experiment *e, const sweep_evaluator *ev);
/* 16 lowercase hex digits. */
bool sweep_parse_hash(const char *s, size_t len, uint64_t *out);

moesim_status sweep_eval_stats_create(const sweep_experiment *e, sweep_evaluator *out,
                                      moesim_error *err);
moesim_status sweep_eval_sim_create(const sweep_experiment *e, sweep_evaluator *out,
                                    moesim_error *err);

#endif
