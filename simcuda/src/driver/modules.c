/*
 * Libraries, modules, kernels, launches and occupancy.
 *
 * simcuda runs no device code, but real clients (cudart, cuBLAS, PyTorch)
 * load their fatbinaries, look up kernels and globals by name, query and set
 * kernel attributes, ask occupancy questions and launch.  This file answers
 * all of that the way a driver would, with three simplifications:
 *
 *  - A launch validates its stream and does nothing: the memory it would
 *    have written keeps whatever it held.  Host functions queued on a stream
 *    (cuLaunchHostFunc, cuStreamAddCallback) run at once, on the caller's
 *    thread, because every stream is always idle.
 *  - Globals are host memory (device memory is host memory in simcuda), made
 *    zeroed on first lookup with the size the image's symbol table gives
 *    (fatbin.c).  cuBLAS checks that size, so it must be the real one.
 *  - Occupancy is computed from the H100's per-SM limits and one fixed GPC
 *    split (see k_gpc_sms), not from the kernel's registers; clusters are
 *    answered up to the largest GPC (18 blocks) where the hardware launches
 *    at most 16.
 *
 * A library (cuLibrary*) and its module (cuModule*) are the same object here,
 * and a kernel (CUkernel) is also its own function (CUfunction), as
 * cuKernelGetFunction allows.
 */
#define _GNU_SOURCE
#include "fatbin.h"
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>


#define GLOBAL_ALIGN 256
#include <sys/mman.h>
/* Module globals live in a window of their own at a fixed address, like the
 * device windows (vaspace.c): device addresses that do not move with the
 * host's address-space randomisation, and never alias host memory. */
#define GLOBALS_BASE 0x5f0000000000ull
#define GLOBALS_SPAN (64ull << 30)
static uint64_t g_globals_next;

static void *global_alloc(size_t size)
{
    if (!g_globals_next) {
        void *p = mmap((void *)(uintptr_t)GLOBALS_BASE, GLOBALS_SPAN, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | 0x100000 /* NOREPLACE */,
                       -1, 0);
        if (p != (void *)(uintptr_t)GLOBALS_BASE)
            return NULL;
        g_globals_next = GLOBALS_BASE;
    }
    uint64_t len = (size + GLOBAL_ALIGN - 1) / GLOBAL_ALIGN * GLOBAL_ALIGN;
    if (g_globals_next + len > GLOBALS_BASE + GLOBALS_SPAN)
        return NULL;
    void *at = (void *)(uintptr_t)g_globals_next;
    g_globals_next += len;
    return at;
}

struct sim_kernel {
    struct sim_module *unit;
    char *name;
    int max_dynamic_shared, carveout;
    int non_portable_clusters; /* CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED */
    struct sim_kernel *next;
};

struct sim_global {
    char *name;
    void *mem;
    size_t size;
    struct sim_global *next;
};

struct sim_module {
    const void *image; /* the caller's image, or our copy of it */
    void *copy;
    int is_library;
    struct sim_kernel *kernels;
    struct sim_global *globals;
    struct sim_module *next;
};

static pthread_mutex_t g_mod_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_module *g_units;

static int unit_known(const struct sim_module *m)
{
    for (const struct sim_module *p = g_units; p; p = p->next)
        if (p == m)
            return 1;
    return 0;
}

static int kernel_known(const struct sim_kernel *k)
{
    for (const struct sim_module *p = g_units; p; p = p->next)
        for (const struct sim_kernel *q = p->kernels; q; q = q->next)
            if (q == k)
                return 1;
    return 0;
}

/* Images handed to cuModuleLoadData may be freed by the caller right after
 * the call (NVRTC output is); keep a copy when its size can be told. */
