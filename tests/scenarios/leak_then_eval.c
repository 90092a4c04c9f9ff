// A training loop that leaks, then evaluates: the demo's story, for `oomtrace diff` to judge a
// fix (run with SIMCUDA_MEMORY=1GiB).
//
//   leak_then_eval [LEAK_MIB [EVAL_MIB [KILLED_AT]]]   (defaults 2 and 768, never killed)
//
// The corpus model (64 MiB of weights, 128 MiB of Adam state from step 1; about 290 MiB at a
// step's peak) runs CORPUS_STEPS steps (60), keeping LEAK_MIB a step at keep_history() (0: the
// leak fixed); with KILLED_AT it kills itself (SIGKILL: a crash) after that many steps. Then
// evaluate() asks for EVAL_MIB at once and frees it.
//   2 768   the leak (120 MiB) leaves too little room: the evaluation runs out of memory,
//           reported, and the program exits 0 (the demo's BEFORE)
//   0 768   the fix: the evaluation fits, and the device's peak is higher (about 960 MiB)
//   2 768 30  a crash after 30 steps: it stopped early, before its peak
//   0 512   the same work with a smaller evaluation buffer (peak about 704 MiB)
#include "corpus/corpus.h"

#include <signal.h>

__attribute__((noinline)) void* keep_history(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

__attribute__((noinline)) cudaError_t evaluate(void** buffer, size_t bytes) {
    return cudaMalloc(buffer, bytes);
}

int main(int argc, char** argv) {
    size_t leak = (argc > 1 ? strtoull(argv[1], NULL, 10) : 2) * MiB;
    size_t eval_bytes = (argc > 2 ? strtoull(argv[2], NULL, 10) : 768) * MiB;
    int killed_at = argc > 3 ? atoi(argv[3]) : -1;
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        forward(&m);
        if (leak) keep_history(leak);  // never freed
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
        if (s + 1 == killed_at) {
            // A crash while the step computes: by then the tracer has sent what it had.
            struct timespec pause = {1, 0};
            nanosleep(&pause, NULL);
            raise(SIGKILL);
        }
    }
    void* eval;
    cudaError_t err = evaluate(&eval, eval_bytes);
    if (err == cudaSuccess) {
        printf("leak_then_eval: evaluation buffer allocated\n");
        CHECK(cudaFree(eval));
    } else {
        cudaGetLastError();
        printf("leak_then_eval: evaluation buffer: %s\n", cudaGetErrorString(err));
    }
    model_free(&m);
    return 0;
}
