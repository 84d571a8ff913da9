/* Running a sweep: reading (and repairing) a results file, the shard's to-do list, worker
 * threads, and appending rows (sweep.h).
 *
 * Why a killed sweep resumes with nothing lost or doubled:
 *   - one writer: workers hand finished rows to a mutex-held append; each row is one write()
 *     of the whole line (retried on a short write) on an O_APPEND descriptor, then fdatasync,
 *     before the row counts as done;
 *   - a row holds exactly one '\n', its last byte; so whatever a kill (or power loss after the
 *     last fdatasync) leaves is: complete rows, then at most one prefix of a row without '\n';
 *   - on resume the file is read, the torn prefix (if any) truncated away, and every complete
 *     row's hash marked done; the shard's other configurations run. A row is written only after
 *     its configuration ran, so a configuration is either complete in the file or absent.
 * Rows land in completion order (the only difference between a resumed and an uninterrupted
 * sweep, and between -j 1 and -j N). */
#include "sweep/sweep.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/atomic_file.h"
#include "common/check.h"
#include "common/config.h"
#include "common/progress.h"
#include "common/version.h"
#include "sweep/sweep_internal.h"

/* ---- rows and headers ------------------------------------------------------------------- */

char *sweep_header_line(const sweep_experiment *e, const sweep_evaluator *ev) {
    size_t cap = 256, len = 0;
    char *s = moesim_xmalloc(cap);
    s[0] = '\0';
#define APPEND(str)                                                                                \
    do {                                                                                           \
        const char *a_ = (str);                                                                    \
        size_t n_ = strlen(a_);                                                                    \
        while (len + n_ + 2 > cap) s = moesim_xrealloc(s, cap *= 2);                               \
        memcpy(s + len, a_, n_ + 1);                                                               \
        len += n_;                                                                                 \
    } while (0)
    APPEND(SWEEP_HASH_COLUMN ",seed,status,code,moesim");
    for (size_t c = 0; c < sweep_experiment_n_columns(e); c++) {
        APPEND(",");
        APPEND(sweep_experiment_column(e, c));
    }
    for (size_t m = 0; ev && m < ev->n_metrics; m++) {
        APPEND(",");
        APPEND(ev->metric_names[m]);
    }
    if (ev && ev->n_metrics && ev->note_name) {
        APPEND(",");
        APPEND(ev->note_name);
    }
    APPEND("\n");
#undef APPEND
    return s;
}

/* A run's error as a CSV field: separators and quotes become ';' and '\''. */
static void sanitize_status(char *s) {
    for (; *s; s++) {
        if (*s == ',')
            *s = ';';
        else if (*s == '"')
            *s = '\'';
        else if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = ' ';
    }
}

/* One row, '\n'-terminated. Caller frees. */
static char *format_row(const sweep_experiment *e, const sweep_evaluator *ev, const sweep_point *p,
                        const char *status, const double *metrics, const char *note) {
    size_t cap = 512, len = 0;
    char *s = moesim_xmalloc(cap);
#define APPENDF(...)                                                                               \
    do {                                                                                           \
        for (;;) {                                                                                 \
            int n_ = snprintf(s + len, cap - len, __VA_ARGS__);                                    \
            MOESIM_ASSERT(n_ >= 0);                                                                \
            if ((size_t)n_ < cap - len) {                                                          \
                len += (size_t)n_;                                                                 \
                break;                                                                             \
            }                                                                                      \
            s = moesim_xrealloc(s, cap *= 2);                                                      \
        }                                                                                          \
    } while (0)
    APPENDF("%016" PRIx64 ",%" PRIu64 ",%s,%s,%s", p->hash, p->seed, status, p->code,
            moesim_version_describe());
    for (size_t c = 0; c < sweep_experiment_n_columns(e); c++)
        APPENDF(",%s", p->values[c] ? p->values[c] : "");
    for (size_t m = 0; m < ev->n_metrics; m++) {
        if (isfinite(metrics[m]))
            APPENDF(",%.17g", metrics[m]);
        else
            APPENDF(",%s", isnan(metrics[m]) ? "NaN" : metrics[m] > 0 ? "Inf" : "-Inf");
    }
    if (ev->note_name) APPENDF(",%s", note);
    APPENDF("\n");
#undef APPENDF
    return s;
}

static size_t count_fields(const char *line, size_t len) {
    size_t n = 1;
    for (size_t i = 0; i < len; i++) n += line[i] == ',';
    return n;
}

