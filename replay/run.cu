/* The `cuda` backend of the replay executor (replay/exec.h; replay_run): the run loop, memory
 * system, pools and checks driven by real copies and kernels on a GPU. Its copy engines are in
 * replay/run_copy.cu, the state both files share in replay/run_internal.cuh. What lives
 * here is only what CUDA hardware has:
 *
 * Device memory, allocated once before the clock starts (no cudaMalloc on the hot path): the
 * non-expert weights of every layer (bf16: the checkpoint's, replay/weights.h, or random),
 * activations and a KV buffer, and one arena of the expert budget that the executor's pools
 * (core/block_pool.h) carve into fixed-size blocks per precision (one block holds one part: gate,
 * up or down, in the kernels' block format). Host: the store of experts placed by memsys_place, in
 * pinned memory (cudaHostAlloc) and an SSD file: the checkpoint's in the kernels' formats, or
 * random bytes from a seeded xorshift stream.
 *
 * Copies: the host engine asks memsys for the next chunk (memsys_next_chunk) and keeps at most
 * COPY_WINDOW chunks in flight, one cudaMemcpyAsync per part the chunk spans (demand chunks on
 * the demand stream, the others on the background stream), each chunk ending with an event;
 * chunks retire in submission order (memsys_chunk_done, then memsys_deliver). The SSD engine
 * reads its chunks with pread (O_DIRECT) into pinned bounce slots, on the host thread. The
 * compute stream waits (cudaStreamWaitEvent) for the event of a part's last chunk right before
 * each expert op, and an event before every op lets the step's end check that no expert started
 * before its copy ended.
 *
 * Time: ops are enqueued, not done: the executor waits for the compute stream (wait_compute)
 * before every on_route, as an offloading engine waits for the router's output, and unpins the
 * route's experts only then. Op and copy times come from CUDA events (ns from the run's first
 * event, which the host clock starts with), resolved when the step ends. */
#include "replay/run_internal.cuh"

extern "C" bool replay_built_with_cuda(void) { return true; }

extern "C" moesim_status replay_device_check(moesim_error *err) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        cudaGetLastError();
        /* without a driver the static runtime says "driver version is insufficient": name
         * both possibilities, and the way to run without a GPU */
        return moesim_fail(err, MOESIM_EINPUT,
                           "no CUDA GPU or driver on this machine (%s); --backend cpu runs "
                           "without one",
                           e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
    }
    return MOESIM_OK;
}

/* ---- compute ---- */

/* An op on the compute stream between two events; `need` is a copy event it waited for. */
static void op_begin_need(rp *s, const char *cat, const char *name, int layer, cudaEvent_t need) {
    rp::op_rec o;
    o.ev0 = ev_get(s);
    o.ev1 = ev_get(s);
    o.cat = cat;
    o.layer = layer;
    o.need = need;
    snprintf(o.name, sizeof o.name, "%s", name);
    CUDA_CHECK(cudaEventRecord(o.ev0, s->s_comp));
    s->ops.push_back(o);
}

static void cuda_op_begin(replay_exec *x, const char *cat, const char *name, int layer) {
    op_begin_need(be_of(x), cat, name, layer, NULL);
}

static void cuda_op_end(replay_exec *x) {
    rp *s = be_of(x);
    CUDA_CHECK(cudaEventRecord(s->ops.back().ev1, s->s_comp));
}

static void gemm(rp *s, float *y, moesim_precision p, const void *w, const float *x, size_t rows,
                 size_t cols, size_t n) {
    replay_gemm(&s->blas, s->x_bf16, s->s_comp, y, p, w, x, rows, cols, n);
}

