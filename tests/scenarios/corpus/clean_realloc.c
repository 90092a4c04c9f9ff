// Ground truth: CLEAN. Two buffers re-allocated every step (allocate the new one, copy, free
// the old one), neither growing without bound:
//   resize_buffer  1 MiB larger each step for steps 0..7 (a buffer sized to the longest
//                  input so far), then re-allocated at its final 8 MiB every step;
//   seq_buffer     sized to the step's sequence length, cycling 1..8 MiB (step % 8 + 1).
// Both are freed at the end of main; nothing is live at exit.
#include "corpus.h"

#define RESIZE_STEPS 8

__attribute__((noinline)) void* realloc_copy(void* old, size_t old_bytes, size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    if (old) {
        // (the copy: simcuda moves no data)
        CHECK(cudaFree(old));
    }
    return p;
}

static void* resize_buf;
static size_t resize_bytes;
static void* seq_buf;
static size_t seq_bytes;

__attribute__((noinline)) void resize_buffer(int step) {
    size_t bytes = (size_t)((step < RESIZE_STEPS ? step : RESIZE_STEPS - 1) + 1) * MiB;
    resize_buf = realloc_copy(resize_buf, resize_bytes, bytes);
    resize_bytes = bytes;
}

__attribute__((noinline)) void seq_buffer(int step) {
    size_t bytes = (size_t)(step % 8 + 1) * MiB;
    seq_buf = realloc_copy(seq_buf, seq_bytes, bytes);
    seq_bytes = bytes;
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        forward(&m);
        resize_buffer(s);
        seq_buffer(s);
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    CHECK(cudaFree(resize_buf));
    CHECK(cudaFree(seq_buf));
    model_free(&m);
    printf("clean_realloc: ok\n");
    return 0;
}
