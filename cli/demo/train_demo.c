// The workload of `oomtrace demo`: a training-like loop on the simulated GPU.
//
// It has what real jobs have: weights allocated once, per-step activations and gradients that
// are freed again (plain and stream-ordered), a pinned staging buffer, an expandable segment
// grown page by page through the VMM API (obtained the way PyTorch does, through
// cudaGetDriverEntryPointByVersion), and one planted bug: keep_history() keeps every step's
// output alive, 16 MiB per step. Each step also computes for STEP_MS (a sleep), so the run lasts
// about 1.5 s and its rates read like a real job's. At the end an evaluation buffer no longer fits.
//
// Built without frame pointers on purpose: oomtrace recovers stacks by DWARF unwinding.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MiB (1024ull * 1024ull)
#define STEPS 24
// A step's compute time. Real training steps take tens of milliseconds to seconds; without a
// pause the whole loop ran in about a millisecond, and rates per second read as TiB/s.
#define STEP_MS 60

// On a device too small for the whole story (`oomtrace demo --device-memory` under about 1 GiB)
// an allocation runs out of memory before the end: the run stops there, successfully, and the
// report shows that out-of-memory error and what held the memory.
#define CHECK(call)                                                                   \
    do {                                                                              \
        cudaError_t err_ = (call);                                                    \
        if (err_ == cudaErrorMemoryAllocation) {                                      \
            printf("train_demo: %s: out of memory, the device is too small for the rest of the demo\n", #call); \
            exit(0);                                                                  \
        }                                                                             \
        if (err_ != cudaSuccess) {                                                    \
            fprintf(stderr, "train_demo: %s failed: %s\n", #call, cudaGetErrorString(err_)); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

typedef CUresult (*mem_create_fn)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                                  unsigned long long);
typedef CUresult (*mem_map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                               unsigned long long);
typedef CUresult (*addr_reserve_fn)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*addr_free_fn)(CUdeviceptr, size_t);

static struct {
    mem_create_fn create;
    mem_map_fn map;
    addr_reserve_fn reserve;
    unmap_fn unmap;
    release_fn release;
    addr_free_fn addr_free;
} vmm;

static void* driver_entry(const char* name) {
    void* fn = NULL;
    cudaDriverEntryPointQueryResult status;
    CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status));
    return fn;
}

// The leak: every step's output is appended to a history that nobody frees.
static void* history[STEPS];

__attribute__((noinline)) static void keep_history(int step) {
    CHECK(cudaMalloc(&history[step], 16 * MiB));
}

__attribute__((noinline)) static void* forward(size_t bytes) {
    void* act;
    CHECK(cudaMalloc(&act, bytes));
    return act;
}

__attribute__((noinline)) static void backward(cudaStream_t stream) {
    void* grad;
    CHECK(cudaMallocAsync(&grad, 32 * MiB, stream));
    CHECK(cudaFreeAsync(grad, stream));
}

__attribute__((noinline)) static void train_step(int step, cudaStream_t stream) {
    void* act = forward(64 * MiB);
    backward(stream);
    keep_history(step);
    CHECK(cudaFree(act));
    CHECK(cudaStreamSynchronize(stream));
}

// An expandable segment: reserve address space once, then map 2 MiB pages as it grows.
__attribute__((noinline)) static void grow_segment(CUdeviceptr base, CUmemGenericAllocationHandle* pages, int n) {
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    for (int i = 0; i < n; i++) {
        if (vmm.create(&pages[i], 2 * MiB, &prop, 0) != CUDA_SUCCESS ||
            vmm.map(base + i * 2 * MiB, 2 * MiB, 0, pages[i], 0) != CUDA_SUCCESS) {
            fprintf(stderr, "train_demo: growing the segment failed\n");
            exit(1);
        }
        vmm.release(pages[i]);  // stays alive while mapped, as in PyTorch
    }
}

__attribute__((noinline)) static cudaError_t evaluate(void** buffer) {
    return cudaMalloc(buffer, 3400 * MiB);
}

// The time a real step spends computing (kernels run while the host waits).
static void compute(void) {
    struct timespec left = {0, STEP_MS * 1000000L};
    while (nanosleep(&left, &left) == -1 && errno == EINTR) {
    }
}

int main(void) {
    void (*mark)(const char*) = (void (*)(const char*))dlsym(RTLD_DEFAULT, "oomtrace_mark");
    vmm.create = (mem_create_fn)driver_entry("cuMemCreate");
    vmm.map = (mem_map_fn)driver_entry("cuMemMap");
    vmm.reserve = (addr_reserve_fn)driver_entry("cuMemAddressReserve");
    vmm.unmap = (unmap_fn)driver_entry("cuMemUnmap");
    vmm.release = (release_fn)driver_entry("cuMemRelease");
    vmm.addr_free = (addr_free_fn)driver_entry("cuMemAddressFree");

    void* weights;
    CHECK(cudaMalloc(&weights, 512 * MiB));
    void* staging;
    CHECK(cudaMallocHost(&staging, 64 * MiB));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));

    CUdeviceptr segment;
    CUmemGenericAllocationHandle pages[16];
    if (vmm.reserve(&segment, 32 * MiB, 0, 0, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "train_demo: cannot reserve address space\n");
        return 1;
    }
    grow_segment(segment, pages, 16);

    for (int step = 0; step < STEPS; step++) {
        train_step(step, stream);
        compute();
        if (mark) mark("step");
    }
    printf("train_demo: %d steps done\n", STEPS);

    void* eval;
    cudaError_t err = evaluate(&eval);
    if (err == cudaSuccess) {
        printf("train_demo: evaluation buffer allocated\n");
        CHECK(cudaFree(eval));
    } else {
        printf("train_demo: evaluation buffer: %s (the history leak ate the room)\n", cudaGetErrorString(err));
    }

    vmm.unmap(segment, 32 * MiB);
    vmm.addr_free(segment, 32 * MiB);
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFreeHost(staging));
    CHECK(cudaFree(weights));
    return 0;
}
