// Ground truth: CLEAN. The pool of leak_pool (pool.h), with each step's 2 MiB output freed
// at the end of the step: the pool never outgrows its 32 MiB reservation. oomtrace sees one
// cudaMalloc (the reservation) and, at exit, its cudaFree: nothing per step.
// Nothing is live at exit.
#include "pool.h"

__attribute__((noinline)) void* step_output(void) { return pool_alloc(2 * MiB); }

int main(void) {
    pool_reserve();
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        pool_step();
        corpus_compute();
        pool_free(step_output());
        corpus_end_step(s);
    }
    int chunks = pool_chunks;
    pool_destroy();
    printf("clean_pool: ok (%d chunks)\n", chunks);
    return chunks == 1 ? 0 : 97;
}
