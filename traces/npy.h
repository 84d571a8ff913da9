/* NumPy .npy arrays read as streams (traces/npy.c), for the array importer. Internal to
 * traces/. An array's header is read and checked first (dtype, order, shape); its values are
 * then read in order, n at a time, as 64-bit integers or floats. */
#ifndef MOESIM_TRACES_NPY_H
#define MOESIM_TRACES_NPY_H

#include <stdint.h>

#include "common/status.h"
#include "traces/zip.h"

#define NPY_MAX_DIMS 4

typedef struct npy_array {
    byte_stream s;
    char kind;         /* 'i', 'u', 'f' */
    uint32_t itemsize; /* bytes */
    uint32_t ndim;
    uint64_t shape[NPY_MAX_DIMS];
    uint64_t count; /* elements */
} npy_array;

/* Reads and checks the header (magic, version, dict) of the array on a's open stream; the
 * stream is left at the data. */
moesim_status npy_header_read(npy_array *a, moesim_error *err);
/* Reads n elements as integers (v) or floats (f); `scratch` holds n * itemsize bytes. A
 * negative integer's index goes to *neg_at (UINT64_MAX: none). */
moesim_status npy_read_values(npy_array *a, uint64_t n, int64_t *v, float *f,
                              unsigned char *scratch, uint64_t *neg_at, moesim_error *err);
/* "[3][32][8]" */
void npy_shape_text(const npy_array *a, char *out, size_t cap);
void npy_close(npy_array *a);

#endif
