"""Shared by the `oomtrace whatif` validation scenarios (whatif_*.py): the ground truth they print.

Each scenario ends with one JSON line from `report_peaks`: PyTorch's own peak reserve and peak
tensor bytes (`torch.cuda.max_memory_reserved()`, `max_memory_allocated()`) and whether it ran
out of memory, which the test tier compares with what `oomtrace whatif` predicts from a trace
of the same script under another PYTORCH_CUDA_ALLOC_CONF. Scripts that run out of memory catch
torch.cuda.OutOfMemoryError and exit 0: the OOM is a result, not a failure.
"""
import json
import os

import torch


def report_peaks(steps, oom=False):
    print(
        json.dumps(
            {
                "steps": steps,
                "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                "max_memory_reserved": torch.cuda.max_memory_reserved(),
                "max_memory_allocated": torch.cuda.max_memory_allocated(),
                "oom": oom,
            }
        ),
        flush=True,
    )
