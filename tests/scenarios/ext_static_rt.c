// An extension with the CUDA runtime linked in statically (nvcc's default `-cudart static`,
// or CuPy's private runtime): its own `cudaMalloc` and hashed `libcudart_static_<hash>`
// internals are hidden functions of this object, so nothing outside sees them; they reach the
// driver through cuGetProcAddress. `scratch_forward` is the extension's own code, and it keeps
// one 1 MiB buffer per call: the report must name it, not the runtime inside it.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#define SIMCUDA_NO_V2_MACROS
#include <cuda.h>

#define HIDDEN __attribute__((visibility("hidden"), noinline))

typedef CUresult (*gpa_v2_fn)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*ctx_retain_fn)(CUcontext*, CUdevice);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr*, size_t);

static alloc_fn mem_alloc;

static void* resolve(gpa_v2_fn gpa, const char* name) {
    void* fn = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || !fn) {
        fprintf(stderr, "ext_static_rt: cannot resolve %s\n", name);
        exit(93);
    }
    return fn;
}

// What the static runtime's lazy initialisation does: load the driver, make a context.
HIDDEN void libcudart_static_6a1f0c2b9e4d7a35(void) {
    if (mem_alloc) return;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "ext_static_rt: %s\n", dlerror());
        exit(94);
    }
    gpa_v2_fn gpa = (gpa_v2_fn)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) exit(95);
    ((init_fn)resolve(gpa, "cuInit"))(0);
    CUcontext ctx;
    ((ctx_retain_fn)resolve(gpa, "cuDevicePrimaryCtxRetain"))(&ctx, 0);
    ((ctx_set_fn)resolve(gpa, "cuCtxSetCurrent"))(ctx);
    mem_alloc = (alloc_fn)resolve(gpa, "cuMemAlloc");
}

// The runtime's allocation path, a hashed internal under the API entry point.
HIDDEN int libcudart_static_93d2e8b04c1f6e77(void** ptr, size_t bytes) {
    libcudart_static_6a1f0c2b9e4d7a35();
    CUdeviceptr p = 0;
    CUresult rc = mem_alloc(&p, bytes);
    *ptr = (void*)p;
    return rc == CUDA_SUCCESS ? 0 : 2;
}

// The runtime's own `cudaMalloc`, hidden in this object.
HIDDEN int cudaMalloc(void** ptr, size_t bytes) {
    return libcudart_static_93d2e8b04c1f6e77(ptr, bytes);
}

static void* kept[4096];
static int nkept;

// The extension's own code: the culprit.
__attribute__((noinline)) void scratch_forward(size_t bytes) {
    void* p = NULL;
    if (cudaMalloc(&p, bytes) != 0) exit(96);
    if (nkept < 4096) kept[nkept++] = p;
}
