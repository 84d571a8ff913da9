/* Reading a trace without holding it whole (trace_stream, traces/trace.h), and each request's
 * tokens (trace_request_index). The file is opened and checked as trace_read does it
 * (trace_read_internal.h); rows are then read block by block. */
#include <hdf5.h>
#include <inttypes.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "traces/h5_chunks.h"
#include "traces/trace.h"
#include "traces/trace_read_internal.h"

/* ---- streaming ---------------------------------------------------------------------------
 *
 * A stream keeps the file open with every dataset checked, each request's first token and counts
 * (trace_request_index; per token only when requests interleave in the file) and a few blocks of
 * whole tokens: an LRU cache of
 * `n_slots` blocks of block_tokens tokens each. Blocks are read as hyperslabs (HDF5 inflates the
 * chunks they overlap; blocks of a few chunks keep the chunks inflated twice, at block
 * boundaries, a minority). Opening reads every block once, through trace_checker, so a stream
 * holds only values trace_read would accept; or, with the rows checked on read, opening reads
 * the tokens' datasets alone (their checks span blocks) and each block's rows are checked the
 * first time a run reads them, so that a run inflates each block once, not once more to check
 * it. */

#define STREAM_BLOCK_BYTES (4u << 20) /* a few chunks of our writer's layout */
/* HDF5's chunk cache per dataset: none. With one (2-4 MiB), reading blocks of the requests in
 * flight in turn made the process grow by ~1.4 KB per token of the trace (measured on a
 * Qwen3-30B trace of 10^5 tokens: 170 MB instead of 47), which is what the stream is for. */
#define STREAM_CHUNK_CACHE   0u
#define STREAM_DEFAULT_SLOTS 4u

/* One dataset's inflated chunks, when the dataset is laid out as our writer lays it out
 * (read_chunks' fast path, one chunk at a time): blocks then inflate with libdeflate rather than
 * through HDF5's filters. A chunk holds the rows of several blocks (one routing chunk, those of
 * five blocks of a trace with look-ahead rows), and a run reads the blocks of every request in
 * flight in turn: so up to `cap` chunks are kept (twice the blocks the stream caches). Each
 * entry counts the rows not taken from it yet: the chunk a reader moves on to replaces one whose
 * rows were all taken, else goes to a new entry, else replaces the least recently used. A chunk
 * that holds the end of one request and the start of the next, both in flight, is then kept
 * until both took their rows, and every chunk is inflated once (replacing the predecessor of the
 * chunk read instead inflated a quarter of a look-ahead trace's chunks twice at batch 4:
 * bench/README.md, "Chunks kept until their rows are taken"). */
typedef struct stream_chunk {
    hsize_t rows; /* rows per chunk; 0: read through H5Dread */
    size_t row_bytes;   /* of the file's rows */
    uint32_t distances; /* look-ahead rows chunked one distance each: D; else 1 */
    uint32_t columns;   /* look-ahead rows chunked Kc of their K' candidates each: K' / Kc; else
                           1 (part d * columns + c of row chunk j is cached as chunk
                           j * distances * columns + part) */
    size_t run_bytes;   /* look-ahead rows: the Kc values of one (layer, distance) in a chunk */
    uint32_t n, cap;     /* entries allocated; most kept */
    uint64_t *held;      /* [cap] chunk index of each entry, or UINT64_MAX */
    uint64_t *used;      /* [cap] last use (the stream's clock) */
    uint64_t *left;      /* [cap] rows of the chunk not taken since it was inflated */
    unsigned char **buf; /* [cap] [rows * row_bytes] each, allocated when first needed: the
                            chunk inflated but still shuffled; a read unshuffles the rows it
                            takes straight into the block (chunk_take_elems), one pass, no copy */
    bool filters_checked; /* trace_read_skipped_filters_check ran (before HDF5 first read it) */
} stream_chunk;

struct trace_stream {
    char *path;
    stream_chunk chunk[DS_COUNT];
    chunk_batch batch; /* one job at a time (inflated on this thread); sized for the largest */
    reader r;
    opened_trace o;
    trace *skeleton;      /* meta and counts; no arrays */
    trace_meta rows_meta; /* the blocks' geometry: the file's, less the rows skipped */
    bool skip[DS_COUNT];  /* datasets the blocks leave out (trace_stream_options) */
    /* trace_stream_lookahead_first_hits with the look-ahead rows skipped: the file's attribute,
       else counted from their ids; with the rows read and the attribute present: counted from
       them, to check it */
    trace_first_hits hits;
    uint16_t *la_ids;      /* skipped look-ahead ids of a few tokens, to count those hits */
    uint32_t la_read;      /* distances 1..la_read of the look-ahead rows are read (the blocks'
                              depth; 1 for the skipped ids counted) */
    uint32_t k_read;       /* and their first k_read candidates (the blocks' lookahead_k; all
                              K' for the skipped ids) */
    unsigned char *la_scratch; /* [a chunk] rows taken before their distances are placed */
    bool check_on_read;    /* trace_stream_options.check_rows_on_read */
    bool by_request_asked; /* trace_stream_options.blocks_by_request, requests contiguous */
    bool by_request;       /* asked, and the cache holds fewer blocks than the trace has */
    bool rows_read;        /* rows read or checked since open (trace_stream_set_cache) */
    uint8_t *rows_checked; /* [blocks at open] with check_on_read: the rows of the segment
                              that starts the block checked; NULL once every block's are */
    uint8_t *req_checked;  /* [requests] with by_request too: those of the segment that
                              starts with the request in the middle of a block */
    moesim_error failure;  /* with it: the first read or check of rows that failed */
    trace_request_index requests;
    uint64_t block_tokens;
    uint32_t n_slots;     /* segments cached */
    trace **slot;         /* [n_slots] segment traces (n_tokens = tokens of that segment) */
    uint64_t *slot_first; /* [n_slots] first token of the segment held, UINT64_MAX: none */
    uint64_t *slot_len;   /* [n_slots] its tokens (0: none) */
    uint64_t *slot_at;    /* [n_slots] last use (LRU clock) */
    uint32_t mru;         /* slot of the last lookup */
    uint64_t clock;
    uint64_t chunk_clock; /* stream_chunk.used */
    uint64_t blocks_read;
    uint64_t chunks_inflated;
};

