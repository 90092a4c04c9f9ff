/*
 * What the driver's core areas share: the global state, its one mutex and
 * the helpers more than one area calls.  Included only by the files split
 * out of the core (core.c, vaspace.c, memory.c, pools.c, streams.c, vmm.c);
 * the other areas (copies.c, modules.c, events.c, ...) see none of this and
 * go through internal.h's sim_* calls.
 *
 * Internal: the library is built with -fvisibility=hidden, so nothing
 * declared here is exported from libcuda.so.1.  Never mark any of it EXPORT;
 * the exports are the thin EXPORT wrappers at the end of each file.
 *
 * Locking: one mutex, sim_lock() / sim_unlock() (core.c), guards all of the
 * state below.  Every variable and function declared here is for callers
 * that hold it (the *_locked functions of each area, and the impl_*
 * functions between their sim_lock() and sim_unlock()), except round_up and
 * legacy_not_supported, which takes the lock itself.
 *
 * Who owns what, and what the other areas may touch:
 *   core.c     configuration (g_cfg), initialization (g_init_state,
 *              REQUIRE_INIT), the devices (g_ndev, g_dev[]) and contexts
 *              (current_ctx, tls_top).  Every area reads these; a device's
 *              capacity and use change only through dev_charge/dev_uncharge.
 *              cuInit also sets up each device's window and default pool
 *              (pool_new) and the VMM window (g_vmm_va).  Destroying a
 *              context walks g_allocs (alloc_release) and g_streams
 *              (stream_release); synchronizing one trims the device's pools.
 *   vaspace.c  the treap (tn_*) every area keys its records by, and the
 *              address allocator (va_*) over the simulated windows.
 *   memory.c   g_allocs: device, managed and pool allocations (struct alloc).
 *              pools.c records and releases its own through alloc_record /
 *              alloc_release and looks addresses up in g_allocs;
 *              alloc_release gives a pool allocation back to its pool and
 *              finalizes a destroyed pool (pool_finalize).  Pinned host
 *              memory is memory.c's alone.
 *   pools.c    the pools (struct pool; the list of them is private).  Others
 *              only follow a device's default_pool/current_pool or an
 *              allocation's pool, and trim with trim_device_pools.
 *   streams.c  g_streams (struct stream) and the capture sequences (private).
 *              A memory call that capture may forbid asks capture_guard, or
 *              capture_guard_stream for a stream-ordered one, before it takes
 *              effect; stream_device names the device a stream works on.
 *   vmm.c      physical allocations (g_phys), mappings (g_maps) and
 *              reservations (private).  memory.c reads g_maps and g_phys to
 *              answer address-range and pointer-attribute queries.
 */
#ifndef SIMCUDA_DRIVER_CORE_H
#define SIMCUDA_DRIVER_CORE_H

#ifndef SIMCUDA_NO_V2_MACROS
#error "define SIMCUDA_NO_V2_MACROS before including core.h: the exports name the raw ABIs"
#endif

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

#define MAX_DEVICES 8

#define ALLOC_ROUND 512ull
#define VMM_GRANULARITY (2ull << 20)
#define POOL_CHUNK (2ull << 20)

/* Simulated address layout: one 2 TiB window per device for cuMemAlloc and
 * the pools, one 8 TiB window for cuMemAddressReserve.  All of it sits in the
 * 47-bit user half, well below where the kernel places mmaps. */
#define DEV_VA_BASE 0x600000000000ull
#define DEV_VA_SPAN 0x020000000000ull
#define VMM_VA_BASE 0x700000000000ull
#define VMM_VA_SPAN 0x080000000000ull

#define CHECK(expr)                   \
    do {                              \
        CUresult check_r_ = (expr);   \
        if (check_r_ != CUDA_SUCCESS) \
            return check_r_;          \
    } while (0)

static inline uint64_t round_up(uint64_t v, uint64_t align) /* align: power of two; 0 on overflow */
{
    if (v > UINT64_MAX - (align - 1))
        return 0;
    return (v + align - 1) & ~(align - 1);
}

/* ---- vaspace.c: ordered maps and the address-space allocator ----------------
 * A treap keyed by address, augmented with the largest `len` in each subtree.
 * Nodes are embedded as the first member of the records they index. */

struct tnode {
    uint64_t key, len, maxlen;
    uint32_t prio;
    struct tnode *l, *r;
};

void tn_insert(struct tnode **root, struct tnode *n);
struct tnode *tn_remove(struct tnode **root, uint64_t key);
struct tnode *tn_find(struct tnode *t, uint64_t key);
struct tnode *tn_find_le(struct tnode *t, uint64_t key); /* greatest key <= key */
struct tnode *tn_find_ge(struct tnode *t, uint64_t key); /* least key >= key */

/* Free extents; first fit by address, coalescing on free. */
struct vaspace {
    struct tnode *free;
};

