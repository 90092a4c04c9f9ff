//! Symbols that match the trace, or a warning: a program rebuilt between its run and its
//! report (the same path, other code at the leak's address) is never named from the new file.
//! `report` (text and JSON), `diff`, every `export` format and `view` say which module changed,
//! in one line, and show the leak's frame as its module and offset; `diff` of the old trace
//! against one of the new build calls the leak neither gone nor new.
//!
//! The program (`scenarios/stale_symbols.c`) is compiled here, into the test's scratch
//! directory, so that it can be rebuilt: once with the leak in `leaky_buffer_cache`, then
//! with the same function renamed `helper_one` (the same code at the same offset).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use oomtrace_tests::*;
use serde_json::Value;

/// The name the rebuilt file gives the leak's address: must never appear for the old trace.
const V2_NAME: &str = "helper_one";
const V1_NAME: &str = "leaky_buffer_cache";
const APP: &str = "stale_app";

/// Compiles `scenarios/stale_symbols.c` to `out` as tests/build.rs compiles the scenarios,
/// with `extra` flags.
fn compile(out: &Path, extra: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut cmd = Command::new("cc");
    cmd.args(["-g", "-O1", "-fomit-frame-pointer", "-Wall", "-std=gnu11"])
        .arg(format!("-I{SIM_INCLUDE}"))
        .arg(format!("-I{}", src.display()))
        .arg(format!("-L{SIM_LIB}"))
        .arg("-o")
        .arg(out)
        .arg(src.join("stale_symbols.c"))
        .args(extra)
        .args(["-l:libcudart.so.12", "-ldl", "-lpthread"]);
    let result = output_within(cmd, TIMEOUT);
    assert!(
        result.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&result.stderr)
    );
}

/// Whether the ELF file at `path` has a GNU build-id note (its section name is in the file).
fn has_build_id(path: &Path) -> bool {
    let bytes = std::fs::read(path).unwrap();
    let name = b".note.gnu.build-id";
    bytes.windows(name.len()).any(|w| w == name)
}

fn oomtrace(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(dir).args(args);
    output_within(cmd, TIMEOUT)
}

