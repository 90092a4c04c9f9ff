//! What a finding says once the stacks are known. Detectors see call sites, not stacks: the
//! lines that made a device grow (`python_lines`), whether its allocations are PyTorch's
//! segments, and the causes that follow from that are completed here, for the report and for
//! the live line alike.

use crate::analysis::advice::TRACE_TENSORS;
use crate::analysis::device_growth::{self, DeviceGrowthEvidence, Events};
use crate::analysis::leaks::GrewAt;
use crate::analysis::{Cause, PythonLine};
use crate::model::{FrameInfo, Process, SiteId, Stacks};
use crate::units::fmt_bytes;

use super::roles::backward_node;
use super::symbolize::{python_culprit, python_frames};

/// What replaces the advice to trace PyTorch's tensors in a run that traces them.
pub const TENSORS_TRACED: &str = "PyTorch's tensors are traced in this run: a line that keeps \
    them has a finding of its own, and `oomtrace report` lists them by line.";

/// Whether PyTorch's trace tracker reported on any device of `p`: its tensors are traced.
pub fn traces_tensors(p: &Process) -> bool {
    p.devices.keys().any(|&d| p.tensors_traced(d))
}

/// `hint` for a run that traces PyTorch's tensors: never the advice to trace them.
pub fn without_tensor_advice(hint: &str) -> String {
    hint.replace(TRACE_TENSORS, TENSORS_TRACED)
}

/// Lines kept in `python_lines`, largest first.
const PYTHON_LINES: usize = 10;
/// A line listed beside others caused at least this share of their bytes, and at least
/// [`LINE_FLOOR_BYTES`]: "4 B in 1 segment" beside 302 MiB a step is not a cause.
const LINE_SHARE: f64 = 0.01;
const LINE_FLOOR_BYTES: u64 = 64 << 10;

/// The kind of thread a stack without Python frames ran on, from its native frames; on
/// PyTorch's autograd thread with the backward node it ran in, when a frame names one:
/// "autograd thread (no Python frames), AddmmBackward0".
pub fn thread_kind(native: &[FrameInfo]) -> String {
    if let Some(node) = backward_node(native) {
        format!("autograd thread (no Python frames), {node}")
    } else if native
        .iter()
        .any(|f| f.function.contains("torch::autograd::Engine::thread_main"))
    {
        "autograd thread (no Python frames)".to_string()
    } else {
        "threads without Python frames".to_string()
    }
}

/// The allocations of `grew_at` by the innermost user Python frame of their call site (the
/// line a user can change), the largest `PYTHON_LINES`; those without Python frames in one
/// bucket per name `native_place` gives them (their backward-pass place, `backward of addmm
/// at train.py:25`, else the kind of thread: [`super::backward::Lookup::native_place`]). Empty
/// when the process sent no Python code (not Python, or `OOMTRACE_PYTHON=0`).
pub fn python_lines(
    p: Stacks<'_>,
    grew_at: &[GrewAt],
    mut native_place: impl FnMut(SiteId) -> String,
) -> Vec<PythonLine> {
    if p.codes.is_empty() {
        return Vec::new();
    }
    let mut by_line: std::collections::BTreeMap<(String, u32, String, String), (u64, u64)> =
        Default::default();
    for g in grew_at {
        let frames = python_frames(p, g.site);
        let key = match python_culprit(&frames) {
            Some(f) => {
                let name = f.file.rsplit('/').next().unwrap_or(&f.file);
                let description = format!("{name}:{}", f.line);
                (f.file.clone(), f.line, f.function.clone(), description)
            }
            None => (String::new(), 0, String::new(), native_place(g.site)),
        };
        let e = by_line.entry(key).or_default();
        e.0 = e.0.saturating_add(g.bytes);
        e.1 += g.count;
    }
    let mut v: Vec<PythonLine> = by_line
        .into_iter()
        .map(
            |((file, line, function, description), (bytes, count))| PythonLine {
                file,
                line,
                function,
                bytes,
                count,
                description,
            },
        )
        .collect();
    v.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.description.cmp(&b.description))
    });
    // Ranked by the bytes each caused; the largest always stays, the others only when they
    // caused a share worth naming.
    let total = v.iter().fold(0u64, |acc, l| acc.saturating_add(l.bytes));
    let floor = ((total as f64 * LINE_SHARE) as u64).max(LINE_FLOOR_BYTES);
    let mut i = 0;
    v.retain(|l| {
        i += 1;
        i == 1 || l.bytes >= floor
    });
    v.truncate(PYTHON_LINES);
    v
}