static void run_attention(rp *s, const sim_schedule_step *sd, uint32_t ml) {
    const replay_exec *x = s->x;
    const model_geometry *m = x->m;
    uint32_t n = sd->n_tokens;
    uint64_t H = m->hidden;
    uint16_t *w = s->w_attn[ml];
    gemm(s, s->y, PREC_BF16, w, s->x_act, s->q_dim + 2 * s->kv_dim, H, n);
    /* one attention call per request's run of tokens in the step (causal over its context) */
    for (uint32_t i = 0; i < n;) {
        uint32_t tok = x->sch.tokens[sd->first + i];
        uint32_t r = x->tr->request_id[tok], j = i + 1;
        while (j < n && x->tr->request_id[x->sch.tokens[sd->first + j]] == r) j++;
        uint32_t last = x->tr->position[x->sch.tokens[sd->first + j - 1]];
        kern_attention_prefill_cuda(s->attn_out, s->probs, s->y, s->kv, s->kv + s->kv_dim, j - i,
                                    m->n_heads, m->n_kv_heads, m->head_dim, (size_t)last + 1,
                                    s->s_comp);
        i = j;
    }
    /* into y, not x: x stays the layers' fixed input, so values never grow layer over layer
     * (the activations are synthetic, whatever the weights; what is timed is the shapes) */
    gemm(s, s->y, PREC_BF16, w + (s->q_dim + 2 * s->kv_dim) * H, s->attn_out, H, s->q_dim, n);
}

/* A SwiGLU FFN of width `inter` from bf16 weights [gate | up | down]. */
static void run_ffn(rp *s, const uint16_t *w, uint64_t inter, uint32_t n) {
    uint64_t H = s->x->m->hidden;
    gemm(s, s->h1, PREC_BF16, w, s->x_act, inter, H, n);
    gemm(s, s->h2, PREC_BF16, w + inter * H, s->x_act, inter, H, n);
    kern_swiglu_cuda(s->h1, s->h1, s->h2, inter * n, s->s_comp);
    gemm(s, s->y, PREC_BF16, w + 2 * inter * H, s->h1, H, inter, n);
}

static void cuda_run(replay_exec *x, const run_op *op) {
    rp *s = be_of(x);
    const model_geometry *m = x->m;
    uint32_t ml = op->layer, n = op->n_tokens;
    switch (op->kind) {
    case RUN_OP_ATTENTION:
        run_attention(s, op->step, ml);
        break;
    case RUN_OP_DENSE:
        run_ffn(s, s->w_dense[ml], m->dense_inter, n);
        break;
    case RUN_OP_ROUTER:
        gemm(s, s->y, PREC_BF16, s->w_router[ml], s->x_act, m->n_experts, m->hidden, n);
        break;
    case RUN_OP_SHARED:
        run_ffn(s, s->w_shared[ml], (uint64_t)m->shared_inter * m->n_shared_experts, n);
        break;
    case RUN_OP_COMBINE:
        replay_combine(s->y, s->ys, s->gates_dev, n, m->top_k, m->hidden, s->s_comp);
        break;
    case RUN_OP_LM_HEAD:
        if (n) gemm(s, s->logits, PREC_BF16, s->w_lm, s->x_act, m->vocab, m->hidden, n);
        break;
    }
}

/* The expert's ops on the compute stream, after it waits for the events of the parts in mask
 * still in flight (the latest part's event is the copy the ops are checked against). */
static void cuda_expert(replay_exec *x, uint32_t layer, uint32_t e, moesim_precision p,
                        uint32_t tok, uint32_t mask) {
    rp *s = be_of(x);
    size_t base = memsys_lep(&x->ms, layer, e, p) * PART_COUNT;
    uint64_t H = x->m->hidden, I = x->m->expert_inter;
    for (int part = 0; part < PART_COUNT; part++)
        if (mask & (1u << part) && s->ready[base + part])
            CUDA_CHECK(cudaStreamWaitEvent(s->s_comp, s->ready[base + part], 0));
    cudaEvent_t need = NULL;
    for (int part = PART_COUNT - 1; part >= 0 && !need; part--)
        if (mask & (1u << part)) need = s->ready[base + part];
    char name[64];
    if (mask & (1u << PART_GATE)) {
        replay_exec_expert_name(name, sizeof name, layer, e, p, tok, PART_GATE);
        op_begin_need(s, "expert", name, (int)layer, need);
        gemm(s, s->h1, p, block_ptr(s, base + PART_GATE), s->x_act, I, H, tok);
        gemm(s, s->h2, p, block_ptr(s, base + PART_UP), s->x_act, I, H, tok);
        kern_swiglu_cuda(s->h1, s->h1, s->h2, (size_t)I * tok, s->s_comp);
        cuda_op_end(x);
    }
    if (mask & (1u << PART_DOWN)) {
        replay_exec_expert_name(name, sizeof name, layer, e, p, tok, PART_DOWN);
        op_begin_need(s, "expert", name, (int)layer, need);
        gemm(s, s->y, p, block_ptr(s, base + PART_DOWN), s->h1, H, I, tok);
        cuda_op_end(x);
    }
}

