// Ground truth: CLEAN (bounded). lru_cache_put() inserts a 2 MiB entry per step under a new
// key; capacity 4: once full it evicts (cudaFree) the oldest entry before inserting.
// Growth: 2 MiB per step for steps 0..3, then flat at 8 MiB. Entries freed at the end of main.
#include "corpus.h"

#define LRU_CAPACITY 4

static struct {
    int key[LRU_CAPACITY];
    void* val[LRU_CAPACITY];
    int n, oldest;
} lru;

__attribute__((noinline)) void lru_cache_put(int key) {
    int slot = lru.n;
    if (lru.n == LRU_CAPACITY) {  // evict the oldest (slots are in insertion order, ring)
        slot = lru.oldest;
        CHECK(cudaFree(lru.val[slot]));
        lru.oldest = (lru.oldest + 1) % LRU_CAPACITY;
    } else {
        lru.n++;
    }
    lru.key[slot] = key;
    CHECK(cudaMalloc(&lru.val[slot], 2 * MiB));
}

int main(void) {
    Model m;
    model_init(&m);
    int steps = corpus_steps();
    for (int s = 0; s < steps; s++) {
        train_step(&m, s);
        lru_cache_put(1000 + s);  // a new key every step
        corpus_end_step(s);
    }
    for (int i = 0; i < lru.n; i++) CHECK(cudaFree(lru.val[i]));
    model_free(&m);
    printf("clean_lru: ok\n");
    return 0;
}
