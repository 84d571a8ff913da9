/* The safetensors parser and checkpoint loading on malformed input: every case must be one clear
 * error naming the problem, never a crash (this corpus also seeds the fuzzer, fuzz/). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine.h"
#include "engine/safetensors.h"
#include "support/test_support.h"

/* A file image: 8-byte little-endian header length, the header, then `data_bytes` zero bytes. */
static uint8_t *image(const char *header, size_t data_bytes, size_t *len) {
    size_t h = strlen(header);
    *len = 8 + h + data_bytes;
    uint8_t *buf = calloc(1, *len);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    return buf;
}

typedef struct bad_case {
    const char *header;
    size_t data_bytes;
    const char *expect; /* substring of the message */
} bad_case;

static const bad_case bad_cases[] = {
    {"[1,2]", 0, "expected a JSON object"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}", 8, "invalid JSON"},
    {"{\"a\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8, "not supported"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4, "shape[0]"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": 3, \"data_offsets\": [0, 12]}}", 12, "shape"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4, "at most"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8, "truncated"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8, "expected 12"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8, "begin"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]}}", 8, "data_offsets"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
     " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12, "overlap"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
     " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "invalid JSON"},
    {"{\"__metadata__\": {\"format\": 3}}", 0, "__metadata__"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], \"x\": 1}}", 4,
     "unknown key"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296], "
     "\"data_offsets\": [0, 4]}}", 4, "overflows"},
    {"{\"a\": 5}", 0, "expected an object"},
};

TestSuite(safetensors);

Test(safetensors, every_malformed_header_is_one_clear_error) {
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        size_t len;
        uint8_t *buf = image(bad_cases[i].header, bad_cases[i].data_bytes, &len);
        st_tensor *ts = NULL;
        size_t n = 99;
        moesim_error err = {0};
        cr_expect_eq(st_parse(buf, len, "case.safetensors", &ts, &n, &err), MOESIM_EINPUT,
                     "case %zu accepted: %s", i, bad_cases[i].header);
        cr_expect(strstr(err.msg, bad_cases[i].expect), "case %zu: message '%s' lacks '%s'", i,
                  err.msg, bad_cases[i].expect);
        cr_expect(strstr(err.msg, "case.safetensors"), "case %zu: message names no file", i);
        cr_expect_null(ts);
        cr_expect_eq(n, 0);
        free(buf);
    }
}

Test(safetensors, header_length_beyond_the_file_or_short_file_is_an_error) {
    uint8_t tiny[4] = {0};
    st_tensor *ts;
    size_t n;
    moesim_error err = {0};
    cr_assert_eq(st_parse(tiny, sizeof tiny, "t", &ts, &n, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "too short"), "%s", err.msg);
    uint8_t big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    cr_assert_eq(st_parse(big, sizeof big, "t", &ts, &n, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "exceeds the file"), "%s", err.msg);
}

Test(safetensors, a_well_formed_file_maps_every_tensor) {
    const char *hdr = "{\"__metadata__\": {\"format\": \"pt\"},"
                      " \"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [8, 20]},"
                      " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}";
    size_t len;
    uint8_t *buf = image(hdr, 20, &len);
    float two[2] = {1.5f, -2.0f};
    memcpy(buf + len - 20, two, sizeof two);
    const char *path = test_tmp_path("ok.safetensors");
    test_write_bytes(path, buf, len);
    free(buf);
    st_file *f;
    moesim_error err = {0};
    cr_assert_eq(st_file_open(path, &f, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(st_file_count(f), 2);
    const st_tensor *w = st_file_find(f, "w"), *b = st_file_find(f, "b");
    cr_assert(w && b);
    cr_assert_eq(w->dtype, ST_BF16);
    cr_assert_eq(w->n_dims, 2);
    cr_assert_eq(w->shape[1], 3);
    cr_assert_eq(w->size_bytes, 12);
    float b1; /* tensor data in a safetensors file need not be 4-byte aligned: copy, not cast */
    memcpy(&b1, (const unsigned char *)b->data + sizeof b1, sizeof b1);
    cr_assert_float_eq(b1, -2.0f, 0);
    cr_assert_null(st_file_find(f, "missing"));
    st_file_close(f);
}

/* ---- whole checkpoints ---- */

static char fixture[1024];

static void copy_file(const char *from, const char *to, double keep_fraction) {
    FILE *fp = fopen(from, "rb");
    cr_assert(fp, "%s", from);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    cr_assert_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    test_write_bytes(to, buf, (size_t)(n * keep_fraction));
    free(buf);
}

/* A copy of the olmoe fixture in a scratch folder, with config.json replaced when given. */
static const char *scratch_model(const char *tag, const char *config_text, double keep_weights) {
    snprintf(fixture, sizeof fixture, "%s/tests/fixtures/golden/olmoe", MOESIM_SOURCE_DIR);
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s", test_tmp_path(tag));
    mkdir(dir, 0755);
    char from[1200], to[1200];
    snprintf(from, sizeof from, "%s/model.safetensors", fixture);
    snprintf(to, sizeof to, "%s/model.safetensors", dir);
    copy_file(from, to, keep_weights);
    snprintf(to, sizeof to, "%s/config.json", dir);
    if (config_text) {
        test_write_file(to, config_text);
    } else {
        snprintf(from, sizeof from, "%s/config.json", fixture);
        copy_file(from, to, 1.0);
    }
    return dir;
}

static void expect_load_error(const char *dir, const char *needle) {
    engine *e = NULL;
    moesim_error err = {0};
    cr_assert_neq(engine_load(dir, NULL, &e, &err), MOESIM_OK, "loaded %s", dir);
    cr_assert_null(e);
    cr_assert(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
}

Test(safetensors, a_truncated_checkpoint_is_a_clear_error) {
    expect_load_error(scratch_model("trunc", NULL, 0.5), "truncated");
}

Test(safetensors, an_unsupported_model_type_lists_the_supported_ones) {
    expect_load_error(scratch_model("llama", "{\"model_type\": \"llama\", \"hidden_size\": 64}", 1),
                      "supported: qwen3_moe, qwen2_moe, olmoe, mixtral");
}

Test(safetensors, a_config_that_disagrees_with_the_tensors_names_the_tensor) {
    const char *cfg = "{\"model_type\": \"olmoe\", \"hidden_size\": 64, \"num_hidden_layers\": 3,"
                      " \"vocab_size\": 256, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                      " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"intermediate_size\": 128}";
    expect_load_error(scratch_model("shape", cfg, 1), "expected [128, 64]");
    const char *more = "{\"model_type\": \"olmoe\", \"hidden_size\": 64, \"num_hidden_layers\": 4,"
                       " \"vocab_size\": 256, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                       " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"intermediate_size\": 64}";
    expect_load_error(scratch_model("layers", more, 1), "model.layers.3.input_layernorm.weight");
}

Test(safetensors, a_config_with_a_missing_or_invalid_key_names_the_key) {
    expect_load_error(scratch_model("nokey", "{\"model_type\": \"mixtral\"}", 1), "hidden_size");
    const char *cfg = "{\"model_type\": \"olmoe\", \"hidden_size\": 64, \"num_hidden_layers\": 3,"
                      " \"vocab_size\": 256, \"num_attention_heads\": 4, \"num_key_value_heads\": 3,"
                      " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"intermediate_size\": 64}";
    expect_load_error(scratch_model("heads", cfg, 1), "not a multiple of num_key_value_heads");
    expect_load_error(scratch_model("json", "{\"model_type\": ", 1), "invalid JSON");
}
