/* The CPU replay's expert file (replay/cpu_store.h). */
#define _GNU_SOURCE
#include "replay/cpu_store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/rng.h"
#include "kernels/quant.h"
#include "replay/weights.h"


static uint64_t align_up(uint64_t v) {
    return (v + CPU_STORE_ALIGN - 1) / CPU_STORE_ALIGN * CPU_STORE_ALIGN;
}

void cpu_store_destroy(cpu_store *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd); /* the last reference to the (unlinked) file */
    free(s);
}

uint8_t *cpu_store_expert_blob(const model_geometry *m, moesim_precision p, uint64_t seed) {
    uint64_t total = 0;
    for (int part = 0; part < PART_COUNT; part++)
        total += replay_part_bytes(m, p, (expert_part)part);
    uint8_t *blob = moesim_xmalloc(total), *dst = blob;
    uint64_t wide = m->hidden > m->expert_inter ? m->hidden : m->expert_inter;
    float *row = moesim_xmalloc(wide * sizeof *row);
    rng *g = rng_create(seed);
    for (int part = 0; part < PART_COUNT; part++) {
        uint64_t rows = part == PART_DOWN ? m->hidden : m->expert_inter;
        uint64_t cols = part == PART_DOWN ? m->expert_inter : m->hidden;
        uint64_t row_bytes = replay_part_bytes(m, p, (expert_part)part) / rows;
        for (uint64_t r = 0; r < rows; r++, dst += row_bytes) {
            for (uint64_t c = 0; c < cols; c++) row[c] = (float)(rng_uniform(g) - 0.5) * 0.05f;
            if (p == PREC_BF16)
                for (uint64_t c = 0; c < cols; c++) {
                    uint16_t b = quant_f32_to_bf16(row[c]);
                    memcpy(dst + 2 * c, &b, 2);
                }
            else
                quant_row_quantize_ref(p, row, dst, cols);
        }
    }
    rng_destroy(g);
    free(row);
    return blob;
}

/* Writes `bytes` at `off` whole; a failure names the file. */
static moesim_status write_all(const cpu_store *s, int fd, const uint8_t *buf, uint64_t bytes,
                               uint64_t off, moesim_error *err) {
    for (uint64_t done = 0; done < bytes;) {
        ssize_t w = pwrite(fd, buf + done, bytes - done, (off_t)(off + done));
        if (w <= 0)
            return moesim_fail(err, MOESIM_EIO, "%s: writing the expert file: %s", s->path,
                               w < 0 ? strerror(errno) : "short write (disk full?)");
        done += (uint64_t)w;
    }
    return MOESIM_OK;
}

/* The file's blocks, claimed before any is written: a disk without room for it says so at once,
 * with how much it lacks, rather than after GBs. A file system that cannot reserve (EOPNOTSUPP)
 * is written as it is, its writes reporting a full disk. */
static moesim_status reserve(const cpu_store *s, int fd, moesim_error *err) {
    struct statvfs fs; /* before: a failed reservation may hold blocks until the file closes */
    bool known = fstatvfs(fd, &fs) == 0;
    if (!s->file_bytes || fallocate(fd, 0, 0, (off_t)s->file_bytes) == 0) return MOESIM_OK;
    int e = errno;
    if (e == EOPNOTSUPP) return MOESIM_OK;
    if (e != ENOSPC || !known)
        return moesim_fail(err, MOESIM_EIO, "%s: reserving the expert file's %.2f GB: %s",
                           s->path, (double)s->file_bytes / 1e9, strerror(e));
    return moesim_fail(err, MOESIM_EIO,
                       "%s: no room for the expert file: it needs %.2f GB, its file system has "
                       "%.2f GB free (--ssd-dir chooses another directory)",
                       s->path, (double)s->file_bytes / 1e9,
                       (double)fs.f_bavail * (double)fs.f_frsize / 1e9);
}

/* Experts converted from a checkpoint per write: enough to spread the conversion over the CPUs. */
#define CPU_STORE_BATCH 64

/* Synthetic: every expert of a precision is the same blob (timing depends on bytes, not values,
 * and fresh weights for every expert would dominate a validation run). From a checkpoint: each
 * expert its own, CPU_STORE_BATCH at a time. */
