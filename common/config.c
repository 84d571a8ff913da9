/* INI loading with line numbers, overrides and schema validation; see config.h.
 *
 * Debian's inih is built without INI_HANDLER_LINENO, so line numbers come from our own reader:
 * inih asks the reader for one line at a time and calls the handler for that line before asking
 * for the next, so the reader's line count is the handler's line. */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/paths.h"

typedef struct config_entry {
    char *section, *key, *value;
    char *origin; /* file path or "--set" */
    int line;     /* 0 when not from a file */
    bool used;
} config_entry;

struct config {
    config_entry *entries;
    size_t n, cap;
    char *last_file; /* named by "missing key" errors when the section is absent too */
};

config *config_create(void) { return moesim_xcalloc(1, sizeof(config)); }

static void entry_free(config_entry *e) {
    free(e->section);
    free(e->key);
    free(e->value);
    free(e->origin);
}

void config_destroy(config *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) entry_free(&c->entries[i]);
    free(c->entries);
    free(c->last_file);
    free(c);
}

static config_entry *find_entry(const config *c, const char *section, const char *key) {
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->entries[i].section, section) && !strcmp(c->entries[i].key, key))
            return &c->entries[i];
    return NULL;
}

static void put_entry(config *c, const char *section, const char *key, const char *value,
                      const char *origin, int line) {
    config_entry *e = find_entry(c, section, key);
    if (e) {
        free(e->value);
        free(e->origin);
    } else {
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 32;
            c->entries = moesim_xrealloc(c->entries, c->cap * sizeof *c->entries);
        }
        e = &c->entries[c->n++];
        e->section = moesim_xstrdup(section);
        e->key = moesim_xstrdup(key);
    }
    e->value = moesim_xstrdup(value);
    e->origin = moesim_xstrdup(origin);
    e->line = line;
    e->used = false;
}

void config_put(config *c, const char *section, const char *key, const char *value,
                const char *origin) {
    put_entry(c, section, key, value, origin, 0);
}

/* ---- loading ---------------------------------------------------------------------------- */

typedef struct file_reader {
    FILE *fp;
    int line;          /* lines handed to inih so far */
    int too_long_line; /* first non-comment line over the inih limit, or 0 */
    int bad_line;      /* first line inih would misread (bad_why says how), or 0 */
    const char *bad_why;
    char *buf;
    size_t buf_cap;
} file_reader;

typedef struct load_state {
    config *c;
    file_reader *reader;
    const char *path;
    size_t first_entry; /* entries before this index came from earlier files */
    moesim_error *err;
    bool failed;
} load_state;

/* Why inih would misread the line buf[0, len) without a word, or NULL: a NUL byte ends its text
 * early; a section header without its ']' leaves the keys after it in no section; text after a
 * section header's ']' is dropped. */
static const char *misread_line(const char *buf, size_t len) {
    if (memchr(buf, '\0', len)) return "a NUL byte (expected text)";
    const char *p = buf;
    while (isspace((unsigned char)*p)) p++;
    if (*p != '[') return NULL;
    const char *close = strchr(p, ']');
    if (!close) return "a section header without its ']'"; /* inih would go on past it */
    for (p = close + 1; isspace((unsigned char)*p); p++) {
    }
    return *p && *p != ';' ? "text after the section header (expected at most a ';' comment)"
                           : NULL;
}

static char *read_line(char *str, int num, void *stream) {
    file_reader *r = stream;
    ssize_t len = getline(&r->buf, &r->buf_cap, r->fp);
    if (len < 0) return NULL;
    r->line++;
    const char *why = misread_line(r->buf, (size_t)len);
    if (why) { /* the file ends there for inih: what follows is not read */
        r->bad_line = r->line;
        r->bad_why = why;
        return NULL;
    }
    if (len >= num) {
        const char *p = r->buf;
        while (isspace((unsigned char)*p)) p++;
        /* a long comment is harmless: cut it; a long setting cannot be read whole */
        if (*p != ';' && *p != '#' && !r->too_long_line) r->too_long_line = r->line;
        len = num - 2;
        r->buf[len] = '\n';
        r->buf[len + 1] = '\0';
        if (*p != ';' && *p != '#') r->buf[0] = '\0';
    }
    memcpy(str, r->buf, (size_t)len + 1 < (size_t)num ? (size_t)len + 1 : (size_t)num);
    str[num - 1] = '\0';
    return str;
}

