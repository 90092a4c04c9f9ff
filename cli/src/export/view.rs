//! The exporters' read-only view of a trace: the one file under `export/` (and of `oomtrace
//! export`) that names `oomtrace_collector` types.
//!
//! Why: the exporters need little of the collector (a replay that shows each event with its
//! process's state just before it, a few per-process totals, symbolized call sites), and the
//! collector's internals change more often than that need. Everything the exporters read
//! goes through the small types here, so a change in the collector is fixed in this file
//! alone, and an exporter cannot come to depend on a field it was never meant to see.
//!
//! - [`replay`] runs a trace file, showing each event or marker ([`Seen`]) with its process
//!   ([`ProcessView`], the state before the event is applied), and returns the final state
//!   ([`Trace`]).
//! - [`ProcessView`]: a process's identity, end, per-device totals ([`DeviceTotals`]), live
//!   allocations ([`LiveAlloc`]), physical VMM handles ([`Handle`]) and live and peak bytes
//!   per call site ([`Site`]).
//! - [`Symbolizer`]: a call site's frames ([`Frame`]), innermost first; a backward-pass
//!   site's name and forward line ([`BackwardName`]), as the report names it.
//!
//! Wire-level records (`oomtrace_proto::Event`, `EventKind`, `Api`) are shown as they are:
//! they are the trace format, not the collector's model.

use std::collections::HashMap;
use std::path::Path;

use oomtrace_collector::model::history::{self, Seen as CollectorSeen};
use oomtrace_collector::model::{self as state, EndState, Process, SiteId, Stacks};
use oomtrace_collector::report::roles::FrameRole;
use oomtrace_collector::report::symbolize::{self, FrameInfo, StackSymbolizer};
use oomtrace_collector::report::{backward, module_file};
use oomtrace_proto::wire::GoodbyeReason;
use oomtrace_proto::{Event, MemoryClass};

use crate::Failure;

/// The `result` of a failed allocation that ran out of memory (the runtime's and the
/// driver's codes share the value).
pub const OUT_OF_MEMORY: i32 = state::OUT_OF_MEMORY;

/// A deduplicated call site of one process; [`Site::NONE`] means no stack was recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Site(SiteId);

impl Site {
    /// No stack recorded.
    pub const NONE: Site = Site(SiteId(0));

    /// The site's number, unique within its process (0: none).
    pub fn number(self) -> u32 {
        self.0 .0
    }

    pub fn is_none(self) -> bool {
        self.0 .0 == 0
    }

    /// A site by number (for tests of code that only carries sites around).
    #[cfg(test)]
    pub fn from_number(n: u32) -> Site {
        Site(SiteId(n))
    }
}

/// One replayed record of a process, not yet applied to its state.
#[derive(Clone, Copy, Debug)]
pub enum Seen<'a> {
    /// An event; `site` is its stack's call site ([`Site::NONE`]: none).
    Event { event: &'a Event, site: Site },
    /// A step marker (`oomtrace_mark`).
    Marker {
        seq: u64,
        ts_ns: u64,
        tid: u32,
        label: &'a str,
    },
    /// PyTorch's own statistics of one device as the program read them right after a step
    /// marker (`torch.cuda.memory_allocated()`, `max_memory_allocated()`,
    /// `memory_reserved()`), in every tracing mode.
    TorchMemory {
        device: i16,
        ts_ns: u64,
        allocated: u64,
        max_allocated: u64,
        reserved: u64,
    },
}

impl<'a> Seen<'a> {
    fn from_collector(seen: CollectorSeen<'a>) -> Seen<'a> {
        match seen {
            CollectorSeen::Event { event, site } => Seen::Event {
                event,
                site: Site(site),
            },
            CollectorSeen::Marker {
                seq,
                ts_ns,
                tid,
                label,
                ..
            } => Seen::Marker {
                seq,
                ts_ns,
                tid,
                label,
            },
            CollectorSeen::TorchMemory(m) => Seen::TorchMemory {
                device: m.device,
                ts_ns: m.ts_ns,
                allocated: m.allocated,
                max_allocated: m.max_allocated,
                reserved: m.reserved,
            },
        }
    }
}

/// How a process's stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Said goodbye from `exit` (or without saying how).
    Exited,
    /// Said goodbye from `_exit`.
    UnderscoreExit,
    /// The shim stopped tracing while the process lived on.
    Detached,
    /// Closed without a goodbye: killed or crashed.
    Abrupt,
    /// Began its end of stream (exit, `_exit`, detach), whose rest was lost.
    Unheard(GoodbyeReason),
    /// Still connected when the trace ended.
    Running,
    /// Dropped for sending garbage.
    ProtocolError,
}

