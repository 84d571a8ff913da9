/* Router traces in memory, and their HDF5 file form (traces/FORMAT.md is the reference).
 *
 * A trace holds, for every token of every request (all requests concatenated, in execution
 * order) and every MoE layer, the top-k experts the router chose and their gate weights as the
 * model applies them; optionally the token's importance (DyMoE Eq. 1) and look-ahead
 * predictions (for distance d = 1..D, the top-K' experts that layer l+d's router picks from
 * layer l's router input: DyMoE Eq. 6, FIRM-MoE Eq. 4-5).
 *
 * Invariants checked by trace_check (and so by every reader):
 *   - request ids are dense: 0..n_requests-1, numbered by first appearance;
 *   - within a request, positions strictly increase and no prefill token follows a decode token;
 *   - expert ids < n_experts, distinct within one token's top-k; or a whole row of
 *     TRACE_NO_EXPERT (gates 0): that layer's routing was not recorded for that token (imports
 *     with --incomplete keep). Consumers skip such rows: no access, no expert compute;
 *   - gate weights finite and in [0, 1]; importance finite and >= 0;
 *   - look-ahead ids < n_experts, or TRACE_NO_EXPERT exactly where l + d >= n_layers. */
#ifndef MOESIM_TRACES_TRACE_H
#define MOESIM_TRACES_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/model.h"
#include "common/status.h"

#define TRACE_FORMAT_NAME         "moesim-trace"
#define TRACE_FORMAT_VERSION      1u
#define TRACE_NO_EXPERT           UINT16_MAX /* look-ahead padding beyond the last layer; unrecorded row */
#define TRACE_MAX_TOP_K           64
#define TRACE_MAX_LOOKAHEAD_DEPTH 16
#define TRACE_MAX_LOOKAHEAD_K     256

enum trace_phase { TRACE_PREFILL = 0, TRACE_DECODE = 1 };

/* What the trace describes; fixed at creation. */
typedef struct trace_meta {
    char model[64];            /* configs/models name, e.g. "qwen3-30b-a3b" */
    char source[128];          /* "engine", "import:jsonl", "synth:<seed>" */
    char tool_version[32];     /* moesim version that wrote it */
    uint32_t n_layers;         /* MoE layers in the trace (L) */
    uint32_t n_experts;        /* routed experts per layer (E), <= MODEL_MAX_EXPERTS */
    uint32_t top_k;            /* k */
    uint32_t n_shared_experts; /* always-on experts per layer (not in the routing arrays) */
    gate_normalization gate_norm;
    uint32_t model_layer[MODEL_MAX_LAYERS]; /* [n_layers] model layer index of each MoE layer */
    uint32_t lookahead_depth;               /* D: 0 when the trace has no look-ahead predictions */
    uint32_t lookahead_k;                   /* K' candidates per distance (0 when D == 0) */
    bool has_importance;
    bool has_token_ids;
    uint64_t model_config_hash; /* hash of the checkpoint config (engine traces), else 0 */
} trace_meta;

typedef struct trace {
    trace_meta meta;
    uint64_t n_tokens;
    uint32_t n_requests;
    uint32_t *request_id;    /* [n_tokens] */
    uint32_t *position;      /* [n_tokens] position of the token in its request */
    uint8_t *phase;          /* [n_tokens] enum trace_phase */
    int32_t *token_id;       /* [n_tokens] vocabulary id, or NULL (!has_token_ids) */
    uint16_t *expert_ids;    /* [n_tokens][n_layers][top_k] */
    float *gate_weights;     /* [n_tokens][n_layers][top_k] */
    float *importance;       /* [n_tokens][n_layers], or NULL (!has_importance) */
    uint16_t *lookahead_ids; /* [n_tokens][n_layers][D][K'], or NULL (D == 0) */
    float *lookahead_scores; /* [n_tokens][n_layers][D][K'], or NULL (D == 0) */
    char *params_json;       /* generator / import settings as JSON text, or NULL; owned */
} trace;

/* Allocates a trace of n_tokens with zeroed arrays sized by `meta` (caller fills them, then
 * calls trace_finish). Caller owns; trace_destroy. */
trace *trace_create(const trace_meta *meta, uint64_t n_tokens);
void trace_destroy(trace *t); /* accepts NULL */

/* Copies every token of `src` into `dst` from token `at` on (same geometry and optional parts;
 * at + src->n_tokens <= dst->n_tokens). */
