/* Temp-file-and-rename writing; see atomic_file.h. */
#include "common/atomic_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static moesim_status make_temp(atomic_file *af, const char *path, moesim_error *err, int *fd_out) {
    if (snprintf(af->path, sizeof af->path, "%s", path) >= (int)sizeof af->path ||
        snprintf(af->tmp_path, sizeof af->tmp_path, "%s.tmp-XXXXXX", path) >=
            (int)sizeof af->tmp_path)
        return moesim_fail(err, MOESIM_EINPUT, "%s: path too long", path);
    af->fp = NULL;
    int fd = mkstemp(af->tmp_path);
    if (fd < 0) {
        af->tmp_path[0] = '\0';
        return moesim_fail(err, MOESIM_EIO, "%s: cannot create output file: %s", path,
                           strerror(errno));
    }
    *fd_out = fd;
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
    /* mkstemp made the temporary 0600: give the result the mode a plain fopen would have */
    mode_t mask = umask(0);
    umask(mask);
    if (chmod(af->tmp_path, 0666 & ~mask) != 0) {
        int e = errno;
        atomic_file_abort(af);
        return moesim_fail(err, MOESIM_EIO, "%s: cannot set the output's mode: %s", af->path,
                           strerror(e));
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
