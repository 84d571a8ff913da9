/* `moesim trace export`: a trace as JSONL or CSV, one line per recorded (token, layer) row, in
 * trace order (tokens in execution order, layers ascending); see traces/convert.h and
 * traces/FORMAT.md ("Import and export").
 *
 * Exactness: positions, phases, request ids (dense numbers, so importing renumbers them to the
 * same values), expert ids and gates all survive; a gate is printed with 6 significant digits
 * when those read back to the same bits (0.71f -> "0.71"), else with "%.9g" (9 significant
 * digits always suffice for a float). Unrecorded rows (TRACE_NO_EXPERT) are not written: importing
 * with the default
 * --incomplete keep restores them. Importance, token ids and look-ahead predictions have no
 * column in these forms (the CLI says so when a trace has them). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/progress.h"
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

/* g in [1e-4, 1] to 6 significant digits without printf: v = g * 10^p rounded, p = 5..9 (the
 * product is exact in double: 24 bits of g times the 5^p <= 5^9 part of 10^p, 45 bits). Writes
 * the decimal ("0.71") and returns its length when it reads back to g bit for bit, else 0. */
static int format_short(float g, char *out) {
    static const double pow10[10] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9};
    if (!(g >= 1e-4f && g <= 1.0f)) return 0;
    int p = g >= 1.0f ? 5 : g >= 0.1f ? 6 : g >= 0.01f ? 7 : g >= 0.001f ? 8 : 9;
    double v = nearbyint((double)g * pow10[p]);
    double back = v / pow10[p]; /* correctly rounded (Clinger: v < 2^53, 10^p exact) */
    uint64_t bits;
    memcpy(&bits, &back, sizeof bits);
    if ((bits & 0x1FFFFFFFu) == 0x10000000u || (float)back != g) return 0; /* midpoint: no */
    uint64_t n = (uint64_t)v;
    char digits[24];
    int nd = 0;
    do {
        digits[nd++] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    /* digits[] holds v backwards; the value is v / 10^p */
    int len = 0, frac_start;
    if (nd > p) { /* integer part present (g == 1 -> "1") */
        for (int i = nd - 1; i >= p; i--) out[len++] = digits[i];
    } else {
        out[len++] = '0';
    }
    out[len++] = '.';
    frac_start = len;
    for (int i = p - 1; i >= 0; i--) out[len++] = i < nd ? digits[i] : '0';
    while (len > frac_start && out[len - 1] == '0') len--;
    if (len == frac_start) len--; /* no fraction: drop the '.' */
    return len;
}

/* The shortest of 6 and 9 significant digits that reads back to the same float (9 always
 * suffice for a float). */
static void out_float(out_buf *o, float g) {
    char tmp[32];
    int n = format_short(g, tmp);
    if (n == 0 && !(g >= 1e-4f && g <= 1.0f)) { /* outside format_short's range: ask printf */
        n = snprintf(tmp, sizeof tmp, "%.6g", (double)g);
        float back = strtof(tmp, NULL);
        if (memcmp(&back, &g, sizeof g)) n = 0;
    }
    if (n == 0) n = snprintf(tmp, sizeof tmp, "%.9g", (double)g);
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
                                 bool show_progress, const char *what, moesim_error *err) {
    MOESIM_ASSERT(format == TRACE_TEXT_JSONL || format == TRACE_TEXT_CSV); /* text only */
    out_buf o = {.fp = fp, .buf = moesim_xmalloc(EXPORT_BUFFER_BYTES)};
    progress bar;
    progress_begin(&bar, "export", t->n_tokens, show_progress);
    write_header(&o, format, t->meta.top_k);
    for (uint64_t i = 0; i < t->n_tokens && !o.failed; i++) {
        for (uint32_t l = 0; l < t->meta.n_layers; l++)
            if (trace_experts(t, i, l)[0] != TRACE_NO_EXPERT) write_row(&o, format, t, i, l);
        if ((i & 4095) == 0) progress_update(&bar, i);
    }
    out_flush(&o);
    progress_update(&bar, t->n_tokens);
    progress_end(&bar);
    free(o.buf);
    if (o.failed || fflush(fp) != 0 || ferror(fp))
        return moesim_fail(err, MOESIM_EIO, "%s: write failed: %s", what, strerror(errno));
    return MOESIM_OK;
}
