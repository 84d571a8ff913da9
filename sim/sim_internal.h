/* Internal state of one simulator run (sim/sim.c), shared with the timeline writer
 * (sim/timeline.c) and the result formatting (sim/result.c). Not part of the public API.
 *
 * Units: every time is integer ns since the run started; sizes are bytes.
 * Index conventions (shape comments below use them):
 *   le  = layer * E + expert                      (L * E entries)
 *   lep = le * PREC_COUNT + precision             (L * E * P)
 *   part index = lep * PART_COUNT + part          (L * E * P * 3) */
#ifndef MOESIM_SIM_SIM_INTERNAL_H
#define MOESIM_SIM_SIM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/atomic_file.h"

/* Chrome trace-event writer: one track (tid) per stream and copy engine. Writes as the run goes
 * (to a temporary file; committed at the end, aborted on failure). */
typedef struct sim_timeline {
    bool on;
    atomic_file af;
    bool first;
} sim_timeline;

enum sim_track { SIM_TRACK_COMPUTE = 1, SIM_TRACK_H2D = 2, SIM_TRACK_SSD = 3, SIM_TRACK_HBM = 4 };

moesim_status sim_timeline_open(sim_timeline *tl, const char *path, moesim_error *err);
/* A complete slice [t0, t1) named `name` on `track`; `cat` is its category. */
void sim_timeline_slice(sim_timeline *tl, int track, const char *cat, const char *name,
                        uint64_t t0_ns, uint64_t t1_ns);
/* A counter sample (HBM use). */
void sim_timeline_counter(sim_timeline *tl, const char *name, uint64_t t_ns, double value);
moesim_status sim_timeline_close(sim_timeline *tl, moesim_error *err);
void sim_timeline_abort(sim_timeline *tl);

#endif
