/*
 * Copies and fills in every form the driver API has.
 *
 * In simcuda device memory is host memory at the same address (core.c maps
 * the device windows readable and writable), so a copy between any two kinds
 * of memory is memmove and a fill is a loop.  Every stream is idle, so the
 * asynchronous forms complete before they return, which a correct program
 * cannot tell apart from a fast GPU.
 *
 * Where this differs from a real driver: an address that is not memory the
 * driver knows is not refused (the real one answers CUDA_ERROR_INVALID_VALUE
 * for some such copies); it is read or written as host memory.  Arrays
 * (CUarray) are not supported.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <string.h>

typedef CUdeviceptr dptr_t;

static CUresult ready(void)
{
    CUresult r = sim_initialized();
    if (r != CUDA_SUCCESS)
        return r;
    CUcontext ctx;
    return sim_current_ctx(&ctx);
}

static CUresult copy(void *dst, const void *src, size_t n)
{
    CUresult r = ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (n && (!dst || !src))
        return CUDA_ERROR_INVALID_VALUE;
    if (n)
        memmove(dst, src, n);
    return CUDA_SUCCESS;
}

static CUresult copy_async(void *dst, const void *src, size_t n, CUstream s)
{
    CUresult r = sim_stream_check(s);
    return r != CUDA_SUCCESS ? r : copy(dst, src, n);
}

#define P(x) ((void *)(uintptr_t)(x))

IMPL CUresult impl_cuMemcpy(dptr_t dst, dptr_t src, size_t n) { return copy(P(dst), P(src), n); }
IMPL CUresult impl_cuMemcpyAsync(dptr_t dst, dptr_t src, size_t n, CUstream s)
{
    return copy_async(P(dst), P(src), n, s);
}
IMPL CUresult impl_cuMemcpyHtoD(dptr_t dst, const void *src, size_t n)
{
    return copy(P(dst), src, n);
}
IMPL CUresult impl_cuMemcpyDtoH(void *dst, dptr_t src, size_t n) { return copy(dst, P(src), n); }
IMPL CUresult impl_cuMemcpyDtoD(dptr_t dst, dptr_t src, size_t n)
{
    return copy(P(dst), P(src), n);
}
IMPL CUresult impl_cuMemcpyHtoDAsync(dptr_t dst, const void *src, size_t n, CUstream s)
{
    return copy_async(P(dst), src, n, s);
}
IMPL CUresult impl_cuMemcpyDtoHAsync(void *dst, dptr_t src, size_t n, CUstream s)
{
    return copy_async(dst, P(src), n, s);
}
IMPL CUresult impl_cuMemcpyDtoDAsync(dptr_t dst, dptr_t src, size_t n, CUstream s)
{
    return copy_async(P(dst), P(src), n, s);
}
IMPL CUresult impl_cuMemcpyPeer(dptr_t dst, CUcontext dc, dptr_t src, CUcontext sc, size_t n)
{
    (void)dc, (void)sc;
    return copy(P(dst), P(src), n);
}
IMPL CUresult impl_cuMemcpyPeerAsync(dptr_t dst, CUcontext dc, dptr_t src, CUcontext sc,
                                     size_t n, CUstream s)
{
    (void)dc, (void)sc;
    return copy_async(P(dst), P(src), n, s);
}

/* ---- 2D and 3D ----------------------------------------------------------------- */

enum { MT_HOST = 1, MT_DEVICE = 2, MT_ARRAY = 3, MT_UNIFIED = 4 };

/* CUDA_MEMCPY3D (CUDA_MEMCPY2D is its prefix without z, lod and the heights). */
struct memcpy3d {
    size_t src_x, src_y, src_z, src_lod;
    int src_type;
    const void *src_host;
    dptr_t src_device;
    void *src_array, *reserved0;
    size_t src_pitch, src_height;
    size_t dst_x, dst_y, dst_z, dst_lod;
    int dst_type;
    void *dst_host;
    dptr_t dst_device;
    void *dst_array, *reserved1;
    size_t dst_pitch, dst_height;
    size_t width, height, depth;
};

struct memcpy2d {
    size_t src_x, src_y;
    int src_type;
    const void *src_host;
    dptr_t src_device;
    void *src_array;
    size_t src_pitch;
    size_t dst_x, dst_y;
    int dst_type;
    void *dst_host;
    dptr_t dst_device;
    void *dst_array;
    size_t dst_pitch;
    size_t width, height;
};

