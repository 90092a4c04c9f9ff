// Ground truth: LEAK at grow_segment(), onset step 0, 2 MiB per step (one VMM page per step).
// Like an expandable segment that only grows: a VA range is reserved once with
// cuMemAddressReserve, and every step grow_segment() cuMemCreate's a 2 MiB page (the VMM
// granularity), cuMemMap's it at the next offset and cuMemSetAccess'es it. Pages are never
// unmapped or released. The rest of the loop uses cudaMalloc as usual.
// Live at exit: steps x 2 MiB of mapped pages from grow_segment (120 MiB with 60 steps).
#include "corpus.h"

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*reserve_fn)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
typedef CUresult (*gran_fn)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);

static create_fn create;
static map_fn map;
static access_fn set_access;
static CUmemAllocationProp prop;
static size_t page;

__attribute__((noinline)) void grow_segment(CUdeviceptr base, int index) {
    CUmemAccessDesc access = {0};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUmemGenericAllocationHandle h;  // never released nor unmapped: the page stays live
    CU_CHECK(create(&h, page, &prop, 0));
    CU_CHECK(map(base + (CUdeviceptr)index * page, page, 0, h, 0));
    CU_CHECK(set_access(base + (CUdeviceptr)index * page, page, &access, 1));
}

int main(void) {
    CHECK(cudaFree(NULL));
    create = (create_fn)driver_entry("cuMemCreate", cudaEnableDefault);
    map = (map_fn)driver_entry("cuMemMap", cudaEnableDefault);
    set_access = (access_fn)driver_entry("cuMemSetAccess", cudaEnableDefault);
    reserve_fn reserve = (reserve_fn)driver_entry("cuMemAddressReserve", cudaEnableDefault);
    gran_fn granularity = (gran_fn)driver_entry("cuMemGetAllocationGranularity", cudaEnableDefault);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CU_CHECK(granularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    if (page < 2 * MiB) page = 2 * MiB;  // simcuda: exactly 2 MiB

    int steps = corpus_steps();
    size_t va = (size_t)steps * page > 1024 * MiB ? (size_t)steps * page : 1024 * MiB;
    CUdeviceptr base;
    CU_CHECK(reserve(&base, va, 0, 0, 0));

    Model m;
    model_init(&m);
    for (int s = 0; s < steps; s++) {
        load_batch(&m);
        forward(&m);
        grow_segment(base, s);  // never unmapped
        backward(&m);
        optimizer_step(&m, s);
        zero_grad(&m);
        corpus_end_step(s);
    }
    model_free(&m);
    printf("leak_vmm: ok\n");
    return 0;
}
