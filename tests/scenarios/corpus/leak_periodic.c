// Ground truth: LEAK at cache_eval_output(), onset step 0, 4 MiB every 3rd step
// (steps 0, 3, 6, ...; 4/3 MiB per step on average).
// Live at exit: ceil(steps / 3) x 4 MiB from cache_eval_output (80 MiB with 60 steps).
#include "corpus.h"

__attribute__((noinline)) void* cache_eval_output(void) {
    void* p;
    CHECK(cudaMalloc(&p, 4 * MiB));
    return p;
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        train_step(&m, s);
        if (s % 3 == 0) cache_eval_output();  // never freed
        corpus_end_step(s);
    }
    model_free(&m);
    printf("leak_periodic: ok\n");
    return 0;
}
