//! ABI check: simcuda's headers against cudarc 0.19's bindgen output of
//! NVIDIA's CUDA 12.8 headers (feature `cuda-12080`).  The `abi` program
//! prints every enumerator and numeric #define of cuda.h and cuda_runtime.h
//! (build.rs generates that list from the headers, so nothing can be added
//! unchecked) and the size and field offsets of every struct.

mod common;

use cudarc::driver::sys as d;
use cudarc::runtime::sys as r;
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};

/// Values of enum variants (or associated constants of the enum type).
macro_rules! variants {
    ($m:ident, $ty:ty; $($v:ident),* $(,)?) => {
        $( $m.insert(stringify!($v), <$ty>::$v as i64); )*
    };
}

/// Values of bindgen "newtype enums" (`struct X(pub c_uint)` with constants).
macro_rules! newtype {
    ($m:ident, $ty:ty; $($v:ident),* $(,)?) => {
        $( $m.insert(stringify!($v), <$ty>::$v.0 as i64); )*
    };
}

macro_rules! consts {
    ($m:ident, $module:ident; $($v:ident),* $(,)?) => {
        $( $m.insert(stringify!($v), $module::$v as i64); )*
    };
}

fn reference_constants() -> BTreeMap<&'static str, i64> {
    let mut m = BTreeMap::new();
    variants!(m, d::CUresult;
        CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_PROFILER_DISABLED,
        CUDA_ERROR_PROFILER_NOT_INITIALIZED, CUDA_ERROR_PROFILER_ALREADY_STARTED, CUDA_ERROR_PROFILER_ALREADY_STOPPED,
        CUDA_ERROR_STUB_LIBRARY, CUDA_ERROR_DEVICE_UNAVAILABLE, CUDA_ERROR_NO_DEVICE,
        CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_DEVICE_NOT_LICENSED, CUDA_ERROR_INVALID_IMAGE,
        CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_CONTEXT_ALREADY_CURRENT, CUDA_ERROR_MAP_FAILED,
        CUDA_ERROR_UNMAP_FAILED, CUDA_ERROR_ARRAY_IS_MAPPED, CUDA_ERROR_ALREADY_MAPPED,
        CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_ALREADY_ACQUIRED, CUDA_ERROR_NOT_MAPPED,
        CUDA_ERROR_NOT_MAPPED_AS_ARRAY, CUDA_ERROR_NOT_MAPPED_AS_POINTER, CUDA_ERROR_ECC_UNCORRECTABLE,
        CUDA_ERROR_UNSUPPORTED_LIMIT, CUDA_ERROR_CONTEXT_ALREADY_IN_USE, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
        CUDA_ERROR_INVALID_PTX, CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, CUDA_ERROR_NVLINK_UNCORRECTABLE,
        CUDA_ERROR_JIT_COMPILER_NOT_FOUND, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_ERROR_JIT_COMPILATION_DISABLED,
        CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, CUDA_ERROR_CONTAINED,
        CUDA_ERROR_INVALID_SOURCE, CUDA_ERROR_FILE_NOT_FOUND, CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
        CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, CUDA_ERROR_OPERATING_SYSTEM, CUDA_ERROR_INVALID_HANDLE,
        CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_LOSSY_QUERY, CUDA_ERROR_NOT_FOUND,
        CUDA_ERROR_NOT_READY, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        CUDA_ERROR_LAUNCH_TIMEOUT, CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, CUDA_ERROR_CONTEXT_IS_DESTROYED,
        CUDA_ERROR_ASSERT, CUDA_ERROR_TOO_MANY_PEERS, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, CUDA_ERROR_HARDWARE_STACK_ERROR, CUDA_ERROR_ILLEGAL_INSTRUCTION,
        CUDA_ERROR_MISALIGNED_ADDRESS, CUDA_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_INVALID_PC,
        CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, CUDA_ERROR_TENSOR_MEMORY_LEAK,
        CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_SYSTEM_NOT_READY,
        CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, CUDA_ERROR_MPS_CONNECTION_FAILED,
        CUDA_ERROR_MPS_RPC_FAILURE, CUDA_ERROR_MPS_SERVER_NOT_READY, CUDA_ERROR_MPS_MAX_CLIENTS_REACHED,
        CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, CUDA_ERROR_MPS_CLIENT_TERMINATED, CUDA_ERROR_CDP_NOT_SUPPORTED,
        CUDA_ERROR_CDP_VERSION_MISMATCH, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        CUDA_ERROR_STREAM_CAPTURE_MERGE, CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_CAPTURED_EVENT,
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, CUDA_ERROR_TIMEOUT, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
        CUDA_ERROR_EXTERNAL_DEVICE, CUDA_ERROR_INVALID_CLUSTER_SIZE, CUDA_ERROR_FUNCTION_NOT_LOADED,
        CUDA_ERROR_INVALID_RESOURCE_TYPE, CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, CUDA_ERROR_KEY_ROTATION,
        CUDA_ERROR_UNKNOWN
    );
    variants!(m, d::CUdevice_attribute;
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY,
        CU_DEVICE_ATTRIBUTE_WARP_SIZE, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        CU_DEVICE_ATTRIBUTE_INTEGRATED, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
        CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
    );
    variants!(m, d::CUctx_flags;
        CU_CTX_SCHED_AUTO, CU_CTX_SCHED_SPIN, CU_CTX_SCHED_YIELD,
        CU_CTX_SCHED_BLOCKING_SYNC, CU_CTX_SCHED_MASK, CU_CTX_MAP_HOST,
        CU_CTX_LMEM_RESIZE_TO_MAX, CU_CTX_COREDUMP_ENABLE, CU_CTX_USER_COREDUMP_ENABLE,
        CU_CTX_SYNC_MEMOPS, CU_CTX_FLAGS_MASK
    );
    variants!(m, d::CUstream_flags;
        CU_STREAM_DEFAULT, CU_STREAM_NON_BLOCKING
    );
    variants!(m, d::CUmemAttach_flags;
        CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST, CU_MEM_ATTACH_SINGLE
    );
    newtype!(m, d::CUmemAllocationHandleType;
        CU_MEM_HANDLE_TYPE_NONE, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_WIN32,
        CU_MEM_HANDLE_TYPE_WIN32_KMT, CU_MEM_HANDLE_TYPE_FABRIC, CU_MEM_HANDLE_TYPE_MAX
    );
    variants!(m, d::CUmemAccess_flags;
        CU_MEM_ACCESS_FLAGS_PROT_NONE, CU_MEM_ACCESS_FLAGS_PROT_READ, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        CU_MEM_ACCESS_FLAGS_PROT_MAX
    );
    variants!(m, d::CUmemLocationType;
        CU_MEM_LOCATION_TYPE_INVALID, CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST,
        CU_MEM_LOCATION_TYPE_HOST_NUMA, CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, CU_MEM_LOCATION_TYPE_MAX
    );
    variants!(m, d::CUmemAllocationType;
        CU_MEM_ALLOCATION_TYPE_INVALID, CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_MAX
    );
    variants!(m, d::CUmemAllocationGranularity_flags;
        CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
    );
    variants!(m, d::CUmemAllocationCompType;
        CU_MEM_ALLOCATION_COMP_NONE, CU_MEM_ALLOCATION_COMP_GENERIC
    );
    variants!(m, d::CUmemPool_attribute;
        CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        CU_MEMPOOL_ATTR_USED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_HIGH
    );
    variants!(m, d::CUexecAffinityType;
        CU_EXEC_AFFINITY_TYPE_SM_COUNT, CU_EXEC_AFFINITY_TYPE_MAX
    );
    variants!(m, d::CUcigDataType;
        CIG_DATA_TYPE_D3D12_COMMAND_QUEUE
    );
    variants!(m, d::CUstreamCaptureStatus;
        CU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_CAPTURE_STATUS_ACTIVE, CU_STREAM_CAPTURE_STATUS_INVALIDATED
    );
    variants!(m, d::CUstreamCaptureMode;
        CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_RELAXED
    );
    variants!(m, d::CUdriverProcAddress_flags;
        CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_LEGACY_STREAM, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    );
    variants!(m, d::CUdriverProcAddressQueryResult;
        CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
    );
    variants!(m, r::cudaError;
        cudaSuccess, cudaErrorInvalidValue, cudaErrorMemoryAllocation,
        cudaErrorInitializationError, cudaErrorCudartUnloading, cudaErrorProfilerDisabled,
        cudaErrorProfilerNotInitialized, cudaErrorProfilerAlreadyStarted, cudaErrorProfilerAlreadyStopped,
        cudaErrorInvalidConfiguration, cudaErrorInvalidPitchValue, cudaErrorInvalidSymbol,
        cudaErrorInvalidHostPointer, cudaErrorInvalidDevicePointer, cudaErrorInvalidTexture,
        cudaErrorInvalidTextureBinding, cudaErrorInvalidChannelDescriptor, cudaErrorInvalidMemcpyDirection,
        cudaErrorAddressOfConstant, cudaErrorTextureFetchFailed, cudaErrorTextureNotBound,
        cudaErrorSynchronizationError, cudaErrorInvalidFilterSetting, cudaErrorInvalidNormSetting,
        cudaErrorMixedDeviceExecution, cudaErrorNotYetImplemented, cudaErrorMemoryValueTooLarge,
        cudaErrorStubLibrary, cudaErrorInsufficientDriver, cudaErrorCallRequiresNewerDriver,
        cudaErrorInvalidSurface, cudaErrorDuplicateVariableName, cudaErrorDuplicateTextureName,
        cudaErrorDuplicateSurfaceName, cudaErrorDevicesUnavailable, cudaErrorIncompatibleDriverContext,
        cudaErrorMissingConfiguration, cudaErrorPriorLaunchFailure, cudaErrorLaunchMaxDepthExceeded,
        cudaErrorLaunchFileScopedTex, cudaErrorLaunchFileScopedSurf, cudaErrorSyncDepthExceeded,
        cudaErrorLaunchPendingCountExceeded, cudaErrorInvalidDeviceFunction, cudaErrorNoDevice,
        cudaErrorInvalidDevice, cudaErrorDeviceNotLicensed, cudaErrorSoftwareValidityNotEstablished,
        cudaErrorStartupFailure, cudaErrorInvalidKernelImage, cudaErrorDeviceUninitialized,
        cudaErrorMapBufferObjectFailed, cudaErrorUnmapBufferObjectFailed, cudaErrorArrayIsMapped,
        cudaErrorAlreadyMapped, cudaErrorNoKernelImageForDevice, cudaErrorAlreadyAcquired,
        cudaErrorNotMapped, cudaErrorNotMappedAsArray, cudaErrorNotMappedAsPointer,
        cudaErrorECCUncorrectable, cudaErrorUnsupportedLimit, cudaErrorDeviceAlreadyInUse,
        cudaErrorPeerAccessUnsupported, cudaErrorInvalidPtx, cudaErrorInvalidGraphicsContext,
        cudaErrorNvlinkUncorrectable, cudaErrorJitCompilerNotFound, cudaErrorUnsupportedPtxVersion,
        cudaErrorJitCompilationDisabled, cudaErrorUnsupportedExecAffinity, cudaErrorUnsupportedDevSideSync,
        cudaErrorContained, cudaErrorInvalidSource, cudaErrorFileNotFound,
        cudaErrorSharedObjectSymbolNotFound, cudaErrorSharedObjectInitFailed, cudaErrorOperatingSystem,
        cudaErrorInvalidResourceHandle, cudaErrorIllegalState, cudaErrorLossyQuery,
        cudaErrorSymbolNotFound, cudaErrorNotReady, cudaErrorIllegalAddress,
        cudaErrorLaunchOutOfResources, cudaErrorLaunchTimeout, cudaErrorLaunchIncompatibleTexturing,
        cudaErrorPeerAccessAlreadyEnabled, cudaErrorPeerAccessNotEnabled, cudaErrorSetOnActiveProcess,
        cudaErrorContextIsDestroyed, cudaErrorAssert, cudaErrorTooManyPeers,
        cudaErrorHostMemoryAlreadyRegistered, cudaErrorHostMemoryNotRegistered, cudaErrorHardwareStackError,
        cudaErrorIllegalInstruction, cudaErrorMisalignedAddress, cudaErrorInvalidAddressSpace,
        cudaErrorInvalidPc, cudaErrorLaunchFailure, cudaErrorCooperativeLaunchTooLarge,
        cudaErrorTensorMemoryLeak, cudaErrorNotPermitted, cudaErrorNotSupported,
        cudaErrorSystemNotReady, cudaErrorSystemDriverMismatch, cudaErrorCompatNotSupportedOnDevice,
        cudaErrorMpsConnectionFailed, cudaErrorMpsRpcFailure, cudaErrorMpsServerNotReady,
        cudaErrorMpsMaxClientsReached, cudaErrorMpsMaxConnectionsReached, cudaErrorMpsClientTerminated,
        cudaErrorCdpNotSupported, cudaErrorCdpVersionMismatch, cudaErrorStreamCaptureUnsupported,
        cudaErrorStreamCaptureInvalidated, cudaErrorStreamCaptureMerge, cudaErrorStreamCaptureUnmatched,
        cudaErrorStreamCaptureUnjoined, cudaErrorStreamCaptureIsolation, cudaErrorStreamCaptureImplicit,
        cudaErrorCapturedEvent, cudaErrorStreamCaptureWrongThread, cudaErrorTimeout,
        cudaErrorGraphExecUpdateFailure, cudaErrorExternalDevice, cudaErrorInvalidClusterSize,
        cudaErrorFunctionNotLoaded, cudaErrorInvalidResourceType, cudaErrorInvalidResourceConfiguration,
        cudaErrorUnknown, cudaErrorApiFailureBase
    );
    variants!(m, r::cudaMemPoolAttr;
        cudaMemPoolReuseFollowEventDependencies, cudaMemPoolReuseAllowOpportunistic, cudaMemPoolReuseAllowInternalDependencies,
        cudaMemPoolAttrReleaseThreshold, cudaMemPoolAttrReservedMemCurrent, cudaMemPoolAttrReservedMemHigh,
        cudaMemPoolAttrUsedMemCurrent, cudaMemPoolAttrUsedMemHigh
    );
    variants!(m, r::cudaStreamCaptureStatus;
        cudaStreamCaptureStatusNone, cudaStreamCaptureStatusActive, cudaStreamCaptureStatusInvalidated
    );
    variants!(m, r::cudaStreamCaptureMode;
        cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeRelaxed
    );
    variants!(m, r::cudaGetDriverEntryPointFlags;
        cudaEnableDefault, cudaEnableLegacyStream, cudaEnablePerThreadDefaultStream
    );
    variants!(m, r::cudaDriverEntryPointQueryResult;
        cudaDriverEntryPointSuccess, cudaDriverEntryPointSymbolNotFound, cudaDriverEntryPointVersionNotSufficent
    );
    consts!(m, d; CUDA_VERSION, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_WRITECOMBINED);
    consts!(m, r;
        CUDART_VERSION, cudaStreamDefault, cudaStreamNonBlocking, cudaHostAllocDefault,
        cudaHostAllocPortable, cudaHostAllocMapped, cudaHostAllocWriteCombined,
        cudaMemAttachGlobal, cudaMemAttachHost, cudaMemAttachSingle
    );
    // Cast macros that bindgen cannot translate; values from NVIDIA's headers
    // (cuda.h: ((CUstream)0x1), ((CUstream)0x2); driver_types.h likewise).
    m.insert("CU_STREAM_LEGACY", 1);
    m.insert("CU_STREAM_PER_THREAD", 2);
    m.insert("cudaStreamLegacy", 1);
    m.insert("cudaStreamPerThread", 2);
    m
}

