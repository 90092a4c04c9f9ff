//! What the memory is: a role for every PyTorch tensor (parameter, gradient, optimizer state,
//! activation, temporary, input, other), and a device's bytes split into those roles, the
//! caching allocator's reserve gap and the memory outside PyTorch, at the device's peak, at
//! each out-of-memory and at each step's end. docs/anatomy.md states the rule for users.
//!
//! Decided from PyTorch's own structure, at no cost in the traced process: the Python frames
//! of each tensor's call site say where it was made (inside `torch/optim/`: the optimizer;
//! under a module call, `Module._call_impl`: a forward pass; `Module._apply` (`.to()`,
//! `.cuda()`) or a module's `__init__`: a parameter or buffer; a thread that runs no Python
//! in a Python program: PyTorch's autograd engine, the backward pass), each site classified
//! once. Those origins drive a phase clock (forward, backward, optimizer; a step marker ends
//! the step), and a tensor's role follows from the phase it was made in and when it went:
//!
//! | made in | freed in the same phase | freed later in its step | outlived its step |
//! |---|---|---|---|
//! | a parameter's origin | parameter | parameter | parameter |
//! | the optimizer | temporary | temporary | optimizer state |
//! | the backward pass | temporary | temporary | gradient |
//! | a forward pass | temporary | activation | other (kept past its step) |
//! | between steps (before the forward) | temporary | input | input for one step, then other |
//!
//! A tensor still alive when the trace ends, in the step it was made in, counts as what it
//! was becoming (a forward pass's tensor as an activation: the backward that would free it
//! never ran). Where no rule decides (no Python frames anywhere: stacks off, a C++ program)
//! the role is `other`, never a guess.
//!
//! A moment's tensors are known only once each of them is gone: the peak (the device's
//! largest total, taken at the first free after it, so that every tensor made into the new
//! segment counts) and each out-of-memory keep the roles of their tensors as those are freed,
//! and those still alive are settled when the report asks. O(1) per tensor event (one hash
//! insert or remove), O(live tensors) per report.

use std::collections::BTreeMap;

use oomtrace_proto::python::PyFrame;
use oomtrace_proto::{MemoryClass, DEVICE_UNKNOWN};
use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::model::{is_oomtrace_python_file, Alloc, DeviceMap, Free, OutOfMemory, Process, SiteId};

/// What a tensor is to the program. Pinned order: the JSON and text list roles this way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Parameters and buffers of modules.
    Parameter,
    Gradient,
    OptimizerState,
    /// Made in a forward pass and alive into the backward pass (saved for backward).
    Activation,
    /// Freed in the phase that made it.
    Temporary,
    /// Made outside forward, backward and optimizer: batches, `.to("cuda")`.
    Input,
    /// A library's workspace PyTorch allocates as a tensor (cuBLAS's, per handle and stream),
    /// told by the native frames of its call site when the report names them.
    Workspace,
    /// Kept past its step (a forward output a program holds on to), or undecided.
    Other,
}

/// Every role, in the order they are shown.
pub const ROLES: [Role; 8] = [
    Role::Parameter,
    Role::Gradient,
    Role::OptimizerState,
    Role::Activation,
    Role::Temporary,
    Role::Input,
    Role::Workspace,
    Role::Other,
];

impl Role {
    /// Its name in the JSON contract.
    pub fn name(self) -> &'static str {
        match self {
            Role::Parameter => "parameter",
            Role::Gradient => "gradient",
            Role::OptimizerState => "optimizer_state",
            Role::Activation => "activation",
            Role::Temporary => "temporary",
            Role::Input => "input",
            Role::Workspace => "workspace",
            Role::Other => "other",
        }
    }

    /// As a text report names its bytes.
    pub fn words(self) -> &'static str {
        match self {
            Role::Parameter => "parameters",
            Role::Gradient => "gradients",
            Role::OptimizerState => "optimizer state",
            Role::Activation => "activations",
            Role::Temporary => "temporaries",
            Role::Input => "inputs",
            Role::Workspace => "library workspaces",
            Role::Other => "other tensors",
        }
    }
}

/// Bytes per role, indexed by `Role as usize`.
pub type RoleBytes = [u64; ROLES.len()];

/// Where a call site says its tensors were made (its Python frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Parameter,
    Optimizer,
    Forward,
    Backward,
    /// The program's own code outside modules and the optimizer.
    Outside,
    /// No Python frame at all.
    NoPython,
}

/// The phase clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Forward,
    Backward,
    Optimizer,
}

