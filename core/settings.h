/* The settings of a run that every host reads the same way (sections memory, cache, expert,
 * batch, predictor and sim of a `config`): the simulator (sim/sim.c) and the replay
 * (replay/exec.c) read them with one field table, so both run the same setup from the same
 * config and reject the same mistakes with the same message. Each default cites its source. */
#ifndef MOESIM_CORE_SETTINGS_H
#define MOESIM_CORE_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/status.h"

/* The settings of sections memory, cache, expert, batch, predictor and sim, read by sim_run and
 * by the GPU replay (replay/replay.h) from the same config, so both run the same setup. */
typedef struct sim_settings {
    double budget_gb;           /* memory.budget_gb (0: the profile's memory) */
    uint32_t experts_per_layer; /* cache.experts_per_layer */
    int precision;              /* expert.precision */
    uint32_t batch_size;        /* batch.size */
    double predictor_accuracy;  /* predictor.accuracy */
    uint32_t predictor_depth;   /* predictor.depth */
    uint64_t chunk_kib;         /* sim.chunk_kib */
    bool part_overlap;          /* sim.part_overlap */
    uint64_t seed;              /* sim.seed */
    char host_precisions[128];  /* sim.host_precisions */
    uint64_t bounce_mib;        /* sim.bounce_mib */
    bool block_pools;           /* sim.block_pools */
    char cost_table[512];       /* sim.cost_table */
} sim_settings;

/* The settings sim_run reads (sections memory, cache, expert, batch, predictor, sim), for --help
 * listings; *n receives the count. Static storage. */
const config_field *sim_settings_fields(size_t *n);
/* Reads (and marks used) those settings from `c`, defaults filled in; errors name the origin. */
moesim_status sim_settings_read(config *c, sim_settings *out, moesim_error *err);

#endif