/* ---- steps and their times ---- */

static void cuda_step_begin(replay_exec *x, uint64_t step) {
    (void)step;
    rp *s = be_of(x);
    s->ev_used = 0;
    cuda_wait_compute(x);
    s->ev_step = ev_get(s);
    CUDA_CHECK(cudaEventRecord(s->ev_step, s->s_comp));
}

/* Reads the retired chunks' times (copy engine busy time, h2d timeline track) and frees their
 * events for reuse. The chunks of one engine do not overlap: busy time counts each ns once. */
static void chunks_account(rp *s) {
    replay_exec *x = s->x;
    for (const rp_chunk &c : s->done_chunks) {
        uint64_t a = ev_ns(s, c.ev0), b = ev_ns(s, c.ev1);
        if (a < s->copy_last_end_ns) a = s->copy_last_end_ns;
        if (b > a) s->h2d_busy_ns += b - a;
        if (b > s->copy_last_end_ns) s->copy_last_end_ns = b;
        if (x->tl.on && b > a) {
            char name[64];
            snprintf(name, sizeof name, "L%u e%u %s %s", c.layer, c.expert,
                     precision_name((moesim_precision)c.prec),
                     c.cls == POLICY_DEMAND     ? "demand"
                     : c.cls == POLICY_PREFETCH ? "prefetch"
                                                : "background");
            sim_timeline_slice(&x->tl, SIM_TRACK_H2D, "copy", name, a, b);
        }
        s->cev_free.push_back(c.ev0);
        s->cev_free.push_back(c.ev1);
    }
    s->done_chunks.clear();
}

/* The stream is idle: the step's op events resolve (times, order checks), then the chunks'. */
static void cuda_step_end(replay_exec *x, uint64_t step) {
    rp *s = be_of(x);
    x->step_start[step] = ev_ns(s, s->ev_step);
    x->step_end[step] = ev_ns(s, s->ops.back().ev1);
    for (const rp::op_rec &o : s->ops) {
        replay_op_times t = {ev_ns(s, o.ev0), ev_ns(s, o.ev1), REPLAY_NO_NEED, -1};
        if (o.need) { /* the expert must not start before its copy ended */
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, o.need, o.ev0));
            t.order = ms < 0;
            t.need_ns = ev_ns(s, o.need);
        }
        replay_exec_op_done(x, o.cat, o.name, o.layer, &t);
    }
    s->ops.clear();
    chunks_account(s);
}

/* ---- setup ---- */

static void *dev_alloc(rp *s, uint64_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    s->device_alloc += bytes;
    return p;
}

