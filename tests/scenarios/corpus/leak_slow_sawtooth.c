// Ground truth: LEAK at stash_metric(), onset step 0, 1 MiB per step (every step).
// A small leak under a large sawtooth: forward allocates 32 x 16 MiB transient activations
// (512 MiB, all freed every step), while stash_metric() keeps 1 MiB per step.
// Live at exit: steps x 1 MiB from stash_metric (60 MiB with the default 60 steps).
#include "corpus.h"

__attribute__((noinline)) void* stash_metric(void) {
    void* p;
    CHECK(cudaMalloc(&p, 1 * MiB));
    return p;
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        forward_n(&m, 32, 16 * MiB);
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        stash_metric();  // never freed
        corpus_end_step(s);
    }
    model_free(&m);
    printf("leak_slow_sawtooth: ok\n");
    return 0;
}
