/* INI loading, overrides and schema validation (common/config.c). */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/config.h"
#include "support/test_support.h"

typedef struct demo_settings {
    uint32_t layers;
    double bandwidth;
    bool pinned;
    char gpu[16];
    int mode;
} demo_settings;

static const char *const modes[] = {"fast", "slow", NULL};

static const config_field demo_fields[] = {
    {"gpu", "layers", CONFIG_U32, offsetof(demo_settings, layers), 0, true, 1, 256, NULL, NULL, NULL},
    {"gpu", "bandwidth", CONFIG_F64, offsetof(demo_settings, bandwidth), 0, true, 0.1, 1000, NULL, NULL, NULL},
    {"gpu", "pinned", CONFIG_BOOL, offsetof(demo_settings, pinned), 0, false, 1, 0, NULL, "true", NULL},
    {"gpu", "name", CONFIG_STR, offsetof(demo_settings, gpu), 16, false, 1, 0, NULL, "none", NULL},
    {"gpu", "mode", CONFIG_ENUM, offsetof(demo_settings, mode), 0, false, 1, 0, modes, "fast", NULL},
};

static moesim_status load_text(const char *text, demo_settings *out, moesim_error *err,
                               const char *override) {
    const char *path = test_tmp_path("demo.ini");
    test_write_file(path, text);
    config *c = config_create();
    moesim_status st = config_load_file(c, path, err);
    if (!st && override) st = config_set(c, override, err);
    if (!st) st = config_read_fields(c, demo_fields, 5, out, err);
    if (!st) st = config_check_unused(c, err);
    config_destroy(c);
    return st;
}

TestSuite(config);

Test(config, reads_typed_values_and_applies_defaults) {
    demo_settings s = {0};
    moesim_error err = {0};
    cr_assert_eq(load_text("; comment\n[gpu]\nlayers = 32\nbandwidth = 11.5 ; source\n", &s, &err, NULL),
                 MOESIM_OK, "%s", err.msg);
    cr_assert_eq(s.layers, 32);
    cr_assert_float_eq(s.bandwidth, 11.5, 1e-12);
    cr_assert(s.pinned);
    cr_assert_str_eq(s.gpu, "none");
    cr_assert_eq(s.mode, 0);
}

Test(config, set_overrides_a_loaded_value) {
    demo_settings s = {0};
    moesim_error err = {0};
    cr_assert_eq(load_text("[gpu]\nlayers = 32\nbandwidth = 11.5\n", &s, &err, "gpu.layers=48"),
                 MOESIM_OK, "%s", err.msg);
    cr_assert_eq(s.layers, 48);
}

typedef struct bad_case {
    const char *text;
    const char *override;
    const char *expect; /* substring of the message */
} bad_case;