static void *dev_random(rp *s, uint64_t bytes, uint64_t seed) {
    void *d = dev_alloc(s, bytes);
    void *h = moesim_xmalloc(bytes ? bytes : 16);
    replay_fill_random(h, bytes, seed);
    CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* A non-expert weight buffer of kind k for model layer `layer` on the device: the checkpoint's
 * (replay_weights_nonexpert) or random bytes from `seed`. */
static uint16_t *dev_weights(rp *s, const replay_weights *w, replay_nonexpert k, uint32_t layer,
                             uint64_t seed) {
    uint64_t bytes = replay_nonexpert_elems(s->x->m, k) * 2;
    if (!w) return (uint16_t *)dev_random(s, bytes, seed);
    void *d = dev_alloc(s, bytes);
    uint16_t *h = (uint16_t *)moesim_xmalloc(bytes ? bytes : 16);
    replay_weights_nonexpert(w, k, layer, h);
    CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return (uint16_t *)d;
}

/* The run's store: the caller's when it holds exactly this run's placement (the same precisions,
 * each expert in DRAM or on the SSD alike) of this run's weights, else the run's own. */
static moesim_status store_choose(rp *s, const bool held[PREC_COUNT], moesim_error *err) {
    const replay_exec *x = s->x;
    const replay_inputs *in = x->in;
    const replay_store *b = in->store;
    bool fits = b && b->weights == in->weights && !memcmp(&b->m, x->m, sizeof *x->m);
    size_t LE = (size_t)x->L * x->E;
    for (int p = 0; fits && p < PREC_COUNT; p++) {
        fits = b->held[p] == held[p];
        for (size_t le = 0; fits && held[p] && le < LE; le++)
            fits =
                (b->host_off[p][le] == UINT64_MAX) == (x->ms.on_ssd[memsys_lep_of(LE, le, p)] != 0);
    }
    if (fits) {
        s->store = b;
        return MOESIM_OK;
    }
    moesim_status st = replay_store_make(x->m, held, x->ms.on_ssd, in->ssd_dir, in->weight_seed,
                                         in->weights, &s->own_store, err);
    if (!st) s->store = s->own_store;
    return st;
}

/* Pinned bounce slots for SSD chunks waiting for the H2D engine, one chunk each. memsys hands out
 * an SSD chunk only while the bytes staged (read, not yet copied on) fit sim.bounce_mib, and
 * every chunk is at least the smallest chunk any transfer can have (a whole chunk, or the tail
 * of a transfer of some parts at a held precision), so that many slots never run out. */
static moesim_status bounce_alloc(rp *s, moesim_error *err) {
    const replay_exec *x = s->x;
    if (!s->store->n_on_ssd) return MOESIM_OK;
    uint64_t chunk = x->ms.cfg.chunk_bytes, min_chunk = chunk, max_dev = 0;
    for (int p = 0; p < PREC_COUNT; p++) {
        if (!s->store->held[p]) continue;
        for (uint32_t mask = 1; mask <= POLICY_PARTS_ALL; mask++) {
            uint64_t bytes = 0;
            for (int part = 0; part < PART_COUNT; part++)
                if (mask & (1u << part)) bytes += x->part_bytes[p][part];
            uint64_t tail = bytes % chunk ? bytes % chunk : chunk;
            if (tail < min_chunk) min_chunk = tail;
        }
        for (int part = 0; part < PART_COUNT; part++) { /* a chunk's kernel bytes, at most */
            uint64_t d = (uint64_t)(((unsigned __int128)chunk * s->store->dev_part_bytes[p][part] +
                                     x->part_bytes[p][part] - 1) /
                                    x->part_bytes[p][part]);
            if (d > max_dev) max_dev = d;
        }
    }
    /* each piece (one per part, at most 3) rounds out to O_DIRECT alignment on both sides */
    s->slot_bytes =
        (max_dev + PART_COUNT + 2 * PART_COUNT * SSD_ALIGN + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
    uint64_t n_slots = x->ms.cfg.bounce_bytes / min_chunk;
    MOESIM_ASSERT(n_slots >= 1 && n_slots < INT32_MAX);
    if (cudaHostAlloc((void **)&s->bounce, n_slots * s->slot_bytes, cudaHostAllocDefault) !=
        cudaSuccess) {
        cudaGetLastError();
        return moesim_fail(err, MOESIM_ENOMEM,
                           "cannot pin %.2f GiB of SSD bounce slots (%" PRIu64 " chunks of up to "
                           "%" PRIu64 " bytes: sim.bounce_mib over the smallest copy chunk)",
                           (double)(n_slots * s->slot_bytes) / GIB, n_slots, s->slot_bytes);
    }
    for (int32_t i = (int32_t)n_slots - 1; i >= 0; i--) s->free_slots.push_back(i);
    return MOESIM_OK;
}

static moesim_status cuda_check(replay_exec *x, moesim_error *err) {
    const model_geometry *m = x->m;
    if (x->in->weights) { /* the caller's contract: the checkpoint's own geometry */
        model_geometry g;
        replay_weights_geometry(x->in->weights, m->name, &g);
        MOESIM_ASSERT(!memcmp(&g, m, sizeof g));
    }
    if (!m->n_heads || !m->n_kv_heads || !m->head_dim || m->attention != ATTENTION_GQA)
        return moesim_fail(err, MOESIM_EINPUT,
                           "model '%s': replay times grouped-query attention only (n_heads, "
                           "n_kv_heads, head_dim); MLA and linear attention are not replayed",
                           m->name);
    /* the SSD path always stages in DRAM here (pread into pinned slots, then PCIe) */
    if (x->set.bounce_mib * 1024 < x->set.chunk_kib)
        return moesim_fail(err, MOESIM_EINPUT,
                           "[sim] bounce_mib = %" PRIu64 ": expected at least one copy chunk "
                           "(sim.chunk_kib = %" PRIu64 ")",
                           x->set.bounce_mib, x->set.chunk_kib);
    return MOESIM_OK;
}

/* Host placement keeps the bounce buffer's DRAM free. */
static uint64_t cuda_placement_dram(const replay_exec *x) {
    uint64_t dram = x->in->hw->dram_bytes, bounce = x->ms.cfg.bounce_bytes;
    return dram > bounce ? dram - bounce : 0;
}

static moesim_status cuda_setup(replay_exec *x, moesim_error *err) {
    rp *s = new rp();
    s->x = x;
    x->be_state = s;
    moesim_status st;
    const model_geometry *m = x->m;
    size_t dev_free = 0, dev_total = 0;
    CUDA_CHECK(cudaMemGetInfo(&dev_free, &dev_total));
    x->device_used_before = dev_total - dev_free;

    /* host store: the caller's when it holds this placement of this run's weights (validate
     * shares one over its runs), else the run's own */
    bool held[PREC_COUNT];
    replay_placed_precisions(x->pm, x->pol, x->prec, x->policy_only, x->part_bytes, held);
    if ((st = store_choose(s, held, err))) return st;
    if ((st = bounce_alloc(s, err))) return st;
    for (int p = 0; p < PREC_COUNT; p++) /* blocks only for the formats this run holds */
        for (int part = 0; part < PART_COUNT; part++)
            s->dev_part_bytes[p][part] = s->store->held[p] ? s->store->dev_part_bytes[p][part] : 0;
    uint64_t block_bytes[PREC_COUNT];
    block_pool_block_bytes(s->dev_part_bytes, block_bytes);
    /* device: emulate the card, then allocate everything once */
    uint64_t H = m->hidden;
    s->q_dim = m->n_heads && m->head_dim ? (uint64_t)m->n_heads * m->head_dim : H;
    s->kv_dim = (uint64_t)m->n_kv_heads * m->head_dim;
    uint64_t attn_w = replay_nonexpert_elems(m, REPLAY_NX_ATTENTION) * 2;
    uint64_t S = (uint64_t)m->shared_inter * m->n_shared_experts, D = m->dense_inter;
    uint64_t shared_w = replay_nonexpert_elems(m, REPLAY_NX_SHARED) * 2;
    uint64_t dense_w = replay_nonexpert_elems(m, REPLAY_NX_DENSE) * 2;
    uint64_t router_w = replay_nonexpert_elems(m, REPLAY_NX_ROUTER) * 2;
    uint64_t lm_w = replay_nonexpert_elems(m, REPLAY_NX_LM_HEAD) * 2;
    uint64_t T = x->sch.max_step_tokens, B = x->set.batch_size;
    uint64_t wide = H > s->q_dim + 2 * s->kv_dim ? H : s->q_dim + 2 * s->kv_dim;
    if (m->n_experts > wide) wide = m->n_experts;
    uint64_t inter = m->expert_inter;
    if (S > inter) inter = S;
    if (D > inter) inter = D;
    uint64_t xcols = H > inter ? H : inter;
    if (s->q_dim > xcols) xcols = s->q_dim;
    uint32_t max_ctx = 1;
    for (uint64_t i = 0; i < x->tr->n_tokens; i++)
        if (x->tr->position[i] + 1 > max_ctx) max_ctx = x->tr->position[i] + 1;
    s->max_ctx = max_ctx;
    uint64_t arena_bytes = block_pool_arena_bytes(x->bud.per_layer, x->bud.pool_cap_bytes, x->L,
                                                  x->bud.expert_budget_bytes);
    /* every device allocation of the run, sized once: summed before any is made, then made */
    const uint64_t x_b = T * H * 4, y_b = T * wide * 4, h_b = T * inter * 4;
    const uint64_t xbf_b = T * xcols * 2, attn_out_b = T * s->q_dim * 4;
    const uint64_t logits_b = B * m->vocab * 4, ys_b = T * m->top_k * H * 2;
    const uint64_t gates_b = T * m->top_k * 4;
    const uint64_t kv_b = ((uint64_t)max_ctx * s->kv_dim * 2 + s->kv_dim) * 4; /* one layer's */
    const uint64_t probs_b = (uint64_t)ATTN_Q_CHUNK * m->n_heads * max_ctx * 4;
    const uint64_t sizes[] = {
        arena_bytes,                               /* expert arena */
        attn_w * m->n_layers,                      /* attention weights */
        router_w * m->n_moe_layers,                /* routers */
        shared_w * m->n_moe_layers,                /* shared experts */
        dense_w * (m->n_layers - m->n_moe_layers), /* dense FFNs */
        lm_w,                                      /* LM head */
        x_b,
        y_b,
        2 * h_b,
        xbf_b,
        attn_out_b,
        logits_b,
        kv_b,
        probs_b,
        ys_b,
        gates_b,
    };
    uint64_t planned = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) planned += sizes[i];
    if ((st = replay_budget_fit_device(&x->bud, planned, dev_free, RESERVE_BYTES, err))) return st;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->s_comp, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->s_demand, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->s_bg, cudaStreamNonBlocking));
    if ((st = cublas_lazy_handle_init(&s->blas, s->s_comp, err))) return st;
    s->arena = (uint8_t *)dev_alloc(s, arena_bytes);
    size_t LEP = (size_t)x->L * x->E * PREC_COUNT;
    block_pool_init(&x->pool, arena_bytes, block_bytes, LEP * PART_COUNT);
    s->w_attn = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_attn);
    s->w_router = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_router);
    s->w_shared = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_shared);
    s->w_dense = (uint16_t **)moesim_xcalloc(m->n_layers, sizeof *s->w_dense);
    const replay_weights *w = x->in->weights;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        s->w_attn[l] = dev_weights(s, w, REPLAY_NX_ATTENTION, l, x->in->weight_seed * 977 + l);
        if (m->is_moe_layer[l]) {
            s->w_router[l] = dev_weights(s, w, REPLAY_NX_ROUTER, l, l + 7);
            if (shared_w) s->w_shared[l] = dev_weights(s, w, REPLAY_NX_SHARED, l, l + 11);
        } else if (dense_w) {
            s->w_dense[l] = dev_weights(s, w, REPLAY_NX_DENSE, l, l + 13);
        }
    }
    s->w_lm = dev_weights(s, w, REPLAY_NX_LM_HEAD, 0, 17);
    s->x_act = (float *)dev_random(s, x_b, 19);
    s->y = (float *)dev_alloc(s, y_b);
    s->h1 = (float *)dev_alloc(s, h_b);
    s->h2 = (float *)dev_alloc(s, h_b);
    s->x_bf16 = (uint16_t *)dev_alloc(s, xbf_b);
    s->attn_out = (float *)dev_alloc(s, attn_out_b);
    s->logits = (float *)dev_alloc(s, logits_b);
    s->kv = (float *)dev_random(s, kv_b, 23);
    s->probs = (float *)dev_alloc(s, probs_b);
    s->ys = (uint16_t *)dev_random(s, ys_b, 29);
    s->gates_dev = (float *)dev_alloc(s, gates_b);
    CUDA_CHECK(cudaMemset(s->gates_dev, 0, gates_b));
    MOESIM_ASSERT(s->device_alloc == planned);
    CUDA_CHECK(cudaEventCreate(&s->ev_start));
    s->ready = (cudaEvent_t *)moesim_xcalloc(LEP * PART_COUNT, sizeof(cudaEvent_t));
    return MOESIM_OK;
}

