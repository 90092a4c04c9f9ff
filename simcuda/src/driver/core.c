/*
 * libcuda.so.1 from simcuda: a simulated CUDA 13.2 driver, so that a GPU
 * memory tracer can be tested without a GPU, against real clients (the real
 * PyTorch wheel among them).  This file is the core: configuration, the
 * global state and its one mutex, cuInit, errors, devices, primary and
 * ordinary contexts, and cuGetProcAddress with the table of every area's
 * tables, with the real ABI and real error codes.  Each other area is a file
 * of its own beside this one (internal.h lists them; core.h holds the state
 * the core areas share and says which may touch what).
 *
 * Where simcuda differs from the real driver
 * ------------------------------------------
 * (Each area's file lists its own; these are the core's.)
 *  - One mutex serialises every call.
 *  - The driver's own threads: one, started at the first successful cuInit,
 *    which does nothing (a real driver's handle events and callbacks).
 *  - cuGetProcAddress knows the functions in the tables (with their real
 *    introduction versions); any other real CUDA function is found and
 *    answers CUDA_ERROR_NOT_SUPPORTED (driver/unsupported.c); anything else
 *    is "not found".
 *  - A context costs SIMCUDA_CONTEXT_BYTES of device memory; a real driver
 *    keeps memory of its own besides.
 *  - Destroying a context frees the device memory allocated in it (stream-
 *    ordered allocations included) but leaves pinned host memory alone.
 *  - The first-generation exports with 32-bit pointers or sizes
 *    (cuDeviceTotalMem here; cuMemAlloc, cuMemFree, cuMemGetInfo, ... in
 *    memory.c) answer CUDA_ERROR_NOT_SUPPORTED.
 *  - Device attributes describe an H100 SXM5 (identity.h); unknown attributes
 *    are CUDA_ERROR_INVALID_VALUE.
 */
#define _GNU_SOURCE
#define SIMCUDA_NO_V2_MACROS
#include "core.h"
#include "identity.h"
#include "size_setting.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#define CTX_STACK_MAX 64
#define MAX_CAPACITY (1ull << 40)

/* ---- State (core.h says which area may touch what) ---------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

struct sim_config g_cfg;

int g_init_state; /* 0: cuInit not called, 1: ready, -1: failed */
static CUresult g_init_result;
int g_ndev;
struct device g_dev[MAX_DEVICES];
static struct ctx *g_ctxs;

static __thread struct ctx *tls_stack[CTX_STACK_MAX];
static __thread int tls_depth;

void sim_lock(void) { pthread_mutex_lock(&g_lock); }
void sim_unlock(void) { pthread_mutex_unlock(&g_lock); }

/* ---- Configuration -------------------------------------------------------- */

static uint64_t env_size(const char *name, uint64_t def, uint64_t min, uint64_t max, int plain)
{
    const char *s = getenv(name);
    uint64_t v;
    if (!s)
        return def;
    if (!simcuda_parse_size(s, &v) || v < min || v > max || (plain && s[strspn(s, "0123456789")])) {
        fprintf(stderr, "simcuda: bad %s=%s; using default\n", name, s);
        return def;
    }
    return v;
}

static void load_config(void)
{
    g_cfg.devices = (int)env_size("SIMCUDA_DEVICES", 1, 0, MAX_DEVICES, 1);
    g_cfg.memory = env_size("SIMCUDA_MEMORY", 16ull << 30, 1, MAX_CAPACITY, 0);
    g_cfg.context_bytes = env_size("SIMCUDA_CONTEXT_BYTES", 0, 0, UINT64_MAX, 0);
    g_cfg.host_memory = env_size("SIMCUDA_HOST_MEMORY", 64ull << 30, 0, UINT64_MAX, 0);
}

/* ---- Devices, contexts ------------------------------------------------------ */

int dev_valid(CUdevice dev) { return dev >= 0 && dev < g_ndev; }

int dev_charge(struct device *d, uint64_t bytes)
{
    if (bytes > d->capacity - d->used)
        return 0;
    d->used += bytes;
    return 1;
}

void dev_uncharge(struct device *d, uint64_t bytes) { d->used -= bytes; }

/* A handle this driver issued and has not destroyed (primary contexts are
 * permanent objects, as their handles are in the real driver). */
static int ctx_known(const struct ctx *c)
{
    for (int d = 0; d < g_ndev; d++)
        if (c == &g_dev[d].primary)
            return 1;
    for (const struct ctx *p = g_ctxs; p; p = p->next)
        if (p == c)
            return 1;
    return 0;
}

static int ctx_usable(const struct ctx *c) { return c && ctx_known(c) && (!c->primary || c->active); }

struct ctx *tls_top(void) { return tls_depth ? tls_stack[tls_depth - 1] : NULL; }