static const char *base_of(int type, const void *host, dptr_t device)
{
    switch (type) {
    case MT_HOST: return host;
    case MT_DEVICE:
    case MT_UNIFIED: return P(device);
    default: return NULL;
    }
}

static CUresult copy_3d(const struct memcpy3d *c)
{
    CUresult r = ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    const char *src = base_of(c->src_type, c->src_host, c->src_device);
    char *dst = (char *)base_of(c->dst_type, c->dst_host, c->dst_device);
    if (c->src_type == MT_ARRAY || c->dst_type == MT_ARRAY)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!src || !dst)
        return CUDA_ERROR_INVALID_VALUE;
    size_t depth = c->depth ? c->depth : 1;
    size_t sp = c->src_pitch ? c->src_pitch : c->width;
    size_t dp = c->dst_pitch ? c->dst_pitch : c->width;
    size_t sh = c->src_height ? c->src_height : c->height;
    size_t dh = c->dst_height ? c->dst_height : c->height;
    for (size_t z = 0; z < depth; z++)
        for (size_t y = 0; y < c->height; y++)
            memmove(dst + ((c->dst_z + z) * dh + c->dst_y + y) * dp + c->dst_x,
                    src + ((c->src_z + z) * sh + c->src_y + y) * sp + c->src_x, c->width);
    return CUDA_SUCCESS;
}

static CUresult copy_2d(const struct memcpy2d *c)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    struct memcpy3d t = {
        .src_x = c->src_x, .src_y = c->src_y, .src_type = c->src_type,
        .src_host = c->src_host, .src_device = c->src_device, .src_array = c->src_array,
        .src_pitch = c->src_pitch, .dst_x = c->dst_x, .dst_y = c->dst_y,
        .dst_type = c->dst_type, .dst_host = c->dst_host, .dst_device = c->dst_device,
        .dst_array = c->dst_array, .dst_pitch = c->dst_pitch, .width = c->width,
        .height = c->height, .depth = 1,
    };
    return copy_3d(&t);
}

IMPL CUresult impl_cuMemcpy2D(const struct memcpy2d *c) { return copy_2d(c); }
IMPL CUresult impl_cuMemcpy2DAsync(const struct memcpy2d *c, CUstream s)
{
    CUresult r = sim_stream_check(s);
    return r != CUDA_SUCCESS ? r : copy_2d(c);
}
IMPL CUresult impl_cuMemcpy3D(const struct memcpy3d *c) { return copy_3d(c); }
IMPL CUresult impl_cuMemcpy3DAsync(const struct memcpy3d *c, CUstream s)
{
    CUresult r = sim_stream_check(s);
    return r != CUDA_SUCCESS ? r : copy_3d(c);
}

/* ---- Batches --------------------------------------------------------------------- */

static CUresult copy_batch(dptr_t *dsts, dptr_t *srcs, size_t *sizes, size_t count,
                           size_t *fail_idx, CUstream s)
{
    CUresult r = sim_stream_check(s);
    if (r != CUDA_SUCCESS)
        return r;
    if (!dsts || !srcs || !sizes || !count)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if ((r = copy(P(dsts[i]), P(srcs[i]), sizes[i])) != CUDA_SUCCESS) {
            if (fail_idx)
                *fail_idx = i;
            return r;
        }
    }
    if (fail_idx)
        *fail_idx = SIZE_MAX;
    return CUDA_SUCCESS;
}

/* 12.8's ABI reports the index of a failed copy; 13.0 dropped that argument. */
IMPL CUresult impl_cuMemcpyBatchAsync_v1(dptr_t *dsts, dptr_t *srcs, size_t *sizes, size_t count,
                                         void *attrs, size_t *attr_idxs, size_t n_attrs,
                                         size_t *fail_idx, CUstream s)
{
    (void)attrs, (void)attr_idxs, (void)n_attrs;
    return copy_batch(dsts, srcs, sizes, count, fail_idx, s);
}
IMPL CUresult impl_cuMemcpyBatchAsync_v2(dptr_t *dsts, dptr_t *srcs, size_t *sizes, size_t count,
                                         void *attrs, size_t *attr_idxs, size_t n_attrs,
                                         CUstream s)
{
    (void)attrs, (void)attr_idxs, (void)n_attrs;
    return copy_batch(dsts, srcs, sizes, count, NULL, s);
}

