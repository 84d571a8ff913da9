/* The cuda backend's host store (replay/store.cu), shared by the run (run.cu): the layout the
 * copy engines read from. Experts are blobs [gate | up | down] in the kernels' formats, one per
 * (MoE layer, expert) and held precision; a blob is either in pinned DRAM (host_off) or in the
 * precision's SSD file (ssd_off, SSD_ALIGN-aligned slots). Units: bytes. C++ (CUDA) only;
 * include after replay/replay.h and core/memsys.h. */
#ifndef MOESIM_REPLAY_STORE_CUH
#define MOESIM_REPLAY_STORE_CUH

#include <stdbool.h>
#include <stdint.h>

#define SSD_ALIGN 4096ull /* O_DIRECT: offsets, sizes and buffers aligned to this */

struct replay_store {
    model_geometry m;
    const replay_weights *weights; /* the checkpoint the experts come from, or NULL: random */
    bool held[PREC_COUNT];         /* precisions the store holds (the placement's order) */
    uint64_t dev_part_bytes[PREC_COUNT][PART_COUNT]; /* kernel format bytes of one part */
    uint64_t blob_bytes[PREC_COUNT];                 /* gate | up | down of one expert */
    uint64_t *host_off[PREC_COUNT];  /* [L*E] offset in host[p], or UINT64_MAX: on the SSD */
    uint8_t *host[PREC_COUNT];       /* pinned DRAM experts, blob_bytes each, packed */
    uint64_t ssd_stride[PREC_COUNT]; /* blob_bytes rounded up to SSD_ALIGN */
    uint64_t *ssd_off[PREC_COUNT];   /* [L*E] offset in the SSD file of p, or UINT64_MAX */
    int ssd_fd[PREC_COUNT];          /* O_DIRECT read descriptor, or -1 */
    char ssd_path[PREC_COUNT][600];
    uint64_t n_on_ssd;
};

/* Seeded random bytes: bf16 pairs and quant codes whose values are finite. */
void replay_fill_random(void *p, size_t bytes, uint64_t seed);

/* The precisions host placement orders for a policy (memsys_place_for_policy), which the store
 * must hold: those it declares it loads (`fallback`, expert.precision, when it declares none),
 * and unless `policy_only` every other stored one (bytes in `part_bytes`). */
void replay_placed_precisions(const policy_methods *pm, const policy *pol,
                              moesim_precision fallback, bool policy_only,
                              const uint64_t part_bytes[][PART_COUNT], bool held[PREC_COUNT]);

/* Makes the store of a placement: the precisions in `held`, each expert in pinned DRAM or in the
 * SSD file as `on_ssd` ([L*E*PREC_COUNT], memsys's lep order) says; experts from `w`, or random
 * from `seed` when w is NULL. Caller owns; replay_store_destroy. */
moesim_status replay_store_make(const model_geometry *m, const bool held[PREC_COUNT],
                                const uint8_t *on_ssd, const char *ssd_dir, uint64_t seed,
                                const replay_weights *w, replay_store **out, moesim_error *err);

#endif