/* Rows [first, first + n) through H5Dread; of look-ahead rows, distances 1..`distances` and
 * their first `candidates`. */
static moesim_status read_rows(reader *r, const dataset_spec *spec, hid_t d, uint64_t first,
                               uint64_t n, uint32_t distances, uint32_t candidates, void *buf) {
    hsize_t start[4] = {first, 0, 0, 0}, count[4] = {n, 0, 0, 0};
    for (int i = 1; i < spec->rank; i++) count[i] = spec->dims[i];
    if (spec->rank == 4) count[2] = distances, count[3] = candidates;
    hid_t fs = H5Dget_space(d), ms = H5Screate_simple(spec->rank, count, NULL);
    bool ok = fs >= 0 && ms >= 0 &&
              H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0 &&
              H5Dread(d, spec->mtype, ms, fs, H5P_DEFAULT, buf) >= 0;
    h5_close(&ms, H5Sclose);
    h5_close(&fs, H5Sclose);
    if (!ok)
        return trace_read_fail(
            r, spec->name, "cannot read tokens %" PRIu64 "..%" PRIu64 " (truncated or corrupt: %s)",
            first, first + n - 1, h5_reason(r->why));
    return MOESIM_OK;
}

/* The entry of c to inflate a chunk into: the least recently used one whose rows were all taken,
 * else a new one while fewer than cap are allocated, else the least recently used. NULL when out
 * of memory. */
static unsigned char **chunk_entry_for(stream_chunk *c, uint32_t *at) {
    uint32_t lru = 0, spent = UINT32_MAX;
    for (uint32_t e = 0; e < c->n; e++) {
        if (c->left[e] == 0 && (spent == UINT32_MAX || c->used[e] < c->used[spent])) spent = e;
        if (c->used[e] < c->used[lru]) lru = e;
    }
    if (spent != UINT32_MAX || c->n == c->cap) {
        *at = spent != UINT32_MAX ? spent : lru;
        return &c->buf[*at];
    }
    c->buf[c->n] = malloc(c->rows * c->row_bytes);
    if (!c->buf[c->n]) return NULL;
    *at = c->n;
    return &c->buf[c->n++];
}

/* *out: part `part` (distance part / columns, candidates from (part % columns) * Kc) of row
 * chunk j of dataset i, inflated now unless held, whose caller takes `taken` of its rows; NULL
 * when the chunk is not stored as ours after all (c->rows is then 0: HDF5 reads the dataset from
 * now on). */
static moesim_status chunk_held(trace_stream *s, int i, uint64_t j, uint32_t part, uint64_t taken,
                                const unsigned char **out) {
    *out = NULL;
    stream_chunk *c = &s->chunk[i];
    const dataset_spec *spec = &s->o.specs[i];
    const uint32_t parts = c->distances * c->columns;
    const uint64_t N = s->o.n_tokens, key = j * parts + part;
    const size_t part_bytes = c->row_bytes / parts, chunk_bytes = c->rows * part_bytes;
    uint32_t k = 0;
    while (k < c->n && c->held[k] != key) k++;
    if (k == c->n) {
        hsize_t offset[4] = {j * c->rows, 0, part / c->columns,
                             part % c->columns * (c->run_bytes / spec->size)};
        hsize_t stored = 0;
        uint32_t mask = 0;
        chunk_job *job = &s->batch.jobs[0];
        if (H5Dget_chunk_storage_size(s->o.ds[i], offset, &stored) < 0 || stored == 0 ||
            stored > s->batch.packed_cap ||
            H5Dread_chunk(s->o.ds[i], H5P_DEFAULT, offset, &mask, job->packed) < 0 || mask) {
            H5Eclear2(H5E_DEFAULT);
            c->rows = 0; /* not as our writer stores it after all: HDF5 reads it */
            return MOESIM_OK;
        }
        unsigned char **buf = chunk_entry_for(c, &k);
        if (!buf) return moesim_fail(s->r.err, MOESIM_ENOMEM, "%s: out of memory", s->r.path);
        c->held[k] = UINT64_MAX;
        c->left[k] = 0;
        uint64_t at = j * chunk_bytes, total = N * part_bytes;
        job->packed_bytes = stored;
        job->dst = *buf;
        job->chunk_bytes = chunk_bytes;
        job->elem_size = spec->size;
        job->raw_bytes = total - at < chunk_bytes ? (size_t)(total - at) : chunk_bytes;
        job->keep_shuffled = true;
        s->batch.n_jobs = 1;
        chunk_batch_run(&s->batch);
        s->chunks_inflated++;
        if (!job->ok)
            return trace_read_chunk_fail(&s->r, spec, offset[0], "deflate data do not inflate");
        c->held[k] = key;
        c->left[k] = N - j * c->rows < c->rows ? N - j * c->rows : c->rows;
    }
    c->used[k] = ++s->chunk_clock;
    c->left[k] -= taken < c->left[k] ? taken : c->left[k]; /* rows read again: spent */
    *out = c->buf[k];
    return MOESIM_OK;
}

/* Rows [first, first + n) of dataset `i` into dst: from its chunks when they are ours (kept as
 * stream_chunk says), else through H5Dread. Of look-ahead rows, distances 1..la_read and the
 * first k_read candidates alone (dst rows of [L][la_read][k_read]): from a file chunked by
 * distance and candidates, those parts' chunks alone. */
