//! Nothing left behind and nothing misleading when a part of the chain fails: a collector
//! that never comes up (or exits at once) costs the program a bounded wait and the shim writes
//! the trace itself; the shim's collector SIGKILLed, the whole chain SIGKILLed (the next start
//! cleans up), a descriptor limit of 3; the demo with `$TMPDIR` on another filesystem; a run
//! whose working directory is removed mid-run. Each test has a `TMPDIR` of its own and checks
//! that it is empty at the end.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use oomtrace_tests::*;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The lines oomtrace printed (its lines start with `oomtrace:`).
fn oomtrace_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("oomtrace")).collect()
}

/// A test's own `TMPDIR` (inside its scratch directory) and working directory.
fn dirs(test: &str) -> (Scratch, PathBuf, PathBuf) {
    let dir = scratch(test);
    let tmp = dir.join("tmp");
    let work = dir.join("work");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::create_dir(&work).unwrap();
    (dir, tmp, work)
}

/// `scenario` under plain `LD_PRELOAD` in `work`, with `TMPDIR=tmp`.
fn preloaded_in(scenario_name: &str, work: &Path, tmp: &Path) -> Command {
    let mut cmd = preloaded(scenario_name, work);
    cmd.env("TMPDIR", tmp);
    cmd
}

/// Waits (bounded) for every process running `collect` with a socket under `tmp` to exit:
/// the shim's detached collectors finish the trace and remove their directory then.
fn wait_for_collectors(tmp: &Path) {
    let tmp = tmp.display().to_string();
    wait_until(
        "the shim's collector exits",
        Duration::from_secs(20),
        || processes_with(&["collect", &tmp]).is_empty(),
    );
}