/// "train.py:42 (128.00 MiB in 4 segments), backward of addmm at train.py:40 (64.00 MiB in 2
/// segments), threads without Python frames: 4.00 MiB in 1 segment": the first `max` lines,
/// then how many more. `unit` names one allocation.
pub fn fmt_python_lines(lines: &[PythonLine], unit: &str, max: usize) -> String {
    let amount = |l: &PythonLine| {
        format!(
            "{} in {} {unit}{}",
            fmt_bytes(l.bytes),
            l.count,
            if l.count == 1 { "" } else { "s" }
        )
    };
    let mut parts: Vec<String> = lines
        .iter()
        .take(max)
        .map(|l| {
            // A name that ends in parentheses takes the amount after a colon.
            if l.file.is_empty() && l.description.ends_with(')') {
                format!("{}: {}", l.description, amount(l))
            } else {
                format!("{} ({})", l.description, amount(l))
            }
        })
        .collect();
    if lines.len() > max {
        parts.push(format!("{} more", lines.len() - max));
    }
    parts.join(", ")
}

/// Whether a device's growth is made of PyTorch's caching-allocator segments: `Some(true)`
/// when a call site that made it grow runs in PyTorch's CUDA library, `Some(false)` when the
/// program is Python (PyTorch is likely but not seen), `None` otherwise. Only for growth
/// without tensor-level events.
pub fn torch_segments(p: Stacks<'_>, grew_at: &[GrewAt]) -> Option<bool> {
    if grew_at.iter().any(|g| in_torch(p, g.site)) {
        Some(true)
    } else if !p.codes.is_empty() {
        Some(false)
    } else {
        None
    }
}

/// Whether a site's stack passes through PyTorch's CUDA allocator.
pub fn in_torch(p: Stacks<'_>, site: SiteId) -> bool {
    p.sites.get(site.0 as usize).is_some_and(|frames| {
        frames.iter().filter_map(|f| f.module).any(|m| {
            let path = &p.modules[m].def.path;
            path.contains("libc10_cuda") || path.contains("libtorch_cuda")
        })
    })
}

/// A device growth's cause and hint once the stacks are known: PyTorch's segments are named
/// as such (with how to see the tensors); leaks that explain the growth keep their pointer to
/// them. Anything else is returned as the detector said it.
pub fn device_growth_hint(
    p: Stacks<'_>,
    e: &DeviceGrowthEvidence,
    cause: Cause,
    hint: String,
) -> (Cause, String) {
    let explained = match cause {
        Cause::DeviceNative => false,
        Cause::LeaksExplainGrowth => true,
        _ => return (cause, hint),
    };
    if e.events == Events::Tensors {
        return (cause, hint);
    }
    match torch_segments(p, &e.grew_at) {
        Some(certain) => {
            let segments = if e.tensors_traced {
                device_growth::TRACED_SEGMENTS_HINT.to_string()
            } else {
                device_growth::segments_hint(certain)
            };
            let hint = if explained {
                format!("{hint} {segments}")
            } else {
                segments
            };
            (Cause::TorchSegments { certain, explained }, hint)
        }
        None => (cause, hint),
    }
}

