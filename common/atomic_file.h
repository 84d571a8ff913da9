/* Crash-safe output: write to a temporary name in the destination's folder, then rename over
 * the destination only once everything is written, so a reader never sees a half-written file
 * and a failed command leaves nothing behind. */
#ifndef MOESIM_COMMON_ATOMIC_FILE_H
#define MOESIM_COMMON_ATOMIC_FILE_H

#include <limits.h>
#include <stdio.h>

#include "common/status.h"

typedef struct atomic_file {
    char path[PATH_MAX];     /* the destination */
    char tmp_path[PATH_MAX]; /* where the bytes go until commit */
    FILE *fp;                /* NULL for atomic_file_begin_path users (they open tmp_path) */
} atomic_file;

/* MOESIM_EINPUT when `out` and `in` name one existing file: the command's output would replace
 * its own input (checked before any work, by the commands that take both). */
moesim_status atomic_file_check_not_input(const char *out, const char *in, moesim_error *err);

/* atomic_file_check_not_input for every output against every input, and no two outputs one
 * file (NULL entries: not given). */
moesim_status atomic_file_check_outputs(const char *const *outs, size_t n_outs,
                                        const char *const *ins, size_t n_ins, moesim_error *err);

/* Whether `path` can be written (its temporary made and removed): a command with several
 * outputs, or a long run before its output, checks each before any work so that a failure
 * leaves nothing half-done. */
moesim_status atomic_file_check_writable(const char *path, moesim_error *err);

/* stdio users: opens a temporary file for writing. */
moesim_status atomic_file_open(atomic_file *af, const char *path, moesim_error *err);
/* libraries that open by name (HDF5): reserves tmp_path (an empty file) for them to create. */
moesim_status atomic_file_begin_path(atomic_file *af, const char *path, moesim_error *err);
/* flushes, syncs and renames onto `path`; on failure the temporary is removed. */
moesim_status atomic_file_commit(atomic_file *af, moesim_error *err);
/* closes and removes the temporary; the destination is untouched. Safe to call twice. */
void atomic_file_abort(atomic_file *af);

#endif
