/* The cuda backend's host store (replay/store.cuh, replay.h: replay_store_*): every expert of
 * the model at the formats host placement orders, in pinned DRAM (cudaHostAlloc) while the
 * placement's DRAM lasts and in an SSD file read with O_DIRECT for the rest; the checkpoint's
 * experts in the kernels' formats, or seeded random bytes. */
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The project's C headers spell two C11 keywords that C++ writes differently. */
#define _Noreturn [[noreturn]]
#define _Static_assert static_assert
extern "C" {
#include "common/alloc.h"
#include "common/check.h"
#include "kernels/quant.h"
#include "replay/exec.h"
#include "replay/replay.h"
#include "core/memsys.h"
}
#include "replay/store.cuh"

#define GIB       1073741824.0
#define FILL_TILE (64ull << 20) /* random bytes are made once per tile and repeated */

void replay_fill_random(void *p, size_t bytes, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1, *w = (uint64_t *)p;
    for (size_t i = 0; i < bytes / 8; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        /* bf16 pairs and quant codes: keep exponents small so no value is inf or NaN */
        w[i] = (s * 0x2545f4914f6cdd1dull) & 0x3f7f3f7f3f7f3f7full;
    }
}

/* Random weights: a seeded tile repeated over the buffer (timing depends on bytes, not values;
 * making 60 GB of fresh random numbers would dominate a validation run). */
static void fill_tiled(uint8_t *p, uint64_t bytes, uint64_t seed) {
    uint64_t tile = bytes < FILL_TILE ? bytes : FILL_TILE;
    replay_fill_random(p, tile, seed);
    for (uint64_t o = tile; o < bytes; o += tile)
        memcpy(p + o, p, bytes - o < tile ? bytes - o : tile);
}

/* Writes the SSD file of precision p: n blobs at ssd_stride, the experts from index `le_first`
 * of the checkpoint (a batch of blobs at a time), or random bytes (one tile repeated); then
 * reopens it for O_DIRECT reads. */
static moesim_status ssd_file_make(replay_store *r, int p, uint64_t le_first, uint64_t n,
                                   const char *dir, uint64_t seed, moesim_error *err) {
    snprintf(r->ssd_path[p], sizeof r->ssd_path[p], "%s/moesim-replay-ssd-%d-%s.bin", dir,
             (int)getpid(), precision_name((moesim_precision)p));
    int fd = open(r->ssd_path[p], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot create the SSD store (%s)", r->ssd_path[p],
                           strerror(errno));
    uint64_t stride = r->ssd_stride[p], bytes = n * stride;
    /* a tile of whole blobs for checkpoint experts, so batch b is blobs [b * per, ...) */
    uint64_t per = FILL_TILE / stride ? FILL_TILE / stride : 1;
    uint64_t tile = r->weights ? per * stride : FILL_TILE;
    if (tile > bytes) tile = bytes;
    uint8_t *buf = (uint8_t *)moesim_xcalloc(1, tile);
    if (!r->weights) replay_fill_random(buf, tile, seed);
    for (uint64_t o = 0; o < bytes;) {
        uint64_t want = bytes - o < tile ? bytes - o : tile;
        if (r->weights)
            replay_weights_experts(r->weights, (moesim_precision)p, le_first + o / stride,
                                   want / stride, buf, stride);
        for (uint64_t done = 0; done < want;) {
            ssize_t w = pwrite(fd, buf + done, want - done, (off_t)(o + done));
            if (w <= 0) {
                free(buf);
                close(fd);
                return moesim_fail(err, MOESIM_EIO, "%s: write failed after %" PRIu64 " bytes (%s)",
                                   r->ssd_path[p], o + done, strerror(errno));
            }
            done += (uint64_t)w;
        }
        o += want;
    }
    free(buf);
    if (fsync(fd) || close(fd))
        return moesim_fail(err, MOESIM_EIO, "%s: %s", r->ssd_path[p], strerror(errno));
    r->ssd_fd[p] = open(r->ssd_path[p], O_RDONLY | O_DIRECT);
    if (r->ssd_fd[p] < 0)
        return moesim_fail(err, MOESIM_EIO,
                           "%s: cannot open with O_DIRECT (%s); put the SSD store on a disk "
                           "file system (tmpfs may refuse O_DIRECT)",
                           r->ssd_path[p], strerror(errno));
    return MOESIM_OK;
}

/* The simulator's bytes of one part at each stored precision (pools and placement count these). */
static void accounting_part_bytes(const model_geometry *m, const quant_table *q,
                                  const bool stored[PREC_COUNT],
                                  uint64_t out[PREC_COUNT][PART_COUNT]) {
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT; part++)
            out[p][part] = stored[p] ? model_expert_part_bytes(m, q, (expert_part)part,
                                                               (moesim_precision)p)
                                     : 0;
}

