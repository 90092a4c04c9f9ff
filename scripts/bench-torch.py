"""Per-tensor host cost on real PyTorch: allocate and free N CUDA tensors (1 KiB, 64 KiB, 1 MiB
in turn), median of 5 rounds, printed as `ns_per_tensor <ns>`. Run untraced, under
`oomtrace run --torch` (the trace tracker) and `--torch=swap`, and with BENCH_RECORD_HISTORY=1 (PyTorch's own
`_record_memory_history`): scripts/bench.sh compares them in one run. On simcuda kernels are
no-ops, so this is the host-side cost of allocation only.
"""
import os
import statistics
import sys
import time

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
if os.environ.get("BENCH_RECORD_HISTORY") == "1":
    torch.cuda.memory._record_memory_history(max_entries=100000)
torch.empty(1, device="cuda")  # CUDA initialised outside the timed rounds
elements = [256, 16384, 262144]
rounds = []
for _ in range(5):
    start = time.perf_counter_ns()
    for i in range(n):
        t = torch.empty(elements[i % 3], device="cuda")
        del t
    rounds.append((time.perf_counter_ns() - start) / n)
print("ns_per_tensor", statistics.median(rounds), flush=True)
