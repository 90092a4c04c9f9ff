// Loads ext_static.so with dlopen(RTLD_LOCAL), as Python loads extensions, and calls it.
// Live at exit: 5 x 2 MiB from ext_leaky_alloc.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
    const char* path = argc > 1 ? argv[1] : "./libext_static.so";
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "static_ext_main: %s\n", dlerror());
        return 2;
    }
    unsigned long long (*leaky)(size_t) = (unsigned long long (*)(size_t))dlsym(h, "ext_leaky_alloc");
    void (*scratch)(size_t) = (void (*)(size_t))dlsym(h, "ext_scratch");
    if (!leaky || !scratch) return 3;
    for (int i = 0; i < 5; i++) {
        leaky(2 << 20);
        scratch(1 << 20);
    }
    printf("static_ext: ok\n");
    return 0;
}
