/* `moesim record`: run a real checkpoint over token-id prompts (prefill, then decode) on the
 * engine (CPU or CUDA backend) and write the router trace of that run: routing and gate weights,
 * DyMoE token importance, look-ahead predictions, the tokens fed, and the checkpoint's config
 * hash. With --model-ini the checkpoint's geometry is also written as a model file, so
 * `moesim sim --model FILE.ini` can simulate a model that has no entry in configs/models. */
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "common/progress.h"
#include "engine/engine.h"
#include "kernels/quant.h"
#include "traces/trace.h"

static const char usage[] =
    "usage: moesim record --model DIR --input PROMPTS -o OUT.h5 [options]\n"
    "\n"
    "Runs a Hugging Face MoE checkpoint over token-id prompts on the engine (CPU, or CUDA with\n"
    "--backend cuda) and writes the router trace of the run (traces/FORMAT.md).\n"
    "\n"
    "  --model DIR          checkpoint folder (config.json + safetensors)\n"
    "  --input PROMPTS      token ids: one prompt per line, or JSONL with prompt_ids\n"
    "                       (tools/tokenize.py makes them from text)\n"
    "  -o, --output FILE    the trace (written whole or not at all)\n"
    "  --gen-len G          decode steps per request (default 32)\n"
    "  --batch B            requests in flight together (default 1)\n"
    "  --lookahead D        look-ahead distances recorded, 0..16 (default 3)\n"
    "  --lookahead-k K      candidates per distance (default: 16, or E when E < 16)\n"
    "  --precision P        expert precision of the run: bf16, int8, int4, int2 (default bf16)\n"
    "  --temperature T      0: greedy (default); > 0: seeded sampling\n"
    "  --seed S             sampling seed (default 0)\n"
    "  --name NAME          the trace's model name (default: the checkpoint folder's name)\n"
    "  --model-ini FILE     also write the checkpoint's geometry as a model file for\n"
    "                       'moesim sim --model FILE'\n"
    "  --threads N          worker threads (default: all cores)\n"
    "  --backend B          cpu (default) or cuda (builds with CUDA)\n"
    "  --gpu-pool N         cuda: device pool of N expert blocks, experts loaded on demand\n"
    "                       from pinned host memory (default 0: every expert resident)\n"
    "  --json               print the summary as JSON\n";

typedef struct record_args {
    const char *model_dir, *input, *output, *name, *model_ini, *backend;
    uint32_t gen_len, batch, lookahead, lookahead_k, threads, gpu_pool;
    bool lookahead_k_given;
    moesim_precision precision;
    double temperature;
    uint64_t seed;
    bool json;
} record_args;

static int parse_u32(const char *opt, const char *s, uint32_t lo, uint32_t hi, uint32_t *out) {
    uint64_t v;
    if (!config_parse_u64(s, &v) || v < lo || v > hi)
        return cli_usage_error("record", "%s: expected an integer in [%u, %u], got '%s'", opt, lo,
                               hi, s);
    *out = (uint32_t)v;
    return 0;
}

