/*
 * cuGetExportTable: the driver's private tables.
 *
 * NVIDIA's runtime (libcudart, and the copies statically linked into cuBLAS
 * and others) does not use only the public driver API: at start-up it asks
 * the driver for tables of function pointers identified by UUID.  The real
 * runtime refuses to work unless six are served, and one of them is a check
 * that the driver is genuine: a keyed hash over the process, the thread, the
 * table addresses, the time and the devices.  The UUIDs, slot layouts and the
 * hash are documented publicly by the ZLUDA project (dark_api/src/lib.rs);
 * what is written here is simcuda's own implementation of those facts:
 *
 *   CUDART_INTERFACE        module loading from a fatbin, the primary context
 *   TOOLS_TLS               a size word only
 *   TOOLS_RUNTIME_CALLBACK_HOOKS  two scratch buffers the runtime writes to
 *   CONTEXT_LOCAL_STORAGE   per-context key/value slots with destructors
 *   CONTEXT_CHECKS          "nothing unusual about this context"
 *   INTEGRITY_CHECK         HMAC (RFC 2104) over MD2 (RFC 1319)
 *   CUBLAS_PRIVATE          asked for by cuBLAS's own runtime at the first
 *                           GEMM; without it cublasCreate fails with
 *                           CUBLAS_STATUS_NOT_SUPPORTED.  Its slots are
 *                           unknown; answering success from each is enough.
 *   CUBLASLT_PRIVATE        asked for by cuBLASLt (12.8 and 13.x) when a
 *                           half-precision (bf16/fp16) matmul first looks for
 *                           an algorithm, as under torch.autocast; it calls
 *                           slot 4 without checking that the table was served,
 *                           so a refusal crashes the process on a null table.
 *                           Slots unknown too: the same success-answering
 *                           table is enough.
 *
 * Any other UUID is refused with CUDA_ERROR_INVALID_VALUE, as the real driver
 * refuses one it does not know; the runtime tolerates that for the optional
 * ones (F8CFF951-2146-8B4E-B9E2-FB469E7C0DD9 among them).
 *
 * Slots whose meaning is not known hold a function that answers
 * CUDA_ERROR_NOT_SUPPORTED (and says so under SIMCUDA_TRACE=1) rather than a
 * null pointer, so a caller that reaches one fails instead of crashing.
 */
#define _GNU_SOURCE
#include "internal.h"
#include "identity.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* From modules.c: loads a fatbin (wrapper or bare) as a module. */
CUresult sim_module_load_image(sim_module_t *out, const void *image);

typedef void (*slot_fn)(void);

#define SLOT(f) ((const void *)(f))
#define SIZE_WORD(n) ((const void *)(uintptr_t)(sizeof(void *) * (n)))

