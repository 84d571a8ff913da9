/* Perfetto's protobuf trace format for core/timeline.c, encoded here (the wire format is small:
 * varints and length-delimited fields). Every track is its own packet sequence, so each has its
 * own default track (TrackEventDefaults) and its own incremental clock: a packet's timestamp is
 * the ns since the previous packet on its track, a byte or two. Names and categories are
 * interned (InternedData, emitted on a sequence the first time it uses them). Packets are
 * gathered into blocks of ~256 KiB and each block is written deflated as one compressed_packets
 * packet, which Perfetto's trace processor (and so the UI) inflates on load.
 *
 * Field numbers: protos/perfetto/trace/trace_packet.proto, track_event/track_event.proto,
 * track_event/track_descriptor.proto, clock_snapshot.proto, trace_packet_defaults.proto,
 * interned_data/interned_data.proto in the Perfetto repository. */
#ifndef MOESIM_CORE_TIMELINE_PROTO_H
#define MOESIM_CORE_TIMELINE_PROTO_H

#include <stdint.h>
#include <stdio.h>

typedef struct tl_proto tl_proto;

/* Starts a trace on `f` (borrowed): process `process`, thread tracks 1..counter_track-1 named
 * track_names[track], and `n_counters` counter tracks in bytes from `counter_track` on, named
 * track_names[track]. The first counter is described at once, the others when first sampled (so
 * a counter never sampled adds no empty track). `track_names` must outlive the writer. */
tl_proto *tl_proto_create(FILE *f, const char *process, const char *const *track_names,
                          int counter_track, int n_counters);
/* A slice [t0, t1) on thread track `track`. */
void tl_proto_slice(tl_proto *p, int track, const char *cat, const char *name, uint64_t t0_ns,
                    uint64_t t1_ns);
/* A sample of counter track `track`. */
void tl_proto_counter(tl_proto *p, int track, uint64_t t_ns, double value);
/* Writes what is still gathered; the file is then complete. */
void tl_proto_finish(tl_proto *p);
void tl_proto_destroy(tl_proto *p); /* accepts NULL */

/* Wire-format constants a reader of these files needs (tests/test_timeline.c decodes them). */
enum {
    TL_PB_TRACE_PACKET = 1,         /* Trace.packet */
    TL_PB_TIMESTAMP = 8,            /* TracePacket.timestamp */
    TL_PB_TRACK_EVENT = 11,         /* TracePacket.track_event */
    TL_PB_INTERNED_DATA = 12,       /* TracePacket.interned_data */
    TL_PB_SEQUENCE_ID = 10,         /* TracePacket.trusted_packet_sequence_id */
    TL_PB_SEQUENCE_FLAGS = 13,      /* TracePacket.sequence_flags */
    TL_PB_CLOCK_SNAPSHOT = 6,       /* TracePacket.clock_snapshot */
    TL_PB_COMPRESSED = 50,          /* TracePacket.compressed_packets */
    TL_PB_TIMESTAMP_CLOCK = 58,     /* TracePacket.timestamp_clock_id */
    TL_PB_PACKET_DEFAULTS = 59,     /* TracePacket.trace_packet_defaults */
    TL_PB_TRACK_DESCRIPTOR = 60,    /* TracePacket.track_descriptor */
    TL_PB_EVENT_CATEGORY_IIDS = 3,  /* TrackEvent.category_iids */
    TL_PB_EVENT_TYPE = 9,           /* TrackEvent.type */
    TL_PB_EVENT_NAME_IID = 10,      /* TrackEvent.name_iid */
    TL_PB_EVENT_TRACK_UUID = 11,    /* TrackEvent.track_uuid (and TrackEventDefaults') */
    TL_PB_EVENT_COUNTER_VALUE = 30, /* TrackEvent.counter_value */
    TL_PB_INTERNED_CATEGORIES = 1,  /* InternedData.event_categories */
    TL_PB_INTERNED_NAMES = 2,       /* InternedData.event_names */
    TL_PB_SLICE_BEGIN = 1,          /* TrackEvent.Type */
    TL_PB_SLICE_END = 2,
    TL_PB_COUNTER = 4,
    TL_PB_CLOCK_BOOTTIME = 6,  /* BuiltinClock: the trace clock */
    TL_PB_CLOCK_TIMELINE = 64, /* our sequence-scoped incremental clock (ids 64..127) */
};

#endif
