/*
 * Device, managed and pinned host memory: cuMemAlloc[Pitch], cuMemFree,
 * cuMemAllocManaged, cuMemGetInfo, cuMemGetAddressRange, cuMemHostAlloc,
 * cuMemAllocHost, cuMemFreeHost, cuMemHostGetDevicePointer, cuMemHostGetFlags
 * and the pointer attributes, with the allocation records (g_allocs) that
 * pools.c's stream-ordered allocations share.  This is what a GPU memory
 * tracer watches most, so sizes, capacity and error codes follow the real
 * driver.
 *
 * Where simcuda differs from the real driver
 * ------------------------------------------
 *  - Device memory is host memory at the same address: each device's window
 *    is mapped readable and writable (MAP_NORESERVE), so copies are memmove
 *    and a host dereference works; freed cuMemAlloc pages go back to the
 *    host.  Managed memory is an ordinary host mapping outside the windows.
 *  - Accounting is exact and simple: allocations are rounded up to 512 bytes
 *    and charged to the device, which fails with CUDA_ERROR_OUT_OF_MEMORY
 *    exactly when full.  A real driver rounds more coarsely, fragments, and
 *    keeps memory of its own.  Pinned host memory is limited by
 *    SIMCUDA_HOST_MEMORY.
 *  - The first-generation exports with 32-bit pointers or sizes (cuMemAlloc,
 *    cuMemFree, cuMemGetInfo, ...) answer CUDA_ERROR_NOT_SUPPORTED.
 *  - Destroying a context frees the device memory allocated in it (stream-
 *    ordered allocations included) but leaves pinned host memory alone.
 *  - During stream capture the allocation calls obey the capture-mode rules
 *    (capture_guard, streams.c) but nothing is recorded.
 */
#define _GNU_SOURCE
#define SIMCUDA_NO_V2_MACROS
#include "core.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct host_alloc {
    struct tnode node; /* key: host address; len: requested size */
    size_t map_len;
};

struct tnode *g_allocs;      /* struct alloc: device, managed and pool memory */
static struct tnode *g_host; /* struct host_alloc */
static uint64_t g_host_used;

/* ---- Allocation records ------------------------------------------------------ */

struct alloc *alloc_record(uint64_t addr, uint64_t size, enum alloc_kind kind, int dev,
                           struct ctx *c, uint64_t charged)
{
    struct alloc *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->node.key = addr;
    a->node.len = size;
    a->kind = kind;
    a->dev = dev;
    a->ctx = c;
    a->charged = charged;
    tn_insert(&g_allocs, &a->node);
    return a;
}

void alloc_release(struct alloc *a)
{
    struct device *d = &g_dev[a->dev];
    tn_remove(&g_allocs, a->node.key);
    switch (a->kind) {
    case AK_DEVICE:
        release_pages(a->node.key, a->charged);
        va_free(&d->va, a->node.key, a->charged);
        dev_uncharge(d, a->charged);
        break;
    case AK_MANAGED:
        munmap((void *)(uintptr_t)a->node.key, a->map_len);
        dev_uncharge(d, a->charged);
        break;
    case AK_POOL:
        /* The bytes go back to the pool, not the device: reserve stays. */
        va_free(&d->va, a->node.key, a->charged);
        a->pool->used -= a->charged;
        if (--a->pool->live == 0 && a->pool->destroyed)
            pool_finalize(a->pool);
        break;
    }
    free(a);
}

static CUresult device_alloc(struct ctx *c, uint64_t size, CUdeviceptr *dptr)
{
    struct device *d = &g_dev[c->dev];
    uint64_t charged = round_up(size, ALLOC_ROUND);
    if (!charged || !dev_charge(d, charged))
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t addr = va_alloc(&d->va, charged, ALLOC_ROUND, 0);
    if (!addr) {
        dev_uncharge(d, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!alloc_record(addr, size, AK_DEVICE, c->dev, c, charged)) {
        va_free(&d->va, addr, charged);
        dev_uncharge(d, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = addr;
    return CUDA_SUCCESS;
}

/* ---- Device memory ------------------------------------------------------------- */

static CUresult mem_alloc_locked(CUdeviceptr *dptr, size_t bytesize)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_guard());
    return device_alloc(c, bytesize, dptr);
}

IMPL CUresult impl_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    sim_lock();
    CUresult r = mem_alloc_locked(dptr, bytesize);
    sim_unlock();
    return r;
}

