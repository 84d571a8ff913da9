/* Quantization-format table (configs/quant.ini) and the byte size of a matrix at a precision.
 *
 * Units: bits in the table, bytes out of quant_matrix_bytes. Layout (see precision.h): per row,
 * ceil(cols * weight_bits / 8) bytes of packed weights, then (scale_bits + zero_bits) / 8 bytes
 * per group of group_size weights (the last group of a row may be short). Invariants checked at
 * load: every precision has its section, weight_bits matches the precision's name, scale and zero
 * bits are whole bytes, a zero point never comes without a scale, a group size never comes
 * without a scale. */
#include "common/precision.h"

#include <stdio.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/paths.h"

static const char *const precision_names[PREC_COUNT] = {
    [PREC_BF16] = "bf16", [PREC_FP8] = "fp8",   [PREC_INT8] = "int8",
    [PREC_INT4] = "int4", [PREC_INT3] = "int3", [PREC_INT2] = "int2",
};

/* bits per stored weight each precision's name implies */
static const uint32_t precision_bits[PREC_COUNT] = {
    [PREC_BF16] = 16, [PREC_FP8] = 8,  [PREC_INT8] = 8,
    [PREC_INT4] = 4,  [PREC_INT3] = 3, [PREC_INT2] = 2,
};

const char *precision_name(moesim_precision p) {
    MOESIM_ASSERT(p >= 0 && p < PREC_COUNT);
    return precision_names[p];
}

bool precision_from_name(const char *name, moesim_precision *out) {
    for (int p = 0; p < PREC_COUNT; p++) {
        if (!strcmp(name, precision_names[p])) {
            *out = (moesim_precision)p;
            return true;
        }
    }
    return false;
}

/* ---- loading ---------------------------------------------------------------------------- */

#define QUANT_MAX_GROUP 65536u /* larger groups are not a quantization format anyone uses */

static moesim_status read_format(config *c, moesim_precision p, quant_format *out,
                                 moesim_error *err) {
    const char *sec = precision_names[p];
    double bits = precision_bits[p];
    const config_field fields[] = {
        {sec, "weight_bits", CONFIG_U32, offsetof(quant_format, weight_bits), 0, true, bits, bits,
         NULL, NULL, "bits per stored weight (fixed by the precision's name)"},
        {sec, "group_size", CONFIG_U32, offsetof(quant_format, group_size), 0, true, 0,
         QUANT_MAX_GROUP, NULL, NULL, "weights along a row sharing one scale (0: one per row)"},
        {sec, "scale_bits", CONFIG_U32, offsetof(quant_format, scale_bits), 0, true, 0, 32, NULL,
         NULL, "bits of each group's scale"},
        {sec, "zero_bits", CONFIG_U32, offsetof(quant_format, zero_bits), 0, true, 0, 32, NULL,
         NULL, "bits of each group's zero point (0: symmetric)"},
    };
    moesim_status st = config_read_fields(c, fields, MOESIM_ARRAY_LEN(fields), out, err);
    if (st) return st;
    char where[600];
    if (out->scale_bits % 8) {
        config_origin(c, sec, "scale_bits", where, sizeof where);
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [%s] scale_bits: expected a multiple of 8 "
                           "(scales are stored as whole bytes), got %u",
                           where, sec, out->scale_bits);
    }
    if (out->zero_bits % 8) {
        config_origin(c, sec, "zero_bits", where, sizeof where);
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [%s] zero_bits: expected a multiple of 8 "
                           "(zero points are stored as whole bytes), got %u",
                           where, sec, out->zero_bits);
    }
    if (out->weight_bits < 8 && !out->scale_bits) {
        config_origin(c, sec, "scale_bits", where, sizeof where);
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [%s] scale_bits: a %u-bit integer format "
                           "needs a scale, got 0",
                           where, sec, out->weight_bits);
    }
    if (out->zero_bits && !out->scale_bits) {
        config_origin(c, sec, "zero_bits", where, sizeof where);
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [%s] zero_bits: a zero point needs a scale "
                           "(scale_bits is 0)",
                           where, sec);
    }
    if (out->group_size && !out->scale_bits) {
        config_origin(c, sec, "group_size", where, sizeof where);
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: [%s] group_size: groups need a scale "
                           "(scale_bits is 0); use group_size = 0 for an unscaled format",
                           where, sec);
    }
    return MOESIM_OK;
}

moesim_status quant_table_read_config(config *c, quant_table *out, moesim_error *err) {
    quant_table t;
    memset(&t, 0, sizeof t);
    for (int p = 0; p < PREC_COUNT; p++) {
        moesim_status st = read_format(c, (moesim_precision)p, &t.fmt[p], err);
        if (st) return st;
    }
    *out = t;
    return MOESIM_OK;
}

moesim_status quant_table_load_with_sets(const char *path, const char *const *sets, size_t n_sets,
                                         quant_table *out, moesim_error *err) {
    config *c = config_create();
    moesim_status st = config_load_file(c, path, err);
    for (size_t i = 0; !st && i < n_sets; i++) st = config_set(c, sets[i], err);
    if (!st) st = quant_table_read_config(c, out, err);
    if (!st) st = config_check_unused(c, err);
    config_destroy(c);
    return st;
}

moesim_status quant_table_load(const char *path, quant_table *out, moesim_error *err) {
    return quant_table_load_with_sets(path, NULL, 0, out, err);
}

moesim_status quant_table_load_default(quant_table *out, moesim_error *err) {
    char path[4096];
    moesim_status st =
        moesim_data_find("configs/quant.ini", "quantization table", path, sizeof path, err);
    return st ? st : quant_table_load(path, out, err);
}

/* ---- sizes ------------------------------------------------------------------------------ */

static uint64_t groups_per_row(const quant_format *f, uint64_t cols) {
    if (!f->scale_bits) return 0;
    if (!f->group_size) return 1;
    return (cols + f->group_size - 1) / f->group_size;
}

static uint64_t row_bytes(const quant_format *f, uint64_t cols) {
    uint64_t weights = (cols * f->weight_bits + 7) / 8;
    return weights + groups_per_row(f, cols) * ((f->scale_bits + f->zero_bits) / 8);
}

uint64_t quant_matrix_bytes(const quant_table *q, moesim_precision p, uint64_t rows,
                            uint64_t cols) {
    MOESIM_ASSERT(p >= 0 && p < PREC_COUNT);
    return rows * row_bytes(&q->fmt[p], cols);
}

double quant_bits_per_weight(const quant_table *q, moesim_precision p, uint64_t cols) {
    MOESIM_ASSERT(p >= 0 && p < PREC_COUNT && cols > 0);
    return 8.0 * (double)row_bytes(&q->fmt[p], cols) / (double)cols;
}
