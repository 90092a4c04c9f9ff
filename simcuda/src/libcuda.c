/*
 * libcuda.so.1 from simcuda: a simulated CUDA 13.2 driver, so that a GPU
 * memory tracer can be tested without a GPU, against real clients (the real
 * PyTorch wheel among them).  This file is the core: devices, contexts,
 * device / managed / pinned memory, streams, the stream-ordered allocator,
 * virtual memory management, stream capture and cuGetProcAddress, with the
 * real ABI and real error codes.  The other areas live in src/driver/ (see
 * driver/internal.h).
 *
 * Where simcuda differs from the real driver
 * ------------------------------------------
 *  - Device memory is host memory at the same address: each device's window
 *    is mapped readable and writable (MAP_NORESERVE), so copies are memmove.
 *    The VMM window stays PROT_NONE except where cuMemMap maps a physical
 *    allocation (a memfd) into it.
 *  - Kernels do nothing and every stream is always idle, so stream-ordered
 *    operations take effect at once; stream and context synchronization only
 *    matter for pool trimming.
 *  - Accounting is exact and simple: allocations are rounded up to 512 bytes,
 *    a context costs SIMCUDA_CONTEXT_BYTES, pools reserve in 2 MiB steps and
 *    the VMM granularity is 2 MiB.  A real driver rounds more coarsely,
 *    fragments, and keeps memory of its own.
 *  - One mutex serialises every call.
 *  - cuGetProcAddress knows the functions in the tables (with their real
 *    introduction versions); any other real CUDA function is found and
 *    answers CUDA_ERROR_NOT_SUPPORTED (driver/unsupported.c); anything else
 *    is "not found".
 *  - The first-generation exports with 32-bit pointers or sizes (cuMemAlloc,
 *    cuMemFree, cuMemGetInfo, ...) answer CUDA_ERROR_NOT_SUPPORTED.
 *  - Destroying a context frees the device memory allocated in it (stream-
 *    ordered allocations included) but leaves pinned host memory alone.
 *  - cuMemMap accepts only offset 0 (as the real one documents) and
 *    cuMemAddressFree refuses a range that still has mappings.
 *  - Device attributes describe an H100 SXM5 (identity.h); unknown attributes
 *    are CUDA_ERROR_INVALID_VALUE.
 *  - Stream capture enforces the capture-mode rules on the memory calls but
 *    records nothing: see "Stream capture" below for where it differs.
 */
#define _GNU_SOURCE
#define SIMCUDA_NO_V2_MACROS
#include "cuda.h"
#include "identity.h"
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MAX_DEVICES 8
#define CTX_STACK_MAX 64

#define ALLOC_ROUND 512ull
#define VMM_GRANULARITY (2ull << 20)
#define POOL_CHUNK (2ull << 20)
#define MAX_CAPACITY (1ull << 40)

/* Simulated address layout: one 2 TiB window per device for cuMemAlloc and
 * the pools, one 8 TiB window for cuMemAddressReserve.  All of it sits in the
 * 47-bit user half, well below where the kernel places mmaps. */
#define DEV_VA_BASE 0x600000000000ull
#define DEV_VA_SPAN 0x020000000000ull
#define VMM_VA_BASE 0x700000000000ull
#define VMM_VA_SPAN 0x080000000000ull

/* Allocation handles are opaque: a tag in the top byte and a slot index. */
#define HANDLE_TAG 0x5100000000000000ull
#define HANDLE_STRIDE 0x10ull

#define CHECK(expr)                   \
    do {                              \
        CUresult check_r_ = (expr);   \
        if (check_r_ != CUDA_SUCCESS) \
            return check_r_;          \
    } while (0)

static uint64_t round_up(uint64_t v, uint64_t align) /* align: power of two; 0 on overflow */
{
    if (v > UINT64_MAX - (align - 1))
        return 0;
    return (v + align - 1) & ~(align - 1);
}

/* ---- Ordered maps ----------------------------------------------------------
 * A treap keyed by address, augmented with the largest `len` in each subtree
 * so that free-space lists answer first-fit in logarithmic time.  Nodes are
 * embedded as the first member of the records they index. */

struct tnode {
    uint64_t key, len, maxlen;
    uint32_t prio;
    struct tnode *l, *r;
};

static uint32_t g_prio_state = 0x9e3779b9u;

static uint32_t next_prio(void)
{
    uint32_t x = g_prio_state; /* xorshift32; only balance depends on it */
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return g_prio_state = x;
}

static void tn_update(struct tnode *t)
{
    uint64_t m = t->len;
    if (t->l && t->l->maxlen > m)
        m = t->l->maxlen;
    if (t->r && t->r->maxlen > m)
        m = t->r->maxlen;
    t->maxlen = m;
}

/* Splits t into keys < key (*a) and keys >= key (*b). */
static void tn_split(struct tnode *t, uint64_t key, struct tnode **a, struct tnode **b)
{
    if (!t) {
        *a = *b = NULL;
    } else if (t->key < key) {
        tn_split(t->r, key, &t->r, b);
        *a = t;
        tn_update(t);
    } else {
        tn_split(t->l, key, a, &t->l);
        *b = t;
        tn_update(t);
    }
}

static struct tnode *tn_merge(struct tnode *a, struct tnode *b)
{
    if (!a)
        return b;
    if (!b)
        return a;
    if (a->prio > b->prio) {
        a->r = tn_merge(a->r, b);
        tn_update(a);
        return a;
    }
    b->l = tn_merge(a, b->l);
    tn_update(b);
    return b;
}

static void tn_insert(struct tnode **root, struct tnode *n)
{
    struct tnode *a, *b;
    n->l = n->r = NULL;
    n->prio = next_prio();
    tn_update(n);
    tn_split(*root, n->key, &a, &b);
    *root = tn_merge(tn_merge(a, n), b);
}

static struct tnode *tn_remove(struct tnode **root, uint64_t key)
{
    struct tnode *a, *b, *m, *c;
    tn_split(*root, key, &a, &b);
    tn_split(b, key + 1, &m, &c);
    *root = tn_merge(a, c);
    return m;
}

static struct tnode *tn_find(struct tnode *t, uint64_t key)
{
    while (t && t->key != key)
        t = key < t->key ? t->l : t->r;
    return t;
}

static struct tnode *tn_find_le(struct tnode *t, uint64_t key) /* greatest key <= key */
{
    struct tnode *best = NULL;
    while (t) {
        if (t->key <= key) {
            best = t;
            t = t->r;
        } else {
            t = t->l;
        }
    }
    return best;
}

static struct tnode *tn_find_ge(struct tnode *t, uint64_t key) /* least key >= key */
{
    struct tnode *best = NULL;
    while (t) {
        if (t->key >= key) {
            best = t;
            t = t->l;
        } else {
            t = t->r;
        }
    }
    return best;
}

/* ---- Address-space allocator -----------------------------------------------
 * Free extents in a treap; first fit by address, coalescing on free, so a
 * freed range is handed out again by the next request that fits. */

struct vaspace {
    struct tnode *free;
};

static int va_init(struct vaspace *vs, uint64_t base, uint64_t span)
{
    struct tnode *n = calloc(1, sizeof *n);
    if (!n)
        return 0;
    n->key = base;
    n->len = span;
    vs->free = NULL;
    tn_insert(&vs->free, n);
    return 1;
}

static struct tnode *va_first_fit(struct tnode *t, uint64_t size, uint64_t align, uint64_t *start)
{
    if (!t || t->maxlen < size)
        return NULL;
    struct tnode *hit = va_first_fit(t->l, size, align, start);
    if (hit)
        return hit;
    if (t->len >= size) {
        uint64_t s = round_up(t->key, align);
        if (s && s - t->key <= t->len - size) {
            *start = s;
            return t;
        }
    }
    return va_first_fit(t->r, size, align, start);
}

/* Takes [start, start+size) out of free extent blk. */
static int va_carve(struct vaspace *vs, struct tnode *blk, uint64_t start, uint64_t size)
{
    uint64_t bstart = blk->key, bend = blk->key + blk->len, end = start + size;
    struct tnode *right = NULL;
    if (end < bend) {
        right = calloc(1, sizeof *right);
        if (!right)
            return 0;
    }
    tn_remove(&vs->free, bstart);
    if (start > bstart) {
        blk->len = start - bstart;
        tn_insert(&vs->free, blk);
    } else {
        free(blk);
    }
    if (right) {
        right->key = end;
        right->len = bend - end;
        tn_insert(&vs->free, right);
    }
    return 1;
}

/* Returns the start of a fresh range, or 0.  A non-zero hint is honoured
 * when that exact range is free, as cuMemAddressReserve's addr is. */
static uint64_t va_alloc(struct vaspace *vs, uint64_t size, uint64_t align, uint64_t hint)
{
    uint64_t start = 0;
    struct tnode *blk = NULL;
    if (hint && hint % align == 0 && hint <= UINT64_MAX - size) {
        blk = tn_find_le(vs->free, hint);
        if (blk && hint + size <= blk->key + blk->len)
            start = hint;
        else
            blk = NULL;
    }
    if (!blk)
        blk = va_first_fit(vs->free, size, align, &start);
    if (!blk || !va_carve(vs, blk, start, size))
        return 0;
    return start;
}

static void va_free(struct vaspace *vs, uint64_t start, uint64_t size)
{
    struct tnode *n = NULL;
    struct tnode *pred = tn_find_le(vs->free, start);
    struct tnode *succ = tn_find_ge(vs->free, start);
    if (pred && pred->key + pred->len == start) {
        n = tn_remove(&vs->free, pred->key);
        n->len += size;
    }
    if (succ && start + size == succ->key) {
        struct tnode *s = tn_remove(&vs->free, succ->key);
        if (n) {
            n->len += s->len;
            free(s);
        } else {
            n = s;
            n->key = start;
            n->len += size;
        }
    }
    if (!n) {
        n = calloc(1, sizeof *n);
        if (!n)
            return; /* leaks the range; only under host OOM */
        n->key = start;
        n->len = size;
    }
    tn_insert(&vs->free, n);
}

/* Claims a simulated range of the host's address space, so device addresses
 * never alias host memory.  The device windows are readable and writable
 * (device memory is host memory at the same address, so copies are memmove
 * and a host dereference works); the VMM window stays PROT_NONE until
 * cuMemMap maps physical memory into it.  MAP_NORESERVE: only pages touched
 * cost anything.  Best effort: if the kernel refuses, the range is still
 * unique to simcuda. */
static void reserve_host_range(uint64_t base, uint64_t span, int prot)
{
    void *p = mmap((void *)(uintptr_t)base, span, prot,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED && (uint64_t)(uintptr_t)p != base)
        munmap(p, span); /* an old kernel treated the address as a hint */
}

/* Gives the pages of freed device memory back to the host (the range stays
 * mapped and reads as zeros), so a long run's footprint follows its live
 * device memory, not its peak. */
static void release_pages(uint64_t addr, uint64_t len)
{
    uint64_t page = 4096, lo = (addr + page - 1) & ~(page - 1), hi = (addr + len) & ~(page - 1);
    if (hi > lo)
        madvise((void *)(uintptr_t)lo, hi - lo, MADV_DONTNEED);
}

static int in_simulated_range(uint64_t addr, uint64_t len)
{
    uint64_t lo = DEV_VA_BASE, hi = VMM_VA_BASE + VMM_VA_SPAN;
    return addr < hi && addr + len > lo;
}

/* ---- State --------------------------------------------------------------- */

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

struct host_alloc {
    struct tnode node; /* key: host address; len: requested size */
    size_t map_len;
};

struct capture;

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

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    int devices;
    uint64_t memory, context_bytes, host_memory;
} g_cfg;

static int g_init_state; /* 0: cuInit not called, 1: ready, -1: failed */
static CUresult g_init_result;
static int g_ndev;
static struct device g_dev[MAX_DEVICES];
static struct ctx *g_ctxs;
static struct pool *g_pools;
static struct tnode *g_allocs;  /* struct alloc: device, managed and pool memory */
static struct tnode *g_host;    /* struct host_alloc */
static struct tnode *g_streams; /* struct stream */
static struct tnode *g_resv;    /* VMM reservations (bare tnodes) */
static struct tnode *g_maps;    /* struct mapping */
static struct vaspace g_vmm_va;
static uint64_t g_host_used;
static struct phys *g_phys;
static uint32_t g_nphys, g_phys_cap, g_phys_free = UINT32_MAX;

static __thread struct ctx *tls_stack[CTX_STACK_MAX];
static __thread int tls_depth;

static void lock(void) { pthread_mutex_lock(&g_lock); }
static void unlock(void) { pthread_mutex_unlock(&g_lock); }

#define REQUIRE_INIT()                         \
    do {                                       \
        if (g_init_state != 1)                 \
            return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

/* ---- Configuration -------------------------------------------------------- */

/* Accepts "<digits>" optionally followed by K/M/G/T or KiB/MiB/GiB/TiB (any
 * case, binary multiples). */
static int parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        unsigned shift;
    } k_suffixes[] = {
        {"k", 10}, {"kib", 10}, {"m", 20}, {"mib", 20},
        {"g", 30}, {"gib", 30}, {"t", 40}, {"tib", 40},
    };
    char *end;
    uint64_t mult = 1;
    if (*s < '0' || *s > '9')
        return 0;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return 0;
    if (*end) {
        size_t i;
        for (i = 0; i < sizeof k_suffixes / sizeof k_suffixes[0]; i++)
            if (strcasecmp(end, k_suffixes[i].suffix) == 0)
                break;
        if (i == sizeof k_suffixes / sizeof k_suffixes[0])
            return 0;
        mult = 1ull << k_suffixes[i].shift;
    }
    if (v > UINT64_MAX / mult)
        return 0;
    *out = v * mult;
    return 1;
}

static uint64_t env_size(const char *name, uint64_t def, uint64_t min, uint64_t max, int plain)
{
    const char *s = getenv(name);
    uint64_t v;
    if (!s)
        return def;
    if (!parse_size(s, &v) || v < min || v > max || (plain && s[strspn(s, "0123456789")])) {
        fprintf(stderr, "simcuda: bad %s=%s; using default\n", name, s);
        return def;
    }
    return v;
}

