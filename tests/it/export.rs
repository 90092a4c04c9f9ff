use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use oomtrace_tests::*;
use serde_json::Value;

fn oomtrace(args: &[&str]) -> Output {
    let dir = scratch("export");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir).args(args);
    output_within(cmd, TIMEOUT)
}

/// `oomtrace export TRACE --format FORMAT -o OUT [extra...]`, which must succeed.
fn export(trace: &Path, format: &str, extra: &[&str]) -> PathBuf {
    let out = trace.with_extension(format!("{format}.out"));
    let mut args = vec![
        "export",
        trace.to_str().unwrap(),
        "--format",
        format,
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = oomtrace(&args);
    assert!(
        o.status.success(),
        "export {format} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn have_python() -> bool {
    std::process::Command::new("python3")
        .arg("-c")
        .arg("import pickle, pickletools")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Loads a memory-viz pickle with Python and checks what the viewer relies on
/// (segments, blocks, device traces), including a replay of the Allocator State History
/// view backwards from the final `segments`: at every event each live block lies inside a
/// segment. Prints a JSON summary. With a second argument `cut` the history may start after
/// blocks were allocated (`--max-entries`): blocks live before the first entry are allowed, as
/// the viewer draws them allocated from the start.
const CHECK_SNAPSHOT: &str = r#"
import json, pickle, pickletools, sys
data = open(sys.argv[1], 'rb').read()
cut = len(sys.argv) > 2 and sys.argv[2] == 'cut'
allowed = {'PROTO', 'FRAME', 'EMPTY_DICT', 'EMPTY_LIST', 'EMPTY_TUPLE', 'MARK', 'SETITEM',
           'SETITEMS', 'APPEND', 'APPENDS', 'LIST', 'DICT', 'TUPLE', 'TUPLE1', 'TUPLE2',
           'TUPLE3', 'BININT', 'BININT1', 'BININT2', 'LONG1', 'NONE', 'NEWTRUE', 'NEWFALSE',
           'BINFLOAT', 'SHORT_BINUNICODE', 'BINUNICODE', 'MEMOIZE', 'BINPUT', 'LONG_BINPUT',
           'BINGET', 'LONG_BINGET', 'STOP'}
for op, arg, _ in pickletools.genops(data):
    assert op.name in allowed, op.name
    if op.name == 'PROTO':
        assert arg <= 4, arg
    if op.name == 'LONG1':
        assert -2**63 <= arg < 2**63, arg
snap = pickle.loads(data)
assert isinstance(snap, dict) and {'segments', 'device_traces'} <= set(snap), list(snap)
traces = snap['device_traces']
assert isinstance(traces, list) and all(isinstance(t, list) for t in traces)
names = set()
actions = {}
def check_frames(frames):
    assert isinstance(frames, list)
    for f in frames:
        assert isinstance(f['filename'], str) and isinstance(f['name'], str), f
        assert isinstance(f['line'], int), f
        names.add(f['name'])
for dev, trace in enumerate(traces):
    for e in trace:
        for k in ('action', 'addr', 'size'):
            assert k in e, e
        assert isinstance(e['stream'], int) and isinstance(e['time_us'], int), e
        if e['action'] == 'oom':
            assert isinstance(e['device_free'], int)
        check_frames(e['frames'])
        actions[e['action']] = actions.get(e['action'], 0) + 1
live_blocks = 0
for seg in snap['segments']:
    assert seg['device'] < len(traces)
    check_frames(seg['frames'])
    at = seg['address']
    for b in seg['blocks']:
        assert b['state'] in ('active_allocated', 'inactive'), b
        assert b['address'] == at, (seg['address'], b)
        check_frames(b['frames'])
        if b['state'] == 'active_allocated':
            live_blocks += b['size']
        at += b['size']
    assert at == seg['address'] + seg['total_size'], 'blocks do not tile the segment'

# Allocator State History, replayed backwards from the final state.
for dev, trace in enumerate(traces):
    segs = []  # [start, end) intervals
    blocks = {}
    for seg in snap['segments']:
        if seg['device'] != dev:
            continue
        segs.append([seg['address'], seg['address'] + seg['total_size']])
        for b in seg['blocks']:
            if b['state'] == 'active_allocated':
                blocks[b['address']] = b['size']
    def inside(a, n):
        return any(s <= a and a + n <= e for s, e in segs)
    def check(i):
        for a, n in blocks.items():
            assert inside(a, n), f'device {dev} event {i}: block {a:#x}+{n} lies in no segment'
    check(len(trace))
    for i in range(len(trace) - 1, -1, -1):
        e = trace[i]
        a, n, act = e['addr'], e['size'], e['action']
        if act == 'alloc':
            assert a in blocks, f'event {i}: alloc of a block that is not live after it'
            del blocks[a]
        elif act == 'free_completed':
            blocks[a] = n
        elif act in ('segment_alloc', 'segment_map'):
            hit = [s for s in segs if s[0] <= a and a + n <= s[1]]
            assert hit, f'event {i}: {act} of a segment that is not live after it'
            s = hit[0]
            segs.remove(s)
            if s[0] < a:
                segs.append([s[0], a])
            if a + n < s[1]:
                segs.append([a + n, s[1]])
        elif act in ('segment_free', 'segment_unmap'):
            segs.append([a, a + n])
        check(i)
    assert cut or not blocks, 'blocks live before the first event'
print(json.dumps({'names': sorted(names), 'actions': actions, 'live_blocks': live_blocks,
                  'devices': len(traces),
                  'ooms': [e for t in traces for e in t if e['action'] == 'oom'],
                  'entries': [[[e['action'], e['addr'], e['size']] for e in t] for t in traces],
                  'oomtrace': snap.get('oomtrace')}))
"#;

fn check_snapshot(pickle: &Path) -> Value {
    check_snapshot_with(pickle, &[])
}

fn check_snapshot_with(pickle: &Path, extra: &[&str]) -> Value {
    // python3 is part of the test setup (`.ci/run` installs it): without it these checks fail
    // rather than pass having checked nothing.
    assert!(
        have_python(),
        "python3 with pickle is needed to load the memory-viz snapshot; .ci/run installs it"
    );
    let o = std::process::Command::new("python3")
        .arg("-c")
        .arg(CHECK_SNAPSHOT)
        .arg(pickle)
        .args(extra)
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "the snapshot breaks a memory_viz rule:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("summary")
}

fn names(summary: &Value) -> Vec<&str> {
    summary["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect()
}

#[test]
fn memory_viz_of_plain_allocations() {
    let t = run_traced("runtime_basic", &[], &[]);
    let out = export(&t.trace, "memory-viz", &[]);
    let s = check_snapshot(&out);
    assert!(names(&s).contains(&"keep_weights"), "{s}");
    assert!(names(&s).contains(&"keep_cache"), "{s}");
    assert_eq!(s["live_blocks"], 28 * MIB, "{s}");
    assert_eq!(s["devices"], 1);
    // 104 allocations (4 kept, 100 temporaries), each a segment and a block.
    assert_eq!(s["actions"]["segment_alloc"], 104, "{s}");
    assert_eq!(s["actions"]["alloc"], 104, "{s}");
    assert_eq!(s["actions"]["free_completed"], 100, "{s}");
    assert_eq!(s["actions"]["segment_free"], 100, "{s}");
}

#[test]
fn memory_viz_keeps_the_most_recent_entries() {
    let t = run_traced("runtime_basic", &[], &[]);
    let full = export(&t.trace, "memory-viz", &[]);
    let all = check_snapshot(&full);
    // 104 allocations and 100 frees: 104 * 2 + 100 * 3 entries, all kept by default.
    let every = all["entries"][0].as_array().unwrap().clone();
    assert_eq!(every.len(), 508);
    assert!(all["oomtrace"].is_null(), "nothing left out, nothing said");

    let dir = scratch("max-entries");
    let out = dir.join("cut.pickle");
    let o = oomtrace(&[
        "export",
        t.trace.to_str().unwrap(),
        "--format",
        "memory-viz",
        "--max-entries",
        "50",
        "-o",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let said: Vec<&str> = err.lines().filter(|l| l.contains("left out")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("most recent 50 entries") && said[0].contains("458 older"),
        "{err}"
    );
    let s = check_snapshot_with(&out, &["cut"]);
    // The same final state, and exactly the last 50 entries of the full history.
    assert_eq!(s["live_blocks"], 28 * MIB, "{s}");
    assert_eq!(
        s["entries"][0].as_array().unwrap()[..],
        every[every.len() - 50..]
    );
    assert_eq!(s["oomtrace"]["max_entries"], 50, "{s}");
    assert_eq!(s["oomtrace"]["dropped_entries"][0], 458, "{s}");

    // 0 keeps all; the flag is memory-viz's only.
    let o = oomtrace(&[
        "export",
        t.trace.to_str().unwrap(),
        "--format",
        "memory-viz",
        "--max-entries",
        "0",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let s = check_snapshot(&out);
    assert_eq!(s["entries"][0].as_array().unwrap().len(), 508);
    assert_one_line_error(
        &oomtrace(&[
            "export",
            t.trace.to_str().unwrap(),
            "--format",
            "json",
            "--max-entries",
            "5",
            "-o",
            out.to_str().unwrap(),
        ]),
        "--max-entries",
    );
}

#[test]
fn memory_viz_of_vmm_mappings() {
    let t = run_traced("vmm_growth", &[], &[]);
    let out = export(&t.trace, "memory-viz", &[]);
    let s = check_snapshot(&out);
    assert_eq!(s["actions"]["segment_map"], 10, "{s}");
    assert_eq!(s["actions"]["segment_unmap"], 4, "{s}");
    assert_eq!(s["live_blocks"], 12 * MIB, "{s}");
    assert!(names(&s).contains(&"grow_segment"), "{s}");
}

/// Loads a memory-viz pickle with the real PyTorch wheel's `torch.cuda._memory_viz` (every
/// text and HTML view it makes), and compares its keys with a snapshot PyTorch itself takes
/// (on the simulated GPU): every top-level key and every `allocator_settings` key of theirs
/// is in ours. Prints our `allocator_settings` as JSON.
const TORCH_READS_SNAPSHOT: &str = r#"
import json, pickle, sys
import torch
from torch.cuda import _memory_viz as mv
snap = pickle.load(open(sys.argv[1], 'rb'))
lines = lambda x: x
assert mv.segsum(snap) and mv.trace(snap)
assert mv.segments(snap, format_flamegraph=lines) and mv.memory(snap, format_flamegraph=lines)
assert mv.trace_plot(snap) and mv.segment_plot(snap)
torch.cuda.memory._record_memory_history(max_entries=100)
x = torch.empty(1 << 20, device='cuda')
theirs = torch.cuda.memory._snapshot()
missing = set(theirs) - set(snap)
assert not missing, f'top-level keys missing: {missing}'
missing = set(theirs['allocator_settings']) - set(snap['allocator_settings'])
assert not missing, f'allocator_settings keys missing: {missing}'
for k, v in theirs['allocator_settings'].items():
    assert type(snap['allocator_settings'][k]) is type(v), (k, v, snap['allocator_settings'][k])
print(json.dumps(snap['allocator_settings']))
"#;

#[test]
fn memory_viz_opens_in_torchs_own_memory_viz() {
    let t = run_traced("vmm_growth", &[], &[]);
    let out = export(&t.trace, "memory-viz", &[]);
    let mut cmd = base_command(super::torch::python());
    cmd.arg("-c")
        .arg(TORCH_READS_SNAPSHOT)
        .arg(&out)
        .env_remove("PYTORCH_CUDA_ALLOC_CONF");
    // PyTorch's cache directory inside a scratch directory: `import torch` would otherwise
    // leave /tmp/torchinductor_<user> behind.
    let dir = scratch("memory-viz-torch");
    super::torch::torch_env(&mut cmd, &dir);
    let o = output_within(cmd, Duration::from_secs(240));
    assert!(
        o.status.success(),
        "torch's _memory_viz cannot read the snapshot:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let settings: Value =
        serde_json::from_str(stdout.lines().last().expect("settings line")).unwrap();
    // The process mapped memory through the VMM API, as expandable segments do.
    assert_eq!(settings["expandable_segments"], true, "{settings}");
    assert!(
        settings["PYTORCH_CUDA_ALLOC_CONF"]
            .as_str()
            .unwrap()
            .contains("unknown"),
        "{settings}"
    );
}

#[test]
fn memory_viz_records_the_oom() {
    let t = run_traced("oom", &[], &[("SIMCUDA_MEMORY", "1GiB")]);
    let out = export(&t.trace, "memory-viz", &[]);
    let s = check_snapshot(&out);
    let ooms = s["ooms"].as_array().unwrap();
    assert_eq!(ooms.len(), 1, "{s}");
    assert_eq!(ooms[0]["size"], 768 * MIB);
    let free = ooms[0]["device_free"].as_u64().unwrap();
    assert!(free > 0 && free < 1 << 30, "device_free {free}");
    let frames: Vec<&str> = ooms[0]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert!(frames.contains(&"too_big"), "{frames:?}");
    assert_eq!(s["live_blocks"], 0);
}

#[test]
fn memory_viz_picks_one_process() {
    let t = run_traced("fork_child", &[], &[]);
    let r = report_json(&t.trace);
    let (_, child) = parent_and_child(&r);
    let child_pid = child["pid"].as_u64().unwrap().to_string();
    let out = export(&t.trace, "memory-viz", &["--pid", &child_pid]);
    let s = check_snapshot(&out);
    assert!(names(&s).contains(&"child_keep"), "{s}");
    assert!(!names(&s).contains(&"parent_keep"), "{s}");
    // Without --pid: the first process, and a line saying so.
    let o = oomtrace(&[
        "export",
        t.trace.to_str().unwrap(),
        "--format",
        "memory-viz",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--pid"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn chrome_trace_has_live_bytes_counters_and_ooms() {
    let t = run_traced("runtime_basic", &[], &[]);
    let out = export(&t.trace, "chrome", &[]);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    let counters: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "cuda:0")
        .collect();
    assert!(counters.len() > 100, "{}", counters.len());
    let max = counters
        .iter()
        .map(|e| e["args"]["live_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    let r = report_json(&t.trace);
    assert_eq!(
        max,
        device(processes(&r)[0], 0)["peak_bytes"].as_u64().unwrap()
    );
    let last = counters.last().unwrap();
    assert_eq!(last["args"]["live_bytes"], 28 * MIB);
    let ts: Vec<f64> = counters.iter().map(|e| e["ts"].as_f64().unwrap()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "time goes forward");
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["name"] == "process_name"));
    // Who holds the memory: a counter per call site, biggest first, named by its line; at the
    // end they add up to the device's live bytes.
    let last_of = |name: &str| {
        events
            .iter()
            .rev()
            .find(|e| e["ph"] == "C" && e["name"] == name)
            .unwrap_or_else(|| panic!("no counter {name}"))["args"]["live_bytes"]
            .as_u64()
            .unwrap()
    };
    let sites: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "C")
        .filter_map(|e| e["name"].as_str())
        .filter(|n| n.starts_with("cuda:0 site "))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(sites.len(), 3, "{sites:?}");
    assert!(
        sites[0].starts_with("cuda:0 site 1: keep_weights (runtime_basic.c:"),
        "{sites:?}"
    );
    assert!(
        sites[1].starts_with("cuda:0 site 2: keep_cache ("),
        "{sites:?}"
    );
    assert!(
        sites[2].starts_with("cuda:0 site 3: temporaries ("),
        "{sites:?}"
    );
    assert_eq!(last_of(sites[0]), 24 * MIB);
    assert_eq!(last_of(sites[1]), 4 * MIB);
    assert_eq!(last_of(sites[2]), 0);
    let held: u64 = sites.iter().map(|s| last_of(s)).sum();
    assert_eq!(held, last_of("cuda:0"));
    let temporaries_peak = events
        .iter()
        .filter(|e| e["name"] == sites[2])
        .map(|e| e["args"]["live_bytes"].as_u64().unwrap())
        .max();
    assert_eq!(temporaries_peak, Some(MIB));
    // Three sites: nothing left over for "other sites".
    assert!(!events.iter().any(|e| e["name"] == "cuda:0 other sites"));

    let t = run_traced("oom", &[], &[("SIMCUDA_MEMORY", "1GiB")]);
    let out = export(&t.trace, "chrome", &[]);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let oom: Vec<&Value> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "i" && e["name"] == "OOM cuda:0")
        .collect();
    assert_eq!(oom.len(), 1);
    assert_eq!(oom[0]["args"]["requested_bytes"], 768 * MIB);
    assert!(oom[0]["args"]["site"].as_str().unwrap().contains("too_big"));
    // Thread-scoped, so Perfetto shows its arguments.
    assert_eq!(oom[0]["s"], "t");
    assert!(oom[0]["tid"].as_u64().unwrap() > 0);
    // The reading the shim takes after the failure (600 MiB of 1 GiB held), not the one from
    // the program's start (the whole GiB free).
    assert_eq!(oom[0]["args"]["device_free_when"], "after the failure");
    let free = oom[0]["args"]["device_free_bytes"].as_u64().unwrap();
    assert!(free > 0 && free <= 424 * MIB, "device_free_bytes {free}");
}

/// More call sites than get counters of their own: the biggest [8] by bytes held, the rest
/// summed as "other sites".
#[test]
fn chrome_trace_sums_the_sites_past_the_top_eight_as_other() {
    let t = run_traced("many_sites", &[], &[]);
    let out = export(&t.trace, "chrome", &[]);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let last: std::collections::BTreeMap<&str, u64> = events
        .iter()
        .filter(|e| e["ph"] == "C")
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["args"]["live_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let sites: Vec<(&str, u64)> = last
        .iter()
        .filter(|(n, _)| n.starts_with("cuda:0 site "))
        .map(|(n, b)| (*n, *b))
        .collect();
    assert_eq!(sites.len(), 8, "{last:?}");
    for (rank, keep) in (1..=8).zip((3..=10).rev()) {
        let name = format!("cuda:0 site {rank}: keep_{keep} (many_sites.c:");
        let (_, bytes) = sites
            .iter()
            .find(|(n, _)| n.starts_with(&name))
            .unwrap_or_else(|| panic!("no counter {name}...: {sites:?}"));
        assert_eq!(*bytes, keep * MIB, "{name}");
    }
    assert_eq!(last["cuda:0 other sites"], 3 * MIB, "{last:?}");
    assert_eq!(last["cuda:0"], 55 * MIB, "{last:?}");
}

/// Folded lines: `frame;frame;... BYTES`.
fn folded(path: &Path) -> Vec<(Vec<String>, u64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let (stack, n) = l.rsplit_once(' ').expect("stack and weight");
            (
                stack.split(';').map(str::to_string).collect(),
                n.parse().expect("a byte count"),
            )
        })
        .collect()
}

/// The bytes of the stacks whose innermost frame is function `leaf` (`leaf (file:line)`).
fn weight_of(lines: &[(Vec<String>, u64)], leaf: &str) -> u64 {
    lines
        .iter()
        .filter(|(s, _)| s.last().is_some_and(|f| f.split(" (").next() == Some(leaf)))
        .map(|(_, n)| n)
        .sum()
}

/// `file:line` of a folded frame `function (file:line)`.
fn line_of(frame: &str) -> Option<(&str, u64)> {
    let inner = frame.rsplit_once(" (")?.1.strip_suffix(')')?;
    let (file, line) = inner.rsplit_once(':')?;
    Some((file, line.parse().ok()?))
}

#[test]
fn folded_stacks_weigh_live_bytes_or_the_peak() {
    let t = run_traced("runtime_basic", &[], &[]);
    let lines = folded(&export(&t.trace, "folded", &[]));
    assert_eq!(weight_of(&lines, "keep_weights"), 24 * MIB, "{lines:?}");
    assert_eq!(weight_of(&lines, "keep_cache"), 4 * MIB, "{lines:?}");
    for (stack, _) in &lines {
        // The kind of memory is the root, the process under it.
        assert_eq!(stack[0], "cuda:0 live at end");
        assert!(stack[1].contains("runtime_basic (pid "), "{stack:?}");
        // Outermost first, start-up frames dropped: `main` comes right after the process.
        assert!(stack[2].starts_with("main (runtime_basic.c:"), "{stack:?}");
        for f in &stack[2..] {
            let (file, line) = line_of(f).unwrap_or_else(|| panic!("{f}: no file:line"));
            assert_eq!(file, "runtime_basic.c", "{stack:?}");
            assert!(line > 0, "{stack:?}");
        }
        assert!(
            !stack
                .iter()
                .any(|f| f.starts_with("_start") || f.starts_with("__libc_start")),
            "{stack:?}"
        );
    }
    // The trace has those start-up frames: the folded text drops them.
    let json = std::fs::read_to_string(export(&t.trace, "json", &[])).unwrap();
    assert!(
        json.contains("\"function\":\"_start\""),
        "no _start frame to drop"
    );

    // Everything freed by the end: what held the device at its peak (600 + 100 MiB).
    let t = run_traced("oom", &[], &[("SIMCUDA_MEMORY", "1GiB")]);
    let lines = folded(&export(&t.trace, "folded", &[]));
    assert_eq!(weight_of(&lines, "hold"), 600 * MIB, "{lines:?}");
    assert_eq!(
        lines.iter().map(|l| l.1).sum::<u64>(),
        700 * MIB,
        "{lines:?}"
    );
    assert!(lines.iter().all(|(s, _)| s[0] == "cuda:0 at peak"));

    // `--at oom`: just before the failure, only `hold`'s 600 MiB (the failed 768 MiB is not
    // held); `--at end`: nothing is live, so nothing is written.
    let at_oom = folded(&export(&t.trace, "folded", &["--at", "oom"]));
    assert_eq!(weight_of(&at_oom, "hold"), 600 * MIB, "{at_oom:?}");
    assert_eq!(at_oom.iter().map(|l| l.1).sum::<u64>(), 600 * MIB);
    assert!(at_oom.iter().all(|(s, _)| s[0] == "cuda:0 at OOM"));
    assert!(folded(&export(&t.trace, "folded", &["--at", "end"])).is_empty());

    // `-o -`: standard output.
    let o = oomtrace(&[
        "export",
        t.trace.to_str().unwrap(),
        "--format",
        "folded",
        "-o",
        "-",
    ]);
    assert!(o.status.success());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(";hold (oom.c:") && l.ends_with(" 629145600")),
        "{stdout}"
    );
}

/// Device memory and pinned host memory are separate roots, never summed under one; `--at
/// peak` weighs a device at its peak even when memory is live at the end; `--at oom` needs
/// an OOM; `--at` is for folded only.
#[test]
fn folded_roots_split_device_and_pinned_memory_and_at_picks_the_moment() {
    let t = run_traced("pinned_host", &[], &[]);
    let lines = folded(&export(&t.trace, "folded", &[]));
    let roots: std::collections::BTreeSet<&str> =
        lines.iter().map(|(s, _)| s[0].as_str()).collect();
    assert_eq!(
        roots.into_iter().collect::<Vec<_>>(),
        ["cuda:0 live at end", "pinned host live at end"],
        "{lines:?}"
    );
    let weight_under = |lines: &[(Vec<String>, u64)], root: &str| -> u64 {
        lines
            .iter()
            .filter(|(s, _)| s[0] == root)
            .map(|l| l.1)
            .sum()
    };
    assert_eq!(weight_under(&lines, "pinned host live at end"), 5 * MIB);
    assert_eq!(weight_under(&lines, "cuda:0 live at end"), MIB);

    // The pinned peak held the 4 MiB temporary too (main's own allocation).
    let peak = folded(&export(&t.trace, "folded", &["--at", "peak"]));
    assert_eq!(
        weight_under(&peak, "pinned host at peak"),
        9 * MIB,
        "{peak:?}"
    );
    assert_eq!(weight_under(&peak, "cuda:0 at peak"), MIB, "{peak:?}");

    let trace = t.trace.to_str().unwrap();
    let out = t.trace.with_extension("folded.out");
    let out = out.to_str().unwrap();
    let o = oomtrace(&[
        "export", trace, "--format", "folded", "--at", "oom", "-o", out,
    ]);
    assert_one_line_error(&o, "no out-of-memory failure");
    let o = oomtrace(&[
        "export", trace, "--format", "chrome", "--at", "peak", "-o", out,
    ]);
    assert_one_line_error(&o, "--at is for --format folded");
}

#[test]
fn json_lines_carry_every_event_with_its_site() {
    let t = run_traced("runtime_basic", &[], &[]);
    let out = export(&t.trace, "json", &[]);
    let text = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines[0]["type"], "trace");
    let mut sites = std::collections::HashMap::new();
    let mut allocs = 0;
    let mut frees = 0;
    for l in &lines {
        match l["type"].as_str().unwrap() {
            "site" => {
                sites.insert(l["site"].as_u64().unwrap(), l["stack"].clone());
            }
            "event" => {
                let site = l["site"].as_u64().unwrap();
                assert!(
                    site == 0 || sites.contains_key(&site),
                    "site defined first: {l}"
                );
                if l["kind"] == "alloc" && l["size"].as_u64() != Some(0) {
                    allocs += 1;
                    if l["size"] == 8 * MIB {
                        let stack = &sites[&site];
                        assert_eq!(stack[0]["function"], "keep_weights", "{stack}");
                    }
                }
                if l["kind"] == "free" && l["size"].is_u64() {
                    frees += 1;
                    assert_eq!(l["size"], MIB);
                }
            }
            _ => {}
        }
    }
    assert_eq!((allocs, frees), (104, 100));
    let end = lines.last().unwrap();
    assert_eq!(end["type"], "process_end");
    assert_eq!(end["devices"][0]["live_bytes"], 28 * MIB);
}

/// Bad input: exactly one line on stderr, starting "oomtrace:", a non-zero exit, no panic.
fn assert_one_line_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("oomtrace: "), "{err}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_input_is_one_line() {
    let dir = scratch("export-bad");
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    assert_one_line_error(
        &oomtrace(&["export", "/nonexistent.oomt", "--format", "json", "-o", o]),
        "cannot open",
    );
    let garbage = dir.join("garbage.oomt");
    std::fs::write(&garbage, b"this is not a trace at all").unwrap();
    let g = garbage.to_str().unwrap();
    for format in ["memory-viz", "chrome", "folded", "json"] {
        assert_one_line_error(
            &oomtrace(&["export", g, "--format", format, "-o", o]),
            "bad magic",
        );
        assert!(!out.exists(), "no output for bad input");
    }
    let traced = run_traced("runtime_basic", &[], &[]);
    let trace = &traced.trace;
    let t = trace.to_str().unwrap();
    let mut bytes = std::fs::read(trace).unwrap();
    let n = bytes.len();
    for b in &mut bytes[n / 2..n / 2 + 64] {
        *b ^= 0x5a;
    }
    let flipped = dir.join("flipped.oomt");
    std::fs::write(&flipped, &bytes).unwrap();
    assert_one_line_error(
        &oomtrace(&[
            "export",
            flipped.to_str().unwrap(),
            "--format",
            "memory-viz",
            "-o",
            o,
        ]),
        "corrupt",
    );
    assert_one_line_error(&oomtrace(&["export", t, "--format", "svg", "-o", o]), "svg");
    assert_one_line_error(
        &oomtrace(&[
            "export",
            t,
            "--format",
            "json",
            "-o",
            "/nonexistent/dir/out",
        ]),
        "cannot write",
    );
    assert_one_line_error(
        &oomtrace(&["export", t, "--format", "memory-viz", "--pid", "1", "-o", o]),
        "no process 1",
    );
    assert!(!out.exists());
}
