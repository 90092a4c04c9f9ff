//! The anatomy's rule on a synthetic training loop: parameters, inputs, a forward pass whose
//! activations the backward frees, gradients, Adam's two state tensors, temporaries of each
//! phase, and an output the program keeps.

use super::*;
use crate::analysis::sim::Sim;
use oomtrace_proto::Api;

const MIB: u64 = 1 << 20;
const TORCH: &str = "/venv/lib/python3.11/site-packages/torch";

/// Stacks: 10 parameters (`Module._apply`), 11 forward (`Module._call_impl`), 12 no Python
/// (the autograd thread), 13 the optimizer, 14 the program's own line.
fn sim() -> Sim {
    let mut s = Sim::new(1_000_000);
    s.code(
        1,
        &format!("{TORCH}/nn/modules/module.py"),
        "Module._apply",
        900,
    );
    s.code(
        2,
        &format!("{TORCH}/nn/modules/module.py"),
        "Module._call_impl",
        1700,
    );
    s.code(
        3,
        &format!("{TORCH}/optim/adam.py"),
        "Adam._init_group",
        150,
    );
    s.code(4, "/home/u/train.py", "<module>", 1);
    s.stack(10, 0xa000, &[1, 4]);
    s.stack(11, 0xb000, &[2, 4]);
    s.p.apply(
        &oomtrace_proto::wire::Frame::StackDef {
            id: oomtrace_proto::StackId(12),
            frames: vec![0xc000],
        },
        &mut s.a,
    );
    s.stack(13, 0xd000, &[3, 4]);
    s.stack(14, 0xe000, &[4]);
    s
}

const T: Api = Api::oomtrace_torch_alloc;
const F: Api = Api::oomtrace_torch_free;

/// Runs `steps` training steps; returns the addresses kept across steps.
fn train(s: &mut Sim, steps: u64) {
    // A segment for the weights, the weights in it.
    s.alloc_at(Api::cudaMalloc, 0, 0x1000_0000_0000, 300 * MIB);
    s.segment(0x1000_0000_0000, 300 * MIB);
    s.alloc_at(T, 10, 0x1000_0000_0000, 60 * MIB);
    s.alloc_at(T, 10, 0x1000_1000_0000, 40 * MIB);
    // A second segment for the rest.
    s.alloc_at(Api::cudaMalloc, 0, 0x2000_0000_0000, 2048 * MIB);
    s.segment(0x2000_0000_0000, 2048 * MIB);
    let base = 0x2000_0000_0000u64;
    for step in 0..steps {
        let at = |n: u64| base + (step % 2) * 0x1000_0000 + n * 0x10_0000;
        // The batch (the previous step's goes when replaced).
        s.alloc_at(T, 14, at(1), 8 * MIB);
        if step > 0 {
            s.free_at(F, base + ((step - 1) % 2) * 0x1000_0000 + 0x10_0000);
            // The previous step's output, held by a variable until now.
            s.free_at(F, base + ((step - 1) % 2) * 0x1000_0000 + 4 * 0x10_0000);
        }
        // Forward: a saved activation, a temporary freed at once, the output.
        s.alloc_at(T, 11, at(2), 50 * MIB);
        s.alloc_at(T, 11, at(3), 5 * MIB);
        s.free_at(F, at(3));
        s.alloc_at(T, 11, at(4), 2 * MIB);
        // Backward: gradients on the first step (kept: zero_grad(set_to_none=False)), a
        // temporary, the activation freed.
        if step == 0 {
            s.alloc_at(T, 12, base + 0x8000_0000, 60 * MIB);
            s.alloc_at(T, 12, base + 0x8400_0000, 40 * MIB);
        }
        s.alloc_at(T, 12, at(5), 30 * MIB);
        s.free_at(F, at(5));
        s.free_at(F, at(2));
        // The optimizer: Adam's state on the first step, a temporary every step.
        if step == 0 {
            for (i, size) in [60, 60, 40, 40].into_iter().enumerate() {
                s.alloc_at(
                    T,
                    13,
                    base + 0x9000_0000 + i as u64 * 0x400_0000,
                    size * MIB,
                );
            }
        }
        s.alloc_at(T, 13, at(6), 7 * MIB);
        s.free_at(F, at(6));
        s.mark();
    }
}

fn roles(r: &RoleBytes) -> Vec<(&'static str, u64)> {
    ROLES
        .iter()
        .filter(|role| r[**role as usize] > 0)
        .map(|role| (role.name(), r[*role as usize] / MIB))
        .collect()
}