static void cuda_teardown(replay_exec *x) {
    rp *s = be_of(x);
    if (!s) return;
    for (cudaEvent_t e : s->ev_pool) cudaEventDestroy(e);
    for (cudaEvent_t e : s->cev_all) cudaEventDestroy(e);
    if (s->ev_start) cudaEventDestroy(s->ev_start);
    replay_store_destroy(s->own_store);
    if (s->bounce) cudaFreeHost(s->bounce);
    void *dev[] = {s->arena,    s->w_lm, s->x_act, s->y,      s->h1, s->h2,       s->x_bf16,
                   s->attn_out, s->kv,   s->probs, s->logits, s->ys, s->gates_dev};
    for (void *d : dev)
        if (d) cudaFree(d);
    for (uint32_t l = 0; s->w_attn && l < x->m->n_layers; l++) {
        cudaFree(s->w_attn[l]);
        if (s->w_router[l]) cudaFree(s->w_router[l]);
        if (s->w_shared[l]) cudaFree(s->w_shared[l]);
        if (s->w_dense[l]) cudaFree(s->w_dense[l]);
    }
    free(s->w_attn);
    free(s->w_router);
    free(s->w_shared);
    free(s->w_dense);
    cublas_lazy_handle_free(&s->blas);
    if (s->s_comp) cudaStreamDestroy(s->s_comp);
    if (s->s_demand) cudaStreamDestroy(s->s_demand);
    if (s->s_bg) cudaStreamDestroy(s->s_bg);
    free(s->ready);
    delete s;
    x->be_state = NULL;
}

