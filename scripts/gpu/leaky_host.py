"""Loads libleaky_ext.so (nvcc-built, static CUDA runtime) and calls leaky_step() per step.

    python3 leaky_host.py path/to/libleaky_ext.so [--steps 30]

ctypes.CDLL opens it with dlopen(RTLD_LOCAL), as Python extensions are opened. Each step calls
leaky_step() (4 MiB kept) and scratch_step() (1 MiB allocated and freed), then oomtrace_mark()
when the shim is preloaded. Needs no PyTorch.
"""

import argparse
import ctypes
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()

    ext = ctypes.CDLL(args.lib)
    for name in ("leaky_init", "leaky_step", "scratch_step", "leaky_kept"):
        getattr(ext, name).restype = ctypes.c_int
    try:
        mark = ctypes.CDLL(None).oomtrace_mark
        mark.argtypes = [ctypes.c_char_p]
        mark.restype = None
    except (AttributeError, OSError):
        mark = None

    if ext.leaky_init() != 0:
        sys.exit(1)
    for step in range(args.steps):
        if ext.leaky_step() != 0 or ext.scratch_step() != 0:
            sys.exit(1)
        if mark is not None:
            mark(f"step {step}".encode())
    print(f"done: {args.steps} steps, {ext.leaky_kept()} x 4 MiB kept, "
          f"markers {'on' if mark is not None else 'off'}", flush=True)


if __name__ == "__main__":
    main()
