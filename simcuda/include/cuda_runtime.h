/*
 * cuda_runtime.h -- simcuda's subset of NVIDIA's CUDA runtime API header
 * (CUDA 12.8): the memory-management calls that libcudart.so.12 from simcuda
 * exports, with the real enum values and handle types.
 *
 * Define CUDA_API_PER_THREAD_DEFAULT_STREAM to route the stream-ordered calls
 * and cudaGetDriverEntryPoint* to their _ptsz exports, as nvcc
 * --default-stream per-thread does.
 */
#ifndef SIMCUDA_CUDA_RUNTIME_H
#define SIMCUDA_CUDA_RUNTIME_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDART_VERSION 12080

#ifndef CUDARTAPI
#define CUDARTAPI
#endif

enum cudaError {
    cudaSuccess                             = 0,
    cudaErrorInvalidValue                   = 1,
    cudaErrorMemoryAllocation               = 2,
    cudaErrorInitializationError            = 3,
    cudaErrorCudartUnloading                = 4,
    cudaErrorProfilerDisabled               = 5,
    cudaErrorProfilerNotInitialized         = 6,
    cudaErrorProfilerAlreadyStarted         = 7,
    cudaErrorProfilerAlreadyStopped         = 8,
    cudaErrorInvalidConfiguration           = 9,
    cudaErrorInvalidPitchValue              = 12,
    cudaErrorInvalidSymbol                  = 13,
    cudaErrorInvalidHostPointer             = 16,
    cudaErrorInvalidDevicePointer           = 17,
    cudaErrorInvalidTexture                 = 18,
    cudaErrorInvalidTextureBinding          = 19,
    cudaErrorInvalidChannelDescriptor       = 20,
    cudaErrorInvalidMemcpyDirection         = 21,
    cudaErrorAddressOfConstant              = 22,
    cudaErrorTextureFetchFailed             = 23,
    cudaErrorTextureNotBound                = 24,
    cudaErrorSynchronizationError           = 25,
    cudaErrorInvalidFilterSetting           = 26,
    cudaErrorInvalidNormSetting             = 27,
    cudaErrorMixedDeviceExecution           = 28,
    cudaErrorNotYetImplemented              = 31,
    cudaErrorMemoryValueTooLarge            = 32,
    cudaErrorStubLibrary                    = 34,
    cudaErrorInsufficientDriver             = 35,
    cudaErrorCallRequiresNewerDriver        = 36,
    cudaErrorInvalidSurface                 = 37,
    cudaErrorDuplicateVariableName          = 43,
    cudaErrorDuplicateTextureName           = 44,
    cudaErrorDuplicateSurfaceName           = 45,
    cudaErrorDevicesUnavailable             = 46,
    cudaErrorIncompatibleDriverContext      = 49,
    cudaErrorMissingConfiguration           = 52,
    cudaErrorPriorLaunchFailure             = 53,
    cudaErrorLaunchMaxDepthExceeded         = 65,
    cudaErrorLaunchFileScopedTex            = 66,
    cudaErrorLaunchFileScopedSurf           = 67,
    cudaErrorSyncDepthExceeded              = 68,
    cudaErrorLaunchPendingCountExceeded     = 69,
    cudaErrorInvalidDeviceFunction          = 98,
    cudaErrorNoDevice                       = 100,
    cudaErrorInvalidDevice                  = 101,
    cudaErrorDeviceNotLicensed              = 102,
    cudaErrorSoftwareValidityNotEstablished = 103,
    cudaErrorStartupFailure                 = 127,
    cudaErrorInvalidKernelImage             = 200,
    cudaErrorDeviceUninitialized            = 201,
    cudaErrorMapBufferObjectFailed          = 205,
    cudaErrorUnmapBufferObjectFailed        = 206,
    cudaErrorArrayIsMapped                  = 207,
    cudaErrorAlreadyMapped                  = 208,
    cudaErrorNoKernelImageForDevice         = 209,
    cudaErrorAlreadyAcquired                = 210,
    cudaErrorNotMapped                      = 211,
    cudaErrorNotMappedAsArray               = 212,
    cudaErrorNotMappedAsPointer             = 213,
    cudaErrorECCUncorrectable               = 214,
    cudaErrorUnsupportedLimit               = 215,
    cudaErrorDeviceAlreadyInUse             = 216,
    cudaErrorPeerAccessUnsupported          = 217,
    cudaErrorInvalidPtx                     = 218,
    cudaErrorInvalidGraphicsContext         = 219,
    cudaErrorNvlinkUncorrectable            = 220,
    cudaErrorJitCompilerNotFound            = 221,
    cudaErrorUnsupportedPtxVersion          = 222,
    cudaErrorJitCompilationDisabled         = 223,
    cudaErrorUnsupportedExecAffinity        = 224,
    cudaErrorUnsupportedDevSideSync         = 225,
    cudaErrorContained                      = 226,
    cudaErrorInvalidSource                  = 300,
    cudaErrorFileNotFound                   = 301,
    cudaErrorSharedObjectSymbolNotFound     = 302,
    cudaErrorSharedObjectInitFailed         = 303,
    cudaErrorOperatingSystem                = 304,
    cudaErrorInvalidResourceHandle          = 400,
    cudaErrorIllegalState                   = 401,
    cudaErrorLossyQuery                     = 402,
    cudaErrorSymbolNotFound                 = 500,
    cudaErrorNotReady                       = 600,
    cudaErrorIllegalAddress                 = 700,
    cudaErrorLaunchOutOfResources           = 701,
    cudaErrorLaunchTimeout                  = 702,
    cudaErrorLaunchIncompatibleTexturing    = 703,
    cudaErrorPeerAccessAlreadyEnabled       = 704,
    cudaErrorPeerAccessNotEnabled           = 705,
    cudaErrorSetOnActiveProcess             = 708,
    cudaErrorContextIsDestroyed             = 709,
    cudaErrorAssert                         = 710,
    cudaErrorTooManyPeers                   = 711,
    cudaErrorHostMemoryAlreadyRegistered    = 712,
    cudaErrorHostMemoryNotRegistered        = 713,
    cudaErrorHardwareStackError             = 714,
    cudaErrorIllegalInstruction             = 715,
    cudaErrorMisalignedAddress              = 716,
    cudaErrorInvalidAddressSpace            = 717,
    cudaErrorInvalidPc                      = 718,
    cudaErrorLaunchFailure                  = 719,
    cudaErrorCooperativeLaunchTooLarge      = 720,
    cudaErrorTensorMemoryLeak               = 721,
    cudaErrorNotPermitted                   = 800,
    cudaErrorNotSupported                   = 801,
    cudaErrorSystemNotReady                 = 802,
    cudaErrorSystemDriverMismatch           = 803,
    cudaErrorCompatNotSupportedOnDevice     = 804,
    cudaErrorMpsConnectionFailed            = 805,
    cudaErrorMpsRpcFailure                  = 806,
    cudaErrorMpsServerNotReady              = 807,
    cudaErrorMpsMaxClientsReached           = 808,
    cudaErrorMpsMaxConnectionsReached       = 809,
    cudaErrorMpsClientTerminated            = 810,
    cudaErrorCdpNotSupported                = 811,
    cudaErrorCdpVersionMismatch             = 812,
    cudaErrorStreamCaptureUnsupported       = 900,
    cudaErrorStreamCaptureInvalidated       = 901,
    cudaErrorStreamCaptureMerge             = 902,
    cudaErrorStreamCaptureUnmatched         = 903,
    cudaErrorStreamCaptureUnjoined          = 904,
    cudaErrorStreamCaptureIsolation         = 905,
    cudaErrorStreamCaptureImplicit          = 906,
    cudaErrorCapturedEvent                  = 907,
    cudaErrorStreamCaptureWrongThread       = 908,
    cudaErrorTimeout                        = 909,
    cudaErrorGraphExecUpdateFailure         = 910,
    cudaErrorExternalDevice                 = 911,
    cudaErrorInvalidClusterSize             = 912,
    cudaErrorFunctionNotLoaded              = 913,
    cudaErrorInvalidResourceType            = 914,
    cudaErrorInvalidResourceConfiguration   = 915,
    cudaErrorUnknown                        = 999,
    cudaErrorApiFailureBase                 = 10000
};
typedef enum cudaError cudaError_t;

