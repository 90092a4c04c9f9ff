// One thread makes N live allocations (argv[1], default 10,000,000) of 1 byte each and
// frees none (hold_many). Expected: N allocations, 0 frees, N blocks and N bytes live at exit
// (simcuda charges 512 B each: 5.12 GB of its default 16 GiB).
#include "scenario.h"

__attribute__((noinline)) static void hold_many(long n) {
    for (long i = 0; i < n; i++) {
        void* p;
        CHECK(cudaMalloc(&p, 1));
    }
}

int main(int argc, char** argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000000L;
    hold_many(n);
    printf("many_live: %ld\n", n);
    return 0;
}
