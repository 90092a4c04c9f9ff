// Ground truth: LEAK at history_append(), onset step 0, 2 MiB per step (every step).
// Like `history.append(output)`: one 2 MiB copy of the output is kept every step.
// Live at exit: steps x 2 MiB from history_append (120 MiB with the default 60 steps).
#include "corpus.h"

__attribute__((noinline)) void* history_append(void) {
    void* p;
    CHECK(cudaMalloc(&p, 2 * MiB));
    return p;
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        forward(&m);
        history_append();  // never freed
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("leak_history: ok\n");
    return 0;
}
