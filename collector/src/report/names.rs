//! Names for text: C++ functions shortened to what a reader recognises, and PyTorch's own C++
//! frames told apart so that a text report can fold them. The JSON keeps every frame under
//! its full name; only the text shortens and folds.
//!
//! A demangled C++ name carries its return type, template arguments, argument list and
//! clone suffixes: `bool at::cuda::blas::gemm_and_bias<float, float>(bool, long, ...) [clone
//! .constprop.0]` is one frame of 300 characters. [`short_function`] keeps the last two
//! components of the qualified name (`blas::gemm_and_bias`, `DeviceCachingAllocator::alloc_block`):
//! the class and the method, or the namespace and the function.

use super::backward::Backward;
use super::hints::thread_kind;
use super::symbolize::culprit;
use crate::model::FrameInfo;

/// The longest name [`short_function`] returns; longer ones keep their two ends.
pub const MAX_NAME: usize = 80;

/// The widest file name in a call site's name.
const MAX_FILE: usize = 60;

/// A call site's name in one line, the one rule of every list that names sites (the report's
/// tables, `diff`, the sections' and findings' `name`): its culprit frame as `file:line
/// function` when it is Python; in PyTorch's backward pass, `backward` (`backward of addmm at
/// train.py:25`, see [`Backward`]); PyTorch's own code with no Python line above it, the kind
/// of thread it ran on and the function; else the culprit's short name, module and offset or
/// address. `backward` is the site's backward-pass place (`backward::Lookup`, which needs
/// the process's other sites); without it a backward-pass site is named by its node alone.
pub fn site_name(stack: &[FrameInfo], backward: Option<&Backward>) -> String {
    let top = culprit(stack).or(stack.first());
    if let Some(b) = backward {
        return b.to_string();
    }
    match top {
        None => "(no stack)".into(),
        Some(f) if f.python => format!(
            "{}:{} {}",
            ellipsize(f.file.rsplit('/').next().unwrap_or(&f.file), MAX_FILE),
            f.line,
            ellipsize(&f.function, 2 * MAX_FILE)
        ),
        Some(_) if super::roles::backward_node(stack).is_some() => format!(
            "{} (backward pass)",
            super::roles::backward_node(stack).unwrap_or_default()
        ),
        // PyTorch's own code with no Python line above it: the thread it ran on, and the
        // function's own name.
        Some(f) if is_torch_frame(f) => {
            let short = short_function(&f.function);
            let name = short.rsplit("::").next().unwrap_or(&short);
            format!("{}: {name}", thread_kind(stack))
        }
        Some(f) if !f.function.is_empty() => short_function(&f.function),
        Some(f) if !f.module.is_empty() => format!(
            "{} +{}",
            ellipsize(f.module.rsplit('/').next().unwrap_or(&f.module), MAX_FILE),
            f.offset
        ),
        Some(f) => f.address.clone(),
    }
}

/// Namespaces of PyTorch's C++ code (c10, ATen, the autograd engine, the Python bindings).
const TORCH_NAMESPACES: [&str; 4] = ["c10::", "at::", "torch::", "caffe2::"];

/// Module files of PyTorch's C++ code: `libtorch_cpu.so`, `libtorch_cuda.so`,
/// `libtorch_python.so`, `libc10.so`, `libc10_cuda.so`.
const TORCH_MODULES: [&str; 2] = ["libtorch", "libc10"];

