// libfault_deep.so: allocates through its own libcudart dependency. Loaded with
// RTLD_DEEPBIND by deepbind_main: its cudaMalloc then binds inside its own dependency scope,
// before the preloaded shim.
#include "scenario.h"

__attribute__((noinline)) void deep_alloc(int n, size_t bytes) {
    for (int i = 0; i < n; i++) {
        void* p;
        CHECK(cudaMalloc(&p, bytes));
    }
}

__attribute__((noinline)) void deep_pair(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    CHECK(cudaFree(p));
}
