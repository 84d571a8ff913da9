/* Option errors of every `moesim` command: an unknown option, a missing value or a value given to
 * a flag exits 2 with exactly one line on stderr (ours, naming the option as typed; getopt's own
 * message is silenced) and nothing on stdout. `moesim plot`: the images' folder and a missing
 * gnuplot. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "common/paths.h"

#include "support/test_support.h"

typedef struct option_case {
    const char *args[4]; /* the command line after `moesim`, NULL-terminated */
    const char *says;    /* the whole message line, up to " (see" */
} option_case;

static const option_case cases[] = {
    {{"sim", "--nope"}, "moesim sim: unknown option '--nope'"},
    {{"sim", "--trace"}, "moesim sim: option '--trace' needs a value"},
    {{"sim", "--json=1"}, "moesim sim: option '--json' takes no value"},
    {{"sim", "-x"}, "moesim sim: unknown option '-x'"},
    {{"record", "--nope"}, "moesim record: unknown option '--nope'"},
    {{"record", "--model"}, "moesim record: option '--model' needs a value"},
    {{"record", "-o"}, "moesim record: option '-o' needs a value"},
    {{"eval", "--nope"}, "moesim eval: unknown option '--nope'"},
    {{"eval", "--model"}, "moesim eval: option '--model' needs a value"},
    {{"replay", "--nope"}, "moesim replay: unknown option '--nope'"},
    {{"replay", "--trace"}, "moesim replay: option '--trace' needs a value"},
    {{"calibrate", "--nope=3"}, "moesim calibrate: unknown option '--nope'"},
    {{"calibrate", "--table"}, "moesim calibrate: option '--table' needs a value"},
    {{"validate", "--nope"}, "moesim validate: unknown option '--nope'"},
    {{"validate", "--trace"}, "moesim validate: option '--trace' needs a value"},
    {{"plot", "--nope"}, "moesim plot: unknown option '--nope'"},
    {{"plot", "--csv"}, "moesim plot: option '--csv' needs a value"},
    {{"sweep", "--nope"}, "moesim sweep: unknown option '--nope'"},
    {{"sweep", "-o"}, "moesim sweep: option '-o' needs a value"},
    {{"trace", "import", "--nope"}, "moesim trace import: unknown option '--nope'"},
    {{"trace", "import", "--model"}, "moesim trace import: option '--model' needs a value"},
    {{"trace", "export", "--nope"}, "moesim trace export: unknown option '--nope'"},
    {{"trace", "synth", "--nope"}, "moesim trace synth: unknown option '--nope'"},
    {{"trace", "info", "--nope"}, "moesim trace info: unknown option '--nope'"},
    {{"trace", "stats", "--nope"}, "moesim trace stats: unknown option '--nope'"},
};

Test(cli, an_option_error_is_one_line_naming_the_option_and_exits_2) {
    static char out[8192], err[8192];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const option_case *c = &cases[i];
        int rc = test_run_moesim(out, sizeof out, err, sizeof err, c->args[0], c->args[1],
                                 c->args[2], c->args[3], NULL);
        cr_assert_eq(rc, 2, "%s: exit %d, stderr: %s", c->says, rc, err);
        size_t n = strlen(c->says);
        cr_assert(!strncmp(err, c->says, n) && !strncmp(err + n, " (see", 5),
                  "expected '%s (see ...' as the first line, got: %s", c->says, err);
        char *nl = strchr(err, '\n');
        cr_assert(nl && nl[1] == '\0', "%s: not exactly one line: %s", c->says, err);
        cr_assert_eq(out[0], '\0', "%s: stdout not empty: %s", c->says, out);
    }
}

/* Number options go through common/config.h's parsers: overflow, signs, spaces, fractions,
 * NaN and infinities are refused with one line naming the option and the text. */
