"""Shared by the `oomtrace fit` validation scenarios (fit_*.py): the levers they take and the
ground truth they print.

Each scenario reads its batch from BATCH, its step count from STEPS (default 3) and, from CKPT,
the modules it runs under `torch.utils.checkpoint` (comma-separated names the script defines;
empty: none), and ends with one JSON line (`report`): PyTorch's own peak reserve
(`torch.cuda.max_memory_reserved()`) and whether it ran out of memory. The test tier traces one
run and compares what `oomtrace fit` predicts for other batches and checkpointing with the real
runs. A run that runs out of memory (torch.cuda.OutOfMemoryError, or cuBLAS failing to allocate
its handle) says so and exits 0: the OOM is a result, not a failure.
"""
import json
import os
import time

import torch
from torch.utils.checkpoint import checkpoint

BATCH = int(os.environ.get("BATCH", "32"))
STEPS = int(os.environ.get("STEPS", "3"))
CKPT = {c for c in os.environ.get("CKPT", "").split(",") if c}


def ckpt(name, module, *args):
    """`module(*args)` under activation checkpointing (non-reentrant, as PyTorch recommends).
    Scripts call it on the same line as the plain call, `ckpt(...) if "name" in CKPT else
    module(...)`, so that the traced run (no CKPT) names the call where the checkpointed one is."""
    return checkpoint(module, *args, use_reentrant=False)


def train(step):
    """Runs `step(i)` STEPS times; prints the peaks, also after an out-of-memory."""
    oom = False
    try:
        for i in range(STEPS):
            step(i)
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        oom = True
    except RuntimeError as e:
        # A library that could not get memory of its own (cuBLAS creating its handle on
        # the backward thread) did not fit either.
        if "ALLOC_FAILED" not in str(e):
            raise
        oom = True
    print(
        json.dumps(
            {
                "batch": BATCH,
                "ckpt": sorted(CKPT),
                "max_memory_reserved": torch.cuda.max_memory_reserved(),
                "max_memory_allocated": torch.cuda.max_memory_allocated(),
                "oom": oom,
            }
        ),
        flush=True,
    )
    # PyTorch's autograd thread may drop its last graph task (which needs the GIL) while the
    # interpreter finalizes, and abort it (pytorch#38228), most often after an out-of-memory
    # in a backward pass: a moment for it first, as oomtrace's own package gives a traced run.
    time.sleep(0.05)
