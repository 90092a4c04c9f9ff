use super::*;

fn native(function: &str, module: &str) -> FrameInfo {
    FrameInfo {
        function: function.into(),
        module: module.into(),
        ..Default::default()
    }
}

fn python(function: &str, file: &str, line: u32) -> FrameInfo {
    FrameInfo {
        function: function.into(),
        file: file.into(),
        line,
        module: "python".into(),
        python: true,
        ..Default::default()
    }
}

#[test]
fn long_lines_wrap_at_spaces_and_keep_every_word() {
    let words: Vec<String> = (0..80).map(|i| format!("word{i}")).collect();
    let line = format!("      why: {}", words.join(" "));
    let text = fit(&format!("short\n{line}\nend\n"), 100);
    assert!(text.lines().all(|l| l.chars().count() <= 100), "{text}");
    assert!(text.starts_with("short\n      why: word0 ") && text.ends_with("\nend\n"));
    let wrapped: Vec<&str> = text.lines().skip(1).take_while(|l| *l != "end").collect();
    assert!(wrapped.len() > 2 && wrapped[1..].iter().all(|l| l.starts_with("          w")));
    let again: Vec<&str> = wrapped.iter().flat_map(|l| l.split_whitespace()).collect();
    assert_eq!(
        again[1..],
        words.iter().map(String::as_str).collect::<Vec<_>>()[..]
    );
    // A word wider than a line keeps its two ends.
    let path = format!("  /{}/x.py", "d".repeat(300));
    let text = fit(&path, 100);
    assert!(text.chars().count() <= 100 && text.contains("...") && text.ends_with("d/x.py"));
    // Lines that fit are left as they are (multi-byte characters count once).
    assert_eq!(fit("a → b\n", 5), "a → b\n");
}

#[test]
fn pytorch_frames_fold_into_one_part_unless_native() {
    let frames = [
        native("", "libcublas.so.13"),
        native("", "libcublas.so.13"),
        native("cublasCreate_v2", "libcublas.so.13"),
        native(
            "at::cuda::getCurrentCUDABlasHandle(void*, unsigned long)",
            "libtorch_cuda.so",
        ),
        native(
            "bool at::cuda::blas::gemm<float>(char, char)",
            "libtorch_cuda.so",
        ),
        native("THPVariable_addmm", "libtorch_python.so"),
        native("cfunction_call", "libpython3.11.so.1.0"),
    ];
    let refs: Vec<&FrameInfo> = frames.iter().collect();
    assert_eq!(
        native_parts(&refs, &TextOptions::default()),
        [
            "libcublas.so.13 (2 frames)",
            "cublasCreate_v2",
            "3 PyTorch C++ frames"
        ]
    );
    let all = native_parts(
        &refs,
        &TextOptions {
            native: true,
            ..TextOptions::default()
        },
    );
    assert_eq!(
        all[1..],
        [
            "cublasCreate_v2",
            "cuda::getCurrentCUDABlasHandle",
            "blas::gemm",
            "THPVariable_addmm",
            "cfunction_call"
        ]
    );
    // A stack without Python frames: the run of PyTorch's frames is one line.
    let stack = [
        native("cudaMalloc", "libcudart.so.13"),
        native(
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block(int)",
            "libc10_cuda.so",
        ),
        native(
            "torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor>&&)",
            "libtorch_cpu.so",
        ),
        native("torch::autograd::Engine::thread_main()", "libtorch_cpu.so"),
    ];
    let mut out = String::new();
    stack_text(&mut out, &stack, "", 8, &TextOptions::default());
    assert!(!out.contains("::"), "{out}");
    assert!(
        out.contains("... 2 PyTorch C++ frames (--native shows them)"),
        "{out}"
    );
    let mut out = String::new();
    stack_text(
        &mut out,
        &stack,
        "",
        8,
        &TextOptions {
            native: true,
            ..TextOptions::default()
        },
    );
    assert!(
        out.contains("at AddmmBackward0::apply  [libtorch_cpu.so +]"),
        "{out}"
    );
}

/// A backward-pass finding is named by the report's `site_name` (its forward line) in its
/// head, and one made by the autograd engine outside any node says so on a line of its own;
/// a tensor kept by a Python line keeps that line in its head.
#[test]
fn backward_pass_findings_are_named_by_their_forward_line() {
    let engine = native(
        "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)",
        "libtorch_cpu.so",
    );
    let mut f = Finding::new(Kind::Growth, Level::INFO, 0);
    f.pid = 7;
    f.message = "grew".into();
    f.stack = vec![
        native(
            "at::_ops::sum_dim_IntList::call(at::Tensor const&)",
            "libtorch_cpu.so",
        ),
        engine,
    ];
    f.site_name = "backward at train.py:27 (autograd engine)".into();
    let mut out = String::new();
    detected_text(&mut out, &f, 3, &TextOptions::default());
    assert!(
        out.starts_with(
            "  [bounded growth] pid 7 at backward at train.py:27 (autograd engine): grew\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("\n      in the backward pass: backward at train.py:27 (autograd engine)\n"),
        "{out}"
    );
    assert!(
        !out.contains("no Python frames") && !out.contains("::"),
        "{out}"
    );
    f.stack = vec![
        native(
            "at::_ops::addmm::call(at::Tensor const&)",
            "libtorch_cpu.so",
        ),
        python("<module>", "/src/train.py", 25),
    ];
    f.site_name = "train.py:25 <module>".into();
    f.api = Some(oomtrace_proto::Api::oomtrace_torch_alloc);
    let mut out = String::new();
    detected_text(&mut out, &f, 3, &TextOptions::default());
    assert!(
        out.starts_with("  [bounded growth] pid 7 at train.py:25: grew\n"),
        "{out}"
    );
    assert!(!out.contains("in the backward pass"), "{out}");
}
