/*
 * libsimcuda_spy.so: an LD_PRELOAD library that interposes dlsym, the way a
 * tracer must, and logs to stderr every dlsym and every lookup made through
 * the cuGetProcAddress_v2 it hands back.  The tests use it to prove that
 * libcudart reaches the driver only through dlsym("cuGetProcAddress_v2").
 */
#define _GNU_SOURCE
#include "cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static dlsym_fn real_dlsym;
static gpa_fn real_gpa;

static CUresult spy_gpa(const char *symbol, void **pfn, int version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    CUresult r = real_gpa(symbol, pfn, version, flags, status);
    fprintf(stderr, "spy: gpa %s %d %llu -> %d\n", symbol, version, (unsigned long long)flags, (int)r);
    return r;
}

void *dlsym(void *handle, const char *name)
{
    if (!real_dlsym) {
        real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!real_dlsym)
            real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    }
    void *p = real_dlsym(handle, name);
    fprintf(stderr, "spy: dlsym %s\n", name);
    if (p && strcmp(name, "cuGetProcAddress_v2") == 0) {
        real_gpa = (gpa_fn)p;
        return (void *)spy_gpa;
    }
    return p;
}
