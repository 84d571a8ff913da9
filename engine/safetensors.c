/* safetensors parsing and mapping; the checks are listed in safetensors.h. */
#include "engine/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"

struct st_file {
    char path[1024];
    void *map;
    size_t map_bytes;
    st_tensor *tensors; /* [n] sorted by name */
    size_t n;
};

static const struct {
    const char *name;
    st_dtype dtype;
    size_t size;
} dtypes[] = {{"F32", ST_F32, 4}, {"F16", ST_F16, 2}, {"BF16", ST_BF16, 2}};

const char *st_dtype_name(st_dtype d) { return dtypes[d].name; }
size_t st_dtype_size(st_dtype d) { return dtypes[d].size; }

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}
static int cmp_offset(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->offset_bytes < y->offset_bytes ? -1 : x->offset_bytes > y->offset_bytes;
}

/* A JSON integer in [0, 2^53] (larger values cannot come from a JSON number exactly). */
static int get_uint(const json_t *j, uint64_t *out) {
    if (!json_is_integer(j)) return 0;
    json_int_t v = json_integer_value(j);
    if (v < 0) return 0;
    *out = (uint64_t)v;
    return 1;
}

static moesim_status parse_entry(const char *what, const char *name, const json_t *e,
                                 uint64_t data_bytes, st_tensor *t, moesim_error *err) {
    if (strlen(name) >= SAFETENSORS_MAX_NAME)
        return moesim_fail(err, MOESIM_EINPUT, "%s: tensor name '%.40s...' longer than %d bytes",
                           what, name, SAFETENSORS_MAX_NAME - 1);
    if (!json_is_object(e))
        return moesim_fail(err, MOESIM_EINPUT, "%s: tensor '%s': expected an object", what, name);
    memset(t, 0, sizeof *t);
    strcpy(t->name, name);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)e, key, val) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return moesim_fail(err, MOESIM_EINPUT, "%s: tensor '%s': unknown key '%s'", what,
                               name, key);
    }
    const json_t *dt = json_object_get(e, "dtype");
    if (!json_is_string(dt))
        return moesim_fail(err, MOESIM_EINPUT, "%s: tensor '%s': dtype: expected a string", what,
                           name);
    size_t di = 0;
    while (di < sizeof dtypes / sizeof dtypes[0] && strcmp(dtypes[di].name, json_string_value(dt)))
        di++;
    if (di == sizeof dtypes / sizeof dtypes[0])
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: tensor '%s': dtype '%.32s' not supported (expected F32, F16 or "
                           "BF16)", what, name, json_string_value(dt));
    t->dtype = dtypes[di].dtype;

    const json_t *shape = json_object_get(e, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > SAFETENSORS_MAX_DIMS)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: tensor '%s': shape: expected an array of at most %d sizes", what,
                           name, SAFETENSORS_MAX_DIMS);
    t->n_dims = (uint32_t)json_array_size(shape);
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t s;
        if (!get_uint(json_array_get(shape, d), &s))
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: tensor '%s': shape[%u]: expected a non-negative integer", what,
                               name, d);
        if (s && n > UINT64_MAX / 8 / s)
            return moesim_fail(err, MOESIM_EINPUT, "%s: tensor '%s': shape overflows", what, name);
        t->shape[d] = s;
        n *= s;
    }
    t->n_elems = n;

    const json_t *offs = json_object_get(e, "data_offsets");
    uint64_t begin, end;
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !get_uint(json_array_get(offs, 0), &begin) || !get_uint(json_array_get(offs, 1), &end) ||
        end < begin)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: tensor '%s': data_offsets: expected [begin, end] with 0 <= begin "
                           "<= end", what, name);
    if (end > data_bytes)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: tensor '%s': data_offsets end %llu beyond the %llu data bytes "
                           "(truncated file?)", what, name, (unsigned long long)end,
                           (unsigned long long)data_bytes);
    if (end - begin != n * dtypes[di].size)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: tensor '%s': %llu data bytes, expected %llu for its shape and "
                           "dtype", what, name, (unsigned long long)(end - begin),
                           (unsigned long long)(n * dtypes[di].size));
    t->offset_bytes = begin;
    t->size_bytes = end - begin;
    return MOESIM_OK;
}

