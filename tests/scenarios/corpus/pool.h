// A tiny JAX/CuPy-style pool allocator for the pool corpus programs (leak_pool, clean_pool):
// one big up-front cudaMalloc reservation (pool_reserve), cut into 1 MiB units; pool_alloc()
// takes the first run of free units that fits in one chunk (a free list as a bitmap),
// pool_free() gives them back. When no chunk has room, pool_grow() adds a chunk of
// POOL_CHUNK_BYTES (or the request, if larger) with cudaMalloc.
//
// What oomtrace sees: the reservation and each chunk, nothing else. Sub-allocations never
// reach CUDA: a sub-allocation kept is invisible until it makes the pool grow, and then the
// growth is at pool_grow().
#ifndef OOMTRACE_CORPUS_POOL_H
#define OOMTRACE_CORPUS_POOL_H

#include "corpus.h"

#define POOL_UNIT (1 * MiB)
#define POOL_MAX_CHUNKS 256
#define POOL_MAX_UNITS 128
#define POOL_RESERVE_BYTES (32 * MiB)
#define POOL_CHUNK_BYTES (4 * MiB)

typedef struct {
    char* base;
    int units;
    unsigned char used[POOL_MAX_UNITS];
} Chunk;

static Chunk pool[POOL_MAX_CHUNKS];
static int pool_chunks;

static void pool_add(void* base, size_t bytes) {
    if (pool_chunks == POOL_MAX_CHUNKS || bytes / POOL_UNIT > POOL_MAX_UNITS) exit(94);
    Chunk* c = &pool[pool_chunks++];
    c->base = base;
    c->units = (int)(bytes / POOL_UNIT);
    memset(c->used, 0, sizeof c->used);
}

__attribute__((noinline)) void pool_reserve(void) {
    void* p;
    CHECK(cudaMalloc(&p, POOL_RESERVE_BYTES));
    pool_add(p, POOL_RESERVE_BYTES);
}

__attribute__((noinline)) void pool_grow(size_t bytes) {
    if (bytes < POOL_CHUNK_BYTES) bytes = POOL_CHUNK_BYTES;
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    pool_add(p, bytes);
}

// First fit of `n` units in chunk `c`: the first unit, or -1.
static int pool_fit(const Chunk* c, int n) {
    for (int i = 0, run = 0; i < c->units; i++) {
        run = c->used[i] ? 0 : run + 1;
        if (run == n) return i - n + 1;
    }
    return -1;
}

__attribute__((noinline)) void* pool_alloc(size_t bytes) {
    int n = (int)((bytes + POOL_UNIT - 1) / POOL_UNIT);
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < pool_chunks; k++) {
            int at = pool_fit(&pool[k], n);
            if (at >= 0) {
                memset(pool[k].used + at, n, (size_t)n);  // each unit records its run length
                return pool[k].base + (size_t)at * POOL_UNIT;
            }
        }
        pool_grow((size_t)n * POOL_UNIT);
    }
    exit(95);
}

__attribute__((noinline)) void pool_free(void* p) {
    for (int k = 0; k < pool_chunks; k++) {
        char* base = pool[k].base;
        if ((char*)p >= base && (char*)p < base + (size_t)pool[k].units * POOL_UNIT) {
            int at = (int)(((char*)p - base) / POOL_UNIT);
            memset(pool[k].used + at, 0, pool[k].used[at]);
            return;
        }
    }
    exit(96);
}

// Gives every chunk back to CUDA.
__attribute__((noinline)) void pool_destroy(void) {
    for (int k = 0; k < pool_chunks; k++) CHECK(cudaFree(pool[k].base));
    pool_chunks = 0;
}

// One step of a pool-only framework: three 4 MiB activations, freed at the step's end.
__attribute__((noinline)) void pool_step(void) {
    void* acts[3];
    for (int i = 0; i < 3; i++) acts[i] = pool_alloc(4 * MiB);
    for (int i = 0; i < 3; i++) pool_free(acts[i]);
}

#endif
