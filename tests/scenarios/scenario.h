// Helpers shared by the scenario programs: error checks that name the failing call, and the
// optional step marker (resolved at run time so every scenario also runs without oomtrace).
#ifndef OOMTRACE_SCENARIO_H
#define OOMTRACE_SCENARIO_H

#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define MiB (1024ull * 1024ull)

#define CHECK(call)                                                                       \
    do {                                                                                  \
        cudaError_t err_ = (call);                                                        \
        if (err_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,          \
                    cudaGetErrorString(err_));                                            \
            exit(90);                                                                     \
        }                                                                                 \
    } while (0)

#define CU_CHECK(call)                                                                    \
    do {                                                                                  \
        CUresult err_ = (call);                                                           \
        if (err_ != CUDA_SUCCESS) {                                                       \
            fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, (int)err_); \
            exit(91);                                                                     \
        }                                                                                 \
    } while (0)

static inline void step_mark(const char* label) {
    static void (*mark)(const char*) = NULL;
    static int looked = 0;
    if (!looked) {
        mark = (void (*)(const char*))dlsym(RTLD_DEFAULT, "oomtrace_mark");
        looked = 1;
    }
    if (mark) mark(label);
}

// A driver function the way PyTorch gets one: through the runtime's entry-point resolver.
static inline void* driver_entry(const char* name, unsigned long long flags) {
    void* fn = NULL;
    cudaDriverEntryPointQueryResult status;
    CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, flags, &status));
    if (status != cudaDriverEntryPointSuccess || !fn) {
        fprintf(stderr, "no driver entry point for %s\n", name);
        exit(92);
    }
    return fn;
}

#endif