static moesim_status read_ds_rows(trace_stream *s, int i, uint64_t first, uint64_t n, void *dst) {
    stream_chunk *c = &s->chunk[i];
    const dataset_spec *spec = &s->o.specs[i];
    const bool look = spec->rank == 4;
    const uint32_t D = look ? (uint32_t)spec->dims[2] : 1, want = look ? s->la_read : 1;
    const uint32_t K = look ? (uint32_t)spec->dims[3] : 1, k_read = look ? s->k_read : 1;
    const uint32_t parts = c->rows ? c->distances * c->columns : 1;
    const size_t size = spec->size, part_bytes = c->row_bytes / parts;
    const size_t dst_row = c->row_bytes / ((size_t)D * K) * want * k_read, run = c->run_bytes;
    /* candidates per chunk: a divisor of k_read (stream_chunks_init) */
    const size_t kc = run / size;
    /* the parts read of each row chunk: distances 0..d_parts, candidate columns 0..c_parts */
    const uint32_t d_parts = c->distances > 1 ? want : 1, c_parts = look && kc ? k_read / kc : 1;
    for (uint64_t j = c->rows ? first / c->rows : 0; c->rows && j * c->rows < first + n; j++) {
        const uint64_t lo = j * c->rows > first ? j * c->rows : first;
        const uint64_t hi = (j + 1) * c->rows < first + n ? (j + 1) * c->rows : first + n;
        unsigned char *out = (unsigned char *)dst + (lo - first) * dst_row;
        const size_t per_row = part_bytes / size, from = (lo - j * c->rows) * per_row;
        const size_t count = (hi - lo) * per_row, chunk_bytes = c->rows * part_bytes;
        for (uint32_t d = 0; d < d_parts && c->rows; d++)
            for (uint32_t col = 0; col < c_parts; col++) {
                const unsigned char *buf;
                moesim_status st = chunk_held(s, i, j, d * c->columns + col, hi - lo, &buf);
                if (st) return st;
                if (!buf) break; /* c->rows is 0 now */
                if (c->distances == 1 && want < D) {
                    /* whole rows of D distances: the first `want` of each (token, layer) */
                    chunk_take_elems(s->la_scratch, buf, chunk_bytes, size, from, count);
                    chunk_gather_runs(out, s->la_scratch, (hi - lo) * dst_row, want * run, D * run);
                } else if (d_parts * c_parts == 1) {
                    /* whole rows, or the one part read of each: as dst holds them */
                    chunk_take_elems(out, buf, chunk_bytes, size, from, count);
                } else { /* a part of each (token, layer) into place */
                    chunk_take_elems(s->la_scratch, buf, chunk_bytes, size, from, count);
                    chunk_scatter_runs(out + (d * k_read + col * kc) * size, s->la_scratch,
                                       count * size, run, (size_t)want * k_read * size);
                }
            }
    }
    if (c->rows) return MOESIM_OK;
    if (!c->filters_checked) { /* as trace_read checks before HDF5 reads the dataset */
        moesim_status st = trace_read_skipped_filters_check(&s->r, spec, s->o.ds[i]);
        if (st) return st;
        c->filters_checked = true;
    }
    return read_rows(&s->r, spec, s->o.ds[i], first, n, want, k_read, dst);
}

/* Reads tokens [first, first + n) of datasets [from, to) into `block` (sized for at least n):
 * DS_REQUEST_ID..DS_TOKEN_ID are the tokens' datasets, DS_EXPERT_IDS on the rows. */
static moesim_status read_datasets(trace_stream *s, int from, int to, uint64_t first, uint64_t n,
                                   trace *block) {
    void *bufs[DS_COUNT] = {block->request_id, block->position,      block->phase,
                            block->token_id,   block->expert_ids,    block->gate_weights,
                            block->importance, block->lookahead_ids, block->lookahead_scores};
    moesim_status st = MOESIM_OK;
    for (int i = from; i < to && !st; i++)
        if (s->o.have[i] && !s->skip[i]) st = read_ds_rows(s, i, first, n, bufs[i]);
    block->n_tokens = n;
    return st;
}

static moesim_status read_block(trace_stream *s, uint64_t first, uint64_t n, trace *block) {
    return read_datasets(s, DS_REQUEST_ID, DS_COUNT, first, n, block);
}

static uint64_t block_len(const trace_stream *s, uint64_t b) {
    uint64_t first = b * s->block_tokens, n = s->skeleton->n_tokens - first;
    return n < s->block_tokens ? n : s->block_tokens;
}

/* The request holding `token` in a trace whose requests are contiguous: numbered by first
 * appearance, their first tokens increase. */
static uint32_t request_of(const trace_request_index *ix, uint64_t token) {
    uint32_t lo = 0, hi = ix->n_requests - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (ix->first[mid] <= token)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The segment trace_stream_row reads for `token`, tokens [*first, *first + *n): its block, and
 * with blocks_by_request only the tokens of the block that belong to its request. */
static void segment_of(const trace_stream *s, uint64_t token, uint64_t *first, uint64_t *n) {
    const uint64_t b = token / s->block_tokens;
    uint64_t lo = b * s->block_tokens, hi = lo + block_len(s, b);
    if (s->by_request) {
        const trace_request_index *ix = &s->requests;
        const uint32_t r = request_of(ix, token);
        const uint64_t r_end = ix->first[r] + ix->n_tokens[r];
        lo = ix->first[r] > lo ? ix->first[r] : lo;
        hi = r_end < hi ? r_end : hi;
    }
    *first = lo;
    *n = hi - lo;
}

/* Whether the rows of the segment starting at token `first` were checked: the flag of its
 * block, or of its request when it starts in the middle of a block. */
static uint8_t *segment_checked(trace_stream *s, uint64_t first) {
    const uint64_t b = first / s->block_tokens;
    if (first == b * s->block_tokens) return &s->rows_checked[b];
    return &s->req_checked[request_of(&s->requests, first)];
}

/* ---- request index ---- */

/* Adds tokens [first, first + n) of the trace (their request ids and phases) to an index whose
 * arrays are sized for every request; false when a request's tokens are not contiguous. */
static bool index_add(trace_request_index *ix, uint64_t first, uint64_t n, const uint32_t *rid,
                      const uint8_t *phase) {
    bool contiguous = true;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t r = rid[i];
        if (!ix->n_tokens[r])
            ix->first[r] = first + i;
        else if (ix->first[r] + ix->n_tokens[r] != first + i)
            contiguous = false;
        ix->n_tokens[r]++;
        ix->n_prefill[r] += phase[i] == TRACE_PREFILL;
    }
    return contiguous;
}