/// What a tensor was made as: its origin read with the phase it was made in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Made {
    Parameter,
    Optimizer,
    Backward,
    Forward,
    /// Between steps, before a forward pass.
    Idle,
    /// Nothing decides (no Python frames in the process).
    Unknown,
}

const MADE_KINDS: usize = 6;

impl Made {
    /// What it is once it has outlived its step (what a step's end shows).
    fn survivor(self) -> Role {
        match self {
            Made::Parameter => Role::Parameter,
            Made::Optimizer => Role::OptimizerState,
            Made::Backward => Role::Gradient,
            Made::Forward | Made::Unknown => Role::Other,
            Made::Idle => Role::Input,
        }
    }

    /// Whether a survivor of this kind may be a library's workspace (kept by call site).
    fn ambiguous(self) -> bool {
        matches!(self, Made::Backward | Made::Forward | Made::Unknown)
    }

    /// What it is when the trace ends in the step that made it.
    fn unfinished(self) -> Role {
        match self {
            Made::Forward => Role::Activation,
            other => other.survivor(),
        }
    }
}

/// What a call site's latest tensor was made as, and its place in the order of tensor events
/// (of two sites, the one whose latest tensor came later has the larger `order`): what the
/// analysis reads to tell a forward output from the tensors its graph keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteMade {
    pub made: Made,
    pub order: u64,
}

/// A live tensor as the anatomy keeps it.
#[derive(Clone, Copy, Debug)]
struct Born {
    /// Its place in the order of tensor events (a moment's tensors are those born before it).
    order: u64,
    site: SiteId,
    size: u64,
    made: Made,
    /// The phase run and step it was made in.
    run: u32,
    step: u64,
}

/// How a tensor's life ended, for its role.
#[derive(Clone, Copy, Debug)]
enum Fate {
    Freed {
        run: u32,
        step: u64,
    },
    /// Alive when the report asked, in step `now`.
    Alive {
        now: u64,
    },
}

fn role(b: &Born, fate: Fate) -> Role {
    // A tensor made between steps is the next forward's input; one still alive after the
    // step that followed (in a list, a cache) is kept, not an input.
    let lived = match fate {
        Fate::Freed { step, .. } => step.saturating_sub(b.step),
        Fate::Alive { now } => now.saturating_sub(b.step),
    };
    if b.made == Made::Idle && lived >= 2 {
        return Role::Other;
    }
    let (survived, same_run) = match fate {
        Fate::Freed { run, step } => (step > b.step, run == b.run),
        Fate::Alive { now } => {
            if now == b.step {
                return b.made.unfinished();
            }
            (true, false)
        }
    };
    if survived {
        return b.made.survivor();
    }
    match b.made {
        Made::Parameter => Role::Parameter,
        Made::Optimizer | Made::Backward => Role::Temporary,
        Made::Forward if same_run => Role::Temporary,
        Made::Forward => Role::Activation,
        Made::Idle if same_run => Role::Temporary,
        Made::Idle => Role::Input,
        Made::Unknown => Role::Other,
    }
}

/// One moment of a device (its peak, an out-of-memory) while its tensors' roles are settled.
#[derive(Clone, Debug)]
struct Moment {
    /// Tensors born up to this place in the order are the moment's.
    order: u64,
    ts_ns: u64,
    step: u64,
    device_bytes: u64,
    reserved_bytes: u64,
    tensor_bytes: u64,
    /// Bytes of the moment's tensors freed since, by call site and role (the report may
    /// still tell a site's tensors a library's workspace).
    freed: FxHashMap<(SiteId, Role), u64>,
    /// Device memory outside PyTorch's caching allocator at the moment, by library.
    outside: Vec<(String, u64)>,
}

impl Moment {
    fn count(&mut self, b: &Born, role: Role) {
        add(self.freed.entry((b.site, role)).or_default(), b.size);
    }
}

/// A device's anatomy at one moment, settled: what the report shows.
#[derive(Clone, Debug)]
pub struct MomentAnatomy {
    pub ts_ns: u64,
    /// Step markers counted before it.
    pub step: u64,
    /// All of the device's tracked memory then: the tensors' roles, the reserve gap and the
    /// memory outside PyTorch add up to it exactly.
    pub device_bytes: u64,
    pub roles: RoleBytes,
    /// The live tensors' bytes as the model counted them then: the roles add up to it
    /// unless events were lost.
    pub tracked_tensor_bytes: u64,
    /// The caching allocator's reserve not in tensors.
    pub reserve_gap_bytes: u64,
    /// Device memory that is not PyTorch's reserve (cuBLAS workspaces, NCCL, extensions).
    pub outside_bytes: u64,
    /// `outside_bytes` by the library that allocated it, largest first.
    pub outside: Vec<(String, u64)>,
    /// The activations by call site, largest first.
    pub activation_sites: Vec<(SiteId, u64)>,
}

