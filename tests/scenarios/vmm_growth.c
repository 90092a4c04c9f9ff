// VMM, as PyTorch's expandable segments and NCCL use it: reserve VA once, grow by creating and
// mapping 2 MiB pages, release handles while mapped (memory stays until unmapped), NCCL's
// retain+release free pattern, then shrink by unmapping part of it.
// Live at exit: 6 pages x 2 MiB = 12 MiB, all from grow_segment.
#include "scenario.h"

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*reserve_fn)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*retain_fn)(CUmemGenericAllocationHandle*, void*);
typedef CUresult (*access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);

static create_fn create;
static map_fn map;
static release_fn release;
static access_fn set_access;

#define PAGE (2 * MiB)

__attribute__((noinline)) void grow_segment(CUdeviceptr base, int from, int to) {
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemAccessDesc access = {0};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int i = from; i < to; i++) {
        CUmemGenericAllocationHandle h;
        CU_CHECK(create(&h, PAGE, &prop, 0));
        CU_CHECK(map(base + (CUdeviceptr)i * PAGE, PAGE, 0, h, 0));
        CU_CHECK(set_access(base + (CUdeviceptr)i * PAGE, PAGE, &access, 1));
        CU_CHECK(release(h));  // still mapped: still live
        step_mark("grow");
    }
}

int main(void) {
    CHECK(cudaFree(NULL));
    create = (create_fn)driver_entry("cuMemCreate", cudaEnableDefault);
    map = (map_fn)driver_entry("cuMemMap", cudaEnableDefault);
    release = (release_fn)driver_entry("cuMemRelease", cudaEnableDefault);
    set_access = (access_fn)driver_entry("cuMemSetAccess", cudaEnableDefault);
    reserve_fn reserve = (reserve_fn)driver_entry("cuMemAddressReserve", cudaEnableDefault);
    unmap_fn unmap = (unmap_fn)driver_entry("cuMemUnmap", cudaEnableDefault);
    retain_fn retain = (retain_fn)driver_entry("cuMemRetainAllocationHandle", cudaEnableDefault);

    CUdeviceptr base;
    CU_CHECK(reserve(&base, 64 * PAGE, 0, 0, 0));
    grow_segment(base, 0, 10);

    // NCCL's free pattern: retain the handle behind an address, release it twice.
    CUmemGenericAllocationHandle h;
    CU_CHECK(retain(&h, (void*)(base + 9 * PAGE)));
    CU_CHECK(release(h));
    // Shrink: unmap the last 4 pages (their handles were already released: memory goes).
    CU_CHECK(unmap(base + 6 * PAGE, 4 * PAGE));
    printf("vmm_growth: ok\n");
    return 0;
}