/* One function per unknown slot, so SIMCUDA_TRACE=1 can say which was called. */
#define UNKNOWN_SLOT(table, index)                                               \
    static long unknown_##table##_##index(void)                                   \
    {                                                                            \
        sim_trace("export table %s: slot %d (meaning unknown) called", #table, index); \
        return CUDA_ERROR_NOT_SUPPORTED;                                         \
    }
UNKNOWN_SLOT(CUDART_INTERFACE, 3)
UNKNOWN_SLOT(CUDART_INTERFACE, 4)
UNKNOWN_SLOT(CUDART_INTERFACE, 5)
UNKNOWN_SLOT(CUDART_INTERFACE, 9)
UNKNOWN_SLOT(CUDART_INTERFACE, 10)
UNKNOWN_SLOT(CUDART_INTERFACE, 11)
UNKNOWN_SLOT(TOOLS_TLS, 1)
UNKNOWN_SLOT(TOOLS_TLS, 3)
UNKNOWN_SLOT(TOOLS_HOOKS, 1)
UNKNOWN_SLOT(TOOLS_HOOKS, 3)
UNKNOWN_SLOT(TOOLS_HOOKS, 4)
UNKNOWN_SLOT(TOOLS_HOOKS, 5)
UNKNOWN_SLOT(CONTEXT_LOCAL_STORAGE, 3)
UNKNOWN_SLOT(CONTEXT_CHECKS, 1)
UNKNOWN_SLOT(INTEGRITY_CHECK, 2)

static long quiet_success(void) { return CUDA_SUCCESS; }



/* ---- CUDART_INTERFACE ------------------------------------------------------ */

static CUresult cudart_module_from_wrapper(sim_module_t *module, const void *wrapper)
{
    if (!module || !wrapper)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_module_load_image(module, wrapper);
}

/* The primary context of a device, whether or not anyone retained it. */
static CUresult cudart_primary_ctx(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_primary_ctx(dev, pctx);
}

static CUresult cudart_module_from_wrapper_ext(sim_module_t *module, const void *wrapper,
                                               void *arg3, void *arg4, unsigned arg5)
{
    if (arg3 || arg4 || arg5)
        return CUDA_ERROR_NOT_SUPPORTED;
    return cudart_module_from_wrapper(module, wrapper);
}

static void cudart_ignore(uintptr_t arg) { (void)arg; }

static CUresult cudart_module_from_fatbin(const void *fatbin, sim_module_t *module, void *arg3,
                                          void *arg4, unsigned arg5)
{
    if (arg3 || arg4 || arg5)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!module || !fatbin)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_module_load_image(module, fatbin);
}

/* The real driver loads its PTX compiler here; simcuda has nothing to load. */
static CUresult cudart_load_compilers(void) { return CUDA_SUCCESS; }

static const void *const k_cudart_interface[13] = {
    SIZE_WORD(13),
    SLOT(cudart_module_from_wrapper),
    SLOT(cudart_primary_ctx),
    SLOT(unknown_CUDART_INTERFACE_3),
    SLOT(unknown_CUDART_INTERFACE_4),
    SLOT(unknown_CUDART_INTERFACE_5),
    SLOT(cudart_module_from_wrapper_ext),
    SLOT(cudart_ignore),
    SLOT(cudart_module_from_fatbin),
    SLOT(unknown_CUDART_INTERFACE_9),
    SLOT(unknown_CUDART_INTERFACE_10),
    SLOT(unknown_CUDART_INTERFACE_11),
    SLOT(cudart_load_compilers),
};

/* ---- TOOLS_TLS, TOOLS_RUNTIME_CALLBACK_HOOKS -------------------------------- */

/* Every runtime calls slot 2 around its API calls, with what looks like the
 * callback id and its parameters (a tools callback); with no tool attached
 * there is nothing to do but answer success. */
static const void *const k_tools_tls[4] = {SIZE_WORD(4), SLOT(unknown_TOOLS_TLS_1),
                                           SLOT(quiet_success), SLOT(unknown_TOOLS_TLS_3)};

/* Buffers the runtime fills for profiling tools; nobody reads them here. */
static uint32_t g_hook_buffer1[1024];
static uint32_t g_hook_buffer2[14];

static void hooks_buffer1(void **ptr, size_t *size)
{
    *ptr = g_hook_buffer1;
    *size = sizeof g_hook_buffer1 / sizeof g_hook_buffer1[0];
}

static void hooks_buffer2(void **ptr, size_t *size)
{
    *ptr = g_hook_buffer2;
    *size = sizeof g_hook_buffer2 / sizeof g_hook_buffer2[0];
}

static const void *const k_tools_hooks[7] = {
    SIZE_WORD(7),
    SLOT(unknown_TOOLS_HOOKS_1),
    SLOT(hooks_buffer1),
    SLOT(unknown_TOOLS_HOOKS_3),
    SLOT(unknown_TOOLS_HOOKS_4),
    SLOT(unknown_TOOLS_HOOKS_5),
    SLOT(hooks_buffer2),
};

