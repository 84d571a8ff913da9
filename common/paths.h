/* Where moesim finds its data: model and hw configs, policy presets, quant.ini, plot scripts and
 * experiments. The data search path is an ordered list of folders, each laid out like an
 * installed share/moesim (configs/{models,hw,policies}, configs/quant.ini, plots/, experiments/):
 *   1. every folder of $MOESIM_DATA_PATH (colon-separated), in order; the CLI puts every
 *      --data-dir DIR in front of it, in the order given (cli/main.c);
 *   2. ../share/moesim beside the executable (an installed copy);
 *   3. the source tree the executable was built from, only when it runs from its build tree;
 *   4. the same two beside libmoesim when this code runs from it (the `moesim` program links it:
 *      the same folders as 2 and 3 in a build or install; for Python, the library's own).
 * The first folder holding a file wins, so a user's folder adds to the shipped data and can
 * override one file of it. A name containing '/' or ending in ".ini" is always taken as a path. */
#ifndef MOESIM_COMMON_PATHS_H
#define MOESIM_COMMON_PATHS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/status.h"

/* The search path is read once, at the first lookup. */
/* The number of folders on the search path, and the i-th of them (borrowed). */
size_t moesim_data_path_count(void);
const char *moesim_data_path_at(size_t i);

/* Finds `rel` ("plots/x.gp", "configs/quant.ini") in the first folder of the search path holding
 * it and writes its path into out. Not found: an error "`what` REL not found (looked in A, B)". */
moesim_status moesim_data_find(const char *rel, const char *what, char *out, size_t out_len,
                               moesim_error *err);

/* 0 when `name` can be a config's name (what a trace stores to find its model): printable ASCII
 * without spaces or '/', never a path; else the 1-based position of the first character that
 * cannot. */
size_t moesim_config_name_fault(const char *name);

/* Resolves `name` of `kind` ("models", "hw", "policies") to an existing file: a path is taken
 * as is, a name is looked up as configs/KIND/NAME.ini along the search path. An unknown name is
 * an error listing the known names and the folders searched. */
moesim_status moesim_config_path(const char *kind, const char *name, char *out, size_t out_len,
                                 moesim_error *err);

/* Writes the known names of `kind` over the whole search path, sorted, each once and
 * comma-separated, into out. */
void moesim_config_names(const char *kind, char *out, size_t out_len);

/* Writes the folders searched for `sub` ("configs/hw"; "" for the folders themselves),
 * comma-separated, into out. */
void moesim_data_path_describe(const char *sub, char *out, size_t out_len);

/* The folder holding `path`, with POSIX dirname semantics ("/" for "/data.csv", "." for
 * "data.csv", "a" for "a/b/"), written into out (cut to fit) without touching `path`. */
void moesim_path_dirname(const char *path, char *out, size_t out_len);

/* `rel` taken relative to folder `base` (rel itself when absolute), written into out. */
void moesim_path_join(const char *base, const char *rel, char *out, size_t out_len);

/* Whether paths a and b name one existing file (the same device and inode). */
bool moesim_same_file(const char *a, const char *b);

/* fopen(path, mode) of an input file of `what` ("cost table", "prompts"): a directory, which
 * fopen takes and whose reads fail, is refused as one; MOESIM_EIO names the open's failure. */
moesim_status moesim_open_input(const char *path, const char *mode, const char *what, FILE **out,
                                moesim_error *err);

/* mkdir -p of the folder holding `path` (nothing to do for a bare file name). */
moesim_status moesim_path_make_parents(const char *path, moesim_error *err);
/* The same, noting in `made` (made_len bytes) the outermost folder it created ("" when none),
 * so that a command that fails can take back what it made: moesim_path_remove_made. */
moesim_status moesim_path_make_parents_noted(const char *path, char *made, size_t made_len,
                                             moesim_error *err);
/* Removes the folders holding `path` from the innermost up to `made` (moesim_path_make_parents_
 * noted's), each only while it is empty. */
void moesim_path_remove_made(const char *path, const char *made);

#endif