fn reference_layout() -> BTreeMap<&'static str, usize> {
    type Prop = d::CUmemAllocationProp;
    type Flags = d::CUmemAllocationProp_st__bindgen_ty_1;
    let flags = offset_of!(Prop, allocFlags);
    BTreeMap::from([
        ("size CUresult", size_of::<d::CUresult>()),
        ("size cudaError_t", size_of::<r::cudaError_t>()),
        ("size CUdevice", size_of::<d::CUdevice>()),
        ("size CUdeviceptr", size_of::<d::CUdeviceptr>()),
        ("size cuuint64_t", size_of::<d::cuuint64_t>()),
        (
            "size CUmemGenericAllocationHandle",
            size_of::<d::CUmemGenericAllocationHandle>(),
        ),
        ("size CUmemLocation", size_of::<d::CUmemLocation>()),
        (
            "offset CUmemLocation.type",
            offset_of!(d::CUmemLocation, type_),
        ),
        ("offset CUmemLocation.id", offset_of!(d::CUmemLocation, id)),
        ("size CUmemAllocationProp", size_of::<Prop>()),
        ("offset CUmemAllocationProp.type", offset_of!(Prop, type_)),
        (
            "offset CUmemAllocationProp.requestedHandleTypes",
            offset_of!(Prop, requestedHandleTypes),
        ),
        (
            "offset CUmemAllocationProp.location",
            offset_of!(Prop, location),
        ),
        (
            "offset CUmemAllocationProp.win32HandleMetaData",
            offset_of!(Prop, win32HandleMetaData),
        ),
        ("offset CUmemAllocationProp.allocFlags", flags),
        (
            "offset CUmemAllocationProp.allocFlags.compressionType",
            flags + offset_of!(Flags, compressionType),
        ),
        (
            "offset CUmemAllocationProp.allocFlags.gpuDirectRDMACapable",
            flags + offset_of!(Flags, gpuDirectRDMACapable),
        ),
        (
            "offset CUmemAllocationProp.allocFlags.usage",
            flags + offset_of!(Flags, usage),
        ),
        (
            "offset CUmemAllocationProp.allocFlags.reserved",
            flags + offset_of!(Flags, reserved),
        ),
        ("size CUmemAccessDesc", size_of::<d::CUmemAccessDesc>()),
        (
            "offset CUmemAccessDesc.location",
            offset_of!(d::CUmemAccessDesc, location),
        ),
        (
            "offset CUmemAccessDesc.flags",
            offset_of!(d::CUmemAccessDesc, flags),
        ),
        ("size CUmemPoolProps", size_of::<d::CUmemPoolProps>()),
        (
            "offset CUmemPoolProps.allocType",
            offset_of!(d::CUmemPoolProps, allocType),
        ),
        (
            "offset CUmemPoolProps.handleTypes",
            offset_of!(d::CUmemPoolProps, handleTypes),
        ),
        (
            "offset CUmemPoolProps.location",
            offset_of!(d::CUmemPoolProps, location),
        ),
        (
            "offset CUmemPoolProps.win32SecurityAttributes",
            offset_of!(d::CUmemPoolProps, win32SecurityAttributes),
        ),
        (
            "offset CUmemPoolProps.maxSize",
            offset_of!(d::CUmemPoolProps, maxSize),
        ),
        (
            "offset CUmemPoolProps.usage",
            offset_of!(d::CUmemPoolProps, usage),
        ),
        (
            "offset CUmemPoolProps.reserved",
            offset_of!(d::CUmemPoolProps, reserved),
        ),
        (
            "size CUexecAffinityParam",
            size_of::<d::CUexecAffinityParam>(),
        ),
        (
            "offset CUexecAffinityParam.type",
            offset_of!(d::CUexecAffinityParam, type_),
        ),
        (
            "offset CUexecAffinityParam.param",
            offset_of!(d::CUexecAffinityParam, param),
        ),
        ("size CUctxCigParam", size_of::<d::CUctxCigParam>()),
        (
            "offset CUctxCigParam.sharedDataType",
            offset_of!(d::CUctxCigParam, sharedDataType),
        ),
        (
            "offset CUctxCigParam.sharedData",
            offset_of!(d::CUctxCigParam, sharedData),
        ),
        ("size CUctxCreateParams", size_of::<d::CUctxCreateParams>()),
        (
            "offset CUctxCreateParams.execAffinityParams",
            offset_of!(d::CUctxCreateParams, execAffinityParams),
        ),
        (
            "offset CUctxCreateParams.numExecAffinityParams",
            offset_of!(d::CUctxCreateParams, numExecAffinityParams),
        ),
        (
            "offset CUctxCreateParams.cigParams",
            offset_of!(d::CUctxCreateParams, cigParams),
        ),
    ])
}

