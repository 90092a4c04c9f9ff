/*
 * The simulated address space: the ordered map (a treap) that the core areas
 * key their records by, and the allocator that hands out device addresses.
 *
 * Why: device pointers must be unique, never alias host memory, and be
 * reused the way a real driver reuses them (a freed range is handed out
 * again by the next request that fits), so that a tracer sees realistic
 * addresses.  cuInit (core.c) gives each device a 2 TiB window for
 * cuMemAlloc and the pools, and VMM one 8 TiB window for
 * cuMemAddressReserve, at fixed addresses (core.h).
 *
 * Where simcuda differs from the real driver
 * ------------------------------------------
 *  - Device memory is host memory at the same address: each device's window
 *    is mapped readable and writable (MAP_NORESERVE), so copies are memmove.
 *    The VMM window stays PROT_NONE except where cuMemMap maps a physical
 *    allocation (a memfd) into it (vmm.c).
 *  - Placement is plain first fit by address, coalescing on free; the real
 *    driver's placement is its own and undocumented.
 *
 * Called with the core's lock held (core.h).
 */
#define _GNU_SOURCE
#define SIMCUDA_NO_V2_MACROS
#include "core.h"

#include <stdlib.h>
#include <sys/mman.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

/* ---- Ordered maps ----------------------------------------------------------
 * A treap keyed by address, augmented with the largest `len` in each subtree
 * so that free-space lists answer first-fit in logarithmic time.  Nodes are
 * embedded as the first member of the records they index. */

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

void tn_insert(struct tnode **root, struct tnode *n)
{
    struct tnode *a, *b;
    n->l = n->r = NULL;
    n->prio = next_prio();
    tn_update(n);
    tn_split(*root, n->key, &a, &b);
    *root = tn_merge(tn_merge(a, n), b);
}

struct tnode *tn_remove(struct tnode **root, uint64_t key)
{
    struct tnode *a, *b, *m, *c;
    tn_split(*root, key, &a, &b);
    tn_split(b, key + 1, &m, &c);
    *root = tn_merge(a, c);
    return m;
}

struct tnode *tn_find(struct tnode *t, uint64_t key)
{
    while (t && t->key != key)
        t = key < t->key ? t->l : t->r;
    return t;
}

struct tnode *tn_find_le(struct tnode *t, uint64_t key) /* greatest key <= key */
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

struct tnode *tn_find_ge(struct tnode *t, uint64_t key) /* least key >= key */
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

int va_init(struct vaspace *vs, uint64_t base, uint64_t span)
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
uint64_t va_alloc(struct vaspace *vs, uint64_t size, uint64_t align, uint64_t hint)
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

void va_free(struct vaspace *vs, uint64_t start, uint64_t size)
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
void reserve_host_range(uint64_t base, uint64_t span, int prot)
{
    void *p = mmap((void *)(uintptr_t)base, span, prot,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED && (uint64_t)(uintptr_t)p != base)
        munmap(p, span); /* an old kernel treated the address as a hint */
}

/* Gives the pages of freed device memory back to the host (the range stays
 * mapped and reads as zeros), so a long run's footprint follows its live
 * device memory, not its peak. */
void release_pages(uint64_t addr, uint64_t len)
{
    uint64_t page = 4096, lo = (addr + page - 1) & ~(page - 1), hi = (addr + len) & ~(page - 1);
    if (hi > lo)
        madvise((void *)(uintptr_t)lo, hi - lo, MADV_DONTNEED);
}

int in_simulated_range(uint64_t addr, uint64_t len)
{
    uint64_t lo = DEV_VA_BASE, hi = VMM_VA_BASE + VMM_VA_SPAN;
    return addr < hi && addr + len > lo;
}