/// An executable `OOMTRACE_COLLECTOR` stand-in in `dir` running `body`.
fn fake_collector(dir: &Path, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let exe = dir.join("fake-collector.sh");
    std::fs::write(&exe, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

/// The program ran with a collector that never came up (or exited at once): it finished
/// within `bound` and with its own exit code, one line said so, the shim wrote a trace that
/// `report` reads, and nothing is left in `tmp`.
fn assert_traced_without_collector(
    out: &Output,
    took: Duration,
    bound: Duration,
    work: &Path,
    tmp: &Path,
) {
    let err = stderr(out);
    assert!(took < bound, "the program took {took:?}: {err}");
    assert_eq!(out.status.code(), Some(7), "the program's own code: {err}");
    let lines = oomtrace_lines(&err);
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("could not start a collector")
            && lines[0].contains("writing the trace directly to"),
        "{err}"
    );
    let traces = traces_in(work);
    assert_eq!(traces.len(), 1, "{:?}", names_in(work));
    let r = report_json(&traces[0]);
    let p = processes(&r);
    assert_eq!(p.len(), 1, "{r}");
    // At least an allocation and its free (slow_loop's clock runs while its first call
    // waits for the collector: after a long wait it makes only one pair).
    assert!(p[0]["events"].as_u64().unwrap() >= 3, "{}", p[0]);
    assert!(
        p[0]["devices"][0]["allocations"].as_u64().unwrap() >= 1,
        "{}",
        p[0]
    );
    assert_eq!(
        names_in(tmp),
        Vec::<String>::new(),
        "nothing left in TMPDIR"
    );
}

#[test]
fn a_collector_that_never_comes_up_costs_a_bounded_wait_and_the_shim_writes_the_trace() {
    let (dir, tmp, work) = dirs("collector-hangs");
    // A unique sleep length finds what the stand-in started again afterwards.
    let marker = format!("1000.{}", std::process::id());
    let exe = fake_collector(&dir, &format!("sleep {marker} &\nwait"));
    let mut cmd = preloaded_in("slow_loop", &work, &tmp);
    cmd.arg("0.2").env("OOMTRACE_COLLECTOR", &exe);
    let start = Instant::now();
    // Unfixed, the first CUDA call waited for the collector forever: a hang fails here.
    let out = output_within(cmd, Duration::from_secs(30));
    // The bound is 3 s (proto DETACHED_START_WAIT); 5 s of slack for a loaded machine.
    assert_traced_without_collector(&out, start.elapsed(), Duration::from_secs(8), &work, &tmp);
    let left = processes_with(&["sleep", &marker]);
    let left: Vec<u32> = left
        .into_iter()
        .filter(|pid| {
            // A killed process not yet reaped by init is gone all the same.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        })
        .collect();
    assert_eq!(
        left,
        Vec::<u32>::new(),
        "what the collector started was stopped"
    );
}

#[test]
fn a_collector_that_exits_at_once_is_not_waited_for() {
    for (name, body) in [
        ("exit-0", "exit 0"),
        ("exit-3", "echo 'no such thing' >&2; exit 3"),
    ] {
        let (dir, tmp, work) = dirs(&format!("collector-{name}"));
        let exe = fake_collector(&dir, body);
        let mut cmd = preloaded_in("slow_loop", &work, &tmp);
        cmd.arg("0.2").env("OOMTRACE_COLLECTOR", &exe);
        let start = Instant::now();
        let out = output_within(cmd, TIMEOUT);
        assert_traced_without_collector(&out, start.elapsed(), Duration::from_secs(8), &work, &tmp);
        if name == "exit-3" {
            assert!(stderr(&out).contains("no such thing"), "{}", stderr(&out));
        }
    }
}

/// Starts `slow_loop SECS` under plain `LD_PRELOAD` and returns it and its collector's pid,
/// once the program is connected.
fn slow_loop_and_its_collector(work: &Path, tmp: &Path, secs: &str) -> (std::process::Child, u32) {
    let child = preloaded_in("slow_loop", work, tmp)
        .arg(secs)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let tmp_text = tmp.display().to_string();
    let mut collector = Vec::new();
    wait_until(
        "the shim's collector runs and the trace grows",
        TIMEOUT,
        || {
            collector = processes_with(&["collect", "--exit-when-idle", &tmp_text]);
            collector.len() == 1
                && traces_in(work)
                    .iter()
                    .any(|t| std::fs::metadata(t).is_ok_and(|m| m.len() > 4096))
        },
    );
    (child, collector[0])
}

fn sigkill(pid: u32) {
    // SAFETY: a process this test started (directly, or the shim for it), found by its
    // command line; kill has no memory preconditions.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// The state letter of process `pid` (`R`, `S`, `Z`, ...), or None when it is gone: it
/// follows the command name's closing parenthesis in /proc/<pid>/stat.
fn process_state(pid: u32) -> Option<char> {
    task_state(Path::new(&format!("/proc/{pid}")))
}

/// The state letter of the task whose /proc directory is `task`, or None when it is gone.
fn task_state(task: &Path) -> Option<char> {
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// Kills `pid` and waits until it is gone, or a zombie with every thread gone: SIGKILL takes
/// effect as each thread is next scheduled, and a start that looks before then rightly sees it
/// running. Its first thread can be a zombie while another still exits, holding its sockets
/// (the collector's still took connections then: the next start kept its directory, once in
/// CI on 2026-12-05).
fn sigkill_and_wait(pid: u32) {
    sigkill(pid);
    wait_until("the killed process is gone", TIMEOUT, || {
        let dead = |state: char| matches!(state, 'Z' | 'X' | 'x');
        process_state(pid).is_none_or(dead)
            && std::fs::read_dir(format!("/proc/{pid}/task"))
                .ok()
                .is_none_or(|mut tasks| {
                    tasks.all(|t| t.is_ok_and(|t| task_state(&t.path()).is_none_or(dead)))
                })
    });
}

#[test]
fn the_shims_collector_killed_leaves_no_directory() {
    let (_dir, tmp, work) = dirs("collector-killed");
    let (mut program, collector) = slow_loop_and_its_collector(&work, &tmp, "2");
    assert_eq!(names_in(&tmp).len(), 1, "the collector's socket directory");
    sigkill(collector);
    let status = wait_within(&mut program, TIMEOUT, "the program");
    assert_eq!(status.code(), Some(7), "the program's own code");
    // Unfixed, the socket directory of the killed collector stayed for good.
    assert_eq!(
        names_in(&tmp),
        Vec::<String>::new(),
        "nothing left in TMPDIR"
    );
}

/// What `tmp` holds once it equals `expected`, or after 20 s whatever it holds then. Once on
/// CI (2026-12-05, the whole suite running) one more `oomtrace-XXXXXX` was there right after
/// the collectors had gone; it did not happen again in runs alone or under load. Waiting for the
/// directory to settle, not only for the collector processes seen so far, rules out a late
/// removal; a directory that stays still fails, with its owner file in the message.
fn names_once_settled(tmp: &Path, expected: &[String]) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        wait_for_collectors(tmp);
        let now = names_in(tmp);
        if now == expected || Instant::now() >= end {
            return now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each entry of `now` not in `expected`, with its owner file and whether each pid in it is
/// still a process (and in which state), for a failure's message.
fn owners_of_the_rest(tmp: &Path, now: &[String], expected: &[String]) -> String {
    now.iter()
        .filter(|n| !expected.contains(n))
        .map(|n| {
            let owner = std::fs::read_to_string(tmp.join(n).join("owner")).unwrap_or_default();
            let pids: Vec<String> = owner
                .lines()
                .filter_map(|l| l.split(' ').next())
                .map(|pid| match pid.parse().ok().and_then(process_state) {
                    Some(state) => format!("{pid} state {state}"),
                    None => format!("{pid} gone"),
                })
                .collect();
            format!("{n}: [{}] {:?}", pids.join(", "), names_in(&tmp.join(n)))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn the_next_start_removes_what_a_killed_chain_left_and_nothing_else() {
    let (_dir, tmp, work) = dirs("chain-killed");
    // Not ours (no owner file; another name), though alike: never touched.
    let foreign = ["oomtrace-abc123", "oomtrace-42-abc123", "oomtrace-notes"];
    for f in foreign {
        std::fs::create_dir(tmp.join(f)).unwrap();
        std::fs::write(tmp.join(f).join("keep"), b"x").unwrap();
    }
    for next in ["LD_PRELOAD", "run"] {
        let (mut program, collector) = slow_loop_and_its_collector(&work, &tmp, "30");
        // Both killed: neither has a chance to clean up.
        sigkill_and_wait(collector);
        sigkill(program.id());
        let _ = program.wait();
        let left: Vec<String> = names_in(&tmp)
            .into_iter()
            .filter(|n| !foreign.contains(&n.as_str()))
            .collect();
        assert_eq!(
            left.len(),
            1,
            "a killed chain leaves its directory: {left:?}"
        );
        let out = match next {
            "LD_PRELOAD" => {
                let mut cmd = preloaded_in("runtime_basic", &work, &tmp);
                cmd.env("OOMTRACE_OUTPUT", work.join("next.oomt"));
                output_within(cmd, TIMEOUT)
            }
            _ => {
                let mut cmd = base_command(oomtrace_bin());
                cmd.current_dir(&work)
                    .env("TMPDIR", &tmp)
                    .args(["run", "-o", "next.oomt", "--"])
                    .arg(scenario("runtime_basic"));
                output_within(cmd, TIMEOUT)
            }
        };
        assert!(out.status.success(), "{next}: {}", stderr(&out));
        let mut expected: Vec<String> = foreign.iter().map(|s| s.to_string()).collect();
        expected.sort();
        let now = names_once_settled(&tmp, &expected);
        assert_eq!(
            now,
            expected,
            "{next} removed the killed chain's directory, and only it; what the others' owner \
             files say: {}; {next}'s stderr: {}",
            owners_of_the_rest(&tmp, &now, &expected),
            stderr(&out)
        );
        for f in foreign {
            assert_eq!(names_in(&tmp.join(f)), ["keep"]);
        }
        for t in traces_in(&work) {
            std::fs::remove_file(t).unwrap();
        }
    }
}

#[test]
fn a_descriptor_limit_of_three_leaves_nothing() {
    let (_dir, tmp, work) = dirs("fd-limit");
    for limit in ["3", "4", "6"] {
        let mut cmd = preloaded_in("fault_fd_limit", &work, &tmp);
        cmd.arg(limit);
        let out = output_within(cmd, TIMEOUT);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "limit {limit}: {err}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("fd_limit: ok"));
        assert!(
            !oomtrace_lines(&err).is_empty(),
            "limit {limit}: the shim says why: {err}"
        );
        wait_for_collectors(&tmp);
        // Unfixed, the limit of 3 left the socket directory (removing it took a descriptor).
        assert_eq!(names_in(&tmp), Vec::<String>::new(), "limit {limit}: {err}");
    }
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

#[test]
fn the_demo_with_tmpdir_on_another_filesystem_caches_and_leaves_nothing() {
    let (dir, tmp, work) = dirs("demo-exdev");
    let cache = dir.join("cache");
    // A tmpfs on TMPDIR in a private mount namespace: another filesystem than the cache's.
    let mount = format!(
        "mount -t tmpfs -o size=64m oomtrace-test {}",
        shell_quote(&tmp)
    );
    let mut tries = vec![vec!["-m"], vec!["--user", "--map-root-user", "-m"]];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        tries.reverse();
    }
    let usable = tries.into_iter().find(|flags| {
        base_command("unshare")
            .args(flags)
            .args(["sh", "-c", &mount])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !precondition(
        usable.is_some(),
        "`unshare -m` (root) or user namespaces, to mount a tmpfs",
    ) {
        return;
    }
    let demo = format!(
        "{} demo > /dev/null 2> demo.err || {{ cat demo.err >&2; exit 1; }}",
        shell_quote(&oomtrace_bin())
    );
    // Twice: the second run finds the cache. After each, what is in TMPDIR and whether the
    // cache's filesystem differs from TMPDIR's (it must, or the test tests nothing).
    let script = format!(
        "{mount} || exit 1; cd {work} || exit 1; \
         [ \"$(stat -c %d {tmp})\" != \"$(stat -c %d {cache_parent})\" ] || {{ echo same filesystem >&2; exit 1; }}; \
         {demo}; echo first:; ls -A {tmp}; {demo}; echo second:; ls -A {tmp}",
        work = shell_quote(&work),
        tmp = shell_quote(&tmp),
        cache_parent = shell_quote(&dir),
    );
    let mut cmd = base_command("unshare");
    cmd.args(usable.unwrap())
        .args(["sh", "-c", &script])
        .env("XDG_CACHE_HOME", &cache)
        .env("TMPDIR", &tmp);
    let out = output_within(cmd, TIMEOUT);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}{}", stderr(&out));
    // Unfixed, each run left its 1.2 MB private copy in TMPDIR (the rename across
    // filesystems failed) and cached nothing.
    assert_eq!(
        said.trim(),
        "first:\nsecond:",
        "TMPDIR after each demo run: {said}"
    );
    let cached: Vec<PathBuf> = std::fs::read_dir(cache.join("oomtrace"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        cached.len(),
        1,
        "one cache directory, no temporary one: {cached:?}"
    );
    assert!(cached[0].join("train_demo").is_file(), "{cached:?}");
    assert_eq!(traces_in(&work).len(), 1, "{:?}", names_in(&work));
}

#[test]
fn a_run_whose_working_directory_vanishes_reports_and_says_where_the_trace_is() {
    let (dir, tmp, work) = dirs("cwd-gone");
    let ready = dir.join("ready");
    let json = dir.join("report.json");
    let child = base_command(oomtrace_bin())
        .current_dir(&work)
        .env("TMPDIR", &tmp)
        .args(["run", "-o", "t.oomt", "--json"])
        .arg(&json)
        .arg("--")
        .arg(scenario("fault_cwd_gone"))
        .arg(&ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the program is half-way", TIMEOUT, || ready.exists());
    std::fs::remove_dir_all(&work).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(5), "the program's own code: {err}");
    // Unfixed: "no CUDA activity seen ... no trace written".
    assert!(!err.contains("no CUDA activity"), "{err}");
    let saved = tmp.join("t.oomt");
    let gone = work.join("t.oomt");
    assert!(
        err.contains(&format!("the trace {} is gone (its directory {} was removed during the run); saved it to {} instead", gone.display(), work.display(), saved.display())),
        "{err}"
    );
    assert!(
        err.contains(&format!("trace written to {}", saved.display())),
        "{err}"
    );
    // The report is of what was traced: 300 allocations and their frees.
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let p = processes(&r);
    assert_eq!(p.len(), 1, "{r}");
    assert!(p[0]["events"].as_u64().unwrap() >= 600, "{}", p[0]);
    let again = report_json(&saved);
    assert_eq!(processes(&again)[0]["events"], p[0]["events"]);
    std::fs::remove_file(&saved).unwrap();
    assert_eq!(
        names_in(&tmp),
        Vec::<String>::new(),
        "nothing else left in TMPDIR"
    );
}
