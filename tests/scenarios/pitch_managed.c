// Pitched and managed allocations, through the runtime and the driver (entry point).
// Live at exit (device 0): keep_pitched cudaMallocPitch 1000 x 100 -> pitch 1024 -> 102400 B;
// keep_pitched_driver cuMemAllocPitch_v2 3000 x 10 (elem 4) -> pitch 3072 -> 30720 B;
// keep_managed cudaMallocManaged 1 MiB (written from the host: it is host-accessible).
#include <string.h>
#include "scenario.h"

typedef CUresult (*pitch_fn)(CUdeviceptr*, size_t*, size_t, size_t, unsigned int);

__attribute__((noinline)) void keep_pitched(void) {
    void* p;
    size_t pitch = 0;
    CHECK(cudaMallocPitch(&p, &pitch, 1000, 100));
    if (pitch != 1024) exit(6);
}

__attribute__((noinline)) void keep_pitched_driver(void) {
    pitch_fn f = (pitch_fn)driver_entry("cuMemAllocPitch", cudaEnableDefault);
    CUdeviceptr p;
    size_t pitch = 0;
    CU_CHECK(f(&p, &pitch, 3000, 10, 4));
    if (pitch != 3072) exit(7);
}

__attribute__((noinline)) void keep_managed(void) {
    void* p;
    CHECK(cudaMallocManaged(&p, 1 * MiB, cudaMemAttachGlobal));
    memset(p, 0, 1 * MiB);
}

int main(void) {
    keep_pitched();
    keep_pitched_driver();
    keep_managed();
    printf("pitch_managed: ok\n");
    return 0;
}
