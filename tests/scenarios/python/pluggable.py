# Calls oomtrace_malloc / oomtrace_free with PyTorch's exact ABI, as CUDAPluggableAllocator
# does: during a global-mode CUDA-graph capture, at capacity, and with size 0.
# Prints one line per check; the test reads them.
import ctypes
import os
import sys

lib = ctypes.CDLL(os.environ["OOMTRACE_LIB"])
ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
alloc = ALLOC(ctypes.cast(lib.oomtrace_malloc, ctypes.c_void_p).value)
free = FREE(ctypes.cast(lib.oomtrace_free, ctypes.c_void_p).value)
cu = ctypes.CDLL("libcuda.so.1")
rt = ctypes.CDLL("libcudart.so.12")
MIB = 1 << 20

assert rt.cudaFree(None) == 0  # context, as PyTorch's lazy init makes one
stream = ctypes.c_void_p()
assert cu.cuStreamCreate(ctypes.byref(stream), 0) == 0

# An ordinary tensor, then its free.
p = alloc(4 * MIB, 0, stream)
print("alloc", "ok" if p else "NULL")
free(p, 4 * MIB, 0, stream)

# Inside a global-mode capture: a plain cuMemAlloc is refused, ours is not.
assert cu.cuStreamBeginCapture_v2(stream, 0) == 0
d = ctypes.c_uint64()
print("plain cuMemAlloc during capture:", cu.cuMemAlloc_v2(ctypes.byref(d), 1 * MIB))
cu.cuStreamEndCapture(stream, ctypes.byref(ctypes.c_void_p()))
assert cu.cuStreamBeginCapture_v2(stream, 0) == 0
other = ctypes.c_void_p()
assert cu.cuStreamCreate(ctypes.byref(other), 0) == 0
q = alloc(2 * MIB, 0, other)
print("capture alloc", "ok" if q else "NULL")
graph = ctypes.c_void_p()
print("capture end:", cu.cuStreamEndCapture(stream, ctypes.byref(graph)))
free(q, 2 * MIB, 0, other)

# Size 0: NULL without a word (PyTorch's own allocator returns NULL for 0 bytes too).
print("zero", "NULL" if not alloc(0, 0, stream) else "ptr")

# More than the device has: NULL, explained on stderr.
sys.stderr.flush()
r = alloc(1 << 40, 0, stream)
print("huge", "NULL" if not r else "ptr")

kept = alloc(3 * MIB, 0, stream)  # KEPT
print("kept", "ok" if kept else "NULL")
