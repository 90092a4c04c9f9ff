// Allocates and frees 1 MiB blocks for argv[1] seconds (default 5), timing each pair, then
// prints how many pairs it made, the longest a single pair took (how long the shim held the
// program back while the collector did not read) and when that pair started.
#include <time.h>
#include "scenario.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
    double secs = argc > 1 ? atof(argv[1]) : 5.0;
    double start = now_s(), end = start, longest = 0, longest_at = 0;
    long pairs = 0;
    do {
        double before = end;
        void* p;
        CHECK(cudaMalloc(&p, 1 * MiB));
        CHECK(cudaFree(p));
        pairs++;
        end = now_s();
        if (end - before > longest) {
            longest = end - before;
            longest_at = before - start;
        }
    } while (end - start < secs);
    printf("stall_pairs: %ld pairs, longest %.0f ms at %.1f s\n", pairs, longest * 1000, longest_at);
    return 0;
}
