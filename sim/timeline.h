/* The Perfetto / Chrome timeline writer shared by the simulator (sim/sim.c) and the GPU replay
 * (replay/), so both write one schema: slices on one track per stream (compute) and copy engine
 * (h2d, ssd), and a counter for HBM use, all in ns of the run's clock. Writes as the run goes,
 * to a temporary file committed at the end (aborted on failure).
 *
 * Formats, chosen by the file's name (sim/README.md, "Timelines", has their sizes):
 *   *.pftrace, *.perfetto-trace  Perfetto's protobuf trace (TrackEvent, interned names, times as
 *                                deltas, packets deflated in blocks: sim/timeline_proto.c)
 *   *.json.gz                    the JSON below, gzip'd (one gzip member)
 *   anything else                Chrome trace-event JSON: "X" slices and "C" counter samples,
 *                                timestamps in microseconds with three decimals (ns, exact)
 *
 * A window keeps only the slices and counter samples that overlap a range of steps or of time;
 * slices are kept whole, and the HBM counter's value when the window opens is repeated at its
 * start so the curve has no hole. Without a window the output does not depend on the window
 * code: the JSON is byte for byte what it was before windows existed. */
#ifndef MOESIM_SIM_TIMELINE_H
#define MOESIM_SIM_TIMELINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/atomic_file.h"
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
    const char *held_name; /* the last counter sample before the window (borrowed name), or NULL */
    double held_value;
    uint64_t latest_ns; /* the latest time any event reached */
} sim_timeline;

enum sim_track { SIM_TRACK_COMPUTE = 1, SIM_TRACK_H2D = 2, SIM_TRACK_SSD = 3, SIM_TRACK_HBM = 4 };

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
/* A counter sample (HBM use); `name` must outlive the timeline (a string literal). */
void sim_timeline_counter(sim_timeline *tl, const char *name, uint64_t t_ns, double value);
moesim_status sim_timeline_close(sim_timeline *tl, moesim_error *err);
void sim_timeline_abort(sim_timeline *tl); /* no-op when not open */

#endif
