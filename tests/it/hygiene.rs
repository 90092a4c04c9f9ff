//! Nothing left behind and every mistake named: a SIGKILLed `run`, every failure path of
//! `run`, programs that never use CUDA, old cache directories, the test suite's own scratch
//! directories; missing arguments, bad sizes, allocation errors, finding the library.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use oomtrace_tests::*;

fn oomtrace_in(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(dir).args(args);
    output_within(cmd, TIMEOUT)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_sigkilled_run_leaves_no_collector_no_directory_and_a_finished_trace() {
    let dir = scratch("run-sigkill");
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let trace = dir.join("t.oomt");
    // A marker argument finds the traced program again once `run` is gone.
    let marker = format!("{}", std::process::id() as f64 + 0.5);
    let mut run = base_command(oomtrace_bin())
        .current_dir(&dir)
        .env("TMPDIR", &tmp)
        .args(["run", "-o", "t.oomt", "--"])
        .arg(scenario("slow_loop"))
        .arg(&marker)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run_pid = run.id().to_string();
    wait_until("the program connected", TIMEOUT, || {
        std::fs::metadata(&trace).is_ok_and(|m| m.len() > 4096)
    });
    let collectors = processes_with(&["collect", "--parent-pid", &run_pid]);
    assert_eq!(collectors.len(), 1, "one collector for run {run_pid}");
    run.kill().unwrap();
    run.wait().unwrap();
    let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
    wait_until(
        "the collector of a killed run exits",
        Duration::from_secs(10),
        || !alive(collectors[0]),
    );
    assert_eq!(
        names_in(&tmp),
        Vec::<String>::new(),
        "the private socket directory is removed"
    );
    let r = report_json(&trace);
    assert_eq!(r["trace"]["complete"], true, "{}", r["trace"]);
    let p = processes(&r)[0];
    assert_eq!(p["status"], "running when the trace ended", "{p}");
    assert!(p["events"].as_u64().unwrap() > 0, "{p}");
    // The program itself runs on, untraced; it is ended here so the test leaves nothing.
    for pid in processes_with(&["slow_loop", &marker]) {
        // SAFETY: a process this test started (through run), found by its unique argument.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}

#[test]
fn every_failure_of_run_removes_its_private_directory() {
    let dir = scratch("run-failures");
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let run = |args: &[&str], shell_prefix: Option<&str>| {
        let mut cmd = match shell_prefix {
            None => {
                let mut c = base_command(oomtrace_bin());
                c.args(args);
                c
            }
            Some(prefix) => {
                let mut c = base_command("sh");
                let line = format!("{prefix}; exec \"$0\" \"$@\"");
                c.arg("-c").arg(line).arg(oomtrace_bin()).args(args);
                c
            }
        };
        cmd.current_dir(&dir).env("TMPDIR", &tmp);
        output_within(cmd, TIMEOUT)
    };
    let slow = scenario("slow_loop");
    let slow = slow.to_str().unwrap();

    // An output nobody can write: refused before the program runs, no socket left.
    let out = run(
        &["run", "-o", "missing/dir/t.oomt", "--", slow, "0.1"],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("missing/dir/t.oomt"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert_eq!(names_in(&tmp), Vec::<String>::new());

    // A program that does not exist: 127, nothing left.
    let out = run(&["run", "-o", "t.oomt", "--", "/nonexistent/program"], None);
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    assert_eq!(names_in(&tmp), Vec::<String>::new());
    assert!(
        !dir.join("t.oomt").exists(),
        "no trace of a program that never ran"
    );

    // Too few file descriptors for the collector and the program: whatever fails, nothing
    // is left.
    for limit in [6, 9, 12] {
        let out = run(
            &["run", "-o", "fd.oomt", "--", slow, "0.1"],
            Some(&format!("ulimit -n {limit}")),
        );
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
        assert_eq!(names_in(&tmp), Vec::<String>::new(), "ulimit -n {limit}");
    }
    let _ = std::fs::remove_file(dir.join("fd.oomt"));
    assert!(
        processes_with(&["collect", "--socket", tmp.to_str().unwrap()]).is_empty(),
        "no collector left running"
    );
}

#[test]
fn a_program_that_never_uses_cuda_leaves_no_trace() {
    let dir = scratch("no-cuda");
    let out = oomtrace_in(&dir, &["run", "--json", "r.json", "--", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no CUDA activity seen in `true`"),
        "{}",
        stderr(&out)
    );
    assert_eq!(names_in(&dir), vec!["r.json".to_string()], "no trace");
    // The report asked for says the same to a script: no processes, and why.
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("r.json")).unwrap()).unwrap();
    assert_eq!(r["processes"], serde_json::json!([]), "{r:#}");
    assert!(r["trace"]["warnings"][0]
        .as_str()
        .unwrap()
        .contains("no CUDA activity seen"));
    std::fs::remove_file(dir.join("r.json")).unwrap();
    // The exit code is still the program's.
    let out = oomtrace_in(&dir, &["run", "--", "false"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(names_in(&dir), Vec::<String>::new());
    // A program killed by a signal may have allocated a moment before it died: "no CUDA
    // activity seen" would be wrong, so the line says how it ended.
    let out = oomtrace_in(&dir, &["run", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(128 + 9), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.contains("no CUDA activity seen"), "{err}");
    assert!(
        err.contains("`sh` was killed by signal 9 before any CUDA activity reached the collector"),
        "{err}"
    );
    assert_eq!(names_in(&dir), Vec::<String>::new());
}

#[test]
fn a_failed_allocation_names_its_error_and_no_device_is_not_pinned_memory() {
    // No device visible: cudaMalloc fails with cudaErrorNoDevice (the program exits at once).
    let t = run_traced("slow_loop", &["0.1"], &[("SIMCUDA_DEVICES", "0")]);
    let p = processes(&t.report)[0];
    let failed = p["failed_allocations"]
        .as_array()
        .expect("failed_allocations");
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!(failed[0]["api"], "cudaMalloc");
    assert_eq!(failed[0]["error_code"], 100);
    assert_eq!(failed[0]["error"], "cudaErrorNoDevice");
    assert_eq!(failed[0]["device"], -1);
    assert_eq!(failed[0]["last_size"], MIB);
    assert!(
        p["devices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["memory"] != "host_pinned"),
        "{p:#}"
    );
    assert!(
        t.stderr
            .contains("1 failed cudaMalloc: cudaErrorNoDevice (error 100"),
        "{}",
        t.stderr
    );
    assert!(!t.stderr.contains("host (pinned)"), "{}", t.stderr);
}

/// Bad input: exactly one line on stderr, starting "oomtrace:", exit 2, no panic.
fn assert_one_line_error(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("oomtrace: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "{err:?} should mention {n:?}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn missing_arguments_and_bad_sizes_are_named() {
    let dir = scratch("cli-named");
    assert_one_line_error(&oomtrace_in(&dir, &["export"]), &["<FILE>", "--format"]);
    assert_one_line_error(&oomtrace_in(&dir, &["collect"]), &["--socket"]);
    assert_one_line_error(&oomtrace_in(&dir, &["run"]), &["no command to trace", "--"]);
    assert_one_line_error(&oomtrace_in(&dir, &["run", "--"]), &["no command to trace"]);
    // One rule for every flag that names a device's memory: 1 MiB to 1 TiB, said alike.
    for (size, says) in [
        ("banana", "not a size"),
        ("0", "out of range: a device's memory is 1MiB to 1TiB"),
        ("16", "out of range: a device's memory is 1MiB to 1TiB"),
        ("10TiB", "out of range: a device's memory is 1MiB to 1TiB"),
    ] {
        for args in [
            &["demo", "--device-memory", size][..],
            &["run", "--simulate", size, "--", "true"],
            &["fit", "t.oomt", "--memory", size],
        ] {
            assert_one_line_error(&oomtrace_in(&dir, args), &[size, says]);
        }
    }
    assert_eq!(
        names_in(&dir),
        Vec::<String>::new(),
        "a refused demo writes nothing"
    );
}

/// The demo takes any device size the other flags take: on one too small for its story it
/// stops at the out-of-memory error, which its report shows, and exits 0.
#[test]
fn the_demo_on_a_small_device_ends_in_the_out_of_memory_it_reports() {
    let dir = scratch("demo-small");
    let out = oomtrace_in(&dir, &["demo", "--device-memory", "256MiB", "-o", "d.oomt"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.contains("Out of memory (1)"), "{text}");
    assert!(text.contains("cudaMalloc of 512.00 MiB failed"), "{text}");
    assert!(
        text.contains("too small for the rest of the demo"),
        "{text}"
    );
}

#[test]
fn lib_prints_the_library_for_ld_preload() {
    let dir = scratch("lib");
    let out = oomtrace_in(&dir, &["lib"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let path = String::from_utf8(out.stdout).unwrap();
    let path = Path::new(path.trim_end());
    assert!(path.is_absolute() && path.is_file(), "{path:?}");
    assert!(path.ends_with("liboomtrace.so"), "{path:?}");
    // It is a library that works: preloaded into a program, it traces it.
    let mut cmd = base_command(scenario("runtime_basic"));
    cmd.current_dir(&dir)
        .env("LD_PRELOAD", path)
        .env("OOMTRACE_COLLECTOR", oomtrace_bin());
    let ran = output_within(cmd, TIMEOUT);
    assert!(ran.status.success(), "{}", stderr(&ran));
    assert_eq!(traces_in(&dir).len(), 1);
    // The alias answers the same.
    let alias = oomtrace_in(&dir, &["lib-path"]);
    assert_eq!(
        String::from_utf8_lossy(&alias.stdout).trim_end(),
        path.to_str().unwrap()
    );
    // OOMTRACE_LIB names another file: that one; a missing one: one line.
    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("lib")
        .env("OOMTRACE_LIB", "/nonexistent/liboomtrace.so");
    assert_one_line_error(
        &output_within(cmd, TIMEOUT),
        &["/nonexistent/liboomtrace.so"],
    );
}

/// `oomtrace lib --simulate SIZE`: one line of `NAME=VALUE` for `env $(...) program`, a plain
/// `LD_PRELOAD` run on the simulated GPU the binary carries; the program runs there (its
/// device has SIZE) and the trace says it was simulated.
#[test]
fn lib_simulate_prints_the_environment_of_a_preloaded_run_on_the_simulated_gpu() {
    let dir = scratch("lib-simulate");
    let out = oomtrace_in(&dir, &["lib", "--simulate", "1GiB"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = String::from_utf8(out.stdout).unwrap();
    assert_eq!(line.lines().count(), 1, "{line}");
    let env: Vec<(&str, &str)> = line
        .split_whitespace()
        .map(|pair| pair.split_once('=').expect("NAME=VALUE"))
        .collect();
    let names: Vec<&str> = env.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        &names[..3],
        ["LD_PRELOAD", "LD_LIBRARY_PATH", "SIMCUDA_MEMORY"],
        "{line}"
    );
    assert_eq!(env[2].1, (1u64 << 30).to_string());
    assert!(env[0].1.ends_with("liboomtrace.so"), "{line}");
    let mut cmd = base_command(scenario("runtime_basic"));
    cmd.current_dir(&dir)
        .env("OOMTRACE_COLLECTOR", oomtrace_bin());
    for (name, value) in &env {
        cmd.env(name, value);
    }
    let ran = output_within(cmd, TIMEOUT);
    assert!(ran.status.success(), "{}", stderr(&ran));
    let traces = traces_in(&dir);
    assert_eq!(traces.len(), 1, "{traces:?}");
    let report = report_json(&traces[0]);
    assert_eq!(
        report["trace"]["simulated"]["device_memory_bytes"].as_u64(),
        Some(1 << 30),
        "{}",
        report["trace"]
    );
    // A size out of the one range: one line, nothing printed for `env`.
    let bad = oomtrace_in(&dir, &["lib", "--simulate", "16"]);
    assert_one_line_error(&bad, &["16", "out of range"]);
    assert!(bad.stdout.is_empty());
}

#[test]
fn a_new_build_removes_the_cache_directories_of_older_ones() {
    let dir = scratch("cache");
    let cache = dir.join("cache");
    let old = cache.join("oomtrace/0.0.1-python-0123456789abcdef");
    let other = cache.join("oomtrace/0.0.1-demo-0123456789abcdef");
    let mine = cache.join("oomtrace/notes.txt");
    let busy = cache.join("oomtrace/0.0.2-python-0123456789abcdef");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(&mine, b"not oomtrace's").unwrap();
    // Unused for two hours; `busy` was used just now (another build running beside this one:
    // it must keep its files).
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
    for d in [&old, &other] {
        std::fs::File::open(d)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
    }
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir)
        .env("XDG_CACHE_HOME", &cache)
        .args(["run", "--torch", "--", "true"]);
    let out = output_within(cmd, TIMEOUT);
    assert!(out.status.success(), "{}", stderr(&out));
    let left = names_in(&cache.join("oomtrace"));
    assert!(
        !left.contains(&"0.0.1-python-0123456789abcdef".to_string()),
        "{left:?}"
    );
    assert!(
        left.contains(&"0.0.1-demo-0123456789abcdef".to_string()),
        "{left:?}"
    );
    assert!(left.contains(&"notes.txt".to_string()), "{left:?}");
    assert!(
        left.contains(&"0.0.2-python-0123456789abcdef".to_string()),
        "a build in use keeps its files: {left:?}"
    );
    assert_eq!(
        left.iter().filter(|n| n.contains("-python-")).count(),
        2,
        "{left:?}"
    );
}

#[test]
fn scratch_directories_are_removed_also_when_a_test_fails() {
    let mut kept = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let dir = scratch("failing");
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/file"), b"x").unwrap();
        kept = Some(dir.to_path_buf());
        panic!("a failing test");
    }));
    assert!(result.is_err());
    let kept = kept.unwrap();
    assert!(!kept.exists(), "{kept:?} left behind");
}

#[test]
fn a_json_report_that_cannot_be_written_is_one_line_and_keeps_the_programs_code() {
    let dir = scratch("json-unwritable");
    let slow = scenario("slow_loop");
    let out = oomtrace_in(
        &dir,
        &[
            "run",
            "-o",
            "t.oomt",
            "--json",
            "missing/dir/r.json",
            "--",
            slow.to_str().unwrap(),
            "0.1",
        ],
    );
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let said: Vec<String> = stderr(&out)
        .lines()
        .filter(|l| l.contains("missing/dir/r.json"))
        .map(String::from)
        .collect();
    assert_eq!(said.len(), 1, "{}", stderr(&out));
    assert!(said[0].starts_with("oomtrace: cannot write"), "{said:?}");
    assert!(dir.join("t.oomt").is_file(), "the trace itself is written");
}

#[test]
fn a_collector_stopped_the_moment_it_listens_leaves_nothing() {
    // `run` starts the program once the collector listens and stops the collector when the
    // program exits: with `true` that is a millisecond later. A SIGTERM before the collector
    // had its handler killed it with the trace's temporary file still there (CI, once).
    let dir = scratch("collect-stopped-at-once");
    let socket = dir.join("s.sock");
    for round in 0..30 {
        let mut collector = base_command(oomtrace_bin())
            .current_dir(&dir)
            .args(["collect", "--quiet", "--socket"])
            .arg(&socket)
            .args(["-o", "t.oomt"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Polled without sleeping: the signal lands as close to the bind as a test can get.
        let start = std::time::Instant::now();
        while !socket.exists() && start.elapsed() < TIMEOUT {
            std::hint::spin_loop();
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(collector.id() as i32, libc::SIGTERM) };
        let status = collector.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut collector.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(0), "round {round}: {status} {err}");
        assert_eq!(names_in(&dir), Vec::<String>::new(), "round {round}");
    }
}
