//! The simulated driver, libcuda.so.1, through tests/c/drvtest.c.

mod common;
use common::{run, scenario};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

#[test]
fn init_and_device_queries() {
    let r = scenario(
        "drvtest",
        "init",
        &[("SIMCUDA_DEVICES", "3"), ("SIMCUDA_MEMORY", "1G")],
    );
    assert_eq!(r.u64("devices"), 3);
    for d in 0..3 {
        assert_eq!(r.u64(&format!("total{d}")), GIB);
    }
    assert!(r.stderr.is_empty(), "unexpected stderr: {}", r.stderr);
}

#[test]
fn defaults() {
    let r = scenario("drvtest", "init", &[]);
    assert_eq!(r.u64("devices"), 1);
    assert_eq!(r.u64("total0"), 16 * GIB);
}

#[test]
fn memory_sizes_accept_suffixes() {
    for (text, bytes) in [
        ("1048576", MIB),
        ("512k", 512 << 10),
        ("512KiB", 512 << 10),
        ("3M", 3 * MIB),
        ("3mib", 3 * MIB),
        ("2G", 2 * GIB),
        ("2GiB", 2 * GIB),
        ("1T", 1 << 40),
        ("1TiB", 1 << 40),
    ] {
        let r = scenario("drvtest", "init", &[("SIMCUDA_MEMORY", text)]);
        assert_eq!(r.u64("total0"), bytes, "SIMCUDA_MEMORY={text}");
    }
}

#[test]
fn bad_environment_falls_back_with_one_line() {
    for (var, value) in [
        ("SIMCUDA_MEMORY", "12XB"),
        ("SIMCUDA_MEMORY", ""),
        ("SIMCUDA_MEMORY", "0"),
        ("SIMCUDA_MEMORY", "-5"),
        ("SIMCUDA_MEMORY", "2T"), /* above the 1 TiB limit */
        ("SIMCUDA_MEMORY", "99999999999999999999"),
        ("SIMCUDA_DEVICES", "9"),
        ("SIMCUDA_DEVICES", "2k"),
        ("SIMCUDA_CONTEXT_BYTES", "lots"),
        ("SIMCUDA_HOST_MEMORY", "1.5G"),
    ] {
        let r = scenario("drvtest", "init", &[(var, value)]);
        assert_eq!(
            r.stderr,
            format!("simcuda: bad {var}={value}; using default\n")
        );
        assert_eq!(r.u64("devices"), 1);
        assert_eq!(r.u64("total0"), 16 * GIB);
    }
}

#[test]
fn no_device() {
    scenario("drvtest", "nodevice", &[("SIMCUDA_DEVICES", "0")]);
}

#[test]
fn error_names_and_strings() {
    scenario("drvtest", "errors", &[]);
}

#[test]
fn oom_exactly_at_capacity() {
    for (mem, ctx, ctx_bytes) in [
        ("3M", "0", 0),
        ("3M", "65536", 65536),
        ("1G", "300M", 300 * MIB),
        ("4097K", "1K", 1024),
    ] {
        let env = [("SIMCUDA_MEMORY", mem), ("SIMCUDA_CONTEXT_BYTES", ctx)];
        let r = scenario("drvtest", "oom", &env);
        assert_eq!(r.u64("free"), r.u64("total") - ctx_bytes, "{env:?}");
    }
}

#[test]
fn context_bytes_beyond_capacity() {
    scenario(
        "drvtest",
        "ctxoom",
        &[("SIMCUDA_MEMORY", "1M"), ("SIMCUDA_CONTEXT_BYTES", "2M")],
    );
}

#[test]
fn addresses_are_reused_after_free() {
    let r = scenario("drvtest", "reuse", &[("SIMCUDA_DEVICES", "2")]);
    let first = r.u64("first");
    let dev1 = r.u64("dev1");
    assert_ne!(first, dev1);
    assert!(dev1 > first, "each device has its own range");
}

#[test]
fn pitch() {
    scenario("drvtest", "pitch", &[]);
}

#[test]
fn managed_memory_is_host_accessible_and_charged() {
    scenario("drvtest", "managed", &[]);
}

#[test]
fn pinned_host_memory_limit() {
    scenario("drvtest", "host", &[("SIMCUDA_HOST_MEMORY", "64K")]);
}

#[test]
fn get_proc_address_versions_flags_and_internal_pointers() {
    scenario("drvtest", "gpa", &[]);
}

#[test]
fn contexts() {
    let r = scenario("drvtest", "ctx", &[("SIMCUDA_CONTEXT_BYTES", "1M")]);
    assert_eq!(r.u64("context_cost"), MIB);
    scenario("drvtest", "ctx", &[]);
}

#[test]
fn legacy_exports() {
    scenario("drvtest", "legacy", &[]);
}

#[test]
fn stream_ordered_pools() {
    scenario("drvtest", "pool", &[]);
}

#[test]
fn pool_reserve_competes_with_cumemalloc() {
    scenario("drvtest", "poolfull", &[("SIMCUDA_MEMORY", "8MiB")]);
}

#[test]
fn virtual_memory_management() {
    let r = scenario("drvtest", "vmm", &[("SIMCUDA_MEMORY", "64M")]);
    assert_ne!(r.u64("handle"), 0);
}

#[test]
fn device_memory_is_host_memory_and_unmapped_vmm_faults() {
    scenario("drvtest", "fault", &[]);
}

#[test]
fn concurrent_threads() {
    scenario("drvtest", "threads", &[]);
}

/// Stream capture: the capture-mode rules on the memory calls (GLOBAL
/// captures restrict every thread not RELAXED, THREAD_LOCAL ones only their
/// own thread), invalidation by a prohibited call, stream-ordered allocation
/// on the capturing stream, and the 10.0 / 10.1 ABIs through cuGetProcAddress.
#[test]
fn stream_capture_prohibits_unsafe_allocation() {
    scenario("drvtest", "capture", &[]);
}

/// Thread-block clusters are counted per GPC of the simulated H100 (cuBLASLt 12 learns the GPC
/// split from these answers and refuses a handle on an impossible one), sizes past 8 need the
/// kernel's non-portable attribute, and the CUDA 12.5 limits answer (cuBLASLt 12.8 asks
/// whether the context is CUDA-in-graphics).
#[test]
fn cluster_occupancy_and_context_limits() {
    let r = scenario("drvtest", "occupancy", &[]);
    assert_eq!(r.u64("clusters_1"), 132);
    assert_eq!(r.u64("clusters_2"), 66);
    assert_eq!(r.u64("gpcs"), 8);
}

#[test]
fn header_maps_unversioned_names_to_current_abi() {
    let r = scenario("macros", "", &[]);
    assert_eq!(r.value("ptds"), Some("0"));
    let r = scenario("macros_ptds", "", &[]);
    assert_eq!(
        r.value("ptds"),
        Some("1"),
        "CUDA_API_PER_THREAD_DEFAULT_STREAM selects the _ptsz exports"
    );
}

#[test]
fn unknown_scenario_is_an_error() {
    assert_eq!(run("drvtest", &["nope"], &[]).code, Some(2));
}