static CUresult mem_alloc_pitch_locked(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                       size_t height, unsigned int elem)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!dptr || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t p = round_up(width, ALLOC_ROUND);
    if (!p || height > UINT64_MAX / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CHECK(capture_guard());
    CHECK(device_alloc(c, p * height, dptr));
    *pitch = p;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                      size_t height, unsigned int elem)
{
    sim_lock();
    CUresult r = mem_alloc_pitch_locked(dptr, pitch, width, height, elem);
    sim_unlock();
    return r;
}

static CUresult mem_alloc_managed_locked(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_guard());
    struct device *d = &g_dev[c->dev];
    uint64_t charged = round_up(bytesize, ALLOC_ROUND);
    uint64_t map_len = round_up(bytesize, (uint64_t)sysconf(_SC_PAGESIZE));
    if (!charged || !map_len || !dev_charge(d, charged))
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* Managed memory is CPU-accessible, so it needs real pages. */
    void *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED || in_simulated_range((uint64_t)(uintptr_t)p, map_len)) {
        if (p != MAP_FAILED)
            munmap(p, map_len);
        dev_uncharge(d, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct alloc *a = alloc_record((uint64_t)(uintptr_t)p, bytesize, AK_MANAGED, c->dev, c, charged);
    if (!a) {
        munmap(p, map_len);
        dev_uncharge(d, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->map_len = map_len;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    sim_lock();
    CUresult r = mem_alloc_managed_locked(dptr, bytesize, flags);
    sim_unlock();
    return r;
}

static CUresult mem_free_locked(CUdeviceptr dptr)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    CHECK(capture_guard()); /* even cuMemFree(0), the "initialize" idiom */
    if (dptr == 0)
        return CUDA_SUCCESS;
    struct tnode *n = tn_find(g_allocs, dptr);
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    alloc_release((struct alloc *)n);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemFree_v2(CUdeviceptr dptr)
{
    sim_lock();
    CUresult r = mem_free_locked(dptr);
    sim_unlock();
    return r;
}

static CUresult mem_get_info_locked(size_t *free_bytes, size_t *total_bytes)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    const struct device *d = &g_dev[c->dev];
    if (free_bytes)
        *free_bytes = d->capacity - d->used;
    if (total_bytes)
        *total_bytes = d->capacity;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    sim_lock();
    CUresult r = mem_get_info_locked(free_bytes, total_bytes);
    sim_unlock();
    return r;
}

static CUresult mem_get_address_range_locked(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    struct tnode *n = tn_find_le(g_allocs, dptr);
    if (!n || dptr - n->key >= n->len)
        n = tn_find_le(g_maps, dptr);
    if (!n || dptr - n->key >= n->len)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = n->key;
    if (psize)
        *psize = n->len;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    sim_lock();
    CUresult r = mem_get_address_range_locked(pbase, psize, dptr);
    sim_unlock();
    return r;
}

/* ---- Pinned host memory ------------------------------------------------------------ */

static CUresult host_alloc_locked(void **pp, size_t bytesize, unsigned int flags)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!pp || bytesize == 0 ||
        (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                             CU_MEMHOSTALLOC_WRITECOMBINED)))
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_guard());
    uint64_t map_len = round_up(bytesize, (uint64_t)sysconf(_SC_PAGESIZE));
    if (!map_len || map_len > g_cfg.host_memory - g_host_used)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct host_alloc *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->node.key = (uint64_t)(uintptr_t)p;
    h->node.len = bytesize;
    h->map_len = map_len;
    tn_insert(&g_host, &h->node);
    g_host_used += map_len;
    *pp = p;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    sim_lock();
    CUresult r = host_alloc_locked(pp, bytesize, flags);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    sim_lock();
    CUresult r = host_alloc_locked(pp, bytesize, 0);
    sim_unlock();
    return r;
}

/* Host pointers never had a 32-bit ABI, so the legacy export works. */
IMPL CUresult impl_cuMemAllocHost_v1(void **pp, unsigned int bytesize)
{
    sim_lock();
    CUresult r = host_alloc_locked(pp, bytesize, 0);
    sim_unlock();
    return r;
}

