/* Token-id input files for `moesim record` and `moesim eval` (format in engine.h). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/paths.h"
#include "engine/engine.h"

#define MAX_LINE_BYTES (1u << 24)

typedef struct id_buf {
    int32_t *ids;
    size_t n, cap;
} id_buf;

static void push(id_buf *b, int32_t v) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 1024;
        b->ids = moesim_xrealloc(b->ids, b->cap * sizeof *b->ids);
    }
    b->ids[b->n++] = v;
}

static moesim_status check_id(long long v, uint32_t vocab, const char *path, uint32_t line,
                              moesim_error *err) {
    if (v < 0 || v >= vocab)
        return moesim_fail(err, MOESIM_EINPUT, "%s:%u: token id %lld outside the vocabulary "
                           "[0, %u)", path, line, v, vocab);
    return MOESIM_OK;
}

static moesim_status parse_jsonl(const char *text, uint32_t vocab, const char *path,
                                 uint32_t line, id_buf *b, moesim_error *err) {
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    if (!j) return moesim_fail(err, MOESIM_EINPUT, "%s:%u: invalid JSON: %s", path, line,
                               jerr.text);
    const json_t *ids = json_object_get(j, "prompt_ids");
    moesim_status st = MOESIM_OK;
    if (!json_is_array(ids) || !json_array_size(ids)) {
        st = moesim_fail(err, MOESIM_EINPUT,
                         "%s:%u: prompt_ids: expected a non-empty array of token ids", path, line);
    } else {
        for (size_t i = 0; i < json_array_size(ids) && !st; i++) {
            const json_t *v = json_array_get(ids, i);
            if (!json_is_integer(v))
                st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: prompt_ids[%zu]: expected an integer",
                                 path, line, i);
            else if (!(st = check_id(json_integer_value(v), vocab, path, line, err)))
                push(b, (int32_t)json_integer_value(v));
        }
    }
    json_decref(j);
    return st;
}

static moesim_status parse_plain(char *text, uint32_t vocab, const char *path, uint32_t line,
                                 id_buf *b, moesim_error *err) {
    char *save;
    for (char *tok = strtok_r(text, " \t\r\n,", &save); tok; tok = strtok_r(NULL, " \t\r\n,", &save)) {
        char *end;
        errno = 0;
        long long v = strtoll(tok, &end, 10);
        if (*end || errno)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s:%u: '%.20s' is not a token id (expected integers separated by "
                               "spaces, or JSONL with prompt_ids)", path, line, tok);
        moesim_status st = check_id(v, vocab, path, line, err);
        if (st) return st;
        push(b, (int32_t)v);
    }
    return MOESIM_OK;
}

moesim_status engine_prompts_load(const char *path, uint32_t vocab, engine_prompts *out,
                                  moesim_error *err) {
    memset(out, 0, sizeof *out);
    FILE *fp;
    moesim_status opened = moesim_open_input(path, "r", "prompts", &fp, err);
    if (opened) return opened;
    id_buf b = {0};
    size_t *starts = NULL, *lens = NULL, n = 0, cap = 0;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    uint32_t lineno = 0;
    moesim_status st = MOESIM_OK;
    while (!st && (got = getline(&line, &line_cap, fp)) >= 0) {
        lineno++;
        if ((size_t)got > MAX_LINE_BYTES) {
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: line longer than %u bytes", path, lineno,
                             MAX_LINE_BYTES);
            break;
        }
        if (memchr(line, '\0', (size_t)got)) { /* what follows it would be dropped unread */
            st = moesim_fail(err, MOESIM_EINPUT, "%s:%u: a NUL byte (expected text)", path, lineno);
            break;
        }
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (!*p || *p == '\n' || *p == '\r' || *p == '#') continue;
        size_t before = b.n;
        st = *p == '{' ? parse_jsonl(p, vocab, path, lineno, &b, err)
                       : parse_plain(p, vocab, path, lineno, &b, err);
        if (st) break;
        if (b.n == before) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            starts = moesim_xrealloc(starts, cap * sizeof *starts);
            lens = moesim_xrealloc(lens, cap * sizeof *lens);
        }
        starts[n] = before;
        lens[n++] = b.n - before;
    }
    free(line);
    fclose(fp);
    if (!st && !n) st = moesim_fail(err, MOESIM_EINPUT, "%s: no prompts", path);
    if (!st) {
        out->n = (uint32_t)n;
        out->ids = b.ids;
        out->reqs = moesim_xcalloc(n, sizeof *out->reqs);
        for (size_t i = 0; i < n; i++)
            out->reqs[i] = (engine_request){b.ids + starts[i], (uint32_t)lens[i]};
    } else {
        free(b.ids);
    }
    free(starts);
    free(lens);
    return st;
}

void engine_prompts_free(engine_prompts *p) {
    free(p->reqs);
    free(p->ids);
    memset(p, 0, sizeof *p);
}
