/* The CPU replay's host tier (replay/exec_cpu.c): every expert of a model at the stored
 * precisions in one file on local disk, read with O_DIRECT (no page cache) chunk by chunk into the
 * DRAM pool that stands in for HBM. Layout: for each stored precision, the experts in (layer,
 * expert) order, each a blob [gate | up | down] in the kernels' formats (replay_part_bytes), each
 * blob starting on a CPU_STORE_ALIGN boundary. Weights are a checkpoint's, or synthetic: one
 * seeded random blob repeated (timing depends on bytes and shapes, not values).
 *
 * Units: bytes. Invariants: blob offsets are CPU_STORE_ALIGN-aligned; the file is removed when
 * the store is destroyed. */
#ifndef MOESIM_REPLAY_CPU_STORE_H
#define MOESIM_REPLAY_CPU_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/model.h"
#include "common/precision.h"
#include "common/status.h"
#include "replay/weights.h"

#define CPU_STORE_ALIGN 4096u /* O_DIRECT: offsets, sizes and buffers aligned to this */

typedef struct cpu_store {
    model_geometry m;
    bool stored[PREC_COUNT];
    uint64_t part_bytes[PREC_COUNT][PART_COUNT]; /* kernel format bytes of one part */
    uint64_t stride[PREC_COUNT];                 /* blob bytes rounded up to CPU_STORE_ALIGN */
    uint64_t base[PREC_COUNT];                   /* file offset of precision p's first blob */
    uint64_t file_bytes;
    int fd;         /* O_DIRECT read descriptor: the file's only reference */
    char path[600]; /* where it was made (for messages); unlinked once both descriptors were open */
} cpu_store;

/* Writes the store of `m` at the precisions `stored` into a new file under `dir` (NULL:
 * /var/tmp) and opens it for O_DIRECT reads. The experts are checkpoint `w`'s, converted as the
 * cuda backend converts them (replay_weights_experts), or with w = NULL one synthetic blob per
 * precision (seed `seed`). Fails (MOESIM_EINPUT) when a width is not a multiple
 * of the quantization group of a stored integer format, MOESIM_EIO when the file cannot be written
 * or opened with O_DIRECT (the message names the path and errno). Caller owns *out;
 * cpu_store_destroy. */
moesim_status cpu_store_create(const model_geometry *m, const bool stored[PREC_COUNT],
                               const char *dir, uint64_t seed, const replay_weights *w,
                               cpu_store **out, moesim_error *err);
void cpu_store_destroy(cpu_store *s); /* accepts NULL; the file goes with its descriptor */

/* One expert's blob [gate | up | down] at precision p in the kernels' formats, from seeded
 * random weights quantized as the engine quantizes (normal floats: no denormal or NaN that would
 * make the CPU kernels slower than real weights). Caller frees. */
uint8_t *cpu_store_expert_blob(const model_geometry *m, moesim_precision p, uint64_t seed);

/* File offset of part `part` of (moe_layer, expert) at precision p. */
uint64_t cpu_store_part_offset(const cpu_store *s, uint32_t moe_layer, uint32_t expert,
                               moesim_precision p, expert_part part);

/* Memory that O_DIRECT reads land in (the pool arena, bounce buffers, calibration's buffer): 2 MiB
 * aligned, advised as transparent huge pages and touched, so the pages are resident and, where
 * the kernel grants huge pages, physically contiguous. Why: a block device takes at most
 * max_segments pages per request (254 on this project's virtio disks), so a 1 MiB read into
 * scattered 4 KiB pages is split in two, and the disk rate depended on where the kernel happened
 * to place the buffer (1.3 vs 2.0 GB/s for the same reads here). With every O_DIRECT buffer
 * allocated alike, calibration measures the rate the replay gets. Free with free(). */
void *cpu_store_dma_alloc(uint64_t bytes);

/* Reads `bytes` at file offset `off` into dst. Direct (O_DIRECT) when off, bytes and dst are
 * aligned, else through `bounce` ([bytes + 2 * CPU_STORE_ALIGN], aligned) and a copy. Returns
 * false on an I/O error (errno set). */
bool cpu_store_read(const cpu_store *s, uint64_t off, uint64_t bytes, uint8_t *dst,
                    uint8_t *bounce);

/* Reads the consecutive file range at `off` into n pieces (iov[i].iov_len bytes into
 * iov[i].iov_base, in file order): one O_DIRECT request (preadv) when every piece is aligned, as
 * an engine reads a chunk that spans two parts of an expert into their two blocks; else piece by
 * piece as cpu_store_read. Returns false on an I/O error (errno set). */
bool cpu_store_read_pieces(const cpu_store *s, uint64_t off, const struct iovec *iov, int n,
                           uint8_t *bounce);

#endif
