//! Report sections in the manner of heaptrack_print, per process and device: who held memory
//! at the device's peak, the call sites that allocated most often, those whose allocations
//! were freed within the step that made them (temporaries), a power-of-two size histogram,
//! the totals, and a table of call sites in a chosen order.
//!
//! Built from the model's accounting alone (per-site counters, the peak snapshot), so that
//! every front end (`oomtrace report`, `oomtrace diff`, an HTML view) shows the same numbers.
//! A step is the model's own: the time between two step markers; a run without markers is
//! one step.
//!
//! Where PyTorch's trace tracker reports tensors on a device, its sections are about them:
//! totals, peak and sizes of the tensors, and lists of the call sites that made tensors or
//! allocated CUDA memory outside PyTorch's allocator; the allocator's segments (its reserve)
//! are one figure (`torch_cache`), and their call sites are listed with `segments`
//! (`oomtrace report --segments`).

use std::collections::HashMap;
use std::str::FromStr;

use serde::Serialize;

use crate::analysis::{Analysis, Held};
use crate::model::trace::Trace;
use crate::model::{FrameInfo, Process, SiteId, SiteStats, HOST_DEVICE};
use oomtrace_proto::MemoryClass;

use super::backward::Lookup;
use super::names::site_name;
use super::symbolize::StackSymbolizer;

/// How the call-site table is ordered (`oomtrace report --sort`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SiteOrder {
    /// Most bytes at the site's own peak first.
    Peak,
    /// Most bytes live at exit first (the report's order of live-at-exit call sites); those
    /// with none at exit follow, by their peak.
    #[default]
    End,
    /// Most allocations first.
    Count,
    /// Fastest growth per step first.
    Growth,
}

impl FromStr for SiteOrder {
    type Err = String;
    fn from_str(s: &str) -> Result<SiteOrder, String> {
        match s {
            "peak" => Ok(SiteOrder::Peak),
            "end" => Ok(SiteOrder::End),
            "count" => Ok(SiteOrder::Count),
            "growth" => Ok(SiteOrder::Growth),
            _ => Err(format!(
                "unknown order {s:?} (expected peak, end, count or growth)"
            )),
        }
    }
}

#[derive(Clone, Debug)]
pub struct SectionOptions {
    /// Entries per list (the table of call sites and each top list).
    pub top: usize,
    pub order: SiteOrder,
    /// Symbolize stacks (off in tests that check raw frames).
    pub symbolize: bool,
    /// Sections of CUDA allocations, PyTorch's segments included, also where its tensors are
    /// traced (`oomtrace report --segments`).
    pub segments: bool,
}

/// What a device's sections count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ListsOf {
    /// CUDA allocations (PyTorch's segments among them, where it runs).
    Allocations,
    /// PyTorch's tensors (totals, peak, sizes), with the call sites of memory outside its
    /// allocator in the lists.
    Tensors,
}

/// PyTorch's caching allocator on one device at the end: its reserve and what of it held
/// tensors.
#[derive(Clone, Debug, Serialize)]
pub struct TorchCache {
    pub reserved_bytes: u64,
    pub segments: u64,
    pub tensor_bytes: u64,
    pub tensor_count: u64,
}

/// CUDA memory outside PyTorch's allocator on a device where its tensors are traced.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OutsideTorch {
    pub allocations: u64,
    pub bytes_allocated: u64,
    pub live_at_exit_bytes: u64,
    pub live_at_exit_count: u64,
}