/// The live tensors' roles at one step's end (a step marker).
#[derive(Clone, Debug)]
pub struct StepAnatomy {
    pub step: u64,
    pub ts_ns: u64,
    pub roles: RoleBytes,
}

/// A step's end as kept until the report: the roles, and the gradients' and other tensors'
/// bytes by call site (where a library's workspace hides until the report names the sites).
#[derive(Clone, Debug)]
struct StepEnd {
    step: u64,
    ts_ns: u64,
    roles: RoleBytes,
    by_site: Vec<(SiteId, Role, u64)>,
}

/// A device's anatomy, settled for a report.
#[derive(Clone, Debug)]
pub struct DeviceAnatomy {
    pub device: i16,
    pub at_peak: Option<MomentAnatomy>,
    pub at_oom: Vec<MomentAnatomy>,
    pub per_step: Vec<StepAnatomy>,
}

/// Out-of-memory moments kept per device (the first ones: a program rarely survives many).
const MAX_OOM_MOMENTS: usize = 8;
/// Step ends kept per device: every step up to this many, then every second one, every
/// fourth, ... (halved in place when full).
const MAX_STEPS: usize = 256;

impl DeviceClock {
    /// The moment of this device's peak, its tensors those born up to `order`.
    fn peak_moment(
        &self,
        order: u64,
        (tensor_bytes, reserved_bytes): (u64, u64),
        outside: Vec<(String, u64)>,
    ) -> Moment {
        Moment {
            order,
            ts_ns: self.peak_ts_ns,
            step: self.peak_step,
            device_bytes: self.peak_bytes,
            reserved_bytes,
            tensor_bytes,
            freed: FxHashMap::default(),
            outside,
        }
    }

    /// A live tensor gone from the running totals.
    fn forget(&mut self, b: &Born) {
        let i = b.made as usize;
        self.live_by_made[i] = self.live_by_made[i].saturating_sub(b.size);
        if b.made == Made::Idle {
            if b.step < self.idle_fold_below {
                self.idle_folded = self.idle_folded.saturating_sub(b.size);
            } else if let Some(v) = self.idle_by_step.get_mut(&b.step) {
                // A step's entry stays at 0 until the step's end folds it: a loop making and
                // freeing tensors between steps would otherwise insert and remove a tree node
                // for each (a third of the anatomy's work a tensor). Its readers take a
                // missing step as 0, and the fold adds 0.
                *v = v.saturating_sub(b.size);
            }
        }
        if b.made.ambiguous() {
            let key = (b.site, b.made as u8);
            if let Some(v) = self.live_ambiguous.get_mut(&key) {
                *v = v.saturating_sub(b.size);
                if *v == 0 {
                    self.live_ambiguous.remove(&key);
                }
            }
        }
    }
}

#[derive(Clone, Debug, Default)]
struct DeviceClock {
    /// The device's largest tracked total so far, and whether no event has come since it
    /// was reached (its moment is taken at the next).
    peak_bytes: u64,
    peak_ts_ns: u64,
    peak_step: u64,
    peak_pending: bool,
    peak: Option<Moment>,
    ooms: Vec<Moment>,
    live_by_made: [u64; MADE_KINDS],
    /// Live bytes made between steps, by the step that made them, for the steps from
    /// `idle_fold_below` on; those of earlier steps (kept past the step that used them, no
    /// longer inputs) are summed in `idle_folded`.
    idle_by_step: BTreeMap<u64, u64>,
    idle_folded: u64,
    idle_fold_below: u64,
    /// Live bytes of the kinds whose survivors may be a library's workspace (backward,
    /// forward, undecided), by call site.
    live_ambiguous: FxHashMap<(SiteId, u8), u64>,
    steps: Vec<StepEnd>,
    step_stride: u64,
}

/// The anatomy of one process (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct Anatomy {
    /// Origin of each site by its index, once classified (None until first seen).
    origins: Vec<Option<Origin>>,
    /// A site with Python frames has been seen: a site without any is PyTorch's own thread.
    python_seen: bool,
    phase: Option<PhaseState>,
    order: u64,
    live: FxHashMap<(i16, u64), Born>,
    devices: DeviceMap<DeviceClock>,
    /// Each site's latest tensor, by the site's index.
    made: Vec<Option<SiteMade>>,
}

