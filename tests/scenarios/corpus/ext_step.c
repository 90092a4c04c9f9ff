// libcorpus_ext_step.so / libcorpus_ext_step_static.so: a CUDA extension called once per step
// (ext_step_main.c), built twice:
//   - default: linked against libcudart, allocating with cudaMalloc (the dynamic runtime);
//   - EXT_STATIC_RUNTIME: the way nvcc builds with its default static runtime. It never links
//     libcudart or libcuda: it dlopens the driver and resolves cuMemAlloc/cuMemFree through
//     cuGetProcAddress_v2 (as tests/scenarios/ext_static.c does).
// ext_step_keep(): one 2 MiB allocation per call, kept (the leak).
// ext_step_scratch(): one 2 MiB allocation per call, freed before it returns (clean).
#ifdef EXT_STATIC_RUNTIME
#include <dlfcn.h>
#include <stdint.h>
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
        fprintf(stderr, "ext_step: cannot resolve %s\n", name);
        exit(93);
    }
    return fn;
}

static void ext_init(void) {
    if (mem_alloc) return;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) exit(94);
    gpa_v2_fn gpa = (gpa_v2_fn)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) exit(95);
    ((init_fn)resolve(gpa, "cuInit"))(0);
    CUcontext ctx;
    ((ctx_retain_fn)resolve(gpa, "cuDevicePrimaryCtxRetain"))(&ctx, 0);
    ((ctx_set_fn)resolve(gpa, "cuCtxSetCurrent"))(ctx);
    mem_alloc = (alloc_fn)resolve(gpa, "cuMemAlloc");
    mem_free = (free_fn)resolve(gpa, "cuMemFree");
}

// Macros, not functions: the allocating function must be the innermost frame, and an
// inlined helper would still be named as one.
#define EXT_ALLOC(p, bytes)                                                        \
    do {                                                                           \
        ext_init();                                                                \
        CUdeviceptr d_ = 0;                                                        \
        if (mem_alloc(&d_, (bytes)) != CUDA_SUCCESS) exit(96);                     \
        (p) = (void*)(uintptr_t)d_;                                                \
    } while (0)
#define EXT_FREE(p)                                                                \
    do {                                                                           \
        if (mem_free((CUdeviceptr)(uintptr_t)(p)) != CUDA_SUCCESS) exit(97);       \
    } while (0)
#else
#include "scenario.h"

#define EXT_ALLOC(p, bytes) CHECK(cudaMalloc(&(p), (bytes)))
#define EXT_FREE(p) CHECK(cudaFree(p))
#endif

#define EXT_BYTES (2u << 20)

__attribute__((noinline)) void* ext_step_keep(void) {
    void* p;
    EXT_ALLOC(p, EXT_BYTES);
    return p;
}

__attribute__((noinline)) void ext_step_scratch(void) {
    void* p;
    EXT_ALLOC(p, EXT_BYTES);
    EXT_FREE(p);
}
