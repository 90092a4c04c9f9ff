// Allocates and frees 1 MiB blocks until its standard input closes, timing each pair. Prints
// "made N" after every 65,536 pairs (so a test knows how far it got, whatever the machine's
// speed), then how many pairs it made, the longest a single pair took (how long the shim held
// the program back while the collector did not read) and when that pair started.
#include <poll.h>
#include <time.h>
#include <unistd.h>
#include "scenario.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

// True once standard input is at end of file (or broken): checked without waiting.
static int input_closed(void) {
    struct pollfd p = {.fd = 0, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return 0;
    char c;
    return p.revents & (POLLHUP | POLLERR | POLLNVAL) || read(0, &c, 1) <= 0;
}

int main(void) {
    double start = now_s(), end = start, longest = 0, longest_at = 0;
    long pairs = 0;
    for (;;) {
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
        if (pairs % 65536 == 0) {
            printf("made %ld\n", pairs);
            fflush(stdout);
        }
        if (pairs % 1024 == 0 && input_closed()) break;
    }
    printf("stall_pairs: %ld pairs, longest %.0f ms at %.1f s\n", pairs, longest * 1000, longest_at);
    return 0;
}
