// A loop that keeps one raw cudaMalloc buffer per step in an array, then (unless told not to)
// frees every one of them: for the words of the final report (memory that grew step after
// step and was all freed) and for `oomtrace diff` (the run that keeps them at exit against
// the run that frees them).
//
//   keep_buffers [FREE [MIB [STEPS [AFTER]]]]   (defaults 1, 78, 50, 0)
//
// STEPS steps each keep MIB at keep_buffer() (50 x 78 MiB: 3.81 GiB by the last step) and end
// with a step marker (none with KEEP_MARKERS=0: the epoch clock then finds the steps by the
// pace of keep_buffer's allocations). A keep_buffer that runs out of memory (a small
// SIMCUDA_MEMORY) is reported and ends the loop, as a program that fills the device until it
// is full. FREE 1: after the loop, free_buffers() frees them all; then AFTER more steps (a step
// marker each, nothing kept) run before the program exits 0. FREE 0: they are still live at
// exit. Each step computes 2 ms (a sleep), as a real step takes time.
#include "scenario.h"

#include <time.h>

#define MAX_STEPS 1000

static void* kept[MAX_STEPS];

__attribute__((noinline)) cudaError_t keep_buffer(void** p, size_t bytes) {
    return cudaMalloc(p, bytes);
}

__attribute__((noinline)) void free_buffers(int n) {
    for (int i = 0; i < n; i++) CHECK(cudaFree(kept[i]));
}

static void end_step(void) {
    const char* v = getenv("KEEP_MARKERS");
    if (!(v && v[0] == '0')) step_mark("step");
}

static void compute(void) {
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

int main(int argc, char** argv) {
    int free_them = argc > 1 ? atoi(argv[1]) : 1;
    size_t bytes = (argc > 2 ? strtoull(argv[2], NULL, 10) : 78) * MiB;
    int steps = argc > 3 ? atoi(argv[3]) : 50;
    int after = argc > 4 ? atoi(argv[4]) : 0;
    if (steps < 0 || steps > MAX_STEPS) return 2;
    int n = 0;
    for (; n < steps; n++) {
        cudaError_t err = keep_buffer(&kept[n], bytes);
        if (err != cudaSuccess) {
            cudaGetLastError();
            printf("keep_buffers: step %d: %s\n", n, cudaGetErrorString(err));
            break;
        }
        compute();
        end_step();
    }
    if (free_them) {
        free_buffers(n);
        for (int s = 0; s < after; s++) {
            compute();
            end_step();
        }
    }
    printf("keep_buffers: %d buffers %s\n", n, free_them ? "freed" : "kept");
    return 0;
}
