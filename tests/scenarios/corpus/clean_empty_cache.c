// Ground truth: CLEAN. Heavy churn: besides the skeleton's activations (cudaMalloc +
// cudaFree), every step reserve_segment() allocates and frees a 64 MiB "segment" twice
// (like calling torch.cuda.empty_cache() in the loop). Nothing is retained; nothing is
// live at exit.
#include "corpus.h"

__attribute__((noinline)) void reserve_segment(void) {
    void* seg;
    CHECK(cudaMalloc(&seg, 64 * MiB));
    CHECK(cudaFree(seg));  // empty_cache(): the segment goes back to the driver at once
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        reserve_segment();
        forward(&m);
        backward(&m);
        reserve_segment();
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("clean_empty_cache: ok\n");
    return 0;
}
