// Two devices (run with SIMCUDA_DEVICES=2); also calls oomtrace_flush when traced and fails
// if it does not succeed.
// Live at exit: device 0: on_device0 2 MiB; device 1: on_device1 3 MiB.
#include "scenario.h"

__attribute__((noinline)) void on_device0(void) {
    void* p;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&p, 2 * MiB));
}

__attribute__((noinline)) void on_device1(void) {
    void* p;
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&p, 3 * MiB));
    void* t;
    CHECK(cudaMalloc(&t, 7 * MiB));
    CHECK(cudaFree(t));
}

int main(void) {
    int n = 0;
    CHECK(cudaGetDeviceCount(&n));
    if (n != 2) {
        fprintf(stderr, "multi_device: expected 2 devices, got %d\n", n);
        return 4;
    }
    on_device0();
    on_device1();
    int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "oomtrace_flush");
    if (flush && flush() != 0) return 5;
    printf("multi_device: ok\n");
    return 0;
}