static void index_alloc(trace_request_index *ix, uint32_t n_requests) {
    memset(ix, 0, sizeof *ix);
    ix->n_requests = n_requests;
    size_t n = n_requests ? n_requests : 1;
    ix->first = moesim_xcalloc(n, sizeof *ix->first);
    ix->n_tokens = moesim_xcalloc(n, sizeof *ix->n_tokens);
    ix->n_prefill = moesim_xcalloc(n, sizeof *ix->n_prefill);
}

/* Interleaved requests: each one's tokens listed, in trace order (rid: [N] request ids). */
static void index_group(trace_request_index *ix, const uint32_t *rid, uint64_t N) {
    ix->offset = moesim_xcalloc(ix->n_requests ? ix->n_requests : 1, sizeof *ix->offset);
    ix->tokens = moesim_xmalloc((N ? N : 1) * sizeof *ix->tokens);
    for (uint32_t r = 1; r < ix->n_requests; r++)
        ix->offset[r] = ix->offset[r - 1] + ix->n_tokens[r - 1];
    uint64_t *fill = moesim_xmalloc((ix->n_requests ? ix->n_requests : 1) * sizeof *fill);
    memcpy(fill, ix->offset, ix->n_requests * sizeof *fill);
    for (uint64_t i = 0; i < N; i++) ix->tokens[fill[rid[i]]++] = (uint32_t)i;
    free(fill);
}

void trace_request_index_build(trace_request_index *ix, const trace *t) {
    index_alloc(ix, t->n_requests);
    if (!index_add(ix, 0, t->n_tokens, t->request_id, t->phase))
        index_group(ix, t->request_id, t->n_tokens);
}

void trace_request_index_free(trace_request_index *ix) {
    free(ix->first);
    free(ix->n_tokens);
    free(ix->n_prefill);
    free(ix->tokens);
    free(ix->offset);
    memset(ix, 0, sizeof *ix);
}

/* Tokens of skipped look-ahead ids read at a time to count their hits: a stream checking rows on
 * read keeps the buffer for the run, and a block's worth would be megabytes. */
#define FIRST_HITS_TOKENS 64u

/* Look-ahead rows skipped and no first_hits attribute: their ids are read alone to count the
 * hits. */
static bool reads_skipped_ids(const trace_stream *s) {
    return s->skip[DS_LOOK_IDS] && s->o.have[DS_LOOK_IDS] && !s->o.has_first_hits;
}

/* The values of block `block` of tokens from `first` (trace_check_rows) and its first-candidate
 * hits where they are counted (trace_stream.hits): once per block of the trace. */
static moesim_status check_block_rows(trace_stream *s, const trace *block, uint64_t first) {
    moesim_status st = trace_check_rows(block, first, s->r.path, s->r.err);
    if (!st && s->o.scores_ranked && block->lookahead_scores && !s->skip[DS_LOOK_SCORES])
        st = trace_check_ranked(block, first, s->r.path, s->r.err);
    if (!st && block->lookahead_ids && s->o.has_first_hits)
        trace_first_hits_add(&s->hits, &block->meta, block->expert_ids, block->lookahead_ids,
                             block->n_tokens);
    trace_meta distance_1 = s->o.meta; /* the skipped ids are read at distance 1 alone */
    distance_1.lookahead_depth = 1;
    for (uint64_t at = 0; s->la_ids && at < block->n_tokens && !st; at += FIRST_HITS_TOKENS) {
        uint64_t n =
            block->n_tokens - at < FIRST_HITS_TOKENS ? block->n_tokens - at : FIRST_HITS_TOKENS;
        st = read_ds_rows(s, DS_LOOK_IDS, first + at, n, s->la_ids);
        if (!st)
            trace_first_hits_add(&s->hits, &distance_1, trace_experts(block, at, 0), s->la_ids,
                                 n);
    }
    return st;
}

/* Once every block's rows were checked: a first_hits attribute against the look-ahead rows read
 * (skipped, the attribute is the count). */
static moesim_status check_first_hits(trace_stream *s) {
    if (s->skip[DS_LOOK_IDS]) return MOESIM_OK;
    return trace_read_first_hits_check(&s->r, &s->o, &s->hits);
}

/* The skeleton (meta and counts), the request index, and the validation pass: every block
 * through trace_checker (the rows skipped left out; with the rows checked on read, the tokens'
 * datasets alone). */
