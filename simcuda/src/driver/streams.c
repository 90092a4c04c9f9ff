/*
 * Streams and stream capture: cuStreamCreate[WithPriority], cuStreamDestroy,
 * cuStreamSynchronize, the stream queries (priority, flags, id, context,
 * device), cuStreamBeginCapture/EndCapture/IsCapturing/GetCaptureInfo,
 * cuThreadExchangeStreamCaptureMode and cuGraphDestroy, and the capture
 * guard that the memory calls of memory.c, pools.c and core.c ask before
 * they take effect.  Capture is modelled because on a GPU a memory call
 * made during a capture can fail and invalidate it, and both the client and
 * a memory tracer must see that happen here too.
 *
 * Where simcuda differs from the real driver
 * ------------------------------------------
 *  - Kernels do nothing and every stream is always idle, so stream-ordered
 *    operations take effect at once; synchronizing a stream only lets its
 *    device's pools trim (pools.c).  Out-of-range priorities are clamped.
 *  - Stream capture enforces the capture-mode rules on the memory calls but
 *    records nothing: see "Stream capture" below for where it differs.
 *
 * ---- Stream capture ----------------------------------------------------------
 * The rules of cuThreadExchangeStreamCaptureMode's documentation.  A thread's
 * mode (default GLOBAL) decides whether it may make "potentially unsafe"
 * calls while capture sequences are active:
 *   GLOBAL:       not if it began a non-RELAXED sequence that is still
 *                 active, nor if any other thread has an active GLOBAL one;
 *   THREAD_LOCAL: not if it began a non-RELAXED sequence still active (other
 *                 threads' sequences are ignored);
 *   RELAXED:      always.
 * A prohibited call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 * invalidates the sequences that prohibited it, as the real driver does (the
 * classic symptom: a cudaMalloc on another thread makes cudaStreamEndCapture
 * return cudaErrorStreamCaptureInvalidated).  An invalidated sequence stays
 * active (and still prohibits) until cuStreamEndCapture ends it.
 *
 * The unsafe calls here are the memory-management ones: cuMemAlloc_v2,
 * cuMemAllocPitch_v2, cuMemAllocManaged, cuMemFree_v2 (NULL included),
 * cuMemAllocHost_v2, cuMemHostAlloc, cuMemFreeHost and cuCtxSynchronize;
 * cuStreamSynchronize of a capturing stream always fails and invalidates
 * that stream's sequence, whatever the modes.
 *
 * Where this differs from the real driver:
 *  - Stream-ordered allocation on the capturing stream itself
 *    (cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFreeAsync) is allowed,
 *    as it is for real, but where the real driver records a graph memory
 *    node and returns an address valid only for launches of the graph,
 *    simcuda simply allocates (or frees) from the pool at once.
 *  - The same calls on a stream that is not capturing are treated as unsafe,
 *    under the rules above.  That is conservative: the real driver is not
 *    documented to forbid them.
 *  - No operation is recorded, so the graph from cuStreamEndCapture is an
 *    empty handle, good only for cuGraphDestroy; there is no cross-stream
 *    capture (events), so a sequence is always one stream.
 *  - The legacy default stream cannot be captured (as for real), but the
 *    implicit synchronization between it and capturing blocking streams is
 *    not modelled: cuStreamIsCapturing(legacy) answers NONE rather than
 *    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT.
 *  - The per-thread default stream can be captured; a thread that exits in
 *    the middle of such a capture leaves it active for good.
 *  - The first-generation cuStreamBeginCapture (CUDA 10.0, no mode argument)
 *    is taken to mean CU_STREAM_CAPTURE_MODE_GLOBAL.
 *  - VMM calls (cuMemCreate, cuMemMap, ...) and pool management are not
 *    checked.
 */
#define _GNU_SOURCE
#define SIMCUDA_NO_V2_MACROS
#include "core.h"

#include <stdlib.h>

