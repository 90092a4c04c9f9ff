//! A lever applied to a device's timeline, and the result replayed through the allocator
//! model: the sequence the program would make under a scaled batch and checkpointed modules.
//!
//! **Batch.** A tensor's size follows the batch when it is made by a forward pass (activations,
//! temporaries, a forward output kept), is an input (made between steps, used by the next), or
//! is a temporary of the backward pass whose size is no parameter's (a parameter-sized one is a
//! weight's gradient being summed, which does not follow the batch). Parameters, gradients,
//! optimizer state and its temporaries, what a program keeps from before its loop, and tensors
//! whose role nothing decides stay as they are. A scaled size is the request times the factor,
//! rounded up to a byte; the allocator model rounds it as PyTorch would (the sizes are replayed,
//! never summed).
//!
//! **Checkpointing** a module call (`torch.utils.checkpoint` around it): in the forward pass
//! the call's saved activations (made under it, kept into the backward pass) go at the call's
//! end, except its output, which its caller keeps; in the backward pass, when the backward
//! node that first frees one of them began (PyTorch recomputes when that node asks for its
//! saved tensors, before it makes its gradients: the backward pass's requests and frees just
//! before that first free are the node's own), the call's forward is made again (its requests
//! and frees in their order: the recomputation's own peak), the copies of the saved ones then
//! go where the originals did, the rest at the recomputation's end. (Recomputing at the first
//! free itself, after the node's gradients, put the transformer's checkpointed peak reserve
//! 17 % under PyTorch's own; the node's start meets it.) A call made in a loop is checkpointed
//! per instance, an instance ending where a tensor is made outside it, or where the call's
//! first request comes again.

use rustc_hash::{FxHashMap, FxHashSet};

use super::calls::{CallKey, Calls};
use super::timeline::{DeviceTimeline, Op, Tensor};
use crate::analysis::anatomy::{Made, Role};
use crate::whatif::allocator::Allocator;
use crate::whatif::AllocConf;

/// What to change.
#[derive(Clone, Debug)]
pub struct Lever {
    /// The batch, as a multiple of the traced one.
    pub factor: f64,
    /// Module calls to checkpoint.
    pub checkpoint: Vec<CallKey>,
}

impl Default for Lever {
    /// The run as it was.
    fn default() -> Lever {
        Lever {
            factor: 1.0,
            checkpoint: Vec::new(),
        }
    }
}

/// A timeline under a lever, ready to replay: ops over `sizes`/`streams` (copies made by a
/// recomputation come after the trace's own tensors).
#[derive(Clone, Debug)]
pub struct Plan {
    ops: Vec<Op>,
    sizes: Vec<u64>,
    streams: Vec<u64>,
    factor: f64,
}

/// Sizes of parameters (a backward temporary of such a size is a weight's gradient).
pub fn parameter_sizes(d: &DeviceTimeline) -> FxHashSet<u64> {
    d.tensors
        .iter()
        .filter(|t| t.role == Role::Parameter)
        .map(|t| t.size)
        .collect()
}

/// Whether `t`'s size follows the batch (the module doc's rule); `workspace`: its call site
/// allocates a library's workspace (cuBLAS's, per handle and stream, or per call), whose size
/// is the library's.
pub fn follows_batch(t: &Tensor, parameter_sizes: &FxHashSet<u64>, workspace: bool) -> bool {
    if workspace {
        return false;
    }
    match t.made {
        Made::Forward => true,
        Made::Idle => t.role != Role::Other,
        Made::Backward => t.role == Role::Temporary && !parameter_sizes.contains(&t.size),
        Made::Parameter | Made::Optimizer | Made::Unknown => false,
    }
}

/// Which of a device's tensors follow the batch, by tensor index.
pub fn following(
    d: &DeviceTimeline,
    workspace: &dyn Fn(crate::model::SiteId) -> bool,
) -> Vec<bool> {
    let params = parameter_sizes(d);
    d.tensors
        .iter()
        .map(|t| follows_batch(t, &params, workspace(t.site)))
        .collect()
}

/// Whether an out-of-memory's request follows the batch, by what it would have been made as.
fn request_follows_batch(made: Made) -> bool {
    matches!(made, Made::Forward | Made::Idle | Made::Backward)
}

