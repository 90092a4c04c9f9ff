/*
 * drvtest: exercises simcuda's libcuda.so.1 through the driver API.
 *
 *   drvtest <scenario>
 *
 * Each scenario checks its own expectations and exits non-zero with a
 * message on the first failure; values that depend on the environment
 * (SIMCUDA_*) are printed as key=value lines for the caller to check.
 * Built with SIMCUDA_NO_V2_MACROS: every call names the exact export.
 */
#define _GNU_SOURCE
#include "cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1ull << 20)

#define EXPECT(call, want)                                                                    \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != (CUresult)(want)) {                                                         \
            fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, \
                    (int)r_, (int)(want));                                                    \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define OK(call) EXPECT(call, CUDA_SUCCESS)
#define TRUE(cond)                                                            \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

static CUcontext setup(void)
{
    CUcontext ctx;
    OK(cuInit(0));
    OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    OK(cuCtxSetCurrent(ctx));
    return ctx;
}

static size_t free_mem(void)
{
    size_t f, t;
    OK(cuMemGetInfo_v2(&f, &t));
    return f;
}

static cuuint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute attr)
{
    cuuint64_t v = 0;
    OK(cuMemPoolGetAttribute(pool, attr, &v));
    return v;
}

static CUmemAllocationProp device_prop(int dev)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

/* ---- scenarios ------------------------------------------------------------ */

