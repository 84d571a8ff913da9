/* Roofline cost model and measured cost tables; see cost.h and sim/COST.md. */
#include "sim/cost.h"

#include <gsl/gsl_fit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/paths.h"

#define BF16_BYTES_PER_PARAM 2u

static const char *const cost_op_names[COST_OP_COUNT] = {
    "attention", "router",  "expert_gate_up", "expert_down",
    "shared",    "combine", "dense_ffn",      "lm_head", "attention_proj",
};

const char *cost_op_name(cost_op op) {
    MOESIM_ASSERT(op < COST_OP_COUNT);
    return cost_op_names[op];
}

static bool cost_op_is_expert(cost_op op) {
    return op == COST_EXPERT_GATE_UP || op == COST_EXPERT_DOWN;
}

void cost_model_init(cost_model *c, const hw_profile *hw, const model_geometry *m,
                     const quant_table *q) {
    memset(c, 0, sizeof *c);
    c->hw = *hw;
    c->model = *m;
    c->quant = *q;
    /* Everything non-expert that is per layer: total non-expert params minus embeddings, LM
     * head, final norm, routers, shared experts and dense FFNs, spread evenly over the layers. */
    uint64_t h = m->hidden;
    uint64_t rest = model_non_expert_params(m);
    uint64_t global = (uint64_t)m->vocab * h * (m->tie_embeddings ? 1 : 2) + h;
    uint64_t ffn = 0;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        if (m->is_moe_layer[l])
            ffn += h * m->n_experts + (uint64_t)m->n_shared_experts * 3 * h * m->shared_inter +
                   (m->shared_expert_gate ? h : 0);
        else
            ffn += 3 * h * m->dense_inter;
    }
    uint64_t per_layer = rest > global + ffn ? rest - global - ffn : 0;
    c->attn_params_per_layer = m->n_layers ? per_layer / m->n_layers : 0;
    c->kv_bytes_per_token_layer = m->n_layers ? model_kv_bytes_per_token(m) / m->n_layers : 0;
}

/* ceil(t_ns) as whole ns, clamped to [0, COST_NS_MAX] (NaN counts as the maximum) so that the
 * cast to uint64_t is always defined. */
static uint64_t ns_from_double(double t_ns) {
    if (!(t_ns < (double)COST_NS_MAX)) return COST_NS_MAX;
    if (t_ns <= 0) return 0;
    /* ceil without libm's call (the copy engines ask twice per chunk): below COST_NS_MAX the
     * cast is exact for whole values, so rounding up a fraction is the only step */
    uint64_t whole = (uint64_t)t_ns;
    return whole + ((double)whole < t_ns);
}

uint64_t cost_transfer_ns(uint64_t bytes, double bytes_per_s) {
    MOESIM_ASSERT(bytes_per_s > 0);
    return ns_from_double((double)bytes * 1e9 / bytes_per_s);
}

/* max(compute, memory) + launches, in ns (rounded up). */
static uint64_t roofline_ns(const hw_profile *hw, double flops, double ops_per_s, double bytes,
                            uint32_t kernels) {
    double t_compute = flops / (ops_per_s * hw->compute_efficiency);
    double t_memory = bytes / (hw->hbm_bytes_per_s * hw->hbm_efficiency);
    double t = (t_compute > t_memory ? t_compute : t_memory) * 1e9;
    return ns_from_double(t) + (uint64_t)kernels * hw->kernel_launch_ns;
}

static double expert_ops_per_s(const hw_profile *hw, moesim_precision p) {
    return (p == PREC_INT8 || p == PREC_FP8) ? hw->int8_ops_per_s : hw->bf16_flops_per_s;
}