fn scaled(size: u64, factor: f64) -> u64 {
    if factor == 1.0 {
        return size;
    }
    let s = (size as f64 * factor).ceil();
    if s >= u64::MAX as f64 {
        u64::MAX
    } else {
        s.max(1.0) as u64
    }
}

/// One instance of a checkpointed call: the ops `start..end` (its requests and the frees
/// among them), its tensors.
struct Instance {
    start: usize,
    end: usize,
    tensors: Vec<u32>,
}

/// The instances of `key`, in order (see the module doc).
fn instances(d: &DeviceTimeline, calls: &Calls, key: CallKey) -> Vec<Instance> {
    let mut out = Vec::new();
    // The current run of requests made under `key`: (op index, tensor) of each.
    let mut run: Vec<(usize, u32)> = Vec::new();
    for (i, op) in d.ops.iter().enumerate() {
        let inside = match *op {
            Op::Alloc { t, .. } => {
                let tensor = &d.tensors[t as usize];
                tensor.made == Made::Forward && calls.known(tensor.site).contains(&key)
            }
            Op::Free { .. } => continue,
            Op::Step | Op::Oom { .. } => false,
        };
        if let (true, Op::Alloc { t, .. }) = (inside, *op) {
            run.push((i, t));
        } else if !run.is_empty() {
            split_run(d, &std::mem::take(&mut run), i, &mut out);
        }
    }
    if !run.is_empty() {
        split_run(d, &run, d.ops.len(), &mut out);
    }
    out
}

/// One run of requests under a call, ending before op `end`, as instances: split where its
/// call sites repeat (`a b c a b c a`: a call made in a loop, or a module list's blocks).
/// A first call that made a request of its own (a buffer made once, on the first call: `a b x
/// c a b c a b c`) starts the repetition late: then the run is split where its first request
/// comes again, when every later piece repeats the second (the last may be cut short).
fn split_run(d: &DeviceTimeline, run: &[(usize, u32)], end: usize, out: &mut Vec<Instance>) {
    let sites: Vec<crate::model::SiteId> = run
        .iter()
        .map(|&(_, t)| d.tensors[t as usize].site)
        .collect();
    let n = sites.len();
    // At least two whole repetitions; the last may be cut short (a forward pass that ran out
    // of memory inside a block).
    let period = (1..=n / 2).find(|&p| (p..n).all(|i| sites[i] == sites[i - p]));
    let starts: Vec<usize> = match period {
        Some(p) => (0..n).step_by(p).collect(),
        None => first_request_again(&sites).unwrap_or_else(|| vec![0]),
    };
    for (c, &start) in starts.iter().enumerate() {
        let upto = starts.get(c + 1).copied().unwrap_or(n);
        let chunk = &run[start..upto];
        out.push(Instance {
            start: chunk[0].0,
            end: run.get(upto).map_or(end, |&(i, _)| i),
            tensors: chunk.iter().map(|&(_, t)| t).collect(),
        });
    }
}

/// Where each piece of `sites` starts, split where its first site comes again, when the
/// first piece is at least as long as the second and every later piece repeats the second
/// (the last may be cut short); None otherwise.
fn first_request_again(sites: &[crate::model::SiteId]) -> Option<Vec<usize>> {
    let starts: Vec<usize> = (0..sites.len()).filter(|&i| sites[i] == sites[0]).collect();
    if starts.len() < 3 {
        return None;
    }
    let piece = |k: usize| &sites[starts[k]..starts.get(k + 1).copied().unwrap_or(sites.len())];
    let second = piece(1);
    let last = starts.len() - 1;
    let repeats = (2..starts.len()).all(|k| {
        let p = piece(k);
        p == second || (k == last && second.starts_with(p))
    });
    (repeats && piece(0).len() >= second.len()).then_some(starts)
}

/// Where the backward node that frees op `free`'s tensor began: back over the backward
/// pass's requests and frees just before it (a node makes its gradients and temporaries,
/// then lets go of its saved tensors; anything else before them, a free of a forward tensor
/// or a step, belongs to what ran before).
fn node_start(d: &DeviceTimeline, free: usize) -> usize {
    let mut at = free;
    while at > 0 {
        let made = match d.ops[at - 1] {
            Op::Alloc { t, .. } | Op::Free { t } => d.tensors[t as usize].made,
            _ => break,
        };
        if made != Made::Backward {
            break;
        }
        at -= 1;
    }
    at
}