bool sweep_parse_hash(const char *s, size_t len, uint64_t *out) {
    if (len != 16) return false;
    uint64_t h = 0;
    for (size_t i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        h = h << 4 | (uint64_t)d;
    }
    *out = h;
    return true;
}

static moesim_status read_whole(const char *path, char **buf, size_t *len, moesim_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return moesim_fail(err, MOESIM_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = moesim_xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) b = moesim_xrealloc(b, cap *= 2);
        size_t got = fread(b + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0) break;
    }
    bool bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(b);
        return moesim_fail(err, MOESIM_EIO, "%s: cannot read", path);
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return MOESIM_OK;
}

moesim_status sweep_results_read(const char *path, const char *want_header, bool header_prefix,
                                 sweep_results *out, moesim_error *err) {
    memset(out, 0, sizeof *out);
    moesim_status st = read_whole(path, &out->text, &out->len, err);
    if (st) return st;
    const char *t = out->text;
    const char *nl = memchr(t, '\n', out->len);
    if (!nl) {
        sweep_results_free(out);
        return moesim_fail(err, MOESIM_EINPUT, "%s: no header line (not a sweep results file)",
                           path);
    }
    size_t hlen = (size_t)(nl - t) + 1;
    out->header_len = hlen;
    if (want_header) {
        size_t wl = strlen(want_header);
        bool match = header_prefix ? hlen >= wl && !memcmp(t, want_header, wl - 1) &&
                                         (t[wl - 1] == ',' || t[wl - 1] == '\n')
                                   : hlen == wl && !memcmp(t, want_header, wl);
        if (!match) {
            sweep_results_free(out);
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s: its columns differ from this experiment's (another experiment "
                               "or an edited one): give another -o, or move the file away",
                               path);
        }
    }
    size_t n_fields = count_fields(t, hlen - 1);
    out->valid_len = hlen;
    size_t line_no = 1;
    for (size_t pos = hlen; pos < out->len;) {
        line_no++;
        const char *line = t + pos;
        const char *end = memchr(line, '\n', out->len - pos);
        if (!end) { /* torn last row: a kill mid-append */
            out->torn = true;
            break;
        }
        size_t len = (size_t)(end - line);
        uint64_t h;
        if (count_fields(line, len) != n_fields ||
            !sweep_parse_hash(line, len < 16 ? len : 16, &h) || (len > 16 && line[16] != ',')) {
            sweep_results_free(out);
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s:%zu: malformed row (expected %zu comma-separated fields "
                               "starting with a 16-digit hex hash)",
                               path, line_no, n_fields);
        }
        out->rows = moesim_xrealloc(out->rows, (out->n_rows + 1) * sizeof *out->rows);
        out->rows[out->n_rows++] = (sweep_row){h, pos, len + 1, line_no};
        pos += len + 1;
        out->valid_len = pos;
    }
    return MOESIM_OK;
}

void sweep_results_free(sweep_results *r) {
    free(r->text);
    free(r->rows);
    memset(r, 0, sizeof *r);
}

/* ---- planning ---------------------------------------------------------------------------- */

/* The configuration a stale row (made by another code version: its 4th field) belongs to, or
 * NULL: its hash recomputed with that version for each configuration. */
static const sweep_point *find_stale(const sweep_experiment *e, const char *line, size_t len,
                                     uint64_t hash) {
    const char *f = line;
    for (int comma = 0; comma < 3 && f; comma++) {
        f = memchr(f, ',', len - (size_t)(f - line));
        if (f) f++;
    }
    if (!f) return NULL;
    const char *end = memchr(f, ',', len - (size_t)(f - line));
    char code[64];
    if (!end || (size_t)(end - f) >= sizeof code) return NULL;
    snprintf(code, sizeof code, "%.*s", (int)(end - f), f);
    for (size_t i = 0; i < sweep_experiment_count(e); i++) {
        const sweep_point *p = sweep_experiment_point(e, i);
        if (strcmp(code, p->code) && sweep_point_hash_with_code(p, code) == hash) return p;
    }
    return NULL;
}

/* A metric cell as format_row writes it: a number, NaN, Inf or -Inf. */
static bool metric_cell_ok(const char *f, size_t n) {
    char cell[64];
    if (n == 0 || n >= sizeof cell) return false;
    memcpy(cell, f, n);
    cell[n] = '\0';
    double v;
    return !strcmp(cell, "NaN") || !strcmp(cell, "Inf") || !strcmp(cell, "-Inf") ||
           config_parse_f64(cell, &v);
}

