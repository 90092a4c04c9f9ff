//! The simulated runtime, libcudart.so.12, through tests/c/rttest.c.

mod common;
use common::{run, run_in, scenario, temp_dir};

const MIB: u64 = 1 << 20;

#[test]
fn basics_malloc_zero_and_last_error() {
    let r = scenario("rttest", "basic", &[("SIMCUDA_MEMORY", "64M")]);
    assert_eq!(r.u64("devices"), 1);
    assert_eq!(r.u64("total"), 64 * MIB);
    assert_eq!(r.u64("free"), 64 * MIB);
}

#[test]
fn primary_context_costs_context_bytes() {
    let r = scenario(
        "rttest",
        "basic",
        &[("SIMCUDA_MEMORY", "64M"), ("SIMCUDA_CONTEXT_BYTES", "5M")],
    );
    assert_eq!(r.u64("free"), 59 * MIB);
}

#[test]
fn out_of_memory_maps_to_cuda_error_memory_allocation() {
    let r = scenario("rttest", "oom", &[("SIMCUDA_MEMORY", "4M")]);
    assert_eq!(r.u64("total"), 4 * MIB);
}

#[test]
fn error_mapping() {
    scenario("rttest", "errors", &[]);
}

#[test]
fn driver_entry_points() {
    scenario("rttest", "entry", &[]);
}

#[test]
fn stream_ordered_allocator() {
    scenario("rttest", "pool", &[]);
}

/// The capture calls forward to the driver's rules, errors mapped to
/// cudaErrorStreamCaptureUnsupported / cudaErrorStreamCaptureInvalidated.
#[test]
fn stream_capture() {
    scenario("rttest", "capture", &[]);
}

#[test]
fn pinned_host_memory() {
    scenario("rttest", "host", &[]);
}

#[test]
fn managed_pitch_and_device_reset() {
    scenario("rttest", "misc", &[]);
}

#[test]
fn current_device_is_per_thread() {
    let r = scenario("rttest", "devices", &[("SIMCUDA_DEVICES", "2")]);
    let (dev0, dev1) = (r.u64("dev0"), r.u64("dev1"));
    assert_ne!(dev0, dev1);
    assert_eq!(r.u64("thread"), dev0, "a new thread starts on device 0");
}

#[test]
fn no_device() {
    scenario("rttest", "nodevice", &[("SIMCUDA_DEVICES", "0")]);
}

/// The runtime dlopens libcuda.so.1 itself; without one it reports an
/// insufficient driver.  Skipped (with a line) where a real driver is installed, since
/// dlopen would find it through the system's library cache; under CI (`CI` set), which has no
/// driver, that is a failure rather than a test that checked nothing.
#[test]
fn missing_driver_is_insufficient_driver() {
    if system_has_libcuda() {
        assert!(
            std::env::var_os("CI").is_none_or(|v| v.is_empty()),
            "CI has a system libcuda.so.1, so this test cannot check a missing driver"
        );
        eprintln!("skipped: the system has a libcuda.so.1");
        return;
    }
    let dir = temp_dir("nodriver");
    std::fs::copy(
        format!("{}/libcudart.so.12", simcuda::LIB_DIR),
        dir.join("libcudart.so.12"),
    )
    .unwrap();
    let r = run_in(dir.to_str().unwrap(), "rttest", &["nodriver"], &[]);
    assert_eq!(
        r.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        r.stdout,
        r.stderr
    );
}

/// The mechanism a tracer depends on: the runtime's only name lookup is
/// dlsym("cuGetProcAddress_v2") through the global (interposable) dlsym, and
/// every driver function it uses comes through that pointer, by base name,
/// at CUDART_VERSION, the _ptsz twins with the per-thread flag.
#[test]
fn runtime_resolves_the_driver_only_through_get_proc_address() {
    let spy = common::bin("libsimcuda_spy.so");
    let r = scenario("rttest", "basic", &[("LD_PRELOAD", spy.to_str().unwrap())]);
    let dlsyms: Vec<&str> = r
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("spy: dlsym "))
        .collect();
    assert_eq!(dlsyms, ["cuGetProcAddress_v2"], "stderr:\n{}", r.stderr);
    let lookups: Vec<&str> = r
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("spy: gpa "))
        .collect();
    for want in [
        "cuInit 12080 0 -> 0",
        "cuMemAlloc 12080 0 -> 0",
        "cuMemFree 12080 0 -> 0",
        "cuMemAllocAsync 12080 0 -> 0",
        "cuMemAllocAsync 12080 2 -> 0",
        "cuMemFreeAsync 12080 2 -> 0",
        "cuMemAllocFromPoolAsync 12080 2 -> 0",
        "cuStreamDestroy 12080 0 -> 0",
    ] {
        assert!(
            lookups.contains(&want),
            "missing lookup {want:?} in:\n{}",
            r.stderr
        );
    }
    for l in &lookups {
        let name = l.split(' ').next().unwrap();
        assert!(
            !name.contains("_v") && !name.ends_with("_ptsz"),
            "versioned name looked up: {l}"
        );
        assert!(l.ends_with("-> 0"), "failed lookup: {l}");
    }
}

fn system_has_libcuda() -> bool {
    let cached = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .any(|ldconfig| {
            std::process::Command::new(ldconfig)
                .arg("-p")
                .output()
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("libcuda.so.1"))
        });
    cached
        || [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/lib64",
            "/lib/x86_64-linux-gnu",
        ]
        .iter()
        .any(|d| std::path::Path::new(d).join("libcuda.so.1").exists())
}

#[test]
fn unknown_scenario_is_an_error() {
    assert_eq!(run("rttest", &["nope"], &[]).code, Some(2));
}
