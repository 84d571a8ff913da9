/* Temp-file-and-rename writing; see atomic_file.h. */
#include "common/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/paths.h"

#define ATOMIC_FILE_TRIES 100 /* names tried before giving up (each taken one is EEXIST) */

/* The file the rename is to replace: `path`, or the regular file a symbolic link at `path` names
 * (written through, the link kept). Anything else already there (a directory, a device, a FIFO,
 * a link to nothing) is refused before any work: the rename would replace the node itself. */
static moesim_status destination(atomic_file *af, const char *path, moesim_error *err) {
    if (!path[0])
        return moesim_fail(err, MOESIM_EINPUT, "an empty output path (expected a file path)");
    struct stat link, target;
    bool is_link = lstat(path, &link) == 0 && S_ISLNK(link.st_mode);
    bool exists = stat(path, &target) == 0;
    if (exists && !S_ISREG(target.st_mode))
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: %s, not a regular file (expected a file path to write)", path,
                           S_ISDIR(target.st_mode) ? "a directory" : "a device, FIFO or socket");
    if (is_link && !exists)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: a symbolic link to nothing (expected a file path to write)", path);
    if (is_link) {
        if (!realpath(path, af->path))
            return moesim_fail(err, MOESIM_EIO, "%s: cannot resolve the symbolic link: %s", path,
                               strerror(errno));
    } else if (snprintf(af->path, sizeof af->path, "%s", path) >= (int)sizeof af->path) {
        return moesim_fail(err, MOESIM_EINPUT, "%s: path too long", path);
    }
    return MOESIM_OK;
}

/* Creates the temporary "<path>.tmp-<pid>-<tag>-<try>" with O_EXCL and mode 0666, so the
 * process umask applies by itself (no umask() round trip: that is process-wide state, racy with
 * threads). tag mixes the clock and the atomic_file's address, so concurrent writers in one
 * process start from different names; a name already taken (EEXIST) moves on to the next. */
static moesim_status make_temp(atomic_file *af, const char *path, moesim_error *err, int *fd_out) {
    af->fp = NULL;
    af->tmp_path[0] = '\0';
    moesim_status st = destination(af, path, err);
    if (st) return st;
    path = af->path;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned long tag = (unsigned long)((uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^
                                        (uint64_t)(uintptr_t)af) &
                        0xffffffffUL;
    int e = EEXIST;
    for (unsigned t = 0; t < ATOMIC_FILE_TRIES && e == EEXIST; t++) {
        if (snprintf(af->tmp_path, sizeof af->tmp_path, "%s.tmp-%ld-%08lx-%u", path, (long)getpid(),
                     tag, t) >= (int)sizeof af->tmp_path) {
            af->tmp_path[0] = '\0';
            return moesim_fail(err, MOESIM_EINPUT, "%s: path too long", path);
        }
        int fd = open(af->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
            *fd_out = fd;
            return MOESIM_OK;
        }
        e = errno;
    }
    af->tmp_path[0] = '\0';
    return moesim_fail(err, MOESIM_EIO, "%s: cannot create output file: %s", path, strerror(e));
}

moesim_status atomic_file_check_not_input(const char *out, const char *in, moesim_error *err) {
    if (!moesim_same_file(out, in)) return MOESIM_OK;
    return moesim_fail(err, MOESIM_EINPUT,
                       "%s: is the input %s: writing it would replace it "
                       "(expected another output path)",
                       out, in);
}

moesim_status atomic_file_check_writable(const char *path, moesim_error *err) {
    atomic_file af;
    moesim_status st = atomic_file_begin_path(&af, path, err);
    if (!st) atomic_file_abort(&af);
    return st;
}

moesim_status atomic_file_check_outputs(const char *const *outs, size_t n_outs,
                                        const char *const *ins, size_t n_ins, moesim_error *err) {
    for (size_t i = 0; i < n_outs; i++) {
        if (!outs[i]) continue;
        for (size_t j = 0; j < n_ins; j++)
            if (ins[j]) {
                moesim_status st = atomic_file_check_not_input(outs[i], ins[j], err);
                if (st) return st;
            }
        for (size_t j = 0; j < i; j++)
            if (outs[j] && (!strcmp(outs[i], outs[j]) || moesim_same_file(outs[i], outs[j])))
                return moesim_fail(err, MOESIM_EINPUT,
                                   "%s: named for two outputs: one would replace the other "
                                   "(expected two paths)",
                                   outs[i]);
    }
    return MOESIM_OK;
}

moesim_status atomic_file_open(atomic_file *af, const char *path, moesim_error *err) {
    int fd;
    moesim_status st = make_temp(af, path, err, &fd);
    if (st) return st;
    af->fp = fdopen(fd, "w");
    if (!af->fp) {
        close(fd);
        atomic_file_abort(af);
        return moesim_fail(err, MOESIM_EIO, "%s: cannot open output file", path);
    }
    return MOESIM_OK;
}

moesim_status atomic_file_begin_path(atomic_file *af, const char *path, moesim_error *err) {
    int fd;
    moesim_status st = make_temp(af, path, err, &fd);
    if (st) return st;
    close(fd);
    return MOESIM_OK;
}

moesim_status atomic_file_commit(atomic_file *af, moesim_error *err) {
    if (af->fp) {
        int bad = fflush(af->fp) != 0 || ferror(af->fp) || fsync(fileno(af->fp)) != 0;
        bad |= fclose(af->fp) != 0;
        af->fp = NULL;
        if (bad) {
            int e = errno;
            atomic_file_abort(af);
            return moesim_fail(err, MOESIM_EIO, "%s: write failed: %s", af->path, strerror(e));
        }
    }
    if (rename(af->tmp_path, af->path) != 0) {
        int e = errno;
        atomic_file_abort(af);
        return moesim_fail(err, MOESIM_EIO, "%s: cannot move output into place: %s", af->path,
                           strerror(e));
    }
    af->tmp_path[0] = '\0';
    return MOESIM_OK;
}

void atomic_file_abort(atomic_file *af) {
    if (af->fp) fclose(af->fp);
    af->fp = NULL;
    if (af->tmp_path[0]) unlink(af->tmp_path);
    af->tmp_path[0] = '\0';
}