/* The runtime's handles are the driver's objects. */
typedef struct CUstream_st *cudaStream_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;
typedef struct CUgraph_st *cudaGraph_t;

#define cudaStreamLegacy    ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

#define cudaStreamDefault     0x00
#define cudaStreamNonBlocking 0x01

#define cudaHostAllocDefault       0x00
#define cudaHostAllocPortable      0x01
#define cudaHostAllocMapped        0x02
#define cudaHostAllocWriteCombined 0x04

#define cudaMemAttachGlobal 0x01
#define cudaMemAttachHost   0x02
#define cudaMemAttachSingle 0x04

enum cudaMemPoolAttr {
    cudaMemPoolReuseFollowEventDependencies   = 0x1,
    cudaMemPoolReuseAllowOpportunistic        = 0x2,
    cudaMemPoolReuseAllowInternalDependencies = 0x3,
    cudaMemPoolAttrReleaseThreshold           = 0x4,
    cudaMemPoolAttrReservedMemCurrent         = 0x5,
    cudaMemPoolAttrReservedMemHigh            = 0x6,
    cudaMemPoolAttrUsedMemCurrent             = 0x7,
    cudaMemPoolAttrUsedMemHigh                = 0x8
};
typedef enum cudaMemPoolAttr cudaMemPoolAttr;

