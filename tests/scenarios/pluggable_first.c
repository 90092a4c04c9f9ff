// PyTorch's pluggable allocator can ask oomtrace_malloc for its first tensor before anything in
// the process has loaded the CUDA driver. This program links neither libcuda nor libcudart and
// makes no CUDA call: it finds the entry points with dlsym, as CUDAPluggableAllocator does, and
// allocates. Expected: the driver gets loaded by the entry point, 4 MiB come back and are
// freed, 2 MiB are kept (live at exit, api oomtrace_malloc, in keep_tensor).
// Prints: "driver before: absent", "alloc: ok", "driver after: loaded", "kept: ok".
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

typedef void* (*alloc_fn)(size_t size, int device, void* stream);
typedef void (*free_fn)(void* ptr, size_t size, int device, void* stream);

#define MiB (1024ul * 1024ul)

static const char* driver_state(void) {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return "absent";
    dlclose(h);
    return "loaded";
}

__attribute__((noinline)) static void* keep_tensor(alloc_fn alloc) {
    return alloc(2 * MiB, 0, NULL);
}

int main(void) {
    alloc_fn alloc = (alloc_fn)dlsym(RTLD_DEFAULT, "oomtrace_malloc");
    free_fn release = (free_fn)dlsym(RTLD_DEFAULT, "oomtrace_free");
    if (!alloc || !release) {
        puts("no oomtrace entry points (run under oomtrace)");
        return 2;
    }
    printf("driver before: %s\n", driver_state());
    void* p = alloc(4 * MiB, 0, NULL);
    printf("alloc: %s\n", p ? "ok" : "NULL");
    printf("driver after: %s\n", driver_state());
    if (p) release(p, 4 * MiB, 0, NULL);
    void* kept = keep_tensor(alloc);
    printf("kept: %s\n", kept ? "ok" : "NULL");
    return p && kept ? 0 : 1;
}
