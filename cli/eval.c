/* `moesim eval`: quality of an expert precision choice on real tokens. Runs every sequence of a
 * token file through the engine twice, with all experts at bf16 and under the chosen precision
 * (uniform, or a per-(layer, expert) map file with skips), and reports perplexity of both runs
 * and the KL divergence KL(p_bf16 || p_chosen) of the next-token distributions (nats per token). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/alloc.h"
#include "engine/engine.h"
#include "kernels/quant.h"

static const char usage[] =
    "usage: moesim eval --model DIR --input TOKENS [options]\n"
    "\n"
    "Perplexity and KL divergence against the bf16 run, under a uniform expert precision or a\n"
    "precision map.\n"
    "\n"
    "  --model DIR           Hugging Face checkpoint folder (config.json + safetensors)\n"
    "  --input TOKENS        token ids: one sequence per line, or JSONL with prompt_ids\n"
    "  --precision P         bf16, int8, int4 or int2 for every routed expert (default int4)\n"
    "  --precision-map FILE  one line per MoE layer, one precision (or skip) per expert\n"
    "  --threads N           worker threads (default: all cores)\n"
    "  --json                machine-readable output\n";

typedef struct nll_kl {
    double nll_ref, nll, kl_sum, kl_max;
    uint64_t n;
} nll_kl;

/* log-softmax of x into lp (double) */
static void log_softmax(const float *x, double *lp, uint32_t n) {
    double mx = x[0], s = 0;
    for (uint32_t i = 1; i < n; i++) mx = fmax(mx, x[i]);
    for (uint32_t i = 0; i < n; i++) s += exp(x[i] - mx);
    double lse = mx + log(s);
    for (uint32_t i = 0; i < n; i++) lp[i] = x[i] - lse;
}

static moesim_status score(engine *e, const engine_request *r, const engine_precmap *pm,
                           nll_kl *acc, moesim_error *err) {
    uint32_t V = engine_config_of(e)->vocab;
    engine_seq *a = engine_seq_create(e, r->n_prompt), *b = engine_seq_create(e, r->n_prompt);
    float *la = moesim_xcalloc(V, sizeof *la), *lb = moesim_xcalloc(V, sizeof *lb);
    double *pa = moesim_xcalloc(V, sizeof *pa), *pb = moesim_xcalloc(V, sizeof *pb);
    moesim_status st = MOESIM_OK;
    for (uint32_t t = 0; t + 1 < r->n_prompt && !st; t++) {
        if ((st = engine_seq_forward(e, a, r->prompt[t], NULL, la, NULL, err)) ||
            (st = engine_seq_forward(e, b, r->prompt[t], pm, lb, NULL, err)))
            break;
        log_softmax(la, pa, V);
        log_softmax(lb, pb, V);
        double kl = 0;
        for (uint32_t v = 0; v < V; v++) kl += exp(pa[v]) * (pa[v] - pb[v]);
        acc->kl_sum += kl;
        acc->kl_max = fmax(acc->kl_max, kl);
        acc->nll_ref -= pa[r->prompt[t + 1]];
        acc->nll -= pb[r->prompt[t + 1]];
        acc->n++;
    }
    engine_seq_destroy(a);
    engine_seq_destroy(b);
    free(la);
    free(lb);
    free(pa);
    free(pb);
    return st;
}