enum cudaGetDriverEntryPointFlags {
    cudaEnableDefault                = 0x0,
    cudaEnableLegacyStream           = 0x1,
    cudaEnablePerThreadDefaultStream = 0x2
};
typedef enum cudaGetDriverEntryPointFlags cudaGetDriverEntryPointFlags;

/* "Sufficent" is NVIDIA's spelling. */
enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess             = 0,
    cudaDriverEntryPointSymbolNotFound      = 1,
    cudaDriverEntryPointVersionNotSufficent = 2
};
typedef enum cudaDriverEntryPointQueryResult cudaDriverEntryPointQueryResult;

enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone        = 0,
    cudaStreamCaptureStatusActive      = 1,
    cudaStreamCaptureStatusInvalidated = 2
};

enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal      = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed     = 2
};

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#define cudaStreamBeginCapture           cudaStreamBeginCapture_ptsz
#define cudaStreamEndCapture             cudaStreamEndCapture_ptsz
#define cudaStreamIsCapturing            cudaStreamIsCapturing_ptsz
#define cudaMallocAsync                  cudaMallocAsync_ptsz
#define cudaFreeAsync                    cudaFreeAsync_ptsz
#define cudaMallocFromPoolAsync          cudaMallocFromPoolAsync_ptsz
#define cudaGetDriverEntryPoint          cudaGetDriverEntryPoint_ptsz
#define cudaGetDriverEntryPointByVersion cudaGetDriverEntryPointByVersion_ptsz
#endif

cudaError_t CUDARTAPI cudaGetLastError(void);
cudaError_t CUDARTAPI cudaPeekAtLastError(void);
const char *CUDARTAPI cudaGetErrorString(cudaError_t error);
const char *CUDARTAPI cudaGetErrorName(cudaError_t error);

cudaError_t CUDARTAPI cudaDriverGetVersion(int *driverVersion);
cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *runtimeVersion);

cudaError_t CUDARTAPI cudaGetDeviceCount(int *count);
cudaError_t CUDARTAPI cudaSetDevice(int device);
cudaError_t CUDARTAPI cudaGetDevice(int *device);
cudaError_t CUDARTAPI cudaDeviceSynchronize(void);
cudaError_t CUDARTAPI cudaDeviceReset(void);

cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size);
cudaError_t CUDARTAPI cudaFree(void *devPtr);
cudaError_t CUDARTAPI cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
cudaError_t CUDARTAPI cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
cudaError_t CUDARTAPI cudaMallocHost(void **ptr, size_t size);
cudaError_t CUDARTAPI cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t CUDARTAPI cudaFreeHost(void *ptr);
cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free, size_t *total);

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t *pStream);
cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream);
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream);

cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t CUDARTAPI cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                  enum cudaStreamCaptureMode mode);
cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t CUDARTAPI cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream,
                                            enum cudaStreamCaptureStatus *pCaptureStatus);
cudaError_t CUDARTAPI cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                                 enum cudaStreamCaptureStatus *pCaptureStatus);
cudaError_t CUDARTAPI cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode);
cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph);

cudaError_t CUDARTAPI cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t CUDARTAPI cudaFreeAsync(void *devPtr, cudaStream_t hStream);
cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
cudaError_t CUDARTAPI cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                              cudaStream_t stream);
cudaError_t CUDARTAPI cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                   cudaStream_t stream);
cudaError_t CUDARTAPI cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device);
cudaError_t CUDARTAPI cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device);
cudaError_t CUDARTAPI cudaDeviceSetMemPool(int device, cudaMemPool_t memPool);
cudaError_t CUDARTAPI cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep);
cudaError_t CUDARTAPI cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                              void *value);
cudaError_t CUDARTAPI cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                              void *value);

cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
                                              unsigned long long flags,
                                              enum cudaDriverEntryPointQueryResult *driverStatus);
cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
                                                   unsigned long long flags,
                                                   enum cudaDriverEntryPointQueryResult *driverStatus);
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                                       unsigned int cudaVersion,
                                                       unsigned long long flags,
                                                       enum cudaDriverEntryPointQueryResult *driverStatus);
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                            unsigned int cudaVersion,
                                                            unsigned long long flags,
                                                            enum cudaDriverEntryPointQueryResult *driverStatus);

#ifdef __cplusplus
}
#endif

#endif /* SIMCUDA_CUDA_RUNTIME_H */
