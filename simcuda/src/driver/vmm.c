/*
 * Virtual memory management: cuMemCreate, cuMemRelease,
 * cuMemRetainAllocationHandle, cuMemAddressReserve/AddressFree, cuMemMap/
 * Unmap, cuMemSetAccess/GetAccess, cuMemGetAllocationGranularity,
 * cuMemGetAllocationPropertiesFromHandle and sharing as a POSIX file
 * descriptor (cuMemExportToShareableHandle/ImportFromShareableHandle), with
 * the physical allocations (g_phys), mappings (g_maps) and reservations.
 * PyTorch's expandable segments grow and shrink their memory this way, so
 * a memory tracer must see reservation, mapping and physical memory as a
 * real driver reports them.
 *
 * Where simcuda differs from the real driver
 * ------------------------------------------
 *  - Physical memory is a memfd: cuMemMap maps it into the reservation,
 *    whose pages are PROT_NONE until then, so device memory is host memory
 *    at the same address (and the same memory can be mapped twice).
 *  - Accounting is exact and simple: the granularity is 2 MiB and
 *    cuMemCreate charges exactly its size to the device.
 *  - cuMemMap accepts only offset 0 (as the real one documents) and
 *    cuMemAddressFree refuses a range that still has mappings.
 *  - Only POSIX file descriptors can be shared; a descriptor from elsewhere
 *    is imported as new physical memory on device 0.
 *  - VMM calls are not checked against stream capture (streams.c).
 */
#define _GNU_SOURCE
#define SIMCUDA_NO_V2_MACROS
#include "core.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Allocation handles are opaque: a tag in the top byte and a slot index. */
#define HANDLE_TAG 0x5100000000000000ull
#define HANDLE_STRIDE 0x10ull

static struct tnode *g_resv; /* VMM reservations (bare tnodes) */
struct tnode *g_maps;        /* struct mapping */
struct vaspace g_vmm_va;
struct phys *g_phys;
static uint32_t g_nphys, g_phys_cap, g_phys_free = UINT32_MAX;

/* ---- Virtual memory management ------------------------------------------------------ */

static int prop_valid(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && dev_valid(prop->location.id);
}

