/* The timeline writer (core/timeline.h) on a small scripted run: the Chrome JSON it has always
 * written, the same bytes gzip'd, the Perfetto protobuf decoded here field by field back to the
 * same slices and counter samples, and the step and time windows. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/timeline.h"
#include "core/timeline_proto.h"
#include "support/test_support.h"

typedef struct event {
    char ph;         /* 'X' slice, 'C' counter sample */
    int track;       /* SIM_TRACK_*; counters SIM_TRACK_HBM and SIM_TRACK_HBM_PREC(p) */
    const char *cat; /* slices */
    const char *name;
    uint64_t t0_ns, t1_ns; /* a sample's time is t0_ns */
    double value;          /* samples */
} event;

/* A run of three steps starting at 0, 3000 and 4000 ns; the second h2d slice goes back in time
 * on its track (replay retires copies late), which the protobuf writes as an absolute time. */
static const uint64_t step_start_ns[] = {0, 3000, 4000};
static const event script[] = {
    {'C', SIM_TRACK_HBM, NULL, "hbm", 0, 0, 100},
    {'X', SIM_TRACK_COMPUTE, "attention", "L0 attention", 0, 1000, 0},
    {'X', SIM_TRACK_H2D, "demand", "L0 e1", 500, 3000, 0},
    {'X', SIM_TRACK_H2D, "prefetch", "L0 e2", 100, 200, 0},
    {'C', SIM_TRACK_HBM, NULL, "hbm", 1500, 0, 200},
    /* step 1 */
    {'X', SIM_TRACK_COMPUTE, "expert", "L0 e1 x1", 3000, 4000, 0},
    {'C', SIM_TRACK_HBM, NULL, "hbm", 3500, 0, 300},
    /* step 2 */
    {'X', SIM_TRACK_COMPUTE, "attention", "L0 attention", 4000, 5000, 0},
    {'X', SIM_TRACK_SSD, "demand", "L0 e1", 4200, 4700, 0}, /* name and category of an h2d one */
    {'X', SIM_TRACK_COMPUTE, "expert", "L1 e2 x1", 5000, 5000, 0},
    {'C', SIM_TRACK_HBM, NULL, "hbm", 4800, 0, 50},
};
enum { N_SCRIPT = sizeof script / sizeof *script };
static const size_t step_at[] = {0, 5, 7}; /* script index where each step starts */

static void write_script(const char *path, const sim_timeline_window *w) {
    sim_timeline tl;
    moesim_error err = {0};
    cr_assert_eq(sim_timeline_open(&tl, path, w, &err), MOESIM_OK, "%s", err.msg);
    size_t step = 0;
    for (size_t i = 0; i < N_SCRIPT; i++) {
        if (step < 3 && i == step_at[step]) {
            sim_timeline_step(&tl, step, step_start_ns[step]);
            step++;
        }
        const event *e = &script[i];
        if (e->ph == 'X')
            sim_timeline_slice(&tl, e->track, e->cat, e->name, e->t0_ns, e->t1_ns);
        else
            sim_timeline_counter(&tl, e->track, e->t0_ns, e->value);
    }
    cr_assert_eq(sim_timeline_close(&tl, &err), MOESIM_OK, "%s", err.msg);
}

TestSuite(timeline);

