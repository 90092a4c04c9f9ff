//! The model: what the collector knows about one traced process: its live allocations, VMM
//! handles and mappings, call sites, and per-device totals. Fed one frame at a time, in
//! stream order.
//!
//! The bottom layer: it imports nothing else of the crate, so accounting can be read, tested
//! and replayed (`oomtrace export`) without the detectors. What the analysis needs to know
//! (an allocation, a free, a step, a failure) is told to an [`Observer`] passed to
//! [`Process::apply`]; the model neither owns nor knows who listens.
//!
//! - [`trace`]: replays a trace file into processes, each beside its observer.
//! - [`history`]: shows each event of such a replay to a visitor (exporters).
//!
//! Memory is O(live allocations + sites + modules), never O(events): events only update
//! counters and the live tables.
//!
//! Accounting rules:
//! - Plain allocations are keyed by pointer (unique per process under unified addressing).
//! - Tensors inside PyTorch's caching allocator (`MemoryClass::Tensor`, from oomtrace's trace
//!   tracker) live in their own table: the first tensor of a segment has the segment's
//!   address. Their bytes are counted apart (`tensor_bytes`), never in the device's
//!   `live_bytes`, which the segments that hold them already fill. The allocator's own
//!   segment events (`Segment`, `SegmentFree`) give its reserve (`torch_reserved_bytes`).
//! - VMM physical memory (`cuMemCreate`) is live while the handle has references (create and
//!   retain add one, release removes one) *or* is mapped: PyTorch and NCCL release while
//!   mapped. Handle values are reused by the driver, so a freed handle is forgotten at once.
//! - A free of an unknown pointer is counted as unmatched, never guessed at.

use std::collections::BTreeMap;

use oomtrace_proto::launch::Launch;
use oomtrace_proto::python::{CodeDef, PyFrame};
use oomtrace_proto::wire::{Frame, GoodbyeReason, Hello, Lost, ModuleDef};
use oomtrace_proto::{
    plausible_device, Api, Event, EventKind, MemoryClass, StackId, DEVICE_UNKNOWN,
};
use rustc_hash::FxHashMap;

mod error;
pub mod history;
mod observer;
pub mod trace;

pub use error::Error;
pub use observer::{Alloc, Free, MemInfo, Observer, OutOfMemory, TorchMemory};

/// A deduplicated call site within one process. 0 = no stack recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SiteId(pub u32);

/// The pseudo-device under which pinned host memory is reported.
pub const HOST_DEVICE: i16 = DEVICE_UNKNOWN;

/// CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation share the value 2.
pub const OUT_OF_MEMORY: i32 = 2;

#[derive(Clone, Debug)]
pub struct LiveAlloc {
    pub size: u64,
    pub device: i16,
    pub site: SiteId,
    pub api: Api,
    pub ts_ns: u64,
    /// What the observer returned at its birth (the analysis's epoch), handed back at its free.
    pub birth: u32,
    /// PyTorch's caching allocator said (a `Segment` event at this address) that this
    /// allocation is one of its segments: reserve, not memory a line of code holds.
    pub reserve: bool,
}

#[derive(Clone, Debug)]
pub struct PhysHandle {
    pub size: u64,
    pub device: i16,
    pub site: SiteId,
    /// As [`LiveAlloc::birth`].
    pub birth: u32,
    pub ts_ns: u64,
    pub refs: u32,
    pub mappings: u32,
}

#[derive(Clone, Debug)]
pub struct Mapping {
    pub size: u64,
    pub handle: u64,
    pub offset: u64,
}

/// Totals of one device (or of pinned host memory under `HOST_DEVICE`).
#[derive(Clone, Debug, Default)]
pub struct DeviceState {
    /// Tracked live bytes now.
    pub live_bytes: u64,
    pub live_count: u64,
    pub peak_bytes: u64,
    pub peak_ts_ns: u64,
    /// Events attributed to this device.
    pub events: u64,
    pub allocations: u64,
    pub frees: u64,
    pub failed_allocations: u64,
    pub bytes_allocated: u64,
    /// Device capacity and free memory as last reported by the driver.
    pub capacity: Option<u64>,
    pub last_free: Option<u64>,
    /// Address space reserved with `cuMemAddressReserve` (not memory).
    pub reserved_va_bytes: u64,
    /// Physical VMM bytes currently mapped somewhere.
    pub mapped_bytes: u64,
    /// Live tensors of PyTorch's caching allocator (its trace tracker): memory in use inside
    /// the segments counted in `live_bytes`.
    pub tensor_bytes: u64,
    pub tensor_count: u64,
    pub tensor_peak_bytes: u64,
    /// What PyTorch's caching allocator holds as segments, from its own segment events
    /// (None until the first one): its reserve, and nothing else's.
    pub torch_reserved_bytes: Option<u64>,
    /// How many segments make up `torch_reserved_bytes`.
    pub torch_segments: u64,
    /// The tensors' counterparts of the counters below (allocations, frees, temporaries, sizes,
    /// who held them at their peak): what a report about tensors reads.
    pub tensor_tally: Tally,
    /// Allocations freed in the step (between two markers) they were made in.
    pub temporary: u64,
    /// Allocations and bytes by size, in power-of-two buckets: index `i` holds sizes in
    /// `[2^(i-1), 2^i)` (0 holds size 0). Grown on demand, at most 65 entries.
    pub size_buckets: Vec<(u64, u64)>,
    /// The largest sites (site, live bytes, live allocations) at the device's peak, at most
    /// [`PEAK_SITES`], largest first. Taken when memory first falls from a new peak that is
    /// at least 1/64 (and 64 KiB) above the last snapshot's, so it shows who held memory
    /// within 1/64 of the peak; while `peak_pending`, the peak is now.
    pub peak_sites: Vec<(SiteId, u64, u64)>,
    pub peak_pending: bool,
    /// Live bytes when `peak_sites` was taken.
    pub peak_snap_bytes: u64,
}

/// Call sites kept per device from the moment of its peak.
pub const PEAK_SITES: usize = 32;

/// A device's counters for PyTorch's tensors (the trace tracker's `MemoryClass::Tensor`),
/// kept as [`DeviceState`] keeps them for CUDA allocations: the same questions (how many,
/// how big, who held the peak) asked of tensors instead of the segments that hold them.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub allocations: u64,
    pub frees: u64,
    /// Freed in the step they were made in.
    pub temporary: u64,
    pub bytes_allocated: u64,
    /// As [`DeviceState::size_buckets`].
    pub size_buckets: Vec<(u64, u64)>,
    /// When `DeviceState::tensor_peak_bytes` was reached.
    pub peak_ts_ns: u64,
    /// As [`DeviceState::peak_sites`], for tensor sites at the tensors' peak.
    pub peak_sites: Vec<(SiteId, u64, u64)>,
    pub peak_pending: bool,
    pub peak_snap_bytes: u64,
}

/// Failed allocations of one (API, error, device).
#[derive(Clone, Debug, Default)]
pub struct AllocFailures {
    pub count: u64,
    /// Bytes asked for by the most recent one.
    pub last_size: u64,
    pub last_site: SiteId,
}

/// Per (site, device) aggregates.
#[derive(Clone, Debug, Default)]
pub struct SiteStats {
    pub live_bytes: u64,
    pub live_count: u64,
    pub peak_bytes: u64,
    pub total_bytes: u64,
    pub allocations: u64,
    /// The API that allocated most recently at this site.
    pub api: Option<Api>,
    pub frees: u64,
    /// Frees of allocations made in the same step (see [`DeviceState::temporary`]).
    pub temporary: u64,
    /// Live bytes when the first step marker came (0 for a site first seen after it): the
    /// base of its growth per step.
    pub live_at_first_step: u64,
    /// Allocations made here that PyTorch's caching allocator named its segments (reserve):
    /// a site of the allocator itself, not of a line that holds memory.
    pub reserve_allocations: u64,
    /// Live bytes when the current step began, kept lazily: valid while `step_seen` is the
    /// process's marker count (see [`SiteStats::live_at_last_step`]).
    live_at_step_start: u64,
    step_seen: u64,
}

impl SiteStats {
    /// Live bytes when the last step marker came: the end of the last whole step, before the
    /// teardown a program does at exit. `markers`: the process's count.
    pub fn live_at_last_step(&self, markers: u64) -> u64 {
        if self.step_seen == markers {
            self.live_at_step_start
        } else {
            self.live_bytes
        }
    }

    /// Remembers the live bytes at the start of the step, before the first change in it.
    fn enter_step(&mut self, markers: u64) {
        if self.step_seen != markers {
            self.step_seen = markers;
            self.live_at_step_start = self.live_bytes;
        }
    }
}

/// One frame of a stack, resolved to its module when the stack arrived.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawFrame {
    pub addr: u64,
    /// Index into `Process::modules`, if the address lay in a known module.
    pub module: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct Module {
    pub def: ModuleDef,
    pub gone: bool,
}

/// The tables a call site's frames are read with (sites, modules, Python code objects):
/// what symbolization needs of a process, and no more.
#[derive(Clone, Copy, Debug)]
pub struct Stacks<'a> {
    /// Frames of each site; index = [`SiteId`].
    pub sites: &'a [Vec<RawFrame>],
    pub modules: &'a [Module],
    pub codes: &'a FxHashMap<u32, CodeDef>,
}

