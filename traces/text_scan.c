/* Strict JSON scanning for the importer; see text_scan.h. Numbers are scanned in one pass that
 * checks the grammar and accumulates up to 19 significant digits. Floats: Clinger's fast path in
 * double (mantissa <= 2^53 and |exponent| <= 22 give a correctly rounded double), then one
 * rounding to float, which is exact unless the double sits exactly on a midpoint between two
 * floats (then strtof, like every other case, decides). */
#include "traces/text_scan.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

static bool scan_fail(text_scan *s, const char *why) {
    s->why = why;
    return false;
}

bool text_scan_char(text_scan *s, char ch, const char *expect) {
    text_scan_ws(s);
    if (s->p < s->end && *s->p == ch) {
        s->p++;
        return true;
    }
    return scan_fail(s, expect);
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Four hex digits at p (p + 4 <= end checked by the caller). */
static bool hex4(const char *p, uint32_t *cp) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(p[i]);
        if (h < 0) return false;
        v = v << 4 | (uint32_t)h;
    }
    *cp = v;
    return true;
}

static inline void put_byte(char *out, size_t cap, size_t *n, unsigned char b) {
    if (*n < cap) out[*n] = (char)b;
    (*n)++;
}

static void put_utf8(char *out, size_t cap, size_t *n, uint32_t cp) {
    if (cp < 0x80) {
        put_byte(out, cap, n, (unsigned char)cp);
    } else if (cp < 0x800) {
        put_byte(out, cap, n, (unsigned char)(0xC0 | cp >> 6));
        put_byte(out, cap, n, (unsigned char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        put_byte(out, cap, n, (unsigned char)(0xE0 | cp >> 12));
        put_byte(out, cap, n, (unsigned char)(0x80 | ((cp >> 6) & 0x3F)));
        put_byte(out, cap, n, (unsigned char)(0x80 | (cp & 0x3F)));
    } else {
        put_byte(out, cap, n, (unsigned char)(0xF0 | cp >> 18));
        put_byte(out, cap, n, (unsigned char)(0x80 | ((cp >> 12) & 0x3F)));
        put_byte(out, cap, n, (unsigned char)(0x80 | ((cp >> 6) & 0x3F)));
        put_byte(out, cap, n, (unsigned char)(0x80 | (cp & 0x3F)));
    }
}

/* Length of the valid UTF-8 sequence at p (lead byte >= 0x80), or 0 when it is invalid
 * (overlong, surrogate, above U+10FFFF, truncated). */
static size_t utf8_length(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    size_t len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if ((size_t)(end - p) < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

bool text_scan_string(text_scan *s, char *out, size_t cap, size_t *len, bool *cut) {
    text_scan_ws(s);
    if (s->p >= s->end || *s->p != '"') return scan_fail(s, "expected a string");
    const char *p = s->p + 1, *end = s->end;
    size_t n = 0;
    for (;;) {
        if (p >= end) return scan_fail(s, "unterminated string");
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            p++;
            break;
        }
        if (c < 0x20) return scan_fail(s, "control character inside a string (must be escaped)");
        if (c == '\\') {
            if (end - p < 2) return scan_fail(s, "unterminated escape in a string");
            char e = p[1];
            p += 2;
            switch (e) {
            case '"':
                put_byte(out, cap, &n, '"');
                break;
            case '\\':
                put_byte(out, cap, &n, '\\');
                break;
            case '/':
                put_byte(out, cap, &n, '/');
                break;
            case 'b':
                put_byte(out, cap, &n, '\b');
                break;
            case 'f':
                put_byte(out, cap, &n, '\f');
                break;
            case 'n':
                put_byte(out, cap, &n, '\n');
                break;
            case 'r':
                put_byte(out, cap, &n, '\r');
                break;
            case 't':
                put_byte(out, cap, &n, '\t');
                break;
            case 'u': {
                uint32_t cp;
                if (end - p < 4 || !hex4(p, &cp))
                    return scan_fail(s, "expected 4 hex digits after \\u in a string");
                p += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return scan_fail(s, "lone low surrogate \\u escape in a string");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return scan_fail(s, "high surrogate \\u escape without its low half");
                    p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                put_utf8(out, cap, &n, cp);
                break;
            }
            default:
                return scan_fail(s, "invalid escape in a string");
            }
            continue;
        }
        if (c < 0x80) {
            put_byte(out, cap, &n, c);
            p++;
            continue;
        }
        size_t l = utf8_length((const unsigned char *)p, (const unsigned char *)end);
        if (!l) return scan_fail(s, "invalid UTF-8 inside a string");
        for (size_t i = 0; i < l; i++) put_byte(out, cap, &n, (unsigned char)p[i]);
        p += l;
    }
    s->p = p;
    *len = n;
    *cut = n > cap;
    return true;
}

static inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool text_scan_number(text_scan *s, const char **start, bool *is_integer) {
    text_scan_ws(s);
    const char *p = s->p, *end = s->end;
    *start = p;
    if (p < end && *p == '-') p++;
    if (p >= end || !is_digit(*p)) return scan_fail(s, "expected a number");
    if (*p == '0') {
        p++;
        if (p < end && is_digit(*p)) return scan_fail(s, "leading zero in a number");
    } else {
        while (p < end && is_digit(*p)) p++;
    }
    bool integer = true;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit(*p)) return scan_fail(s, "expected digits after '.'");
        while (p < end && is_digit(*p)) p++;
        integer = false;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || !is_digit(*p)) return scan_fail(s, "expected digits in the exponent");
        while (p < end && is_digit(*p)) p++;
        integer = false;
    }
    if (p - *start > TEXT_SCAN_MAX_NUMBER_CHARS)
        return scan_fail(s, "number longer than 256 characters");
    s->p = p;
    *is_integer = integer;
    return true;
}