impl Plan {
    /// `follows`: which tensors follow the batch ([`following`]).
    pub fn build(d: &DeviceTimeline, calls: &Calls, follows: &[bool], lever: &Lever) -> Plan {
        let mut sizes: Vec<u64> = d
            .tensors
            .iter()
            .zip(follows)
            .map(|(t, &f)| {
                if f {
                    scaled(t.size, lever.factor)
                } else {
                    t.size
                }
            })
            .collect();
        let mut streams: Vec<u64> = d.tensors.iter().map(|t| t.stream).collect();
        if lever.checkpoint.is_empty() {
            let ops = d.ops.clone();
            return Plan {
                ops,
                sizes,
                streams,
                factor: lever.factor,
            };
        }
        // Where each tensor goes, and the room outside the reserve before each op.
        let mut freed_at: Vec<Option<usize>> = vec![None; d.tensors.len()];
        let mut outside_at: Vec<u64> = Vec::with_capacity(d.ops.len());
        let mut outside = 0;
        for (i, op) in d.ops.iter().enumerate() {
            match *op {
                Op::Free { t } => freed_at[t as usize] = Some(i),
                Op::Alloc { outside: o, .. } | Op::Oom { outside: o, .. } => outside = o,
                Op::Step => {}
            }
            outside_at.push(outside);
        }
        let mut insert: FxHashMap<usize, Vec<Op>> = FxHashMap::default();
        let mut replace: FxHashMap<usize, Op> = FxHashMap::default();
        let mut handled: FxHashSet<u32> = FxHashSet::default();
        for &key in &lever.checkpoint {
            for inst in instances(d, calls, key) {
                if inst.tensors.iter().any(|t| handled.contains(t)) {
                    continue;
                }
                let mine: FxHashSet<u32> = inst.tensors.iter().copied().collect();
                let alive_at_end: Vec<u32> = inst
                    .tensors
                    .iter()
                    .copied()
                    .filter(|&t| freed_at[t as usize].is_none_or(|f| f >= inst.end))
                    .collect();
                let output = alive_at_end.last().copied();
                let saved: Vec<u32> = alive_at_end
                    .iter()
                    .copied()
                    .filter(|&t| {
                        Some(t) != output && d.tensors[t as usize].role == Role::Activation
                    })
                    .collect();
                if saved.is_empty() {
                    continue;
                }
                handled.extend(inst.tensors.iter().copied());
                // Forward: the saved ones go at the call's end.
                insert
                    .entry(inst.end)
                    .or_default()
                    .extend(saved.iter().map(|&t| Op::Free { t }));
                // Backward: made again when the node that first frees one of them began.
                let Some(first_free) = saved.iter().filter_map(|&t| freed_at[t as usize]).min()
                else {
                    continue;
                };
                let recompute_at = node_start(d, first_free);
                let mut copy: FxHashMap<u32, u32> = FxHashMap::default();
                let mut again = Vec::new();
                for op in &d.ops[inst.start..inst.end] {
                    match *op {
                        Op::Alloc { t, .. } if mine.contains(&t) => {
                            let c = sizes.len() as u32;
                            sizes.push(sizes[t as usize]);
                            streams.push(streams[t as usize]);
                            copy.insert(t, c);
                            again.push(Op::Alloc {
                                t: c,
                                outside: outside_at[recompute_at],
                            });
                        }
                        Op::Free { t } if mine.contains(&t) => {
                            if let Some(&c) = copy.get(&t) {
                                again.push(Op::Free { t: c });
                            }
                        }
                        _ => {}
                    }
                }
                for &t in &alive_at_end {
                    let Some(&c) = copy.get(&t) else { continue };
                    match (saved.contains(&t), freed_at[t as usize]) {
                        (true, Some(f)) => {
                            replace.insert(f, Op::Free { t: c });
                        }
                        _ => again.push(Op::Free { t: c }),
                    }
                }
                insert.entry(recompute_at).or_default().extend(again);
            }
        }
        let mut ops =
            Vec::with_capacity(d.ops.len() + insert.values().map(Vec::len).sum::<usize>());
        for (i, op) in d.ops.iter().enumerate() {
            if let Some(v) = insert.get(&i) {
                ops.extend_from_slice(v);
            }
            ops.push(replace.get(&i).copied().unwrap_or(*op));
        }
        if let Some(v) = insert.get(&d.ops.len()) {
            ops.extend_from_slice(v);
        }
        Plan {
            ops,
            sizes,
            streams,
            factor: lever.factor,
        }
    }

