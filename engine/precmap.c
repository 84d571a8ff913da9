/* Per-(MoE layer, expert) precision maps (engine.h): uniform ones and the text file format. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/paths.h"
#include "engine/engine_internal.h"
#include "kernels/quant.h"

void engine_precmap_init(engine_precmap *m, const engine *e, uint8_t prec) {
    m->n_layers = e->cfg.n_moe_layers;
    m->n_experts = e->cfg.n_experts;
    m->prec = moesim_xmalloc((size_t)m->n_layers * m->n_experts);
    memset(m->prec, prec, (size_t)m->n_layers * m->n_experts);
}

void engine_precmap_free(engine_precmap *m) {
    free(m->prec);
    m->prec = NULL;
}

moesim_status engine_precmap_load(engine_precmap *m, const engine *e, const char *path,
                                  moesim_error *err) {
    FILE *fp;
    moesim_status opened = moesim_open_input(path, "r", "precision map", &fp, err);
    if (opened) return opened;
    engine_precmap_init(m, e, PREC_BF16);
    char line[1 << 16];
    uint32_t layer = 0, lineno = 0;
    moesim_status st = MOESIM_OK;
    while (!st && fgets(line, sizeof line, fp)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *save, *tok = strtok_r(line, " \t\r\n,", &save);
        if (!tok) continue;
        if (layer >= m->n_layers) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: more than %u MoE layer lines", path,
                             lineno, m->n_layers);
            break;
        }
        uint32_t j = 0;
        for (; tok; tok = strtok_r(NULL, " \t\r\n,", &save), j++) {
            if (j >= m->n_experts) {
                st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: more than %u experts", path, lineno,
                                 m->n_experts);
                break;
            }
            moesim_precision p;
            if (!strcmp(tok, "skip")) {
                m->prec[layer * m->n_experts + j] = ENGINE_PREC_SKIP;
            } else if (quant_precision_parse(tok, &p) && engine_has_precision(e, p)) {
                m->prec[layer * m->n_experts + j] = (uint8_t)p;
            } else {
                st = moesim_fail(err, MOESIM_EINPUT,
                                 "%s:%u: expert %u: '%.16s' is not a loaded precision (expected "
                                 "bf16, int8, int4, int2 as loaded, or skip)", path, lineno, j,
                                 tok);
                break;
            }
        }
        if (!st && j != m->n_experts)
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: %u entries, expected %u (one per expert)",
                             path, lineno, j, m->n_experts);
        layer++;
    }
    fclose(fp);
    if (!st && layer != m->n_layers)
        st = moesim_fail(err, MOESIM_EINPUT, "%s: %u layer lines, expected %u (one per MoE layer)",
                         path, layer, m->n_layers);
    if (st) engine_precmap_free(m);
    return st;
}
