// Ground truth (built three times, tests/build.rs): one allocation per step, nothing else.
//   leak_one_per_step         (-DLEAK):          LEAK at keep_buffer(), onset 0, 2 MiB of device
//                                                memory every step (cudaMalloc), never freed.
//   leak_one_per_step_pinned  (-DLEAK -DPINNED): the same with pinned host memory
//                                                (cudaHostAlloc).
//   clean_one_per_step:                          CLEAN: keep_buffer() allocates 2 MiB and frees
//                                                the previous step's buffer.
// A step is one allocation plus 5 ms of "compute" (a sleep): the allocation stream has
// period 1, so only its pace in time tells a step from a tight loop.
// Live at exit: LEAK variants steps x 2 MiB (120 MiB with 60 steps); clean 0.
#include <time.h>
#include "corpus.h"

__attribute__((noinline)) void* keep_buffer(void) {
    void* p;
#ifdef PINNED
    CHECK(cudaHostAlloc(&p, 2 * MiB, 0));
#else
    CHECK(cudaMalloc(&p, 2 * MiB));
#endif
    return p;
}

static void release(void* p) {
#ifdef PINNED
    CHECK(cudaFreeHost(p));
#else
    corpus_free(p);
#endif
}

static void compute(void) {
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

int main(void) {
    int steps = corpus_steps();
    void* kept = NULL;
    for (int s = 0; s < steps; s++) {
        compute();
        void* p = keep_buffer();
#ifdef LEAK
        (void)p;  // never freed
#else
        if (kept) release(kept);
        kept = p;
#endif
        corpus_end_step(s);
    }
    if (kept) release(kept);
    (void)release;
    printf("one_per_step: ok\n");
    return 0;
}