static moesim_status stream_load(trace_stream *s) {
    const opened_trace *o = &s->o;
    reader *r = &s->r;
    uint64_t N = o->n_tokens;
    trace *k = calloc(1, sizeof *k);
    if (!k) return moesim_fail(r->err, MOESIM_ENOMEM, "%s: out of memory", r->path);
    s->skeleton = k;
    k->meta = o->meta;
    k->n_tokens = N;
    trace *block = trace_try_create(&s->rows_meta, s->block_tokens);
    if (!block) return moesim_fail(r->err, MOESIM_ENOMEM, "%s: out of memory", r->path);
    /* skipped look-ahead: the first-candidate hits the file stores, else its ids alone */
    uint64_t n_blocks = (N + s->block_tokens - 1) / s->block_tokens;
    const bool count_la = reads_skipped_ids(s);
    if (s->skip[DS_LOOK_IDS] && o->has_first_hits) s->hits = o->first_hits;
    if (count_la)
        s->la_ids =
            malloc((size_t)FIRST_HITS_TOKENS * o->meta.n_layers * o->meta.lookahead_k *
                   sizeof *s->la_ids); /* distance 1 alone */
    if (s->check_on_read) s->rows_checked = calloc(n_blocks, 1);
    if ((count_la && !s->la_ids) || (s->check_on_read && !s->rows_checked)) {
        trace_destroy(block);
        return moesim_fail(r->err, MOESIM_ENOMEM, "%s: out of memory", r->path);
    }
    /* the request count first (the checker needs it), from the request ids alone */
    uint32_t max_id = 0;
    moesim_status st = MOESIM_OK;
    for (uint64_t b = 0; b < n_blocks && !st; b++) {
        uint64_t n = block_len(s, b);
        st = read_ds_rows(s, DS_REQUEST_ID, b * s->block_tokens, n, block->request_id);
        if (!st)
            st = trace_request_ids_scan(block->request_id, n, b * s->block_tokens, N, &max_id,
                                        r->path, r->err);
    }
    k->n_requests = N ? (max_id < UINT32_MAX ? max_id + 1 : UINT32_MAX) : 0;
    if (!st) st = trace_counts_check(N, k->n_requests, r->path, r->err);
    bool contiguous = true;
    if (!st) {
        trace_checker c;
        trace_checker_init(&c, &s->rows_meta, k->n_requests, r->path);
        index_alloc(&s->requests, k->n_requests);
        const int read_to = s->check_on_read ? DS_EXPERT_IDS : DS_COUNT;
        for (uint64_t b = 0; b < n_blocks && !st; b++) {
            uint64_t first = b * s->block_tokens;
            st = read_datasets(s, DS_REQUEST_ID, read_to, first, block_len(s, b), block);
            if (!st) st = trace_checker_tokens(&c, block, r->err);
            if (!st && !s->check_on_read) st = check_block_rows(s, block, first);
            if (!st)
                contiguous &= index_add(&s->requests, first, block->n_tokens, block->request_id,
                                        block->phase);
        }
        if (!st) st = trace_checker_finish(&c, r->err);
        if (!st && !s->check_on_read) st = check_first_hits(s);
        trace_checker_free(&c);
    }
    trace_destroy(block);
    if (!st && !contiguous) { /* requests interleave in the file: 8 bytes a token */
        uint32_t *rid = malloc((N ? N : 1) * sizeof *rid);
        if (!rid) return moesim_fail(r->err, MOESIM_ENOMEM, "%s: out of memory", r->path);
        st = trace_read_dataset(r, &o->specs[DS_REQUEST_ID], o->ds[DS_REQUEST_ID], rid);
        if (!st) index_group(&s->requests, rid, N);
        free(rid);
    }
    return st;
}

/* Chunks a reader of whole rows of c takes from at once: the distances and candidate columns
 * read, where the file holds them in chunks apart. */
static uint32_t chunks_per_rows(const trace_stream *s, const stream_chunk *c) {
    const uint32_t columns_read =
        c->columns > 1 ? s->k_read * c->columns / s->o.meta.lookahead_k : 1;
    return (c->distances > 1 ? s->la_read : 1) * columns_read;
}

/* Keeps at most `cap` (>= 1) of c's chunks: later entries are dropped. */
static void chunk_cache_resize(stream_chunk *c, uint32_t cap) {
    for (uint32_t e = cap; e < c->n; e++) free(c->buf[e]);
    if (c->n > cap) c->n = cap;
    c->held = moesim_xrealloc(c->held, cap * sizeof *c->held);
    c->used = moesim_xrealloc(c->used, cap * sizeof *c->used);
    c->left = moesim_xrealloc(c->left, cap * sizeof *c->left);
    c->buf = moesim_xrealloc(c->buf, cap * sizeof *c->buf);
    c->cap = cap;
}

static void chunk_cache_free(stream_chunk *c) {
    for (uint32_t e = 0; e < c->n; e++) free(c->buf[e]);
    free(c->held);
    free(c->used);
    free(c->left);
    free(c->buf);
}

/* The look-ahead candidates read of a reader of the first `wanted`: those of the chunks that
 * hold them, where the file chunks its ids Kc candidates apart, else all K'. */
static uint32_t candidates_read(const trace_stream *s, uint32_t wanted) {
    const uint32_t K = s->o.meta.lookahead_k;
    uint32_t distances, columns;
    if (!trace_read_chunk_rows(&s->o.specs[DS_LOOK_IDS], s->o.ds[DS_LOOK_IDS], &distances,
                               &columns))
        return K;
    const uint32_t kc = K / columns, read = (wanted + kc - 1) / kc * kc;
    return read < K ? read : K;
}

