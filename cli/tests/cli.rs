//! The CLI's own surface: help, version, one-line errors. (Scenario tests through the shim
//! and collector are in `tests/it`.) Having this file also makes `cargo test --workspace`
//! build the `oomtrace` binary those tests run.

use std::process::Command;

fn oomtrace(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oomtrace"))
        .args(args)
        .output()
        .expect("run oomtrace")
}

#[test]
fn help_lists_every_command() {
    let out = oomtrace(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["run", "collect", "report", "demo"] {
        assert!(text.contains(cmd), "--help lacks {cmd}");
    }
    assert!(oomtrace(&["--version"]).status.success());
}

#[test]
fn run_help_shows_the_contract_flags() {
    let out = oomtrace(&["run", "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["--torch", "--output", "--fail-on-leak", "--json"] {
        assert!(text.contains(flag), "run --help lacks {flag}");
    }
}

#[test]
fn errors_are_one_line() {
    let out = oomtrace(&["report"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("oomtrace: "), "{err}");
}

#[test]
fn docs_document_the_cli_variables() {
    let configuration = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .unwrap();
    assert!(configuration.contains("OOMTRACE_LIB"));
}
