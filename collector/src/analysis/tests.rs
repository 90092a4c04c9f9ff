use super::*;
use crate::model::OUT_OF_MEMORY;
use oomtrace_proto::wire::Hello;
use oomtrace_proto::Api;
use oomtrace_proto::{Event, EventKind};

fn ev(kind: EventKind, api: Api, ptr: u64, size: u64) -> Event {
    let mut e = Event::new(kind, api);
    e.ptr = ptr;
    e.size = size;
    e.device = 0;
    e
}

#[test]
fn oom_records_state_at_failure() {
    let mut p = Process::new(1, Hello::default());
    let mut a = Analysis::default();
    p.apply_event(&ev(EventKind::Alloc, Api::cuMemAlloc_v2, 0xa, 1000), &mut a);
    let mut f = ev(EventKind::AllocFailed, Api::cuMemAlloc_v2, 0, 5000);
    f.result = OUT_OF_MEMORY;
    f.tid = 9;
    p.apply_event(&f, &mut a);
    let mut info = ev(EventKind::MemInfo, Api::cuMemGetInfo_v2, 300, 4096);
    info.tid = 9;
    p.apply_event(&info, &mut a);
    let o = &a.oom.records[0];
    assert_eq!(
        (o.size, o.live_bytes, o.free_bytes, o.total_bytes),
        (5000, 1000, Some(300), Some(4096))
    );
    assert_eq!(o.top_sites, vec![(SiteId(0), 1000, 1)]);
}

#[test]
fn levels_keep_their_report_words() {
    let names: Vec<&str> = [
        Level::INFO,
        Severity::Warning.into(),
        Severity::Error.into(),
        Confidence::Suspected.into(),
        Confidence::Likely.into(),
        Confidence::Confirmed.into(),
    ]
    .iter()
    .map(|l: &Level| l.name())
    .collect();
    assert_eq!(
        names,
        [
            "info",
            "warning",
            "error",
            "suspected",
            "likely",
            "confirmed"
        ]
    );
}

mod kept_together {
    use super::*;
    use crate::analysis::sim::Sim;
    use crate::analysis::together::PartRole;

    const MIB: u64 = 1 << 20;
    const TORCH: &str = "/venv/lib/python3.11/site-packages/torch";
    const T: Api = Api::oomtrace_torch_alloc;
    const F: Api = Api::oomtrace_torch_free;

    /// Stacks: 11 and 15 two ops of a forward pass (`Module._call_impl`) at the program's line
    /// 12, 12 the autograd thread (no Python), 13 the optimizer, 14 the program's line 7 (the
    /// input), 16 another line of the program.
    fn sim() -> Sim {
        let mut s = Sim::new(1_000_000);
        s.code(
            2,
            &format!("{TORCH}/nn/modules/module.py"),
            "Module._call_impl",
            1700,
        );
        s.code(3, &format!("{TORCH}/optim/adam.py"), "Adam.step", 150);
        s.code(4, "/home/u/train.py", "<module>", 12);
        s.code(5, "/home/u/train.py", "<module>", 7);
        s.code(6, "/home/u/train.py", "<module>", 20);
        s.stack(11, 0xb000, &[2, 4]);
        s.stack(15, 0xb100, &[2, 4]);
        s.p.apply(
            &oomtrace_proto::wire::Frame::StackDef {
                id: oomtrace_proto::StackId(12),
                frames: vec![0xc000],
            },
            &mut s.a,
        );
        s.stack(13, 0xd000, &[3, 4]);
        s.stack(14, 0xe000, &[5]);
        s.stack(16, 0xf000, &[6]);
        s
    }

