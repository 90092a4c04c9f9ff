// An extension linked against the dynamic runtime (as torch.utils.cpp_extension builds them):
// libcudart is its own NEEDED dependency. Loaded RTLD_LOCAL by a program that does not link
// CUDA, that libcudart is invisible to RTLD_NEXT from the preloaded shim.
// Its constructor allocates: hooks run inside dlopen, under the loader lock, before main
// of this library's user regains control.
#include "scenario.h"

static void* from_ctor;

__attribute__((noinline)) static void ctor_alloc(void) { CHECK(cudaMalloc(&from_ctor, 1 * MiB)); }

__attribute__((constructor)) static void init(void) { ctor_alloc(); }

__attribute__((noinline)) void* dyn_ext_alloc(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

// The runtime's own resolver, without a version: PyTorch < 2.x and many extensions use it.
__attribute__((noinline)) void dyn_ext_driver_alloc(size_t bytes) {
    CUresult (*alloc)(CUdeviceptr*, size_t) = NULL;
    cudaDriverEntryPointQueryResult st;
    CHECK(cudaGetDriverEntryPoint("cuMemAlloc", (void**)&alloc, cudaEnableDefault, &st));
    CUdeviceptr p;
    CU_CHECK(alloc(&p, bytes));
}