static const struct {
    const char *args[8];
    const char *says;
} number_cases[] = {
    {{"trace", "synth", "--model", "olmoe-1b-7b", "--report", "--seed", "18446744073709551616"},
     "--seed: expected a whole number, got '18446744073709551616'"},
    {{"trace", "synth", "--model", "olmoe-1b-7b", "--report", "--requests", "-1"},
     "--requests: expected a whole number >= 1, got '-1'"},
    {{"trace", "synth", "--model", "olmoe-1b-7b", "--report", "--set", "topic_persistence=nan"},
     "--set topic_persistence: expected a number, got 'nan'"},
    {{"trace", "synth", "--model", "olmoe-1b-7b", "--report", "--set", "topic_persistence=1e999"},
     "--set topic_persistence: expected a number, got '1e999'"},
    {{"trace", "synth", "--model", "olmoe-1b-7b", "--report", "--set", "topic_persistence= 1"},
     "--set topic_persistence: expected a number, got ' 1'"},
    {{"trace", "import", "--model", "mixtral-8x7b", "--prefill-tokens", "4294967296", "x.jsonl"},
     "--prefill-tokens: expected a count >= 0, got '4294967296'"},
    {{"trace", "import", "--model", "mixtral-8x7b", "--prefill-tokens", " 3", "x.jsonl"},
     "--prefill-tokens: expected a count >= 0, got ' 3'"},
    {{"trace", "import", "--model", "mixtral-8x7b", "--constant-run-min", "1e3", "x.jsonl"},
     "--constant-run-min: expected a count >= 2, got '1e3'"},
    {{"trace", "stats", "x.h5", "--batch", "0"},
     "--batch: expected an integer in [1, 65536], got '0'"},
    {{"validate", "--policy", "lru", "--repeats", "0"},
     "--repeats: expected an integer in [1, 99], got '0'"},
    {{"validate", "--policy", "lru", "--repeats", "2x"},
     "--repeats: expected an integer in [1, 99], got '2x'"},
    {{"validate", "--policy", "lru", "--check", "nan,0.3"},
     "--check: expected TPOT,MARGIN as two numbers (e.g. 0.25,0.3), got 'nan,0.3'"},
    {{"validate", "--policy", "lru", "--check", "0.25,0.3,1"},
     "--check: expected TPOT,MARGIN as two numbers (e.g. 0.25,0.3), got '0.25,0.3,1'"},
    /* an option that does not apply is refused, not ignored */
    {{"validate", "--policy", "lru", "--top", "3"}, "--top ranks the rows of --winners"},
    {{"eval", "--model", "m", "--input", "i", "--precision=int8", "--precision-map", "p"},
     "--precision and --precision-map: give one"},
    {{"record", "--model", "m", "--input", "i", "-o", "o.h5", "--gpu-pool=5"},
     "--gpu-pool goes with --backend cuda"},
};

Test(cli, a_bad_number_is_one_line_naming_the_option_and_exits_2) {
    static char out[8192], err[8192];
    for (size_t i = 0; i < sizeof number_cases / sizeof number_cases[0]; i++) {
        const char *const *a = number_cases[i].args;
        int rc = test_run_moesim(out, sizeof out, err, sizeof err, a[0], a[1], a[2], a[3], a[4],
                                 a[5], a[6], a[7], NULL);
        cr_assert_eq(rc, 2, "%s: exit %d: %s", number_cases[i].says, rc, err);
        cr_assert(strstr(err, number_cases[i].says), "expected '%s' in: %s", number_cases[i].says,
                  err);
        char *nl = strchr(err, '\n');
        cr_assert(nl && nl[1] == '\0', "not one line: %s", err);
    }
}

Test(cli, the_plot_folder_of_a_csv_is_its_dirname) {
    static const struct {
        const char *path, *dir;
    } dirs[] = {
        {"/data.csv", "/"}, {"data.csv", "."}, {"a/b.csv", "a"}, {"/a/b/c.csv", "/a/b"},
        {"a//b.csv", "a"},  {"a/b/", "a"},     {"//x.csv", "/"}, {"/", "/"},
        {"./x.csv", "."},   {"", "."},
    };
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char out[64];
        moesim_path_dirname(dirs[i].path, out, sizeof out);
        cr_assert_str_eq(out, dirs[i].dir, "dirname('%s')", dirs[i].path);
    }
}

