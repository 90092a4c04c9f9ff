//! THE list of hooked CUDA functions. To hook another function, add one line.
//!
//! `recorded` lines: `symbol : Family ("cuGetProcAddress base name", CUDA version of this ABI)
//! (C arguments) => Recorder(arguments for it);` where Family is `Driver`, `DriverPtsz` (the
//! per-thread-default-stream twin), or `Runtime` (no base name). Signatures are those of
//! cuda.h / cuda_runtime_api.h; the return type is always the C enum (`c_int`). The symbol must
//! also be a variant of `oomtrace_proto::Api` (pinned wire value).
//!
//! `custom` lines get a slot and a `HOOKS` entry; their wrapper is written by hand.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};

use oomtrace_proto::Api;

use super::{c_name, family, gpa, hook_table, recorders, wrapper, Family, GpaName, Hook};
use crate::cuda::*;

hook_table! {
    recorded {
        // Driver API: every path (symbol binding, dlsym, cuGetProcAddress) ends here.
        cuInit: Driver("cuInit", 2000) (flags: c_uint) => Init();
        cuMemAlloc_v2: Driver("cuMemAlloc", 3020) (dptr: *mut CUdeviceptr, bytesize: usize)
            => AllocOut(dptr, bytesize as u64, 0, 0);
        cuMemAllocPitch_v2: Driver("cuMemAllocPitch", 3020)
            (dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint)
            => AllocPitch(dptr, pitch, height);
        cuMemAllocManaged: Driver("cuMemAllocManaged", 6000) (dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint)
            => AllocOut(dptr, bytesize as u64, 0, flags as u64);
        cuMemFree_v2: Driver("cuMemFree", 3020) (dptr: CUdeviceptr) => Release(EventKind::Free, dptr, 0, 0);
        cuMemAllocAsync: Driver("cuMemAllocAsync", 11020) (dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream)
            => AllocOut(dptr, bytesize as u64, stream as u64, 0);
        cuMemAllocAsync_ptsz: DriverPtsz("cuMemAllocAsync", 11020) (dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream)
            => AllocOut(dptr, bytesize as u64, stream as u64, 0);
        cuMemAllocFromPoolAsync: Driver("cuMemAllocFromPoolAsync", 11020)
            (dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream)
            => AllocOut(dptr, bytesize as u64, stream as u64, pool as u64);
        cuMemAllocFromPoolAsync_ptsz: DriverPtsz("cuMemAllocFromPoolAsync", 11020)
            (dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream)
            => AllocOut(dptr, bytesize as u64, stream as u64, pool as u64);
        cuMemFreeAsync: Driver("cuMemFreeAsync", 11020) (dptr: CUdeviceptr, stream: CUstream)
            => Release(EventKind::Free, dptr, 0, stream as u64);
        cuMemFreeAsync_ptsz: DriverPtsz("cuMemFreeAsync", 11020) (dptr: CUdeviceptr, stream: CUstream)
            => Release(EventKind::Free, dptr, 0, stream as u64);
        cuMemCreate: Driver("cuMemCreate", 10020)
            (handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong)
            => PhysCreate(handle, size as u64, prop);
        cuMemRelease: Driver("cuMemRelease", 10020) (handle: CUmemGenericAllocationHandle)
            => Release(EventKind::PhysRelease, handle, 0, 0);
        cuMemRetainAllocationHandle: Driver("cuMemRetainAllocationHandle", 11000)
            (handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) => Retain(handle, addr);
        cuMemMap: Driver("cuMemMap", 10020)
            (ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong)
            => Mapped(ptr, size as u64, handle, offset as u64);
        cuMemUnmap: Driver("cuMemUnmap", 10020) (ptr: CUdeviceptr, size: usize)
            => Release(EventKind::Unmap, ptr, size as u64, 0);
        cuMemAddressReserve: Driver("cuMemAddressReserve", 10020)
            (ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: c_ulonglong)
            => Reserve(ptr, size as u64, alignment as u64);
        cuMemAddressFree: Driver("cuMemAddressFree", 10020) (ptr: CUdeviceptr, size: usize)
            => Release(EventKind::VaFree, ptr, size as u64, 0);
        cuMemHostAlloc: Driver("cuMemHostAlloc", 2020) (pp: *mut *mut c_void, bytesize: usize, flags: c_uint)
            => AllocOut(pp, bytesize as u64, 0, flags as u64);
        cuMemAllocHost_v2: Driver("cuMemAllocHost", 3020) (pp: *mut *mut c_void, bytesize: usize)
            => AllocOut(pp, bytesize as u64, 0, 0);
        cuMemFreeHost: Driver("cuMemFreeHost", 2000) (p: *mut c_void) => Release(EventKind::Free, p as u64, 0, 0);
        cuMemGetInfo_v2: Driver("cuMemGetInfo", 3020) (free: *mut usize, total: *mut usize) => MemInfo(free, total);

        // Runtime API: labels only (the driver hooks see these calls too; the depth guard makes
        // the outer one record). Reached through symbol binding of a dynamic libcudart.
        cudaMalloc: Runtime (dev_ptr: *mut *mut c_void, size: usize) => AllocOut(dev_ptr, size as u64, 0, 0);
        cudaFree: Runtime (dev_ptr: *mut c_void) => Release(EventKind::Free, dev_ptr as u64, 0, 0);
        cudaMallocAsync: Runtime (dev_ptr: *mut *mut c_void, size: usize, stream: CUstream)
            => AllocOut(dev_ptr, size as u64, stream as u64, 0);
        cudaMallocAsync_ptsz: Runtime (dev_ptr: *mut *mut c_void, size: usize, stream: CUstream)
            => AllocOut(dev_ptr, size as u64, stream as u64, 0);
        cudaFreeAsync: Runtime (dev_ptr: *mut c_void, stream: CUstream)
            => Release(EventKind::Free, dev_ptr as u64, 0, stream as u64);
        cudaFreeAsync_ptsz: Runtime (dev_ptr: *mut c_void, stream: CUstream)
            => Release(EventKind::Free, dev_ptr as u64, 0, stream as u64);
        cudaMallocManaged: Runtime (dev_ptr: *mut *mut c_void, size: usize, flags: c_uint)
            => AllocOut(dev_ptr, size as u64, 0, flags as u64);
        cudaMallocPitch: Runtime (dev_ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize)
            => AllocPitch(dev_ptr, pitch, height);
        cudaMallocHost: Runtime (ptr: *mut *mut c_void, size: usize) => AllocOut(ptr, size as u64, 0, 0);
        cudaHostAlloc: Runtime (ptr: *mut *mut c_void, size: usize, flags: c_uint)
            => AllocOut(ptr, size as u64, 0, flags as u64);
        cudaFreeHost: Runtime (ptr: *mut c_void) => Release(EventKind::Free, ptr as u64, 0, 0);
    }
    custom {
        cuGetProcAddress: DriverResolver("cuGetProcAddress", 11030) => super::resolve::cuGetProcAddress;
        cuGetProcAddress_v2: DriverResolver("cuGetProcAddress", 12000) => super::resolve::cuGetProcAddress_v2;
        cudaGetDriverEntryPoint: RuntimeResolver => super::resolve::cudaGetDriverEntryPoint;
        cudaGetDriverEntryPoint_ptsz: RuntimeResolver => super::resolve::cudaGetDriverEntryPoint_ptsz;
        cudaGetDriverEntryPointByVersion: RuntimeResolver => super::resolve::cudaGetDriverEntryPointByVersion;
        cudaGetDriverEntryPointByVersion_ptsz: RuntimeResolver => super::resolve::cudaGetDriverEntryPointByVersion_ptsz;
    }
}

use oomtrace_proto::EventKind;

// Silence "unused" for types only some signatures use.
#[allow(dead_code)]
type _Unused = (c_char, *const c_char);
