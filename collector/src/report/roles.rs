//! What each symbolized frame is to the user who reads a finding: their own code, or the
//! machinery between it and the GPU (the CUDA runtime, an allocator, the Python interpreter).
//! One classification, used by every place that picks the frame a finding is named by (the
//! text report, the JSON `culprit`, the live line, through [`super::symbolize::culprit`]),
//! the autograd node of a backward-pass allocation ([`backward_node`]) and the operators a
//! stack dispatched ([`dispatched_ops`]), from which [`super::backward`] finds its forward line.

use crate::model::{is_interpreter_module, FrameInfo};

/// A frame's role, from its symbol and module name alone (no file is read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameRole {
    /// The CUDA runtime or driver: an API entry point (`cudaMalloc`, `cuMemAlloc_v2`), the
    /// runtime's internals (`__cudart*`, `cudart::*`, the hashed `libcudart_static_*` of a
    /// statically linked runtime), or any frame of `libcudart`/`libcuda`.
    RuntimeInternal,
    /// A memory allocator between the user's code and CUDA: PyTorch's caching and pluggable
    /// allocators, oomtrace's own entry points, CuPy's memory pool.
    AllocatorInternal,
    /// The Python interpreter's own native code (its module, see [`is_interpreter_module`]).
    Interpreter,
    /// Anything else: the user's code, an extension's, a library's; every Python frame.
    User,
}

impl FrameRole {
    pub fn of(f: &FrameInfo) -> FrameRole {
        if f.python {
            return FrameRole::User;
        }
        let function = f.function.as_str();
        if is_runtime_module(&f.module) || is_runtime_symbol(function) {
            FrameRole::RuntimeInternal
        } else if is_allocator_symbol(function) || f.module.starts_with("liboomtrace") {
            FrameRole::AllocatorInternal
        } else if is_interpreter_module(&f.module) {
            FrameRole::Interpreter
        } else {
            FrameRole::User
        }
    }

    /// Machinery a summary looks past.
    pub fn is_internal(self) -> bool {
        self != FrameRole::User
    }
}

/// `libcudart.so.12`, `libcudart.so.13.0.48`, `libcuda.so.1`, `libcuda.so` (not
/// `libcudnn.so` or `libcuda_ext.so`, a user's library).
fn is_runtime_module(module: &str) -> bool {
    ["libcudart.so", "libcuda.so"]
        .iter()
        .any(|lib| module == *lib || module.starts_with(&format!("{lib}.")))
}

/// A CUDA runtime or driver API name (`cuda` or `cu` then an upper-case letter: `cudaMalloc`,
/// `cuMemAlloc_v2`; a user's `cuda_forward` or `cublas_helper` is not one), or a runtime
/// internal (`__cudart123`, `cudart::globalState`, the hashed `libcudart_static_<hash>` that
/// nvcc's static runtime carries into every object linked with it).
fn is_runtime_symbol(function: &str) -> bool {
    let api = |prefix: &str| {
        function
            .strip_prefix(prefix)
            .and_then(|rest| rest.chars().next())
            .is_some_and(|c| c.is_ascii_uppercase())
    };
    api("cuda")
        || api("cu")
        || function.starts_with("__cudart")
        || function.starts_with("cudart::")
        || function.starts_with("libcudart_static_")
}

/// PyTorch's caching and pluggable CUDA allocators, oomtrace's entry points
/// (`oomtrace_malloc`), CuPy's memory pool (its Cython functions are named
/// `__pyx_..._4cupy_4cuda_6memory_...`).
fn is_allocator_symbol(function: &str) -> bool {
    function.contains("c10::cuda::CUDACachingAllocator")
        || function.contains("CUDAPluggableAllocator")
        || function.starts_with("oomtrace_")
        || function.contains("4cupy_4cuda_6memory")
}

/// Whether a stack allocates a library's workspace through PyTorch's caching allocator: the
/// cuBLAS (and cuBLASLt) workspace PyTorch keeps per handle and stream
/// (`at::cuda::getCUDABlasLtWorkspace()`, `at::cuda::(anonymous namespace)::getNewWorkspace()`,
/// or inlined into `at::cuda::getCurrentCUDABlasHandle()`, whose only tensor it is). Needs the
/// native frames (not with `OOMTRACE_STACKS=python`).
pub fn allocates_library_workspace(frames: &[FrameInfo]) -> bool {
    frames.iter().any(|f| {
        !f.python
            && f.function.starts_with("at::cuda::")
            && (f.function.contains("Workspace")
                || f.function.starts_with("at::cuda::getCurrentCUDABlas"))
    })
}

/// The autograd node whose `apply` an allocation ran in, e.g. `AddmmBackward0` from
/// `torch::autograd::generated::AddmmBackward0::apply(...)`: the innermost such frame.
pub fn backward_node(frames: &[FrameInfo]) -> Option<&str> {
    frames.iter().find_map(node_applied)
}

/// The frame of [`backward_node`], which names a backward-pass call site.
pub fn backward_node_frame(frames: &[FrameInfo]) -> Option<&FrameInfo> {
    frames.iter().find(|f| node_applied(f).is_some())
}

/// The node of a `torch::autograd::generated::<Node>::apply...` frame.
fn node_applied(f: &FrameInfo) -> Option<&str> {
    let rest = f.function.split_once("torch::autograd::generated::")?.1;
    let (node, method) = rest.split_once("::")?;
    method.starts_with("apply").then_some(node)
}