Test(timeline, json_is_the_chrome_trace_event_file_it_always_was) {
    const char *path = test_tmp_path("timeline.json");
    write_script(path, NULL);
    size_t n;
    char *got = test_read_file(path, &n);
    const char *want =
        "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"
        "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"moesim sim\"}},\n"
        "{\"ph\":\"M\",\"pid\":1,\"tid\":1,\"name\":\"thread_name\",\"args\":{\"name\":\"compute "
        "stream\"}},\n"
        "{\"ph\":\"M\",\"pid\":1,\"tid\":2,\"name\":\"thread_name\",\"args\":{\"name\":\"copy "
        "engine h2d (PCIe)\"}},\n"
        "{\"ph\":\"M\",\"pid\":1,\"tid\":3,\"name\":\"thread_name\",\"args\":{\"name\":\"ssd read "
        "queue\"}},\n"
        "{\"ph\":\"C\",\"pid\":1,\"name\":\"hbm\",\"ts\":0.000,\"args\":{\"bytes\":100}},\n"
        "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"cat\":\"attention\",\"name\":\"L0 "
        "attention\",\"ts\":0.000,\"dur\":1.000},\n"
        "{\"ph\":\"X\",\"pid\":1,\"tid\":2,\"cat\":\"demand\",\"name\":\"L0 "
        "e1\",\"ts\":0.500,\"dur\":2.500},\n"
        "{\"ph\":\"X\",\"pid\":1,\"tid\":2,\"cat\":\"prefetch\",\"name\":\"L0 "
        "e2\",\"ts\":0.100,\"dur\":0.100},\n"
        "{\"ph\":\"C\",\"pid\":1,\"name\":\"hbm\",\"ts\":1.500,\"args\":{\"bytes\":200}},\n"
        "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"cat\":\"expert\",\"name\":\"L0 e1 "
        "x1\",\"ts\":3.000,\"dur\":1.000},\n"
        "{\"ph\":\"C\",\"pid\":1,\"name\":\"hbm\",\"ts\":3.500,\"args\":{\"bytes\":300}},\n"
        "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"cat\":\"attention\",\"name\":\"L0 "
        "attention\",\"ts\":4.000,\"dur\":1.000},\n"
        "{\"ph\":\"X\",\"pid\":1,\"tid\":3,\"cat\":\"demand\",\"name\":\"L0 "
        "e1\",\"ts\":4.200,\"dur\":0.500},\n"
        "{\"ph\":\"X\",\"pid\":1,\"tid\":1,\"cat\":\"expert\",\"name\":\"L1 e2 "
        "x1\",\"ts\":5.000,\"dur\":0.000},\n"
        "{\"ph\":\"C\",\"pid\":1,\"name\":\"hbm\",\"ts\":4.800,\"args\":{\"bytes\":50}}\n"
        "]}\n";
    cr_assert_eq(n, strlen(want));
    cr_assert(!memcmp(got, want, n), "got:\n%.*s", (int)n, got);
    free(got);
}

Test(timeline, json_gz_inflates_to_the_json_bytes) {
    const char *json = test_tmp_path("timeline-plain.json");
    write_script(json, NULL);
    char gz_path[4096];
    snprintf(gz_path, sizeof gz_path, "%s", test_tmp_path("timeline-packed.json.gz"));
    write_script(gz_path, NULL);
    size_t n_json, n_gz;
    char *want = test_read_file(json, &n_json), *packed = test_read_file(gz_path, &n_gz);
    cr_assert(n_gz >= 2 && (unsigned char)packed[0] == 0x1f && (unsigned char)packed[1] == 0x8b,
              "a gzip member");
    char got[8192];
    z_stream z = {0};
    cr_assert_eq(inflateInit2(&z, 15 + 16), Z_OK);
    z.next_in = (unsigned char *)packed;
    z.avail_in = (uInt)n_gz;
    z.next_out = (unsigned char *)got;
    z.avail_out = sizeof got;
    cr_assert_eq(inflate(&z, Z_FINISH), Z_STREAM_END, "one complete gzip member");
    cr_assert_eq(z.avail_in, 0, "nothing after it");
    cr_assert_eq(z.total_out, n_json);
    cr_assert(!memcmp(got, want, n_json));
    inflateEnd(&z);
    free(want);
    free(packed);
}

/* ---- a protobuf reader: just what the writer emits, checked field by field ---- */

typedef struct rd {
    const uint8_t *p, *end;
} rd;

static uint64_t rd_varint(rd *r) {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
        cr_assert(r->p < r->end && shift < 64, "truncated varint");
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
}

/* The next field: its number, and its varint value or its bytes in *sub. */
static bool rd_field(rd *r, uint32_t *field, uint64_t *v, rd *sub) {
    if (r->p == r->end) return false;
    uint64_t key = rd_varint(r);
    *field = (uint32_t)(key >> 3);
    if ((key & 7) == 0) {
        *v = rd_varint(r);
    } else {
        cr_assert_eq(key & 7, 2, "field %u: only varints and bytes are written", *field);
        uint64_t n = rd_varint(r);
        cr_assert(n <= (uint64_t)(r->end - r->p), "field %u overruns its message", *field);
        *sub = (rd){r->p, r->p + n};
        r->p += n;
    }
    return true;
}

#define MAX_EVENTS 64
#define MAX_IIDS   32

