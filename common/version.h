/* The version of this build: the release (CMake's project version) and the `git describe` of the
 * commit it was built from, for --version and the `moesim` object of every JSON and CSV. */
#ifndef MOESIM_COMMON_VERSION_H
#define MOESIM_COMMON_VERSION_H

const char *moesim_version_release(void);  /* "0.1.0" */
const char *moesim_version_describe(void); /* "05e74d0-dirty", "unknown" outside git */

#endif
