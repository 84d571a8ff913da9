/* stderr messages with a level prefix; see log.h. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>

void log_msg(log_level current, log_level level, const char *fmt, ...) {
    if (level > current) return;
    fputs(level == LOG_WARN ? "moesim: warning: " : "moesim: ", stderr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
