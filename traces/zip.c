/* Byte streams for the array importer: a plain file, or one member of a zip archive (.npz),
 * stored or deflated (traces/zip.h). The zip reader is our own: the central directory (zip64
 * too: numpy writes members with zip64 extras), stored members read in place, deflated members
 * inflated by zlib as a stream, CRC-32 checked at each member's end. */
#include "traces/zip.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

#define ZIP_MAX_MEMBERS 4096
#define ZIP_EOCD_BYTES  22
#define ZIP_EOCD_SEARCH (ZIP_EOCD_BYTES + 65535) /* the comment is at most 64 KiB */

void byte_stream_close(byte_stream *s) {
    if (s->zinit) inflateEnd(&s->z);
    if (s->fp) fclose(s->fp);
    free(s->in);
    memset(s, 0, sizeof *s);
}

moesim_status byte_stream_fail(const byte_stream *s, moesim_error *err, const char *fmt, ...) {
    char msg[MOESIM_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return moesim_fail(err, MOESIM_EINPUT, "%s: %s", s->name, msg);
}

/* Exactly n bytes into buf, or a message naming the stream. */
moesim_status byte_stream_read(byte_stream *s, void *buf, size_t n, moesim_error *err) {
    if (n > s->left)
        return byte_stream_fail(s, err, "truncated: %" PRIu64 " bytes left, %zu needed", s->left,
                                n);
    if (!s->deflated) {
        if (fread(buf, 1, n, s->fp) != n)
            return ferror(s->fp) ? moesim_fail(err, MOESIM_EIO, "%s: read error: %s", s->name,
                                               strerror(errno))
                                 : byte_stream_fail(s, err, "truncated file");
    } else {
        s->z.next_out = buf;
        s->z.avail_out = (uInt)n;
        while (s->z.avail_out) {
            if (!s->z.avail_in && s->comp_left) {
                size_t want = s->comp_left < STREAM_BUF_BYTES ? s->comp_left : STREAM_BUF_BYTES;
                size_t got = fread(s->in, 1, want, s->fp);
                if (got != want) return byte_stream_fail(s, err, "truncated zip member");
                s->comp_left -= got;
                s->z.next_in = s->in;
                s->z.avail_in = (uInt)got;
            }
            int zr = inflate(&s->z, Z_NO_FLUSH);
            if (zr == Z_STREAM_END && s->z.avail_out)
                return byte_stream_fail(s, err, "deflate stream ends early");
            if (zr != Z_OK && zr != Z_STREAM_END)
                return byte_stream_fail(s, err, "corrupt deflate data (%s)",
                                        s->z.msg ? s->z.msg : "zlib error");
            if (zr == Z_OK && !s->z.avail_in && !s->comp_left && s->z.avail_out)
                return byte_stream_fail(s, err, "truncated deflate data");
        }
    }
    s->left -= n;
    if (s->in_zip) {
        s->crc = (uint32_t)crc32(s->crc, buf, (uInt)n);
        if (!s->left && s->crc != s->want_crc)
            return byte_stream_fail(s, err,
                                    "CRC-32 %08" PRIx32 ", the zip directory says %08" PRIx32
                                    " (corrupt member)",
                                    s->crc, s->want_crc);
    }
    return MOESIM_OK;
}

moesim_status byte_stream_open_file(byte_stream *s, const char *path, moesim_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", path);
    s->fp = fopen(path, "rb");
    if (!s->fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (fseeko(s->fp, 0, SEEK_END) != 0) {
        byte_stream_close(s);
        return moesim_fail(err, MOESIM_EIO, "%s: cannot seek", path);
    }
    s->left = (uint64_t)ftello(s->fp);
    rewind(s->fp);
    return MOESIM_OK;
}

/* ---- zip (.npz) ---------------------------------------------------------------------------- */

static moesim_status zip_read_at(FILE *fp, uint64_t off, void *buf, size_t n, const char *path,
                                 const char *what, moesim_error *err) {
    if (fseeko(fp, (off_t)off, SEEK_SET) != 0 || fread(buf, 1, n, fp) != n)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: %s: truncated zip (%zu bytes at offset %" PRIu64 ")", path, what, n,
                           off);
    return MOESIM_OK;
}

/* The central directory of the zip at `path`: *members (caller frees), *n. */
moesim_status zip_directory_read(const char *path, zip_member **members, uint32_t *n,
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
    if ((st = zip_read_at(fp, size - span, tail, span, path, "end of central directory", err)))
        goto out;
    int64_t eocd = -1;
    for (int64_t i = (int64_t)span - ZIP_EOCD_BYTES; i >= 0 && eocd < 0; i--)
        if (zip_le32(tail + i) == 0x06054b50) eocd = i;
    if (eocd < 0) {
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: not a zip file (no end of central directory record): expected an "
                         ".npz as np.savez writes it",
                         path);
        goto out;
    }
    uint64_t entries = zip_le16(tail + eocd + 10), cd_size = zip_le32(tail + eocd + 12),
             cd_off = zip_le32(tail + eocd + 16);
    if (entries == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
        /* zip64: the locator sits just before the classic record */
        uint64_t loc = size - span + (uint64_t)eocd;
        unsigned char l[20], z[56];
        if (loc < 20 || (st = zip_read_at(fp, loc - 20, l, 20, path, "zip64 locator", err))) {
            if (!st) st = moesim_fail(err, MOESIM_EINPUT, "%s: zip64 locator missing", path);
            goto out;
        }
        if (zip_le32(l) != 0x07064b50) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s: zip64 locator missing", path);
            goto out;
        }
        if ((st = zip_read_at(fp, zip_le64(l + 8), z, 56, path, "zip64 end of central directory",
                              err)))
            goto out;
        if (zip_le32(z) != 0x06064b50) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s: bad zip64 end of central directory", path);
            goto out;
        }
        entries = zip_le64(z + 32);
        cd_size = zip_le64(z + 40);
        cd_off = zip_le64(z + 48);
    }
    if (entries > ZIP_MAX_MEMBERS || cd_size > size || cd_off > size - cd_size) {
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: zip directory of %" PRIu64 " entries, %" PRIu64 " bytes at %" PRIu64
                         " does not fit a %" PRIu64 "-byte file (at most %d members)",
                         path, entries, cd_size, cd_off, size, ZIP_MAX_MEMBERS);
        goto out;
    }
    cd = moesim_xmalloc(cd_size + 1);
    if ((st = zip_read_at(fp, cd_off, cd, cd_size, path, "central directory", err))) goto out;
    zip_member *m = moesim_xcalloc(entries ? entries : 1, sizeof *m);
    *members = m;
    uint64_t p = 0;
    for (uint64_t i = 0; i < entries; i++) {
        if (p + 46 > cd_size || zip_le32(cd + p) != 0x02014b50) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: central directory entry %" PRIu64 " is malformed", path, i);
            goto out;
        }
        const unsigned char *e = cd + p;
        uint32_t nlen = zip_le16(e + 28), xlen = zip_le16(e + 30), clen = zip_le16(e + 32);
        if (p + 46 + nlen + xlen + clen > cd_size) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s: central directory entry %" PRIu64 " runs past the directory",
                             path, i);
            goto out;
        }
        zip_member *z = &m[i];
        z->flags = zip_le16(e + 8);
        z->method = zip_le16(e + 10);
        z->crc = zip_le32(e + 16);
        z->comp_size = zip_le32(e + 20);
        z->size = zip_le32(e + 24);
        z->local_offset = zip_le32(e + 42);
        snprintf(z->name, sizeof z->name, "%.*s", (int)(nlen < 255 ? nlen : 255),
                 (const char *)e + 46);
        /* zip64 extra: the 64-bit values of the fields saturated above, in this order */
        for (const unsigned char *x = e + 46 + nlen, *xe = x + xlen; x + 4 <= xe;) {
            uint16_t id = zip_le16(x), len = zip_le16(x + 2);
            const unsigned char *d = x + 4, *de = d + len;
            if (de > xe) break;
            if (id == 0x0001) {
                if (z->size == 0xFFFFFFFFu && d + 8 <= de) z->size = zip_le64(d), d += 8;
                if (z->comp_size == 0xFFFFFFFFu && d + 8 <= de) z->comp_size = zip_le64(d), d += 8;
                if (z->local_offset == 0xFFFFFFFFu && d + 8 <= de) z->local_offset = zip_le64(d);
            }
            x = de;
        }
        p += 46 + nlen + xlen + clen;
        for (uint64_t j = 0; j < i; j++) /* np.load would take the last, a reader the first */
            if (!strcmp(m[j].name, z->name)) {
                st = moesim_fail(err, MOESIM_EINPUT, "%s: member %s appears twice", path, z->name);
                goto out;
            }
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

