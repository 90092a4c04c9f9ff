// Ground truth: LEAK at grow_buffer(), onset step 0, 1 MiB per step. One logical buffer (a KV
// cache, a history extended by concatenation) is re-allocated 1 MiB larger every step: the
// new buffer is allocated, the old one copied into it and freed. No single allocation
// survives the next step, yet the bytes grow_buffer() holds grow by 1 MiB every step.
// Live at exit: one buffer of steps MiB from grow_buffer (60 MiB with 60 steps).
#include "corpus.h"

static void* kv;
static size_t kv_bytes;

__attribute__((noinline)) void grow_buffer(size_t extra) {
    void* bigger;
    CHECK(cudaMalloc(&bigger, kv_bytes + extra));
    if (kv) {
        // (the copy: simcuda moves no data)
        CHECK(cudaFree(kv));
    }
    kv = bigger;
    kv_bytes += extra;
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        forward(&m);
        grow_buffer(1 * MiB);  // the old buffer is freed, the new one is 1 MiB larger
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("leak_realloc: ok\n");
    return 0;
}
