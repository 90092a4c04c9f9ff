// Ground truth: CLEAN. One-off events: at step 20 alloc_checkpoint_buffer() allocates
// 256 MiB, kept until the end of main (then freed); at step 35 big_temporary() allocates
// 512 MiB between forward and backward and frees it in the same step.
// Peak stays under 1 GiB (986 MiB at step 35). Nothing is live at exit.
#include "corpus.h"

__attribute__((noinline)) void* alloc_checkpoint_buffer(void) {
    void* p;
    CHECK(cudaMalloc(&p, 256 * MiB));
    return p;
}

__attribute__((noinline)) void big_temporary(void) {
    void* p;
    CHECK(cudaMalloc(&p, 512 * MiB));
    CHECK(cudaFree(p));
}

int main(void) {
    Model m;
    model_init(&m);
    void* checkpoint = NULL;
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        forward(&m);
        if (s == 35) big_temporary();
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        if (s == 20) checkpoint = alloc_checkpoint_buffer();
        corpus_end_step(s);
    }
    if (checkpoint) CHECK(cudaFree(checkpoint));
    model_free(&m);
    printf("clean_oneoff: ok\n");
    return 0;
}
