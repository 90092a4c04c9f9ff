use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use oomtrace_tests::*;
use serde_json::Value;

/// Headless Chromium (Debian's `chromium` package; `.ci/run` installs it).
fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            let ok = Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
            ok.then(|| PathBuf::from(name))
        })
}

const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);

/// Chromium on `page` in `dir` (its own profile there, so tests in parallel do not share one)
/// with `args`; returns stdout and stderr, the page's console included.
fn browse(browser: &Path, dir: &Path, page: &Path, args: &[&str]) -> (String, String) {
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
    ])
    .arg(format!(
        "--user-data-dir={}",
        dir.join("chromium-profile").display()
    ))
    .args(args)
    .arg(format!("file://{}", page.display()));
    let out = output_within(cmd, BROWSER_TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "chromium failed: {stderr}");
    (stdout, stderr)
}

/// The DOM after the page's script ran: it must have run to its end without an error (none
/// caught into `#errors`, none uncaught on the console).
fn rendered_dom(browser: &Path, dir: &Path, page: &Path) -> String {
    let (dom, console) = browse(browser, dir, page, &["--dump-dom"]);
    assert!(!console.contains("Uncaught"), "script error:\n{console}");
    let errors = dom
        .split("id=\"errors\"")
        .nth(1)
        .and_then(|rest| rest.split_once('>'))
        .map(|(_, rest)| rest.split("</pre>").next().unwrap_or(""))
        .expect("the page has its #errors element");
    assert!(errors.trim().is_empty(), "the page caught errors: {errors}");
    assert!(
        dom.contains("data-rendered=\"yes\""),
        "the script did not finish:\n{dom}"
    );
    shown(&dom)
}

/// What the page shows: its `<main>` as the script filled it (not the script and data that
/// made it, which name the same functions).
fn shown(dom: &str) -> String {
    let start = dom
        .find("<main id=\"app\">")
        .expect("the page has its <main>");
    let end = dom[start..].find("</main>").expect("a closed <main>") + start;
    dom[start..end].to_string()
}

/// The call-site labels the page shows (chart legend, OOM table, site table).
fn site_labels(dom: &str) -> Vec<String> {
    dom.split("class=\"site-label\">")
        .skip(1)
        .map(|s| s.split('<').next().unwrap_or("").to_string())
        .collect()
}

/// Whether `label` is `<file>:<line> <function>` (a site's label on the page), with `file`
/// when given.
fn names(label: &str, file: Option<&str>, function: &str) -> bool {
    let Some((at, f)) = label.split_once(' ') else {
        return false;
    };
    let Some((path, line)) = at.rsplit_once(':') else {
        return false;
    };
    f == function
        && file.is_none_or(|file| path == file)
        && !line.is_empty()
        && line.bytes().all(|b| b.is_ascii_digit())
}

/// The text after each `marker` in `dom`, up to the next `<`.
fn texts_after<'a>(dom: &'a str, marker: &str) -> Vec<&'a str> {
    dom.split(marker)
        .skip(1)
        .map(|s| s.split('<').next().unwrap_or(""))
        .collect()
}

/// The data the page was written with.
pub(crate) fn page_data(html: &str) -> Value {
    let start = html
        .find("<script id=\"data\" type=\"application/json\">")
        .expect("the page has its data");
    let rest = &html[start..];
    let json = &rest[rest.find('>').unwrap() + 1..rest.find("</script>").unwrap()];
    serde_json::from_str(json).expect("the page's data is JSON")
}

