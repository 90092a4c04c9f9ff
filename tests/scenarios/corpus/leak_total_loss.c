// Ground truth: LEAK at forward_layer(), onset step 0, 4 MiB per step.
// The "graph retained" bug (`total_loss += loss` without .item()): forward_layer() makes
// 4 x 4 MiB activations per step; 3 are freed by backward, the last one (the loss, whose
// graph is retained) is never freed. The leaking site also has transient allocations.
// Live at exit: steps x 4 MiB from forward_layer (240 MiB with 60 steps).
#include "corpus.h"

#define LAYERS 4

__attribute__((noinline)) void* forward_layer(Model* m, int last) {
    void* p;
    CHECK(cudaMalloc(&p, 4 * MiB));
    if (!last) m->acts[m->n_acts++] = p;  // freed by backward
    return p;                             // the last one is retained by total_loss
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        for (int l = 0; l < LAYERS; l++) forward_layer(&m, l == LAYERS - 1);
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("leak_total_loss: ok\n");
    return 0;
}