Test(cli, plot_without_gnuplot_says_so_in_one_line_and_writes_no_image) {
    char dir[4096], csv[4200], png[4200], empty_bin[4200];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("plot-no-gnuplot"));
    mkdir(dir, 0755);
    snprintf(csv, sizeof csv, "%s/results.csv", dir);
    snprintf(png, sizeof png, "%s/hit-rate-curves.png", dir);
    snprintf(empty_bin, sizeof empty_bin, "%s/bin", dir);
    mkdir(empty_bin, 0755);
    test_write_file(csv, "a,b\n1,2\n");
    setenv("PATH", empty_bin, 1); /* this test's process only: Criterion forks each test */
    static char out[8192], err[8192];
    int rc = test_run_moesim(out, sizeof out, err, sizeof err, "plot", "hit-rate-curves", "--csv",
                             csv, NULL);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
    cr_assert(strstr(err, "cannot run gnuplot"), "%s", err);
    char *nl = strchr(err, '\n');
    cr_assert(nl && nl[1] == '\0', "not one line: %s", err);
    cr_assert_eq(out[0], '\0', "%s", out);
    cr_assert_not(test_file_exists(png));
}

/* A named plot that gnuplot fails on leaves no image and takes back the folders -o made; one
 * made before the run stays. */
Test(cli, a_failed_named_plot_leaves_no_image_and_no_folder_it_made) {
    char dir[4096], csv[4200], made[4200], png[4300];
    snprintf(dir, sizeof dir, "%s", test_tmp_path("plot-fails"));
    mkdir(dir, 0755);
    snprintf(csv, sizeof csv, "%s/results.csv", dir);
    snprintf(made, sizeof made, "%s/new/images", dir);
    test_write_file(csv, "a,b\n1,2\n"); /* none of the script's columns */
    static char err[8192];
    int rc = test_run_moesim(NULL, 0, err, sizeof err, "plot", "hit-rate-curves", "--csv", csv,
                             "-o", made, NULL);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
    cr_assert(strstr(err, "gnuplot failed on"), "%s", err);
    snprintf(made, sizeof made, "%s/new", dir);
    cr_assert_not(test_file_exists(made), "%s was left behind", made);
    rc = test_run_moesim(NULL, 0, err, sizeof err, "plot", "hit-rate-curves", "--csv", csv, NULL);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
    snprintf(png, sizeof png, "%s/hit-rate-curves.png", dir);
    cr_assert_not(test_file_exists(png));
    cr_assert(test_file_exists(dir));
}

/* The CPU replay holds the expert budget in this machine's memory: a budget beyond it (a
 * profile of 4 TiB of HBM) is one line before any expert file is written, not an abort. */
Test(cli, a_cpu_replay_budget_beyond_this_machine_is_one_line) {
    char data[4096], hw_dir[4200], hw[4300], trace[4200], line[512];
    snprintf(data, sizeof data, "%s", test_tmp_path("huge-hbm"));
    snprintf(hw_dir, sizeof hw_dir, "%s/configs/hw", data);
    snprintf(trace, sizeof trace, "%s/t.h5", data);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", hw_dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(hw, sizeof hw, "%s/huge.ini", hw_dir);
    snprintf(line, sizeof line, "%s/configs/hw/h100-sxm.ini", MOESIM_SOURCE_DIR);
    char *ini = test_read_file(line, NULL), *at = strstr(ini, "hbm_gib = 80");
    cr_assert(at);
    memcpy(at, "hbm_gib=4096", 12);
    test_write_file(hw, ini);
    free(ini);
    static char out[8192], err[8192];
    int rc = test_run_moesim(out, sizeof out, err, sizeof err, "trace", "synth", "--model",
                             "olmoe-1b-7b", "--requests", "1", "--prompt-len", "2", "--gen-len",
                             "2", "-q", "-o", trace, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    rc = test_run_moesim(out, sizeof out, err, sizeof err, "--data-dir", data, "replay", "--trace",
                         trace, "--hw", "huge", "--policy", "lru", "--backend", "cpu",
                         "--synthetic-weights", "-q", "--ssd-dir", data, NULL);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
    cr_assert(strstr(err, "memory.budget_gb: the CPU backend holds the expert budget"), "%s", err);
    cr_assert_eq(strchr(err, '\n'), strrchr(err, '\n'), "not one line: %s", err);
}

/* --data-dir names a folder: one missing (a typo) or a file is refused, not searched in vain;
 * one without a value is named too. */
Test(cli, a_data_dir_that_is_not_a_folder_is_one_line) {
    static char out[8192], err[8192];
    const char *runs[][3] = {{"--data-dir", "/nonexistent-moesim-data", "sim"},
                             {"--data-dir=/dev/null", "sim", NULL},
                             {"sim", "--data-dir", NULL}};
    const char *says[] = {"--data-dir '/nonexistent-moesim-data': not a folder",
                          "--data-dir '/dev/null': not a folder",
                          "option '--data-dir' needs a value"};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        int rc = test_run_moesim(out, sizeof out, err, sizeof err, runs[i][0], runs[i][1],
                                 runs[i][2], NULL);
        cr_assert_eq(rc, 2, "run %zu: exit %d: %s", i, rc, err);
        cr_assert(strstr(err, says[i]), "run %zu: %s", i, err);
        cr_assert_eq(strchr(err, '\n'), strrchr(err, '\n'), "run %zu: not one line: %s", i, err);
    }
}