/// The forward operator a generated backward node differentiates, by PyTorch's naming
/// (`derivatives.yaml`): `AddmmBackward0` -> `addmm`, `NativeLayerNormBackward0` ->
/// `native_layer_norm`. `None` for names that do not follow it.
pub fn forward_op(node: &str) -> Option<String> {
    let base = node.trim_end_matches(|c: char| c.is_ascii_digit());
    let camel = base.strip_suffix("Backward")?;
    if camel.is_empty() {
        return None;
    }
    let mut op = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                op.push('_');
            }
            op.push(c.to_ascii_lowercase());
        } else {
            op.push(c);
        }
    }
    Some(op)
}

/// Whether a frame runs the dispatcher entry of operator `op` (`at::_ops::addmm::call`, or an
/// overload such as `at::_ops::pow_Tensor_Scalar::redispatch`; not the in-place `addmm_`).
pub fn runs_op(f: &FrameInfo, op: &str) -> bool {
    dispatched_ops(f).any(|entry| is_op_entry(entry, op))
}

/// The dispatcher entries a frame runs, as named after `at::_ops::` (`addmm`,
/// `pow_Tensor_Scalar`): read once per call site, matched to an operator by [`is_op_entry`].
pub fn dispatched_ops(f: &FrameInfo) -> impl Iterator<Item = &str> {
    f.function.match_indices("at::_ops::").filter_map(|(i, m)| {
        let rest = &f.function[i + m.len()..];
        let end = rest.find("::")?;
        Some(&rest[..end])
    })
}

/// Whether dispatcher entry `entry` (see [`dispatched_ops`]) is operator `op` or one of its
/// overloads (`pow_Tensor_Scalar` is `pow`; the in-place `addmm_` is not `addmm`).
pub fn is_op_entry(entry: &str, op: &str) -> bool {
    let Some(after) = entry.strip_prefix(op) else {
        return false;
    };
    after.is_empty()
        || after
            .strip_prefix('_')
            .and_then(|o| o.chars().next())
            .is_some_and(|c| c.is_ascii_uppercase())
}

/// Whether a frame is PyTorch's autograd engine (`torch::autograd::Engine::thread_main`,
/// `evaluate_function`, ...): a stack through it without Python frames is the backward pass,
/// also where no autograd node is on it (a gradient the engine sums to its input's shape).
pub fn is_autograd_engine(f: &FrameInfo) -> bool {
    f.function.contains("torch::autograd::Engine::")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(function: &str, module: &str) -> FrameInfo {
        FrameInfo {
            function: function.into(),
            module: module.into(),
            ..Default::default()
        }
    }

    #[test]
    fn roles_come_from_symbols_and_module_names() {
        use FrameRole::*;
        for (function, module, role) in [
            ("cudaMalloc", "libext_static_rt.so", RuntimeInternal),
            ("cuMemAlloc_v2", "libcuda.so.1", RuntimeInternal),
            ("libcudart_static_4d8b33a1", "libext.so", RuntimeInternal),
            ("__cudart1042", "libext.so", RuntimeInternal),
            ("cudart::cudaApiMalloc", "libtorch_cuda.so", RuntimeInternal),
            ("", "libcudart.so.12", RuntimeInternal),
            ("", "libcudart.so.13.0.48", RuntimeInternal),
            (
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
                "libc10_cuda.so",
                AllocatorInternal,
            ),
            ("oomtrace_malloc", "liboomtrace.so", AllocatorInternal),
            (
                "__pyx_f_4cupy_4cuda_6memory_10SingleDeviceMemoryPool_malloc",
                "memory.cpython-311-x86_64-linux-gnu.so",
                AllocatorInternal,
            ),
            (
                "_PyEval_EvalFrameDefault",
                "libpython3.11.so.1.0",
                Interpreter,
            ),
            ("PyObject_Vectorcall", "python3.11", Interpreter),
            ("scratch_forward", "libext_static_rt.so", User),
            ("cuda_forward", "libmyext.so", User),
            ("cublas_helper", "libmyext.so", User),
            ("ffi_call", "libffi.so.8", User),
            ("", "libcudnn.so.9", User),
            ("", "libcuda_ext.so", User),
        ] {
            assert_eq!(
                FrameRole::of(&native(function, module)),
                role,
                "{function} in {module}"
            );
        }
    }

    #[test]
    fn backward_nodes_and_their_forward_ops() {
        let frames = [
            native("at::_ops::mm::call(at::Tensor const&, at::Tensor const&)", "libtorch_cpu.so"),
            native(
                "torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
                "libtorch_cpu.so",
            ),
            native("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "libtorch_cpu.so"),
        ];
        assert_eq!(backward_node(&frames), Some("AddmmBackward0"));
        assert!(std::ptr::eq(
            backward_node_frame(&frames).unwrap(),
            &frames[1]
        ));
        assert_eq!(backward_node(&frames[2..]), None);
        assert_eq!(forward_op("AddmmBackward0").as_deref(), Some("addmm"));
        assert_eq!(
            forward_op("NativeLayerNormBackward0").as_deref(),
            Some("native_layer_norm")
        );
        assert_eq!(forward_op("MmBackward1").as_deref(), Some("mm"));
        assert_eq!(forward_op("AccumulateGrad"), None);
        assert_eq!(forward_op("Backward0"), None);
        let op = |f: &str| native(f, "libtorch_cpu.so");
        assert!(runs_op(
            &op("at::_ops::addmm::call(at::Tensor const&)"),
            "addmm"
        ));
        assert!(runs_op(
            &op("at::_ops::pow_Tensor_Scalar::redispatch(c10::DispatchKeySet)"),
            "pow"
        ));
        assert!(!runs_op(
            &op("at::_ops::addmm_::call(at::Tensor&)"),
            "addmm"
        ));
        assert!(!runs_op(
            &op("at::_ops::addmv::call(at::Tensor const&)"),
            "addmm"
        ));
        assert!(!runs_op(
            &op("at::_ops::mm::call(at::Tensor const&)"),
            "addmm"
        ));
    }
}
