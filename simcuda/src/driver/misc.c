/*
 * Context limits and settings, device identity queries, peer access and the
 * profiler switches: calls that real clients make at start-up and whose
 * answers only need to be those of the part simcuda claims (identity.h).
 *
 * Limits and cache settings are process-wide here, where a real driver keeps
 * them per context.  Peers never have access to each other (like GPUs on
 * separate PCIe switches without P2P).
 */
#define _GNU_SOURCE
#include "identity.h"
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static CUresult device_ok(CUdevice dev)
{
    CUresult r = sim_initialized();
    if (r != CUDA_SUCCESS)
        return r;
    return dev >= 0 && dev < sim_device_count() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

static CUresult ctx_ok(void)
{
    CUcontext c;
    return sim_current_ctx(&c);
}

/* ---- Limits (CUlimit) ------------------------------------------------------------- */

#define N_LIMITS 10
/* The two limits that can only be queried: the shared memory kernels may use, and
 * whether this is a CUDA-in-graphics (CIG) context. */
#define LIMIT_SHMEM_SIZE 7
#define LIMIT_CIG_ENABLED 8
static pthread_mutex_t g_misc_lock = PTHREAD_MUTEX_INITIALIZER;
/* stack size, printf FIFO, malloc heap, runtime sync depth, pending launches,
 * L2 fetch granularity, persisting L2 size: a fresh H100 context's values; then
 * (CUDA 12.5 on) the shared memory a kernel may use (the opt-in maximum: this is no CIG
 * context), CIG enabled (no) and CIG shared-memory fallback (on).  cuBLASLt 12.8 asks
 * whether the context is CIG before its first heuristic query and finds no algorithm
 * (CUBLAS_STATUS_NOT_SUPPORTED) if the driver refuses the question. */
static size_t g_limits[N_LIMITS] = {1024, 1u << 20, 8u << 20, 2, 2048, 32, 0, 232448, 0, 1};
static int g_cache_config;

IMPL CUresult impl_cuCtxGetLimit(size_t *value, int limit)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = ctx_ok();
    if (r != CUDA_SUCCESS)
        return r;
    if (limit < 0 || limit >= N_LIMITS)
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    pthread_mutex_lock(&g_misc_lock);
    *value = g_limits[limit];
    pthread_mutex_unlock(&g_misc_lock);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxSetLimit(int limit, size_t value)
{
    CUresult r = ctx_ok();
    if (r != CUDA_SUCCESS)
        return r;
    if (limit < 0 || limit >= N_LIMITS)
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    if (limit == LIMIT_SHMEM_SIZE || limit == LIMIT_CIG_ENABLED)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_misc_lock);
    g_limits[limit] = value;
    pthread_mutex_unlock(&g_misc_lock);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    CUresult r = ctx_ok();
    if (r != CUDA_SUCCESS)
        return r;
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxGetCacheConfig(int *config)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = ctx_ok();
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_misc_lock);
        *config = g_cache_config;
        pthread_mutex_unlock(&g_misc_lock);
    }
    return r;
}

IMPL CUresult impl_cuCtxSetCacheConfig(int config)
{
    if (config < 0 || config > 3)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = ctx_ok();
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_misc_lock);
        g_cache_config = config;
        pthread_mutex_unlock(&g_misc_lock);
    }
    return r;
}

IMPL CUresult impl_cuCtxGetSharedMemConfig(int *config)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = ctx_ok();
    if (r == CUDA_SUCCESS)
        *config = 0; /* CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE */
    return r;
}

IMPL CUresult impl_cuCtxSetSharedMemConfig(int config)
{
    (void)config;
    return ctx_ok();
}

IMPL CUresult impl_cuCtxGetApiVersion(CUcontext ctx, unsigned *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev;
    CUresult r = sim_ctx_device(ctx, &dev);
    if (r == CUDA_SUCCESS)
        *version = 3020; /* the context ABI every context since CUDA 3.2 reports */
    return r;
}

IMPL CUresult impl_cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev;
    if (!ctx) {
        CUresult r = sim_current_ctx(&ctx);
        if (r != CUDA_SUCCESS)
            return r;
    }
    CUresult r = sim_ctx_device(ctx, &dev);
    if (r == CUDA_SUCCESS)
        *id = (unsigned long long)(uintptr_t)ctx;
    return r;
}

IMPL CUresult impl_cuCtxResetPersistingL2Cache(void) { return ctx_ok(); }

/* ---- Device identity ------------------------------------------------------------------ */