static void load_config(void)
{
    g_cfg.devices = (int)env_size("SIMCUDA_DEVICES", 1, 0, MAX_DEVICES, 1);
    g_cfg.memory = env_size("SIMCUDA_MEMORY", 16ull << 30, 1, MAX_CAPACITY, 0);
    g_cfg.context_bytes = env_size("SIMCUDA_CONTEXT_BYTES", 0, 0, UINT64_MAX, 0);
    g_cfg.host_memory = env_size("SIMCUDA_HOST_MEMORY", 64ull << 30, 0, UINT64_MAX, 0);
}

/* ---- Devices, contexts ------------------------------------------------------ */

static int dev_valid(CUdevice dev) { return dev >= 0 && dev < g_ndev; }

static int dev_charge(struct device *d, uint64_t bytes)
{
    if (bytes > d->capacity - d->used)
        return 0;
    d->used += bytes;
    return 1;
}

static void dev_uncharge(struct device *d, uint64_t bytes) { d->used -= bytes; }

/* A handle this driver issued and has not destroyed (primary contexts are
 * permanent objects, as their handles are in the real driver). */
static int ctx_known(const struct ctx *c)
{
    for (int d = 0; d < g_ndev; d++)
        if (c == &g_dev[d].primary)
            return 1;
    for (const struct ctx *p = g_ctxs; p; p = p->next)
        if (p == c)
            return 1;
    return 0;
}

static int ctx_usable(const struct ctx *c) { return c && ctx_known(c) && (!c->primary || c->active); }

static struct ctx *tls_top(void) { return tls_depth ? tls_stack[tls_depth - 1] : NULL; }

