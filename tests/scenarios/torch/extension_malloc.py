# A clean training loop beside an "extension" that keeps 4 MiB of raw device memory per step,
# allocated with cudaMalloc from PyTorch's own libcudart (outside PyTorch's caching allocator):
# the device grows while the tensors stay flat. That memory is not the allocator's reserve.
import ctypes

import torch

from common import STEPS, model_and_optimizer, train_step

model, optimizer = model_and_optimizer()
# The libcudart PyTorch loaded (initialised by now).
with open("/proc/self/maps") as maps:
    cudart_path = next(line.split()[-1] for line in maps if "/libcudart.so" in line)
cudart = ctypes.CDLL(cudart_path)
cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
cudart.cudaMalloc.restype = ctypes.c_int
buffers = []
for step in range(STEPS):
    out, loss = train_step(model, optimizer)
    p = ctypes.c_void_p()
    rc = cudart.cudaMalloc(ctypes.byref(p), 4 << 20)  # EXTENSION: 4 MiB of raw memory
    assert rc == 0, rc
    buffers.append(p)
print("done", STEPS, flush=True)
