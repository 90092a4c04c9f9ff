// Loads libext_dyn.so RTLD_LOCAL (this program links no CUDA library at all).
// Live at exit: ctor_alloc 1 MiB, dyn_ext_alloc 4 x 2 MiB, dyn_ext_driver_alloc 3 MiB.
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char** argv) {
    void* h = dlopen(argc > 1 ? argv[1] : "./libext_dyn.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dyn_ext_main: %s\n", dlerror());
        return 2;
    }
    void* (*alloc)(size_t) = (void* (*)(size_t))dlsym(h, "dyn_ext_alloc");
    void (*driver_alloc)(size_t) = (void (*)(size_t))dlsym(h, "dyn_ext_driver_alloc");
    if (!alloc || !driver_alloc) return 3;
    for (int i = 0; i < 4; i++) alloc(2 << 20);
    driver_alloc(3 << 20);
    printf("dyn_ext: ok\n");
    return 0;
}
