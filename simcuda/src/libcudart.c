/*
 * libcudart.so.12 from simcuda: the memory-management part of the CUDA 12.8
 * runtime API, layered on whatever libcuda.so.1 the dynamic linker finds.
 *
 * How it reaches the driver is the point of this file, because it is what
 * NVIDIA's runtime (11.3 and later) does and what a tracer must follow: on
 * first use it dlopens libcuda.so.1, calls the global dlsym once, for
 * cuGetProcAddress_v2, and resolves every driver function it needs through
 * that by base name and CUDART_VERSION -- the per-thread-default-stream
 * variants by asking with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.  It
 * never links against libcuda and never looks up a driver export by name.
 * So an LD_PRELOAD tracer sees the runtime's driver calls only if it follows
 * dlsym -> cuGetProcAddress -> the pointers that returns.
 *
 * Runtime state is what the real runtime keeps per thread: the current
 * device (default 0) and the last error.  The first call that needs a
 * context retains the device's primary context and makes it current.
 */
#define _GNU_SOURCE
#define SIMCUDA_NO_V2_MACROS
#include "cuda.h"
#include "cuda_runtime.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 64

/* The driver functions the runtime uses, filled in through cuGetProcAddress. */
struct driver_api {
    CUresult (*init)(unsigned int);
    CUresult (*driverGetVersion)(int *);
    CUresult (*deviceGetCount)(int *);
    CUresult (*primaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*primaryCtxReset)(CUdevice);
    CUresult (*ctxGetCurrent)(CUcontext *);
    CUresult (*ctxSetCurrent)(CUcontext);
    CUresult (*ctxSynchronize)(void);
    CUresult (*memAlloc)(CUdeviceptr *, size_t);
    CUresult (*memFree)(CUdeviceptr);
    CUresult (*memAllocManaged)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*memAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*memAllocHost)(void **, size_t);
    CUresult (*memHostAlloc)(void **, size_t, unsigned int);
    CUresult (*memFreeHost)(void *);
    CUresult (*memGetInfo)(size_t *, size_t *);
    CUresult (*memAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*memAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*memFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*memFreeAsync_ptsz)(CUdeviceptr, CUstream);
    CUresult (*memAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*memAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*deviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*deviceGetMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*deviceSetMemPool)(CUdevice, CUmemoryPool);
    CUresult (*memPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*memPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*memPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*streamCreate)(CUstream *, unsigned int);
    CUresult (*streamDestroy)(CUstream);
    CUresult (*streamSynchronize)(CUstream);
    CUresult (*streamBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*streamBeginCapture_ptsz)(CUstream, CUstreamCaptureMode);
    CUresult (*streamEndCapture)(CUstream, CUgraph *);
    CUresult (*streamEndCapture_ptsz)(CUstream, CUgraph *);
    CUresult (*streamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*streamIsCapturing_ptsz)(CUstream, CUstreamCaptureStatus *);
    CUresult (*threadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
    CUresult (*graphDestroy)(CUgraph);
};

#define SYM(name, field) {name, offsetof(struct driver_api, field), 0}
#define SYM_PTSZ(name, field) {name, offsetof(struct driver_api, field), 1}

