//! The real-PyTorch tier, in words: where PyTorch's tensors are traced (`oomtrace run
//! --torch`), the text report, the live lines and the JSON `culprit` speak of tensors, named by
//! the user's Python lines; PyTorch's reserve is one line per device; its C++ frames are
//! folded; no line of the text is wider than 200 characters. See `torch.rs` for the tier.

use super::*;

/// The widest line a text report may have.
const MAX_LINE: usize = 200;

/// One `oomtrace run --torch` of a scenario, with its trace kept for more reports.
struct Traced {
    stderr: String,
    report: Value,
    trace: PathBuf,
    _run: TorchRun,
}

fn run_tracked(name: &str) -> Traced {
    let r = run_torch(name, Mode::Torch, &[]);
    assert_eq!(r.status.code(), Some(0), "{}", r.stderr);
    Traced {
        stderr: r.stderr.clone(),
        report: r.report.clone(),
        trace: r._dir.join("trace.oomt"),
        _run: r,
    }
}

/// `oomtrace report FLAGS TRACE`'s standard output.
fn report_with(flags: &[&str], trace: &Path) -> String {
    report_output(flags, &[trace])
}

fn assert_lines_fit(text: &str) {
    for l in text.lines() {
        assert!(
            l.chars().count() <= MAX_LINE,
            "a line of {} characters:\n{l}\n\nin:\n{text}",
            l.chars().count()
        );
    }
}

/// The section of `text` from the line starting with `from` to the next blank line.
fn section<'a>(text: &'a str, from: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| !l.starts_with(from))
        .take_while(|l| !l.is_empty())
        .collect()
}

/// `leak_activations.py` under `--torch`: the report leads with the leaking line, lists
/// tensors by line (the cache's segments are one line per device), folds PyTorch's C++
/// frames, keeps the memory outside PyTorch's allocator (cuBLAS's workspace) as call sites,
/// and never advises `--torch` while it runs under it. `--segments` and `--native` bring the
/// segments and the C++ frames back.
#[test]
fn torch_report_speaks_of_tensors_named_by_their_lines() {
    let r = run_tracked("leak_activations.py");
    let leak_line = torch_line_of("leak_activations.py", "# LEAK");
    let at = format!("leak_activations.py:{leak_line}");

    // Live lines and the summary: no advice to trace the tensors that are traced.
    assert!(
        r.stderr.contains("leak] pid") && r.stderr.contains(&at),
        "{}",
        r.stderr
    );
    for l in r.stderr.lines().filter(|l| l.starts_with("oomtrace: [")) {
        assert!(!l.contains("--torch"), "a live line advises --torch: {l}");
    }
    assert!(!r.stderr.contains("oomtrace run --torch"), "{}", r.stderr);

    // JSON: the first call site live at exit is the leak's tensors, named by its line.
    let live: Vec<&Value> = r.report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "live_at_exit")
        .collect();
    let first = live[0];
    assert_eq!(first["held"], "tensors", "{first:#}");
    assert_eq!(first["api"], "oomtrace_torch_alloc", "{first:#}");
    assert!(
        first["culprit"]["python"] == true
            && first["culprit"]["file"]
                .as_str()
                .unwrap()
                .ends_with("/leak_activations.py")
            && first["culprit"]["line"] == leak_line,
        "{first:#}"
    );
    assert!(
        live.iter().all(|f| f["held"] != "torch_reserve"),
        "segments listed by default: {live:#?}"
    );
    // cuBLAS's own device memory is outside PyTorch's allocator: still a call site.
    assert!(
        live.iter()
            .any(|f| f["held"] == "outside_torch" && f["api"] == "cuMemAlloc_v2"),
        "{live:#?}"
    );
    // The JSON keeps full C++ names.
    assert!(
        first["stack"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["function"].as_str().unwrap_or("").starts_with("c10::")),
        "{first:#}"
    );
    let devices = processes(&r.report)[0]["devices"]
        .as_array()
        .unwrap()
        .clone();
    let traced: Vec<&Value> = devices
        .iter()
        .filter(|d| d["torch_reserved_bytes"].is_u64())
        .collect();
    assert_eq!(traced.len(), 1, "{devices:#?}");
    assert!(
        traced[0]["torch_segments"].as_u64().unwrap() > 0,
        "{devices:#?}"
    );

    // The text report.
    let text = report_text(&r.trace);
    assert_lines_fit(&text);
    let head: Vec<&str> = text.lines().take(6).collect();
    assert!(
        head.iter().any(|l| l.contains(&at)),
        "the first lines do not name {at}:\n{text}"
    );
    assert_eq!(
        text.matches("PyTorch's cache: ").count(),
        traced.len(),
        "one reserve line per device:\n{text}"
    );
    let reserve = text
        .lines()
        .find(|l| l.contains("PyTorch's cache: "))
        .unwrap();
    assert!(
        reserve.contains(" reserved in ") && reserve.ends_with(" of it in tensors at exit"),
        "{reserve}"
    );
    assert!(
        !text.contains("::"),
        "C++ names in the default text:\n{text}"
    );
    assert!(text.contains(" PyTorch C++ frames"), "{text}");
    // PyTorch's Python frames fold too, by library: the user's lines stand out; --full
    // shows every frame.
    assert!(
        text.contains(" torch.nn frames)") && !text.contains("Module._call_impl"),
        "{text}"
    );
    let full = report_with(&["--full"], &r.trace);
    assert!(
        full.contains("Module._call_impl") && !full.contains(" torch.nn frames)"),
        "{full}"
    );
    assert!(full.lines().count() > text.lines().count());
    let listed = section(&text, "Still live at exit");
    assert!(
        listed[1].contains(" in 40 tensors, device 0"),
        "{listed:#?}\n{text}"
    );
    assert!(
        listed.iter().all(|l| !l.contains("of PyTorch's cache")),
        "{listed:#?}"
    );
    assert!(
        listed
            .iter()
            .any(|l| l.contains("(cuMemAlloc_v2, outside PyTorch's allocator)")),
        "{listed:#?}"
    );
    let sites = section(&text, "  call sites (by end)");
    assert!(sites[1].ends_with(&format!("{at} <module>")), "{sites:#?}");
    assert!(
        text.contains("Sections: pid ") && text.contains("  tensor sizes:"),
        "{text}"
    );

    // --segments: the segments' call sites are back, in text and JSON.
    let segments = report_with(&["--segments"], &r.trace);
    assert_lines_fit(&segments);
    assert!(
        section(&segments, "Still live at exit")
            .iter()
            .any(|l| l.contains("of PyTorch's cache (cudaMalloc)")),
        "{segments}"
    );
    assert!(segments.contains("  allocation sizes:"), "{segments}");
    let json: Value =
        serde_json::from_str(&report_with(&["--segments", "--json"], &r.trace)).unwrap();
    assert!(
        json["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["held"] == "torch_reserve"),
        "{:#}",
        json["findings"]
    );
    assert_eq!(json["sections"][0]["lists_of"], "allocations");
    let json: Value = serde_json::from_str(&report_with(&["--json"], &r.trace)).unwrap();
    assert_eq!(json["sections"][0]["lists_of"], "tensors");
    assert!(json["sections"][0]["torch_cache"]["segments"].as_u64() > Some(0));

    // --native: PyTorch's C++ frames one by one, still shortened and within the width.
    let native = report_with(&["--native"], &r.trace);
    assert_lines_fit(&native);
    assert!(native.contains("empty_generic"), "{native}");
    assert!(!native.contains("std::shared_ptr"), "{native}");
}
