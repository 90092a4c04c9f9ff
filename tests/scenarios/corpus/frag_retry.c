// Ground truth: FRAGMENTATION, not a leak. A PyTorch-like caching allocator on cudaMalloc:
// freed blocks go to a cache and are reused only for an equal-size request. Request sizes
// drift every step (batch 2 MiB + s x 64 KiB, 3 activations of 16 MiB + s x 256 KiB), so
// every step misses the cache and cudaMalloc's new blocks while the old ones stay cached:
// "reserved" grows ~50-100 MiB per step, "used" (live at the step trough: params + Adam
// state) stays constant. When cudaMalloc fails with cudaErrorMemoryAllocation,
// caching_alloc() clears the error, release_cached_blocks() cudaFree's every cached block
// (the empty-cache burst) and caching_alloc() retries the same cudaMalloc once.
// With SIMCUDA_MEMORY=1073741824 and 60 steps: 6 retries (at steps 13, 24, 34, 43, 51, 59);
// with the default 16 GiB: none. Gradients (8 x 8 MiB) go through the cache too and are
// reused every step; the skeleton's params, Adam state and clip_grad_norm use cudaMalloc.
// Exit: cached blocks, params and Adam state are freed; nothing is live at exit.
#include "corpus.h"

#define MAX_BLOCKS 1024
#define N_FRAG_ACTS 3

typedef struct { void* ptr; size_t size; int used; } Block;
static Block blocks[MAX_BLOCKS];
static int n_blocks, retries, current_step;

__attribute__((noinline)) void release_cached_blocks(void) {
    int kept = 0;
    for (int i = 0; i < n_blocks; i++) {
        if (blocks[i].used)
            blocks[kept++] = blocks[i];
        else
            CHECK(cudaFree(blocks[i].ptr));
    }
    n_blocks = kept;
}

__attribute__((noinline)) void* caching_alloc(size_t size) {
    for (int i = 0; i < n_blocks; i++)
        if (!blocks[i].used && blocks[i].size == size) {
            blocks[i].used = 1;
            return blocks[i].ptr;
        }
    if (n_blocks == MAX_BLOCKS) release_cached_blocks();
    void* p;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        release_cached_blocks();
        retries++;
        fprintf(stderr, "frag_retry: retry %d at step %d\n", retries, current_step);
        err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
        fprintf(stderr, "frag_retry: cudaMalloc(%zu) failed after retry: %s\n", size,
                cudaGetErrorString(err));
        exit(1);
    }
    blocks[n_blocks++] = (Block){p, size, 1};
    return p;
}

__attribute__((noinline)) void caching_free(void* p) {
    for (int i = 0; i < n_blocks; i++)
        if (blocks[i].ptr == p) blocks[i].used = 0;
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        current_step = s;
        void* batch = caching_alloc(2 * MiB + (size_t)s * 64 * 1024);
        void* acts[N_FRAG_ACTS];
        for (int i = 0; i < N_FRAG_ACTS; i++) acts[i] = caching_alloc(16 * MiB + (size_t)s * 256 * 1024);
        for (int i = 0; i < N_PARAMS; i++) m.grads[i] = caching_alloc(PARAM_BYTES);
        for (int i = 0; i < N_FRAG_ACTS; i++) caching_free(acts[i]);
        caching_free(batch);
        optimizer_step(&m, s);
        for (int i = 0; i < N_PARAMS; i++) caching_free(m.grads[i]);  // zero_grad
        corpus_end_step(s);
    }
    for (int i = 0; i < n_blocks; i++) blocks[i].used = 0;
    release_cached_blocks();
    model_free(&m);
    printf("frag_retry: ok (%d retries)\n", retries);
    return 0;
}