/* ---- warm-up, clock, drain ---- */

/* Copies the loads the policy issued during warm-up (memsys.warm: they are resident in memsys
 * already) before the clock starts, part by part from DRAM or through a bounce slot. */
static void cuda_warm_copy(replay_exec *x) {
    rp *s = be_of(x);
    for (uint32_t i = 0; i < x->ms.n_warm; i++) {
        uint32_t lep = x->ms.warm[i], p = memsys_lep_precision(&x->ms, lep),
                 le = memsys_lep_le(&x->ms, lep);
        const replay_store *st = s->store;
        for (int part = 0; part < PART_COUNT; part++) {
            if (!(x->ms.warm_parts[i] & (1u << part))) continue;
            uint8_t *dst = block_ptr(s, (size_t)lep * PART_COUNT + part);
            uint64_t off = cuda_part_blob_offset(s, p, part), n = s->dev_part_bytes[p][part];
            if (st->host_off[p][le] != UINT64_MAX) {
                CUDA_CHECK(cudaMemcpy(dst, st->host[p] + st->host_off[p][le] + off, n,
                                      cudaMemcpyHostToDevice));
                continue;
            }
            uint64_t piece = s->slot_bytes - 2 * SSD_ALIGN; /* what one slot reads at a time */
            for (uint64_t o = 0; o < n; o += piece) {
                uint64_t len = n - o < piece ? n - o : piece, used = 0;
                const uint8_t *src = cuda_ssd_pread(s, p, le, off + o, len, 0, &used);
                CUDA_CHECK(cudaMemcpy(dst + o, src, len, cudaMemcpyHostToDevice));
            }
        }
    }
}

