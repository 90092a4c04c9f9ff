/*
 * rttest: exercises simcuda's libcudart.so.12 (and, through it, whatever
 * libcuda.so.1 the dynamic linker finds).
 *
 *   rttest <scenario>
 *
 * Like drvtest, each scenario checks itself and exits non-zero on the first
 * failure.  It links only against libcudart, as CUDA applications do.
 */
#define _GNU_SOURCE
#include "cuda.h"
#include "cuda_runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1ull << 20)

#define EXPECT(call, want)                                                                    \
    do {                                                                                      \
        cudaError_t r_ = (call);                                                              \
        if (r_ != (cudaError_t)(want)) {                                                      \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d\n", __FILE__, __LINE__,  \
                    #call, (int)r_, cudaGetErrorName(r_), (int)(want));                       \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define OK(call) EXPECT(call, cudaSuccess)
#define TRUE(cond)                                                            \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

static size_t free_mem(void)
{
    size_t f, t;
    OK(cudaMemGetInfo(&f, &t));
    return f;
}

static void scenario_basic(void)
{
    int v = 0, n = 0, dev = -1;
    void *p = (void *)1, *q;
    size_t f, t;

    OK(cudaRuntimeGetVersion(&v));
    TRUE(v == 12080);
    OK(cudaDriverGetVersion(&v));
    TRUE(v == 13020); /* a 13.2 driver runs a 12.8 runtime, as NVIDIA's does */
    OK(cudaGetDeviceCount(&n));
    printf("devices=%d\n", n);
    OK(cudaGetDevice(&dev));
    TRUE(dev == 0);

    OK(cudaFree(NULL)); /* the "initialize now" idiom */
    OK(cudaMemGetInfo(&f, &t));
    printf("free=%zu\ntotal=%zu\n", f, t);

    OK(cudaMalloc(&p, 0)); /* succeeds, allocates nothing */
    TRUE(p == NULL);
    TRUE(free_mem() == f);
    OK(cudaMalloc(&p, 1 * MiB));
    TRUE(p != NULL);
    TRUE(free_mem() == f - 1 * MiB);
    OK(cudaMalloc(&q, 1000));
    OK(cudaFree(p));
    OK(cudaFree(q));
    TRUE(free_mem() == f);

    /* The last error is per thread, sticky until read. */
    EXPECT(cudaMalloc(NULL, 1), cudaErrorInvalidValue);
    EXPECT(cudaPeekAtLastError(), cudaErrorInvalidValue);
    EXPECT(cudaPeekAtLastError(), cudaErrorInvalidValue);
    OK(cudaMalloc(&p, 512)); /* success does not clear it */
    OK(cudaFree(p));
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    OK(cudaGetLastError());

    {
        cudaStream_t s;
        OK(cudaStreamCreate(&s));
        OK(cudaMallocAsync(&p, 4096, s));
        OK(cudaFreeAsync(p, s));
        OK(cudaStreamSynchronize(s));
        OK(cudaStreamDestroy(s));
        OK(cudaMallocAsync_ptsz(&p, 4096, NULL));
        OK(cudaFreeAsync_ptsz(p, NULL));
        OK(cudaDeviceSynchronize());
    }
    printf("ok\n");
}

static void scenario_oom(void)
{
    void *p, *q;
    size_t f = 0, t;
    OK(cudaMemGetInfo(&f, &t));
    printf("total=%zu\n", t);
    EXPECT(cudaMalloc(&p, f + 1), cudaErrorMemoryAllocation);
    TRUE(strcmp(cudaGetErrorName(cudaGetLastError()), "cudaErrorMemoryAllocation") == 0);
    TRUE(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0);
    OK(cudaMalloc(&p, f));
    EXPECT(cudaMalloc(&q, 1), cudaErrorMemoryAllocation);
    EXPECT(cudaMallocManaged(&q, 1, cudaMemAttachGlobal), cudaErrorMemoryAllocation);
    EXPECT(cudaMallocAsync(&q, 1, NULL), cudaErrorMemoryAllocation);
    OK(cudaFree(p));
    OK(cudaMalloc(&p, f));
    OK(cudaFree(p));
    printf("ok\n");
}

static void scenario_errors(void)
{
    int n;
    void *p;
    OK(cudaGetDeviceCount(&n));
    EXPECT(cudaSetDevice(n), cudaErrorInvalidDevice);
    EXPECT(cudaSetDevice(-1), cudaErrorInvalidDevice);
    EXPECT(cudaFree((void *)0x1234), cudaErrorInvalidValue);
    EXPECT(cudaStreamDestroy(NULL), cudaErrorInvalidResourceHandle);
    EXPECT(cudaMallocManaged(&p, 0, cudaMemAttachGlobal), cudaErrorInvalidValue);
    EXPECT(cudaMallocManaged(&p, 10, 0), cudaErrorInvalidValue);
    EXPECT(cudaDeviceGetDefaultMemPool(NULL, 0), cudaErrorInvalidValue);
    {
        cudaMemPool_t pool;
        EXPECT(cudaDeviceGetDefaultMemPool(&pool, n), cudaErrorInvalidDevice);
    }
    TRUE(strcmp(cudaGetErrorName(cudaErrorInvalidDevice), "cudaErrorInvalidDevice") == 0);
    TRUE(strcmp(cudaGetErrorString(cudaErrorUnknown), "unknown error") == 0);
    TRUE(strcmp(cudaGetErrorString((cudaError_t)4242), "unrecognized error code") == 0);
    TRUE(strcmp(cudaGetErrorName(cudaSuccess), "cudaSuccess") == 0);
    printf("ok\n");
}

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *driver_gpa(const char *name, int version, cuuint64_t flags)
{
    static gpa_t gpa;
    void *fn = NULL;
    if (!gpa) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        TRUE(lib != NULL); /* the runtime loaded it */
        void *sym = dlsym(lib, "cuGetProcAddress_v2");
        TRUE(sym != NULL);
        memcpy(&gpa, &sym, sizeof sym);
    }
    TRUE(gpa(name, &fn, version, flags, NULL) == CUDA_SUCCESS);
    return fn;
}

static void scenario_entry(void)
{
    void *fn = (void *)1;
    enum cudaDriverEntryPointQueryResult st = (enum cudaDriverEntryPointQueryResult)9;
    void *lib;

    OK(cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, &st));
    TRUE(st == cudaDriverEntryPointSuccess);
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    TRUE(lib != NULL);
    TRUE(fn != dlsym(lib, "cuMemAlloc_v2") && fn != dlsym(lib, "cuMemAlloc"));
    TRUE(fn == driver_gpa("cuMemAlloc", 12080, 0));
    {
        CUdeviceptr d;
        OK(cudaFree(NULL));
        TRUE(((CUresult(*)(CUdeviceptr *, size_t))fn)(&d, 100) == CUDA_SUCCESS);
        OK(cudaFree((void *)(uintptr_t)d));
    }
    OK(cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, NULL));

    /* Not found: the error, a NULL pointer and the status. */
    fn = (void *)1;
    EXPECT(cudaGetDriverEntryPoint("cuNoSuchFunction", &fn, cudaEnableDefault, &st),
           cudaErrorSymbolNotFound);
    TRUE(fn == NULL && st == cudaDriverEntryPointSymbolNotFound);
    EXPECT(cudaGetLastError(), cudaErrorSymbolNotFound);
    fn = (void *)1;
    EXPECT(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 11000, cudaEnableDefault, &st),
           cudaErrorSymbolNotFound);
    TRUE(fn == NULL && st == cudaDriverEntryPointVersionNotSufficent);

    /* By version: the old ABI for an old version. */
    OK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 3000, cudaEnableDefault, &st));
    TRUE(st == cudaDriverEntryPointSuccess);
    TRUE(fn == driver_gpa("cuMemAlloc", 3000, 0) && fn != driver_gpa("cuMemAlloc", 12080, 0));
    {
        unsigned int d32; /* CUdeviceptr_v1 */
        TRUE(((CUresult(*)(unsigned int *, unsigned int))fn)(&d32, 100) == CUDA_ERROR_NOT_SUPPORTED);
    }
    OK(cudaGetDriverEntryPointByVersion("cuCtxCreate", &fn, 12000, cudaEnableDefault, &st));
    TRUE(fn == driver_gpa("cuCtxCreate", 11040, 0));

    /* Stream flavours. */
    void *legacy = driver_gpa("cuMemAllocAsync", 12080, CU_GET_PROC_ADDRESS_DEFAULT);
    void *ptsz = driver_gpa("cuMemAllocAsync", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    TRUE(legacy != ptsz);
    OK(cudaGetDriverEntryPoint("cuMemAllocAsync", &fn, cudaEnableDefault, NULL));
    TRUE(fn == legacy);
    OK(cudaGetDriverEntryPoint("cuMemAllocAsync", &fn, cudaEnableLegacyStream, NULL));
    TRUE(fn == legacy);
    OK(cudaGetDriverEntryPoint("cuMemAllocAsync", &fn, cudaEnablePerThreadDefaultStream, NULL));
    TRUE(fn == ptsz);
    OK(cudaGetDriverEntryPoint_ptsz("cuMemAllocAsync", &fn, cudaEnableDefault, NULL));
    TRUE(fn == ptsz); /* per-thread builds default to the per-thread variants */
    OK(cudaGetDriverEntryPoint_ptsz("cuMemAllocAsync", &fn, cudaEnableLegacyStream, NULL));
    TRUE(fn == legacy);
    OK(cudaGetDriverEntryPointByVersion_ptsz("cuMemAllocAsync", &fn, 12000, cudaEnableDefault, NULL));
    TRUE(fn == ptsz);
    OK(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 12000, cudaEnablePerThreadDefaultStream, NULL));
    TRUE(fn == ptsz);

    /* The runtime's own entry points are those cuGetProcAddress returns. */
    OK(cudaGetDriverEntryPoint("cuGetProcAddress", &fn, cudaEnableDefault, NULL));
    TRUE(fn == driver_gpa("cuGetProcAddress", 12080, 0));
    TRUE(fn != dlsym(lib, "cuGetProcAddress_v2"));

    EXPECT(cudaGetDriverEntryPoint("cuMemAlloc", &fn, 7, NULL), cudaErrorInvalidValue);
    EXPECT(cudaGetDriverEntryPoint(NULL, &fn, 0, NULL), cudaErrorInvalidValue);
    EXPECT(cudaGetDriverEntryPoint("cuMemAlloc", NULL, 0, NULL), cudaErrorInvalidValue);
    printf("ok\n");
}

