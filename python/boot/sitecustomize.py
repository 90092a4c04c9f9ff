# Put on PYTHONPATH by `oomtrace run`, or by the shim in a Python program under plain LD_PRELOAD
# (shim/src/python_env.rs): when the program imports torch, attach oomtrace's trace tracker to
# PyTorch's caching allocator when PyTorch initialises CUDA (tensors traced: the default) and
# mark a step after every optimizer step (`--torch=swap`: make PyTorch allocate through
# oomtrace before anything can initialise CUDA). OOMTRACE_TORCH says which (set by whoever put
# this file on the path): a comma-separated list of `tracker`, `swap` (`allocator`, its old
# name, still reads as it) and `steps`; `segments` alone is the user's opt-out of tensors (the
# step hook only). The program
# itself is not changed. A sitecustomize of the user's own, further down the path, still runs.
import importlib.abc
import importlib.util
import os
import sys


def _run_user_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_user_sitecustomize", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


# Every token of OOMTRACE_TORCH (and every alias) to its hook: generated from
# proto/src/host/torch_hooks.rs (`python_table`), whose test checks this line is its output.
_TOKENS = {"tracker": "tracker", "swap": "swap", "allocator": "swap", "steps": "steps", "segments": "segments"}


def _wanted():
    """(tracker, swap, steps): what `oomtrace run` asked for; the tracker and steps when
    OOMTRACE_TORCH is unset (this file on PYTHONPATH by hand: the default); the steps alone
    for `segments` (tensors not traced)."""
    parts = {_TOKENS.get(p.strip()) for p in os.environ.get("OOMTRACE_TORCH", "tracker,steps").split(",")}
    if "segments" in parts:
        return False, False, True
    return "tracker" in parts, "swap" in parts, "steps" in parts


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of `torch` to run oomtrace after it."""

    def __init__(self, tracker, swap, steps):
        self.tracker = tracker
        self.swap = swap
        self.steps = steps

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run_module = loader.exec_module
        tracker, swap, steps = self.tracker, self.swap, self.steps

        def exec_module(module):
            run_module(module)
            try:
                import oomtrace
                oomtrace._on_torch_import(module, swap=swap, steps=steps,
                                          tracker=tracker)
            except Exception as e:  # never break the user's `import torch`
                print("oomtrace: cannot set up tracing of torch (%s: %s); tracing CUDA "
                      "allocations without step markers" % (type(e).__name__, e),
                      file=sys.stderr)

        loader.exec_module = exec_module
        return spec


_tracker, _swap, _steps = _wanted()
if _tracker or _swap or _steps:
    sys.meta_path.insert(0, _TorchImportHook(_tracker, _swap, _steps))
try:
    _run_user_sitecustomize()
except Exception as e:
    print("oomtrace: your sitecustomize failed: %s" % e, file=sys.stderr)
