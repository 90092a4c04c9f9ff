// libcorpus_ext.so: a "torch C++ extension" for leak_ext, linked against libcudart itself
// and loaded with dlopen(RTLD_NOW | RTLD_LOCAL).
// ext_fused_op(): a 4 MiB workspace allocated and freed on every call (clean).
// ext_workspace_leak(): 1 MiB per call, never freed (the leak).
#include "scenario.h"

__attribute__((noinline)) void ext_fused_op(void) {
    void* ws;
    CHECK(cudaMalloc(&ws, 4 * MiB));
    CHECK(cudaFree(ws));
}

__attribute__((noinline)) void ext_workspace_leak(void) {
    void* ws;
    CHECK(cudaMalloc(&ws, 1 * MiB));
}
