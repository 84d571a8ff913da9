/* The step schedule of a replay: the simulator's (core/schedule.h, sim/README.md "Steps, batch
 * and requests"), built with the model's KV bytes per token and recurrent-state bytes. Time does
 * not enter, so replay and sim run the same steps. */
#include "replay/replay.h"

void replay_schedule_build(replay_schedule *s, const trace *t, const model_geometry *m,
                           uint32_t batch) {
    sim_schedule_build(s, t, batch, model_kv_bytes_per_token(m), model_recurrent_state_bytes(m));
}

void replay_schedule_free(replay_schedule *s) { sim_schedule_free(s); }
