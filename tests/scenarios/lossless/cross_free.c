// 8 threads, ROUNDS rounds (argv[1], default 100) of BATCH = 1000 allocations of
// 512 B x (1 + i % 4) each: a thread frees the even ones itself and passes the odd ones
// through a shared queue to the next thread, which frees them (half of all frees are
// cross-thread). At the end thread t keeps 3 blocks of (t + 1) x 1, 2, 3 KiB (keep_three).
// Expected: allocations = 8 x ROUNDS x 1000 + 24, frees = 8 x ROUNDS x 1000, live at exit
// 24 blocks, 1 KiB x 6 x (1 + ... + 8) = 221,184 bytes.
#include <pthread.h>
#include "scenario.h"

#define THREADS 8
#define BATCH 1000

static int rounds = 100;

// One queue per receiving thread, large enough that a push never waits.
struct queue {
    pthread_mutex_t lock;
    pthread_cond_t more;
    void** items;
    long head, tail;
};
static struct queue queues[THREADS];

static void push(struct queue* q, void* p) {
    pthread_mutex_lock(&q->lock);
    q->items[q->tail++] = p;
    pthread_cond_signal(&q->more);
    pthread_mutex_unlock(&q->lock);
}

static void* pop(struct queue* q) {
    pthread_mutex_lock(&q->lock);
    while (q->head == q->tail) pthread_cond_wait(&q->more, &q->lock);
    void* p = q->items[q->head++];
    pthread_mutex_unlock(&q->lock);
    return p;
}

__attribute__((noinline)) static void keep_three(int t) {
    for (size_t k = 1; k <= 3; k++) {
        void* p;
        CHECK(cudaMalloc(&p, (size_t)(t + 1) * k * 1024));
    }
}

static void* worker(void* arg) {
    int t = (int)(long)arg;
    struct queue* next = &queues[(t + 1) % THREADS];
    struct queue* mine = &queues[t];
    void* blocks[BATCH];
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < BATCH; i++) CHECK(cudaMalloc(&blocks[i], 512 * (size_t)(1 + i % 4)));
        for (int i = 0; i < BATCH; i += 2) CHECK(cudaFree(blocks[i]));
        for (int i = 1; i < BATCH; i += 2) push(next, blocks[i]);
        for (int i = 0; i < BATCH / 2; i++) CHECK(cudaFree(pop(mine)));
    }
    keep_three(t);
    return NULL;
}

int main(int argc, char** argv) {
    if (argc > 1) rounds = atoi(argv[1]);
    for (int t = 0; t < THREADS; t++) {
        pthread_mutex_init(&queues[t].lock, NULL);
        pthread_cond_init(&queues[t].more, NULL);
        queues[t].items = malloc(sizeof(void*) * (size_t)rounds * (BATCH / 2));
        if (!queues[t].items) return 94;
    }
    CHECK(cudaFree(NULL));
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void*)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    printf("cross_free: ok\n");
    return 0;
}
