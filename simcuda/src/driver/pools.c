/*
 * Memory pools and the stream-ordered allocator: cuMemPoolCreate/Destroy/
 * TrimTo/GetAttribute/SetAttribute, cuDeviceGetDefaultMemPool,
 * cuDeviceGet/SetMemPool, cuMemAllocAsync, cuMemAllocFromPoolAsync and
 * cuMemFreeAsync.  A pool holds device memory beyond what is live in it
 * (reserved versus used), which is what a memory tracer has to account for;
 * the pools report both through the real attributes.
 *
 * Where simcuda differs from the real driver
 * ------------------------------------------
 *  - Kernels do nothing and every stream is always idle, so stream-ordered
 *    operations take effect at once: cuMemFreeAsync gives the bytes back to
 *    the pool before it returns.  Stream and context synchronization only
 *    matter for pool trimming (down to the release threshold).
 *  - Accounting is exact and simple: allocations are rounded up to 512
 *    bytes, and a pool reserves from its device in 2 MiB steps (first giving
 *    back what it holds unused when the device is full).  A real pool
 *    rounds more coarsely and fragments.
 *  - Host pools (location HOST, HOST_NUMA) are not simulated:
 *    CUDA_ERROR_NOT_SUPPORTED.
 *  - During stream capture, allocation on the capturing stream allocates at
 *    once where the real driver records a graph memory node; on any other
 *    stream it is treated as unsafe (streams.c).
 */
#define _GNU_SOURCE
#define SIMCUDA_NO_V2_MACROS
#include "core.h"

#include <stdlib.h>

static struct pool *g_pools;

/* ---- Pools ------------------------------------------------------------------ */

struct pool *pool_new(int dev, int is_default)
{
    struct pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->dev = dev;
    p->is_default = is_default;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    p->next = g_pools;
    g_pools = p;
    return p;
}

static int pool_known(const struct pool *p)
{
    for (const struct pool *q = g_pools; q; q = q->next)
        if (q == p)
            return !q->destroyed;
    return 0;
}

/* Gives back whole chunks the pool holds beyond max(keep, used).  A real pool
 * can only release chunks with nothing live in them, hence the rounding. */
static void pool_shrink(struct pool *p, uint64_t keep)
{
    uint64_t want = keep > p->used ? keep : p->used;
    if (want >= p->reserved)
        return;
    want = round_up(want, POOL_CHUNK);
    if (want < p->reserved) {
        dev_uncharge(&g_dev[p->dev], p->reserved - want);
        p->reserved = want;
    }
}

