/* Internal to traces/: what the whole-trace reader (trace_read.c) and the streaming reader
 * (trace_stream.c) share: a file being read, the datasets of the format with their expected
 * types and shapes, and the steps that open and check them before any row is read. Every failure
 * is one line naming the file and the attribute or dataset (traces/FORMAT.md). */
#ifndef MOESIM_TRACES_TRACE_READ_INTERNAL_H
#define MOESIM_TRACES_TRACE_READ_INTERNAL_H

#include <hdf5.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "traces/trace.h"

/* A file open for reading; `why` holds HDF5's reason for the last failure. */
typedef struct reader {
    const char *path;
    hid_t file;
    uint64_t file_bytes;
    char why[160];
    moesim_error *err;
} reader;

/* What a dataset must be: HDF5 type class, size and signedness, and shape. */
typedef struct dataset_spec {
    const char *name;
    H5T_class_t cls;
    size_t size;
    bool is_signed;
    const char *type_name; /* "uint16" */
    hid_t mtype;           /* native memory type */
    int rank;
    const char *shape_name; /* "[N][L][k]" */
    hsize_t dims[4];        /* dims[0] == 0: N is taken from this dataset (the first one) */
} dataset_spec;

enum {
    DS_REQUEST_ID,
    DS_POSITION,
    DS_PHASE,
    DS_TOKEN_ID,
    DS_EXPERT_IDS,
    DS_GATE_WEIGHTS,
    DS_IMPORTANCE,
    DS_LOOK_IDS,
    DS_LOOK_SCORES,
    DS_COUNT
};

/* A file whose datasets are open and checked (type, shape, storage), nothing read yet: what the
 * whole-trace reader and the stream share. */
typedef struct opened_trace {
    trace_meta meta;
    char *params_json; /* owned until handed to a trace */
    dataset_spec specs[DS_COUNT];
    hid_t ds[DS_COUNT]; /* H5I_INVALID_HID where absent */
    bool have[DS_COUNT];
    uint64_t n_tokens;
    bool has_first_hits;         /* /lookahead/expert_ids carries the attribute */
    trace_first_hits first_hits; /* its value (checked: right <= total <= N (L - 1)) */
    bool scores_ranked;          /* /lookahead/scores's attribute ranked says 1 */
} opened_trace;

/* The attributes in messages. */
#define FIRST_HITS_OBJECT "/lookahead/expert_ids attribute " TRACE_FIRST_HITS_ATTR
#define RANKED_OBJECT     "/lookahead/scores attribute " TRACE_RANKED_ATTR

/* MOESIM_EINPUT with "PATH: OBJECT: what". */
moesim_status trace_read_fail(reader *r, const char *object, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A chunk of `spec` starting at row `row` that cannot be read. */
moesim_status trace_read_chunk_fail(reader *r, const dataset_spec *spec, uint64_t row,
                                    const char *what);
/* Rows per chunk when `d` is laid out as our writer lays datasets out, else 0; *distances: D
 * when each chunk holds one distance of look-ahead rows ([N][L][D][K']), else 1; *columns:
 * K' / Kc when each holds Kc of their candidates, else 1. */
hsize_t trace_read_chunk_rows(const dataset_spec *spec, hid_t d, uint32_t *distances,
                              uint32_t *columns);
/* Before H5Dread of dataset `d`: fails for a chunk stored with a size-preserving filter skipped
 * but shorter than the chunk (HDF5 would read past it). */
moesim_status trace_read_skipped_filters_check(reader *r, const dataset_spec *spec, hid_t d);
/* The whole dataset into buf (sized for its shape). */
moesim_status trace_read_dataset(reader *r, const dataset_spec *spec, hid_t d, void *buf);
/* Opens `path` into *r (r->file open on success): plain-file checks, HDF5 signature, truncation. */
moesim_status trace_read_file_open(const char *path, hid_t fapl, reader *r, moesim_error *err);
/* Reads the attributes and opens every dataset of the format, checking type, shape and storage;
 * no row is read. trace_read_datasets_close frees it (also after a failure). */
moesim_status trace_read_datasets_open(reader *r, opened_trace *o);
void trace_read_datasets_close(opened_trace *o);
/* After every look-ahead row was counted into `rows`: fails, naming both counts, when the file's
 * first_hits attribute is present and says otherwise. */
moesim_status trace_read_first_hits_check(reader *r, const opened_trace *o,
                                          const trace_first_hits *rows);

#endif
