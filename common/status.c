/* One-line error messages; see status.h. */
#include "common/status.h"

#include <stdio.h>
#include <string.h>

moesim_status moesim_vfail(moesim_error *err, moesim_status status, const char *fmt, va_list ap) {
    if (err) {
        err->status = status;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        /* one line: a message built from file contents must not spill over several */
        for (char *c = err->msg; *c; c++)
            if (*c == '\n' || *c == '\r') *c = ' ';
    }
    return status;
}

moesim_status moesim_fail(moesim_error *err, moesim_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    moesim_vfail(err, status, fmt, ap);
    va_end(ap);
    return status;
}

void moesim_error_prefix(moesim_error *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[MOESIM_ERROR_MAX], old[MOESIM_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
}