/* A row whose hash names configuration p holds what format_row wrote for p: its seed, code and
 * every column, a status, and a number in each metric cell (when the evaluator names them). A
 * row edited by hand would otherwise count as done and stand in the results as if run. */
static moesim_status check_row(const sweep_experiment *e, const sweep_evaluator *ev,
                               const sweep_point *p, const char *line, size_t len, const char *path,
                               size_t line_no, moesim_error *err) {
    size_t n_cols = sweep_experiment_n_columns(e);
    size_t fields = 5 + n_cols + ev->n_metrics;
    const char *f = line;
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, p->seed);
    for (size_t i = 0; i < fields; i++) {
        const char *comma = memchr(f, ',', len - (size_t)(f - line));
        size_t n = comma ? (size_t)(comma - f) : len - (size_t)(f - line);
        const char *want = i == 1 ? seed : i == 3 ? p->code : NULL;
        const char *what = i == 1 ? "seed" : i == 2 ? "status" : i == 3 ? "code" : NULL;
        if (i >= 5 && i < 5 + n_cols) {
            want = p->values[i - 5] ? p->values[i - 5] : "";
            what = sweep_experiment_column(e, i - 5);
        }
        bool bad = want              ? (strlen(want) != n || memcmp(f, want, n) != 0)
                   : i == 2          ? n == 0 || memchr(f, '\0', n) != NULL
                   : i >= 5 + n_cols ? !metric_cell_ok(f, n)
                                     : false;
        if (bad)
            return moesim_fail(err, MOESIM_EINPUT,
                               "%s:%zu: configuration %016" PRIx64 ": %s '%.*s' is not what a run "
                               "wrote (edited? delete the row to run it again)",
                               path, line_no, p->hash,
                               what ? what : ev->metric_names[i - 5 - n_cols],
                               (int)(n > 60 ? 60 : n), f);
        if (!comma) break;
        f = comma + 1;
    }
    return MOESIM_OK;
}

static moesim_status load_done(const sweep_experiment *e, const sweep_evaluator *ev,
                               const char *path, bool reuse_stale, bool *done, sweep_results *res,
                               size_t *foreign, size_t *stale, moesim_error *err) {
    *foreign = *stale = 0;
    memset(res, 0, sizeof *res);
    struct stat sb;
    if (stat(path, &sb) != 0 || sb.st_size == 0) return MOESIM_OK; /* nothing done yet */
    char *header = sweep_header_line(e, ev);
    /* an evaluator without metric names (a dry run) checks the setting columns only */
    moesim_status st = sweep_results_read(path, header, ev->n_metrics == 0, res, err);
    free(header);
    if (st) return st;
    size_t n = sweep_experiment_count(e);
    size_t *line_of = moesim_xcalloc(n + 1, sizeof *line_of); /* [n] row line of each point */
    for (size_t i = 0; i < res->n_rows; i++) {
        const sweep_point *p = sweep_experiment_find(e, res->rows[i].hash);
        if (!p) {
            const sweep_point *q = find_stale(e, res->text + res->rows[i].offset,
                                              res->rows[i].len - 1, res->rows[i].hash);
            if (q)
                (*stale)++; /* an older simulator or policy made it: rerun unless kept */
            else
                (*foreign)++; /* a row of an edited experiment: kept, counted, not ours */
            if (q && reuse_stale) done[q->index] = true;
            continue;
        }
        if (line_of[p->index]) { /* a resumed file never repeats a hash */
            moesim_status s2 = moesim_fail(
                err, MOESIM_EINPUT, "%s:%zu: configuration %016" PRIx64 " already at line %zu",
                path, res->rows[i].line, res->rows[i].hash, line_of[p->index]);
            free(line_of);
            sweep_results_free(res);
            return s2;
        }
        moesim_status s2 = check_row(e, ev, p, res->text + res->rows[i].offset,
                                     res->rows[i].len - 1, path, res->rows[i].line, err);
        if (s2) {
            free(line_of);
            sweep_results_free(res);
            return s2;
        }
        line_of[p->index] = res->rows[i].line;
        done[p->index] = true;
    }
    free(line_of);
    return MOESIM_OK;
}

static moesim_status check_shard(const sweep_options *opt, moesim_error *err) {
    if (opt->shard_count < 1 || opt->shard_index >= opt->shard_count)
        return moesim_fail(err, MOESIM_EINPUT,
                           "--shard %" PRIu32 "/%" PRIu32 ": expected i/n with 0 <= i < n",
                           opt->shard_index, opt->shard_count);
    return MOESIM_OK;
}

