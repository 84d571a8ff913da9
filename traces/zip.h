/* Byte streams over a plain file or a zip member, and the zip central directory: what the
 * NumPy importer (traces/import_npy.c, traces/npy.c) reads arrays through. Internal to traces/.
 *
 * A stream delivers exactly the bytes of its file or member, in order; reading past them is an
 * error naming the stream ("routes.npz: topk_ids.npy: truncated ..."). Zip members may be stored
 * (np.savez) or deflated (np.savez_compressed); each member's CRC-32 is checked when its last
 * byte is read. Nothing is loaded whole. */
#ifndef MOESIM_TRACES_ZIP_H
#define MOESIM_TRACES_ZIP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <zlib.h>

#include "common/status.h"

#define STREAM_BUF_BYTES (1u << 16)

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

typedef struct zip_member {
    char name[256];
    uint16_t method, flags;
    uint32_t crc;
    uint64_t comp_size, size, local_offset;
} zip_member;

static inline uint16_t zip_le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t zip_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t zip_le64(const unsigned char *p) {
    return zip_le32(p) | (uint64_t)zip_le32(p + 4) << 32;
}

/* Opens a plain file as a stream (MOESIM_EIO naming it when it cannot). */
moesim_status byte_stream_open_file(byte_stream *s, const char *path, moesim_error *err);
/* Opens member `z` of the zip at `path` (stored or deflated; refuses others and encryption). */
moesim_status byte_stream_open_member(byte_stream *s, const char *path, const zip_member *z,
                                      moesim_error *err);
/* Exactly n bytes into buf, or MOESIM_EINPUT naming the stream (truncated, corrupt, bad CRC). */
moesim_status byte_stream_read(byte_stream *s, void *buf, size_t n, moesim_error *err);
/* MOESIM_EINPUT with "<stream name>: <message>". */
moesim_status byte_stream_fail(const byte_stream *s, moesim_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void byte_stream_close(byte_stream *s); /* accepts a zeroed stream */

/* The central directory of the zip at `path`: *members (caller frees), *n. */
moesim_status zip_directory_read(const char *path, zip_member **members, uint32_t *n,
                                 moesim_error *err);

#endif
