// Ground truth (built twice, tests/build.rs):
//   leak_irregular  (-DLEAK): LEAK at keep_output(), onset step 0, 2 MiB every step.
//   clean_irregular:          CLEAN: keep_output() keeps only the latest output (frees the
//                             previous one), so live bytes at the trough are constant.
// An irregular iteration: each step makes 3 to 7 temporaries (make_temporary) of 1..8 MiB,
// a number and sizes drawn from a fixed-seed xorshift, then keeps one 2 MiB output, then frees
// the temporaries. No call site allocates at a regular gap in allocation events (keep_output's
// gap is 4 to 8): the epoch clock has to find the iteration by its structure.
// Live at exit: leak_irregular steps x 2 MiB (120 MiB with 60 steps); clean_irregular 0.
#include "corpus.h"

#define MAX_TEMPS 8

__attribute__((noinline)) void* make_temporary(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

__attribute__((noinline)) void* keep_output(void) {
    void* p;
    CHECK(cudaMalloc(&p, 2 * MiB));
    return p;
}

int main(void) {
    int steps = corpus_steps();
    void* kept = NULL;
    for (int s = 0; s < steps; s++) {
        void* temps[MAX_TEMPS];
        int n = 3 + (int)(corpus_rand() % 5);
        for (int i = 0; i < n; i++)
            temps[i] = make_temporary(1 * MiB + (corpus_rand() % 29) * (256 * 1024));
        void* out = keep_output();
#ifdef LEAK
        (void)kept;
        (void)out;  // never freed
#else
        if (kept) corpus_free(kept);
        kept = out;
#endif
        for (int i = 0; i < n; i++) corpus_free(temps[i]);
        corpus_end_step(s);
    }
    if (kept) corpus_free(kept);
#ifdef LEAK
    printf("leak_irregular: ok\n");
#else
    printf("clean_irregular: ok\n");
#endif
    return 0;
}
