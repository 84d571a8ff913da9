/* The build's version; see version.h. moesim_version.h is generated at build time
 * (scripts/version.cmake) and rewritten only when the commit changes, so this is the one file a
 * new commit recompiles. */
#include "common/version.h"

#include "moesim_version.h"

const char *moesim_version_release(void) { return MOESIM_VERSION; }

const char *moesim_version_describe(void) { return MOESIM_GIT_DESCRIBE; }