typedef struct decoded {
    event ev[MAX_EVENTS];
    size_t n;
    char names[MAX_IIDS][64], cats[MAX_IIDS][64]; /* by iid, per sequence in *_seen */
    uint32_t name_seen[MAX_IIDS], cat_seen[MAX_IIDS];
    uint64_t last_ns[16], default_uuid[16];
    bool clock_set[16];
    int open_slice[16];    /* index into ev of the sequence's open slice, -1: none */
    int tid_of_uuid[16];        /* thread tracks: their tid; counters: their SIM_TRACK_* */
    char counter_name[16][32];  /* by uuid: a counter track's name */
    char process_name[32];
} decoded;

static void decode_interned(decoded *d, rd r, uint32_t seq) {
    uint32_t f, g;
    uint64_t v;
    rd sub, s2;
    while (rd_field(&r, &f, &v, &sub)) {
        cr_assert(f == TL_PB_INTERNED_CATEGORIES || f == TL_PB_INTERNED_NAMES);
        uint64_t iid = 0;
        char name[64] = "";
        while (rd_field(&sub, &g, &v, &s2)) {
            if (g == 1) iid = v;
            if (g == 2) snprintf(name, sizeof name, "%.*s", (int)(s2.end - s2.p), s2.p);
        }
        cr_assert(iid >= 1 && iid < MAX_IIDS);
        bool cat = f == TL_PB_INTERNED_CATEGORIES;
        uint32_t *seen = cat ? &d->cat_seen[iid] : &d->name_seen[iid];
        char *slot = cat ? d->cats[iid] : d->names[iid];
        cr_assert(!(*seen & 1u << seq), "iid %" PRIu64 " interned twice on sequence %u", iid, seq);
        cr_assert(!*seen || !strcmp(slot, name), "iid %" PRIu64 " names two strings", iid);
        *seen |= 1u << seq;
        snprintf(slot, 64, "%s", name);
    }
}

static void decode_descriptor(decoded *d, rd r) {
    uint32_t f, g;
    uint64_t v, uuid = 0;
    rd sub, s2;
    while (rd_field(&r, &f, &v, &sub)) {
        if (f == 1) uuid = v;
        cr_assert(uuid < 16);
        if (f == 4) { /* thread */
            while (rd_field(&sub, &g, &v, &s2))
                if (g == 2) d->tid_of_uuid[uuid] = (int)v;
        } else if (f == 8) { /* counter: the writer's uuid is 1 + its track */
            d->tid_of_uuid[uuid] = (int)uuid - 1;
        } else if (f == 2) {
            snprintf(d->counter_name[uuid], sizeof d->counter_name[uuid], "%.*s",
                     (int)(sub.end - sub.p), sub.p);
        } else if (f == 3) { /* process */
            while (rd_field(&sub, &g, &v, &s2))
                if (g == 6)
                    snprintf(d->process_name, sizeof d->process_name, "%.*s", (int)(s2.end - s2.p),
                             s2.p);
        }
    }
}

static void decode_sequence_start(decoded *d, uint32_t seq, rd snapshot, rd defaults) {
    uint32_t f, g;
    uint64_t v;
    rd sub, s2;
    bool incremental = false;
    while (rd_field(&snapshot, &f, &v, &sub)) {
        uint64_t id = 0, ts = 1, incr = 0;
        while (rd_field(&sub, &g, &v, &s2)) {
            if (g == 1) id = v;
            if (g == 2) ts = v;
            if (g == 3) incr = v;
        }
        cr_assert_eq(ts, 0, "clocks start together at 0");
        incremental |= id == TL_PB_CLOCK_TIMELINE && incr;
    }
    cr_assert(incremental, "sequence %u defines its incremental clock", seq);
    while (rd_field(&defaults, &f, &v, &sub)) {
        if (f == TL_PB_TIMESTAMP_CLOCK) cr_assert_eq(v, TL_PB_CLOCK_TIMELINE);
        if (f == 11)
            while (rd_field(&sub, &g, &v, &s2))
                if (g == TL_PB_EVENT_TRACK_UUID) d->default_uuid[seq] = v;
    }
    d->clock_set[seq] = true;
    d->last_ns[seq] = 0;
}