void trace_copy_tokens(trace *dst, uint64_t at, const trace *src);

/* Computes n_requests from request_id and runs trace_check. `what` names the trace in
 * messages (a path, or "synthesized trace"). */
moesim_status trace_finish(trace *t, const char *what, moesim_error *err);
moesim_status trace_check(const trace *t, const char *what, moesim_error *err);
/* Folds n ids (tokens first..first+n-1 of n_tokens) into *max_id; an id at or above the token
 * count, which no dense numbering reaches, is refused naming its token. */
moesim_status trace_request_ids_scan(const uint32_t *ids, uint64_t n, uint64_t first,
                                     uint64_t n_tokens, uint32_t *max_id, const char *what,
                                     moesim_error *err);
/* "the trace holds no tokens" / n_requests outside 1..n_tokens: the count part of trace_check,
 * for writers that learn the counts before the data. */
moesim_status trace_counts_check(uint64_t n_tokens, uint32_t n_requests, const char *what,
                                 moesim_error *err);

/* trace_check fed one block of tokens at a time, in token order, for writers that never hold
 * the whole trace (trace_writer). A block is a trace of the same geometry whose arrays hold the
 * block's tokens and whose request ids are those of the whole trace; messages name tokens by
 * their index in the whole trace. trace_check is one block holding everything. */
typedef struct trace_checker {
    const trace_meta *meta;
    const char *what;    /* names the trace in messages */
    uint32_t n_requests; /* of the whole trace */
    uint32_t next_new;   /* the id the next new request must carry */
    uint64_t n_checked;  /* tokens checked so far: the index of the next block's first token */
    uint64_t *last;      /* [n_requests] (last position + 1) << 1 | decode seen */
} trace_checker;
void trace_checker_init(trace_checker *c, const trace_meta *meta, uint32_t n_requests,
                        const char *what);
moesim_status trace_checker_block(trace_checker *c, const trace *block, moesim_error *err);
/* The two halves of trace_checker_block, for a reader that checks the rows of a block later
 * than its tokens (trace_stream_options.check_rows_on_read): the token invariants, which span
 * blocks and must see them in order; and the values of the routing, importance and look-ahead
 * rows, which hold row by row (any order). `first`: the block's first token in the trace. */
moesim_status trace_checker_tokens(trace_checker *c, const trace *block, moesim_error *err);
moesim_status trace_check_rows(const trace *block, uint64_t first, const char *what,
                               moesim_error *err);
/* After the last block: every request of n_requests appeared. */
moesim_status trace_checker_finish(const trace_checker *c, moesim_error *err);
void trace_checker_free(trace_checker *c);

/* The meta part of trace_check alone (geometry bounds, look-ahead shape, layer map); readers
 * run it before sizing anything from a file. */
moesim_status trace_meta_check(const trace_meta *meta, const char *what, moesim_error *err);
/* trace_create that returns NULL instead of aborting when the arrays cannot be allocated
 * (readers: sizes come from a file). `meta` must pass trace_meta_check. */
trace *trace_try_create(const trace_meta *meta, uint64_t n_tokens);

/* Values per token: routing (L * k), look-ahead (L * D * K'); bytes of all arrays per token. */
size_t trace_route_values(const trace_meta *meta);
size_t trace_lookahead_values(const trace_meta *meta);
uint64_t trace_bytes_per_token(const trace_meta *meta);
/* "topk" / "all" (the gate_normalization attribute); "prefill" / "decode". */
const char *trace_gate_norm_name(gate_normalization g);
const char *trace_phase_name(uint8_t phase);

/* The recorded look-ahead predictor's distance-1 top-1 hits, which the simulator reports as its
 * predictor_accuracy (right / total): of the (token, layer l < L - 1) pairs whose layer l + 1 is
 * recorded, those whose first candidate at distance 1 is layer l + 1's first stored expert
 * (right), of all of them (total). The writer stores them beside the look-ahead rows (attribute
 * TRACE_FIRST_HITS_ATTR of /lookahead/expert_ids, traces/FORMAT.md) so that a reader skipping
 * those rows need not inflate them to report the accuracy. */
#define TRACE_FIRST_HITS_ATTR "first_hits"
typedef struct trace_first_hits {
    uint64_t right, total;
} trace_first_hits;
/* Adds the hits of n tokens whose rows are expert_ids [n][L][k] and lookahead_ids [n][L][D][K']
 * (meta's geometry; D > 0). */
