//! The fixed-size `Event`: one allocation, free, mapping or marker, as the shim saw it.
//!
//! Byte layout (64 bytes, little-endian), written by [`Event::encode`]:
//!
//! ```text
//! off size field   meaning
//!   0    8 seq     per-process order, stamped by the shim's drain thread (0 = unstamped)
//!   8    8 ts_ns   CLOCK_MONOTONIC nanoseconds
//!  16    8 ptr     device pointer, VMM handle or VA (see EventKind)
//!  24    8 size    bytes
//!  32    8 aux     stream, handle or VA (see EventKind)
//!  40    8 extra   pool, mapping offset or flags (see EventKind)
//!  48    4 stack   StackId (0 = none)
//!  52    4 tid     kernel thread id
//!  56    4 result  CUresult / cudaError_t of the real call (0 = success)
//!  60    2 device  CUDA device ordinal, -1 = unknown or host
//!  62    1 kind    EventKind
//!  63    1 api     Api
//! ```
//!
//! Discriminants of `EventKind` and `Api` are pinned: never renumber, never reuse.

use crate::Error;

/// Size of one encoded event on the wire and in trace files.
pub const EVENT_SIZE: usize = 64;

/// Identifies an interned native stack within one traced process. 0 means "no stack".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u32);

impl StackId {
    pub const NONE: StackId = StackId(0);
    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

/// Identifies a loaded module (shared object or executable) within one traced process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(pub u32);

/// Device ordinal used for events whose device is unknown or that concern host memory.
pub const DEVICE_UNKNOWN: i16 = -1;

/// Device ordinals a process can plausibly have: 0 to `MAX_DEVICES - 1`. CUDA numbers the
/// devices a process sees from 0, and the largest machines show one process 16 GPUs (HGX-2,
/// DGX-2) or some 20 behind PCIe switches; 64 is three times that. An event naming another
/// device (a trace claiming 32,767 of them) is garbage: readers leave it out of the accounting
/// and count it, so that no per-device table or loop grows with what a process claims.
pub const MAX_DEVICES: i16 = 64;

/// Whether `device` is a device ordinal a process can have ([`MAX_DEVICES`]), or
/// [`DEVICE_UNKNOWN`].
pub fn plausible_device(device: i16) -> bool {
    (DEVICE_UNKNOWN..MAX_DEVICES).contains(&device)
}

/// What happened. Field meanings per kind are listed on each variant; unlisted fields are 0.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A successful allocation. `ptr`, `size`, `device`; `aux` = stream (stream-ordered APIs);
    /// `extra` = pool (pool APIs) or flags (host allocations). Recorded after the real call.
    Alloc = 1,
    /// A free. `ptr`; `aux` = stream; `size` when the API passes it. Recorded *before* the real
    /// call, so that another thread that gets the same address back is ordered after it.
    Free = 2,
    /// An allocation that the real call refused. `size` requested, `result`, `device`. For
    /// PyTorch's out-of-memory error (`Api::oomtrace_torch_alloc`): `aux` = stream, `extra` =
    /// what its allocator was allowed to reserve on the device as its out-of-memory observer
    /// said (the `set_per_process_memory_fraction` cap, or the device's total); 0 = not said.
    AllocFailed = 3,
    /// `cuMemCreate`: physical memory. `ptr` = handle, `size`, `device`.
    PhysCreate = 4,
    /// `cuMemRelease`: drops one reference to the handle in `ptr`.
    PhysRelease = 5,
    /// `cuMemRetainAllocationHandle`: adds one reference. `ptr` = handle, `aux` = VA it came from.
    PhysRetain = 6,
    /// `cuMemMap`: `ptr` = VA, `size`, `aux` = handle, `extra` = offset into the handle.
    Map = 7,
    /// `cuMemUnmap`: `ptr` = VA, `size`.
    Unmap = 8,
    /// `cuMemAddressReserve`: `ptr` = VA, `size`, `extra` = alignment.
    VaReserve = 9,
    /// `cuMemAddressFree`: `ptr` = VA, `size`.
    VaFree = 10,
    /// A device memory reading: `ptr` = free bytes, `size` = total bytes (0: not known, as
    /// in a PyTorch snapshot's out-of-memory entry), `device`.
    /// Recorded when the app calls `cuMemGetInfo`, when a device is first seen, and right
    /// after an allocation fails.
    MemInfo = 11,
    /// A step marker (`oomtrace_mark`); the label travels in the `Marker` frame.
    Marker = 12,
    /// `cuInit` returned (`result`).
    Init = 13,
    /// A free whose real call returned an error (`result`); `ptr`. The matching `Free` was
    /// already recorded, so the collector only counts these.
    FreeFailed = 14,
    /// PyTorch's caching allocator took device memory as a segment (`ptr`, `size`, `device`,
    /// `aux` = stream): a segment allocated, or part of an expandable one mapped. Its bytes are
    /// the allocator's reserve; the allocation itself is the `Alloc` of the CUDA call.
    Segment = 15,
    /// PyTorch's caching allocator gave a segment (or a mapped part) back: `ptr`, `size`,
    /// `device`.
    SegmentFree = 16,
}