struct tnode *g_streams; /* struct stream */

struct capture {
    CUstreamCaptureMode mode;
    int invalidated;
    const void *owner;    /* &tls_thread_tag of the thread that began it */
    struct capture *next; /* g_captures */
};

static struct capture *g_captures; /* every active capture sequence */
static struct tnode *g_graphs;     /* bare tnodes: graphs from cuStreamEndCapture */
static __thread char tls_thread_tag; /* its address identifies the thread */
static __thread CUstreamCaptureMode tls_capture_mode; /* 0: CU_STREAM_CAPTURE_MODE_GLOBAL */
static __thread struct capture *tls_ptds_capture; /* this thread's per-thread stream */

static void capture_end(struct capture **slot)
{
    struct capture *c = *slot;
    for (struct capture **pp = &g_captures; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    free(c);
    *slot = NULL;
}

/* Called by every potentially unsafe call before it takes effect. */
CUresult capture_guard(void)
{
    CUstreamCaptureMode mode = tls_capture_mode;
    int prohibited = 0;
    if (mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    for (struct capture *c = g_captures; c; c = c->next) {
        int own = c->owner == &tls_thread_tag;
        if ((own && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!own && mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            c->invalidated = 1;
            prohibited = 1;
        }
    }
    return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* Where a stream's capture sequence is kept: *slot is NULL when the stream
 * is not capturing; slot itself is NULL for the legacy default stream, which
 * can never capture. */
static CUresult capture_slot(CUstream h, struct capture ***slot)
{
    if (h == NULL || h == CU_STREAM_LEGACY) {
        *slot = NULL;
        return CUDA_SUCCESS;
    }
    if (h == CU_STREAM_PER_THREAD) {
        *slot = &tls_ptds_capture;
        return CUDA_SUCCESS;
    }
    struct tnode *n = tn_find(g_streams, (uint64_t)(uintptr_t)h);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    *slot = &((struct stream *)n)->cap;
    return CUDA_SUCCESS;
}

/* Stream-ordered allocator calls: part of the capture on a capturing
 * stream, unsafe (conservatively) on any other. */
CUresult capture_guard_stream(CUstream h)
{
    struct capture **slot;
    CHECK(capture_slot(h, &slot));
    return slot && *slot ? CUDA_SUCCESS : capture_guard();
}

void stream_release(struct stream *s)
{
    if (s->cap)
        capture_end(&s->cap);
    tn_remove(&g_streams, s->node.key);
    free(s);
}

static int is_special_stream(CUstream s)
{
    return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

/* The device a stream works on; the special handles mean the current one. */
CUresult stream_device(CUstream s, const struct ctx *cur, int *dev)
{
    if (is_special_stream(s)) {
        *dev = cur->dev;
        return CUDA_SUCCESS;
    }
    struct tnode *n = tn_find(g_streams, (uint64_t)(uintptr_t)s);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    *dev = ((struct stream *)n)->ctx->dev;
    return CUDA_SUCCESS;
}

/* ---- Streams --------------------------------------------------------------------- */

static CUresult stream_create_locked(CUstream *ph, unsigned int flags, int priority)
{
    static unsigned long long next_id = 3; /* 1 and 2 are the legacy and per-thread streams */
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct stream *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->node.key = (uint64_t)(uintptr_t)s;
    s->ctx = c;
    s->flags = flags;
    /* Out-of-range priorities are clamped, as the real driver does. */
    s->priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
    s->id = next_id++;
    tn_insert(&g_streams, &s->node);
    *ph = (CUstream)s;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamCreate(CUstream *ph, unsigned int flags)
{
    sim_lock();
    CUresult r = stream_create_locked(ph, flags, 0);
    sim_unlock();
    return r;
}

static CUresult stream_destroy_locked(CUstream h)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    struct tnode *n = is_special_stream(h) ? NULL : tn_find(g_streams, (uint64_t)(uintptr_t)h);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    stream_release((struct stream *)n);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamDestroy_v1(CUstream h)
{
    sim_lock();
    CUresult r = stream_destroy_locked(h);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuStreamDestroy_v2(CUstream h)
{
    sim_lock();
    CUresult r = stream_destroy_locked(h);
    sim_unlock();
    return r;
}

/* Nothing ever runs on a stream, so synchronizing only lets the pools of the
 * stream's device release what they hold above their release threshold. */
static CUresult stream_synchronize_locked(CUstream h)
{
    struct ctx *c;
    int dev;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    CHECK(stream_device(h, c, &dev));
    struct capture **slot;
    CHECK(capture_slot(h, &slot));
    if (slot && *slot) {
        /* Waiting for a stream whose work is being recorded, not run. */
        (*slot)->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    trim_device_pools(dev);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamSynchronize(CUstream h)
{
    sim_lock();
    CUresult r = stream_synchronize_locked(h);
    sim_unlock();
    return r;
}

/* Per-thread-default-stream twin: stream 0 means this thread's stream, which
 * for simcuda is indistinguishable from the legacy one. */
IMPL CUresult impl_cuStreamSynchronize_ptsz(CUstream h)
{
    sim_lock();
    CUresult r = stream_synchronize_locked(h == NULL ? CU_STREAM_PER_THREAD : h);
    sim_unlock();
    return r;
}

/* ---- Stream capture API (rules above, with struct capture) ------------------------- */

static int capture_mode_valid(CUstreamCaptureMode mode)
{
    return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
           mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

static CUresult begin_capture_locked(CUstream h, CUstreamCaptureMode mode)
{
    struct ctx *c;
    struct capture **slot;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!capture_mode_valid(mode))
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_slot(h, &slot));
    if (!slot)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream */
    if (*slot)
        return CUDA_ERROR_ILLEGAL_STATE; /* already capturing */
    struct capture *cap = calloc(1, sizeof *cap);
    if (!cap)
        return CUDA_ERROR_OUT_OF_MEMORY;
    cap->mode = mode;
    cap->owner = &tls_thread_tag;
    cap->next = g_captures;
    g_captures = cap;
    *slot = cap;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode)
{
    sim_lock();
    CUresult r = begin_capture_locked(h, mode);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode)
{
    sim_lock();
    CUresult r = begin_capture_locked(h == NULL ? CU_STREAM_PER_THREAD : h, mode);
    sim_unlock();
    return r;
}

/* The CUDA 10.0 ABI, without a mode: taken as GLOBAL. */
IMPL CUresult impl_cuStreamBeginCapture_v1(CUstream h)
{
    sim_lock();
    CUresult r = begin_capture_locked(h, CU_STREAM_CAPTURE_MODE_GLOBAL);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuStreamBeginCapture_v1_ptsz(CUstream h)
{
    sim_lock();
    CUresult r = begin_capture_locked(h == NULL ? CU_STREAM_PER_THREAD : h,
                                      CU_STREAM_CAPTURE_MODE_GLOBAL);
    sim_unlock();
    return r;
}

static CUresult end_capture_locked(CUstream h, CUgraph *phGraph)
{
    struct ctx *c;
    struct capture **slot;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_slot(h, &slot));
    if (!slot || !*slot)
        return CUDA_ERROR_ILLEGAL_STATE; /* not capturing */
    struct capture *cap = *slot;
    if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED && cap->owner != &tls_thread_tag)
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    int invalidated = cap->invalidated;
    capture_end(slot); /* ends either way, as the real one does */
    *phGraph = NULL;
    if (invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    struct tnode *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->key = (uint64_t)(uintptr_t)g;
    tn_insert(&g_graphs, g);
    *phGraph = (CUgraph)g;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamEndCapture(CUstream h, CUgraph *phGraph)
{
    sim_lock();
    CUresult r = end_capture_locked(h, phGraph);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuStreamEndCapture_ptsz(CUstream h, CUgraph *phGraph)
{
    sim_lock();
    CUresult r = end_capture_locked(h == NULL ? CU_STREAM_PER_THREAD : h, phGraph);
    sim_unlock();
    return r;
}

static CUresult is_capturing_locked(CUstream h, CUstreamCaptureStatus *status)
{
    struct ctx *c;
    struct capture **slot;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_slot(h, &slot));
    if (!slot || !*slot)
        *status = CU_STREAM_CAPTURE_STATUS_NONE;
    else
        *status = (*slot)->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                       : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *status)
{
    sim_lock();
    CUresult r = is_capturing_locked(h, status);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus *status)
{
    sim_lock();
    CUresult r = is_capturing_locked(h == NULL ? CU_STREAM_PER_THREAD : h, status);
    sim_unlock();
    return r;
}

/* Swaps: the thread takes *mode and gets its previous mode back in *mode. */
static CUresult exchange_capture_mode_locked(CUstreamCaptureMode *mode)
{
    REQUIRE_INIT();
    if (!mode || !capture_mode_valid(*mode))
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = tls_capture_mode;
    tls_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    sim_lock();
    CUresult r = exchange_capture_mode_locked(mode);
    sim_unlock();
    return r;
}

static CUresult graph_destroy_locked(CUgraph graph)
{
    REQUIRE_INIT();
    struct tnode *g = graph ? tn_find(g_graphs, (uint64_t)(uintptr_t)graph) : NULL;
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    tn_remove(&g_graphs, g->key);
    free(g);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuGraphDestroy(CUgraph graph)
{
    sim_lock();
    CUresult r = graph_destroy_locked(graph);
    sim_unlock();
    return r;
}

/* ---- Later additions: priorities, stream queries, capture info ------------------------ */

IMPL CUresult impl_cuStreamCreateWithPriority(CUstream *ph, unsigned flags, int priority)
{
    sim_lock();
    CUresult r = stream_create_locked(ph, flags, priority);
    sim_unlock();
    return r;
}

/* Looks up a stream; the special handles mean the current context's default
 * stream (NULL *out, priority 0, flags 0). */
static CUresult stream_lookup_locked(CUstream h, struct ctx **c, struct stream **out)
{
    REQUIRE_INIT();
    CHECK(current_ctx(c));
    *out = NULL;
    if (is_special_stream(h))
        return CUDA_SUCCESS;
    struct tnode *n = tn_find(g_streams, (uint64_t)(uintptr_t)h);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = (struct stream *)n;
    return CUDA_SUCCESS;
}

enum stream_query { SQ_PRIORITY, SQ_FLAGS, SQ_ID, SQ_CTX, SQ_DEVICE };

static CUresult stream_query(CUstream h, enum stream_query what, void *out)
{
    struct ctx *c;
    struct stream *s;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = stream_lookup_locked(h, &c, &s);
    if (r == CUDA_SUCCESS) {
        switch (what) {
        case SQ_PRIORITY: *(int *)out = s ? s->priority : 0; break;
        case SQ_FLAGS: *(unsigned *)out = s ? s->flags : 0; break;
        case SQ_ID:
            *(unsigned long long *)out = s ? s->id : h == CU_STREAM_PER_THREAD ? 2 : 1;
            break;
        case SQ_CTX: *(CUcontext *)out = (CUcontext)(s ? s->ctx : c); break;
        case SQ_DEVICE: *(CUdevice *)out = s ? s->ctx->dev : c->dev; break;
        }
    }
    sim_unlock();
    return r;
}

static CUstream ptsz(CUstream h) { return h ? h : CU_STREAM_PER_THREAD; }

IMPL CUresult impl_cuStreamGetPriority(CUstream h, int *p) { return stream_query(h, SQ_PRIORITY, p); }
IMPL CUresult impl_cuStreamGetPriority_ptsz(CUstream h, int *p)
{
    return stream_query(ptsz(h), SQ_PRIORITY, p);
}
IMPL CUresult impl_cuStreamGetFlags(CUstream h, unsigned *f) { return stream_query(h, SQ_FLAGS, f); }
IMPL CUresult impl_cuStreamGetFlags_ptsz(CUstream h, unsigned *f)
{
    return stream_query(ptsz(h), SQ_FLAGS, f);
}
IMPL CUresult impl_cuStreamGetId(CUstream h, unsigned long long *id)
{
    return stream_query(h, SQ_ID, id);
}
IMPL CUresult impl_cuStreamGetId_ptsz(CUstream h, unsigned long long *id)
{
    return stream_query(ptsz(h), SQ_ID, id);
}
IMPL CUresult impl_cuStreamGetCtx(CUstream h, CUcontext *c) { return stream_query(h, SQ_CTX, c); }
IMPL CUresult impl_cuStreamGetCtx_ptsz(CUstream h, CUcontext *c)
{
    return stream_query(ptsz(h), SQ_CTX, c);
}
/* 12.5's ABI adds the green context, which simcuda never has. */
IMPL CUresult impl_cuStreamGetCtx_v2(CUstream h, CUcontext *c, void **green)
{
    if (green)
        *green = NULL;
    return stream_query(h, SQ_CTX, c);
}
IMPL CUresult impl_cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext *c, void **green)
{
    if (green)
        *green = NULL;
    return stream_query(ptsz(h), SQ_CTX, c);
}
IMPL CUresult impl_cuStreamGetDevice(CUstream h, CUdevice *d)
{
    return stream_query(h, SQ_DEVICE, d);
}
IMPL CUresult impl_cuStreamGetDevice_ptsz(CUstream h, CUdevice *d)
{
    return stream_query(ptsz(h), SQ_DEVICE, d);
}

/* The three ABIs of cuStreamGetCaptureInfo: simcuda records no graph, so
 * there are never dependencies to report. */
static CUresult capture_info(CUstream h, CUstreamCaptureStatus *status, unsigned long long *id,
                             void **graph, const void **deps, const void **edges, size_t *ndeps)
{
    CUresult r = impl_cuStreamIsCapturing(h, status);
    if (r != CUDA_SUCCESS)
        return r;
    sim_lock();
    struct capture **slot = NULL;
    if (capture_slot(h, &slot) == CUDA_SUCCESS && id)
        *id = slot && *slot ? (unsigned long long)(uintptr_t)*slot : 0;
    sim_unlock();
    if (graph)
        *graph = NULL;
    if (deps)
        *deps = NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = 0;
    return CUDA_SUCCESS;
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v1(CUstream h, CUstreamCaptureStatus *s,
                                             unsigned long long *id)
{
    return capture_info(h, s, id, NULL, NULL, NULL, NULL);
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v1_ptsz(CUstream h, CUstreamCaptureStatus *s,
                                                  unsigned long long *id)
{
    return capture_info(ptsz(h), s, id, NULL, NULL, NULL, NULL);
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *s,
                                             unsigned long long *id, void **g, const void **d,
                                             size_t *n)
{
    return capture_info(h, s, id, g, d, NULL, n);
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus *s,
                                                  unsigned long long *id, void **g,
                                                  const void **d, size_t *n)
{
    return capture_info(ptsz(h), s, id, g, d, NULL, n);
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *s,
                                             unsigned long long *id, void **g, const void **d,
                                             const void **e, size_t *n)
{
    return capture_info(h, s, id, g, d, e, n);
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *s,
                                                  unsigned long long *id, void **g,
                                                  const void **d, const void **e, size_t *n)
{
    return capture_info(ptsz(h), s, id, g, d, e, n);
}

/* ---- Interface for the other driver files (internal.h) ------------------------------ */

CUresult sim_stream_check(CUstream s)
{
    if (is_special_stream(s))
        return CUDA_SUCCESS;
    sim_lock();
    int ok = tn_find(g_streams, (uint64_t)(uintptr_t)s) != NULL;
    sim_unlock();
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- cuGetProcAddress entries (core.c searches this table after its own) ---- */

const struct sim_proc sim_procs_streams[] = {
    {"cuStreamCreate", 2000, (void *)impl_cuStreamCreate, NULL},
    {"cuStreamDestroy", 2000, (void *)impl_cuStreamDestroy_v1, NULL},
    {"cuStreamDestroy", 4000, (void *)impl_cuStreamDestroy_v2, NULL},
    {"cuStreamSynchronize", 2000, (void *)impl_cuStreamSynchronize, NULL},
    {"cuStreamSynchronize", 7000, (void *)impl_cuStreamSynchronize,
     (void *)impl_cuStreamSynchronize_ptsz},
    {"cuStreamBeginCapture", 10000, (void *)impl_cuStreamBeginCapture_v1,
     (void *)impl_cuStreamBeginCapture_v1_ptsz},
    {"cuStreamBeginCapture", 10010, (void *)impl_cuStreamBeginCapture_v2,
     (void *)impl_cuStreamBeginCapture_v2_ptsz},
    {"cuStreamEndCapture", 10000, (void *)impl_cuStreamEndCapture, (void *)impl_cuStreamEndCapture_ptsz},
    {"cuStreamIsCapturing", 10000, (void *)impl_cuStreamIsCapturing, (void *)impl_cuStreamIsCapturing_ptsz},
    {"cuThreadExchangeStreamCaptureMode", 10010, (void *)impl_cuThreadExchangeStreamCaptureMode, NULL},
    {"cuGraphDestroy", 10000, (void *)impl_cuGraphDestroy, NULL},
    {"cuStreamCreateWithPriority", 5050, (void *)impl_cuStreamCreateWithPriority, NULL},
    {"cuStreamGetPriority", 5050, (void *)impl_cuStreamGetPriority,
     (void *)impl_cuStreamGetPriority_ptsz},
    {"cuStreamGetFlags", 5050, (void *)impl_cuStreamGetFlags, (void *)impl_cuStreamGetFlags_ptsz},
    {"cuStreamGetId", 12000, (void *)impl_cuStreamGetId, (void *)impl_cuStreamGetId_ptsz},
    {"cuStreamGetCtx", 9020, (void *)impl_cuStreamGetCtx, (void *)impl_cuStreamGetCtx_ptsz},
    {"cuStreamGetCtx", 12050, (void *)impl_cuStreamGetCtx_v2, (void *)impl_cuStreamGetCtx_v2_ptsz},
    {"cuStreamGetDevice", 12080, (void *)impl_cuStreamGetDevice,
     (void *)impl_cuStreamGetDevice_ptsz},
    {"cuStreamGetCaptureInfo", 10010, (void *)impl_cuStreamGetCaptureInfo_v1,
     (void *)impl_cuStreamGetCaptureInfo_v1_ptsz},
    {"cuStreamGetCaptureInfo", 11030, (void *)impl_cuStreamGetCaptureInfo_v2,
     (void *)impl_cuStreamGetCaptureInfo_v2_ptsz},
    {"cuStreamGetCaptureInfo", 12030, (void *)impl_cuStreamGetCaptureInfo_v3,
     (void *)impl_cuStreamGetCaptureInfo_v3_ptsz},
};
const size_t sim_nprocs_streams = sizeof sim_procs_streams / sizeof sim_procs_streams[0];

/* ---- Exports ------------------------------------------------------------------------------
 * Thin wrappers only: internal code never calls these. */

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) { return impl_cuStreamCreate(phStream, Flags); }
EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) { return impl_cuStreamDestroy_v2(hStream); }
EXPORT CUresult cuStreamDestroy(CUstream hStream) { return impl_cuStreamDestroy_v1(hStream); }
EXPORT CUresult cuStreamSynchronize(CUstream hStream) { return impl_cuStreamSynchronize(hStream); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return impl_cuStreamSynchronize_ptsz(hStream); }
EXPORT CUresult cuStreamBeginCapture(CUstream hStream) { return impl_cuStreamBeginCapture_v1(hStream); }
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream) { return impl_cuStreamBeginCapture_v1_ptsz(hStream); }
EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) { return impl_cuStreamBeginCapture_v2(hStream, mode); }
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) { return impl_cuStreamBeginCapture_v2_ptsz(hStream, mode); }
EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) { return impl_cuStreamEndCapture(hStream, phGraph); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) { return impl_cuStreamEndCapture_ptsz(hStream, phGraph); }
EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) { return impl_cuStreamIsCapturing(hStream, captureStatus); }
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus) { return impl_cuStreamIsCapturing_ptsz(hStream, captureStatus); }
EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) { return impl_cuThreadExchangeStreamCaptureMode(mode); }
EXPORT CUresult cuGraphDestroy(CUgraph hGraph) { return impl_cuGraphDestroy(hGraph); }
EXPORT CUresult cuStreamCreateWithPriority(CUstream *h, unsigned f, int p) { return impl_cuStreamCreateWithPriority(h, f, p); }
EXPORT CUresult cuStreamGetPriority(CUstream h, int *p) { return impl_cuStreamGetPriority(h, p); }
EXPORT CUresult cuStreamGetPriority_ptsz(CUstream h, int *p) { return impl_cuStreamGetPriority_ptsz(h, p); }
EXPORT CUresult cuStreamGetFlags(CUstream h, unsigned *f) { return impl_cuStreamGetFlags(h, f); }
EXPORT CUresult cuStreamGetFlags_ptsz(CUstream h, unsigned *f) { return impl_cuStreamGetFlags_ptsz(h, f); }
EXPORT CUresult cuStreamGetId(CUstream h, unsigned long long *i) { return impl_cuStreamGetId(h, i); }
EXPORT CUresult cuStreamGetId_ptsz(CUstream h, unsigned long long *i) { return impl_cuStreamGetId_ptsz(h, i); }
EXPORT CUresult cuStreamGetCtx(CUstream h, CUcontext *c) { return impl_cuStreamGetCtx(h, c); }
EXPORT CUresult cuStreamGetCtx_ptsz(CUstream h, CUcontext *c) { return impl_cuStreamGetCtx_ptsz(h, c); }
EXPORT CUresult cuStreamGetCtx_v2(CUstream h, CUcontext *c, void **g) { return impl_cuStreamGetCtx_v2(h, c, g); }
EXPORT CUresult cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext *c, void **g) { return impl_cuStreamGetCtx_v2_ptsz(h, c, g); }
EXPORT CUresult cuStreamGetDevice(CUstream h, CUdevice *d) { return impl_cuStreamGetDevice(h, d); }
EXPORT CUresult cuStreamGetDevice_ptsz(CUstream h, CUdevice *d) { return impl_cuStreamGetDevice_ptsz(h, d); }
EXPORT CUresult cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, const void **e, size_t *n) { return impl_cuStreamGetCaptureInfo_v3(h, s, id, g, d, e, n); }
EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, const void **e, size_t *n) { return impl_cuStreamGetCaptureInfo_v3_ptsz(h, s, id, g, d, e, n); }
EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, size_t *n) { return impl_cuStreamGetCaptureInfo_v2(h, s, id, g, d, n); }
EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, size_t *n) { return impl_cuStreamGetCaptureInfo_v2_ptsz(h, s, id, g, d, n); }
EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, const void **e, size_t *n) { return impl_cuStreamGetCaptureInfo_v3(h, s, id, g, d, e, n); }
EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, const void **e, size_t *n) { return impl_cuStreamGetCaptureInfo_v3_ptsz(h, s, id, g, d, e, n); }