struct Printed {
    consts: BTreeMap<String, i64>,
    layout: BTreeMap<String, usize>,
}

fn printed() -> Printed {
    let r = common::run("abi", &[], &[]);
    assert_eq!(r.code, Some(0), "abi failed:\n{}", r.stderr);
    let mut p = Printed {
        consts: BTreeMap::new(),
        layout: BTreeMap::new(),
    };
    for line in r.stdout.lines() {
        let mut it = line.split(' ');
        let (kind, name, value) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        if kind == "const" {
            assert!(
                p.consts
                    .insert(name.to_string(), value.parse().unwrap())
                    .is_none(),
                "{name} twice"
            );
        } else {
            p.layout
                .insert(format!("{kind} {name}"), value.parse().unwrap());
        }
    }
    p
}

#[test]
fn every_header_constant_matches_nvidia() {
    let reference = reference_constants();
    let printed = printed().consts;
    assert!(
        printed.len() > 250,
        "the generated list looks truncated: {}",
        printed.len()
    );
    let mut errors = Vec::new();
    for (name, value) in &printed {
        match reference.get(name.as_str()) {
            Some(want) if want == value => {}
            Some(want) => errors.push(format!("{name}: simcuda {value}, NVIDIA {want}")),
            None => errors.push(format!(
                "{name}: not in the reference list (add it to tests/abi.rs)"
            )),
        }
    }
    for name in reference.keys() {
        if !printed.contains_key(*name) {
            errors.push(format!(
                "{name}: in the reference list but not in the headers"
            ));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn struct_layouts_match_nvidia() {
    let reference = reference_layout();
    let printed = printed().layout;
    let mut errors = Vec::new();
    for (key, want) in &reference {
        match printed.get(*key) {
            Some(got) if got == want => {}
            Some(got) => errors.push(format!("{key}: simcuda {got}, NVIDIA {want}")),
            None => errors.push(format!("{key}: not printed by abi.c")),
        }
    }
    for key in printed.keys() {
        if !reference.contains_key(key.as_str()) {
            errors.push(format!("{key}: printed but not checked"));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    // The sizes NVIDIA documents, for the record.
    assert_eq!(reference["size CUmemAllocationProp"], 32);
    assert_eq!(reference["size CUmemPoolProps"], 88);
    assert_eq!(reference["size CUmemAccessDesc"], 12);
}
