// Ground truth: CLEAN. Warm-up: during steps 0..4 autotune_workspace() tries 3 candidate
// workspaces (try_candidate: 8, 16, 32 MiB, each allocated and freed) and keeps one
// persistent 4 MiB workspace per step (5 in all, 20 MiB), freed at the end of main.
// From step 5 on nothing new is kept. Nothing is live at exit.
#include "corpus.h"

#define WARMUP_STEPS 5

__attribute__((noinline)) void try_candidate(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    CHECK(cudaFree(p));
}

__attribute__((noinline)) void* autotune_workspace(void) {
    for (int c = 0; c < 3; c++) try_candidate((8 * MiB) << c);
    void* ws;
    CHECK(cudaMalloc(&ws, 4 * MiB));
    return ws;
}

int main(void) {
    Model m;
    model_init(&m);
    void* workspaces[WARMUP_STEPS] = {0};
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        if (s < WARMUP_STEPS) workspaces[s] = autotune_workspace();
        forward(&m);
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    for (int i = 0; i < WARMUP_STEPS; i++)
        if (workspaces[i]) CHECK(cudaFree(workspaces[i]));
    model_free(&m);
    printf("clean_warmup: ok\n");
    return 0;
}
