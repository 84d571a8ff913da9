/* Batched generation over engine_seq_forward, and the log that `moesim record` turns into a
 * trace. Order of execution and sampling streams are documented in engine.h; results depend only
 * on the inputs, the options and the seed (not on thread count or timing). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/check.h"
#include "common/rng.h"
#include "engine/engine.h"

uint32_t engine_sample(float *logits, uint32_t n, float temperature, double u) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        logits[i] = expf((logits[i] - logits[best]) / temperature);
        sum += logits[i];
    }
    double target = u * sum, acc = 0;
    for (uint32_t i = 0; i < n; i++) {
        acc += logits[i];
        if (target < acc) return i;
    }
    return n - 1;
}

void engine_gen_log_free(engine_gen_log *log) {
    free(log->request_id);
    free(log->position);
    free(log->phase);
    free(log->token_id);
    free(log->expert_ids);
    free(log->gate_weights);
    free(log->importance);
    free(log->lookahead_ids);
    free(log->lookahead_scores);
    free(log->generated);
    memset(log, 0, sizeof *log);
}

typedef struct running {
    engine_seq *seq;
    uint64_t *rows; /* [n_prompt + gen_len] log row of each position */
    rng *r;
    int32_t next; /* token to feed at the next decode step */
} running;

moesim_status engine_generate(engine *e, const engine_request *reqs, uint32_t n_reqs,
                              const engine_gen_options *o, engine_gen_log *log,
                              moesim_error *err) {
    const engine_config *c = engine_config_of(e);
    memset(log, 0, sizeof *log);
    if (!n_reqs) return moesim_fail(err, MOESIM_EINPUT, "no requests to run");
    if (o->lookahead_depth &&
        (o->lookahead_k < 1 || o->lookahead_k > c->n_experts || o->lookahead_depth > 16))
        return moesim_fail(err, MOESIM_EINPUT,
                           "look-ahead: depth %u and K' %u, expected depth <= 16 and "
                           "1 <= K' <= %u experts", o->lookahead_depth, o->lookahead_k,
                           c->n_experts);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_reqs; i++) {
        if (!reqs[i].n_prompt)
            return moesim_fail(err, MOESIM_EINPUT, "request %u: empty prompt", i);
        total += reqs[i].n_prompt + (uint64_t)o->gen_len;
    }
    uint32_t L = c->n_moe_layers, K = c->top_k, D = o->lookahead_depth;
    uint32_t KP = D ? o->lookahead_k : 0;
    log->n_moe_layers = L;
    log->top_k = K;
    log->lookahead_depth = D;
    log->lookahead_k = KP;
    log->n_requests = n_reqs;
    log->gen_stride = o->gen_len + 1;
    log->request_id = moesim_xcalloc(total, sizeof *log->request_id);
    log->position = moesim_xcalloc(total, sizeof *log->position);
    log->phase = moesim_xcalloc(total, sizeof *log->phase);
    log->token_id = moesim_xcalloc(total, sizeof *log->token_id);
    log->expert_ids = moesim_xcalloc(total * L * K, sizeof *log->expert_ids);
    log->gate_weights = moesim_xcalloc(total * L * K, sizeof *log->gate_weights);
    log->importance = moesim_xcalloc(total * L, sizeof *log->importance);
    if (D) {
        log->lookahead_ids = moesim_xcalloc(total * L * D * KP, sizeof *log->lookahead_ids);
        log->lookahead_scores = moesim_xcalloc(total * L * D * KP, sizeof *log->lookahead_scores);
    }
    log->generated = moesim_xcalloc((size_t)n_reqs * log->gen_stride, sizeof *log->generated);

    uint32_t B = o->batch ? o->batch : 1;
    float *logits = moesim_xcalloc(c->vocab, sizeof *logits);
    running *run = moesim_xcalloc(B, sizeof *run);
    moesim_status st = MOESIM_OK;
    uint64_t row = 0;

    /* one token of request `ri` (slot `s`) at the sequence's next position */
    #define STEP(s, ri, tok, ph)                                                                   \
        do {                                                                                       \
            uint32_t pos_ = engine_seq_len(run[s].seq);                                            \
            engine_token_info info_ = {D, KP, log->expert_ids + row * L * K,                       \
                                       log->gate_weights + row * L * K,                            \
                                       D ? log->lookahead_ids + row * L * D * KP : NULL,           \
                                       D ? log->lookahead_scores + row * L * D * KP : NULL};       \
            st = engine_seq_forward(e, run[s].seq, (tok), o->pmap, logits, &info_, err);           \
            if (st) {                                                                              \
                moesim_error_prefix(err, "request %u position %u", (ri), pos_);                    \
                goto fail;                                                                         \
            }                                                                                      \
            log->request_id[row] = (ri);                                                           \
            log->position[row] = pos_;                                                             \
            log->phase[row] = (ph);                                                                \
            log->token_id[row] = (tok);                                                            \
            run[s].rows[pos_] = row++;                                                             \
        } while (0)

    for (uint32_t g0 = 0; g0 < n_reqs; g0 += B) {
        uint32_t nb = n_reqs - g0 < B ? n_reqs - g0 : B;
        for (uint32_t s = 0; s < nb; s++) {
            const engine_request *rq = &reqs[g0 + s];
            run[s].seq = engine_seq_create(e, rq->n_prompt + o->gen_len);
            run[s].rows = moesim_xcalloc(rq->n_prompt + o->gen_len, sizeof *run[s].rows);
            run[s].r = rng_create_stream(o->seed, g0 + s);
        }
        for (uint32_t s = 0; s < nb; s++) {
            const engine_request *rq = &reqs[g0 + s];
            for (uint32_t t = 0; t < rq->n_prompt; t++) STEP(s, g0 + s, rq->prompt[t], 0);
            run[s].next = (int32_t)engine_sample(logits, c->vocab, o->temperature,
                                                 rng_uniform(run[s].r));
            log->generated[(size_t)(g0 + s) * log->gen_stride] = run[s].next;
        }
        for (uint32_t step = 0; step < o->gen_len; step++)
            for (uint32_t s = 0; s < nb; s++) {
                STEP(s, g0 + s, run[s].next, 1);
                run[s].next = (int32_t)engine_sample(logits, c->vocab, o->temperature,
                                                     rng_uniform(run[s].r));
                log->generated[(size_t)(g0 + s) * log->gen_stride + step + 1] = run[s].next;
            }
        for (uint32_t s = 0; s < nb; s++) {
            uint32_t n = engine_seq_len(run[s].seq);
            for (uint32_t pos = 0; pos < n; pos++)
                for (uint32_t m = 0; m < L; m++)
                    log->importance[run[s].rows[pos] * L + m] =
                        engine_seq_importance(run[s].seq, m, pos);
            engine_seq_destroy(run[s].seq);
            free(run[s].rows);
            rng_destroy(run[s].r);
            memset(&run[s], 0, sizeof run[s]);
        }
    }
    #undef STEP
    MOESIM_ASSERT(row == total);
    log->n_tokens = total;
    free(run);
    free(logits);
    return MOESIM_OK;
fail:
    for (uint32_t s = 0; s < B; s++) {
        engine_seq_destroy(run[s].seq);
        free(run[s].rows);
        rng_destroy(run[s].r);
    }
    free(run);
    free(logits);
    engine_gen_log_free(log);
    return st;
}