fn oomtrace_in(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(dir).args(args);
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "oomtrace {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Where a test's screenshot is kept after its scratch directory is gone.
fn artifact(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("view");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The demo's trace as a page, in a real browser: the script runs without an error, the
/// planted leak (`keep_history`) and the OOM's culprit (`evaluate`) are on the rendered page,
/// the chart marks the OOM and the leak, and the page loads nothing. The screenshot is kept
/// under target/tmp/view/; with `OOMTRACE_UPDATE_SCREENSHOT=1` it also replaces docs/view.png
/// (the README's picture).
#[test]
fn the_demo_view_renders_its_leak_and_oom_in_a_browser() {
    let Some(browser) = chromium() else {
        precondition(false, "chromium (apt-get install chromium)");
        return;
    };
    let dir = scratch("view-demo");
    oomtrace_in(&dir, &["demo", "--output", "demo.oomt"]);
    let page = dir.join("demo.html");
    let out = oomtrace_in(&dir, &["view", "demo.oomt", "-o", "demo.html"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("wrote"),
        "{out:?}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    for remote in ["http://", "https://", " src=", "url("] {
        assert!(!html.contains(remote), "the page loads something: {remote}");
    }
    let dom = rendered_dom(&browser, &dir, &page);
    // Sites are named `file:line function` of their culprit frame.
    let labels = site_labels(&dom);
    assert!(
        labels
            .iter()
            .any(|l| names(l, Some("train_demo.c"), "keep_history")),
        "{labels:?}"
    );
    assert!(dom.contains("Out of memory at"), "no OOM panel");
    let culprits = texts_after(&dom, "class=\"culprit\">");
    assert!(
        culprits
            .iter()
            .any(|c| names(c, Some("train_demo.c"), "evaluate")),
        "the OOM's culprit is not shown: {culprits:?}"
    );
    let onsets = texts_after(&dom, "leak onset: ");
    assert!(
        onsets.iter().any(|l| names(l, None, "keep_history")),
        "no leak onset on the time axis: {onsets:?}"
    );
    let detections = texts_after(&dom, "leak detected: ");
    assert!(
        detections.iter().any(|l| names(l, None, "keep_history")),
        "no leak detection on the axis: {detections:?}"
    );
    assert!(
        dom.contains("OOM: 3.32 GiB requested"),
        "no OOM on the time axis"
    );
    // 24 steps, each a marker line on each device's chart.
    let charts = dom.matches("<svg ").count();
    assert!(charts >= 1);
    assert_eq!(dom.matches("class=\"step\"").count(), 24 * charts);
    // The flame graph can show the bytes held at the OOM.
    let data = page_data(&html);
    let cuda0 = &data["processes"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == 0)
        .expect("cuda:0")
        .clone();
    assert!(
        cuda0["flames"]["oom"]["v"].as_u64().unwrap() > 0,
        "{}",
        cuda0["flames"]
    );

    let shot = dir.join("view.png");
    let (_, _) = browse(
        &browser,
        &dir,
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,1000",
            "--hide-scrollbars",
        ],
    );
    let png = std::fs::read(&shot).expect("chromium wrote no screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    let kept = artifact("demo.png");
    std::fs::write(&kept, &png).unwrap();
    eprintln!("screenshot of the demo's view: {}", kept.display());
    if std::env::var_os("OOMTRACE_UPDATE_SCREENSHOT").is_some_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/view.png");
        std::fs::write(&docs, &png).unwrap();
        eprintln!("updated {}", docs.display());
    }
}

/// `oomtrace run --html` on a corpus leak: the leaking function is a call site on the
/// rendered page, with a positive growth per step.
#[test]
fn run_html_shows_the_leaking_function_in_a_browser() {
    let Some(browser) = chromium() else {
        precondition(false, "chromium (apt-get install chromium)");
        return;
    };
    let t = run_traced_with("leak_history", &["--html", "view.html"], &[], &[]);
    let page = t.dir.join("view.html");
    assert!(
        page.is_file(),
        "run --html wrote no page; stderr:\n{}",
        t.stderr
    );
    let dom = rendered_dom(&browser, &t.dir, &page);
    let labels = site_labels(&dom);
    assert!(
        labels.iter().any(|l| names(l, None, "history_append")),
        "{labels:?}"
    );
    let data = page_data(&std::fs::read_to_string(&page).unwrap());
    let site = data["processes"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| d["sites"].as_array().unwrap().iter())
        .find(|s| names(s["label"].as_str().unwrap_or(""), None, "history_append"))
        .expect("history_append in the site table")
        .clone();
    assert!(site["growth_per_step"].as_f64().unwrap() > 0.0, "{site}");
    assert!(site["end"].as_u64().unwrap() > 0, "{site}");
    let shot = t.dir.join("leak.png");
    let (_, _) = browse(
        &browser,
        &t.dir,
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,1000",
        ],
    );
    let kept = artifact("leak_history.png");
    std::fs::copy(&shot, &kept).expect("chromium wrote no screenshot");
    eprintln!("screenshot of leak_history's view: {}", kept.display());
}

/// A long trace (over a million events) gives a bounded page: at most 2000 points per
/// device, and well under the size a 10^7-event trace must stay under (20 MB).
#[test]
fn a_long_trace_gives_a_bounded_page() {
    let t = run_traced_within(
        "bench_pairs",
        &[],
        &["200000"],
        &[],
        Duration::from_secs(300),
    );
    assert!(t.status.success(), "{}", t.stderr);
    let events = t.report["processes"][0]["events"].as_u64().unwrap();
    assert!(events > 1_000_000, "only {events} events");
    let page = t.dir.join("view.html");
    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("view").arg(&t.trace).arg("-o").arg(&page);
    let out = output_within(cmd, Duration::from_secs(300));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    let data = page_data(&html);
    for d in data["processes"][0]["devices"].as_array().unwrap() {
        let n = d["points"].as_array().unwrap().len();
        assert!(n <= 2000, "{n} points on {}", d["label"]);
    }
    assert!(
        html.len() < 2_000_000,
        "{} bytes for {events} events",
        html.len()
    );
    eprintln!("{events} events: a page of {} bytes", html.len());
}

/// The icicle at any step or moment: `view --at 10` opens it after the 10th step (the demo's
/// leak holds 10 of its 16 MiB outputs then), `--at 0.5s` half a second in; every page offers
/// evenly spaced steps, with a slider, whose holdings grow with the leak; a moment the trace
/// never reached is one line, exit 2, and no page.
#[test]
fn the_icicle_opens_at_a_chosen_step_and_scrubs_through_the_steps() {
    let Some(browser) = chromium() else {
        precondition(false, "chromium (apt-get install chromium)");
        return;
    };
    let dir = scratch("view-at");
    oomtrace_in(&dir, &["demo", "--output", "demo.oomt"]);
    oomtrace_in(
        &dir,
        &["view", "demo.oomt", "--at", "10", "-o", "at10.html"],
    );
    let html = std::fs::read_to_string(dir.join("at10.html")).unwrap();
    let data = page_data(&html);
    // The GPU (the demo's pinned staging buffer is a device of its own, -1).
    let gpu = |data: &Value| -> Value {
        data["processes"][0]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["device"] == 0)
            .cloned()
            .expect("device 0")
    };
    let dev = &gpu(&data);
    assert_eq!(dev["opens_at"], "at", "{}", dev["moments"]);
    let moments: Vec<(String, String)> = dev["moments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m[0].as_str().unwrap().into(), m[1].as_str().unwrap().into()))
        .collect();
    assert!(
        moments.contains(&("at".into(), "after step 10".into())),
        "{moments:?}"
    );
    let steps: Vec<&String> = moments
        .iter()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("step:"))
        .collect();
    assert!(steps.len() >= 12, "{moments:?}");
    // The leak's 16 MiB a step: the holdings grow from the first step kept to the last.
    let held = |k: &str| dev["flames"][k]["v"].as_u64().unwrap_or(0);
    assert!(
        held(steps[0]) + 16 * MIB * 5 <= held(steps[steps.len() - 1]),
        "{} -> {}",
        held(steps[0]),
        held(steps[steps.len() - 1])
    );
    assert_eq!(held("at"), held("step:10"), "the same moment twice");
    let dom = rendered_dom(&browser, &dir, &dir.join("at10.html"));
    assert!(dom.contains("class=\"step-slider\""), "no slider:\n{dom}");
    let selected = dom
        .split("<option ")
        .find(|o| o.contains("selected"))
        .unwrap_or("");
    assert!(selected.contains("after step 10"), "{selected}");
    // A time into the run.
    oomtrace_in(&dir, &["view", "demo.oomt", "--at", "0.5s", "-o", "t.html"]);
    let data = page_data(&std::fs::read_to_string(dir.join("t.html")).unwrap());
    assert_eq!(gpu(&data)["opens_at"], "at");
    // A moment the trace never reached, and one that is no moment.
    for (at, says) in [("999", "the trace has 24 steps"), ("lunch", "bad moment")] {
        let mut cmd = base_command(oomtrace_bin());
        cmd.current_dir(&dir)
            .args(["view", "demo.oomt", "--at", at, "-o", "never.html"]);
        let out = output_within(cmd, TIMEOUT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!dir.join("never.html").exists());
    }
}