    /// `steps` steps of `history.append(model(x))`: the input (stack 14), an activation the
    /// forward saves (11) and the output (15) kept every step, 1 MiB each, beside a temporary
    /// of each phase; from step `other_from` on, another line (16) keeps 2 MiB a step too.
    fn train(s: &mut Sim, steps: u64, other_from: u64) {
        let kept = |step: u64, n: u64| 0x1000_0000_0000 + step * 0x100_0000 + n * 0x10_0000;
        let tmp = 0x7000_0000_0000u64;
        for step in 0..steps {
            // PyTorch's cache takes a segment a step for what is kept: the device grows.
            let segment = 0x3000_0000_0000 + step * 0x100_0000;
            s.alloc_at(Api::cudaMalloc, 0, segment, 3 * MIB);
            s.segment(segment, 3 * MIB);
            s.alloc_at(T, 14, kept(step, 1), MIB);
            s.alloc_at(T, 11, kept(step, 2), MIB);
            s.alloc_at(T, 11, tmp, 4 * MIB);
            s.free_at(F, tmp);
            s.alloc_at(T, 15, kept(step, 3), MIB);
            s.alloc_at(T, 12, tmp, 4 * MIB);
            s.free_at(F, tmp);
            s.alloc_at(T, 13, tmp, 4 * MIB);
            s.free_at(F, tmp);
            if step >= other_from {
                s.alloc_at(T, 16, kept(step, 4), 2 * MIB);
            }
            s.mark();
        }
    }

    /// The call site of stack `id`.
    fn site(s: &Sim, id: u32) -> SiteId {
        s.p.stack_site(oomtrace_proto::StackId(id))
    }

    fn leaks(s: &Sim) -> Vec<Finding> {
        s.a.findings(&s.p)
            .into_iter()
            .filter(|f| f.kind == Kind::Leak)
            .collect()
    }

    /// An output kept with its graph: one leak finding, at the output's site, with the group's
    /// bytes and rate and its parts by role (the output first); the device's growth is
    /// explained by that one finding, and the live lines raise it once.
    #[test]
    fn an_output_kept_with_its_graph_is_one_leak_with_its_parts() {
        let mut s = sim();
        train(&mut s, 40, u64::MAX);
        let found = leaks(&s);
        assert_eq!(
            found.len(),
            1,
            "{:#?}",
            found.iter().map(|f| &f.message).collect::<Vec<_>>()
        );
        let f = &found[0];
        let (output, activation, input) = (site(&s, 15), site(&s, 11), site(&s, 14));
        assert_eq!(f.site, output, "named at the output's site");
        assert_eq!(f.growth_bytes_per_step, Some(3.0 * MIB as f64));
        assert_eq!((f.bytes, f.count), (120 * MIB, 120));
        let parts: Vec<(PartRole, SiteId, f64)> = f
            .parts
            .iter()
            .map(|p| (p.role, p.site, p.bytes_per_step))
            .collect();
        let m = MIB as f64;
        assert_eq!(
            parts,
            [
                (PartRole::Output, output, m),
                (PartRole::Activation, activation, m),
                (PartRole::Input, input, m),
            ]
        );
        assert!(
            f.message.starts_with(
                "keeps each step's output with its graph: +3.00 MiB/step in 3 tensors a step: \
                 output 1.00 MiB, saved activations 1.00 MiB, input 1.00 MiB; when detected"
            ),
            "{}",
            f.message
        );
        assert!(
            f.message
                .ends_with("by the end 120.00 MiB still held in 120 allocations"),
            "{}",
            f.message
        );
        let Some(Evidence::Leak(e)) = &f.evidence else {
            panic!("{f:?}")
        };
        assert_eq!((e.at_end.bytes, e.at_end.count), (120 * MIB, 120));
        assert_eq!(e.samples.last(), Some(&(120 * MIB)));
        // The device's growth: one leak finding explains it.
        let device =
            s.a.findings(&s.p)
                .into_iter()
                .find(|f| f.kind == Kind::DeviceGrowth)
                .expect("a device growth");
        let Some(Evidence::DeviceGrowth(d)) = &device.evidence else {
            panic!()
        };
        let l = d.leaks_on_device.expect("leaks on the device");
        assert_eq!(l.leaks, 1, "{}", device.message);
        assert!(device
            .message
            .contains("the 1 leak finding on this device accounts for it"));
        // Live: the parts are never raised on their own.
        let raised: Vec<SiteId> =
            s.a.alerts
                .list
                .iter()
                .filter(|a| a.finding.kind == Kind::Leak)
                .map(|a| a.finding.site)
                .collect();
        assert!(
            !raised.is_empty() && raised.iter().all(|&x| x == output),
            "{raised:?}"
        );
        let first =
            s.a.alerts
                .list
                .iter()
                .find(|a| a.finding.kind == Kind::Leak)
                .unwrap();
        assert_eq!(first.finding.parts.len(), 3);
    }