/* A command whose output path names its own input, or two outputs on one path, refuses before
 * any work, the input intact; output that standard output cannot take (a full device) fails the
 * run. */
Test(cli, an_output_that_is_the_input_is_refused_and_a_full_stdout_fails) {
    static char out[8192], err[8192];
    char trace[4096];
    snprintf(trace, sizeof trace, "%s", test_tmp_path("cli-self.h5"));
    int rc = test_run_moesim(out, sizeof out, err, sizeof err, "trace", "synth", "--model",
                             "olmoe-1b-7b", "--requests", "1", "--prompt-len", "2", "--gen-len",
                             "2", "-q", "-o", trace, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    struct stat before;
    cr_assert_eq(stat(trace, &before), 0);
    const char *runs[][16] = {
        {"trace", "export", "--format", "csv", trace, "-o", trace},
        {"trace", "synth", "--fit", trace, "-q", "--requests", "1", "--prompt-len", "2",
         "--gen-len", "2", "-o", trace},
        {"sim", "--trace", trace, "--policy", "lru", "--hw", "a6000", "--set",
         "memory.budget_gb=24", "-q", "--timeline", trace},
        {"replay", "--trace", trace, "--policy", "lru", "--hw", "cpu-host", "--backend", "cpu",
         "--synthetic-weights", "--timeline", trace},
        {"validate", "--trace", trace, "--policy", "lru", "--hw", "a6000", "--backend", "cpu",
         "--csv", trace},
        {"record", "--model", "unused", "--input", trace, "-o", trace},
        {"calibrate", "-o", "unused.ini", "--table", trace, "--base", "a6000", "--model", trace},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const char *const *a = runs[i];
        rc =
            test_run_moesim(out, sizeof out, err, sizeof err, a[0], a[1], a[2], a[3], a[4], a[5],
                            a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], NULL);
        cr_assert_eq(rc, 2, "run %zu: exit %d: %s", i, rc, err);
        cr_assert(strstr(err, "writing it would replace it"), "run %zu: %s", i, err);
        cr_assert_eq(strchr(err, '\n'), strrchr(err, '\n'), "run %zu: not one line: %s", i, err);
        struct stat after;
        cr_assert_eq(stat(trace, &after), 0);
        cr_assert(after.st_ino == before.st_ino && after.st_size == before.st_size &&
                      after.st_mtime == before.st_mtime,
                  "run %zu changed the input", i);
    }
    /* two outputs on one path; a report whose CSV cannot be written is not written either */
    char report[4200], csv[4200];
    snprintf(report, sizeof report, "%s", test_tmp_path("cli-self.md"));
    snprintf(csv, sizeof csv, "%s/no-such-folder/rows.csv", test_tmp_path(""));
    rc = test_run_moesim(out, sizeof out, err, sizeof err, "validate", "--trace", trace, "--hw",
                         "a6000", "--policy", "lru", "--backend", "cpu", "--report", report,
                         "--csv", report, NULL);
    cr_assert_eq(rc, 2, "%s", err);
    cr_assert(strstr(err, "named for two outputs"), "%s", err);
    rc = test_run_moesim(out, sizeof out, err, sizeof err, "validate", "--trace", trace, "--hw",
                         "a6000", "--policy", "lru", "--backend", "cpu", "--report", report,
                         "--csv", csv, NULL);
    cr_assert_eq(rc, 2, "%s", err);
    cr_assert(strstr(err, "rows.csv: cannot create output file"), "%s", err);
    cr_assert_not(test_file_exists(report));
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "\"$MOESIM_BIN\" trace info %s >/dev/full 2>/dev/null", trace);
    int status = system(cmd);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 2, "trace info >/dev/full: status %d",
              status);
}