static void scenario_pool(void)
{
    cudaMemPool_t pool, cur;
    void *a, *b;
    size_t base;
    unsigned long long v;
    OK(cudaFree(NULL));
    base = free_mem();
    OK(cudaDeviceGetDefaultMemPool(&pool, 0));
    OK(cudaDeviceGetMemPool(&cur, 0));
    TRUE(pool == cur);
    OK(cudaMallocAsync(&a, 1 * MiB, NULL));
    OK(cudaMallocFromPoolAsync(&b, 1 * MiB, pool, cudaStreamPerThread));
    OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &v));
    TRUE(v == 2 * MiB);
    OK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v));
    TRUE(v == 2 * MiB);
    OK(cudaFreeAsync(a, NULL));
    OK(cudaFreeAsync_ptsz(b, NULL));
    TRUE(free_mem() == base - 2 * MiB);
    v = 2 * MiB;
    OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &v));
    OK(cudaStreamSynchronize(NULL));
    TRUE(free_mem() == base - 2 * MiB);
    OK(cudaMemPoolTrimTo(pool, 0));
    TRUE(free_mem() == base);
    OK(cudaMallocFromPoolAsync_ptsz(&a, 100, pool, NULL));
    OK(cudaFreeAsync(a, cudaStreamLegacy));
    OK(cudaDeviceSetMemPool(0, pool));
    EXPECT(cudaMallocAsync(&a, 0, NULL), cudaErrorInvalidValue);
    printf("ok\n");
}

