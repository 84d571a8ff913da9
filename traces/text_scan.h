/* A strict scanner for the flat JSON objects of routing logs and the fields of trace CSV, used
 * by the importer (traces/import.c). Internal to traces/.
 *
 * It works on one line at a time, [p, end) without the newline, never reads past `end`, and
 * accepts exactly RFC 8259 JSON (no comments, no trailing commas, no NaN or Infinity, no leading
 * zeros or '+', valid escapes and UTF-8, nesting depth <= TEXT_SCAN_MAX_DEPTH). Numbers are
 * converted without a locale; floats are rounded once, correctly (a fast exact path, strtof
 * otherwise), so "%.9g" output of a float parses back to the same bits. On failure a function
 * returns false and leaves a static description of what was expected in `why`. */
#ifndef MOESIM_TRACES_TEXT_SCAN_H
#define MOESIM_TRACES_TEXT_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TEXT_SCAN_MAX_DEPTH        64
#define TEXT_SCAN_MAX_NUMBER_CHARS 256 /* longer numbers are refused (no gate needs them) */

typedef struct text_scan {
    const char *p, *end; /* cursor and end of the line */
    const char *why;     /* static text: what was expected where scanning stopped */
} text_scan;

static inline void text_scan_ws(text_scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r')) s->p++;
}

/* Consumes `ch` after optional whitespace; false (why = expect) when absent. */
bool text_scan_char(text_scan *s, char ch, const char *expect);

/* A JSON string at the cursor. Its decoded bytes are written to out[0..cap) (cut to fit; *len
 * is the full decoded length, *cut tells whether it was cut). */
bool text_scan_string(text_scan *s, char *out, size_t cap, size_t *len, bool *cut);

/* Skips one JSON value of any kind (for keys the importer does not know). */
bool text_scan_skip_value(text_scan *s, int depth);

/* A JSON number; *is_integer when it has neither fraction nor exponent. [*start, s->p) is its
 * text. */
bool text_scan_number(text_scan *s, const char **start, bool *is_integer);

/* A non-negative JSON integer <= max. */
bool text_scan_uint(text_scan *s, uint64_t max, uint64_t *out);

/* A JSON number as the nearest float (ties to even); out-of-range magnitudes give inf or 0
 * like strtof, the caller checks ranges. */
bool text_scan_float(text_scan *s, float *out);

#endif
