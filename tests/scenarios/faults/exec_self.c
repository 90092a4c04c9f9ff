// Image 1 allocates 2 MiB (before_exec) and 1 MiB freed again, then execv's itself with
// "after" (same pid, LD_PRELOAD and OOMTRACE_SOCKET inherited). Image 2 allocates 3 MiB
// (after_exec) and returns 4. With "flush" as argv[1], image 1 calls oomtrace_flush() first.
// Expected: image 1 live 2 MiB (2 allocations, 1 free), image 2 live 3 MiB, exit code 4.
#include <string.h>
#include <unistd.h>
#include "scenario.h"

__attribute__((noinline)) static void before_exec(void) {
    void* p;
    CHECK(cudaMalloc(&p, 2 * MiB));
}

__attribute__((noinline)) static void after_exec(void) {
    void* p;
    CHECK(cudaMalloc(&p, 3 * MiB));
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "after") == 0) {
        after_exec();
        printf("exec_self: after exec\n");
        return 4;
    }
    void* q;
    CHECK(cudaMalloc(&q, 1 * MiB));
    CHECK(cudaFree(q));
    before_exec();
    if (argc > 1 && strcmp(argv[1], "flush") == 0) {
        int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "oomtrace_flush");
        if (flush) flush();
    }
    printf("exec_self: exec\n");
    fflush(stdout);
    char* args[] = {argv[0], "after", NULL};
    execv("/proc/self/exe", args);
    perror("execv");
    return 1;
}