void trace_first_hits_add(trace_first_hits *h, const trace_meta *meta, const uint16_t *expert_ids,
                          const uint16_t *lookahead_ids, uint64_t n);

/* Every look-ahead row of the file lists its candidates best first (common/ranked.h): the writer
 * stores whether it found so as attribute TRACE_RANKED_ATTR of /lookahead/scores
 * (traces/FORMAT.md), so that a reader for whom the scores only rank the candidates (a policy's
 * lookahead_scores_rank_only) need not inflate them. */
#define TRACE_RANKED_ATTR "ranked"
/* Whether every look-ahead row of `t` (D > 0) is ranked. */
bool trace_lookahead_ranked(const trace *t);
/* With the file's claim that every row is ranked: fails with one line naming the first row of
 * `block` (tokens from `first` of the file `what`) whose scores rise. */
moesim_status trace_check_ranked(const trace *block, uint64_t first, const char *what,
                                 moesim_error *err);

/* HDF5 I/O. Writing is crash-safe (temporary file, then rename), refuses a trace that fails
 * trace_check, and gives byte-identical files for identical traces. Reading checks the format
 * name, version, every dataset's type and shape, storage sizes against the file (before
 * allocating), and every value (trace_check); on failure *out is NULL and err names the file
 * and the attribute or dataset: MOESIM_EIO (cannot open), MOESIM_EINPUT (malformed),
 * MOESIM_ENOMEM. Chunks are (de)compressed on up to 8 threads; HDF5 calls stay on the
 * caller's thread. The caller owns *out (trace_destroy). */
moesim_status trace_write(const trace *t, const char *path, moesim_error *err);
moesim_status trace_read(const char *path, trace **out, moesim_error *err);

/* Each request's tokens, for hosts that schedule requests without per-token arrays (the
 * simulator's step schedule, core/schedule.h). Requests are usually stored one after the other,
 * and then nothing per token is kept. */
typedef struct trace_request_index {
    uint32_t n_requests;
    uint64_t *first;     /* [n_requests] the request's first token in the trace */
    uint32_t *n_tokens;  /* [n_requests] */
    uint32_t *n_prefill; /* [n_requests] its prefill tokens (they come first: trace_check) */
    uint32_t *tokens;    /* NULL when every request's tokens are contiguous; else [n_tokens of
                            the trace]: each request's tokens in trace order, from offset[r] */
    uint64_t *offset;    /* [n_requests] into tokens (NULL with it) */
} trace_request_index;
/* Builds the index of a trace in memory (checked: trace_check). Caller-allocated; _free. */
void trace_request_index_build(trace_request_index *ix, const trace *t);
void trace_request_index_free(trace_request_index *ix); /* accepts a zeroed struct */
/* Token c (0-based, < n_tokens[r]) of request r. */
static inline uint64_t trace_request_token(const trace_request_index *ix, uint32_t r, uint32_t c) {
    return ix->tokens ? ix->tokens[ix->offset[r] + c] : ix->first[r] + c;
}

/* Reading a trace without holding it whole, for runs whose memory must not grow with the trace
 * (the simulator): open checks the file as trace_read does (every value too, reading the tokens
 * block by block; but see check_rows_on_read) but keeps nothing per token: trace_stream_tokens
 * is a trace of meta and counts whose arrays are all NULL, trace_stream_requests each request's
 * tokens; rows (positions, routing, ...) are read in blocks of whole tokens on demand into a
 * small LRU cache of blocks. Errors as trace_read's. The caller owns *out (trace_stream_close). */
typedef struct trace_stream trace_stream;
moesim_status trace_stream_open(const char *path, trace_stream **out, moesim_error *err);
/* Rows a run never reads, so that they cost it nothing: they are neither read nor checked (the
 * rest is checked as trace_read does; `moesim trace validate` checks every value). */
