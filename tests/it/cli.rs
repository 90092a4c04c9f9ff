use oomtrace_tests::*;

fn oomtrace(args: &[&str]) -> std::process::Output {
    let dir = scratch("cli");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir).args(args);
    output_within(cmd, TIMEOUT)
}

/// Bad input: exactly one line on stderr, starting "oomtrace:", a non-zero exit, no panic.
pub(crate) fn assert_one_line_error(out: &std::process::Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("oomtrace: "), "{err}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The bytes of a good trace (its directory is gone once read).
fn good_trace() -> Vec<u8> {
    std::fs::read(run_traced("runtime_basic", &[], &[]).trace).unwrap()
}

#[test]
fn corrupt_and_foreign_files_give_one_clear_line() {
    let dir = scratch("corrupt");
    let garbage = dir.join("garbage.oomt");
    std::fs::write(&garbage, b"this is not a trace at all").unwrap();
    assert_one_line_error(
        &oomtrace(&["report", garbage.to_str().unwrap()]),
        "bad magic",
    );

    let mut bytes = good_trace();
    bytes[8] = 99; // format version
    let future = dir.join("future.oomt");
    std::fs::write(&future, &bytes).unwrap();
    assert_one_line_error(
        &oomtrace(&["report", future.to_str().unwrap()]),
        "version 99",
    );

    let mut bytes = good_trace();
    let n = bytes.len();
    for b in &mut bytes[n / 2..n / 2 + 64] {
        *b ^= 0x5a;
    }
    let flipped = dir.join("flipped.oomt");
    std::fs::write(&flipped, &bytes).unwrap();
    assert_one_line_error(
        &oomtrace(&["report", "--json", flipped.to_str().unwrap()]),
        "corrupt",
    );

    assert_one_line_error(&oomtrace(&["report", "/nonexistent.oomt"]), "cannot open");
}

#[test]
fn truncated_traces_report_what_was_written() {
    let bytes = good_trace();
    let dir = scratch("truncated");
    // Cut inside the last records (the end marker and the connection close).
    let cut = dir.join("cut.oomt");
    std::fs::write(&cut, &bytes[..bytes.len() - 7]).unwrap();
    let out = oomtrace(&["report", cut.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("keep_weights"));
    let r = report_json(&cut);
    assert_eq!(r["trace"]["truncated"], true);
    assert_eq!(device(processes(&r)[0], 0)["live_at_exit_bytes"], 28 * MIB);
}

#[test]
fn bad_flags_and_missing_programs_are_one_line() {
    assert_one_line_error(&oomtrace(&["report", "--bogus", "x"]), "--bogus");
    assert_one_line_error(&oomtrace(&["frobnicate"]), "frobnicate");
    let dir = scratch("no-program");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir)
        .args(["run", "--", "/nonexistent/program"]);
    let out = output_within(cmd, TIMEOUT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot run"), "{err}");
    assert!(
        traces_in(&dir).is_empty(),
        "a program that never ran leaves no trace"
    );
}

#[test]
fn json_report_has_the_documented_fields() {
    let t = run_traced("runtime_basic", &[], &[]);
    let r = report_json(&t.trace);
    assert_eq!(r["version"], 1);
    let p = processes(&r)[0];
    for k in ["pid", "command", "devices"] {
        assert!(!p[k].is_null(), "process.{k}");
    }
    let d = device(p, 0);
    for k in [
        "device",
        "peak_bytes",
        "live_at_exit_bytes",
        "events",
        "lost_events",
    ] {
        assert!(d[k].is_number(), "device.{k}");
    }
    let f = findings(&r, "live_at_exit")[0];
    for k in [
        "kind",
        "level",
        "pid",
        "device",
        "bytes",
        "growth_bytes_per_step",
        "steps",
        "stack",
    ] {
        assert!(f.get(k).is_some(), "finding.{k}");
    }
    for k in ["function", "file", "line", "module"] {
        assert!(f["stack"][0].get(k).is_some(), "frame.{k}");
    }
    assert!(p["command"].as_str().unwrap().contains("runtime_basic"));
}

/// The newcomer's first command tells the demo's story: the planted leak found live and
/// confirmed at its line, and the OOM it causes blamed on it.
#[test]
fn the_demo_finds_its_planted_leak_and_blames_the_oom_on_it() {
    let dir = scratch("demo");
    let trace = dir.join("demo.oomt");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir)
        .arg("demo")
        .arg("--output")
        .arg(&trace);
    let out = output_within(cmd, TIMEOUT);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("[confirmed leak]") && l.contains("keep_history")),
        "{text}"
    );
    // Each step sleeps 60 ms, so the leak (16 MiB a step) grows at most ~267 MiB/s, and the
    // 3 GiB left fill in seconds, not milliseconds (a loop with no pause read "5.67 TiB/s" and
    // "full in 1 ms").
    for l in text.lines() {
        assert!(!l.contains("TiB/s") && !l.contains("GiB/s"), "{l}");
        let full_in_ms = l
            .split("full in ")
            .nth(1)
            .is_some_and(|t| t.split_whitespace().nth(1) == Some("ms"));
        assert!(!full_in_ms, "{l}");
    }
    let r = report_json(&trace);
    assert_eq!(r["findings"][0]["kind"], "oom");
    assert!(
        r["findings"][0]["hint"].as_str().unwrap().contains("leak"),
        "{}",
        r["findings"][0]
    );
    let leaks = findings(&r, "leak");
    assert_eq!(leaks.len(), 1, "{leaks:?}");
    assert_eq!(leaks[0]["level"], "confirmed");
    assert_eq!(functions(leaks[0])[0], "keep_history");
    assert_eq!(leaks[0]["growth_bytes_per_step"], 16.0 * 1048576.0);
}