static CUresult unit_load(struct sim_module **out, const void *image, int is_library)
{
    if (!out || !image)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_initialized();
    if (r != CUDA_SUCCESS)
        return r;
    CUcontext ctx;
    if (!is_library && (r = sim_current_ctx(&ctx)) != CUDA_SUCCESS)
        return r;
    struct sim_module *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t size = sim_image_size(image);
    if (size) {
        m->copy = malloc(size);
        if (!m->copy) {
            free(m);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(m->copy, image, size);
        m->image = m->copy;
    } else {
        m->image = image;
    }
    m->is_library = is_library;
    pthread_mutex_lock(&g_mod_lock);
    m->next = g_units;
    g_units = m;
    pthread_mutex_unlock(&g_mod_lock);
    *out = m;
    return CUDA_SUCCESS;
}

CUresult sim_module_load_image(sim_module_t *out, const void *image)
{
    return unit_load(out, image, 0);
}

static CUresult unit_unload(struct sim_module *m)
{
    pthread_mutex_lock(&g_mod_lock);
    struct sim_module **p = &g_units;
    while (*p && *p != m)
        p = &(*p)->next;
    if (!*p) {
        pthread_mutex_unlock(&g_mod_lock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *p = m->next;
    pthread_mutex_unlock(&g_mod_lock);
    for (struct sim_kernel *k = m->kernels, *next; k; k = next) {
        next = k->next;
        free(k->name);
        free(k);
    }
    for (struct sim_global *g = m->globals, *next; g; g = next) {
        next = g->next;
        free(g->name);
        free(g);
    }
    sim_image_forget(m->image);
    free(m->copy);
    free(m);
    return CUDA_SUCCESS;
}

static CUresult unit_kernel(struct sim_kernel **out, struct sim_module *m, const char *name)
{
    if (!out || !name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mod_lock);
    CUresult r = CUDA_SUCCESS;
    struct sim_kernel *k = NULL;
    if (!unit_known(m)) {
        r = CUDA_ERROR_INVALID_HANDLE;
        goto out;
    }
    for (k = m->kernels; k; k = k->next)
        if (strcmp(k->name, name) == 0)
            goto out;
    if (sim_image_has_function(m->image, name) == SIM_IMAGE_ABSENT) {
        sim_trace("no kernel %s in the image", name);
        r = CUDA_ERROR_NOT_FOUND;
        goto out;
    }
    k = calloc(1, sizeof *k);
    if (!k || !(k->name = strdup(name))) {
        free(k);
        k = NULL;
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    k->unit = m;
    k->max_dynamic_shared = 0;
    k->carveout = -1;
    k->next = m->kernels;
    m->kernels = k;
out:
    pthread_mutex_unlock(&g_mod_lock);
    if (r == CUDA_SUCCESS)
        *out = k;
    return r;
}

static CUresult unit_global(CUdeviceptr *dptr, size_t *bytes, struct sim_module *m,
                            const char *name)
{
    if (!name || (!dptr && !bytes))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mod_lock);
    CUresult r = CUDA_SUCCESS;
    struct sim_global *g = NULL;
    if (!unit_known(m)) {
        r = CUDA_ERROR_INVALID_HANDLE;
        goto out;
    }
    for (g = m->globals; g; g = g->next)
        if (strcmp(g->name, name) == 0)
            goto out;
    size_t size = 0;
    enum sim_image_answer a = sim_image_global_size(m->image, name, &size);
    if (a == SIM_IMAGE_ABSENT) {
        sim_trace("no global %s in the image", name);
        r = CUDA_ERROR_NOT_FOUND;
        goto out;
    }
    if (a == SIM_IMAGE_UNKNOWN || size == 0) {
        sim_trace("size of global %s unknown; using 256 bytes", name);
        size = 256;
    }
    g = calloc(1, sizeof *g);
    if (!g || !(g->name = strdup(name)) ||
        !(g->mem = global_alloc(size))) {
        if (g)
            free(g->name);
        free(g);
        g = NULL;
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    memset(g->mem, 0, size);
    g->size = size;
    g->next = m->globals;
    m->globals = g;
out:
    pthread_mutex_unlock(&g_mod_lock);
    if (r == CUDA_SUCCESS) {
        if (dptr)
            *dptr = (CUdeviceptr)(uintptr_t)g->mem;
        if (bytes)
            *bytes = g->size;
    }
    return r;
}

/* ---- Modules ----------------------------------------------------------------- */

IMPL CUresult impl_cuModuleLoadData(sim_module_t *module, const void *image)
{
    return unit_load(module, image, 0);
}

IMPL CUresult impl_cuModuleLoadDataEx(sim_module_t *module, const void *image, unsigned n,
                                      void *options, void **values)
{
    (void)n;
    (void)options;
    (void)values;
    return unit_load(module, image, 0);
}

IMPL CUresult impl_cuModuleLoadFatBinary(sim_module_t *module, const void *image)
{
    return unit_load(module, image, 0);
}

/* Files are not read: nothing simcuda ships loads modules from disk. */
IMPL CUresult impl_cuModuleLoad(sim_module_t *module, const char *fname)
{
    (void)module;
    sim_trace("cuModuleLoad(%s): not supported", fname ? fname : "(null)");
    return fname ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
}

IMPL CUresult impl_cuModuleUnload(sim_module_t module) { return unit_unload(module); }

IMPL CUresult impl_cuModuleGetLoadingMode(int *mode)
{
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    const char *env = getenv("CUDA_MODULE_LOADING");
    *mode = env && strcmp(env, "EAGER") == 0 ? 0x1 /* EAGER */ : 0x2 /* LAZY */;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuModuleGetFunction(sim_kernel_t *fn, sim_module_t module, const char *name)
{
    return unit_kernel(fn, module, name);
}

IMPL CUresult impl_cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, sim_module_t module,
                                        const char *name)
{
    return unit_global(dptr, bytes, module, name);
}

/* ---- Libraries ------------------------------------------------------------------ */

IMPL CUresult impl_cuLibraryLoadData(sim_library_t *library, const void *code, void *jit_options,
                                     void **jit_values, unsigned n_jit, void *lib_options,
                                     void **lib_values, unsigned n_lib)
{
    (void)jit_options, (void)jit_values, (void)n_jit;
    (void)lib_options, (void)lib_values, (void)n_lib;
    return unit_load((struct sim_module **)library, code, 1);
}

IMPL CUresult impl_cuLibraryLoadFromFile(sim_library_t *library, const char *file,
                                         void *jit_options, void **jit_values, unsigned n_jit,
                                         void *lib_options, void **lib_values, unsigned n_lib)
{
    (void)library, (void)jit_options, (void)jit_values, (void)n_jit;
    (void)lib_options, (void)lib_values, (void)n_lib;
    sim_trace("cuLibraryLoadFromFile(%s): not supported", file ? file : "(null)");
    return file ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
}

IMPL CUresult impl_cuLibraryUnload(sim_library_t library)
{
    return unit_unload((struct sim_module *)library);
}

IMPL CUresult impl_cuLibraryGetKernel(sim_kernel_t *kernel, sim_library_t library, const char *name)
{
    return unit_kernel(kernel, (struct sim_module *)library, name);
}

IMPL CUresult impl_cuLibraryGetModule(sim_module_t *module, sim_library_t library)
{
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mod_lock);
    int ok = unit_known((struct sim_module *)library);
    pthread_mutex_unlock(&g_mod_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    *module = (struct sim_module *)library;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, sim_library_t library,
                                      const char *name)
{
    return unit_global(dptr, bytes, (struct sim_module *)library, name);
}

IMPL CUresult impl_cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, sim_library_t library,
                                       const char *name)
{
    return unit_global(dptr, bytes, (struct sim_module *)library, name);
}

/* ---- Kernels and functions ------------------------------------------------------- */

static CUresult kernel_check(const struct sim_kernel *k)
{
    pthread_mutex_lock(&g_mod_lock);
    int ok = kernel_known(k);
    pthread_mutex_unlock(&g_mod_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

IMPL CUresult impl_cuKernelGetFunction(sim_kernel_t *fn, sim_kernel_t kernel)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(kernel);
    if (r == CUDA_SUCCESS)
        *fn = kernel;
    return r;
}

IMPL CUresult impl_cuKernelGetLibrary(sim_library_t *library, sim_kernel_t kernel)
{
    if (!library)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(kernel);
    if (r == CUDA_SUCCESS)
        *library = (sim_library_t)kernel->unit;
    return r;
}

IMPL CUresult impl_cuFuncGetModule(sim_module_t *module, sim_kernel_t fn)
{
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(fn);
    if (r == CUDA_SUCCESS)
        *module = fn->unit;
    return r;
}

IMPL CUresult impl_cuKernelGetName(const char **name, sim_kernel_t kernel)
{
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(kernel);
    if (r == CUDA_SUCCESS)
        *name = kernel->name;
    return r;
}

/* CUfunction_attribute values (cuda.h). */
enum {
    FA_MAX_THREADS_PER_BLOCK = 0,
    FA_SHARED_SIZE_BYTES = 1,
    FA_CONST_SIZE_BYTES = 2,
    FA_LOCAL_SIZE_BYTES = 3,
    FA_NUM_REGS = 4,
    FA_PTX_VERSION = 5,
    FA_BINARY_VERSION = 6,
    FA_CACHE_MODE_CA = 7,
    FA_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    FA_PREFERRED_SHARED_MEMORY_CARVEOUT = 9,
    FA_CLUSTER_SIZE_MUST_BE_SET = 10,
    FA_REQUIRED_CLUSTER_WIDTH = 11,
    FA_REQUIRED_CLUSTER_HEIGHT = 12,
    FA_REQUIRED_CLUSTER_DEPTH = 13,
    FA_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14,
    FA_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 15,
};

/* The limit on dynamic shared memory a kernel may opt into on sm_90. */
#define MAX_OPTIN_SHARED 232448

static CUresult function_attribute(int *pi, int attr, sim_kernel_t k)
{
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(k);
    if (r != CUDA_SUCCESS)
        return r;
    switch (attr) {
    case FA_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case FA_SHARED_SIZE_BYTES: *pi = 0; break;
    case FA_CONST_SIZE_BYTES: *pi = 0; break;
    case FA_LOCAL_SIZE_BYTES: *pi = 0; break;
    case FA_NUM_REGS: *pi = 32; break;
    case FA_PTX_VERSION: *pi = 90; break;
    case FA_BINARY_VERSION: *pi = 90; break;
    case FA_CACHE_MODE_CA: *pi = 0; break;
    case FA_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = k->max_dynamic_shared ? k->max_dynamic_shared
                                                                      : 49152; break;
    case FA_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = k->carveout; break;
    case FA_CLUSTER_SIZE_MUST_BE_SET: *pi = 0; break;
    case FA_REQUIRED_CLUSTER_WIDTH:
    case FA_REQUIRED_CLUSTER_HEIGHT:
    case FA_REQUIRED_CLUSTER_DEPTH: *pi = 0; break;
    case FA_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: *pi = k->non_portable_clusters; break;
    case FA_CLUSTER_SCHEDULING_POLICY_PREFERENCE: *pi = 0; break;
    default:
        sim_trace("function attribute %d: unknown", attr);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult function_set_attribute(sim_kernel_t k, int attr, int value)
{
    CUresult r = kernel_check(k);
    if (r != CUDA_SUCCESS)
        return r;
    switch (attr) {
    case FA_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        if (value < 0 || value > MAX_OPTIN_SHARED)
            return CUDA_ERROR_INVALID_VALUE;
        k->max_dynamic_shared = value;
        return CUDA_SUCCESS;
    case FA_PREFERRED_SHARED_MEMORY_CARVEOUT:
        if (value < -1 || value > 100)
            return CUDA_ERROR_INVALID_VALUE;
        k->carveout = value;
        return CUDA_SUCCESS;
    case FA_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        if (value != 0 && value != 1)
            return CUDA_ERROR_INVALID_VALUE;
        k->non_portable_clusters = value;
        return CUDA_SUCCESS;
    case FA_REQUIRED_CLUSTER_WIDTH:
    case FA_REQUIRED_CLUSTER_HEIGHT:
    case FA_REQUIRED_CLUSTER_DEPTH:
    case FA_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

IMPL CUresult impl_cuFuncGetAttribute(int *pi, int attr, sim_kernel_t fn)
{
    return function_attribute(pi, attr, fn);
}

IMPL CUresult impl_cuKernelGetAttribute(int *pi, int attr, sim_kernel_t kernel, CUdevice dev)
{
    (void)dev;
    return function_attribute(pi, attr, kernel);
}

IMPL CUresult impl_cuFuncSetAttribute(sim_kernel_t fn, int attr, int value)
{
    return function_set_attribute(fn, attr, value);
}

IMPL CUresult impl_cuKernelSetAttribute(int attr, int value, sim_kernel_t kernel, CUdevice dev)
{
    (void)dev;
    return function_set_attribute(kernel, attr, value);
}

IMPL CUresult impl_cuFuncSetCacheConfig(sim_kernel_t fn, int config)
{
    (void)config;
    return kernel_check(fn);
}

IMPL CUresult impl_cuKernelSetCacheConfig(sim_kernel_t kernel, int config, CUdevice dev)
{
    (void)config, (void)dev;
    return kernel_check(kernel);
}

IMPL CUresult impl_cuFuncSetSharedMemConfig(sim_kernel_t fn, int config)
{
    (void)config;
    return kernel_check(fn);
}

IMPL CUresult impl_cuFuncIsLoaded(int *state, sim_kernel_t fn)
{
    if (!state)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(fn);
    if (r == CUDA_SUCCESS)
        *state = 1; /* CU_FUNCTION_LOADING_STATE_LOADED */
    return r;
}

IMPL CUresult impl_cuFuncLoad(sim_kernel_t fn) { return kernel_check(fn); }

/* ---- Launches ---------------------------------------------------------------------- */

static CUresult launch(sim_kernel_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shared, CUstream stream)
{
    CUresult r = sim_initialized();
    if (r != CUDA_SUCCESS)
        return r;
    CUcontext ctx;
    if ((r = sim_current_ctx(&ctx)) != CUDA_SUCCESS)
        return r;
    if ((r = kernel_check(fn)) != CUDA_SUCCESS)
        return r;
    sim_trace("launch %s <<<%u,%u>>>", fn->name, gx * gy * gz, bx * by * bz);
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024 ||
        shared > MAX_OPTIN_SHARED)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_stream_check(stream);
}

IMPL CUresult impl_cuLaunchKernel(sim_kernel_t fn, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                  CUstream stream, void **params, void **extra)
{
    (void)params, (void)extra;
    return launch(fn, gx, gy, gz, bx, by, bz, shared, stream);
}

IMPL CUresult impl_cuLaunchKernel_ptsz(sim_kernel_t fn, unsigned gx, unsigned gy, unsigned gz,
                                       unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                       CUstream stream, void **params, void **extra)
{
    (void)params, (void)extra;
    return launch(fn, gx, gy, gz, bx, by, bz, shared, stream ? stream : CU_STREAM_PER_THREAD);
}

/* CUlaunchConfig, as in cuda.h. */
struct launch_config {
    unsigned gx, gy, gz, bx, by, bz, shared;
    CUstream stream;
    void *attrs;
    unsigned n_attrs;
};

IMPL CUresult impl_cuLaunchKernelEx(const struct launch_config *c, sim_kernel_t fn, void **params,
                                    void **extra)
{
    (void)params, (void)extra;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(fn, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->shared, c->stream);
}

IMPL CUresult impl_cuLaunchKernelEx_ptsz(const struct launch_config *c, sim_kernel_t fn,
                                         void **params, void **extra)
{
    (void)params, (void)extra;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(fn, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->shared,
                  c->stream ? c->stream : CU_STREAM_PER_THREAD);
}

IMPL CUresult impl_cuLaunchCooperativeKernel(sim_kernel_t fn, unsigned gx, unsigned gy,
                                             unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                             unsigned shared, CUstream stream, void **params)
{
    (void)params;
    return launch(fn, gx, gy, gz, bx, by, bz, shared, stream);
}

IMPL CUresult impl_cuLaunchCooperativeKernel_ptsz(sim_kernel_t fn, unsigned gx, unsigned gy,
                                                  unsigned gz, unsigned bx, unsigned by,
                                                  unsigned bz, unsigned shared, CUstream stream,
                                                  void **params)
{
    (void)params;
    return launch(fn, gx, gy, gz, bx, by, bz, shared, stream ? stream : CU_STREAM_PER_THREAD);
}

typedef void (*host_fn)(void *);

static CUresult host_func(CUstream stream, host_fn fn, void *data)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_stream_check(stream);
    if (r != CUDA_SUCCESS)
        return r;
    fn(data);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuLaunchHostFunc(CUstream stream, host_fn fn, void *data)
{
    return host_func(stream, fn, data);
}

IMPL CUresult impl_cuLaunchHostFunc_ptsz(CUstream stream, host_fn fn, void *data)
{
    return host_func(stream ? stream : CU_STREAM_PER_THREAD, fn, data);
}

IMPL CUresult impl_cuLaunchHostFunc_v2(CUstream stream, host_fn fn, void *data, unsigned sync)
{
    (void)sync;
    return host_func(stream, fn, data);
}

IMPL CUresult impl_cuLaunchHostFunc_v2_ptsz(CUstream stream, host_fn fn, void *data,
                                            unsigned sync)
{
    (void)sync;
    return host_func(stream ? stream : CU_STREAM_PER_THREAD, fn, data);
}

typedef void (*stream_callback)(CUstream, CUresult, void *);

static CUresult stream_add_callback(CUstream stream, stream_callback cb, void *data,
                                    unsigned flags)
{
    if (!cb || flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_stream_check(stream);
    if (r != CUDA_SUCCESS)
        return r;
    cb(stream, CUDA_SUCCESS, data);
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuStreamAddCallback(CUstream stream, stream_callback cb, void *data,
                                       unsigned flags)
{
    return stream_add_callback(stream, cb, data, flags);
}

IMPL CUresult impl_cuStreamAddCallback_ptsz(CUstream stream, stream_callback cb, void *data,
                                            unsigned flags)
{
    return stream_add_callback(stream ? stream : CU_STREAM_PER_THREAD, cb, data, flags);
}

/* ---- Occupancy ------------------------------------------------------------------------ */

#define SM_THREADS 2048
#define SM_BLOCKS 32
#define SM_SHARED 233472

static int blocks_per_sm(int block_size, size_t shared)
{
    if (block_size <= 0)
        return 0;
    int by_threads = SM_THREADS / block_size;
    int by_shared = shared ? (int)(SM_SHARED / shared) : SM_BLOCKS;
    int n = by_threads < by_shared ? by_threads : by_shared;
    return n < SM_BLOCKS ? n : SM_BLOCKS;
}

IMPL CUresult impl_cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, sim_kernel_t fn,
                                                               int block_size, size_t shared)
{
    if (!n || block_size <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(fn);
    if (r == CUDA_SUCCESS)
        *n = blocks_per_sm(block_size, shared);
    return r;
}

IMPL CUresult impl_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, sim_kernel_t fn,
                                                                        int block_size,
                                                                        size_t shared,
                                                                        unsigned flags)
{
    (void)flags;
    return impl_cuOccupancyMaxActiveBlocksPerMultiprocessor(n, fn, block_size, shared);
}

typedef size_t (*block_to_shared)(int);

IMPL CUresult impl_cuOccupancyMaxPotentialBlockSizeWithFlags(int *min_grid, int *block_size,
                                                             sim_kernel_t fn, block_to_shared f,
                                                             size_t shared, int limit,
                                                             unsigned flags)
{
    (void)flags;
    if (!min_grid || !block_size)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(fn);
    if (r != CUDA_SUCCESS)
        return r;
    int best = 32, best_threads = 0;
    for (int b = 1024; b >= 32; b -= 32) {
        if (limit > 0 && b > limit)
            continue;
        int n = blocks_per_sm(b, f ? f(b) : shared);
        if (n * b > best_threads) {
            best_threads = n * b;
            best = b;
        }
    }
    *block_size = best;
    *min_grid = blocks_per_sm(best, f ? f(best) : shared) * 132;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size,
                                                    sim_kernel_t fn, block_to_shared f,
                                                    size_t shared, int limit)
{
    return impl_cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block_size, fn, f, shared,
                                                          limit, 0);
}

IMPL CUresult impl_cuOccupancyAvailableDynamicSMemPerBlock(size_t *shared, sim_kernel_t fn,
                                                           int n_blocks, int block_size)
{
    if (!shared || n_blocks <= 0 || block_size <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(fn);
    if (r != CUDA_SUCCESS)
        return r;
    size_t per = SM_SHARED / (size_t)n_blocks;
    *shared = per < MAX_OPTIN_SHARED ? per : MAX_OPTIN_SHARED;
    return CUDA_SUCCESS;
}

/* CUlaunchAttribute, as in cuda.h: an id, then a 64-byte value union at offset 8. */
struct launch_attr {
    unsigned id;
    unsigned pad;
    union {
        unsigned char bytes[64];
        struct {
            unsigned x, y, z;
        } cluster_dim;
    } value;
};
#define LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION 4
/* A cluster may hold 8 blocks, or more once the kernel allows non-portable sizes. */
#define PORTABLE_CLUSTER_BLOCKS 8
#define NON_PORTABLE_CLUSTER_BLOCKS 16

/* Where the H100 SXM5's 132 SMs sit: 8 GPCs, two of 18 SMs and six of 16 (NVIDIA disables
 * some TPCs of each chip; the split varies, the total does not).  A cluster's blocks all run
 * in one GPC, so how many clusters fit depends on this split, not only on the SM count.
 * cuBLASLt 12 learns the split at cublasLtCreate: it asks how many clusters of 18, 16, ...,
 * 2, 1 one-SM blocks fit and fails (CUBLAS_STATUS_INTERNAL_ERROR, or a division by zero in
 * 12.8) unless every answer is what one set of GPCs would give. */
static const int k_gpc_sms[] = {18, 18, 16, 16, 16, 16, 16, 16};
#define LARGEST_GPC_SMS 18

/* The cluster shape of a launch: its CLUSTER_DIMENSION attribute, 0 if it has none. */
static uint64_t launch_cluster_blocks(const struct launch_config *config)
{
    const struct launch_attr *attrs = config->attrs;
    for (unsigned i = 0; attrs && i < config->n_attrs; i++) {
        if (attrs[i].id == LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
            return (uint64_t)attrs[i].value.cluster_dim.x * attrs[i].value.cluster_dim.y *
                   attrs[i].value.cluster_dim.z;
    }
    return 0;
}

IMPL CUresult impl_cuOccupancyMaxActiveClusters(int *n, sim_kernel_t fn,
                                               const struct launch_config *config)
{
    if (!n || !config)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(fn);
    if (r != CUDA_SUCCESS)
        return r;
    /* The shape must be in the launch (kernels compiled with a fixed cluster shape are not
     * modelled).  Sizes past the portable 8 need the kernel's non-portable attribute; the
     * query answers up to the largest GPC (launches are no-ops, so the hardware's launch
     * limit of 16 is not enforced). */
    uint64_t cluster = launch_cluster_blocks(config);
    if (cluster == 0 || cluster > LARGEST_GPC_SMS ||
        (cluster > PORTABLE_CLUSTER_BLOCKS && !fn->non_portable_clusters))
        return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    int per_sm = blocks_per_sm((int)(config->bx * config->by * config->bz), config->shared);
    int clusters = 0;
    for (size_t g = 0; g < sizeof k_gpc_sms / sizeof k_gpc_sms[0]; g++)
        clusters += (int)((uint64_t)k_gpc_sms[g] * (uint64_t)per_sm / cluster);
    *n = clusters;
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuOccupancyMaxPotentialClusterSize(int *size, sim_kernel_t fn,
                                                      const struct launch_config *config)
{
    if (!size || !config)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_check(fn);
    if (r == CUDA_SUCCESS)
        *size = fn->non_portable_clusters ? NON_PORTABLE_CLUSTER_BLOCKS : PORTABLE_CLUSTER_BLOCKS;
    return r;
}

/* ---- Exports and cuGetProcAddress ---------------------------------------------------- */

#define FN(x) (void *)(x)

const struct sim_proc sim_procs_modules[] = {
    {"cuModuleLoad", 2000, FN(impl_cuModuleLoad), NULL},
    {"cuModuleLoadData", 2000, FN(impl_cuModuleLoadData), NULL},
    {"cuModuleLoadDataEx", 2010, FN(impl_cuModuleLoadDataEx), NULL},
    {"cuModuleLoadFatBinary", 2000, FN(impl_cuModuleLoadFatBinary), NULL},
    {"cuModuleUnload", 2000, FN(impl_cuModuleUnload), NULL},
    {"cuModuleGetLoadingMode", 11070, FN(impl_cuModuleGetLoadingMode), NULL},
    {"cuModuleGetFunction", 2000, FN(impl_cuModuleGetFunction), NULL},
    {"cuModuleGetGlobal", 3020, FN(impl_cuModuleGetGlobal_v2), NULL},
    {"cuLibraryLoadData", 12000, FN(impl_cuLibraryLoadData), NULL},
    {"cuLibraryLoadFromFile", 12000, FN(impl_cuLibraryLoadFromFile), NULL},
    {"cuLibraryUnload", 12000, FN(impl_cuLibraryUnload), NULL},
    {"cuLibraryGetKernel", 12000, FN(impl_cuLibraryGetKernel), NULL},
    {"cuLibraryGetModule", 12000, FN(impl_cuLibraryGetModule), NULL},
    {"cuLibraryGetGlobal", 12000, FN(impl_cuLibraryGetGlobal), NULL},
    {"cuLibraryGetManaged", 12000, FN(impl_cuLibraryGetManaged), NULL},
    {"cuKernelGetFunction", 12000, FN(impl_cuKernelGetFunction), NULL},
    {"cuKernelGetLibrary", 12050, FN(impl_cuKernelGetLibrary), NULL},
    {"cuKernelGetName", 12030, FN(impl_cuKernelGetName), NULL},
    {"cuKernelGetAttribute", 12000, FN(impl_cuKernelGetAttribute), NULL},
    {"cuKernelSetAttribute", 12000, FN(impl_cuKernelSetAttribute), NULL},
    {"cuKernelSetCacheConfig", 12000, FN(impl_cuKernelSetCacheConfig), NULL},
    {"cuFuncGetModule", 11000, FN(impl_cuFuncGetModule), NULL},
    {"cuFuncGetName", 12030, FN(impl_cuKernelGetName), NULL},
    {"cuFuncGetAttribute", 2020, FN(impl_cuFuncGetAttribute), NULL},
    {"cuFuncSetAttribute", 9000, FN(impl_cuFuncSetAttribute), NULL},
    {"cuFuncSetCacheConfig", 3000, FN(impl_cuFuncSetCacheConfig), NULL},
    {"cuFuncSetSharedMemConfig", 4020, FN(impl_cuFuncSetSharedMemConfig), NULL},
    {"cuFuncIsLoaded", 12040, FN(impl_cuFuncIsLoaded), NULL},
    {"cuFuncLoad", 12040, FN(impl_cuFuncLoad), NULL},
    {"cuLaunchKernel", 4000, FN(impl_cuLaunchKernel), FN(impl_cuLaunchKernel_ptsz)},
    {"cuLaunchKernelEx", 11060, FN(impl_cuLaunchKernelEx), FN(impl_cuLaunchKernelEx_ptsz)},
    {"cuLaunchCooperativeKernel", 9000, FN(impl_cuLaunchCooperativeKernel),
     FN(impl_cuLaunchCooperativeKernel_ptsz)},
    {"cuLaunchHostFunc", 10000, FN(impl_cuLaunchHostFunc), FN(impl_cuLaunchHostFunc_ptsz)},
    {"cuLaunchHostFunc", 13010, FN(impl_cuLaunchHostFunc_v2), FN(impl_cuLaunchHostFunc_v2_ptsz)},
    {"cuStreamAddCallback", 5000, FN(impl_cuStreamAddCallback), FN(impl_cuStreamAddCallback_ptsz)},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050,
     FN(impl_cuOccupancyMaxActiveBlocksPerMultiprocessor), NULL},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000,
     FN(impl_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags), NULL},
    {"cuOccupancyMaxPotentialBlockSize", 6050, FN(impl_cuOccupancyMaxPotentialBlockSize), NULL},
    {"cuOccupancyMaxPotentialBlockSizeWithFlags", 7000,
     FN(impl_cuOccupancyMaxPotentialBlockSizeWithFlags), NULL},
    {"cuOccupancyAvailableDynamicSMemPerBlock", 10020,
     FN(impl_cuOccupancyAvailableDynamicSMemPerBlock), NULL},
    {"cuOccupancyMaxActiveClusters", 11070, FN(impl_cuOccupancyMaxActiveClusters), NULL},
    {"cuOccupancyMaxPotentialClusterSize", 11070, FN(impl_cuOccupancyMaxPotentialClusterSize),
     NULL},
};
const size_t sim_nprocs_modules = sizeof sim_procs_modules / sizeof sim_procs_modules[0];

/* The exported names (cuBLASLt and others dlsym some of them directly). */
#define WRAP(ret, name, params, args) \
    EXPORT ret name params { return impl_##name args; }

WRAP(CUresult, cuModuleLoad, (sim_module_t *m, const char *f), (m, f))
WRAP(CUresult, cuModuleLoadData, (sim_module_t *m, const void *i), (m, i))
WRAP(CUresult, cuModuleLoadDataEx, (sim_module_t *m, const void *i, unsigned n, void *o, void **v),
     (m, i, n, o, v))
WRAP(CUresult, cuModuleLoadFatBinary, (sim_module_t *m, const void *i), (m, i))
WRAP(CUresult, cuModuleUnload, (sim_module_t m), (m))
WRAP(CUresult, cuModuleGetLoadingMode, (int *m), (m))
WRAP(CUresult, cuModuleGetFunction, (sim_kernel_t *f, sim_module_t m, const char *n), (f, m, n))
WRAP(CUresult, cuModuleGetGlobal_v2, (CUdeviceptr *d, size_t *b, sim_module_t m, const char *n),
     (d, b, m, n))
WRAP(CUresult, cuLibraryLoadData,
     (sim_library_t *l, const void *c, void *jo, void **jv, unsigned nj, void *lo, void **lv,
      unsigned nl),
     (l, c, jo, jv, nj, lo, lv, nl))
WRAP(CUresult, cuLibraryLoadFromFile,
     (sim_library_t *l, const char *f, void *jo, void **jv, unsigned nj, void *lo, void **lv,
      unsigned nl),
     (l, f, jo, jv, nj, lo, lv, nl))
WRAP(CUresult, cuLibraryUnload, (sim_library_t l), (l))
WRAP(CUresult, cuLibraryGetKernel, (sim_kernel_t *k, sim_library_t l, const char *n), (k, l, n))
WRAP(CUresult, cuLibraryGetModule, (sim_module_t *m, sim_library_t l), (m, l))
WRAP(CUresult, cuLibraryGetGlobal, (CUdeviceptr *d, size_t *b, sim_library_t l, const char *n),
     (d, b, l, n))
WRAP(CUresult, cuLibraryGetManaged, (CUdeviceptr *d, size_t *b, sim_library_t l, const char *n),
     (d, b, l, n))
WRAP(CUresult, cuKernelGetFunction, (sim_kernel_t *f, sim_kernel_t k), (f, k))
WRAP(CUresult, cuKernelGetLibrary, (sim_library_t *l, sim_kernel_t k), (l, k))
WRAP(CUresult, cuKernelGetName, (const char **n, sim_kernel_t k), (n, k))
WRAP(CUresult, cuKernelGetAttribute, (int *p, int a, sim_kernel_t k, CUdevice d), (p, a, k, d))
WRAP(CUresult, cuKernelSetAttribute, (int a, int v, sim_kernel_t k, CUdevice d), (a, v, k, d))
WRAP(CUresult, cuKernelSetCacheConfig, (sim_kernel_t k, int c, CUdevice d), (k, c, d))
WRAP(CUresult, cuFuncGetModule, (sim_module_t *m, sim_kernel_t f), (m, f))
EXPORT CUresult cuFuncGetName(const char **n, sim_kernel_t f) { return impl_cuKernelGetName(n, f); }
WRAP(CUresult, cuFuncGetAttribute, (int *p, int a, sim_kernel_t f), (p, a, f))
WRAP(CUresult, cuFuncSetAttribute, (sim_kernel_t f, int a, int v), (f, a, v))
WRAP(CUresult, cuFuncSetCacheConfig, (sim_kernel_t f, int c), (f, c))
WRAP(CUresult, cuFuncSetSharedMemConfig, (sim_kernel_t f, int c), (f, c))
WRAP(CUresult, cuFuncIsLoaded, (int *s, sim_kernel_t f), (s, f))
WRAP(CUresult, cuFuncLoad, (sim_kernel_t f), (f))
WRAP(CUresult, cuLaunchKernel,
     (sim_kernel_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
      unsigned bz, unsigned sh, CUstream s, void **p, void **e),
     (f, gx, gy, gz, bx, by, bz, sh, s, p, e))
WRAP(CUresult, cuLaunchKernel_ptsz,
     (sim_kernel_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
      unsigned bz, unsigned sh, CUstream s, void **p, void **e),
     (f, gx, gy, gz, bx, by, bz, sh, s, p, e))
WRAP(CUresult, cuLaunchKernelEx,
     (const struct launch_config *c, sim_kernel_t f, void **p, void **e), (c, f, p, e))
WRAP(CUresult, cuLaunchKernelEx_ptsz,
     (const struct launch_config *c, sim_kernel_t f, void **p, void **e), (c, f, p, e))
WRAP(CUresult, cuLaunchCooperativeKernel,
     (sim_kernel_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
      unsigned bz, unsigned sh, CUstream s, void **p),
     (f, gx, gy, gz, bx, by, bz, sh, s, p))
WRAP(CUresult, cuLaunchCooperativeKernel_ptsz,
     (sim_kernel_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
      unsigned bz, unsigned sh, CUstream s, void **p),
     (f, gx, gy, gz, bx, by, bz, sh, s, p))
WRAP(CUresult, cuLaunchHostFunc, (CUstream s, host_fn f, void *d), (s, f, d))
WRAP(CUresult, cuLaunchHostFunc_ptsz, (CUstream s, host_fn f, void *d), (s, f, d))
WRAP(CUresult, cuLaunchHostFunc_v2, (CUstream s, host_fn f, void *d, unsigned m), (s, f, d, m))
WRAP(CUresult, cuStreamAddCallback, (CUstream s, stream_callback c, void *d, unsigned f),
     (s, c, d, f))
WRAP(CUresult, cuStreamAddCallback_ptsz, (CUstream s, stream_callback c, void *d, unsigned f),
     (s, c, d, f))
WRAP(CUresult, cuOccupancyMaxActiveBlocksPerMultiprocessor,
     (int *n, sim_kernel_t f, int b, size_t s), (n, f, b, s))
WRAP(CUresult, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
     (int *n, sim_kernel_t f, int b, size_t s, unsigned fl), (n, f, b, s, fl))
WRAP(CUresult, cuOccupancyMaxPotentialBlockSize,
     (int *g, int *b, sim_kernel_t f, block_to_shared t, size_t s, int l), (g, b, f, t, s, l))
WRAP(CUresult, cuOccupancyMaxPotentialBlockSizeWithFlags,
     (int *g, int *b, sim_kernel_t f, block_to_shared t, size_t s, int l, unsigned fl),
     (g, b, f, t, s, l, fl))
WRAP(CUresult, cuOccupancyAvailableDynamicSMemPerBlock, (size_t *s, sim_kernel_t f, int n, int b),
     (s, f, n, b))
WRAP(CUresult, cuOccupancyMaxActiveClusters,
     (int *n, sim_kernel_t f, const struct launch_config *c), (n, f, c))
WRAP(CUresult, cuOccupancyMaxPotentialClusterSize,
     (int *n, sim_kernel_t f, const struct launch_config *c), (n, f, c))
