// Soak workload: argv[1] seconds at argv[2] cudaMalloc+cudaFree pairs per second, keeping a
// ring of 4096 live allocations (each new one frees the oldest), so the live set is constant
// and only the event count grows. A step marker every 10000 pairs. Paced by the clock.
#include <time.h>
#include "scenario.h"

#define RING 4096

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) static void* soak_alloc(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

int main(int argc, char** argv) {
    double secs = argc > 1 ? atof(argv[1]) : 10.0;
    double rate = argc > 2 ? atof(argv[2]) : 100000.0;
    static void* ring[RING];
    double start = now_s();
    long pairs = 0;
    for (;;) {
        for (int i = 0; i < 1000; i++, pairs++) {
            int slot = pairs % RING;
            if (ring[slot]) CHECK(cudaFree(ring[slot]));
            ring[slot] = soak_alloc(4096 * (1 + pairs % 64));
            if (pairs % 10000 == 0) step_mark("step");
        }
        double elapsed = now_s() - start;
        if (elapsed >= secs) break;
        double ahead = pairs / rate - elapsed;
        if (ahead > 0) {
            struct timespec pause = {(time_t)ahead, (long)((ahead - (time_t)ahead) * 1e9)};
            nanosleep(&pause, NULL);
        }
    }
    for (int i = 0; i < RING; i++)
        if (ring[i]) CHECK(cudaFree(ring[i]));
    printf("soak: %ld pairs in %.1f s (%.0f events/s)\n", pairs, now_s() - start,
           2.0 * pairs / (now_s() - start));
    return 0;
}
