/* Reports a broken invariant with its location and aborts (so a core dump or debugger sees it). */
#include "common/check.h"

#include <stdio.h>
#include <stdlib.h>

_Noreturn void moesim_assert_fail(const char *expr, const char *file, int line, const char *func) {
    fflush(stdout);
    fprintf(stderr, "moesim: internal error: assertion '%s' failed in %s at %s:%d\n", expr, func,
            file, line);
    abort();
}