typedef struct trace_stream_options {
    /* No look-ahead rows: blocks carry none (their meta says lookahead_depth 0; the skeleton
     * keeps the file's). trace_stream_lookahead_first_hits comes from the file's first_hits
     * attribute (trace_first_hits), and no look-ahead row is read; in a file without it, the
     * predictions' ids alone are read, once (at open; with check_rows_on_read, with each
     * block's check), to count them. Their scores are never read. */
    bool skip_lookahead;
    /* For one run over the trace, which then inflates each block once: open reads and checks
     * the tokens' datasets alone, and the values of a block's rows (routing, importance,
     * look-ahead) are checked the first time trace_stream_row reads it. A failed read or check
     * there does not abort: the stream keeps the first failure, gives that block and every later
     * one blank rows (all layers unrecorded, so the run ends soon and safely) and
     * trace_stream_check_rest reports it. The caller must call trace_stream_check_rest after its
     * run and use nothing the run computed unless it succeeds; the first-candidate hits
     * (skip_lookahead) are complete only then. */
    bool check_rows_on_read;
    /* For a run that reads several requests in turn (a batch): trace_stream_row reads and caches
     * segments, the tokens of one block that belong to one request, instead of whole blocks.
     * A block holding the end of one request and the start of the next is then read once for
     * each, when each reaches it, instead of once when the later request starts and again when
     * the earlier one reaches its end (the block was evicted by then). Ignored where requests
     * interleave in the file, and while the cache holds every block (trace_stream_set_cache:
     * each is then read once, whole). */
    bool blocks_by_request;
    /* Look-ahead rows of distances 1..lookahead_distances alone (0: every distance): the blocks'
     * meta says that depth (at most the file's). A file that stores each distance in chunks
     * apart (traces/FORMAT.md, "Storage") then inflates those distances' chunks alone. */
    uint32_t lookahead_distances;
    /* With first_candidates_only, of each look-ahead row the first max(lookahead_candidates,
     * top_k) candidates alone: the blocks' meta says how many they carry (lookahead_k), at least
     * these and at most the file's. A file that stores a row's candidates in chunks apart
     * (traces/FORMAT.md, "Storage") then inflates the chunks that hold these alone. */
    bool first_candidates_only;
    uint32_t lookahead_candidates;
    /* For a reader whose scores only rank each look-ahead row's candidates: a file whose
     * attribute TRACE_RANKED_ATTR says every row is ranked gives blocks whose scores are zeros
     * (trace_stream_scores_unread) and reads none; its claim is then trusted (`moesim trace
     * validate` and every reader of the scores check it). */
    bool skip_ranked_scores;
} trace_stream_options;
/* trace_stream_open with options; NULL: every row is read. */
moesim_status trace_stream_open_with(const char *path, const trace_stream_options *opt,
                                     trace_stream **out, moesim_error *err);
/* The geometry of the blocks trace_stream_row returns (which rows they carry). */
const trace_meta *trace_stream_rows_meta(const trace_stream *s);
/* Whether the blocks' look-ahead scores were left unread (skip_ranked_scores on a ranked file):
 * they are zeros. */
bool trace_stream_scores_unread(const trace_stream *s);
/* With skip_lookahead on a trace with look-ahead: of the (token, layer < L - 1) pairs whose next
 * layer is recorded, how many have a distance-1 prediction whose first candidate is that layer's
 * first stored expert (*right) of how many (*total): what the simulator reports as the recorded
 * predictor's accuracy (trace_first_hits; the file's attribute where it has one). Both 0
 * otherwise. A stream that reads the look-ahead rows checks the attribute against them once
 * every block's rows are checked (at open, or trace_stream_check_rest). */
void trace_stream_lookahead_first_hits(const trace_stream *s, uint64_t *right, uint64_t *total);
/* With check_rows_on_read: reads and checks every block no run has read yet, then returns the
 * first failure of any block's rows (as trace_read reports it), else MOESIM_OK. Without it (every
 * value checked at open): MOESIM_OK. */
moesim_status trace_stream_check_rest(trace_stream *s, moesim_error *err);
void trace_stream_close(trace_stream *s); /* accepts NULL */
/* The skeleton: meta, n_tokens, n_requests (its arrays are NULL); borrowed from the stream. */
const trace *trace_stream_tokens(const trace_stream *s);
/* Each request's tokens (per-token only when requests interleave in the file); borrowed. */
const trace_request_index *trace_stream_requests(const trace_stream *s);
/* Blocks (segments, with blocks_by_request) the cache holds (default 4; at least 1) and tokens
 * per block (0: keep; default about 4 MiB of rows); each dataset keeps up to twice as many
 * inflated chunks. A run that visits tokens of b blocks in turn (b requests in flight) wants
 * b + 1, or every visit reads a block again. Drops cached blocks. */
