// The program links libcudart.so.12; libext_rt13.so brings libcudart.so.13 (RTLD_LOCAL).
// Live at exit: main_alloc 1 MiB (cudaMalloc via .12), rt13_alloc 2 MiB (cudaMalloc via .13).
#include "scenario.h"

__attribute__((noinline)) void main_alloc(void) {
    void* p;
    CHECK(cudaMalloc(&p, 1 * MiB));
}

int main(int argc, char** argv) {
    main_alloc();
    void* h = dlopen(argc > 1 ? argv[1] : "./libext_rt13.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "two_runtimes: %s\n", dlerror());
        return 2;
    }
    void* (*alloc)(size_t) = (void* (*)(size_t))dlsym(h, "rt13_alloc");
    int (*oom_error)(void) = (int (*)(void))dlsym(h, "rt13_oom_last_error");
    alloc(2 * MiB);
    printf("the extension's runtime saw its failure: error %d\n", oom_error());
    // And the program's runtime did not: its sticky error is still clear.
    printf("the program's runtime: error %d\n", (int)cudaGetLastError());
    return 0;
}
