/* Perfetto / Chrome trace-event JSON for a simulator run: "X" (complete) slices on one track per
 * stream (compute) and copy engine (h2d, ssd), and a "C" counter for HBM use. Timestamps are
 * microseconds with three decimals (ns resolution), so the file is exact and deterministic. */
#include <inttypes.h>

#include "sim/sim_internal.h"

static void put_us(FILE *f, uint64_t t_ns) {
    fprintf(f, "%" PRIu64 ".%03" PRIu64, t_ns / 1000, t_ns % 1000);
}

moesim_status sim_timeline_open(sim_timeline *tl, const char *path, moesim_error *err) {
    return sim_timeline_open_as(tl, path, "moesim sim", err);
}

moesim_status sim_timeline_open_as(sim_timeline *tl, const char *path, const char *process,
                                   moesim_error *err) {
    tl->on = false;
    if (atomic_file_open(&tl->af, path, err)) return MOESIM_EIO;
    tl->on = true;
    tl->first = true;
    FILE *f = tl->af.fp;
    fputs("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n", f);
    static const char *const names[] = {NULL, "compute stream", "copy engine h2d (PCIe)",
                                        "ssd read queue", "hbm"};
    fprintf(f, "{\"ph\":\"M\",\"pid\":1,\"name\":\"process_name\",\"args\":{\"name\":\"%s\"}}",
            process);
    for (int tid = SIM_TRACK_COMPUTE; tid <= SIM_TRACK_SSD; tid++)
        fprintf(f,
                ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{"
                "\"name\":\"%s\"}}",
                tid, names[tid]);
    tl->first = false;
    return MOESIM_OK;
}

void sim_timeline_slice(sim_timeline *tl, int track, const char *cat, const char *name,
                        uint64_t t0_ns, uint64_t t1_ns) {
    if (!tl->on) return;
    FILE *f = tl->af.fp;
    fprintf(f,
            ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"cat\":\"%s\",\"name\":\"%s\",\"ts\":", track,
            cat, name);
    put_us(f, t0_ns);
    fputs(",\"dur\":", f);
    put_us(f, t1_ns - t0_ns);
    fputc('}', f);
}

void sim_timeline_counter(sim_timeline *tl, const char *name, uint64_t t_ns, double value) {
    if (!tl->on) return;
    FILE *f = tl->af.fp;
    fprintf(f, ",\n{\"ph\":\"C\",\"pid\":1,\"name\":\"%s\",\"ts\":", name);
    put_us(f, t_ns);
    fprintf(f, ",\"args\":{\"bytes\":%.0f}}", value);
}

moesim_status sim_timeline_close(sim_timeline *tl, moesim_error *err) {
    if (!tl->on) return MOESIM_OK;
    fputs("\n]}\n", tl->af.fp);
    tl->on = false;
    return atomic_file_commit(&tl->af, err);
}

void sim_timeline_abort(sim_timeline *tl) {
    if (!tl->on) return;
    atomic_file_abort(&tl->af);
    tl->on = false;
}
