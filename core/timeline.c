/* The timeline writer (timeline.h): the window, the choice of format, and the Chrome trace-event
 * JSON, plain or gzip'd; the protobuf format is timeline_proto.c. JSON timestamps are microseconds
 * with three decimals (ns resolution), so the file is exact and deterministic. */
#include "core/timeline.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/config.h"
#include "core/timeline_proto.h"

/* [SIM_TRACK_HBM + SIM_TIMELINE_COUNTERS]: thread tracks, then the counters (precisions in
 * moesim_precision order, checked at open) */
static const char *const track_names[] = {NULL,       "compute stream", "copy engine h2d (PCIe)",
                                          "ssd read queue", "hbm",      "hbm bf16",
                                          "hbm fp8",    "hbm int8",     "hbm int4",
                                          "hbm int3",   "hbm int2"};

/* ---- window ---- */

/* One bound of "A:B": empty means `open`; steps are whole numbers, ms may have decimals. */
static bool parse_bound(const char *s, size_t n, bool ms, uint64_t open, uint64_t *out) {
    if (!n) {
        *out = open;
        return true;
    }
    char buf[64];
    if (n >= sizeof buf) return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (!ms) return config_parse_u64(buf, out);
    double v;
    if (!config_parse_f64(buf, &v) || v < 0 || v > 1.8e13) return false; /* ns fit 64 bits */
    *out = (uint64_t)(v * 1e6 + 0.5);
    return true;
}

moesim_status sim_timeline_window_parse(const char *text, sim_timeline_window *w,
                                        moesim_error *err) {
    bool ms = !strncmp(text, "ms=", 3), steps = !strncmp(text, "steps=", 6);
    const char *range = ms ? text + 3 : steps ? text + 6 : NULL;
    const char *colon = range ? strchr(range, ':') : NULL;
    sim_timeline_window got = {.kind = ms ? SIM_TIMELINE_NS : SIM_TIMELINE_STEPS};
    if (!colon || !parse_bound(range, (size_t)(colon - range), ms, 0, &got.from) ||
        !parse_bound(colon + 1, strlen(colon + 1), ms, UINT64_MAX, &got.to) || got.from >= got.to)
        return moesim_fail(err, MOESIM_EINPUT,
                           "--timeline-window %s: expected steps=A:B (whole steps) or ms=A:B "
                           "(milliseconds) with A < B, either bound optional",
                           text);
    *w = got;
    return MOESIM_OK;
}

static void window_start(sim_timeline *tl, const sim_timeline_window *window) {
    tl->window = window ? *window : (sim_timeline_window){0};
    memset(tl->held, 0, sizeof tl->held);
    tl->latest_ns = 0;
    /* the whole run, a time window, and a step window from step 0 know where they start */
    tl->lo_known = tl->window.kind != SIM_TIMELINE_STEPS || tl->window.from == 0;
    tl->lo_ns = tl->window.kind == SIM_TIMELINE_NS ? tl->window.from : 0;
    tl->hi_known = tl->window.kind == SIM_TIMELINE_NS && tl->window.to != UINT64_MAX;
    tl->hi_ns = tl->hi_known ? tl->window.to : UINT64_MAX;
}

void sim_timeline_step(sim_timeline *tl, uint64_t step, uint64_t t_ns) {
    if (!tl->on || tl->window.kind != SIM_TIMELINE_STEPS) return;
    if (step == tl->window.from) {
        tl->lo_known = true;
        tl->lo_ns = t_ns;
    }
    if (step == tl->window.to) {
        tl->hi_known = true;
        tl->hi_ns = t_ns;
    }
}

/* ---- JSON output: a buffer drained to the file, through deflate for .json.gz ---- */

#define SINK_BUF_BYTES (256u << 10)

typedef struct sim_timeline_sink {
    FILE *f;
    bool gzip;
    z_stream z;
    size_t n;
    char buf[SINK_BUF_BYTES];
    unsigned char zout[SINK_BUF_BYTES];
} sim_timeline_sink;

static void sink_deflate(sim_timeline_sink *k, int flush) {
    k->z.next_in = (unsigned char *)k->buf;
    k->z.avail_in = (uInt)k->n;
    do {
        k->z.next_out = k->zout;
        k->z.avail_out = sizeof k->zout;
        int rc = deflate(&k->z, flush);
        MOESIM_ASSERT(rc != Z_STREAM_ERROR);
        fwrite(k->zout, 1, sizeof k->zout - k->z.avail_out, k->f);
    } while (k->z.avail_out == 0); /* room left over: all input taken (and, at Z_FINISH, ended) */
}

