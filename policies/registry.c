/* The policy registry: every policy's static const table, by name, in listing order. A new
 * policy adds one line here (and its file under policies/). */
#include <stdio.h>
#include <string.h>

#include "common/check.h"
#include "policies/policy.h"

extern const policy_methods policy_ondemand;
extern const policy_methods policy_lru;
extern const policy_methods policy_lfu;
extern const policy_methods policy_static;
extern const policy_methods policy_mixtral_offload;
extern const policy_methods policy_oracle;
extern const policy_methods policy_dymoe;
extern const policy_methods policy_dynaexq;
extern const policy_methods policy_firm_moe;

static const policy_methods *const registry[] = {
    &policy_ondemand,
    &policy_lru,
    &policy_lfu,
    &policy_static,
    &policy_mixtral_offload,
    &policy_oracle,
    &policy_dymoe,
    &policy_dynaexq,
    &policy_firm_moe,
};

const policy_methods *policy_lookup(const char *name) {
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(registry); i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    return NULL;
}

const policy_methods *const *policy_all(size_t *n) {
    *n = MOESIM_ARRAY_LEN(registry);
    return registry;
}

/* Built on each call into a buffer sized for every name; static storage is read-only after the
 * first build would need a global, so the string lives in a function-local constant buffer
 * filled deterministically (same content every call). */
const char *policy_names(void) {
    static _Thread_local char buf[1024];
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(registry) && off < sizeof buf; i++)
        off +=
            (size_t)snprintf(buf + off, sizeof buf - off, "%s%s", i ? ", " : "", registry[i]->name);
    return buf;
}