/* Returns -1 when parsing succeeded, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, record_args *a) {
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"input", required_argument, NULL, 'i'},
                                         {"output", required_argument, NULL, 'o'},
                                         {"gen-len", required_argument, NULL, 'g'},
                                         {"batch", required_argument, NULL, 'b'},
                                         {"lookahead", required_argument, NULL, 'd'},
                                         {"lookahead-k", required_argument, NULL, 'k'},
                                         {"precision", required_argument, NULL, 'p'},
                                         {"temperature", required_argument, NULL, 'T'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"name", required_argument, NULL, 'n'},
                                         {"model-ini", required_argument, NULL, 'M'},
                                         {"threads", required_argument, NULL, 't'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"backend", required_argument, NULL, 'B'},
                                         {"gpu-pool", required_argument, NULL, 'P'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    *a = (record_args){.gen_len = 32, .batch = 1, .lookahead = 3, .precision = PREC_BF16};
    optind = 1;
    int c, rc = 0;
    bool gpu_pool_given = false;
    opterr = 0; /* one line: ours, naming the option */
    while ((c = getopt_long(argc, argv, ":o:", opts, NULL)) != -1 && !rc) {
        switch (c) {
        case 'm':
            a->model_dir = optarg;
            break;
        case 'i':
            a->input = optarg;
            break;
        case 'o':
            a->output = optarg;
            break;
        case 'n':
            a->name = optarg;
            break;
        case 'M':
            a->model_ini = optarg;
            break;
        case 'g':
            rc = parse_u32("--gen-len", optarg, 0, 1u << 20, &a->gen_len);
            break;
        case 'b':
            rc = parse_u32("--batch", optarg, 1, 4096, &a->batch);
            break;
        case 'd':
            rc = parse_u32("--lookahead", optarg, 0, TRACE_MAX_LOOKAHEAD_DEPTH, &a->lookahead);
            break;
        case 'k':
            rc = parse_u32("--lookahead-k", optarg, 1, TRACE_MAX_LOOKAHEAD_K, &a->lookahead_k);
            a->lookahead_k_given = true;
            break;
        case 't':
            rc = parse_u32("--threads", optarg, 1, 256, &a->threads);
            break;
        case 's':
            if (!config_parse_u64(optarg, &a->seed))
                rc = cli_usage_error("record", "--seed: expected an unsigned integer, got '%s'",
                                     optarg);
            break;
        case 'T':
            if (!config_parse_f64(optarg, &a->temperature) || a->temperature < 0 ||
                a->temperature > 100)
                rc = cli_usage_error("record",
                                     "--temperature: expected a number in [0, 100], "
                                     "got '%s'",
                                     optarg);
            break;
        case 'p':
            if (!quant_precision_parse(optarg, &a->precision))
                rc = cli_usage_error(
                    "record", "--precision: expected bf16, int8, int4 or int2, got '%s'", optarg);
            break;
        case 'j':
            a->json = true;
            break;
        case 'B':
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                rc = cli_usage_error("record", "--backend: expected cpu or cuda, got '%s'", optarg);
            a->backend = optarg;
            break;
        case 'P':
            rc = parse_u32("--gpu-pool", optarg, 0, UINT32_MAX, &a->gpu_pool);
            gpu_pool_given = true;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        default:
            return cli_getopt_error("record", c, argc, argv, opts);
        }
    }
    if (rc) return rc;
    if (optind < argc) return cli_usage_error("record", "unexpected argument '%s'", argv[optind]);
    if (!a->model_dir || !a->input || !a->output)
        return cli_usage_error("record", "--model, --input and -o are required");
    if (gpu_pool_given && !(a->backend && !strcmp(a->backend, "cuda")))
        return cli_usage_error("record", "--gpu-pool goes with --backend cuda");
    char config_json[PATH_MAX];
    snprintf(config_json, sizeof config_json, "%s/config.json", a->model_dir);
    const char *outs[] = {a->output, a->model_ini}, *ins[] = {a->input, config_json};
    moesim_error err = {0};
    if (atomic_file_check_outputs(outs, MOESIM_ARRAY_LEN(outs), ins, MOESIM_ARRAY_LEN(ins), &err))
        return cli_fail(&err);
    return -1;
}

/* How the trace was made, stored in the trace as params_json. */
static char *record_params_json(const record_args *a, const engine_gen_log *log) {
    json_t *j = json_object();
    json_object_set_new(j, "command", json_string("record"));
    json_object_set_new(j, "checkpoint", json_string(a->model_dir));
    json_object_set_new(j, "input", json_string(a->input));
    json_object_set_new(j, "gen_len", json_integer(a->gen_len));
    json_object_set_new(j, "batch", json_integer(a->batch));
    json_object_set_new(j, "precision", json_string(precision_name(a->precision)));
    json_object_set_new(j, "backend", json_string(a->backend ? a->backend : "cpu"));
    if (a->backend && !strcmp(a->backend, "cuda"))
        json_object_set_new(j, "gpu_pool_experts", json_integer(a->gpu_pool));
    json_object_set_new(j, "temperature", json_real(a->temperature));
    json_object_set_new(j, "seed", json_integer((json_int_t)a->seed));
    /* the last sampled token of each request is never fed, so the token ids cannot hold it */
    json_t *last = json_array();
    for (uint32_t r = 0; r < log->n_requests; r++)
        json_array_append_new(
            last, json_integer(log->generated[(size_t)r * log->gen_stride + a->gen_len]));
    json_object_set_new(j, "last_generated_token", last);
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(j);
    return s;
}