/// Totals of one device (or of pinned host memory, device -1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceTotals {
    /// Events attributed to the device.
    pub events: u64,
    /// Tracked live bytes now.
    pub live_bytes: u64,
    pub peak_bytes: u64,
    /// Free device memory as the driver last reported it.
    pub last_free: Option<u64>,
    /// Live bytes of PyTorch's tensors (its caching allocator's trace tracker): memory in use
    /// inside the allocator's segments, which `live_bytes` already counts.
    pub tensor_bytes: u64,
    /// What PyTorch's caching allocator holds as segments (its reserve, part of
    /// `live_bytes`); `None` until its first segment event.
    pub torch_reserved: Option<u64>,
}

/// A live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveAlloc {
    pub size: u64,
    pub device: i16,
    /// Where it was allocated.
    pub site: Site,
}

/// A physical VMM allocation (`cuMemCreate`) by its handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub device: i16,
    /// Where it was created.
    pub site: Site,
}

/// One process of a trace, as it stands at one moment of a replay (or at the end).
#[derive(Clone, Copy)]
pub struct ProcessView<'a>(&'a Process);

impl<'a> ProcessView<'a> {
    /// The connection it came on: the process's identity within the trace (a pid can
    /// repeat, a connection cannot).
    pub fn conn(self) -> u32 {
        self.0.conn
    }

    pub fn pid(self) -> u32 {
        self.0.pid()
    }

    pub fn ppid(self) -> u32 {
        self.0.hello.ppid
    }

    /// Its place in a distributed job (all `None` without a launcher).
    pub fn launch(self) -> &'a oomtrace_proto::launch::Launch {
        &self.0.launch
    }

    /// The command line, as one string.
    pub fn command(self) -> String {
        self.0.command()
    }

    /// The executable's path ("" when unknown).
    pub fn exe(self) -> &'a str {
        &self.0.hello.exe
    }

    /// `argv[0]`, if there was one.
    pub fn argv0(self) -> Option<&'a str> {
        self.0.hello.argv.first().map(String::as_str)
    }

    /// When it started (Unix time, ns; 0 when unknown).
    pub fn start_unix_ns(self) -> u64 {
        self.0.hello.start_unix_ns
    }

    /// The monotonic timestamp of its first event (0: none yet).
    pub fn first_ts_ns(self) -> u64 {
        self.0.first_ts_ns
    }

    /// The monotonic timestamp of its last event or marker (0: none yet).
    pub fn last_ts_ns(self) -> u64 {
        self.0.last_ts_ns
    }

    /// Step markers received.
    pub fn markers(self) -> u64 {
        self.0.markers
    }

    pub fn end(self) -> End {
        match self.0.end {
            EndState::Exited(Some(GoodbyeReason::UnderscoreExit)) => End::UnderscoreExit,
            EndState::Exited(Some(GoodbyeReason::Detach)) => End::Detached,
            EndState::Exited(_) => End::Exited,
            EndState::Abrupt => End::Abrupt,
            EndState::Unheard(r) => End::Unheard(r),
            EndState::Running => End::Running,
            EndState::ProtocolError => End::ProtocolError,
        }
    }

    /// Events received.
    pub fn events(self) -> u64 {
        self.0.events
    }

    /// Events missing from the trace (see `Process::lost_events`).
    pub fn lost_events(self) -> u64 {
        self.0.lost_events()
    }

    /// Every device it used (-1: pinned host memory), in ascending order.
    pub fn devices(self) -> impl Iterator<Item = (i16, DeviceTotals)> + 'a {
        self.0.devices.iter().map(|(&d, s)| (d, totals(s)))
    }

    pub fn device(self, device: i16) -> Option<DeviceTotals> {
        self.0.devices.get(&device).map(totals)
    }

    /// The live allocation at `ptr`.
    pub fn live(self, ptr: u64) -> Option<LiveAlloc> {
        self.0.live.get(&ptr).map(|a| LiveAlloc {
            size: a.size,
            device: a.device,
            site: Site(a.site),
        })
    }

    /// The live tensor of PyTorch's caching allocator (its trace tracker) at `ptr`.
    pub fn tensor(self, ptr: u64) -> Option<LiveAlloc> {
        self.0.tensors.get(&ptr).map(|a| LiveAlloc {
            size: a.size,
            device: a.device,
            site: Site(a.site),
        })
    }

    /// The physical allocation with handle `handle`.
    pub fn handle(self, handle: u64) -> Option<Handle> {
        self.0.handles.get(&handle).map(|h| Handle {
            device: h.device,
            site: Site(h.site),
        })
    }

    /// The live bytes of each call site that allocated on `device`, in no particular order
    /// (sites that hold nothing now included, as 0).
    pub fn live_by_site(self, device: i16) -> impl Iterator<Item = (Site, u64)> + 'a {
        self.0
            .sites_on(device)
            .map(|(site, s)| (Site(site), s.live_bytes))
    }

    /// The most bytes each call site held at once on `device`, counting only memory that
    /// `DeviceTotals::live_bytes` counts (not the tensors of PyTorch's caching allocator, which
    /// lie inside its segments), in no particular order.
    pub fn site_peaks(self, device: i16) -> impl Iterator<Item = (Site, u64)> + 'a {
        self.0
            .sites_on(device)
            .filter(|(_, s)| {
                s.api
                    .is_none_or(|a| a.memory_class() != MemoryClass::Tensor)
            })
            .map(|(site, s)| (Site(site), s.peak_bytes))
    }

    /// Allocations of call site `site` on `device` freed in the step that made them (the
    /// report's temporaries; with no step markers the run is one step).
    pub fn site_temporaries(self, site: Site, device: i16) -> u64 {
        self.0
            .site_stats
            .get(&(site.0, device))
            .map_or(0, |s| s.temporary)
    }

    /// The live bytes of call site `site` on `device` (0 when it holds nothing there).
    pub fn site_live(self, site: Site, device: i16) -> u64 {
        self.0
            .site_stats
            .get(&(site.0, device))
            .map_or(0, |s| s.live_bytes)
    }
}