/// `view` of a file that is not a trace, with or without `-o`: one line, exit 2, and no page.
#[test]
fn view_refuses_bad_input_and_writes_nothing() {
    let dir = scratch("view-errors");
    let run = |args: &[&str]| {
        let mut cmd = base_command(oomtrace_bin());
        cmd.current_dir(&dir).args(args);
        output_within(cmd, TIMEOUT)
    };
    std::fs::write(dir.join("bad.oomt"), "not a trace").unwrap();
    for args in [
        &["view", "bad.oomt"][..],
        &["view", "bad.oomt", "-o", "page.html"],
    ] {
        let o = run(args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("bad magic"), "{stderr}");
    }
    assert!(!dir.join("page.html").exists());
    assert!(!dir.join("bad.html").exists());
}

/// The part of `dom` from the first `start` to the next `end` after it ("" without one).
fn between<'a>(dom: &'a str, start: &str, end: &str) -> &'a str {
    dom.find(start).map_or("", |i| {
        let rest = &dom[i..];
        &rest[..rest.find(end).unwrap_or(rest.len())]
    })
}

/// A real PyTorch leak under `oomtrace run --torch`, as a page in a real browser: the chart
/// stacks tensors by call site under PyTorch's reserve line, the legend and the call-site
/// table name the leaking line (`leak_activations.py:<line>`) and never a C++ name, every row
/// has its own label, the time axis starts at the first CUDA allocation (not at the
/// process's first event: `import torch` and `cuInit` come before), every step has its marker
/// and no two step labels overlap, and the flame graph shows Python frames unless asked.
#[test]
fn a_pytorch_trace_shows_tensors_by_line_under_the_reserve() {
    let Some(browser) = chromium() else {
        precondition(false, "chromium (apt-get install chromium)");
        return;
    };
    let script = "leak_activations.py";
    let line = crate::torch::torch_script_line(script, "# LEAK");
    let leak = format!("{script}:{line}");
    let dir = scratch("view-torch");
    let trace = crate::torch::torch_trace(script, &dir);
    let page = dir.join("torch.html");
    oomtrace_in(
        &dir,
        &[
            "view",
            trace.to_str().unwrap(),
            "-o",
            page.to_str().unwrap(),
        ],
    );
    let html = std::fs::read_to_string(&page).unwrap();
    let dom = rendered_dom(&browser, &dir, &page);

    let legend = site_labels(between(&dom, "<div class=\"legend\">", "</div>"));
    let rows = site_labels(between(&dom, "<table class=\"sites\">", "</table>"));
    assert!(!legend.is_empty() && !rows.is_empty(), "{dom}");
    for (what, labels) in [("legend", &legend), ("call sites", &rows)] {
        assert!(
            labels.iter().any(|l| l.starts_with(&format!("{leak} "))),
            "the {what} does not name {leak}: {labels:#?}"
        );
        for l in labels {
            assert!(
                !l.contains("::") && !l.contains("c10"),
                "a C++ name in the {what}: {l}"
            );
        }
        let unique: std::collections::HashSet<&String> = labels.iter().collect();
        assert_eq!(unique.len(), labels.len(), "{what}: {labels:#?}");
    }
    // The leaking line is the table's largest row.
    assert!(rows[0].starts_with(&format!("{leak} ")), "{rows:#?}");

    let data = page_data(&html);
    let proc = &data["processes"][0];
    let cuda0 = proc["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == 0)
        .expect("cuda:0")
        .clone();
    assert_eq!(cuda0["tensors"], true, "not drawn as tensors");
    let leak_layer = cuda0["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| {
            l["label"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{leak} "))
        })
        .expect("the leak is a layer of the chart")
        .clone();
    assert_eq!(leak_layer["memory"], "tensor", "{leak_layer}");
    // The reserve line, above the tensors: the reserve holds every tensor.
    // The chart by call site (after "What the memory is", whose steps chart is an SVG too).
    let svg = between(
        between(&dom, "<h3 id=\"chart-", "</section>"),
        "<svg ",
        "</svg>",
    );
    assert_eq!(
        svg.matches("class=\"reserve\"").count(),
        1,
        "no reserve line"
    );
    assert!(cuda0["reserve_peak"].as_u64().unwrap() >= cuda0["tensor_peak"].as_u64().unwrap());
    // The gap between them (PyTorch's cache) is shaded, its peak in the tooltip.
    assert_eq!(svg.matches("class=\"gap\"").count(), 1, "no gap");
    assert!(
        between(svg, "class=\"gap\"", "</path>")
            .contains("PyTorch's cache: reserved, no tensor in it (peak gap "),
        "{svg}"
    );
    for p in cuda0["points"].as_array().unwrap() {
        assert!(p[4].as_u64().unwrap() >= p[3].as_u64().unwrap(), "{p}");
    }

    // The axis starts at the first allocation, from the events themselves.
    let events = dir.join("events.jsonl");
    oomtrace_in(
        &dir,
        &[
            "export",
            "--format",
            "json",
            trace.to_str().unwrap(),
            "-o",
            events.to_str().unwrap(),
        ],
    );
    let stamps: Vec<(String, u64)> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "event" || v["type"] == "marker")
        .map(|v| {
            let kind = v["kind"].as_str().unwrap_or("marker").to_string();
            (kind, v["ts_ns"].as_u64().unwrap())
        })
        .collect();
    let first = stamps.iter().map(|s| s.1).min().unwrap();
    let first_alloc = stamps
        .iter()
        .filter(|s| s.0 == "alloc")
        .map(|s| s.1)
        .min()
        .unwrap();
    assert!(first_alloc > first, "no event before the first allocation");
    let want = (first_alloc - first) as f64 / 1e9;
    let axis = proc["axis_start_s"].as_f64().unwrap();
    assert!(
        (axis - want).abs() < 1e-6,
        "axis at {axis} s, first allocation at {want} s"
    );
    let drawn: f64 = svg
        .split("data-axis-start=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|s| s.parse().ok())
        .expect("the chart says where its axis starts");
    assert!((drawn - axis).abs() < 1e-6, "{drawn} vs {axis}");

    // Every step is marked; their labels are thinned so that none overlaps the next (the page
    // estimates 6.5 px a character of its 10 px font).
    let steps = proc["marker_count"].as_u64().unwrap();
    assert!(steps >= 40, "{steps} steps");
    assert_eq!(svg.matches("class=\"step\"").count() as u64, steps);
    let labels: Vec<(f64, usize)> = svg
        .split("class=\"step-label\" x=\"")
        .skip(1)
        .map(|s| {
            let x: f64 = s.split('"').next().unwrap().parse().unwrap();
            let text = s.split('>').nth(1).unwrap().split('<').next().unwrap();
            (x, text.len())
        })
        .collect();
    assert!(!labels.is_empty(), "no step labels");
    for w in labels.windows(2) {
        let room = (w[0].1 + w[1].1) as f64 * 6.5 / 2.0;
        assert!(w[1].0 - w[0].0 >= room, "step labels overlap: {labels:?}");
    }

    // The flame graph: Python frames by default, the leaking line among them.
    let flame = between(&dom, "<div class=\"flame\"", "</div></div>");
    assert!(flame.contains("data-frames=\"python\""), "{flame}");
    assert!(flame.contains(&format!(">{leak} ")), "{flame}");
    assert!(
        !flame.contains("c10::"),
        "native frames by default: {flame}"
    );
    assert!(
        cuda0["flames"]["peak"].to_string().contains("c10::"),
        "the native flame graph has PyTorch's frames"
    );

    let shot = dir.join("torch.png");
    browse(
        &browser,
        &dir,
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,1400",
        ],
    );
    let kept = artifact("torch_leak_activations.png");
    std::fs::copy(&shot, &kept).expect("chromium wrote no screenshot");
    eprintln!("screenshot of leak_activations' view: {}", kept.display());
}

