// How long a traced process takes to exit, measured from outside its own exit path.
// The parent allocates, forks; the child allocates, writes the time into shared memory and
// leaves (`exit` or, with argv[1] = "_exit", `_exit`) while the parent is still connected to
// its collector; the parent reaps it and prints how long the child's exit took. Then the
// parent prints the wall-clock time (CLOCK_REALTIME, ns) just before it returns from main, for
// the test to compare with when it saw the parent end.
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "scenario.h"

static unsigned long long now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

__attribute__((noinline)) void parent_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 3 * MiB));
}

__attribute__((noinline)) void child_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 5 * MiB));
}

int main(int argc, char** argv) {
    int underscore = argc > 1 && strcmp(argv[1], "_exit") == 0;
    volatile unsigned long long* shared =
        mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return 2;
    parent_keep();
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        child_keep();
        shared[0] = now_ns(CLOCK_MONOTONIC);
        if (underscore) _exit(0);
        exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    unsigned long long took = now_ns(CLOCK_MONOTONIC) - shared[0];
    printf("exit_timing: child exit took %llu ms (status %d)\n", took / 1000000ull,
           WEXITSTATUS(status));
    printf("exit_timing: parent returns at %llu\n", now_ns(CLOCK_REALTIME));
    fflush(stdout);
    return 0;
}
