// Makes argv[1] cudaMalloc+cudaFree pairs of 4 KiB as fast as it can (default 20000), then
// exits with code argv[2] (default 42); with argv[3] "hold", only once its standard input
// ends (a test that kills the collector while the program is surely still running). Under the
// shim that is 2 * pairs + 1 events (each allocation, each free, and the device's memory
// reading at its first allocation), the number the loss-accounting tests check against:
// received + lost must be exactly that. Many of these at once, against one starved collector,
// end their streams together.
#include <string.h>

#include "scenario.h"

int main(int argc, char** argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 20000;
    int code = argc > 2 ? atoi(argv[2]) : 42;
    for (long i = 0; i < pairs; i++) {
        void* p;
        CHECK(cudaMalloc(&p, 4096));
        CHECK(cudaFree(p));
    }
    printf("loss_burst: %ld pairs\n", pairs);
    fflush(stdout);
    if (argc > 3 && strcmp(argv[3], "hold") == 0) {
        char buf[64];
        while (fread(buf, 1, sizeof buf, stdin) > 0) {
        }
    }
    return code;
}
