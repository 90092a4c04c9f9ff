//! The few CUDA C types the hooks need, at their real ABI (see cuda.h, CUDA 12.8).
//!
//! Return values are plain `c_int`, never a Rust enum: a driver newer than this file may
//! return codes we do not know, and an out-of-range enum value would be undefined behaviour.
//! The simcuda ABI test checks these layouts against cudarc's generated bindings.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_void};

pub type CUresult = c_int;
pub type cudaError_t = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUstream = *mut c_void;
pub type CUcontext = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type cuuint64_t = u64;

pub const CUDA_SUCCESS: c_int = 0;
/// CUDA_ERROR_OUT_OF_MEMORY (cudaErrorMemoryAllocation has the same value): also what
/// PyTorch's own out-of-memory is recorded as.
pub const CUDA_ERROR_OUT_OF_MEMORY: c_int = 2;
/// CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND and cudaErrorSharedObjectSymbolNotFound share
/// this value: returned only when the real function cannot be found at all.
pub const ERROR_SYMBOL_NOT_FOUND: c_int = 302;

/// `CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS`.
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
/// `CUdriverProcAddress_flags`.
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1 << 0;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// `CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp`; only `location` is read.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

/// Real function-pointer types used outside the hook table.
pub type CuCtxGetDeviceFn = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
pub type CuDeviceGetCountFn = unsafe extern "C" fn(*mut i32) -> CUresult;
pub type CuMemGetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
pub type CuGetProcAddressFn =
    unsafe extern "C" fn(*const std::ffi::c_char, *mut *mut c_void, c_int, cuuint64_t) -> CUresult;
pub type CuGetProcAddressV2Fn = unsafe extern "C" fn(
    *const std::ffi::c_char,
    *mut *mut c_void,
    c_int,
    cuuint64_t,
    *mut c_int,
) -> CUresult;
