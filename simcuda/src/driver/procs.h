/*
 * The part of the driver's internal interface that needs no CUDA types:
 * export macros, the cuGetProcAddress table entry and the debug trace.
 * unsupported.c includes only this, because its stubs' signatures (none)
 * differ from cuda.h's declarations.
 */
#ifndef SIMCUDA_DRIVER_PROCS_H
#define SIMCUDA_DRIVER_PROCS_H

#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))
/* Implementations stay out of line: each export is then a one-jump wrapper
 * whose address differs from the internal function's, which is what
 * cuGetProcAddress hands out (as the real driver is believed to). */
#define IMPL static __attribute__((noinline))

/* One cuGetProcAddress entry: base name, the CUDA version that introduced
 * this ABI, the implementation, and its per-thread-default-stream twin. */
struct sim_proc {
    const char *name;
    int version;
    void *fn;
    void *ptsz;
};

/* Real CUDA functions simcuda does not implement (unsupported.c): found by
 * cuGetProcAddress, answering CUDA_ERROR_NOT_SUPPORTED. */
extern const struct sim_proc sim_unsupported_procs[];
extern const size_t sim_unsupported_nprocs;

/* Debug trace (SIMCUDA_TRACE=1): one line on stderr per unusual request. */
void sim_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
