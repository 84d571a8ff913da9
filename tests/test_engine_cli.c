/* `moesim eval` and `moesim record` end to end on the fixture checkpoints. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/test_support.h"

static char model_dir[1024];
static char out[1 << 14], errbuf[1 << 12];

static const char *fixture(const char *arch) {
    snprintf(model_dir, sizeof model_dir, "%s/tests/fixtures/golden/%s", MOESIM_SOURCE_DIR, arch);
    return model_dir;
}

static double json_number(const char *text, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(text, pat);
    cr_assert(p, "no %s in %s", key, text);
    return strtod(p + strlen(pat), NULL);
}

TestSuite(engine_cli);

Test(engine_cli, eval_reports_kl_that_grows_as_precision_drops) {
    const char *toks = test_tmp_path("toks.txt");
    test_write_file(toks, "# two sequences\n1 17 42 99 3 250 7 64 12 13\n"
                          "{\"prompt_ids\": [9, 8, 7, 6, 5, 4, 3]}\n");
    double kl[3];
    const char *precs[] = {"int8", "int4", "int2"};
    for (int i = 0; i < 3; i++) {
        int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model",
                                 fixture("mixtral"), "--input", toks, "--precision", precs[i],
                                 "--threads", "2", "--json", NULL);
        cr_assert_eq(rc, 0, "%s", errbuf);
        cr_assert_eq(json_number(out, "tokens_scored"), 15);
        kl[i] = json_number(out, "kl_mean_nats");
    }
    cr_assert(kl[0] < kl[1] && kl[1] < kl[2], "KL %g %g %g", kl[0], kl[1], kl[2]);
}

Test(engine_cli, eval_with_a_bf16_map_has_zero_kl_and_equal_perplexity) {
    const char *toks = test_tmp_path("toks.txt"), *map = test_tmp_path("map.txt");
    test_write_file(toks, "5 6 7 8 9 10\n");
    char line[256] = "";
    for (int j = 0; j < 8; j++) strcat(line, "bf16 ");
    char text[1024];
    snprintf(text, sizeof text, "%s\n%s\n%s\n", line, line, line);
    test_write_file(map, text);
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model",
                             fixture("olmoe"), "--input", toks, "--precision-map", map, "--json",
                             NULL);
    cr_assert_eq(rc, 0, "%s", errbuf);
    cr_assert_eq(json_number(out, "kl_mean_nats"), 0);
    cr_assert_eq(json_number(out, "perplexity"), json_number(out, "perplexity_bf16"));
}

Test(engine_cli, eval_rejects_bad_tokens_with_file_and_line) {
    const char *toks = test_tmp_path("bad.txt");
    test_write_file(toks, "1 2 3\n4 five 6\n");
    int rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model",
                             fixture("olmoe"), "--input", toks, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "bad.txt:2: 'five' is not a token id"), "%s", errbuf);
    test_write_file(toks, "1 2 300\n");
    rc = test_run_moesim(out, sizeof out, errbuf, sizeof errbuf, "eval", "--model",
                         fixture("olmoe"), "--input", toks, NULL);
    cr_assert_eq(rc, 2);
    cr_assert(strstr(errbuf, "bad.txt:1: token id 300 outside the vocabulary [0, 256)"), "%s",
              errbuf);
}
