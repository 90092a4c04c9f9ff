"""Hook cost with Python frames on top: cudaMalloc+cudaFree pairs through ctypes, 20 Python
frames deep, ROUNDS rounds (default 5) of N pairs timed inside the process, in wall time and in
this thread's CPU time. Run it untraced and traced in alternation (scripts/bench.sh through
scripts/bench-alternate.py); the difference between modes is the hook's cost per pair.
Prints one `key value` line each: ns_per_pair (median round, wall), cpu_ns_per_pair (median
round, thread CPU), fastest_ns_per_pair, fastest_cpu_ns_per_pair (the fastest round)."""
import ctypes
import os
import statistics
import sys
import time

rt = ctypes.CDLL("libcudart.so.12")
malloc, free = rt.cudaMalloc, rt.cudaFree
N = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
ROUNDS = int(os.environ.get("ROUNDS", "5"))
DEPTH = 20


def pairs(n):
    p = ctypes.c_void_p()
    ref = ctypes.byref(p)
    size = ctypes.c_size_t(256)
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(n):
        malloc(ref, size)
        free(p)
    return (time.perf_counter_ns() - w0) / n, (time.thread_time_ns() - c0) / n


def deep(d, n):
    if d > 0:
        return deep(d - 1, n)
    pairs(1000)  # warm-up: the first stacks are new
    return [pairs(n) for _ in range(ROUNDS)]


rounds = deep(DEPTH, N)
walls, cpus = [w for w, _ in rounds], [c for _, c in rounds]
print("ns_per_pair %.1f" % statistics.median(walls))
print("cpu_ns_per_pair %.1f" % statistics.median(cpus))
print("fastest_ns_per_pair %.1f" % min(walls))
print("fastest_cpu_ns_per_pair %.1f" % min(cpus), flush=True)