#[derive(Clone, Copy, Debug)]
struct PhaseState {
    phase: Phase,
    run: u32,
    step: u64,
}

impl Default for PhaseState {
    fn default() -> Self {
        PhaseState {
            phase: Phase::Idle,
            run: 0,
            step: 0,
        }
    }
}

impl Anatomy {
    fn clock(&self) -> PhaseState {
        self.phase.unwrap_or_default()
    }

    fn origin(&mut self, p: &Process, site: SiteId) -> Origin {
        let i = site.0 as usize;
        if let Some(Some(o)) = self.origins.get(i) {
            return *o;
        }
        let o = classify(p, site);
        if o != Origin::NoPython {
            self.python_seen = true;
        }
        if self.origins.len() <= i {
            self.origins.resize(i + 1, None);
        }
        self.origins[i] = Some(o);
        o
    }

    pub fn on_alloc(&mut self, p: &Process, a: &Alloc) {
        let class = a.api.memory_class();
        if class == MemoryClass::Tensor {
            self.on_tensor(p, a);
        } else if class.on_device() && a.device != DEVICE_UNKNOWN {
            let total = a.device_live_before.saturating_add(a.size);
            let step = self.clock().step;
            let d = self.devices.entry(a.device).or_default();
            if total > d.peak_bytes {
                d.peak_bytes = total;
                d.peak_ts_ns = a.ts_ns;
                d.peak_step = step;
                d.peak_pending = true;
            }
        }
    }

    /// What a tensor made now at `site` would be made as (an out-of-memory's request: what
    /// `fit` scales it by), the phase clock left as it is.
    pub fn would_make(&mut self, p: &Process, site: SiteId) -> Made {
        self.made_now(p, site).0
    }

    /// What a tensor made now at `site` is made as, and the phase clock it moves to.
    fn made_now(&mut self, p: &Process, site: SiteId) -> (Made, PhaseState) {
        let origin = self.origin(p, site);
        let mut clock = self.clock();
        let next = match origin {
            Origin::Forward => Some(Phase::Forward),
            Origin::Backward => Some(Phase::Backward),
            Origin::NoPython if self.python_seen => Some(Phase::Backward),
            Origin::Optimizer => Some(Phase::Optimizer),
            // Without step markers (a PyTorch snapshot) nothing says a step ended: the
            // program's own code after a backward pass or an optimizer step is between steps.
            // With markers the marker says it.
            Origin::Outside
                if p.never_marks_steps()
                    && matches!(clock.phase, Phase::Backward | Phase::Optimizer) =>
            {
                Some(Phase::Idle)
            }
            _ => None,
        };
        if let Some(next) = next.filter(|&n| n != clock.phase) {
            clock.phase = next;
            clock.run += 1;
        }
        let made = match (origin, clock.phase) {
            (Origin::Parameter, _) => Made::Parameter,
            (Origin::NoPython, _) if !self.python_seen => Made::Unknown,
            (_, Phase::Optimizer) => Made::Optimizer,
            (_, Phase::Backward) => Made::Backward,
            (_, Phase::Forward) => Made::Forward,
            (_, Phase::Idle) => Made::Idle,
        };
        (made, clock)
    }

    fn on_tensor(&mut self, p: &Process, a: &Alloc) {
        let (made, clock) = self.made_now(p, a.site);
        self.phase = Some(clock);
        self.order += 1;
        let born = Born {
            order: self.order,
            site: a.site,
            size: a.size,
            made,
            run: clock.run,
            step: clock.step,
        };
        let i = a.site.0 as usize;
        if self.made.len() <= i {
            self.made.resize(i + 1, None);
        }
        self.made[i] = Some(SiteMade {
            made,
            order: self.order,
        });
        let d = self.devices.entry(a.device).or_default();
        add(&mut d.live_by_made[made as usize], a.size);
        if made.ambiguous() {
            add(
                d.live_ambiguous.entry((a.site, made as u8)).or_default(),
                a.size,
            );
        }
        if made == Made::Idle {
            if clock.step < d.idle_fold_below {
                add(&mut d.idle_folded, a.size);
            } else {
                add(d.idle_by_step.entry(clock.step).or_default(), a.size);
            }
        }
        // An address given again without its free: the old tensor's free was lost (the model
        // has dropped it the same way).
        if let Some(old) = self.live.insert((a.device, a.ptr), born) {
            d.forget(&old);
        }
    }

    /// What `site`'s latest tensor was made as (None: it made no tensor).
    pub fn site_made(&self, site: SiteId) -> Option<SiteMade> {
        self.made.get(site.0 as usize).copied().flatten()
    }

