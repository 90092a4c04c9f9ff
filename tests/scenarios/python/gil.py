# Python frames with the GIL released (ctypes.CDLL, as PyTorch's op bindings release it before
# they allocate) and held (ctypes.PyDLL), from a thread of its own too.
import ctypes
import threading

released = ctypes.CDLL("libcudart.so.12")
held = ctypes.PyDLL("libcudart.so.12")
kept = []


def alloc_released(n):
    p = ctypes.c_void_p()
    assert released.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0  # RELEASED
    kept.append(p)


def alloc_held(n):
    p = ctypes.c_void_p()
    assert held.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)) == 0  # HELD
    kept.append(p)


class Model:
    def layer(self):
        alloc_released(1 << 20)


def in_thread():
    alloc_released(3 << 20)


for _ in range(2):
    Model().layer()  # CALLER
alloc_held(5 << 20)
t = threading.Thread(target=in_thread)
t.start()
t.join()
print("gil ok")
