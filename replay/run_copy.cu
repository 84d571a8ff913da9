/* The `cuda` backend's copy engines (replay/run_internal.cuh): the host engine's chunks as
 * cudaMemcpyAsync on the demand or background stream, each chunk ending with an event and
 * retired in submission order; the SSD engine's pread (O_DIRECT) into pinned bounce slots; the
 * compute stream's waits on a part's last chunk. */
#include "replay/run_internal.cuh"

/* A part left HBM: no copy will mark it landed any more. */
void cuda_part_released(replay_exec *x, size_t part_index) { be_of(x)->ready[part_index] = NULL; }

/* Byte `acct` of part `part` at precision p (the memory system's units) in the kernel format:
 * chunks split parts in proportion, so a part's chunks cover its kernel bytes exactly. */
static uint64_t dev_offset(const rp *s, uint32_t p, int part, uint64_t acct) {
    return (uint64_t)((unsigned __int128)acct * s->dev_part_bytes[p][part] /
                      s->x->part_bytes[p][part]);
}

uint64_t cuda_part_blob_offset(const rp *s, uint32_t p, int part) {
    uint64_t o = 0;
    for (int q = 0; q < part; q++) o += s->dev_part_bytes[p][q];
    return o;
}

/* Reads kernel bytes [lo, lo + n) of (layer, expert, p)'s blob from the SSD file into the bounce
 * slot `slot` after its first *used bytes (O_DIRECT: the aligned range covering them); returns
 * where byte lo landed and adds the bytes the read took to *used. An I/O error mid-run cannot be
 * recovered: reported, aborted. */