static moesim_status write_file(cpu_store *s, uint64_t seed, const replay_weights *w,
                                moesim_error *err) {
    int fd = open(s->path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot create the CPU replay's expert file: %s",
                           s->path, strerror(errno));
    /* the read descriptor first, so a file system without O_DIRECT fails before GBs are written */
    s->fd = open(s->path, O_RDONLY | O_DIRECT);
    int direct_errno = errno;
    /* nameless from here: the file goes with the process however it ends (a replay killed
     * mid-run used to leave its 2.3 GB in /var/tmp) */
    unlink(s->path);
    if (s->fd < 0) {
        close(fd);
        return moesim_fail(err, MOESIM_EIO,
                           "%s: cannot open with O_DIRECT (the CPU replay reads past the page "
                           "cache; choose a directory on a local disk with --ssd-dir): %s",
                           s->path, strerror(direct_errno));
    }
    moesim_status st = reserve(s, fd, err);
    size_t LE = (size_t)s->m.n_moe_layers * s->m.n_experts;
    for (int p = 0; p < PREC_COUNT && !st; p++) {
        if (!s->stored[p]) continue;
        uint64_t stride = s->stride[p];
        size_t batch = w ? CPU_STORE_BATCH : 1;
        uint8_t *buf = moesim_xcalloc(batch, stride);
        if (!w) {
            uint8_t *blob = cpu_store_expert_blob(&s->m, (moesim_precision)p, seed);
            memcpy(buf, blob, s->part_bytes[p][0] + s->part_bytes[p][1] + s->part_bytes[p][2]);
            free(blob);
        }
        for (size_t le = 0; le < LE && !st; le += batch) {
            size_t n = LE - le < batch ? LE - le : batch;
            if (w) replay_weights_experts(w, (moesim_precision)p, le, n, buf, stride);
            st = write_all(s, fd, buf, n * stride, s->base[p] + le * stride, err);
        }
        free(buf);
    }
    /* on disk before the first timed read: an O_DIRECT read of a range still dirty in the page
     * cache waits for its writeback, which made calibration (run right after the file is written)
     * measure half the rate the replay later got */
    if (st == MOESIM_OK && fsync(fd) != 0)
        st = moesim_fail(err, MOESIM_EIO, "%s: writing the expert file: %s", s->path,
                         strerror(errno));
    if (st == MOESIM_OK) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* no cached copy */
    if (close(fd) != 0 && st == MOESIM_OK)
        st = moesim_fail(err, MOESIM_EIO, "%s: %s", s->path, strerror(errno));
    return st;
}

moesim_status cpu_store_create(const model_geometry *m, const bool stored[PREC_COUNT],
                               const char *dir, uint64_t seed, const replay_weights *w,
                               cpu_store **out, moesim_error *err) {
    *out = NULL;
    cpu_store *s = moesim_xcalloc(1, sizeof *s);
    s->fd = -1;
    s->m = *m;
    uint64_t off = 0;
    size_t LE = (size_t)m->n_moe_layers * m->n_experts;
    for (int p = 0; p < PREC_COUNT; p++) {
        if (!stored[p]) continue;
        if (p != PREC_BF16 && !quant_traits_of((moesim_precision)p)) {
            free(s);
            return moesim_fail(err, MOESIM_EINPUT,
                               "the CPU replay's kernels have no %s format (bf16, int8, int4, "
                               "int2)",
                               precision_name((moesim_precision)p));
        }
        if (p != PREC_BF16 && (m->hidden % QUANT_GROUP || m->expert_inter % QUANT_GROUP)) {
            free(s);
            return moesim_fail(err, MOESIM_EINPUT,
                               "model '%s': widths %u and %u must be multiples of the %d-wide "
                               "quantization groups of the %s kernels",
                               m->name, m->hidden, m->expert_inter, QUANT_GROUP,
                               precision_name((moesim_precision)p));
        }
        s->stored[p] = true;
        uint64_t blob = 0;
        for (int part = 0; part < PART_COUNT; part++) {
            s->part_bytes[p][part] = replay_part_bytes(m, (moesim_precision)p, (expert_part)part);
            blob += s->part_bytes[p][part];
        }
        s->stride[p] = align_up(blob);
        s->base[p] = off;
        off += s->stride[p] * LE;
    }
    s->file_bytes = off;
    snprintf(s->path, sizeof s->path, "%s/moesim-cpu-experts-%ld-XXXXXX", dir ? dir : "/var/tmp",
             (long)getpid());
    int tmp = mkstemp(s->path);
    if (tmp < 0) {
        moesim_status st = moesim_fail(err, MOESIM_EIO, "%s: cannot create: %s", s->path,
                                       strerror(errno));
        s->path[0] = 0;
        free(s);
        return st;
    }
    close(tmp);
    unlink(s->path); /* write_file creates it again, O_EXCL */
    moesim_status st = write_file(s, seed, w, err);
    if (st != MOESIM_OK) {
        cpu_store_destroy(s);
        return st;
    }
    *out = s;
    return MOESIM_OK;
}