static CUresult host_free_locked(void *p)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    struct tnode *n = p ? tn_find(g_host, (uint64_t)(uintptr_t)p) : NULL;
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_guard());
    struct host_alloc *h = (struct host_alloc *)n;
    tn_remove(&g_host, n->key);
    munmap(p, h->map_len);
    g_host_used -= h->map_len;
    free(h);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemFreeHost(void *p)
{
    sim_lock();
    CUresult r = host_free_locked(p);
    sim_unlock();
    return r;
}

/* ---- Legacy 32-bit ABI ------------------------------------------------------------------
 * These exports take CUdeviceptr_v1 (32 bits) or unsigned int sizes, which
 * cannot describe simcuda's 64-bit addresses. */

IMPL CUresult impl_cuMemGetInfo_v1(unsigned int *free_bytes, unsigned int *total_bytes)
{
    (void)free_bytes;
    (void)total_bytes;
    return legacy_not_supported();
}

IMPL CUresult impl_cuMemAlloc_v1(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    (void)dptr;
    (void)bytesize;
    return legacy_not_supported();
}

IMPL CUresult impl_cuMemAllocPitch_v1(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
                                      unsigned int height, unsigned int elem)
{
    (void)dptr;
    (void)pitch;
    (void)width;
    (void)height;
    (void)elem;
    return legacy_not_supported();
}

IMPL CUresult impl_cuMemFree_v1(CUdeviceptr_v1 dptr)
{
    (void)dptr;
    return legacy_not_supported();
}

IMPL CUresult impl_cuMemGetAddressRange_v1(CUdeviceptr_v1 *pbase, unsigned int *psize,
                                           CUdeviceptr_v1 dptr)
{
    (void)pbase;
    (void)psize;
    (void)dptr;
    return legacy_not_supported();
}

/* ---- Pointer attributes ---- */

/* CUpointer_attribute and CUmemorytype values (cuda.h). */
enum {
    PA_CONTEXT = 1, PA_MEMORY_TYPE = 2, PA_DEVICE_POINTER = 3, PA_HOST_POINTER = 4,
    PA_SYNC_MEMOPS = 6, PA_BUFFER_ID = 7, PA_IS_MANAGED = 8, PA_DEVICE_ORDINAL = 9,
    PA_IS_LEGACY_CUDA_IPC_CAPABLE = 10, PA_RANGE_START_ADDR = 11, PA_RANGE_SIZE = 12,
    PA_MAPPED = 13, PA_ALLOWED_HANDLE_TYPES = 14, PA_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
    PA_ACCESS_FLAGS = 16, PA_MEMPOOL_HANDLE = 17, PA_MAPPING_SIZE = 18,
    PA_MAPPING_BASE_ADDR = 19, PA_MEMORY_BLOCK_ID = 20,
};
enum { MEMTYPE_HOST = 1, MEMTYPE_DEVICE = 2 };

struct pointer_info {
    int known, managed, host, dev;
    struct ctx *ctx;
    uint64_t base, size;
    struct pool *pool;
};

static struct pointer_info pointer_lookup_locked(uint64_t p)
{
    struct pointer_info info = {0};
    struct tnode *n = tn_find_le(g_allocs, p);
    if (n && p < n->key + (n->len ? n->len : 1)) {
        struct alloc *a = (struct alloc *)n;
        info = (struct pointer_info){1, a->kind == AK_MANAGED, 0, a->dev, a->ctx,
                                     n->key, n->len, a->pool};
        return info;
    }
    if ((n = tn_find_le(g_host, p)) && p < n->key + n->len) {
        info = (struct pointer_info){1, 0, 1, 0, tls_top(), n->key, n->len, NULL};
        return info;
    }
    if ((n = tn_find_le(g_maps, p)) && p < n->key + n->len) {
        struct mapping *m = (struct mapping *)n;
        info = (struct pointer_info){1, 0, 0, g_phys[m->phys].dev,
                                     &g_dev[g_phys[m->phys].dev].primary, n->key, n->len, NULL};
    }
    return info;
}