static uint64_t roofline_op_ns(const cost_model *c, cost_op op, moesim_precision p, double x) {
    const model_geometry *m = &c->model;
    const hw_profile *hw = &c->hw;
    double h = m->hidden, bf = BF16_BYTES_PER_PARAM;
    switch (op) {
    case COST_ATTENTION: {
        /* x = attended positions; tokens are folded into the projections via the caller's
         * split (cost_attention_ns adds the projection part). Here: scores and values. */
        double heads_dim = m->n_heads && m->head_dim ? (double)m->n_heads * m->head_dim : h;
        double flops = 4.0 * heads_dim * x;
        double bytes = (double)c->kv_bytes_per_token_layer * x;
        return roofline_ns(hw, flops, hw->bf16_flops_per_s, bytes, 1);
    }
    case COST_ATTENTION_PROJ: {
        /* x = tokens: read the layer's attention weights once, 2 flops per param per token */
        double params = (double)c->attn_params_per_layer;
        return roofline_ns(hw, 2.0 * x * params, hw->bf16_flops_per_s,
                           bf * (params + 4.0 * x * h), 3);
    }
    case COST_ROUTER:
        return roofline_ns(hw, 2.0 * x * h * m->n_experts, hw->bf16_flops_per_s,
                           bf * h * m->n_experts + bf * x * h, 1);
    case COST_EXPERT_GATE_UP: {
        double w = (double)model_expert_part_bytes(m, &c->quant, PART_GATE, p) +
                   (double)model_expert_part_bytes(m, &c->quant, PART_UP, p);
        double flops = 2.0 * 2.0 * x * h * m->expert_inter;
        double act = bf * x * (h + 2.0 * m->expert_inter);
        return roofline_ns(hw, flops, expert_ops_per_s(hw, p), w + act, 1);
    }
    case COST_EXPERT_DOWN: {
        double w = (double)model_expert_part_bytes(m, &c->quant, PART_DOWN, p);
        double flops = 2.0 * x * h * m->expert_inter;
        double act = bf * x * (h + m->expert_inter);
        return roofline_ns(hw, flops, expert_ops_per_s(hw, p), w + act, 1);
    }
    case COST_SHARED: {
        if (!m->n_shared_experts) return 0;
        double params = 3.0 * h * m->shared_inter * m->n_shared_experts;
        return roofline_ns(hw, 2.0 * x * params, hw->bf16_flops_per_s,
                           bf * params + bf * x * (2.0 * h + 3.0 * m->shared_inter), 2);
    }
    case COST_COMBINE:
        return roofline_ns(hw, 2.0 * x * m->top_k * h, hw->bf16_flops_per_s,
                           bf * x * h * (m->top_k + 2.0), 1);
    case COST_DENSE_FFN: {
        double params = 3.0 * h * m->dense_inter;
        return roofline_ns(hw, 2.0 * x * params, hw->bf16_flops_per_s,
                           bf * params + bf * x * (2.0 * h + 3.0 * m->dense_inter), 2);
    }
    case COST_LM_HEAD: {
        double params = h * m->vocab;
        return roofline_ns(hw, 2.0 * x * params, hw->bf16_flops_per_s,
                           bf * params + 4.0 * x * m->vocab, 1);
    }
    case COST_OP_COUNT:
        break;
    }
    MOESIM_UNREACHABLE();
}

static double curve_eval(const cost_curve *cv, double x) {
    if (x < cv->x[0] || x > cv->x[cv->n - 1] || cv->n == 1) {
        double t = cv->fit_a + cv->fit_b * x;
        return t > 0 ? t : 0;
    }
    uint32_t i = 1;
    while (cv->x[i] < x) i++;
    double f = (x - cv->x[i - 1]) / (cv->x[i] - cv->x[i - 1]);
    return cv->t_ns[i - 1] + f * (cv->t_ns[i] - cv->t_ns[i - 1]);
}

