/* `moesim plot CSV --x COL --y COL [--series] [--panel] [--logx|--logy] -o FILE` (cli/plot_csv.c):
 * a sweep's results CSV drawn with gnuplot as PNG and SVG; bad columns and values are one line
 * naming the file, line and column, exit status 2, and no image. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/test_support.h"

TestSuite(plot_csv);

/* A sweep result of the shape `moesim sweep` writes: two models, two policies, three sizes,
 * one failed run (empty metric). */
static const char sweep_csv[] = "status,model,policy,label.cache_experts,tpot_ms.mean\n"
                                "ok,a,lru,64,40.5\n"
                                "ok,a,lru,128,30.25\n"
                                "ok,a,lru,256,21\n"
                                "ok,a,firm-moe,64,38\n"
                                "ok,a,firm-moe,128,27.5\n"
                                "failed,a,firm-moe,256,\n"
                                "ok,b,lru,64,60\n"
                                "ok,b,lru,128,45\n"
                                "ok,b,firm-moe,64,55\n"
                                "ok,b,firm-moe,128,41\n";

static const char *write_sweep(void) {
    static char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("sweep.csv"));
    test_write_file(path, sweep_csv);
    return path;
}

Test(plot_csv, a_sweep_csv_renders_as_png_and_svg_with_gnuplot_exiting_0) {
    const char *csv = write_sweep();
    char png[4096], svg[4096], out[2048], err[2048];
    snprintf(png, sizeof png, "%s", test_tmp_path("sweep.png"));
    snprintf(svg, sizeof svg, "%s", test_tmp_path("sweep.svg"));
    int rc = test_run_moesim(out, sizeof out, err, sizeof err, "plot", csv, "--x",
                             "label.cache_experts", "--y", "tpot_ms.mean", "--series", "policy",
                             "--panel", "model", "--logx", "-o", png, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(strstr(out, "skipped 1 rows"), "%s", out);
    size_t n;
    char *bytes = test_read_file(png, &n);
    cr_assert(n > 1000 && !memcmp(bytes, "\x89PNG", 4), "not a PNG (%zu bytes)", n);
    free(bytes);
    rc =
        test_run_moesim(out, sizeof out, err, sizeof err, "plot", csv, "--x", "label.cache_experts",
                        "--y", "tpot_ms.mean", "--series", "policy", "--logy", "-o", svg, NULL);
    cr_assert_eq(rc, 0, "%s", err);
    char *text = test_read_file(svg, NULL);
    cr_assert(strstr(text, "<svg"), "not an SVG");
    cr_assert(strstr(text, "tpot (ms), mean"), "the y label with its unit");
    cr_assert(strstr(text, "cache experts"), "the x label");
    cr_assert(strstr(text, "policy = firm-moe"), "a series title");
    free(text);
}

Test(plot_csv, a_missing_column_or_a_bad_value_is_one_line_exit_2_and_no_image) {
    const char *csv = write_sweep();
    char png[4096], err[2048];
    snprintf(png, sizeof png, "%s", test_tmp_path("bad.png"));
    int rc = test_run_moesim(NULL, 0, err, sizeof err, "plot", csv, "--x", "cache", "--y",
                             "tpot_ms.mean", "-o", png, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "sweep.csv:1: --x 'cache': no such column"), "%s", err);
    cr_assert_eq(strchr(err, '\n'), strrchr(err, '\n'), "one line: %s", err);
    cr_assert_not(test_file_exists(png));
    rc = test_run_moesim(NULL, 0, err, sizeof err, "plot", csv, "--x", "label.cache_experts", "--y",
                         "policy", "-o", png, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "sweep.csv:2: policy: 'lru' is not a number"), "%s", err);
    cr_assert_not(test_file_exists(png));
    rc = test_run_moesim(NULL, 0, err, sizeof err, "plot", csv, "--x", "label.cache_experts", "--y",
                         "tpot_ms.mean", "-o", "out.pdf", NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(err, "expected a name ending in .png or .svg"), "%s", err);
}

/* When gnuplot itself fails (here: a log axis over values that are all negative), its messages
 * are held back and the one naming the script's line becomes the command's one line. */
Test(plot_csv, a_gnuplot_failure_is_one_line_naming_gnuplots_reason_and_no_image) {
    const char *csv = test_tmp_path("negative.csv");
    test_write_file(csv, "x,y\n1,-1\n2,-2\n");
    char png[4096], err[2048];
    snprintf(png, sizeof png, "%s", test_tmp_path("negative.png"));
    int rc = test_run_moesim(NULL, 0, err, sizeof err, "plot", csv, "--x", "x", "--y", "y",
                             "--logy", "-o", png, NULL);
    cr_assert_eq(rc, 2, "%s", err);
    cr_assert(strstr(err, "negative.csv: gnuplot failed: ") && strstr(err, " line "), "%s", err);
    cr_assert_eq(strchr(err, '\n'), strrchr(err, '\n'), "one line: %s", err);
    cr_assert_not(test_file_exists(png));
}