/* ---- CONTEXT_LOCAL_STORAGE ------------------------------------------------- */

typedef void (*cls_dtor)(CUcontext, void *key, void *value);

struct cls_entry {
    CUcontext ctx;
    void *key, *value;
    cls_dtor dtor;
    struct cls_entry *next;
};

static pthread_mutex_t g_cls_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cls_entry *g_cls;

static CUresult cls_context(CUcontext in, CUcontext *out)
{
    if (in) {
        CUdevice dev;
        CUresult r = sim_ctx_device(in, &dev);
        if (r != CUDA_SUCCESS)
            return r;
        *out = in;
        return CUDA_SUCCESS;
    }
    return sim_current_ctx(out);
}

static struct cls_entry **cls_find(CUcontext ctx, void *key)
{
    struct cls_entry **p = &g_cls;
    while (*p && !((*p)->ctx == ctx && (*p)->key == key))
        p = &(*p)->next;
    return p;
}

static CUresult cls_put(CUcontext ctx, void *key, void *value, cls_dtor dtor)
{
    CUresult r = cls_context(ctx, &ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_cls_lock);
    struct cls_entry **p = cls_find(ctx, key);
    if (!*p) {
        *p = calloc(1, sizeof **p);
        if (!*p) {
            pthread_mutex_unlock(&g_cls_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        (*p)->ctx = ctx;
        (*p)->key = key;
    }
    (*p)->value = value;
    (*p)->dtor = dtor;
    pthread_mutex_unlock(&g_cls_lock);
    return CUDA_SUCCESS;
}

static CUresult cls_delete(CUcontext ctx, void *key)
{
    CUresult r = cls_context(ctx, &ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_cls_lock);
    struct cls_entry **p = cls_find(ctx, key);
    struct cls_entry *gone = *p;
    if (gone)
        *p = gone->next;
    pthread_mutex_unlock(&g_cls_lock);
    free(gone);
    return CUDA_SUCCESS;
}

static CUresult cls_get(void **value, CUcontext ctx, void *key)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cls_context(ctx, &ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_cls_lock);
    struct cls_entry *e = *cls_find(ctx, key);
    *value = e ? e->value : NULL;
    pthread_mutex_unlock(&g_cls_lock);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Destructors run without any driver lock held: they call back into the
 * driver (the runtime frees its per-context state there). */
void sim_cls_context_gone(CUcontext ctx)
{
    for (;;) {
        pthread_mutex_lock(&g_cls_lock);
        struct cls_entry **p = &g_cls;
        while (*p && (*p)->ctx != ctx)
            p = &(*p)->next;
        struct cls_entry *e = *p;
        if (e)
            *p = e->next;
        pthread_mutex_unlock(&g_cls_lock);
        if (!e)
            return;
        if (e->dtor)
            e->dtor(ctx, e->key, e->value);
        free(e);
    }
}

static const void *const k_context_local_storage[4] = {SLOT(cls_put), SLOT(cls_delete),
                                                       SLOT(cls_get),
                                                       SLOT(unknown_CONTEXT_LOCAL_STORAGE_3)};

/* ---- CONTEXT_CHECKS ---------------------------------------------------------- */

static CUresult context_check(CUcontext ctx, uint32_t *result1, const void **result2)
{
    (void)ctx;
    if (result1)
        *result1 = 0;
    if (result2)
        *result2 = NULL;
    return CUDA_SUCCESS;
}

static uint32_t context_check3(void) { return 0; }

static const void *const k_context_checks[4] = {SIZE_WORD(4), SLOT(unknown_CONTEXT_CHECKS_1),
                                                SLOT(context_check), SLOT(context_check3)};

/* ---- INTEGRITY_CHECK: HMAC-MD2 ------------------------------------------------ */

/* RFC 1319's substitution table, built from the digits of pi. */
static const uint8_t k_md2_s[256] = {
    41,  46,  67,  201, 162, 216, 124, 1,   61,  54,  84,  161, 236, 240, 6,   19,  98,  167,
    5,   243, 192, 199, 115, 140, 152, 147, 43,  217, 188, 76,  130, 202, 30,  155, 87,  60,
    253, 212, 224, 22,  103, 66,  111, 24,  138, 23,  229, 18,  190, 78,  196, 214, 218, 158,
    222, 73,  160, 251, 245, 142, 187, 47,  238, 122, 169, 104, 121, 145, 21,  178, 7,   63,
    148, 194, 16,  137, 11,  34,  95,  33,  128, 127, 93,  154, 90,  144, 50,  39,  53,  62,
    204, 231, 191, 247, 151, 3,   255, 25,  48,  179, 72,  165, 181, 209, 215, 94,  146, 42,
    172, 86,  170, 198, 79,  184, 56,  210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116,
    4,   241, 69,  157, 112, 89,  100, 113, 135, 32,  134, 91,  207, 101, 230, 45,  168, 2,
    27,  96,  37,  173, 174, 176, 185, 246, 28,  70,  97,  105, 52,  64,  126, 15,  85,  71,
    163, 35,  221, 81,  175, 58,  195, 92,  249, 206, 186, 197, 234, 38,  44,  83,  13,  110,
    133, 40,  132, 9,   211, 223, 205, 244, 65,  129, 77,  82,  106, 220, 55,  200, 108, 193,
    171, 250, 36,  225, 123, 8,   12,  189, 177, 74,  120, 136, 149, 139, 227, 99,  232, 109,
    233, 203, 213, 254, 59,  0,   29,  57,  242, 239, 183, 14,  102, 88,  208, 228, 166, 119,
    114, 248, 235, 117, 75,  10,  49,  68,  80,  180, 143, 237, 31,  26,  219, 153, 141, 51,
    159, 17,  131, 20,
};

struct md2 {
    uint8_t x[48];
    uint8_t checksum[16];
    uint8_t block[16];
    uint8_t used, last;
};

static void md2_init(struct md2 *m) { memset(m, 0, sizeof *m); }

static void md2_compress(struct md2 *m)
{
    for (int j = 0; j < 16; j++) {
        m->x[16 + j] = m->block[j];
        m->x[32 + j] = m->x[j] ^ m->block[j];
        m->last = m->checksum[j] ^= k_md2_s[m->block[j] ^ m->last];
    }
    uint8_t t = 0;
    for (int round = 0; round < 18; round++) {
        for (int k = 0; k < 48; k++)
            t = m->x[k] ^= k_md2_s[t];
        t = (uint8_t)(t + round);
    }
}

static void md2_update(struct md2 *m, const void *data, size_t len)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++) {
        m->block[m->used++] = p[i];
        if (m->used == 16) {
            md2_compress(m);
            m->used = 0;
        }
    }
}