static const struct {
    const char *name; /* base name: the driver picks the ABI version */
    size_t offset;
    int per_thread;
} k_driver_syms[] = {
    SYM("cuInit", init),
    SYM("cuDriverGetVersion", driverGetVersion),
    SYM("cuDeviceGetCount", deviceGetCount),
    SYM("cuDevicePrimaryCtxRetain", primaryCtxRetain),
    SYM("cuDevicePrimaryCtxReset", primaryCtxReset),
    SYM("cuCtxGetCurrent", ctxGetCurrent),
    SYM("cuCtxSetCurrent", ctxSetCurrent),
    SYM("cuCtxSynchronize", ctxSynchronize),
    SYM("cuMemAlloc", memAlloc),
    SYM("cuMemFree", memFree),
    SYM("cuMemAllocManaged", memAllocManaged),
    SYM("cuMemAllocPitch", memAllocPitch),
    SYM("cuMemAllocHost", memAllocHost),
    SYM("cuMemHostAlloc", memHostAlloc),
    SYM("cuMemFreeHost", memFreeHost),
    SYM("cuMemGetInfo", memGetInfo),
    SYM("cuMemAllocAsync", memAllocAsync),
    SYM_PTSZ("cuMemAllocAsync", memAllocAsync_ptsz),
    SYM("cuMemFreeAsync", memFreeAsync),
    SYM_PTSZ("cuMemFreeAsync", memFreeAsync_ptsz),
    SYM("cuMemAllocFromPoolAsync", memAllocFromPoolAsync),
    SYM_PTSZ("cuMemAllocFromPoolAsync", memAllocFromPoolAsync_ptsz),
    SYM("cuDeviceGetDefaultMemPool", deviceGetDefaultMemPool),
    SYM("cuDeviceGetMemPool", deviceGetMemPool),
    SYM("cuDeviceSetMemPool", deviceSetMemPool),
    SYM("cuMemPoolTrimTo", memPoolTrimTo),
    SYM("cuMemPoolGetAttribute", memPoolGetAttribute),
    SYM("cuMemPoolSetAttribute", memPoolSetAttribute),
    SYM("cuStreamCreate", streamCreate),
    SYM("cuStreamDestroy", streamDestroy),
    SYM("cuStreamSynchronize", streamSynchronize),
    SYM("cuStreamBeginCapture", streamBeginCapture), /* 12080: the _v2 ABI, with a mode */
    SYM_PTSZ("cuStreamBeginCapture", streamBeginCapture_ptsz),
    SYM("cuStreamEndCapture", streamEndCapture),
    SYM_PTSZ("cuStreamEndCapture", streamEndCapture_ptsz),
    SYM("cuStreamIsCapturing", streamIsCapturing),
    SYM_PTSZ("cuStreamIsCapturing", streamIsCapturing_ptsz),
    SYM("cuThreadExchangeStreamCaptureMode", threadExchangeStreamCaptureMode),
    SYM("cuGraphDestroy", graphDestroy),
};

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static struct driver_api drv;
static gpa_fn g_gpa; /* set once the driver is loaded, even if cuInit then fails */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cudaError_t g_init_error;
static int g_device_count;

static pthread_mutex_t g_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext g_primary[MAX_DEVICES]; /* retained once per device, kept for the process */

static __thread int tls_device;
static __thread cudaError_t tls_last_error;

/* ---- Errors ------------------------------------------------------------- */

static const struct {
    CUresult drv;
    cudaError_t rt;
} k_error_map[] = {
    {CUDA_SUCCESS, cudaSuccess},
    {CUDA_ERROR_INVALID_VALUE, cudaErrorInvalidValue},
    {CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation},
    {CUDA_ERROR_NOT_INITIALIZED, cudaErrorInitializationError},
    {CUDA_ERROR_DEINITIALIZED, cudaErrorCudartUnloading},
    {CUDA_ERROR_STUB_LIBRARY, cudaErrorStubLibrary},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, cudaErrorDevicesUnavailable},
    {CUDA_ERROR_NO_DEVICE, cudaErrorNoDevice},
    {CUDA_ERROR_INVALID_DEVICE, cudaErrorInvalidDevice},
    {CUDA_ERROR_INVALID_CONTEXT, cudaErrorDeviceUninitialized},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, cudaErrorContextIsDestroyed},
    {CUDA_ERROR_ALREADY_MAPPED, cudaErrorAlreadyMapped},
    {CUDA_ERROR_NOT_MAPPED, cudaErrorNotMapped},
    {CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, cudaErrorUnsupportedExecAffinity},
    {CUDA_ERROR_FILE_NOT_FOUND, cudaErrorFileNotFound},
    {CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, cudaErrorSharedObjectSymbolNotFound},
    {CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, cudaErrorSharedObjectInitFailed},
    {CUDA_ERROR_OPERATING_SYSTEM, cudaErrorOperatingSystem},
    {CUDA_ERROR_INVALID_HANDLE, cudaErrorInvalidResourceHandle},
    {CUDA_ERROR_ILLEGAL_STATE, cudaErrorIllegalState},
    {CUDA_ERROR_NOT_FOUND, cudaErrorSymbolNotFound},
    {CUDA_ERROR_NOT_READY, cudaErrorNotReady},
    {CUDA_ERROR_ILLEGAL_ADDRESS, cudaErrorIllegalAddress},
    {CUDA_ERROR_NOT_PERMITTED, cudaErrorNotPermitted},
    {CUDA_ERROR_NOT_SUPPORTED, cudaErrorNotSupported},
    {CUDA_ERROR_SYSTEM_NOT_READY, cudaErrorSystemNotReady},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, cudaErrorSystemDriverMismatch},
    {CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, cudaErrorCompatNotSupportedOnDevice},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cudaErrorStreamCaptureUnsupported},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cudaErrorStreamCaptureInvalidated},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, cudaErrorStreamCaptureMerge},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, cudaErrorStreamCaptureUnmatched},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, cudaErrorStreamCaptureUnjoined},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, cudaErrorStreamCaptureIsolation},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, cudaErrorStreamCaptureImplicit},
    {CUDA_ERROR_CAPTURED_EVENT, cudaErrorCapturedEvent},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, cudaErrorStreamCaptureWrongThread},
    {CUDA_ERROR_TIMEOUT, cudaErrorTimeout},
    {CUDA_ERROR_UNKNOWN, cudaErrorUnknown},
};