static int on_entry(void *user, const char *section, const char *name, const char *value) {
    load_state *st = user;
    if (st->failed) return 0;
    int line = st->reader->line;
    if (!*section) {
        moesim_fail(st->err, MOESIM_EINPUT, "%s:%d: %s: key outside any [section]", st->path, line,
                    name);
        st->failed = true;
        return 0;
    }
    for (size_t i = st->first_entry; i < st->c->n; i++) {
        config_entry *e = &st->c->entries[i];
        if (!strcmp(e->section, section) && !strcmp(e->key, name) && !strcmp(e->origin, st->path)) {
            moesim_fail(st->err, MOESIM_EINPUT, "%s:%d: [%s] %s: duplicate key (first set at line %d)",
                        st->path, line, section, name, e->line);
            st->failed = true;
            return 0;
        }
    }
    put_entry(st->c, section, name, value, st->path, line);
    return 1;
}

static moesim_status load_stream(config *c, const char *path, FILE *fp, moesim_error *err);

moesim_status config_load_file(config *c, const char *path, moesim_error *err) {
    FILE *fp;
    moesim_status st = moesim_open_input(path, "r", "config", &fp, err);
    return st ? st : load_stream(c, path, fp, err);
}

moesim_status config_load_text(config *c, const char *origin, const char *text, moesim_error *err) {
    FILE *fp = fmemopen((void *)text, strlen(text), "r");
    if (!fp) return moesim_fail(err, MOESIM_ENOMEM, "%s: cannot read config text", origin);
    return load_stream(c, origin, fp, err);
}

/* Reads an INI stream whose entries are named after `path` in messages; closes fp. */
static moesim_status load_stream(config *c, const char *path, FILE *fp, moesim_error *err) {
    file_reader r = {.fp = fp};
    free(c->last_file);
    c->last_file = moesim_xstrdup(path);
    load_state st = {.c = c, .reader = &r, .path = path, .first_entry = c->n, .err = err};
    int rc = ini_parse_stream(read_line, &r, on_entry, &st);
    bool read_failed = ferror(r.fp) != 0;
    fclose(r.fp);
    free(r.buf);
    if (st.failed) return err ? err->status : MOESIM_EINPUT;
    if (read_failed) return moesim_fail(err, MOESIM_EIO, "%s: cannot read config", path);
    if (r.bad_line && !r.too_long_line && !(rc > 0 && rc < r.bad_line))
        return moesim_fail(err, MOESIM_EINPUT, "%s:%d: %s", path, r.bad_line, r.bad_why);
    if (r.too_long_line)
        return moesim_fail(err, MOESIM_EINPUT, "%s:%d: line longer than %d characters", path,
                           r.too_long_line, INI_MAX_LINE - 2);
    if (rc > 0)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s:%d: expected '[section]', 'key = value' or a ';' comment", path, rc);
    if (rc < 0) return moesim_fail(err, MOESIM_EIO, "%s: cannot read config", path);
    return MOESIM_OK;
}

moesim_status config_set(config *c, const char *assignment, moesim_error *err) {
    const char *eq = strchr(assignment, '=');
    const char *dot = strchr(assignment, '.');
    if (!eq || !dot || dot > eq || dot == assignment || dot + 1 == eq)
        return moesim_fail(err, MOESIM_EINPUT, "--set %s: expected section.key=value", assignment);
    char *section = moesim_xstrdup(assignment);
    section[dot - assignment] = '\0';
    char *key = section + (dot - assignment) + 1;
    key[eq - dot - 1] = '\0';
    /* trim spaces around key and value, as in files */
    const char *value = eq + 1;
    while (isspace((unsigned char)*value)) value++;
    char *v = moesim_xstrdup(value);
    for (size_t n = strlen(v); n && isspace((unsigned char)v[n - 1]); n--) v[n - 1] = '\0';
    put_entry(c, section, key, v, "--set", 0);
    free(section);
    free(v);
    return MOESIM_OK;
}

const char *config_get(config *c, const char *section, const char *key) {
    config_entry *e = find_entry(c, section, key);
    if (!e) return NULL;
    e->used = true;
    return e->value;
}

bool config_has_section(const config *c, const char *section) {
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->entries[i].section, section)) return true;
    return false;
}

size_t config_size(const config *c) { return c->n; }

void config_entry_at(const config *c, size_t i, const char **section, const char **key,
                     const char **value) {
    MOESIM_ASSERT(i < c->n);
    *section = c->entries[i].section;
    *key = c->entries[i].key;
    *value = c->entries[i].value;
}

