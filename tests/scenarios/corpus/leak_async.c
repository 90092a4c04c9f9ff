// Ground truth: LEAK at async_leak(), onset step 0, 1 MiB per step (stream-ordered).
// Activations are cudaMallocAsync/cudaFreeAsync on one stream, synchronized at the end of
// each step; async_leak() cudaMallocAsync's 1 MiB on the same stream every step, never freed.
// Live at exit: steps x 1 MiB from async_leak (60 MiB with 60 steps).
#include "corpus.h"

__attribute__((noinline)) void* async_leak(cudaStream_t stream) {
    void* p;
    CHECK(cudaMallocAsync(&p, 1 * MiB, stream));
    return p;
}

int main(void) {
    Model m;
    model_init(&m);
    m.async = 1;
    CHECK(cudaStreamCreate(&m.stream));
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        forward(&m);
        async_leak(m.stream);  // never freed
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        CHECK(cudaStreamSynchronize(m.stream));
        corpus_end_step(s);
    }
    model_free(&m);
    printf("leak_async: ok\n");
    return 0;
}
