"""A small PyTorch training loop with a planted GPU leak, for scripts/gpu-check.sh.

An MLP (about 24 M parameters: ~96 MiB of weights, ~400 MiB with gradients and Adam state)
trained for 60 steps with Adam on random data. Every step keeps its output tensor
(1024 x 1024 float32 = 4 MiB) alive in a Python list: after backward the graph's saved
activations are freed, but the output itself is never released, so device memory grows
by 4 MiB per step. The leaking line is the one marked LEAK HERE: the output is allocated
and kept on that one line, so a tracer that names the allocating line names it.

    python3 train_leak.py            # the leak
    python3 train_leak.py --clean    # the same loop without it (false-positive check)

Step boundaries are marked with oomtrace_mark (looked up in the process's global scope, so
the script runs unchanged without the shim) unless --no-marks is given.
"""

import argparse
import ctypes
import sys
import time

try:
    import torch
    import torch.nn as nn
except ImportError:
    print("train_leak.py: PyTorch is not installed", file=sys.stderr)
    sys.exit(2)


def step_marker():
    """oomtrace_mark from the preloaded shim, or a no-op when it is not there."""
    try:
        fn = ctypes.CDLL(None).oomtrace_mark
    except (AttributeError, OSError):
        return lambda label: None
    fn.argtypes = [ctypes.c_char_p]
    fn.restype = None
    return lambda label: fn(label.encode())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clean", action="store_true", help="no leak")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--no-marks", action="store_true", help="do not call oomtrace_mark")
    ap.add_argument("--device", default="cuda", help="cpu: try the script without a GPU")
    args = ap.parse_args()

    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("train_leak.py: torch.cuda.is_available() is False", file=sys.stderr)
        sys.exit(2)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    mark = (lambda label: None) if args.no_marks else step_marker()

    torch.manual_seed(0)
    f, w = args.features, args.width
    model = nn.Sequential(
        nn.Linear(f, w), nn.ReLU(),
        nn.Linear(w, w), nn.ReLU(),
        nn.Linear(w, f),
    ).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    loss_fn = nn.MSELoss()

    history = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(args.batch, f, device=dev)
        y = torch.randn(args.batch, f, device=dev)
        opt.zero_grad(set_to_none=True)
        if args.clean:
            output = model(x)
        else:
            history.append(output := model(x))  # LEAK HERE
        loss = loss_fn(output, y)
        loss.backward()
        opt.step()
        del output
        mark(f"step {step}")
        if step % 10 == 0 or step == args.steps - 1:
            sync()
            mem = ""
            try:  # raises under a pluggable allocator (oomtrace run --torch=swap)
                if dev.type == "cuda":
                    mem = f", allocated {torch.cuda.memory_allocated() / 2**20:.0f} MiB"
            except RuntimeError:
                pass
            print(f"step {step:3d}: loss {loss.item():.4f}{mem}", flush=True)
    sync()
    kept = sum(t.numel() * t.element_size() for t in history)
    print(f"done: {args.steps} steps in {time.perf_counter() - t0:.1f} s, "
          f"{len(history)} outputs kept ({kept / 2**20:.0f} MiB)", flush=True)


if __name__ == "__main__":
    main()
