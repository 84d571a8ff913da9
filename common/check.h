/* Invariant checks that stay on in release builds. A failing MOESIM_ASSERT is a bug in moesim,
 * never a reaction to bad input (that is a moesim_status, see status.h). */
#ifndef MOESIM_COMMON_CHECK_H
#define MOESIM_COMMON_CHECK_H

_Noreturn void moesim_assert_fail(const char *expr, const char *file, int line, const char *func);

#define MOESIM_ASSERT(expr) \
    ((expr) ? (void)0 : moesim_assert_fail(#expr, __FILE__, __LINE__, __func__))

#define MOESIM_UNREACHABLE() moesim_assert_fail("unreachable", __FILE__, __LINE__, __func__)

#define MOESIM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