static void sink_drain(sim_timeline_sink *k, bool last) {
    if (k->gzip)
        sink_deflate(k, last ? Z_FINISH : Z_NO_FLUSH);
    else
        fwrite(k->buf, 1, k->n, k->f);
    k->n = 0;
}

static void tl_printf(sim_timeline *tl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tl_printf(sim_timeline *tl, const char *fmt, ...) {
    sim_timeline_sink *k = tl->sink;
    for (int tries = 0; tries < 2; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(k->buf + k->n, sizeof k->buf - k->n, fmt, ap);
        va_end(ap);
        MOESIM_ASSERT(n >= 0 && (size_t)n < sizeof k->buf); /* one event is a few hundred bytes */
        if (k->n + (size_t)n < sizeof k->buf) {
            k->n += (size_t)n;
            return;
        }
        sink_drain(k, false); /* did not fit: drain and print again */
    }
}

static sim_timeline_sink *sink_create(FILE *f, bool gzip) {
    sim_timeline_sink *k = moesim_xcalloc(1, sizeof *k);
    k->f = f;
    k->gzip = gzip;
    /* windowBits 15 + 16: a gzip wrapper (one member, what Perfetto's gzip reader expects); it
     * fails only without memory, which is fatal here as in moesim_xmalloc */
    if (gzip)
        MOESIM_ASSERT(deflateInit2(&k->z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    return k;
}

static void sink_destroy(sim_timeline_sink *k) {
    if (!k) return;
    if (k->gzip) deflateEnd(&k->z);
    free(k);
}

/* ns as microseconds with three decimals */
#define US_FMT     "%" PRIu64 ".%03" PRIu64
#define US_ARGS(t) (t) / 1000, (t) % 1000

static void json_head(sim_timeline *tl, const char *process) {
    tl_printf(tl, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
    tl_printf(tl, "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"%s\"}}",
              process);
    for (int tid = SIM_TRACK_COMPUTE; tid <= SIM_TRACK_SSD; tid++)
        tl_printf(tl,
                  ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{"
                  "\"name\":\"%s\"}}",
                  tid, track_names[tid]);
}

/* ---- the public calls ---- */

sim_timeline_format sim_timeline_format_of(const char *path) {
    size_t n = strlen(path);
    static const struct {
        const char *suffix;
        sim_timeline_format format;
    } by_name[] = {{".pftrace", SIM_TIMELINE_PROTO},
                   {".perfetto-trace", SIM_TIMELINE_PROTO},
                   {".json.gz", SIM_TIMELINE_JSON_GZ}};
    for (size_t i = 0; i < sizeof by_name / sizeof *by_name; i++) {
        size_t m = strlen(by_name[i].suffix);
        if (n > m && !strcmp(path + n - m, by_name[i].suffix)) return by_name[i].format;
    }
    return SIM_TIMELINE_JSON;
}

moesim_status sim_timeline_open(sim_timeline *tl, const char *path,
                                const sim_timeline_window *window, moesim_error *err) {
    return sim_timeline_open_as(tl, path, "moesim sim", window, err);
}

moesim_status sim_timeline_open_as(sim_timeline *tl, const char *path, const char *process,
                                   const sim_timeline_window *window, moesim_error *err) {
    tl->on = false;
    tl->sink = NULL;
    tl->proto = NULL;
    if (atomic_file_open(&tl->af, path, err)) return MOESIM_EIO;
    MOESIM_ASSERT(sizeof track_names / sizeof *track_names ==
                  SIM_TRACK_HBM + SIM_TIMELINE_COUNTERS);
    for (int p = 0; p < PREC_COUNT; p++)
        MOESIM_ASSERT(!strcmp(track_names[SIM_TRACK_HBM_PREC(p)] + 4,
                              precision_name((moesim_precision)p)));
    tl->on = true;
    tl->format = sim_timeline_format_of(path);
    window_start(tl, window);
    if (tl->format == SIM_TIMELINE_PROTO) {
        tl->proto = tl_proto_create(tl->af.fp, process, track_names, SIM_TRACK_HBM,
                                    SIM_TIMELINE_COUNTERS);
    } else {
        tl->sink = sink_create(tl->af.fp, tl->format == SIM_TIMELINE_JSON_GZ);
        json_head(tl, process);
    }
    return MOESIM_OK;
}

static void emit_counter(sim_timeline *tl, int track, uint64_t t_ns, double value) {
    if (tl->proto) {
        tl_proto_counter(tl->proto, track, t_ns, value);
        return;
    }
    tl_printf(tl,
              ",\n{\"ph\":\"C\",\"pid\":1,\"name\":\"%s\",\"ts\":" US_FMT
              ",\"args\":{\"bytes\":%.0f}}",
              track_names[track], US_ARGS(t_ns), value);
}

/* The counter samples held back from before the window, at the window's start. */
static void release_held(sim_timeline *tl) {
    for (int c = 0; c < SIM_TIMELINE_COUNTERS; c++) {
        if (!tl->held[c]) continue;
        emit_counter(tl, SIM_TRACK_HBM + c, tl->lo_ns, tl->held_value[c]);
        tl->held[c] = false;
    }
}

void sim_timeline_slice(sim_timeline *tl, int track, const char *cat, const char *name,
                        uint64_t t0_ns, uint64_t t1_ns) {
    if (!tl->on) return;
    if (t1_ns > tl->latest_ns) tl->latest_ns = t1_ns;
    if (!tl->lo_known || (t1_ns <= tl->lo_ns && t0_ns < tl->lo_ns) ||
        (tl->hi_known && t0_ns >= tl->hi_ns))
        return; /* outside the window */
    release_held(tl);
    if (tl->proto) {
        tl_proto_slice(tl->proto, track, cat, name, t0_ns, t1_ns);
        return;
    }
    tl_printf(tl,
              ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"cat\":\"%s\",\"name\":\"%s\",\"ts\":" US_FMT
              ",\"dur\":" US_FMT "}",
              track, cat, name, US_ARGS(t0_ns), US_ARGS(t1_ns - t0_ns));
}

void sim_timeline_counter(sim_timeline *tl, int track, uint64_t t_ns, double value) {
    if (!tl->on) return;
    MOESIM_ASSERT(track >= SIM_TRACK_HBM && track < SIM_TRACK_HBM + SIM_TIMELINE_COUNTERS);
    int c = track - SIM_TRACK_HBM;
    if (t_ns > tl->latest_ns) tl->latest_ns = t_ns;
    if (!tl->lo_known || t_ns < tl->lo_ns) { /* before the window: the value it opens with */
        tl->held[c] = true;
        tl->held_value[c] = value;
        return;
    }
    if (tl->hi_known && t_ns >= tl->hi_ns) return;
    if (t_ns > tl->lo_ns) release_held(tl);
    tl->held[c] = false; /* a sample at the window's start replaces the held one */
    emit_counter(tl, track, t_ns, value);
}

void sim_timeline_hbm(sim_timeline *tl, uint64_t t_ns, uint64_t experts_used,
                      const uint64_t prec_used[PREC_COUNT], sim_timeline_hbm_shown *shown) {
    if (!tl->on) return;
    sim_timeline_counter(tl, SIM_TRACK_HBM, t_ns, (double)experts_used);
    for (int p = 0; p < PREC_COUNT; p++) {
        bool started = shown->tracks & 1u << p;
        if (started ? prec_used[p] == shown->bytes[p]
                    : prec_used[p] == 0 || prec_used[p] == experts_used)
            continue;
        shown->tracks |= 1u << p;
        shown->bytes[p] = prec_used[p];
        sim_timeline_counter(tl, SIM_TRACK_HBM_PREC(p), t_ns, (double)prec_used[p]);
    }
}

static void close_writers(sim_timeline *tl) {
    sink_destroy(tl->sink);
    tl_proto_destroy(tl->proto);
    tl->sink = NULL;
    tl->proto = NULL;
    tl->on = false;
}

moesim_status sim_timeline_close(sim_timeline *tl, moesim_error *err) {
    if (!tl->on) return MOESIM_OK;
    /* a window the run never reached would be an empty file that looks like a quiet run */
    bool never_opened = tl->window.kind == SIM_TIMELINE_STEPS
                            ? !tl->lo_known
                            : tl->window.kind == SIM_TIMELINE_NS && tl->latest_ns < tl->lo_ns;
    if (never_opened) {
        sim_timeline_abort(tl);
        return tl->window.kind == SIM_TIMELINE_STEPS
                   ? moesim_fail(err, MOESIM_EINPUT,
                                 "--timeline-window: the run ended before step %" PRIu64
                                 ", where the window opens (no timeline written)",
                                 tl->window.from)
                   : moesim_fail(err, MOESIM_EINPUT,
                                 "--timeline-window: the run ended at %.3f ms, before the window "
                                 "opens at %.3f ms (no timeline written)",
                                 tl->latest_ns / 1e6, tl->window.from / 1e6);
    }
    if (tl->lo_known && tl->latest_ns >= tl->lo_ns) release_held(tl);
    if (tl->proto) {
        tl_proto_finish(tl->proto);
    } else {
        tl_printf(tl, "\n]}\n");
        sink_drain(tl->sink, true);
    }
    close_writers(tl);
    return atomic_file_commit(&tl->af, err);
}

void sim_timeline_abort(sim_timeline *tl) {
    if (!tl->on) return;
    close_writers(tl);
    atomic_file_abort(&tl->af);
}