static void md2_final(struct md2 *m, uint8_t out[16])
{
    uint8_t pad = (uint8_t)(16 - m->used);
    uint8_t padding[16];
    memset(padding, pad, sizeof padding);
    md2_update(m, padding, pad);
    uint8_t checksum[16];
    memcpy(checksum, m->checksum, 16);
    md2_update(m, checksum, 16);
    memcpy(out, m->x, 16);
}

/* The key the runtime expects (a constant of NVIDIA's, as published by ZLUDA). */
static const uint8_t k_integrity_key[16] = {0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52,
                                            0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F};

/* The hashed message: this header, then one device record per device. */
struct integrity_header {
    uint32_t driver_version, runtime_version, pid, thread;
    const void *cudart_table, *integrity_table, *check_fn;
    uint64_t unix_seconds;
};
struct integrity_device {
    uint8_t uuid[16];
    int32_t pci_domain, pci_bus, pci_device;
};

_Static_assert(sizeof(struct integrity_header) == 48, "hashed as 48 bytes");
_Static_assert(sizeof(struct integrity_device) == 28, "hashed as 28 bytes");

static CUresult integrity_check(uint32_t runtime_version, uint64_t unix_seconds,
                                uint64_t result[2]);

static const void *const k_integrity[3] = {SIZE_WORD(3), SLOT(integrity_check),
                                           SLOT(unknown_INTEGRITY_CHECK_2)};

