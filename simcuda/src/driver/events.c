/*
 * Events and the stream queries that need no stream state.
 *
 * Every stream is idle in simcuda (work completes before the call that
 * queued it returns), so an event is complete as soon as it is recorded and
 * waiting on one never blocks.  Recording stamps the host's monotonic clock,
 * so cuEventElapsedTime measures the host time between two records, which is
 * what a GPU that ran every kernel instantly would report.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define EVENT_DISABLE_TIMING 0x2u
#define EVENT_FLAGS_MASK 0xfu

struct sim_event {
    unsigned flags;
    int recorded;
    uint64_t t_ns;
    struct sim_event *next;
};

static pthread_mutex_t g_ev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_event *g_events;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct sim_event *event_find(const struct sim_event *e)
{
    struct sim_event *p = g_events;
    while (p && p != e)
        p = p->next;
    return p;
}

IMPL CUresult impl_cuEventCreate(sim_event_t *out, unsigned flags)
{
    if (!out || (flags & ~EVENT_FLAGS_MASK))
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx;
    CUresult r = sim_current_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    struct sim_event *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->flags = flags;
    pthread_mutex_lock(&g_ev_lock);
    e->next = g_events;
    g_events = e;
    pthread_mutex_unlock(&g_ev_lock);
    *out = e;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuEventDestroy(sim_event_t e)
{
    pthread_mutex_lock(&g_ev_lock);
    struct sim_event **p = &g_events;
    while (*p && *p != e)
        p = &(*p)->next;
    int found = *p != NULL;
    if (found)
        *p = e->next;
    pthread_mutex_unlock(&g_ev_lock);
    if (!found)
        return CUDA_ERROR_INVALID_HANDLE;
    free(e);
    return CUDA_SUCCESS;
}

static CUresult event_record(sim_event_t e, CUstream s)
{
    CUresult r = sim_stream_check(s);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_ev_lock);
    struct sim_event *ev = event_find(e);
    if (ev) {
        ev->recorded = 1;
        ev->t_ns = now_ns();
    }
    pthread_mutex_unlock(&g_ev_lock);
    return ev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

IMPL CUresult impl_cuEventRecord(sim_event_t e, CUstream s) { return event_record(e, s); }
IMPL CUresult impl_cuEventRecord_ptsz(sim_event_t e, CUstream s)
{
    return event_record(e, s ? s : CU_STREAM_PER_THREAD);
}
IMPL CUresult impl_cuEventRecordWithFlags(sim_event_t e, CUstream s, unsigned flags)
{
    (void)flags;
    return event_record(e, s);
}
IMPL CUresult impl_cuEventRecordWithFlags_ptsz(sim_event_t e, CUstream s, unsigned flags)
{
    (void)flags;
    return event_record(e, s ? s : CU_STREAM_PER_THREAD);
}

static CUresult event_check(sim_event_t e)
{
    pthread_mutex_lock(&g_ev_lock);
    int ok = event_find(e) != NULL;
    pthread_mutex_unlock(&g_ev_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

IMPL CUresult impl_cuEventQuery(sim_event_t e) { return event_check(e); }
IMPL CUresult impl_cuEventSynchronize(sim_event_t e) { return event_check(e); }

IMPL CUresult impl_cuEventElapsedTime(float *ms, sim_event_t start, sim_event_t end)
{
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_ev_lock);
    struct sim_event *a = event_find(start), *b = event_find(end);
    CUresult r = CUDA_SUCCESS;
    if (!a || !b)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if ((a->flags | b->flags) & EVENT_DISABLE_TIMING)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->recorded || !b->recorded)
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        *ms = (float)((double)((int64_t)(b->t_ns - a->t_ns)) / 1e6);
    pthread_mutex_unlock(&g_ev_lock);
    return r;
}

static CUresult stream_wait_event(CUstream s, sim_event_t e, unsigned flags)
{
    (void)flags;
    CUresult r = sim_stream_check(s);
    return r != CUDA_SUCCESS ? r : event_check(e);
}

IMPL CUresult impl_cuStreamWaitEvent(CUstream s, sim_event_t e, unsigned flags)
{
    return stream_wait_event(s, e, flags);
}
IMPL CUresult impl_cuStreamWaitEvent_ptsz(CUstream s, sim_event_t e, unsigned flags)
{
    return stream_wait_event(s ? s : CU_STREAM_PER_THREAD, e, flags);
}

IMPL CUresult impl_cuStreamQuery(CUstream s) { return sim_stream_check(s); }
IMPL CUresult impl_cuStreamQuery_ptsz(CUstream s)
{
    return sim_stream_check(s ? s : CU_STREAM_PER_THREAD);
}

#define FN(x) (void *)(x)

const struct sim_proc sim_procs_events[] = {
    {"cuEventCreate", 2000, FN(impl_cuEventCreate), NULL},
    {"cuEventDestroy", 4000, FN(impl_cuEventDestroy), NULL},
    {"cuEventRecord", 2000, FN(impl_cuEventRecord), FN(impl_cuEventRecord_ptsz)},
    {"cuEventRecordWithFlags", 11010, FN(impl_cuEventRecordWithFlags),
     FN(impl_cuEventRecordWithFlags_ptsz)},
    {"cuEventQuery", 2000, FN(impl_cuEventQuery), NULL},
    {"cuEventSynchronize", 2000, FN(impl_cuEventSynchronize), NULL},
    {"cuEventElapsedTime", 2000, FN(impl_cuEventElapsedTime), NULL},
    {"cuEventElapsedTime", 12080, FN(impl_cuEventElapsedTime), NULL},
    {"cuStreamWaitEvent", 3020, FN(impl_cuStreamWaitEvent), FN(impl_cuStreamWaitEvent_ptsz)},
    {"cuStreamQuery", 2000, FN(impl_cuStreamQuery), FN(impl_cuStreamQuery_ptsz)},
};
const size_t sim_nprocs_events = sizeof sim_procs_events / sizeof sim_procs_events[0];

EXPORT CUresult cuEventCreate(sim_event_t *e, unsigned f) { return impl_cuEventCreate(e, f); }
EXPORT CUresult cuEventDestroy_v2(sim_event_t e) { return impl_cuEventDestroy(e); }
EXPORT CUresult cuEventDestroy(sim_event_t e) { return impl_cuEventDestroy(e); }
EXPORT CUresult cuEventRecord(sim_event_t e, CUstream s) { return impl_cuEventRecord(e, s); }
EXPORT CUresult cuEventRecord_ptsz(sim_event_t e, CUstream s)
{
    return impl_cuEventRecord_ptsz(e, s);
}
EXPORT CUresult cuEventRecordWithFlags(sim_event_t e, CUstream s, unsigned f)
{
    return impl_cuEventRecordWithFlags(e, s, f);
}
EXPORT CUresult cuEventRecordWithFlags_ptsz(sim_event_t e, CUstream s, unsigned f)
{
    return impl_cuEventRecordWithFlags_ptsz(e, s, f);
}
EXPORT CUresult cuEventQuery(sim_event_t e) { return impl_cuEventQuery(e); }
EXPORT CUresult cuEventSynchronize(sim_event_t e) { return impl_cuEventSynchronize(e); }
EXPORT CUresult cuEventElapsedTime(float *ms, sim_event_t a, sim_event_t b)
{
    return impl_cuEventElapsedTime(ms, a, b);
}
EXPORT CUresult cuEventElapsedTime_v2(float *ms, sim_event_t a, sim_event_t b)
{
    return impl_cuEventElapsedTime(ms, a, b);
}
EXPORT CUresult cuStreamWaitEvent(CUstream s, sim_event_t e, unsigned f)
{
    return impl_cuStreamWaitEvent(s, e, f);
}
EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream s, sim_event_t e, unsigned f)
{
    return impl_cuStreamWaitEvent_ptsz(s, e, f);
}
EXPORT CUresult cuStreamQuery(CUstream s) { return impl_cuStreamQuery(s); }
EXPORT CUresult cuStreamQuery_ptsz(CUstream s) { return impl_cuStreamQuery_ptsz(s); }
