/* Dense NumPy arrays for `moesim trace import`: ids and gate weights of shape
 * [tokens][layers][top_k], as research code dumps them (np.save / np.savez /
 * np.savez_compressed), one token at a time into import_place (traces/import_internal.h).
 *
 * Inputs (traces/FORMAT.md, "Dense arrays"):
 *   --format npy IDS.npy --weights W.npy [--requests SIDE.csv]
 *   --format npy LOGITS.npy [--requests SIDE.csv]: router logits [tokens][layers][experts]
 *   --format npz ROUTES.npz [--requests SIDE.csv]: members topk_ids (or routed_experts) with
 *     topk_weights, or router_logits; optionally request_id [tokens] or seq_lens [requests],
 *     prompt_lens [requests].
 * Ids without weights (SGLang's routed_experts, Megatron's routing indices) import with
 * --uniform-gates (gate 1/k each). Router logits (HF output_router_logits, stacked per token)
 * give the top-k and the gates by the model's rule: softmax over the k chosen logits, or over
 * all E with the top-k kept.
 * Request boundaries come from the request_id column (any integer per token; requests
 * numbered by first appearance), seq_lens (consecutive blocks), the side file (consecutive
 * blocks, named), or else the whole array is one request. A request's positions count its
 * tokens in array order from 0. Prompt lengths (prompt_lens, or the side file's
 * prompt_tokens) give the phases.
 *
 * The .npy reader takes format versions 1-3, C order, little-endian or single-byte integers
 * (i1 i2 i4 i8 u1 u2 u4 u8) and floats (f2 f4 f8). The .npz reader is our own: the zip central
 * directory (zip64 too: numpy writes members with zip64 extras), stored members read in place,
 * deflated members inflated by zlib as a stream, CRC-32 checked at each member's end. Arrays
 * are streamed, never loaded whole (bar seq_lens and prompt_lens), so memory follows the trace,
 * not the files. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/import_internal.h"
#include "traces/text_scan.h"

#define NPY_MAX_DIMS     4
#define NPY_MAX_HEADER   (1u << 20) /* numpy's own headers are < 64 KiB */
#define STREAM_BUF_BYTES (1u << 16)
#define ZIP_MAX_MEMBERS  4096
#define ZIP_EOCD_BYTES   22
#define ZIP_EOCD_SEARCH  (ZIP_EOCD_BYTES + 65535) /* the comment is at most 64 KiB */
#define SIDE_NAME_MAX    IMPORT_REQUEST_PART_MAX

/* ---- byte streams: a plain file, or a stored or deflated zip member ----------------------- */

typedef struct byte_stream {
    FILE *fp;
    char name[512]; /* "ids.npy" or "routes.npz: topk_ids.npy", for messages */
    bool deflated;
    bool zinit;
    z_stream z;
    uint64_t comp_left; /* deflated: compressed bytes not yet read from fp */
    uint64_t left;      /* member bytes not yet delivered (uncompressed) */
    bool in_zip;
    uint32_t crc, want_crc;
    unsigned char *in; /* [STREAM_BUF_BYTES] compressed input */
} byte_stream;

static void stream_close(byte_stream *s) {
    if (s->zinit) inflateEnd(&s->z);
    if (s->fp) fclose(s->fp);
    free(s->in);
    memset(s, 0, sizeof *s);
}