/// Completes a device growth's evidence from the process's stacks (the detector sees call
/// sites only): the lines that made it grow, and whether its allocations are PyTorch's
/// segments. `native_place` names a site without Python frames (see [`python_lines`]).
pub fn resolve_device_growth(
    p: Stacks<'_>,
    e: &mut DeviceGrowthEvidence,
    native_place: impl FnMut(SiteId) -> String,
) {
    e.python_lines = python_lines(p, &e.grew_at, native_place);
    if e.events == Events::Allocations && torch_segments(p, &e.grew_at).is_some() {
        e.events = Events::Segments;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::sim::{cache_growth, Sim};
    use crate::analysis::{Detector, Evidence, Finding};
    use oomtrace_proto::wire::Frame;
    use oomtrace_proto::StackId;

    const MIB: u64 = 1 << 20;

    fn device_growth(sim: &Sim) -> Vec<Finding> {
        sim.a.device_growth.findings(&sim.a.context(&sim.p))
    }

    fn evidence(f: &Finding) -> &DeviceGrowthEvidence {
        match &f.evidence {
            Some(Evidence::DeviceGrowth(e)) => e,
            other => panic!("no device growth evidence: {other:?}"),
        }
    }

    #[test]
    fn python_lines_aggregate_sites_by_their_user_line_and_name_the_autograd_thread() {
        let sim = cache_growth(40);
        let f = &device_growth(&sim)[0];
        let e = evidence(f);
        let autograd = |site: SiteId| {
            // The stacks without Python frames ran on PyTorch's autograd engine.
            assert!(site.0 > 0);
            vec![
                FrameInfo {
                    function: "c10::cuda::CUDACachingAllocator::Native::alloc_block".into(),
                    ..Default::default()
                },
                FrameInfo {
                    function: "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)".into(),
                    ..Default::default()
                },
            ]
        };
        let lines = python_lines(sim.p.stacks(), &e.grew_at, |site| {
            thread_kind(&autograd(site))
        });
        let n: u64 = e.grew_at.iter().map(|g| g.count).sum();
        let line =
            |file: &str, line: u32, function: &str, count: u64, description: &str| PythonLine {
                file: file.into(),
                line,
                function: function.into(),
                bytes: count * 4 * MIB,
                count,
                description: description.into(),
            };
        // Lines 42 (half: through the library alone and through the stdlib), 50 and the
        // autograd thread (a quarter each), the windows' segments all counted.
        assert_eq!(lines.iter().map(|l| l.count).sum::<u64>(), n);
        let forward = lines[0].count;
        assert_eq!(
            lines[0],
            line("/home/u/train.py", 42, "forward", forward, "train.py:42")
        );
        assert!(lines[1..].contains(&line(
            "",
            0,
            "",
            lines.iter().find(|l| l.file.is_empty()).unwrap().count,
            "autograd thread (no Python frames)"
        )));
        assert!(lines[1..].iter().any(|l| l.description == "train.py:50"));
        assert_eq!(lines.len(), 3, "{lines:#?}");
        assert!((forward as f64 / n as f64 - 0.5).abs() < 0.1, "{lines:#?}");
        let text = fmt_python_lines(&lines, Events::Segments.unit(), 3);
        assert!(
            text.starts_with(&format!(
                "train.py:42 ({} in {forward} segments), ",
                crate::units::fmt_bytes(forward * 4 * MIB)
            )),
            "{text}"
        );
        assert!(
            text.contains("autograd thread (no Python frames): "),
            "{text}"
        );
        // Without a name from the native frames: the generic bucket.
        let generic = python_lines(sim.p.stacks(), &e.grew_at, |_| thread_kind(&[]));
        assert!(generic
            .iter()
            .any(|l| l.description == "threads without Python frames"));
        // A line that caused a few bytes beside them is not listed as a cause.
        let mut with_tiny = e.grew_at.clone();
        with_tiny.push(GrewAt {
            site: SiteId(999_999),
            bytes: 4,
            count: 1,
        });
        let lines = python_lines(sim.p.stacks(), &with_tiny, |site| {
            if site == SiteId(999_999) {
                "tiny".to_string()
            } else {
                thread_kind(&[])
            }
        });
        assert!(lines.iter().all(|l| l.description != "tiny"), "{lines:#?}");
    }

    #[test]
    fn the_autograd_thread_is_named_with_its_backward_node() {
        let f = |function: &str| FrameInfo {
            function: function.into(),
            ..Default::default()
        };
        let engine = f("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)");
        let node = f("torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)");
        assert_eq!(
            thread_kind(&[node, engine.clone()]),
            "autograd thread (no Python frames), AddmmBackward0"
        );
        assert_eq!(thread_kind(&[engine]), "autograd thread (no Python frames)");
        assert_eq!(thread_kind(&[]), "threads without Python frames");
    }

    /// Segments reserved from PyTorch's CUDA library: the hint says they are the cache's
    /// segments and how to see the tensors; tensor-level events keep the tensors' hint.
    #[test]
    fn segments_from_libc10_cuda_get_the_torch_hint() {
        let mut sim = Sim::new(1_000_000);
        let module = Frame::ModuleDef(oomtrace_proto::wire::ModuleDef {
            id: 1,
            start: 0x7000_0000,
            end: 0x7100_0000,
            bias: 0x7000_0000,
            build_id: Vec::new(),
            path: "/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so".into(),
            file: None,
        });
        sim.p.apply(&module, &mut sim.a);
        let stack = Frame::StackDef {
            id: StackId(9),
            frames: vec![0x7000_1234, 0x4000],
        };
        sim.p.apply(&stack, &mut sim.a);
        for _ in 0..30 {
            let t = sim.alloc(1, 8 * MIB);
            sim.free(t);
            sim.alloc(9, 20 * MIB);
            sim.mark();
        }
        let f = &device_growth(&sim)[0];
        let mut e = evidence(f).clone();
        assert_eq!(e.events, Events::Allocations);
        let (cause, hint) = device_growth_hint(sim.p.stacks(), &e, f.cause, f.hint.clone());
        assert_eq!(
            cause,
            Cause::TorchSegments {
                certain: true,
                explained: true
            }
        );
        assert!(hint.contains("The leak findings on this device"), "{hint}");
        assert!(
            hint.contains("These are PyTorch's caching-allocator segments, not tensors")
                && hint.contains(
                    "`oomtrace run` traces each tensor by default on PyTorch 2.4 to 2.15"
                )
                && hint.contains("torch.cuda.memory._record_memory_history()"),
            "{hint}"
        );
        resolve_device_growth(sim.p.stacks(), &mut e, |_| thread_kind(&[]));
        assert_eq!(e.events, Events::Segments);
        // Not a Python program: no lines to name.
        assert!(e.python_lines.is_empty());
        e.events = Events::Tensors;
        let (cause, hint) = device_growth_hint(sim.p.stacks(), &e, f.cause, f.hint.clone());
        assert_eq!((cause, hint), (f.cause, f.hint.clone()));
    }
}