/// PyTorch's backward pass on the page (`mlp_backward.py`: two `nn.Linear` layers whose
/// gradients are made on the autograd thread, with no Python frames): the legend, the call-site
/// table and the findings name those allocations by the forward lines whose `addmm` made their
/// autograd node (`backward of addmm at mlp_backward.py:FC1 and mlp_backward.py:FC2`), never by
/// a C++ frame (`libtorch_cpu.so AddmmBackward0.apply`) or as "no Python frames"; the Python
/// flame graph puts them under the forward lines' Python frames.
#[test]
fn a_pytorch_backward_pass_is_named_by_its_forward_lines() {
    let Some(browser) = chromium() else {
        precondition(false, "chromium (apt-get install chromium)");
        return;
    };
    let script = "mlp_backward.py";
    let fc1 = crate::torch::torch_script_line(script, "# FORWARD FC1");
    let fc2 = crate::torch::torch_script_line(script, "# FORWARD FC2");
    let addmm = format!("backward of addmm at {script}:{fc1} and {script}:{fc2}");
    let dir = scratch("view-backward");
    let trace = crate::torch::torch_trace(script, &dir);
    let page = dir.join("backward.html");
    oomtrace_in(
        &dir,
        &[
            "view",
            trace.to_str().unwrap(),
            "-o",
            page.to_str().unwrap(),
        ],
    );
    let html = std::fs::read_to_string(&page).unwrap();
    let dom = rendered_dom(&browser, &dir, &page);
    let legend = site_labels(between(&dom, "<div class=\"legend\">", "</div>"));
    let rows = site_labels(between(&dom, "<table class=\"sites\">", "</table>"));
    for (what, labels) in [("legend", &legend), ("call sites", &rows)] {
        assert!(
            labels.iter().any(|l| l.starts_with(&addmm)),
            "the {what} does not name {addmm}: {labels:#?}"
        );
        for l in labels {
            assert!(
                !l.contains("::") && !l.contains("Backward0") && !l.contains("no Python frames"),
                "the {what} names a backward site in C++: {l}"
            );
        }
    }
    // The findings (what was live at exit) carry the same names.
    let data = page_data(&html);
    let culprits: Vec<&str> = data["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["culprit_label"].as_str())
        .collect();
    assert!(culprits.contains(&addmm.as_str()), "{culprits:#?}");
    assert!(
        !culprits.iter().any(|l| l.contains("Backward0")),
        "{culprits:#?}"
    );
    // The Python flame graph: the backward pass under the frames its forward lines share (the
    // call of the model), never under "(no Python frames)".
    let flame = between(&dom, "<div class=\"flame\"", "</div></div>");
    assert!(flame.contains("data-frames=\"python\""), "{flame}");
    assert!(flame.contains(">backward of addmm<"), "{flame}");
    assert!(!flame.contains("no Python frames"), "{flame}");
    let cuda0 = &data["processes"][0]["devices"][0];
    let nodes = cuda0["python_flames"]["end"]["nodes"].as_array().unwrap();
    let at = nodes
        .iter()
        .position(|n| n[1] == "backward of addmm")
        .expect("a backward node in the flame graph");
    // Its ancestors, outermost first: the line that called the model leads them.
    let mut ancestors: Vec<&str> = Vec::new();
    let mut depth = nodes[at][0].as_u64().unwrap();
    for n in nodes[..at].iter().rev() {
        if n[0].as_u64().unwrap() + 1 == depth {
            ancestors.insert(0, n[1].as_str().unwrap());
            depth -= 1;
        }
    }
    let call = crate::torch::torch_script_line(script, "# FORWARD CALL");
    assert_eq!(ancestors.first(), Some(&"all"), "{ancestors:?}");
    assert_eq!(
        ancestors.get(1).copied(),
        Some(format!("{script}:{call} <module>").as_str()),
        "not under the forward lines: {ancestors:?}"
    );
}

/// `run --segments` of a Python training loop (the stand-in torch, with a caching allocator):
/// the page plots PyTorch's own readings at each step (allocated and reserved, read by the step
/// hook) with the gap between them shaded, as lines over the segments; a fragmentation finding
/// is marked on the time axis at its onset and detection (a report's finding put into the
/// page's data, as the detector's evidence carries `onset_s` and `detected_s`); and a device
/// with tensors shades the gap between its tensors and its reserve.
#[test]
fn segment_mode_plots_pytorchs_readings_and_marks_fragmentation() {
    let Some(browser) = chromium() else {
        precondition(false, "chromium (apt-get install chromium)");
        return;
    };
    let dir = scratch("view-segments");
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/python");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir)
        .args([
            "run",
            "--segments",
            "--json",
            "r.json",
            "-o",
            "t.oomt",
            "--",
            "python3",
        ])
        .arg(scripts.join("train_leak.py"))
        .arg("12")
        .env("PYTHONPATH", scripts.join("site-packages"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("FAKE_TORCH_CACHING", "1");
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    oomtrace_in(&dir, &["view", "t.oomt", "-o", "v.html"]);
    let page = dir.join("v.html");
    let html = std::fs::read_to_string(&page).unwrap();
    let mut data = page_data(&html);
    let proc = data["processes"][0].clone();
    let cuda0 = proc["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == 0)
        .expect("cuda:0")
        .clone();
    assert_eq!(cuda0["tensors"], false);
    let readings = cuda0["torch_memory"].as_array().unwrap();
    assert_eq!(readings.len(), 12, "{readings:?}");
    // [t, allocated, max allocated, reserved]; the last is the report's.
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    let last = &report["processes"][0]["devices"][0]["torch_memory"];
    let r = &readings[11];
    assert_eq!(
        (&r[1], &r[2], &r[3]),
        (
            &last["allocated_bytes"],
            &last["max_allocated_bytes"],
            &last["reserved_bytes"]
        ),
        "{last}"
    );
    assert!(
        r[3].as_u64() > r[1].as_u64(),
        "reserved above allocated: {r}"
    );
    // The JSON lines export carries each reading too.
    oomtrace_in(
        &dir,
        &["export", "--format", "json", "t.oomt", "-o", "e.jsonl"],
    );
    let lines: Vec<Value> = std::fs::read_to_string(dir.join("e.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "torch_memory")
        .collect();
    assert_eq!(lines.len(), 12);
    assert_eq!(
        lines[11]["reserved_bytes"], last["reserved_bytes"],
        "{}",
        lines[11]
    );
    for w in readings.windows(2) {
        assert!(w[0][0].as_f64() <= w[1][0].as_f64(), "{readings:?}");
    }

    // A fragmentation finding on cuda:0, and a device with tensors (the data the page gets
    // from a `--torch` trace: points [t, total, layers, tensors, reserve]).
    let pid = proc["pid"].clone();
    data["findings"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "kind": "fragmentation", "level": "warning", "pid": pid, "device": 0,
            "message": "PyTorch's reserve grows while its tensors do not",
            "evidence": {"onset_s": 0.0, "detected_s": 0.001},
        }));
    let mut tensors = cuda0.clone();
    tensors["device"] = 1.into();
    tensors["label"] = "cuda:1".into();
    tensors["tensors"] = true.into();
    tensors["layers"] = serde_json::json!([]);
    tensors["sites"] = serde_json::json!([]);
    tensors["torch_memory"] = serde_json::json!([]);
    let t = proc["axis_start_s"].as_f64().unwrap();
    tensors["points"] = serde_json::json!([
        [t + 0.001, 64 << 20, [], 8 << 20, 64 << 20],
        [t + 0.002, 96 << 20, [], 16 << 20, 96 << 20]
    ]);
    data["processes"][0]["devices"]
        .as_array_mut()
        .unwrap()
        .push(tensors);
    let json = data.to_string().replace('<', "\\u003c");
    let start = html
        .find("<script id=\"data\" type=\"application/json\">")
        .unwrap();
    let body = start + html[start..].find('>').unwrap() + 1;
    let end = body + html[body..].find("</script>").unwrap();
    std::fs::write(&page, format!("{}{json}{}", &html[..body], &html[end..])).unwrap();

    let dom = rendered_dom(&browser, &dir, &page);
    let svgs: Vec<&str> = dom
        .split("<svg ")
        .skip(1)
        .map(|s| s.split("</svg>").next().unwrap())
        .collect();
    assert_eq!(svgs.len(), 2, "{dom}");
    let (seg, ten) = (svgs[0], svgs[1]);
    for class in ["torch-reserved", "torch-allocated", "gap"] {
        assert_eq!(
            seg.matches(&format!("class=\"{class}\"")).count(),
            1,
            "{class} in {seg}"
        );
    }
    assert!(
        between(seg, "class=\"gap\"", "</path>").contains("peak gap "),
        "{seg}"
    );
    assert!(
        dom.contains("torch.cuda.memory_reserved()</span>"),
        "no legend"
    );
    // Every reading lies inside the plot (x from 70 to 1120: the chart's margins).
    let line = between(seg, "class=\"torch-reserved\" d=\"M", "\" fill");
    for point in line
        .trim_start_matches("class=\"torch-reserved\" d=\"M")
        .split('L')
    {
        let x: f64 = point.split(',').next().unwrap().parse().unwrap();
        assert!((70.0..=1120.0).contains(&x), "{x} outside the plot: {line}");
    }
    // The finding's moments, on cuda:0's axis only.
    assert_eq!(
        texts_after(seg, "class=\"finding-label\"")
            .iter()
            .filter(|t| t.contains("fragmentation onset") || t.contains("fragmentation detected"))
            .count(),
        2,
        "{seg}"
    );
    assert_eq!(seg.matches("><title>fragmentation ").count(), 2, "{seg}");
    assert_eq!(ten.matches("><title>fragmentation ").count(), 0, "{ten}");
    // With tensors the gap is shaded from the tensors up to the reserve; no readings drawn.
    assert_eq!(ten.matches("class=\"gap\"").count(), 1, "{ten}");
    assert!(
        between(ten, "class=\"gap\"", "</path>").contains("(peak gap 80.0 MiB)"),
        "{ten}"
    );
    assert_eq!(ten.matches("class=\"torch-reserved\"").count(), 0, "{ten}");
}

/// The view says what the memory is (docs/anatomy.md) for a PyTorch trace, above the chart by
/// call site: the peak as one bar split into the roles, the cache not in tensors and the memory
/// outside PyTorch (each part drawn, the largest activations named by their line), and the
/// live tensors by role after each step; the chart by call site a click away.
#[test]
fn a_pytorch_trace_shows_what_the_memory_is() {
    let Some(browser) = chromium() else {
        precondition(false, "chromium (apt-get install chromium)");
        return;
    };
    let dir = scratch("view-anatomy");
    // A batch large enough that the peak comes in the backward pass, with activations, on
    // every release (with small ones 2.4 peaks in Adam's first step, after the backward).
    let trace = crate::torch::torch_trace_with("anatomy.py", &dir, &[("BATCH", "4096")]);
    let page = dir.join("anatomy.html");
    oomtrace_in(
        &dir,
        &[
            "view",
            trace.to_str().unwrap(),
            "-o",
            page.to_str().unwrap(),
        ],
    );
    let dom = rendered_dom(&browser, &dir, &page);
    let panel = between(&dom, "<h3>What the memory is</h3>", "<h3 id=\"chart-");
    for part in ["parameter", "optimizer_state", "gap", "outside"] {
        assert!(
            panel.contains(&format!("data-part=\"{part}\"")),
            "no {part} in the peak's bar: {panel}"
        );
    }
    let line = crate::torch::torch_script_line("anatomy.py", "out = model(x)");
    for words in [
        "At the peak:",
        "parameters ",
        "optimizer state ",
        "PyTorch's cache, not in tensors",
        "outside PyTorch's allocator",
        "By call site",
        "Live tensors by role after each step",
    ] {
        assert!(panel.contains(words), "{words:?} not in: {panel}");
    }
    assert!(
        panel.contains(&format!("made at anatomy.py:{line}")),
        "the activations' line: {panel}"
    );
    for role in ["parameter", "gradient", "optimizer_state"] {
        assert!(
            panel.contains(&format!("data-role=\"{role}\"")),
            "no {role} area in the steps chart: {panel}"
        );
    }
}