/* ---- Fills ------------------------------------------------------------------------- */

static CUresult fill(dptr_t dst, size_t pitch, unsigned value, size_t elem, size_t width,
                     size_t height, CUstream s)
{
    CUresult r = sim_stream_check(s);
    if (r == CUDA_SUCCESS)
        r = ready();
    if (r != CUDA_SUCCESS)
        return r;
    if ((width && height && !dst) || dst % elem)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t y = 0; y < height; y++) {
        char *row = (char *)P(dst + y * pitch);
        switch (elem) {
        case 1: memset(row, (int)(value & 0xff), width); break;
        case 2:
            for (size_t i = 0; i < width; i++)
                ((uint16_t *)row)[i] = (uint16_t)value;
            break;
        default:
            for (size_t i = 0; i < width; i++)
                ((uint32_t *)row)[i] = value;
        }
    }
    return CUDA_SUCCESS;
}

IMPL CUresult impl_cuMemsetD8(dptr_t d, unsigned char v, size_t n)
{
    return fill(d, 0, v, 1, n, 1, NULL);
}
IMPL CUresult impl_cuMemsetD16(dptr_t d, unsigned short v, size_t n)
{
    return fill(d, 0, v, 2, n, 1, NULL);
}
IMPL CUresult impl_cuMemsetD32(dptr_t d, unsigned v, size_t n)
{
    return fill(d, 0, v, 4, n, 1, NULL);
}
IMPL CUresult impl_cuMemsetD8Async(dptr_t d, unsigned char v, size_t n, CUstream s)
{
    return fill(d, 0, v, 1, n, 1, s);
}
IMPL CUresult impl_cuMemsetD16Async(dptr_t d, unsigned short v, size_t n, CUstream s)
{
    return fill(d, 0, v, 2, n, 1, s);
}
IMPL CUresult impl_cuMemsetD32Async(dptr_t d, unsigned v, size_t n, CUstream s)
{
    return fill(d, 0, v, 4, n, 1, s);
}
IMPL CUresult impl_cuMemsetD2D8(dptr_t d, size_t p, unsigned char v, size_t w, size_t h)
{
    return fill(d, p, v, 1, w, h, NULL);
}
IMPL CUresult impl_cuMemsetD2D16(dptr_t d, size_t p, unsigned short v, size_t w, size_t h)
{
    return fill(d, p, v, 2, w, h, NULL);
}
IMPL CUresult impl_cuMemsetD2D32(dptr_t d, size_t p, unsigned v, size_t w, size_t h)
{
    return fill(d, p, v, 4, w, h, NULL);
}
IMPL CUresult impl_cuMemsetD2D8Async(dptr_t d, size_t p, unsigned char v, size_t w, size_t h,
                                     CUstream s)
{
    return fill(d, p, v, 1, w, h, s);
}
IMPL CUresult impl_cuMemsetD2D16Async(dptr_t d, size_t p, unsigned short v, size_t w, size_t h,
                                      CUstream s)
{
    return fill(d, p, v, 2, w, h, s);
}
IMPL CUresult impl_cuMemsetD2D32Async(dptr_t d, size_t p, unsigned v, size_t w, size_t h,
                                      CUstream s)
{
    return fill(d, p, v, 4, w, h, s);
}

/* ---- Prefetch and advice: placement hints, nothing to move ----------------------------- */

IMPL CUresult impl_cuMemPrefetchAsync_v1(dptr_t d, size_t n, CUdevice dev, CUstream s)
{
    (void)d, (void)n, (void)dev;
    return sim_stream_check(s);
}
IMPL CUresult impl_cuMemPrefetchAsync_v2(dptr_t d, size_t n, CUmemLocation loc, unsigned flags,
                                         CUstream s)
{
    (void)d, (void)n, (void)loc, (void)flags;
    return sim_stream_check(s);
}
IMPL CUresult impl_cuMemAdvise_v1(dptr_t d, size_t n, int advice, CUdevice dev)
{
    (void)d, (void)n, (void)advice, (void)dev;
    return ready();
}
IMPL CUresult impl_cuMemAdvise_v2(dptr_t d, size_t n, int advice, CUmemLocation loc)
{
    (void)d, (void)n, (void)advice, (void)loc;
    return ready();
}

/* ---- cuGetProcAddress and exports ------------------------------------------------------ */