CUresult current_ctx(struct ctx **out)
{
    struct ctx *c = tls_top();
    if (!ctx_usable(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

/* Everything a context owns goes with it, as in the real driver. */
static void ctx_teardown(struct ctx *c)
{
    struct tnode *n;
    uint64_t k = 0;
    while ((n = tn_find_ge(g_allocs, k))) {
        k = n->key + 1;
        if (((struct alloc *)n)->ctx == c)
            alloc_release((struct alloc *)n);
    }
    k = 0;
    while ((n = tn_find_ge(g_streams, k))) {
        k = n->key + 1;
        if (((struct stream *)n)->ctx == c)
            stream_release((struct stream *)n);
    }
}

/* ---- Initialization --------------------------------------------------------- */

static CUresult init_locked(void)
{
    if (g_init_state)
        return g_init_result;
    load_config();
    g_init_state = -1;
    g_init_result = CUDA_ERROR_NO_DEVICE;
    if (g_cfg.devices == 0)
        return g_init_result;
    g_init_result = CUDA_ERROR_OUT_OF_MEMORY;
    for (int d = 0; d < g_cfg.devices; d++) {
        struct device *dev = &g_dev[d];
        uint64_t base = DEV_VA_BASE + (uint64_t)d * DEV_VA_SPAN;
        dev->capacity = g_cfg.memory;
        dev->primary.dev = d;
        dev->primary.primary = 1;
        if (!va_init(&dev->va, base, DEV_VA_SPAN))
            return g_init_result;
        reserve_host_range(base, DEV_VA_SPAN, PROT_READ | PROT_WRITE);
        dev->default_pool = dev->current_pool = pool_new(d, 1);
        if (!dev->default_pool)
            return g_init_result;
    }
    if (!va_init(&g_vmm_va, VMM_VA_BASE, VMM_VA_SPAN))
        return g_init_result;
    reserve_host_range(VMM_VA_BASE, VMM_VA_SPAN, PROT_NONE);
    g_ndev = g_cfg.devices;
    g_init_state = 1;
    return g_init_result = CUDA_SUCCESS;
}

/* The driver's own thread.  A real driver starts threads of its own once it
 * is initialised (gdb shows new threads after the first CUDA call; NVIDIA:
 * "the CUDA driver will create additional threads from time to time"), so a
 * CUDA process is never single-threaded.  That matters beyond `ps`: glibc's
 * malloc takes its single-thread path (no arena lock) only while a process has
 * one thread, so a program's every calloc and free costs more once any second
 * thread exists, as it does under a real driver from cuInit on.  This one
 * does nothing: it waits forever with every signal blocked (signals go to the
 * program's threads, as before), detached, on a small stack.  Not in a fork
 * child of an initialised process (the once has run), where the real driver
 * is unusable anyway. */
static pthread_once_t g_helper_once = PTHREAD_ONCE_INIT;

static void *helper_main(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static void start_helper_thread(void)
{
    sigset_t all, old;
    sigfillset(&all);
    /* The new thread inherits the mask: every signal blocked there. */
    if (pthread_sigmask(SIG_SETMASK, &all, &old) != 0)
        return;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        pthread_t t;
        if (pthread_create(&t, &attr, helper_main, NULL) == 0)
            pthread_setname_np(t, "simcuda-driver");
        pthread_attr_destroy(&attr);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

IMPL CUresult impl_cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = init_locked();
    sim_unlock();
    if (r == CUDA_SUCCESS)
        pthread_once(&g_helper_once, start_helper_thread);
    return r;
}

IMPL CUresult impl_cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* ---- Errors --------------------------------------------------------------- */

static const struct {
    CUresult code;
    const char *name, *text;
} k_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_PROFILER_DISABLED, "CUDA_ERROR_PROFILER_DISABLED", "profiler disabled"},
    {CUDA_ERROR_PROFILER_NOT_INITIALIZED, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", "profiler not initialized"},
    {CUDA_ERROR_PROFILER_ALREADY_STARTED, "CUDA_ERROR_PROFILER_ALREADY_STARTED", "profiler already started"},
    {CUDA_ERROR_PROFILER_ALREADY_STOPPED, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", "profiler already stopped"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "device unavailable"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_DEVICE_NOT_LICENSED, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device not licensed"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "invalid image"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "map failed"},
    {CUDA_ERROR_UNMAP_FAILED, "CUDA_ERROR_UNMAP_FAILED", "unmap failed"},
    {CUDA_ERROR_ARRAY_IS_MAPPED, "CUDA_ERROR_ARRAY_IS_MAPPED", "array is mapped"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no binary for gpu"},
    {CUDA_ERROR_ALREADY_ACQUIRED, "CUDA_ERROR_ALREADY_ACQUIRED", "already acquired"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", "not mapped as array"},
    {CUDA_ERROR_NOT_MAPPED_AS_POINTER, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", "not mapped as pointer"},
    {CUDA_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE", "ecc uncorrectable"},
    {CUDA_ERROR_UNSUPPORTED_LIMIT, "CUDA_ERROR_UNSUPPORTED_LIMIT", "unsupported limit"},
    {CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "context already in use"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access unsupported"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "invalid ptx"},
    {CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", "invalid graphics context"},
    {CUDA_ERROR_NVLINK_UNCORRECTABLE, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "nvlink uncorrectable"},
    {CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "jit compiler not found"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "unsupported ptx version"},
    {CUDA_ERROR_JIT_COMPILATION_DISABLED, "CUDA_ERROR_JIT_COMPILATION_DISABLED", "jit compilation disabled"},
    {CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "the provided execution affinity is not supported"},
    {CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", "unsupported devside sync"},
    {CUDA_ERROR_CONTAINED, "CUDA_ERROR_CONTAINED", "contained"},
    {CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "invalid source"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "shared object symbol not found"},
    {CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "shared object init failed"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "operating system"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_LOSSY_QUERY, "CUDA_ERROR_LOSSY_QUERY", "lossy query"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "launch out of resources"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "launch timeout"},
    {CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", "launch incompatible texturing"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access already enabled"},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access not enabled"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_ASSERT, "CUDA_ERROR_ASSERT", "assert"},
    {CUDA_ERROR_TOO_MANY_PEERS, "CUDA_ERROR_TOO_MANY_PEERS", "too many peers"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "host memory already registered"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "host memory not registered"},
    {CUDA_ERROR_HARDWARE_STACK_ERROR, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "illegal instruction"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_INVALID_ADDRESS_SPACE, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "invalid address space"},
    {CUDA_ERROR_INVALID_PC, "CUDA_ERROR_INVALID_PC", "invalid pc"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "launch failed"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "cooperative launch too large"},
    {CUDA_ERROR_TENSOR_MEMORY_LEAK, "CUDA_ERROR_TENSOR_MEMORY_LEAK", "tensor memory leak"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY", "system not ready"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system driver mismatch"},
    {CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "compat not supported on device"},
    {CUDA_ERROR_MPS_CONNECTION_FAILED, "CUDA_ERROR_MPS_CONNECTION_FAILED", "mps connection failed"},
    {CUDA_ERROR_MPS_RPC_FAILURE, "CUDA_ERROR_MPS_RPC_FAILURE", "mps rpc failure"},
    {CUDA_ERROR_MPS_SERVER_NOT_READY, "CUDA_ERROR_MPS_SERVER_NOT_READY", "mps server not ready"},
    {CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", "mps max clients reached"},
    {CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "mps max connections reached"},
    {CUDA_ERROR_MPS_CLIENT_TERMINATED, "CUDA_ERROR_MPS_CLIENT_TERMINATED", "mps client terminated"},
    {CUDA_ERROR_CDP_NOT_SUPPORTED, "CUDA_ERROR_CDP_NOT_SUPPORTED", "cdp not supported"},
    {CUDA_ERROR_CDP_VERSION_MISMATCH, "CUDA_ERROR_CDP_VERSION_MISMATCH", "cdp version mismatch"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "stream capture unsupported"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "stream capture invalidated"},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "stream capture merge"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "stream capture unmatched"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "stream capture unjoined"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "stream capture isolation"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "stream capture implicit"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT", "captured event"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "stream capture wrong thread"},
    {CUDA_ERROR_TIMEOUT, "CUDA_ERROR_TIMEOUT", "timeout"},
    {CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "graph exec update failure"},
    {CUDA_ERROR_EXTERNAL_DEVICE, "CUDA_ERROR_EXTERNAL_DEVICE", "external device"},
    {CUDA_ERROR_INVALID_CLUSTER_SIZE, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "invalid cluster size"},
    {CUDA_ERROR_FUNCTION_NOT_LOADED, "CUDA_ERROR_FUNCTION_NOT_LOADED", "function not loaded"},
    {CUDA_ERROR_INVALID_RESOURCE_TYPE, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "invalid resource type"},
    {CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", "invalid resource configuration"},
    {CUDA_ERROR_KEY_ROTATION, "CUDA_ERROR_KEY_ROTATION", "key rotation"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult code, const char **out, int want_name)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++) {
        if (k_errors[i].code == code) {
            *out = want_name ? k_errors[i].name : k_errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

IMPL CUresult impl_cuGetErrorString(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, 0);
}

IMPL CUresult impl_cuGetErrorName(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, 1);
}

/* ---- Device queries ----------------------------------------------------------- */

IMPL CUresult impl_cuDeviceGetCount(int *count)
{
    sim_lock();
    CUresult r = CUDA_ERROR_NOT_INITIALIZED;
    if (g_init_state == 1) {
        r = CUDA_ERROR_INVALID_VALUE;
        if (count) {
            *count = g_ndev;
            r = CUDA_SUCCESS;
        }
    }
    sim_unlock();
    return r;
}

static CUresult device_get_locked(CUdevice *device, int ordinal)
{
    REQUIRE_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceGet(CUdevice *device, int ordinal)
{
    sim_lock();
    CUresult r = device_get_locked(device, ordinal);
    sim_unlock();
    return r;
}

static CUresult device_get_name_locked(char *name, int len, CUdevice dev)
{
    REQUIRE_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", SIMCUDA_DEVICE_NAME);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceGetName(char *name, int len, CUdevice dev)
{
    sim_lock();
    CUresult r = device_get_name_locked(name, len, dev);
    sim_unlock();
    return r;
}

static CUresult device_total_mem_locked(size_t *bytes, CUdevice dev)
{
    REQUIRE_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_dev[dev].capacity;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    sim_lock();
    CUresult r = device_total_mem_locked(bytes, dev);
    sim_unlock();
    return r;
}

/* Attributes of an H100 SXM5 (what cudaGetDeviceProperties reads: it asks for
 * nearly all of them and fails on the first it is refused).  Indexed by the
 * attribute's value in CUDA 13.2's cuda.h; {1, v} marks a known attribute.
 * PCI_BUS_ID (33) comes from identity.h.  139 is not in the public header, but
 * cudart 13.2 asks for it and gives up on the device if it is refused. */
static const struct {
    int known, value;
} k_attrs[149] = {
        [1] = {1, 1024}, [2] = {1, 1024}, [3] = {1, 1024}, [4] = {1, 64}, [5] = {1, 2147483647},
        [6] = {1, 65535}, [7] = {1, 65535}, [8] = {1, 49152}, [9] = {1, 65536}, [10] = {1, 32},
        [11] = {1, 2147483647}, [12] = {1, 65536}, [13] = {1, 1980000}, [14] = {1, 512},
        [15] = {1, 1}, [16] = {1, SIMCUDA_SM_COUNT}, [17] = {1, 0}, [18] = {1, 0}, [19] = {1, 1},
        [20] = {1, 0}, [21] = {1, 131072}, [22] = {1, 131072}, [23] = {1, 65536},
        [24] = {1, 16384}, [25] = {1, 16384}, [26] = {1, 16384}, [27] = {1, 32768},
        [28] = {1, 32768}, [29] = {1, 2048}, [30] = {1, 512}, [31] = {1, 1}, [32] = {1, 1},
        [34] = {1, 0}, [35] = {1, 0}, [36] = {1, 2619000}, [37] = {1, 5120},
        [38] = {1, 52428800}, [39] = {1, 2048}, [40] = {1, 3}, [41] = {1, 1}, [42] = {1, 32768},
        [43] = {1, 2048}, [44] = {1, 1}, [45] = {1, 32768}, [46] = {1, 32768}, [47] = {1, 8192},
        [48] = {1, 8192}, [49] = {1, 32768}, [50] = {1, 0}, [51] = {1, 32}, [52] = {1, 32768},
        [53] = {1, 32768}, [54] = {1, 2046}, [55] = {1, 32768}, [56] = {1, 131072},
        [57] = {1, 65536}, [58] = {1, 16384}, [59] = {1, 16384}, [60] = {1, 16384},
        [61] = {1, 32768}, [62] = {1, 2048}, [63] = {1, 32768}, [64] = {1, 32768},
        [65] = {1, 2048}, [66] = {1, 32768}, [67] = {1, 32768}, [68] = {1, 2046},
        [69] = {1, 268435456}, [70] = {1, 131072}, [71] = {1, 65000}, [72] = {1, 2097120},
        [73] = {1, 32768}, [74] = {1, 32768}, [75] = {1, SIMCUDA_CC_MAJOR},
        [76] = {1, SIMCUDA_CC_MINOR}, [77] = {1, 32768}, [78] = {1, 1}, [79] = {1, 1},
        [80] = {1, 1}, [81] = {1, 233472}, [82] = {1, 65536}, [83] = {1, 1}, [84] = {1, 0},
        [85] = {1, 0}, [86] = {1, 0}, [87] = {1, 2}, [88] = {1, 0}, [89] = {1, 1}, [90] = {1, 1},
        [91] = {1, 0}, [92] = {1, 0}, [93] = {1, 0}, [94] = {1, 0}, [95] = {1, 1}, [96] = {1, 0},
        [97] = {1, 232448}, [98] = {1, 0}, [99] = {1, 1}, [100] = {1, 0}, [101] = {1, 0},
        [102] = {1, 1}, [103] = {1, 1}, [104] = {1, 0}, [105] = {1, 0}, [106] = {1, 32},
        [107] = {1, 1}, [108] = {1, 31457280}, [109] = {1, 134213632}, [110] = {1, 1},
        [111] = {1, 1024}, [112] = {1, 1}, [113] = {1, 1}, [114] = {1, 1}, [115] = {1, 1},
        [116] = {1, 1}, [117] = {1, 1}, [118] = {1, 100}, [119] = {1, 1}, [120] = {1, 1},
        [121] = {1, 1}, [122] = {1, 1}, [123] = {1, 1}, [124] = {1, 0}, [125] = {1, 1},
        [126] = {1, 4}, [127] = {1, 1}, [128] = {1, 0}, [129] = {1, 0}, [130] = {1, 0},
        [131] = {1, -1}, [132] = {1, 0}, [133] = {1, 0}, [134] = {1, -1}, [135] = {1, 0},
        [136] = {1, 0}, [137] = {1, 0}, [138] = {1, 0}, [139] = {1, 0}, [140] = {1, 0}, [141] = {1, 0},
        [142] = {1, 0}, [143] = {1, 0}, [144] = {1, 0}, [145] = {1, 0}, [146] = {1, 0},
        [147] = {1, 0}, [148] = {1, 0},
};

static CUresult device_get_attribute_locked(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    REQUIRE_INIT();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (attrib == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) {
        *pi = simcuda_pci_bus(dev);
        return CUDA_SUCCESS;
    }
    if ((int)attrib < 0 || (size_t)attrib >= sizeof k_attrs / sizeof k_attrs[0] ||
        !k_attrs[attrib].known) {
        sim_trace("device attribute %d: unknown", (int)attrib);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pi = k_attrs[attrib].value;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    sim_lock();
    CUresult r = device_get_attribute_locked(pi, attrib, dev);
    sim_unlock();
    return r;
}

/* ---- Primary contexts ---------------------------------------------------------- */

static CUresult primary_retain_locked(CUcontext *pctx, CUdevice dev)
{
    REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct device *d = &g_dev[dev];
    if (d->primary.refcount == 0) {
        /* Creating a context costs device memory on a real GPU too. */
        if (!dev_charge(d, g_cfg.context_bytes))
            return CUDA_ERROR_OUT_OF_MEMORY;
        d->primary.active = 1;
    }
    d->primary.refcount++;
    *pctx = (CUcontext)&d->primary;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    sim_lock();
    CUresult r = primary_retain_locked(pctx, dev);
    sim_unlock();
    return r;
}

static CUresult primary_release_locked(CUdevice dev)
{
    REQUIRE_INIT();
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct device *d = &g_dev[dev];
    if (d->primary.refcount == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--d->primary.refcount == 0) {
        ctx_teardown(&d->primary);
        dev_uncharge(d, g_cfg.context_bytes);
        d->primary.active = 0;
    }
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    sim_lock();
    CUresult r = primary_release_locked(dev);
    sim_unlock();
    return r;
}

/* The pre-11.0 ABI had the same signature; the semantics simcuda models are
 * the same too. */
IMPL CUresult impl_cuDevicePrimaryCtxRelease_v1(CUdevice dev)
{
    sim_lock();
    CUresult r = primary_release_locked(dev);
    sim_unlock();
    return r;
}

static CUresult primary_reset_locked(CUdevice dev)
{
    REQUIRE_INIT();
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct device *d = &g_dev[dev];
    if (d->primary.active)
        ctx_teardown(&d->primary);
    trim_device_pools(dev);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    sim_lock();
    CUresult r = primary_reset_locked(dev);
    sim_unlock();
    if (r == CUDA_SUCCESS)
        sim_cls_context_gone((CUcontext)&g_dev[dev].primary);
    return r;
}

IMPL CUresult impl_cuDevicePrimaryCtxReset_v1(CUdevice dev)
{
    sim_lock();
    CUresult r = primary_reset_locked(dev);
    sim_unlock();
    if (r == CUDA_SUCCESS)
        sim_cls_context_gone((CUcontext)&g_dev[dev].primary);
    return r;
}

static CUresult primary_get_state_locked(CUdevice dev, unsigned int *flags, int *active)
{
    REQUIRE_INIT();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = g_dev[dev].primary.flags;
    *active = g_dev[dev].primary.active;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    sim_lock();
    CUresult r = primary_get_state_locked(dev, flags, active);
    sim_unlock();
    return r;
}

/* ---- Contexts ------------------------------------------------------------------- */

static CUresult ctx_create_locked(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REQUIRE_INIT();
    if (!pctx || (flags & ~(unsigned)CU_CTX_FLAGS_MASK))
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (tls_depth == CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct ctx *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!dev_charge(&g_dev[dev], g_cfg.context_bytes)) {
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->dev = dev;
    c->flags = flags;
    c->next = g_ctxs;
    g_ctxs = c;
    tls_stack[tls_depth++] = c; /* a new context is pushed on the caller's stack */
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxCreate_v1(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    sim_lock();
    CUresult r = ctx_create_locked(pctx, flags, dev);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    sim_lock();
    CUresult r = ctx_create_locked(pctx, flags, dev);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                  int numParams, unsigned int flags, CUdevice dev)
{
    if (numParams < 0 || (numParams > 0 && !paramsArray))
        return CUDA_ERROR_INVALID_VALUE;
    if (numParams > 0)
        return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY; /* no MPS, no SM partitions */
    sim_lock();
    CUresult r = ctx_create_locked(pctx, flags, dev);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                  CUdevice dev)
{
    if (params) {
        if (params->numExecAffinityParams < 0 ||
            (params->numExecAffinityParams > 0 && !params->execAffinityParams))
            return CUDA_ERROR_INVALID_VALUE;
        if (params->numExecAffinityParams > 0)
            return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
        if (params->cigParams)
            return CUDA_ERROR_NOT_SUPPORTED; /* CUDA-in-graphics needs D3D12 */
    }
    sim_lock();
    CUresult r = ctx_create_locked(pctx, flags, dev);
    sim_unlock();
    return r;
}

static CUresult ctx_destroy_locked(CUcontext ctx)
{
    REQUIRE_INIT();
    struct ctx *c = (struct ctx *)ctx;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx_known(c) || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_teardown(c);
    /* Destroying the caller's current context pops it, as in the real driver;
     * other threads keep a dangling handle and get INVALID_CONTEXT. */
    while (tls_depth > 0 && tls_stack[tls_depth - 1] == c)
        tls_depth--;
    dev_uncharge(&g_dev[c->dev], g_cfg.context_bytes);
    for (struct ctx **pp = &g_ctxs; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    free(c);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxDestroy_v1(CUcontext ctx)
{
    sim_lock();
    CUresult r = ctx_destroy_locked(ctx);
    sim_unlock();
    if (r == CUDA_SUCCESS)
        sim_cls_context_gone(ctx); /* outside the lock: destructors call the driver */
    return r;
}

IMPL CUresult impl_cuCtxDestroy_v2(CUcontext ctx)
{
    sim_lock();
    CUresult r = ctx_destroy_locked(ctx);
    sim_unlock();
    if (r == CUDA_SUCCESS)
        sim_cls_context_gone(ctx); /* outside the lock: destructors call the driver */
    return r;
}

static CUresult ctx_push_locked(CUcontext ctx)
{
    REQUIRE_INIT();
    struct ctx *c = (struct ctx *)ctx;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx_known(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_depth == CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    tls_stack[tls_depth++] = c;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxPushCurrent_v1(CUcontext ctx)
{
    sim_lock();
    CUresult r = ctx_push_locked(ctx);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuCtxPushCurrent_v2(CUcontext ctx)
{
    sim_lock();
    CUresult r = ctx_push_locked(ctx);
    sim_unlock();
    return r;
}

static CUresult ctx_pop_locked(CUcontext *pctx)
{
    REQUIRE_INIT();
    if (tls_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct ctx *c = tls_stack[--tls_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxPopCurrent_v1(CUcontext *pctx)
{
    sim_lock();
    CUresult r = ctx_pop_locked(pctx);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuCtxPopCurrent_v2(CUcontext *pctx)
{
    sim_lock();
    CUresult r = ctx_pop_locked(pctx);
    sim_unlock();
    return r;
}

static CUresult ctx_set_current_locked(CUcontext ctx)
{
    REQUIRE_INIT();
    struct ctx *c = (struct ctx *)ctx;
    if (!c) {
        if (tls_depth > 0)
            tls_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_known(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_depth == 0)
        tls_depth = 1;
    tls_stack[tls_depth - 1] = c;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxSetCurrent(CUcontext ctx)
{
    sim_lock();
    CUresult r = ctx_set_current_locked(ctx);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuCtxGetCurrent(CUcontext *pctx)
{
    sim_lock();
    CUresult r = CUDA_ERROR_NOT_INITIALIZED;
    if (g_init_state == 1) {
        r = CUDA_ERROR_INVALID_VALUE;
        if (pctx) {
            *pctx = (CUcontext)tls_top();
            r = CUDA_SUCCESS;
        }
    }
    sim_unlock();
    return r;
}

static CUresult ctx_get_device_locked(CUdevice *device)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxGetDevice(CUdevice *device)
{
    sim_lock();
    CUresult r = ctx_get_device_locked(device);
    sim_unlock();
    return r;
}

static CUresult ctx_synchronize_locked(void)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    CHECK(capture_guard());
    trim_device_pools(c->dev);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxSynchronize(void)
{
    sim_lock();
    CUresult r = ctx_synchronize_locked();
    sim_unlock();
    return r;
}

/* ---- Legacy 32-bit ABI ------------------------------------------------------------------
 * These exports take CUdeviceptr_v1 (32 bits) or unsigned int sizes, which
 * cannot describe simcuda's 64-bit addresses. */

CUresult legacy_not_supported(void)
{
    sim_lock();
    CUresult r = g_init_state == 1 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED;
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuDeviceTotalMem_v1(unsigned int *bytes, CUdevice dev)
{
    (void)bytes;
    (void)dev;
    return legacy_not_supported();
}

/* ---- CUDA 12 and 13 additions: contexts ------------------------------------------------ */

/* 13.0's ABIs of cuCtxGetDevice and cuCtxSynchronize name the context. */
static CUresult ctx_or_current_locked(CUcontext h, struct ctx **out)
{
    REQUIRE_INIT();
    if (!h)
        return current_ctx(out);
    if (!ctx_usable((struct ctx *)h))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = (struct ctx *)h;
    return CUDA_SUCCESS;
}
IMPL CUresult impl_cuCtxGetDevice_v2(CUdevice *device, CUcontext h)
{
    struct ctx *c;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = ctx_or_current_locked(h, &c);
    if (r == CUDA_SUCCESS)
        *device = c->dev;
    sim_unlock();
    return r;
}
IMPL CUresult impl_cuCtxSynchronize_v2(CUcontext h)
{
    struct ctx *c;
    sim_lock();
    CUresult r = ctx_or_current_locked(h, &c);
    if (r == CUDA_SUCCESS)
        r = capture_guard();
    if (r == CUDA_SUCCESS)
        trim_device_pools(c->dev);
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuCtxGetFlags(unsigned *flags)
{
    struct ctx *c;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = g_init_state == 1 ? current_ctx(&c) : CUDA_ERROR_NOT_INITIALIZED;
    if (r == CUDA_SUCCESS)
        *flags = c->flags;
    sim_unlock();
    return r;
}
IMPL CUresult impl_cuCtxSetFlags(unsigned flags)
{
    struct ctx *c;
    if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = g_init_state == 1 ? current_ctx(&c) : CUDA_ERROR_NOT_INITIALIZED;
    if (r == CUDA_SUCCESS)
        c->flags = flags;
    sim_unlock();
    return r;
}
IMPL CUresult impl_cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned flags)
{
    if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = g_init_state != 1 ? CUDA_ERROR_NOT_INITIALIZED
                 : !dev_valid(dev)  ? CUDA_ERROR_INVALID_DEVICE
                                    : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS)
        g_dev[dev].primary.flags = flags;
    sim_unlock();
    return r;
}

/* ---- Interface for the other driver files (internal.h) ------------------------------ */

CUresult sim_initialized(void)
{
    sim_lock();
    int ok = g_init_state == 1;
    sim_unlock();
    return ok ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

int sim_device_count(void)
{
    sim_lock();
    int n = g_init_state == 1 ? g_ndev : 0;
    sim_unlock();
    return n;
}

CUresult sim_current_ctx(CUcontext *out)
{
    struct ctx *c;
    sim_lock();
    CUresult r = g_init_state == 1 ? current_ctx(&c) : CUDA_ERROR_NOT_INITIALIZED;
    sim_unlock();
    if (r == CUDA_SUCCESS)
        *out = (CUcontext)c;
    return r;
}

CUresult sim_ctx_device(CUcontext ctx, CUdevice *dev)
{
    CUresult r = CUDA_SUCCESS;
    sim_lock();
    struct ctx *c = (struct ctx *)ctx;
    if (g_init_state != 1)
        r = CUDA_ERROR_NOT_INITIALIZED;
    else if (!c && current_ctx(&c) != CUDA_SUCCESS)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (!ctx_known(c))
        r = CUDA_ERROR_INVALID_CONTEXT;
    else
        *dev = c->dev;
    sim_unlock();
    return r;
}

CUresult sim_primary_ctx(CUdevice dev, CUcontext *out)
{
    CUresult r = CUDA_SUCCESS;
    sim_lock();
    if (g_init_state != 1)
        r = CUDA_ERROR_NOT_INITIALIZED;
    else if (!dev_valid(dev))
        r = CUDA_ERROR_INVALID_DEVICE;
    else
        *out = (CUcontext)&g_dev[dev].primary;
    sim_unlock();
    return r;
}

void sim_trace(const char *fmt, ...)
{
    static int enabled = -1;
    if (enabled < 0) {
        const char *v = getenv("SIMCUDA_TRACE");
        enabled = v && *v && strcmp(v, "0") != 0;
    }
    if (!enabled)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "simcuda: %s\n", line);
}

/* For the NVML stand-in (libnvidia-ml.so.1), which finds it with dlsym: the
 * same free and total memory cuMemGetInfo reports, for any device. */
EXPORT int simcuda_memory_info(int ordinal, unsigned long long *free_bytes,
                               unsigned long long *total_bytes)
{
    int r = -1;
    sim_lock();
    if (g_init_state == 1 && dev_valid(ordinal) && free_bytes && total_bytes) {
        *total_bytes = g_dev[ordinal].capacity;
        *free_bytes = g_dev[ordinal].capacity - g_dev[ordinal].used;
        r = 0;
    }
    sim_unlock();
    return r;
}

/* ---- cuGetProcAddress ------------------------------------------------------------------- */

IMPL CUresult impl_cuGetProcAddress_v1(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags);
IMPL CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult *status);

/* (base name, CUDA version that introduced this ABI, implementation, the
 * per-thread-default-stream twin if there is one).  For each name the entry
 * with the highest version <= the caller's version wins. */
static const struct sim_proc k_procs[] = {
    {"cuGetErrorString", 6000, (void *)impl_cuGetErrorString, NULL},
    {"cuGetErrorName", 6000, (void *)impl_cuGetErrorName, NULL},
    {"cuInit", 2000, (void *)impl_cuInit, NULL},
    {"cuDriverGetVersion", 2020, (void *)impl_cuDriverGetVersion, NULL},
    {"cuDeviceGet", 2000, (void *)impl_cuDeviceGet, NULL},
    {"cuDeviceGetCount", 2000, (void *)impl_cuDeviceGetCount, NULL},
    {"cuDeviceGetName", 2000, (void *)impl_cuDeviceGetName, NULL},
    {"cuDeviceTotalMem", 2000, (void *)impl_cuDeviceTotalMem_v1, NULL},
    {"cuDeviceTotalMem", 3020, (void *)impl_cuDeviceTotalMem_v2, NULL},
    {"cuDeviceGetAttribute", 2000, (void *)impl_cuDeviceGetAttribute, NULL},
    {"cuDevicePrimaryCtxRetain", 7000, (void *)impl_cuDevicePrimaryCtxRetain, NULL},
    {"cuDevicePrimaryCtxRelease", 7000, (void *)impl_cuDevicePrimaryCtxRelease_v1, NULL},
    {"cuDevicePrimaryCtxRelease", 11000, (void *)impl_cuDevicePrimaryCtxRelease_v2, NULL},
    {"cuDevicePrimaryCtxReset", 7000, (void *)impl_cuDevicePrimaryCtxReset_v1, NULL},
    {"cuDevicePrimaryCtxReset", 11000, (void *)impl_cuDevicePrimaryCtxReset_v2, NULL},
    {"cuDevicePrimaryCtxGetState", 7000, (void *)impl_cuDevicePrimaryCtxGetState, NULL},
    {"cuCtxCreate", 2000, (void *)impl_cuCtxCreate_v1, NULL},
    {"cuCtxCreate", 3020, (void *)impl_cuCtxCreate_v2, NULL},
    {"cuCtxCreate", 11040, (void *)impl_cuCtxCreate_v3, NULL},
    {"cuCtxCreate", 12050, (void *)impl_cuCtxCreate_v4, NULL},
    {"cuCtxDestroy", 2000, (void *)impl_cuCtxDestroy_v1, NULL},
    {"cuCtxDestroy", 4000, (void *)impl_cuCtxDestroy_v2, NULL},
    {"cuCtxPushCurrent", 2000, (void *)impl_cuCtxPushCurrent_v1, NULL},
    {"cuCtxPushCurrent", 4000, (void *)impl_cuCtxPushCurrent_v2, NULL},
    {"cuCtxPopCurrent", 2000, (void *)impl_cuCtxPopCurrent_v1, NULL},
    {"cuCtxPopCurrent", 4000, (void *)impl_cuCtxPopCurrent_v2, NULL},
    {"cuCtxSetCurrent", 4000, (void *)impl_cuCtxSetCurrent, NULL},
    {"cuCtxGetCurrent", 4000, (void *)impl_cuCtxGetCurrent, NULL},
    {"cuCtxGetDevice", 2000, (void *)impl_cuCtxGetDevice, NULL},
    {"cuCtxSynchronize", 2000, (void *)impl_cuCtxSynchronize, NULL},
    {"cuCtxGetDevice", 13000, (void *)impl_cuCtxGetDevice_v2, NULL},
    {"cuCtxSynchronize", 13000, (void *)impl_cuCtxSynchronize_v2, NULL},
    {"cuCtxGetFlags", 7000, (void *)impl_cuCtxGetFlags, NULL},
    {"cuCtxSetFlags", 12010, (void *)impl_cuCtxSetFlags, NULL},
    {"cuDevicePrimaryCtxSetFlags", 7000, (void *)impl_cuDevicePrimaryCtxSetFlags, NULL},
    {"cuDevicePrimaryCtxSetFlags", 11000, (void *)impl_cuDevicePrimaryCtxSetFlags, NULL},
    {"cuGetProcAddress", 11030, (void *)impl_cuGetProcAddress_v1, NULL},
    {"cuGetProcAddress", 12000, (void *)impl_cuGetProcAddress_v2, NULL},
};
static const size_t k_nprocs = sizeof k_procs / sizeof k_procs[0];

/* Callable before cuInit, like the real one; touches no mutable state. */
IMPL CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_GET_PROC_ADDRESS_DEFAULT && flags != CU_GET_PROC_ADDRESS_LEGACY_STREAM &&
        flags != CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    /* The core's own table first, then each area's (see internal.h). */
    static const struct {
        const struct sim_proc *procs;
        const size_t *count;
    } tables[] = {
        {k_procs, &k_nprocs},
        {sim_procs_memory, &sim_nprocs_memory},
        {sim_procs_pools, &sim_nprocs_pools},
        {sim_procs_streams, &sim_nprocs_streams},
        {sim_procs_vmm, &sim_nprocs_vmm},
        {sim_procs_copies, &sim_nprocs_copies},
        {sim_procs_modules, &sim_nprocs_modules},
        {sim_procs_events, &sim_nprocs_events},
        {sim_procs_misc, &sim_nprocs_misc},
        {sim_procs_export_tables, &sim_nprocs_export_tables},
    };
    const struct sim_proc *best = NULL;
    int known = 0;
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        for (size_t i = 0; i < *tables[t].count; i++) {
            const struct sim_proc *p = &tables[t].procs[i];
            if (strcmp(p->name, symbol) != 0)
                continue;
            known = 1;
            if (p->version <= cudaVersion && (!best || p->version > best->version))
                best = p;
        }
    }
    /* A real CUDA function simcuda does not implement is found, and fails
     * when called, as it would on a driver without that feature. */
    for (size_t i = 0; !known && i < sim_unsupported_nprocs; i++) {
        if (strcmp(sim_unsupported_procs[i].name, symbol) == 0) {
            best = &sim_unsupported_procs[i];
            known = 1;
        }
    }
    if (!best)
        sim_trace("cuGetProcAddress: %s at %d: %s", symbol, cudaVersion,
                  known ? "version not sufficient" : "not found");
    *pfn = NULL;
    if (!best) {
        if (status)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = (flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM && best->ptsz) ? best->ptsz
                                                                                 : best->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuGetProcAddress_v1(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags)
{
    return impl_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* ---- Exports ------------------------------------------------------------------------------
 * Thin wrappers only: internal code never calls these, so nothing inside the
 * library goes through the PLT or can be interposed. */

EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr) { return impl_cuGetErrorString(error, pStr); }
EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr) { return impl_cuGetErrorName(error, pStr); }
EXPORT CUresult cuInit(unsigned int Flags) { return impl_cuInit(Flags); }
EXPORT CUresult cuDriverGetVersion(int *driverVersion) { return impl_cuDriverGetVersion(driverVersion); }
EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) { return impl_cuDeviceGet(device, ordinal); }
EXPORT CUresult cuDeviceGetCount(int *count) { return impl_cuDeviceGetCount(count); }
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) { return impl_cuDeviceGetName(name, len, dev); }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) { return impl_cuDeviceTotalMem_v2(bytes, dev); }
EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) { return impl_cuDeviceTotalMem_v1(bytes, dev); }
EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) { return impl_cuDeviceGetAttribute(pi, attrib, dev); }

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) { return impl_cuDevicePrimaryCtxRetain(pctx, dev); }
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return impl_cuDevicePrimaryCtxRelease_v2(dev); }
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return impl_cuDevicePrimaryCtxRelease_v1(dev); }
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { return impl_cuDevicePrimaryCtxReset_v2(dev); }
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return impl_cuDevicePrimaryCtxReset_v1(dev); }
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) { return impl_cuDevicePrimaryCtxGetState(dev, flags, active); }
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) { return impl_cuCtxCreate_v1(pctx, flags, dev); }
EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) { return impl_cuCtxCreate_v2(pctx, flags, dev); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags, CUdevice dev) { return impl_cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev); }
EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev) { return impl_cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev); }
EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return impl_cuCtxDestroy_v1(ctx); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { return impl_cuCtxDestroy_v2(ctx); }
EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) { return impl_cuCtxPushCurrent_v1(ctx); }
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) { return impl_cuCtxPushCurrent_v2(ctx); }
EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx) { return impl_cuCtxPopCurrent_v1(pctx); }
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) { return impl_cuCtxPopCurrent_v2(pctx); }
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) { return impl_cuCtxSetCurrent(ctx); }
EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) { return impl_cuCtxGetCurrent(pctx); }
EXPORT CUresult cuCtxGetDevice(CUdevice *device) { return impl_cuCtxGetDevice(device); }
EXPORT CUresult cuCtxSynchronize(void) { return impl_cuCtxSynchronize(); }
EXPORT CUresult cuCtxGetDevice_v2(CUdevice *d, CUcontext c) { return impl_cuCtxGetDevice_v2(d, c); }
EXPORT CUresult cuCtxSynchronize_v2(CUcontext c) { return impl_cuCtxSynchronize_v2(c); }
EXPORT CUresult cuCtxGetFlags(unsigned *f) { return impl_cuCtxGetFlags(f); }
EXPORT CUresult cuCtxSetFlags(unsigned f) { return impl_cuCtxSetFlags(f); }
EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned f) { return impl_cuDevicePrimaryCtxSetFlags(d, f); }
EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned f) { return impl_cuDevicePrimaryCtxSetFlags(d, f); }

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) { return impl_cuGetProcAddress_v1(symbol, pfn, cudaVersion, flags); }
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus) { return impl_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus); }
