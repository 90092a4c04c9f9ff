// The parent allocates, forks; the child allocates on its own and leaves with _exit (as
// Python's multiprocessing workers do); the parent waits, then exits normally.
// Parent live at exit: 3 MiB (parent_keep). Child live at exit: 5 MiB (child_keep).
#include <sys/wait.h>
#include <unistd.h>
#include "scenario.h"

__attribute__((noinline)) void parent_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 3 * MiB));
}

__attribute__((noinline)) void child_keep(void) {
    void* p;
    CHECK(cudaMalloc(&p, 5 * MiB));
}

int main(void) {
    parent_keep();
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        child_keep();
        printf("fork_child: child ok\n");
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("fork_child: parent ok, child exit %d\n", WEXITSTATUS(status));
    return 0;
}