#define FN(x) (void *)(x)

const struct sim_proc sim_procs_copies[] = {
    {"cuMemcpy", 4000, FN(impl_cuMemcpy), FN(impl_cuMemcpy)},
    {"cuMemcpyAsync", 4000, FN(impl_cuMemcpyAsync), FN(impl_cuMemcpyAsync)},
    {"cuMemcpyPeer", 4000, FN(impl_cuMemcpyPeer), FN(impl_cuMemcpyPeer)},
    {"cuMemcpyPeerAsync", 4000, FN(impl_cuMemcpyPeerAsync), FN(impl_cuMemcpyPeerAsync)},
    {"cuMemcpyHtoD", 3020, FN(impl_cuMemcpyHtoD), FN(impl_cuMemcpyHtoD)},
    {"cuMemcpyDtoH", 3020, FN(impl_cuMemcpyDtoH), FN(impl_cuMemcpyDtoH)},
    {"cuMemcpyDtoD", 3020, FN(impl_cuMemcpyDtoD), FN(impl_cuMemcpyDtoD)},
    {"cuMemcpyHtoDAsync", 3020, FN(impl_cuMemcpyHtoDAsync), FN(impl_cuMemcpyHtoDAsync)},
    {"cuMemcpyDtoHAsync", 3020, FN(impl_cuMemcpyDtoHAsync), FN(impl_cuMemcpyDtoHAsync)},
    {"cuMemcpyDtoDAsync", 3020, FN(impl_cuMemcpyDtoDAsync), FN(impl_cuMemcpyDtoDAsync)},
    {"cuMemcpy2D", 3020, FN(impl_cuMemcpy2D), FN(impl_cuMemcpy2D)},
    {"cuMemcpy2DUnaligned", 3020, FN(impl_cuMemcpy2D), FN(impl_cuMemcpy2D)},
    {"cuMemcpy2DAsync", 3020, FN(impl_cuMemcpy2DAsync), FN(impl_cuMemcpy2DAsync)},
    {"cuMemcpy3D", 3020, FN(impl_cuMemcpy3D), FN(impl_cuMemcpy3D)},
    {"cuMemcpy3DAsync", 3020, FN(impl_cuMemcpy3DAsync), FN(impl_cuMemcpy3DAsync)},
    {"cuMemcpyBatchAsync", 12080, FN(impl_cuMemcpyBatchAsync_v1), FN(impl_cuMemcpyBatchAsync_v1)},
    {"cuMemcpyBatchAsync", 13000, FN(impl_cuMemcpyBatchAsync_v2), FN(impl_cuMemcpyBatchAsync_v2)},
    {"cuMemsetD8", 3020, FN(impl_cuMemsetD8), FN(impl_cuMemsetD8)},
    {"cuMemsetD16", 3020, FN(impl_cuMemsetD16), FN(impl_cuMemsetD16)},
    {"cuMemsetD32", 3020, FN(impl_cuMemsetD32), FN(impl_cuMemsetD32)},
    {"cuMemsetD8Async", 3020, FN(impl_cuMemsetD8Async), FN(impl_cuMemsetD8Async)},
    {"cuMemsetD16Async", 3020, FN(impl_cuMemsetD16Async), FN(impl_cuMemsetD16Async)},
    {"cuMemsetD32Async", 3020, FN(impl_cuMemsetD32Async), FN(impl_cuMemsetD32Async)},
    {"cuMemsetD2D8", 3020, FN(impl_cuMemsetD2D8), FN(impl_cuMemsetD2D8)},
    {"cuMemsetD2D16", 3020, FN(impl_cuMemsetD2D16), FN(impl_cuMemsetD2D16)},
    {"cuMemsetD2D32", 3020, FN(impl_cuMemsetD2D32), FN(impl_cuMemsetD2D32)},
    {"cuMemsetD2D8Async", 3020, FN(impl_cuMemsetD2D8Async), FN(impl_cuMemsetD2D8Async)},
    {"cuMemsetD2D16Async", 3020, FN(impl_cuMemsetD2D16Async), FN(impl_cuMemsetD2D16Async)},
    {"cuMemsetD2D32Async", 3020, FN(impl_cuMemsetD2D32Async), FN(impl_cuMemsetD2D32Async)},
    {"cuMemPrefetchAsync", 8000, FN(impl_cuMemPrefetchAsync_v1), FN(impl_cuMemPrefetchAsync_v1)},
    {"cuMemPrefetchAsync", 12020, FN(impl_cuMemPrefetchAsync_v2), FN(impl_cuMemPrefetchAsync_v2)},
    {"cuMemAdvise", 8000, FN(impl_cuMemAdvise_v1), NULL},
    {"cuMemAdvise", 12020, FN(impl_cuMemAdvise_v2), NULL},
};
const size_t sim_nprocs_copies = sizeof sim_procs_copies / sizeof sim_procs_copies[0];