static cudaError_t map_error(CUresult r)
{
    for (size_t i = 0; i < sizeof k_error_map / sizeof k_error_map[0]; i++)
        if (k_error_map[i].drv == r)
            return k_error_map[i].rt;
    return cudaErrorUnknown;
}

/* Every runtime call reports through here: a failure becomes the thread's
 * last error until cudaGetLastError reads it. */
static cudaError_t record(cudaError_t e)
{
    if (e != cudaSuccess)
        tls_last_error = e;
    return e;
}

#define RETURN_IF(e)               \
    do {                           \
        cudaError_t ret_e_ = (e);  \
        if (ret_e_ != cudaSuccess) \
            return record(ret_e_); \
    } while (0)

static const struct {
    cudaError_t code;
    const char *name, *text;
} k_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorProfilerDisabled, "cudaErrorProfilerDisabled", "profiler disabled"},
    {cudaErrorProfilerNotInitialized, "cudaErrorProfilerNotInitialized", "profiler not initialized"},
    {cudaErrorProfilerAlreadyStarted, "cudaErrorProfilerAlreadyStarted", "profiler already started"},
    {cudaErrorProfilerAlreadyStopped, "cudaErrorProfilerAlreadyStopped", "profiler already stopped"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid symbol"},
    {cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidTexture, "cudaErrorInvalidTexture", "invalid texture"},
    {cudaErrorInvalidTextureBinding, "cudaErrorInvalidTextureBinding", "invalid texture binding"},
    {cudaErrorInvalidChannelDescriptor, "cudaErrorInvalidChannelDescriptor", "invalid channel descriptor"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid memcpy direction"},
    {cudaErrorAddressOfConstant, "cudaErrorAddressOfConstant", "address of constant"},
    {cudaErrorTextureFetchFailed, "cudaErrorTextureFetchFailed", "texture fetch failed"},
    {cudaErrorTextureNotBound, "cudaErrorTextureNotBound", "texture not bound"},
    {cudaErrorSynchronizationError, "cudaErrorSynchronizationError", "synchronization error"},
    {cudaErrorInvalidFilterSetting, "cudaErrorInvalidFilterSetting", "invalid filter setting"},
    {cudaErrorInvalidNormSetting, "cudaErrorInvalidNormSetting", "invalid norm setting"},
    {cudaErrorMixedDeviceExecution, "cudaErrorMixedDeviceExecution", "mixed device execution"},
    {cudaErrorNotYetImplemented, "cudaErrorNotYetImplemented", "not yet implemented"},
    {cudaErrorMemoryValueTooLarge, "cudaErrorMemoryValueTooLarge", "memory value too large"},
    {cudaErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorCallRequiresNewerDriver, "cudaErrorCallRequiresNewerDriver", "API call is not supported in the installed CUDA driver"},
    {cudaErrorInvalidSurface, "cudaErrorInvalidSurface", "invalid surface"},
    {cudaErrorDuplicateVariableName, "cudaErrorDuplicateVariableName", "duplicate variable name"},
    {cudaErrorDuplicateTextureName, "cudaErrorDuplicateTextureName", "duplicate texture name"},
    {cudaErrorDuplicateSurfaceName, "cudaErrorDuplicateSurfaceName", "duplicate surface name"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable", "devices unavailable"},
    {cudaErrorIncompatibleDriverContext, "cudaErrorIncompatibleDriverContext", "incompatible driver context"},
    {cudaErrorMissingConfiguration, "cudaErrorMissingConfiguration", "missing configuration"},
    {cudaErrorPriorLaunchFailure, "cudaErrorPriorLaunchFailure", "prior launch failure"},
    {cudaErrorLaunchMaxDepthExceeded, "cudaErrorLaunchMaxDepthExceeded", "launch max depth exceeded"},
    {cudaErrorLaunchFileScopedTex, "cudaErrorLaunchFileScopedTex", "launch file scoped tex"},
    {cudaErrorLaunchFileScopedSurf, "cudaErrorLaunchFileScopedSurf", "launch file scoped surf"},
    {cudaErrorSyncDepthExceeded, "cudaErrorSyncDepthExceeded", "sync depth exceeded"},
    {cudaErrorLaunchPendingCountExceeded, "cudaErrorLaunchPendingCountExceeded", "launch pending count exceeded"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceNotLicensed, "cudaErrorDeviceNotLicensed", "device not licensed"},
    {cudaErrorSoftwareValidityNotEstablished, "cudaErrorSoftwareValidityNotEstablished", "software validity not established"},
    {cudaErrorStartupFailure, "cudaErrorStartupFailure", "startup failure"},
    {cudaErrorInvalidKernelImage, "cudaErrorInvalidKernelImage", "invalid kernel image"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed", "map buffer object failed"},
    {cudaErrorUnmapBufferObjectFailed, "cudaErrorUnmapBufferObjectFailed", "unmap buffer object failed"},
    {cudaErrorArrayIsMapped, "cudaErrorArrayIsMapped", "array is mapped"},
    {cudaErrorAlreadyMapped, "cudaErrorAlreadyMapped", "resource already mapped"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice", "no kernel image for device"},
    {cudaErrorAlreadyAcquired, "cudaErrorAlreadyAcquired", "already acquired"},
    {cudaErrorNotMapped, "cudaErrorNotMapped", "resource not mapped"},
    {cudaErrorNotMappedAsArray, "cudaErrorNotMappedAsArray", "not mapped as array"},
    {cudaErrorNotMappedAsPointer, "cudaErrorNotMappedAsPointer", "not mapped as pointer"},
    {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable", "uncorrectable ECC error encountered"},
    {cudaErrorUnsupportedLimit, "cudaErrorUnsupportedLimit", "unsupported limit"},
    {cudaErrorDeviceAlreadyInUse, "cudaErrorDeviceAlreadyInUse", "device already in use"},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported", "peer access unsupported"},
    {cudaErrorInvalidPtx, "cudaErrorInvalidPtx", "invalid ptx"},
    {cudaErrorInvalidGraphicsContext, "cudaErrorInvalidGraphicsContext", "invalid graphics context"},
    {cudaErrorNvlinkUncorrectable, "cudaErrorNvlinkUncorrectable", "nvlink uncorrectable"},
    {cudaErrorJitCompilerNotFound, "cudaErrorJitCompilerNotFound", "jit compiler not found"},
    {cudaErrorUnsupportedPtxVersion, "cudaErrorUnsupportedPtxVersion", "unsupported ptx version"},
    {cudaErrorJitCompilationDisabled, "cudaErrorJitCompilationDisabled", "jit compilation disabled"},
    {cudaErrorUnsupportedExecAffinity, "cudaErrorUnsupportedExecAffinity", "the provided execution affinity is not supported"},
    {cudaErrorUnsupportedDevSideSync, "cudaErrorUnsupportedDevSideSync", "unsupported dev side sync"},
    {cudaErrorContained, "cudaErrorContained", "contained"},
    {cudaErrorInvalidSource, "cudaErrorInvalidSource", "invalid source"},
    {cudaErrorFileNotFound, "cudaErrorFileNotFound", "file not found"},
    {cudaErrorSharedObjectSymbolNotFound, "cudaErrorSharedObjectSymbolNotFound", "shared object symbol not found"},
    {cudaErrorSharedObjectInitFailed, "cudaErrorSharedObjectInitFailed", "shared object init failed"},
    {cudaErrorOperatingSystem, "cudaErrorOperatingSystem", "operating system"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorLossyQuery, "cudaErrorLossyQuery", "lossy query"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "launch out of resources"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "launch timeout"},
    {cudaErrorLaunchIncompatibleTexturing, "cudaErrorLaunchIncompatibleTexturing", "launch incompatible texturing"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled", "peer access already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access not enabled"},
    {cudaErrorSetOnActiveProcess, "cudaErrorSetOnActiveProcess", "set on active process"},
    {cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {cudaErrorAssert, "cudaErrorAssert", "assert"},
    {cudaErrorTooManyPeers, "cudaErrorTooManyPeers", "too many peers"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered", "host memory already registered"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered", "host memory not registered"},
    {cudaErrorHardwareStackError, "cudaErrorHardwareStackError", "hardware stack error"},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction", "illegal instruction"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorInvalidAddressSpace, "cudaErrorInvalidAddressSpace", "invalid address space"},
    {cudaErrorInvalidPc, "cudaErrorInvalidPc", "invalid pc"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "launch failure"},
    {cudaErrorCooperativeLaunchTooLarge, "cudaErrorCooperativeLaunchTooLarge", "cooperative launch too large"},
    {cudaErrorTensorMemoryLeak, "cudaErrorTensorMemoryLeak", "tensor memory leak"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorSystemNotReady, "cudaErrorSystemNotReady", "system not ready"},
    {cudaErrorSystemDriverMismatch, "cudaErrorSystemDriverMismatch", "system driver mismatch"},
    {cudaErrorCompatNotSupportedOnDevice, "cudaErrorCompatNotSupportedOnDevice", "compat not supported on device"},
    {cudaErrorMpsConnectionFailed, "cudaErrorMpsConnectionFailed", "mps connection failed"},
    {cudaErrorMpsRpcFailure, "cudaErrorMpsRpcFailure", "mps rpc failure"},
    {cudaErrorMpsServerNotReady, "cudaErrorMpsServerNotReady", "mps server not ready"},
    {cudaErrorMpsMaxClientsReached, "cudaErrorMpsMaxClientsReached", "mps max clients reached"},
    {cudaErrorMpsMaxConnectionsReached, "cudaErrorMpsMaxConnectionsReached", "mps max connections reached"},
    {cudaErrorMpsClientTerminated, "cudaErrorMpsClientTerminated", "mps client terminated"},
    {cudaErrorCdpNotSupported, "cudaErrorCdpNotSupported", "cdp not supported"},
    {cudaErrorCdpVersionMismatch, "cudaErrorCdpVersionMismatch", "cdp version mismatch"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "stream capture unsupported"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "stream capture invalidated"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge", "stream capture merge"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "stream capture unmatched"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "stream capture unjoined"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "stream capture isolation"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "stream capture implicit"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent", "captured event"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread", "stream capture wrong thread"},
    {cudaErrorTimeout, "cudaErrorTimeout", "timeout"},
    {cudaErrorGraphExecUpdateFailure, "cudaErrorGraphExecUpdateFailure", "graph exec update failure"},
    {cudaErrorExternalDevice, "cudaErrorExternalDevice", "external device"},
    {cudaErrorInvalidClusterSize, "cudaErrorInvalidClusterSize", "invalid cluster size"},
    {cudaErrorFunctionNotLoaded, "cudaErrorFunctionNotLoaded", "function not loaded"},
    {cudaErrorInvalidResourceType, "cudaErrorInvalidResourceType", "invalid resource type"},
    {cudaErrorInvalidResourceConfiguration, "cudaErrorInvalidResourceConfiguration", "invalid resource configuration"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
    {cudaErrorApiFailureBase, "cudaErrorApiFailureBase", "api failure base"},
};

static const char *error_text(cudaError_t e, int want_name)
{
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
        if (k_errors[i].code == e)
            return want_name ? k_errors[i].name : k_errors[i].text;
    return "unrecognized error code";
}

EXPORT const char *cudaGetErrorString(cudaError_t error) { return error_text(error, 0); }
EXPORT const char *cudaGetErrorName(cudaError_t error) { return error_text(error, 1); }

EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = tls_last_error;
    tls_last_error = cudaSuccess;
    return e;
}

EXPORT cudaError_t cudaPeekAtLastError(void) { return tls_last_error; }

/* ---- Reaching the driver --------------------------------------------------- */

static void load_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        g_init_error = cudaErrorInsufficientDriver;
        return;
    }
    /* The one name lookup, through the global dlsym so that an interposed
     * dlsym sees it. */
    void *gpa = dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) {
        g_init_error = cudaErrorInsufficientDriver;
        return;
    }
    memcpy(&g_gpa, &gpa, sizeof gpa);
    for (size_t i = 0; i < sizeof k_driver_syms / sizeof k_driver_syms[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        cuuint64_t flags = k_driver_syms[i].per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                                       : CU_GET_PROC_ADDRESS_DEFAULT;
        CUresult r = g_gpa(k_driver_syms[i].name, &fn, CUDART_VERSION, flags, &status);
        if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
            g_init_error = cudaErrorInsufficientDriver;
            return;
        }
        memcpy((char *)&drv + k_driver_syms[i].offset, &fn, sizeof fn);
    }
    CUresult r = drv.init(0);
    if (r == CUDA_SUCCESS)
        r = drv.deviceGetCount(&g_device_count);
    if (r == CUDA_SUCCESS && g_device_count > MAX_DEVICES)
        g_device_count = MAX_DEVICES;
    g_init_error = map_error(r);
}

static cudaError_t lazy_init(void)
{
    pthread_once(&g_once, load_driver);
    return g_init_error;
}

static int is_runtime_primary(CUcontext c)
{
    int found = 0;
    pthread_mutex_lock(&g_ctx_lock);
    for (int d = 0; d < g_device_count && !found; d++)
        found = g_primary[d] == c;
    pthread_mutex_unlock(&g_ctx_lock);
    return found;
}

/* Makes sure the calling thread has a context.  A context the application
 * made current through the driver API is used as is (unless `force`, which
 * is cudaSetDevice's "bind this device's primary context"); otherwise the
 * current device's primary context, retained on first use, is made current. */
static cudaError_t bind_context(int force)
{
    RETURN_IF(lazy_init());
    int dev = tls_device;
    pthread_mutex_lock(&g_ctx_lock);
    CUresult r = CUDA_SUCCESS;
    if (!g_primary[dev])
        r = drv.primaryCtxRetain(&g_primary[dev], dev);
    CUcontext want = g_primary[dev];
    pthread_mutex_unlock(&g_ctx_lock);
    RETURN_IF(map_error(r));
    CUcontext cur = NULL;
    RETURN_IF(map_error(drv.ctxGetCurrent(&cur)));
    if (cur == want || (cur && !force && !is_runtime_primary(cur)))
        return cudaSuccess;
    return record(map_error(drv.ctxSetCurrent(want)));
}

static cudaError_t call(CUresult r) { return record(map_error(r)); }

/* ---- Versions, devices --------------------------------------------------------- */

EXPORT cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return record(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return record(cudaErrorInvalidValue);
    lazy_init();
    if (!g_gpa) { /* no driver installed: the documented answer is 0 */
        *driverVersion = 0;
        return cudaSuccess;
    }
    if (!drv.driverGetVersion)
        return record(cudaErrorInsufficientDriver);
    return call(drv.driverGetVersion(driverVersion));
}

EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return record(cudaErrorInvalidValue);
    cudaError_t e = lazy_init();
    *count = e == cudaSuccess ? g_device_count : 0;
    return record(e);
}

EXPORT cudaError_t cudaSetDevice(int device)
{
    RETURN_IF(lazy_init());
    if (device < 0 || device >= g_device_count)
        return record(cudaErrorInvalidDevice);
    tls_device = device;
    return bind_context(1); /* since CUDA 12 this initializes the device */
}

EXPORT cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return record(cudaErrorInvalidValue);
    RETURN_IF(lazy_init());
    *device = tls_device;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    RETURN_IF(bind_context(0));
    return call(drv.ctxSynchronize());
}

EXPORT cudaError_t cudaDeviceReset(void)
{
    RETURN_IF(lazy_init());
    return call(drv.primaryCtxReset(tls_device));
}

/* ---- Memory ------------------------------------------------------------------ */

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return record(cudaErrorInvalidValue);
    RETURN_IF(bind_context(0));
    if (size == 0) { /* the real runtime succeeds without allocating */
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    RETURN_IF(map_error(drv.memAlloc(&d, size)));
    *devPtr = (void *)(uintptr_t)d;
    return cudaSuccess;
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
    RETURN_IF(bind_context(0)); /* cudaFree(NULL) is the idiom for "initialize" */
    if (!devPtr)
        return cudaSuccess;
    return call(drv.memFree((CUdeviceptr)(uintptr_t)devPtr));
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (!devPtr || size == 0)
        return record(cudaErrorInvalidValue);
    RETURN_IF(bind_context(0));
    CUdeviceptr d = 0;
    RETURN_IF(map_error(drv.memAllocManaged(&d, size, flags)));
    *devPtr = (void *)(uintptr_t)d;
    return cudaSuccess;
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    if (!devPtr || !pitch)
        return record(cudaErrorInvalidValue);
    RETURN_IF(bind_context(0));
    CUdeviceptr d = 0;
    RETURN_IF(map_error(drv.memAllocPitch(&d, pitch, width, height, 16)));
    *devPtr = (void *)(uintptr_t)d;
    return cudaSuccess;
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    if (!ptr)
        return record(cudaErrorInvalidValue);
    RETURN_IF(bind_context(0));
    return call(drv.memAllocHost(ptr, size));
}

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    if (!pHost)
        return record(cudaErrorInvalidValue);
    RETURN_IF(bind_context(0));
    return call(drv.memHostAlloc(pHost, size, flags)); /* same flag values */
}

EXPORT cudaError_t cudaFreeHost(void *ptr)
{
    RETURN_IF(bind_context(0));
    if (!ptr)
        return cudaSuccess;
    return call(drv.memFreeHost(ptr));
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    RETURN_IF(bind_context(0));
    return call(drv.memGetInfo(free, total));
}

/* ---- Streams ------------------------------------------------------------------- */

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    if (!pStream)
        return record(cudaErrorInvalidValue);
    RETURN_IF(bind_context(0));
    return call(drv.streamCreate(pStream, flags));
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    RETURN_IF(bind_context(0));
    return call(drv.streamDestroy(stream));
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    RETURN_IF(bind_context(0));
    return call(drv.streamSynchronize(stream));
}

/* ---- Stream capture ------------------------------------------------------------------
 * All in the driver (its rules, and where simcuda's differ, are described in
 * driver/streams.c); the runtime's enums share the driver's values. */

EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    RETURN_IF(bind_context(0));
    return call(drv.streamBeginCapture(stream, (CUstreamCaptureMode)mode));
}

EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    RETURN_IF(bind_context(0));
    return call(drv.streamBeginCapture_ptsz(stream, (CUstreamCaptureMode)mode));
}

EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    RETURN_IF(bind_context(0));
    return call(drv.streamEndCapture(stream, pGraph));
}

EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
    RETURN_IF(bind_context(0));
    return call(drv.streamEndCapture_ptsz(stream, pGraph));
}

EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
    RETURN_IF(bind_context(0));
    return call(drv.streamIsCapturing(stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

EXPORT cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                              enum cudaStreamCaptureStatus *pCaptureStatus)
{
    RETURN_IF(bind_context(0));
    return call(drv.streamIsCapturing_ptsz(stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    RETURN_IF(lazy_init());
    return call(drv.threadExchangeStreamCaptureMode((CUstreamCaptureMode *)mode));
}

EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    RETURN_IF(lazy_init());
    return call(drv.graphDestroy(graph));
}

/* ---- Stream-ordered allocator ------------------------------------------------------ */

static cudaError_t malloc_async(void **devPtr, size_t size, cudaStream_t stream,
                                CUresult (*fn)(CUdeviceptr *, size_t, CUstream))
{
    if (!devPtr)
        return record(cudaErrorInvalidValue);
    RETURN_IF(bind_context(0));
    CUdeviceptr d = 0;
    RETURN_IF(map_error(fn(&d, size, stream)));
    *devPtr = (void *)(uintptr_t)d;
    return cudaSuccess;
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    RETURN_IF(lazy_init());
    return malloc_async(devPtr, size, hStream, drv.memAllocAsync);
}

EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
    RETURN_IF(lazy_init());
    return malloc_async(devPtr, size, hStream, drv.memAllocAsync_ptsz);
}

static cudaError_t free_async(void *devPtr, cudaStream_t stream, CUresult (*fn)(CUdeviceptr, CUstream))
{
    RETURN_IF(bind_context(0));
    return call(fn((CUdeviceptr)(uintptr_t)devPtr, stream));
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    RETURN_IF(lazy_init());
    return free_async(devPtr, hStream, drv.memFreeAsync);
}

EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
    RETURN_IF(lazy_init());
    return free_async(devPtr, hStream, drv.memFreeAsync_ptsz);
}

