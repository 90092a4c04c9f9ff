// A thread allocates and frees in a loop (busy_pairs, at most 20000 pairs: never more events
// than the shim's queue holds, so nothing may be lost) while main forks twice:
// child 1 allocates 5 MiB (child_keep) and leaves with _exit(0); child 2 never touches CUDA
// and returns normally (exit code 3). Main keeps 2 MiB (parent_keep); the busy thread frees
// everything it allocates. Expected: 2 processes (child 2 is not traced), parent live 2 MiB,
// child 1 live 5 MiB in 1 allocation.
// Each busy CUDA call holds app_lock, and the fork of child 1 takes it (pthread_atfork):
// simcuda has one global mutex and no fork handler, so a fork inside its critical section
// would leave child 1 stuck (real CUDA forbids CUDA in a forked child anyway). The shim's drain
// thread is not held back: it is writing the busy thread's events while the fork happens.
// Child 2 is forked without the lock: wherever the busy thread is (in the shim's hook too).
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>
#include "scenario.h"

static pthread_mutex_t app_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int stop;
static atomic_long pairs;

static atomic_int guard_fork;

static void lock_app(void) { pthread_mutex_lock(&app_lock); }
static void unlock_app(void) { pthread_mutex_unlock(&app_lock); }
static void fork_prepare(void) {
    if (atomic_load(&guard_fork)) lock_app();
}
static void fork_done(void) {
    if (atomic_load(&guard_fork)) unlock_app();
}

__attribute__((noinline)) static void busy_pairs(void) {
    while (!atomic_load(&stop) && atomic_load(&pairs) < 20000) {
        void* p;
        lock_app();
        CHECK(cudaMalloc(&p, 64 * 1024));
        unlock_app();
        lock_app();
        CHECK(cudaFree(p));
        unlock_app();
        atomic_fetch_add(&pairs, 1);
    }
}

static void* busy(void* arg) {
    (void)arg;
    busy_pairs();
    return NULL;
}

__attribute__((noinline)) static void parent_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 2 * MiB));
}

__attribute__((noinline)) static void child_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 5 * MiB));
}

static int wait_for(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(void) {
    pthread_atfork(fork_prepare, fork_done, fork_done);
    parent_keep();
    pthread_t th;
    pthread_create(&th, NULL, busy, NULL);
    while (atomic_load(&pairs) < 200) sched_yield();
    fflush(stdout);
    atomic_store(&guard_fork, 1);
    pid_t c1 = fork();
    atomic_store(&guard_fork, 0);
    if (c1 == 0) {
        child_keep();
        printf("fork_busy: cuda child ok\n");
        fflush(stdout);
        _exit(0);
    }
    while (atomic_load(&pairs) < 400) sched_yield();
    pid_t c2 = fork();
    if (c2 == 0) {
        printf("fork_busy: plain child ok\n");
        return 3;
    }
    int s1 = wait_for(c1), s2 = wait_for(c2);
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    printf("fork_busy: children exited %d %d\n", s1, s2);
    return 0;
}
