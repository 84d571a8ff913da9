/* The replay entry points of a build without CUDA (MOESIM_CUDA off): every GPU command fails
 * with one line saying so, after its arguments were checked. With CUDA, replay/run.cu,
 * replay/store.cu and replay/calibrate.cu define them. */
#include "replay/replay.h"

#include "common/check.h"

#ifndef MOESIM_HAVE_CUDA

#define NO_CUDA "built without CUDA (configure with -DMOESIM_CUDA=ON on a machine with nvcc)"

bool replay_built_with_cuda(void) { return false; }

moesim_status replay_device_check(moesim_error *err) {
    return moesim_fail(err, MOESIM_EINPUT, NO_CUDA);
}

moesim_status replay_run(const replay_inputs *in, const char *policy_name, config *settings,
                         sim_result *out, replay_checks *checks, moesim_error *err) {
    (void)in, (void)policy_name, (void)settings, (void)out, (void)checks;
    return moesim_fail(err, MOESIM_EINPUT, NO_CUDA);
}

moesim_status replay_store_create(const model_geometry *m, const quant_table *q,
                                  const char *host_precisions, moesim_precision primary,
                                  uint64_t dram_bytes, const char *ssd_dir, uint64_t seed,
                                  replay_store **out, moesim_error *err) {
    (void)m, (void)q, (void)host_precisions, (void)primary, (void)dram_bytes, (void)ssd_dir;
    (void)seed, (void)out;
    return moesim_fail(err, MOESIM_EINPUT, NO_CUDA);
}

moesim_status replay_store_create_checkpoint(const model_geometry *m, const quant_table *q,
                                             const char *host_precisions, moesim_precision primary,
                                             uint64_t dram_bytes, const char *ssd_dir,
                                             const replay_weights *w, replay_store **out,
                                             moesim_error *err) {
    (void)m, (void)q, (void)host_precisions, (void)primary, (void)dram_bytes, (void)ssd_dir;
    (void)w, (void)out;
    return moesim_fail(err, MOESIM_EINPUT, NO_CUDA);
}

void replay_store_destroy(replay_store *s) { (void)s; }

moesim_status replay_store_expert(const replay_store *s, uint32_t moe_layer, uint32_t expert,
                                  moesim_precision p, uint8_t *blob, moesim_error *err) {
    (void)s, (void)moe_layer, (void)expert, (void)p, (void)blob, (void)err;
    MOESIM_UNREACHABLE(); /* no store can be created without CUDA */
}

moesim_status calib_run(const calib_options *opt, calib_results *out, moesim_error *err) {
    (void)opt, (void)out;
    return moesim_fail(err, MOESIM_EINPUT, NO_CUDA);
}

#endif