/// An unknown option before the command is refused in one line that names it and points at
/// the subcommand's help (exit 2), never taken as the command to trace; every argument error
/// points at the help of the subcommand it was given to.
#[test]
fn unknown_options_are_refused_and_errors_point_at_the_subcommands_help() {
    let dir = scratch("unknown-option");
    let program = scenario("runtime_basic");
    let program = program.to_str().unwrap();
    let in_dir = |args: &[&str]| {
        let mut cmd = base_command(oomtrace_bin());
        cmd.current_dir(&dir).args(args);
        output_within(cmd, TIMEOUT)
    };
    // An option of another command (`demo`'s), with its value: once run as the program.
    let out = in_dir(&["run", "--device-memory", "2GiB", "--", program]);
    assert_one_line_error(&out, "unknown option '--device-memory'");
    assert_one_line_error(&out, "(see `oomtrace run --help`)");
    assert!(out.stdout.is_empty(), "the program ran");
    assert!(traces_in(&dir).is_empty(), "a refused run leaves no trace");
    // A similar option is suggested; clap's tip to put it after `--` is not (for `run` that
    // would make it the program).
    let out = in_dir(&["run", "--outptu", "t.oomt", "--", program]);
    assert_one_line_error(&out, "a similar one: '--output'");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("-- --outptu"));
    for (args, needle, help) in [
        (
            &["report", "--bogus", "x"][..],
            "'--bogus'",
            "oomtrace report --help",
        ),
        (
            &["export", "t.oomt", "-f", "svg"],
            "svg",
            "oomtrace export --help",
        ),
        (&["diff", "a.oomt"], "<AFTER>", "oomtrace diff --help"),
        (
            &["export", "t.oomt", "-f", "json", "--at", "peak"],
            "--at is for",
            "oomtrace export --help",
        ),
        (
            &["--color", "never", "view"],
            "<FILE>",
            "oomtrace view --help",
        ),
        (&["lib-path", "--bogus"], "'--bogus'", "oomtrace lib --help"),
        (&["run"], "no command to trace", "oomtrace run --help"),
        (&["frobnicate"], "frobnicate", "(see `oomtrace --help`)"),
        (
            &["--color", "sometimes", "lib"],
            "sometimes",
            "oomtrace lib --help",
        ),
    ] {
        let out = in_dir(args);
        assert_one_line_error(&out, needle);
        assert_one_line_error(&out, help);
    }
}

