//! Which frame names a call site: past a statically linked CUDA runtime inside an extension,
//! and (with `torch.rs`) past PyTorch's allocator to the backward node and the user's line.

use oomtrace_tests::*;
use serde_json::Value;

/// The first stack line ("at ...") after the line of `text` that contains `anchor` (not the
/// evidence's "at this rate ...").
pub fn first_at_line<'a>(text: &'a str, anchor: &str) -> &'a str {
    text.lines()
        .skip_while(|l| !l.contains(anchor))
        .map(str::trim_start)
        .find(|l| l.starts_with("at ") && !l.starts_with("at this rate"))
        .unwrap_or_else(|| panic!("no stack after {anchor:?} in:\n{text}"))
}

/// An extension with the CUDA runtime linked in (its own hidden `cudaMalloc` and hashed
/// `libcudart_static_*` internals) leaks 1 MiB a step from `scratch_forward`: the JSON
/// culprit, the first stack line of the text report and of the summary, and the live lines
/// name `scratch_forward`, not the runtime inside the extension.
#[test]
fn a_static_runtime_inside_an_extension_is_not_the_culprit() {
    let ext = scenario("libext_static_rt.so");
    let t = run_traced("static_rt_main", &[ext.to_str().unwrap()], &[]);
    assert!(t.status.success(), "{}", t.stderr);
    let leaks = findings(&t.report, "leak");
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let leak = leaks[0];
    // The runtime's frames are in the stack, innermost, as recorded.
    let names = functions(leak);
    assert!(
        names[0].starts_with("libcudart_static_") && names[1] == "cudaMalloc",
        "{names:?}"
    );
    let culprit: &Value = &leak["culprit"];
    assert_eq!(culprit["function"], "scratch_forward", "{culprit:#}");
    assert_eq!(culprit["module"], "libext_static_rt.so", "{culprit:#}");
    let live = findings(&t.report, "live_at_exit");
    assert_eq!(live[0]["culprit"]["function"], "scratch_forward");
    let msg = leak["message"].as_str().unwrap();
    for text in [&t.stderr, &report_text(&t.trace)] {
        let at = first_at_line(text, msg);
        assert!(
            at.starts_with("at scratch_forward  ext_static_rt.c:"),
            "{at}\n{text}"
        );
        assert!(
            text.contains("(which calls cudaMalloc -> libcudart_static_"),
            "{text}"
        );
    }
    let live_lines: Vec<&str> = t
        .stderr
        .lines()
        .filter(|l| l.starts_with("oomtrace: [") && l.contains(" leak] "))
        .collect();
    assert!(!live_lines.is_empty(), "{}", t.stderr);
    for l in live_lines {
        assert!(l.contains(" at scratch_forward (ext_static_rt.c:"), "{l}");
    }
}