void pool_finalize(struct pool *p)
{
    dev_uncharge(&g_dev[p->dev], p->reserved);
    for (struct pool **pp = &g_pools; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    free(p);
}

/* What cuStreamSynchronize / cuCtxSynchronize do to the pools of a device. */
void trim_device_pools(int dev)
{
    for (struct pool *p = g_pools; p; p = p->next)
        if (p->dev == dev)
            pool_shrink(p, p->destroyed ? 0 : p->threshold);
}

static CUresult pool_alloc(struct pool *p, struct ctx *c, uint64_t size, CUdeviceptr *dptr)
{
    struct device *d = &g_dev[p->dev];
    uint64_t need = round_up(size, ALLOC_ROUND);
    if (!need || need > UINT64_MAX - p->used)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (need > p->reserved - p->used) {
        uint64_t target = round_up(p->used + need, POOL_CHUNK);
        if (!target || (p->max_size && target > p->max_size))
            return CUDA_ERROR_OUT_OF_MEMORY;
        if (!dev_charge(d, target - p->reserved)) {
            /* Device full: first give back what this pool holds unused. */
            pool_shrink(p, 0);
            if (!dev_charge(d, target - p->reserved))
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        p->reserved = target;
        if (p->reserved > p->reserved_high)
            p->reserved_high = p->reserved;
    }
    uint64_t addr = va_alloc(&d->va, need, ALLOC_ROUND, 0);
    if (!addr)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct alloc *a = alloc_record(addr, size, AK_POOL, p->dev, c, need);
    if (!a) {
        va_free(&d->va, addr, need);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->pool = p;
    p->used += need;
    if (p->used > p->used_high)
        p->used_high = p->used;
    p->live++;
    *dptr = addr;
    return CUDA_SUCCESS;
}

/* ---- Stream-ordered allocator ------------------------------------------------------ */

static CUresult get_default_pool_locked(CUmemoryPool *out, CUdevice dev, int current)
{
    REQUIRE_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *out = (CUmemoryPool)(current ? g_dev[dev].current_pool : g_dev[dev].default_pool);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    sim_lock();
    CUresult r = get_default_pool_locked(pool_out, dev, 0);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    sim_lock();
    CUresult r = get_default_pool_locked(pool, dev, 1);
    sim_unlock();
    return r;
}

static CUresult set_mem_pool_locked(CUdevice dev, CUmemoryPool pool)
{
    REQUIRE_INIT();
    struct pool *p = (struct pool *)pool;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pool_known(p) || p->dev != dev)
        return CUDA_ERROR_INVALID_VALUE;
    g_dev[dev].current_pool = p;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    sim_lock();
    CUresult r = set_mem_pool_locked(dev, pool);
    sim_unlock();
    return r;
}

static CUresult pool_create_locked(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    REQUIRE_INIT();
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.type == CU_MEM_LOCATION_TYPE_HOST ||
        props->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
        props->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
        return CUDA_ERROR_NOT_SUPPORTED; /* host pools: not simulated */
    if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !dev_valid(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    struct pool *p = pool_new(props->location.id, 0);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->max_size = props->maxSize;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    sim_lock();
    CUresult r = pool_create_locked(pool, props);
    sim_unlock();
    return r;
}

static CUresult pool_destroy_locked(CUmemoryPool pool)
{
    REQUIRE_INIT();
    struct pool *p = (struct pool *)pool;
    if (!pool_known(p) || p->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    struct device *d = &g_dev[p->dev];
    if (d->current_pool == p)
        d->current_pool = d->default_pool;
    if (p->live == 0) {
        pool_finalize(p);
    } else {
        /* Outstanding allocations keep it alive until their last free. */
        p->destroyed = 1;
        pool_shrink(p, 0);
    }
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemPoolDestroy(CUmemoryPool pool)
{
    sim_lock();
    CUresult r = pool_destroy_locked(pool);
    sim_unlock();
    return r;
}

static CUresult pool_trim_locked(CUmemoryPool pool, size_t keep)
{
    REQUIRE_INIT();
    struct pool *p = (struct pool *)pool;
    if (!pool_known(p))
        return CUDA_ERROR_INVALID_VALUE;
    pool_shrink(p, keep);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    sim_lock();
    CUresult r = pool_trim_locked(pool, minBytesToKeep);
    sim_unlock();
    return r;
}

static CUresult pool_attr_locked(CUmemoryPool pool, CUmemPool_attribute attr, void *value, int set)
{
    REQUIRE_INIT();
    struct pool *p = (struct pool *)pool;
    if (!pool_known(p) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    cuuint64_t *u64 = value;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: {
        int *flag = &p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        if (set)
            *flag = *(int *)value != 0;
        else
            *(int *)value = *flag;
        return CUDA_SUCCESS;
    }
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        if (set)
            p->threshold = *u64;
        else
            *u64 = p->threshold;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        if (set)
            return CUDA_ERROR_INVALID_VALUE;
        *u64 = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ? p->reserved : p->used;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: {
        uint64_t *high = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ? &p->reserved_high : &p->used_high;
        if (!set) {
            *u64 = *high;
            return CUDA_SUCCESS;
        }
        if (*u64 != 0) /* the high-water marks may only be reset */
            return CUDA_ERROR_INVALID_VALUE;
        *high = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ? p->reserved : p->used;
        return CUDA_SUCCESS;
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

IMPL CUresult impl_cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    sim_lock();
    CUresult r = pool_attr_locked(pool, attr, value, 0);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    sim_lock();
    CUresult r = pool_attr_locked(pool, attr, value, 1);
    sim_unlock();
    return r;
}

/* pool == NULL: the current pool of the stream's device. */
static CUresult alloc_async_locked(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                   int from_pool, CUstream h)
{
    struct ctx *c;
    int dev;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct pool *p = (struct pool *)pool;
    if (from_pool && !pool_known(p))
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(stream_device(h, c, &dev));
    CHECK(capture_guard_stream(h));
    if (!from_pool)
        p = g_dev[dev].current_pool;
    return pool_alloc(p, c, bytesize, dptr);
}

IMPL CUresult impl_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream h)
{
    sim_lock();
    CUresult r = alloc_async_locked(dptr, bytesize, NULL, 0, h);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream h)
{
    sim_lock();
    CUresult r = alloc_async_locked(dptr, bytesize, NULL, 0, h == NULL ? CU_STREAM_PER_THREAD : h);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                           CUstream h)
{
    sim_lock();
    CUresult r = alloc_async_locked(dptr, bytesize, pool, 1, h);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                CUmemoryPool pool, CUstream h)
{
    sim_lock();
    CUresult r = alloc_async_locked(dptr, bytesize, pool, 1, h == NULL ? CU_STREAM_PER_THREAD : h);
    sim_unlock();
    return r;
}

/* Frees immediately (nothing is pending on any stream).  Memory from
 * cuMemAlloc or cuMemAllocManaged is accepted too. */
static CUresult free_async_locked(CUdeviceptr dptr, CUstream h)
{
    struct ctx *c;
    int dev;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    CHECK(stream_device(h, c, &dev));
    if (dptr == 0)
        return CUDA_SUCCESS;
    struct tnode *n = tn_find(g_allocs, dptr);
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_guard_stream(h));
    alloc_release((struct alloc *)n);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemFreeAsync(CUdeviceptr dptr, CUstream h)
{
    sim_lock();
    CUresult r = free_async_locked(dptr, h);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream h)
{
    sim_lock();
    CUresult r = free_async_locked(dptr, h == NULL ? CU_STREAM_PER_THREAD : h);
    sim_unlock();
    return r;
}

/* ---- cuGetProcAddress entries (core.c searches this table after its own) ---- */

const struct sim_proc sim_procs_pools[] = {
    {"cuDeviceGetDefaultMemPool", 11020, (void *)impl_cuDeviceGetDefaultMemPool, NULL},
    {"cuDeviceGetMemPool", 11020, (void *)impl_cuDeviceGetMemPool, NULL},
    {"cuDeviceSetMemPool", 11020, (void *)impl_cuDeviceSetMemPool, NULL},
    {"cuMemPoolCreate", 11020, (void *)impl_cuMemPoolCreate, NULL},
    {"cuMemPoolDestroy", 11020, (void *)impl_cuMemPoolDestroy, NULL},
    {"cuMemPoolTrimTo", 11020, (void *)impl_cuMemPoolTrimTo, NULL},
    {"cuMemPoolGetAttribute", 11020, (void *)impl_cuMemPoolGetAttribute, NULL},
    {"cuMemPoolSetAttribute", 11020, (void *)impl_cuMemPoolSetAttribute, NULL},
    {"cuMemAllocAsync", 11020, (void *)impl_cuMemAllocAsync, (void *)impl_cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, (void *)impl_cuMemAllocFromPoolAsync,
     (void *)impl_cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", 11020, (void *)impl_cuMemFreeAsync, (void *)impl_cuMemFreeAsync_ptsz},
};
const size_t sim_nprocs_pools = sizeof sim_procs_pools / sizeof sim_procs_pools[0];

/* ---- Exports ------------------------------------------------------------------------------
 * Thin wrappers only: internal code never calls these. */

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) { return impl_cuDeviceGetDefaultMemPool(pool_out, dev); }
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) { return impl_cuDeviceGetMemPool(pool, dev); }
EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) { return impl_cuDeviceSetMemPool(dev, pool); }
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) { return impl_cuMemPoolCreate(pool, poolProps); }
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) { return impl_cuMemPoolDestroy(pool); }
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) { return impl_cuMemPoolTrimTo(pool, minBytesToKeep); }
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) { return impl_cuMemPoolGetAttribute(pool, attr, value); }
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) { return impl_cuMemPoolSetAttribute(pool, attr, value); }
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) { return impl_cuMemAllocAsync(dptr, bytesize, hStream); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) { return impl_cuMemAllocAsync_ptsz(dptr, bytesize, hStream); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) { return impl_cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream); }
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) { return impl_cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, hStream); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return impl_cuMemFreeAsync(dptr, hStream); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return impl_cuMemFreeAsync_ptsz(dptr, hStream); }