/// The command keeps its own options, after `--` or without it (as memray and py-spy accept):
/// everything from the command's first word on is the command's.
#[test]
fn the_command_keeps_its_options_with_or_without_the_separator() {
    let dir = scratch("command-options");
    let in_dir = |args: &[&str]| {
        let mut cmd = base_command(oomtrace_bin());
        cmd.current_dir(&dir).args(args);
        output_within(cmd, TIMEOUT)
    };
    for args in [
        &[
            "run",
            "-o",
            "echo.oomt",
            "--",
            "echo",
            "--flag",
            "-o",
            "x",
            "--",
            "y",
        ][..],
        &[
            "run",
            "-o",
            "echo.oomt",
            "echo",
            "--flag",
            "-o",
            "x",
            "--",
            "y",
        ],
    ] {
        let out = in_dir(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "--flag -o x -- y\n");
    }
    assert!(!dir.join("x").exists());
    // A CUDA program named without `--` is traced as with it.
    let program = scenario("runtime_basic");
    let out = in_dir(&[
        "run",
        "--json",
        "r.json",
        "-o",
        "t.oomt",
        program.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("r.json")).unwrap()).unwrap();
    assert_eq!(processes(&r).len(), 1, "{r:#}");
}

/// `view` and `export` without `-o` write beside the trace (its name without `.oomt`, then
/// the format's ending), say where in one line, and never replace a file already there;
/// `-f` is `--format`, and `perfetto` writes the chrome format under a name of its own (one
/// export per format, none colliding with another's default name).
#[test]
fn view_and_export_write_beside_the_trace_without_o() {
    let dir = scratch("default-output");
    let traces = dir.join("runs");
    std::fs::create_dir(&traces).unwrap();
    let trace = traces.join("t.oomt");
    std::fs::write(&trace, good_trace()).unwrap();
    let t = trace.to_str().unwrap();
    // Run from another directory: the files go beside the trace, not into the working one.
    let elsewhere = dir.join("cwd");
    std::fs::create_dir(&elsewhere).unwrap();
    let in_cwd = |args: &[&str]| {
        let mut cmd = base_command(oomtrace_bin());
        cmd.current_dir(&elsewhere).args(args);
        output_within(cmd, TIMEOUT)
    };
    for (args, file) in [
        (&["view", t][..], "t.html"),
        (&["export", t, "-f", "chrome"], "t.chrome.json"),
        (&["export", t, "-f", "perfetto"], "t.perfetto.json"),
        (&["export", t, "--format", "json"], "t.jsonl"),
        (&["export", t, "-f", "folded"], "t.folded"),
        (&["export", t, "-f", "memory-viz"], "t.pickle"),
    ] {
        let out = in_cwd(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        let path = traces.join(file);
        assert!(
            std::fs::metadata(&path).is_ok_and(|m| m.len() > 0),
            "{args:?}: no {}",
            path.display()
        );
        let wrote = err
            .lines()
            .filter(|l| l.starts_with(&format!("oomtrace: wrote {}", path.display())))
            .count();
        assert_eq!(wrote, 1, "{args:?} should say where it wrote: {err}");
        // Again: the file (now as if the user's) is left exactly as it is.
        std::fs::write(&path, "mine").unwrap();
        let out = in_cwd(args);
        assert_one_line_error(&out, &format!("{} exists", path.display()));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "mine");
    }
    let mut names = names_in(&traces);
    names.sort();
    assert_eq!(
        names,
        [
            "t.chrome.json",
            "t.folded",
            "t.html",
            "t.jsonl",
            "t.oomt",
            "t.perfetto.json",
            "t.pickle"
        ],
        "nothing else is left beside the trace"
    );
    assert_eq!(names_in(&elsewhere), Vec::<String>::new());
    // The chrome format under its Perfetto name is the same document.
    let out = in_cwd(&["export", t, "--format", "chrome", "-o", "-"]);
    let perfetto = in_cwd(&["export", t, "--format", "perfetto", "-o", "-"]);
    assert!(out.status.success() && perfetto.status.success());
    assert_eq!(out.stdout, perfetto.stdout);
}

