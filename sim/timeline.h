/* The Perfetto / Chrome trace-event timeline writer shared by the simulator (sim/sim.c) and the
 * GPU replay (replay/), so both write one schema: "X" slices on one track per stream (compute)
 * and copy engine (h2d, ssd), and a "C" counter for HBM use; timestamps in microseconds with
 * three decimals (ns resolution). Writes as the run goes, to a temporary file committed at the
 * end (aborted on failure). */
#ifndef MOESIM_SIM_TIMELINE_H
#define MOESIM_SIM_TIMELINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/atomic_file.h"
#include "common/status.h"

typedef struct sim_timeline {
    bool on;
    atomic_file af;
    bool first;
} sim_timeline;

enum sim_track { SIM_TRACK_COMPUTE = 1, SIM_TRACK_H2D = 2, SIM_TRACK_SSD = 3, SIM_TRACK_HBM = 4 };

/* Opens `path` for a run of the simulator (process name "moesim sim"). */
moesim_status sim_timeline_open(sim_timeline *tl, const char *path, moesim_error *err);
/* The same with another process name ("moesim replay"): the tracks are identical. */
moesim_status sim_timeline_open_as(sim_timeline *tl, const char *path, const char *process,
                                   moesim_error *err);
/* A complete slice [t0, t1) named `name` on `track`; `cat` is its category. */
void sim_timeline_slice(sim_timeline *tl, int track, const char *cat, const char *name,
                        uint64_t t0_ns, uint64_t t1_ns);
/* A counter sample (HBM use). */
void sim_timeline_counter(sim_timeline *tl, const char *name, uint64_t t_ns, double value);
moesim_status sim_timeline_close(sim_timeline *tl, moesim_error *err);
void sim_timeline_abort(sim_timeline *tl); /* no-op when not open */

#endif