/* Which datasets are laid out as ours (their chunks then inflate here), and their buffers. */
static moesim_status stream_chunks_init(trace_stream *s) {
    size_t largest = 0, la_scratch = 0;
    for (int i = 0; i < DS_COUNT; i++) {
        stream_chunk *c = &s->chunk[i];
        if (!s->o.have[i] || (s->skip[i] && !(i == DS_LOOK_IDS && reads_skipped_ids(s)))) continue;
        const dataset_spec *spec = &s->o.specs[i];
        c->row_bytes = spec->size;
        for (int d = 1; d < spec->rank; d++) c->row_bytes *= spec->dims[d];
        c->rows = trace_read_chunk_rows(spec, s->o.ds[i], &c->distances, &c->columns);
        c->run_bytes = spec->rank == 4 ? spec->size * spec->dims[3] / c->columns : 0;
        size_t bytes = c->rows * c->row_bytes / (c->distances * c->columns);
        if (c->rows > s->o.n_tokens || bytes > CHUNK_MAX_BYTES) c->rows = 0; /* as read_chunks */
        /* candidates read in whole chunks alone (else HDF5 selects them) */
        if (spec->rank == 4 && s->k_read % (c->run_bytes / spec->size)) c->rows = 0;
        if (!c->rows) continue;
        chunk_cache_resize(c, chunks_per_rows(s, c)); /* the pass at open reads in order */
        if (bytes > largest) largest = bytes;
        /* rows placed apart from the chunk's order (read_ds_rows) go through a scratch: a part
         * of several read, or the first distances of whole rows */
        const uint32_t D = spec->rank == 4 ? (uint32_t)spec->dims[2] : 1;
        if (spec->rank == 4 &&
            (chunks_per_rows(s, c) > 1 || (c->distances == 1 && s->la_read < D)) &&
            bytes > la_scratch)
            la_scratch = bytes;
    }
    if (largest && !chunk_batch_init(&s->batch, largest, false))
        return moesim_fail(s->r.err, MOESIM_ENOMEM, "%s: out of memory for chunk buffers",
                           s->r.path);
    if (la_scratch && !(s->la_scratch = malloc(la_scratch)))
        return moesim_fail(s->r.err, MOESIM_ENOMEM, "%s: out of memory", s->r.path);
    return MOESIM_OK;
}

moesim_status trace_stream_open(const char *path, trace_stream **out, moesim_error *err) {
    return trace_stream_open_with(path, NULL, out, err);
}

moesim_status trace_stream_open_with(const char *path, const trace_stream_options *opt,
                                     trace_stream **out, moesim_error *err) {
    *out = NULL;
    trace_stream *s = calloc(1, sizeof *s);
    char *own = strdup(path);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (!s || !own || fapl < 0) {
        free(s);
        free(own);
        h5_close(&fapl, H5Pclose);
        return moesim_fail(err, MOESIM_ENOMEM, "%s: out of memory", path);
    }
    s->path = own;
    for (int i = 0; i < DS_COUNT; i++) s->o.ds[i] = H5I_INVALID_HID;
    H5Pset_cache(fapl, 0, 521, STREAM_CHUNK_CACHE, 1.0);
    moesim_status st = trace_read_file_open(own, fapl, &s->r, err);
    h5_close(&fapl, H5Pclose);
    if (!st) st = trace_read_datasets_open(&s->r, &s->o);
    if (!st) {
        s->rows_meta = s->o.meta;
        const uint32_t D = s->o.meta.lookahead_depth;
        if (opt && opt->lookahead_distances && opt->lookahead_distances < D)
            s->rows_meta.lookahead_depth = opt->lookahead_distances;
        s->la_read = s->rows_meta.lookahead_depth;
        if (opt && opt->skip_lookahead) {
            s->skip[DS_LOOK_IDS] = s->skip[DS_LOOK_SCORES] = true;
            s->rows_meta.lookahead_depth = s->rows_meta.lookahead_k = 0;
            s->la_read = D ? 1 : 0; /* the ids of distance 1, where their hits are counted */
        }
        if (opt && opt->skip_ranked_scores && s->o.scores_ranked)
            s->skip[DS_LOOK_SCORES] = true; /* the blocks' scores stay zeros */
        s->k_read = s->o.meta.lookahead_k;
        if (opt && opt->first_candidates_only && !s->skip[DS_LOOK_IDS]) {
            const uint32_t top_k = s->o.meta.top_k, n = opt->lookahead_candidates;
            s->rows_meta.lookahead_k = s->k_read = candidates_read(s, n > top_k ? n : top_k);
        }
        s->check_on_read = opt && opt->check_rows_on_read;
        uint64_t per_token = trace_bytes_per_token(&s->rows_meta);
        s->block_tokens = STREAM_BLOCK_BYTES / per_token ? STREAM_BLOCK_BYTES / per_token : 1;
        st = stream_chunks_init(s);
        if (!st) st = stream_load(s);
        /* segments by request where requests are contiguous (interleaved: whole blocks) */
        s->by_request_asked = !st && opt && opt->blocks_by_request && !s->requests.tokens;
        if (s->by_request_asked && s->rows_checked) {
            s->req_checked = calloc(s->requests.n_requests ? s->requests.n_requests : 1, 1);
            if (!s->req_checked) st = moesim_fail(err, MOESIM_ENOMEM, "%s: out of memory", path);
        }
    }
    if (!st) {
        s->skeleton->params_json = s->o.params_json;
        s->o.params_json = NULL;
        trace_stream_set_cache(s, 0, STREAM_DEFAULT_SLOTS);
    }
    H5Eclear2(H5E_DEFAULT);
    if (st) {
        trace_stream_close(s);
        return st;
    }
    *out = s;
    return MOESIM_OK;
}

const trace *trace_stream_tokens(const trace_stream *s) { return s->skeleton; }

const trace_meta *trace_stream_rows_meta(const trace_stream *s) { return &s->rows_meta; }

bool trace_stream_scores_unread(const trace_stream *s) {
    return s->skip[DS_LOOK_SCORES] && !s->skip[DS_LOOK_IDS];
}

void trace_stream_lookahead_first_hits(const trace_stream *s, uint64_t *right, uint64_t *total) {
    const bool skipped = s->skip[DS_LOOK_IDS];
    *right = skipped ? s->hits.right : 0;
    *total = skipped ? s->hits.total : 0;
}