impl<'a> From<&'a Process> for Stacks<'a> {
    fn from(p: &'a Process) -> Stacks<'a> {
        Stacks {
            sites: &p.sites,
            modules: &p.modules,
            codes: &p.codes,
        }
    }
}

/// One symbolized frame (filled in by the report's symbolizer). Empty strings and 0 mean
/// unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FrameInfo {
    pub function: String,
    pub file: String,
    pub line: u32,
    /// File name of the module (executable or shared object).
    pub module: String,
    /// Absolute return address in the traced process, hex.
    pub address: String,
    /// Address within the module's file, hex (what `addr2line -e MODULE` takes).
    pub offset: String,
    /// A Python frame (`function` is the code object's qualified name, `line` its source
    /// line, `module` is "python", `offset` the bytecode offset).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub python: bool,
    /// Its module's file changed since the trace was taken (`report::module_file`): no name,
    /// `module` and `offset` say where it was.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub module_changed: bool,
}

/// Whether the module at `path` is the Python interpreter: `libpython3.11.so.1.0` (and any
/// other `libpython*.so*`), or an executable named `python`, `python3`, `python3.11`,
/// `python3.13t`, ... (a statically linked interpreter). Decided from the file name alone, so
/// it works without symbols. Extension modules (`_ctypes.cpython-311-x86_64-linux-gnu.so`),
/// libffi and the user's own libraries are not the interpreter.
pub fn is_interpreter_module(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    if let Some(rest) = name.strip_prefix("libpython") {
        return rest.contains(".so");
    }
    let Some(version) = name.strip_prefix("python") else {
        return false;
    };
    // The version, then the ABI flags of a build variant (debug `d`, free-threaded `t`,
    // the old pymalloc `m`).
    let flags = version.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    flags.chars().all(|c| matches!(c, 'd' | 't' | 'm'))
}

/// Shim stack id -> site, resolved once per stack (when its `StackDef` arrives) and looked up
/// by every allocation event. The shim numbers its stacks 1, 2, 3, ...: ids index a vector,
/// no hashing per event. An id far past the stacks defined so far (a damaged or hostile trace)
/// goes to a map instead, so that memory stays O(stacks) whatever the ids.
#[derive(Debug, Default)]
struct StackSites {
    /// Site by id, `UNDEFINED` where none was defined (an id defined past its end is in
    /// `sparse`).
    dense: Vec<u32>,
    sparse: FxHashMap<u32, SiteId>,
    defined: usize,
}

const UNDEFINED: u32 = u32::MAX;

impl StackSites {
    fn insert(&mut self, id: u32, site: SiteId) {
        self.defined += 1;
        let i = id as usize;
        if i >= self.dense.len() && i <= 2 * self.defined + 1024 {
            self.dense.resize(i + 1, UNDEFINED);
        }
        match self.dense.get_mut(i) {
            Some(d) => {
                *d = site.0;
                // A later definition replaces an earlier one, wherever that one went.
                if !self.sparse.is_empty() {
                    self.sparse.remove(&id);
                }
            }
            None => {
                self.sparse.insert(id, site);
            }
        }
    }

    fn get(&self, id: u32) -> Option<SiteId> {
        match self.dense.get(id as usize) {
            Some(&s) if s != UNDEFINED => Some(SiteId(s)),
            _ => self.sparse.get(&id).copied(),
        }
    }
}

/// A stack's identity as a call site: its frames less those inside the Python interpreter,
/// and each Python frame by its source line rather than its bytecode offset.
///
/// CPython specialises a call after a few executions (3.11+): the same Python line then
/// reaches the same native function through other interpreter functions (`PyObject_Vectorcall`
/// and `method_vectorcall_O` at first, a direct call after), and the frame's last instruction
/// moves from `CALL` to the specialised `PRECALL` of the same line. Counted apart, one leak
/// would be split into two sites (53 + 7 allocations) and the small one reported, then
/// resolved. Every frame outside the interpreter (extension modules, libffi, the user's own
/// libraries) still counts, and so does the Python line; two calls on one line that reach
/// the same native frames are one site (the report names lines anyway). A frame whose code
/// object was never sent keeps its offset.
fn site_key(
    frames: &[RawFrame],
    interpreter: &[bool],
    codes: &FxHashMap<u32, CodeDef>,
) -> Vec<RawFrame> {
    /// Marks an offset that holds a line instead.
    const LINE: u32 = 1 << 31;
    frames
        .iter()
        .filter(|f| {
            !f.module
                .is_some_and(|m| interpreter.get(m).copied().unwrap_or(false))
        })
        .map(|f| match PyFrame::decode(f.addr) {
            Some(py) => {
                let line = codes.get(&py.code).and_then(|c| c.line_at(py.offset));
                RawFrame {
                    addr: PyFrame {
                        offset: line.map_or(py.offset, |l| l | LINE),
                        ..py
                    }
                    .encode(),
                    module: None,
                }
            }
            None => f.clone(),
        })
        .collect()
}

/// How a process's stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndState {
    /// Still connected (live collector) or the trace ends while it was.
    Running,
    /// Said goodbye.
    Exited(Option<GoodbyeReason>),
    /// Connection closed without a goodbye: killed, crashed, or its collector link broke.
    Abrupt,
    /// Began its end of stream (its counter page, or its `Made` frame, says so: it exited,
    /// or detached), but the rest of its stream, goodbye included, never arrived: its shim
    /// gave up on a starved or stopped collector, or the connection was cut. What is
    /// missing is counted in [`Process::lost_events`].
    Unheard(GoodbyeReason),
    /// Dropped for sending garbage.
    ProtocolError,
}

#[derive(Debug)]
pub struct Process {
    pub conn: u32,
    pub hello: Hello,
    /// Its rank in a distributed job, from the launcher's variables in `hello`.
    pub launch: Launch,
    pub end: EndState,
    pub devices: BTreeMap<i16, DeviceState>,
    pub live: FxHashMap<u64, LiveAlloc>,
    /// Live tensors of PyTorch's caching allocator, by address (see the module doc).
    pub tensors: FxHashMap<u64, LiveAlloc>,
    pub handles: FxHashMap<u64, PhysHandle>,
    /// Mappings by VA start, ordered for range unmaps.
    pub mappings: BTreeMap<u64, Mapping>,
    pub reservations: FxHashMap<u64, (u64, i16)>,
    pub modules: Vec<Module>,
    /// Python code objects by the shim's code id (frames in `sites` refer to them).
    pub codes: FxHashMap<u32, CodeDef>,
    module_index: FxHashMap<u32, usize>,
    /// Shim stack id -> site (the shim may send one stack under several ids).
    stack_sites: StackSites,
    /// A stack's identity (`site_key`: its frames less the interpreter's own) -> site.
    site_index: FxHashMap<Vec<RawFrame>, SiteId>,
    /// Frames of each site as first seen, interpreter frames included (the symbolizer places
    /// Python frames by them); index = SiteId (0 is the empty "no stack" site).
    pub sites: Vec<Vec<RawFrame>>,
    /// Per module (index as `modules`): whether it is the Python interpreter itself.
    interpreter_modules: Vec<bool>,
    /// Stacks the shim sent that joined a site whose first stack differs from theirs (inside
    /// the interpreter, or in the instruction of a Python line): sites that `site_key` kept
    /// from splitting.
    pub merged_stacks: u64,
    pub site_stats: FxHashMap<(SiteId, i16), SiteStats>,
    /// The sites of `site_stats` by device, in the order they first allocated there: what a
    /// per-device question reads, so that it costs that device's sites, not every site of
    /// every device.
    device_sites: FxHashMap<i16, Vec<SiteId>>,
    pub lost: Lost,
    pub events: u64,
    pub unmatched_frees: u64,
    pub failed_frees: u64,
    /// Failed allocations by (API, error code, device): the error is what tells a user "no
    /// driver" from "out of memory", so each kind is counted apart.
    pub alloc_failures: BTreeMap<(Api, i32, i16), AllocFailures>,
    pub unknown_stacks: u64,
    /// Events left out of the accounting because they name a device no process can have
    /// (`oomtrace_proto::MAX_DEVICES`), and the first such device: garbage, never a table
    /// entry or a loop.
    pub implausible_device_events: u64,
    pub implausible_device_first: i16,
    pub markers: u64,
    pub last_marker: Option<String>,
    /// When the current step began (the last marker; 0 before the first).
    pub step_start_ts_ns: u64,
    pub first_ts_ns: u64,
    pub last_ts_ns: u64,
    pub last_seq: u64,
    pub cuda_initialized: bool,
    /// Step markers received as Marker frames (those inside Events frames count in `events`).
    pub marker_frames: u64,
    /// Events and markers the process made, delivered or not (its last `Made` frame); None
    /// from shims (or traces) that do not say.
    pub made: Option<u64>,
    /// How it began its end of stream, if its last `Made` frame says.
    pub ending: Option<GoodbyeReason>,
    /// PyTorch's own statistics, the last reading of each device (`TorchMemory` frames, sent
    /// by the Python step hook after each step marker).
    pub torch_memory: BTreeMap<i16, TorchMemory>,
    /// Readings that named a device no process can have (left out, like such events).
    pub implausible_torch_memory: u64,
}

