/* Where configuration files live. Names given on the command line ("--model mixtral-8x7b") are
 * looked up as <config dir>/<kind>/<name>.ini; a name containing '/' or ending in ".ini" is taken
 * as a path. The config dir is $MOESIM_CONFIG_DIR when set, else the source tree's configs/. */
#ifndef MOESIM_COMMON_PATHS_H
#define MOESIM_COMMON_PATHS_H

#include <stddef.h>

#include "common/status.h"

const char *moesim_config_dir(void); /* borrowed; never NULL */

/* Resolves `name` of `kind` ("models", "hw", "policies") to an existing file path. An unknown
 * name is an error listing the known names of that kind. */
moesim_status moesim_config_path(const char *kind, const char *name, char *out, size_t out_len,
                                 moesim_error *err);

/* Writes the known names of `kind`, sorted and comma-separated, into out. */
void moesim_config_names(const char *kind, char *out, size_t out_len);

/* The folder holding `path`, with POSIX dirname semantics ("/" for "/data.csv", "." for
 * "data.csv", "a" for "a/b/"), written into out (cut to fit) without touching `path`. */
void moesim_path_dirname(const char *path, char *out, size_t out_len);

#endif