static void scenario_host(void)
{
    void *a, *b;
    size_t base;
    OK(cudaFree(NULL));
    base = free_mem();
    OK(cudaMallocHost(&a, 10000));
    memset(a, 1, 10000);
    OK(cudaHostAlloc(&b, 10000, cudaHostAllocPortable | cudaHostAllocMapped));
    memset(b, 2, 10000);
    EXPECT(cudaHostAlloc(&b, 10, 0x100), cudaErrorInvalidValue);
    TRUE(free_mem() == base);
    OK(cudaFreeHost(a));
    OK(cudaFreeHost(b));
    OK(cudaFreeHost(NULL));
    EXPECT(cudaFreeHost(a), cudaErrorInvalidValue);
    printf("ok\n");
}

static void scenario_misc(void)
{
    void *p;
    size_t pitch, base;
    OK(cudaFree(NULL));
    base = free_mem();
    OK(cudaMallocManaged(&p, 3000, cudaMemAttachGlobal));
    memset(p, 3, 3000);
    TRUE(free_mem() == base - 3072);
    OK(cudaFree(p));
    OK(cudaMallocPitch(&p, &pitch, 100, 8));
    TRUE(pitch == 512);
    TRUE(free_mem() == base - 4096);
    OK(cudaFree(p));

    /* cudaDeviceReset destroys what the device held. */
    OK(cudaMalloc(&p, 1 * MiB));
    OK(cudaDeviceReset());
    TRUE(free_mem() == base);
    EXPECT(cudaFree(p), cudaErrorInvalidValue);
    OK(cudaMalloc(&p, 1 * MiB));
    OK(cudaFree(p));
    printf("ok\n");
}

