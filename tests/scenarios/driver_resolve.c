// The driver resolver's semantics must be exactly the same with and without oomtrace: this
// program prints what it sees, and the test compares the output of both runs.
// Linked with -lcuda: also calls cuMemAlloc_v2 and cuGetProcAddress_v2 by symbol.
// Live at exit: direct_alloc 1 MiB (cuMemAlloc_v2), via_gpa_ptsz 2 MiB (cuMemAllocAsync_ptsz),
// via_self_lookup 3 MiB (cuMemAlloc_v2).
#define SIMCUDA_NO_V2_MACROS
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda.h>

typedef CUresult (*gpa_v1_fn)(const char*, void**, int, cuuint64_t);
typedef CUresult (*gpa_v2_fn)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
typedef CUresult (*alloc_v2_fn)(CUdeviceptr*, size_t);
typedef CUresult (*alloc_v1_fn)(unsigned int*, unsigned int);
typedef CUresult (*async_fn)(CUdeviceptr*, size_t, CUstream);

#define MiB (1024ull * 1024ull)
#define CK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "%s: %d\n", #x, (int)r_); exit(1); } } while (0)

__attribute__((noinline)) void direct_alloc(void) {
    CUdeviceptr p;
    CK(cuMemAlloc_v2(&p, 1 * MiB));
}

__attribute__((noinline)) void via_gpa_ptsz(gpa_v2_fn gpa) {
    async_fn f = NULL;
    CUdriverProcAddressQueryResult st;
    CK(gpa("cuMemAllocAsync", (void**)&f, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
    CUdeviceptr p;
    CK(f(&p, 2 * MiB, 0));
}

__attribute__((noinline)) void via_self_lookup(gpa_v2_fn gpa) {
    gpa_v1_fn v1 = NULL;
    CUdriverProcAddressQueryResult st;
    CK(gpa("cuGetProcAddress", (void**)&v1, 11030, 0, &st));
    alloc_v2_fn alloc = NULL;
    CK(v1("cuMemAlloc", (void**)&alloc, 11030, 0));
    CUdeviceptr p;
    CK(alloc(&p, 3 * MiB));
}

int main(void) {
    CK(cuInit(0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CK(cuCtxSetCurrent(ctx));
    direct_alloc();

    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    gpa_v2_fn gpa = (gpa_v2_fn)dlsym(h, "cuGetProcAddress_v2");
    printf("dlsym cuGetProcAddress_v2: %s\n", gpa ? "found" : "missing");

    // An old ABI must stay the old ABI: the 32-bit cuMemAlloc is not ours to wrap.
    alloc_v1_fn old = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult r = gpa("cuMemAlloc", (void**)&old, 2000, 0, &st);
    unsigned int p32;
    printf("cuMemAlloc@2000: rc=%d status=%d call=%d\n", (int)r, (int)st, old ? (int)old(&p32, 16) : -1);
    // Lookups that fail must fail the same way, with a NULL pointer.
    void* none = (void*)1;
    r = gpa("cuNoSuchFunction", &none, 12000, 0, &st);
    printf("cuNoSuchFunction: rc=%d status=%d ptr=%s\n", (int)r, (int)st, none ? "set" : "null");
    none = (void*)1;
    r = gpa("cuMemCreate", &none, 9000, 0, &st);
    printf("cuMemCreate@9000: rc=%d status=%d ptr=%s\n", (int)r, (int)st, none ? "set" : "null");
    // dlsym misses keep their dlerror.
    void* miss = dlsym(h, "cuNoSuchFunction");
    const char* err = dlerror();
    printf("dlsym miss: %s, dlerror %s\n", miss ? "found" : "null", err ? "set" : "unset");
    // RTLD_DEFAULT finds a driver function by name (ours when preloaded: same behaviour).
    printf("RTLD_DEFAULT cuMemFree_v2: %s\n", dlsym(RTLD_DEFAULT, "cuMemFree_v2") ? "found" : "missing");

    via_gpa_ptsz(gpa);
    via_self_lookup(gpa);

    size_t free_b = 0, total_b = 0;
    CK(cuMemGetInfo_v2(&free_b, &total_b));
    printf("cuMemGetInfo: total %zu MiB\n", total_b / (size_t)MiB);
    return 0;
}
