/* The Perfetto protobuf timeline writer; see timeline_proto.h for the layout. Encoding only:
 * nested messages are built inside out in scratch buffers that live as long as the writer. */
#include "core/timeline_proto.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/hash.h"

#define TL_MAX_TRACKS  16           /* sequences 1..counter_track + n_counters - 1 */
#define TL_BLOCK_BYTES (256u << 10) /* packets per compressed_packets (Perfetto: < 512 KB each) */

enum { WIRE_VARINT = 0, WIRE_BYTES = 2 };
enum { SEQ_INCREMENTAL_STATE_CLEARED = 1, SEQ_NEEDS_INCREMENTAL_STATE = 2 };
enum { UNIT_SIZE_BYTES = 3 }; /* CounterDescriptor.Unit */

/* ---- a growing byte buffer with the protobuf primitives ---- */

typedef struct pb {
    uint8_t *p;
    size_t n, cap;
} pb;

static void pb_need(pb *b, size_t more) {
    if (b->n + more <= b->cap) return;
    b->cap = (b->n + more) * 2;
    b->p = moesim_xrealloc(b->p, b->cap);
}

static void pb_varint(pb *b, uint64_t v) {
    pb_need(b, 10);
    while (v >= 0x80) {
        b->p[b->n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    b->p[b->n++] = (uint8_t)v;
}

static void pb_uint(pb *b, uint32_t field, uint64_t v) {
    pb_varint(b, (uint64_t)field << 3 | WIRE_VARINT);
    pb_varint(b, v);
}

static void pb_bytes(pb *b, uint32_t field, const void *data, size_t n) {
    pb_varint(b, (uint64_t)field << 3 | WIRE_BYTES);
    pb_varint(b, n);
    pb_need(b, n);
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void pb_str(pb *b, uint32_t field, const char *s) { pb_bytes(b, field, s, strlen(s)); }
static void pb_msg(pb *b, uint32_t field, const pb *m) { pb_bytes(b, field, m->p, m->n); }

/* ---- interning: a string's iid, and on which sequences it has been emitted ---- */

typedef struct intern_entry {
    char *s; /* NULL: empty slot */
    uint64_t iid;
    uint32_t emitted; /* bit per sequence */
} intern_entry;

typedef struct intern_table {
    intern_entry *slot; /* [cap], open addressing, cap a power of two */
    size_t n, cap;
} intern_table;

static intern_entry *intern_find(intern_table *t, const char *s) {
    if (2 * (t->n + 1) > t->cap) { /* grow: keep at most half full */
        intern_table g = {moesim_xcalloc(t->cap ? 2 * t->cap : 64, sizeof *g.slot), t->n,
                          t->cap ? 2 * t->cap : 64};
        for (size_t i = 0; i < t->cap; i++) {
            if (!t->slot[i].s) continue;
            size_t j = hash_fnv1a64_str(t->slot[i].s, MOESIM_FNV1A64_INIT) & (g.cap - 1);
            while (g.slot[j].s) j = (j + 1) & (g.cap - 1);
            g.slot[j] = t->slot[i];
        }
        free(t->slot);
        *t = g;
    }
    size_t j = hash_fnv1a64_str(s, MOESIM_FNV1A64_INIT) & (t->cap - 1);
    while (t->slot[j].s && strcmp(t->slot[j].s, s)) j = (j + 1) & (t->cap - 1);
    if (!t->slot[j].s) {
        t->slot[j].s = moesim_xstrdup(s);
        t->slot[j].iid = ++t->n; /* iids count from 1 (0 means unset) */
    }
    return &t->slot[j];
}

static void intern_free(intern_table *t) {
    for (size_t i = 0; i < t->cap; i++) free(t->slot[i].s);
    free(t->slot);
}

/* ---- the writer ---- */

struct tl_proto {
    FILE *f;
    const char *const *track_names;
    int counter_track, n_counters;
    uint32_t described; /* bit per track: its TrackDescriptor and sequence start are written */
    uint64_t last_ns[TL_MAX_TRACKS]; /* the incremental clock of each sequence */
    intern_table names, cats;
    pb block;                   /* Trace.packet fields gathered for the next compressed block */
    pb packet, event, interned; /* scratch: the packet being built and its parts */
    pb item, wrapper;
    uint8_t *z; /* [compressBound(TL_BLOCK_BYTES + one packet)] deflated block */
    size_t z_cap;
};

static uint64_t track_uuid(int track) { return 1 + (uint64_t)track; } /* 1: the process */

static void block_flush(tl_proto *p) {
    if (!p->block.n) return;
    uLongf zn = compressBound(p->block.n);
    if (zn > p->z_cap) {
        p->z_cap = zn;
        p->z = moesim_xrealloc(p->z, zn);
    }
    /* zlib-wrapped deflate, as Perfetto's own writer makes (its reader takes zlib or gzip) */
    MOESIM_ASSERT(compress2(p->z, &zn, p->block.p, p->block.n, 6) == Z_OK);
    p->wrapper.n = 0;
    pb_bytes(&p->wrapper, TL_PB_COMPRESSED, p->z, zn);
    p->item.n = 0;
    pb_msg(&p->item, TL_PB_TRACE_PACKET, &p->wrapper);
    fwrite(p->item.p, 1, p->item.n, p->f);
    p->block.n = 0;
}

/* Appends the packet built in p->packet to the block. */
static void packet_done(tl_proto *p) {
    pb_msg(&p->block, TL_PB_TRACE_PACKET, &p->packet);
    p->packet.n = 0;
    if (p->block.n >= TL_BLOCK_BYTES) block_flush(p);
}

/* A packet's timestamp on `seq`: the delta on the sequence's incremental clock, or, in the rare
 * case of a time before the sequence's last one, the absolute time on the trace clock. */
static void packet_time(tl_proto *p, int seq, uint64_t t_ns) {
    if (t_ns >= p->last_ns[seq]) {
        pb_uint(&p->packet, TL_PB_TIMESTAMP, t_ns - p->last_ns[seq]);
        p->last_ns[seq] = t_ns;
    } else {
        pb_uint(&p->packet, TL_PB_TIMESTAMP, t_ns);
        pb_uint(&p->packet, TL_PB_TIMESTAMP_CLOCK, TL_PB_CLOCK_BOOTTIME);
    }
}

static void packet_start(tl_proto *p, int seq, uint64_t t_ns) {
    p->packet.n = 0;
    packet_time(p, seq, t_ns);
    pb_uint(&p->packet, TL_PB_SEQUENCE_ID, (uint64_t)seq);
    pb_uint(&p->packet, TL_PB_SEQUENCE_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE);
}

/* The first packet of sequence `seq`: its clock (64, incremental, 0 = the trace clock's 0) and
 * its defaults (that clock, and `seq`'s track for every TrackEvent). */
static void sequence_start(tl_proto *p, int seq) {
    pb *clock = &p->item, *snapshot = &p->wrapper, *defaults = &p->event, *te = &p->interned;
    snapshot->n = 0;
    clock->n = 0;
    pb_uint(clock, 1, TL_PB_CLOCK_TIMELINE); /* Clock.clock_id */
    pb_uint(clock, 2, 0);                    /* Clock.timestamp */
    pb_uint(clock, 3, 1);                    /* Clock.is_incremental */
    pb_msg(snapshot, 1, clock);              /* ClockSnapshot.clocks */
    clock->n = 0;
    pb_uint(clock, 1, TL_PB_CLOCK_BOOTTIME);
    pb_uint(clock, 2, 0);
    pb_msg(snapshot, 1, clock);
    te->n = 0;
    pb_uint(te, TL_PB_EVENT_TRACK_UUID, track_uuid(seq));
    defaults->n = 0;
    pb_uint(defaults, TL_PB_TIMESTAMP_CLOCK, TL_PB_CLOCK_TIMELINE);
    pb_msg(defaults, 11, te); /* TracePacketDefaults.track_event_defaults */
    p->packet.n = 0;
    pb_uint(&p->packet, TL_PB_SEQUENCE_ID, (uint64_t)seq);
    pb_uint(&p->packet, TL_PB_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED);
    pb_msg(&p->packet, TL_PB_CLOCK_SNAPSHOT, snapshot);
    pb_msg(&p->packet, TL_PB_PACKET_DEFAULTS, defaults);
    packet_done(p);
}

/* A TrackDescriptor packet: the process (track 0), a thread track, or a counter track. */
static void describe_track(tl_proto *p, int track, const char *name) {
    pb *desc = &p->event, *inner = &p->item;
    desc->n = 0;
    inner->n = 0;
    pb_uint(desc, 1, track_uuid(track)); /* TrackDescriptor.uuid */
    if (track == 0) {
        pb_uint(inner, 1, 1);   /* ProcessDescriptor.pid */
        pb_str(inner, 6, name); /* ProcessDescriptor.process_name */
        pb_msg(desc, 3, inner); /* TrackDescriptor.process */
    } else if (track >= p->counter_track) {
        pb_uint(desc, 5, track_uuid(0));    /* TrackDescriptor.parent_uuid: the process */
        pb_str(desc, 2, name);              /* TrackDescriptor.name */
        pb_uint(inner, 3, UNIT_SIZE_BYTES); /* CounterDescriptor.unit */
        pb_msg(desc, 8, inner);             /* TrackDescriptor.counter */
    } else {
        pb_uint(inner, 1, 1);               /* ThreadDescriptor.pid */
        pb_uint(inner, 2, (uint64_t)track); /* ThreadDescriptor.tid: the JSON's tid */
        pb_str(inner, 5, name);             /* ThreadDescriptor.thread_name */
        pb_msg(desc, 4, inner);             /* TrackDescriptor.thread */
    }
    p->packet.n = 0;
    pb_msg(&p->packet, TL_PB_TRACK_DESCRIPTOR, desc);
    packet_done(p);
}

/* The track's descriptor and the start of its sequence, once. */
static void track_open(tl_proto *p, int track) {
    if (p->described & 1u << track) return;
    p->described |= 1u << track;
    describe_track(p, track, p->track_names[track]);
    sequence_start(p, track);
}

tl_proto *tl_proto_create(FILE *f, const char *process, const char *const *track_names,
                          int counter_track, int n_counters) {
    MOESIM_ASSERT(counter_track > 0 && n_counters > 0 &&
                  counter_track + n_counters <= TL_MAX_TRACKS);
    tl_proto *p = moesim_xcalloc(1, sizeof *p);
    p->f = f;
    p->track_names = track_names;
    p->counter_track = counter_track;
    p->n_counters = n_counters;
    describe_track(p, 0, process);
    for (int t = 1; t <= counter_track; t++) track_open(p, t);
    return p;
}

/* The iid of `s` in `t`; adds it to the packet's InternedData (field `field`) the first time
 * sequence `seq` uses it. */
static uint64_t intern(tl_proto *p, intern_table *t, uint32_t field, int seq, const char *s) {
    intern_entry *e = intern_find(t, s);
    if (!(e->emitted & 1u << seq)) {
        e->emitted |= 1u << seq;
        p->item.n = 0;
        pb_uint(&p->item, 1, e->iid); /* EventCategory / EventName .iid */
        pb_str(&p->item, 2, s);       /* .name */
        pb_msg(&p->interned, field, &p->item);
    }
    return e->iid;
}

void tl_proto_slice(tl_proto *p, int track, const char *cat, const char *name, uint64_t t0_ns,
                    uint64_t t1_ns) {
    MOESIM_ASSERT(track > 0 && track < p->counter_track);
    p->interned.n = 0;
    uint64_t cat_iid = intern(p, &p->cats, TL_PB_INTERNED_CATEGORIES, track, cat);
    uint64_t name_iid = intern(p, &p->names, TL_PB_INTERNED_NAMES, track, name);
    packet_start(p, track, t0_ns);
    if (p->interned.n) pb_msg(&p->packet, TL_PB_INTERNED_DATA, &p->interned);
    p->event.n = 0;
    pb_uint(&p->event, TL_PB_EVENT_CATEGORY_IIDS, cat_iid);
    pb_uint(&p->event, TL_PB_EVENT_TYPE, TL_PB_SLICE_BEGIN);
    pb_uint(&p->event, TL_PB_EVENT_NAME_IID, name_iid);
    pb_msg(&p->packet, TL_PB_TRACK_EVENT, &p->event);
    packet_done(p);

    packet_start(p, track, t1_ns);
    p->event.n = 0;
    pb_uint(&p->event, TL_PB_EVENT_TYPE, TL_PB_SLICE_END);
    pb_msg(&p->packet, TL_PB_TRACK_EVENT, &p->event);
    packet_done(p);
}

void tl_proto_counter(tl_proto *p, int track, uint64_t t_ns, double value) {
    MOESIM_ASSERT(track >= p->counter_track && track < p->counter_track + p->n_counters);
    track_open(p, track);
    packet_start(p, track, t_ns);
    p->event.n = 0;
    pb_uint(&p->event, TL_PB_EVENT_TYPE, TL_PB_COUNTER);
    pb_uint(&p->event, TL_PB_EVENT_COUNTER_VALUE, (uint64_t)llround(value)); /* bytes, >= 0 */
    pb_msg(&p->packet, TL_PB_TRACK_EVENT, &p->event);
    packet_done(p);
}

void tl_proto_finish(tl_proto *p) { block_flush(p); }

void tl_proto_destroy(tl_proto *p) {
    if (!p) return;
    intern_free(&p->names);
    intern_free(&p->cats);
    pb *bufs[] = {&p->block, &p->packet, &p->event, &p->interned, &p->item, &p->wrapper};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]->p);
    free(p->z);
    free(p);
}