static CUresult granularity_locked(size_t *granularity, const CUmemAllocationProp *prop,
                                   CUmemAllocationGranularity_flags option)
{
    REQUIRE_INIT();
    if (!granularity || !prop_valid(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                 CUmemAllocationGranularity_flags option)
{
    sim_lock();
    CUresult r = granularity_locked(granularity, prop, option);
    sim_unlock();
    return r;
}

static struct phys *phys_lookup(CUmemGenericAllocationHandle h)
{
    if ((h & 0xff00000000000000ull) != HANDLE_TAG || (h & (HANDLE_STRIDE - 1)))
        return NULL;
    uint64_t slot = ((h & ~0xff00000000000000ull) / HANDLE_STRIDE) - 1;
    if (slot >= g_nphys || !g_phys[slot].in_use)
        return NULL;
    return &g_phys[slot];
}

static CUmemGenericAllocationHandle phys_handle(const struct phys *ph)
{
    return HANDLE_TAG | ((uint64_t)(ph - g_phys) + 1) * HANDLE_STRIDE;
}

/* Physical memory lives while a handle reference or a mapping uses it.  Its
 * slot (and so its handle value) is the first to be reused, as real handles
 * are. */
static void phys_maybe_free(struct phys *ph)
{
    if (ph->refs || ph->maps)
        return;
    dev_uncharge(&g_dev[ph->dev], ph->size);
    if (ph->fd >= 0)
        close(ph->fd);
    ph->fd = -1;
    ph->in_use = 0;
    ph->next_free = g_phys_free;
    g_phys_free = (uint32_t)(ph - g_phys);
}

static CUresult mem_create_locked(CUmemGenericAllocationHandle *handle, size_t size,
                                  const CUmemAllocationProp *prop, unsigned long long flags)
{
    REQUIRE_INIT();
    if (!handle || !prop_valid(prop) || flags != 0 || size == 0 || size % VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t slot = g_phys_free;
    if (slot == UINT32_MAX) {
        if (g_nphys == g_phys_cap) {
            uint32_t cap = g_phys_cap ? g_phys_cap * 2 : 64;
            struct phys *grown = realloc(g_phys, cap * sizeof *grown);
            if (!grown)
                return CUDA_ERROR_OUT_OF_MEMORY;
            g_phys = grown;
            g_phys_cap = cap;
        }
        slot = g_nphys;
    }
    struct device *d = &g_dev[prop->location.id];
    if (!dev_charge(d, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* The bytes: a memfd, so that cuMemMap can map the same memory at any
     * address (and more than once) and export can share it as a POSIX file
     * descriptor.  Out of descriptors or memory is out of memory. */
    int fd = memfd_create("simcuda-vmm", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        dev_uncharge(d, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (slot == g_nphys)
        g_nphys++;
    else
        g_phys_free = g_phys[slot].next_free;
    struct phys *ph = &g_phys[slot];
    memset(ph, 0, sizeof *ph);
    ph->fd = fd;
    ph->size = size;
    ph->dev = prop->location.id;
    ph->in_use = 1;
    ph->refs = 1;
    *handle = phys_handle(ph);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags)
{
    sim_lock();
    CUresult r = mem_create_locked(handle, size, prop, flags);
    sim_unlock();
    return r;
}

static CUresult mem_release_locked(CUmemGenericAllocationHandle handle)
{
    REQUIRE_INIT();
    struct phys *ph = phys_lookup(handle);
    if (!ph || ph->refs == 0)
        return CUDA_ERROR_INVALID_VALUE;
    ph->refs--;
    phys_maybe_free(ph); /* releasing while mapped is legal: the mapping keeps it */
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemRelease(CUmemGenericAllocationHandle handle)
{
    sim_lock();
    CUresult r = mem_release_locked(handle);
    sim_unlock();
    return r;
}

static struct mapping *mapping_at(uint64_t addr)
{
    struct tnode *n = tn_find_le(g_maps, addr);
    return n && addr - n->key < n->len ? (struct mapping *)n : NULL;
}

static CUresult retain_handle_locked(CUmemGenericAllocationHandle *handle, void *addr)
{
    REQUIRE_INIT();
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    struct mapping *m = mapping_at((uint64_t)(uintptr_t)addr);
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    struct phys *ph = &g_phys[m->phys];
    ph->refs++;
    *handle = phys_handle(ph);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    sim_lock();
    CUresult r = retain_handle_locked(handle, addr);
    sim_unlock();
    return r;
}

static CUresult address_reserve_locked(CUdeviceptr *ptr, size_t size, size_t alignment,
                                       CUdeviceptr addr, unsigned long long flags)
{
    REQUIRE_INIT();
    if (!ptr || size == 0 || size % VMM_GRANULARITY || flags != 0 ||
        (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment < VMM_GRANULARITY)
        alignment = VMM_GRANULARITY;
    struct tnode *r = calloc(1, sizeof *r);
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t start = va_alloc(&g_vmm_va, size, alignment, addr);
    if (!start) {
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->key = start;
    r->len = size;
    tn_insert(&g_resv, r);
    *ptr = start;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                       CUdeviceptr addr, unsigned long long flags)
{
    sim_lock();
    CUresult r = address_reserve_locked(ptr, size, alignment, addr, flags);
    sim_unlock();
    return r;
}

static CUresult address_free_locked(CUdeviceptr ptr, size_t size)
{
    REQUIRE_INIT();
    struct tnode *r = tn_find(g_resv, ptr);
    if (!r || r->len != size)
        return CUDA_ERROR_INVALID_VALUE;
    struct tnode *m = tn_find_ge(g_maps, ptr);
    if (m && m->key < ptr + size)
        return CUDA_ERROR_INVALID_VALUE; /* still mapped: cuMemUnmap first */
    tn_remove(&g_resv, ptr);
    va_free(&g_vmm_va, ptr, size);
    free(r);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    sim_lock();
    CUresult r = address_free_locked(ptr, size);
    sim_unlock();
    return r;
}

static CUresult mem_map_locked(CUdeviceptr ptr, size_t size, size_t offset,
                               CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    REQUIRE_INIT();
    struct phys *ph = phys_lookup(handle);
    if (!ph || ph->refs == 0 || flags != 0 || size == 0 || size % VMM_GRANULARITY ||
        ptr % VMM_GRANULARITY || ptr > UINT64_MAX - size)
        return CUDA_ERROR_INVALID_VALUE;
    if (offset != 0 || size > ph->size) /* the documented rule: offset must be 0 */
        return CUDA_ERROR_INVALID_VALUE;
    struct tnode *r = tn_find_le(g_resv, ptr);
    if (!r || ptr + size > r->key + r->len)
        return CUDA_ERROR_INVALID_VALUE; /* not inside one reservation */
    struct tnode *prev = tn_find_le(g_maps, ptr + size - 1);
    if (prev && prev->key + prev->len > ptr)
        return CUDA_ERROR_INVALID_VALUE; /* overlaps a mapping */
    struct mapping *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* Device memory is host memory at the same address: the reservation's
     * PROT_NONE pages are replaced by the physical memory's. */
    if (mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, ph->fd,
             0) == MAP_FAILED) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->node.key = ptr;
    m->node.len = size;
    m->phys = (uint32_t)(ph - g_phys);
    tn_insert(&g_maps, &m->node);
    ph->maps++;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    sim_lock();
    CUresult r = mem_map_locked(ptr, size, offset, handle, flags);
    sim_unlock();
    return r;
}

/* The range must cover whole mappings: a mapping cannot be split. */
static CUresult mem_unmap_locked(CUdeviceptr ptr, size_t size)
{
    REQUIRE_INIT();
    if (size == 0 || ptr > UINT64_MAX - size)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t end = ptr + size;
    struct tnode *n = tn_find_le(g_maps, ptr);
    if (n && n->key < ptr && n->key + n->len > ptr)
        return CUDA_ERROR_INVALID_VALUE;
    int found = 0;
    for (n = tn_find_ge(g_maps, ptr); n && n->key < end; n = tn_find_ge(g_maps, n->key + 1)) {
        if (n->key + n->len > end)
            return CUDA_ERROR_INVALID_VALUE;
        found = 1;
    }
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    while ((n = tn_find_ge(g_maps, ptr)) && n->key < end) {
        struct mapping *m = (struct mapping *)tn_remove(&g_maps, n->key);
        struct phys *ph = &g_phys[m->phys];
        mmap((void *)(uintptr_t)m->node.key, m->node.len, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        ph->maps--;
        phys_maybe_free(ph);
        free(m);
    }
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    sim_lock();
    CUresult r = mem_unmap_locked(ptr, size);
    sim_unlock();
    return r;
}

static CUresult mem_set_access_locked(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                      size_t count)
{
    REQUIRE_INIT();
    if (!desc || count == 0 || size == 0 || ptr > UINT64_MAX - size)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !dev_valid(desc[i].location.id))
            return CUDA_ERROR_INVALID_VALUE;
        if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    /* Every byte of the range must be mapped. */
    uint64_t at = ptr, end = ptr + size;
    while (at < end) {
        struct mapping *m = mapping_at(at);
        if (!m)
            return CUDA_ERROR_INVALID_VALUE;
        at = m->node.key + m->node.len;
    }
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                  size_t count)
{
    sim_lock();
    CUresult r = mem_set_access_locked(ptr, size, desc, count);
    sim_unlock();
    return r;
}

/* ---- Sharing physical memory as a POSIX file descriptor ---- */

#define HANDLE_TYPE_POSIX_FD 0x1 /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */

IMPL CUresult impl_cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle handle,
                                                int type, unsigned long long flags)
{
    if (!out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != HANDLE_TYPE_POSIX_FD)
        return CUDA_ERROR_NOT_SUPPORTED;
    sim_lock();
    struct phys *ph = g_init_state == 1 ? phys_lookup(handle) : NULL;
    int fd = ph && ph->refs ? fcntl(ph->fd, F_DUPFD_CLOEXEC, 0) : -2;
    sim_unlock();
    if (fd == -2)
        return CUDA_ERROR_INVALID_VALUE;
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

/* Importing memory this process already has gives its handle another
 * reference (the real driver returns the same handle too); a descriptor from
 * elsewhere becomes new physical memory of the file's size on device 0. */
IMPL CUresult impl_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                  void *os_handle, int type)
{
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != HANDLE_TYPE_POSIX_FD)
        return CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)os_handle;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        (uint64_t)st.st_size % VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = g_init_state == 1 ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    for (uint32_t i = 0; r == CUDA_SUCCESS && i < g_nphys; i++) {
        struct stat mine;
        struct phys *ph = &g_phys[i];
        if (ph->in_use && ph->refs && fstat(ph->fd, &mine) == 0 && mine.st_ino == st.st_ino &&
            mine.st_dev == st.st_dev) {
            ph->refs++;
            *handle = phys_handle(ph);
            sim_unlock();
            return CUDA_SUCCESS;
        }
    }
    if (r == CUDA_SUCCESS) {
        CUmemAllocationProp prop = {0};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        r = mem_create_locked(handle, (size_t)st.st_size, &prop, 0);
        struct phys *ph = r == CUDA_SUCCESS ? phys_lookup(*handle) : NULL;
        int dup = ph ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
        if (ph && dup >= 0) {
            close(ph->fd);
            ph->fd = dup;
        }
    }
    sim_unlock();
    return r;
}

IMPL CUresult impl_cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                          CUmemGenericAllocationHandle handle)
{
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    struct phys *ph = g_init_state == 1 ? phys_lookup(handle) : NULL;
    if (ph) {
        memset(prop, 0, sizeof *prop);
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = ph->dev;
        prop->requestedHandleTypes = HANDLE_TYPE_POSIX_FD;
    }
    sim_unlock();
    return ph ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

IMPL CUresult impl_cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                                  CUdeviceptr ptr)
{
    if (!flags || !location)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    int mapped = g_init_state == 1 && mapping_at(ptr) != NULL;
    sim_unlock();
    if (!mapped)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress entries (core.c searches this table after its own) ---- */

const struct sim_proc sim_procs_vmm[] = {
    {"cuMemGetAllocationGranularity", 10020, (void *)impl_cuMemGetAllocationGranularity, NULL},
    {"cuMemCreate", 10020, (void *)impl_cuMemCreate, NULL},
    {"cuMemRelease", 10020, (void *)impl_cuMemRelease, NULL},
    {"cuMemAddressReserve", 10020, (void *)impl_cuMemAddressReserve, NULL},
    {"cuMemAddressFree", 10020, (void *)impl_cuMemAddressFree, NULL},
    {"cuMemMap", 10020, (void *)impl_cuMemMap, NULL},
    {"cuMemUnmap", 10020, (void *)impl_cuMemUnmap, NULL},
    {"cuMemSetAccess", 10020, (void *)impl_cuMemSetAccess, NULL},
    {"cuMemRetainAllocationHandle", 11000, (void *)impl_cuMemRetainAllocationHandle, NULL},
    {"cuMemExportToShareableHandle", 10020, (void *)impl_cuMemExportToShareableHandle, NULL},
    {"cuMemImportFromShareableHandle", 10020, (void *)impl_cuMemImportFromShareableHandle, NULL},
    {"cuMemGetAllocationPropertiesFromHandle", 10020,
     (void *)impl_cuMemGetAllocationPropertiesFromHandle, NULL},
    {"cuMemGetAccess", 10020, (void *)impl_cuMemGetAccess, NULL},
};
const size_t sim_nprocs_vmm = sizeof sim_procs_vmm / sizeof sim_procs_vmm[0];

/* ---- Exports ------------------------------------------------------------------------------
 * Thin wrappers only: internal code never calls these. */

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option) { return impl_cuMemGetAllocationGranularity(granularity, prop, option); }
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) { return impl_cuMemCreate(handle, size, prop, flags); }
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return impl_cuMemRelease(handle); }
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) { return impl_cuMemRetainAllocationHandle(handle, addr); }
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) { return impl_cuMemAddressReserve(ptr, size, alignment, addr, flags); }
EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) { return impl_cuMemAddressFree(ptr, size); }
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags) { return impl_cuMemMap(ptr, size, offset, handle, flags); }
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) { return impl_cuMemUnmap(ptr, size); }
EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) { return impl_cuMemSetAccess(ptr, size, desc, count); }
EXPORT CUresult cuMemExportToShareableHandle(void *o, CUmemGenericAllocationHandle h, int t, unsigned long long f) { return impl_cuMemExportToShareableHandle(o, h, t, f); }
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *o, int t) { return impl_cuMemImportFromShareableHandle(h, o, t); }
EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *p, CUmemGenericAllocationHandle h) { return impl_cuMemGetAllocationPropertiesFromHandle(p, h); }
EXPORT CUresult cuMemGetAccess(unsigned long long *f, const CUmemLocation *l, CUdeviceptr p) { return impl_cuMemGetAccess(f, l, p); }
