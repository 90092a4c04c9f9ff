// Ground truth (built twice, tests/build.rs): 8 threads, each with its own loop.
//   clean_threads: CLEAN. Each thread makes 20,000 allocations at worker_alloc() (1..8 KiB,
//                  fixed-seed xorshift): it frees the even ones itself and passes the odd ones
//                  to the next thread, which frees whatever has arrived each time it allocates
//                  (half of all frees cross threads; a thread that runs ahead leaves a
//                  backlog that the next one frees later), then drains its queue once all
//                  threads are done. At the end each thread keeps 2 blocks (keep_two): 16
//                  blocks live at exit. Without markers the threads run free, as in the
//                  report this reproduces (before time windows, a confirmed "leak" at
//                  worker_alloc in 1 to 3 runs of 3); with markers, a step is every thread's next 100
//                  allocations: they meet at a barrier and thread 0 marks between two
//                  barriers (a marker from one free-running thread would measure how far
//                  the others lag, which does grow).
//   leak_threads (-DLEAK): LEAK at thread_leak(), onset step 0. Each thread runs 60 iterations
//                  (CORPUS_STEPS) of 3 temporaries (thread_temp, 1..4 MiB, freed); thread 3
//                  also keeps 2 MiB per iteration. The iterations are kept in lockstep by a
//                  barrier; with markers thread 0 marks between two barriers.
// Live at exit: clean_threads 16 blocks (48 KiB); leak_threads steps x 2 MiB (120 MiB).
#include <pthread.h>
#include "corpus.h"

#define THREADS 8

static pthread_barrier_t barrier;
static int steps;

#ifdef LEAK
__attribute__((noinline)) void* thread_temp(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

__attribute__((noinline)) void* thread_leak(void) {
    void* p;
    CHECK(cudaMalloc(&p, 2 * MiB));
    return p;
}

static void* worker(void* arg) {
    int t = (int)(long)arg;
    uint32_t x = 2463534242u + (uint32_t)t * 7919u;
    for (int s = 0; s < steps; s++) {
        void* temps[3];
        for (int i = 0; i < 3; i++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            temps[i] = thread_temp(1 * MiB + (x % 13) * (256 * 1024));
        }
        if (t == 3) thread_leak();  // never freed
        for (int i = 0; i < 3; i++) corpus_free(temps[i]);
        pthread_barrier_wait(&barrier);
        if (t == 0) corpus_end_step(s);
        pthread_barrier_wait(&barrier);
    }
    return NULL;
}
#else
#define PAIRS 20000

// One queue per receiving thread, large enough that a push never waits.
struct queue {
    pthread_mutex_t lock;
    void** items;
    long head, tail;
};
static struct queue queues[THREADS];

static void push(struct queue* q, void* p) {
    pthread_mutex_lock(&q->lock);
    q->items[q->tail++] = p;
    pthread_mutex_unlock(&q->lock);
}

// The next block another thread passed, or NULL if none has arrived yet.
static void* try_pop(struct queue* q) {
    pthread_mutex_lock(&q->lock);
    void* p = q->head < q->tail ? q->items[q->head++] : NULL;
    pthread_mutex_unlock(&q->lock);
    return p;
}

__attribute__((noinline)) void* worker_alloc(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

__attribute__((noinline)) void keep_two(int t) {
    for (size_t k = 1; k <= 2; k++) worker_alloc((size_t)(t + 1) * k * 1024);
}

static void* worker(void* arg) {
    int t = (int)(long)arg;
    struct queue* next = &queues[(t + 1) % THREADS];
    struct queue* mine = &queues[t];
    uint32_t x = 2463534242u + (uint32_t)t * 7919u;
    for (int i = 0; i < PAIRS; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        void* p = worker_alloc(1024 * (size_t)(1 + x % 8));
        if (i % 2 == 0)
            corpus_free(p);
        else
            push(next, p);
        // Free what the previous thread has passed so far: it may run ahead or behind.
        void* q = try_pop(mine);
        if (q) corpus_free(q);
        if (corpus_markers() && i % 100 == 99) {
            // A step is everyone's 100 allocations: the marker goes where all are done.
            pthread_barrier_wait(&barrier);
            if (t == 0) corpus_end_step(i / 100);
            pthread_barrier_wait(&barrier);
        }
    }
    // Every thread has pushed all it will: drain what is left.
    pthread_barrier_wait(&barrier);
    for (void* q; (q = try_pop(mine));) corpus_free(q);
    keep_two(t);
    return NULL;
}
#endif

int main(void) {
    steps = corpus_steps();
    pthread_barrier_init(&barrier, NULL, THREADS);
#ifndef LEAK
    for (int t = 0; t < THREADS; t++) {
        pthread_mutex_init(&queues[t].lock, NULL);
        queues[t].items = calloc(PAIRS, sizeof(void*));
    }
#endif
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void*)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    printf("threads: ok\n");
    return 0;
}
