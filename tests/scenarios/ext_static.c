// A CUDA extension built the way nvcc builds with its default static runtime: it never links
// libcudart or libcuda; it dlopens the driver and resolves everything through
// cuGetProcAddress_v2, so symbol interposition alone never sees its allocations.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#define SIMCUDA_NO_V2_MACROS
#include <cuda.h>

typedef CUresult (*gpa_v2_fn)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*ctx_retain_fn)(CUcontext*, CUdevice);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr*, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static alloc_fn mem_alloc;
static free_fn mem_free;

static void* resolve(gpa_v2_fn gpa, const char* name) {
    void* fn = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || !fn) {
        fprintf(stderr, "ext_static: cannot resolve %s\n", name);
        exit(93);
    }
    return fn;
}

static void ext_init(void) {
    if (mem_alloc) return;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "ext_static: %s\n", dlerror());
        exit(94);
    }
    gpa_v2_fn gpa = (gpa_v2_fn)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) exit(95);
    ((init_fn)resolve(gpa, "cuInit"))(0);
    CUcontext ctx;
    ((ctx_retain_fn)resolve(gpa, "cuDevicePrimaryCtxRetain"))(&ctx, 0);
    ((ctx_set_fn)resolve(gpa, "cuCtxSetCurrent"))(ctx);
    mem_alloc = (alloc_fn)resolve(gpa, "cuMemAlloc");
    mem_free = (free_fn)resolve(gpa, "cuMemFree");
}

// The leak lives here: the report must name this function.
__attribute__((noinline)) CUdeviceptr ext_leaky_alloc(size_t bytes) {
    ext_init();
    CUdeviceptr p = 0;
    if (mem_alloc(&p, bytes) != CUDA_SUCCESS) exit(96);
    return p;
}

__attribute__((noinline)) void ext_scratch(size_t bytes) {
    ext_init();
    CUdeviceptr p = 0;
    if (mem_alloc(&p, bytes) != CUDA_SUCCESS) exit(97);
    mem_free(p);
}
