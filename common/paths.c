/* Config lookup by name; see paths.h. */
#include "common/paths.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *moesim_config_dir(void) {
    const char *env = getenv("MOESIM_CONFIG_DIR");
    return env && *env ? env : MOESIM_SOURCE_DIR "/configs";
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void moesim_config_names(const char *kind, char *out, size_t out_len) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", moesim_config_dir(), kind);
    out[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return;
    char *names[256];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 256) {
        size_t len = strlen(de->d_name);
        if (len > 4 && !strcmp(de->d_name + len - 4, ".ini")) {
            names[n] = strdup(de->d_name);
            if (names[n]) names[n++][len - 4] = '\0';
        }
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        if (used < out_len)
            used += (size_t)snprintf(out + used, out_len - used, "%s%s", i ? ", " : "", names[i]);
        free(names[i]);
    }
}

moesim_status moesim_config_path(const char *kind, const char *name, char *out, size_t out_len,
                                 moesim_error *err) {
    size_t len = strlen(name);
    bool is_path = strchr(name, '/') || (len > 4 && !strcmp(name + len - 4, ".ini"));
    int n = is_path ? snprintf(out, out_len, "%s", name)
                    : snprintf(out, out_len, "%s/%s/%s.ini", moesim_config_dir(), kind, name);
    if (n < 0 || (size_t)n >= out_len)
        return moesim_fail(err, MOESIM_EINPUT, "%s: name too long", name);
    struct stat sb;
    if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode)) return MOESIM_OK;
    if (is_path) return moesim_fail(err, MOESIM_EIO, "%s: no such config file", name);
    char known[1024];
    moesim_config_names(kind, known, sizeof known);
    return moesim_fail(err, MOESIM_EINPUT, "unknown %s name '%s' (known: %s)", kind, name,
                       known[0] ? known : "none");
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