IMPL CUresult impl_cuDeviceGetUuid(sim_uuid *uuid, CUdevice dev)
{
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_ok(dev);
    if (r == CUDA_SUCCESS)
        simcuda_device_uuid(dev, uuid->bytes);
    return r;
}

/* Linux has no LUID (a Windows adapter id). */
IMPL CUresult impl_cuDeviceGetLuid(char *luid, unsigned *mask, CUdevice dev)
{
    (void)luid, (void)mask;
    CUresult r = device_ok(dev);
    return r != CUDA_SUCCESS ? r : CUDA_ERROR_NOT_SUPPORTED;
}

IMPL CUresult impl_cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev)
{
    if (!bus_id || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_ok(dev);
    if (r == CUDA_SUCCESS)
        snprintf(bus_id, (size_t)len, "%04x:%02x:%02x.0", (unsigned)simcuda_pci_domain(dev),
                 (unsigned)simcuda_pci_bus(dev), (unsigned)simcuda_pci_device(dev));
    return r;
}

IMPL CUresult impl_cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus_id)
{
    if (!dev || !bus_id)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_initialized();
    if (r != CUDA_SUCCESS)
        return r;
    unsigned domain = 0, bus = 0, device = 0;
    if (sscanf(bus_id, "%x:%x:%x", &domain, &bus, &device) != 3) {
        domain = 0;
        if (sscanf(bus_id, "%x:%x", &bus, &device) != 2)
            return CUDA_ERROR_INVALID_VALUE;
    }
    for (int d = 0; d < sim_device_count(); d++) {
        if ((unsigned)simcuda_pci_domain(d) == domain && (unsigned)simcuda_pci_bus(d) == bus &&
            (unsigned)simcuda_pci_device(d) == device) {
            *dev = d;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

IMPL CUresult impl_cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_ok(dev);
    if (r == CUDA_SUCCESS) {
        *major = SIMCUDA_CC_MAJOR;
        *minor = SIMCUDA_CC_MINOR;
    }
    return r;
}

/* ---- Peers --------------------------------------------------------------------------- */

IMPL CUresult impl_cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_ok(dev);
    if (r == CUDA_SUCCESS)
        r = device_ok(peer);
    if (r == CUDA_SUCCESS)
        *can = 0;
    return r;
}

IMPL CUresult impl_cuDeviceGetP2PAttribute(int *value, int attr, CUdevice src, CUdevice dst)
{
    (void)attr;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_ok(src);
    if (r == CUDA_SUCCESS)
        r = device_ok(dst);
    if (r == CUDA_SUCCESS)
        *value = 0;
    return r;
}

IMPL CUresult impl_cuCtxEnablePeerAccess(CUcontext peer, unsigned flags)
{
    (void)peer, (void)flags;
    CUresult r = ctx_ok();
    return r != CUDA_SUCCESS ? r : CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
}

IMPL CUresult impl_cuCtxDisablePeerAccess(CUcontext peer)
{
    (void)peer;
    CUresult r = ctx_ok();
    return r != CUDA_SUCCESS ? r : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

/* ---- Profiler ------------------------------------------------------------------------- */

IMPL CUresult impl_cuProfilerStart(void) { return ctx_ok(); }
IMPL CUresult impl_cuProfilerStop(void) { return ctx_ok(); }

#define FN(x) (void *)(x)

const struct sim_proc sim_procs_misc[] = {
    {"cuCtxGetLimit", 3010, FN(impl_cuCtxGetLimit), NULL},
    {"cuCtxSetLimit", 3010, FN(impl_cuCtxSetLimit), NULL},
    {"cuCtxGetStreamPriorityRange", 5050, FN(impl_cuCtxGetStreamPriorityRange), NULL},
    {"cuCtxGetCacheConfig", 3020, FN(impl_cuCtxGetCacheConfig), NULL},
    {"cuCtxSetCacheConfig", 3020, FN(impl_cuCtxSetCacheConfig), NULL},
    {"cuCtxGetSharedMemConfig", 4020, FN(impl_cuCtxGetSharedMemConfig), NULL},
    {"cuCtxSetSharedMemConfig", 4020, FN(impl_cuCtxSetSharedMemConfig), NULL},
    {"cuCtxGetApiVersion", 3020, FN(impl_cuCtxGetApiVersion), NULL},
    {"cuCtxGetId", 12000, FN(impl_cuCtxGetId), NULL},
    {"cuCtxResetPersistingL2Cache", 11000, FN(impl_cuCtxResetPersistingL2Cache), NULL},
    {"cuDeviceGetUuid", 9020, FN(impl_cuDeviceGetUuid), NULL},
    {"cuDeviceGetUuid", 11040, FN(impl_cuDeviceGetUuid), NULL},
    {"cuDeviceGetLuid", 10000, FN(impl_cuDeviceGetLuid), NULL},
    {"cuDeviceGetPCIBusId", 4010, FN(impl_cuDeviceGetPCIBusId), NULL},
    {"cuDeviceGetByPCIBusId", 4010, FN(impl_cuDeviceGetByPCIBusId), NULL},
    {"cuDeviceComputeCapability", 2000, FN(impl_cuDeviceComputeCapability), NULL},
    {"cuDeviceCanAccessPeer", 4000, FN(impl_cuDeviceCanAccessPeer), NULL},
    {"cuDeviceGetP2PAttribute", 8000, FN(impl_cuDeviceGetP2PAttribute), NULL},
    {"cuCtxEnablePeerAccess", 4000, FN(impl_cuCtxEnablePeerAccess), NULL},
    {"cuCtxDisablePeerAccess", 4000, FN(impl_cuCtxDisablePeerAccess), NULL},
    {"cuProfilerStart", 4000, FN(impl_cuProfilerStart), NULL},
    {"cuProfilerStop", 4000, FN(impl_cuProfilerStop), NULL},
};
const size_t sim_nprocs_misc = sizeof sim_procs_misc / sizeof sim_procs_misc[0];

EXPORT CUresult cuCtxGetLimit(size_t *v, int l) { return impl_cuCtxGetLimit(v, l); }
EXPORT CUresult cuCtxSetLimit(int l, size_t v) { return impl_cuCtxSetLimit(l, v); }
EXPORT CUresult cuCtxGetStreamPriorityRange(int *a, int *b)
{
    return impl_cuCtxGetStreamPriorityRange(a, b);
}
EXPORT CUresult cuCtxGetCacheConfig(int *c) { return impl_cuCtxGetCacheConfig(c); }
EXPORT CUresult cuCtxSetCacheConfig(int c) { return impl_cuCtxSetCacheConfig(c); }
EXPORT CUresult cuCtxGetSharedMemConfig(int *c) { return impl_cuCtxGetSharedMemConfig(c); }
EXPORT CUresult cuCtxSetSharedMemConfig(int c) { return impl_cuCtxSetSharedMemConfig(c); }
EXPORT CUresult cuCtxGetApiVersion(CUcontext c, unsigned *v)
{
    return impl_cuCtxGetApiVersion(c, v);
}
EXPORT CUresult cuCtxGetId(CUcontext c, unsigned long long *id) { return impl_cuCtxGetId(c, id); }
EXPORT CUresult cuCtxResetPersistingL2Cache(void) { return impl_cuCtxResetPersistingL2Cache(); }
EXPORT CUresult cuDeviceGetUuid(sim_uuid *u, CUdevice d) { return impl_cuDeviceGetUuid(u, d); }
EXPORT CUresult cuDeviceGetUuid_v2(sim_uuid *u, CUdevice d) { return impl_cuDeviceGetUuid(u, d); }
EXPORT CUresult cuDeviceGetLuid(char *l, unsigned *m, CUdevice d)
{
    return impl_cuDeviceGetLuid(l, m, d);
}
EXPORT CUresult cuDeviceGetPCIBusId(char *b, int n, CUdevice d)
{
    return impl_cuDeviceGetPCIBusId(b, n, d);
}
EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *d, const char *b)
{
    return impl_cuDeviceGetByPCIBusId(d, b);
}
EXPORT CUresult cuDeviceComputeCapability(int *a, int *b, CUdevice d)
{
    return impl_cuDeviceComputeCapability(a, b, d);
}
EXPORT CUresult cuDeviceCanAccessPeer(int *c, CUdevice d, CUdevice p)
{
    return impl_cuDeviceCanAccessPeer(c, d, p);
}
EXPORT CUresult cuDeviceGetP2PAttribute(int *v, int a, CUdevice s, CUdevice d)
{
    return impl_cuDeviceGetP2PAttribute(v, a, s, d);
}
EXPORT CUresult cuCtxEnablePeerAccess(CUcontext p, unsigned f)
{
    return impl_cuCtxEnablePeerAccess(p, f);
}
EXPORT CUresult cuCtxDisablePeerAccess(CUcontext p) { return impl_cuCtxDisablePeerAccess(p); }
EXPORT CUresult cuProfilerStart(void) { return impl_cuProfilerStart(); }
EXPORT CUresult cuProfilerStop(void) { return impl_cuProfilerStop(); }
