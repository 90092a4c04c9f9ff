// Ground truth: CLEAN. Dynamic shapes: every step makes the same NUMBER of activations
// (N_ACTS), each of a random size between 1 and 8 MiB (256 KiB granules, fixed-seed
// xorshift), all freed every step. Live bytes at the trough are constant.
// Nothing is live at exit.
#include "corpus.h"

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        for (int i = 0; i < N_ACTS; i++)
            alloc_activation(&m, 1 * MiB + (corpus_rand() % 29) * (256 * 1024));  // 1..8 MiB
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("clean_dynamic: ok\n");
    return 0;
}
