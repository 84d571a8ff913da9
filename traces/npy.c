/* The .npy reader (traces/npy.h): format versions 1-3, C order, little-endian or single-byte
 * integers (i1 i2 i4 i8 u1 u2 u4 u8) and floats (f2 f4 f8), read through a byte stream (a file
 * or a zip member, traces/zip.h) a few values at a time. */
#include "traces/npy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

#define NPY_MAX_HEADER (1u << 20) /* numpy's own headers are < 64 KiB */

void npy_close(npy_array *a) { byte_stream_close(&a->s); }

/* numpy's header dict, as np.save writes it: "{'descr': '<f4', 'fortran_order': False,
 * 'shape': (3, 4), }" then spaces and a newline. Each of the three keys once, no other key,
 * nothing after the dict: what np.load would refuse or read otherwise is refused here. */
typedef struct npy_dict {
    const char *descr, *fortran_order, *shape; /* where each value starts */
} npy_dict;

static const char *skip_spaces(const char *p) {
    while (*p == ' ') p++;
    return p;
}

/* Past a value: a quoted string, a (tuple), or a bare word (True, False). NULL: malformed. */
static const char *skip_value(const char *p) {
    if (*p == '\'') {
        const char *q = strchr(p + 1, '\'');
        return q ? q + 1 : NULL;
    }
    if (*p == '(') {
        const char *q = strchr(p, ')');
        return q ? q + 1 : NULL;
    }
    while ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z')) p++;
    return p;
}

static const char *dict_parse(const char *h, npy_dict *d) {
    memset(d, 0, sizeof *d);
    const char *p = skip_spaces(h);
    if (*p++ != '{') return "not a dict";
    for (;;) {
        p = skip_spaces(p);
        if (*p == '}') break;
        const char **slot = !strncmp(p, "'descr'", 7)            ? &d->descr
                            : !strncmp(p, "'fortran_order'", 15) ? &d->fortran_order
                            : !strncmp(p, "'shape'", 7)          ? &d->shape
                                                                 : NULL;
        if (!slot) return "a key other than 'descr', 'fortran_order' and 'shape'";
        if (*slot) return "a key given twice";
        p = skip_spaces(strchr(p + 1, '\'') + 1);
        if (*p++ != ':') return "a key without ':'";
        *slot = p = skip_spaces(p);
        if (!(p = skip_value(p))) return "an unterminated value";
        p = skip_spaces(p);
        if (*p == ',')
            p++;
        else if (*p != '}')
            return "text after a value";
    }
    for (p++; *p == ' ' || *p == '\n'; p++) {
    }
    if (*p) return "text after the dict";
    return NULL;
}

