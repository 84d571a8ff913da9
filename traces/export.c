/* `moesim trace export`: a trace as JSONL or CSV, one line per recorded (token, layer) row, in
 * trace order (tokens in execution order, layers ascending); see traces/convert.h and
 * traces/FORMAT.md ("Import and export").
 *
 * Exactness: positions, phases, request ids (dense numbers, so importing renumbers them to the
 * same values), expert ids and gates all survive; a gate is printed with the shortest of "%.6g"
 * and "%.9g" that strtof reads back to the same bits (9 significant digits always suffice for
 * a float). Unrecorded rows (TRACE_NO_EXPERT) are not written: importing with the default
 * --incomplete keep restores them. Importance, token ids and look-ahead predictions have no
 * column in these forms (the CLI says so when a trace has them). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/convert.h"

#define EXPORT_BUFFER_BYTES (1u << 20)

typedef struct out_buf {
    FILE *fp;
    char *buf;
    size_t len;
    bool failed;
} out_buf;

static void out_flush(out_buf *o) {
    if (o->len && !o->failed && fwrite(o->buf, 1, o->len, o->fp) != o->len) o->failed = true;
    o->len = 0;
}

/* Room for at least `n` more bytes. */
static inline char *out_reserve(out_buf *o, size_t n) {
    if (o->len + n > EXPORT_BUFFER_BYTES) out_flush(o);
    return o->buf + o->len;
}

static inline void out_str(out_buf *o, const char *s, size_t n) {
    memcpy(out_reserve(o, n), s, n);
    o->len += n;
}
#define OUT_LIT(o, s) out_str((o), (s), sizeof(s) - 1)

static inline void out_u64(out_buf *o, uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    char *p = out_reserve(o, (size_t)n);
    for (int i = 0; i < n; i++) p[i] = tmp[n - 1 - i];
    o->len += (size_t)n;
}

/* The shortest of %.6g / %.9g that reads back to the same float. */
static void out_float(out_buf *o, float g) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%.6g", (double)g);
    float back = strtof(tmp, NULL);
    if (memcmp(&back, &g, sizeof g)) n = snprintf(tmp, sizeof tmp, "%.9g", (double)g);
    out_str(o, tmp, (size_t)n);
}

moesim_status trace_export_check(const trace *t, const char *what, moesim_error *err) {
    const uint32_t L = t->meta.n_layers;
    for (uint64_t i = 0; i < t->n_tokens; i++) {
        uint32_t l = 0;
        while (l < L && trace_experts(t, i, l)[0] == TRACE_NO_EXPERT) l++;
        if (l == L)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: /routing/expert_ids[%" PRIu64 "]: token has no recorded "
                               "layer; CSV and JSONL hold one line per recorded (token, layer) "
                               "and cannot carry it",
                               what, i);
    }
    return MOESIM_OK;
}

static void write_header(out_buf *o, trace_text_format format, uint32_t k) {
    if (format != TRACE_TEXT_CSV) return;
    OUT_LIT(o, "request_id,position,phase,layer");
    for (uint32_t j = 0; j < k; j++) {
        OUT_LIT(o, ",expert_");
        out_u64(o, j);
    }
    for (uint32_t j = 0; j < k; j++) {
        OUT_LIT(o, ",gate_");
        out_u64(o, j);
    }
    OUT_LIT(o, "\n");
}

static void write_row(out_buf *o, trace_text_format format, const trace *t, uint64_t i,
                      uint32_t l) {
    const uint32_t k = t->meta.top_k;
    const uint16_t *ids = trace_experts(t, i, l);
    const float *g = trace_gates(t, i, l);
    const char *phase = trace_phase_name(t->phase[i]);
    if (format == TRACE_TEXT_CSV) {
        out_u64(o, t->request_id[i]);
        OUT_LIT(o, ",");
        out_u64(o, t->position[i]);
        OUT_LIT(o, ",");
        out_str(o, phase, strlen(phase));
        OUT_LIT(o, ",");
        out_u64(o, l);
        for (uint32_t j = 0; j < k; j++) {
            OUT_LIT(o, ",");
            out_u64(o, ids[j]);
        }
        for (uint32_t j = 0; j < k; j++) {
            OUT_LIT(o, ",");
            out_float(o, g[j]);
        }
        OUT_LIT(o, "\n");
        return;
    }
    OUT_LIT(o, "{\"req_id\": ");
    out_u64(o, t->request_id[i]);
    OUT_LIT(o, ", \"token_idx\": ");
    out_u64(o, t->position[i]);
    OUT_LIT(o, ", \"layer\": ");
    out_u64(o, l);
    OUT_LIT(o, ", \"phase\": \"");
    out_str(o, phase, strlen(phase));
    OUT_LIT(o, "\", \"topk_ids\": [");
    for (uint32_t j = 0; j < k; j++) {
        if (j) OUT_LIT(o, ", ");
        out_u64(o, ids[j]);
    }
    OUT_LIT(o, "], \"topk_weights\": [");
    for (uint32_t j = 0; j < k; j++) {
        if (j) OUT_LIT(o, ", ");
        out_float(o, g[j]);
    }
    OUT_LIT(o, "]}\n");
}

moesim_status trace_export_write(const trace *t, trace_text_format format, FILE *fp,
                                 const char *what, moesim_error *err) {
    out_buf o = {.fp = fp, .buf = moesim_xmalloc(EXPORT_BUFFER_BYTES)};
    write_header(&o, format, t->meta.top_k);
    for (uint64_t i = 0; i < t->n_tokens && !o.failed; i++)
        for (uint32_t l = 0; l < t->meta.n_layers; l++)
            if (trace_experts(t, i, l)[0] != TRACE_NO_EXPERT) write_row(&o, format, t, i, l);
    out_flush(&o);
    free(o.buf);
    if (o.failed || fflush(fp) != 0 || ferror(fp))
        return moesim_fail(err, MOESIM_EIO, "%s: write failed: %s", what, strerror(errno));
    return MOESIM_OK;
}
