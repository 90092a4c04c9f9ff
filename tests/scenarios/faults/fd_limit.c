// Lowers its own descriptor limit to argv[1] (default 3: only stdin, stdout and stderr), then
// makes its first CUDA calls: 100 allocate/free pairs. The driver is loaded before the limit
// is set (the runtime could not open it afterwards); the shim starts at the first call, with
// no descriptor to spare. Exits 0.
#include <sys/resource.h>
#include "scenario.h"

int main(int argc, char** argv) {
    if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
        fprintf(stderr, "fd_limit: cannot load libcuda.so.1: %s\n", dlerror());
        return 80;
    }
    struct rlimit rl;
    rl.rlim_cur = rl.rlim_max = argc > 1 ? (rlim_t)atoi(argv[1]) : 3;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        perror("fd_limit: setrlimit");
        return 81;
    }
    for (int i = 0; i < 100; i++) {
        void* p;
        CHECK(cudaMalloc(&p, MiB));
        CHECK(cudaFree(p));
    }
    printf("fd_limit: ok\n");
    return 0;
}