/* Reads and checks the header (magic, version, dict); the stream is left at the data. */
moesim_status npy_header_read(npy_array *a, moesim_error *err) {
    byte_stream *s = &a->s;
    unsigned char pre[12];
    moesim_status st = byte_stream_read(s, pre, 8, err);
    if (st) return st;
    if (memcmp(pre, "\x93NUMPY", 6))
        return byte_stream_fail(s, err, "not a .npy array (no \\x93NUMPY magic)");
    uint32_t hlen;
    if (pre[6] == 1) {
        if ((st = byte_stream_read(s, pre + 8, 2, err))) return st;
        hlen = zip_le16(pre + 8);
    } else if (pre[6] == 2 || pre[6] == 3) {
        if ((st = byte_stream_read(s, pre + 8, 4, err))) return st;
        hlen = zip_le32(pre + 8);
    } else {
        return byte_stream_fail(s, err, ".npy format version %u, expected 1, 2 or 3", pre[6]);
    }
    if (hlen > NPY_MAX_HEADER)
        return byte_stream_fail(s, err, "header of %" PRIu32 " bytes, expected at most %u", hlen,
                                NPY_MAX_HEADER);
    char *h = moesim_xmalloc(hlen + 1);
    if ((st = byte_stream_read(s, h, hlen, err))) {
        free(h);
        return st;
    }
    h[hlen] = '\0';
    if (strlen(h) != hlen) {
        free(h);
        return byte_stream_fail(s, err, "header holds a NUL byte");
    }
    npy_dict dict;
    const char *bad = dict_parse(h, &dict);
    if (bad) {
        free(h);
        return byte_stream_fail(s, err, "header: %s (expected what np.save writes)", bad);
    }
    const char *d = dict.descr, *fo = dict.fortran_order, *sh = dict.shape;
    if (!d || !fo || !sh) {
        free(h);
        return byte_stream_fail(s, err, "header lacks %s",
                                !d    ? "'descr'"
                                : !fo ? "'fortran_order'"
                                      : "'shape'");
    }
    char endian = 0, kind = 0;
    unsigned size = 0;
    int used = 0;
    if (sscanf(d, "'%c%c%u'%n", &endian, &kind, &size, &used) != 3 || !used ||
        !strchr("<|=", endian) || !strchr("iuf", kind) ||
        !(size == 1 || size == 2 || size == 4 || size == 8) || (kind == 'f' && size == 1) ||
        (endian == '|' && size != 1)) {
        char shown[24];
        snprintf(shown, sizeof shown, "%.16s", d);
        char *q = strchr(shown, ',');
        if (q) *q = '\0';
        free(h);
        return byte_stream_fail(
            s, err,
            "dtype %s: expected a little-endian integer (i1..i8, u1..u8) or float "
            "(f2, f4, f8)",
            shown);
    }
    if (strncmp(fo, "False", 5) || skip_value(fo) != fo + 5) {
        free(h);
        return byte_stream_fail(
            s, err,
            "fortran_order is not False: expected C order (np.ascontiguousarray before "
            "saving)");
    }
    a->kind = kind;
    a->itemsize = size;
    a->ndim = 0;
    a->count = 1;
    const char *p = sh;
    if (*p++ != '(') {
        free(h);
        return byte_stream_fail(s, err, "'shape' is not a tuple");
    }
    for (;;) {
        while (*p == ' ') p++;
        if (*p == ')') break;
        char *e;
        errno = 0;
        unsigned long long v = *p >= '0' && *p <= '9' ? strtoull(p, &e, 10) : (e = (char *)p, 0);
        if (e == p || errno || a->ndim == NPY_MAX_DIMS) {
            free(h);
            return byte_stream_fail(s, err, "'shape': expected at most %d non-negative integers",
                                    NPY_MAX_DIMS);
        }
        a->shape[a->ndim++] = v;
        a->count = v && a->count > UINT64_MAX / v ? UINT64_MAX : a->count * v;
        p = e;
        while (*p == ' ') p++;
        if (*p == ',') p++;
    }
    free(h);
    if (a->count == UINT64_MAX || a->count > s->left / a->itemsize ||
        a->count * a->itemsize != s->left)
        return byte_stream_fail(s, err,
                                "%" PRIu64 " data bytes for %" PRIu64 " elements of %" PRIu32
                                " bytes: truncated or trailing data",
                                s->left, a->count, a->itemsize);
    return MOESIM_OK;
}

/* "[3][32][8]" */
void npy_shape_text(const npy_array *a, char *out, size_t cap) {
    size_t n = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < a->ndim && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "[%" PRIu64 "]", a->shape[i]);
    if (!a->ndim) snprintf(out, cap, "[] (a scalar)");
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | man << 13; /* inf or NaN */
    } else if (exp) {
        bits = sign | (exp + 112) << 23 | man << 13;
    } else if (man) { /* subnormal: normalize */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3FF) << 13;
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Reads n elements as integers (v) or floats (f); an integer array given for floats is an
 * error and so is a negative integer (*neg_at = its index). */
moesim_status npy_read_values(npy_array *a, uint64_t n, int64_t *v, float *f,
                              unsigned char *scratch, uint64_t *neg_at, moesim_error *err) {
    moesim_status st = byte_stream_read(&a->s, scratch, n * a->itemsize, err);
    if (st) return st;
    *neg_at = UINT64_MAX;
    for (uint64_t i = 0; i < n; i++) {
        const unsigned char *p = scratch + i * a->itemsize;
        if (f) {
            if (a->itemsize == 2) {
                f[i] = half_to_float(zip_le16(p));
            } else if (a->itemsize == 4) {
                uint32_t b = zip_le32(p);
                memcpy(&f[i], &b, 4);
            } else {
                uint64_t b = zip_le64(p);
                double d;
                memcpy(&d, &b, 8);
                f[i] = (float)d;
            }
            continue;
        }
        int64_t x;
        switch (a->itemsize) {
        case 1:
            x = a->kind == 'i' ? (int8_t)p[0] : p[0];
            break;
        case 2:
            x = a->kind == 'i' ? (int16_t)zip_le16(p) : zip_le16(p);
            break;
        case 4:
            x = a->kind == 'i' ? (int32_t)zip_le32(p) : (int64_t)zip_le32(p);
            break;
        default:
            x = (int64_t)zip_le64(p); /* u8 beyond INT64_MAX reads negative: refused below */
        }
        if (x < 0 && *neg_at == UINT64_MAX) *neg_at = i;
        v[i] = x;
    }
    return MOESIM_OK;
}
