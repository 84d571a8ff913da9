/* Crash-safe output (common/atomic_file.h): the destination appears only on commit, with the mode
 * a plain fopen would give (0666 less the umask) from the moment the temporary exists, an abort
 * leaves nothing, and many writers of one destination never share a temporary. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "support/test_support.h"

TestSuite(atomic_file);

/* Files in the folder of `path` whose name starts with the base name of `path`. */
static size_t count_siblings(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    cr_assert(slash);
    *slash = '\0';
    const char *base = slash + 1;
    size_t n = 0;
    DIR *d = opendir(dir);
    cr_assert(d, "cannot list %s", dir);
    for (struct dirent *de; (de = readdir(d));) n += !strncmp(de->d_name, base, strlen(base));
    closedir(d);
    return n;
}

static mode_t mode_of(const char *path) {
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "cannot stat %s", path);
    return sb.st_mode & 0777;
}

typedef struct umask_case {
    mode_t mask, want;
} umask_case;

Test(atomic_file, the_temporary_and_the_result_get_0666_less_the_umask_for_both_kinds_of_writer) {
    static const umask_case cases[] = {{022, 0644}, {077, 0600}, {002, 0664}};
    mode_t old = umask(022);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        umask(cases[i].mask);
        char path[4096];
        snprintf(path, sizeof path, "%s", test_tmp_path("af-mode.txt"));
        unlink(path);
        atomic_file af;
        moesim_error err = {0};
        cr_assert_eq(atomic_file_open(&af, path, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_eq(mode_of(af.tmp_path), cases[i].want, "temporary of umask %03o: %03o",
                     (unsigned)cases[i].mask, (unsigned)mode_of(af.tmp_path));
        cr_assert_not(test_file_exists(path), "destination before commit");
        fputs("hello\n", af.fp);
        cr_assert_eq(atomic_file_commit(&af, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_eq(mode_of(path), cases[i].want);
        cr_assert_eq(umask(cases[i].mask), cases[i].mask, "the umask was changed");

        snprintf(path, sizeof path, "%s", test_tmp_path("af-mode.bin"));
        unlink(path);
        cr_assert_eq(atomic_file_begin_path(&af, path, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_null(af.fp);
        cr_assert_eq(mode_of(af.tmp_path), cases[i].want);
        FILE *fp = fopen(af.tmp_path, "w"); /* what a library that opens by name does */
        cr_assert(fp);
        fputs("bytes", fp);
        fclose(fp);
        cr_assert_eq(atomic_file_commit(&af, &err), MOESIM_OK, "%s", err.msg);
        cr_assert_eq(mode_of(path), cases[i].want);
        cr_assert_eq(count_siblings(path), 1, "a temporary was left behind");
    }
    umask(old);
}

Test(atomic_file, an_abort_leaves_the_destination_untouched_and_no_temporary) {
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("af-abort.txt"));
    test_write_file(path, "old\n");
    atomic_file af;
    moesim_error err = {0};
    cr_assert_eq(atomic_file_open(&af, path, &err), MOESIM_OK, "%s", err.msg);
    fputs("new\n", af.fp);
    atomic_file_abort(&af);
    atomic_file_abort(&af); /* twice is safe */
    FILE *fp = fopen(path, "r");
    char buf[16] = {0};
    cr_assert(fgets(buf, sizeof buf, fp));
    fclose(fp);
    cr_assert_str_eq(buf, "old\n");
    cr_assert_eq(count_siblings(path), 1);
}

Test(atomic_file, writers_of_one_destination_open_at_once_get_distinct_temporaries) {
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("af-many.txt"));
    unlink(path);
    enum { N = 16 };
    atomic_file af[N];
    moesim_error err = {0};
    for (int i = 0; i < N; i++)
        cr_assert_eq(atomic_file_open(&af[i], path, &err), MOESIM_OK, "%s", err.msg);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < i; j++) cr_assert_str_neq(af[i].tmp_path, af[j].tmp_path);
    cr_assert_eq(count_siblings(path), N);
    for (int i = 0; i < N; i++) {
        fprintf(af[i].fp, "%d\n", i);
        cr_assert_eq(atomic_file_commit(&af[i], &err), MOESIM_OK, "%s", err.msg);
    }
    FILE *fp = fopen(path, "r");
    char buf[16] = {0};
    cr_assert(fgets(buf, sizeof buf, fp));
    fclose(fp);
    cr_assert_str_eq(buf, "15\n", "the last commit wins");
    cr_assert_eq(count_siblings(path), 1);
}

Test(atomic_file, a_missing_folder_is_an_error_naming_the_destination) {
    atomic_file af;
    moesim_error err = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s", test_tmp_path("no-such-dir/x.txt"));
    cr_assert_eq(atomic_file_open(&af, path, &err), MOESIM_EIO);
    cr_assert(strstr(err.msg, "no-such-dir/x.txt"), "%s", err.msg);
    cr_assert_eq(af.tmp_path[0], '\0');
}

/* What already stands at the destination: a regular file is replaced, one a symbolic link names
 * is written through (the link kept); a directory, a FIFO or a link to nothing is refused before
 * any temporary exists, and left as it was. */
Test(atomic_file, only_a_regular_file_or_a_link_to_one_is_replaced) {
    char fifo[4096], dir[4096], link[4096], target[4096], dangling[4096];
    snprintf(fifo, sizeof fifo, "%s", test_tmp_path("af-fifo"));
    snprintf(dir, sizeof dir, "%s", test_tmp_path("af-dir"));
    snprintf(link, sizeof link, "%s", test_tmp_path("af-link"));
    snprintf(target, sizeof target, "%s", test_tmp_path("af-target.txt"));
    snprintf(dangling, sizeof dangling, "%s", test_tmp_path("af-dangling"));
    unlink(fifo), rmdir(dir), unlink(link), unlink(dangling);
    cr_assert_eq(mkfifo(fifo, 0666), 0);
    cr_assert_eq(mkdir(dir, 0777), 0);
    test_write_file(target, "old\n");
    cr_assert_eq(symlink(target, link), 0);
    cr_assert_eq(symlink(test_tmp_path("af-nothing"), dangling), 0);

    const char *refused[] = {fifo, dir, dangling};
    const char *why[] = {"a device, FIFO or socket, not a regular file",
                         "a directory, not a regular", "a symbolic link to nothing"};
    for (size_t i = 0; i < 3; i++) {
        atomic_file af;
        moesim_error err = {0};
        cr_assert_eq(atomic_file_open(&af, refused[i], &err), MOESIM_EINPUT, "%s", refused[i]);
        cr_assert(strstr(err.msg, why[i]), "%s", err.msg);
        cr_assert_eq(count_siblings(refused[i]), 1, "a temporary beside %s", refused[i]);
    }
    struct stat sb;
    cr_assert(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");

    atomic_file af;
    moesim_error err = {0};
    cr_assert_eq(atomic_file_open(&af, link, &err), MOESIM_OK, "%s", err.msg);
    fputs("new\n", af.fp);
    cr_assert_eq(atomic_file_commit(&af, &err), MOESIM_OK, "%s", err.msg);
    cr_assert(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "the link was replaced");
    char *text = test_read_file(target, NULL);
    cr_assert_str_eq(text, "new\n");
    free(text);
}

Test(atomic_file, an_output_that_is_the_input_is_refused_by_name_or_through_a_link) {
    char in[4096], link[4096], other[4096];
    snprintf(in, sizeof in, "%s", test_tmp_path("af-in.txt"));
    snprintf(link, sizeof link, "%s", test_tmp_path("af-in-link"));
    snprintf(other, sizeof other, "%s", test_tmp_path("af-other.txt"));
    test_write_file(in, "input\n");
    unlink(link), unlink(other);
    cr_assert_eq(symlink(in, link), 0);
    moesim_error err = {0};
    cr_assert_eq(atomic_file_check_not_input(in, in, &err), MOESIM_EINPUT);
    cr_assert(strstr(err.msg, "writing it would replace it"), "%s", err.msg);
    cr_assert_eq(atomic_file_check_not_input(link, in, &err), MOESIM_EINPUT);
    cr_assert_eq(atomic_file_check_not_input(other, in, &err), MOESIM_OK, "a new file");
    test_write_file(other, "x\n");
    cr_assert_eq(atomic_file_check_not_input(other, in, &err), MOESIM_OK, "another file");
}