impl Process {
    pub fn new(conn: u32, hello: Hello) -> Process {
        Process {
            conn,
            launch: Launch::from_vars(&hello.launch),
            hello,
            end: EndState::Running,
            devices: BTreeMap::new(),
            live: FxHashMap::default(),
            tensors: FxHashMap::default(),
            handles: FxHashMap::default(),
            mappings: BTreeMap::new(),
            reservations: FxHashMap::default(),
            modules: Vec::new(),
            codes: FxHashMap::default(),
            module_index: FxHashMap::default(),
            stack_sites: StackSites::default(),
            site_index: FxHashMap::default(),
            sites: vec![Vec::new()],
            interpreter_modules: Vec::new(),
            merged_stacks: 0,
            site_stats: FxHashMap::default(),
            device_sites: FxHashMap::default(),
            lost: Lost::default(),
            events: 0,
            unmatched_frees: 0,
            failed_frees: 0,
            alloc_failures: BTreeMap::new(),
            unknown_stacks: 0,
            implausible_device_events: 0,
            implausible_device_first: 0,
            markers: 0,
            last_marker: None,
            step_start_ts_ns: 0,
            first_ts_ns: 0,
            last_ts_ns: 0,
            last_seq: 0,
            cuda_initialized: false,
            marker_frames: 0,
            made: None,
            ending: None,
            torch_memory: BTreeMap::new(),
            implausible_torch_memory: 0,
        }
    }

    pub fn pid(&self) -> u32 {
        self.hello.pid
    }

