//! A call site's stack as text: its Python frames, its native frames folded or shown,
//! the backward pass's node and forward lines.

use super::*;

/// A frame's function as text: a C++ name shortened, `??` when unknown.
pub(super) fn function_text(f: &FrameInfo) -> String {
    if f.function.is_empty() {
        "??".into()
    } else if f.python {
        ellipsize(&f.function, 2 * MAX_FILE)
    } else {
        short_function(&f.function)
    }
}

pub(super) fn frame_text(f: &FrameInfo) -> String {
    let func = function_text(f);
    let file = f.file.rsplit('/').next().unwrap_or(&f.file);
    let file = ellipsize(file, MAX_FILE);
    let file = file.as_str();
    match (file.is_empty(), f.module.is_empty()) {
        (false, _) if f.line > 0 => format!("{func}  {file}:{}", f.line),
        (false, _) => format!("{func}  {file}"),
        (true, false) => format!("{func}  [{} +{}]", ellipsize(&f.module, MAX_FILE), f.offset),
        (true, true) => format!("{func}  [{}]", f.address),
    }
}

/// Startup frames that say nothing about the program.
pub(super) fn is_runtime_start(f: &FrameInfo) -> bool {
    matches!(
        f.function.as_str(),
        "__libc_start_call_main"
            | "__libc_start_main"
            | "_start"
            | "__libc_start_main_impl"
            | "start_thread"
            | "clone3"
            | "__clone3"
    )
}

/// The Python frames of `stack`, in the JSON's order (innermost first), the culprit (the
/// innermost frame of the user's own code) led by "at". The user's frames are all shown; each
/// run of library frames (PyTorch's, the standard library's) is one line naming them,
/// `(3 torch.nn frames)`, unless `opts.full` (`report --full`), and the culprit is shown even
/// where it is a library's (a stack with no frame of the user's). Returns false when the
/// stack has no Python frame.
pub(super) fn python_text(
    out: &mut String,
    stack: &[FrameInfo],
    indent: &str,
    opts: &TextOptions,
) -> bool {
    let culprit = culprit(stack).filter(|c| c.python);
    let mut any = false;
    // The run of library frames not yet said: how many, and their libraries in order.
    let mut run: (usize, Vec<String>) = (0, Vec::new());
    let flush = |out: &mut String, run: &mut (usize, Vec<String>)| {
        if run.0 > 0 {
            let s = if run.0 == 1 { "" } else { "s" };
            let _ = writeln!(out, "{indent}   ({} {} frame{s})", run.0, run.1.join(", "));
            *run = (0, Vec::new());
        }
    };
    for f in stack.iter().filter(|f| f.python) {
        any = true;
        let is_culprit = culprit.is_some_and(|c| std::ptr::eq(c, f));
        if !opts.full && !is_culprit {
            if let Some(library) = python_library(f) {
                run.0 += 1;
                if !run.1.contains(&library) {
                    run.1.push(library);
                }
                continue;
            }
        }
        flush(out, &mut run);
        let lead = if is_culprit { "at " } else { "   " };
        let _ = writeln!(out, "{indent}{lead}{}", frame_text(f));
    }
    flush(out, &mut run);
    any
}

/// The native frames of `frames` for one line, innermost first: each by its short name, and
/// (unless `opts.native`) each run of PyTorch's own C++ frames as one part,
/// `14 PyTorch C++ frames`.
pub(super) fn native_parts(frames: &[&FrameInfo], opts: &TextOptions) -> Vec<String> {
    let mut parts = Vec::new();
    let mut folded = 0usize;
    let fold = |parts: &mut Vec<String>, folded: &mut usize| {
        if *folded > 0 {
            let s = if *folded == 1 { "" } else { "s" };
            parts.push(format!("{folded} PyTorch C++ frame{s}"));
            *folded = 0;
        }
    };
    // Consecutive frames of one unnamed module are one part: `libcublas.so.13 (4 frames)`.
    let mut repeated = 0usize;
    for f in frames {
        if !opts.native && FrameRole::of(f) == FrameRole::Interpreter {
            // The interpreter between two Python frames: its Python frames say it.
            continue;
        }
        if !opts.native && is_torch_frame(f) {
            folded += 1;
            continue;
        }
        fold(&mut parts, &mut folded);
        let part = if f.function.is_empty() {
            ellipsize(f.module.rsplit('/').next().unwrap_or(&f.module), MAX_FILE)
        } else {
            function_text(f)
        };
        if f.function.is_empty() && parts.last().is_some_and(|p| p.starts_with(&part)) {
            repeated += 1;
            if let Some(last) = parts.last_mut() {
                *last = format!("{part} ({} frames)", repeated + 1);
            }
            continue;
        }
        repeated = 0;
        parts.push(part);
    }
    fold(&mut parts, &mut folded);
    parts
}