fn totals(s: &state::DeviceState) -> DeviceTotals {
    DeviceTotals {
        events: s.events,
        live_bytes: s.live_bytes,
        peak_bytes: s.peak_bytes,
        last_free: s.last_free,
        tensor_bytes: s.tensor_bytes,
        torch_reserved: s.torch_reserved_bytes,
    }
}

/// A replayed trace at its end.
pub struct Trace(oomtrace_collector::model::trace::Trace);

impl Trace {
    /// Its processes, in the order their connections opened.
    pub fn processes(&self) -> impl Iterator<Item = ProcessView<'_>> {
        self.0.processes.iter().map(ProcessView)
    }

    /// The process on connection `conn`; an error if there is none (the file changed
    /// between two replays).
    pub fn by_conn(&self, conn: u32) -> Result<ProcessView<'_>, Failure> {
        self.processes()
            .find(|p| p.conn() == conn)
            .ok_or_else(|| Failure::new("the trace file changed while it was exported"))
    }

    /// Things a reader should know (truncation, protocol errors), one sentence each.
    pub fn warnings(&self) -> &[String] {
        &self.0.warnings
    }

    /// One sentence per module whose file changed since the trace was taken: the
    /// [`Symbolizer`] gives its frames module and offset, no names.
    pub fn stale_module_warnings(&self) -> Vec<String> {
        module_file::stale_modules(self.0.processes.iter().map(Stacks::from))
            .iter()
            .map(|m| m.warning())
            .collect()
    }
}

/// Replays the trace file at `path`, showing each event and marker to `visit` with its
/// process's state just before it, and telling `progress(bytes read, file size)` as it goes;
/// returns the trace as it stands at the end.
pub fn replay(
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
    mut visit: impl FnMut(ProcessView<'_>, Seen<'_>),
) -> Result<Trace, Failure> {
    let trace = history::replay_with_progress(path, progress, |p, seen| {
        visit(ProcessView(p), Seen::from_collector(seen))
    })?;
    Ok(Trace(trace))
}

/// One symbolized frame. Empty strings and 0 mean unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: u32,
    /// File name of the module (executable or shared object).
    pub module: String,
    /// Absolute return address in the traced process, hex.
    pub address: String,
    /// Address within the module's file, hex.
    pub offset: String,
    /// A Python frame (`function` is the code object's qualified name, `module` "python").
    pub python: bool,
    /// Its module's file changed since the trace was taken: no name, only module and offset.
    pub module_changed: bool,
}

impl From<FrameInfo> for Frame {
    fn from(f: FrameInfo) -> Frame {
        Frame {
            function: f.function,
            file: f.file,
            line: f.line,
            module: f.module,
            address: f.address,
            offset: f.offset,
            python: f.python,
            module_changed: f.module_changed,
        }
    }
}

impl From<&Frame> for FrameInfo {
    fn from(f: &Frame) -> FrameInfo {
        FrameInfo {
            function: f.function.clone(),
            file: f.file.clone(),
            line: f.line,
            module: f.module.clone(),
            address: f.address.clone(),
            offset: f.offset.clone(),
            python: f.python,
            module_changed: f.module_changed,
        }
    }
}

