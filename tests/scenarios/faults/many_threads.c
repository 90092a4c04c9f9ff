// 16 threads x ROUNDS rounds x BATCH blocks: every round each thread allocates BATCH blocks,
// frees the even ones itself and hands the odd ones to the next thread, which frees them
// (cross-thread frees). At the end each thread t keeps one block of (t+1) x 4 KiB
// (keep_one). Expected: allocations = 16 x ROUNDS x BATCH + 16 = 1,600,016 (defaults),
// frees = 1,600,000, live at exit = 4 KiB x (1+...+16) = 557,056 bytes in 16 blocks.
// argv[1] overrides ROUNDS (default 100). Before returning, main retries oomtrace_flush()
// until the backlog is delivered: the shim's exit flush is bounded (2.5 s), and the test
// wants every event (or its loss) counted, not cut off by that bound.
#include <pthread.h>
#include <unistd.h>
#include "scenario.h"

#define THREADS 16
#define BATCH 1000

static int rounds = 100;
static void* mailbox[THREADS][BATCH / 2];
static pthread_barrier_t barrier;

__attribute__((noinline)) static void keep_one(int t) {
    void* p;
    CHECK(cudaMalloc(&p, (size_t)(t + 1) * 4096));
}

static void* worker(void* arg) {
    int t = (int)(long)arg;
    int from = (t + THREADS - 1) % THREADS;
    void* mine[BATCH];
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < BATCH; i++) CHECK(cudaMalloc(&mine[i], 512 * (size_t)(1 + i % 4)));
        for (int i = 0; i < BATCH; i += 2) CHECK(cudaFree(mine[i]));
        for (int i = 1; i < BATCH; i += 2) mailbox[t][i / 2] = mine[i];
        pthread_barrier_wait(&barrier);
        for (int i = 0; i < BATCH / 2; i++) CHECK(cudaFree(mailbox[from][i]));
        pthread_barrier_wait(&barrier);
    }
    keep_one(t);
    return NULL;
}

int main(int argc, char** argv) {
    if (argc > 1) rounds = atoi(argv[1]);
    pthread_t th[THREADS];
    pthread_barrier_init(&barrier, NULL, THREADS);
    CHECK(cudaFree(NULL));
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void*)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "oomtrace_flush");
    for (int i = 0; flush && i < 200 && flush() != 0; i++) usleep(50 * 1000);
    printf("many_threads: ok\n");
    return 0;
}