/// `name` without the groups opened by `open` and closed by `close` (balanced, nested),
/// except those that are part of an operator's name (`operator<`, `operator()`).
fn without_groups(name: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(name.len());
    let mut depth = 0usize;
    for c in name.chars() {
        let operator_name =
            out.ends_with("operator") || (open == '<' && out.ends_with("operator<"));
        if depth == 0 && c == open && !operator_name {
            depth = 1;
            continue;
        }
        if depth > 0 {
            if c == open {
                depth += 1;
            } else if c == close {
                depth -= 1;
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Splits `name` at `::` outside parentheses, braces and angle brackets.
fn components(name: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let bytes = name.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'(' | b'{' | b'<' => depth += 1,
            b')' | b'}' | b'>' => depth -= 1,
            b':' if depth == 0 && bytes.get(i + 1) == Some(&b':') => {
                parts.push(&name[start..i]);
                i += 2;
                start = i;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&name[start..]);
    parts
}

/// The qualified name of a demangled C++ function, without its return type, template
/// arguments, argument list, cv-qualifiers and clone suffixes:
/// `c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block`. A plain C
/// name is returned as it is.
pub fn qualified_name(name: &str) -> String {
    let mut s = name.trim();
    // `[clone .constprop.0]`, `[clone .cold]`: the compiler's copies of one function.
    while let Some(i) = s.rfind(" [clone ") {
        if !s.ends_with(']') {
            break;
        }
        s = s[..i].trim_end();
    }
    // The argument list: the last parenthesised group, with what may follow it.
    let mut s = s.to_string();
    for suffix in [" const", " volatile", " &&", " &", " noexcept"] {
        while let Some(rest) = s.strip_suffix(suffix) {
            s = rest.to_string();
        }
    }
    let s = without_groups(&s, '<', '>');
    let s = {
        // Lambdas keep their name (`{lambda()#1}` -> `{lambda#1}`), anything else in braces goes.
        let mut out = String::new();
        let mut rest = s.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let Some(close) = rest[open..].find('}') else {
                out.push_str(&rest[open..]);
                rest = "";
                break;
            };
            let inner = &rest[open + 1..open + close];
            let number = inner.rsplit('#').next().filter(|_| inner.contains('#'));
            match (inner.starts_with("lambda"), number) {
                (true, Some(n)) => out.push_str(&format!("{{lambda#{n}}}")),
                (true, None) => out.push_str("{lambda}"),
                _ => out.push_str("{...}"),
            }
            rest = &rest[open + close + 1..];
        }
        out.push_str(rest);
        out
    };
    let s = s.replace("(anonymous namespace)", "{anon}");
    let s = without_groups(&s, '(', ')');
    let s = s.replace("{anon}", "(anonymous namespace)");
    // The return type: what lies before the last space outside any group, unless that space
    // belongs to an operator's name (`operator new`, `operator unsigned long`).
    let mut depth = 0i32;
    let mut cut = None;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '{' | '<' => depth += 1,
            ')' | '}' | '>' => depth -= 1,
            ' ' if depth == 0 => cut = Some(i),
            _ => {}
        }
    }
    let s = match cut {
        Some(i) if !s[..i].contains("operator") => s[i + 1..].to_string(),
        Some(_) => {
            // Keep from the component holding `operator`.
            let start = s.find("operator").unwrap_or(0);
            let head = s[..start].rfind(' ').map_or(0, |i| i + 1);
            s[head..].to_string()
        }
        None => s,
    };
    s.trim().to_string()
}

/// A function's name for text: [`qualified_name`] cut to its last two components (an
/// anonymous namespace does not count as one), at most [`MAX_NAME`] characters.
/// `c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block(...)` ->
/// `DeviceCachingAllocator::alloc_block`.
pub fn short_function(name: &str) -> String {
    if !name.contains("::") && !name.contains('(') && name.chars().count() <= MAX_NAME {
        return name.to_string();
    }
    let q = qualified_name(name);
    let parts: Vec<&str> = components(&q)
        .into_iter()
        .filter(|p| !p.is_empty() && *p != "(anonymous namespace)")
        .collect();
    let short = match parts.len() {
        0 => q.clone(),
        n => parts[n.saturating_sub(2)..].join("::"),
    };
    ellipsize(&short, MAX_NAME)
}

/// `s` in at most `max` characters: its two ends around `...` when it is longer.
pub fn ellipsize(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max || max < 5 {
        return s.to_string();
    }
    let keep = max - 3;
    let head: String = s.chars().take(keep / 2).collect();
    let tail: String = s.chars().skip(n - (keep - keep / 2)).collect();
    format!("{head}...{tail}")
}

/// Whether a native frame is PyTorch's own C++ code: its function is in one of PyTorch's
/// namespaces (c10, at, torch), or its module is one of PyTorch's libraries. A Python frame
/// never is (`torch/nn/modules/linear.py` is what the user called).
pub fn is_torch_frame(f: &FrameInfo) -> bool {
    if f.python {
        return false;
    }
    let module = f.module.rsplit('/').next().unwrap_or(&f.module);
    if TORCH_MODULES.iter().any(|m| module.starts_with(m)) {
        return true;
    }
    if f.function.is_empty() {
        return false;
    }
    let q = qualified_name(&f.function);
    TORCH_NAMESPACES.iter().any(|ns| q.starts_with(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cxx_names_lose_arguments_templates_return_types_and_clones() {
        let cases = [
            (
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::AllocParams&, bool, std::shared_ptr<c10::GatheredContext> const&, std::unique_lock<std::recursive_mutex>&)",
                "DeviceCachingAllocator::alloc_block",
            ),
            (
                "torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
                "AddmmBackward0::apply",
            ),
            (
                "bool at::cuda::blas::gemm_and_bias<float, float>(bool, bool, long, long, long, float, float const*, long) [clone .constprop.0]",
                "blas::gemm_and_bias",
            ),
            (
                "at::cuda::getCurrentCUDABlasHandleImpl(void*, unsigned long, at::cuda::(anonymous namespace)::WorkspaceMode, bool) [clone .constprop.0]",
                "cuda::getCurrentCUDABlasHandleImpl",
            ),
            (
                "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
                "Node::operator()",
            ),
            (
                "c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::foo(int) const",
                "Native::foo",
            ),
            (
                "at::native::(anonymous namespace)::launch()::{lambda()#1}::operator()() const",
                "{lambda#1}::operator()",
            ),
            ("std::vector<int, std::allocator<int> >::operator<(int)", "vector::operator<"),
            ("cudaMalloc", "cudaMalloc"),
            ("history_append", "history_append"),
            ("Linear.forward", "Linear.forward"),
            ("", ""),
        ];
        for (long, short) in cases {
            assert_eq!(short_function(long), short, "{long}");
        }
        assert_eq!(
            qualified_name("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)"),
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"
        );
        assert_eq!(
            qualified_name("_object* torch::autograd::python_foo<int>(_object*, _object*)"),
            "torch::autograd::python_foo"
        );
    }

    #[test]
    fn long_names_keep_their_two_ends() {
        let long = format!("ns::{}", "x".repeat(200));
        let short = short_function(&long);
        assert_eq!(short.chars().count(), MAX_NAME);
        assert!(short.starts_with("ns::xxx") && short.contains("...") && short.ends_with("xx"));
        assert_eq!(ellipsize("abc", 5), "abc");
        assert_eq!(ellipsize("abcdefgh", 7), "ab...gh");
    }

    #[test]
    fn pytorch_frames_by_namespace_or_library() {
        let f = |function: &str, module: &str, python: bool| FrameInfo {
            function: function.into(),
            module: module.into(),
            python,
            ..Default::default()
        };
        assert!(is_torch_frame(&f(
            "c10::cuda::X::malloc(unsigned long)",
            "",
            false
        )));
        assert!(is_torch_frame(&f(
            "bool at::cuda::blas::gemm<float>(char)",
            "libtorch_cuda.so",
            false
        )));
        assert!(is_torch_frame(&f("", "libtorch_cpu.so", false)));
        assert!(is_torch_frame(&f(
            "THPVariable_add",
            "libtorch_python.so",
            false
        )));
        assert!(is_torch_frame(&f(
            "??",
            "/venv/torch/lib/libc10_cuda.so",
            false
        )));
        assert!(!is_torch_frame(&f(
            "cublasCreate_v2",
            "libcublas.so.13",
            false
        )));
        assert!(!is_torch_frame(&f(
            "my_ext::forward(at::Tensor)",
            "my_ext.so",
            false
        )));
        assert!(!is_torch_frame(&f("Linear.forward", "python", true)));
        assert!(!is_torch_frame(&f(
            "std::thread::_State_impl::_M_run()",
            "libstdc++.so.6",
            false
        )));
    }
}
