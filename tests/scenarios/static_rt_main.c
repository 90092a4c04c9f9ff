// Loads libext_static_rt.so with dlopen(RTLD_LOCAL), as Python loads extensions, and calls
// its `scratch_forward` once per step for 40 steps: 40 x 1 MiB kept.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static void step_mark(const char* label) {
    void (*mark)(const char*) = (void (*)(const char*))dlsym(RTLD_DEFAULT, "oomtrace_mark");
    if (mark) mark(label);
}

int main(int argc, char** argv) {
    const char* path = argc > 1 ? argv[1] : "./libext_static_rt.so";
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "static_rt_main: %s\n", dlerror());
        return 2;
    }
    void (*forward)(size_t) = (void (*)(size_t))dlsym(h, "scratch_forward");
    if (!forward) return 3;
    for (int step = 0; step < 40; step++) {
        forward(1 << 20);
        step_mark("step");
    }
    printf("static_rt: ok\n");
    return 0;
}