static void decode_packet(decoded *d, rd r) {
    uint32_t f, g, seq = 0;
    uint64_t v, ts = 0, flags = 0, clock = 0;
    rd sub, s2, snapshot = {0}, defaults = {0}, interned = {0}, te = {0};
    bool has_ts = false, has_event = false;
    while (rd_field(&r, &f, &v, &sub)) {
        if (f == TL_PB_TRACK_DESCRIPTOR) return decode_descriptor(d, sub);
        if (f == TL_PB_TIMESTAMP) ts = v, has_ts = true;
        if (f == TL_PB_TIMESTAMP_CLOCK) clock = v;
        if (f == TL_PB_SEQUENCE_ID) seq = (uint32_t)v;
        if (f == TL_PB_SEQUENCE_FLAGS) flags = v;
        if (f == TL_PB_CLOCK_SNAPSHOT) snapshot = sub;
        if (f == TL_PB_PACKET_DEFAULTS) defaults = sub;
        if (f == TL_PB_INTERNED_DATA) interned = sub;
        if (f == TL_PB_TRACK_EVENT) te = sub, has_event = true;
    }
    cr_assert(seq >= 1 && seq < 16, "every event packet names its sequence");
    if (snapshot.p) {
        cr_assert_eq(flags, 1, "SEQ_INCREMENTAL_STATE_CLEARED");
        return decode_sequence_start(d, seq, snapshot, defaults);
    }
    cr_assert(d->clock_set[seq] && has_ts && has_event);
    cr_assert_eq(flags, 2, "SEQ_NEEDS_INCREMENTAL_STATE");
    if (clock) {
        cr_assert_eq(clock, TL_PB_CLOCK_BOOTTIME, "an absolute time is on the trace clock");
    } else {
        cr_assert(ts < UINT64_C(1) << 62, "a delta moves forward (got %" PRIu64 ")", ts);
        ts += d->last_ns[seq];
        d->last_ns[seq] = ts;
    }
    if (interned.p) decode_interned(d, interned, seq);
    uint64_t type = 0, name_iid = 0, cat_iid = 0, counter = 0;
    while (rd_field(&te, &g, &v, &s2)) {
        if (g == TL_PB_EVENT_TYPE) type = v;
        if (g == TL_PB_EVENT_NAME_IID) name_iid = v;
        if (g == TL_PB_EVENT_CATEGORY_IIDS) cat_iid = v;
        if (g == TL_PB_EVENT_COUNTER_VALUE) counter = v;
        cr_assert(g != TL_PB_EVENT_TRACK_UUID, "the track comes from the sequence's defaults");
    }
    int track = d->tid_of_uuid[d->default_uuid[seq]];
    if (type == TL_PB_SLICE_END) {
        cr_assert(d->open_slice[seq] >= 0, "an end without a begin");
        d->ev[d->open_slice[seq]].t1_ns = ts;
        d->open_slice[seq] = -1;
        return;
    }
    cr_assert(d->n < MAX_EVENTS);
    event *e = &d->ev[d->n];
    if (type == TL_PB_SLICE_BEGIN) {
        cr_assert(d->open_slice[seq] < 0, "slices on a track do not nest here");
        cr_assert(name_iid < MAX_IIDS && cat_iid < MAX_IIDS);
        cr_assert(d->name_seen[name_iid] & 1u << seq,
                  "name %" PRIu64 " used before it was interned", name_iid);
        cr_assert(d->cat_seen[cat_iid] & 1u << seq, "category %" PRIu64 " used before interned",
                  cat_iid);
        *e = (event){'X', track, d->cats[cat_iid], d->names[name_iid], ts, 0, 0};
        d->open_slice[seq] = (int)d->n;
    } else {
        cr_assert_eq(type, TL_PB_COUNTER);
        *e = (event){'C', track, NULL, d->counter_name[d->default_uuid[seq]], ts, 0,
                     (double)counter};
    }
    d->n++;
}