static moesim_status stream_fail(const byte_stream *s, moesim_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static moesim_status stream_fail(const byte_stream *s, moesim_error *err, const char *fmt, ...) {
    char msg[MOESIM_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return moesim_fail(err, MOESIM_EINPUT, "%s: %s", s->name, msg);
}

/* Exactly n bytes into buf, or a message naming the stream. */
static moesim_status stream_read(byte_stream *s, void *buf, size_t n, moesim_error *err) {
    if (n > s->left)
        return stream_fail(s, err, "truncated: %" PRIu64 " bytes left, %zu needed", s->left, n);
    if (!s->deflated) {
        if (fread(buf, 1, n, s->fp) != n)
            return ferror(s->fp) ? moesim_fail(err, MOESIM_EIO, "%s: read error: %s", s->name,
                                               strerror(errno))
                                 : stream_fail(s, err, "truncated file");
    } else {
        s->z.next_out = buf;
        s->z.avail_out = (uInt)n;
        while (s->z.avail_out) {
            if (!s->z.avail_in && s->comp_left) {
                size_t want = s->comp_left < STREAM_BUF_BYTES ? s->comp_left : STREAM_BUF_BYTES;
                size_t got = fread(s->in, 1, want, s->fp);
                if (got != want) return stream_fail(s, err, "truncated zip member");
                s->comp_left -= got;
                s->z.next_in = s->in;
                s->z.avail_in = (uInt)got;
            }
            int zr = inflate(&s->z, Z_NO_FLUSH);
            if (zr == Z_STREAM_END && s->z.avail_out)
                return stream_fail(s, err, "deflate stream ends early");
            if (zr != Z_OK && zr != Z_STREAM_END)
                return stream_fail(s, err, "corrupt deflate data (%s)",
                                   s->z.msg ? s->z.msg : "zlib error");
            if (zr == Z_OK && !s->z.avail_in && !s->comp_left && s->z.avail_out)
                return stream_fail(s, err, "truncated deflate data");
        }
    }
    s->left -= n;
    if (s->in_zip) {
        s->crc = (uint32_t)crc32(s->crc, buf, (uInt)n);
        if (!s->left && s->crc != s->want_crc)
            return stream_fail(s, err,
                               "CRC-32 %08" PRIx32 ", the zip directory says %08" PRIx32
                               " (corrupt member)",
                               s->crc, s->want_crc);
    }
    return MOESIM_OK;
}

static moesim_status stream_open_file(byte_stream *s, const char *path, moesim_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", path);
    s->fp = fopen(path, "rb");
    if (!s->fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (fseeko(s->fp, 0, SEEK_END) != 0) {
        stream_close(s);
        return moesim_fail(err, MOESIM_EIO, "%s: cannot seek", path);
    }
    s->left = (uint64_t)ftello(s->fp);
    rewind(s->fp);
    return MOESIM_OK;
}

/* ---- zip (.npz) ---------------------------------------------------------------------------- */

typedef struct zip_member {
    char name[256];
    uint16_t method, flags;
    uint32_t crc;
    uint64_t comp_size, size, local_offset;
} zip_member;

static uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const unsigned char *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

static moesim_status read_at(FILE *fp, uint64_t off, void *buf, size_t n, const char *path,
                             const char *what, moesim_error *err) {
    if (fseeko(fp, (off_t)off, SEEK_SET) != 0 || fread(buf, 1, n, fp) != n)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: %s: truncated zip (%zu bytes at offset %" PRIu64 ")", path, what, n,
                           off);
    return MOESIM_OK;
}

/* The central directory of the zip at `path`: *members (caller frees), *n. */
static moesim_status zip_directory(const char *path, zip_member **members, uint32_t *n,
                                   moesim_error *err) {
    *members = NULL;
    *n = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    moesim_status st = MOESIM_OK;
    unsigned char *tail = NULL, *cd = NULL;
    fseeko(fp, 0, SEEK_END);
    uint64_t size = (uint64_t)ftello(fp);
    uint64_t span = size < ZIP_EOCD_SEARCH ? size : ZIP_EOCD_SEARCH;
    tail = moesim_xmalloc(span + 1);
    if ((st = read_at(fp, size - span, tail, span, path, "end of central directory", err)))
        goto out;
    int64_t eocd = -1;
    for (int64_t i = (int64_t)span - ZIP_EOCD_BYTES; i >= 0 && eocd < 0; i--)
        if (le32(tail + i) == 0x06054b50) eocd = i;
    if (eocd < 0) {
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: not a zip file (no end of central directory record): expected an "
                         ".npz as np.savez writes it",
                         path);
        goto out;
    }
    uint64_t entries = le16(tail + eocd + 10), cd_size = le32(tail + eocd + 12),
             cd_off = le32(tail + eocd + 16);
    if (entries == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
        /* zip64: the locator sits just before the classic record */
        uint64_t loc = size - span + (uint64_t)eocd;
        unsigned char l[20], z[56];
        if (loc < 20 || (st = read_at(fp, loc - 20, l, 20, path, "zip64 locator", err))) {
            if (!st) st = moesim_fail(err, MOESIM_EINPUT, "%s: zip64 locator missing", path);
            goto out;
        }
        if (le32(l) != 0x07064b50) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s: zip64 locator missing", path);
            goto out;
        }
        if ((st = read_at(fp, le64(l + 8), z, 56, path, "zip64 end of central directory", err)))
            goto out;
        if (le32(z) != 0x06064b50) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s: bad zip64 end of central directory", path);
            goto out;
        }
        entries = le64(z + 32);
        cd_size = le64(z + 40);
        cd_off = le64(z + 48);
    }
    if (entries > ZIP_MAX_MEMBERS || cd_size > size || cd_off > size - cd_size) {
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: zip directory of %" PRIu64 " entries, %" PRIu64 " bytes at %" PRIu64
                         " does not fit a %" PRIu64 "-byte file (at most %d members)",
                         path, entries, cd_size, cd_off, size, ZIP_MAX_MEMBERS);
        goto out;
    }
    cd = moesim_xmalloc(cd_size + 1);
    if ((st = read_at(fp, cd_off, cd, cd_size, path, "central directory", err))) goto out;
    zip_member *m = moesim_xcalloc(entries ? entries : 1, sizeof *m);
    *members = m;
    uint64_t p = 0;
    for (uint64_t i = 0; i < entries; i++) {
        if (p + 46 > cd_size || le32(cd + p) != 0x02014b50) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: central directory entry %" PRIu64 " is malformed", path, i);
            goto out;
        }
        const unsigned char *e = cd + p;
        uint32_t nlen = le16(e + 28), xlen = le16(e + 30), clen = le16(e + 32);
        if (p + 46 + nlen + xlen + clen > cd_size) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: central directory entry %" PRIu64 " runs past the directory",
                             path, i);
            goto out;
        }
        zip_member *z = &m[i];
        z->flags = le16(e + 8);
        z->method = le16(e + 10);
        z->crc = le32(e + 16);
        z->comp_size = le32(e + 20);
        z->size = le32(e + 24);
        z->local_offset = le32(e + 42);
        snprintf(z->name, sizeof z->name, "%.*s", (int)(nlen < 255 ? nlen : 255),
                 (const char *)e + 46);
        /* zip64 extra: the 64-bit values of the fields saturated above, in this order */
        for (const unsigned char *x = e + 46 + nlen, *xe = x + xlen; x + 4 <= xe;) {
            uint16_t id = le16(x), len = le16(x + 2);
            const unsigned char *d = x + 4, *de = d + len;
            if (de > xe) break;
            if (id == 0x0001) {
                if (z->size == 0xFFFFFFFFu && d + 8 <= de) z->size = le64(d), d += 8;
                if (z->comp_size == 0xFFFFFFFFu && d + 8 <= de) z->comp_size = le64(d), d += 8;
                if (z->local_offset == 0xFFFFFFFFu && d + 8 <= de) z->local_offset = le64(d);
            }
            x = de;
        }
        p += 46 + nlen + xlen + clen;
    }
    *n = (uint32_t)entries;
