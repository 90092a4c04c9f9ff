// A program that lowers its own descriptor limit (RLIMIT_NOFILE, soft and hard, to argv[1])
// before its first CUDA call, then allocates. Untraced it succeeds while one descriptor is
// free (the runtime opens the driver with it); traced it must succeed the same way: the shim
// never takes the last descriptors the program needs. Exit 0 if cudaMalloc succeeded, 1 if not.
#include <sys/resource.h>
#include "scenario.h"

int main(int argc, char** argv) {
    rlim_t limit = argc > 1 ? (rlim_t)strtoull(argv[1], NULL, 10) : 4;
    struct rlimit rl = {limit, limit};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        perror("setrlimit");
        return 2;
    }
    void* p = NULL;
    cudaError_t err = cudaMalloc(&p, 1 * MiB);
    printf("fd_limit: cudaMalloc returned %d\n", (int)err);
    fflush(stdout);
    if (err != cudaSuccess) return 1;
    cudaFree(p);
    return 0;
}
