// The library arrives late, by dlopen (as the Python API loads it into a program not started
// by `oomtrace run`): its per-thread block is then the loader's to allocate on each thread's
// first use (the TLS descriptor's dynamic path), not part of every thread from the start.
// Eight threads allocate through the library's own cudaMalloc and cudaFree (argv[1] is its
// path); each keeps its last block, of (t+1) x 4 KiB: live at exit 4 KiB x (1+...+8) in 8.
#include <dlfcn.h>
#include <pthread.h>
#include "scenario.h"

#define THREADS 8
#define ROUNDS 500

typedef cudaError_t (*malloc_fn)(void**, size_t);
typedef cudaError_t (*free_fn)(void*);
static malloc_fn traced_malloc;
static free_fn traced_free;

static void* worker(void* arg) {
    long t = (long)arg;
    for (int i = 0; i < ROUNDS; i++) {
        void* p;
        CHECK(traced_malloc(&p, (size_t)(t + 1) * 4096));
        if (i != ROUNDS - 1) CHECK(traced_free(p));
    }
    return NULL;
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    CHECK(cudaFree(NULL));
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen_shim: %s\n", dlerror());
        return 3;
    }
    traced_malloc = (malloc_fn)dlsym(lib, "cudaMalloc");
    traced_free = (free_fn)dlsym(lib, "cudaFree");
    if (!traced_malloc || !traced_free) return 4;
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void*)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    printf("dlopen_shim: ok\n");
    return 0;
}