int cmd_record(int argc, char **argv) {
    record_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    rc = 0;

    moesim_error err = {0};
    engine_options eo = {.n_threads = a.threads,
                         .precision_mask = 1u << a.precision,
                         .backend = a.backend,
                         .gpu_pool_experts = a.gpu_pool};
    engine *e;
    if (engine_load(a.model_dir, &eo, &e, &err)) return cli_fail(&err);
    const engine_config *c = engine_config_of(e);
    if (!a.lookahead_k_given) a.lookahead_k = c->n_experts < 16 ? c->n_experts : 16;
    if (a.lookahead && a.lookahead_k > c->n_experts) {
        uint32_t n_experts = c->n_experts; /* c dies with e */
        engine_destroy(e);
        return cli_usage_error("record",
                               "--lookahead-k: expected at most %u (the model's experts), "
                               "got %u",
                               n_experts, a.lookahead_k);
    }

    char dir_copy[4096], name[64];
    snprintf(dir_copy, sizeof dir_copy, "%s", a.model_dir);
    snprintf(name, sizeof name, "%s", a.name ? a.name : basename(dir_copy));
    model_geometry g;
    engine_geometry(e, name, &g);

    engine_prompts pr;
    if (engine_prompts_load(a.input, c->vocab, &pr, &err)) {
        engine_destroy(e);
        return cli_fail(&err);
    }
    engine_precmap pm;
    engine_precmap_init(&pm, e, (uint8_t)a.precision);
    engine_gen_options go = {.gen_len = a.gen_len,
                             .batch = a.batch,
                             .lookahead_depth = a.lookahead,
                             .lookahead_k = a.lookahead ? a.lookahead_k : 0,
                             .temperature = (float)a.temperature,
                             .seed = a.seed,
                             .pmap = &pm};
    engine_gen_log log;
    trace *t = NULL;
    double t0 = moesim_monotonic_s();
    moesim_status st = engine_generate(e, pr.reqs, pr.n, &go, &log, &err);
    double run_s = moesim_monotonic_s() - t0;
    if (!st) {
        char *params = record_params_json(&a, &log);
        st = engine_log_to_trace(e, &g, &log, params, &t, &err);
        free(params);
        engine_gen_log_free(&log);
    }
    if (!st) st = trace_write(t, a.output, &err);
    if (!st && a.model_ini && (st = model_write_ini(&g, a.model_ini, a.model_dir, &err)))
        unlink(a.output); /* both files or neither */
    if (st) {
        rc = cli_fail(&err);
    } else if (a.json) {
        json_t *j = json_object();
        json_object_set_new(j, "trace", json_string(a.output));
        json_object_set_new(j, "model", json_string(name));
        json_object_set_new(j, "model_type", json_string(c->model_type));
        json_object_set_new(j, "requests", json_integer(t->n_requests));
        json_object_set_new(j, "tokens", json_integer((json_int_t)t->n_tokens));
        json_object_set_new(j, "moe_layers", json_integer(t->meta.n_layers));
        json_object_set_new(j, "lookahead_depth", json_integer(t->meta.lookahead_depth));
        json_object_set_new(j, "seconds", json_real(run_s));
        json_object_set_new(j, "tokens_per_s", json_real((double)t->n_tokens / run_s));
        cli_print_json(j);
    } else {
        printf("recorded %s: %u requests, %llu tokens, %u MoE layers, look-ahead D=%u K'=%u, "
               "%.1f tokens/s\n",
               a.output, t->n_requests, (unsigned long long)t->n_tokens, t->meta.n_layers,
               t->meta.lookahead_depth, t->meta.lookahead_k, (double)t->n_tokens / run_s);
        if (a.model_ini) printf("geometry: %s\n", a.model_ini);
    }
    trace_destroy(t);
    engine_precmap_free(&pm);
    engine_prompts_free(&pr);
    engine_destroy(e);
    return rc;
}