    /// A free; for a tensor, what it was made as and the role its life gave it (what
    /// `fit` scales by).
    pub fn on_free(&mut self, p: &Process, f: &Free) -> Option<(Made, Role)> {
        let class = f.api.memory_class();
        if class != MemoryClass::Tensor && !class.on_device() {
            return None;
        }
        let tensor = class == MemoryClass::Tensor;
        self.take_pending_peak(p, f, tensor);
        if !tensor {
            return None;
        }
        let b = self.live.remove(&(f.device, f.ptr))?;
        let clock = self.clock();
        let r = role(
            &b,
            Fate::Freed {
                run: clock.run,
                step: clock.step,
            },
        );
        if let Some(d) = self.devices.get_mut(&f.device) {
            d.forget(&b);
            if let Some(m) = d.peak.as_mut().filter(|m| b.order <= m.order) {
                m.count(&b, r);
            }
            for m in d.ooms.iter_mut().filter(|m| b.order <= m.order) {
                m.count(&b, r);
            }
        }
        Some((b.made, r))
    }

    /// What a tensor still alive is made as, and its role were the trace to end now (as a
    /// report settles it), if it is one.
    pub fn alive(&self, device: i16, ptr: u64) -> Option<(Made, Role)> {
        let b = self.live.get(&(device, ptr))?;
        Some((
            b.made,
            role(
                b,
                Fate::Alive {
                    now: self.clock().step,
                },
            ),
        ))
    }

    /// The first free after the device reached a new peak: the moment of the peak is now,
    /// with this free not yet applied (the model has applied it: add it back).
    fn take_pending_peak(&mut self, p: &Process, f: &Free, tensor: bool) {
        let order = self.order;
        let Some(d) = self.devices.get_mut(&f.device) else {
            return;
        };
        if !d.peak_pending {
            return;
        }
        d.peak_pending = false;
        let (tensor_bytes, reserved) = torch_bytes(p, f.device);
        let (tensor_bytes, reserved) = if tensor {
            (tensor_bytes.saturating_add(f.size), reserved)
        } else if f.reserve {
            (tensor_bytes, reserved.saturating_add(f.size))
        } else {
            (tensor_bytes, reserved)
        };
        let mut outside = outside_by_library(p, f.device);
        if !tensor && !f.reserve {
            add_library(&mut outside, library_of(p, f.site), f.size);
        }
        d.peak = Some(d.peak_moment(order, (tensor_bytes, reserved), outside));
    }

    pub fn on_out_of_memory(&mut self, p: &Process, o: &OutOfMemory) {
        // Where PyTorch's tensors are traced, a refused cudaMalloc inside its allocator is not
        // yet an out-of-memory (it frees its cache and retries); the tensor it could not
        // place is, and that is the moment kept.
        let tensors = p
            .devices
            .get(&o.device)
            .is_some_and(|d| d.tensor_tally.allocations > 0);
        if tensors && o.api.memory_class() != MemoryClass::Tensor {
            return;
        }
        let order = self.order;
        let step = self.clock().step;
        let d = self.devices.entry(o.device).or_default();
        if d.ooms.len() >= MAX_OOM_MOMENTS {
            return;
        }
        let (tensor_bytes, reserved) = torch_bytes(p, o.device);
        d.ooms.push(Moment {
            order,
            ts_ns: o.ts_ns,
            step,
            device_bytes: o.live_bytes,
            reserved_bytes: reserved,
            tensor_bytes,
            freed: FxHashMap::default(),
            outside: outside_by_library(p, o.device),
        });
    }

