// 200 threads, each doing PAIRS cudaMalloc/cudaFree pairs (argv[1], default 2000) of
// 512 B x (1 + i % 4), then keeping exactly 5 blocks of 4 KiB x (1..5) (keep_five).
// Expected: allocations = 200 x (PAIRS + 5), frees = 200 x PAIRS, live at exit 1000 blocks,
// 200 x 4 KiB x 15 = 12,288,000 bytes. No flush: the shim's exit path must deliver it all.
#include <pthread.h>
#include "scenario.h"

#define THREADS 200

static int pairs = 2000;
static pthread_barrier_t start;

__attribute__((noinline)) static void keep_five(void) {
    for (size_t k = 1; k <= 5; k++) {
        void* p;
        CHECK(cudaMalloc(&p, k * 4096));
    }
}

static void* worker(void* arg) {
    (void)arg;
    pthread_barrier_wait(&start);
    for (int i = 0; i < pairs; i++) {
        void* p;
        CHECK(cudaMalloc(&p, 512 * (size_t)(1 + i % 4)));
        CHECK(cudaFree(p));
    }
    keep_five();
    return NULL;
}

int main(int argc, char** argv) {
    if (argc > 1) pairs = atoi(argv[1]);
    pthread_t th[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    CHECK(cudaFree(NULL));
    for (int t = 0; t < THREADS; t++) {
        if (pthread_create(&th[t], NULL, worker, NULL) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 93;
        }
    }
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    printf("threads200: ok\n");
    return 0;
}