const uint8_t *cuda_ssd_pread(rp *s, uint32_t p, size_t le, uint64_t lo, uint64_t n, int32_t slot,
                              uint64_t *used) {
    const replay_store *st = s->store;
    uint64_t a = lo / SSD_ALIGN * SSD_ALIGN, b = (lo + n + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
    MOESIM_ASSERT(b <= st->ssd_stride[p] && *used + (b - a) <= s->slot_bytes);
    uint8_t *dst = s->bounce + (uint64_t)slot * s->slot_bytes + *used;
    for (uint64_t o = a; o < b;) {
        ssize_t r = pread(st->ssd_fd[p], dst + (o - a), b - o, (off_t)(st->ssd_off[p][le] + o));
        if (r <= 0) cuda_check_fail("pread", strerror(r < 0 ? errno : EIO), __FILE__, __LINE__);
        o += (uint64_t)r;
    }
    *used += b - a;
    return dst + (lo - a);
}

/* The SSD engine: reads every chunk memsys hands it, synchronously on the host thread, into a
 * bounce slot, then reports it done so the H2D engine can copy it on (memsys stops handing out
 * chunks while its bounce buffer is full). */
static void ssd_kick(rp *s) {
    if (s->ssd_running) return; /* the loop below takes the new work */
    s->ssd_running = true;
    replay_exec *x = s->x;
    memsys_chunk c;
    while (memsys_next_chunk(&x->ms, MEMSYS_SSD, &c)) {
        const memsys_xfer *xf = &x->ms.xf[c.xfer];
        MOESIM_ASSERT(!s->free_slots.empty()); /* sized from the bounce buffer (bounce_alloc) */
        rp_staged sg = {c.offset, c.bytes, s->free_slots.back(), {NULL, NULL, NULL}};
        s->free_slots.pop_back();
        memsys_piece pc[PART_COUNT];
        uint32_t n = memsys_chunk_pieces(&x->ms, &c, pc);
        size_t le = (size_t)xf->layer * x->E + xf->expert;
        uint64_t used = 0, t0 = replay_exec_clock_ns();
        for (uint32_t i = 0; i < n; i++) {
            uint64_t a = dev_offset(s, xf->prec, pc[i].part, pc[i].part_offset);
            uint64_t b = dev_offset(s, xf->prec, pc[i].part, pc[i].part_offset + pc[i].bytes);
            sg.src[i] =
                cuda_ssd_pread(s, xf->prec, le, cuda_part_blob_offset(s, xf->prec, pc[i].part) + a,
                               b - a, sg.slot, &used);
        }
        uint64_t t1 = replay_exec_clock_ns();
        s->ssd_busy_ns += t1 - t0;
        if (x->tl.on) {
            char name[64];
            snprintf(name, sizeof name, "L%u e%u %s ssd", xf->layer, xf->expert,
                     precision_name((moesim_precision)xf->prec));
            sim_timeline_slice(&x->tl, SIM_TRACK_SSD, "ssd", name, t0 - x->t0_ns, t1 - x->t0_ns);
        }
        if (s->staged.size() <= c.xfer) s->staged.resize(c.xfer + 1);
        s->staged[c.xfer].push_back(sg);
        memsys_xfer fin;
        bool landed = memsys_chunk_done(&x->ms, &c, &fin); /* staged: the H2D engine goes on */
        MOESIM_ASSERT(!landed);
    }
    s->ssd_running = false;
}

/* The H2D engine: keeps COPY_WINDOW chunks in flight, each the chunk memsys hands out next (so a
 * demand load overtakes queued prefetches at the next chunk boundary), one cudaMemcpyAsync per
 * part it spans, from the pinned store or the bounce slot its SSD read filled. */
static void h2d_kick(rp *s) {
    replay_exec *x = s->x;
    memsys_chunk c;
    while (s->inflight.size() < COPY_WINDOW && memsys_next_chunk(&x->ms, MEMSYS_H2D, &c)) {
        const memsys_xfer *xf = &x->ms.xf[c.xfer];
        uint32_t p = xf->prec;
        memsys_piece pc[PART_COUNT];
        uint32_t n = memsys_chunk_pieces(&x->ms, &c, pc);
        rp_chunk rc = {c, cev_get(s), cev_get(s), -1,       0,
                       0, xf->layer,  xf->expert, xf->prec, xf->cls};
        const uint8_t *src[PART_COUNT];
        size_t le = (size_t)xf->layer * x->E + xf->expert;
        if (xf->via_ssd) { /* the SSD chunk of the same bytes (chunks of both engines align) */
            MOESIM_ASSERT(s->staged.size() > c.xfer && !s->staged[c.xfer].empty());
            rp_staged sg = s->staged[c.xfer].front();
            s->staged[c.xfer].pop_front();
            MOESIM_ASSERT(sg.offset == c.offset && sg.bytes == c.bytes);
            rc.slot = sg.slot;
            memcpy(src, sg.src, sizeof src);
        } else {
            MOESIM_ASSERT(s->store->host_off[p][le] != UINT64_MAX);
            for (uint32_t i = 0; i < n; i++)
                src[i] = s->store->host[p] + s->store->host_off[p][le] +
                         cuda_part_blob_offset(s, p, pc[i].part) +
                         dev_offset(s, p, pc[i].part, pc[i].part_offset);
        }
        cudaStream_t st = xf->cls == POLICY_DEMAND ? s->s_demand : s->s_bg;
        if (s->xfer_last.size() <= c.xfer) {
            s->xfer_last.resize(c.xfer + 1, NULL);
            s->xfer_stream.resize(c.xfer + 1, NULL);
        }
        if (c.first) s->xfer_last[c.xfer] = NULL;
        /* promoted mid-copy: its earlier chunks went on the other stream; a part's last event
         * must mean the whole part landed */
        if (s->xfer_last[c.xfer] && s->xfer_stream[c.xfer] != st)
            CUDA_CHECK(cudaStreamWaitEvent(st, s->xfer_last[c.xfer], 0));
        CUDA_CHECK(cudaEventRecord(rc.ev0, st));
        size_t base = memsys_lep(&x->ms, xf->layer, xf->expert, p) * PART_COUNT;
        for (uint32_t i = 0; i < n; i++) {
            int part = pc[i].part;
            uint64_t a = dev_offset(s, p, part, pc[i].part_offset);
            uint64_t b = dev_offset(s, p, part, pc[i].part_offset + pc[i].bytes);
            CUDA_CHECK(cudaMemcpyAsync(block_ptr(s, base + part) + a, src[i], b - a,
                                       cudaMemcpyHostToDevice, st));
            rc.dev_bytes += b - a;
            if (pc[i].part_offset + pc[i].bytes == x->part_bytes[p][part])
                rc.ends |= (uint8_t)(1u << part);
        }
        CUDA_CHECK(cudaEventRecord(rc.ev1, st));
        for (int part = 0; part < PART_COUNT; part++)
            if (rc.ends & (1u << part)) s->ready[base + part] = rc.ev1;
        s->xfer_last[c.xfer] = rc.ev1;
        s->xfer_stream[c.xfer] = st;
        s->h2d_dev_bytes += rc.dev_bytes;
        s->inflight.push_back(rc);
    }
}

void cuda_copy_kick(replay_exec *x, int engine) {
    if (engine == MEMSYS_SSD)
        ssd_kick(be_of(x));
    else
        h2d_kick(be_of(x));
}

/* Retires finished chunks in submission order: memsys makes their parts resident and the policy
 * hears of completed loads (memsys_deliver, after the engine restarted). Never called from inside
 * a policy callback (on_route may be issuing loads). */
static void retire(rp *s) {
    replay_exec *x = s->x;
    while (!s->inflight.empty()) {
        cudaError_t e = cudaEventQuery(s->inflight.front().ev1);
        if (e == cudaErrorNotReady) break;
        CUDA_CHECK(e);
        rp_chunk rc = s->inflight.front();
        s->inflight.pop_front();
        s->done_chunks.push_back(rc);
        if (s->xfer_last[rc.c.xfer] == rc.ev1) s->xfer_last[rc.c.xfer] = NULL;
        if (rc.slot >= 0) s->free_slots.push_back(rc.slot); /* its bytes left the bounce slot */
        size_t base = memsys_lep(&x->ms, rc.layer, rc.expert, rc.prec) * PART_COUNT;
        for (int part = 0; part < PART_COUNT; part++)
            if (rc.ends & (1u << part)) /* landed: ops need not wait */
                s->ready[base + part] = NULL;
        memsys_xfer fin;
        bool complete = memsys_chunk_done(&x->ms, &rc.c, &fin);
        h2d_kick(s);
        if (complete) memsys_deliver(&x->ms, &fin, run_ns(s));
    }
}

void cuda_pump(rp *s) {
    retire(s);
    h2d_kick(s);
    ssd_kick(s);
}

/* Blocks until the oldest chunk in flight has landed, then retires what has. */
void cuda_wait_next_chunk(rp *s) {
    if (s->inflight.empty()) cuda_pump(s);
    MOESIM_ASSERT(!s->inflight.empty()); /* the caller waits for a copy that has started */
    CUDA_CHECK(cudaEventSynchronize(s->inflight.front().ev1));
    cuda_pump(s);
}

bool cuda_wait_copy(replay_exec *x) {
    cuda_wait_next_chunk(be_of(x));
    return true;
}

/* Waits until every part in mask has all its chunks submitted (its ready event exists): the
 * compute stream then waits for their events itself. */
void cuda_expert_wait(replay_exec *x, uint32_t layer, uint32_t e, moesim_precision p,
                      uint32_t mask) {
    rp *s = be_of(x);
    size_t base = memsys_lep(&x->ms, layer, e, p) * PART_COUNT;
    for (;;) {
        bool ok = true;
        for (int part = 0; part < PART_COUNT; part++)
            if (mask & (1u << part) && x->ms.state[base + part] == POLICY_LOADING &&
                !s->ready[base + part])
                ok = false;
        if (ok) return;
        cuda_pump(s);
    }
}

/* Waits until the compute stream is idle, feeding copies meanwhile, then retires once more: the
 * copies it waited for landed before its last op ran, possibly after the last pump, and a part
 * left "loading" would be refused to the policy's next eviction (the simulator's stream sees its
 * copies land before it runs on). Chunks retire in submission order, so a landed chunk behind
 * one still in flight (a background copy issued before it) stays loading until that lands. */
void cuda_wait_compute(replay_exec *x) {
    rp *s = be_of(x);
    cudaEvent_t e = ev_get(s);
    CUDA_CHECK(cudaEventRecord(e, s->s_comp));
    for (;;) {
        cuda_pump(s);
        cudaError_t r = cudaEventQuery(e);
        if (r == cudaSuccess) break;
        if (r != cudaErrorNotReady) CUDA_CHECK(r);
    }
    cuda_pump(s);
}