    /// A step marker: each device's live tensors at the step's end, then the next step.
    pub fn on_step(&mut self, ts_ns: u64) {
        let clock = self.clock();
        if !self.live.is_empty() {
            for d in self.devices.values_mut() {
                if d.live_by_made.iter().all(|&b| b == 0) {
                    continue;
                }
                let stride = d.step_stride.max(1);
                if clock.step.is_multiple_of(stride) {
                    let mut roles = [0u64; ROLES.len()];
                    for (i, made) in MADE.iter().enumerate() {
                        add(&mut roles[made.survivor() as usize], d.live_by_made[i]);
                    }
                    // Made between steps before this one and still alive: kept, not inputs.
                    let inputs = d.idle_by_step.get(&clock.step).copied().unwrap_or(0);
                    let kept = d.live_by_made[Made::Idle as usize].saturating_sub(inputs);
                    roles[Role::Input as usize] = roles[Role::Input as usize].saturating_sub(kept);
                    add(&mut roles[Role::Other as usize], kept);
                    let by_site = d
                        .live_ambiguous
                        .iter()
                        .map(|(&(site, made), &bytes)| {
                            (site, MADE[made as usize].survivor(), bytes)
                        })
                        .collect();
                    d.steps.push(StepEnd {
                        step: clock.step + 1,
                        ts_ns,
                        roles,
                        by_site,
                    });
                    if d.steps.len() >= MAX_STEPS {
                        let mut keep = 0;
                        d.steps.retain(|_| {
                            keep += 1;
                            keep % 2 == 1
                        });
                        d.step_stride = stride * 2;
                    }
                }
            }
        }
        for d in self.devices.values_mut() {
            // Tensors made before the step that just ended have outlived their use.
            let old: Vec<u64> = d
                .idle_by_step
                .range(..clock.step)
                .map(|(&k, _)| k)
                .collect();
            for k in old {
                add(&mut d.idle_folded, d.idle_by_step.remove(&k).unwrap_or(0));
            }
            d.idle_fold_below = clock.step;
        }
        self.phase = Some(PhaseState {
            phase: Phase::Idle,
            run: clock.run + 1,
            step: clock.step + 1,
        });
    }

    /// Each device's anatomy, its tensors still alive settled as alive now; a call site that
    /// `workspace` says allocates a library's workspace has its tensors in that role.
    pub fn report(
        &self,
        p: &Process,
        workspace: &mut dyn FnMut(SiteId) -> bool,
    ) -> Vec<DeviceAnatomy> {
        let mut known: FxHashMap<SiteId, bool> = FxHashMap::default();
        let mut is_workspace = |site: SiteId| *known.entry(site).or_insert_with(|| workspace(site));
        let now = self.clock().step;
        let mut out = Vec::new();
        for (&device, d) in &self.devices {
            // Only where PyTorch's tensors are traced.
            let tensors = p
                .devices
                .get(&device)
                .is_some_and(|dev| dev.tensor_tally.allocations > 0);
            if !tensors {
                continue;
            }
            // A peak still pending (no free since it) is newer than the last one taken: it is
            // now. (Taking the older one instead named a peak below the device's own when the
            // program ended, or ran out of memory, still holding its largest total.)
            let peak = if d.peak_pending {
                Some(self.moment_now(p, device, d))
            } else {
                d.peak.clone()
            };
            let at_peak = peak
                .as_ref()
                .map(|m| self.settle(device, m, now, &mut is_workspace));
            let at_oom = d
                .ooms
                .iter()
                .map(|m| self.settle(device, m, now, &mut is_workspace))
                .collect();
            let per_step = d
                .steps
                .iter()
                .map(|s| {
                    let mut roles = s.roles;
                    for &(site, role, bytes) in &s.by_site {
                        if is_workspace(site) {
                            roles[role as usize] = roles[role as usize].saturating_sub(bytes);
                            add(&mut roles[Role::Workspace as usize], bytes);
                        }
                    }
                    StepAnatomy {
                        step: s.step,
                        ts_ns: s.ts_ns,
                        roles,
                    }
                })
                .collect();
            out.push(DeviceAnatomy {
                device,
                at_peak,
                at_oom,
                per_step,
            });
        }
        out
    }

    fn moment_now(&self, p: &Process, device: i16, d: &DeviceClock) -> Moment {
        d.peak_moment(
            self.order,
            torch_bytes(p, device),
            outside_by_library(p, device),
        )
    }

    fn settle(
        &self,
        device: i16,
        m: &Moment,
        now: u64,
        is_workspace: &mut dyn FnMut(SiteId) -> bool,
    ) -> MomentAnatomy {
        let mut parts = m.freed.clone();
        for (&(d, _), b) in &self.live {
            if d != device || b.order > m.order {
                continue;
            }
            add(
                parts
                    .entry((b.site, role(b, Fate::Alive { now })))
                    .or_default(),
                b.size,
            );
        }
        let mut roles = [0u64; ROLES.len()];
        let mut activations: FxHashMap<SiteId, u64> = FxHashMap::default();
        for (&(site, r), &bytes) in &parts {
            let r = if r != Role::Parameter && r != Role::OptimizerState && is_workspace(site) {
                Role::Workspace
            } else {
                r
            };
            add(&mut roles[r as usize], bytes);
            if r == Role::Activation {
                add(activations.entry(site).or_default(), bytes);
            }
        }
        let tensors: u64 = roles.iter().fold(0u64, |t, &b| t.saturating_add(b));
        // The parts add up to the device's bytes: tensors, then the rest of the reserve, then
        // what lies outside it. (Tensors over the reserve, which only lost events could make,
        // leave no gap.)
        let reserve_gap_bytes = m.reserved_bytes.saturating_sub(tensors);
        let outside_bytes = m
            .device_bytes
            .saturating_sub(tensors)
            .saturating_sub(reserve_gap_bytes);
        let mut activation_sites: Vec<(SiteId, u64)> = activations.into_iter().collect();
        activation_sites.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        MomentAnatomy {
            ts_ns: m.ts_ns,
            step: m.step,
            device_bytes: m.device_bytes,
            roles,
            tracked_tensor_bytes: m.tensor_bytes,
            reserve_gap_bytes,
            outside_bytes,
            outside: m.outside.clone(),
            activation_sites,
        }
    }
}

