// 8 threads allocate; half of every thread's blocks are freed by the next thread
// (cross-thread frees). Deterministic live-at-exit: each thread keeps KEEP blocks of
// (t+1) x 64 KiB, so live = KEEP x 64 KiB x (1+2+...+8) = KEEP x 64 KiB x 36.
#include <pthread.h>
#include "scenario.h"

#define THREADS 8
#define BLOCKS 2000
#define KEEP 10

static void* blocks[THREADS][BLOCKS];
static pthread_barrier_t allocated;

__attribute__((noinline)) static void allocate_blocks(int t) {
    for (int i = 0; i < BLOCKS; i++) CHECK(cudaMalloc(&blocks[t][i], (size_t)(t + 1) * 64 * 1024));
}

static void* worker(void* arg) {
    int t = (int)(long)arg;
    allocate_blocks(t);
    pthread_barrier_wait(&allocated);
    // Free the neighbour's blocks, all but its first KEEP.
    int victim = (t + 1) % THREADS;
    for (int i = KEEP; i < BLOCKS; i++) CHECK(cudaFree(blocks[victim][i]));
    return NULL;
}

int main(void) {
    pthread_t th[THREADS];
    pthread_barrier_init(&allocated, NULL, THREADS);
    CHECK(cudaFree(NULL));
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void*)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    printf("threads: ok\n");
    return 0;
}