moesim_status sweep_plan(const sweep_experiment *e, const sweep_evaluator *ev,
                         const sweep_options *opt, size_t **todo, size_t *n_todo,
                         size_t *n_in_shard, moesim_error *err) {
    *todo = NULL;
    *n_todo = *n_in_shard = 0;
    moesim_status st = check_shard(opt, err);
    if (st) return st;
    size_t n = sweep_experiment_count(e);
    bool *done = moesim_xcalloc(n + 1, sizeof *done);
    sweep_results res;
    size_t foreign, stale;
    st = load_done(e, ev, opt->csv_path, opt->reuse_stale, done, &res, &foreign, &stale, err);
    sweep_results_free(&res);
    if (st) {
        free(done);
        return st;
    }
    size_t *list = moesim_xcalloc(n + 1, sizeof *list);
    for (size_t i = 0; i < n; i++) {
        if (i % opt->shard_count != opt->shard_index) continue;
        (*n_in_shard)++;
        if (!done[i]) list[(*n_todo)++] = i;
    }
    free(done);
    *todo = list;
    return MOESIM_OK;
}

/* ---- running ----------------------------------------------------------------------------- */

typedef struct run_shared {
    const sweep_experiment *e;
    const sweep_evaluator *ev;
    const size_t *todo;
    size_t n_todo;
    atomic_size_t next;
    atomic_bool stop;
    int fd;
    const char *path;
    pthread_mutex_t lock; /* guards everything below */
    size_t written, failed;
    char first_failure[MOESIM_ERROR_MAX];
    progress bar;
    moesim_error io_err;
    bool io_failed;
} run_shared;

/* Appends one row: one write() (continued on a short write) then fdatasync. Under the lock. */
static bool append_row(run_shared *sh, const char *row) {
    size_t len = strlen(row), off = 0;
    while (off < len) {
        ssize_t w = write(sh->fd, row + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            moesim_fail(&sh->io_err, MOESIM_EIO, "%s: cannot append a row: %s", sh->path,
                        strerror(errno));
            return false;
        }
        off += (size_t)w;
    }
    if (fdatasync(sh->fd) != 0) {
        moesim_fail(&sh->io_err, MOESIM_EIO, "%s: cannot sync: %s", sh->path, strerror(errno));
        return false;
    }
    return true;
}

static void *worker_main(void *arg) {
    run_shared *sh = arg;
    double *metrics = moesim_xcalloc(sh->ev->n_metrics + 1, sizeof *metrics);
    char note[1024];
    while (!atomic_load(&sh->stop)) {
        size_t k = atomic_fetch_add(&sh->next, 1);
        if (k >= sh->n_todo) break;
        const sweep_point *p = sweep_experiment_point(sh->e, sh->todo[k]);
        moesim_error err = {0};
        for (size_t m = 0; m < sh->ev->n_metrics; m++) metrics[m] = NAN;
        note[0] = '\0';
        moesim_status st = sh->ev->run(sh->ev->ctx, sh->e, p, metrics, note, sizeof note, &err);
        sanitize_status(note);
        char status[MOESIM_ERROR_MAX + 8];
        if (st) {
            for (size_t m = 0; m < sh->ev->n_metrics; m++) metrics[m] = NAN;
            note[0] = '\0';
            snprintf(status, sizeof status, "error: %s", err.msg[0] ? err.msg : "failed");
            sanitize_status(status);
        } else {
            snprintf(status, sizeof status, "ok");
        }
        char *row = format_row(sh->e, sh->ev, p, status, metrics, note);
        pthread_mutex_lock(&sh->lock);
        if (!sh->io_failed) {
            if (append_row(sh, row)) {
                sh->written++;
                if (st && sh->failed++ == 0)
                    snprintf(sh->first_failure, sizeof sh->first_failure, "configuration %zu: %s",
                             p->index, err.msg);
                progress_update(&sh->bar, sh->written);
            } else {
                sh->io_failed = true;
                atomic_store(&sh->stop, true);
            }
        }
        pthread_mutex_unlock(&sh->lock);
        free(row);
    }
    free(metrics);
    return NULL;
}

/* Opens the results file for appending, locked for the sweep (two sweeps appending to one file
 * would repeat its rows), created holding only its header when missing or empty. */
