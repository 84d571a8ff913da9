/* The Perfetto / Chrome timeline writer shared by the simulator (sim/sim.c) and the GPU replay
 * (replay/), so both write one schema: slices on one track per stream (compute) and copy engine
 * (h2d, ssd), and counters of HBM use (all experts, and per precision), all in ns of the run's
 * clock. Writes as the run goes, to a temporary file committed at the end (aborted on failure).
 *
 * Formats, chosen by the file's name (sim/README.md, "Timelines", has their sizes):
 *   *.pftrace, *.perfetto-trace  Perfetto's protobuf trace (TrackEvent, interned names, times as
 *                                deltas, packets deflated in blocks: core/timeline_proto.c)
 *   *.json.gz                    the JSON below, gzip'd (one gzip member)
 *   anything else                Chrome trace-event JSON: "X" slices and "C" counter samples,
 *                                timestamps in microseconds with three decimals (ns, exact)
 *
 * A window keeps only the slices and counter samples that overlap a range of steps or of time;
 * slices are kept whole, and each counter's value when the window opens is repeated at its
 * start so the curve has no hole. Without a window the output does not depend on the window
 * code: the JSON is byte for byte what it was before windows existed. */
#ifndef MOESIM_CORE_TIMELINE_H
#define MOESIM_CORE_TIMELINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/atomic_file.h"
#include "common/precision.h"
#include "common/status.h"

typedef enum sim_timeline_window_kind {
    SIM_TIMELINE_ALL = 0, /* the whole run (a zeroed window) */
    SIM_TIMELINE_STEPS,   /* steps [from, to) */
    SIM_TIMELINE_NS,      /* times [from, to) ns */
} sim_timeline_window_kind;

typedef struct sim_timeline_window {
    sim_timeline_window_kind kind;
    uint64_t from, to; /* steps or ns; to = UINT64_MAX: to the end of the run */
} sim_timeline_window;

/* Parses "steps=A:B" (steps A to B-1) or "ms=A:B" ([A, B) ms, decimals allowed); either bound may
 * be left out ("steps=100:", "ms=:2.5"). Errors name the text and what was expected. */
moesim_status sim_timeline_window_parse(const char *text, sim_timeline_window *w,
                                        moesim_error *err);

typedef enum sim_timeline_format {
    SIM_TIMELINE_JSON,
    SIM_TIMELINE_JSON_GZ,
    SIM_TIMELINE_PROTO,
} sim_timeline_format;

/* The format `path`'s name selects. */
sim_timeline_format sim_timeline_format_of(const char *path);

struct sim_timeline_sink; /* timeline.c: buffered output, plain or gzip */
struct tl_proto;          /* timeline_proto.c: the protobuf encoder */

/* Tracks: slices on compute, h2d and ssd; counters from SIM_TRACK_HBM on: "hbm" (expert bytes in
 * HBM) and one per precision, "hbm <precision>" (SIM_TRACK_HBM_PREC(p): the bytes of experts held
 * at that precision, i.e. the pool blocks of each format, DynaExq's hi and lo pools). */
enum sim_track { SIM_TRACK_COMPUTE = 1, SIM_TRACK_H2D = 2, SIM_TRACK_SSD = 3, SIM_TRACK_HBM = 4 };
#define SIM_TRACK_HBM_PREC(p)  (SIM_TRACK_HBM + 1 + (int)(p))
#define SIM_TIMELINE_COUNTERS  (1 + PREC_COUNT)

typedef struct sim_timeline {
    bool on;
    atomic_file af;
    sim_timeline_format format;
    struct sim_timeline_sink *sink; /* JSON formats */
    struct tl_proto *proto;         /* protobuf format */
    /* window */
    sim_timeline_window window;
    bool lo_known, hi_known; /* [lo_ns, hi_ns) once known (a step window learns them as it runs) */
    uint64_t lo_ns, hi_ns;
    /* per counter (track - SIM_TRACK_HBM): the last sample before the window, if any */
    bool held[SIM_TIMELINE_COUNTERS];
    double held_value[SIM_TIMELINE_COUNTERS];
    uint64_t latest_ns; /* the latest time any event reached */
} sim_timeline;


/* Opens `path` for a run of the simulator (process name "moesim sim"); `window` may be NULL (the
 * whole run) and is copied. */
moesim_status sim_timeline_open(sim_timeline *tl, const char *path,
                                const sim_timeline_window *window, moesim_error *err);
/* The same with another process name ("moesim replay"): the tracks are identical. */
moesim_status sim_timeline_open_as(sim_timeline *tl, const char *path, const char *process,
                                   const sim_timeline_window *window, moesim_error *err);
/* Step `step` of the run starts at `t_ns` (call it for every step, in order, before the step's
 * events): how a step window finds its time range. No-op when off. */
void sim_timeline_step(sim_timeline *tl, uint64_t step, uint64_t t_ns);
/* A complete slice [t0, t1) named `name` on `track`; `cat` is its category. */
void sim_timeline_slice(sim_timeline *tl, int track, const char *cat, const char *name,
                        uint64_t t0_ns, uint64_t t1_ns);
/* A sample of counter `track` (SIM_TRACK_HBM or SIM_TRACK_HBM_PREC(p)), in bytes. */
void sim_timeline_counter(sim_timeline *tl, int track, uint64_t t_ns, double value);
/* What the per-precision HBM counters last showed (the caller's, zeroed at the start). */
typedef struct sim_timeline_hbm_shown {
    uint64_t bytes[PREC_COUNT];
    uint32_t tracks; /* bit p: "hbm <p>" has been written */
} sim_timeline_hbm_shown;

/* The HBM counters after a change: "hbm" = `experts_used`, and "hbm <p>" ([PREC_COUNT]
 * `prec_used`) where its bytes moved since last shown. A precision's counter starts once it holds
 * bytes that differ from the total (another precision is held too): a run at one precision writes
 * the "hbm" counter alone, as before the per-precision counters existed. No-op when off. */
void sim_timeline_hbm(sim_timeline *tl, uint64_t t_ns, uint64_t experts_used,
                      const uint64_t prec_used[PREC_COUNT], sim_timeline_hbm_shown *shown);
moesim_status sim_timeline_close(sim_timeline *tl, moesim_error *err);
void sim_timeline_abort(sim_timeline *tl); /* no-op when not open */

#endif