static CUresult integrity_check(uint32_t runtime_version, uint64_t unix_seconds,
                                uint64_t result[2])
{
    sim_trace("integrity check for runtime %u", runtime_version);
    if (!result)
        return CUDA_ERROR_INVALID_VALUE;
    /* Runtimes whose version ends in 0 or 1 expect fixed answers. */
    if (runtime_version % 10 == 0) {
        result[0] = 0x3341181C03CB675Cull;
        result[1] = 0x8ED383AA1F4CD1E8ull;
        return CUDA_SUCCESS;
    }
    if (runtime_version % 10 == 1) {
        result[0] = 0x1841181C03CB675Cull;
        result[1] = 0x8ED383AA1F4CD1E8ull;
        return CUDA_SUCCESS;
    }
    struct integrity_header h = {
        .driver_version = SIM_DRIVER_VERSION,
        .runtime_version = runtime_version,
        .pid = (uint32_t)getpid(),
        .thread = (uint32_t)(uintptr_t)pthread_self(),
        .cudart_table = k_cudart_interface,
        .integrity_table = k_integrity,
        .check_fn = k_integrity[1],
        .unix_seconds = unix_seconds,
    };
    uint8_t pad[16], inner[16];
    struct md2 m;
    md2_init(&m);
    for (int i = 0; i < 16; i++)
        pad[i] = k_integrity_key[i] ^ 0x36;
    md2_update(&m, pad, 16);
    md2_update(&m, &h, sizeof h);
    int n = sim_device_count();
    for (int d = 0; d < n; d++) {
        struct integrity_device dev;
        simcuda_device_uuid(d, dev.uuid);
        dev.pci_domain = simcuda_pci_domain(d);
        dev.pci_bus = simcuda_pci_bus(d);
        dev.pci_device = simcuda_pci_device(d);
        md2_update(&m, &dev, sizeof dev);
    }
    md2_final(&m, inner);
    md2_init(&m);
    for (int i = 0; i < 16; i++)
        pad[i] = k_integrity_key[i] ^ 0x5c;
    md2_update(&m, pad, 16);
    md2_update(&m, inner, 16);
    uint8_t digest[16];
    md2_final(&m, digest);
    memcpy(result, digest, 16);
    return CUDA_SUCCESS;
}

/* ---- CUBLAS_PRIVATE ---------------------------------------------------------- */

#define CUBLAS_PRIVATE_SLOTS 95
static const void *g_cublas_private[CUBLAS_PRIVATE_SLOTS];
static pthread_once_t g_cublas_private_once = PTHREAD_ONCE_INIT;

static void cublas_private_fill(void)
{
    g_cublas_private[0] = SIZE_WORD(CUBLAS_PRIVATE_SLOTS);
    for (int i = 1; i < CUBLAS_PRIVATE_SLOTS; i++)
        g_cublas_private[i] = SLOT(quiet_success);
}

/* 1734DC26-800D-4745-8726-C0F1E7DD8BCA: served with CUBLAS_PRIVATE's slots (see the top). */
static const sim_uuid k_cublaslt_private_id = {{0x17, 0x34, 0xDC, 0x26, 0x80, 0x0D, 0x47, 0x45,
                                                0x87, 0x26, 0xC0, 0xF1, 0xE7, 0xDD, 0x8B, 0xCA}};

/* ---- The table of tables ------------------------------------------------------- */

