/* The data search path and config lookup by name; see paths.h. */
#define _GNU_SOURCE /* dladdr: where the code of a loaded libmoesim lives */
#include "common/paths.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/check.h"

typedef struct dir_list {
    char **dirs;
    size_t n;
} dir_list;

static dir_list data_path; /* the whole search path, composed once */
static pthread_once_t data_path_once = PTHREAD_ONCE_INIT;

static void dir_list_add(dir_list *l, const char *dir, size_t len) {
    if (!len) return;
    for (size_t i = 0; i < l->n; i++)
        if (strlen(l->dirs[i]) == len && !strncmp(l->dirs[i], dir, len)) return;
    l->dirs = moesim_xrealloc(l->dirs, (l->n + 1) * sizeof *l->dirs);
    char *copy = moesim_xmalloc(len + 1);
    memcpy(copy, dir, len);
    copy[len] = '\0';
    l->dirs[l->n++] = copy;
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Whether `dir` is `root` or a folder below it (both canonical). */
static bool is_below(const char *dir, const char *root) {
    size_t n = strlen(root);
    return !strncmp(dir, root, n) && (dir[n] == '\0' || dir[n] == '/');
}

/* The folders that stand beside the program or library at `binary`: ../share/moesim (an
 * installed copy), and the source tree when it runs from (a folder below) its build tree. */
static void data_path_add_beside(const char *binary) {
    char bin_dir[PATH_MAX], share[PATH_MAX], canon[PATH_MAX];
    moesim_path_dirname(binary, bin_dir, sizeof bin_dir);
    snprintf(share, sizeof share, "%s/../share/moesim", bin_dir);
    if (is_dir(share) && realpath(share, canon)) dir_list_add(&data_path, canon, strlen(canon));
    char build[PATH_MAX];
    if (realpath(MOESIM_BINARY_DIR, build) && realpath(bin_dir, canon) && is_below(canon, build))
        dir_list_add(&data_path, MOESIM_SOURCE_DIR, strlen(MOESIM_SOURCE_DIR));
}

static void data_path_compose(void) {
    const char *env = getenv("MOESIM_DATA_PATH");
    for (const char *p = env ? env : ""; *p;) {
        size_t len = strcspn(p, ":");
        dir_list_add(&data_path, p, len);
        p += len + (p[len] == ':');
    }
    char exe[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        data_path_add_beside(exe);
    }
    /* this code in libmoesim, linked by `moesim` or loaded by another program (Python): beside
     * the library too */
    Dl_info info;
    char lib[PATH_MAX];
    if (dladdr((void *)data_path_compose, &info) && info.dli_fname &&
        realpath(info.dli_fname, lib) && strcmp(lib, exe))
        data_path_add_beside(lib);
}

size_t moesim_data_path_count(void) {
    pthread_once(&data_path_once, data_path_compose);
    return data_path.n;
}

const char *moesim_data_path_at(size_t i) {
    MOESIM_ASSERT(i < moesim_data_path_count());
    return data_path.dirs[i];
}

void moesim_data_path_describe(const char *sub, char *out, size_t out_len) {
    size_t n = moesim_data_path_count(), used = 0;
    out[0] = '\0';
    if (!n) {
        snprintf(out, out_len, "no folder: set MOESIM_DATA_PATH or --data-dir");
        return;
    }
    for (size_t i = 0; i < n && used < out_len; i++)
        used += (size_t)snprintf(out + used, out_len - used, "%s%s%s%s", i ? ", " : "",
                                 moesim_data_path_at(i), *sub ? "/" : "", sub);
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The first folder's DIR/rel that is a file, into out; false when none is. */
static bool data_search(const char *rel, char *out, size_t out_len) {
    for (size_t i = 0; i < moesim_data_path_count(); i++) {
        int n = snprintf(out, out_len, "%s/%s", moesim_data_path_at(i), rel);
        if (n > 0 && (size_t)n < out_len && is_file(out)) return true;
    }
    return false;
}

moesim_status moesim_data_find(const char *rel, const char *what, char *out, size_t out_len,
                               moesim_error *err) {
    if (data_search(rel, out, out_len)) return MOESIM_OK;
    char where[2048];
    moesim_data_path_describe("", where, sizeof where);
    return moesim_fail(err, MOESIM_EINPUT,
                       "%s %s not found (looked in %s; add a folder with --data-dir or "
                       "MOESIM_DATA_PATH)",
                       what, rel, where);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds the stems of DIR's *.ini files to names (each once). */
static void names_collect(const char *dir, dir_list *names) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) && names->n < 512) {
        size_t len = strlen(de->d_name);
        if (len > 4 && !strcmp(de->d_name + len - 4, ".ini"))
            dir_list_add(names, de->d_name, len - 4);
    }
    closedir(d);
}