Test(config, bad_inputs_name_file_line_and_key) {
    static const bad_case cases[] = {
        {"[gpu]\nlayers = 32\nbandwidth = fast\n", NULL,
         ":3: [gpu] bandwidth: expected a finite number, got 'fast'"},
        {"[gpu]\nlayers = 32\nbandwidth = 0x10\n", NULL,
         ":3: [gpu] bandwidth: expected a finite number, got '0x10'"},
        {"[gpu]\nlayers = 0\nbandwidth = 1\n", NULL,
         ":2: [gpu] layers: expected an integer in [1, 256]"},
        {"[gpu]\nlayers = -3\nbandwidth = 1\n", NULL,
         ":2: [gpu] layers: expected a non-negative integer"},
        {"[gpu]\nlayers = 32\n", NULL, "[gpu] bandwidth: missing required key"},
        {"[gpu]\nlayers = 32\nbandwidth = 1\nlayer = 3\n", NULL,
         ":4: [gpu] layer: unknown key (known: layers"},
        {"[gpu]\nlayers = 32\nbandwidth = 1\n[gpus]\nx = 1\n", NULL,
         ":5: [gpus] x: unknown section or key"},
        {"[gpu]\nlayers = 32\nlayers = 33\nbandwidth = 1\n", NULL,
         ":3: [gpu] layers: duplicate key (first set at line 2)"},
        {"[gpu]\nlayers 32\n", NULL, ":2: expected '[section]', 'key = value'"},
        {"layers = 32\n", NULL, ":1: layers: key outside any [section]"},
        {"[gpu]\nlayers = 32\nbandwidth = 1\npinned = maybe\n", NULL,
         ":4: [gpu] pinned: expected true or false"},
        {"[gpu]\nlayers = 32\nbandwidth = 1\nmode = medium\n", NULL,
         "expected one of fast, slow, got 'medium'"},
        {"[gpu]\nlayers = 32\nbandwidth = 1\nname = a-very-long-gpu-name\n", NULL,
         "expected at most 15 characters"},
        {"[gpu]\nlayers = 32\nbandwidth = 1\n", "gpu.layers=x",
         "--set: [gpu] layers: expected a non-negative integer"},
        {"[gpu]\nlayers = 32\nbandwidth = 1\n", "gpulayers=3",
         "--set gpulayers=3: expected section.key=value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        demo_settings s = {0};
        moesim_error err = {0};
        cr_assert_eq(load_text(cases[i].text, &s, &err, cases[i].override), MOESIM_EINPUT,
                     "case %zu should fail", i);
        cr_assert(strstr(err.msg, cases[i].expect), "case %zu: got '%s', want '%s'", i, err.msg,
                  cases[i].expect);
        cr_assert(!strchr(err.msg, '\n'));
    }
}

Test(config, long_comment_lines_are_accepted_but_long_settings_are_not) {
    char text[1024] = "[gpu]\n; ";
    memset(text + strlen(text), 'c', 400);
    strcat(text, "\nlayers = 32\nbandwidth = 1\n");
    demo_settings s = {0};
    moesim_error err = {0};
    cr_assert_eq(load_text(text, &s, &err, NULL), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(s.layers, 32);

    char bad[1024] = "[gpu]\nlayers = 32\nbandwidth = 1\nname = ";
    memset(bad + strlen(bad), 'n', 300);
    strcat(bad, "\n");
    cr_assert_eq(load_text(bad, &s, &err, NULL), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, ":4: line longer than"), "%s", err.msg);
}

Test(config, missing_file_is_an_io_error_naming_the_path) {
    config *c = config_create();
    moesim_error err = {0};
    cr_assert_eq(config_load_file(c, "/nonexistent/x.ini", &err), MOESIM_EIO);
    cr_assert(strstr(err.msg, "/nonexistent/x.ini: cannot open config"), "%s", err.msg);
    config_destroy(c);
}

/* Lines inih would read wrong without a word: a NUL byte (its text ends there), text after a
 * section header's ']' (dropped); a ';' comment after the header stays fine. */
Test(config, a_nul_byte_or_text_after_a_section_header_is_refused_naming_the_line) {
    const char *path = test_tmp_path("nul.ini");
    static const char nul_text[] = "[gpu]\nlayers = 32\nbandwidth = 2\0"
                                   "4\n";
    FILE *fp = fopen(path, "wb");
    cr_assert(fp);
    fwrite(nul_text, 1, sizeof nul_text - 1, fp);
    fclose(fp);
    config *c = config_create();
    moesim_error err = {0};
    cr_assert_eq(config_load_file(c, path, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "nul.ini:3: a NUL byte"), "%s", err.msg);
    config_destroy(c);

    demo_settings s = {0};
    cr_assert_eq(load_text("[gpu] fast\nlayers = 32\nbandwidth = 1\n", &s, &err, NULL),
                 MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "demo.ini:1: text after the section header"), "%s", err.msg);
    cr_assert_eq(load_text("[gpu\nlayers = 32\nbandwidth = 1\n", &s, &err, NULL), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "demo.ini:1: a section header without its ']'"), "%s", err.msg);
    cr_assert_eq(load_text("[gpu] ; the card\nlayers = 32\nbandwidth = 1\n", &s, &err, NULL),
                 MOESIM_OK, "%s", err.msg);
    cr_assert_eq(s.layers, 32);
}

Test(config, a_directory_is_refused_not_read_as_an_empty_file) {
    config *c = config_create();
    moesim_error err = {0};
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("a-dir.ini"));
    mkdir(dir, 0777);
    cr_assert_eq(config_load_file(c, dir, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "a-dir.ini: a directory (expected a config file)"), "%s", err.msg);
    config_destroy(c);
}

/* A table from a plug-in is checked before use: each fault named. */
Test(config, a_field_table_from_elsewhere_is_checked_before_use) {
    static const char *const none[] = {NULL};
    static const config_field bad[][1] = {
        {{"gpu", "on", CONFIG_BOOL, offsetof(demo_settings, pinned), 0, false, 1, 0, NULL, "maybe",
          NULL}},
        {{"gpu", "on", (config_type)99, 0, 0, false, 1, 0, NULL, NULL, NULL}},
        {{"gpu", "mode", CONFIG_ENUM, offsetof(demo_settings, mode), 0, false, 1, 0, none, NULL,
          NULL}},
        {{"gpu", "name", CONFIG_STR, offsetof(demo_settings, gpu), 64, false, 1, 0, NULL, NULL,
          NULL}},
        {{"gpu", NULL, CONFIG_U32, 0, 0, false, 1, 0, NULL, NULL, NULL}},
    };
    static const char *const want[] = {"default: [gpu] on: expected true or false, got 'maybe'",
                                       "[gpu] on: type 99 is not a config_type",
                                       "[gpu] mode: an enum field needs its choices",
                                       "lies outside the", "field 0: expected a section and a key"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        moesim_error err = {0};
        cr_assert_eq(config_check_fields(bad[i], 1, sizeof(demo_settings), &err), MOESIM_EINPUT,
                     "case %zu", i);
        cr_assert(strstr(err.msg, want[i]), "case %zu: got '%s'", i, err.msg);
    }
    moesim_error err = {0};
    cr_assert_eq(config_check_fields(demo_fields, 5, sizeof(demo_settings), &err), MOESIM_OK, "%s",
                 err.msg);
}