static const struct {
    const char *name;
    sim_uuid id;
    const void *const *table;
} k_tables[] = {
    {"CUDART_INTERFACE",
     {{0x6B, 0xD5, 0xFB, 0x6C, 0x5B, 0xF4, 0xE7, 0x4A, 0x89, 0x87, 0xD9, 0x39, 0x12, 0xFD, 0x9D,
       0xF9}},
     k_cudart_interface},
    {"TOOLS_TLS",
     {{0x42, 0xD8, 0x5A, 0x81, 0x23, 0xF6, 0xCB, 0x47, 0x82, 0x98, 0xF6, 0xE7, 0x8A, 0x3A, 0xEC,
       0xDC}},
     k_tools_tls},
    {"TOOLS_RUNTIME_CALLBACK_HOOKS",
     {{0xA0, 0x94, 0x79, 0x8C, 0x2E, 0x74, 0x2E, 0x74, 0x93, 0xF2, 0x08, 0x00, 0x20, 0x0C, 0x0A,
       0x66}},
     k_tools_hooks},
    {"CONTEXT_LOCAL_STORAGE",
     {{0xC6, 0x93, 0x33, 0x6E, 0x11, 0x21, 0xDF, 0x11, 0xA8, 0xC3, 0x68, 0xF3, 0x55, 0xD8, 0x95,
       0x93}},
     k_context_local_storage},
    {"CONTEXT_CHECKS",
     {{0x26, 0x3E, 0x88, 0x60, 0x7C, 0xD2, 0x61, 0x43, 0x92, 0xF6, 0xBB, 0xD5, 0x00, 0x6D, 0xFA,
       0x7E}},
     k_context_checks},
    {"INTEGRITY_CHECK",
     {{0xD4, 0x08, 0x20, 0x55, 0xBD, 0xE6, 0x70, 0x4B, 0x8D, 0x34, 0xBA, 0x12, 0x3C, 0x66, 0xE1,
       0xF2}},
     k_integrity},
};

static int uuid_is(const sim_uuid *id, const uint8_t prefix[4])
{
    return memcmp(id->bytes, prefix, 4) == 0;
}

static CUresult get_export_table(const void **table, const sim_uuid *id)
{
    if (!table || !id)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof k_tables / sizeof k_tables[0]; i++) {
        if (memcmp(id->bytes, k_tables[i].id.bytes, 16) == 0) {
            sim_trace("cuGetExportTable: %s", k_tables[i].name);
            *table = k_tables[i].table;
            return CUDA_SUCCESS;
        }
    }
    static const uint8_t cublas_prefix[4] = {0x21, 0x31, 0x8C, 0x60};
    int cublaslt = memcmp(id->bytes, k_cublaslt_private_id.bytes, 16) == 0;
    if (cublaslt || uuid_is(id, cublas_prefix)) {
        if (cublaslt)
            sim_trace("cuGetExportTable: CUBLASLT_PRIVATE");
        pthread_once(&g_cublas_private_once, cublas_private_fill);
        *table = g_cublas_private;
        return CUDA_SUCCESS;
    }
    const uint8_t *b = id->bytes;
    sim_trace("cuGetExportTable: refused %02X%02X%02X%02X-%02X%02X-%02X%02X-%02X%02X-"
              "%02X%02X%02X%02X%02X%02X",
              b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
              b[13], b[14], b[15]);
    *table = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

IMPL CUresult impl_cuGetExportTable(const void **table, const sim_uuid *id)
{
    return get_export_table(table, id);
}

EXPORT CUresult cuGetExportTable(const void **table, const sim_uuid *id)
{
    return impl_cuGetExportTable(table, id);
}

const struct sim_proc sim_procs_export_tables[] = {
    {"cuGetExportTable", 3000, (void *)impl_cuGetExportTable, NULL},
};
const size_t sim_nprocs_export_tables =
    sizeof sim_procs_export_tables / sizeof sim_procs_export_tables[0];
