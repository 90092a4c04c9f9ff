// Ground truth: CLEAN. Every 10th step (0, 10, 20, ...) evaluate() allocates 6 x 4 MiB
// (no backward) after the training step and frees them all before the step ends.
// Nothing is live at exit.
#include "corpus.h"

#define EVAL_ACTS 6

__attribute__((noinline)) void evaluate(void) {
    void* outs[EVAL_ACTS];
    for (int i = 0; i < EVAL_ACTS; i++) CHECK(cudaMalloc(&outs[i], 4 * MiB));
    for (int i = 0; i < EVAL_ACTS; i++) CHECK(cudaFree(outs[i]));
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        train_step(&m, s);
        if (s % 10 == 0) evaluate();
        corpus_end_step(s);
    }
    model_free(&m);
    printf("clean_eval: ok\n");
    return 0;
}