// ---- The JSON contract's shapes (docs/json-report.md), filled by the report ----------------

/// A device's anatomy (docs/anatomy.md, docs/json-report.md).
#[derive(Clone, Debug, Serialize)]
pub struct AnatomyReport {
    /// At the device's peak (`peak_bytes`): the parts add up to it exactly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_peak: Option<AnatomyMoment>,
    /// At each out-of-memory of the device (the first 8), in order.
    pub at_oom: Vec<AnatomyMoment>,
    /// The live tensors by role at each step's end (every step up to 256, then evenly
    /// spaced ones).
    pub per_step: Vec<AnatomyStep>,
}

/// Bytes of PyTorch's tensors by role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RoleBytesReport {
    pub parameter: u64,
    pub gradient: u64,
    pub optimizer_state: u64,
    pub activation: u64,
    pub temporary: u64,
    pub input: u64,
    /// Added after the first seven: a library's workspace allocated as a tensor.
    pub workspace: u64,
    pub other: u64,
}

impl RoleBytesReport {
    pub fn of(r: &RoleBytes) -> RoleBytesReport {
        RoleBytesReport {
            parameter: r[Role::Parameter as usize],
            gradient: r[Role::Gradient as usize],
            optimizer_state: r[Role::OptimizerState as usize],
            activation: r[Role::Activation as usize],
            temporary: r[Role::Temporary as usize],
            input: r[Role::Input as usize],
            workspace: r[Role::Workspace as usize],
            other: r[Role::Other as usize],
        }
    }

