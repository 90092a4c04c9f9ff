// Benchmark workload: N cudaMalloc+cudaFree pairs issued from the bottom of a 30-deep call
// chain, built with -O2 -fomit-frame-pointer (so a frame-pointer walk would see 2 frames and
// only DWARF unwinding recovers the chain). Prints one line: "ns_per_pair <median of 3>".
#include <time.h>
#include "scenario.h"

static long pairs_per_round = 1000000;
static volatile long sink;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

__attribute__((noinline)) static double bottom(void) {
    double t0 = now_ns();
    for (long i = 0; i < pairs_per_round; i++) {
        void* p;
        cudaMalloc(&p, 4096);
        cudaFree(p);
    }
    return (now_ns() - t0) / pairs_per_round;
}

// level_k calls level_{k-1}; the volatile store after the call prevents tail calls.
#define LEVEL(k, next)                                           \
    __attribute__((noinline)) static double level_##k(void) {    \
        double r = next();                                        \
        sink = sink + 1;                                          \
        return r;                                                 \
    }
LEVEL(1, bottom) LEVEL(2, level_1) LEVEL(3, level_2) LEVEL(4, level_3) LEVEL(5, level_4)
LEVEL(6, level_5) LEVEL(7, level_6) LEVEL(8, level_7) LEVEL(9, level_8) LEVEL(10, level_9)
LEVEL(11, level_10) LEVEL(12, level_11) LEVEL(13, level_12) LEVEL(14, level_13) LEVEL(15, level_14)
LEVEL(16, level_15) LEVEL(17, level_16) LEVEL(18, level_17) LEVEL(19, level_18) LEVEL(20, level_19)
LEVEL(21, level_20) LEVEL(22, level_21) LEVEL(23, level_22) LEVEL(24, level_23) LEVEL(25, level_24)
LEVEL(26, level_25) LEVEL(27, level_26) LEVEL(28, level_27)

static int cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

int main(int argc, char** argv) {
    if (argc > 1) pairs_per_round = atol(argv[1]);
    CHECK(cudaFree(NULL));
    long saved = pairs_per_round;
    pairs_per_round = 20000;  // warm-up: caches, first stacks, collector connection
    level_28();
    pairs_per_round = saved;
    double r[3];
    for (int i = 0; i < 3; i++) r[i] = level_28();
    qsort(r, 3, sizeof r[0], cmp);
    printf("ns_per_pair %.1f\n", r[1]);
    return 0;
}
