//! Unit tests of the backward pass's names (`backward.rs`), on a synthetic process whose native
//! frames are named by their one address.

use super::*;
use crate::analysis::sim::Sim;
use crate::report::names::site_name;
use crate::report::symbolize::python_frames;

const ADDMM: u64 = 0xa00;
const ONES_LIKE: u64 = 0xb00;
const ADDMM_NODE: u64 = 0xc00;
const ENGINE: u64 = 0xd00;
const MM_NODE: u64 = 0xe00;
const PLAIN: u64 = 0xf00;

fn native(function: &str) -> FrameInfo {
    FrameInfo {
        function: function.into(),
        module: "libtorch_cpu.so".into(),
        ..Default::default()
    }
}

/// The native frames a site's one address stands for, innermost first.
fn natives(addr: u64) -> Vec<FrameInfo> {
    let engine = native(
        "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
    );
    let alloc = native("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc");
    match addr {
        ADDMM => vec![
            alloc,
            native("at::_ops::addmm::call(at::Tensor const&, at::Tensor const&)"),
        ],
        ONES_LIKE => vec![alloc, native("at::_ops::ones_like::call(at::Tensor const&)")],
        ADDMM_NODE => vec![
            alloc,
            native("at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
            native("torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
            engine,
        ],
        MM_NODE => vec![
            alloc,
            native("torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
            engine,
        ],
        ENGINE => vec![
            alloc,
            native("at::_ops::sum_dim_IntList::call(at::Tensor const&)"),
            native("torch::autograd::InputMetadata::reduce_grad(at::Tensor&) const"),
            native("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)"),
            engine,
        ],
        _ => vec![FrameInfo {
            function: "keep_history".into(),
            file: "/src/train.c".into(),
            line: 63,
            module: "train".into(),
            ..Default::default()
        }],
    }
}

/// A training step: `model(x)` runs `addmm` at train.py:25 (three allocations) and at
/// train.py:26 (one), both through `Linear.forward` inside `main`; `loss.backward()` at
/// train.py:27; then the backward pass's sites (no Python frames) and a C function's.
fn training() -> Sim {
    let mut sim = Sim::new(1_000_000);
    sim.code(
        1,
        "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
        "Linear.forward",
        134,
    );
    sim.code(2, "/home/u/train.py", "main", 25);
    sim.code(3, "/home/u/train.py", "main", 26);
    sim.code(
        4,
        "/venv/lib/python3.11/site-packages/torch/_tensor.py",
        "Tensor.backward",
        625,
    );
    sim.code(5, "/home/u/train.py", "main", 27);
    sim.code(6, "/home/u/train.py", "<module>", 40);
    sim.stack(10, ADDMM, &[1, 2, 6]);
    sim.stack(11, ADDMM, &[1, 3, 6]);
    sim.stack(12, ONES_LIKE, &[4, 5, 6]);
    sim.stack(13, ADDMM_NODE, &[]);
    sim.stack(14, ENGINE, &[]);
    sim.stack(15, MM_NODE, &[]);
    sim.stack(16, PLAIN, &[]);
    for stack in [10, 10, 10, 11, 12, 13, 14, 15, 16] {
        sim.alloc(stack, 1 << 20);
    }
    sim
}

/// The symbolized frames of `site`: its native frames, then its Python frames.
fn frames_of(p: &Process, site: SiteId) -> Vec<FrameInfo> {
    let addr = p.sites[site.0 as usize][0].addr;
    let mut frames = natives(addr);
    frames.extend(python_frames(p, site));
    frames
}

/// The site whose native address is `addr`.
fn site_at(p: &Process, addr: u64) -> SiteId {
    let i = p
        .sites
        .iter()
        .position(|s| s.first().is_some_and(|f| f.addr == addr))
        .expect("a site there");
    SiteId(i as u32)
}

/// The backward-pass place and name of the site at `addr`.
fn named(sim: &Sim, lookup: &mut Lookup, addr: u64) -> (Option<Backward>, String) {
    let p = &sim.p;
    let frames = frames_of(p, site_at(p, addr));
    let b = lookup.backward(p, &frames, &mut |s| frames_of(p, s));
    let name = site_name(&frames, b.as_ref());
    (b, name)
}

/// A node is named by its op and the lines whose sites ran that op (most allocations first),
/// under the Python frames those sites share; its report `backward_node` keeps the node.
#[test]
fn a_node_is_named_by_the_forward_lines_of_its_op() {
    let sim = training();
    let mut lookup = Lookup::new();
    let (b, name) = named(&sim, &mut lookup, ADDMM_NODE);
    let b = b.expect("a backward-pass site");
    assert_eq!(name, "backward of addmm at train.py:25 and train.py:26");
    assert_eq!(b.what(), "backward of addmm");
    let lines: Vec<(&str, u64)> = b
        .lines()
        .iter()
        .map(|l| (l.line.description.as_str(), l.line.count))
        .collect();
    assert_eq!(lines, [("train.py:25", 3), ("train.py:26", 1)]);
    assert_eq!(b.first_line(), Some(("/home/u/train.py", 25)));
    // Both lines run inside `<module>` at train.py:40: the flame graph's place for it.
    let path: Vec<(String, u32)> = b
        .forward_path()
        .iter()
        .map(|f| (f.function.clone(), f.line))
        .collect();
    assert_eq!(path, [("<module>".to_string(), 40)]);
    assert_eq!(b.leaf(), "backward of addmm");
    let node = b.node().expect("a node");
    assert_eq!(node.name, "AddmmBackward0");
    assert_eq!(node.forward_op, "addmm");
    assert_eq!(node.forward_lines[0].description, "train.py:25");
    assert_eq!(node.forward_lines[0].bytes, 3 << 20);
}

/// The engine's own allocations (outside any node) are named by the line that ran the
/// backward pass; a node whose op no site ran says so; anything else is not the backward pass.
#[test]
fn the_engine_and_unseen_forward_ops_are_named_too() {
    let sim = training();
    let mut lookup = Lookup::new();
    let (b, name) = named(&sim, &mut lookup, ENGINE);
    assert_eq!(name, "backward at train.py:27 (autograd engine)");
    assert!(b.unwrap().node().is_none());
    let (_, name) = named(&sim, &mut lookup, MM_NODE);
    assert_eq!(name, "backward of mm (forward line not seen)");
    for addr in [ADDMM, ONES_LIKE, PLAIN] {
        let (b, _) = named(&sim, &mut lookup, addr);
        assert_eq!(b, None, "{addr:#x}");
    }
    let (_, name) = named(&sim, &mut lookup, ADDMM);
    assert_eq!(name, "train.py:25 main");
    let (_, name) = named(&sim, &mut lookup, PLAIN);
    assert_eq!(name, "keep_history");
    // In a list of lines (`cache grew at`): the same names; a thread without Python frames
    // outside the backward pass by its kind.
    let p = &sim.p;
    let place = |lookup: &mut Lookup, addr| {
        let frames = frames_of(p, site_at(p, addr));
        lookup.native_place(p, &frames, &mut |s| frames_of(p, s))
    };
    assert_eq!(
        place(&mut lookup, ADDMM_NODE),
        "backward of addmm at train.py:25 and train.py:26"
    );
    assert_eq!(place(&mut lookup, PLAIN), "threads without Python frames");
}

/// Names hold at most two lines; every form says `backward`, none a C++ name.
#[test]
fn names_show_two_lines_and_count_the_rest() {
    let line = |n: u32| ForwardLine {
        line: PythonLine {
            file: format!("/home/u/m{n}.py"),
            line: n,
            function: "f".into(),
            bytes: 1,
            count: 1,
            description: format!("m{n}.py:{n}"),
        },
        path: Vec::new(),
    };
    let node = |op: &str, forward: Vec<ForwardLine>| Backward::Node {
        node: "AddmmBackward0".into(),
        op: op.into(),
        forward,
    };
    assert_eq!(
        node("addmm", (1..=4).map(line).collect()).to_string(),
        "backward of addmm at m1.py:1, m2.py:2 and 2 more"
    );
    assert_eq!(
        node("addmm", vec![line(1)]).to_string(),
        "backward of addmm at m1.py:1"
    );
    // No shared frames: the flame graph's leaf is the whole name.
    assert_eq!(
        node("addmm", vec![line(1)]).leaf(),
        "backward of addmm at m1.py:1"
    );
    assert_eq!(
        node("", vec![]).to_string(),
        "AddmmBackward0 (backward pass)"
    );
    assert_eq!(
        Backward::Engine { calls: vec![] }.to_string(),
        "backward pass (autograd engine)"
    );
}

/// The one naming rule of lists (moved from the text report): a Python line as `file:line
/// function`, a backward-pass site by its node without a lookup, PyTorch's own code by its
/// thread and function.
#[test]
fn site_names_without_a_lookup() {
    let stack = natives(ADDMM_NODE);
    assert_eq!(site_name(&stack, None), "AddmmBackward0 (backward pass)");
    assert_eq!(
        site_name(&stack[3..], None),
        "autograd thread (no Python frames): thread_main"
    );
    let with_python = [
        stack[0].clone(),
        FrameInfo {
            function: "forward".into(),
            file: "/src/train.py".into(),
            line: 42,
            module: "python".into(),
            python: true,
            ..Default::default()
        },
    ];
    assert_eq!(site_name(&with_python, None), "train.py:42 forward");
    assert_eq!(site_name(&[], None), "(no stack)");
    assert!(in_backward(&stack) && in_backward(&natives(ENGINE)));
    assert!(!in_backward(&with_python) && !in_backward(&natives(PLAIN)));
}