    /// A leak that began later at another line is another bug: its own finding, beside the
    /// group.
    #[test]
    fn a_leak_from_other_steps_stays_its_own_finding() {
        let mut s = sim();
        train(&mut s, 48, 16);
        let mut sites: Vec<(SiteId, usize)> =
            leaks(&s).iter().map(|f| (f.site, f.parts.len())).collect();
        sites.sort();
        assert_eq!(sites, [(site(&s, 15), 3), (site(&s, 16), 0)]);
    }

    /// `total_loss += model(out.detach())`: the graph of line 11 keeps `out`, made at line 10
    /// by the step's own forward, before the step's boundary (after the optimizer step) while
    /// line 11 runs after it. The loop's lines say which is the output (line 11's, made last
    /// in the loop), live and in the report, wherever the boundary cuts.
    #[test]
    fn the_output_is_the_one_made_at_the_later_line_of_the_loop() {
        let mut s = sim();
        // `<module>` of train.py: offset 0 is line 10, offset 20 line 11.
        s.p.apply(
            &oomtrace_proto::wire::Frame::CodeDef(oomtrace_proto::python::CodeDef {
                id: 8,
                format: oomtrace_proto::python::LineTableFormat::Lnotab as u8,
                first_line: 10,
                filename: "/home/u/train.py".into(),
                name: "<module>".into(),
                line_table: vec![20, 1],
            }),
            &mut s.a,
        );
        let stack = |s: &mut Sim, id: u32, native: u64, offset: u32| {
            let frames = vec![
                native,
                oomtrace_proto::python::PyFrame {
                    code: 2,
                    offset: 0,
                    group_end: false,
                }
                .encode(),
                oomtrace_proto::python::PyFrame {
                    code: 8,
                    offset,
                    group_end: true,
                }
                .encode(),
            ];
            s.p.apply(
                &oomtrace_proto::wire::Frame::StackDef {
                    id: oomtrace_proto::StackId(id),
                    frames,
                },
                &mut s.a,
            );
        };
        stack(&mut s, 17, 0xb200, 0);
        stack(&mut s, 18, 0xb300, 20);
        stack(&mut s, 19, 0xb400, 20);
        let kept = |step: u64, n: u64| 0x1000_0000_0000 + step * 0x100_0000 + n * 0x10_0000;
        let tmp = 0x7000_0000_0000u64;
        for step in 0..40 {
            // The step: its forward's output (kept by the next graph), backward, optimizer.
            s.alloc_at(T, 17, kept(step, 1), MIB);
            s.alloc_at(T, 12, tmp, 4 * MIB);
            s.free_at(F, tmp);
            s.alloc_at(T, 13, tmp, 4 * MIB);
            s.free_at(F, tmp);
            s.mark();
            // Line 11: a forward on it whose graph is kept (an activation, the output).
            s.alloc_at(T, 18, kept(step, 2), MIB);
            s.alloc_at(T, 19, kept(step, 3), MIB);
        }
        let found = leaks(&s);
        assert_eq!(
            found.len(),
            1,
            "{:#?}",
            found.iter().map(|f| &f.message).collect::<Vec<_>>()
        );
        let roles: Vec<(PartRole, SiteId)> =
            found[0].parts.iter().map(|p| (p.role, p.site)).collect();
        let (output, first, second) = (site(&s, 19), site(&s, 17), site(&s, 18));
        let mut activations = [first, second];
        activations.sort();
        assert_eq!(
            roles,
            [
                (PartRole::Output, output),
                (PartRole::Activation, activations[0]),
                (PartRole::Activation, activations[1]),
            ]
        );
        let live: Vec<SiteId> =
            s.a.alerts
                .list
                .iter()
                .filter(|a| a.finding.kind == Kind::Leak)
                .map(|a| a.finding.site)
                .collect();
        assert!(
            !live.is_empty() && live.iter().all(|&x| x == output),
            "{live:?}"
        );
    }
}