/* ---- typed values ----------------------------------------------------------------------- */

bool config_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-' || isspace((unsigned char)*s)) return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

bool config_parse_f64(const char *s, double *out) {
    if (!s || !*s || isspace((unsigned char)*s)) return false;
    if (strpbrk(s, "xX")) return false; /* strtod reads hex ("0x10" = 16): not a config's decimal */
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

bool config_parse_bool(const char *s, bool *out) {
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(yes); i++) {
        if (!strcmp(s, yes[i])) return *out = true, true;
        if (!strcmp(s, no[i])) return *out = false, true;
    }
    return false;
}

/* "file:line" or "--set" or "default" for messages */
static void origin_of(const config_entry *e, char *buf, size_t len) {
    if (!e) snprintf(buf, len, "default");
    else if (e->line) snprintf(buf, len, "%s:%d", e->origin, e->line);
    else snprintf(buf, len, "%s", e->origin);
}

static moesim_status bad_value(moesim_error *err, const config_entry *e, const config_field *f,
                               const char *value, const char *expected) {
    char where[600];
    origin_of(e, where, sizeof where);
    return moesim_fail(err, MOESIM_EINPUT, "%s: [%s] %s: expected %s, got '%s'", where, f->section,
                       f->key, expected, value);
}

static moesim_status check_range(moesim_error *err, const config_entry *e, const config_field *f,
                                 const char *value, double v, const char *kind) {
    if (f->min > f->max || (v >= f->min && v <= f->max)) return MOESIM_OK;
    char expected[160];
    snprintf(expected, sizeof expected, "%s in [%.10g, %.10g]", kind, f->min, f->max);
    return bad_value(err, e, f, value, expected);
}

static moesim_status read_field(const config_field *f, const config_entry *e, const char *value,
                                void *dst, moesim_error *err) {
    char *p = (char *)dst + f->offset;
    switch (f->type) {
    case CONFIG_U32:
    case CONFIG_U64: {
        uint64_t v;
        uint64_t limit = f->type == CONFIG_U32 ? UINT32_MAX : UINT64_MAX;
        if (!config_parse_u64(value, &v) || v > limit)
            return bad_value(err, e, f, value, "a non-negative integer");
        if (check_range(err, e, f, value, (double)v, "an integer")) return MOESIM_EINPUT;
        if (f->type == CONFIG_U32) *(uint32_t *)p = (uint32_t)v;
        else *(uint64_t *)p = v;
        return MOESIM_OK;
    }
    case CONFIG_F64: {
        double v;
        if (!config_parse_f64(value, &v)) return bad_value(err, e, f, value, "a finite number");
        if (check_range(err, e, f, value, v, "a number")) return MOESIM_EINPUT;
        *(double *)p = v;
        return MOESIM_OK;
    }
    case CONFIG_BOOL:
        if (!config_parse_bool(value, (bool *)p))
            return bad_value(err, e, f, value, "true or false");
        return MOESIM_OK;
    case CONFIG_STR:
        if (!*value) return bad_value(err, e, f, value, "a non-empty string");
        if (strlen(value) >= f->size) {
            char expected[64];
            snprintf(expected, sizeof expected, "at most %zu characters", f->size - 1);
            return bad_value(err, e, f, value, expected);
        }
        memcpy(p, value, strlen(value) + 1);
        return MOESIM_OK;
    case CONFIG_ENUM: {
        MOESIM_ASSERT(f->choices);
        char expected[400] = "one of";
        for (int i = 0; f->choices[i]; i++) {
            if (!strcmp(value, f->choices[i])) {
                *(int *)p = i;
                return MOESIM_OK;
            }
            size_t n = strlen(expected);
            snprintf(expected + n, sizeof expected - n, "%s %s", i ? "," : "", f->choices[i]);
        }
        return bad_value(err, e, f, value, expected);
    }
    }
    MOESIM_UNREACHABLE();
}

/* Bytes a field of type t writes at its offset. */
static size_t field_width(const config_field *f) {
    switch (f->type) {
    case CONFIG_U32:
        return sizeof(uint32_t);
    case CONFIG_U64:
        return sizeof(uint64_t);
    case CONFIG_F64:
        return sizeof(double);
    case CONFIG_BOOL:
        return sizeof(bool);
    case CONFIG_STR:
        return f->size;
    case CONFIG_ENUM:
        return sizeof(int);
    }
    return 0;
}