static void decode_file(decoded *d, const char *path) {
    memset(d, 0, sizeof *d);
    memset(d->open_slice, -1, sizeof d->open_slice);
    size_t n;
    char *file = test_read_file(path, &n);
    rd top = {(const uint8_t *)file, (const uint8_t *)file + n}, pkt, block;
    uint32_t f;
    uint64_t v;
    static uint8_t inflated[1 << 20];
    while (rd_field(&top, &f, &v, &pkt)) {
        cr_assert_eq(f, TL_PB_TRACE_PACKET);
        cr_assert(rd_field(&pkt, &f, &v, &block) && f == TL_PB_COMPRESSED,
                  "every top-level packet is a compressed block");
        uLongf len = sizeof inflated;
        cr_assert_eq(uncompress(inflated, &len, block.p, (uLong)(block.end - block.p)), Z_OK);
        rd inner = {inflated, inflated + len}, one;
        while (rd_field(&inner, &f, &v, &one)) {
            cr_assert_eq(f, TL_PB_TRACE_PACKET);
            decode_packet(d, one);
        }
    }
    free(file);
    for (int s = 0; s < 16; s++) cr_assert_eq(d->open_slice[s], -1, "every slice ends");
}

static void assert_same_events(const event *got, size_t n_got, const event *want, size_t n_want) {
    cr_assert_eq(n_got, n_want, "%zu events, want %zu", n_got, n_want);
    for (size_t i = 0; i < n_want; i++) {
        const event *g = &got[i], *w = &want[i];
        cr_assert(g->ph == w->ph && g->track == w->track && !strcmp(g->name, w->name) &&
                      g->t0_ns == w->t0_ns && (g->ph != 'X' || g->t1_ns == w->t1_ns) &&
                      g->value == w->value && (g->ph != 'X' || !strcmp(g->cat, w->cat)),
                  "event %zu: got %c %d %s %s [%" PRIu64 ", %" PRIu64 "] %g", i, g->ph, g->track,
                  g->cat ? g->cat : "-", g->name, g->t0_ns, g->t1_ns, g->value);
    }
}

Test(timeline, pftrace_decodes_to_the_same_slices_and_counter_samples) {
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("timeline.pftrace"));
    write_script(path, NULL);
    decoded *d = calloc(1, sizeof *d);
    decode_file(d, path);
    cr_assert_str_eq(d->process_name, "moesim sim");
    cr_assert_str_eq(d->counter_name[1 + SIM_TRACK_HBM], "hbm");
    /* the decoder lists slices by their begin packets and samples in write order: the script's
     * order, per sequence (sequences interleave as written) */
    assert_same_events(d->ev, d->n, script, N_SCRIPT);
    free(d);
    cr_assert_eq(sim_timeline_format_of("a.perfetto-trace"), SIM_TIMELINE_PROTO);
    cr_assert_eq(sim_timeline_format_of("a.json.gz"), SIM_TIMELINE_JSON_GZ);
    cr_assert_eq(sim_timeline_format_of("a.json"), SIM_TIMELINE_JSON);
    cr_assert_eq(sim_timeline_format_of(".pftrace.json"), SIM_TIMELINE_JSON);
}

/* The JSON file's events (metadata left out), as `event`s with ns times. */
static size_t json_events(const char *path, event *out, char names[][64], size_t max) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    cr_assert(root, "%s: %s", path, je.text);
    size_t i, n = 0;
    json_t *e;
    json_array_foreach(json_object_get(root, "traceEvents"), i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        if (ph[0] == 'M') continue;
        cr_assert(n < max);
        snprintf(names[n], 64, "%s", json_string_value(json_object_get(e, "name")));
        uint64_t ts = (uint64_t)llround(json_number_value(json_object_get(e, "ts")) * 1000);
        out[n] = (event){ph[0], SIM_TRACK_HBM, NULL, names[n], ts, ts, 0};
        if (ph[0] == 'X') {
            out[n].track = (int)json_integer_value(json_object_get(e, "tid"));
            out[n].t1_ns =
                ts + (uint64_t)llround(json_number_value(json_object_get(e, "dur")) * 1000);
        } else {
            out[n].value = json_number_value(json_object_get(json_object_get(e, "args"), "bytes"));
        }
        n++;
    }
    json_decref(root);
    return n;
}

/* What a window keeps of the script, in file order: (name, time, value for samples). */
typedef struct window_case {
    const char *window;
    size_t n;
    struct {
        const char *name;
        uint64_t t_ns;
        double value;
    } keeps[6];
} window_case;