    /// The tables its call sites are read with.
    pub fn stacks(&self) -> Stacks<'_> {
        Stacks::from(self)
    }

    /// The command line, as one string.
    pub fn command(&self) -> String {
        if self.hello.argv.is_empty() {
            self.hello.exe.clone()
        } else {
            self.hello.argv.join(" ")
        }
    }

    /// Launcher variables learnt after the Hello (the rank `init_process_group` was given):
    /// each replaces the Hello's variable of the same name, and the rank is read again. Only
    /// the names the shim records are kept: a stream cannot grow the list without bound.
    fn learn_launch(&mut self, vars: &[(String, String)]) {
        let known = |name: &String| oomtrace_proto::launch::LAUNCH_VARS.contains(&name.as_str());
        for (name, value) in vars.iter().filter(|(name, _)| known(name)) {
            match self.hello.launch.iter_mut().find(|(k, _)| k == name) {
                Some(old) => old.1.clone_from(value),
                None => self.hello.launch.push((name.clone(), value.clone())),
            }
        }
        self.launch = Launch::from_vars(&self.hello.launch);
    }

    /// What the process made (a `Made` frame, or an `Incomplete` record's table). The
    /// largest count wins: the collector's reading of the counter page comes after the
    /// shim's own frame and may count events made since.
    pub fn learn_made(&mut self, events: u64, ending: u8) {
        self.made = Some(self.made.map_or(events, |m| m.max(events)));
        if let Some(r) = GoodbyeReason::from_u8(ending) {
            self.ending = Some(r);
        }
    }

    /// Events (and Marker frames) received.
    pub fn received(&self) -> u64 {
        self.events + self.marker_frames
    }

    /// Events that are missing: what the process made less what was received, whatever
    /// the path (counted lost by the shim, left behind when its end of stream gave up, cut
    /// with a connection, not written to a full disk); what the shim counted when the trace
    /// does not say what it made (older shims).
    pub fn lost_events(&self) -> u64 {
        let counted = self.lost.events;
        match self.made {
            Some(made) => made.saturating_sub(self.received()).max(counted),
            None => counted,
        }
    }

    /// How a stream that closed without its goodbye ended: [`EndState::Unheard`] if the
    /// process had begun its end of stream, else [`EndState::Abrupt`].
    pub fn end_without_goodbye(&self) -> EndState {
        match self.ending {
            Some(r) => EndState::Unheard(r),
            None => EndState::Abrupt,
        }
    }

    /// Applies one frame of this process's stream, telling `obs` what happened.
    pub fn apply<O: Observer + ?Sized>(&mut self, frame: &Frame<'_>, obs: &mut O) {
        match frame {
            Frame::Events(batch) => {
                for ev in batch.iter() {
                    self.apply_event(&ev, obs);
                }
            }
            Frame::StackDef { id, frames } => self.define_stack(*id, frames),
            Frame::ModuleDef(def) => self.define_module(def.clone()),
            Frame::CodeDef(def) => {
                self.codes.insert(def.id, def.clone());
            }
            Frame::ModuleGone { id } => {
                if let Some(&i) = self.module_index.get(id) {
                    self.modules[i].gone = true;
                    self.module_index.remove(id);
                }
            }
            Frame::Marker {
                seq, ts_ns, label, ..
            } => {
                self.last_marker = Some(label.clone());
                self.marker_frames += 1;
                self.touch(*seq, *ts_ns);
                self.on_marker(*ts_ns, obs);
            }
            Frame::Lost(l) => self.lost = l.clone(),
            Frame::Goodbye { reason, last_seq } => {
                self.end = EndState::Exited(GoodbyeReason::from_u8(*reason));
                self.last_seq = self.last_seq.max(*last_seq);
            }
            Frame::Launch(vars) => self.learn_launch(vars),
            Frame::Made { events, ending } => self.learn_made(*events, *ending),
            Frame::TorchMemory(m) => self.on_torch_memory(m, obs),
            Frame::Hello(_) | Frame::Unknown { .. } => {}
        }
    }

    fn touch(&mut self, seq: u64, ts: u64) {
        if self.first_ts_ns == 0 {
            self.first_ts_ns = ts;
        }
        self.last_ts_ns = self.last_ts_ns.max(ts);
        self.last_seq = self.last_seq.max(seq);
    }

    fn define_module(&mut self, def: ModuleDef) {
        let id = def.id;
        self.interpreter_modules
            .push(is_interpreter_module(&def.path));
        self.modules.push(Module { def, gone: false });
        self.module_index.insert(id, self.modules.len() - 1);
    }

    fn module_of(&self, addr: u64) -> Option<usize> {
        // Return addresses point after the call; look up the call instruction.
        let a = addr.wrapping_sub(1);
        self.module_index.values().copied().find(|&i| {
            let d = &self.modules[i].def;
            d.start <= a && a < d.end
        })
    }

    fn define_stack(&mut self, id: StackId, frames: &[u64]) {
        let raw: Vec<RawFrame> = frames
            .iter()
            .map(|&addr| RawFrame {
                addr,
                module: if PyFrame::decode(addr).is_some() {
                    None
                } else {
                    self.module_of(addr)
                },
            })
            .collect();
        let key = site_key(&raw, &self.interpreter_modules, &self.codes);
        let site = match self.site_index.get(&key) {
            Some(&s) => {
                if self.sites[s.0 as usize] != raw {
                    self.merged_stacks += 1;
                }
                s
            }
            None => {
                let s = SiteId(self.sites.len() as u32);
                self.sites.push(raw);
                self.site_index.insert(key, s);
                s
            }
        };
        self.stack_sites.insert(id.0, site);
    }

    /// The call site a shim stack id stands for (0 if none or not yet defined); counts nothing.
    pub fn stack_site(&self, stack: StackId) -> SiteId {
        self.stack_sites.get(stack.0).unwrap_or_default()
    }

    fn site_of(&mut self, stack: StackId) -> SiteId {
        if stack.is_none() {
            return SiteId(0);
        }
        match self.stack_sites.get(stack.0) {
            Some(s) => s,
            None => {
                self.unknown_stacks += 1;
                SiteId(0)
            }
        }
    }

    fn device(&mut self, d: i16) -> &mut DeviceState {
        self.devices.entry(d).or_default()
    }

    /// A step marker: counted, and told to the observer.
    fn on_marker<O: Observer + ?Sized>(&mut self, ts: u64, obs: &mut O) {
        self.markers += 1;
        self.step_start_ts_ns = self.step_start_ts_ns.max(ts);
        if self.markers == 1 {
            // Once per process: the base of each site's growth per step.
            for s in self.site_stats.values_mut() {
                s.live_at_first_step = s.live_bytes;
            }
        }
        obs.step(self, ts);
    }

    /// PyTorch's own statistics of one device: the device's last reading, told to the
    /// observer. A device no process can have is garbage: counted, never a table entry.
    fn on_torch_memory<O: Observer + ?Sized>(
        &mut self,
        m: &oomtrace_proto::wire::TorchMemory,
        obs: &mut O,
    ) {
        if !(0..oomtrace_proto::MAX_DEVICES).contains(&m.device) {
            self.implausible_torch_memory += 1;
            return;
        }
        let reading = TorchMemory {
            device: m.device,
            ts_ns: m.ts_ns,
            step: self.markers,
            allocated: m.allocated,
            max_allocated: m.max_allocated,
            reserved: m.reserved,
        };
        self.torch_memory.insert(m.device, reading);
        obs.torch_memory(self, &reading);
    }

    /// A new live allocation: told to the observer (before it counts in the totals), then
    /// the totals and site aggregates. Returns what the observer said (its birth stamp).
    /// `count_event`: the event counts on the device too (in the lookup this makes anyway).
    fn add_live<O: Observer + ?Sized>(
        &mut self,
        obs: &mut O,
        (device, site, size, ts, api, tid): (i16, SiteId, u64, u64, Api, u32),
        count_event: bool,
    ) -> u32 {
        let (before, capacity) = if count_event {
            let d = self.device(device);
            d.events += 1;
            (d.live_bytes, d.capacity)
        } else {
            self.devices
                .get(&device)
                .map_or((0, None), |d| (d.live_bytes, d.capacity))
        };
        let birth = obs.alloc(
            self,
            &Alloc {
                device,
                site,
                size,
                api,
                ts_ns: ts,
                tid,
                device_live_before: before,
                capacity,
            },
        );
        let dev = self.device(device);
        if api.memory_class() == MemoryClass::Tensor {
            dev.tensor_bytes = dev.tensor_bytes.saturating_add(size);
            dev.tensor_count += 1;
            let t = &mut dev.tensor_tally;
            t.allocations += 1;
            t.bytes_allocated = t.bytes_allocated.saturating_add(size);
            count_size(&mut t.size_buckets, size);
            if dev.tensor_bytes > dev.tensor_peak_bytes {
                dev.tensor_peak_bytes = dev.tensor_bytes;
                t.peak_ts_ns = ts;
                if snapshot_due(
                    t.peak_sites.is_empty(),
                    t.peak_snap_bytes,
                    dev.tensor_peak_bytes,
                ) {
                    t.peak_pending = true;
                }
            }
        } else {
            dev.live_bytes = dev.live_bytes.saturating_add(size);
            dev.live_count += 1;
            dev.allocations += 1;
            dev.bytes_allocated = dev.bytes_allocated.saturating_add(size);
            count_size(&mut dev.size_buckets, size);
            if dev.live_bytes > dev.peak_bytes {
                dev.peak_bytes = dev.live_bytes;
                dev.peak_ts_ns = ts;
                if snapshot_due(
                    dev.peak_sites.is_empty(),
                    dev.peak_snap_bytes,
                    dev.peak_bytes,
                ) {
                    dev.peak_pending = true;
                }
            }
        }
        let s = match self.site_stats.entry((site, device)) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                self.device_sites.entry(device).or_default().push(site);
                v.insert(SiteStats::default())
            }
        };
        s.enter_step(self.markers);
        s.live_bytes = s.live_bytes.saturating_add(size);
        s.live_count += 1;
        s.total_bytes = s.total_bytes.saturating_add(size);
        s.allocations += 1;
        s.peak_bytes = s.peak_bytes.max(s.live_bytes);
        s.api = Some(api);
        birth
    }

    /// A live allocation gone: the totals and site aggregates, then the observer.
    fn remove_live<O: Observer + ?Sized>(
        &mut self,
        obs: &mut O,
        (device, site, size, api, birth, ts, reserve): (i16, SiteId, u64, Api, u32, u64, bool),
        born_ns: u64,
        count_event: bool,
    ) {
        let tensor = api.memory_class() == MemoryClass::Tensor;
        let temporary = born_ns >= self.step_start_ts_ns;
        // One lookup of the device for a free (this runs for every one), a second only when
        // memory falls from a new peak.
        let dev = self.device(device);
        if count_event {
            dev.events += 1;
        }
        let pending = if tensor {
            dev.tensor_tally.peak_pending
        } else {
            dev.peak_pending
        };
        let dev = if pending {
            // Memory falls from a new peak: who holds it is who held the peak.
            let sites = self.largest_sites(device, PEAK_SITES, tensor);
            let dev = self.device(device);
            if tensor {
                dev.tensor_tally.peak_sites = sites;
                dev.tensor_tally.peak_snap_bytes = dev.tensor_bytes;
                dev.tensor_tally.peak_pending = false;
            } else {
                dev.peak_sites = sites;
                dev.peak_snap_bytes = dev.live_bytes;
                dev.peak_pending = false;
            }
            dev
        } else {
            dev
        };
        if !tensor && temporary {
            dev.temporary += 1;
        }
        if tensor {
            dev.tensor_bytes = dev.tensor_bytes.saturating_sub(size);
            dev.tensor_count = dev.tensor_count.saturating_sub(1);
            dev.tensor_tally.frees += 1;
            dev.tensor_tally.temporary += u64::from(temporary);
        } else {
            dev.live_bytes = dev.live_bytes.saturating_sub(size);
            dev.live_count = dev.live_count.saturating_sub(1);
            dev.frees += 1;
        }
        let (device_live, capacity) = (dev.live_bytes, dev.capacity);
        if let Some(s) = self.site_stats.get_mut(&(site, device)) {
            s.enter_step(self.markers);
            s.live_bytes = s.live_bytes.saturating_sub(size);
            s.live_count = s.live_count.saturating_sub(1);
            s.frees += 1;
            s.temporary += u64::from(temporary);
        }
        let free = Free {
            device,
            site,
            size,
            api,
            ts_ns: ts,
            birth,
            device_live,
            capacity,
            reserve,
        };
        obs.free(self, &free);
    }

    /// Frees a VMM handle's physical memory once nothing holds it.
    fn maybe_release_handle<O: Observer + ?Sized>(&mut self, handle: u64, ts: u64, obs: &mut O) {
        let done = matches!(self.handles.get(&handle), Some(h) if h.refs == 0 && h.mappings == 0);
        if done {
            if let Some(h) = self.handles.remove(&handle) {
                let gone = (
                    h.device,
                    h.site,
                    h.size,
                    Api::cuMemCreate,
                    h.birth,
                    ts,
                    false,
                );
                self.remove_live(obs, gone, h.ts_ns, false);
            }
        }
    }

    /// The allocation at `ptr` (the caching allocator's `cudaMalloc`, seen by the hooks just
    /// before) is a segment of PyTorch's allocator: reserve, whose tensors are traced one by
    /// one. Told once, so that the leak detectors stop counting it as a line's memory; the
    /// device's totals keep it (the GPU holds it).
    fn mark_reserve<O: Observer + ?Sized>(&mut self, ptr: u64, ts: u64, obs: &mut O) {
        let Some(a) = self.live.get_mut(&ptr) else {
            return;
        };
        if a.reserve {
            return;
        }
        a.reserve = true;
        let a = a.clone();
        if let Some(s) = self.site_stats.get_mut(&(a.site, a.device)) {
            s.reserve_allocations += 1;
        }
        let dev = &self.devices[&a.device];
        let free = Free {
            device: a.device,
            site: a.site,
            size: a.size,
            api: a.api,
            ts_ns: ts,
            birth: a.birth,
            device_live: dev.live_bytes,
            capacity: dev.capacity,
            reserve: true,
        };
        obs.reserve(self, &free);
    }

    /// The live table of `api`'s allocations: tensors have their own address space.
    fn table(&mut self, api: Api) -> &mut FxHashMap<u64, LiveAlloc> {
        if api.memory_class() == MemoryClass::Tensor {
            &mut self.tensors
        } else {
            &mut self.live
        }
    }

    fn device_for_class(api: Api, device: i16) -> i16 {
        if api.memory_class() == MemoryClass::HostPinned {
            HOST_DEVICE
        } else {
            device
        }
    }

    /// The device `ev` names when that device is implausible (see
    /// `oomtrace_proto::MAX_DEVICES`): such an event is counted, never accounted. Only the
    /// kinds whose device the model reads are checked (a free finds its allocation's).
    pub fn implausible_device(ev: &Event) -> Option<i16> {
        let device = match ev.kind()? {
            EventKind::Alloc | EventKind::AllocFailed => {
                Self::device_for_class(ev.api(), ev.device)
            }
            EventKind::PhysCreate
            | EventKind::Segment
            | EventKind::SegmentFree
            | EventKind::VaReserve
            | EventKind::MemInfo => ev.device,
            _ => return None,
        };
        (!plausible_device(device)).then_some(device)
    }

    /// The warning for a process whose events named devices it cannot have, if any did.
    pub fn implausible_device_warning(&self) -> Option<String> {
        (self.implausible_device_events > 0).then(|| {
            format!(
                "process {}: {} events name a device no process has (the first: device {}; \
                 ordinals run from 0 to {}): left out of the accounting",
                self.pid(),
                self.implausible_device_events,
                self.implausible_device_first,
                oomtrace_proto::MAX_DEVICES - 1
            )
        })
    }

    /// Applies one event, telling `obs` what happened.
    pub fn apply_event<O: Observer + ?Sized>(&mut self, ev: &Event, obs: &mut O) {
        self.events += 1;
        self.touch(ev.seq, ev.ts_ns);
        let Some(kind) = ev.kind() else { return };
        if let Some(device) = Self::implausible_device(ev) {
            if self.implausible_device_events == 0 {
                self.implausible_device_first = device;
            }
            self.implausible_device_events += 1;
            return;
        }
        let api = ev.api();
        match kind {
            EventKind::Alloc => {
                let device = Self::device_for_class(api, ev.device);
                if let Some(old) = self.table(api).remove(&ev.ptr) {
                    // The free of the previous owner of this address was lost.
                    let gone = (
                        old.device,
                        old.site,
                        old.size,
                        old.api,
                        old.birth,
                        ev.ts_ns,
                        old.reserve,
                    );
                    self.remove_live(obs, gone, old.ts_ns, false);
                }
                let site = self.site_of(ev.stack);
                let birth =
                    self.add_live(obs, (device, site, ev.size, ev.ts_ns, api, ev.tid), true);
                self.table(api).insert(
                    ev.ptr,
                    LiveAlloc {
                        size: ev.size,
                        device,
                        site,
                        api,
                        ts_ns: ev.ts_ns,
                        birth,
                        reserve: false,
                    },
                );
            }
            EventKind::Free => match self.table(api).remove(&ev.ptr) {
                Some(a) => {
                    let gone = (
                        a.device, a.site, a.size, a.api, a.birth, ev.ts_ns, a.reserve,
                    );
                    self.remove_live(obs, gone, a.ts_ns, true);
                }
                None => self.unmatched_frees += 1,
            },
            EventKind::FreeFailed => self.failed_frees += 1,
            EventKind::Segment | EventKind::SegmentFree => {
                if kind == EventKind::Segment {
                    self.mark_reserve(ev.ptr, ev.ts_ns, obs);
                }
                let dev = self.device(ev.device);
                dev.events += 1;
                dev.torch_segments = if kind == EventKind::Segment {
                    dev.torch_segments + 1
                } else {
                    dev.torch_segments.saturating_sub(1)
                };
                let reserved = dev.torch_reserved_bytes.unwrap_or(0);
                dev.torch_reserved_bytes = Some(if kind == EventKind::Segment {
                    reserved.saturating_add(ev.size)
                } else {
                    reserved.saturating_sub(ev.size)
                });
            }
            EventKind::AllocFailed => {
                let device = Self::device_for_class(api, ev.device);
                let site = self.site_of(ev.stack);
                let failures = self
                    .alloc_failures
                    .entry((api, ev.result, device))
                    .or_default();
                failures.count += 1;
                failures.last_size = ev.size;
                failures.last_site = site;
                if device == DEVICE_UNKNOWN && api.memory_class() != MemoryClass::HostPinned {
                    // No device at all (no driver, no device visible): not pinned host memory,
                    // whose slot shares the number. Kept in `alloc_failures` only.
                    return;
                }
                let dev = self.device(device);
                dev.events += 1;
                dev.failed_allocations += 1;
                let live_bytes = dev.live_bytes;
                if ev.result == OUT_OF_MEMORY {
                    let oom = OutOfMemory {
                        seq: ev.seq,
                        ts_ns: ev.ts_ns,
                        api,
                        result: ev.result,
                        device,
                        size: ev.size,
                        site,
                        tid: ev.tid,
                        live_bytes,
                    };
                    obs.out_of_memory(self, &oom);
                }
            }
            EventKind::PhysCreate => {
                let site = self.site_of(ev.stack);
                self.device(ev.device).events += 1;
                if let Some(old) = self.handles.remove(&ev.ptr) {
                    let gone = (
                        old.device, old.site, old.size, api, old.birth, ev.ts_ns, false,
                    );
                    self.remove_live(obs, gone, old.ts_ns, false);
                }
                let birth = self.add_live(
                    obs,
                    (ev.device, site, ev.size, ev.ts_ns, api, ev.tid),
                    false,
                );
                self.handles.insert(
                    ev.ptr,
                    PhysHandle {
                        size: ev.size,
                        device: ev.device,
                        site,
                        birth,
                        ts_ns: ev.ts_ns,
                        refs: 1,
                        mappings: 0,
                    },
                );
            }
            EventKind::PhysRetain => match self.handles.get_mut(&ev.ptr) {
                Some(h) => h.refs += 1,
                None => self.unmatched_frees += 1,
            },
            EventKind::PhysRelease => {
                match self.handles.get_mut(&ev.ptr) {
                    Some(h) => {
                        h.refs = h.refs.saturating_sub(1);
                        let d = h.device;
                        self.device(d).events += 1;
                    }
                    None => self.unmatched_frees += 1,
                }
                self.maybe_release_handle(ev.ptr, ev.ts_ns, obs);
            }
            EventKind::Map => {
                if let Some(h) = self.handles.get_mut(&ev.aux) {
                    h.mappings += 1;
                    let d = h.device;
                    let dev = self.device(d);
                    dev.events += 1;
                    dev.mapped_bytes = dev.mapped_bytes.saturating_add(ev.size);
                }
                self.mappings.insert(
                    ev.ptr,
                    Mapping {
                        size: ev.size,
                        handle: ev.aux,
                        offset: ev.extra,
                    },
                );
            }
            EventKind::Unmap => {
                let end = ev.ptr.saturating_add(ev.size.max(1));
                let gone: Vec<u64> = self
                    .mappings
                    .range(ev.ptr..end)
                    .map(|(&va, _)| va)
                    .collect();
                for va in gone {
                    if let Some(m) = self.mappings.remove(&va) {
                        if let Some(h) = self.handles.get_mut(&m.handle) {
                            h.mappings = h.mappings.saturating_sub(1);
                            let d = h.device;
                            let dev = self.device(d);
                            dev.events += 1;
                            dev.mapped_bytes = dev.mapped_bytes.saturating_sub(m.size);
                        }
                        self.maybe_release_handle(m.handle, ev.ts_ns, obs);
                    }
                }
            }
            EventKind::VaReserve => {
                self.reservations.insert(ev.ptr, (ev.size, ev.device));
                let dev = self.device(ev.device);
                dev.reserved_va_bytes = dev.reserved_va_bytes.saturating_add(ev.size);
            }
            EventKind::VaFree => {
                if let Some((size, d)) = self.reservations.remove(&ev.ptr) {
                    let dev = self.device(d);
                    dev.reserved_va_bytes = dev.reserved_va_bytes.saturating_sub(size);
                }
            }
            EventKind::MemInfo => {
                if ev.device >= 0 {
                    let dev = self.device(ev.device);
                    dev.capacity = Some(ev.size);
                    dev.last_free = Some(ev.ptr);
                    let info = MemInfo {
                        device: ev.device,
                        tid: ev.tid,
                        free: ev.ptr,
                        total: ev.size,
                    };
                    obs.mem_info(self, &info);
                }
            }
            EventKind::Marker => self.on_marker(ev.ts_ns, obs),
            EventKind::Init => self.cuda_initialized |= ev.result == 0,
        }
    }

    /// The `n` sites of `device` holding most memory now, as (site, live bytes, live
    /// allocations), largest first: those of tensors inside PyTorch's segments, or (`tensors`
    /// false) those of everything else (the segments hold the tensors' bytes).
    fn largest_sites(&self, device: i16, n: usize, tensors: bool) -> Vec<(SiteId, u64, u64)> {
        let mut v: Vec<(SiteId, u64, u64)> = self
            .sites_on(device)
            .filter(|(_, s)| {
                s.live_bytes > 0
                    && s.api
                        .is_some_and(|a| a.memory_class() == MemoryClass::Tensor)
                        == tensors
            })
            .map(|(site, s)| (site, s.live_bytes, s.live_count))
            .collect();
        v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// Who held `device`'s memory at its peak: (site, bytes, allocations), largest first, at
    /// most [`PEAK_SITES`].
    pub fn peak_sites(&self, device: i16) -> Vec<(SiteId, u64, u64)> {
        match self.devices.get(&device) {
            Some(d) if d.peak_pending => self.largest_sites(device, PEAK_SITES, false),
            Some(d) => d.peak_sites.clone(),
            None => Vec::new(),
        }
    }

    /// Who held `device`'s tensors at their peak, as [`Process::peak_sites`].
    pub fn tensor_peak_sites(&self, device: i16) -> Vec<(SiteId, u64, u64)> {
        match self.devices.get(&device) {
            Some(d) if d.tensor_tally.peak_pending => self.largest_sites(device, PEAK_SITES, true),
            Some(d) => d.tensor_tally.peak_sites.clone(),
            None => Vec::new(),
        }
    }

    /// Whether PyTorch's trace tracker reported on `device` (its segments or its tensors):
    /// the device's memory is then told as tensors and PyTorch's reserve.
    pub fn tensors_traced(&self, device: i16) -> bool {
        self.devices
            .get(&device)
            .is_some_and(|d| d.torch_reserved_bytes.is_some() || d.tensor_tally.allocations > 0)
    }

    /// The call sites that allocated on `device`, with their aggregates there, in the order
    /// they first did: O(those sites), whatever the other devices hold.
    pub fn sites_on(&self, device: i16) -> impl Iterator<Item = (SiteId, &SiteStats)> + '_ {
        self.device_sites
            .get(&device)
            .into_iter()
            .flatten()
            .filter_map(move |&site| Some((site, self.site_stats.get(&(site, device))?)))
    }

    pub fn top_sites(&self, device: i16, n: usize) -> Vec<(SiteId, u64, u64)> {
        self.top_sites_where(device, n, |_| true)
    }

    /// The `n` sites of `device` holding most memory now, as (site, live bytes, live
    /// allocations), largest first; without PyTorch's segments where its tensors are traced
    /// (the tensors and the memory outside its allocator are who holds memory then).
    pub fn top_holders(&self, device: i16, n: usize) -> Vec<(SiteId, u64, u64)> {
        if self.tensors_traced(device) {
            self.top_sites_where(device, n, |s| s.reserve_allocations == 0)
        } else {
            self.top_sites(device, n)
        }
    }

    /// [`Process::top_sites`] among the sites whose counters pass `keep`.
    pub fn top_sites_where(
        &self,
        device: i16,
        n: usize,
        keep: impl Fn(&SiteStats) -> bool,
    ) -> Vec<(SiteId, u64, u64)> {
        let mut v: Vec<(SiteId, u64, u64)> = self
            .sites_on(device)
            .filter(|(_, s)| s.live_bytes > 0 && keep(s))
            .map(|(site, s)| (site, s.live_bytes, s.live_count))
            .collect();
        v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// Lost events attributed to `device` by the shim.
    pub fn lost_on(&self, device: i16) -> u64 {
        self.lost
            .by_device
            .iter()
            .filter(|(d, _)| *d == device)
            .map(|(_, n)| n)
            .sum()
    }
}

