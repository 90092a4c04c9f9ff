// oomtrace_malloc called first thing, before anything in the process initialised CUDA, must do
// what the CUDA runtime does on a first call: cuInit(0), then make the device's primary context
// current (and leave it so, as the runtime does). The program loads the driver itself but
// makes no call that initialises it, checks that the driver says so (CUDA_ERROR_NOT_INITIALIZED
// before cuInit, as a real driver does), then allocates through the entry point found with
// dlsym, as CUDAPluggableAllocator does.
//
// argv[1] "first" (default): 4 MiB come back; the primary context is current afterwards and
// the memory is usable (a copy there and back); a tensor on device 7 (there is none) and one of
// 1 PiB come back NULL, each with its real cause on stderr; 2 MiB are kept (live at exit, in
// keep_tensor), the 4 MiB freed.
// Prints: "before: 3", "alloc: ok", "context: current", "round trip: ok", "device 7: NULL",
// "huge: NULL", "kept: ok".
// argv[1] "nodevice" (run with SIMCUDA_DEVICES=0): cuInit fails; prints "before: 3",
// "alloc: NULL".
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef void* CUcontext;
typedef unsigned long long CUdeviceptr;
typedef void* (*alloc_fn)(size_t size, int device, void* stream);
typedef void (*free_fn)(void* ptr, size_t size, int device, void* stream);
typedef CUresult (*count_fn)(int*);
typedef CUresult (*current_fn)(CUcontext*);
typedef CUresult (*htod_fn)(CUdeviceptr, const void*, size_t);
typedef CUresult (*dtoh_fn)(void*, CUdeviceptr, size_t);

#define MiB (1024ul * 1024ul)

__attribute__((noinline)) static void* keep_tensor(alloc_fn alloc) {
    return alloc(2 * MiB, 0, NULL);
}

int main(int argc, char** argv) {
    int nodevice = argc > 1 && strcmp(argv[1], "nodevice") == 0;
    alloc_fn alloc = (alloc_fn)dlsym(RTLD_DEFAULT, "oomtrace_malloc");
    free_fn release = (free_fn)dlsym(RTLD_DEFAULT, "oomtrace_free");
    if (!alloc || !release) {
        puts("no oomtrace entry points (run under oomtrace)");
        return 2;
    }
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        puts("no driver");
        return 2;
    }
    count_fn device_count = (count_fn)dlsym(cuda, "cuDeviceGetCount");
    current_fn get_current = (current_fn)dlsym(cuda, "cuCtxGetCurrent");
    htod_fn htod = (htod_fn)dlsym(cuda, "cuMemcpyHtoD_v2");
    dtoh_fn dtoh = (dtoh_fn)dlsym(cuda, "cuMemcpyDtoH_v2");
    if (!device_count || !get_current || !htod || !dtoh) {
        puts("driver functions missing");
        return 2;
    }
    int n = -1;
    printf("before: %d\n", device_count(&n));

    void* p = alloc(4 * MiB, 0, NULL);
    printf("alloc: %s\n", p ? "ok" : "NULL");
    if (nodevice || !p) return p ? 1 : 0;

    CUcontext ctx = NULL;
    CUresult rc = get_current(&ctx);
    printf("context: %s\n", rc == 0 && ctx ? "current" : "none");

    static char out[64 * 1024], back[64 * 1024];
    for (size_t i = 0; i < sizeof out; i++) out[i] = (char)(i * 7 + 1);
    CUresult to = htod((CUdeviceptr)p, out, sizeof out);
    CUresult from = dtoh(back, (CUdeviceptr)p, sizeof back);
    printf("round trip: %s\n", to == 0 && from == 0 && !memcmp(out, back, sizeof out) ? "ok" : "failed");

    void* other = alloc(1 * MiB, 7, NULL);
    printf("device 7: %s\n", other ? "ok" : "NULL");
    void* huge = alloc(1ul << 50, 0, NULL);
    printf("huge: %s\n", huge ? "ok" : "NULL");

    release(p, 4 * MiB, 0, NULL);
    void* kept = keep_tensor(alloc);
    printf("kept: %s\n", kept ? "ok" : "NULL");
    return kept && !other && !huge ? 0 : 1;
}
