// One rank of a simulated data-parallel job: the test starts several, with the launcher's
// variables set (RANK, or SLURM_PROCID, ...). Every rank holds 64 MiB of weights and makes and
// frees 32 MiB of activations in each of 20 steps (5 ms of "compute" each). Arguments pick
// what goes wrong, and where:
//   leak=R   rank R (or `all`) keeps 4 MiB per step (keep_history): +80 MiB over the run
//   heavy=R  rank R's activations are 4x larger (128 MiB): imbalance, no growth
//   oom=R    rank R asks for 1 TiB after its last step (out of memory)
//   oom_late=R  the same, 300 ms later
//   say_world=N  every rank says its rank with oomtrace_set_rank(rank, rank % 2, N) (N may be
//                any int, INT_MAX included: a hostile or garbled world size)
// Exits 0 whatever happens (a rank that ran out of memory carries on, as the test wants).
#include <string.h>
#include <time.h>
#include "scenario.h"

static int my_rank(void) {
    const char* names[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"};
    for (unsigned i = 0; i < sizeof names / sizeof *names; i++) {
        const char* v = getenv(names[i]);
        if (v) return atoi(v);
    }
    return 0;
}

// Whether argument `key=R` names this rank (or `key=all`).
static int picks(int argc, char** argv, const char* key, int rank) {
    size_t n = strlen(key);
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], key, n) == 0 && argv[i][n] == '=') {
            const char* v = argv[i] + n + 1;
            if (strcmp(v, "all") == 0 || atoi(v) == rank) return 1;
        }
    }
    return 0;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

__attribute__((noinline)) void* load_weights(void) {
    void* p;
    CHECK(cudaMalloc(&p, 64 * MiB));
    return p;
}

__attribute__((noinline)) void* forward(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

__attribute__((noinline)) void keep_history(void** kept, int step) {
    CHECK(cudaMalloc(&kept[step], 4 * MiB));
}

__attribute__((noinline)) cudaError_t grow_past_the_device(void** p) {
    return cudaMalloc(p, 1ull << 40);
}

// The value of argument `key=N`, or `otherwise`.
static long long arg_value(int argc, char** argv, const char* key, long long otherwise) {
    size_t n = strlen(key);
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], key, n) == 0 && argv[i][n] == '=') return atoll(argv[i] + n + 1);
    return otherwise;
}

int main(int argc, char** argv) {
    int rank = my_rank();
    long long world = arg_value(argc, argv, "say_world", -1);
    int leaks = picks(argc, argv, "leak", rank);
    int heavy = picks(argc, argv, "heavy", rank);
    int oom = picks(argc, argv, "oom", rank);
    int oom_late = picks(argc, argv, "oom_late", rank);
    void* weights = load_weights();
    if (world >= 0) {  // after the first CUDA call, as init_process_group comes after it
        int (*set_rank)(int, int, int) =
            (int (*)(int, int, int))dlsym(RTLD_DEFAULT, "oomtrace_set_rank");
        if (set_rank) set_rank(rank, rank % 2, (int)world);
    }
    void* kept[20];
    for (int step = 0; step < 20; step++) {
        step_mark("step");
        void* act = forward((heavy ? 128 : 32) * MiB);
        sleep_ms(5);
        if (leaks) keep_history(kept, step);
        CHECK(cudaFree(act));
    }
    if (oom || oom_late) {
        if (oom_late) sleep_ms(300);
        void* big;
        cudaError_t err = grow_past_the_device(&big);
        if (err == cudaSuccess) cudaFree(big);
        cudaGetLastError();
    }
    if (leaks)
        for (int step = 0; step < 20; step++) CHECK(cudaFree(kept[step]));
    CHECK(cudaFree(weights));
    printf("rank %d: done\n", rank);
    return 0;
}
