/* Internal state of one simulator run (sim/sim.c), shared with the timeline writer
 * (core/timeline.c) and the result formatting (core/result.c). Not part of the public API.
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


#include "core/timeline.h"

#endif
