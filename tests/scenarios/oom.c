// Runs out of memory for real (run with SIMCUDA_MEMORY=1GiB): holds 600 MiB, then asks for
// 768 MiB more, which fails; then a smaller request that fits.
#include "scenario.h"

__attribute__((noinline)) void hold(void** p) { CHECK(cudaMalloc(p, 600 * MiB)); }

__attribute__((noinline)) cudaError_t too_big(void** p) { return cudaMalloc(p, 768 * MiB); }

int main(void) {
    void *held, *big, *small;
    hold(&held);
    cudaError_t err = too_big(&big);
    printf("oom: %s\n", err == cudaErrorMemoryAllocation ? "out of memory as expected" : "unexpected");
    cudaGetLastError();
    CHECK(cudaMalloc(&small, 100 * MiB));
    CHECK(cudaFree(small));
    CHECK(cudaFree(held));
    return err == cudaErrorMemoryAllocation ? 0 : 1;
}
