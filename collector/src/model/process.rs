//! Process accounting: how a process is made from its Hello, what it is (pid, command,
//! rank), how its stream ended, and what it made against what arrived. Also the records of
//! its live tables (`LiveAlloc`, `PhysHandle`, `Mapping`).

use std::collections::BTreeMap;

use oomtrace_proto::launch::Launch;
use oomtrace_proto::wire::{GoodbyeReason, Hello, Lost};
use oomtrace_proto::Api;
use rustc_hash::FxHashMap;

use super::frames::Stacks;
use super::sites::StackSites;
use super::{DeviceMap, Process, SiteId};

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
    /// Mapped into a segment of PyTorch's caching allocator (expandable segments): reserve,
    /// as [`LiveAlloc::reserve`].
    pub reserve: bool,
}

#[derive(Clone, Debug)]
pub struct Mapping {
    pub size: u64,
    pub handle: u64,
    pub offset: u64,
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

impl Process {
    /// Whether its stream never has step markers (a PyTorch snapshot): its steps are the
    /// epochs found. A traced program's first marker may come late, so the lack of one so far
    /// says nothing.
    pub fn never_marks_steps(&self) -> bool {
        self.hello.flags & oomtrace_proto::wire::hello_flags::NO_STEP_MARKERS != 0
    }

    pub fn new(conn: u32, hello: Hello) -> Process {
        Process {
            conn,
            launch: Launch::from_vars(&hello.launch),
            hello,
            end: EndState::Running,
            devices: DeviceMap::new(),
            live: FxHashMap::default(),
            tensors: FxHashMap::default(),
            handles: FxHashMap::default(),
            mappings: BTreeMap::new(),
            reservations: FxHashMap::default(),
            modules: Vec::new(),
            codes: FxHashMap::default(),
            named_frames: FxHashMap::default(),
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
    pub(super) fn learn_launch(&mut self, vars: &[(String, String)]) {
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

    pub(super) fn touch(&mut self, seq: u64, ts: u64) {
        if self.first_ts_ns == 0 {
            self.first_ts_ns = ts;
        }
        self.last_ts_ns = self.last_ts_ns.max(ts);
        self.last_seq = self.last_seq.max(seq);
    }
}
