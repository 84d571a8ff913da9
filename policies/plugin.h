/* Policy plug-ins: a shared object (built against the installed policies/policy.h) that exports
 * one `policy_methods` table under the symbol POLICY_PLUGIN_SYMBOL, loaded with dlopen by
 * `moesim sim|replay --policy-lib FILE.so`, an experiment's `policy_lib = FILE.so` and libmoesim.
 * The table is checked before any host calls it: its api_version must equal POLICY_API_VERSION
 * (read first, so a table of another layout is refused before anything else of it is read), its
 * name must be a new one (not a built-in's) and the slots every host calls must be set. The guide
 * for writing one: policies/WRITING.md. */
#ifndef MOESIM_POLICIES_PLUGIN_H
#define MOESIM_POLICIES_PLUGIN_H

#include "common/status.h"
#include "policies/policy.h"

typedef struct policy_plugin policy_plugin;

/* dlopens `path` (a path, not a library name: "./x.so" or "/abs/x.so"; a bare name is taken
 * relative to the working directory) and checks its table. Errors are one line naming the file
 * (MOESIM_EINPUT: not a shared object, no POLICY_PLUGIN_SYMBOL, wrong API version, a missing
 * slot). Caller owns *out (policy_plugin_close). */
moesim_status policy_plugin_open(const char *path, policy_plugin **out, moesim_error *err);

/* The plug-in's table; valid until policy_plugin_close. */
const policy_methods *policy_plugin_methods(const policy_plugin *p);
const char *policy_plugin_path(const policy_plugin *p);

/* Unloads the plug-in (accepts NULL). No policy state of it may be alive. */
void policy_plugin_close(policy_plugin *p);

#endif
