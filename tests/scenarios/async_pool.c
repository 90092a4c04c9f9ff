// Stream-ordered allocation: cudaMallocAsync/cudaFreeAsync, their per-thread-stream (_ptsz)
// twins, and cuMemAllocFromPoolAsync reached through the driver entry point with the
// per-thread flag. Live at exit: keep_async 2 x 3 MiB (cudaMallocAsync),
// keep_async_ptsz 1 x 5 MiB (cudaMallocAsync_ptsz), keep_from_pool 1 x 7 MiB.
#include "scenario.h"

typedef CUresult (*pool_alloc_fn)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);

__attribute__((noinline)) void keep_async(cudaStream_t s) {
    void* p;
    CHECK(cudaMallocAsync(&p, 3 * MiB, s));
    CHECK(cudaMallocAsync(&p, 3 * MiB, s));
}

__attribute__((noinline)) void keep_async_ptsz(void) {
    void* p;
    CHECK(cudaMallocAsync_ptsz(&p, 5 * MiB, 0));
}

__attribute__((noinline)) void churn(cudaStream_t s) {
    for (int i = 0; i < 50; i++) {
        void* p;
        CHECK(cudaMallocAsync(&p, 1 * MiB, s));
        CHECK(cudaFreeAsync(p, s));
        CHECK(cudaMallocAsync_ptsz(&p, 1 * MiB, 0));
        CHECK(cudaFreeAsync_ptsz(p, 0));
    }
}

__attribute__((noinline)) void keep_from_pool(void) {
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    pool_alloc_fn alloc = (pool_alloc_fn)driver_entry("cuMemAllocFromPoolAsync", cudaEnablePerThreadDefaultStream);
    CUdeviceptr p;
    CU_CHECK(alloc(&p, 7 * MiB, (CUmemoryPool)pool, 0));
}

int main(void) {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    keep_async(s);
    keep_async_ptsz();
    churn(s);
    keep_from_pool();
    CHECK(cudaStreamSynchronize(s));
    printf("async_pool: ok\n");
    return 0;
}