static CUresult pointer_attribute_locked(const struct pointer_info *i, int attr, void *data,
                                         uint64_t p)
{
    switch (attr) {
    case PA_CONTEXT: *(CUcontext *)data = (CUcontext)i->ctx; break;
    case PA_MEMORY_TYPE: *(unsigned *)data = i->host ? MEMTYPE_HOST : MEMTYPE_DEVICE; break;
    case PA_DEVICE_POINTER: *(CUdeviceptr *)data = p; break;
    case PA_HOST_POINTER:
        if (!i->host && !i->managed)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)p;
        break;
    case PA_SYNC_MEMOPS: *(int *)data = 1; break;
    case PA_BUFFER_ID: *(unsigned long long *)data = i->base; break;
    case PA_IS_MANAGED: *(unsigned *)data = (unsigned)i->managed; break;
    case PA_DEVICE_ORDINAL: *(int *)data = i->dev; break;
    case PA_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = 0; break;
    case PA_RANGE_START_ADDR: *(CUdeviceptr *)data = i->base; break;
    case PA_RANGE_SIZE: *(size_t *)data = i->size; break;
    case PA_MAPPED: *(int *)data = 1; break;
    case PA_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = 0; break;
    case PA_IS_GPU_DIRECT_RDMA_CAPABLE: *(int *)data = 0; break;
    case PA_ACCESS_FLAGS: *(unsigned *)data = 3; /* CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE */
        break;
    case PA_MEMPOOL_HANDLE: *(CUmemoryPool *)data = (CUmemoryPool)i->pool; break;
    case PA_MAPPING_SIZE: *(size_t *)data = i->size; break;
    case PA_MAPPING_BASE_ADDR: *(CUdeviceptr *)data = i->base; break;
    case PA_MEMORY_BLOCK_ID: *(unsigned long long *)data = i->base; break;
    default:
        sim_trace("pointer attribute %d: unknown", attr);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = CUDA_SUCCESS;
    if (g_init_state != 1) {
        r = CUDA_ERROR_NOT_INITIALIZED;
    } else {
        struct pointer_info i = pointer_lookup_locked(p);
        r = i.known ? pointer_attribute_locked(&i, attr, data, p) : CUDA_ERROR_INVALID_VALUE;
    }
    sim_unlock();
    return r;
}

/* Unlike the single query, an address the driver does not know is not an
 * error here: its memory type reads as 0 ("unregistered host memory"). */