static moesim_status open_results(const char *path, const char *header, int *fd_out,
                                  moesim_error *err) {
    *fd_out = -1;
    moesim_status st = atomic_file_check_writable(path, err); /* a folder or device refused */
    if (st) return st;
    int fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot open for appending: %s", path,
                           strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        return e == EWOULDBLOCK
                   ? moesim_fail(err, MOESIM_EINPUT,
                                 "%s: in use by another sweep (expected one sweep at a time per "
                                 "results file; shards write their own files)",
                                 path)
                   : moesim_fail(err, MOESIM_EIO, "%s: cannot lock: %s", path, strerror(e));
    }
    struct stat sb;
    size_t len = strlen(header);
    if (fstat(fd, &sb) != 0 ||
        (sb.st_size == 0 && (write(fd, header, len) != (ssize_t)len || fsync(fd) != 0))) {
        int e = errno;
        close(fd);
        return moesim_fail(err, MOESIM_EIO, "%s: cannot write its header: %s", path, strerror(e));
    }
    *fd_out = fd;
    return MOESIM_OK;
}

moesim_status sweep_run(const sweep_experiment *e, const sweep_evaluator *ev,
                        const sweep_options *opt, sweep_summary *out, moesim_error *err) {
    memset(out, 0, sizeof *out);
    double t0 = moesim_monotonic_s();
    moesim_status st = check_shard(opt, err);
    if (st) return st;
    if (opt->jobs < 1) return moesim_fail(err, MOESIM_EINPUT, "-j %u: expected >= 1", opt->jobs);
    size_t n = sweep_experiment_count(e);
    char *header = sweep_header_line(e, ev);
    int fd;
    st = open_results(opt->csv_path, header, &fd, err);
    free(header);
    if (st) return st;
    bool *done = moesim_xcalloc(n + 1, sizeof *done);
    sweep_results res;
    st = load_done(e, ev, opt->csv_path, opt->reuse_stale, done, &res, &out->foreign, &out->stale,
                   err);
    if (!st && res.valid_len < res.len) {
        if (ftruncate(fd, (off_t)res.valid_len) != 0)
            st = moesim_fail(err, MOESIM_EIO, "%s: cannot remove the torn last row: %s",
                             opt->csv_path, strerror(errno));
        out->truncated_tail = true;
    }
    sweep_results_free(&res);
    if (!st) {
        char side[PATH_MAX];
        sweep_sidecar_path(opt->csv_path, side, sizeof side);
        st = sweep_experiment_write_resolved(e, opt->source, side, err);
    }
    if (st) {
        close(fd);
        free(done);
        return st;
    }
    size_t *todo = moesim_xcalloc(n + 1, sizeof *todo);
    size_t n_todo = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % opt->shard_count != opt->shard_index) continue;
        out->in_shard++;
        if (done[i])
            out->already_done++;
        else
            todo[n_todo++] = i;
    }
    free(done);

    run_shared sh = {.e = e, .ev = ev, .todo = todo, .n_todo = n_todo, .path = opt->csv_path};
    atomic_init(&sh.next, 0);
    atomic_init(&sh.stop, false);
    sh.fd = fd;
    pthread_mutex_init(&sh.lock, NULL);
    progress_begin(&sh.bar, "sweep", n_todo, opt->progress);
    unsigned jobs = opt->jobs;
    if (jobs > n_todo) jobs = n_todo ? (unsigned)n_todo : 1;
    pthread_t *threads = moesim_xcalloc(jobs, sizeof *threads);
    unsigned started = 0;
    for (; started < jobs && n_todo; started++)
        if (pthread_create(&threads[started], NULL, worker_main, &sh) != 0) break;
    if (started == 0 && n_todo) worker_main(&sh); /* no thread could start: run here */
    for (unsigned i = 0; i < started; i++) pthread_join(threads[i], NULL);
    progress_end(&sh.bar);
    free(threads);
    pthread_mutex_destroy(&sh.lock);
    int close_rc = close(sh.fd);
    free(todo);
    out->ran = sh.written;
    out->failed = sh.failed;
    snprintf(out->first_failure, sizeof out->first_failure, "%s", sh.first_failure);
    out->elapsed_s = moesim_monotonic_s() - t0;
    if (sh.io_failed) {
        *err = sh.io_err;
        return err->status;
    }
    if (close_rc != 0)
        return moesim_fail(err, MOESIM_EIO, "%s: cannot close: %s", opt->csv_path, strerror(errno));
    return MOESIM_OK;
}
