// Frees made by thread-exit destructors. Each of 4 threads:
//  - allocates 2 x 1 MiB (key_alloc) into a pthread_key slot whose destructor frees them;
//  - allocates 512 KiB (var_alloc) into a __thread variable freed by a destructor registered
//    with __cxa_thread_atexit_impl (how C++ thread_local destructors run). Even threads
//    register it before their first CUDA call, odd ones after, so it runs after / before
//    the shim's own thread-local destructors.
// Main keeps 1 MiB (main_keep). Expected: 13 allocations, 12 frees, live at exit 1 MiB,
// nothing live at key_alloc or var_alloc, no unmatched or lost frees.
#include <pthread.h>
#include "scenario.h"

#define THREADS 4

extern int __cxa_thread_atexit_impl(void (*fn)(void*), void* obj, void* dso_symbol);
extern void* __dso_handle;

static pthread_key_t key;
static __thread void* var_block;

static void free_key_blocks(void* v) {
    void** blocks = v;
    CHECK(cudaFree(blocks[0]));
    CHECK(cudaFree(blocks[1]));
    free(blocks);
}

static void free_var_block(void* unused) {
    (void)unused;
    CHECK(cudaFree(var_block));
    var_block = NULL;
}

__attribute__((noinline)) static void key_alloc(void) {
    void** blocks = malloc(2 * sizeof(void*));
    CHECK(cudaMalloc(&blocks[0], 1 * MiB));
    CHECK(cudaMalloc(&blocks[1], 1 * MiB));
    pthread_setspecific(key, blocks);
}

__attribute__((noinline)) static void var_alloc(void) { CHECK(cudaMalloc(&var_block, 512 * 1024)); }

static void* worker(void* arg) {
    int early = (int)(long)arg % 2 == 0;
    if (early) __cxa_thread_atexit_impl(free_var_block, NULL, &__dso_handle);
    key_alloc();
    var_alloc();
    if (!early) __cxa_thread_atexit_impl(free_var_block, NULL, &__dso_handle);
    return NULL;
}

__attribute__((noinline)) static void main_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 1 * MiB));
}

int main(void) {
    pthread_key_create(&key, free_key_blocks);
    main_keep();
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void*)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    printf("tls_dtor_free: ok\n");
    return 0;
}