#[test]
fn a_training_step_is_parameters_gradients_optimizer_state_and_what_it_keeps() {
    let mut s = sim();
    train(&mut s, 4);
    let a = s.a.anatomy.report(&s.p, &mut |_| false);
    assert_eq!(a.len(), 1);
    let d = &a[0];
    // After every step: the weights, their gradients, Adam's two moments, the batch and the
    // output the program still holds.
    let last = d.per_step.last().unwrap();
    assert_eq!(last.step, 4);
    assert_eq!(
        roles(&last.roles),
        [
            ("parameter", 100),
            ("gradient", 100),
            ("optimizer_state", 200),
            ("input", 8),
            ("other", 2)
        ]
    );
    assert_eq!(d.per_step.len(), 4);
}

/// The peak is the device's largest total (its second segment), taken at the first free
/// after it: the forward's temporary, with everything made into the segment until then.
#[test]
fn the_peak_adds_up_to_the_devices_bytes() {
    let mut s = sim();
    train(&mut s, 3);
    let a = s.a.anatomy.report(&s.p, &mut |_| false);
    let peak = a[0].at_peak.as_ref().unwrap();
    assert_eq!(peak.device_bytes, 2348 * MIB);
    assert_eq!(peak.step, 0);
    // At the first free of step 0 (the forward's temporary): weights, batch, the activation
    // (freed by the backward) and the temporary itself.
    assert_eq!(
        roles(&peak.roles),
        [
            ("parameter", 100),
            ("activation", 50),
            ("temporary", 5),
            ("input", 8)
        ]
    );
    let tensors: u64 = peak.roles.iter().sum();
    assert_eq!(tensors, peak.tracked_tensor_bytes);
    assert_eq!(
        tensors + peak.reserve_gap_bytes + peak.outside_bytes,
        peak.device_bytes
    );
    assert_eq!(peak.outside_bytes, 0);
    assert_eq!(peak.activation_sites.len(), 1);
}

/// A program that ends at its largest total, with no free after it (it kept buffers until an
/// out-of-memory and exited): the peak is then, not the earlier one a free had settled.
#[test]
fn a_peak_that_no_free_followed_is_the_peak() {
    let mut s = sim();
    train(&mut s, 2);
    let base = 0x2000_0000_0000u64 + 0x10_0000 * 40;
    s.alloc_at(Api::cudaMalloc, 0, 0x3000_0000_0000, 1024 * MIB);
    s.segment(0x3000_0000_0000, 1024 * MIB);
    for i in 0..4 {
        s.alloc_at(T, 14, base + i * 0x100_0000, 16 * MIB);
    }
    let a = s.a.anatomy.report(&s.p, &mut |_| false);
    let peak = a[0].at_peak.as_ref().unwrap();
    assert_eq!(peak.device_bytes, (300 + 2048 + 1024) * MIB);
    assert_eq!(peak.step, 2);
    let tensors: u64 = peak.roles.iter().sum();
    assert_eq!(
        tensors + peak.reserve_gap_bytes + peak.outside_bytes,
        peak.device_bytes
    );
}

/// An out-of-memory in the middle of a backward pass: what was alive then, and the
/// activations that backward never got to free are activations.
#[test]
fn an_out_of_memory_in_the_backward_pass_shows_its_activations() {
    let mut s = sim();
    train(&mut s, 2);
    // Step 2's forward, then the backward asks for more than there is.
    let base = 0x2000_0000_0000u64 + 0x10_0000 * 20;
    s.alloc_at(T, 14, base, 8 * MIB);
    s.alloc_at(T, 11, base + 0x10_0000, 500 * MIB);
    s.alloc_at(T, 12, base + 0x20_0000, 30 * MIB);
    // The allocator's cudaMalloc is refused first: not kept (PyTorch may still recover).
    let mut refused =
        oomtrace_proto::Event::new(oomtrace_proto::EventKind::AllocFailed, Api::cudaMalloc);
    refused.size = 4096 * MIB;
    refused.result = 2;
    refused.device = 0;
    s.p.apply_event(&refused, &mut s.a);
    // PyTorch's own: the tensor it could not place.
    let mut e = oomtrace_proto::Event::new(oomtrace_proto::EventKind::AllocFailed, T);
    e.size = 4096 * MIB;
    e.result = 2;
    e.device = 0;
    e.stack = oomtrace_proto::StackId(12);
    s.p.apply_event(&e, &mut s.a);
    let a = s.a.anatomy.report(&s.p, &mut |_| false);
    assert_eq!(a[0].at_oom.len(), 1);
    let oom = &a[0].at_oom[0];
    assert_eq!(oom.step, 2);
    let r = roles(&oom.roles);
    assert!(r.contains(&("activation", 500)), "{r:?}");
    assert!(r.contains(&("gradient", 100 + 30)), "{r:?}");
    assert!(r.contains(&("optimizer_state", 200)), "{r:?}");
    let tensors: u64 = oom.roles.iter().sum();
    assert_eq!(tensors, oom.tracked_tensor_bytes);
    assert_eq!(
        tensors + oom.reserve_gap_bytes + oom.outside_bytes,
        oom.device_bytes
    );
}

