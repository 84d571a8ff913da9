/* Helpers shared by the libFuzzer harnesses of tests/fuzz (header only: each fuzz_<target>.c is
 * one executable; the static state below is per harness process).
 *
 * The parsers under test take a path, as the CLI gives them one, so each input is handed over as
 * a file: the bytes go into one memory-backed file (memfd, no disk I/O per execution) that the
 * parser opens through /proc/self/fd. Error messages name that path; a finding is replayed by
 * running the harness on the crash file. */
#ifndef MOESIM_FUZZ_SUPPORT_H
#define MOESIM_FUZZ_SUPPORT_H

#include <hdf5.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/check.h"
#include "common/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_SCRATCH_FILES 2

/* Writes data[0..size) as the whole content of scratch file `slot` (< FUZZ_SCRATCH_FILES) and
 * returns its path (static: each slot is one file per process, rewritten by every call). */
static inline const char *fuzz_scratch_file(int slot, const void *data, size_t size) {
    static int fds[FUZZ_SCRATCH_FILES] = {-1, -1};
    static char paths[FUZZ_SCRATCH_FILES][64];
    MOESIM_ASSERT(slot >= 0 && slot < FUZZ_SCRATCH_FILES);
    int fd = fds[slot];
    char *path = paths[slot];
    if (fd < 0) {
        fd = memfd_create("moesim-fuzz", 0);
        MOESIM_ASSERT(fd >= 0);
        snprintf(path, sizeof paths[slot], "/proc/self/fd/%d", fd);
        fds[slot] = fd;
    }
    MOESIM_ASSERT(ftruncate(fd, 0) == 0);
    for (size_t done = 0; done < size;) {
        ssize_t n = pwrite(fd, (const char *)data + done, size - done, (off_t)done);
        MOESIM_ASSERT(n > 0);
        done += (size_t)n;
    }
    return path;
}

/* The fuzz input as the harness's main file. */
static inline const char *fuzz_file_of(const uint8_t *data, size_t size) {
    return fuzz_scratch_file(0, data, size);
}

/* Scratch files a harness must open by a real name (a writer renaming into place, HDF5 opening
 * read-write) go to one folder per process: under TMPDIR, else /dev/shm (memory, no disk
 * syncs), else /tmp. fuzz_temp_path returns "DIR/name" (static storage, one per name, at most
 * FUZZ_TEMP_NAMES names); the files and the folder are removed at exit. */
#define FUZZ_TEMP_NAMES 4
static char fuzz_dir[4000];
static char fuzz_temp_paths[FUZZ_TEMP_NAMES][4096];
static inline void fuzz_remove_temp(void) {
    for (int i = 0; i < FUZZ_TEMP_NAMES && fuzz_temp_paths[i][0]; i++) remove(fuzz_temp_paths[i]);
    rmdir(fuzz_dir);
}
static inline const char *fuzz_temp_path(const char *name) {
    if (!fuzz_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fuzz_dir, sizeof fuzz_dir, "%s/moesim-fuzz-XXXXXX", tmp);
        MOESIM_ASSERT(mkdtemp(fuzz_dir));
        atexit(fuzz_remove_temp);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir, name);
    int i = 0;
    while (i < FUZZ_TEMP_NAMES && fuzz_temp_paths[i][0] && strcmp(fuzz_temp_paths[i], path)) i++;
    MOESIM_ASSERT(i < FUZZ_TEMP_NAMES);
    if (!fuzz_temp_paths[i][0]) memcpy(fuzz_temp_paths[i], path, sizeof path);
    return fuzz_temp_paths[i];
}

/* HDF5 identifiers open in this process (files, groups, datasets, attributes, types, spaces,
 * property lists): a reader must leave the count as it found it, or every trace it reads leaves
 * memory behind in libhdf5 where LeakSanitizer cannot see it. */
static inline long long fuzz_h5_open_ids(void) {
    static const H5I_type_t kinds[] = {H5I_FILE,    H5I_GROUP,     H5I_DATATYPE,   H5I_DATASPACE,
                                       H5I_DATASET, H5I_ATTR,      H5I_GENPROP_LST};
    long long n = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        hsize_t members = 0;
        if (H5Inmembers(kinds[i], &members) >= 0) n += (long long)members;
    }
    return n;
}

/* What every parser promises on bad input: a status other than OK comes with one message of
 * one line. */
static inline void fuzz_check_error(moesim_status st, const moesim_error *err) {
    if (st == MOESIM_OK) return;
    MOESIM_ASSERT(err->msg[0] != '\0');
    MOESIM_ASSERT(strchr(err->msg, '\n') == NULL);
}

#endif