    /// Replays the plan under `conf`. `budget`: what the device holds in all (the allocator may
    /// hold it less what is outside its reserve at each request; None: no limit); `total`: the
    /// device's size (for expandable segments' address space and a memory fraction); `cap`:
    /// the memory cap the program set itself.
    pub fn replay(
        &self,
        conf: &AllocConf,
        budget: Option<u64>,
        total: Option<u64>,
        cap: Option<u64>,
    ) -> Outcome {
        self.run(conf, budget, total, cap, false)
    }

    /// Whether the plan fits `budget` under `conf`: [`Plan::replay`] that stops at the first
    /// refusal (a search for the largest batch asks this many times).
    pub fn fits(
        &self,
        conf: &AllocConf,
        budget: Option<u64>,
        total: Option<u64>,
        cap: Option<u64>,
    ) -> bool {
        self.run(conf, budget, total, cap, true).refused == 0
    }

    fn run(
        &self,
        conf: &AllocConf,
        budget: Option<u64>,
        total: Option<u64>,
        cap: Option<u64>,
        stop_at_refusal: bool,
    ) -> Outcome {
        let mut a = Allocator::new(conf.clone(), total.or(budget));
        if let Some(cap) = cap {
            a.set_program_cap(cap);
        }
        let mut out = Outcome::default();
        // A key no tensor has: the plan's tensors are numbered from 0.
        let probe = u64::MAX - 1;
        for op in &self.ops {
            if stop_at_refusal && out.refused > 0 {
                break;
            }
            match *op {
                Op::Alloc { t, outside } => {
                    if let Some(b) = budget {
                        a.set_limit(b.saturating_sub(outside));
                    }
                    let (size, stream) = (self.sizes[t as usize], self.streams[t as usize]);
                    match a.malloc(t as u64, size, stream) {
                        Ok(()) => {
                            out.peak_with_outside = out
                                .peak_with_outside
                                .max(a.reserved().saturating_add(outside));
                        }
                        Err(_) => {
                            out.refused += 1;
                            out.first_refused.get_or_insert(size);
                        }
                    }
                }
                Op::Free { t } => {
                    a.free(t as u64);
                }
                Op::Oom {
                    size,
                    stream,
                    outside,
                    made,
                } => {
                    if let Some(b) = budget {
                        a.set_limit(b.saturating_sub(outside));
                    }
                    let size = if request_follows_batch(made) {
                        scaled(size, self.factor)
                    } else {
                        size
                    };
                    match a.malloc(probe, size, stream) {
                        Ok(()) => {
                            out.peak_with_outside = out
                                .peak_with_outside
                                .max(a.reserved().saturating_add(outside));
                            a.free(probe);
                        }
                        Err(_) => {
                            out.refused += 1;
                            out.first_refused.get_or_insert(size);
                        }
                    }
                }
                Op::Step => {}
            }
        }
        out.peak_reserved = a.peak_reserved();
        out.peak_allocated = a.peak_allocated();
        out
    }
}

/// What a replay of a plan came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// `max_memory_reserved()` and `max_memory_allocated()`.
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// The most the device held: the reserve and what was outside it, at once.
    pub peak_with_outside: u64,
    /// Requests the model refused (new out-of-memory errors, and recorded ones that would
    /// still happen); the first one's size.
    pub refused: u64,
    pub first_refused: Option<u64>,
}