/* The precisions host placement orders for a policy (memsys_place_for_policy), which the store
 * must hold: those it declares it loads (`fallback`, expert.precision, when it declares none),
 * and unless `policy_only` every other stored one (bytes in `part_bytes`). */
void replay_placed_precisions(const policy_methods *pm, const policy *pol,
                              moesim_precision fallback, bool policy_only,
                              const uint64_t part_bytes[][PART_COUNT], bool held[PREC_COUNT]) {
    moesim_precision order[PREC_COUNT];
    uint32_t n = pm->load_precisions ? pm->load_precisions(pol, order) : 0;
    if (!n) order[n++] = fallback;
    for (int p = 0; p < PREC_COUNT; p++) held[p] = !policy_only && part_bytes[p][0] > 0;
    for (uint32_t i = 0; i < n; i++) held[order[i]] = part_bytes[order[i]][0] > 0;
}

/* Makes the store of a placement: the precisions in `held`, each expert in pinned DRAM or in the
 * SSD file as `on_ssd` ([L*E*PREC_COUNT], memsys_lep order) says; experts from `w`, or random
 * from `seed` when w is NULL. */
moesim_status replay_store_make(const model_geometry *m, const bool held[PREC_COUNT],
                                const uint8_t *on_ssd, const char *ssd_dir, uint64_t seed,
                                const replay_weights *w, replay_store **out, moesim_error *err) {
    moesim_status st = replay_device_check(err);
    if (st) return st;
    replay_store *r = (replay_store *)moesim_xcalloc(1, sizeof *r);
    r->m = *m;
    r->weights = w;
    for (int p = 0; p < PREC_COUNT; p++) r->ssd_fd[p] = -1;
    memcpy(r->held, held, sizeof r->held);
    size_t LE = (size_t)m->n_moe_layers * m->n_experts;
    for (int p = 0; p < PREC_COUNT; p++)
        for (int part = 0; part < PART_COUNT && r->held[p]; part++) {
            uint64_t cols = part == PART_DOWN ? m->expert_inter : m->hidden;
            if (p != PREC_BF16 && cols % QUANT_GROUP) {
                replay_store_destroy(r);
                return moesim_fail(err, MOESIM_EINPUT,
                                   "model '%s': width %" PRIu64 " is not a multiple of the %d-wide "
                                   "quantization groups of the %s kernels",
                                   m->name, cols, QUANT_GROUP, precision_name((moesim_precision)p));
            }
            r->dev_part_bytes[p][part] =
                replay_part_bytes(m, (moesim_precision)p, (expert_part)part);
            r->blob_bytes[p] += r->dev_part_bytes[p][part];
        }
    uint64_t host_bytes[PREC_COUNT] = {0}, n_ssd[PREC_COUNT] = {0};
    for (int p = 0; p < PREC_COUNT; p++) {
        if (!r->held[p]) continue;
        r->host_off[p] = (uint64_t *)moesim_xmalloc(LE * sizeof(uint64_t));
        r->ssd_off[p] = (uint64_t *)moesim_xmalloc(LE * sizeof(uint64_t));
        r->ssd_stride[p] = (r->blob_bytes[p] + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
        for (size_t le = 0; le < LE; le++) {
            if (!on_ssd[memsys_lep_of(LE, le, p)]) {
                r->host_off[p][le] = host_bytes[p];
                r->ssd_off[p][le] = UINT64_MAX;
                host_bytes[p] += r->blob_bytes[p];
            } else {
                r->host_off[p][le] = UINT64_MAX;
                r->ssd_off[p][le] = n_ssd[p]++ * r->ssd_stride[p];
            }
        }
        /* placement fills DRAM in (layer, expert) order: the experts in DRAM are a prefix, the
         * SSD file holds the rest in order (what filling them from a checkpoint relies on) */
        MOESIM_ASSERT(!n_ssd[p] || r->ssd_off[p][LE - n_ssd[p]] == 0);
        r->n_on_ssd += n_ssd[p];
    }
    for (int p = 0; p < PREC_COUNT; p++) {
        if (host_bytes[p]) {
            if (cudaHostAlloc((void **)&r->host[p], host_bytes[p], cudaHostAllocDefault) !=
                cudaSuccess) {
                cudaGetLastError();
                replay_store_destroy(r);
                return moesim_fail(err, MOESIM_ENOMEM,
                                   "cannot pin %.2f GiB of host memory for the %s experts (the "
                                   "profile's dram_gib decides how much is kept in DRAM)",
                                   host_bytes[p] / GIB, precision_name((moesim_precision)p));
            }
            if (w)
                replay_weights_experts(w, (moesim_precision)p, 0, LE - n_ssd[p], r->host[p],
                                       r->blob_bytes[p]);
            else
                fill_tiled(r->host[p], host_bytes[p], seed * 131 + (uint64_t)p);
        }
        if (n_ssd[p] && (st = ssd_file_make(r, p, LE - n_ssd[p], n_ssd[p],
                                            ssd_dir ? ssd_dir : "/var/tmp", seed * 131 + p, err))) {
            replay_store_destroy(r);
            return st;
        }
    }
    *out = r;
    return MOESIM_OK;
}

/* The store sim.host_precisions gives a policy that loads `primary` alone (no load_precisions):
 * placed by memsys_place_for_policy in `dram_bytes`. */
static moesim_status store_for_settings(const model_geometry *m, const quant_table *q,
                                        const char *host_precisions, moesim_precision primary,
                                        uint64_t dram_bytes, const char *ssd_dir, uint64_t seed,
                                        const replay_weights *w, replay_store **out,
                                        moesim_error *err) {
    bool stored[PREC_COUNT], policy_only;
    moesim_status st =
        replay_exec_host_precisions(host_precisions, primary, stored, &policy_only, err);
    if (st) return st;
    memsys_config mc;
    memset(&mc, 0, sizeof mc);
    mc.n_layers = m->n_moe_layers;
    mc.n_experts = m->n_experts;
    accounting_part_bytes(m, q, stored, mc.part_bytes);
    memsys_host none;
    memset(&none, 0, sizeof none);
    memsys ms;
    memsys_init(&ms, &mc, &none);
    policy_methods primary_only; /* declares nothing: expert.precision alone */
    memset(&primary_only, 0, sizeof primary_only);
    memsys_place_for_policy(&ms, &primary_only, NULL, primary, policy_only, dram_bytes);
    bool held[PREC_COUNT];
    replay_placed_precisions(&primary_only, NULL, primary, policy_only, mc.part_bytes, held);
    st = replay_store_make(m, held, ms.on_ssd, ssd_dir, seed, w, out, err);
    memsys_free(&ms);
    return st;
}

extern "C" moesim_status replay_store_create(const model_geometry *m, const quant_table *q,
                                             const char *host_precisions, moesim_precision primary,
                                             uint64_t dram_bytes, const char *ssd_dir,
                                             uint64_t seed, replay_store **out, moesim_error *err) {
    return store_for_settings(m, q, host_precisions, primary, dram_bytes, ssd_dir, seed, NULL, out,
                              err);
}

extern "C" moesim_status
replay_store_create_checkpoint(const model_geometry *m, const quant_table *q,
                               const char *host_precisions, moesim_precision primary,
                               uint64_t dram_bytes, const char *ssd_dir, const replay_weights *w,
                               replay_store **out, moesim_error *err) {
    MOESIM_ASSERT(w);
    return store_for_settings(m, q, host_precisions, primary, dram_bytes, ssd_dir, 0, w, out, err);
}

extern "C" moesim_status replay_store_expert(const replay_store *r, uint32_t moe_layer,
                                             uint32_t expert, moesim_precision p, uint8_t *blob,
                                             moesim_error *err) {
    MOESIM_ASSERT(moe_layer < r->m.n_moe_layers && expert < r->m.n_experts);
    if ((unsigned)p >= PREC_COUNT || !r->held[p])
        return moesim_fail(err, MOESIM_EINPUT, "the store holds no %s experts", precision_name(p));
    const size_t le = (size_t)moe_layer * r->m.n_experts + expert;
    if (r->host_off[p][le] != UINT64_MAX) {
        memcpy(blob, r->host[p] + r->host_off[p][le], r->blob_bytes[p]);
        return MOESIM_OK;
    }
    /* a plain descriptor: O_DIRECT would want an aligned buffer and length */
    int fd = open(r->ssd_path[p], O_RDONLY);
    uint64_t done = 0;
    while (fd >= 0 && done < r->blob_bytes[p]) {
        ssize_t n =
            pread(fd, blob + done, r->blob_bytes[p] - done, (off_t)(r->ssd_off[p][le] + done));
        if (n <= 0) break;
        done += (uint64_t)n;
    }
    int e = errno;
    if (fd >= 0) close(fd);
    if (done < r->blob_bytes[p])
        return moesim_fail(err, MOESIM_EIO, "%s: cannot read expert %u of MoE layer %u (%s)",
                           r->ssd_path[p], expert, moe_layer,
                           fd < 0 || e ? strerror(e) : "short file");
    return MOESIM_OK;
}

extern "C" void replay_store_destroy(replay_store *r) {
    if (!r) return;
    for (int p = 0; p < PREC_COUNT; p++) {
        if (r->host[p]) cudaFreeHost(r->host[p]);
        free(r->host_off[p]);
        free(r->ssd_off[p]);
        if (r->ssd_fd[p] >= 0) close(r->ssd_fd[p]);
        if (r->ssd_path[p][0]) unlink(r->ssd_path[p]);
    }
    free(r);
}

