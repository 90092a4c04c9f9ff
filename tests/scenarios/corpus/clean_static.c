// Ground truth: CLEAN. Only the skeleton: a constant sawtooth per step, plus the Adam state
// (alloc_adam_state, 16 x 8 MiB = 128 MiB) created once at step 1 and kept: a one-off step,
// not a leak. Nothing is live at exit.
#include "corpus.h"

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        train_step(&m, s);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("clean_static: ok\n");
    return 0;
}
