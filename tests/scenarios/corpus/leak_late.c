// Ground truth: LEAK at retain_after_switch(), onset step 30, 2 MiB per step from step 30 on.
// Clean for 30 steps (e.g. a schedule switches a feature on), then 2 MiB kept every step.
// Live at exit: (steps - 30) x 2 MiB from retain_after_switch (60 MiB with 60 steps).
#include "corpus.h"

#define SWITCH_STEP 30

__attribute__((noinline)) void* retain_after_switch(void) {
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
        if (s >= SWITCH_STEP) retain_after_switch();  // never freed
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("leak_late: ok\n");
    return 0;
}