/* Exported names: the _v2 symbols, their _ptds/_ptsz twins (which behave the
 * same here: every stream is idle), and the batch call's two ABIs. */
#define WRAP(ret, name, impl, params, args) \
    EXPORT ret name params { return impl args; }

WRAP(CUresult, cuMemcpy, impl_cuMemcpy, (dptr_t d, dptr_t s, size_t n), (d, s, n))
WRAP(CUresult, cuMemcpy_ptds, impl_cuMemcpy, (dptr_t d, dptr_t s, size_t n), (d, s, n))
WRAP(CUresult, cuMemcpyAsync, impl_cuMemcpyAsync, (dptr_t d, dptr_t s, size_t n, CUstream st),
     (d, s, n, st))
WRAP(CUresult, cuMemcpyAsync_ptsz, impl_cuMemcpyAsync,
     (dptr_t d, dptr_t s, size_t n, CUstream st), (d, s, n, st))
WRAP(CUresult, cuMemcpyPeer, impl_cuMemcpyPeer,
     (dptr_t d, CUcontext dc, dptr_t s, CUcontext sc, size_t n), (d, dc, s, sc, n))
WRAP(CUresult, cuMemcpyPeerAsync, impl_cuMemcpyPeerAsync,
     (dptr_t d, CUcontext dc, dptr_t s, CUcontext sc, size_t n, CUstream st),
     (d, dc, s, sc, n, st))
WRAP(CUresult, cuMemcpyHtoD_v2, impl_cuMemcpyHtoD, (dptr_t d, const void *s, size_t n), (d, s, n))
WRAP(CUresult, cuMemcpyHtoD_v2_ptds, impl_cuMemcpyHtoD, (dptr_t d, const void *s, size_t n),
     (d, s, n))
WRAP(CUresult, cuMemcpyDtoH_v2, impl_cuMemcpyDtoH, (void *d, dptr_t s, size_t n), (d, s, n))
WRAP(CUresult, cuMemcpyDtoH_v2_ptds, impl_cuMemcpyDtoH, (void *d, dptr_t s, size_t n), (d, s, n))
WRAP(CUresult, cuMemcpyDtoD_v2, impl_cuMemcpyDtoD, (dptr_t d, dptr_t s, size_t n), (d, s, n))
WRAP(CUresult, cuMemcpyDtoD_v2_ptds, impl_cuMemcpyDtoD, (dptr_t d, dptr_t s, size_t n), (d, s, n))
WRAP(CUresult, cuMemcpyHtoDAsync_v2, impl_cuMemcpyHtoDAsync,
     (dptr_t d, const void *s, size_t n, CUstream st), (d, s, n, st))
WRAP(CUresult, cuMemcpyHtoDAsync_v2_ptsz, impl_cuMemcpyHtoDAsync,
     (dptr_t d, const void *s, size_t n, CUstream st), (d, s, n, st))
WRAP(CUresult, cuMemcpyDtoHAsync_v2, impl_cuMemcpyDtoHAsync,
     (void *d, dptr_t s, size_t n, CUstream st), (d, s, n, st))
WRAP(CUresult, cuMemcpyDtoHAsync_v2_ptsz, impl_cuMemcpyDtoHAsync,
     (void *d, dptr_t s, size_t n, CUstream st), (d, s, n, st))
WRAP(CUresult, cuMemcpyDtoDAsync_v2, impl_cuMemcpyDtoDAsync,
     (dptr_t d, dptr_t s, size_t n, CUstream st), (d, s, n, st))
WRAP(CUresult, cuMemcpyDtoDAsync_v2_ptsz, impl_cuMemcpyDtoDAsync,
     (dptr_t d, dptr_t s, size_t n, CUstream st), (d, s, n, st))
