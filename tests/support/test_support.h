/* Helpers shared by the Criterion tests: scratch paths and running the moesim binary. */
#ifndef MOESIM_TESTS_SUPPORT_H
#define MOESIM_TESTS_SUPPORT_H

#include <stddef.h>

/* A fresh path under $MOESIM_TEST_TMP (created if needed) unique to this process and `name`.
 * Returns a static buffer per call slot: copy it if you need several at once. */
const char *test_tmp_path(const char *name);

/* Writes `text` to `path` (aborts the test on failure). */
void test_write_file(const char *path, const char *text);
void test_write_bytes(const char *path, const void *data, size_t len);

/* The whole file at `path`, NUL-terminated (caller frees); its length in *len unless NULL. */
char *test_read_file(const char *path, size_t *len);

/* Runs `$MOESIM_BIN args...` (NULL-terminated) with stdout and stderr captured into the given
 * buffers (either may be NULL). Returns the exit status, or -1 when killed by a signal. */
int test_run_moesim(char *out, size_t out_len, char *err, size_t err_len, const char *arg, ...);

/* True when `path` exists. */
int test_file_exists(const char *path);

#endif