/// Which of `frames` (innermost first) names the call site in one line, as every report
/// names it (the collector's `symbolize::culprit`: the innermost Python frame in the user's
/// own code, else the autograd node of a backward-pass allocation, else the innermost frame
/// that is not CUDA, allocator or interpreter machinery); `None` for no frames.
pub fn culprit(frames: &[Frame]) -> Option<usize> {
    let infos: Vec<FrameInfo> = frames.iter().map(FrameInfo::from).collect();
    let found = symbolize::culprit(&infos)?;
    infos.iter().position(|f| std::ptr::eq(f, found))
}

/// Whether `frames` (innermost first) are a call site in PyTorch's backward pass (no Python
/// frames, an autograd node or the autograd engine among them): named by
/// [`Symbolizer::backward`], as every report names it.
pub fn in_backward(frames: &[Frame]) -> bool {
    let infos: Vec<FrameInfo> = frames.iter().map(FrameInfo::from).collect();
    backward::in_backward(&infos)
}

/// Whether a frame is machinery between the user's code and the GPU that a summary looks
/// past (the CUDA runtime, an allocator, the interpreter's own native code), by the
/// collector's classification (`roles::FrameRole`).
pub fn is_machinery(f: &Frame) -> bool {
    FrameRole::of(&FrameInfo::from(f)).is_internal()
}

/// A call site in PyTorch's backward pass, as every report names it (the collector's
/// `report::backward`): by the forward line whose op made its autograd node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackwardName {
    /// `backward of addmm at train.py:25`, `backward at train.py:27 (autograd engine)`.
    pub name: String,
    /// The Python frames of its forward line's call site (those its lines share when it has
    /// several), outermost first; empty when no line is known.
    pub path: Vec<Frame>,
    /// What it is under `path` in a flame graph: `backward of addmm` (`name` when `path` is
    /// empty).
    pub leaf: String,
    /// What it is without its lines (`backward of addmm`), and the file and line of its first
    /// line, when one is known: a frame of its own for formats with frames of their own.
    pub what: String,
    pub line: Option<(String, u32)>,
}

/// Symbolizes call sites (caching what it read of each module), and names those of the
/// backward pass (reading each process's other sites once).
pub struct Symbolizer {
    sym: StackSymbolizer,
    /// By connection.
    backward: HashMap<u32, backward::Lookup>,
}

impl Default for Symbolizer {
    fn default() -> Symbolizer {
        Symbolizer::new()
    }
}

impl Symbolizer {
    pub fn new() -> Symbolizer {
        Symbolizer {
            sym: StackSymbolizer::new(),
            backward: HashMap::new(),
        }
    }

    /// The frames of `site` in process `p`, innermost first; inlined calls are frames of
    /// their own.
    pub fn site(&mut self, p: ProcessView<'_>, site: Site) -> Vec<Frame> {
        self.sym
            .site(p.0, site.0)
            .into_iter()
            .map(Frame::from)
            .collect()
    }

    /// The name of a call site of `p` with `frames` in PyTorch's backward pass; `None` for
    /// any other. The first one of a process reads its other sites: ask with the process as
    /// it stands at the end of the trace (its forward lines all seen).
    pub fn backward(&mut self, p: ProcessView<'_>, frames: &[Frame]) -> Option<BackwardName> {
        let infos: Vec<FrameInfo> = frames.iter().map(FrameInfo::from).collect();
        if !backward::in_backward(&infos) {
            return None;
        }
        let Symbolizer { sym, backward } = self;
        let lookup = backward.entry(p.conn()).or_default();
        let b = lookup.backward(p.0, &infos, &mut |s| sym.site(p.0, s))?;
        Some(BackwardName {
            name: b.to_string(),
            path: b.forward_path().into_iter().map(Frame::from).collect(),
            leaf: b.leaf(),
            what: b.what(),
            line: b.first_line().map(|(file, line)| (file.to_string(), line)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The json export writes a [`Frame`] as the collector's frame serializes into a JSON value
    /// (what the export wrote before this view): the same value, so the same bytes, with and
    /// without the `python` and `module_changed` flags.
    #[test]
    fn frames_are_written_as_the_collectors_serialize() {
        for (python, module_changed) in [(false, false), (true, false), (false, true)] {
            let f = FrameInfo {
                function: "train_step".into(),
                file: "/src/train.py".into(),
                line: 42,
                module: "python".into(),
                address: "0x7f00".into(),
                offset: "0x10".into(),
                python,
                module_changed,
            };
            let theirs = serde_json::to_value(&f).unwrap();
            let ours = super::super::json::frame_json(&Frame::from(f));
            assert_eq!(ours, theirs);
            assert_eq!(ours.to_string(), theirs.to_string());
        }
    }
}
