//! How the page names call sites and frames: one rule for every legend entry, call-site row,
//! OOM row and finding, `file:line function` of the site's culprit frame (the frame every
//! report names a site by, [`crate::export::view::culprit`]), so that a reader can go to the
//! line; C++ names are folded to their last components (`AddmmBackward0.apply`, never a
//! qualified name with its template and argument lists). Distinct sites that would share a
//! label are told apart ([`distinct`]).

use std::collections::HashMap;

use oomtrace_collector::report::names::qualified_name;

use crate::export::view::{culprit, is_machinery, Frame};

/// The last path component of a file (`/src/train.py` -> `train.py`).
fn base_name(file: &str) -> &str {
    file.rsplit('/').next().unwrap_or(file)
}

/// A native function's name with its template and argument lists elided and its namespaces
/// kept (`at::native::linear`), as the native flame graph shows it: short enough for a box,
/// the full name is in the box's tooltip. The report's rule
/// ([`oomtrace_collector::report::names::qualified_name`]), so that text and page agree.
pub fn elided(function: &str) -> String {
    qualified_name(function)
}

/// A native function's name folded for a label: template and argument lists elided, then only
/// the method and its class (a component that starts upper-case, as PyTorch's classes do)
/// kept, joined by `.` as Python names a method:
/// `torch::autograd::generated::AddmmBackward0::apply(...)` -> `AddmmBackward0.apply`,
/// `at::native::linear(...)` -> `linear`. C names are unchanged.
pub fn folded(function: &str) -> String {
    let name = elided(function);
    let parts: Vec<&str> = name.split("::").filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        [] => name.clone(),
        [one] => (*one).to_string(),
        [.., class, method] if class.starts_with(|c: char| c.is_ascii_uppercase()) => {
            format!("{class}.{method}")
        }
        [.., method] => (*method).to_string(),
    }
}

/// One frame as a label: `file:line function` (the file's last component; a Python frame's
/// function is its qualified name), else `module function` for a native frame without line
/// information, else the module and offset or the address.
pub fn frame_label(f: &Frame) -> String {
    let function = if f.python {
        f.function.clone()
    } else {
        folded(&f.function)
    };
    if !f.file.is_empty() && (f.python || !f.function.is_empty()) {
        let file = base_name(&f.file);
        return if f.line > 0 {
            format!("{file}:{} {function}", f.line)
        } else {
            format!("{file} {function}")
        };
    }
    match (function.is_empty(), f.module.is_empty()) {
        (false, false) => format!("{} {function}", f.module),
        (false, true) => function,
        (true, false) if !f.offset.is_empty() => format!("{}+{}", f.module, f.offset),
        _ if !f.address.is_empty() => f.address.clone(),
        _ => "??".into(),
    }
}

/// A call site's label: its culprit frame's ([`frame_label`]); "(no stack recorded)" without
/// frames.
pub fn site_label(frames: &[Frame]) -> String {
    culprit(frames).map_or_else(
        || "(no stack recorded)".to_string(),
        |i| frame_label(&frames[i]),
    )
}

/// What may tell a site apart from others of the same label, most telling first: its other
/// Python frames, innermost first, then its native frames that are not machinery (CUDA,
/// allocator, interpreter), each as [`frame_label`], without repeats or the label itself.
pub fn site_details(frames: &[Frame]) -> Vec<String> {
    let base = site_label(frames);
    let culprit = culprit(frames);
    let mut out: Vec<String> = Vec::new();
    for python in [true, false] {
        for (i, f) in frames.iter().enumerate() {
            if Some(i) == culprit || f.python != python || (!python && is_machinery(f)) {
                continue;
            }
            let l = frame_label(f);
            if l != base && l != "??" && !out.contains(&l) {
                out.push(l);
            }
        }
    }
    out
}