moesim_status st_parse(const uint8_t *buf, size_t len, const char *what, st_tensor **tensors,
                       size_t *n_tensors, moesim_error *err) {
    *tensors = NULL;
    *n_tensors = 0;
    if (len < 8)
        return moesim_fail(err, MOESIM_EINPUT, "%s: %zu bytes, too short for a safetensors file",
                           what, len);
    uint64_t hdr = 0;
    for (int i = 7; i >= 0; i--) hdr = hdr << 8 | buf[i];
    if (hdr > SAFETENSORS_MAX_HEADER_BYTES || hdr > len - 8)
        return moesim_fail(err, MOESIM_EINPUT,
                           "%s: header length %llu exceeds the file (%zu bytes) or the 100 MB "
                           "limit", what, (unsigned long long)hdr, len);
    if (hdr < 2 || buf[8] != '{')
        return moesim_fail(err, MOESIM_EINPUT, "%s: header: expected a JSON object", what);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hdr, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return moesim_fail(err, MOESIM_EINPUT, "%s: header: invalid JSON at byte %d: %s", what,
                           jerr.position, jerr.text);
    moesim_status st = MOESIM_OK;
    if (!json_is_object(root)) {
        st = moesim_fail(err, MOESIM_EINPUT, "%s: header: expected a JSON object", what);
        goto done;
    }
    uint64_t data_bytes = len - 8 - hdr;
    size_t cap = json_object_size(root);
    st_tensor *ts = moesim_xcalloc(cap ? cap : 1, sizeof *ts);
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(val)) {
                st = moesim_fail(err, MOESIM_EINPUT, "%s: __metadata__: expected an object", what);
                break;
            }
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    st = moesim_fail(err, MOESIM_EINPUT,
                                     "%s: __metadata__.%.64s: expected a string", what, mk);
                    break;
                }
            }
            if (st) break;
            continue;
        }
        st = parse_entry(what, key, val, data_bytes, &ts[n], err);
        if (st) break;
        ts[n].data = buf + 8 + hdr + ts[n].offset_bytes;
        n++;
    }
    if (!st && n > 1) { /* ranges must not overlap (empty tensors occupy nothing) */
        const st_tensor **by_off = moesim_xcalloc(n, sizeof *by_off);
        for (size_t i = 0; i < n; i++) by_off[i] = &ts[i];
        qsort(by_off, n, sizeof *by_off, cmp_offset);
        uint64_t reach = 0;
        const char *reach_name = NULL;
        for (size_t i = 0; i < n && !st; i++) {
            if (by_off[i]->size_bytes == 0) continue;
            if (reach_name && by_off[i]->offset_bytes < reach)
                st = moesim_fail(err, MOESIM_EINPUT, "%s: tensors '%s' and '%s' overlap", what,
                                 reach_name, by_off[i]->name);
            reach = by_off[i]->offset_bytes + by_off[i]->size_bytes;
            reach_name = by_off[i]->name;
        }
        free(by_off);
    }
    if (st) {
        free(ts);
        goto done;
    }
    qsort(ts, n, sizeof *ts, cmp_name);
    *tensors = ts;
    *n_tensors = n;
done:
    json_decref(root);
    return st;
}

moesim_status st_file_open(const char *path, st_file **out, moesim_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return moesim_fail(err, MOESIM_EIO, "%s: not a regular file", path);
    }
    st_file *f = moesim_xcalloc(1, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->map_bytes = (size_t)sb.st_size;
    if (f->map_bytes) {
        f->map = mmap(NULL, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            close(fd);
            st_file_close(f);
            return moesim_fail(err, MOESIM_EIO, "%s: cannot map: %s", path, strerror(errno));
        }
    }
    close(fd);
    moesim_status st = st_parse(f->map ? f->map : (const void *)"", f->map_bytes, path,
                                &f->tensors, &f->n, err);
    if (st) {
        st_file_close(f);
        return st;
    }
    *out = f;
    return MOESIM_OK;
}

void st_file_close(st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_bytes);
    free(f->tensors);
    free(f);
}

size_t st_file_count(const st_file *f) { return f->n; }
const st_tensor *st_file_tensor(const st_file *f, size_t i) { return &f->tensors[i]; }

const st_tensor *st_file_find(const st_file *f, const char *name) {
    st_tensor key;
    snprintf(key.name, sizeof key.name, "%s", name);
    return bsearch(&key, f->tensors, f->n, sizeof key, cmp_name);
}
