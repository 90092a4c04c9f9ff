// A leak in one function, for tests that rebuild the program between its run and its report
// (tests/it/stale_symbols.rs compiles it itself, not tests/build.rs). Built as is, the leaking
// function is `leaky_buffer_cache`; built with -DLEAKY=helper_one (the "v2"), the same code at
// the same address is named `helper_one`: a report that took names from the rebuilt file
// would blame a function the traced program never had.
// Each of 30 steps leaks 4 MiB from LEAKY and frees a 1 MiB temporary; live at exit: 120 MiB.
#include "scenario.h"

#ifndef LEAKY
#define LEAKY leaky_buffer_cache
#endif

static void* kept[30];

__attribute__((noinline)) void LEAKY(int i) { CHECK(cudaMalloc(&kept[i], 4 * MiB)); }

__attribute__((noinline)) void scratch_space(void) {
    void* t;
    CHECK(cudaMalloc(&t, 1 * MiB));
    CHECK(cudaFree(t));
}

int main(void) {
    for (int i = 0; i < 30; i++) {
        scratch_space();
        LEAKY(i);
        step_mark("step");
    }
    return 0;
}