int va_init(struct vaspace *vs, uint64_t base, uint64_t span);
/* The start of a fresh range, or 0; a free hint is honoured exactly. */
uint64_t va_alloc(struct vaspace *vs, uint64_t size, uint64_t align, uint64_t hint);
void va_free(struct vaspace *vs, uint64_t start, uint64_t size);
/* Claims a simulated window of the host's address space (cuInit). */
void reserve_host_range(uint64_t base, uint64_t span, int prot);
/* Gives the pages of freed device memory back to the host. */
void release_pages(uint64_t addr, uint64_t len);
/* Whether a host range overlaps the simulated windows. */
int in_simulated_range(uint64_t addr, uint64_t len);

/* ---- State -------------------------------------------------------------------- */

struct pool;

struct ctx {
    int dev;
    int primary;
    int active;        /* primary: retained and not released back to zero */
    unsigned refcount; /* primary only */
    unsigned flags;
    struct ctx *next;  /* g_ctxs, non-primary only */
};

struct device {
    uint64_t capacity, used; /* used: everything charged, contexts included */
    struct vaspace va;
    struct ctx primary;
    struct pool *default_pool, *current_pool;
};

struct pool {
    int dev, is_default, destroyed;
    uint64_t reserved, reserved_high; /* charged to the device, 2 MiB multiples */
    uint64_t used, used_high;         /* live allocations, rounded */
    uint64_t threshold, max_size;
    uint64_t live;
    int reuse[3];
    struct pool *next;
};

enum alloc_kind { AK_DEVICE, AK_MANAGED, AK_POOL };

struct alloc {
    struct tnode node; /* key: address; len: requested size */
    enum alloc_kind kind;
    int dev;
    struct ctx *ctx;
    uint64_t charged; /* rounded size: device capacity, pool usage, VA length */
    struct pool *pool;
    size_t map_len;   /* managed: host mapping length */
};

struct capture; /* streams.c */

struct stream {
    struct tnode node; /* key: the handle itself */
    struct ctx *ctx;
    unsigned flags;
    int priority;
    unsigned long long id;
    struct capture *cap; /* the capture sequence this stream is in, or NULL */
};

struct phys {
    uint64_t size;
    int fd; /* memfd holding the bytes: cuMemMap maps it, export hands out a dup */
    int dev;
    int in_use;
    unsigned refs; /* handle references: cuMemCreate, cuMemRetainAllocationHandle */
    unsigned maps; /* live cuMemMap mappings */
    uint32_t next_free;
};

struct mapping {
    struct tnode node; /* key: address; len: mapped size */
    uint32_t phys;
};

/* ---- core.c ------------------------------------------------------------------- */

struct sim_config {
    int devices;
    uint64_t memory, context_bytes, host_memory;
};

extern struct sim_config g_cfg;
extern int g_init_state; /* 0: cuInit not called, 1: ready, -1: failed */
extern int g_ndev;
extern struct device g_dev[MAX_DEVICES];

void sim_lock(void);
void sim_unlock(void);

#define REQUIRE_INIT()                         \
    do {                                       \
        if (g_init_state != 1)                 \
            return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

int dev_valid(CUdevice dev);
int dev_charge(struct device *d, uint64_t bytes);
void dev_uncharge(struct device *d, uint64_t bytes);
/* The calling thread's current context (top of its stack), or NULL. */
struct ctx *tls_top(void);
/* The current context if it is usable, else CUDA_ERROR_INVALID_CONTEXT. */
CUresult current_ctx(struct ctx **out);
/* What the first-generation 32-bit exports answer (takes the lock itself). */
CUresult legacy_not_supported(void);

/* ---- memory.c ----------------------------------------------------------------- */

extern struct tnode *g_allocs; /* struct alloc: device, managed and pool memory */

struct alloc *alloc_record(uint64_t addr, uint64_t size, enum alloc_kind kind, int dev,
                           struct ctx *c, uint64_t charged);
void alloc_release(struct alloc *a);

/* ---- pools.c ------------------------------------------------------------------ */

struct pool *pool_new(int dev, int is_default);
void pool_finalize(struct pool *p);
/* What cuStreamSynchronize / cuCtxSynchronize do to the pools of a device. */
void trim_device_pools(int dev);

/* ---- streams.c ---------------------------------------------------------------- */

extern struct tnode *g_streams; /* struct stream */

/* Called by every potentially unsafe call before it takes effect. */
CUresult capture_guard(void);
/* Stream-ordered allocator calls: part of the capture on a capturing
 * stream, unsafe (conservatively) on any other. */
CUresult capture_guard_stream(CUstream h);
/* The device a stream works on; the special handles mean the current one. */
CUresult stream_device(CUstream s, const struct ctx *cur, int *dev);
void stream_release(struct stream *s);

/* ---- vmm.c -------------------------------------------------------------------- */

extern struct tnode *g_maps;     /* struct mapping */
extern struct phys *g_phys;      /* indexed by struct mapping's phys */
extern struct vaspace g_vmm_va;  /* the cuMemAddressReserve window (set up by cuInit) */

#endif
