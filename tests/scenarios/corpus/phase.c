// Ground truth (built twice, tests/build.rs): a train phase, then an eval phase with another
// allocation pattern (CORPUS_STEPS steps in all, the first TRAIN_STEPS = 25 of them train).
//   leak_phase  (-DLEAK): LEAK at keep_eval_output(), onset step 25: every eval step keeps its
//                         2 MiB output (a list of predictions kept on the GPU).
//   clean_phase:          CLEAN: the eval output is freed within its step.
// Train steps are corpus.h's train_step. An eval step: load_batch, 3 x 4 MiB activations
// (forward_n), 2 MiB output, then the activations and batch are freed (no gradients).
// The iteration the clock found in training stops at step 25; it must find the eval one.
// Live at exit: leak_phase (steps - 25) x 2 MiB (70 MiB with 60 steps); clean_phase 0.
#include "corpus.h"

#define TRAIN_STEPS 25

__attribute__((noinline)) void* keep_eval_output(void) {
    void* p;
    CHECK(cudaMalloc(&p, 2 * MiB));
    return p;
}

__attribute__((noinline)) void eval_step(Model* m) {
    load_batch(m);
    forward_n(m, 3, ACT_BYTES);
    void* out = keep_eval_output();
#ifdef LEAK
    (void)out;  // never freed
#else
    corpus_free(out);
#endif
    for (int i = 0; i < m->n_acts; i++) corpus_free(m->acts[i]);
    m->n_acts = 0;
    corpus_free(m->batch);
    m->batch = NULL;
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        if (s < TRAIN_STEPS)
            train_step(&m, s);
        else
            eval_step(&m);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("phase: ok\n");
    return 0;
}