impl EventKind {
    // Inlined where replay reads every event (the collector is another crate).
    #[inline]
    pub fn from_u8(v: u8) -> Option<EventKind> {
        use EventKind::*;
        Some(match v {
            1 => Alloc,
            2 => Free,
            3 => AllocFailed,
            4 => PhysCreate,
            5 => PhysRelease,
            6 => PhysRetain,
            7 => Map,
            8 => Unmap,
            9 => VaReserve,
            10 => VaFree,
            11 => MemInfo,
            12 => Marker,
            13 => Init,
            14 => FreeFailed,
            15 => Segment,
            16 => SegmentFree,
            _ => return None,
        })
    }
}

/// Which kind of memory an allocation API hands out. Reports keep them apart: pinned host
/// memory is not GPU memory, and VA reservations are not memory at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryClass {
    /// Device memory from a plain or stream-ordered allocation.
    Device,
    /// Unified (managed) memory; counted as device memory of the current device.
    Managed,
    /// Page-locked host memory.
    HostPinned,
    /// VMM physical memory (`cuMemCreate`), live while referenced or mapped.
    Physical,
    /// A tensor inside PyTorch's caching allocator (its trace tracker): device memory already
    /// counted in the segment that holds it, so never counted in the device's totals again.
    Tensor,
    /// Not an allocation (VA reservations, mappings, markers, queries).
    None,
}

impl MemoryClass {
    pub fn name(self) -> &'static str {
        match self {
            MemoryClass::Device => "device",
            MemoryClass::Managed => "managed",
            MemoryClass::HostPinned => "host_pinned",
            MemoryClass::Physical => "vmm_physical",
            MemoryClass::Tensor => "tensor",
            MemoryClass::None => "none",
        }
    }
    /// True for memory that occupies the GPU of its own (not a tensor inside a segment).
    pub fn on_device(self) -> bool {
        matches!(
            self,
            MemoryClass::Device | MemoryClass::Managed | MemoryClass::Physical
        )
    }
}

macro_rules! apis {
    ($( $variant:ident = $val:literal, $name:literal, $class:ident; )*) => {
        /// The API function through which the event was seen (outermost oomtrace hook).
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        pub enum Api { Unknown = 0, $( $variant = $val, )* }

        impl Api {
            /// One load from a table built at compile time: small enough to inline where every
            /// event is decoded (the `match` it is built from was a call per event).
            #[inline]
            pub fn from_u8(v: u8) -> Api {
                API_OF_BYTE[v as usize]
            }
            const fn from_u8_by_match(v: u8) -> Api {
                match v { $( $val => Api::$variant, )* _ => Api::Unknown }
            }
            /// The exact C symbol name.
            pub fn name(self) -> &'static str {
                match self { Api::Unknown => "unknown", $( Api::$variant => $name, )* }
            }
            /// The kind of memory this API allocates (for allocating APIs): a table, as
            /// [`Api::from_u8`] (asked several times per event by the model and detectors).
            #[inline]
            pub fn memory_class(self) -> MemoryClass {
                CLASS_OF_API[self as usize]
            }
            const fn memory_class_by_match(self) -> MemoryClass {
                match self { Api::Unknown => MemoryClass::None, $( Api::$variant => MemoryClass::$class, )* }
            }
            /// Every known API, in discriminant order.
            pub const ALL: &'static [Api] = &[ $( Api::$variant, )* ];
        }

        /// [`Api::from_u8`] for every byte.
        static API_OF_BYTE: [Api; 256] = {
            let mut t = [Api::Unknown; 256];
            let mut i = 0;
            while i < 256 {
                t[i] = Api::from_u8_by_match(i as u8);
                i += 1;
            }
            t
        };

        /// [`Api::memory_class`] by discriminant.
        static CLASS_OF_API: [MemoryClass; 256] = {
            let mut t = [MemoryClass::None; 256];
            let mut i = 0;
            while i < 256 {
                t[i] = Api::from_u8_by_match(i as u8).memory_class_by_match();
                i += 1;
            }
            t
        };
    };
}

