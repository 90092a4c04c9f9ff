/*
 * macros: compiled against cuda.h with its default name mapping, as an
 * application would be.  Unversioned names must land on the current ABI
 * (cuMemAlloc -> cuMemAlloc_v2, cuGetProcAddress -> cuGetProcAddress_v2);
 * the legacy exports would fail with CUDA_ERROR_NOT_SUPPORTED.
 */
#define _GNU_SOURCE
#include "cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define OK(call)                                                            \
    do {                                                                    \
        CUresult r_ = (call);                                               \
        if (r_ != CUDA_SUCCESS) {                                           \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #call, (int)r_); \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

int main(void)
{
    CUdevice dev;
    CUcontext ctx, popped;
    CUdeviceptr p, base;
    size_t free_bytes, total, size, pitch;
    void *host, *fn;
    CUstream stream;
    CUdriverProcAddressQueryResult status;
    CUstreamCaptureStatus capturing;
    CUgraph graph;

    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuDeviceTotalMem(&total, dev));
    OK(cuCtxCreate(&ctx, 0, dev));
    OK(cuMemAlloc(&p, 1024));
    OK(cuMemGetAddressRange(&base, &size, p));
    OK(cuMemFree(p));
    OK(cuMemAllocPitch(&p, &pitch, 100, 4, 4));
    OK(cuMemFree(p));
    OK(cuMemGetInfo(&free_bytes, &total));
    OK(cuMemAllocHost(&host, 100));
    OK(cuMemFreeHost(host));
    OK(cuStreamCreate(&stream, 0));
    OK(cuMemAllocAsync(&p, 100, stream));
    OK(cuMemFreeAsync(p, stream));
    OK(cuStreamSynchronize(stream));
    OK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED)); /* the _v2 ABI */
    OK(cuStreamIsCapturing(stream, &capturing));
    OK(cuStreamEndCapture(stream, &graph));
    OK(cuGraphDestroy(graph));
    OK(cuStreamDestroy(stream));
    OK(cuGetProcAddress("cuMemAlloc", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    OK(cuCtxPopCurrent(&popped));
    OK(cuCtxPushCurrent(popped));
    OK(cuCtxDestroy(ctx));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuDevicePrimaryCtxRelease(dev));

    /* Which export does this build's cuMemAllocAsync name? */
    void *ptsz = dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz");
    printf("ptds=%d\n", (void *)&cuMemAllocAsync == ptsz);
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
    void *begin = dlsym(RTLD_DEFAULT, "cuStreamBeginCapture_v2_ptsz");
#else
    void *begin = dlsym(RTLD_DEFAULT, "cuStreamBeginCapture_v2");
#endif
    if ((void *)&cuStreamBeginCapture != begin) {
        fprintf(stderr, "cuStreamBeginCapture names the wrong export\n");
        exit(1);
    }
    printf("ok\n");
    return 0;
}