void moesim_config_names(const char *kind, char *out, size_t out_len) {
    dir_list names = {0};
    for (size_t i = 0; i < moesim_data_path_count(); i++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/configs/%s", moesim_data_path_at(i), kind);
        names_collect(dir, &names);
    }
    qsort(names.dirs, names.n, sizeof *names.dirs, cmp_str);
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < names.n; i++) {
        if (used < out_len)
            used +=
                (size_t)snprintf(out + used, out_len - used, "%s%s", i ? ", " : "", names.dirs[i]);
        free(names.dirs[i]);
    }
    free(names.dirs);
}

size_t moesim_config_name_fault(const char *name) {
    for (const char *c = name; *c; c++)
        if (*c <= ' ' || *c > '~' || *c == '/') return (size_t)(c - name) + 1;
    return 0;
}

moesim_status moesim_config_path(const char *kind, const char *name, char *out, size_t out_len,
                                 moesim_error *err) {
    size_t len = strlen(name);
    if (strchr(name, '/') || (len > 4 && !strcmp(name + len - 4, ".ini"))) {
        int n = snprintf(out, out_len, "%s", name);
        if (n < 0 || (size_t)n >= out_len)
            return moesim_fail(err, MOESIM_EINPUT, "%s: path too long", name);
        if (is_file(out)) return MOESIM_OK;
        return moesim_fail(err, MOESIM_EIO, "%s: no such config file", name);
    }
    char rel[PATH_MAX];
    snprintf(rel, sizeof rel, "configs/%s/%s.ini", kind, name);
    if (data_search(rel, out, out_len)) return MOESIM_OK;
    char known[1024], sub[64], where[2048];
    moesim_config_names(kind, known, sizeof known);
    snprintf(sub, sizeof sub, "configs/%s", kind);
    moesim_data_path_describe(sub, where, sizeof where);
    const char *noun = !strcmp(kind, "models")     ? "model"
                       : !strcmp(kind, "policies") ? "policy preset"
                                                   : kind;
    return moesim_fail(err, MOESIM_EINPUT,
                       "unknown %s name '%s' (looked in %s; known: %s; give a path, or add a "
                       "folder holding configs/%s/%s.ini with --data-dir or MOESIM_DATA_PATH)",
                       noun, name, where, known[0] ? known : "none", kind, name);
}

void moesim_path_dirname(const char *path, char *out, size_t out_len) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; /* trailing slashes */
    while (n > 0 && path[n - 1] != '/') n--; /* the last component */
    if (n == 0) {
        snprintf(out, out_len, ".");
        return;
    }
    while (n > 1 && path[n - 1] == '/') n--; /* slashes before it */
    snprintf(out, out_len, "%.*s", (int)n, path);
}

void moesim_path_join(const char *base, const char *rel, char *out, size_t out_len) {
    if (rel[0] == '/' || !strcmp(base, "."))
        snprintf(out, out_len, "%s", rel);
    else
        snprintf(out, out_len, "%s%s%s", base, base[strlen(base) - 1] == '/' ? "" : "/", rel);
}

bool moesim_same_file(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

moesim_status moesim_open_input(const char *path, const char *mode, const char *what, FILE **out,
                                moesim_error *err) {
    *out = fopen(path, mode);
    if (!*out)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot open %s: %s", path, what, strerror(errno));
    struct stat sb;
    if (fstat(fileno(*out), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(*out);
        *out = NULL;
        return moesim_fail(err, MOESIM_EINPUT, "%s: a directory (expected a %s file)", path, what);
    }
    return MOESIM_OK;
}

static moesim_status make_folder(const char *dir, char *made, size_t made_len, moesim_error *err) {
    if (mkdir(dir, 0777) == 0) {
        if (made && !made[0]) snprintf(made, made_len, "%s", dir);
        return MOESIM_OK;
    }
    if (errno == EEXIST) return MOESIM_OK;
    return moesim_fail(err, MOESIM_EIO, "%s: cannot create folder: %s", dir, strerror(errno));
}

moesim_status moesim_path_make_parents_noted(const char *path, char *made, size_t made_len,
                                             moesim_error *err) {
    if (made) made[0] = '\0';
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return moesim_fail(err, MOESIM_EINPUT, "%s: path too long", path);
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf) return MOESIM_OK;
    *slash = '\0';
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        moesim_status st = make_folder(buf, made, made_len, err);
        if (st) return st;
        *p = '/';
    }
    return make_folder(buf, made, made_len, err);
}

moesim_status moesim_path_make_parents(const char *path, moesim_error *err) {
    return moesim_path_make_parents_noted(path, NULL, 0, err);
}

void moesim_path_remove_made(const char *path, const char *made) {
    size_t n = strlen(made);
    if (!n || strncmp(path, made, n) != 0 || path[n] != '/') return;
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    /* from the file's folder up to `made`, each removed only if empty */
    for (char *slash; (slash = strrchr(buf, '/')) && (size_t)(slash - buf) >= n;) {
        *slash = '\0';
        if (rmdir(buf) != 0) return;
    }
}
