"""oomtrace for Python programs: per-tensor tracing of PyTorch, step markers.

    import oomtrace
    oomtrace.install()          # before the first CUDA use: PyTorch allocates through oomtrace
    for batch in loader:
        with oomtrace.step():   # or call oomtrace.mark_step() once per iteration
            train(batch)

`install()` loads liboomtrace (already there under `oomtrace run` or LD_PRELOAD; otherwise
found through OOMTRACE_LIB or next to the `oomtrace` binary on PATH), makes PyTorch allocate
through its pluggable-allocator entry points `oomtrace_malloc` / `oomtrace_free`, so that
every tensor is an event with its Python stack, and marks a step after every optimizer step.
The trace goes where the library sends it: the collector of `oomtrace run`, or one the library
starts itself (see OOMTRACE_SOCKET and OOMTRACE_OUTPUT in the README).

Nothing here takes the GIL from a CUDA call or changes what PyTorch computes. Caveats of the
pluggable allocator (PyTorch's, not ours): torch.cuda.memory_stats() and friends raise, and
cudnn.benchmark, CUDA IPC and cudagraph trees are not supported (README, "PyTorch").
"""

import contextlib
import ctypes
import os
import shutil
import sys
import warnings

__all__ = ["install", "mark_step", "step", "flush", "library", "library_path"]

_LIB_NAME = "liboomtrace.so"
_lib = None
_lib_path = None
_step_hook = None
_allocator_installed = False


def _loaded_path():
    """The path of liboomtrace if it is already mapped into this process (LD_PRELOAD)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                if path.endswith("/" + _LIB_NAME):
                    return path
    except OSError:
        pass
    return None


def library_path():
    """Where liboomtrace is: loaded already, OOMTRACE_LIB, or beside `oomtrace` on PATH."""
    found = _loaded_path() or os.environ.get("OOMTRACE_LIB")
    if not found:
        exe = shutil.which("oomtrace")
        if exe:
            candidate = os.path.join(os.path.dirname(os.path.realpath(exe)), _LIB_NAME)
            if os.path.exists(candidate):
                found = candidate
    if not found:
        raise RuntimeError(
            "oomtrace: cannot find liboomtrace.so (run under `oomtrace run`, or set "
            "OOMTRACE_LIB to its path)"
        )
    return found


def library():
    """liboomtrace as a ctypes library (loaded once, globally)."""
    global _lib, _lib_path
    if _lib is None:
        _lib_path = library_path()
        lib = ctypes.CDLL(_lib_path, mode=ctypes.RTLD_GLOBAL)
        lib.oomtrace_mark.argtypes = [ctypes.c_char_p]
        lib.oomtrace_mark.restype = None
        lib.oomtrace_flush.argtypes = []
        lib.oomtrace_flush.restype = ctypes.c_int
        _lib = lib
    return _lib


def mark_step(label=None):
    """Ends a step (one training iteration): the leak detector compares steps."""
    library().oomtrace_mark(None if label is None else str(label).encode())


@contextlib.contextmanager
def step(label=None):
    """A region that is one step: marks the step's end when the region ends."""
    try:
        yield
    finally:
        mark_step(label)


def flush():
    """Waits (at most 2 s) until everything recorded so far has reached the collector."""
    return library().oomtrace_flush() == 0


def _install_allocator(torch):
    global _allocator_installed
    if _allocator_installed:
        return True
    if torch.cuda.is_initialized():
        warnings.warn(
            "oomtrace: CUDA is already initialised, so PyTorch's allocator cannot be swapped; "
            "tracing stays at the CUDA level (segments, not tensors). Call oomtrace.install() "
            "before the first CUDA use, or use `oomtrace run --torch`.",
            stacklevel=3,
        )
        return False
    library()
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        _lib_path, "oomtrace_malloc", "oomtrace_free"
    )
    torch.cuda.memory.change_current_allocator(allocator)
    _allocator_installed = True
    return True


def _install_step_hook(torch):
    global _step_hook
    if _step_hook is not None:
        return
    register = getattr(torch.optim.optimizer, "register_optimizer_step_post_hook", None)
    if register is None:
        return
    _step_hook = register(lambda optimizer, args, kwargs: mark_step())


def install(allocator=True, step_hook=True):
    """Traces this process's tensors through oomtrace (imports torch if it is installed).

    allocator: make PyTorch allocate through oomtrace (per-tensor events with Python stacks).
    step_hook: mark a step after every optimizer step.
    Returns True if the allocator is oomtrace's.
    """
    library()
    try:
        import torch
    except ImportError:
        return False
    ok = _install_allocator(torch) if allocator else False
    if step_hook:
        _install_step_hook(torch)
    return ok


def _on_torch_import(torch):
    """Called by `oomtrace run --torch` right after `import torch` finished."""
    try:
        _install_allocator(torch)
        _install_step_hook(torch)
    except Exception as e:  # never break the user's import of torch
        print("oomtrace: --torch setup failed (%s); tracing at the CUDA level" % e,
              file=sys.stderr)