const trace_request_index *trace_stream_requests(const trace_stream *s) { return &s->requests; }

uint64_t trace_stream_block_tokens(const trace_stream *s) { return s->block_tokens; }

uint64_t trace_stream_blocks_read(const trace_stream *s) { return s->blocks_read; }

uint64_t trace_stream_chunks_inflated(const trace_stream *s) { return s->chunks_inflated; }

bool trace_stream_caches_every_block(const trace_stream *s) {
    return (s->skeleton->n_tokens + s->block_tokens - 1) / s->block_tokens <= s->n_slots;
}

void trace_stream_set_cache(trace_stream *s, uint64_t block_tokens, uint32_t n_blocks) {
    if (n_blocks < 1) n_blocks = 1;
    if (s->rows_checked && block_tokens && block_tokens != s->block_tokens) {
        /* rows_checked counts blocks of the old size: the checks are settled first */
        trace_stream_check_rest(s, NULL);
        free(s->rows_checked);
        free(s->req_checked);
        s->rows_checked = s->req_checked = NULL;
    }
    for (uint32_t i = 0; i < s->n_slots; i++) {
        trace_destroy(s->slot[i]);
    }
    free(s->slot);
    free(s->slot_first);
    free(s->slot_len);
    free(s->slot_at);
    if (block_tokens) s->block_tokens = block_tokens;
    /* Segments only where blocks would be evicted: a cache that holds every block reads each
     * once, whole (the oracle's future then reads its ids from it). Chosen while no row has been
     * checked yet (or every one has): check flags and first-candidate hits count segments. */
    const bool fits = (s->skeleton->n_tokens + s->block_tokens - 1) / s->block_tokens <= n_blocks;
    if (s->by_request_asked && (!s->rows_read || !s->rows_checked)) s->by_request = !fits;
    for (int i = 0; i < DS_COUNT; i++)
        if (s->chunk[i].rows)
            chunk_cache_resize(&s->chunk[i], 2 * n_blocks * chunks_per_rows(s, &s->chunk[i]));
    s->n_slots = n_blocks;
    s->slot = moesim_xcalloc(n_blocks, sizeof *s->slot);
    s->slot_first = moesim_xcalloc(n_blocks, sizeof *s->slot_first);
    s->slot_len = moesim_xcalloc(n_blocks, sizeof *s->slot_len);
    s->slot_at = moesim_xcalloc(n_blocks, sizeof *s->slot_at);
    for (uint32_t i = 0; i < n_blocks; i++) s->slot_first[i] = UINT64_MAX;
    s->mru = 0;
}

/* A read that fails where open succeeded: the file changed since, or the disk failed; there is
 * no trace left to run on. */
static _Noreturn void stream_read_died(const moesim_error *err) {
    fprintf(stderr, "moesim: %s\n", err->msg);
    abort();
}

/* Each of the n ids that is not an expert's (n_experts or above) becomes TRACE_NO_EXPERT. */
static void blank_non_expert_ids(uint16_t *ids, size_t n, uint32_t n_experts) {
    size_t i = 0;
#if defined(__SSE2__)
    /* id - (E - 1), saturated at 0: zero exactly for an expert's id */
    const __m128i last = _mm_set1_epi16((short)(n_experts - 1)), ones = _mm_set1_epi16(-1);
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(ids + i));
        __m128i expert = _mm_cmpeq_epi16(_mm_subs_epu16(v, last), _mm_setzero_si128());
        _mm_storeu_si128((__m128i *)(ids + i), _mm_or_si128(v, _mm_andnot_si128(expert, ones)));
    }
#endif
    for (; i < n; i++)
        if (ids[i] >= n_experts) ids[i] = TRACE_NO_EXPERT;
}

/* The ids of tokens [first, first + n), all of one block, that its check may not have seen yet
 * (check_rows_on_read): what is not an expert id becomes TRACE_NO_EXPERT, and so does every id
 * when the read fails. Nothing is kept: the block's check finds the same failure when the run
 * reads the block (or trace_stream_check_rest does), and a block that fails there gives the
 * run blank rows, so the ids read here route at least what the run's rows route. */
static void read_unchecked_ids(trace_stream *s, uint64_t first, uint64_t n, uint16_t *dst) {
    const size_t n_ids = n * trace_route_values(&s->rows_meta);
    if (read_ds_rows(s, DS_EXPERT_IDS, first, n, dst)) {
        memset(dst, 0xFF, n_ids * sizeof *dst);
        return;
    }
    blank_non_expert_ids(dst, n_ids, s->rows_meta.n_experts);
}

void trace_stream_read_experts(trace_stream *s, uint64_t first, uint64_t n, uint16_t *dst) {
    MOESIM_ASSERT(first + n <= s->skeleton->n_tokens);
    moesim_error err = {0};
    s->r.err = &err;
    if (!s->check_on_read) { /* every id was checked at open: a failure is trace_stream_row's */
        if (read_ds_rows(s, DS_EXPERT_IDS, first, n, dst)) stream_read_died(&err);
        return;
    }
    const size_t per_token = trace_route_values(&s->rows_meta);
    /* block by block: a failed read blanks no id of a block whose own read succeeds */
    for (uint64_t at = first, end = first + n; at < end;) {
        const uint64_t block_end = (at / s->block_tokens + 1) * s->block_tokens;
        const uint64_t m = (block_end < end ? block_end : end) - at;
        read_unchecked_ids(s, at, m, dst + (at - first) * per_token);
        at += m;
    }
}

/* Rows that are valid and route nothing: every layer unrecorded (consumers skip it), look-ahead
 * candidates expert 0 (padding past the last layer), gates, scores and importance 0. What a
 * block whose rows failed holds for the rest of a run that will not be reported. */