WRAP(CUresult, cuMemcpy2D_v2, impl_cuMemcpy2D, (const struct memcpy2d *c), (c))
WRAP(CUresult, cuMemcpy2DUnaligned_v2, impl_cuMemcpy2D, (const struct memcpy2d *c), (c))
WRAP(CUresult, cuMemcpy2DAsync_v2, impl_cuMemcpy2DAsync, (const struct memcpy2d *c, CUstream s),
     (c, s))
WRAP(CUresult, cuMemcpy3D_v2, impl_cuMemcpy3D, (const struct memcpy3d *c), (c))
WRAP(CUresult, cuMemcpy3DAsync_v2, impl_cuMemcpy3DAsync, (const struct memcpy3d *c, CUstream s),
     (c, s))
WRAP(CUresult, cuMemcpyBatchAsync, impl_cuMemcpyBatchAsync_v2,
     (dptr_t *d, dptr_t *s, size_t *n, size_t c, void *a, size_t *ai, size_t na, CUstream st),
     (d, s, n, c, a, ai, na, st))
WRAP(CUresult, cuMemcpyBatchAsync_v2, impl_cuMemcpyBatchAsync_v2,
     (dptr_t *d, dptr_t *s, size_t *n, size_t c, void *a, size_t *ai, size_t na, CUstream st),
     (d, s, n, c, a, ai, na, st))
WRAP(CUresult, cuMemsetD8_v2, impl_cuMemsetD8, (dptr_t d, unsigned char v, size_t n), (d, v, n))
WRAP(CUresult, cuMemsetD16_v2, impl_cuMemsetD16, (dptr_t d, unsigned short v, size_t n), (d, v, n))
WRAP(CUresult, cuMemsetD32_v2, impl_cuMemsetD32, (dptr_t d, unsigned v, size_t n), (d, v, n))
WRAP(CUresult, cuMemsetD8Async, impl_cuMemsetD8Async,
     (dptr_t d, unsigned char v, size_t n, CUstream s), (d, v, n, s))
WRAP(CUresult, cuMemsetD16Async, impl_cuMemsetD16Async,
     (dptr_t d, unsigned short v, size_t n, CUstream s), (d, v, n, s))
WRAP(CUresult, cuMemsetD32Async, impl_cuMemsetD32Async,
     (dptr_t d, unsigned v, size_t n, CUstream s), (d, v, n, s))
WRAP(CUresult, cuMemsetD2D8_v2, impl_cuMemsetD2D8,
     (dptr_t d, size_t p, unsigned char v, size_t w, size_t h), (d, p, v, w, h))
WRAP(CUresult, cuMemsetD2D16_v2, impl_cuMemsetD2D16,
     (dptr_t d, size_t p, unsigned short v, size_t w, size_t h), (d, p, v, w, h))
WRAP(CUresult, cuMemsetD2D32_v2, impl_cuMemsetD2D32,
     (dptr_t d, size_t p, unsigned v, size_t w, size_t h), (d, p, v, w, h))
WRAP(CUresult, cuMemsetD2D8Async, impl_cuMemsetD2D8Async,
     (dptr_t d, size_t p, unsigned char v, size_t w, size_t h, CUstream s), (d, p, v, w, h, s))
WRAP(CUresult, cuMemsetD2D16Async, impl_cuMemsetD2D16Async,
     (dptr_t d, size_t p, unsigned short v, size_t w, size_t h, CUstream s), (d, p, v, w, h, s))
WRAP(CUresult, cuMemsetD2D32Async, impl_cuMemsetD2D32Async,
     (dptr_t d, size_t p, unsigned v, size_t w, size_t h, CUstream s), (d, p, v, w, h, s))
WRAP(CUresult, cuMemPrefetchAsync, impl_cuMemPrefetchAsync_v1,
     (dptr_t d, size_t n, CUdevice dev, CUstream s), (d, n, dev, s))
WRAP(CUresult, cuMemPrefetchAsync_v2, impl_cuMemPrefetchAsync_v2,
     (dptr_t d, size_t n, CUmemLocation l, unsigned f, CUstream s), (d, n, l, f, s))
WRAP(CUresult, cuMemAdvise, impl_cuMemAdvise_v1, (dptr_t d, size_t n, int a, CUdevice dev),
     (d, n, a, dev))
WRAP(CUresult, cuMemAdvise_v2, impl_cuMemAdvise_v2, (dptr_t d, size_t n, int a, CUmemLocation l),
     (d, n, a, l))