/// How many times `key` ran in the timeline's forward passes.
pub fn instance_count(d: &DeviceTimeline, calls: &Calls, key: CallKey) -> u64 {
    instances(d, calls, key).len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SiteId;

    const MIB: u64 = 1 << 20;

    /// A timeline built op by op.
    #[derive(Default)]
    struct Build {
        d: DeviceTimeline,
    }

    impl Build {
        fn alloc(&mut self, size: u64, site: u32, made: Made, role: Role) -> u32 {
            let t = self.d.tensors.len() as u32;
            self.d.tensors.push(Tensor {
                size,
                stream: 0,
                site: SiteId(site),
                made,
                role,
            });
            self.d.ops.push(Op::Alloc { t, outside: 0 });
            t
        }
        fn free(&mut self, t: u32) {
            self.d.ops.push(Op::Free { t });
        }
    }

    const BLOCK: CallKey = CallKey {
        caller_code: 1,
        caller_line: 10,
        callee_code: 2,
    };

    /// A parameter, then a forward of `blocks` blocks (each saving two 20 MiB activations and
    /// making a 20 MiB output), then the backward freeing them in reverse.
    fn model(blocks: u32) -> (DeviceTimeline, Calls) {
        let mut b = Build::default();
        b.alloc(40 * MIB, 1, Made::Parameter, Role::Parameter);
        let mut saved = Vec::new();
        for _ in 0..blocks {
            let a1 = b.alloc(20 * MIB, 2, Made::Forward, Role::Activation);
            let tmp = b.alloc(20 * MIB, 3, Made::Forward, Role::Temporary);
            b.free(tmp);
            let a2 = b.alloc(20 * MIB, 4, Made::Forward, Role::Activation);
            let out = b.alloc(20 * MIB, 5, Made::Forward, Role::Activation);
            saved.extend([a1, a2, out]);
        }
        for t in saved.into_iter().rev() {
            let g = b.alloc(20 * MIB, 6, Made::Backward, Role::Temporary);
            b.free(t);
            b.free(g);
        }
        b.d.ops.push(Op::Step);
        let calls = Calls::from_chains((2..=5).map(|s| (SiteId(s), vec![BLOCK])));
        (b.d, calls)
    }

    /// The plan at the traced batch, with `checkpoint`.
    fn at_its_batch(d: &DeviceTimeline, calls: &Calls, checkpoint: Vec<CallKey>) -> Plan {
        let follows = following(d, &|_| false);
        Plan::build(
            d,
            calls,
            &follows,
            &Lever {
                factor: 1.0,
                checkpoint,
            },
        )
    }

    fn peak(d: &DeviceTimeline, calls: &Calls, lever: &Lever) -> Outcome {
        let follows = following(d, &|_| false);
        Plan::build(d, calls, &follows, lever).replay(&AllocConf::default(), None, None, None)
    }

    #[test]
    fn the_batch_scales_activations_not_parameters() {
        let (d, calls) = model(2);
        let base = peak(
            &d,
            &calls,
            &Lever {
                factor: 1.0,
                checkpoint: vec![],
            },
        );
        let twice = peak(
            &d,
            &calls,
            &Lever {
                factor: 2.0,
                checkpoint: vec![],
            },
        );
        let half = peak(
            &d,
            &calls,
            &Lever {
                factor: 0.5,
                checkpoint: vec![],
            },
        );
        // 40 MiB of parameter, 6 x 20 MiB saved, a 20 MiB temporary or gradient at once.
        assert_eq!(base.peak_allocated, (40 + 7 * 20) * MIB);
        assert_eq!(twice.peak_allocated, (40 + 7 * 40) * MIB);
        assert_eq!(half.peak_allocated, (40 + 7 * 10) * MIB);
    }

    #[test]
    fn a_loop_of_blocks_is_checkpointed_block_by_block() {
        let (d, calls) = model(4);
        assert_eq!(instance_count(&d, &calls, BLOCK), 4);
        let base = peak(
            &d,
            &calls,
            &Lever {
                factor: 1.0,
                checkpoint: vec![],
            },
        );
        let ckpt = peak(
            &d,
            &calls,
            &Lever {
                factor: 1.0,
                checkpoint: vec![BLOCK],
            },
        );
        // Without: every block's three saved tensors at the end of the forward, and the first
        // gradient: 40 + 12 x 20 + 20. With: the blocks' outputs only (4 x 20), then in the
        // backward the last block made again (its two saved, its temporary) beside them.
        assert_eq!(base.peak_allocated, (40 + 13 * 20) * MIB);
        assert!(
            ckpt.peak_allocated <= (40 + 4 * 20 + 3 * 20 + 20) * MIB,
            "{} MiB",
            ckpt.peak_allocated / MIB
        );
        assert!(ckpt.peak_allocated >= (40 + 4 * 20 + 2 * 20) * MIB);
        // Every tensor made again goes again: nothing is left at the end.
        let plan = at_its_batch(&d, &calls, vec![BLOCK]);
        let mut live = rustc_hash::FxHashSet::default();
        for op in &plan.ops {
            match *op {
                Op::Alloc { t, .. } => assert!(live.insert(t), "tensor {t} made twice"),
                Op::Free { t } => assert!(live.remove(&t), "tensor {t} freed but not live"),
                _ => {}
            }
        }
        assert_eq!(live.len(), 1, "only the parameter stays: {live:?}");
    }

    #[test]
    fn the_forward_is_made_again_before_the_backward_node_that_asks_for_it() {
        let (d, calls) = model(2);
        let plan = at_its_batch(&d, &calls, vec![BLOCK]);
        let traced = d.tensors.len() as u32;
        let first_copy = plan
            .ops
            .iter()
            .position(|op| matches!(*op, Op::Alloc { t, .. } if t >= traced))
            .expect("a recomputation");
        // The node that first lets go of a saved tensor of the last block (its second
        // activation: its output is not saved), and the gradient it made just before.
        let a2 = d.tensors.iter().rposition(|t| t.site == SiteId(4)).unwrap() as u32;
        let freed = d
            .ops
            .iter()
            .position(|op| *op == Op::Free { t: a2 })
            .unwrap();
        let Op::Alloc { t: gradient, .. } = d.ops[freed - 1] else {
            panic!("no gradient before {freed}")
        };
        let first_gradient = plan
            .ops
            .iter()
            .position(|op| matches!(*op, Op::Alloc { t, .. } if t == gradient))
            .unwrap();
        // The last block's backward node asks for its saved tensors before it makes its
        // gradient: PyTorch recomputes then, not when the node lets them go.
        assert!(
            first_copy < first_gradient,
            "recomputed at op {first_copy}, the node's gradient at op {first_gradient}"
        );
    }

    #[test]
    fn a_first_call_with_a_request_of_its_own_still_splits_call_by_call() {
        let sites = |v: &[u32]| v.iter().map(|&s| SiteId(s)).collect::<Vec<_>>();
        // PyTorch 2.4 makes a buffer on a transformer block's first call only.
        assert_eq!(
            first_request_again(&sites(&[1, 2, 9, 3, 1, 2, 3, 1, 2, 3, 1, 2])),
            Some(vec![0, 4, 7, 10])
        );
        // Not a repetition: a later call differs, or the first call is shorter.
        assert_eq!(
            first_request_again(&sites(&[1, 2, 3, 1, 2, 3, 1, 4, 3])),
            None
        );
        assert_eq!(first_request_again(&sites(&[1, 2, 1, 2, 3, 1, 2, 3])), None);
        assert_eq!(first_request_again(&sites(&[1, 2, 3, 1, 2, 3])), None);
        // Through split_run: four instances, the first with its own request.
        let mut b = Build::default();
        let mut run = Vec::new();
        for site in [1, 2, 9, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3] {
            let t = b.alloc(MIB, site, Made::Forward, Role::Activation);
            run.push((b.d.ops.len() - 1, t));
        }
        let mut out = Vec::new();
        split_run(&b.d, &run, b.d.ops.len(), &mut out);
        let lens: Vec<usize> = out.iter().map(|i| i.tensors.len()).collect();
        assert_eq!(lens, vec![4, 3, 3, 3]);
        assert_eq!(out[1].start, 4);
        assert_eq!(out[0].end, 4);
    }

    #[test]
    fn a_capacity_too_small_refuses_and_a_larger_one_fits() {
        let (d, calls) = model(2);
        let plan = at_its_batch(&d, &calls, vec![]);
        let conf = AllocConf::default();
        assert!(plan.replay(&conf, Some(100 * MIB), None, None).refused > 0);
        assert_eq!(plan.replay(&conf, Some(400 * MIB), None, None).refused, 0);
    }

    #[test]
    fn a_library_workspace_keeps_its_size() {
        let mut b = Build::default();
        let w = b.alloc(32 * MIB, 7, Made::Backward, Role::Temporary);
        b.free(w);
        let follows = following(&b.d, &|site| site == SiteId(7));
        assert_eq!(follows, vec![false]);
        assert_eq!(following(&b.d, &|_| false), vec![true]);
    }
}