/// The sections of one process and device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceSections {
    pub pid: u32,
    pub device: i16,
    /// "device" or "host_pinned", as in `processes[].devices[]`.
    pub memory: &'static str,
    pub totals: Totals,
    /// Who held memory when the device reached `totals.peak_bytes`, largest first.
    pub peak_consumers: Vec<SiteBytes>,
    /// Call sites by allocations made, most first.
    pub most_allocations: Vec<SiteRow>,
    /// Call sites by temporary allocations (freed in the step that made them), most first;
    /// sites with none are left out.
    pub most_temporary: Vec<SiteRow>,
    /// Allocations by size; only non-empty buckets.
    pub size_histogram: Vec<SizeBucket>,
    /// Call sites in the order asked for (`sort`), at most `--top`: every call site that
    /// allocated (an order never filters), ties by peak.
    pub sites: Vec<SiteRow>,
    /// The order of `sites`: peak | end | count | growth.
    pub sort: &'static str,
    /// What the sections count: `allocations` (CUDA allocations), or `tensors` where
    /// PyTorch's tensors are traced (unless `--segments`).
    pub lists_of: ListsOf,
    /// PyTorch's reserve on this device, where its tensors are traced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_cache: Option<TorchCache>,
    /// CUDA memory outside PyTorch's allocator, where its tensors are traced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outside_torch: Option<OutsideTorch>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Totals {
    pub allocations: u64,
    pub frees: u64,
    pub temporary: u64,
    pub bytes_allocated: u64,
    pub peak_bytes: u64,
    /// Seconds from the process's first event to the peak.
    pub peak_time_s: f64,
    pub live_at_exit_bytes: u64,
    pub live_at_exit_count: u64,
    /// Step markers the process sent.
    pub steps: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SiteBytes {
    pub bytes: u64,
    pub count: u64,
    /// What the memory is, where PyTorch's tensors are traced (as a finding's `held`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
    /// [`site_key`] of `stack`: equal for the same code in two runs.
    pub key: String,
    /// How the text names the site ([`super::names::site_name`]): `train.py:42 <module>`, a
    /// backward-pass allocation as `backward of addmm at train.py:25`.
    pub name: String,
    pub stack: Vec<FrameInfo>,
}