static const window_case window_cases[] = {
    /* [3.0, 4.5) us: the h2d copies end by 3000 (out), the HBM value 200 set at 1500 is
     * repeated at 3000, the sample at 4800 is past the end */
    {"ms=0.003:0.0045",
     5,
     {{"hbm", 3000, 200},
      {"L0 e1 x1", 3000, 0},
      {"hbm", 3500, 300},
      {"L0 attention", 4000, 0},
      {"L0 e1", 4200, 0}}},
    /* from 3.5 us: the expert slice [3000, 4000) straddles the start and is kept whole */
    {"ms=0.0035:0.0045",
     5,
     {{"hbm", 3500, 200},
      {"L0 e1 x1", 3000, 0},
      {"hbm", 3500, 300},
      {"L0 attention", 4000, 0},
      {"L0 e1", 4200, 0}}},
    /* step 1 runs [3000, 4000): the expert slice; HBM 200 at the step's start, 300 inside */
    {"steps=1:2", 3, {{"hbm", 3000, 200}, {"L0 e1 x1", 3000, 0}, {"hbm", 3500, 300}}},
    /* from step 2 to the end: the counter held since 3500 opens the window at 4000; a
     * zero-length slice at the end stays */
    {"steps=2:",
     5,
     {{"hbm", 4000, 300},
      {"L0 attention", 4000, 0},
      {"L0 e1", 4200, 0},
      {"L1 e2 x1", 5000, 0},
      {"hbm", 4800, 50}}},
};

/* Three HBM changes: int4 alone, then bf16 beside it, then int4 shrinks. */
static void write_hbm_changes(const char *path, const sim_timeline_window *w) {
    sim_timeline tl;
    moesim_error err = {0};
    cr_assert_eq(sim_timeline_open(&tl, path, w, &err), MOESIM_OK, "%s", err.msg);
    sim_timeline_hbm_shown shown = {0};
    uint64_t used[PREC_COUNT] = {0};
    used[PREC_INT4] = 40; /* int4 alone: its counter would repeat "hbm", none is written */
    sim_timeline_hbm(&tl, 0, 40, used, &shown);
    used[PREC_INT4] = 100;
    used[PREC_BF16] = 200; /* a second precision: both start */
    sim_timeline_hbm(&tl, 1000, 300, used, &shown);
    used[PREC_INT4] = 50;
    sim_timeline_hbm(&tl, 2000, 250, used, &shown);
    cr_assert_eq(sim_timeline_close(&tl, &err), MOESIM_OK, "%s", err.msg);
}

Test(timeline, per_precision_hbm_counters_start_with_a_second_precision_and_follow_moves) {
    static const event want[] = {
        {'C', SIM_TRACK_HBM, NULL, "hbm", 0, 0, 40},
        {'C', SIM_TRACK_HBM, NULL, "hbm", 1000, 0, 300},
        {'C', SIM_TRACK_HBM_PREC(PREC_BF16), NULL, "hbm bf16", 1000, 0, 200},
        {'C', SIM_TRACK_HBM_PREC(PREC_INT4), NULL, "hbm int4", 1000, 0, 100},
        {'C', SIM_TRACK_HBM, NULL, "hbm", 2000, 0, 250},
        {'C', SIM_TRACK_HBM_PREC(PREC_INT4), NULL, "hbm int4", 2000, 0, 50},
    };
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("hbm-prec.pftrace"));
    write_hbm_changes(path, NULL);
    decoded *d = calloc(1, sizeof *d);
    decode_file(d, path);
    assert_same_events(d->ev, d->n, want, sizeof want / sizeof *want);
    /* a precision never held gets no track */
    cr_assert_str_eq(d->counter_name[1 + SIM_TRACK_HBM_PREC(PREC_FP8)], "");
    free(d);

    snprintf(path, sizeof path, "%s", test_tmp_path("hbm-prec.json"));
    write_hbm_changes(path, NULL);
    size_t n;
    char *json = test_read_file(path, &n);
    cr_assert(strstr(json, "{\"ph\":\"C\",\"pid\":1,\"name\":\"hbm int4\",\"ts\":2.000,"
                           "\"args\":{\"bytes\":50}}"),
              "%s", json);
    cr_assert_null(strstr(json, "hbm fp8"));
    free(json);

    /* a window from 1.5 us opens with every counter's value in force there */
    sim_timeline_window w;
    moesim_error err = {0};
    cr_assert_eq(sim_timeline_window_parse("ms=0.0015:", &w, &err), MOESIM_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s", test_tmp_path("hbm-prec-window.pftrace"));
    write_hbm_changes(path, &w);
    static const event opened[] = {
        {'C', SIM_TRACK_HBM, NULL, "hbm", 1500, 0, 300},
        {'C', SIM_TRACK_HBM_PREC(PREC_BF16), NULL, "hbm bf16", 1500, 0, 200},
        {'C', SIM_TRACK_HBM_PREC(PREC_INT4), NULL, "hbm int4", 1500, 0, 100},
        {'C', SIM_TRACK_HBM, NULL, "hbm", 2000, 0, 250},
        {'C', SIM_TRACK_HBM_PREC(PREC_INT4), NULL, "hbm int4", 2000, 0, 50},
    };
    d = calloc(1, sizeof *d);
    decode_file(d, path);
    assert_same_events(d->ev, d->n, opened, sizeof opened / sizeof *opened);
    free(d);
}