bool cost_table_covers(const cost_model *c, cost_op op, moesim_precision p, double lo, double hi) {
    MOESIM_ASSERT(op < COST_OP_COUNT && p < PREC_COUNT);
    const cost_curve *cv = &c->curve[op][cost_op_is_expert(op) ? p : PREC_BF16];
    if (!c->has_table || !cv->n) return true;
    return lo >= cv->x[0] && hi <= cv->x[cv->n - 1];
}

uint64_t cost_op_ns(const cost_model *c, cost_op op, moesim_precision p, double x) {
    MOESIM_ASSERT(op < COST_OP_COUNT && p < PREC_COUNT);
    if (x <= 0) return 0;
    moesim_precision key = cost_op_is_expert(op) ? p : PREC_BF16;
    const cost_curve *cv = &c->curve[op][key];
    if (c->has_table && cv->n) return ns_from_double(curve_eval(cv, x));
    return roofline_op_ns(c, op, p, x);
}

uint64_t cost_attention_ns(const cost_model *c, uint32_t tokens, uint64_t attended_positions) {
    if (!tokens) return 0;
    /* a table that times attention whole, keyed by attended positions (sim/COST.md) */
    if (c->has_table && c->curve[COST_ATTENTION][PREC_BF16].n &&
        !c->curve[COST_ATTENTION_PROJ][PREC_BF16].n)
        return cost_op_ns(c, COST_ATTENTION, PREC_BF16, (double)attended_positions);
    /* projections (per token) plus the context-dependent part (scores and values over the KV
     * cache), each measured or roofline */
    return cost_op_ns(c, COST_ATTENTION_PROJ, PREC_BF16, tokens) +
           cost_op_ns(c, COST_ATTENTION, PREC_BF16, (double)attended_positions);
}

uint64_t cost_router_ns(const cost_model *c, uint32_t tokens) {
    return cost_op_ns(c, COST_ROUTER, PREC_BF16, tokens);
}
uint64_t cost_expert_gate_up_ns(const cost_model *c, moesim_precision p, uint32_t tokens) {
    return cost_op_ns(c, COST_EXPERT_GATE_UP, p, tokens);
}
uint64_t cost_expert_down_ns(const cost_model *c, moesim_precision p, uint32_t tokens) {
    return cost_op_ns(c, COST_EXPERT_DOWN, p, tokens);
}
uint64_t cost_shared_ns(const cost_model *c, uint32_t tokens) {
    return cost_op_ns(c, COST_SHARED, PREC_BF16, tokens);
}
uint64_t cost_combine_ns(const cost_model *c, uint32_t tokens) {
    return cost_op_ns(c, COST_COMBINE, PREC_BF16, tokens);
}
uint64_t cost_dense_ffn_ns(const cost_model *c, uint32_t tokens) {
    return cost_op_ns(c, COST_DENSE_FFN, PREC_BF16, tokens);
}
uint64_t cost_lm_head_ns(const cost_model *c, uint32_t tokens) {
    return cost_op_ns(c, COST_LM_HEAD, PREC_BF16, tokens);
}

/* ---- measured tables ---- */

static bool cost_op_from_name(const char *s, cost_op *out) {
    for (int i = 0; i < COST_OP_COUNT; i++)
        if (!strcmp(s, cost_op_names[i])) {
            *out = (cost_op)i;
            return true;
        }
    return false;
}

/* A "# model NAME" comment: the model the table was measured for, which must be the run's. */
static moesim_status check_table_model(const cost_model *c, const char *line, const char *path,
                                       unsigned lineno, moesim_error *err) {
    char name[64];
    if (strncmp(line, "# model ", 8) || sscanf(line + 8, "%63s", name) != 1 ||
        !strcmp(name, c->model.name))
        return MOESIM_OK;
    return moesim_fail(err, MOESIM_EINPUT,
                       "%s:%u: a table measured for model %s, this run's model is %s (expected "
                       "a table of `moesim calibrate --model %s`)",
                       path, lineno, name, c->model.name, c->model.name);
}

