# Python calling the CUDA runtime through ctypes: dlsym on a handle (not substituted: the
# driver wrapper that libcudart reaches records it), libffi, and CPython frames to unwind.
# Live at exit: 3 x 1 MiB from allocate_activations (native stack through the interpreter).
import ctypes
rt = ctypes.CDLL("libcudart.so.12")
def allocate_activations(n):
    p = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    return p
kept = [allocate_activations(1 << 20) for _ in range(3)]
print("py ok")