IMPL CUresult impl_cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p)
{
    if (!attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = g_init_state == 1 ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    struct pointer_info i = pointer_lookup_locked(p);
    for (unsigned k = 0; r == CUDA_SUCCESS && k < n; k++) {
        if (!data[k])
            continue;
        if (!i.known) {
            switch (attrs[k]) {
            case PA_CONTEXT: *(CUcontext *)data[k] = NULL; break;
            case PA_MEMORY_TYPE: *(unsigned *)data[k] = 0; break;
            case PA_DEVICE_POINTER: *(CUdeviceptr *)data[k] = 0; break;
            case PA_HOST_POINTER: *(void **)data[k] = NULL; break;
            case PA_IS_MANAGED: *(unsigned *)data[k] = 0; break;
            case PA_DEVICE_ORDINAL: *(int *)data[k] = -2; break;
            default: memset(data[k], 0, sizeof(int)); break;
            }
            continue;
        }
        if (pointer_attribute_locked(&i, attrs[k], data[k], p) != CUDA_SUCCESS)
            memset(data[k], 0, sizeof(int));
    }
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuMemHostGetDevicePointer(CUdeviceptr *dptr, void *p, unsigned flags)
{
    if (!dptr || flags)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    struct tnode *n = g_init_state == 1 ? tn_find_le(g_host, (uint64_t)(uintptr_t)p) : NULL;
    int ok = n && (uint64_t)(uintptr_t)p < n->key + n->len;
    sim_unlock();
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemHostGetFlags(unsigned *flags, void *p)
{
    CUdeviceptr d;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = impl_cuMemHostGetDevicePointer(&d, p, 0);
    if (r == CUDA_SUCCESS)
        *flags = 0x2; /* CU_MEMHOSTALLOC_DEVICEMAP: every pinned buffer is mapped */
    return r;
}

/* ---- Interface for the other driver files (internal.h) ------------------------------ */

int sim_addressable(uint64_t addr, uint64_t len)
{
    sim_lock();
    int ok = 0;
    struct tnode *n = tn_find_le(g_allocs, addr);
    if (n && addr + len <= n->key + ((struct alloc *)n)->charged)
        ok = 1;
    if (!ok && (n = tn_find_le(g_host, addr)) && addr + len <= n->key + n->len)
        ok = 1;
    if (!ok && (n = tn_find_le(g_maps, addr)) && addr + len <= n->key + n->len)
        ok = 1;
    sim_unlock();
    return ok;
}

/* ---- cuGetProcAddress entries (core.c searches this table after its own) ---- */

const struct sim_proc sim_procs_memory[] = {
    {"cuMemGetInfo", 2000, (void *)impl_cuMemGetInfo_v1, NULL},
    {"cuMemGetInfo", 3020, (void *)impl_cuMemGetInfo_v2, NULL},
    {"cuMemAlloc", 2000, (void *)impl_cuMemAlloc_v1, NULL},
    {"cuMemAlloc", 3020, (void *)impl_cuMemAlloc_v2, NULL},
    {"cuMemAllocPitch", 2000, (void *)impl_cuMemAllocPitch_v1, NULL},
    {"cuMemAllocPitch", 3020, (void *)impl_cuMemAllocPitch_v2, NULL},
    {"cuMemFree", 2000, (void *)impl_cuMemFree_v1, NULL},
    {"cuMemFree", 3020, (void *)impl_cuMemFree_v2, NULL},
    {"cuMemGetAddressRange", 2000, (void *)impl_cuMemGetAddressRange_v1, NULL},
    {"cuMemGetAddressRange", 3020, (void *)impl_cuMemGetAddressRange_v2, NULL},
    {"cuMemAllocHost", 2000, (void *)impl_cuMemAllocHost_v1, NULL},
    {"cuMemAllocHost", 3020, (void *)impl_cuMemAllocHost_v2, NULL},
    {"cuMemFreeHost", 2000, (void *)impl_cuMemFreeHost, NULL},
    {"cuMemHostAlloc", 2020, (void *)impl_cuMemHostAlloc, NULL},
    {"cuMemAllocManaged", 6000, (void *)impl_cuMemAllocManaged, NULL},
    {"cuPointerGetAttribute", 4000, (void *)impl_cuPointerGetAttribute, NULL},
    {"cuPointerGetAttributes", 7000, (void *)impl_cuPointerGetAttributes, NULL},
    {"cuMemHostGetDevicePointer", 3020, (void *)impl_cuMemHostGetDevicePointer, NULL},
    {"cuMemHostGetFlags", 2030, (void *)impl_cuMemHostGetFlags, NULL},
};
const size_t sim_nprocs_memory = sizeof sim_procs_memory / sizeof sim_procs_memory[0];

/* ---- Exports ------------------------------------------------------------------------------
 * Thin wrappers only: internal code never calls these. */

EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) { return impl_cuMemGetInfo_v2(free, total); }
EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total) { return impl_cuMemGetInfo_v1(free, total); }
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { return impl_cuMemAlloc_v2(dptr, bytesize); }
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) { return impl_cuMemAlloc_v1(dptr, bytesize); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes) { return impl_cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes); }
EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height, unsigned int ElementSizeBytes) { return impl_cuMemAllocPitch_v1(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return impl_cuMemFree_v2(dptr); }
EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) { return impl_cuMemFree_v1(dptr); }
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) { return impl_cuMemGetAddressRange_v2(pbase, psize, dptr); }
EXPORT CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize, CUdeviceptr_v1 dptr) { return impl_cuMemGetAddressRange_v1(pbase, psize, dptr); }
EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return impl_cuMemAllocHost_v2(pp, bytesize); }
EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize) { return impl_cuMemAllocHost_v1(pp, bytesize); }
EXPORT CUresult cuMemFreeHost(void *p) { return impl_cuMemFreeHost(p); }
EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) { return impl_cuMemHostAlloc(pp, bytesize, Flags); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) { return impl_cuMemAllocManaged(dptr, bytesize, flags); }
EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) { return impl_cuPointerGetAttribute(data, attr, p); }
EXPORT CUresult cuPointerGetAttributes(unsigned n, int *a, void **d, CUdeviceptr p) { return impl_cuPointerGetAttributes(n, a, d, p); }
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned f) { return impl_cuMemHostGetDevicePointer(d, p, f); }
EXPORT CUresult cuMemHostGetFlags(unsigned *f, void *p) { return impl_cuMemHostGetFlags(f, p); }
