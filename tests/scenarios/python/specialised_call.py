# One Python line calls a native allocation through ctypes 60 times and keeps every result,
# marking a step after each. CPython 3.11+ specialises a call after a few executions: the
# `codes.extend(...)` call below runs through `PyObject_Vectorcall` and
# `method_vectorcall_O` at first, then the interpreter calls `list.extend` directly, so the
# native stack under this line changes part-way. The report must still show one call site
# holding all 60 allocations, and one leak.
import ctypes
import functools

import oomtrace

rt = ctypes.CDLL("libcudart.so.12")
kept = []
codes = []


def step():
    p = ctypes.c_void_p()
    malloc = functools.partial(rt.cudaMalloc, ctypes.byref(p))
    codes.extend(map(malloc, [1 << 20]))  # ALLOC HERE
    kept.append(p)


for _ in range(60):
    step()
    oomtrace.mark_step()
assert codes == [0] * 60, codes
print("kept", len(kept))
