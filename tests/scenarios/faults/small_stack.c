// A thread with the smallest stack glibc allows (PTHREAD_STACK_MIN, 16 KiB) allocates and frees:
// the untraced program runs; traced, the hooks (a native stack captured on each allocation, the
// thread's first capture building its tables) must fit in what the thread has left. Before
// 2026-12-05 a capture's frame alone was 8.5 KiB and this crashed (SIGSEGV). Main keeps 1 MiB
// (main_keep); the thread keeps 2 MiB (small_keep) after three allocate/free pairs.
#include <limits.h>
#include <pthread.h>
#include "scenario.h"

__attribute__((noinline)) static void main_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 1 * MiB));
}

__attribute__((noinline)) static void small_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 2 * MiB));
}

static void* small(void* arg) {
    (void)arg;
    for (int i = 0; i < 3; i++) {
        void* q;
        CHECK(cudaMalloc(&q, 1 * MiB));
        CHECK(cudaFree(q));
    }
    small_keep();
    return NULL;
}

int main(void) {
    main_keep();
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (pthread_attr_setstacksize(&attr, PTHREAD_STACK_MIN) != 0) {
        fprintf(stderr, "small_stack: cannot ask for a %d-byte stack\n", (int)PTHREAD_STACK_MIN);
        return 92;
    }
    pthread_t t;
    if (pthread_create(&t, &attr, small, NULL) != 0) return 93;
    pthread_join(t, NULL);
    printf("small_stack: ok\n");
    return 0;
}