static void scenario_init(void)
{
    int n = -1, v = 0;
    CUdevice dev;
    CUdeviceptr p;
    CUcontext ctx = NULL;
    const char *s = NULL;
    void *fn = NULL;

    /* Usable before cuInit, as in the real driver. */
    OK(cuDriverGetVersion(&v));
    TRUE(v == 13020);
    OK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
    TRUE(strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
    OK(cuGetProcAddress_v2("cuMemAlloc", &fn, 12080, CU_GET_PROC_ADDRESS_DEFAULT, NULL));
    TRUE(fn != NULL);

    EXPECT(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cuMemAlloc_v2(&p, 1), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cuCtxGetCurrent(&ctx), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(((CUresult(*)(CUdeviceptr *, size_t))fn)(&p, 1), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);

    OK(cuInit(0));
    OK(cuInit(0));
    OK(cuDeviceGetCount(&n));
    printf("devices=%d\n", n);
    for (int d = 0; d < n; d++) {
        char name[64];
        size_t total;
        int value;
        OK(cuDeviceGet(&dev, d));
        TRUE(dev == d);
        OK(cuDeviceGetName(name, sizeof name, dev));
        TRUE(strcmp(name, "NVIDIA H100 80GB HBM3 (simcuda)") == 0);
        OK(cuDeviceTotalMem_v2(&total, dev));
        printf("total%d=%zu\n", d, total);
        OK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
        TRUE(value == 9);
        OK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev));
        TRUE(value == 1);
        OK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
        TRUE(value == 1);
        EXPECT(cuDeviceGetAttribute(&value, (CUdevice_attribute)99999, dev), CUDA_ERROR_INVALID_VALUE);
    }
    {
        char tiny[7];
        OK(cuDeviceGetName(tiny, sizeof tiny, 0));
        TRUE(strcmp(tiny, "NVIDIA") == 0);
    }
    EXPECT(cuDeviceGet(&dev, n), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuDeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuDeviceTotalMem_v2(NULL, 0), CUDA_ERROR_INVALID_VALUE);

    /* No context on this thread yet. */
    OK(cuCtxGetCurrent(&ctx));
    TRUE(ctx == NULL);
    {
        size_t f, t;
        CUstream st;
        void *h;
        EXPECT(cuMemAlloc_v2(&p, 1), CUDA_ERROR_INVALID_CONTEXT);
        EXPECT(cuMemGetInfo_v2(&f, &t), CUDA_ERROR_INVALID_CONTEXT);
        EXPECT(cuMemAllocManaged(&p, 1, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_CONTEXT);
        EXPECT(cuMemAllocAsync(&p, 1, NULL), CUDA_ERROR_INVALID_CONTEXT);
        EXPECT(cuMemHostAlloc(&h, 1, 0), CUDA_ERROR_INVALID_CONTEXT);
        EXPECT(cuStreamCreate(&st, 0), CUDA_ERROR_INVALID_CONTEXT);
        EXPECT(cuStreamSynchronize(NULL), CUDA_ERROR_INVALID_CONTEXT);
        EXPECT(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    }
    printf("ok\n");
}

static void scenario_nodevice(void)
{
    int n;
    EXPECT(cuInit(0), CUDA_ERROR_NO_DEVICE);
    EXPECT(cuInit(0), CUDA_ERROR_NO_DEVICE); /* the failure sticks */
    EXPECT(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    printf("ok\n");
}

static void scenario_errors(void)
{
    const char *s = (const char *)1;
    OK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
    TRUE(strcmp(s, "out of memory") == 0);
    OK(cuGetErrorName(CUDA_ERROR_INVALID_CONTEXT, &s));
    TRUE(strcmp(s, "CUDA_ERROR_INVALID_CONTEXT") == 0);
    OK(cuGetErrorName(CUDA_SUCCESS, &s));
    TRUE(strcmp(s, "CUDA_SUCCESS") == 0);
    OK(cuGetErrorString(CUDA_ERROR_NOT_FOUND, &s));
    TRUE(strcmp(s, "named symbol not found") == 0);
    EXPECT(cuGetErrorString((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    TRUE(s == NULL);
    EXPECT(cuGetErrorName(CUDA_SUCCESS, NULL), CUDA_ERROR_INVALID_VALUE);
    printf("ok\n");
}

/* Fill the device exactly; one more byte fails; freeing gives it back. */
static void scenario_oom(void)
{
    size_t f, t;
    CUdeviceptr a, b, c;
    setup();
    OK(cuMemGetInfo_v2(&f, &t));
    printf("total=%zu\nfree=%zu\n", t, f);
    TRUE(f % 512 == 0 && f > 1024);

    /* Sizes are charged rounded up to 512 bytes. */
    OK(cuMemAlloc_v2(&a, 1));
    TRUE(free_mem() == f - 512);
    OK(cuMemFree_v2(a));
    TRUE(free_mem() == f);

    OK(cuMemAlloc_v2(&a, f - 1024));
    OK(cuMemAlloc_v2(&b, 1000)); /* rounds to 1024: device now exactly full */
    TRUE(free_mem() == 0);
    EXPECT(cuMemAlloc_v2(&c, 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cuMemAllocManaged(&c, 1, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemFree_v2(b));
    EXPECT(cuMemAlloc_v2(&c, 1025), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemAlloc_v2(&c, 1024));
    OK(cuMemFree_v2(c));
    OK(cuMemFree_v2(a));
    TRUE(free_mem() == f);

    EXPECT(cuMemAlloc_v2(&a, f + 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cuMemAlloc_v2(&a, (size_t)-1), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemAlloc_v2(&a, f));
    OK(cuMemFree_v2(a));
    EXPECT(cuMemAlloc_v2(&a, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAlloc_v2(NULL, 1), CUDA_ERROR_INVALID_VALUE);
    printf("ok\n");
}

static void scenario_ctxoom(void)
{
    CUcontext ctx;
    OK(cuInit(0));
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cuCtxCreate_v2(&ctx, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
    printf("ok\n");
}

static void scenario_reuse(void)
{
    CUdeviceptr a, b, c, d, base;
    size_t size;
    int n;
    setup();
    OK(cuMemAlloc_v2(&a, 1000));
    OK(cuMemAlloc_v2(&b, 1000));
    printf("first=0x%llx\n", a);
    TRUE(a % 512 == 0 && b % 512 == 0 && a != b);
    OK(cuMemFree_v2(a));
    OK(cuMemAlloc_v2(&c, 1000));
    TRUE(c == a); /* first fit hands the freed range out again */
    OK(cuMemFree_v2(b));
    OK(cuMemFree_v2(c));
    OK(cuMemAlloc_v2(&d, 2048)); /* the two freed ranges coalesced */
    TRUE(d == a);

    OK(cuMemGetAddressRange_v2(&base, &size, d + 100));
    TRUE(base == d && size == 2048);
    OK(cuMemGetAddressRange_v2(NULL, &size, d));
    OK(cuMemGetAddressRange_v2(&base, NULL, d));
    EXPECT(cuMemGetAddressRange_v2(&base, &size, d + 2048), CUDA_ERROR_NOT_FOUND);

    EXPECT(cuMemFree_v2(d + 512), CUDA_ERROR_INVALID_VALUE); /* interior pointer */
    OK(cuMemFree_v2(d));
    EXPECT(cuMemFree_v2(d), CUDA_ERROR_INVALID_VALUE); /* double free */
    EXPECT(cuMemFree_v2(0x1234), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemFree_v2(0));

    /* Each device has its own address range. */
    OK(cuDeviceGetCount(&n));
    if (n > 1) {
        CUcontext c1;
        CUdeviceptr e;
        OK(cuDevicePrimaryCtxRetain(&c1, 1));
        OK(cuCtxPushCurrent_v2(c1));
        OK(cuMemAlloc_v2(&e, 1000));
        printf("dev1=0x%llx\n", e);
        TRUE(e != a);
        OK(cuMemFree_v2(e));
        OK(cuCtxPopCurrent_v2(NULL));
    }

    /* Many allocations, freed in a scattered order, are all reused. */
    {
        enum { N = 2000 };
        static CUdeviceptr ptrs[N];
        size_t before = free_mem();
        for (int i = 0; i < N; i++)
            OK(cuMemAlloc_v2(&ptrs[i], 512 * (1 + i % 7)));
        for (int i = 0; i < N; i += 2)
            OK(cuMemFree_v2(ptrs[i]));
        for (int i = 1; i < N; i += 2)
            OK(cuMemFree_v2(ptrs[i]));
        TRUE(free_mem() == before);
        OK(cuMemAlloc_v2(&a, 512));
        TRUE(a == ptrs[0]);
        OK(cuMemFree_v2(a));
    }
    printf("ok\n");
}

static void scenario_pitch(void)
{
    CUdeviceptr p;
    size_t pitch = 0, before;
    setup();
    before = free_mem();
    EXPECT(cuMemAllocPitch_v2(&p, &pitch, 100, 10, 3), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocPitch_v2(&p, &pitch, 0, 10, 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocPitch_v2(&p, NULL, 100, 10, 4), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemAllocPitch_v2(&p, &pitch, 100, 10, 4));
    TRUE(pitch == 512);
    TRUE(free_mem() == before - 5120);
    OK(cuMemFree_v2(p));
    OK(cuMemAllocPitch_v2(&p, &pitch, 513, 3, 16));
    TRUE(pitch == 1024);
    OK(cuMemFree_v2(p));
    TRUE(free_mem() == before);
    printf("ok\n");
}

static void scenario_managed(void)
{
    CUdeviceptr p, base;
    size_t size, before;
    setup();
    before = free_mem();
    EXPECT(cuMemAllocManaged(&p, 4096, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocManaged(&p, 4096, CU_MEM_ATTACH_SINGLE), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocManaged(&p, 0, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemAllocManaged(&p, 10000, CU_MEM_ATTACH_GLOBAL));
    TRUE(p % 4096 == 0);
    memset((void *)(uintptr_t)p, 0xab, 10000); /* CPU-accessible */
    TRUE(((unsigned char *)(uintptr_t)p)[9999] == 0xab);
    TRUE(free_mem() == before - 10240);
    OK(cuMemGetAddressRange_v2(&base, &size, p + 5));
    TRUE(base == p && size == 10000);
    OK(cuMemFree_v2(p));
    TRUE(free_mem() == before);
    OK(cuMemAllocManaged(&p, 1, CU_MEM_ATTACH_HOST));
    OK(cuMemFree_v2(p));
    printf("ok\n");
}

static void scenario_host(void)
{
    void *a, *b, *c;
    size_t before;
    setup();
    before = free_mem();
    EXPECT(cuMemHostAlloc(&a, 4096, 0x8), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemHostAlloc(&a, 0, 0), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemHostAlloc(&a, 16384, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    TRUE((uintptr_t)a % 4096 == 0);
    memset(a, 1, 16384);
    OK(cuMemAllocHost_v2(&b, 49152));
    memset(b, 2, 49152);
    EXPECT(cuMemAllocHost_v2(&c, 1), CUDA_ERROR_OUT_OF_MEMORY); /* 64 KiB limit reached */
    TRUE(free_mem() == before); /* pinned memory is not device memory */
    EXPECT(cuMemFreeHost((char *)a + 4096), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFreeHost(NULL), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemFreeHost(a));
    EXPECT(cuMemFreeHost(a), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemAllocHost_v2(&c, 1));
    OK(cuMemFreeHost(c));
    OK(cuMemFreeHost(b));
    printf("ok\n");
}

/* ---- cuGetProcAddress ---------------------------------------------------------- */

typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *lib;

static void *gpa(const char *name, int version, cuuint64_t flags)
{
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)7;
    OK(cuGetProcAddress_v2(name, &fn, version, flags, &st));
    TRUE(fn != NULL && st == CU_GET_PROC_ADDRESS_SUCCESS);
    return fn;
}

static void expect_not_found(const char *name, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult want)
{
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    EXPECT(cuGetProcAddress_v2(name, &fn, version, flags, &st), CUDA_ERROR_NOT_FOUND);
    TRUE(fn == NULL);
    TRUE(st == want);
    fn = (void *)1;
    EXPECT(cuGetProcAddress(name, &fn, version, flags), CUDA_ERROR_NOT_FOUND);
    TRUE(fn == NULL);
}

/* A resolved pointer must be an internal function: no export of any variant
 * of the name, yet inside libcuda.so.1. */
static void expect_internal(const char *base, void *fn)
{
    static const char *const k_suffixes[] = {"", "_v2", "_v3", "_v4", "_ptsz", "_ptds", "_v2_ptsz"};
    char name[128];
    Dl_info info;
    for (size_t i = 0; i < sizeof k_suffixes / sizeof k_suffixes[0]; i++) {
        snprintf(name, sizeof name, "%s%s", base, k_suffixes[i]);
        void *exported = dlsym(lib, name);
        if (exported == fn) {
            fprintf(stderr, "cuGetProcAddress(%s) returned the export %s\n", base, name);
            exit(1);
        }
    }
    TRUE(dladdr(fn, &info) && strstr(info.dli_fname, "libcuda.so.1") != NULL);
}

static void scenario_gpa(void)
{
    static const char *const k_names[] = {
        "cuInit", "cuDriverGetVersion", "cuDeviceGet", "cuDeviceGetCount", "cuDeviceGetName",
        "cuDeviceTotalMem", "cuDeviceGetAttribute", "cuGetErrorString", "cuGetErrorName",
        "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset",
        "cuDevicePrimaryCtxGetState", "cuCtxCreate", "cuCtxDestroy", "cuCtxSetCurrent",
        "cuCtxGetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent", "cuCtxGetDevice",
        "cuCtxSynchronize", "cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemFree",
        "cuMemGetInfo", "cuMemGetAddressRange", "cuMemHostAlloc", "cuMemAllocHost",
        "cuMemFreeHost", "cuStreamCreate", "cuStreamDestroy", "cuStreamSynchronize",
        "cuDeviceGetDefaultMemPool", "cuDeviceGetMemPool", "cuDeviceSetMemPool",
        "cuMemPoolCreate", "cuMemPoolDestroy", "cuMemPoolTrimTo", "cuMemPoolGetAttribute",
        "cuMemPoolSetAttribute", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync",
        "cuMemGetAllocationGranularity", "cuMemCreate", "cuMemRelease",
        "cuMemRetainAllocationHandle", "cuMemAddressReserve", "cuMemAddressFree", "cuMemMap",
        "cuMemUnmap", "cuMemSetAccess", "cuGetProcAddress", "cuStreamBeginCapture",
        "cuStreamEndCapture", "cuStreamIsCapturing", "cuThreadExchangeStreamCaptureMode",
        "cuGraphDestroy",
    };
    void *fn;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    TRUE(lib != NULL);

    /* Before cuInit. */
    void *alloc_v2 = gpa("cuMemAlloc", 12080, CU_GET_PROC_ADDRESS_DEFAULT);
    OK(cuInit(0));

    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++) {
        for (cuuint64_t flags = 0; flags <= 2; flags++) {
            void *p = gpa(k_names[i], 12080, flags);
            void *q = (void *)1;
            OK(cuGetProcAddress(k_names[i], &q, 12080, flags)); /* the 11.3 ABI agrees */
            TRUE(p == q);
            expect_internal(k_names[i], p);
        }
    }

    /* Version selection: the newest ABI not newer than the caller. */
    void *alloc_v1 = gpa("cuMemAlloc", 3010, 0);
    TRUE(gpa("cuMemAlloc", 3020, 0) == alloc_v2);
    TRUE(gpa("cuMemAlloc", 2000, 0) == alloc_v1);
    TRUE(alloc_v1 != alloc_v2);
    expect_not_found("cuMemAlloc", 1000, 0, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    expect_not_found("cuMemAllocAsync", 11010, 0, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    expect_not_found("cuMemCreate", 10010, 0, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    expect_not_found("cuNoSuchFunction", 12080, 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    expect_not_found("cuMemAlloc_v2", 12080, 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    expect_not_found("cuMemAllocAsync_ptsz", 12080, 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    {
        void *v1 = gpa("cuCtxCreate", 3010, 0), *v2 = gpa("cuCtxCreate", 3020, 0);
        void *v3 = gpa("cuCtxCreate", 11040, 0), *v4 = gpa("cuCtxCreate", 12050, 0);
        TRUE(v1 != v2 && v2 != v3 && v3 != v4 && v1 != v4);
        TRUE(gpa("cuCtxCreate", 12040, 0) == v3 && gpa("cuCtxCreate", 12080, 0) == v4);
        TRUE(gpa("cuCtxDestroy", 3020, 0) != gpa("cuCtxDestroy", 4000, 0));
        TRUE(gpa("cuDevicePrimaryCtxRelease", 10020, 0) != gpa("cuDevicePrimaryCtxRelease", 11000, 0));
        TRUE(gpa("cuMemFree", 3010, 0) != gpa("cuMemFree", 3020, 0));
    }

    /* Calling what came back: the v2 pointer allocates, the v1 one is the
     * 32-bit ABI. */
    setup();
    {
        CUdeviceptr p;
        CUdeviceptr_v1 p32;
        OK(((CUresult(*)(CUdeviceptr *, size_t))alloc_v2)(&p, 4096));
        OK(((CUresult(*)(CUdeviceptr))gpa("cuMemFree", 12080, 0))(p));
        EXPECT(((CUresult(*)(CUdeviceptr_v1 *, unsigned))alloc_v1)(&p32, 4096), CUDA_ERROR_NOT_SUPPORTED);
    }

    /* Flags: PER_THREAD_DEFAULT_STREAM picks the _ptsz twin where one exists. */
    {
        static const char *const k_twins[] = {"cuMemAllocAsync", "cuMemFreeAsync",
                                              "cuMemAllocFromPoolAsync", "cuStreamSynchronize"};
        for (size_t i = 0; i < 4; i++) {
            void *def = gpa(k_twins[i], 12080, CU_GET_PROC_ADDRESS_DEFAULT);
            void *leg = gpa(k_twins[i], 12080, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
            void *ptsz = gpa(k_twins[i], 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
            TRUE(def == leg && def != ptsz);
        }
        /* cuStreamSynchronize_ptsz appeared in CUDA 7.0. */
        TRUE(gpa("cuStreamSynchronize", 6050, 2) == gpa("cuStreamSynchronize", 6050, 0));
        TRUE(gpa("cuStreamSynchronize", 7000, 2) != gpa("cuStreamSynchronize", 7000, 0));
        TRUE(gpa("cuMemAlloc", 12080, 2) == alloc_v2);
        CUdeviceptr p;
        fn = gpa("cuMemAllocAsync", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
        OK(((CUresult(*)(CUdeviceptr *, size_t, CUstream))fn)(&p, 1000, NULL));
        fn = gpa("cuMemFreeAsync", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
        OK(((CUresult(*)(CUdeviceptr, CUstream))fn)(p, NULL));
    }

    /* Self lookup: the 11.3 ABI before 12.0, the 12.0 one after. */
    {
        void *self_v1 = gpa("cuGetProcAddress", 11080, 0);
        void *self_v2 = gpa("cuGetProcAddress", 12000, 0);
        TRUE(self_v1 != self_v2);
        TRUE(self_v1 != dlsym(lib, "cuGetProcAddress") && self_v2 != dlsym(lib, "cuGetProcAddress_v2"));
        expect_not_found("cuGetProcAddress", 11020, 0, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        void *via_v1 = NULL, *via_v2 = NULL;
        CUdriverProcAddressQueryResult st;
        OK(((gpa_v1_t)self_v1)("cuMemAlloc", &via_v1, 12080, 0));
        OK(((gpa_v2_t)self_v2)("cuMemAlloc", &via_v2, 12080, 0, &st));
        TRUE(via_v1 == alloc_v2 && via_v2 == alloc_v2 && st == CU_GET_PROC_ADDRESS_SUCCESS);
    }

    /* Bad arguments. */
    EXPECT(cuGetProcAddress_v2(NULL, &fn, 12080, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGetProcAddress_v2("cuMemAlloc", NULL, 12080, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGetProcAddress_v2("cuMemAlloc", &fn, 12080, 3, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGetProcAddress_v2("cuMemAlloc", &fn, 12080, 4, NULL), CUDA_ERROR_INVALID_VALUE);
    printf("ok\n");
}

/* ---- Contexts -------------------------------------------------------------------- */

static void *thread_without_context(void *arg)
{
    CUdeviceptr p;
    CUcontext c = (CUcontext)1;
    (void)arg;
    OK(cuCtxGetCurrent(&c));
    TRUE(c == NULL); /* current contexts are per thread */
    EXPECT(cuMemAlloc_v2(&p, 1), CUDA_ERROR_INVALID_CONTEXT);
    return NULL;
}

static pthread_barrier_t g_barrier;

static void *thread_with_destroyed(void *arg)
{
    CUdeviceptr p;
    OK(cuCtxSetCurrent((CUcontext)arg));
    OK(cuMemAlloc_v2(&p, 1));
    pthread_barrier_wait(&g_barrier); /* ready */
    pthread_barrier_wait(&g_barrier); /* the main thread destroyed it */
    EXPECT(cuMemAlloc_v2(&p, 1), CUDA_ERROR_INVALID_CONTEXT);
    return NULL;
}

static void scenario_ctx(void)
{
    CUcontext prim, prim2, c, cur, popped;
    CUdevice dev;
    CUdeviceptr p;
    size_t total, base_free;
    unsigned flags;
    int active;
    pthread_t th;

    OK(cuInit(0));
    OK(cuDeviceTotalMem_v2(&total, 0));
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    TRUE(active == 0);
    OK(cuDevicePrimaryCtxRetain(&prim, 0));
    OK(cuDevicePrimaryCtxRetain(&prim2, 0));
    TRUE(prim == prim2);
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    TRUE(active == 1);
    OK(cuCtxSetCurrent(prim));
    OK(cuCtxGetCurrent(&cur));
    TRUE(cur == prim);
    OK(cuCtxGetDevice(&dev));
    TRUE(dev == 0);
    base_free = free_mem();
    printf("context_cost=%zu\n", total - base_free);

    TRUE(pthread_create(&th, NULL, thread_without_context, NULL) == 0);
    pthread_join(th, NULL);

    /* A created context is pushed, costs its bytes, and owns its memory. */
    OK(cuCtxCreate_v2(&c, 0, 0));
    OK(cuCtxGetCurrent(&cur));
    TRUE(cur == c && c != prim);
    TRUE(free_mem() == base_free - (total - base_free));
    OK(cuMemAlloc_v2(&p, 1 << 20));
    OK(cuCtxPopCurrent_v2(&popped));
    TRUE(popped == c);
    OK(cuCtxGetCurrent(&cur));
    TRUE(cur == prim);
    OK(cuCtxPushCurrent_v2(c));
    OK(cuCtxDestroy_v2(c)); /* pops it and frees its allocations */
    OK(cuCtxGetCurrent(&cur));
    TRUE(cur == prim);
    TRUE(free_mem() == base_free);
    EXPECT(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuCtxDestroy_v2(c), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxPushCurrent_v2(c), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxSetCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxDestroy_v2(prim), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxDestroy_v2(NULL), CUDA_ERROR_INVALID_VALUE);

    /* A destroyed context still current on another thread is unusable there. */
    OK(cuCtxCreate_v2(&c, 0, 0));
    OK(cuCtxPopCurrent_v2(NULL));
    TRUE(pthread_barrier_init(&g_barrier, NULL, 2) == 0);
    TRUE(pthread_create(&th, NULL, thread_with_destroyed, c) == 0);
    pthread_barrier_wait(&g_barrier);
    OK(cuCtxDestroy_v2(c));
    pthread_barrier_wait(&g_barrier);
    pthread_join(th, NULL);
    TRUE(free_mem() == base_free);

    /* cuCtxSetCurrent(NULL) pops; an empty stack pops to INVALID_CONTEXT. */
    OK(cuCtxPushCurrent_v2(prim));
    OK(cuCtxSetCurrent(NULL));
    OK(cuCtxGetCurrent(&cur));
    TRUE(cur == prim);
    OK(cuCtxSetCurrent(NULL));
    OK(cuCtxGetCurrent(&cur));
    TRUE(cur == NULL);
    EXPECT(cuCtxPopCurrent_v2(&popped), CUDA_ERROR_INVALID_CONTEXT);
    OK(cuCtxSetCurrent(prim));

    /* The newer creation ABIs. */
    {
        CUexecAffinityParam aff;
        CUctxCreateParams params;
        memset(&aff, 0, sizeof aff);
        memset(&params, 0, sizeof params);
        EXPECT(cuCtxCreate_v3(&c, &aff, 1, 0, 0), CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
        OK(cuCtxCreate_v3(&c, NULL, 0, 0, 0));
        OK(cuCtxDestroy_v2(c));
        OK(cuCtxCreate_v4(&c, NULL, 0, 0));
        OK(cuCtxDestroy_v2(c));
        OK(cuCtxCreate_v4(&c, &params, 0, 0));
        OK(cuCtxDestroy_v2(c));
        params.numExecAffinityParams = 1;
        params.execAffinityParams = &aff;
        EXPECT(cuCtxCreate_v4(&c, &params, 0, 0), CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
        EXPECT(cuCtxCreate_v2(&c, 0x100, 0), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuCtxCreate_v2(&c, 0, 5), CUDA_ERROR_INVALID_DEVICE);
    }
    OK(cuCtxGetCurrent(&cur));
    TRUE(cur == prim);

    /* Releasing the primary context to zero frees what was allocated in it. */
    OK(cuMemAlloc_v2(&p, 1 << 20));
    OK(cuDevicePrimaryCtxRelease_v2(0));
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    TRUE(active == 1);
    OK(cuDevicePrimaryCtxRelease_v2(0));
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    TRUE(active == 0);
    EXPECT(cuDevicePrimaryCtxRelease_v2(0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuMemAlloc_v2(&p, 1), CUDA_ERROR_INVALID_CONTEXT); /* still current, but inactive */
    OK(cuDevicePrimaryCtxRetain(&prim2, 0));
    TRUE(prim2 == prim);
    TRUE(free_mem() == base_free);

    /* Reset frees allocations but keeps the context usable. */
    OK(cuMemAlloc_v2(&p, 1 << 20));
    OK(cuDevicePrimaryCtxReset_v2(0));
    TRUE(free_mem() == base_free);
    EXPECT(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
    printf("ok\n");
}

/* The first-generation exports. */
static void scenario_legacy(void)
{
    CUdeviceptr_v1 p32;
    unsigned int u1, u2;
    CUcontext c;
    void *h;
    EXPECT(cuMemAlloc(&p32, 16), CUDA_ERROR_NOT_INITIALIZED);
    setup();
    EXPECT(cuMemAlloc(&p32, 16), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemFree(p32), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemAllocPitch(&p32, &u1, 16, 16, 4), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemGetInfo(&u1, &u2), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemGetAddressRange(&p32, &u1, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuDeviceTotalMem(&u1, 0), CUDA_ERROR_NOT_SUPPORTED);
    OK(cuMemAllocHost(&h, 100));
    OK(cuMemFreeHost(h));
    OK(cuCtxCreate(&c, 0, 0));
    OK(cuCtxPopCurrent(&c));
    OK(cuCtxPushCurrent(c));
    OK(cuCtxDestroy(c));
    {
        CUstream s;
        OK(cuStreamCreate(&s, 0));
        OK(cuStreamDestroy(s));
    }
    printf("ok\n");
}

/* ---- Streams and the stream-ordered allocator ---------------------------------------- */

static void scenario_pool(void)
{
    CUmemoryPool def, cur, pool;
    CUdeviceptr a, b;
    CUstream s;
    size_t base;
    cuuint64_t v;
    setup();
    base = free_mem();

    OK(cuDeviceGetDefaultMemPool(&def, 0));
    OK(cuDeviceGetMemPool(&cur, 0));
    TRUE(def == cur && def != NULL);
    EXPECT(cuDeviceGetDefaultMemPool(&def, 7), CUDA_ERROR_INVALID_DEVICE);
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0);

    /* Reserve grows in 2 MiB steps and is what the device is charged. */
    OK(cuMemAllocAsync(&a, 1 * MiB, NULL));
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 1 * MiB);
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 2 * MiB);
    TRUE(free_mem() == base - 2 * MiB);
    OK(cuMemAllocAsync(&b, 1 * MiB, CU_STREAM_LEGACY)); /* fits in the reserve */
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 2 * MiB);
    TRUE(a != b);

    /* Freeing returns bytes to the pool; only synchronization releases them. */
    OK(cuMemFreeAsync(a, NULL));
    OK(cuMemFreeAsync(b, NULL));
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 2 * MiB);
    TRUE(free_mem() == base - 2 * MiB);
    OK(cuStreamSynchronize(NULL));
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);
    TRUE(free_mem() == base);

    /* Each allocation has its own address, reused after free. */
    OK(cuMemAllocAsync(&a, 4096, NULL));
    OK(cuMemFreeAsync(a, NULL));
    OK(cuMemAllocAsync(&b, 4096, NULL));
    TRUE(b == a);

    /* A chunk with live memory in it is kept at synchronization. */
    OK(cuCtxSynchronize());
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 2 * MiB);
    OK(cuMemFree_v2(b)); /* cuMemFree works on pool memory too */
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
    OK(cuCtxSynchronize());
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);

    /* The release threshold keeps reserve across synchronization. */
    v = 4 * MiB;
    OK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
    OK(cuMemAllocAsync(&a, 3 * MiB, NULL));
    OK(cuMemAllocAsync(&b, 3 * MiB, NULL));
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 6 * MiB);
    OK(cuMemFreeAsync(a, NULL));
    OK(cuMemFreeAsync(b, NULL));
    OK(cuStreamSynchronize(NULL));
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 4 * MiB);
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 6 * MiB);
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 6 * MiB);
    v = 1;
    EXPECT(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v), CUDA_ERROR_INVALID_VALUE);
    v = 0;
    OK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v));
    OK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v));
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 4 * MiB);
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 0);
    {
        int flag = -1;
        OK(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag));
        TRUE(flag == 1);
        flag = 0;
        OK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag));
        OK(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag));
        TRUE(flag == 0);
    }
    EXPECT(cuMemPoolGetAttribute(def, (CUmemPool_attribute)42, &v), CUDA_ERROR_INVALID_VALUE);
    /* Trimming ignores the threshold. */
    OK(cuMemPoolTrimTo(def, 2 * MiB + 1));
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 4 * MiB);
    OK(cuMemPoolTrimTo(def, 0));
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);
    TRUE(free_mem() == base);
    v = 0;
    OK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));

    /* Streams. */
    EXPECT(cuStreamCreate(&s, 2), CUDA_ERROR_INVALID_VALUE);
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuMemAllocAsync(&a, 100, s));
    OK(cuMemFreeAsync(a, s));
    OK(cuStreamSynchronize(s));
    OK(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    OK(cuStreamSynchronize_ptsz(NULL));
    OK(cuStreamDestroy_v2(s));
    EXPECT(cuMemAllocAsync(&a, 100, s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamDestroy_v2(s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamDestroy_v2(NULL), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuMemAllocAsync(&a, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFreeAsync(0x1234, NULL), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemFreeAsync(0, NULL));

    /* The _ptsz twins: stream 0 is the per-thread stream. */
    OK(cuMemAllocAsync_ptsz(&a, 1000, NULL));
    OK(cuMemFreeAsync_ptsz(a, NULL));
    OK(cuMemAllocFromPoolAsync_ptsz(&a, 1000, def, CU_STREAM_PER_THREAD));
    OK(cuMemFreeAsync_ptsz(a, CU_STREAM_LEGACY));
    OK(cuStreamSynchronize_ptsz(NULL));
    TRUE(free_mem() == base);

    /* An explicit pool, made current, then destroyed with memory outstanding. */
    {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 0;
        EXPECT(cuMemPoolCreate(&pool, NULL), CUDA_ERROR_INVALID_VALUE);
        props.location.id = 9;
        EXPECT(cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_VALUE);
        props.location.id = 0;
        OK(cuMemPoolCreate(&pool, &props));
        TRUE(pool != def);
        OK(cuMemAllocFromPoolAsync(&a, 1 * MiB, pool, NULL));
        TRUE(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 1 * MiB);
        TRUE(pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
        OK(cuDeviceSetMemPool(0, pool));
        OK(cuDeviceGetMemPool(&cur, 0));
        TRUE(cur == pool);
        OK(cuMemAllocAsync(&b, 1 * MiB, NULL)); /* from the current pool */
        TRUE(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 2 * MiB);
        OK(cuMemPoolDestroy(pool));
        OK(cuDeviceGetMemPool(&cur, 0));
        TRUE(cur == def);
        EXPECT(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v), CUDA_ERROR_INVALID_VALUE);
        TRUE(free_mem() == base - 2 * MiB); /* alive until the last free */
        OK(cuMemFreeAsync(a, NULL));
        OK(cuMemFreeAsync(b, NULL));
        TRUE(free_mem() == base);
        EXPECT(cuMemPoolDestroy(def), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemAllocFromPoolAsync(&a, 1, pool, NULL), CUDA_ERROR_INVALID_VALUE);

        /* maxSize caps the reserve. */
        props.maxSize = 4 * MiB;
        OK(cuMemPoolCreate(&pool, &props));
        OK(cuMemAllocFromPoolAsync(&a, 3 * MiB, pool, NULL));
        EXPECT(cuMemAllocFromPoolAsync(&b, 2 * MiB, pool, NULL), CUDA_ERROR_OUT_OF_MEMORY);
        OK(cuMemFreeAsync(a, NULL));
        OK(cuMemPoolDestroy(pool));
        TRUE(free_mem() == base);
    }
    printf("ok\n");
}

/* SIMCUDA_MEMORY=8MiB: the pool's reserve competes with cuMemAlloc. */
static void scenario_poolfull(void)
{
    CUmemoryPool def;
    CUdeviceptr a, b, c;
    setup();
    TRUE(free_mem() == 8 * MiB);
    OK(cuDeviceGetDefaultMemPool(&def, 0));
    OK(cuMemAlloc_v2(&a, 3 * MiB));
    OK(cuMemAllocAsync(&b, 4 * MiB, NULL));
    OK(cuMemFreeAsync(b, NULL));
    TRUE(free_mem() == 1 * MiB); /* the pool still holds 4 MiB */
    EXPECT(cuMemAlloc_v2(&c, 2 * MiB), CUDA_ERROR_OUT_OF_MEMORY); /* cuMemAlloc does not trim pools */
    /* The pool first gives back its unused reserve, then still cannot fit
     * 6 MiB beside the 3 MiB of cuMemAlloc memory. */
    EXPECT(cuMemAllocAsync(&c, 5 * MiB, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    TRUE(pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0);
    TRUE(free_mem() == 5 * MiB);
    OK(cuMemAllocAsync(&c, 4 * MiB, NULL));
    OK(cuMemFreeAsync(c, NULL));
    OK(cuMemFree_v2(a));
    OK(cuStreamSynchronize(NULL));
    TRUE(free_mem() == 8 * MiB);
    printf("ok\n");
}

/* ---- Virtual memory management ------------------------------------------------------ */

static void scenario_vmm(void)
{
    CUmemAllocationProp prop = device_prop(0), bad = device_prop(0);
    CUmemGenericAllocationHandle h, h2, h3;
    CUdeviceptr va, va2, base;
    CUmemAccessDesc access;
    size_t gran = 0, size, before;
    setup();
    before = free_mem();

    OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    TRUE(gran == 2 * MiB);
    OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    TRUE(gran == 2 * MiB);
    bad.type = CU_MEM_ALLOCATION_TYPE_INVALID;
    EXPECT(cuMemGetAllocationGranularity(&gran, &bad, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemCreate(&h, 4 * MiB, &bad, 0), CUDA_ERROR_INVALID_VALUE);
    bad = device_prop(3);
    EXPECT(cuMemCreate(&h, 4 * MiB, &bad, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemCreate(&h, 1 * MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemCreate(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);

    OK(cuMemCreate(&h, 4 * MiB, &prop, 0));
    TRUE(free_mem() == before - 4 * MiB);
    OK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
    TRUE(va % (2 * MiB) == 0);
    EXPECT(cuMemAddressReserve(&va2, 3 * MiB, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemMap(va, 4 * MiB, 2 * MiB, h, 0), CUDA_ERROR_INVALID_VALUE); /* offset must be 0 */
    EXPECT(cuMemMap(va, 6 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);       /* bigger than h */
    EXPECT(cuMemMap(va + 6 * MiB, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* past the reservation */
    EXPECT(cuMemMap(0x10000000, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE);   /* not reserved */
    OK(cuMemMap(va, 4 * MiB, 0, h, 0));
    EXPECT(cuMemMap(va + 2 * MiB, 2 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* already mapped */

    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    OK(cuMemSetAccess(va, 4 * MiB, &access, 1));
    EXPECT(cuMemSetAccess(va, 6 * MiB, &access, 1), CUDA_ERROR_INVALID_VALUE); /* partly unmapped */
    EXPECT(cuMemSetAccess(va, 4 * MiB, NULL, 1), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemGetAddressRange_v2(&base, &size, va + 12345));
    TRUE(base == va && size == 4 * MiB);

    /* Releasing while mapped is legal; the mapping keeps the memory. */
    OK(cuMemRelease(h));
    TRUE(free_mem() == before - 4 * MiB);
    EXPECT(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE); /* no reference left to drop */
    OK(cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)(va + 3 * MiB)));
    TRUE(h2 == h);
    EXPECT(cuMemRetainAllocationHandle(&h3, (void *)(uintptr_t)(va + 5 * MiB)), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemRelease(h2));
    EXPECT(cuMemUnmap(va, 2 * MiB), CUDA_ERROR_INVALID_VALUE); /* cannot split a mapping */
    EXPECT(cuMemAddressFree(va, 8 * MiB), CUDA_ERROR_INVALID_VALUE); /* still mapped */
    OK(cuMemUnmap(va, 4 * MiB));
    TRUE(free_mem() == before); /* last user gone: physical memory freed */
    EXPECT(cuMemUnmap(va, 4 * MiB), CUDA_ERROR_INVALID_VALUE);

    /* Handle values are reused once the memory behind them is gone. */
    OK(cuMemCreate(&h3, 2 * MiB, &prop, 0));
    TRUE(h3 == h);
    printf("handle=0x%llx\n", h3);

    /* Refcounts: create 1, retain +1, release -1; mapped memory survives 0. */
    OK(cuMemMap(va, 2 * MiB, 0, h3, 0));
    OK(cuMemMap(va + 2 * MiB, 2 * MiB, 0, h3, 0)); /* a second mapping of the same memory */
    OK(cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)va));
    OK(cuMemRelease(h2));
    OK(cuMemRelease(h3));
    TRUE(free_mem() == before - 2 * MiB);
    OK(cuMemUnmap(va, 2 * MiB));
    TRUE(free_mem() == before - 2 * MiB); /* still mapped at va + 2 MiB */
    OK(cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)(va + 2 * MiB)));
    OK(cuMemUnmap(va + 2 * MiB, 2 * MiB));
    TRUE(free_mem() == before - 2 * MiB); /* the retained handle keeps it */
    OK(cuMemRelease(h2));
    TRUE(free_mem() == before);

    /* One unmap may cover several whole mappings. */
    OK(cuMemCreate(&h, 2 * MiB, &prop, 0));
    OK(cuMemCreate(&h2, 2 * MiB, &prop, 0));
    TRUE(h != h2);
    OK(cuMemMap(va, 2 * MiB, 0, h, 0));
    OK(cuMemMap(va + 2 * MiB, 2 * MiB, 0, h2, 0));
    OK(cuMemSetAccess(va, 4 * MiB, &access, 1)); /* spans both mappings */
    OK(cuMemRelease(h));
    OK(cuMemRelease(h2));
    OK(cuMemUnmap(va, 8 * MiB));
    TRUE(free_mem() == before);

    /* Address ranges: exact free, reuse, hints. */
    EXPECT(cuMemAddressFree(va, 4 * MiB), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemAddressFree(va, 8 * MiB));
    EXPECT(cuMemAddressFree(va, 8 * MiB), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemAddressReserve(&va2, 8 * MiB, 0, 0, 0));
    TRUE(va2 == va);
    OK(cuMemAddressReserve(&base, 2 * MiB, 0, va2 + 64 * MiB, 0));
    TRUE(base == va2 + 64 * MiB); /* a free hint is honoured */
    OK(cuMemAddressFree(base, 2 * MiB));
    OK(cuMemAddressReserve(&base, 2 * MiB, 0, va2, 0)); /* a taken hint is not */
    TRUE(base != va2);
    OK(cuMemAddressFree(base, 2 * MiB));
    OK(cuMemAddressReserve(&base, 4 * MiB, 64 * MiB, 0, 0));
    TRUE(base % (64 * MiB) == 0);
    OK(cuMemAddressFree(base, 4 * MiB));
    OK(cuMemAddressFree(va2, 8 * MiB));

    /* Capacity. */
    {
        CUmemGenericAllocationHandle big;
        size_t f = free_mem() / (2 * MiB) * (2 * MiB);
        OK(cuMemCreate(&big, f, &prop, 0));
        EXPECT(cuMemCreate(&h, 2 * MiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
        OK(cuMemRelease(big));
    }
    printf("ok\n");
}

/* ---- Faults and threads ------------------------------------------------------------ */

static void exit_on_fault(int sig)
{
    _exit(sig == SIGSEGV || sig == SIGBUS ? 77 : 1);
}

/* Reads *p in a child process; true if the read faulted.  The child exits
 * from its signal handler, so no core file is written. */
static int read_faults(volatile char *p)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = exit_on_fault;
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        char c = *p;
        (void)c;
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 77;
}

/* Copies and fills: simcuda's cuda.h covers memory management only. */
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n);

/* Device memory is host memory at the same address (so real clients' copies
 * work); a VMM reservation is inaccessible until memory is mapped into it,
 * and again after it is unmapped. */
static void scenario_fault(void)
{
    CUdeviceptr d, va, vb;
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop = device_prop(0);
    char buf[16] = "simcuda bytes", back[16] = {0};
    setup();
    OK(cuMemAlloc_v2(&d, 4096));
    TRUE(!read_faults((volatile char *)(uintptr_t)d));
    OK(cuMemcpyHtoD_v2(d, buf, sizeof buf));
    TRUE(memcmp((const void *)(uintptr_t)d, buf, sizeof buf) == 0);
    OK(cuMemcpyDtoH_v2(back, d, sizeof back));
    TRUE(memcmp(back, buf, sizeof buf) == 0);
    OK(cuMemsetD8_v2(d, 0x5a, 8));
    TRUE(((volatile unsigned char *)(uintptr_t)d)[7] == 0x5a);
    OK(cuMemAllocAsync(&d, 4096, NULL));
    TRUE(!read_faults((volatile char *)(uintptr_t)d));
    OK(cuMemCreate(&h, 2 * MiB, &prop, 0));
    OK(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0));
    OK(cuMemAddressReserve(&vb, 2 * MiB, 0, 0, 0));
    TRUE(read_faults((volatile char *)(uintptr_t)va));
    OK(cuMemMap(va, 2 * MiB, 0, h, 0));
    OK(cuMemMap(vb, 2 * MiB, 0, h, 0));
    TRUE(!read_faults((volatile char *)(uintptr_t)va));
    ((volatile char *)(uintptr_t)va)[100] = 42; /* one physical allocation, two addresses */
    TRUE(((volatile char *)(uintptr_t)vb)[100] == 42);
    OK(cuMemUnmap(va, 2 * MiB));
    TRUE(read_faults((volatile char *)(uintptr_t)va));
    TRUE(((volatile char *)(uintptr_t)vb)[100] == 42);
    OK(cuMemAllocManaged(&d, 4096, CU_MEM_ATTACH_GLOBAL));
    TRUE(!read_faults((volatile char *)(uintptr_t)d)); /* managed memory is host memory */
    printf("ok\n");
}

static CUcontext g_shared;

static void *churn(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    CUdeviceptr live[64] = {0};
    OK(cuCtxSetCurrent(g_shared));
    for (int i = 0; i < 20000; i++) {
        int k = rand_r(&seed) % 64;
        if (live[k]) {
            if (k % 2)
                OK(cuMemFree_v2(live[k]));
            else
                OK(cuMemFreeAsync(live[k], NULL));
            live[k] = 0;
        } else if (k % 2) {
            OK(cuMemAlloc_v2(&live[k], 1 + rand_r(&seed) % 100000));
        } else {
            OK(cuMemAllocAsync(&live[k], 1 + rand_r(&seed) % 100000, CU_STREAM_PER_THREAD));
        }
    }
    for (int k = 0; k < 64; k++)
        if (live[k])
            OK(cuMemFree_v2(live[k]));
    return NULL;
}

static void scenario_threads(void)
{
    pthread_t th[8];
    size_t before;
    g_shared = setup();
    before = free_mem();
    for (int i = 0; i < 8; i++)
        TRUE(pthread_create(&th[i], NULL, churn, (void *)(uintptr_t)(i + 1)) == 0);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    OK(cuCtxSynchronize());
    TRUE(free_mem() == before);
    printf("ok\n");
}

/* ---- Stream capture ------------------------------------------------------------------ */

static CUcontext g_cap_ctx;

/* What the other thread does: an action, in a capture mode of its own. */
enum other_action { OTHER_ALLOC, OTHER_HOST_ALLOC, OTHER_END_CAPTURE };
static struct {
    enum other_action action;
    CUstreamCaptureMode mode;
    CUstream stream;
    CUresult result;
} g_other;

static void *other_thread_body(void *arg)
{
    (void)arg;
    OK(cuCtxSetCurrent(g_cap_ctx));
    if (g_other.mode != CU_STREAM_CAPTURE_MODE_GLOBAL) {
        CUstreamCaptureMode m = g_other.mode;
        OK(cuThreadExchangeStreamCaptureMode(&m));
        TRUE(m == CU_STREAM_CAPTURE_MODE_GLOBAL); /* a new thread starts in GLOBAL */
    }
    switch (g_other.action) {
    case OTHER_ALLOC: {
        CUdeviceptr d = 0;
        g_other.result = cuMemAlloc_v2(&d, 4096);
        if (g_other.result == CUDA_SUCCESS)
            OK(cuMemFree_v2(d));
        break;
    }
    case OTHER_HOST_ALLOC: {
        void *h = NULL;
        g_other.result = cuMemHostAlloc(&h, 4096, 0);
        if (g_other.result == CUDA_SUCCESS)
            OK(cuMemFreeHost(h));
        break;
    }
    case OTHER_END_CAPTURE: {
        CUgraph g = NULL;
        g_other.result = cuStreamEndCapture(g_other.stream, &g);
        if (g_other.result == CUDA_SUCCESS)
            OK(cuGraphDestroy(g));
        break;
    }
    }
    if (g_other.mode != CU_STREAM_CAPTURE_MODE_GLOBAL) {
        CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_GLOBAL;
        OK(cuThreadExchangeStreamCaptureMode(&m));
        TRUE(m == g_other.mode); /* the old mode comes back through the pointer */
    }
    return NULL;
}

static CUresult on_other_thread(enum other_action action, CUstreamCaptureMode mode)
{
    pthread_t th;
    g_other.action = action;
    g_other.mode = mode;
    g_other.result = CUDA_ERROR_UNKNOWN;
    TRUE(pthread_create(&th, NULL, other_thread_body, NULL) == 0);
    TRUE(pthread_join(th, NULL) == 0);
    return g_other.result;
}

static CUstreamCaptureStatus capture_status(CUstream s)
{
    CUstreamCaptureStatus st = (CUstreamCaptureStatus)7;
    OK(cuStreamIsCapturing(s, &st));
    return st;
}

/* Ends a capture, expecting `want`; a graph comes back exactly on success. */
static void end_capture(CUstream s, CUresult want)
{
    CUgraph g = (CUgraph)1;
    EXPECT(cuStreamEndCapture(s, &g), want);
    TRUE((g != NULL) == (want == CUDA_SUCCESS));
    if (g)
        OK(cuGraphDestroy(g));
    TRUE(capture_status(s) == CU_STREAM_CAPTURE_STATUS_NONE);
}

#define GLOBAL  CU_STREAM_CAPTURE_MODE_GLOBAL
#define LOCAL   CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
#define RELAXED CU_STREAM_CAPTURE_MODE_RELAXED

static void scenario_capture(void)
{
    CUstream s1, s2;
    CUdeviceptr d;
    CUgraph g;
    CUstreamCaptureMode m;
    size_t before;

    g_cap_ctx = setup();
    before = free_mem();
    OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));

    /* The per-thread mode: a swap, GLOBAL by default. */
    m = RELAXED;
    OK(cuThreadExchangeStreamCaptureMode(&m));
    TRUE(m == GLOBAL);
    m = GLOBAL;
    OK(cuThreadExchangeStreamCaptureMode(&m));
    TRUE(m == RELAXED);
    m = (CUstreamCaptureMode)3;
    EXPECT(cuThreadExchangeStreamCaptureMode(&m), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuThreadExchangeStreamCaptureMode(NULL), CUDA_ERROR_INVALID_VALUE);

    /* Bad uses. */
    TRUE(capture_status(s1) == CU_STREAM_CAPTURE_STATUS_NONE);
    EXPECT(cuStreamBeginCapture_v2(NULL, GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cuStreamBeginCapture_v2(CU_STREAM_LEGACY, GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cuStreamBeginCapture_v2(s1, (CUstreamCaptureMode)3), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamBeginCapture_v2((CUstream)(uintptr_t)0x1234560, GLOBAL), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamEndCapture(s1, &g), CUDA_ERROR_ILLEGAL_STATE);
    EXPECT(cuStreamIsCapturing(s1, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGraphDestroy(NULL), CUDA_ERROR_INVALID_VALUE);

    /* GLOBAL capture: cuMemAlloc on another thread is prohibited and
     * invalidates the capture. */
    OK(cuStreamBeginCapture_v2(s1, GLOBAL));
    EXPECT(cuStreamBeginCapture_v2(s1, GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
    TRUE(capture_status(s1) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    TRUE(capture_status(s2) == CU_STREAM_CAPTURE_STATUS_NONE);
    EXPECT(on_other_thread(OTHER_ALLOC, GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    TRUE(capture_status(s1) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    EXPECT(on_other_thread(OTHER_HOST_ALLOC, GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    TRUE(on_other_thread(OTHER_ALLOC, GLOBAL) == CUDA_SUCCESS); /* capture over */

    /* The same call from a RELAXED thread is allowed, and so is one from a
     * THREAD_LOCAL thread (other threads' captures are not its concern). */
    OK(cuStreamBeginCapture_v2(s1, GLOBAL));
    TRUE(on_other_thread(OTHER_ALLOC, RELAXED) == CUDA_SUCCESS);
    TRUE(on_other_thread(OTHER_ALLOC, LOCAL) == CUDA_SUCCESS);
    TRUE(on_other_thread(OTHER_HOST_ALLOC, RELAXED) == CUDA_SUCCESS);
    TRUE(capture_status(s1) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    /* Stream-ordered allocation on the capturing stream is part of the
     * capture (simcuda allocates at once). */
    OK(cuMemAllocAsync(&d, 1000, s1));
    TRUE(d != 0);
    OK(cuMemFreeAsync(d, s1));
    {
        CUmemoryPool pool;
        OK(cuDeviceGetDefaultMemPool(&pool, 0));
        OK(cuMemAllocFromPoolAsync(&d, 1000, pool, s1));
        OK(cuMemFreeAsync(d, s1));
    }
    TRUE(capture_status(s1) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    /* Ending a GLOBAL capture is for the thread that began it. */
    g_other.stream = s1;
    EXPECT(on_other_thread(OTHER_END_CAPTURE, GLOBAL), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    OK(cuStreamEndCapture(s1, &g));
    TRUE(g != NULL);
    OK(cuGraphDestroy(g));
    EXPECT(cuGraphDestroy(g), CUDA_ERROR_INVALID_VALUE);

    /* The capturing thread's own unsafe calls, in GLOBAL mode. */
    OK(cuStreamBeginCapture_v2(s1, GLOBAL));
    EXPECT(cuMemAlloc_v2(&d, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    OK(cuStreamBeginCapture_v2(s1, GLOBAL));
    EXPECT(cuMemAllocAsync(&d, 1000, s2), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); /* not capturing */
    end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    OK(cuStreamBeginCapture_v2(s1, GLOBAL));
    EXPECT(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    OK(cuStreamBeginCapture_v2(s1, GLOBAL));
    EXPECT(cuMemFree_v2(0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* THREAD_LOCAL capture: only its own thread is restricted. */
    OK(cuStreamBeginCapture_v2(s1, LOCAL));
    TRUE(on_other_thread(OTHER_ALLOC, GLOBAL) == CUDA_SUCCESS);
    TRUE(capture_status(s1) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    m = RELAXED; /* unless it relaxes itself */
    OK(cuThreadExchangeStreamCaptureMode(&m));
    TRUE(m == GLOBAL);
    OK(cuMemAlloc_v2(&d, 4096));
    OK(cuMemFree_v2(d));
    OK(cuThreadExchangeStreamCaptureMode(&m));
    TRUE(m == RELAXED);
    TRUE(capture_status(s1) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    m = LOCAL; /* its own capture binds it in THREAD_LOCAL mode too */
    OK(cuThreadExchangeStreamCaptureMode(&m));
    EXPECT(cuMemAllocManaged(&d, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    OK(cuThreadExchangeStreamCaptureMode(&m));
    TRUE(capture_status(s1) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    TRUE(on_other_thread(OTHER_ALLOC, GLOBAL) == CUDA_SUCCESS);
    end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* RELAXED capture: nobody is restricted, and any thread may end it. */
    OK(cuStreamBeginCapture_v2(s1, RELAXED));
    OK(cuMemAlloc_v2(&d, 4096));
    OK(cuMemFree_v2(d));
    TRUE(on_other_thread(OTHER_ALLOC, GLOBAL) == CUDA_SUCCESS);
    TRUE(on_other_thread(OTHER_END_CAPTURE, GLOBAL) == CUDA_SUCCESS);
    TRUE(capture_status(s1) == CU_STREAM_CAPTURE_STATUS_NONE);

    /* Synchronizing the capturing stream is never allowed. */
    OK(cuStreamBeginCapture_v2(s1, RELAXED));
    OK(cuStreamSynchronize(s2));
    EXPECT(cuStreamSynchronize(s1), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* The per-thread default stream can be captured (through the _ptsz
     * twins, stream 0 is it). */
    OK(cuStreamBeginCapture_v2_ptsz(NULL, GLOBAL));
    TRUE(capture_status(CU_STREAM_PER_THREAD) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    TRUE(capture_status(NULL) == CU_STREAM_CAPTURE_STATUS_NONE); /* the legacy stream */
    OK(cuMemAllocAsync_ptsz(&d, 1000, NULL));
    OK(cuMemFreeAsync(d, CU_STREAM_PER_THREAD));
    EXPECT(on_other_thread(OTHER_ALLOC, GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    {
        CUstreamCaptureStatus st;
        OK(cuStreamIsCapturing_ptsz(NULL, &st));
        TRUE(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        EXPECT(cuStreamEndCapture_ptsz(NULL, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        TRUE(g == NULL);
    }

    /* CUDA 10.0's cuStreamBeginCapture has no mode: GLOBAL. */
    OK(cuStreamBeginCapture(s2));
    EXPECT(on_other_thread(OTHER_ALLOC, GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_capture(s2, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* Destroying a capturing stream ends its capture. */
    OK(cuStreamBeginCapture_v2(s2, GLOBAL));
    OK(cuStreamDestroy_v2(s2));
    TRUE(on_other_thread(OTHER_ALLOC, GLOBAL) == CUDA_SUCCESS);

    /* cuGetProcAddress: the 10.0 ABI, then the 10.1 one with a mode. */
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    TRUE(lib != NULL);
    {
        void *v1 = gpa("cuStreamBeginCapture", 10000, 0);
        void *v2 = gpa("cuStreamBeginCapture", 10010, 0);
        TRUE(v1 != v2 && gpa("cuStreamBeginCapture", 12080, 0) == v2);
        TRUE(gpa("cuStreamBeginCapture", 10000, 2) != v1);
        TRUE(gpa("cuStreamBeginCapture", 12080, 2) != v2);
        TRUE(gpa("cuStreamEndCapture", 12080, 2) != gpa("cuStreamEndCapture", 12080, 0));
        TRUE(gpa("cuStreamIsCapturing", 12080, 2) != gpa("cuStreamIsCapturing", 12080, 0));
        expect_internal("cuStreamBeginCapture", v1);
        expect_not_found("cuStreamBeginCapture", 9020, 0, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        expect_not_found("cuThreadExchangeStreamCaptureMode", 10000, 0,
                         CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        OK(((CUresult(*)(CUstream, CUstreamCaptureMode))v2)(s1, RELAXED));
        TRUE(on_other_thread(OTHER_ALLOC, GLOBAL) == CUDA_SUCCESS);
        end_capture(s1, CUDA_SUCCESS);
        OK(((CUresult(*)(CUstream))v1)(s1));
        EXPECT(on_other_thread(OTHER_ALLOC, GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }

    OK(cuStreamDestroy_v2(s1));
    OK(cuCtxSynchronize());
    TRUE(free_mem() == before);
    printf("ok\n");
}

#undef GLOBAL
#undef LOCAL
#undef RELAXED

/* ---- occupancy of thread-block clusters, and the CUDA 12.5 context limits -------------- */

/* What cuda.h declares for these (simcuda's subset header does not). */
typedef struct occ_module *occ_module_t;
typedef struct occ_function *occ_function_t;
struct occ_launch_attr {
    unsigned id, pad;
    union {
        unsigned char bytes[64];
        struct {
            unsigned x, y, z;
        } cluster_dim;
    } value;
};
struct occ_launch_config {
    unsigned gx, gy, gz, bx, by, bz, shared;
    CUstream stream;
    struct occ_launch_attr *attrs;
    unsigned n_attrs;
};
CUresult cuModuleLoadData(occ_module_t *module, const void *image);
CUresult cuModuleGetFunction(occ_function_t *fn, occ_module_t module, const char *name);
CUresult cuModuleUnload(occ_module_t module);
CUresult cuFuncSetAttribute(occ_function_t fn, int attr, int value);
CUresult cuOccupancyMaxActiveClusters(int *n, occ_function_t fn,
                                      const struct occ_launch_config *config);
CUresult cuOccupancyMaxPotentialClusterSize(int *size, occ_function_t fn,
                                            const struct occ_launch_config *config);
CUresult cuCtxGetLimit(size_t *value, int limit);
CUresult cuCtxSetLimit(int limit, size_t value);

#define OCC_ATTR_CLUSTER_DIMENSION 4
#define OCC_FUNC_MAX_DYNAMIC_SHARED 8
#define OCC_FUNC_NON_PORTABLE_CLUSTERS 14
#define OCC_SM_SHARED_OPTIN 232448
#define OCC_SMS 132

/* Clusters of `blocks` one-SM blocks (each takes all of an SM's shared memory). */
static CUresult clusters_of(occ_function_t fn, unsigned blocks, int *n)
{
    struct occ_launch_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.id = OCC_ATTR_CLUSTER_DIMENSION;
    attr.value.cluster_dim.x = blocks;
    attr.value.cluster_dim.y = 1;
    attr.value.cluster_dim.z = 1;
    struct occ_launch_config config = {blocks, 1, 1, 128, 1, 1, OCC_SM_SHARED_OPTIN,
                                       NULL, &attr, 1};
    *n = -1;
    return cuOccupancyMaxActiveClusters(n, fn, &config);
}

static void scenario_occupancy(void)
{
    setup();
    /* CUDA 12.5's limits: this is no CUDA-in-graphics context (cuBLASLt 12.8 asks). */
    size_t v;
    OK(cuCtxGetLimit(&v, 7));
    TRUE(v == OCC_SM_SHARED_OPTIN);
    OK(cuCtxGetLimit(&v, 8));
    TRUE(v == 0);
    OK(cuCtxGetLimit(&v, 9));
    TRUE(v == 1);
    EXPECT(cuCtxSetLimit(8, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuCtxSetLimit(7, 1024), CUDA_ERROR_INVALID_VALUE);
    OK(cuCtxSetLimit(9, 0));
    OK(cuCtxGetLimit(&v, 9));
    TRUE(v == 0);
    OK(cuCtxSetLimit(9, 1));
    EXPECT(cuCtxGetLimit(&v, 10), CUDA_ERROR_UNSUPPORTED_LIMIT);

    /* PTX text: simcuda finds any kernel in it. */
    occ_module_t module;
    occ_function_t fn;
    OK(cuModuleLoadData(&module, ".version 8.0\n.target sm_90\n.address_size 64\n"));
    OK(cuModuleGetFunction(&fn, module, "probe"));
    OK(cuFuncSetAttribute(fn, OCC_FUNC_MAX_DYNAMIC_SHARED, OCC_SM_SHARED_OPTIN));

    /* Without the non-portable attribute a cluster holds at most 8 blocks. */
    int n;
    struct occ_launch_config no_cluster = {8, 1, 1, 128, 1, 1, 0, NULL, NULL, 0};
    EXPECT(cuOccupancyMaxActiveClusters(&n, fn, &no_cluster), CUDA_ERROR_INVALID_CLUSTER_SIZE);
    OK(cuOccupancyMaxPotentialClusterSize(&n, fn, &no_cluster));
    TRUE(n == 8);
    OK(clusters_of(fn, 8, &n));
    TRUE(n == 16);
    EXPECT(clusters_of(fn, 9, &n), CUDA_ERROR_INVALID_CLUSTER_SIZE);
    OK(cuFuncSetAttribute(fn, OCC_FUNC_NON_PORTABLE_CLUSTERS, 1));
    OK(cuOccupancyMaxPotentialClusterSize(&n, fn, &no_cluster));
    TRUE(n == 16);
    EXPECT(clusters_of(fn, 0, &n), CUDA_ERROR_INVALID_CLUSTER_SIZE);
    EXPECT(clusters_of(fn, 19, &n), CUDA_ERROR_INVALID_CLUSTER_SIZE);

    /* Every answer is what one set of GPCs gives, as cuBLASLt 12.1 checks when it makes a
     * handle: from the largest cluster down, the GPCs found so far account for part of the
     * clusters of each size; what is left is GPCs of exactly that many SMs, never negative,
     * and they add up to every SM. */
    int gpcs_of[19] = {0};
    for (unsigned size = 18; size >= 1; size--) {
        OK(clusters_of(fn, size, &n));
        int left = n;
        for (unsigned bigger = size + 1; bigger <= 18; bigger++)
            left -= gpcs_of[bigger] * (int)(bigger / size);
        TRUE(left >= 0);
        gpcs_of[size] = left;
        printf("clusters_%u=%d\n", size, n);
    }
    int sms = 0, gpcs = 0;
    for (unsigned size = 1; size <= 18; size++) {
        sms += gpcs_of[size] * (int)size;
        gpcs += gpcs_of[size];
    }
    TRUE(sms == OCC_SMS);
    printf("gpcs=%d\n", gpcs);
    OK(clusters_of(fn, 1, &n));
    TRUE(n == OCC_SMS);
    OK(cuModuleUnload(module));
    printf("ok\n");
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } k_scenarios[] = {
        {"init", scenario_init},       {"nodevice", scenario_nodevice}, {"errors", scenario_errors},
        {"oom", scenario_oom},         {"ctxoom", scenario_ctxoom},     {"reuse", scenario_reuse},
        {"pitch", scenario_pitch},     {"managed", scenario_managed},   {"host", scenario_host},
        {"gpa", scenario_gpa},         {"ctx", scenario_ctx},           {"legacy", scenario_legacy},
        {"pool", scenario_pool},       {"poolfull", scenario_poolfull}, {"vmm", scenario_vmm},
        {"fault", scenario_fault},     {"threads", scenario_threads},   {"capture", scenario_capture},
        {"occupancy", scenario_occupancy},
    };
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: drvtest <scenario>\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof k_scenarios / sizeof k_scenarios[0]; i++) {
        if (strcmp(argv[1], k_scenarios[i].name) == 0) {
            k_scenarios[i].run();
            return 0;
        }
    }
    fprintf(stderr, "drvtest: unknown scenario %s\n", argv[1]);
    return 2;
}