out:
    free(tail);
    free(cd);
    fclose(fp);
    if (st) {
        free(*members);
        *members = NULL;
    }
    return st;
}

static moesim_status stream_open_member(byte_stream *s, const char *path, const zip_member *z,
                                        moesim_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s: %s", path, z->name);
    if (z->flags & 1) return stream_fail(s, err, "encrypted zip member");
    if (z->method != 0 && z->method != 8)
        return stream_fail(s, err,
                           "compression method %u, expected stored (np.savez) or deflated "
                           "(np.savez_compressed)",
                           z->method);
    s->fp = fopen(path, "rb");
    if (!s->fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char h[30];
    moesim_status st = read_at(s->fp, z->local_offset, h, 30, path, z->name, err);
    if (!st && le32(h) != 0x04034b50)
        st = stream_fail(s, err, "local header missing at offset %" PRIu64, z->local_offset);
    if (st) {
        stream_close(s);
        return st;
    }
    /* sizes a corrupt directory could inflate: deflate expands at most ~1032:1 */
    uint64_t file_size = 0;
    if (fseeko(s->fp, 0, SEEK_END) == 0) file_size = (uint64_t)ftello(s->fp);
    if (fseeko(s->fp, (off_t)(z->local_offset + 30 + le16(h + 26) + le16(h + 28)), SEEK_SET) != 0 ||
        z->comp_size > file_size || (z->method == 0 && z->size != z->comp_size) ||
        (z->method == 8 && z->size / 1032 > z->comp_size + 1)) {
        st = stream_fail(s, err,
                         "%" PRIu64 " bytes from %" PRIu64 " stored: sizes that do not fit the "
                         "file or the compression (corrupt zip directory)",
                         z->size, z->comp_size);
        stream_close(s);
        return st;
    }
    s->in_zip = true;
    s->want_crc = z->crc;
    s->crc = (uint32_t)crc32(0, NULL, 0);
    s->left = z->size;
    if (z->method == 8) {
        s->deflated = true;
        s->comp_left = z->comp_size;
        s->in = moesim_xmalloc(STREAM_BUF_BYTES);
        if (inflateInit2(&s->z, -MAX_WBITS) != Z_OK) { /* raw deflate, as zip stores it */
            stream_close(s);
            return moesim_fail(err, MOESIM_ENOMEM, "%s: zlib: cannot start inflating", path);
        }
        s->zinit = true;
    }
    return MOESIM_OK;
}

/* ---- .npy ---------------------------------------------------------------------------------- */

typedef struct npy_array {
    byte_stream s;
    char kind;         /* 'i', 'u', 'f' */
    uint32_t itemsize; /* bytes */
    uint32_t ndim;
    uint64_t shape[NPY_MAX_DIMS];
    uint64_t count; /* elements */
} npy_array;

static void npy_close(npy_array *a) { stream_close(&a->s); }

/* The value of 'key' in numpy's header dict text, [*v, end). */
static const char *dict_value(const char *h, const char *key) {
    const char *p = strstr(h, key);
    if (!p) return NULL;
    p += strlen(key);
    while (*p == ' ') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

/* Reads and checks the header (magic, version, dict); the stream is left at the data. */
static moesim_status npy_header(npy_array *a, moesim_error *err) {
    byte_stream *s = &a->s;
    unsigned char pre[12];
    moesim_status st = stream_read(s, pre, 8, err);
    if (st) return st;
    if (memcmp(pre, "\x93NUMPY", 6))
        return stream_fail(s, err, "not a .npy array (no \\x93NUMPY magic)");
    uint32_t hlen;
    if (pre[6] == 1) {
        if ((st = stream_read(s, pre + 8, 2, err))) return st;
        hlen = le16(pre + 8);
    } else if (pre[6] == 2 || pre[6] == 3) {
        if ((st = stream_read(s, pre + 8, 4, err))) return st;
        hlen = le32(pre + 8);
    } else {
        return stream_fail(s, err, ".npy format version %u, expected 1, 2 or 3", pre[6]);
    }
    if (hlen > NPY_MAX_HEADER)
        return stream_fail(s, err, "header of %" PRIu32 " bytes, expected at most %u", hlen,
                           NPY_MAX_HEADER);
    char *h = moesim_xmalloc(hlen + 1);
    if ((st = stream_read(s, h, hlen, err))) {
        free(h);
        return st;
    }
    h[hlen] = '\0';
    if (strlen(h) != hlen) {
        free(h);
        return stream_fail(s, err, "header holds a NUL byte");
    }
    const char *d = dict_value(h, "'descr'"), *fo = dict_value(h, "'fortran_order'"),
               *sh = dict_value(h, "'shape'");
    if (!d || !fo || !sh) {
        free(h);
        return stream_fail(s, err, "header lacks %s",
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
        return stream_fail(s, err,
                           "dtype %s: expected a little-endian integer (i1..i8, u1..u8) or float "
                           "(f2, f4, f8)",
                           shown);
    }
    if (strncmp(fo, "False", 5)) {
        free(h);
        return stream_fail(s, err,
                           "fortran_order is True: expected C order (np.ascontiguousarray before "
                           "saving)");
    }
    a->kind = kind;
    a->itemsize = size;
    a->ndim = 0;
    a->count = 1;
    const char *p = sh;
    if (*p++ != '(') {
        free(h);
        return stream_fail(s, err, "'shape' is not a tuple");
    }
    for (;;) {
        while (*p == ' ') p++;
        if (*p == ')') break;
        char *e;
        errno = 0;
        unsigned long long v = strtoull(p, &e, 10);
        if (e == p || errno || a->ndim == NPY_MAX_DIMS) {
            free(h);
            return stream_fail(s, err, "'shape': expected at most %d non-negative integers",
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
        return stream_fail(s, err,
                           "%" PRIu64 " data bytes for %" PRIu64 " elements of %" PRIu32
                           " bytes: truncated or trailing data",
                           s->left, a->count, a->itemsize);
    return MOESIM_OK;
}

/* "[3][32][8]" */
static void shape_text(const npy_array *a, char *out, size_t cap) {
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
static moesim_status npy_read_values(npy_array *a, uint64_t n, int64_t *v, float *f,
                                     unsigned char *scratch, uint64_t *neg_at, moesim_error *err) {
    moesim_status st = stream_read(&a->s, scratch, n * a->itemsize, err);
    if (st) return st;
    *neg_at = UINT64_MAX;
    for (uint64_t i = 0; i < n; i++) {
        const unsigned char *p = scratch + i * a->itemsize;
        if (f) {
            if (a->itemsize == 2) {
                f[i] = half_to_float(le16(p));
            } else if (a->itemsize == 4) {
                uint32_t b = le32(p);
                memcpy(&f[i], &b, 4);
            } else {
                uint64_t b = le64(p);
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
            x = a->kind == 'i' ? (int16_t)le16(p) : le16(p);
            break;
        case 4:
            x = a->kind == 'i' ? (int32_t)le32(p) : (int64_t)le32(p);
            break;
        default:
            x = (int64_t)le64(p); /* u8 beyond INT64_MAX reads negative: refused below */
        }
        if (x < 0 && *neg_at == UINT64_MAX) *neg_at = i;
        v[i] = x;
    }
    return MOESIM_OK;
}

/* ---- the array source ---------------------------------------------------------------------- */

typedef struct side_request {
    char name[SIDE_NAME_MAX];
    size_t name_len;
    uint64_t tokens;
    int64_t prompt; /* -1: not given */
} side_request;

/* The --requests side file: CSV "request,tokens[,prompt_tokens]", one row per request. */
static moesim_status read_side_file(importer *x, side_request **out, uint64_t *n) {
    const char *path = x->o->requests_path;
    *out = NULL;
    *n = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return moesim_fail(x->err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    side_request *rq = NULL;
    uint64_t cap = 0, count = 0, line_no = 0;
    bool with_prompt = false;
    char line[1024];
    moesim_status st = MOESIM_OK;
    while (!st && fgets(line, sizeof line, fp)) {
        line_no++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            st = moesim_fail(x->err, MOESIM_EINPUT, "%s:%" PRIu64 ": row: longer than %zu bytes",
                             path, line_no, sizeof line - 2);
            break;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (line_no == 1) {
            if (!strcmp(line, "request,tokens,prompt_tokens"))
                with_prompt = true;
            else if (strcmp(line, "request,tokens"))
                st = moesim_fail(x->err, MOESIM_EINPUT,
                                 "%s:1: header: expected 'request,tokens' or "
                                 "'request,tokens,prompt_tokens'",
                                 path);
            continue;
        }
        if (!len) continue;
        char *c1 = strchr(line, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
        if (!c1 || (with_prompt != (c2 != NULL)) || (c2 && strchr(c2 + 1, ','))) {
            st = moesim_fail(x->err, MOESIM_EINPUT, "%s:%" PRIu64 ": row: expected %d columns",
                             path, line_no, with_prompt ? 3 : 2);
            break;
        }
        if (count == cap) {
            cap = cap ? 2 * cap : 64;
            rq = moesim_xrealloc(rq, cap * sizeof *rq);
        }
        side_request *q = &rq[count];
        q->name_len = (size_t)(c1 - line);
        if (q->name_len == 0 || q->name_len > SIDE_NAME_MAX) {
            st = moesim_fail(x->err, MOESIM_EINPUT, "%s:%" PRIu64 ": request: expected 1..%d bytes",
                             path, line_no, SIDE_NAME_MAX);
            break;
        }
        memcpy(q->name, line, q->name_len);
        uint64_t v;
        const char *te = c2 ? c2 : line + len;
        text_scan s = {c1 + 1, te, NULL};
        if (!text_scan_uint(&s, UINT32_MAX, &v) || s.p != te || v == 0) {
            st = moesim_fail(x->err, MOESIM_EINPUT, "%s:%" PRIu64 ": tokens: expected a count >= 1",
                             path, line_no);
            break;
        }
        q->tokens = v;
        q->prompt = -1;
        if (c2) {
            s = (text_scan){c2 + 1, line + len, NULL};
            if (!text_scan_uint(&s, UINT32_MAX, &v) || s.p != line + len) {
                st = moesim_fail(x->err, MOESIM_EINPUT,
                                 "%s:%" PRIu64 ": prompt_tokens: expected a count >= 0", path,
                                 line_no);
                break;
            }
            q->prompt = (int64_t)v;
        }
        count++;
    }
    if (!st && ferror(fp))
        st = moesim_fail(x->err, MOESIM_EIO, "%s: read error: %s", path, strerror(errno));
    if (!st && count == 0) st = moesim_fail(x->err, MOESIM_EINPUT, "%s: no requests", path);
    fclose(fp);
    if (st) {
        free(rq);
        return st;
    }
    *out = rq;
    *n = count;
    return MOESIM_OK;
}

/* The open arrays of one import. */
typedef struct array_set {
    npy_array ids, gates, request_id; /* request_id: optional column [T] */
    npy_array logits;                 /* router logits [T][L][E] instead of ids and gates */
    bool has_request_id, has_gates, has_logits;
    int64_t *seq_lens, *prompt_lens; /* [n_seq], [n_prompt] or NULL */
    uint64_t n_seq, n_prompt;
    side_request *side; /* [n_side] or NULL */
    uint64_t n_side;
} array_set;

static void array_set_free(array_set *a) {
    npy_close(&a->ids);
    npy_close(&a->gates);
    npy_close(&a->logits);
    npy_close(&a->request_id);
    free(a->seq_lens);
    free(a->prompt_lens);
    free(a->side);
}

static const zip_member *find_member(const zip_member *m, uint32_t n, const char *const *names) {
    for (; *names; names++) {
        char want[64];
        snprintf(want, sizeof want, "%s.npy", *names);
        for (uint32_t i = 0; i < n; i++)
            if (!strcmp(m[i].name, want)) return &m[i];
    }
    return NULL;
}

/* A whole 1-D integer member (seq_lens, prompt_lens) into *out [*n]. */
static moesim_status read_int_vector(const char *path, const zip_member *z, int64_t **out,
                                     uint64_t *n, moesim_error *err) {
    npy_array a;
    moesim_status st = stream_open_member(&a.s, path, z, err);
    if (st) return st;
    if (!(st = npy_header(&a, err))) {
        if (a.ndim != 1 || a.kind == 'f') {
            char sh[64];
            shape_text(&a, sh, sizeof sh);
            st = stream_fail(&a.s, err, "shape %s of %s: expected a 1-D integer array", sh,
                             a.kind == 'f' ? "floats" : "integers");
        } else if (a.count > (1u << 28)) {
            st = stream_fail(&a.s, err, "%" PRIu64 " entries: at most %u requests", a.count,
                             1u << 28);
        } else {
            *n = a.count;
            *out = moesim_xmalloc((a.count ? a.count : 1) * sizeof **out);
            unsigned char *scratch = moesim_xmalloc((a.count ? a.count : 1) * a.itemsize);
            uint64_t neg;
            st = npy_read_values(&a, a.count, *out, NULL, scratch, &neg, err);
            free(scratch);
            if (!st && neg != UINT64_MAX)
                st = stream_fail(&a.s, err, "[%" PRIu64 "]: %" PRId64 " is negative", neg,
                                 (*out)[neg]);
        }
    }
    npy_close(&a);
    return st;
}

static moesim_status open_npz(importer *x, array_set *a) {
    zip_member *m;
    uint32_t n;
    moesim_status st = zip_directory(x->path, &m, &n, x->err);
    if (st) return st;
    static const char *const ids_names[] = {"topk_ids", "routed_experts", NULL};
    static const char *const gate_names[] = {"topk_weights", NULL};
    static const char *const logit_names[] = {"router_logits", NULL};
    static const char *const rid_names[] = {"request_id", NULL};
    static const char *const seq_names[] = {"seq_lens", NULL};
    static const char *const prompt_names[] = {"prompt_lens", NULL};
    const zip_member *zi = find_member(m, n, ids_names), *zg = find_member(m, n, gate_names),
                     *zl = find_member(m, n, logit_names), *zr = find_member(m, n, rid_names),
                     *zs = find_member(m, n, seq_names), *zp = find_member(m, n, prompt_names);
    if (zl && (zi || zg))
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: router_logits.npy and %s.npy: two sources of routing (give one)",
                         x->path, zi ? "topk_ids" : "topk_weights");
    else if (!zl && !zi)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: topk_ids.npy: no such array (%" PRIu32 " members): expected "
                         "topk_ids (or routed_experts) [tokens][layers][top_k] with topk_weights, "
                         "or router_logits [tokens][layers][experts]",
                         x->path, n);
    else if (zi && !zg && !x->o->uniform_gates)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: topk_weights.npy: no such array: the gate weights [tokens][layers]"
                         "[top_k] (--uniform-gates gives each chosen expert 1/k instead)",
                         x->path);
    else if ((zg || zl) && x->o->uniform_gates)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: --uniform-gates: the file has %s.npy; the option is for ids without "
                         "weights",
                         x->path, zg ? "topk_weights" : "router_logits");
    if (!st && zr && zs)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: request_id.npy and seq_lens.npy: two sources of request boundaries "
                         "(give one)",
                         x->path);
    if (!st && (zr || zs) && x->o->requests_path)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: %s.npy and --requests %s: two sources of request boundaries", x->path,
                         zr ? "request_id" : "seq_lens", x->o->requests_path);
    if (!st && zp && x->o->requests_path)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: prompt_lens.npy and --requests %s: two sources of prompt lengths",
                         x->path, x->o->requests_path);
    if (!st && zl) {
        a->has_logits = true;
        st = stream_open_member(&a->logits.s, x->path, zl, x->err);
        if (!st) st = npy_header(&a->logits, x->err);
    }
    if (!st && zi) st = stream_open_member(&a->ids.s, x->path, zi, x->err);
    if (!st && zi) st = npy_header(&a->ids, x->err);
    if (!st && zg) {
        a->has_gates = true;
        st = stream_open_member(&a->gates.s, x->path, zg, x->err);
        if (!st) st = npy_header(&a->gates, x->err);
    }
    if (!st && zr) {
        a->has_request_id = true;
        st = stream_open_member(&a->request_id.s, x->path, zr, x->err);
        if (!st) st = npy_header(&a->request_id, x->err);
    }
    if (!st && zs) st = read_int_vector(x->path, zs, &a->seq_lens, &a->n_seq, x->err);
    if (!st && zp) st = read_int_vector(x->path, zp, &a->prompt_lens, &a->n_prompt, x->err);
    free(m);
    return st;
}

/* IN is the ids (integers) or the router logits (floats). */
static moesim_status open_npy(importer *x, array_set *a) {
    npy_array in;
    moesim_status st = stream_open_file(&in.s, x->path, x->err);
    if (!st) st = npy_header(&in, x->err);
    if (st) {
        npy_close(&in);
        return st;
    }
    const char *w = x->o->weights_path;
    if (in.kind == 'f') {
        a->logits = in;
        a->has_logits = true;
        if (w || x->o->uniform_gates)
            return moesim_fail(x->err, MOESIM_EINPUT,
                               "%s: floats: router logits [tokens][layers][experts], which give "
                               "the gates; %s does not apply",
                               x->path, w ? "--weights" : "--uniform-gates");
        return MOESIM_OK;
    }
    a->ids = in;
    if (!w && !x->o->uniform_gates)
        return moesim_fail(x->err, MOESIM_EINPUT,
                           "%s: --format npy needs --weights W.npy (gate weights [tokens][layers]"
                           "[top_k]), or --uniform-gates for ids without weights",
                           x->path);
    if (w && x->o->uniform_gates)
        return moesim_fail(x->err, MOESIM_EINPUT, "%s: --weights and --uniform-gates: give one",
                           x->path);
    if (!w) return MOESIM_OK;
    a->has_gates = true;
    st = stream_open_file(&a->gates.s, w, x->err);
    if (!st) st = npy_header(&a->gates, x->err);
    return st;
}

/* Shapes and dtypes against the model and each other; the request sources against T. */
static moesim_status check_arrays(importer *x, const array_set *a) {
    char sh[96];
    const npy_array *ids = a->has_logits ? &a->logits : &a->ids, *g = &a->gates;
    if (a->has_logits) {
        if (ids->kind != 'f')
            return stream_fail(&ids->s, x->err, "dtype integer: expected float router logits");
        if (ids->ndim != 3 || ids->shape[1] != x->L || ids->shape[2] != x->E || !ids->shape[0]) {
            shape_text(ids, sh, sizeof sh);
            return stream_fail(&ids->s, x->err,
                               "shape %s: expected [tokens >= 1][%" PRIu32 " MoE layers][%" PRIu32
                               " experts] (%s)",
                               sh, x->L, x->E, x->m->name);
        }
    } else {
        if (ids->kind == 'f')
            return stream_fail(&ids->s, x->err, "dtype float: expected integer expert ids");
        if (ids->ndim != 3 || ids->shape[1] != x->L || ids->shape[2] != x->k || !ids->shape[0]) {
            shape_text(ids, sh, sizeof sh);
            return stream_fail(&ids->s, x->err,
                               "shape %s: expected [tokens >= 1][%" PRIu32
                               " MoE layers][top_k = %" PRIu32 "] (%s)",
                               sh, x->L, x->k, x->m->name);
        }
    }
    if (a->has_gates && g->kind != 'f')
        return stream_fail(&g->s, x->err, "dtype integer: expected float gate weights");
    if (a->has_gates && (g->ndim != 3 || memcmp(g->shape, ids->shape, 3 * sizeof g->shape[0]))) {
        shape_text(g, sh, sizeof sh);
        char want[96];
        shape_text(ids, want, sizeof want);
        return stream_fail(&g->s, x->err, "shape %s: expected %s like the expert ids", sh, want);
    }
    uint64_t T = ids->shape[0];
    if (ids->shape[0] > UINT32_MAX - 1)
        return stream_fail(&ids->s, x->err, "%" PRIu64 " tokens: at most %u", T, UINT32_MAX - 1);
    if (a->has_request_id) {
        const npy_array *r = &a->request_id;
        if (r->ndim != 1 || r->shape[0] != T || r->kind == 'f') {
            shape_text(r, sh, sizeof sh);
            return stream_fail(&r->s, x->err,
                               "shape %s: expected [%" PRIu64 "] integers (one per token)", sh, T);
        }
    }
    const int64_t *lens = a->seq_lens;
    uint64_t n_lens = a->n_seq;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n_lens; i++) {
        if (lens[i] == 0 || (uint64_t)lens[i] > T) /* <= T: the sum cannot wrap */
            return moesim_fail(x->err, MOESIM_EINPUT,
                               "%s: seq_lens.npy[%" PRIu64 "]: %" PRId64
                               " tokens, expected 1..%" PRIu64 " (the arrays' tokens)",
                               x->path, i, lens[i], T);
        sum += (uint64_t)lens[i];
    }
    for (uint64_t i = 0; i < a->n_side && sum <= T; i++) sum += a->side[i].tokens;
    if ((a->seq_lens || a->side) && sum != T)
        return moesim_fail(
            x->err, MOESIM_EINPUT,
            "%s: %s: request lengths sum to %s%" PRIu64 " tokens, the arrays hold %" PRIu64,
            a->side ? x->o->requests_path : x->path, a->side ? "tokens" : "seq_lens.npy",
            sum > T ? "more than " : "", sum > T ? T : sum, T);
    return MOESIM_OK;
}

/* The request key of a block request (seq_lens: its index; side file: its name). */
static void block_key(const array_set *a, uint64_t q, request_key *k) {
    k->len = 0;
    if (a->side) {
        import_key_append(k, 's', a->side[q].name, a->side[q].name_len);
    } else {
        char num[24];
        int n = snprintf(num, sizeof num, "%" PRIu64, q);
        import_key_append(k, 'i', num, (size_t)n);
    }
}

/* One token's routing from its router logits [L][E]: per layer the k largest logits (highest
 * first, ties to the lower expert id, like a stable descending sort) and their gates by the
 * model's rule, computed in double: softmax over the k chosen logits (GATE_SOFTMAX_TOPK), or
 * over all E with the top-k kept (GATE_SOFTMAX_ALL). */
static moesim_status route_from_logits(importer *x, const npy_array *src, const float *logits,
                                       int64_t *ids, float *gates) {
    const uint32_t E = x->E, k = x->k;
    for (uint32_t l = 0; l < x->L; l++) {
        const float *z = logits + (size_t)l * E;
        float zmax = -INFINITY;
        for (uint32_t e = 0; e < E; e++) {
            if (!isfinite(z[e]))
                return moesim_fail(x->err, MOESIM_EINPUT,
                                   "%s: [%" PRIu64 "][%" PRIu32 "][%" PRIu32
                                   "]: router logit is not finite",
                                   src->s.name, x->arr_token, l, e);
            if (z[e] > zmax) zmax = z[e];
        }
        int64_t *id = ids + (size_t)l * k;
        for (uint32_t j = 0; j < k; j++) { /* selection: k <= 64 passes over E <= 1024 */
            int64_t best = -1;
            for (uint32_t e = 0; e < E; e++) {
                bool taken = false;
                for (uint32_t a = 0; a < j && !taken; a++) taken = id[a] == e;
                if (!taken && (best < 0 || z[e] > z[best])) best = e;
            }
            id[j] = best;
        }
        double sum = 0;
        if (x->m->gate_norm == GATE_SOFTMAX_TOPK)
            for (uint32_t j = 0; j < k; j++) sum += exp((double)z[id[j]] - zmax);
        else
            for (uint32_t e = 0; e < E; e++) sum += exp((double)z[e] - zmax);
        for (uint32_t j = 0; j < k; j++)
            gates[(size_t)l * k + j] = (float)(exp((double)z[id[j]] - zmax) / sum);
    }
    return MOESIM_OK;
}

moesim_status import_arrays(importer *x) {
    array_set a = {0};
    moesim_status st = x->o->format == TRACE_TEXT_NPZ ? open_npz(x, &a) : open_npy(x, &a);
    if (!st && x->o->requests_path) st = read_side_file(x, &a.side, &a.n_side);
    if (!st) st = check_arrays(x, &a);
    if (st) {
        array_set_free(&a);
        return st;
    }
    x->rep->requests_source = a.has_request_id ? "request_id column"
                              : a.seq_lens     ? "seq_lens"
                              : a.side         ? "--requests"
                                               : "one request";
    x->prompt_source = a.prompt_lens ? "prompt_lens" : "prompt_tokens of --requests";
    x->rep->gates_source = a.has_gates     ? "weights"
                           : !a.has_logits ? "uniform 1/k (--uniform-gates)"
                           : x->m->gate_norm == GATE_SOFTMAX_TOPK
                               ? "router logits: softmax over the top-k"
                               : "router logits: softmax over all experts, top-k kept";
    const uint64_t T = a.has_logits ? a.logits.shape[0] : a.ids.shape[0];
    const uint64_t row = (uint64_t)x->L * x->k, logit_row = (uint64_t)x->L * x->E;
    import_record *r = moesim_xcalloc(1, sizeof *r);
    int64_t *ids = moesim_xmalloc(row * sizeof *ids); /* [L][k] of one token */
    float *gates = moesim_xmalloc(row * sizeof *gates);
    float *logits = a.has_logits ? moesim_xmalloc(logit_row * sizeof *logits) : NULL; /* [L][E] */
    unsigned char *scratch = moesim_xmalloc((a.has_logits ? logit_row : row) * 8);
    uint64_t block = 0, block_left = a.seq_lens ? (uint64_t)a.seq_lens[0]
                                     : a.side   ? a.side[0].tokens
                                                : T;
    r->all_layers = true;
    r->n_rows = x->L;
    r->phase = -1;
    for (uint32_t l = 0; l < x->L; l++) r->n_ids[l] = r->n_gates[l] = x->k;
    for (uint64_t t = 0; t < T && !st; t++) {
        x->arr_token = t;
        uint64_t neg;
        if (a.has_logits) {
            if ((st = npy_read_values(&a.logits, logit_row, NULL, logits, scratch, &neg, x->err)))
                break;
            if ((st = route_from_logits(x, &a.logits, logits, ids, gates))) break;
        } else {
            if ((st = npy_read_values(&a.ids, row, ids, NULL, scratch, &neg, x->err))) break;
            if (neg != UINT64_MAX) {
                st = moesim_fail(x->err, MOESIM_EINPUT,
                                 "%s: [%" PRIu64 "][%" PRIu64 "][%" PRIu64 "]: expert id %" PRId64
                                 " is negative",
                                 a.ids.s.name, t, neg / x->k, neg % x->k, ids[neg]);
                break;
            }
            if (a.has_gates) {
                if ((st = npy_read_values(&a.gates, row, NULL, gates, scratch, &neg, x->err)))
                    break;
            } else {
                for (uint64_t i = 0; i < row; i++) gates[i] = 1.0f / (float)x->k;
            }
        }
        uint64_t q; /* the request: a block index, or a request_id value */
        if (a.has_request_id) {
            int64_t rid;
            if ((st = npy_read_values(&a.request_id, 1, &rid, NULL, scratch, &neg, x->err))) break;
            if (neg != UINT64_MAX) {
                st = moesim_fail(x->err, MOESIM_EINPUT,
                                 "%s: [%" PRIu64 "]: request id %" PRId64 " is negative",
                                 a.request_id.s.name, t, rid);
                break;
            }
            char num[24];
            int n = snprintf(num, sizeof num, "%" PRId64, rid);
            r->key.len = 0;
            import_key_append(&r->key, 'i', num, (size_t)n);
            q = UINT64_MAX;
        } else {
            while (block_left == 0) {
                block++;
                block_left = a.seq_lens ? (uint64_t)a.seq_lens[block] : a.side[block].tokens;
            }
            block_left--;
            block_key(&a, block, &r->key);
            q = block;
        }
        /* position: the request's tokens so far */
        uint32_t ri = import_request_find_or_add(x, &r->key);
        const import_request *req = &x->reqs[ri];
        r->token_idx = req->tail == IMPORT_NO_TOKEN ? 0 : x->tok_pos[req->tail] + 1;
        r->prompt_len = -1;
        uint64_t pi = q == UINT64_MAX ? ri : q; /* prompt_lens follow the requests' order */
        if (a.prompt_lens) {
            if (pi >= a.n_prompt) {
                st = moesim_fail(x->err, MOESIM_EINPUT,
                                 "%s: prompt_lens.npy: %" PRIu64 " entries, but token %" PRIu64
                                 " starts request %" PRIu64,
                                 x->path, a.n_prompt, t, pi);
                break;
            }
            r->prompt_len = a.prompt_lens[pi];
        } else if (a.side && a.side[pi].prompt >= 0) {
            r->prompt_len = a.side[pi].prompt;
        }
        for (uint32_t l = 0; l < x->L; l++)
            for (uint32_t j = 0; j < x->k; j++) {
                r->ids[l][j] = (uint64_t)ids[(uint64_t)l * x->k + j];
                r->gates[l][j] = gates[(uint64_t)l * x->k + j];
            }
        st = import_place(x, r);
        x->rep->lines++;
    }
    if (!st && a.prompt_lens && a.n_prompt != x->n_reqs)
        st = moesim_fail(x->err, MOESIM_EINPUT,
                         "%s: prompt_lens.npy: %" PRIu64 " entries for %" PRIu32 " requests",
                         x->path, a.n_prompt, x->n_reqs);
    free(scratch);
    free(logits);
    free(gates);
    free(ids);
    free(r);
    array_set_free(&a);
    return st;
}
