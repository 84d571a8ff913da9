/* Hardware profiles (common/hw.c, configs/hw/<name>.ini): every shipped profile loads, file units
 * (GiB, GB/s, TFLOPS, us) become struct units (bytes, bytes/s, flops/s, ns), every figure carries
 * a source or says it is an assumption, and broken files fail with one message naming the file,
 * the line (or --set) and the key. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/hw.h"
#include "common/paths.h"
#include "support/test_support.h"

static const char *const hw_names[] = {"rtx3090-pcie3", "rtx3090-pcie4", "a6000", "rtx5090",
                                       "h100-sxm"};

static char *read_text(const char *path) {
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    cr_assert(buf);
    cr_assert_eq(fread(buf, 1, (size_t)len, fp), (size_t)len);
    buf[len] = '\0';
    fclose(fp);
    return buf;
}

static void hw_path(const char *name, char *out, size_t len) {
    moesim_error err = {0};
    cr_assert_eq(moesim_config_path("hw", name, out, len, &err), MOESIM_OK, "%s", err.msg);
}

static hw_profile load_named(const char *name) {
    hw_profile h;
    moesim_error err = {0};
    cr_assert_eq(hw_load_by_name(name, &h, &err), MOESIM_OK, "%s", err.msg);
    return h;
}

TestSuite(hw_config);

Test(hw_config, every_shipped_profile_loads_under_its_own_name) {
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(hw_names); i++) {
        hw_profile h = load_named(hw_names[i]);
        cr_assert_str_eq(h.name, hw_names[i]);
        cr_assert(h.gpu[0]);
        cr_assert_gt(h.copy_engines, 0);
        /* the host link is the bottleneck the simulator models: it must be slower than device
         * memory and than host memory for every shipped profile */
        cr_assert_lt(h.h2d_bytes_per_s, h.hbm_bytes_per_s, "%s", hw_names[i]);
        cr_assert_lt(h.h2d_bytes_per_s, h.dram_bytes_per_s, "%s", hw_names[i]);
        cr_assert_lt(h.ssd_read_bytes_per_s, h.dram_bytes_per_s, "%s", hw_names[i]);
    }
}

Test(hw_config, file_units_are_converted_to_bytes_flops_and_nanoseconds) {
    hw_profile h = load_named("rtx3090-pcie3");
    cr_assert_str_eq(h.gpu, "NVIDIA GeForce RTX 3090");
    cr_assert_eq(h.hbm_bytes, 24ull << 30);
    cr_assert_float_eq(h.hbm_bytes_per_s, 936e9, 1);
    cr_assert_float_eq(h.bf16_flops_per_s, 71e12, 1);
    cr_assert_float_eq(h.int8_ops_per_s, 284e12, 1);
    cr_assert_float_eq(h.hbm_efficiency, 0.8, 1e-12);
    cr_assert_float_eq(h.compute_efficiency, 0.6, 1e-12);
    cr_assert_eq(h.kernel_launch_ns, 5000);
    cr_assert_float_eq(h.h2d_bytes_per_s, 11.5e9, 1);
    cr_assert_float_eq(h.d2h_bytes_per_s, 11.5e9, 1);
    cr_assert_eq(h.h2d_latency_ns, 10000);
    cr_assert_eq(h.d2h_latency_ns, 10000);
    cr_assert_eq(h.copy_engines, 2);
    cr_assert_eq(h.dram_bytes, 256ull << 30);
    cr_assert_float_eq(h.dram_bytes_per_s, 204.8e9, 1);
    cr_assert_float_eq(h.ssd_read_bytes_per_s, 3.5e9, 1);
    cr_assert_eq(h.ssd_latency_ns, 80000);
    cr_assert_not(h.gpu_direct_storage);
}

Test(hw_config, profiles_carry_the_calibration_figures) {
    static const struct {
        const char *name;
        uint64_t hbm_gib;
        double hbm_gb_per_s, h2d_gb_per_s;
        bool gds;
    } cases[] = {
        {"rtx3090-pcie3", 24, 936, 11.5, false}, /* Gen3 pinned 11-12 GB/s (dask-cuda #98) */
        {"rtx3090-pcie4", 24, 936, 24, false},   /* Gen4 pinned 20-26 GB/s */
        {"a6000", 48, 768, 24, false},
        {"rtx5090", 32, 1792, 48, false}, /* GeForce: no GPUDirect Storage */
        {"h100-sxm", 80, 3350, 48, true},
    };
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(cases); i++) {
        hw_profile h = load_named(cases[i].name);
        cr_assert_eq(h.hbm_bytes, cases[i].hbm_gib << 30, "%s", cases[i].name);
        cr_assert_float_eq(h.hbm_bytes_per_s, cases[i].hbm_gb_per_s * 1e9, 1, "%s", cases[i].name);
        cr_assert_float_eq(h.h2d_bytes_per_s, cases[i].h2d_gb_per_s * 1e9, 1, "%s", cases[i].name);
        cr_assert_eq(h.gpu_direct_storage, cases[i].gds, "%s", cases[i].name);
    }
    /* FIRM-MoE's testbed has 64 GB of host memory */
    cr_assert_eq(load_named("rtx3090-pcie4").dram_bytes, 64ull << 30);
}