static void *other_thread(void *arg)
{
    int dev = -1;
    void *p;
    (void)arg;
    OK(cudaGetDevice(&dev));
    TRUE(dev == 0); /* the current device is per thread */
    OK(cudaMalloc(&p, 512));
    printf("thread=%p\n", p);
    OK(cudaFree(p));
    return NULL;
}

static void scenario_devices(void)
{
    int n, dev;
    void *p;
    pthread_t th;
    OK(cudaGetDeviceCount(&n));
    TRUE(n >= 2);
    OK(cudaSetDevice(1));
    OK(cudaGetDevice(&dev));
    TRUE(dev == 1);
    OK(cudaMalloc(&p, 512));
    printf("dev1=%p\n", p);
    TRUE(pthread_create(&th, NULL, other_thread, NULL) == 0);
    pthread_join(th, NULL);
    OK(cudaFree(p));
    OK(cudaSetDevice(0));
    OK(cudaMalloc(&p, 512));
    printf("dev0=%p\n", p);
    OK(cudaFree(p));
    printf("ok\n");
}

/* Run with no libcuda.so.1 to be found. */
static void scenario_nodriver(void)
{
    int n = 7, v = 7;
    void *p;
    EXPECT(cudaGetDeviceCount(&n), cudaErrorInsufficientDriver);
    TRUE(n == 0);
    EXPECT(cudaMalloc(&p, 16), cudaErrorInsufficientDriver);
    OK(cudaDriverGetVersion(&v));
    TRUE(v == 0);
    OK(cudaRuntimeGetVersion(&v));
    TRUE(v == 12080);
    EXPECT(cudaGetLastError(), cudaErrorInsufficientDriver);
    printf("ok\n");
}

