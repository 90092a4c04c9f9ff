// A thread calls exit(5) while main is blocked in pthread_join: atexit handlers (the shim's
// flush) run on that thread. Main keeps 3 MiB (main_keep); the thread keeps 1 MiB
// (thread_keep) after an allocate/free pair. Expected: exit code 5, status "exited",
// live at exit 4 MiB, 3 allocations, 1 free.
#include <pthread.h>
#include "scenario.h"

__attribute__((noinline)) static void main_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 3 * MiB));
}

__attribute__((noinline)) static void thread_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 1 * MiB));
}

static void* exiter(void* arg) {
    (void)arg;
    void* q;
    CHECK(cudaMalloc(&q, 2 * MiB));
    CHECK(cudaFree(q));
    thread_keep();
    printf("exit_thread: exiting from a thread\n");
    fflush(stdout);
    exit(5);
}

int main(void) {
    main_keep();
    pthread_t th;
    pthread_create(&th, NULL, exiter, NULL);
    pthread_join(th, NULL);
    printf("exit_thread: unreachable\n");
    return 0;
}
