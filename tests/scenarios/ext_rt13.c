// An extension built against a different CUDA runtime (libcudart.so.13) than the program's
// (libcudart.so.12), loaded RTLD_LOCAL: both runtimes are in the process, as with torch built
// for CUDA 13 next to another wheel built for CUDA 12. Its calls must reach its own runtime.
#include "scenario.h"

__attribute__((noinline)) void* rt13_alloc(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

// A failing cudaMalloc sets the sticky error of the runtime that served it: the extension's
// own runtime reports it only if the call reached that runtime.
int rt13_oom_last_error(void) {
    void* p;
    cudaMalloc(&p, (size_t)1 << 50);
    return (int)cudaGetLastError();
}
