// A tiny fake training loop shared by the leak-detector corpus (see README.md).
//
// One step:  load_batch -> forward -> backward -> optimizer_step -> zero_grad -> marker.
//   load_batch      2 MiB input batch, exactly once per step, first allocation of the step
//   forward         N_ACTS x 4 MiB activations (alloc_activation), freed at the end of backward
//   backward        N_PARAMS x 8 MiB gradients (alloc_grad) when not already allocated
//   optimizer_step  clip_grad_norm: 1 MiB temporary, once per step; Adam state
//                   (alloc_adam_state, 2 x 8 MiB per param) created lazily at step 1 only
//                   (step 0 is skipped, as AMP's GradScaler does on its first step) and kept
//   zero_grad       frees the gradients
// The step marker comes last (the trough): live bytes there are constant from step 1 on,
// except for what a scenario leaks. Every allocating function is non-static and noinline,
// so it is the innermost frame of its stack.
#ifndef OOMTRACE_CORPUS_H
#define OOMTRACE_CORPUS_H

#include "scenario.h"
#include <stdint.h>
#include <string.h>
#include <time.h>

#define N_PARAMS 8
#define PARAM_BYTES (8 * MiB)
#define N_ACTS 6
#define ACT_BYTES (4 * MiB)
#define BATCH_BYTES (2 * MiB)
#define CLIP_BYTES (1 * MiB)
#define MAX_ACTS 64

typedef struct {
    void* params[N_PARAMS];
    void* grads[N_PARAMS];
    void* adam_m[N_PARAMS];
    void* adam_v[N_PARAMS];
    void* acts[MAX_ACTS];
    int n_acts;
    void* batch;
    int async;            // activations are stream-ordered on `stream`
    cudaStream_t stream;
} Model;

static inline int corpus_steps(void) {
    const char* v = getenv("CORPUS_STEPS");
    return v && *v ? atoi(v) : 60;
}

static inline int corpus_markers(void) {
    const char* v = getenv("CORPUS_MARKERS");
    return !(v && strcmp(v, "0") == 0);
}

static inline void corpus_end_step(int step) {
    (void)step;
    if (corpus_markers()) step_mark("step");
}

// Deterministic xorshift32.
static inline uint32_t corpus_rand(void) {
    static uint32_t x = 2463534242u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
}

static inline void corpus_free(void* p) { CHECK(cudaFree(p)); }

// A step's kernels: 5 ms of "compute" (a sleep). Programs whose steps make one allocation or
// none (an extension called once per step, a pool's chunks) have a period of one event or
// less in their allocation stream, so only the pace of a real step tells one from a tight
// loop; a real step launches kernels that take time.
static inline void corpus_compute(void) {
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

__attribute__((noinline)) void* alloc_param(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

__attribute__((noinline)) void* alloc_grad(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

__attribute__((noinline)) void* alloc_adam_state(size_t bytes) {
    void* p;
    CHECK(cudaMalloc(&p, bytes));
    return p;
}

__attribute__((noinline)) void* alloc_activation(Model* m, size_t bytes) {
    void* p;
    if (m->async)
        CHECK(cudaMallocAsync(&p, bytes, m->stream));
    else
        CHECK(cudaMalloc(&p, bytes));
    if (m->n_acts >= MAX_ACTS) exit(93);
    m->acts[m->n_acts++] = p;
    return p;
}

__attribute__((noinline)) void load_batch(Model* m) { CHECK(cudaMalloc(&m->batch, BATCH_BYTES)); }

__attribute__((noinline)) void clip_grad_norm(void) {
    void* tmp;
    CHECK(cudaMalloc(&tmp, CLIP_BYTES));
    CHECK(cudaFree(tmp));
}

__attribute__((noinline)) void model_init(Model* m) {
    memset(m, 0, sizeof *m);
    for (int i = 0; i < N_PARAMS; i++) m->params[i] = alloc_param(PARAM_BYTES);
}

__attribute__((noinline)) void forward_n(Model* m, int n, size_t bytes) {
    for (int i = 0; i < n; i++) alloc_activation(m, bytes);
}

__attribute__((noinline)) void forward(Model* m) { forward_n(m, N_ACTS, ACT_BYTES); }

__attribute__((noinline)) void backward(Model* m) {
    for (int i = 0; i < N_PARAMS; i++)
        if (!m->grads[i]) m->grads[i] = alloc_grad(PARAM_BYTES);
    for (int i = 0; i < m->n_acts; i++) {
        if (m->async)
            CHECK(cudaFreeAsync(m->acts[i], m->stream));
        else
            corpus_free(m->acts[i]);
    }
    m->n_acts = 0;
    if (m->batch) corpus_free(m->batch);
    m->batch = NULL;
}

__attribute__((noinline)) void optimizer_step(Model* m, int step) {
    clip_grad_norm();
    if (step == 0) return;  // GradScaler skips the first step (inf grads): no state yet
    if (!m->adam_m[0])
        for (int i = 0; i < N_PARAMS; i++) {
            m->adam_m[i] = alloc_adam_state(PARAM_BYTES);
            m->adam_v[i] = alloc_adam_state(PARAM_BYTES);
        }
}

__attribute__((noinline)) void zero_grad(Model* m) {
    for (int i = 0; i < N_PARAMS; i++) {
        if (m->grads[i]) corpus_free(m->grads[i]);
        m->grads[i] = NULL;
    }
}

// The whole step, for scenarios that add their extra work before or after it.
__attribute__((noinline)) void train_step(Model* m, int step) {
    load_batch(m);
    forward(m);
    backward(m);
    optimizer_step(m, step);
    zero_grad(m);
}

__attribute__((noinline)) void model_free(Model* m) {
    for (int i = 0; i < N_PARAMS; i++) {
        corpus_free(m->params[i]);
        if (m->adam_m[i]) corpus_free(m->adam_m[i]);
        if (m->adam_v[i]) corpus_free(m->adam_v[i]);
    }
}

#endif
