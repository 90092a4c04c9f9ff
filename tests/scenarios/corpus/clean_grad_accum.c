// Ground truth: CLEAN. Gradient accumulation x4: per step, 4 micro-steps of
// load_batch + forward + backward; gradients are allocated in the first micro-step and
// accumulated (kept) until optimizer_step, then zero_grad frees them. The marker comes
// only after the optimizer step. clip_grad_norm is the once-per-step allocation.
// Nothing is live at exit.
#include "corpus.h"

#define MICRO_STEPS 4

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        for (int micro = 0; micro < MICRO_STEPS; micro++) {
            load_batch(&m);
            forward(&m);
            backward(&m);  // allocates gradients only when there are none
        }
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("clean_grad_accum: ok\n");
    return 0;
}
