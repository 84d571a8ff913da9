/* Status codes and the one-line error message every fallible moesim call fills.
 *
 * Bad user input (configs, traces, checkpoints, command lines) is not a bug: functions that read
 * it return a moesim_status and write one line into a moesim_error naming the file, the field and
 * what was expected ("trace.h5: /routing/expert_ids[12][3][1]: expert id 130 >= 128 experts").
 * The CLI prints that line and exits with MOESIM_EXIT_INPUT. Broken invariants are bugs and go
 * through MOESIM_ASSERT (check.h) instead. */
#ifndef MOESIM_COMMON_STATUS_H
#define MOESIM_COMMON_STATUS_H

#include <stdarg.h>

typedef enum moesim_status {
    MOESIM_OK = 0,
    MOESIM_EINPUT, /* the input is malformed, inconsistent or out of range */
    MOESIM_EIO,    /* a file could not be opened, read or written */
    MOESIM_ENOMEM, /* an allocation the input asked for could not be satisfied */
} moesim_status;

/* Exit status of the CLI for any error reported through moesim_error. */
#define MOESIM_EXIT_INPUT 2

#define MOESIM_ERROR_MAX 512

typedef struct moesim_error {
    moesim_status status;
    char msg[MOESIM_ERROR_MAX]; /* one line, no trailing newline */
} moesim_error;

/* Records the error (printf-style message) and returns `status`, so callers can write
 * `return moesim_fail(err, MOESIM_EINPUT, "%s: ...", path);`. `err` may be NULL. */
moesim_status moesim_fail(moesim_error *err, moesim_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
moesim_status moesim_vfail(moesim_error *err, moesim_status status, const char *fmt, va_list ap);

/* Prepends "prefix: " to an already recorded message (adds context on the way up). */
void moesim_error_prefix(moesim_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