static void blank_rows(trace *block) {
    const trace_meta *m = &block->meta;
    const uint64_t n = block->n_tokens;
    memset(block->expert_ids, 0xFF, n * trace_route_values(m) * sizeof *block->expert_ids);
    memset(block->gate_weights, 0, n * trace_route_values(m) * sizeof *block->gate_weights);
    if (block->importance) memset(block->importance, 0, n * m->n_layers * sizeof(float));
    if (!block->lookahead_ids) return;
    const uint32_t L = m->n_layers, D = m->lookahead_depth, K = m->lookahead_k;
    for (uint64_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < L; l++) {
            uint16_t *ids = block->lookahead_ids + trace_lookahead_index(block, i, l, 1);
            size_t inside = (size_t)(L - 1 - l < D ? L - 1 - l : D) * K;
            for (size_t j = 0; j < (size_t)D * K; j++) ids[j] = j < inside ? 0 : TRACE_NO_EXPERT;
        }
    memset(block->lookahead_scores, 0, n * trace_lookahead_values(m) * sizeof(float));
}

/* The segment of tokens [first, first + n) into `block` for trace_stream_row. Its tokens' rows
 * were read at open, so a failure there is fatal; with the rows checked on read, a segment's
 * rows are checked the first time it is read, and a failed read or check of rows is kept for
 * trace_stream_check_rest while this segment and every later one get blank rows, so that the
 * run reaches its end safely (and quickly: nothing more is inflated). */
static void read_segment_for_run(trace_stream *s, uint64_t first, uint64_t n, trace *block) {
    moesim_error err = {0};
    s->r.err = &err;
    s->rows_read = true;
    if (!s->check_on_read) {
        if (read_block(s, first, n, block)) stream_read_died(&err);
        return;
    }
    if (read_datasets(s, DS_REQUEST_ID, DS_EXPERT_IDS, first, n, block)) stream_read_died(&err);
    moesim_status st = s->failure.status;
    if (!st) st = read_datasets(s, DS_EXPERT_IDS, DS_COUNT, first, n, block);
    uint8_t *checked = s->rows_checked ? segment_checked(s, first) : NULL;
    if (!st && checked && !*checked) {
        st = check_block_rows(s, block, first);
        *checked = !st;
    }
    if (!st) return;
    if (!s->failure.status) s->failure = err;
    blank_rows(block);
}

moesim_status trace_stream_check_rest(trace_stream *s, moesim_error *err) {
    if (s->rows_checked && !s->failure.status) {
        trace *block = trace_try_create(&s->rows_meta, s->block_tokens);
        if (!block) return moesim_fail(err, MOESIM_ENOMEM, "%s: out of memory", s->r.path);
        moesim_error e = {0};
        s->r.err = &e;
        const uint64_t N = s->skeleton->n_tokens;
        s->rows_read = true;
        for (uint64_t first = 0, n; first < N && !s->failure.status; first += n) {
            segment_of(s, first, &first, &n);
            uint8_t *checked = segment_checked(s, first);
            if (*checked) continue;
            moesim_status st = read_datasets(s, DS_EXPERT_IDS, DS_COUNT, first, n, block);
            if (!st) st = check_block_rows(s, block, first);
            if (st) s->failure = e;
            *checked = !st;
        }
        if (!s->failure.status && check_first_hits(s)) s->failure = e;
        trace_destroy(block);
    }
    if (!s->failure.status) return MOESIM_OK;
    if (err) *err = s->failure;
    return s->failure.status;
}

const trace *trace_stream_row(trace_stream *s, uint64_t token, uint64_t *local) {
    MOESIM_ASSERT(token < s->skeleton->n_tokens);
    /* the last segment read; an empty slot's first token is UINT64_MAX, so that the difference
     * wraps past every segment length */
    *local = token - s->slot_first[s->mru];
    if (*local < s->slot_len[s->mru]) return s->slot[s->mru];
    /* segments do not overlap: a slot whose segment holds the token holds the token's segment
     * (found by range, its request is not looked up: a batch's rows come request after request,
     * and the lookup's search was 2 % of a batch-4 run) */
    uint32_t victim = 0;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        const uint64_t at = token - s->slot_first[i];
        if (at < s->slot_len[i]) {
            s->mru = i;
            s->slot_at[i] = ++s->clock;
            *local = at;
            return s->slot[i];
        }
        if (s->slot_at[i] < s->slot_at[victim]) victim = i;
    }
    uint64_t first, n;
    segment_of(s, token, &first, &n);
    *local = token - first;
    if (!s->slot[victim]) s->slot[victim] = trace_create(&s->rows_meta, s->block_tokens);
    read_segment_for_run(s, first, n, s->slot[victim]);
    s->slot_first[victim] = first;
    s->slot_len[victim] = n;
    s->slot_at[victim] = ++s->clock;
    s->mru = victim;
    s->blocks_read++;
    return s->slot[victim];
}

void trace_stream_close(trace_stream *s) {
    if (!s) return;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        trace_destroy(s->slot[i]);
    }
    free(s->slot);
    free(s->slot_first);
    free(s->slot_len);
    free(s->slot_at);
    trace_read_datasets_close(&s->o);
    trace_destroy(s->skeleton);
    trace_request_index_free(&s->requests);
    free(s->la_ids);
    free(s->la_scratch);
    free(s->rows_checked);
    free(s->req_checked);
    for (int i = 0; i < DS_COUNT; i++) chunk_cache_free(&s->chunk[i]);
    chunk_batch_free(&s->batch);
    if (s->r.file >= 0 && s->r.path) H5Fclose(s->r.file);
    H5Eclear2(H5E_DEFAULT);
    free(s->path);
    free(s);
}