moesim_status config_check_fields(const config_field *fields, size_t n_fields, size_t dst_size,
                                  moesim_error *err) {
    char *scratch = moesim_xcalloc(1, dst_size ? dst_size : 1);
    moesim_status st = MOESIM_OK;
    for (size_t i = 0; i < n_fields && !st; i++) {
        const config_field *f = &fields[i];
        if (!f->section || !*f->section || !f->key || !*f->key) {
            st = moesim_fail(err, MOESIM_EINPUT, "field %zu: expected a section and a key", i);
        } else if ((unsigned)f->type > CONFIG_ENUM) {
            st = moesim_fail(err, MOESIM_EINPUT, "[%s] %s: type %d is not a config_type",
                             f->section, f->key, (int)f->type);
        } else if (f->type == CONFIG_STR && f->size < 2) {
            st =
                moesim_fail(err, MOESIM_EINPUT, "[%s] %s: a string field needs a size of 2 or more",
                            f->section, f->key);
        } else if (f->offset > dst_size || field_width(f) > dst_size - f->offset) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "[%s] %s: offset %zu + %zu bytes lies outside the %zu-byte struct",
                             f->section, f->key, f->offset, field_width(f), dst_size);
        } else if (f->type == CONFIG_ENUM && (!f->choices || !f->choices[0])) {
            st = moesim_fail(err, MOESIM_EINPUT, "[%s] %s: an enum field needs its choices",
                             f->section, f->key);
        } else if (f->def) {
            st = read_field(f, NULL, f->def, scratch, err);
        }
    }
    free(scratch);
    return st;
}

/* the file a section came from, for "missing key" messages */
static const char *file_of_section(const config *c, const char *section) {
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->entries[i].section, section) && c->entries[i].line)
            return c->entries[i].origin;
    return c->last_file ? c->last_file : "configuration";
}

void config_origin(const config *c, const char *section, const char *key, char *buf, size_t len) {
    const config_entry *e = find_entry(c, section, key);
    if (e) origin_of(e, buf, len);
    else snprintf(buf, len, "%s", file_of_section(c, section));
}

static bool section_described(const config_field *fields, size_t n, const char *section) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(fields[i].section, section)) return true;
    return false;
}

static bool key_described(const config_field *fields, size_t n, const char *section,
                          const char *key) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(fields[i].section, section) && !strcmp(fields[i].key, key)) return true;
    return false;
}

moesim_status config_read_fields(config *c, const config_field *fields, size_t n_fields, void *dst,
                                 moesim_error *err) {
    for (size_t i = 0; i < c->n; i++) {
        config_entry *e = &c->entries[i];
        if (!section_described(fields, n_fields, e->section)) continue;
        if (!key_described(fields, n_fields, e->section, e->key)) {
            char where[600];
            origin_of(e, where, sizeof where);
            char known[300] = "";
            for (size_t j = 0; j < n_fields; j++) {
                if (strcmp(fields[j].section, e->section)) continue;
                size_t len = strlen(known);
                snprintf(known + len, sizeof known - len, "%s%s", len ? ", " : "", fields[j].key);
            }
            return moesim_fail(err, MOESIM_EINPUT, "%s: [%s] %s: unknown key (known: %s)", where,
                               e->section, e->key, known);
        }
    }
    for (size_t i = 0; i < n_fields; i++) {
        const config_field *f = &fields[i];
        config_entry *e = find_entry(c, f->section, f->key);
        if (e) {
            e->used = true;
            moesim_status st = read_field(f, e, e->value, dst, err);
            if (st) return st;
        } else if (f->required) {
            return moesim_fail(err, MOESIM_EINPUT, "%s: [%s] %s: missing required key",
                               file_of_section(c, f->section), f->section, f->key);
        } else if (f->def) {
            moesim_status st = read_field(f, NULL, f->def, dst, err);
            MOESIM_ASSERT(st == MOESIM_OK); /* a default that does not parse is a bug */
        }
    }
    return MOESIM_OK;
}

moesim_status config_check_unused(const config *c, moesim_error *err) {
    for (size_t i = 0; i < c->n; i++) {
        const config_entry *e = &c->entries[i];
        if (e->used) continue;
        char where[600];
        origin_of(e, where, sizeof where);
        return moesim_fail(err, MOESIM_EINPUT, "%s: [%s] %s: unknown section or key", where,
                           e->section, e->key);
    }
    return MOESIM_OK;
}
