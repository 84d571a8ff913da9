/* INI configuration: loading (through inih), `--set section.key=value` overrides, and
 * table-driven typed extraction that validates every key.
 *
 * A `config` is a list of entries (section, key, value) that remembers where each came from
 * (file and line, or "--set"), so every error names its origin:
 *   configs/hw/a6000.ini:12: [pcie] h2d_gb_per_s: expected a number in [0.1, 1000], got 'fast'
 * Consumers describe the keys they accept with a config_field table and call config_read_fields;
 * keys present in a described section but not in the table are errors, and config_check_unused
 * reports entries that no table claimed (a misspelled section). Several files may be loaded into
 * one config (a run combines hw, model and policy files) as long as their sections differ or the
 * later file is meant to override. */
#ifndef MOESIM_COMMON_CONFIG_H
#define MOESIM_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct config config;

typedef enum config_type {
    CONFIG_U32,  /* uint32_t */
    CONFIG_U64,  /* uint64_t */
    CONFIG_F64,  /* double */
    CONFIG_BOOL, /* bool: true/false, yes/no, on/off, 1/0 */
    CONFIG_STR,  /* char[size]: the value must fit */
    CONFIG_ENUM, /* int: index of the value in `choices` */
} config_type;

typedef struct config_field {
    const char *section;
    const char *key;
    config_type type;
    size_t offset;              /* of the destination member in the struct passed to read */
    size_t size;                /* CONFIG_STR: size of the char array */
    bool required;              /* absent and required: error; absent and optional: `def` */
    double min, max;            /* numbers: inclusive range (ignored when min > max) */
    const char *const *choices; /* CONFIG_ENUM: NULL-terminated names */
    const char *def;            /* optional fields: default, written as it would be in a file */
    const char *help;           /* one line for --help listings */
} config_field;

config *config_create(void);    /* empty; caller owns, config_destroy */
void config_destroy(config *c); /* accepts NULL */

/* Adds every entry of an INI file (later files override earlier entries with the same
 * section and key). Duplicate keys within one file and malformed lines are errors. */
moesim_status config_load_file(config *c, const char *path, moesim_error *err);
/* The same for INI text held in memory (a model config stored in a trace); messages name it
 * `origin` as they would a file. */
moesim_status config_load_text(config *c, const char *origin, const char *text, moesim_error *err);

/* Applies "section.key=value" (the form of --set) with origin "--set". */
moesim_status config_set(config *c, const char *assignment, moesim_error *err);

/* Sets an entry programmatically (origin names who set it, e.g. "sweep axis"). */
void config_put(config *c, const char *section, const char *key, const char *value,
                const char *origin);

/* Raw value or NULL; marks the entry used. */
const char *config_get(config *c, const char *section, const char *key);
bool config_has_section(const config *c, const char *section);

/* Fills `dst` from the entries described by `fields` and marks them used. Every key in a section
 * named by `fields` must be described by some field of that section (unknown key error). */
moesim_status config_read_fields(config *c, const config_field *fields, size_t n_fields, void *dst,
                                 moesim_error *err);

/* Checks a table of fields written elsewhere (a plug-in's knobs) before it is used: a section and
 * a key each, a known type, enum choices, every member inside the dst_size-byte struct, and a
 * default that parses. A built-in table's faults are bugs (config_read_fields asserts). */
moesim_status config_check_fields(const config_field *fields, size_t n_fields, size_t dst_size,
                                  moesim_error *err);

/* Where the entry (section, key) came from, for cross-field error messages: "file:line",
 * "--set" or another origin given to config_put; when the entry is absent, the file its section
 * came from (else the last file loaded), as "missing key" errors name it. */
void config_origin(const config *c, const char *section, const char *key, char *buf, size_t len);

/* Error for the first entry that no config_read_fields/config_get has used. */
moesim_status config_check_unused(const config *c, moesim_error *err);

/* Iteration in insertion order (for writing a resolved configuration next to results). */
size_t config_size(const config *c);
void config_entry_at(const config *c, size_t i, const char **section, const char **key,
                     const char **value);

/* Parsing helpers shared with command-line options: whole-string conversions. */
bool config_parse_u64(const char *s, uint64_t *out);
bool config_parse_f64(const char *s, double *out); /* finite values only */
bool config_parse_bool(const char *s, bool *out);

#endif
