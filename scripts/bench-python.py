"""Hook cost with Python frames on top: cudaMalloc+cudaFree pairs through ctypes, 20 Python
frames deep, timed inside the process (median of 5 rounds). Run it untraced and traced (see
scripts/bench.sh); the difference between runs is the hook's cost per pair.
Prints: ns_per_pair <median>"""
import ctypes
import statistics
import sys
import time

rt = ctypes.CDLL("libcudart.so.12")
malloc, free = rt.cudaMalloc, rt.cudaFree
N = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
DEPTH = 20


def pairs(n):
    p = ctypes.c_void_p()
    ref = ctypes.byref(p)
    size = ctypes.c_size_t(256)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        malloc(ref, size)
        free(p)
    return (time.perf_counter_ns() - t0) / n


def deep(d, n):
    if d > 0:
        return deep(d - 1, n)
    pairs(1000)  # warm-up: the first stacks are new
    return statistics.median(pairs(n) for _ in range(5))


print("ns_per_pair %.1f" % deep(DEPTH, N))
