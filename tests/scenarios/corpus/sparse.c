// Ground truth (built twice, tests/build.rs):
//   leak_sparse  (-DLEAK): LEAK at stash_sample(), onset step 0, 2 MiB every step, never freed.
//   clean_sparse:          CLEAN: stash_sample() keeps only the latest sample (frees the
//                          previous one).
// A sparse stream, as a caching allocator makes one: each step is 20 ms of "compute" (a
// sleep) and one or two allocations: the 2 MiB sample, and on about one step in four
// (fixed-seed xorshift) a 4 MiB refresh_buffer() freed at once. No call site allocates at a
// regular gap in allocation events, and 60 steps are a few hundred allocations at most:
// fixed allocation-count windows would never close.
// Live at exit: leak_sparse steps x 2 MiB (120 MiB with 60 steps); clean_sparse 0.
#include <time.h>
#include "corpus.h"

__attribute__((noinline)) void* stash_sample(void) {
    void* p;
    CHECK(cudaMalloc(&p, 2 * MiB));
    return p;
}

__attribute__((noinline)) void refresh_buffer(void) {
    void* p;
    CHECK(cudaMalloc(&p, 4 * MiB));
    corpus_free(p);
}

int main(void) {
    int steps = corpus_steps();
    void* kept = NULL;
    for (int s = 0; s < steps; s++) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (corpus_rand() % 4 == 0) refresh_buffer();
        void* p = stash_sample();
#ifdef LEAK
        (void)p;  // never freed
        (void)kept;
#else
        if (kept) corpus_free(kept);
        kept = p;
#endif
        corpus_end_step(s);
    }
    if (kept) corpus_free(kept);
    printf("sparse: ok\n");
    return 0;
}