moesim_status cost_table_load(cost_model *c, const char *path, moesim_error *err) {
    FILE *f;
    moesim_status opened = moesim_open_input(path, "r", "cost table", &f, err);
    if (opened) return opened;
    memset(c->curve, 0, sizeof c->curve); /* a table replaces any earlier one */
    c->has_table = false;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    unsigned lineno = 0, points = 0;
    bool header = false;
    moesim_status st = MOESIM_OK;
    while (!st && (len = getline(&line, &cap, f)) > 0) {
        lineno++;
        if (memchr(line, '\0', (size_t)len)) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: a NUL byte (expected text)", path, lineno);
            break;
        }
        if (line[len - 1] != '\n') { /* every line the writer writes ends with one */
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s:%u: the last line has no end (a truncated file?)", path, lineno);
            break;
        }
        if (lineno == 1) {
            if (strcmp(line, "# moesim cost table v1\n") &&
                strcmp(line, "# moesim cost table v1\r\n"))
                st = moesim_fail(err, MOESIM_EINPUT,
                                 "%s:1: expected the header '# moesim cost table v1'", path);
            header = true;
            continue;
        }
        if ((st = check_table_model(c, line, path, lineno, err))) break;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char op_s[64], prec_s[32];
        double x, t_us;
        char extra[8];
        int n = sscanf(line, "%63s %31s %lf %lf %7s", op_s, prec_s, &x, &t_us, extra);
        if (n <= 0) continue; /* blank or comment */
        cost_op op;
        moesim_precision p;
        if (n != 4) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s:%u: expected 'op precision x time_us' (4 fields)", path, lineno);
            break;
        }
        if (!cost_op_from_name(op_s, &op)) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: unknown op '%s'", path, lineno, op_s);
            break;
        }
        if (!precision_from_name(prec_s, &p)) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: unknown precision '%s'", path, lineno,
                             prec_s);
            break;
        }
        if (!isfinite(x) || x <= 0 || !isfinite(t_us) || t_us < 0 ||
            t_us > COST_TABLE_MAX_TIME_US) {
            st = moesim_fail(err, MOESIM_EINPUT,
                             "%s:%u: expected x > 0 and 0 <= time_us <= %g, got %g and %g", path,
                             lineno, COST_TABLE_MAX_TIME_US, x, t_us);
            break;
        }
        if (!cost_op_is_expert(op) && p != PREC_BF16) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: op '%s' is measured at bf16 only", path,
                             lineno, op_s);
            break;
        }
        cost_curve *cv = &c->curve[op][p];
        if (cv->n == COST_TABLE_MAX_POINTS) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: more than %d points for %s %s", path,
                             lineno, COST_TABLE_MAX_POINTS, op_s, prec_s);
            break;
        }
        if (cv->n && x <= cv->x[cv->n - 1]) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: x must increase within %s %s", path,
                             lineno, op_s, prec_s);
            break;
        }
        cv->x[cv->n] = x;
        cv->t_ns[cv->n] = t_us * 1e3;
        cv->n++;
        points++;
    }
    free(line);
    fclose(f);
    if (st) return st;
    if (!header) return moesim_fail(err, MOESIM_EINPUT, "%s: empty cost table", path);
    if (!points)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: no measurement (expected lines 'op precision x time_us')", path);
    for (int op = 0; op < COST_OP_COUNT; op++)
        for (int p = 0; p < PREC_COUNT; p++) {
            cost_curve *cv = &c->curve[op][p];
            if (!cv->n) continue;
            if (cv->n == 1) {
                cv->fit_a = 0;
                cv->fit_b = cv->t_ns[0] / cv->x[0];
                continue;
            }
            double cov00, cov01, cov11, sumsq;
            gsl_fit_linear(cv->x, 1, cv->t_ns, 1, cv->n, &cv->fit_a, &cv->fit_b, &cov00, &cov01,
                           &cov11, &sumsq);
        }
    c->has_table = true;
    return MOESIM_OK;
}