void trace_stream_set_cache(trace_stream *s, uint64_t block_tokens, uint32_t n_blocks);
uint64_t trace_stream_block_tokens(const trace_stream *s);
uint64_t trace_stream_blocks_read(const trace_stream *s); /* block (segment) reads after open */
/* Chunks inflated since open by the stream's own codec (datasets laid out as moesim writes
 * them; what HDF5 reads for other layouts is not counted). */
uint64_t trace_stream_chunks_inflated(const trace_stream *s);
/* True when the cache holds every block of the trace: each is then read once for a whole run,
 * whatever order the run visits them in. */
bool trace_stream_caches_every_block(const trace_stream *s);
/* The cached block holding `token` (read now when it is not cached) and the token's index in it
 * (*local): trace_experts(block, *local, layer) etc. are that token's rows. Borrowed: valid
 * until the next call. A read that fails after open succeeded (the file changed or the disk
 * failed) prints one line naming the file and aborts (with check_rows_on_read, a read of the
 * rows is reported by trace_stream_check_rest instead). */
const trace *trace_stream_row(trace_stream *s, uint64_t token, uint64_t *local);
/* The expert ids alone of tokens [first, first + n) into dst [n][L][k], bypassing the block
 * cache: a pass that needs nothing else inflates a third of the bytes. With check_rows_on_read
 * the ids may be read before their block is checked (a pass ahead of the run): each is then an
 * expert id or TRACE_NO_EXPERT, which also stands for one that is not and for every id of a
 * block whose ids cannot be read; what is wrong is reported by the block's check, as ever
 * (trace_stream_row, trace_stream_check_rest), and this call checks and keeps nothing. */
void trace_stream_read_experts(trace_stream *s, uint64_t first, uint64_t n, uint16_t *dst);

/* Writing a trace without holding it whole: open with the counts (known up front, e.g. from a
 * request plan), append blocks of tokens in order (a block as for trace_checker; each is
 * checked before it is staged), then commit, which writes what is left, syncs and renames.
 * Memory stays at a few chunks per dataset, whatever the trace length. The file is the one
 * trace_write makes of the whole trace (trace_write is open + one append + commit): bytes do
 * not depend on how the tokens were split into blocks. After a failed append, call
 * trace_writer_abort; commit and abort free the writer and leave no file behind on failure. */
typedef struct trace_writer trace_writer;
moesim_status trace_writer_open(const trace_meta *meta, uint64_t n_tokens, uint32_t n_requests,
                                const char *params_json, const char *path, trace_writer **out,
                                moesim_error *err);
moesim_status trace_writer_append(trace_writer *w, const trace *block, moesim_error *err);
moesim_status trace_writer_commit(trace_writer *w, moesim_error *err);
void trace_writer_abort(trace_writer *w); /* accepts NULL */

/* Row accessors. */
static inline size_t trace_route_index(const trace *t, uint64_t token, uint32_t layer) {
    return ((size_t)token * t->meta.n_layers + layer) * t->meta.top_k;
}
static inline const uint16_t *trace_experts(const trace *t, uint64_t token, uint32_t layer) {
    return t->expert_ids + trace_route_index(t, token, layer);
}
static inline const float *trace_gates(const trace *t, uint64_t token, uint32_t layer) {
    return t->gate_weights + trace_route_index(t, token, layer);
}
static inline size_t trace_lookahead_index(const trace *t, uint64_t token, uint32_t layer,
                                           uint32_t d /* 1..D */) {
    return (((size_t)token * t->meta.n_layers + layer) * t->meta.lookahead_depth + (d - 1)) *
           t->meta.lookahead_k;
}

/* Fills meta's geometry fields (model name, layers, experts, k, shared, gate rule, layer map)
 * from a model config. */
void trace_meta_from_model(trace_meta *meta, const model_geometry *m);

/* The model config (INI text) a trace made from a config file stores in its params_json
 * ("model_config"), so later commands need no --model; NULL when it stores none. Caller frees. */
char *trace_stored_model_config(const trace *t);

/* The geometry of trace t's model: `model_name` when given (name or path); else the model the
 * trace names, looked up by name along the data search path, and, where no folder has it, the
 * config the trace stores (trace_stored_model_config). A model whose MoE layers, experts, top-k
 * or shared experts differ from the trace's is refused. Errors name `trace_path`. */
moesim_status trace_model_load(const trace *t, const char *trace_path, const char *model_name,
                               model_geometry *model, moesim_error *err);

#endif