/// Runs a command that must succeed; returns (stdout, stderr).
fn ok(dir: &Path, args: &[&str]) -> (String, String) {
    let out = oomtrace(dir, args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "oomtrace {args:?} failed:\n{stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

/// The lines of `stderr` that warn about the module at `app`: exactly one, saying it changed.
fn assert_one_warning(stderr: &str, app: &Path, what: &str) {
    let app = app.to_str().unwrap();
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(app) && l.contains("warning"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: one line about {app}, got:\n{stderr}"
    );
    assert!(
        lines[0].contains("changed since the trace was taken")
            && lines[0].contains(&format!("{APP} +0xOFFSET")),
        "{what}: {}",
        lines[0]
    );
}

/// The leak's innermost frame in the program (module and offset) from a report that could
/// still name it: the live-at-exit finding of `leaky_buffer_cache`.
fn leak_frame(report: &Value) -> Value {
    let f = findings(report, "live_at_exit")
        .into_iter()
        .find(|f| functions(f).first().map(String::as_str) == Some(V1_NAME))
        .unwrap_or_else(|| panic!("no live-at-exit finding at {V1_NAME}: {report:#}"));
    f["stack"][0].clone()
}

/// Runs the program at `app` under `oomtrace run`, writing `trace`.
fn run(dir: &Path, app: &Path, trace: &Path) {
    ok(
        dir,
        &[
            "run",
            "--output",
            trace.to_str().unwrap(),
            "--",
            app.to_str().unwrap(),
        ],
    );
}

/// The whole check, for a program linked with `link` (a build id, or none), whose change
/// the reports must call `reason`.
fn rebuilt_program_is_not_named_from_its_new_file(link: &str, reason: &str) {
    let dir = scratch("stale_symbols");
    let app: PathBuf = dir.join(APP);
    compile(&app, &[link]);
    assert_eq!(
        has_build_id(&app),
        link == "-Wl,--build-id",
        "linked with {link}"
    );
    let trace = dir.join("t.oomt");
    run(&dir, &app, &trace);
    let t = trace.to_str().unwrap();

    // Before the rebuild: the leak has its name, and nothing is stale.
    let before = report_json(&trace);
    assert_eq!(before["stale_modules"], serde_json::json!([]), "{before:#}");
    let frame = leak_frame(&before);
    assert_eq!(frame["module"], APP, "{frame}");
    let offset = frame["offset"].as_str().expect("offset").to_string();
    let stamp_before = std::fs::metadata(&app).unwrap();

    // The rebuild: the same code at the same offset, now named helper_one. (Never the same
    // size and time: the test would check nothing.)
    compile(&app, &[link, &format!("-DLEAKY={V2_NAME}")]);
    let stamp_after = std::fs::metadata(&app).unwrap();
    {
        use std::os::unix::fs::MetadataExt;
        assert_ne!(
            (
                stamp_before.len(),
                stamp_before.mtime(),
                stamp_before.mtime_nsec()
            ),
            (
                stamp_after.len(),
                stamp_after.mtime(),
                stamp_after.mtime_nsec()
            ),
            "the rebuild changed neither size nor time"
        );
    }
    let shown_text = format!("{APP} +{offset}");
    let shown_export = format!("{APP}+{offset}");

    // report, text: the frame as module and offset, one warning line, no v2 name.
    let (text, stderr) = ok(&dir, &["report", t]);
    assert!(!text.contains(V2_NAME), "report names {V2_NAME}:\n{text}");
    assert!(
        text.contains(&shown_text),
        "report lacks {shown_text}:\n{text}"
    );
    assert_one_warning(&stderr, &app, "report");

    // report --json: the module listed with its reason; the leak's frame unnamed, flagged, at
    // the same offset.
    let (json, _) = ok(&dir, &["report", "--json", t]);
    assert!(!json.contains(V2_NAME), "report --json names {V2_NAME}");
    let r: Value = serde_json::from_str(&json).unwrap();
    let stale = r["stale_modules"].as_array().expect("stale_modules");
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert_eq!(stale[0]["path"], app.to_str().unwrap());
    assert_eq!(stale[0]["reason"], reason);
    let leak = findings(&r, "live_at_exit")
        .into_iter()
        .find(|f| f["stack"][0]["offset"] == offset.as_str())
        .unwrap_or_else(|| panic!("no live-at-exit finding at {offset}: {r:#}"));
    assert_eq!(leak["stack"][0]["module"], APP);
    assert_eq!(leak["stack"][0]["function"], "");
    assert_eq!(leak["stack"][0]["module_changed"], true);
    assert_eq!(leak["bytes"], 30 * 4 * 1024 * 1024);

    // diff of the trace with itself: the same build on both sides, so every site matches by
    // module and offset: nothing gone, nothing new.
    let (text, stderr) = ok(&dir, &["diff", t, t]);
    assert!(!text.contains(V2_NAME), "diff names {V2_NAME}:\n{text}");
    assert!(
        text.contains(&shown_text),
        "diff lacks {shown_text}:\n{text}"
    );
    assert_one_warning(&stderr, &app, "diff");
    let (json, _) = ok(&dir, &["diff", "--json", t, t]);
    let d: Value = serde_json::from_str(&json).unwrap();
    let statuses: Vec<&str> = d["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert!(statuses.iter().all(|&s| s == "same"), "{d:#}");
    assert_eq!(d["unmatched_modules"], serde_json::json!([]));
    assert_eq!(d["stale_modules"].as_array().unwrap().len(), 1, "{d:#}");
    assert_eq!(d["stale_modules"][0]["reason"], reason);

    // export, every format: no v2 name in the file, one warning.
    for (format, names_frames) in [
        ("json", true),
        ("folded", true),
        ("chrome", true),
        ("memory-viz", false),
    ] {
        let out = dir.join(format!("out.{format}"));
        let (_, stderr) = ok(
            &dir,
            &["export", "--format", format, "-o", out.to_str().unwrap(), t],
        );
        let bytes = std::fs::read(&out).unwrap();
        let has = |s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(!has(V2_NAME), "export {format} names {V2_NAME}");
        if names_frames {
            assert!(has(APP), "export {format} lacks the module {APP}");
        }
        assert_one_warning(&stderr, &app, &format!("export {format}"));
    }
    let (json_lines, _) = ok(&dir, &["export", "--format", "json", "-o", "-", t]);
    assert!(
        json_lines.contains(&format!("\"offset\":\"{offset}\"")),
        "export json lacks the leak's offset"
    );
    let (folded, _) = ok(&dir, &["export", "--format", "folded", "-o", "-", t]);
    assert!(
        folded.contains(&shown_export),
        "folded lacks {shown_export}:\n{folded}"
    );

    // view: the page neither names v2's function nor hides the change.
    let page = dir.join("page.html");
    let (_, stderr) = ok(&dir, &["view", "-o", page.to_str().unwrap(), t]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.contains(V2_NAME), "view names {V2_NAME}");
    assert!(html.contains(&shown_export), "view lacks {shown_export}");
    assert!(html.contains("changed since the trace was taken"));
    assert_one_warning(&stderr, &app, "view");

    // The documented check after a fix: diff of the old trace against a run of the new build.
    // The module is another build on each side: the leak can be matched by neither name nor
    // offset, so it is unmatched, never "gone" (nor the new build's site "new").
    let after = dir.join("after.oomt");
    run(&dir, &app, &after);
    let a = after.to_str().unwrap();
    let (json, _) = ok(&dir, &["diff", "--json", t, a]);
    let d: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(d["unmatched_modules"], serde_json::json!([APP]), "{d:#}");
    for s in d["sites"].as_array().unwrap() {
        if s["key"].as_str().unwrap().contains(APP) || s["name"] == V2_NAME {
            assert_eq!(s["status"], "unmatched", "{s:#}");
        }
        assert_ne!(s["status"], "gone", "{s:#}");
        assert_ne!(s["status"], "new", "{s:#}");
    }
    assert!(d["sites"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["name"] == shown_text && s["status"] == "unmatched"));
    let (text, stderr) = ok(&dir, &["diff", t, a]);
    assert!(
        !text.lines().any(|l| l.trim_start().starts_with("gone ")),
        "{text}"
    );
    assert!(text.contains("unmatched"), "{text}");
    assert_one_warning(&stderr, &app, "diff before after");
}

#[test]
fn a_program_rebuilt_after_its_run_is_not_named_from_the_new_file() {
    rebuilt_program_is_not_named_from_its_new_file("-Wl,--build-id", "build_id_changed");
}

#[test]
fn without_a_build_id_the_size_and_time_of_the_file_decide() {
    rebuilt_program_is_not_named_from_its_new_file("-Wl,--build-id=none", "file_changed");
}
