/* The host's side of a policy's setup (policies/policy.h): its knobs from its config section,
 * its creation. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "policies/policy.h"

moesim_status policy_read_knobs(const policy_methods *m, config *c, void **knobs_out,
                                moesim_error *err) {
    *knobs_out = NULL;
    if (!m->n_knobs) return MOESIM_OK; /* an entry in section m->name stays unused: reported */
    void *k = moesim_xcalloc(1, m->knobs_size ? m->knobs_size : 1);
    moesim_status st = config_read_fields(c, m->knobs, m->n_knobs, k, err);
    if (st) {
        free(k);
        return st;
    }
    *knobs_out = k;
    return MOESIM_OK;
}

moesim_status policy_create(const policy_methods *m, const policy_params *params, const void *knobs,
                            policy_mem_view mem, policy **out, moesim_error *err) {
    moesim_error why = {0};
    moesim_status st = m->create(params, knobs, mem, out, &why);
    if (st == MOESIM_OK) return MOESIM_OK;
    if (st != MOESIM_EIO && st != MOESIM_ENOMEM) st = MOESIM_EINPUT;
    why.msg[sizeof why.msg - 1] = '\0';
    for (char *c = why.msg; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    if (!why.msg[0]) strcpy(why.msg, "create failed without saying why");
    return moesim_fail(err, st, "policy '%s': %s", m->name, why.msg);
}

bool policy_ignores_lookahead(const policy_methods *m, const void *knobs) {
    return m->ignores_lookahead || (m->ignores_lookahead_with && m->ignores_lookahead_with(knobs));
}