moesim_status byte_stream_open_member(byte_stream *s, const char *path, const zip_member *z,
                                      moesim_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s: %s", path, z->name);
    if (z->flags & 1) return byte_stream_fail(s, err, "encrypted zip member");
    if (z->method != 0 && z->method != 8)
        return byte_stream_fail(s, err,
                                "compression method %u, expected stored (np.savez) or deflated "
                                "(np.savez_compressed)",
                                z->method);
    s->fp = fopen(path, "rb");
    if (!s->fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char h[30];
    moesim_status st = zip_read_at(s->fp, z->local_offset, h, 30, path, z->name, err);
    if (!st && zip_le32(h) != 0x04034b50)
        st = byte_stream_fail(s, err, "local header missing at offset %" PRIu64, z->local_offset);
    if (st) {
        byte_stream_close(s);
        return st;
    }
    /* sizes a corrupt directory could inflate: deflate expands at most ~1032:1 */
    uint64_t file_size = 0;
    if (fseeko(s->fp, 0, SEEK_END) == 0) file_size = (uint64_t)ftello(s->fp);
    if (fseeko(s->fp, (off_t)(z->local_offset + 30 + zip_le16(h + 26) + zip_le16(h + 28)),
               SEEK_SET) != 0 ||
        z->comp_size > file_size || (z->method == 0 && z->size != z->comp_size) ||
        (z->method == 8 && z->size / 1032 > z->comp_size + 1)) {
        st =
            byte_stream_fail(s, err,
                             "%" PRIu64 " bytes from %" PRIu64 " stored: sizes that do not fit the "
                             "file or the compression (corrupt zip directory)",
                             z->size, z->comp_size);
        byte_stream_close(s);
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
            byte_stream_close(s);
            return moesim_fail(err, MOESIM_ENOMEM, "%s: zlib: cannot start inflating", path);
        }
        s->zinit = true;
    }
    return MOESIM_OK;
}
