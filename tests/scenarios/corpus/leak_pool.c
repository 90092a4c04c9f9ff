// Ground truth: LEAK at pool_grow(), onset step 10, 2 MiB per step on average. A pool-only
// framework (pool.h: a 32 MiB reservation sub-allocated in 1 MiB units, grown by 4 MiB
// chunks): each step's 3 x 4 MiB activations come from the pool and go back to it, and one
// 2 MiB output is sub-allocated and kept (`outputs.append(y)`). The reservation is full
// after step 9 (12 MiB of activations + 10 x 2 MiB kept); from step 10 on the pool grows by a
// 4 MiB chunk every second step. oomtrace sees only the reservation and the chunks: the kept
// sub-allocations are invisible, the pool's growth at pool_grow() is the leak.
// Every allocation CUDA sees is pool_grow's: without markers the stream has no per-step
// allocation to find the period by.
// Live at exit: the reservation (32 MiB) and the chunks (25 x 4 MiB with 60 steps).
#include "pool.h"

__attribute__((noinline)) void* keep_output(void) { return pool_alloc(2 * MiB); }

int main(void) {
    pool_reserve();
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        pool_step();
        corpus_compute();
        keep_output();  // never freed
        corpus_end_step(s);
    }
    printf("leak_pool: ok (%d chunks)\n", pool_chunks);
    return 0;
}