apis! {
    // Driver API: 1..=63.
    cuMemAlloc_v2 = 1, "cuMemAlloc_v2", Device;
    cuMemAllocPitch_v2 = 2, "cuMemAllocPitch_v2", Device;
    cuMemAllocManaged = 3, "cuMemAllocManaged", Managed;
    cuMemFree_v2 = 4, "cuMemFree_v2", Device;
    cuMemAllocAsync = 5, "cuMemAllocAsync", Device;
    cuMemAllocAsync_ptsz = 6, "cuMemAllocAsync_ptsz", Device;
    cuMemAllocFromPoolAsync = 7, "cuMemAllocFromPoolAsync", Device;
    cuMemAllocFromPoolAsync_ptsz = 8, "cuMemAllocFromPoolAsync_ptsz", Device;
    cuMemFreeAsync = 9, "cuMemFreeAsync", Device;
    cuMemFreeAsync_ptsz = 10, "cuMemFreeAsync_ptsz", Device;
    cuMemCreate = 11, "cuMemCreate", Physical;
    cuMemRelease = 12, "cuMemRelease", Physical;
    cuMemRetainAllocationHandle = 13, "cuMemRetainAllocationHandle", Physical;
    cuMemMap = 14, "cuMemMap", None;
    cuMemUnmap = 15, "cuMemUnmap", None;
    cuMemAddressReserve = 16, "cuMemAddressReserve", None;
    cuMemAddressFree = 17, "cuMemAddressFree", None;
    cuMemHostAlloc = 18, "cuMemHostAlloc", HostPinned;
    cuMemAllocHost_v2 = 19, "cuMemAllocHost_v2", HostPinned;
    cuMemFreeHost = 20, "cuMemFreeHost", HostPinned;
    cuMemGetInfo_v2 = 21, "cuMemGetInfo_v2", None;
    cuInit = 22, "cuInit", None;
    // Runtime API: 64..=95.
    cudaMalloc = 64, "cudaMalloc", Device;
    cudaFree = 65, "cudaFree", Device;
    cudaMallocAsync = 66, "cudaMallocAsync", Device;
    cudaMallocAsync_ptsz = 67, "cudaMallocAsync_ptsz", Device;
    cudaFreeAsync = 68, "cudaFreeAsync", Device;
    cudaFreeAsync_ptsz = 69, "cudaFreeAsync_ptsz", Device;
    cudaMallocManaged = 70, "cudaMallocManaged", Managed;
    cudaMallocPitch = 71, "cudaMallocPitch", Device;
    cudaMallocHost = 72, "cudaMallocHost", HostPinned;
    cudaHostAlloc = 73, "cudaHostAlloc", HostPinned;
    cudaFreeHost = 74, "cudaFreeHost", HostPinned;
    // oomtrace's own entry points: 96..=127.
    oomtrace_malloc = 96, "oomtrace_malloc", Device;
    oomtrace_free = 97, "oomtrace_free", Device;
    oomtrace_mark = 98, "oomtrace_mark", None;
    // PyTorch's caching allocator, seen through oomtrace's trace tracker (`--torch`).
    oomtrace_torch_alloc = 99, "oomtrace_torch_alloc", Tensor;
    oomtrace_torch_free = 100, "oomtrace_torch_free", Tensor;
    oomtrace_torch_segment = 101, "oomtrace_torch_segment", None;
}

/// One event. See the module docs for the byte layout and `EventKind` for field meanings.
/// `repr(C)`: in memory too the fields lie in the order and at the offsets of that layout, so
/// a producer that stores an event into a queue slot stores it in eight words (the tail's
/// result, device, kind and api are one).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub seq: u64,
    pub ts_ns: u64,
    pub ptr: u64,
    pub size: u64,
    pub aux: u64,
    pub extra: u64,
    pub stack: StackId,
    pub tid: u32,
    pub result: i32,
    pub device: i16,
    /// Raw `EventKind` value; unknown values are kept so that newer shims stay readable.
    pub kind: u8,
    /// Raw `Api` value.
    pub api: u8,
}

impl Event {
    pub const fn new(kind: EventKind, api: Api) -> Event {
        Event {
            seq: 0,
            ts_ns: 0,
            ptr: 0,
            size: 0,
            aux: 0,
            extra: 0,
            stack: StackId::NONE,
            tid: 0,
            result: 0,
            device: DEVICE_UNKNOWN,
            kind: kind as u8,
            api: api as u8,
        }
    }

    #[inline]
    pub fn kind(&self) -> Option<EventKind> {
        EventKind::from_u8(self.kind)
    }

    #[inline]
    pub fn api(&self) -> Api {
        Api::from_u8(self.api)
    }