int cmd_eval(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},  {"input", required_argument, NULL, 'i'},
        {"precision", required_argument, NULL, 'p'}, {"precision-map", required_argument, NULL, 'M'},
        {"threads", required_argument, NULL, 't'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    const char *model = NULL, *input = NULL, *prec_name = "int4", *map_path = NULL;
    bool prec_given = false;
    bool json = false;
    long threads = 0;
    optind = 1;
    int c;
    opterr = 0; /* one line: ours, naming the option */
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'i': input = optarg; break;
        case 'p':
            prec_name = optarg, prec_given = true;
            break;
        case 'M': map_path = optarg; break;
        case 't': {
            char *end;
            threads = strtol(optarg, &end, 10);
            if (*end || threads < 1 || threads > 256)
                return cli_usage_error("eval", "--threads: expected 1..256, got '%s'", optarg);
            break;
        }
        case 'j': json = true; break;
        case 'h': fputs(usage, stdout); return 0;
        default: return cli_getopt_error("eval", c, argc, argv, opts);
        }
    }
    if (optind < argc) return cli_usage_error("eval", "unexpected argument '%s'", argv[optind]);
    if (!model || !input) return cli_usage_error("eval", "--model and --input are required");
    if (prec_given && map_path)
        return cli_usage_error("eval", "--precision and --precision-map: give one (the map names "
                                       "every expert's precision)");
    moesim_precision prec;
    if (!quant_precision_parse(prec_name, &prec))
        return cli_usage_error("eval", "--precision: expected bf16, int8, int4 or int2, got '%s'",
                               prec_name);
    engine_options eo = {.n_threads = (uint32_t)threads,
                         .precision_mask = map_path ? (1u << PREC_INT8 | 1u << PREC_INT4 |
                                                       1u << PREC_INT2)
                                                    : 1u << prec};
    moesim_error err = {0};
    engine *e;
    if (engine_load(model, &eo, &e, &err)) return cli_fail(&err);
    engine_prompts pr;
    engine_precmap pm = {0};
    if (engine_prompts_load(input, engine_config_of(e)->vocab, &pr, &err)) {
        engine_destroy(e);
        return cli_fail(&err);
    }
    moesim_status st = map_path ? engine_precmap_load(&pm, e, map_path, &err)
                                : (engine_precmap_init(&pm, e, (uint8_t)prec), MOESIM_OK);
    nll_kl acc = {0};
    for (uint32_t i = 0; i < pr.n && !st; i++) {
        st = score(e, &pr.reqs[i], &pm, &acc, &err);
        if (st) moesim_error_prefix(&err, "%s: sequence %u", input, i);
    }
    if (!st && !acc.n)
        st = moesim_fail(&err, MOESIM_EINPUT, "%s: no sequence has two or more tokens to score",
                         input);
    if (!st && !(isfinite(acc.nll_ref) && isfinite(acc.nll) && isfinite(acc.kl_sum)))
        st = moesim_fail(&err, MOESIM_EINPUT,
                         "%s: the forward pass gave log-probabilities that are not finite (NaN or "
                         "infinite values in the checkpoint's weights?)",
                         model);
    int rc = 0;
    if (st) {
        rc = cli_fail(&err);
    } else {
        double ppl_ref = exp(acc.nll_ref / acc.n), ppl = exp(acc.nll / acc.n);
        const char *what = map_path ? map_path : prec_name;
        if (json) {
            json_t *j = json_object();
            json_object_set_new(j, "model", json_string(model));
            json_object_set_new(j, "model_type", json_string(engine_config_of(e)->model_type));
            json_object_set_new(j, "precision", json_string(map_path ? "map" : prec_name));
            if (map_path) json_object_set_new(j, "precision_map", json_string(map_path));
            json_object_set_new(j, "sequences", json_integer(pr.n));
            json_object_set_new(j, "tokens_scored", json_integer((json_int_t)acc.n));
            json_object_set_new(j, "perplexity_bf16", json_real(ppl_ref));
            json_object_set_new(j, "perplexity", json_real(ppl));
            json_object_set_new(j, "kl_mean_nats", json_real(acc.kl_sum / acc.n));
            json_object_set_new(j, "kl_max_nats", json_real(acc.kl_max));
            cli_print_json(j);
        } else {
            printf("model: %s (%s), %u sequences, %llu tokens scored\n", model,
                   engine_config_of(e)->model_type, pr.n, (unsigned long long)acc.n);
            printf("perplexity: bf16 %.4f, %s %.4f\n", ppl_ref, what, ppl);
            printf("KL(bf16 || %s): mean %.6g nats/token, max %.6g\n", what, acc.kl_sum / acc.n,
                   acc.kl_max);
        }
    }
    engine_precmap_free(&pm);
    engine_prompts_free(&pr);
    engine_destroy(e);
    return rc;
}