    /// (role name as the text says it, bytes), in the pinned order.
    pub fn parts(&self) -> [(&'static str, u64); 8] {
        [
            ("parameters", self.parameter),
            ("gradients", self.gradient),
            ("optimizer state", self.optimizer_state),
            ("activations", self.activation),
            ("temporaries", self.temporary),
            ("inputs", self.input),
            ("library workspaces", self.workspace),
            ("other tensors", self.other),
        ]
    }

    pub fn total(&self) -> u64 {
        self.parts()
            .iter()
            .fold(0u64, |t, (_, b)| t.saturating_add(*b))
    }
}

/// A device at one moment: its bytes split into the tensors' roles, the reserve gap and the
/// memory outside PyTorch (`roles` total + `reserve_gap_bytes` + `outside_pytorch_bytes` =
/// `device_bytes`).
#[derive(Clone, Debug, Serialize)]
pub struct AnatomyMoment {
    /// Seconds since the process's first event.
    pub at_s: f64,
    /// The moment on the events' clock (what an out-of-memory finding is matched by).
    #[serde(skip)]
    pub ts_ns: u64,
    /// Step markers counted before it.
    pub step: u64,
    pub device_bytes: u64,
    pub roles: RoleBytesReport,
    /// The tensors' bytes (the roles' sum).
    pub tensor_bytes: u64,
    /// PyTorch's reserve (its segments) not in tensors.
    pub reserve_gap_bytes: u64,
    /// Device memory that is not PyTorch's reserve.
    pub outside_pytorch_bytes: u64,
    /// `outside_pytorch_bytes` by the library that allocated it, largest first.
    pub outside_pytorch: Vec<LibraryBytes>,
    /// The largest activations by the line that made them, largest first (at most 5).
    pub activations: Vec<LineBytes>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LibraryBytes {
    pub library: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LineBytes {
    pub function: String,
    pub file: String,
    pub line: u32,
    pub bytes: u64,
}

/// The live tensors by role at one step's end.
#[derive(Clone, Debug, Serialize)]
pub struct AnatomyStep {
    /// The step marker it follows (1 = the first).
    pub step: u64,
    pub at_s: f64,
    pub roles: RoleBytesReport,
}

const MADE: [Made; MADE_KINDS] = [
    Made::Parameter,
    Made::Optimizer,
    Made::Backward,
    Made::Forward,
    Made::Idle,
    Made::Unknown,
];

/// Adds bytes, saturating: a trace's sizes are whatever the file says (a hostile one claims
/// sizes near 2^64), and no sum may wrap or panic.
fn add(slot: &mut u64, bytes: u64) {
    *slot = slot.saturating_add(bytes);
}

/// The model's live tensor bytes and PyTorch's reserve on `device` now.
fn torch_bytes(p: &Process, device: i16) -> (u64, u64) {
    p.devices.get(&device).map_or((0, 0), |dev| {
        (dev.tensor_bytes, dev.torch_reserved_bytes.unwrap_or(0))
    })
}

/// The origin of a call site, from its Python frames (innermost first): the first rule that
/// a frame matches, in this order.
fn classify(p: &Process, site: SiteId) -> Origin {
    let Some(frames) = p.sites.get(site.0 as usize) else {
        return Origin::NoPython;
    };
    let mut any_python = false;
    let (mut optimizer, mut backward, mut forward, mut parameter) = (false, false, false, false);
    for f in frames {
        let Some(py) = PyFrame::decode(f.addr) else {
            continue;
        };
        let Some(code) = p.codes.get(&py.code) else {
            any_python = true;
            continue;
        };
        // oomtrace's own hooks run on PyTorch's threads too (the autograd thread): they are
        // not the program's Python.
        if is_oomtrace_python_file(&code.filename) {
            continue;
        }
        any_python = true;
        let file = code.filename.replace('\\', "/");
        let name = code.name.as_str();
        if file.contains("/torch/optim/") {
            optimizer = true;
        } else if file.ends_with("torch/utils/checkpoint.py")
            && (name.contains("backward") || name.contains("unpack") || name.contains("recompute"))
        {
            // Activation checkpointing recomputes a forward inside the backward pass.
            backward = true;
        } else if file.ends_with("torch/autograd/__init__.py")
            && (name.ends_with("backward") || name.ends_with("grad"))
        {
            backward = true;
        } else if file.ends_with("torch/nn/modules/module.py") {
            if name.ends_with("_call_impl") {
                forward = true;
            } else if name.ends_with("_apply") {
                parameter = true;
            }
        } else if file.contains("/torch/nn/modules/")
            && (name.ends_with("__init__") || name.ends_with("reset_parameters"))
        {
            parameter = true;
        }
    }
    if !any_python {
        Origin::NoPython
    } else if optimizer {
        Origin::Optimizer
    } else if backward {
        Origin::Backward
    } else if forward {
        Origin::Forward
    } else if parameter {
        Origin::Parameter
    } else {
        Origin::Outside
    }
}

/// The library that made an allocation: the module of its innermost native frame that is not
/// CUDA itself, libc or oomtrace (or "unknown" without native frames).
fn library_of(p: &Process, site: SiteId) -> String {
    let frames = p
        .sites
        .get(site.0 as usize)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    frames
        .iter()
        .filter(|f| PyFrame::decode(f.addr).is_none())
        .filter_map(|f| f.module.and_then(|m| p.modules.get(m)))
        .map(|m| {
            let path = m.def.path.as_str();
            path.rsplit('/').next().unwrap_or(path).to_string()
        })
        .find(|name| {
            ![
                "libcudart",
                "libcuda.",
                "libcuda",
                "liboomtrace",
                "libc.",
                "libc-",
            ]
            .iter()
            .any(|skip| name.starts_with(skip))
        })
        .unwrap_or_else(|| "unknown".to_string())
}

fn add_library(v: &mut Vec<(String, u64)>, name: String, bytes: u64) {
    match v.iter_mut().find(|(n, _)| *n == name) {
        Some((_, b)) => add(b, bytes),
        None => v.push((name, bytes)),
    }
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
}

/// Device memory on `device` that is not PyTorch's reserve, by library.
fn outside_by_library(p: &Process, device: i16) -> Vec<(String, u64)> {
    let mut by_site: FxHashMap<SiteId, u64> = FxHashMap::default();
    for a in p.live.values() {
        if a.device == device && !a.reserve && a.api.memory_class().on_device() {
            add(by_site.entry(a.site).or_default(), a.size);
        }
    }
    for h in p.handles.values() {
        if h.device == device && !h.reserve {
            add(by_site.entry(h.site).or_default(), h.size);
        }
    }
    let mut out = Vec::new();
    for (site, bytes) in by_site {
        add_library(&mut out, library_of(p, site), bytes);
    }
    out
}

#[cfg(test)]
mod tests;
