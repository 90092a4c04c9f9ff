// Pinned host memory through the runtime and the driver; reported apart from GPU memory.
// Live at exit (host): keep_pinned 2 MiB (cudaMallocHost) + 3 MiB (cudaHostAlloc).
// Device: one 1 MiB cudaMalloc, so the device entry exists too.
#include <string.h>
#include "scenario.h"

__attribute__((noinline)) void keep_pinned(void) {
    void *a, *b;
    CHECK(cudaMallocHost(&a, 2 * MiB));
    CHECK(cudaHostAlloc(&b, 3 * MiB, cudaHostAllocDefault));
    memset(a, 1, 2 * MiB);  // real host memory
    memset(b, 2, 3 * MiB);
}

int main(void) {
    keep_pinned();
    void* t;
    CHECK(cudaMallocHost(&t, 4 * MiB));
    CHECK(cudaFreeHost(t));
    void* d;
    CHECK(cudaMalloc(&d, 1 * MiB));
    printf("pinned_host: ok\n");
    return 0;
}
