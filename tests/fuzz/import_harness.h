/* The body of the importer harnesses (fuzz_import_jsonl.c, _csv.c, _npy.c, _npz.c), written
 * against the public import API (traces/convert.h: trace_import_file, what `moesim trace import`
 * calls). Each includes this file after defining FUZZ_IMPORT_FORMAT.
 *
 * Input layout: byte 0 picks the model and the import options (bits below), the rest is the log.
 * For npy, the rest is two files: a 2-byte little-endian length n, n bytes of the ids .npy, and
 * the weights .npy (no weights file when nothing follows: router logits, or --uniform-gates).
 * The models are real configs cut to a few layers (model_load_with_sets, as `--set` would), so a
 * whole token is a few records and the fuzzer reaches complete tokens, constant runs and phases:
 *   bit 0: Mixtral-8x7B cut to 2 layers (top-2 of 8, renormalized gates), or DeepSeek-V2-Lite cut
 *          to 3 layers, layer 0 dense (top-6 of 64, softmax over all);
 *   bit 1: --incomplete drop; bit 2: model layer numbering; bit 3: --renormalize;
 *   bit 4: drop constant runs; bit 5: --prefill-tokens 2; bit 6: constant runs from 2 tokens;
 *   bit 7: --uniform-gates (npy and npz).
 * Must hold: one error line, or a trace that passes trace_check and survives export and import
 * back unchanged (convert.h promises import(export(t)) == t; arrays are exported as JSONL). No
 * crash, leak, hang. */
#include <stdlib.h>

#include "common/model.h"
#include "common/paths.h"
#include "fuzz_support.h"
#include "traces/convert.h"
#include "traces/trace.h"

#define FUZZ_IMPORT_ARRAYS                                                                         \
    (FUZZ_IMPORT_FORMAT == TRACE_TEXT_NPY || FUZZ_IMPORT_FORMAT == TRACE_TEXT_NPZ)
/* what the round trip exports: export writes text only */
#define FUZZ_EXPORT_FORMAT (FUZZ_IMPORT_ARRAYS ? TRACE_TEXT_JSONL : FUZZ_IMPORT_FORMAT)

static model_geometry fuzz_models[2];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static const char *const mixtral[] = {"layers.n_layers=2"};
    static const char *const deepseek[] = {"layers.n_layers=3", "layers.moe_layers=1-2"};
    const struct {
        const char *name;
        const char *const *sets;
        size_t n_sets;
    } pick[2] = {{"mixtral-8x7b", mixtral, 1}, {"deepseek-v2-lite", deepseek, 2}};
    for (int i = 0; i < 2; i++) {
        char path[4096];
        moesim_error err = {0};
        moesim_status st = moesim_config_path("models", pick[i].name, path, sizeof path, &err);
        if (!st)
            st = model_load_with_sets(path, pick[i].sets, pick[i].n_sets, &fuzz_models[i], &err);
        if (st) fprintf(stderr, "fuzz model %s: %s\n", pick[i].name, err.msg);
        MOESIM_ASSERT(st == MOESIM_OK);
    }
    return 0;
}

static void options_from_byte(uint8_t b, trace_import_options *o) {
    trace_import_options_default(o);
    o->format = FUZZ_IMPORT_FORMAT;
    o->incomplete = (b & 2) ? TRACE_INCOMPLETE_DROP : TRACE_INCOMPLETE_KEEP;
    o->layers = (b & 4) ? TRACE_LAYERS_MODEL : TRACE_LAYERS_MOE;
    o->renormalize = (b & 8) != 0;
    o->drop_constant_runs = (b & 16) != 0;
    if (b & 32) {
        o->prefill_tokens = 2;
        o->prefill_tokens_set = true;
    }
    if (b & 64) o->constant_run_min = 2;
    if (FUZZ_IMPORT_ARRAYS) o->uniform_gates = (b & 128) != 0;
}

/* Export `t` in the harness's format and import it back with the default options. */
static void check_round_trip(const trace *t, const model_geometry *m) {
    moesim_error err = {0};
    MOESIM_ASSERT(trace_export_check(t, "fuzz trace", &err) == MOESIM_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&text, &len);
    MOESIM_ASSERT(fp);
    MOESIM_ASSERT(trace_export_write(t, FUZZ_EXPORT_FORMAT, fp, false, "fuzz", &err) == MOESIM_OK);
    MOESIM_ASSERT(fclose(fp) == 0);
    const char *path = fuzz_scratch_file(1, text, len);
    free(text);
    trace_import_options o;
    trace_import_options_default(&o);
    o.format = FUZZ_EXPORT_FORMAT;
    trace *back = NULL;
    trace_import_report rep;
    moesim_status st = trace_import_file(path, m, &o, &back, &rep, &err);
    if (st) fprintf(stderr, "exported trace does not import back: %s\n", err.msg);
    MOESIM_ASSERT(st == MOESIM_OK);
    size_t n = t->n_tokens, rv = trace_route_values(&t->meta);
    MOESIM_ASSERT(back->n_tokens == n && back->n_requests == t->n_requests);
    MOESIM_ASSERT(!memcmp(back->request_id, t->request_id, n * sizeof *t->request_id));
    MOESIM_ASSERT(!memcmp(back->position, t->position, n * sizeof *t->position));
    MOESIM_ASSERT(!memcmp(back->phase, t->phase, n * sizeof *t->phase));
    MOESIM_ASSERT(!memcmp(back->expert_ids, t->expert_ids, n * rv * sizeof *t->expert_ids));
    MOESIM_ASSERT(!memcmp(back->gate_weights, t->gate_weights, n * rv * sizeof *t->gate_weights));
    trace_destroy(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    trace_import_options o;
    options_from_byte(data[0], &o);
    const model_geometry *m = &fuzz_models[data[0] & 1];
    const char *path;
    if (FUZZ_IMPORT_FORMAT == TRACE_TEXT_NPY) { /* ids, then weights */
        if (size < 3) return 0;
        size_t n = (size_t)data[1] | (size_t)data[2] << 8;
        if (n > size - 3) n = size - 3;
        path = fuzz_file_of(data + 3, n);
        if (size - 3 > n) o.weights_path = fuzz_scratch_file(1, data + 3 + n, size - 3 - n);
    } else {
        path = fuzz_file_of(data + 1, size - 1);
    }
    trace *t = NULL;
    trace_import_report rep;
    moesim_error err = {0};
    moesim_status st = trace_import_file(path, m, &o, &t, &rep, &err);
    fuzz_check_error(st, &err);
    MOESIM_ASSERT((st == MOESIM_OK) == (t != NULL));
    if (t) {
        MOESIM_ASSERT(trace_check(t, "fuzz trace", &err) == MOESIM_OK);
        json_decref(trace_import_report_to_json(&rep));
        check_round_trip(t, m);
    }
    trace_destroy(t);
    return 0;
}
