/* Loading and checking policy plug-ins (policies/plugin.h). */
#include "policies/plugin.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

struct policy_plugin {
    void *handle;
    const policy_methods *methods;
    char path[4096];
};

/* The first line of dlerror(): the loader's text names the file and the missing piece. */
static const char *dl_reason(void) {
    const char *e = dlerror();
    return e ? e : "unknown dlopen error";
}

/* The knob table: each knob in the policy's own section (where --set name.key reaches it), and
 * a table config_check_fields accepts (a default that does not parse would abort the run). */
static moesim_status check_knobs(const char *path, const policy_methods *m, moesim_error *err) {
    for (size_t i = 0; i < m->n_knobs; i++)
        if (m->knobs[i].section && strcmp(m->knobs[i].section, m->name))
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: %s.knobs[%zu].section: expected the policy's name '%s'", path,
                               POLICY_PLUGIN_SYMBOL, i, m->name);
    moesim_error why;
    if (config_check_fields(m->knobs, m->n_knobs, m->knobs_size, &why))
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s.knobs: %s", path, POLICY_PLUGIN_SYMBOL,
                           why.msg);
    return MOESIM_OK;
}

static moesim_status check_table(const char *path, const policy_methods *m, moesim_error *err) {
    /* api_version first: a table of another API version may have another layout */
    if (m->api_version != POLICY_API_VERSION)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: %s.api_version is %d, this moesim expects policy API version %d "
                           "(rebuild the plug-in against this moesim's policies/policy.h)",
                           path, POLICY_PLUGIN_SYMBOL, m->api_version, POLICY_API_VERSION);
    if (!m->name || !m->name[0])
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s.name: expected a policy name", path,
                           POLICY_PLUGIN_SYMBOL);
    if (strlen(m->name) >= POLICY_NAME_MAX)
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s.name: expected at most %d characters", path,
                           POLICY_PLUGIN_SYMBOL, POLICY_NAME_MAX - 1);
    for (const char *c = m->name; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_')
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: %s.name '%s': expected letters, digits, '-' and '_' only", path,
                               POLICY_PLUGIN_SYMBOL, m->name);
    if (policy_lookup(m->name))
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: policy '%s' is a built-in policy's name: give the plug-in its own",
                           path, m->name);
    const char *missing = !m->create                       ? "create"
                          : !m->on_route                   ? "on_route"
                          : !m->destroy                    ? "destroy"
                          : !m->summary                    ? "summary"
                          : (m->n_knobs && !m->knobs)      ? "knobs"
                          : (m->n_knobs && !m->knobs_size) ? "knobs_size"
                                                           : NULL;
    if (missing)
        return moesim_fail(err, MOESIM_EINPUT, "%s: %s.%s: expected it set (policies/policy.h)",
                           path, POLICY_PLUGIN_SYMBOL, missing);
    return check_knobs(path, m, err);
}

moesim_status policy_plugin_open(const char *path, policy_plugin **out, moesim_error *err) {
    *out = NULL;
    policy_plugin *p = moesim_xcalloc(1, sizeof *p);
    /* dlopen searches the library path for a name without '/': a plug-in is always a file */
    if (!strchr(path, '/'))
        snprintf(p->path, sizeof p->path, "./%s", path);
    else
        snprintf(p->path, sizeof p->path, "%s", path);
    p->handle = dlopen(p->path, RTLD_NOW | RTLD_LOCAL);
    if (!p->handle) {
        moesim_status st = moesim_fail(err, MOESIM_EINPUT, "%s: cannot load the policy plug-in: %s",
                                       path, dl_reason());
        free(p);
        return st;
    }
    dlerror();
    p->methods = dlsym(p->handle, POLICY_PLUGIN_SYMBOL);
    moesim_status st = MOESIM_OK;
    if (!p->methods)
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s: no symbol '%s': a policy plug-in exports its policy_methods table "
                         "under that name (policies/WRITING.md)",
                         path, POLICY_PLUGIN_SYMBOL);
    else
        st = check_table(path, p->methods, err);
    if (st) {
        dlclose(p->handle);
        free(p);
        return st;
    }
    snprintf(p->path, sizeof p->path, "%s", path);
    *out = p;
    return MOESIM_OK;
}

const policy_methods *policy_plugin_methods(const policy_plugin *p) { return p->methods; }

const char *policy_plugin_path(const policy_plugin *p) { return p->path; }

void policy_plugin_close(policy_plugin *p) {
    if (!p) return;
    dlclose(p->handle);
    free(p);
}
