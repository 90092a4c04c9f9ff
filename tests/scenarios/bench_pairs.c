// Benchmark workload: N cudaMalloc+cudaFree pairs issued from the bottom of a 30-deep call
// chain, built with -O2 -fomit-frame-pointer (so a frame-pointer walk would see 2 frames and
// only DWARF unwinding recovers the chain). Usage: bench_pairs [PAIRS [ROUNDS]] (10^6, 3).
// Each round is timed in wall time and in this thread's CPU time (what the calling thread
// itself spent: on a shared machine wall time also counts the time others held the core).
// Prints, per pair: "ns_per_pair" (median round, wall; the first line, read by older
// scripts), "cpu_ns_per_pair" (median round, thread CPU), "fastest_ns_per_pair" and
// "fastest_cpu_ns_per_pair" (the fastest round).
#include <time.h>
#include "scenario.h"

static long pairs_per_round = 1000000;
static volatile long sink;

struct timing {
    double wall, cpu;
};

static double clock_ns(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

__attribute__((noinline)) static struct timing bottom(void) {
    double w0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < pairs_per_round; i++) {
        void* p;
        cudaMalloc(&p, 4096);
        cudaFree(p);
    }
    struct timing t = {(clock_ns(CLOCK_MONOTONIC) - w0) / pairs_per_round,
                       (clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / pairs_per_round};
    return t;
}

// level_k calls level_{k-1}; the volatile store after the call prevents tail calls.
#define LEVEL(k, next)                                                \
    __attribute__((noinline)) static struct timing level_##k(void) { \
        struct timing r = next();                                     \
        sink = sink + 1;                                              \
        return r;                                                     \
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

static double median(double* v, int n) {
    qsort(v, n, sizeof v[0], cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char** argv) {
    if (argc > 1) pairs_per_round = atol(argv[1]);
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    if (pairs_per_round < 1 || rounds < 1 || rounds > 1000) {
        fprintf(stderr, "usage: bench_pairs [PAIRS >= 1 [ROUNDS 1..1000]]\n");
        return 2;
    }
    CHECK(cudaFree(NULL));
    long saved = pairs_per_round;
    pairs_per_round = 20000;  // warm-up: caches, first stacks, collector connection
    level_28();
    pairs_per_round = saved;
    double wall[1000], cpu[1000];
    for (int i = 0; i < rounds; i++) {
        struct timing t = level_28();
        wall[i] = t.wall;
        cpu[i] = t.cpu;
    }
    printf("ns_per_pair %.1f\n", median(wall, rounds));
    printf("cpu_ns_per_pair %.1f\n", median(cpu, rounds));
    printf("fastest_ns_per_pair %.1f\n", wall[0]);  // sorted by median()
    printf("fastest_cpu_ns_per_pair %.1f\n", cpu[0]);
    return 0;
}