/// One call site's counters on one device.
#[derive(Clone, Debug, Serialize)]
pub struct SiteRow {
    pub allocations: u64,
    pub frees: u64,
    pub temporary: u64,
    pub bytes_allocated: u64,
    /// The most this site held at once.
    pub peak_bytes: u64,
    pub live_at_exit_bytes: u64,
    pub live_at_exit_count: u64,
    /// (live at the last step marker - live at the first) / (steps between them); 0 with
    /// fewer than two markers. Measured between markers so that the teardown at exit does not
    /// count as shrinking.
    pub growth_per_step: f64,
    /// What the memory is, where PyTorch's tensors are traced (as a finding's `held`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
    pub key: String,
    /// How the text names the site, as in [`SiteBytes::name`].
    pub name: String,
    pub stack: Vec<FrameInfo>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SizeBucket {
    /// Sizes in `[min_bytes, max_bytes]`.
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub count: u64,
    pub bytes: u64,
}

/// The key and name of a call site without a recorded stack (and of a finding that has
/// none: a device's threshold or growth).
pub const NO_STACK: &str = "(no stack)";

/// A call site's identity across runs: its symbolized frames, innermost first, each as
/// `function` (native, symbolized), `module+offset` (native, no symbol) or
/// `file:line function` (Python), joined by ` <- `. Raw addresses and site ids differ from
/// run to run; these do not while the code is the same.
pub fn site_key(stack: &[FrameInfo]) -> String {
    let mut parts: Vec<String> = Vec::with_capacity(stack.len());
    for f in stack {
        let part = if f.python {
            format!("{}:{} {}", f.file, f.line, f.function)
        } else if !f.function.is_empty() {
            f.function.clone()
        } else if !f.module.is_empty() {
            format!("{}+{}", f.module, f.offset)
        } else {
            f.address.clone()
        };
        parts.push(part);
    }
    if parts.is_empty() {
        NO_STACK.into()
    } else {
        parts.join(" <- ")
    }
}

/// The totals of `device`'s CUDA memory outside PyTorch's allocator: sites that are neither
/// tensors nor the allocator's segments.
fn outside_torch(p: &Process, device: i16) -> OutsideTorch {
    p.sites_on(device)
        .filter(|(_, s)| {
            s.reserve_allocations == 0
                && s.api
                    .is_some_and(|a| a.memory_class() != MemoryClass::Tensor)
        })
        .fold(OutsideTorch::default(), |mut o, (_, s)| {
            o.allocations += s.allocations;
            o.bytes_allocated = o.bytes_allocated.saturating_add(s.total_bytes);
            o.live_at_exit_bytes = o.live_at_exit_bytes.saturating_add(s.live_bytes);
            o.live_at_exit_count += s.live_count;
            o
        })
}

fn growth_per_step(p: &Process, s: &SiteStats) -> f64 {
    if p.markers < 2 {
        return 0.0;
    }
    let last = s.live_at_last_step(p.markers);
    (last as f64 - s.live_at_first_step as f64) / (p.markers - 1) as f64
}

/// Sections of every process and device of `trace` that allocated, in the report's order.
pub fn build(trace: &Trace<Analysis>, opts: &SectionOptions) -> Vec<DeviceSections> {
    build_with(trace, opts, &mut StackSymbolizer::new())
}

/// [`build`] with a symbolizer the caller keeps (see `report::build_with`).
pub fn build_with(
    trace: &Trace<Analysis>,
    opts: &SectionOptions,
    sym: &mut StackSymbolizer,
) -> Vec<DeviceSections> {
    let mut out = Vec::new();
    for p in &trace.processes {
        // A site shows in several lists, on several devices: symbolized and named once.
        let mut seen: HashMap<SiteId, (Vec<FrameInfo>, String)> = HashMap::new();
        let mut backward = Lookup::new();
        let mut named = |site: SiteId| {
            seen.entry(site)
                .or_insert_with(|| {
                    let mut stack_of = |s: SiteId| {
                        if opts.symbolize {
                            sym.site(p, s)
                        } else {
                            super::raw_stack(p, s)
                        }
                    };
                    let stack = stack_of(site);
                    let place = backward.backward(p, &stack, &mut stack_of);
                    let name = site_name(&stack, place.as_ref());
                    (stack, name)
                })
                .clone()
        };
        for (&device, d) in p.devices.iter().filter(|(_, d)| d.allocations > 0) {
            let tensors = p.tensors_traced(device) && !opts.segments;
            let held = |site: SiteId| super::held_at(p, device, site);
            let mut stats: Vec<(SiteId, &SiteStats)> = p
                .sites_on(device)
                .filter(|(_, s)| s.allocations > 0 && !(tensors && s.reserve_allocations > 0))
                .collect();
            // A fixed order first, so that ties come out the same on every run.
            stats.sort_unstable_by_key(|(site, _)| *site);
            let mut row = |p: &Process, site: SiteId, s: &SiteStats| {
                let (stack, name) = named(site);
                SiteRow {
                    allocations: s.allocations,
                    frees: s.frees,
                    temporary: s.temporary,
                    bytes_allocated: s.total_bytes,
                    peak_bytes: s.peak_bytes,
                    live_at_exit_bytes: s.live_bytes,
                    live_at_exit_count: s.live_count,
                    growth_per_step: growth_per_step(p, s),
                    held: held(site),
                    key: site_key(&stack),
                    name,
                    stack,
                }
            };
            // Ties (every site at 0 B at exit, say) by the most held at once: an order only
            // sorts, it never leaves a site out (`skip_zero` is for the lists of one kind).
            let mut top_by = |key: &dyn Fn(&SiteStats) -> f64, skip_zero: bool| {
                let mut v: Vec<&(SiteId, &SiteStats)> = stats
                    .iter()
                    .filter(|(_, s)| !skip_zero || key(s) > 0.0)
                    .collect();
                v.sort_by(|a, b| {
                    key(b.1)
                        .total_cmp(&key(a.1))
                        .then(b.1.peak_bytes.cmp(&a.1.peak_bytes))
                });
                v.truncate(opts.top);
                v.into_iter()
                    .map(|&(site, s)| row(p, site, s))
                    .collect::<Vec<_>>()
            };
            let most_allocations = top_by(&|s| s.allocations as f64, false);
            let most_temporary = top_by(&|s| s.temporary as f64, true);
            let sites = match opts.order {
                SiteOrder::Peak => top_by(&|s| s.peak_bytes as f64, false),
                SiteOrder::End => top_by(&|s| s.live_bytes as f64, false),
                SiteOrder::Count => top_by(&|s| s.allocations as f64, false),
                SiteOrder::Growth => top_by(&|s| growth_per_step(p, s), false),
            };
            let peak_sites = if tensors {
                p.tensor_peak_sites(device)
            } else {
                p.peak_sites(device)
            };
            let peak_consumers = peak_sites
                .into_iter()
                .take(opts.top)
                .map(|(site, bytes, count)| {
                    let (stack, name) = named(site);
                    SiteBytes {
                        bytes,
                        count,
                        held: held(site),
                        key: site_key(&stack),
                        name,
                        stack,
                    }
                })
                .collect();
            let t = &d.tensor_tally;
            let buckets = if tensors {
                &t.size_buckets
            } else {
                &d.size_buckets
            };
            let size_histogram = buckets
                .iter()
                .enumerate()
                .filter(|(_, b)| b.0 > 0)
                .map(|(i, &(count, bytes))| SizeBucket {
                    min_bytes: if i == 0 { 0 } else { 1u64 << (i - 1) },
                    max_bytes: if i == 0 {
                        0
                    } else if i >= 64 {
                        u64::MAX
                    } else {
                        (1u64 << i) - 1
                    },
                    count,
                    bytes,
                })
                .collect();
            out.push(DeviceSections {
                pid: p.pid(),
                device,
                memory: if device == HOST_DEVICE {
                    "host_pinned"
                } else {
                    "device"
                },
                totals: if tensors {
                    Totals {
                        allocations: t.allocations,
                        frees: t.frees,
                        temporary: t.temporary,
                        bytes_allocated: t.bytes_allocated,
                        peak_bytes: d.tensor_peak_bytes,
                        peak_time_s: t.peak_ts_ns.saturating_sub(p.first_ts_ns) as f64 / 1e9,
                        live_at_exit_bytes: d.tensor_bytes,
                        live_at_exit_count: d.tensor_count,
                        steps: p.markers,
                    }
                } else {
                    Totals {
                        allocations: d.allocations,
                        frees: d.frees,
                        temporary: d.temporary,
                        bytes_allocated: d.bytes_allocated,
                        peak_bytes: d.peak_bytes,
                        peak_time_s: d.peak_ts_ns.saturating_sub(p.first_ts_ns) as f64 / 1e9,
                        live_at_exit_bytes: d.live_bytes,
                        live_at_exit_count: d.live_count,
                        steps: p.markers,
                    }
                },
                lists_of: if tensors {
                    ListsOf::Tensors
                } else {
                    ListsOf::Allocations
                },
                torch_cache: p.tensors_traced(device).then(|| TorchCache {
                    reserved_bytes: d.torch_reserved_bytes.unwrap_or(0),
                    segments: d.torch_segments,
                    tensor_bytes: d.tensor_bytes,
                    tensor_count: d.tensor_count,
                }),
                outside_torch: p.tensors_traced(device).then(|| outside_torch(p, device)),
                peak_consumers,
                most_allocations,
                most_temporary,
                size_histogram,
                sites,
                sort: match opts.order {
                    SiteOrder::Peak => "peak",
                    SiteOrder::End => "end",
                    SiteOrder::Count => "count",
                    SiteOrder::Growth => "growth",
                },
            });
        }
    }
    out
}
