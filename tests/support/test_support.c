/* Scratch files and subprocess runs for tests; see test_support.h. */
#define _XOPEN_SOURCE 700 /* nftw, beside the project's POSIX 2008 */
#include "support/test_support.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb, (void)type, (void)ftw;
    remove(path);
    return 0;
}

/* Removes what an earlier process of the same pid left under `root` (the scratch folder lives
 * across runs, and a reused pid would find another test's files where it expects none). */
static void clear_stale(const char *root, pid_t pid) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "%d-", (int)pid);
    DIR *d = opendir(root);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, (size_t)n)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    closedir(d);
}

const char *test_tmp_path(const char *name) {
    static char slots[8][4096];
    static int next;
    static pid_t cleared; /* Criterion forks each test: once per process */
    const char *root = getenv("MOESIM_TEST_TMP");
    if (!root || !*root) root = "/tmp/moesim-test";
    mkdir(root, 0755);
    if (cleared != getpid()) {
        cleared = getpid();
        clear_stale(root, cleared);
    }
    char *buf = slots[next++ % 8];
    snprintf(buf, sizeof slots[0], "%s/%d-%s", root, (int)getpid(), name);
    return buf;
}

void test_write_bytes(const char *path, const void *data, size_t len) {
    FILE *fp = fopen(path, "wb");
    cr_assert(fp, "cannot write %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, len, fp), len);
    cr_assert_eq(fclose(fp), 0);
}

void test_write_file(const char *path, const char *text) { test_write_bytes(path, text, strlen(text)); }

char *test_read_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "cannot read %s: %s", path, strerror(errno));
    cr_assert_eq(fseek(fp, 0, SEEK_END), 0);
    long n = ftell(fp);
    cr_assert(n >= 0);
    rewind(fp);
    char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    buf[n] = '\0';
    if (len) *len = (size_t)n;
    return buf;
}

int test_file_exists(const char *path) { return access(path, F_OK) == 0; }

static void drain(int fd, char *buf, size_t len) {
    size_t used = 0;
    char scratch[4096];
    for (;;) {
        char *dst = buf && used + 1 < len ? buf + used : scratch;
        size_t room = buf && used + 1 < len ? len - 1 - used : sizeof scratch;
        ssize_t n = read(fd, dst, room);
        if (n <= 0) break;
        if (dst != scratch) used += (size_t)n;
    }
    if (buf && len) buf[used] = '\0';
}

int test_run_moesim(char *out, size_t out_len, char *err, size_t err_len, const char *arg, ...) {
    const char *bin = getenv("MOESIM_BIN");
    cr_assert(bin && *bin, "MOESIM_BIN is not set (run the tests through ctest)");
    const char *argv[64] = {bin};
    int argc = 1;
    va_list ap;
    va_start(ap, arg);
    for (const char *a = arg; a && argc < 63; a = va_arg(ap, const char *)) argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;

    char out_tmp[4096], err_tmp[4096];
    snprintf(out_tmp, sizeof out_tmp, "%s", test_tmp_path("stdout"));
    snprintf(err_tmp, sizeof err_tmp, "%s", test_tmp_path("stderr"));
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int o = open(out_tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0) _exit(127);
        dup2(o, STDOUT_FILENO);
        dup2(e, STDERR_FILENO);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    int o = open(out_tmp, O_RDONLY), e = open(err_tmp, O_RDONLY);
    if (o >= 0) drain(o, out, out_len), close(o);
    if (e >= 0) drain(e, err, err_len), close(e);
    unlink(out_tmp);
    unlink(err_tmp);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