/* Every figure is sourced: each key line carries a comment, and a comment without a named source
 * says "assumption" (CALIBRATION.md: where we must assume, say so and why). */
Test(hw_config, every_figure_in_a_profile_has_a_source_or_is_marked_as_an_assumption) {
    static const char *const sources[] = {
        "whitepaper",       "datasheet", "spec page", "dask-cuda",
        "measured reports", "FIRM-MoE",  "MagnumIO",  "vendor specs",
        "assumption",       "derived",   "spec:"};
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(hw_names); i++) {
        char path[4096];
        hw_path(hw_names[i], path, sizeof path);
        char *text = read_text(path);
        int line_no = 0;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            line_no++;
            if (line[0] == ';' || line[0] == '[' || !strchr(line, '=')) continue;
            if (!strncmp(line, "name", 4)) continue;
            const char *comment = strchr(line, ';');
            cr_assert(comment, "%s:%d: '%s' has no source comment", path, line_no, line);
            bool sourced = false;
            for (size_t s = 0; s < MOESIM_ARRAY_LEN(sources); s++)
                sourced |= strstr(comment, sources[s]) != NULL;
            cr_assert(sourced, "%s:%d: '%s' names no source and no assumption", path, line_no,
                      line);
        }
        free(text);
    }
}

Test(hw_config, set_overrides_any_loaded_value) {
    char path[4096];
    hw_path("rtx3090-pcie3", path, sizeof path);
    const char *sets[] = {"pcie.h2d_gb_per_s=6", "host.dram_gib=12", "ssd.gpu_direct_storage=true",
                          "pcie.copy_engines=1"};
    hw_profile h;
    moesim_error err = {0};
    cr_assert_eq(hw_load_with_sets(path, sets, 4, &h, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_float_eq(h.h2d_bytes_per_s, 6e9, 1);
    cr_assert_eq(h.dram_bytes, 12ull << 30);
    cr_assert(h.gpu_direct_storage);
    cr_assert_eq(h.copy_engines, 1);
}

/* op_issue_us is optional: 0 in the shipped profiles, a calibrated profile's measured value */
Test(hw_config, op_issue_is_optional_and_read_in_microseconds) {
    char path[4096];
    hw_path("h100-sxm", path, sizeof path);
    hw_profile h;
    moesim_error err = {0};
    cr_assert_eq(hw_load_with_sets(path, NULL, 0, &h, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(h.op_issue_ns, 0);
    const char *sets[] = {"gpu.op_issue_us=2.94"};
    cr_assert_eq(hw_load_with_sets(path, sets, 1, &h, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(h.op_issue_ns, 2940);
}

/* What the link and the compute cost each other: optional, 0 in the shipped profiles, a
 * fraction of at most 4 */
Test(hw_config, the_slowdowns_beside_each_other_are_optional_fractions) {
    char path[4096];
    hw_path("rtx3090-pcie3", path, sizeof path);
    hw_profile h;
    moesim_error err = {0};
    cr_assert_eq(hw_load_with_sets(path, NULL, 0, &h, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(h.op_slowdown_beside_copy, 0);
    cr_assert_eq(h.h2d_slowdown_beside_compute, 0);
    const char *sets[] = {"gpu.slowdown_beside_copy=0.1", "pcie.slowdown_beside_compute=0.05"};
    cr_assert_eq(hw_load_with_sets(path, sets, 2, &h, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_float_eq(h.op_slowdown_beside_copy, 0.1, 1e-12);
    cr_assert_float_eq(h.h2d_slowdown_beside_compute, 0.05, 1e-12);
    const char *bad[] = {"pcie.slowdown_beside_compute=-0.1"};
    cr_assert_eq(hw_load_with_sets(path, bad, 1, &h, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "[pcie] slowdown_beside_compute: expected a number in [0, 4]"), "%s",
              err.msg);
}

Test(hw_config, a_bad_set_is_reported_as_coming_from_set) {
    static const struct {
        const char *set, *message;
    } cases[] = {
        {"pcie.h2d_gb_per_s=fast",
         "--set: [pcie] h2d_gb_per_s: expected a finite number, got 'fast'"},
        {"pcie.h2d_gb_per_s=1000",
         "--set: [pcie] h2d_gb_per_s: expected at most hbm_gb_per_s (936), got 1000"},
        {"gpu.hbm_efficiency=1.5",
         "--set: [gpu] hbm_efficiency: expected a number in [0.01, 1], got '1.5'"},
        {"pcie.copy_engines=0",
         "--set: [pcie] copy_engines: expected an integer in [1, 16], got '0'"},
        {"pcie.lanes=16", "--set: [pcie] lanes: unknown key (known: h2d_gb_per_s, d2h_gb_per_s, "
                          "h2d_latency_us, d2h_latency_us, copy_engines, latency_per_chunk, "
                          "slowdown_beside_compute)"},
    };
    char path[4096];
    hw_path("rtx3090-pcie3", path, sizeof path);
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(cases); i++) {
        hw_profile h;
        moesim_error err = {0};
        cr_assert_eq(hw_load_with_sets(path, &cases[i].set, 1, &h, &err), MOESIM_EINPUT);
        cr_assert_str_eq(err.msg, cases[i].message, "case %zu: got %s", i, err.msg);
    }
}

/* Edits of rtx3090-pcie4.ini: the key line is replaced (or removed, or a line inserted after it).
 */
typedef struct hw_edit {
    const char *key;     /* line that starts with this */
    const char *line;    /* replacement; "" removes the line */
    bool insert_after;   /* keep the key line and insert `line` after it */
    bool names_line;     /* message starts with path:line of the edited / inserted line */
    const char *message; /* after "path[:line]: "; a %d is the key line's number */
} hw_edit;

static const hw_edit hw_edits[] = {
    {"hbm_gib =", "hbm_gib = lots", false, true,
     "[gpu] hbm_gib: expected a finite number, got 'lots'"},
    {"hbm_gib =", "hbm_gib = -24", false, true,
     "[gpu] hbm_gib: expected a number in [0.25, 4096], got '-24'"},
    {"hbm_gb_per_s =", "", false, false, "[gpu] hbm_gb_per_s: missing required key"},
    {"copy_engines =", "copy_engines = 2.5", false, true,
     "[pcie] copy_engines: expected a non-negative integer, got '2.5'"},
    {"gpu_direct_storage =", "gpu_direct_storage = sometimes", false, true,
     "[ssd] gpu_direct_storage: expected true or false, got 'sometimes'"},
    {"latency_us =", "random_read_us = 80", true, true,
     "[ssd] random_read_us: unknown key (known: read_gb_per_s, latency_us, gpu_direct_storage)"},
    {"d2h_gb_per_s =", "d2h_gb_per_s = 2000", false, true,
     "[pcie] d2h_gb_per_s: expected a number in [0.1, 1000], got '2000'"},
    {"d2h_gb_per_s =", "d2h_gb_per_s = 999", false, true,
     "[pcie] d2h_gb_per_s: expected at most hbm_gb_per_s (936), got 999"},
    {"d2h_gb_per_s =", "d2h_gb_per_s = 24", true, true,
     "[pcie] d2h_gb_per_s: duplicate key (first set at line %d)"},
};

Test(hw_config, bad_profiles_fail_naming_file_line_and_key) {
    char src[4096];
    hw_path("rtx3090-pcie4", src, sizeof src);
    char *orig = read_text(src);
    for (size_t i = 0; i < MOESIM_ARRAY_LEN(hw_edits); i++) {
        const hw_edit *e = &hw_edits[i];
        const char *at = orig;
        int line_no = 1;
        while (strncmp(at, e->key, strlen(e->key))) {
            at = strchr(at, '\n');
            cr_assert(at, "no line starts with '%s'", e->key);
            at++;
            line_no++;
        }
        const char *eol = strchr(at, '\n') + 1;
        char *text = malloc(strlen(orig) + strlen(e->line) + 2);
        size_t head = (size_t)((e->insert_after ? eol : at) - orig);
        memcpy(text, orig, head);
        sprintf(text + head, "%s%s%s", e->line, *e->line ? "\n" : "", eol);
        if (e->insert_after) line_no++;
        char name[32];
        snprintf(name, sizeof name, "hw%zu.ini", i);
        char path[4096];
        snprintf(path, sizeof path, "%s", test_tmp_path(name));
        test_write_file(path, text);
        hw_profile h;
        moesim_error err = {0};
        cr_assert_eq(hw_load(path, &h, &err), MOESIM_EINPUT, "edit %zu loaded", i);
        char message[512], want[1024];
        snprintf(message, sizeof message, e->message, line_no - 1);
        if (e->names_line)
            snprintf(want, sizeof want, "%s:%d: %s", path, line_no, message);
        else
            snprintf(want, sizeof want, "%s: %s", path, message);
        cr_assert_str_eq(err.msg, want, "edit %zu:\n got  %s\n want %s", i, err.msg, want);
        free(text);
    }
    free(orig);
}

Test(hw_config, an_unknown_profile_name_lists_the_known_ones) {
    hw_profile h;
    moesim_error err = {0};
    cr_assert_eq(hw_load_by_name("rtx4090", &h, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "unknown hw name 'rtx4090'"), "%s", err.msg);
    cr_assert(strstr(err.msg, "a6000, cpu-host, h100-sxm, rtx3090-pcie3, rtx3090-pcie4, rtx5090"),
              "%s", err.msg);
}

Test(hw_config, hw_and_model_sections_share_one_config) {
    char path[4096];
    hw_path("a6000", path, sizeof path);
    config *c = config_create();
    moesim_error err = {0};
    cr_assert_eq(config_load_file(c, path, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(config_set(c, "gpu.hbm_gib=16", &err), MOESIM_OK);
    hw_profile h;
    cr_assert_eq(hw_read_config(c, &h, &err), MOESIM_OK, "%s", err.msg);
    cr_assert_eq(h.hbm_bytes, 16ull << 30);
    cr_assert_eq(config_check_unused(c, &err), MOESIM_OK, "%s", err.msg);
    config_destroy(c);
}