/* Run with SIMCUDA_DEVICES=0. */
static void scenario_nodevice(void)
{
    int n = 7;
    void *p;
    EXPECT(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    TRUE(n == 0);
    EXPECT(cudaMalloc(&p, 16), cudaErrorNoDevice);
    printf("ok\n");
}

/* ---- Stream capture ----------------------------------------------------------- */

static cudaError_t g_malloc_result;
static enum cudaStreamCaptureMode g_malloc_mode;

static void *malloc_elsewhere(void *arg)
{
    void *p = NULL;
    enum cudaStreamCaptureMode m = g_malloc_mode;
    (void)arg;
    OK(cudaThreadExchangeStreamCaptureMode(&m));
    TRUE(m == cudaStreamCaptureModeGlobal);
    g_malloc_result = cudaMalloc(&p, 4096);
    if (g_malloc_result == cudaSuccess)
        OK(cudaFree(p));
    OK(cudaThreadExchangeStreamCaptureMode(&m));
    TRUE(m == g_malloc_mode);
    return NULL;
}

static cudaError_t malloc_on_other_thread(enum cudaStreamCaptureMode mode)
{
    pthread_t th;
    g_malloc_mode = mode;
    TRUE(pthread_create(&th, NULL, malloc_elsewhere, NULL) == 0);
    TRUE(pthread_join(th, NULL) == 0);
    return g_malloc_result;
}

static void scenario_capture(void)
{
    cudaStream_t s;
    cudaGraph_t g = NULL;
    enum cudaStreamCaptureStatus st;
    void *p;
    size_t base;
    OK(cudaFree(NULL));
    base = free_mem();
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    EXPECT(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal),
           cudaErrorStreamCaptureUnsupported);
    (void)cudaGetLastError();

    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    OK(cudaStreamIsCapturing(s, &st));
    TRUE(st == cudaStreamCaptureStatusActive);
    TRUE(malloc_on_other_thread(cudaStreamCaptureModeRelaxed) == cudaSuccess);
    OK(cudaMallocAsync(&p, 1000, s)); /* on the capturing stream */
    OK(cudaFreeAsync(p, s));
    EXPECT(malloc_on_other_thread(cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
    OK(cudaStreamIsCapturing(s, &st));
    TRUE(st == cudaStreamCaptureStatusInvalidated);
    EXPECT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    TRUE(g == NULL);
    TRUE(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);

    OK(cudaStreamBeginCapture_ptsz(NULL, cudaStreamCaptureModeThreadLocal));
    OK(cudaStreamIsCapturing(cudaStreamPerThread, &st));
    TRUE(st == cudaStreamCaptureStatusActive);
    TRUE(malloc_on_other_thread(cudaStreamCaptureModeGlobal) == cudaSuccess);
    OK(cudaStreamEndCapture_ptsz(NULL, &g));
    TRUE(g != NULL);
    OK(cudaGraphDestroy(g));

    OK(cudaStreamDestroy(s));
    OK(cudaDeviceSynchronize()); /* the pool gives its reserve back */
    TRUE(free_mem() == base);
    printf("ok\n");
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } k_scenarios[] = {
        {"basic", scenario_basic},       {"oom", scenario_oom},
        {"errors", scenario_errors},     {"entry", scenario_entry},
        {"pool", scenario_pool},         {"host", scenario_host},
        {"misc", scenario_misc},         {"devices", scenario_devices},
        {"nodriver", scenario_nodriver}, {"nodevice", scenario_nodevice},
        {"capture", scenario_capture},
    };
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: rttest <scenario>\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof k_scenarios / sizeof k_scenarios[0]; i++) {
        if (strcmp(argv[1], k_scenarios[i].name) == 0) {
            k_scenarios[i].run();
            return 0;
        }
    }
    fprintf(stderr, "rttest: unknown scenario %s\n", argv[1]);
    return 2;
}