bool text_scan_uint(text_scan *s, uint64_t max, uint64_t *out) {
    text_scan_ws(s);
    const char *p = s->p, *end = s->end;
    if (p >= end || !is_digit(*p)) return scan_fail(s, "expected a non-negative integer");
    uint64_t v = 0;
    if (*p == '0') {
        p++;
        if (p < end && is_digit(*p)) return scan_fail(s, "leading zero in a number");
    } else {
        for (; p < end && is_digit(*p); p++) {
            uint64_t d = (uint64_t)(*p - '0');
            if (v > (max - d) / 10) return scan_fail(s, "integer too large");
            v = v * 10 + d;
        }
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E'))
        return scan_fail(s, "expected an integer (no fraction or exponent)");
    s->p = p;
    *out = v;
    return true;
}

static const double pow10_exact[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The float nearest to m * 10^e10 (negated when `neg`); [text, end) is the number's text for
 * the slow path. */
static float decimal_to_float(bool neg, uint64_t m, int64_t e10, bool dropped, const char *text,
                              const char *end) {
    if (m == 0) return neg ? -0.0f : 0.0f;
    if (!dropped && m <= (1ull << 53) && e10 >= -22 && e10 <= 22) {
        double d = (double)m;
        d = e10 < 0 ? d / pow10_exact[-e10] : d * pow10_exact[e10];
        if (d >= FLT_MIN && d <= FLT_MAX) {
            /* rounding d to float is exact unless d is a midpoint between two floats: then the
             * 29 bits a float drops from a double's significand are exactly 1 followed by 0s */
            uint64_t bits;
            memcpy(&bits, &d, sizeof bits);
            if ((bits & 0x1FFFFFFFu) != 0x10000000u) return neg ? -(float)d : (float)d;
        }
    }
    char buf[TEXT_SCAN_MAX_NUMBER_CHARS + 1];
    size_t n = (size_t)(end - text);
    memcpy(buf, text, n);
    buf[n] = '\0';
    return strtof(buf, NULL);
}

bool text_scan_float(text_scan *s, float *out) {
    text_scan_ws(s);
    const char *start = s->p, *p = s->p, *end = s->end;
    bool neg = p < end && *p == '-';
    if (neg) p++;
    if (p >= end || !is_digit(*p)) return scan_fail(s, "expected a number");
    uint64_t m = 0;
    int nd = 0;
    int64_t e10 = 0;
    bool dropped = false; /* nonzero digits beyond the 19 kept */
    if (*p == '0') {
        p++;
        if (p < end && is_digit(*p)) return scan_fail(s, "leading zero in a number");
    } else {
        for (; p < end && is_digit(*p); p++) {
            unsigned d = (unsigned)(*p - '0');
            if (nd < 19)
                m = m * 10 + d, nd++;
            else
                e10++, dropped |= d != 0;
        }
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit(*p)) return scan_fail(s, "expected digits after '.'");
        for (; p < end && is_digit(*p); p++) {
            unsigned d = (unsigned)(*p - '0');
            if (m == 0 && d == 0)
                e10--;
            else if (nd < 19)
                m = m * 10 + d, nd++, e10--;
            else
                dropped |= d != 0;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int64_t sign = 1, ev = 0;
        if (p < end && (*p == '+' || *p == '-')) sign = *p++ == '-' ? -1 : 1;
        if (p >= end || !is_digit(*p)) return scan_fail(s, "expected digits in the exponent");
        for (; p < end && is_digit(*p); p++)
            if (ev < 1000000) ev = ev * 10 + (*p - '0');
        e10 += sign * ev;
    }
    if (p - start > TEXT_SCAN_MAX_NUMBER_CHARS)
        return scan_fail(s, "number longer than 256 characters");
    s->p = p;
    *out = decimal_to_float(neg, m, e10, dropped, start, p);
    return true;
}

bool text_scan_skip_value(text_scan *s, int depth) {
    text_scan_ws(s);
    if (s->p >= s->end) return scan_fail(s, "expected a value");
    char c = *s->p;
    if (c == '"') {
        size_t len;
        bool cut;
        return text_scan_string(s, NULL, 0, &len, &cut);
    }
    if (c == '{' || c == '[') {
        if (depth >= TEXT_SCAN_MAX_DEPTH) return scan_fail(s, "nesting deeper than 64 levels");
        char close = c == '{' ? '}' : ']';
        s->p++;
        text_scan_ws(s);
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return true;
        }
        for (;;) {
            if (c == '{') {
                size_t len;
                bool cut;
                if (!text_scan_string(s, NULL, 0, &len, &cut)) return false;
                if (!text_scan_char(s, ':', "expected ':' after a key")) return false;
            }
            if (!text_scan_skip_value(s, depth + 1)) return false;
            text_scan_ws(s);
            if (s->p < s->end && *s->p == ',') {
                s->p++;
                continue;
            }
            if (s->p < s->end && *s->p == close) {
                s->p++;
                return true;
            }
            return scan_fail(s, c == '{' ? "expected ',' or '}' in an object"
                                         : "expected ',' or ']' in an array");
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(s->end - s->p) >= n && !memcmp(s->p, words[i], n)) {
            s->p += n;
            return true;
        }
    }
    const char *start;
    bool integer;
    if (c == '-' || is_digit(c)) return text_scan_number(s, &start, &integer);
    return scan_fail(s, "expected a value (string, number, object, array, true, false, null)");
}
