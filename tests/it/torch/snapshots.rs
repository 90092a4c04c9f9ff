//! PyTorch memory snapshots in: real PyTorch (untraced, on the simulated GPU) writes snapshots
//! the documented way (`_record_memory_history`, `_dump_snapshot`, from an out-of-memory
//! observer for the OOM), and `oomtrace report|whatif|view|diff|fit` read them as traces:
//! the leak at its line, the fragmenting loop, the OOM at its line with what was free, a ring
//! buffer that dropped its oldest entries said in one line, Python-only stacks. Every release
//! of the tier (`scripts/torch-tier.sh VERSION`).

use super::*;
use std::ffi::OsStr;

/// Writes `tests/scenarios/torch/snapshot.py`'s snapshot of `kind` into `dir` with `env`.
fn snapshot(kind: &str, dir: &Path, env: &[(&str, &str)]) -> PathBuf {
    let out = dir.join(format!("{kind}.pickle"));
    let what = format!("snapshot.py KIND={kind} {env:?}");
    whatif::run_to_end(&what, || {
        let mut cmd = base_command(python());
        cmd.arg(script("snapshot.py"))
            .current_dir(dir)
            .env("KIND", kind)
            .env("SNAPSHOT", &out)
            .env("STEPS", "30")
            .env_remove("PYTORCH_CUDA_ALLOC_CONF");
        torch_env(&mut cmd, dir);
        for (k, v) in env {
            cmd.env(k, v);
        }
        without_aslr(&mut cmd);
        cmd
    });
    assert!(out.is_file(), "{what}: no snapshot written");
    out
}

/// `oomtrace ARGS` to success: its stdout (and stderr, for the warning line).
fn oomtrace_ok(args: &[&OsStr]) -> (String, String) {
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(args);
    let out = output_within(cmd, TIMEOUT);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "oomtrace {args:?}: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

/// `report --json`: the report, and its one snapshot warning (the snapshot's limits).
fn report_json(path: &Path) -> (Value, String) {
    let (stdout, _) = oomtrace_ok(&[OsStr::new("report"), path.as_os_str(), OsStr::new("--json")]);
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("report --json of a snapshot is not JSON ({e}):\n{stdout}"));
    let limits: Vec<String> = v["trace"]["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(|w| w.as_str())
        .filter(|w| w.contains("a PyTorch memory snapshot"))
        .map(str::to_owned)
        .collect();
    assert_eq!(limits.len(), 1, "one line of limits: {:#}", v["trace"]);
    (v, limits[0].clone())
}

fn findings_of<'a>(v: &'a Value, kind: &str) -> Vec<&'a Value> {
    v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == kind)
        .collect()
}

fn line_of(f: &Value) -> (String, u64) {
    let c = &f["culprit"];
    (
        c["file"]
            .as_str()
            .unwrap_or("")
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_owned(),
        c["line"].as_u64().unwrap_or(0),
    )
}

#[test]
fn a_snapshot_of_a_leak_names_its_line_in_every_command() {
    let dir = scratch("torch-snapshot-leak");
    let snap = snapshot("leak", &dir, &[]);
    let (v, limits) = report_json(&snap);
    assert!(limits.contains("no step markers"), "{limits}");
    assert_eq!(
        v["trace"]["producer"], "oomtrace snapshot reader",
        "{:#}",
        v["trace"]
    );
    let leak_line = torch_script_line("snapshot.py", "LEAK HERE");
    let leaks = findings_of(&v, "leak");
    assert_eq!(leaks.len(), 1, "one leak: {:#}", v["findings"]);
    assert_eq!(line_of(leaks[0]), ("snapshot.py".to_owned(), leak_line));
    // The anatomy has its roles from the Python frames: parameters and optimizer state.
    let anatomy = &v["processes"][0]["devices"][0]["anatomy"];
    // The kept tensors are what the program keeps ("other"), not optimizer state: without
    // step markers the steps found are the anatomy's.
    assert!(
        anatomy["at_peak"]["roles"]["other"].as_u64().unwrap_or(0) >= 20 << 20,
        "{anatomy:#}"
    );
    for role in ["parameter", "optimizer_state"] {
        assert!(
            anatomy["at_peak"]["roles"][role].as_u64().unwrap_or(0) > 0,
            "{role}: {anatomy:#}"
        );
    }

    // whatif replays its own setting to PyTorch's own reserve.
    let w = whatif::whatif(&snap, None);
    assert!(
        whatif::device0(&w)["own_setting_check"].is_null(),
        "the replay of its own setting differs: {w:#}"
    );

    // The view, and a diff against itself.
    let html = dir.join("view.html");
    oomtrace_ok(&[
        OsStr::new("view"),
        snap.as_os_str(),
        OsStr::new("-o"),
        html.as_os_str(),
    ]);
    assert!(std::fs::read_to_string(&html)
        .unwrap()
        .contains("snapshot.py"));
    let (diff, _) = oomtrace_ok(&[OsStr::new("diff"), snap.as_os_str(), snap.as_os_str()]);
    assert!(diff.contains("oomtrace diff"), "{diff}");
    let (fit, _) = oomtrace_ok(&[
        OsStr::new("fit"),
        snap.as_os_str(),
        OsStr::new("--memory"),
        OsStr::new("1GiB"),
        OsStr::new("--json"),
    ]);
    assert!(fit.contains("\"fit\""), "{fit}");
}

