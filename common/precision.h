/* Weight precisions and their storage cost. The byte size of an expert (and of each of its gate,
 * up and down matrices) at a precision is computed from the quantization-format table in
 * configs/quant.ini (bits per weight, group size, scale and zero-point bits per group), never
 * typed in. Group-wise formats group along a matrix row (the input dimension). */
#ifndef MOESIM_COMMON_PRECISION_H
#define MOESIM_COMMON_PRECISION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum moesim_precision {
    PREC_BF16 = 0,
    PREC_FP8,
    PREC_INT8,
    PREC_INT4,
    PREC_INT3,
    PREC_INT2,
    PREC_COUNT
} moesim_precision;

const char *precision_name(moesim_precision p);            /* "bf16", "int4", ... */
bool precision_from_name(const char *name, moesim_precision *out);

typedef struct quant_format {
    uint32_t weight_bits; /* bits per stored weight */
    uint32_t group_size;  /* weights sharing one scale (0: one scale per matrix row, or none) */
    uint32_t scale_bits;  /* per group */
    uint32_t zero_bits;   /* per group (asymmetric formats), 0 for symmetric / float formats */
} quant_format;

typedef struct quant_table {
    quant_format fmt[PREC_COUNT];
} quant_table;

typedef struct config config;

/* Storage layout the sizes assume (the engine's quantizers write exactly this): each matrix row
 * holds `cols` weights packed at weight_bits and padded to a whole byte, followed by
 * ceil(cols / group_size) groups' scale and zero point (group_size 0 with a scale: one group per
 * row); scale_bits and zero_bits are multiples of 8. */

/* Loads configs/quant.ini (or `path`), checking every format is present and sane. */
moesim_status quant_table_load(const char *path, quant_table *out, moesim_error *err);
moesim_status quant_table_load_default(quant_table *out, moesim_error *err);
/* Same checks on an already loaded config (which may carry --set overrides); marks the sections
 * it reads as used and leaves config_check_unused to the caller. */
moesim_status quant_table_read_config(config *c, quant_table *out, moesim_error *err);
/* Loads `path`, applies `sets` ("section.key=value", in order), reads and rejects leftovers. */
moesim_status quant_table_load_with_sets(const char *path, const char *const *sets, size_t n_sets,
                                         quant_table *out, moesim_error *err);

/* Bytes of a rows x cols matrix stored at precision p (groups run along each row). */
uint64_t quant_matrix_bytes(const quant_table *q, moesim_precision p, uint64_t rows, uint64_t cols);

/* Effective bits per weight including scales and zero points, for reports. */
double quant_bits_per_weight(const quant_table *q, moesim_precision p, uint64_t cols);

#endif
