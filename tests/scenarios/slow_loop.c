// Allocates and frees for about argv[1] seconds (default 3), then exits with code 7.
// Used to kill the collector in the middle of a run. With argv[2] "hold", 1 MiB stays allocated
// from the start to the end: a view of what is held now always shows this file's line (each
// pair of the loop is freed as soon as it is made, so a view between two events of a pair is
// luck).
#include <string.h>
#include <time.h>

#include "scenario.h"

int main(int argc, char** argv) {
    double secs = argc > 1 ? atof(argv[1]) : 3.0;
    void* held = NULL;
    if (argc > 2 && strcmp(argv[2], "hold") == 0) {
        CHECK(cudaMalloc(&held, 1 * MiB));
    }
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
    if (held != NULL) {
        CHECK(cudaFree(held));
    }
    printf("slow_loop: done (%s)\n", pairs > 0 ? "allocated" : "idle");
    return 7;
}
