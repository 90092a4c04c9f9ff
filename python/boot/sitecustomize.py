# Put on PYTHONPATH by `oomtrace run --torch`: when the program imports torch, make PyTorch
# allocate through oomtrace before anything can initialise CUDA, and mark a step after every
# optimizer step. The program itself is not changed. A sitecustomize of the user's own,
# further down the path, still runs.
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


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of `torch` to run oomtrace after it."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run_module = loader.exec_module

        def exec_module(module):
            run_module(module)
            import oomtrace
            oomtrace._on_torch_import(module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _TorchImportHook())
try:
    _run_user_sitecustomize()
except Exception as e:
    print("oomtrace: your sitecustomize failed: %s" % e, file=sys.stderr)