    #[inline]
    pub fn encode(&self, out: &mut [u8; EVENT_SIZE]) {
        out[0..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8..16].copy_from_slice(&self.ts_ns.to_le_bytes());
        out[16..24].copy_from_slice(&self.ptr.to_le_bytes());
        out[24..32].copy_from_slice(&self.size.to_le_bytes());
        out[32..40].copy_from_slice(&self.aux.to_le_bytes());
        out[40..48].copy_from_slice(&self.extra.to_le_bytes());
        out[48..52].copy_from_slice(&self.stack.0.to_le_bytes());
        out[52..56].copy_from_slice(&self.tid.to_le_bytes());
        out[56..60].copy_from_slice(&self.result.to_le_bytes());
        out[60..62].copy_from_slice(&self.device.to_le_bytes());
        out[62] = self.kind;
        out[63] = self.api;
    }

    #[inline]
    pub fn decode(b: &[u8]) -> Result<Event, Error> {
        let b: &[u8; EVENT_SIZE] = b
            .get(..EVENT_SIZE)
            .and_then(|s| s.try_into().ok())
            .ok_or(Error::Malformed("event shorter than 64 bytes"))?;
        let u64_at = |o: usize| {
            u64::from_le_bytes([
                b[o],
                b[o + 1],
                b[o + 2],
                b[o + 3],
                b[o + 4],
                b[o + 5],
                b[o + 6],
                b[o + 7],
            ])
        };
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        Ok(Event {
            seq: u64_at(0),
            ts_ns: u64_at(8),
            ptr: u64_at(16),
            size: u64_at(24),
            aux: u64_at(32),
            extra: u64_at(40),
            stack: StackId(u32_at(48)),
            tid: u32_at(52),
            result: u32_at(56) as i32,
            device: i16::from_le_bytes([b[60], b[61]]),
            kind: b[62],
            api: b[63],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `repr(C)` lays the fields out in memory as the encoding does (see the module doc): a
    /// producer storing an event in words relies on it.
    #[test]
    fn memory_layout_is_the_encoding_layout() {
        use std::mem::offset_of;
        assert_eq!(std::mem::size_of::<Event>(), EVENT_SIZE);
        let at = [
            (offset_of!(Event, seq), 0),
            (offset_of!(Event, ts_ns), 8),
            (offset_of!(Event, ptr), 16),
            (offset_of!(Event, size), 24),
            (offset_of!(Event, aux), 32),
            (offset_of!(Event, extra), 40),
            (offset_of!(Event, stack), 48),
            (offset_of!(Event, tid), 52),
            (offset_of!(Event, result), 56),
            (offset_of!(Event, device), 60),
            (offset_of!(Event, kind), 62),
            (offset_of!(Event, api), 63),
        ];
        for (got, want) in at {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn event_roundtrips_every_field() {
        let e = Event {
            seq: 1,
            ts_ns: 2,
            ptr: 0xdead_beef_0000,
            size: 4 << 30,
            aux: 5,
            extra: 6,
            stack: StackId(7),
            tid: 8,
            result: -2,
            device: 3,
            kind: EventKind::Map as u8,
            api: Api::cuMemMap as u8,
        };
        let mut buf = [0u8; EVENT_SIZE];
        e.encode(&mut buf);
        assert_eq!(Event::decode(&buf).unwrap(), e);
        assert!(Event::decode(&buf[..63]).is_err());
    }

    #[test]
    fn api_values_are_pinned() {
        // Changing any of these breaks every trace file written so far.
        assert_eq!(Api::cuMemAlloc_v2 as u8, 1);
        assert_eq!(Api::cuInit as u8, 22);
        assert_eq!(Api::cudaMalloc as u8, 64);
        assert_eq!(Api::cudaFreeHost as u8, 74);
        assert_eq!(Api::oomtrace_mark as u8, 98);
        assert_eq!(Api::oomtrace_torch_alloc as u8, 99);
        assert_eq!(Api::oomtrace_torch_free as u8, 100);
        assert_eq!(Api::oomtrace_torch_segment as u8, 101);
        assert_eq!(
            Api::oomtrace_torch_alloc.memory_class(),
            MemoryClass::Tensor
        );
        assert!(!MemoryClass::Tensor.on_device());
        for api in Api::ALL {
            assert_eq!(Api::from_u8(*api as u8), *api, "{}", api.name());
        }
        assert_eq!(Api::from_u8(200), Api::Unknown);
    }

    #[test]
    fn kinds_are_pinned() {
        assert_eq!(EventKind::FreeFailed as u8, 14);
        assert_eq!(EventKind::Segment as u8, 15);
        assert_eq!(EventKind::SegmentFree as u8, 16);
    }

    #[test]
    fn kinds_roundtrip() {
        for v in 0..=255u8 {
            if let Some(k) = EventKind::from_u8(v) {
                assert_eq!(k as u8, v);
            }
        }
    }
}
