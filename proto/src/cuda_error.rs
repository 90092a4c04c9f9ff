//! Names of the CUDA error codes an allocation can fail with, so that a report says
//! "cudaErrorInsufficientDriver" and why rather than a bare number.
//!
//! The runtime (`cudaError_t`) and the driver (`CUresult`) number their errors differently
//! past the first few: the API that failed picks the table. Values are from NVIDIA's
//! `driver_types.h` and `cuda.h` (12.x). Codes not listed have no name; callers show the
//! number alone.

use crate::event::Api;

/// A named CUDA error: its symbol and, for the ones users meet, what it usually means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaError {
    pub name: &'static str,
    pub meaning: &'static str,
}

/// True for the runtime API's functions (their results are `cudaError_t`).
pub fn is_runtime(api: Api) -> bool {
    (64..=95).contains(&(api as u8))
}

/// The error `code` returned by `api`, if it is one we know.
pub fn lookup(api: Api, code: i32) -> Option<CudaError> {
    let table = if is_runtime(api) { RUNTIME } else { DRIVER };
    table
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|&(_, name, meaning)| CudaError { name, meaning })
}

/// `code name (meaning)` or just the number.
pub fn describe(api: Api, code: i32) -> String {
    match lookup(api, code) {
        Some(e) if e.meaning.is_empty() => format!("{code} {}", e.name),
        Some(e) => format!("{code} {}: {}", e.name, e.meaning),
        None => format!("error {code}"),
    }
}

const RUNTIME: &[(i32, &str, &str)] = &[
    (1, "cudaErrorInvalidValue", "an argument was out of range"),
    (2, "cudaErrorMemoryAllocation", "out of memory"),
    (
        3,
        "cudaErrorInitializationError",
        "the CUDA driver could not be initialised",
    ),
    (
        4,
        "cudaErrorCudartUnloading",
        "the runtime is shutting down",
    ),
    (
        34,
        "cudaErrorStubLibrary",
        "a stub libcuda (no real driver) was loaded",
    ),
    (
        35,
        "cudaErrorInsufficientDriver",
        "no CUDA driver, or one older than the runtime",
    ),
    (
        46,
        "cudaErrorDevicesUnavailable",
        "the devices are busy or unavailable (exclusive mode)",
    ),
    (
        100,
        "cudaErrorNoDevice",
        "no CUDA-capable device is visible",
    ),
    (
        101,
        "cudaErrorInvalidDevice",
        "the device number is not valid",
    ),
    (
        201,
        "cudaErrorDeviceUninitialized",
        "the context is not valid",
    ),
    (217, "cudaErrorPeerAccessUnsupported", ""),
    (222, "cudaErrorUnsupportedPtxVersion", ""),
    (
        700,
        "cudaErrorIllegalAddress",
        "an earlier kernel faulted: the context is unusable",
    ),
    (
        719,
        "cudaErrorLaunchFailure",
        "an earlier kernel failed: the context is unusable",
    ),
    (
        801,
        "cudaErrorNotSupported",
        "not supported on this device or platform",
    ),
    (
        900,
        "cudaErrorStreamCaptureUnsupported",
        "not allowed while a CUDA graph is being captured",
    ),
    (999, "cudaErrorUnknown", ""),
];

const DRIVER: &[(i32, &str, &str)] = &[
    (
        1,
        "CUDA_ERROR_INVALID_VALUE",
        "an argument was out of range",
    ),
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    (
        3,
        "CUDA_ERROR_NOT_INITIALIZED",
        "cuInit was not called or failed",
    ),
    (4, "CUDA_ERROR_DEINITIALIZED", "the driver is shutting down"),
    (
        34,
        "CUDA_ERROR_STUB_LIBRARY",
        "a stub libcuda (no real driver) was loaded",
    ),
    (
        46,
        "CUDA_ERROR_DEVICE_UNAVAILABLE",
        "the device is busy or unavailable (exclusive mode)",
    ),
    (
        100,
        "CUDA_ERROR_NO_DEVICE",
        "no CUDA-capable device is visible",
    ),
    (
        101,
        "CUDA_ERROR_INVALID_DEVICE",
        "the device number is not valid",
    ),
    (
        201,
        "CUDA_ERROR_INVALID_CONTEXT",
        "no current context on this thread",
    ),
    (
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "an earlier kernel faulted: the context is unusable",
    ),
    (
        719,
        "CUDA_ERROR_LAUNCH_FAILED",
        "an earlier kernel failed: the context is unusable",
    ),
    (
        801,
        "CUDA_ERROR_NOT_SUPPORTED",
        "not supported on this device or platform",
    ),
    (
        900,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        "not allowed while a CUDA graph is being captured",
    ),
    (999, "CUDA_ERROR_UNKNOWN", ""),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failing_api_picks_the_table() {
        assert_eq!(
            lookup(Api::cudaMalloc, 35).unwrap().name,
            "cudaErrorInsufficientDriver"
        );
        assert_eq!(
            lookup(Api::cuMemAlloc_v2, 201).unwrap().name,
            "CUDA_ERROR_INVALID_CONTEXT"
        );
        assert_eq!(
            lookup(Api::oomtrace_malloc, 2).unwrap().name,
            "CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert!(describe(Api::cudaMalloc, 100).contains("cudaErrorNoDevice"));
        assert_eq!(describe(Api::cudaMalloc, 12345), "error 12345");
        assert_eq!(describe(Api::cuMemAlloc_v2, 999), "999 CUDA_ERROR_UNKNOWN");
    }

    #[test]
    fn tables_have_one_entry_per_code() {
        for table in [RUNTIME, DRIVER] {
            for (i, a) in table.iter().enumerate() {
                assert!(table[i + 1..].iter().all(|b| b.0 != a.0), "{}", a.1);
            }
        }
    }
}
