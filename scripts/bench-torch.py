"""Per-tensor host cost on real PyTorch: ROUNDS rounds (default 7) of N CUDA tensors allocated
and freed (1 KiB, 64 KiB, 1 MiB in turn) three Python calls deep. Each round is timed in wall
time and in this thread's CPU time (what the allocating thread itself spent, whatever else ran
on the machine). Prints one `key value` line each:

  ns_per_tensor          median of the rounds' wall time per tensor
  cpu_ns_per_tensor      median of the rounds' thread CPU time per tensor
  fastest_ns_per_tensor  the fastest round's wall time per tensor
  fastest_cpu_ns_per_tensor

BENCH_RECORD_HISTORY=python|all turns on PyTorch's own `_record_memory_history` with that
`stacks=` (1 means all). Run untraced, traced and with the history in alternation
(scripts/bench-alternate.py): the differences are the costs. On simcuda kernels are no-ops, so
this is the host-side cost of allocation only.
"""
import os
import statistics
import sys
import time

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
rounds = int(os.environ.get("ROUNDS", "7"))
history = os.environ.get("BENCH_RECORD_HISTORY", "")
if history:
    torch.cuda.memory._record_memory_history(
        max_entries=100000, stacks="all" if history == "1" else history
    )
torch.empty(1, device="cuda")  # CUDA initialised outside the timed rounds
elements = [256, 16384, 262144]


def make(count):
    return torch.empty(count, device="cuda")


def one(count):
    t = make(count)
    del t


def loop(n):
    for i in range(n):
        one(elements[i % 3])


loop(300)  # warm-up: the first stacks of each size are new
walls, cpus = [], []
for _ in range(rounds):
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    loop(n)
    cpus.append((time.thread_time_ns() - c0) / n)
    walls.append((time.perf_counter_ns() - w0) / n)
print("ns_per_tensor", statistics.median(walls))
print("cpu_ns_per_tensor", statistics.median(cpus))
print("fastest_ns_per_tensor", min(walls))
print("fastest_cpu_ns_per_tensor", min(cpus), flush=True)
