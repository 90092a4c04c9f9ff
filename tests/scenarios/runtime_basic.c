// Runtime path: cudaMalloc/cudaFree from distinct call sites. Exits with argv[1] (default 0).
// Live at exit: keep_weights 3 x 8 MiB + keep_cache 1 x 4 MiB = 28 MiB in 4 allocations.
#include "scenario.h"

static void* weights[3];
static void* cache;

__attribute__((noinline)) void keep_weights(void) {
    for (int i = 0; i < 3; i++) CHECK(cudaMalloc(&weights[i], 8 * MiB));
}

__attribute__((noinline)) void keep_cache(void) { CHECK(cudaMalloc(&cache, 4 * MiB)); }

__attribute__((noinline)) void temporaries(int n) {
    for (int i = 0; i < n; i++) {
        void* t;
        CHECK(cudaMalloc(&t, 1 * MiB));
        CHECK(cudaFree(t));
    }
}

int main(int argc, char** argv) {
    CHECK(cudaFree(NULL));  // the usual way to initialise the runtime: frees nothing
    void* zero = (void*)1;
    CHECK(cudaMalloc(&zero, 0));  // succeeds with NULL: allocates nothing
    keep_weights();
    keep_cache();
    temporaries(100);
    printf("runtime_basic: ok\n");
    return argc > 1 ? atoi(argv[1]) : 0;
}