/// A call site's stack. With Python frames: all of them (see `python_text`), then the native
/// frames that led from the innermost one to CUDA, on one line. Without: up to
/// `native_frames` native frames. PyTorch's own C++ frames are folded unless `opts.native`.
pub(super) fn stack_text(
    out: &mut String,
    stack: &[FrameInfo],
    indent: &str,
    native_frames: usize,
    opts: &TextOptions,
) {
    if stack.is_empty() {
        let _ = writeln!(out, "{indent}(no stack recorded)");
        return;
    }
    if python_text(out, stack, indent, opts) {
        let native: Vec<&FrameInfo> = stack
            .iter()
            .take_while(|f| !f.python)
            .filter(|f| !f.function.is_empty() || !f.module.is_empty())
            .collect();
        let parts = native_parts(&native, opts);
        let shown = if opts.native { native_frames } else { 4 };
        if !parts.is_empty() {
            let more = if parts.len() > shown { " ..." } else { "" };
            let parts: Vec<&str> = parts.iter().take(shown).map(String::as_str).collect();
            let _ = writeln!(out, "{indent}   (native: {}{more})", parts.join(" <- "));
        }
        return;
    }
    let shown: Vec<&FrameInfo> = stack.iter().filter(|f| !is_runtime_start(f)).collect();
    // The listing opens at the culprit: the CUDA runtime and allocator frames it called
    // (a static runtime's `cudaMalloc` and hashed internals) follow on one line.
    let start = culprit(stack)
        .and_then(|c| shown.iter().position(|f| std::ptr::eq(*f, c)))
        .unwrap_or(0);
    let (inside, shown) = shown.split_at(start);
    // Each line: a frame, or a run of PyTorch's own frames folded into one.
    let mut lines: Vec<String> = Vec::new();
    let mut folded = 0usize;
    for f in shown {
        if !opts.native && is_torch_frame(f) {
            folded += 1;
            continue;
        }
        if folded > 0 {
            lines.push(format!("... {folded} PyTorch C++ frames"));
            folded = 0;
        }
        lines.push(frame_text(f));
    }
    if folded > 0 {
        lines.push(format!(
            "... {folded} PyTorch C++ frames (--native shows them)"
        ));
    }
    for (i, line) in lines.iter().take(native_frames).enumerate() {
        let lead = if i == 0 && !line.starts_with("...") {
            "at "
        } else {
            "   "
        };
        let _ = writeln!(out, "{indent}{lead}{line}");
    }
    if lines.len() > native_frames {
        let _ = writeln!(
            out,
            "{indent}   ... {} more frames",
            lines.len() - native_frames
        );
    }
    if !inside.is_empty() {
        // Outermost first, as the calls were made; a long way down keeps its two ends.
        let outermost_first: Vec<&FrameInfo> = inside.iter().rev().copied().collect();
        let mut calls = native_parts(&outermost_first, opts);
        if calls.len() > INSIDE_CALLS {
            let more = format!("... {} more", calls.len() - INSIDE_CALLS + 1);
            let last = calls.pop().unwrap_or_default();
            calls.truncate(INSIDE_CALLS - 2);
            calls.push(more);
            calls.push(last);
        }
        let _ = writeln!(out, "{indent}   (which calls {})", calls.join(" -> "));
    }
}

/// For a call site in PyTorch's backward pass: its autograd node and the forward lines that
/// ran its op, on one line; for an allocation of the autograd engine outside any node, its
/// name (the lines that ran the backward pass).
pub(super) fn backward_text(out: &mut String, f: &Finding, indent: &str) {
    let Some(b) = &f.backward_node else {
        if in_backward(&f.stack) && !f.site_name.is_empty() {
            let _ = writeln!(out, "{indent}in the backward pass: {}", f.site_name);
        }
        return;
    };
    let forward = if b.forward_lines.is_empty() {
        String::new()
    } else {
        format!(
            "; its forward op `{}` ran at {}",
            b.forward_op,
            fmt_python_lines(&b.forward_lines, "allocation", 3)
        )
    };
    let _ = writeln!(
        out,
        "{indent}in the backward pass, autograd node {}{forward}",
        b.name
    );
}

/// Whether a stack has Python frames (its place is then shown as the Python stack).
pub(super) fn has_python(stack: &[FrameInfo]) -> bool {
    stack.iter().any(|f| f.python)
}