/// Makes labels unique. In each group of sites that share a label, a site gets the first of
/// its details (see [`site_details`]) that no other site of the group has, else the first
/// that one of them lacks (`label (via ...)`); where that is not enough, its number
/// (`label [site 12]`). `sites` are (number, label, details) in the page's order; the labels
/// come back in the same order.
pub fn distinct(sites: &[(u32, String, Vec<String>)]) -> Vec<String> {
    let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, (_, label, _)) in sites.iter().enumerate() {
        groups.entry(label.as_str()).or_default().push(i);
    }
    let with_detail: Vec<String> = sites
        .iter()
        .enumerate()
        .map(|(i, (_, label, details))| {
            let group = &groups[label.as_str()];
            if group.len() < 2 {
                return label.clone();
            }
            let others = || group.iter().filter(|&&j| j != i).map(|&j| &sites[j].2);
            let unique = details.iter().find(|d| others().all(|o| !o.contains(d)));
            let some_lack = || details.iter().find(|d| others().any(|o| !o.contains(d)));
            match unique.or_else(some_lack) {
                Some(d) => format!("{label} (via {d})"),
                None => label.clone(),
            }
        })
        .collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for label in &with_detail {
        *count.entry(label.as_str()).or_default() += 1;
    }
    with_detail
        .iter()
        .zip(sites)
        .map(|(label, (number, _, _))| {
            if count[label.as_str()] > 1 {
                format!("{label} [site {number}]")
            } else {
                label.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(function: &str, file: &str, line: u32, module: &str) -> Frame {
        Frame {
            function: function.into(),
            file: file.into(),
            line,
            module: module.into(),
            offset: "0x10".into(),
            address: "0x7f0010".into(),
            ..Default::default()
        }
    }

    fn python(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            function: function.into(),
            file: file.into(),
            line,
            module: "python".into(),
            python: true,
            ..Default::default()
        }
    }

    const ALLOC_BLOCK: &str = "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::\
        alloc_block(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::AllocParams&, \
        bool, std::shared_ptr<c10::GatheredContext> const&, std::unique_lock<std::recursive_mutex>&)";

    #[test]
    fn cpp_names_are_folded_to_class_and_method() {
        assert_eq!(
            folded("torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
            "AddmmBackward0.apply"
        );
        assert_eq!(folded(ALLOC_BLOCK), "DeviceCachingAllocator.alloc_block");
        assert_eq!(
            folded("bool at::cuda::blas::gemm_and_bias<float, float>(bool, long)"),
            "gemm_and_bias"
        );
        assert_eq!(
            folded("at::cuda::getCurrentCUDABlasHandleImpl(void*, unsigned long, at::cuda::(anonymous namespace)::WorkspaceMode, bool) [clone .constprop.0]"),
            "getCurrentCUDABlasHandleImpl"
        );
        assert_eq!(folded("keep_history"), "keep_history");
        assert_eq!(
            elided("at::native::linear(at::Tensor const&, at::Tensor const&)"),
            "at::native::linear"
        );
        // Unbalanced: cut at the argument list, never garbled.
        assert_eq!(folded("ns::operator<(int)"), "operator<");
    }

    /// The culprit of a tensor allocated by a library line is the user's own Python line, as
    /// `file:line function`; a backward-pass allocation (no Python frames) is named by its
    /// autograd node, folded; no label holds a C++ qualified name.
    #[test]
    fn sites_are_labelled_by_their_culprits_line() {
        let forward = vec![
            native(ALLOC_BLOCK, "", 0, "libc10_cuda.so"),
            native(
                "at::native::linear(at::Tensor const&)",
                "",
                0,
                "libtorch_cpu.so",
            ),
            python(
                "Linear.forward",
                "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
                134,
            ),
            python("train_step", "/home/me/common.py", 37),
            python("<module>", "/home/me/train.py", 9),
        ];
        assert_eq!(site_label(&forward), "common.py:37 train_step");
        assert_eq!(
            site_details(&forward),
            vec![
                "linear.py:134 Linear.forward",
                "train.py:9 <module>",
                "libtorch_cpu.so linear"
            ]
        );
        let backward = vec![
            native(ALLOC_BLOCK, "", 0, "libc10_cuda.so"),
            native(
                "torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor>&&)",
                "",
                0,
                "libtorch_cpu.so",
            ),
            native("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "", 0, "libtorch_cpu.so"),
        ];
        assert_eq!(
            site_label(&backward),
            "libtorch_cpu.so AddmmBackward0.apply"
        );
        let c = vec![
            native("cudaMalloc", "", 0, "libcudart.so.12"),
            native("keep_history", "/src/train_demo.c", 63, "train_demo"),
            native("main", "/src/train_demo.c", 120, "train_demo"),
        ];
        assert_eq!(site_label(&c), "train_demo.c:63 keep_history");
        assert_eq!(site_label(&[]), "(no stack recorded)");
        for l in [site_label(&forward), site_label(&backward), site_label(&c)] {
            assert!(!l.contains("::") && !l.contains("c10"), "{l}");
        }
    }

    /// Sites at the same line are told apart by a frame only each has (the backward
    /// function of one input or the other), else by one the others lack, else by their
    /// numbers; a unique label is left alone.
    #[test]
    fn sites_that_share_a_label_are_told_apart() {
        let line = "common.py:37 train_step".to_string();
        let details = |d: &[&str]| d.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let rows = vec![
            (
                12,
                line.clone(),
                details(&["empty_strided", "mm_mat1_backward", "run"]),
            ),
            (
                14,
                line.clone(),
                details(&["empty_strided", "mm_mat2_backward", "run"]),
            ),
            (16, line.clone(), details(&["empty_strided", "run"])),
            (18, line.clone(), details(&["empty_strided", "run"])),
            (20, "leak.py:10 <module>".to_string(), vec![]),
        ];
        let got = distinct(&rows);
        assert_eq!(
            got,
            vec![
                "common.py:37 train_step (via mm_mat1_backward)",
                "common.py:37 train_step (via mm_mat2_backward)",
                "common.py:37 train_step [site 16]",
                "common.py:37 train_step [site 18]",
                "leak.py:10 <module>",
            ]
        );
        let unique: std::collections::HashSet<&String> = got.iter().collect();
        assert_eq!(unique.len(), got.len());
    }
}