static cudaError_t malloc_from_pool(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream,
                                    CUresult (*fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream))
{
    if (!ptr)
        return record(cudaErrorInvalidValue);
    RETURN_IF(bind_context(0));
    CUdeviceptr d = 0;
    RETURN_IF(map_error(fn(&d, size, pool, stream)));
    *ptr = (void *)(uintptr_t)d;
    return cudaSuccess;
}

EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                           cudaStream_t stream)
{
    RETURN_IF(lazy_init());
    return malloc_from_pool(ptr, size, memPool, stream, drv.memAllocFromPoolAsync);
}

EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                cudaStream_t stream)
{
    RETURN_IF(lazy_init());
    return malloc_from_pool(ptr, size, memPool, stream, drv.memAllocFromPoolAsync_ptsz);
}

EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    RETURN_IF(lazy_init());
    return call(drv.deviceGetDefaultMemPool(memPool, device));
}

EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
    RETURN_IF(lazy_init());
    return call(drv.deviceGetMemPool(memPool, device));
}

EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool)
{
    RETURN_IF(lazy_init());
    return call(drv.deviceSetMemPool(device, memPool));
}

EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
    RETURN_IF(lazy_init());
    return call(drv.memPoolTrimTo(memPool, minBytesToKeep));
}

/* cudaMemPoolAttr and CUmemPool_attribute share their values. */
EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value)
{
    RETURN_IF(lazy_init());
    return call(drv.memPoolGetAttribute(memPool, (CUmemPool_attribute)attr, value));
}

EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value)
{
    RETURN_IF(lazy_init());
    return call(drv.memPoolSetAttribute(memPool, (CUmemPool_attribute)attr, value));
}

/* ---- Driver entry points ---------------------------------------------------------
 * All four go through the driver's cuGetProcAddress_v2.  The _ptsz exports
 * are what code built with per-thread default streams calls; for them
 * cudaEnableDefault means the per-thread variants. */

static cudaError_t entry_point(const char *symbol, void **funcPtr, unsigned long long cudaVersion,
                               unsigned long long flags, enum cudaDriverEntryPointQueryResult *status,
                               int per_thread_build)
{
    if (!symbol || !funcPtr || cudaVersion > INT_MAX)
        return record(cudaErrorInvalidValue);
    RETURN_IF(lazy_init());
    cuuint64_t cu_flags;
    switch (flags) {
    case cudaEnableDefault:
        cu_flags = per_thread_build ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                    : CU_GET_PROC_ADDRESS_DEFAULT;
        break;
    case cudaEnableLegacyStream:
        cu_flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
        break;
    case cudaEnablePerThreadDefaultStream:
        cu_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        break;
    default:
        return record(cudaErrorInvalidValue);
    }
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = g_gpa(symbol, funcPtr, (int)cudaVersion, cu_flags, &st);
    if (status && (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_FOUND)) {
        switch (st) {
        case CU_GET_PROC_ADDRESS_SUCCESS:
            *status = cudaDriverEntryPointSuccess;
            break;
        case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT:
            *status = cudaDriverEntryPointVersionNotSufficent;
            break;
        default:
            *status = cudaDriverEntryPointSymbolNotFound;
            break;
        }
    }
    return call(r);
}

EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                           enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, 0);
}

EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
                                                unsigned long long flags,
                                                enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, 1);
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                                    unsigned int cudaVersion, unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, 0);
}

EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                         unsigned int cudaVersion,
                                                         unsigned long long flags,
                                                         enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, 1);
}
