/* Reading a policy's knobs from its config section (policy_read_knobs, policies/policy.h). */
#include <stdlib.h>

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

bool policy_ignores_lookahead(const policy_methods *m, const void *knobs) {
    return m->ignores_lookahead || (m->ignores_lookahead_with && m->ignores_lookahead_with(knobs));
}