uint64_t cpu_store_part_offset(const cpu_store *s, uint32_t moe_layer, uint32_t expert,
                               moesim_precision p, expert_part part) {
    MOESIM_ASSERT(s->stored[p] && moe_layer < s->m.n_moe_layers && expert < s->m.n_experts);
    uint64_t off = s->base[p] + ((uint64_t)moe_layer * s->m.n_experts + expert) * s->stride[p];
    for (int q = 0; q < (int)part; q++) off += s->part_bytes[p][q];
    return off;
}

static bool read_all(int fd, uint8_t *dst, uint64_t bytes, uint64_t off) {
    while (bytes) {
        ssize_t r = pread(fd, dst, bytes, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = EIO;
            return false;
        }
        dst += r, off += (uint64_t)r, bytes -= (uint64_t)r;
    }
    return true;
}

#define CPU_STORE_HUGE_PAGE (2u << 20)

void *cpu_store_dma_alloc(uint64_t bytes) {
    uint64_t n = (bytes + CPU_STORE_HUGE_PAGE - 1) / CPU_STORE_HUGE_PAGE * CPU_STORE_HUGE_PAGE;
    void *p = moesim_xaligned(CPU_STORE_HUGE_PAGE, n ? n : CPU_STORE_HUGE_PAGE);
    /* advice only: without transparent huge pages the buffer still works, at the kernel's layout */
    (void)madvise(p, n, MADV_HUGEPAGE);
    memset(p, 0, n); /* touch: page faults stay out of timed reads */
    return p;
}

bool cpu_store_read(const cpu_store *s, uint64_t off, uint64_t bytes, uint8_t *dst,
                    uint8_t *bounce) {
    bool aligned = off % CPU_STORE_ALIGN == 0 && bytes % CPU_STORE_ALIGN == 0 &&
                   (uintptr_t)dst % CPU_STORE_ALIGN == 0;
    if (aligned) return read_all(s->fd, dst, bytes, off);
    uint64_t lo = off / CPU_STORE_ALIGN * CPU_STORE_ALIGN;
    uint64_t hi = align_up(off + bytes);
    if (!read_all(s->fd, bounce, hi - lo, lo)) return false;
    memcpy(dst, bounce + (off - lo), bytes);
    return true;
}

bool cpu_store_read_pieces(const cpu_store *s, uint64_t off, const struct iovec *iov, int n,
                           uint8_t *bounce) {
    MOESIM_ASSERT(n > 0 && n <= IOV_MAX);
    bool aligned = off % CPU_STORE_ALIGN == 0;
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        aligned = aligned && iov[i].iov_len % CPU_STORE_ALIGN == 0 &&
                  (uintptr_t)iov[i].iov_base % CPU_STORE_ALIGN == 0;
        total += iov[i].iov_len;
    }
    if (aligned) {
        ssize_t r;
        do r = preadv(s->fd, iov, n, (off_t)off);
        while (r < 0 && errno == EINTR);
        if (r == (ssize_t)total) return true;
        if (r < 0) return false;
        /* a short read: the pieces one by one (a re-read of what landed is harmless) */
    }
    for (int i = 0; i < n; i++) {
        if (!cpu_store_read(s, off, iov[i].iov_len, iov[i].iov_base, bounce)) return false;
        off += iov[i].iov_len;
    }
    return true;
}
