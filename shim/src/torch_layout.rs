//! What oomtrace reads of PyTorch's and libstdc++'s memory layouts, as plain data: the
//! `TraceEntry` actions and field offsets (torch 2.4 to 2.15, x86-64 libstdc++) and the
//! `std::function` the trace tracker is passed in. A leaf that names nothing, so that the
//! real-PyTorch tier (`tests/it/torch/every_version.rs`) can include this very file and compare
//! it with what a program compiled against the release's headers prints; the shim itself is a
//! cdylib only (an rlib beside it would keep cargo from optimizing it as one program).

use std::ffi::c_int;

/// `TraceEntry::Action` values (torch 2.4 to 2.15): what PyTorch's allocator tells its trace
/// trackers; `torch_tracker.rs` decodes them into the recording API's calls.
pub mod action {
    pub const ALLOC: u32 = 0;
    pub const FREE_REQUESTED: u32 = 1;
    pub const FREE_COMPLETED: u32 = 2;
    pub const SEGMENT_ALLOC: u32 = 3;
    pub const SEGMENT_FREE: u32 = 4;
    pub const SEGMENT_MAP: u32 = 5;
    pub const SEGMENT_UNMAP: u32 = 6;
    pub const OOM: u32 = 8;
}

/// Byte offsets of the `TraceEntry` fields the tracker reads.
pub mod offset {
    pub const ACTION: usize = 0;
    pub const DEVICE: usize = 4;
    pub const ADDR: usize = 8;
    pub const STREAM: usize = 32;
    pub const SIZE: usize = 40;
}

/// libstdc++'s `_Any_data`: the functor's in-place storage.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AnyData(pub [usize; 2]);

pub type Manager = unsafe extern "C" fn(*mut AnyData, *const AnyData, c_int) -> bool;
pub type Invoker = unsafe extern "C" fn(*const AnyData, *const u8);

/// libstdc++'s `std::function<void(const TraceEntry&)>` (32 bytes): the functor storage,
/// then `_M_manager`, then `_M_invoker`. A non-null manager is what makes it non-empty.
#[repr(C)]
pub struct StdFunction {
    pub functor: AnyData,
    pub manager: Option<Manager>,
    pub invoker: Option<Invoker>,
}
