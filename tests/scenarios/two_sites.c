// Throughput workload: argv[1] events (cudaMalloc and cudaFree alike, default 5*10^6) from a
// loop that allocates and frees at two call sites in turn, built with -O2 and no frame
// pointers. Prints "seconds <wall> cpu <this thread's CPU seconds> events <n>": the program's
// own time, beside which `oomtrace run`'s whole wall time gives the end-to-end rate.
#include <time.h>
#include "scenario.h"

static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) static void site_a(void) {
    void* p;
    CHECK(cudaMalloc(&p, 4096));
    CHECK(cudaFree(p));
}

__attribute__((noinline)) static void site_b(void) {
    void* p;
    CHECK(cudaMalloc(&p, 65536));
    CHECK(cudaFree(p));
}

int main(int argc, char** argv) {
    long events = argc > 1 ? atol(argv[1]) : 5000000;
    CHECK(cudaFree(NULL));
    double wall = clock_s(CLOCK_MONOTONIC), cpu = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < events / 4; i++) {
        site_a();
        site_b();
    }
    printf("seconds %.3f cpu %.3f events %ld\n", clock_s(CLOCK_MONOTONIC) - wall,
           clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu, events / 4 * 4);
    return 0;
}