/// The size-histogram bucket of `size`: sizes in `[2^(i-1), 2^i)` go to `i`, 0 to 0.
pub fn size_bucket(size: u64) -> usize {
    (u64::BITS - size.leading_zeros()) as usize
}

/// Counts one allocation of `size` in `buckets` (see [`DeviceState::size_buckets`]).
fn count_size(buckets: &mut Vec<(u64, u64)>, size: u64) {
    let bucket = size_bucket(size);
    if buckets.len() <= bucket {
        buckets.resize(bucket + 1, (0, 0));
    }
    let b = &mut buckets[bucket];
    b.0 += 1;
    b.1 = b.1.saturating_add(size);
}

/// Whether a new peak (`peak` bytes) calls for another snapshot of the sites holding memory:
/// the first one, then only once the peak has grown by 1/64 (at least 64 KiB) since the last
/// (`snapped` bytes). A snapshot scans the sites, so a peak that creeps up with every
/// allocation costs at most a few hundred scans in a run. The device's peak and the tensors'
/// peak follow the same rule.
fn snapshot_due(never_taken: bool, snapped: u64, peak: u64) -> bool {
    let step = (snapped / 64).max(64 << 10);
    never_taken || peak >= snapped.saturating_add(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: EventKind, api: Api, ptr: u64, size: u64) -> Event {
        let mut e = Event::new(kind, api);
        e.ptr = ptr;
        e.size = size;
        e.device = 0;
        e
    }

    fn proc() -> Process {
        Process::new(1, Hello::default())
    }

    #[test]
    fn a_rank_learnt_after_the_hello_replaces_the_launchers() {
        let vars = |l: &[(&str, &str)]| -> Vec<(String, String)> {
            l.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let mut p = Process::new(
            1,
            Hello {
                launch: vars(&[("RANK", "0"), ("WORLD_SIZE", "4")]),
                ..Hello::default()
            },
        );
        assert_eq!(p.launch.rank, Some(0));
        p.apply(
            &Frame::Launch(vars(&[
                ("RANK", "3"),
                ("LOCAL_RANK", "1"),
                ("NOT_A_LAUNCHER", "x"),
            ])),
            &mut (),
        );
        assert_eq!(
            (p.launch.rank, p.launch.local_rank, p.launch.world_size),
            (Some(3), Some(1), Some(4))
        );
        // Only names the shim records are kept: a stream cannot grow the list.
        assert_eq!(p.hello.launch.len(), 3);
    }

    /// The tracker's tensors share addresses with the segment that holds them and are not
    /// counted twice; the reserve is the allocator's own segments, not other CUDA memory.
    #[test]
    fn tracker_tensors_live_inside_segments_without_double_counting() {
        let mut p = proc();
        let (tensor_site, _) = two_sites(&mut p);
        let seg = 0x7000_0000;
        p.apply_event(
            &ev(EventKind::Alloc, Api::cudaMalloc, seg, 20 << 20),
            &mut (),
        );
        p.apply_event(
            &ev(
                EventKind::Segment,
                Api::oomtrace_torch_segment,
                seg,
                20 << 20,
            ),
            &mut (),
        );
        // An extension's own cudaMalloc: device memory, not the allocator's reserve.
        p.apply_event(
            &ev(EventKind::Alloc, Api::cudaMalloc, 0x9000_0000, 8 << 20),
            &mut (),
        );
        let tensor = |p: &mut Process, kind, ptr, size| {
            let api = if kind == EventKind::Alloc {
                Api::oomtrace_torch_alloc
            } else {
                Api::oomtrace_torch_free
            };
            let mut e = ev(kind, api, ptr, size);
            e.stack = StackId(1);
            p.apply_event(&e, &mut ());
        };
        tensor(&mut p, EventKind::Alloc, seg, 4 << 20);
        tensor(&mut p, EventKind::Alloc, seg + (4 << 20), 2 << 20);
        let d = &p.devices[&0];
        assert_eq!((d.live_bytes, d.live_count), (28 << 20, 2));
        assert_eq!((d.tensor_bytes, d.tensor_count), (6 << 20, 2));
        assert_eq!(d.torch_reserved_bytes, Some(20 << 20));
        assert_eq!(p.live[&seg].size, 20 << 20, "the segment is still live");
        tensor(&mut p, EventKind::Free, seg, 0);
        assert_eq!(p.devices[&0].tensor_bytes, 2 << 20);
        assert_eq!(p.devices[&0].tensor_peak_bytes, 6 << 20);
        assert_eq!(p.devices[&0].live_bytes, 28 << 20);
        assert_eq!(p.unmatched_frees, 0);
        // The tensors' own tally, apart from the CUDA allocations': two made, one freed, who
        // held their peak, and the segment counted as the allocator's (reserve) at its site.
        let d = &p.devices[&0];
        let t = &d.tensor_tally;
        assert_eq!((t.allocations, t.frees, t.bytes_allocated), (2, 1, 6 << 20));
        assert_eq!((d.allocations, d.torch_segments), (2, 1));
        assert_eq!(p.tensor_peak_sites(0), vec![(tensor_site, 6 << 20, 2)]);
        assert_eq!(t.size_buckets.iter().map(|b| b.0).sum::<u64>(), 2);
        assert_eq!(p.site_stats[&(SiteId(0), 0)].reserve_allocations, 1);
        assert!(p.tensors_traced(0) && !p.tensors_traced(1));
        // Who holds memory: the tensors, not the site of the allocator's segments.
        assert_eq!(p.top_holders(0, 5), vec![(tensor_site, 2 << 20, 1)]);
        assert_eq!(p.top_sites(0, 5)[0], (SiteId(0), 28 << 20, 2));
        p.apply_event(
            &ev(
                EventKind::SegmentFree,
                Api::oomtrace_torch_segment,
                seg,
                20 << 20,
            ),
            &mut (),
        );
        p.apply_event(&ev(EventKind::Free, Api::cudaFree, seg, 0), &mut ());
        assert_eq!(p.devices[&0].torch_reserved_bytes, Some(0));
        assert_eq!(p.devices[&0].torch_segments, 0);
        assert_eq!(p.devices[&0].live_bytes, 8 << 20);
    }

    /// PyTorch's own readings: each is told after the marker it follows, with the steps counted
    /// so far; the process keeps the last of each device; a device no process has is left out.
    #[test]
    fn torch_readings_follow_their_markers_and_the_last_of_each_device_is_kept() {
        #[derive(Default)]
        struct Heard(Vec<(u64, TorchMemory)>);
        impl Observer for Heard {
            fn step(&mut self, p: &Process, _ts: u64) {
                assert_eq!(
                    self.0.len() as u64,
                    2 * (p.markers - 1),
                    "a reading came late"
                );
            }
            fn torch_memory(&mut self, p: &Process, m: &TorchMemory) {
                assert_eq!(
                    p.torch_memory.get(&m.device),
                    Some(m),
                    "not kept before told"
                );
                self.0.push((p.markers, *m));
            }
        }
        let reading = |ts_ns, device, reserved| {
            Frame::TorchMemory(oomtrace_proto::wire::TorchMemory {
                ts_ns,
                device,
                allocated: reserved / 4,
                max_allocated: reserved / 2,
                reserved,
            })
        };
        let marker = |ts_ns| Frame::Marker {
            seq: 1,
            ts_ns,
            tid: 1,
            stack: StackId(0),
            label: String::new(),
        };
        let mut p = proc();
        let mut heard = Heard::default();
        for step in 1..=3u64 {
            p.apply(&marker(step * 100), &mut heard);
            p.apply(&reading(step * 100 + 1, 0, step << 20), &mut heard);
            p.apply(&reading(step * 100 + 2, 1, step << 30), &mut heard);
        }
        p.apply(&reading(400, oomtrace_proto::MAX_DEVICES, 1), &mut heard);
        p.apply(&reading(400, -1, 1), &mut heard);
        assert_eq!(heard.0.len(), 6);
        assert_eq!(p.implausible_torch_memory, 2);
        assert_eq!(p.torch_memory.len(), 2);
        let last = p.torch_memory[&1];
        assert_eq!(
            (
                last.step,
                last.ts_ns,
                last.reserved,
                last.max_allocated,
                last.allocated
            ),
            (3, 302, 3 << 30, 3 << 29, 3 << 28)
        );
        assert_eq!(p.torch_memory[&0].reserved, 3 << 20);
        assert!(heard.0.iter().all(|(steps, m)| *steps == m.step));
        // Readings are not events: they change no device's accounting.
        assert!(p.devices.is_empty());
    }

    /// What an observer hears about a segment: born as a `cudaMalloc`, told once as reserve
    /// when the allocator names it (a second `Segment` at the address changes nothing), and
    /// its free says it was reserve. An extension's own `cudaMalloc` is never reserve.
    #[test]
    fn a_segment_is_told_once_as_reserve_and_freed_as_reserve() {
        #[derive(Default)]
        struct Heard(Vec<(&'static str, u64, bool)>);
        impl Observer for Heard {
            fn free(&mut self, _p: &Process, f: &Free) {
                self.0.push(("free", f.size, f.reserve));
            }
            fn reserve(&mut self, _p: &Process, f: &Free) {
                self.0.push(("reserve", f.size, f.reserve));
            }
        }
        let mut p = proc();
        let mut heard = Heard::default();
        let seg = 0x7000_0000;
        let segment = ev(
            EventKind::Segment,
            Api::oomtrace_torch_segment,
            seg,
            20 << 20,
        );
        p.apply_event(
            &ev(EventKind::Alloc, Api::cudaMalloc, seg, 20 << 20),
            &mut heard,
        );
        p.apply_event(&segment, &mut heard);
        p.apply_event(&segment, &mut heard);
        p.apply_event(
            &ev(EventKind::Alloc, Api::cudaMalloc, 0x9000_0000, 8 << 20),
            &mut heard,
        );
        p.apply_event(
            &ev(EventKind::Free, Api::cudaFree, 0x9000_0000, 0),
            &mut heard,
        );
        p.apply_event(&ev(EventKind::Free, Api::cudaFree, seg, 0), &mut heard);
        assert_eq!(
            heard.0,
            [
                ("reserve", 20 << 20, true),
                ("free", 8 << 20, false),
                ("free", 20 << 20, true)
            ]
        );
    }

    #[test]
    fn stack_ids_resolve_as_a_map_would_whatever_the_ids() {
        let mut sites = StackSites::default();
        let mut reference: FxHashMap<u32, SiteId> = FxHashMap::default();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly the shim's 1, 2, 3, ...; now and then an id defined again, one far past
            // the others (later reached by the dense ones), or anything at all.
            let id = match x % 16 {
                0 => (x >> 8) as u32 % (step + 1),
                1 => step + 3000 + (x >> 8) as u32 % 5000,
                2 => (x >> 32) as u32,
                _ => step,
            };
            let site = SiteId((x >> 40) as u32 % 500);
            sites.insert(id, site);
            reference.insert(id, site);
            let probe = (x >> 20) as u32 % (step + 9000);
            assert_eq!(
                sites.get(probe),
                reference.get(&probe).copied(),
                "step {step}"
            );
            assert_eq!(sites.get(id), Some(site));
        }
        for (&id, &site) in &reference {
            assert_eq!(sites.get(id), Some(site));
        }
        assert!(
            sites.dense.len() <= 2 * 20_000 + 1025,
            "{}",
            sites.dense.len()
        );
    }

    #[test]
    fn alloc_free_peak_and_sites() {
        let mut p = proc();
        p.define_stack(StackId(1), &[0x1000, 0x2000]);
        p.define_stack(StackId(2), &[0x1000, 0x2000]); // same frames, other thread
        let mut a = ev(EventKind::Alloc, Api::cudaMalloc, 0xa, 100);
        a.stack = StackId(1);
        p.apply_event(&a, &mut ());
        let mut b = ev(EventKind::Alloc, Api::cudaMalloc, 0xb, 50);
        b.stack = StackId(2);
        p.apply_event(&b, &mut ());
        p.apply_event(&ev(EventKind::Free, Api::cudaFree, 0xa, 0), &mut ());
        let d = &p.devices[&0];
        assert_eq!((d.live_bytes, d.peak_bytes, d.live_count), (50, 150, 1));
        assert_eq!(p.sites.len(), 2, "one site for both stack ids");
        assert_eq!(p.top_sites(0, 5), vec![(SiteId(1), 50, 1)]);
        p.apply_event(&ev(EventKind::Free, Api::cudaFree, 0xdead, 0), &mut ());
        assert_eq!(p.unmatched_frees, 1);
    }

    #[test]
    fn vmm_handle_lives_while_referenced_or_mapped() {
        let mut p = proc();
        p.apply_event(
            &ev(EventKind::PhysCreate, Api::cuMemCreate, 7, 2 << 20),
            &mut (),
        );
        let mut map = ev(EventKind::Map, Api::cuMemMap, 0x1000_0000, 2 << 20);
        map.aux = 7;
        p.apply_event(&map, &mut ());
        // NCCL/PyTorch pattern: release while mapped keeps the memory.
        p.apply_event(
            &ev(EventKind::PhysRelease, Api::cuMemRelease, 7, 0),
            &mut (),
        );
        assert_eq!(p.devices[&0].live_bytes, 2 << 20);
        // Retain + release is a no-op.
        let mut ret = ev(
            EventKind::PhysRetain,
            Api::cuMemRetainAllocationHandle,
            7,
            0,
        );
        ret.aux = 0x1000_0000;
        p.apply_event(&ret, &mut ());
        p.apply_event(
            &ev(EventKind::PhysRelease, Api::cuMemRelease, 7, 0),
            &mut (),
        );
        assert_eq!(p.devices[&0].live_bytes, 2 << 20);
        p.apply_event(
            &ev(EventKind::Unmap, Api::cuMemUnmap, 0x1000_0000, 2 << 20),
            &mut (),
        );
        assert_eq!(p.devices[&0].live_bytes, 0);
        assert!(p.handles.is_empty());
        // The driver reuses the handle value: a new create is a new allocation.
        p.apply_event(
            &ev(EventKind::PhysCreate, Api::cuMemCreate, 7, 4 << 20),
            &mut (),
        );
        assert_eq!(p.devices[&0].live_bytes, 4 << 20);
    }

    /// Memory follows live allocations and sites, never the number of events.
    #[test]
    fn state_stays_bounded_over_a_million_events() {
        let mut p = proc();
        for s in 1..=4u32 {
            p.define_stack(StackId(s), &[0x1000 * u64::from(s), 0x2000]);
        }
        for i in 0..500_000u64 {
            let ptr = 0x7000_0000 + (i % 64) * 4096; // the driver reuses addresses
            let mut a = ev(EventKind::Alloc, Api::cudaMalloc, ptr, 4096);
            a.stack = StackId((i % 4) as u32 + 1);
            p.apply_event(&a, &mut ());
            p.apply_event(&ev(EventKind::Free, Api::cudaFree, ptr, 0), &mut ());
        }
        assert_eq!(p.events, 1_000_000);
        assert!(p.live.is_empty());
        assert_eq!(p.sites.len(), 5);
        assert!(p.site_stats.len() <= 5);
        assert!(
            p.live.capacity() < 1024,
            "live table never held more than a few entries"
        );
        assert_eq!(p.devices[&0].live_bytes, 0);
        assert_eq!(p.devices[&0].peak_bytes, 4096);
    }

    fn module(id: u32, start: u64, path: &str) -> ModuleDef {
        ModuleDef {
            id,
            start,
            end: start + 0x10_0000,
            bias: start,
            build_id: Vec::new(),
            path: path.into(),
            file: None,
        }
    }

    /// CPython 3.11 reaches the same native function from the same Python line through other
    /// interpreter functions once it has specialised the call: still one site, from the first
    /// allocation on; a frame of any other module still tells sites apart.
    #[test]
    fn stacks_that_differ_only_inside_the_interpreter_are_one_site() {
        let mut p = proc();
        p.define_module(module(1, 0x10_0000, "/usr/lib/libpython3.11.so.1.0"));
        p.define_module(module(
            2,
            0x20_0000,
            "/venv/lib/_ctypes.cpython-311-x86_64-linux-gnu.so",
        ));
        p.define_module(module(3, 0x30_0000, "/opt/py/bin/python3.13t"));
        let py = PyFrame {
            code: 7,
            offset: 40,
            group_end: true,
        }
        .encode();
        // Generic call path, then the specialised one (other eval-loop return address).
        p.define_stack(
            StackId(1),
            &[0x20_0100, 0x10_0200, 0x10_0300, 0x10_0400, py],
        );
        p.define_stack(StackId(2), &[0x20_0100, 0x10_0500, py]);
        // The statically linked interpreter is the interpreter too.
        p.define_stack(StackId(3), &[0x20_0100, 0x30_0500, py]);
        assert_eq!(p.stack_site(StackId(1)), p.stack_site(StackId(2)));
        assert_eq!(p.stack_site(StackId(1)), p.stack_site(StackId(3)));
        assert_eq!(p.merged_stacks, 2);
        // The first stack is kept whole: the symbolizer places Python frames by its eval loop.
        assert_eq!(p.sites[p.stack_site(StackId(1)).0 as usize].len(), 5);
        // Another extension frame, or another Python line, is another site.
        p.define_stack(StackId(4), &[0x20_0180, 0x10_0500, py]);
        let other_line = PyFrame {
            code: 7,
            offset: 60,
            group_end: true,
        }
        .encode();
        p.define_stack(StackId(5), &[0x20_0100, 0x10_0500, other_line]);
        let sites: std::collections::BTreeSet<SiteId> =
            (1..=5).map(|i| p.stack_site(StackId(i))).collect();
        assert_eq!(sites.len(), 3, "{sites:?}");
    }

    /// A specialised call ends at another instruction of the same line (`PRECALL` instead of
    /// `CALL`): the Python frame counts by its line, once its code object is known.
    #[test]
    fn python_frames_count_by_their_line_not_their_instruction() {
        let mut p = proc();
        p.apply(
            &Frame::CodeDef(CodeDef {
                id: 7,
                format: oomtrace_proto::python::LineTableFormat::Lnotab as u8,
                first_line: 10,
                filename: "train.py".into(),
                name: "step".into(),
                // Offsets 0..50 are line 10, from 50 on line 11.
                line_table: vec![50, 1],
            }),
            &mut (),
        );
        let at = |offset| {
            PyFrame {
                code: 7,
                offset,
                group_end: true,
            }
            .encode()
        };
        p.define_stack(StackId(1), &[0x9000, at(40)]);
        p.define_stack(StackId(2), &[0x9000, at(44)]);
        p.define_stack(StackId(3), &[0x9000, at(60)]);
        assert_eq!(p.stack_site(StackId(1)), p.stack_site(StackId(2)));
        assert_ne!(p.stack_site(StackId(1)), p.stack_site(StackId(3)));
        // The site keeps the frames it was first seen with.
        assert_eq!(p.sites[p.stack_site(StackId(2)).0 as usize][1].addr, at(40));
    }

    #[test]
    fn the_interpreter_is_known_by_its_file_name() {
        for path in [
            "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
            "/root/.pyenv/versions/3.12.1/lib/libpython3.12d.so",
            "/usr/bin/python3.11",
            "/usr/local/bin/python3",
            "/opt/conda/bin/python",
            "/opt/py/bin/python3.13t",
        ] {
            assert!(is_interpreter_module(path), "{path}");
        }
        for path in [
            "/venv/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so",
            "/usr/lib/x86_64-linux-gnu/libffi.so.8",
            "/home/u/python_ext.so",
            "/home/u/bin/python-train",
            "/venv/lib/python3.11/site-packages/torch/lib/libtorch_python.so",
            "/usr/lib/libpythonish.a",
        ] {
            assert!(!is_interpreter_module(path), "{path}");
        }
    }

    #[test]
    fn pinned_host_memory_is_kept_apart() {
        let mut p = proc();
        p.apply_event(&ev(EventKind::Alloc, Api::cudaMallocHost, 0xa, 10), &mut ());
        p.apply_event(&ev(EventKind::Alloc, Api::cudaMalloc, 0xb, 20), &mut ());
        assert_eq!(p.devices[&HOST_DEVICE].live_bytes, 10);
        assert_eq!(p.devices[&0].live_bytes, 20);
    }

    /// Defines stacks 1 and 2 (one frame each) and returns their sites.
    fn two_sites(p: &mut Process) -> (SiteId, SiteId) {
        p.apply(
            &Frame::StackDef {
                id: StackId(1),
                frames: vec![0x1000],
            },
            &mut (),
        );
        p.apply(
            &Frame::StackDef {
                id: StackId(2),
                frames: vec![0x2000],
            },
            &mut (),
        );
        (p.stack_site(StackId(1)), p.stack_site(StackId(2)))
    }

    fn at(kind: EventKind, ptr: u64, size: u64, stack: u32, ts: u64) -> Event {
        let api = if kind == EventKind::Alloc {
            Api::cudaMalloc
        } else {
            Api::cudaFree
        };
        let mut e = ev(kind, api, ptr, size);
        e.stack = StackId(stack);
        e.ts_ns = ts;
        e
    }

    #[test]
    fn the_peak_remembers_who_held_it() {
        const M: u64 = 1 << 20;
        let mut p = proc();
        let (s1, s2) = two_sites(&mut p);
        p.apply_event(&at(EventKind::Alloc, 0xa, 8 * M, 1, 1), &mut ());
        p.apply_event(&at(EventKind::Alloc, 0xb, 4 * M, 2, 2), &mut ());
        p.apply_event(&at(EventKind::Free, 0xb, 0, 0, 3), &mut ());
        p.apply_event(&at(EventKind::Alloc, 0xc, 2 * M, 1, 4), &mut ());
        assert_eq!(p.devices[&0].peak_bytes, 12 * M);
        assert_eq!(
            p.peak_sites(0),
            vec![(s1, 8 * M, 1), (s2, 4 * M, 1)],
            "not the end"
        );
        // A new peak, not yet left: the peak is now.
        p.apply_event(&at(EventKind::Alloc, 0xd, 8 * M, 2, 5), &mut ());
        assert_eq!(p.peak_sites(0), vec![(s1, 10 * M, 2), (s2, 8 * M, 1)]);
        p.apply_event(&at(EventKind::Free, 0xd, 0, 0, 6), &mut ());
        // A peak only 4 KiB higher (under 1/64 of 18 MiB): the snapshot stays the one of
        // 18 MiB rather than scanning the sites again.
        p.apply_event(&at(EventKind::Alloc, 0xe, 8 * M + 4096, 2, 7), &mut ());
        p.apply_event(&at(EventKind::Free, 0xe, 0, 0, 8), &mut ());
        assert_eq!(p.devices[&0].peak_bytes, 18 * M + 4096);
        assert_eq!(p.peak_sites(0), vec![(s1, 10 * M, 2), (s2, 8 * M, 1)]);
        let buckets = &p.devices[&0].size_buckets;
        // 2 MiB -> [2^21, 2^22), 4 MiB -> [2^22, 2^23), 8 MiB -> [2^23, 2^24).
        assert_eq!(buckets[22..], [(1, 2 * M), (1, 4 * M), (3, 24 * M + 4096)]);
    }

    /// Sizes near 2^64 (any bytes on the wire): the peak snapshot's threshold saturates
    /// instead of overflowing (found by the wire_decoder fuzz target).
    #[test]
    fn a_peak_near_the_largest_size_does_not_overflow() {
        let mut p = proc();
        p.apply_event(
            &ev(EventKind::Alloc, Api::cudaMalloc, 0xa, u64::MAX - 8),
            &mut (),
        );
        p.apply_event(&ev(EventKind::Free, Api::cudaFree, 0xa, 0), &mut ());
        p.apply_event(
            &ev(EventKind::Alloc, Api::cudaMalloc, 0xb, u64::MAX),
            &mut (),
        );
        assert_eq!(p.devices[&0].peak_bytes, u64::MAX);
    }

    #[test]
    fn temporaries_and_growth_are_counted_by_step() {
        let mut p = proc();
        let (_, s2) = two_sites(&mut p);
        let marker = |p: &mut Process, ts| {
            let mut e = Event::new(EventKind::Marker, Api::cudaMalloc);
            e.ts_ns = ts;
            p.apply_event(&e, &mut ());
        };
        p.apply_event(&at(EventKind::Alloc, 0x1, 1, 1, 10), &mut ());
        marker(&mut p, 20);
        // Born in the step before: not temporary.
        p.apply_event(&at(EventKind::Free, 0x1, 0, 0, 25), &mut ());
        p.apply_event(&at(EventKind::Alloc, 0x2, 1, 1, 30), &mut ());
        p.apply_event(&at(EventKind::Free, 0x2, 0, 0, 35), &mut ());
        p.apply_event(&at(EventKind::Alloc, 0x3, 8, 2, 40), &mut ());
        marker(&mut p, 50);
        p.apply_event(&at(EventKind::Alloc, 0x4, 8, 2, 60), &mut ());
        marker(&mut p, 70);
        // The teardown at exit, after the last marker.
        p.apply_event(&at(EventKind::Free, 0x3, 0, 0, 80), &mut ());
        p.apply_event(&at(EventKind::Free, 0x4, 0, 0, 81), &mut ());
        assert_eq!(p.devices[&0].temporary, 1);
        let s = &p.site_stats[&(s2, 0)];
        assert_eq!((s.frees, s.temporary, s.live_bytes), (2, 0, 0));
        assert_eq!(s.live_at_first_step, 0);
        assert_eq!(s.live_at_last_step(p.markers), 16, "before the teardown");
    }
}