/// Without Python frames anywhere (stacks off, a C++ program) nothing decides: other.
#[test]
fn without_python_frames_every_tensor_is_other() {
    let mut s = Sim::new(1_000_000);
    s.alloc_at(Api::cudaMalloc, 1, 0x1000_0000_0000, 100 * MIB);
    s.segment(0x1000_0000_0000, 100 * MIB);
    s.alloc_at(T, 1, 0x1000_0000_0000, 10 * MIB);
    s.alloc_at(T, 2, 0x1000_0100_0000, 10 * MIB);
    s.free_at(F, 0x1000_0100_0000);
    s.mark();
    let a = s.a.anatomy.report(&s.p, &mut |_| false);
    let peak = a[0].at_peak.as_ref().unwrap();
    assert_eq!(roles(&peak.roles), [("other", 20)]);
    assert_eq!(peak.reserve_gap_bytes, 80 * MIB);
}

/// A library's workspace that PyTorch allocates as a tensor once per handle and keeps (on the
/// autograd thread: it outlives its step like a gradient) is told apart when the report says
/// its site is one, at every step's end and at the peak.
#[test]
fn a_library_workspace_is_not_a_gradient() {
    let mut s = sim();
    s.p.apply(
        &oomtrace_proto::wire::Frame::StackDef {
            id: oomtrace_proto::StackId(15),
            frames: vec![0xf000],
        },
        &mut s.a,
    );
    let workspace = s.p.stack_site(oomtrace_proto::StackId(15));
    // Made in the first backward pass, never freed.
    s.alloc_at(Api::cudaMalloc, 0, 0x3000_0000_0000, 64 * MIB);
    s.segment(0x3000_0000_0000, 64 * MIB);
    train(&mut s, 1);
    s.alloc_at(T, 11, 0x2000_7000_0000, MIB);
    s.alloc_at(T, 12, 0x2000_7100_0000, MIB);
    s.alloc_at(T, 15, 0x3000_0000_0000, 32 * MIB);
    s.free_at(F, 0x2000_7000_0000);
    s.mark();
    let a = s.a.anatomy.report(&s.p, &mut |site| site == workspace);
    let last = a[0].per_step.last().unwrap();
    let r = roles(&last.roles);
    assert!(r.contains(&("workspace", 32)), "{r:?}");
    assert!(r.contains(&("gradient", 100 + 1)), "{r:?}");
    let none = s.a.anatomy.report(&s.p, &mut |_| false);
    let r = roles(&none[0].per_step.last().unwrap().roles);
    assert!(r.contains(&("gradient", 100 + 1 + 32)), "{r:?}");
}

/// A tensor made between steps and kept in a list is the next step's input only: once it has
/// outlived that step it is kept (`other`), at every step's end and when settled.
#[test]
fn tensors_kept_past_their_step_are_not_inputs() {
    let mut s = sim();
    train(&mut s, 2);
    for i in 0..3u64 {
        // Made after the step's marker, never freed.
        s.alloc_at(T, 14, 0x2000_6000_0000 + i * 0x10_0000, MIB);
        s.mark();
    }
    let a = s.a.anatomy.report(&s.p, &mut |_| false);
    let last = roles(&a[0].per_step.last().unwrap().roles);
    // The newest kept tensor is an input; the two older ones are not, nor the last training
    // step's batch (8 MiB, no step has replaced it) beside its output (2 MiB).
    assert!(last.contains(&("input", 1)), "{last:?}");
    assert!(last.contains(&("other", 8 + 2 + 2)), "{last:?}");
}

/// Sizes a hostile trace claims (near 2^64) saturate in every sum: no wrap, no panic.
#[test]
fn sizes_near_2_64_saturate() {
    let mut s = sim();
    s.alloc_at(Api::cudaMalloc, 0, 0x1000_0000_0000, u64::MAX - 1);
    s.segment(0x1000_0000_0000, u64::MAX - 1);
    for i in 0..3u64 {
        s.alloc_at(T, 11, 0x1000_0000_0000 + i, u64::MAX - 1);
    }
    s.free_at(F, 0x1000_0000_0000);
    s.mark();
    s.alloc_at(T, 14, 0x2000_0000_0000, u64::MAX - 1);
    s.mark();
    let a = s.a.anatomy.report(&s.p, &mut |_| true);
    let peak = a[0].at_peak.as_ref().unwrap();
    assert_eq!(
        peak.roles.iter().fold(0u64, |t, &b| t.saturating_add(b)),
        u64::MAX
    );
    assert!(!a[0].per_step.is_empty());
}