/// Every command that lists call sites has the same `--top` default.
#[test]
fn one_top_default_across_commands() {
    for command in ["report", "diff"] {
        let out = oomtrace(&[command, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        let top = help
            .split("--top <N>")
            .nth(1)
            .and_then(|rest| rest.split("[default: ").nth(1))
            .and_then(|rest| rest.split(']').next());
        assert_eq!(top, Some("10"), "{command}: {help}");
    }
}

/// Colour only on a terminal (headings bold, a finding's level in its colour), never with
/// `NO_COLOR` or `TERM=dumb` there, never into a pipe; `--color always|never` decides
/// anywhere (`always` wins over `NO_COLOR`); JSON is never coloured.
#[test]
fn colour_on_a_terminal_only_and_as_asked() {
    let dir = scratch("colour");
    let demo = oomtrace_in_dir(&dir, &["demo", "-o", "d.oomt"], &[]);
    assert!(
        demo.status.success(),
        "{}",
        String::from_utf8_lossy(&demo.stderr)
    );
    let plain = String::from_utf8_lossy(&demo.stdout).into_owned();
    assert!(!plain.contains('\x1b'), "colour into a pipe: {plain}");
    assert!(plain.contains("[confirmed leak]"), "{plain}");

    const HEADING: &str = "\x1b[1mFindings (";
    const CONFIRMED: &str = "\x1b[31m[confirmed leak]\x1b[0m";
    let report = ["report", "d.oomt"];
    let on_tty = |env: &[(&str, &str)], flags: &[&str]| {
        let args: Vec<&str> = report.iter().chain(flags).copied().collect();
        on_terminal(&dir, &args, env)
    };
    let coloured = on_tty(&[], &[]);
    assert!(coloured.contains(HEADING), "{coloured:?}");
    assert!(coloured.contains(CONFIRMED), "{coloured:?}");
    // The same text under the escapes (a terminal turns "\n" into "\r\n").
    let stripped = coloured
        .replace("\r\n", "\n")
        .replace("\x1b[1;31m", "")
        .replace("\x1b[31m", "")
        .replace("\x1b[1m", "")
        .replace("\x1b[0m", "");
    let piped = oomtrace_in_dir(&dir, &report, &[]);
    assert_eq!(stripped, String::from_utf8_lossy(&piped.stdout));
    assert!(on_tty(&[("NO_COLOR", "")], &[]).contains(HEADING));
    for env in [&[("NO_COLOR", "1")][..], &[("TERM", "dumb")]] {
        let text = on_tty(env, &[]);
        assert!(!text.contains('\x1b'), "{env:?}: {text:?}");
    }
    let text = on_tty(&[], &["--color", "never"]);
    assert!(!text.contains('\x1b'), "{text:?}");
    let text = on_tty(&[], &["--json"]);
    assert!(!text.contains('\x1b'), "{text:?}");

    // Into a pipe as asked, NO_COLOR or not; the subcommand's option or the global one.
    for args in [
        &["report", "d.oomt", "--color", "always"][..],
        &["--color=always", "report", "d.oomt"],
    ] {
        let out = oomtrace_in_dir(&dir, args, &[("NO_COLOR", "1")]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(HEADING) && text.contains(CONFIRMED),
            "{text:?}"
        );
    }
    // run's summary, on stderr.
    let program = scenario("runtime_basic");
    let program = program.to_str().unwrap();
    let out = oomtrace_in_dir(
        &dir,
        &["run", "--color", "always", "-o", "r.oomt", program],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\x1b[1moomtrace summary\x1b[0m"), "{err:?}");
    let out = oomtrace_in_dir(&dir, &["run", "-o", "r2.oomt", program], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\noomtrace summary\n") && !err.contains('\x1b'),
        "{err:?}"
    );
}

/// `--color` is offered where text is coloured (`report`, `run`, `demo`, and before any
/// subcommand): the help of the others does not list it, and after their name it is an unknown
/// option, in one line.
#[test]
fn colour_is_offered_only_where_text_is_coloured() {
    let dir = scratch("colour-where");
    for command in ["report", "run", "demo"] {
        let out = oomtrace_in_dir(&dir, &[command, "--help"], &[]);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("--color <WHEN>"), "{command}: {help}");
    }
    for command in [
        "lib", "view", "export", "diff", "whatif", "fit", "collect", "top",
    ] {
        let out = oomtrace_in_dir(&dir, &[command, "--help"], &[]);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{command}: {help}");
        assert!(
            !help.contains("--color"),
            "{command} offers --color: {help}"
        );
    }
    let out = oomtrace_in_dir(&dir, &["lib", "--color", "always"], &[]);
    assert_one_line_error(&out, "unknown option '--color'");
    assert_one_line_error(&out, "oomtrace lib --help");
    // Before the subcommand it is still taken (scripts that put it there keep working).
    let out = oomtrace_in_dir(&dir, &["--color", "never", "lib"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn oomtrace_in_dir(
    dir: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(dir).args(args).env_remove("NO_COLOR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    output_within(cmd, TIMEOUT)
}

/// What `oomtrace args` writes to its standard output when that is a terminal (a new
/// pseudo-terminal); `TERM` is `xterm` and `NO_COLOR` unset unless `env` says otherwise.
fn on_terminal(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> String {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    // SAFETY: posix_openpt returns a new descriptor (or -1), owned by `master` below.
    let fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
    // SAFETY: fd is ours and open; the File closes it.
    let mut master = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: grantpt/unlockpt on our master; ptsname_r writes at most name.len() bytes.
    let ok = unsafe {
        libc::grantpt(fd) == 0
            && libc::unlockpt(fd) == 0
            && libc::ptsname_r(fd, name.as_mut_ptr(), name.len()) == 0
    };
    assert!(ok, "pseudo-terminal: {}", std::io::Error::last_os_error());
    // SAFETY: ptsname_r wrote a NUL-terminated path.
    let slave_path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_str()
        .unwrap()
        .to_owned();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&slave_path)
        .unwrap();
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(dir)
        .args(args)
        .env("TERM", "xterm")
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::null())
        .stdout(slave)
        .stderr(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    // Our copy of the slave is gone with `cmd`: the master reads EIO once the child is done.
    drop(cmd);
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let mut buf = [0u8; 8192];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
        }
        text
    });
    let status = wait_within(&mut child, TIMEOUT, "oomtrace on a terminal");
    let text = String::from_utf8(reader.join().unwrap()).unwrap();
    assert!(status.success(), "{args:?}: {text}");
    text
}

/// Pickles that are no PyTorch snapshot, each one line and exit 2 from every command that
/// reads a snapshot, and nothing in them run: `os.system("touch PWNED")` as Python's pickle
/// writes it (GLOBAL, REDUCE), a torch.save-style persistent id, a cut file, a list of ints,
/// a list nested a million deep.
#[test]
fn hostile_and_foreign_pickles_give_one_clear_line_and_run_nothing() {
    let dir = scratch("hostile-pickles");
    let pwned = dir.join("PWNED");
    let mut system =
        b"\x80\x02}q\x00X\x08\x00\x00\x00segmentsq\x01]q\x02cposix\nsystem\nq\x03X".to_vec();
    let cmd = format!("touch {}", pwned.display());
    system.extend_from_slice(&(cmd.len() as u32).to_le_bytes());
    system.extend_from_slice(cmd.as_bytes());
    system.extend_from_slice(b"q\x04\x85q\x05Rq\x06as.");
    let mut deep = vec![0x80, 4];
    deep.extend(std::iter::repeat_n(b'(', 1_000_000));
    deep.push(b']');
    deep.extend(std::iter::repeat_n(b'l', 1_000_000));
    deep.push(b'.');
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("system.pickle", system, "nothing in it was run"),
        (
            "persistent.pickle",
            b"\x80\x02X\x01\x00\x00\x00xQ.".to_vec(),
            "persistent",
        ),
        (
            "cut.pickle",
            b"\x80\x04\x95\x10\x00\x00\x00".to_vec(),
            "not a readable pickle",
        ),
        (
            "ints.pickle",
            b"\x80\x04](K\x01K\x02e.".to_vec(),
            "not a PyTorch memory snapshot",
        ),
        ("deep.pickle", deep, "not a PyTorch memory snapshot"),
    ];
    for (name, bytes, needle) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let path = path.to_str().unwrap();
        for args in [
            vec!["report", path],
            vec!["whatif", path],
            vec!["fit", path],
            vec!["view", path, "-o", "/dev/null"],
            vec!["diff", path, path],
        ] {
            let out = oomtrace(&args);
            assert_one_line_error(&out, needle);
        }
    }
    assert!(!pwned.exists(), "a pickle ran code");
}

/// `report --since-mark` with a label no marker has: one line naming it, exit 2 (a typo never
/// gives an empty report that looks clean).
#[test]
fn a_since_mark_label_no_marker_has_is_one_line() {
    let dir = scratch("since-mark");
    let trace = dir.join("t.oomt");
    std::fs::write(&trace, good_trace()).unwrap();
    assert_one_line_error(
        &oomtrace(&[
            "report",
            trace.to_str().unwrap(),
            "--since-mark",
            "no-such-mark",
        ]),
        "no step marker labelled 'no-such-mark'",
    );
}