Test(timeline, a_window_keeps_what_overlaps_it_and_opens_with_the_counter_value) {
    for (size_t c = 0; c < sizeof window_cases / sizeof *window_cases; c++) {
        const window_case *wc = &window_cases[c];
        sim_timeline_window w;
        moesim_error err = {0};
        cr_assert_eq(sim_timeline_window_parse(wc->window, &w, &err), MOESIM_OK, "%s", err.msg);
        const char *path = test_tmp_path("timeline-window.json");
        write_script(path, &w);
        event got[MAX_EVENTS];
        static char got_names[MAX_EVENTS][64];
        size_t n = json_events(path, got, got_names, MAX_EVENTS);
        cr_assert_eq(n, wc->n, "%s: %zu events kept", wc->window, n);
        for (size_t i = 0; i < n; i++)
            cr_assert(!strcmp(got[i].name, wc->keeps[i].name) &&
                          got[i].t0_ns == wc->keeps[i].t_ns &&
                          (got[i].ph == 'X' || got[i].value == wc->keeps[i].value),
                      "%s: event %zu is %s at %" PRIu64 " (value %g)", wc->window, i, got[i].name,
                      got[i].t0_ns, got[i].value);
    }
}

Test(timeline, a_window_from_step_0_to_the_end_is_the_whole_run_byte_for_byte) {
    char whole[4096];
    snprintf(whole, sizeof whole, "%s", test_tmp_path("timeline-whole.json"));
    write_script(whole, NULL);
    sim_timeline_window w = {.kind = SIM_TIMELINE_STEPS, .from = 0, .to = UINT64_MAX};
    const char *windowed = test_tmp_path("timeline-steps0.json");
    write_script(windowed, &w);
    size_t a, b;
    char *x = test_read_file(whole, &a), *y = test_read_file(windowed, &b);
    cr_assert(a == b && !memcmp(x, y, a));
    free(x);
    free(y);
}

Test(timeline, window_text_parses_or_says_what_was_expected) {
    static const struct {
        const char *text;
        sim_timeline_window_kind kind;
        uint64_t from, to;
    } good[] = {
        {"steps=10:20", SIM_TIMELINE_STEPS, 10, 20},
        {"steps=10:", SIM_TIMELINE_STEPS, 10, UINT64_MAX},
        {"steps=:20", SIM_TIMELINE_STEPS, 0, 20},
        {"ms=1.5:2", SIM_TIMELINE_NS, 1500000, 2000000},
        {"ms=:0.000001", SIM_TIMELINE_NS, 0, 1},
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        sim_timeline_window w;
        moesim_error err = {0};
        cr_assert_eq(sim_timeline_window_parse(good[i].text, &w, &err), MOESIM_OK, "%s: %s",
                     good[i].text, err.msg);
        cr_assert(w.kind == good[i].kind && w.from == good[i].from && w.to == good[i].to, "%s",
                  good[i].text);
    }
    static const char *const bad[] = {"steps=5",     "steps=5:5", "steps=9:3",
                                      "steps=1.5:3", "ms=-1:2",   "ms=nan:",
                                      "us=1:2",      "steps=a:b", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sim_timeline_window w;
        moesim_error err = {0};
        cr_assert_eq(sim_timeline_window_parse(bad[i], &w, &err), MOESIM_EINPUT, "%s", bad[i]);
        cr_assert(strstr(err.msg, bad[i]) && strstr(err.msg, "expected steps=A:B"), "%s", err.msg);
    }
}