#[test]
fn a_snapshot_of_a_fragmenting_loop_is_a_fragmentation_finding() {
    let dir = scratch("torch-snapshot-fragment");
    // A device large enough that PyTorch never frees its cache to retry a cudaMalloc: a
    // snapshot does not record such a retry, so its device size would not be known.
    let snap = snapshot("fragment", &dir, &[("SIMCUDA_MEMORY", "16GiB")]);
    let (v, _) = report_json(&snap);
    let frag = findings_of(&v, "fragmentation");
    assert_eq!(frag.len(), 1, "{:#}", v["findings"]);
    assert!(findings_of(&v, "leak").is_empty(), "{:#}", v["findings"]);
    // Its remedy, replayed: expandable segments reserve less.
    let w = whatif::whatif(&snap, Some("expandable_segments:True"));
    let d = whatif::device0(&w);
    assert!(
        d["peak_reserved_bytes"].as_u64().unwrap()
            < d["recorded_peak_reserved_bytes"].as_u64().unwrap() / 2,
        "{w:#}"
    );
    // The run's own setting replays to the reserve PyTorch held.
    let own = whatif::whatif(&snap, None);
    assert!(
        whatif::device0(&own)["own_setting_check"].is_null(),
        "{own:#}"
    );
}

#[test]
fn a_snapshot_from_the_out_of_memory_observer_names_the_line_and_what_was_free() {
    let dir = scratch("torch-snapshot-oom");
    let snap = snapshot("oom", &dir, &[("SIMCUDA_MEMORY", "256MiB")]);
    let (v, limits) = report_json(&snap);
    assert!(
        limits.contains("free memory at its out-of-memory error"),
        "{limits}"
    );
    let ooms = findings_of(&v, "oom");
    assert_eq!(ooms.len(), 1, "{:#}", v["findings"]);
    assert_eq!(
        line_of(ooms[0]),
        (
            "snapshot.py".to_owned(),
            torch_script_line("snapshot.py", "OOM HERE")
        )
    );
    // whatif: the OOM would still happen under the run's own setting.
    let w = whatif::whatif(&snap, None);
    assert_eq!(
        whatif::device0(&w)["ooms"][0]["would_still_happen"],
        true,
        "{w:#}"
    );
}

#[test]
fn a_ring_buffer_that_dropped_entries_is_said_and_the_leak_still_found() {
    let dir = scratch("torch-snapshot-ring");
    let snap = snapshot(
        "leak",
        &dir,
        &[
            ("MAX_ENTRIES", "2500"),
            ("STACKS", "python"),
            ("STEPS", "60"),
        ],
    );
    let (v, limits) = report_json(&snap);
    assert!(limits.contains("2500 trace entries"), "{limits}");
    assert!(limits.contains("dropped the oldest entries"), "{limits}");
    assert!(
        limits.contains("live before it are shown from its state"),
        "{limits}"
    );
    let leaks = findings_of(&v, "leak");
    assert_eq!(leaks.len(), 1, "{:#}", v["findings"]);
    assert_eq!(
        line_of(leaks[0]),
        (
            "snapshot.py".to_owned(),
            torch_script_line("snapshot.py", "LEAK HERE")
        )
    );
}
