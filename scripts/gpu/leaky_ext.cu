// A CUDA extension that leaks, for check (c) of scripts/gpu-check.sh.
//
// Built the way nvcc builds by default, with the CUDA runtime linked statically into the
// library:   nvcc -shared -Xcompiler -fPIC -g -o libleaky_ext.so leaky_ext.cu
// Its cudaMalloc is the copy inside this .so, which reaches the driver through
// cuGetProcAddress; an LD_PRELOAD of cudaMalloc alone never sees it. scripts/gpu/leaky_host.py
// loads it with ctypes (dlopen RTLD_LOCAL) and calls leaky_step() 30 times, one step each.
//
// leaky_step(): 4 MiB per call, never freed (the leak). scratch_step(): 1 MiB allocated and
// freed within the call (must not be reported).

#include <cuda_runtime.h>
#include <stdio.h>

#define CHECK(call)                                                                    \
    do {                                                                               \
        cudaError_t err_ = (call);                                                     \
        if (err_ != cudaSuccess) {                                                     \
            fprintf(stderr, "leaky_ext: %s: %s\n", #call, cudaGetErrorString(err_));  \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

static void *g_kept[4096];
static int g_nkept = 0;

extern "C" {

__attribute__((noinline, visibility("default"))) int leaky_init(void) {
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0));  // create the context
    return 0;
}

__attribute__((noinline, visibility("default"))) int leaky_step(void) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4u << 20));  // the leak: never freed
    CHECK(cudaMemset(p, 0, 4u << 20));
    if (g_nkept < 4096) g_kept[g_nkept++] = p;
    return 0;
}

__attribute__((noinline, visibility("default"))) int scratch_step(void) {
    void *p = NULL;
    CHECK(cudaMalloc(&p, 1u << 20));
    CHECK(cudaMemset(p, 0, 1u << 20));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(p));
    return 0;
}

__attribute__((noinline, visibility("default"))) int leaky_kept(void) { return g_nkept; }

}  // extern "C"