/* The event clock and the host clock start together, the device idle. */
static void cuda_clock_start(replay_exec *x) {
    rp *s = be_of(x);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaEventRecord(s->ev_start, s->s_comp));
    CUDA_CHECK(cudaEventSynchronize(s->ev_start));
    x->t0_ns = replay_exec_clock_ns();
}

static void cuda_drain(replay_exec *x) {
    rp *s = be_of(x);
    cuda_pump(s);
    while (!s->inflight.empty()) cuda_wait_next_chunk(s);
    for (int e = 0; e < MEMSYS_ENGINES; e++)
        for (int c = 0; c < MEMSYS_CLASSES; c++) MOESIM_ASSERT(x->ms.head[e][c] == NONE);
    CUDA_CHECK(cudaDeviceSynchronize());
}

static void cuda_finish(replay_exec *x) {
    rp *s = be_of(x);
    chunks_account(s); /* the drained copies */
    x->h2d_busy_ns = s->h2d_busy_ns;
    x->ssd_busy_ns = s->ssd_busy_ns;
    x->h2d_copied_bytes = s->h2d_dev_bytes;
    x->device_alloc_bytes = s->device_alloc;
    size_t dev_free = 0, dev_total = 0; /* while the run holds everything */
    CUDA_CHECK(cudaMemGetInfo(&dev_free, &dev_total));
    x->device_used_peak = dev_total - dev_free;
}

extern "C" const replay_backend replay_backend_cuda = {
    "cuda",
    cuda_check,
    cuda_placement_dram,
    cuda_setup,
    cuda_teardown,
    cuda_copy_kick,
    cuda_part_released,
    cuda_warm_copy,
    cuda_clock_start,
    cuda_step_begin,
    cuda_step_end,
    cuda_wait_compute,
    cuda_wait_copy,
    cuda_expert_wait,
    cuda_op_begin,
    cuda_run,
    cuda_op_end,
    cuda_expert,
    cuda_drain,
    NULL, /* io_status: an SSD read error aborts (ssd_pread) */
    cuda_finish,
};

extern "C" moesim_status replay_run(const replay_inputs *in, const char *policy_name,
                                    config *settings, sim_result *out, replay_checks *checks,
                                    moesim_error *err) {
    moesim_status st = replay_device_check(err);
    if (st) return st;
    return replay_exec_run(&replay_backend_cuda, in, policy_name, settings, out, checks, err);
}
