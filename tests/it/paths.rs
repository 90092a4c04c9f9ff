use oomtrace_tests::*;

/// Plain run and traced run print the same and exit the same.
fn assert_same_behaviour(name: &str, args: &[&str], env: &[(&str, &str)], traced: &Traced) {
    let plain = run_plain(name, args, env);
    assert_eq!(
        plain.status.code(),
        traced.status.code(),
        "exit code changed"
    );
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        traced.stdout,
        "stdout changed"
    );
}

#[test]
fn runtime_path_one_event_per_allocation_with_call_sites() {
    let t = run_traced("runtime_basic", &[], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert_same_behaviour("runtime_basic", &[], &[], &t);
    let procs = processes(&t.report);
    assert_eq!(procs.len(), 1);
    let d0 = device(procs[0], 0);
    assert_eq!(d0["live_at_exit_bytes"], 28 * MIB);
    assert_eq!(d0["live_at_exit_count"], 4);
    // cudaMalloc reaches cuMemAlloc_v2 through our wrapper: still one event each.
    assert_eq!(d0["allocations"], 3 + 1 + 100);
    assert_eq!(d0["frees"], 100);
    assert_eq!(d0["peak_bytes"], 29 * MIB);
    assert_eq!(procs[0]["lost_events"], 0);
    let live = live_by_function(&t.report);
    let pid = procs[0]["pid"].as_u64().unwrap();
    assert_eq!(
        live.get(&(pid, "keep_weights".into())),
        Some(&(24 * MIB)),
        "{live:?}"
    );
    assert_eq!(
        live.get(&(pid, "keep_cache".into())),
        Some(&(4 * MIB)),
        "{live:?}"
    );
    let weights = findings(&t.report, "live_at_exit")
        .into_iter()
        .find(|f| functions(f).first().map(String::as_str) == Some("keep_weights"))
        .expect("keep_weights finding");
    assert_eq!(weights["api"], "cudaMalloc");
    assert_eq!(weights["count"], 3);
    let top = &weights["stack"][0];
    assert!(
        top["file"].as_str().unwrap().ends_with("runtime_basic.c"),
        "{top}"
    );
    assert!(top["line"].as_u64().unwrap() > 0);
    assert_eq!(top["module"], "runtime_basic");
    // Built without frame pointers: only DWARF unwinding gets through main and libc to the
    // entry point, and keep_weights is the process's first stack (modules are loaded into the
    // unwinder as the first unwind reaches them, one after the other).
    let names = functions(weights);
    assert_eq!(names[1], "main", "{names:?}");
    assert_eq!(
        names.last().map(String::as_str),
        Some("_start"),
        "{names:?}"
    );
    assert!(weights["stack"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["module"] == "libc.so.6"));
}

#[test]
fn static_runtime_extension_loaded_rtld_local_is_seen_through_cu_get_proc_address() {
    let ext = scenario("libext_static.so");
    let t = run_traced("static_ext_main", &[ext.to_str().unwrap()], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert_same_behaviour("static_ext_main", &[ext.to_str().unwrap()], &[], &t);
    let live = live_by_function(&t.report);
    let pid = processes(&t.report)[0]["pid"].as_u64().unwrap();
    assert_eq!(
        live.get(&(pid, "ext_leaky_alloc".into())),
        Some(&(10 * MIB)),
        "{live:?}"
    );
    assert!(!live.keys().any(|(_, f)| f == "ext_scratch"), "{live:?}");
    let f = findings(&t.report, "live_at_exit")[0];
    assert_eq!(f["api"], "cuMemAlloc_v2");
    assert_eq!(f["stack"][0]["module"], "libext_static.so");
    let d0 = device(processes(&t.report)[0], 0);
    assert_eq!(d0["allocations"], 10);
    assert_eq!(d0["frees"], 5);
}

#[test]
fn vmm_growth_counts_physical_memory_while_mapped() {
    let t = run_traced("vmm_growth", &[], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let p = processes(&t.report)[0];
    let d0 = device(p, 0);
    assert_eq!(d0["live_at_exit_bytes"], 12 * MIB, "{d0}");
    assert_eq!(d0["peak_bytes"], 20 * MIB);
    assert_eq!(d0["reserved_va_bytes"], 128 * MIB);
    let live = live_by_function(&t.report);
    let pid = p["pid"].as_u64().unwrap();
    assert_eq!(
        live.get(&(pid, "grow_segment".into())),
        Some(&(12 * MIB)),
        "{live:?}"
    );
    assert_eq!(findings(&t.report, "live_at_exit")[0]["api"], "cuMemCreate");
    assert_eq!(p["steps"], 10, "oomtrace_mark markers");
}

#[test]
fn async_allocations_and_ptsz_twins_keep_their_stream_semantics() {
    let t = run_traced("async_pool", &[], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert_same_behaviour("async_pool", &[], &[], &t);
    let p = processes(&t.report)[0];
    assert_eq!(device(p, 0)["live_at_exit_bytes"], 18 * MIB);
    let mut by_api = std::collections::BTreeMap::<String, u64>::new();
    for f in findings(&t.report, "live_at_exit") {
        *by_api
            .entry(f["api"].as_str().unwrap().to_string())
            .or_default() += f["bytes"].as_u64().unwrap();
    }
    assert_eq!(
        by_api.get("cudaMallocAsync"),
        Some(&(6 * MIB)),
        "{by_api:?}"
    );
    assert_eq!(
        by_api.get("cudaMallocAsync_ptsz"),
        Some(&(5 * MIB)),
        "{by_api:?}"
    );
    assert_eq!(
        by_api.get("cuMemAllocFromPoolAsync_ptsz"),
        Some(&(7 * MIB)),
        "{by_api:?}"
    );
}

#[test]
fn pinned_host_memory_is_reported_apart_from_device_memory() {
    let t = run_traced("pinned_host", &[], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let p = processes(&t.report)[0];
    let host = device(p, -1);
    assert_eq!(host["memory"], "host_pinned");
    assert_eq!(host["live_at_exit_bytes"], 5 * MIB);
    assert_eq!(host["peak_bytes"], 9 * MIB);
    assert_eq!(device(p, 0)["live_at_exit_bytes"], MIB);
    let pid = p["pid"].as_u64().unwrap();
    assert_eq!(
        live_by_function(&t.report).get(&(pid, "keep_pinned".into())),
        Some(&(5 * MIB))
    );
}

#[test]
fn driver_resolver_semantics_are_unchanged_and_every_path_is_recorded() {
    let t = run_traced("driver_resolve", &[], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert_same_behaviour("driver_resolve", &[], &[], &t);
    assert!(
        t.stdout.contains("cuMemAlloc@2000: rc=0 status=0 call=801"),
        "{}",
        t.stdout
    );
    let live = live_by_function(&t.report);
    let pid = processes(&t.report)[0]["pid"].as_u64().unwrap();
    assert_eq!(
        live.get(&(pid, "direct_alloc".into())),
        Some(&MIB),
        "{live:?}"
    );
    assert_eq!(
        live.get(&(pid, "via_gpa_ptsz".into())),
        Some(&(2 * MIB)),
        "{live:?}"
    );
    assert_eq!(
        live.get(&(pid, "via_self_lookup".into())),
        Some(&(3 * MIB)),
        "{live:?}"
    );
    let apis: Vec<&str> = findings(&t.report, "live_at_exit")
        .iter()
        .map(|f| f["api"].as_str().unwrap())
        .collect();
    assert!(apis.contains(&"cuMemAllocAsync_ptsz"), "{apis:?}");
    // The capacity the program saw is in the report.
    assert_eq!(
        device(processes(&t.report)[0], 0)["capacity_bytes"],
        16u64 << 30
    );
}

#[test]
fn dlsym_keeps_caller_relative_lookups() {
    let dir = std::path::Path::new(SCENARIO_BIN);
    let plain = run_plain("dlsym_caller", &[dir.to_str().unwrap()], &[]);
    let t = run_traced("dlsym_caller", &[dir.to_str().unwrap()], &[]);
    assert_eq!(plain.status.code(), Some(0));
    assert_eq!(t.status.code(), Some(0), "{}", t.stderr);
    let expected = String::from_utf8_lossy(&plain.stdout);
    assert!(expected.contains("plugin probe: 42"), "{expected}");
    assert!(
        expected.contains("[wrapped] puts through the wrapper"),
        "{expected}"
    );
    assert_eq!(t.stdout, expected);
}

#[test]
fn oom_is_recorded_with_the_failing_size_and_device_state() {
    let env = [("SIMCUDA_MEMORY", "1GiB")];
    let t = run_traced("oom", &[], &env);
    assert!(t.status.success(), "{}", t.stderr);
    assert_same_behaviour("oom", &[], &env, &t);
    let ooms = findings(&t.report, "oom");
    assert_eq!(ooms.len(), 1, "{:#}", t.report["findings"]);
    let o = ooms[0];
    assert_eq!(o["bytes"], 768 * MIB);
    assert_eq!(o["device"], 0);
    assert_eq!(o["level"], "error");
    assert_eq!(functions(o)[0], "too_big");
    assert_eq!(o["oom"]["total_bytes"], 1u64 << 30);
    assert_eq!(o["oom"]["free_bytes"], (1024 - 600) * MIB);
    assert_eq!(o["oom"]["live_bytes"], 600 * MIB);
    let holder = &o["oom"]["top_sites"][0];
    assert_eq!(holder["bytes"], 600 * MIB);
    assert_eq!(holder["stack"][0]["function"], "hold");
    // OOM findings open the report.
    assert_eq!(t.report["findings"][0]["kind"], "oom");
    assert_eq!(device(processes(&t.report)[0], 0)["failed_allocations"], 1);
}

#[test]
fn runtime_of_an_rtld_local_extension_and_its_constructor_are_traced() {
    let ext = scenario("libext_dyn.so");
    let t = run_traced("dyn_ext_main", &[ext.to_str().unwrap()], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert_same_behaviour("dyn_ext_main", &[ext.to_str().unwrap()], &[], &t);
    let live = live_by_function(&t.report);
    let pid = processes(&t.report)[0]["pid"].as_u64().unwrap();
    // Allocated inside dlopen, by the extension's constructor: lazy start under the loader lock.
    assert_eq!(
        live.get(&(pid, "ctor_alloc".into())),
        Some(&MIB),
        "{live:?}"
    );
    assert_eq!(
        live.get(&(pid, "dyn_ext_alloc".into())),
        Some(&(8 * MIB)),
        "{live:?}"
    );
    assert_eq!(
        live.get(&(pid, "dyn_ext_driver_alloc".into())),
        Some(&(3 * MIB)),
        "{live:?}"
    );
    let apis: std::collections::BTreeSet<&str> = findings(&t.report, "live_at_exit")
        .iter()
        .map(|f| f["api"].as_str().unwrap())
        .collect();
    // The runtime hook recorded the cudaMalloc calls (one event each), the driver hook the
    // function obtained through cudaGetDriverEntryPoint.
    assert_eq!(
        apis,
        ["cuMemAlloc_v2", "cudaMalloc"].into_iter().collect(),
        "{apis:?}"
    );
    assert_eq!(device(processes(&t.report)[0], 0)["allocations"], 6);
}

#[test]
fn each_device_is_reported_on_its_own() {
    let env = [("SIMCUDA_DEVICES", "2")];
    let t = run_traced("multi_device", &[], &env);
    assert!(t.status.success(), "{} {}", t.stdout, t.stderr);
    assert_same_behaviour("multi_device", &[], &env, &t);
    let p = processes(&t.report)[0];
    assert_eq!(device(p, 0)["live_at_exit_bytes"], 2 * MIB);
    assert_eq!(device(p, 1)["live_at_exit_bytes"], 3 * MIB);
    assert_eq!(device(p, 1)["peak_bytes"], 10 * MIB);
    let on1 = findings(&t.report, "live_at_exit")
        .into_iter()
        .find(|f| f["device"] == 1)
        .expect("device 1 finding");
    assert_eq!(functions(on1)[0], "on_device1");
}

#[test]
fn pitched_and_managed_allocations_count_their_real_size() {
    let t = run_traced("pitch_managed", &[], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let p = processes(&t.report)[0];
    assert_eq!(device(p, 0)["live_at_exit_bytes"], 102_400 + 30_720 + MIB);
    let pid = p["pid"].as_u64().unwrap();
    let live = live_by_function(&t.report);
    assert_eq!(
        live.get(&(pid, "keep_pitched".into())),
        Some(&102_400),
        "{live:?}"
    );
    assert_eq!(
        live.get(&(pid, "keep_pitched_driver".into())),
        Some(&30_720),
        "{live:?}"
    );
    assert_eq!(
        live.get(&(pid, "keep_managed".into())),
        Some(&MIB),
        "{live:?}"
    );
    let apis: std::collections::BTreeSet<&str> = findings(&t.report, "live_at_exit")
        .iter()
        .map(|f| f["api"].as_str().unwrap())
        .collect();
    let expected = ["cudaMallocPitch", "cuMemAllocPitch_v2", "cudaMallocManaged"];
    assert_eq!(apis, expected.into_iter().collect(), "{apis:?}");
}

/// The live-at-exit stack of `scenarios/py_ctypes.py` run under `oomtrace run` with `env`.
fn py_ctypes_stack(env: &[(&str, &str)]) -> (Vec<String>, serde_json::Value) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/py_ctypes.py");
    let dir = scratch("py");
    let json = dir.join("r.json");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir)
        .args(["run", "--json"])
        .arg(&json)
        .args(["-o", "py.oomt", "--", "python3"])
        .arg(&script)
        .envs(env.iter().copied());
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "py ok\n");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let live = findings(&r, "live_at_exit");
    assert_eq!(live.len(), 1, "{live:#?}");
    assert_eq!(live[0]["bytes"], 3 * MIB);
    assert_eq!(live[0]["api"], "cuMemAlloc_v2");
    (functions(live[0]), live[0]["stack"].clone())
}

#[test]
fn python_ctypes_allocations_unwind_through_the_interpreter() {
    // Native frames only: DWARF unwinding goes on through libffi and CPython's own frames.
    let (names, _) = py_ctypes_stack(&[("OOMTRACE_PYTHON", "0")]);
    assert_eq!(names[0], "cudaMalloc");
    assert!(names.iter().any(|n| n == "ffi_call"), "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("_PyEval_EvalFrame")),
        "{names:?}"
    );
}

#[test]
fn python_frames_take_over_from_the_native_ones_at_the_interpreter() {
    // With Python frames (the default) the native unwind ends at the first interpreter frame:
    // the extension's frames (libffi, _ctypes), then the Python lines, and none of CPython's.
    let (names, stack) = py_ctypes_stack(&[]);
    assert_eq!(names[0], "cudaMalloc");
    let ffi = names
        .iter()
        .position(|n| n == "ffi_call")
        .expect("ffi_call");
    let py = names
        .iter()
        .position(|n| n == "allocate_activations")
        .expect("the Python function");
    assert!(ffi < py, "{names:?}");
    assert_eq!(
        &names[py..],
        ["allocate_activations", "<listcomp>", "<module>"],
        "{names:?}"
    );
    let interpreter = |m: &str| m.starts_with("libpython") || m.starts_with("python3");
    for f in stack.as_array().unwrap() {
        let module = f["module"].as_str().unwrap_or("");
        assert!(!interpreter(module), "a frame of the interpreter: {f}");
    }
}

#[test]
fn stacks_python_records_the_python_frames_alone() {
    // OOMTRACE_STACKS=python: no native unwinding at all, the Python lines still name it.
    let (names, stack) = py_ctypes_stack(&[("OOMTRACE_STACKS", "python")]);
    assert_eq!(
        names,
        ["allocate_activations", "<listcomp>", "<module>"],
        "{stack:#}"
    );
    assert!(
        stack
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["python"] == true),
        "{stack:#}"
    );
}

#[test]
fn each_caller_reaches_its_own_runtime_when_two_are_loaded() {
    let ext = scenario("libext_rt13.so");
    let args = [ext.to_str().unwrap()];
    let t = run_traced("two_runtimes", &args, &[]);
    assert!(t.status.success(), "{}", t.stderr);
    assert_same_behaviour("two_runtimes", &args, &[], &t);
    assert!(
        t.stdout.contains("saw its failure: error 2"),
        "{}",
        t.stdout
    );
    let live = live_by_function(&t.report);
    let pid = processes(&t.report)[0]["pid"].as_u64().unwrap();
    assert_eq!(
        live.get(&(pid, "main_alloc".into())),
        Some(&MIB),
        "{live:?}"
    );
    assert_eq!(
        live.get(&(pid, "rt13_alloc".into())),
        Some(&(2 * MIB)),
        "{live:?}"
    );
}
