// Allocates and frees for about argv[1] seconds (default 3), then exits with code 7.
// Used to kill the collector in the middle of a run.
#include <time.h>
#include "scenario.h"

int main(int argc, char** argv) {
    double secs = argc > 1 ? atof(argv[1]) : 3.0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long pairs = 0;
    do {
        void* p;
        CHECK(cudaMalloc(&p, 1 * MiB));
        CHECK(cudaFree(p));
        pairs++;
        if (pairs % 256 == 0) {
            struct timespec pause = {0, 200 * 1000};
            nanosleep(&pause, NULL);
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < secs);
    printf("slow_loop: done (%s)\n", pairs > 0 ? "allocated" : "idle");
    return 7;
}
