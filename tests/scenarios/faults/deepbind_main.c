// dlopen libfault_deep.so (argv[1]) with RTLD_NOW | RTLD_DEEPBIND and allocate through it:
// deep_alloc 2 x 3 MiB kept, deep_pair 1 MiB allocated and freed.
// Built twice: deepbind_main links libcudart and allocates 1 MiB (main_keep) before the
// dlopen; deepbind_nolink (-DNO_CUDART) links no CUDA, so libcudart arrives inside the
// deep-bound library's scope. Expected live at exit: deep_alloc 6 MiB (+ main_keep 1 MiB).
#include "scenario.h"

#ifndef NO_CUDART
__attribute__((noinline)) static void main_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 1 * MiB));
}
#endif

int main(int argc, char** argv) {
    if (argc < 2) return 2;
#ifndef NO_CUDART
    main_keep();
#endif
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_DEEPBIND);
    if (!h) {
        fprintf(stderr, "deepbind_main: %s\n", dlerror());
        return 2;
    }
    void (*alloc)(int, size_t) = (void (*)(int, size_t))dlsym(h, "deep_alloc");
    void (*pair)(size_t) = (void (*)(size_t))dlsym(h, "deep_pair");
    if (!alloc || !pair) return 3;
    alloc(2, 3 * MiB);
    pair(1 * MiB);
    printf("deepbind_main: ok\n");
    return 0;
}