static CUresult current_ctx(struct ctx **out)
{
    struct ctx *c = tls_top();
    if (!ctx_usable(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

/* ---- Pools ------------------------------------------------------------------ */

static struct pool *pool_new(int dev, int is_default)
{
    struct pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->dev = dev;
    p->is_default = is_default;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    p->next = g_pools;
    g_pools = p;
    return p;
}

static int pool_known(const struct pool *p)
{
    for (const struct pool *q = g_pools; q; q = q->next)
        if (q == p)
            return !q->destroyed;
    return 0;
}

/* Gives back whole chunks the pool holds beyond max(keep, used).  A real pool
 * can only release chunks with nothing live in them, hence the rounding. */
static void pool_shrink(struct pool *p, uint64_t keep)
{
    uint64_t want = keep > p->used ? keep : p->used;
    if (want >= p->reserved)
        return;
    want = round_up(want, POOL_CHUNK);
    if (want < p->reserved) {
        dev_uncharge(&g_dev[p->dev], p->reserved - want);
        p->reserved = want;
    }
}

static void pool_finalize(struct pool *p)
{
    dev_uncharge(&g_dev[p->dev], p->reserved);
    for (struct pool **pp = &g_pools; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    free(p);
}

/* What cuStreamSynchronize / cuCtxSynchronize do to the pools of a device. */
static void trim_device_pools(int dev)
{
    for (struct pool *p = g_pools; p; p = p->next)
        if (p->dev == dev)
            pool_shrink(p, p->destroyed ? 0 : p->threshold);
}

/* ---- Allocation records ------------------------------------------------------ */

static struct alloc *alloc_record(uint64_t addr, uint64_t size, enum alloc_kind kind, int dev,
                                  struct ctx *c, uint64_t charged)
{
    struct alloc *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->node.key = addr;
    a->node.len = size;
    a->kind = kind;
    a->dev = dev;
    a->ctx = c;
    a->charged = charged;
    tn_insert(&g_allocs, &a->node);
    return a;
}

static void alloc_release(struct alloc *a)
{
    struct device *d = &g_dev[a->dev];
    tn_remove(&g_allocs, a->node.key);
    switch (a->kind) {
    case AK_DEVICE:
        release_pages(a->node.key, a->charged);
        va_free(&d->va, a->node.key, a->charged);
        dev_uncharge(d, a->charged);
        break;
    case AK_MANAGED:
        munmap((void *)(uintptr_t)a->node.key, a->map_len);
        dev_uncharge(d, a->charged);
        break;
    case AK_POOL:
        /* The bytes go back to the pool, not the device: reserve stays. */
        va_free(&d->va, a->node.key, a->charged);
        a->pool->used -= a->charged;
        if (--a->pool->live == 0 && a->pool->destroyed)
            pool_finalize(a->pool);
        break;
    }
    free(a);
}

static CUresult device_alloc(struct ctx *c, uint64_t size, CUdeviceptr *dptr)
{
    struct device *d = &g_dev[c->dev];
    uint64_t charged = round_up(size, ALLOC_ROUND);
    if (!charged || !dev_charge(d, charged))
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t addr = va_alloc(&d->va, charged, ALLOC_ROUND, 0);
    if (!addr) {
        dev_uncharge(d, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!alloc_record(addr, size, AK_DEVICE, c->dev, c, charged)) {
        va_free(&d->va, addr, charged);
        dev_uncharge(d, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = addr;
    return CUDA_SUCCESS;
}

static CUresult pool_alloc(struct pool *p, struct ctx *c, uint64_t size, CUdeviceptr *dptr)
{
    struct device *d = &g_dev[p->dev];
    uint64_t need = round_up(size, ALLOC_ROUND);
    if (!need || need > UINT64_MAX - p->used)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (need > p->reserved - p->used) {
        uint64_t target = round_up(p->used + need, POOL_CHUNK);
        if (!target || (p->max_size && target > p->max_size))
            return CUDA_ERROR_OUT_OF_MEMORY;
        if (!dev_charge(d, target - p->reserved)) {
            /* Device full: first give back what this pool holds unused. */
            pool_shrink(p, 0);
            if (!dev_charge(d, target - p->reserved))
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        p->reserved = target;
        if (p->reserved > p->reserved_high)
            p->reserved_high = p->reserved;
    }
    uint64_t addr = va_alloc(&d->va, need, ALLOC_ROUND, 0);
    if (!addr)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct alloc *a = alloc_record(addr, size, AK_POOL, p->dev, c, need);
    if (!a) {
        va_free(&d->va, addr, need);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->pool = p;
    p->used += need;
    if (p->used > p->used_high)
        p->used_high = p->used;
    p->live++;
    *dptr = addr;
    return CUDA_SUCCESS;
}

/* ---- Stream capture ----------------------------------------------------------
 * The rules of cuThreadExchangeStreamCaptureMode's documentation.  A thread's
 * mode (default GLOBAL) decides whether it may make "potentially unsafe"
 * calls while capture sequences are active:
 *   GLOBAL:       not if it began a non-RELAXED sequence that is still
 *                 active, nor if any other thread has an active GLOBAL one;
 *   THREAD_LOCAL: not if it began a non-RELAXED sequence still active (other
 *                 threads' sequences are ignored);
 *   RELAXED:      always.
 * A prohibited call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 * invalidates the sequences that prohibited it, as the real driver does (the
 * classic symptom: a cudaMalloc on another thread makes cudaStreamEndCapture
 * return cudaErrorStreamCaptureInvalidated).  An invalidated sequence stays
 * active (and still prohibits) until cuStreamEndCapture ends it.
 *
 * The unsafe calls here are the memory-management ones: cuMemAlloc_v2,
 * cuMemAllocPitch_v2, cuMemAllocManaged, cuMemFree_v2 (NULL included),
 * cuMemAllocHost_v2, cuMemHostAlloc, cuMemFreeHost and cuCtxSynchronize;
 * cuStreamSynchronize of a capturing stream always fails and invalidates
 * that stream's sequence, whatever the modes.
 *
 * Where this differs from the real driver:
 *  - Stream-ordered allocation on the capturing stream itself
 *    (cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFreeAsync) is allowed,
 *    as it is for real, but where the real driver records a graph memory
 *    node and returns an address valid only for launches of the graph,
 *    simcuda simply allocates (or frees) from the pool at once.
 *  - The same calls on a stream that is not capturing are treated as unsafe,
 *    under the rules above.  That is conservative: the real driver is not
 *    documented to forbid them.
 *  - No operation is recorded, so the graph from cuStreamEndCapture is an
 *    empty handle, good only for cuGraphDestroy; there is no cross-stream
 *    capture (events), so a sequence is always one stream.
 *  - The legacy default stream cannot be captured (as for real), but the
 *    implicit synchronization between it and capturing blocking streams is
 *    not modelled: cuStreamIsCapturing(legacy) answers NONE rather than
 *    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT.
 *  - The per-thread default stream can be captured; a thread that exits in
 *    the middle of such a capture leaves it active for good.
 *  - The first-generation cuStreamBeginCapture (CUDA 10.0, no mode argument)
 *    is taken to mean CU_STREAM_CAPTURE_MODE_GLOBAL.
 *  - VMM calls (cuMemCreate, cuMemMap, ...) and pool management are not
 *    checked. */

struct capture {
    CUstreamCaptureMode mode;
    int invalidated;
    const void *owner;    /* &tls_thread_tag of the thread that began it */
    struct capture *next; /* g_captures */
};

static struct capture *g_captures; /* every active capture sequence */
static struct tnode *g_graphs;     /* bare tnodes: graphs from cuStreamEndCapture */
static __thread char tls_thread_tag; /* its address identifies the thread */
static __thread CUstreamCaptureMode tls_capture_mode; /* 0: CU_STREAM_CAPTURE_MODE_GLOBAL */
static __thread struct capture *tls_ptds_capture; /* this thread's per-thread stream */

static void capture_end(struct capture **slot)
{
    struct capture *c = *slot;
    for (struct capture **pp = &g_captures; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    free(c);
    *slot = NULL;
}

/* Called by every potentially unsafe call before it takes effect. */
static CUresult capture_guard(void)
{
    CUstreamCaptureMode mode = tls_capture_mode;
    int prohibited = 0;
    if (mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    for (struct capture *c = g_captures; c; c = c->next) {
        int own = c->owner == &tls_thread_tag;
        if ((own && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!own && mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            c->invalidated = 1;
            prohibited = 1;
        }
    }
    return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* Where a stream's capture sequence is kept: *slot is NULL when the stream
 * is not capturing; slot itself is NULL for the legacy default stream, which
 * can never capture. */
static CUresult capture_slot(CUstream h, struct capture ***slot)
{
    if (h == NULL || h == CU_STREAM_LEGACY) {
        *slot = NULL;
        return CUDA_SUCCESS;
    }
    if (h == CU_STREAM_PER_THREAD) {
        *slot = &tls_ptds_capture;
        return CUDA_SUCCESS;
    }
    struct tnode *n = tn_find(g_streams, (uint64_t)(uintptr_t)h);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    *slot = &((struct stream *)n)->cap;
    return CUDA_SUCCESS;
}

/* Stream-ordered allocator calls: part of the capture on a capturing
 * stream, unsafe (conservatively) on any other. */
static CUresult capture_guard_stream(CUstream h)
{
    struct capture **slot;
    CHECK(capture_slot(h, &slot));
    return slot && *slot ? CUDA_SUCCESS : capture_guard();
}

static void stream_release(struct stream *s)
{
    if (s->cap)
        capture_end(&s->cap);
    tn_remove(&g_streams, s->node.key);
    free(s);
}

/* Everything a context owns goes with it, as in the real driver. */
static void ctx_teardown(struct ctx *c)
{
    struct tnode *n;
    uint64_t k = 0;
    while ((n = tn_find_ge(g_allocs, k))) {
        k = n->key + 1;
        if (((struct alloc *)n)->ctx == c)
            alloc_release((struct alloc *)n);
    }
    k = 0;
    while ((n = tn_find_ge(g_streams, k))) {
        k = n->key + 1;
        if (((struct stream *)n)->ctx == c)
            stream_release((struct stream *)n);
    }
}

static int is_special_stream(CUstream s)
{
    return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

/* The device a stream works on; the special handles mean the current one. */
static CUresult stream_device(CUstream s, const struct ctx *cur, int *dev)
{
    if (is_special_stream(s)) {
        *dev = cur->dev;
        return CUDA_SUCCESS;
    }
    struct tnode *n = tn_find(g_streams, (uint64_t)(uintptr_t)s);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    *dev = ((struct stream *)n)->ctx->dev;
    return CUDA_SUCCESS;
}

/* ---- Initialization --------------------------------------------------------- */

static CUresult init_locked(void)
{
    if (g_init_state)
        return g_init_result;
    load_config();
    g_init_state = -1;
    g_init_result = CUDA_ERROR_NO_DEVICE;
    if (g_cfg.devices == 0)
        return g_init_result;
    g_init_result = CUDA_ERROR_OUT_OF_MEMORY;
    for (int d = 0; d < g_cfg.devices; d++) {
        struct device *dev = &g_dev[d];
        uint64_t base = DEV_VA_BASE + (uint64_t)d * DEV_VA_SPAN;
        dev->capacity = g_cfg.memory;
        dev->primary.dev = d;
        dev->primary.primary = 1;
        if (!va_init(&dev->va, base, DEV_VA_SPAN))
            return g_init_result;
        reserve_host_range(base, DEV_VA_SPAN, PROT_READ | PROT_WRITE);
        dev->default_pool = dev->current_pool = pool_new(d, 1);
        if (!dev->default_pool)
            return g_init_result;
    }
    if (!va_init(&g_vmm_va, VMM_VA_BASE, VMM_VA_SPAN))
        return g_init_result;
    reserve_host_range(VMM_VA_BASE, VMM_VA_SPAN, PROT_NONE);
    g_ndev = g_cfg.devices;
    g_init_state = 1;
    return g_init_result = CUDA_SUCCESS;
}

IMPL CUresult impl_cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = init_locked();
    unlock();
    return r;
}

IMPL CUresult impl_cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* ---- Errors --------------------------------------------------------------- */

static const struct {
    CUresult code;
    const char *name, *text;
} k_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_PROFILER_DISABLED, "CUDA_ERROR_PROFILER_DISABLED", "profiler disabled"},
    {CUDA_ERROR_PROFILER_NOT_INITIALIZED, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", "profiler not initialized"},
    {CUDA_ERROR_PROFILER_ALREADY_STARTED, "CUDA_ERROR_PROFILER_ALREADY_STARTED", "profiler already started"},
    {CUDA_ERROR_PROFILER_ALREADY_STOPPED, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", "profiler already stopped"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "device unavailable"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_DEVICE_NOT_LICENSED, "CUDA_ERROR_DEVICE_NOT_LICENSED", "device not licensed"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "invalid image"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "map failed"},
    {CUDA_ERROR_UNMAP_FAILED, "CUDA_ERROR_UNMAP_FAILED", "unmap failed"},
    {CUDA_ERROR_ARRAY_IS_MAPPED, "CUDA_ERROR_ARRAY_IS_MAPPED", "array is mapped"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no binary for gpu"},
    {CUDA_ERROR_ALREADY_ACQUIRED, "CUDA_ERROR_ALREADY_ACQUIRED", "already acquired"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", "not mapped as array"},
    {CUDA_ERROR_NOT_MAPPED_AS_POINTER, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", "not mapped as pointer"},
    {CUDA_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE", "ecc uncorrectable"},
    {CUDA_ERROR_UNSUPPORTED_LIMIT, "CUDA_ERROR_UNSUPPORTED_LIMIT", "unsupported limit"},
    {CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "context already in use"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access unsupported"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "invalid ptx"},
    {CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", "invalid graphics context"},
    {CUDA_ERROR_NVLINK_UNCORRECTABLE, "CUDA_ERROR_NVLINK_UNCORRECTABLE", "nvlink uncorrectable"},
    {CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "jit compiler not found"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "unsupported ptx version"},
    {CUDA_ERROR_JIT_COMPILATION_DISABLED, "CUDA_ERROR_JIT_COMPILATION_DISABLED", "jit compilation disabled"},
    {CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "the provided execution affinity is not supported"},
    {CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", "unsupported devside sync"},
    {CUDA_ERROR_CONTAINED, "CUDA_ERROR_CONTAINED", "contained"},
    {CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "invalid source"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", "shared object symbol not found"},
    {CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "shared object init failed"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "operating system"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_LOSSY_QUERY, "CUDA_ERROR_LOSSY_QUERY", "lossy query"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "launch out of resources"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "launch timeout"},
    {CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", "launch incompatible texturing"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access already enabled"},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access not enabled"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_ASSERT, "CUDA_ERROR_ASSERT", "assert"},
    {CUDA_ERROR_TOO_MANY_PEERS, "CUDA_ERROR_TOO_MANY_PEERS", "too many peers"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "host memory already registered"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "host memory not registered"},
    {CUDA_ERROR_HARDWARE_STACK_ERROR, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "illegal instruction"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_INVALID_ADDRESS_SPACE, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "invalid address space"},
    {CUDA_ERROR_INVALID_PC, "CUDA_ERROR_INVALID_PC", "invalid pc"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "launch failed"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "cooperative launch too large"},
    {CUDA_ERROR_TENSOR_MEMORY_LEAK, "CUDA_ERROR_TENSOR_MEMORY_LEAK", "tensor memory leak"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY", "system not ready"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system driver mismatch"},
    {CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "compat not supported on device"},
    {CUDA_ERROR_MPS_CONNECTION_FAILED, "CUDA_ERROR_MPS_CONNECTION_FAILED", "mps connection failed"},
    {CUDA_ERROR_MPS_RPC_FAILURE, "CUDA_ERROR_MPS_RPC_FAILURE", "mps rpc failure"},
    {CUDA_ERROR_MPS_SERVER_NOT_READY, "CUDA_ERROR_MPS_SERVER_NOT_READY", "mps server not ready"},
    {CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", "mps max clients reached"},
    {CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", "mps max connections reached"},
    {CUDA_ERROR_MPS_CLIENT_TERMINATED, "CUDA_ERROR_MPS_CLIENT_TERMINATED", "mps client terminated"},
    {CUDA_ERROR_CDP_NOT_SUPPORTED, "CUDA_ERROR_CDP_NOT_SUPPORTED", "cdp not supported"},
    {CUDA_ERROR_CDP_VERSION_MISMATCH, "CUDA_ERROR_CDP_VERSION_MISMATCH", "cdp version mismatch"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "stream capture unsupported"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "stream capture invalidated"},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "stream capture merge"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "stream capture unmatched"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "stream capture unjoined"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "stream capture isolation"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "stream capture implicit"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT", "captured event"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "stream capture wrong thread"},
    {CUDA_ERROR_TIMEOUT, "CUDA_ERROR_TIMEOUT", "timeout"},
    {CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "graph exec update failure"},
    {CUDA_ERROR_EXTERNAL_DEVICE, "CUDA_ERROR_EXTERNAL_DEVICE", "external device"},
    {CUDA_ERROR_INVALID_CLUSTER_SIZE, "CUDA_ERROR_INVALID_CLUSTER_SIZE", "invalid cluster size"},
    {CUDA_ERROR_FUNCTION_NOT_LOADED, "CUDA_ERROR_FUNCTION_NOT_LOADED", "function not loaded"},
    {CUDA_ERROR_INVALID_RESOURCE_TYPE, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "invalid resource type"},
    {CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", "invalid resource configuration"},
    {CUDA_ERROR_KEY_ROTATION, "CUDA_ERROR_KEY_ROTATION", "key rotation"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult code, const char **out, int want_name)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++) {
        if (k_errors[i].code == code) {
            *out = want_name ? k_errors[i].name : k_errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

IMPL CUresult impl_cuGetErrorString(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, 0);
}

IMPL CUresult impl_cuGetErrorName(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, 1);
}

/* ---- Device queries ----------------------------------------------------------- */

IMPL CUresult impl_cuDeviceGetCount(int *count)
{
    lock();
    CUresult r = CUDA_ERROR_NOT_INITIALIZED;
    if (g_init_state == 1) {
        r = CUDA_ERROR_INVALID_VALUE;
        if (count) {
            *count = g_ndev;
            r = CUDA_SUCCESS;
        }
    }
    unlock();
    return r;
}

static CUresult device_get_locked(CUdevice *device, int ordinal)
{
    REQUIRE_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceGet(CUdevice *device, int ordinal)
{
    lock();
    CUresult r = device_get_locked(device, ordinal);
    unlock();
    return r;
}

static CUresult device_get_name_locked(char *name, int len, CUdevice dev)
{
    REQUIRE_INIT();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", SIMCUDA_DEVICE_NAME);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceGetName(char *name, int len, CUdevice dev)
{
    lock();
    CUresult r = device_get_name_locked(name, len, dev);
    unlock();
    return r;
}

static CUresult device_total_mem_locked(size_t *bytes, CUdevice dev)
{
    REQUIRE_INIT();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_dev[dev].capacity;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    lock();
    CUresult r = device_total_mem_locked(bytes, dev);
    unlock();
    return r;
}

/* Attributes of an H100 SXM5 (what cudaGetDeviceProperties reads: it asks for
 * nearly all of them and fails on the first it is refused).  Indexed by the
 * attribute's value in CUDA 13.2's cuda.h; {1, v} marks a known attribute.
 * PCI_BUS_ID (33) comes from identity.h.  139 is not in the public header, but
 * cudart 13.2 asks for it and gives up on the device if it is refused. */
static const struct {
    int known, value;
} k_attrs[149] = {
        [1] = {1, 1024}, [2] = {1, 1024}, [3] = {1, 1024}, [4] = {1, 64}, [5] = {1, 2147483647},
        [6] = {1, 65535}, [7] = {1, 65535}, [8] = {1, 49152}, [9] = {1, 65536}, [10] = {1, 32},
        [11] = {1, 2147483647}, [12] = {1, 65536}, [13] = {1, 1980000}, [14] = {1, 512},
        [15] = {1, 1}, [16] = {1, SIMCUDA_SM_COUNT}, [17] = {1, 0}, [18] = {1, 0}, [19] = {1, 1},
        [20] = {1, 0}, [21] = {1, 131072}, [22] = {1, 131072}, [23] = {1, 65536},
        [24] = {1, 16384}, [25] = {1, 16384}, [26] = {1, 16384}, [27] = {1, 32768},
        [28] = {1, 32768}, [29] = {1, 2048}, [30] = {1, 512}, [31] = {1, 1}, [32] = {1, 1},
        [34] = {1, 0}, [35] = {1, 0}, [36] = {1, 2619000}, [37] = {1, 5120},
        [38] = {1, 52428800}, [39] = {1, 2048}, [40] = {1, 3}, [41] = {1, 1}, [42] = {1, 32768},
        [43] = {1, 2048}, [44] = {1, 1}, [45] = {1, 32768}, [46] = {1, 32768}, [47] = {1, 8192},
        [48] = {1, 8192}, [49] = {1, 32768}, [50] = {1, 0}, [51] = {1, 32}, [52] = {1, 32768},
        [53] = {1, 32768}, [54] = {1, 2046}, [55] = {1, 32768}, [56] = {1, 131072},
        [57] = {1, 65536}, [58] = {1, 16384}, [59] = {1, 16384}, [60] = {1, 16384},
        [61] = {1, 32768}, [62] = {1, 2048}, [63] = {1, 32768}, [64] = {1, 32768},
        [65] = {1, 2048}, [66] = {1, 32768}, [67] = {1, 32768}, [68] = {1, 2046},
        [69] = {1, 268435456}, [70] = {1, 131072}, [71] = {1, 65000}, [72] = {1, 2097120},
        [73] = {1, 32768}, [74] = {1, 32768}, [75] = {1, SIMCUDA_CC_MAJOR},
        [76] = {1, SIMCUDA_CC_MINOR}, [77] = {1, 32768}, [78] = {1, 1}, [79] = {1, 1},
        [80] = {1, 1}, [81] = {1, 233472}, [82] = {1, 65536}, [83] = {1, 1}, [84] = {1, 0},
        [85] = {1, 0}, [86] = {1, 0}, [87] = {1, 2}, [88] = {1, 0}, [89] = {1, 1}, [90] = {1, 1},
        [91] = {1, 0}, [92] = {1, 0}, [93] = {1, 0}, [94] = {1, 0}, [95] = {1, 1}, [96] = {1, 0},
        [97] = {1, 232448}, [98] = {1, 0}, [99] = {1, 1}, [100] = {1, 0}, [101] = {1, 0},
        [102] = {1, 1}, [103] = {1, 1}, [104] = {1, 0}, [105] = {1, 0}, [106] = {1, 32},
        [107] = {1, 1}, [108] = {1, 31457280}, [109] = {1, 134213632}, [110] = {1, 1},
        [111] = {1, 1024}, [112] = {1, 1}, [113] = {1, 1}, [114] = {1, 1}, [115] = {1, 1},
        [116] = {1, 1}, [117] = {1, 1}, [118] = {1, 100}, [119] = {1, 1}, [120] = {1, 1},
        [121] = {1, 1}, [122] = {1, 1}, [123] = {1, 1}, [124] = {1, 0}, [125] = {1, 1},
        [126] = {1, 4}, [127] = {1, 1}, [128] = {1, 0}, [129] = {1, 0}, [130] = {1, 0},
        [131] = {1, -1}, [132] = {1, 0}, [133] = {1, 0}, [134] = {1, -1}, [135] = {1, 0},
        [136] = {1, 0}, [137] = {1, 0}, [138] = {1, 0}, [139] = {1, 0}, [140] = {1, 0}, [141] = {1, 0},
        [142] = {1, 0}, [143] = {1, 0}, [144] = {1, 0}, [145] = {1, 0}, [146] = {1, 0},
        [147] = {1, 0}, [148] = {1, 0},
};

static CUresult device_get_attribute_locked(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    REQUIRE_INIT();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (attrib == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) {
        *pi = simcuda_pci_bus(dev);
        return CUDA_SUCCESS;
    }
    if ((int)attrib < 0 || (size_t)attrib >= sizeof k_attrs / sizeof k_attrs[0] ||
        !k_attrs[attrib].known) {
        sim_trace("device attribute %d: unknown", (int)attrib);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pi = k_attrs[attrib].value;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    lock();
    CUresult r = device_get_attribute_locked(pi, attrib, dev);
    unlock();
    return r;
}

/* ---- Primary contexts ---------------------------------------------------------- */

static CUresult primary_retain_locked(CUcontext *pctx, CUdevice dev)
{
    REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct device *d = &g_dev[dev];
    if (d->primary.refcount == 0) {
        /* Creating a context costs device memory on a real GPU too. */
        if (!dev_charge(d, g_cfg.context_bytes))
            return CUDA_ERROR_OUT_OF_MEMORY;
        d->primary.active = 1;
    }
    d->primary.refcount++;
    *pctx = (CUcontext)&d->primary;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    lock();
    CUresult r = primary_retain_locked(pctx, dev);
    unlock();
    return r;
}

static CUresult primary_release_locked(CUdevice dev)
{
    REQUIRE_INIT();
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct device *d = &g_dev[dev];
    if (d->primary.refcount == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--d->primary.refcount == 0) {
        ctx_teardown(&d->primary);
        dev_uncharge(d, g_cfg.context_bytes);
        d->primary.active = 0;
    }
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    lock();
    CUresult r = primary_release_locked(dev);
    unlock();
    return r;
}

/* The pre-11.0 ABI had the same signature; the semantics simcuda models are
 * the same too. */
IMPL CUresult impl_cuDevicePrimaryCtxRelease_v1(CUdevice dev)
{
    lock();
    CUresult r = primary_release_locked(dev);
    unlock();
    return r;
}

static CUresult primary_reset_locked(CUdevice dev)
{
    REQUIRE_INIT();
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct device *d = &g_dev[dev];
    if (d->primary.active)
        ctx_teardown(&d->primary);
    trim_device_pools(dev);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    lock();
    CUresult r = primary_reset_locked(dev);
    unlock();
    if (r == CUDA_SUCCESS)
        sim_cls_context_gone((CUcontext)&g_dev[dev].primary);
    return r;
}

IMPL CUresult impl_cuDevicePrimaryCtxReset_v1(CUdevice dev)
{
    lock();
    CUresult r = primary_reset_locked(dev);
    unlock();
    if (r == CUDA_SUCCESS)
        sim_cls_context_gone((CUcontext)&g_dev[dev].primary);
    return r;
}

static CUresult primary_get_state_locked(CUdevice dev, unsigned int *flags, int *active)
{
    REQUIRE_INIT();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = g_dev[dev].primary.flags;
    *active = g_dev[dev].primary.active;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    lock();
    CUresult r = primary_get_state_locked(dev, flags, active);
    unlock();
    return r;
}

/* ---- Contexts ------------------------------------------------------------------- */

static CUresult ctx_create_locked(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REQUIRE_INIT();
    if (!pctx || (flags & ~(unsigned)CU_CTX_FLAGS_MASK))
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (tls_depth == CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct ctx *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!dev_charge(&g_dev[dev], g_cfg.context_bytes)) {
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->dev = dev;
    c->flags = flags;
    c->next = g_ctxs;
    g_ctxs = c;
    tls_stack[tls_depth++] = c; /* a new context is pushed on the caller's stack */
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxCreate_v1(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    lock();
    CUresult r = ctx_create_locked(pctx, flags, dev);
    unlock();
    return r;
}

IMPL CUresult impl_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    lock();
    CUresult r = ctx_create_locked(pctx, flags, dev);
    unlock();
    return r;
}

IMPL CUresult impl_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                  int numParams, unsigned int flags, CUdevice dev)
{
    if (numParams < 0 || (numParams > 0 && !paramsArray))
        return CUDA_ERROR_INVALID_VALUE;
    if (numParams > 0)
        return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY; /* no MPS, no SM partitions */
    lock();
    CUresult r = ctx_create_locked(pctx, flags, dev);
    unlock();
    return r;
}

IMPL CUresult impl_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                  CUdevice dev)
{
    if (params) {
        if (params->numExecAffinityParams < 0 ||
            (params->numExecAffinityParams > 0 && !params->execAffinityParams))
            return CUDA_ERROR_INVALID_VALUE;
        if (params->numExecAffinityParams > 0)
            return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
        if (params->cigParams)
            return CUDA_ERROR_NOT_SUPPORTED; /* CUDA-in-graphics needs D3D12 */
    }
    lock();
    CUresult r = ctx_create_locked(pctx, flags, dev);
    unlock();
    return r;
}

static CUresult ctx_destroy_locked(CUcontext ctx)
{
    REQUIRE_INIT();
    struct ctx *c = (struct ctx *)ctx;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx_known(c) || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_teardown(c);
    /* Destroying the caller's current context pops it, as in the real driver;
     * other threads keep a dangling handle and get INVALID_CONTEXT. */
    while (tls_depth > 0 && tls_stack[tls_depth - 1] == c)
        tls_depth--;
    dev_uncharge(&g_dev[c->dev], g_cfg.context_bytes);
    for (struct ctx **pp = &g_ctxs; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    free(c);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxDestroy_v1(CUcontext ctx)
{
    lock();
    CUresult r = ctx_destroy_locked(ctx);
    unlock();
    if (r == CUDA_SUCCESS)
        sim_cls_context_gone(ctx); /* outside the lock: destructors call the driver */
    return r;
}

IMPL CUresult impl_cuCtxDestroy_v2(CUcontext ctx)
{
    lock();
    CUresult r = ctx_destroy_locked(ctx);
    unlock();
    if (r == CUDA_SUCCESS)
        sim_cls_context_gone(ctx); /* outside the lock: destructors call the driver */
    return r;
}

static CUresult ctx_push_locked(CUcontext ctx)
{
    REQUIRE_INIT();
    struct ctx *c = (struct ctx *)ctx;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx_known(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_depth == CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    tls_stack[tls_depth++] = c;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxPushCurrent_v1(CUcontext ctx)
{
    lock();
    CUresult r = ctx_push_locked(ctx);
    unlock();
    return r;
}

IMPL CUresult impl_cuCtxPushCurrent_v2(CUcontext ctx)
{
    lock();
    CUresult r = ctx_push_locked(ctx);
    unlock();
    return r;
}

static CUresult ctx_pop_locked(CUcontext *pctx)
{
    REQUIRE_INIT();
    if (tls_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct ctx *c = tls_stack[--tls_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxPopCurrent_v1(CUcontext *pctx)
{
    lock();
    CUresult r = ctx_pop_locked(pctx);
    unlock();
    return r;
}

IMPL CUresult impl_cuCtxPopCurrent_v2(CUcontext *pctx)
{
    lock();
    CUresult r = ctx_pop_locked(pctx);
    unlock();
    return r;
}

static CUresult ctx_set_current_locked(CUcontext ctx)
{
    REQUIRE_INIT();
    struct ctx *c = (struct ctx *)ctx;
    if (!c) {
        if (tls_depth > 0)
            tls_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_known(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_depth == 0)
        tls_depth = 1;
    tls_stack[tls_depth - 1] = c;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxSetCurrent(CUcontext ctx)
{
    lock();
    CUresult r = ctx_set_current_locked(ctx);
    unlock();
    return r;
}

IMPL CUresult impl_cuCtxGetCurrent(CUcontext *pctx)
{
    lock();
    CUresult r = CUDA_ERROR_NOT_INITIALIZED;
    if (g_init_state == 1) {
        r = CUDA_ERROR_INVALID_VALUE;
        if (pctx) {
            *pctx = (CUcontext)tls_top();
            r = CUDA_SUCCESS;
        }
    }
    unlock();
    return r;
}

static CUresult ctx_get_device_locked(CUdevice *device)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxGetDevice(CUdevice *device)
{
    lock();
    CUresult r = ctx_get_device_locked(device);
    unlock();
    return r;
}

static CUresult ctx_synchronize_locked(void)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    CHECK(capture_guard());
    trim_device_pools(c->dev);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuCtxSynchronize(void)
{
    lock();
    CUresult r = ctx_synchronize_locked();
    unlock();
    return r;
}

/* ---- Device memory ------------------------------------------------------------- */

static CUresult mem_alloc_locked(CUdeviceptr *dptr, size_t bytesize)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_guard());
    return device_alloc(c, bytesize, dptr);
}

IMPL CUresult impl_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    lock();
    CUresult r = mem_alloc_locked(dptr, bytesize);
    unlock();
    return r;
}

static CUresult mem_alloc_pitch_locked(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                       size_t height, unsigned int elem)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!dptr || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t p = round_up(width, ALLOC_ROUND);
    if (!p || height > UINT64_MAX / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CHECK(capture_guard());
    CHECK(device_alloc(c, p * height, dptr));
    *pitch = p;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                      size_t height, unsigned int elem)
{
    lock();
    CUresult r = mem_alloc_pitch_locked(dptr, pitch, width, height, elem);
    unlock();
    return r;
}

static CUresult mem_alloc_managed_locked(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_guard());
    struct device *d = &g_dev[c->dev];
    uint64_t charged = round_up(bytesize, ALLOC_ROUND);
    uint64_t map_len = round_up(bytesize, (uint64_t)sysconf(_SC_PAGESIZE));
    if (!charged || !map_len || !dev_charge(d, charged))
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* Managed memory is CPU-accessible, so it needs real pages. */
    void *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED || in_simulated_range((uint64_t)(uintptr_t)p, map_len)) {
        if (p != MAP_FAILED)
            munmap(p, map_len);
        dev_uncharge(d, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct alloc *a = alloc_record((uint64_t)(uintptr_t)p, bytesize, AK_MANAGED, c->dev, c, charged);
    if (!a) {
        munmap(p, map_len);
        dev_uncharge(d, charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->map_len = map_len;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    lock();
    CUresult r = mem_alloc_managed_locked(dptr, bytesize, flags);
    unlock();
    return r;
}

static CUresult mem_free_locked(CUdeviceptr dptr)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    CHECK(capture_guard()); /* even cuMemFree(0), the "initialize" idiom */
    if (dptr == 0)
        return CUDA_SUCCESS;
    struct tnode *n = tn_find(g_allocs, dptr);
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    alloc_release((struct alloc *)n);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemFree_v2(CUdeviceptr dptr)
{
    lock();
    CUresult r = mem_free_locked(dptr);
    unlock();
    return r;
}

static CUresult mem_get_info_locked(size_t *free_bytes, size_t *total_bytes)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    const struct device *d = &g_dev[c->dev];
    if (free_bytes)
        *free_bytes = d->capacity - d->used;
    if (total_bytes)
        *total_bytes = d->capacity;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    lock();
    CUresult r = mem_get_info_locked(free_bytes, total_bytes);
    unlock();
    return r;
}

static CUresult mem_get_address_range_locked(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    struct tnode *n = tn_find_le(g_allocs, dptr);
    if (!n || dptr - n->key >= n->len)
        n = tn_find_le(g_maps, dptr);
    if (!n || dptr - n->key >= n->len)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = n->key;
    if (psize)
        *psize = n->len;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    lock();
    CUresult r = mem_get_address_range_locked(pbase, psize, dptr);
    unlock();
    return r;
}

/* ---- Pinned host memory ------------------------------------------------------------ */

static CUresult host_alloc_locked(void **pp, size_t bytesize, unsigned int flags)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!pp || bytesize == 0 ||
        (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                             CU_MEMHOSTALLOC_WRITECOMBINED)))
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_guard());
    uint64_t map_len = round_up(bytesize, (uint64_t)sysconf(_SC_PAGESIZE));
    if (!map_len || map_len > g_cfg.host_memory - g_host_used)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct host_alloc *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->node.key = (uint64_t)(uintptr_t)p;
    h->node.len = bytesize;
    h->map_len = map_len;
    tn_insert(&g_host, &h->node);
    g_host_used += map_len;
    *pp = p;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    lock();
    CUresult r = host_alloc_locked(pp, bytesize, flags);
    unlock();
    return r;
}

IMPL CUresult impl_cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    lock();
    CUresult r = host_alloc_locked(pp, bytesize, 0);
    unlock();
    return r;
}

/* Host pointers never had a 32-bit ABI, so the legacy export works. */
IMPL CUresult impl_cuMemAllocHost_v1(void **pp, unsigned int bytesize)
{
    lock();
    CUresult r = host_alloc_locked(pp, bytesize, 0);
    unlock();
    return r;
}

static CUresult host_free_locked(void *p)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    struct tnode *n = p ? tn_find(g_host, (uint64_t)(uintptr_t)p) : NULL;
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_guard());
    struct host_alloc *h = (struct host_alloc *)n;
    tn_remove(&g_host, n->key);
    munmap(p, h->map_len);
    g_host_used -= h->map_len;
    free(h);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemFreeHost(void *p)
{
    lock();
    CUresult r = host_free_locked(p);
    unlock();
    return r;
}

/* ---- Streams --------------------------------------------------------------------- */

static CUresult stream_create_locked(CUstream *ph, unsigned int flags, int priority)
{
    static unsigned long long next_id = 3; /* 1 and 2 are the legacy and per-thread streams */
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct stream *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->node.key = (uint64_t)(uintptr_t)s;
    s->ctx = c;
    s->flags = flags;
    /* Out-of-range priorities are clamped, as the real driver does. */
    s->priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
    s->id = next_id++;
    tn_insert(&g_streams, &s->node);
    *ph = (CUstream)s;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamCreate(CUstream *ph, unsigned int flags)
{
    lock();
    CUresult r = stream_create_locked(ph, flags, 0);
    unlock();
    return r;
}

static CUresult stream_destroy_locked(CUstream h)
{
    struct ctx *c;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    struct tnode *n = is_special_stream(h) ? NULL : tn_find(g_streams, (uint64_t)(uintptr_t)h);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    stream_release((struct stream *)n);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamDestroy_v1(CUstream h)
{
    lock();
    CUresult r = stream_destroy_locked(h);
    unlock();
    return r;
}

IMPL CUresult impl_cuStreamDestroy_v2(CUstream h)
{
    lock();
    CUresult r = stream_destroy_locked(h);
    unlock();
    return r;
}

/* Nothing ever runs on a stream, so synchronizing only lets the pools of the
 * stream's device release what they hold above their release threshold. */
static CUresult stream_synchronize_locked(CUstream h)
{
    struct ctx *c;
    int dev;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    CHECK(stream_device(h, c, &dev));
    struct capture **slot;
    CHECK(capture_slot(h, &slot));
    if (slot && *slot) {
        /* Waiting for a stream whose work is being recorded, not run. */
        (*slot)->invalidated = 1;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    trim_device_pools(dev);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamSynchronize(CUstream h)
{
    lock();
    CUresult r = stream_synchronize_locked(h);
    unlock();
    return r;
}

/* Per-thread-default-stream twin: stream 0 means this thread's stream, which
 * for simcuda is indistinguishable from the legacy one. */
IMPL CUresult impl_cuStreamSynchronize_ptsz(CUstream h)
{
    lock();
    CUresult r = stream_synchronize_locked(h == NULL ? CU_STREAM_PER_THREAD : h);
    unlock();
    return r;
}

/* ---- Stream capture API (rules above, with struct capture) ------------------------- */

static int capture_mode_valid(CUstreamCaptureMode mode)
{
    return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
           mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

static CUresult begin_capture_locked(CUstream h, CUstreamCaptureMode mode)
{
    struct ctx *c;
    struct capture **slot;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!capture_mode_valid(mode))
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_slot(h, &slot));
    if (!slot)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream */
    if (*slot)
        return CUDA_ERROR_ILLEGAL_STATE; /* already capturing */
    struct capture *cap = calloc(1, sizeof *cap);
    if (!cap)
        return CUDA_ERROR_OUT_OF_MEMORY;
    cap->mode = mode;
    cap->owner = &tls_thread_tag;
    cap->next = g_captures;
    g_captures = cap;
    *slot = cap;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode)
{
    lock();
    CUresult r = begin_capture_locked(h, mode);
    unlock();
    return r;
}

IMPL CUresult impl_cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode)
{
    lock();
    CUresult r = begin_capture_locked(h == NULL ? CU_STREAM_PER_THREAD : h, mode);
    unlock();
    return r;
}

/* The CUDA 10.0 ABI, without a mode: taken as GLOBAL. */
IMPL CUresult impl_cuStreamBeginCapture_v1(CUstream h)
{
    lock();
    CUresult r = begin_capture_locked(h, CU_STREAM_CAPTURE_MODE_GLOBAL);
    unlock();
    return r;
}

IMPL CUresult impl_cuStreamBeginCapture_v1_ptsz(CUstream h)
{
    lock();
    CUresult r = begin_capture_locked(h == NULL ? CU_STREAM_PER_THREAD : h,
                                      CU_STREAM_CAPTURE_MODE_GLOBAL);
    unlock();
    return r;
}

static CUresult end_capture_locked(CUstream h, CUgraph *phGraph)
{
    struct ctx *c;
    struct capture **slot;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_slot(h, &slot));
    if (!slot || !*slot)
        return CUDA_ERROR_ILLEGAL_STATE; /* not capturing */
    struct capture *cap = *slot;
    if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED && cap->owner != &tls_thread_tag)
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    int invalidated = cap->invalidated;
    capture_end(slot); /* ends either way, as the real one does */
    *phGraph = NULL;
    if (invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    struct tnode *g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->key = (uint64_t)(uintptr_t)g;
    tn_insert(&g_graphs, g);
    *phGraph = (CUgraph)g;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamEndCapture(CUstream h, CUgraph *phGraph)
{
    lock();
    CUresult r = end_capture_locked(h, phGraph);
    unlock();
    return r;
}

IMPL CUresult impl_cuStreamEndCapture_ptsz(CUstream h, CUgraph *phGraph)
{
    lock();
    CUresult r = end_capture_locked(h == NULL ? CU_STREAM_PER_THREAD : h, phGraph);
    unlock();
    return r;
}

static CUresult is_capturing_locked(CUstream h, CUstreamCaptureStatus *status)
{
    struct ctx *c;
    struct capture **slot;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_slot(h, &slot));
    if (!slot || !*slot)
        *status = CU_STREAM_CAPTURE_STATUS_NONE;
    else
        *status = (*slot)->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                       : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *status)
{
    lock();
    CUresult r = is_capturing_locked(h, status);
    unlock();
    return r;
}

IMPL CUresult impl_cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus *status)
{
    lock();
    CUresult r = is_capturing_locked(h == NULL ? CU_STREAM_PER_THREAD : h, status);
    unlock();
    return r;
}

/* Swaps: the thread takes *mode and gets its previous mode back in *mode. */
static CUresult exchange_capture_mode_locked(CUstreamCaptureMode *mode)
{
    REQUIRE_INIT();
    if (!mode || !capture_mode_valid(*mode))
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = tls_capture_mode;
    tls_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    lock();
    CUresult r = exchange_capture_mode_locked(mode);
    unlock();
    return r;
}

static CUresult graph_destroy_locked(CUgraph graph)
{
    REQUIRE_INIT();
    struct tnode *g = graph ? tn_find(g_graphs, (uint64_t)(uintptr_t)graph) : NULL;
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    tn_remove(&g_graphs, g->key);
    free(g);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuGraphDestroy(CUgraph graph)
{
    lock();
    CUresult r = graph_destroy_locked(graph);
    unlock();
    return r;
}

/* ---- Stream-ordered allocator ------------------------------------------------------ */

static CUresult get_default_pool_locked(CUmemoryPool *out, CUdevice dev, int current)
{
    REQUIRE_INIT();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *out = (CUmemoryPool)(current ? g_dev[dev].current_pool : g_dev[dev].default_pool);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    lock();
    CUresult r = get_default_pool_locked(pool_out, dev, 0);
    unlock();
    return r;
}

IMPL CUresult impl_cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    lock();
    CUresult r = get_default_pool_locked(pool, dev, 1);
    unlock();
    return r;
}

static CUresult set_mem_pool_locked(CUdevice dev, CUmemoryPool pool)
{
    REQUIRE_INIT();
    struct pool *p = (struct pool *)pool;
    if (!dev_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pool_known(p) || p->dev != dev)
        return CUDA_ERROR_INVALID_VALUE;
    g_dev[dev].current_pool = p;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    lock();
    CUresult r = set_mem_pool_locked(dev, pool);
    unlock();
    return r;
}

static CUresult pool_create_locked(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    REQUIRE_INIT();
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.type == CU_MEM_LOCATION_TYPE_HOST ||
        props->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
        props->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
        return CUDA_ERROR_NOT_SUPPORTED; /* host pools: not simulated */
    if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !dev_valid(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    struct pool *p = pool_new(props->location.id, 0);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->max_size = props->maxSize;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    lock();
    CUresult r = pool_create_locked(pool, props);
    unlock();
    return r;
}

static CUresult pool_destroy_locked(CUmemoryPool pool)
{
    REQUIRE_INIT();
    struct pool *p = (struct pool *)pool;
    if (!pool_known(p) || p->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    struct device *d = &g_dev[p->dev];
    if (d->current_pool == p)
        d->current_pool = d->default_pool;
    if (p->live == 0) {
        pool_finalize(p);
    } else {
        /* Outstanding allocations keep it alive until their last free. */
        p->destroyed = 1;
        pool_shrink(p, 0);
    }
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemPoolDestroy(CUmemoryPool pool)
{
    lock();
    CUresult r = pool_destroy_locked(pool);
    unlock();
    return r;
}

static CUresult pool_trim_locked(CUmemoryPool pool, size_t keep)
{
    REQUIRE_INIT();
    struct pool *p = (struct pool *)pool;
    if (!pool_known(p))
        return CUDA_ERROR_INVALID_VALUE;
    pool_shrink(p, keep);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    lock();
    CUresult r = pool_trim_locked(pool, minBytesToKeep);
    unlock();
    return r;
}

static CUresult pool_attr_locked(CUmemoryPool pool, CUmemPool_attribute attr, void *value, int set)
{
    REQUIRE_INIT();
    struct pool *p = (struct pool *)pool;
    if (!pool_known(p) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    cuuint64_t *u64 = value;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: {
        int *flag = &p->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        if (set)
            *flag = *(int *)value != 0;
        else
            *(int *)value = *flag;
        return CUDA_SUCCESS;
    }
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        if (set)
            p->threshold = *u64;
        else
            *u64 = p->threshold;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        if (set)
            return CUDA_ERROR_INVALID_VALUE;
        *u64 = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ? p->reserved : p->used;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: {
        uint64_t *high = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ? &p->reserved_high : &p->used_high;
        if (!set) {
            *u64 = *high;
            return CUDA_SUCCESS;
        }
        if (*u64 != 0) /* the high-water marks may only be reset */
            return CUDA_ERROR_INVALID_VALUE;
        *high = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ? p->reserved : p->used;
        return CUDA_SUCCESS;
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

IMPL CUresult impl_cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    lock();
    CUresult r = pool_attr_locked(pool, attr, value, 0);
    unlock();
    return r;
}

IMPL CUresult impl_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    lock();
    CUresult r = pool_attr_locked(pool, attr, value, 1);
    unlock();
    return r;
}

/* pool == NULL: the current pool of the stream's device. */
static CUresult alloc_async_locked(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                   int from_pool, CUstream h)
{
    struct ctx *c;
    int dev;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct pool *p = (struct pool *)pool;
    if (from_pool && !pool_known(p))
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(stream_device(h, c, &dev));
    CHECK(capture_guard_stream(h));
    if (!from_pool)
        p = g_dev[dev].current_pool;
    return pool_alloc(p, c, bytesize, dptr);
}

IMPL CUresult impl_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream h)
{
    lock();
    CUresult r = alloc_async_locked(dptr, bytesize, NULL, 0, h);
    unlock();
    return r;
}

IMPL CUresult impl_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream h)
{
    lock();
    CUresult r = alloc_async_locked(dptr, bytesize, NULL, 0, h == NULL ? CU_STREAM_PER_THREAD : h);
    unlock();
    return r;
}

IMPL CUresult impl_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                           CUstream h)
{
    lock();
    CUresult r = alloc_async_locked(dptr, bytesize, pool, 1, h);
    unlock();
    return r;
}

IMPL CUresult impl_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                CUmemoryPool pool, CUstream h)
{
    lock();
    CUresult r = alloc_async_locked(dptr, bytesize, pool, 1, h == NULL ? CU_STREAM_PER_THREAD : h);
    unlock();
    return r;
}

/* Frees immediately (nothing is pending on any stream).  Memory from
 * cuMemAlloc or cuMemAllocManaged is accepted too. */
static CUresult free_async_locked(CUdeviceptr dptr, CUstream h)
{
    struct ctx *c;
    int dev;
    REQUIRE_INIT();
    CHECK(current_ctx(&c));
    CHECK(stream_device(h, c, &dev));
    if (dptr == 0)
        return CUDA_SUCCESS;
    struct tnode *n = tn_find(g_allocs, dptr);
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(capture_guard_stream(h));
    alloc_release((struct alloc *)n);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemFreeAsync(CUdeviceptr dptr, CUstream h)
{
    lock();
    CUresult r = free_async_locked(dptr, h);
    unlock();
    return r;
}

IMPL CUresult impl_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream h)
{
    lock();
    CUresult r = free_async_locked(dptr, h == NULL ? CU_STREAM_PER_THREAD : h);
    unlock();
    return r;
}

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
    lock();
    CUresult r = granularity_locked(granularity, prop, option);
    unlock();
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
    lock();
    CUresult r = mem_create_locked(handle, size, prop, flags);
    unlock();
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
    lock();
    CUresult r = mem_release_locked(handle);
    unlock();
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
    lock();
    CUresult r = retain_handle_locked(handle, addr);
    unlock();
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
    lock();
    CUresult r = address_reserve_locked(ptr, size, alignment, addr, flags);
    unlock();
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
    lock();
    CUresult r = address_free_locked(ptr, size);
    unlock();
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
    lock();
    CUresult r = mem_map_locked(ptr, size, offset, handle, flags);
    unlock();
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
    lock();
    CUresult r = mem_unmap_locked(ptr, size);
    unlock();
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
    lock();
    CUresult r = mem_set_access_locked(ptr, size, desc, count);
    unlock();
    return r;
}

/* ---- Legacy 32-bit ABI ------------------------------------------------------------------
 * These exports take CUdeviceptr_v1 (32 bits) or unsigned int sizes, which
 * cannot describe simcuda's 64-bit addresses. */

static CUresult legacy_not_supported(void)
{
    lock();
    CUresult r = g_init_state == 1 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED;
    unlock();
    return r;
}

IMPL CUresult impl_cuDeviceTotalMem_v1(unsigned int *bytes, CUdevice dev)
{
    (void)bytes;
    (void)dev;
    return legacy_not_supported();
}

IMPL CUresult impl_cuMemGetInfo_v1(unsigned int *free_bytes, unsigned int *total_bytes)
{
    (void)free_bytes;
    (void)total_bytes;
    return legacy_not_supported();
}

IMPL CUresult impl_cuMemAlloc_v1(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    (void)dptr;
    (void)bytesize;
    return legacy_not_supported();
}

IMPL CUresult impl_cuMemAllocPitch_v1(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
                                      unsigned int height, unsigned int elem)
{
    (void)dptr;
    (void)pitch;
    (void)width;
    (void)height;
    (void)elem;
    return legacy_not_supported();
}

IMPL CUresult impl_cuMemFree_v1(CUdeviceptr_v1 dptr)
{
    (void)dptr;
    return legacy_not_supported();
}

IMPL CUresult impl_cuMemGetAddressRange_v1(CUdeviceptr_v1 *pbase, unsigned int *psize,
                                           CUdeviceptr_v1 dptr)
{
    (void)pbase;
    (void)psize;
    (void)dptr;
    return legacy_not_supported();
}

/* ---- CUDA 12 and 13 additions: streams, contexts, pointers, VMM sharing ---------------- */

IMPL CUresult impl_cuStreamCreateWithPriority(CUstream *ph, unsigned flags, int priority)
{
    lock();
    CUresult r = stream_create_locked(ph, flags, priority);
    unlock();
    return r;
}

/* Looks up a stream; the special handles mean the current context's default
 * stream (NULL *out, priority 0, flags 0). */
static CUresult stream_lookup_locked(CUstream h, struct ctx **c, struct stream **out)
{
    REQUIRE_INIT();
    CHECK(current_ctx(c));
    *out = NULL;
    if (is_special_stream(h))
        return CUDA_SUCCESS;
    struct tnode *n = tn_find(g_streams, (uint64_t)(uintptr_t)h);
    if (!n)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = (struct stream *)n;
    return CUDA_SUCCESS;
}

enum stream_query { SQ_PRIORITY, SQ_FLAGS, SQ_ID, SQ_CTX, SQ_DEVICE };

static CUresult stream_query(CUstream h, enum stream_query what, void *out)
{
    struct ctx *c;
    struct stream *s;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = stream_lookup_locked(h, &c, &s);
    if (r == CUDA_SUCCESS) {
        switch (what) {
        case SQ_PRIORITY: *(int *)out = s ? s->priority : 0; break;
        case SQ_FLAGS: *(unsigned *)out = s ? s->flags : 0; break;
        case SQ_ID:
            *(unsigned long long *)out = s ? s->id : h == CU_STREAM_PER_THREAD ? 2 : 1;
            break;
        case SQ_CTX: *(CUcontext *)out = (CUcontext)(s ? s->ctx : c); break;
        case SQ_DEVICE: *(CUdevice *)out = s ? s->ctx->dev : c->dev; break;
        }
    }
    unlock();
    return r;
}

static CUstream ptsz(CUstream h) { return h ? h : CU_STREAM_PER_THREAD; }

IMPL CUresult impl_cuStreamGetPriority(CUstream h, int *p) { return stream_query(h, SQ_PRIORITY, p); }
IMPL CUresult impl_cuStreamGetPriority_ptsz(CUstream h, int *p)
{
    return stream_query(ptsz(h), SQ_PRIORITY, p);
}
IMPL CUresult impl_cuStreamGetFlags(CUstream h, unsigned *f) { return stream_query(h, SQ_FLAGS, f); }
IMPL CUresult impl_cuStreamGetFlags_ptsz(CUstream h, unsigned *f)
{
    return stream_query(ptsz(h), SQ_FLAGS, f);
}
IMPL CUresult impl_cuStreamGetId(CUstream h, unsigned long long *id)
{
    return stream_query(h, SQ_ID, id);
}
IMPL CUresult impl_cuStreamGetId_ptsz(CUstream h, unsigned long long *id)
{
    return stream_query(ptsz(h), SQ_ID, id);
}
IMPL CUresult impl_cuStreamGetCtx(CUstream h, CUcontext *c) { return stream_query(h, SQ_CTX, c); }
IMPL CUresult impl_cuStreamGetCtx_ptsz(CUstream h, CUcontext *c)
{
    return stream_query(ptsz(h), SQ_CTX, c);
}
/* 12.5's ABI adds the green context, which simcuda never has. */
IMPL CUresult impl_cuStreamGetCtx_v2(CUstream h, CUcontext *c, void **green)
{
    if (green)
        *green = NULL;
    return stream_query(h, SQ_CTX, c);
}
IMPL CUresult impl_cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext *c, void **green)
{
    if (green)
        *green = NULL;
    return stream_query(ptsz(h), SQ_CTX, c);
}
IMPL CUresult impl_cuStreamGetDevice(CUstream h, CUdevice *d)
{
    return stream_query(h, SQ_DEVICE, d);
}
IMPL CUresult impl_cuStreamGetDevice_ptsz(CUstream h, CUdevice *d)
{
    return stream_query(ptsz(h), SQ_DEVICE, d);
}

/* The three ABIs of cuStreamGetCaptureInfo: simcuda records no graph, so
 * there are never dependencies to report. */
static CUresult capture_info(CUstream h, CUstreamCaptureStatus *status, unsigned long long *id,
                             void **graph, const void **deps, const void **edges, size_t *ndeps)
{
    CUresult r = impl_cuStreamIsCapturing(h, status);
    if (r != CUDA_SUCCESS)
        return r;
    lock();
    struct capture **slot = NULL;
    if (capture_slot(h, &slot) == CUDA_SUCCESS && id)
        *id = slot && *slot ? (unsigned long long)(uintptr_t)*slot : 0;
    unlock();
    if (graph)
        *graph = NULL;
    if (deps)
        *deps = NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = 0;
    return CUDA_SUCCESS;
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v1(CUstream h, CUstreamCaptureStatus *s,
                                             unsigned long long *id)
{
    return capture_info(h, s, id, NULL, NULL, NULL, NULL);
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v1_ptsz(CUstream h, CUstreamCaptureStatus *s,
                                                  unsigned long long *id)
{
    return capture_info(ptsz(h), s, id, NULL, NULL, NULL, NULL);
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *s,
                                             unsigned long long *id, void **g, const void **d,
                                             size_t *n)
{
    return capture_info(h, s, id, g, d, NULL, n);
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus *s,
                                                  unsigned long long *id, void **g,
                                                  const void **d, size_t *n)
{
    return capture_info(ptsz(h), s, id, g, d, NULL, n);
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *s,
                                             unsigned long long *id, void **g, const void **d,
                                             const void **e, size_t *n)
{
    return capture_info(h, s, id, g, d, e, n);
}
IMPL CUresult impl_cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *s,
                                                  unsigned long long *id, void **g,
                                                  const void **d, const void **e, size_t *n)
{
    return capture_info(ptsz(h), s, id, g, d, e, n);
}

/* 13.0's ABIs of cuCtxGetDevice and cuCtxSynchronize name the context. */
static CUresult ctx_or_current_locked(CUcontext h, struct ctx **out)
{
    REQUIRE_INIT();
    if (!h)
        return current_ctx(out);
    if (!ctx_usable((struct ctx *)h))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = (struct ctx *)h;
    return CUDA_SUCCESS;
}
IMPL CUresult impl_cuCtxGetDevice_v2(CUdevice *device, CUcontext h)
{
    struct ctx *c;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = ctx_or_current_locked(h, &c);
    if (r == CUDA_SUCCESS)
        *device = c->dev;
    unlock();
    return r;
}
IMPL CUresult impl_cuCtxSynchronize_v2(CUcontext h)
{
    struct ctx *c;
    lock();
    CUresult r = ctx_or_current_locked(h, &c);
    if (r == CUDA_SUCCESS)
        r = capture_guard();
    if (r == CUDA_SUCCESS)
        trim_device_pools(c->dev);
    unlock();
    return r;
}

IMPL CUresult impl_cuCtxGetFlags(unsigned *flags)
{
    struct ctx *c;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = g_init_state == 1 ? current_ctx(&c) : CUDA_ERROR_NOT_INITIALIZED;
    if (r == CUDA_SUCCESS)
        *flags = c->flags;
    unlock();
    return r;
}
IMPL CUresult impl_cuCtxSetFlags(unsigned flags)
{
    struct ctx *c;
    if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = g_init_state == 1 ? current_ctx(&c) : CUDA_ERROR_NOT_INITIALIZED;
    if (r == CUDA_SUCCESS)
        c->flags = flags;
    unlock();
    return r;
}
IMPL CUresult impl_cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned flags)
{
    if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = g_init_state != 1 ? CUDA_ERROR_NOT_INITIALIZED
                 : !dev_valid(dev)  ? CUDA_ERROR_INVALID_DEVICE
                                    : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS)
        g_dev[dev].primary.flags = flags;
    unlock();
    return r;
}

/* ---- Pointer attributes ---- */

/* CUpointer_attribute and CUmemorytype values (cuda.h). */
enum {
    PA_CONTEXT = 1, PA_MEMORY_TYPE = 2, PA_DEVICE_POINTER = 3, PA_HOST_POINTER = 4,
    PA_SYNC_MEMOPS = 6, PA_BUFFER_ID = 7, PA_IS_MANAGED = 8, PA_DEVICE_ORDINAL = 9,
    PA_IS_LEGACY_CUDA_IPC_CAPABLE = 10, PA_RANGE_START_ADDR = 11, PA_RANGE_SIZE = 12,
    PA_MAPPED = 13, PA_ALLOWED_HANDLE_TYPES = 14, PA_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
    PA_ACCESS_FLAGS = 16, PA_MEMPOOL_HANDLE = 17, PA_MAPPING_SIZE = 18,
    PA_MAPPING_BASE_ADDR = 19, PA_MEMORY_BLOCK_ID = 20,
};
enum { MEMTYPE_HOST = 1, MEMTYPE_DEVICE = 2 };

struct pointer_info {
    int known, managed, host, dev;
    struct ctx *ctx;
    uint64_t base, size;
    struct pool *pool;
};

static struct pointer_info pointer_lookup_locked(uint64_t p)
{
    struct pointer_info info = {0};
    struct tnode *n = tn_find_le(g_allocs, p);
    if (n && p < n->key + (n->len ? n->len : 1)) {
        struct alloc *a = (struct alloc *)n;
        info = (struct pointer_info){1, a->kind == AK_MANAGED, 0, a->dev, a->ctx,
                                     n->key, n->len, a->pool};
        return info;
    }
    if ((n = tn_find_le(g_host, p)) && p < n->key + n->len) {
        info = (struct pointer_info){1, 0, 1, 0, tls_top(), n->key, n->len, NULL};
        return info;
    }
    if ((n = tn_find_le(g_maps, p)) && p < n->key + n->len) {
        struct mapping *m = (struct mapping *)n;
        info = (struct pointer_info){1, 0, 0, g_phys[m->phys].dev,
                                     &g_dev[g_phys[m->phys].dev].primary, n->key, n->len, NULL};
    }
    return info;
}

static CUresult pointer_attribute_locked(const struct pointer_info *i, int attr, void *data,
                                         uint64_t p)
{
    switch (attr) {
    case PA_CONTEXT: *(CUcontext *)data = (CUcontext)i->ctx; break;
    case PA_MEMORY_TYPE: *(unsigned *)data = i->host ? MEMTYPE_HOST : MEMTYPE_DEVICE; break;
    case PA_DEVICE_POINTER: *(CUdeviceptr *)data = p; break;
    case PA_HOST_POINTER:
        if (!i->host && !i->managed)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)p;
        break;
    case PA_SYNC_MEMOPS: *(int *)data = 1; break;
    case PA_BUFFER_ID: *(unsigned long long *)data = i->base; break;
    case PA_IS_MANAGED: *(unsigned *)data = (unsigned)i->managed; break;
    case PA_DEVICE_ORDINAL: *(int *)data = i->dev; break;
    case PA_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = 0; break;
    case PA_RANGE_START_ADDR: *(CUdeviceptr *)data = i->base; break;
    case PA_RANGE_SIZE: *(size_t *)data = i->size; break;
    case PA_MAPPED: *(int *)data = 1; break;
    case PA_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = 0; break;
    case PA_IS_GPU_DIRECT_RDMA_CAPABLE: *(int *)data = 0; break;
    case PA_ACCESS_FLAGS: *(unsigned *)data = 3; /* CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE */
        break;
    case PA_MEMPOOL_HANDLE: *(CUmemoryPool *)data = (CUmemoryPool)i->pool; break;
    case PA_MAPPING_SIZE: *(size_t *)data = i->size; break;
    case PA_MAPPING_BASE_ADDR: *(CUdeviceptr *)data = i->base; break;
    case PA_MEMORY_BLOCK_ID: *(unsigned long long *)data = i->base; break;
    default:
        sim_trace("pointer attribute %d: unknown", attr);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = CUDA_SUCCESS;
    if (g_init_state != 1) {
        r = CUDA_ERROR_NOT_INITIALIZED;
    } else {
        struct pointer_info i = pointer_lookup_locked(p);
        r = i.known ? pointer_attribute_locked(&i, attr, data, p) : CUDA_ERROR_INVALID_VALUE;
    }
    unlock();
    return r;
}

/* Unlike the single query, an address the driver does not know is not an
 * error here: its memory type reads as 0 ("unregistered host memory"). */
IMPL CUresult impl_cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p)
{
    if (!attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = g_init_state == 1 ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    struct pointer_info i = pointer_lookup_locked(p);
    for (unsigned k = 0; r == CUDA_SUCCESS && k < n; k++) {
        if (!data[k])
            continue;
        if (!i.known) {
            switch (attrs[k]) {
            case PA_CONTEXT: *(CUcontext *)data[k] = NULL; break;
            case PA_MEMORY_TYPE: *(unsigned *)data[k] = 0; break;
            case PA_DEVICE_POINTER: *(CUdeviceptr *)data[k] = 0; break;
            case PA_HOST_POINTER: *(void **)data[k] = NULL; break;
            case PA_IS_MANAGED: *(unsigned *)data[k] = 0; break;
            case PA_DEVICE_ORDINAL: *(int *)data[k] = -2; break;
            default: memset(data[k], 0, sizeof(int)); break;
            }
            continue;
        }
        if (pointer_attribute_locked(&i, attrs[k], data[k], p) != CUDA_SUCCESS)
            memset(data[k], 0, sizeof(int));
    }
    unlock();
    return r;
}

IMPL CUresult impl_cuMemHostGetDevicePointer(CUdeviceptr *dptr, void *p, unsigned flags)
{
    if (!dptr || flags)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct tnode *n = g_init_state == 1 ? tn_find_le(g_host, (uint64_t)(uintptr_t)p) : NULL;
    int ok = n && (uint64_t)(uintptr_t)p < n->key + n->len;
    unlock();
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemHostGetFlags(unsigned *flags, void *p)
{
    CUdeviceptr d;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = impl_cuMemHostGetDevicePointer(&d, p, 0);
    if (r == CUDA_SUCCESS)
        *flags = 0x2; /* CU_MEMHOSTALLOC_DEVICEMAP: every pinned buffer is mapped */
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
    lock();
    struct phys *ph = g_init_state == 1 ? phys_lookup(handle) : NULL;
    int fd = ph && ph->refs ? fcntl(ph->fd, F_DUPFD_CLOEXEC, 0) : -2;
    unlock();
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
    lock();
    CUresult r = g_init_state == 1 ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    for (uint32_t i = 0; r == CUDA_SUCCESS && i < g_nphys; i++) {
        struct stat mine;
        struct phys *ph = &g_phys[i];
        if (ph->in_use && ph->refs && fstat(ph->fd, &mine) == 0 && mine.st_ino == st.st_ino &&
            mine.st_dev == st.st_dev) {
            ph->refs++;
            *handle = phys_handle(ph);
            unlock();
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
    unlock();
    return r;
}

IMPL CUresult impl_cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                          CUmemGenericAllocationHandle handle)
{
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    struct phys *ph = g_init_state == 1 ? phys_lookup(handle) : NULL;
    if (ph) {
        memset(prop, 0, sizeof *prop);
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = ph->dev;
        prop->requestedHandleTypes = HANDLE_TYPE_POSIX_FD;
    }
    unlock();
    return ph ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

IMPL CUresult impl_cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                                  CUdeviceptr ptr)
{
    if (!flags || !location)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    int mapped = g_init_state == 1 && mapping_at(ptr) != NULL;
    unlock();
    if (!mapped)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return CUDA_SUCCESS;
}

static const struct sim_proc k_procs_more[] = {
    {"cuStreamCreateWithPriority", 5050, (void *)impl_cuStreamCreateWithPriority, NULL},
    {"cuStreamGetPriority", 5050, (void *)impl_cuStreamGetPriority,
     (void *)impl_cuStreamGetPriority_ptsz},
    {"cuStreamGetFlags", 5050, (void *)impl_cuStreamGetFlags, (void *)impl_cuStreamGetFlags_ptsz},
    {"cuStreamGetId", 12000, (void *)impl_cuStreamGetId, (void *)impl_cuStreamGetId_ptsz},
    {"cuStreamGetCtx", 9020, (void *)impl_cuStreamGetCtx, (void *)impl_cuStreamGetCtx_ptsz},
    {"cuStreamGetCtx", 12050, (void *)impl_cuStreamGetCtx_v2, (void *)impl_cuStreamGetCtx_v2_ptsz},
    {"cuStreamGetDevice", 12080, (void *)impl_cuStreamGetDevice,
     (void *)impl_cuStreamGetDevice_ptsz},
    {"cuStreamGetCaptureInfo", 10010, (void *)impl_cuStreamGetCaptureInfo_v1,
     (void *)impl_cuStreamGetCaptureInfo_v1_ptsz},
    {"cuStreamGetCaptureInfo", 11030, (void *)impl_cuStreamGetCaptureInfo_v2,
     (void *)impl_cuStreamGetCaptureInfo_v2_ptsz},
    {"cuStreamGetCaptureInfo", 12030, (void *)impl_cuStreamGetCaptureInfo_v3,
     (void *)impl_cuStreamGetCaptureInfo_v3_ptsz},
    {"cuCtxGetDevice", 13000, (void *)impl_cuCtxGetDevice_v2, NULL},
    {"cuCtxSynchronize", 13000, (void *)impl_cuCtxSynchronize_v2, NULL},
    {"cuCtxGetFlags", 7000, (void *)impl_cuCtxGetFlags, NULL},
    {"cuCtxSetFlags", 12010, (void *)impl_cuCtxSetFlags, NULL},
    {"cuDevicePrimaryCtxSetFlags", 7000, (void *)impl_cuDevicePrimaryCtxSetFlags, NULL},
    {"cuDevicePrimaryCtxSetFlags", 11000, (void *)impl_cuDevicePrimaryCtxSetFlags, NULL},
    {"cuPointerGetAttribute", 4000, (void *)impl_cuPointerGetAttribute, NULL},
    {"cuPointerGetAttributes", 7000, (void *)impl_cuPointerGetAttributes, NULL},
    {"cuMemHostGetDevicePointer", 3020, (void *)impl_cuMemHostGetDevicePointer, NULL},
    {"cuMemHostGetFlags", 2030, (void *)impl_cuMemHostGetFlags, NULL},
    {"cuMemExportToShareableHandle", 10020, (void *)impl_cuMemExportToShareableHandle, NULL},
    {"cuMemImportFromShareableHandle", 10020, (void *)impl_cuMemImportFromShareableHandle, NULL},
    {"cuMemGetAllocationPropertiesFromHandle", 10020,
     (void *)impl_cuMemGetAllocationPropertiesFromHandle, NULL},
    {"cuMemGetAccess", 10020, (void *)impl_cuMemGetAccess, NULL},
};

EXPORT CUresult cuStreamCreateWithPriority(CUstream *h, unsigned f, int p) { return impl_cuStreamCreateWithPriority(h, f, p); }
EXPORT CUresult cuStreamGetPriority(CUstream h, int *p) { return impl_cuStreamGetPriority(h, p); }
EXPORT CUresult cuStreamGetPriority_ptsz(CUstream h, int *p) { return impl_cuStreamGetPriority_ptsz(h, p); }
EXPORT CUresult cuStreamGetFlags(CUstream h, unsigned *f) { return impl_cuStreamGetFlags(h, f); }
EXPORT CUresult cuStreamGetFlags_ptsz(CUstream h, unsigned *f) { return impl_cuStreamGetFlags_ptsz(h, f); }
EXPORT CUresult cuStreamGetId(CUstream h, unsigned long long *i) { return impl_cuStreamGetId(h, i); }
EXPORT CUresult cuStreamGetId_ptsz(CUstream h, unsigned long long *i) { return impl_cuStreamGetId_ptsz(h, i); }
EXPORT CUresult cuStreamGetCtx(CUstream h, CUcontext *c) { return impl_cuStreamGetCtx(h, c); }
EXPORT CUresult cuStreamGetCtx_ptsz(CUstream h, CUcontext *c) { return impl_cuStreamGetCtx_ptsz(h, c); }
EXPORT CUresult cuStreamGetCtx_v2(CUstream h, CUcontext *c, void **g) { return impl_cuStreamGetCtx_v2(h, c, g); }
EXPORT CUresult cuStreamGetCtx_v2_ptsz(CUstream h, CUcontext *c, void **g) { return impl_cuStreamGetCtx_v2_ptsz(h, c, g); }
EXPORT CUresult cuStreamGetDevice(CUstream h, CUdevice *d) { return impl_cuStreamGetDevice(h, d); }
EXPORT CUresult cuStreamGetDevice_ptsz(CUstream h, CUdevice *d) { return impl_cuStreamGetDevice_ptsz(h, d); }
EXPORT CUresult cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, const void **e, size_t *n) { return impl_cuStreamGetCaptureInfo_v3(h, s, id, g, d, e, n); }
EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, const void **e, size_t *n) { return impl_cuStreamGetCaptureInfo_v3_ptsz(h, s, id, g, d, e, n); }
EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, size_t *n) { return impl_cuStreamGetCaptureInfo_v2(h, s, id, g, d, n); }
EXPORT CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, size_t *n) { return impl_cuStreamGetCaptureInfo_v2_ptsz(h, s, id, g, d, n); }
EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, const void **e, size_t *n) { return impl_cuStreamGetCaptureInfo_v3(h, s, id, g, d, e, n); }
EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *s, unsigned long long *id, void **g, const void **d, const void **e, size_t *n) { return impl_cuStreamGetCaptureInfo_v3_ptsz(h, s, id, g, d, e, n); }
EXPORT CUresult cuCtxGetDevice_v2(CUdevice *d, CUcontext c) { return impl_cuCtxGetDevice_v2(d, c); }
EXPORT CUresult cuCtxSynchronize_v2(CUcontext c) { return impl_cuCtxSynchronize_v2(c); }
EXPORT CUresult cuCtxGetFlags(unsigned *f) { return impl_cuCtxGetFlags(f); }
EXPORT CUresult cuCtxSetFlags(unsigned f) { return impl_cuCtxSetFlags(f); }
EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned f) { return impl_cuDevicePrimaryCtxSetFlags(d, f); }
EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned f) { return impl_cuDevicePrimaryCtxSetFlags(d, f); }
EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) { return impl_cuPointerGetAttribute(data, attr, p); }
EXPORT CUresult cuPointerGetAttributes(unsigned n, int *a, void **d, CUdeviceptr p) { return impl_cuPointerGetAttributes(n, a, d, p); }
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned f) { return impl_cuMemHostGetDevicePointer(d, p, f); }
EXPORT CUresult cuMemHostGetFlags(unsigned *f, void *p) { return impl_cuMemHostGetFlags(f, p); }
EXPORT CUresult cuMemExportToShareableHandle(void *o, CUmemGenericAllocationHandle h, int t, unsigned long long f) { return impl_cuMemExportToShareableHandle(o, h, t, f); }
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *o, int t) { return impl_cuMemImportFromShareableHandle(h, o, t); }
EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *p, CUmemGenericAllocationHandle h) { return impl_cuMemGetAllocationPropertiesFromHandle(p, h); }
EXPORT CUresult cuMemGetAccess(unsigned long long *f, const CUmemLocation *l, CUdeviceptr p) { return impl_cuMemGetAccess(f, l, p); }

/* ---- Interface for the other driver files (internal.h) ------------------------------ */

CUresult sim_initialized(void)
{
    lock();
    int ok = g_init_state == 1;
    unlock();
    return ok ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

int sim_device_count(void)
{
    lock();
    int n = g_init_state == 1 ? g_ndev : 0;
    unlock();
    return n;
}

CUresult sim_current_ctx(CUcontext *out)
{
    struct ctx *c;
    lock();
    CUresult r = g_init_state == 1 ? current_ctx(&c) : CUDA_ERROR_NOT_INITIALIZED;
    unlock();
    if (r == CUDA_SUCCESS)
        *out = (CUcontext)c;
    return r;
}

CUresult sim_ctx_device(CUcontext ctx, CUdevice *dev)
{
    CUresult r = CUDA_SUCCESS;
    lock();
    struct ctx *c = (struct ctx *)ctx;
    if (g_init_state != 1)
        r = CUDA_ERROR_NOT_INITIALIZED;
    else if (!c && current_ctx(&c) != CUDA_SUCCESS)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (!ctx_known(c))
        r = CUDA_ERROR_INVALID_CONTEXT;
    else
        *dev = c->dev;
    unlock();
    return r;
}

CUresult sim_primary_ctx(CUdevice dev, CUcontext *out)
{
    CUresult r = CUDA_SUCCESS;
    lock();
    if (g_init_state != 1)
        r = CUDA_ERROR_NOT_INITIALIZED;
    else if (!dev_valid(dev))
        r = CUDA_ERROR_INVALID_DEVICE;
    else
        *out = (CUcontext)&g_dev[dev].primary;
    unlock();
    return r;
}

int sim_addressable(uint64_t addr, uint64_t len)
{
    lock();
    int ok = 0;
    struct tnode *n = tn_find_le(g_allocs, addr);
    if (n && addr + len <= n->key + ((struct alloc *)n)->charged)
        ok = 1;
    if (!ok && (n = tn_find_le(g_host, addr)) && addr + len <= n->key + n->len)
        ok = 1;
    if (!ok && (n = tn_find_le(g_maps, addr)) && addr + len <= n->key + n->len)
        ok = 1;
    unlock();
    return ok;
}

CUresult sim_stream_check(CUstream s)
{
    if (is_special_stream(s))
        return CUDA_SUCCESS;
    lock();
    int ok = tn_find(g_streams, (uint64_t)(uintptr_t)s) != NULL;
    unlock();
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

void sim_trace(const char *fmt, ...)
{
    static int enabled = -1;
    if (enabled < 0) {
        const char *v = getenv("SIMCUDA_TRACE");
        enabled = v && *v && strcmp(v, "0") != 0;
    }
    if (!enabled)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "simcuda: %s\n", line);
}

/* For the NVML stand-in (libnvidia-ml.so.1), which finds it with dlsym: the
 * same free and total memory cuMemGetInfo reports, for any device. */
EXPORT int simcuda_memory_info(int ordinal, unsigned long long *free_bytes,
                               unsigned long long *total_bytes)
{
    int r = -1;
    lock();
    if (g_init_state == 1 && dev_valid(ordinal) && free_bytes && total_bytes) {
        *total_bytes = g_dev[ordinal].capacity;
        *free_bytes = g_dev[ordinal].capacity - g_dev[ordinal].used;
        r = 0;
    }
    unlock();
    return r;
}

/* ---- cuGetProcAddress ------------------------------------------------------------------- */

IMPL CUresult impl_cuGetProcAddress_v1(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags);
IMPL CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult *status);

/* (base name, CUDA version that introduced this ABI, implementation, the
 * per-thread-default-stream twin if there is one).  For each name the entry
 * with the highest version <= the caller's version wins. */
static const struct sim_proc k_procs[] = {
    {"cuGetErrorString", 6000, (void *)impl_cuGetErrorString, NULL},
    {"cuGetErrorName", 6000, (void *)impl_cuGetErrorName, NULL},
    {"cuInit", 2000, (void *)impl_cuInit, NULL},
    {"cuDriverGetVersion", 2020, (void *)impl_cuDriverGetVersion, NULL},
    {"cuDeviceGet", 2000, (void *)impl_cuDeviceGet, NULL},
    {"cuDeviceGetCount", 2000, (void *)impl_cuDeviceGetCount, NULL},
    {"cuDeviceGetName", 2000, (void *)impl_cuDeviceGetName, NULL},
    {"cuDeviceTotalMem", 2000, (void *)impl_cuDeviceTotalMem_v1, NULL},
    {"cuDeviceTotalMem", 3020, (void *)impl_cuDeviceTotalMem_v2, NULL},
    {"cuDeviceGetAttribute", 2000, (void *)impl_cuDeviceGetAttribute, NULL},
    {"cuDevicePrimaryCtxRetain", 7000, (void *)impl_cuDevicePrimaryCtxRetain, NULL},
    {"cuDevicePrimaryCtxRelease", 7000, (void *)impl_cuDevicePrimaryCtxRelease_v1, NULL},
    {"cuDevicePrimaryCtxRelease", 11000, (void *)impl_cuDevicePrimaryCtxRelease_v2, NULL},
    {"cuDevicePrimaryCtxReset", 7000, (void *)impl_cuDevicePrimaryCtxReset_v1, NULL},
    {"cuDevicePrimaryCtxReset", 11000, (void *)impl_cuDevicePrimaryCtxReset_v2, NULL},
    {"cuDevicePrimaryCtxGetState", 7000, (void *)impl_cuDevicePrimaryCtxGetState, NULL},
    {"cuCtxCreate", 2000, (void *)impl_cuCtxCreate_v1, NULL},
    {"cuCtxCreate", 3020, (void *)impl_cuCtxCreate_v2, NULL},
    {"cuCtxCreate", 11040, (void *)impl_cuCtxCreate_v3, NULL},
    {"cuCtxCreate", 12050, (void *)impl_cuCtxCreate_v4, NULL},
    {"cuCtxDestroy", 2000, (void *)impl_cuCtxDestroy_v1, NULL},
    {"cuCtxDestroy", 4000, (void *)impl_cuCtxDestroy_v2, NULL},
    {"cuCtxPushCurrent", 2000, (void *)impl_cuCtxPushCurrent_v1, NULL},
    {"cuCtxPushCurrent", 4000, (void *)impl_cuCtxPushCurrent_v2, NULL},
    {"cuCtxPopCurrent", 2000, (void *)impl_cuCtxPopCurrent_v1, NULL},
    {"cuCtxPopCurrent", 4000, (void *)impl_cuCtxPopCurrent_v2, NULL},
    {"cuCtxSetCurrent", 4000, (void *)impl_cuCtxSetCurrent, NULL},
    {"cuCtxGetCurrent", 4000, (void *)impl_cuCtxGetCurrent, NULL},
    {"cuCtxGetDevice", 2000, (void *)impl_cuCtxGetDevice, NULL},
    {"cuCtxSynchronize", 2000, (void *)impl_cuCtxSynchronize, NULL},
    {"cuMemGetInfo", 2000, (void *)impl_cuMemGetInfo_v1, NULL},
    {"cuMemGetInfo", 3020, (void *)impl_cuMemGetInfo_v2, NULL},
    {"cuMemAlloc", 2000, (void *)impl_cuMemAlloc_v1, NULL},
    {"cuMemAlloc", 3020, (void *)impl_cuMemAlloc_v2, NULL},
    {"cuMemAllocPitch", 2000, (void *)impl_cuMemAllocPitch_v1, NULL},
    {"cuMemAllocPitch", 3020, (void *)impl_cuMemAllocPitch_v2, NULL},
    {"cuMemFree", 2000, (void *)impl_cuMemFree_v1, NULL},
    {"cuMemFree", 3020, (void *)impl_cuMemFree_v2, NULL},
    {"cuMemGetAddressRange", 2000, (void *)impl_cuMemGetAddressRange_v1, NULL},
    {"cuMemGetAddressRange", 3020, (void *)impl_cuMemGetAddressRange_v2, NULL},
    {"cuMemAllocHost", 2000, (void *)impl_cuMemAllocHost_v1, NULL},
    {"cuMemAllocHost", 3020, (void *)impl_cuMemAllocHost_v2, NULL},
    {"cuMemFreeHost", 2000, (void *)impl_cuMemFreeHost, NULL},
    {"cuMemHostAlloc", 2020, (void *)impl_cuMemHostAlloc, NULL},
    {"cuMemAllocManaged", 6000, (void *)impl_cuMemAllocManaged, NULL},
    {"cuStreamCreate", 2000, (void *)impl_cuStreamCreate, NULL},
    {"cuStreamDestroy", 2000, (void *)impl_cuStreamDestroy_v1, NULL},
    {"cuStreamDestroy", 4000, (void *)impl_cuStreamDestroy_v2, NULL},
    {"cuStreamSynchronize", 2000, (void *)impl_cuStreamSynchronize, NULL},
    {"cuStreamSynchronize", 7000, (void *)impl_cuStreamSynchronize,
     (void *)impl_cuStreamSynchronize_ptsz},
    {"cuStreamBeginCapture", 10000, (void *)impl_cuStreamBeginCapture_v1,
     (void *)impl_cuStreamBeginCapture_v1_ptsz},
    {"cuStreamBeginCapture", 10010, (void *)impl_cuStreamBeginCapture_v2,
     (void *)impl_cuStreamBeginCapture_v2_ptsz},
    {"cuStreamEndCapture", 10000, (void *)impl_cuStreamEndCapture, (void *)impl_cuStreamEndCapture_ptsz},
    {"cuStreamIsCapturing", 10000, (void *)impl_cuStreamIsCapturing, (void *)impl_cuStreamIsCapturing_ptsz},
    {"cuThreadExchangeStreamCaptureMode", 10010, (void *)impl_cuThreadExchangeStreamCaptureMode, NULL},
    {"cuGraphDestroy", 10000, (void *)impl_cuGraphDestroy, NULL},
    {"cuMemGetAllocationGranularity", 10020, (void *)impl_cuMemGetAllocationGranularity, NULL},
    {"cuMemCreate", 10020, (void *)impl_cuMemCreate, NULL},
    {"cuMemRelease", 10020, (void *)impl_cuMemRelease, NULL},
    {"cuMemAddressReserve", 10020, (void *)impl_cuMemAddressReserve, NULL},
    {"cuMemAddressFree", 10020, (void *)impl_cuMemAddressFree, NULL},
    {"cuMemMap", 10020, (void *)impl_cuMemMap, NULL},
    {"cuMemUnmap", 10020, (void *)impl_cuMemUnmap, NULL},
    {"cuMemSetAccess", 10020, (void *)impl_cuMemSetAccess, NULL},
    {"cuMemRetainAllocationHandle", 11000, (void *)impl_cuMemRetainAllocationHandle, NULL},
    {"cuDeviceGetDefaultMemPool", 11020, (void *)impl_cuDeviceGetDefaultMemPool, NULL},
    {"cuDeviceGetMemPool", 11020, (void *)impl_cuDeviceGetMemPool, NULL},
    {"cuDeviceSetMemPool", 11020, (void *)impl_cuDeviceSetMemPool, NULL},
    {"cuMemPoolCreate", 11020, (void *)impl_cuMemPoolCreate, NULL},
    {"cuMemPoolDestroy", 11020, (void *)impl_cuMemPoolDestroy, NULL},
    {"cuMemPoolTrimTo", 11020, (void *)impl_cuMemPoolTrimTo, NULL},
    {"cuMemPoolGetAttribute", 11020, (void *)impl_cuMemPoolGetAttribute, NULL},
    {"cuMemPoolSetAttribute", 11020, (void *)impl_cuMemPoolSetAttribute, NULL},
    {"cuMemAllocAsync", 11020, (void *)impl_cuMemAllocAsync, (void *)impl_cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, (void *)impl_cuMemAllocFromPoolAsync,
     (void *)impl_cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", 11020, (void *)impl_cuMemFreeAsync, (void *)impl_cuMemFreeAsync_ptsz},
    {"cuGetProcAddress", 11030, (void *)impl_cuGetProcAddress_v1, NULL},
    {"cuGetProcAddress", 12000, (void *)impl_cuGetProcAddress_v2, NULL},
};
static const size_t k_nprocs = sizeof k_procs / sizeof k_procs[0];
static const size_t k_nprocs_more = sizeof k_procs_more / sizeof k_procs_more[0];

/* Callable before cuInit, like the real one; touches no mutable state. */
IMPL CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_GET_PROC_ADDRESS_DEFAULT && flags != CU_GET_PROC_ADDRESS_LEGACY_STREAM &&
        flags != CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    /* libcuda.c's own table first, then each area's (see internal.h). */
    static const struct {
        const struct sim_proc *procs;
        const size_t *count;
    } tables[] = {
        {k_procs, &k_nprocs},
        {k_procs_more, &k_nprocs_more},
        {sim_procs_copies, &sim_nprocs_copies},
        {sim_procs_modules, &sim_nprocs_modules},
        {sim_procs_events, &sim_nprocs_events},
        {sim_procs_misc, &sim_nprocs_misc},
        {sim_procs_export_tables, &sim_nprocs_export_tables},
    };
    const struct sim_proc *best = NULL;
    int known = 0;
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        for (size_t i = 0; i < *tables[t].count; i++) {
            const struct sim_proc *p = &tables[t].procs[i];
            if (strcmp(p->name, symbol) != 0)
                continue;
            known = 1;
            if (p->version <= cudaVersion && (!best || p->version > best->version))
                best = p;
        }
    }
    /* A real CUDA function simcuda does not implement is found, and fails
     * when called, as it would on a driver without that feature. */
    for (size_t i = 0; !known && i < sim_unsupported_nprocs; i++) {
        if (strcmp(sim_unsupported_procs[i].name, symbol) == 0) {
            best = &sim_unsupported_procs[i];
            known = 1;
        }
    }
    if (!best)
        sim_trace("cuGetProcAddress: %s at %d: %s", symbol, cudaVersion,
                  known ? "version not sufficient" : "not found");
    *pfn = NULL;
    if (!best) {
        if (status)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = (flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM && best->ptsz) ? best->ptsz
                                                                                 : best->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuGetProcAddress_v1(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags)
{
    return impl_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* ---- Exports ------------------------------------------------------------------------------
 * Thin wrappers only: internal code never calls these, so nothing inside the
 * library goes through the PLT or can be interposed. */

EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr) { return impl_cuGetErrorString(error, pStr); }
EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr) { return impl_cuGetErrorName(error, pStr); }
EXPORT CUresult cuInit(unsigned int Flags) { return impl_cuInit(Flags); }
EXPORT CUresult cuDriverGetVersion(int *driverVersion) { return impl_cuDriverGetVersion(driverVersion); }
EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) { return impl_cuDeviceGet(device, ordinal); }
EXPORT CUresult cuDeviceGetCount(int *count) { return impl_cuDeviceGetCount(count); }
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) { return impl_cuDeviceGetName(name, len, dev); }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) { return impl_cuDeviceTotalMem_v2(bytes, dev); }
EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) { return impl_cuDeviceTotalMem_v1(bytes, dev); }
EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) { return impl_cuDeviceGetAttribute(pi, attrib, dev); }

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) { return impl_cuDevicePrimaryCtxRetain(pctx, dev); }
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return impl_cuDevicePrimaryCtxRelease_v2(dev); }
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return impl_cuDevicePrimaryCtxRelease_v1(dev); }
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { return impl_cuDevicePrimaryCtxReset_v2(dev); }
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return impl_cuDevicePrimaryCtxReset_v1(dev); }
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) { return impl_cuDevicePrimaryCtxGetState(dev, flags, active); }
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) { return impl_cuCtxCreate_v1(pctx, flags, dev); }
EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) { return impl_cuCtxCreate_v2(pctx, flags, dev); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags, CUdevice dev) { return impl_cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev); }
EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev) { return impl_cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev); }
EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return impl_cuCtxDestroy_v1(ctx); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { return impl_cuCtxDestroy_v2(ctx); }
EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) { return impl_cuCtxPushCurrent_v1(ctx); }
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) { return impl_cuCtxPushCurrent_v2(ctx); }
EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx) { return impl_cuCtxPopCurrent_v1(pctx); }
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) { return impl_cuCtxPopCurrent_v2(pctx); }
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) { return impl_cuCtxSetCurrent(ctx); }
EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) { return impl_cuCtxGetCurrent(pctx); }
EXPORT CUresult cuCtxGetDevice(CUdevice *device) { return impl_cuCtxGetDevice(device); }
EXPORT CUresult cuCtxSynchronize(void) { return impl_cuCtxSynchronize(); }

EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) { return impl_cuMemGetInfo_v2(free, total); }
EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total) { return impl_cuMemGetInfo_v1(free, total); }
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { return impl_cuMemAlloc_v2(dptr, bytesize); }
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) { return impl_cuMemAlloc_v1(dptr, bytesize); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes) { return impl_cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes); }
EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height, unsigned int ElementSizeBytes) { return impl_cuMemAllocPitch_v1(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return impl_cuMemFree_v2(dptr); }
EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) { return impl_cuMemFree_v1(dptr); }
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) { return impl_cuMemGetAddressRange_v2(pbase, psize, dptr); }
EXPORT CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize, CUdeviceptr_v1 dptr) { return impl_cuMemGetAddressRange_v1(pbase, psize, dptr); }
EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return impl_cuMemAllocHost_v2(pp, bytesize); }
EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize) { return impl_cuMemAllocHost_v1(pp, bytesize); }
EXPORT CUresult cuMemFreeHost(void *p) { return impl_cuMemFreeHost(p); }
EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) { return impl_cuMemHostAlloc(pp, bytesize, Flags); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) { return impl_cuMemAllocManaged(dptr, bytesize, flags); }

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) { return impl_cuStreamCreate(phStream, Flags); }
EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) { return impl_cuStreamDestroy_v2(hStream); }
EXPORT CUresult cuStreamDestroy(CUstream hStream) { return impl_cuStreamDestroy_v1(hStream); }
EXPORT CUresult cuStreamSynchronize(CUstream hStream) { return impl_cuStreamSynchronize(hStream); }
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return impl_cuStreamSynchronize_ptsz(hStream); }
EXPORT CUresult cuStreamBeginCapture(CUstream hStream) { return impl_cuStreamBeginCapture_v1(hStream); }
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream) { return impl_cuStreamBeginCapture_v1_ptsz(hStream); }
EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) { return impl_cuStreamBeginCapture_v2(hStream, mode); }
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) { return impl_cuStreamBeginCapture_v2_ptsz(hStream, mode); }
EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) { return impl_cuStreamEndCapture(hStream, phGraph); }
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) { return impl_cuStreamEndCapture_ptsz(hStream, phGraph); }
EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) { return impl_cuStreamIsCapturing(hStream, captureStatus); }
EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus) { return impl_cuStreamIsCapturing_ptsz(hStream, captureStatus); }
EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) { return impl_cuThreadExchangeStreamCaptureMode(mode); }
EXPORT CUresult cuGraphDestroy(CUgraph hGraph) { return impl_cuGraphDestroy(hGraph); }

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option) { return impl_cuMemGetAllocationGranularity(granularity, prop, option); }
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) { return impl_cuMemCreate(handle, size, prop, flags); }
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return impl_cuMemRelease(handle); }
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) { return impl_cuMemRetainAllocationHandle(handle, addr); }
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) { return impl_cuMemAddressReserve(ptr, size, alignment, addr, flags); }
EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) { return impl_cuMemAddressFree(ptr, size); }
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags) { return impl_cuMemMap(ptr, size, offset, handle, flags); }
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) { return impl_cuMemUnmap(ptr, size); }
EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) { return impl_cuMemSetAccess(ptr, size, desc, count); }

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) { return impl_cuDeviceGetDefaultMemPool(pool_out, dev); }
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) { return impl_cuDeviceGetMemPool(pool, dev); }
EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) { return impl_cuDeviceSetMemPool(dev, pool); }
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) { return impl_cuMemPoolCreate(pool, poolProps); }
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) { return impl_cuMemPoolDestroy(pool); }
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) { return impl_cuMemPoolTrimTo(pool, minBytesToKeep); }
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) { return impl_cuMemPoolGetAttribute(pool, attr, value); }
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) { return impl_cuMemPoolSetAttribute(pool, attr, value); }
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) { return impl_cuMemAllocAsync(dptr, bytesize, hStream); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) { return impl_cuMemAllocAsync_ptsz(dptr, bytesize, hStream); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) { return impl_cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream); }
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) { return impl_cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, hStream); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return impl_cuMemFreeAsync(dptr, hStream); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return impl_cuMemFreeAsync_ptsz(dptr, hStream); }

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) { return impl_cuGetProcAddress_v1(symbol, pfn, cudaVersion, flags); }
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus) { return impl_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus); }
