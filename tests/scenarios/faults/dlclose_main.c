// dlopen libfault_plugin.so (argv[1]), allocate 4 x 2 MiB in plugin_alloc, free 1 of them,
// dlclose it (it really unloads); if argv[2] names libfault_second.so, dlopen it (it lands
// at the plugin's old address) and allocate 3 MiB in second_alloc; then 1 MiB in main_after.
// Expected live at exit: plugin_alloc 6 MiB, main_after 1 MiB (+ second_alloc 3 MiB).
#include <stdint.h>
#include "scenario.h"

__attribute__((noinline)) static void main_after(void) {
    void* p;
    CHECK(cudaMalloc(&p, 1 * MiB));
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlclose_main: %s\n", dlerror());
        return 2;
    }
    void (*alloc)(int, size_t) = (void (*)(int, size_t))dlsym(h, "plugin_alloc");
    void (*release)(int) = (void (*)(int))dlsym(h, "plugin_free");
    if (!alloc || !release) return 3;
    alloc(4, 2 * MiB);
    release(1);
    uintptr_t plugin_at = (uintptr_t)alloc;
    dlclose(h);
    if (dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD)) {
        fprintf(stderr, "dlclose_main: the plugin is still loaded\n");
        return 4;
    }
    void (*second)(int, size_t) = NULL;
    if (argc > 2) {
        void* d = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        if (!d) {
            fprintf(stderr, "dlclose_main: %s\n", dlerror());
            return 2;
        }
        second = (void (*)(int, size_t))dlsym(d, "second_alloc");
        if (!second) return 3;
        second(1, 3 * MiB);
    }
    main_after();
    printf("dlclose_main: ok (plugin_alloc at %#lx, second_alloc at %#lx)\n",
           (unsigned long)plugin_at, (unsigned long)(uintptr_t)second);
    return 0;
}
