//! liboomtrace: sees every CUDA device allocation and free of the process it is loaded into,
//! records the native call site, and streams events to an oomtrace collector.
//!
//! Ways in: `LD_PRELOAD=liboomtrace.so` (or `oomtrace run`), which interposes the driver and
//! runtime exports, `dlsym`, and the `cuGetProcAddress` / `cudaGetDriverEntryPoint` resolvers
//! (`hooks/resolve.rs`); and the `oomtrace_*` C entry points below. Of libc it also interposes
//! `_exit`, `_Exit` and `exec*` (`lifecycle.rs`) and the close family
//! (`transport/fd_guard.rs`: the shim's own descriptor is never written to or closed once the
//! program closed or replaced it).
//!
//! Promises to the host process: a CUDA call's result is never changed; no panic crosses
//! `extern "C"` (`guard.rs`); one constructor, which only sets three environment variables in
//! a Python interpreter nobody configured (`python_env.rs`); fork, `exit` and `_exit` are handled
//! (`lifecycle.rs`); if the collector dies the program runs on and losses are counted
//! (`transport/`). The GIL is never touched.
//!
//! Where to change what: hooked functions are one line each in `hooks/table.rs`; what they
//! record is `hooks/recorders.rs`, through the one recording API, `recording.rs`; configuration is the `OOMTRACE_*` table in `config.rs`. The
//! module map (which module may import which, one way) is in `shim/README.md`.

// The exported functions are CUDA's and libc's own C entry points: their safety contract is
// the one in CUDA's and glibc's documentation, not ours to restate per function.
#![allow(clippy::missing_safety_doc)]

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
compile_error!("liboomtrace supports x86-64 Linux (the dlsym trampoline and unwinder start are x86-64 assembly)");

pub mod cache_line;
pub mod clock;
pub mod config;
pub mod cuda;
pub mod device_watch;
pub mod driver_query;
pub mod guard;
pub mod hooks;
pub mod lifecycle;
pub mod log;
pub mod modules;
pub mod once;
pub mod pluggable;
pub mod python;
pub mod python_env;
pub mod recording;
pub mod secure;
pub mod stack;
pub mod symbols;
pub mod this_thread;
pub mod torch_abi;
pub mod torch_allocator;
pub mod torch_layout;
pub mod torch_reserve;
pub mod torch_tracker;
pub mod transport;

use std::ffi::{c_char, c_int, CStr};

/// The lazy start on a process's first hook. `guard` sits below `lifecycle` and never imports
/// it; the crate root, which wires the modules together, hands it the start.
#[cold]
#[inline(never)]
fn start_tracing() -> bool {
    lifecycle::start()
}

/// Marks a step boundary (e.g. one training iteration). `label` may be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oomtrace_mark(label: *const c_char) {
    guard::catch(|| {
        if !guard::enter() {
            return;
        }
        let text = if label.is_null() {
            String::new()
        } else {
            // SAFETY: the caller passes a C string.
            unsafe { CStr::from_ptr(label) }
                .to_string_lossy()
                .into_owned()
        };
        recording::marker(&text);
        guard::leave();
    });
}

/// Says this process's rank in a distributed job, for a process whose launcher did not put
/// it in the environment (`torch.multiprocessing.spawn` passes it as an argument; the
/// `oomtrace` Python package calls this after `torch.distributed.init_process_group`).
/// Negative values are unknown and left out. Returns 0 when sent, -1 when tracing is off.
#[unsafe(no_mangle)]
pub extern "C" fn oomtrace_set_rank(rank: c_int, local_rank: c_int, world_size: c_int) -> c_int {
    let sent = guard::catch(|| {
        if !guard::enter() {
            return false;
        }
        let vars: Vec<(String, String)> = [
            ("RANK", rank),
            ("LOCAL_RANK", local_rank),
            ("WORLD_SIZE", world_size),
        ]
        .into_iter()
        .filter(|&(_, v)| v >= 0)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let sent = recording::launch(vars);
        guard::leave();
        sent
    });
    if sent == Some(true) {
        0
    } else {
        -1
    }
}

/// PyTorch's own statistics of `device` as the program read them (`torch.cuda.memory_allocated`,
/// `max_memory_allocated`, `memory_reserved`), sent right after a step marker so that the
/// collector knows allocated against reserved in every mode (the `oomtrace` Python package's
/// step hook calls this; it never reads them itself). A device outside 0 to
/// `oomtrace_proto::MAX_DEVICES - 1` is not sent. Returns 0 when sent, -1 when tracing is off,
/// the device is out of range or the reading could not be queued.
#[unsafe(no_mangle)]
pub extern "C" fn oomtrace_torch_memory(
    device: c_int,
    allocated: u64,
    max_allocated: u64,
    reserved: u64,
) -> c_int {
    let Ok(device) = i16::try_from(device) else {
        return -1;
    };
    if !(0..oomtrace_proto::MAX_DEVICES).contains(&device) {
        return -1;
    }
    let sent = guard::catch(|| {
        if !guard::enter() {
            return false;
        }
        let sent = recording::torch_memory(device, allocated, max_allocated, reserved);
        guard::leave();
        sent
    });
    if sent == Some(true) {
        0
    } else {
        -1
    }
}

/// PyTorch's out-of-memory observer (`torch._C._cuda_attach_out_of_memory_observer`, which the
/// `oomtrace` Python package registers): PyTorch's caching allocator calls it on the thread
/// that asked, inside the allocation, just before it raises `OutOfMemoryError`, with the
/// device, its segment size, what it was allowed to reserve (the
/// `set_per_process_memory_fraction` cap, or the device's total) and the driver's free
/// memory. Nothing is recorded here: the allocation's own wrapper records the OOM as it
/// unwinds, with the request and `allowed`, also when the driver refused nothing (a cap's
/// refusal). Returns 0 when it will, -1 otherwise (tracing off, a device out of range, or not
/// inside an allocation oomtrace wraps: PyTorch's trace tracker records its own OOM then).
#[unsafe(no_mangle)]
pub extern "C" fn oomtrace_torch_out_of_memory(
    device: c_int,
    _segment: u64,
    allowed: u64,
    _free: u64,
) -> c_int {
    let Ok(device) = i16::try_from(device) else {
        return -1;
    };
    if !(0..oomtrace_proto::MAX_DEVICES).contains(&device) {
        return -1;
    }
    match guard::catch(|| torch_reserve::allocator_out_of_memory(device, allowed)) {
        Some(true) => 0,
        _ => -1,
    }
}

/// Makes sure everything recorded so far has reached the collector (waits at most 2 s).
/// Returns 0 on success, -1 if tracing is off or the flush timed out.
#[unsafe(no_mangle)]
pub extern "C" fn oomtrace_flush() -> c_int {
    match guard::catch(lifecycle::flush) {
        Some(true) => 0,
        _ => -1,
    }
}
